// Packing under several limits (packMulti): the CLI's bins and loads bin for bin
// (test/multi_vectors.json, written by scripts/multi-vectors.mjs), every bin within every
// limit on seeded random tables, one resource equal to `pack`, and errors naming the argument.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import * as stowplan from '../src/index.js';
import { PKG, norm, rng } from './helpers.js';

const { InfeasibleError, InvalidArgumentError, MultiPacking, Packing } = stowplan;
const VECTORS = JSON.parse(readFileSync(join(PKG, 'test/multi_vectors.json'), 'utf8')).cases;
const METHODS = ['balanced', 'bfd', 'ffd', 'next-fit'];


const plain = (lists) => lists.map((l) => Array.from(l));

test('the CLI\'s bins, loads and bounds, bin for bin (stowplan pack --limit … --json)', () => {
  assert.ok(VECTORS.length >= 10);
  for (const { name, columns, capacities, options, expected: want } of VECTORS) {
    const p = stowplan.packMulti(columns, capacities, options);
    const names = Object.keys(columns);
    assert.ok(p instanceof MultiPacking && p instanceof Packing, name);
    assert.deepStrictEqual(plain(p.bins), want.bins, name);
    assert.deepStrictEqual(norm(p.loads), norm(want.loads), name);
    assert.deepStrictEqual(norm(p.resourceLoads), norm(want.resource_loads), name);
    assert.deepStrictEqual(Array.from(p.dropped), want.dropped, name);
    assert.deepStrictEqual(Array.from(p.single), want.single, name);
    assert.equal(p.realTokens, BigInt(want.real_tokens), name);
    assert.equal(p.alignedTokens, BigInt(want.aligned_tokens), name);
    assert.equal(p.lowerBound, BigInt(want.lower_bound), name);
    assert.deepStrictEqual(p.names, want.resources.map((r) => r.name), name);
    assert.deepStrictEqual(p.names, names, name);
    const bounds = Object.fromEntries(want.resources.map((r) => [r.name, BigInt(r.lower_bound)]));
    if (want.max_segments > 0) bounds.segments = BigInt(want.segments_lower_bound);
    assert.deepStrictEqual(p.lowerBounds, bounds, name);
    assert.deepStrictEqual(p.capacities, Object.fromEntries(want.resources.map((r) => [r.name, BigInt(r.capacity)])), name);
    assert.equal(p.maxSegments, BigInt(want.max_segments), name);
    // The same table as Maps, with typed arrays and bigints: the same bins.
    const asMaps = stowplan.packMulti(
      new Map(names.map((k) => [k, BigUint64Array.from(columns[k], BigInt)])),
      new Map(names.map((k) => [k, BigInt(capacities[k])])),
      options,
    );
    assert.deepStrictEqual(plain(asMaps.bins), want.bins, name);
    assert.deepStrictEqual(norm(asMaps.resourceLoads), norm(want.resource_loads), name);
  }
});

test('every bin is within every limit and every item is placed once, on seeded random tables', () => {
  const draw = rng(31);
  const NAMES = ['tokens', 'image_tokens', 'images', 'frames', 'audio', 'r5', 'r6', 'r7'];
  for (let round = 0; round < 300; round++) {
    const r = draw(1, round % 10 === 0 ? 8 : 4);
    const n = draw(1, 80);
    const names = NAMES.slice(0, r);
    const caps = Object.fromEntries(names.map((k) => [k, draw(1, 60)]));
    const columns = Object.fromEntries(names.map((k) => [k, Array.from({ length: n }, () => draw(0, 70))]));
    const maxSegments = draw(0, 6);
    const align = draw(0, 3) === 0 ? draw(2, 8) : 1;
    const method = METHODS[draw(0, 3)];
    const oversize = draw(0, 1) ? 'drop' : 'single';
    const what = JSON.stringify({ round, caps, maxSegments, align, method, oversize });
    const p = stowplan.packMulti(columns, caps, { maxSegments, align, method, oversize });
    // The sizes the limits apply to: tokens aligned.
    const size = (i, q) => {
      const s = columns[names[q]][i];
      return q === 0 ? Math.ceil(s / align) * align : s;
    };
    const over = (i) => names.some((k, q) => size(i, q) > caps[k]);
    const seen = [...p.bins.flatMap((b) => Array.from(b)), ...p.dropped].sort((a, b) => a - b);
    assert.deepStrictEqual(seen, Array.from({ length: n }, (_, i) => i), what);
    assert.equal(p.resourceLoads.length, p.length, what);
    const single = new Set(p.single);
    p.bins.forEach((members, b) => {
      const load = names.map((_, q) => members.reduce((t, i) => t + size(i, q), 0));
      assert.deepStrictEqual(Array.from(p.resourceLoads[b], Number), load, what);
      assert.equal(p.loads[b], BigInt(load[0]), what);
      if (members.length === 1 && single.has(members[0])) return; // an oversized item alone
      names.forEach((k, q) => assert.ok(load[q] <= caps[k], `${what}: bin ${b} ${k} ${load[q]} > ${caps[k]}`));
      assert.ok(maxSegments === 0 || members.length <= maxSegments, what);
    });
    for (const i of [...p.dropped, ...p.single]) assert.ok(over(i), `${what}: item ${i} is not oversized`);
    const kept = Array.from({ length: n }, (_, i) => i).filter((i) => !over(i));
    const bounds = Object.fromEntries(names.map((k, q) => [k, BigInt(Math.ceil(kept.reduce((t, i) => t + size(i, q), 0) / caps[k]))]));
    if (maxSegments > 0) bounds.segments = BigInt(Math.ceil(kept.length / maxSegments));
    assert.deepStrictEqual(p.lowerBounds, bounds, what);
    assert.equal(p.lowerBound, Object.values(bounds).reduce((a, b) => (b > a ? b : a), 0n), what);
    assert.ok(BigInt(p.length - p.single.length) >= p.lowerBound, what);
  }
});

test('with one resource the bins are pack\'s', () => {
  const draw = rng(7);
  for (let round = 0; round < 150; round++) {
    const lengths = Array.from({ length: draw(1, 100) }, () => draw(0, 100));
    const capacity = draw(1, 100);
    const o = { method: METHODS[draw(0, 3)], oversize: ['error', 'single', 'drop'][draw(1, 2)], align: draw(1, 3) };
    // With one resource, balanced is best-fit decreasing.
    const want = stowplan.pack(lengths, capacity, { ...o, method: o.method === 'balanced' ? 'bfd' : o.method });
    const got = stowplan.packMulti({ tokens: lengths }, { tokens: capacity }, o);
    const what = JSON.stringify({ round, capacity, o });
    assert.deepStrictEqual(plain(got.bins), plain(want.bins), what);
    for (const key of ['loads', 'dropped', 'single', 'realTokens', 'alignedTokens', 'lowerBound', 'efficiency', 'capacity', 'numBins']) {
      assert.deepStrictEqual(got[key], want[key], `${what}: ${key}`);
    }
    assert.deepStrictEqual(norm(got.resourceLoads), norm(Array.from(want.loads, (l) => [l])), what);
    assert.deepStrictEqual(got.lowerBounds, { tokens: want.lowerBound }, what);
  }
});

test('errors name the argument, and the kernel\'s name the resources', () => {
  const refused = (E, re) => (e) => e instanceof E && re.test(e.message);
  assert.throws(
    () => stowplan.packMulti({ tokens: [5, 7], images: [1, 40] }, { tokens: 100, images: 32 }),
    refused(InfeasibleError, /^infeasible: item 1 needs 40 images \(capacity 32\); use oversize single or drop to accept such items$/),
  );
  assert.throws(
    () => stowplan.packMulti(new Map([['tokens', [2n ** 64n - 1n]], ['images', [0]]]), { tokens: 8, images: 1 }, { align: 2 }),
    refused(InvalidArgumentError, /^invalid argument: sizes\[0\]\[0\] \(tokens\) = 18446744073709551615 aligned to 2 overflows u64$/),
  );
  // More items than bfd takes with two resources: the kernel's refusal; balanced packs them.
  const many = new Uint8Array(2 ** 18 + 1);
  assert.throws(
    () => stowplan.packMulti({ tokens: many, images: many }, { tokens: 8, images: 1 }, { method: 'bfd' }),
    refused(InvalidArgumentError, /^invalid argument: sizes has 262145 rows; .*at most 262144 items per call/),
  );
  assert.equal(stowplan.packMulti({ tokens: many, images: many }, { tokens: 8, images: 1 }).bins.length, 1);
  // Balanced holds rooms in 32 bits.
  assert.throws(
    () => stowplan.packMulti({ tokens: [1], images: [1] }, { tokens: 2n ** 32n, images: 1 }),
    refused(InvalidArgumentError, /^invalid argument: capacities\[0\] \(tokens\) must be at most 4294967295 with the balanced method \(got 4294967296\); use bfd or ffd/),
  );
  assert.throws(
    () => stowplan.packMulti({ tokens: [1], images: [1] }, { tokens: 8, images: 1 }, { method: 'worst' }),
    refused(InvalidArgumentError, /method must be one of 'balanced', 'bfd', 'ffd', 'next-fit'/),
  );
  const nine = Object.fromEntries(Array.from({ length: 9 }, (_, q) => [`r${q}`, [1]]));
  const cases = [
    [[{ tokens: [1] }, { tokens: 0 }], /^capacities\['tokens'\] must be in 1\.\.=2\*\*64-1 \(got 0\)$/],
    [[{ tokens: [1] }, { tokens: 1.5 }], /^capacities\['tokens'\] must be an integer in 1\.\.=2\*\*64-1 \(got 1\.5\)$/],
    [[{ tokens: [1], images: [1, 2] }, { tokens: 9, images: 9 }], /^columns\['images'\] has 2 sizes, columns\['tokens'\] 1: one per item in each$/],
    [[{ tokens: [1] }, { tokens: 9, images: 2 }], /^capacities\['images'\] has no column of sizes in columns \(columns: tokens\)$/],
    [[{ tokens: [1], images: [1] }, { tokens: 9 }], /^capacities has no entry for column 'images'$/],
    [[{}, {}], /^columns must name 1 to 8 resources \(got 0\)$/],
    [[nine, Object.fromEntries(Object.keys(nine).map((k) => [k, 1]))], /^columns must name 1 to 8 resources \(got 9\)$/],
    [[{ tokens: [-1] }, { tokens: 9 }], /^columns\['tokens'\]\[0\] must be in 0\.\.=2\*\*64-1 \(got -1\)$/],
    [[{ tokens: [1], images: Float64Array.from([1]) }, { tokens: 9, images: 9 }], /^columns\['images'\] must hold integers, not floats/],
    [[{ tokens: 5 }, { tokens: 9 }], /^columns\['tokens'\] must be an array or an integer typed array \(got 5\)$/],
    [[[[1, 2]], { tokens: 9 }], /^columns must be an object or a Map of resource name → sizes \(got an array of 1\)$/],
    [[{ tokens: [1] }, null], /^capacities must be an object or a Map of resource name → capacity \(got null\)$/],
    [[new Map([[0, [1]]]), { tokens: 9 }], /^columns' keys must be resource names \(strings\), got 0$/],
    [[{ tokens: [1] }, { tokens: 9 }, { maxSegments: -1 }], /^maxSegments must be in 0\.\.=2\*\*64-1 \(got -1\)$/],
    [[{ tokens: [1] }, { tokens: 9 }, { method: 'best' }], /^method must be one of 'balanced', 'bfd', 'ffd', 'next-fit' \(got "best"\)$/],
    [[{ tokens: [1] }, { tokens: 9 }, { align: 0 }], /^align must be in 1\.\.=2\*\*64-1 \(got 0\)$/],
    [[{ tokens: [1] }, { tokens: 9 }, { max_segments: 2 }], /^unknown option 'max_segments' of packMulti; known: maxSegments, align, method, oversize$/],
  ];
  for (const [args, message] of cases) {
    assert.throws(() => stowplan.packMulti(...args), refused(InvalidArgumentError, message), String(message));
  }
  // The kernel checks the names: 'segments' is the segment limit's.
  assert.throws(
    () => stowplan.packMulti({ tokens: [1], segments: [1] }, { tokens: 9, segments: 9 }, { maxSegments: 2 }),
    refused(InvalidArgumentError, /^invalid argument: names\[1\] = "segments" is the segment limit's name: rename the resource or drop maxSegments$/),
  );
  // A column named 'segments' is only a resource without a segment limit.
  assert.deepStrictEqual(stowplan.packMulti({ tokens: [1], segments: [1] }, { tokens: 9, segments: 9 }).lowerBounds, { tokens: 1n, segments: 1n });
});

test('microBatches keeps every micro-batch within further limits (resources, limits)', () => {
  const draw = rng(131);
  for (let round = 0; round < 120; round++) {
    const n = draw(1, 60);
    const cap = draw(100, 400);
    const lengths = Array.from({ length: n }, () => draw(1, cap));
    const imageCap = draw(20, 200);
    const imagesCap = draw(1, 6);
    const imageTokens = Array.from({ length: n }, () => (draw(0, 1) ? 0 : draw(0, imageCap)));
    const images = imageTokens.map((t) => (t === 0 ? 0 : draw(1, imagesCap)));
    const minCount = Math.min(draw(0, 3), n);
    const what = JSON.stringify({ round, cap, imageCap, imagesCap, minCount });
    const m = stowplan.microBatches(lengths, cap, { minCount, resources: { image_tokens: imageTokens, images }, limits: { image_tokens: imageCap, images: imagesCap } });
    assert.deepStrictEqual(Array.from(m.indices).sort((a, b) => a - b), Array.from({ length: n }, (_, i) => i), what);
    for (const batch of m.batches) {
      const sum = (col) => batch.reduce((t, i) => t + col[i], 0);
      assert.ok(sum(lengths) <= cap && sum(imageTokens) <= imageCap && sum(images) <= imagesCap, what);
    }
    // The count: the balanced fill's under all the caps, raised to minCount.
    const fill = stowplan.packMulti({ tokens: lengths, image_tokens: imageTokens, images }, { tokens: cap, image_tokens: imageCap, images: imagesCap });
    assert.equal(m.count, Math.max(fill.length, minCount), what);
  }
  const refused = (re) => (e) => e instanceof InvalidArgumentError && re.test(e.message);
  const l = [5, 7];
  assert.throws(() => stowplan.microBatches(l, 10, { resources: { images: [1, 2] } }), refused(/^resources needs limits/));
  assert.throws(() => stowplan.microBatches(l, 10, { limits: { images: 2 } }), refused(/^limits needs resources/));
  assert.throws(() => stowplan.microBatches(l, 10, { resources: { images: [1] }, limits: { images: 2 } }), refused(/^resources\['images'\] has 1 sizes, lengths 2: one per sequence$/));
  assert.throws(() => stowplan.microBatches(l, 10, { resources: { images: [1, 2] }, limits: { frames: 2 } }), refused(/^limits has no cap for resources\['images'\]$/));
  assert.throws(() => stowplan.microBatches(l, 10, { resources: { tokens: [1, 2] }, limits: { tokens: 2 } }), refused(/^resources\['tokens'\]: the tokens are lengths/));
  assert.throws(() => stowplan.microBatches(l, 10, { resources: { images: [1, 2] }, limits: { images: 0 } }), refused(/limits\['images'\]/));
  assert.throws(
    () => stowplan.microBatches(l, 10, { resources: { images: [1, 3] }, limits: { images: 2 } }),
    (e) => e instanceof InfeasibleError && /images/.test(e.message),
  );
});

test('balance keeps every rank\'s micro-batches within further limits, one common count', () => {
  const draw = rng(733);
  let planned = 0;
  for (let round = 0; round < 60; round++) {
    const n = draw(8, 120);
    const dp = draw(1, 4);
    const cap = draw(400, 1200);
    const lengths = Array.from({ length: n }, () => draw(1, 400));
    const imageTokens = Array.from({ length: n }, () => draw(0, 300));
    const images = Array.from({ length: n }, () => draw(0, 4));
    const limits = { image_tokens: draw(300, 900), images: draw(4, 10) };
    const what = JSON.stringify({ round, n, dp, cap, limits });
    let b;
    try {
      b = stowplan.balance(lengths, dp, { capacity: cap, cost: 'attention', extraCosts: imageTokens, resources: { image_tokens: imageTokens, images }, limits });
    } catch (e) {
      // A rank with fewer samples than the common count needs.
      assert.ok(e instanceof InvalidArgumentError && /rank/.test(e.message), `${what}: ${e.message}`);
      continue;
    }
    planned++;
    const seen = [];
    b.microBatches.forEach((mb, r) => {
      assert.equal(mb.count, b.count, what);
      const mine = new Set(Array.from(b.ranks[r]));
      for (const batch of mb.batches) {
        const sum = (col) => batch.reduce((t, i) => t + col[i], 0);
        assert.ok(sum(lengths) <= cap && sum(imageTokens) <= limits.image_tokens && sum(images) <= limits.images, what);
        for (const i of batch) assert.ok(mine.has(i), what);
        seen.push(...batch);
      }
    });
    assert.deepStrictEqual(seen.sort((a, c) => a - c), Array.from({ length: n }, (_, i) => i), what);
    // The DP level is the one without limits.
    const plain = stowplan.balance(lengths, dp, { cost: 'attention', extraCosts: imageTokens });
    assert.deepStrictEqual(b.ranks.map((r) => Array.from(r)), plain.ranks.map((r) => Array.from(r)), what);
  }
  assert.ok(planned > 20, `${planned} of 60 rounds planned`);
  assert.throws(() => stowplan.balance([1, 2], 1, { resources: { images: [1, 1] }, limits: { images: 2 } }), /resources needs capacity/);
});

test("messages keep the caller's resource names as spelt (image_tokens, not camel-cased)", () => {
  assert.throws(() => stowplan.packMulti({ tokens: [1], image_tokens: [9] }, { tokens: 10, image_tokens: 5 }),
    (e) => e instanceof stowplan.InfeasibleError && /needs 9 image_tokens \(capacity 5\)/.test(e.message));
  assert.throws(() => stowplan.microBatches([1], 10, { resources: { image_tokens: [9] }, limits: { image_tokens: 5 } }),
    (e) => e instanceof stowplan.InfeasibleError && /has 9 image_tokens, more than its cap 5/.test(e.message));
  // The kernel names the cap as this package's argument does.
  assert.throws(() => stowplan.microBatches([20], 10), (e) => /more than capacity = 10/.test(e.message));
});
