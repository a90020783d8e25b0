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
let loading = null;

/** @returns {Promise<typeof import('./index.js')>} */
function load() {
  if (loading === null) {
    loading = import('./index.js').catch((e) => {
      loading = null;
      throw e;
    });
  }
  return loading;
}

module.exports = { load };
