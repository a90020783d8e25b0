// The peers' balancing entry points as the kernel reproduces them (verl 0.9.1, ROLL,
// prime-rl), for compatibility layers and conformance: the same functions the Python SDK's
// native module exposes (`stowplan._stowplan.verl`, `verl_rearrange_micro_batches`,
// `balance_batch`, `roll_load_balance`, `prime_rl_ffd`, `_prime_rl_balanced_partition`, …). Inputs are the peers' integers
// (s64); results are plain arrays of index lists, like the peers' Python lists; a failure is
// a PeerError whose `type` is the Python exception the peer raises.
import { PeerError } from './errors.js';
import { internal, logSeqlenUnbalance, stowplan } from './index.js';
import { DEFAULTS } from './options.js';
import { PY_ERRORS, VERL_FUNCTIONS } from '../generated/manifest.js';

const { call, u32, i64, i64Array, u32Array, u64Array, u64, options, given, bool, lists } = internal;

export { logSeqlenUnbalance, PeerError };
export * from './compat_slime.js';

/** Flat groups as arrays of numbers. */
function arrays(g) {
  return lists(g.offsets, g.indices).map((l) => Array.from(l));
}

/** Runs a peer call: the kernel's py-error (variant or record) becomes a PeerError. */
function peer(f, kernel) {
  return call(() => {
    try {
      return f(kernel.kernel);
    } catch (e) {
      const p = e?.payload;
      if (p && typeof p.tag === 'string' && p.tag in PY_ERRORS) throw new PeerError(PY_ERRORS[p.tag], p.val);
      throw e;
    }
  });
}

/**
 * verl's `karmarkar_karp`, `greedy_partition` or `get_seqlen_balanced_partitions` on
 * `seqlens` with `k` partitions.
 * @param {'karmarkar_karp' | 'greedy_partition' | 'get_seqlen_balanced_partitions'} fn
 * @param {any} seqlens @param {number} k @param {boolean} equalSize
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {number[][]}
 */
export function verl(fn, seqlens, k, equalSize, kernel = stowplan) {
  const names = VERL_FUNCTIONS.map((f) => f.replaceAll('-', '_'));
  if (!names.includes(fn)) throw new PeerError('ValueError', `unknown verl function ${JSON.stringify(fn)}; known: ${names.join(', ')}`);
  const s = i64Array(seqlens, 'seqlens');
  const kk = u32(k, 'k');
  const eq = bool(equalSize, 'equalSize');
  return arrays(peer((k_) => k_.verl.call(fn.replaceAll('_', '-'), s, kk, eq), kernel));
}

/**
 * verl's `rearrange_micro_batches`: the micro-batches' index lists in verl's order.
 * @param {any} seqlens @param {number | bigint} maxTokenLen
 * @param {{minNumMicroBatch?: number, numBatchesDividedBy?: number, useDynamicBszBalance?: boolean,
 *   forceGroupSize?: number, paddedWidth?: number, dpNumMicroBatches?: number}} [opts]
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {number[][]}
 */
export function verlRearrangeMicroBatches(seqlens, maxTokenLen, opts, kernel = stowplan) {
  const o = options(opts, 'verlRearrangeMicroBatches', [
    'minNumMicroBatch', 'numBatchesDividedBy', 'useDynamicBszBalance', 'forceGroupSize', 'paddedWidth', 'dpNumMicroBatches',
  ]);
  const opt = (key) => (given(o[key]) ? i64(o[key], key) : undefined);
  const options_ = {
    maxTokenLen: i64(maxTokenLen, 'maxTokenLen'),
    minNumMicroBatch: opt('minNumMicroBatch'),
    numBatchesDividedBy: opt('numBatchesDividedBy'),
    useDynamicBszBalance: given(o.useDynamicBszBalance)
      ? bool(o.useDynamicBszBalance, 'useDynamicBszBalance')
      : DEFAULTS.VerlMicroOptions.use_dynamic_bsz_balance,
    forceGroupSize: given(o.forceGroupSize) ? i64(o.forceGroupSize, 'forceGroupSize') : DEFAULTS.VerlMicroOptions.force_group_size,
    paddedWidth: opt('paddedWidth'),
    dpNumMicroBatches: opt('dpNumMicroBatches'),
  };
  const s = i64Array(seqlens, 'seqlens');
  return arrays(peer((k) => k.peers.verlRearrangeMicroBatches(s, options_), kernel));
}

/**
 * verl's trainer `_balance_batch` (= ROLL's `batch_balance`): per rank its samples in the
 * peer's order, the raw KK partitions of every call, and the samples left out.
 * @param {any} seqlens @param {number} dp @param {{minibatchSize?: number}} [opts]
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {{partitions: number[][], kkPartitions: number[][][], dropped: number[]}}
 */
export function balanceBatch(seqlens, dp, opts, kernel = stowplan) {
  const o = options(opts, 'balanceBatch', ['minibatchSize']);
  const s = i64Array(seqlens, 'seqlens');
  const d = u32(dp, 'dp');
  const mb = given(o.minibatchSize) ? i64(o.minibatchSize, 'minibatchSize') : undefined;
  const r = peer((k) => k.peers.balanceBatch(s, d, mb), kernel);
  return { partitions: arrays(r.partitions), kkPartitions: r.kkPartitions.map(arrays), dropped: Array.from(r.dropped) };
}

/**
 * ROLL's `LoadBalancePacker`: micro-batches in ROLL's yield order, the KK partitions, the
 * pad factor and the padded lengths.
 * @param {any} lengths @param {number} maskWidth @param {number} maxPackedSequenceLength
 * @param {{minNumMicroBatches?: number, tp?: number, cp?: number, vp?: number, dpNumMicroBatches?: number}} [opts]
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {{microBatches: number[][], kkPartitions: number[][], padFactor: bigint, paddedLengths: BigInt64Array}}
 */
export function rollLoadBalance(lengths, maskWidth, maxPackedSequenceLength, opts, kernel = stowplan) {
  const o = options(opts, 'rollLoadBalance', ['minNumMicroBatches', 'tp', 'cp', 'vp', 'dpNumMicroBatches']);
  // Omitted: ROLL's default, as the kernel's RollLoadBalanceOptions::new sets it.
  const d = DEFAULTS.RollLoadBalanceOptions;
  const opt = (key, fallback) => (given(o[key]) ? i64(o[key], key) : fallback);
  const options_ = {
    maskWidth: i64(maskWidth, 'maskWidth'),
    maxPackedSequenceLength: i64(maxPackedSequenceLength, 'maxPackedSequenceLength'),
    minNumMicroBatches: opt('minNumMicroBatches', d.min_num_micro_batches),
    tp: opt('tp', d.tp),
    cp: opt('cp', d.cp),
    vp: opt('vp', d.vp),
    dpNumMicroBatches: given(o.dpNumMicroBatches) ? i64(o.dpNumMicroBatches, 'dpNumMicroBatches') : undefined,
  };
  const l = i64Array(lengths, 'lengths');
  const r = peer((k) => k.peers.rollLoadBalance(l, options_), kernel);
  return {
    microBatches: arrays(r.microBatches),
    kkPartitions: arrays(r.kkPartitions),
    padFactor: r.padFactor,
    paddedLengths: r.paddedLengths,
  };
}

/**
 * prime-rl's classic packer: lengths truncated to `seqLen`, items by (run, length desc), each
 * to the first bin with its label and room. Returns the bins (members in insertion order) and
 * the zero-length items prime-rl drops.
 * @param {any} lengths @param {any} runs @param {any} labels @param {number | bigint} seqLen
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {{bins: number[][], dropped: number[]}}
 */
export function primeRlFfd(lengths, runs, labels, seqLen, kernel = stowplan) {
  const l = u64Array(lengths, 'lengths');
  const r = u32Array(runs, 'runs');
  const lab = u32Array(labels, 'labels');
  const s = u64(seqLen, 'seqLen');
  const [bins, dropped] = call(() => kernel.kernel.primeRl.ffd(l, r, lab, s));
  return { bins: arrays(bins), dropped: Array.from(dropped) };
}

/**
 * prime-rl HEAD's `_karmarkar_karp(weights, num_partitions)` (equal-size Karmarkar–Karp):
 * groups in descending (total, members) order, members ascending. Weights are u64; the count
 * must be a positive multiple of `numPartitions` (InvalidArgumentError otherwise, where
 * prime-rl asserts).
 * @param {any} weights @param {number} numPartitions
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {number[][]}
 */
export function primeRlKarmarkarKarp(weights, numPartitions, kernel = stowplan) {
  const w = u64Array(weights, 'weights');
  const k = u32(numPartitions, 'numPartitions', 1);
  return arrays(call(() => kernel.kernel.primeRl.karmarkarKarp(w, k)));
}

/**
 * prime-rl HEAD's `balanced_partition(weights, num_partitions)`: `primeRlKarmarkarKarp`, then
 * prime-rl's pairwise-swap refinement (swapped items trade positions).
 * @param {any} weights @param {number} numPartitions
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {number[][]}
 */
export function primeRlBalancedPartition(weights, numPartitions, kernel = stowplan) {
  const w = u64Array(weights, 'weights');
  const k = u32(numPartitions, 'numPartitions', 1);
  return arrays(call(() => kernel.kernel.primeRl.balancedPartition(w, k)));
}

/**
 * The plan of prime-rl HEAD's `prepare_batch`: per sample its length (cut to `seqLen`), run
 * (LoRA), multimodal class (0: text; samples of one class ≥ 1 may share a bin) and label (a
 * bin takes only its first sample's label). Returns the bins after splitting, per bin whether
 * it is multimodal, its padding and cost, and per rank its bins and which of them are dummies.
 * @param {any} lengths @param {any} runs @param {any} multimodal @param {any} labels
 * @param {{seqLen: number | bigint, numTrainWorkers: number, linear?: number | bigint,
 *   quadratic?: number | bigint, padToMultipleOf?: number | bigint, multimodalSameRun?: boolean}} opts
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {{bins: number[][], multimodal: boolean[], padding: bigint[], costs: bigint[], ranks: number[][], dummies: boolean[][]}}
 */
export function primeRlPrepareBatch(lengths, runs, multimodal, labels, opts, kernel = stowplan) {
  const fn = 'primeRlPrepareBatch';
  const o = options(opts, fn, ['seqLen', 'numTrainWorkers', 'linear', 'quadratic', 'padToMultipleOf', 'multimodalSameRun']);
  const options_ = {
    seqLen: u64(o.seqLen, 'seqLen', 1n),
    numTrainWorkers: u32(o.numTrainWorkers, 'numTrainWorkers', 1),
    linear: given(o.linear) ? u64(o.linear, 'linear') : 1n,
    quadratic: given(o.quadratic) ? u64(o.quadratic, 'quadratic') : 0n,
    padToMultipleOf: given(o.padToMultipleOf) ? u64(o.padToMultipleOf, 'padToMultipleOf', 1n) : 1n,
    multimodalSameRun: given(o.multimodalSameRun) ? bool(o.multimodalSameRun, 'multimodalSameRun') : false,
  };
  const l = u64Array(lengths, 'lengths');
  const r = u32Array(runs, 'runs');
  const m = u32Array(multimodal, 'multimodal');
  const lab = u32Array(labels, 'labels');
  const p = call(() => kernel.kernel.primeRl.prepareBatch(l, r, m, lab, options_));
  const ranks = arrays(p.ranks);
  let at = 0;
  const dummies = ranks.map((rank) => rank.map(() => p.dummies[at++]));
  return {
    bins: arrays(p.bins),
    multimodal: Array.from(p.multimodal),
    padding: Array.from(p.padding),
    costs: Array.from(p.costs),
    ranks,
    dummies,
  };
}

/** This module's namespace, as a promise (what `require('stowplan/compat').load()` resolves to). */
export const load = () => import('./compat.js');
