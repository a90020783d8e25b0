'use strict';
// What the CommonJS entries (index.cjs, compat.cjs) hand to `require`: an object whose only
// member is `load()`, a promise of the ES module's namespace (index.cjs says why). Reading one
// of the ES module's names from it synchronously — `require('stowplan').partition`, or
// `const { partition } = require('stowplan')` — throws a TypeError that says what to call,
// instead of handing back `undefined` for the caller to fail on later; other names (the
// probes of loaders and bundlers: `then`, `__esModule`, `default` …) read as absent.

/**
 * @param {string} specifier the package path, as the caller requires it
 * @param {() => Promise<object>} importer imports the ES module
 * @param {readonly string[]} names the ES module's exports (cjs.test.js checks the list)
 */
function entry(specifier, importer, names) {
  let loading = null;
  function load() {
    if (loading === null) {
      loading = importer().catch((e) => {
        loading = null;
        throw e;
      });
    }
    return loading;
  }
  const exported = new Set(names);
  return new Proxy(
    { load },
    {
      get(target, name, receiver) {
        if (typeof name === 'string' && !(name in target) && exported.has(name)) {
          throw new TypeError(
            `require('${specifier}').${name} is not available synchronously: ${specifier} is an ES module ` +
              `whose kernel loads asynchronously. Call \`const api = await require('${specifier}').load();\` ` +
              `then \`api.${name}(...)\`, or \`import { ${name} } from '${specifier}'\`.`,
          );
        }
        return Reflect.get(target, name, receiver);
      },
    },
  );
}

module.exports = { entry };
