//! Qwen 3 MoE: Qwen 3's decoder with mixture-of-experts feed-forward layers
//! (mlx-lm's `models/qwen3_moe.py`).

use super::llama::{Family, Llama};
use crate::config::Config;
use crate::weights::Weights;
use crate::Result;

/// Loads a Qwen 3 MoE checkpoint.
pub fn load(config: &Config, weights: &Weights) -> Result<Llama> {
    let family = Family {
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: true,
        head_dim_required: true,
        default_rope_theta: None,
        moe: true,
        default_tie: None,
    };
    Llama::load_family(config, weights, &family)
}
