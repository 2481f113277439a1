//! Qwen 3: the Llama decoder with per-head q/k RMS norms and an explicit head_dim
//! (mlx-lm's `models/qwen3.py`).

use super::llama::{Family, Llama};
use crate::config::Config;
use crate::weights::Weights;
use crate::Result;

/// Qwen 3's options on the shared decoder.
pub fn family() -> Family {
    Family {
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: true,
        head_dim_required: true,
        default_rope_theta: None,
        moe: false,
        default_tie: None,
    }
}

/// Loads a Qwen 3 checkpoint.
pub fn load(config: &Config, weights: &Weights) -> Result<Llama> {
    Llama::load_family(config, weights, &family())
}
