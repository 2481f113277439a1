//! Qwen3.5 hybrids (Gated DeltaNet + gated full attention) against mlx-lm's records
//! (`scripts/oracle/more/qwen3_5.py`): dense f32 and 4-bit, MoE with a shared expert, the
//! multimodal wrapper config (text_config, unread vision and MTP tensors) and Hugging Face
//! originals' layout (dense, and MoE with fused experts). For each:
//! - teacher-forced on mlx-lm's tokens (the prompt in one pass, then one token at a time), our
//!   logits match within parity.rs's f32 tolerance and our argmax is mlx-lm's token wherever
//!   its margin exceeds twice that;
//! - `generate` with mlx-lm's prefill step (several chunks, each longer than the convolution)
//!   gives mlx-lm's greedy tokens;
//! - a prompt-cache file round trip, a continued session and a session whose prompt changed
//!   (the recurrent state cannot be trimmed, so it starts afresh) give mlx-lm's tokens.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use nuvec_lm::cache::{CacheOptions, LayerCache};
use nuvec_lm::sample::argmax;
use nuvec_lm::{generate, generate_in, prompt_cache, GenerateOptions, Model, Session};

/// Summation order alone (parity.rs's tolerance).
const F32_TOLERANCE: f32 = 2e-3;

fn case_dirs() -> Vec<PathBuf> {
    let dir = fixtures().join("qwen3_5");
    let out = cases_in(&dir);
    let names: Vec<String> = out.iter().map(|p| p.file_name().unwrap().to_string_lossy().into()).collect();
    for want in ["qwen3_5-f32", "qwen3_5-q4g64", "qwen3_5_moe-f32", "qwen3_5-vl", "qwen3_5-hf", "qwen3_5_moe-hf"] {
        assert!(names.iter().any(|n| n == want), "missing case {want} in {}", dir.display());
    }
    out
}

fn greedy(max_tokens: usize, prefill_step_size: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, prefill_step_size, ..Default::default() }
}

fn run(model: &Model, session: &mut Session, prompt: &[u32], options: GenerateOptions) -> (Vec<u32>, usize) {
    let mut generation = generate_in(model, session, prompt, options).unwrap();
    let tokens: Vec<u32> = generation.by_ref().map(|t| t.unwrap()).collect();
    (tokens, generation.reused_tokens())
}

fn last_logits(model: &Model, tokens: &[u32], cache: &mut [LayerCache]) -> Vec<f32> {
    model.forward_last(tokens, cache).unwrap().to_vec::<f32>().unwrap()
}

/// Teacher-forced logits and free-running tokens against the recorded run.
fn check_parity(name: &str, dir: &Path, model: &Model) -> Result<String, String> {
    let oracle = oracle_json(dir);
    let prompt = ids(&oracle["prompt_ids"]);
    let GreedyRecord { tokens, margins, first, top_ids, top_logits, k } = greedy_record(dir, &oracle);

    let mut cache = model.new_cache();
    let mut logits = last_logits(model, &prompt, &mut cache);
    let first_diff = logits.iter().zip(&first).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    if logits.len() != first.len() || first_diff > F32_TOLERANCE {
        return Err(format!("{name}: first-step logits differ by up to {first_diff}"));
    }
    let mut worst = 0f32;
    for (step, &token) in tokens.iter().enumerate() {
        for j in 0..k {
            let id = top_ids[step * k + j] as usize;
            let diff = (logits[id] - top_logits[step * k + j]).abs();
            worst = worst.max(diff);
            if diff > F32_TOLERANCE {
                return Err(format!(
                    "{name}: step {step}, token {id}: {} vs mlx-lm {}",
                    logits[id],
                    top_logits[step * k + j]
                ));
            }
        }
        let ours = argmax(&logits);
        if ours != token && margins[step] > 2.0 * F32_TOLERANCE {
            return Err(format!("{name}: step {step}: argmax {ours}, mlx-lm {token} (margin {})", margins[step]));
        }
        logits = last_logits(model, &[token], &mut cache);
    }

    // Free-running through `generate`, prefilling in mlx-lm's chunks.
    let step = oracle["prefill_step_size"].as_u64().unwrap() as usize;
    assert!(prompt.len() > 2 * step, "{name}: the prompt should span several prefill chunks");
    let ours: Vec<u32> = generate(model, &prompt, greedy(tokens.len(), step)).unwrap().map(|t| t.unwrap()).collect();
    let agreed = ours.iter().zip(&tokens).take_while(|(a, b)| a == b).count();
    if agreed < tokens.len() && margins[agreed] > 2.0 * F32_TOLERANCE {
        return Err(format!("{name}: free-running token {agreed}: {} vs mlx-lm {}", ours[agreed], tokens[agreed]));
    }
    Ok(format!(
        "{name}: ok (first-step max diff {first_diff:.2e}, worst top-{k} {worst:.2e}, {agreed}/{} tokens equal)",
        tokens.len()
    ))
}

#[test]
fn every_qwen3_5_case_matches_mlx_lm() {
    let mut failures = vec![];
    for dir in case_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let (model, tokenizer) = nuvec_lm::load_dir(&dir).unwrap_or_else(|e| panic!("{name}: load failed: {e}"));
        let oracle = oracle_json(&dir);
        let encoded = tokenizer.encode(oracle["prompt"].as_str().unwrap(), true).unwrap();
        assert_eq!(encoded, ids(&oracle["prompt_ids"]), "{name}: prompt ids");
        assert!(model.eos_token_ids().contains(&151645), "{name}: eos ids {:?}", model.eos_token_ids());
        match check_parity(&name, &dir, &model) {
            Ok(line) => eprintln!("{line}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{} cases differ from mlx-lm:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn sessions_continue_restart_and_round_trip_through_prompt_cache_files() {
    for dir in case_dirs().iter().filter(|d| d.ends_with("qwen3_5-f32") || d.ends_with("qwen3_5_moe-f32")) {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let (model, _) = nuvec_lm::load_dir(dir).unwrap();
        let oracle = oracle_json(dir);
        let step = oracle["prefill_step_size"].as_u64().unwrap() as usize;
        let prompt = ids(&oracle["prompt_ids"]);
        let tokens = ids(&oracle["greedy_tokens"]);
        let kv = CacheOptions::default();

        // Linear layers hold recurrent caches, attention layers KV caches.
        let session = Session::new(&model);
        let kinds: Vec<bool> = session.cache().iter().map(|c| matches!(c, LayerCache::Recurrent(_))).collect();
        assert_eq!(kinds, [true, false, true, false], "{name}");

        // A prompt-cache file of the prompt's first 12 tokens, then the whole prompt.
        let mut session = Session::new(&model);
        session.prefill(&model, &prompt[..12], step, &kv).unwrap();
        let path = std::env::temp_dir().join(format!("nuvec-{name}-{}.safetensors", std::process::id()));
        prompt_cache::save(&path, &model, &name, &session, &kv, "").unwrap();
        let (mut restored, _) = prompt_cache::load(&path, &model, &kv).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(restored.tokens(), &prompt[..12]);
        let (from_file, reused) = run(&model, &mut restored, &prompt, greedy(tokens.len(), step));
        assert_eq!(reused, 12, "{name}: the file's tokens are reused");
        assert_eq!(from_file, tokens, "{name}: a prompt-cache round trip gives mlx-lm's tokens");

        // The recurrent state refuses any trim, leaving the session as it was.
        let held = restored.tokens().len();
        let err = restored.trim(1).unwrap_err().to_string();
        assert!(err.contains("recurrent"), "{name}: {err}");
        assert_eq!(restored.tokens().len(), held);
        assert!(restored.cache().iter().all(|c| c.offset() == held), "{name}: a refused trim changed a layer");
        restored.trim(0).unwrap();

        // A changed prompt: nothing can be reused, the session starts afresh and answers right.
        let changed = &oracle["changed_prompt"];
        let (answer, reused) = run(
            &model,
            &mut restored,
            &ids(&changed["prompt_ids"]),
            greedy(changed["greedy_tokens"].as_array().unwrap().len(), step),
        );
        assert_eq!(reused, 0, "{name}");
        assert_eq!(answer, ids(&changed["greedy_tokens"]), "{name}: tokens after a changed prompt");

        // A continued conversation: the prompt and some of its reply are reused, not recomputed.
        let continued = &oracle["continued_prompt"];
        let generated = continued["reused_generated"].as_u64().unwrap() as usize;
        let mut session = Session::new(&model);
        let (first, _) = run(&model, &mut session, &prompt, greedy(generated, step));
        assert_eq!(first, tokens[..generated]);
        let expect = ids(&continued["greedy_tokens"]);
        let (answer, reused) = run(&model, &mut session, &ids(&continued["prompt_ids"]), greedy(expect.len(), step));
        assert_eq!(reused, prompt.len() + generated - 1, "{name}: everything the session held is reused");
        assert_eq!(answer, expect, "{name}: tokens of the continued prompt");
    }
}

#[test]
fn quantized_kv_cache_quantizes_the_attention_layers_as_mlx_lm() {
    let dir = fixtures().join("qwen3_5").join("qwen3_5-f32");
    let (model, _) = nuvec_lm::load_dir(&dir).unwrap();
    let oracle = oracle_json(&dir);
    let record = &oracle["quantized_kv"];
    let count = |key: &str| record[key].as_u64().unwrap() as usize;
    let cache = CacheOptions {
        kv_bits: Some(count("kv_bits")),
        kv_group_size: count("kv_group_size"),
        quantized_kv_start: count("quantized_kv_start"),
        ..Default::default()
    };
    let expect = ids(&record["greedy_tokens"]);
    let unquantized = ids(&oracle["greedy_tokens"]);
    assert_ne!(expect, unquantized[..expect.len()], "the record should show the quantization's effect");
    let margins: Vec<f64> = record["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
    let options =
        GenerateOptions { cache, ..greedy(expect.len(), oracle["prefill_step_size"].as_u64().unwrap() as usize) };
    let mut generation = generate(&model, &ids(&oracle["prompt_ids"]), options).unwrap();
    let ours: Vec<u32> = generation.by_ref().map(|t| t.unwrap()).collect();
    let agreed = ours.iter().zip(&expect).take_while(|(a, b)| a == b).count();
    assert!(
        agreed == expect.len() || margins[agreed] <= 2.0 * F32_TOLERANCE as f64,
        "token {agreed}: {ours:?} vs mlx-lm {expect:?}"
    );
    let kinds: Vec<&str> = generation
        .cache()
        .iter()
        .map(|c| match c {
            LayerCache::Recurrent(_) => "recurrent",
            LayerCache::Quantized(_) => "quantized",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["recurrent", "quantized", "recurrent", "quantized"]);
}

#[test]
fn hybrid_refuses_max_kv_size_and_a_broken_config() {
    let dir = fixtures().join("qwen3_5").join("qwen3_5-f32");
    let (model, _) = nuvec_lm::load_dir(&dir).unwrap();
    let options = CacheOptions { max_kv_size: Some(64), ..Default::default() };
    let err = model.make_cache(&options).unwrap_err().to_string();
    assert!(err.contains("max_kv_size") && err.contains("recurrent"), "{err}");
    let err = generate(&model, &[1, 2, 3], GenerateOptions { cache: options, ..Default::default() })
        .err()
        .expect("a rotating cache is refused")
        .to_string();
    assert!(err.contains("max-kv-size"), "{err}");

    // A config whose linear heads do not fit the tensors: an error naming the tensor.
    let tmp = std::env::temp_dir().join(format!("nuvec-qwen3_5-bad-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for f in ["model.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join(f), tmp.join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["linear_num_value_heads"] = 8.into();
    std::fs::write(tmp.join("config.json"), config.to_string()).unwrap();
    let err = nuvec_lm::load_model(&tmp).unwrap_err().to_string();
    assert!(err.contains("linear_attn"), "{err}");
    config["linear_num_value_heads"] = 3.into();
    std::fs::write(tmp.join("config.json"), config.to_string()).unwrap();
    let err = nuvec_lm::load_model(&tmp).unwrap_err().to_string();
    assert!(err.contains("linear_num_key_heads"), "{err}");
    std::fs::remove_dir_all(&tmp).ok();
}
