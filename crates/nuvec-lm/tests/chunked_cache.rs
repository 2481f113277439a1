//! The chunked KV cache (Llama 4's local-attention layers) against mlx-lm's `ChunkedKVCache`,
//! driven through the same forward passes and trim: attention outputs under the chunk mask,
//! offsets and the front it drops; a trim past what it holds errors (mlx-lm trims fewer).

mod common;

use common::*;
use nuvec::io::SafetensorsFile;
use nuvec::Array;
use nuvec_lm::cache::{CacheOptions, ChunkedKvCache, LayerCache};
use serde_json::Value;

fn record() -> (Value, SafetensorsFile) {
    let dir = fixtures().join("chunked_cache");
    let r = serde_json::from_str(&std::fs::read_to_string(dir.join("chunked.json")).unwrap()).unwrap();
    (r, SafetensorsFile::open(dir.join("chunked.safetensors")).unwrap())
}

fn count(v: &Value) -> usize {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}")) as usize
}

#[test]
fn chunked_cache_matches_mlx_lm_pass_by_pass() {
    let (r, arrays) = record();
    let scale = r["scale"].as_f64().unwrap() as f32;
    let mut cache = LayerCache::Chunked(ChunkedKvCache::new(count(&r["chunk_size"])).unwrap());
    let steps = r["steps"].as_array().unwrap();
    for (i, step) in steps.iter().enumerate() {
        if let Some(n) = step.get("trim") {
            cache.trim(count(n)).unwrap();
        } else {
            let get = |name: &str| arrays.array(&format!("{name}{i}")).unwrap();
            let out = cache.attend(&get("q"), &get("k"), &get("v"), scale).unwrap();
            let (got, want) = (out.to_f32_vec().unwrap(), get("out").to_f32_vec().unwrap());
            assert_eq!(got.len(), want.len(), "pass {i}");
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-5, "pass {i}: attention differs from mlx-lm's by {worst}");
        }
        let LayerCache::Chunked(c) = &cache else { unreachable!() };
        assert_eq!(c.offset(), count(&step["offset"]), "pass {i}: offset");
        assert_eq!(c.start(), count(&step["start"]), "pass {i}: start position");
    }
}

#[test]
fn chunked_cache_trims_exactly_or_errors() {
    let (r, arrays) = record();
    let mut cache = ChunkedKvCache::new(count(&r["chunk_size"])).unwrap();
    let get = |name: &str| arrays.array(name).unwrap();
    // Passes 0..=5 hold more than a chunk, so the next pass drops the front.
    for i in 0..=6 {
        cache.attend(&get(&format!("q{i}")), &get(&format!("k{i}")), &get(&format!("v{i}")), 1.0).unwrap();
    }
    let (offset, start) = (cache.offset(), cache.start());
    assert!(start > 0, "the front was dropped");
    let held = offset - start;
    // mlx-lm trims `min(held, n)` silently; the record shows it did fewer than asked.
    let over = &r["trim_past_held"];
    assert!(count(&over["trimmed"]) < count(&over["asked"]));
    let err = cache.trim(held + 1).unwrap_err().to_string();
    assert!(err.contains("cannot trim"), "{err}");
    assert_eq!((cache.offset(), cache.start()), (offset, start), "a refused trim changes nothing");
    cache.trim(held).unwrap();
    assert_eq!(cache.offset(), start);
}

#[test]
fn chunked_cache_round_trips_through_a_prompt_cache_description() {
    let (r, arrays) = record();
    let chunk = count(&r["chunk_size"]);
    let get = |name: &str| arrays.array(name).unwrap();
    let mut cache = LayerCache::Chunked(ChunkedKvCache::new(chunk).unwrap());
    for i in 0..=6 {
        cache.attend(&get(&format!("q{i}")), &get(&format!("k{i}")), &get(&format!("v{i}")), 0.5).unwrap();
    }
    let (named, description) = cache.save_state().unwrap();
    let lookup = |name: &str| -> nuvec_lm::Result<Array> {
        named
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.clone())
            .ok_or_else(|| nuvec_lm::Error::Invalid(format!("no {name}")))
    };
    let mut restored = LayerCache::load_state(&description, lookup, &CacheOptions::default()).unwrap();
    assert_eq!(restored.offset(), cache.offset());
    // The next pass gives the same attention from both.
    let (q, k, v) = (get("q8"), get("k8"), get("v8"));
    let a = cache.attend(&q, &k, &v, 0.5).unwrap().to_f32_vec().unwrap();
    let b = restored.attend(&q, &k, &v, 0.5).unwrap().to_f32_vec().unwrap();
    assert_eq!(a, b);
    // Quantizing a chunked layer is refused, not skipped.
    let options = CacheOptions { kv_bits: Some(8), quantized_kv_start: 0, ..Default::default() };
    assert!(cache.maybe_quantize(&options).unwrap_err().to_string().contains("chunked"));
}
