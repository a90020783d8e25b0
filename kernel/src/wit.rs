//! The conversions between the kernel's types and the WIT types of `wit/kernel.wit`, written
//! once for both sides of the component boundary: the guest (`kernel/wasm`, wit-bindgen) and
//! the host (`host/src/kernel`, wasmtime's bindgen) each generate their own Rust types from
//! the same WIT, with the same names, and each expands
//! [`wit_conversions!`](crate::wit_conversions) over them.
//!
//! Every record and enum listed here converts both ways, so the guest takes what the host
//! sends and gives back what the host takes with the same field lists:
//! - records field by field (`__wit_record!`): `From` in each direction, and `From<&Kernel>`
//!   for the kernel's side, which the host sends by reference;
//! - records with a checksum (`__wit_record!` with `checksum`): `From` to the WIT record
//!   (the checksum as hex), `TryFrom` back (the hex may be malformed);
//! - a few written out here, whose WIT form differs in shape: the limited raw plan (its plan
//!   has a checksum), slime's FLOPs (a `u128` as two halves) and prime-rl's batch plan (the
//!   dummy flags flat).
//!
//! Types whose fields borrow (`DpOptions`, `DistributeOptions`, `MultiOptions`, the limits)
//! are converted by hand where they are used.

#[doc(hidden)]
pub use alloc::vec::Vec;

/// Implements `From` both ways between the kernel's types and the WIT types of the module
/// `$w` (the bindings' `exports::stowplan::kernel`, as seen from the caller).
#[doc(hidden)]
#[macro_export]
macro_rules! wit_conversions {
    ($w:ident) => {
        const _: () = {
            use $crate as k;
            use $crate::__wit_record;
            use $crate::peers::slime as ks;
            use $w::{balance, layout, pack, partition, peers, plan, prime_rl, slime, streaming, types, verl};

            impl From<types::Groups> for $crate::wit::Vec<$crate::wit::Vec<u32>> {
                fn from(g: types::Groups) -> Self {
                    $crate::unflatten(&g.offsets, &g.indices)
                }
            }

            impl From<$crate::wit::Vec<$crate::wit::Vec<u32>>> for types::Groups {
                fn from(parts: $crate::wit::Vec<$crate::wit::Vec<u32>>) -> Self {
                    let (offsets, indices) = $crate::flatten(&parts);
                    types::Groups { offsets, indices }
                }
            }

            $crate::__wit_enum!(k::Error, types::Error { InvalidArgument(m) => InvalidArgument, Infeasible(m) => Infeasible });
            $crate::__wit_enum!(k::PartitionMethod, partition::Method { Kk => Kk, Greedy => Greedy, Verl => Verl });
            $crate::__wit_enum!(k::PackMethod, pack::Method { Bfd => Bfd, Ffd => Ffd, NextFit => NextFit });
            $crate::__wit_enum!(k::OversizePolicy, pack::Oversize { Error => Error, Single => Single, Drop => Drop });
            $crate::__wit_enum!(k::MultiMethod, pack::MultiMethod {
                Balanced => Balanced, Bfd => Bfd, Ffd => Ffd, NextFit => NextFit
            });
            $crate::__wit_enum!(k::Order, balance::Order {
                None => None, CostDesc => CostDesc, Verl => Verl, Roll => Roll
            });
            $crate::__wit_enum!(k::Factor, layout::Factor { CpTp => CpTp, Roll => Roll, Multiple(m) => Multiple });
            $crate::__wit_enum!(k::Padding, layout::Padding {
                PerSequence(m) => PerSequence, PerMicroBatch(m) => PerMicroBatch
            });
            // verl's three functions never raise `ValueError` (only the `peers` entry points do).
            $crate::__wit_enum!(k::peers::verl::PyError, verl::PyError {
                AssertionError(m) => AssertionError,
                IndexError(m) => IndexError,
                TypeError(m) => TypeError,
                ZeroDivisionError(m) => ZeroDivisionError,
                MemoryError(m) => MemoryError;
                k::peers::verl::PyError::ValueError(m) => verl::PyError::AssertionError(m)
            });
            $crate::__wit_enum!(ks::SlimeError, slime::SlimeError {
                AssertionError(m) => AssertionError,
                InvalidArgument(m) => InvalidArgument,
                MissingAttribute(m) => MissingAttribute
            });
            $crate::__wit_enum!(ks::Arg, slime::Arg { Missing => Missing, None => IsNone, Int(v) => Value });
            $crate::__wit_enum!(ks::LayerFreq, slime::LayerFreq {
                Missing => Missing, Every(f) => Every, Pattern(p) => Pattern
            });
            $crate::__wit_enum!(ks::PythonSum, slime::PythonSum { Naive => Naive, Neumaier => Neumaier });

            $crate::__wit_record!(k::Cost, balance::Cost { linear, quadratic });
            $crate::__wit_record!(k::Figures, balance::Figures { max, min, mean, max_over_mean, spread });
            $crate::__wit_record!(k::peers::verl::UnbalanceFigures, peers::SeqlenUnbalance {
                min, max, minmax_diff, balanced_min, balanced_max, mean
            });
            $crate::__partition_options!(__wit_record { @options k::PartitionOptions, partition::Options });
            $crate::__pack_options!(__wit_record { @options k::PackOptions, pack::Options });
            $crate::__micro_options!(__wit_record { @options k::MicroOptions, balance::MicroOptions });
            $crate::__wit_record!(k::peers::VerlMicroOptions, peers::VerlMicroOptions {
                max_token_len,
                min_num_micro_batch,
                num_batches_divided_by,
                use_dynamic_bsz_balance,
                force_group_size,
                padded_width,
                dp_num_micro_batches,
            });
            $crate::__wit_record!(k::peers::RollLoadBalanceOptions, peers::RollOptions {
                mask_width,
                max_packed_sequence_length,
                min_num_micro_batches,
                tp,
                cp,
                vp,
                dp_num_micro_batches,
            });
            $crate::__align_options!(__wit_record { @options k::AlignOptions, layout::AlignOptions });
            $crate::__stream_options!(__wit_record { @options k::StreamOptions, streaming::Options });
            $crate::__wit_record!(k::peers::prime_rl::BatchOptions, prime_rl::BatchOptions {
                seq_len, num_train_workers, linear, quadratic, pad_to_multiple_of, multimodal_same_run
            });
            $crate::__wit_record!(ks::ScheduleArgs, slime::ScheduleArgs {
                micro_batch_size,
                use_dynamic_batch_size,
                max_tokens_per_gpu,
                balance_data,
                balance_by_flops,
                dp_size,
                cp_size,
                vpp_size,
                microbatch_group_size_per_vp_stage,
                global_batch_size,
                python_sum,
            });
            $crate::__wit_record!(ks::FlopsArgs, slime::FlopsArgs {
                hidden_size,
                num_attention_heads,
                num_query_groups,
                vocab_size,
                ffn_hidden_size,
                num_experts,
                num_layers,
                kv_channels,
                moe_ffn_hidden_size,
                moe_router_topk,
                moe_shared_expert_intermediate_size,
                moe_layer_freq,
                multi_latent_attention,
                q_lora_rank,
                kv_lora_rank,
                qk_head_dim,
                qk_pos_emb_head_dim,
                v_head_dim,
            });

            $crate::__wit_record!(k::Partition, partition::Partitioning {
                sums, total, spread, lower_bound; groups: types::Groups = (offsets, indices)
            });
            $crate::__wit_record!(k::Packing, pack::Packing {
                loads, dropped, single, real_tokens, aligned_tokens, lower_bound;
                bins: types::Groups = (offsets, indices)
            });
            $crate::__wit_record!(k::MicroBatches, balance::MicroPlan {
                tokens, costs, restore, lower_bound, required; batches: types::Groups = (offsets, indices)
            });
            $crate::__wit_record!(k::Balance, balance::DpPlan {
                tokens, costs, cost_lower_bound; ranks: types::Groups = (offsets, order)
            });

            impl From<k::TwoLevelBalance> for balance::TwoLevel {
                fn from(p: k::TwoLevelBalance) -> Self {
                    balance::TwoLevel { dp: p.dp.into(), ranks: p.ranks.into_iter().map(Into::into).collect() }
                }
            }

            impl From<balance::TwoLevel> for k::TwoLevelBalance {
                fn from(p: balance::TwoLevel) -> Self {
                    k::TwoLevelBalance { dp: p.dp.into(), ranks: p.ranks.into_iter().map(Into::into).collect() }
                }
            }
            $crate::__wit_record!(k::Distribution, layout::Distribution {
                per_rank,
                tokens,
                real_tokens,
                costs,
                rank_costs,
                packed,
                splits,
                dummies,
                lower_bound;
                batches: types::Groups = (offsets, indices)
            });
            $crate::__wit_record!(k::peers::RollMicroBatches, peers::RollMicroBatches {
                micro_batches, kk_partitions, pad_factor, padded_lengths
            });
            $crate::__wit_record!(ks::Schedule, slime::Schedule {
                partitions, micro_batch_sizes, num_microbatches, num_steps
            });
            $crate::__wit_record!(k::MultiPacking, pack::MultiPacking { packing, resource_loads, lower_bounds });
            $crate::__plan_options!(__wit_record { @options k::PlanOptions, plan::PlanOptions });
            $crate::__wit_record!(k::RawPlan, plan::RawPackPlan {
                tokens, single_long, dropped, real_tokens, aligned_tokens, lower_bound;
                packs: types::Groups = (offsets, indices)
            }, checksum);
            $crate::__wit_record!(k::AlignedPlan, plan::AlignedPackPlan {
                packs, pad_needed, dropped_packs, dropped_samples
            }, checksum);

            impl From<k::LimitedRawPlan> for plan::LimitedRawPlan {
                fn from(p: k::LimitedRawPlan) -> Self {
                    plan::LimitedRawPlan {
                        plan: p.raw.into(),
                        loads: p.loads,
                        lower_bounds: p.lower_bounds,
                        names: p.names,
                    }
                }
            }

            impl TryFrom<plan::LimitedRawPlan> for k::LimitedRawPlan {
                type Error = k::plan::MalformedChecksum;
                fn try_from(p: plan::LimitedRawPlan) -> Result<Self, Self::Error> {
                    let raw = p.plan.try_into()?;
                    Ok(k::LimitedRawPlan { raw, loads: p.loads, lower_bounds: p.lower_bounds, names: p.names })
                }
            }
            $crate::__wit_record!(k::LimitedMicroBatches, balance::LimitedMicroPlan { plan, loads, lower_bounds });

            // The WIT has no 128-bit integer: an exact count of FLOPs crosses as (high, low).
            impl From<ks::Flops> for slime::Flops {
                fn from(f: ks::Flops) -> Self {
                    match f {
                        ks::Flops::Float(x) => slime::Flops::Floating(x),
                        ks::Flops::Int(i) => slime::Flops::Integer(((i >> 64) as u64, i as u64)),
                    }
                }
            }

            impl From<slime::Flops> for ks::Flops {
                fn from(f: slime::Flops) -> Self {
                    match f {
                        slime::Flops::Floating(x) => ks::Flops::Float(x),
                        slime::Flops::Integer((high, low)) => ks::Flops::Int((u128::from(high) << 64) | u128::from(low)),
                    }
                }
            }

            // The ranks' dummy flags cross flat: rank `r`'s are as many as its bins.
            impl From<k::peers::prime_rl::BatchPlan> for prime_rl::BatchPlan {
                fn from(p: k::peers::prime_rl::BatchPlan) -> Self {
                    prime_rl::BatchPlan {
                        bins: p.bins.into(),
                        multimodal: p.multimodal,
                        padding: p.padding,
                        costs: p.costs,
                        ranks: p.ranks.into(),
                        dummies: p.dummies.into_iter().flatten().collect(),
                    }
                }
            }

            impl From<prime_rl::BatchPlan> for k::peers::prime_rl::BatchPlan {
                fn from(p: prime_rl::BatchPlan) -> Self {
                    let ranks: $crate::wit::Vec<$crate::wit::Vec<u32>> = p.ranks.into();
                    let mut flags = p.dummies.into_iter();
                    let dummies = ranks.iter().map(|r| flags.by_ref().take(r.len()).collect()).collect();
                    k::peers::prime_rl::BatchPlan {
                        bins: p.bins.into(),
                        multimodal: p.multimodal,
                        padding: p.padding,
                        costs: p.costs,
                        ranks,
                        dummies,
                    }
                }
            }
            $crate::__wit_record!(k::NextFitRuns, pack::NextFitRuns {
                starts, loads, dropped, single, real_tokens, aligned_tokens, lower_bound
            });
            $crate::__wit_record!(k::ClosedBins, streaming::Closed { offsets, indices, loads, dropped });
            $crate::__wit_record!(k::LimitedClosedBins, streaming::LimitedClosed { closed, resource_loads });
            $crate::__wit_record!(k::StreamLimits, streaming::Limits { caps, names, max_segments });
            $crate::__wit_record!(k::StreamStatus, streaming::Status {
                next_index, buffered, open_bins, in_open_bins, oldest_held
            });
            // `cp` is not sent back: the split has `cp + 1` run offsets.
            $crate::__wit_record!(k::CpLayout, layout::CpSplit {
                factor,
                cu_seqlens,
                cu_seqlens_padded,
                max_seqlen,
                max_seqlen_padded,
                run_offsets,
                run_starts,
                run_lengths,
                local_bounds,
                rank_real_tokens,
            }, cp = |s| s.run_offsets.len() as u32 - 1);
        };
    };
}

/// Declares a kernel options struct as written (its docs, derives and `pub` fields) and,
/// named by `$fields`, a hidden macro that hands the struct's field list to a callback:
/// `$fields!(cb { args… })` expands `cb! { args… { field: Type, … } }`. Every field list of
/// an options struct (the WIT conversions here, the Python SDK's keyword options) comes from
/// that macro, so a field added to the struct reaches them without another edit. `$d` is a
/// `$` token (the macro it defines has metavariables of its own).
#[doc(hidden)]
#[macro_export]
macro_rules! __options {
    ($d:tt $fields:ident;
     $(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty),* $(,)? }) => {
        $(#[$m])*
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
        }

        #[doc(hidden)]
        #[macro_export]
        macro_rules! $fields {
            ($d cb:ident { $d($d args:tt)* }) => { $d cb! { $d($d args)* { $($f: $t),* } } };
        }
    };
}

/// `From` both ways between a kernel enum and its WIT twin, variant by variant
/// (`Kernel(payload) => Wit`); after `;`, arms for kernel variants the WIT type lacks.
#[doc(hidden)]
#[macro_export]
macro_rules! __wit_enum {
    ($k:ty, $w:ty { $($kv:ident $(($x:ident))? => $wv:ident),* $(; $($extra:pat => $to:expr),*)? }) => {
        const _: () = {
            type K = $k;
            type W = $w;
            impl From<K> for W {
                fn from(v: K) -> Self {
                    match v {
                        $(K::$kv $(($x))? => W::$wv $(($x))?,)*
                        $($($extra => $to,)*)?
                    }
                }
            }
            impl From<W> for K {
                fn from(v: W) -> Self {
                    match v {
                        $(W::$wv $(($x))? => K::$kv $(($x))?,)*
                    }
                }
            }
        };
    };
}

/// `From` both ways between a kernel record and its WIT twin, field by field (each through
/// `Into`); after `;`, the WIT `groups` field that holds the kernel's `offsets` and `indices`
/// fields; after the braces, a kernel-only field computed from the WIT record.
///
/// With `checksum` after the braces, the record carries a sha256 `checksum`, which the WIT
/// carries as lowercase hex ([`plan::hex`](crate::plan::hex)): the way back is `TryFrom`,
/// which refuses hex that is not a checksum ([`plan::unhex`](crate::plan::unhex)).
#[doc(hidden)]
#[macro_export]
macro_rules! __wit_record {
    // The field list of an options struct ([`__options!`](crate::__options)'s callback form).
    (@options $k:ty, $w:ty { $($f:ident: $t:ty),* }) => {
        $crate::__wit_record!($k, $w { $($f),* });
    };
    ($k:ty, $w:ty { $($fields:tt)* } $(, $extra:ident = |$s:ident| $e:expr)?) => {
        const _: () = {
            type K = $k;
            type W = $w;
            impl From<K> for W {
                fn from(v: K) -> Self {
                    $crate::__wit_record!(@wit W, v { $($fields)* })
                }
            }
            impl From<W> for K {
                fn from(v: W) -> Self {
                    $(let $s = &v; let $extra = $e;)?
                    $crate::__wit_record!(@kernel K, v { $($fields)* } $($extra)?)
                }
            }
            impl From<&K> for W {
                fn from(v: &K) -> Self {
                    v.clone().into()
                }
            }
        };
    };
    ($k:ty, $w:ty { $($fields:tt)* }, checksum) => {
        const _: () = {
            type K = $k;
            type W = $w;
            impl From<K> for W {
                fn from(v: K) -> Self {
                    $crate::__wit_record!(@wit W, v { $($fields)* } checksum: $crate::plan::hex(&v.checksum))
                }
            }
            impl TryFrom<W> for K {
                type Error = $crate::plan::MalformedChecksum;
                fn try_from(v: W) -> Result<Self, Self::Error> {
                    let checksum = $crate::plan::unhex(&v.checksum)?;
                    Ok($crate::__wit_record!(@kernel K, v { $($fields)* } checksum))
                }
            }
        };
    };
    // The WIT record of the kernel record `$v`, with the field `$x` set to `$xe`.
    (@wit $w:ident, $v:ident { $($f:ident),* $(,)? $(; $g:ident: $groups:ty = ($off:ident, $idx:ident))? }
        $($x:ident: $xe:expr)?) => {
        $w {
            $($x: $xe,)?
            $($f: $v.$f.into(),)*
            $($g: { type G = $groups; G { offsets: $v.$off, indices: $v.$idx } },)?
        }
    };
    // The kernel record of the WIT record `$v`, with the field `$x` from the local `$x`.
    (@kernel $k:ident, $v:ident { $($f:ident),* $(,)? $(; $g:ident: $groups:ty = ($off:ident, $idx:ident))? }
        $($x:ident)?) => {
        $k {
            $($f: $v.$f.into(),)*
            $($off: $v.$g.offsets, $idx: $v.$g.indices,)?
            $($x,)?
        }
    };
}
