//! The rollout data source with a buffer (the rollout buffer contract: slime's `RolloutDataSource` and
//! `RolloutDataSourceWithBuffer`), with a state that survives restarts **including the
//! buffer**.
//!
//! - Prompts come from a JSONL file (one JSON object per line; the prompt under
//!   `input_key`, optional label and metadata under `label_key` / `metadata_key`).
//! - An epoch cursor walks the prompts in order, or in the kernel's seeded shuffle of
//!   `(seed, epoch)` (see `wit/kernel.wit`, interface `shuffle`), wrapping into the next epoch
//!   as often as a request needs.
//! - Each prompt drawn becomes a group of `n_samples_per_prompt` samples with consecutive
//!   global indices.
//! - [`DataSource::get_samples`] takes groups from the buffer through a [`BufferFilter`] first
//!   (FIFO [`PopFirst`], slime's default, when none is given), then from the dataset.
//!   Whatever a filter returns is validated (indices in range, no duplicates, not more than
//!   asked); an invalid selection is an error and the buffer is left untouched.
//! - [`DataSource::save`] / [`DataSource::load`]: the [`wire::DATA_SOURCE_STATE`] frame
//!   (`SPDS`, version, postcard body, CRC-32); written atomically. Loading a missing, damaged or foreign
//!   state (another dataset or options) is an error, never a silent restart.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::FilterError;
use crate::kernel::Kernel;
use crate::{Error, wire};

pub mod columns;
pub use columns::{BufferColumns, synthetic_buffer};

/// Options of a [`DataSource`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataSourceOptions {
    /// Samples per prompt (group size), at least 1.
    pub n_samples_per_prompt: u32,
    /// Shuffle the prompts every epoch with the seeded permutation of `(seed, epoch)`.
    pub shuffle: bool,
    /// The shuffle seed.
    pub seed: u64,
    /// The key of the prompt in each JSONL record (default `prompt`).
    pub input_key: String,
    /// The key of the label, if any (default `label`; absent in a record = no label).
    pub label_key: Option<String>,
    /// The key of the metadata object, if any (default `metadata`).
    pub metadata_key: Option<String>,
}

impl DataSourceOptions {
    /// Options with `n_samples_per_prompt` and the defaults: no shuffle, seed 0, keys
    /// `prompt`, `label`, `metadata`.
    pub fn new(n_samples_per_prompt: u32) -> Self {
        Self {
            n_samples_per_prompt,
            shuffle: false,
            seed: 0,
            input_key: "prompt".to_string(),
            label_key: Some("label".to_string()),
            metadata_key: Some("metadata".to_string()),
        }
    }
}

/// The status of a rollout sample (slime's `Sample.Status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Status {
    /// Not generated yet (every sample drawn from the dataset).
    #[default]
    Pending,
    /// Generation finished.
    Completed,
    /// Generation stopped at the length limit.
    Truncated,
    /// Generation was aborted (e.g. a partial rollout put back into the buffer).
    Aborted,
}

/// One rollout sample as the data source and buffer filters see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutSample {
    /// Global sample index (consecutive inside a group).
    pub index: u64,
    /// Global group index (one per prompt drawn).
    pub group: u64,
    /// The prompt's row in the dataset.
    pub prompt_index: u32,
    /// The prompt as JSON text (a string or a list of messages).
    pub prompt: String,
    /// The label, if any (JSON text of a non-string label).
    pub label: Option<String>,
    /// Metadata as JSON object text (`{}` when none).
    pub metadata: String,
    /// Prompt length in tokens (0 until the caller sets it).
    pub prompt_length: u32,
    /// Response length in tokens.
    pub response_length: u32,
    /// Reward(s); empty until scored.
    pub rewards: Vec<f64>,
    /// Generation status.
    pub status: Status,
    /// Opaque caller data kept with the sample through the buffer and save/load (e.g. a
    /// serialized trainer-side sample).
    pub payload: Vec<u8>,
}

/// A group of samples of one prompt.
pub type Group = Vec<RolloutSample>;

/// What a buffer filter is told about a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterContext {
    /// The rollout step asking, when known.
    pub rollout_id: Option<u64>,
    /// Groups wanted (the filter returns at most this many).
    pub wanted: u32,
    /// Samples per group.
    pub n_samples_per_prompt: u32,
}

/// What a buffer filter reads: the buffered groups, oldest first, and the same data in the
/// columnar layout plugins receive (the data source keeps both, so no call re-encodes).
#[derive(Clone, Copy, Debug)]
pub struct BufferView<'a> {
    /// The buffered groups.
    pub groups: &'a [Group],
    /// The same groups, columnar (`wit/filter/filter.wit`).
    pub columns: &'a BufferColumns,
}

/// A policy choosing which buffered groups a request takes, in order.
pub trait BufferFilter {
    /// Indices into `buffer.groups` of the groups to take, in the order they are returned;
    /// at most `ctx.wanted`, no duplicates. Errors are reported to the caller of
    /// `get_samples`.
    fn select(&mut self, ctx: &FilterContext, buffer: BufferView<'_>) -> Result<Vec<u32>, Error>;
}

/// First in, first out: the oldest `min(wanted, buffered)` groups (slime's `pop_first`).
#[derive(Clone, Copy, Debug, Default)]
pub struct PopFirst;

impl BufferFilter for PopFirst {
    fn select(&mut self, ctx: &FilterContext, buffer: BufferView<'_>) -> Result<Vec<u32>, Error> {
        Ok((0..buffer.groups.len().min(ctx.wanted as usize) as u32).collect())
    }
}

/// A prompt of the dataset.
#[derive(Clone, Debug, PartialEq)]
struct Prompt {
    prompt: String,
    label: Option<String>,
    metadata: String,
}

/// The saved state.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct State {
    identity: String,
    prompts: u64,
    n_samples_per_prompt: u32,
    shuffle: bool,
    seed: u64,
    epoch: u64,
    offset: u64,
    next_index: u64,
    next_group: u64,
    metadata: String,
    buffer: Vec<Group>,
}

/// A rollout data source with a buffer (see the module docs).
#[derive(Debug)]
pub struct DataSource {
    options: DataSourceOptions,
    identity: String,
    prompts: Vec<Prompt>,
    kernel: Kernel,
    /// The current epoch's order (prompt rows).
    order: Vec<u32>,
    epoch: u64,
    offset: u64,
    next_index: u64,
    next_group: u64,
    metadata: serde_json::Map<String, Value>,
    buffer: Vec<Group>,
    /// `buffer`, columnar, for plugins.
    columns: BufferColumns,
}

impl DataSource {
    /// A data source over the JSONL file `path` (its identity is the sha256 of the bytes).
    /// Errors name the line of a record that is not a JSON object or lacks the prompt key.
    pub fn from_jsonl(path: &Path, options: DataSourceOptions, kernel: Kernel) -> Result<Self, Error> {
        let bytes = std::fs::read(path).map_err(|e| Error::io("reading", path, e))?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| Error::InvalidArgument(format!("{}: not UTF-8 text: {e}", path.display())))?;
        let mut records = Vec::new();
        for (no, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line).map_err(|e| {
                Error::InvalidArgument(format!("{}, line {}: not a JSON record: {e}", path.display(), no + 1))
            })?;
            records.push((no + 1, v));
        }
        let identity = format!("sha256:{}", crate::runtime::sha256_hex(&bytes));
        Self::build(records, identity, options, kernel, &path.display().to_string())
    }

    /// A data source over in-memory records (`identity` names the dataset for saved states).
    pub fn from_records(
        records: Vec<Value>,
        identity: &str,
        options: DataSourceOptions,
        kernel: Kernel,
    ) -> Result<Self, Error> {
        let records = records.into_iter().enumerate().map(|(i, v)| (i + 1, v)).collect();
        Self::build(records, identity.to_string(), options, kernel, "records")
    }

    fn build(
        records: Vec<(usize, Value)>,
        identity: String,
        options: DataSourceOptions,
        kernel: Kernel,
        origin: &str,
    ) -> Result<Self, Error> {
        if options.n_samples_per_prompt == 0 {
            return Err(Error::InvalidArgument("n_samples_per_prompt must be at least 1 (got 0)".to_string()));
        }
        if records.len() > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "{origin}: {} prompts; at most {} are supported",
                records.len(),
                u32::MAX
            )));
        }
        let mut prompts = Vec::with_capacity(records.len());
        for (line, v) in records {
            let Value::Object(mut m) = v else {
                return Err(Error::InvalidArgument(format!("{origin}, record {line}: not a JSON object")));
            };
            let prompt = match m.remove(&options.input_key) {
                Some(Value::String(s)) => Value::String(s).to_string(),
                Some(Value::Null) | None => {
                    return Err(Error::InvalidArgument(format!(
                        "{origin}, record {line}: no prompt under input_key {:?}",
                        options.input_key
                    )));
                }
                Some(other) => other.to_string(),
            };
            let label = match options.label_key.as_ref().and_then(|k| m.remove(k)) {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s),
                Some(other) => Some(other.to_string()),
            };
            let metadata = match options.metadata_key.as_ref().and_then(|k| m.remove(k)) {
                None | Some(Value::Null) => "{}".to_string(),
                Some(v @ Value::Object(_)) => v.to_string(),
                Some(other) => {
                    return Err(Error::InvalidArgument(format!(
                        "{origin}, record {line}: metadata must be a JSON object (got {other})"
                    )));
                }
            };
            prompts.push(Prompt { prompt, label, metadata });
        }
        let mut source = Self {
            options,
            identity,
            prompts,
            kernel,
            order: Vec::new(),
            epoch: 0,
            offset: 0,
            next_index: 0,
            next_group: 0,
            metadata: serde_json::Map::new(),
            buffer: Vec::new(),
            columns: BufferColumns::default(),
        };
        source.order = source.epoch_order(0)?;
        Ok(source)
    }

    /// The prompt order of `epoch`: the identity, or the kernel's seeded permutation.
    fn epoch_order(&self, epoch: u64) -> Result<Vec<u32>, Error> {
        let n = self.prompts.len() as u64;
        if !self.options.shuffle {
            return Ok((0..n as u32).collect());
        }
        self.kernel.permutation(n, self.options.seed, epoch)
    }

    /// Number of prompts in the dataset.
    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    /// Whether the dataset has no prompt.
    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty()
    }

    /// The options.
    pub fn options(&self) -> &DataSourceOptions {
        &self.options
    }

    /// The dataset identity saved states are checked against.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The current epoch (0-based).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Prompts of the current epoch already drawn.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The global index the next sample drawn from the dataset gets.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// Groups in the buffer.
    pub fn buffer_len(&self) -> usize {
        self.buffer.len()
    }

    /// The buffered groups, oldest first.
    pub fn buffer(&self) -> &[Group] {
        &self.buffer
    }

    /// The metadata (a JSON object), saved with the state.
    pub fn metadata(&self) -> &serde_json::Map<String, Value> {
        &self.metadata
    }

    /// Merges `update` into the metadata (slime's `update_metadata`).
    pub fn update_metadata(&mut self, update: serde_json::Map<String, Value>) {
        self.metadata.extend(update);
    }

    /// `n` groups: from the buffer through `filter` (FIFO when `None`) first, then from the
    /// dataset, wrapping into new epochs as needed. On an error nothing is taken.
    pub fn get_samples(
        &mut self,
        n: usize,
        rollout_id: Option<u64>,
        filter: Option<&mut dyn BufferFilter>,
    ) -> Result<Vec<Group>, Error> {
        let wanted = u32::try_from(n)
            .map_err(|_| Error::InvalidArgument(format!("n must be at most {} groups (got {n})", u32::MAX)))?;
        let mut picks = Vec::new();
        if wanted > 0 && !self.buffer.is_empty() {
            let ctx = FilterContext { rollout_id, wanted, n_samples_per_prompt: self.options.n_samples_per_prompt };
            let mut fifo = PopFirst;
            let filter: &mut dyn BufferFilter = match filter {
                Some(f) => f,
                None => &mut fifo,
            };
            picks = filter.select(&ctx, BufferView { groups: &self.buffer, columns: &self.columns })?;
            validate_selection(&picks, self.buffer.len(), wanted)?;
        }
        // The dataset part first (it commits the cursor only on success), then the buffer
        // part: a failure anywhere takes nothing.
        let rest = n - picks.len();
        let drawn = if rest == 0 {
            Vec::new()
        } else if self.prompts.is_empty() {
            return Err(Error::Infeasible(format!(
                "{rest} more groups wanted than the buffer provides, and the dataset has no prompts"
            )));
        } else {
            self.draw(rest)?
        };
        let mut out = self.take_from_buffer(&picks);
        out.extend(drawn);
        Ok(out)
    }

    /// Removes the groups at `picks` (validated) from the buffer, in the order of `picks`.
    fn take_from_buffer(&mut self, picks: &[u32]) -> Vec<Group> {
        if picks.is_empty() {
            return Vec::new();
        }
        let mut slots: Vec<Option<Group>> = std::mem::take(&mut self.buffer).into_iter().map(Some).collect();
        let taken = picks.iter().filter_map(|&p| slots[p as usize].take()).collect();
        let keep: Vec<bool> = slots.iter().map(Option::is_some).collect();
        self.columns.retain(&keep);
        self.buffer = slots.into_iter().flatten().collect();
        taken
    }

    fn draw(&mut self, groups: usize) -> Result<Vec<Group>, Error> {
        let n = self.prompts.len() as u64;
        let (mut epoch, mut offset, mut order) = (self.epoch, self.offset, None::<Vec<u32>>);
        let mut rows = Vec::with_capacity(groups);
        while rows.len() < groups {
            if offset == n {
                epoch += 1;
                offset = 0;
                order = Some(self.epoch_order(epoch)?);
            }
            let current = order.as_deref().unwrap_or(&self.order);
            let take = (groups - rows.len()).min((n - offset) as usize);
            rows.extend_from_slice(&current[offset as usize..offset as usize + take]);
            offset += take as u64;
        }
        let k = u64::from(self.options.n_samples_per_prompt);
        let mut out = Vec::with_capacity(groups);
        for row in rows {
            let p = &self.prompts[row as usize];
            let group = (0..k)
                .map(|j| RolloutSample {
                    index: self.next_index + j,
                    group: self.next_group,
                    prompt_index: row,
                    prompt: p.prompt.clone(),
                    label: p.label.clone(),
                    metadata: p.metadata.clone(),
                    prompt_length: 0,
                    response_length: 0,
                    rewards: Vec::new(),
                    status: Status::Pending,
                    payload: Vec::new(),
                })
                .collect();
            self.next_index += k;
            self.next_group += 1;
            out.push(group);
        }
        self.epoch = epoch;
        self.offset = offset;
        if let Some(o) = order {
            self.order = o;
        }
        Ok(out)
    }

    /// Appends `groups` to the buffer (slime's `add_samples`). Every group must hold exactly
    /// `n_samples_per_prompt` samples, with finite rewards; otherwise nothing is added and
    /// the error names the group.
    pub fn add_samples(&mut self, groups: Vec<Group>) -> Result<(), Error> {
        let k = self.options.n_samples_per_prompt as usize;
        for (g, group) in groups.iter().enumerate() {
            if group.len() != k {
                return Err(Error::InvalidArgument(format!(
                    "groups[{g}] has {} samples; every group must have n_samples_per_prompt = {k}",
                    group.len()
                )));
            }
            for (s, sample) in group.iter().enumerate() {
                if let Some(r) = sample.rewards.iter().find(|r| !r.is_finite()) {
                    return Err(Error::InvalidArgument(format!(
                        "groups[{g}][{s}].rewards holds {r}; rewards must be finite"
                    )));
                }
                if serde_json::from_str::<serde_json::Map<String, Value>>(&sample.metadata).is_err() {
                    return Err(Error::InvalidArgument(format!(
                        "groups[{g}][{s}].metadata must be JSON object text (got {:?})",
                        sample.metadata
                    )));
                }
            }
        }
        let (labels, metadata) = self.columns.blob_bytes();
        let samples = self.columns.samples() + groups.len() * k;
        let added = |f: &dyn Fn(&RolloutSample) -> usize| groups.iter().flatten().map(f).sum::<usize>();
        let labels = labels + added(&|s| s.label.as_ref().map_or(0, String::len));
        let metadata = metadata + added(&|s| s.metadata.len());
        let rewards = self.columns.reward_count() + added(&|s| s.rewards.len());
        if [samples, labels, metadata, rewards].iter().any(|&n| n > u32::MAX as usize) {
            return Err(Error::InvalidArgument(format!(
                "the buffer would hold {samples} samples, {rewards} rewards, {labels} bytes of labels and {metadata} \
                 bytes of metadata; each must stay below 2^32 (take groups out of the buffer first)"
            )));
        }
        self.columns.extend(&groups);
        self.buffer.extend(groups);
        Ok(())
    }

    /// Writes the state (cursor, indices, metadata and the whole buffer) to `path`
    /// atomically.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        let state = State {
            identity: self.identity.clone(),
            prompts: self.prompts.len() as u64,
            n_samples_per_prompt: self.options.n_samples_per_prompt,
            shuffle: self.options.shuffle,
            seed: self.options.seed,
            epoch: self.epoch,
            offset: self.offset,
            next_index: self.next_index,
            next_group: self.next_group,
            metadata: Value::Object(self.metadata.clone()).to_string(),
            buffer: self.buffer.clone(),
        };
        let bytes = wire::encode(&wire::DATA_SOURCE_STATE, &state, 1024)?;
        crate::runtime::atomic::write(path, &bytes)
    }

    /// Restores a state written by [`Self::save`] for the same dataset and options. A
    /// missing file is an [`Error::Io`]; a damaged file, another format version, another
    /// dataset or other options are [`Error::CacheMismatch`] naming what differs. On error
    /// the data source is unchanged.
    pub fn load(&mut self, path: &Path) -> Result<(), Error> {
        self.load_checked(path, |_| Ok(()))
    }

    /// [`Self::load`], with `check` run on the saved buffer (its groups) before
    /// anything is applied: an error of `check` is returned and the data source is unchanged.
    /// The Python SDK refuses pickled payloads this way without unpickling anything.
    pub fn load_checked(
        &mut self,
        path: &Path,
        check: impl FnOnce(&[Group]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let bytes = std::fs::read(path).map_err(|e| Error::io("reading the data source state", path, e))?;
        let bad = |what: String| Error::CacheMismatch(format!("{}: {what}", path.display()));
        let state: State = wire::decode(&wire::DATA_SOURCE_STATE, &bytes).map_err(|e| bad(e.to_string()))?;
        check(&state.buffer)?;
        let mut diffs = Vec::new();
        if state.identity != self.identity || state.prompts != self.prompts.len() as u64 {
            diffs.push(format!(
                "dataset {} ({} prompts) vs {} ({} prompts)",
                state.identity,
                state.prompts,
                self.identity,
                self.prompts.len()
            ));
        }
        if state.n_samples_per_prompt != self.options.n_samples_per_prompt {
            diffs.push(format!(
                "n_samples_per_prompt {} vs {}",
                state.n_samples_per_prompt, self.options.n_samples_per_prompt
            ));
        }
        if (state.shuffle, state.seed) != (self.options.shuffle, self.options.seed) {
            diffs.push(format!(
                "shuffle/seed {}/{} vs {}/{}",
                state.shuffle, state.seed, self.options.shuffle, self.options.seed
            ));
        }
        if !diffs.is_empty() {
            return Err(bad(format!("saved for other inputs (saved vs now: {})", diffs.join("; "))));
        }
        if state.offset > state.prompts {
            return Err(bad(format!("offset {} beyond {} prompts", state.offset, state.prompts)));
        }
        let metadata = match serde_json::from_str::<Value>(&state.metadata) {
            Ok(Value::Object(m)) => m,
            _ => return Err(bad("metadata is not a JSON object".to_string())),
        };
        let order = self.epoch_order(state.epoch)?;
        self.order = order;
        self.epoch = state.epoch;
        self.offset = state.offset;
        self.next_index = state.next_index;
        self.next_group = state.next_group;
        self.metadata = metadata;
        self.columns = BufferColumns::from_groups(&state.buffer);
        self.buffer = state.buffer;
        Ok(())
    }
}

/// Checks a filter's selection against a buffer of `len` groups and a request of `wanted`:
/// [`FilterError::InvalidResult`] naming the broken rule.
pub fn validate_selection(picks: &[u32], len: usize, wanted: u32) -> Result<(), Error> {
    let invalid = |m: String| Err(Error::Filter(FilterError::InvalidResult(m)));
    if picks.len() > wanted as usize {
        return invalid(format!("the buffer filter returned {} groups; at most {wanted} were asked for", picks.len()));
    }
    let mut seen = vec![false; len];
    for (k, &p) in picks.iter().enumerate() {
        match seen.get_mut(p as usize) {
            None => {
                return invalid(format!(
                    "the buffer filter returned index {p} at position {k}; the buffer holds {len} groups (0..{len})"
                ));
            }
            Some(true) => return invalid(format!("the buffer filter returned index {p} twice (position {k})")),
            Some(s) => *s = true,
        }
    }
    Ok(())
}
