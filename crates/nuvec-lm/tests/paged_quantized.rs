//! Quantized paged caches (`PagedCache::new_quantized`, `BatcherOptions::kv_bits`): each
//! sequence gets what `generate` gives it alone with `kv_bits` and `quantized_kv_start` 0 (the
//! cache quantized after the first pass, as mlx-lm's `maybe_quantize_kv_cache`) — bit for bit in a
//! batch of one and in batch-invariant mode, the same greedy tokens batched — and prefix hits
//! never start a request inside another's full-precision first pass.

mod common;

use std::collections::BTreeMap;

use common::paged::{chunks_against_alone, stepped_against_alone};
use common::{fixtures, seeded_prompt as prompt};
use nuvec_lm::cache::CacheOptions;
use nuvec_lm::{
    generate, load_dir, Batcher, BatcherOptions, Event, GenerateOptions, Model, PagedCache, RequestId, TokenLogprobs,
};

/// Batched rows round differently from one row's; a quantized value whose input sits on a
/// rounding boundary then moves by one step (what caches.rs allows against mlx-lm).
const TOLERANCE: f32 = 5e-3;

fn quantized(bits: usize, group_size: usize) -> CacheOptions {
    CacheOptions { kv_bits: Some(bits), kv_group_size: group_size, quantized_kv_start: 0, ..Default::default() }
}

/// Prompts of `lengths` prefilled alone through a quantized paged cache (each first pass
/// attending its rows in full precision), then decoded together, against `generate`'s passes
/// alone on a cache quantized after each: greedy-equal, logits within [`TOLERANCE`], and a batch
/// of one bit for bit.
fn check(case: &str, lengths: &[usize], steps: usize, chunk: usize, (bits, group): (usize, usize)) {
    let (model, _) = load_dir(&fixtures().join(case)).unwrap();
    let mut paged = PagedCache::new_quantized(&model, 256, 16, 8, bits, group).unwrap();
    assert_eq!(paged.kv_quantization().map(|s| (s.bits, s.group_size)), Some((bits, group)));
    let tolerance = if lengths.len() == 1 { 0.0 } else { TOLERANCE };
    let options = quantized(bits, group);
    let widest = stepped_against_alone(&model, case, &mut paged, (lengths, steps, chunk), &options, tolerance);
    eprintln!("{case} {bits}-bit g{group}: lengths {lengths:?}, chunks of {chunk}, widest difference {widest:e}");
}

#[test]
fn a_quantized_paged_cache_decodes_as_the_quantized_cache_does() {
    for kv in [(8, 64), (4, 32)] {
        check("qwen3-hd64-f32", &[40], 6, 16, kv);
        check("qwen3-hd64-f32", &[1, 17, 300, 40], 8, 64, kv);
        // A first pass of the whole prompt, and first passes of one token (decoded together).
        check("qwen3-hd64-f32", &[2, 33, 1], 6, 2048, kv);
        // Gated DeltaNet layers keep their state in slots; the attention layers are quantized.
        check("qwen3_5/qwen3_5-f32", &[1, 17, 90], 6, 32, kv);
    }
}

/// Short chunks over quantized prefixes, several in one step (attended in place over the codes).
#[test]
fn short_chunks_over_quantized_prefixes_attend_as_alone() {
    for (case, (bits, group)) in [("qwen3-hd64-f32", (8, 64)), ("qwen3_5/qwen3_5-f32", (4, 32))] {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let mut paged = PagedCache::new_quantized(&model, 256, 16, 8, bits, group).unwrap();
        let setup = (&[50, 37, 61][..], 20, &[4, 16, 1, 9, 17, 2][..], 5);
        let widest = chunks_against_alone(&model, case, &mut paged, setup, &quantized(bits, group), TOLERANCE);
        eprintln!("{case} {bits}-bit g{group}: short chunks, widest difference {widest:e}");
    }
}

#[test]
fn a_group_size_that_does_not_divide_the_heads_is_refused_when_the_cache_is_made() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let err = PagedCache::new_quantized(&model, 8, 16, 2, 8, 32).unwrap_err().to_string();
    assert!(err.contains("kv_group_size = 32") && err.contains("head dimension 16"), "{err}");
    let err = PagedCache::new_quantized(&model, 8, 16, 2, 7, 64).unwrap_err().to_string();
    assert!(err.contains("bits = 7"), "{err}");
}

/// What a request produced: its tokens, their log-probabilities (when asked) and the prompt
/// tokens its prefix hit gave it.
type Output = (Vec<u32>, Vec<TokenLogprobs>, usize);

/// Steps `batcher` until idle, collecting each request's output.
fn drain(batcher: &mut Batcher) -> BTreeMap<RequestId, Output> {
    let mut out: BTreeMap<RequestId, Output> = BTreeMap::new();
    while batcher.is_busy() {
        for event in batcher.step().unwrap() {
            match event {
                Event::Token { id, token } => out.entry(id).or_default().0.push(token),
                Event::Logprobs { id, logprobs } => out.entry(id).or_default().1.push(logprobs),
                Event::Started { id, cached_tokens } => out.entry(id).or_default().2 = cached_tokens,
                Event::Failed { id, error } => panic!("{id:?} failed: {error}"),
                _ => {}
            }
        }
    }
    out
}

fn solo(model: &Model, prompt: &[u32], options: &GenerateOptions) -> (Vec<u32>, Vec<TokenLogprobs>) {
    let mut generation = generate(model, prompt, options.clone()).unwrap();
    let tokens = generation.by_ref().map(Result::unwrap).collect();
    (tokens, generation.logprobs().to_vec())
}

#[test]
fn the_batcher_serves_quantized_requests_their_solo_tokens() {
    let model: &'static Model = Box::leak(Box::new(load_dir(&fixtures().join("qwen3-hd64-f32")).unwrap().0));
    let vocab = model.vocab_size();
    for invariant in [true, false] {
        let options = BatcherOptions {
            kv_bits: Some(8),
            kv_group_size: 64,
            batch_invariant: invariant,
            blocks: Some(512),
            ..Default::default()
        };
        let mut batcher = Batcher::new(model, options).unwrap();
        let requests: Vec<(Vec<u32>, GenerateOptions)> = [1, 17, 300, 40]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let cache = quantized(8, 64);
                // Batch-invariant requests get their solo log-probabilities bit for bit too.
                let logprobs = invariant.then_some(3);
                (
                    prompt(n, i as u32 + 5, vocab),
                    GenerateOptions { max_tokens: 8, cache, logprobs, ..Default::default() },
                )
            })
            .collect();
        let ids: Vec<RequestId> = requests.iter().map(|(p, o)| batcher.submit(p.clone(), o.clone()).unwrap()).collect();
        let outputs = drain(&mut batcher);
        for ((p, o), id) in requests.iter().zip(&ids) {
            let (tokens, logprobs) = solo(model, p, o);
            assert_eq!(outputs[id].0, tokens, "invariant {invariant}: {} prompt tokens", p.len());
            assert_eq!(outputs[id].1, logprobs, "invariant {invariant}: {} prompt tokens", p.len());
        }
    }
    // Requests that ask for other settings are refused, naming them.
    let mut batcher =
        Batcher::new(model, BatcherOptions { kv_bits: Some(8), blocks: Some(64), ..Default::default() }).unwrap();
    let p = prompt(5, 1, vocab);
    for (cache, named) in [
        (quantized(4, 64), "quantized to 8 bits"),
        (CacheOptions { quantized_kv_start: 100, ..quantized(8, 64) }, "quantized_kv_start = 100"),
    ] {
        let err = batcher.submit(p.clone(), GenerateOptions { cache, ..Default::default() }).unwrap_err().to_string();
        assert!(err.contains(named), "{err}");
    }
    let plain = Batcher::new(model, BatcherOptions { blocks: Some(64), ..Default::default() });
    let err = plain.unwrap().submit(p, GenerateOptions { cache: quantized(8, 64), ..Default::default() });
    assert!(err.unwrap_err().to_string().contains("not quantized"));
    let bad = BatcherOptions { kv_bits: Some(8), kv_group_size: 48, ..Default::default() };
    let err = Batcher::new(model, bad).err().unwrap().to_string();
    assert!(err.contains("BatcherOptions::kv_bits") && err.contains("48"), "{err}");
}

/// A request sharing a prefix with an earlier one gets a hit only where the earlier one's
/// first pass (computed in full precision) had ended: a hit inside it would have the rest of
/// that pass read the prefix quantized, which its solo run never does.
#[test]
fn quantized_prefix_hits_start_after_the_first_pass() {
    let model: &'static Model = Box::leak(Box::new(load_dir(&fixtures().join("qwen3-hd64-f32")).unwrap().0));
    let vocab = model.vocab_size();
    let shared = prompt(64, 9, vocab);
    let with_tail = |seed: u32| -> Vec<u32> { shared.iter().copied().chain(prompt(20, seed, vocab)).collect() };
    for (kv_bits, first_chunk, expect_hit) in [(None, 2048, 64), (Some(8), 2048, 0), (Some(8), 32, 64)] {
        let options = BatcherOptions { kv_bits, blocks: Some(256), prefix_cache: Some(true), ..Default::default() };
        let mut batcher = Batcher::new(model, options).unwrap();
        let cache = if kv_bits.is_some() { quantized(8, 64) } else { CacheOptions::default() };
        let request = GenerateOptions { max_tokens: 6, prefill_step_size: first_chunk, cache, ..Default::default() };
        let (a, b) = (with_tail(1), with_tail(2));
        let first = batcher.submit(a.clone(), request.clone()).unwrap();
        let out_a = drain(&mut batcher);
        let second = batcher.submit(b.clone(), request.clone()).unwrap();
        let out_b = drain(&mut batcher);
        assert_eq!(out_b[&second].2, expect_hit, "kv_bits {kv_bits:?}, first pass of {first_chunk}");
        assert_eq!(out_a[&first].0, solo(model, &a, &request).0);
        assert_eq!(out_b[&second].0, solo(model, &b, &request).0, "kv_bits {kv_bits:?}: the hit changed no token");
    }
}
