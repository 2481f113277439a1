//! The real model: SmolLM2-135M-Instruct from its GGUF (Q4_1) answers through its chat template
//! with the same tokens as mlx-lm gives on the same weights (an exact MLX conversion), alone and
//! as four requests in the Batcher.
//!
//! With int8 activations (`set_int8_activations`, where the processor has AVX2 or AVX-512 VNNI), an
//! approximate path: teacher-forced on mlx-lm's answer, one token at a time (so every product
//! takes the int8 kernels), each step whose top-two gap in mlx-lm is at least [`CLEAR`] keeps
//! mlx-lm's token (the answer's first step is a near-tie, 0.083, which int8 may flip); and the
//! Batcher's four copies of a question with a clear answer get what the int8 path gives one
//! request alone.

mod common;

use common::*;
use std::collections::BTreeMap;

use nuvec_lm::{
    generate, Batcher, BatcherOptions, Event, FinishReason, GenerateOptions, Message, RequestId, StreamDecoder,
};

#[test]
fn smollm2_answers_like_mlx_lm() {
    let dir = fixtures().join("smollm2-q4_1");
    let oracle = oracle_json(&dir);
    let (model, tokenizer) = nuvec_lm::load(default_gguf().to_str().unwrap()).unwrap();

    let template = tokenizer.chat_template().expect("the GGUF carries a chat template");
    let rendered =
        template.render(&[Message::new("user", "What is the capital of France?")], true, &Default::default()).unwrap();
    assert_eq!(rendered, oracle["rendered_prompt"].as_str().unwrap());
    let prompt = tokenizer.encode(&rendered, false).unwrap();
    assert_eq!(prompt, ids(&oracle["prompt_ids"]));

    answer(&model, &tokenizer, &prompt, &oracle, "f32 products");
    batched(&model, &prompt, &ids(&oracle["greedy_tokens"]), "f32 products");
    let f32_first = model.forward_last(&prompt, &mut model.new_cache()).unwrap().to_vec::<f32>().unwrap();
    if nuvec::backends::cpu::set_int8_activations(true) {
        teacher_forced(&model, &prompt, &oracle, &f32_first);
        // A question whose answer has no near-tie, alone and batched.
        let rendered = template.render(&[Message::new("user", "What is 2+2?")], true, &Default::default()).unwrap();
        let sum = tokenizer.encode(&rendered, false).unwrap();
        let options = GenerateOptions { max_tokens: 64, ..Default::default() };
        let alone = generate(&model, &sum, options).unwrap().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
        assert!(tokenizer.decode(&alone).unwrap().contains('4'), "int8 activations: 2 + 2");
        batched(&model, &sum, &alone, "int8 activations");
        nuvec::backends::cpu::set_int8_activations(false);
    } else {
        eprintln!("no AVX2 here: int8 activations not run");
    }
}

/// The smallest top-two gap (in mlx-lm's logits) at which the int8 path must keep mlx-lm's token.
const CLEAR: f64 = 0.5;

/// mlx-lm's answer fed one token at a time with int8 activations: at each step whose gap in
/// mlx-lm is at least [`CLEAR`], the argmax is mlx-lm's token (its stop token last). The first
/// step's logits differ from the f32 path's (`f32_first`: the int8 kernels ran) by less than
/// [`CLEAR`].
fn teacher_forced(model: &nuvec_lm::Model, prompt: &[u32], oracle: &serde_json::Value, f32_first: &[f32]) {
    let mut want = ids(&oracle["greedy_tokens"]);
    want.push(oracle["stop_token"].as_u64().unwrap() as u32);
    let margins: Vec<f64> = oracle["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
    assert_eq!(margins.len(), want.len(), "a margin per step of the answer and its stop");
    let mut cache = model.new_cache();
    let mut logits = model.forward_last(prompt, &mut cache).unwrap();
    let first = logits.to_vec::<f32>().unwrap();
    let widest = first.iter().zip(f32_first).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(widest > 0.0 && (widest as f64) < CLEAR, "int8 activations: first logits off the f32 ones by {widest}");
    let mut checked = 0;
    for (step, (&token, &margin)) in want.iter().zip(&margins).enumerate() {
        let row = logits.to_vec::<f32>().unwrap();
        let top = row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best });
        if margin >= CLEAR {
            assert_eq!(top as u32, token, "int8 activations, step {step} (mlx-lm's gap {margin:.3})");
            checked += 1;
        }
        logits = model.forward_last(&[token], &mut cache).unwrap();
    }
    assert!(checked >= 6, "only {checked} steps clear of a tie");
}

/// Four copies of the prompt through the Batcher: its decode steps multiply four rows at once
/// (the few-row products), and each copy gets `want` (mlx-lm's tokens, or one request's alone).
fn batched(model: &nuvec_lm::Model, prompt: &[u32], want: &[u32], how: &str) {
    let mut batcher = Batcher::new(model, BatcherOptions::default()).unwrap();
    let options = GenerateOptions { max_tokens: 64, ..Default::default() };
    let requests: Vec<RequestId> = (0..4).map(|_| batcher.submit(prompt.to_vec(), options.clone()).unwrap()).collect();
    let mut tokens: BTreeMap<RequestId, Vec<u32>> = BTreeMap::new();
    let mut most = 0;
    while batcher.is_busy() {
        let events = batcher.step().unwrap();
        let step: Vec<(RequestId, u32)> = events
            .iter()
            .filter_map(|e| if let Event::Token { id, token } = e { Some((*id, *token)) } else { None })
            .collect();
        most = most.max(step.len());
        step.into_iter().for_each(|(id, t)| tokens.entry(id).or_default().push(t));
    }
    assert_eq!(most, 4, "{how}: the four requests decoded together");
    for id in requests {
        assert_eq!(tokens[&id], want, "{how}, batched: {id:?}");
    }
}

fn answer(
    model: &nuvec_lm::Model,
    tokenizer: &nuvec_lm::Tokenizer,
    prompt: &[u32],
    oracle: &serde_json::Value,
    how: &str,
) {
    let options = GenerateOptions { max_tokens: 64, ..Default::default() };
    let mut generation = generate(model, prompt, options).unwrap();
    let mut text = StreamDecoder::default();
    let mut tokens = vec![];
    let mut out = String::new();
    for id in generation.by_ref() {
        let id = id.unwrap();
        tokens.push(id);
        out += &text.push(tokenizer, id);
    }
    out += &text.finish();
    assert_eq!(tokens, ids(&oracle["greedy_tokens"]), "{how}: text: {out:?}");
    let ended_by_eos = oracle["ended_by_eos"].as_bool().unwrap_or(false);
    let want = if ended_by_eos { FinishReason::EndOfSequence } else { FinishReason::Length };
    assert_eq!(generation.finish_reason(), Some(&want), "{how}");
    assert!(out.contains("Paris"), "{how}: {out}");
    assert_eq!(out, oracle["text"].as_str().unwrap(), "{how}");
}
