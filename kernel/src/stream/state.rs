//! The packer's state as bytes: [`StreamPacker::state`] and [`StreamPacker::from_state`]
//! (`SPSK`, framed, versioned, sha256).

use alloc::vec::Vec;

use sha2::{Digest, Sha256};

use super::{MAX_BIN_ITEMS, StreamOptions, StreamPacker};
use crate::{Error, OversizePolicy, invalid};

impl StreamPacker {
    /// The whole state as bytes: `SPSK`, format version (u32 LE), payload length (u64 LE),
    /// the payload, and the sha256 of everything before it. The same state gives the same
    /// bytes in every host.
    pub fn state(&self) -> Vec<u8> {
        let mut p = Vec::new();
        write_options(&mut p, &self.options);
        p.extend_from_slice(&self.next_index.to_le_bytes());
        let mut items = self.buffer.items();
        items.sort_unstable_by_key(|&(_, index)| index);
        p.extend_from_slice(&(items.len() as u32).to_le_bytes());
        for (a, index) in items {
            p.extend_from_slice(&index.to_le_bytes());
            p.extend_from_slice(&a.to_le_bytes());
        }
        let open = self.open.by_age();
        p.extend_from_slice(&(open.len() as u32).to_le_bytes());
        for b in open {
            let bin = &self.open.bins[b];
            let mut members = bin.members.clone();
            members.sort_unstable();
            p.extend_from_slice(&bin.room.to_le_bytes());
            p.extend_from_slice(&(members.len() as u32).to_le_bytes());
            for m in members {
                p.extend_from_slice(&m.to_le_bytes());
            }
        }
        frame(STATE_MAGIC, STATE_VERSION, &p)
    }

    /// A packer from [`state`](Self::state)'s bytes. Errors (`invalid-argument`, naming what is
    /// wrong): not a stream state, another format version, a length or checksum mismatch
    /// (damage), or contents no packer can hold (checked in full, so no state can make a
    /// later call misbehave).
    pub fn from_state(state: &[u8]) -> Result<Self, Error> {
        let mut r = Reader { bytes: unframe(state, STATE_MAGIC, STATE_VERSION, "stream-packer")? };
        let options = read_options(&mut r)?;
        let mut packer = Self::new(options)?;
        packer.next_index = r.u64()?;
        let buffered = r.count(16, options.max_buffered, "buffered items")?;
        let mut held: Vec<u64> = Vec::new();
        for _ in 0..buffered {
            let index = r.u64()?;
            let a = r.u64()?;
            if a > options.capacity || a % options.align != 0 {
                return invalid!("state holds a buffered length {a} that is not an aligned length ≤ the capacity");
            }
            if held.last().is_some_and(|&last| index <= last) {
                return invalid!("state's buffered items are not in ascending index order");
            }
            held.push(index);
            packer.buffer.push(a, index);
        }
        let open = r.count(12, options.max_open_bins, "open bins")?;
        for _ in 0..open {
            let room = r.u64()?;
            if room == 0 || room > options.capacity {
                return invalid!("state holds an open bin with room {room}, outside 1..={}", options.capacity);
            }
            let count = r.count(8, MAX_BIN_ITEMS as u32 - 1, "members of an open bin")?;
            if count == 0 {
                return invalid!("state holds an empty open bin");
            }
            let mut members = Vec::with_capacity(count as usize);
            for _ in 0..count {
                members.push(r.u64()?);
            }
            held.extend_from_slice(&members);
            let b = packer.open.new_bin();
            packer.open.bins[b].room = room;
            packer.open.bins[b].members = members;
            packer.open.index(b);
        }
        check_end(&r, held, packer.next_index)?;
        Ok(packer)
    }
}

const STATE_MAGIC: &[u8; 4] = b"SPSK";
const STATE_VERSION: u32 = 1;

/// The checks that end a restore: nothing after the contents, and the indices the state
/// holds (buffered or in open bins) each once and below the next index to add.
pub(super) fn check_end(r: &Reader<'_>, mut held: Vec<u64>, next_index: u64) -> Result<(), Error> {
    if !r.bytes.is_empty() {
        return invalid!("state has {} bytes after its contents", r.bytes.len());
    }
    held.sort_unstable();
    if held.windows(2).any(|w| w[0] == w[1]) || held.last().is_some_and(|&last| last >= next_index) {
        return invalid!("state holds an index twice or an index not yet added");
    }
    Ok(())
}

/// A packer's options as saved: capacity, align (u64 LE), the bounds (u32 LE), the oversize
/// policy's byte.
pub(super) fn write_options(p: &mut Vec<u8>, o: &StreamOptions) {
    p.extend_from_slice(&o.capacity.to_le_bytes());
    p.extend_from_slice(&o.align.to_le_bytes());
    p.extend_from_slice(&o.max_open_bins.to_le_bytes());
    p.extend_from_slice(&o.max_buffered.to_le_bytes());
    p.push(oversize_code(o.oversize));
}

/// Options written by [`write_options`] (checked by the packer that takes them).
pub(super) fn read_options(r: &mut Reader<'_>) -> Result<StreamOptions, Error> {
    Ok(StreamOptions {
        capacity: r.u64()?,
        align: r.u64()?,
        max_open_bins: r.u32()?,
        max_buffered: r.u32()?,
        oversize: oversize_of(r.u8()?)?,
    })
}

/// The byte an oversize policy is saved as.
fn oversize_code(o: OversizePolicy) -> u8 {
    match o {
        OversizePolicy::Error => 0,
        OversizePolicy::Single => 1,
        OversizePolicy::Drop => 2,
    }
}

/// The oversize policy saved as `code`.
fn oversize_of(code: u8) -> Result<OversizePolicy, Error> {
    match code {
        0 => Ok(OversizePolicy::Error),
        1 => Ok(OversizePolicy::Single),
        2 => Ok(OversizePolicy::Drop),
        other => invalid!("state holds an unknown oversize policy code {other}"),
    }
}

/// A framed state: `magic`, format `version` (u32 LE), payload length (u64 LE), the payload,
/// and the sha256 of everything before it.
pub(super) fn frame(magic: &[u8; 4], version: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 48);
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out
}

/// The payload of a [`frame`]d state of a `what` (for messages), checked: its magic, its
/// version, its length and its sha256.
pub(super) fn unframe<'a>(state: &'a [u8], magic: &[u8; 4], version: u32, what: &str) -> Result<&'a [u8], Error> {
    const HEAD: usize = 16;
    if state.len() < 4 || &state[..4] != magic {
        let m = core::str::from_utf8(magic).unwrap_or("?");
        return invalid!("state is not a stowplan {what} state (it must start with \"{m}\")");
    }
    if state.len() < HEAD + 32 {
        return invalid!(
            "state is damaged: {} bytes, fewer than a {what} state's {} bytes of header and sha256 (truncated)",
            state.len(),
            HEAD + 32
        );
    }
    let got = u32::from_le_bytes(state[4..8].try_into().unwrap_or_default());
    if got != version {
        return invalid!(
            "state has format version {got}; this kernel reads version {version} (save it with the same stowplan version)"
        );
    }
    let len = u64::from_le_bytes(state[8..16].try_into().unwrap_or_default());
    if len != (state.len() - HEAD - 32) as u64 {
        return invalid!(
            "state is damaged: its header says {len} payload bytes, it holds {} (truncated or extended)",
            state.len() - HEAD - 32
        );
    }
    let (body, digest) = state.split_at(state.len() - 32);
    if Sha256::digest(body).as_slice() != digest {
        return invalid!("state is damaged: its sha256 does not match its contents");
    }
    Ok(&body[HEAD..])
}

/// Reads little-endian integers off a payload, failing on a short one.
pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        if self.bytes.len() < N {
            return invalid!("state is damaged: its payload ends early");
        }
        let (head, rest) = self.bytes.split_at(N);
        self.bytes = rest;
        Ok(head.try_into().unwrap_or([0; N]))
    }
    pub(super) fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take::<1>()?[0])
    }
    pub(super) fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    pub(super) fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    /// A count of records of at least `record` bytes each, at most `max`, that the
    /// remaining bytes can hold (so nothing is allocated for a count alone).
    pub(super) fn count(&mut self, record: usize, max: u32, what: &str) -> Result<u32, Error> {
        let n = self.u32()?;
        if n > max {
            return invalid!("state holds {n} {what}; its options allow at most {max}");
        }
        if (n as usize).saturating_mul(record) > self.bytes.len() {
            return invalid!("state is damaged: {n} {what} do not fit in its payload");
        }
        Ok(n)
    }
}
