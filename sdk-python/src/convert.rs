//! Arguments: converted and checked once, here; every message names the argument.

use std::str::FromStr;

use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyString, PyTuple};
use stowplan::{Backend, Error, Kernel, kernel::Cost};

use crate::errors::{invalid, to_py};

/// `2**64-1` for `u64::MAX` and the like: how a range bound reads in a message.
pub(crate) fn bound(v: i128) -> String {
    match v {
        v if v == i128::from(u64::MAX) => "2**64-1".into(),
        v if v == i128::from(u32::MAX) => "2**32-1".into(),
        v if v == i128::from(i64::MAX) => "2**63-1".into(),
        v if v == i128::from(i64::MIN) => "-2**63".into(),
        v => v.to_string(),
    }
}

/// `value` as Python objects through its `Serialize` (pythonize): a struct or map becomes a
/// dict with its fields in order, a sequence a list, a unit variant its serde name.
pub(crate) fn pythonized<'py, T: serde::Serialize + ?Sized>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    Ok(pythonize::pythonize(py, value)?)
}

/// Calls `f` with the bytes of argument `name` read in place: `bytes` as they are, any other
/// contiguous buffer (`bytearray`, `memoryview`, a numpy `uint8` array — what `ray.get` of a
/// Ray object holding one gives —, a `pyarrow.Buffer`) through `numpy.frombuffer` (the buffer
/// protocol is not in the stable ABI this module is built for).
pub(crate) fn with_bytes<R>(data: &Bound<'_, PyAny>, name: &str, f: impl FnOnce(&[u8]) -> PyResult<R>) -> PyResult<R> {
    if let Ok(b) = data.cast::<pyo3::types::PyBytes>() {
        return f(b.as_bytes());
    }
    let py = data.py();
    let array = py
        .import("numpy")?
        .call_method1("frombuffer", (data, "uint8"))
        .map_err(|e| invalid(py, format!("{name} must be bytes or a contiguous buffer ({e})")))?
        .extract::<PyReadonlyArray1<'_, u8>>()?;
    f(array.as_slice()?)
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
pub(crate) fn integer(obj: &Bound<'_, PyAny>) -> Option<Option<i128>> {
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
pub(crate) fn py_integer(value: &Bound<'_, PyAny>, name: &str, low: i128, high: i128) -> PyResult<i128> {
    int(value, name, low, high)
}

/// _integers(values, name, low, high) -> list[int]: a one-dimensional sequence (list,
/// tuple, numpy array, ``__array__``, DLPack) checked like every integer sequence of the
/// native layer, as Python ints; raises ``InvalidArgumentError`` naming ``name[i]``.
#[pyfunction(name = "_integers")]
pub(crate) fn py_integers(values: &Bound<'_, PyAny>, name: &str, low: i128, high: i128) -> PyResult<Vec<i128>> {
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

/// An optional [`number`] (`None` stays `None`: the host's default).
pub(crate) fn opt_number(obj: Option<&Bound<'_, PyAny>>, name: &str, what: &str) -> PyResult<Option<f64>> {
    obj.map(|o| number(o, name, what)).transpose()
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

/// An option name parsed with the host's spelling (`FromStr` of the kernel's [`stowplan::kernel::Named`]
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
    let names: Vec<String> = stowplan::kernel::COST_PRESETS.iter().map(|(n, _)| format!("'{n}'")).collect();
    names.join(" or ")
}

/// The ``backend=`` argument of every function that runs the kernel, read once here: a
/// string naming a [`Backend`] (``"wasm"``, the default, or ``"native"``); anything else is an
/// `InvalidArgumentError` naming the argument and the allowed values ([`opt_str`], [`parse`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BackendArg(Backend);

impl<'a, 'py> FromPyObject<'a, 'py> for BackendArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let name = opt_str(Some(&obj.to_owned()), "backend")?.unwrap_or_default();
        parse(obj.py(), &name).map(BackendArg)
    }
}

impl BackendArg {
    /// The backend asked for, or the host's default.
    pub(crate) fn or_default(backend: Option<Self>) -> Backend {
        backend.map(|b| b.0).unwrap_or_default()
    }
}

/// The kernel on `backend` (`None`: the host's default backend).
pub(crate) fn kernel(py: Python<'_>, backend: Option<BackendArg>) -> PyResult<Kernel> {
    let backend = BackendArg::or_default(backend);
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

/// Registers the Python layer's integer checks (`_integer`, `_integers`).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(py_integer, m)?)?;
    m.add_function(wrap_pyfunction!(py_integers, m)?)
}

/// An argument of `call` given under its name (`new`) or its former name (`old`, deprecated
/// for one release): the former warns through `stowplan._renamed.warn_renamed` (the one
/// deprecation path, shared with the Python layer), both at once is `InvalidArgumentError`.
pub(crate) fn renamed<'a, 'py>(
    py: Python<'py>,
    call: &str,
    new: (&str, Option<&'a Bound<'py, PyAny>>),
    old: (&str, Option<&'a Bound<'py, PyAny>>),
) -> PyResult<Option<&'a Bound<'py, PyAny>>> {
    let path = py.import("stowplan._renamed")?;
    match (new.1, old.1) {
        (Some(_), Some(_)) => Err(PyErr::from_value(path.getattr("both_given")?.call1((call, old.0, new.0))?)),
        (None, Some(value)) => {
            warn_renamed(py, call, old.0, new.0, true)?;
            Ok(Some(value))
        }
        (value, None) => Ok(value),
    }
}

/// Warns that `old` (an argument of `call`, or with `argument` false an attribute) is
/// deprecated in favour of `new`, through `stowplan._renamed.warn_renamed`, at the Python
/// caller of the native call.
pub(crate) fn warn_renamed(py: Python<'_>, call: &str, old: &str, new: &str, argument: bool) -> PyResult<()> {
    py.import("stowplan._renamed")?.getattr("warn_renamed")?.call1((call, old, new, 2, argument))?;
    Ok(())
}
