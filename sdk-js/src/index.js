// stowplan for JavaScript: the kernel component (host/assets/stowplan_kernel.wasm), transpiled
// by jco, in Node and in browsers. The algorithms run in the component; this module checks
// and converts inputs and wraps results, following the Python SDK where it maps.
//
// Integers are exact: u64 values come back as bigints (scalars) and BigUint64Arrays (lists),
// u32 values as numbers and Uint32Arrays. Inputs take numbers (safe integers) or bigints,
// arrays or integer typed arrays. Options are the Python SDK's keyword options in camelCase;
// an omitted option takes the host's default.
//
// The package is split by job: errors.js (the error tree, kernel failures → errors),
// convert.js (integers and lists), options.js (options → the kernel's, with the kernel's
// names, presets, limits and defaults from the build manifest), results.js and balance.js (the
// result classes), figures.js (the kernel's balance figures in the SDK's shapes), stream.js (the streaming packer),
// stowplan.js (the API on one loaded kernel), kernel.js (loading it). This module re-exports
// the public API and loads the kernel once.
import {
  InfeasibleError,
  InvalidArgumentError,
  KernelRuntimeError,
  PeerError,
  StowplanError,
  call,
} from './errors.js';
import { bool, given, i64, i64Array, options, u32, u32Array, u64, u64Array } from './convert.js';
import { lists } from './results.js';
import { Stowplan } from './stowplan.js';

export { InfeasibleError, InvalidArgumentError, KernelRuntimeError, PeerError, StowplanError };
export { COSTS } from './options.js';
export { AlignedPlan, CpLayout, MultiPacking, Packing, Partition, RawPlan } from './results.js';
export { Balance, MicroBatches } from './balance.js';
export { ClosedBins, StreamPacker } from './stream.js';
export { Stowplan };

/** Checked wrappers shared with `compat.js`. */
export const internal = { call, u32, u64, i64, i64Array, u32Array, u64Array, options, given, bool, lists };

/** The kernel loaded at import (the sha256 is checked before anything runs). */
export const stowplan = await Stowplan.load();

/** The loaded component's sha256, size and source. */
export const kernelInfo = () => stowplan.kernelInfo();
/** See `Stowplan#figures`. */
export const figures = (values) => stowplan.figures(values);
/** See `Stowplan#logSeqlenUnbalance`. */
export const logSeqlenUnbalance = (lengths, ranks, prefix) => stowplan.logSeqlenUnbalance(lengths, ranks, prefix);
/** See `Stowplan#partition`. */
export const partition = (weights, k, opts) => stowplan.partition(weights, k, opts);
/** See `Stowplan#pack`. */
export const pack = (lengths, capacity, opts) => stowplan.pack(lengths, capacity, opts);
/** See `Stowplan#packMulti`. */
export const packMulti = (columns, capacities, opts) => stowplan.packMulti(columns, capacities, opts);
/** See `Stowplan#microBatches`. */
export const microBatches = (lengths, capacity, opts) => stowplan.microBatches(lengths, capacity, opts);
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
