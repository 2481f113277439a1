//! Sessions: a conversation continued over one cache gives mlx-lm's tokens for the whole
//! re-rendered conversation while computing only the new tokens; trimming is exact.

mod common;

use common::*;
use nuvec_lm::{generate, generate_in, GenerateOptions, Session};

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, ..Default::default() }
}

#[test]
fn two_turn_chat_equals_re_prefilling_the_conversation() {
    let fx = fixtures();
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx.join("caches/chat.json")).unwrap()).unwrap();
    let (model, tokenizer) = nuvec_lm::load_dir(&fx.join("qwen3-f32")).unwrap();
    let template = tokenizer.chat_template().unwrap();
    let mut session = Session::new(&model);
    let mut computed = vec![];
    for turn in record["turns"].as_array().unwrap() {
        let rendered = template.render_values(&turn["messages"], true, false, &Default::default()).unwrap();
        assert_eq!(rendered, turn["rendered"].as_str().unwrap());
        let ids = tokenizer.encode(&rendered, false).unwrap();
        assert_eq!(ids, ids_of(&turn["prompt_ids"]));
        let mut generation = generate_in(&model, &mut session, &ids, greedy(12)).unwrap();
        let tokens: Vec<u32> = generation.by_ref().map(|t| t.unwrap()).collect();
        computed.push(ids.len() - generation.reused_tokens());
        assert_eq!(tokens, ids_of(&turn["tokens"]), "turn tokens differ from mlx-lm's re-prefilled run");
        drop(generation);
        // The session holds the prompt and every generated token but the last.
        assert_eq!(session.tokens().len(), ids.len() + tokens.len() - 1);
    }
    // Turn 2 reuses at least turn 1's whole prompt (the reply itself may re-tokenize differently
    // once decoded into the conversation, so the common prefix can end inside it).
    let turn1 = record["turns"][0]["prompt_ids"].as_array().unwrap().len();
    let turn2 = record["turns"][1]["prompt_ids"].as_array().unwrap().len();
    assert!(computed[1] <= turn2 - turn1, "turn 2 recomputed {} of {turn2} tokens", computed[1]);
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    ids(v)
}

#[test]
fn trim_is_exact_and_refuses_too_much() {
    let (model, _) = nuvec_lm::load_dir(&fixtures().join("qwen3-f32")).unwrap();
    let prompt: Vec<u32> = (100..140).collect();
    let mut session = Session::new(&model);
    let tokens: Vec<u32> = generate_in(&model, &mut session, &prompt, greedy(8)).unwrap().map(|t| t.unwrap()).collect();
    let held = session.tokens().len();
    assert_eq!(held, prompt.len() + tokens.len() - 1);
    let err = session.trim(held + 1).unwrap_err().to_string();
    assert!(err.contains("cannot trim"), "{err}");
    assert_eq!(session.tokens().len(), held, "a refused trim leaves the session unchanged");
    session.trim(10).unwrap();
    assert_eq!(session.tokens().len(), held - 10);
    assert!(session.cache().iter().all(|c| nuvec_lm::cache::LayerCache::offset(c) == held - 10));

    // After trimming back into the prompt, continuing gives what a fresh run gives.
    let fresh: Vec<u32> = generate(&model, &prompt, greedy(8)).unwrap().map(|t| t.unwrap()).collect();
    let mut again = generate_in(&model, &mut session, &prompt, greedy(8)).unwrap();
    let continued: Vec<u32> = again.by_ref().map(|t| t.unwrap()).collect();
    assert_eq!(again.reused_tokens(), held - 10, "everything the trimmed session holds is the prompt's start");
    assert_eq!(continued, fresh);
}

#[test]
fn prompt_cache_file_round_trip_and_refusals() {
    use nuvec_lm::prompt_cache;
    let fx = fixtures();
    let (model, tokenizer) = nuvec_lm::load_dir(&fx.join("qwen3-f32")).unwrap();
    let head = tokenizer.encode("The capital of France is Paris, and the capital", true).unwrap();
    let full = tokenizer.encode("The capital of France is Paris, and the capital of Germany is", true).unwrap();
    assert!(full.starts_with(&head[..head.len() - 1]));

    let mut session = Session::new(&model);
    let kv = nuvec_lm::cache::CacheOptions::default();
    session.prefill(&model, &head, 5, &kv).unwrap();
    let path = std::env::temp_dir().join(format!("nuvec-pc-{}.safetensors", std::process::id()));
    prompt_cache::save(&path, &model, "qwen3-f32", &session, &kv, "cached text").unwrap();

    let (mut restored, info) = prompt_cache::load(&path, &model, &kv).unwrap();
    assert_eq!(info.prompt, "cached text");
    assert_eq!(restored.tokens(), head.as_slice());
    let mut from_file = generate_in(&model, &mut restored, &full, greedy(16)).unwrap();
    let cached: Vec<u32> = from_file.by_ref().map(|t| t.unwrap()).collect();
    assert!(from_file.reused_tokens() >= head.len() - 1);
    drop(from_file);
    let fresh: Vec<u32> = generate(&model, &full, greedy(16)).unwrap().map(|t| t.unwrap()).collect();
    assert_eq!(cached, fresh, "a prompt-cache round trip gives the tokens of an uncached run");

    // Another model: refused, naming both.
    let (other, _) = nuvec_lm::load_dir(&fx.join("mistral-f32")).unwrap();
    let err = prompt_cache::load(&path, &other, &kv).unwrap_err().to_string();
    assert!(err.contains("another model") && err.contains("qwen3-f32"), "{err}");

    // Other KV settings: refused.
    let file = nuvec::io::SafetensorsFile::open(&path).unwrap();
    let mut meta = file.metadata().clone();
    let quantized = nuvec_lm::cache::CacheOptions { kv_bits: Some(4), ..Default::default() };
    meta.insert("kv".into(), serde_json::to_string(&quantized).unwrap());
    let tensors: Vec<(String, nuvec::Array)> =
        file.tensors().keys().map(|k| (k.clone(), file.array(k).unwrap())).collect();
    let edited = path.with_extension("kv4.safetensors");
    nuvec::io::save_safetensors(&edited, &tensors, Some(meta)).unwrap();
    let err = prompt_cache::load(&edited, &model, &kv).unwrap_err().to_string();
    assert!(err.contains("KV cache made with") && err.contains("--kv-bits"), "{err}");

    // A truncated file: an error naming it.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&edited, &bytes[..bytes.len() / 2]).unwrap();
    let err = prompt_cache::load(&edited, &model, &kv).unwrap_err().to_string();
    assert!(err.contains(&edited.display().to_string()), "{err}");
    std::fs::remove_file(&path).ok();
    std::fs::remove_file(&edited).ok();
}

#[test]
fn long_chunks_compute_what_short_chunks_do() {
    // A 700-token chunk runs its MLPs in row blocks; 100-token chunks do not need to.
    let (model, _) = nuvec_lm::load_dir(&fixtures().join("qwen3-f32")).unwrap();
    let prompt: Vec<u32> = (0..700).map(|i| 1000 + (i * 37) % 5000).collect();
    let last_logits = |step: usize| {
        let options = GenerateOptions { max_tokens: 1, prefill_step_size: step, ..Default::default() };
        let mut g = generate(&model, &prompt, options).unwrap();
        g.next();
        g.last_logits().unwrap().to_vec()
    };
    let (whole, chunked) = (last_logits(2048), last_logits(100));
    let diff = whole.iter().zip(&chunked).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-4, "{diff}");
}
