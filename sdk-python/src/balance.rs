//! Balancing: micro-batches (`micro_batches`) and data-parallel ranks (`balance`).

use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use stowplan::kernel::{Balance, Cost, DpOptions, MicroBatches, MicroOptions};

use crate::convert::{
    BackendArg, Lengths, cost_arg, int, integer, kernel, opt_parse, opt_u32, renamed, repr, str_options, u32_arg,
    u64_arg,
};
use crate::errors::{invalid, to_py};
use crate::multi;
use crate::results::{LazyList, check_state, reduce, summary, vec_of, verl_unbalance, views};

/// The arrays of a result made of groups: `offsets` into the members (`indices`, `order`),
/// the tokens and cost of each group, and the groups as views (made once).
#[derive(Debug)]
struct Grouped {
    offsets: Py<PyArray1<u32>>,
    members: Py<PyArray1<u32>>,
    tokens: Py<PyArray1<u64>>,
    costs: Py<PyArray1<u64>>,
    groups: LazyList,
}

/// What pickles a [`Grouped`]: its four arrays.
type GroupedState = (Py<PyArray1<u32>>, Py<PyArray1<u32>>, Py<PyArray1<u64>>, Py<PyArray1<u64>>);

impl Grouped {
    fn new(py: Python<'_>, offsets: Vec<u32>, members: Vec<u32>, tokens: Vec<u64>, costs: Vec<u64>) -> Self {
        Grouped {
            offsets: offsets.into_pyarray(py).unbind(),
            members: members.into_pyarray(py).unbind(),
            tokens: tokens.into_pyarray(py).unbind(),
            costs: costs.into_pyarray(py).unbind(),
            groups: LazyList::default(),
        }
    }

    /// The number of groups.
    fn count(&self, py: Python<'_>) -> usize {
        self.offsets.bind(py).len().saturating_sub(1)
    }

    /// The arrays, for `__reduce__`.
    fn state(&self, py: Python<'_>) -> GroupedState {
        (self.offsets.clone_ref(py), self.members.clone_ref(py), self.tokens.clone_ref(py), self.costs.clone_ref(py))
    }

    /// The arrays `__reduce__` pickled, checked to be consistent (`what`: the class).
    fn from_state(py: Python<'_>, what: &str, state: GroupedState) -> PyResult<Self> {
        let (offsets, members, tokens, costs) = state;
        check_state(py, what, &offsets, members.bind(py).len(), &[tokens.bind(py).len(), costs.bind(py).len()])?;
        Ok(Grouped { offsets, members, tokens, costs, groups: LazyList::default() })
    }
}

/// The `#[pymethods]` of a result made of groups (a [`Grouped`] in its field `grouped`):
/// the methods given, the getters of its arrays (`offsets`, the members as `$members`, with
/// its doc, `tokens`, `costs`), the getter `$groups` (the groups as views) and the figures of the
/// tokens and the costs per `$per` group.
macro_rules! grouped_methods {
    ($class:ident, $groups:ident, $members:ident, $per:literal, $members_doc:literal, $groups_doc:literal, { $($methods:tt)* }) => {
        #[pymethods]
        impl $class {
            #[doc = concat!("``uint32`` array, the boundaries into ``", stringify!($members), "`` (one per ", $per, " and one more).")]
            #[getter]
            fn offsets(&self, py: Python<'_>) -> Py<PyArray1<u32>> {
                self.grouped.offsets.clone_ref(py)
            }

            #[doc = $members_doc]
            #[getter]
            fn $members(&self, py: Python<'_>) -> Py<PyArray1<u32>> {
                self.grouped.members.clone_ref(py)
            }

            #[doc = concat!("``uint64`` array, the tokens of each ", $per, ".")]
            #[getter]
            fn tokens(&self, py: Python<'_>) -> Py<PyArray1<u64>> {
                self.grouped.tokens.clone_ref(py)
            }

            #[doc = concat!("``uint64`` array, the cost of each ", $per, ".")]
            #[getter]
            fn costs(&self, py: Python<'_>) -> Py<PyArray1<u64>> {
                self.grouped.costs.clone_ref(py)
            }

            #[doc = $groups_doc]
            #[getter]
            fn $groups(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
                let g = &self.grouped;
                g.groups.get(py, || views(g.offsets.bind(py), g.members.bind(py)))
            }

            #[doc = concat!("``max``, ``min``, ``mean``, ``max_over_mean``, ``spread`` of the tokens per ", $per, ".")]
            #[getter]
            fn token_balance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                summary(self.grouped.tokens.bind(py))
            }

            #[doc = concat!("``max``, ``min``, ``mean``, ``max_over_mean``, ``spread`` of the cost per ", $per, ".")]
            #[getter]
            fn cost_balance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                summary(self.grouped.costs.bind(py))
            }

            $($methods)*
        }
    };
}

/// Micro-batches of one batch (the result of :func:`micro_batches`, or one rank's part of a
/// :class:`Balance`, whose indices are then global).
#[pyclass(frozen, module = "stowplan._stowplan", name = "MicroBatches")]
#[derive(Debug)]
pub struct PyMicroBatches {
    grouped: Grouped,
    /// ``uint32`` array; ``outputs[restore]`` puts outputs computed in micro-batch order
    /// (concatenated) back in input order (in a :class:`Balance`: in the order of the rank's
    /// samples, ``Balance.ranks[r]``).
    #[pyo3(get)]
    restore: Py<PyArray1<u32>>,
    /// ``max(1, ceil(total tokens / capacity))``.
    #[pyo3(get)]
    lower_bound: u32,
    /// The count this batch needs on its own (the count ``count=`` overrides).
    #[pyo3(get)]
    required: u32,
    /// The number of micro-batches.
    #[pyo3(get)]
    count: usize,
    max_tokens: u64,
}

impl PyMicroBatches {
    fn new(py: Python<'_>, p: MicroBatches) -> Self {
        let max_tokens = p.tokens.iter().copied().max().unwrap_or(0);
        let grouped = Grouped::new(py, p.offsets, p.indices, p.tokens, p.costs);
        Self {
            count: grouped.count(py),
            max_tokens,
            lower_bound: p.lower_bound,
            required: p.required,
            restore: p.restore.into_pyarray(py).unbind(),
            grouped,
        }
    }
}

grouped_methods!(
    PyMicroBatches,
    batches,
    indices,
    "micro-batch",
    "``uint32`` array, every input index once, micro-batch after micro-batch (ascending in each).",
    "List of ``uint32`` arrays (views of ``indices``), the input indices of each\nmicro-batch (ascending), in the requested order.",
    {
        /// Pickles as its fields.
        fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
            let (py, p) = (slf.py(), slf.get());
            let (offsets, indices, tokens, costs) = p.grouped.state(py);
            reduce(slf, ((offsets, indices, tokens, costs, p.restore.clone_ref(py)), p.lower_bound, p.required))
        }

        /// The micro-batches pickled by ``__reduce__``.
        #[staticmethod]
        #[allow(clippy::type_complexity)]
        fn _from_state(
            arrays: (Py<PyArray1<u32>>, Py<PyArray1<u32>>, Py<PyArray1<u64>>, Py<PyArray1<u64>>, Py<PyArray1<u32>>),
            lower_bound: u32,
            required: u32,
            py: Python<'_>,
        ) -> PyResult<Self> {
            let (offsets, indices, tokens, costs, restore) = arrays;
            let grouped = Grouped::from_state(py, "MicroBatches", (offsets, indices, tokens, costs))?;
            if restore.bind(py).len() != grouped.members.bind(py).len() {
                return Err(invalid(py, "MicroBatches: the pickled state is inconsistent (restore)".into()));
            }
            let max_tokens = grouped.tokens.bind(py).to_vec()?.into_iter().max().unwrap_or(0);
            Ok(Self { count: grouped.count(py), max_tokens, lower_bound, required, restore, grouped })
        }

        fn __len__(&self) -> usize {
            self.count
        }

        fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
            Ok(self.batches(py)?.into_bound(py).try_iter()?.into_any())
        }

        fn __repr__(&self) -> String {
            format!(
                "MicroBatches(count={}, lower_bound={}, max_tokens={})",
                self.count, self.lower_bound, self.max_tokens
            )
        }
    }
);

/// Micro-batch options from the arguments (`None`: `MicroOptions::new`'s defaults).
fn micro_options(
    py: Python<'_>,
    capacity: &Bound<'_, PyAny>,
    cost: Option<Cost>,
    min_count: Option<&Bound<'_, PyAny>>,
    divisible_by: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    order: Option<&str>,
) -> PyResult<MicroOptions> {
    let d = MicroOptions::new(u64_arg(capacity, "capacity", 1)?);
    Ok(MicroOptions {
        cost: cost.unwrap_or(d.cost),
        min_count: opt_u32(min_count, "min_count", 0)?.unwrap_or(d.min_count),
        divisible_by: opt_u32(divisible_by, "divisible_by", 1)?.unwrap_or(d.divisible_by),
        count: opt_u32(count, "count", 1)?.or(d.count),
        order: opt_parse(py, order)?.unwrap_or(d.order),
        ..d
    })
}

/// Splits one rank's batch into micro-batches of at most ``capacity`` tokens.
///
/// The cap is hard: no micro-batch ever exceeds it. The count is the smallest the cap allows
/// (the bin-packing lower bound on typical inputs), raised to ``min_count``, rounded up to a
/// multiple of ``divisible_by`` — or exactly ``count``. The cost is balanced across them.
///
/// ``lengths``: tokens per sequence (list, numpy array, CPU tensor …); ``capacity``: the
/// cap, ``>= 1``. Options (omitted or ``None``: the default): ``cost`` — ``"tokens"``
/// (default), ``"attention"`` (``24576·L + L²``, verl's and ROLL's workload) or a
/// ``(linear, quadratic)`` pair of integers; ``min_count`` — at least this many
/// micro-batches (e.g. pipeline stages; default 0); ``divisible_by`` — the count is a
/// multiple of this (virtual pipeline size; default 1); ``count`` — exactly this many (e.g.
/// the count every DP rank agreed on); ``order`` — ``"none"`` (input order, default),
/// ``"cost_desc"``, ``"verl"`` (verl's and ROLL's cheapest-at-both-ends order) or ``"roll"``
/// (ROLL's in-rank interleave); ``extra_costs`` — one extra cost per sequence on top of
/// ``cost`` (its units; e.g. a multimodal sample's image tokens): balanced, not capped;
/// ``resources`` and ``limits`` — further caps per micro-batch beside the tokens:
/// ``resources`` maps each name (not ``"tokens"``) to the sequences' sizes in it (image
/// tokens, images …; one array-like each) and ``limits`` the same names to the cap (``>= 1``),
/// up to 7; every micro-batch then stays within every cap, the count is best-fit decreasing's
/// under all of them, and ``lower_bound`` is the largest per-resource bound; ``backend`` —
/// ``"wasm"`` (default) or ``"native"``. ``max_token_len=`` is the former name of ``capacity``,
/// accepted with a ``DeprecationWarning`` for one release.
///
/// Raises :class:`InfeasibleError` for a sequence longer than ``capacity`` or over a
/// limit (named) or a ``count`` below what the caps allow; :class:`InvalidArgumentError` for empty input,
/// ``capacity`` 0, a count above the number of sequences (micro-batches are never
/// empty), ``count`` not a multiple of ``divisible_by`` …
///
/// >>> mb = micro_batches([100, 900, 50, 950, 400, 600], 2000)
/// >>> [b.tolist() for b in mb.batches], mb.tokens.tolist()
/// ([[0, 2, 3, 4], [1, 5]], [1500, 1500])
/// >>> mb.restore.tolist()  # position of each input in the concatenated micro-batches
/// [0, 4, 1, 2, 3, 5]
/// >>> vlm = micro_batches([100, 900, 50, 950], 2000, resources={"images": [3, 1, 0, 2]}, limits={"images": 3})
/// >>> [b.tolist() for b in vlm.batches]  # at most 3 images per micro-batch
/// [[0, 2], [1, 3]]
#[pyfunction]
#[pyo3(signature = (lengths, capacity=None, *, cost=None, min_count=None, divisible_by=None, count=None, order=None,
    extra_costs=None, resources=None, limits=None, backend=None, max_token_len=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn micro_batches(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    capacity: Option<&Bound<'_, PyAny>>,
    cost: Option<&Bound<'_, PyAny>>,
    min_count: Option<&Bound<'_, PyAny>>,
    divisible_by: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    order: Option<&Bound<'_, PyAny>>,
    extra_costs: Option<&Bound<'_, PyAny>>,
    resources: Option<&Bound<'_, PyDict>>,
    limits: Option<&Bound<'_, PyDict>>,
    backend: Option<BackendArg>,
    max_token_len: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMicroBatches> {
    str_options!(order);
    let capacity = renamed(py, "micro_batches", ("capacity", capacity), ("max_token_len", max_token_len))?
        .ok_or_else(|| invalid(py, "micro_batches: capacity (the tokens of a micro-batch, >= 1) is required".into()))?;
    let options = micro_options(py, capacity, cost_arg(cost)?, min_count, divisible_by, count, order)?;
    let lengths = Lengths::extract(lengths, "lengths")?;
    let extra = extra_costs.map(|e| Lengths::extract(e, "extra_costs")).transpose()?;
    let kernel = kernel(py, backend)?;
    let l = lengths.slice();
    let e = extra.as_ref().map(Lengths::slice);
    let limited = multi::limits_arg(py, resources, limits, l.len())?;
    let lim = limited.as_ref().map(|(sizes, caps, names)| stowplan::kernel::MicroLimits { sizes, caps, names });
    let p = py.detach(|| kernel.micro_batches(l, e, lim.as_ref(), &options)).map_err(|e| to_py(py, e))?;
    Ok(PyMicroBatches::new(py, p.plan))
}

/// A global batch over DP ranks (the result of :func:`balance`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "Balance")]
#[derive(Debug)]
pub struct PyBalance {
    grouped: Grouped,
    /// ``max(ceil(total cost / dp), costliest group)``.
    #[pyo3(get)]
    cost_lower_bound: u64,
    /// With ``capacity``, one :class:`MicroBatches` per rank (global indices, the same
    /// count on every rank); else ``None``.
    #[pyo3(get)]
    micro_batches: Option<Py<PyList>>,
    /// Micro-batches per rank (``None`` without ``capacity``).
    #[pyo3(get)]
    count: Option<usize>,
    /// The number of ranks.
    #[pyo3(get)]
    dp: usize,
    /// The input lengths (``uint64``/``int64`` array), for the metrics.
    #[pyo3(get)]
    lengths: Py<PyAny>,
    max_cost: u64,
}

grouped_methods!(
    PyBalance,
    ranks,
    order,
    "rank",
    "``uint32`` permutation of the input: ``batch[order]`` puts every rank's samples in one\ncontiguous slice, rank after rank (how verl's and ROLL's dispatchers split a batch).",
    "List of ``uint32`` arrays (views of ``order``), the input indices each rank gets\n(ascending; mini-batch by mini-batch with ``minibatch_size``).",
    {
        /// Pickles as its fields.
        fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
            let (py, b) = (slf.py(), slf.get());
            let micro = b.micro_batches.as_ref().map(|m| m.clone_ref(py));
            reduce(slf, (b.grouped.state(py), b.cost_lower_bound, micro, b.count, b.lengths.clone_ref(py), b.max_cost))
        }

        /// The balance pickled by ``__reduce__``.
        #[staticmethod]
        fn _from_state(
            arrays: GroupedState,
            cost_lower_bound: u64,
            micro_batches: Option<Py<PyList>>,
            count: Option<usize>,
            lengths: Py<PyAny>,
            max_cost: u64,
            py: Python<'_>,
        ) -> PyResult<Self> {
            let grouped = Grouped::from_state(py, "Balance", arrays)?;
            Ok(PyBalance { dp: grouped.count(py), grouped, cost_lower_bound, micro_batches, count, lengths, max_cost })
        }

        /// verl's ``log_seqlen_unbalance`` metrics for these ranks (tokens).
        #[pyo3(signature = (prefix="global_seqlen"))]
        fn log_seqlen_unbalance<'py>(&self, py: Python<'py>, prefix: &str) -> PyResult<Bound<'py, PyDict>> {
            let lengths = Lengths::extract(self.lengths.bind(py), "lengths")?;
            let seqlens = lengths
                .slice()
                .iter()
                .map(|&l| i64::try_from(l).map_err(|_| invalid(py, format!("length {l} is above 2**63-1"))))
                .collect::<PyResult<Vec<_>>>()?;
            let (o, i) = (vec_of(self.grouped.offsets.bind(py))?, vec_of(self.grouped.members.bind(py))?);
            let parts = o
                .windows(2)
                .map(|w| i.get(w[0] as usize..w[1] as usize).map(|r| r.iter().map(|&x| i64::from(x)).collect()))
                .collect::<Option<Vec<Vec<i64>>>>()
                .ok_or_else(|| PyValueError::new_err("offsets do not delimit order (were the arrays modified?)"))?;
            verl_unbalance(py, &seqlens, &parts, prefix)
        }

        fn __len__(&self) -> usize {
            self.dp
        }

        fn __repr__(&self) -> String {
            let count = self.count.map_or_else(|| "None".to_string(), |c| c.to_string());
            format!(
                "Balance(dp={}, max_cost={}, cost_lower_bound={}, count={count})",
                self.dp, self.max_cost, self.cost_lower_bound
            )
        }
    }
);

/// Group labels (any hashable values, e.g. uids; numpy arrays through ``tolist``) as dense
/// ids, one per sample.
fn labels(groups: Option<&Bound<'_, PyAny>>, n: usize) -> PyResult<Option<Vec<u32>>> {
    let Some(groups) = groups else { return Ok(None) };
    let py = groups.py();
    let values = if groups.hasattr("tolist")? { groups.call_method0("tolist")? } else { groups.clone() };
    let not_labels =
        || invalid(py, format!("groups must be a sequence of labels, one per sample (got {})", repr(groups)));
    if values.is_instance_of::<PyString>() || values.is_instance_of::<PyBytes>() {
        return Err(not_labels());
    }
    let ids = PyDict::new(py);
    let mut out = Vec::with_capacity(n);
    for (i, v) in values.try_iter().map_err(|_| not_labels())?.enumerate() {
        let v = v?;
        let found = ids
            .get_item(&v)
            .map_err(|_| invalid(py, format!("groups[{i}] must be a hashable label (got {})", repr(&v))))?;
        let id = match found {
            Some(id) => id.extract::<u32>()?,
            None => {
                let id = u32::try_from(ids.len()).map_err(|_| invalid(py, "more than 2**32-1 groups".into()))?;
                ids.set_item(&v, id)?;
                id
            }
        };
        out.push(id);
    }
    if out.len() != n {
        return Err(invalid(
            py,
            format!("groups has {} labels but lengths has {n} entries; give one label per sample", out.len()),
        ));
    }
    Ok(Some(out))
}

/// Balances a global batch over ``dp`` ranks, and with ``capacity`` also splits every
/// rank's part into micro-batches (the same count on every rank).
///
/// Every rank gets the same number of samples (``equal_count``), and the costliest rank is
/// made as light as the heuristic finds (Karmarkar–Karp on costs, then swaps). The plan is a
/// pure function of the global lengths, so every rank can compute it and agree on the
/// micro-batch count without an all-reduce.
///
/// ``lengths``: tokens per sample of the global batch; ``dp``: number of data-parallel ranks,
/// ``>= 1``. Options (omitted or ``None``: the default): ``cost`` — as in
/// :func:`micro_batches`; ``capacity`` — the micro-batch cap (``None``: plan only the DP
/// level); ``groups`` — one label per sample (any hashable values, e.g. the prompt uid of
/// each rollout; numpy arrays too): samples with the same label stay on one rank (equal counts
/// need groups of one size and a group count divisible by ``dp``); ``group_size`` — the CLI's
/// ``--group-size G``: runs of ``G`` consecutive samples (one prompt's ``G`` rollouts) stay on
/// one rank, i.e. ``groups=[i // G for i in range(len(lengths))]``; it must be in
/// ``1..=len(lengths)`` and divide ``len(lengths)`` (with ``equal_count=False`` the last run
/// may be shorter); give ``groups`` or ``group_size``, not both; ``minibatch_size`` — balance each run of this many consecutive samples
/// separately (verl's ``keep_minibatch``; each rank lists its samples mini-batch by
/// mini-batch); ``equal_count`` — every rank gets the same number of samples (default True);
/// ``min_count``, ``divisible_by``, ``count``, ``order`` — as in :func:`micro_batches`, per
/// rank; ``extra_costs`` — one extra cost per sample on top of ``cost`` (e.g. a multimodal
/// sample's image tokens), counted by both levels; ``resources``/``limits`` — further caps
/// per micro-batch, as in :func:`micro_batches` (with ``capacity``): every rank's
/// micro-batches stay within every cap, one common count; ``backend`` — ``"wasm"`` (default)
/// or ``"native"``. ``max_token_len=`` is the former name of ``capacity`` (deprecated).
///
/// Index spaces: ``order``, ``ranks[r]`` and ``micro_batches[r].batches`` of the result hold
/// **global** sample indices (positions in ``lengths``). A rank holding only its share
/// ``batch[plan.ranks[r]]`` slices it with :func:`rank_micro_batches` (rank-local positions);
/// ``micro_batches[r].restore`` is rank-local already.
///
/// Raises ``InvalidArgumentError`` naming the argument and its range (``dp`` above the number
/// of samples, counts that do not divide, ``groups`` of the wrong length or of different
/// sizes, ``group_size`` with ``groups`` or not dividing the samples …) and
/// ``InfeasibleError`` for a sample longer than ``capacity``.
///
/// >>> b = balance([100, 900, 50, 950, 400, 600], 2)
/// >>> [r.tolist() for r in b.ranks], b.tokens.tolist()
/// ([[1, 2, 5], [0, 3, 4]], [1550, 1450])
/// >>> rollouts = [5, 7, 1, 1, 9, 9, 2, 3]               # 4 prompts × 2 rollouts, consecutive
/// >>> [r.tolist() for r in balance(rollouts, 2, group_size=2).ranks]   # = groups=[0, 0, 1, 1, …]
/// [[2, 3, 4, 5], [0, 1, 6, 7]]
/// >>> b = balance([100, 900, 50, 950, 400, 600, 10, 20], 2, capacity=1000, cost="attention")
/// >>> b.count, [[m.tolist() for m in r.batches] for r in b.micro_batches]
/// (2, [[[1], [5, 6, 7]], [[0, 2, 4], [3]]])
#[pyfunction]
#[pyo3(signature = (lengths, dp, *, cost=None, capacity=None, groups=None, group_size=None, minibatch_size=None,
    equal_count=None, min_count=None, divisible_by=None, count=None, order=None, extra_costs=None, resources=None,
    limits=None, backend=None, max_token_len=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn balance(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    dp: &Bound<'_, PyAny>,
    cost: Option<&Bound<'_, PyAny>>,
    capacity: Option<&Bound<'_, PyAny>>,
    groups: Option<&Bound<'_, PyAny>>,
    group_size: Option<&Bound<'_, PyAny>>,
    minibatch_size: Option<&Bound<'_, PyAny>>,
    equal_count: Option<bool>,
    min_count: Option<&Bound<'_, PyAny>>,
    divisible_by: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    order: Option<&Bound<'_, PyAny>>,
    extra_costs: Option<&Bound<'_, PyAny>>,
    resources: Option<&Bound<'_, PyDict>>,
    limits: Option<&Bound<'_, PyDict>>,
    backend: Option<BackendArg>,
    max_token_len: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyBalance> {
    str_options!(order);
    let capacity = renamed(py, "balance", ("capacity", capacity), ("max_token_len", max_token_len))?;
    let d = DpOptions::default();
    let cost = cost_arg(cost)?.unwrap_or(d.cost);
    let dp = u32_arg(dp, "dp", 1)?;
    let minibatch_size = opt_u32(minibatch_size, "minibatch_size", 1)?.or(d.minibatch_size);
    let micro =
        capacity.map(|t| micro_options(py, t, Some(cost), min_count, divisible_by, count, order)).transpose()?;
    let lengths = Lengths::extract(lengths, "lengths")?;
    let l = lengths.slice();
    let equal_count = equal_count.unwrap_or(d.equal_count);
    let labels = match (groups, group_size) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                py,
                "give groups (one label per sample) or group_size (runs of group_size consecutive samples), not both"
                    .into(),
            ));
        }
        (None, Some(g)) => {
            let g = match integer(g) {
                Some(Some(g)) => g,
                not => {
                    let what = if not.is_none() { "an integer " } else { "" };
                    return Err(invalid(py, format!("group_size must be {what}in 1..={} (got {})", l.len(), repr(g))));
                }
            };
            Some(stowplan::kernel::group_labels(l.len(), g, equal_count).map_err(|e| to_py(py, e))?)
        }
        (groups, None) => labels(groups, l.len())?,
    };
    let extra = extra_costs.map(|e| Lengths::extract(e, "extra_costs")).transpose()?;
    let kernel = kernel(py, backend)?;
    let options = DpOptions {
        cost,
        groups: labels.as_deref(),
        minibatch_size,
        equal_count,
        extra_costs: extra.as_ref().map(Lengths::slice),
    };
    let limited = multi::limits_arg(py, resources, limits, l.len())?;
    let (plan, ranks): (Balance, Option<Vec<MicroBatches>>) = match (micro, &limited) {
        (None, Some(_)) => {
            return Err(invalid(py, "limits cap micro-batches: give capacity with resources and limits".into()));
        }
        (None, None) => (py.detach(|| kernel.balance_dp(l, dp, &options)).map_err(|e| to_py(py, e))?, None),
        (Some(m), limited) => {
            let lim = limited.as_ref().map(|(sizes, caps, names)| stowplan::kernel::MicroLimits { sizes, caps, names });
            let p = py.detach(|| kernel.plan(l, dp, &options, &m, lim.as_ref())).map_err(|e| to_py(py, e))?;
            (p.dp, Some(p.ranks))
        }
    };
    let (count, micro_batches) = match ranks {
        None => (None, None),
        Some(ranks) => {
            let count = ranks.first().map_or(0, MicroBatches::count);
            let list = PyList::empty(py);
            for r in ranks {
                list.append(Py::new(py, PyMicroBatches::new(py, r))?)?;
            }
            (Some(count), Some(list.unbind()))
        }
    };
    let max_cost = plan.costs.iter().copied().max().unwrap_or(0);
    let grouped = Grouped::new(py, plan.offsets, plan.order, plan.tokens, plan.costs);
    Ok(PyBalance {
        dp: grouped.count(py),
        max_cost,
        cost_lower_bound: plan.cost_lower_bound,
        grouped,
        micro_batches,
        count,
        lengths: lengths.array().unbind(),
    })
}

/// The micro-batches of rank ``rank`` of ``plan`` (a :class:`Balance` made with
/// ``capacity``), as ``uint32`` arrays in the plan's micro-batch order.
///
/// With ``local=True`` (the default) the arrays hold **rank-local** positions: indices into
/// the rank's own batch, the samples ``plan.ranks[rank]`` in that order
/// (``batch[plan.ranks[rank]]``, which is what verl's and ROLL's dispatchers hand rank
/// ``rank`` after reordering the global batch by ``plan.order``). With ``local=False`` they are
/// the global sample indices, ``plan.micro_batches[rank].batches`` as they are.
/// ``plan.micro_batches[rank].restore`` is already rank-local: ``outputs[restore]`` puts the
/// rank's outputs, computed micro-batch after micro-batch, back in the order of
/// ``plan.ranks[rank]``.
///
/// Raises ``InvalidArgumentError`` when ``plan`` is not a :class:`Balance`, has no
/// micro-batches, or ``rank`` is not in ``0..=dp-1``.
///
/// >>> lengths = [100, 900, 50, 950, 400, 600, 10, 20]
/// >>> plan = balance(lengths, 2, capacity=1000, cost="attention")
/// >>> plan.ranks[1].tolist()                                   # global indices of rank 1's samples
/// [0, 2, 3, 4]
/// >>> [m.tolist() for m in plan.micro_batches[1].batches]     # global indices too
/// [[0, 2, 4], [3]]
/// >>> local = rank_micro_batches(plan, 1)                     # positions in rank 1's own batch
/// >>> [m.tolist() for m in local]
/// [[0, 1, 3], [2]]
/// >>> mine = [lengths[i] for i in plan.ranks[1]]             # what rank 1 holds
/// >>> [[mine[j] for j in m] for m in local]
/// [[100, 50, 400], [950]]
#[pyfunction]
#[pyo3(signature = (plan, rank, *, local=true))]
pub(crate) fn rank_micro_batches<'py>(
    py: Python<'py>,
    plan: &Bound<'py, PyAny>,
    rank: &Bound<'py, PyAny>,
    local: bool,
) -> PyResult<Bound<'py, PyList>> {
    let type_name = || plan.get_type().name().map_or_else(|_| "?".to_string(), |n| n.to_string());
    let b = plan.cast::<PyBalance>().map_err(|_| {
        invalid(py, format!("plan must be a stowplan.Balance, the result of stowplan.balance (got {})", type_name()))
    })?;
    let b = b.get();
    let Some(micro) = &b.micro_batches else {
        return Err(invalid(py, "plan has no micro-batches: make it with stowplan.balance(..., capacity=T)".into()));
    };
    let rank: usize = int(rank, "rank", 0, b.dp as i128 - 1)?;
    let mb = micro.bind(py).get_item(rank)?;
    let mb = mb.cast::<PyMicroBatches>()?.get();
    if !local {
        return PyList::new(py, mb.batches(py)?.bind(py).iter());
    }
    let (offsets, order) = (vec_of(b.grouped.offsets.bind(py))?, vec_of(b.grouped.members.bind(py))?);
    let modified = || PyValueError::new_err("the plan's arrays disagree (were they modified?)");
    let span = offsets.get(rank).zip(offsets.get(rank + 1)).map(|(&lo, &hi)| lo as usize..hi as usize);
    let mine = span.and_then(|s| order.get(s)).ok_or_else(modified)?;
    // (global index, position in the rank's batch), sorted by global index.
    let mut at: Vec<(u32, u32)> = mine.iter().zip(0u32..).map(|(&g, p)| (g, p)).collect();
    at.sort_unstable();
    let positions = vec_of(mb.grouped.members.bind(py))?
        .iter()
        .map(|g| at.binary_search_by_key(g, |&(x, _)| x).map(|k| at[k].1).map_err(|_| modified()))
        .collect::<PyResult<Vec<u32>>>()?;
    views(mb.grouped.offsets.bind(py), &positions.into_pyarray(py))
}

/// Registers balancing: `micro_batches`, `balance`, `rank_micro_batches` and their results.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(micro_batches, m)?)?;
    m.add_function(wrap_pyfunction!(balance, m)?)?;
    m.add_function(wrap_pyfunction!(rank_micro_batches, m)?)?;
    m.add_class::<PyMicroBatches>()?;
    m.add_class::<PyBalance>()
}
