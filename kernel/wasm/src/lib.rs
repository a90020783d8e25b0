//! The stowplan kernel as a WebAssembly component (`stowplan:kernel/kernel@0.2.0`).
//!
//! Built for `wasm32-wasip2` by `cargo xtask build-kernel`; the result is committed as
//! `host/assets/stowplan_kernel.wasm`. `no_std` with its own allocator and panic handler, so
//! the component imports nothing. On other targets this crate is empty.
#![cfg_attr(target_arch = "wasm32", no_std)]

#[cfg(target_arch = "wasm32")]
mod guest;
