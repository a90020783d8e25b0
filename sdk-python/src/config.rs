//! The packing keys of a training configuration for Python: `PackingConfig`, the host's
//! `stowplan::PackingConfig` (validation, defaults and batch arithmetic live there).

use std::hash::{Hash, Hasher};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use stowplan::{PackingConfig, plan::config::EffectiveBatch};

use crate::convert::int;
use crate::errors::{invalid, to_py};
use crate::plan::{plan_logger, world};
use crate::results::reduce;

/// The packing keys of a training configuration, validated (defaults applied).
///
/// Build with :meth:`from_dict`; every invalid key raises :class:`stowplan.ConfigError`
/// naming it. ``gradient_accumulation_steps`` and ``per_device_train_batch_size`` are the
/// values to train with (batch size forced to 1 by packing). Frozen and hashable, compared by
/// its values, picklable (the resolved values only, not the trainer configuration);
/// :meth:`to_dict` gives every attribute.
#[pyclass(frozen, module = "stowplan._stowplan", name = "PackingConfig")]
#[derive(Debug)]
pub struct PyPackingConfig {
    config: PackingConfig,
}

impl PyPackingConfig {
    /// `message` logged at `level` on the plans' logger.
    fn log(py: Python<'_>, level: &str, message: &str) -> PyResult<()> {
        plan_logger(py)?.call_method1(level, ("%s", message))?;
        Ok(())
    }

    fn batch(&self) -> &EffectiveBatch {
        &self.config.batch
    }
}

#[pymethods]
impl PyPackingConfig {
    /// Validates ``config`` (``{"training": {...}, "template": {"max_length": N}, ...}``) for
    /// ``world_size`` ranks and logs the requested vs realized packs per step (logger
    /// ``stowplan.plan``, INFO).
    ///
    /// ``config`` is a trainer configuration as a dict (JSON-serializable). The keys read
    /// (anything else is ignored; a section may be missing or ``None``):
    ///
    /// ===============================================  ========  ============  ====================================================
    /// key                                              type      default       meaning (attribute of the result)
    /// ===============================================  ========  ============  ====================================================
    /// ``training.packing``                             bool      ``False``     pack the train split (``packing``)
    /// ``training.packing_mode``                        str       ``"static"``  ``"static"`` only; ``"dynamic"`` is refused when
    ///                                                                          packing is on (``packing_mode``)
    /// ``training.eval_packing``                        bool      ``packing``   pack the eval split too (``eval_packing``)
    /// ``training.packing_allow_single_long``           bool      ``False``     a sample of length >= the packing length gets a pack
    ///                                                                          of its own; else it is dropped and listed
    ///                                                                          (``allow_single_long``)
    /// ``training.packing_align``                       int >= 1  1             round every length up to a multiple of this
    ///                                                                          (``align``)
    /// ``training.dataloader_drop_last``                bool      ``False``     drop the last ``packs mod world_size`` packs of the
    ///                                                                          train plan instead of repeating the first ones
    ///                                                                          (``dataloader_drop_last``; eval never drops)
    /// ``training.packing_wait_timeout_s``              int >= 0  7200          seconds ranks > 0 wait for rank 0's length cache;
    ///                                                                          0 waits forever (``wait_timeout_s``)
    /// ``training.packing_length_cache_persist_every``  int >= 1  adaptive      flush the length cache every this many lengths;
    ///                                                                          adaptive: about 1 % of the samples, 1,024..262,144
    ///                                                                          (``persist_every``, ``None`` = adaptive)
    /// ``training.packing_length_precompute_workers``   int >= 1  8             processes computing lengths; 1 = serial
    ///                                                                          (``precompute_workers``)
    /// ``training.per_device_train_batch_size``         int >= 1  1             as configured; packing trains one pack per device
    ///                                                                          and step, so it becomes 1 and its factor moves
    ///                                                                          into the accumulation steps
    /// ``training.gradient_accumulation_steps``         int >= 1  1             as configured; with packing and no
    ///                                                                          ``effective_batch_size`` the result's is
    ///                                                                          ``per_device_train_batch_size × this``
    /// ``training.effective_batch_size``                int >= 1  none          packs per optimizer step over all ranks; must be a
    ///                                                                          multiple of ``world_size`` (× the per-device batch
    ///                                                                          without packing); with packing, accumulation
    ///                                                                          steps = ``effective_batch_size / world_size``
    /// ``template.max_length``                          int >= 1  none          the packing length (``capacity``; the key used
    ///                                                                          is ``capacity_key``); required when packing
    ///                                                                          or eval packing is on
    /// ``model.max_model_len``                          int >= 1  none          the packing length when ``template.max_length`` is
    ///                                                                          unset
    /// ``training_args.max_model_len``                  int >= 1  none          the packing length when neither of the above is set
    /// ``custom.train_jsonl``                           str       none          the dataset's identity for the length cache
    ///                                                                          (``dataset_source``)
    /// ``custom.fusion_config``                         any       none          refused with packing or eval packing on (mixing
    ///                                                                          schedules resample every epoch); else the identity
    /// ===============================================  ========  ============  ====================================================
    ///
    /// Refused with a :class:`stowplan.ConfigError` naming the key: a value of the wrong
    /// type or out of range, ``training.packing_length`` (deprecated: set
    /// ``template.max_length``), and any other ``training`` key starting with ``packing``
    /// or ``eval_packing`` (a typo there would silently change the plan). The result's
    /// ``world_size``, ``per_device_train_batch_size``, ``gradient_accumulation_steps``,
    /// ``requested_packs_per_step``, ``configured_packs_per_step``,
    /// ``realized_packs_per_step`` and ``batch_report`` are the batch arithmetic to train
    /// with.
    ///
    /// >>> c = PackingConfig.from_dict({"training": {"packing": True, "per_device_train_batch_size": 4,
    /// ...     "gradient_accumulation_steps": 2}, "template": {"max_length": 16384}}, world_size=8)
    /// >>> c.capacity, c.per_device_train_batch_size, c.gradient_accumulation_steps, c.eval_packing
    /// (16384, 1, 8, True)
    #[staticmethod]
    #[pyo3(signature = (config, *, world_size))]
    fn from_dict(py: Python<'_>, config: &Bound<'_, PyAny>, world_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        let text: String = match py.import("json")?.call_method1("dumps", (config,)) {
            Ok(text) => text.extract()?,
            Err(e) if e.is_instance_of::<PyTypeError>(py) || e.is_instance_of::<PyValueError>(py) => {
                return Err(invalid(py, format!("config must be JSON-serializable: {}", e.value(py))));
            }
            Err(e) => return Err(e),
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| invalid(py, format!("config is not valid JSON: {e}")))?;
        let config = PackingConfig::from_json(&value, world(world_size)?).map_err(|e| to_py(py, e))?;
        let c = Self { config };
        Self::log(py, "info", &c.batch_report())?;
        Ok(c)
    }

    /// The configuration pickled by ``__reduce__`` (its resolved values as JSON).
    #[staticmethod]
    fn _from_state(py: Python<'_>, state: &str) -> PyResult<Self> {
        let config = serde_json::from_str(state)
            .map_err(|e| invalid(py, format!("PackingConfig: the pickled state is not a configuration: {e}")))?;
        Ok(Self { config })
    }

    /// Pickles as its resolved values (JSON).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let state = serde_json::to_string(&slf.get().config)
            .map_err(|e| invalid(slf.py(), format!("PackingConfig: encoding the state: {e}")))?;
        reduce(slf, (state,))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Self>().is_ok_and(|o| o.get().config == self.config)
    }

    fn __hash__(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.config.hash(&mut h);
        h.finish()
    }

    /// Every attribute, by name (what ``dataclasses.asdict`` gave when this was a dataclass).
    fn to_dict<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(slf.py());
        for name in ATTRIBUTES {
            d.set_item(name, slf.getattr(name)?)?;
        }
        Ok(d)
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let fields = ATTRIBUTES
            .iter()
            .map(|name| Ok(format!("{name}={}", slf.getattr(name)?.repr()?)))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(format!("PackingConfig({})", fields.join(", ")))
    }

    /// The partial-accumulation-window warning for an epoch of ``plan`` (a
    /// :class:`StaticPackPlan`), also logged at WARNING; ``None`` when windows are exact.
    fn accumulation_warning(&self, py: Python<'_>, plan: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        let per_rank: u64 = int(&plan.getattr("per_rank")?, "plan.per_rank", 0, u64::MAX.into())?;
        let w = self.batch().accumulation_warning(per_rank);
        if let Some(w) = &w {
            Self::log(py, "warning", w)?;
        }
        Ok(w)
    }

    /// ``training.packing``: pack the train split.
    #[getter]
    fn packing(&self) -> bool {
        self.config.packing
    }

    /// ``training.packing_mode``: ``"static"`` or ``"dynamic"``.
    #[getter]
    fn packing_mode(&self) -> String {
        // The host's own spelling (its serde name).
        match serde_json::to_value(self.config.packing_mode) {
            Ok(serde_json::Value::String(s)) => s,
            _ => String::new(),
        }
    }

    /// The per-pack token cap (``None`` only when neither train nor eval packing is on).
    #[getter]
    fn capacity(&self) -> Option<u64> {
        self.config.capacity
    }

    /// The key the capacity came from (e.g. ``"template.max_length"``).
    #[getter]
    fn capacity_key(&self) -> Option<&str> {
        self.config.capacity_key.as_deref()
    }

    /// The former name of :attr:`capacity` (deprecated: warns, for one release).
    #[getter]
    fn packing_length(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        crate::convert::warn_renamed(py, "PackingConfig", "packing_length", "capacity", false)?;
        Ok(self.config.capacity)
    }

    /// The former name of :attr:`capacity_key` (deprecated: warns, for one release).
    #[getter]
    fn packing_length_key(&self, py: Python<'_>) -> PyResult<Option<&str>> {
        crate::convert::warn_renamed(py, "PackingConfig", "packing_length_key", "capacity_key", false)?;
        Ok(self.config.capacity_key.as_deref())
    }

    /// ``training.packing_allow_single_long``.
    #[getter]
    fn allow_single_long(&self) -> bool {
        self.config.allow_single_long
    }

    /// ``training.packing_align``.
    #[getter]
    fn align(&self) -> u64 {
        self.config.align
    }

    /// ``training.dataloader_drop_last`` (train plan).
    #[getter]
    fn dataloader_drop_last(&self) -> bool {
        self.config.dataloader_drop_last
    }

    /// ``training.eval_packing``.
    #[getter]
    fn eval_packing(&self) -> bool {
        self.config.eval_packing
    }

    /// ``training.packing_wait_timeout_s``.
    #[getter]
    fn wait_timeout_s(&self) -> u64 {
        self.config.wait_timeout_s
    }

    /// ``training.packing_length_cache_persist_every`` (``None``: adaptive).
    #[getter]
    fn persist_every(&self) -> Option<u64> {
        self.config.persist_every
    }

    /// ``training.packing_length_precompute_workers``.
    #[getter]
    fn precompute_workers(&self) -> u32 {
        self.config.precompute_workers
    }

    /// The dataset's identity for the length cache.
    #[getter]
    fn dataset_source(&self) -> Option<&str> {
        self.config.dataset_source.as_deref()
    }

    /// Ranks.
    #[getter]
    fn world_size(&self) -> u32 {
        self.batch().world_size
    }

    /// The per-device batch size to train with (1 with packing).
    #[getter]
    fn per_device_train_batch_size(&self) -> u64 {
        self.batch().per_device_train_batch_size
    }

    /// The accumulation steps to train with.
    #[getter]
    fn gradient_accumulation_steps(&self) -> u64 {
        self.batch().gradient_accumulation_steps
    }

    /// ``training.effective_batch_size``, if given.
    #[getter]
    fn requested_packs_per_step(&self) -> Option<u64> {
        self.batch().requested_packs_per_step
    }

    /// Packs per optimizer step the configuration asked for.
    #[getter]
    fn configured_packs_per_step(&self) -> u64 {
        self.batch().configured_packs_per_step
    }

    /// Packs per optimizer step training will take.
    #[getter]
    fn realized_packs_per_step(&self) -> u64 {
        self.batch().realized_packs_per_step
    }

    /// The requested vs realized packs per step, as one line.
    #[getter]
    fn batch_report(&self) -> String {
        self.batch().report()
    }
}

/// The attributes, in the order `to_dict` and the repr give them.
const ATTRIBUTES: [&str; 19] = [
    "packing",
    "packing_mode",
    "capacity",
    "capacity_key",
    "allow_single_long",
    "align",
    "dataloader_drop_last",
    "eval_packing",
    "wait_timeout_s",
    "persist_every",
    "precompute_workers",
    "dataset_source",
    "world_size",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "requested_packs_per_step",
    "configured_packs_per_step",
    "realized_packs_per_step",
    "batch_report",
];

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPackingConfig>()
}
