// The result classes of balance and microBatches: micro-batches and ranks, with their balance
// figures and their JSON text, which the kernel writes (the CLI's `stowplan balance --json`).
import { call } from './errors.js';
import { figuresOf, unbalanceOf } from './figures.js';
import { adopt, lists } from './results.js';

/** Groups with `tokens` and `costs` (micro-batches, ranks): their balance figures. */
class Totals {
  /**
   * @param {any} record the kernel's record of the result, which its JSON writer reads
   * @param {any} k the kernel's exports, which compute the figures
   */
  constructor(record, k) {
    /** @private */
    Object.defineProperty(this, 'k', { value: k });
    /** @private */
    Object.defineProperty(this, 'record', { value: record });
  }

  /** Balance figures of the groups' tokens. @returns {Figures} */
  get tokenBalance() {
    return figuresOf(/** @type {any} */ (this).k, /** @type {any} */ (this).tokens);
  }

  /** Balance figures of the groups' costs. @returns {Figures} */
  get costBalance() {
    return figuresOf(/** @type {any} */ (this).k, /** @type {any} */ (this).costs);
  }
}

/** The kernel's `reports.resource-sizes` of limits (`limitRows`), or of none. */
function resourceSizes(limits) {
  return limits ? { sizes: limits.sizes, resources: limits.caps.length } : { sizes: new BigUint64Array(0), resources: 0 };
}

/** Micro-batches of one batch (the result of `microBatches`, and each rank's in `balance`). */
export class MicroBatches extends Totals {
  /**
   * @param {any} p the kernel's micro-plan @param {any} k the kernel's exports
   * @param {any} [limits] the further limits they keep (their sizes give `resource_loads`)
   */
  constructor(p, k, limits = null) {
    super(p, k);
    /** @private */
    Object.defineProperty(this, 'sizes', { value: resourceSizes(limits) });
    /** Number of micro-batches. */
    this.count = p.batches.offsets.length - 1;
    adopt(this, p, 'batches');
    // Read-only, as in Python: toJSONText reads the kernel's record these fields come from.
    Object.freeze(this);
  }

  /** The micro-batches, as views into `indices`. @returns {Uint32Array[]} */
  get batches() {
    return lists(this.offsets, this.indices);
  }

  /** Number of micro-batches. */
  get length() {
    return this.count;
  }

  /**
   * The plan as JSON text, byte-identical to the `micro_batches` object of
   * `stowplan balance --max-token-len T --json` (dp 1); the kernel writes it.
   * @returns {string}
   */
  toJSONText() {
    const t = /** @type {any} */ (this);
    return call(() => t.k.reports.microBatchesJson(t.record, t.sizes));
  }
}

/** A global batch over `dp` ranks, with every rank's micro-batches when a cap was given. */
export class Balance extends Totals {
  /**
   * @param {any} dpPlan the kernel's DP plan
   * @param {MicroBatches[] | null} ranks every rank's micro-batches, or null
   * @param {BigUint64Array} lengths the global lengths
   * @param {any} k the kernel's exports
   */
  constructor(dpPlan, ranks, lengths, k) {
    super(dpPlan, k);
    /** Every rank's micro-batches (indices are global), or null without `capacity`. */
    this.microBatches = ranks && Object.freeze(ranks);
    /** The micro-batch count of every rank, or null without `capacity`. */
    this.count = ranks ? (ranks[0]?.count ?? 0) : null;
    /** Number of ranks. */
    this.dp = dpPlan.ranks.offsets.length - 1;
    /** The global lengths planned. */
    this.lengths = lengths;
    adopt(this, dpPlan, 'ranks', ['offsets', 'order']);
    // Read-only, as in Python: toJSONText reads the kernel's records these fields come from.
    Object.freeze(this);
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
    return unbalanceOf(/** @type {any} */ (this).k, this.lengths, this.ranks, prefix);
  }

  /**
   * The plan as JSON text, byte-identical to the plan `stowplan balance --dp N [--max-token-len
   * T] --json` prints (its keys before `operation`); the kernel writes it.
   * @returns {string}
   */
  toJSONText() {
    const t = /** @type {any} */ (this);
    if (!this.microBatches) return call(() => t.k.reports.dpJson(t.record, this.lengths));
    const ranks = this.microBatches.map((m) => /** @type {any} */ (m));
    const plan = { dp: t.record, ranks: ranks.map((m) => m.record) };
    return call(() => t.k.reports.twoLevelJson(plan, this.lengths, ranks[0]?.sizes ?? resourceSizes(null)));
  }
}
