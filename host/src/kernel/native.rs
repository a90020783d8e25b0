//! The native backend: the kernel crate called directly.

use stowplan_kernel as k;
use stowplan_kernel::{ClosedBins, LimitedClosedBins, StreamStatus};

use super::{LimitedStreamPacker, StreamBackend, StreamPacker};
use crate::Error;

/// The kernel crate, compiled natively (its [`KernelApi`](super::KernelApi) methods are in
/// `api.rs`, beside the WASM backend's).
#[derive(Debug)]
pub(super) struct NativeKernel;

/// The host's wrapper of a native streaming packer.
pub(super) fn stream_packer(packer: k::StreamPacker) -> Result<StreamPacker, Error> {
    let options = *packer.options();
    Ok(StreamPacker::new(Box::new(packer), options))
}

/// The host's wrapper of a native limited packer.
pub(super) fn limited(packer: k::LimitedStreamPacker) -> Result<LimitedStreamPacker, Error> {
    let (options, limits) = (*packer.options(), packer.limits().clone());
    Ok(LimitedStreamPacker::new(Box::new(packer), options, limits))
}

impl StreamBackend<LimitedClosedBins> for k::LimitedStreamPacker {
    fn add(&mut self, rows: &[u64]) -> Result<LimitedClosedBins, Error> {
        Ok(k::LimitedStreamPacker::add(self, rows)?)
    }

    fn finish(&mut self) -> Result<LimitedClosedBins, Error> {
        Ok(k::LimitedStreamPacker::finish(self))
    }

    fn state(&mut self) -> Result<Vec<u8>, Error> {
        Ok(k::LimitedStreamPacker::state(self))
    }

    fn status(&mut self) -> Result<StreamStatus, Error> {
        Ok(k::LimitedStreamPacker::status(self))
    }
}

impl StreamBackend<ClosedBins> for k::StreamPacker {
    fn add(&mut self, lengths: &[u64]) -> Result<ClosedBins, Error> {
        Ok(k::StreamPacker::add(self, lengths)?)
    }

    fn finish(&mut self) -> Result<ClosedBins, Error> {
        Ok(k::StreamPacker::finish(self))
    }

    fn state(&mut self) -> Result<Vec<u8>, Error> {
        Ok(k::StreamPacker::state(self))
    }

    fn status(&mut self) -> Result<StreamStatus, Error> {
        Ok(k::StreamPacker::status(self))
    }
}
