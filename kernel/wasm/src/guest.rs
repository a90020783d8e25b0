//! Glue between the WIT exports and `stowplan-kernel`.

extern crate alloc;

use alloc::vec::Vec;

use stowplan_kernel as k;

wit_bindgen::generate!({
    path: "../../wit",
    world: "kernel",
});

use exports::stowplan::kernel::{pack, partition, types, verl};

#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    // The kernel returns errors as values; a panic is a bug and traps the instance.
    core::arch::wasm32::unreachable()
}

struct Kernel;

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

impl pack::Guest for Kernel {
    fn pack(lengths: Vec<u64>, options: pack::Options) -> Result<pack::Packing, types::Error> {
        let method = match options.method {
            pack::Method::Bfd => k::PackMethod::Bfd,
            pack::Method::Ffd => k::PackMethod::Ffd,
            pack::Method::NextFit => k::PackMethod::NextFit,
        };
        let oversize = match options.oversize {
            pack::Oversize::Error => k::OversizePolicy::Error,
            pack::Oversize::Single => k::OversizePolicy::Single,
            pack::Oversize::Drop => k::OversizePolicy::Drop,
        };
        let opts = k::PackOptions { capacity: options.capacity, align: options.align, method, oversize };
        let r = k::pack(&lengths, &opts).map_err(error)?;
        Ok(pack::Packing {
            bins: types::Groups { offsets: r.offsets, indices: r.indices },
            loads: r.loads,
            dropped: r.dropped,
            single: r.single,
            real_tokens: r.real_tokens,
            aligned_tokens: r.aligned_tokens,
            lower_bound: r.lower_bound,
        })
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
        })
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
