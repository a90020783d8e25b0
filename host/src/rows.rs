//! Packed rows of a table: which runs of a tokenized table's flat values make each
//! packed row of at most `capacity` tokens. The one home of the strategies (`bfd`, `ffd`,
//! `next-fit`, TRL's `bfd_split` and `wrapped`), the overflow policies (`truncate`, `split`,
//! `drop`, `error`), the output columns' names and the cut into record batches that the
//! SDK's `stowplan.arrow`/`stowplan.hf`/`stowplan.ray` and the CLI's `pack-dataset` apply,
//! and the crate `stowplan-arrow` assembles the packed rows from Arrow data. (`compat.trl` takes its items
//! from [`row_items`] but fits them by TRL's rule, per map batch, and cuts TRL's `wrapped`
//! rows itself: they are TRL's, not these.)
//!
//! A table's rows hold sequences of `lengths[r]` tokens, one after the other in the flat
//! values (row `r` starts at `Σ lengths[..r]`). An *item* is a run of a row's tokens (the
//! whole row, its first `capacity` tokens, or one fragment of it); a packed row is a list of
//! items. Empty rows carry no token and make no item.

use std::fmt;
use std::str::FromStr;

use crate::{
    Backend, Error, Kernel,
    kernel::{PackMethod, PackOptions},
};

/// How rows are packed: the kernel's plan under an [`Overflow`] policy, or `wrapped`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowStrategy {
    /// Best-fit decreasing (the default).
    Bfd,
    /// First-fit decreasing.
    Ffd,
    /// Next-fit in row order.
    NextFit,
    /// TRL's `bfd_split`: best-fit decreasing, a long row cut into fragments of at most
    /// `capacity` tokens (`bfd` with [`Overflow::Split`]).
    BfdSplit,
    /// Every token concatenated in row order and cut into rows of exactly `capacity` (the
    /// last one shorter).
    Wrapped,
}

impl RowStrategy {
    /// Every strategy, by name.
    pub const ALL: [RowStrategy; 5] =
        [RowStrategy::Bfd, RowStrategy::Ffd, RowStrategy::NextFit, RowStrategy::BfdSplit, RowStrategy::Wrapped];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            RowStrategy::Bfd => "bfd",
            RowStrategy::Ffd => "ffd",
            RowStrategy::NextFit => "next-fit",
            RowStrategy::BfdSplit => "bfd_split",
            RowStrategy::Wrapped => "wrapped",
        }
    }

    /// The strategies' names as an error lists them: `'bfd', 'ffd', … or 'wrapped'`.
    pub fn choices() -> String {
        alternatives(RowStrategy::ALL)
    }

    /// The kernel's packing method, `None` for `wrapped`.
    pub fn method(self) -> Option<PackMethod> {
        match self {
            RowStrategy::Bfd | RowStrategy::BfdSplit => Some(PackMethod::Bfd),
            RowStrategy::Ffd => Some(PackMethod::Ffd),
            RowStrategy::NextFit => Some(PackMethod::NextFit),
            RowStrategy::Wrapped => None,
        }
    }
}

impl fmt::Display for RowStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RowStrategy {
    type Err = Error;
    /// A strategy by its name; `next_fit` is read as `next-fit` too.
    fn from_str(s: &str) -> Result<Self, Error> {
        if s == "next_fit" {
            return Ok(RowStrategy::NextFit);
        }
        RowStrategy::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| Error::InvalidArgument(format!("strategy must be {} (got '{s}')", RowStrategy::choices())))
    }
}

/// What happens to a row longer than `capacity` under `bfd`, `ffd` and `next-fit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Its first `capacity` tokens are kept (the default, as in TRL's `bfd`).
    #[default]
    Truncate,
    /// It is cut into fragments of at most `capacity` tokens, packed as sequences of their
    /// own.
    Split,
    /// It is left out.
    Drop,
    /// [`Error::Infeasible`] names it.
    Error,
}

impl Overflow {
    /// Every policy, by name.
    pub const ALL: [Overflow; 4] = [Overflow::Truncate, Overflow::Split, Overflow::Drop, Overflow::Error];

    /// The policies' names as an error lists them.
    pub fn choices() -> String {
        alternatives(Overflow::ALL)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Overflow::Truncate => "truncate",
            Overflow::Split => "split",
            Overflow::Drop => "drop",
            Overflow::Error => "error",
        }
    }
}

impl fmt::Display for Overflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Overflow {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Overflow::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| Error::InvalidArgument(format!("overflow must be {} (got '{s}')", Overflow::choices())))
    }
}

/// `'a', 'b' or 'c'`.
fn alternatives<T: fmt::Display>(all: impl IntoIterator<Item = T>) -> String {
    let names: Vec<String> = all.into_iter().map(|n| format!("'{n}'")).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.concat(),
    }
}

/// A strategy with its overflow policy, checked together ([`RowPacking::parse`]): `bfd_split`
/// splits (an overflow of `split` or none), `wrapped` takes none, the others default to
/// [`Overflow::Truncate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowPacking {
    strategy: RowStrategy,
    overflow: Option<Overflow>,
}

impl RowPacking {
    /// `strategy` with `overflow` (by name, `None` for its default); errors name the argument
    /// and what it may be.
    pub fn parse(strategy: &str, overflow: Option<&str>) -> Result<Self, Error> {
        let strategy: RowStrategy = strategy.parse()?;
        let overflow = overflow.map(str::parse::<Overflow>).transpose()?;
        let overflow = match (strategy, overflow) {
            (RowStrategy::Wrapped, None) => None,
            (RowStrategy::Wrapped, Some(o)) => {
                return Err(Error::InvalidArgument(format!(
                    "overflow does not apply to strategy 'wrapped' (got '{o}'); leave it unset"
                )));
            }
            (RowStrategy::BfdSplit, None | Some(Overflow::Split)) => Some(Overflow::Split),
            (RowStrategy::BfdSplit, Some(o)) => {
                return Err(Error::InvalidArgument(format!(
                    "strategy 'bfd_split' splits long rows: overflow must be unset or 'split' (got '{o}')"
                )));
            }
            (_, o) => Some(o.unwrap_or_default()),
        };
        Ok(RowPacking { strategy, overflow })
    }

    /// The strategy.
    pub fn strategy(self) -> RowStrategy {
        self.strategy
    }

    /// The overflow policy; `None` for `wrapped` only.
    pub fn overflow(self) -> Option<Overflow> {
        self.overflow
    }
}

/// Items (runs of the flat values) in row order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowItems {
    /// Each item's first value in the flat values.
    pub starts: Vec<u64>,
    /// Each item's number of values (1..=`capacity`).
    pub lengths: Vec<u64>,
}

/// Packed rows: row `r` is the items `offsets[r]..offsets[r + 1]` (`starts[i]`, `lengths[i]`:
/// a run of the flat values), one after the other.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackedRows {
    /// Each item's first value in the flat values, in output order.
    pub starts: Vec<u64>,
    /// Each item's number of values, in output order.
    pub lengths: Vec<u64>,
    /// `rows + 1` offsets into the items.
    pub offsets: Vec<u64>,
}

impl PackedRows {
    /// The number of packed rows.
    pub fn rows(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The tokens before each packed row, and the total (`rows + 1` entries).
    pub fn row_tokens(&self) -> Vec<u64> {
        let (mut tokens, mut item) = (0u64, 0usize);
        self.offsets
            .iter()
            .map(|&o| {
                for &l in &self.lengths[item..o as usize] {
                    tokens += l;
                }
                item = o as usize;
                tokens
            })
            .collect()
    }
}

/// The longest row a plan takes (a plan's lengths are `u32`).
pub const MAX_ROW_LENGTH: u64 = u32::MAX as u64;

/// Each row's first value in the flat values (`Σ lengths[..r]`), and the total; errors when
/// the total does not fit an `i64` (the largest Arrow offset).
fn row_starts(lengths: &[u64]) -> Result<(Vec<u64>, u64), Error> {
    let mut starts = Vec::with_capacity(lengths.len());
    let mut at = 0u64;
    for &l in lengths {
        starts.push(at);
        at = at.checked_add(l).filter(|&t| t <= i64::MAX as u64).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "lengths: the rows hold more than 2**63-1 values in all (at row {})",
                starts.len() - 1
            ))
        })?;
    }
    Ok((starts, at))
}

/// The items of rows of `lengths` tokens under `overflow`, in row order: a row's tokens
/// (at most `capacity`: truncated), its fragments of `capacity` tokens and the remainder
/// (`split`), nothing for a row longer than `capacity` (`drop`), or [`Error::Infeasible`]
/// naming `column` and the first long row, numbered from `row0` (`error`). Empty rows make no
/// item. Errors: `capacity` 0.
pub fn row_items(
    lengths: &[u64],
    capacity: u64,
    overflow: Overflow,
    column: &str,
    row0: u64,
) -> Result<RowItems, Error> {
    if capacity == 0 {
        return Err(Error::InvalidArgument("capacity must be at least 1 (got 0)".into()));
    }
    let (starts, _) = row_starts(lengths)?;
    if overflow == Overflow::Error
        && let Some(row) = lengths.iter().position(|&l| l > capacity)
    {
        return Err(Error::Infeasible(format!(
            "column '{column}' row {} has {} values, more than capacity = {capacity} \
             (overflow='error'; 'truncate', 'split' or 'drop' handle it)",
            row0 + row as u64,
            lengths[row]
        )));
    }
    let mut items = RowItems::default();
    for (&start, &len) in starts.iter().zip(lengths) {
        if len == 0 || (overflow == Overflow::Drop && len > capacity) {
            continue;
        }
        if overflow == Overflow::Split {
            let mut at = 0;
            while at < len {
                items.starts.push(start + at);
                items.lengths.push((len - at).min(capacity));
                at += capacity;
            }
        } else {
            items.starts.push(start);
            items.lengths.push(len.min(capacity));
        }
    }
    Ok(items)
}

/// `wrapped`: every token of rows of `lengths` tokens, in row order, cut into packed rows of
/// exactly `capacity` tokens (the last one shorter); the items are the pieces of the rows
/// between row ends and cuts. Errors: `capacity` outside 1..=[`MAX_CAPACITY`].
pub fn wrapped_rows(lengths: &[u64], capacity: u64) -> Result<PackedRows, Error> {
    check_capacity(capacity)?;
    let (starts, _) = row_starts(lengths)?;
    let mut out = PackedRows::default();
    for (&start, &len) in starts.iter().zip(lengths) {
        let (mut at, end) = (start, start + len);
        while at < end {
            if at % capacity == 0 {
                out.offsets.push(out.starts.len() as u64);
            }
            let piece = (end - at).min(capacity - at % capacity);
            out.starts.push(at);
            out.lengths.push(piece);
            at += piece;
        }
    }
    out.offsets.push(out.starts.len() as u64);
    Ok(out)
}

/// Rows of `lengths` tokens packed by `packing` into rows of at most `capacity` tokens: for
/// the kernel's strategies, the items of [`row_items`] in the plan's bin order (a bin's items
/// ascending by input row, planned on a kernel of `backend`, made only then); for `wrapped`,
/// [`wrapped_rows`]. Errors name `column` and the row: `capacity` outside
/// 1..=[`MAX_CAPACITY`], a row longer than [`MAX_ROW_LENGTH`], and [`row_items`]'s.
pub fn pack_rows(
    backend: Backend,
    lengths: &[u64],
    capacity: u64,
    packing: RowPacking,
    column: &str,
) -> Result<PackedRows, Error> {
    check_capacity(capacity)?;
    check_row_lengths(lengths, column, 0)?;
    let Some(method) = packing.strategy.method() else {
        return wrapped_rows(lengths, capacity);
    };
    let items = row_items(lengths, capacity, packing.overflow.unwrap_or_default(), column, 0)?;
    if items.lengths.is_empty() {
        return Ok(PackedRows { offsets: vec![0], ..PackedRows::default() });
    }
    let kernel = Kernel::new(backend)?;
    let plan = kernel.pack(&items.lengths, &PackOptions { method, ..PackOptions::new(capacity) })?;
    let order = plan.indices.iter().map(|&i| i as usize);
    Ok(PackedRows {
        starts: order.clone().map(|i| items.starts[i]).collect(),
        lengths: order.map(|i| items.lengths[i]).collect(),
        offsets: plan.offsets.iter().map(|&o| u64::from(o)).collect(),
    })
}

/// Refuses a `capacity` outside 1..=[`MAX_CAPACITY`] (a packed row is one Arrow list).
pub fn check_capacity(capacity: u64) -> Result<(), Error> {
    if capacity == 0 || capacity > MAX_CAPACITY {
        return Err(Error::InvalidArgument(format!("capacity must be in 1..=2**31-1 (got {capacity})")));
    }
    Ok(())
}

/// The largest `capacity`: a packed row is one Arrow list (`int32` offsets).
pub const MAX_CAPACITY: u64 = i32::MAX as u64;

/// The most tokens of one record batch of packed rows (or one row, if longer): bounds the
/// memory of a batch in the making and keeps `int32` list offsets in range. The packed rows
/// do not depend on it.
pub const PACKED_BATCH_TOKENS: u64 = 1 << 26;

/// The output column of each packed row's sequence lengths (TRL's name), `list<int32>`.
pub const SEQ_LENGTHS: &str = "seq_lengths";
/// The optional output column of positions restarting at 0 at every sequence, `list<int32>`.
pub const POSITION_IDS: &str = "position_ids";

/// Where the record batches of packed rows end: `[0, r1, r2, …, rows]`, each batch the rows
/// `r[k]..r[k+1]` holding at most `max_tokens` tokens ([`PACKED_BATCH_TOKENS`] for the
/// output of `pack-dataset` and `stowplan.arrow`), or one row if that row is longer.
/// `row_tokens` are the tokens before each row and the total ([`PackedRows::row_tokens`]),
/// non-decreasing.
pub fn packed_batches(row_tokens: &[u64], max_tokens: u64) -> Vec<usize> {
    let rows = row_tokens.len().saturating_sub(1);
    let mut ends = vec![0];
    let mut r0 = 0;
    while r0 < rows {
        let last = row_tokens.partition_point(|&t| t <= row_tokens[r0].saturating_add(max_tokens)) - 1;
        r0 = last.clamp(r0 + 1, rows);
        ends.push(r0);
    }
    ends
}

/// Refuses a row longer than [`MAX_ROW_LENGTH`], naming `column` and the row (numbered from
/// `row0`).
pub fn check_row_lengths(lengths: &[u64], column: &str, row0: u64) -> Result<(), Error> {
    if let Some(row) = lengths.iter().position(|&l| l > MAX_ROW_LENGTH) {
        return Err(Error::InvalidArgument(format!(
            "column '{column}' row {} has {} values, more than 2**32-1 (the longest sequence a plan takes)",
            row0 + row as u64,
            lengths[row]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(lengths: &[u64], seq: u64, overflow: Overflow) -> Vec<(u64, u64)> {
        let i = row_items(lengths, seq, overflow, "x", 0).unwrap();
        i.starts.into_iter().zip(i.lengths).collect()
    }

    #[test]
    fn overflow_policies_cut_long_rows_and_skip_empty_ones() {
        let l = [5, 0, 2, 9];
        assert_eq!(items(&l, 4, Overflow::Truncate), [(0, 4), (5, 2), (7, 4)]);
        assert_eq!(items(&l, 4, Overflow::Split), [(0, 4), (4, 1), (5, 2), (7, 4), (11, 4), (15, 1)]);
        assert_eq!(items(&l, 4, Overflow::Drop), [(5, 2)]);
        let e = row_items(&l, 4, Overflow::Error, "input_ids", 10).unwrap_err();
        assert!(matches!(&e, Error::Infeasible(m) if m.contains("column 'input_ids' row 10 has 5 values")), "{e}");
        assert!(row_items(&l, 0, Overflow::Truncate, "x", 0).is_err());
        // Any capacity (compat.trl's, as TRL's) and row length; pack_rows bounds both.
        assert_eq!(items(&[1 << 33], 1 << 32, Overflow::Split), [(0, 1 << 32), (1 << 32, 1 << 32)]);
        let bfd = RowPacking::parse("bfd", None).unwrap();
        let e = pack_rows(Backend::Native, &[1, 1 << 32], 4, bfd, "x").unwrap_err();
        assert!(e.to_string().contains("column 'x' row 1 has 4294967296 values, more than 2**32-1"), "{e}");
        let e = pack_rows(Backend::Native, &[1], 1 << 31, bfd, "x").unwrap_err();
        assert!(e.to_string().contains("capacity must be in 1..=2**31-1 (got 2147483648)"), "{e}");
    }

    #[test]
    fn wrapped_cuts_every_capacity_tokens() {
        let w = wrapped_rows(&[3, 0, 1, 6], 4).unwrap();
        assert_eq!(w.starts, [0, 3, 4, 8]);
        assert_eq!(w.lengths, [3, 1, 4, 2]);
        assert_eq!(w.offsets, [0, 2, 3, 4]);
        assert_eq!(wrapped_rows(&[0, 0], 4).unwrap().offsets, [0]);
    }

    #[test]
    fn strategies_and_overflows_are_checked_together() {
        let p = |s: &str, o: Option<&str>| RowPacking::parse(s, o).map(|p| (p.strategy(), p.overflow()));
        assert_eq!(p("bfd", None).unwrap(), (RowStrategy::Bfd, Some(Overflow::Truncate)));
        assert_eq!(p("next_fit", Some("drop")).unwrap(), (RowStrategy::NextFit, Some(Overflow::Drop)));
        assert_eq!(p("bfd_split", None).unwrap(), (RowStrategy::BfdSplit, Some(Overflow::Split)));
        assert_eq!(p("wrapped", None).unwrap(), (RowStrategy::Wrapped, None));
        let e = p("best", None).unwrap_err().to_string();
        assert!(e.contains("strategy must be 'bfd', 'ffd', 'next-fit', 'bfd_split' or 'wrapped' (got 'best')"), "{e}");
        assert!(p("bfd", Some("cut")).unwrap_err().to_string().contains("'truncate', 'split', 'drop' or 'error'"));
        assert!(p("bfd_split", Some("drop")).is_err());
        assert!(p("wrapped", Some("split")).is_err());
    }

    #[test]
    fn planned_rows_follow_the_kernel_plan() {
        let k = Backend::Native;
        let bfd = RowPacking::parse("bfd", None).unwrap();
        let r = pack_rows(k, &[5, 2, 3, 1], 4, bfd, "x").unwrap();
        // Items (0,4) (5,2) (7,3) (10,1): BFD bins {0}, {2,3}, {1}.
        assert_eq!((r.starts, r.lengths, r.offsets), (vec![0, 7, 10, 5], vec![4, 3, 1, 2], vec![0, 1, 3, 4]));
        let empty = pack_rows(k, &[0, 0], 4, bfd, "x").unwrap();
        assert_eq!(empty.rows(), 0);
    }

    #[test]
    fn batches_hold_at_most_packed_batch_tokens_or_one_row() {
        let t = PACKED_BATCH_TOKENS;
        // Rows of t/2, t/2, t/2, 2t and 1 tokens (one item each).
        let rows = PackedRows {
            starts: vec![0; 5],
            lengths: vec![t / 2, t / 2, t / 2, 2 * t, 1],
            offsets: vec![0, 1, 2, 3, 4, 5],
        };
        assert_eq!(rows.row_tokens(), [0, t / 2, t, 3 * t / 2, 7 * t / 2, 7 * t / 2 + 1]);
        assert_eq!(packed_batches(&rows.row_tokens(), t), [0, 2, 3, 4, 5]);
        assert_eq!(packed_batches(&[0], t), [0]);
    }
}
