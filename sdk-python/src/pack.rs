//! `partition`, `pack` and `pack_multi`, and their result classes.

use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use stowplan::kernel::{MultiOptions, PackOptions, Packing, Partition, PartitionMethod, PartitionOptions};

use crate::convert::{BackendArg, Lengths, kernel, opt_parse, opt_u64, str_options, u32_arg, u64_arg};
use crate::errors::{invalid, to_py};
use crate::options::options;
use crate::results::{LazyList, check_state, lists, reduce};

/// The result of :func:`partition`: ``k`` groups of input indices.
#[pyclass(frozen, module = "stowplan._stowplan", name = "Partition")]
#[derive(Debug)]
pub struct PyPartition {
    /// ``uint32`` array of ``k + 1`` boundaries into ``indices``.
    #[pyo3(get)]
    offsets: Py<PyArray1<u32>>,
    /// ``uint32`` array of every input index once, group after group.
    #[pyo3(get)]
    indices: Py<PyArray1<u32>>,
    /// ``uint64`` array, the sum of each group's weights.
    #[pyo3(get)]
    sums: Py<PyArray1<u64>>,
    /// Sum of all weights.
    #[pyo3(get)]
    total: u64,
    /// Largest group sum minus smallest.
    #[pyo3(get)]
    spread: u64,
    /// ``max(ceil(total / k), largest weight)``; no partition's largest group is lighter.
    #[pyo3(get)]
    lower_bound: u64,
    /// The number of groups.
    #[pyo3(get)]
    k: usize,
    /// The heaviest group's sum.
    #[pyo3(get)]
    max: u64,
    groups: LazyList,
}

impl PyPartition {
    fn new(py: Python<'_>, p: Partition) -> Self {
        Self {
            k: p.offsets.len().saturating_sub(1),
            max: p.sums.iter().copied().max().unwrap_or(0),
            total: p.total,
            spread: p.spread,
            lower_bound: p.lower_bound,
            offsets: p.offsets.into_pyarray(py).unbind(),
            indices: p.indices.into_pyarray(py).unbind(),
            sums: p.sums.into_pyarray(py).unbind(),
            groups: LazyList::default(),
        }
    }
}

#[pymethods]
impl PyPartition {
    /// Pickles as its fields.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let (py, p) = (slf.py(), slf.get());
        reduce(
            slf,
            (p.offsets.clone_ref(py), p.indices.clone_ref(py), p.sums.clone_ref(py), p.total, p.spread, p.lower_bound),
        )
    }

    /// The partition pickled by ``__reduce__``.
    #[staticmethod]
    fn _from_state(
        offsets: Py<PyArray1<u32>>,
        indices: Py<PyArray1<u32>>,
        sums: Py<PyArray1<u64>>,
        total: u64,
        spread: u64,
        lower_bound: u64,
        py: Python<'_>,
    ) -> PyResult<Self> {
        let sums_v: Vec<u64> = sums.bind(py).to_vec()?;
        check_state(py, "Partition", &offsets, indices.bind(py).len(), &[sums_v.len()])?;
        Ok(Self {
            k: offsets.bind(py).len().saturating_sub(1),
            max: sums_v.iter().copied().max().unwrap_or(0),
            total,
            spread,
            lower_bound,
            offsets,
            indices,
            sums,
            groups: LazyList::default(),
        })
    }

    /// The groups as lists of input indices (built on first access).
    #[getter]
    fn groups(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        self.groups.get(py, || lists(self.offsets.bind(py), self.indices.bind(py)))
    }

    fn __len__(&self) -> usize {
        self.k
    }

    fn __repr__(&self) -> String {
        format!(
            "Partition(k={}, total={}, max={}, spread={}, lower_bound={})",
            self.k, self.total, self.max, self.spread, self.lower_bound
        )
    }
}

/// Splits ``weights`` (e.g. sequence lengths in tokens) into ``k`` groups with balanced sums.
///
/// ``weights``: non-negative integers — a list, a numpy integer array (``uint64``/``int64``
/// read without copying when contiguous), or anything with ``__array__``/DLPack such as a
/// CPU torch tensor. ``k``: number of groups, ``1 <= k <= len(weights)``.
///
/// ``options``: keyword-only, the fields of the kernel's partition options record, each
/// omitted or ``None`` for the kernel's default — ``method`` (``"kk"``, Karmarkar–Karp, by
/// default; ``"greedy"``, LPT; ``"verl"``, verl 0.9.1's exact
/// ``get_seqlen_balanced_partitions`` output), ``equal_size`` (every group gets
/// ``len(weights) / k`` items; must divide), ``refine`` (improve ``kk``/``greedy`` by pairwise
/// moves/swaps; by default on except for ``"verl"``, which never refines) and any the kernel
/// adds (the stubs' ``_PartitionOptions``, generated from the WIT, document them all).
/// ``backend``: ``"wasm"`` (default) or ``"native"`` (same kernel code, compiled natively).
///
/// Returns a :class:`Partition`: groups ordered by sum descending (ties: smallest member
/// first), members ascending; verl's order for ``method="verl"``. Raises
/// :class:`InvalidArgumentError` for ``k`` out of range, empty or negative weights,
/// ``equal_size`` with ``len(weights) % k != 0``, sums above ``2**64 - 1``, an unknown
/// method …
///
/// >>> partition([3, 1, 2, 2], 2).groups
/// [[0, 1], [2, 3]]
#[pyfunction]
#[pyo3(signature = (weights, k, *, backend=None, **options))]
pub(crate) fn partition(
    py: Python<'_>,
    weights: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    backend: Option<BackendArg>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyPartition> {
    let k = u32_arg(k, "k", 1)?;
    let mut o = PartitionOptions::default();
    let given = options!(__partition_options, options, "partition", &[], o);
    // verl's output is reproduced as is: never refined unless asked (which the kernel refuses).
    if o.method == PartitionMethod::Verl && !given.contains(&"refine") {
        o.refine = false;
    }
    let weights = Lengths::extract(weights, "weights")?;
    let kernel = kernel(py, backend)?;
    let w = weights.slice();
    let p = py.detach(|| kernel.partition(w, k, &o)).map_err(|e| to_py(py, e))?;
    Ok(PyPartition::new(py, p))
}

/// The result of :func:`pack`: bins of input indices.
#[pyclass(frozen, module = "stowplan._stowplan", name = "Packing")]
#[derive(Debug)]
pub struct PyPacking {
    /// ``uint32`` array of ``bins + 1`` boundaries into ``indices``.
    #[pyo3(get)]
    offsets: Py<PyArray1<u32>>,
    /// ``uint32`` array of the packed input indices, bin after bin, ascending in a bin.
    #[pyo3(get)]
    indices: Py<PyArray1<u32>>,
    /// ``uint64`` array, each bin's aligned load (≤ capacity except oversized singles).
    #[pyo3(get)]
    loads: Py<PyArray1<u64>>,
    /// ``uint32`` array of indices left out under ``oversize="drop"``.
    #[pyo3(get)]
    dropped: Py<PyArray1<u32>>,
    /// ``uint32`` array of oversized indices placed alone under ``oversize="single"``.
    #[pyo3(get)]
    single: Py<PyArray1<u32>>,
    /// Sum of the real lengths packed.
    #[pyo3(get)]
    real_tokens: u64,
    /// Sum of the aligned lengths packed.
    #[pyo3(get)]
    aligned_tokens: u64,
    /// Alignment padding: aligned tokens minus real tokens.
    #[pyo3(get)]
    padding_tokens: u64,
    /// ``ceil(aligned lengths that fit / capacity)``, the fewest bins possible for those
    /// items (single bins come on top).
    #[pyo3(get)]
    lower_bound: u64,
    /// Real tokens of the regular (non-single) bins over their capacity, 0..1.
    #[pyo3(get)]
    efficiency: f64,
    /// The capacity the bins were packed to.
    #[pyo3(get)]
    capacity: u64,
    /// The number of bins.
    #[pyo3(get)]
    num_bins: usize,
    bins: LazyList,
}

#[pymethods]
impl PyPacking {
    /// Pickles as its fields.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let (py, p) = (slf.py(), slf.get());
        let arrays = (
            p.offsets.clone_ref(py),
            p.indices.clone_ref(py),
            p.loads.clone_ref(py),
            p.dropped.clone_ref(py),
            p.single.clone_ref(py),
        );
        reduce(slf, (arrays, (p.real_tokens, p.aligned_tokens, p.lower_bound, p.efficiency, p.capacity)))
    }

    /// The packing pickled by ``__reduce__``.
    #[staticmethod]
    #[allow(clippy::type_complexity)]
    fn _from_state(
        arrays: (Py<PyArray1<u32>>, Py<PyArray1<u32>>, Py<PyArray1<u64>>, Py<PyArray1<u32>>, Py<PyArray1<u32>>),
        figures: (u64, u64, u64, f64, u64),
        py: Python<'_>,
    ) -> PyResult<Self> {
        let (offsets, indices, loads, dropped, single) = arrays;
        let (real_tokens, aligned_tokens, lower_bound, efficiency, capacity) = figures;
        check_state(py, "Packing", &offsets, indices.bind(py).len(), &[loads.bind(py).len()])?;
        if real_tokens > aligned_tokens {
            return Err(invalid(
                py,
                "Packing: the pickled state is inconsistent (more real tokens than aligned)".into(),
            ));
        }
        Ok(PyPacking {
            num_bins: offsets.bind(py).len().saturating_sub(1),
            padding_tokens: aligned_tokens.saturating_sub(real_tokens),
            real_tokens,
            aligned_tokens,
            lower_bound,
            efficiency,
            capacity,
            offsets,
            indices,
            loads,
            dropped,
            single,
            bins: LazyList::default(),
        })
    }

    /// The bins as lists of input indices (built on first access).
    #[getter]
    fn bins(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        self.bins.get(py, || lists(self.offsets.bind(py), self.indices.bind(py)))
    }

    fn __len__(&self) -> usize {
        self.num_bins
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Packing(bins={}, lower_bound={}, real_tokens={}, dropped={}, single={})",
            self.num_bins,
            self.lower_bound,
            self.real_tokens,
            self.dropped.bind(py).len(),
            self.single.bind(py).len()
        )
    }
}

/// Packs ``lengths`` (tokens) into bins of at most ``capacity`` tokens (``>= 1``).
///
/// ``lengths``: non-negative integers (list, numpy array, CPU tensor, DLPack …).
/// ``options``: keyword-only, the fields of the kernel's pack options record other than
/// ``capacity``, each omitted or ``None`` for the kernel's default — ``align`` (lengths rounded
/// up to a multiple of it first), ``method`` (``"bfd"`` by default, ``"ffd"``, ``"next-fit"``),
/// ``oversize`` (``"error"`` by default: :class:`InfeasibleError`; ``"single"``, ``"drop"``)
/// and any the kernel adds (the stubs' ``_PackOptions``, generated from the WIT, document
/// them all). ``backend``: ``"wasm"`` (default) or ``"native"``.
///
/// Returns a :class:`Packing`; bins in creation order, members ascending.
///
/// >>> pack([5, 3, 7, 2, 6], 10).bins
/// [[1, 2], [3, 4], [0]]
#[pyfunction]
#[pyo3(signature = (lengths, capacity, *, backend=None, **options))]
pub(crate) fn pack(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    capacity: &Bound<'_, PyAny>,
    backend: Option<BackendArg>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyPacking> {
    let mut o = PackOptions::new(u64_arg(capacity, "capacity", 1)?);
    options!(__pack_options, options, "pack", &["capacity"], o);
    let lengths = Lengths::extract(lengths, "lengths")?;
    let kernel = kernel(py, backend)?;
    let l = lengths.slice();
    let p: Packing = py.detach(|| kernel.pack(l, &o)).map_err(|e| to_py(py, e))?;
    Ok(PyPacking::new(py, p, l, o.capacity))
}

impl PyPacking {
    /// The Python result of `p`, packed from `lengths` into bins of `capacity` tokens.
    fn new(py: Python<'_>, p: Packing, lengths: &[u64], capacity: u64) -> Self {
        PyPacking {
            efficiency: p.efficiency(lengths, capacity),
            capacity,
            num_bins: p.offsets.len().saturating_sub(1),
            real_tokens: p.real_tokens,
            aligned_tokens: p.aligned_tokens,
            padding_tokens: p.padding_tokens(),
            lower_bound: p.lower_bound,
            offsets: p.offsets.into_pyarray(py).unbind(),
            indices: p.indices.into_pyarray(py).unbind(),
            loads: p.loads.into_pyarray(py).unbind(),
            dropped: p.dropped.into_pyarray(py).unbind(),
            single: p.single.into_pyarray(py).unbind(),
            bins: LazyList::default(),
        }
    }
}

/// The result of :func:`pack_multi`: the bins as :class:`Packing` gives them (token loads,
/// ``lower_bound`` the largest per-resource bound) plus every bin's load in every resource.
#[pyclass(frozen, module = "stowplan._stowplan", name = "MultiPacking")]
#[derive(Debug)]
pub struct PyMultiPacking {
    /// The bins (a :class:`Packing`; ``loads`` are token loads).
    #[pyo3(get)]
    packing: Py<PyPacking>,
    /// The resources' names, tokens first, in the order of ``columns``.
    #[pyo3(get)]
    names: Vec<String>,
    /// ``uint64`` array of shape (bins, resources): each bin's load in each resource.
    #[pyo3(get)]
    resource_loads: Py<PyAny>,
    /// ``{name: bound}``: ``ceil(Σ sizes of the packed items / capacity)`` per resource, and
    /// ``"segments"`` with ``max_segments``.
    #[pyo3(get)]
    lower_bounds: Py<PyDict>,
}

#[pymethods]
impl PyMultiPacking {
    /// Pickles as its fields.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let (py, p) = (slf.py(), slf.get());
        let state =
            (p.packing.clone_ref(py), p.names.clone(), p.resource_loads.clone_ref(py), p.lower_bounds.clone_ref(py));
        reduce(slf, state)
    }

    /// The packing pickled by ``__reduce__``.
    #[staticmethod]
    fn _from_state(
        py: Python<'_>,
        packing: Py<PyPacking>,
        names: Vec<String>,
        resource_loads: Py<PyAny>,
        lower_bounds: Py<PyDict>,
    ) -> PyResult<Self> {
        let loads = resource_loads.bind(py).cast::<numpy::PyArray2<u64>>().map_err(|_| {
            invalid(py, "MultiPacking: the pickled resource_loads is not a uint64 array of (bins, resources)".into())
        })?;
        let keys: Vec<String> = lower_bounds.bind(py).keys().extract()?;
        let named = keys.len() >= names.len() && keys[..names.len()] == names[..];
        if loads.shape() != [packing.get().num_bins, names.len()] || !named {
            return Err(invalid(
                py,
                "MultiPacking: the pickled state is inconsistent (names, loads and bounds disagree)".into(),
            ));
        }
        Ok(PyMultiPacking { packing, names, resource_loads, lower_bounds })
    }

    /// The bins as lists of input indices.
    #[getter]
    fn bins(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        self.packing.get().bins(py)
    }

    /// The largest of ``lower_bounds``: no packing of the items that fit uses fewer bins.
    #[getter]
    fn lower_bound(&self) -> u64 {
        self.packing.get().lower_bound
    }

    fn __len__(&self) -> usize {
        self.packing.get().num_bins
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "MultiPacking(bins={}, lower_bounds={}, names={:?})",
            self.packing.get().num_bins,
            self.lower_bounds.bind(py).repr().map(|r| r.to_string()).unwrap_or_default(),
            self.names
        )
    }
}

/// Packs items under several limits at once: ``columns`` maps each resource's name to the
/// items' sizes in it (one array-like each, all of one length; the first is the tokens),
/// ``capacities`` maps the same names to each bin's capacity (``>= 1``). Up to 8 resources.
/// ``max_segments``: at most this many items per bin (``None`` or 0: no limit). ``method``:
/// ``"balanced"`` (the default: packs filled so that their limits run out together, in
/// O(n log n); capacities up to 2^32 − 1), ``"bfd"``, ``"ffd"`` or ``"next_fit"``. ``align``,
/// ``oversize`` and ``backend`` as in :func:`pack` (``align`` rounds the tokens; an item over
/// any capacity is oversized). Every bin stays within every capacity; with one resource and
/// no segment limit the bins are :func:`pack`'s (``balanced`` is ``bfd`` there). ``bfd`` and
/// ``ffd`` take at most 262,144 items with two or more resources or a segment limit, and 2^30
/// fit steps (an input that would run for minutes is refused: pack it in windows).
///
/// Returns a :class:`MultiPacking`.
///
/// >>> p = pack_multi({"tokens": [900, 300, 700, 500], "images": [2, 0, 1, 1]}, {"tokens": 1200, "images": 2})
/// >>> p.bins, p.resource_loads.tolist()
/// ([[0, 1], [2, 3]], [[1200, 2], [1200, 2]])
#[pyfunction]
#[pyo3(signature = (columns, capacities, *, max_segments=None, align=None, method=None, oversize=None, backend=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_multi(
    py: Python<'_>,
    columns: &Bound<'_, PyDict>,
    capacities: &Bound<'_, PyDict>,
    max_segments: Option<&Bound<'_, PyAny>>,
    align: Option<&Bound<'_, PyAny>>,
    method: Option<&Bound<'_, PyAny>>,
    oversize: Option<&Bound<'_, PyAny>>,
    backend: Option<BackendArg>,
) -> PyResult<PyMultiPacking> {
    str_options!(method, oversize);
    let d = PackOptions::new(1);
    let r = columns.len();
    if r == 0 || r > stowplan::kernel::MAX_RESOURCES {
        return Err(invalid(
            py,
            format!("columns must name 1 to {} resources (got {r})", stowplan::kernel::MAX_RESOURCES),
        ));
    }
    let mut names = Vec::with_capacity(r);
    let mut caps = Vec::with_capacity(r);
    let mut cols: Vec<Vec<u64>> = Vec::with_capacity(r);
    for (name, values) in columns.iter() {
        let name: String = name.extract().map_err(|_| {
            invalid(
                py,
                format!(
                    "columns' keys must be resource names (str), got {}",
                    name.repr().map(|r| r.to_string()).unwrap_or_default()
                ),
            )
        })?;
        let Some(cap) = capacities.get_item(&name)? else {
            return Err(invalid(py, format!("capacities has no entry for column '{name}'")));
        };
        caps.push(u64_arg(&cap, &format!("capacities['{name}']"), 1)?);
        cols.push(Lengths::extract(&values, &format!("columns['{name}']"))?.slice().to_vec());
        names.push(name);
    }
    for key in capacities.keys() {
        let Ok(key) = key.extract::<String>() else {
            let shown = key.repr().map(|r| r.to_string()).unwrap_or_default();
            return Err(invalid(py, format!("capacities' keys must be resource names (str), got {shown}")));
        };
        if !names.contains(&key) {
            return Err(invalid(
                py,
                format!("capacities['{key}'] has no column of sizes in columns (columns: {})", names.join(", ")),
            ));
        }
    }
    let n = cols[0].len();
    if let Some(q) = cols.iter().position(|c| c.len() != n) {
        return Err(invalid(
            py,
            format!(
                "columns['{}'] has {} sizes, columns['{}'] {n}: one per item in each",
                names[q],
                cols[q].len(),
                names[0]
            ),
        ));
    }
    let sizes: Vec<u64> = (0..n).flat_map(|i| cols.iter().map(move |c| c[i])).collect();
    let options = MultiOptions {
        capacities: &caps,
        names: &names,
        max_segments: opt_u64(max_segments, "max_segments", 0)?.unwrap_or(0),
        align: opt_u64(align, "align", 1)?.unwrap_or(d.align),
        method: opt_parse(py, method)?.unwrap_or_default(),
        oversize: opt_parse(py, oversize)?.unwrap_or(d.oversize),
    };
    let kernel = kernel(py, backend)?;
    let p = py.detach(|| kernel.pack_multi(&sizes, &options)).map_err(|e| to_py(py, e))?;
    let bounds = PyDict::new(py);
    for (q, name) in names.iter().enumerate() {
        bounds.set_item(name, p.lower_bounds[q])?;
    }
    if options.max_segments > 0 {
        bounds.set_item(stowplan::kernel::SEGMENTS, p.lower_bounds[r])?;
    }
    let bins = p.packing.bins();
    let loads = p.resource_loads.into_pyarray(py).reshape([bins, r])?.into_any().unbind();
    Ok(PyMultiPacking {
        packing: Py::new(py, PyPacking::new(py, p.packing, &cols[0], caps[0]))?,
        names,
        resource_loads: loads,
        lower_bounds: bounds.unbind(),
    })
}

/// Registers partitioning and packing: `partition`, `pack`, `pack_multi` and their results.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(partition, m)?)?;
    m.add_function(wrap_pyfunction!(pack, m)?)?;
    m.add_function(wrap_pyfunction!(pack_multi, m)?)?;
    m.add_class::<PyPartition>()?;
    m.add_class::<PyPacking>()?;
    m.add_class::<PyMultiPacking>()
}
