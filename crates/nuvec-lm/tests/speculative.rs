//! Speculative decoding with prompt lookup on the real model (SmolLM2-135M-Instruct, its GGUF):
//! greedy and seeded outputs equal plain decoding's, stops and limits end where they do without
//! speculation, guesses are accepted, and what cannot be rewound is refused.

mod common;

use common::default_gguf;
use nuvec_lm::cache::{CacheOptions, LayerCache};
use nuvec_lm::speculative::{speculative_generate, DraftModel, PromptLookup, Proposer};
use nuvec_lm::{generate, FinishReason, GenerateOptions, Message, Model, Sampler, Stop, Tokenizer};

fn model() -> (Model, Tokenizer) {
    nuvec_lm::load(default_gguf().to_str().unwrap()).unwrap()
}

/// A prompt whose answer repeats it: what prompt lookup is for.
fn prompt(tokenizer: &Tokenizer) -> Vec<u32> {
    let text =
        "Copy this list exactly, then stop:\n1. apples and pears\n2. oranges and lemons\n3. plums and cherries\n\
                4. grapes and melons\n5. figs and dates";
    let template = tokenizer.chat_template().unwrap();
    let rendered = template.render(&[Message::new("user", text)], true, &Default::default()).unwrap();
    tokenizer.encode(&rendered, false).unwrap()
}

fn plain(model: &Model, prompt: &[u32], options: GenerateOptions) -> (Vec<u32>, FinishReason) {
    let mut g = generate(model, prompt, options).unwrap();
    let tokens = g.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
    (tokens, g.finish_reason().cloned().unwrap())
}

fn speculative<P: Proposer>(
    model: &Model,
    prompt: &[u32],
    options: GenerateOptions,
    proposer: P,
    k: usize,
) -> (Vec<u32>, FinishReason, nuvec_lm::speculative::SpeculativeStats) {
    let mut g = speculative_generate(model, prompt, options, proposer, k).unwrap();
    let tokens = g.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
    (tokens, g.finish_reason().cloned().unwrap(), g.stats().clone())
}

#[test]
fn prompt_lookup_gives_plain_decodings_tokens() {
    let (model, tokenizer) = model();
    let prompt = prompt(&tokenizer);
    let cases = [
        ("greedy", GenerateOptions { max_tokens: 80, ..Default::default() }),
        (
            "sampled, seeded",
            GenerateOptions {
                max_tokens: 80,
                sampler: Sampler { temperature: 0.7, top_p: 0.9, ..Default::default() },
                seed: Some(7),
                ..Default::default()
            },
        ),
        (
            "a stop string and max_tokens inside a verified run",
            GenerateOptions {
                max_tokens: 37,
                stop: Stop::strings(&tokenizer, ["lemons"]).unwrap(),
                ..Default::default()
            },
        ),
        ("max_tokens 1", GenerateOptions { max_tokens: 1, ..Default::default() }),
    ];
    for (what, options) in cases {
        let (want, want_reason) = plain(&model, &prompt, options.clone());
        for k in [1, 4, 8] {
            let (got, reason, stats) = speculative(&model, &prompt, options.clone(), PromptLookup::default(), k);
            println!(
                "RESULT speculative {what}, k={k}: {} tokens, {} steps, {}/{} accepted ({:.2} tokens per step)",
                got.len(),
                stats.steps,
                stats.accepted,
                stats.drafted,
                stats.tokens_per_step()
            );
            assert_eq!(got, want, "{what}, k={k}: {:?} vs plain {:?}", tokenizer.decode(&got), tokenizer.decode(&want));
            assert_eq!(reason, want_reason, "{what}, k={k}");
            if want.len() > 20 {
                assert!(stats.accepted > 0 && stats.steps < want.len(), "{what}, k={k}: nothing saved: {stats:?}");
            }
            assert!(stats.by_position.iter().all(|&(reached, ok)| ok <= reached), "{stats:?}");
        }
    }
}

#[test]
fn what_cannot_be_rewound_is_refused() {
    let (model, tokenizer) = model();
    let prompt = prompt(&tokenizer);
    let err = |options: GenerateOptions, k: usize| {
        speculative_generate(&model, &prompt, options, PromptLookup::default(), k).err().unwrap().to_string()
    };
    assert!(err(GenerateOptions::default(), 0).contains("num_draft"));
    let ring = CacheOptions { kv_bits: Some(8), max_kv_size: Some(256), ..Default::default() };
    let e = err(GenerateOptions { cache: ring, ..Default::default() }, 4);
    assert!(e.contains("quantized rotating KV cache"), "{e}");
    let bad = PromptLookup { max_ngram: 1, min_ngram: 2 };
    assert!(bad.validate().unwrap_err().to_string().contains("n-gram"));
}

/// A quantized KV cache (`kv_bits`) as plain decoding has it: quantized from the start, or from
/// a `quantized_kv_start` that the generation crosses, where no pass may reach past that point
/// before the cache is quantized there (the first pass that reaches it ends on it): the same
/// tokens as decoding one token at a time. (At 4 bits the noise puts near ties in this answer,
/// where a verified pass's rounding, as any multi-row pass's, may pick the other token.)
#[test]
fn quantized_caches_give_plain_decodings_tokens() {
    let (model, tokenizer) = model();
    let prompt = prompt(&tokenizer);
    let start_inside = prompt.len() + 13;
    for start in [0, start_inside] {
        let cache = CacheOptions { kv_bits: Some(8), quantized_kv_start: start, ..Default::default() };
        let options = GenerateOptions { max_tokens: 60, cache, ..Default::default() };
        let (want, want_reason) = plain(&model, &prompt, options.clone());
        for k in [3, 8] {
            let case = format!("kv_bits 8 from {start}, k={k}");
            let mut g = speculative_generate(&model, &prompt, options.clone(), PromptLookup::default(), k).unwrap();
            let mut got = vec![];
            // The held positions when the caches are first seen quantized (they change only in
            // passes, so that is where the pass that quantized them ended).
            let mut quantized_at = None;
            while let Some(token) = g.next() {
                got.push(token.unwrap());
                let layers = g.cache();
                let quantized = layers.iter().all(|c| matches!(c, LayerCache::Quantized(_)));
                assert!(quantized || layers.iter().all(|c| matches!(c, LayerCache::Plain(_))), "{case}");
                if quantized && quantized_at.is_none() {
                    quantized_at = Some(layers[0].offset());
                }
            }
            let stats = g.stats().clone();
            println!(
                "RESULT speculative {case}: {} tokens, {}/{} accepted, quantized at {quantized_at:?} positions",
                got.len(),
                stats.accepted,
                stats.drafted
            );
            assert_eq!(got, want, "{case}");
            assert_eq!(g.finish_reason(), Some(&want_reason), "{case}");
            assert!(stats.accepted > 0, "{case}: nothing accepted: {stats:?}");
            if start > 0 {
                assert_eq!(quantized_at, Some(start), "{case}: quantized after the wrong pass");
            }
        }
    }
}

/// The model as its own draft (the same tokenizer, greedy guesses that are its own greedy
/// picks): the outputs are plain decoding's and nearly every guess is accepted; a model of
/// another tokenizer is told apart.
#[test]
fn a_draft_model_gives_plain_decodings_tokens() {
    let (target, tokenizer) = model();
    let (draft, draft_tokenizer) = model();
    let model = target;
    assert_eq!(tokenizer.differs_from(&draft_tokenizer), None);
    let other = nuvec_lm::Tokenizer::load(&common::fixtures().join("llama-q4g64"), &[]).unwrap();
    let why = tokenizer.differs_from(&other).expect("SmolLM2's and Llama 3's tokenizers differ");
    assert!(why.contains("tokens against"), "{why}");
    let prompt = prompt(&tokenizer);
    let cases = [
        GenerateOptions { max_tokens: 60, ..Default::default() },
        GenerateOptions {
            max_tokens: 60,
            sampler: Sampler { temperature: 0.7, ..Default::default() },
            seed: Some(3),
            ..Default::default()
        },
    ];
    for options in cases {
        let (want, want_reason) = plain(&model, &prompt, options.clone());
        for k in [1, 3] {
            let proposer = DraftModel::new(&draft, 512).unwrap();
            let (got, reason, stats) = speculative(&model, &prompt, options.clone(), proposer, k);
            println!(
                "RESULT speculative draft model, temperature {}, k={k}: {} tokens, {}/{} accepted",
                options.sampler.temperature,
                got.len(),
                stats.accepted,
                stats.drafted
            );
            assert_eq!(got, want, "k={k}");
            assert_eq!(reason, want_reason, "k={k}");
            if options.sampler.temperature == 0.0 {
                assert!(stats.accepted * 10 >= stats.drafted * 9, "its own greedy guesses: {stats:?}");
            }
        }
    }
}

/// Log-probabilities asked for come with every token as without speculation: the same tokens
/// and alternatives, values to the rounding a pass over several positions allows.
#[test]
fn logprobs_are_kept_for_every_token() {
    let (model, tokenizer) = model();
    let prompt = prompt(&tokenizer);
    let options = GenerateOptions { max_tokens: 40, logprobs: Some(3), ..Default::default() };
    let mut plain_run = generate(&model, &prompt, options.clone()).unwrap();
    let want_tokens = plain_run.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
    let want = plain_run.logprobs().to_vec();
    let mut g = speculative_generate(&model, &prompt, options, PromptLookup::default(), 4).unwrap();
    let tokens = g.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
    assert_eq!(tokens, want_tokens);
    assert!(g.stats().accepted > 0, "{:?}", g.stats());
    let got = g.logprobs();
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.token, b.token, "token {i}");
        assert!((a.logprob - b.logprob).abs() < 1e-3, "token {i}: {} vs {}", a.logprob, b.logprob);
        let (ta, tb): (Vec<u32>, Vec<u32>) = (a.top.iter().map(|t| t.0).collect(), b.top.iter().map(|t| t.0).collect());
        assert_eq!(ta, tb, "token {i}: alternatives");
    }
}
