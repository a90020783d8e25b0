//! The rollout data source with a buffer for Python (`stowplan._stowplan.DataSource`).
//! Samples cross as dicts of the host's `RolloutSample` fields; behaviour lives in the host.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use stowplan::{
    DataSource,
    source::{DataSourceOptions, Group, RolloutSample, Status},
};

use crate::filter::PyFilter;
use crate::str_options;
use crate::{BackendArg, Nullable, int, invalid, kernel, opt_u64, to_py, u32_arg};

fn status_name(s: Status) -> &'static str {
    match s {
        Status::Pending => "pending",
        Status::Completed => "completed",
        Status::Truncated => "truncated",
        Status::Aborted => "aborted",
    }
}

fn sample_dict<'py>(py: Python<'py>, s: &RolloutSample) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("index", s.index)?;
    d.set_item("group", s.group)?;
    d.set_item("prompt_index", s.prompt_index)?;
    d.set_item("prompt", &s.prompt)?;
    d.set_item("label", &s.label)?;
    d.set_item("metadata", &s.metadata)?;
    d.set_item("prompt_length", s.prompt_length)?;
    d.set_item("response_length", s.response_length)?;
    d.set_item("rewards", &s.rewards)?;
    d.set_item("status", status_name(s.status))?;
    d.set_item("payload", PyBytes::new(py, &s.payload))?;
    Ok(d)
}

fn groups_list<'py>(py: Python<'py>, groups: &[Group]) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for g in groups {
        let samples = PyList::empty(py);
        for s in g {
            samples.append(sample_dict(py, s)?)?;
        }
        out.append(samples)?;
    }
    Ok(out)
}

/// A sample dict (`stowplan._source`'s encoding) as the host's sample; `group` `None` means
/// the sample's prompt group, `index / n_samples_per_prompt`.
fn sample_from(d: &Bound<'_, PyDict>, at: &str, n_samples_per_prompt: u32) -> PyResult<RolloutSample> {
    let py = d.py();
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(key)?.ok_or_else(|| invalid(py, format!("{at} has no {key:?}")))
    };
    let field = |key: &str, what: &str| invalid(py, format!("{at}.{key} must be {what}"));
    let name = |key: &str| format!("{at}.{key}");
    let status = match get("status")?.extract::<String>()?.as_str() {
        "pending" => Status::Pending,
        "completed" => Status::Completed,
        "truncated" => Status::Truncated,
        "aborted" => Status::Aborted,
        other => {
            return Err(invalid(
                py,
                format!("{at}.status must be pending, completed, truncated or aborted (got {other:?})"),
            ));
        }
    };
    let index: u64 = int(&get("index")?, &name("index"), 0, u64::MAX.into())?;
    let group = get("group")?;
    let group = if group.is_none() {
        index / u64::from(n_samples_per_prompt)
    } else {
        int(&group, &name("group"), 0, u64::MAX.into())?
    };
    let u32_field = |key: &str| -> PyResult<u32> { int(&get(key)?, &name(key), 0, u32::MAX.into()) };
    Ok(RolloutSample {
        index,
        group,
        prompt_index: u32_field("prompt_index")?,
        prompt: get("prompt")?.extract().map_err(|_| field("prompt", "JSON text"))?,
        label: get("label")?.extract().map_err(|_| field("label", "a string or None"))?,
        metadata: get("metadata")?.extract().map_err(|_| field("metadata", "JSON object text"))?,
        prompt_length: u32_field("prompt_length")?,
        response_length: u32_field("response_length")?,
        rewards: get("rewards")?.extract().map_err(|_| field("rewards", "a list of floats"))?,
        status,
        payload: get("payload")?.extract().map_err(|_| field("payload", "bytes"))?,
    })
}

/// Where a data source's prompts come from: a JSONL file, or records as JSON texts.
enum Origin {
    Path(PathBuf),
    Records(Vec<String>),
}

impl<'py> FromPyObject<'_, 'py> for Origin {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(path) = obj.extract::<PathBuf>() {
            return Ok(Origin::Path(path));
        }
        obj.extract::<Vec<String>>().map(Origin::Records).map_err(|_| {
            let got = obj.get_type().name().map_or_else(|_| "?".to_string(), |n| n.to_string());
            invalid(obj.py(), format!("origin must be a path (str or os.PathLike) or a list of JSON texts (got {got})"))
        })
    }
}

/// The host data source; see `stowplan.DataSource` for the Python-facing class.
#[pyclass(module = "stowplan._stowplan", name = "DataSource")]
#[derive(Debug)]
pub struct PyDataSource {
    inner: DataSource,
}

#[pymethods]
impl PyDataSource {
    /// DataSource(origin, n_samples_per_prompt, *, identity=None, shuffle=None, seed=None,
    /// input_key=None, label_key=..., metadata_key=..., backend=None) over a JSONL file (a
    /// path) or records given as JSON texts (a list of str); ``identity`` names records in
    /// saved states (default ``records``; a file is named by its path). Omitted options: the
    /// host's defaults (no shuffle, seed 0, keys ``prompt``, ``label``, ``metadata``);
    /// ``label_key=None``/``metadata_key=None``: no such key.
    #[new]
    #[pyo3(signature = (origin, n_samples_per_prompt, *, identity=None, shuffle=None, seed=None, input_key=None,
        label_key=Nullable::Omitted, metadata_key=Nullable::Omitted, backend=None))]
    #[allow(clippy::too_many_arguments)]
    fn new<'py>(
        py: Python<'py>,
        origin: Origin,
        n_samples_per_prompt: &Bound<'py, PyAny>,
        identity: Option<&Bound<'_, PyAny>>,
        shuffle: Option<bool>,
        seed: Option<&Bound<'py, PyAny>>,
        input_key: Option<String>,
        label_key: Nullable<'py>,
        metadata_key: Nullable<'py>,
        backend: Option<BackendArg>,
    ) -> PyResult<Self> {
        str_options!(identity);
        let options = options(n_samples_per_prompt, shuffle, seed, input_key, label_key, metadata_key)?;
        let kernel = kernel(py, backend)?;
        let inner = match origin {
            Origin::Path(_) if identity.is_some() => {
                return Err(invalid(py, "identity names records; a file's source is named by its path".into()));
            }
            Origin::Path(path) => py.detach(|| DataSource::from_jsonl(&path, options, kernel)),
            Origin::Records(texts) => {
                let mut records = Vec::with_capacity(texts.len());
                for (i, r) in texts.iter().enumerate() {
                    let r =
                        serde_json::from_str(r).map_err(|e| invalid(py, format!("records[{i}] is not JSON: {e}")))?;
                    records.push(r);
                }
                DataSource::from_records(records, identity.unwrap_or(RECORDS), options, kernel)
            }
        };
        Ok(Self { inner: inner.map_err(|e| to_py(py, e))? })
    }

    /// get_samples(n, *, rollout_id=None, filter=None) -> list of groups of sample dicts: the
    /// buffer first (through `filter`, FIFO without one), then the dataset.
    #[pyo3(signature = (n, *, rollout_id=None, filter=None))]
    fn get_samples<'py>(
        &mut self,
        py: Python<'py>,
        n: &Bound<'py, PyAny>,
        rollout_id: Option<&Bound<'py, PyAny>>,
        filter: Option<PyRef<'_, PyFilter>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let n: usize = int(n, "num_samples", 0, u64::MAX.into())?;
        let rollout_id = opt_u64(rollout_id, "rollout_id", 0)?;
        let inner = &mut self.inner;
        let filter = filter.as_deref();
        // A plugin call may take up to its deadline: without the GIL.
        let groups = py
            .detach(|| match filter {
                Some(f) => inner.get_samples(n, rollout_id, Some(&mut *f.lock())),
                None => inner.get_samples(n, rollout_id, None),
            })
            .map_err(|e| to_py(py, e))?;
        groups_list(py, &groups)
    }

    /// add_samples(groups): validates every group, then appends them to the buffer.
    fn add_samples(&mut self, py: Python<'_>, groups: &Bound<'_, PyList>) -> PyResult<()> {
        let k = self.inner.options().n_samples_per_prompt;
        let mut out = Vec::with_capacity(groups.len());
        for (g, group) in groups.iter().enumerate() {
            let group = group.cast_into::<PyList>().map_err(|_| invalid(py, format!("groups[{g}] must be a list")))?;
            let mut samples = Vec::with_capacity(group.len());
            for (s, sample) in group.iter().enumerate() {
                let d = sample
                    .cast_into::<PyDict>()
                    .map_err(|_| invalid(py, format!("groups[{g}][{s}] must be a dict")))?;
                samples.push(sample_from(&d, &format!("groups[{g}][{s}]"), k)?);
            }
            out.push(samples);
        }
        self.inner.add_samples(out).map_err(|e| to_py(py, e))
    }

    /// save(path): the state, including the buffer, written atomically.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.inner.save(&path)).map_err(|e| to_py(py, e))
    }

    /// load(path, *, check=None): restores a saved state (errors for a missing, damaged or
    /// foreign file). ``check``, when given, is called with the saved buffer's payload heads
    /// (as ``buffer_payload_heads(1)`` gives them) before anything is applied; what it raises
    /// is raised, and the data source is left as it was.
    #[pyo3(signature = (path, *, check=None))]
    fn load(&mut self, py: Python<'_>, path: PathBuf, check: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let mut raised: Option<PyErr> = None;
        let result = self.inner.load_checked(&path, |buffer| {
            let Some(check) = &check else { return Ok(()) };
            let called = payload_heads(py, buffer, 1).and_then(|heads| check.call1((heads,)));
            called.map(drop).map_err(|e| {
                raised = Some(e);
                stowplan::Error::InvalidArgument("the load check refused the state".into())
            })
        });
        match (result, raised) {
            (_, Some(e)) => Err(e),
            (r, None) => r.map_err(|e| to_py(py, e)),
        }
    }

    /// The metadata as JSON text.
    fn metadata_json(&self) -> String {
        serde_json::Value::Object(self.inner.metadata().clone()).to_string()
    }

    /// update_metadata_json(text): merges a JSON object into the metadata.
    fn update_metadata_json(&mut self, py: Python<'_>, text: &str) -> PyResult<()> {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(m)) => {
                self.inner.update_metadata(m);
                Ok(())
            }
            _ => Err(invalid(py, "metadata must be a JSON-serializable dict".to_string())),
        }
    }

    /// buffer_payload_heads(n) -> list of groups of bytes: the first ``n`` bytes of every
    /// buffered sample's payload (how ``stowplan._source`` tells the encodings apart without
    /// decoding anything).
    fn buffer_payload_heads<'py>(&self, py: Python<'py>, n: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        payload_heads(py, self.inner.buffer(), int(n, "n", 0, u64::MAX.into())?)
    }

    /// Groups in the buffer.
    #[getter]
    fn buffer_len(&self) -> usize {
        self.inner.buffer_len()
    }

    /// The current epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.inner.epoch()
    }

    /// Prompts of the current epoch already drawn.
    #[getter]
    fn offset(&self) -> u64 {
        self.inner.offset()
    }

    /// The global index of the next sample drawn from the dataset.
    #[getter]
    fn next_index(&self) -> u64 {
        self.inner.next_index()
    }

    /// The dataset identity checked by load.
    #[getter]
    fn identity(&self) -> String {
        self.inner.identity().to_string()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// The identity of in-memory records when none is given.
const RECORDS: &str = "records";

/// Data source options from the arguments (omitted: `DataSourceOptions::new`'s defaults).
fn options<'py>(
    n_samples_per_prompt: &Bound<'py, PyAny>,
    shuffle: Option<bool>,
    seed: Option<&Bound<'py, PyAny>>,
    input_key: Option<String>,
    label_key: Nullable<'py>,
    metadata_key: Nullable<'py>,
) -> PyResult<DataSourceOptions> {
    let d = DataSourceOptions::new(u32_arg(n_samples_per_prompt, "n_samples_per_prompt", 1)?);
    Ok(DataSourceOptions {
        shuffle: shuffle.unwrap_or(d.shuffle),
        seed: opt_u64(seed, "seed", 0)?.unwrap_or(d.seed),
        input_key: input_key.unwrap_or(d.input_key),
        label_key: label_key.resolve(d.label_key, |k| k.extract::<String>())?,
        metadata_key: metadata_key.resolve(d.metadata_key, |k| k.extract::<String>())?,
        n_samples_per_prompt: d.n_samples_per_prompt,
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDataSource>()
}

/// The first `n` bytes of every sample's payload in `buffer`, group by group.
fn payload_heads<'py>(py: Python<'py>, buffer: &[stowplan::source::Group], n: usize) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for g in buffer {
        let heads: Vec<Bound<'py, PyBytes>> =
            g.iter().map(|s| PyBytes::new(py, &s.payload[..n.min(s.payload.len())])).collect();
        out.append(PyList::new(py, heads)?)?;
    }
    Ok(out)
}
