//! `MatmulPrecision::Auto` (the default prefill precision) picks, per call, the path mlx-lm's
//! type for the checkpoint calls for: the bf16 tensor-core path for weights stored in half
//! precision (dense f16/bf16, or quantized with f16/bf16 scales) unless the model running
//! computes in f32, for quantized weights with f32 scales inside a half-precision model (a
//! GGUF's), and for attention while the model running computes in half precision
//! (`nuvec::with_compute_dtype`); the f32 path for everything else.
//!
//! Each case computes the same op under `Auto`, `F32` and `Bf16` on the GPU and checks that
//! `Auto` is bit for bit the path it should take, that the two paths really differ on that input
//! (so the comparison can fail), and that an f32 result matches the CPU backend at the f32
//! tolerance of tests/cuda_ops.rs. The explicit settings keep their meaning whatever the weight
//! or the hint. The bf16 path's accuracy itself is tests/cuda_bf16.rs's subject.
//!
//! Needs a CUDA device (without one every test FAILS, saying so); built only with
//! `--features cuda`. The precision is process-wide, so the tests of this binary take turns
//! (`MODE`).

#![cfg(feature = "cuda")]

use std::sync::Mutex;

use nuvec::backends::cuda::{matmul_precision, set_matmul_precision, MatmulPrecision};
use nuvec::{Array, DType, Device, Matrix, QuantMode, QuantSpec, Quantized};

mod common;
use common::{arr, floats, Rng};

/// Held while a test switches the process-wide precision and runs ops under it.
static MODE: Mutex<()> = Mutex::new(());

/// The device under test (panics, failing the test, when there is none). `gpu_with` sets the
/// precision, so it waits for its turn too.
fn gpu() -> Device {
    let _turn = MODE.lock().unwrap_or_else(|e| e.into_inner());
    common::gpu_with(MatmulPrecision::Auto)
}

/// `f()` with the prefill precision `p` (nothing else of this binary runs meanwhile), read
/// back to the host before the next setting.
fn under(p: MatmulPrecision, f: impl FnOnce() -> Vec<Array>) -> Vec<Vec<f32>> {
    let _turn = MODE.lock().unwrap_or_else(|e| e.into_inner());
    set_matmul_precision(p);
    assert_eq!(matmul_precision(0).unwrap(), p);
    let out: Vec<Vec<f32>> = f().iter().map(|a| a.to_f32_vec().unwrap()).collect();
    set_matmul_precision(MatmulPrecision::Auto);
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `got` bit for bit `want`, and `want` not bit for bit `other` (the check discriminates).
fn same_path(case: &str, got: &[f32], want: &[f32], other: &[f32], path: &str) {
    assert_eq!(got.len(), want.len(), "{case}: lengths");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
        panic!("{case}: Auto should take the {path} path: element {i}: auto {} vs {path} {}", got[i], want[i]);
    }
    assert_ne!(
        bits(want),
        bits(other),
        "{case}: the f32 and bf16 paths agree bit for bit here; the case proves nothing"
    );
    eprintln!("RESULT {case:<64} auto == {path} (bit for bit)");
}

/// f32 comparison with the CPU at tests/cuda_ops.rs's tolerance.
fn close_f32(case: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{case}: lengths");
    let mean = want.iter().map(|v| v.abs()).sum::<f32>() / want.len().max(1) as f32;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let err = (a - b).abs();
        assert!(err <= common::TOL * (b.abs() + mean), "{case}: element {i}: gpu {a} vs cpu {b} (f32 tolerance)");
    }
    eprintln!("RESULT {case:<64} within the f32 tolerance of the CPU");
}

fn dense(rng: &mut Rng, rows: usize, cols: usize, dtype: DType) -> Matrix {
    Matrix::Dense(floats(&rng.vec(rows * cols, 0.1), &[rows, cols], dtype))
}

fn quantized(rng: &mut Rng, rows: usize, cols: usize, bits: usize, group: usize, pdtype: DType) -> Matrix {
    let words = cols * bits / 32;
    let packed: Vec<u32> = (0..rows * words).map(|_| rng.next_u32()).collect();
    let groups = cols / group;
    let scales = floats(&rng.vec(rows * groups, 0.05), &[rows, groups], pdtype);
    let biases = floats(&rng.vec(rows * groups, 0.2), &[rows, groups], pdtype);
    let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
    let packed = Array::from_slice(&packed, &[rows, words]).unwrap();
    Matrix::Quantized(Quantized::new(packed, scales, biases, spec, cols).unwrap())
}

/// Whether `w` is stored in half precision (its scales, when quantized).
fn half(w: &Matrix) -> bool {
    let dt = match w {
        Matrix::Dense(a) => a.dtype(),
        Matrix::Quantized(q) => q.scales.dtype(),
    };
    matches!(dt, DType::F16 | DType::BF16)
}

/// Whether `m` rows over `w` run kernels/qimma.cu's integer register kernels whatever the
/// precision: 2 to 8 rows (below `NUVEC_QDEC_SCALED_FROM`, 9) over affine 4-bit weights whose
/// scales are not bf16 (bf16 scales, and from 9 rows f16 and f32 ones, take the bf16 register
/// kernels where the precision allows; ops/qimma.rs).
fn integer_rows(w: &Matrix, m: usize) -> bool {
    let from = std::env::var("NUVEC_QDEC_SCALED_FROM").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(9usize);
    matches!(w, Matrix::Quantized(q) if q.spec.bits == 4 && q.scales.dtype() != DType::BF16)
        && (2..from.min(17)).contains(&m)
}

#[test]
fn linear_follows_each_weight() {
    let dev = gpu();
    let mut rng = Rng::new(31);
    let k = 384;
    let weights = [
        ("dense f32", dense(&mut rng, 77, k, DType::F32)),
        ("dense f16", dense(&mut rng, 77, k, DType::F16)),
        ("dense bf16", dense(&mut rng, 77, k, DType::BF16)),
        ("q4 g64 f32 scales", quantized(&mut rng, 77, k, 4, 64, DType::F32)),
        ("q4 g64 f16 scales", quantized(&mut rng, 77, k, 4, 64, DType::F16)),
        ("q4 g64 bf16 scales", quantized(&mut rng, 77, k, 4, 64, DType::BF16)),
        ("q8 g32 f32 scales", quantized(&mut rng, 77, k, 8, 32, DType::F32)),
        ("q8 g32 bf16 scales", quantized(&mut rng, 77, k, 8, 32, DType::BF16)),
    ];
    for (name, w) in &weights {
        let wg = w.to_device(dev).unwrap();
        for m in [5usize, 9, 37, 100] {
            // 5 rows: only where the integer register kernels take them (every other path of 8
            // rows or fewer is the same under both precisions, which `same_path` refuses).
            if m < 9 && !integer_rows(w, m) {
                continue;
            }
            let x = arr(&rng.vec(m * k, 1.0), &[m, k]);
            let xg = x.to_device(dev).unwrap();
            let run = |p| under(p, || vec![xg.linear(&wg).unwrap()]).remove(0);
            let (auto, f32_, bf16_) =
                (run(MatmulPrecision::Auto), run(MatmulPrecision::F32), run(MatmulPrecision::Bf16));
            // Inside a model computing in `dt` (`nuvec::with_compute_dtype`).
            let in_model = |dt| {
                under(MatmulPrecision::Auto, || nuvec::with_compute_dtype(dt, || vec![xg.linear(&wg).unwrap()]))
                    .remove(0)
            };
            let case = format!("linear auto {name} m={m}");
            if integer_rows(w, m) {
                // One path under every setting: the integer register kernels, at f32 accuracy.
                assert_eq!(bits(&auto), bits(&f32_), "{case}: auto and f32");
                assert_eq!(bits(&bf16_), bits(&f32_), "{case}: bf16 and f32");
                close_f32(&case, &auto, &x.linear(w).unwrap().to_f32_vec().unwrap());
            } else if half(w) {
                same_path(&case, &auto, &bf16_, &f32_, "bf16");
                same_path(&format!("{case}, bf16 model"), &in_model(DType::BF16), &bf16_, &f32_, "bf16");
                // mlx-lm promotes the product to an f32 model's activations.
                same_path(&format!("{case}, f32 model"), &in_model(DType::F32), &f32_, &bf16_, "f32");
            } else {
                same_path(&case, &auto, &f32_, &bf16_, "f32");
                // f32 scales in a half model (a GGUF's K-quants and Q4_0) take bf16, as llama.cpp
                // computes them; a dense f32 weight stays f32 there.
                let model = format!("{case}, bf16 model");
                match w {
                    Matrix::Quantized(_) => same_path(&model, &in_model(DType::BF16), &bf16_, &f32_, "bf16"),
                    Matrix::Dense(_) => same_path(&model, &in_model(DType::BF16), &f32_, &bf16_, "f32"),
                }
                same_path(&format!("{case}, f32 model"), &in_model(DType::F32), &f32_, &bf16_, "f32");
                close_f32(&case, &auto, &x.linear(w).unwrap().to_f32_vec().unwrap());
            }
        }
    }
}

#[test]
fn linear_many_and_silu_mul_linear_follow_each_weight() {
    // q/k/v or gate/up of mixed storage: each output takes its own weight's path; the down
    // projection of silu(gate) * up likewise.
    let dev = gpu();
    let mut rng = Rng::new(32);
    let (m, k) = (100usize, 512usize);
    let ws = [
        quantized(&mut rng, 96, k, 4, 64, DType::F32),
        quantized(&mut rng, 32, k, 4, 64, DType::BF16),
        dense(&mut rng, 40, k, DType::F32),
        dense(&mut rng, 40, k, DType::BF16),
    ];
    let wg: Vec<Matrix> = ws.iter().map(|w| w.to_device(dev).unwrap()).collect();
    let (x, u) = (arr(&rng.vec(m * k, 1.0), &[m, k]), arr(&rng.vec(m * k, 1.0), &[m, k]));
    let (xg, ug) = (x.to_device(dev).unwrap(), u.to_device(dev).unwrap());
    let refs: Vec<&Matrix> = wg.iter().collect();
    // All the weights together, and each half-precision weight together with its own kind only
    // (the one-conversion bf16 path), under each setting.
    let run = |p| under(p, || xg.linear_many(&refs).unwrap());
    let (auto, f32_, bf16_) = (run(MatmulPrecision::Auto), run(MatmulPrecision::F32), run(MatmulPrecision::Bf16));
    for (i, w) in ws.iter().enumerate() {
        let case = format!("linear_many auto mixed weight {i}");
        if half(w) {
            same_path(&case, &auto[i], &bf16_[i], &f32_[i], "bf16");
        } else {
            same_path(&case, &auto[i], &f32_[i], &bf16_[i], "f32");
            close_f32(&case, &auto[i], &x.linear(w).unwrap().to_f32_vec().unwrap());
        }
    }
    let halves: Vec<&Matrix> = [&wg[1], &wg[3]].into_iter().collect();
    let run = |p| under(p, || xg.linear_many(&halves).unwrap());
    let (auto, f32_, bf16_) = (run(MatmulPrecision::Auto), run(MatmulPrecision::F32), run(MatmulPrecision::Bf16));
    for i in 0..2 {
        same_path(&format!("linear_many auto half weights, weight {i}"), &auto[i], &bf16_[i], &f32_[i], "bf16");
    }
    for (name, w, wgi) in [("q4 g64 f32 scales", &ws[0], &wg[0]), ("q4 g64 bf16 scales", &ws[1], &wg[1])] {
        let run = |p| under(p, || vec![xg.silu_mul_linear(&ug, wgi).unwrap()]).remove(0);
        let (auto, f32_, bf16_) = (run(MatmulPrecision::Auto), run(MatmulPrecision::F32), run(MatmulPrecision::Bf16));
        let case = format!("silu_mul_linear auto {name}");
        if half(w) {
            same_path(&case, &auto, &bf16_, &f32_, "bf16");
        } else {
            same_path(&case, &auto, &f32_, &bf16_, "f32");
            close_f32(&case, &auto, &x.silu_mul_linear(&u, w).unwrap().to_f32_vec().unwrap());
        }
    }
}

#[test]
fn attention_follows_the_models_compute_dtype() {
    let dev = gpu();
    let mut rng = Rng::new(33);
    let (l, kv, hq, hkv, d) = (100usize, 357usize, 8usize, 2usize, 128usize);
    let cap = kv + 5;
    let q = arr(&rng.vec(l * hq * d, 1.0), &[l, hq, d]);
    let k = arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]);
    let v = arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]);
    let scale = 1.0 / (d as f32).sqrt();
    let cpu = nuvec::attention(&q, &k, &v, kv, scale).unwrap().to_f32_vec().unwrap();
    let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
    // `hint`: the model's compute dtype (None: called outside a model).
    let run = |p, hint: Option<DType>| {
        let op = || vec![nuvec::attention(&qg, &kg, &vg, kv, scale).unwrap()];
        under(p, || match hint {
            Some(dt) => nuvec::with_compute_dtype(dt, op),
            None => op(),
        })
        .remove(0)
    };
    let (f32_, bf16_) = (run(MatmulPrecision::F32, None), run(MatmulPrecision::Bf16, None));
    close_f32("attention f32 path", &f32_, &cpu);
    for (hint, path) in
        [(None, "f32"), (Some(DType::F32), "f32"), (Some(DType::BF16), "bf16"), (Some(DType::F16), "bf16")]
    {
        let case = format!("attention auto, model computes in {hint:?}");
        let auto = run(MatmulPrecision::Auto, hint);
        match path {
            "f32" => same_path(&case, &auto, &f32_, &bf16_, "f32"),
            _ => same_path(&case, &auto, &bf16_, &f32_, "bf16"),
        }
    }
    // The explicit settings ignore the hint.
    let case = "attention f32 setting, bf16 model";
    same_path(case, &run(MatmulPrecision::F32, Some(DType::BF16)), &f32_, &bf16_, "f32");
    let case = "attention bf16 setting, f32 model";
    same_path(case, &run(MatmulPrecision::Bf16, Some(DType::F32)), &bf16_, &f32_, "bf16");
}
