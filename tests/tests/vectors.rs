//! Every conformance vector against the native kernel and the WASM kernel.

use stowplan::Kernel;
use stowplan_conformance::{check_stowplan_vector, check_verl_partition_vector, load_dir, vectors_dir};

fn kernels() -> Vec<(&'static str, Kernel)> {
    vec![("native", Kernel::native()), ("wasm", Kernel::wasm().expect("the WASM kernel loads"))]
}

#[test]
fn verl_partition_vectors() {
    let vectors = load_dir(&vectors_dir().join("verl"));
    let partition: Vec<_> = vectors.iter().filter(|(_, v)| v["kind"] == "partition").collect();
    assert!(partition.len() >= 36, "expected the 36 shared verl partition vectors, found {}", partition.len());
    let mut failures = Vec::new();
    for (backend, kernel) in kernels() {
        for (name, v) in &partition {
            if let Err(e) = check_verl_partition_vector(&kernel, v) {
                failures.push(format!("{backend} {name}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn stowplan_vectors() {
    let vectors = load_dir(&vectors_dir());
    assert!(vectors.len() >= 10, "expected stowplan's own vectors, found {}", vectors.len());
    let mut failures = Vec::new();
    for (backend, kernel) in kernels() {
        for (name, v) in &vectors {
            if let Err(e) = check_stowplan_vector(&kernel, v) {
                failures.push(format!("{backend} {name}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
