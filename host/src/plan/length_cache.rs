//! The per-sample length cache of static packing (the static pack plan contract): lengths computed once by a
//! caller-supplied function, persisted under a run-scoped directory with a fingerprint of
//! what they depend on, flushed periodically and atomically, resumed after a crash.
//!
//! File `DIR/lengths.splc`: the [`wire::LENGTH_CACHE`] frame (magic `SPLC`, version,
//! postcard body, CRC-32) around `complete` (every length known), the `fingerprint` (sha256 of
//! the inputs JSON), the inputs JSON itself (`{"config": …, "format":
//! "stowplan.length-cache/1", "samples": n, "source": …}`, keys sorted) and the `n` lengths
//! (`u64::MAX` marks one not computed yet).
//!
//! The bytes depend only on the inputs and the lengths, so a cache filled by any number of
//! workers in any order is byte-identical to a serial one once complete.
//!
//! ```no_run
//! use stowplan::plan::length_cache::LengthCache;
//!
//! let config = serde_json::json!({"template": "chatml", "max_length": 16384});
//! let mut cache = LengthCache::open("out/run1/stowplan".as_ref(), "data/train.jsonl", 1_000, &config, None)?;
//! let lengths = cache.precompute(8, |i| Ok(100 + i as u64))?.to_vec();
//! assert_eq!(lengths.len(), 1_000);
//! # Ok::<(), stowplan::Error>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use serde::{Deserialize, Serialize};

use crate::{Error, wire};

/// The cache file's name inside the cache directory.
pub const FILE_NAME: &str = "lengths.splc";
/// The format tag stored in the inputs JSON.
pub const FORMAT: &str = "stowplan.length-cache/1";
/// Marks a length not computed yet.
const MISSING: u64 = u64::MAX;

/// The adaptive flush cadence used when no `persist_every` is given: about 1 % of the
/// samples, at least 1,024 and at most 262,144 lengths between flushes (a flush rewrites the
/// whole file, so larger datasets flush less often relative to their size), and in adaptive
/// mode never more often than every [`ADAPTIVE_MIN_INTERVAL`], so cheap length functions do
/// not spend their time in fsync. An explicit `persist_every` is followed exactly.
pub fn adaptive_persist_every(samples: u64) -> u64 {
    (samples / 100).clamp(1_024, 262_144)
}

/// The shortest time between two flushes in adaptive mode.
pub const ADAPTIVE_MIN_INTERVAL: Duration = Duration::from_secs(2);

/// An open length cache (see the module docs).
#[derive(Debug)]
pub struct LengthCache {
    path: PathBuf,
    inputs: String,
    fingerprint: [u8; 32],
    lengths: Vec<u64>,
    known: u64,
    persist_every: u64,
    since_flush: u64,
    flushes: u64,
    /// Adaptive mode: the time of the last flush (or of opening), to rate-limit flushes.
    adaptive_since: Option<Instant>,
}

impl LengthCache {
    /// Opens (or starts) the cache of `samples` lengths of dataset `source` under `dir`.
    /// `config` is everything else the lengths depend on (template, tokenizer, packing
    /// configuration …). An existing file with the same fingerprint is resumed; one with
    /// another fingerprint is an [`Error::CacheMismatch`] naming what differs.
    /// `persist_every` (≥ 1) is the flush cadence in computed lengths; `None` = adaptive.
    pub fn open(
        dir: &Path,
        source: &str,
        samples: usize,
        config: &Value,
        persist_every: Option<u64>,
    ) -> Result<Self, Error> {
        if persist_every == Some(0) {
            return Err(Error::InvalidArgument("persist_every must be at least 1 (got 0)".to_string()));
        }
        let (inputs, fingerprint) = fingerprint(source, samples, config);
        let path = dir.join(FILE_NAME);
        let adaptive_since = persist_every.is_none().then(Instant::now);
        let persist_every = persist_every.unwrap_or_else(|| adaptive_persist_every(samples as u64));
        let mut cache = Self {
            path,
            inputs,
            fingerprint,
            lengths: vec![MISSING; samples],
            known: 0,
            persist_every,
            since_flush: 0,
            flushes: 0,
            adaptive_since,
        };
        match std::fs::read(&cache.path) {
            Ok(bytes) => {
                let stored = decode(&cache.path, &bytes)?;
                if stored.fingerprint != cache.fingerprint {
                    return Err(mismatch(&cache.path, &stored.inputs, &cache.inputs));
                }
                if stored.lengths.len() != samples {
                    return Err(Error::CacheMismatch(format!(
                        "{} holds {} lengths for {samples} samples; delete it to recompute",
                        cache.path.display(),
                        stored.lengths.len()
                    )));
                }
                cache.known = stored.lengths.iter().filter(|&&l| l != MISSING).count() as u64;
                cache.lengths = stored.lengths;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(|e| Error::io("creating directory", dir, e))?;
            }
            Err(e) => return Err(Error::io("reading", &cache.path, e)),
        }
        Ok(cache)
    }

    /// One look at the cache under `dir`: its lengths when the file exists and is complete,
    /// `None` when it is missing or still partial. A file made for other inputs is an
    /// [`Error::CacheMismatch`] (fail fast instead of waiting for it to change).
    pub fn poll(dir: &Path, source: &str, samples: usize, config: &Value) -> Result<Option<Vec<u64>>, Error> {
        let (inputs, fingerprint) = fingerprint(source, samples, config);
        let path = dir.join(FILE_NAME);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let stored = decode(&path, &bytes)?;
                if stored.fingerprint != fingerprint {
                    return Err(mismatch(&path, &stored.inputs, &inputs));
                }
                Ok(stored.complete.then_some(stored.lengths))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("reading", &path, e)),
        }
    }

    /// Waits until the cache under `dir` is complete (another process — rank 0 — fills it)
    /// and returns its lengths, polling ([`Self::poll`]) every 50 ms, backing off to 1 s;
    /// `timeout` `None` waits forever.
    pub fn wait(
        dir: &Path,
        source: &str,
        samples: usize,
        config: &Value,
        timeout: Option<Duration>,
    ) -> Result<Vec<u64>, Error> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            if let Some(lengths) = Self::poll(dir, source, samples, config)? {
                return Ok(lengths);
            }
            if let Some(t) = timeout
                && start.elapsed() >= t
            {
                return Err(wait_timeout(&dir.join(FILE_NAME), start.elapsed(), t));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// The cache file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fingerprint, lowercase hex.
    pub fn fingerprint(&self) -> String {
        stowplan_kernel::plan::hex(&self.fingerprint)
    }

    /// Number of samples.
    pub fn samples(&self) -> usize {
        self.lengths.len()
    }

    /// Number of lengths known (loaded or computed).
    pub fn known(&self) -> u64 {
        self.known
    }

    /// Whether every length is known.
    pub fn is_complete(&self) -> bool {
        self.known == self.lengths.len() as u64
    }

    /// Flushes written so far by this handle.
    pub fn flushes(&self) -> u64 {
        self.flushes
    }

    /// The flush cadence in computed lengths.
    pub fn persist_every(&self) -> u64 {
        self.persist_every
    }

    /// Indices whose length is not known yet, ascending.
    pub fn missing(&self) -> Vec<u32> {
        self.lengths.iter().enumerate().filter(|&(_, &l)| l == MISSING).map(|(i, _)| i as u32).collect()
    }

    /// The length of sample `i`, if known.
    pub fn get(&self, i: usize) -> Option<u64> {
        self.lengths.get(i).copied().filter(|&l| l != MISSING)
    }

    /// Records the length of sample `index`; flushes when `persist_every` lengths were
    /// recorded since the last flush. Errors: index out of range, a length of 0 or 2^64 − 1,
    /// a different length for an index already known (the length function is not
    /// deterministic).
    pub fn set(&mut self, index: usize, length: u64) -> Result<(), Error> {
        let n = self.lengths.len();
        let Some(slot) = self.lengths.get_mut(index) else {
            return Err(Error::InvalidArgument(format!("index {index} is out of range 0..{n}")));
        };
        if length == 0 || length == MISSING {
            return Err(Error::InvalidArgument(format!(
                "length of sample {index} must be in 1..={} tokens (got {length})",
                MISSING - 1
            )));
        }
        if *slot == MISSING {
            *slot = length;
            self.known += 1;
            self.since_flush += 1;
        } else if *slot != length {
            return Err(Error::CacheMismatch(format!(
                "sample {index} measured {length} tokens but the cache holds {}: either the length function is \
                 not deterministic for this dataset (static packing cannot be used: disable packing or make \
                 encoding deterministic) or something the lengths depend on changed without entering the \
                 fingerprint (use a fresh output directory, or add it to the cache config)",
                *slot
            )));
        }
        let due = self.adaptive_since.is_none_or(|t| t.elapsed() >= ADAPTIVE_MIN_INTERVAL);
        if self.since_flush >= self.persist_every && due {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the cache file atomically (temporary file, fsync, rename).
    pub fn flush(&mut self) -> Result<(), Error> {
        let bytes = encode(&self.inputs, &self.fingerprint, &self.lengths, self.is_complete())?;
        crate::runtime::atomic::write(&self.path, &bytes)?;
        self.since_flush = 0;
        if let Some(t) = self.adaptive_since.as_mut() {
            *t = Instant::now();
        }
        self.flushes += 1;
        Ok(())
    }

    /// Flushes what was recorded since the last flush (if anything) and returns all lengths,
    /// once complete (else an error naming how many are missing).
    pub fn finish(&mut self) -> Result<&[u64], Error> {
        if self.since_flush > 0 || (self.flushes == 0 && !self.path.exists()) {
            self.flush()?;
        }
        self.lengths()
    }

    /// All lengths, once complete (else an error naming how many are missing).
    pub fn lengths(&self) -> Result<&[u64], Error> {
        if !self.is_complete() {
            return Err(Error::InvalidArgument(format!(
                "the length cache is incomplete: {} of {} lengths missing",
                self.lengths.len() as u64 - self.known,
                self.lengths.len()
            )));
        }
        Ok(&self.lengths)
    }

    /// Computes every missing length with `f(index)` on `workers` threads (1 = serial),
    /// records them by index, flushes every `persist_every` lengths and at the end, and
    /// returns all lengths. When `f` fails, what was computed is flushed first (so a rerun
    /// resumes from there) and the error names the sample.
    pub fn precompute<F>(&mut self, workers: usize, f: F) -> Result<&[u64], Error>
    where
        F: Fn(usize) -> Result<u64, String> + Sync,
    {
        if workers == 0 {
            return Err(Error::InvalidArgument("workers must be at least 1 (got 0)".to_string()));
        }
        let missing = self.missing();
        let result = if workers == 1 {
            missing.iter().try_for_each(|&i| {
                let len = f(i as usize).map_err(|e| failed(i, e))?;
                self.set(i as usize, len)
            })
        } else {
            self.precompute_parallel(&missing, workers, &f)
        };
        match result {
            Ok(()) => self.finish(),
            Err(e) => {
                // Keep what was computed for the next attempt.
                self.flush()?;
                Err(e)
            }
        }
    }

    fn precompute_parallel<F>(&mut self, missing: &[u32], workers: usize, f: &F) -> Result<(), Error>
    where
        F: Fn(usize) -> Result<u64, String> + Sync,
    {
        // Chunks small enough to flush on time and balance load.
        let chunk = (self.persist_every as usize / workers).clamp(1, 4096);
        let next = AtomicUsize::new(0);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::sync_channel::<Result<(usize, Vec<u64>), Error>>(2 * workers);
            for _ in 0..workers {
                let tx = tx.clone();
                let (next, stop) = (&next, &stop);
                scope.spawn(move || {
                    loop {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let start = next.fetch_add(chunk, Ordering::Relaxed);
                        if start >= missing.len() {
                            return;
                        }
                        let end = (start + chunk).min(missing.len());
                        let mut out = Vec::with_capacity(end - start);
                        for &i in &missing[start..end] {
                            match f(i as usize) {
                                Ok(l) => out.push(l),
                                Err(e) => {
                                    // Send what this chunk computed, then the failure.
                                    let _ = tx.send(Ok((start, out)));
                                    let _ = tx.send(Err(failed(i, e)));
                                    return;
                                }
                            }
                        }
                        if tx.send(Ok((start, out))).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(tx);
            let mut first_error = None;
            for msg in rx {
                match msg {
                    Ok((start, lens)) => {
                        for (j, len) in lens.into_iter().enumerate() {
                            if let Err(e) = self.set(missing[start + j] as usize, len) {
                                first_error.get_or_insert(e);
                                stop.store(true, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    }
}

/// The [`Error::Timeout`] of a wait for the cache at `path`.
pub fn wait_timeout(path: &Path, waited: Duration, limit: Duration) -> Error {
    Error::Timeout(format!(
        "waited {:.1} s for the complete length cache {} (packing_wait_timeout_s = {}); rank 0 may have failed or \
         still be computing lengths: check its log, or raise packing_wait_timeout_s (0 waits forever)",
        waited.as_secs_f64(),
        path.display(),
        limit.as_secs_f64()
    ))
}

fn failed(i: u32, e: String) -> Error {
    Error::InvalidArgument(format!("the length function failed on sample {i}: {e}"))
}

/// The canonical inputs JSON (serde_json objects keep keys sorted) and its sha256.
fn fingerprint(source: &str, samples: usize, config: &Value) -> (String, [u8; 32]) {
    let inputs = json!({"format": FORMAT, "source": source, "samples": samples, "config": config}).to_string();
    let digest = Sha256::digest(inputs.as_bytes()).into();
    (inputs, digest)
}

/// The file's contents, framed by [`wire::LENGTH_CACHE`].
#[derive(Serialize, Deserialize)]
struct Stored {
    /// Every length is known.
    complete: bool,
    /// sha256 of `inputs`.
    fingerprint: [u8; 32],
    /// The canonical inputs JSON.
    inputs: String,
    /// One per sample; [`MISSING`] for one not computed yet.
    lengths: Vec<u64>,
}

fn encode(inputs: &str, fingerprint: &[u8; 32], lengths: &[u64], complete: bool) -> Result<Vec<u8>, Error> {
    let stored = Stored { complete, fingerprint: *fingerprint, inputs: inputs.to_string(), lengths: lengths.to_vec() };
    wire::encode(&wire::LENGTH_CACHE, &stored, 64 + inputs.len() + 5 * lengths.len())
}

fn decode(path: &Path, bytes: &[u8]) -> Result<Stored, Error> {
    wire::decode(&wire::LENGTH_CACHE, bytes).map_err(|e| {
        Error::CacheMismatch(format!(
            "{} is not a valid length cache ({e}); delete it (or use a fresh output directory) to recompute",
            path.display()
        ))
    })
}

/// The mismatch error, naming the inputs that differ.
fn mismatch(path: &Path, stored: &str, wanted: &str) -> Error {
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
    let (a, b) = (parse(stored), parse(wanted));
    let mut diffs = Vec::new();
    diff("", &a, &b, &mut diffs);
    Error::CacheMismatch(format!(
        "{} was computed for other inputs ({}); the run-scoped cache directory must not be reused across \
         datasets or length-affecting settings: use a fresh output directory or delete the file",
        path.display(),
        if diffs.is_empty() { "fingerprint differs".to_string() } else { diffs.join("; ") }
    ))
}

fn diff(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let name = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                diff(&name, x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), out);
            }
        }
        _ if a != b => out.push(format!("{prefix}: cached {a}, now {b}")),
        _ => {}
    }
}
