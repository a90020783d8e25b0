//! The WASM backend of [`LimitedStreamPacker`]: the kernel component's `multi-streaming`
//! interface, one instance per packer (its state stays in the guest's memory).

use stowplan_kernel::{LimitedClosed, StreamLimits, StreamOptions, StreamStatus};
use wasmtime::Store;
use wasmtime::component::ResourceAny;

use super::bindings::exports::stowplan::kernel::multi_streaming as wms;
use super::{Tracker, Warm, instantiate};
use crate::error::{Error, runtime};
use crate::kernel::{LimitedStreamPacker, StreamBackend};

/// A limited streaming packer in an instance of its own.
struct WasmLimitedStream {
    warm: Warm,
    packer: ResourceAny,
}

impl std::fmt::Debug for WasmLimitedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmLimitedStream").finish_non_exhaustive()
    }
}

impl WasmLimitedStream {
    fn call<R>(
        &mut self,
        f: impl FnOnce(&wms::GuestPacker<'_>, &mut Store<Tracker>, ResourceAny) -> wasmtime::Result<R>,
    ) -> Result<R, Error> {
        let guest = self.warm.instance.stowplan_kernel_multi_streaming();
        f(&guest.packer(), &mut self.warm.store, self.packer).map_err(|e| runtime("kernel call trapped", e))
    }

    /// The host's wrapper, with the options and limits the guest reports.
    fn wrap(mut self) -> Result<LimitedStreamPacker, Error> {
        let options = self.call(|g, s, p| g.call_options(s, p))?.into();
        let l = self.call(|g, s, p| g.call_limits(s, p))?;
        let limits = StreamLimits { caps: l.caps, names: l.names, max_segments: l.max_segments };
        Ok(LimitedStreamPacker::new(Box::new(self), options, limits))
    }
}

impl Drop for WasmLimitedStream {
    fn drop(&mut self) {
        let _ = self.packer.resource_drop(&mut self.warm.store);
    }
}

fn closed(c: wms::LimitedClosed) -> LimitedClosed {
    LimitedClosed { closed: c.closed.into(), resource_loads: c.resource_loads }
}

impl StreamBackend<LimitedClosed> for WasmLimitedStream {
    fn add(&mut self, rows: &[u64]) -> Result<LimitedClosed, Error> {
        Ok(closed(self.call(|g, s, p| g.call_add(s, p, rows))??))
    }

    fn finish(&mut self) -> Result<LimitedClosed, Error> {
        Ok(closed(self.call(|g, s, p| g.call_finish(s, p))?))
    }

    fn save(&mut self) -> Result<Vec<u8>, Error> {
        self.call(|g, s, p| g.call_save(s, p))
    }

    fn status(&mut self) -> Result<StreamStatus, Error> {
        Ok(self.call(|g, s, p| g.call_status(s, p))?.into())
    }
}

/// An empty packer in a new instance.
pub(super) fn create(options: &StreamOptions, limits: &StreamLimits) -> Result<LimitedStreamPacker, Error> {
    let mut warm = instantiate()?;
    let l = wms::Limits { caps: limits.caps.clone(), names: limits.names.clone(), max_segments: limits.max_segments };
    let packer = warm
        .instance
        .stowplan_kernel_multi_streaming()
        .packer()
        .call_create(&mut warm.store, options.into(), &l)
        .map_err(|e| runtime("kernel call trapped", e))??;
    WasmLimitedStream { warm, packer }.wrap()
}

/// A packer restored from `state` in a new instance.
pub(super) fn restore(state: &[u8]) -> Result<LimitedStreamPacker, Error> {
    let mut warm = instantiate()?;
    let packer = warm
        .instance
        .stowplan_kernel_multi_streaming()
        .packer()
        .call_restore(&mut warm.store, state)
        .map_err(|e| runtime("kernel call trapped", e))??;
    WasmLimitedStream { warm, packer }.wrap()
}
