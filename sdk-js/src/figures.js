// Balance figures and verl's `log_seqlen_unbalance` figures: the kernel computes both
// (`balance.figures-of`, `peers.log-seqlen-unbalance`); this module only calls it and puts
// the records in the shapes the SDK gives (camelCase figures, verl's dict).
import { call } from './errors.js';
import { i64Array, u64Array } from './convert.js';

const I64_MAX = (1n << 63n) - 1n;

/**
 * Balance figures of per-group totals: `max`, `min`, `spread` (bigints), `mean` and
 * `maxOverMean` (numbers; 1 for a perfect balance), from the kernel `k` (a loaded
 * component's exports).
 * @param {any} k @param {any} values
 * @returns {Figures}
 */
export function figuresOf(k, values) {
  const v = u64Array(values, 'values');
  return call(() => k.balance.figuresOf(v));
}

/**
 * verl's `log_seqlen_unbalance` figures of `ranks` (index lists; negative indices count from
 * the end, as in Python) of `lengths`, from the kernel `k`: chunk sums of the input order in
 * steps of `n / k` ("before") and rank sums ("after"). Lengths above 2^63 − 1 count as
 * 2^63 − 1. Throws a PeerError where verl's would fail (no ranks, fewer lengths than ranks,
 * an index outside the list).
 * @param {any} k @param {BigUint64Array | BigInt64Array} lengths @param {ArrayLike<number>[]} ranks
 * @param {string} prefix
 * @returns {Record<string, bigint | number>}
 */
export function unbalanceOf(k, lengths, ranks, prefix) {
  const seqlens =
    lengths instanceof BigInt64Array ? lengths : BigInt64Array.from(lengths, (l) => (BigInt(l) > I64_MAX ? I64_MAX : BigInt(l)));
  const parts = Array.from(ranks, (r, i) => i64Array(r, `ranks[${i}]`));
  const u = call(() => k.peers.logSeqlenUnbalance(seqlens, parts));
  return {
    [`${prefix}/min`]: u.min,
    [`${prefix}/max`]: u.max,
    [`${prefix}/minmax_diff`]: u.minmaxDiff,
    [`${prefix}/balanced_min`]: u.balancedMin,
    [`${prefix}/balanced_max`]: u.balancedMax,
    [`${prefix}/mean`]: u.mean,
  };
}
