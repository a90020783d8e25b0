// slime's oracle vectors (tests/vectors/slime, made by running slime's own code) through
// `stowplan/compat`'s slime functions on the WASM kernel: the same bins, partitions,
// schedules and FLOPs (bit for bit), and the same failures (AssertionError messages;
// slime's incidental Python errors as InvalidArgumentError).
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import { InvalidArgumentError } from '../src/index.js';
import {
  PeerError,
  slimeBalancedPartitions,
  slimeBuildDpSchedule,
  slimeExpandBins,
  slimeFirstFitPack,
  slimeFwdFlops,
  verl,
} from '../src/compat.js';
import { VECTORS, parseExact } from './helpers.js';

const DIR = join(VECTORS, 'slime');
const FILES = readdirSync(DIR).filter((f) => f.endsWith('.json') && f !== 'index.json').sort();

const bitsOf = (x) => {
  const b = new DataView(new ArrayBuffer(8));
  b.setFloat64(0, x, true);
  return b.getBigUint64(0, true);
};

/** What stowplan returns for a vector's call, as slime's JSON output would show it. */
function run(v) {
  const inp = v.input;
  switch (v.kind) {
    case 'first_fit_pack':
      return { bins: slimeFirstFitPack(inp.lengths, inp.max_tokens_per_bin) };
    case 'expand_bins':
      return { bins: slimeExpandBins(inp.bins, inp.target_count, inp.lengths) };
    case 'kk_partition':
      return {
        partitions: inp.seqlen_list.some((x) => !Number.isInteger(x)) || inp.seqlen_list_bits
          ? slimeBalancedPartitions(inp.seqlen_list, inp.k_partitions, inp.equal_size)
          : verl('get_seqlen_balanced_partitions', inp.seqlen_list, inp.k_partitions, inp.equal_size),
      };
    case 'fwd_flops':
      return { flops: inp.seqlens.map((s) => slimeFwdFlops([s], inp.args)) };
    case 'fwd_flops_total':
      return { flops: slimeFwdFlops(inp.seqlens, inp.args) };
    case 'dp_schedule': {
      const [partitions, mbi, nmb, gbs] = slimeBuildDpSchedule(inp.args, inp.train_parallel_config, inp.total_lengths, {
        globalBatchSize: inp.global_batch_size,
        rolloutIndices: inp.rollout_indices,
        pythonSum: v.python_sum,
      });
      return { partitions, micro_batch_indices: mbi, num_microbatches: nmb, global_batch_sizes: gbs };
    }
    default:
      throw new Error(`unknown kind ${v.kind}`);
  }
}

test('every slime vector', () => {
  assert.ok(FILES.length >= 163, `expected the slime vectors, found ${FILES.length}`);
  const failures = [];
  for (const f of FILES) {
    // Exact: FLOPs bit patterns are integers beyond 2**53.
    const v = parseExact(readFileSync(join(DIR, f), 'utf8'));
    try {
      if (v.error) {
        assert.throws(
          () => run(v),
          (e) =>
            v.error.type === 'AssertionError'
              ? e instanceof PeerError && e.type === 'AssertionError' && e.message === v.error.message
              : e instanceof InvalidArgumentError,
        );
        continue;
      }
      const got = run(v);
      if (v.kind.startsWith('fwd_flops')) {
        const flops = Array.isArray(got.flops) ? got.flops : [got.flops];
        const want = Array.isArray(v.output.flops) ? v.output.flops : [v.output.flops];
        const bits = [v.output.derived.flops_bits].flat();
        flops.forEach((x, i) => {
          if (bits[i] === null) assert.equal(x, BigInt(want[i]));
          else assert.equal(bitsOf(x), BigInt(bits[i]));
        });
        continue;
      }
      const { derived, ...want } = v.output;
      assert.deepEqual(got, want);
    } catch (e) {
      failures.push(`${f}: ${e.message.slice(0, 300)}`);
    }
  }
  assert.deepEqual(failures, []);
});

test('a missing model attribute is an AttributeError naming it', () => {
  const args = { hidden_size: 16, num_attention_heads: 2, num_query_groups: 2, vocab_size: 32, ffn_hidden_size: 64, num_experts: null, num_layers: 2 };
  assert.throws(() => slimeFwdFlops([5], args), (e) => e instanceof PeerError && e.type === 'AttributeError' && e.message === 'kv_channels');
});
