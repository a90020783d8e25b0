'use strict';
// The CommonJS entry of `stowplan/compat` (see index.cjs for why it is a promise):
//
//   const compat = await require('stowplan/compat').load();   // verl, rollLoadBalance, …
let loading = null;

/** @returns {Promise<typeof import('./compat.js')>} */
function load() {
  if (loading === null) {
    loading = import('./compat.js').catch((e) => {
      loading = null;
      throw e;
    });
  }
  return loading;
}

module.exports = { load };
