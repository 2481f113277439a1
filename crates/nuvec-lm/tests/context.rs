//! The context limit: a prompt past the model's context (`max_position_embeddings`) is refused
//! with both numbers, a generation that fills it ends with `FinishReason::ContextLength` and,
//! until then, yields exactly the tokens of a run without the limit.

mod common;

use common::fixtures;
use nuvec_lm::cache::CacheOptions;
use nuvec_lm::{generate, load_dir, FinishReason, GenerateOptions};

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, ignore_eos: true, seed: Some(0), ..Default::default() }
}

fn err(model: &nuvec_lm::Model, prompt: &[u32], options: GenerateOptions) -> String {
    match generate(model, prompt, options) {
        Ok(_) => panic!("generation started; it should have been refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn prompts_past_the_models_context_are_refused_naming_both_numbers() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    assert_eq!(model.context_length(), Some(4096), "config.json's max_position_embeddings");
    let prompt: Vec<u32> = (0..4096).map(|i| 3 + i % 50).collect();
    let e = err(&model, &prompt, greedy(4));
    for part in ["4096 tokens", "4096 positions", "max_position_embeddings", "max_kv_size", "allow_past_context"] {
        assert!(e.contains(part), "{e:?} does not mention {part:?}");
    }
    // The documented ways past it start (nothing runs until the first token is asked for).
    generate(&model, &prompt, GenerateOptions { allow_past_context: true, ..greedy(4) }).unwrap();
    let rotating = CacheOptions { max_kv_size: Some(256), ..Default::default() };
    generate(&model, &prompt, GenerateOptions { cache: rotating, ..greedy(4) }).unwrap();
    // A smaller limit of one's own, and one above the model's.
    let e = err(&model, &prompt[..40], GenerateOptions { context_length: Some(40), ..greedy(4) });
    assert!(e.contains("40 tokens") && e.contains("context_length (--ctx-size)"), "{e}");
    let e = err(&model, &prompt[..4], GenerateOptions { context_length: Some(5000), ..greedy(4) });
    assert!(e.contains("5000") && e.contains("4096"), "{e}");
    generate(
        &model,
        &prompt[..4],
        GenerateOptions { context_length: Some(5000), allow_past_context: true, ..greedy(4) },
    )
    .unwrap();
}

#[test]
fn a_generation_that_fills_the_context_ends_there_with_the_unlimited_tokens() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let prompt: Vec<u32> = vec![5, 17, 29, 41, 53, 65];
    let free: Vec<u32> = generate(&model, &prompt, greedy(10)).unwrap().map(|t| t.unwrap()).collect();
    assert_eq!(free.len(), 10);
    let mut limited = generate(&model, &prompt, GenerateOptions { context_length: Some(10), ..greedy(10) }).unwrap();
    let tokens: Vec<u32> = limited.by_ref().map(|t| t.unwrap()).collect();
    assert_eq!(tokens, free[..4], "prompt 6 + 4 generated fill a context of 10");
    assert_eq!(limited.finish_reason(), Some(&FinishReason::ContextLength(10)));
}

#[test]
fn min_tokens_above_max_tokens_is_refused() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let e = err(&model, &[5, 6], GenerateOptions { min_tokens: 8, ..greedy(4) });
    assert!(e.contains("min_tokens = 8") && e.contains("max_tokens = 4"), "{e}");
}
