'use strict';
// The CommonJS entry of `stowplan/compat` (see index.cjs for why it is a promise):
//
//   const compat = await require('stowplan/compat').load();   // verl, rollLoadBalance, …
const { entry } = require('./cjs_entry.cjs');

// The ES module's exports but `load` (test/cjs.test.js checks this list against them).
const NAMES = [
  'PeerError', 'balanceBatch', 'logSeqlenUnbalance', 'primeRlBalancedPartition', 'primeRlFfd',
  'primeRlKarmarkarKarp', 'primeRlPrepareBatch', 'rollLoadBalance', 'slimeBalancedPartitions',
  'slimeBuildDpSchedule', 'slimeExpandBins', 'slimeFirstFitPack', 'slimeFwdFlops', 'verl',
  'verlRearrangeMicroBatches',
];

/** @type {{load: () => Promise<typeof import('./compat.js')>}} */
module.exports = entry('stowplan/compat', () => import('./compat.js'), NAMES);
