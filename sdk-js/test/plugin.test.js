// Buffer filters written in JavaScript (plugins/js), built here with componentize-js (as the
// Python plugin is built in its test with componentize-py) and loaded by the Rust host's
// sandbox through the CLI: `stowplan filter check` passes on the example, and the hostile
// fixture shows the deadline, the fuel bound, the memory limit and the deny-all WASI hold for
// a JavaScript plugin too, and that what `select` returns is checked in the component (the
// build's shim) before the host's rules, from the first call on.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { buildPlugin, checkedSelection } from '../scripts/build-plugin.mjs';
import { filter as lengthFilter } from '../../plugins/js/length_filter.js';
import { ROOT, requireCli } from './helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'stowplan-js-plugins-'));
const built = {};

before(async () => {
  for (const name of ['length_filter', 'hostile']) {
    const bytes = await buildPlugin(join(ROOT, 'plugins/js', `${name}.js`));
    const path = join(dir, `${name}.wasm`);
    writeFileSync(path, bytes);
    built[name] = { path, pin: createHash('sha256').update(bytes).digest('hex') };
  }
});

after(() => rmSync(dir, { recursive: true, force: true }));

/** `stowplan filter ARGS`: [exit status, stdout, stderr]. */
function filterCli(...args) {
  const r = spawnSync(requireCli(), ['filter', ...args], { encoding: 'utf8', maxBuffer: 1 << 26 });
  return [r.status, r.stdout, r.stderr];
}

/** A buffer of groups (each a list of [response length, status]) in the WIT's columnar form. */
function buffer(groups) {
  const groupStart = [0];
  const responseLength = [];
  const status = [];
  for (const g of groups) {
    for (const [len, st] of g) {
      responseLength.push(len);
      status.push(st);
    }
    groupStart.push(responseLength.length);
  }
  return { groupStart: Uint32Array.from(groupStart), responseLength: Uint32Array.from(responseLength), status: Uint8Array.from(status) };
}

test('the example plugin passes stowplan filter check with its pin, importing only WASI', () => {
  const { path, pin } = built.length_filter;
  const [hs, hashOut] = filterCli('hash', path);
  assert.equal(hs, 0);
  assert.equal(hashOut.split(/\s+/)[0], pin, 'the CLI and node:crypto agree on the pin');
  const [status, out, err] = filterCli('check', path, '--sha256', pin, '--calls', '20', '--json');
  assert.equal(status, 0, err);
  const report = JSON.parse(out);
  assert.equal(report.world, 'stowplan:filter/buffer-filter@0.1.0');
  assert.equal(report.pinned, true);
  assert.ok(report.imports.every((i) => i.startsWith('wasi:') || i.startsWith('stowplan:filter/types@')), report.imports.join());
  assert.equal(report.selection.length, 64);
  assert.equal(new Set(report.selection).size, 64);
  // A wrong pin is refused before anything runs.
  const [bad, , badErr] = filterCli('check', path, '--sha256', '0'.repeat(64), '--calls', '1');
  assert.equal(bad, 2);
  assert.match(badErr, /hash/i);
});

test("the example plugin's own logic: shortest or longest mean response first, unfinished groups held back", () => {
  const b = buffer([
    [[30, 1], [10, 1]], // mean 20
    [[5, 1], [5, 2]], // mean 5 (one truncated: finished)
    [[1, 0], [1, 1]], // pending sample: held back
    [[50, 1], [70, 1]], // mean 60
    [[20, 3], [20, 1]], // aborted sample: held back
    [[2, 1], [38, 1]], // mean 20: ties go to the older group
  ]);
  const select = (config, wanted = 10) => lengthFilter.select({ wanted, config: JSON.stringify(config) }, b);
  assert.deepStrictEqual(select({}), [1, 0, 5, 3]);
  assert.deepStrictEqual(select({ order: 'longest' }, 2), [3, 0]);
  assert.deepStrictEqual(select({ include_unfinished: true }), [2, 1, 0, 4, 5, 3]);
  assert.deepStrictEqual(select({ max_mean_length: 20 }), [1, 0, 5]);
  assert.throws(() => select({ order: 'sideways' }), (e) => e === 'order must be "shortest" or "longest" (got "sideways")');
  assert.throws(() => select({ limit: 1 }), (e) => e === 'unknown config keys ["limit"]; known: order, include_unfinished, max_mean_length');
});

test("in the sandbox, the plugin's error text reaches the user, typed as the plugin's own", () => {
  const { path, pin } = built.length_filter;
  const [status, , err] = filterCli('check', path, '--sha256', pin, '--calls', '1', '--config', '{"order": "sideways"}');
  assert.equal(status, 2);
  assert.match(err, /filter error: .*order must be "shortest" or "longest" \(got "sideways"\)/);
});

/** Runs the hostile fixture in `mode` with `args`; returns [status, stderr]. */
function hostile(mode, ...args) {
  const { path, pin } = built.hostile;
  const [status, , err] = filterCli('check', path, '--sha256', pin, '--calls', '1', '--config', JSON.stringify({ mode }), ...args);
  return [status, err];
}

test('hostile JavaScript: an endless loop is stopped by the deadline (fuel unbounded)', () => {
  const [status, err] = hostile('loop', '--timeout-ms', '200', '--fuel', '0');
  assert.equal(status, 2);
  assert.match(err, /buffer filter: timeout: .*select ran past timeout = 200ms/);
});

test('hostile JavaScript: an endless loop is stopped by the fuel bound (deadline far away)', () => {
  const [status, err] = hostile('loop', '--timeout-ms', '600000', '--fuel', '100000000');
  assert.equal(status, 2);
  assert.match(err, /buffer filter: out of fuel: .*select used up fuel = 100000000/);
});

test('hostile JavaScript: endless allocation is stopped by the memory limit', () => {
  const [status, err] = hostile('memory', '--memory-mib', '64');
  assert.equal(status, 2);
  assert.match(err, /buffer filter: memory limit: .*memory_limit = 67108864 bytes/);
});

test('hostile JavaScript: the WASI it gets denies everything (clocks at 0, constant randomness)', () => {
  const probes = [hostile('probe'), hostile('probe')].map(([status, err]) => {
    assert.equal(status, 2);
    const m = err.match(/probe: wall_ms=(\S+); monotonic_ms=(\S+); random=(\S+)/);
    assert.ok(m, err);
    return m.slice(1);
  });
  assert.equal(probes[0][0], '0', 'the wall clock reads 0');
  assert.equal(probes[0][1], '0', 'the monotonic clock reads 0');
  assert.deepStrictEqual(probes[1], probes[0], 'randomness is the same in two fresh sandboxes');
});

test('hostile JavaScript: a thrown Error traps, an invalid selection is refused', () => {
  const [ts, terr] = hostile('throw');
  assert.equal(ts, 2);
  assert.match(terr, /buffer filter: trap: .*select trapped/);
  const [os, oerr] = hostile('out-of-range');
  assert.equal(os, 2);
  assert.match(oerr, /buffer filter: invalid result: .*returned index 1000 at position 0/);
});

test('hostile JavaScript: a select returning a string or any non-list is refused as its error on the first call', () => {
  // Without the build's check the glue lowered a string's `length` entries from memory it
  // never wrote ("0" → one leftover u32; "" → a valid empty selection), and a number, null or
  // a non-integer entry trapped. Checked, each is the plugin's err(text) on the first call.
  const refusals = [
    ['0', /select returned a string \("0"\), not a list of buffer positions: return an array of integers in 0\.\.=4294967295/],
    ['', /select returned a string \(""\), not a list of buffer positions/],
    ['abc', /select returned a string \("abc"\), not a list/],
    [7, /select returned 7, not a list/],
    [null, /select returned null, not a list/],
    [{ length: 1 }, /select returned an Object, not a list/],
    [{ tag: 'ok', val: '0' }, /select returned a string \("0"\), not a list/],
    [[0.5], /select returned a list whose entry 0 is 0\.5, not a buffer position \(an integer in 0\.\.=4294967295\)/],
    [[1, -1], /select returned a list whose entry 1 is -1, not a buffer position/],
    [[2 ** 32], /select returned a list whose entry 0 is 4294967296, not a buffer position/],
  ];
  const { path, pin } = built.hostile;
  for (const [value, message] of refusals) {
    const config = JSON.stringify({ mode: 'return', value });
    const [status, , err] = filterCli('check', path, '--sha256', pin, '--calls', '1', '--config', config);
    assert.equal(status, 2, `${config}: ${err}`);
    assert.match(err, /the first call failed: buffer filter: filter error: /, config);
    assert.match(err, message, config);
  }
  // A list of positions still goes through (its rules are the host's).
  const [ok, out, okErr] = filterCli('check', path, '--sha256', pin, '--calls', '3', '--json', '--config', JSON.stringify({ mode: 'return', value: [5, 0, 2] }));
  assert.equal(ok, 0, okErr);
  assert.deepStrictEqual(JSON.parse(out).selection, [5, 0, 2]);
});

test("the build's check of select's value: integer lists pass as a Uint32Array, anything else is a thrown text", () => {
  const same = new Uint32Array([3, 1]);
  assert.equal(checkedSelection(same), same);
  for (const v of [[3, 1], Uint8Array.from([3, 1]), Int32Array.from([3, 1]), [3n, 1n], { tag: 'ok', val: [3, 1] }]) {
    assert.deepStrictEqual(checkedSelection(v), same);
  }
  assert.throws(() => checkedSelection({ tag: 'err', val: 'mine' }), (e) => e === 'mine');
  assert.throws(() => checkedSelection({ tag: 'err', val: 5 }), (e) => e === 'select returned err with 5, not an error text');
  assert.throws(() => checkedSelection(Float64Array.from([1.5])), (e) => typeof e === 'string' && /entry 0 is 1\.5/.test(e));
  assert.throws(() => checkedSelection(new DataView(new ArrayBuffer(4))), (e) => typeof e === 'string' && /returned a DataView/.test(e));
  assert.throws(() => checkedSelection([0, undefined]), (e) => typeof e === 'string' && /entry 1 is undefined/.test(e));
});
