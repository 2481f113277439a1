//! The bf16 tensor-core prefill paths (phase 4) against references on the host.
//!
//! Needs a CUDA device (without one every test FAILS, saying so); built only with
//! `--features cuda`. The process runs in `MatmulPrecision::Bf16`, set explicitly, so every
//! weight (f32 ones too) and every long attention takes the bf16 path; which path the default,
//! `Auto`, picks is tests/cuda_auto_precision.rs's subject.
//!
//! Each result is checked twice, with bounds that come from the arithmetic, not from the
//! results (u = 2^-8 is bf16's unit roundoff; f32 sums are bounded with 2^-23 per addition,
//! enough for tensor cores that truncate instead of rounding):
//! - **exact operands**: the host computes the product of the bf16-rounded operands in f64
//!   (the GPU rounds the same f32 values to nearest even, and decodes quantized weights with
//!   the same `fma(scale, q, bias)`; the few-row kernels of kernels/qmma.cu, 2 to 32 rows of 4-
//!   and 8-bit weights, never round the weight, and the host then takes it unrounded), so the only difference allowed is f32 accumulation:
//!   `|gpu - ref| <= K * 2^-23 * sum|x^ w^|` (Higham's bound for any summation order). For
//!   attention the probabilities are rounded to bf16 after an f32 softmax: where the host's
//!   probability lies within the GPU's f32 error of a bf16 rounding boundary, the two may round
//!   to neighbours, so those terms are also allowed one bf16 step (2^-7 relative). Head sizes
//!   64 and 128 run the flash-attention kernels, which round each probability before the
//!   softmax's final scaling (relative to the running maximum of its row): there every term
//!   `p v` is allowed one bf16 rounding (u relative) instead.
//! - **against the CPU backend's f32 result**: the error bf16 rounding can cause, e.g. for a
//!   weight product `(2u + u^2) * sum|x||w|` plus both sides' accumulation.
//!
//! Decode-sized calls (at most 8 rows, fewer than 64 queries) must still match the CPU at the
//! f32 tolerance of tests/cuda_ops.rs: bf16 is for prefill and batched decode of more than 8
//! rows (2 to 8 rows of 4- and 8-bit weights run on the tensor cores too, x in two bf16 parts).
//!
//! Each case prints a `RESULT` line with its largest error as a fraction of each bound (run with
//! `--nocapture`).

#![cfg(feature = "cuda")]

use half::{bf16, f16};
use nuvec::backends::cuda::{matmul_precision, set_decode_stream, MatmulPrecision};
use nuvec::{Array, DType, Device, Matrix, QuantMode, QuantSpec, Quantized};

/// bf16's unit roundoff (round to nearest, 8-bit significand).
const U: f64 = 1.0 / 256.0;
/// One f32 addition's relative error, rounding or truncating.
const F32_ADD: f64 = 1.0 / 8_388_608.0;
/// The f32 tolerance of tests/cuda_ops.rs, for the paths that stay f32.
const F32_TOL: f32 = 1e-4;

mod common;
use common::{arr, Rng};

/// The device under test, in bf16 mode; panics (fails the test) when there is none.
fn gpu() -> Device {
    let dev = common::gpu_with(MatmulPrecision::Bf16);
    assert_eq!(matmul_precision(0).unwrap(), MatmulPrecision::Bf16);
    dev
}

/// `data` stored as `dtype`, and the stored values read back as f32.
fn floats(data: &[f32], shape: &[usize], dtype: DType) -> (Array, Vec<f32>) {
    let a = match dtype {
        DType::F32 => arr(data, shape),
        DType::F16 => Array::from_slice(&data.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(), shape).unwrap(),
        DType::BF16 => Array::from_slice(&data.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(), shape).unwrap(),
        other => panic!("not a float dtype: {other}"),
    };
    let values = a.to_f32_vec().unwrap();
    (a, values)
}

/// An f32 value rounded to bf16 (nearest, ties to even), as f64.
fn bf(v: f32) -> f64 {
    bf16::from_f32(v).to_f64()
}

/// A paged store's half type for the tensor-core decode tests: q's entries rounded to it, the
/// scale (with f16 the kernels round q times the scale, so a power of two keeps that exact),
/// the unit roundoff of the probabilities' rounding, and the least error that shows the
/// rounding happened (the f32 kernel matches the CPU to about 1e-7).
struct PagedHalf {
    dtype: DType,
}

impl PagedHalf {
    fn round(&self, x: f32) -> f32 {
        if self.dtype == DType::F16 {
            f16::from_f32(x).to_f32()
        } else {
            bf(x) as f32
        }
    }
    fn scale(&self, d: usize) -> f32 {
        if self.dtype == DType::F16 {
            0.125
        } else {
            1.0 / (d as f32).sqrt()
        }
    }
    fn u(&self) -> f64 {
        if self.dtype == DType::F16 {
            1.0 / 2048.0
        } else {
            U
        }
    }
    fn rounding_shows(&self) -> f64 {
        if self.dtype == DType::F16 {
            5e-6
        } else {
            5e-5
        }
    }
}

/// A weight matrix and its values `[rows, cols]` as the GPU decodes them before rounding:
/// dense values as stored, affine ones as `fma(scale, q, bias)` in f32.
struct Weight {
    matrix: Matrix,
    values: Vec<f32>,
}

fn dense(rng: &mut Rng, rows: usize, cols: usize, dtype: DType) -> Weight {
    let (a, values) = floats(&rng.vec(rows * cols, 0.1), &[rows, cols], dtype);
    Weight { matrix: Matrix::Dense(a), values }
}

fn quantized(rng: &mut Rng, rows: usize, cols: usize, bits: usize, group: usize, pdtype: DType) -> Weight {
    let words = cols * bits / 32;
    let packed: Vec<u32> = (0..rows * words).map(|_| rng.next_u32()).collect();
    let groups = cols / group;
    let (scales, s) = floats(&rng.vec(rows * groups, 0.05), &[rows, groups], pdtype);
    let (biases, b) = floats(&rng.vec(rows * groups, 0.2), &[rows, groups], pdtype);
    let mut values = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = &packed[r * words..(r + 1) * words];
        for c in 0..cols {
            // MLX's layout: `bits`-wide values packed LSB-first into little-endian u32 words.
            let (bit, mask) = (c * bits, (1u64 << bits) - 1);
            let (word, shift) = (bit / 32, bit % 32);
            let lo = row[word] as u64;
            let hi = row.get(word + 1).copied().unwrap_or(0) as u64;
            let q = (((hi << 32) | lo) >> shift) & mask;
            let g = r * groups + c / group;
            values.push(s[g].mul_add(q as f32, b[g]));
        }
    }
    let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
    let q = Quantized::new(Array::from_slice(&packed, &[rows, words]).unwrap(), scales, biases, spec, cols).unwrap();
    Weight { matrix: Matrix::Quantized(q), values }
}

/// f32 comparison with the CPU, as tests/cuda_ops.rs does it.
fn close_f32(case: &str, got: &[f32], want: &[f32]) {
    let mean = want.iter().map(|v| v.abs()).sum::<f32>() / want.len().max(1) as f32;
    let mut worst = 0f32;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let err = (a - b).abs();
        assert!(err <= F32_TOL * (b.abs() + mean), "{case}: element {i}: gpu {a} vs cpu {b} (f32 path expected)");
        worst = worst.max(err / (b.abs() + mean).max(f32::MIN_POSITIVE));
    }
    eprintln!("RESULT {case:<64} f32 path, max_rel {worst:.3e}");
}

/// Tracks the largest error / bound ratio of one check; panics past 1.
struct Check {
    name: &'static str,
    worst: f64,
    max_abs: f64,
}

impl Check {
    fn new(name: &'static str) -> Self {
        Check { name, worst: 0.0, max_abs: 0.0 }
    }
    fn at(&mut self, case: &str, what: impl Fn() -> String, got: f32, want: f64, bound: f64) {
        let err = (got as f64 - want).abs();
        assert!(
            err <= bound,
            "{case}: {} check, {}: gpu {got} vs {want} (error {err:.3e} > bound {bound:.3e})",
            self.name,
            what()
        );
        self.worst = self.worst.max(err / bound);
        self.max_abs = self.max_abs.max(err);
    }
}

fn check_linear(case: &str, rng: &mut Rng, w: &Weight, m: usize) {
    let dev = gpu();
    let (n, k) = (w.matrix.rows(), w.matrix.cols());
    let xv = rng.vec(m * k, 1.0);
    let x = arr(&xv, &[m, k]);
    let cpu = x.linear(&w.matrix).unwrap().to_f32_vec().unwrap();
    let got = x.to_device(dev).unwrap().linear(&w.matrix.to_device(dev).unwrap()).unwrap();
    assert_eq!((got.shape(), got.device()), (&[m, n][..], dev), "{case}");
    let got = got.to_f32_vec().unwrap();
    let case = format!("linear bf16 {case} m={m}");
    if (m <= 8 && !qdec_takes(&w.matrix, m)) || qimma_takes(&w.matrix, m) {
        return close_f32(&case, &got, &cpu);
    }
    compare_linear(&case, &xv, 0.0, w, m, &got, &cpu);
}

/// Whether a product of `m` rows over `w` runs kernels/qimma.cu's integer kernels (`ops/qimma.rs`'s
/// rule: affine 4-bit weights in groups of 32 or more, K a multiple of 32; 2 to 16 rows where the
/// scales are not bf16 by default, 2 to 16 with `NUVEC_QIMMA=int`, 2 to 64 with `NUVEC_QIMMA=1`,
/// none with `NUVEC_QIMMA=0`), which take x at the one-row integer GEMV's accuracy: f32's, as the
/// CPU. Run this file with each setting (docs/cuda.md).
fn qimma_takes(w: &Matrix, m: usize) -> bool {
    let most = match std::env::var("NUVEC_QIMMA").as_deref() {
        Ok("0") => 0,
        Ok("1") => 64,
        _ => 16,
    };
    (2..=most).contains(&m) && few_row_affine(w, &[4]) && !qdec_takes(w, m)
}

/// Whether a product of `m` rows over `w` runs kernels/qimma.cu's register kernels with the
/// weights decoded to bf16 and x rounded to bf16 (`qdec_b4_r*`; by default, 2 to 64 rows (to 16
/// or 32 with `NUVEC_QDEC_ROWS`) over affine 4-bit weights in groups of 32 to 128, K a multiple
/// of 128, with bf16 scales, or f16 and f32 ones from `NUVEC_QDEC_SCALED_FROM` (9) rows).
fn qdec_takes(w: &Matrix, m: usize) -> bool {
    let default = std::env::var("NUVEC_QIMMA").is_err();
    let most = std::env::var("NUVEC_QDEC_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let from = std::env::var("NUVEC_QDEC_SCALED_FROM").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(9);
    let scales = matches!(w, Matrix::Quantized(q)
        if q.spec.group_size <= 128 && (q.scales.dtype() == DType::BF16 || m >= from));
    default && (2..=most).contains(&m) && few_row_affine(w, &[4]) && scales && w.cols().is_multiple_of(128)
}

/// Whether a product of `m` rows over `w` runs kernels/qmma.cu's exact kernels (`ops/qmma.rs`'s
/// rule: 2 to 32 rows, affine 4- or 8-bit weights in groups of 32 or more, K a multiple of 32;
/// every input and weight here is aligned). From 33 rows its kernels multiply the weight rounded
/// to bf16, as the other paths do.
fn qmma_takes(w: &Matrix, m: usize) -> bool {
    (2..=32).contains(&m) && few_row_affine(w, &[4, 8])
}

/// Whether `w` is an affine weight of one of `bits` in groups of 32 or more with K a multiple of
/// 32: what the few-row kernels take.
fn few_row_affine(w: &Matrix, bits: &[usize]) -> bool {
    match w {
        Matrix::Quantized(q) => {
            let s = q.spec;
            s.mode == QuantMode::Affine && bits.contains(&s.bits) && s.group_size >= 32 && q.cols() % 32 == 0
        }
        _ => false,
    }
}

/// `got` [m, n] against the product of the bf16-rounded operands and against the CPU's `cpu`.
/// `x_rel`: how far (relative) the GPU's f32 inputs may be from `xv` before rounding (0 when it
/// reads `xv` itself): where that straddles a bf16 rounding boundary, the GPU's rounded input
/// may be the neighbour (one step, at most 2^-7 relative), so those terms are allowed that.
fn compare_linear(case: &str, xv: &[f32], x_rel: f64, w: &Weight, m: usize, got: &[f32], cpu: &[f32]) {
    let (n, k) = (w.matrix.rows(), w.matrix.cols());
    let xb: Vec<f64> = xv.iter().map(|&v| bf(v)).collect();
    let x_step: Vec<f64> = xv
        .iter()
        .zip(&xb)
        .map(|(&v, &r)| {
            let moves = bf((v as f64 * (1.0 + x_rel)) as f32) != r || bf((v as f64 * (1.0 - x_rel)) as f32) != r;
            if moves {
                1.01 * 2.0 * U * (v as f64).abs()
            } else {
                0.0
            }
        })
        .collect();
    // kernels/qmma.cu's kernels up to 32 rows never round a weight (each group is s * sum x q +
    // b * sum x, q exact); the other paths multiply the weight rounded to bf16.
    let exact_w = qmma_takes(&w.matrix, m) && !qdec_takes(&w.matrix, m);
    let wb: Vec<f64> = w.values.iter().map(|&v| if exact_w { v as f64 } else { bf(v) }).collect();
    let (mut exact, mut vs_cpu) = (Check::new("exact-operands"), Check::new("cpu-f32"));
    let gamma = k as f64 * F32_ADD;
    for t in 0..m {
        let (xr, xbr, xs) = (&xv[t * k..(t + 1) * k], &xb[t * k..(t + 1) * k], &x_step[t * k..(t + 1) * k]);
        for r in 0..n {
            let (wr, wbr) = (&w.values[r * k..(r + 1) * k], &wb[r * k..(r + 1) * k]);
            let (mut dot, mut abs_hat, mut abs, mut steps) = (0f64, 0f64, 0f64, 0f64);
            for c in 0..k {
                let p = xbr[c] * wbr[c];
                dot += p;
                abs_hat += p.abs();
                abs += (xr[c] as f64 * wr[c] as f64).abs();
                steps += xs[c] * wbr[c].abs();
            }
            let g = got[t * n + r];
            let at = || format!("row {t}, output {r}");
            exact.at(case, at, g, dot, steps + gamma * (abs_hat + steps) + 1e-30);
            let bound = (2.0 * U + U * U + x_rel) * abs + 2.0 * gamma * abs * (1.0 + 2.0 * U) + 1e-30;
            vs_cpu.at(case, at, g, cpu[t * n + r] as f64, bound);
        }
    }
    eprintln!(
        "RESULT {case:<64} err/bound: exact operands {:.3}, cpu f32 {:.3} (max |gpu - cpu| {:.3e})",
        exact.worst, vs_cpu.worst, vs_cpu.max_abs
    );
}

#[test]
fn linear_dense_all_dtypes() {
    let mut rng = Rng::new(21);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (k, n) in [(64usize, 48usize), (200, 77), (1024, 300)] {
            let w = dense(&mut rng, n, k, dtype);
            for m in [1usize, 8, 9, 37, 100] {
                check_linear(&format!("dense {dtype} k={k} n={n}"), &mut rng, &w, m);
            }
        }
    }
}

#[test]
fn linear_quantized_every_width_and_group() {
    let mut rng = Rng::new(22);
    let (k, n) = (384usize, 77usize);
    for bits in QuantSpec::AFFINE_BITS {
        for group in QuantSpec::AFFINE_GROUPS {
            for pdtype in [DType::F16, DType::BF16, DType::F32] {
                let w = quantized(&mut rng, n, k, bits, group, pdtype);
                for m in [2usize, 8, 9, 37] {
                    check_linear(&format!("q{bits} g{group} {pdtype} k={k} n={n}"), &mut rng, &w, m);
                }
            }
        }
    }
    // K not a multiple of 32: the one-value-per-thread decoder.
    for bits in [2usize, 4, 6, 8] {
        let w = quantized(&mut rng, 70, 48, bits, 16, DType::BF16);
        check_linear(&format!("q{bits} g16 bf16 k=48 n=70 (generic decoder)"), &mut rng, &w, 37);
    }
}

#[test]
fn batched_decode_products_on_the_tensor_cores() {
    // 2 to 64 rows run kernels/qmma.cu: up to 8 rows at f32 accuracy (x in two bf16 parts), 9 to
    // 32 with x in bf16 against the exact weights, 33 to 64 with the weights decoded to bf16 in
    // registers (bf16 scales). Over 4-bit weights kernels/qimma.cu takes 2 to 16 rows by default
    // (K a multiple of 128: the register kernels), with the weights decoded to bf16 and x in bf16
    // where the scales are bf16 (`qdec_takes`) and in integers at f32 accuracy (x in the integer
    // GEMVs' int8 parts) otherwise; in integers with NUVEC_QIMMA=int, 2 to 64 rows with
    // NUVEC_QIMMA=1 (8, 16 or 32 input rows per block, more in further blocks), none with
    // NUVEC_QIMMA=0 (`qimma_takes`). K cut into ranges (4096) or not, with a partial last chunk
    // (288); 65 and more rows take the prefill GEMM again. 4-bit weights with f16 scales (GGUF's
    // Q4_0) and f32 ones (its K-quants) take the bf16 register kernels from 9 rows, each weight
    // decoded in f32 and rounded to bf16.
    let dev = gpu();
    let mut rng = Rng::new(26);
    for (bits, group, k, n, pdtype) in [
        (4usize, 64usize, 4096usize, 1000usize, DType::BF16),
        (8, 32, 288, 136, DType::BF16),
        (4, 128, 1024, 300, DType::BF16),
        (4, 32, 4096, 1000, DType::F16),
        (4, 32, 1024, 300, DType::F32),
    ] {
        let w = quantized(&mut rng, n, k, bits, group, pdtype);
        let wg = w.matrix.to_device(dev).unwrap();
        for m in [2usize, 5, 8, 9, 16, 17, 33, 48, 64, 65] {
            check_linear(&format!("q{bits} g{group} {pdtype} k={k} n={n}"), &mut rng, &w, m);
        }
        // A row's bits do not depend on the rows beside it in one kernel: the first rows of 64,
        // 32, 16 or 8 equal the same rows alone.
        for (many, few) in [(64usize, 33usize), (32, 17), (16, 9), (8, 2)] {
            let xv = rng.vec(many * k, 1.0);
            let all = arr(&xv, &[many, k]).to_device(dev).unwrap().linear(&wg).unwrap().to_f32_vec().unwrap();
            let part = arr(&xv[..few * k], &[few, k]).to_device(dev).unwrap().linear(&wg).unwrap();
            assert_eq!(
                &all[..few * n],
                &part.to_f32_vec().unwrap()[..],
                "q{bits} g{group} {pdtype} k={k}: {few} of {many} rows"
            );
        }
    }
}

#[test]
fn batched_decode_products_of_many_tiles() {
    // A weight of 20 000 rows: enough blocks for the register kernels' two-tile forms
    // (`qdec_b4_r32_t2`, `_r64_t2`, which fill every multiprocessor here; the 1 000-row weights
    // above take one tile a block), over 17 to 64 rows, a partial last input tile included,
    // against the CPU.
    let mut rng = Rng::new(41);
    let w = quantized(&mut rng, 20_000, 4096, 4, 64, DType::BF16);
    for m in [17usize, 32, 33, 41, 64] {
        check_linear("q4 g64 bf16 k=4096 n=20000", &mut rng, &w, m);
    }
}

#[test]
fn linear_many_and_silu_mul_linear() {
    // The input converted once for several weights (q/k/v, gate/up), and the down projection of
    // silu(gate) * up made in bf16 in one pass; decode-sized calls stay f32.
    let dev = gpu();
    let mut rng = Rng::new(25);
    let k = 512;
    let ws = [
        quantized(&mut rng, 96, k, 4, 64, DType::BF16),
        quantized(&mut rng, 32, k, 8, 32, DType::F16),
        dense(&mut rng, 40, k, DType::BF16),
    ];
    let wg: Vec<Matrix> = ws.iter().map(|w| w.matrix.to_device(dev).unwrap()).collect();
    let wd = quantized(&mut rng, 64, k, 4, 32, DType::BF16);
    let wdg = wd.matrix.to_device(dev).unwrap();
    for m in [8usize, 9, 100] {
        let (xv, uv) = (rng.vec(m * k, 1.0), rng.vec(m * k, 1.0));
        let (x, u) = (arr(&xv, &[m, k]), arr(&uv, &[m, k]));
        let (xg, ug) = (x.to_device(dev).unwrap(), u.to_device(dev).unwrap());
        let got = xg.linear_many(&wg.iter().collect::<Vec<_>>()).unwrap();
        for (i, (g, w)) in got.iter().zip(&ws).enumerate() {
            assert_eq!((g.shape(), g.device()), (&[m, w.matrix.rows()][..], dev));
            let cpu = x.linear(&w.matrix).unwrap().to_f32_vec().unwrap();
            let case = format!("linear_many bf16 m={m} weight {i}");
            if (m <= 8 && !qdec_takes(&w.matrix, m)) || qimma_takes(&w.matrix, m) {
                close_f32(&case, &g.to_f32_vec().unwrap(), &cpu);
            } else {
                compare_linear(&case, &xv, 0.0, w, m, &g.to_f32_vec().unwrap(), &cpu);
            }
        }
        let got = xg.silu_mul_linear(&ug, &wdg).unwrap();
        assert_eq!((got.shape(), got.device()), (&[m, 64][..], dev));
        let cpu = x.silu_mul_linear(&u, &wd.matrix).unwrap().to_f32_vec().unwrap();
        let case = format!("silu_mul_linear bf16 m={m} q4 g32");
        if (m <= 8 && !qdec_takes(&wd.matrix, m)) || qimma_takes(&wd.matrix, m) {
            close_f32(&case, &got.to_f32_vec().unwrap(), &cpu);
        } else {
            // The GPU's silu (its expf) may differ from the host's by a few f32 ulps.
            let s: Vec<f32> = xv.iter().zip(&uv).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect();
            compare_linear(&case, &s, 1.0 / 1_048_576.0, &wd, m, &got.to_f32_vec().unwrap(), &cpu);
        }
    }
}

#[test]
fn products_over_inputs_their_producers_wrote_in_bf16() {
    // A batched step's norm and paged attention merge write their rows in the bf16 register
    // products' input form beside the f32 output, and silu(gate) * up goes straight into it: the
    // products over those give, bit for bit, what they give over the same f32 values uploaded
    // afresh (converted by the product itself).
    let dev = gpu();
    let mut rng = Rng::new(31);
    let fresh = |a: &Array| arr(&a.to_f32_vec().unwrap(), a.shape()).to_device(dev).unwrap();
    let same = |case: &str, got: &Array, want: &Array| {
        assert_eq!(
            got.to_f32_vec().unwrap(),
            want.to_f32_vec().unwrap(),
            "{case}: differs from the product over a fresh copy"
        );
    };
    let k = 1024;
    let w = quantized(&mut rng, 200, k, 4, 64, DType::BF16).matrix.to_device(dev).unwrap();
    let w2 = quantized(&mut rng, 136, k, 4, 64, DType::BF16).matrix.to_device(dev).unwrap();
    let half = quantized(&mut rng, 72, k / 2, 4, 64, DType::BF16).matrix.to_device(dev).unwrap();
    let norm_wv = rng.vec(k, 1.0);
    let norm_w = arr(&norm_wv, &[k]).to_device(dev).unwrap();
    for m in [2usize, 8, 13, 32, 33, 64] {
        let (ah, bh) = (arr(&rng.vec(m * k, 1.0), &[m, k]), arr(&rng.vec(m * k, 1.0), &[m, k]));
        let (a, b) = (ah.to_device(dev).unwrap(), bh.to_device(dev).unwrap());
        let (sum, normed) = a.add_rms_norm(&b, &norm_w, 1e-5).unwrap();
        // The norm itself (each row over several blocks) as the CPU's, to f32 rounding.
        let (cpu_sum, cpu_normed) = ah.add_rms_norm(&bh, &arr(&norm_wv, &[k]), 1e-5).unwrap();
        close_f32(&format!("add_rms_norm m={m} sum"), &sum.to_f32_vec().unwrap(), &cpu_sum.to_f32_vec().unwrap());
        close_f32(&format!("add_rms_norm m={m}"), &normed.to_f32_vec().unwrap(), &cpu_normed.to_f32_vec().unwrap());
        let got = normed.linear_many(&[&w, &w2]).unwrap();
        let want = fresh(&normed).linear_many(&[&w, &w2]).unwrap();
        same(&format!("norm m={m} weight 0"), &got[0], &want[0]);
        same(&format!("norm m={m} weight 1"), &got[1], &want[1]);
        // A reshape keeps the rows (and their tiles); rows of another length do not take them.
        let got = normed.reshape(&[1, m, k]).unwrap().linear(&w).unwrap();
        same(&format!("norm m={m} reshaped"), &got, &want[0].reshape(&[1, m, 200]).unwrap());
        if m <= 32 {
            let cut = normed.reshape(&[2 * m, k / 2]).unwrap();
            same(
                &format!("norm m={m} as rows of {}", k / 2),
                &cut.linear(&half).unwrap(),
                &fresh(&cut).linear(&half).unwrap(),
            );
        }
        let (g, u) = (a.clone(), b.clone());
        let got = g.silu_mul_linear(&u, &w).unwrap();
        let want = g.silu_mul(&u).unwrap().linear(&w).unwrap();
        same(&format!("silu_mul_linear m={m}"), &got, &want);
    }
    // The merge of a paged decode step (64 query heads of 64: rows of 4096).
    let (hq, hkv, d, bs, blocks) = (64usize, 8usize, 64usize, 16usize, 64usize);
    let lens: Vec<usize> = vec![1, 17, 300, 40, 5, 160, 64, 9, 2];
    let tables = common::scattered_tables(&lens, bs, blocks);
    let seqs: Vec<nuvec::PagedSeq> = tables.iter().zip(&lens).map(|(t, &len)| nuvec::PagedSeq::new(t, len)).collect();
    let q = arr(&rng.vec(lens.len() * hq * d, 2.0), &[lens.len(), hq, d]).to_device(dev).unwrap();
    let (kv, _) = floats(&rng.vec(blocks * bs * hkv * d, 1.0), &[1, blocks * bs, hkv * d], DType::BF16);
    let kv = kv.to_device(dev).unwrap();
    let wo = quantized(&mut rng, 128, hq * d, 4, 64, DType::BF16).matrix.to_device(dev).unwrap();
    let att = nuvec::paged_decode_attention(&q, &kv, &kv, &seqs, bs, 0.125, None).unwrap();
    let rows = att.reshape(&[lens.len(), hq * d]).unwrap();
    same("paged attention merge", &rows.linear(&wo).unwrap(), &fresh(&rows).linear(&wo).unwrap());
}

#[test]
fn linear_tiles_views_and_3d() {
    let dev = gpu();
    let mut rng = Rng::new(23);
    // Two bf16 tiles (of 8192 rows at K = 8192: TILE_BF16 is 64M values); a dense bf16 weight
    // multiplied as it is.
    let wq = quantized(&mut rng, 8500, 8192, 4, 64, DType::BF16);
    check_linear("q4 g64 bf16 k=8192 n=8500 (two tiles)", &mut rng, &wq, 37);
    let wb = dense(&mut rng, 4500, 4096, DType::BF16);
    check_linear("dense bf16 k=4096 n=4500", &mut rng, &wb, 37);
    // A 3-d input, and a view (rows 3..40 of a larger array), against the same 2-d product.
    let w = dense(&mut rng, 300, 256, DType::F32);
    let wg = w.matrix.to_device(dev).unwrap();
    let xv = rng.vec(2 * 37 * 256, 1.0);
    let flat = arr(&xv, &[74, 256]).to_device(dev).unwrap().linear(&wg).unwrap().to_f32_vec().unwrap();
    let x3 = arr(&xv, &[2, 37, 256]).to_device(dev).unwrap().linear(&wg).unwrap();
    assert_eq!(x3.shape(), &[2, 37, 300]);
    assert_eq!(x3.to_f32_vec().unwrap(), flat, "a 3-d input is its rows");
    // Same shape, same product: the view's rows give what a fresh array of them gives.
    let view = arr(&xv, &[74, 256]).to_device(dev).unwrap().slice_rows(3, 40).unwrap();
    let got = view.linear(&wg).unwrap().to_f32_vec().unwrap();
    let fresh = arr(&xv[3 * 256..40 * 256], &[37, 256]).to_device(dev).unwrap().linear(&wg).unwrap();
    assert_eq!(got, fresh.to_f32_vec().unwrap(), "a view of rows 3..40 gives those rows");
    eprintln!("RESULT {:<64} equal", "linear bf16 3-d input and view");
}

#[test]
fn decode_lane_equals_device_stream() {
    // Prefill weights are decoded to bf16 tiles on a second stream (the decode lane, the
    // default) while the device stream multiplies the tile before; decoding on the device stream
    // gives the same products bit for bit (same kernels, same GEMMs). Two weights of two tiles
    // each (8192 + 308 rows), twice over: the two slots are each reused three times, with GEMMs
    // long enough that a tile decoded into a slot a GEMM still reads, or a GEMM started before
    // its tile was decoded, would change the results.
    let dev = gpu();
    let mut rng = Rng::new(29);
    let ws: Vec<Matrix> =
        (0..2).map(|_| quantized(&mut rng, 8500, 8192, 4, 64, DType::BF16).matrix.to_device(dev).unwrap()).collect();
    let x = arr(&rng.vec(1024 * 8192, 1.0), &[1024, 8192]).to_device(dev).unwrap();
    let run = |on: bool| {
        set_decode_stream(on);
        let outs: Vec<Array> = ws.iter().chain(&ws).map(|w| x.linear(w).unwrap()).collect();
        outs.iter().map(|o| o.to_f32_vec().unwrap()).collect::<Vec<_>>()
    };
    let (lane, single) = (run(true), run(false));
    set_decode_stream(true);
    for (i, (a, b)) in lane.iter().zip(&single).enumerate() {
        assert!(a == b, "product {i}: the decode lane's result differs from the device stream's");
    }
    eprintln!("RESULT {:<64} equal", "linear bf16 decode lane vs device stream (4 products, 2 tiles each)");
}

/// Causal GQA attention on the host: the product of the bf16-rounded operands (probabilities
/// rounded after an f64 softmax) with its bound, and the bound against the CPU's f32 result.
/// With `flash` (the flash kernels, which round unnormalized probabilities) the probabilities
/// stay unrounded and each term is allowed one bf16 rounding.
#[allow(clippy::too_many_arguments)]
fn check_attention(
    flash: bool,
    case: &str,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: (usize, usize, usize, usize),
    cap: usize,
    kv: usize,
    scale: f32,
    got: &[f32],
    cpu: &[f32],
) {
    check_attention_masked(flash, case, q, k, v, dims, cap, kv, scale, (usize::MAX, None), got, cpu)
}

/// [`check_attention`] where query `t` sees only the `window` positions up to its own, with one
/// sink logit per head joining each softmax's denominator when given.
#[allow(clippy::too_many_arguments)]
fn check_attention_masked(
    flash: bool,
    case: &str,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: (usize, usize, usize, usize),
    cap: usize,
    kv: usize,
    scale: f32,
    (window, sinks): (usize, Option<&[f32]>),
    got: &[f32],
    cpu: &[f32],
) {
    let (l, hq, hkv, d) = dims;
    let group = hq / hkv;
    let (mut exact, mut vs_cpu) = (Check::new("exact-operands"), Check::new("cpu-f32"));
    let cpu_mean = cpu.iter().map(|v| v.abs() as f64).sum::<f64>() / cpu.len().max(1) as f64;
    let scale = scale as f64;
    for t in 0..l {
        let n = kv - l + t + 1;
        for h in 0..hq {
            let g = h / group;
            let qv = &q[(t * hq + h) * d..(t * hq + h + 1) * d];
            let key = |j: usize| &k[(g * cap + j) * d..(g * cap + j + 1) * d];
            let val = |j: usize| &v[(g * cap + j) * d..(g * cap + j + 1) * d];
            // Scores of the rounded operands, their f32 error bound, and the rounding's effect.
            let (mut s, mut ds, mut e_round, mut s_f) = (vec![0f64; n], 0f64, 0f64, vec![0f64; n]);
            // Keys before the window: out of the softmax (probability 0).
            let lo = n.saturating_sub(window);
            for j in 0..n {
                let kr = key(j);
                let (mut dot, mut abs, mut dot_f, mut abs_f) = (0f64, 0f64, 0f64, 0f64);
                for c in 0..d {
                    let p = bf(qv[c]) * bf(kr[c]);
                    dot += p;
                    abs += p.abs();
                    dot_f += qv[c] as f64 * kr[c] as f64;
                    abs_f += (qv[c] as f64 * kr[c] as f64).abs();
                }
                s[j] = scale * dot;
                s_f[j] = scale * dot_f;
                ds = ds.max(scale * abs * d as f64 * F32_ADD + s[j].abs() * F32_ADD);
                e_round = e_round.max(scale * abs_f * (2.0 * U + U * U));
                if j < lo {
                    (s[j], s_f[j]) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
                }
            }
            let sink = sinks.map(|s| s[h] as f64);
            let softmax = |s: &[f64]| {
                let m = s.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |z| (z - m).exp());
                e.into_iter().map(|x| x / sum).collect::<Vec<f64>>()
            };
            let (p, p_f) = (softmax(&s), softmax(&s_f));
            // The GPU's f32 probabilities are within dp (relative) of p: score errors, exp,
            // the sum over n keys, the division and the rounding to f32.
            let dp = (2.0 * ds).exp_m1() + (n as f64 + 16.0) * F32_ADD;
            let p_hat: Vec<f64> = p.iter().map(|&x| if flash { x } else { bf(x as f32) }).collect();
            let flips: Vec<bool> = p
                .iter()
                .zip(&p_hat)
                .map(|(&x, &r)| flash || bf((x * (1.0 + dp)) as f32) != r || bf((x * (1.0 - dp)) as f32) != r)
                .collect();
            // A flip costs one bf16 step (2u relative); a flash kernel's rounding at most u.
            let step = if flash { U } else { 2.0 * U };
            let grow = (2.0 * e_round).exp() * (1.0 + U) * (1.0 + U) - 1.0;
            for c in 0..d {
                let (mut out, mut flip_tol, mut abs, mut pv_f) = (0f64, 0f64, 0f64, 0f64);
                for j in 0..n {
                    let vb = bf(val(j)[c]);
                    out += p_hat[j] * vb;
                    abs += (p_hat[j] * vb).abs();
                    if flips[j] {
                        flip_tol += 1.01 * step * p[j] * vb.abs();
                    }
                    pv_f += p_f[j] * (val(j)[c] as f64).abs();
                }
                let i = (t * hq + h) * d + c;
                let at = || format!("query {t}, head {h}, feature {c}");
                exact.at(case, at, got[i], out, flip_tol + n as f64 * F32_ADD * abs + 1e-30);
                let cpu_err = F32_TOL as f64 * (cpu[i].abs() as f64 + cpu_mean);
                let bound = grow * pv_f + flip_tol + 2.0 * n as f64 * F32_ADD * abs + cpu_err;
                vs_cpu.at(case, at, got[i], cpu[i] as f64, bound);
            }
        }
    }
    eprintln!(
        "RESULT {case:<64} err/bound: exact operands {:.3}, cpu f32 {:.3} (max |gpu - cpu| {:.3e})",
        exact.worst, vs_cpu.worst, vs_cpu.max_abs
    );
}

#[test]
fn attention_prefill_bf16() {
    let dev = gpu();
    let mut rng = Rng::new(24);
    for (l, kv, hq, hkv, d) in [
        (64usize, 64usize, 4usize, 1usize, 64usize),
        (100, 357, 8, 2, 128),
        (300, 300, 2, 2, 256),
        (600, 600, 8, 2, 64), // three blocks of queries
        (70, 90, 4, 2, 30),   // a head size the f32 GEMM path does not take
        (77, 1000, 32, 8, 128),
        (37, 300, 8, 2, 128), // under 64 queries: the f32 split-key kernel
    ] {
        let cap = kv + 5;
        let (qv, kvv, vv) = (rng.vec(l * hq * d, 1.0), rng.vec(hkv * cap * d, 1.0), rng.vec(hkv * cap * d, 1.0));
        let (q, k, v) = (arr(&qv, &[l, hq, d]), arr(&kvv, &[hkv, cap, d]), arr(&vv, &[hkv, cap, d]));
        let scale = 1.0 / (d as f32).sqrt();
        let cpu = nuvec::attention(&q, &k, &v, kv, scale).unwrap().to_f32_vec().unwrap();
        let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
        let got = nuvec::attention(&qg, &kg, &vg, kv, scale).unwrap();
        assert_eq!((got.shape(), got.device()), (&[l, hq * d][..], dev));
        let got = got.to_f32_vec().unwrap();
        let case = format!("attention bf16 L={l} kv={kv} Hq={hq} Hkv={hkv} D={d}");
        if l < 64 {
            close_f32(&case, &got, &cpu);
        } else {
            // Head sizes 64 and 128 take the flash kernels (unless NUVEC_FLASH_ATTENTION=0; the
            // looser bound holds for the cuBLAS path too).
            let flash = d == 64 || d == 128;
            check_attention(flash, &case, &qv, &kvv, &vv, (l, hq, hkv, d), cap, kv, scale, &got, &cpu);
        }
    }
}

#[test]
fn windowed_attention_with_sinks_on_the_flash_kernels() {
    // gpt-oss's and Gemma 4's sliding layers in prefill: the flash kernels keep each query's
    // window (its first tiles skipped, the keys it has left masked) and start each row's softmax
    // from its head's sink; windows shorter and longer than a block of queries, of one position,
    // and chunks after earlier positions.
    let dev = gpu();
    let mut rng = Rng::new(27);
    for (l, kv, hq, hkv, d, window, with_sinks) in [
        (600usize, 600usize, 8usize, 2usize, 64usize, 128usize, true),
        (600, 600, 8, 2, 64, 128, false),
        (100, 357, 8, 2, 128, 128, true),
        (300, 300, 4, 2, 128, 1, false),
        (257, 400, 8, 1, 64, 30, true),
        (64, 64, 4, 1, 64, 8, true),
    ] {
        let cap = kv + 5;
        let (qv, kvv, vv) = (rng.vec(l * hq * d, 1.0), rng.vec(hkv * cap * d, 1.0), rng.vec(hkv * cap * d, 1.0));
        let (q, k, v) = (arr(&qv, &[l, hq, d]), arr(&kvv, &[hkv, cap, d]), arr(&vv, &[hkv, cap, d]));
        let scale = 1.0 / (d as f32).sqrt();
        let mut sink_logits = rng.vec(hq, 3.0);
        sink_logits[0] = 12.0; // dominates its head's softmax
        let sinks = with_sinks.then_some(&sink_logits[..]);
        let cpu = nuvec::attention_window(&q, &k, &v, kv, scale, window, sinks).unwrap().to_f32_vec().unwrap();
        let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
        let got = nuvec::attention_window(&qg, &kg, &vg, kv, scale, window, sinks).unwrap();
        assert_eq!((got.shape(), got.device()), (&[l, hq * d][..], dev));
        let got = got.to_f32_vec().unwrap();
        let case = format!("attention_window bf16 L={l} kv={kv} Hq={hq} D={d} w={window} sinks={with_sinks}");
        let masks = (window, sinks);
        check_attention_masked(true, &case, &qv, &kvv, &vv, (l, hq, hkv, d), cap, kv, scale, masks, &got, &cpu);
    }
}

#[test]
fn paged_decode_of_many_sequences_on_the_tensor_cores() {
    // 64 sequences of mixed lengths over a bf16 paged store (and an f16 one, a GGUF model's):
    // enough sequences that the step runs on the tensor cores (flash_attention.cu
    // `paged_flash_decode_{bf16,f16}_d*`), with q rounded to the store's type and each
    // probability rounded so before P V. Against the CPU kernel given the same rounded q, the
    // only difference allowed is the probabilities' rounding, at most u relative per term:
    // |gpu - cpu| <= u * max|v| (the weights sum to one), plus f32 slack.
    let dev = gpu();
    let mut rng = Rng::new(29);
    let halves = [DType::BF16, DType::F16].map(|dtype| PagedHalf { dtype });
    for ((hq, hkv, d, sinks), half) in [(32usize, 8usize, 128usize, false), (64, 8, 64, true)]
        .into_iter()
        .flat_map(|c| halves.iter().map(move |h| (c, h)))
    {
        let (bs, blocks) = (16usize, 160usize);
        let width = hkv * d;
        let lens: Vec<usize> = [1usize, 17, 300, 2100, 33, 550, 64, 1000].repeat(8);
        let whole = common::scattered_tables(&lens, bs, blocks);
        let qv: Vec<f32> = rng.vec(lens.len() * hq * d, 2.0).iter().map(|&x| half.round(x)).collect();
        let q = arr(&qv, &[lens.len(), hq, d]);
        let (k, _) = floats(&rng.vec(blocks * bs * width, 1.0), &[1, blocks * bs, width], half.dtype);
        let (v, vf) = floats(&rng.vec(blocks * bs * width, 1.0), &[1, blocks * bs, width], half.dtype);
        let sink_logits: Vec<f32> = (0..hq).map(|h| h as f32 * 0.25 - 2.0).collect();
        let sink = sinks.then_some(&sink_logits[..]);
        let scale = half.scale(d);
        // Every position, then sliding windows of 128 (gpt-oss's), the blocks before given back.
        for window in [None, Some(128usize)] {
            let tables = match window {
                Some(w) => common::windowed_tables(&whole, &lens, bs, w),
                None => whole.clone(),
            };
            let seqs: Vec<nuvec::PagedSeq> = tables
                .iter()
                .zip(&lens)
                .map(|(t, &len)| match window {
                    Some(w) => nuvec::PagedSeq::windowed(t, len, w),
                    None => nuvec::PagedSeq::new(t, len),
                })
                .collect();
            let want = nuvec::paged_decode_attention(&q, &k, &v, &seqs, bs, scale, sink).unwrap().to_f32_vec().unwrap();
            let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
            let got = nuvec::paged_decode_attention(&qg, &kg, &vg, &seqs, bs, scale, sink).unwrap();
            assert!(matches!(got.device(), Device::Cuda(_)));
            let got = got.to_f32_vec().unwrap();
            let vmax = vf.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
            let bound = half.u() * vmax + 1e-5;
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs() as f64).fold(0f64, f64::max);
            let case = format!(
                "paged decode of {} sequences, {} store, Hq={hq} Hkv={hkv} D={d} sinks={sinks} window={window:?}",
                lens.len(),
                half.dtype
            );
            eprintln!("RESULT {case}: max |gpu - cpu| {worst:.3e} = {:.3} of the bound", worst / bound);
            assert!(worst <= bound, "{case}: max error {worst:e} over the bound {bound:e}");
            // Not the f32 path: the rounding shows (else this test would not test the kernel).
            assert!(
                worst > half.rounding_shows(),
                "{case}: the GPU matched the CPU to {worst:e}; did the tensor-core kernel run?"
            );
        }
    }
}

#[test]
fn paged_decode_over_shared_prefixes() {
    // Sequences whose tables begin with the same blocks (as the prefix cache shares a system
    // prompt): groups of 20 sharing 640 keys (two tiles of the shared-keys kernel at four query
    // heads per KV head), 8 sharing 320, 4 sharing 128 (under the least shared keys: read alone),
    // and 16 sharing nothing, over a bf16 store and an f16 one. The step reads each group's keys
    // once (flash_attention.cu `paged_prefix_flash_{bf16,f16}_d*`) and each member's own keys after them; against the CPU with
    // the tensor-core decode's bound, and against the same step over a store where every
    // sequence has copies of its own (the reads unshared): equal within the bound, but not bit
    // for bit (the splits differ), so the shared path is the one that ran.
    let dev = gpu();
    let mut rng = Rng::new(41);
    let halves = [DType::BF16, DType::F16].map(|dtype| PagedHalf { dtype });
    for ((hq, hkv, d, sinks), half) in [(32usize, 8usize, 128usize, false), (64, 8, 64, true)]
        .into_iter()
        .flat_map(|c| halves.iter().map(move |h| (c, h)))
    {
        let bs = 16usize;
        let width = hkv * d;
        let mut lens = Vec::new();
        let mut tables: Vec<Vec<u32>> = Vec::new();
        let mut next = 0u32;
        let mut fresh = |count: usize| {
            let t: Vec<u32> = (next..next + count as u32).collect();
            next += count as u32;
            t
        };
        for (members, shared_blocks) in [(20usize, 40usize), (8, 20), (4, 8), (16, 0)] {
            let prefix = fresh(shared_blocks);
            for m in 0..members {
                let len = shared_blocks * bs + 1 + (m * 37) % 200;
                let mut table = prefix.clone();
                table.extend(fresh(len.div_ceil(bs) - shared_blocks));
                lens.push(len);
                tables.push(table);
            }
        }
        let blocks = next as usize;
        let seqs: Vec<nuvec::PagedSeq> =
            tables.iter().zip(&lens).map(|(t, &len)| nuvec::PagedSeq::new(t, len)).collect();
        let qv: Vec<f32> = rng.vec(lens.len() * hq * d, 2.0).iter().map(|&x| half.round(x)).collect();
        let q = arr(&qv, &[lens.len(), hq, d]);
        let (kf, vf) = (rng.vec(blocks * bs * width, 1.0), rng.vec(blocks * bs * width, 1.0));
        let (k, _) = floats(&kf, &[1, blocks * bs, width], half.dtype);
        let (v, vr) = floats(&vf, &[1, blocks * bs, width], half.dtype);
        let sink_logits: Vec<f32> = (0..hq).map(|h| h as f32 * 0.25 - 2.0).collect();
        let sink = sinks.then_some(&sink_logits[..]);
        let scale = half.scale(d);
        let want = nuvec::paged_decode_attention(&q, &k, &v, &seqs, bs, scale, sink).unwrap().to_f32_vec().unwrap();
        let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
        let got = nuvec::paged_decode_attention(&qg, &kg, &vg, &seqs, bs, scale, sink).unwrap().to_f32_vec().unwrap();
        // Every sequence with blocks of its own: each block's rows copied to a fresh block.
        let mut own_tables = Vec::new();
        let (mut kc, mut vc) = (Vec::new(), Vec::new());
        for t in &tables {
            let mut own = Vec::new();
            for &b in t {
                own.push((kc.len() / (bs * width)) as u32);
                kc.extend_from_slice(&kf[b as usize * bs * width..][..bs * width]);
                vc.extend_from_slice(&vf[b as usize * bs * width..][..bs * width]);
            }
            own_tables.push(own);
        }
        let copies = kc.len() / width;
        let (kc, _) = floats(&kc, &[1, copies, width], half.dtype);
        let (vc, _) = floats(&vc, &[1, copies, width], half.dtype);
        let own_seqs: Vec<nuvec::PagedSeq> =
            own_tables.iter().zip(&lens).map(|(t, &len)| nuvec::PagedSeq::new(t, len)).collect();
        let (kc, vc) = (kc.to_device(dev).unwrap(), vc.to_device(dev).unwrap());
        let alone =
            nuvec::paged_decode_attention(&qg, &kc, &vc, &own_seqs, bs, scale, sink).unwrap().to_f32_vec().unwrap();
        let vmax = vr.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
        let bound = half.u() * vmax + 1e-5;
        let worst = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).fold(0f64, f64::max);
        let case =
            format!("paged decode over shared prefixes, {} store, Hq={hq} Hkv={hkv} D={d} sinks={sinks}", half.dtype);
        let (vs_cpu, vs_alone) = (worst(&got, &want), worst(&got, &alone));
        eprintln!("RESULT {case}: max |gpu - cpu| {vs_cpu:.3e}, |shared - unshared| {vs_alone:.3e}, bound {bound:.3e}");
        assert!(vs_cpu <= bound, "{case}: max error {vs_cpu:e} over the bound {bound:e}");
        assert!(vs_alone <= bound, "{case}: shared and unshared reads differ by {vs_alone:e} (bound {bound:e})");
        assert!(vs_alone > 0.0, "{case}: bit for bit the unshared step; did the shared-keys kernel run?");
    }
}
