//! What goes into the packer and what comes out: training batches and their samples, the
//! keys that name them, every rank's batch of a step, and the reports of ingesting and packing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use stowplan_kernel::Cost;

use crate::Error;
use crate::materialize::{MaterializedBatch, RejectReason, Sample, Temperature};
use crate::wire;

/// One rollout sample as the orchestrator sends it (prime-rl's `TrainingSample` fields).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingSample {
    /// Prompt token ids.
    pub prompt_ids: Vec<i64>,
    /// Completion token ids.
    pub completion_ids: Vec<i64>,
    /// Loss mask of the prompt; `None`: all false.
    pub prompt_mask: Option<Vec<bool>>,
    /// Loss mask of the completion; `None`: all true.
    pub completion_mask: Option<Vec<bool>>,
    /// Inference logprob of every completion token; `None`: all 0.
    pub completion_logprobs: Option<Vec<f32>>,
    /// Temperature of every completion token; `None`: the batch's temperature.
    pub completion_temperatures: Option<Vec<f32>>,
    /// Teacher logprob of every token (prompt + completion).
    pub teacher_logprobs: Option<Vec<f32>>,
    /// The advantage (finite), repeated on every token.
    pub advantage: f32,
    /// A cost on top of the cost model's, in its units (a multimodal sample's image or vision
    /// tokens): balancing over ranks and micro-batches counts it, the `capacity` cap does not
    /// (see [`Sample::extra_cost`]). 0 for text.
    pub extra_cost: u64,
    /// The sample's size in each further limit of a micro-batch, by the limit's name
    /// (`("image_tokens", 1024)`, `("images", 2)`): a limit it does not name is 0. Each name
    /// once, and each one of [`PackerOptions::limits`](super::PackerOptions::limits); the
    /// packer rejects the sample otherwise (`unknown_resource`), or when a size is over its
    /// cap (`over_limit`: samples are never split). Empty for text. At most
    /// [`MAX_RESOURCES`](stowplan_kernel::MAX_RESOURCES) − 1 entries, each name at most
    /// [`MAX_RESOURCE_NAME`] bytes: a batch with more is refused whole when decoded.
    #[serde(deserialize_with = "bounded_resources")]
    pub resources: Vec<(String, u64)>,
}

/// The longest resource name, in bytes (of a limit and of a sample's resources).
pub const MAX_RESOURCE_NAME: usize = 256;

/// [`TrainingSample::resources`] as decoded: at most `MAX_RESOURCES − 1` entries and names of
/// at most [`MAX_RESOURCE_NAME`] bytes, so that a forged batch cannot turn a few bytes of
/// wire into many of memory (an entry is 2 bytes on the wire, 32 in memory).
fn bounded_resources<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(String, u64)>, D::Error> {
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Vec<(String, u64)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "at most {} resources, each named in at most {MAX_RESOURCE_NAME} bytes", MAX_NAMED)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            use serde::de::Error as _;
            let mut out = Vec::new();
            while let Some((name, size)) = seq.next_element::<(String, u64)>()? {
                if out.len() == MAX_NAMED {
                    return Err(A::Error::custom(format!("a sample has more than {MAX_NAMED} resources")));
                }
                if name.len() > MAX_RESOURCE_NAME {
                    return Err(A::Error::custom(format!(
                        "a resource name has {} bytes, more than {MAX_RESOURCE_NAME}",
                        name.len()
                    )));
                }
                out.push((name, size));
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded)
}

/// The most resources a sample names: every limit but the tokens.
const MAX_NAMED: usize = stowplan_kernel::MAX_RESOURCES - 1;

impl TrainingSample {
    /// Tokens (prompt + completion).
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.completion_ids.len()
    }

    /// Whether the sample has no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sample's [`resources`](Self::resources) in the order of `names`, the limits' names
    /// (a limit it does not name is 0); empty when it names none.
    ///
    /// Errors: a message (without the sample's name) for a resource named twice, one that is
    /// not among `names`, or any resource when there are no limits.
    pub fn resource_sizes(&self, names: &[String]) -> Result<Vec<u64>, String> {
        if self.resources.is_empty() {
            return Ok(Vec::new());
        }
        let mut sizes = vec![0; names.len()];
        let mut named = vec![false; names.len()];
        for (name, size) in &self.resources {
            let Some(k) = names.iter().position(|n| n == name) else {
                return Err(if names.is_empty() {
                    format!("names resource {name:?}, but there are no limits to check it against")
                } else {
                    format!("names resource {name:?}, which is not one of the limits ({})", names.join(", "))
                });
            };
            if std::mem::replace(&mut named[k], true) {
                return Err(format!("names resource {name:?} twice"));
            }
            sizes[k] = *size;
        }
        Ok(sizes)
    }

    /// The sample as [`materialize`](crate::materialize::materialize) takes it.
    pub fn as_sample(&self, temperature: f32, run: u32) -> Sample<'_> {
        Sample {
            prompt_ids: &self.prompt_ids,
            completion_ids: &self.completion_ids,
            prompt_mask: self.prompt_mask.as_deref(),
            completion_mask: self.completion_mask.as_deref(),
            completion_logprobs: self.completion_logprobs.as_deref(),
            temperature: match &self.completion_temperatures {
                Some(t) => Temperature::PerToken(t),
                None => Temperature::One(temperature),
            },
            advantage: self.advantage,
            run,
            teacher_logprobs: self.teacher_logprobs.as_deref(),
            extra_cost: self.extra_cost,
            resources: &[],
        }
    }
}

/// A sample's cost: the cost model's for its tokens plus its extra cost; `None` when that
/// overflows `u64`.
pub(super) fn cost_of(cost: &Cost, s: &TrainingSample) -> Option<u64> {
    cost.of(s.len() as u64)?.checked_add(s.extra_cost)
}

/// One run's samples of one orchestrator step (prime-rl's `TrainingBatch`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingBatch {
    /// Run (LoRA adapter) index, below [`PackerOptions::num_runs`](super::PackerOptions::num_runs).
    pub run: u32,
    /// The orchestrator's step; `(run, step)` identifies the batch (a second batch with the
    /// same pair is a duplicate).
    pub step: u64,
    /// Sampling temperature of every sample without per-token temperatures (> 0).
    pub temperature: f32,
    /// The samples.
    pub samples: Vec<TrainingSample>,
}

/// Identifies a batch: its run and orchestrator step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BatchKey {
    /// Run index.
    pub run: u32,
    /// Orchestrator step.
    pub step: u64,
}

/// Identifies a sample: its batch and its position in the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SampleKey {
    /// Run index.
    pub run: u32,
    /// Orchestrator step of its batch.
    pub step: u64,
    /// Position in the batch's `samples`.
    pub index: u32,
}

impl SampleKey {
    pub(super) fn batch(self) -> BatchKey {
        BatchKey { run: self.run, step: self.step }
    }
}

impl TrainingBatch {
    /// Tokens over all samples.
    pub fn tokens(&self) -> u64 {
        self.samples.iter().map(|s| s.len() as u64).sum()
    }

    /// The batch's key.
    pub fn key(&self) -> BatchKey {
        BatchKey { run: self.run, step: self.step }
    }

    /// Encodes in the [`wire::TRAINING_BATCH`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        wire::encode(&wire::TRAINING_BATCH, self, self.tokens() as usize * 6)
    }

    /// Decodes what [`TrainingBatch::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        wire::decode(&wire::TRAINING_BATCH, bytes)
    }
}

/// What one rank receives for one packer step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankBatch {
    /// Packer step (0, 1, …; consecutive).
    pub step: u64,
    /// This rank.
    pub rank: u32,
    /// Data-parallel ranks.
    pub dp: u32,
    /// Every sample of the step; a micro-batch's `samples` index this list.
    pub keys: Vec<SampleKey>,
    /// This rank's micro-batches (the same number on every rank).
    pub micro_batches: Vec<MaterializedBatch>,
    /// Runs whose step completed with this packer step (`ready_to_update`).
    pub ready_to_update: Vec<u32>,
}

impl RankBatch {
    /// Encodes in the [`wire::RANK_BATCH`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let hint: usize = self.micro_batches.iter().map(|m| m.len() * 20).sum();
        wire::encode(&wire::RANK_BATCH, self, hint)
    }

    /// Decodes what [`RankBatch::encode`] wrote, checking every micro-batch's arrays.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let b: RankBatch = wire::decode(&wire::RANK_BATCH, bytes)?;
        for m in &b.micro_batches {
            m.check_lengths().map_err(|e| Error::InvalidArgument(format!("bytes: {e}")))?;
            if let Some(&i) = m.samples.iter().find(|&&i| i as usize >= b.keys.len()) {
                return Err(Error::InvalidArgument(format!(
                    "bytes: corrupt rank batch: a micro-batch names sample {i} of {}",
                    b.keys.len()
                )));
            }
        }
        Ok(b)
    }
}

/// What [`Packer::ingest`](super::Packer::ingest) did with a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngestReport {
    /// The batch.
    pub key: BatchKey,
    /// Samples buffered.
    pub accepted: u32,
    /// Samples rejected: position in the batch, reason, message.
    pub rejected: Vec<(u32, RejectReason, String)>,
    /// The batch was a duplicate and nothing was buffered.
    pub duplicate: bool,
}

/// Figures of one packer step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepMetrics {
    /// Packer step.
    pub step: u64,
    /// Samples packed.
    pub samples: u64,
    /// Real tokens.
    pub real_tokens: u64,
    /// Padding tokens (dummies included).
    pub padding_tokens: u64,
    /// Micro-batches per rank.
    pub micro_batches_per_rank: u64,
    /// Heaviest rank's cost over the mean rank cost (1.0 = perfect).
    pub imbalance: f64,
    /// Seconds spent selecting, packing, balancing and materializing.
    pub pack_seconds: f64,
    /// Samples per run in this step.
    pub run_samples: BTreeMap<u32, u64>,
}

/// One packer step: what each rank gets, and its figures.
#[derive(Debug)]
pub struct PackedStep {
    /// Every rank's batch, `ranks[r].rank == r`.
    pub ranks: Vec<RankBatch>,
    /// Figures.
    pub metrics: StepMetrics,
}
