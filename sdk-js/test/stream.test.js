// The streaming packer and extra costs from JavaScript: the same
// bins as the CLI (the Rust WASM host) in the same test, restarts that continue exactly, and
// refusals that name the argument.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { test } from 'node:test';

import * as stowplan from '../src/index.js';
import { requireCli, vlmTable, workload } from './helpers.js';

/** The bins as arrays of numbers. */
const plain = (closed) => closed.bins.map((b) => Array.from(b, Number));

/** A small deterministic generator (xorshift32) for chunk sizes and lengths. */
function rng(seed) {
  let x = seed >>> 0 || 1;
  return (n) => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x % n;
  };
}

test("the Python docs example gives the same bins here", async () => {
  const p = await stowplan.streamPacker(10, { maxOpenBins: 1, maxBuffered: 0 });
  assert.deepStrictEqual([plain(p.add([4, 6, 7])), plain(p.add([2, 5])), plain(p.finish())], [[[0, 1]], [[2, 3]], [[4]]]);
  assert.deepStrictEqual(p.status(), { nextIndex: 5n, buffered: 0, openBins: 0, inOpenBins: 0n, oldestHeld: null });
});

test('the defaults are the kernel\'s (64 open bins, 4,096 buffered, align 1, oversize error)', async () => {
  assert.deepStrictEqual((await stowplan.streamPacker(16384)).options, {
    capacity: 16384n,
    align: 1n,
    maxOpenBins: 64,
    maxBuffered: 4096,
    oversize: 'error',
  });
});

test('bins identical to `stowplan pack --stream --json` whatever the chunks, and a restart continues exactly', async () => {
  const lengths = workload('sft-chat-200k.txt').subarray(0, 60000);
  const text = execFileSync(requireCli(), ['pack', '--stream', '--json', '-c', '16384', '--oversize', 'drop', '-'], {
    input: Array.from(lengths).join('\n') + '\n',
    encoding: 'utf8',
    maxBuffer: 1 << 26,
    stdio: ['pipe', 'pipe', 'ignore'],
  });
  const want = text.trim().split('\n').map((l) => JSON.parse(l));
  const next = rng(7);
  let p = await stowplan.streamPacker(16384, { oversize: 'drop' });
  const got = [];
  let restarted = 0;
  for (let i = 0; i < lengths.length; ) {
    const n = 1 + next(3000);
    got.push(...plain(p.add(lengths.subarray(i, i + n))));
    i += n;
    if (next(4) === 0) {
      // Save, throw the packer away, go on from the bytes.
      p = await stowplan.streamPackerFromState(p.state());
      restarted++;
    }
  }
  got.push(...plain(p.finish()));
  assert.ok(restarted > 3);
  assert.equal(got.length, want.length);
  assert.deepStrictEqual(got, want);
});

test('a saved state is refused when damaged, and a failed add applies nothing', async () => {
  const p = await stowplan.streamPacker(100, { maxBuffered: 8 });
  p.add([30, 40, 50, 60, 70]);
  const state = p.state();
  for (const at of [0, 4, 12, Math.floor(state.length / 2), state.length - 1]) {
    const bad = state.slice();
    bad[at] ^= 1;
    await assert.rejects(stowplan.streamPackerFromState(bad), stowplan.InvalidArgumentError);
  }
  await assert.rejects(stowplan.streamPackerFromState(state.subarray(0, state.length - 1)), stowplan.InvalidArgumentError);
  const before = p.status();
  assert.throws(() => p.add([10, 101]), (e) => e instanceof stowplan.InfeasibleError && /stream index 6/.test(e.message));
  assert.deepStrictEqual(p.status(), before);
  assert.deepStrictEqual((await stowplan.streamPackerFromState(p.state())).state(), state);
});

test('bad options are refused naming the argument and the allowed range', async () => {
  const cases = [
    [() => stowplan.streamPacker(0), /capacity must be in 1\.\.=2\*\*64-1 \(got 0\)/],
    [() => stowplan.streamPacker(10, { maxOpenBins: 0 }), /maxOpenBins must be in 1\.\.=65536 \(got 0\)/],
    [() => stowplan.streamPacker(10, { maxOpenBins: 65537 }), /maxOpenBins must be in 1\.\.=65536/],
    [() => stowplan.streamPacker(10, { maxBuffered: 1048577 }), /maxBuffered must be in 0\.\.=1048576/],
    [() => stowplan.streamPacker(10, { align: 0 }), /align must be in 1\.\.=/],
    [() => stowplan.streamPacker(10, { oversize: 'keep' }), /oversize must be one of 'error', 'single', 'drop'/],
    [() => stowplan.streamPacker(10, { maxOpen: 3 }), /unknown option 'maxOpen' of streamPacker/],
    [async () => (await stowplan.streamPacker(10)).add([1, -2]), /lengths\[1\]/],
    [() => stowplan.streamPackerFromState('SPSK'), /state must be a Uint8Array or ArrayBuffer/],
  ];
  for (const [f, message] of cases) {
    await assert.rejects(f, (e) => e instanceof stowplan.InvalidArgumentError && message.test(e.message));
  }
});

test('every packer has a kernel instance of its own: many large packers, and dispose', async () => {
  // Each packer of capacity 2**20 holds about 12 MiB; in one shared instance a hundred of
  // them passed 1 GiB of linear memory, where jco's resource handles break.
  const alive = [];
  for (let i = 0; i < 100; i++) {
    const p = await stowplan.streamPacker(1 << 20, { maxOpenBins: 1, maxBuffered: 0 });
    assert.deepStrictEqual(plain(p.add([1 << 19, 1 << 19, 5])), [[0, 1]]);
    alive.push(p);
  }
  for (const p of alive) {
    assert.deepStrictEqual(plain(p.finish()), [[2]]);
    p.dispose();
    assert.throws(() => p.status(), (e) => e instanceof stowplan.KernelRuntimeError && /disposed/.test(e.message));
  }
  assert.equal(stowplan.pack([1, 2, 3], 3).length, 2);
});

test('a long add is cut into kernel calls: the same bins, and a refusal still applies nothing', async () => {
  const n = (1 << 22) + 12345;
  const next = rng(3);
  const lengths = new BigUint64Array(n);
  for (let i = 0; i < n; i++) lengths[i] = BigInt(1 + next(3000));
  const whole = await stowplan.streamPacker(8192, { maxBuffered: 64 });
  const pieces = await stowplan.streamPacker(8192, { maxBuffered: 64 });
  const a = whole.add(lengths);
  const b = [];
  for (let i = 0; i < n; i += 100000) b.push(...plain(pieces.add(lengths.subarray(i, i + 100000))));
  assert.deepStrictEqual(plain(a), b);
  assert.equal(a.offsets[a.length], a.indices.length);
  assert.deepStrictEqual(whole.status(), pieces.status());
  // An oversized length at the very end, under `error`: refused whole, nothing applied.
  const before = whole.state();
  lengths[n - 1] = 9000n;
  assert.throws(() => whole.add(lengths), (e) => e instanceof stowplan.InfeasibleError);
  assert.deepStrictEqual(whole.state(), before);
});

/**
 * `state` (a packer's saved bytes) with its next stream index set to `next` and its sha256
 * made anew: a packer far along a stream. The frame: "SPSK", version (u32), payload length
 * (u64); the payload: capacity, align (u64), maxOpenBins, maxBuffered (u32), oversize (u8),
 * next index (u64), …; then the sha256 of everything before it (kernel/src/stream/state.rs).
 */
function withNextIndex(state, next) {
  const body = state.slice(0, state.length - 32);
  new DataView(body.buffer).setBigUint64(16 + 8 + 8 + 4 + 4 + 1, next, true);
  const out = new Uint8Array(body.length + 32);
  out.set(body);
  out.set(createHash('sha256').update(body).digest(), body.length);
  return out;
}

test('an add cut into kernel calls is all or nothing: a call refused after others ran puts the packer back', async () => {
  const chunk = 1 << 22; // the lengths per kernel call (STREAM_CHUNK)
  const n = chunk + 1000;
  const next = rng(5);
  const lengths = new BigUint64Array(n);
  for (let i = 0; i < n; i++) lengths[i] = BigInt(1 + next(3000));
  const later = Array.from({ length: 5000 }, () => 1 + next(3000));

  /**
   * `p.add(bad)` throws the kernel's own refusal (`type`, `message`); then `p` is byte for
   * byte the packer it was, and goes on as one that never saw the call.
   */
  async function refusedWhole(p, bad, type, message) {
    const before = p.state();
    const dropped = p.lastDropped;
    const twin = await stowplan.streamPackerFromState(before);
    assert.throws(() => p.add(bad), (e) => e instanceof type && message.test(e.message), String(message));
    assert.deepStrictEqual(p.state(), before, 'the state bytes after the refused add are those before');
    assert.equal(p.lastDropped, dropped);
    assert.deepStrictEqual([plain(p.add(later)), plain(p.finish())], [plain(twin.add(later)), plain(twin.finish())]);
    assert.deepStrictEqual(p.state(), twin.state());
  }

  // A length above the capacity (oversize error) in the second kernel call.
  const p = await stowplan.streamPacker(8192, { maxBuffered: 64 });
  p.add(lengths.subarray(0, 700));
  const oversized = lengths.slice();
  oversized[chunk + 10] = 8193n;
  await refusedWhole(p, oversized, stowplan.InfeasibleError, new RegExp(`^infeasible: the length at stream index ${700 + chunk + 10}, 8193 `));

  // A length whose rounding up to align overflows u64, in the second call.
  const q = await stowplan.streamPacker(2n ** 64n - 1n, { align: 1n << 40n, oversize: 'single', maxBuffered: 64 });
  const wraps = lengths.slice();
  wraps[n - 1] = 2n ** 64n - 1n;
  await refusedWhole(q, wraps, stowplan.InvalidArgumentError, /^invalid argument: the length at stream index \d+, 18446744073709551615, rounded up to a multiple of align = 1099511627776 overflows u64$/);

  // The stream index would pass 2**64-1 in the second call (a refusal no check of the
  // lengths foresees): a packer restored far along a stream.
  const start = 2n ** 64n - 1n - BigInt(chunk) - 10n;
  const far = await stowplan.streamPackerFromState(withNextIndex((await stowplan.streamPacker(8192, { maxBuffered: 64 })).state(), start));
  assert.equal(far.status().nextIndex, start);
  await refusedWhole(far, lengths, stowplan.InvalidArgumentError, /^invalid argument: the stream index would pass 2\^64 − 1$/);
});

test('extra costs: zeros change nothing, the costs include them, caps count tokens', () => {
  const lengths = Array.from(workload('rl-math-8k.txt').subarray(0, 512));
  const zeros = new Array(lengths.length).fill(0);
  const plainMicro = stowplan.microBatches(lengths, 16384, { cost: 'attention' });
  const zeroMicro = stowplan.microBatches(lengths, 16384, { cost: 'attention', extraCosts: zeros });
  assert.deepStrictEqual([zeroMicro.offsets, zeroMicro.indices, zeroMicro.costs], [plainMicro.offsets, plainMicro.indices, plainMicro.costs]);
  const plainBalance = stowplan.balance(lengths, 4, { capacity: 16384 });
  const zeroBalance = stowplan.balance(lengths, 4, { capacity: 16384, extraCosts: zeros });
  assert.deepStrictEqual(zeroBalance.ranks, plainBalance.ranks);

  // One sample with a heavy image: its micro-batch's cost shows it, its tokens do not.
  const extra = zeros.slice();
  extra[0] = 1_000_000;
  const m = stowplan.microBatches(lengths, 16384, { extraCosts: extra });
  const owner = m.batches.findIndex((b) => Array.from(b).includes(0));
  const tokens = Array.from(m.batches[owner], (i) => BigInt(lengths[i])).reduce((a, b) => a + b, 0n);
  assert.equal(m.tokens[owner], tokens);
  assert.equal(m.costs[owner], tokens + 1_000_000n);
  assert.ok(m.tokens.every((t) => t <= 16384n));
  const d = stowplan.balance(lengths, 4, { extraCosts: extra });
  assert.ok(d.costs.reduce((a, b) => a + b, 0n) === lengths.reduce((a, b) => a + BigInt(b), 0n) + 1_000_000n);
  assert.throws(
    () => stowplan.microBatches([1, 2], 10, { extraCosts: [1] }),
    (e) => e instanceof stowplan.InvalidArgumentError && /extra/.test(e.message),
  );
  assert.throws(() => stowplan.balance([1, 2], 1, { extraCosts: [1, -1] }), /extraCosts\[1\]/);
});

test('under limits: the bins of `pack --stream --limit` on vlm-mix-100k whatever the chunks, within every limit, and restarts continue exactly', async () => {
  const vlm = vlmTable();
  const n = 40000;
  const tokens = vlm.tokens.slice(0, n);
  const resources = vlm.resources;
  const head = { image_tokens: resources.image_tokens.slice(0, n), images: resources.images.slice(0, n) };
  const rows = ['tokens\timage_tokens\timages', ...Array.from({ length: n }, (_, i) => `${tokens[i]}\t${head.image_tokens[i]}\t${head.images[i]}`)];
  const limits = { image_tokens: 8192, images: 32 };
  const text = execFileSync(requireCli(), ['pack', '--stream', '--json', '-c', '16384', '--oversize', 'drop',
    '--limit', 'image_tokens=8192', '--limit', 'images=32', '--max-segments', '64', '-'], {
    input: rows.join('\n') + '\n', encoding: 'utf8', maxBuffer: 1 << 26, stdio: ['pipe', 'pipe', 'ignore'],
  });
  const want = text.trim().split('\n').map((l) => JSON.parse(l));
  const next = rng(11);
  let p = await stowplan.streamPacker(16384, { oversize: 'drop', limits, maxSegments: 64 });
  assert.deepStrictEqual([p.limits, p.maxSegments], [{ image_tokens: 8192n, images: 32n }, 64n]);
  const got = [];
  let restarted = 0;
  /** The bins of one call, each checked against every limit and against its reported loads. */
  const take = (closed) => {
    closed.bins.forEach((bin, b) => {
      const sum = (col) => bin.reduce((s, i) => s + col[Number(i)], 0);
      assert.ok(bin.length <= 64 && sum(tokens) <= 16384);
      for (const name of ['image_tokens', 'images']) {
        assert.ok(sum(head[name]) <= limits[name]);
        assert.equal(closed.resourceLoads[name][b], BigInt(sum(head[name])));
      }
    });
    got.push(...plain(closed));
  };
  for (let i = 0; i < n; ) {
    const k = 1 + next(3000);
    const cut = (col) => col.slice(i, i + k);
    take(p.add(cut(tokens), { resources: { images: cut(head.images), image_tokens: cut(head.image_tokens) } }));
    i += k;
    if (next(4) === 0) {
      p = await stowplan.streamPackerFromState(p.state());
      restarted++;
    }
  }
  take(p.finish());
  assert.ok(restarted > 3);
  assert.deepStrictEqual(got, want);
  // Refusals name the argument; a refused add applies nothing.
  const before = p.state();
  assert.throws(() => p.add([5]), /resources needs every limit's sizes \(image_tokens, images\)/);
  assert.throws(() => p.add([5], { resources: { image_tokens: [1] } }), /resources has no sizes for limits\['images'\]/);
  assert.throws(() => p.add([5], { resources: { image_tokens: [1], images: [1], audio: [1] } }), /resources\['audio'\] is not one of the packer's limits/);
  assert.throws(() => p.add([5, 6], { resources: { image_tokens: [1], images: [1, 1] } }), /resources\['image_tokens'\] has 1 sizes, lengths 2/);
  assert.deepStrictEqual(p.state(), before);
  // Over a limit under `drop`: left out and listed.
  p.add([5, 6], { resources: { image_tokens: [1, 9000], images: [1, 1] } });
  assert.deepStrictEqual(Array.from(p.lastDropped), [BigInt(n + 1)]);
  const strict = await stowplan.streamPacker(16384, { limits });
  assert.throws(() => strict.add([5, 6], { resources: { image_tokens: [1, 9000], images: [1, 1] } }),
    (e) => e instanceof stowplan.InfeasibleError && /stream index 1 has 9000 image_tokens, more than its cap 8192/.test(e.message));
  assert.equal(strict.status().nextIndex, 0n);
  for (const [opts, message] of [
    [{ limits: { tokens: 5 } }, /limits\['tokens'\]: the tokens are the lengths and their cap/],
    [{ limits: { images: 0 } }, /limits\['images'\] must be in 1\.\.=/],
    [{ limits: [3] }, /limits must be an object or a Map/],
    [{ maxSegments: -1 }, /maxSegments/],
  ]) {
    await assert.rejects(stowplan.streamPacker(100, opts), (e) => e instanceof stowplan.InvalidArgumentError && message.test(e.message), String(message));
  }
  // No limit and no segment limit: the plain packer, as Python's (its state is SPSK).
  const none = await stowplan.streamPacker(100, { limits: {} });
  assert.equal(String.fromCharCode(...none.state().subarray(0, 4)), 'SPSK');
  // A segment limit alone: a limited packer taking lengths only.
  const s = await stowplan.streamPacker(100, { maxSegments: 2, maxBuffered: 0 });
  assert.deepStrictEqual(plain(s.add([1, 1, 1, 1, 1])), [[0, 1], [2, 3]]);
  assert.throws(() => s.add([1], { resources: { images: [1] } }), /resources given to a packer without limits/);
});
