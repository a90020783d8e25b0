//! Exact reproductions of the peers' algorithms, for the compatibility layers (`compat.*` in
//! the SDKs): each module gives one peer's entry points with the peer's own integers, tie
//! breaks and exceptions, checked against vectors made by running the peer's code
//! (`tests/vectors/`). The core algorithms never depend on these modules, except
//! [`PartitionMethod::Verl`](crate::PartitionMethod), which is verl's partitioner by definition.
//!
//! - [`verl`]: verl 0.9.1's `get_seqlen_balanced_partitions` and `log_seqlen_unbalance`;
//! - `micro` (re-exported here): verl's `rearrange_micro_batches` and `_balance_batch`, ROLL's
//!   `load_balance` and its pad factor;
//! - [`prime_rl`]: prime-rl's packer and its rank distribution;
//! - [`slime`]: slime's balancers and its FLOPs model;
//! - [`trl`]: TRL's best-fit-decreasing packing.

mod micro;
pub mod prime_rl;
pub mod slime;
pub mod trl;
pub mod verl;

pub use micro::*;
