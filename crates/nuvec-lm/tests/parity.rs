//! Parity with mlx-lm on tiny random-weight checkpoints built by mlx-lm's own model classes.
//!
//! For every case the oracle recorded the prompt's ids, 64 greedy tokens with their top-2
//! margins, the full logits of the first step and the top-16 logits of every step. We check
//! - the prompt encodes to the same ids;
//! - teacher-forced on mlx-lm's tokens, our logits match at every step within tolerance, and our
//!   argmax is mlx-lm's token wherever its top-2 margin exceeds twice that tolerance;
//! - decoding freely, our greedy tokens equal mlx-lm's up to the first near-tie.
//!
//! mlx-lm computes bf16 checkpoints in bf16; nuvec keeps f32 activations. For those cases the
//! oracle also recorded mlx-lm's run of the same weights in f32 (precision_f32.safetensors),
//! which we must match as tightly as the f32 cases, and how far mlx-lm's own two precisions
//! differ (precision_noise.json): against the bf16 run we allow twice that. Like mlx-lm, nuvec
//! stores a bf16 checkpoint's KV cache in bf16 by default: the bf16 record is compared with that
//! default, mlx-lm's f32 records with an f32 cache. The default itself (f32 compute, bf16 cache)
//! is compared like for like with mlx-lm computing in f32 with a bf16-rounding cache
//! (kv_half_cache/, see `half_cache_run`).

mod common;

use std::path::Path;

use common::*;
use nuvec_lm::cache::{CacheOptions, KvDtype};
use nuvec_lm::sample::argmax;
use nuvec_lm::Model;

/// Summation order alone: the tolerance of an f32 computation.
const F32_TOLERANCE: f32 = 2e-3;

/// One recorded greedy run to compare against.
struct Run {
    label: &'static str,
    tokens: Vec<u32>,
    margins: Vec<f32>,
    first: Vec<f32>,
    top_ids: Vec<f32>,
    top_logits: Vec<f32>,
    k: usize,
    /// (max, mean) logit tolerance.
    tolerance: (f32, f32),
    /// Whether to decode freely and compare tokens (a run whose tokens we should reproduce).
    free_running: bool,
    /// The cache type (`None`: the model's own, as a user gets it).
    kv_dtype: Option<KvDtype>,
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|m| m.as_f64().unwrap() as f32).collect()
}

fn logits_after(model: &Model, tokens: &[u32], cache: &mut [nuvec_lm::cache::LayerCache]) -> Result<Vec<f32>, String> {
    let out = model.forward_last(tokens, cache).map_err(|e| e.to_string())?;
    Ok(out.to_vec::<f32>().unwrap())
}

fn check_run(name: &str, model: &Model, prompt: &[u32], run: &Run) -> Result<String, String> {
    let (tol, mean_tol) = run.tolerance;
    let what = format!("{name} ({})", run.label);
    // Teacher-forced on the recorded tokens.
    let options = CacheOptions { kv_dtype: run.kv_dtype, ..Default::default() };
    let mut cache = model.make_cache(&options).map_err(|e| e.to_string())?;
    let mut logits = logits_after(model, prompt, &mut cache)?;
    if logits.len() != run.first.len() {
        return Err(format!("{what}: {} logits, mlx-lm has {}", logits.len(), run.first.len()));
    }
    let diffs: Vec<f32> = logits.iter().zip(&run.first).map(|(a, b)| (a - b).abs()).collect();
    let max_diff = diffs.iter().copied().fold(0f32, f32::max);
    let mean_diff = diffs.iter().sum::<f32>() / diffs.len() as f32;
    if max_diff > tol || mean_diff > mean_tol {
        return Err(format!(
            "{what}: first-step logits differ by up to {max_diff}, {mean_diff} on average (tolerance {tol}, {mean_tol})"
        ));
    }
    let mut worst = 0f32;
    for (step, &token) in run.tokens.iter().enumerate() {
        for j in 0..run.k {
            let id = run.top_ids[step * run.k + j] as usize;
            let diff = (logits[id] - run.top_logits[step * run.k + j]).abs();
            worst = worst.max(diff);
            if diff > tol {
                let theirs = run.top_logits[step * run.k + j];
                return Err(format!(
                    "{what}: step {step}, token {id}: logit {} vs {theirs} (tolerance {tol})",
                    logits[id]
                ));
            }
        }
        let ours = argmax(&logits);
        if ours != token && run.margins[step] > 2.0 * tol {
            return Err(format!(
                "{what}: step {step}: argmax {ours}, mlx-lm {token} with margin {}",
                run.margins[step]
            ));
        }
        logits = logits_after(model, &[token], &mut cache)?;
    }
    let mut agreed = 0;
    if run.free_running {
        let mut cache = model.make_cache(&options).map_err(|e| e.to_string())?;
        let mut logits = logits_after(model, prompt, &mut cache)?;
        for (step, &token) in run.tokens.iter().enumerate() {
            let ours = argmax(&logits);
            if ours != token {
                if run.margins[step] > 2.0 * tol {
                    let margin = run.margins[step];
                    return Err(format!("{what}: free-running step {step}: {ours} vs {token} (margin {margin})"));
                }
                break; // a near-tie: the two runs may part here legitimately
            }
            agreed += 1;
            logits = logits_after(model, &[ours], &mut cache)?;
        }
    }
    let steps = if run.k > 0 { format!("; worst top-{} diff {worst:.2e}", run.k) } else { String::new() };
    let free = if run.free_running {
        format!("; {agreed}/{} free-running tokens equal", run.tokens.len())
    } else {
        String::new()
    };
    Ok(format!(
        "{what}: ok (tolerance {tol:.2e}; first step max diff {max_diff:.2e}, mean {mean_diff:.2e}{steps}{free})"
    ))
}

fn runs(dir: &Path) -> Vec<Run> {
    let oracle = oracle_json(dir);
    let tokens = ids(&oracle["greedy_tokens"]);
    let mut margins = floats(&oracle["margins"]);
    margins.truncate(tokens.len());
    let (first, _) = oracle_f32(dir, "first_logits");
    let (top_ids, shape) = oracle_f32(dir, "step_top_ids");
    let (top_logits, _) = oracle_f32(dir, "step_top_logits");
    // A record mlx-lm computed in f32 (every f32 case, and the AWQ/GPTQ cases whose oracle is
    // the dense f32 checkpoint) is compared with an f32 cache; the others with the model's own.
    let computed_in_f32 = oracle["dtype"].as_array().is_some_and(|d| d.iter().all(|t| t == "float32"));
    let kv_dtype = computed_in_f32.then_some(KvDtype::F32);
    let recorded = |tolerance, free_running| Run {
        label: "mlx-lm",
        tokens: tokens.clone(),
        margins: margins.clone(),
        first: first.clone(),
        top_ids: top_ids.clone(),
        top_logits: top_logits.clone(),
        k: shape[1],
        tolerance,
        free_running,
        kv_dtype,
    };
    let Ok(text) = std::fs::read_to_string(dir.join("precision_noise.json")) else {
        return vec![recorded((F32_TOLERANCE, F32_TOLERANCE), true)];
    };
    let noise: serde_json::Value = serde_json::from_str(&text).unwrap();
    let f32_file = nuvec::io::SafetensorsFile::open(dir.join("precision_f32.safetensors")).unwrap();
    let get = |name: &str| f32_file.array(name).unwrap().to_f32_vec().unwrap();
    let max = noise["max_abs_diff"].as_f64().unwrap() as f32;
    let mean = noise["mean_abs_diff"].as_f64().unwrap() as f32;
    vec![
        // mlx-lm's f32 computation of the same weights, teacher-forced on the bf16 run's tokens.
        Run {
            label: "mlx-lm in f32, teacher-forced",
            tokens: tokens.clone(),
            // These are the bf16 run's tokens: our argmax need not pick them, so no margin counts.
            margins: vec![0.0; tokens.len()],
            first: get("f32_first_logits"),
            top_ids: get("f32_step_top_ids"),
            top_logits: get("f32_step_top_logits"),
            k: shape[1],
            tolerance: (F32_TOLERANCE, F32_TOLERANCE),
            free_running: false,
            // mlx-lm's f32 computation keeps an f32 cache.
            kv_dtype: Some(KvDtype::F32),
        },
        // mlx-lm's f32 greedy run of the same weights, decoded freely.
        Run {
            label: "mlx-lm in f32, free-running",
            tokens: ids(&noise["f32_greedy_tokens"]),
            margins: floats(&noise["f32_margins"]),
            first: get("f32_first_logits"),
            top_ids: vec![],
            top_logits: vec![],
            k: 0,
            tolerance: (F32_TOLERANCE, F32_TOLERANCE),
            free_running: true,
            kv_dtype: Some(KvDtype::F32),
        },
        // The bf16 run itself, within mlx-lm's own bf16-vs-f32 difference.
        recorded((2.0 * max + 0.0625, 2.0 * mean + 0.0625), false),
        half_cache_run(dir),
    ]
}

/// mlx-lm computing the same weights in f32 with a cache of the checkpoint's own (half) dtype
/// (scripts/oracle/more/kv_half_cache.py): nuvec's default path for these checkpoints, like for
/// like, teacher-forced and free-running. The two computations differ by summation order, which
/// can round a key or value of the cache the other way: one unit in the last place of that one
/// element, where rounding the whole cache (cache_noise: the oracle's run against its own f32
/// cache) moves every element by up to half a unit. An eighth of cache_noise leaves room for
/// many such elements, and still fails a cache rounded otherwise or not at all (checked by
/// `the_half_cache_record_tells_an_f32_cache_apart`).
fn half_cache_run(dir: &Path) -> Run {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let records = dir.parent().unwrap().join("kv_half_cache");
    let text = std::fs::read_to_string(records.join(format!("{name}.json")))
        .unwrap_or_else(|e| panic!("{name}: no kv_half_cache record ({e}): rerun scripts/setup-oracle.sh"));
    let record: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(record["kv_dtype"], "mlx.core.bfloat16", "{name}: a half cache other than bf16");
    let file = nuvec::io::SafetensorsFile::open(records.join(format!("{name}.safetensors"))).unwrap();
    let get = |n: &str| file.array(n).unwrap().to_f32_vec().unwrap();
    let top_ids = get("step_top_ids");
    let tokens = ids(&record["greedy_tokens"]);
    let noise = |k: &str| record[k].as_f64().unwrap() as f32;
    Run {
        label: "mlx-lm in f32 with a bf16 cache",
        k: top_ids.len() / tokens.len(),
        margins: floats(&record["margins"]),
        tokens,
        first: get("first_logits"),
        top_ids,
        top_logits: get("step_top_logits"),
        tolerance: (F32_TOLERANCE + noise("cache_noise_max") / 8.0, F32_TOLERANCE + noise("cache_noise_mean") / 8.0),
        free_running: true,
        // The default, which must be the bf16 cache this record was made with.
        kv_dtype: None,
    }
}

fn check_case(dir: &Path) -> Result<Vec<String>, String> {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let oracle = oracle_json(dir);
    let (model, tokenizer) = nuvec_lm::load_dir(dir).map_err(|e| format!("{name}: load failed: {e}"))?;
    if dir.join("precision_noise.json").exists() && model.kv_dtype() != KvDtype::Bf16 {
        return Err(format!("{name}: a bf16 checkpoint's default KV cache is {:?}, not bf16", model.kv_dtype()));
    }
    let prompt = ids(&oracle["prompt_ids"]);
    if let Some(text) = oracle["prompt"].as_str() {
        let ours = tokenizer.encode(text, true).map_err(|e| e.to_string())?;
        if ours != prompt {
            return Err(format!("{name}: prompt ids {ours:?} != mlx-lm's {prompt:?}"));
        }
    }
    runs(dir).iter().map(|run| check_run(&name, &model, &prompt, run)).collect()
}

#[test]
fn every_case_matches_mlx_lm() {
    let cases = cases();
    let mut failures = vec![];
    for dir in cases.iter().filter(|d| !d.ends_with("smollm2-q4_1")) {
        match check_case(dir) {
            Ok(lines) => lines.iter().for_each(|l| eprintln!("{l}")),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{} cases differ from mlx-lm:\n{}", failures.len(), failures.join("\n"));
    // Every case the oracle recorded (index.json) was found and checked: a case whose folder went
    // missing fails here instead of shrinking the suite.
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixtures().join("index.json")).unwrap()).unwrap();
    let recorded = index["cases"].as_object().expect("index.json lists the recorded cases");
    assert!(recorded.len() >= 30, "index.json records {} cases, the oracle script makes 30+", recorded.len());
    for name in recorded.keys() {
        assert!(cases.iter().any(|d| d.ends_with(name)), "recorded case {name} is missing from the fixtures");
    }
}

#[test]
fn the_half_cache_record_tells_an_f32_cache_apart() {
    // The like-for-like record's tolerance is tight enough that the same computation with an f32
    // cache (what nuvec would do if its default cache stopped being bf16) fails it.
    for case in ["llama-bf16", "qwen3-bf16"] {
        let dir = fixtures().join(case);
        let (model, _) = nuvec_lm::load_dir(&dir).unwrap();
        let prompt = ids(&oracle_json(&dir)["prompt_ids"]);
        let run = Run { kv_dtype: Some(KvDtype::F32), ..half_cache_run(&dir) };
        let err = check_run(case, &model, &prompt, &run).expect_err("an f32 cache passes the bf16-cache record");
        eprintln!("{err}");
    }
}
