//! Mixture-of-experts layers of many rows (a prefill) on the grouped tensor-core products: the
//! slots sorted by expert on the device, each tile of 64 one product with its expert's weights
//! decoded to bf16 (kernels/qmma.cu's `qmma_bN_g64`, `qmma_fp4_g64`, `qmma_bN_g64s`), for 4- and
//! 8-bit affine experts with bf16 scales, f32 ones (a GGUF's: each weight decoded in f32, then
//! rounded once) and mxfp4 ones (gpt-oss's), SiLU and gpt-oss's clamped SwiGLU with
//! bias rows, with one expert given several tiles of slots and others none.
//!
//! Checked against the product of the operands rounded as the path rounds them (x, each decoded
//! weight and each activation to bf16), computed on the host in f64. The bound comes from the
//! arithmetic: each gate/up sum may differ by its f32 accumulation (`K 2^-23 sum|x w|`), which
//! moves the activation by at most what it moves between the corners of that box, and the
//! activation's bf16 rounding may then land on the neighbouring step (2^-7 relative); the down
//! sums and the weighted sum add their own f32 accumulation. And a row's result does not depend
//! on the rows beside it: the first rows of a larger call give the same bits as a call of those
//! rows alone (their slots sit in other tiles and places).
//!
//! Needs a CUDA device: without one every test FAILS, saying so. Built only with
//! `--features cuda`; the process runs in `MatmulPrecision::Bf16`.

#![cfg(feature = "cuda")]

use half::bf16;
use nuvec::backends::cuda::MatmulPrecision;
use nuvec::{Array, DType, ExpertActivation, Experts, Matrix, QuantMode, QuantSpec, Quantized};

mod common;
use common::Rng;

const F32_ADD: f64 = 1.0 / 8_388_608.0;

fn bf(v: f64) -> f64 {
    bf16::from_f64(v).to_f64()
}

/// A random mxfp4 `[rows, cols]` weight (scales 2^-9 .. 2^-1) and its values (a code's e2m1 value
/// times its group's power of two: exact in bf16).
fn mxfp4_weight(rng: &mut Rng, rows: usize, cols: usize) -> (Matrix, Vec<f64>) {
    const E2M1: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let packed: Vec<u32> = (0..rows * cols / 8).map(|_| rng.next_u32()).collect();
    let scales: Vec<u8> = (0..rows * cols / 32).map(|_| 118 + (rng.next_u32() % 9) as u8).collect();
    let values = (0..rows * cols)
        .map(|i| {
            let code = (packed[i / 8] >> (4 * (i % 8))) & 15;
            let sign = if code & 8 != 0 { -1.0 } else { 1.0 };
            sign * E2M1[(code & 7) as usize] * 2f64.powi(scales[i / 32] as i32 - 127)
        })
        .collect();
    let spec = QuantSpec { mode: QuantMode::Mxfp4, bits: 4, group_size: 32 };
    let q = Quantized::new_fp(
        Array::from_slice(&packed, &[rows, cols / 8]).unwrap(),
        Array::from_slice(&scales, &[rows, cols / 32]).unwrap(),
        None,
        spec,
        cols,
    )
    .unwrap();
    (Matrix::Quantized(q), values)
}

/// A random `[rows, cols]` weight of `bits` (0: mxfp4; else affine in groups of `group` with bf16
/// scales, or f32 ones with `f32_scales`, as a GGUF's) and its values as the grouped kernels
/// decode them (affine: `s q + b` rounded once to bf16; over f32 scales, f32's fma first).
fn weight(rng: &mut Rng, rows: usize, cols: usize, bits: usize, group: usize, f32_scales: bool) -> (Matrix, Vec<f64>) {
    if bits == 0 {
        return mxfp4_weight(rng, rows, cols);
    }
    let words = cols * bits / 32;
    let packed: Vec<u32> = (0..rows * words).map(|_| rng.next_u32()).collect();
    let groups = cols / group;
    let stored = |v: Vec<f32>| -> Vec<f32> {
        if f32_scales {
            v
        } else {
            v.into_iter().map(|x| bf16::from_f32(x).to_f32()).collect()
        }
    };
    let s = stored(rng.vec(rows * groups, 0.05 * 16.0 / (1 << bits) as f32));
    let b = stored(rng.vec(rows * groups, 0.1));
    let mut values = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let bit = c * bits;
            let (lo, hi) =
                (packed[r * words + bit / 32] as u64, packed.get(r * words + bit / 32 + 1).copied().unwrap_or(0));
            let q = ((((hi as u64) << 32) | lo) >> (bit % 32)) & ((1 << bits) - 1);
            let g = r * groups + c / group;
            values.push(if f32_scales {
                bf16::from_f32(s[g].mul_add(q as f32, b[g])).to_f64()
            } else {
                bf(s[g] as f64 * q as f64 + b[g] as f64)
            });
        }
    }
    let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
    let params = |v: &[f32]| {
        if f32_scales {
            Array::from_slice(v, &[rows, groups]).unwrap()
        } else {
            let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
            Array::from_slice(&h, &[rows, groups]).unwrap()
        }
    };
    let q = Quantized::new(Array::from_slice(&packed, &[rows, words]).unwrap(), params(&s), params(&b), spec, cols)
        .unwrap();
    (Matrix::Quantized(q), values)
}

fn activate(act: ExpertActivation, g: f64, u: f64) -> f64 {
    match act {
        ExpertActivation::Silu => g / (1.0 + (-g).exp()) * u,
        ExpertActivation::SwigluOai { alpha, limit } => {
            let (alpha, limit) = (alpha as f64, limit as f64);
            let (gc, uc) = (g.min(limit), u.clamp(-limit, limit));
            (uc + 1.0) * gc / (1.0 + (-alpha * gc).exp())
        }
        ExpertActivation::GeluApprox => unreachable!("not a case here"),
    }
}

/// One layer's experts on the GPU and, per projection and expert, the decoded values and the
/// bias rows (bf16 values; zeros without biases).
struct Layer {
    experts: Experts,
    values: [Vec<Vec<f64>>; 3],
    biases: [Vec<Vec<f64>>; 3],
}

fn layer(
    n: usize,
    hidden: usize,
    inter: usize,
    (bits, group, f32_scales): (usize, usize, bool),
    act: ExpertActivation,
    biased: bool,
) -> Layer {
    let dev = common::gpu_with(MatmulPrecision::Bf16);
    let mut rng = Rng::new((bits * 100 + group + f32_scales as usize) as u64);
    let mut mats: [Vec<Matrix>; 3] = Default::default();
    let mut rows: [Vec<Array>; 3] = Default::default();
    let mut values: [Vec<Vec<f64>>; 3] = Default::default();
    let mut biases: [Vec<Vec<f64>>; 3] = Default::default();
    for p in 0..3 {
        let (r, c) = if p < 2 { (inter, hidden) } else { (hidden, inter) };
        for _ in 0..n {
            let (m, v) = weight(&mut rng, r, c, bits, group, f32_scales);
            mats[p].push(m.to_device(dev).unwrap());
            values[p].push(v);
            let b: Vec<bf16> = rng.vec(r, if biased { 0.5 } else { 0.0 }).into_iter().map(bf16::from_f32).collect();
            biases[p].push(b.iter().map(|v| v.to_f64()).collect());
            rows[p].push(Array::from_slice(&b, &[r]).unwrap().to_device(dev).unwrap());
        }
    }
    let [g, u, d] = mats;
    let experts = Experts::new(g, u, d, biased.then_some(rows), act).unwrap();
    assert!(experts.index().is_some(), "the device kernels should take these experts");
    Layer { experts, values, biases }
}

/// The expected output of `rows` tokens and each element's bound (see the file's note).
fn reference(l: &Layer, x: &[f32], ids: &[u32], w: &[f32], top_k: usize) -> (Vec<f64>, Vec<f64>) {
    let (hidden, inter, act) = (l.experts.hidden(), l.experts.intermediate(), l.experts.activation());
    let rows = x.len() / hidden;
    let (mut want, mut bound) = (vec![0f64; rows * hidden], vec![0f64; rows * hidden]);
    for t in 0..rows {
        let xb: Vec<f64> = x[t * hidden..(t + 1) * hidden].iter().map(|&v| bf(v as f64)).collect();
        for j in 0..top_k {
            let (e, wt) = (ids[t * top_k + j] as usize, w[t * top_k + j] as f64);
            let (mut a, mut da) = (vec![0f64; inter], vec![0f64; inter]);
            for r in 0..inter {
                let mut sums = [0f64; 2];
                let mut abs = 0f64;
                for (p, s) in sums.iter_mut().enumerate() {
                    let row = &l.values[p][e][r * hidden..(r + 1) * hidden];
                    *s = row.iter().zip(&xb).map(|(a, b)| a * b).sum::<f64>() + l.biases[p][e][r];
                    abs += row.iter().zip(&xb).map(|(a, b)| (a * b).abs()).sum::<f64>();
                }
                let eps = (hidden as f64 + 1.0) * F32_ADD * abs;
                let exact = activate(act, sums[0], sums[1]);
                let moved = [(-1.0, -1.0), (-1.0, 1.0), (1.0, -1.0), (1.0, 1.0)]
                    .iter()
                    .map(|(sg, su)| (activate(act, sums[0] + sg * eps, sums[1] + su * eps) - exact).abs())
                    .fold(0f64, f64::max);
                a[r] = bf(exact);
                da[r] = 1.01 * moved + (exact.abs() + moved) / 128.0;
            }
            for r in 0..hidden {
                let row = &l.values[2][e][r * inter..(r + 1) * inter];
                let y: f64 = row.iter().zip(&a).map(|(w, a)| w * a).sum::<f64>() + l.biases[2][e][r];
                let abs: f64 = row.iter().zip(&a).map(|(w, a)| (w * a).abs()).sum();
                let spread: f64 = row.iter().zip(&da).map(|(w, d)| w.abs() * d).sum();
                want[t * hidden + r] += wt * y;
                bound[t * hidden + r] += wt.abs()
                    * (spread
                        + (inter as f64 + 1.0) * F32_ADD * (abs + spread)
                        + (top_k as f64 + 1.0) * F32_ADD * y.abs());
            }
        }
    }
    (want, bound)
}

/// `rows` tokens' choices: most tokens' first choice is expert 0 (so it gets several tiles of
/// slots), the rest spread, never expert `n - 1` (which gets none).
fn routes(rng: &mut Rng, rows: usize, n: usize, top_k: usize) -> (Vec<u32>, Vec<f32>) {
    let (mut ids, mut w) = (vec![], vec![]);
    for _ in 0..rows {
        let mut picked: Vec<u32> = vec![];
        while picked.len() < top_k {
            let e = if picked.is_empty() && !rng.next_u32().is_multiple_of(8) {
                0
            } else {
                rng.next_u32() % (n as u32 - 1)
            };
            if !picked.contains(&e) {
                picked.push(e);
            }
        }
        ids.extend(&picked);
        w.extend((0..top_k).map(|j| 0.6 - 0.2 * j as f32 + 0.05 * rng.f()));
    }
    (ids, w)
}

fn run(l: &Layer, x: &[f32], ids: &[u32], w: &[f32], top_k: usize) -> Vec<f32> {
    let dev = common::gpu_with(MatmulPrecision::Bf16);
    let rows = x.len() / l.experts.hidden();
    let xg = Array::from_slice(x, &[rows, l.experts.hidden()]).unwrap().to_device(dev).unwrap();
    let ig = Array::from_slice(ids, &[rows, top_k]).unwrap().to_device(dev).unwrap();
    let wg = Array::from_slice(w, &[rows, top_k]).unwrap().to_device(dev).unwrap();
    let out = xg.moe_experts(&l.experts, &ig, &wg).unwrap();
    assert_eq!((out.shape(), out.dtype(), out.device()), (&[rows, l.experts.hidden()][..], DType::F32, dev));
    out.to_vec::<f32>().unwrap()
}

#[test]
fn grouped_experts_match_the_rounded_product() {
    let (n, hidden, inter, top_k) = (8usize, 256usize, 192usize, 2usize);
    let oai = ExpertActivation::SwigluOai { alpha: 1.702, limit: 7.0 };
    // The last two: f32 scales, as a GGUF's Q4_0 / Q8_0 experts (the `s` kernels).
    let cases = [
        (4, 64, ExpertActivation::Silu, false, false),
        (8, 32, oai, true, false),
        (0, 32, oai, true, false),
        (4, 32, ExpertActivation::Silu, false, true),
        (8, 32, ExpertActivation::Silu, true, true),
    ];
    for (bits, group, act, biased, f32_scales) in cases {
        let l = layer(n, hidden, inter, (bits, group, f32_scales), act, biased);
        let mut rng = Rng::new(bits as u64);
        let rows = 300;
        let x = rng.vec(rows * hidden, 1.0);
        let (ids, w) = routes(&mut rng, rows, n, top_k);
        let got = run(&l, &x, &ids, &w, top_k);
        let (want, bound) = reference(&l, &x, &ids, &w, top_k);
        let case = if bits == 0 {
            format!("mxfp4 {act:?} biases {biased}")
        } else {
            format!("q{bits} g{group} {act:?} biases {biased} f32 scales {f32_scales}")
        };
        let mut worst = 0f64;
        for (i, ((&g, &e), &b)) in got.iter().zip(&want).zip(&bound).enumerate() {
            let err = (g as f64 - e).abs();
            assert!(
                err <= b + 1e-30,
                "{case}: row {}, output {}: gpu {g} vs {e} (error {err:.3e} > bound {b:.3e})",
                i / hidden,
                i % hidden
            );
            worst = worst.max(err / (b + 1e-30));
        }
        eprintln!("RESULT grouped {case:<56} err/bound {worst:.3}");
        // The first 65 rows alone (still grouped: more than the gathered kernels' 64) give the
        // same bits.
        let few = 65;
        let alone = run(&l, &x[..few * hidden], &ids[..few * top_k], &w[..few * top_k], top_k);
        for (i, (a, b)) in alone.iter().zip(&got).enumerate() {
            assert!(
                a.to_bits() == b.to_bits(),
                "{case}: row {} output {}: {a} alone vs {b} among {rows} rows",
                i / hidden,
                i % hidden
            );
        }
    }
}
