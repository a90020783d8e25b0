//! The structure ARCHITECTURE.md promises ("Layers (invariants)"), checked on the sources:
//! inside `host/src` a module uses only modules of its own row of the drawing or of the rows
//! drawn above it (the layers it sits on), and in no crate of the workspace does a top-level module use a module that uses it
//! back (directly or around a longer cycle), nor does a file of a module folder use a sibling
//! file that uses it back (`super::…` paths, seen through the folder's `mod.rs` re-exports).
//!
//! The sources are read as text: every `crate::name` outside comments is an edge from the
//! file's top-level module to `name`, and a name the crate root re-exports (`pub use
//! module::{Name, …}` in `lib.rs`) counts as its module, so an import through the re-exports
//! cannot hide an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The rows of the host's drawing in ARCHITECTURE.md, in the drawing's order (the foundation
/// first). `error.rs` and `input.rs` (the error type and input parsing) sit in the first row.
const HOST_ROWS: &[&[&str]] = &[
    &["error", "input", "kernel", "runtime", "wire"],
    &["materialize", "plan", "filter", "rows", "source"],
    &["packer"],
    &["serve"],
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every crate of the repository with a `src` folder (its path from the root), build output
/// and installed packages left out.
fn crates(dir: &Path, out: &mut Vec<String>) {
    if dir.join("Cargo.toml").exists() && dir.join("src").is_dir() {
        out.push(dir.strip_prefix(root()).expect("below the root").to_string_lossy().into_owned());
    }
    for entry in fs::read_dir(dir).expect("a readable folder") {
        let path = entry.expect("a folder entry").path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if path.is_dir() && !matches!(name.as_str(), "target" | "node_modules" | ".git" | "src") {
            crates(&path, out);
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` without its comments (`//…` to the end of the line; strings are not special-cased,
/// which no source here needs).
fn code(text: &str) -> String {
    text.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The first segment of every path after `prefix` (`crate::` or `super::`; the segments of a
/// `crate::{a::X, b}` group too).
fn refs_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        let rest = &code[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(group.split(',').map(|p| ident(p.trim())).filter(|s| !s.is_empty()));
        } else {
            out.push(ident(rest));
        }
    }
    out
}

fn crate_refs(code: &str) -> Vec<&str> {
    refs_after(code, "crate::")
}

/// Name → module of the crate root's `pub use module::…` re-exports.
fn reexports(root_code: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in root_code.split(';') {
        let Some(path) = stmt.trim().rsplit_once("pub use ").map(|(_, p)| p.trim()) else { continue };
        let module = ident(path).to_string();
        let names = match path.split_once('{') {
            // `Name as Alias` re-exports the alias.
            Some((_, names)) => names.split(',').map(|n| ident(n.trim().rsplit(' ').next().unwrap_or(""))).collect(),
            None => vec![ident(path.rsplit("::").next().unwrap_or(""))],
        };
        for n in names.into_iter().filter(|n| !n.is_empty() && *n != module) {
            out.insert(n.to_string(), module.clone());
        }
    }
    out
}

/// Top-level module → the crate's top-level modules it uses (the root itself excluded).
fn module_graph(krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join(krate).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let top = |f: &Path| {
        let rel = f.strip_prefix(&src).expect("below src");
        let first = rel.components().next().expect("a path below src").as_os_str().to_string_lossy().into_owned();
        first.trim_end_matches(".rs").to_string()
    };
    let modules: BTreeSet<String> = files.iter().map(|f| top(f)).filter(|m| m != "lib" && m != "main").collect();
    let root_code = ["lib.rs", "main.rs"]
        .iter()
        .map(|r| src.join(r))
        .find(|p| p.exists())
        .map(|p| code(&fs::read_to_string(p).expect("a readable source")));
    let names = root_code.as_deref().map(reexports).unwrap_or_default();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let from = top(f);
        if !modules.contains(&from) {
            continue;
        }
        for r in crate_refs(&code(&fs::read_to_string(f).expect("a readable source"))) {
            let to = names.get(r).map_or(r, String::as_str);
            if to != from && modules.contains(to) {
                graph.entry(from.clone()).or_default().insert(to.to_string());
            }
        }
    }
    graph
}

/// The cycles of `graph`: each strongly connected component of more than one module, sorted.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start.to_string()];
        while let Some(m) = todo.pop() {
            for n in graph.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for (m, r) in &reached {
        let component: Vec<String> =
            r.iter().filter(|n| *n == *m || reached.get(n).is_some_and(|back| back.contains(*m))).cloned().collect();
        if r.contains(*m) && component.len() > 1 && !out.contains(&component) {
            out.push(component);
        }
    }
    out
}

#[test]
fn host_modules_use_only_their_row_or_the_rows_they_sit_on() {
    let row = |m: &str| HOST_ROWS.iter().position(|r| r.contains(&m));
    let graph = module_graph("host");
    let mut wrong = Vec::new();
    for (from, tos) in &graph {
        let Some(level) = row(from) else {
            wrong.push(format!("{from} is in no row of the drawing (add it to HOST_ROWS and ARCHITECTURE.md)"));
            continue;
        };
        for to in tos {
            match row(to) {
                Some(l) if l <= level => {}
                Some(_) => wrong.push(format!("{from} (row {level}) uses {to}, a row that sits on it")),
                None => {
                    wrong.push(format!("{to} is in no row of the drawing (add it to HOST_ROWS and ARCHITECTURE.md)"))
                }
            }
        }
    }
    assert!(wrong.is_empty(), "the host's layers: {wrong:#?}");
    // The check sees the edges it should: serve sits on the packer, the packer on the wire.
    assert!(graph["serve"].contains("packer") && graph["packer"].contains("wire"), "{graph:#?}");
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut all = Vec::new();
    crates(&root(), &mut all);
    assert!(all.len() >= 6 && all.contains(&"host".to_string()) && all.contains(&"kernel".to_string()), "{all:?}");
    for krate in &all {
        let found = cycles(&module_graph(krate));
        assert!(found.is_empty(), "{krate}/src has module cycles: {found:?}");
    }
}

fn super_refs(code: &str) -> Vec<&str> {
    refs_after(code, "super::")
}

/// Name → sibling file of a folder's `mod.rs` `use` re-exports (`pub use`, `pub(crate) use` …).
fn folder_reexports(mod_code: &str) -> BTreeMap<String, String> {
    let public = mod_code.split(';').map(|stmt| {
        let stmt = stmt.trim();
        match stmt.find("use ") {
            Some(i) if stmt[..i].trim_start().starts_with("pub") => format!("pub use {}", &stmt[i + 4..]),
            _ => String::new(),
        }
    });
    reexports(&public.collect::<Vec<_>>().join(";\n"))
}

/// For every module folder of `krate` (a `mod.rs` beside other files), its files' use of each
/// other: file → the sibling files it names through `super::`.
fn folder_graphs(krate: &str) -> Vec<(PathBuf, BTreeMap<String, BTreeSet<String>>)> {
    let mut files = Vec::new();
    rust_files(&root().join(krate).join("src"), &mut files);
    let folders: BTreeSet<PathBuf> =
        files.iter().filter(|f| f.ends_with("mod.rs")).filter_map(|f| f.parent().map(Path::to_path_buf)).collect();
    let mut out = Vec::new();
    for dir in folders {
        let stem = |f: &Path| f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let siblings: BTreeSet<String> = fs::read_dir(&dir)
            .expect("a readable folder")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
            .map(|p| stem(&p))
            .filter(|s| s != "mod")
            .collect();
        let names = folder_reexports(&code(&fs::read_to_string(dir.join("mod.rs")).expect("a readable mod.rs")));
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in files.iter().filter(|f| f.parent() == Some(dir.as_path()) && !f.ends_with("mod.rs")) {
            let from = stem(f);
            for r in super_refs(&code(&fs::read_to_string(f).expect("a readable source"))) {
                let to = names.get(r).map_or(r, String::as_str);
                if to != from && siblings.contains(to) {
                    graph.entry(from.clone()).or_default().insert(to.to_string());
                }
            }
        }
        out.push((dir, graph));
    }
    out
}

#[test]
fn no_module_folder_has_files_that_use_each_other() {
    let mut all = Vec::new();
    crates(&root(), &mut all);
    let mut found = Vec::new();
    let mut folders = 0;
    for krate in &all {
        for (dir, graph) in folder_graphs(krate) {
            folders += 1;
            for cycle in cycles(&graph) {
                found.push(format!("{}: {cycle:?}", dir.strip_prefix(root()).unwrap_or(&dir).display()));
            }
        }
    }
    assert!(folders >= 5, "the check sees the module folders ({folders})");
    assert!(found.is_empty(), "files of a module folder use each other: {found:#?}");
}

#[test]
fn the_checks_see_through_reexports_groups_and_comments() {
    let text = "use crate::{a::X, b};\n// crate::commented\nfn f() -> crate::Y { crate::c::g() } /// crate::Doc\n";
    assert_eq!(crate_refs(&code(text)), ["a", "b", "Y", "c"]);
    let names = reexports(&code("mod a;\n#[cfg(x)]\npub use a::{X, Y as Z};\npub use b::W;\npub mod c;\n"));
    assert_eq!(names.get("X").map(String::as_str), Some("a"));
    assert_eq!(names.get("Z").map(String::as_str), Some("a"));
    assert_eq!(names.get("W").map(String::as_str), Some("b"));
    let graph: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .map(|(f, t)| (f.to_string(), BTreeSet::from([t.to_string()])))
        .collect();
    assert_eq!(cycles(&graph), [["a", "b", "c"]]);
    assert_eq!(super_refs(&code("use super::{a::X, B};\nfn f() { super::c::g() } // super::d\n")), ["a", "B", "c"]);
    let names = folder_reexports(&code("mod a;\npub use a::B;\npub(crate) use c::{D, E};\nuse f::G;\n"));
    assert_eq!(
        (names.get("B"), names.get("E"), names.get("G")),
        (Some(&"a".to_string()), Some(&"c".to_string()), None)
    );
}

/// The names a crate root offers: its public modules, the leaves of its `pub use` statements
/// (a group's every name, `X as Y` as `Y`) and its own public items.
fn root_names(root_code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for stmt in root_code.split(';') {
        if let Some((_, path)) = stmt.rsplit_once("pub use ") {
            let leaves = path.replace(['{', '}'], ",");
            for leaf in leaves.split(',').map(str::trim).filter(|l| !l.is_empty() && !l.ends_with("::")) {
                let name = leaf.rsplit(' ').next().unwrap_or(leaf).rsplit("::").next().unwrap_or(leaf);
                out.push(ident(name).to_string());
            }
        } else if let Some((_, name)) = stmt.rsplit_once("pub mod ") {
            out.push(ident(name.trim()).to_string());
        }
    }
    for line in root_code.lines() {
        for kind in ["fn", "struct", "enum", "const", "static", "trait", "type"] {
            if let Some(rest) = line.strip_prefix(&format!("pub {kind} ")) {
                out.push(ident(rest).to_string());
            }
        }
    }
    out.sort();
    out
}

/// ARCHITECTURE.md, "Code map": the host's root offers its modules and a handful of entry
/// types (at most 40 names), every other item lives in the module its path names, and no
/// deprecated alias is kept there.
#[test]
fn the_host_root_offers_its_modules_and_the_entry_types() {
    let text = code(&fs::read_to_string(root().join("host/src/lib.rs")).expect("host/src/lib.rs"));
    let names = root_names(&text);
    assert!(names.len() <= 40, "the host root offers {} names (at most 40): {names:?}", names.len());
    for module in ["kernel", "materialize", "packer", "peers", "rows", "runtime", "source", "serve", "wire"] {
        assert!(names.iter().any(|n| n == module), "the host root offers the module {module}: {names:?}");
    }
    assert!(!text.contains("deprecated"), "the host root keeps no deprecated alias");
    let kernel = code(&fs::read_to_string(root().join("kernel/src/lib.rs")).expect("kernel/src/lib.rs"));
    assert!(!kernel.contains("deprecated"), "the kernel root keeps no deprecated alias");
}

#[test]
fn root_names_counts_modules_group_leaves_aliases_and_items() {
    let text = "pub mod a;\n#[cfg(x)]\npub use a::{X, b::{Y, Z as W}};\npub use c::V;\nmod d;\npub fn f() {}\n";
    assert_eq!(root_names(&code(text)), ["V", "W", "X", "Y", "a", "f"]);
}

/// ARCHITECTURE.md, "Code map" (`sdk-python/`): one registration style in the Python SDK's
/// native layer. Every file that defines a Python function or class registers them itself
/// (`fn register(m)`), `lib.rs` calls each of those and registers nothing directly.
#[test]
fn every_python_binding_file_registers_its_own_items() {
    let src = root().join("sdk-python/src");
    let lib = code(&fs::read_to_string(src.join("lib.rs")).expect("sdk-python/src/lib.rs"));
    assert!(
        !lib.contains("add_function") && !lib.contains("add_class"),
        "sdk-python/src/lib.rs registers items itself; move them to their file's register"
    );
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut binding = 0;
    for f in &files {
        let text = code(&fs::read_to_string(f).expect("a readable source"));
        let stem = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        if !(text.contains("#[pyfunction") || text.contains("#[pyclass")) {
            continue;
        }
        binding += 1;
        assert!(text.contains("fn register("), "sdk-python/src/{stem}.rs defines Python items but has no register");
        assert!(lib.contains(&format!("{stem}::register(m)")), "sdk-python/src/lib.rs never calls {stem}::register");
    }
    assert!(binding >= 15, "the check sees the binding files ({binding})");
}

/// The interfaces `wit/<file>` declares, in order.
fn wit_interfaces(file: &str) -> Vec<String> {
    let text = fs::read_to_string(root().join("wit").join(file)).expect("a WIT file");
    text.lines().filter_map(|l| l.strip_prefix("interface ")).map(|l| ident_wit(l).to_string()).collect()
}

/// The WIT identifier (kebab-case) at the start of `s`.
fn ident_wit(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).unwrap_or(s.len());
    &s[..end]
}

/// ARCHITECTURE.md, `wit/`: stowplan's own operations are at most ten interfaces, the peers'
/// reproductions are in `peers.wit`, and the world exports exactly the interfaces of both.
#[test]
fn the_kernel_wit_is_ten_interfaces_at_most_beside_the_peers_file() {
    let own = wit_interfaces("kernel.wit");
    let peers = wit_interfaces("peers.wit");
    assert!(own.len() <= 10, "wit/kernel.wit has {} interfaces (at most 10): {own:?}", own.len());
    assert_eq!(peers, ["verl", "peers", "prime-rl", "slime", "trl"], "the peers' interfaces live in wit/peers.wit");
    let text = fs::read_to_string(root().join("wit/kernel.wit")).expect("wit/kernel.wit");
    let world = &text[text.find("world kernel {").expect("the kernel world")..];
    let mut exported: Vec<String> =
        world.lines().filter_map(|l| l.trim().strip_prefix("export ")).map(|l| ident_wit(l).to_string()).collect();
    let mut all: Vec<String> = own.iter().chain(&peers).cloned().collect();
    exported.sort();
    all.sort();
    assert_eq!(exported, all, "the world exports every interface of both files, and nothing else");
}

/// `KernelApi` holds stowplan's own operations, one method each (at most 18); the peers'
/// entry points are `Kernel`'s inherent methods (`host/src/kernel/peers.rs`).
#[test]
fn kernel_api_has_one_method_per_operation() {
    let api = code(&fs::read_to_string(root().join("host/src/kernel/api.rs")).expect("api.rs"));
    let methods: Vec<&str> = api.lines().filter_map(|l| l.strip_prefix("        fn ")).map(ident).collect();
    assert!(methods.len() <= 18, "KernelApi has {} methods (at most 18): {methods:?}", methods.len());
    for peer in ["verl", "trl_bfd", "prime_rl_ffd", "balance_batch", "roll_load_balance"] {
        assert!(!methods.contains(&peer), "KernelApi holds the peer's {peer}; it belongs in kernel/peers.rs");
    }
}

/// The choice "limits, extra costs or plain" is the kernel's (`kernel/src/ops.rs`): no caller
/// outside the kernel crate picks a variant of an operation by its options.
#[test]
fn the_limits_and_extra_costs_choice_is_written_once() {
    let variants = ["micro_batches_limited(", "micro_batches_with_extra(", "plan_limited(", "raw_plan_limited("];
    let mut files = Vec::new();
    for dir in ["host/src", "cli/src", "sdk-python/src", "kernel/wasm/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    for file in files {
        let text = code(&fs::read_to_string(&file).expect("a source file"));
        for v in variants {
            assert!(!text.contains(v), "{} calls {v}…): pass the options to the one operation", file.display());
        }
    }
}
