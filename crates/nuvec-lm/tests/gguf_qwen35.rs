//! GGUFs of llama.cpp's Qwen3.5 hybrid architectures (`qwen35`, `qwen35moe`) load as mlx-lm's
//! `qwen3_5` / `qwen3_5_moe` and answer as mlx-lm does on the dense f32 checkpoint of the same
//! values (recorded by `scripts/oracle/more/gguf_qwen35.py`, written as llama.cpp's converter
//! writes them: `ssm_a` as -exp(A_log), the value heads tiled in every linear-attention tensor,
//! `ssm_out`'s columns included, the convolution squeezed, the norms as 1 + w): the tokenizer
//! encodes the prompt to the recorded ids, the logits are within f32 rounding teacher-forced and
//! the greedy tokens equal mlx-lm's; `nuvec convert` writes each as an MLX checkpoint that mlx-lm
//! loads and answers from with the same tokens, and with `-d` (in f32) as a dense one that
//! answers as the oracle's own checkpoint.
//!
//! - `qwen35`: Gated DeltaNet layers and gated full attention every second layer, a dense MLP.
//! - `qwen35moe`: the same with 8 stacked experts and a shared expert under its sigmoid gate.

mod common;

use common::gguf_oracle::{answers_like_mlx_lm, converts_to_checkpoints_mlx_lm_answers_from};

#[test]
fn qwen35_gguf_answers_like_mlx_lm() {
    answers_like_mlx_lm("gguf-qwen35", "qwen3_5");
}

#[test]
fn qwen35_gguf_converts_to_checkpoints_mlx_lm_answers_from() {
    converts_to_checkpoints_mlx_lm_answers_from("gguf-qwen35");
}

#[test]
fn qwen35moe_gguf_answers_like_mlx_lm() {
    answers_like_mlx_lm("gguf-qwen35moe", "qwen3_5_moe");
}

#[test]
fn qwen35moe_gguf_converts_to_checkpoints_mlx_lm_answers_from() {
    converts_to_checkpoints_mlx_lm_answers_from("gguf-qwen35moe");
}
