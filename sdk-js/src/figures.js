// Balance figures of a plan's per-group totals, computed as the Rust host computes them for
// its JSON (host/src/json.rs `summary`), and verl's `log_seqlen_unbalance` figures as the
// kernel reproduces them (kernel/src/verl.rs), for the CLI's JSON shape.
import { F64 } from './json.js';
import { PeerError } from './errors.js';

/**
 * Balance figures of per-group totals: `max`, `min`, `spread` (bigints), `mean` and
 * `maxOverMean` (numbers; 1 for a perfect balance) — computed as the Rust host does.
 * @param {BigUint64Array} values
 * @returns {Figures}
 */
export function figures(values) {
  let max = 0n;
  let min = 0n;
  let total = 0n;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (i === 0 || v > max) max = v;
    if (i === 0 || v < min) min = v;
    total += v;
  }
  const mean = values.length === 0 ? 0 : Number(total) / values.length;
  return { max, min, mean, maxOverMean: mean > 0 ? Number(max) / mean : 1, spread: max - min };
}

/** Figures in the CLI's JSON shape. */
export function figuresJson(values) {
  const f = figures(values);
  return { max: f.max, min: f.min, mean: new F64(f.mean), max_over_mean: new F64(f.maxOverMean), spread: f.spread };
}

/**
 * verl's `log_seqlen_unbalance` figures of `ranks` (index lists) of `lengths`: chunk sums of
 * the input order in steps of `n / k` ("before") and rank sums ("after"), as verl computes
 * them. Throws a PeerError where verl's would fail (no ranks, fewer lengths than ranks).
 * @param {BigUint64Array | BigInt64Array} lengths
 * @param {ArrayLike<number>[]} ranks
 * @param {string} [prefix]
 * @returns {Record<string, bigint | number>}
 */
export function logSeqlenUnbalance(lengths, ranks, prefix = 'global_seqlen') {
  const I64_MAX = (1n << 63n) - 1n;
  const n = lengths.length;
  const k = ranks.length;
  if (k === 0) throw new PeerError('ZeroDivisionError', 'integer division or modulo by zero');
  const chunk = Math.floor(n / k);
  if (chunk === 0) throw new PeerError('ValueError', 'range() arg 3 must not be zero');
  const seq = (i) => (lengths[i] > I64_MAX ? I64_MAX : BigInt.asIntN(64, lengths[i]));
  let min = null;
  let max = null;
  let total = 0n;
  for (let start = 0; start < n; start += chunk) {
    let s = 0n;
    for (let i = start; i < Math.min(n, start + chunk); i++) s += seq(i);
    if (min === null || s < min) min = s;
    if (max === null || s > max) max = s;
    total += s;
  }
  let bmin = null;
  let bmax = null;
  for (const r of ranks) {
    let s = 0n;
    for (const raw of r) {
      const i = raw < 0 ? raw + n : raw;
      if (!(i >= 0 && i < n)) throw new PeerError('IndexError', 'list index out of range');
      s += seq(i);
    }
    if (bmin === null || s < bmin) bmin = s;
    if (bmax === null || s > bmax) bmax = s;
  }
  const w = (x) => BigInt.asIntN(64, x);
  return {
    [`${prefix}/min`]: w(min),
    [`${prefix}/max`]: w(max),
    [`${prefix}/minmax_diff`]: w(max - min),
    [`${prefix}/balanced_min`]: w(bmin),
    [`${prefix}/balanced_max`]: w(bmax),
    [`${prefix}/mean`]: Number(total) / k,
  };
}
