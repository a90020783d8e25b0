// slime's micro-batch scheduling (THUDM/slime at 624b824a: `first_fit_pack`,
// `expand_bins_by_splitting`, `get_seqlen_balanced_partitions` on FLOPs, `calculate_fwd_flops`,
// `build_dp_schedule`) as the kernel's `slime` interface reproduces it — the same functions
// the Python SDK's `stowplan.compat.slime` runs. Re-exported by `stowplan/compat`.
//
// Failures: slime's assertions are a PeerError of type `AssertionError` with slime's message;
// an attribute slime would read and `args` lacks is a PeerError of type `AttributeError`
// (message: the attribute's name); arguments outside what slime handles are an
// InvalidArgumentError naming the argument.
import { InvalidArgumentError, PeerError } from './errors.js';
import { internal, stowplan } from './index.js';

const { call, u32, i64, i64Array, u64Array, bool, lists } = internal;

/** Flat groups as arrays of numbers. */
function arrays(g) {
  return lists(g.offsets, g.indices).map((l) => Array.from(l));
}

/** Runs a slime call: the kernel's slime-error becomes slime's failure. */
function slimeCall(f, kernel) {
  return call(() => {
    try {
      return f(kernel.kernel.slime);
    } catch (e) {
      const p = e?.payload;
      if (p && p.tag === 'assertion-error') throw new PeerError('AssertionError', p.val);
      if (p && p.tag === 'missing-attribute') throw new PeerError('AttributeError', p.val);
      if (p && p.tag === 'invalid-argument') throw new InvalidArgumentError(p.val);
      throw e;
    }
  });
}

/** The model attributes `calculate_fwd_flops` may read (Megatron's names). */
const MODEL_ATTRS = [
  'hidden_size', 'num_attention_heads', 'num_query_groups', 'vocab_size', 'ffn_hidden_size', 'num_experts',
  'num_layers', 'kv_channels', 'moe_ffn_hidden_size', 'moe_router_topk', 'moe_shared_expert_intermediate_size',
  'q_lora_rank', 'kv_lora_rank', 'qk_head_dim', 'qk_pos_emb_head_dim', 'v_head_dim',
];

const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

/** One attribute of `args` (an object with slime's snake_case names) for the kernel. */
function arg(args, name) {
  if (!(name in args) || args[name] === undefined) return { tag: 'missing' };
  if (args[name] === null) return { tag: 'is-none' };
  return { tag: 'value', val: i64(args[name], `args.${name}`) };
}

/** The kernel's flops-args from slime-style `args` (absent keys: absent attributes). */
function flopsArgs(args) {
  if (args === null || typeof args !== 'object') throw new InvalidArgumentError('args must be an object');
  const out = {};
  for (const name of MODEL_ATTRS) out[camel(name)] = arg(args, name);
  const f = args.moe_layer_freq;
  if (!('moe_layer_freq' in args) || f === undefined) out.moeLayerFreq = { tag: 'missing' };
  else if (Array.isArray(f)) out.moeLayerFreq = { tag: 'pattern', val: i64Array(f, 'args.moe_layer_freq') };
  else out.moeLayerFreq = { tag: 'every', val: i64(f, 'args.moe_layer_freq') };
  out.multiLatentAttention = Boolean(args.multi_latent_attention);
  return out;
}

/**
 * slime's `first_fit_pack(total_lengths, max_tokens_per_bin)`: each length in input order (no
 * sorting) to the first bin whose sum plus the length is at most the cap, else a new bin.
 * @param {any} totalLengths @param {number | bigint} maxTokensPerBin
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {number[][]}
 */
export function slimeFirstFitPack(totalLengths, maxTokensPerBin, kernel = stowplan) {
  const l = i64Array(totalLengths, 'total_lengths');
  const cap = i64(maxTokensPerBin, 'max_tokens_per_bin');
  return arrays(slimeCall((s) => s.firstFitPack(l, cap), kernel));
}

/**
 * slime's `expand_bins_by_splitting(bins, target_count, lengths)`: the bins after the call
 * (slime works in place; this returns new arrays).
 * @param {number[][]} bins @param {number | bigint} targetCount @param {any} lengths
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {number[][]}
 */
export function slimeExpandBins(bins, targetCount, lengths, kernel = stowplan) {
  const offsets = [0];
  const indices = [];
  bins.forEach((b, i) => {
    for (const x of b) indices.push(u32(x, `bins[${i}]`));
    offsets.push(indices.length);
  });
  const g = { offsets: Uint32Array.from(offsets), indices: Uint32Array.from(indices) };
  const t = i64(targetCount, 'target_count');
  const l = i64Array(lengths, 'lengths');
  return arrays(slimeCall((s) => s.expandBinsBySplitting(g, t, l), kernel));
}

/**
 * slime's `get_seqlen_balanced_partitions` on float weights (the FLOPs `build_dp_schedule`
 * balances): verl's KK with float set sums; integer lengths: use `verl(...)`.
 * @param {number[] | Float64Array} weights @param {number} kPartitions @param {boolean} equalSize
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {number[][]}
 */
export function slimeBalancedPartitions(weights, kPartitions, equalSize, kernel = stowplan) {
  const w = Float64Array.from(weights, (x, i) => {
    if (typeof x !== 'number') throw new InvalidArgumentError(`seqlen_list[${i}] must be a number`);
    return x;
  });
  const k = u32(kPartitions, 'k_partitions');
  const eq = bool(equalSize, 'equal_size');
  return arrays(slimeCall((s) => s.getSeqlenBalancedPartitions(w, k, eq), kernel));
}

/**
 * slime's `calculate_fwd_flops(seqlens, args)`, bit for bit: a number, or a bigint when no
 * layer term is added (Python's int). `args` holds slime's attribute names.
 * @param {any} seqlens @param {Record<string, any>} args
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {number | bigint}
 */
export function slimeFwdFlops(seqlens, args, kernel = stowplan) {
  const s = u64Array(seqlens, 'seqlens');
  const a = flopsArgs(args);
  const f = slimeCall((k) => k.calculateFwdFlops(s, a), kernel);
  if (f.tag === 'floating') return f.val;
  const [hi, lo] = f.val;
  return (BigInt(hi) << 64n) | BigInt(lo);
}

/**
 * slime's `build_dp_schedule(args, train_parallel_config, total_lengths,
 * global_batch_size=…, rollout_indices=…)`: `[partitions, micro_batch_indices,
 * num_microbatches, global_batch_sizes]` exactly. `args` and `trainParallelConfig` use slime's
 * snake_case names; rollout ids may be any values (grouped like a JavaScript Map groups them,
 * in first-occurrence order). `pythonSum` is the float sum of the Python whose slime is
 * reproduced: `'neumaier'` (CPython 3.12 and later, the default) or `'naive'` (3.11 and
 * earlier).
 * @param {Record<string, any>} args @param {Record<string, any>} trainParallelConfig
 * @param {any} totalLengths
 * @param {{globalBatchSize: number | bigint, rolloutIndices: any[], pythonSum?: 'naive' | 'neumaier'}} opts
 * @param {import('./index.js').Stowplan} [kernel]
 * @returns {[number[][], number[][][], number[], number[]]}
 */
export function slimeBuildDpSchedule(args, trainParallelConfig, totalLengths, opts, kernel = stowplan) {
  const tp = trainParallelConfig;
  const dynamic = Boolean(args.use_dynamic_batch_size);
  const opt = (v, name) => (v === null || v === undefined ? undefined : i64(v, name));
  const ids = new Map();
  const dense = BigInt64Array.from(opts.rolloutIndices, (r) => {
    if (!ids.has(r)) ids.set(r, BigInt(ids.size));
    return ids.get(r);
  });
  const pythonSum = opts.pythonSum ?? 'neumaier';
  if (pythonSum !== 'naive' && pythonSum !== 'neumaier') {
    throw new InvalidArgumentError(`pythonSum must be 'naive' or 'neumaier' (got ${JSON.stringify(pythonSum)})`);
  }
  const a = {
    microBatchSize: dynamic ? undefined : opt(args.micro_batch_size, 'args.micro_batch_size'),
    useDynamicBatchSize: dynamic,
    maxTokensPerGpu: dynamic ? opt(args.max_tokens_per_gpu, 'args.max_tokens_per_gpu') : undefined,
    balanceData: Boolean(args.balance_data),
    balanceByFlops: Boolean(args.balance_by_flops),
    dpSize: i64(tp.dp_size, "train_parallel_config['dp_size']"),
    cpSize: i64(tp.cp_size, "train_parallel_config['cp_size']"),
    vppSize: i64(tp.vpp_size, "train_parallel_config['vpp_size']"),
    microbatchGroupSizePerVpStage: i64(
      tp.microbatch_group_size_per_vp_stage,
      "train_parallel_config['microbatch_group_size_per_vp_stage']",
    ),
    globalBatchSize: i64(opts.globalBatchSize, 'global_batch_size'),
    pythonSum,
  };
  const lengths = i64Array(totalLengths, 'total_lengths');
  const model = flopsArgs(args);
  const s = slimeCall((k) => k.buildDpSchedule(a, model, lengths, dense), kernel);
  const partitions = arrays(s.partitions);
  const mbi = arrays(s.microBatchSizes).map((sizes) => {
    let start = 0;
    return sizes.map((n) => {
      const r = Array.from({ length: n }, (_, j) => start + j);
      start += n;
      return r;
    });
  });
  const gbs = Number(a.globalBatchSize);
  return [partitions, mbi, Array.from(s.numMicrobatches), Array.from({ length: s.numSteps }, () => gbs)];
}
