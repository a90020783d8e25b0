'use strict';
// The CommonJS entry of `stowplan` (package.json "exports" → "require"). The package is ES
// modules with a top-level await (the kernel component is read, its sha256 checked and its
// code compiled before the first call), which `require` cannot wait for: Node 20.19+/22.12+
// refuse it with ERR_REQUIRE_ASYNC_MODULE, older ones with ERR_REQUIRE_ESM. So a CommonJS
// program gets the API through a promise instead:
//
//   const { load } = require('stowplan');
//   const stowplan = await load();           // the ES module's namespace: partition, balance, …
//
// `load()` imports the ES module once (the same instance an `import` gets) and resolves to its
// namespace, or rejects with the load's error (e.g. a KernelRuntimeError for a damaged
// component); a rejected load is not cached, so calling it again tries again.
const { entry } = require('./cjs_entry.cjs');

// The ES module's exports but `load` (test/cjs.test.js checks this list against them).
const NAMES = [
  'AlignedPlan', 'Balance', 'COSTS', 'ClosedBins', 'CpLayout', 'InfeasibleError',
  'InvalidArgumentError', 'KernelRuntimeError', 'MicroBatches', 'MultiPacking', 'Packing',
  'Partition', 'PeerError', 'RawPlan', 'Stowplan', 'StowplanError', 'StreamPacker', 'alignedPlan',
  'balance', 'cpLayout', 'figures', 'internal', 'kernelInfo', 'logSeqlenUnbalance', 'microBatches',
  'pack', 'packMulti', 'padFactor', 'partition', 'permutation', 'rawPlan', 'stowplan',
  'streamPacker', 'streamPackerFromState', 'toJSONText',
];

/** @type {{load: () => Promise<typeof import('./index.js')>}} */
module.exports = entry('stowplan', () => import('./index.js'), NAMES);
