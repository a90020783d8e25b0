// Every conformance vector family the kernel answers (tests/vectors: stowplan's own, verl's,
// ROLL's and prime-rl's kernel-level ones), run through the JavaScript SDK with the same
// rules as the Rust runner (tests/lib.rs) and the Python tests: results identical.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';

import * as stowplan from '../src/index.js';
import * as compat from '../src/compat.js';
import { VECTORS, loadDir, norm } from './helpers.js';

/** Runs one stowplan vector; the result in the vector's `expected` shape. */
function runStowplan(v) {
  const input = v.input;
  if (v.operation === 'partition') {
    const method = input.method ?? 'kk';
    const p = stowplan.partition(input.weights, input.k, {
      method,
      equalSize: input.equal_size ?? false,
      refine: input.refine ?? method !== 'verl',
    });
    return { groups: p.groups, sums: p.sums, total: p.total, spread: p.spread, lower_bound: p.lowerBound };
  }
  assert.equal(v.operation, 'pack', `unknown operation ${v.operation}`);
  const b = stowplan.pack(input.lengths, input.capacity, {
    align: input.align ?? 1,
    method: input.method ?? 'bfd',
    oversize: input.oversize ?? 'error',
  });
  return {
    bins: b.bins,
    loads: b.loads,
    dropped: b.dropped,
    single: b.single,
    real_tokens: b.realTokens,
    aligned_tokens: b.alignedTokens,
    padding_tokens: b.paddingTokens,
    lower_bound: b.lowerBound,
  };
}

const ERRORS = { 'invalid-argument': stowplan.InvalidArgumentError, infeasible: stowplan.InfeasibleError };

test('stowplan vectors: every result and every error kind identical', () => {
  const vectors = loadDir(VECTORS);
  assert.ok(vectors.length >= 27, `expected stowplan's own vectors, found ${vectors.length}`);
  for (const [name, v] of vectors) {
    const expected = v.expected;
    if ('error' in expected) {
      assert.throws(() => runStowplan(v), (e) => e instanceof ERRORS[expected.error] && e.kind === expected.error, name);
      continue;
    }
    const got = runStowplan(v);
    for (const [key, want] of Object.entries(expected)) {
      assert.deepStrictEqual(norm(got[key]), norm(want), `${name}: ${key}`);
    }
  }
});

/** Runs `f` and returns ['ok', result] or ['err', PeerError type, message]. */
function outcome(f) {
  try {
    return ['ok', f()];
  } catch (e) {
    if (!(e instanceof stowplan.PeerError)) throw e;
    return ['err', e.type, e.message];
  }
}

const verlVectors = loadDir(join(VECTORS, 'verl'));

test('verl partition vectors: all three functions, and partition(method verl) in domain', () => {
  const cases = verlVectors.filter(([, v]) => v.kind === 'partition');
  assert.ok(cases.length >= 36, `expected the 36 verl partition vectors, found ${cases.length}`);
  for (const [name, v] of cases) {
    const { seqlen_list: seqlens, k_partitions: k, equal_size: equal } = v.input;
    for (const fn of ['karmarkar_karp', 'get_seqlen_balanced_partitions', 'greedy_partition']) {
      const out = v.outputs[fn];
      const got = outcome(() => compat.verl(fn, seqlens, k, equal));
      if (out.ok) assert.deepStrictEqual(norm(got), norm(['ok', out.result]), `${name}: ${fn}`);
      else assert.deepStrictEqual(got.slice(0, 2), ['err', out.error_type], `${name}: ${fn}`);
    }
    const out = v.outputs.get_seqlen_balanced_partitions;
    if (out.ok && seqlens.every((s) => s >= 0)) {
      const p = stowplan.partition(seqlens, k, { method: 'verl', equalSize: equal, refine: false });
      assert.deepStrictEqual(norm(p.groups), norm(out.result), `${name}: partition(verl)`);
    }
  }
});

test("verl log_unbalance vectors and the partition vectors' recorded stats", () => {
  let checked = 0;
  for (const [name, v] of verlVectors) {
    const cases = [];
    if (v.kind === 'log_unbalance') {
      cases.push([v.input.seqlen_list, v.input.partitions, v.outputs.log_seqlen_unbalance]);
    } else if (v.kind === 'partition') {
      for (const [fn, stats] of Object.entries(v.stats ?? {})) {
        const want = stats.verl_log_seqlen_unbalance;
        if (!want || !v.outputs[fn].ok) continue;
        cases.push([v.input.seqlen_list, v.outputs[fn].result, 'ok' in want ? want : { ok: true, result: want }]);
      }
    }
    for (const [seqlens, parts, want] of cases) {
      const got = outcome(() => compat.logSeqlenUnbalance(BigInt64Array.from(seqlens, BigInt), parts));
      if (want.ok) assert.deepStrictEqual(norm(got), norm(['ok', want.result]), name);
      else assert.deepStrictEqual(got, ['err', want.error_type, want.error], name);
      checked++;
    }
  }
  assert.ok(checked >= 30, `checked ${checked}`);
});

test('verl micro_batch vectors (rearrange_micro_batches): same lists in the same order, or the same exception', () => {
  const cases = verlVectors.filter(([, v]) => v.kind === 'micro_batch');
  assert.ok(cases.length >= 14, `expected the 14 verl micro_batch vectors, found ${cases.length}`);
  for (const [name, v] of cases) {
    const i = v.input;
    const out = v.outputs.rearrange_micro_batches;
    const got = outcome(() =>
      compat.verlRearrangeMicroBatches(i.seqlen_list, i.max_token_len, {
        minNumMicroBatch: i.min_num_micro_batch,
        numBatchesDividedBy: i.num_batches_divided_by,
        useDynamicBszBalance: i.use_dynamic_bsz_balance ?? true,
        forceGroupSize: i.force_group_size ?? 1,
        paddedWidth: i.padded_width,
        dpNumMicroBatches: i.dp_num_micro_batches,
      }),
    );
    assert.deepStrictEqual(norm(got), norm(out.ok ? ['ok', out.result] : ['err', out.error_type, out.error]), name);
  }
});

test('verl balance_batch vectors (_balance_batch): partitions, global_idx and the logged stats', () => {
  const cases = verlVectors.filter(([, v]) => v.kind === 'balance_batch');
  assert.ok(cases.length >= 1);
  for (const [name, v] of cases) {
    const i = v.input;
    const r = compat.balanceBatch(i.seqlen_list, i.dp_size, { minibatchSize: i.keep_minibatch ? i.minibatch_size : undefined });
    const stats = compat.logSeqlenUnbalance(BigInt64Array.from(i.seqlen_list, BigInt), r.partitions, i.prefix ?? 'global_seqlen');
    const got = { partitions: r.partitions, global_idx: r.partitions.flat(), stats };
    assert.deepStrictEqual(norm(got), norm(v.outputs.balance_batch.result), name);
  }
});

test('ROLL vectors: load_balance, batch_balance, pad_factor and cp_zigzag where stowplan models them', () => {
  const vectors = loadDir(join(VECTORS, 'roll'));
  let checked = 0;
  let skipped = 0;
  for (const [name, v] of vectors) {
    const i = v.input;
    const want = v.output;
    const wantErr = v.error ? ['err', v.error.type, v.error.message] : null;
    if (v.kind === 'load_balance') {
      // ROLL's algorithm-name dispatch and missing-DP-group assertion configure ROLL's packer
      // class; stowplan does not model them (as in tests/lib.rs).
      if ('algorithm' in i || 'dp_group_none' in i) {
        skipped++;
        continue;
      }
      const peers = i.dp_peer_num_micro_batches;
      const got = outcome(() => {
        const r = compat.rollLoadBalance(i.lengths, i.mask_width, i.max_packed_sequence_length, {
          minNumMicroBatches: i.min_num_micro_batches ?? 1,
          tp: i.tp ?? 1,
          cp: i.cp ?? 1,
          vp: i.vp ?? 1,
          dpNumMicroBatches: peers ? peers.reduce((a, b) => (b > a ? b : a), 0) : undefined,
        });
        const order = r.microBatches.flat();
        const restored = new Array(order.length);
        order.forEach((idx, pos) => (restored[idx] = pos));
        return {
          micro_batches: r.microBatches,
          num_micro_batches: r.microBatches.length,
          kk_partitions: r.kkPartitions,
          restored_positions: restored,
          pad_factor: r.padFactor,
          padded_lengths: r.paddedLengths,
        };
      });
      const expected = wantErr ?? [
        'ok',
        {
          micro_batches: want.micro_batches,
          num_micro_batches: want.num_micro_batches,
          kk_partitions: want.kk_partitions,
          restored_positions: want.restored_positions,
          pad_factor: want.derived.pad_factor,
          padded_lengths: want.derived.padded_lengths,
        },
      ];
      assert.deepStrictEqual(norm(got), norm(expected), name);
    } else if (v.kind === 'batch_balance') {
      const got = outcome(() => {
        const r = compat.balanceBatch(i.lengths, i.dp_size, { minibatchSize: i.keep_minibatch ? i.minibatch_size : undefined });
        return {
          global_idx: r.partitions.flat(),
          rank_partitions: r.partitions,
          kk_partitions: r.kkPartitions,
          metrics: compat.logSeqlenUnbalance(BigInt64Array.from(i.lengths, BigInt), r.partitions),
          dropped: r.dropped,
        };
      });
      assert.deepStrictEqual(norm(got), norm(wantErr ?? ['ok', want]), name);
    } else if (v.kind === 'pad_factor') {
      // ROLL treats cp = 0 as no CP and gives 0 for tp = 0; stowplan refuses both.
      if (i.cp === 0 || i.tp === 0) {
        skipped++;
        continue;
      }
      const f = stowplan.padFactor({ cp: i.cp, tp: i.tp, align: 'roll' });
      assert.equal(f, BigInt(want.sequence_packing_pad_factor), name);
    } else if (v.kind === 'cp_zigzag') {
      // ROLL's pad_packed_seq_to (the last sequence takes the rest) is compat.roll's, in Python.
      if (i.pad_packed_seq_to !== undefined) {
        skipped++;
        continue;
      }
      const align = i.pad_factor_override ?? 'roll';
      const run = () => stowplan.cpLayout(i.lengths, { cp: i.cp, tp: i.tp ?? 1, align });
      if (wantErr) assert.throws(run, stowplan.InvalidArgumentError, name);
      else assert.deepStrictEqual(norm(run().cuSeqlensPadded), norm(want.cu_seqlens_padded), name);
    } else {
      skipped++;
      continue;
    }
    checked++;
  }
  // As the Rust runner: of the load_balance/batch_balance cases, 3 configure ROLL's packer.
  assert.ok(checked >= 26 + 2 + 3, `checked ${checked} ROLL vectors (skipped ${skipped})`);
});
