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
        let p = k::LimitedStreamPacker::restore(&state).map_err(error)?;
        Ok(ms::Packer::new(LimitedStreamPacker(RefCell::new(p))))
    }

    fn add(&self, rows: Vec<u64>) -> Result<ms::LimitedClosed, types::Error> {
        self.0.borrow_mut().add(&rows).map(Into::into).map_err(error)
    }

    fn finish(&self) -> ms::LimitedClosed {
        self.0.borrow_mut().finish().into()
    }

    fn save(&self) -> Vec<u8> {
        self.0.borrow().save()
    }

    fn status(&self) -> stream::Status {
        self.0.borrow().status().into()
    }

    fn options(&self) -> stream::Options {
        (*self.0.borrow().options()).into()
    }

    fn limits(&self) -> ms::Limits {
        self.0.borrow().limits().into()
    }
}
