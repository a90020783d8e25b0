// The streaming packer: a kernel `streaming.packer` resource in a kernel instance of its own,
// and the bins its calls close.
import { InfeasibleError, InvalidArgumentError, KernelRuntimeError, call } from './errors.js';
import { u64Array } from './convert.js';
import { lists } from './results.js';

/**
 * Lengths per kernel call of `StreamPacker#add`: a longer add is cut into calls of this many
 * (the bins do not depend on the cut), so that a packer's linear memory stays small; the
 * packer's state is saved first and put back if a call is refused.
 */
const STREAM_CHUNK = 1 << 22;

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
