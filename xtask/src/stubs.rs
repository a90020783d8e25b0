//! `cargo xtask stubs`: writes the Python stubs of the kernel's result records
//! (`sdk-python/python/stowplan/_stubs/_records.pyi`) from the WIT (`wit/`), with its docs;
//! `cargo xtask check-stubs` fails when the committed file is not what the WIT gives.
//!
//! The WIT is the one home of a result field's name, type and meaning: the JavaScript SDK
//! takes jco's TypeScript types of it (`sdk-js/scripts/build.mjs`), and the Python stubs of
//! [`RECORDS`] take their fields from this file. wit-parser (the Bytecode Alliance's, the
//! version wasmtime already locks) reads the WIT as the component tools do.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;

use wit_parser::{Docs, Record, Resolve, Type, TypeDefKind};

/// The generated file of the result records, from the workspace root.
pub const OUT: &str = "sdk-python/python/stowplan/_stubs/_records.pyi";
/// The generated file of the keyword options, from the workspace root.
pub const OPTIONS_OUT: &str = "sdk-python/python/stowplan/_stubs/_options.pyi";

/// A kernel options record whose fields a Python function takes as keyword options (its
/// binding sets them through the kernel struct's own field list, `sdk-python/src/options.rs`).
struct KeywordOptions {
    /// The WIT interface that defines it.
    interface: &'static str,
    /// The record's name there.
    record: &'static str,
    /// The function that takes them (a method as `Class.method`).
    function: &'static str,
    /// Fields the function takes as parameters of its own.
    own: &'static [&'static str],
}

/// The records whose fields Python functions take as `**options`.
const OPTIONS: &[KeywordOptions] = &[
    KeywordOptions { interface: "partition", record: "options", function: "partition", own: &[] },
    KeywordOptions { interface: "pack", record: "options", function: "pack", own: &["capacity"] },
    KeywordOptions {
        interface: "plan",
        record: "plan-options",
        function: "StaticPackPlan.from_lengths",
        own: &["capacity"],
    },
];

/// A kernel record a Python result class holds as fields (its stub's base class).
struct Stubbed {
    /// The WIT interface that defines it.
    interface: &'static str,
    /// The record's name there.
    record: &'static str,
    /// Its groups field (a `groups` record), held flat as `offsets` and the members' name.
    groups: Option<(&'static str, &'static str)>,
    /// Fields the Python class does not hold as they are, and why.
    skip: &'static [(&'static str, &'static str)],
}

/// The records whose fields the Python results hold.
const RECORDS: &[Stubbed] = &[
    Stubbed { interface: "partition", record: "partitioning", groups: Some(("groups", "indices")), skip: &[] },
    Stubbed { interface: "pack", record: "packing", groups: Some(("bins", "indices")), skip: &[] },
    Stubbed { interface: "balance", record: "micro-plan", groups: Some(("batches", "indices")), skip: &[] },
    Stubbed { interface: "balance", record: "dp-plan", groups: Some(("ranks", "order")), skip: &[] },
    Stubbed {
        interface: "layout",
        record: "cp-split",
        groups: None,
        skip: &[
            ("run-offsets", "held as the per-rank `gather` positions"),
            ("run-starts", "held as the per-rank `gather` positions"),
            ("run-lengths", "held as the per-rank `gather` positions"),
        ],
    },
];

/// `kebab-case` → `snake_case`.
fn snake(name: &str) -> String {
    name.replace('-', "_")
}

/// `kebab-case` → `_UpperCamel`, the private base class of a record.
fn class(record: &str) -> String {
    let mut out = String::from("_");
    for word in record.split('-') {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    out
}

/// The WIT docs as a Python docstring body: a name in backticks that is a record field or a
/// function parameter of the WIT (`names`) becomes its Python snake_case; anything else in
/// backticks (an enum case such as `next-fit`, an expression such as `n-1`) stays as written.
fn docstring(docs: &Docs, names: &HashSet<String>) -> Option<String> {
    let text = docs.contents.as_deref()?.trim();
    let mut out = String::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            out.push('`');
            out.push_str(&if names.contains(part) { snake(part) } else { part.to_string() });
            out.push('`');
        } else {
            out.push_str(part);
        }
    }
    Some(out.replace('\\', "\\\\").replace("\"\"\"", "\\\"\\\"\\\""))
}

/// The names the docs may quote: every record field and function parameter of the WIT.
fn wit_names(resolve: &Resolve) -> HashSet<String> {
    let fields = resolve.types.iter().filter_map(|(_, t)| match &t.kind {
        TypeDefKind::Record(r) => Some(r.fields.iter().map(|f| f.name.clone()).collect::<Vec<_>>()),
        _ => None,
    });
    let params = resolve
        .interfaces
        .iter()
        .map(|(_, i)| i.functions.values().flat_map(|f| f.params.iter().map(|p| p.name.clone())).collect::<Vec<_>>());
    fields.chain(params).flatten().collect()
}

/// `"""…"""` at `indent`, one line or several.
fn write_doc(out: &mut String, indent: &str, doc: &str) {
    if doc.contains('\n') || doc.ends_with('"') {
        let body = doc.lines().map(|l| if l.is_empty() { String::new() } else { format!("{indent}{l}") });
        let _ = writeln!(out, "{indent}\"\"\"{}\n{indent}\"\"\"", body.collect::<Vec<_>>().join("\n").trim_start());
    } else {
        let _ = writeln!(out, "{indent}\"\"\"{doc}\"\"\"");
    }
}

/// The Python type of a field of WIT type `ty` as the results hold it (lists of numbers as
/// numpy arrays).
fn py_type(resolve: &Resolve, ty: &Type) -> Result<String, String> {
    Ok(match ty {
        Type::Bool => "bool".into(),
        Type::U8 | Type::U16 | Type::U32 | Type::U64 | Type::S8 | Type::S16 | Type::S32 | Type::S64 => "int".into(),
        Type::F32 | Type::F64 => "float".into(),
        Type::String | Type::Char => "str".into(),
        Type::ErrorContext => return Err("error-context has no Python type".into()),
        Type::Id(id) => match &resolve.types[*id].kind {
            TypeDefKind::Type(inner) => py_type(resolve, inner)?,
            TypeDefKind::Option(inner) => format!("Optional[{}]", py_type(resolve, inner)?),
            TypeDefKind::List(inner) => match dtype(inner) {
                Some(d) => format!("npt.NDArray[np.{d}]"),
                None => format!("List[{}]", py_type(resolve, inner)?),
            },
            other => return Err(format!("no Python type for a field of kind {}", other.as_str())),
        },
    })
}

/// The Python type of a keyword option of WIT type `ty` (`None` is every option's default).
fn option_type(resolve: &Resolve, ty: &Type) -> Result<String, String> {
    Ok(match ty {
        Type::Id(id) => match &resolve.types[*id].kind {
            TypeDefKind::Type(inner) => return option_type(resolve, inner),
            TypeDefKind::Enum(e) => {
                // The names as the kernel parses them: `_` for `-` too (`next_fit`).
                let mut cases: Vec<String> = e.cases.iter().map(|c| format!("\"{}\"", c.name)).collect();
                cases
                    .extend(e.cases.iter().filter(|c| c.name.contains('-')).map(|c| format!("\"{}\"", snake(&c.name))));
                format!("Optional[Literal[{}]]", cases.join(", "))
            }
            TypeDefKind::Option(inner) => format!("Optional[{}]", py_type(resolve, inner)?),
            _ => format!("Optional[{}]", py_type(resolve, ty)?),
        },
        _ => format!("Optional[{}]", py_type(resolve, ty)?),
    })
}

/// `function`'s options class, `pack` → `_PackOptions`, `StaticPackPlan.from_lengths` →
/// `_FromLengthsOptions`.
fn options_class(function: &str) -> String {
    let name = function.rsplit('.').next().unwrap_or(function);
    format!("{}Options", class(&name.replace('_', "-")))
}

/// The numpy dtype of a list of `ty`, for numbers.
fn dtype(ty: &Type) -> Option<&'static str> {
    Some(match ty {
        Type::U8 => "uint8",
        Type::U16 => "uint16",
        Type::U32 => "uint32",
        Type::U64 => "uint64",
        Type::S8 => "int8",
        Type::S16 => "int16",
        Type::S32 => "int32",
        Type::S64 => "int64",
        Type::F32 => "float32",
        Type::F64 => "float64",
        _ => return None,
    })
}

/// The record `name` of interface `interface`.
fn record<'a>(resolve: &'a Resolve, interface: &str, name: &str) -> Result<(&'a Record, &'a Docs), String> {
    let iface = resolve
        .interfaces
        .iter()
        .map(|(_, i)| i)
        .find(|i| i.name.as_deref() == Some(interface))
        .ok_or_else(|| format!("the WIT has no interface {interface}"))?;
    let id = iface.types.get(name).ok_or_else(|| format!("interface {interface} has no type {name}"))?;
    let def = &resolve.types[*id];
    match &def.kind {
        TypeDefKind::Record(r) => Ok((r, &def.docs)),
        TypeDefKind::Type(Type::Id(alias)) => match &resolve.types[*alias].kind {
            TypeDefKind::Record(r) => Ok((r, &def.docs)),
            _ => Err(format!("{interface}.{name} is not a record")),
        },
        _ => Err(format!("{interface}.{name} is not a record")),
    }
}

/// The generated stub files, ([`OUT`], text) and ([`OPTIONS_OUT`], text), from the WIT
/// package in `wit`.
pub fn generate(wit: &Path) -> Result<Vec<(&'static str, String)>, String> {
    let mut resolve = Resolve::default();
    resolve.push_dir(wit).map_err(|e| format!("reading {}: {e:#}", wit.display()))?;
    let names = wit_names(&resolve);
    Ok(vec![(OUT, records(&resolve, &names)?), (OPTIONS_OUT, options(&resolve, &names)?)])
}

/// The stub file of [`OPTIONS`]: one `TypedDict` per function, its fields the record's but
/// the function's own parameters.
fn options(resolve: &Resolve, names: &HashSet<String>) -> Result<String, String> {
    let mut out = String::from(
        "\"\"\"The keyword options of the functions that take a kernel options record as ``**options``:\n\
         names, types and docs from the WIT (``wit/``); every option may be omitted or ``None`` (the\n\
         kernel's default).\n\n\
         Generated by ``cargo xtask stubs`` (``xtask/src/stubs.rs``): do not edit. CI runs ``cargo\n\
         xtask check-stubs``, which fails when this file is not what the WIT gives.\"\"\"\n\n\
         from typing import Literal, Optional\n\n\
         from typing_extensions import TypedDict\n",
    );
    for o in OPTIONS {
        let (rec, docs) = record(resolve, o.interface, o.record)?;
        for own in o.own {
            if !rec.fields.iter().any(|f| f.name == *own) {
                return Err(format!("{}.{} has no field {own} to leave to {}", o.interface, o.record, o.function));
            }
        }
        let _ = write!(out, "\nclass {}(TypedDict, total=False):\n", options_class(o.function));
        let _ = write!(
            out,
            "    \"\"\"The keyword options of :func:`{}`:\n    the fields of the kernel's `{}` record (interface `{}`)",
            o.function, o.record, o.interface
        );
        if o.own.is_empty() {
            let _ = writeln!(out, ".");
        } else {
            let _ = writeln!(out, " but {}.", o.own.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "));
        }
        if let Some(doc) = docstring(docs, names) {
            let _ = writeln!(out);
            for line in doc.lines() {
                let _ = writeln!(out, "{}", if line.is_empty() { String::new() } else { format!("    {line}") });
            }
        }
        let _ = writeln!(out, "    \"\"\"\n");
        for field in rec.fields.iter().filter(|f| !o.own.contains(&f.name.as_str())) {
            let _ = writeln!(out, "    {}: {}", snake(&field.name), option_type(resolve, &field.ty)?);
            if let Some(doc) = docstring(&field.docs, names) {
                write_doc(&mut out, "    ", &doc);
            }
        }
    }
    Ok(out)
}

/// The stub file of [`RECORDS`].
fn records(resolve: &Resolve, names: &HashSet<String>) -> Result<String, String> {
    let (groups, _) = record(resolve, "types", "groups")?;
    if groups.fields.iter().map(|f| f.name.as_str()).ne(["offsets", "indices"]) {
        return Err("types.groups is not the record { offsets, indices } this generator flattens".into());
    }
    let mut out = String::from(
        "\"\"\"The kernel's result records as the Python results hold them: fields, types and docs from\n\
         the WIT (``wit/``), each record a private base class of its result's stub.\n\n\
         Generated by ``cargo xtask stubs`` (``xtask/src/stubs.rs``): do not edit. CI runs ``cargo\n\
         xtask check-stubs``, which fails when this file is not what the WIT gives.\"\"\"\n\n\
         from typing import List, Optional\n\n\
         import numpy as np\n\
         import numpy.typing as npt\n",
    );
    for s in RECORDS {
        let (rec, docs) = record(resolve, s.interface, s.record)?;
        let _ = write!(out, "\nclass {}:\n", class(s.record));
        let _ =
            writeln!(out, "    \"\"\"The fields of the kernel's `{}` record (interface `{}`).", s.record, s.interface);
        if let Some(doc) = docstring(docs, names) {
            let _ = writeln!(out);
            for line in doc.lines() {
                let _ = writeln!(out, "{}", if line.is_empty() { String::new() } else { format!("    {line}") });
            }
        }
        let _ = writeln!(out, "    \"\"\"\n");
        for name in s.skip.iter().map(|(n, _)| n) {
            if !rec.fields.iter().any(|f| f.name == *name) {
                return Err(format!("{}.{} has no field {name} to skip", s.interface, s.record));
            }
        }
        for field in rec.fields.iter().filter(|f| !s.skip.iter().any(|(n, _)| *n == f.name)) {
            if let Some((_, members)) = s.groups.filter(|(g, _)| *g == field.name) {
                // Flat: the groups field's own doc goes to the members, the boundaries say
                // what they delimit.
                let bounds = format!(
                    "Boundaries into `{members}`: group `g` is `{members}[offsets[g]:offsets[g + 1]]` (one entry \
                     more than there are groups, the first 0)."
                );
                let flat = "Flat, group after group, delimited by `offsets`.";
                let doc = docstring(&field.docs, names).map_or(flat.to_string(), |d| format!("{d}\n\n{flat}"));
                for (g, (name, doc)) in groups.fields.iter().zip([("offsets", bounds), (members, doc)]) {
                    let _ = writeln!(out, "    {name}: {}", py_type(resolve, &g.ty)?);
                    write_doc(&mut out, "    ", &doc);
                }
                continue;
            }
            let _ = writeln!(out, "    {}: {}", snake(&field.name), py_type(resolve, &field.ty)?);
            if let Some(doc) = docstring(&field.docs, names) {
                write_doc(&mut out, "    ", &doc);
            }
        }
    }
    Ok(out)
}
