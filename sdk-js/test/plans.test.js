// Static plans, balance plans and seeded permutations against the CLI (target/release/stowplan,
// the Rust WASM host) run in the same test: identical checksums, figures and JSON.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import * as stowplan from '../src/index.js';
import { WORKLOADS, cliPlanText, requireCli, vlmTable, workload } from './helpers.js';

/** The CLI's JSON output (stdout) for `args`. */
function cli(args, input) {
  const text = execFileSync(requireCli(), args, { input, encoding: 'utf8', maxBuffer: 1 << 28, stdio: ['pipe', 'pipe', 'ignore'] });
  return text;
}

/** The canonical encoding's sha256 (wit/kernel.wit, interface plan), computed here with node:crypto. */
function referenceChecksum(packs) {
  const h = createHash('sha256');
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(packs.length));
  h.update(head);
  for (const p of packs) {
    const b = Buffer.alloc(4 + 4 * p.length);
    b.writeUInt32LE(p.length, 0);
    p.forEach((x, k) => b.writeUInt32LE(x, 4 + 4 * k));
    h.update(b);
  }
  return h.digest('hex');
}

const PLANS = [
  // [workload, packing length, world size, allow single long]: the Rust and Python tests' cases.
  ['sft-chat-200k.txt', 16384, 8, false],
  ['pretrain-docs-1m.txt', 32768, 8, true],
];

for (const [name, capacity, worldSize, allowSingleLong] of PLANS) {
  test(`static plan of ${name}: raw and aligned checksums identical to the CLI's`, () => {
    const lengths = workload(name);
    const raw = stowplan.rawPlan(lengths, { capacity, allowSingleLong });
    const aligned = stowplan.alignedPlan(raw, worldSize);
    const args = ['plan', '--lengths', join(WORKLOADS, name), '--capacity', String(capacity), '--world-size', String(worldSize), '--json'];
    if (allowSingleLong) args.push('--allow-single-long');
    const want = JSON.parse(cli(args));
    assert.equal(raw.checksum, want.raw_checksum);
    assert.equal(aligned.checksum, want.aligned_checksum);
    assert.equal(raw.length, want.n_raw_packs);
    assert.equal(aligned.length, want.n_aligned_packs);
    assert.equal(aligned.padNeeded, want.pad_needed);
    assert.equal(raw.singleLong.length, want.single_long);
    assert.equal(raw.dropped.length, want.dropped_long);
    assert.equal(raw.lowerBound, BigInt(want.lower_bound));
    assert.equal(raw.realTokens, BigInt(want.real_tokens));
    // The checksum is the documented encoding of the packs the plan holds.
    const packs = raw.packs;
    assert.equal(referenceChecksum(packs), raw.checksum);
    assert.equal(referenceChecksum(Array.from(aligned.packs, (p) => packs[p])), aligned.checksum);
    assert.deepStrictEqual(aligned.pack(-1), packs[aligned.packs[aligned.length - 1]]);
  });
}

test('the pretrain-docs-1m checksums are the ones .ci/run and the Rust and Python tests record', () => {
  const raw = stowplan.rawPlan(workload('pretrain-docs-1m.txt'), { capacity: 32768, allowSingleLong: true });
  assert.equal(raw.checksum, '91be2b30eb63eb8ea8dfa3502beb5c34c1e552987e449f43f3529e14d2f00621');
  assert.equal(stowplan.alignedPlan(raw, 8).checksum, '99091bdfbffa874e2671f2a1cccfb8ecadad68451a4fea34ca6d77e7adaddacc');
  assert.equal(raw.singleLong.length, 1048);
});

test('static plan of vlm-mix-100k under limits: the CLI\'s plan, every pack within every limit', () => {
  const { tokens, resources } = vlmTable();
  const limits = { image_tokens: 8192, images: 32 };
  const raw = stowplan.rawPlan(tokens, { capacity: 16384, resources, limits, maxSegments: 64 });
  const args = ['plan', '--lengths', join(WORKLOADS, 'vlm-mix-100k.tsv'), '--capacity', '16384',
    '--limit', 'image_tokens=8192', '--limit', 'images=32', '--max-segments', '64', '--json'];
  const want = JSON.parse(cli(args));
  assert.equal(raw.checksum, want.raw_checksum);
  assert.equal(raw.lowerBound, BigInt(want.lower_bound));
  assert.equal(raw.limits.method, 'balanced');
  assert.deepStrictEqual(raw.limits.names, ['image_tokens', 'images']);
  const bounds = [...want.limits.resources.map((r) => BigInt(r.lower_bound)), BigInt(want.limits.segments_lower_bound)];
  assert.deepStrictEqual(Array.from(raw.limits.lowerBounds), bounds);
  raw.packs.forEach((members, p) => {
    assert.ok(members.length <= 64);
    let [t, it, im] = [0, 0, 0];
    for (const i of members) { t += tokens[i]; it += resources.image_tokens[i]; im += resources.images[i]; }
    assert.ok(t <= 16384 && it <= 8192 && im <= 32, `pack ${p}`);
    assert.equal(raw.limits.loads[2 * p], BigInt(it));
    assert.equal(raw.limits.loads[2 * p + 1], BigInt(im));
  });
  // By name: method needs limits; resources and limits go together.
  assert.throws(() => stowplan.rawPlan([1, 2], { capacity: 10, method: 'bfd' }), /method applies with limits or maxSegments/);
  assert.throws(() => stowplan.rawPlan([1, 2], { capacity: 10, limits: { images: 2 } }), /limits needs resources/);
  assert.throws(() => stowplan.rawPlan([1, 2], { capacity: 10, maxSegments: 1, method: 'worst' }), /method must be one of/);
  // A segment limit alone; without limits, no limits.
  assert.deepStrictEqual(stowplan.rawPlan([1, 2, 3], { capacity: 10, maxSegments: 2 }).packs.map((p) => Array.from(p)), [[0], [1, 2]]);
  assert.equal(stowplan.rawPlan([1, 2, 3], { capacity: 10 }).limits, null);
});

test('drop-last and world size 1: the aligned plan drops the remainder, or is the raw plan', () => {
  const raw = stowplan.rawPlan([5, 9, 3, 7, 8, 2, 6], { capacity: 10 });
  const one = stowplan.alignedPlan(raw, 1);
  assert.equal(one.checksum, raw.checksum);
  const dropped = stowplan.alignedPlan(raw, 4, { dropLast: true });
  assert.equal(dropped.length % 4, 0);
  assert.equal(dropped.droppedPacks, raw.length % 4);
  const want = JSON.parse(cli(['plan', '--lengths', '-', '--capacity', '10', '--world-size', '4', '--drop-last', '--json'], '5\n9\n3\n7\n8\n2\n6\n'));
  assert.equal(dropped.checksum, want.aligned_checksum);
  assert.equal(raw.checksum, want.raw_checksum);
});

test('balance plans: JSON text byte-identical to the plan of stowplan balance --json', () => {
  const lengths = workload('rl-math-8k.txt');
  const input = `${Array.from(lengths).join('\n')}\n`;
  const cases = [
    [['--dp', '8', '--capacity', '16384', '--cost', 'attention'], { dp: 8, capacity: 16384, cost: 'attention' }],
    [['--dp', '4'], { dp: 4 }],
    [['--dp', '8', '--capacity', '32768', '--order', 'verl', '--min-count', '3'], { dp: 8, capacity: 32768, order: 'verl', minCount: 3 }],
    [['--dp', '16', '--capacity', '20000', '--cost', '7,3', '--group-size', '8'], { dp: 16, capacity: 20000, cost: [7, 3], groups: Array.from(lengths, (_, i) => Math.floor(i / 8)) }],
    [['--capacity', '16384', '--cost', 'attention', '--order', 'roll'], { dp: 1, capacity: 16384, cost: 'attention', order: 'roll' }],
  ];
  for (const [args, o] of cases) {
    const want = cliPlanText(cli(['balance', '-', '--json', ...args], input));
    const { dp, capacity, ...rest } = o;
    const got =
      dp === 1
        ? stowplan.microBatches(lengths, capacity, rest).toJSONText()
        : stowplan.balance(lengths, dp, { capacity, ...rest }).toJSONText();
    assert.equal(got, want, args.join(' '));
  }
});

test('balance plans under limits: JSON text byte-identical to the CLI\'s, resource loads included', () => {
  const { tokens, resources } = vlmTable();
  const n = 2000;
  const lengths = tokens.slice(0, n);
  const cut = { image_tokens: resources.image_tokens.slice(0, n), images: resources.images.slice(0, n) };
  const input = `tokens\timage_tokens\timages\n${lengths.map((t, i) => `${t}\t${cut.image_tokens[i]}\t${cut.images[i]}`).join('\n')}\n`;
  const limits = { image_tokens: 8192, images: 32 };
  const flags = ['--capacity', '16384', '--limit', 'image_tokens=8192', '--limit', 'images=32'];
  for (const dp of [1, 4]) {
    const want = cliPlanText(cli(['balance', '-', '--json', '--dp', String(dp), ...flags], input));
    assert.match(want, /"resource_loads":\[\[/, 'the CLI reports the loads');
    const got =
      dp === 1
        ? stowplan.microBatches(lengths, 16384, { resources: cut, limits }).toJSONText()
        : stowplan.balance(lengths, dp, { capacity: 16384, resources: cut, limits }).toJSONText();
    assert.equal(got, want, `dp ${dp}`);
  }
});

test('toJSONText of micro-batches whose arrays were changed in place is refused, not a trap', () => {
  const mb = stowplan.microBatches([5, 6, 7], 12, { resources: { images: [1, 0, 2] }, limits: { images: 3 } });
  assert.throws(() => {
    mb.tokens = new BigUint64Array(0);
  }, TypeError, 'the fields are read-only');
  mb.indices[0] = 99;
  assert.throws(() => mb.toJSONText(), /sample 99, beyond the 3 of sizes/);
  // Far beyond: the row's offset would wrap around 32 bits inside the component.
  const two = stowplan.microBatches([5, 6, 7], 12, { resources: { images: [1, 0, 2], video: [0, 0, 1] }, limits: { images: 3, video: 1 } });
  two.indices[0] = 2 ** 31;
  assert.throws(() => two.toJSONText(), /sample 2147483648, beyond the 3 of sizes/);
  const b = stowplan.balance([5, 6, 7, 8], 2, { capacity: 12 });
  assert.throws(() => {
    b.microBatches[0] = b.microBatches[1];
  }, TypeError, "the ranks' micro-batches are read-only");
});

/** The shuffle as wit/kernel.wit specifies it, written here with bigints: an independent reference. */
function referencePermutation(n, seed, epoch) {
  const M = (1n << 64n) - 1n;
  const GOLDEN = 0x9e3779b97f4a7c15n;
  let state = (BigInt(seed) + BigInt(epoch) * GOLDEN) & M;
  const next = () => {
    state = (state + GOLDEN) & M;
    let z = state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M;
    return z ^ (z >> 31n);
  };
  const bounded = (m) => {
    const range = BigInt(m);
    let x = next();
    let product = x * range;
    let low = product & M;
    if (low < range) {
      const threshold = ((M + 1n) - range) % range;
      while (low < threshold) {
        x = next();
        product = x * range;
        low = product & M;
      }
    }
    return Number(product >> 64n);
  };
  const p = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i >= 1; i--) {
    const j = bounded(i + 1);
    [p[i], p[j]] = [p[j], p[i]];
  }
  return p;
}

test('seeded permutations: the Rust tests recorded values and the specified shuffle', () => {
  // tests/tests/data_source.rs records these for the kernel.
  assert.deepStrictEqual(Array.from(stowplan.permutation(10, 42, 0)), [8, 3, 6, 5, 4, 0, 9, 2, 1, 7]);
  assert.deepStrictEqual(Array.from(stowplan.permutation(10, 42, 1)), [6, 7, 4, 3, 9, 5, 0, 8, 2, 1]);
  for (const [n, seed, epoch] of [[0, 1, 0], [1, 7, 3], [13, 2024, 0], [13, 2024, 2], [1000, 2n ** 64n - 1n, 5], [4096, 0, 123456789]]) {
    assert.deepStrictEqual(Array.from(stowplan.permutation(n, seed, epoch)), referencePermutation(n, seed, epoch), `${n} ${seed} ${epoch}`);
  }
  assert.throws(() => stowplan.permutation(-1, 0), /n must be in 0\.\.=2\*\*64-1 \(got -1\)/);
});
