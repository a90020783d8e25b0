//! The seeded shuffle of data sources: a documented PRNG, so every host (Rust, WASM,
//! Python, a reimplementation) produces the same permutation for `(n, seed, epoch)`.
//!
//! - Generator: SplitMix64. State `s0 = seed + epoch · 0x9E3779B97F4A7C15` (wrapping); each
//!   draw adds `0x9E3779B97F4A7C15` to the state and returns
//!   `z = (z ^ (z >> 30)) · 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) · 0x94D049BB133111EB;
//!   z ^ (z >> 31)` of the new state (all wrapping, 64-bit).
//! - Bounded draw in `0..m` (Lemire): `x = draw()`, `p = x · m` as 128-bit, `lo = p mod 2^64`;
//!   if `lo < m`, let `t = (2^64 − m) mod m` and redraw while `lo < t`; the result is
//!   `p >> 64`.
//! - Permutation: start from the identity `[0, 1, …, n−1]`; for `i` from `n−1` down to 1,
//!   swap positions `i` and `j = bounded(i + 1)` (Fisher–Yates).

use alloc::vec::Vec;

use crate::{Error, invalid};

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The generator described in the module docs.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The generator of `(seed, epoch)`.
    pub fn new(seed: u64, epoch: u64) -> Self {
        Self { state: seed.wrapping_add(epoch.wrapping_mul(GOLDEN)) }
    }

    /// The next 64-bit draw.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw in `0..m` (`m ≥ 1`), without modulo bias.
    pub fn bounded(&mut self, m: u64) -> u64 {
        let mut p = u128::from(self.next_u64()) * u128::from(m);
        let mut lo = p as u64;
        if lo < m {
            let t = m.wrapping_neg() % m;
            while lo < t {
                p = u128::from(self.next_u64()) * u128::from(m);
                lo = p as u64;
            }
        }
        (p >> 64) as u64
    }
}

/// The permutation of `0..n` for `(seed, epoch)`: position `k` of the shuffled order holds
/// item `permutation[k]`.
///
/// Errors: `invalid-argument` for `n` above 2^32 − 1.
pub fn permutation(n: u64, seed: u64, epoch: u64) -> Result<Vec<u32>, Error> {
    if n > u64::from(u32::MAX) {
        return invalid!("n = {n} is above the supported {} items", u32::MAX);
    }
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut rng = SplitMix64::new(seed, epoch);
    for i in (1..order.len()).rev() {
        let j = rng.bounded(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    Ok(order)
}
