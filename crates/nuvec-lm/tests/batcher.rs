//! The `Batcher`: requests submitted together, at different lengths and with different
//! options, each get what `generate` gives them alone — exactly (tokens, log-probabilities,
//! seeded samples) in batch-invariant mode, the same greedy tokens otherwise — whether they are
//! preempted, cancelled, outgrow the cache or share a step with a request that fails.

mod common;

use std::collections::BTreeMap;

use common::{fixtures, seeded_prompt as prompt};
use nuvec_lm::{
    generate, load_dir, Batcher, BatcherOptions, Event, FinishReason, GenerateOptions, Model, RequestId, Sampler,
    TokenLogprobs,
};

/// What one request produced.
#[derive(Debug, Default, Clone, PartialEq)]
struct Output {
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprobs>,
    reason: Option<FinishReason>,
    failed: bool,
    /// Prompt tokens from the prefix cache (not compared with `generate`'s).
    cached: Option<usize>,
}

/// `generate` alone: the reference.
fn solo(model: &Model, prompt: &[u32], options: &GenerateOptions) -> Output {
    let mut generation = generate(model, prompt, options.clone()).unwrap();
    let tokens = generation.by_ref().map(Result::unwrap).collect();
    Output {
        tokens,
        logprobs: generation.logprobs().to_vec(),
        reason: generation.finish_reason().cloned(),
        failed: false,
        cached: None,
    }
}

/// Steps `batcher` until it is idle, collecting each request's events; also the most
/// requests that ran in one step.
fn drain(batcher: &mut Batcher) -> BTreeMap<RequestId, Output> {
    let mut out: BTreeMap<RequestId, Output> = BTreeMap::new();
    let mut steps = 0;
    while batcher.is_busy() {
        steps += 1;
        assert!(steps < 10_000, "the batcher does not finish");
        for event in batcher.step().unwrap() {
            match event {
                Event::Token { id, token } => {
                    let o = out.entry(id).or_default();
                    assert!(o.reason.is_none(), "{id:?} reported a token after finishing");
                    o.tokens.push(token);
                }
                Event::Logprobs { id, logprobs } => out.entry(id).or_default().logprobs.push(logprobs),
                Event::Failed { id, .. } => out.entry(id).or_default().failed = true,
                Event::Started { id, cached_tokens } => {
                    let o = out.entry(id).or_default();
                    assert!(o.cached.is_none(), "{id:?} started twice");
                    o.cached = Some(cached_tokens);
                }
                Event::Finished { id, reason } => {
                    let o = out.entry(id).or_default();
                    assert!(o.reason.is_none(), "{id:?} finished twice");
                    o.reason = Some(reason);
                }
            }
        }
    }
    out
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, ..Default::default() }
}

/// Submits every `(prompt, options)` to a batcher with `options`, and checks each output
/// against `generate` alone: equal, or (`exact` false) equal in tokens and finish reason.
fn check(
    case: &str,
    requests: &[(Vec<u32>, GenerateOptions)],
    options: BatcherOptions,
    exact: bool,
) -> Batcher<'static> {
    check_with(case, requests, options, exact, |_, _| {})
}

/// [`check`], with `prepare` given the batcher and the requests' ids before the first step.
fn check_with(
    case: &str,
    requests: &[(Vec<u32>, GenerateOptions)],
    options: BatcherOptions,
    exact: bool,
    prepare: impl FnOnce(&mut Batcher, &[RequestId]),
) -> Batcher<'static> {
    let model: &'static Model = Box::leak(Box::new(load_dir(&fixtures().join(case)).unwrap().0));
    let mut batcher = Batcher::new(model, options).unwrap();
    let ids: Vec<RequestId> = requests.iter().map(|(p, o)| batcher.submit(p.clone(), o.clone()).unwrap()).collect();
    prepare(&mut batcher, &ids);
    let outputs = drain(&mut batcher);
    for ((p, o), id) in requests.iter().zip(&ids) {
        let reference = solo(model, p, o);
        let ours = &Output { cached: None, ..outputs[id].clone() };
        if exact {
            assert_eq!(ours, &reference, "{case}: request of {} prompt tokens", p.len());
        } else {
            assert_eq!(
                (&ours.tokens, &ours.reason),
                (&reference.tokens, &reference.reason),
                "{case}: request of {} prompt tokens",
                p.len()
            );
        }
    }
    batcher
}

fn mixed(model_vocab: usize, lengths: &[usize], max_tokens: usize) -> Vec<(Vec<u32>, GenerateOptions)> {
    lengths.iter().enumerate().map(|(i, &n)| (prompt(n, i as u32 + 5, model_vocab), greedy(max_tokens))).collect()
}

fn vocab(case: &str) -> usize {
    load_dir(&fixtures().join(case)).unwrap().0.vocab_size()
}

#[test]
fn concurrent_requests_get_their_solo_tokens_exactly_when_batch_invariant() {
    let invariant = BatcherOptions { batch_invariant: true, blocks: Some(1024), ..Default::default() };
    for case in [
        "llama-f32",
        "llama-q4g64",
        "qwen3-f32",
        "qwen2-q8g32",
        "qwen3_moe-q4g64",
        "qwen3_5/qwen3_5-f32",
        "gemma4/gemma4-f32",
        "gpt_oss/gpt_oss-f32",
    ] {
        // 2100 positions: a prefill of two chunks (2048 + 51) before the last token.
        let lengths: &[usize] = if case == "llama-f32" { &[1, 17, 300, 2100] } else { &[1, 17, 300, 40] };
        check(case, &mixed(vocab(case), lengths, 8), invariant.clone(), true);
    }
}

#[test]
fn concurrent_requests_get_their_solo_greedy_tokens_batched() {
    let batched = BatcherOptions { blocks: Some(1024), ..Default::default() };
    for case in [
        "llama-f32",
        "llama-q4g64",
        "mistral-q4g64",
        "qwen3-q8g32",
        "qwen3_moe-f32",
        "qwen3_5/qwen3_5-q4g64",
        // Sliding windows of 8 (and Gemma 4's KV-shared layers, gpt-oss's sinks).
        "gemma4/gemma4-f32",
        "gemma4/gemma4_moe-q4g64",
        "gpt_oss/gpt_oss-q4g64",
    ] {
        let lengths = [1, 17, 300, 5, 64, 2, 33];
        let b = check(case, &mixed(vocab(case), &lengths, 8), batched.clone(), false);
        assert_eq!(b.stats().preemptions, 0);
    }
}

#[test]
fn sampling_stops_and_logprobs_are_each_requests_own() {
    let case = "qwen3-f32";
    let v = vocab(case);
    let sampled = |seed| GenerateOptions {
        max_tokens: 12,
        sampler: Sampler { temperature: 0.9, top_p: 0.95, ..Default::default() },
        seed: Some(seed),
        ..Default::default()
    };
    let with_logprobs = GenerateOptions { logprobs: Some(3), ..greedy(6) };
    let first = solo(&load_dir(&fixtures().join(case)).unwrap().0, &prompt(9, 1, v), &greedy(6));
    // A stop token that greedy decoding of this prompt reaches at its third token.
    let stop_at = GenerateOptions { stop: nuvec_lm::Stop::tokens([first.tokens[2]]), ..greedy(6) };
    let requests = vec![
        (prompt(9, 1, v), sampled(7)),
        (prompt(30, 2, v), sampled(8)),
        (prompt(9, 1, v), with_logprobs),
        (prompt(9, 1, v), stop_at),
        (prompt(5, 3, v), GenerateOptions { max_tokens: 0, ..Default::default() }),
        (prompt(5, 4, v), GenerateOptions { min_tokens: 3, ..greedy(5) }),
    ];
    let invariant = BatcherOptions { batch_invariant: true, blocks: Some(256), ..Default::default() };
    check(case, &requests, invariant, true);
}

#[test]
fn requests_sampled_at_a_temperature_alone_are_drawn_where_the_logits_are() {
    let case = "qwen3-f32";
    let v = vocab(case);
    let at = |temperature, seed| GenerateOptions {
        max_tokens: 10,
        sampler: Sampler { temperature, ..Default::default() },
        seed: Some(seed),
        ..Default::default()
    };
    let top_k = GenerateOptions { sampler: Sampler { temperature: 1.0, top_k: 5, ..Default::default() }, ..at(1.0, 4) };
    let requests = vec![
        (prompt(9, 1, v), at(0.8, 7)),
        (prompt(30, 2, v), at(1.0, 8)),
        (prompt(12, 3, v), at(1.6, 9)),
        // A filter that applies, and a greedy request: neither drawn there.
        (prompt(9, 4, v), top_k),
        (prompt(5, 5, v), greedy(8)),
    ];
    let draws = 30;
    for (on, redraw) in [(true, false), (true, true), (false, false)] {
        let options = BatcherOptions {
            batch_invariant: true,
            blocks: Some(256),
            device_sampling: Some(on),
            ..Default::default()
        };
        // Each request's tokens are its solo run's, drawn where the logits are or (all draws
        // taken as uncertain) on the host with the same uniform.
        let b = check_with(case, &requests, options, true, |b, ids| {
            if redraw {
                ids.iter().for_each(|&id| b.redraw_on_host(id));
            }
        });
        let s = b.stats();
        let expected = match (on, redraw) {
            (true, false) => (draws, 0),
            (true, true) => (0, draws),
            _ => (0, 0),
        };
        assert_eq!((s.drawn_on_device, s.drawn_again), expected, "device sampling {on}, redrawn {redraw}");
    }
}

#[test]
fn a_pool_too_small_for_everyone_preempts_and_still_gives_the_solo_tokens() {
    // 24 blocks of 4 positions: six requests of 20 + 12 positions cannot all be held at once.
    let case = "llama-q4g64";
    let requests = mixed(vocab(case), &[20, 20, 19, 18, 20, 17], 12);
    for pipeline in [false, true] {
        let options = BatcherOptions {
            blocks: Some(24),
            block_size: 4,
            max_batch: 6,
            pipeline: Some(pipeline),
            ..Default::default()
        };
        let b = check(case, &requests, options, false);
        assert!(b.stats().preemptions > 0, "the pool was meant to run out");
        assert_eq!(b.stats().pipelined_steps > 0, pipeline);
    }
    // The same in batch-invariant mode, exactly (a re-prefill recomputes the same positions).
    let options =
        BatcherOptions { blocks: Some(24), block_size: 4, max_batch: 6, batch_invariant: true, ..Default::default() };
    let b = check("llama-f32", &mixed(vocab("llama-f32"), &[20, 20, 19, 18, 20, 17], 12), options, false);
    assert!(b.stats().preemptions > 0);
}

#[test]
fn cancel_while_waiting_and_while_running() {
    for pipeline in [false, true] {
        cancel_while_waiting_and_while_running_in(pipeline);
    }
}

fn cancel_while_waiting_and_while_running_in(pipeline: bool) {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let v = model.vocab_size();
    let options = BatcherOptions { max_batch: 1, blocks: Some(64), pipeline: Some(pipeline), ..Default::default() };
    let mut b = Batcher::new(&model, options).unwrap();
    let running = b.submit(prompt(10, 1, v), greedy(50)).unwrap();
    let waiting = b.submit(prompt(10, 2, v), greedy(50)).unwrap();
    let other = b.submit(prompt(10, 3, v), greedy(4)).unwrap();
    let mut tokens = 0;
    for _ in 0..4 {
        tokens += b.step().unwrap().iter().filter(|e| matches!(e, Event::Token { id, .. } if *id == running)).count();
    }
    assert!(tokens >= 2, "the first request runs");
    assert!(b.cancel(running));
    assert!(b.cancel(waiting));
    let out = drain(&mut b);
    assert_eq!(out[&running].reason, Some(FinishReason::Cancelled));
    assert_eq!(out[&running].tokens, Vec::<u32>::new(), "nothing after the cancel");
    assert_eq!(out[&waiting], Output { reason: Some(FinishReason::Cancelled), ..Default::default() });
    assert_eq!(out[&other], Output { cached: Some(0), ..solo(&model, &prompt(10, 3, v), &greedy(4)) });
    assert!(!b.cancel(running), "an ended request cannot be cancelled again");
    assert_eq!(b.stats().blocks_used, 0);
}

#[test]
fn a_request_that_outgrows_the_whole_cache_ends_cache_full() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let v = model.vocab_size();
    let reference = solo(&model, &prompt(5, 1, v), &greedy(100));
    for pipeline in [true, false] {
        let options = BatcherOptions { blocks: Some(3), block_size: 4, pipeline: Some(pipeline), ..Default::default() };
        let mut b = Batcher::new(&model, options).unwrap();
        let id = b.submit(prompt(5, 1, v), greedy(100)).unwrap();
        let out = drain(&mut b);
        // 12 positions: the 5 prompt tokens and 7 generated ones fed back, plus the last sampled.
        assert_eq!(out[&id].reason, Some(FinishReason::CacheFull), "pipelined: {pipeline}");
        assert_eq!(out[&id].tokens, reference.tokens[..8], "pipelined: {pipeline}");
    }
    let mut b = Batcher::new(&model, BatcherOptions { blocks: Some(3), block_size: 4, ..Default::default() }).unwrap();
    // A prompt that could never fit is refused up front.
    let e = b.submit(prompt(13, 1, v), greedy(1)).unwrap_err().to_string();
    assert!(e.contains("13 tokens") && e.contains("BatcherOptions::blocks"), "{e}");
}

#[test]
fn a_failing_step_fails_only_its_request() {
    a_failing_step_fails_only_its_request_in("qwen3_5/qwen3_5-f32", None);
    // Pipelined, the failed pass's requests are run again one by one with their fed tokens.
    a_failing_step_fails_only_its_request_in("llama-q4g64", Some(true));
}

fn a_failing_step_fails_only_its_request_in(case: &str, pipeline: Option<bool>) {
    let (model, _) = load_dir(&fixtures().join(case)).unwrap();
    let v = model.vocab_size();
    let mut b = Batcher::new(&model, BatcherOptions { blocks: Some(256), pipeline, ..Default::default() }).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(12 + i, i as u32, v)).collect();
    let ids: Vec<RequestId> = prompts.iter().map(|p| b.submit(p.clone(), greedy(6)).unwrap()).collect();
    // Let every request prefill and decode a little, then make one fail mid-decode.
    for _ in 0..3 {
        b.step().unwrap();
    }
    b.inject_failure(ids[1]);
    let mut failed = vec![];
    let mut out: BTreeMap<RequestId, Vec<u32>> = BTreeMap::new();
    while b.is_busy() {
        for e in b.step().unwrap() {
            match e {
                Event::Failed { id, error } => failed.push((id, error.to_string())),
                Event::Token { id, token } => out.entry(id).or_default().push(token),
                _ => {}
            }
        }
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, ids[1]);
    assert!(failed[0].1.contains("injected failure"), "{}", failed[0].1);
    for (i, p) in prompts.iter().enumerate().filter(|&(i, _)| i != 1) {
        // The tokens after the failed step continue the solo run (the first steps' tokens were
        // read before the collection started).
        let reference = solo(&model, p, &greedy(6)).tokens;
        let tail = &out[&ids[i]];
        assert_eq!(&reference[reference.len() - tail.len()..], &tail[..], "request {i}");
        assert!(!tail.is_empty());
    }
}

#[test]
fn bad_options_and_requests_are_refused_naming_the_field() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let bad = [
        (BatcherOptions { max_batch: 0, ..Default::default() }, "max_batch"),
        (BatcherOptions { block_size: 0, ..Default::default() }, "block_size"),
        (BatcherOptions { blocks: Some(0), ..Default::default() }, "blocks"),
        (BatcherOptions { memory_fraction: 1.5, ..Default::default() }, "memory_fraction"),
        (BatcherOptions { memory_fraction: f64::NAN, ..Default::default() }, "memory_fraction"),
        (BatcherOptions { token_budget: Some(4), max_batch: 8, ..Default::default() }, "token_budget"),
        (BatcherOptions { micro_batches: Some(2), ..Default::default() }, "micro_batches"),
        (BatcherOptions { cache_bytes: Some(0), ..Default::default() }, "cache_bytes"),
        (BatcherOptions { cache_bytes: Some(1), ..Default::default() }, "less than one cache block"),
        (BatcherOptions { cache_bytes: Some(usize::MAX), ..Default::default() }, "more than the"),
        (BatcherOptions { cache_bytes: Some(1 << 20), blocks: Some(8), ..Default::default() }, "both set"),
        (BatcherOptions { pipeline: Some(true), batch_invariant: true, ..Default::default() }, "batch_invariant"),
        (BatcherOptions { pipeline: Some(true), kv_bits: Some(8), ..Default::default() }, "kv_bits"),
    ];
    for (options, field) in bad {
        let e = Batcher::new(&model, options).err().expect("refused").to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
    // The cache sized in bytes holds as many whole blocks as fit.
    let per_block = model.kv_bytes_per_position().unwrap() * 16;
    let sized = Batcher::new(&model, BatcherOptions { cache_bytes: Some(per_block * 5 + 1), ..Default::default() });
    assert_eq!(sized.unwrap().stats().blocks_total, 5);
    let mut b = Batcher::new(&model, BatcherOptions { blocks: Some(64), ..Default::default() }).unwrap();
    let v = model.vocab_size() as u32;
    let refused = [
        (vec![], greedy(4), "empty"),
        (vec![1, v], greedy(4), "outside the vocabulary"),
        (
            vec![1, 2],
            GenerateOptions { sampler: Sampler { temperature: -1.0, ..Default::default() }, ..greedy(4) },
            "temperature",
        ),
        (
            vec![1, 2],
            GenerateOptions {
                cache: nuvec_lm::cache::CacheOptions { kv_bits: Some(8), ..Default::default() },
                ..greedy(4)
            },
            "kv_bits",
        ),
        (
            vec![1, 2],
            GenerateOptions {
                cache: nuvec_lm::cache::CacheOptions { max_kv_size: Some(64), ..Default::default() },
                ..greedy(4)
            },
            "max_kv_size",
        ),
    ];
    for (p, o, words) in refused {
        let e = b.submit(p, o).unwrap_err().to_string();
        assert!(e.contains(words), "{words}: {e}");
    }
    assert!(!b.is_busy(), "nothing refused was queued");
}

#[test]
fn the_cache_is_sized_from_memory_by_default() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let per_position = model.kv_bytes_per_position().unwrap();
    assert!(per_position > 0);
    let b = Batcher::new(&model, BatcherOptions { max_batch: 2, max_positions: 4096, ..Default::default() }).unwrap();
    // Bounded by room for max_batch sequences of max_positions (the random model's cache is
    // small enough that memory does not bind first on a machine with a few GiB free).
    assert_eq!(b.stats().blocks_total, 2 * 4096 / 16);
}

/// `prefix` then `suffix`.
fn joined(prefix: &[u32], suffix: &[u32]) -> Vec<u32> {
    prefix.iter().chain(suffix).copied().collect()
}

#[test]
fn prefix_hits_share_whole_blocks_and_give_the_cold_tokens() {
    for case in ["llama-f32", "qwen3-q4g64", "qwen3_moe-f32"] {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let v = model.vocab_size();
        let system = prompt(40, 9, v);
        let mut b = Batcher::new(&model, BatcherOptions { blocks: Some(64), ..Default::default() }).unwrap();
        assert!(b.prefix_caching(), "on by default");
        let first = b.submit(joined(&system, &prompt(7, 1, v)), greedy(6)).unwrap();
        let out = drain(&mut b);
        assert_eq!(out[&first].cached, Some(0), "{case}: a cold cache");
        // Then three requests sharing the 40-token prefix: two full blocks of 16 (the hit ends
        // mid-way through the prefix's third block, which is computed again), one of them
        // a prompt that is the prefix alone (its last token is always computed).
        let suffixes = [prompt(7, 2, v), prompt(30, 3, v), vec![]];
        let ids: Vec<RequestId> = suffixes.iter().map(|s| b.submit(joined(&system, s), greedy(6)).unwrap()).collect();
        let out = drain(&mut b);
        for (s, id) in suffixes.iter().zip(&ids) {
            let p = joined(&system, s);
            assert_eq!(out[id].cached, Some(32), "{case}: suffix of {}", s.len());
            let cold = solo(&model, &p, &greedy(6));
            assert_eq!((&out[id].tokens, &out[id].reason), (&cold.tokens, &cold.reason), "{case}: suffix {}", s.len());
        }
        // A prompt identical to an earlier one hits all its full blocks but the last token's.
        let again = b.submit(joined(&system, &prompt(30, 3, v)), greedy(6)).unwrap();
        let out = drain(&mut b);
        assert_eq!(out[&again].cached, Some(64), "{case}");
        assert_eq!(b.stats().blocks_used, 0, "{case}: indexed blocks count as free");
    }
}

#[test]
fn requests_arriving_together_compute_a_shared_prefix_once() {
    // Three requests after one 40-token system prompt, submitted at once (as `n` choices or a
    // burst of agent calls are): the first computes the prefix, the others wait for its two
    // full blocks and take them from the cache, and a request with another prompt, queued
    // behind them, is not held up. Every one gets its solo greedy tokens.
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let v = model.vocab_size();
    let system = prompt(40, 9, v);
    let mut b = Batcher::new(&model, BatcherOptions { blocks: Some(64), ..Default::default() }).unwrap();
    let mut prompts: Vec<Vec<u32>> = [1, 2, 3].iter().map(|&s| joined(&system, &prompt(5, s, v))).collect();
    prompts.push(prompt(30, 4, v));
    let ids: Vec<RequestId> = prompts.iter().map(|p| b.submit(p.clone(), greedy(4)).unwrap()).collect();
    let first = b.step().unwrap();
    let started: Vec<RequestId> = first.iter().filter(|e| matches!(e, Event::Started { .. })).map(event_id).collect();
    assert_eq!(started, vec![ids[0], ids[3]], "the other prompt is not held up");
    let out = drain(&mut b);
    let cached: Vec<Option<usize>> = ids[1..3].iter().map(|id| out[id].cached).collect();
    assert_eq!(cached, vec![Some(32), Some(32)], "both take the first request's two full blocks");
    // Each prompt but its last token (which the sampling pass computes), less what was shared.
    assert_eq!(b.stats().prefill_tokens, (44 + 12 + 12 + 29) as u64);
    for (p, id) in prompts.iter().zip(&ids).skip(1) {
        let alone = solo(&model, p, &greedy(4));
        assert_eq!((&out[id].tokens, &out[id].reason), (&alone.tokens, &alone.reason));
    }
}

#[test]
fn a_cache_salt_keeps_prompt_blocks_apart() {
    // vLLM's cache_salt: the same 40-token prompt, one request after another, finds the blocks
    // of earlier requests of its own salt only; each gets its solo tokens whatever it found.
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let p = prompt(40, 11, model.vocab_size());
    let mut b = Batcher::new(&model, BatcherOptions { blocks: Some(64), ..Default::default() }).unwrap();
    let salted = |salt: Option<&str>| GenerateOptions { cache_salt: salt.map(str::to_string), ..greedy(4) };
    let alone = solo(&model, &p, &greedy(4));
    for (salt, cached) in [(None, 0), (Some("tenant-a"), 0), (Some("tenant-b"), 0), (Some("tenant-a"), 32), (None, 32)]
    {
        let out = run_alone(&mut b, p.clone(), salted(salt));
        assert_eq!(out.cached, Some(cached), "salt {salt:?}");
        assert_eq!(out.tokens, alone.tokens, "salt {salt:?}");
    }
    let err = b.submit(p, salted(Some(""))).unwrap_err().to_string();
    assert!(err.contains("cache_salt is empty"), "{err}");
}

fn event_id(e: &Event) -> RequestId {
    match e {
        Event::Token { id, .. }
        | Event::Logprobs { id, .. }
        | Event::Failed { id, .. }
        | Event::Started { id, .. }
        | Event::Finished { id, .. } => *id,
    }
}

/// Runs `prompt` alone through `batcher`: its output.
fn run_alone(batcher: &mut Batcher, prompt: Vec<u32>, options: GenerateOptions) -> Output {
    let id = batcher.submit(prompt, options).unwrap();
    drain(batcher).remove(&id).unwrap()
}

#[test]
fn batch_invariant_prefix_hits_give_the_cold_samples_bit_for_bit() {
    // Seeded sampling with log-probabilities, prefilled 32 rows per pass: a hit is taken only on
    // whole chunks of that grid that passes of the same shape computed, so each output is
    // exactly `generate`'s alone (tokens, every log-probability, finish reason).
    for case in ["llama-f32", "qwen3-q4g64", "qwen3_moe-f32"] {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let v = model.vocab_size();
        let options = |seed: u64, chunk: usize| GenerateOptions {
            max_tokens: 12,
            seed: Some(seed),
            logprobs: Some(2),
            prefill_step_size: chunk,
            sampler: Sampler { temperature: 0.9, ..Default::default() },
            ..Default::default()
        };
        let batcher = BatcherOptions { blocks: Some(64), batch_invariant: true, ..Default::default() };
        let mut b = Batcher::new(&model, batcher).unwrap();
        let first = prompt(70, 1, v);
        let expect = |b: &mut Batcher, p: Vec<u32>, o: GenerateOptions, cached: usize, what: &str| {
            let out = run_alone(b, p.clone(), o.clone());
            assert_eq!(out.cached, Some(cached), "{case}: {what}");
            assert_eq!(Output { cached: None, ..out.clone() }, solo(&model, &p, &o), "{case}: {what}");
            out
        };
        // Cold: chunks 0..32 and 32..64 are indexed; 64..69 and the last token alone are not.
        let cold = expect(&mut b, first.clone(), options(3, 32), 0, "cold");
        expect(&mut b, joined(&first[..64], &prompt(26, 2, v)), options(4, 32), 64, "two whole chunks");
        // Three whole blocks match, but the third would leave its chunk half computed.
        expect(&mut b, joined(&first[..56], &prompt(20, 3, v)), options(5, 32), 32, "one whole chunk");
        expect(&mut b, first.clone(), options(3, 16), 0, "another grid");
        // The next turn of a chat: the earlier answer's blocks came from passes of one row.
        let turn = joined(&joined(&first, &cold.tokens), &prompt(9, 4, v));
        expect(&mut b, turn, options(6, 32), 64, "the next turn");
    }
}

#[test]
fn prefix_caching_off() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let v = model.vocab_size();
    let off = BatcherOptions { blocks: Some(64), prefix_cache: Some(false), ..Default::default() };
    let mut b = Batcher::new(&model, off).unwrap();
    let p = prompt(40, 9, v);
    b.submit(p.clone(), greedy(2)).unwrap();
    drain(&mut b);
    let again = b.submit(p, greedy(2)).unwrap();
    assert_eq!(drain(&mut b)[&again].cached, Some(0));
}

#[test]
fn hybrid_prefix_hits_end_where_a_recurrent_state_was_kept() {
    // Qwen3.5's Gated DeltaNet layers: a hit also takes their states as they were where it
    // ends, kept when a prefill pass ended on a block boundary (passes of 32 rows here: at 32
    // and 64). Exact in batch-invariant mode (tokens and log-probabilities), the same greedy
    // tokens otherwise.
    for case in ["qwen3_5/qwen3_5-f32", "qwen3_5/qwen3_5_moe-f32"] {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let v = model.vocab_size();
        for invariant in [true, false] {
            let options = BatcherOptions { blocks: Some(64), batch_invariant: invariant, ..Default::default() };
            let mut b = Batcher::new(&model, options).unwrap();
            assert!(b.prefix_caching(), "on by default for hybrids too");
            let request = GenerateOptions { max_tokens: 6, prefill_step_size: 32, logprobs: Some(2), ..greedy(6) };
            let first = prompt(70, 1, v);
            let check = |b: &mut Batcher, p: Vec<u32>, cached: usize, what: &str| {
                let out = run_alone(b, p.clone(), request.clone());
                assert_eq!(out.cached, Some(cached), "{case} invariant {invariant}: {what}");
                let alone = solo(&model, &p, &request);
                match invariant {
                    true => assert_eq!(Output { cached: None, ..out }, alone, "{case}: {what}"),
                    false => assert_eq!(out.tokens, alone.tokens, "{case}: {what}"),
                }
            };
            check(&mut b, first.clone(), 0, "cold");
            check(&mut b, joined(&first[..64], &prompt(20, 2, v)), 64, "two whole chunks");
            // Three whole blocks match (48 positions), but no state was kept at 48.
            check(&mut b, joined(&first[..48], &prompt(20, 3, v)), 32, "cut back to a kept state");
        }
    }
}

#[test]
fn hybrid_prompts_shorter_than_a_pass_keep_states_every_checkpoint_interval() {
    // A prompt of one prefill pass (70 tokens under prefill_step_size 2048) kept no recurrent
    // state before the interval: passes now end every 32 positions, so a request sharing its
    // first 40 or 64 tokens (a system prompt) gets a hit at 32 or 64, with the cold greedy
    // tokens. Interval 0 is the old behaviour (no hit); batch-invariant mode keeps the request's
    // own passes (exact against `generate`), so no hit either.
    let (model, _) = load_dir(&fixtures().join("qwen3_5/qwen3_5-f32")).unwrap();
    let v = model.vocab_size();
    let request = GenerateOptions { max_tokens: 6, ..greedy(6) };
    let first = prompt(70, 1, v);
    for (interval, invariant, hits) in [(32, false, [32, 64]), (0, false, [0, 0]), (32, true, [0, 0])] {
        let options = BatcherOptions {
            blocks: Some(64),
            checkpoint_interval: interval,
            batch_invariant: invariant,
            ..Default::default()
        };
        let mut b = Batcher::new(&model, options).unwrap();
        let what = format!("interval {interval} invariant {invariant}");
        let cold = run_alone(&mut b, first.clone(), request.clone());
        assert_eq!(cold.tokens, solo(&model, &first, &request).tokens, "{what}: cold");
        for (shared, hit) in [(40, hits[0]), (64, hits[1])] {
            let p = joined(&first[..shared], &prompt(30, shared as u32, v));
            let out = run_alone(&mut b, p.clone(), request.clone());
            assert_eq!(out.cached, Some(hit), "{what}: {shared} shared");
            assert_eq!(out.tokens, solo(&model, &p, &request).tokens, "{what}: {shared} shared");
        }
    }
    let odd = BatcherOptions { checkpoint_interval: 40, ..Default::default() };
    let err = Batcher::new(&model, odd).err().expect("refused").to_string();
    assert!(err.contains("checkpoint_interval = 40") && err.contains("block_size = 16"), "{err}");
}

/// Pipelined steps (`BatcherOptions::pipeline`; on the CPU they compute what they would
/// unpipelined): every request still gets its solo tokens and finish reason, with requests ending
/// at different steps (lengths, stop tokens), and sampled and log-probability requests among them
/// (whose steps are read before the next is enqueued), on plain, MoE and sliding-window models.
#[test]
fn pipelined_steps_give_the_solo_tokens() {
    let pipelined = BatcherOptions { blocks: Some(1024), pipeline: Some(true), ..Default::default() };
    for case in ["llama-q4g64", "qwen3_moe-f32", "gemma4/gemma4-f32", "gpt_oss/gpt_oss-q4g64"] {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let v = model.vocab_size();
        let mut requests = mixed(v, &[1, 17, 300, 5, 64, 2, 33], 8);
        for (i, r) in requests.iter_mut().enumerate() {
            r.1.max_tokens = 3 + 2 * i;
        }
        let first = solo(&model, &prompt(9, 1, v), &greedy(12));
        requests
            .push((prompt(9, 1, v), GenerateOptions { stop: nuvec_lm::Stop::tokens([first.tokens[4]]), ..greedy(12) }));
        let sampler = Sampler { temperature: 0.9, ..Default::default() };
        requests.push((prompt(9, 2, v), GenerateOptions { sampler, seed: Some(3), ..greedy(6) }));
        requests.push((prompt(12, 3, v), GenerateOptions { logprobs: Some(2), ..greedy(5) }));
        let b = check(case, &requests, pipelined.clone(), false);
        assert!(b.pipelined() && b.stats().pipelined_steps > 0, "{case}: {:?}", b.stats());
        assert_eq!((b.stats().taken_back, b.stats().blocks_used), (0, 0), "{case}");
    }
    // A hybrid's recurrent layers cannot take a fed token back: refused when asked, else off.
    let (hybrid, _) = load_dir(&fixtures().join("qwen3_5/qwen3_5-f32")).unwrap();
    let e = Batcher::new(&hybrid, pipelined.clone()).err().expect("refused").to_string();
    assert!(e.contains("pipeline") && e.contains("recurrent"), "{e}");
    let b = Batcher::new(&hybrid, BatcherOptions { blocks: Some(64), ..Default::default() }).unwrap();
    assert!(!b.pipelined());
}

/// A token fed to a pipelined step that the request does not take (here every one of one
/// request, as if the host had settled near ties otherwise) is taken back from the cache, sliding
/// windows included, and fed again from the host: the request's tokens are its solo ones.
#[test]
fn a_fed_token_taken_back_is_fed_again_from_the_host() {
    let pipelined = BatcherOptions { blocks: Some(256), pipeline: Some(true), ..Default::default() };
    for case in ["llama-q4g64", "gpt_oss/gpt_oss-q4g64"] {
        let requests = mixed(vocab(case), &[5, 40, 12], 10);
        let b = check_with(case, &requests, pipelined.clone(), false, |b, ids| b.distrust_fed_tokens(ids[1]));
        let stats = b.stats();
        assert!(stats.taken_back >= 5 && stats.pipelined_steps > 0, "{case}: {stats:?}");
        assert_eq!(stats.blocks_used, 0, "{case}");
    }
}
