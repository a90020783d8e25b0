//! Every slime oracle vector (`vectors/slime/`, made by running slime's own code) against the
//! native kernel and the WASM kernel, and the two backends against each other on random
//! schedules.

use stowplan::Kernel;
use stowplan_conformance::slime::check_slime_vector;
use stowplan_conformance::{load_dir, vectors_dir};

#[test]
fn slime_vectors_on_both_backends() {
    let vectors: Vec<_> =
        load_dir(&vectors_dir().join("slime")).into_iter().filter(|(n, _)| n != "index.json").collect();
    assert!(vectors.len() >= 150, "expected the slime vectors, found {}", vectors.len());
    let mut failures = Vec::new();
    for (backend, kernel) in [("native", Kernel::native()), ("wasm", Kernel::wasm().expect("the WASM kernel loads"))] {
        for (name, v) in &vectors {
            if let Err(e) = check_slime_vector(&kernel, v) {
                failures.push(format!("{backend} {name}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
