//! Glue between the WIT exports and `stowplan-kernel`.

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use stowplan_kernel as k;

wit_bindgen::generate!({
    path: "../../wit",
    world: "kernel",
});

use exports::stowplan::kernel::{
    balance, layout, multi_micro, multi_pack, multi_plan, multimodal, pack, pack_compact, partition, peers, plan,
    reports, shuffle, streaming as stream, trl, types, verl,
};

// The conversions between the WIT types above and the kernel's (`stowplan_kernel::wit`).
use exports::stowplan::kernel as wit;
k::wit_conversions!(wit);

#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    // The kernel returns errors as values; a panic is a bug and traps the instance.
    core::arch::wasm32::unreachable()
}

/// The methods both streaming packer resources (`streaming.packer`, `multi-streaming.packer`)
/// share, over the resource's own type of closed bins.
macro_rules! packer_methods {
    ($closed:ty) => {
        fn add(&self, lengths: Vec<u64>) -> Result<$closed, types::Error> {
            self.0.borrow_mut().add(&lengths).map(Into::into).map_err(error)
        }

        fn finish(&self) -> $closed {
            self.0.borrow_mut().finish().into()
        }

        fn save(&self) -> Vec<u8> {
            self.0.borrow().state()
        }

        fn status(&self) -> stream::Status {
            self.0.borrow().status().into()
        }

        fn options(&self) -> stream::Options {
            (*self.0.borrow().options()).into()
        }
    };
}

mod multi_stream;
mod slime;

struct Kernel;

mod prime_rl;

fn error(e: k::Error) -> types::Error {
    e.into()
}

fn groups_of(parts: Vec<Vec<u32>>) -> types::Groups {
    parts.into()
}

impl partition::Guest for Kernel {
    fn partition(
        weights: Vec<u64>,
        kk: u32,
        options: partition::Options,
    ) -> Result<partition::Partitioning, types::Error> {
        k::partition(&weights, kk, &options.into()).map(Into::into).map_err(error)
    }
}

fn packing_of(r: k::Packing) -> pack::Packing {
    r.into()
}

impl pack::Guest for Kernel {
    fn pack(lengths: Vec<u64>, options: pack::Options) -> Result<pack::Packing, types::Error> {
        k::pack(&lengths, &options.into()).map(packing_of).map_err(error)
    }
}

impl multi_pack::Guest for Kernel {
    fn pack(sizes: Vec<u64>, options: multi_pack::Options) -> Result<multi_pack::MultiPacking, types::Error> {
        let opts = k::MultiOptions {
            capacities: &options.capacities,
            names: &options.names,
            max_segments: options.max_segments,
            align: options.align,
            method: options.method.into(),
            oversize: oversize_of(options.oversize),
        };
        let r = k::pack_multi(&sizes, &opts).map_err(error)?;
        Ok(r.into())
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
            method: limits.method.into(),
        };
        k::raw_plan_limited(&lengths, &options.into(), &limits).map(Into::into).map_err(error)
    }
}

/// The kernel's view of `multi-micro.limits`.
fn micro_limits(l: &multi_micro::Limits) -> k::MicroLimits<'_> {
    k::MicroLimits { sizes: &l.sizes, caps: &l.caps, names: &l.names }
}

impl multi_micro::Guest for Kernel {
    fn micro_batches(
        lengths: Vec<u64>,
        extra_costs: Option<Vec<u64>>,
        limits: multi_micro::Limits,
        options: balance::MicroOptions,
    ) -> Result<multi_micro::LimitedMicroPlan, types::Error> {
        let l = micro_limits(&limits);
        let r =
            k::micro_batches_limited(&lengths, extra_costs.as_deref(), &l, &micro_options(options)).map_err(error)?;
        Ok(r.into())
    }

    fn plan(
        lengths: Vec<u64>,
        extra_costs: Option<Vec<u64>>,
        limits: multi_micro::Limits,
        dp: u32,
        dp_opts: balance::DpOptions,
        micro: balance::MicroOptions,
    ) -> Result<balance::TwoLevel, types::Error> {
        let l = micro_limits(&limits);
        let o = k::DpOptions { extra_costs: extra_costs.as_deref(), ..dp_options(&dp_opts) };
        let p = k::plan_limited(&lengths, dp, &o, &micro_options(micro), &l).map_err(error)?;
        Ok(p.into())
    }

    fn distribute(
        lengths: Vec<u64>,
        extra_costs: Option<Vec<u64>>,
        limits: multi_micro::Limits,
        options: layout::DistributeOptions,
    ) -> Result<layout::Distribution, types::Error> {
        distribute_with(&lengths, extra_costs.as_deref(), Some(micro_limits(&limits)), &options)
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
            verl::Function::KarmarkarKarp => k::peers::verl::karmarkar_karp(&seqlens, kk, equal_size),
            verl::Function::GreedyPartition => k::peers::verl::greedy_partition(&seqlens, kk, equal_size),
            verl::Function::GetSeqlenBalancedPartitions => {
                k::peers::verl::get_seqlen_balanced_partitions(&seqlens, kk, equal_size)
            }
        };
        r.map(groups_of).map_err(Into::into)
    }
}

fn micro_options(o: balance::MicroOptions) -> k::MicroOptions {
    o.into()
}

fn dp_options(o: &balance::DpOptions) -> k::DpOptions<'_> {
    k::DpOptions {
        cost: o.cost.into(),
        groups: o.groups.as_deref(),
        minibatch_size: o.minibatch_size,
        equal_count: o.equal_count,
        extra_costs: None,
    }
}

impl balance::Guest for Kernel {
    fn micro_batches(lengths: Vec<u64>, options: balance::MicroOptions) -> Result<balance::MicroPlan, types::Error> {
        k::micro_batches(&lengths, &micro_options(options)).map(Into::into).map_err(error)
    }

    fn balance_dp(lengths: Vec<u64>, dp: u32, options: balance::DpOptions) -> Result<balance::DpPlan, types::Error> {
        k::balance_dp(&lengths, dp, &dp_options(&options)).map(Into::into).map_err(error)
    }

    fn plan(
        lengths: Vec<u64>,
        dp: u32,
        dp_opts: balance::DpOptions,
        micro: balance::MicroOptions,
    ) -> Result<balance::TwoLevel, types::Error> {
        let p = k::plan(&lengths, dp, &dp_options(&dp_opts), &micro_options(micro)).map_err(error)?;
        Ok(p.into())
    }

    fn figures_of(values: Vec<u64>) -> balance::Figures {
        k::Figures::of(&values).into()
    }
}

impl reports::Guest for Kernel {
    fn micro_batches_json(plan: balance::MicroPlan, sizes: reports::ResourceSizes) -> Result<String, types::Error> {
        json_text(stowplan_json::Levels::micro(&plan.into()), &sizes)
    }

    fn dp_json(plan: balance::DpPlan, lengths: Vec<u64>) -> String {
        compact(&stowplan_json::Levels::dp(&plan.into(), &lengths))
    }

    fn two_level_json(
        plan: balance::TwoLevel,
        lengths: Vec<u64>,
        sizes: reports::ResourceSizes,
    ) -> Result<String, types::Error> {
        json_text(stowplan_json::Levels::both(&plan.into(), &lengths), &sizes)
    }
}

/// The compact JSON text of `levels` with the micro-batches' loads in `sizes`.
fn json_text(levels: stowplan_json::Levels, sizes: &reports::ResourceSizes) -> Result<String, types::Error> {
    let levels = levels.with_resource_loads(&sizes.sizes, sizes.resources as usize).map_err(error)?;
    Ok(compact(&levels))
}

/// `levels` as serde_json writes it compact, as the host's CLI prints it. These reports always
/// serialize (their maps have string keys; a float that is not finite becomes null): a failure
/// would be a bug, a trap the host reports, never an empty text.
fn compact(levels: &stowplan_json::Levels) -> String {
    serde_json::to_string(levels).expect("a report serializes")
}

fn py_error(e: k::peers::verl::PyError) -> peers::PyError {
    peers::PyError { exception: e.type_name().into(), message: e.message().into() }
}

impl peers::Guest for Kernel {
    fn verl_rearrange_micro_batches(
        seqlens: Vec<i64>,
        o: peers::VerlMicroOptions,
    ) -> Result<types::Groups, peers::PyError> {
        k::peers::verl_rearrange_micro_batches(&seqlens, &o.into()).map(groups_of).map_err(py_error)
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
        k::peers::roll_load_balance(&lengths, &o.into()).map(Into::into).map_err(py_error)
    }

    fn log_seqlen_unbalance(
        seqlens: Vec<i64>,
        partitions: Vec<Vec<i64>>,
    ) -> Result<peers::SeqlenUnbalance, peers::PyError> {
        let u = k::peers::verl::log_seqlen_unbalance(&seqlens, &partitions)
            .map_err(|e| peers::PyError { exception: e.type_name().into(), message: e.message().into() })?;
        Ok(u.figures().into())
    }
}

impl layout::Guest for Kernel {
    fn pad_factor(options: layout::AlignOptions) -> Result<u64, types::Error> {
        k::pad_factor(&options.into()).map_err(error)
    }

    fn cp_layout(lengths: Vec<u64>, options: layout::AlignOptions) -> Result<layout::CpSplit, types::Error> {
        k::cp_layout(&lengths, &options.into()).map(Into::into).map_err(error)
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
        distribute_with(&lengths, None, None, &o)
    }
}

/// `layout.distribute`, `multimodal.distribute` and `multi-micro.distribute`.
fn distribute_with(
    lengths: &[u64],
    extra: Option<&[u64]>,
    limits: Option<k::MicroLimits<'_>>,
    o: &layout::DistributeOptions,
) -> Result<layout::Distribution, types::Error> {
    let opts = k::DistributeOptions {
        capacity: o.capacity,
        dp: o.dp,
        cost: o.cost.into(),
        padding: o.padding.into(),
        runs: o.runs.as_deref(),
        mix_runs: o.mix_runs,
        extra_costs: extra,
        limits,
    };
    k::distribute(lengths, &opts).map(Into::into).map_err(error)
}

impl multimodal::Guest for Kernel {
    fn micro_batches(
        lengths: Vec<u64>,
        extra: Vec<u64>,
        options: balance::MicroOptions,
    ) -> Result<balance::MicroPlan, types::Error> {
        k::micro_batches_with_extra(&lengths, Some(&extra), &micro_options(options)).map(Into::into).map_err(error)
    }

    fn balance_dp(
        lengths: Vec<u64>,
        extra: Vec<u64>,
        dp: u32,
        options: balance::DpOptions,
    ) -> Result<balance::DpPlan, types::Error> {
        let o = k::DpOptions { extra_costs: Some(&extra), ..dp_options(&options) };
        k::balance_dp(&lengths, dp, &o).map(Into::into).map_err(error)
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
        Ok(p.into())
    }

    fn distribute(
        lengths: Vec<u64>,
        extra: Vec<u64>,
        options: layout::DistributeOptions,
    ) -> Result<layout::Distribution, types::Error> {
        distribute_with(&lengths, Some(&extra), None, &options)
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
        k::raw_plan(&lengths, &options.into()).map(Into::into).map_err(error)
    }

    fn align_plan(
        packs: types::Groups,
        world_size: u32,
        drop_last: bool,
    ) -> Result<plan::AlignedPackPlan, types::Error> {
        k::aligned_plan(&packs.offsets, &packs.indices, world_size, drop_last).map(Into::into).map_err(error)
    }
}

impl shuffle::Guest for Kernel {
    fn permutation(n: u64, seed: u64, epoch: u64) -> Result<Vec<u32>, types::Error> {
        k::shuffle::permutation(n, seed, epoch).map_err(error)
    }
}

fn oversize_of(o: pack::Oversize) -> k::OversizePolicy {
    o.into()
}

impl trl::Guest for Kernel {
    fn bfd(lengths: Vec<u64>, batch_ends: Vec<u32>, seq_length: u64) -> Result<types::Groups, types::Error> {
        let (offsets, indices) = k::peers::trl::trl_bfd(&lengths, &batch_ends, seq_length).map_err(error)?;
        Ok(types::Groups { offsets, indices })
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
        k::next_fit_runs(&lengths, &o).map(Into::into).map_err(error)
    }
}

/// A streaming packer behind the `stream.packer` resource (methods take `&self`).
struct StreamPacker(core::cell::RefCell<k::StreamPacker>);

impl stream::Guest for Kernel {
    type Packer = StreamPacker;
}

impl stream::GuestPacker for StreamPacker {
    fn create(options: stream::Options) -> Result<stream::Packer, types::Error> {
        let p = k::StreamPacker::new(options.into()).map_err(error)?;
        Ok(stream::Packer::new(StreamPacker(core::cell::RefCell::new(p))))
    }

    fn restore(state: Vec<u8>) -> Result<stream::Packer, types::Error> {
        let p = k::StreamPacker::from_state(&state).map_err(error)?;
        Ok(stream::Packer::new(StreamPacker(core::cell::RefCell::new(p))))
    }

    packer_methods!(stream::Closed);
}
