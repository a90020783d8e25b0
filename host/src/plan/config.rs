//! Validation of a training configuration's packing keys, and the effective-batch
//! arithmetic when packing forces one pack per device and step (the static pack plan contract).
//!
//! The configuration is a JSON object shaped like a trainer config: the keys of the static pack plan contract
//! under `training` (`packing`, `packing_mode`, `eval_packing`, `packing_allow_single_long`,
//! `packing_wait_timeout_s`, `packing_length_cache_persist_every`,
//! `packing_length_precompute_workers`, `dataloader_drop_last`, `effective_batch_size`,
//! `per_device_train_batch_size`, `gradient_accumulation_steps`, plus stowplan's
//! `packing_align`), the packing length from `template.max_length` or else
//! `model.max_model_len` (or `training_args.max_model_len`), and the dataset source under
//! `custom` (`train_jsonl`, `fusion_config`). Other keys are ignored, except unknown keys
//! under `training` that start with `packing` or `eval_packing` (a typo there would silently
//! change a plan) and the deprecated `training.packing_length`, which are errors.
//!
//! ```
//! use stowplan::PackingConfig;
//!
//! let config = serde_json::json!({
//!     "training": {"packing": true, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2},
//!     "template": {"max_length": 16384},
//! });
//! let c = PackingConfig::from_json(&config, 8)?;
//! assert_eq!(c.capacity, Some(16384));
//! assert_eq!(c.batch.gradient_accumulation_steps, 8); // 4 × 2 per device, batch size forced to 1
//! assert_eq!(c.batch.realized_packs_per_step, 64);
//! # Ok::<(), stowplan::Error>(())
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use stowplan_kernel::PlanOptions;

use crate::Error;

/// How dataset-level packing builds its packs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PackingMode {
    /// A precomputed, countable pack plan (the only mode accepted for dataset-level packing).
    Static,
    /// Packs formed on the fly while iterating (rejected when `packing` is true).
    Dynamic,
}

/// The default `packing_wait_timeout_s`: two hours.
pub const DEFAULT_WAIT_TIMEOUT_S: u64 = 7200;
/// The default `packing_length_precompute_workers`.
pub const DEFAULT_PRECOMPUTE_WORKERS: u32 = 8;

/// The keys of `training` this module reads.
const TRAINING_KEYS: &[&str] = &[
    "packing",
    "packing_mode",
    "eval_packing",
    "packing_allow_single_long",
    "packing_align",
    "packing_wait_timeout_s",
    "packing_length_cache_persist_every",
    "packing_length_precompute_workers",
    "dataloader_drop_last",
    "effective_batch_size",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
];

/// A validated packing configuration for one run on `world_size` ranks.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PackingConfig {
    /// `training.packing` (default false).
    pub packing: bool,
    /// `training.packing_mode` (default static).
    pub packing_mode: PackingMode,
    /// The per-pack cap: `template.max_length`, else `model.max_model_len` (else
    /// `training_args.max_model_len`); `None` only when neither train nor eval packing is on.
    pub capacity: Option<u64>,
    /// The key the capacity came from (e.g. `template.max_length`).
    pub capacity_key: Option<String>,
    /// `training.packing_allow_single_long` (default false: long samples are dropped).
    pub allow_single_long: bool,
    /// `training.packing_align` (stowplan; default 1).
    pub align: u64,
    /// `training.dataloader_drop_last` for the train plan (default false: pad by repeats).
    pub dataloader_drop_last: bool,
    /// `training.eval_packing` (default: true when `packing` is on).
    pub eval_packing: bool,
    /// `training.packing_wait_timeout_s` (default 7200; 0 waits forever).
    pub wait_timeout_s: u64,
    /// `training.packing_length_cache_persist_every`; `None` = adaptive (see
    /// [`adaptive_persist_every`](super::length_cache::adaptive_persist_every)).
    pub persist_every: Option<u64>,
    /// `training.packing_length_precompute_workers` (default 8; 1 = serial).
    pub precompute_workers: u32,
    /// `custom.train_jsonl` or `custom.fusion_config`, when given: the dataset source
    /// identity for cache fingerprints.
    pub dataset_source: Option<String>,
    /// The batch arithmetic.
    pub batch: EffectiveBatch,
}

impl PackingConfig {
    /// Validates `config` for a run on `world_size` ranks. Every error names the key, the
    /// value and what to set instead.
    pub fn from_json(config: &Value, world_size: u32) -> Result<Self, Error> {
        let root = config.as_object().ok_or_else(|| cfg("the configuration must be a JSON object".to_string()))?;
        let empty = Map::new();
        let section = |name: &str| -> Result<&Map<String, Value>, Error> {
            match root.get(name) {
                None | Some(Value::Null) => Ok(&empty),
                Some(Value::Object(m)) => Ok(m),
                Some(other) => Err(cfg(format!("{name} must be an object (got {other})"))),
            }
        };
        let training = section("training")?;
        if world_size == 0 {
            return Err(Error::InvalidArgument("world_size must be at least 1 (got 0)".to_string()));
        }
        if training.contains_key("packing_length") {
            return Err(cfg("training.packing_length is deprecated and unsupported: the packing length is \
                 template.max_length (or model.max_model_len when template.max_length is unset); remove \
                 training.packing_length and set template.max_length"
                .to_string()));
        }
        for key in training.keys() {
            if (key.starts_with("packing") || key.starts_with("eval_packing")) && !TRAINING_KEYS.contains(&key.as_str())
            {
                let known: Vec<&str> = TRAINING_KEYS
                    .iter()
                    .copied()
                    .filter(|k| k.starts_with("packing") || k.starts_with("eval"))
                    .collect();
                return Err(cfg(format!(
                    "unknown key training.{key}; the packing keys are training.{}",
                    known.join(", training.")
                )));
            }
        }
        let packing = get_bool(training, "training", "packing")?.unwrap_or(false);
        let packing_mode = match training.get("packing_mode") {
            None | Some(Value::Null) => PackingMode::Static,
            Some(Value::String(s)) if s == "static" => PackingMode::Static,
            Some(Value::String(s)) if s == "dynamic" => PackingMode::Dynamic,
            Some(other) => {
                return Err(cfg(format!("training.packing_mode must be \"static\" or \"dynamic\" (got {other})")));
            }
        };
        if packing && packing_mode == PackingMode::Dynamic {
            return Err(cfg("training.packing_mode=dynamic is deprecated and unsupported for dataset-level packing \
                 (its pack count is unknowable and it differs between worker counts); set \
                 training.packing_mode=static"
                .to_string()));
        }
        let eval_packing = get_bool(training, "training", "eval_packing")?.unwrap_or(packing);
        let custom = section("custom")?;
        let fusion = custom.get("fusion_config").filter(|v| !v.is_null());
        if (packing || eval_packing) && packing_mode == PackingMode::Static && fusion.is_some() {
            return Err(cfg("custom.fusion_config is set: fusion/mixing schedules resample the dataset every epoch, \
                 but a static pack plan needs per-index samples that never change; disable packing \
                 (training.packing=false) or train from a fixed dataset (custom.train_jsonl)"
                .to_string()));
        }
        let dataset_source = match custom.get("train_jsonl").or(fusion) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => Some(other.to_string()),
        };
        let (mut capacity, mut capacity_key) = (None, None);
        for (sec, key) in [("template", "max_length"), ("model", "max_model_len"), ("training_args", "max_model_len")] {
            if let Some(v) = get_positive(section(sec)?, sec, key)? {
                capacity = Some(v);
                capacity_key = Some(format!("{sec}.{key}"));
                break;
            }
        }
        if (packing || eval_packing) && capacity.is_none() {
            return Err(cfg("packing is on but no packing length is configured: set template.max_length (or \
                 model.max_model_len)"
                .to_string()));
        }
        let precompute_workers = match get_positive(training, "training", "packing_length_precompute_workers")? {
            None => DEFAULT_PRECOMPUTE_WORKERS,
            Some(w) => u32::try_from(w).map_err(|_| {
                cfg(format!("training.packing_length_precompute_workers must be in 1..={} (got {w})", u32::MAX))
            })?,
        };
        let per_device = get_positive(training, "training", "per_device_train_batch_size")?.unwrap_or(1);
        let gas = get_positive(training, "training", "gradient_accumulation_steps")?.unwrap_or(1);
        let effective = get_positive(training, "training", "effective_batch_size")?;
        Ok(Self {
            packing,
            packing_mode,
            capacity,
            capacity_key,
            allow_single_long: get_bool(training, "training", "packing_allow_single_long")?.unwrap_or(false),
            align: get_positive(training, "training", "packing_align")?.unwrap_or(1),
            dataloader_drop_last: get_bool(training, "training", "dataloader_drop_last")?.unwrap_or(false),
            eval_packing,
            wait_timeout_s: get_u64(training, "training", "packing_wait_timeout_s")?.unwrap_or(DEFAULT_WAIT_TIMEOUT_S),
            persist_every: get_positive(training, "training", "packing_length_cache_persist_every")?,
            precompute_workers,
            dataset_source,
            batch: EffectiveBatch::derive(world_size, per_device, gas, effective, packing)?,
        })
    }

    /// The wait limit for non-rank-0 processes: `None` waits forever.
    pub fn wait_timeout(&self) -> Option<Duration> {
        (self.wait_timeout_s > 0).then(|| Duration::from_secs(self.wait_timeout_s))
    }

    /// The plan options of train and eval packing; `None` without a packing length.
    pub fn plan_options(&self) -> Option<PlanOptions> {
        self.capacity.map(|capacity| PlanOptions {
            capacity,
            align: self.align,
            allow_single_long: self.allow_single_long,
        })
    }

    /// `(world_size, drop_last)` of the train plan.
    pub fn train_alignment(&self) -> (u32, bool) {
        (self.batch.world_size, self.dataloader_drop_last)
    }

    /// `(world_size, drop_last)` of the eval plan: never dropping, so evaluation covers every
    /// sample (`packing_drop_last=false`, `dataloader_drop_last=false`).
    pub fn eval_alignment(&self) -> (u32, bool) {
        (self.batch.world_size, false)
    }
}

/// Batch sizes after packing forced one pack per device and dataloader item.
///
/// Units are packs (packed sequences) per `optimizer.step()`, across all ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EffectiveBatch {
    /// Learner ranks.
    pub world_size: u32,
    /// `per_device_train_batch_size` as configured.
    pub configured_per_device_batch_size: u64,
    /// `gradient_accumulation_steps` as configured.
    pub configured_gradient_accumulation_steps: u64,
    /// The per-device batch size used: 1 with packing, else the configured one.
    pub per_device_train_batch_size: u64,
    /// The derived accumulation steps.
    pub gradient_accumulation_steps: u64,
    /// `effective_batch_size`, when set.
    pub requested_packs_per_step: Option<u64>,
    /// Packs per optimizer step before the packing adjustment:
    /// `world_size × per_device × gradient_accumulation_steps` as configured.
    pub configured_packs_per_step: u64,
    /// Packs per optimizer step realized: `world_size × per_device_train_batch_size ×
    /// gradient_accumulation_steps`.
    pub realized_packs_per_step: u64,
}

impl EffectiveBatch {
    /// Derives the accumulation steps (the static pack plan contract):
    /// - with `effective_batch_size` E: it must be a multiple of `world_size × per-device
    ///   batch` (1 with packing), and `gradient_accumulation_steps = E / (world_size ×
    ///   per-device batch)`;
    /// - without: the configured global batch `world_size × per_device × gas` is kept, so
    ///   with packing `gradient_accumulation_steps = per_device × gas`.
    ///
    /// Errors name the key: zero sizes, `effective_batch_size` not divisible, overflow.
    pub fn derive(
        world_size: u32,
        per_device_train_batch_size: u64,
        gradient_accumulation_steps: u64,
        effective_batch_size: Option<u64>,
        packing: bool,
    ) -> Result<Self, Error> {
        if world_size == 0 {
            return Err(Error::InvalidArgument("world_size must be at least 1 (got 0)".to_string()));
        }
        if per_device_train_batch_size == 0 {
            return Err(cfg("training.per_device_train_batch_size must be a positive integer (got 0)".to_string()));
        }
        if gradient_accumulation_steps == 0 {
            return Err(cfg("training.gradient_accumulation_steps must be a positive integer (got 0)".to_string()));
        }
        let ws = u64::from(world_size);
        let overflow = || cfg("training batch sizes overflow u64".to_string());
        let configured = ws
            .checked_mul(per_device_train_batch_size)
            .and_then(|x| x.checked_mul(gradient_accumulation_steps))
            .ok_or_else(overflow)?;
        let per_device = if packing { 1 } else { per_device_train_batch_size };
        let gas = match effective_batch_size {
            Some(0) => return Err(cfg("training.effective_batch_size must be a positive integer (got 0)".to_string())),
            Some(e) => {
                let unit = ws * per_device;
                if e % unit != 0 {
                    let lo = e / unit * unit;
                    let alternatives = if lo == 0 { format!("{unit}") } else { format!("{lo} or {}", lo + unit) };
                    return Err(cfg(format!(
                        "training.effective_batch_size = {e} is not divisible by world_size = {world_size}{}: \
                         {} realizes world_size × gradient_accumulation_steps packs per optimizer step; set \
                         training.effective_batch_size to a multiple of {unit}, e.g. {alternatives}",
                        if per_device > 1 {
                            format!(" × per_device_train_batch_size = {per_device}")
                        } else {
                            String::new()
                        },
                        if packing { "packing" } else { "training" },
                    )));
                }
                e / unit
            }
            None if packing => {
                per_device_train_batch_size.checked_mul(gradient_accumulation_steps).ok_or_else(overflow)?
            }
            None => gradient_accumulation_steps,
        };
        Ok(Self {
            world_size,
            configured_per_device_batch_size: per_device_train_batch_size,
            configured_gradient_accumulation_steps: gradient_accumulation_steps,
            per_device_train_batch_size: per_device,
            gradient_accumulation_steps: gas,
            requested_packs_per_step: effective_batch_size,
            configured_packs_per_step: configured,
            realized_packs_per_step: ws * per_device * gas,
        })
    }

    /// One line for the log: requested (or configured) vs realized packs per optimizer step.
    pub fn report(&self) -> String {
        let requested = match self.requested_packs_per_step {
            Some(e) => format!("requested {e} packs/step (effective_batch_size)"),
            None => format!(
                "configured {} packs/step (world_size × per_device × accumulation)",
                self.configured_packs_per_step
            ),
        };
        format!(
            "effective batch: {requested}, realized {} = world_size {} × per_device_train_batch_size {} × \
             gradient_accumulation_steps {}",
            self.realized_packs_per_step,
            self.world_size,
            self.per_device_train_batch_size,
            self.gradient_accumulation_steps
        )
    }

    /// The warning the static pack plan contract asks for when an epoch of `per_rank_batches` packed batches per
    /// rank ends in a partial accumulation window; `None` when the windows are exact.
    pub fn accumulation_warning(&self, per_rank_batches: u64) -> Option<String> {
        let gas = self.gradient_accumulation_steps;
        if per_rank_batches >= gas && per_rank_batches % gas == 0 {
            return None;
        }
        Some(format!(
            "partial accumulation window: {per_rank_batches} packed batches per rank per epoch with \
             gradient_accumulation_steps = {gas} leave {} batches for the last optimizer step, so its packs per \
             optimizer.step() are inexact ({} instead of {}); adjust effective_batch_size or the dataset to make \
             per-rank batches a multiple of {gas}",
            per_rank_batches % gas,
            (per_rank_batches % gas) * u64::from(self.world_size) * self.per_device_train_batch_size,
            self.realized_packs_per_step
        ))
    }
}

fn cfg(message: String) -> Error {
    Error::Config(message)
}

fn get_bool(m: &Map<String, Value>, sec: &str, key: &str) -> Result<Option<bool>, Error> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(cfg(format!("{sec}.{key} must be true or false (got {other})"))),
    }
}

fn get_u64(m: &Map<String, Value>, sec: &str, key: &str) -> Result<Option<u64>, Error> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| cfg(format!("{sec}.{key} must be an integer in 0..={} (got {v})", u64::MAX))),
    }
}

fn get_positive(m: &Map<String, Value>, sec: &str, key: &str) -> Result<Option<u64>, Error> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(x) if x > 0 => Ok(Some(x)),
            _ => Err(cfg(format!("{sec}.{key} must be a positive integer (≥ 1) (got {v})"))),
        },
    }
}
