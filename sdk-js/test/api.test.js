// The API: inputs (arrays, typed arrays, bigints) give the same results; bad input is refused
// with an InvalidArgumentError naming the argument and its allowed range; the error classes
// mirror Python's tree; the component's sha256 is checked at load.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import * as stowplan from '../src/index.js';
import { balanceBatch, primeRlFfd, rollLoadBalance, verl, verlRearrangeMicroBatches } from '../src/compat.js';
import { PKG, ROOT } from './helpers.js';

const {
  InfeasibleError, InvalidArgumentError, KernelRuntimeError, PeerError, Stowplan, StowplanError,
} = stowplan;
const DOCS = [100, 900, 50, 950, 400, 600];

test('the Python docs examples give the same results here', () => {
  const p = stowplan.partition(DOCS, 2);
  assert.deepStrictEqual(p.groups.map((g) => Array.from(g)), [[0, 2, 3, 4], [1, 5]]);
  assert.deepStrictEqual(Array.from(p.sums), [1500n, 1500n]);
  assert.equal(p.spread, 0n);
  assert.equal(p.length, 2);
  const b = stowplan.pack([5, 3, 7, 2, 6], 10, { method: 'ffd' });
  assert.deepStrictEqual(b.bins.map((x) => Array.from(x)), [[1, 2], [3, 4], [0]]);
  assert.deepStrictEqual(Array.from(b.loads), [10n, 8n, 5n]);
  const mb = stowplan.microBatches(DOCS, 2000, { cost: 'attention', order: 'verl' });
  assert.equal(mb.count, 2);
  assert.deepStrictEqual(mb.batches.map((x) => Array.from(x)), [[1, 5], [0, 2, 3, 4]]);
  assert.equal(mb.tokenBalance.spread, 0n);
  const plain = stowplan.microBatches(DOCS, 2000);
  assert.deepStrictEqual(Array.from(plain.restore), [0, 4, 1, 2, 3, 5]);
  const bal = stowplan.balance(DOCS, 2);
  assert.deepStrictEqual(bal.ranks.map((x) => Array.from(x)), [[1, 2, 5], [0, 3, 4]]);
  assert.equal(bal.tokenBalance.max, 1550n);
  assert.equal(bal.logSeqlenUnbalance()['global_seqlen/balanced_max'], 1550n);
  const two = stowplan.balance([...DOCS, 10, 20], 2, { capacity: 1000, cost: 'attention' });
  assert.equal(two.count, 2);
  assert.deepStrictEqual(two.microBatches.map((r) => r.batches.map((x) => Array.from(x))), [[[1], [5, 6, 7]], [[0, 2, 4], [3]]]);
  assert.deepStrictEqual([stowplan.padFactor({ cp: 2, tp: 2 }), stowplan.padFactor({ cp: 3, align: 'roll' }), stowplan.padFactor({ tp: 3 })], [8n, 48n, 3n]);
  const lay = stowplan.cpLayout([2, 4, 6, 1], { cp: 2 });
  assert.equal(lay.factor, 4n);
  assert.deepStrictEqual(Array.from(lay.cuSeqlensPadded), [0n, 4n, 8n, 16n, 20n]);
  assert.deepStrictEqual(Array.from(lay.gather[0]), [0, 3, 4, 7, 8, 9, 14, 15, 16, 19]);
  const row = Array.from({ length: 20 }, (_, i) => i);
  assert.deepStrictEqual(lay.unpack(lay.split(row)), row);
  const typedRow = Float32Array.from(row);
  const parts = lay.split(typedRow);
  assert.ok(parts[1] instanceof Float32Array);
  assert.deepStrictEqual(lay.unpack(parts), typedRow);
  assert.deepStrictEqual(stowplan.COSTS.attention, [24576n, 1n]);
});

test('arrays, typed arrays and bigints give identical results; results are typed arrays', () => {
  const forms = [
    DOCS,
    DOCS.map(BigInt),
    Uint16Array.from(DOCS),
    Uint32Array.from(DOCS),
    Int32Array.from(DOCS),
    BigUint64Array.from(DOCS, BigInt),
    BigInt64Array.from(DOCS, BigInt),
    new Set(DOCS),
  ];
  const want = stowplan.balance(DOCS, 2, { capacity: 1000 }).toJSONText();
  for (const f of forms) assert.equal(stowplan.balance(f, 2, { capacity: 1000 }).toJSONText(), want, f.constructor.name);
  const p = stowplan.partition(Uint8Array.from([3, 1, 2, 2]), 2n);
  assert.ok(p.offsets instanceof Uint32Array && p.indices instanceof Uint32Array && p.sums instanceof BigUint64Array);
  // Exact above 2**53: bigints go through unchanged.
  const big = 2n ** 60n + 1n;
  const q = stowplan.partition([big, 1n, 2n], 2);
  assert.deepStrictEqual(Array.from(q.sums), [big, 3n]);
  assert.equal(q.total, big + 3n);
  // A BigUint64Array argument is used as is: the result does not alias the input.
  const l = BigUint64Array.from([5n, 5n]);
  stowplan.pack(l, 10);
  assert.deepStrictEqual(Array.from(l), [5n, 5n]);
});

test('bad input is refused naming the argument and the allowed range', () => {
  const cases = [
    [() => stowplan.partition(DOCS, 0), /^k must be in 1\.\.=1048576 \(got 0\)$/],
    [() => stowplan.partition(DOCS, 1.5), /^k must be an integer in 1\.\.=1048576 \(got 1\.5\)$/],
    [() => stowplan.partition(DOCS, '2'), /^k must be an integer in 1\.\.=1048576 \(got "2"\)$/],
    [() => stowplan.partition([1, -2], 1), /^weights\[1\] must be in 0\.\.=2\*\*64-1 \(got -2\)$/],
    [() => stowplan.partition([1, 2 ** 60], 1), /^weights\[1\] must be in 0\.\.=2\*\*64-1 \(got 1152921504606847000\); numbers above 2\*\*53-1 are not exact: pass a bigint$/],
    [() => stowplan.partition([1, 2n ** 64n], 1), /^weights\[1\] must be in 0\.\.=2\*\*64-1 \(got 18446744073709551616n\)$/],
    [() => stowplan.partition([1, true], 1), /^weights\[1\] must be an integer in 0\.\.=2\*\*64-1 \(got true\)$/],
    [() => stowplan.partition([1, NaN], 1), /^weights\[1\] must be an integer in 0\.\.=2\*\*64-1 \(got NaN\)$/],
    [() => stowplan.partition(Float64Array.from([1, 2]), 1), /^weights must hold integers, not floats \(Float64Array\)/],
    [() => stowplan.partition('12', 1), /^weights must be an array or an integer typed array \(got "12"\)$/],
    [() => stowplan.partition(Int32Array.from([3, -1]), 1), /^weights\[1\] must be in 0\.\.=2\*\*64-1 \(got -1\)$/],
    [() => stowplan.partition(DOCS, 2, { method: 'best' }), /^method must be one of 'kk', 'greedy', 'verl' \(got "best"\)$/],
    [() => stowplan.partition(DOCS, 2, { refines: true }), /^unknown option 'refines' of partition; known: method, equalSize, refine$/],
    [() => stowplan.partition(DOCS, 2, { equalSize: 1 }), /^equalSize must be true or false \(got 1\)$/],
    [() => stowplan.pack(DOCS, 0), /^capacity must be in 1\.\.=2\*\*64-1 \(got 0\)$/],
    [() => stowplan.pack(DOCS, 1000, { align: 0 }), /^invalid argument: align must be at least 1 \(got 0\)$/],
    [() => stowplan.pack(DOCS, 1000, { oversize: 'skip' }), /^oversize must be one of 'error', 'single', 'drop' \(got "skip"\)$/],
    [() => stowplan.microBatches(DOCS, 0), /^capacity must be in 1\.\.=2\*\*64-1 \(got 0\)$/],
    [() => stowplan.microBatches(DOCS, 2000, { cost: 'flops' }), /^cost must be 'tokens' or 'attention' or a \[linear, quadratic\] pair of integers \(got "flops"\)$/],
    [() => stowplan.microBatches(DOCS, 2000, { cost: [1, -1] }), /^cost quadratic coefficient must be in 0\.\.=2\*\*64-1 \(got -1\)$/],
    [() => stowplan.microBatches(DOCS, 2000, { divisibleBy: 0 }), /^divisibleBy must be in 1\.\.=1048576 \(got 0\)$/],
    [() => stowplan.microBatches(DOCS, 2000, { count: 2 ** 21 }), /^count must be in 1\.\.=1048576 \(got 2097152\)$/],
    [() => stowplan.balance(DOCS, 0), /^dp must be in 1\.\.=1048576 \(got 0\)$/],
    [() => stowplan.balance(DOCS, 2, { order: 'verl' }), /^order needs capacity/],
    [() => stowplan.balance(DOCS, 2, { groups: [1, 2] }), /^groups must hold one label per sample \(6; got 2\)$/],
    [() => stowplan.padFactor({ cp: 0 }), /^cp must be in 1\.\.=65536 \(got 0\)$/],
    [() => stowplan.padFactor({ tp: 65537 }), /^tp must be in 1\.\.=65536 \(got 65537\)$/],
    [() => stowplan.padFactor({ align: 'megatron' }), /^align must be 'cp_tp', 'roll' or a positive integer \(got "megatron"\)$/],
    [() => stowplan.cpLayout([1, 2], {}), /^cpLayout needs cp \(in 1\.\.=65536\)$/],
    [() => stowplan.rawPlan([1, 2], {}), /^capacity must be an integer in 1\.\.=2\*\*64-1 \(got undefined\)$/],
    [() => stowplan.alignedPlan(stowplan.rawPlan([1, 2], { capacity: 4 }), 0), /^worldSize must be in 1\.\.=2\*\*32-1 \(got 0\)$/],
    [() => stowplan.alignedPlan({}, 1), /^raw must be a RawPlan/],
    [() => stowplan.permutation(2n ** 64n, 1), /^n must be in 0\.\.=2\*\*64-1 \(got 18446744073709551616n\)$/],
  ];
  for (const [f, message] of cases) {
    assert.throws(f, (e) => e instanceof InvalidArgumentError && e.kind === 'invalid-argument' && message.test(e.message), String(message));
  }
});

test('a list longer than a kernel call can take is refused before anything is read or allocated, everywhere', async () => {
  let reads = 0;
  /** An array Proxy reporting `length`, counting the entries read. */
  const reporting = (length) =>
    new Proxy([], {
      get(target, key) {
        if (key === 'length') return length;
        if (typeof key === 'string' && /^\d+$/.test(key)) {
          reads++;
          return 1;
        }
        return Reflect.get(target, key);
      },
    });
  const packer = await stowplan.streamPacker(10);
  const state = packer.state();
  // [argument (a pattern), bytes per entry, call]: every public function taking a list of lengths, sizes or costs.
  const entryPoints = [
    ['lengths', 8, (l) => stowplan.pack(l, 10)],
    ["columns\\['tokens'\\]", 8, (l) => stowplan.packMulti({ tokens: l }, { tokens: 10 })],
    ["columns\\['images'\\]", 8, (l) => stowplan.packMulti(new Map([['tokens', [1]], ['images', l]]), { tokens: 10, images: 1 })],
    ['weights', 8, (l) => stowplan.partition(l, 2)],
    ['lengths', 8, (l) => stowplan.microBatches(l, 10)],
    ['extraCosts', 8, (l) => stowplan.microBatches([1, 2], 10, { extraCosts: l })],
    ['lengths', 8, (l) => stowplan.balance(l, 2)],
    ['extraCosts', 8, (l) => stowplan.balance([1, 2], 1, { extraCosts: l })],
    ['lengths', 8, (l) => stowplan.cpLayout(l, { cp: 2 })],
    ['lengths', 8, (l) => stowplan.rawPlan(l, { capacity: 10 })],
    ['lengths', 8, (l) => packer.add(l)],
    ['seqlens', 8, (l) => verl('karmarkar_karp', l, 2, false)],
    ['seqlens', 8, (l) => verlRearrangeMicroBatches(l, 10)],
    ['seqlens', 8, (l) => balanceBatch(l, 2)],
    ['lengths', 8, (l) => rollLoadBalance(l, 1, 10)],
    ['lengths', 8, (l) => primeRlFfd(l, [0], [0], 10)],
    ['runs', 4, (l) => primeRlFfd([1], l, [0], 10)],
  ];
  for (const [name, bytes, f] of entryPoints) {
    const max = 2 ** 31 / bytes;
    for (const [what, list, got] of [
      ['new Array(2**32-1)', new Array(2 ** 32 - 1), '4294967295'],
      ['a Proxy of length 2**32-1', reporting(2 ** 32 - 1), '4294967295'],
      ['a Proxy one entry over the limit', reporting(max + 1), String(max + 1)],
      ['a Proxy of length NaN', reporting(NaN), 'NaN'],
    ]) {
      const message = new RegExp(`^${name} must hold at most ${max} entries \\(2\\*\\*${Math.log2(max)}; got ${got}\\): .*2 GiB`);
      assert.throws(() => f(list), (e) => e instanceof InvalidArgumentError && message.test(e.message), `${name} as ${what}: ${f}`);
    }
  }
  assert.equal(reads, 0, 'no entry was read');
  assert.deepStrictEqual(packer.state(), state, 'the packer is untouched');
  // A typed array is checked the same way (a Uint8Array of 2**28 + 1 lengths is 256 MiB here,
  // 2 GiB and more as the kernel's u64 list).
  const refused = (re) => (e) => e instanceof InvalidArgumentError && re.test(e.message);
  assert.throws(() => stowplan.pack(new Uint8Array(2 ** 28 + 1), 10), refused(/^lengths must hold at most 268435456 entries \(2\*\*28; got 268435457\)/));
  // groups (labels) must match the lengths: compared before they are read.
  assert.throws(() => stowplan.balance([1, 2], 1, { groups: reporting(2 ** 32 - 1) }), refused(/^groups must hold one label per sample \(2; got 4294967295\)$/));
  assert.throws(() => stowplan.balance([1, 2], 1, { groups: new Set([1, 2, 3]) }), refused(/^groups must hold one label per sample \(2; got more than 2\)$/));
  assert.equal(reads, 0);
});

test("the kernel's own refusals: InvalidArgumentError and InfeasibleError with the host's messages", () => {
  assert.throws(() => stowplan.partition([1, 2], 3), { name: 'InvalidArgumentError', message: 'invalid argument: k must be at most the number of weights n = 2 (got k = 3)' });
  assert.throws(() => stowplan.partition([], 1), InvalidArgumentError);
  assert.throws(() => stowplan.pack([1, 20], 10), (e) => e instanceof InfeasibleError && /^infeasible: lengths\[1\] = 20/.test(e.message));
  assert.throws(() => stowplan.microBatches([3000], 2000), InfeasibleError);
  assert.throws(() => stowplan.partition([1, 2, 3], 2, { method: 'verl', refine: true }), InvalidArgumentError);
});

test("the error classes mirror Python's tree", () => {
  for (const E of [InvalidArgumentError, InfeasibleError, KernelRuntimeError]) {
    const e = new E('x');
    assert.ok(e instanceof StowplanError && e instanceof Error);
    assert.equal(e.name, E.name);
  }
  const p = new PeerError('AssertionError', 'boom');
  assert.ok(p instanceof StowplanError);
  assert.equal(p.type, 'AssertionError');
});

test("the component's sha256 is checked at load: a changed byte is refused, the committed one accepted", async () => {
  const committed = readFileSync(join(ROOT, 'host/assets/stowplan_kernel.wasm'));
  const pin = readFileSync(join(ROOT, 'host/assets/stowplan_kernel.wasm.sha256'), 'utf8').trim().split(/\s+/)[0];
  assert.equal(stowplan.kernelInfo().sha256, pin, 'the loaded kernel is the committed one');
  const k = await Stowplan.load({ component: new Uint8Array(committed) });
  assert.deepStrictEqual(Array.from(k.partition(DOCS, 2).sums), [1500n, 1500n]);
  const damaged = new Uint8Array(committed);
  damaged[damaged.length - 1] ^= 1;
  await assert.rejects(Stowplan.load({ component: damaged }), (e) => e instanceof KernelRuntimeError && e.message.includes(`not the pinned ${pin}`));
  await assert.rejects(Stowplan.load({ component: join(PKG, 'missing.wasm') }), KernelRuntimeError);
  await assert.rejects(Stowplan.load({ components: committed }), InvalidArgumentError);
});

test("the kernel's errors name arguments as this package spells them (camelCase)", () => {
  // The kernel names arguments as the Rust and Python APIs do (capacity, min_count).
  assert.throws(() => stowplan.microBatches([5, 6], 4), {
    name: 'InfeasibleError',
    message: 'infeasible: sequence 0 has 5 tokens, more than capacity = 4; sequences are never split',
  });
  assert.throws(() => stowplan.microBatches([5, 6], 10, { minCount: 5 }), {
    name: 'InvalidArgumentError',
    message: /^invalid argument: minCount = 5 exceeds the number of sequences n = 2/,
  });
});

test('index.d.ts declares every field of every result (result classes take the kernel records whole)', async () => {
  // The type checker's view of each class's instances: its own members, its base classes'
  // and the kernel records (generated/types, from the WIT) its interface extends.
  const ts = (await import('typescript')).default;
  const path = join(PKG, 'src/index.d.ts');
  const options = { strict: true, noEmit: true, module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext, types: [] };
  const program = ts.createProgram([path], options);
  const errors = ts.getPreEmitDiagnostics(program).map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
  assert.deepStrictEqual(errors, [], 'index.d.ts type-checks');
  const checker = program.getTypeChecker();
  const module = checker.getSymbolAtLocation(program.getSourceFile(path));
  /** @type {Map<string, Set<string>>} */
  const declared = new Map();
  for (const symbol of checker.getExportsOfModule(module)) {
    if (!(symbol.flags & ts.SymbolFlags.Class)) continue;
    const instance = checker.getDeclaredTypeOfSymbol(symbol);
    declared.set(symbol.name, new Set(checker.getPropertiesOfType(instance).map((p) => p.name)));
  }
  const raw = stowplan.rawPlan([5, 3, 7, 2, 6], { capacity: 10 });
  const results = {
    Partition: stowplan.partition(DOCS, 2),
    Packing: stowplan.pack([5, 3, 7, 2, 6], 10),
    MultiPacking: stowplan.packMulti({ tokens: [5, 3, 7], images: [1, 0, 2] }, { tokens: 10, images: 2 }),
    MicroBatches: stowplan.microBatches(DOCS, 2000),
    Balance: stowplan.balance(DOCS, 2, { capacity: 2000 }),
    CpLayout: stowplan.cpLayout([5, 3, 7], { cp: 2 }),
    RawPlan: raw,
    AlignedPlan: stowplan.alignedPlan(raw, 2),
  };
  for (const [name, result] of Object.entries(results)) {
    assert.equal(result.constructor.name, name);
    const fields = declared.get(name);
    assert.ok(fields, `index.d.ts declares no class ${name}`);
    const missing = Object.keys(result).filter((f) => !f.startsWith('_') && !fields.has(f));
    assert.deepStrictEqual(missing, [], `${name}'s fields that index.d.ts does not declare`);
  }
});

test('a kernel field that collides with a member of its result class is refused, not shadowed', async () => {
  const { adopt, Packing } = await import('../src/results.js');
  const p = stowplan.pack([5, 3, 7], 10);
  const record = { bins: { offsets: p.offsets, indices: p.indices }, efficiency: 2 };
  assert.throws(() => adopt(Object.create(Packing.prototype), { length: 1 }), /field length collides with Packing\.length/);
  const own = Object.create(Packing.prototype);
  own.efficiency = 0.5;
  assert.throws(() => adopt(own, record, 'bins'), /field efficiency collides/);
});

test('a former option name works for one release, warns naming the new one, and not beside it', async () => {
  const warnings = [];
  const keep = (w) => warnings.push(w);
  process.on('warning', keep);
  try {
    const want = stowplan.balance(DOCS, 2, { capacity: 1000 }).toJSONText();
    assert.equal(stowplan.balance(DOCS, 2, { maxTokenLen: 1000 }).toJSONText(), want);
    const raw = stowplan.rawPlan([5, 3, 7, 2, 6], { capacity: 10 });
    assert.deepStrictEqual(stowplan.rawPlan([5, 3, 7, 2, 6], { packingLength: 10 }).packs, raw.packs);
    assert.throws(() => stowplan.balance(DOCS, 2, { capacity: 1000, maxTokenLen: 1000 }), {
      name: 'InvalidArgumentError',
      message: 'balance: give capacity only (maxTokenLen is its former name, deprecated)',
    });
    // An unknown option stays unknown, whatever its name once meant elsewhere.
    assert.throws(() => stowplan.microBatches(DOCS, 1000, { maxTokenLen: 1000 }), /unknown option 'maxTokenLen' of microBatches/);
    await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
  } finally {
    process.off('warning', keep);
  }
  const names = warnings.map((w) => `${w.name}: ${w.message}`);
  assert.ok(names.includes('DeprecationWarning: balance: maxTokenLen is deprecated and will be removed in the next release; use capacity'), names.join('\n'));
  assert.ok(names.some((n) => n.startsWith('DeprecationWarning: rawPlan: packingLength is deprecated')), names.join('\n'));
});

test("pack's and partition's options are the fields of the kernel's WIT records", () => {
  // The WIT record's fields, camelCase, from wit/kernel.wit itself.
  const wit = readFileSync(join(ROOT, 'wit/kernel.wit'), 'utf8').replace(/\/\/.*$/gm, '');
  const fields = (iface) => {
    const body = wit.match(new RegExp(`\\binterface ${iface} \\{([\\s\\S]*?)\\n\\}`))[1];
    const record = body.match(/\brecord options \{([^}]*)\}/)[1];
    return [...record.matchAll(/([\w-]+):/g)].map((m) => m[1].replace(/-([a-z0-9])/g, (_, c) => c.toUpperCase()));
  };
  const unknown = (f) => {
    try {
      f();
    } catch (e) {
      return e.message.match(/known: (.*)$/)[1].split(', ');
    }
    assert.fail('an unknown option was taken');
  };
  assert.deepStrictEqual(unknown(() => stowplan.pack([1], 4, { alignn: 2 })), fields('pack').filter((f) => f !== 'capacity'));
  assert.deepStrictEqual(unknown(() => stowplan.partition([1, 2], 2, { methd: 'kk' })), fields('partition'));
  // Every one takes null as its default; verl is not refined unless asked.
  assert.deepStrictEqual(stowplan.pack(DOCS, 1000, { align: null, method: null, oversize: null }).bins, stowplan.pack(DOCS, 1000).bins);
  assert.deepStrictEqual(stowplan.partition(DOCS, 2, { method: 'verl' }).groups, stowplan.partition(DOCS, 2, { method: 'verl', refine: false }).groups);
  assert.throws(() => stowplan.partition(DOCS, 2, { method: 'verl', refine: true }), InvalidArgumentError);
});
