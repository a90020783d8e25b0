//! Glue between the WIT `multi-streaming` interface and `stowplan_kernel::LimitedStreamPacker`.

use core::cell::RefCell;

use super::alloc::vec::Vec;

use stowplan_kernel as k;

use super::exports::stowplan::kernel::{multi_streaming as ms, streaming as stream, types};
use super::{Kernel, error};

pub struct LimitedStreamPacker(RefCell<k::LimitedStreamPacker>);

impl ms::Guest for Kernel {
    type Packer = LimitedStreamPacker;
}

impl ms::GuestPacker for LimitedStreamPacker {
    fn create(options: stream::Options, limits: ms::Limits) -> Result<ms::Packer, types::Error> {
        let p = k::LimitedStreamPacker::new(options.into(), limits.into()).map_err(error)?;
        Ok(ms::Packer::new(LimitedStreamPacker(RefCell::new(p))))
    }

    fn restore(state: Vec<u8>) -> Result<ms::Packer, types::Error> {
        let p = k::LimitedStreamPacker::from_state(&state).map_err(error)?;
        Ok(ms::Packer::new(LimitedStreamPacker(RefCell::new(p))))
    }

    packer_methods!(ms::LimitedClosed);

    fn limits(&self) -> ms::Limits {
        self.0.borrow().limits().into()
    }
}
