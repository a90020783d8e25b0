//! The packer runtime: rollouts in, balanced micro-batches out to every trainer rank.
//!
//! An orchestrator sends [`TrainingBatch`]es (one run's samples of one orchestrator step,
//! with their temperature). The [`Packer`] keeps one FIFO buffer per run, waits until it holds
//! a token threshold (`capacity × dp` by default) or a wait timeout has passed since the
//! oldest pending sample arrived, then selects samples **round-robin across runs** from a
//! persistent position (one sample per run per turn, within the step's token budget), packs,
//! balances and materializes them ([`materialize`](crate::materialize::materialize): runs never share a
//! micro-batch, `lora_num_tokens` counts each run's tokens, every rank gets the same number of
//! micro-batches) and hands out one [`RankBatch`] per rank.
//!
//! Per run it tracks progress like prime-rl: a run's step advances each time `batch_size` of
//! its samples have been consumed, which sets `ready_to_update`; totals of samples and tokens.
//! Invalid samples (array lengths that disagree, no tokens, an empty completion, more tokens
//! than `capacity`, non-finite values, teacher logprobs where the packer expects none or the
//! reverse, a resource over its limit or one without a limit) are rejected one by one with a
//! reason and counted; the rest of their batch is kept.
//! A batch whose `(run, step)` was already received is a duplicate and ignored, so an
//! orchestrator may resend after a restart.
//!
//! **Durability.** [`Packer::state`] is everything the packer knows but the batches' contents:
//! per-run progress, the order of pending samples (as [`SampleKey`]s), the round-robin
//! position, the keys received, and the step in flight. The server (`serve`) checkpoints it with
//! every step and keeps each received batch in a spool file until all its samples are
//! delivered; [`Packer::restore`] rebuilds the packer from both, and the step in flight is
//! rebuilt byte for byte ([`Packer::rebuild_inflight`]), so nothing is lost or delivered
//! twice across a crash.

mod checkpoint;
mod machine;
mod messages;
mod options;
mod run;
mod seen;
mod update;

pub use checkpoint::PackerState;
pub use machine::{Packer, RECENT_CONTROLS};
pub use messages::{
    BatchKey, IngestReport, MAX_RESOURCE_NAME, PackedStep, RankBatch, SampleKey, StepMetrics, TrainingBatch,
    TrainingSample,
};
pub use options::PackerOptions;
pub use run::{RunConfig, RunProgress};
pub use seen::SeenBatches;
pub use update::LossNormalization;
