//! Whole models with the bf16 tensor-core prefill (`MatmulPrecision::Bf16`, set explicitly)
//! against the same models on the CPU in f32 (feature `cuda`; run on a machine with an NVIDIA
//! GPU, see docs/cuda.md, "Precision"); and the default, `MatmulPrecision::Auto`, which computes
//! each checkpoint in its own type as mlx-lm does: the bf16 checkpoint exactly as under `Bf16`, the
//! q4 checkpoint with f32 scales exactly as under `F32`, within the f32 tolerance of gpu_parity.rs.
//!
//! A 300-token prompt (so that the weight products take more than 8 rows and attention 64
//! queries or more: the bf16 paths), whole or in chunks of 128, then 32 greedy steps (decode is
//! f32, on caches the bf16 prefill filled). Each case:
//! - teacher-forced on the CPU's greedy tokens: the GPU's logits at every position must differ
//!   from the CPU's by no more than mlx-lm's own bf16 computation of the same weights differs
//!   from its f32 computation on the same 331 positions (largest and mean absolute logit
//!   difference, `precision_noise_long/<case>.json`, recorded by scripts/oracle/more/
//!   precision_noise_long.py). mlx-lm rounds every activation to bf16; nuvec rounds only the
//!   prefill products' inputs (both numbers printed);
//! - free-running: the GPU's greedy tokens equal the CPU's, except after a step where the CPU's
//!   top-2 margin is within twice the logit difference measured at that position (only there
//!   can the difference change the argmax).
//!
//! `gguf_kquants_prefill_auto`: a GGUF model (half precision, f32 K-quant scales) takes the bf16
//! products under `Auto`, as llama.cpp computes them, within the same bounds.
//!
//! `moe_bf16_q4_checkpoint_prefill` runs a Qwen3-MoE checkpoint quantized from bf16 (its experts'
//! prefill products grouped by expert on the tensor cores) through the same checks.
//!
//! `q4_batched_decode_forced_bf16` runs batched decode steps of 6, 12, 20 and 40 sequences under
//! `Bf16`, whose products take the few-row tensor-core kernels (`kernels/qimma.cu`,
//! `kernels/qmma.cu`), against each sequence decoded alone; `gguf_kquants_batched_decode_auto`
//! runs 12 and 20 sequences of the GGUF model under `Auto` the same way.
//!
//! Fixtures: `$NUVEC_GPU_FIXTURES`, else `$NUVEC_FIXTURES` (config.json and the safetensors of
//! each case, and `precision_noise_long/`). Missing fixtures or no usable GPU fail the test.
//! The precision is process-wide, so the tests of this binary take turns (`MODE`).
#![cfg(feature = "cuda")]

use std::sync::{Mutex, MutexGuard};

use nuvec::backends::cuda::{set_matmul_precision, MatmulPrecision};
use nuvec::Device;
use nuvec_lm::cache::{CacheOptions, KvDtype};
use nuvec_lm::gguf::load_gguf_on;
use nuvec_lm::{load_model_on, Model};

mod common;
use common::gpu_cases::{argmax, case_dir, margin, prompt};

const STEPS: usize = 32;
const PROMPT: usize = 300;
/// gpu_parity.rs's f32 tolerance on logits (the CPU parity suite's against mlx-lm).
const F32_TOLERANCE: f32 = 2e-3;

/// Held while a test runs models under the process-wide precision it set.
static MODE: Mutex<()> = Mutex::new(());

/// This test's turn, with the prefill precision `p`.
fn turn(p: MatmulPrecision) -> MutexGuard<'static, ()> {
    let guard = MODE.lock().unwrap_or_else(|e| e.into_inner());
    set_matmul_precision(p);
    guard
}

/// Rows of logits as bits, for bit-for-bit comparisons.
fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter().map(|r| r.iter().map(|v| v.to_bits()).collect()).collect()
}

/// mlx-lm's bf16-vs-f32 logit difference for `case` on this test's prompt and steps: (largest,
/// mean), recorded by scripts/oracle/more/precision_noise_long.py into
/// `precision_noise_long/<case's last part>.json` in the cases' root.
fn precision_noise(case: &str) -> (f32, f32) {
    let case = std::path::Path::new(case);
    let dir = case_dir(case.to_str().unwrap());
    let root = dir.ancestors().nth(case.components().count()).unwrap();
    let name = case.file_name().unwrap().to_str().unwrap();
    let path = root.join("precision_noise_long").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("{}: {e} (copy $NUVEC_FIXTURES/precision_noise_long/ next to the cases)", path.display())
    });
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let get = |k: &str| json[k].as_f64().unwrap_or_else(|| panic!("{}: no {k}", path.display())) as f32;
    let positions = json["positions"].as_u64().unwrap_or(0) as usize;
    assert_eq!(positions, PROMPT + STEPS - 1, "{}: recorded for another prompt length", path.display());
    (get("max_abs_diff"), get("mean_abs_diff"))
}

/// Logit rows of every prompt position (prefilled in chunks of `chunk`) and of each of `steps`
/// generated positions, with the tokens generated: greedy, or `forced` when given.
fn run(model: &Model, prompt: &[u32], chunk: usize, forced: Option<&[u32]>) -> (Vec<Vec<f32>>, Vec<u32>) {
    let vocab = model.vocab_size();
    // f32 caches on both devices (the GPU's are f32).
    let options = CacheOptions { kv_dtype: Some(KvDtype::F32), ..Default::default() };
    let mut cache = model.make_cache(&options).unwrap();
    let mut rows = vec![];
    for part in prompt.chunks(chunk) {
        let logits = model.forward(part, &mut cache).unwrap();
        rows.extend(logits.to_vec::<f32>().unwrap().chunks(vocab).map(<[f32]>::to_vec));
    }
    let mut tokens = vec![];
    for step in 0..STEPS {
        let next = match forced {
            Some(f) => f[step],
            None => argmax(rows.last().unwrap()),
        };
        tokens.push(next);
        if step + 1 < STEPS {
            rows.push(model.forward_last(&[next], &mut cache).unwrap().to_vec::<f32>().unwrap());
        }
    }
    (rows, tokens)
}

/// `case` prefilled in bf16 on the GPU against the CPU, within mlx-lm's bf16 noise of `noise_case`.
fn check(case: &str, noise_case: &str, chunk: usize) {
    let _turn = turn(MatmulPrecision::Bf16);
    let dir = case_dir(case);
    let cpu = load_model_on(&dir, Device::Cpu).unwrap();
    let gpu = load_model_on(&dir, Device::Cuda(0)).unwrap_or_else(|e| panic!("{case}: loading on cuda:0: {e}"));
    check_models(case, &cpu, &gpu, noise_case, chunk);
}

/// `check` on models already loaded, under the precision set now.
fn check_models(case: &str, cpu: &Model, gpu: &Model, noise_case: &str, chunk: usize) {
    let (max_tol, mean_tol) = precision_noise(noise_case);
    let prompt = prompt(cpu.vocab_size(), PROMPT);
    let (cpu_rows, cpu_tokens) = run(cpu, &prompt, chunk, None);
    let (gpu_rows, _) = run(gpu, &prompt, chunk, Some(&cpu_tokens));
    assert_eq!(cpu_rows.len(), gpu_rows.len());
    let (mut max_diff, mut sum, mut count, mut max_logit) = (0f32, 0f64, 0usize, 0f32);
    let mut row_diff = vec![0f32; cpu_rows.len()];
    for (position, (c, g)) in cpu_rows.iter().zip(&gpu_rows).enumerate() {
        for (i, (a, b)) in c.iter().zip(g).enumerate() {
            let d = (a - b).abs();
            assert!(
                d <= max_tol,
                "{case}: position {position}, logit {i}: cpu {a} vs gpu {b} (difference {d} > {max_tol}, \
                 mlx-lm's own bf16-vs-f32 difference)"
            );
            row_diff[position] = row_diff[position].max(d);
            max_diff = max_diff.max(d);
            max_logit = max_logit.max(a.abs());
            sum += d as f64;
            count += 1;
        }
    }
    let mean = (sum / count as f64) as f32;
    assert!(mean <= mean_tol, "{case}: mean logit difference {mean} > {mean_tol} (mlx-lm's own bf16-vs-f32 mean)");
    let (_, gpu_tokens) = run(gpu, &prompt, chunk, None);
    let free = match cpu_tokens.iter().zip(&gpu_tokens).position(|(a, b)| a != b) {
        None => format!("all {STEPS} greedy tokens equal"),
        Some(s) => {
            let at = prompt.len() - 1 + s;
            let m = margin(&cpu_rows[at]);
            assert!(
                m <= 2.0 * row_diff[at],
                "{case}: greedy tokens differ at step {s} (cpu {} vs gpu {}) where the cpu's margin {m} is over \
                 twice the logit difference there ({})",
                cpu_tokens[s],
                gpu_tokens[s],
                row_diff[at]
            );
            format!("greedy tokens equal up to step {s}, a near tie (margin {m:.2e})")
        }
    };
    println!(
        "RESULT bf16 {case} prompt={PROMPT} chunk={chunk}: {} positions x {} logits, max |logit| {max_logit:.2}, \
         max diff {max_diff:.2e} (tolerance {max_tol:.2e}), mean {mean:.2e} (tolerance {mean_tol:.2e}); {free}",
        cpu_rows.len(),
        cpu.vocab_size(),
    );
}

#[test]
fn bf16_checkpoint_prefill() {
    check("mistral-bf16", "mistral-bf16", 2048);
}

#[test]
fn bf16_checkpoint_chunked_prefill() {
    // Chunks of 128, 128 and 44 queries: the bf16 attention with kv_len > L, then a chunk under
    // 64 queries (f32 split-key attention) whose products still take 44 rows in bf16.
    check("mistral-bf16", "mistral-bf16", 128);
}

#[test]
fn q4_checkpoint_prefill_forced_bf16() {
    // mlx-lm computes this checkpoint in f32 (f32 scales), so it has no bf16 record of its own:
    // the bound is that of the bf16 checkpoint of the same architecture and sizes.
    check("mistral-q4g64", "mistral-bf16", 2048);
}

/// The GPU's teacher-forced logit rows (on `tokens`) under precision `p`.
fn gpu_rows(gpu: &Model, prompt: &[u32], chunk: usize, tokens: &[u32], p: MatmulPrecision) -> Vec<Vec<f32>> {
    set_matmul_precision(p);
    run(gpu, prompt, chunk, Some(tokens)).0
}

#[test]
fn moe_bf16_q4_checkpoint_prefill() {
    // A mixture-of-experts checkpoint quantized from bf16 (bf16 scales, as mlx-community's): 300
    // rows, and 128-row chunks, take the grouped expert products (kernels/qmma.cu's g64 kernels,
    // the slots sorted by expert on the device).
    let case = "moe_bf16/qwen3_moe-bf16q4";
    check(case, case, 2048);
    check(case, case, 128);
}

#[test]
fn q4_checkpoint_prefill() {
    // Under the default (Auto) a checkpoint with f32 scales computes in f32, as in mlx-lm: the
    // GPU's logits are the F32 setting's bit for bit, within gpu_parity.rs's f32 tolerance of
    // the CPU's, and its greedy tokens the CPU's (but after a near tie).
    let case = "mistral-q4g64";
    let _turn = turn(MatmulPrecision::Auto);
    let dir = case_dir(case);
    let cpu = load_model_on(&dir, Device::Cpu).unwrap();
    let gpu = load_model_on(&dir, Device::Cuda(0)).unwrap_or_else(|e| panic!("{case}: loading on cuda:0: {e}"));
    assert_eq!(gpu.compute_dtype(), nuvec::DType::F32, "{case}: mlx-lm computes it in f32");
    let prompt = prompt(cpu.vocab_size(), PROMPT);
    let (cpu_rows, cpu_tokens) = run(&cpu, &prompt, 2048, None);
    let auto = gpu_rows(&gpu, &prompt, 2048, &cpu_tokens, MatmulPrecision::Auto);
    let mut max_diff = 0f32;
    for (position, (c, g)) in cpu_rows.iter().zip(&auto).enumerate() {
        for (i, (a, b)) in c.iter().zip(g).enumerate() {
            let d = (a - b).abs();
            assert!(
                d <= F32_TOLERANCE,
                "{case}: position {position}, logit {i}: cpu {a} vs gpu {b} (difference {d} > {F32_TOLERANCE}: \
                 not the f32 path)"
            );
            max_diff = max_diff.max(d);
        }
    }
    let f32_rows = gpu_rows(&gpu, &prompt, 2048, &cpu_tokens, MatmulPrecision::F32);
    assert!(bits(&auto) == bits(&f32_rows), "{case}: Auto's logits are not the F32 setting's bit for bit");
    set_matmul_precision(MatmulPrecision::Auto);
    let (_, gpu_tokens) = run(&gpu, &prompt, 2048, None);
    if let Some(s) = cpu_tokens.iter().zip(&gpu_tokens).position(|(a, b)| a != b) {
        let m = margin(&cpu_rows[prompt.len() - 1 + s]);
        assert!(
            m <= 2.0 * F32_TOLERANCE,
            "{case}: greedy tokens differ at step {s} (cpu {} vs gpu {}), margin {m} not a near tie",
            cpu_tokens[s],
            gpu_tokens[s]
        );
    }
    println!(
        "RESULT auto {case} prompt={PROMPT}: max diff {max_diff:.2e} (f32 tolerance {F32_TOLERANCE:.0e}), \
         logits equal to the f32 setting's bit for bit"
    );
}

#[test]
fn gguf_kquants_prefill_auto() {
    // A GGUF model computes in half precision (f16 caches, as llama.cpp), but its K-quant and
    // Q8_0 scales are f32, kept so to be exact: under the default (Auto) its prefill products
    // still run on the tensor cores, as llama.cpp runs them: the Bf16 setting's logits bit for
    // bit, not the F32 setting's, and within the bf16 bound of the architecture's bf16 case
    // against the CPU (mlx-lm has no GGUF path to record a bound of its own).
    let case = "gguf-kquants";
    let _turn = turn(MatmulPrecision::Auto);
    let root = case_dir("mistral-bf16").parent().unwrap().to_path_buf();
    let path = root.join(case).join("model.gguf");
    let cpu = load_gguf_on(&path, Device::Cpu).unwrap().0;
    let gpu = load_gguf_on(&path, Device::Cuda(0)).unwrap_or_else(|e| panic!("{case}: loading on cuda:0: {e}")).0;
    assert!(matches!(gpu.compute_dtype(), nuvec::DType::F16 | nuvec::DType::BF16), "{case}: a half model");
    let prompt = prompt(gpu.vocab_size(), PROMPT);
    let (_, tokens) = run(&gpu, &prompt, 2048, None);
    let auto = gpu_rows(&gpu, &prompt, 2048, &tokens, MatmulPrecision::Auto);
    let bf16 = gpu_rows(&gpu, &prompt, 2048, &tokens, MatmulPrecision::Bf16);
    let f32_rows = gpu_rows(&gpu, &prompt, 2048, &tokens, MatmulPrecision::F32);
    assert!(bits(&auto) == bits(&bf16), "{case}: Auto's logits are not the Bf16 setting's");
    assert!(bits(&auto) != bits(&f32_rows), "{case}: the bf16 and f32 paths agree: proves nothing");
    set_matmul_precision(MatmulPrecision::Auto);
    check_models(case, &cpu, &gpu, "mistral-bf16", 2048);
}

#[test]
fn bf16_checkpoint_prefill_auto() {
    // Under the default (Auto) a bf16 checkpoint takes the bf16 paths everywhere (its weights,
    // and attention, since the model computes in bf16): the Bf16 setting's logits bit for bit,
    // which bf16_checkpoint_prefill bounds against mlx-lm; and not the F32 setting's.
    let case = "mistral-bf16";
    let _turn = turn(MatmulPrecision::Auto);
    let dir = case_dir(case);
    let gpu = load_model_on(&dir, Device::Cuda(0)).unwrap_or_else(|e| panic!("{case}: loading on cuda:0: {e}"));
    assert_eq!(gpu.compute_dtype(), nuvec::DType::BF16, "{case}: mlx-lm computes it in bf16");
    let prompt = prompt(gpu.vocab_size(), PROMPT);
    for chunk in [2048, 128] {
        let (_, tokens) = run(&gpu, &prompt, chunk, None);
        let auto = gpu_rows(&gpu, &prompt, chunk, &tokens, MatmulPrecision::Auto);
        let bf16 = gpu_rows(&gpu, &prompt, chunk, &tokens, MatmulPrecision::Bf16);
        let f32_rows = gpu_rows(&gpu, &prompt, chunk, &tokens, MatmulPrecision::F32);
        assert!(bits(&auto) == bits(&bf16), "{case} chunk {chunk}: Auto's logits are not the Bf16 setting's");
        assert!(bits(&auto) != bits(&f32_rows), "{case} chunk {chunk}: the bf16 and f32 paths agree: proves nothing");
        println!("RESULT auto {case} prompt={PROMPT} chunk={chunk}: logits equal to the bf16 setting's bit for bit");
    }
}

/// Greedy decoding of each of `prompts` alone on the GPU (its prompt but the last token in one
/// pass, then a token at a time): each step's logits.
fn decode_alone(gpu: &Model, p: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut cache = gpu.new_cache();
    if p.len() > 1 {
        gpu.prefill(&p[..p.len() - 1], &mut cache).unwrap();
    }
    let mut t = p[p.len() - 1];
    (0..steps)
        .map(|_| {
            let row = gpu.forward_last(&[t], &mut cache).unwrap().to_vec::<f32>().unwrap();
            t = argmax(&row);
            row
        })
        .collect()
}

#[test]
fn q4_batched_decode_forced_bf16() {
    // Under Bf16 a batched decode step's 4-bit products of 2 to 8 rows run in integers at f32
    // accuracy (kernels/qimma.cu `qimma_b4_r*`), and from 9 rows each weight is decoded in f32
    // from its f32 scales and rounded to bf16, x in bf16 (`qdec_b4_r*s`; other widths: x in two
    // bf16 parts up to 8 rows, in bf16 to 32, the weights decoded from 33, kernels/qmma.cu); the
    // same steps alone take the one-row f32 GEMV. Each sequence's batched logits must stay within
    // gpu_parity.rs's f32 tolerance of its own (6 sequences), or mlx-lm's bf16-vs-f32 noise (12,
    // 20 and 40), and give its greedy tokens but after a near tie.
    let case = "mistral-q4g64";
    let _turn = turn(MatmulPrecision::Bf16);
    let (noise, _) = precision_noise("mistral-bf16");
    let gpu = load_model_on(&case_dir(case), Device::Cuda(0)).unwrap_or_else(|e| panic!("{case}: cuda:0: {e}"));
    batched_against_alone(case, &gpu, &[(6, F32_TOLERANCE), (12, noise), (20, noise), (40, noise)]);
}

#[test]
fn gguf_kquants_batched_decode_auto() {
    // A GGUF model (half precision, f16 caches) under the default: its batched steps' Q4_K
    // products (K = 256) take the bf16 register kernels from 9 rows (`qdec_b4_r*s`: each weight
    // fmaf(s, q, b) in f32 from its f32 scales, rounded to bf16), its other K-quants the bf16
    // paths of their widths, against each sequence alone (the one-row GEMVs), within the bf16
    // bound gguf_kquants_prefill_auto holds its prefill to.
    let case = "gguf-kquants";
    let _turn = turn(MatmulPrecision::Auto);
    let (noise, _) = precision_noise("mistral-bf16");
    let path = case_dir(case).join("model.gguf");
    let gpu = load_gguf_on(&path, Device::Cuda(0)).unwrap_or_else(|e| panic!("{case}: loading on cuda:0: {e}")).0;
    batched_against_alone(case, &gpu, &[(12, noise), (20, noise)]);
}

/// Batched decode steps of the first `count` of 40 prompts of mixed lengths, for each `(count,
/// bound)`, against each prompt decoded alone on the GPU: each sequence's logits within `bound`
/// of its own, and its greedy tokens but after a near tie (a margin within twice the difference).
fn batched_against_alone(case: &str, gpu: &Model, counts: &[(usize, f32)]) {
    use nuvec_lm::{decode_batch, PagedCache};
    let lengths = [
        1, 17, 300, 5, 40, 2, 64, 9, 130, 3, 33, 77, 1, 4, 250, 6, 18, 90, 2, 11, 7, 21, 140, 3, 55, 1, 12, 260, 8, 2,
        44, 19, 5, 99, 1, 30, 16, 3, 70, 9,
    ];
    let steps = 8;
    let most = counts.iter().map(|c| c.0).max().unwrap_or(0);
    let prompts: Vec<Vec<u32>> =
        lengths[..most].iter().enumerate().map(|(i, &n)| prompt(gpu.vocab_size() - i, n)).collect();
    let alone: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| decode_alone(gpu, p, steps)).collect();
    for &(count, bound) in counts {
        let mut paged = PagedCache::new(gpu, 512, 16, count).unwrap();
        let mut ids = vec![];
        for p in &prompts[..count] {
            let id = paged.add().unwrap();
            if p.len() > 1 {
                paged.step(gpu, &[(id, &p[..p.len() - 1])]).unwrap();
            }
            ids.push(id);
        }
        let mut tokens: Vec<u32> = prompts[..count].iter().map(|p| p[p.len() - 1]).collect();
        let mut widest = 0f32;
        let mut diverged = vec![false; count];
        for step in 0..steps {
            let own_rows = alone.iter().map(|a| &a[step]);
            let logits = decode_batch(gpu, &tokens, &ids, &mut paged).unwrap().to_vec::<f32>().unwrap();
            for ((i, row), own) in logits.chunks(gpu.vocab_size()).enumerate().zip(own_rows) {
                if diverged[i] {
                    continue;
                }
                let d = own.iter().zip(row).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(
                    d <= bound,
                    "{case}, {count} sequences: sequence {i} step {step}: logits differ by {d} > {bound}"
                );
                widest = widest.max(d);
                tokens[i] = argmax(row);
                if tokens[i] != argmax(own) {
                    let m = margin(own);
                    assert!(
                        m <= 2.0 * d,
                        "{case}, {count} sequences: sequence {i} step {step}: another token, margin {m}"
                    );
                    diverged[i] = true;
                }
            }
        }
        let equal = diverged.iter().filter(|d| !**d).count();
        println!(
            "RESULT bf16 batched {case}: {count} sequences x {steps} steps, widest logit difference {widest:.2e} \
             (bound {bound:.2e}), {equal} of {count} all greedy tokens equal"
        );
    }
}
