//! slime's scheduling arguments for properties, shared by the kernel's tests of slime's
//! schedule (`kernel/src/peers/slime/mod.rs`) and the conformance tests (`tests/tests/slime_vectors.rs`);
//! both include this file. The including module has `ScheduleArgs` and `PythonSum` in scope
//! (the kernel's, which the host re-exports as `stowplan::peers::slime`).

use core::ops::Range;
use proptest::prelude::*;

use super::{PythonSum, ScheduleArgs};

/// `build_dp_schedule`'s arguments with `dp` ranks, a token cap per GPU in `cap`, `gbs`
/// samples per global batch and `vpp` virtual pipeline stages, every switch drawn (dynamic
/// batch size or two samples per micro-batch, balanced data, balanced FLOPs, one or two
/// micro-batches per group, either float sum); no context parallelism. A property that holds
/// for some settings only sets them over what is drawn.
pub fn schedule_args(
    dp: Range<i64>,
    cap: Range<i64>,
    gbs: Range<i64>,
    vpp: Range<i64>,
) -> impl Strategy<Value = ScheduleArgs> {
    (dp, cap, gbs, vpp, 1i64..3, any::<[bool; 4]>()).prop_map(
        |(dp_size, cap, global_batch_size, vpp_size, group, [dynamic, balance_data, balance_by_flops, neumaier])| {
            ScheduleArgs {
                micro_batch_size: Some(2),
                use_dynamic_batch_size: dynamic,
                max_tokens_per_gpu: Some(cap),
                balance_data,
                balance_by_flops,
                dp_size,
                cp_size: 1,
                vpp_size,
                microbatch_group_size_per_vp_stage: group,
                global_batch_size,
                python_sum: if neumaier { PythonSum::Neumaier } else { PythonSum::Naive },
            }
        },
    )
}
