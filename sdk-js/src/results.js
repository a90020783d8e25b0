// The result classes of partition, pack, packMulti, cpLayout, rawPlan and alignedPlan: the
// kernel's flat results (offsets into one index list) wrapped, with views per group.
import { InvalidArgumentError } from './errors.js';
import { u32 } from './convert.js';
import { SEGMENTS } from './options.js';

/**
 * Group `g` of flat groups: `indices[offsets[g] .. offsets[g + 1]]` (a view, no copy; also of
 * a BigUint64Array of stream indices).
 * @param {Uint32Array} offsets @param {Uint32Array} indices
 * @returns {Uint32Array[]}
 */
export function lists(offsets, indices) {
  const out = new Array(Math.max(0, offsets.length - 1));
  for (let g = 0; g < out.length; g++) out[g] = indices.subarray(offsets[g], offsets[g + 1]);
  return out;
}

/**
 * Puts every field of the kernel's record `record` on `result`, named as jco names them
 * (camelCase), with its `groups` field, if it has one (a `types.groups`), flattened into two
 * fields, `offsets` and `indices` unless `names` says otherwise. A result class takes the kernel's fields this
 * way, last in its constructor, so a field the kernel adds reaches JavaScript with no edit
 * here; their types and docs are the WIT's (index.d.ts declares each result as its record, from
 * jco's types of the WIT; test/api.test.js checks that it declares every field).
 * A field whose name the class already uses (a getter, a method, a field of its own) is an
 * error of this SDK, thrown rather than shadowed or overwritten.
 * @param {object} result @param {any} record @param {string | null} [groups]
 * @param {[string, string]} [names]
 */
export function adopt(result, record, groups = null, [offsets, indices] = ['offsets', 'indices']) {
  const r = /** @type {Record<string, any>} */ (result);
  const put = (/** @type {string} */ name, /** @type {any} */ value) => {
    if (name in r) {
      throw new Error(`stowplan: the kernel's field ${name} collides with ${result.constructor.name}.${name} (an SDK bug)`);
    }
    r[name] = value;
  };
  for (const [name, value] of Object.entries(record)) {
    if (name === groups) {
      put(offsets, value.offsets);
      put(indices, value.indices);
    } else {
      put(name, value);
    }
  }
}

/** A partition of the input indices into `k` groups (the result of `partition`). */
export class Partition {
  /** @param {any} p the kernel's partitioning */
  constructor(p) {
    /** Number of groups. */
    this.k = p.groups.offsets.length - 1;
    /** The largest group sum. */
    this.max = p.sums.reduce((/** @type {bigint} */ a, /** @type {bigint} */ b) => (b > a ? b : a), 0n);
    adopt(this, p, 'groups');
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
    /** Alignment padding: `alignedTokens - realTokens`. */
    this.paddingTokens = p.alignedTokens - p.realTokens;
    /** The bin capacity. */
    this.capacity = capacity;
    /** Number of bins. */
    this.numBins = p.bins.offsets.length - 1;
    const regular = this.numBins - p.single.length;
    let singleReal = 0n;
    for (const i of p.single) singleReal += lengths[i];
    /** Real tokens of the regular bins over their capacity (0 without regular bins). */
    this.efficiency =
      regular === 0 || capacity === 0n ? 0 : Number(p.realTokens - singleReal) / (regular * Number(capacity));
    adopt(this, p, 'bins');
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

/** One packed row of sequences split over context-parallel ranks (the result of `cpLayout`). */
export class CpLayout {
  /** @param {any} s the kernel's cp-split @param {number} cp */
  constructor(s, cp) {
    /** The CP size. */
    this.cp = cp;
    /** Tokens of the padded row. */
    this.paddedTokens = s.cuSeqlensPadded.length ? s.cuSeqlensPadded[s.cuSeqlensPadded.length - 1] : 0n;
    this._gather = null;
    adopt(this, s);
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
  /**
   * @param {any} p the kernel's raw plan @param {{capacity: bigint, align: bigint, allowSingleLong: boolean}} o
   * @param {any} [limits] the limits beside the tokens and the kernel's loads and bounds
   */
  constructor(p, o, limits) {
    /** The options the plan was made with. */
    this.options = o;
    /** Number of packs. */
    this.numPacks = p.packs.offsets.length - 1;
    /**
     * With limits: `{names, caps, maxSegments, method, loads, lowerBounds}` — every pack's
     * load in each limit (pack by pack) and the lower bound per resource (tokens, each
     * limit, then segments); `lowerBound` is their largest plus the single-long packs.
     * Otherwise null.
     */
    this.limits = limits ?? null;
    adopt(this, p, 'packs');
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
    /** The raw plan aligned. */
    this.raw = raw;
    /** Ranks the plan is aligned for. */
    this.worldSize = worldSize;
    /** Whether the remainder was dropped instead of padded. */
    this.dropLast = dropLast;
    adopt(this, p);
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
