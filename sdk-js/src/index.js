// stowplan for JavaScript: the kernel component (host/assets/stowplan_kernel.wasm), transpiled
// by jco, in Node and in browsers. The algorithms run in the component; this module checks
// and converts inputs and wraps results, following the Python SDK where it maps.
//
// Integers are exact: u64 values come back as bigints (scalars) and BigUint64Arrays (lists),
// u32 values as numbers and Uint32Arrays. Inputs take numbers (safe integers) or bigints,
// arrays or integer typed arrays. Options are the Python SDK's keyword options in camelCase;
// an omitted option takes the host's default.
import { F64, stringify } from './json.js';
import {
  InfeasibleError,
  InvalidArgumentError,
  KernelRuntimeError,
  PeerError,
  StowplanError,
  fromKernel,
} from './errors.js';
import { bool, checkEntries, given, i64, i64Array, oneOf, options, u32, u32Array, u64, u64Array } from './convert.js';
import { loadKernel } from './kernel.js';
import { LIMITS, SEGMENTS, STREAM } from '../generated/manifest.js';

export { InfeasibleError, InvalidArgumentError, KernelRuntimeError, PeerError, StowplanError };

/** The kernel's named cost models: a sequence of L tokens costs `linear·L + quadratic·L²`. */
export const COSTS = Object.freeze({
  tokens: Object.freeze([1n, 0n]),
  attention: Object.freeze([24576n, 1n]),
});

/** The most groups, ranks or micro-batches a kernel call sizes a result by (the kernel's, 2**20). */
const MAX_COUNT = LIMITS.MAX_COUNT;
/** The largest cp or tp (the kernel's, 2**16). */
const MAX_PARALLEL = LIMITS.MAX_PARALLEL;
/** The oversize policies, the kernel's names. */
const OVERSIZE = ['error', 'single', 'drop'];
/** The packing algorithms, the kernel's names. */
const PACK_METHODS = ['bfd', 'ffd', 'next-fit'];
/** The most resources (limits besides the segment count) of `packMulti` (the kernel's, 8). */
const MAX_RESOURCES = LIMITS.MAX_RESOURCES;
/**
 * Lengths per kernel call of `StreamPacker#add`: a longer add is cut into calls of this many
 * (the bins do not depend on the cut), so that a packer's linear memory stays small; the
 * packer's state is saved first and put back if a call is refused.
 */
const STREAM_CHUNK = 1 << 22;

// ---------------------------------------------------------------------------------------
// Result helpers

/**
 * Group `g` of flat groups: `indices[offsets[g] .. offsets[g + 1]]` (a view, no copy; also of
 * a BigUint64Array of stream indices).
 * @param {Uint32Array} offsets @param {Uint32Array} indices
 * @returns {Uint32Array[]}
 */
function lists(offsets, indices) {
  const out = new Array(Math.max(0, offsets.length - 1));
  for (let g = 0; g < out.length; g++) out[g] = indices.subarray(offsets[g], offsets[g + 1]);
  return out;
}

/** The lists of flat groups as plain arrays (for JSON). */
function plainLists(offsets, indices) {
  return lists(offsets, indices).map((l) => Array.from(l));
}

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
function figuresJson(values) {
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

/** A cost option: a preset name or a `[linear, quadratic]` pair of integers. */
function costOption(cost, name = 'cost') {
  if (!given(cost)) return { linear: 1n, quadratic: 0n };
  if (typeof cost === 'string') {
    if (!(cost in COSTS)) {
      throw new InvalidArgumentError(`${name} must be 'tokens' or 'attention' or a [linear, quadratic] pair of integers (got ${JSON.stringify(cost)})`);
    }
    const [linear, quadratic] = COSTS[/** @type {keyof COSTS} */ (cost)];
    return { linear, quadratic };
  }
  if (Array.isArray(cost) && cost.length === 2) {
    return { linear: u64(cost[0], `${name} linear coefficient`), quadratic: u64(cost[1], `${name} quadratic coefficient`) };
  }
  throw new InvalidArgumentError(`${name} must be 'tokens' or 'attention' or a [linear, quadratic] pair of integers (got ${typeof cost})`);
}

// ---------------------------------------------------------------------------------------
// Result classes

/** A partition of the input indices into `k` groups (the result of `partition`). */
export class Partition {
  /** @param {any} p the kernel's partitioning */
  constructor(p) {
    /** Group boundaries into `indices` (`k + 1` entries, first 0). */
    this.offsets = p.groups.offsets;
    /** Input indices, group after group (members ascending). */
    this.indices = p.groups.indices;
    /** Sum of each group, in group order. */
    this.sums = p.sums;
    /** Sum of all weights. */
    this.total = p.total;
    /** Largest group sum minus smallest. */
    this.spread = p.spread;
    /** max(ceil(total / k), largest weight): no partition has a lighter largest group. */
    this.lowerBound = p.lowerBound;
    /** Number of groups. */
    this.k = this.offsets.length - 1;
    /** The largest group sum. */
    this.max = this.sums.reduce((a, b) => (b > a ? b : a), 0n);
  }

  /** The groups, as views into `indices`. @returns {Uint32Array[]} */
  get groups() {
    return lists(this.offsets, this.indices);
  }

  /** Number of groups. */
  get length() {
    return this.k;
  }
}

/** Bins of a packing (the result of `pack`). */
export class Packing {
  /** @param {any} p the kernel's packing @param {BigUint64Array} lengths @param {bigint} capacity */
  constructor(p, lengths, capacity) {
    /** Bin boundaries into `indices`. */
    this.offsets = p.bins.offsets;
    /** Input indices, bin after bin (members ascending). */
    this.indices = p.bins.indices;
    /** Aligned load of each bin. */
    this.loads = p.loads;
    /** Items left out under oversize policy `drop`, ascending. */
    this.dropped = p.dropped;
    /** Oversized items placed alone under oversize policy `single`, ascending. */
    this.single = p.single;
    /** Sum of the real lengths of the packed items. */
    this.realTokens = p.realTokens;
    /** Sum of their aligned lengths. */
    this.alignedTokens = p.alignedTokens;
    /** Alignment padding: `alignedTokens - realTokens`. */
    this.paddingTokens = p.alignedTokens - p.realTokens;
    /** No packing of the items that fit uses fewer bins (`single` bins come on top). */
    this.lowerBound = p.lowerBound;
    /** The bin capacity. */
    this.capacity = capacity;
    /** Number of bins. */
    this.numBins = this.offsets.length - 1;
    const regular = this.numBins - this.single.length;
    let singleReal = 0n;
    for (const i of this.single) singleReal += lengths[i];
    /** Real tokens of the regular bins over their capacity (0 without regular bins). */
    this.efficiency =
      regular === 0 || capacity === 0n ? 0 : Number(this.realTokens - singleReal) / (regular * Number(capacity));
  }

  /** The bins, as views into `indices`. @returns {Uint32Array[]} */
  get bins() {
    return lists(this.offsets, this.indices);
  }

  /** Number of bins. */
  get length() {
    return this.numBins;
  }
}

/**
 * Bins under several limits (the result of `packMulti`): a `Packing` of the items (its `loads`,
 * `realTokens`, `efficiency` … count tokens, the first resource; `lowerBound` is the largest of
 * `lowerBounds`) plus every bin's load in every resource.
 */
export class MultiPacking extends Packing {
  /**
   * @param {any} m the kernel's multi-packing @param {BigUint64Array} tokens the first column
   * @param {string[]} names @param {bigint[]} capacities in the order of `names`
   * @param {bigint} maxSegments
   */
  constructor(m, tokens, names, capacities, maxSegments) {
    super(m.packing, tokens, capacities[0]);
    const r = names.length;
    /** The resources' names, tokens first, in the order of `columns`. */
    this.names = names;
    /** Each resource's capacity per bin, name → capacity. */
    this.capacities = Object.fromEntries(names.map((name, q) => [name, capacities[q]]));
    /** Items per bin at most (0n: no limit). */
    this.maxSegments = maxSegments;
    /** Every bin's load in every resource: one array per bin, in the order of `names` (views into one list). */
    this.resourceLoads = Array.from({ length: this.numBins }, (_, b) => m.resourceLoads.subarray(b * r, (b + 1) * r));
    /**
     * name → ceil(sum of the sizes of the items that fit / capacity), and `segments` →
     * ceil(items that fit / maxSegments) with a segment limit.
     */
    this.lowerBounds = Object.fromEntries([
      ...names.map((name, q) => [name, m.lowerBounds[q]]),
      ...(maxSegments > 0n ? [[SEGMENTS, m.lowerBounds[r]]] : []),
    ]);
  }
}

/** Groups with `tokens` and `costs` (micro-batches, ranks): their balance figures. */
class Totals {
  /** Balance figures of the groups' tokens. @returns {Figures} */
  get tokenBalance() {
    return figures(/** @type {any} */ (this).tokens);
  }

  /** Balance figures of the groups' costs. @returns {Figures} */
  get costBalance() {
    return figures(/** @type {any} */ (this).costs);
  }
}

/** Micro-batches of one batch (the result of `microBatches`, and each rank's in `balance`). */
export class MicroBatches extends Totals {
  /** @param {any} p the kernel's micro-plan */
  constructor(p) {
    super();
    /** Micro-batch boundaries into `indices`. */
    this.offsets = p.batches.offsets;
    /** Input indices, micro-batch after micro-batch (each ascending). */
    this.indices = p.batches.indices;
    /** Tokens of each micro-batch (each ≤ the cap). */
    this.tokens = p.tokens;
    /** Cost of each micro-batch. */
    this.costs = p.costs;
    /** `restore[i]`: the position of input `i` in `indices` (outputs back in input order). */
    this.restore = p.restore;
    /** max(1, ceil(total tokens / cap)): no plan has fewer micro-batches. */
    this.lowerBound = p.lowerBound;
    /** The count this batch needs on its own (what `count` overrides). */
    this.required = p.required;
    /** Number of micro-batches. */
    this.count = this.offsets.length - 1;
  }

  /** The micro-batches, as views into `indices`. @returns {Uint32Array[]} */
  get batches() {
    return lists(this.offsets, this.indices);
  }

  /** Number of micro-batches. */
  get length() {
    return this.count;
  }

  /** This plan in the CLI's JSON shape (a value for `stringify`). @returns {object} */
  toPlan() {
    return {
      batches: plainLists(this.offsets, this.indices),
      tokens: this.tokens,
      costs: this.costs,
      restore: this.restore,
      count: this.count,
      lower_bound: this.lowerBound,
      required: this.required,
      token_balance: figuresJson(this.tokens),
      cost_balance: figuresJson(this.costs),
    };
  }

  /**
   * The plan as JSON text, byte-identical to the `micro_batches` object of
   * `stowplan balance --max-token-len T --json` (dp 1).
   * @returns {string}
   */
  toJSONText() {
    return stringify({ micro_batches: this.toPlan() });
  }
}

/** A global batch over `dp` ranks, with every rank's micro-batches when a cap was given. */
export class Balance extends Totals {
  /**
   * @param {any} dpPlan the kernel's DP plan
   * @param {MicroBatches[] | null} ranks every rank's micro-batches, or null
   * @param {BigUint64Array} lengths the global lengths
   */
  constructor(dpPlan, ranks, lengths) {
    super();
    /** Rank boundaries into `order`. */
    this.offsets = dpPlan.ranks.offsets;
    /** The permutation to reorder the batch by: rank after rank, each ascending. */
    this.order = dpPlan.ranks.indices;
    /** Tokens of each rank. */
    this.tokens = dpPlan.tokens;
    /** Cost of each rank. */
    this.costs = dpPlan.costs;
    /** No assignment has a lighter costliest rank. */
    this.costLowerBound = dpPlan.costLowerBound;
    /** Every rank's micro-batches (indices are global), or null without `maxTokenLen`. */
    this.microBatches = ranks;
    /** The micro-batch count of every rank, or null without `maxTokenLen`. */
    this.count = ranks ? (ranks[0]?.count ?? 0) : null;
    /** Number of ranks. */
    this.dp = this.offsets.length - 1;
    /** The global lengths planned. */
    this.lengths = lengths;
  }

  /** Every rank's samples, as views into `order`. @returns {Uint32Array[]} */
  get ranks() {
    return lists(this.offsets, this.order);
  }

  /** Number of ranks. */
  get length() {
    return this.dp;
  }

  /**
   * verl's `log_seqlen_unbalance` metrics for these ranks (tokens).
   * @param {string} [prefix]
   */
  logSeqlenUnbalance(prefix = 'global_seqlen') {
    return logSeqlenUnbalance(this.lengths, this.ranks, prefix);
  }

  /** This plan in the CLI's JSON shape (a value for `stringify`). @returns {object} */
  toPlan() {
    let verl = null;
    try {
      const u = this.logSeqlenUnbalance();
      verl = { ...u, 'global_seqlen/mean': new F64(/** @type {number} */ (u['global_seqlen/mean'])) };
    } catch (e) {
      if (!(e instanceof PeerError)) throw e;
    }
    const plan = {
      dp: {
        ranks: plainLists(this.offsets, this.order),
        order: this.order,
        tokens: this.tokens,
        costs: this.costs,
        cost_lower_bound: this.costLowerBound,
        token_balance: figuresJson(this.tokens),
        cost_balance: figuresJson(this.costs),
        verl_unbalance: verl,
      },
    };
    if (this.microBatches) {
      const all = (key) => {
        const parts = this.microBatches.map((m) => m[key]);
        const out = new BigUint64Array(parts.reduce((a, p) => a + p.length, 0));
        let at = 0;
        for (const p of parts) {
          out.set(p, at);
          at += p.length;
        }
        return out;
      };
      Object.assign(plan, {
        micro_batches: this.microBatches.map((m) => m.toPlan()),
        count: this.count,
        micro_batch_token_balance: figuresJson(all('tokens')),
        micro_batch_cost_balance: figuresJson(all('costs')),
      });
    }
    return plan;
  }

  /**
   * The plan as JSON text, byte-identical to the plan `stowplan balance --dp N [--max-token-len
   * T] --json` prints (its keys before `operation`).
   * @returns {string}
   */
  toJSONText() {
    return stringify(this.toPlan());
  }
}

/** One packed row of sequences split over context-parallel ranks (the result of `cpLayout`). */
export class CpLayout {
  /** @param {any} s the kernel's cp-split @param {number} cp */
  constructor(s, cp) {
    /** The pad factor; every sequence is padded to a multiple of it. */
    this.factor = s.factor;
    /** The CP size. */
    this.cp = cp;
    /** `n + 1` cumulative real lengths. */
    this.cuSeqlens = s.cuSeqlens;
    /** `n + 1` cumulative padded lengths (sequence `i` is `[cuSeqlensPadded[i], cuSeqlensPadded[i+1])`). */
    this.cuSeqlensPadded = s.cuSeqlensPadded;
    /** The longest real length. */
    this.maxSeqlen = s.maxSeqlen;
    /** The longest padded length. */
    this.maxSeqlenPadded = s.maxSeqlenPadded;
    /** Every rank's sequence boundaries (`cuSeqlensPadded / cp`). */
    this.localBounds = s.localBounds;
    /** Real tokens per CP rank. */
    this.rankRealTokens = s.rankRealTokens;
    /** Tokens of the padded row. */
    this.paddedTokens = s.cuSeqlensPadded.length ? s.cuSeqlensPadded[s.cuSeqlensPadded.length - 1] : 0n;
    /** The gather runs: rank `r` takes runs `runOffsets[r] .. runOffsets[r+1]`. */
    this.runOffsets = s.runOffsets;
    /** Start of each run in the padded row. */
    this.runStarts = s.runStarts;
    /** Length of each run. */
    this.runLengths = s.runLengths;
    this._gather = null;
  }

  /** Per CP rank, the positions of the padded row it receives, in its order. @returns {Uint32Array[]} */
  get gather() {
    if (this._gather) return this._gather;
    if (this.paddedTokens > 0xffffffffn) {
      throw new InvalidArgumentError(`the padded row has ${this.paddedTokens} tokens: more than a JavaScript array holds`);
    }
    const out = [];
    for (let r = 0; r < this.cp; r++) {
      let n = 0;
      for (let j = this.runOffsets[r]; j < this.runOffsets[r + 1]; j++) n += Number(this.runLengths[j]);
      const p = new Uint32Array(n);
      let at = 0;
      for (let j = this.runOffsets[r]; j < this.runOffsets[r + 1]; j++) {
        const start = Number(this.runStarts[j]);
        for (let x = 0; x < Number(this.runLengths[j]); x++) p[at++] = start + x;
      }
      out.push(p);
    }
    this._gather = out;
    return out;
  }

  /**
   * Every CP rank's part of `row` (an array or typed array of the padded row's length), of
   * the row's own type.
   * @template {ArrayLike<any>} T
   * @param {T} row
   * @returns {T[]}
   */
  split(row) {
    if (!row || typeof row.length !== 'number' || BigInt(row.length) !== this.paddedTokens) {
      throw new InvalidArgumentError(`row must be an array of ${this.paddedTokens} elements (got ${row?.length})`);
    }
    return this.gather.map((positions) => {
      const make = ArrayBuffer.isView(row) ? /** @type {any} */ (row).constructor : Array;
      const part = new make(positions.length);
      for (let i = 0; i < positions.length; i++) part[i] = row[positions[i]];
      return part;
    });
  }

  /**
   * The inverse of `split`: the CP ranks' rows back into one padded row (the type of
   * `rows[0]`).
   * @template {ArrayLike<any>} T
   * @param {T[]} rows
   * @returns {T}
   */
  unpack(rows) {
    const gather = this.gather;
    if (!Array.isArray(rows) || rows.length !== gather.length) {
      throw new InvalidArgumentError(`rows must hold one row per CP rank (${gather.length}; got ${rows?.length})`);
    }
    const make = ArrayBuffer.isView(rows[0]) ? /** @type {any} */ (rows[0]).constructor : Array;
    const out = new make(Number(this.paddedTokens));
    rows.forEach((r, k) => {
      if (!r || r.length !== gather[k].length) {
        throw new InvalidArgumentError(`rows[${k}] has ${r?.length} elements; CP rank ${k} holds ${gather[k].length}`);
      }
      for (let i = 0; i < r.length; i++) out[gather[k][i]] = r[i];
    });
    return out;
  }
}

/** A raw static pack plan (the result of `rawPlan`): world-size independent. */
export class RawPlan {
  /** @param {any} p the kernel's raw plan @param {{packingLength: bigint, align: bigint, allowSingleLong: boolean}} o */
  constructor(p, o) {
    /** Pack boundaries into `indices`. */
    this.offsets = p.packs.offsets;
    /** Sample indices, pack after pack (packs by smallest member; members ascending). */
    this.indices = p.packs.indices;
    /** Real tokens of each pack. */
    this.tokens = p.tokens;
    /** Long samples emitted as single-sample packs, ascending. */
    this.singleLong = p.singleLong;
    /** Long samples dropped (allowSingleLong false), ascending. */
    this.dropped = p.dropped;
    /** Sum of the real lengths of the packed samples. */
    this.realTokens = p.realTokens;
    /** Sum of the aligned lengths of the samples that are not long. */
    this.alignedTokens = p.alignedTokens;
    /** No plan of these samples has fewer packs. */
    this.lowerBound = p.lowerBound;
    /** sha256 (hex) of the canonical encoding of the packs (the CLI's `raw_checksum`). */
    this.checksum = p.checksum;
    /** The options the plan was made with. */
    this.options = o;
    /** Number of packs. */
    this.numPacks = this.offsets.length - 1;
  }

  /** The packs, as views into `indices`. @returns {Uint32Array[]} */
  get packs() {
    return lists(this.offsets, this.indices);
  }

  /** Number of packs. */
  get length() {
    return this.numPacks;
  }
}

/** The plan `worldSize` ranks consume (the result of `alignedPlan`). */
export class AlignedPlan {
  /** @param {any} p the kernel's aligned plan @param {RawPlan} raw @param {number} worldSize @param {boolean} dropLast */
  constructor(p, raw, worldSize, dropLast) {
    /** The raw pack of every slot, in order; a multiple of `worldSize` long. */
    this.packs = p.packs;
    /** Raw packs `0 .. padNeeded` repeated at the end (dropLast false). */
    this.padNeeded = p.padNeeded;
    /** The last `droppedPacks` raw packs left out (dropLast true). */
    this.droppedPacks = p.droppedPacks;
    /** Samples in the dropped packs. */
    this.droppedSamples = p.droppedSamples;
    /** sha256 (hex) of the canonical encoding of the consumed packs (the CLI's `aligned_checksum`). */
    this.checksum = p.checksum;
    /** The raw plan aligned. */
    this.raw = raw;
    /** Ranks the plan is aligned for. */
    this.worldSize = worldSize;
    /** Whether the remainder was dropped instead of padded. */
    this.dropLast = dropLast;
  }

  /** Sample indices of slot `i` (negative counts from the end). @param {number} i @returns {Uint32Array} */
  pack(i) {
    const n = this.packs.length;
    const j = u32(i < 0 ? i + n : i, 'index', 0, Math.max(0, n - 1));
    if (n === 0) throw new InvalidArgumentError('the plan has no packs');
    const p = this.packs[j];
    return this.raw.indices.subarray(this.raw.offsets[p], this.raw.offsets[p + 1]);
  }

  /** Number of slots. */
  get length() {
    return this.packs.length;
  }
}

// ---------------------------------------------------------------------------------------
// The kernel handle

/** Runs `f`, turning the kernel's result errors and traps into stowplan errors. */
function call(f) {
  try {
    return f();
  } catch (e) {
    if (e && typeof e === 'object' && 'payload' in e) {
      const p = /** @type {any} */ (e).payload;
      if (p && typeof p.tag === 'string' && typeof p.val === 'string') throw fromKernel(p);
      if (p && typeof p.exception === 'string') throw new PeerError(p.exception, p.message);
    }
    if (e instanceof StowplanError) throw e;
    throw new KernelRuntimeError(`kernel runtime failure: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/** The options `pack` and `packMulti` share (align, method, oversize), with the host's defaults. */
function packOptions(o) {
  return {
    align: given(o.align) ? u64(o.align, 'align', 1n) : 1n,
    method: given(o.method) ? oneOf(o.method, 'method', PACK_METHODS) : 'bfd',
    oversize: given(o.oversize) ? oneOf(o.oversize, 'oversize', OVERSIZE) : 'error',
  };
}

/** The [key, value] pairs of an object or Map argument of `packMulti`, keys checked to be names. */
function namedEntries(v, name, what) {
  let entries;
  if (v instanceof Map) entries = [...v];
  else if (v && typeof v === 'object' && !Array.isArray(v) && !ArrayBuffer.isView(v)) entries = Object.entries(v);
  else {
    const got = Array.isArray(v) ? `an array of ${v.length}` : v === null ? 'null' : typeof v;
    throw new InvalidArgumentError(`${name} must be an object or a Map of resource name → ${what} (got ${got})`);
  }
  for (const [key] of entries) {
    if (typeof key !== 'string') {
      throw new InvalidArgumentError(`${name}' keys must be resource names (strings), got ${typeof key === 'bigint' ? `${key}n` : String(key)}`);
    }
  }
  return entries;
}

/**
 * The table of `packMulti`: the names, each column's sizes, each capacity, checked and
 * matched by name (errors name `columns['…']` and `capacities['…']`).
 */
function resourceTable(columns, capacities) {
  const cols = namedEntries(columns, 'columns', 'sizes');
  const caps = new Map(namedEntries(capacities, 'capacities', 'capacity'));
  if (cols.length === 0 || cols.length > MAX_RESOURCES) {
    throw new InvalidArgumentError(`columns must name 1 to ${MAX_RESOURCES} resources (got ${cols.length})`);
  }
  const names = cols.map(([name]) => name);
  const capacity = [];
  const sizes = [];
  for (const [name, values] of cols) {
    if (!caps.has(name)) throw new InvalidArgumentError(`capacities has no entry for column '${name}'`);
    capacity.push(u64(caps.get(name), `capacities['${name}']`, 1n));
    sizes.push(u64Array(values, `columns['${name}']`));
  }
  for (const key of caps.keys()) {
    if (!names.includes(key)) {
      throw new InvalidArgumentError(`capacities['${key}'] has no column of sizes in columns (columns: ${names.join(', ')})`);
    }
  }
  const n = sizes[0].length;
  const q = sizes.findIndex((c) => c.length !== n);
  if (q >= 0) {
    throw new InvalidArgumentError(`columns['${names[q]}'] has ${sizes[q].length} sizes, columns['${names[0]}'] ${n}: one per item in each`);
  }
  return { names, capacity, sizes, n };
}

/** The kernel's sizes list of a table: item by item, a row of its sizes in every resource. */
function rows(sizes, n) {
  const r = sizes.length;
  if (r === 1) return sizes[0];
  checkEntries(n * r, 'columns (all their sizes together)', 8);
  const out = new BigUint64Array(n * r);
  for (let q = 0; q < r; q++) {
    const c = sizes[q];
    for (let i = 0; i < n; i++) out[i * r + q] = c[i];
  }
  return out;
}

/** Micro-batch options shared by `microBatches` and `balance`. */
function microOptions(maxTokenLen, cost, o) {
  const divisibleBy = given(o.divisibleBy) ? u32(o.divisibleBy, 'divisibleBy', 1, MAX_COUNT) : 1;
  return {
    maxTokenLen: u64(maxTokenLen, 'maxTokenLen', 1n),
    cost,
    minCount: given(o.minCount) ? u32(o.minCount, 'minCount', 0, MAX_COUNT) : 0,
    divisibleBy,
    count: given(o.count) ? u32(o.count, 'count', 1, MAX_COUNT) : undefined,
    order: given(o.order) ? oneOf(o.order, 'order', ['none', 'cost-desc', 'verl', 'roll']) : 'none',
  };
}

/** Alignment options of `padFactor` and `cpLayout`. */
function alignOptions(o, cpDefault) {
  const cp = given(o.cp) ? u32(o.cp, 'cp', 1, MAX_PARALLEL) : cpDefault;
  const tp = given(o.tp) ? u32(o.tp, 'tp', 1, MAX_PARALLEL) : 1;
  let factor = { tag: 'cp-tp' };
  if (given(o.align)) {
    if (o.align === 'cp_tp' || o.align === 'cp-tp') factor = { tag: 'cp-tp' };
    else if (o.align === 'roll') factor = { tag: 'roll' };
    else if (typeof o.align === 'string') {
      throw new InvalidArgumentError(`align must be 'cp_tp', 'roll' or a positive integer (got ${JSON.stringify(o.align)})`);
    } else factor = { tag: 'multiple', val: u64(o.align, 'align', 1n) };
  }
  return { cp, tp, factor, powerOfTwo: given(o.powerOfTwo) ? bool(o.powerOfTwo, 'powerOfTwo') : false };
}

/** Labels (any values) → dense u32 ids, one per sample. */
function labelIds(groups, n) {
  if (!groups || typeof groups === 'string' || typeof groups[Symbol.iterator] !== 'function') {
    throw new InvalidArgumentError('groups must be a sequence of labels, one per sample');
  }
  const mismatch = (got) => new InvalidArgumentError(`groups must hold one label per sample (${n}; got ${got})`);
  // An array's length is compared before anything is read or allocated; another iterable is
  // read up to one label too many.
  let values;
  if (Array.isArray(groups) || ArrayBuffer.isView(groups)) {
    if (groups.length !== n) throw mismatch(groups.length);
    values = groups;
  } else {
    values = [];
    for (const v of groups) {
      if (values.length === n) throw mismatch(`more than ${n}`);
      values.push(v);
    }
    if (values.length !== n) throw mismatch(values.length);
  }
  const ids = new Map();
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    const v = values[i];
    if (!ids.has(v)) ids.set(v, ids.size);
    out[i] = ids.get(v);
  }
  return out;
}

/** The bins one call of a `StreamPacker` closed (stream indices, bigints). */
export class ClosedBins {
  /** @param {any} c the kernel's closed bins */
  constructor(c) {
    /** Bin boundaries into `indices`. */
    this.offsets = c.offsets;
    /** Stream indices, bin after bin (ascending in each bin). */
    this.indices = c.indices;
    /** Aligned load of each bin (above the capacity only for a `single` bin). */
    this.loads = c.loads;
    /** Stream indices of the lengths above the capacity left out under oversize `drop`, ascending. */
    this.dropped = c.dropped;
    /** Number of bins. */
    this.numBins = this.offsets.length - 1;
  }

  /** The bins, as views into `indices`. @returns {BigUint64Array[]} */
  get bins() {
    return /** @type {any} */ (lists(this.offsets, /** @type {any} */ (this.indices)));
  }

  /** Number of bins. */
  get length() {
    return this.numBins;
  }
}

/** Frees a jco resource now (jco's bindings give each a dispose method under this symbol). */
function release(resource) {
  resource?.[Symbol.dispose ?? Symbol.for('dispose')]?.();
}

/** The closed bins of several kernel calls, in order, as one result. @param {any[]} parts */
function concatClosed(parts) {
  const total = (key) => parts.reduce((n, p) => n + p[key].length, 0);
  const offsets = new Uint32Array(total('offsets') - parts.length + 1);
  const indices = new BigUint64Array(total('indices'));
  const loads = new BigUint64Array(total('loads'));
  const dropped = new BigUint64Array(total('dropped'));
  let [bins, at, lo, dr] = [0, 0, 0, 0];
  for (const p of parts) {
    for (let b = 1; b < p.offsets.length; b++) offsets[++bins] = at + p.offsets[b];
    indices.set(p.indices, at);
    loads.set(p.loads, lo);
    dropped.set(p.dropped, dr);
    [at, lo, dr] = [at + p.indices.length, lo + p.loads.length, dr + p.dropped.length];
  }
  return { offsets, indices, loads, dropped };
}

/**
 * A streaming bin packer (`Stowplan#streamPacker`): lengths go in a few at a time, each bin
 * comes out when it closes, and memory stays bounded however long the stream. The kernel's
 * rule is item by item, so how the stream is cut into `add` calls changes nothing; the bins
 * are those of the Rust host, the CLI's `pack --stream` and Python's `StreamPacker`.
 *
 * Each packer runs in a kernel instance of its own (as in the Rust host): its state lives in
 * that instance's linear memory, and a failure of the instance (a trap) ends that packer
 * only. `dispose()` frees it at once; otherwise the garbage collector does.
 */
export class StreamPacker {
  /** @param {any} handle the kernel's packer resource @param {any} instance its kernel instance */
  constructor(handle, instance) {
    /** @private */
    this.p = handle;
    /** @private */
    this.instance = instance;
    const o = call(() => handle.options());
    /** The options it was made with: capacity, align, maxOpenBins, maxBuffered, oversize. */
    this.options = Object.freeze({ ...o });
    /**
     * Stream indices dropped (oversize `drop`) by the last `add` or `finish` that returned
     * (`finish` places buffered lengths only, which are never oversized: it sets none).
     */
    this.lastDropped = new BigUint64Array(0);
  }

  /**
   * Adds the next lengths of the stream; returns the bins that closed. All or nothing: when it
   * throws the kernel's refusal (InfeasibleError for a length above the capacity under
   * `error`, InvalidArgumentError e.g. for a length whose rounding up to `align` overflows),
   * the packer is exactly as before the call, also when the add was cut into several kernel
   * calls (its state is saved before the first and restored after a refused one).
   * @param {any} lengths
   * @returns {ClosedBins}
   */
  add(lengths) {
    const l = u64Array(lengths, 'lengths');
    // One kernel call: the kernel checks every length before it applies any.
    if (l.length <= STREAM_CHUNK) return this.closed(call(() => this.live().add(l)));
    // Several: a later call may be refused after earlier ones were applied (the kernel checks
    // each call's lengths only), so the state before the first is kept to go back to. (No
    // call is refused for its count, which the kernel checks per call: it is at most
    // STREAM_CHUNK, and a packer holds at most 2**29 items, 8 bytes each in 4 GiB of memory.)
    const saved = this.state();
    const parts = [];
    try {
      for (let i = 0; i < l.length; i += STREAM_CHUNK) {
        parts.push(call(() => this.live().add(l.subarray(i, i + STREAM_CHUNK))));
      }
    } catch (e) {
      // A refusal leaves the instance sound: put the state back. A trap does not (the
      // instance is not to be trusted, as for any call): the packer ends as before.
      if (e instanceof InvalidArgumentError || e instanceof InfeasibleError) this.rollBack(saved);
      throw e;
    }
    return this.closed(concatClosed(parts));
  }

  /** Places every buffered length and closes every open bin; the packer stays usable. @returns {ClosedBins} */
  finish() {
    return this.closed(call(() => this.live().finish()));
  }

  /**
   * The whole state as bytes (framed, versioned, checksummed; the same bytes from every
   * host): `Stowplan#streamPackerFromState` continues exactly.
   * @returns {Uint8Array}
   */
  state() {
    return call(() => this.live().save());
  }

  /**
   * Where the stream stands: `nextIndex` (lengths added so far), `buffered`, `openBins`,
   * `inOpenBins`, `oldestHeld` (the smallest index not yet in a closed bin, or null).
   */
  status() {
    const s = call(() => this.live().status());
    return Object.freeze({
      nextIndex: s.nextIndex,
      buffered: s.buffered,
      openBins: s.openBins,
      inOpenBins: s.inOpenBins,
      oldestHeld: s.oldestHeld ?? null,
    });
  }

  /** Frees the packer and its kernel instance now; later calls throw KernelRuntimeError. */
  dispose() {
    const p = this.p;
    this.p = null;
    this.instance = null;
    release(p);
  }

  /**
   * @private The packer put back to `saved` (its own `state()` bytes), in the same instance:
   * the current resource is freed first, then the state restored into a new one.
   * @param {Uint8Array} saved
   */
  rollBack(saved) {
    const p = this.live();
    this.p = null;
    release(p);
    this.p = call(() => this.instance.streaming.Packer.restore(saved));
  }

  /** @private The resource, or a KernelRuntimeError once disposed. */
  live() {
    if (!this.p) throw new KernelRuntimeError('kernel runtime failure: this StreamPacker was disposed');
    return this.p;
  }

  /** @private @param {any} c */
  closed(c) {
    const bins = new ClosedBins(c);
    this.lastDropped = bins.dropped;
    return bins;
  }
}

/**
 * A loaded kernel component with the whole API. The module's functions use one loaded at
 * import; `Stowplan.load` loads another (e.g. from bytes you fetched yourself).
 */
export class Stowplan {
  /**
   * Loads the kernel component, checking its sha256 against the pin.
   * @param {{component?: Uint8Array | ArrayBuffer | URL | string}} [opts]
   * @returns {Promise<Stowplan>}
   */
  static async load(opts = {}) {
    const known = options(opts, 'Stowplan.load', ['component']);
    return new Stowplan(await loadKernel(known));
  }

  /** @param {{exports: any, spawn: () => Promise<any>, sha256: string, bytes: number, source: string}} loaded */
  constructor(loaded) {
    /** @private */
    this.k = loaded.exports;
    /** @private A fresh instance of the same checked code (for stream packers). */
    this.spawn = loaded.spawn;
    /** @private */
    this.info = Object.freeze({ sha256: loaded.sha256, bytes: loaded.bytes, source: loaded.source });
  }

  /** The loaded component: its sha256 (checked against the pin), size and where it came from. */
  kernelInfo() {
    return this.info;
  }

  /**
   * Splits `weights` into `k` groups with balanced sums.
   * @param {any} weights @param {number | bigint} k @param {PartitionOptions} [opts]
   * @returns {Partition}
   */
  partition(weights, k, opts) {
    const o = options(opts, 'partition', ['method', 'equalSize', 'refine']);
    const kk = u32(k, 'k', 1, MAX_COUNT);
    const method = given(o.method) ? oneOf(o.method, 'method', ['kk', 'greedy', 'verl']) : 'kk';
    const options_ = {
      method,
      equalSize: given(o.equalSize) ? bool(o.equalSize, 'equalSize') : false,
      refine: given(o.refine) ? bool(o.refine, 'refine') : method !== 'verl',
    };
    const w = u64Array(weights, 'weights');
    return new Partition(call(() => this.k.partition.partition(w, kk, options_)));
  }

  /**
   * Packs `lengths` into bins of `capacity` tokens.
   * @param {any} lengths @param {number | bigint} capacity @param {PackOptions} [opts]
   * @returns {Packing}
   */
  pack(lengths, capacity, opts) {
    const o = options(opts, 'pack', ['align', 'method', 'oversize']);
    const options_ = { capacity: u64(capacity, 'capacity', 1n), ...packOptions(o) };
    const l = u64Array(lengths, 'lengths');
    // Next-fit takes the `pack` interface here, not `pack-compact` as the Rust host does:
    // narrowing and rebuilding the members in JavaScript, a loop per element each, cost more
    // than jco's copies (1M lengths: 7.4 ms against 2.7 ms, BENCHMARKS.md).
    return new Packing(call(() => this.k.pack.pack(l, options_)), l, options_.capacity);
  }

  /**
   * Packs items under several limits at once: `columns` maps each resource's name to the
   * items' sizes in it (tokens first; an object or a Map, in its order), `capacities` the same
   * names to each bin's capacity. Every bin stays within every capacity (and `maxSegments`
   * items); with one resource the bins are `pack`'s.
   * @param {any} columns @param {any} capacities @param {MultiPackOptions} [opts]
   * @returns {MultiPacking}
   */
  packMulti(columns, capacities, opts) {
    const o = options(opts, 'packMulti', ['maxSegments', 'align', 'method', 'oversize']);
    const maxSegments = given(o.maxSegments) ? u64(o.maxSegments, 'maxSegments') : 0n;
    const shared = packOptions(o);
    const { names, capacity, sizes, n } = resourceTable(columns, capacities);
    // The kernel checks the names (none twice, not the segment limit's) and names the
    // resources in its messages.
    const options_ = { capacities: BigUint64Array.from(capacity), names, maxSegments, ...shared };
    const all = rows(sizes, n);
    const m = call(() => this.k.multiPack.pack(all, options_));
    return new MultiPacking(m, sizes[0], names, capacity, maxSegments);
  }

  /**
   * Splits one batch into micro-batches of at most `maxTokenLen` tokens, balancing a cost.
   * @param {any} lengths @param {number | bigint} maxTokenLen @param {MicroBatchOptions} [opts]
   * @returns {MicroBatches}
   */
  microBatches(lengths, maxTokenLen, opts) {
    const o = options(opts, 'microBatches', ['cost', 'minCount', 'divisibleBy', 'count', 'order', 'extraCosts']);
    const m = microOptions(maxTokenLen, costOption(o.cost), o);
    const l = u64Array(lengths, 'lengths');
    if (given(o.extraCosts)) {
      const e = u64Array(o.extraCosts, 'extraCosts');
      return new MicroBatches(call(() => this.k.multimodal.microBatches(l, e, m)));
    }
    return new MicroBatches(call(() => this.k.balance.microBatches(l, m)));
  }

  /**
   * Balances a global batch over `dp` ranks; with `maxTokenLen` also every rank's
   * micro-batches (the same count on every rank).
   * @param {any} lengths @param {number | bigint} dp @param {BalanceOptions} [opts]
   * @returns {Balance}
   */
  balance(lengths, dp, opts) {
    const o = options(opts, 'balance', [
      'cost', 'maxTokenLen', 'groups', 'minibatchSize', 'equalCount', 'minCount', 'divisibleBy', 'count', 'order',
      'extraCosts',
    ]);
    const d = u32(dp, 'dp', 1, MAX_COUNT);
    const cost = costOption(o.cost);
    const micro = given(o.maxTokenLen) ? microOptions(o.maxTokenLen, cost, o) : null;
    if (!micro) {
      for (const key of ['minCount', 'divisibleBy', 'count', 'order']) {
        if (given(o[key])) throw new InvalidArgumentError(`${key} needs maxTokenLen (micro-batches are planned only with a cap)`);
      }
    }
    const l = u64Array(lengths, 'lengths');
    const dpOptions = {
      cost,
      groups: given(o.groups) ? labelIds(o.groups, l.length) : undefined,
      minibatchSize: given(o.minibatchSize) ? u32(o.minibatchSize, 'minibatchSize', 1) : undefined,
      equalCount: given(o.equalCount) ? bool(o.equalCount, 'equalCount') : true,
    };
    // A multimodal sample's extra cost (image patches, vision tokens) is balanced over ranks
    // and micro-batches; caps count tokens only.
    const e = given(o.extraCosts) ? u64Array(o.extraCosts, 'extraCosts') : null;
    if (!micro) {
      const dp = e ? call(() => this.k.multimodal.balanceDp(l, e, d, dpOptions)) : call(() => this.k.balance.balanceDp(l, d, dpOptions));
      return new Balance(dp, null, l);
    }
    const p = e ? call(() => this.k.multimodal.plan(l, e, d, dpOptions, micro)) : call(() => this.k.balance.plan(l, d, dpOptions, micro));
    return new Balance(p.dp, p.ranks.map((r) => new MicroBatches(r)), l);
  }

  /**
   * The multiple every sequence length is padded to for context/tensor parallelism.
   * @param {AlignOptions} [opts]
   * @returns {bigint}
   */
  padFactor(opts) {
    const o = options(opts, 'padFactor', ['cp', 'tp', 'align', 'powerOfTwo']);
    const a = alignOptions(o, 1);
    return call(() => this.k.layout.padFactor(a));
  }

  /**
   * Pads every sequence to the pad factor, packs them in order and splits the row over `cp`
   * ranks (zigzag).
   * @param {any} lengths @param {AlignOptions & {cp: number}} opts
   * @returns {CpLayout}
   */
  cpLayout(lengths, opts) {
    const o = options(opts, 'cpLayout', ['cp', 'tp', 'align', 'powerOfTwo']);
    if (!given(o.cp)) throw new InvalidArgumentError('cpLayout needs cp (in 1..=65536)');
    const a = alignOptions(o, 1);
    const l = u64Array(lengths, 'lengths');
    return new CpLayout(call(() => this.k.layout.cpLayout(l, a)), a.cp);
  }

  /**
   * The raw static pack plan of a dataset's sample lengths (best-fit decreasing; packs of at
   * most `packingLength` aligned tokens).
   * @param {any} lengths @param {RawPlanOptions} opts
   * @returns {RawPlan}
   */
  rawPlan(lengths, opts) {
    const o = options(opts, 'rawPlan', ['packingLength', 'align', 'allowSingleLong']);
    const p = {
      packingLength: u64(o.packingLength, 'packingLength', 1n),
      align: given(o.align) ? u64(o.align, 'align', 1n) : 1n,
      allowSingleLong: given(o.allowSingleLong) ? bool(o.allowSingleLong, 'allowSingleLong') : false,
    };
    const l = u64Array(lengths, 'lengths');
    return new RawPlan(call(() => this.k.plan.rawPlan(l, p)), p);
  }

  /**
   * The plan `worldSize` ranks consume from `raw`: padded by repeating the first packs, or
   * with `dropLast` the remainder left out.
   * @param {RawPlan} raw @param {number} worldSize @param {{dropLast?: boolean}} [opts]
   * @returns {AlignedPlan}
   */
  alignedPlan(raw, worldSize, opts) {
    const o = options(opts, 'alignedPlan', ['dropLast']);
    if (!(raw instanceof RawPlan)) throw new InvalidArgumentError('raw must be a RawPlan (the result of rawPlan)');
    const w = u32(worldSize, 'worldSize', 1);
    const dropLast = given(o.dropLast) ? bool(o.dropLast, 'dropLast') : false;
    const packs = { offsets: raw.offsets, indices: raw.indices };
    return new AlignedPlan(call(() => this.k.plan.alignPlan(packs, w, dropLast)), raw, w, dropLast);
  }

  /**
   * The seeded permutation of `0..n` for (seed, epoch): position k of the shuffled order holds
   * item `permutation[k]` (SplitMix64, Lemire bounded draws, Fisher–Yates; see wit/kernel.wit).
   * @param {number | bigint} n @param {number | bigint} seed @param {number | bigint} [epoch]
   * @returns {Uint32Array}
   */
  permutation(n, seed, epoch = 0) {
    const nn = u64(n, 'n');
    const s = u64(seed, 'seed');
    const e = u64(epoch, 'epoch');
    return call(() => this.k.shuffle.permutation(nn, s, e));
  }

  /**
   * A streaming packer: best fit with at most `maxOpenBins` open bins (1..=65536, default
   * 64) and `maxBuffered` lengths waiting (0..=1048576, default 4096; 0 places each length
   * on arrival); `align` rounds each length up first; `oversize` as in `pack`.
   * The packer runs in a kernel instance of its own, made here (hence async).
   * @param {number | bigint} capacity @param {StreamPackerOptions} [opts]
   * @returns {Promise<StreamPacker>}
   */
  async streamPacker(capacity, opts) {
    const o = options(opts, 'streamPacker', ['maxOpenBins', 'maxBuffered', 'align', 'oversize']);
    const so = {
      capacity: u64(capacity, 'capacity', 1n),
      align: given(o.align) ? u64(o.align, 'align', 1n) : 1n,
      maxOpenBins: given(o.maxOpenBins)
        ? u32(o.maxOpenBins, 'maxOpenBins', 1, STREAM.MAX_OPEN_BINS)
        : STREAM.DEFAULT_MAX_OPEN_BINS,
      maxBuffered: given(o.maxBuffered)
        ? u32(o.maxBuffered, 'maxBuffered', 0, STREAM.MAX_BUFFERED)
        : STREAM.DEFAULT_MAX_BUFFERED,
      oversize: given(o.oversize) ? oneOf(o.oversize, 'oversize', OVERSIZE) : 'error',
    };
    const k = await this.spawn();
    return new StreamPacker(call(() => k.streaming.Packer.create(so)), k);
  }

  /**
   * The packer `state` (the bytes of `StreamPacker#state`, from any host) saved: it
   * continues exactly. Damaged or foreign bytes are refused (InvalidArgumentError).
   * @param {Uint8Array | ArrayBuffer} state
   * @returns {Promise<StreamPacker>}
   */
  async streamPackerFromState(state) {
    let bytes;
    if (state instanceof Uint8Array) bytes = state;
    else if (state instanceof ArrayBuffer) bytes = new Uint8Array(state);
    else throw new InvalidArgumentError('state must be a Uint8Array or ArrayBuffer (the bytes of StreamPacker#state)');
    const k = await this.spawn();
    return new StreamPacker(call(() => k.streaming.Packer.restore(bytes)), k);
  }

  /**
   * Low-level access to the peers' reproductions (verl, ROLL, prime-rl) for compatibility
   * layers; see `stowplan/compat`.
   * @returns {any}
   */
  get kernel() {
    return this.k;
  }
}

/** Checked wrappers shared with `compat.js`. */
export const internal = { call, u32, u64, i64, i64Array, u32Array, u64Array, options, given, bool, lists };

/** The kernel loaded at import (the sha256 is checked before anything runs). */
export const stowplan = await Stowplan.load();

/** The loaded component's sha256, size and source. */
export const kernelInfo = () => stowplan.kernelInfo();
/** See `Stowplan#partition`. */
export const partition = (weights, k, opts) => stowplan.partition(weights, k, opts);
/** See `Stowplan#pack`. */
export const pack = (lengths, capacity, opts) => stowplan.pack(lengths, capacity, opts);
/** See `Stowplan#packMulti`. */
export const packMulti = (columns, capacities, opts) => stowplan.packMulti(columns, capacities, opts);
/** See `Stowplan#microBatches`. */
export const microBatches = (lengths, maxTokenLen, opts) => stowplan.microBatches(lengths, maxTokenLen, opts);
/** See `Stowplan#balance`. */
export const balance = (lengths, dp, opts) => stowplan.balance(lengths, dp, opts);
/** See `Stowplan#padFactor`. */
export const padFactor = (opts) => stowplan.padFactor(opts);
/** See `Stowplan#cpLayout`. */
export const cpLayout = (lengths, opts) => stowplan.cpLayout(lengths, opts);
/** See `Stowplan#rawPlan`. */
export const rawPlan = (lengths, opts) => stowplan.rawPlan(lengths, opts);
/** See `Stowplan#alignedPlan`. */
export const alignedPlan = (raw, worldSize, opts) => stowplan.alignedPlan(raw, worldSize, opts);
/** See `Stowplan#streamPacker`. */
export const streamPacker = (capacity, opts) => stowplan.streamPacker(capacity, opts);
/** See `Stowplan#streamPackerFromState`. */
export const streamPackerFromState = (state) => stowplan.streamPackerFromState(state);
/** See `Stowplan#permutation`. */
export const permutation = (n, seed, epoch) => stowplan.permutation(n, seed, epoch);
export { stringify as toJSONText } from './json.js';

/**
 * This module's namespace, as a promise: what `require('stowplan').load()` resolves to, so
 * that code shared between ES modules and CommonJS can take the API one way.
 * @returns {Promise<typeof import('./index.js')>}
 */
export const load = () => import('./index.js');
