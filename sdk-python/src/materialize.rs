//! Materialization: samples read from Python, every rank's micro-batches built by the host,
//! and prime-rl's bins.

use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use stowplan::{
    MaterializeOptions,
    kernel::{AlignOptions, Factor, Padding},
    materialize::Sample,
};

use crate::convert::{opt_i64, opt_number};
use crate::layout::factor;
use crate::micro_batch::wrap;
use crate::{
    BackendArg, cost_arg, float_vec, int, int_vec, invalid, kernel, mask_vec, number, opt_parse, opt_u32, opt_u64,
    str_options, to_py, u32_arg, u64_arg,
};

/// Owned sample data extracted from Python: the packer's wire sample plus the run and the
/// scalar temperature, which a `TrainingBatch` carries once for all its samples.
pub(crate) struct OwnedSample {
    pub(crate) sample: stowplan::TrainingSample,
    temperature: f32,
    run: u32,
    /// The sample's size in each limit of `materialize(limits=)`, in its order (empty: none).
    resources: Vec<u64>,
}

impl OwnedSample {
    fn borrow(&self) -> Sample<'_> {
        Sample { resources: &self.resources, ..self.sample.as_sample(self.temperature, self.run) }
    }
}

/// Sample `i`'s ``resources``: a mapping of limit names to its sizes, as the wire sample
/// carries them (empty when it has none).
fn resource_pairs(i: usize, obj: &Bound<'_, PyAny>) -> PyResult<Vec<(String, u64)>> {
    let py = obj.py();
    let Some(r) = get(obj, "resources")? else { return Ok(Vec::new()) };
    let r = r.cast::<PyDict>().map_err(|_| {
        invalid(py, format!("samples[{i}].resources must be a dict of limit names to sizes (got {})", r.get_type()))
    })?;
    r.iter()
        .map(|(k, v)| {
            let name: String = k.extract().map_err(|_| {
                invalid(py, format!("samples[{i}].resources' keys must be limit names (str), got {}", k.get_type()))
            })?;
            let size = int(&v, &format!("samples[{i}].resources['{name}']"), 0, u64::MAX.into())?;
            Ok((name, size))
        })
        .collect()
}

/// Sample `i`'s resources in the order of `names`, the limits of `materialize(limits=)` (see
/// [`stowplan::TrainingSample::resource_sizes`]): resources without limits are refused rather
/// than ignored.
fn aligned_resources(
    py: Python<'_>,
    i: usize,
    sample: &stowplan::TrainingSample,
    names: &[String],
) -> PyResult<Vec<u64>> {
    if names.is_empty() && !sample.resources.is_empty() {
        return Err(invalid(
            py,
            format!(
                "samples[{i}] has resources but this call has no limits to check them against: materialize takes \
                 them with limits= (name → cap) and no plan, the packer with Packer(limits=); a given plan takes none"
            ),
        ));
    }
    sample.resource_sizes(names).map_err(|e| invalid(py, format!("samples[{i}] {e}")))
}

/// Field `name` of a sample given as a mapping or an object; `None` when absent or None.
fn get<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    let v = if let Ok(d) = obj.cast::<PyDict>() {
        d.get_item(name)?
    } else if obj.hasattr(name)? {
        Some(obj.getattr(name)?)
    } else {
        None
    };
    Ok(v.filter(|v| !v.is_none()))
}

/// Token ids: exact integers of the arrays' `int64` (see `crate::int_vec`). The host
/// refuses negative ones, per sample (the packer rejects the sample and goes on).
fn token_ids(i: usize, name: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    int_vec(v, &format!("samples[{i}].{name}"), i64::MIN.into(), i64::MAX.into())
}

/// Sample `i` of a call. With `names`, the limits of `materialize`, its resources are also
/// put in their order (see [`aligned_resources`]); without, the wire sample carries them as
/// given and the packer checks them when they arrive.
pub(crate) fn extract_sample(i: usize, obj: &Bound<'_, PyAny>, names: Option<&[String]>) -> PyResult<OwnedSample> {
    let py = obj.py();
    let at = |name: &str| format!("samples[{i}].{name}");
    let need = |name: &str| -> PyResult<Bound<'_, PyAny>> {
        get(obj, name)?
            .ok_or_else(|| crate::invalid(py, format!("samples[{i}] has no {name} (a mapping key or an attribute)")))
    };
    let opt_f =
        |name: &str| -> PyResult<Option<Vec<f32>>> { get(obj, name)?.map(|v| float_vec(&v, &at(name))).transpose() };
    let opt_b =
        |name: &str| -> PyResult<Option<Vec<bool>>> { get(obj, name)?.map(|v| mask_vec(&v, &at(name))).transpose() };
    let scalar = |name: &str, default: Option<f64>| -> PyResult<f64> {
        match get(obj, name)? {
            Some(v) => number(&v, &at(name), "a number"),
            None => default.ok_or_else(|| {
                crate::invalid(py, format!("samples[{i}] has no {name} (a mapping key or an attribute)"))
            }),
        }
    };
    let run = match (get(obj, "run")?, get(obj, "lora")?) {
        (Some(v), _) => int(&v, &at("run"), 0, u32::MAX.into())?,
        (None, Some(v)) => int(&v, &at("lora"), 0, u32::MAX.into())?,
        (None, None) => 0,
    };
    let sample = stowplan::TrainingSample {
        prompt_ids: token_ids(i, "prompt_ids", &need("prompt_ids")?)?,
        completion_ids: token_ids(i, "completion_ids", &need("completion_ids")?)?,
        prompt_mask: opt_b("prompt_mask")?,
        completion_mask: opt_b("completion_mask")?,
        completion_logprobs: opt_f("completion_logprobs")?,
        completion_temperatures: opt_f("completion_temperatures")?,
        teacher_logprobs: opt_f("teacher_logprobs")?,
        advantage: scalar("advantage", None)? as f32,
        extra_cost: get(obj, "extra_cost")?
            .map(|v| int(&v, &at("extra_cost"), 0, u64::MAX.into()))
            .transpose()?
            .unwrap_or(0),
        resources: resource_pairs(i, obj)?,
    };
    let resources = names.map(|names| aligned_resources(py, i, &sample, names)).transpose()?.unwrap_or_default();
    Ok(OwnedSample { sample, temperature: scalar("temperature", Some(1.0))? as f32, run, resources })
}

/// Every rank's micro-batches (the result of :func:`materialize`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "Materialized")]
#[derive(Debug)]
pub struct PyMaterialized {
    /// ``ranks[r]`` is rank ``r``'s list of :class:`MaterializedBatch` (the same count on every rank).
    #[pyo3(get)]
    ranks: Py<PyList>,
    /// Micro-batches per rank.
    #[pyo3(get)]
    per_rank: usize,
    /// Real tokens over all micro-batches.
    #[pyo3(get)]
    real_tokens: u64,
    /// Padding tokens over all micro-batches (dummies' padding included).
    #[pyo3(get)]
    padding_tokens: u64,
    /// Micro-batches the packing made before any split: best-fit decreasing, or the balanced
    /// fill under ``limits`` (``None`` for a caller's ``plan``).
    #[pyo3(get)]
    packed: Option<u32>,
    /// Heaviest micro-batches split to reach a multiple of ``dp`` (``None`` for a ``plan``).
    #[pyo3(get)]
    splits: Option<u32>,
    /// Empty micro-batches (zero loss mask and advantages) added because there were fewer
    /// samples than slots.
    #[pyo3(get)]
    dummies: u32,
    /// No packing under the capacity (and every limit) has fewer micro-batches (``None`` for a
    /// ``plan``).
    #[pyo3(get)]
    lower_bound: Option<u32>,
    /// ``uint64`` array, cost per rank (``None`` for a caller's ``plan``).
    #[pyo3(get)]
    rank_costs: Option<Py<PyArray1<u64>>>,
}

#[pymethods]
impl PyMaterialized {
    /// Pickles as its fields (each micro-batch as its framed bytes).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let (py, m) = (slf.py(), slf.get());
        let figures = (m.per_rank, m.real_tokens, m.padding_tokens, m.packed, m.splits, m.dummies, m.lower_bound);
        let costs = m.rank_costs.as_ref().map(|c| c.clone_ref(py));
        crate::reduce(slf, (m.ranks.clone_ref(py), figures, costs))
    }

    /// The result pickled by ``__reduce__``.
    #[staticmethod]
    #[allow(clippy::type_complexity)]
    fn _from_state(
        ranks: Py<PyList>,
        figures: (usize, u64, u64, Option<u32>, Option<u32>, u32, Option<u32>),
        rank_costs: Option<Py<PyArray1<u64>>>,
    ) -> Self {
        let (per_rank, real_tokens, padding_tokens, packed, splits, dummies, lower_bound) = figures;
        PyMaterialized {
            ranks,
            per_rank,
            real_tokens,
            padding_tokens,
            packed,
            splits,
            dummies,
            lower_bound,
            rank_costs,
        }
    }

    /// Padding tokens over real tokens.
    #[getter]
    fn padding_overhead(&self) -> f64 {
        if self.real_tokens == 0 { 0.0 } else { self.padding_tokens as f64 / self.real_tokens as f64 }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Materialized(dp={}, per_rank={}, real_tokens={}, padding_tokens={}, dummies={})",
            self.ranks.bind(py).len(),
            self.per_rank,
            self.real_tokens,
            self.padding_tokens,
            self.dummies
        )
    }
}

/// A caller's plan: ``plan[r][j]`` = the sample indices of rank ``r``'s micro-batch ``j``
/// (exact integers; errors name ``plan[r][j][i]``).
fn plan_arg(plan: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<Vec<Vec<u32>>>>> {
    let Some(plan) = plan else { return Ok(None) };
    let py = plan.py();
    let shape = || invalid(py, "plan must be a list (ranks) of lists (micro-batches) of sample indices".to_string());
    let mut out = Vec::new();
    for (r, rank) in plan.try_iter().map_err(|_| shape())?.enumerate() {
        let mut row = Vec::new();
        for (j, mb) in rank?.try_iter().map_err(|_| shape())?.enumerate() {
            row.push(int_vec(&mb?, &format!("plan[{r}][{j}]"), 0, u32::MAX.into())?);
        }
        out.push(row);
    }
    Ok(Some(out))
}

/// Packs ``samples`` into micro-batches of at most ``capacity`` tokens (after padding),
/// gives each of ``dp`` ranks the same number, and builds their arrays.
///
/// A sample is a mapping or an object with ``prompt_ids``, ``completion_ids`` (lists or
/// int64/int32 arrays) and ``advantage``; optionally ``prompt_mask`` (default all False),
/// ``completion_mask`` (all True), ``completion_logprobs`` (0), ``temperature`` (one float,
/// default 1.0) or ``completion_temperatures`` (one per completion token), ``run`` or
/// ``lora`` (default 0), ``teacher_logprobs`` (every token; all samples or none) and
/// ``extra_cost`` (default 0: a cost on top of the cost model's, in its units — a multimodal
/// sample's image or vision tokens — that balancing counts and the capacity does not) and,
/// with ``limits``, ``resources`` (a dict of limit name → the sample's size in it, e.g.
/// ``{"image_tokens": 1536, "images": 2}``; a limit it does not name is 0).
///
/// Options (omitted or ``None``: the default): ``dp`` (default 1), ``cp``, ``tp`` (default
/// 1); ``padding`` — ``"sequence"`` pads every sample to the factor (default when
/// ``cp > 1``; rows then carry their CP split, see ``MaterializedBatch.cp_view``),
/// ``"micro_batch"`` pads each row's total (prime-rl's ``pad_to_multiple_of``; default when
/// ``cp == 1``); ``align`` — as for :func:`pad_factor` (an integer is used as is); ``cost``
/// — as in :func:`micro_batches`; ``pad_token_id`` (default 1, prime-rl's); ``num_runs`` —
/// the length of ``lora_num_tokens`` (default: the largest run + 1); ``mix_runs`` — samples
/// of different runs may share a micro-batch (default False); ``allow_empty_completion``
/// (default False); ``loss_agg_mode`` — how per-token losses make the step's loss:
/// ``"token-mean"`` (default), ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"`` or
/// ``"seq-mean-token-sum-norm"`` (verl's names), which sets every row's ``loss_weights``
/// (float32, the layout of ``loss_mask``) so that Σ over all ranks, micro-batches and tokens
/// of ``loss_weights × per-token loss`` is the unpacked samples' loss (counts per run, over
/// the samples of the call or of ``plan``); ``loss_scale_factor`` — the horizon of
/// ``"seq-mean-token-sum-norm"`` only, in tokens (default: the run's longest completion);
/// ``multimodal_alone`` — every sample with an ``extra_cost`` gets a micro-batch of its own
/// (prime-rl's rule; needs ``mix_runs`` False); ``limits`` — further caps per micro-batch
/// (resource name → cap, e.g. ``{"image_tokens": 8192, "images": 32}``): every row stays
/// within ``capacity`` and each of them, a sample's sizes being its ``"resources"`` mapping (a
/// limit it does not name is 0), and each run's rows are the balanced fill under all the caps;
/// ``max_segments`` — at most this many samples per micro-batch (0 or ``None``: no limit);
/// ``distribution`` — how micro-batches go to ranks: ``"balanced"`` (the default) or
/// ``"round-robin"``, prime-rl's classic trainer (first fit by run and descending length,
/// runs sharing rows, each multimodal sample alone, each modality group completed to a
/// multiple of ``dp`` with copies of its first micro-batch whose loss is off — ``dummy``
/// True, tokens counted as padding — micro-batch ``i`` to rank ``i % dp``; no ``limits``);
/// ``plan`` — materialize this plan instead (``plan[r][j]`` = the sample
/// indices of rank ``r``'s micro-batch ``j``; ``[]`` = a dummy); ``backend``.
///
/// Raises :class:`InvalidArgumentError` naming the sample and field (length mismatch, empty
/// completion unless ``allow_empty_completion``, temperature ≤ 0, …) and
/// :class:`InfeasibleError` for a sample longer than ``capacity`` or over a limit.
///
/// >>> samples = [
/// ...     {"prompt_ids": [11, 12], "completion_ids": [13, 14, 15], "advantage": 0.5},
/// ...     {"prompt_ids": [21], "completion_ids": [22, 23], "advantage": -1.0},
/// ... ]
/// >>> m = materialize(samples, capacity=64, cp=2)
/// >>> mb = m.ranks[0][0]
/// >>> mb.input_ids.tolist(), mb.cu_seqlens_padded.tolist()
/// ([11, 12, 13, 14, 15, 1, 1, 1, 21, 22, 23, 1], [0, 8, 12])
/// >>> mb.cp_view(1)["input_ids"].tolist()
/// [13, 14, 15, 1, 22, 23]
/// >>> MaterializedBatch.from_bytes(mb.to_bytes()).input_ids.tolist() == mb.input_ids.tolist()
/// True
#[pyfunction]
#[pyo3(signature = (samples, *, capacity, dp=None, cp=None, tp=None, padding=None, align=None, cost=None,
    pad_token_id=None, num_runs=None, mix_runs=None, allow_empty_completion=None, loss_agg_mode=None,
    loss_scale_factor=None, multimodal_alone=None, limits=None, max_segments=None, distribution=None, plan=None,
    backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn materialize(
    py: Python<'_>,
    samples: &Bound<'_, PyAny>,
    capacity: &Bound<'_, PyAny>,
    dp: Option<&Bound<'_, PyAny>>,
    cp: Option<&Bound<'_, PyAny>>,
    tp: Option<&Bound<'_, PyAny>>,
    padding: Option<&Bound<'_, PyAny>>,
    align: Option<&Bound<'_, PyAny>>,
    cost: Option<&Bound<'_, PyAny>>,
    pad_token_id: Option<&Bound<'_, PyAny>>,
    num_runs: Option<&Bound<'_, PyAny>>,
    mix_runs: Option<bool>,
    allow_empty_completion: Option<bool>,
    loss_agg_mode: Option<&Bound<'_, PyAny>>,
    loss_scale_factor: Option<&Bound<'_, PyAny>>,
    multimodal_alone: Option<bool>,
    limits: Option<&Bound<'_, PyAny>>,
    max_segments: Option<&Bound<'_, PyAny>>,
    distribution: Option<&Bound<'_, PyAny>>,
    plan: Option<&Bound<'_, PyAny>>,
    backend: Option<BackendArg>,
) -> PyResult<PyMaterialized> {
    str_options!(padding, loss_agg_mode, distribution);
    let capacity = u64_arg(capacity, "capacity", 1)?;
    let plan = plan_arg(plan)?;
    // With a plan, dp defaults to its number of ranks (the host checks a given dp against it).
    let default_dp = match plan.as_ref().map(Vec::len) {
        None | Some(0) => 1,
        Some(n) => u32::try_from(n).map_err(|_| invalid(py, format!("plan has {n} ranks, over 2^32-1")))?,
    };
    let d = MaterializeOptions::new(capacity, opt_u32(dp, "dp", 1)?.unwrap_or(default_dp));
    let cp = opt_u32(cp, "cp", 1)?.unwrap_or(d.cp);
    let tp = opt_u32(tp, "tp", 1)?.unwrap_or(stowplan::kernel::AlignOptions::default().tp);
    let per_sequence = match padding {
        None => cp > 1,
        Some("sequence") => true,
        Some("micro_batch") => false,
        Some(other) => {
            return Err(invalid(py, format!("padding must be 'sequence' or 'micro_batch' (got {other:?})")));
        }
    };
    let k = kernel(py, backend)?;
    let multiple = match factor(align)? {
        Some(Factor::Multiple(m)) => m,
        f => {
            let o = AlignOptions { factor: f.unwrap_or(AlignOptions::new(cp, tp).factor), ..AlignOptions::new(cp, tp) };
            py.detach(|| k.pad_factor(&o)).map_err(|e| to_py(py, e))?
        }
    };
    let options = MaterializeOptions {
        cp,
        padding: if per_sequence { Padding::PerSequence(multiple) } else { Padding::PerMicroBatch(multiple) },
        cost: cost_arg(cost)?.unwrap_or(d.cost),
        pad_token_id: opt_i64(pad_token_id, "pad_token_id")?.unwrap_or(d.pad_token_id),
        num_runs: opt_u32(num_runs, "num_runs", 1)?.or(d.num_runs),
        mix_runs: mix_runs.unwrap_or(d.mix_runs),
        allow_empty_completion: allow_empty_completion.unwrap_or(d.allow_empty_completion),
        loss_agg_mode: opt_parse(py, loss_agg_mode)?.unwrap_or(d.loss_agg_mode),
        loss_scale_factor: opt_number(loss_scale_factor, "loss_scale_factor", "a number of tokens")?
            .or(d.loss_scale_factor),
        multimodal_alone: multimodal_alone.unwrap_or(d.multimodal_alone),
        distribution: opt_parse(py, distribution)?.unwrap_or(d.distribution),
        ..d
    };
    let (caps, names) = crate::multi::caps_arg(py, limits)?;
    let max_segments = opt_u64(max_segments, "max_segments", 0)?.unwrap_or(0);
    let limits = stowplan::materialize::SampleLimits { caps, names, max_segments };
    if plan.is_some() && !limits.is_empty() {
        return Err(invalid(
            py,
            "limits and max_segments apply to the rows materialize plans; a plan is materialized as given: pass one \
             or the other"
                .into(),
        ));
    }
    let owned: Vec<OwnedSample> = samples
        .try_iter()
        .map_err(|_| invalid(py, "samples must be an iterable of mappings or objects".into()))?
        .enumerate()
        .map(|(i, s)| extract_sample(i, &s?, Some(&limits.names)))
        .collect::<PyResult<_>>()?;
    let (ranks, distribution) = py
        .detach(|| -> Result<_, stowplan::Error> {
            let borrowed: Vec<Sample<'_>> = owned.iter().map(OwnedSample::borrow).collect();
            match &plan {
                Some(p) => {
                    let p: Vec<Vec<&[u32]>> = p.iter().map(|r| r.iter().map(Vec::as_slice).collect()).collect();
                    Ok((stowplan::materialize::materialize_plan(&k, &borrowed, &p, &options)?, None))
                }
                None => {
                    let m = stowplan::materialize::materialize_limited(&k, &borrowed, &options, &limits)?;
                    Ok((m.ranks, Some(m.distribution)))
                }
            }
        })
        .map_err(|e| to_py(py, e))?;
    let all = || ranks.iter().flatten();
    let (real_tokens, padding_tokens) = (all().map(|m| m.real_tokens).sum(), all().map(|m| m.padding_tokens).sum());
    let dummies = all().filter(|m| m.dummy).count() as u32;
    let per_rank = ranks.first().map_or(0, Vec::len);
    let out = PyList::empty(py);
    for rank in ranks {
        let row = PyList::empty(py);
        for mb in rank {
            row.append(Py::new(py, wrap(py, mb))?)?;
        }
        out.append(row)?;
    }
    Ok(PyMaterialized {
        ranks: out.unbind(),
        per_rank,
        real_tokens,
        padding_tokens,
        packed: distribution.as_ref().map(|d| d.packed),
        splits: distribution.as_ref().map(|d| d.splits),
        dummies: distribution.as_ref().map_or(dummies, |d| d.dummies),
        lower_bound: distribution.as_ref().map(|d| d.lower_bound),
        rank_costs: distribution.map(|d| d.rank_costs.into_pyarray(py).unbind()),
    })
}

/// prime-rl's classic packer's bins (the result of :func:`prime_rl_ffd`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "PrimeRlBins")]
#[derive(Debug)]
pub struct PyPrimeRlBins {
    /// The bins: sample indices in prime-rl's bin order and in-bin order.
    #[pyo3(get)]
    bins: Vec<Vec<u32>>,
    /// The zero-length samples prime-rl drops without a word.
    #[pyo3(get)]
    dropped: Vec<u32>,
}

#[pymethods]
impl PyPrimeRlBins {
    fn __repr__(&self) -> String {
        format!("PrimeRlBins(bins={}, dropped={})", self.bins.len(), self.dropped.len())
    }
}

/// prime_rl_ffd(lengths, runs, labels, seq_len, *, backend=None) -> PrimeRlBins: prime-rl's
/// classic packer (first fit decreasing by (run, −length); bins share a label).
#[pyfunction]
#[pyo3(signature = (lengths, runs, labels, seq_len, *, backend=None))]
pub fn prime_rl_ffd(
    py: Python<'_>,
    lengths: Vec<u64>,
    runs: Vec<u32>,
    labels: Vec<u32>,
    seq_len: u64,
    backend: Option<BackendArg>,
) -> PyResult<PyPrimeRlBins> {
    let k = kernel(py, backend)?;
    let (bins, dropped) = py.detach(|| k.prime_rl_ffd(&lengths, &runs, &labels, seq_len)).map_err(|e| to_py(py, e))?;
    Ok(PyPrimeRlBins { bins, dropped })
}

/// round_robin(multimodal, dp) -> list[list[tuple[int, bool]]]: prime-rl's classic deal of
/// micro-batches to ``dp`` ranks, given which micro-batches hold a multimodal sample: the
/// multimodal ones, then the text ones, each group completed to a multiple of ``dp`` with
/// dummies copying its first micro-batch, entry ``i`` to rank ``i % dp``. Each rank's entries
/// are ``(micro_batch, dummy)``; a dummy names the micro-batch it copies. Raises
/// :class:`InvalidArgumentError` for ``dp`` outside 1..=2^20.
///
/// >>> round_robin([False, True, False], 2)
/// [[(1, False), (0, False)], [(1, True), (2, False)]]
#[pyfunction]
pub fn round_robin(py: Python<'_>, multimodal: Vec<bool>, dp: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<(u32, bool)>>> {
    let dp = u32_arg(dp, "dp", 0)?;
    let ranks = stowplan::materialize::round_robin(&multimodal, dp).map_err(|e| to_py(py, e))?;
    Ok(ranks.into_iter().map(|r| r.into_iter().map(|d| (d.micro_batch, d.dummy)).collect()).collect())
}

/// Adds this module's functions and classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(materialize, m)?)?;
    m.add_function(wrap_pyfunction!(round_robin, m)?)?;
    m.add_function(wrap_pyfunction!(prime_rl_ffd, m)?)?;
    m.add_class::<PyMaterialized>()?;
    m.add_class::<PyPrimeRlBins>()?;
    Ok(())
}
