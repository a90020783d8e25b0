//! Glue between the WIT exports and `stowplan-kernel`.

extern crate alloc;

use alloc::vec::Vec;

use stowplan_kernel as k;

wit_bindgen::generate!({
    path: "../../wit",
    world: "kernel",
});

use exports::stowplan::kernel::{
    balance, layout, multi_micro, multi_pack, multi_plan, multimodal, pack, pack_compact, partition, peers, plan,
    shuffle, streaming as stream, types, verl,
};

#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    // The kernel returns errors as values; a panic is a bug and traps the instance.
    core::arch::wasm32::unreachable()
}

mod multi_stream;
mod slime;

struct Kernel;

mod prime_rl;

fn error(e: k::Error) -> types::Error {
    match e {
        k::Error::InvalidArgument(m) => types::Error::InvalidArgument(m),
        k::Error::Infeasible(m) => types::Error::Infeasible(m),
    }
}

fn groups_of(parts: Vec<Vec<u32>>) -> types::Groups {
    let (offsets, indices) = k::flatten(&parts);
    types::Groups { offsets, indices }
}

impl partition::Guest for Kernel {
    fn partition(
        weights: Vec<u64>,
        kk: u32,
        options: partition::Options,
    ) -> Result<partition::Partitioning, types::Error> {
        let method = match options.method {
            partition::Method::Kk => k::PartitionMethod::Kk,
            partition::Method::Greedy => k::PartitionMethod::Greedy,
            partition::Method::Verl => k::PartitionMethod::Verl,
        };
        let opts = k::PartitionOptions { method, equal_size: options.equal_size, refine: options.refine };
        let r = k::partition(&weights, kk, &opts).map_err(error)?;
        Ok(partition::Partitioning {
            groups: types::Groups { offsets: r.offsets, indices: r.indices },
            sums: r.sums,
            total: r.total,
            spread: r.spread,
            lower_bound: r.lower_bound,
        })
    }
}

fn method_of(m: pack::Method) -> k::PackMethod {
    match m {
        pack::Method::Bfd => k::PackMethod::Bfd,
        pack::Method::Ffd => k::PackMethod::Ffd,
        pack::Method::NextFit => k::PackMethod::NextFit,
    }
}

fn packing_of(r: k::Packing) -> pack::Packing {
    pack::Packing {
        bins: types::Groups { offsets: r.offsets, indices: r.indices },
        loads: r.loads,
        dropped: r.dropped,
        single: r.single,
        real_tokens: r.real_tokens,
        aligned_tokens: r.aligned_tokens,
        lower_bound: r.lower_bound,
    }
}

impl pack::Guest for Kernel {
    fn pack(lengths: Vec<u64>, options: pack::Options) -> Result<pack::Packing, types::Error> {
        let opts = k::PackOptions {
            capacity: options.capacity,
            align: options.align,
            method: method_of(options.method),
            oversize: oversize_of(options.oversize),
        };
        k::pack(&lengths, &opts).map(packing_of).map_err(error)
    }
}

impl multi_pack::Guest for Kernel {
    fn pack(sizes: Vec<u64>, options: multi_pack::Options) -> Result<multi_pack::MultiPacking, types::Error> {
        let opts = k::MultiOptions {
            capacities: &options.capacities,
            names: &options.names,
            max_segments: options.max_segments,
            align: options.align,
            method: multi_method(options.method),
            oversize: oversize_of(options.oversize),
        };
        let r = k::pack_multi(&sizes, &opts).map_err(error)?;
        Ok(multi_pack::MultiPacking {
            packing: packing_of(r.packing),
            resource_loads: r.resource_loads,
            lower_bounds: r.lower_bounds,
        })
    }
}

fn multi_method(m: multi_pack::MultiMethod) -> k::MultiMethod {
    match m {
        multi_pack::MultiMethod::Balanced => k::MultiMethod::Balanced,
        multi_pack::MultiMethod::Bfd => k::MultiMethod::Bfd,
        multi_pack::MultiMethod::Ffd => k::MultiMethod::Ffd,
        multi_pack::MultiMethod::NextFit => k::MultiMethod::NextFit,
    }
}

impl multi_plan::Guest for Kernel {
    fn raw_plan(
        lengths: Vec<u64>,
        options: plan::PlanOptions,
        limits: multi_plan::PlanLimits,
    ) -> Result<multi_plan::LimitedRawPlan, types::Error> {
        let l = &limits.limits;
        let limits = k::PlanLimits {
            limits: k::MicroLimits { sizes: &l.sizes, caps: &l.caps, names: &l.names },
            max_segments: limits.max_segments,
            method: multi_method(limits.method),
        };
        let r = k::raw_plan_limited(&lengths, &plan_options(options), &limits).map_err(error)?;
        Ok(multi_plan::LimitedRawPlan { plan: raw_pack_plan(r.raw), loads: r.loads, lower_bounds: r.lower_bounds })
    }
}

impl multi_micro::Guest for Kernel {
    fn micro_batches(
        lengths: Vec<u64>,
        extra_costs: Option<Vec<u64>>,
        limits: multi_micro::Limits,
        options: balance::MicroOptions,
    ) -> Result<multi_micro::LimitedMicroPlan, types::Error> {
        let l = k::MicroLimits { sizes: &limits.sizes, caps: &limits.caps, names: &limits.names };
        let r =
            k::micro_batches_limited(&lengths, extra_costs.as_deref(), &l, &micro_options(options)).map_err(error)?;
        Ok(multi_micro::LimitedMicroPlan { plan: micro_plan(r.plan), loads: r.loads, lower_bounds: r.lower_bounds })
    }

    fn plan(
        lengths: Vec<u64>,
        extra_costs: Option<Vec<u64>>,
        limits: multi_micro::Limits,
        dp: u32,
        dp_opts: balance::DpOptions,
        micro: balance::MicroOptions,
    ) -> Result<balance::TwoLevel, types::Error> {
        let l = k::MicroLimits { sizes: &limits.sizes, caps: &limits.caps, names: &limits.names };
        let o = k::DpOptions { extra_costs: extra_costs.as_deref(), ..dp_options(&dp_opts) };
        let p = k::plan_limited(&lengths, dp, &o, &micro_options(micro), &l).map_err(error)?;
        Ok(balance::TwoLevel { dp: dp_plan(p.dp), ranks: p.ranks.into_iter().map(micro_plan).collect() })
    }
}

impl verl::Guest for Kernel {
    fn call(
        function: verl::Function,
        seqlens: Vec<i64>,
        kk: u32,
        equal_size: bool,
    ) -> Result<types::Groups, verl::PyError> {
        let r = match function {
            verl::Function::KarmarkarKarp => k::verl::karmarkar_karp(&seqlens, kk, equal_size),
            verl::Function::GreedyPartition => k::verl::greedy_partition(&seqlens, kk, equal_size),
            verl::Function::GetSeqlenBalancedPartitions => {
                k::verl::get_seqlen_balanced_partitions(&seqlens, kk, equal_size)
            }
        };
        r.map(groups_of).map_err(|e| match e {
            k::verl::PyError::AssertionError(m) => verl::PyError::AssertionError(m),
            k::verl::PyError::IndexError(m) => verl::PyError::IndexError(m),
            k::verl::PyError::TypeError(m) => verl::PyError::TypeError(m),
            k::verl::PyError::ZeroDivisionError(m) => verl::PyError::ZeroDivisionError(m),
            k::verl::PyError::MemoryError(m) => verl::PyError::MemoryError(m),
            // Not raised by these three functions (only by the `peers` entry points).
            k::verl::PyError::ValueError(m) => verl::PyError::AssertionError(m),
        })
    }
}

fn cost(c: balance::Cost) -> k::Cost {
    k::Cost { linear: c.linear, quadratic: c.quadratic }
}

fn micro_options(o: balance::MicroOptions) -> k::MicroOptions {
    k::MicroOptions {
        max_token_len: o.max_token_len,
        cost: cost(o.cost),
        min_count: o.min_count,
        divisible_by: o.divisible_by,
        count: o.count,
        order: match o.order {
            balance::Order::None => k::Order::None,
            balance::Order::CostDesc => k::Order::CostDesc,
            balance::Order::Verl => k::Order::Verl,
            balance::Order::Roll => k::Order::Roll,
        },
    }
}

fn dp_options(o: &balance::DpOptions) -> k::DpOptions<'_> {
    k::DpOptions {
        cost: cost(o.cost),
        groups: o.groups.as_deref(),
        minibatch_size: o.minibatch_size,
        equal_count: o.equal_count,
        extra_costs: None,
    }
}

fn micro_plan(p: k::MicroPlan) -> balance::MicroPlan {
    balance::MicroPlan {
        batches: types::Groups { offsets: p.offsets, indices: p.indices },
        tokens: p.tokens,
        costs: p.costs,
        restore: p.restore,
        lower_bound: p.lower_bound,
        required: p.required,
    }
}

fn dp_plan(p: k::DpPlan) -> balance::DpPlan {
    balance::DpPlan {
        ranks: types::Groups { offsets: p.offsets, indices: p.order },
        tokens: p.tokens,
        costs: p.costs,
        cost_lower_bound: p.cost_lower_bound,
    }
}

impl balance::Guest for Kernel {
    fn micro_batches(lengths: Vec<u64>, options: balance::MicroOptions) -> Result<balance::MicroPlan, types::Error> {
        k::micro_batches(&lengths, &micro_options(options)).map(micro_plan).map_err(error)
    }

    fn balance_dp(lengths: Vec<u64>, dp: u32, options: balance::DpOptions) -> Result<balance::DpPlan, types::Error> {
        k::balance_dp(&lengths, dp, &dp_options(&options)).map(dp_plan).map_err(error)
    }

    fn plan(
        lengths: Vec<u64>,
        dp: u32,
        dp_opts: balance::DpOptions,
        micro: balance::MicroOptions,
    ) -> Result<balance::TwoLevel, types::Error> {
        let p = k::plan(&lengths, dp, &dp_options(&dp_opts), &micro_options(micro)).map_err(error)?;
        Ok(balance::TwoLevel { dp: dp_plan(p.dp), ranks: p.ranks.into_iter().map(micro_plan).collect() })
    }
}

fn py_error(e: k::verl::PyError) -> peers::PyError {
    peers::PyError { exception: e.type_name().into(), message: e.message().into() }
}

impl peers::Guest for Kernel {
    fn verl_rearrange_micro_batches(
        seqlens: Vec<i64>,
        o: peers::VerlMicroOptions,
    ) -> Result<types::Groups, peers::PyError> {
        let opts = k::peers::VerlMicroOptions {
            max_token_len: o.max_token_len,
            min_num_micro_batch: o.min_num_micro_batch,
            num_batches_divided_by: o.num_batches_divided_by,
            use_dynamic_bsz_balance: o.use_dynamic_bsz_balance,
            force_group_size: o.force_group_size,
            padded_width: o.padded_width,
            dp_num_micro_batches: o.dp_num_micro_batches,
        };
        k::peers::verl_rearrange_micro_batches(&seqlens, &opts).map(groups_of).map_err(py_error)
    }

    fn balance_batch(
        seqlens: Vec<i64>,
        dp: u32,
        minibatch_size: Option<i64>,
    ) -> Result<peers::DpReorder, peers::PyError> {
        let r = k::peers::balance_batch(&seqlens, dp, minibatch_size).map_err(py_error)?;
        Ok(peers::DpReorder {
            partitions: groups_of(r.partitions),
            kk_partitions: r.kk_partitions.into_iter().map(groups_of).collect(),
            dropped: r.dropped,
        })
    }

    fn roll_load_balance(lengths: Vec<i64>, o: peers::RollOptions) -> Result<peers::RollMicroBatches, peers::PyError> {
        let opts = k::peers::RollLoadBalanceOptions {
            mask_width: o.mask_width,
            max_packed_sequence_length: o.max_packed_sequence_length,
            min_num_micro_batches: o.min_num_micro_batches,
            tp: o.tp,
            cp: o.cp,
            vp: o.vp,
            dp_num_micro_batches: o.dp_num_micro_batches,
        };
        let r = k::peers::roll_load_balance(&lengths, &opts).map_err(py_error)?;
        Ok(peers::RollMicroBatches {
            micro_batches: groups_of(r.micro_batches),
            kk_partitions: groups_of(r.kk_partitions),
            pad_factor: r.pad_factor,
            padded_lengths: r.padded_lengths,
        })
    }
}

fn align_options(o: layout::AlignOptions) -> k::AlignOptions {
    let factor = match o.factor {
        layout::Factor::CpTp => k::Factor::CpTp,
        layout::Factor::Roll => k::Factor::Roll,
        layout::Factor::Multiple(m) => k::Factor::Multiple(m),
    };
    k::AlignOptions { cp: o.cp, tp: o.tp, factor, power_of_two: o.power_of_two }
}

impl layout::Guest for Kernel {
    fn pad_factor(options: layout::AlignOptions) -> Result<u64, types::Error> {
        k::pad_factor(&align_options(options)).map_err(error)
    }

    fn cp_layout(lengths: Vec<u64>, options: layout::AlignOptions) -> Result<layout::CpSplit, types::Error> {
        let l = k::cp_layout(&lengths, &align_options(options)).map_err(error)?;
        Ok(layout::CpSplit {
            factor: l.factor,
            cu_seqlens: l.cu_seqlens,
            cu_seqlens_padded: l.cu_seqlens_padded,
            max_seqlen: l.max_seqlen,
            max_seqlen_padded: l.max_seqlen_padded,
            run_offsets: l.run_offsets,
            run_starts: l.run_starts,
            run_lengths: l.run_lengths,
            local_bounds: l.local_bounds,
            rank_real_tokens: l.rank_real_tokens,
        })
    }

    fn prime_rl_ffd(
        lengths: Vec<u64>,
        runs: Vec<u32>,
        labels: Vec<u32>,
        seq_len: u64,
    ) -> Result<(types::Groups, Vec<u32>), types::Error> {
        let (bins, dropped) = k::prime_rl_ffd(&lengths, &runs, &labels, seq_len).map_err(error)?;
        Ok((groups_of(bins), dropped))
    }

    fn distribute(lengths: Vec<u64>, o: layout::DistributeOptions) -> Result<layout::Distribution, types::Error> {
        distribute_with(&lengths, None, &o)
    }
}

/// `layout.distribute` and `multimodal.distribute`.
fn distribute_with(
    lengths: &[u64],
    extra: Option<&[u64]>,
    o: &layout::DistributeOptions,
) -> Result<layout::Distribution, types::Error> {
    let opts = k::DistributeOptions {
        capacity: o.capacity,
        dp: o.dp,
        cost: k::Cost { linear: o.cost.linear, quadratic: o.cost.quadratic },
        padding: match o.padding {
            layout::Padding::PerSequence(m) => k::Padding::PerSequence(m),
            layout::Padding::PerMicroBatch(m) => k::Padding::PerMicroBatch(m),
        },
        runs: o.runs.as_deref(),
        mix_runs: o.mix_runs,
        extra_costs: extra,
    };
    let d = k::distribute(lengths, &opts).map_err(error)?;
    Ok(layout::Distribution {
        per_rank: d.per_rank,
        batches: types::Groups { offsets: d.offsets, indices: d.indices },
        tokens: d.tokens,
        real_tokens: d.real_tokens,
        costs: d.costs,
        rank_costs: d.rank_costs,
        packed: d.packed,
        splits: d.splits,
        dummies: d.dummies,
        lower_bound: d.lower_bound,
    })
}

impl multimodal::Guest for Kernel {
    fn micro_batches(
        lengths: Vec<u64>,
        extra: Vec<u64>,
        options: balance::MicroOptions,
    ) -> Result<balance::MicroPlan, types::Error> {
        k::micro_batches_with_extra(&lengths, Some(&extra), &micro_options(options)).map(micro_plan).map_err(error)
    }

    fn balance_dp(
        lengths: Vec<u64>,
        extra: Vec<u64>,
        dp: u32,
        options: balance::DpOptions,
    ) -> Result<balance::DpPlan, types::Error> {
        let o = k::DpOptions { extra_costs: Some(&extra), ..dp_options(&options) };
        k::balance_dp(&lengths, dp, &o).map(dp_plan).map_err(error)
    }

    fn plan(
        lengths: Vec<u64>,
        extra: Vec<u64>,
        dp: u32,
        dp_opts: balance::DpOptions,
        micro: balance::MicroOptions,
    ) -> Result<balance::TwoLevel, types::Error> {
        let o = k::DpOptions { extra_costs: Some(&extra), ..dp_options(&dp_opts) };
        let p = k::plan(&lengths, dp, &o, &micro_options(micro)).map_err(error)?;
        Ok(balance::TwoLevel { dp: dp_plan(p.dp), ranks: p.ranks.into_iter().map(micro_plan).collect() })
    }

    fn distribute(
        lengths: Vec<u64>,
        extra: Vec<u64>,
        options: layout::DistributeOptions,
    ) -> Result<layout::Distribution, types::Error> {
        distribute_with(&lengths, Some(&extra), &options)
    }
}

export!(Kernel);

/// The canonical ABI's allocation hook, backed by the global allocator.
///
/// # Safety
/// Called by the component runtime with a pointer previously returned here (or `old_len`
/// 0), and a power-of-two `align`.
#[unsafe(no_mangle)]
unsafe extern "C" fn cabi_realloc(old_ptr: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use alloc::alloc::{Layout, alloc, realloc};
    if new_len == 0 {
        return align as *mut u8;
    }
    // SAFETY: the runtime passes a valid power-of-two alignment and, for `old_len > 0`, a
    // block allocated here with that layout.
    let ptr = unsafe {
        if old_len == 0 {
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(old_ptr, Layout::from_size_align_unchecked(old_len, align), new_len)
        }
    };
    if ptr.is_null() {
        // Out of linear memory: trap (the host reports it as an error).
        core::arch::wasm32::unreachable()
    }
    ptr
}

impl plan::Guest for Kernel {
    fn raw_plan(lengths: Vec<u64>, options: plan::PlanOptions) -> Result<plan::RawPackPlan, types::Error> {
        k::raw_plan(&lengths, &plan_options(options)).map(raw_pack_plan).map_err(error)
    }

    fn align_plan(
        packs: types::Groups,
        world_size: u32,
        drop_last: bool,
    ) -> Result<plan::AlignedPackPlan, types::Error> {
        let a = k::aligned_plan(&packs.offsets, &packs.indices, world_size, drop_last).map_err(error)?;
        let checksum = a.checksum_hex();
        Ok(plan::AlignedPackPlan {
            packs: a.packs,
            pad_needed: a.pad_needed,
            dropped_packs: a.dropped_packs,
            dropped_samples: a.dropped_samples,
            checksum,
        })
    }
}

impl shuffle::Guest for Kernel {
    fn permutation(n: u64, seed: u64, epoch: u64) -> Result<Vec<u32>, types::Error> {
        k::shuffle::permutation(n, seed, epoch).map_err(error)
    }
}

fn plan_options(o: plan::PlanOptions) -> k::PlanOptions {
    k::PlanOptions { packing_length: o.packing_length, align: o.align, allow_single_long: o.allow_single_long }
}

fn raw_pack_plan(r: k::RawPlan) -> plan::RawPackPlan {
    let checksum = r.checksum_hex();
    plan::RawPackPlan {
        packs: types::Groups { offsets: r.offsets, indices: r.indices },
        tokens: r.tokens,
        single_long: r.single_long,
        dropped: r.dropped,
        real_tokens: r.real_tokens,
        aligned_tokens: r.aligned_tokens,
        lower_bound: r.lower_bound,
        checksum,
    }
}

fn oversize_of(o: pack::Oversize) -> k::OversizePolicy {
    match o {
        pack::Oversize::Error => k::OversizePolicy::Error,
        pack::Oversize::Single => k::OversizePolicy::Single,
        pack::Oversize::Drop => k::OversizePolicy::Drop,
    }
}

impl pack_compact::Guest for Kernel {
    fn next_fit(
        lengths: Vec<u32>,
        capacity: u64,
        align: u64,
        oversize: pack::Oversize,
    ) -> Result<pack_compact::NextFitRuns, types::Error> {
        let o = k::PackOptions { capacity, align, method: k::PackMethod::NextFit, oversize: oversize_of(oversize) };
        let r = k::next_fit_runs(&lengths, &o).map_err(error)?;
        Ok(pack_compact::NextFitRuns {
            starts: r.starts,
            loads: r.loads,
            dropped: r.dropped,
            single: r.single,
            real_tokens: r.real_tokens,
            aligned_tokens: r.aligned_tokens,
            lower_bound: r.lower_bound,
        })
    }
}

/// A streaming packer behind the `stream.packer` resource (methods take `&self`).
struct StreamPacker(core::cell::RefCell<k::StreamPacker>);

impl stream::Guest for Kernel {
    type Packer = StreamPacker;
}

fn stream_options(o: stream::Options) -> k::StreamOptions {
    k::StreamOptions {
        capacity: o.capacity,
        align: o.align,
        max_open_bins: o.max_open_bins,
        max_buffered: o.max_buffered,
        oversize: oversize_of(o.oversize),
    }
}

fn options_of(o: &k::StreamOptions) -> stream::Options {
    let oversize = match o.oversize {
        k::OversizePolicy::Error => pack::Oversize::Error,
        k::OversizePolicy::Single => pack::Oversize::Single,
        k::OversizePolicy::Drop => pack::Oversize::Drop,
    };
    stream::Options {
        capacity: o.capacity,
        align: o.align,
        max_open_bins: o.max_open_bins,
        max_buffered: o.max_buffered,
        oversize,
    }
}

fn status_of(s: k::StreamStatus) -> stream::Status {
    stream::Status {
        next_index: s.next_index,
        buffered: s.buffered,
        open_bins: s.open_bins,
        in_open_bins: s.in_open_bins,
        oldest_held: s.oldest_held,
    }
}

fn closed_of(c: k::Closed) -> stream::Closed {
    stream::Closed { offsets: c.offsets, indices: c.indices, loads: c.loads, dropped: c.dropped }
}

impl stream::GuestPacker for StreamPacker {
    fn create(options: stream::Options) -> Result<stream::Packer, types::Error> {
        let p = k::StreamPacker::new(stream_options(options)).map_err(error)?;
        Ok(stream::Packer::new(StreamPacker(core::cell::RefCell::new(p))))
    }

    fn restore(state: Vec<u8>) -> Result<stream::Packer, types::Error> {
        let p = k::StreamPacker::restore(&state).map_err(error)?;
        Ok(stream::Packer::new(StreamPacker(core::cell::RefCell::new(p))))
    }

    fn add(&self, lengths: Vec<u64>) -> Result<stream::Closed, types::Error> {
        self.0.borrow_mut().add(&lengths).map(closed_of).map_err(error)
    }

    fn finish(&self) -> stream::Closed {
        closed_of(self.0.borrow_mut().finish())
    }

    fn save(&self) -> Vec<u8> {
        self.0.borrow().save()
    }

    fn status(&self) -> stream::Status {
        status_of(self.0.borrow().status())
    }

    fn options(&self) -> stream::Options {
        options_of(self.0.borrow().options())
    }
}
