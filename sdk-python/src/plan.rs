//! Static pack plans (the static pack plan contract) for Python: `StaticPackPlan` and `LengthCache` (the packing
//! configuration is `config.rs`). Behaviour lives in the host crate; this converts.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use numpy::{IntoPyArray, PyArray1, PyArrayMethods};
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use stowplan::{
    StaticPackPlan,
    kernel::{MicroLimits, MultiMethod, Named, PlanLimits, PlanOptions},
    plan::length_cache::LengthCache,
};

use stowplan::plan::config::{DEFAULT_PRECOMPUTE_WORKERS, DEFAULT_WAIT_TIMEOUT_S};

use crate::{BackendArg, Lengths, int, int_vec, invalid, kernel, number, opt_u64, repr, to_py, u64_arg};
use crate::{opt_parse, str_options};

/// How long one host wait runs before Python signals are checked.
const SLICE: Duration = Duration::from_secs(1);

fn json_value(py: Python<'_>, text: Option<&str>, name: &str) -> PyResult<serde_json::Value> {
    match text {
        None => Ok(serde_json::Value::Null),
        Some(t) => serde_json::from_str(t).map_err(|e| invalid(py, format!("{name} is not valid JSON: {e}"))),
    }
}

/// A static pack plan: the world-size independent raw plan of a dataset and its alignment
/// for `world_size` ranks (what training consumes).
///
/// ``len(plan)`` is the number of aligned packs; ``plan[i]`` (or ``plan.pack(i)``) the sample
/// indices of aligned pack ``i``, ascending. Build one with
/// :meth:`StaticPackPlan.from_lengths`, :func:`stowplan.plan_dataset` or
/// :meth:`StaticPackPlan.load`.
#[pyclass(frozen, module = "stowplan._stowplan", name = "StaticPackPlan")]
#[derive(Debug)]
pub struct PyStaticPackPlan {
    plan: StaticPackPlan,
}

#[pymethods]
impl PyStaticPackPlan {
    /// from_lengths(lengths, *, capacity, world_size=None, drop_last=None, resources=None,
    /// limits=None, max_segments=None, method=None, backend=None, **options)
    ///
    /// Plans the samples of ``lengths`` (tokens per sample, dataset order): packs of at most
    /// ``capacity`` aligned tokens by best-fit decreasing, long samples (length >=
    /// capacity) alone (``allow_single_long``, default False) or dropped, then aligned
    /// for ``world_size`` ranks (default 1) by dropping the remainder (``drop_last``, default
    /// False) or repeating the first packs. ``align``: every length is rounded up to a
    /// multiple of it (default 1). ``options`` are the kernel's plan options but ``capacity``
    /// (``align``, ``allow_single_long`` and any the kernel adds: the stubs'
    /// ``_FromLengthsOptions``, generated from the WIT), each ``None`` for its default.
    ///
    /// Further limits per pack (vision-language data): ``resources`` maps each name (not
    /// ``"tokens"``) to the samples' sizes in it (image tokens, images …) and ``limits`` the
    /// same names to the cap per pack (``>= 1``), up to 7; ``max_segments`` caps the samples
    /// per pack (default 0: none). A sample over a limit is long. ``method``: ``"balanced"``
    /// (default), ``"bfd"``, ``"ffd"`` or ``"next-fit"``, with limits only. The plan then
    /// records the limits (:attr:`limits`, saved in format ``stowplan.static-pack-plan/3``).
    /// ``packing_length=`` is the former name of ``capacity`` (deprecated: warns, for one
    /// release).
    ///
    /// >>> plan = StaticPackPlan.from_lengths([900, 300, 700, 500], capacity=1200,
    /// ...     resources={"images": [2, 0, 1, 1]}, limits={"images": 2})
    /// >>> plan.raw_packs(), plan.limits
    /// ([[0, 1], [2, 3]], {'images': 2})
    #[staticmethod]
    #[pyo3(signature = (lengths, *, capacity=None, world_size=None, drop_last=None, resources=None, limits=None,
        max_segments=None, method=None, backend=None, packing_length=None, **options))]
    #[allow(clippy::too_many_arguments)]
    fn from_lengths(
        py: Python<'_>,
        lengths: &Bound<'_, PyAny>,
        capacity: Option<&Bound<'_, PyAny>>,
        world_size: Option<&Bound<'_, PyAny>>,
        drop_last: Option<bool>,
        resources: Option<&Bound<'_, PyDict>>,
        limits: Option<&Bound<'_, PyDict>>,
        max_segments: Option<&Bound<'_, PyAny>>,
        method: Option<&Bound<'_, PyAny>>,
        backend: Option<BackendArg>,
        packing_length: Option<&Bound<'_, PyAny>>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        str_options!(method);
        let call = "StaticPackPlan.from_lengths";
        let capacity =
            crate::convert::renamed(py, call, ("capacity", capacity), ("packing_length", packing_length))?
                .ok_or_else(|| invalid(py, format!("{call}: capacity (the tokens of a pack, >= 1) is required")))?;
        let mut o = PlanOptions::new(u64_arg(capacity, "capacity", 1)?);
        crate::options::options!(__plan_options, options, call, &["capacity"], o);
        let world_size = world_size.map(world).transpose()?.unwrap_or(ONE_RANK);
        let lengths = Lengths::extract(lengths, "lengths")?;
        let kernel = kernel(py, backend)?;
        let l = lengths.slice();
        let (sizes, caps, names) = crate::multi::limits_arg(py, resources, limits, l.len())?.unwrap_or_default();
        let max_segments = opt_u64(max_segments, "max_segments", 0)?.unwrap_or(0);
        let method: Option<MultiMethod> = opt_parse(py, method)?;
        if method.is_some() && caps.is_empty() && max_segments == 0 {
            return Err(invalid(
                py,
                "method applies with limits or max_segments; a plan of tokens only is best-fit decreasing".into(),
            ));
        }
        let limits = PlanLimits {
            limits: MicroLimits { sizes: &sizes, caps: &caps, names: &names },
            max_segments,
            method: method.unwrap_or_default(),
        };
        let drop_last = drop_last.unwrap_or(false);
        let plan = py
            .detach(|| StaticPackPlan::build_limited(&kernel, l, &o, &limits, world_size, drop_last))
            .map_err(|e| to_py(py, e))?;
        Ok(Self { plan })
    }

    /// load(path) -> StaticPackPlan: reads a plan saved by :meth:`save` (or ``stowplan plan
    /// --out``) and verifies both checksums against its packs.
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let plan = py.detach(|| StaticPackPlan::load(&path)).map_err(|e| to_py(py, e))?;
        Ok(Self { plan })
    }

    /// save(path): writes the plan as JSON (format ``stowplan.static-pack-plan/2``, or ``/3``
    /// with limits), atomically.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.plan.save(&path)).map_err(|e| to_py(py, e))
    }

    /// to_json() -> str: the document :meth:`save` writes.
    fn to_json(&self) -> String {
        self.plan.to_json().to_string()
    }

    /// Pickles as its JSON document (:meth:`to_json`; every field checksummed and verified
    /// when unpickled).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        crate::reduce(slf, (slf.get().to_json(),))
    }

    /// The plan pickled by ``__reduce__``: :meth:`to_json`'s document, verified.
    #[staticmethod]
    fn _from_state(py: Python<'_>, document: &str) -> PyResult<Self> {
        let value = json_value(py, Some(document), "document")?;
        let plan = StaticPackPlan::from_json(&value).map_err(|e| to_py(py, e))?;
        Ok(Self { plan })
    }

    /// realign(world_size, *, drop_last=None, backend=None) -> StaticPackPlan: the same raw
    /// plan aligned for other ranks (e.g. eval, which never drops; ``drop_last`` default
    /// False).
    #[pyo3(signature = (world_size, *, drop_last=None, backend=None))]
    fn realign(
        &self,
        py: Python<'_>,
        world_size: &Bound<'_, PyAny>,
        drop_last: Option<bool>,
        backend: Option<BackendArg>,
    ) -> PyResult<Self> {
        let world_size = world(world_size)?;
        let kernel = kernel(py, backend)?;
        let drop_last = drop_last.unwrap_or(false);
        let plan = py.detach(|| self.plan.realign(&kernel, world_size, drop_last)).map_err(|e| to_py(py, e))?;
        Ok(Self { plan })
    }

    fn __len__(&self) -> usize {
        self.plan.len()
    }

    fn __getitem__(&self, index: isize) -> PyResult<Vec<u32>> {
        self.pack(index)
    }

    /// pack(i) -> list[int]: the sample indices of aligned pack ``i`` (negative counts from
    /// the end); IndexError outside.
    fn pack(&self, index: isize) -> PyResult<Vec<u32>> {
        let n = self.plan.len() as isize;
        let i = if index < 0 { index + n } else { index };
        match (i >= 0).then(|| self.plan.pack(i as usize)).flatten() {
            Some(p) => Ok(p.to_vec()),
            None => Err(PyIndexError::new_err(format!("pack index {index} out of range for {n} packs"))),
        }
    }

    /// The raw packs as a list of index lists (world-size independent).
    fn raw_packs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, (0..self.plan.raw_len()).map(|p| self.plan.raw.pack(p).to_vec()))
    }

    /// Raw pack offsets (``n_raw_packs + 1``) into :attr:`raw_indices` (numpy uint32).
    #[getter]
    fn raw_offsets<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.plan.raw.offsets.clone().into_pyarray(py)
    }

    /// Sample indices of every raw pack, pack after pack (numpy uint32).
    #[getter]
    fn raw_indices<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.plan.raw.indices.clone().into_pyarray(py)
    }

    /// Real tokens of every raw pack (numpy uint64).
    #[getter]
    fn raw_tokens<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u64>> {
        self.plan.raw.tokens.clone().into_pyarray(py)
    }

    /// The limits beside ``capacity`` (name → cap per pack), or ``None`` for a plan of
    /// tokens only.
    #[getter]
    fn limits<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(l) = &self.plan.limits else { return Ok(None) };
        let d = PyDict::new(py);
        for (name, cap) in l.names.iter().zip(&l.caps) {
            d.set_item(name, cap)?;
        }
        Ok(Some(d))
    }

    /// At most this many samples per multi-sample pack (0: no limit).
    #[getter]
    fn max_segments(&self) -> u64 {
        self.plan.limits.as_ref().map_or(0, |l| l.max_segments)
    }

    /// The method that packed the samples under limits, or ``None`` (best-fit decreasing on
    /// tokens).
    #[getter]
    fn method(&self) -> Option<&'static str> {
        self.plan.limits.as_ref().map(|l| l.method.as_str())
    }

    /// Every raw pack's load in each limit (numpy uint64, ``n_raw_packs × len(limits)``), or
    /// ``None`` without limits.
    #[getter]
    fn resource_loads<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(l) = &self.plan.limits else { return Ok(None) };
        let shape = (self.plan.raw_len(), l.names.len());
        Ok(Some(l.loads.clone().into_pyarray(py).reshape(shape)?.into_any()))
    }

    /// The lower bound of the multi-sample packs per resource (``"tokens"``, each limit, then
    /// ``"segments"`` with ``max_segments``), or ``None`` without limits; :attr:`lower_bound`
    /// is their largest plus the single-long packs.
    #[getter]
    fn lower_bounds<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(l) = &self.plan.limits else { return Ok(None) };
        let d = PyDict::new(py);
        let names = std::iter::once("tokens").chain(l.names.iter().map(String::as_str)).chain(["segments"]);
        for (name, bound) in names.zip(&l.lower_bounds) {
            d.set_item(name, bound)?;
        }
        Ok(Some(d))
    }

    /// The raw pack consumed by every aligned slot (numpy uint32).
    #[getter]
    fn aligned_packs<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.plan.aligned.packs.clone().into_pyarray(py)
    }

    /// Number of raw packs (``N_raw_packs``).
    #[getter]
    fn n_raw_packs(&self) -> usize {
        self.plan.raw_len()
    }

    /// Number of aligned packs (``N_aligned_packs`` = ``len(plan)``).
    #[getter]
    fn n_aligned_packs(&self) -> usize {
        self.plan.len()
    }

    /// Aligned packs per rank.
    #[getter]
    fn per_rank(&self) -> usize {
        self.plan.per_rank()
    }

    /// Number of samples the plan was built from.
    #[getter]
    fn samples(&self) -> u64 {
        self.plan.samples
    }

    /// The per-pack cap in tokens.
    #[getter]
    fn capacity(&self) -> u64 {
        self.plan.options.capacity
    }

    /// The former name of :attr:`capacity` (deprecated: warns, for one release).
    #[getter]
    fn packing_length(&self, py: Python<'_>) -> PyResult<u64> {
        crate::convert::warn_renamed(py, "StaticPackPlan", "packing_length", "capacity", false)?;
        Ok(self.plan.options.capacity)
    }

    /// The alignment of every length.
    #[getter]
    fn align(&self) -> u64 {
        self.plan.options.align
    }

    /// Whether long samples became single-sample packs.
    #[getter]
    fn allow_single_long(&self) -> bool {
        self.plan.options.allow_single_long
    }

    /// Ranks the plan is aligned for.
    #[getter]
    fn world_size(&self) -> u32 {
        self.plan.world_size
    }

    /// Whether the remainder was dropped.
    #[getter]
    fn drop_last(&self) -> bool {
        self.plan.drop_last
    }

    /// Packs repeated at the end (``pad_needed``).
    #[getter]
    fn pad_needed(&self) -> u32 {
        self.plan.aligned.pad_needed
    }

    /// The raw packs repeated at the end, in order.
    #[getter]
    fn repeated(&self) -> Vec<u32> {
        self.plan.aligned.packs[self.plan.raw_len().min(self.plan.len())..].to_vec()
    }

    /// Raw packs dropped at the end (``drop_last``).
    #[getter]
    fn dropped_packs(&self) -> u32 {
        self.plan.aligned.dropped_packs
    }

    /// Samples in the dropped packs.
    #[getter]
    fn dropped_pack_samples(&self) -> u64 {
        self.plan.aligned.dropped_samples
    }

    /// Long samples emitted as single-sample packs, ascending.
    #[getter]
    fn single_long(&self) -> Vec<u32> {
        self.plan.raw.single_long.clone()
    }

    /// Long samples dropped (``allow_single_long=False``), ascending.
    #[getter]
    fn dropped_long(&self) -> Vec<u32> {
        self.plan.raw.dropped.clone()
    }

    /// No plan of these samples has fewer raw packs.
    #[getter]
    fn lower_bound(&self) -> u64 {
        self.plan.raw.lower_bound
    }

    /// Real tokens of every packed sample.
    #[getter]
    fn real_tokens(&self) -> u64 {
        self.plan.raw.real_tokens
    }

    /// Fill of the multi-sample packs: their tokens (``real_tokens`` minus the single-long
    /// packs') / (multi-sample packs × capacity).
    #[getter]
    fn efficiency(&self) -> f64 {
        self.plan.efficiency()
    }

    /// sha256 (hex) of the raw plan's canonical encoding.
    #[getter]
    fn raw_checksum(&self) -> String {
        self.plan.raw_checksum()
    }

    /// sha256 (hex) of the aligned plan's canonical encoding.
    #[getter]
    fn aligned_checksum(&self) -> String {
        self.plan.aligned_checksum()
    }

    /// The plan's log lines (counts, world size, drop_last, repeats, long samples,
    /// both checksums).
    fn log_lines(&self) -> Vec<String> {
        self.plan.log_lines()
    }

    /// log(logger=None): writes :meth:`log_lines` to ``logger`` (default
    /// ``logging.getLogger("stowplan.plan")``): dropped samples or packs at WARNING, the rest
    /// at INFO.
    #[pyo3(signature = (logger=None))]
    fn log(&self, py: Python<'_>, logger: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let logger = match logger {
            Some(l) => l,
            None => plan_logger(py)?,
        };
        for line in self.plan.log_records() {
            let level = if line.warning { "warning" } else { "info" };
            logger.call_method1(level, (line.text,))?;
        }
        Ok(())
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Self>().is_ok_and(|o| o.get().plan == self.plan)
    }

    fn __repr__(&self) -> String {
        format!(
            "StaticPackPlan(samples={}, capacity={}, n_raw_packs={}, n_aligned_packs={}, world_size={}, \
             drop_last={}, raw_checksum='{}')",
            self.plan.samples,
            self.plan.options.capacity,
            self.plan.raw_len(),
            self.plan.len(),
            self.plan.world_size,
            self.plan.drop_last,
            &self.plan.raw_checksum()[..16]
        )
    }
}

/// The fingerprinted per-sample length cache of static packing (run-scoped directory,
/// periodic atomic flushes, resume after a crash). Normally driven by
/// :func:`stowplan.compute_lengths`.
#[pyclass(module = "stowplan._stowplan", name = "LengthCache")]
#[derive(Debug)]
pub struct PyLengthCache {
    cache: LengthCache,
}

#[pymethods]
impl PyLengthCache {
    /// LengthCache(cache_dir, source, samples, config_json=None, persist_every=None):
    /// ``persist_every`` lengths between flushes (default adaptive).
    #[new]
    #[pyo3(signature = (cache_dir, source, samples, config_json=None, persist_every=None))]
    fn new(
        py: Python<'_>,
        cache_dir: PathBuf,
        source: &str,
        samples: &Bound<'_, PyAny>,
        config_json: Option<&Bound<'_, PyAny>>,
        persist_every: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        str_options!(config_json);
        let samples = sample_count(samples)?;
        let config = json_value(py, config_json, "config")?;
        let persist_every = persist_every
            .map(|p| {
                u64_arg(p, "persist_every", 1)
                    .map_err(|_| invalid(py, format!("persist_every must be a positive integer (got {})", repr(p))))
            })
            .transpose()?;
        let cache = py
            .detach(|| LengthCache::open(&cache_dir, source, samples, &config, persist_every))
            .map_err(|e| to_py(py, e))?;
        Ok(Self { cache })
    }

    /// missing() -> numpy uint32: sample indices whose length is not known yet.
    fn missing<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.cache.missing().into_pyarray(py)
    }

    /// set_many(indices, lengths): records lengths by sample index (flushing on cadence).
    fn set_many(&mut self, py: Python<'_>, indices: &Bound<'_, PyAny>, lengths: &Bound<'_, PyAny>) -> PyResult<()> {
        let indices: Vec<u64> = int_vec(indices, "indices", 0, u64::MAX.into())?;
        let lengths: Vec<u64> = int_vec(lengths, "lengths", 0, u64::MAX.into())?;
        if indices.len() != lengths.len() {
            return Err(invalid(
                py,
                format!("indices ({}) and lengths ({}) must have the same size", indices.len(), lengths.len()),
            ));
        }
        for (&i, &l) in indices.iter().zip(&lengths) {
            let i = usize::try_from(i).map_err(|_| invalid(py, format!("sample index {i} is out of range")))?;
            self.cache.set(i, l).map_err(|e| to_py(py, e))?;
        }
        Ok(())
    }

    /// flush(): writes the cache file atomically now.
    fn flush(&mut self, py: Python<'_>) -> PyResult<()> {
        self.cache.flush().map_err(|e| to_py(py, e))
    }

    /// finish() -> numpy uint64: flushes pending lengths and returns all of them (error when
    /// some are missing).
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let l = self.cache.finish().map_err(|e| to_py(py, e))?;
        Ok(l.to_vec().into_pyarray(py))
    }

    /// Number of known lengths.
    #[getter]
    fn known(&self) -> u64 {
        self.cache.known()
    }

    /// Whether every length is known.
    #[getter]
    fn complete(&self) -> bool {
        self.cache.is_complete()
    }

    /// Flushes written by this handle.
    #[getter]
    fn flushes(&self) -> u64 {
        self.cache.flushes()
    }

    /// The flush cadence in lengths.
    #[getter]
    fn persist_every(&self) -> u64 {
        self.cache.persist_every()
    }

    /// The cache file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.cache.path().to_path_buf()
    }

    /// sha256 (hex) of the inputs the lengths depend on.
    #[getter]
    fn fingerprint(&self) -> String {
        self.cache.fingerprint()
    }

    /// wait(cache_dir, source, samples, *, config_json=None, timeout_s=None) -> numpy
    /// uint64: waits for rank 0's complete cache, interruptible with Ctrl-C. ``timeout_s``:
    /// seconds, 0 = forever (default: ``packing_wait_timeout_s``'s default, 7200).
    #[staticmethod]
    #[pyo3(signature = (cache_dir, source, samples, *, config_json=None, timeout_s=None))]
    fn wait<'py>(
        py: Python<'py>,
        cache_dir: PathBuf,
        source: &str,
        samples: &Bound<'_, PyAny>,
        config_json: Option<&Bound<'_, PyAny>>,
        timeout_s: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        str_options!(config_json);
        let samples = sample_count(samples)?;
        let timeout_s = match timeout_s {
            Some(t) => number(t, "timeout_s", "a number of seconds >= 0")?,
            None => DEFAULT_WAIT_TIMEOUT_S as f64,
        };
        if !(timeout_s >= 0.0 && timeout_s.is_finite()) {
            return Err(invalid(py, format!("timeout_s must be a finite number >= 0 (got {timeout_s})")));
        }
        let config = json_value(py, config_json, "config")?;
        let limit = (timeout_s > 0.0).then(|| Duration::from_secs_f64(timeout_s));
        let start = Instant::now();
        // The host's wait, one second at a time, so Ctrl-C is seen between slices.
        loop {
            let slice = limit.map_or(SLICE, |t| t.saturating_sub(start.elapsed()).min(SLICE));
            match py.detach(|| LengthCache::wait(&cache_dir, source, samples, &config, Some(slice))) {
                Ok(lengths) => return Ok(lengths.into_pyarray(py)),
                Err(stowplan::Error::Timeout(_)) => {
                    if let Some(t) = limit
                        && start.elapsed() >= t
                    {
                        let path = cache_dir.join(stowplan::plan::length_cache::FILE_NAME);
                        return Err(to_py(py, stowplan::plan::length_cache::wait_timeout(&path, start.elapsed(), t)));
                    }
                    py.check_signals()?;
                }
                Err(e) => return Err(to_py(py, e)),
            }
        }
    }
}

/// One rank: the `world_size` of an omitted argument.
const ONE_RANK: u32 = 1;

/// The number of samples of a length cache.
fn sample_count(samples: &Bound<'_, PyAny>) -> PyResult<usize> {
    int(samples, "samples", 0, u64::MAX.into())
}

/// `world_size`: an integer in `0..=2**32-1`.
pub(crate) fn world(world_size: &Bound<'_, PyAny>) -> PyResult<u32> {
    int(world_size, "world_size", 0, u32::MAX.into())
}

/// `logging.getLogger("stowplan.plan")`, where static pack plans and their configuration log.
pub(crate) fn plan_logger(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("logging")?.call_method1("getLogger", ("stowplan.plan",))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStaticPackPlan>()?;
    m.add_class::<PyLengthCache>()?;
    // The host's defaults the Python driver of the length cache uses.
    m.add("DEFAULT_PRECOMPUTE_WORKERS", DEFAULT_PRECOMPUTE_WORKERS)?;
    m.add("DEFAULT_WAIT_TIMEOUT_S", DEFAULT_WAIT_TIMEOUT_S)?;
    Ok(())
}
