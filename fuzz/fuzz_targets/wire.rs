//! Every framed format (`stowplan::wire::FORMATS`): the raw input through each decoder (the
//! frame check must refuse it cleanly), and the input as the *body* of a correctly framed
//! message of each format (so the fuzzer reaches postcard and the semantic checks behind the
//! CRC). Whatever decodes must encode again, and that encoding must decode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stowplan::serve::{ControlMessage, DeliveryMark, Message, RankMessage, Receipts, Refusal};
use stowplan::wire::{FORMATS, Format};
use stowplan::{materialize::MaterializedBatch, packer::{PackerState, RankBatch}, TrainingBatch};

/// `body` framed as a message of `format`.
fn frame(format: &Format, body: &[u8]) -> Vec<u8> {
    let mut out = format.magic.to_vec();
    out.extend_from_slice(&format.version.to_le_bytes());
    out.extend_from_slice(body);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes `bytes` with `decode`; if it decodes, `encode ∘ decode` must be a fixed point.
fn check<T>(bytes: &[u8], decode: impl Fn(&[u8]) -> Result<T, stowplan::Error>, encode: impl Fn(&T) -> Vec<u8>) {
    if let Ok(value) = decode(bytes) {
        let once = encode(&value);
        let again = decode(&once).expect("an encoding decodes");
        assert_eq!(encode(&again), once, "encode ∘ decode is not stable");
    }
}

fn all(bytes: &[u8]) {
    check(bytes, TrainingBatch::decode, |v| v.encode().expect("encodes"));
    check(bytes, RankBatch::decode, |v| v.encode().expect("encodes"));
    check(bytes, PackerState::decode, |v| v.encode().expect("encodes"));
    check(bytes, MaterializedBatch::decode, |v| v.encode().expect("encodes"));
    check(bytes, RankMessage::decode, |v| v.encode().expect("encodes"));
    check(bytes, Receipts::decode, |v| v.encode().expect("encodes"));
    check(bytes, Refusal::decode, |v| v.encode().expect("encodes"));
    check(bytes, ControlMessage::decode, |v| v.encode().expect("encodes"));
    check(bytes, DeliveryMark::decode, |v| v.encode().expect("encodes"));
    let _ = Message::decode(bytes);
}

fuzz_target!(|data: &[u8]| {
    all(data);
    for format in FORMATS {
        all(&frame(format, data));
    }
});
