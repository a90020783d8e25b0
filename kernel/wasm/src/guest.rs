//! Glue between the WIT exports and `stowplan-kernel`.

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use stowplan_kernel as k;

wit_bindgen::generate!({
    path: "../../wit",
    world: "kernel",
});

use exports::stowplan::kernel::{balance, layout, pack, partition, peers, plan, reports, shuffle, trl, types, verl};

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

mod slime;
mod stream_packer;

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

    fn next_fit(
        lengths: Vec<u32>,
        capacity: u64,
        align: u64,
        oversize: pack::Oversize,
    ) -> Result<pack::NextFitRuns, types::Error> {
        let o = k::PackOptions {
            align,
            method: k::PackMethod::NextFit,
            oversize: oversize_of(oversize),
            ..k::PackOptions::new(capacity)
        };
        k::next_fit_runs(&lengths, &o).map(Into::into).map_err(error)
    }

    fn pack_multi(sizes: Vec<u64>, options: pack::MultiOptions) -> Result<pack::MultiPacking, types::Error> {
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

/// The kernel's view of `balance.limits`.
fn micro_limits(l: &balance::Limits) -> k::MicroLimits<'_> {
    k::MicroLimits { sizes: &l.sizes, caps: &l.caps, names: &l.names }
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
        extra_costs: o.extra_costs.as_deref(),
    }
}

impl balance::Guest for Kernel {
    fn micro_batches(
        lengths: Vec<u64>,
        extra_costs: Option<Vec<u64>>,
        limits: Option<balance::Limits>,
        options: balance::MicroOptions,
    ) -> Result<balance::LimitedMicroPlan, types::Error> {
        let l = limits.as_ref().map(micro_limits);
        let r = k::ops::micro_batches(&lengths, extra_costs.as_deref(), l.as_ref(), &micro_options(options));
        r.map(Into::into).map_err(error)
    }

    fn balance_dp(lengths: Vec<u64>, dp: u32, options: balance::DpOptions) -> Result<balance::DpPlan, types::Error> {
        k::balance_dp(&lengths, dp, &dp_options(&options)).map(Into::into).map_err(error)
    }

    fn plan(
        lengths: Vec<u64>,
        dp: u32,
        dp_opts: balance::DpOptions,
        micro: balance::MicroOptions,
        limits: Option<balance::Limits>,
    ) -> Result<balance::TwoLevel, types::Error> {
        let l = limits.as_ref().map(micro_limits);
        let p = k::ops::plan(&lengths, dp, &dp_options(&dp_opts), &micro_options(micro), l.as_ref()).map_err(error)?;
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

    fn distribute(lengths: Vec<u64>, o: layout::DistributeOptions) -> Result<layout::Distribution, types::Error> {
        let opts = k::DistributeOptions {
            capacity: o.capacity,
            dp: o.dp,
            cost: o.cost.into(),
            padding: o.padding.into(),
            runs: o.runs.as_deref(),
            mix_runs: o.mix_runs,
            extra_costs: o.extra_costs.as_deref(),
            limits: o.limits.as_ref().map(micro_limits),
        };
        k::distribute(&lengths, &opts).map(Into::into).map_err(error)
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
    fn raw_plan(
        lengths: Vec<u64>,
        options: plan::PlanOptions,
        limits: Option<plan::PlanLimits>,
    ) -> Result<plan::LimitedRawPlan, types::Error> {
        let l = limits.as_ref().map(|p| k::PlanLimits {
            limits: micro_limits(&p.limits),
            max_segments: p.max_segments,
            method: p.method.into(),
        });
        k::ops::raw_plan(&lengths, &options.into(), l.as_ref()).map(Into::into).map_err(error)
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
