//! Prompt-lookup speculation in the Batcher (`BatcherOptions::speculation`): requests that guess
//! their next tokens from their own prompt and output hand out exactly the tokens `generate`
//! gives them alone (greedy, seeded sampling, log-probabilities, stop strings) on plain,
//! sliding-window and hybrid models, guesses are fed and some are right, and settings under
//! which a wrong guess cannot be taken back are refused.

mod common;

use std::collections::BTreeMap;

use common::{default_gguf, fixtures, seeded_prompt};
use nuvec_lm::{
    generate, load_dir, BatchSpeculation, Batcher, BatcherOptions, Event, FinishReason, GenerateOptions, Message,
    Model, RequestId, Sampler, Stop,
};

/// A prompt that repeats itself, as the inputs that speculation pays off on do.
fn repeating(seed: u32, vocab: usize) -> Vec<u32> {
    seeded_prompt(9, seed, vocab).repeat(3)
}

fn solo(model: &Model, prompt: &[u32], options: &GenerateOptions) -> (Vec<u32>, Option<FinishReason>) {
    let mut g = generate(model, prompt, options.clone()).unwrap();
    let tokens = g.by_ref().map(Result::unwrap).collect();
    (tokens, g.finish_reason().cloned())
}

/// Every request's tokens, finish reason and log-probability count, run together.
fn batched(
    batcher: &mut Batcher,
    requests: &[(Vec<u32>, GenerateOptions)],
) -> Vec<(Vec<u32>, Option<FinishReason>, usize)> {
    let ids: Vec<RequestId> = requests.iter().map(|(p, o)| batcher.submit(p.clone(), o.clone()).unwrap()).collect();
    let mut out: BTreeMap<RequestId, (Vec<u32>, Option<FinishReason>, usize)> = BTreeMap::new();
    while batcher.is_busy() {
        for event in batcher.step().unwrap() {
            match event {
                Event::Token { id, token } => out.entry(id).or_default().0.push(token),
                Event::Finished { id, reason } => out.entry(id).or_default().1 = Some(reason),
                Event::Logprobs { id, .. } => out.entry(id).or_default().2 += 1,
                Event::Failed { id, error } => panic!("{id:?} failed: {error}"),
                Event::Started { .. } => {}
            }
        }
    }
    ids.iter().map(|id| out.remove(id).unwrap_or_default()).collect()
}

/// Each request's batched tokens, finish reason and log-probability count (`got`, in order) are
/// those it gets alone.
fn each_as_alone(
    model: &Model,
    case: &str,
    requests: &[(Vec<u32>, GenerateOptions)],
    got: &[(Vec<u32>, Option<FinishReason>, usize)],
) {
    for (i, ((prompt, options), (tokens, reason, logprobs))) in requests.iter().zip(got).enumerate() {
        let (want, want_reason) = solo(model, prompt, options);
        let temperature = options.sampler.temperature;
        if temperature > 0.0 && tokens != &want && tokens.len() == want.len() {
            moved_across_a_boundary(model, case, prompt, &want, tokens, temperature);
            continue;
        }
        assert_eq!((tokens, reason), (&want, &want_reason), "{case}: request {i}");
        if options.logprobs.is_some() {
            assert_eq!(*logprobs, tokens.len(), "{case}: request {i}'s log-probabilities");
        }
    }
}

/// A seeded draw from a verification pass may pick the neighbour of the token it picks alone,
/// where its uniform falls within the pass's rounding of the boundary between the two
/// (docs/speculative.md: a pass of several rows sums in another order than a one-token step).
/// Checks that this, and nothing else, is what happened at the first token where `got` leaves
/// `want`: the tokens between the two (the draw walks the vocabulary in order) hold no more of
/// the weight at `temperature` than rounding the logits moves a running sum by (a draw from
/// another state would land anywhere: a tenth of the weight away, not a millionth).
fn moved_across_a_boundary(model: &Model, case: &str, prompt: &[u32], want: &[u32], got: &[u32], temperature: f32) {
    let at = want.iter().zip(got).position(|(a, b)| a != b).expect("the tokens differ");
    let history = [prompt, &want[..at]].concat();
    let logits = model.forward_last(&history, &mut model.new_cache()).unwrap().to_vec::<f32>().unwrap();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let weights: Vec<f64> = logits.iter().map(|&x| ((x as f64 - max) / temperature as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    let (lo, hi) = (want[at].min(got[at]) as usize, want[at].max(got[at]) as usize);
    let between: f64 = weights[lo + 1..hi].iter().sum::<f64>() / total;
    let (alone, batched) = (weights[want[at] as usize] / total, weights[got[at] as usize] / total);
    eprintln!(
        "{case}: a sampled draw moved at token {at}: {} alone (p {alone:.3e}), {} batched (p {batched:.3e}), \
         {between:.3e} of the weight between them",
        want[at], got[at]
    );
    assert!(
        between < 1e-5,
        "{case}: the sampled request left its solo tokens at token {at} ({} alone, {} batched) where no \
         rounding of the pass explains it: p {alone:.3e} / {batched:.3e}, {between:.3e} between them",
        want[at],
        got[at]
    );
}

#[test]
fn speculating_requests_hand_out_their_solo_tokens() {
    // Besides plain attention: sliding windows of 8 (gpt-oss, Gemma 4), which the prompts
    // outgrow, and a hybrid's recurrent layers (Qwen3.5), each of which must take wrong guesses back.
    let cases = [
        "llama-f32",
        "qwen3-q4g64",
        "mistral-q4g64",
        "gpt_oss/gpt_oss-f32",
        "gemma4/gemma4-f32",
        "qwen3_5/qwen3_5-f32",
    ];
    for case in cases {
        let (model, tokenizer) = load_dir(&fixtures().join(case)).unwrap();
        let v = model.vocab_size();
        let greedy = |n: usize| GenerateOptions { max_tokens: n, ..Default::default() };
        let sampled = GenerateOptions {
            max_tokens: 24,
            seed: Some(7),
            sampler: Sampler { temperature: 0.8, ..Default::default() },
            ..Default::default()
        };
        let with_logprobs = GenerateOptions { logprobs: Some(3), ..greedy(20) };
        // A stop string made of what the greedy answer says after a few tokens.
        let stopped_prompt = repeating(4, v);
        let (answer, _) = solo(&model, &stopped_prompt, &greedy(12));
        let stop_text = tokenizer.decode(&answer[6..8]).unwrap();
        let stopping = GenerateOptions { stop: Stop::strings(&tokenizer, [stop_text]).unwrap(), ..greedy(30) };
        let mut requests = vec![
            (repeating(1, v), greedy(32)),
            (repeating(2, v), greedy(7)),
            (seeded_prompt(20, 5, v), with_logprobs),
            (stopped_prompt, stopping),
        ];
        // Seeded sampling takes the same draws; on f32 weights the pass of several rows rounds
        // so little that the same draw picks the same token, except where the draw lies within
        // that rounding of a boundary between two tokens (`moved_across_a_boundary`: gpt-oss
        // on an AVX2 processor). 4-bit weights take another kernel for several rows, whose
        // rounding moves draws more often, as plain batching can.
        if case.ends_with("f32") {
            requests.push((repeating(3, v), sampled));
        }
        // Every step of decodes guesses, whatever the guesses' record (wrong ones are the point).
        let speculation =
            BatchSpeculation { num_draft: 4, max_decodes: Some(8), min_acceptance: 0.0, ..Default::default() };
        let options = BatcherOptions { blocks: Some(256), speculation: Some(speculation), ..Default::default() };
        let mut batcher = Batcher::new(&model, options).unwrap();
        each_as_alone(&model, case, &requests, &batched(&mut batcher, &requests));
        // Random weights seldom repeat themselves: guesses are fed and mostly wrong, so what
        // this checks is that wrong guesses leave no trace (the right ones: the next test).
        let stats = batcher.stats();
        assert!(stats.drafted_tokens > 0, "{case}: nothing guessed: {stats:?}");
        assert!(stats.accepted_tokens <= stats.drafted_tokens, "{stats:?}");
        assert_eq!(stats.blocks_used, 0, "{case}: every block back");
        eprintln!("{case}: {} guessed, {} right", stats.drafted_tokens, stats.accepted_tokens);
    }
}

#[test]
fn right_guesses_are_kept_on_a_real_model() {
    // SmolLM2 asked to copy and edit: its answers repeat the prompt and themselves, so many
    // guesses are right.
    let (model, tokenizer) = nuvec_lm::load(default_gguf().to_str().unwrap()).unwrap();
    let template = tokenizer.chat_template().expect("the GGUF carries a chat template");
    let ask = |text: &str| {
        let rendered = template.render(&[Message::new("user", text)], true, &Default::default()).unwrap();
        tokenizer.encode(&rendered, false).unwrap()
    };
    let greedy = GenerateOptions {
        max_tokens: 60,
        extra_eos_token_ids: tokenizer.eos_token_ids().to_vec(),
        ..Default::default()
    };
    let requests = vec![
        (ask("Rewrite this code with the variable x renamed to y: def f(x): return x * x + x"), greedy.clone()),
        (ask("Copy this sentence twice: the quick brown fox jumps over the lazy dog."), greedy.clone()),
        (ask("What is the capital of France?"), greedy),
    ];
    let speculation = BatchSpeculation { num_draft: 4, ..Default::default() };
    let options = BatcherOptions { blocks: Some(256), speculation: Some(speculation), ..Default::default() };
    let mut batcher = Batcher::new(&model, options).unwrap();
    let got = batched(&mut batcher, &requests);
    for (i, ((prompt, options), (tokens, reason, _))) in requests.iter().zip(&got).enumerate() {
        let (want, want_reason) = solo(&model, prompt, options);
        assert_eq!((tokens, reason), (&want, &want_reason), "request {i}: {:?}", tokenizer.decode(&want));
    }
    let stats = batcher.stats();
    assert!(stats.accepted_tokens >= 10, "too few guesses right: {stats:?}");
    eprintln!(
        "SmolLM2: {} guessed, {} right, {} tokens",
        stats.drafted_tokens, stats.accepted_tokens, stats.generated_tokens
    );
}

#[test]
fn speculation_is_refused_where_guesses_cannot_be_taken_back() {
    let on = BatcherOptions { blocks: Some(64), speculation: Some(BatchSpeculation::default()), ..Default::default() };
    let invariant = BatcherOptions { batch_invariant: true, ..on.clone() };
    assert!(invariant.validate().unwrap_err().to_string().contains("batch_invariant"));
    let quantized = BatcherOptions { kv_bits: Some(8), ..on.clone() };
    assert!(quantized.validate().unwrap_err().to_string().contains("kv_bits"));
    let none = BatcherOptions { speculation: Some(BatchSpeculation { num_draft: 0, ..Default::default() }), ..on };
    assert!(none.validate().unwrap_err().to_string().contains("num_draft"));
}

/// A draft model's guesses (`Batcher::with_draft`): the draft guesses for every decoding request
/// at once, its cache following each request (wrong guesses taken back from it too), and every
/// request hands out its solo tokens. The model as its own draft guesses the greedy requests'
/// tokens right and the sampled one's mostly wrong; the 4-bit copy of these tiny random models
/// (one quantization group per row) seldom agrees with it; the hybrid's draft rewinds its
/// recurrent layers. Also what a draft must share with the model.
#[test]
fn a_draft_models_guesses_leave_the_solo_tokens() {
    let pairs =
        [("llama-f32", "llama-f32"), ("llama-f32", "llama-q4g64"), ("qwen3_5/qwen3_5-f32", "qwen3_5/qwen3_5-f32")];
    for (case, draft_case) in pairs {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let (draft, _) = load_dir(&fixtures().join(draft_case)).unwrap();
        let v = model.vocab_size();
        let greedy = |n: usize| GenerateOptions { max_tokens: n, ..Default::default() };
        let sampled = GenerateOptions {
            max_tokens: 24,
            seed: Some(9),
            sampler: Sampler { temperature: 0.2, ..Default::default() },
            ..Default::default()
        };
        let requests = vec![
            (seeded_prompt(30, 1, v), greedy(40)),
            (seeded_prompt(12, 2, v), greedy(9)),
            (seeded_prompt(20, 3, v), sampled),
            (seeded_prompt(7, 4, v), GenerateOptions { logprobs: Some(2), ..greedy(20) }),
            // Longer than a step's budget: its draft catches up over several steps.
            (seeded_prompt(150, 5, v), greedy(30)),
        ];
        let speculation =
            BatchSpeculation { num_draft: 3, max_decodes: Some(8), min_acceptance: 0.0, ..Default::default() };
        let options = BatcherOptions {
            blocks: Some(256),
            token_budget: Some(64),
            speculation: Some(speculation),
            ..Default::default()
        };
        let mut batcher = Batcher::with_draft(&model, &draft, options).unwrap();
        each_as_alone(&model, case, &requests, &batched(&mut batcher, &requests));
        let stats = batcher.stats();
        eprintln!("{case} with {draft_case}: {} guessed, {} right", stats.drafted_tokens, stats.accepted_tokens);
        assert!(stats.drafted_tokens > 20, "{case}: {stats:?}");
        assert!(stats.accepted_tokens < stats.drafted_tokens, "{case}: the sampled request rejects some: {stats:?}");
        if case == draft_case {
            // Its own picks, which the sampled request (at a low temperature) rejects now and
            // then: where the draft's cache did not follow, the guesses after would go wrong.
            assert!(4 * stats.accepted_tokens >= 3 * stats.drafted_tokens, "{case}: its own picks: {stats:?}");
        }
        assert_eq!(stats.blocks_used, 0, "{case}: every block back");
    }
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let (other, _) = load_dir(&fixtures().join("qwen3-f32")).unwrap();
    let on = BatcherOptions { blocks: Some(64), speculation: Some(BatchSpeculation::default()), ..Default::default() };
    let err = Batcher::with_draft(&model, &other, on.clone()).err().unwrap().to_string();
    assert!(err.contains("vocabulary"), "{err}");
    let err =
        Batcher::with_draft(&model, &model, BatcherOptions { speculation: None, ..on }).err().unwrap().to_string();
    assert!(err.contains("speculation"), "{err}");
}
