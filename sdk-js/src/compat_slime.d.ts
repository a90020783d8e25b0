// Types of src/compat_slime.js (re-exported by `stowplan/compat`).
import type { Integers, Int, Stowplan } from './index.js';

/** slime's `first_fit_pack`: bins in creation order (input order, no sorting). */
export function slimeFirstFitPack(totalLengths: Integers, maxTokensPerBin: Int, kernel?: Stowplan): number[][];
/** The bins after slime's `expand_bins_by_splitting` (slime works in place). */
export function slimeExpandBins(bins: number[][], targetCount: Int, lengths: Integers, kernel?: Stowplan): number[][];
/** slime's `get_seqlen_balanced_partitions` on float (FLOPs) weights. */
export function slimeBalancedPartitions(
  weights: number[] | Float64Array,
  kPartitions: number,
  equalSize: boolean,
  kernel?: Stowplan,
): number[][];
/** slime's `calculate_fwd_flops(seqlens, args)`, bit for bit (a bigint when no layer term is added). */
export function slimeFwdFlops(seqlens: Integers, args: Record<string, unknown>, kernel?: Stowplan): number | bigint;
/** slime's `build_dp_schedule`: `[partitions, micro_batch_indices, num_microbatches, global_batch_sizes]`. */
export function slimeBuildDpSchedule(
  args: Record<string, unknown>,
  trainParallelConfig: Record<string, unknown>,
  totalLengths: Integers,
  opts: { globalBatchSize: Int; rolloutIndices: unknown[]; pythonSum?: 'naive' | 'neumaier' },
  kernel?: Stowplan,
): [number[][], number[][][], number[], number[]];
