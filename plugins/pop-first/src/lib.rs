//! `pop-first`: the oldest groups first (FIFO), slime's default buffer filter. The host has
//! the same policy built in natively (`stowplan::source::PopFirst`); this plugin is its reference
//! WebAssembly twin and the smallest example of a filter.

use stowplan_filter_guest::{Buffer, Context, Guest, fifo};

struct PopFirst;

impl Guest for PopFirst {
    fn select(ctx: Context, buffer: Buffer) -> Result<Vec<u32>, String> {
        Ok(fifo(&ctx, &buffer))
    }
}

stowplan_filter_guest::export_filter!(PopFirst);
