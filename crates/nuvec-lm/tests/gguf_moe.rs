//! GGUFs of llama.cpp's mixture-of-experts architectures load as their families and answer as
//! mlx-lm does on the dense f32 checkpoint of the same values (recorded by
//! `scripts/oracle/more/gguf_{qwen3moe,gptoss}.py`): the tokenizer encodes the prompt to the
//! recorded ids, the logits are within f32 rounding teacher-forced and the greedy tokens equal
//! mlx-lm's; `nuvec convert` writes each as an MLX checkpoint that mlx-lm loads and answers from
//! with the same tokens, and with `-d` (in f32) as a dense one that answers as the oracle's own
//! checkpoint.
//!
//! - `qwen3moe`: the router in F32, the experts stacked in 3-D Q4_0, Q8_0 and Q4_1 tensors.
//! - `gpt-oss`: the experts stacked in 3-D MXFP4 tensors (read exactly as MLX's mxfp4) with F32
//!   biases, attention sinks, biased q/k/v/o and router, yarn rope, a sliding window on every
//!   other layer.

mod common;

use common::gguf_oracle::{answers_like_mlx_lm, converts_to_checkpoints_mlx_lm_answers_from};

#[test]
fn qwen3moe_gguf_answers_like_mlx_lm() {
    answers_like_mlx_lm("gguf-qwen3moe", "qwen3_moe");
}

#[test]
fn qwen3moe_gguf_converts_to_checkpoints_mlx_lm_answers_from() {
    converts_to_checkpoints_mlx_lm_answers_from("gguf-qwen3moe");
}

#[test]
fn gptoss_gguf_answers_like_mlx_lm() {
    answers_like_mlx_lm("gguf-gptoss", "gpt_oss");
}

#[test]
fn gptoss_gguf_converts_to_checkpoints_mlx_lm_answers_from() {
    converts_to_checkpoints_mlx_lm_answers_from("gguf-gptoss");
}
