//! `generate` with the greedy sampler (what `nuvec generate` / `chat` run by default) against
//! mlx-lm's recorded greedy tokens, on every case mlx-lm computed in f32.
//!
//! A greedy step with nothing else needing the logits takes its token with `argmax_gap` where
//! the logits are, deferring to the host path (log-softmax over the whole row, then argmax) at
//! near ties; asking for log-probabilities runs the host path at every step. Both must give
//! mlx-lm's tokens up to the first step where mlx-lm's own top-2 margin is within twice the f32
//! tolerance (where either side of a near tie may win), and each other's tokens everywhere
//! (compared on every third case).

mod common;

use common::*;
use nuvec_lm::cache::{CacheOptions, KvDtype};
use nuvec_lm::{generate, GenerateOptions, Model};

/// The f32 logit tolerance of the parity suite.
const F32_TOLERANCE: f32 = 2e-3;

fn greedy(model: &Model, prompt: &[u32], steps: usize, logprobs: Option<usize>) -> Vec<u32> {
    let options = GenerateOptions {
        max_tokens: steps,
        ignore_eos: true,
        logprobs,
        cache: CacheOptions { kv_dtype: Some(KvDtype::F32), ..Default::default() },
        ..Default::default()
    };
    generate(model, prompt, options).unwrap().map(|t| t.unwrap()).collect()
}

#[test]
fn greedy_generation_matches_mlx_lm() {
    let (mut checked, mut whole) = (0, 0);
    for dir in cases() {
        let oracle = oracle_json(&dir);
        let in_f32 = oracle["dtype"].as_array().is_some_and(|d| d.iter().all(|t| t == "float32"));
        // Cases recorded from another checkpoint (AWQ/GPTQ: the dense one) or in bf16 are the
        // parity suite's; here only the runs whose tokens our f32 computation should reproduce.
        if !in_f32 || dir.join("precision_noise.json").exists() || oracle.get("source_checkpoint").is_some() {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let (model, _) = nuvec_lm::load_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let prompt = ids(&oracle["prompt_ids"]);
        let theirs = ids(&oracle["greedy_tokens"]);
        let margins: Vec<f32> =
            oracle["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap() as f32).collect();
        let ours = greedy(&model, &prompt, theirs.len(), None);
        if checked % 3 == 0 {
            // The host path on every third case (it is the slower one).
            let host = greedy(&model, &prompt, theirs.len(), Some(1));
            assert_eq!(ours, host, "{name}: the greedy step's device path and the host path disagree");
        }
        assert_eq!(ours.len(), theirs.len(), "{name}: tokens generated");
        match ours.iter().zip(&theirs).position(|(a, b)| a != b) {
            None => whole += 1,
            Some(step) => assert!(
                margins[step] <= 2.0 * F32_TOLERANCE,
                "{name}: step {step}: {} vs mlx-lm's {} (margin {})",
                ours[step],
                theirs[step],
                margins[step]
            ),
        }
        checked += 1;
    }
    println!("{checked} cases, {whole} with all greedy tokens equal to mlx-lm's");
    assert!(checked >= 10, "expected the f32 fixture cases, found {checked}");
}
