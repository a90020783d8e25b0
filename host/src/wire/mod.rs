//! The one envelope of every byte stowplan persists or transports, and the table of formats.
//!
//! A message is `magic (4 bytes) · version (u16 LE) · postcard payload · CRC-32 (u32 LE)`,
//! the CRC (IEEE, as `crc32fast` computes it) covering everything before it. [`decode`]
//! checks, in order: length, magic, version, CRC, then that postcard reads the whole
//! payload; every failure is an [`Error::InvalidArgument`] naming the format and what is
//! wrong, so damaged bytes are refused, never delivered. Each kind of message has one
//! [`Format`] constant here; [`FORMATS`] lists them all (ARCHITECTURE.md shows the table).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;

/// A framed format: its four magic bytes, the version this build writes and reads, and what
/// it is called in messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    /// The first four bytes of every message of this format.
    pub magic: [u8; 4],
    /// The version written; another version is refused on read.
    pub version: u16,
    /// A name for error messages ("training batch").
    pub what: &'static str,
}

/// Bytes before the payload: magic and version.
pub const HEADER_LEN: usize = 6;
/// Bytes after the payload: the CRC-32.
pub const TRAILER_LEN: usize = 4;

/// A training batch an orchestrator sends to the packer (`TrainingBatch`).
pub const TRAINING_BATCH: Format = Format { magic: *b"SPTB", version: 4, what: "training batch" };
/// A control message to the packer: add or remove a run (`serve::Control`).
pub const CONTROL: Format = Format { magic: *b"SPCT", version: 3, what: "control message" };
/// One rank's share of a packed step (`RankBatch`), a file or a ZeroMQ message.
pub const RANK_BATCH: Format = Format { magic: *b"SPRB", version: 3, what: "rank batch" };
/// The packer's checkpoint (`PackerState`, `STATE/state.bin`).
pub const PACKER_STATE: Format = Format { magic: *b"SPPS", version: 8, what: "packer state" };
/// A trainer rank's hello or acknowledgement over ZeroMQ (`serve::RankMessage`).
pub const RANK_MESSAGE: Format = Format { magic: *b"SPRM", version: 2, what: "rank message" };
/// The packer's receipts for durable messages over ZeroMQ (`serve::Receipts`).
pub const RECEIPTS: Format = Format { magic: *b"SPRC", version: 3, what: "receipts" };
/// The packer's refusal of a rank's hello (`serve::Refusal`).
pub const REFUSAL: Format = Format { magic: *b"SPRX", version: 2, what: "refusal" };
/// One materialized micro-batch (`MaterializedBatch::encode`).
pub const MICRO_BATCH: Format = Format { magic: *b"SPMB", version: 3, what: "micro-batch" };
/// The per-sample length cache of static packing (`DIR/lengths.splc`).
pub const LENGTH_CACHE: Format = Format { magic: *b"SPLC", version: 2, what: "length cache" };
/// A rollout data source's saved state, buffer included (`DataSource::save`).
pub const DATA_SOURCE_STATE: Format = Format { magic: *b"SPDS", version: 2, what: "data source state" };
/// How far the filesystem transport's packer has delivered (`ROOT/delivered.bin`): the
/// evidence that survives ranks consuming their step files (`serve::DeliveryMark`).
pub const DELIVERY_MARK: Format = Format { magic: *b"SPDM", version: 1, what: "delivery mark" };
/// An in-process packer's checkpoint with the ranks that acknowledged its step in flight
/// (`DIR/packer_state.bin`, `serve::CheckpointDir`: the Ray actor's).
pub const ACTOR_CHECKPOINT: Format = Format { magic: *b"SPAC", version: 1, what: "packer checkpoint" };

/// Every framed format, for documentation and for the tests that damage each kind.
pub const FORMATS: &[Format] = &[
    TRAINING_BATCH,
    CONTROL,
    RANK_BATCH,
    PACKER_STATE,
    RANK_MESSAGE,
    RECEIPTS,
    REFUSAL,
    MICRO_BATCH,
    LENGTH_CACHE,
    DATA_SOURCE_STATE,
    DELIVERY_MARK,
    ACTOR_CHECKPOINT,
];

impl Format {
    /// Whether `bytes` start with this format's magic (a cheap dispatch test; [`decode`]
    /// still checks everything).
    pub fn matches(&self, bytes: &[u8]) -> bool {
        bytes.starts_with(&self.magic)
    }

    /// The magic as text, for messages.
    fn magic_text(&self) -> String {
        String::from_utf8_lossy(&self.magic).into_owned()
    }
}

/// Frames `value` in `format`. `hint` is a guess of the payload size (to allocate once).
pub fn encode<T: Serialize + ?Sized>(format: &Format, value: &T, hint: usize) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(HEADER_LEN + hint + TRAILER_LEN);
    out.extend_from_slice(&format.magic);
    out.extend_from_slice(&format.version.to_le_bytes());
    let mut out = postcard::to_extend(value, out)
        .map_err(|e| Error::InvalidArgument(format!("{} encoding failed: {e}", format.what)))?;
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Reads a message framed by [`encode`] in `format`; errors name what is wrong with the bytes
/// (not this kind of message, another version, damaged, truncated, trailing bytes).
pub fn decode<T: DeserializeOwned>(format: &Format, bytes: &[u8]) -> Result<T, Error> {
    let payload = payload(format, bytes)?;
    let bad = |m: String| Error::InvalidArgument(format!("bytes: {m}"));
    let (value, rest): (T, &[u8]) =
        postcard::take_from_bytes(payload).map_err(|e| bad(format!("corrupt {}: {e}", format.what)))?;
    if !rest.is_empty() {
        return Err(bad(format!("{} trailing bytes after the {}", rest.len(), format.what)));
    }
    Ok(value)
}

/// The checked payload of a message in `format` (magic, version and CRC verified).
fn payload<'a>(format: &Format, bytes: &'a [u8]) -> Result<&'a [u8], Error> {
    let bad = |m: String| Error::InvalidArgument(format!("bytes: {m}"));
    if !format.matches(bytes) {
        return Err(bad(format!(
            "not an encoded stowplan {} (missing the {} header)",
            format.what,
            format.magic_text()
        )));
    }
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(bad(format!("truncated {}: {} bytes", format.what, bytes.len())));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != format.version {
        return Err(bad(format!("{} format version {version}; this build reads {}", format.what, format.version)));
    }
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    let recorded = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let actual = crc32fast::hash(body);
    if recorded != actual {
        return Err(bad(format!(
            "damaged {}: CRC-32 {actual:08x} of its {} bytes, recorded {recorded:08x}",
            format.what,
            bytes.len()
        )));
    }
    Ok(&body[HEADER_LEN..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_single_bit_flip_is_refused() {
        let value: (u32, String, Vec<u64>) = (7, "seven".into(), vec![1, 2, 3]);
        let bytes = encode(&RANK_BATCH, &value, 16).expect("encodes");
        assert_eq!(decode::<(u32, String, Vec<u64>)>(&RANK_BATCH, &bytes).expect("decodes"), value);
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(decode::<(u32, String, Vec<u64>)>(&RANK_BATCH, &damaged).is_err(), "bit {bit} accepted");
        }
        for len in 0..bytes.len() {
            assert!(decode::<(u32, String, Vec<u64>)>(&RANK_BATCH, &bytes[..len]).is_err(), "{len} bytes accepted");
        }
    }

    #[test]
    fn errors_name_the_format_and_the_problem() {
        let bytes = encode(&RECEIPTS, &1u8, 1).expect("encodes");
        let err = decode::<u8>(&RANK_BATCH, &bytes).unwrap_err().to_string();
        assert!(err.contains("not an encoded stowplan rank batch"), "{err}");
        let mut other = bytes.clone();
        other[4] = 9;
        let err = decode::<u8>(&RECEIPTS, &other).unwrap_err().to_string();
        assert!(err.contains(&format!("receipts format version 9; this build reads {}", RECEIPTS.version)), "{err}");
        let mut longer = bytes[..bytes.len() - TRAILER_LEN].to_vec();
        longer.push(0);
        longer.extend_from_slice(&crc32fast::hash(&longer).to_le_bytes());
        let err = decode::<u8>(&RECEIPTS, &longer).unwrap_err().to_string();
        assert!(err.contains("1 trailing bytes after the receipts"), "{err}");
    }

    #[test]
    fn magics_are_distinct() {
        let mut magics: Vec<[u8; 4]> = FORMATS.iter().map(|f| f.magic).collect();
        magics.sort_unstable();
        magics.dedup();
        assert_eq!(magics.len(), FORMATS.len());
    }
}
