//! The WASM backend of [`LimitedStreamPacker`]: the kernel component's `multi-streaming`
//! interface, one instance per packer (its state stays in the guest's memory).

use stowplan_kernel::{LimitedClosedBins, StreamLimits, StreamOptions, StreamStatus};
use wasmtime::Store;
use wasmtime::component::ResourceAny;

use super::bindings::exports::stowplan::kernel::multi_streaming as wms;
use super::{Tracker, Warm, new_packer};
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
        let limits = self.call(|g, s, p| g.call_limits(s, p))?.into();
        Ok(LimitedStreamPacker::new(Box::new(self), options, limits))
    }
}

impl Drop for WasmLimitedStream {
    fn drop(&mut self) {
        let _ = self.packer.resource_drop(&mut self.warm.store);
    }
}

impl StreamBackend<LimitedClosedBins> for WasmLimitedStream {
    fn add(&mut self, rows: &[u64]) -> Result<LimitedClosedBins, Error> {
        Ok(self.call(|g, s, p| g.call_add(s, p, rows))??.into())
    }

    fn finish(&mut self) -> Result<LimitedClosedBins, Error> {
        Ok(self.call(|g, s, p| g.call_finish(s, p))?.into())
    }

    fn state(&mut self) -> Result<Vec<u8>, Error> {
        self.call(|g, s, p| g.call_save(s, p))
    }

    fn status(&mut self) -> Result<StreamStatus, Error> {
        Ok(self.call(|g, s, p| g.call_status(s, p))?.into())
    }
}

/// An empty packer in a new instance.
pub(in crate::kernel) fn create(options: &StreamOptions, limits: &StreamLimits) -> Result<LimitedStreamPacker, Error> {
    let l: wms::Limits = limits.into();
    let (warm, packer) =
        new_packer(|i, s| i.stowplan_kernel_multi_streaming().packer().call_create(s, options.into(), &l))?;
    WasmLimitedStream { warm, packer }.wrap()
}

/// A packer restored from `state` in a new instance.
pub(in crate::kernel) fn restore(state: &[u8]) -> Result<LimitedStreamPacker, Error> {
    let (warm, packer) = new_packer(|i, s| i.stowplan_kernel_multi_streaming().packer().call_restore(s, state))?;
    WasmLimitedStream { warm, packer }.wrap()
}
