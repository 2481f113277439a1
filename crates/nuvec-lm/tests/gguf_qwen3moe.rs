//! A GGUF of llama.cpp's `qwen3moe` architecture (router in F32, experts stacked in 3-D Q4_0,
//! Q8_0 and Q4_1 tensors, recorded by `scripts/oracle/more/gguf_qwen3moe.py`) loads as Qwen3-MoE
//! and answers as mlx-lm does on the dense f32 checkpoint of the same values: its tokenizer
//! encodes the prompt to the recorded ids, its logits are within f32 rounding teacher-forced and
//! its greedy tokens equal mlx-lm's; and `nuvec convert` writes it as an MLX checkpoint that
//! mlx-lm loads and answers from with the same tokens (and with `-d` as a dense one that answers
//! as the oracle's own checkpoint).

mod common;

use std::path::PathBuf;

use common::gguf_oracle::{check_against_oracle, mlx_lm_tokens, our_tokens};
use common::*;
use nuvec_lm::convert::{convert, ConvertOptions};

fn case() -> PathBuf {
    fixtures().join("gguf-qwen3moe")
}

#[test]
fn qwen3moe_gguf_answers_like_mlx_lm() {
    let dir = case();
    let oracle = oracle_json(&dir);
    let (model, tokenizer) = nuvec_lm::load(dir.join("model.gguf").to_str().unwrap()).unwrap();
    assert_eq!(model.model_type(), "qwen3_moe");
    let prompt = ids(&oracle["prompt_ids"]);
    assert_eq!(tokenizer.encode(oracle["prompt"].as_str().unwrap(), true).unwrap(), prompt);
    check_against_oracle(&model, &prompt, &dir);
}

#[test]
fn qwen3moe_gguf_converts_to_a_checkpoint_mlx_lm_answers_from() {
    let dir = case();
    let oracle = oracle_json(&dir);
    let prompt = oracle["prompt"].as_str().unwrap();
    let out = std::env::temp_dir().join(format!("nuvec-gguf-qwen3moe-{}", std::process::id()));
    std::fs::remove_dir_all(&out).ok();
    // Q4_0, Q4_1 and Q8_0 are groups of 32, which MLX has: every matrix kept exactly.
    convert(dir.join("model.gguf").to_str().unwrap(), &out, &ConvertOptions::default()).unwrap();
    let want = ids(&oracle["greedy_tokens"]);
    let steps = want.len();
    assert_eq!(mlx_lm_tokens(&out, steps, prompt), want, "mlx-lm on the converted checkpoint");
    assert_eq!(our_tokens(&out, steps, prompt), want, "nuvec on the converted checkpoint");
    std::fs::remove_dir_all(&out).ok();
    // -d in f32 (the scales are f16: by default the dense weights would take that type, as
    // mlx_lm.convert -d does): llama.cpp's values, the stacked experts keeping their [experts,
    // rows, cols] shape; the oracle's own checkpoint, up to summation order.
    let options = ConvertOptions { dequantize: true, dtype: Some(nuvec::DType::F32), ..Default::default() };
    convert(dir.join("model.gguf").to_str().unwrap(), &out, &options).unwrap();
    let (model, _) = nuvec_lm::load(out.to_str().unwrap()).unwrap();
    check_against_oracle(&model, &ids(&oracle["prompt_ids"]), &dir);
    std::fs::remove_dir_all(&out).ok();
}
