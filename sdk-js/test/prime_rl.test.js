// prime-rl's kernel-level vectors (tests/vectors/prime-rl, kinds ffd_pack and
// pad_micro_batch): the classic packer's bins through the kernel's prime-rl.ffd, with the
// placement of zero-length samples and the errors of tests/lib.rs `prime_bins`. ffd_pack:
// bins, per-LoRA tokens and bin lengths identical. pad_micro_batch: the same micro-batches —
// count, the members' token ids in row order, and the padded row length — or the same error
// (the per-token arrays are the Rust host's materialization, not the kernel's).
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';

import { primeRlFfd } from '../src/compat.js';
import { VECTORS, loadDir } from './helpers.js';

/** A vector sample as prompt/completion ids (prime-rl's defaults filled in), truncated to seqLen. */
function sample(i, s, seqLen) {
  const d = Array.isArray(s) ? { lora: s[0], prompt_len: s[1], completion_len: s[2] } : s;
  const p = d.prompt_len ?? d.prompt_ids.length;
  const c = d.completion_len ?? d.completion_ids.length;
  const id = (j) => (i + 1) * 100000 + j;
  const prompt = d.prompt_ids ?? Array.from({ length: p }, (_, j) => id(j));
  const completion = d.completion_ids ?? Array.from({ length: c }, (_, j) => id(p + j));
  const pt = Math.min(prompt.length, seqLen);
  const ct = Math.min(completion.length, seqLen - pt);
  return {
    lora: d.lora ?? 0,
    ids: [...prompt.slice(0, pt), ...completion.slice(0, ct)],
    mode: d.training_mode ?? 'rl',
    multimodal: d.multimodal ?? false,
    env: d.env_name ?? 'env',
  };
}

/** prime-rl's bins (members in joining order) or its exception {type, message}. */
function primeBins(samples, seqLen, numLoras, classic) {
  if (samples.some((s) => s.env === 'all')) {
    return { error: { type: 'AssertionError', message: "env_name='all' is reserved for aggregate metric keys" } };
  }
  const n = samples.length;
  const lengths = samples.map((s) => s.ids.length);
  const runs = samples.map((s) => s.lora);
  const modes = [];
  const text = samples.map((s) => {
    if (s.multimodal) return null;
    const mode = classic ? s.mode : '';
    if (!modes.includes(mode)) modes.push(mode);
    return modes.indexOf(mode);
  });
  let fresh = modes.length;
  const labels = text.map((l) => (l === null ? fresh++ : l));
  const { bins: packed, dropped } = primeRlFfd(lengths, runs, labels, seqLen);
  const order = [...Array(n).keys()].sort((a, b) => runs[a] - runs[b] || lengths[b] - lengths[a] || a - b);
  const turn = new Array(n);
  order.forEach((i, t) => (turn[i] = t));
  const bins = packed.map((b) => ({ t: turn[b[0]], label: labels[b[0]], members: b }));
  for (const z of [...dropped].sort((a, b) => turn[a] - turn[b])) {
    const [t, label] = [turn[z], labels[z]];
    let open = 0;
    while (open < bins.length && bins[open].t < t) open++;
    const joined = bins.slice(0, open).find((b) => b.label === label);
    if (joined) {
      joined.members.push(z);
      joined.members.sort((a, b) => turn[a] - turn[b]);
      continue;
    }
    const members = [z];
    const later = bins.slice(open).findIndex((b) => b.label === label);
    if (later >= 0) members.push(...bins.splice(open + later, 1)[0].members);
    bins.splice(open, 0, { t, label, members });
  }
  const first = order.find((i) => runs[i] >= numLoras);
  if (first !== undefined) {
    const opens = bins.some((b) => b.members[0] === first);
    const message = classic && opens ? 'list assignment index out of range' : 'list index out of range';
    return { error: { type: 'IndexError', message } };
  }
  return { bins: bins.map((b) => b.members) };
}

test('prime-rl ffd_pack and pad_micro_batch vectors: the same bins, rows and errors', () => {
  const vectors = loadDir(join(VECTORS, 'prime-rl')).filter(([, v]) => ['ffd_pack', 'pad_micro_batch'].includes(v.kind));
  assert.ok(vectors.length >= 23, `expected the prime-rl packing vectors, found ${vectors.length}`);
  for (const [name, v] of vectors) {
    const i = v.input;
    const classic = (i.variant ?? 'classic') === 'classic';
    const samples = i.samples.map((s, k) => sample(k, s, i.seq_len));
    let r = primeBins(samples, i.seq_len, i.num_loras, classic);
    const multiple = i.pad_to_multiple_of;
    if (r.bins && r.bins.length && multiple === 0) {
      r = { error: { type: 'ZeroDivisionError', message: 'integer modulo by zero' } };
    }
    if (v.error || r.error) {
      assert.deepStrictEqual(r.error, v.error, name);
      continue;
    }
    const len = (k) => samples[k].ids.length;
    if (v.kind === 'ffd_pack') {
      const got = {
        bins: r.bins.map((b) => b.filter((k) => len(k) > 0)),
        lora_num_tokens: r.bins.map((b) => {
          const t = new Array(i.num_loras).fill(0);
          for (const k of b) t[samples[k].lora] += len(k);
          return t;
        }),
        bin_lengths: r.bins.map((b) => b.reduce((a, k) => a + len(k), 0)),
      };
      assert.deepStrictEqual(got, v.output, name);
      continue;
    }
    const want = v.output.micro_batches;
    assert.equal(r.bins.length, want.length, `${name}: micro-batches`);
    r.bins.forEach((b, m) => {
      const ids = b.flatMap((k) => samples[k].ids);
      const padded = multiple > 1 ? Math.ceil(ids.length / multiple) * multiple : ids.length;
      assert.deepStrictEqual(want[m].input_ids.slice(0, ids.length), ids, `${name}: micro-batch ${m} ids`);
      assert.equal(want[m].input_ids.length, padded, `${name}: micro-batch ${m} padded length`);
    });
  }
});

test('prime-rl distribute vectors: the packing of the classic prepare_batch, bin for bin', () => {
  // The deal itself (dummies, rank i % W) is the Rust host's, which the JS SDK does not carry;
  // the bins it deals are the kernel's and must be prime-rl's here too.
  const vectors = loadDir(join(VECTORS, 'prime-rl')).filter(([, v]) => v.kind === 'distribute' && !v.error);
  assert.ok(vectors.length >= 12, `expected the prime-rl distribute vectors, found ${vectors.length}`);
  for (const [name, v] of vectors) {
    const i = v.input;
    const samples = i.samples.map((s, k) => sample(k, s, i.seq_len));
    const r = primeBins(samples, i.seq_len, i.num_loras, true);
    assert.deepStrictEqual(r.bins, v.output.bins, name);
  }
});
