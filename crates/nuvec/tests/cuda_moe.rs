//! Mixture-of-experts ops on CUDA against the CPU backend's composed ops (the reference):
//! `moe_route` (softmax-top-k with and without renormalizing, top-k-softmax: the same experts in
//! the same order, weights within the tolerance; `moe_route_bias` also bit for bit what
//! `add_bias` then `moe_route` give on the GPU), `moe_route_linear` (the router's product with the
//! choice: f32, bf16 and f16 routers, with a bias, at 1 to 9 rows, and reading a norm's output
//! whose scale is still pending) and `moe_experts` over experts in every format
//! the device kernels take (affine 3/4/8 bits with f32/f16/bf16 scales, dense f32/bf16, mxfp4,
//! nvfp4 with a global scale, mxfp8), SiLU, gpt-oss's clamped SwiGLU with bias rows and Gemma 4's
//! GELU with per-expert output scales, at 1 to
//! 64 rows (the gathered kernels; 4-bit experts in groups of 32 and more on int8 dot products
//! below 8 rows) and 80 (each expert over its rows, products in f32); and a
//! shared expert added under its sigmoid gate (`add_sigmoid_gated`).
//!
//! Needs a CUDA device: without one every test FAILS, saying so. Built only with
//! `--features cuda`. Tolerance as tests/cuda_ops.rs.

#![cfg(feature = "cuda")]

use nuvec::backends::cuda::MatmulPrecision;
use nuvec::fpquant::quantize_fp;
use nuvec::{Array, DType, ExpertActivation, Experts, Matrix, MoeRouting, QuantMode, QuantSpec, Quantized};

mod common;
use common::{close, floats, randoms, Rng};

/// The device under test, with every product in f32 (the composed path's per-expert products
/// included), as the comparisons are at f32 rounding.
fn gpu() -> nuvec::Device {
    common::gpu_with(MatmulPrecision::F32)
}

/// A random `[rows, cols]` matrix in `format`: "q{bits}g{group}" with scales of `dtype`,
/// "dense" of `dtype`, or an fp mode's name ("nvfp4*" with a global scale).
fn matrix(format: &str, rows: usize, cols: usize, dtype: DType, rng: &mut Rng) -> Matrix {
    let values = rng.vec(rows * cols, 0.3);
    if format == "dense" {
        return Matrix::Dense(floats(&values, &[rows, cols], dtype));
    }
    if let Some(spec) = format.strip_prefix('q') {
        let (bits, group) = spec.split_once('g').unwrap();
        let spec =
            QuantSpec { mode: QuantMode::Affine, bits: bits.parse().unwrap(), group_size: group.parse().unwrap() };
        return Matrix::Quantized(nuvec::quantize::quantize_affine(&values, rows, cols, spec, dtype).unwrap());
    }
    let global = format.ends_with('*').then_some(2.5);
    let mode = QuantMode::parse(format.trim_end_matches('*')).unwrap();
    let (bits, group_size) = mode.fixed_shape().unwrap();
    let spec = QuantSpec { mode, bits, group_size };
    let q = quantize_fp(&values, rows, cols, spec).unwrap();
    Matrix::Quantized(Quantized::new_fp(q.packed, q.scales, global, spec, cols).unwrap())
}

/// `n` experts of `hidden` x `inter` in `format`, with bias rows when `biased`, and their copy
/// on the GPU.
fn experts(
    format: &str,
    dtype: DType,
    n: usize,
    hidden: usize,
    inter: usize,
    act: ExpertActivation,
    biased: bool,
) -> (Experts, Experts) {
    let mut rng = Rng::new(n as u64 + hidden as u64);
    let mut parts: [Vec<Matrix>; 3] = Default::default();
    let mut biases: [Vec<Array>; 3] = Default::default();
    for _ in 0..n {
        for (p, (r, c)) in [(inter, hidden), (inter, hidden), (hidden, inter)].into_iter().enumerate() {
            parts[p].push(matrix(format, r, c, dtype, &mut rng));
            biases[p].push(floats(&rng.vec(r, 0.5), &[r], DType::BF16));
        }
    }
    let dev = gpu();
    let moved = |ms: &[Matrix]| ms.iter().map(|m| m.to_device(dev).unwrap()).collect::<Vec<_>>();
    let moved_b = |bs: &[Array]| bs.iter().map(|b| b.to_device(dev).unwrap()).collect::<Vec<_>>();
    let gpu_biases = biased.then(|| [moved_b(&biases[0]), moved_b(&biases[1]), moved_b(&biases[2])]);
    let mut on_gpu = Experts::new(moved(&parts[0]), moved(&parts[1]), moved(&parts[2]), gpu_biases, act).unwrap();
    let [g, u, d] = parts;
    let mut cpu = Experts::new(g, u, d, biased.then_some(biases), act).unwrap();
    if act == ExpertActivation::GeluApprox {
        // Gemma 4's per-expert scales on the routing weights.
        let scales: Vec<f32> = (0..n).map(|e| 0.5 + 0.25 * e as f32).collect();
        cpu = cpu.with_output_scales(scales.clone()).unwrap();
        on_gpu = on_gpu.with_output_scales(scales).unwrap();
    }
    assert!(on_gpu.index().is_some(), "{format}: the device kernels should take these experts");
    (cpu, on_gpu)
}

#[test]
fn moe_route_matches_the_cpu() {
    let dev = gpu();
    for (experts, top_k, routing) in [
        (128, 8, MoeRouting::SoftmaxTopK { normalize: true }),
        (60, 4, MoeRouting::SoftmaxTopK { normalize: false }),
        (32, 4, MoeRouting::TopKSoftmax),
        (512, 10, MoeRouting::SoftmaxTopK { normalize: true }),
    ] {
        for rows in [1usize, 7, 300] {
            let logits = Array::from_slice(&randoms(rows * experts, rows as u64, 3.0), &[rows, experts]).unwrap();
            let (want_ids, want_w) = logits.moe_route(top_k, routing).unwrap();
            let (ids, w) = logits.to_device(dev).unwrap().moe_route(top_k, routing).unwrap();
            let case = format!("moe_route {experts} experts top {top_k} {routing:?} rows {rows}");
            assert_eq!(ids.to_vec::<u32>().unwrap(), want_ids.to_vec::<u32>().unwrap(), "{case}: ids");
            close(&case, &w, &want_w);
            // A router's bias row (gpt-oss), added in the routing launch: what add_bias then
            // routing gives, on the GPU bit for bit and against the CPU.
            for dtype in [DType::F32, DType::BF16] {
                let bias = floats(&randoms(experts, 7 + rows as u64, 2.0), &[experts], dtype);
                let (want_ids, want_w) = logits.moe_route_bias(&bias, top_k, routing).unwrap();
                let (lg, bg) = (logits.to_device(dev).unwrap(), bias.to_device(dev).unwrap());
                let (ids, w) = lg.moe_route_bias(&bg, top_k, routing).unwrap();
                let (cids, cw) = lg.add_bias(&bg).unwrap().moe_route(top_k, routing).unwrap();
                let case = format!("{case} with a {dtype} bias");
                assert_eq!(ids.to_vec::<u32>().unwrap(), want_ids.to_vec::<u32>().unwrap(), "{case}: ids");
                assert_eq!(ids.to_vec::<u32>().unwrap(), cids.to_vec::<u32>().unwrap(), "{case}: ids, composed");
                assert_eq!(w.to_vec::<f32>().unwrap(), cw.to_vec::<f32>().unwrap(), "{case}: weights, composed");
                close(&case, &w, &want_w);
            }
        }
    }
    let logits = Array::from_slice(&randoms(32, 1, 3.0), &[1, 32]).unwrap().to_device(dev).unwrap();
    let short = floats(&randoms(31, 2, 1.0), &[31], DType::F32).to_device(dev).unwrap();
    assert!(logits.moe_route_bias(&short, 4, MoeRouting::TopKSoftmax).is_err(), "a bias of 31 for 32 experts");
}

#[test]
fn moe_route_linear_matches_the_cpu() {
    // The router's product and choice in one launch (moe_route_dense: up to 8 rows of a plain
    // float router) and past it (9 rows: the product, then moe_route): the experts the CPU's
    // product then moe_route choose, in order, weights within the tolerance.
    let dev = gpu();
    let mut rng = Rng::new(41);
    let cases = [
        (128, 2048, 8, MoeRouting::SoftmaxTopK { normalize: true }, false),
        (32, 2880, 4, MoeRouting::TopKSoftmax, true),
        (60, 136, 4, MoeRouting::SoftmaxTopK { normalize: false }, false),
    ];
    for (experts, hidden, top_k, routing, biased) in cases {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let router = Matrix::Dense(floats(&rng.vec(experts * hidden, 0.05), &[experts, hidden], dtype));
            let bias = biased.then(|| floats(&rng.vec(experts, 1.0), &[experts], DType::F32));
            let (rg, bg) = (router.to_device(dev).unwrap(), bias.as_ref().map(|b| b.to_device(dev).unwrap()));
            for rows in [1usize, 3, 8, 9] {
                let x = Array::from_slice(&rng.vec(rows * hidden, 1.0), &[rows, hidden]).unwrap();
                let (want_ids, want_w) = x.moe_route_linear(&router, bias.as_ref(), top_k, routing).unwrap();
                let xg = x.to_device(dev).unwrap();
                let (ids, w) = xg.moe_route_linear(&rg, bg.as_ref(), top_k, routing).unwrap();
                let case = format!(
                    "moe_route_linear {experts} experts of {hidden} {dtype} top {top_k} {routing:?} rows {rows}"
                );
                assert_eq!(ids.to_vec::<u32>().unwrap(), want_ids.to_vec::<u32>().unwrap(), "{case}: ids");
                close(&case, &w, &want_w);
            }
        }
    }
    // A router reading a norm whose scale is still pending (a decode step's o projection folded
    // with the residual add and the norm): the kernel applies the scale to the logits.
    let (n, k) = (2048, 2048);
    let w = matrix("q4g64", n, k, DType::BF16, &mut rng).to_device(dev).unwrap();
    let g = |v: Vec<f32>, shape: &[usize]| Array::from_slice(&v, shape).unwrap().to_device(dev).unwrap();
    let (x, res, nw) = (g(rng.vec(k, 1.0), &[1, k]), g(rng.vec(n, 1.0), &[1, n]), g(rng.vec(n, 1.0), &[n]));
    let router = Matrix::Dense(floats(&rng.vec(128 * n, 0.05), &[128, n], DType::F32));
    let routing = MoeRouting::SoftmaxTopK { normalize: true };
    let (_, normed) = x.linear_add_rms_norm(&w, &res, &nw, 1e-5).unwrap();
    let (ids, wts) = normed.moe_route_linear(&router.to_device(dev).unwrap(), None, 8, routing).unwrap();
    let settled = normed.to_device(nuvec::Device::Cpu).unwrap();
    let (want_ids, want_w) = settled.moe_route_linear(&router, None, 8, routing).unwrap();
    let case = "moe_route_linear of a pending norm";
    assert_eq!(ids.to_vec::<u32>().unwrap(), want_ids.to_vec::<u32>().unwrap(), "{case}: ids");
    close(case, &wts, &want_w);
}

#[test]
fn moe_experts_match_the_cpu() {
    let dev = gpu();
    let (hidden, inter, n, top_k) = (256usize, 128usize, 8usize, 3usize);
    let silu = ExpertActivation::Silu;
    let oai = ExpertActivation::SwigluOai { alpha: 1.702, limit: 7.0 };
    for (format, dtype, act, biased) in [
        ("q4g64", DType::BF16, silu, false),
        ("q4g32", DType::F16, oai, true),
        ("q3g128", DType::F32, silu, false),
        ("q8g64", DType::BF16, silu, true),
        ("dense", DType::BF16, silu, false),
        ("dense", DType::F32, oai, true),
        ("mxfp4", DType::BF16, oai, true),
        ("nvfp4*", DType::BF16, silu, false),
        ("mxfp8", DType::BF16, silu, false),
        ("q4g64", DType::BF16, ExpertActivation::GeluApprox, false),
        ("q4g128", DType::F32, silu, true),
    ] {
        let (cpu, on_gpu) = experts(format, dtype, n, hidden, inter, act, biased);
        for rows in [1usize, 5, 16, 64, 80] {
            let x = Array::from_slice(&randoms(rows * hidden, rows as u64 + 9, 1.0), &[rows, hidden]).unwrap();
            let logits = Array::from_slice(&randoms(rows * n, rows as u64, 2.0), &[rows, n]).unwrap();
            let (ids, w) = logits.moe_route(top_k, MoeRouting::SoftmaxTopK { normalize: true }).unwrap();
            let want = x.moe_experts(&cpu, &ids, &w).unwrap();
            let (xg, ig, wg) = (x.to_device(dev).unwrap(), ids.to_device(dev).unwrap(), w.to_device(dev).unwrap());
            let got = xg.moe_experts(&on_gpu, &ig, &wg).unwrap();
            close(&format!("moe_experts {format} {dtype} {act:?} biases {biased} rows {rows}"), &got, &want);
        }
    }
}

#[test]
fn add_sigmoid_gated_matches_the_cpu() {
    let dev = gpu();
    for (rows, width) in [(1usize, 256usize), (7, 100)] {
        let a = Array::from_slice(&randoms(rows * width, 1, 1.0), &[rows, width]).unwrap();
        let b = Array::from_slice(&randoms(rows * width, 2, 1.0), &[rows, width]).unwrap();
        let gate = Array::from_slice(&randoms(rows, 3, 4.0), &[rows, 1]).unwrap();
        let want = a.add_sigmoid_gated(&b, &gate).unwrap();
        let moved = |x: &Array| x.to_device(dev).unwrap();
        let got = moved(&a).add_sigmoid_gated(&moved(&b), &moved(&gate)).unwrap();
        close(&format!("add_sigmoid_gated rows {rows} width {width}"), &got, &want);
    }
}
