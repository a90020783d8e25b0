//! Build-time only (see `Cargo.toml`): this crate has no code. Depending on it turns on, in
//! every build of the workspace, the features that any one of its builds turns on in crates
//! wasmtime depends on, so wasmtime is compiled once for `cargo run`, `cargo test` and the
//! Python wheel.
#![no_std]
