//! Glue between the WIT `streaming` interface and the kernel's streaming packers: one
//! resource holds either a plain `stowplan_kernel::StreamPacker` or, made with limits, a
//! `stowplan_kernel::LimitedStreamPacker`.

use core::cell::RefCell;

use super::alloc::vec::Vec;

use stowplan_kernel as k;

use super::exports::stowplan::kernel::{streaming as stream, types};
use super::{Kernel, error};

/// The packer behind the `streaming.packer` resource (methods take `&self`).
pub struct StreamPacker(RefCell<Inner>);

enum Inner {
    Plain(k::StreamPacker),
    Limited(k::LimitedStreamPacker),
}

impl StreamPacker {
    fn new(inner: Inner) -> stream::Packer {
        stream::Packer::new(StreamPacker(RefCell::new(inner)))
    }
}

/// A plain packer's bins, with no resource loads.
fn plain(closed: k::ClosedBins) -> stream::LimitedClosed {
    stream::LimitedClosed { closed: closed.into(), resource_loads: Vec::new() }
}

impl stream::Guest for Kernel {
    type Packer = StreamPacker;
}

impl stream::GuestPacker for StreamPacker {
    fn create(options: stream::Options, limits: Option<stream::Limits>) -> Result<stream::Packer, types::Error> {
        let inner = match limits {
            Some(l) => Inner::Limited(k::LimitedStreamPacker::new(options.into(), l.into()).map_err(error)?),
            None => Inner::Plain(k::StreamPacker::new(options.into()).map_err(error)?),
        };
        Ok(Self::new(inner))
    }

    fn restore(state: Vec<u8>) -> Result<stream::Packer, types::Error> {
        let inner = if k::stream::is_limited_state(&state) {
            Inner::Limited(k::LimitedStreamPacker::from_state(&state).map_err(error)?)
        } else {
            Inner::Plain(k::StreamPacker::from_state(&state).map_err(error)?)
        };
        Ok(Self::new(inner))
    }

    fn add(&self, rows: Vec<u64>) -> Result<stream::LimitedClosed, types::Error> {
        match &mut *self.0.borrow_mut() {
            Inner::Plain(p) => p.add(&rows).map(plain),
            Inner::Limited(p) => p.add(&rows).map(Into::into),
        }
        .map_err(error)
    }

    fn finish(&self) -> stream::LimitedClosed {
        match &mut *self.0.borrow_mut() {
            Inner::Plain(p) => plain(p.finish()),
            Inner::Limited(p) => p.finish().into(),
        }
    }

    fn save(&self) -> Vec<u8> {
        match &*self.0.borrow() {
            Inner::Plain(p) => p.state(),
            Inner::Limited(p) => p.state(),
        }
    }

    fn status(&self) -> stream::Status {
        match &*self.0.borrow() {
            Inner::Plain(p) => p.status(),
            Inner::Limited(p) => p.status(),
        }
        .into()
    }

    fn options(&self) -> stream::Options {
        match &*self.0.borrow() {
            Inner::Plain(p) => *p.options(),
            Inner::Limited(p) => *p.options(),
        }
        .into()
    }

    fn limits(&self) -> Option<stream::Limits> {
        match &*self.0.borrow() {
            Inner::Plain(_) => None,
            Inner::Limited(p) => Some(p.limits().into()),
        }
    }
}
