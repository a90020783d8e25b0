//! The length readers of the CLI and `stowplan plan`: any text gives lengths or an error
//! whose message stays short (errors quote a bounded excerpt).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = stowplan::input::parse_lengths(text) {
        assert!(e.to_string().len() < 1024, "a long error message");
    }
    for column in 0..4 {
        if let Err(e) = stowplan::input::parse_column(text, column) {
            assert!(e.to_string().len() < 1024, "a long error message");
        }
    }
});
