//! The real model: SmolLM2-135M-Instruct from its GGUF (Q4_1) answers through its chat template
//! with the same tokens as mlx-lm gives on the same weights (an exact MLX conversion).

mod common;

use common::*;
use nuvec_lm::{generate, FinishReason, GenerateOptions, Message, StreamDecoder};

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

    let options = GenerateOptions { max_tokens: 64, ..Default::default() };
    let mut generation = generate(&model, &prompt, options).unwrap();
    let mut text = StreamDecoder::default();
    let mut tokens = vec![];
    let mut out = String::new();
    for id in generation.by_ref() {
        let id = id.unwrap();
        tokens.push(id);
        out += &text.push(&tokenizer, id);
    }
    out += &text.finish();
    assert_eq!(tokens, ids(&oracle["greedy_tokens"]), "text: {out:?}");
    let ended_by_eos = oracle["ended_by_eos"].as_bool().unwrap_or(false);
    let want = if ended_by_eos { FinishReason::EndOfSequence } else { FinishReason::Length };
    assert_eq!(generation.finish_reason(), Some(&want));
    assert!(out.contains("Paris"), "{out}");
    assert_eq!(out, oracle["text"].as_str().unwrap());
}
