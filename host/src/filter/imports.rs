//! A plugin's imports: read from its bytes before compiling, and the ones it may have.

use wasmtime::Engine;
use wasmtime::component::Component;

/// The filter package's types-only interface, which toolchains may list as an import.
pub(super) const FILTER_TYPES: &str = "stowplan:filter/types@";

/// Whether a plugin may import `name`: a WASI 0.2 interface or the filter's types (the
/// linker then checks each WASI interface exactly).
pub(super) fn allowed_import(name: &str) -> bool {
    (name.starts_with("wasi:") && name.contains("@0.2.")) || name.starts_with(FILTER_TYPES)
}

/// The names a component's top level imports, read from its bytes without compiling them;
/// an error if the bytes are not a WebAssembly component.
pub(super) fn declared_imports(bytes: &[u8]) -> Result<Vec<String>, String> {
    use wasmparser::{Encoding, Parser, Payload};
    let mut names = Vec::new();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| format!("not a WebAssembly component: {e}"))? {
            Payload::Version { encoding, .. } if depth == 0 && encoding != Encoding::Component => {
                return Err(
                    "not a WebAssembly component (a core module: wrap it with `wasm-tools component new`)".into()
                );
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    let import = import.map_err(|e| format!("not a WebAssembly component: {e}"))?;
                    names.push(import.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(names)
}

/// The component's imports as names (`wasi:cli/environment@0.2.0`, …).
pub(super) fn imports(engine: &Engine, component: &Component) -> Vec<String> {
    component.component_type().imports(engine).map(|(name, _)| name.to_string()).collect()
}
