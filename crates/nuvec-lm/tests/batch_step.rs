//! The batch-first step: several sequences, each at its own length and with its own new tokens
//! (prefill chunks of different lengths and single decode tokens), in one forward pass. Each
//! sequence must get the greedy tokens it gets decoding alone, and logits within rounding of
//! them, for every family (plain, rotating and KV-shared caches, MoE, recurrent layers).

mod common;

use common::{fixtures, rows_of as rows, seeded_prompt as prompt};
use nuvec_lm::cache::LayerCache;
use nuvec_lm::sample::argmax;
use nuvec_lm::{Model, StepBatch};

/// Most a batched logit may differ from the same sequence's logit alone: the row-batched
/// products sum in another order than a single row's (at most 7e-5 measured on these models).
const TOLERANCE: f32 = 1e-3;

/// Greedy tokens and each step's logits decoding `prompt` alone (the batch-of-one path).
fn alone(model: &Model, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut cache = model.new_cache();
    let mut logits = rows(&model.forward_last(prompt, &mut cache).unwrap()).remove(0);
    let (mut tokens, mut all) = (vec![], vec![]);
    for _ in 0..steps {
        let t = argmax(&logits);
        tokens.push(t);
        all.push(logits);
        logits = rows(&model.forward_last(&[t], &mut cache).unwrap()).remove(0);
    }
    (tokens, all)
}

/// The same sequences decoded together: one step prefilling every prompt, then steps of one
/// token per sequence.
fn together(model: &Model, prompts: &[Vec<u32>], steps: usize) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    together_with(model, prompts, steps, false)
}

/// [`together`], batch-invariant or not.
fn together_with(model: &Model, prompts: &[Vec<u32>], steps: usize, invariant: bool) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut caches: Vec<Vec<LayerCache>> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![(vec![], vec![]); prompts.len()];
    let mut next: Vec<Vec<u32>> = prompts.to_vec();
    for _ in 0..steps {
        let mut step = StepBatch::new();
        step.set_batch_invariant(invariant);
        for (tokens, cache) in next.iter().zip(caches.iter_mut()) {
            step.push(tokens, cache).unwrap();
        }
        let logits = rows(&model.step(&mut step).unwrap());
        assert_eq!(logits.len(), prompts.len());
        for (i, row) in logits.into_iter().enumerate() {
            let t = argmax(&row);
            out[i].0.push(t);
            out[i].1.push(row);
            next[i] = vec![t];
        }
    }
    out
}

fn check(case: &str, lengths: &[usize], steps: usize) {
    let (model, _) = nuvec_lm::load_dir(&fixtures().join(case)).unwrap();
    let prompts: Vec<Vec<u32>> =
        lengths.iter().enumerate().map(|(i, &n)| prompt(n, i as u32 + 1, model.vocab_size())).collect();
    let batched = together(&model, &prompts, steps);
    let mut widest = 0f32;
    for (i, p) in prompts.iter().enumerate() {
        let (tokens, logits) = alone(&model, p, steps);
        assert_eq!(batched[i].0, tokens, "{case}: sequence {i} ({} prompt tokens) decoded alone", p.len());
        for (step, (a, b)) in logits.iter().zip(&batched[i].1).enumerate() {
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst <= TOLERANCE, "{case}: sequence {i} step {step}: logits differ by {worst}");
            widest = widest.max(worst);
        }
    }
    eprintln!("{case}: lengths {lengths:?}, widest logit difference from alone {widest:e}");
}

#[test]
fn llama_family_sequences_of_mixed_lengths_decode_as_alone() {
    check("llama-f32", &[1, 17, 300, 2100], 6);
    check("llama-q4g64", &[17, 1, 300], 6);
    check("qwen3-f32", &[300, 1, 17], 6);
    check("qwen2-f32", &[17, 300], 4);
}

#[test]
fn moe_sequences_decode_as_alone() {
    check("qwen3_moe-f32", &[1, 17, 300], 6);
}

#[test]
fn hybrid_sequences_keep_their_own_recurrent_state() {
    check("qwen3_5/qwen3_5-f32", &[1, 17, 300], 6);
    check("qwen3_5/qwen3_5_moe-f32", &[17, 5], 4);
}

#[test]
fn gemma4_sliding_and_shared_layers_per_sequence() {
    // Its sliding window is 8 positions: every prompt but the first wraps it.
    check("gemma4/gemma4-f32", &[1, 17, 300], 6);
    check("gemma4/gemma4_moe-f32", &[17, 3], 4);
}

#[test]
fn gpt_oss_sinks_and_windows_per_sequence() {
    check("gpt_oss/gpt_oss-f32", &[1, 17, 300], 6);
}

#[test]
fn a_bad_step_is_refused_and_leaves_every_cache_as_it_was() {
    let (model, _) = nuvec_lm::load_dir(&fixtures().join("llama-f32")).unwrap();
    let (mut a, mut b) = (model.new_cache(), model.new_cache());
    model.forward_last(&[5, 6, 7], &mut a).unwrap();
    let vocab = model.vocab_size() as u32;
    let mut step = StepBatch::new();
    step.push(&[8], &mut a).unwrap();
    step.push(&[vocab], &mut b).unwrap();
    let err = model.step(&mut step).unwrap_err().to_string();
    assert!(err.contains(&format!("token {vocab}")) && err.contains("vocabulary"), "{err}");
    assert_eq!((a[0].offset(), b[0].offset()), (3, 0));
    // A cache of the wrong size for the model.
    let mut short = model.new_cache();
    short.truncate(1);
    let mut step = StepBatch::new();
    step.push(&[8], &mut a).unwrap();
    step.push(&[9], &mut short).unwrap();
    let err = model.step(&mut step).unwrap_err().to_string();
    assert!(err.contains("sequence 1") && err.contains("layers"), "{err}");
    assert_eq!(a.iter().map(LayerCache::offset).max(), Some(3));
    assert!(StepBatch::new().push(&[], &mut b).is_err(), "an empty chunk is refused");
    assert!(model.step(&mut StepBatch::new()).is_err(), "an empty step is refused");
}

#[test]
fn a_batch_invariant_step_is_each_sequence_alone_bit_for_bit() {
    for case in ["llama-q4g64", "qwen3_moe-f32", "qwen3_5/qwen3_5-f32"] {
        let (model, _) = nuvec_lm::load_dir(&fixtures().join(case)).unwrap();
        let prompts: Vec<Vec<u32>> =
            [1, 17, 40, 5, 9, 2].iter().map(|&n| prompt(n, n as u32, model.vocab_size())).collect();
        let batched = together_with(&model, &prompts, 4, true);
        for (i, p) in prompts.iter().enumerate() {
            assert_eq!(batched[i], alone(&model, p, 4), "{case}: sequence {i}");
        }
    }
}
