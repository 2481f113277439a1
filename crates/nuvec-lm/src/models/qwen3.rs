//! Qwen 3: the Llama decoder with per-head q/k RMS norms and an explicit head_dim
//! (mlx-lm's `models/qwen3.py`).

use super::llama::{Family, Llama};
use crate::config::Config;
use crate::weights::Weights;
use crate::Result;

/// Loads a Qwen 3 checkpoint.
pub fn load(config: &Config, weights: &Weights) -> Result<Llama> {
    let family = Family {
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: true,
        head_dim_required: true,
        default_rope_theta: None,
        moe: false,
        default_tie: None,
    };
    Llama::load_family(config, weights, &family)
}
