//! Static pack plans (the static pack plan contract): [`StaticPackPlan`] — the kernel's raw plan and its
//! alignment, the pair training consumes — with its summary, log lines and a JSON form that
//! is verified when loaded; the length cache ([`length_cache`]) and the training config
//! ([`config`]) that feed it.
//!
//! ```no_run
//! use stowplan::{Kernel, kernel::PlanOptions, StaticPackPlan};
//!
//! let kernel = Kernel::wasm()?;
//! let lengths = [900, 3_000, 120, 4_096, 2_000, 15_000];
//! let mut options = PlanOptions::new(4_096);
//! options.allow_single_long = true;
//! let plan = StaticPackPlan::build(&kernel, &lengths, &options, 4, false)?;
//! assert_eq!(plan.len() % 4, 0);
//! for line in plan.log_lines() {
//!     println!("{line}");
//! }
//! # Ok::<(), stowplan::Error>(())
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use stowplan_kernel as k;
use stowplan_kernel::{AlignedPlan, MultiMethod, Named, PlanLimits, PlanOptions, RawPlan};

use crate::Error;
use crate::kernel::Kernel;

pub mod config;
pub mod length_cache;

/// Format tag of [`StaticPackPlan::to_json`] for a plan of tokens only. Version 2 adds
/// `document_sha256`, which covers every field (version 1 checksummed only the packs, so an
/// edited `capacity` or `dropped_samples` loaded and made the plan's log lie).
pub const PLAN_FORMAT: &str = "stowplan.static-pack-plan/2";

/// Format tag of a plan under further limits ([`StaticPackPlan::limits`]): version 2 plus a
/// `limits` object (each limit's name and cap, `max_segments`, the method and every pack's
/// loads), checked on load. A reader of version 2 only refuses it rather than drop the limits.
pub const LIMITED_PLAN_FORMAT: &str = "stowplan.static-pack-plan/3";

/// The limits of a static plan beside `capacity`, and what the plan holds of each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackLimits {
    /// Each limited resource's name (a column of the input: `image_tokens`, `images` …).
    pub names: Vec<String>,
    /// Each resource's cap per multi-sample pack, in the order of `names`.
    pub caps: Vec<u64>,
    /// At most this many samples per multi-sample pack; 0: no limit.
    pub max_segments: u64,
    /// The algorithm that packed the samples.
    pub method: MultiMethod,
    /// Every raw pack's load in each resource, pack by pack (`packs × names.len()`).
    pub loads: Vec<u64>,
    /// The lower bound of the multi-sample packs per resource: tokens, each limit, then the
    /// segments when `max_segments > 0` (the plan's `lower_bound` is their largest plus the
    /// single-long packs).
    pub lower_bounds: Vec<u64>,
}

/// A raw plan and its alignment for `world_size` ranks: what one training run consumes.
///
/// `len()` is the number of aligned packs (the dataset length per epoch); `pack(i)` the
/// sample indices of aligned pack `i`.
#[derive(Clone, Debug, PartialEq)]
pub struct StaticPackPlan {
    /// The options the raw plan was built with.
    pub options: PlanOptions,
    /// The limits beside `capacity` ([`Self::build_limited`]); `None` for a plan of
    /// tokens only.
    pub limits: Option<PackLimits>,
    /// Number of samples the plan was built from.
    pub samples: u64,
    /// Learner ranks the plan is aligned for.
    pub world_size: u32,
    /// Whether the remainder was dropped (true) or padded by repeats (false).
    pub drop_last: bool,
    /// The world-size independent plan.
    pub raw: RawPlan,
    /// The alignment of `raw` for `world_size` ranks.
    pub aligned: AlignedPlan,
}

impl StaticPackPlan {
    /// Builds the raw plan of `lengths` and aligns it for `world_size` ranks.
    pub fn build(
        kernel: &Kernel,
        lengths: &[u64],
        options: &PlanOptions,
        world_size: u32,
        drop_last: bool,
    ) -> Result<Self, Error> {
        let raw = kernel.raw_plan(lengths, options, None)?.raw;
        let aligned = kernel.aligned_plan(&raw, world_size, drop_last)?;
        Ok(Self { options: *options, limits: None, samples: lengths.len() as u64, world_size, drop_last, raw, aligned })
    }

    /// [`Self::build`] under further limits per pack (image tokens, images, segments; see
    /// `wit/kernel.wit`, `plan.raw-plan`). Unnamed limits are called `resource 1`, `resource 2` …
    /// in the plan. With no limit and no segment limit it is [`Self::build`].
    pub fn build_limited(
        kernel: &Kernel,
        lengths: &[u64],
        options: &PlanOptions,
        limits: &PlanLimits<'_>,
        world_size: u32,
        drop_last: bool,
    ) -> Result<Self, Error> {
        if limits.limits.caps.is_empty() && limits.max_segments == 0 {
            return Self::build(kernel, lengths, options, world_size, drop_last);
        }
        let l = kernel.raw_plan(lengths, options, Some(limits))?;
        let aligned = kernel.aligned_plan(&l.raw, world_size, drop_last)?;
        let limits = PackLimits {
            names: l.names,
            caps: limits.limits.caps.to_vec(),
            max_segments: limits.max_segments,
            method: limits.method,
            loads: l.loads,
            lower_bounds: l.lower_bounds,
        };
        Ok(Self {
            options: *options,
            limits: Some(limits),
            samples: lengths.len() as u64,
            world_size,
            drop_last,
            raw: l.raw,
            aligned,
        })
    }

    /// The same raw plan aligned for another `world_size` / `drop_last` (e.g. the eval
    /// split, which never drops).
    pub fn realign(&self, kernel: &Kernel, world_size: u32, drop_last: bool) -> Result<Self, Error> {
        let aligned = kernel.aligned_plan(&self.raw, world_size, drop_last)?;
        Ok(Self { aligned, world_size, drop_last, ..self.clone() })
    }

    /// Number of aligned packs: the length of the packed dataset per epoch.
    pub fn len(&self) -> usize {
        self.aligned.packs.len()
    }

    /// Whether the aligned plan is empty (never: building fails instead).
    pub fn is_empty(&self) -> bool {
        self.aligned.packs.is_empty()
    }

    /// The sample indices of aligned pack `i` (ascending); `None` past the end.
    pub fn pack(&self, i: usize) -> Option<&[u32]> {
        self.aligned.packs.get(i).map(|&p| self.raw.pack(p as usize))
    }

    /// Number of raw packs.
    pub fn raw_len(&self) -> usize {
        self.raw.packs()
    }

    /// Aligned packs per rank (`len() / world_size`).
    pub fn per_rank(&self) -> usize {
        self.len() / self.world_size.max(1) as usize
    }

    /// The raw plan's checksum, lowercase hex.
    pub fn raw_checksum(&self) -> String {
        self.raw.checksum_hex()
    }

    /// The aligned plan's checksum, lowercase hex.
    pub fn aligned_checksum(&self) -> String {
        self.aligned.checksum_hex()
    }

    /// Fill of the multi-sample packs: their real tokens (the single-long packs' excluded)
    /// over `multi-sample packs × packing_length`, in 0..=1 (a figure for reports).
    pub fn efficiency(&self) -> f64 {
        let regular = self.raw_len() - self.raw.single_long.len();
        if regular == 0 {
            return 0.0;
        }
        (self.raw.real_tokens - self.single_long_tokens()) as f64 / (regular as f64 * self.options.capacity as f64)
    }

    /// Real tokens of the single-long packs (each may hold more than `capacity`):
    /// `raw.real_tokens` minus this is what the multi-sample packs hold.
    pub fn single_long_tokens(&self) -> u64 {
        self.raw.single_long.iter().map(|&i| self.single_tokens(i)).sum()
    }

    /// Tokens of the single-long pack of sample `i`.
    fn single_tokens(&self, i: u32) -> u64 {
        // Packs are ordered by first index and a single-long pack holds only `i`.
        let p = self.raw.offsets[..self.raw_len()].partition_point(|&o| self.raw.indices[o as usize] < i);
        self.raw.tokens[p]
    }

    /// The lines the static pack plan contract requires in the log: raw and aligned pack counts, world size and
    /// `drop_last`, the packs repeated (or dropped), long samples, and both checksums.
    pub fn log_lines(&self) -> Vec<String> {
        self.log_records().into_iter().map(|r| r.text).collect()
    }

    /// [`Self::log_lines`] with their level: lines reporting samples that will not be trained
    /// on (dropped long samples, packs dropped by `drop_last`) are warnings.
    pub fn log_records(&self) -> Vec<LogLine> {
        let info = |text: String| LogLine { warning: false, text };
        let warn = |text: String| LogLine { warning: true, text };
        let mut lines = vec![info(format!(
            "static pack plan: N_raw_packs={} N_aligned_packs={} world_size={} dataloader_drop_last={} \
             capacity={} samples={}",
            self.raw_len(),
            self.len(),
            self.world_size,
            self.drop_last,
            self.options.capacity,
            self.samples
        ))];
        if let Some(l) = &self.limits {
            let mut caps: Vec<String> = l.names.iter().zip(&l.caps).map(|(n, c)| format!("{n}<={c}")).collect();
            if l.max_segments > 0 {
                caps.push(format!("segments<={}", l.max_segments));
            }
            let mut bound_names = vec!["tokens".to_string()];
            bound_names.extend(l.names.iter().cloned());
            if l.max_segments > 0 {
                bound_names.push("segments".into());
            }
            let bounds: Vec<String> =
                bound_names.iter().zip(&l.lower_bounds).map(|(n, b)| format!("{n}={b}")).collect();
            lines.push(info(format!(
                "static pack plan: limits {} method={} lower_bounds {}",
                caps.join(" "),
                l.method.as_str(),
                bounds.join(" ")
            )));
        }
        if self.aligned.pad_needed > 0 {
            lines.push(info(format!(
                "static pack plan: pad_needed={} repeated raw packs {}",
                self.aligned.pad_needed,
                index_list(self.aligned.packs[self.raw_len()..].iter().copied())
            )));
        }
        if self.aligned.dropped_packs > 0 {
            lines.push(warn(format!(
                "static pack plan: drop_last drops the last {} raw packs ({} samples): {}",
                self.aligned.dropped_packs,
                self.aligned.dropped_samples,
                index_list((self.len() as u32)..self.raw_len() as u32)
            )));
        }
        if !self.raw.single_long.is_empty() {
            lines.push(info(format!(
                "static pack plan: {} long samples (length >= {}{}) emitted as single-sample packs: {}",
                self.raw.single_long.len(),
                self.options.capacity,
                self.over_a_limit(),
                index_list(self.raw.single_long.iter().copied())
            )));
        }
        if !self.raw.dropped.is_empty() {
            lines.push(warn(format!(
                "static pack plan: {} long samples (length >= {}{}) dropped (allow_single_long=false): {}",
                self.raw.dropped.len(),
                self.options.capacity,
                self.over_a_limit(),
                index_list(self.raw.dropped.iter().copied())
            )));
        }
        lines.push(info(format!(
            "static pack plan: raw_plan sha256={} aligned_plan sha256={}",
            self.raw_checksum(),
            self.aligned_checksum()
        )));
        lines
    }

    /// What else makes a sample long, for the log: `" or over a limit"` with limits.
    fn over_a_limit(&self) -> &'static str {
        if self.limits.as_ref().is_some_and(|l| !l.caps.is_empty()) { " or over a limit" } else { "" }
    }

    /// Emits [`Self::log_records`] through `tracing` (target `stowplan::plan`).
    pub fn log(&self) {
        for line in self.log_records() {
            if line.warning {
                tracing::warn!(target: "stowplan::plan", "{}", line.text);
            } else {
                tracing::info!(target: "stowplan::plan", "{}", line.text);
            }
        }
    }

    /// The plan as a JSON document (format [`PLAN_FORMAT`], or [`LIMITED_PLAN_FORMAT`] with
    /// limits): options, the raw packs as index lists, the aligned plan as raw pack indices,
    /// long samples, both checksums and the limits with every pack's loads.
    pub fn to_json(&self) -> serde_json::Value {
        let doc = PlanDoc {
            format: if self.limits.is_some() { LIMITED_PLAN_FORMAT } else { PLAN_FORMAT }.to_string(),
            limits: self.limits.as_ref().map(|l| LimitsDoc {
                names: l.names.clone(),
                caps: l.caps.clone(),
                max_segments: l.max_segments,
                method: l.method.as_str().to_string(),
                // One row per pack, empty with a segment limit alone.
                loads: (0..self.raw_len()).map(|p| l.loads[p * l.names.len()..][..l.names.len()].to_vec()).collect(),
            }),
            packing_length: self.options.capacity,
            align: self.options.align,
            allow_single_long: self.options.allow_single_long,
            samples: self.samples,
            world_size: self.world_size,
            drop_last: self.drop_last,
            raw_checksum: self.raw_checksum(),
            aligned_checksum: self.aligned_checksum(),
            raw_plan: (0..self.raw_len()).map(|p| self.raw.pack(p).to_vec()).collect(),
            raw_tokens: self.raw.tokens.clone(),
            aligned_plan: self.aligned.packs.clone(),
            pad_needed: self.aligned.pad_needed,
            dropped_packs: self.aligned.dropped_packs,
            single_long: self.raw.single_long.clone(),
            dropped_samples: self.raw.dropped.clone(),
            lower_bound: self.raw.lower_bound,
            real_tokens: self.raw.real_tokens,
            aligned_tokens: self.raw.aligned_tokens,
            document_sha256: String::new(),
        };
        let doc = PlanDoc { document_sha256: doc.digest(), ..doc };
        // Serializing plain integers, strings and vectors cannot fail.
        serde_json::to_value(doc).unwrap_or(serde_json::Value::Null)
    }

    /// Reads a plan written by [`Self::to_json`]: the document's sha256 over every field, the
    /// plan's structure, then both plan checksums recomputed from the packs. An edited or
    /// damaged document is an [`Error::CacheMismatch`]; another format an
    /// [`Error::InvalidArgument`].
    ///
    /// What the checks promise: the sha256s detect accidents (a truncated copy, a bit flip, a
    /// hand edit that forgot a field); their recipe is public, so anyone can recompute them
    /// after an edit, and they prove nothing about who wrote the file. The structure is
    /// checked whatever the hashes say, so even a forged plan that loads is a plan: every
    /// sample `0..samples` is in exactly one pack or in `dropped_samples`, never both; packs
    /// are non-empty with ascending members; no pack records more than `capacity`
    /// tokens unless it is a single long sample listed in `single_long` (only with
    /// `allow_single_long`); `real_tokens` is the packs' sum and `lower_bound` follows from
    /// `aligned_tokens`. It cannot know the samples' lengths: a forger who lies consistently
    /// about a pack's tokens is caught only against the samples' lengths (rebuilding the plan
    /// from the length cache gives the same checksums). For authenticity, sign the file or keep
    /// it where only the trainer can write.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, Error> {
        let format = value.get("format").and_then(|f| f.as_str());
        match format {
            Some(PLAN_FORMAT | LIMITED_PLAN_FORMAT) => {}
            Some("stowplan.static-pack-plan/1") => {
                return Err(Error::InvalidArgument(format!(
                    "plan document: format stowplan.static-pack-plan/1 (written by an older stowplan, which \
                     checksummed only the packs); rebuild the plan to get {PLAN_FORMAT:?}"
                )));
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "plan document: format {other:?} is not {PLAN_FORMAT:?} or {LIMITED_PLAN_FORMAT:?}"
                )));
            }
        }
        let doc: PlanDoc =
            serde_json::from_value(value.clone()).map_err(|e| Error::InvalidArgument(format!("plan document: {e}")))?;
        let digest = doc.digest();
        if digest != doc.document_sha256 {
            return Err(Error::CacheMismatch(format!(
                "plan document: its fields hash to {digest} but it records document_sha256 {}; the file was \
                 edited or corrupted — rebuild the plan",
                doc.document_sha256
            )));
        }
        if doc.limits.is_some() != (format == Some(LIMITED_PLAN_FORMAT)) {
            return Err(Error::InvalidArgument(format!(
                "plan document: format {LIMITED_PLAN_FORMAT:?} and only it carries `limits` (format {format:?}, limits \
                 {})",
                if doc.limits.is_some() { "present" } else { "absent" }
            )));
        }
        let limits = doc.check_structure()?;
        let (offsets, indices) = k::flatten(&doc.raw_plan);
        let raw_check = k::aligned_plan(&offsets, &indices, 1, false)?;
        let aligned = k::aligned_plan(&offsets, &indices, doc.world_size, doc.drop_last)?;
        if raw_check.checksum_hex() != doc.raw_checksum || aligned.checksum_hex() != doc.aligned_checksum {
            return Err(Error::CacheMismatch(format!(
                "plan document: the packs hash to raw {} / aligned {} but the document records {} / {}; \
                 the file was edited or corrupted — rebuild the plan",
                raw_check.checksum_hex(),
                aligned.checksum_hex(),
                doc.raw_checksum,
                doc.aligned_checksum
            )));
        }
        if aligned.packs != doc.aligned_plan {
            return Err(Error::CacheMismatch(
                "plan document: aligned_plan does not follow from raw_plan, world_size and drop_last".to_string(),
            ));
        }
        let raw = RawPlan {
            offsets,
            indices,
            tokens: doc.raw_tokens,
            single_long: doc.single_long,
            dropped: doc.dropped_samples,
            real_tokens: doc.real_tokens,
            aligned_tokens: doc.aligned_tokens,
            lower_bound: doc.lower_bound,
            checksum: raw_check.checksum,
        };
        let options =
            PlanOptions { capacity: doc.packing_length, align: doc.align, allow_single_long: doc.allow_single_long };
        Ok(Self {
            options,
            limits,
            samples: doc.samples,
            world_size: doc.world_size,
            drop_last: doc.drop_last,
            raw,
            aligned,
        })
    }

    /// Writes [`Self::to_json`] to `path` atomically (temporary file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        let bytes = serde_json::to_vec(&self.to_json()).map_err(|e| Error::Io(format!("encoding the plan: {e}")))?;
        crate::runtime::atomic::write(path, &bytes)
    }

    /// Reads and verifies a plan saved by [`Self::save`].
    pub fn load(path: &Path) -> Result<Self, Error> {
        let bytes = std::fs::read(path).map_err(|e| Error::io("reading", path, e))?;
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::InvalidArgument(format!("{}: not a plan document: {e}", path.display())))?;
        Self::from_json(&value)
    }
}

/// One line of a plan's log (see [`StaticPackPlan::log_records`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// Whether the line reports samples that will not be trained on.
    pub warning: bool,
    /// The text.
    pub text: String,
}

/// The on-disk form of a [`StaticPackPlan`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanDoc {
    format: String,
    /// Absent in format 2 (so its documents and their sha256 are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limits: Option<LimitsDoc>,
    /// The plan's token cap (`PlanOptions::capacity`), under the key its formats have always used.
    packing_length: u64,
    align: u64,
    allow_single_long: bool,
    samples: u64,
    world_size: u32,
    drop_last: bool,
    raw_checksum: String,
    aligned_checksum: String,
    raw_plan: Vec<Vec<u32>>,
    raw_tokens: Vec<u64>,
    aligned_plan: Vec<u32>,
    pad_needed: u32,
    dropped_packs: u32,
    single_long: Vec<u32>,
    dropped_samples: Vec<u32>,
    lower_bound: u64,
    real_tokens: u64,
    aligned_tokens: u64,
    /// sha256 (hex) of the document's canonical JSON with this field empty.
    document_sha256: String,
}

impl PlanDoc {
    /// The structural rules of a plan (see [`StaticPackPlan::from_json`]); memory in
    /// proportion to the document. Errors: `cache-mismatch` naming the rule and the first
    /// offending pack or sample.
    fn check_structure(&self) -> Result<Option<PackLimits>, Error> {
        let bad = |m: String| Err(Error::CacheMismatch(format!("plan document: {m}; rebuild the plan")));
        if self.packing_length == 0 || self.align == 0 || self.world_size == 0 {
            return bad(format!(
                "packing_length {}, align {} and world_size {} must each be at least 1",
                self.packing_length, self.align, self.world_size
            ));
        }
        if self.samples > 1 << 32 {
            return bad(format!("samples is {}, over 2^32 (indices are u32)", self.samples));
        }
        if self.raw_tokens.len() != self.raw_plan.len() {
            return bad(format!("raw_tokens has {} entries for {} packs", self.raw_tokens.len(), self.raw_plan.len()));
        }
        if !self.allow_single_long && !self.single_long.is_empty() {
            return bad(format!("single_long lists {} samples but allow_single_long is false", self.single_long.len()));
        }
        if self.allow_single_long && !self.dropped_samples.is_empty() {
            return bad(format!(
                "dropped_samples lists {} samples but allow_single_long is true",
                self.dropped_samples.len()
            ));
        }
        let single: std::collections::BTreeSet<u32> = self.single_long.iter().copied().collect();
        let mut singles_seen = 0usize;
        let mut real_tokens: u128 = 0;
        for (p, (members, &tokens)) in self.raw_plan.iter().zip(&self.raw_tokens).enumerate() {
            if members.is_empty() {
                return bad(format!("raw pack {p} is empty"));
            }
            if members.windows(2).any(|w| w[0] >= w[1]) {
                return bad(format!("raw pack {p}'s members are not strictly ascending"));
            }
            real_tokens += u128::from(tokens);
            let long = members.len() == 1 && single.contains(&members[0]);
            singles_seen += usize::from(long);
            if tokens > self.packing_length && !long {
                return bad(format!(
                    "raw pack {p} records {tokens} tokens, over packing_length {} (only a single long sample listed \
                     in single_long may be)",
                    self.packing_length
                ));
            }
        }
        if singles_seen != self.single_long.len() {
            return bad(format!(
                "single_long lists {} samples but {singles_seen} packs hold one of them alone",
                self.single_long.len()
            ));
        }
        if real_tokens != u128::from(self.real_tokens) {
            return bad(format!("the packs hold {real_tokens} tokens but real_tokens records {}", self.real_tokens));
        }
        let tokens_bound = self.aligned_tokens.div_ceil(self.packing_length);
        let is_single: Vec<bool> = self.raw_plan.iter().map(|m| m.len() == 1 && single.contains(&m[0])).collect();
        let limits = self.limits.as_ref().map(|l| l.check(self, &is_single, tokens_bound)).transpose()?;
        let regular = limits.as_ref().map_or(tokens_bound, |l| l.lower_bounds.iter().copied().max().unwrap_or(0));
        let bound = regular.checked_add(self.single_long.len() as u64);
        if bound != Some(self.lower_bound) || (self.raw_plan.len() as u64) < self.lower_bound {
            return bad(format!(
                "lower_bound {} does not follow from aligned_tokens {} (and the limits' loads) and {} single long \
                 samples, or exceeds the {} packs",
                self.lower_bound,
                self.aligned_tokens,
                self.single_long.len(),
                self.raw_plan.len()
            ));
        }
        // Every sample exactly once: packed or dropped.
        let mut all: Vec<u32> = self.raw_plan.iter().flatten().chain(&self.dropped_samples).copied().collect();
        all.sort_unstable();
        if let Some(&i) = all.iter().find(|&&i| u64::from(i) >= self.samples) {
            return bad(format!("sample {i} is out of range: the plan has {} samples", self.samples));
        }
        if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("sample {} appears twice (in two packs, or packed and dropped)", w[0]));
        }
        if all.len() as u64 != self.samples {
            let missing =
                (0u64..).zip(&all).find(|&(want, &got)| u64::from(got) != want).map_or(all.len() as u64, |(w, _)| w);
            return bad(format!(
                "the packs and dropped_samples hold {} of the {} samples (sample {missing} is in neither)",
                all.len(),
                self.samples
            ));
        }
        Ok(limits)
    }

    /// The sha256 of this document's canonical JSON (keys sorted, as `serde_json::Value`
    /// keeps them) with `document_sha256` empty.
    fn digest(&self) -> String {
        let mut blank = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(map) = blank.as_object_mut() {
            map.insert("document_sha256".into(), serde_json::Value::String(String::new()));
        }
        crate::runtime::sha256_hex(serde_json::to_string(&blank).unwrap_or_default().as_bytes())
    }
}

/// The `limits` of a format-3 plan document.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsDoc {
    /// Each limit's name.
    names: Vec<String>,
    /// Each limit's cap per multi-sample pack.
    caps: Vec<u64>,
    /// At most this many samples per multi-sample pack (0: no limit).
    max_segments: u64,
    /// The packing method's name.
    method: String,
    /// Every raw pack's load in each limit.
    loads: Vec<Vec<u64>>,
}

impl LimitsDoc {
    /// The limits' rules (names, caps, method, loads one row per pack, every multi-sample pack
    /// within every cap and `max_segments`) and the [`PackLimits`] they give, with the lower
    /// bounds recomputed from the loads (`tokens_bound` for the tokens). `single[p]`: raw pack
    /// `p` is a single long sample, exempt from the limits.
    fn check(&self, doc: &PlanDoc, single: &[bool], tokens_bound: u64) -> Result<PackLimits, Error> {
        let bad = |m: String| Err(Error::CacheMismatch(format!("plan document: limits: {m}; rebuild the plan")));
        let e = self.names.len();
        if self.caps.len() != e || e >= k::MAX_RESOURCES || (e == 0 && self.max_segments == 0) {
            return bad(format!(
                "{e} names and {} caps: one cap per name, at most {} limits, and at least one limit or max_segments",
                self.caps.len(),
                k::MAX_RESOURCES - 1
            ));
        }
        for (q, name) in self.names.iter().enumerate() {
            if name.is_empty() || name == "tokens" || self.names[..q].contains(name) || self.caps[q] == 0 {
                return bad(format!(
                    "limit {q} ({name:?}, cap {}): names must be non-empty, different and not \"tokens\", caps ≥ 1",
                    self.caps[q]
                ));
            }
        }
        let method = match MultiMethod::parse_name(&self.method) {
            Ok(m) => m,
            Err(err) => return bad(err.to_string()),
        };
        if self.loads.len() != doc.raw_plan.len() {
            return bad(format!("loads has {} rows for {} packs", self.loads.len(), doc.raw_plan.len()));
        }
        let mut sums = vec![0u128; e];
        let mut members = 0u64;
        for (p, row) in self.loads.iter().enumerate() {
            if row.len() != e {
                return bad(format!("loads of pack {p} has {} entries for {e} limits", row.len()));
            }
            if single[p] {
                continue;
            }
            if let Some(q) = (0..e).find(|&q| row[q] > self.caps[q]) {
                return bad(format!(
                    "raw pack {p} records {} {}, over its cap {} (only a single long sample may be)",
                    row[q], self.names[q], self.caps[q]
                ));
            }
            if self.max_segments > 0 && doc.raw_plan[p].len() as u64 > self.max_segments {
                return bad(format!(
                    "raw pack {p} holds {} samples, over max_segments {}",
                    doc.raw_plan[p].len(),
                    self.max_segments
                ));
            }
            for (sum, &load) in sums.iter_mut().zip(row) {
                *sum += u128::from(load);
            }
            members += doc.raw_plan[p].len() as u64;
        }
        let mut lower_bounds = vec![tokens_bound];
        for (sum, &cap) in sums.iter().zip(&self.caps) {
            lower_bounds.push(u64::try_from(sum.div_ceil(u128::from(cap))).unwrap_or(u64::MAX));
        }
        if self.max_segments > 0 {
            lower_bounds.push(members.div_ceil(self.max_segments));
        }
        Ok(PackLimits {
            names: self.names.clone(),
            caps: self.caps.clone(),
            max_segments: self.max_segments,
            method,
            loads: self.loads.concat(),
            lower_bounds,
        })
    }
}

/// `[a, b, c]` for up to 16 indices, `[a, b, …, z] (n in all)` beyond.
fn index_list(items: impl ExactSizeIterator<Item = u32>) -> String {
    let n = items.len();
    let all: Vec<u32> = items.collect();
    if n <= 16 {
        return format!("{all:?}");
    }
    let head: Vec<String> = all[..8].iter().map(u32::to_string).collect();
    format!("[{}, …, {}] ({n} in all)", head.join(", "), all[n - 1])
}
