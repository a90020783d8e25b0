//! Glue between the WIT `multi-streaming` interface and `stowplan_kernel::LimitedStreamPacker`.

use core::cell::RefCell;

use super::alloc::vec::Vec;

use stowplan_kernel as k;

use super::exports::stowplan::kernel::{multi_streaming as ms, streaming as stream, types};
use super::{Kernel, closed_of, error, options_of, status_of, stream_options};

pub struct LimitedStreamPacker(RefCell<k::LimitedStreamPacker>);

impl ms::Guest for Kernel {
    type Packer = LimitedStreamPacker;
}

fn closed(c: k::LimitedClosed) -> ms::LimitedClosed {
    ms::LimitedClosed { closed: closed_of(c.closed), resource_loads: c.resource_loads }
}

impl ms::GuestPacker for LimitedStreamPacker {
    fn create(options: stream::Options, limits: ms::Limits) -> Result<ms::Packer, types::Error> {
        let l = k::StreamLimits { caps: limits.caps, names: limits.names, max_segments: limits.max_segments };
        let p = k::LimitedStreamPacker::new(stream_options(options), l).map_err(error)?;
        Ok(ms::Packer::new(LimitedStreamPacker(RefCell::new(p))))
    }

    fn restore(state: Vec<u8>) -> Result<ms::Packer, types::Error> {
        let p = k::LimitedStreamPacker::restore(&state).map_err(error)?;
        Ok(ms::Packer::new(LimitedStreamPacker(RefCell::new(p))))
    }

    fn add(&self, rows: Vec<u64>) -> Result<ms::LimitedClosed, types::Error> {
        self.0.borrow_mut().add(&rows).map(closed).map_err(error)
    }

    fn finish(&self) -> ms::LimitedClosed {
        closed(self.0.borrow_mut().finish())
    }

    fn save(&self) -> Vec<u8> {
        self.0.borrow().save()
    }

    fn status(&self) -> stream::Status {
        status_of(self.0.borrow().status())
    }

    fn options(&self) -> stream::Options {
        options_of(self.0.borrow().options())
    }

    fn limits(&self) -> ms::Limits {
        let l = self.0.borrow().limits().clone();
        ms::Limits { caps: l.caps, names: l.names, max_segments: l.max_segments }
    }
}
