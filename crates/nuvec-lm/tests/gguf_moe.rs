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

use common::gguf_oracle::{check_against_oracle, mlx_lm_tokens, our_tokens};
use common::*;
use nuvec_lm::convert::{convert, ConvertOptions};

fn answers_like_mlx_lm(case: &str, model_type: &str) {
    let dir = fixtures().join(case);
    let oracle = oracle_json(&dir);
    let (model, tokenizer) = nuvec_lm::load(dir.join("model.gguf").to_str().unwrap()).unwrap();
    assert_eq!(model.model_type(), model_type);
    let prompt = ids(&oracle["prompt_ids"]);
    assert_eq!(tokenizer.encode(oracle["prompt"].as_str().unwrap(), true).unwrap(), prompt);
    check_against_oracle(&model, &prompt, &dir);
}

fn converts_to_checkpoints_mlx_lm_answers_from(case: &str) {
    let dir = fixtures().join(case);
    let oracle = oracle_json(&dir);
    let prompt = oracle["prompt"].as_str().unwrap();
    let gguf = dir.join("model.gguf");
    let out = std::env::temp_dir().join(format!("nuvec-{case}-{}", std::process::id()));
    std::fs::remove_dir_all(&out).ok();
    // Q4_0, Q4_1, Q8_0 (affine groups of 32) and MXFP4 (MLX's mxfp4) are kept exactly.
    convert(gguf.to_str().unwrap(), &out, &ConvertOptions::default()).unwrap();
    let want = ids(&oracle["greedy_tokens"]);
    let steps = want.len();
    assert_eq!(mlx_lm_tokens(&out, steps, prompt), want, "{case}: mlx-lm on the converted checkpoint");
    assert_eq!(our_tokens(&out, steps, prompt), want, "{case}: nuvec on the converted checkpoint");
    std::fs::remove_dir_all(&out).ok();
    // -d in f32 (by default the dense weights would take the f16 scales' type, and mxfp4 bf16, as
    // mlx_lm.convert -d writes them): llama.cpp's values, the stacked experts keeping their
    // [experts, rows, cols] shape; the oracle's own checkpoint, up to summation order.
    let options = ConvertOptions { dequantize: true, dtype: Some(nuvec::DType::F32), ..Default::default() };
    convert(gguf.to_str().unwrap(), &out, &options).unwrap();
    let (model, _) = nuvec_lm::load(out.to_str().unwrap()).unwrap();
    check_against_oracle(&model, &ids(&oracle["prompt_ids"]), &dir);
    std::fs::remove_dir_all(&out).ok();
}

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
