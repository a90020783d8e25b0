//! Every slime oracle vector (`vectors/slime/`, made by running slime's own code) against the
//! native kernel and the WASM kernel, and the two backends against each other on random
//! schedules.

use stowplan::Kernel;
use stowplan_conformance::slime::check_slime_vector;
use stowplan_conformance::{load_dir, vectors_dir};

#[path = "../../kernel/tests/support/slime.rs"]
mod slime_support;
use stowplan::peers::slime::{PythonSum, ScheduleArgs};

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

mod backends_agree {
    use super::slime_support::schedule_args;
    use proptest::prelude::*;
    use stowplan::Kernel;
    use stowplan::peers::slime::{Arg, FlopsArgs};

    fn qwen_like() -> FlopsArgs {
        FlopsArgs {
            hidden_size: Arg::Int(4096),
            num_attention_heads: Arg::Int(32),
            num_query_groups: Arg::Int(8),
            vocab_size: Arg::Int(151_936),
            ffn_hidden_size: Arg::Int(12_288),
            num_experts: Arg::None,
            num_layers: Arg::Int(36),
            kv_channels: Arg::Int(128),
            ..FlopsArgs::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The WASM kernel gives the native kernel's schedule (floats included) on random
        /// FLOPs-balanced input, both float sums, one or two virtual pipeline stages (and so
        /// groups of one or two micro-batches).
        #[test]
        fn native_and_wasm_schedules_are_identical(
            lengths in proptest::collection::vec(0i64..40_000, 1..200),
            a in schedule_args(1..9, 1000..40_000, 1..4, 1..3),
        ) {
            let rids: Vec<i64> = (0..lengths.len() as i64).map(|i| i / 2).collect();
            let wasm = Kernel::wasm().expect("the WASM kernel loads");
            let native = Kernel::native();
            let w = wasm.slime().build_dp_schedule(&a, &qwen_like(), &lengths, &rids).expect("runs");
            let n = native.slime().build_dp_schedule(&a, &qwen_like(), &lengths, &rids).expect("runs");
            prop_assert_eq!(w, n);
            let f = |k: &Kernel| k.slime().calculate_fwd_flops(&[lengths[0] as u64], &qwen_like()).expect("runs");
            prop_assert_eq!(format!("{:?}", f(&wasm)), format!("{:?}", f(&native)));
        }
    }
}
