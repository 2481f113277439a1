//! The other KV caches against mlx-lm: rotating caches (`max_kv_size`) across the window's wrap,
//! prefilled whole and in chunks, and quantized KV caches (`kv_bits`, `kv_group_size`,
//! `quantized_kv_start`), teacher-forced on mlx-lm's tokens and decoded freely.

mod common;

use common::*;
use nuvec_lm::cache::CacheOptions;
use nuvec_lm::sample::argmax;
use nuvec_lm::Session;
use serde_json::Value;

fn options(settings: &Value) -> (CacheOptions, usize) {
    let get = |k: &str| settings.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let cache = CacheOptions {
        max_kv_size: get("max_kv_size"),
        kv_bits: get("kv_bits"),
        kv_group_size: get("kv_group_size").unwrap_or(64),
        quantized_kv_start: get("quantized_kv_start").unwrap_or(5000),
        ..Default::default()
    };
    (cache, get("prefill_step_size").unwrap_or(2048))
}

/// Logits after feeding `tokens` to the session, prefilled in chunks of `step` as
/// mlx-lm's generate_step does (the last token alone), quantizing after each pass.
fn run(model: &nuvec_lm::Model, session: &mut Session, tokens: &[u32], cache: &CacheOptions, step: usize) -> Vec<f32> {
    let options = nuvec_lm::GenerateOptions {
        max_tokens: 1,
        prefill_step_size: step,
        cache: cache.clone(),
        ..Default::default()
    };
    let mut g = nuvec_lm::generate_in(model, session, tokens, options).unwrap();
    g.next();
    g.last_logits().expect("a step ran").to_vec()
}

#[test]
fn rotating_and_quantized_caches_match_mlx_lm() {
    let dir = fixtures().join("caches");
    let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).collect();
    names.retain(|p| p.file_name().unwrap() != "chat.json");
    names.sort();
    assert!(names.len() >= 6, "{names:?}");
    let mut failures = vec![];
    for path in names {
        let r: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let (model, _) = nuvec_lm::load_dir(&fixtures().join(r["case"].as_str().unwrap())).unwrap();
        let (cache, step) = options(&r["settings"]);
        let prompt = ids(&r["prompt_ids"]);
        let tokens = ids(&r["greedy_tokens"]);
        let margins: Vec<f32> = r["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap() as f32).collect();
        let top_ids = &r["step_top_ids"];
        let top_logits = &r["step_top_logits"];
        // Quantized keys differ from mlx-lm's only where a value sits on a rounding boundary.
        let tol = if cache.kv_bits.is_some() { 5e-3 } else { 2e-3 };

        // Teacher-forced: one session, fed mlx-lm's tokens.
        let mut session = Session::with_cache(&model, &cache).unwrap();
        let mut history = prompt.clone();
        let mut worst = 0f32;
        let mut agreed = None;
        for (i, &token) in tokens.iter().enumerate() {
            let logits = run(&model, &mut session, &history, &cache, step);
            for (id, want) in top_ids[i].as_array().unwrap().iter().zip(top_logits[i].as_array().unwrap()) {
                let (id, want) = (id.as_u64().unwrap() as usize, want.as_f64().unwrap() as f32);
                worst = worst.max((logits[id] - want).abs());
            }
            if argmax(&logits) != token && margins[i] > 2.0 * tol && agreed.is_none() {
                agreed = Some(i);
            }
            history.push(token);
        }
        // Decoded freely: mlx-lm's tokens up to the first near-tie.
        let options = nuvec_lm::GenerateOptions {
            max_tokens: tokens.len(),
            prefill_step_size: step,
            cache: cache.clone(),
            ignore_eos: true,
            ..Default::default()
        };
        let free: Vec<u32> = nuvec_lm::generate(&model, &prompt, options).unwrap().map(|t| t.unwrap()).collect();
        let same = free.iter().zip(&tokens).take_while(|(a, b)| a == b).count();
        if same < tokens.len() && margins[same] > 2.0 * tol {
            failures.push(format!("{name}: free-running step {same} differs with margin {}", margins[same]));
            continue;
        }
        if worst > tol {
            failures.push(format!("{name}: logits differ by up to {worst} (tolerance {tol})"));
        } else if let Some(i) = agreed {
            failures.push(format!("{name}: step {i} argmax differs with margin {}", margins[i]));
        } else {
            eprintln!(
                "{name}: ok (worst top-16 diff {worst:.2e}, tolerance {tol:.0e}; {same}/{} free-running tokens equal)",
                tokens.len()
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn trim_contracts_and_settings() {
    use nuvec_lm::cache::{LayerCache, QuantizedKvCache, RotatingKvCache};
    let (model, _) = nuvec_lm::load_dir(&fixtures().join("qwen3-f32")).unwrap();
    let rotating = CacheOptions { max_kv_size: Some(16), ..Default::default() };
    let prompt: Vec<u32> = (100..110).collect();

    // Before the ring wraps, trimming is exact; after, it is refused and nothing changes.
    let mut session = Session::with_cache(&model, &rotating).unwrap();
    session.prefill(&model, &prompt, 2048, &rotating).unwrap();
    session.trim(3).unwrap();
    assert!(session.cache().iter().all(|c| c.offset() == 7));
    session.prefill(&model, &(200..220).collect::<Vec<u32>>(), 1, &rotating).unwrap();
    let held = session.tokens().len();
    let err = session.trim(1).unwrap_err().to_string();
    assert!(err.contains("after it wrapped"), "{err}");
    assert_eq!(session.tokens().len(), held);
    assert!(session.cache().iter().all(|c| c.offset() == held));

    // A later prompt that no longer matches starts the session afresh rather than mis-reusing.
    let mut g = nuvec_lm::generate_in(
        &model,
        &mut session,
        &prompt,
        nuvec_lm::GenerateOptions { max_tokens: 1, cache: rotating.clone(), ..Default::default() },
    )
    .unwrap();
    g.next();
    assert_eq!(g.reused_tokens(), 0);

    let mut q = LayerCache::Quantized(QuantizedKvCache::new(4, 32).unwrap());
    assert!(q.trim(1).unwrap_err().to_string().contains("cannot trim 1"));
    assert!(RotatingKvCache::new(4, 4).is_err());

    for (options, words) in [
        (CacheOptions { max_kv_size: Some(4), ..Default::default() }, "must exceed keep"),
        (CacheOptions { kv_bits: Some(7), ..Default::default() }, "bits = 7"),
        (CacheOptions { kv_bits: Some(4), kv_group_size: 48, ..Default::default() }, "group_size = 48"),
    ] {
        let err = options.validate().unwrap_err().to_string();
        assert!(err.contains(words), "{err}");
    }
}

#[test]
fn rotating_and_quantized_caches_round_trip_through_files() {
    use nuvec_lm::{generate_in, prompt_cache, GenerateOptions};
    let (model, tokenizer) = nuvec_lm::load_dir(&fixtures().join("qwen3-hd64-f32")).unwrap();
    let head = tokenizer
        .encode("Once upon a time, in a quiet village by the sea, there lived an old fisherman", true)
        .unwrap();
    let mut full = head.clone();
    full.extend(tokenizer.encode(" who told stories", false).unwrap());
    for kv in [
        CacheOptions { max_kv_size: Some(12), ..Default::default() },
        CacheOptions {
            max_kv_size: Some(12),
            kv_bits: Some(8),
            kv_group_size: 32,
            quantized_kv_start: 6,
            ..Default::default()
        },
        CacheOptions { kv_bits: Some(4), kv_group_size: 32, quantized_kv_start: 4, ..Default::default() },
        CacheOptions { kv_bits: Some(8), kv_group_size: 64, quantized_kv_start: 0, ..Default::default() },
    ] {
        let options = GenerateOptions { max_tokens: 12, ignore_eos: true, cache: kv.clone(), ..Default::default() };
        let run = |session: &mut Session| -> Vec<u32> {
            generate_in(&model, session, &full, options.clone()).unwrap().map(|t| t.unwrap()).collect()
        };
        let mut direct = Session::with_cache(&model, &kv).unwrap();
        direct.prefill(&model, &head, 2048, &kv).unwrap();
        let path = std::env::temp_dir().join(format!("nuvec-pc-kinds-{}.safetensors", std::process::id()));
        prompt_cache::save(&path, &model, "qwen3-hd64-f32", &direct, &kv, "").unwrap();
        let (mut restored, info) = prompt_cache::load(&path, &model, &kv).unwrap();
        // The file records what the cache stores: the model's type filled in.
        assert_eq!(info.kv, model.cache_options(&kv));
        assert_eq!(info.kv.kv_dtype, Some(nuvec_lm::cache::KvDtype::F32));
        assert_eq!(restored.tokens(), direct.tokens());
        assert_eq!(run(&mut restored), run(&mut direct), "{kv:?}: the file changed the cache");
        // Asking for other settings (or none) is refused rather than silently inherited.
        let err = prompt_cache::load(&path, &model, &CacheOptions::default()).unwrap_err().to_string();
        assert!(err.contains("KV cache made with"), "{err}");
        let other_type = CacheOptions { kv_dtype: Some(nuvec_lm::cache::KvDtype::Bf16), ..kv.clone() };
        let err = prompt_cache::load(&path, &model, &other_type).unwrap_err().to_string();
        assert!(err.contains("--kv-dtype"), "{err}");
        std::fs::remove_file(&path).ok();
    }
}

/// mlx-lm refuses a quantized rotating cache (and crashes on one with keep > 0), so there is no
/// record of it. Its ring must behave as the f32 rotating cache's and its values as the quantized
/// cache's: quantizing a rotating cache moves the logits about as much as quantizing a plain one.
#[test]
fn quantized_rotating_cache_costs_what_quantizing_costs() {
    let (model, tokenizer) = nuvec_lm::load_dir(&fixtures().join("qwen3-hd64-f32")).unwrap();
    let prompt = tokenizer
        .encode("Once upon a time, in a quiet village by the sea, there lived an old fisherman who told stories", true)
        .unwrap();
    let steps: Vec<u32> = (300..324).collect();
    let logits_of = |kv: &CacheOptions| -> Vec<Vec<f32>> {
        let mut session = Session::with_cache(&model, kv).unwrap();
        let mut history = prompt.clone();
        steps
            .iter()
            .map(|&t| {
                let l = run(&model, &mut session, &history, kv, 8);
                history.push(t);
                l
            })
            .collect()
    };
    let distance = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
    };
    let q8 = |kv: CacheOptions| CacheOptions { kv_bits: Some(8), kv_group_size: 64, quantized_kv_start: 0, ..kv };
    let rotating = CacheOptions { max_kv_size: Some(16), ..Default::default() };
    let plain_cost = distance(&logits_of(&CacheOptions::default()), &logits_of(&q8(CacheOptions::default())));
    let rotating_cost = distance(&logits_of(&rotating), &logits_of(&q8(rotating.clone())));
    assert!(plain_cost > 0.0 && rotating_cost > 0.0, "quantization changed nothing: {plain_cost} {rotating_cost}");
    assert!(
        rotating_cost < 3.0 * plain_cost + 1e-3,
        "quantized rotating {rotating_cost} vs quantized plain {plain_cost}"
    );
}

/// Caches store what mlx-lm stores for the checkpoint (its compute type: bf16 for a bf16
/// checkpoint), f16 for a GGUF file (llama.cpp's cache type), unless asked otherwise.
#[test]
fn caches_store_the_models_type_unless_asked() {
    use nuvec::DType;
    use nuvec_lm::cache::KvDtype;
    let stored = |model: &nuvec_lm::Model, kv: &CacheOptions| -> DType {
        let mut session = Session::with_cache(model, kv).unwrap();
        session.prefill(model, &[1, 2, 3], 2048, kv).unwrap();
        let (arrays, _) = session.cache()[0].save_state().unwrap();
        arrays[0].1.dtype()
    };
    let (bf16, _) = nuvec_lm::load_dir(&fixtures().join("qwen3-bf16")).unwrap();
    let (f32_model, _) = nuvec_lm::load_dir(&fixtures().join("qwen3-f32")).unwrap();
    let (gguf, _) = nuvec_lm::load(default_gguf().to_str().unwrap()).unwrap();
    assert_eq!((bf16.kv_dtype(), f32_model.kv_dtype(), gguf.kv_dtype()), (KvDtype::Bf16, KvDtype::F32, KvDtype::F16));
    let plain = CacheOptions::default();
    let rotating = CacheOptions { max_kv_size: Some(8), ..Default::default() };
    for kv in [&plain, &rotating] {
        assert_eq!(stored(&bf16, kv), DType::BF16);
        assert_eq!(stored(&f32_model, kv), DType::F32);
        assert_eq!(stored(&gguf, kv), DType::F16);
        let asked = CacheOptions { kv_dtype: Some(KvDtype::F32), ..kv.clone() };
        assert_eq!(stored(&gguf, &asked), DType::F32);
    }
    assert!(KvDtype::parse("f8").unwrap_err().to_string().contains("f32, f16, bf16"));
}
