//! A model against an oracle record (mlx-lm on a dense f32 checkpoint, or on the quantized original):
//! teacher-forced logits, then free-running greedy tokens; and mlx-lm / nuvec greedy runs.

use std::path::Path;
use std::process::Command;

use nuvec_lm::sample::argmax;
use nuvec_lm::{generate, GenerateOptions, Model};

use nuvec_lm::convert::{convert, ConvertOptions};

use super::{fixtures, greedy_record, ids, oracle_json, GreedyRecord};

/// Summation order alone: the tolerance of an f32 computation (as parity.rs).
pub const F32_TOLERANCE: f32 = 2e-3;

fn logits_after(model: &Model, tokens: &[u32], cache: &mut [nuvec_lm::cache::LayerCache]) -> Vec<f32> {
    model.forward_last(tokens, cache).unwrap().to_vec::<f32>().unwrap()
}

/// Teacher-forced on mlx-lm's tokens, our logits (first step whole, then its top 16 per step)
/// within the f32 tolerance; then decoding freely, the same greedy tokens.
pub fn check_against_oracle(model: &Model, prompt: &[u32], dir: &Path) {
    let oracle = oracle_json(dir);
    let GreedyRecord { tokens, margins, first, top_ids, top_logits, k } = greedy_record(dir, &oracle);

    // mlx-lm computed the dense f32 checkpoint: an f32 cache, not the GGUF default (f16).
    let f32_cache =
        nuvec_lm::cache::CacheOptions { kv_dtype: Some(nuvec_lm::cache::KvDtype::F32), ..Default::default() };
    let mut cache = model.make_cache(&f32_cache).unwrap();
    let mut logits = logits_after(model, prompt, &mut cache);
    assert_eq!(logits.len(), first.len());
    let worst = logits.iter().zip(&first).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= F32_TOLERANCE, "first-step logits differ by up to {worst}");
    for (step, &token) in tokens.iter().enumerate() {
        for j in 0..k {
            let id = top_ids[step * k + j] as usize;
            let (ours, theirs) = (logits[id], top_logits[step * k + j]);
            assert!((ours - theirs).abs() <= F32_TOLERANCE, "step {step}, token {id}: logit {ours} vs mlx-lm {theirs}");
        }
        logits = logits_after(model, &[token], &mut cache);
    }

    let mut cache = model.make_cache(&f32_cache).unwrap();
    let mut logits = logits_after(model, prompt, &mut cache);
    for (step, &token) in tokens.iter().enumerate() {
        let ours = argmax(&logits);
        // Every recorded margin exceeds twice the tolerance (the script picks the seed), so every
        // token must agree.
        assert!(
            margins[step] > 2.0 * F32_TOLERANCE,
            "step {step}: the oracle's margin {} is a near-tie",
            margins[step]
        );
        assert_eq!(ours, token, "free-running step {step}");
        logits = logits_after(model, &[ours], &mut cache);
    }
}

/// mlx-lm's greedy run on `dir` (`mode`: "raw" prompt or "chat" template; stopping at end of
/// sequence): (prompt ids, tokens).
pub fn mlx_lm(dir: &Path, mode: &str, max_tokens: usize, prompt: &str) -> (Vec<u32>, Vec<u32>) {
    let python = std::env::var("NUVEC_ORACLE_PYTHON").expect("NUVEC_ORACLE_PYTHON is not set: run scripts/test.sh");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/mlx_generate.py");
    let out = Command::new(python)
        .arg(&script)
        .arg(dir)
        .arg(mode)
        .arg(max_tokens.to_string())
        .arg(prompt)
        .output()
        .expect("run the oracle's python");
    assert!(out.status.success(), "mlx-lm failed on {}:\n{}", dir.display(), String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (ids(&v["prompt_ids"]), ids(&v["tokens"]))
}

/// mlx-lm's greedy tokens on `dir` from the raw prompt.
pub fn mlx_lm_tokens(dir: &Path, max_tokens: usize, prompt: &str) -> Vec<u32> {
    mlx_lm(dir, "raw", max_tokens, prompt).1
}

pub fn our_tokens(path: &Path, max_tokens: usize, prompt: &str) -> Vec<u32> {
    let (model, tokenizer) = nuvec_lm::load(path.to_str().unwrap()).unwrap();
    let ids = tokenizer.encode(prompt, true).unwrap();
    generate(&model, &ids, GenerateOptions { max_tokens, ..Default::default() }).unwrap().map(|t| t.unwrap()).collect()
}

/// The GGUF record `case` (scripts/oracle/more/gguf_*.py) loads as `model_type`, encodes the
/// prompt to the recorded ids and answers as mlx-lm did on the dense checkpoint.
pub fn answers_like_mlx_lm(case: &str, model_type: &str) {
    let dir = fixtures().join(case);
    let oracle = oracle_json(&dir);
    let (model, tokenizer) = nuvec_lm::load(dir.join("model.gguf").to_str().unwrap()).unwrap();
    assert_eq!(model.model_type(), model_type);
    let prompt = ids(&oracle["prompt_ids"]);
    assert_eq!(tokenizer.encode(oracle["prompt"].as_str().unwrap(), true).unwrap(), prompt);
    check_against_oracle(&model, &prompt, &dir);
}

/// `nuvec convert` writes the GGUF record `case` as an MLX checkpoint that mlx-lm and nuvec answer
/// from with the recorded tokens, and with `-d` (f32) as a dense one that answers as the oracle's.
pub fn converts_to_checkpoints_mlx_lm_answers_from(case: &str) {
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
