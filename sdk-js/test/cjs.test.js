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
