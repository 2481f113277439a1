//! Gemma 4 against mlx-lm 0.32.2 (`scripts/oracle/more/gemma4.py` records it): tiny random
//! checkpoints built by mlx-lm's own `gemma4_text` and `gemma4` classes, in f32 and 4-bit, dense
//! and MoE, text-only and inside the multimodal wrapper (Hugging Face and mlx-lm tensor names).
//!
//! For every case: the prompt encodes to mlx-lm's ids; teacher-forced on mlx-lm's greedy tokens,
//! our logits match its full first-step logits and its top-16 of every step within the f32
//! tolerance of `parity.rs`; and `generate` (the real decode loop) gives mlx-lm's 64 greedy
//! tokens. The prompt (14 tokens) is longer than the sliding window (8), so the window cuts the
//! prefill and every decode step, and the rotating caches wrap many times.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use nuvec_lm::cache::{CacheOptions, LayerCache};
use nuvec_lm::sample::argmax;
use nuvec_lm::{generate, GenerateOptions, Model};

/// Summation order alone: the tolerance of an f32 computation (as in parity.rs).
const F32_TOLERANCE: f32 = 2e-3;

const CASES: [&str; 6] =
    ["gemma4-f32", "gemma4-q4g64", "gemma4_moe-f32", "gemma4_moe-q4g64", "gemma4-wrapper-hf", "gemma4-wrapper-q4g64"];

fn case_dir(case: &str) -> PathBuf {
    let dir = fixtures().join("gemma4").join(case);
    assert!(dir.join("oracle.json").exists(), "{}: missing; rerun scripts/setup-oracle.sh", dir.display());
    dir
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|m| m.as_f64().unwrap() as f32).collect()
}

/// The text model's config (inside `text_config` for the wrapper).
fn text_config(dir: &Path) -> serde_json::Value {
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    match config.get("text_config") {
        Some(t) => t.clone(),
        None => config,
    }
}

fn last_logits(model: &Model, tokens: &[u32], cache: &mut [LayerCache]) -> Result<Vec<f32>, String> {
    let out = model.forward_last(tokens, cache).map_err(|e| e.to_string())?;
    Ok(out.to_vec::<f32>().unwrap())
}

fn check_case(case: &str) -> Result<String, String> {
    let dir = case_dir(case);
    let oracle = oracle_json(&dir);
    let (model, tokenizer) = nuvec_lm::load_dir(&dir).map_err(|e| format!("{case}: load failed: {e}"))?;
    let prompt = ids(&oracle["prompt_ids"]);
    let ours = tokenizer.encode(oracle["prompt"].as_str().unwrap(), true).map_err(|e| e.to_string())?;
    if ours != prompt {
        return Err(format!("{case}: prompt ids {ours:?} != mlx-lm's {prompt:?}"));
    }
    let tokens = ids(&oracle["greedy_tokens"]);
    let margins = floats(&oracle["margins"]);
    let window = text_config(&dir)["sliding_window"].as_u64().unwrap() as usize;
    if prompt.len() <= window || tokens.len() < 4 * window {
        return Err(format!("{case}: the recording does not run past the sliding window of {window}"));
    }

    // Teacher-forced on mlx-lm's tokens.
    let (first, _) = oracle_f32(&dir, "first_logits");
    let (top_ids, shape) = oracle_f32(&dir, "step_top_ids");
    let (top_logits, _) = oracle_f32(&dir, "step_top_logits");
    let k = shape[1];
    let mut cache = model.new_cache();
    let mut logits = last_logits(&model, &prompt, &mut cache)?;
    if logits.len() != first.len() {
        return Err(format!("{case}: {} logits, mlx-lm has {}", logits.len(), first.len()));
    }
    let first_diff = logits.iter().zip(&first).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    if first_diff > F32_TOLERANCE {
        return Err(format!("{case}: first-step logits differ by up to {first_diff} (tolerance {F32_TOLERANCE})"));
    }
    let mut worst = 0f32;
    for (step, &token) in tokens.iter().enumerate() {
        for j in 0..k {
            let id = top_ids[step * k + j] as usize;
            let (ours, theirs) = (logits[id], top_logits[step * k + j]);
            worst = worst.max((ours - theirs).abs());
            if (ours - theirs).abs() > F32_TOLERANCE {
                return Err(format!("{case}: step {step}, token {id}: logit {ours} vs mlx-lm's {theirs}"));
            }
        }
        let ours = argmax(&logits);
        if ours != token && margins[step] > 2.0 * F32_TOLERANCE {
            return Err(format!("{case}: step {step}: argmax {ours}, mlx-lm {token} (margin {})", margins[step]));
        }
        logits = last_logits(&model, &[token], &mut cache)?;
    }

    // Free-running, through the library's decode loop (greedy by default).
    let options = GenerateOptions { max_tokens: tokens.len(), ignore_eos: true, seed: Some(0), ..Default::default() };
    let generated: Vec<u32> = generate(&model, &prompt, options)
        .map_err(|e| e.to_string())?
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let agreed = generated.iter().zip(&tokens).take_while(|(a, b)| a == b).count();
    if agreed < tokens.len() {
        // A near-tie is the only excuse for parting ways.
        if margins[agreed] > 2.0 * F32_TOLERANCE {
            return Err(format!(
                "{case}: generated {:?} at step {agreed}, mlx-lm {} (margin {})",
                generated.get(agreed),
                tokens[agreed],
                margins[agreed]
            ));
        }
    }
    Ok(format!(
        "{case}: ok (first step max diff {first_diff:.2e}, worst top-{k} diff {worst:.2e}, {agreed}/{} generated tokens equal)",
        tokens.len()
    ))
}

#[test]
fn every_gemma4_case_matches_mlx_lm() {
    let mut failures = vec![];
    for case in CASES {
        match check_case(case) {
            Ok(line) => eprintln!("{line}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{} Gemma 4 cases differ from mlx-lm:\n{}", failures.len(), failures.join("\n"));
}

/// mlx-lm's make_cache: a rotating cache of the window for sliding layers, a plain one for full
/// layers, and none for the KV-shared layers.
#[test]
fn caches_follow_mlx_lm_make_cache() {
    let dir = case_dir("gemma4-f32");
    let config = text_config(&dir);
    let model = nuvec_lm::load_model(&dir).unwrap();
    let layers = config["num_hidden_layers"].as_u64().unwrap() as usize;
    let shared = config["num_kv_shared_layers"].as_u64().unwrap() as usize;
    assert!(shared > 0);
    let cache = model.new_cache();
    assert_eq!(cache.len(), layers - shared, "KV-shared layers must not have caches");
    for (c, kind) in cache.iter().zip(config["layer_types"].as_array().unwrap()) {
        match kind.as_str().unwrap() {
            "sliding_attention" => assert!(matches!(c, LayerCache::Rotating(_)), "{c:?}"),
            _ => assert!(matches!(c, LayerCache::Plain(_)), "{c:?}"),
        }
    }
    assert_eq!(model.make_cache(&CacheOptions::default()).unwrap().len(), layers - shared);
    // mlx-lm silently ignores max_kv_size for models that make their own caches; we refuse it.
    let bounded = CacheOptions { max_kv_size: Some(64), ..Default::default() };
    let err = model.make_cache(&bounded).unwrap_err().to_string();
    assert!(err.contains("max_kv_size"), "{err}");
    // A cache of the wrong length is an error, not a panic.
    let mut short = model.new_cache();
    short.pop();
    assert!(model.forward(&[2, 3], &mut short).is_err());
}

/// Broken configs give errors naming the field.
#[test]
fn bad_gemma4_configs_are_named() {
    let dir = case_dir("gemma4-f32");
    let config = text_config(&dir);
    let cases: [(&str, serde_json::Value, &str); 4] = [
        ("num_kv_shared_layers", serde_json::json!(8), "num_kv_shared_layers"),
        ("layer_types", serde_json::json!(["sliding_attention"]), "layer_types"),
        (
            "rope_parameters",
            serde_json::json!({"full_attention": {"rope_type": "yarn"}, "sliding_attention": {}}),
            "rope_type \"yarn\"",
        ),
        ("final_logit_softcapping", serde_json::json!(-1.0), "final_logit_softcapping"),
    ];
    for (field, value, expect) in cases {
        let tmp = std::env::temp_dir().join(format!("nuvec-gemma4-bad-{field}-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let mut broken = config.clone();
        broken[field] = value;
        std::fs::write(tmp.join("config.json"), broken.to_string()).unwrap();
        let link = tmp.join("model.safetensors");
        let _ = std::fs::remove_file(&link);
        std::fs::hard_link(dir.join("model.safetensors"), &link)
            .or_else(|_| std::fs::copy(dir.join("model.safetensors"), &link).map(|_| ()))
            .unwrap();
        let err = nuvec_lm::load_model(&tmp).unwrap_err().to_string();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert!(err.contains(expect) && err.contains("config.json"), "{field}: {err}");
    }
}
