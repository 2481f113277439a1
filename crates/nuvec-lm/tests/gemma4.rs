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
use nuvec::io::SafetensorsFile;
use nuvec_lm::cache::{CacheOptions, LayerCache};
use nuvec_lm::sample::argmax;
use nuvec_lm::{generate, GenerateOptions, Model};

/// Summation order alone: the tolerance of an f32 computation (as in parity.rs).
const F32_TOLERANCE: f32 = 2e-3;

const CASES: [&str; 7] = [
    "gemma4-f32",
    "gemma4-q4g64",
    "gemma4_moe-f32",
    "gemma4_moe-q4g64",
    "gemma4_moe-hf",
    "gemma4-wrapper-hf",
    "gemma4-wrapper-q4g64",
];

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

/// One recorded greedy run: mlx-lm's tokens, margins and logits.
struct Record {
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    margins: Vec<f32>,
    first: Vec<f32>,
    top_ids: Vec<f32>,
    top_logits: Vec<f32>,
    k: usize,
}

/// `{name}.json` and `{name}.safetensors` of a case (`oracle`, or `chunked`).
fn record(dir: &Path, name: &str) -> Record {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap()).unwrap();
    let file = SafetensorsFile::open(dir.join(format!("{name}.safetensors"))).unwrap();
    let get = |t: &str| file.array(t).unwrap().to_f32_vec().unwrap();
    Record {
        prompt: ids(&json["prompt_ids"]),
        tokens: ids(&json["greedy_tokens"]),
        margins: floats(&json["margins"]),
        first: get("first_logits"),
        top_ids: get("step_top_ids"),
        top_logits: get("step_top_logits"),
        k: file.array("step_top_ids").unwrap().shape()[1],
    }
}

fn last_logits(model: &Model, tokens: &[u32], cache: &mut [LayerCache]) -> Result<Vec<f32>, String> {
    let out = model.forward_last(tokens, cache).map_err(|e| e.to_string())?;
    Ok(out.to_vec::<f32>().unwrap())
}

/// Compares `model` with a recorded run, the prompt prefilled `step` positions per forward pass
/// (as mlx-lm's generate_step: all but the last token in chunks, then the last alone).
fn check_run(what: &str, model: &Model, r: &Record, step: usize) -> Result<String, String> {
    // Teacher-forced on mlx-lm's tokens.
    let mut cache = model.new_cache();
    let (body, last) = r.prompt.split_at(r.prompt.len() - 1);
    for chunk in body.chunks(step) {
        model.prefill(chunk, &mut cache).map_err(|e| e.to_string())?;
    }
    let mut logits = last_logits(model, last, &mut cache)?;
    if logits.len() != r.first.len() {
        return Err(format!("{what}: {} logits, mlx-lm has {}", logits.len(), r.first.len()));
    }
    let first_diff = logits.iter().zip(&r.first).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    if first_diff > F32_TOLERANCE {
        return Err(format!("{what}: first-step logits differ by up to {first_diff} (tolerance {F32_TOLERANCE})"));
    }
    let (k, mut worst) = (r.k, 0f32);
    for (i, &token) in r.tokens.iter().enumerate() {
        for j in 0..k {
            let id = r.top_ids[i * k + j] as usize;
            let (ours, theirs) = (logits[id], r.top_logits[i * k + j]);
            worst = worst.max((ours - theirs).abs());
            if (ours - theirs).abs() > F32_TOLERANCE {
                return Err(format!("{what}: step {i}, token {id}: logit {ours} vs mlx-lm's {theirs}"));
            }
        }
        let ours = argmax(&logits);
        if ours != token && r.margins[i] > 2.0 * F32_TOLERANCE {
            return Err(format!("{what}: step {i}: argmax {ours}, mlx-lm {token} (margin {})", r.margins[i]));
        }
        logits = last_logits(model, &[token], &mut cache)?;
    }

    // Free-running, through the library's decode loop (greedy by default).
    let options = GenerateOptions {
        max_tokens: r.tokens.len(),
        ignore_eos: true,
        seed: Some(0),
        prefill_step_size: step,
        ..Default::default()
    };
    let generated: Vec<u32> = generate(model, &r.prompt, options)
        .map_err(|e| e.to_string())?
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let agreed = generated.iter().zip(&r.tokens).take_while(|(a, b)| a == b).count();
    // A near-tie is the only excuse for parting ways.
    if agreed < r.tokens.len() && r.margins[agreed] > 2.0 * F32_TOLERANCE {
        return Err(format!(
            "{what}: generated {:?} at step {agreed}, mlx-lm {} (margin {})",
            generated.get(agreed),
            r.tokens[agreed],
            r.margins[agreed]
        ));
    }
    Ok(format!(
        "{what}: ok (first step max diff {first_diff:.2e}, worst top-{k} diff {worst:.2e}, {agreed}/{} generated \
         tokens equal)",
        r.tokens.len()
    ))
}

fn check_case(case: &str) -> Result<String, String> {
    let dir = case_dir(case);
    let oracle = oracle_json(&dir);
    let (model, tokenizer) = nuvec_lm::load_dir(&dir).map_err(|e| format!("{case}: load failed: {e}"))?;
    let r = record(&dir, "oracle");
    let ours = tokenizer.encode(oracle["prompt"].as_str().unwrap(), true).map_err(|e| e.to_string())?;
    if ours != r.prompt {
        return Err(format!("{case}: prompt ids {ours:?} != mlx-lm's {:?}", r.prompt));
    }
    let window = text_config(&dir)["sliding_window"].as_u64().unwrap() as usize;
    if r.prompt.len() <= window || r.tokens.len() < 4 * window {
        return Err(format!("{case}: the recording does not run past the sliding window of {window}"));
    }
    check_run(case, &model, &r, 2048)
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

/// The prompt prefilled 4 tokens at a time: chunks attend over caches that already hold
/// positions, through the window, in the computing layers and the KV-shared ones.
#[test]
fn chunked_prefill_matches_mlx_lm() {
    let dir = case_dir("gemma4-f32");
    let r = record(&dir, "chunked");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("chunked.json")).unwrap()).unwrap();
    let step = json["prefill_step_size"].as_u64().unwrap() as usize;
    assert!(step < r.prompt.len() / 2, "the recording must prefill in several chunks");
    let model = nuvec_lm::load_model(&dir).unwrap();
    match check_run("gemma4-f32, chunked prefill", &model, &r, step) {
        Ok(line) => eprintln!("{line}"),
        Err(e) => panic!("{e}"),
    }
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
