// prime-rl at HEAD (559b447) and its multi-LoRA packer (de80b48): the `distribute_kk` and
// `balanced_partition` vectors of tests/vectors/prime-rl through the kernel's `prime-rl`
// interface, with the glue of tests/tests/prime_rl_head.rs (prime-rl's sample checks and
// exceptions, multimodal classes; the cost coefficients come from the vector).
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';

import { primeRlBalancedPartition, primeRlKarmarkarKarp, primeRlPrepareBatch } from '../src/compat.js';
import { VECTORS, loadDir, norm } from './helpers.js';

const ALL = loadDir(join(VECTORS, 'prime-rl'));
const err = (type, message) => ({ error: { type, message } });

/** A vector sample as the kernel sees it, or prime-rl's `prepare_sample` exception. */
function sample(s) {
  const d = Array.isArray(s) ? { lora: s[0], prompt_len: s[1], completion_len: s[2] } : s;
  const p = Number(d.prompt_len);
  const c = Number(d.completion_len);
  let mm = null;
  let alone = false;
  const keys = [];
  if (d.multimodal) {
    const spec = d.mm ?? [['pixel_values', 'float32', [1, 4]]];
    const parts = spec.map(([name, dtype, shape]) => {
      if (shape.length === 0) alone = true;
      keys.push(name);
      return `${name}:${dtype}:${shape.length}:${shape.slice(1).join(',')}`;
    });
    mm = parts.sort().join('|');
  }
  let error = null;
  if (mm !== null && keys.includes('image_grid_thw') && d.mm_token_type_ids === undefined) {
    error = err('ValueError', 'image_grid_thw multimodal samples require mm_token_type_ids');
  }
  const mask = [...(d.prompt_mask ?? Array(p).fill(false)), ...(d.completion_mask ?? Array(c).fill(true))];
  const env = d.env_name ?? 'env';
  if (!error && d.advantage === null && mask.some(Boolean)) {
    error = err(
      'ValueError',
      `sample from env '${env}' has rl member tokens but no advantages — the producer must stamp the advantage ` +
        'stream (the orchestrator broadcasts the rollout scalar)',
    );
  }
  if (!error && env === 'all') error = err('AssertionError', "env_name='all' is reserved for aggregate metric keys");
  return { len: p + c, lora: Number(d.lora ?? 0), mm, alone, routed: d.routed_experts === true, error };
}

function distribute(v) {
  const inp = v.input;
  const multilora = inp.variant === 'multilora';
  const samples = inp.samples.map(sample);
  const failed = samples.find((s) => s.error);
  if (failed) return failed.error;
  const seqLen = Number(inp.seq_len);
  const w = Number(inp.num_workers);
  const m = Number(inp.pad_to_multiple_of ?? 1);
  const numLoras = Number(inp.num_loras ?? 1);
  if (multilora && samples.some((s) => s.lora >= numLoras)) return err('IndexError', 'list index out of range');
  if (m === 0 && samples.length) return err('ZeroDivisionError', 'integer modulo by zero');
  if (w === 0) return err('ZeroDivisionError', 'integer modulo by zero');
  const [linear, quadratic] = v.output.cost_coefficients;
  const sigs = [];
  let fresh = 2 ** 32 - 1;
  const classes = samples.map((s) => {
    if (s.mm === null) return 0;
    if (s.alone) return fresh--;
    if (!sigs.includes(s.mm)) sigs.push(s.mm);
    return sigs.indexOf(s.mm) + 1;
  });
  const lengths = samples.map((s) => Math.min(s.len, seqLen));
  const plan = primeRlPrepareBatch(
    lengths,
    samples.map((s) => (multilora ? s.lora : 0)),
    classes,
    samples.map((s) => (s.routed ? 1 : 0)),
    { seqLen, numTrainWorkers: w, linear, quadratic, padToMultipleOf: Math.max(m, 1), multimodalSameRun: multilora },
  );
  const perRank = plan.ranks.map((rank, r) =>
    rank.map((b, j) => {
      const members = plan.bins[b];
      const seqs = members.map((i) => BigInt(lengths[i]));
      if (seqs.length) seqs[seqs.length - 1] += plan.padding[b];
      const e = { samples: members, dummy: plan.dummies[r][j], multimodal: plan.multimodal[b], sequence_lengths: seqs, cost: plan.costs[b] };
      if (multilora) {
        const tokens = Array(numLoras).fill(0n);
        for (const i of members) tokens[samples[i].lora] += BigInt(lengths[i]);
        tokens[numLoras - 1] += plan.padding[b];
        e.lora_num_tokens = tokens;
      }
      return e;
    }),
  );
  const rankCosts = perRank.map((rank) => rank.reduce((a, e) => a + e.cost, 0n));
  return { output: { cost_coefficients: [linear, quadratic], bins: plan.bins, per_rank: perRank, rank_costs: rankCosts } };
}

function partition(v) {
  const { weights, num_partitions: k } = v.input;
  const n = weights.length;
  const kn = Number(k);
  if (kn === 0) return err('ZeroDivisionError', 'integer modulo by zero');
  if (n < kn || n % kn !== 0) {
    assert.throws(() => primeRlBalancedPartition(weights, kn), /positive multiple of numPartitions/);
    return err('AssertionError', '');
  }
  return { output: { karmarkar_karp: primeRlKarmarkarKarp(weights, kn), balanced_partition: primeRlBalancedPartition(weights, kn) } };
}

test('prime-rl HEAD distribute_kk vectors: the same bins, ranks, dummies, costs and errors', () => {
  // prime-rl's `_truncate_mm` (a multimodal sample with mm_token_type_ids cut at an image
  // boundary) is Python glue, run by sdk-python/tests/test_prime_rl_head.py.
  const cuts = (v) =>
    v.input.samples.some((s) => s.mm_token_type_ids !== undefined && Number(s.prompt_len) + Number(s.completion_len) > Number(v.input.seq_len));
  const vectors = ALL.filter(([, v]) => v.kind === 'distribute_kk' && !cuts(v));
  assert.ok(vectors.length >= 94, `expected the prime-rl head vectors, found ${vectors.length}`);
  for (const [name, v] of vectors) {
    const want = v.error ? { error: v.error } : { output: v.output };
    assert.deepStrictEqual(norm(distribute(v)), norm(want), name);
  }
});

test('prime-rl HEAD balanced_partition vectors: KK and the refined groups', () => {
  const vectors = ALL.filter(([, v]) => v.kind === 'balanced_partition');
  assert.ok(vectors.length >= 45, `expected the prime-rl partition vectors, found ${vectors.length}`);
  for (const [name, v] of vectors) {
    const want = v.error ? { error: v.error } : { output: v.output };
    assert.deepStrictEqual(norm(partition(v)), norm(want), name);
  }
});

test('prime-rl prepare-batch refuses zero workers and names the option', () => {
  assert.throws(() => primeRlPrepareBatch([1], [0], [0], [0], { seqLen: 4, numTrainWorkers: 0 }), /numTrainWorkers/);
  assert.throws(() => primeRlPrepareBatch([1], [0], [0], [0], { seqLen: 4, numTrainWorkers: 1, pad: 2 }), /unknown option 'pad'/);
});
