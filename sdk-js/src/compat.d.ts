// Types of `stowplan/compat` (src/compat.js): the peers' entry points as the kernel reproduces them.
import type { Int, Integers, Stowplan } from './index.js';

export { PeerError, logSeqlenUnbalance } from './index.js';

/** verl's `karmarkar_karp`, `greedy_partition` or `get_seqlen_balanced_partitions`. */
export function verl(
  fn: 'karmarkar_karp' | 'greedy_partition' | 'get_seqlen_balanced_partitions',
  seqlens: Integers,
  k: Int,
  equalSize: boolean,
  kernel?: Stowplan,
): number[][];

/** Options of `verlRearrangeMicroBatches` (verl's keyword arguments). */
export interface VerlMicroOptions {
  /** `min_num_micro_batch`. */
  minNumMicroBatch?: Int;
  /** `num_batches_divided_by`. */
  numBatchesDividedBy?: Int;
  /** `use_dynamic_bsz_balance` (default true). */
  useDynamicBszBalance?: boolean;
  /** `force_group_size` (default 1). */
  forceGroupSize?: Int;
  /** The padded attention-mask width (none for nested input). */
  paddedWidth?: Int;
  /** The count after verl's MAX all-reduce over the DP group. */
  dpNumMicroBatches?: Int;
}

/** verl's `rearrange_micro_batches`: the micro-batches' index lists in verl's order. */
export function verlRearrangeMicroBatches(
  seqlens: Integers,
  maxTokenLen: Int,
  options?: VerlMicroOptions,
  kernel?: Stowplan,
): number[][];

/** verl's trainer `_balance_batch` (= ROLL's `batch_balance`). */
export function balanceBatch(
  seqlens: Integers,
  dp: Int,
  options?: { minibatchSize?: Int },
  kernel?: Stowplan,
): { partitions: number[][]; kkPartitions: number[][][]; dropped: number[] };

/** Options of `rollLoadBalance` (ROLL's arguments). */
export interface RollOptions {
  /** `min_num_micro_batches` (default 1). */
  minNumMicroBatches?: Int;
  /** Tensor-parallel size (default 1). */
  tp?: Int;
  /** Context-parallel size (default 1). */
  cp?: Int;
  /** Virtual-pipeline size (default 1). */
  vp?: Int;
  /** The count after ROLL's MAX all-reduce over the DP group. */
  dpNumMicroBatches?: Int;
}

/** ROLL's `LoadBalancePacker`. */
export function rollLoadBalance(
  lengths: Integers,
  maskWidth: Int,
  maxPackedSequenceLength: Int,
  options?: RollOptions,
  kernel?: Stowplan,
): { microBatches: number[][]; kkPartitions: number[][]; padFactor: bigint; paddedLengths: BigInt64Array };

/** prime-rl's classic packer: bins (members in insertion order) and the zero-length items it drops. */
export function primeRlFfd(
  lengths: Integers,
  runs: Integers,
  labels: Integers,
  seqLen: Int,
  kernel?: Stowplan,
): { bins: number[][]; dropped: number[] };
/** prime-rl HEAD's `_karmarkar_karp`: equal-size KK, groups by descending (total, members). */
export function primeRlKarmarkarKarp(weights: Integers, numPartitions: number, kernel?: Stowplan): number[][];
/** prime-rl HEAD's `balanced_partition`: KK, then pairwise-swap refinement. */
export function primeRlBalancedPartition(weights: Integers, numPartitions: number, kernel?: Stowplan): number[][];
/** Options of `primeRlPrepareBatch` (prime-rl's `prepare_batch` arguments and cost coefficients). */
export interface PrimeRlBatchOptions {
  seqLen: Int;
  numTrainWorkers: number;
  /** Cost of a bin: `linear·Σlen + quadratic·Σlen²` (default 1, 0: the token count). */
  linear?: Int;
  quadratic?: Int;
  /** Pad each bin to a multiple of this (default 1: none). */
  padToMultipleOf?: Int;
  /** de80b48's rule: multimodal bins keep to their first sample's run. */
  multimodalSameRun?: boolean;
}
/** The plan of prime-rl HEAD's `prepare_batch`: bins after splitting and what each rank trains. */
export function primeRlPrepareBatch(
  lengths: Integers,
  runs: Integers,
  multimodal: Integers,
  labels: Integers,
  options: PrimeRlBatchOptions,
  kernel?: Stowplan,
): { bins: number[][]; multimodal: boolean[]; padding: bigint[]; costs: bigint[]; ranks: number[][]; dummies: boolean[][] };
export * from './compat_slime.js';
/** This module's namespace, as a promise: what `require('stowplan/compat').load()` resolves to. */
export function load(): Promise<typeof import('./compat.js')>;
