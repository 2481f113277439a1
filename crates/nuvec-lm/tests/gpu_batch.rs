//! Batched decoding on the GPU (feature `cuda`; run on a machine with an NVIDIA GPU, see
//! docs/batching.md): sequences of mixed lengths in a `PagedCache` on `Device::Cuda(0)`, advanced
//! together by `decode_batch` with the tokens each took decoding alone on the GPU, must get that
//! decode's logits within rounding and its greedy token wherever the top two are not within
//! rounding of each other; a batch-invariant step must equal them bit for bit. The
//! caches hold the checkpoint's type (f32 for these fixtures) or, where a test asks, f16 or bf16.
//! Fixtures: `$NUVEC_GPU_FIXTURES` (else `$NUVEC_FIXTURES`). No GPU fails the test.
#![cfg(feature = "cuda")]

use nuvec::Device;
use std::collections::HashMap;

use nuvec_lm::cache::{CacheOptions, KvDtype, LayerCache};
use nuvec_lm::{
    decode_batch, load_model_on, Batcher, BatcherOptions, Event, GenerateOptions, Model, PagedCache, RequestId,
    StepBatch,
};

mod common;
use common::gpu_cases::{argmax, case_dir, margin, prompt};
use common::paged::chunks_against_alone;

/// As the CPU batch tests: row-batched products (more than 8 rows take the GEMM path on the GPU)
/// sum in another order than one row's GEMV.
const TOLERANCE: f32 = 2e-3;
const STEPS: usize = 12;
const LENGTHS: [usize; 6] = [1, 17, 300, 2100, 5, 40];

fn rows(logits: &nuvec::Array) -> Vec<Vec<f32>> {
    let v = logits.to_vec::<f32>().unwrap();
    v.chunks(logits.dim(1)).map(<[f32]>::to_vec).collect()
}

fn prompts(model: &Model, lengths: &[usize]) -> Vec<Vec<u32>> {
    lengths.iter().enumerate().map(|(i, &n)| prompt(model.vocab_size() - i, n)).collect()
}

/// Each sequence alone: the prompt but its last token prefilled, then one token at a time, on
/// caches made with `options` (a quantized cache quantized after every pass, as `generate` does).
fn alone(model: &Model, p: &[u32], options: &CacheOptions) -> Vec<Vec<f32>> {
    let mut cache = model.make_cache(options).unwrap();
    let pass = |cache: &mut Vec<LayerCache>| cache.iter_mut().for_each(|c| c.maybe_quantize(options).unwrap());
    if p.len() > 1 {
        model.prefill(&p[..p.len() - 1], &mut cache).unwrap();
        pass(&mut cache);
    }
    let mut t = p[p.len() - 1];
    (0..STEPS)
        .map(|_| {
            let row = rows(&model.forward_last(&[t], &mut cache).unwrap()).remove(0);
            pass(&mut cache);
            t = argmax(&row);
            row
        })
        .collect()
}

/// The model of `case` on the GPU, its caches in `kv` when given.
fn model_on_gpu(case: &str, kv: Option<KvDtype>) -> Model {
    nuvec::backends::cuda::init(0).expect("a CUDA device");
    let mut model = load_model_on(&case_dir(case), Device::Cuda(0)).unwrap();
    if let Some(kv) = kv {
        model.set_kv_dtype(kv);
    }
    model
}

fn check(case: &str, kv: Option<KvDtype>) {
    check_within(case, kv, 0.0);
}

/// `check` with each step's logits allowed `TOLERANCE` plus `relative` times the row's largest
/// |logit| (products that round x and the weights to bf16 in a batch, against f32 alone).
fn check_within(case: &str, kv: Option<KvDtype>, relative: f32) {
    check_lengths(case, kv, relative, &LENGTHS);
}

/// `check_within` over prompts of `lengths`.
fn check_lengths(case: &str, kv: Option<KvDtype>, relative: f32, lengths: &[usize]) {
    let model = model_on_gpu(case, kv);
    let prompts = prompts(&model, lengths);
    let mut paged = PagedCache::new(&model, 1024, 16, lengths.len()).unwrap();
    let ids = prefilled(&model, &prompts, &mut paged);
    let widest = decodes_match_alone(case, &model, &prompts, &ids, &mut paged, relative, &CacheOptions::default());
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
        "RESULT gpu_batch {case} kv={kv:?}: {} sequences x {STEPS} steps, widest logit difference {widest:e}",
        prompts.len()
    );
}

/// Each prompt but its last token added to `paged`, prefilled alone; their sequence ids.
fn prefilled(model: &Model, prompts: &[Vec<u32>], paged: &mut PagedCache) -> Vec<nuvec_lm::SeqId> {
    let mut ids = vec![];
    for p in prompts {
        let id = paged.add().unwrap();
        if p.len() > 1 {
            paged.step(model, &[(id, &p[..p.len() - 1])]).unwrap();
        }
        ids.push(id);
    }
    ids
}

/// `STEPS` decode steps of the sequences `ids` of `paged` (each holding its prompt but the last
/// token), batched, against each prompt decoded alone: each step's logits within `TOLERANCE`
/// plus `relative` times the row's largest |logit|, and the same greedy token where the top two
/// are not within that of each other. Returns the widest logit difference.
fn decodes_match_alone(
    case: &str,
    model: &Model,
    prompts: &[Vec<u32>],
    ids: &[nuvec_lm::SeqId],
    paged: &mut PagedCache,
    relative: f32,
    options: &CacheOptions,
) -> f32 {
    // Each step is given the tokens each sequence took alone (so a near tie decided otherwise in
    // a batch does not make every later step another context).
    let references: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| alone(model, p, options)).collect();
    let forced: Vec<Vec<u32>> = (0..STEPS).map(|step| references.iter().map(|r| argmax(&r[step])).collect()).collect();
    let mut tokens: Vec<u32> = prompts.iter().map(|p| p[p.len() - 1]).collect();
    let mut batched = vec![vec![]; prompts.len()];
    for next in &forced {
        let logits = decode_batch(model, &tokens, ids, paged).unwrap();
        assert_eq!(logits.device(), Device::Cuda(0));
        for (i, row) in rows(&logits).into_iter().enumerate() {
            batched[i].push(row);
        }
        tokens.clone_from(next);
    }
    let mut widest = 0f32;
    for (i, reference) in references.iter().enumerate() {
        for (step, (a, b)) in reference.iter().zip(&batched[i]).enumerate() {
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            let tolerance = TOLERANCE + relative * a.iter().fold(0f32, |m, x| m.max(x.abs()));
            widest = widest.max(worst);
            assert!(
                worst <= tolerance,
                "{case}: sequence {i} step {step}: logits differ by {worst} (allowed {tolerance})"
            );
            if margin(a) > 2.0 * tolerance {
                assert_eq!(argmax(a), argmax(b), "{case}: sequence {i} step {step}: another token");
            }
        }
    }
    widest
}

#[test]
fn dense_llama_batched_on_the_gpu() {
    check("mistral-q4g64", None);
}

#[test]
fn qwen3_batched_on_the_gpu() {
    check("qwen3-q4g64", None);
}

/// Families whose decodes went one sequence at a time before they were attended together:
/// sliding-window layers (gpt-oss, past its 8-position window, with sinks) and Qwen3.5's gated
/// full-attention layers. (Gemma 4's: `gemma4_batched_on_the_gpu`.)
#[test]
fn windowed_and_gated_layers_batched_on_the_gpu() {
    for case in ["gpt_oss/gpt_oss-q4g64", "qwen3_5/qwen3_5-q4g64"] {
        check(case, None);
    }
    check_batcher("gpt_oss/gpt_oss-q4g64", None);
}

/// Short chunks over cached prefixes (a verification pass, a prefill's last chunk), several in
/// one step beside decodes and longer chunks, attended in place on the device (each row as a
/// decode at its position): every step's logits within rounding of the same passes alone, for
/// plain, sliding-window (with sinks) and gated layers.
#[test]
fn short_chunks_over_cached_prefixes_on_the_gpu() {
    for case in ["mistral-q4g64", "gpt_oss/gpt_oss-q4g64", "qwen3_5/qwen3_5-q4g64"] {
        let model = model_on_gpu(case, None);
        let mut paged = PagedCache::new(&model, 256, 16, 8).unwrap();
        let setup = (&[70, 45, 90][..], 20, &[3, 16, 1, 7, 17, 2, 5][..], 6);
        let widest = chunks_against_alone(&model, case, &mut paged, setup, &CacheOptions::default(), TOLERANCE);
        println!("RESULT gpu_batch {case}: short chunks over cached prefixes, widest logit difference {widest:e}");
    }
}

/// Gemma 4's sliding-window layers (a window of 8 that the prompts outgrow) and its KV-shared
/// layers, which attend an earlier layer's paged caches: decodes batched, short chunks over
/// cached prefixes, and the Batcher (pipelined, plain, batch-invariant), each against alone.
#[test]
fn gemma4_batched_on_the_gpu() {
    let case = "gemma4/gemma4-q4g64";
    check(case, None);
    let model = model_on_gpu(case, None);
    let mut paged = PagedCache::new(&model, 256, 16, 8).unwrap();
    let setup = (&[70, 45, 90][..], 20, &[3, 16, 1, 7, 17, 2, 5][..], 6);
    let widest = chunks_against_alone(&model, case, &mut paged, setup, &CacheOptions::default(), TOLERANCE);
    println!("RESULT gpu_batch {case}: short chunks over cached prefixes, widest logit difference {widest:e}");
    check_batcher(case, None);
}

#[test]
fn moe_batched_on_the_gpu() {
    check("qwen3_moe-q4g64", None);
}

/// A checkpoint whose 4-bit weights have bf16 scales and whose rows are multiples of 128 (mlx's
/// bf16 models; the fixtures above have f32 scales): its batched products run the bf16 register
/// kernels (kernels/qimma.cu `qdec_b4_r*`), their inputs written in bf16 by the norms, the paged
/// attention merge and silu(gate) * up, so x and each weight are rounded to bf16 once (2^-8
/// relative per term) where a sequence alone multiplies in f32: logits are allowed 2^-6 of the
/// row's largest. The case is `scripts/make-random-checkpoint.py
/// $NUVEC_GPU_FIXTURES/random-tiny-q4 --shape tiny` (random weights, no oracle needed: the
/// reference is each sequence alone on the GPU), made on the GPU machine.
#[test]
fn bf16_scaled_4bit_batched_on_the_gpu() {
    check_within("random-tiny-q4", None, 1.0 / 64.0);
    check_within("random-tiny-q4", Some(KvDtype::Bf16), 1.0 / 64.0);
}

/// The same at 40 sequences: products of 17 to 64 rows (`qdec_b4_r64`; on an H100 / H200 with
/// `NUVEC_QDEC_WGMMA=1` the warpgroup kernels, `qwg_b4_r64`, K in ranges, as a larger model's
/// gate/up takes them by default).
#[test]
fn bf16_scaled_4bit_wide_batch_on_the_gpu() {
    let lengths: Vec<usize> = (0..40).map(|i| [1, 17, 300, 5, 40, 2, 64, 9][i % 8] + i).collect();
    check_lengths("random-tiny-q4", None, 1.0 / 64.0, &lengths);
}

/// A Qwen3-MoE checkpoint quantized from bf16 (bf16 scales, as mlx-community's; fixture
/// `moe_bf16/qwen3_moe-bf16q4`): its batched steps run the experts as grouped tensor-core products
/// (x and the activations rounded to bf16) from two rows here instead of 8, so that this batch of
/// six takes them, against each sequence alone on the gathered f32 kernels.
#[test]
fn moe_grouped_decode_on_the_gpu() {
    nuvec::backends::cuda::set_moe_grouped_rows(Some(2));
    check_within("moe_bf16/qwen3_moe-bf16q4", None, 1.0 / 64.0);
    nuvec::backends::cuda::set_moe_grouped_rows(None);
}

/// A half-precision model over f16 caches (the type a GGUF model keeps, as llama.cpp): its
/// batched decode steps read the f16 store on the tensor cores (flash_attention.cu
/// `paged_flash_decode_f16_d64`: q times the scale and each probability rounded to f16, 2^-11
/// relative), with the bf16 batch's rounding of the products (as
/// `bf16_scaled_4bit_batched_on_the_gpu`), against each sequence alone. The case is
/// `shared_prefixes_decode_as_alone_on_the_gpu`'s (head size 64), made on the GPU machine.
#[test]
fn f16_caches_of_a_half_model_batched_on_the_gpu() {
    check_within("random-small-q4", Some(KvDtype::F16), 1.0 / 64.0);
}

/// Paged blocks of f16 and bf16 (the rope kernel writes them rounded, the paged decode kernel
/// widens them) against contiguous caches of the same type decoded alone.
#[test]
fn half_precision_caches_batched_on_the_gpu() {
    check("mistral-q4g64", Some(KvDtype::F16));
    check("qwen3-q4g64", Some(KvDtype::Bf16));
}

/// Quantized paged caches (`kv_bits`) on the GPU: new rows quantized in the device's store and
/// read back through each sequence's table there (kernels/kv_quant.cu). Each sequence decodes as
/// the model's own (unpaged) quantized cache does alone on the GPU (quantized after every pass,
/// as mlx-lm's `maybe_quantize_kv_cache`): a batch of one bit for bit, a batch of mixed lengths
/// (first passes of one token and of 2,100) within the bf16 batch's rounding
/// (`f16_caches_of_a_half_model_batched_on_the_gpu`'s case: head size 64, which groups of 64 and
/// 32 divide; the f32 fixtures' heads of 16 take no MLX group size), greedy-equal where the top
/// two are apart.
#[test]
fn quantized_paged_caches_on_the_gpu() {
    let case = "random-small-q4";
    let model = model_on_gpu(case, None);
    for (bits, group) in [(8, 64), (4, 32)] {
        let options =
            CacheOptions { kv_bits: Some(bits), kv_group_size: group, quantized_kv_start: 0, ..Default::default() };
        for lengths in [&[40][..], &LENGTHS[..]] {
            let prompts = prompts(&model, lengths);
            let mut paged = PagedCache::new_quantized(&model, 1024, 16, lengths.len(), bits, group).unwrap();
            let ids = prefilled(&model, &prompts, &mut paged);
            let relative = if lengths.len() == 1 { 0.0 } else { 1.0 / 64.0 };
            let widest = decodes_match_alone(case, &model, &prompts, &ids, &mut paged, relative, &options);
            if lengths.len() == 1 {
                assert_eq!(widest, 0.0, "{case} {bits}-bit g{group}: a batch of one is not the quantized cache's");
            }
            println!(
                "RESULT gpu_batch {case} kv_bits={bits} g{group}: {} sequences x {STEPS} steps, widest logit difference {widest:e}",
                prompts.len()
            );
        }
    }
}

/// Each request's greedy tokens alone (`generate` on the GPU) and each step's margin between
/// its two largest logits.
fn solo(model: &Model, p: &[u32], max_tokens: usize) -> (Vec<u32>, Vec<f32>) {
    let mut g = nuvec_lm::generate(model, p, GenerateOptions { max_tokens, ..Default::default() }).unwrap();
    let (mut tokens, mut margins) = (vec![], vec![]);
    while let Some(t) = g.next() {
        tokens.push(t.unwrap());
        margins.push(margin(g.last_logits().unwrap()));
    }
    (tokens, margins)
}

/// The Batcher on the GPU: requests of mixed lengths served together get the greedy tokens each
/// gets alone, up to the first step whose top two logits lie within rounding of each other
/// (where batched rounding may legitimately pick the other): batched with pipelined steps (each
/// step fed the one before's greedy picks on the device), batched without (the default), and
/// batch-invariant.
/// Steps `batcher` until it is idle: each request's tokens (a failed request fails the test).
fn tokens_to_the_end(batcher: &mut Batcher, case: &str) -> HashMap<RequestId, Vec<u32>> {
    let mut got: HashMap<RequestId, Vec<u32>> = HashMap::new();
    while batcher.is_busy() {
        for e in batcher.step().unwrap() {
            match e {
                Event::Token { id, token } => got.entry(id).or_default().push(token),
                Event::Failed { id, error } => panic!("{case}: {id:?} failed: {error}"),
                _ => {}
            }
        }
    }
    got
}

fn check_batcher(case: &str, kv: Option<KvDtype>) {
    let model = model_on_gpu(case, kv);
    let prompts = prompts(&model, &LENGTHS);
    for (invariant, pipeline) in [(false, Some(true)), (false, None), (true, None)] {
        let options = BatcherOptions { batch_invariant: invariant, pipeline, ..Default::default() };
        let mut batcher = Batcher::new(&model, options).unwrap();
        assert_eq!(batcher.pipelined(), pipeline == Some(true), "{case}");
        let ids: Vec<RequestId> = prompts
            .iter()
            .map(|p| batcher.submit(p.clone(), GenerateOptions { max_tokens: STEPS, ..Default::default() }).unwrap())
            .collect();
        let got = tokens_to_the_end(&mut batcher, case);
        let mut equal = 0;
        for (p, id) in prompts.iter().zip(&ids) {
            let (tokens, margins) = solo(&model, p, STEPS);
            let sure = margins.iter().position(|&m| m <= 2.0 * TOLERANCE).unwrap_or(tokens.len());
            let ours = &got[id];
            assert_eq!(ours[..sure.min(ours.len())], tokens[..sure], "{case}: {} prompt tokens", p.len());
            equal += usize::from(*ours == tokens);
        }
        let stats = batcher.stats();
        assert_eq!(stats.pipelined_steps > 0, batcher.pipelined(), "{case}: {stats:?}");
        println!(
            "RESULT gpu_batcher {case} kv={kv:?} invariant={invariant} pipelined={}: {equal} of {} requests equal their \
             solo run in every token ({} steps pipelined, {} fed tokens taken back)",
            batcher.pipelined(),
            prompts.len(),
            stats.pipelined_steps,
            stats.taken_back
        );
    }
}

#[test]
fn the_batcher_serves_solo_greedy_tokens_on_the_gpu() {
    check_batcher("mistral-q4g64", None);
    check_batcher("qwen3_moe-q4g64", None);
    check_batcher("mistral-q4g64", Some(KvDtype::Bf16));
}

/// Requests sampled at a temperature alone, drawn where the logits are (`sample_rows` on the
/// GPU) and drawn on the host from the logits read back: the same batch run both ways gives every
/// request the same tokens, and nearly every draw is the device's.
#[test]
fn sampled_requests_drawn_on_the_gpu_are_the_host_draws() {
    let case = "mistral-q4g64";
    let model = model_on_gpu(case, None);
    let prompts = prompts(&model, &LENGTHS);
    let run = |on: bool| {
        let options = BatcherOptions { device_sampling: Some(on), ..Default::default() };
        let mut batcher = Batcher::new(&model, options).unwrap();
        let ids: Vec<RequestId> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let sampler = nuvec_lm::Sampler { temperature: [0.7, 1.0, 1.5][i % 3], ..Default::default() };
                let options =
                    GenerateOptions { max_tokens: STEPS, sampler, seed: Some(i as u64), ..Default::default() };
                batcher.submit(p.clone(), options).unwrap()
            })
            .collect();
        let mut got = tokens_to_the_end(&mut batcher, case);
        let stats = batcher.stats().clone();
        (ids.iter().map(|id| got.remove(id).unwrap_or_default()).collect::<Vec<_>>(), stats)
    };
    let (on, on_stats) = run(true);
    let (off, off_stats) = run(false);
    let draws = (prompts.len() * STEPS) as u64;
    println!(
        "RESULT gpu_sampling {case}: {} of {} requests the same both ways; {} of {draws} draws on the device, {} again \
         on the host",
        on.iter().zip(&off).filter(|(a, b)| a == b).count(),
        prompts.len(),
        on_stats.drawn_on_device,
        on_stats.drawn_again
    );
    assert_eq!(on, off, "{case}: the device's draws are the host's");
    assert_eq!(on_stats.drawn_on_device + on_stats.drawn_again, draws);
    assert!(on_stats.drawn_on_device * 100 >= draws * 99, "{on_stats:?}");
    assert_eq!((off_stats.drawn_on_device, off_stats.drawn_again), (0, 0));
}

/// Sequences beginning with one long system prompt, the later ones starting on the first's blocks
/// (the prefix cache's hit: shared, not copied, asserted), so that their decode steps take the
/// shared-keys path (the tensor-core paged decode over bf16 blocks, flash_attention.cu
/// `paged_prefix_flash_bf16_d*`; that it runs is asserted by cuda_bf16's
/// `paged_decode_over_shared_prefixes`): each must still get the logits it gets alone, within a
/// bf16 batch's rounding (as `bf16_scaled_4bit_batched_on_the_gpu`). The case is
/// `scripts/make-random-checkpoint.py $NUVEC_GPU_FIXTURES/random-small-q4 --shape small` (a bf16
/// model of head size 64: the fixtures' head size 16 takes the f32 kernel), made on the GPU
/// machine.
#[test]
fn shared_prefixes_decode_as_alone_on_the_gpu() {
    let case = "random-small-q4";
    let model = model_on_gpu(case, None);
    let vocab = model.vocab_size();
    let system = prompt(vocab - 7, 600);
    let prompts: Vec<Vec<u32>> =
        (0..6).map(|i| [system.clone(), prompt(vocab - 20 - i, 5 + 13 * i)].concat()).collect();
    let mut paged = PagedCache::new(&model, 1024, 16, prompts.len()).unwrap();
    paged.set_prefix_caching(true).unwrap();
    let mut ids = vec![];
    for (i, p) in prompts.iter().enumerate() {
        let body = &p[..p.len() - 1];
        let (id, held) = paged.add_with_prefix(body, 512).unwrap();
        assert!(i == 0 || held >= 512, "sequence {i} starts on {held} shared positions, not the system prompt's");
        paged.step(&model, &[(id, &body[held..])]).unwrap();
        ids.push(id);
    }
    let widest = decodes_match_alone(case, &model, &prompts, &ids, &mut paged, 1.0 / 64.0, &CacheOptions::default());
    println!(
        "RESULT gpu_batch shared prefixes: {} sequences x {STEPS} steps, widest logit difference {widest:e}",
        prompts.len()
    );
}
