//! Materialization: samples plus a plan become the arrays a trainer feeds its model.
//!
//! The kernel decides (which samples share a micro-batch, which rank gets it, the CP split);
//! this module copies tokens natively, so token data never crosses into WASM. A row is the
//! samples of one micro-batch concatenated (prompt then completion), with either
//! - **per-micro-batch padding** ([`Padding::PerMicroBatch`](crate::kernel::Padding::PerMicroBatch), prime-rl's): one padding
//!   segment at the end up to a multiple, counted in the last sequence's length (in
//!   `cu_seqlens_padded`) and in the last run's `lora_num_tokens`; its `position_ids` restart
//!   at 0; or
//! - **per-sequence padding** ([`Padding::PerSequence`](crate::kernel::Padding::PerSequence), ROLL's): every sample padded to a
//!   multiple of the factor right after its tokens, `position_ids` continuing through its
//!   padding; with `cp` > 1 each row also carries its zigzag split ([`CpRuns`]) and
//!   [`MaterializedBatch::cp_view`] gives a CP rank's row.
//!
//! Padding values (prime-rl's): token `pad_token_id`, loss mask false, advantage 0,
//! inference and teacher logprob 0, temperature 1, loss weight 0. A dummy micro-batch (only
//! when there are fewer samples than micro-batch slots) is one padding segment with the same
//! values.
//!
//! **Loss weights.** Every row carries `loss_weights` (f32, the layout of `loss_mask`): the
//! weight of each token's loss in the step's loss under a [`LossAggMode`], computed from the
//! whole step before any rank trains. Σ over every rank, micro-batch and token of
//! `loss_weights × per-token loss` is the loss the unpacked samples give under that mode —
//! however the samples were grouped into rows and ranks, with no all-reduce of counts.

mod balanced;
mod build;
mod cp;
mod micro_batch;
mod options;
mod round_robin;
mod sample;
mod weights;

pub(crate) use balanced::materialize_counted;
pub use balanced::{materialize, materialize_limited};
pub use build::materialize_plan;
pub use cp::CpRuns;
pub use micro_batch::{CpView, MaterializedBatch, TokenArrays};
pub use options::{DistributionMode, LossAggMode, MaterializeOptions, Materialized, SampleLimits};
pub use round_robin::{Dealt, round_robin};
pub use sample::{RejectReason, Sample, Temperature, check_sample};
pub(crate) use weights::{LossCounts, check_loss_scale_factor};

/// `v` tokens as an `i32` row length or offset, or an error naming `name`.
fn to_i32(name: &str, v: u64) -> Result<i32, crate::Error> {
    i32::try_from(v).map_err(|_| {
        crate::Error::InvalidArgument(format!("{name}: {v} tokens in one row; at most {} fit in int32", i32::MAX))
    })
}
