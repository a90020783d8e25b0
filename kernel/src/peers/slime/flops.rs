//! slime's `calculate_fwd_flops` (`slime/utils/flops_utils.py`), bit for bit, and the
//! model attributes it reads.

use alloc::vec::Vec;

use super::SlimeError;

/// One attribute of slime's `args` as the caller has it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arg {
    /// `args` has no such attribute.
    #[default]
    Missing,
    /// The attribute is `None`.
    None,
    /// The attribute is this integer.
    Int(i64),
}

/// `args.moe_layer_freq` as the caller has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LayerFreq {
    /// No such attribute: every layer is MoE.
    #[default]
    Missing,
    /// An integer `f`: layer `i` is MoE when `i % f == 0`.
    Every(i64),
    /// A list: entry 0 is a dense layer, an entry > 0 a MoE layer (a negative one neither).
    Pattern(Vec<i64>),
}

/// The attributes of slime's `args` that `calculate_fwd_flops` reads (Megatron's names).
/// Each is read only where slime reads it, so an attribute slime would not touch may be
/// [`Arg::Missing`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlopsArgs {
    /// `hidden_size`.
    pub hidden_size: Arg,
    /// `num_attention_heads`.
    pub num_attention_heads: Arg,
    /// `num_query_groups` (the K/V heads).
    pub num_query_groups: Arg,
    /// `vocab_size` (the LM head).
    pub vocab_size: Arg,
    /// `ffn_hidden_size` (dense layers).
    pub ffn_hidden_size: Arg,
    /// `None` for a dense model; any integer (even 0) means MoE.
    pub num_experts: Arg,
    /// May be negative (then no layers, as `range` of a negative count is empty).
    pub num_layers: Arg,
    /// `kv_channels` (the head dimension without MLA).
    pub kv_channels: Arg,
    /// `moe_ffn_hidden_size` (one expert).
    pub moe_ffn_hidden_size: Arg,
    /// `moe_router_topk` (experts per token).
    pub moe_router_topk: Arg,
    /// Missing and `None` both count as 0 (slime reads it with `getattr(…, None)`).
    pub moe_shared_expert_intermediate_size: Arg,
    /// `moe_layer_freq`: which layers are MoE.
    pub moe_layer_freq: LayerFreq,
    /// `bool(getattr(args, "multi_latent_attention", False))`.
    pub multi_latent_attention: bool,
    /// `q_lora_rank` (MLA; `None`: no q LoRA).
    pub q_lora_rank: Arg,
    /// `kv_lora_rank` (MLA; `None`: no kv LoRA, the K/V projection uses `kv_channels`).
    pub kv_lora_rank: Arg,
    /// `qk_head_dim` (MLA).
    pub qk_head_dim: Arg,
    /// `qk_pos_emb_head_dim` (MLA).
    pub qk_pos_emb_head_dim: Arg,
    /// `v_head_dim` (MLA).
    pub v_head_dim: Arg,
}

/// A result of [`calculate_fwd_flops`]: a Python `float`, or an `int` when no layer term was
/// added (no seqlens, or no layers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Flops {
    /// A float (the attention term divides by 2).
    Float(f64),
    /// An exact integer.
    Int(u128),
}

/// A required non-negative integer attribute.
fn int_of(name: &str, a: Arg) -> Result<u128, SlimeError> {
    match a {
        Arg::Missing => Err(SlimeError::MissingAttribute(name.into())),
        Arg::None => Err(bad!("args.{name} is None; calculate_fwd_flops needs an integer ≥ 0")),
        Arg::Int(v) if v < 0 => Err(bad!("args.{name} = {v} is negative; it must be ≥ 0")),
        Arg::Int(v) => Ok(v as u128),
    }
}

/// `None` for a `None` attribute, else as [`int_of`].
fn opt_of(name: &str, a: Arg) -> Result<Option<u128>, SlimeError> {
    match a {
        Arg::None => Ok(None),
        _ => int_of(name, a).map(Some),
    }
}

/// The exact product (Python ints), or `invalid-argument` beyond 2^128.
fn prod(factors: &[u128]) -> Result<u128, SlimeError> {
    let mut p: u128 = 1;
    for &f in factors {
        p = p.checked_mul(f).ok_or_else(|| bad!("a FLOPs term exceeds 2^128; the model arguments are too large"))?;
    }
    Ok(p)
}

fn add(a: u128, b: u128) -> Result<u128, SlimeError> {
    a.checked_add(b).ok_or_else(|| bad!("a FLOPs term exceeds 2^128; the model arguments are too large"))
}

/// slime's `calculate_layer_flops` for one sequence length and FFN width.
fn layer_flops(a: &FlopsArgs, s: u128, h: u128, heads: u128, groups: u128, ffn: u128) -> Result<f64, SlimeError> {
    let mla = a.multi_latent_attention;
    // calculate_qkv_projection_flops
    let q = match if mla { opt_of("q_lora_rank", a.q_lora_rank)? } else { None } {
        Some(q_lora) => {
            let hs = int_of("hidden_size", a.hidden_size)?;
            let nh = int_of("num_attention_heads", a.num_attention_heads)?;
            let qk = int_of("qk_head_dim", a.qk_head_dim)?;
            let pos = int_of("qk_pos_emb_head_dim", a.qk_pos_emb_head_dim)?;
            prod(&[2, s, q_lora, add(hs, prod(&[nh, add(qk, pos)?])?)?])?
        }
        None => {
            let q_head_dim = if mla {
                add(int_of("qk_head_dim", a.qk_head_dim)?, int_of("qk_pos_emb_head_dim", a.qk_pos_emb_head_dim)?)?
            } else {
                int_of("kv_channels", a.kv_channels)?
            };
            prod(&[2, s, h, heads, q_head_dim])?
        }
    };
    let kv = match if mla { opt_of("kv_lora_rank", a.kv_lora_rank)? } else { None } {
        Some(kv_lora) => {
            let hs = int_of("hidden_size", a.hidden_size)?;
            let nh = int_of("num_attention_heads", a.num_attention_heads)?;
            let qk = int_of("qk_head_dim", a.qk_head_dim)?;
            let v = int_of("v_head_dim", a.v_head_dim)?;
            let hs2 = int_of("hidden_size", a.hidden_size)?;
            let pos = int_of("qk_pos_emb_head_dim", a.qk_pos_emb_head_dim)?;
            let inner = add(prod(&[kv_lora, add(hs, prod(&[nh, add(qk, v)?])?)?])?, prod(&[hs2, pos])?)?;
            prod(&[2, s, inner])?
        }
        None => prod(&[2, 2, s, h, groups, int_of("kv_channels", a.kv_channels)?])?,
    };
    let qkv = add(q, kv)?;
    // calculate_attention_flops: an int product divided by 2 (true division: the rounded
    // product halved, which is the correctly rounded quotient), then an int product added.
    let (qk_dim, av_dim) = if mla {
        let qk = add(int_of("qk_head_dim", a.qk_head_dim)?, int_of("qk_pos_emb_head_dim", a.qk_pos_emb_head_dim)?)?;
        (qk, int_of("v_head_dim", a.v_head_dim)?)
    } else {
        let kv = int_of("kv_channels", a.kv_channels)?;
        (kv, kv)
    };
    let mut att = prod(&[2, heads, s, s, qk_dim])? as f64 / 2.0;
    att += prod(&[heads, s, s, av_dim])? as f64;
    let out = prod(&[2, s, h, h])?;
    let mlp = prod(&[2, s, h, ffn, 3])?;
    Ok(((qkv as f64 + att) + out as f64) + mlp as f64)
}

/// slime's `calculate_fwd_flops(seqlens, args)`: for each length in order, the dense layers'
/// FLOPs times their count, the MoE layers' times theirs, then the LM head, added to a total
/// that starts at the integer 0.
///
/// Errors: [`SlimeError::MissingAttribute`] for the first attribute slime would read and
/// `args` lacks; `invalid-argument` for a `None` or negative dimension (slime: `TypeError`
/// or a negative count), `moe_layer_freq` = 0 with layers (slime: `ZeroDivisionError`), or
/// products beyond 2^128.
pub fn calculate_fwd_flops(seqlens: &[u64], a: &FlopsArgs) -> Result<Flops, SlimeError> {
    let h = int_of("hidden_size", a.hidden_size)?;
    let heads = int_of("num_attention_heads", a.num_attention_heads)?;
    let groups = int_of("num_query_groups", a.num_query_groups)?;
    let vocab = int_of("vocab_size", a.vocab_size)?;
    let dense_ffn = int_of("ffn_hidden_size", a.ffn_hidden_size)?;
    let layers = |a: &FlopsArgs| match a.num_layers {
        Arg::Int(v) => Ok(v),
        Arg::Missing => Err(SlimeError::MissingAttribute("num_layers".into())),
        Arg::None => Err(bad!("args.num_layers is None; calculate_fwd_flops needs an integer")),
    };
    let (num_dense, num_moe, moe_ffn) = match a.num_experts {
        Arg::Missing => return Err(SlimeError::MissingAttribute("num_experts".into())),
        Arg::None => (layers(a)?, 0i64, 0u128),
        Arg::Int(_) => {
            let shared = match a.moe_shared_expert_intermediate_size {
                Arg::Missing | Arg::None => 0,
                x => int_of("moe_shared_expert_intermediate_size", x)?,
            };
            let moe_ffn = add(
                prod(&[
                    int_of("moe_ffn_hidden_size", a.moe_ffn_hidden_size)?,
                    int_of("moe_router_topk", a.moe_router_topk)?,
                ])?,
                shared,
            )?;
            let (d, m) = match &a.moe_layer_freq {
                LayerFreq::Pattern(p) => {
                    (p.iter().filter(|&&f| f == 0).count() as i64, p.iter().filter(|&&f| f > 0).count() as i64)
                }
                LayerFreq::Every(f) => {
                    let n = layers(a)?.max(0);
                    if n > 0 && *f == 0 {
                        return Err(bad!(
                            "args.moe_layer_freq = 0 with layers; it must not be 0 (slime divides by it)"
                        ));
                    }
                    // i % f == 0 exactly when |f| divides i, whatever the signs.
                    let m = if n == 0 { 0 } else { (n - 1) / f.unsigned_abs().min(i64::MAX as u64) as i64 + 1 };
                    (n - m, m)
                }
                LayerFreq::Missing => (0, layers(a)?),
            };
            (d, m, moe_ffn)
        }
    };
    let mut total = Flops::Int(0);
    let plus = |t: Flops, x: f64| match t {
        Flops::Int(i) => Flops::Float(i as f64 + x),
        Flops::Float(f) => Flops::Float(f + x),
    };
    for &seqlen in seqlens {
        let s = u128::from(seqlen);
        if num_dense > 0 {
            total = plus(total, layer_flops(a, s, h, heads, groups, dense_ffn)? * num_dense as f64);
        }
        if num_moe > 0 {
            total = plus(total, layer_flops(a, s, h, heads, groups, moe_ffn)? * num_moe as f64);
        }
        let lm = prod(&[2, s, h, vocab])?;
        total = match total {
            Flops::Int(i) => Flops::Int(add(i, lm)?),
            Flops::Float(f) => Flops::Float(f + lm as f64),
        };
    }
    Ok(total)
}
