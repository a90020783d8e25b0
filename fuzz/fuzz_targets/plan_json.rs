//! Saved static pack plans (`StaticPackPlan::from_json`): any document loads as a verified
//! plan or is refused; a loaded plan saves to a document that loads to the same plan.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stowplan::StaticPackPlan;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    if let Ok(plan) = StaticPackPlan::from_json(&value) {
        let again = StaticPackPlan::from_json(&plan.to_json()).expect("a saved plan loads");
        assert_eq!(again, plan);
    }
});
