//! `stowplan partition`: split lengths (weights) into K groups with balanced sums.

use std::fmt;

use serde::Serialize;
use stowplan::json::Groups;
use stowplan::kernel::{PartitionMethod, PartitionOptions};

use crate::common::{Common, KernelRun, ReadyKernel, min_max, name, named, print_report};
use crate::failure::Failure;

/// The options of `stowplan partition`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of groups (≥ 1, ≤ number of lengths).
    #[arg(long, short = 'k', default_value_t = 8)]
    k: u32,
    /// Every group gets exactly n / k items (n must be a multiple of k).
    #[arg(long)]
    equal_size: bool,
    /// Algorithm: Karmarkar–Karp, greedy LPT, or verl 0.9.1's exact output.
    #[arg(long, value_parser = named::<PartitionMethod>(), default_value_t = PartitionMethod::default())]
    method: PartitionMethod,
    /// Skip the pairwise move/swap refinement (kk and greedy only; verl never refines).
    #[arg(long)]
    no_refine: bool,
    /// Input, backend and output format.
    #[command(flatten)]
    common: Common,
}

/// What `stowplan partition` reports.
#[derive(Debug, Serialize)]
struct Report {
    /// The partition.
    #[serde(flatten)]
    result: Groups,
    /// Always `partition`.
    operation: &'static str,
    /// Where the lengths came from.
    source: String,
    /// The algorithm.
    #[serde(serialize_with = "name")]
    method: PartitionMethod,
    /// Whether every group got n / k items.
    equal_size: bool,
    /// Whether the refinement ran.
    refine: bool,
    /// Number of lengths.
    n: usize,
    /// Number of groups.
    k: u32,
    /// Largest group sum.
    max: u64,
    /// Smallest group sum.
    min: u64,
    /// Kernel and timings.
    #[serde(flatten)]
    run: KernelRun,
}

/// Runs `stowplan partition`.
pub fn run(a: Args) -> Result<(), Failure> {
    let text = a.common.input.read()?;
    let lengths = text.lengths()?;
    let refine = !a.no_refine && a.method != PartitionMethod::Verl;
    let options = PartitionOptions { method: a.method, equal_size: a.equal_size, refine };
    let kernel = ReadyKernel::new(a.common.backend)?;
    let (p, run) = kernel.timed(|k| k.partition(&lengths, a.k, &options))?;
    let report = Report {
        result: Groups::from(&p),
        operation: "partition",
        source: text.source,
        method: a.method,
        equal_size: a.equal_size,
        refine,
        n: lengths.len(),
        k: a.k,
        max: p.sums.iter().copied().max().unwrap_or(0),
        min: p.sums.iter().copied().min().unwrap_or(0),
        run,
    };
    print_report(&report, a.common.json)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.result;
        writeln!(f, "partition of {} lengths from {} into {} groups", self.n, self.source, self.k)?;
        writeln!(
            f,
            "  method {} ({}{}), backend {}",
            self.method,
            if self.equal_size { "equal size" } else { "unequal size" },
            if self.refine { ", refined" } else { "" },
            self.run.backend
        )?;
        writeln!(f, "  total        {:>14} tokens", r.total)?;
        writeln!(f, "  lower bound  {:>14} tokens  (max of ceil(total/k), longest item)", r.lower_bound)?;
        let excess = self.max.saturating_sub(r.lower_bound);
        writeln!(
            f,
            "  largest      {:>14} tokens  (+{excess} over the bound, {:.4}%)",
            self.max,
            100.0 * excess as f64 / r.lower_bound.max(1) as f64
        )?;
        writeln!(f, "  smallest     {:>14} tokens", self.min)?;
        writeln!(f, "  spread       {:>14} tokens  (largest − smallest)", r.spread)?;
        let (lo, hi) = min_max(r.groups.iter().map(Vec::len));
        writeln!(f, "  group sizes  {lo}..{hi} items")?;
        self.run.time_line(f, 13, 14)
    }
}
