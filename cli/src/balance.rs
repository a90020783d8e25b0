//! `stowplan balance`: balance a global batch over DP ranks and/or split it into
//! micro-batches of at most CAPACITY tokens, balancing a cost model.

use std::fmt;

use serde::Serialize;
use stowplan::json::{Levels, Micro};
use stowplan::kernel::{Balance, Cost, DpOptions, MicroBatches, MicroLimits, MicroOptions, Order, TwoLevelBalance};

use crate::common::{Common, CostJson, CostText, KernelRun, ReadyKernel, min_max, named, print_report};
use crate::failure::Failure;
use crate::limits::{Limits, check_limits, parse_limit, read_table, split_rows};

/// The options of `stowplan balance`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of data-parallel ranks (≥ 1). With 1, only micro-batches are planned.
    #[arg(long, default_value_t = 1)]
    dp: u32,
    /// Hard cap on the tokens of a micro-batch. Without it, only the DP level is planned.
    #[arg(long)]
    capacity: Option<u64>,
    /// The former name of --capacity, accepted with a warning for one release.
    #[arg(long, hide = true, conflicts_with = "capacity")]
    max_token_len: Option<u64>,
    /// Cost of a sequence of L tokens: `tokens` (L), `attention` (24576·L + L², verl's and
    /// ROLL's workload) or `A,B` for A·L + B·L².
    #[arg(long, default_value_t = Cost::default(), value_parser = |s: &str| s.parse::<Cost>())]
    cost: Cost,
    /// At least this many micro-batches per rank.
    #[arg(long, default_value_t = MicroOptions::new(1).min_count)]
    min_count: u32,
    /// Round the micro-batch count up to a multiple of this (virtual pipeline stages).
    #[arg(long, default_value_t = MicroOptions::new(1).divisible_by)]
    divisible_by: u32,
    /// Exactly this many micro-batches per rank (e.g. a count agreed across ranks).
    #[arg(long)]
    count: Option<u32>,
    /// Order of the micro-batches: input order, cost descending, verl's or ROLL's
    /// cheapest-at-both-ends order.
    #[arg(long, value_parser = named::<Order>(), default_value_t = Order::default())]
    order: Order,
    /// Balance each run of this many consecutive samples separately (verl's keep_minibatch).
    #[arg(long)]
    minibatch_size: Option<u32>,
    /// Runs of this many consecutive samples (e.g. one prompt's rollouts) stay on one rank.
    #[arg(long)]
    group_size: Option<u32>,
    /// Allow ranks to get different sample counts (needed with groups of different sizes).
    #[arg(long)]
    unequal_count: bool,
    /// Another cap per micro-batch besides --capacity, NAME=CAP (vision-language
    /// batches: --limit image_tokens=8192 --limit images=32). The input is then a table whose
    /// header names its columns, tokens first (tab-, comma- or space-separated, as
    /// `vlm-mix-100k.tsv`), and NAME is a column. Up to 7 limits; every micro-batch of every
    /// rank stays within every one, with one count for all ranks.
    #[arg(long = "limit", value_name = "NAME=CAP", value_parser = parse_limit)]
    limits: Vec<(String, u64)>,
    /// A column of the input table (its header's NAME, e.g. image_tokens) whose values are
    /// added to each sample's cost: the ranks and micro-batches balance the cost model plus
    /// it (a vision encoder's work beside the language model's).
    #[arg(long, value_name = "NAME")]
    extra_cost: Option<String>,
    /// Input, backend and output format.
    #[command(flatten)]
    common: Common,
}

/// What the kernel planned.
#[derive(Debug)]
enum Planned {
    /// Micro-batches of the whole batch (`--dp 1`).
    Micro(MicroBatches),
    /// The DP level only (no `--capacity`).
    Dp(Balance),
    /// Both levels.
    Both(TwoLevelBalance),
}

/// The report's view of `planned` for `lengths`, with every micro-batch's loads in the
/// limits whose sizes `table` gives.
fn levels(planned: &Planned, lengths: &[u64], table: &Table) -> Result<Levels, Failure> {
    let levels = match planned {
        Planned::Micro(m) => Levels::micro(m),
        Planned::Dp(d) => Levels::dp(d, lengths),
        Planned::Both(p) => Levels::both(p, lengths),
    };
    Ok(levels.with_resource_loads(&table.sizes, table.caps.len()).map_err(stowplan::Error::from)?)
}

/// What `stowplan balance` reports.
#[derive(Debug, Serialize)]
struct Report {
    /// The plan.
    #[serde(flatten)]
    levels: Levels,
    /// Always `balance`.
    operation: &'static str,
    /// Where the lengths came from.
    source: String,
    /// Number of lengths.
    n: usize,
    /// Number of DP ranks.
    dp_size: u32,
    /// The micro-batch cap, if micro-batches were planned.
    capacity: Option<u64>,
    /// The cost model balanced.
    #[serde(serialize_with = "cost_json")]
    cost: Cost,
    /// `--extra-cost`: the column added to each sample's cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    extra_cost: Option<String>,
    /// With `--limit`: every limit (the tokens first), with the fullest micro-batch's load and
    /// ⌈Σ sizes / cap⌉ micro-batches over all ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<Limits>,
    /// Kernel and timings.
    #[serde(flatten)]
    run: KernelRun,
}

/// Serializes a cost as `{"linear": A, "quadratic": B}`.
fn cost_json<S: serde::Serializer>(cost: &Cost, s: S) -> Result<S::Ok, S::Error> {
    CostJson::from(*cost).serialize(s)
}

/// The further columns of a `balance` input table: the limits' sizes and the extra costs.
#[derive(Debug, Default)]
struct Table {
    /// Each sample's size in each limit, sample by sample (`caps.len()` a sample).
    sizes: Vec<u64>,
    /// Each limit's cap.
    caps: Vec<u64>,
    /// Each limit's name.
    names: Vec<String>,
    /// `--extra-cost`'s column, one value per sample.
    extra: Option<Vec<u64>>,
}

impl Table {
    /// The lengths of `text` and, with `--limit` or `--extra-cost`, the table's further
    /// columns (a column both limits and adds to the cost is read once).
    fn read(a: &Args, text: &crate::input::Text) -> Result<(Vec<u64>, Self), Failure> {
        check_limits(&a.limits)?;
        let mut columns: Vec<&str> = a.limits.iter().map(|(n, _)| n.as_str()).collect();
        let extra_at = a.extra_cost.as_deref().map(|x| {
            columns.iter().position(|&n| n == x).unwrap_or_else(|| {
                columns.push(x);
                columns.len() - 1
            })
        });
        let (_, rows) = read_table(text, &columns)?;
        let table = Self {
            caps: a.limits.iter().map(|&(_, c)| c).collect(),
            names: a.limits.iter().map(|(n, _)| n.clone()).collect(),
            ..Self::default()
        };
        if columns.is_empty() {
            return Ok((rows, table));
        }
        let w = columns.len();
        let (lengths, rest) = split_rows(&rows, w + 1);
        let e = table.caps.len();
        let sizes = rest.chunks(w).flat_map(|r| r[..e].iter().copied()).collect();
        let extra = extra_at.map(|q| rest.iter().skip(q).step_by(w).copied().collect());
        Ok((lengths, Self { sizes, extra, ..table }))
    }

    /// The kernel's limits.
    fn limits(&self) -> MicroLimits<'_> {
        MicroLimits { sizes: &self.sizes, caps: &self.caps, names: &self.names }
    }

    /// Every limit of a report (tokens first, capped at `capacity`), over the
    /// micro-batches of `levels`.
    fn report(&self, lengths: &[u64], capacity: u64, levels: &Levels) -> Option<Limits> {
        if self.caps.is_empty() {
            return None;
        }
        let e = self.caps.len();
        let mut names = vec!["tokens".to_string()];
        names.extend(self.names.iter().cloned());
        let mut caps = vec![capacity];
        caps.extend(&self.caps);
        let total = |q: usize| -> u128 {
            if q == 0 {
                lengths.iter().map(|&l| u128::from(l)).sum()
            } else {
                self.sizes.iter().skip(q - 1).step_by(e).map(|&s| u128::from(s)).sum()
            }
        };
        let bounds: Vec<u64> =
            (0..=e).map(|q| u64::try_from(total(q).div_ceil(u128::from(caps[q]))).unwrap_or(u64::MAX).max(1)).collect();
        let ranks = levels.micro_batches.as_ref().map_or(&[][..], Micro::ranks);
        let rows: Vec<Vec<u64>> = ranks
            .iter()
            .flat_map(|m| m.tokens.iter().zip(&m.resource_loads).map(|(&t, l)| [&[t][..], l].concat()))
            .collect();
        Some(Limits::new(names, &caps, 0, &bounds, rows.iter().map(Vec::as_slice)))
    }
}

/// Runs `stowplan balance`.
pub fn run(a: Args) -> Result<(), Failure> {
    let capacity = crate::common::capacity("balance", a.capacity, ("max-token-len", a.max_token_len));
    if capacity.is_none() && !a.limits.is_empty() {
        // (Checked here rather than by clap, whose message would show the former, hidden name.)
        return Err(Failure::bad("--limit needs --capacity T: the limits cap micro-batches besides their tokens"));
    }
    if a.dp == 1 && capacity.is_none() {
        return Err(Failure::bad(
            "nothing to plan: give --dp N (N > 1) for DP balancing and/or --capacity T for micro-batches",
        ));
    }
    let text = a.common.input.read()?;
    let (lengths, table) = Table::read(&a, &text)?;
    // Groups only matter to the DP level (none with --dp 1, as before).
    let labels = a
        .group_size
        .filter(|_| a.dp > 1)
        .map(|g| stowplan::kernel::group_labels(lengths.len(), g.into(), !a.unequal_count))
        .transpose()?;
    let dp_options = DpOptions {
        cost: a.cost,
        groups: labels.as_deref(),
        minibatch_size: a.minibatch_size,
        equal_count: !a.unequal_count,
        extra_costs: table.extra.as_deref(),
    };
    let micro = capacity.map(|cap| MicroOptions {
        capacity: cap,
        cost: a.cost,
        min_count: a.min_count,
        divisible_by: a.divisible_by,
        count: a.count,
        order: a.order,
    });
    let limits = (!table.caps.is_empty()).then(|| table.limits());
    let kernel = ReadyKernel::new(a.common.backend)?;
    let (planned, run) = kernel.timed(|k| {
        Ok(match &micro {
            Some(m) if a.dp == 1 => {
                Planned::Micro(k.micro_batches(&lengths, dp_options.extra_costs, limits.as_ref(), m)?.plan)
            }
            Some(m) => Planned::Both(k.plan(&lengths, a.dp, &dp_options, m, limits.as_ref())?),
            None => Planned::Dp(k.balance_dp(&lengths, a.dp, &dp_options)?),
        })
    })?;
    let levels = levels(&planned, &lengths, &table)?;
    let report = Report {
        limits: table.report(&lengths, capacity.unwrap_or(0), &levels),
        levels,
        operation: "balance",
        source: text.source,
        n: lengths.len(),
        dp_size: a.dp,
        capacity,
        cost: a.cost,
        extra_cost: a.extra_cost,
        run,
    };
    print_report(&report, a.common.json)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cap = self.capacity.map(|c| format!(", micro-batches ≤ {c} tokens")).unwrap_or_default();
        writeln!(f, "balance of {} lengths from {}: dp {}{cap}", self.n, self.source, self.dp_size)?;
        let extra = self.extra_cost.as_deref().map(|c| format!(" + {c}")).unwrap_or_default();
        writeln!(f, "  cost {}{extra}, backend {}", CostText(self.cost), self.run.backend)?;
        if let Some(dp) = &self.levels.dp {
            let (lo, hi) = min_max(dp.ranks.iter().map(Vec::len));
            writeln!(f, "  ranks              {:>12}  ({lo}..{hi} samples each)", dp.ranks.len())?;
            writeln!(f, "  rank cost          {}", dp.cost_balance)?;
            let (max, lb) = (dp.cost_balance.max, dp.cost_lower_bound);
            writeln!(
                f,
                "  costliest rank     {max:>12}  (lower bound {lb}, +{:.4}%)",
                100.0 * max.saturating_sub(lb) as f64 / lb.max(1) as f64
            )?;
            writeln!(f, "  rank tokens        {}", dp.token_balance)?;
            if let Some(u) = &dp.verl_unbalance {
                writeln!(
                    f,
                    "  verl unbalance     before {}..{}, after {}..{} tokens",
                    u.figures.min, u.figures.max, u.figures.balanced_min, u.figures.balanced_max
                )?;
            }
        }
        if let Some(micro) = &self.levels.micro_batches {
            let ranks = micro.ranks();
            if let Some(first) = ranks.first() {
                let lb = ranks.iter().map(|m| m.lower_bound).max().unwrap_or(0);
                let required = ranks.iter().map(|m| m.required).max().unwrap_or(0);
                writeln!(
                    f,
                    "  micro-batches      {:>12}  per rank (lower bound {lb}, the cap requires {required})",
                    first.count
                )?;
                let tokens = self.levels.micro_batch_token_balance.unwrap_or(first.token_balance);
                let costs = self.levels.micro_batch_cost_balance.unwrap_or(first.cost_balance);
                writeln!(f, "  largest mb tokens  {:>12}  (cap {})", tokens.max, self.capacity.unwrap_or(0))?;
                writeln!(f, "  mb cost            {costs}")?;
            }
        }
        if let Some(l) = &self.limits {
            l.write(f, "micro-batch", "micro-batches")?;
        }
        self.run.time_line(f, 19, 12)
    }
}
