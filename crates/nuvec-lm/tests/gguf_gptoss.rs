//! A GGUF of llama.cpp's `gpt-oss` architecture (experts stacked in 3-D MXFP4 tensors with F32
//! biases, attention sinks, biased q/k/v/o and router, yarn rope, a sliding window on every
//! other layer; recorded by `scripts/oracle/more/gguf_gptoss.py`) loads as gpt-oss, its MXFP4
//! blocks read exactly as MLX's mxfp4 mode, and answers as mlx-lm does on the dense f32
//! checkpoint of the same values (logits teacher-forced within f32 rounding, greedy tokens
//! equal); `nuvec convert` writes it as an MLX checkpoint (experts in mxfp4) that mlx-lm loads
//! and answers from with the same tokens, and with `-d` as a dense one that answers as the
//! oracle's own checkpoint.

mod common;

use std::path::PathBuf;

use common::gguf_oracle::{check_against_oracle, mlx_lm_tokens, our_tokens};
use common::*;
use nuvec_lm::convert::{convert, ConvertOptions};

fn case() -> PathBuf {
    fixtures().join("gguf-gptoss")
}

#[test]
fn gptoss_gguf_answers_like_mlx_lm() {
    let dir = case();
    let oracle = oracle_json(&dir);
    let (model, tokenizer) = nuvec_lm::load(dir.join("model.gguf").to_str().unwrap()).unwrap();
    assert_eq!(model.model_type(), "gpt_oss");
    let prompt = ids(&oracle["prompt_ids"]);
    assert_eq!(tokenizer.encode(oracle["prompt"].as_str().unwrap(), true).unwrap(), prompt);
    check_against_oracle(&model, &prompt, &dir);
}

#[test]
fn gptoss_gguf_converts_to_a_checkpoint_mlx_lm_answers_from() {
    let dir = case();
    let oracle = oracle_json(&dir);
    let prompt = oracle["prompt"].as_str().unwrap();
    let out = std::env::temp_dir().join(format!("nuvec-gguf-gptoss-{}", std::process::id()));
    std::fs::remove_dir_all(&out).ok();
    // MXFP4 is MLX's mxfp4 and Q8_0 an affine group of 32: every matrix kept exactly.
    convert(dir.join("model.gguf").to_str().unwrap(), &out, &ConvertOptions::default()).unwrap();
    let want = ids(&oracle["greedy_tokens"]);
    let steps = want.len();
    assert_eq!(mlx_lm_tokens(&out, steps, prompt), want, "mlx-lm on the converted checkpoint");
    assert_eq!(our_tokens(&out, steps, prompt), want, "nuvec on the converted checkpoint");
    std::fs::remove_dir_all(&out).ok();
    // -d in f32 (by default mxfp4 comes out as bf16 and Q8_0 in its f16 scales' type, as
    // mlx_lm.convert -d writes them): llama.cpp's values, the stacked experts keeping their
    // [experts, rows, cols] shape; the oracle's own checkpoint, up to summation order.
    let options = ConvertOptions { dequantize: true, dtype: Some(nuvec::DType::F32), ..Default::default() };
    convert(dir.join("model.gguf").to_str().unwrap(), &out, &options).unwrap();
    let (model, _) = nuvec_lm::load(out.to_str().unwrap()).unwrap();
    check_against_oracle(&model, &ids(&oracle["prompt_ids"]), &dir);
    std::fs::remove_dir_all(&out).ok();
}
