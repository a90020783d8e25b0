// The API on one loaded kernel component: a method per entry point, each checking its
// arguments (options.js), calling the kernel's interface and wrapping the result.
import { InvalidArgumentError, call } from './errors.js';
import { bool, given, oneOf, options, u32, u64, u64Array } from './convert.js';
import { loadKernel } from './kernel.js';
import { NAMES } from '../generated/manifest.js';
import {
  CP_NEEDED,
  DEFAULTS,
  MAX_COUNT,
  alignOptions,
  costOption,
  dpOptions,
  kernelOptions,
  limitRows,
  maxSegmentsOption,
  microLimits,
  microOptions,
  optionKeys,
  packMultiOptions,
  partitionOptions,
  planOptions,
  resourceTable,
  rows,
  streamLimits,
  streamOptions,
} from './options.js';
import { AlignedPlan, CpLayout, MultiPacking, Packing, Partition, RawPlan } from './results.js';
import { Balance, MicroBatches } from './balance.js';
import { StreamPacker } from './stream.js';
import { figuresOf, unbalanceOf } from './figures.js';

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
   * Balance figures of per-group totals (the kernel's): `max`, `min`, `spread` (bigints),
   * `mean` and `maxOverMean` (numbers; 1 for a perfect balance).
   * @param {any} values
   * @returns {Figures}
   */
  figures(values) {
    return figuresOf(this.k, values);
  }

  /**
   * verl's `log_seqlen_unbalance` figures of `ranks` (index lists) of `lengths` (the
   * kernel's reproduction); a PeerError where verl's would fail.
   * @param {BigUint64Array | BigInt64Array} lengths @param {ArrayLike<number>[]} ranks
   * @param {string} [prefix]
   * @returns {Record<string, bigint | number>}
   */
  logSeqlenUnbalance(lengths, ranks, prefix = 'global_seqlen') {
    return unbalanceOf(this.k, lengths, ranks, prefix);
  }

  /**
   * Splits `weights` into `k` groups with balanced sums.
   * @param {any} weights @param {number | bigint} k @param {PartitionOptions} [opts]
   * @returns {Partition}
   */
  partition(weights, k, opts) {
    const o = options(opts, 'partition', optionKeys('PartitionOptions'));
    const kk = u32(k, 'k', 1, MAX_COUNT);
    const options_ = partitionOptions(o);
    const w = u64Array(weights, 'weights');
    return new Partition(call(() => this.k.partition.partition(w, kk, options_)));
  }

  /**
   * Packs `lengths` into bins of `capacity` tokens.
   * @param {any} lengths @param {number | bigint} capacity @param {PackOptions} [opts]
   * @returns {Packing}
   */
  pack(lengths, capacity, opts) {
    const o = options(opts, 'pack', optionKeys('PackOptions'));
    const options_ = { ...kernelOptions(o, 'PackOptions'), capacity: u64(capacity, 'capacity', 1n) };
    const l = u64Array(lengths, 'lengths');
    // Next-fit takes `pack.pack` here, not `pack.next-fit` as the Rust host does:
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
    const maxSegments = maxSegmentsOption(o);
    const shared = packMultiOptions(o);
    const { names, capacity, sizes, n } = resourceTable(columns, capacities);
    // The kernel checks the names (none twice, not the segment limit's) and names the
    // resources in its messages.
    const options_ = { capacities: BigUint64Array.from(capacity), names, maxSegments, ...shared };
    const all = rows(sizes, n);
    const m = call(() => this.k.pack.packMulti(all, options_), names);
    return new MultiPacking(m, sizes[0], names, capacity, maxSegments);
  }

  /**
   * Splits one batch into micro-batches of at most `capacity` tokens, balancing a cost.
   * @param {any} lengths @param {number | bigint} capacity @param {MicroBatchOptions} [opts]
   * @returns {MicroBatches}
   */
  microBatches(lengths, capacity, opts) {
    const o = options(opts, 'microBatches', ['cost', 'minCount', 'divisibleBy', 'count', 'order', 'extraCosts', 'resources', 'limits']);
    const m = microOptions(capacity, costOption(o.cost, DEFAULTS.MicroOptions.cost), o);
    const l = u64Array(lengths, 'lengths');
    const lim = microLimits(o, l.length);
    const e = given(o.extraCosts) ? u64Array(o.extraCosts, 'extraCosts') : undefined;
    const p = call(() => this.k.balance.microBatches(l, e, lim, m), lim?.names);
    return new MicroBatches(p.plan, this.k, lim ?? null);
  }

  /**
   * Balances a global batch over `dp` ranks; with `capacity` also every rank's
   * micro-batches (the same count on every rank).
   * @param {any} lengths @param {number | bigint} dp @param {BalanceOptions} [opts]
   * @returns {Balance}
   */
  balance(lengths, dp, opts) {
    const o = options(opts, 'balance', [
      'cost', 'capacity', 'groups', 'minibatchSize', 'equalCount', 'minCount', 'divisibleBy', 'count', 'order',
      'extraCosts', 'resources', 'limits',
    ]);
    const d = u32(dp, 'dp', 1, MAX_COUNT);
    const cost = costOption(o.cost, DEFAULTS.DpOptions.cost);
    const micro = given(o.capacity) ? microOptions(o.capacity, cost, o) : null;
    if (!micro) {
      for (const key of ['minCount', 'divisibleBy', 'count', 'order', 'resources', 'limits']) {
        if (given(o[key])) throw new InvalidArgumentError(`${key} needs capacity (micro-batches are planned only with a cap)`);
      }
    }
    const l = u64Array(lengths, 'lengths');
    // A multimodal sample's extra cost (image patches, vision tokens) is balanced over ranks
    // and micro-batches; caps count tokens only (the kernel decides what the options change).
    const dpOpts = dpOptions(cost, o, l.length);
    if (!micro) return new Balance(call(() => this.k.balance.balanceDp(l, d, dpOpts)), null, l, this.k);
    const lim = microLimits(o, l.length);
    const p = call(() => this.k.balance.plan(l, d, dpOpts, micro, lim), lim?.names);
    return new Balance(p.dp, p.ranks.map((r) => new MicroBatches(r, this.k, lim ?? null)), l, this.k);
  }

  /**
   * The multiple every sequence length is padded to for context/tensor parallelism.
   * @param {AlignOptions} [opts]
   * @returns {bigint}
   */
  padFactor(opts) {
    const o = options(opts, 'padFactor', ['cp', 'tp', 'align', 'powerOfTwo']);
    const a = alignOptions(o);
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
    if (!given(o.cp)) throw new InvalidArgumentError(CP_NEEDED);
    const a = alignOptions(o);
    const l = u64Array(lengths, 'lengths');
    return new CpLayout(call(() => this.k.layout.cpLayout(l, a)), a.cp);
  }

  /**
   * The raw static pack plan of a dataset's sample lengths (best-fit decreasing; packs of at
   * most `capacity` aligned tokens). Further limits per pack: `resources` maps each name
   * to the samples' sizes in it and `limits` each name to its cap (as `microBatches`),
   * `maxSegments` caps the samples per pack; a sample over a limit is long, and the samples
   * are packed by `method` (`balanced` by default; with limits only).
   * @param {any} lengths @param {RawPlanOptions} opts
   * @returns {RawPlan}
   */
  rawPlan(lengths, opts) {
    const o = options(opts, 'rawPlan', ['capacity', ...optionKeys('PlanOptions'), 'resources', 'limits', 'maxSegments', 'method']);
    const p = planOptions(o);
    const l = u64Array(lengths, 'lengths');
    const maxSegments = maxSegmentsOption(o);
    if (!given(o.resources) && !given(o.limits) && maxSegments === 0n) {
      if (given(o.method)) {
        throw new InvalidArgumentError('method applies with limits or maxSegments; a plan of tokens only is best-fit decreasing');
      }
      return new RawPlan(call(() => this.k.plan.rawPlan(l, p, undefined)).plan, p);
    }
    if (given(o.resources) !== given(o.limits)) {
      throw new InvalidArgumentError(given(o.limits)
        ? "limits needs resources (the samples' sizes in each)"
        : 'resources needs limits (the cap of each resource)');
    }
    const lim = given(o.limits) ? limitRows(o.resources, o.limits, l.length) : { sizes: new BigUint64Array(0), caps: new BigUint64Array(0), names: [] };
    const method = given(o.method) ? oneOf(o.method, 'method', NAMES.MultiMethod) : NAMES.MultiMethod[0];
    const r = call(() => this.k.plan.rawPlan(l, p, { limits: lim, maxSegments, method }), lim.names);
    return new RawPlan(r.plan, p, { names: lim.names, caps: lim.caps, maxSegments, method, loads: r.loads, lowerBounds: r.lowerBounds });
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
   * Further limits per bin: `limits` maps each resource's name (not `tokens`) to its cap,
   * `maxSegments` caps the items per bin (0: none); `add` then takes the items' `resources`.
   * The packer runs in a kernel instance of its own, made here (hence async).
   * @param {number | bigint} capacity @param {StreamPackerOptions} [opts]
   * @returns {Promise<StreamPacker>}
   */
  async streamPacker(capacity, opts) {
    const o = options(opts, 'streamPacker', ['maxOpenBins', 'maxBuffered', 'align', 'oversize', 'limits', 'maxSegments']);
    const so = streamOptions(capacity, o);
    const lim = streamLimits(o);
    const k = await this.spawn();
    return new StreamPacker(call(() => k.streaming.Packer.create(so, lim ?? undefined), lim?.names), k);
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
