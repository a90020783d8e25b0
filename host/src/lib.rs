//! # stowplan
//!
//! Plans how variable-length training sequences are stowed into micro-batches and ranks.
//! The algorithms live in a sandboxed WebAssembly component (`stowplan:kernel@0.2.0`, see
//! `wit/kernel.wit`) embedded in this crate; [`Kernel`] runs it with wasmtime. A `native`
//! backend calls the same kernel code directly, for comparison and tests.
//!
//! Layers, each depending only on those before it (ARCHITECTURE.md draws them):
//! [`kernel`] (the two backends behind one dispatch) and [`runtime`] (hashes, atomic files,
//! the compile cache) and [`wire`] (the one framed format) → [`plan`], [`materialize`],
//! [`rows`] (packed rows of a table), [`source`] (the data source), `filter` (buffer-filter plugins; feature `plugins`, on by default)
//! → [`packer`] (the state machine, no I/O) → [`serve`] (the server loop and the filesystem
//! transport; the ZeroMQ transport is the `stowplan-zmq` crate, `host/zmq`).
//!
//! The root re-exports the entry types only; everything else is reached through its module,
//! whose name says what it belongs to: [`kernel`] (the operations, their options and
//! results: `kernel::PartitionOptions`, `kernel::Packing` …), [`peers`] (the peers' exact
//! reproductions: `peers::verl`, `peers::slime` …), [`materialize`], [`packer`], [`source`],
//! [`rows`], [`runtime`], [`plan`], [`serve`] (with [`serve::protocol`], whose names such as
//! `Message` only make sense under `serve::`), [`wire`], [`json`] and [`input`] (the CLI's and
//! SDKs' shared output and input formats) and `filter`.
//!
//! ```no_run
//! use stowplan::Kernel;
//! use stowplan::kernel::{PackOptions, PartitionOptions};
//!
//! let kernel = Kernel::wasm()?;
//! let lengths = [812, 95, 4_003, 1_200, 77, 2_500];
//! let p = kernel.partition(&lengths, 2, &PartitionOptions::default())?;
//! assert_eq!(p.k(), 2);
//! let bins = kernel.pack(&lengths, &PackOptions::new(4_096))?;
//! assert!(bins.loads.iter().all(|&l| l <= 4_096));
//! # Ok::<(), stowplan::Error>(())
//! ```
#![deny(missing_docs)]

mod error;
pub mod input;
pub use stowplan_json as json;
pub mod kernel;
pub mod materialize;
pub mod packer;
pub use stowplan_kernel::peers;
#[cfg(feature = "plugins")]
pub mod filter;
pub mod plan;
pub mod rows;
pub mod runtime;
pub mod serve;
pub mod source;
pub mod wire;

pub use error::{Error, FilterError};
#[cfg(feature = "plugins")]
pub use filter::Filter;
pub use kernel::{Backend, Kernel, KernelApi, StreamPacker};
pub use materialize::{MaterializeOptions, materialize};
pub use packer::{Packer, PackerOptions, TrainingBatch, TrainingSample};
pub use plan::StaticPackPlan;
pub use plan::config::PackingConfig;
pub use rows::pack_rows;
pub use source::DataSource;
