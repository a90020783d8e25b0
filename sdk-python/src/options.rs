//! Keyword options into a kernel options struct, field by field, from the struct's own field
//! list: `options!(__pack_options, kwargs, "pack", &["capacity"], o)` sets every field of
//! `o: PackOptions` that `kwargs` names from its value (`None`: the default the struct already holds), each value checked by
//! its type ([`OptionArg`]). The field names, types and count come from the kernel
//! (`stowplan_kernel::__options!`, which declares the struct), so an option the kernel adds
//! is a keyword here without an edit; the ranges of the values are the kernel's checks, which
//! name the option.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use stowplan::kernel::{OversizePolicy, PackMethod, PartitionMethod};

use crate::convert::{bound, integer, is_bool, opt_str, parse, repr};
use crate::errors::invalid;

/// A kernel option's value from its Python form, refused with an `InvalidArgumentError`
/// naming the option.
pub(crate) trait OptionArg: Sized {
    /// `obj` (never `None`) as the option `name`.
    fn extract(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Self>;
}

/// An unsigned integer option, `T` at most `high`: the kernel checks its lower bound (and
/// says it), so this says only what it must be to reach the kernel.
fn unsigned<T: TryFrom<i128>>(obj: &Bound<'_, PyAny>, name: &str, high: i128) -> PyResult<T> {
    match integer(obj) {
        None => Err(invalid(obj.py(), format!("{name} must be an integer (got {})", repr(obj)))),
        Some(v) => v.and_then(|v| T::try_from(v).ok()).ok_or_else(|| {
            invalid(obj.py(), format!("{name} must not be negative or above {} (got {})", bound(high), repr(obj)))
        }),
    }
}

impl OptionArg for u64 {
    fn extract(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        unsigned(obj, name, u64::MAX.into())
    }
}

impl OptionArg for u32 {
    fn extract(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        unsigned(obj, name, u32::MAX.into())
    }
}

impl OptionArg for bool {
    fn extract(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        if is_bool(obj) {
            return obj.is_truthy();
        }
        Err(invalid(obj.py(), format!("{name} must be True or False (got {})", repr(obj))))
    }
}

/// Named enums: a string, one of the kernel's names (`stowplan::kernel::Named`, whose
/// error lists them).
macro_rules! named_options {
    ($($t:ty),*) => {$(
        impl OptionArg for $t {
            fn extract(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
                let s = opt_str(Some(obj), name)?.unwrap_or_default();
                parse(obj.py(), &s)
            }
        }
    )*};
}
named_options!(PartitionMethod, PackMethod, OversizePolicy);

/// The callback of a kernel options struct's field macro (see [`options!`]): sets the fields
/// `$kwargs` names on `$target` (for the function `$call`, whose own parameters `$own` are
/// not options) and returns the names it set (given, not `None`).
macro_rules! set_options {
    ($kwargs:expr, $call:expr, $own:expr, $target:expr; { $($f:ident: $t:ty),* }) => {{
        let mut given: Vec<&'static str> = Vec::new();
        if let Some(kwargs) = $kwargs {
            for (key, value) in kwargs.iter() {
                let key = key.cast::<pyo3::types::PyString>()?.to_cow()?.into_owned();
                let own: &[&str] = $own;
                match key.as_str() {
                    $(k if k == stringify!($f) && !own.contains(&k) => {
                        if !value.is_none() {
                            $target.$f = $crate::options::OptionArg::extract(&value, stringify!($f))?;
                            given.push(stringify!($f));
                        }
                    })*
                    _ => {
                        let names: &[&str] = &[$(stringify!($f)),*];
                        let names: Vec<&str> = names.iter().copied().filter(|n| !own.contains(n)).collect();
                        return Err($crate::options::unexpected($call, &key, &names));
                    }
                }
            }
        }
        given
    }};
}
pub(crate) use set_options;

/// Sets the fields of the kernel options struct `$target` (of type `$fields`' struct) that
/// the keyword options `$kwargs` (`Option<&Bound<PyDict>>`) name, for the function `$call`
/// whose parameters `$own` are its own (a positional `capacity`); returns the names given a
/// value (not `None`).
/// An unknown keyword is a `TypeError` naming the kernel options the function takes.
macro_rules! options {
    ($fields:ident, $kwargs:expr, $call:expr, $own:expr, $target:expr) => {{
        use $crate::options::set_options;
        stowplan_kernel::$fields!(set_options { $kwargs, $call, $own, $target; })
    }};
}
pub(crate) use options;

/// Python's error for an unexpected keyword, with the options `call` takes.
pub(crate) fn unexpected(call: &str, key: &str, names: &[&str]) -> PyErr {
    PyTypeError::new_err(format!(
        "{call}() got an unexpected keyword argument '{key}' (besides the parameters of its signature, it takes the kernel options {})",
        names.join(", ")
    ))
}
