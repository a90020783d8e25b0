//! `top-reward`: the groups with the highest mean reward first; groups without a reward go
//! last; ties keep buffer order (oldest first).
//!
//! Config (JSON object, every key optional):
//! - `reward_index` (integer ≥ 0, default 0): which reward of each sample to average;
//! - `min_reward` (number): groups whose mean is below it are never served from the buffer
//!   (the dataset fills the request instead).

use stowplan_filter_guest::{Buffer, Context, Guest};

struct TopReward;

fn config(text: &str) -> Result<(usize, Option<f64>), String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("config is not JSON: {e}"))?;
    let obj = v.as_object().ok_or("config must be a JSON object")?;
    for key in obj.keys() {
        if key != "reward_index" && key != "min_reward" {
            return Err(format!("unknown config key {key:?}; known: reward_index, min_reward"));
        }
    }
    let reward_index = match obj.get("reward_index") {
        None => 0,
        Some(v) => v.as_u64().ok_or_else(|| format!("reward_index must be an integer >= 0 (got {v})"))? as usize,
    };
    let min_reward = match obj.get("min_reward") {
        None => None,
        Some(v) => Some(v.as_f64().ok_or_else(|| format!("min_reward must be a number (got {v})"))?),
    };
    Ok((reward_index, min_reward))
}

impl Guest for TopReward {
    fn select(ctx: Context, buffer: Buffer) -> Result<Vec<u32>, String> {
        let (reward_index, min_reward) = config(&ctx.config)?;
        let mut ranked: Vec<(u32, f64)> = (0..buffer.groups())
            .map(|g| (g as u32, buffer.group_mean_reward(g, reward_index).unwrap_or(f64::NEG_INFINITY)))
            .filter(|&(_, mean)| min_reward.is_none_or(|m| mean >= m))
            .collect();
        // Highest mean first, equal means in buffer order: a total order, so the top `wanted`
        // can be found by selection and only they sorted.
        let order = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let wanted = (ctx.wanted as usize).min(ranked.len());
        if wanted == 0 {
            return Ok(Vec::new());
        }
        if wanted < ranked.len() {
            ranked.select_nth_unstable_by(wanted - 1, order);
            ranked.truncate(wanted);
        }
        ranked.sort_unstable_by(order);
        Ok(ranked.into_iter().map(|(g, _)| g).collect())
    }
}

stowplan_filter_guest::export_filter!(TopReward);
