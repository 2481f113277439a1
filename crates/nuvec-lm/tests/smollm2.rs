//! The real model: SmolLM2-135M-Instruct from its GGUF (Q4_1) answers through its chat template
//! with the same tokens as mlx-lm gives on the same weights (an exact MLX conversion), with the
//! CPU's f32 products and again with int8 activations (`set_int8_activations`, where the
//! processor has AVX-512 VNNI): an approximate path, so only the real model's greedy answer is
//! held to mlx-lm's, not the logits.

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
    batched(&model, &prompt, &oracle, "f32 products");
    if nuvec::backends::cpu::set_int8_activations(true) {
        answer(&model, &tokenizer, &prompt, &oracle, "int8 activations");
        batched(&model, &prompt, &oracle, "int8 activations");
        nuvec::backends::cpu::set_int8_activations(false);
    } else {
        eprintln!("no AVX-512 VNNI here: int8 activations not run");
    }
}

/// Four copies of the prompt through the Batcher: its decode steps multiply four rows at once
/// (the few-row products), and each copy still gets mlx-lm's greedy tokens.
fn batched(model: &nuvec_lm::Model, prompt: &[u32], oracle: &serde_json::Value, how: &str) {
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
        assert_eq!(tokens[&id], ids(&oracle["greedy_tokens"]), "{how}, batched: {id:?}");
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
