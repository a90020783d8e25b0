//! Vision-language batches for properties, shared by the kernel's tests and the conformance
//! tests (`tests/tests/multimodal.rs` includes this file): per sample its tokens, image
//! tokens, images and an extra cost.

use proptest::prelude::*;

/// A drawn batch, in the shapes the kernel takes.
#[derive(Clone, Debug)]
pub struct VlmBatch {
    /// Tokens of each sample (≥ 1).
    pub lengths: Vec<u64>,
    /// Image tokens and images of each sample, sample after sample (`MicroLimits::sizes`).
    pub sizes: Vec<u64>,
    /// Extra cost of each sample.
    pub extra: Vec<u64>,
}

/// Batches of `len` samples, each value below its bound in `below` (tokens, image tokens,
/// images, extra cost).
pub fn vlm_batch(len: std::ops::Range<usize>, below: (u64, u64, u64, u64)) -> impl Strategy<Value = VlmBatch> {
    proptest::collection::vec((1..below.0, 0..below.1, 0..below.2, 0..below.3), len).prop_map(|rows| VlmBatch {
        lengths: rows.iter().map(|r| r.0).collect(),
        sizes: rows.iter().flat_map(|r| [r.1, r.2]).collect(),
        extra: rows.iter().map(|r| r.3).collect(),
    })
}
