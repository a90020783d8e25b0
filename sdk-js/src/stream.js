// The streaming packer: a kernel `streaming.packer` resource in a kernel instance of its own,
// and the bins its calls close.
import { InfeasibleError, InvalidArgumentError, KernelRuntimeError, call } from './errors.js';
import { options as checkOptions, u64Array } from './convert.js';
import { streamRows } from './options.js';
import { lists } from './results.js';

/**
 * Lengths per kernel call of `StreamPacker#add`: a longer add is cut into calls of this many
 * (the bins do not depend on the cut), so that a packer's linear memory stays small; the
 * packer's state is saved first and put back if a call is refused.
 */
const STREAM_CHUNK = 1 << 22;

/** The bins one call of a `StreamPacker` closed (stream indices, bigints). */
export class ClosedBins {
  /**
   * @param {any} c the kernel's closed bins (with `resourceLoads`, bins × limits)
   * @param {string[]} names the packer's limits
   */
  constructor(c, names) {
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
    /** Under limits: each limit's name → every bin's load in it (empty without limits). */
    this.resourceLoads = Object.freeze(
      Object.fromEntries(
        names.map((name, q) => [name, BigUint64Array.from({ length: this.numBins }, (_, b) => c.resourceLoads[b * names.length + q])]),
      ),
    );
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
  const resourceLoads = new BigUint64Array(total('resourceLoads'));
  let [bins, at, lo, dr, rl] = [0, 0, 0, 0, 0];
  for (const p of parts) {
    for (let b = 1; b < p.offsets.length; b++) offsets[++bins] = at + p.offsets[b];
    indices.set(p.indices, at);
    loads.set(p.loads, lo);
    dropped.set(p.dropped, dr);
    resourceLoads.set(p.resourceLoads, rl);
    [at, lo, dr, rl] = [at + p.indices.length, lo + p.loads.length, dr + p.dropped.length, rl + p.resourceLoads.length];
  }
  return { offsets, indices, loads, dropped, resourceLoads };
}

/** No loads beside the tokens (a packer without limits). */
const NO_LOADS = new BigUint64Array(0);

/**
 * Closed bins as one record: the kernel's result (`closed` and `resourceLoads`) or
 * `concatClosed`'s (already one record).
 */
function flat(c) {
  return c.closed ? { ...c.closed, resourceLoads: c.resourceLoads } : c;
}

/**
 * A streaming bin packer (`Stowplan#streamPacker`): lengths go in a few at a time, each bin
 * comes out when it closes, and memory stays bounded however long the stream. The kernel's
 * rule is item by item, so how the stream is cut into `add` calls changes nothing; the bins
 * are those of the Rust host, the CLI's `pack --stream` and Python's `StreamPacker`.
 * Made with `limits` (or `maxSegments`), every bin stays within every limit too, and `add`
 * takes each item's sizes in them.
 *
 * Each packer runs in a kernel instance of its own (as in the Rust host): its state lives in
 * that instance's linear memory, and a failure of the instance (a trap) ends that packer
 * only. `dispose()` frees it at once; otherwise the garbage collector does.
 */
export class StreamPacker {
  /**
   * @param {any} handle the kernel's packer resource (`streaming.packer`, plain or limited)
   * @param {any} instance its kernel instance
   */
  constructor(handle, instance) {
    /** @private */
    this.p = handle;
    /** @private */
    this.instance = instance;
    const o = call(() => handle.options());
    /** The options it was made with: capacity, align, maxOpenBins, maxBuffered, oversize. */
    this.options = Object.freeze({ ...o });
    /** @private The limits the kernel reports: none for a plain packer. */
    this.limited = call(() => handle.limits()) ?? null;
    const l = this.limited ?? { caps: NO_LOADS, names: [], maxSegments: 0n };
    /** @private The limits' names, in the kernel's order. */
    this.names = l.names;
    /** Each limit's name → its cap per bin (empty without limits). */
    this.limits = Object.freeze(Object.fromEntries(l.names.map((name, q) => [name, l.caps[q]])));
    /** Items per bin at most (0n: no segment limit). */
    this.maxSegments = l.maxSegments;
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
   * A packer with limits takes `resources`: each limit's name → these items' sizes in it
   * (InfeasibleError under `error` for an item over a limit, naming it and its index).
   * @param {any} lengths @param {{ resources?: any }} [opts]
   * @returns {ClosedBins}
   */
  add(lengths, opts) {
    const o = checkOptions(opts, 'add', ['resources']);
    const l = u64Array(lengths, 'lengths');
    const rows = streamRows(l, o.resources, this.names);
    const width = this.names.length + 1;
    // One kernel call: the kernel checks every item before it applies any.
    if (l.length <= STREAM_CHUNK) return this.closed(call(() => this.live().add(rows), this.names));
    // Several: a later call may be refused after earlier ones were applied (the kernel checks
    // each call's lengths only), so the state before the first is kept to go back to. (No
    // call is refused for its count, which the kernel checks per call: it is at most
    // STREAM_CHUNK, and a packer holds at most 2**29 items, 8 bytes each in 4 GiB of memory.)
    const saved = this.state();
    const parts = [];
    try {
      for (let i = 0; i < l.length; i += STREAM_CHUNK) {
        parts.push(flat(call(() => this.live().add(rows.subarray(i * width, (i + STREAM_CHUNK) * width)), this.names)));
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
    const bins = new ClosedBins(flat(c), this.names);
    this.lastDropped = bins.dropped;
    return bins;
  }
}
