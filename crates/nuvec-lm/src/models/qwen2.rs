//! Qwen 2: the Llama decoder with q/k/v biases (mlx-lm's `models/qwen2.py`).

use super::llama::{Family, Llama};
use crate::config::Config;
use crate::weights::Weights;
use crate::Result;

/// Loads a Qwen 2 checkpoint.
pub fn load(config: &Config, weights: &Weights) -> Result<Llama> {
    Llama::load_family(config, weights, &family())
}

/// Qwen 2's options on the shared decoder.
pub fn family() -> Family {
    Family {
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        qk_norm: false,
        head_dim_required: false,
        default_rope_theta: Some(1_000_000.0),
        moe: false,
        default_tie: Some(true),
    }
}
