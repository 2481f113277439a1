//! A Llama 3.1 GGUF: llama.cpp's converter writes Llama 3's rope scaling as per-pair factors
//! (`rope_freqs`), which nuvec reads back into mlx-lm's `llama3` schedule
//! (`scripts/oracle/more/gguf_llama31.py`: scaled from an original context of 32, so that the
//! recorded positions turn by the scaled periods). The GGUF answers as mlx-lm does on the dense
//! f32 checkpoint with that `rope_scaling`, and `nuvec convert` writes a config.json whose
//! `rope_scaling` mlx-lm reads to the same tokens.

mod common;

use common::gguf_oracle::{answers_like_mlx_lm, converts_to_checkpoints_mlx_lm_answers_from};

#[test]
fn llama31_gguf_answers_like_mlx_lm() {
    answers_like_mlx_lm("gguf-llama31", "llama");
}

#[test]
fn llama31_gguf_converts_to_checkpoints_mlx_lm_answers_from() {
    converts_to_checkpoints_mlx_lm_answers_from("gguf-llama31");
}
