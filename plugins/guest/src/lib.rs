//! Write stowplan buffer filters in Rust.
//!
//! A buffer filter is a WebAssembly component of the world `stowplan:filter/buffer-filter`
//! (`wit/filter/filter.wit` documents the contract and the sandbox). This crate holds the
//! bindings and helpers to read the columnar [`Buffer`]:
//!
//! ```ignore
//! use stowplan_filter_guest::{Buffer, Context, Guest};
//!
//! struct NewestFirst;
//!
//! impl Guest for NewestFirst {
//!     fn select(ctx: Context, buffer: Buffer) -> Result<Vec<u32>, String> {
//!         Ok((0..buffer.groups() as u32).rev().take(ctx.wanted as usize).collect())
//!     }
//! }
//!
//! stowplan_filter_guest::export_filter!(NewestFirst);
//! ```
//!
//! Build with `cargo build --release --target wasm32-wasip2` (a `cdylib` crate); the `.wasm`
//! in `target/wasm32-wasip2/release/` is the component to load.

use std::ops::Range;

/// The generated bindings of `stowplan:filter/buffer-filter`.
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "buffer-filter",
        pub_export_macro: true,
        export_macro_name: "export_filter",
        default_bindings_module: "stowplan_filter_guest::bindings",
    });
}

pub use bindings::stowplan::filter::types::{Buffer, Context};

/// The generation status of a sample (the byte of `Buffer::status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// 0: not generated yet.
    Pending,
    /// 1: generation finished.
    Completed,
    /// 2: generation stopped at the length limit.
    Truncated,
    /// 3: generation was aborted.
    Aborted,
}
pub use bindings::export_filter;
pub use bindings::exports::stowplan::filter::filter::Guest;

fn span(starts: &[u32], i: usize) -> Range<usize> {
    starts[i] as usize..starts[i + 1] as usize
}

impl Buffer {
    /// Number of buffered groups.
    pub fn groups(&self) -> usize {
        self.group_start.len().saturating_sub(1)
    }

    /// Number of buffered samples (all groups).
    pub fn samples(&self) -> usize {
        self.index.len()
    }

    /// The samples of group `g` (positions into the per-sample lists).
    pub fn group_samples(&self, g: usize) -> Range<usize> {
        span(&self.group_start, g)
    }

    /// The rewards of sample `i` (empty when it was not scored).
    pub fn sample_rewards(&self, i: usize) -> &[f64] {
        &self.rewards[span(&self.reward_start, i)]
    }

    /// The status of sample `i` (`None` for a byte this version does not know).
    pub fn sample_status(&self, i: usize) -> Option<Status> {
        match self.status[i] {
            0 => Some(Status::Pending),
            1 => Some(Status::Completed),
            2 => Some(Status::Truncated),
            3 => Some(Status::Aborted),
            _ => None,
        }
    }

    /// The label of sample `i`, if it has one.
    pub fn label(&self, i: usize) -> Option<&str> {
        if self.has_label[i] == 0 {
            return None;
        }
        std::str::from_utf8(&self.labels[span(&self.label_start, i)]).ok()
    }

    /// The metadata of sample `i` as JSON object text.
    pub fn metadata_json(&self, i: usize) -> &str {
        std::str::from_utf8(&self.metadata[span(&self.metadata_start, i)]).unwrap_or("{}")
    }

    /// The rewards at `reward_index` of the samples of group `g` (samples without that many
    /// rewards are skipped).
    pub fn group_rewards(&self, g: usize, reward_index: usize) -> impl Iterator<Item = f64> + '_ {
        self.group_samples(g).filter_map(move |i| self.sample_rewards(i).get(reward_index).copied())
    }

    /// The mean of [`Self::group_rewards`], or `None` when no sample of the group has it.
    pub fn group_mean_reward(&self, g: usize, reward_index: usize) -> Option<f64> {
        let (mut sum, mut n) = (0.0, 0usize);
        let starts = &self.reward_start[self.group_start[g] as usize..=self.group_start[g + 1] as usize];
        for w in starts.windows(2) {
            let at = w[0] as usize + reward_index;
            if at < w[1] as usize {
                sum += self.rewards[at];
                n += 1;
            }
        }
        (n > 0).then(|| sum / n as f64)
    }
}

/// The first `min(wanted, groups)` positions: first in, first out (slime's `pop_first`).
pub fn fifo(ctx: &Context, buffer: &Buffer) -> Vec<u32> {
    (0..buffer.groups().min(ctx.wanted as usize) as u32).collect()
}
