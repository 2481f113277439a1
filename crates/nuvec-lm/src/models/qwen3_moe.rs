//! Qwen 3 MoE: Qwen 3's decoder with mixture-of-experts feed-forward layers
//! (mlx-lm's `models/qwen3_moe.py`).

use super::llama::{Family, Llama};
use crate::config::Config;
use crate::weights::Weights;
use crate::Result;

/// Loads a Qwen 3 MoE checkpoint.
pub fn load(config: &Config, weights: &Weights) -> Result<Llama> {
    Llama::load_family(config, weights, &family())
}

/// Qwen 3 MoE's options on the shared decoder.
pub fn family() -> Family {
    Family { moe: true, ..super::qwen3::family() }
}
