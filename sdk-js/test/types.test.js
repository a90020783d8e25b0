// The TypeScript types (src/index.d.ts, src/compat.d.ts; the CommonJS entry's src/*.d.cts)
// checked against an ES module consumer (test/consumer.ts) and a CommonJS one
// (test/consumer.cts) with the pinned TypeScript compiler in strict mode.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'node:test';

import { PKG } from './helpers.js';

test('strict TypeScript consumers of the package (ESM and CommonJS) type-check', () => {
  const tsc = join(PKG, 'node_modules/typescript/bin/tsc');
  const r = spawnSync(process.execPath, [tsc, '-p', join(PKG, 'test/tsconfig.json')], { encoding: 'utf8' });
  assert.equal(r.status, 0, `tsc failed:\n${r.stdout}${r.stderr}`);
});
