//! gpt-oss against mlx-lm (`scripts/oracle/more/gpt_oss.py`): tiny random checkpoints made by
//! mlx-lm's own gpt_oss model (sinks, sliding window 8 on alternate layers, yarn rope, biased
//! experts with the clamped SwiGLU), f32, 4-bit and in Hugging Face's fused layout; and the real
//! gpt-oss tokenizer with its harmony chat template against transformers.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use nuvec_lm::cache::CacheOptions;
use nuvec_lm::{GenerateOptions, Model, Tokenizer};
use serde_json::Value;

/// parity.rs's tolerance for an f32 computation (summation order alone).
const F32_TOLERANCE: f32 = 2e-3;

const CASES: [&str; 4] = ["gpt_oss-f32", "gpt_oss-q4g64", "gpt_oss-hf", "gpt_oss-hf-mxfp4"];

/// `scripts/oracle/more/gpt_oss.py`'s records (a folder of their own).
fn records_dir() -> PathBuf {
    fixtures().join("gpt_oss")
}

fn case(name: &str) -> PathBuf {
    let dir = records_dir().join(name);
    assert!(dir.join("oracle.json").exists(), "{}: missing; rerun scripts/setup-oracle.sh", dir.display());
    dir
}

fn logits(model: &Model, tokens: &[u32], cache: &mut [nuvec_lm::cache::LayerCache]) -> Vec<f32> {
    model.forward_last(tokens, cache).unwrap().to_vec::<f32>().unwrap()
}

/// Teacher-forced on mlx-lm's tokens: the first step's logits and every step's top 16 within
/// the f32 tolerance. Returns the worst difference.
fn check_logits(name: &str, model: &Model, prompt: &[u32], dir: &Path) -> f32 {
    let oracle = oracle_json(dir);
    let tokens = ids(&oracle["greedy_tokens"]);
    let (first, _) = oracle_f32(dir, "first_logits");
    let (top_ids, shape) = oracle_f32(dir, "step_top_ids");
    let (top_logits, _) = oracle_f32(dir, "step_top_logits");
    let k = shape[1];
    let mut cache = model.new_cache();
    let mut ours = logits(model, prompt, &mut cache);
    assert_eq!(ours.len(), first.len(), "{name}: vocabulary size");
    let mut worst = ours.iter().zip(&first).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= F32_TOLERANCE, "{name}: first-step logits differ by {worst}");
    for (step, &token) in tokens.iter().enumerate() {
        for j in 0..k {
            let id = top_ids[step * k + j] as usize;
            let diff = (ours[id] - top_logits[step * k + j]).abs();
            assert!(
                diff <= F32_TOLERANCE,
                "{name}: step {step}, token {id}: {} vs {}",
                ours[id],
                top_logits[step * k + j]
            );
            worst = worst.max(diff);
        }
        ours = logits(model, &[token], &mut cache);
    }
    worst
}

#[test]
fn tiny_checkpoints_match_mlx_lm() {
    for name in CASES {
        let dir = case(name);
        let oracle = oracle_json(&dir);
        assert_eq!(oracle["sinks_nonzero"], Value::Bool(true), "{name}: the oracle's sinks are zero");
        let (model, tokenizer) = nuvec_lm::load_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let prompt = ids(&oracle["prompt_ids"]);
        assert_eq!(tokenizer.encode(oracle["prompt"].as_str().unwrap(), true).unwrap(), prompt, "{name}: prompt ids");
        let worst = check_logits(name, &model, &prompt, &dir);

        // Greedy through the generation loop (mlx-lm's cache layout, prefill then decode): every
        // token up to the first step whose top-2 margin is within twice the tolerance (a near
        // tie either side may break; the teacher-forced logits above cover the rest).
        let want = ids(&oracle["greedy_tokens"]);
        let margins: Vec<f32> =
            oracle["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap() as f32).collect();
        let sure = margins.iter().position(|&m| m <= 2.0 * F32_TOLERANCE).unwrap_or(want.len()).min(want.len());
        assert!(sure >= want.len() / 2, "{name}: a near tie at step {sure} leaves too little to compare");
        let options = GenerateOptions { max_tokens: want.len(), ignore_eos: true, ..Default::default() };
        let got: Vec<u32> = nuvec_lm::generate(&model, &prompt, options).unwrap().map(|t| t.unwrap()).collect();
        assert_eq!(got[..sure], want[..sure], "{name}: greedy tokens differ from mlx-lm's");
        eprintln!("{name}: {sure}/{} greedy tokens compared, equal; worst logit diff {worst:.2e}", want.len());
    }
}

#[test]
fn sliding_layers_get_rotating_caches_of_the_window() {
    let (model, _) = nuvec_lm::load_dir(&case("gpt_oss-f32")).unwrap();
    let kinds: Vec<&str> = model
        .new_cache()
        .iter()
        .map(|c| match c {
            nuvec_lm::cache::LayerCache::Plain(_) => "full",
            nuvec_lm::cache::LayerCache::Rotating(_) => "sliding",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["sliding", "full", "sliding", "full"]);
    // A prompt prefilled in chunks of 3 (shorter than the window of 8) and token by token ends
    // with the logits of the whole prompt at once.
    let oracle = oracle_json(&case("gpt_oss-f32"));
    let prompt = ids(&oracle["prompt_ids"]);
    let mut cache = model.new_cache();
    let whole = logits(&model, &prompt, &mut cache);
    let mut cache = model.new_cache();
    for chunk in prompt[..prompt.len() - 1].chunks(3) {
        model.prefill(chunk, &mut cache).unwrap();
    }
    let chunked = logits(&model, &prompt[prompt.len() - 1..], &mut cache);
    let diff = whole.iter().zip(&chunked).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff <= F32_TOLERANCE, "chunked prefill differs by {diff}");
    // mlx-lm builds its own caches for gpt-oss and ignores max_kv_size; we refuse it instead.
    let options = CacheOptions { max_kv_size: Some(64), ..Default::default() };
    let err = model.make_cache(&options).unwrap_err().to_string();
    assert!(err.contains("max_kv_size") && err.contains("gpt_oss"), "{err}");
}

/// A copy of a case with `edit` applied to its tensors and config.
fn edited_copy(name: &str, tag: &str, edit: impl Fn(&mut Vec<(String, nuvec::Array)>, &mut Value)) -> PathBuf {
    let src = case(name);
    let dst = std::env::temp_dir().join(format!("nuvec-gpt-oss-{tag}-{}", std::process::id()));
    std::fs::remove_dir_all(&dst).ok();
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        if !file.starts_with("model") && !file.starts_with("oracle") {
            std::fs::copy(&path, dst.join(&file)).unwrap();
        }
    }
    let st = nuvec::io::SafetensorsFile::open(src.join("model.safetensors")).unwrap();
    let mut tensors: Vec<(String, nuvec::Array)> =
        st.tensors().keys().map(|k| (k.clone(), st.array(k).unwrap())).collect();
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut tensors, &mut config);
    nuvec::io::save_safetensors(dst.join("model.safetensors"), &tensors, None).unwrap();
    std::fs::write(dst.join("config.json"), config.to_string()).unwrap();
    dst
}

#[test]
fn unsupported_layouts_and_bad_configs_are_named() {
    // Hugging Face's MXFP4 experts with their blocks but not their scales.
    let dir = edited_copy("gpt_oss-hf", "mxfp4", |tensors, _| {
        for (name, a) in tensors.iter_mut() {
            if name.ends_with("gate_up_proj.weight") {
                *name = name.replace("gate_up_proj.weight", "gate_up_proj_blocks");
                *a = nuvec::Array::zeros(&[4, 128, 2, 16], nuvec::DType::U8);
            }
        }
    });
    let err = nuvec_lm::load_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("gate_up_proj_scales"), "{err}");
    std::fs::remove_dir_all(&dir).ok();

    // Blocks of the wrong shape (rows of 48 values do not split into MXFP4 blocks of 32).
    let dir = edited_copy("gpt_oss-hf-mxfp4", "mxfp4-shape", |tensors, _| {
        for (name, a) in tensors.iter_mut() {
            if name.ends_with("gate_up_proj_blocks") {
                *a = nuvec::Array::zeros(&[4, 128, 3, 16], nuvec::DType::U8);
            }
        }
    });
    let err = nuvec_lm::load_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("gate_up_proj_blocks") && err.contains("MXFP4"), "{err}");
    std::fs::remove_dir_all(&dir).ok();

    // Hugging Face's MXFP8 releases are not rearranged yet.
    let dir = edited_copy("gpt_oss-f32", "mxfp8-config", |_, config| {
        config["quantization_config"] = serde_json::json!({"quant_method": "mxfp8"});
    });
    let err = nuvec_lm::load_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("config.json") && err.contains("mxfp8"), "{err}");
    std::fs::remove_dir_all(&dir).ok();

    let dir = edited_copy("gpt_oss-f32", "layer-types", |_, config| {
        config["layer_types"] = serde_json::json!(["sliding_attention", "full_attention", "local"]);
    });
    let err = nuvec_lm::load_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("layer_types") && err.contains("num_hidden_layers"), "{err}");
    std::fs::remove_dir_all(&dir).ok();

    let dir = edited_copy("gpt_oss-f32", "sinks", |tensors, _| {
        tensors.retain(|(name, _)| name != "model.layers.2.self_attn.sinks");
    });
    let err = nuvec_lm::load_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("model.layers.2.self_attn.sinks"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

// ---------------------------------------------------------------------------------------------
// The real tokenizer and its harmony chat template.

fn harmony() -> (PathBuf, Tokenizer) {
    let dir = records_dir().join("gpt_oss-harmony");
    let tokenizer = Tokenizer::load(&dir, &[]).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    (dir, tokenizer)
}

fn records(dir: &Path, file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{}/{file}: {e}", dir.display()));
    serde_json::from_str::<Value>(&text).unwrap().as_array().unwrap().clone()
}

/// Today's UTC date as `%Y-%m-%d`, computed here independently of the template's
/// `strftime_now`.
fn today() -> String {
    let days = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 86_400;
    let (mut year, mut day) = (1970u64, days);
    let leap = |y: u64| (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
    while day >= if leap(year) { 366 } else { 365 } {
        day -= if leap(year) { 366 } else { 365 };
        year += 1;
    }
    let lengths = [31, if leap(year) { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let mut month = 0;
    while day >= lengths[month] {
        day -= lengths[month];
        month += 1;
    }
    format!("{year}-{:02}-{:02}", month + 1, day + 1)
}

#[test]
fn harmony_prompts_render_like_transformers() {
    let (dir, tokenizer) = harmony();
    let template = tokenizer.chat_template().expect("gpt_oss-harmony has chat_template.jinja");
    let today = today();
    let mut failures = vec![];
    let all = records(&dir, "chat.json");
    for r in &all {
        let label = r["label"].as_str().unwrap();
        let mut kwargs = r["kwargs"].as_object().cloned().unwrap();
        let add_generation_prompt = kwargs.remove("add_generation_prompt").and_then(|v| v.as_bool()).unwrap();
        for (key, value) in [("bos_token", tokenizer.bos_token()), ("eos_token", tokenizer.eos_token())] {
            if let Some(v) = value {
                kwargs.entry(key.to_string()).or_insert(v.into());
            }
        }
        // The template writes today's date; the oracle wrote the day it ran.
        let recorded_date = r["date"].as_str().unwrap();
        let want = r["rendered"].as_str().unwrap().replace(recorded_date, &today);
        assert_eq!(r["rendered"], r["rendered_mlx_lm"], "{label}: mlx-lm's wrapper renders like transformers");
        match template.render_values(&r["messages"], add_generation_prompt, false, &kwargs) {
            Err(e) => failures.push(format!("{label}: {e}")),
            Ok(ours) if ours != want => failures.push(format!("{label}:\nours   {ours:?}\ntheirs {want:?}")),
            Ok(_) => {
                // The ids of transformers' prompt (as recorded, with its date).
                if tokenizer.encode(r["rendered"].as_str().unwrap(), false).unwrap() != ids(&r["ids"]) {
                    failures.push(format!("{label}: ids of the rendered prompt differ"));
                }
            }
        }
    }
    assert!(all.len() >= 12, "only {} records", all.len());
    assert!(failures.is_empty(), "{} of {} prompts differ:\n{}", failures.len(), all.len(), failures.join("\n"));
}

#[test]
fn multilingual_ids_match_python() {
    let (dir, tokenizer) = harmony();
    let mut failures = vec![];
    let all = records(&dir, "encode.json");
    for r in &all {
        let text = r["text"].as_str().unwrap();
        let plain = tokenizer.encode(text, false).unwrap();
        for key in ["ids_plain", "tokenizers_lib_ids_plain"] {
            if plain != ids(&r[key]) {
                failures.push(format!("{text:?}: {plain:?} != {key} {:?}", ids(&r[key])));
            }
        }
        if tokenizer.encode(text, true).unwrap() != ids(&r["ids_with_special"]) {
            failures.push(format!("{text:?}: ids with special tokens differ"));
        }
        if tokenizer.decode(&plain).unwrap() != r["decoded"].as_str().unwrap() {
            failures.push(format!("{text:?}: decoded text differs"));
        }
    }
    assert!(all.len() >= 20, "only {} records", all.len());
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}
