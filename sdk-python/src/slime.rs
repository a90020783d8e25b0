//! slime's micro-batch scheduling for Python (`stowplan.compat.slime`): thin conversions
//! around the host's [`stowplan::kernel::SlimeApi`]; the algorithms live in the kernel.
//!
//! Failures: slime's `AssertionError`s as `AssertionError` with slime's message; arguments
//! outside what slime handles as `InvalidArgumentError`; a model attribute slime would read
//! and `args` lacks as `AttributeError(name)` (the Python layer then reads the attribute
//! itself, so the caller sees the genuine error).

use pyo3::exceptions::{PyAssertionError, PyAttributeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyInt, PyList, PyTuple};
use stowplan::peers::slime::{Arg, Flops, FlopsArgs, LayerFreq, PythonSum, ScheduleArgs, SlimeError};

use crate::{BackendArg, int, int_vec, invalid, kernel, repr, to_py};

const I64: (i128, i128) = (i64::MIN as i128, i64::MAX as i128);

fn slime_err(py: Python<'_>, e: SlimeError) -> PyErr {
    match e {
        SlimeError::AssertionError(m) => PyAssertionError::new_err(m),
        SlimeError::InvalidArgument(m) => invalid(py, m),
        SlimeError::MissingAttribute(name) => PyAttributeError::new_err(name),
    }
}

/// One model attribute from the dict the Python layer built (absent key: missing).
fn arg(d: &Bound<'_, PyDict>, name: &str) -> PyResult<Arg> {
    match d.get_item(name)? {
        None => Ok(Arg::Missing),
        Some(v) if v.is_none() => Ok(Arg::None),
        Some(v) => int(&v, &format!("args.{name}"), I64.0, I64.1).map(Arg::Int),
    }
}

/// The attributes `calculate_fwd_flops` reads, from a dict of those `args` has.
fn flops_args(d: &Bound<'_, PyDict>) -> PyResult<FlopsArgs> {
    let py = d.py();
    let moe_layer_freq = match d.get_item("moe_layer_freq")? {
        None => LayerFreq::Missing,
        Some(v) if v.is_instance_of::<PyList>() => {
            LayerFreq::Pattern(int_vec::<i64>(&v, "args.moe_layer_freq", I64.0, I64.1)?)
        }
        Some(v) if v.is_instance_of::<PyInt>() || v.hasattr("__index__")? => {
            LayerFreq::Every(int(&v, "args.moe_layer_freq", I64.0, I64.1)?)
        }
        Some(v) => {
            return Err(invalid(
                py,
                format!("args.moe_layer_freq must be an int or a list of ints (got {})", repr(&v)),
            ));
        }
    };
    let mla = match d.get_item("multi_latent_attention")? {
        None => false,
        Some(v) => v.is_truthy()?,
    };
    Ok(FlopsArgs {
        hidden_size: arg(d, "hidden_size")?,
        num_attention_heads: arg(d, "num_attention_heads")?,
        num_query_groups: arg(d, "num_query_groups")?,
        vocab_size: arg(d, "vocab_size")?,
        ffn_hidden_size: arg(d, "ffn_hidden_size")?,
        num_experts: arg(d, "num_experts")?,
        num_layers: arg(d, "num_layers")?,
        kv_channels: arg(d, "kv_channels")?,
        moe_ffn_hidden_size: arg(d, "moe_ffn_hidden_size")?,
        moe_router_topk: arg(d, "moe_router_topk")?,
        moe_shared_expert_intermediate_size: arg(d, "moe_shared_expert_intermediate_size")?,
        moe_layer_freq,
        multi_latent_attention: mla,
        q_lora_rank: arg(d, "q_lora_rank")?,
        kv_lora_rank: arg(d, "kv_lora_rank")?,
        qk_head_dim: arg(d, "qk_head_dim")?,
        qk_pos_emb_head_dim: arg(d, "qk_pos_emb_head_dim")?,
        v_head_dim: arg(d, "v_head_dim")?,
    })
}

/// slime_first_fit_pack(total_lengths, max_tokens_per_bin, *, backend=None) -> list[list[int]]:
/// slime's ``first_fit_pack`` (input order, no sorting; bins in creation order).
#[pyfunction]
#[pyo3(signature = (total_lengths, max_tokens_per_bin, *, backend=None))]
fn slime_first_fit_pack<'py>(
    py: Python<'py>,
    total_lengths: &Bound<'py, PyAny>,
    max_tokens_per_bin: &Bound<'py, PyAny>,
    backend: Option<BackendArg>,
) -> PyResult<Bound<'py, PyList>> {
    let lengths: Vec<i64> = int_vec(total_lengths, "total_lengths", I64.0, I64.1)?;
    let cap: i64 = int(max_tokens_per_bin, "max_tokens_per_bin", I64.0, I64.1)?;
    let kernel = kernel(py, backend)?;
    let bins = py.detach(|| kernel.slime().first_fit_pack(&lengths, cap)).map_err(|e| to_py(py, e))?;
    PyList::new(py, bins)
}

/// slime_expand_bins(bins, target_count, lengths, *, backend=None) -> list[list[int]]: the
/// bins after slime's ``expand_bins_by_splitting`` (which works in place).
#[pyfunction]
#[pyo3(signature = (bins, target_count, lengths, *, backend=None))]
fn slime_expand_bins<'py>(
    py: Python<'py>,
    bins: &Bound<'py, PyAny>,
    target_count: &Bound<'py, PyAny>,
    lengths: &Bound<'py, PyAny>,
    backend: Option<BackendArg>,
) -> PyResult<Bound<'py, PyList>> {
    let mut groups: Vec<Vec<u32>> = Vec::new();
    for (i, b) in bins.try_iter()?.enumerate() {
        groups.push(int_vec::<u32>(&b?, &format!("bins[{i}]"), 0, u32::MAX.into())?);
    }
    let target: i64 = int(target_count, "target_count", I64.0, I64.1)?;
    let lengths: Vec<i64> = int_vec(lengths, "lengths", I64.0, I64.1)?;
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.slime().expand_bins_by_splitting(&groups, target, &lengths)).map_err(|e| to_py(py, e))? {
        Ok(out) => PyList::new(py, out),
        Err(e) => Err(slime_err(py, e)),
    }
}

/// slime_balanced_partitions(weights, k_partitions, equal_size, *, backend=None) ->
/// list[list[int]]: slime's ``get_seqlen_balanced_partitions`` on float weights (FLOPs).
#[pyfunction]
#[pyo3(signature = (weights, k_partitions, equal_size, *, backend=None))]
fn slime_balanced_partitions<'py>(
    py: Python<'py>,
    weights: &Bound<'py, PyAny>,
    k_partitions: &Bound<'py, PyAny>,
    equal_size: bool,
    backend: Option<BackendArg>,
) -> PyResult<Bound<'py, PyList>> {
    let mut w: Vec<f64> = Vec::new();
    for (i, x) in weights.try_iter()?.enumerate() {
        let x = x?;
        if !(x.is_instance_of::<PyFloat>() || x.is_instance_of::<PyInt>()) || crate::is_bool(&x) {
            return Err(invalid(py, format!("seqlen_list[{i}] must be a number (got {})", repr(&x))));
        }
        w.push(x.extract::<f64>()?);
    }
    let k: u32 = int(k_partitions, "k_partitions", 0, u32::MAX.into())?;
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.slime().get_seqlen_balanced_partitions(&w, k, equal_size)).map_err(|e| to_py(py, e))? {
        Ok(out) => PyList::new(py, out),
        Err(e) => Err(slime_err(py, e)),
    }
}

fn flops_to_py(py: Python<'_>, f: Flops) -> PyResult<Py<PyAny>> {
    Ok(match f {
        Flops::Float(x) => PyFloat::new(py, x).into_any().unbind(),
        Flops::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
    })
}

/// slime_fwd_flops(seqlens, model, *, backend=None) -> float | int: slime's
/// ``calculate_fwd_flops(seqlens, args)``, with ``model`` a dict of the attributes ``args``
/// has (absent keys are missing attributes).
#[pyfunction]
#[pyo3(signature = (seqlens, model, *, backend=None))]
fn slime_fwd_flops<'py>(
    py: Python<'py>,
    seqlens: &Bound<'py, PyAny>,
    model: &Bound<'py, PyDict>,
    backend: Option<BackendArg>,
) -> PyResult<Py<PyAny>> {
    let seqlens: Vec<u64> = int_vec(seqlens, "seqlens", 0, i64::MAX.into())?;
    let args = flops_args(model)?;
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.slime().calculate_fwd_flops(&seqlens, &args)).map_err(|e| to_py(py, e))? {
        Ok(f) => flops_to_py(py, f),
        Err(e) => Err(slime_err(py, e)),
    }
}

/// slime_build_dp_schedule(total_lengths, rollout_ids, model, *, micro_batch_size,
/// use_dynamic_batch_size, max_tokens_per_gpu, balance_data, balance_by_flops, dp_size,
/// cp_size, vpp_size, microbatch_group_size_per_vp_stage, global_batch_size, python_sum,
/// backend=None) -> (partitions, micro_batch_sizes, num_microbatches, num_steps): slime's
/// ``build_dp_schedule``; ``rollout_ids`` are integers (the Python layer numbers slime's
/// rollout ids by first occurrence), ``python_sum`` ``"naive"`` or ``"neumaier"``.
#[pyfunction]
#[pyo3(signature = (
    total_lengths, rollout_ids, model, *, micro_batch_size, use_dynamic_batch_size, max_tokens_per_gpu,
    balance_data, balance_by_flops, dp_size, cp_size, vpp_size, microbatch_group_size_per_vp_stage,
    global_batch_size, python_sum, backend=None
))]
#[allow(clippy::too_many_arguments)]
fn slime_build_dp_schedule<'py>(
    py: Python<'py>,
    total_lengths: &Bound<'py, PyAny>,
    rollout_ids: &Bound<'py, PyAny>,
    model: &Bound<'py, PyDict>,
    micro_batch_size: Option<&Bound<'py, PyAny>>,
    use_dynamic_batch_size: bool,
    max_tokens_per_gpu: Option<&Bound<'py, PyAny>>,
    balance_data: bool,
    balance_by_flops: bool,
    dp_size: &Bound<'py, PyAny>,
    cp_size: &Bound<'py, PyAny>,
    vpp_size: &Bound<'py, PyAny>,
    microbatch_group_size_per_vp_stage: &Bound<'py, PyAny>,
    global_batch_size: &Bound<'py, PyAny>,
    python_sum: &str,
    backend: Option<BackendArg>,
) -> PyResult<Bound<'py, PyTuple>> {
    let lengths: Vec<i64> = int_vec(total_lengths, "total_lengths", 0, I64.1)?;
    let rids: Vec<i64> = int_vec(rollout_ids, "rollout_indices", I64.0, I64.1)?;
    let opt = |o: Option<&Bound<'py, PyAny>>, name: &str| -> PyResult<Option<i64>> {
        o.filter(|v| !v.is_none()).map(|v| int(v, name, I64.0, I64.1)).transpose()
    };
    let a = ScheduleArgs {
        micro_batch_size: opt(micro_batch_size, "args.micro_batch_size")?,
        use_dynamic_batch_size,
        max_tokens_per_gpu: opt(max_tokens_per_gpu, "args.max_tokens_per_gpu")?,
        balance_data,
        balance_by_flops,
        dp_size: int(dp_size, "train_parallel_config['dp_size']", I64.0, I64.1)?,
        cp_size: int(cp_size, "train_parallel_config['cp_size']", I64.0, I64.1)?,
        vpp_size: int(vpp_size, "train_parallel_config['vpp_size']", I64.0, I64.1)?,
        microbatch_group_size_per_vp_stage: int(
            microbatch_group_size_per_vp_stage,
            "train_parallel_config['microbatch_group_size_per_vp_stage']",
            I64.0,
            I64.1,
        )?,
        global_batch_size: int(global_batch_size, "global_batch_size", I64.0, I64.1)?,
        python_sum: match python_sum {
            "naive" => PythonSum::Naive,
            "neumaier" => PythonSum::Neumaier,
            other => return Err(invalid(py, format!("python_sum must be 'naive' or 'neumaier' (got {other:?})"))),
        },
    };
    let m = flops_args(model)?;
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.slime().build_dp_schedule(&a, &m, &lengths, &rids)).map_err(|e| to_py(py, e))? {
        Ok(s) => PyTuple::new(
            py,
            [
                PyList::new(py, s.partitions)?.into_any(),
                PyList::new(py, s.micro_batch_sizes)?.into_any(),
                PyList::new(py, s.num_microbatches)?.into_any(),
                s.num_steps.into_pyobject(py)?.into_any(),
            ],
        ),
        Err(e) => Err(slime_err(py, e)),
    }
}

/// Adds the slime functions to the extension module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(slime_first_fit_pack, m)?)?;
    m.add_function(wrap_pyfunction!(slime_expand_bins, m)?)?;
    m.add_function(wrap_pyfunction!(slime_balanced_partitions, m)?)?;
    m.add_function(wrap_pyfunction!(slime_fwd_flops, m)?)?;
    m.add_function(wrap_pyfunction!(slime_build_dp_schedule, m)?)?;
    Ok(())
}
