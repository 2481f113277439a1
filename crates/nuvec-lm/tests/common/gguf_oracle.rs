//! A model against an oracle record (mlx-lm on a dense f32 checkpoint, or on the quantized original):
//! teacher-forced logits, then free-running greedy tokens; and mlx-lm / nuvec greedy runs.

use std::path::Path;
use std::process::Command;

use nuvec_lm::sample::argmax;
use nuvec_lm::{generate, GenerateOptions, Model};

use super::{ids, oracle_f32, oracle_json};

/// Summation order alone: the tolerance of an f32 computation (as parity.rs).
pub const F32_TOLERANCE: f32 = 2e-3;

fn logits_after(model: &Model, tokens: &[u32], cache: &mut [nuvec_lm::cache::LayerCache]) -> Vec<f32> {
    model.forward_last(tokens, cache).unwrap().to_vec::<f32>().unwrap()
}

/// Teacher-forced on mlx-lm's tokens, our logits (first step whole, then its top 16 per step)
/// within the f32 tolerance; then decoding freely, the same greedy tokens.
pub fn check_against_oracle(model: &Model, prompt: &[u32], dir: &Path) {
    let oracle = oracle_json(dir);
    let tokens = ids(&oracle["greedy_tokens"]);
    let margins: Vec<f32> = oracle["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap() as f32).collect();
    let (first, _) = oracle_f32(dir, "first_logits");
    let (top_ids, shape) = oracle_f32(dir, "step_top_ids");
    let (top_logits, _) = oracle_f32(dir, "step_top_logits");
    let k = shape[1];

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
