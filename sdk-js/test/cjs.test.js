// The CommonJS entry (package.json "exports" → "require" → src/index.cjs, src/compat.cjs):
// `require('stowplan').load()` resolves to the very namespace `import` gets, and plans.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { test } from 'node:test';

import * as esm from 'stowplan';
import * as esmCompat from 'stowplan/compat';

const require = createRequire(import.meta.url);

test('require("stowplan") hands back load(), a promise of the ES module namespace', async () => {
  const cjs = require('stowplan');
  assert.deepEqual(Object.keys(cjs), ['load']);
  assert.equal(cjs.load(), cjs.load(), 'one load, shared');
  const api = await cjs.load();
  assert.equal(api, esm);
  assert.equal(await esm.load(), esm);
  const p = api.partition([100, 900, 50, 950, 400, 600], 2);
  assert.deepEqual(p.groups.map((g) => Array.from(g)), [[0, 2, 3, 4], [1, 5]]);
});

test('require("stowplan/compat") hands back load() too', async () => {
  const compat = await require('stowplan/compat').load();
  assert.equal(compat, esmCompat);
  assert.equal(compat.verl('karmarkar_karp', [1, 2, 3], 2, false).length, 2);
});

test('a name read from require() synchronously says what to call', () => {
  for (const [specifier, cjs, esmNs] of [
    ['stowplan', require('stowplan'), esm],
    ['stowplan/compat', require('stowplan/compat'), esmCompat],
  ]) {
    // Every export of the ES module but load(), and nothing else, is refused with the way out.
    for (const name of Object.keys(esmNs).filter((n) => n !== 'load')) {
      assert.throws(
        () => cjs[name],
        (e) =>
          e instanceof TypeError &&
          e.message.includes(`require('${specifier}').${name} is not available synchronously`) &&
          e.message.includes(`await require('${specifier}').load()`) &&
          e.message.includes(`import { ${name} } from '${specifier}'`),
        `${specifier}: ${name}`,
      );
    }
    // What loaders and bundlers probe reads as absent, as on a plain object.
    for (const probe of ['then', '__esModule', 'default', 'toJSON', 'noSuchName']) assert.equal(cjs[probe], undefined, probe);
    assert.deepEqual(Object.keys(cjs), ['load']);
  }
  assert.throws(() => {
    const { partition } = require('stowplan');
    return partition;
  }, /await require\('stowplan'\)\.load\(\)/);
});
