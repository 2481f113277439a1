//! Whole models on the GPU against the same models on the CPU (feature `cuda`; run on a machine
//! with an NVIDIA GPU, see docs/cuda.md).
//!
//! Each case loads one fixture checkpoint twice (`Device::Cpu` and `Device::Cuda(0)`), then
//! - teacher-forced: the GPU is fed the CPU's greedy tokens, and every logit of every position
//!   (the whole prompt, then each generated step) must be within 2e-3 of the CPU's (the CPU
//!   parity suite's tolerance against mlx-lm, logits of magnitude ~10);
//! - free-running: the GPU generates greedily on its own and must produce the CPU's tokens,
//!   except after a step where the CPU's top-2 margin is under twice the tolerance (a near tie
//!   either side may break).
//!
//! Fixtures: `$NUVEC_GPU_FIXTURES` (a folder of case directories holding at least config.json
//! and the safetensors, or a GGUF as model.gguf; oracle.json when present gives the prompt),
//! else `$NUVEC_FIXTURES`.
//! Missing fixtures or no usable GPU fail the test: a parity test that skips proves nothing.
//!
//! The tolerance is f32's, so the prefill products run in f32 (`set_matmul_precision(F32)`;
//! the default, `Auto`, computes bf16 checkpoints in bf16: tests/gpu_parity_bf16.rs). Caches are
//! f32 on both devices unless a case asks for f16 or bf16 (on both): then a key or value whose
//! f32 inputs differ by rounding between the devices may round to the neighbouring half, and the
//! tolerance becomes the larger of 2e-3 and a quarter of what rounding the cache changes (the
//! CPU's logits with that cache against its logits with an f32 cache, teacher-forced alike).
#![cfg(feature = "cuda")]

use nuvec::Device;
use nuvec_lm::cache::{CacheOptions, KvDtype};
use nuvec_lm::gguf::load_gguf_on;
use nuvec_lm::{load_model_on, Model};

mod common;
use common::gpu_cases::{argmax, case_dir, margin, prompt};

const TOLERANCE: f32 = 2e-3;
const STEPS: usize = 32;

/// The oracle's prompt when the case has one, else `n` fixed pseudo-random ids below `vocab`.
fn prompt_of(case: &str, vocab: usize, n: usize) -> Vec<u32> {
    let oracle = case_dir(case).join("oracle.json");
    if n == 0 {
        if let Ok(text) = std::fs::read_to_string(&oracle) {
            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
            return json["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        }
    }
    prompt(vocab, n.max(8))
}

/// Logit rows of every prompt position (prefilled in chunks of `chunk`) and of each of `steps`
/// generated positions, with the tokens generated: greedy, or `forced` when given.
fn run(
    model: &Model,
    options: &CacheOptions,
    prompt: &[u32],
    chunk: usize,
    steps: usize,
    forced: Option<&[u32]>,
) -> (Vec<Vec<f32>>, Vec<u32>) {
    let vocab = model.vocab_size();
    let mut cache = model.make_cache(options).unwrap();
    let mut rows = vec![];
    for part in prompt.chunks(chunk) {
        let logits = model.forward(part, &mut cache).unwrap();
        assert_eq!(logits.device(), model.device(), "logits on the model's device");
        rows.extend(logits.to_vec::<f32>().unwrap().chunks(vocab).map(<[f32]>::to_vec));
    }
    let mut tokens = vec![];
    for step in 0..steps {
        let next = match forced {
            Some(f) => f[step],
            None => argmax(rows.last().unwrap()),
        };
        tokens.push(next);
        if step + 1 < steps {
            let logits = model.forward_last(&[next], &mut cache).unwrap();
            rows.push(logits.to_vec::<f32>().unwrap());
        }
    }
    (rows, tokens)
}

fn check(case: &str, options: CacheOptions, prompt_len: usize, chunk: usize) {
    // Every test of this binary compares at f32 rounding (process-wide, the same for all).
    nuvec::backends::cuda::set_matmul_precision(nuvec::backends::cuda::MatmulPrecision::F32);
    let dir = case_dir(case);
    // A GGUF case holds its file as model.gguf.
    let load = |device| match dir.join("model.gguf") {
        gguf if gguf.exists() => load_gguf_on(&gguf, device).map(|(model, _)| model),
        _ => load_model_on(&dir, device),
    };
    let cpu = load(Device::Cpu).unwrap();
    let gpu = load(Device::Cuda(0)).unwrap_or_else(|e| panic!("{case}: loading on cuda:0: {e}"));
    assert_eq!(gpu.device(), Device::Cuda(0));
    // The same cache type on both: f32 unless the case asks for another (the default for a bf16
    // checkpoint is bf16, as mlx-lm's; f32 keeps the comparison at f32 rounding).
    let options = CacheOptions { kv_dtype: Some(options.kv_dtype.unwrap_or(KvDtype::F32)), ..options };
    let prompt = prompt_of(case, cpu.vocab_size(), prompt_len);
    let (cpu_rows, cpu_tokens) = run(&cpu, &options, &prompt, chunk, STEPS, None);
    // Teacher-forced on the CPU's tokens.
    let (gpu_rows, _) = run(&gpu, &options, &prompt, chunk, STEPS, Some(&cpu_tokens));
    assert_eq!(cpu_rows.len(), gpu_rows.len());
    let tolerance = if options.kv_dtype == Some(KvDtype::F32) {
        TOLERANCE
    } else {
        let wide = CacheOptions { kv_dtype: Some(KvDtype::F32), ..options.clone() };
        let (f32_rows, _) = run(&cpu, &wide, &prompt, chunk, STEPS, Some(&cpu_tokens));
        let rounding = widest(&cpu_rows, &f32_rows);
        println!("{case}: rounding the cache to {:?} moves the CPU's logits by up to {rounding:.2e}", options.kv_dtype);
        TOLERANCE.max(rounding / 4.0)
    };
    let (mut max_diff, mut sum, mut count, mut max_logit) = (0f32, 0f64, 0usize, 0f32);
    for (position, (c, g)) in cpu_rows.iter().zip(&gpu_rows).enumerate() {
        for (i, (a, b)) in c.iter().zip(g).enumerate() {
            let d = (a - b).abs();
            assert!(
                d <= tolerance,
                "{case}: position {position}, logit {i}: cpu {a} vs gpu {b} (difference {d} > {tolerance})"
            );
            max_diff = max_diff.max(d);
            max_logit = max_logit.max(a.abs());
            sum += d as f64;
            count += 1;
        }
    }
    // Free-running on the GPU.
    let (_, gpu_tokens) = run(&gpu, &options, &prompt, chunk, STEPS, None);
    let step_row = |s: usize| &cpu_rows[prompt.len() - 1 + s];
    let diverged = cpu_tokens.iter().zip(&gpu_tokens).position(|(a, b)| a != b);
    let free = match diverged {
        None => format!("all {STEPS} greedy tokens equal"),
        Some(s) => {
            let m = margin(step_row(s));
            assert!(
                m <= 2.0 * tolerance,
                "{case}: greedy tokens differ at step {s} (cpu {} vs gpu {}) where the cpu's margin is {m}\n cpu {:?}\n gpu {:?}",
                cpu_tokens[s],
                gpu_tokens[s],
                cpu_tokens,
                gpu_tokens
            );
            format!("greedy tokens equal up to step {s}, a near tie (margin {m:.1e})")
        }
    };
    println!(
        "RESULT {case} kv={:?} prompt={} chunk={chunk}: {} positions x {} logits, max |logit| {max_logit:.2}, \
         max diff {max_diff:.2e}, mean {:.2e}; {free}",
        options.max_kv_size,
        prompt.len(),
        cpu_rows.len(),
        cpu.vocab_size(),
        sum / count as f64
    );
}

/// The largest difference between two runs' logits.
fn widest(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0.0, f32::max)
}

#[test]
fn f32_model() {
    check("mistral-f32", CacheOptions::default(), 0, 2048);
}

#[test]
fn q4_model() {
    check("mistral-q4g64", CacheOptions::default(), 0, 2048);
}

#[test]
fn q8_model() {
    check("mistral-q8g32", CacheOptions::default(), 0, 2048);
}

#[test]
fn bf16_model() {
    check("mistral-bf16", CacheOptions::default(), 0, 2048);
}

// Caches of f16 and bf16 on both devices (the GPU's kernels write them rounded and widen each
// value as they read it; the CPU's do the same): a value whose f32 inputs differ by rounding may
// round to the neighbouring half, well within the tolerance.

#[test]
fn bf16_model_bf16_cache() {
    check("mistral-bf16", half(KvDtype::Bf16), 0, 2048);
}

#[test]
fn f16_cache_chunked_prefill() {
    // Attention over 64 queries or more reads the half cache widened to f32 (SGEMM at F32).
    check("mistral-q4g64", half(KvDtype::F16), 300, 128);
}

#[test]
fn bf16_rotating_cache_chunked_prompt() {
    // The rotating cache converts each chunk's rows to its type on the device.
    check("mistral-q4g64", CacheOptions { max_kv_size: Some(16), ..half(KvDtype::Bf16) }, 40, 7);
}

#[test]
fn gpt_oss_bf16_cache() {
    check("gpt_oss/gpt_oss-q4g64", half(KvDtype::Bf16), 0, 2048);
}

#[test]
fn gemma4_bf16_cache() {
    check("gemma4/gemma4-q4g64", half(KvDtype::Bf16), 0, 2048);
}

fn half(kv: KvDtype) -> CacheOptions {
    CacheOptions { kv_dtype: Some(kv), ..Default::default() }
}

#[test]
fn qwen3_moe_q4_model() {
    check("qwen3_moe-q4g64", CacheOptions::default(), 0, 2048);
}

#[test]
fn longer_prompt_chunked_prefill() {
    // 300 positions: prefill past the GEMV/GEMM switch, and a plain cache that grows past its
    // first 256-position block.
    check("mistral-q4g64", CacheOptions::default(), 300, 128);
}

#[test]
fn rotating_cache_whole_prompt() {
    // A 40-token prompt into a 16-position ring: the windowed prefill mask, then decode across
    // the wrap.
    check("mistral-q4g64", CacheOptions { max_kv_size: Some(16), ..Default::default() }, 40, 2048);
}

#[test]
fn rotating_cache_chunked_prompt() {
    check("mistral-f32", CacheOptions { max_kv_size: Some(16), ..Default::default() }, 40, 7);
}

#[test]
fn rotating_cache_moe() {
    check("qwen3_moe-q4g64", CacheOptions { max_kv_size: Some(16), ..Default::default() }, 35, 2048);
}

#[test]
fn gemma4_q4_model() {
    // Sliding-window layers (its own rotating caches) across the window, KV-shared layers,
    // per-layer inputs, GELU MLPs and logit soft-capping on the device.
    check("gemma4/gemma4-q4g64", CacheOptions::default(), 0, 2048);
}

#[test]
fn gemma4_moe_q4_model() {
    check("gemma4/gemma4_moe-q4g64", CacheOptions::default(), 0, 2048);
}

// Qwen3.5 hybrids: Gated DeltaNet layers (causal convolution, gated delta rule, their recurrent
// caches on the device) and gated full attention (sigmoid_mul).

#[test]
fn qwen3_5_q4_model() {
    check("qwen3_5/qwen3_5-q4g64", CacheOptions::default(), 0, 2048);
}

#[test]
fn qwen3_5_chunked_prompt() {
    // 300 positions in chunks of 128: the recurrent state and convolution inputs carried across
    // chunks, the full-attention layers on the SGEMM path, then decode from the carried state.
    check("qwen3_5/qwen3_5-q4g64", CacheOptions::default(), 300, 128);
}

#[test]
fn qwen3_5_small_chunks() {
    // 40 positions in chunks of 7 (fewer than the convolution's state rows at the start).
    check("qwen3_5/qwen3_5-q4g64", CacheOptions::default(), 40, 7);
}

#[test]
fn qwen3_5_moe_bf16_model() {
    // Routed experts (softmax then top k) plus the gated shared expert; a bf16 copy of the
    // qwen3_5_moe-f32 fixture (scripts/bf16-checkpoint.py: the f32 one is over the GPU machine's
    // 64 MiB transfer limit).
    check("qwen3_5/qwen3_5_moe-bf16", CacheOptions::default(), 0, 2048);
}

// gpt-oss: attention sinks on every attention path, sliding-window layers over rotating caches,
// top-k-then-softmax routing to experts with biases and the clamped SwiGLU.

#[test]
fn gpt_oss_q4_model() {
    check("gpt_oss/gpt_oss-q4g64", CacheOptions::default(), 0, 2048);
}

#[test]
fn gpt_oss_chunked_prompt() {
    // 300 positions in chunks of 128: full layers through SGEMM + softmax with sinks, sliding
    // layers (window 8) attending each query over its window.
    check("gpt_oss/gpt_oss-q4g64", CacheOptions::default(), 300, 128);
}

#[test]
fn gguf_gpt_oss_model() {
    // llama.cpp's gpt-oss GGUF: MXFP4 experts (one row: the integer expert kernels), Q8_0 and F32
    // elsewhere.
    check("gguf-gptoss", CacheOptions::default(), 0, 2048);
}

#[test]
fn gguf_qwen3_moe_model() {
    // llama.cpp's qwen3moe GGUF: Q4_0, Q8_0 and Q4_1 experts, an F32 router (one row: the
    // router's product and its top-k in one launch).
    check("gguf-qwen3moe", CacheOptions::default(), 0, 2048);
}

#[test]
fn gpt_oss_bf16_model() {
    // A bf16 copy of the gpt_oss-f32 fixture (scripts/bf16-checkpoint.py), dense experts.
    check("gpt_oss/gpt_oss-bf16", CacheOptions::default(), 0, 2048);
}

// The floating-point quant modes (mxfp4, mxfp8, nvfp4; nvfp4's global scale on MoE experts) and
// per-layer mixes of modes: their linear and embedding kernels (kernels/fp_linear.cu) in whole
// models.

#[test]
fn mxfp4_model() {
    check("fp_quant/qwen3-mxfp4", CacheOptions::default(), 0, 2048);
}

#[test]
fn mxfp8_model() {
    check("fp_quant/qwen3-mxfp8", CacheOptions::default(), 0, 2048);
}

#[test]
fn nvfp4_model() {
    check("fp_quant/qwen3-nvfp4", CacheOptions::default(), 0, 2048);
}

#[test]
fn nvfp4_global_scale_moe() {
    check("fp_quant/qwen3_moe-nvfp4-global", CacheOptions::default(), 0, 2048);
}

#[test]
fn per_layer_fp_modes() {
    check("fp_quant/qwen3-fpmixed", CacheOptions::default(), 0, 2048);
}

#[test]
fn per_layer_affine_widths() {
    // mlx-lm's mixed recipe: layers at different affine widths and group sizes in one model.
    check("qwen3-mixed", CacheOptions::default(), 0, 2048);
}

// ---- decode: greedy generation takes its token on the device ----

/// `generate` with the greedy sampler and nothing else needing the logits takes each token with
/// `argmax_gap` on the GPU (only the index and two numbers come back); asking for
/// log-probabilities makes every step read the whole row and run the host path instead. On the
/// same device the two must give the same tokens (the device path defers to the host path at
/// near ties), and the free-running tokens must be the CPU's as in `check`.
fn greedy_on_device(case: &str) {
    // Compared with the CPU at f32 tolerance, as `check`.
    nuvec::backends::cuda::set_matmul_precision(nuvec::backends::cuda::MatmulPrecision::F32);
    let dir = case_dir(case);
    let gpu = load_model_on(&dir, Device::Cuda(0)).unwrap_or_else(|e| panic!("{case}: loading on cuda:0: {e}"));
    let cpu = load_model_on(&dir, Device::Cpu).unwrap();
    let cache = CacheOptions { kv_dtype: Some(nuvec_lm::cache::KvDtype::F32), ..Default::default() };
    let options = |logprobs: Option<usize>| nuvec_lm::GenerateOptions {
        max_tokens: STEPS,
        ignore_eos: true,
        logprobs,
        cache: cache.clone(),
        ..Default::default()
    };
    let prompt = prompt_of(case, gpu.vocab_size(), 0);
    let tokens = |model: &Model, logprobs: Option<usize>| -> Vec<u32> {
        let mut g = nuvec_lm::generate(model, &prompt, options(logprobs)).unwrap();
        let tokens: Vec<u32> = g.by_ref().map(|t| t.unwrap()).collect();
        let last = g.last_logits().expect("a step ran");
        assert_eq!(last.len(), model.vocab_size(), "{case}: last_logits() copies the last row");
        tokens
    };
    let device_path = tokens(&gpu, None);
    let host_path = tokens(&gpu, Some(1));
    assert_eq!(device_path.len(), STEPS, "{case}");
    assert_eq!(device_path, host_path, "{case}: greedy on the device vs the host path, same GPU logits");
    let cpu_tokens = tokens(&cpu, None);
    let agree = cpu_tokens.iter().zip(&device_path).take_while(|(a, b)| a == b).count();
    println!("RESULT {case} generate greedy: device path = host path ({STEPS} tokens); {agree} equal to the cpu's");
    if agree < STEPS {
        // As in `check`: only a near tie on the CPU may break the agreement.
        let (rows, _) = run(&cpu, &cache, &prompt, 2048, STEPS, Some(&cpu_tokens));
        let m = margin(&rows[prompt.len() - 1 + agree]);
        assert!(m <= 2.0 * TOLERANCE, "{case}: tokens differ from the cpu's at step {agree} (margin {m})");
    }
}

#[test]
fn greedy_generation_on_device_q4() {
    greedy_on_device("mistral-q4g64");
}

#[test]
fn greedy_generation_on_device_qwen3_moe() {
    greedy_on_device("qwen3_moe-q4g64");
}

/// Qwen3.5's multi-token-prediction head on the GPU, from a GGUF that keeps it (the
/// `gguf-qwen35-mtp` fixture, small enough to carry): the head's logits over the prompt's
/// positions (fed the target's hidden states) within the tolerance of the CPU's, and
/// speculation with it gives the GPU's own greedy answer.
#[test]
fn qwen35_mtp_head() {
    use nuvec_lm::speculative::{speculative_generate, MtpHead};
    use nuvec_lm::{GenerateOptions, LoadOptions};
    nuvec::backends::cuda::set_matmul_precision(nuvec::backends::cuda::MatmulPrecision::F32);
    let root = std::env::var_os("NUVEC_GPU_FIXTURES").or_else(|| std::env::var_os("NUVEC_FIXTURES")).unwrap();
    let dir = std::path::PathBuf::from(root).join("gguf-qwen35-mtp");
    let load = |device| {
        let options = LoadOptions { device, mtp: true, ..Default::default() };
        nuvec_lm::load_with(dir.join("model.gguf").to_str().unwrap(), &options).unwrap().0
    };
    let (cpu, gpu) = (load(Device::Cpu), load(Device::Cuda(0)));
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
    let prompt: Vec<u32> =
        oracle["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let head_rows = |model: &Model| -> Vec<Vec<f32>> {
        let mut cache = model.new_cache();
        let hidden = model.prefill_hidden(&prompt[..prompt.len() - 1], &mut cache).unwrap();
        let mut mtp = model.new_mtp_cache().unwrap();
        let out = model.mtp_hidden(&prompt[1..], &hidden, &mut mtp).unwrap();
        let logits = model.logits(&out).unwrap().to_vec::<f32>().unwrap();
        logits.chunks(model.vocab_size()).map(<[f32]>::to_vec).collect()
    };
    let (c, g) = (head_rows(&cpu), head_rows(&gpu));
    let diff = widest(&c, &g);
    assert!(diff <= TOLERANCE, "the head's logits differ by {diff} between the devices");
    let options = GenerateOptions { max_tokens: STEPS, ..Default::default() };
    let plain = nuvec_lm::generate(&gpu, &prompt, options.clone()).unwrap().collect::<nuvec_lm::Result<Vec<u32>>>();
    let mut spec = speculative_generate(&gpu, &prompt, options, MtpHead::new(&gpu).unwrap(), 3).unwrap();
    let tokens = spec.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
    assert_eq!(tokens, plain.unwrap(), "speculation with the head on the GPU");
    println!("RESULT qwen35 mtp head: logits within {diff:.2e} of the CPU's; {:?}", spec.stats());
}
