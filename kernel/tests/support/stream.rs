//! Streaming-packer cases for properties, shared by the kernel's tests of the streaming
//! packer (`kernel/src/stream/mod.rs`) and the conformance tests (`tests/tests/stream.rs`);
//! both include this file. The including module has `StreamOptions` and `OversizePolicy` in
//! scope (the kernel's, which the host re-exports).

use core::ops::Range;
use proptest::prelude::*;
use proptest::std_facade::Vec;

use super::{OversizePolicy, StreamOptions};

/// Lengths below `below` (`len` of them, zeros included), and streaming options (tokens, no
/// alignment) with a capacity in `1..capacity`, `1..open` open bins and `0..buffered` items
/// held back, oversize items dropped or placed alone: small enough that bins close, items
/// wait and oversize items occur.
pub fn stream_case(
    below: u64,
    len: Range<usize>,
    capacity: u64,
    open: u32,
    buffered: u32,
) -> impl Strategy<Value = (Vec<u64>, StreamOptions)> {
    (proptest::collection::vec(0..below, len), 1..capacity, 1..open, 0..buffered, any::<bool>()).prop_map(
        |(lengths, capacity, max_open_bins, max_buffered, drop)| {
            let oversize = if drop { OversizePolicy::Drop } else { OversizePolicy::Single };
            (lengths, StreamOptions { capacity, align: 1, max_open_bins, max_buffered, oversize })
        },
    )
}
