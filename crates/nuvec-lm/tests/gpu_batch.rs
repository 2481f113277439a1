//! Batched decoding on the GPU (feature `cuda`; run on a machine with an NVIDIA GPU, see
//! docs/batching.md): sequences of mixed lengths in a `PagedCache` on `Device::Cuda(0)`, advanced
//! together by `decode_batch`, must get the greedy tokens each gets decoding alone on the GPU,
//! with logits within rounding of them; a batch-invariant step must equal them bit for bit.
//! Fixtures: `$NUVEC_GPU_FIXTURES` (else `$NUVEC_FIXTURES`). No GPU fails the test.
#![cfg(feature = "cuda")]

use nuvec::Device;
use nuvec_lm::{decode_batch, load_model_on, Model, PagedCache, StepBatch};

mod common;
use common::gpu_cases::{argmax, case_dir, margin, prompt};

/// As the CPU batch tests: row-batched products (more than 8 rows take the GEMM path on the GPU)
/// sum in another order than one row's GEMV.
const TOLERANCE: f32 = 2e-3;
const STEPS: usize = 12;
const LENGTHS: [usize; 6] = [1, 17, 300, 2100, 5, 40];

fn rows(logits: &nuvec::Array) -> Vec<Vec<f32>> {
    let v = logits.to_vec::<f32>().unwrap();
    v.chunks(logits.dim(1)).map(<[f32]>::to_vec).collect()
}

fn prompts(model: &Model) -> Vec<Vec<u32>> {
    LENGTHS.iter().enumerate().map(|(i, &n)| prompt(model.vocab_size() - i, n)).collect()
}

/// Each sequence alone: the prompt but its last token prefilled, then one token at a time.
fn alone(model: &Model, p: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    if p.len() > 1 {
        model.prefill(&p[..p.len() - 1], &mut cache).unwrap();
    }
    let mut t = p[p.len() - 1];
    (0..STEPS)
        .map(|_| {
            let row = rows(&model.forward_last(&[t], &mut cache).unwrap()).remove(0);
            t = argmax(&row);
            row
        })
        .collect()
}

fn check(case: &str) {
    nuvec::backends::cuda::init(0).expect("a CUDA device");
    let model = load_model_on(&case_dir(case), Device::Cuda(0)).unwrap();
    let prompts = prompts(&model);
    let mut paged = PagedCache::new(&model, 1024, 16, LENGTHS.len()).unwrap();
    let mut ids = vec![];
    for p in &prompts {
        let id = paged.add().unwrap();
        if p.len() > 1 {
            paged.step(&model, &[(id, &p[..p.len() - 1])]).unwrap();
        }
        ids.push(id);
    }
    let mut tokens: Vec<u32> = prompts.iter().map(|p| p[p.len() - 1]).collect();
    let mut batched = vec![vec![]; prompts.len()];
    for _ in 0..STEPS {
        let logits = decode_batch(&model, &tokens, &ids, &mut paged).unwrap();
        assert_eq!(logits.device(), Device::Cuda(0));
        for (i, row) in rows(&logits).into_iter().enumerate() {
            tokens[i] = argmax(&row);
            batched[i].push(row);
        }
    }
    let mut widest = 0f32;
    for (i, p) in prompts.iter().enumerate() {
        let reference = alone(&model, p);
        for (step, (a, b)) in reference.iter().zip(&batched[i]).enumerate() {
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            widest = widest.max(worst);
            assert!(worst <= TOLERANCE, "{case}: sequence {i} step {step}: logits differ by {worst}");
            if margin(a) > 2.0 * TOLERANCE {
                assert_eq!(argmax(a), argmax(b), "{case}: sequence {i} step {step}: another token");
            }
        }
    }
    // Batch invariance: every sequence's first step, batched, equals its own batch of one.
    let mut caches: Vec<_> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut step = StepBatch::new();
    step.set_batch_invariant(true);
    for (p, c) in prompts.iter().zip(caches.iter_mut()) {
        step.push(p, c).unwrap();
    }
    let invariant = rows(&model.step(&mut step).unwrap());
    for (i, p) in prompts.iter().enumerate() {
        let mut c = model.new_cache();
        let own = rows(&model.forward_last(p, &mut c).unwrap()).remove(0);
        assert_eq!(invariant[i], own, "{case}: sequence {i}: batch-invariant step");
    }
    println!(
        "RESULT gpu_batch {case}: {} sequences x {STEPS} steps, widest logit difference {widest:e}",
        prompts.len()
    );
}

#[test]
fn dense_llama_batched_on_the_gpu() {
    check("mistral-q4g64");
}

#[test]
fn qwen3_batched_on_the_gpu() {
    check("qwen3-q4g64");
}

#[test]
fn moe_batched_on_the_gpu() {
    check("qwen3_moe-q4g64");
}
