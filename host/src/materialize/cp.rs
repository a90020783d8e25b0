//! Context parallelism: a row's zigzag split over CP ranks ([`CpRuns`]) and one CP rank's
//! share of a micro-batch ([`CpView`]).

use serde::{Deserialize, Serialize};
use stowplan_kernel::CpLayout;

use super::to_i32;
use crate::Error;

/// The zigzag split of one row over CP ranks, as runs of the padded row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpRuns {
    /// CP size.
    pub cp: u32,
    /// `cp + 1` offsets into `starts`/`lengths`.
    pub offsets: Vec<u32>,
    /// Run starts in the padded row.
    pub starts: Vec<u64>,
    /// Run lengths.
    pub lengths: Vec<u64>,
    /// Local boundaries in every rank's row (`cu_seqlens_padded / cp`).
    pub local_bounds: Vec<i32>,
}

impl CpRuns {
    /// The runs of a kernel [`CpLayout`].
    pub fn of(layout: &CpLayout) -> Result<Self, Error> {
        Ok(Self {
            cp: layout.cp,
            offsets: layout.run_offsets.clone(),
            starts: layout.run_starts.clone(),
            lengths: layout.run_lengths.clone(),
            local_bounds: layout.local_bounds.iter().map(|&b| to_i32("local_bounds", b)).collect::<Result<_, _>>()?,
        })
    }

    fn runs(&self, r: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let (a, b) = (self.offsets[r] as usize, self.offsets[r + 1] as usize);
        self.starts[a..b].iter().zip(&self.lengths[a..b]).map(|(&s, &l)| (s as usize, l as usize))
    }

    fn check_rank(&self, r: usize) -> Result<(), Error> {
        if r >= self.cp as usize {
            return Err(Error::InvalidArgument(format!("rank must be in 0..{} (cp = {}), got {r}", self.cp, self.cp)));
        }
        Ok(())
    }

    /// Positions of the padded row that CP rank `r` receives, in its order (its gather map).
    pub fn positions(&self, r: usize) -> Result<Vec<u64>, Error> {
        self.check_rank(r)?;
        Ok(self.runs(r).flat_map(|(s, l)| (s as u64)..(s + l) as u64).collect())
    }

    /// The elements of `row` (the padded row) CP rank `r` receives.
    pub fn gather<T: Copy>(&self, r: usize, row: &[T]) -> Result<Vec<T>, Error> {
        self.check_rank(r)?;
        let total = self.starts.iter().zip(&self.lengths).map(|(s, l)| s + l).max().unwrap_or(0) as usize;
        if row.len() < total {
            return Err(Error::InvalidArgument(format!("row has {} elements; the layout spans {total}", row.len())));
        }
        let mut out = Vec::with_capacity(total / self.cp as usize);
        for (s, l) in self.runs(r) {
            out.extend_from_slice(&row[s..s + l]);
        }
        Ok(out)
    }

    /// The inverse of [`CpRuns::gather`]: puts every CP rank's row (`rows[r]`, e.g. per-token
    /// outputs of rank `r`) back into one padded row.
    pub fn unpack<T: Copy + Default>(&self, rows: &[&[T]]) -> Result<Vec<T>, Error> {
        if rows.len() != self.cp as usize {
            return Err(Error::InvalidArgument(format!(
                "rows has {} entries; give one per CP rank ({})",
                rows.len(),
                self.cp
            )));
        }
        let total: usize = self.lengths.iter().sum::<u64>() as usize;
        let mut out = vec![T::default(); total];
        for (r, row) in rows.iter().enumerate() {
            let want: usize = self.runs(r).map(|(_, l)| l).sum();
            if row.len() != want {
                return Err(Error::InvalidArgument(format!(
                    "rows[{r}] has {} elements; CP rank {r} holds {want}",
                    row.len()
                )));
            }
            let mut at = 0;
            for (s, l) in self.runs(r) {
                out[s..s + l].copy_from_slice(&row[at..at + l]);
                at += l;
            }
        }
        Ok(out)
    }
}
