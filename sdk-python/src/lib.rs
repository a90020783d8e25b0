//! `stowplan._stowplan`: the native layer of the Python SDK.
//!
//! Thin by design: it converts arguments (numpy arrays read as slices without copying, option
//! names parsed with the kernel's [`stowplan::Named`] spellings, integer ranges checked and named once,
//! here), calls the Rust host with the GIL released, and returns frozen result classes whose
//! getters hand out numpy arrays owning the Rust vectors (no copy). Options are keyword-only;
//! an omitted option (or `None`) means the host's default (`PackOptions::new`,
//! `PartitionOptions::default`, …), so no default is written twice. Errors become the
//! exception classes of `stowplan.errors`, imported once per process.

mod filter;
mod layout;
mod multi;
mod packer;
mod plan;
mod prime_rl;
mod slime;
mod source;
mod stream;

use std::str::FromStr;

use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{
    PyAssertionError, PyIndexError, PyMemoryError, PyOverflowError, PyTypeError, PyValueError, PyZeroDivisionError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PySlice, PyString, PyTuple, PyType};
use stowplan::{
    Backend, Cost, DpOptions, DpPlan, DpReorder, Error, FilterError, Kernel, MicroOptions, MicroPlan, MultiOptions,
    PackOptions, Packing, PartitionMethod, PartitionOptions, Partitioning, PyError, RollLoadBalanceOptions,
    RollMicroBatches, UnbalanceError, VerlFunction, VerlMicroOptions,
};

// ---------------------------------------------------------------------------------------------
// Errors: the classes of `stowplan.errors`, imported once.

/// An exception class of `stowplan.errors` (`Class::NAMES` in the same order).
#[derive(Clone, Copy, Debug)]
enum Class {
    InvalidArgument,
    Infeasible,
    KernelRuntime,
    Config,
    Io,
    CacheMismatch,
    Timeout,
    FilterTimeout,
    FilterOutOfFuel,
    FilterMemoryLimit,
    FilterTrap,
    FilterInvalidResult,
    FilterHashMismatch,
    FilterGuest,
    FilterLoad,
}

impl Class {
    const COUNT: usize = 15;
    const NAMES: [&'static str; Self::COUNT] = [
        "InvalidArgumentError",
        "InfeasibleError",
        "KernelRuntimeError",
        "ConfigError",
        "StowplanIOError",
        "CacheMismatchError",
        "StowplanTimeoutError",
        "FilterTimeoutError",
        "FilterOutOfFuelError",
        "FilterMemoryLimitError",
        "FilterTrapError",
        "FilterInvalidResultError",
        "FilterHashMismatchError",
        "FilterGuestError",
        "FilterLoadError",
    ];

    fn of(e: &Error) -> Self {
        match e {
            Error::InvalidArgument(_) => Class::InvalidArgument,
            Error::Infeasible(_) => Class::Infeasible,
            Error::Runtime(_) => Class::KernelRuntime,
            Error::Config(_) => Class::Config,
            Error::Io(_) => Class::Io,
            Error::CacheMismatch(_) => Class::CacheMismatch,
            Error::Timeout(_) => Class::Timeout,
            Error::Filter(f) => match f {
                FilterError::Timeout(_) => Class::FilterTimeout,
                FilterError::OutOfFuel(_) => Class::FilterOutOfFuel,
                FilterError::MemoryLimit(_) => Class::FilterMemoryLimit,
                FilterError::Trap(_) => Class::FilterTrap,
                FilterError::InvalidResult(_) => Class::FilterInvalidResult,
                FilterError::HashMismatch(_) => Class::FilterHashMismatch,
                FilterError::Guest(_) => Class::FilterGuest,
                FilterError::Load(_) => Class::FilterLoad,
            },
        }
    }

    /// The exception raising `message` as this class (the class is imported on first use
    /// and kept for the life of the process).
    fn err(self, py: Python<'_>, message: String) -> PyErr {
        static CLASSES: [PyOnceLock<Py<PyType>>; Class::COUNT] = [const { PyOnceLock::new() }; Class::COUNT];
        match CLASSES[self as usize].import(py, "stowplan.errors", Self::NAMES[self as usize]) {
            Ok(class) => PyErr::from_type(class.clone(), message),
            Err(e) => e,
        }
    }
}

/// The host's error as the matching `stowplan.errors` class.
pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    Class::of(&e).err(py, e.to_string())
}

/// `InvalidArgumentError(message)`.
pub(crate) fn invalid(py: Python<'_>, message: String) -> PyErr {
    Class::InvalidArgument.err(py, message)
}

/// A peer's exception (verl, ROLL) as the builtin class the peer raises.
fn peer_error(e: &PyError) -> PyErr {
    let m = e.message().to_string();
    match e {
        PyError::AssertionError(_) => PyAssertionError::new_err(m),
        PyError::IndexError(_) => PyIndexError::new_err(m),
        PyError::TypeError(_) => PyTypeError::new_err(m),
        PyError::ZeroDivisionError(_) => PyZeroDivisionError::new_err(m),
        PyError::MemoryError(_) => PyMemoryError::new_err(m),
        PyError::ValueError(_) => PyValueError::new_err(m),
    }
}

// ---------------------------------------------------------------------------------------------
// Arguments: converted and checked once, here; every message names the argument.

/// `2**64-1` for `u64::MAX` and the like: how a range bound reads in a message.
fn bound(v: i128) -> String {
    match v {
        v if v == i128::from(u64::MAX) => "2**64-1".into(),
        v if v == i128::from(u32::MAX) => "2**32-1".into(),
        v if v == i128::from(i64::MAX) => "2**63-1".into(),
        v if v == i128::from(i64::MIN) => "-2**63".into(),
        v => v.to_string(),
    }
}

/// `repr(obj)` for a message.
pub(crate) fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into())
}

/// Whether `obj` is a bool — Python's or numpy's (`numpy.bool`) — which no integer, length,
/// token id or number argument accepts (a bool is a flag, not a count).
pub(crate) fn is_bool(obj: &Bound<'_, PyAny>) -> bool {
    if obj.is_instance_of::<PyBool>() {
        return true;
    }
    if obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyFloat>() {
        return false;
    }
    let t = obj.get_type();
    t.module().is_ok_and(|m| m == *"numpy") && t.name().is_ok_and(|n| n == *"bool" || n == *"bool_")
}

/// `obj` as an exact integer: a Python int or anything with `__index__` (numpy and torch
/// integers), never a bool, a float (even a whole one) or a string. `None`: not an integer;
/// `Some(None)`: an integer outside the 128-bit range.
fn integer(obj: &Bound<'_, PyAny>) -> Option<Option<i128>> {
    if is_bool(obj) {
        return None;
    }
    match obj.extract::<i64>() {
        Ok(v) => Some(Some(v.into())),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Some(obj.extract::<i128>().ok()),
        Err(_) => None,
    }
}

/// `obj` as an integer in `low..=high` (see [`integer`]: a Python int or anything with
/// `__index__`; never a bool, a float or a string), else `InvalidArgumentError` naming
/// `name` and the range. Every integer argument of the SDK goes through here.
pub(crate) fn int<T: TryFrom<i128>>(obj: &Bound<'_, PyAny>, name: &str, low: i128, high: i128) -> PyResult<T> {
    let value = integer(obj);
    if let Some(Some(v)) = value
        && (low..=high).contains(&v)
        && let Ok(t) = T::try_from(v)
    {
        return Ok(t);
    }
    let what = if value.is_some() { "" } else { "an integer " };
    Err(invalid(obj.py(), format!("{name} must be {what}in {}..={} (got {})", bound(low), bound(high), repr(obj))))
}

/// The error for element `i` of `name` holding `v`, outside `low..=high`.
fn element_out_of_range(
    py: Python<'_>,
    name: &str,
    i: usize,
    v: impl std::fmt::Display,
    low: i128,
    high: i128,
) -> PyErr {
    invalid(py, format!("{name}[{i}] must be in {}..={} (got {v})", bound(low), bound(high)))
}

/// The Python side of the sequence conversions (`stowplan._convert`), which knows numpy
/// dtypes, `__array__` and DLPack; the native side checks the values.
#[derive(Clone, Copy, Debug)]
enum Convert {
    /// `as_integers`: an `int64`/`uint64` array or a list.
    Integers,
    /// `as_mask`: a `bool`, `int64` or `uint64` array, or a list.
    Mask,
    /// `as_numbers`: a `float64` array or a list.
    Numbers,
}

impl Convert {
    /// `stowplan._convert.<function>(values, name)` (the function imported once).
    fn call<'py>(self, values: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        static FUNCTIONS: [PyOnceLock<Py<PyAny>>; 3] = [const { PyOnceLock::new() }; 3];
        let function = match self {
            Convert::Integers => "as_integers",
            Convert::Mask => "as_mask",
            Convert::Numbers => "as_numbers",
        };
        FUNCTIONS[self as usize].import(values.py(), "stowplan._convert", function)?.call1((values, name))
    }
}

/// Integers in `low..=high` from what `as_integers` returns (or a list or tuple): an
/// `int64`/`uint64` array, checked value by value, or a sequence whose elements are checked
/// with [`int`] (errors name `name[i]`).
fn checked_ints<T: TryFrom<i128>>(seq: &Bound<'_, PyAny>, name: &str, low: i128, high: i128) -> PyResult<Vec<T>> {
    let py = seq.py();
    let from = |i: usize, v: i128| -> PyResult<T> {
        (low..=high)
            .contains(&v)
            .then(|| T::try_from(v).ok())
            .flatten()
            .ok_or_else(|| element_out_of_range(py, name, i, v, low, high))
    };
    if let Ok(a) = seq.cast::<PyArray1<i64>>() {
        return a.try_readonly()?.as_array().iter().enumerate().map(|(i, &v)| from(i, v.into())).collect();
    }
    if let Ok(a) = seq.cast::<PyArray1<u64>>() {
        return a.try_readonly()?.as_array().iter().enumerate().map(|(i, &v)| from(i, v.into())).collect();
    }
    let mut out = Vec::with_capacity(seq.len().unwrap_or(0));
    for (i, e) in seq.try_iter()?.enumerate() {
        let e = e?;
        match integer(&e) {
            Some(Some(v)) => out.push(from(i, v)?),
            _ => {
                return Err(int::<T>(&e, &format!("{name}[{i}]"), low, high)
                    .err()
                    .unwrap_or_else(|| invalid(py, name.into())));
            }
        }
    }
    Ok(out)
}

/// A one-dimensional sequence of integers in `low..=high`, exactly: a numpy array of `T`'s
/// own dtype is copied as is, a list or tuple is checked element by element ([`int`]), and
/// anything else (other dtypes, `__array__`, DLPack, iterables) goes through
/// `stowplan._convert.as_integers` first, which refuses float, bool and string arrays.
/// Errors are `InvalidArgumentError` naming `name` (or `name[i]`) and the range.
pub(crate) fn int_vec<T>(obj: &Bound<'_, PyAny>, name: &str, low: i128, high: i128) -> PyResult<Vec<T>>
where
    T: numpy::Element + Copy + TryFrom<i128> + Into<i128>,
{
    if let Ok(a) = obj.cast::<PyArray1<T>>() {
        let a = a.try_readonly()?;
        let a = a.as_array();
        if let Some((i, v)) = a.iter().enumerate().find(|(_, v)| !(low..=high).contains(&(**v).into())) {
            return Err(element_out_of_range(obj.py(), name, i, (*v).into(), low, high));
        }
        return Ok(a.to_vec());
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return checked_ints(obj, name, low, high);
    }
    checked_ints(&Convert::Integers.call(obj, name)?, name, low, high)
}

/// A loss mask: bools, or the integers 0 and 1 (a bool array, a list or tuple of bools or
/// 0/1, an integer array holding only 0 and 1, `__array__`, DLPack). Floats and other
/// integers are refused with `InvalidArgumentError` naming `name[i]`.
pub(crate) fn mask_vec(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<bool>> {
    if let Ok(a) = obj.cast::<PyArray1<bool>>() {
        return Ok(a.try_readonly()?.as_array().to_vec());
    }
    let converted;
    let seq = if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        obj
    } else {
        converted = Convert::Mask.call(obj, name)?;
        if let Ok(a) = converted.cast::<PyArray1<bool>>() {
            return Ok(a.try_readonly()?.as_array().to_vec());
        }
        &converted
    };
    let py = obj.py();
    let bad =
        |i: usize, v: String| invalid(py, format!("{name}[{i}] must be a bool (or the integer 0 or 1) (got {v})"));
    let bit = |i: usize, v: i128| match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(bad(i, v.to_string())),
    };
    if let Ok(a) = seq.cast::<PyArray1<i64>>() {
        return a.try_readonly()?.as_array().iter().enumerate().map(|(i, &v)| bit(i, v.into())).collect();
    }
    if let Ok(a) = seq.cast::<PyArray1<u64>>() {
        return a.try_readonly()?.as_array().iter().enumerate().map(|(i, &v)| bit(i, v.into())).collect();
    }
    let mut out = Vec::with_capacity(seq.len().unwrap_or(0));
    for (i, e) in seq.try_iter()?.enumerate() {
        let e = e?;
        out.push(match integer(&e) {
            _ if is_bool(&e) => e.is_truthy()?,
            Some(Some(v)) => bit(i, v)?,
            _ => return Err(bad(i, repr(&e))),
        });
    }
    Ok(out)
}

/// Numbers (ints or floats; never bools or strings) as `f32`: a float32/float64 array as
/// is, a list or tuple element by element ([`number`]), anything else through
/// `stowplan._convert.as_numbers`. Errors are `InvalidArgumentError` naming `name[i]`.
pub(crate) fn float_vec(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<f32>> {
    if let Ok(a) = obj.cast::<PyArray1<f32>>() {
        return Ok(a.try_readonly()?.as_array().to_vec());
    }
    if let Ok(a) = obj.cast::<PyArray1<f64>>() {
        return Ok(a.try_readonly()?.as_array().iter().map(|&x| x as f32).collect());
    }
    let converted;
    let seq = if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        obj
    } else {
        converted = Convert::Numbers.call(obj, name)?;
        if let Ok(a) = converted.cast::<PyArray1<f64>>() {
            return Ok(a.try_readonly()?.as_array().iter().map(|&x| x as f32).collect());
        }
        &converted
    };
    let mut out = Vec::with_capacity(seq.len().unwrap_or(0));
    for (i, e) in seq.try_iter()?.enumerate() {
        let e = e?;
        let v = if e.is_exact_instance_of::<PyFloat>() {
            e.extract::<f64>()?
        } else {
            number(&e, &format!("{name}[{i}]"), "a number")?
        };
        out.push(v as f32);
    }
    Ok(out)
}

/// _integer(value, name, low, high) -> int: ``value`` checked like every integer argument
/// of the native layer (an exact integer in ``low..=high``; never a bool, a float or a
/// string), for the Python layer; raises ``InvalidArgumentError`` naming ``name``.
#[pyfunction(name = "_integer")]
fn py_integer(value: &Bound<'_, PyAny>, name: &str, low: i128, high: i128) -> PyResult<i128> {
    int(value, name, low, high)
}

/// _integers(values, name, low, high) -> list[int]: a one-dimensional sequence (list,
/// tuple, numpy array, ``__array__``, DLPack) checked like every integer sequence of the
/// native layer, as Python ints; raises ``InvalidArgumentError`` naming ``name[i]``.
#[pyfunction(name = "_integers")]
fn py_integers(values: &Bound<'_, PyAny>, name: &str, low: i128, high: i128) -> PyResult<Vec<i128>> {
    if values.is_instance_of::<PyList>() || values.is_instance_of::<PyTuple>() {
        return checked_ints(values, name, low, high);
    }
    checked_ints(&Convert::Integers.call(values, name)?, name, low, high)
}

/// A `u32` argument `>= low`.
pub(crate) fn u32_arg(obj: &Bound<'_, PyAny>, name: &str, low: u32) -> PyResult<u32> {
    int(obj, name, low.into(), u32::MAX.into())
}

/// A `u64` argument `>= low`.
pub(crate) fn u64_arg(obj: &Bound<'_, PyAny>, name: &str, low: u64) -> PyResult<u64> {
    int(obj, name, low.into(), u64::MAX.into())
}

/// An optional `u32` argument `>= low` (`None` stays `None`: the host's default).
pub(crate) fn opt_u32(obj: Option<&Bound<'_, PyAny>>, name: &str, low: u32) -> PyResult<Option<u32>> {
    obj.map(|o| u32_arg(o, name, low)).transpose()
}

/// An optional `i64` argument of a peer function (the peers take any Python int; the kernel
/// models them in 64 bits).
pub(crate) fn opt_i64(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<i64>> {
    obj.map(|o| int(o, name, i64::MIN.into(), i64::MAX.into())).transpose()
}

/// An optional `u64` argument `>= low`.
pub(crate) fn opt_u64(obj: Option<&Bound<'_, PyAny>>, name: &str, low: u64) -> PyResult<Option<u64>> {
    obj.map(|o| u64_arg(o, name, low)).transpose()
}

/// A number (int or float, not a bool or a string), else `InvalidArgumentError` naming
/// `name` and `what` it is (e.g. "a number of seconds").
pub(crate) fn number(obj: &Bound<'_, PyAny>, name: &str, what: &str) -> PyResult<f64> {
    let value = if is_bool(obj) || obj.is_instance_of::<PyString>() { None } else { obj.extract::<f64>().ok() };
    value.ok_or_else(|| invalid(obj.py(), format!("{name} must be {what} (got {})", repr(obj))))
}

/// An argument whose `None` has a meaning of its own (no key, no bound), so only an omitted
/// argument means the host's default: `#[pyo3(signature = (…, name = Nullable::Omitted))]`.
#[derive(Debug)]
pub(crate) enum Nullable<'py> {
    /// Not passed: the host's default.
    Omitted,
    /// Passed (possibly `None`).
    Given(Bound<'py, PyAny>),
}

impl<'a, 'py> FromPyObject<'a, 'py> for Nullable<'py> {
    type Error = std::convert::Infallible;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self, Self::Error> {
        Ok(Nullable::Given(obj.to_owned()))
    }
}

impl<'py> Nullable<'py> {
    /// `default` when omitted, `None` for `None`, else `convert(value)`.
    pub(crate) fn resolve<T>(
        self,
        default: Option<T>,
        convert: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
    ) -> PyResult<Option<T>> {
        match self {
            Nullable::Omitted => Ok(default),
            Nullable::Given(v) if v.is_none() => Ok(None),
            Nullable::Given(v) => convert(&v).map(Some),
        }
    }
}

/// An option name parsed with the host's spelling (`FromStr` of the kernel's [`stowplan::Named`]
/// enums and [`Backend`]): the error names the option and every allowed value.
pub(crate) fn parse<T>(py: Python<'_>, name: &str) -> PyResult<T>
where
    T: FromStr,
    T::Err: Into<Error>,
{
    name.parse::<T>().map_err(|e| to_py(py, e.into()))
}

/// An optional string argument named `name`: `None` stays `None`; anything but a `str` is an
/// `InvalidArgumentError` naming the argument (pyo3's own error named neither).
pub(crate) fn opt_str(value: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<String>> {
    let Some(v) = value else { return Ok(None) };
    match v.cast::<PyString>() {
        Ok(s) => Ok(Some(s.to_cow()?.into_owned())),
        Err(_) => {
            let got = v.get_type().name().map_or_else(|_| "?".to_string(), |n| n.to_string());
            Err(invalid(v.py(), format!("{name} must be a string or None (got {got})")))
        }
    }
}

/// Turns optional string arguments (`Option<&Bound<PyAny>>`) into `Option<&str>` of the same
/// names, refusing other types with an error naming the argument ([`opt_str`]).
macro_rules! str_options {
    ($($name:ident),+) => {
        $(
            let $name = $crate::opt_str($name, stringify!($name))?;
            let $name = $name.as_deref();
        )+
    };
}
pub(crate) use str_options;

/// An optional option name (`None`: the host's default, which the caller supplies).
pub(crate) fn opt_parse<T>(py: Python<'_>, name: Option<&str>) -> PyResult<Option<T>>
where
    T: FromStr,
    T::Err: Into<Error>,
{
    name.map(|n| parse(py, n)).transpose()
}

/// A cost: a preset name (the kernel's `Cost` spelling, `tokens` or `attention`) or a
/// `(linear, quadratic)` pair of integers; `None` stays `None` (the host's default cost).
pub(crate) fn cost_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Cost>> {
    let Some(obj) = obj else { return Ok(None) };
    let py = obj.py();
    if let Ok(s) = obj.cast::<PyString>() {
        return parse::<Cost>(py, &s.to_cow()?).map(Some);
    }
    let pair: Option<Vec<Bound<'_, PyAny>>> = obj.try_iter().ok().and_then(|it| it.collect::<PyResult<Vec<_>>>().ok());
    match pair.as_deref() {
        Some([linear, quadratic]) => Ok(Some(Cost {
            linear: u64_arg(linear, "cost linear coefficient", 0)?,
            quadratic: u64_arg(quadratic, "cost quadratic coefficient", 0)?,
        })),
        _ => Err(invalid(
            py,
            format!("cost must be {} or a (linear, quadratic) pair of integers (got {})", preset_names(), repr(obj)),
        )),
    }
}

/// `'tokens' or 'attention'`: the kernel's cost presets.
fn preset_names() -> String {
    let names: Vec<String> = stowplan::COST_PRESETS.iter().map(|(n, _)| format!("'{n}'")).collect();
    names.join(" or ")
}

/// The kernel on `backend` (`None`: the host's default backend).
pub(crate) fn kernel<'a>(py: Python<'_>, backend: impl Into<Option<&'a str>>) -> PyResult<Kernel> {
    let backend = opt_parse::<Backend>(py, backend.into())?.unwrap_or_default();
    // Compiling the component (first call in a process) happens without the GIL.
    py.detach(|| Kernel::new(backend)).map_err(|e| to_py(py, e))
}

/// Lengths/weights as a numpy array read in place: `uint64`, or `int64` checked non-negative
/// and read as `uint64` (same size and alignment), both without copying. Lists and tuples
/// are checked element by element ([`int`]) into a new `uint64` array; anything else (other
/// dtypes, `__array__`, DLPack, non-contiguous arrays, iterables) goes through
/// `stowplan._convert.as_integers` first, which refuses float, bool and string arrays.
pub(crate) enum Lengths<'py> {
    U64(PyReadonlyArray1<'py, u64>),
    I64(PyReadonlyArray1<'py, i64>),
}

impl<'py> Lengths<'py> {
    pub(crate) fn extract(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
        if let Some(l) = Self::borrow(obj, name)? {
            return Ok(l);
        }
        let converted;
        let seq = if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
            obj
        } else {
            converted = Convert::Integers.call(obj, name)?;
            if let Some(l) = Self::borrow(&converted, name)? {
                return Ok(l);
            }
            &converted
        };
        let values: Vec<u64> = checked_ints(seq, name, 0, u64::MAX.into())?;
        Ok(Lengths::U64(values.into_pyarray(obj.py()).try_readonly()?))
    }

    /// A contiguous `uint64`/`int64` array read in place (`int64` checked non-negative).
    fn borrow(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Self>> {
        if let Ok(a) = obj.cast::<PyArray1<u64>>()
            && a.is_c_contiguous()
        {
            return Ok(Some(Lengths::U64(a.try_readonly()?)));
        }
        if let Ok(a) = obj.cast::<PyArray1<i64>>()
            && a.is_c_contiguous()
        {
            let a = a.try_readonly()?;
            let s = a.as_slice().map_err(|e| invalid(obj.py(), format!("{name}: {e}")))?;
            if let Some((i, v)) = s.iter().enumerate().find(|(_, v)| **v < 0) {
                return Err(element_out_of_range(obj.py(), name, i, v, 0, u64::MAX.into()));
            }
            return Ok(Some(Lengths::I64(a)));
        }
        Ok(None)
    }

    pub(crate) fn slice(&self) -> &[u64] {
        match self {
            Lengths::U64(a) => a.as_slice().unwrap_or(&[]),
            Lengths::I64(a) => {
                let s = a.as_slice().unwrap_or(&[]);
                // SAFETY: i64 and u64 have the same size and alignment, and every value was
                // checked non-negative in `borrow`, so each reads as the same number.
                unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u64>(), s.len()) }
            }
        }
    }

    /// The numpy array read.
    pub(crate) fn array(&self) -> Bound<'py, PyAny> {
        match self {
            Lengths::U64(a) => a.as_any().clone(),
            Lengths::I64(a) => a.as_any().clone(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Results: helpers.

/// A list built on first access and then kept (a frozen class's lazy attribute).
pub(crate) struct LazyList(PyOnceLock<Py<PyList>>);

/// `InvalidArgumentError` unless `offsets` are the boundaries of groups over `len` entries
/// (from 0, never decreasing, ending at `len`) and each of `parallel` has one entry per group:
/// what an unpickled result must hold before it is used.
fn check_state(
    py: Python<'_>,
    what: &str,
    offsets: &Py<PyArray1<u32>>,
    len: usize,
    parallel: &[usize],
) -> PyResult<()> {
    let o: Vec<u32> = offsets.bind(py).to_vec()?;
    let ok = o.first() == Some(&0)
        && o.windows(2).all(|w| w[0] <= w[1])
        && o.last().map(|&l| l as usize) == Some(len)
        && parallel.iter().all(|&p| p + 1 == o.len());
    if !ok {
        return Err(invalid(
            py,
            format!("{what}: the pickled state is inconsistent (offsets, members and per-group arrays disagree)"),
        ));
    }
    Ok(())
}

/// `(type(obj)._from_state, state)`: what `__reduce__` returns for a result class, so pickle
/// rebuilds it from its own fields.
pub(crate) fn reduce<'py, T: pyo3::PyClass>(
    obj: &Bound<'py, T>,
    state: impl IntoPyObject<'py>,
) -> PyResult<Bound<'py, PyTuple>> {
    reduce_by(obj, "_from_state", state)
}

/// `(type(obj).<rebuild>, args)`: what `__reduce__` returns for a class that pickle rebuilds by
/// calling its static method `rebuild` with `args` (a tuple).
pub(crate) fn reduce_by<'py, T: pyo3::PyClass>(
    obj: &Bound<'py, T>,
    rebuild: &str,
    args: impl IntoPyObject<'py>,
) -> PyResult<Bound<'py, PyTuple>> {
    use pyo3::BoundObject;
    let py = obj.py();
    let method = obj.as_any().get_type().getattr(rebuild)?;
    PyTuple::new(py, [method, args.into_pyobject(py).map_err(Into::into)?.into_any().into_bound()])
}

impl Default for LazyList {
    fn default() -> Self {
        Self(PyOnceLock::new())
    }
}

impl std::fmt::Debug for LazyList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LazyList")
    }
}

impl LazyList {
    /// The list, built by `build` on the first call.
    pub(crate) fn get<'py>(
        &self,
        py: Python<'py>,
        build: impl FnOnce() -> PyResult<Bound<'py, PyList>>,
    ) -> PyResult<Py<PyList>> {
        self.0.get_or_try_init(py, || build().map(Bound::unbind)).map(|l| l.clone_ref(py))
    }
}

/// A JSON value (the host's `json` module output) as Python objects.
pub(crate) fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_pyobject(py)?.into_any(),
            (None, Some(i)) => i.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            PyList::new(py, a.iter().map(|x| json_to_py(py, x)).collect::<PyResult<Vec<_>>>()?)?.into_any()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// The contents of a 1-D numpy array (a copy; the arrays of results are small or read once).
fn vec_of<T: numpy::Element + Copy>(a: &Bound<'_, PyArray1<T>>) -> PyResult<Vec<T>> {
    Ok(a.readonly().as_array().iter().copied().collect())
}

/// Lists of `indices` between successive `offsets` (checked: the arrays are the caller's to
/// modify).
fn lists<'py>(
    offsets: &Bound<'py, PyArray1<u32>>,
    indices: &Bound<'py, PyArray1<u32>>,
) -> PyResult<Bound<'py, PyList>> {
    let py = offsets.py();
    let (o, i) = (vec_of(offsets)?, vec_of(indices)?);
    let parts = o
        .windows(2)
        .map(|w| i.get(w[0] as usize..w[1] as usize))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| PyValueError::new_err("offsets do not delimit indices (were the arrays modified?)"))?;
    PyList::new(py, parts)
}

/// Views (numpy slices, no copy) of `values` between successive `offsets`.
fn views<'py, T: numpy::Element>(
    offsets: &Bound<'py, PyArray1<u32>>,
    values: &Bound<'py, PyArray1<T>>,
) -> PyResult<Bound<'py, PyList>> {
    let py = offsets.py();
    let o = vec_of(offsets)?;
    let parts = o
        .windows(2)
        .map(|w| values.as_any().get_item(PySlice::new(py, w[0] as isize, w[1] as isize, 1)))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, parts)
}

/// `{"max", "min", "mean", "max_over_mean", "spread"}` of per-group totals
/// (`stowplan::json::summary`, the CLI's balance metrics).
fn summary<'py>(values: &Bound<'py, PyArray1<u64>>) -> PyResult<Bound<'py, PyAny>> {
    json_to_py(values.py(), &stowplan::json::summary(&vec_of(values)?))
}

/// verl's `log_seqlen_unbalance` dict (`{prefix}/min`, `/max`, `/minmax_diff`,
/// `/balanced_min`, `/balanced_max`, `/mean`), or verl's exception.
fn verl_unbalance<'py>(
    py: Python<'py>,
    seqlens: &[i64],
    partitions: &[Vec<i64>],
    prefix: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let u = stowplan::verl_log_seqlen_unbalance(seqlens, partitions).map_err(|e| match e {
        UnbalanceError::ZeroDivision(m) => PyZeroDivisionError::new_err(m),
        UnbalanceError::Value(m) => PyValueError::new_err(m),
        UnbalanceError::Index(m) => PyIndexError::new_err(m),
    })?;
    let d = PyDict::new(py);
    d.set_item(format!("{prefix}/min"), u.min)?;
    d.set_item(format!("{prefix}/max"), u.max)?;
    d.set_item(format!("{prefix}/minmax_diff"), u.max - u.min)?;
    d.set_item(format!("{prefix}/balanced_min"), u.balanced_min)?;
    d.set_item(format!("{prefix}/balanced_max"), u.balanced_max)?;
    // Python's int / int (correctly rounded), as verl computes the mean.
    d.set_item(format!("{prefix}/mean"), u.total.into_pyobject(py)?.div(u.k)?)?;
    Ok(d)
}

// ---------------------------------------------------------------------------------------------
// partition and pack.

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
    fn new(py: Python<'_>, p: Partitioning) -> Self {
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
/// Options (omitted or ``None``: the default): ``method`` — ``"kk"`` (Karmarkar–Karp,
/// default), ``"greedy"`` (LPT) or ``"verl"`` (verl 0.9.1's exact
/// ``get_seqlen_balanced_partitions`` output); ``equal_size`` — every group gets
/// ``len(weights) / k`` items (must divide; default False); ``refine`` — improve
/// ``kk``/``greedy`` by pairwise moves/swaps (default True except for ``"verl"``, which never
/// refines); ``backend`` — ``"wasm"`` (default) or ``"native"`` (same kernel code, compiled
/// natively).
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
#[pyo3(signature = (weights, k, *, method=None, equal_size=None, refine=None, backend=None))]
fn partition(
    py: Python<'_>,
    weights: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    method: Option<&Bound<'_, PyAny>>,
    equal_size: Option<bool>,
    refine: Option<bool>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyPartition> {
    str_options!(method, backend);
    let k = u32_arg(k, "k", 1)?;
    let d = PartitionOptions::default();
    let method = opt_parse(py, method)?.unwrap_or(d.method);
    // verl's output is reproduced as is: never refined unless asked (which the kernel refuses).
    let refine = refine.unwrap_or(d.refine && method != PartitionMethod::Verl);
    let options = PartitionOptions { method, equal_size: equal_size.unwrap_or(d.equal_size), refine };
    let weights = Lengths::extract(weights, "weights")?;
    let kernel = kernel(py, backend)?;
    let w = weights.slice();
    let p = py.detach(|| kernel.partition(w, k, &options)).map_err(|e| to_py(py, e))?;
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
/// ``lengths``: non-negative integers (list, numpy array, CPU tensor, DLPack …). Options
/// (omitted or ``None``: the default): ``align`` — each length is rounded up to a multiple of
/// it first (``>= 1``, default 1); ``method`` — ``"bfd"`` (best-fit decreasing, default),
/// ``"ffd"`` (first-fit decreasing) or ``"next-fit"`` (keeps the input order);
/// ``oversize`` — what to do with a length above ``capacity``: ``"error"`` (default, raises
/// :class:`InfeasibleError`), ``"single"`` (its own bin) or ``"drop"`` (left out, listed in
/// ``dropped``); ``backend`` — ``"wasm"`` (default) or ``"native"``.
///
/// Returns a :class:`Packing`; bins in creation order, members ascending.
///
/// >>> pack([5, 3, 7, 2, 6], 10).bins
/// [[1, 2], [3, 4], [0]]
#[pyfunction]
#[pyo3(signature = (lengths, capacity, *, align=None, method=None, oversize=None, backend=None))]
fn pack(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    capacity: &Bound<'_, PyAny>,
    align: Option<&Bound<'_, PyAny>>,
    method: Option<&Bound<'_, PyAny>>,
    oversize: Option<&Bound<'_, PyAny>>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyPacking> {
    str_options!(method, oversize, backend);
    let d = PackOptions::new(u64_arg(capacity, "capacity", 1)?);
    let options = PackOptions {
        align: opt_u64(align, "align", 1)?.unwrap_or(d.align),
        method: opt_parse(py, method)?.unwrap_or(d.method),
        oversize: opt_parse(py, oversize)?.unwrap_or(d.oversize),
        ..d
    };
    let lengths = Lengths::extract(lengths, "lengths")?;
    let kernel = kernel(py, backend)?;
    let l = lengths.slice();
    let p: Packing = py.detach(|| kernel.pack(l, &options)).map_err(|e| to_py(py, e))?;
    Ok(PyPacking::new(py, p, l, options.capacity))
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
fn pack_multi(
    py: Python<'_>,
    columns: &Bound<'_, PyDict>,
    capacities: &Bound<'_, PyDict>,
    max_segments: Option<&Bound<'_, PyAny>>,
    align: Option<&Bound<'_, PyAny>>,
    method: Option<&Bound<'_, PyAny>>,
    oversize: Option<&Bound<'_, PyAny>>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMultiPacking> {
    str_options!(method, oversize, backend);
    let d = PackOptions::new(1);
    let r = columns.len();
    if r == 0 || r > stowplan::MAX_RESOURCES {
        return Err(invalid(py, format!("columns must name 1 to {} resources (got {r})", stowplan::MAX_RESOURCES)));
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
        bounds.set_item(stowplan::SEGMENTS, p.lower_bounds[r])?;
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

// ---------------------------------------------------------------------------------------------
// Balancing: micro-batches and DP ranks.

/// Micro-batches of one batch (the result of :func:`micro_batches`, or one rank's part of a
/// :class:`Balance`, whose indices are then global).
#[pyclass(frozen, module = "stowplan._stowplan", name = "MicroBatches")]
#[derive(Debug)]
pub struct PyMicroBatches {
    /// ``uint32`` array of ``count + 1`` boundaries into ``indices``.
    #[pyo3(get)]
    offsets: Py<PyArray1<u32>>,
    /// ``uint32`` array, every index once, micro-batch after micro-batch.
    #[pyo3(get)]
    indices: Py<PyArray1<u32>>,
    /// ``uint64`` array, tokens of each micro-batch (each ``<= max_token_len``).
    #[pyo3(get)]
    tokens: Py<PyArray1<u64>>,
    /// ``uint64`` array, cost of each micro-batch.
    #[pyo3(get)]
    costs: Py<PyArray1<u64>>,
    /// ``uint32`` array; ``outputs[restore]`` puts outputs computed in micro-batch order
    /// (concatenated) back in input order (in a :class:`Balance`: in the order of the rank's
    /// samples, ``Balance.ranks[r]``).
    #[pyo3(get)]
    restore: Py<PyArray1<u32>>,
    /// ``max(1, ceil(total tokens / max_token_len))``.
    #[pyo3(get)]
    lower_bound: u32,
    /// The count this batch needs on its own (the count ``count=`` overrides).
    #[pyo3(get)]
    required: u32,
    /// The number of micro-batches.
    #[pyo3(get)]
    count: usize,
    max_tokens: u64,
    batches: LazyList,
}

impl PyMicroBatches {
    fn new(py: Python<'_>, p: MicroPlan) -> Self {
        Self {
            count: p.offsets.len().saturating_sub(1),
            max_tokens: p.tokens.iter().copied().max().unwrap_or(0),
            lower_bound: p.lower_bound,
            required: p.required,
            offsets: p.offsets.into_pyarray(py).unbind(),
            indices: p.indices.into_pyarray(py).unbind(),
            tokens: p.tokens.into_pyarray(py).unbind(),
            costs: p.costs.into_pyarray(py).unbind(),
            restore: p.restore.into_pyarray(py).unbind(),
            batches: LazyList::default(),
        }
    }
}

#[pymethods]
impl PyMicroBatches {
    /// Pickles as its fields.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let (py, p) = (slf.py(), slf.get());
        let arrays = (
            p.offsets.clone_ref(py),
            p.indices.clone_ref(py),
            p.tokens.clone_ref(py),
            p.costs.clone_ref(py),
            p.restore.clone_ref(py),
        );
        reduce(slf, (arrays, p.lower_bound, p.required))
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
        let n = indices.bind(py).len();
        check_state(py, "MicroBatches", &offsets, n, &[tokens.bind(py).len(), costs.bind(py).len()])?;
        if restore.bind(py).len() != n {
            return Err(invalid(py, "MicroBatches: the pickled state is inconsistent (restore)".into()));
        }
        let max_tokens = tokens.bind(py).to_vec()?.into_iter().max().unwrap_or(0);
        Ok(Self {
            count: offsets.bind(py).len().saturating_sub(1),
            max_tokens,
            lower_bound,
            required,
            offsets,
            indices,
            tokens,
            costs,
            restore,
            batches: LazyList::default(),
        })
    }

    /// List of ``uint32`` arrays (views of ``indices``), the input indices of each
    /// micro-batch (ascending), in the requested order.
    #[getter]
    fn batches(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        self.batches.get(py, || views(self.offsets.bind(py), self.indices.bind(py)))
    }

    /// ``max``, ``min``, ``mean``, ``max_over_mean``, ``spread`` of the tokens per micro-batch.
    #[getter]
    fn token_balance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        summary(self.tokens.bind(py))
    }

    /// ``max``, ``min``, ``mean``, ``max_over_mean``, ``spread`` of the cost per micro-batch.
    #[getter]
    fn cost_balance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        summary(self.costs.bind(py))
    }

    fn __len__(&self) -> usize {
        self.count
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.batches(py)?.into_bound(py).try_iter()?.into_any())
    }

    fn __repr__(&self) -> String {
        format!("MicroBatches(count={}, lower_bound={}, max_tokens={})", self.count, self.lower_bound, self.max_tokens)
    }
}

/// Micro-batch options from the arguments (`None`: `MicroOptions::new`'s defaults).
fn micro_options(
    py: Python<'_>,
    max_token_len: &Bound<'_, PyAny>,
    cost: Option<Cost>,
    min_count: Option<&Bound<'_, PyAny>>,
    divisible_by: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    order: Option<&str>,
) -> PyResult<MicroOptions> {
    let d = MicroOptions::new(u64_arg(max_token_len, "max_token_len", 1)?);
    Ok(MicroOptions {
        cost: cost.unwrap_or(d.cost),
        min_count: opt_u32(min_count, "min_count", 0)?.unwrap_or(d.min_count),
        divisible_by: opt_u32(divisible_by, "divisible_by", 1)?.unwrap_or(d.divisible_by),
        count: opt_u32(count, "count", 1)?.or(d.count),
        order: opt_parse(py, order)?.unwrap_or(d.order),
        ..d
    })
}

/// Splits one rank's batch into micro-batches of at most ``max_token_len`` tokens.
///
/// The cap is hard: no micro-batch ever exceeds it. The count is the smallest the cap allows
/// (the bin-packing lower bound on typical inputs), raised to ``min_count``, rounded up to a
/// multiple of ``divisible_by`` — or exactly ``count``. The cost is balanced across them.
///
/// ``lengths``: tokens per sequence (list, numpy array, CPU tensor …); ``max_token_len``: the
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
/// ``"wasm"`` (default) or ``"native"``.
///
/// Raises :class:`InfeasibleError` for a sequence longer than ``max_token_len`` or over a
/// limit (named) or a ``count`` below what the caps allow; :class:`InvalidArgumentError` for empty input,
/// ``max_token_len`` 0, a count above the number of sequences (micro-batches are never
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
#[pyo3(signature = (lengths, max_token_len, *, cost=None, min_count=None, divisible_by=None, count=None, order=None,
    extra_costs=None, resources=None, limits=None, backend=None))]
#[allow(clippy::too_many_arguments)]
fn micro_batches(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    max_token_len: &Bound<'_, PyAny>,
    cost: Option<&Bound<'_, PyAny>>,
    min_count: Option<&Bound<'_, PyAny>>,
    divisible_by: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    order: Option<&Bound<'_, PyAny>>,
    extra_costs: Option<&Bound<'_, PyAny>>,
    resources: Option<&Bound<'_, PyDict>>,
    limits: Option<&Bound<'_, PyDict>>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMicroBatches> {
    str_options!(order, backend);
    let options = micro_options(py, max_token_len, cost_arg(cost)?, min_count, divisible_by, count, order)?;
    let lengths = Lengths::extract(lengths, "lengths")?;
    let extra = extra_costs.map(|e| Lengths::extract(e, "extra_costs")).transpose()?;
    let kernel = kernel(py, backend)?;
    let l = lengths.slice();
    let e = extra.as_ref().map(Lengths::slice);
    let limited = match (resources, limits) {
        (None, None) => None,
        (Some(r), Some(c)) => Some(multi::limit_rows(py, r, c, l.len())?),
        (Some(_), None) => return Err(invalid(py, "resources needs limits (the cap of each resource)".into())),
        (None, Some(_)) => return Err(invalid(py, "limits needs resources (the sequences' sizes in each)".into())),
    };
    let p = py
        .detach(|| match (&limited, e) {
            (Some((sizes, caps, names)), e) => {
                let lim = stowplan::MicroLimits { sizes, caps, names };
                kernel.micro_batches_limited(l, e, &lim, &options).map(|p| p.plan)
            }
            (None, Some(e)) => kernel.micro_batches_with_extra(l, e, &options),
            (None, None) => kernel.micro_batches(l, &options),
        })
        .map_err(|e| to_py(py, e))?;
    Ok(PyMicroBatches::new(py, p))
}

/// A global batch over DP ranks (the result of :func:`balance`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "Balance")]
#[derive(Debug)]
pub struct PyBalance {
    /// ``uint32`` array of ``dp + 1`` boundaries into ``order``.
    #[pyo3(get)]
    offsets: Py<PyArray1<u32>>,
    /// ``uint32`` permutation of the input: ``batch[order]`` puts every rank's samples in one
    /// contiguous, equal slice (how verl's and ROLL's dispatchers split a batch).
    #[pyo3(get)]
    order: Py<PyArray1<u32>>,
    /// ``uint64`` array, tokens of each rank.
    #[pyo3(get)]
    tokens: Py<PyArray1<u64>>,
    /// ``uint64`` array, cost of each rank.
    #[pyo3(get)]
    costs: Py<PyArray1<u64>>,
    /// ``max(ceil(total cost / dp), costliest group)``.
    #[pyo3(get)]
    cost_lower_bound: u64,
    /// With ``max_token_len``, one :class:`MicroBatches` per rank (global indices, the same
    /// count on every rank); else ``None``.
    #[pyo3(get)]
    micro_batches: Option<Py<PyList>>,
    /// Micro-batches per rank (``None`` without ``max_token_len``).
    #[pyo3(get)]
    count: Option<usize>,
    /// The number of ranks.
    #[pyo3(get)]
    dp: usize,
    /// The input lengths (``uint64``/``int64`` array), for the metrics.
    #[pyo3(get)]
    lengths: Py<PyAny>,
    max_cost: u64,
    ranks: LazyList,
}

#[pymethods]
impl PyBalance {
    /// Pickles as its fields.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let (py, b) = (slf.py(), slf.get());
        let arrays = (b.offsets.clone_ref(py), b.order.clone_ref(py), b.tokens.clone_ref(py), b.costs.clone_ref(py));
        let micro = b.micro_batches.as_ref().map(|m| m.clone_ref(py));
        reduce(slf, (arrays, b.cost_lower_bound, micro, b.count, b.lengths.clone_ref(py), b.max_cost))
    }

    /// The balance pickled by ``__reduce__``.
    #[staticmethod]
    #[allow(clippy::type_complexity)]
    fn _from_state(
        arrays: (Py<PyArray1<u32>>, Py<PyArray1<u32>>, Py<PyArray1<u64>>, Py<PyArray1<u64>>),
        cost_lower_bound: u64,
        micro_batches: Option<Py<PyList>>,
        count: Option<usize>,
        lengths: Py<PyAny>,
        max_cost: u64,
        py: Python<'_>,
    ) -> PyResult<Self> {
        let (offsets, order, tokens, costs) = arrays;
        check_state(py, "Balance", &offsets, order.bind(py).len(), &[tokens.bind(py).len(), costs.bind(py).len()])?;
        Ok(PyBalance {
            dp: offsets.bind(py).len().saturating_sub(1),
            offsets,
            order,
            tokens,
            costs,
            cost_lower_bound,
            micro_batches,
            count,
            lengths,
            max_cost,
            ranks: LazyList::default(),
        })
    }

    /// List of ``uint32`` arrays (views of ``order``), the input indices each rank gets
    /// (ascending; mini-batch by mini-batch with ``minibatch_size``).
    #[getter]
    fn ranks(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        self.ranks.get(py, || views(self.offsets.bind(py), self.order.bind(py)))
    }

    /// ``max``, ``min``, ``mean``, ``max_over_mean``, ``spread`` of the tokens per rank.
    #[getter]
    fn token_balance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        summary(self.tokens.bind(py))
    }

    /// ``max``, ``min``, ``mean``, ``max_over_mean``, ``spread`` of the cost per rank.
    #[getter]
    fn cost_balance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        summary(self.costs.bind(py))
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
        let (o, i) = (vec_of(self.offsets.bind(py))?, vec_of(self.order.bind(py))?);
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

/// Balances a global batch over ``dp`` ranks, and with ``max_token_len`` also splits every
/// rank's part into micro-batches (the same count on every rank).
///
/// Every rank gets the same number of samples (``equal_count``), and the costliest rank is
/// made as light as the heuristic finds (Karmarkar–Karp on costs, then swaps). The plan is a
/// pure function of the global lengths, so every rank can compute it and agree on the
/// micro-batch count without an all-reduce.
///
/// ``lengths``: tokens per sample of the global batch; ``dp``: number of data-parallel ranks,
/// ``>= 1``. Options (omitted or ``None``: the default): ``cost`` — as in
/// :func:`micro_batches`; ``max_token_len`` — the micro-batch cap (``None``: plan only the DP
/// level); ``groups`` — one label per sample (e.g. uids): samples with the same label stay
/// on one rank (equal counts need groups of one size and a group count divisible by
/// ``dp``); ``minibatch_size`` — balance each run of this many consecutive samples
/// separately (verl's ``keep_minibatch``; each rank lists its samples mini-batch by
/// mini-batch); ``equal_count`` — every rank gets the same number of samples (default True);
/// ``min_count``, ``divisible_by``, ``count``, ``order`` — as in :func:`micro_batches`, per
/// rank; ``extra_costs`` — one extra cost per sample on top of ``cost`` (e.g. a multimodal
/// sample's image tokens), counted by both levels; ``backend`` — ``"wasm"`` (default) or
/// ``"native"``.
///
/// >>> b = balance([100, 900, 50, 950, 400, 600], 2)
/// >>> [r.tolist() for r in b.ranks], b.tokens.tolist()
/// ([[1, 2, 5], [0, 3, 4]], [1550, 1450])
/// >>> b = balance([100, 900, 50, 950, 400, 600, 10, 20], 2, max_token_len=1000, cost="attention")
/// >>> b.count, [[m.tolist() for m in r.batches] for r in b.micro_batches]
/// (2, [[[1], [5, 6, 7]], [[0, 2, 4], [3]]])
#[pyfunction]
#[pyo3(signature = (lengths, dp, *, cost=None, max_token_len=None, groups=None, minibatch_size=None, equal_count=None,
    min_count=None, divisible_by=None, count=None, order=None, extra_costs=None, backend=None))]
#[allow(clippy::too_many_arguments)]
fn balance(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    dp: &Bound<'_, PyAny>,
    cost: Option<&Bound<'_, PyAny>>,
    max_token_len: Option<&Bound<'_, PyAny>>,
    groups: Option<&Bound<'_, PyAny>>,
    minibatch_size: Option<&Bound<'_, PyAny>>,
    equal_count: Option<bool>,
    min_count: Option<&Bound<'_, PyAny>>,
    divisible_by: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    order: Option<&Bound<'_, PyAny>>,
    extra_costs: Option<&Bound<'_, PyAny>>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyBalance> {
    str_options!(order, backend);
    let d = DpOptions::default();
    let cost = cost_arg(cost)?.unwrap_or(d.cost);
    let dp = u32_arg(dp, "dp", 1)?;
    let minibatch_size = opt_u32(minibatch_size, "minibatch_size", 1)?.or(d.minibatch_size);
    let micro =
        max_token_len.map(|t| micro_options(py, t, Some(cost), min_count, divisible_by, count, order)).transpose()?;
    let lengths = Lengths::extract(lengths, "lengths")?;
    let l = lengths.slice();
    let labels = labels(groups, l.len())?;
    let extra = extra_costs.map(|e| Lengths::extract(e, "extra_costs")).transpose()?;
    let kernel = kernel(py, backend)?;
    let options = DpOptions {
        cost,
        groups: labels.as_deref(),
        minibatch_size,
        equal_count: equal_count.unwrap_or(d.equal_count),
        extra_costs: extra.as_ref().map(Lengths::slice),
    };
    let (plan, ranks): (DpPlan, Option<Vec<MicroPlan>>) = match micro {
        None => (py.detach(|| kernel.balance_dp(l, dp, &options)).map_err(|e| to_py(py, e))?, None),
        Some(m) => {
            let p = py.detach(|| kernel.plan(l, dp, &options, &m)).map_err(|e| to_py(py, e))?;
            (p.dp, Some(p.ranks))
        }
    };
    let (count, micro_batches) = match ranks {
        None => (None, None),
        Some(ranks) => {
            let count = ranks.first().map_or(0, MicroPlan::count);
            let list = PyList::empty(py);
            for r in ranks {
                list.append(Py::new(py, PyMicroBatches::new(py, r))?)?;
            }
            (Some(count), Some(list.unbind()))
        }
    };
    Ok(PyBalance {
        dp: plan.offsets.len().saturating_sub(1),
        max_cost: plan.costs.iter().copied().max().unwrap_or(0),
        cost_lower_bound: plan.cost_lower_bound,
        offsets: plan.offsets.into_pyarray(py).unbind(),
        order: plan.order.into_pyarray(py).unbind(),
        tokens: plan.tokens.into_pyarray(py).unbind(),
        costs: plan.costs.into_pyarray(py).unbind(),
        micro_batches,
        count,
        lengths: lengths.array().unbind(),
        ranks: LazyList::default(),
    })
}

// ---------------------------------------------------------------------------------------------
// Peers (verl 0.9.1, ROLL): their outputs and their builtin exceptions.

/// verl(function, seqlens, k, equal_size, *, backend=None) -> list[list[int]]: verl 0.9.1's
/// ``karmarkar_karp``, ``greedy_partition`` or ``get_seqlen_balanced_partitions``; raises the
/// builtin exception verl raises (AssertionError, IndexError, TypeError, ZeroDivisionError,
/// MemoryError).
#[pyfunction]
#[pyo3(signature = (function, seqlens, k, equal_size, *, backend=None))]
fn verl<'py>(
    py: Python<'py>,
    function: &str,
    seqlens: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    equal_size: bool,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    str_options!(backend);
    let seqlens: Vec<i64> = int_vec(seqlens, "seqlen_list", i64::MIN.into(), i64::MAX.into())?;
    let k: u32 = int(k, "k_partitions", 0, u32::MAX.into())?;
    let f = match function {
        "karmarkar_karp" => VerlFunction::KarmarkarKarp,
        "greedy_partition" => VerlFunction::GreedyPartition,
        "get_seqlen_balanced_partitions" => VerlFunction::GetSeqlenBalancedPartitions,
        other => {
            return Err(invalid(
                py,
                format!(
                    "function must be 'karmarkar_karp', 'greedy_partition' or 'get_seqlen_balanced_partitions' \
                     (got {other:?})"
                ),
            ));
        }
    };
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.verl(f, &seqlens, k, equal_size)).map_err(|e| to_py(py, e))? {
        Ok(groups) => PyList::new(py, groups),
        Err(e) => Err(peer_error(&e)),
    }
}

/// log_seqlen_unbalance(seqlens, partitions, prefix) -> dict: verl's balance metrics
/// (``{prefix}/min``, ``/max``, ``/minmax_diff``, ``/balanced_min``, ``/balanced_max``,
/// ``/mean``); raises like verl.
#[pyfunction]
fn log_seqlen_unbalance<'py>(
    py: Python<'py>,
    seqlens: &Bound<'py, PyAny>,
    partitions: &Bound<'py, PyAny>,
    prefix: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let (low, high) = (i64::MIN.into(), i64::MAX.into());
    let seqlens: Vec<i64> = int_vec(seqlens, "seqlen_list", low, high)?;
    let partitions = partitions
        .try_iter()
        .map_err(|_| invalid(py, "partitions must be a list of lists of indices".into()))?
        .enumerate()
        .map(|(r, p)| int_vec(&p?, &format!("partitions[{r}]"), low, high))
        .collect::<PyResult<Vec<Vec<i64>>>>()?;
    verl_unbalance(py, &seqlens, &partitions, prefix)
}

/// verl_rearrange_micro_batches(seqlens, max_token_len, *, min_num_micro_batch=None,
/// num_batches_divided_by=None, use_dynamic_bsz_balance=None, force_group_size=None,
/// padded_width=None, dp_num_micro_batches=None, backend=None) -> list[list[int]]: verl's
/// index lists (omitted options: verl's defaults); raises verl's exception.
#[pyfunction]
#[pyo3(signature = (seqlens, max_token_len, *, min_num_micro_batch=None, num_batches_divided_by=None,
    use_dynamic_bsz_balance=None, force_group_size=None, padded_width=None, dp_num_micro_batches=None, backend=None))]
#[allow(clippy::too_many_arguments)]
fn verl_rearrange_micro_batches<'py>(
    py: Python<'py>,
    seqlens: &Bound<'py, PyAny>,
    max_token_len: &Bound<'py, PyAny>,
    min_num_micro_batch: Option<&Bound<'py, PyAny>>,
    num_batches_divided_by: Option<&Bound<'py, PyAny>>,
    use_dynamic_bsz_balance: Option<bool>,
    force_group_size: Option<&Bound<'py, PyAny>>,
    padded_width: Option<&Bound<'py, PyAny>>,
    dp_num_micro_batches: Option<&Bound<'py, PyAny>>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    str_options!(backend);
    let seqlens: Vec<i64> = int_vec(seqlens, "seqlen_list", i64::MIN.into(), i64::MAX.into())?;
    let (
        max_token_len,
        min_num_micro_batch,
        num_batches_divided_by,
        force_group_size,
        padded_width,
        dp_num_micro_batches,
    ) = (
        int(max_token_len, "max_token_len", i64::MIN.into(), i64::MAX.into())?,
        opt_i64(min_num_micro_batch, "min_num_micro_batch")?,
        opt_i64(num_batches_divided_by, "num_batches_divided_by")?,
        opt_i64(force_group_size, "force_group_size")?,
        opt_i64(padded_width, "padded_width")?,
        opt_i64(dp_num_micro_batches, "dp_num_micro_batches")?,
    );
    let d = VerlMicroOptions::new(max_token_len);
    let o = VerlMicroOptions {
        min_num_micro_batch: min_num_micro_batch.or(d.min_num_micro_batch),
        num_batches_divided_by: num_batches_divided_by.or(d.num_batches_divided_by),
        use_dynamic_bsz_balance: use_dynamic_bsz_balance.unwrap_or(d.use_dynamic_bsz_balance),
        force_group_size: force_group_size.unwrap_or(d.force_group_size),
        padded_width: padded_width.or(d.padded_width),
        dp_num_micro_batches: dp_num_micro_batches.or(d.dp_num_micro_batches),
        ..d
    };
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.verl_rearrange_micro_batches(&seqlens, &o)).map_err(|e| to_py(py, e))? {
        Ok(groups) => PyList::new(py, groups),
        Err(e) => Err(peer_error(&e)),
    }
}

/// verl's trainer ``_balance_batch`` / ROLL's ``batch_balance`` reordering (the result of
/// :func:`balance_batch`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "DpReorder")]
#[derive(Debug)]
pub struct PyDpReorder {
    inner: DpReorder,
}

#[pymethods]
impl PyDpReorder {
    /// Per rank, the sample indices in the peer's final order.
    #[getter]
    fn partitions(&self) -> Vec<Vec<u32>> {
        self.inner.partitions.clone()
    }

    /// The raw equal-size KK result of each call (one call, or one per mini-batch).
    #[getter]
    fn kk_partitions(&self) -> Vec<Vec<Vec<u32>>> {
        self.inner.kk_partitions.clone()
    }

    /// Samples the peers leave out (the tail past the last full mini-batch), ascending.
    #[getter]
    fn dropped(&self) -> Vec<u32> {
        self.inner.dropped.clone()
    }

    fn __repr__(&self) -> String {
        format!("DpReorder(dp={}, dropped={})", self.inner.partitions.len(), self.inner.dropped.len())
    }
}

/// balance_batch(seqlens, dp, *, minibatch_size=None, backend=None) -> DpReorder; raises
/// verl's/ROLL's builtin exception.
#[pyfunction]
#[pyo3(signature = (seqlens, dp, *, minibatch_size=None, backend=None))]
fn balance_batch(
    py: Python<'_>,
    seqlens: &Bound<'_, PyAny>,
    dp: &Bound<'_, PyAny>,
    minibatch_size: Option<&Bound<'_, PyAny>>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyDpReorder> {
    str_options!(backend);
    let seqlens: Vec<i64> = int_vec(seqlens, "seqlen_list", i64::MIN.into(), i64::MAX.into())?;
    let dp: u32 = int(dp, "dp_size", 0, u32::MAX.into())?;
    let minibatch_size = opt_i64(minibatch_size, "minibatch_size")?;
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.balance_batch(&seqlens, dp, minibatch_size)).map_err(|e| to_py(py, e))? {
        Ok(inner) => Ok(PyDpReorder { inner }),
        Err(e) => Err(peer_error(&e)),
    }
}

/// ROLL's ``load_balance`` micro-batches (the result of :func:`roll_load_balance`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "RollMicroBatches")]
#[derive(Debug)]
pub struct PyRollMicroBatches {
    inner: RollMicroBatches,
}

#[pymethods]
impl PyRollMicroBatches {
    /// The micro-batches in ROLL's yield order.
    #[getter]
    fn micro_batches(&self) -> Vec<Vec<u32>> {
        self.inner.micro_batches.clone()
    }

    /// The raw KK partitions before the reorder (members ascending).
    #[getter]
    fn kk_partitions(&self) -> Vec<Vec<u32>> {
        self.inner.kk_partitions.clone()
    }

    /// The pad factor applied to every length.
    #[getter]
    fn pad_factor(&self) -> i64 {
        self.inner.pad_factor
    }

    /// Every length rounded up to the pad factor.
    #[getter]
    fn padded_lengths(&self) -> Vec<i64> {
        self.inner.padded_lengths.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "RollMicroBatches(micro_batches={}, pad_factor={})",
            self.inner.micro_batches.len(),
            self.inner.pad_factor
        )
    }
}

/// roll_load_balance(lengths, mask_width, max_packed_sequence_length, *,
/// min_num_micro_batches=None, tp=None, cp=None, vp=None, dp_num_micro_batches=None,
/// backend=None) -> RollMicroBatches (omitted options: ROLL's defaults); raises ROLL's
/// exception.
#[pyfunction]
#[pyo3(signature = (lengths, mask_width, max_packed_sequence_length, *, min_num_micro_batches=None, tp=None, cp=None,
    vp=None, dp_num_micro_batches=None, backend=None))]
#[allow(clippy::too_many_arguments)]
fn roll_load_balance(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    mask_width: &Bound<'_, PyAny>,
    max_packed_sequence_length: &Bound<'_, PyAny>,
    min_num_micro_batches: Option<&Bound<'_, PyAny>>,
    tp: Option<&Bound<'_, PyAny>>,
    cp: Option<&Bound<'_, PyAny>>,
    vp: Option<&Bound<'_, PyAny>>,
    dp_num_micro_batches: Option<&Bound<'_, PyAny>>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyRollMicroBatches> {
    str_options!(backend);
    let lengths: Vec<i64> = int_vec(lengths, "lengths", i64::MIN.into(), i64::MAX.into())?;
    let (low, high) = (i64::MIN.into(), i64::MAX.into());
    let mask_width: i64 = int(mask_width, "mask_width", low, high)?;
    let max_packed_sequence_length: i64 = int(max_packed_sequence_length, "max_packed_sequence_length", low, high)?;
    let (min_num_micro_batches, tp, cp, vp, dp_num_micro_batches) = (
        opt_i64(min_num_micro_batches, "min_num_micro_batches")?,
        opt_i64(tp, "tp")?,
        opt_i64(cp, "cp")?,
        opt_i64(vp, "vp")?,
        opt_i64(dp_num_micro_batches, "dp_num_micro_batches")?,
    );
    let d = RollLoadBalanceOptions::new(mask_width, max_packed_sequence_length);
    let o = RollLoadBalanceOptions {
        min_num_micro_batches: min_num_micro_batches.unwrap_or(d.min_num_micro_batches),
        tp: tp.unwrap_or(d.tp),
        cp: cp.unwrap_or(d.cp),
        vp: vp.unwrap_or(d.vp),
        dp_num_micro_batches: dp_num_micro_batches.or(d.dp_num_micro_batches),
        ..d
    };
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.roll_load_balance(&lengths, &o)).map_err(|e| to_py(py, e))? {
        Ok(inner) => Ok(PyRollMicroBatches { inner }),
        Err(e) => Err(peer_error(&e)),
    }
}

/// The embedded kernel component's sha256 and its imports (always empty):
/// ``{"sha256": …, "imports": […]}``.
#[pyfunction]
fn kernel_info<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let imports = py.detach(Kernel::wasm_imports).map_err(|e| to_py(py, e))?;
    let d = PyDict::new(py);
    d.set_item("sha256", stowplan::KERNEL_WASM_SHA256.trim())?;
    d.set_item("imports", imports)?;
    Ok(d)
}

/// The native module.
#[pymodule]
fn _stowplan(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(partition, m)?)?;
    m.add_function(wrap_pyfunction!(pack, m)?)?;
    m.add_function(wrap_pyfunction!(pack_multi, m)?)?;
    m.add_function(wrap_pyfunction!(micro_batches, m)?)?;
    m.add_function(wrap_pyfunction!(balance, m)?)?;
    m.add_function(wrap_pyfunction!(verl, m)?)?;
    m.add_function(wrap_pyfunction!(log_seqlen_unbalance, m)?)?;
    m.add_function(wrap_pyfunction!(verl_rearrange_micro_batches, m)?)?;
    m.add_function(wrap_pyfunction!(balance_batch, m)?)?;
    m.add_function(wrap_pyfunction!(roll_load_balance, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_info, m)?)?;
    m.add_function(wrap_pyfunction!(py_integer, m)?)?;
    m.add_function(wrap_pyfunction!(py_integers, m)?)?;
    m.add_class::<PyPartition>()?;
    m.add_class::<PyPacking>()?;
    m.add_class::<PyMultiPacking>()?;
    m.add_class::<PyMicroBatches>()?;
    m.add_class::<PyBalance>()?;
    m.add_class::<PyDpReorder>()?;
    m.add_class::<PyRollMicroBatches>()?;
    m.add_class::<stream::PyStreamPacker>()?;
    stream::defaults(m)?;
    // The kernel's cost presets, name -> (linear, quadratic).
    let presets = PyDict::new(m.py());
    for (name, c) in stowplan::COST_PRESETS {
        presets.set_item(name, PyTuple::new(m.py(), [c.linear, c.quadratic])?)?;
    }
    m.add("COST_PRESETS", presets)?;
    layout::register(m)?;
    packer::register(m)?;
    plan::register(m)?;
    prime_rl::register(m)?;
    source::register(m)?;
    filter::register(m)?;
    slime::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
