//! The real model: SmolLM2-135M-Instruct from its GGUF (Q4_1) answers through its chat template
//! with the same tokens as mlx-lm gives on the same weights (an exact MLX conversion), with the
//! CPU's f32 products and again with int8 activations (`set_int8_activations`, where the
//! processor has AVX-512 VNNI): an approximate path, so only the real model's greedy answer is
//! held to mlx-lm's, not the logits.

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

    answer(&model, &tokenizer, &prompt, &oracle, "f32 products");
    if nuvec::backends::cpu::set_int8_activations(true) {
        answer(&model, &tokenizer, &prompt, &oracle, "int8 activations");
        nuvec::backends::cpu::set_int8_activations(false);
    } else {
        eprintln!("no AVX-512 VNNI here: int8 activations not run");
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
