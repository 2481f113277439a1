//! Every CUDA op against the CPU backend (the reference) on random inputs.
//!
//! Needs a CUDA device: without one every test FAILS, saying so (it never passes silently). It is
//! built only with `--features cuda`, so the default CPU test run does not include it.
//!
//! Tolerance: float results must satisfy `|gpu - cpu| <= TOL * (|cpu| + mean|cpu|)` per element
//! with `TOL = 1e-4` (f32 arithmetic in another order: SGEMM, warp reductions, fused
//! multiply-adds); copies, integer results and exact ops must match bit for bit. Each case prints
//! a `RESULT` line with its largest absolute and relative error (run with `--nocapture`).
//!
//! These comparisons are at f32 rounding, so the process runs the prefill products in f32
//! (`set_matmul_precision(F32)`; the default, `Auto`, takes bf16 for half-precision weights and
//! models). The bf16 paths: tests/cuda_bf16.rs; `Auto`'s choices: tests/cuda_auto_precision.rs.

#![cfg(feature = "cuda")]

use nuvec::backends::cuda::{set_matmul_precision, MatmulPrecision};
use nuvec::{backend, Array, DType, Device, Matrix, QuantMode, QuantSpec, Quantized};

mod common;
use common::{arr, close, exact, floats, gather_window, scattered_tables, windowed_tables, Rng};

/// The device under test; every test starts here, so every product runs in f32 (every test of
/// this binary wants the same).
fn gpu() -> Device {
    common::gpu_with(MatmulPrecision::F32)
}

fn quantized(rng: &mut Rng, rows: usize, cols: usize, bits: usize, group: usize, pdtype: DType) -> Matrix {
    let words = cols * bits / 32;
    let packed: Vec<u32> = (0..rows * words).map(|_| rng.next_u32()).collect();
    let groups = cols / group;
    let scales = rng.vec(rows * groups, 0.05);
    let biases = rng.vec(rows * groups, 0.2);
    Matrix::Quantized(
        Quantized::new(
            Array::from_slice(&packed, &[rows, words]).unwrap(),
            floats(&scales, &[rows, groups], pdtype),
            floats(&biases, &[rows, groups], pdtype),
            QuantSpec { mode: QuantMode::Affine, bits, group_size: group },
            cols,
        )
        .unwrap(),
    )
}

fn check_linear(case: &str, rng: &mut Rng, w: &Matrix, m: usize) {
    let dev = gpu();
    let k = w.cols();
    let x = arr(&rng.vec(m * k, 1.0), &[m, k]);
    let want = x.linear(w).unwrap();
    let got = x.to_device(dev).unwrap().linear(&w.to_device(dev).unwrap()).unwrap();
    close(&format!("linear {case} m={m}"), &got, &want);
}

#[test]
fn linear_dense_all_dtypes() {
    let mut rng = Rng::new(1);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (k, n) in [(64usize, 48usize), (200, 77), (1024, 300)] {
            let w = Matrix::Dense(floats(&rng.vec(n * k, 0.1), &[n, k], dtype));
            for m in [1usize, 3, 8, 9, 37, 100] {
                check_linear(&format!("dense {dtype} k={k} n={n}"), &mut rng, &w, m);
            }
        }
    }
}

#[test]
fn linear_quantized_every_width_and_group() {
    let mut rng = Rng::new(2);
    let (k, n) = (384usize, 77usize);
    for bits in QuantSpec::AFFINE_BITS {
        for group in QuantSpec::AFFINE_GROUPS {
            for pdtype in [DType::F16, DType::BF16, DType::F32] {
                let w = quantized(&mut rng, n, k, bits, group, pdtype);
                for m in [1usize, 5, 8, 9, 37] {
                    check_linear(&format!("q{bits} g{group} {pdtype} k={k} n={n}"), &mut rng, &w, m);
                }
            }
        }
    }
}

#[test]
fn linear_many_tiles() {
    // Wide enough that the dequantize-then-GEMM path takes several tiles (4096 rows each at k=4096).
    let mut rng = Rng::new(3);
    let (k, n) = (4096usize, 4500usize);
    let wq = quantized(&mut rng, n, k, 4, 64, DType::BF16);
    let wb = Matrix::Dense(floats(&rng.vec(n * k, 0.02), &[n, k], DType::BF16));
    for m in [2usize, 37] {
        check_linear(&format!("q4 g64 bf16 k={k} n={n}"), &mut rng, &wq, m);
        check_linear(&format!("dense bf16 k={k} n={n}"), &mut rng, &wb, m);
    }
    // A 3-d input [2, L, K] and a dense f32 weight through cuBLAS.
    let wf = Matrix::Dense(arr(&rng.vec(300 * 256, 0.1), &[300, 256]));
    let x = arr(&rng.vec(2 * 37 * 256, 1.0), &[2, 37, 256]);
    let dev = gpu();
    let got = x.to_device(dev).unwrap().linear(&wf.to_device(dev).unwrap()).unwrap();
    close("linear dense float32 [2,37,256] x [300,256]", &got, &x.linear(&wf).unwrap());
}

#[test]
fn fused_linear_ops() {
    // linear_many and silu_mul_linear (default compositions on the GPU, fused passes on the CPU).
    let dev = gpu();
    let mut rng = Rng::new(10);
    let k = 256;
    let ws = [
        quantized(&mut rng, 96, k, 4, 64, DType::BF16),
        quantized(&mut rng, 32, k, 8, 32, DType::F16),
        Matrix::Dense(floats(&rng.vec(40 * k, 0.1), &[40, k], DType::BF16)),
    ];
    let wg: Vec<Matrix> = ws.iter().map(|w| w.to_device(dev).unwrap()).collect();
    for m in [1usize, 9] {
        let x = arr(&rng.vec(m * k, 1.0), &[m, k]);
        let want = x.linear_many(&ws.iter().collect::<Vec<_>>()).unwrap();
        let got = x.to_device(dev).unwrap().linear_many(&wg.iter().collect::<Vec<_>>()).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            close(&format!("linear_many m={m} weight {i}"), g, w);
        }
        let up = arr(&rng.vec(m * k, 1.0), &[m, k]);
        let wd = quantized(&mut rng, 64, k, 4, 32, DType::BF16);
        let want = x.silu_mul_linear(&up, &wd).unwrap();
        let got = x.to_device(dev).unwrap().silu_mul_linear(&up.to_device(dev).unwrap(), &wd.to_device(dev).unwrap());
        close(&format!("silu_mul_linear m={m} q4 g32"), &got.unwrap(), &want);
    }
}

#[test]
fn fused_quantized_decode_ops() {
    // One input row and weights of one width/group/scale dtype: linear_many and silu_mul_linear
    // run as one fused GEMV launch on the GPU; every width and group size, rows not a multiple
    // of the kernel's 4 (or 8) rows per block, k over several chunks per lane. 4 bits (whose
    // kernel shape NUVEC_QGEMV_VARIANT forces, and whose _w2/_w1 kernels have one instance per
    // scale dtype) also run with f16 and f32 scales, and one plain one-row linear per case
    // covers the qgemv1 kernels at these k.
    let dev = gpu();
    let mut rng = Rng::new(12);
    for (bits, group, k) in QuantSpec::AFFINE_BITS
        .iter()
        .flat_map(|&b| QuantSpec::AFFINE_GROUPS.iter().flat_map(move |&g| [(b, g, 1024usize), (b, g, 4096)]))
    {
        let default = if bits % 2 == 0 { DType::BF16 } else { DType::F16 };
        let pdtypes: &[DType] = if bits == 4 { &[DType::BF16, DType::F16, DType::F32] } else { &[default] };
        for &pdtype in pdtypes {
            let ws = [
                quantized(&mut rng, 130, k, bits, group, pdtype),
                quantized(&mut rng, 33, k, bits, group, pdtype),
                quantized(&mut rng, 64, k, bits, group, pdtype),
            ];
            let wg: Vec<Matrix> = ws.iter().map(|w| w.to_device(dev).unwrap()).collect();
            let x = arr(&rng.vec(k, 1.0), &[1, k]);
            let want = x.linear_many(&ws.iter().collect::<Vec<_>>()).unwrap();
            let got = x.to_device(dev).unwrap().linear_many(&wg.iter().collect::<Vec<_>>()).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                close(&format!("linear_many fused q{bits} g{group} {pdtype} k={k} weight {i}"), g, w);
            }
            let up = arr(&rng.vec(k, 1.0), &[1, k]);
            let wd = quantized(&mut rng, 77, k, bits, group, pdtype);
            let want = x.silu_mul_linear(&up, &wd).unwrap();
            let got = x
                .to_device(dev)
                .unwrap()
                .silu_mul_linear(&up.to_device(dev).unwrap(), &wd.to_device(dev).unwrap())
                .unwrap();
            close(&format!("silu_mul_linear fused q{bits} g{group} {pdtype} k={k}"), &got, &want);
            let want = x.linear(&ws[0]).unwrap();
            let got = x.to_device(dev).unwrap().linear(&wg[0]).unwrap();
            close(&format!("linear one row q{bits} g{group} {pdtype} k={k}"), &got, &want);
        }
    }
}

#[test]
fn linear_many_bias_adds_the_biases_in_the_fused_launch() {
    // q/k/v with biases (Qwen2, gpt-oss): one input row, the biases added in the multi-weight
    // GEMV's launch, bit for bit what the products then add_bias give on the GPU, and close to
    // the CPU's; biases of each float dtype; 4 bits (the integer variant at k = 4096) and 8 bits
    // (a GGUF's Q8_0). Several rows take the composed path.
    let dev = gpu();
    let mut rng = Rng::new(31);
    for (bits, group, k) in [(4, 64, 1024), (4, 32, 4096), (8, 32, 2880), (8, 64, 1024)] {
        let ws = [
            quantized(&mut rng, 130, k, bits, group, DType::BF16),
            quantized(&mut rng, 33, k, bits, group, DType::BF16),
            quantized(&mut rng, 64, k, bits, group, DType::BF16),
        ];
        let wg: Vec<Matrix> = ws.iter().map(|w| w.to_device(dev).unwrap()).collect();
        let (wr, wgr): (Vec<&Matrix>, Vec<&Matrix>) = (ws.iter().collect(), wg.iter().collect());
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let biases: Vec<Array> = ws.iter().map(|w| floats(&rng.vec(w.rows(), 1.0), &[w.rows()], dtype)).collect();
            let bg: Vec<Array> = biases.iter().map(|b| b.to_device(dev).unwrap()).collect();
            let (br, bgr): (Vec<&Array>, Vec<&Array>) = (biases.iter().collect(), bg.iter().collect());
            for m in [1, 3] {
                let x = arr(&rng.vec(m * k, 1.0), &[m, k]);
                let xg = x.to_device(dev).unwrap();
                let got = xg.linear_many_bias(&wgr, &bgr).unwrap();
                let composed: Vec<Array> =
                    xg.linear_many(&wgr).unwrap().iter().zip(&bg).map(|(y, b)| y.add_bias(b).unwrap()).collect();
                let want = x.linear_many_bias(&wr, &br).unwrap();
                for i in 0..3 {
                    let case = format!("linear_many_bias q{bits} g{group} k={k} {dtype} bias m={m} weight {i}");
                    exact(&case, &got[i], &composed[i]);
                    close(&case, &got[i], &want[i]);
                }
            }
        }
        let x = arr(&rng.vec(k, 1.0), &[1, k]).to_device(dev).unwrap();
        let short = floats(&rng.vec(5, 1.0), &[5], DType::F32).to_device(dev).unwrap();
        assert!(x.linear_many_bias(&wgr, &[&short, &short]).is_err(), "two biases for three weights");
        assert!(x.linear_many_bias(&wgr, &[&short, &short, &short]).is_err(), "biases of the wrong length");
    }
}

#[test]
fn gate_up_silu_fused_and_composed() {
    // A gated MLP's hidden activations: for one row, 4-bit gate and up with groups of 32+ run as
    // one gate_up_silu_b4 launch (the variant the [gate; up] launch of linear_many takes: every
    // variant that rule picks: the integer _i1 / _i2 / _i4, which with n a multiple of 32 also
    // write the down projection's parts), which must equal linear_many then silu_mul
    // on this device bit for bit and the CPU at the file's tolerance. Groups of 16, other widths
    // and several rows run that composition, compared the same way. NUVEC_GATE_UP_SILU=0 turns
    // the fused launch off (the comparison then holds trivially).
    let dev = gpu();
    let mut rng = Rng::new(21);
    let mut cases: Vec<(usize, usize, usize, usize, DType, usize)> = Vec::new(); // bits, group, k, n, dtype, rows
    for group in QuantSpec::AFFINE_GROUPS {
        for pdtype in [DType::BF16, DType::F16, DType::F32] {
            // k and n picking _i1, _i4, _i2, _i4 (8 warps by the rule), _i1 (a long grid,
            // n not a multiple of 32) and _i1 writing parts (n = 6144).
            for (k, n) in [(1024usize, 130usize), (4096, 77), (2048, 3000), (8192, 300), (4096, 6200), (1024, 6144)] {
                cases.push((4, group, k, n, pdtype, 1));
            }
        }
    }
    cases.extend([
        (4, 64, 1024, 130, DType::BF16, 3),
        (8, 64, 1024, 130, DType::BF16, 1),
        (3, 32, 1024, 77, DType::F16, 1),
    ]);
    for (bits, group, k, n, pdtype, rows) in cases {
        let (gate, up) =
            (quantized(&mut rng, n, k, bits, group, pdtype), quantized(&mut rng, n, k, bits, group, pdtype));
        let (gg, ug) = (gate.to_device(dev).unwrap(), up.to_device(dev).unwrap());
        let x = arr(&rng.vec(rows * k, 1.0), &[rows, k]);
        let xg = x.to_device(dev).unwrap();
        let case = format!("gate_up_silu q{bits} g{group} {pdtype} k={k} n={n} rows={rows}");
        let got = xg.gate_up_silu(&gg, &ug).unwrap();
        close(&case, &got, &x.gate_up_silu(&gate, &up).unwrap());
        let [g, u]: [Array; 2] = xg.linear_many(&[&gg, &ug]).unwrap().try_into().unwrap();
        exact(&format!("{case} = linear_many + silu_mul on the GPU"), &got, &g.silu_mul(&u).unwrap());
    }
}

#[test]
fn producers_write_the_gemv_parts() {
    // The integer GEMVs (4-bit, groups of 32+, one row) read x as int8 parts. On a decode row the
    // row norms, the decode attention's merge and the fused gate/up write those parts with their
    // output; a GEMV over such an output must equal, bit for bit, the GEMV over the same values
    // uploaded afresh (whose parts a separate xsplit_f32 launch writes), and the CPU at the file's
    // tolerance.
    let dev = gpu();
    let mut rng = Rng::new(31);
    let (d, hidden) = (4096usize, 6144usize);
    let w = quantized(&mut rng, 3000, d, 4, 64, DType::BF16);
    let w2 = quantized(&mut rng, 1000, d, 4, 64, DType::BF16);
    let down = quantized(&mut rng, d, hidden, 4, 64, DType::BF16);
    let (gate, up) =
        (quantized(&mut rng, hidden, d, 4, 64, DType::BF16), quantized(&mut rng, hidden, d, 4, 64, DType::BF16));
    let on = |m: &Matrix| m.to_device(dev).unwrap();
    let (wg, w2g, downg) = (on(&w), on(&w2), on(&down));
    let check = |case: &str, produced: &Array, w: &Matrix, wg: &Matrix| {
        let host = produced.to_device(Device::Cpu).unwrap();
        let got = produced.linear(wg).unwrap();
        let fresh = host.to_device(dev).unwrap().linear(wg).unwrap();
        exact(&format!("{case}: the producer's parts = xsplit_f32's"), &got, &fresh);
        close(case, &got, &host.linear(w).unwrap());
    };
    let g = |v: Vec<f32>, shape: &[usize]| arr(&v, shape).to_device(dev).unwrap();
    let (x, res, nw) = (g(rng.vec(d, 1.0), &[1, d]), g(rng.vec(d, 1.0), &[1, d]), g(rng.vec(d, 1.0), &[d]));
    let normed = x.rms_norm(&nw, 1e-5).unwrap();
    check("rms_norm then linear", &normed, &w, &wg);
    let many = normed.linear_many(&[&wg, &w2g]).unwrap();
    let host = normed.to_device(Device::Cpu).unwrap().to_device(dev).unwrap();
    let fresh = host.linear_many(&[&wg, &w2g]).unwrap();
    for (i, (a, b)) in many.iter().zip(&fresh).enumerate() {
        exact(&format!("rms_norm then linear_many weight {i}"), a, b);
    }
    let (_, normed) = x.add_rms_norm(&res, &nw, 1e-5).unwrap();
    check("add_rms_norm then linear", &normed, &w, &wg);
    let (hq, hkv, hd, kv) = (32usize, 8usize, 128usize, 300usize);
    let q = g(rng.vec(hq * hd, 1.0), &[1, hq, hd]);
    let (k, v) = (g(rng.vec(hkv * kv * hd, 1.0), &[hkv, kv, hd]), g(rng.vec(hkv * kv * hd, 1.0), &[hkv, kv, hd]));
    let attn = nuvec::attention(&q, &k, &v, kv, 1.0 / (hd as f32).sqrt()).unwrap();
    check("decode attention then linear", &attn, &w, &wg);
    let h = normed.gate_up_silu(&on(&gate), &on(&up)).unwrap();
    check("gate_up_silu then the down projection", &h, &down, &downg);
}

#[test]
fn add_bias_rms_norm_adds_the_bias_in_the_norms_launch() {
    // gpt-oss's o projection: its bias joins the residual add and the norm, bit for bit what
    // add_bias then add_rms_norm give on the GPU, and close to the CPU's; biases of each float
    // dtype; one row (the multi-block norm that writes the integer parts, d a multiple of 32;
    // and d = 1001, the one-block kernel) and several rows.
    let dev = gpu();
    let mut rng = Rng::new(37);
    for d in [2880, 1001] {
        let nw = arr(&rng.vec(d, 1.0), &[d]);
        let nwg = nw.to_device(dev).unwrap();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let bias = floats(&rng.vec(d, 1.0), &[d], dtype);
            let bg = bias.to_device(dev).unwrap();
            for m in [1, 3] {
                let (x, y) = (arr(&rng.vec(m * d, 1.0), &[m, d]), arr(&rng.vec(m * d, 1.0), &[m, d]));
                let (xg, yg) = (x.to_device(dev).unwrap(), y.to_device(dev).unwrap());
                let (h, normed) = xg.add_bias_rms_norm(&yg, &bg, &nwg, 1e-5).unwrap();
                let (h2, normed2) = xg.add_rms_norm(&yg.add_bias(&bg).unwrap(), &nwg, 1e-5).unwrap();
                let (h3, normed3) = x.add_bias_rms_norm(&y, &bias, &nw, 1e-5).unwrap();
                let case = format!("add_bias_rms_norm d={d} {dtype} bias m={m}");
                exact(&format!("{case} sum"), &h, &h2);
                exact(&format!("{case} normed"), &normed, &normed2);
                close(&format!("{case} sum"), &h, &h3);
                close(&format!("{case} normed"), &normed, &normed3);
            }
        }
        let x = arr(&rng.vec(d, 1.0), &[1, d]).to_device(dev).unwrap();
        let short = floats(&rng.vec(5, 1.0), &[5], DType::F32).to_device(dev).unwrap();
        assert!(x.add_bias_rms_norm(&x, &short, &nwg, 1e-5).is_err(), "a bias of the wrong length");
    }
}

#[test]
fn linear_add_rms_norm_folds_the_norm() {
    // The o / down projection with the residual add and the next norm (qgemv_norm_b4_i4, one
    // decode row of 4-bit weights): h bit for bit the composition's (the same GEMV loop), the
    // norm's output, as the integer GEMVs read it (its scale pending) and as values (scaled in
    // place when read), within the file's tolerance of the composition's.
    let dev = gpu();
    let mut rng = Rng::new(37);
    let on = |m: &Matrix| m.to_device(dev).unwrap();
    let g = |v: Vec<f32>, shape: &[usize]| arr(&v, shape).to_device(dev).unwrap();
    for (n, k) in [(4096usize, 4096usize), (4096, 14336), (1024, 3072)] {
        let w = on(&quantized(&mut rng, n, k, 4, 64, DType::BF16));
        let (q, gate, up) = (
            on(&quantized(&mut rng, 1536, n, 4, 64, DType::BF16)),
            on(&quantized(&mut rng, 2048, n, 4, 64, DType::BF16)),
            on(&quantized(&mut rng, 2048, n, 4, 64, DType::BF16)),
        );
        let (x, res, nw) = (g(rng.vec(k, 1.0), &[1, k]), g(rng.vec(n, 1.0), &[1, n]), g(rng.vec(n, 1.0), &[n]));
        let (h, normed) = x.linear_add_rms_norm(&w, &res, &nw, 1e-5).unwrap();
        let (h2, normed2) = res.add_rms_norm(&x.linear(&w).unwrap(), &nw, 1e-5).unwrap();
        let case = format!("n={n} k={k}");
        if k != 3072 && std::env::var_os("NUVEC_QGEMV_VARIANT").is_none() {
            // The composition's GEMV is _i4 at these shapes, the loop the fold runs (unless a
            // shape is forced).
            exact(&format!("{case}: h"), &h, &h2);
        } else {
            close(&format!("{case}: h"), &h, &h2);
        }
        close(
            &format!("{case}: q/k/v-like GEMV of the norm"),
            &normed.linear(&q).unwrap(),
            &normed2.linear(&q).unwrap(),
        );
        let many = normed.linear_many(&[&q, &gate]).unwrap();
        let many2 = normed2.linear_many(&[&q, &gate]).unwrap();
        close(&format!("{case}: linear_many weight 1"), &many[1], &many2[1]);
        let act = normed.gate_up_silu(&gate, &up).unwrap();
        close(&format!("{case}: gate_up_silu of the norm"), &act, &normed2.gate_up_silu(&gate, &up).unwrap());
        // Read as values (settles the pending scale), then by the GEMV again.
        close(&format!("{case}: the norm's values"), &normed, &normed2);
        close(
            &format!("{case}: GEMV after the values were read"),
            &normed.linear(&q).unwrap(),
            &normed2.linear(&q).unwrap(),
        );
        // And a fold whose input is itself a norm's output (its parts still carry the pending
        // scale): the next layer's projection of it.
        let w3 = on(&quantized(&mut rng, n, n, 4, 64, DType::BF16));
        let (h3, normed3) = normed.linear_add_rms_norm(&w3, &h, &nw, 1e-5).unwrap();
        let (h3r, normed3r) = h2.add_rms_norm(&normed2.linear(&w3).unwrap(), &nw, 1e-5).unwrap();
        close(&format!("{case}: a fold of a fold, h"), &h3, &h3r);
        close(&format!("{case}: a fold of a fold, the norm"), &normed3, &normed3r);
    }
}

#[test]
fn attention_split_and_gemm_paths() {
    // Decode-sized (split keys) and prefill-sized (SGEMM + softmax) attention against the CPU,
    // including a chunk that continues a cache (kv_len > L) and GQA.
    let dev = gpu();
    let mut rng = Rng::new(13);
    for (l, kv, hq, hkv, d) in [
        (1usize, 1usize, 4usize, 2usize, 64usize),
        (2, 50, 4, 2, 30),
        (1, 1000, 32, 8, 128),
        (3, 700, 8, 8, 128),
        (64, 64, 4, 1, 64),
        (100, 357, 8, 2, 128),
        (300, 300, 2, 2, 256),
    ] {
        let cap = kv + 5;
        let q = arr(&rng.vec(l * hq * d, 1.0), &[l, hq, d]);
        let k = arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]);
        let v = arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]);
        let scale = 1.0 / (d as f32).sqrt();
        let want = nuvec::attention(&q, &k, &v, kv, scale).unwrap();
        let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
        let got = nuvec::attention(&qg, &kg, &vg, kv, scale).unwrap();
        close(&format!("attention L={l} kv={kv} Hq={hq} Hkv={hkv} D={d}"), &got, &want);
    }
}

#[test]
fn paged_decode_attention_reads_the_blocks_in_place() {
    // Several sequences over one paged store against the CPU kernel, and each row bit for bit
    // the GPU's own decode of that sequence over its blocks gathered; with and without sinks;
    // every position, or sliding windows (gpt-oss's 64 query heads over 8 among them) whose
    // tables gave back the blocks before them.
    let dev = gpu();
    let mut rng = Rng::new(17);
    for (hq, hkv, d) in [(9usize, 3usize, 64usize), (8, 2, 128), (4, 4, 32), (64, 8, 64)] {
        let (bs, blocks) = (16usize, 80usize);
        let width = hkv * d;
        let k = arr(&rng.vec(blocks * bs * width, 1.0), &[1, blocks * bs, width]);
        let v = arr(&rng.vec(blocks * bs * width, 1.0), &[1, blocks * bs, width]);
        let lens = [1usize, 16, 33, 200, 700, 1000];
        let whole = scattered_tables(&lens, bs, blocks);
        let q = arr(&rng.vec(lens.len() * hq * d, 1.0), &[lens.len(), hq, d]);
        let sinks: Vec<f32> = (0..hq).map(|h| h as f32 * 0.5 - 1.0).collect();
        let scale = 1.0 / (d as f32).sqrt();
        let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
        for window in [None, Some(128usize), Some(40)] {
            let tables = match window {
                Some(w) => windowed_tables(&whole, &lens, bs, w),
                None => whole.clone(),
            };
            let seqs: Vec<nuvec::PagedSeq> = tables
                .iter()
                .zip(lens)
                .map(|(t, len)| match window {
                    Some(w) => nuvec::PagedSeq::windowed(t, len, w),
                    None => nuvec::PagedSeq::new(t, len),
                })
                .collect();
            for sinks in [None, Some(&sinks[..])] {
                let case = format!("paged Hq={hq} Hkv={hkv} D={d} window={window:?} sinks={}", sinks.is_some());
                let want = nuvec::paged_decode_attention(&q, &k, &v, &seqs, bs, scale, sinks).unwrap();
                let got = nuvec::paged_decode_attention(&qg, &kg, &vg, &seqs, bs, scale, sinks).unwrap();
                close(&case, &got, &want);
                let got = got.to_f32_vec().unwrap();
                let (kh, vh) = (k.to_f32_vec().unwrap(), v.to_f32_vec().unwrap());
                for (i, s) in seqs.iter().enumerate() {
                    // [Hkv, attended, D] of this sequence, gathered on the host.
                    let n = s.attended();
                    let gather = |x: &[f32]| {
                        arr(&gather_window(x, s.table, s.first..s.len, bs, hkv, d), &[hkv, n, d])
                            .to_device(dev)
                            .unwrap()
                    };
                    let qi = arr(&q.to_f32_vec().unwrap()[i * hq * d..(i + 1) * hq * d], &[1, hq, d])
                        .to_device(dev)
                        .unwrap();
                    let solo = match sinks {
                        None => nuvec::attention(&qi, &gather(&kh), &gather(&vh), n, scale),
                        Some(s) => nuvec::attention_sinks(&qi, &gather(&kh), &gather(&vh), n, scale, s),
                    };
                    let solo = solo.unwrap().to_f32_vec().unwrap();
                    let row = &got[i * hq * d..(i + 1) * hq * d];
                    let same = row.iter().zip(&solo).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{case}: sequence {i} (len {}) differs from its own decode", s.len);
                }
            }
        }
    }
}

#[test]
fn paged_decode_attention_of_many_sequences_against_the_cpu() {
    // 64 sequences of mixed lengths (1 to 2100) with 32 query heads over 8 KV heads: enough that
    // the launch takes one chunk of keys for every sequence instead of each one's solo splits
    // (ops/paged.rs `batch_splits`); each row against the CPU kernel, in f32 and bf16 stores.
    let dev = gpu();
    let mut rng = Rng::new(23);
    let (hq, hkv, d, bs, blocks) = (32usize, 8usize, 128usize, 16usize, 160usize);
    let width = hkv * d;
    let lens: Vec<usize> = [1usize, 17, 300, 2100, 33, 550, 64, 1000].repeat(8);
    let tables = scattered_tables(&lens, bs, blocks);
    let seqs: Vec<nuvec::PagedSeq> = tables.iter().zip(&lens).map(|(t, &len)| nuvec::PagedSeq::new(t, len)).collect();
    let q = arr(&rng.vec(lens.len() * hq * d, 1.0), &[lens.len(), hq, d]);
    let scale = 1.0 / (d as f32).sqrt();
    // The same sequences through sliding windows of 128 positions (the blocks before given back).
    let freed = windowed_tables(&tables, &lens, bs, 128);
    let windows: Vec<nuvec::PagedSeq> =
        freed.iter().zip(&lens).map(|(t, &len)| nuvec::PagedSeq::windowed(t, len, 128)).collect();
    for dtype in [DType::F32, DType::BF16] {
        let (kf, vf) = (rng.vec(blocks * bs * width, 1.0), rng.vec(blocks * bs * width, 1.0));
        let (k, v) = (floats(&kf, &[1, blocks * bs, width], dtype), floats(&vf, &[1, blocks * bs, width], dtype));
        let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
        for (seqs, what) in [(&seqs, "sequences"), (&windows, "windows of 128")] {
            let want = nuvec::paged_decode_attention(&q, &k, &v, seqs, bs, scale, None).unwrap();
            let got = nuvec::paged_decode_attention(&qg, &kg, &vg, seqs, bs, scale, None).unwrap();
            close(&format!("paged decode of {} {what} over {dtype} stores", lens.len()), &got, &want);
        }
    }
}

#[test]
fn rope_and_paged_writes_of_a_decode_step_in_one_launch() {
    // Each row rotated at its own position (with and without q/k norms), bit for bit the GPU's
    // rope_qk of that row alone; its key and value land in its store row, and no other row moves.
    let dev = gpu();
    let mut rng = Rng::new(19);
    let (n, hq, hkv, d, rows) = (5usize, 6usize, 2usize, 64usize, 40usize);
    let inv_freqs: Vec<f32> = (0..d / 2).map(|i| 10000f32.powf(-2.0 * i as f32 / d as f32)).collect();
    let positions = [0usize, 7, 130, 4095, 31];
    let slots = [3usize, 17, 0, 39, 22];
    let q = arr(&rng.vec(n * hq * d, 1.0), &[n, hq, d]).to_device(dev).unwrap();
    let k = arr(&rng.vec(n * hkv * d, 1.0), &[n, hkv, d]).to_device(dev).unwrap();
    let v = arr(&rng.vec(n * hkv * d, 1.0), &[n, hkv, d]).to_device(dev).unwrap();
    let (qw, kw) =
        (arr(&rng.vec(d, 1.0), &[d]).to_device(dev).unwrap(), arr(&rng.vec(d, 1.0), &[d]).to_device(dev).unwrap());
    let before = rng.vec(rows * hkv * d, 1.0);
    for norm in [None, Some((&qw, &kw, 1e-6f32))] {
        let mut ks = arr(&before, &[1, rows, hkv * d]).to_device(dev).unwrap();
        let mut vs = arr(&before, &[1, rows, hkv * d]).to_device(dev).unwrap();
        let qo =
            nuvec::rope_qk_write_paged(&q, &k, &v, norm, &inv_freqs, false, (&positions, &slots), (&mut ks, &mut vs))
                .unwrap();
        let (qo, ks, vs) = (qo.to_f32_vec().unwrap(), ks.to_f32_vec().unwrap(), vs.to_f32_vec().unwrap());
        let vh = v.to_f32_vec().unwrap();
        let w = hkv * d;
        for i in 0..n {
            let qi = q.slice_rows(i, i + 1).unwrap();
            let ki = k.slice_rows(i, i + 1).unwrap();
            let (qr, kr) = nuvec::rope_qk(&qi, &ki, norm, &inv_freqs, positions[i], false).unwrap();
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same(&qo[i * hq * d..][..hq * d], &qr.to_f32_vec().unwrap()),
                "row {i} query, norm {}",
                norm.is_some()
            );
            assert!(same(&ks[slots[i] * w..][..w], &kr.to_f32_vec().unwrap()), "row {i} key");
            assert!(same(&vs[slots[i] * w..][..w], &vh[i * w..][..w]), "row {i} value");
        }
        for r in (0..rows).filter(|r| !slots.contains(r)) {
            assert_eq!(&ks[r * w..][..w], &before[r * w..][..w], "store row {r} was not written");
            assert_eq!(&vs[r * w..][..w], &before[r * w..][..w], "store row {r} was not written");
        }
    }
}

#[test]
fn embed_dense_and_quantized() {
    let dev = gpu();
    let mut rng = Rng::new(4);
    let (v, d) = (301usize, 256usize);
    let ids: Vec<u32> = (0..37).map(|_| rng.next_u32() % v as u32).chain([0, 300, 7, 7]).collect();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let t = Matrix::Dense(floats(&rng.vec(v * d, 1.0), &[v, d], dtype));
        let got = t.to_device(dev).unwrap().embed(&ids).unwrap();
        exact(&format!("embed dense {dtype}"), &got, &t.embed(&ids).unwrap());
    }
    for bits in QuantSpec::AFFINE_BITS {
        for group in QuantSpec::AFFINE_GROUPS {
            let t = quantized(&mut rng, v, d, bits, group, DType::BF16);
            let tg = t.to_device(dev).unwrap();
            // scale * q + bias may fuse into one rounding on the GPU.
            close(&format!("embed q{bits} g{group} bf16"), &tg.embed(&ids).unwrap(), &t.embed(&ids).unwrap());
            // One id (a decode step) takes the row directly, without uploading the ids.
            for id in [0u32, 123, 300] {
                close(
                    &format!("embed q{bits} g{group} bf16, one id {id}"),
                    &tg.embed(&[id]).unwrap(),
                    &t.embed(&[id]).unwrap(),
                );
            }
        }
    }
    let t = Matrix::Dense(floats(&rng.vec(v * d, 1.0), &[v, d], DType::BF16));
    exact("embed dense bf16, one id", &t.to_device(dev).unwrap().embed(&[299]).unwrap(), &t.embed(&[299]).unwrap());
    let t = quantized(&mut rng, v, d, 4, 64, DType::F16).to_device(dev).unwrap();
    assert!(t.embed(&[v as u32]).is_err(), "an id outside the vocabulary is an error");
    assert_eq!(t.embed(&[]).unwrap().shape(), &[0, d]);
}

/// `embed_spliced` on the device: the rows fed from picks (an `argmax_gap` that stays on the
/// device) are the rows of the picked ids, for dense and affine tables, exactly as `embed` of
/// the ids spliced on the host; and a pending read of the picks gives what `to_vec` gives.
#[test]
fn embed_spliced_reads_the_picks_on_the_device() {
    let dev = gpu();
    let mut rng = Rng::new(41);
    let (v, d, m) = (301usize, 256usize, 9usize);
    let logits = arr(&rng.vec(m * v, 3.0), &[m, v]).to_device(dev).unwrap();
    let picks = logits.argmax_gap().unwrap();
    let pending = picks.read_later().unwrap();
    let host = picks.to_vec::<u32>().unwrap();
    assert_eq!(pending.wait::<u32>().unwrap(), host);
    // Reads of other lengths, and again of one read before (its page-locked buffer kept).
    for rows in [4usize, 9, 1, 4, 9] {
        let some = logits.slice_rows(0, rows).unwrap().argmax_gap().unwrap();
        assert_eq!(some.read_later().unwrap().wait::<u32>().unwrap(), host[..3 * rows], "{rows} rows");
    }
    let ids: Vec<u32> = (0..20).map(|_| rng.next_u32() % v as u32).collect();
    let spliced = [(0usize, 3usize), (7, 0), (19, 8), (11, 3)];
    let mut patched = ids.clone();
    for &(row, pick) in &spliced {
        patched[row] = host[3 * pick];
    }
    let tables = [
        Matrix::Dense(floats(&rng.vec(v * d, 1.0), &[v, d], DType::BF16)),
        quantized(&mut rng, v, d, 4, 64, DType::BF16),
        quantized(&mut rng, v, d, 8, 32, DType::F16),
    ];
    for (i, t) in tables.iter().enumerate() {
        let t = t.to_device(dev).unwrap();
        let got = t.embed_spliced(&ids, &picks, &spliced).unwrap();
        exact(&format!("embed_spliced table {i}"), &got, &t.embed(&patched).unwrap());
        let one = t.embed_spliced(&[0], &picks, &[(0, 5)]).unwrap();
        exact(&format!("embed_spliced table {i}, one row"), &one, &t.embed(&[host[15]]).unwrap());
    }
    let t = tables[0].to_device(dev).unwrap();
    assert!(t.embed_spliced(&ids, &picks, &[(20, 0)]).is_err(), "a row outside the ids");
    assert!(t.embed_spliced(&ids, &picks, &[(0, 9)]).is_err(), "a pick outside the picks");
}

/// `sample_rows` on the device: every draw it calls certain is the host reference's token (the
/// CPU backend's draw, certified against nuvec-lm's host draw there), over vocabularies up to
/// 151,936 values, peaked, flat and banned (-inf) rows, several temperatures and uniforms at
/// random; nearly all of them certain; rows the host must decide (a NaN, +inf, no scale) never.
#[test]
fn sample_rows_draw_the_host_tokens() {
    let dev = gpu();
    let mut rng = Rng::new(47);
    let (mut certain, mut draws) = (0usize, 0usize);
    for &n in &[7usize, 1000, 32_000, 151_936] {
        let spread = rng.vec(n, 6.0);
        let mut peaked = spread.clone();
        peaked[n / 3] = 25.0;
        let mut banned = spread.clone();
        banned.iter_mut().step_by(2).for_each(|v| *v = f32::NEG_INFINITY);
        for row in [spread, peaked, vec![0.5; n], banned] {
            let m = 24;
            let data = row.repeat(m);
            let scales: Vec<f32> = (0..m).map(|i| [0.5f32, 1.0, 1.0 / 0.7, 3.0][i % 4]).collect();
            let uniforms: Vec<f64> = (0..m).map(|_| (rng.next_u32() as f64 + 0.5) / 4_294_967_296.0).collect();
            let x = arr(&data, &[m, n]);
            let host = x.sample_rows(&scales, &uniforms).unwrap().to_vec::<u32>().unwrap();
            let got = x.to_device(dev).unwrap().sample_rows(&scales, &uniforms).unwrap().to_vec::<u32>().unwrap();
            for i in 0..m {
                let (token, sure) = (got[3 * i], got[3 * i + 1]);
                if sure == 1 {
                    assert_eq!(token, host[3 * i], "n {n}, scale {}, u {}", scales[i], uniforms[i]);
                    assert!(row[token as usize] > f32::NEG_INFINITY, "a banned token drawn");
                }
                assert_eq!(got[3 * i + 2], 0);
                certain += sure as usize;
                draws += 1;
            }
        }
    }
    assert!(certain * 1000 >= draws * 995, "{certain} of {draws} draws certain");
    let odd = [1.0f32, f32::NAN, 2.0, 1.0, f32::INFINITY, 2.0, 1.0, 3.0, 2.0];
    let x = arr(&odd, &[3, 3]).to_device(dev).unwrap();
    let got = x.sample_rows(&[1.0, 1.0, 0.0], &[0.5, 0.5, 0.5]).unwrap().to_vec::<u32>().unwrap();
    assert_eq!([got[1], got[4], got[7]], [0, 0, 0], "a NaN, +inf and scale 0 are left to the host");
    assert!(x.sample_rows(&[1.0], &[0.5]).is_err(), "a scale and a uniform per row");
}

/// Uploads go through a ring of page-locked staging buffers (up to 1 MiB) without waiting for the
/// queued work: many more uploads than the ring holds, of sizes across the staged limit and
/// queued behind a long kernel, each arrive whole.
#[test]
fn staged_uploads_arrive_whole() {
    let dev = gpu();
    nuvec::backends::cuda::set_staged_uploads(true);
    let mut rng = Rng::new(43);
    // Work queued first, so the copies are enqueued behind it.
    let big = arr(&rng.vec(4096 * 4096, 1.0), &[4096, 4096]).to_device(dev).unwrap();
    let _busy = big.linear(&Matrix::Dense(big.clone())).unwrap();
    let sizes = [1usize, 3, 1000, 4097, 65536, 262144, (1 << 20) / 4, (1 << 20) / 4 + 1, 700_000];
    let mut sent = vec![];
    for i in 0..300 {
        let n = sizes[i % sizes.len()];
        let data: Vec<u32> = (0..n).map(|j| (i * 7919 + j) as u32).collect();
        let a = Array::from_slice_on(&data, &[n], dev).unwrap();
        sent.push((data, a));
    }
    for (i, (data, a)) in sent.iter().enumerate() {
        assert_eq!(&a.to_vec::<u32>().unwrap(), data, "upload {i} of {} values", data.len());
    }
}

#[test]
fn rms_norm_rows() {
    let dev = gpu();
    let mut rng = Rng::new(5);
    for (rows, d) in [(1usize, 64usize), (37, 100), (5, 4096), (3, 1)] {
        for wdtype in [DType::F32, DType::F16, DType::BF16] {
            let x = arr(&rng.vec(rows * d, 3.0), &[rows, d]);
            let w = floats(&rng.vec(d, 1.0), &[d], wdtype);
            let want = x.rms_norm(&w, 1e-5).unwrap();
            let got = x.to_device(dev).unwrap().rms_norm(&w.to_device(dev).unwrap(), 1e-5).unwrap();
            close(&format!("rms_norm rows={rows} d={d} weight {wdtype}"), &got, &want);
        }
    }
}

#[test]
fn rope_both_layouts() {
    let dev = gpu();
    let mut rng = Rng::new(6);
    for (l, h, d) in [(1usize, 4usize, 64usize), (37, 4, 128), (37, 3, 80)] {
        for rotated in [d, d / 2] {
            let half = rotated / 2;
            let freqs: Vec<f32> = (0..half).map(|i| 10000f32.powf(-2.0 * i as f32 / rotated as f32)).collect();
            for traditional in [false, true] {
                for offset in [0usize, 1000] {
                    let x = arr(&rng.vec(l * h * d, 1.0), &[l, h, d]);
                    let want = x.rope(&freqs, offset, traditional).unwrap();
                    let got = x.to_device(dev).unwrap().rope(&freqs, offset, traditional).unwrap();
                    close(
                        &format!("rope L={l} H={h} D={d} rotated={rotated} trad={traditional} off={offset}"),
                        &got,
                        &want,
                    );
                }
            }
        }
    }
}

#[test]
fn attention_causal_gqa() {
    let dev = gpu();
    let mut rng = Rng::new(7);
    for (hq, hkv) in [(8usize, 2usize), (4, 4)] {
        for d in [64usize, 128] {
            for (l, kv_len) in [(1usize, 1usize), (1, 77), (1, 1000), (37, 37), (37, 300), (5, 600)] {
                let cap = kv_len + 13;
                let q = arr(&rng.vec(l * hq * d, 3.0), &[l, hq, d]);
                let k = arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]);
                let v = arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]);
                let scale = 1.0 / (d as f32).sqrt();
                let want = nuvec::attention(&q, &k, &v, kv_len, scale).unwrap();
                let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
                let got = nuvec::attention(&qg, &kg, &vg, kv_len, scale).unwrap();
                close(&format!("attention Hq={hq} Hkv={hkv} D={d} L={l} kv={kv_len}"), &got, &want);
            }
        }
    }
}

#[test]
fn copies_and_elementwise() {
    let dev = gpu();
    let mut rng = Rng::new(8);
    let to = |a: &Array| a.to_device(dev).unwrap();

    // write_axis1, also into an array whose bytes are shared (the other copy must not change).
    let dst = arr(&rng.vec(2 * 50 * 16, 1.0), &[2, 50, 16]);
    let src = arr(&rng.vec(2 * 37 * 16, 1.0), &[2, 37, 16]);
    let mut want = dst.clone();
    want.write_axis1(&src, 5).unwrap();
    let mut got = to(&dst);
    let shared = got.clone();
    got.write_axis1(&to(&src), 5).unwrap();
    exact("write_axis1 [2,37,16] into [2,50,16] at 5", &got, &want);
    exact("write_axis1 leaves a shared copy alone", &shared, &to(&dst));
    assert!(got.clone().write_axis1(&to(&src), 14).is_err(), "writing past the capacity is an error");

    // write_axis1_from_rows: src [n, A, C] into dst [A, cap, C].
    let rows = arr(&rng.vec(37 * 2 * 16, 1.0), &[37, 2, 16]);
    let mut want = dst.clone();
    want.write_axis1_from_rows(&rows, 9).unwrap();
    let mut got = to(&dst);
    got.write_axis1_from_rows(&to(&rows), 9).unwrap();
    exact("write_axis1_from_rows [37,2,16] into [2,50,16] at 9", &got, &want);

    let x = arr(&rng.vec(37 * 8 * 24, 1.0), &[37, 8, 24]);
    exact("transpose01 [37,8,24]", &to(&x).transpose01().unwrap(), &x.transpose01().unwrap());

    let (a, b) = (arr(&rng.vec(37 * 129, 4.0), &[37, 129]), arr(&rng.vec(37 * 129, 4.0), &[37, 129]));
    exact("add [37,129]", &to(&a).add(&to(&b)).unwrap(), &a.add(&b).unwrap());
    close("silu_mul [37,129]", &to(&a).silu_mul(&to(&b)).unwrap(), &a.silu_mul(&b).unwrap());
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let bias = floats(&rng.vec(129, 1.0), &[129], dtype);
        exact(
            &format!("add_bias [37,129] + {dtype}"),
            &to(&a).add_bias(&to(&bias)).unwrap(),
            &a.add_bias(&bias).unwrap(),
        );
        exact(
            &format!("mul_columns [37,129] * {dtype}"),
            &to(&a).mul_columns(&to(&bias)).unwrap(),
            &a.mul_columns(&bias).unwrap(),
        );
    }
    // A low-rank adapter's second product with the sum (FMA on the device: close, not exact).
    let (t, w) = (arr(&rng.vec(37 * 8, 1.0), &[37, 8]), arr(&rng.vec(129 * 8, 1.0), &[129, 8]));
    close(
        "add_linear [37,129] + [37,8] x [129,8]^T",
        &to(&a).add_linear(&to(&t), &to(&w)).unwrap(),
        &a.add_linear(&t, &w).unwrap(),
    );
    assert!(to(&a).add_linear(&to(&w), &to(&w)).is_err(), "rows that differ are an error");
    assert!(to(&a).add(&to(&arr(&[1.0], &[1]))).is_err(), "shape mismatch is an error");

    // slice_rows gives a view; ops on the view read the right rows.
    let s = to(&a).slice_rows(3, 20).unwrap();
    exact("slice_rows 3..20 of 37", &s, &a.slice_rows(3, 20).unwrap());
    let want = a.slice_rows(3, 20).unwrap();
    exact("add on a slice_rows view", &s.add(&s).unwrap(), &want.add(&want).unwrap());
    assert!(to(&a).slice_rows(5, 38).is_err());

    // argmax: random rows, ties (the first maximum wins), a leading NaN, all -inf.
    let mut rows = rng.vec(37 * 1000, 1.0);
    rows[1000 + 10] = 5.0;
    rows[1000 + 900] = 5.0;
    rows[2000] = f32::NAN;
    rows[3000..4000].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
    rows[4000 + 500] = f32::NAN;
    let x = arr(&rows, &[37, 1000]);
    let got = to(&x).argmax().unwrap();
    assert_eq!(got.dtype(), DType::U32);
    assert_eq!(got.to_vec::<u32>().unwrap(), x.argmax().unwrap().to_vec::<u32>().unwrap(), "argmax");
    let x3 = arr(&rng.vec(2 * 3 * 49153, 10.0), &[2, 3, 49153]);
    assert_eq!(to(&x3).argmax().unwrap().to_vec::<u32>().unwrap(), x3.argmax().unwrap().to_vec::<u32>().unwrap());
    eprintln!("RESULT {:<60} exact", "argmax (ties, NaN, -inf, [2,3,49153])");
}

#[test]
fn transfers_and_device_errors() {
    let dev = gpu();
    let mut rng = Rng::new(9);
    // Round trips of every dtype, views included.
    let f = rng.vec(1001, 1.0);
    let a = arr(&f, &[7, 143]);
    assert_eq!(a.to_device(dev).unwrap().to_vec::<f32>().unwrap(), f);
    assert_eq!(a.to_device(dev).unwrap().to_device(Device::Cpu).unwrap().device(), Device::Cpu);
    let u: Vec<u32> = (0..99).map(|_| rng.next_u32()).collect();
    assert_eq!(Array::from_slice_on(&u, &[99], dev).unwrap().to_vec::<u32>().unwrap(), u);
    let h = floats(&f, &[1001], DType::BF16);
    assert_eq!(h.to_device(dev).unwrap().to_f32_vec().unwrap(), h.to_f32_vec().unwrap());
    let bytes: Vec<u8> = (0..13u8).collect();
    assert_eq!(Array::from_slice_on(&bytes, &[13], dev).unwrap().to_vec::<u8>().unwrap(), bytes);
    let z = Array::zeros_on(&[3, 5], DType::F32, dev).unwrap();
    assert_eq!((z.device(), z.to_vec::<f32>().unwrap()), (dev, vec![0f32; 15]));
    let stacked = arr(&f[..1000], &[4, 10, 25]).to_device(dev).unwrap();
    assert_eq!(stacked.index_first(2).unwrap().to_vec::<f32>().unwrap(), f[500..750].to_vec());
    assert!(a.to_device(dev).unwrap().to_vec::<u32>().is_err(), "reading f32 as u32 is an error");

    // A CPU op given a GPU array, and a GPU op given a CPU array: errors naming op and device.
    let (x, w) = (arr(&rng.vec(64, 1.0), &[1, 64]), arr(&rng.vec(64, 1.0), &[64]));
    let xg = x.to_device(dev).unwrap();
    let e = backend(Device::Cpu).rms_norm(&xg, &w, 1e-5).unwrap_err().to_string();
    assert!(e.contains("rms_norm") && e.contains("cuda:0"), "{e}");
    let e = x.rms_norm(&w.to_device(dev).unwrap(), 1e-5).unwrap_err().to_string();
    assert!(e.contains("rms_norm") && e.contains("cuda:0"), "{e}");
    let e = xg.rms_norm(&w, 1e-5).unwrap_err().to_string();
    assert!(e.contains("rms_norm") && e.contains("cpu"), "{e}");
    let wm = Matrix::Dense(arr(&rng.vec(64 * 8, 1.0), &[8, 64]));
    let e = x.linear(&wm.to_device(dev).unwrap()).unwrap_err().to_string();
    assert!(e.contains("linear") && e.contains("cuda:0"), "{e}");
    let e = xg.linear(&wm).unwrap_err().to_string();
    assert!(e.contains("linear") && e.contains("cpu"), "{e}");
    let e = backend(Device::Cpu).argmax(&xg).unwrap_err().to_string();
    assert!(e.contains("argmax") && e.contains("cuda:0"), "{e}");
    // A device that does not exist.
    let e = x.to_device(Device::Cuda(977)).unwrap_err().to_string();
    assert!(e.contains("cuda:977"), "{e}");
    let e = backend(Device::Cuda(977)).add(&x, &x).unwrap_err().to_string();
    assert!(e.contains("cuda"), "{e}");
    eprintln!("RESULT {:<60} ok", "transfers and device errors");
}

/// Not a test: rough timings of the kernels on shapes of an 8B Llama, and the host cost per op
/// (run with `--ignored --nocapture`). Prints, asserts nothing.
#[test]
#[ignore]
fn timing_probe() {
    let dev = gpu();
    let mut rng = Rng::new(11);
    let time = |name: &str, bytes: f64, iters: usize, f: &dyn Fn() -> Array| {
        let _ = f().to_f32_vec().unwrap();
        let t = std::time::Instant::now();
        let mut last = None;
        for _ in 0..iters {
            last = Some(f());
        }
        // Waits for the device by reading one row (reading a whole large output would time the
        // copy to the host instead).
        let _ = last.unwrap().slice_rows(0, 1).unwrap().to_f32_vec().unwrap();
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        eprintln!("TIMING {name:<52} {us:9.1} us  {:7.1} GB/s", bytes / us / 1e3);
    };
    let k = 4096;
    for (n, bits) in [(4096usize, 4usize), (14336, 4), (4096, 8), (4096, 3)] {
        let w = quantized(&mut rng, n, k, bits, 64, DType::BF16).to_device(dev).unwrap();
        let bytes = w.nbytes() as f64;
        for m in [1usize, 8] {
            let x = arr(&rng.vec(m * k, 1.0), &[m, k]).to_device(dev).unwrap();
            time(&format!("linear q{bits} g64 [{m},{k}] x [{n},{k}]"), bytes, 50, &|| x.linear(&w).unwrap());
        }
        let x = arr(&rng.vec(512 * k, 1.0), &[512, k]).to_device(dev).unwrap();
        time(&format!("linear q{bits} g64 [512,{k}] x [{n},{k}] (tiles+SGEMM)"), bytes, 10, &|| x.linear(&w).unwrap());
    }
    let wd = Matrix::Dense(floats(&rng.vec(4096 * k, 0.02), &[4096, k], DType::BF16)).to_device(dev).unwrap();
    let x = arr(&rng.vec(k, 1.0), &[1, k]).to_device(dev).unwrap();
    time("linear dense bf16 [1,4096] x [4096,4096]", wd.nbytes() as f64, 50, &|| x.linear(&wd).unwrap());
    let wf = Matrix::Dense(arr(&rng.vec(4096 * k, 0.02), &[4096, k])).to_device(dev).unwrap();
    time("linear dense f32 [1,4096] x [4096,4096] (SGEMM)", wf.nbytes() as f64, 50, &|| x.linear(&wf).unwrap());
    for kv in [512usize, 4096] {
        let (hq, hkv, d) = (32usize, 8usize, 128usize);
        let q = arr(&rng.vec(hq * d, 1.0), &[1, hq, d]).to_device(dev).unwrap();
        let kk = arr(&rng.vec(hkv * kv * d, 1.0), &[hkv, kv, d]).to_device(dev).unwrap();
        let bytes = (2 * hkv * kv * d * 4) as f64;
        time(&format!("attention decode Hq=32 Hkv=8 D=128 kv={kv}"), bytes, 50, &|| {
            nuvec::attention(&q, &kk, &kk, kv, 0.088).unwrap()
        });
    }
    for l in [512usize, 2048] {
        let (hq, hkv, d) = (32usize, 8usize, 128usize);
        let q = arr(&rng.vec(l * hq * d, 1.0), &[l, hq, d]).to_device(dev).unwrap();
        let kk = arr(&rng.vec(hkv * l * d, 1.0), &[hkv, l, d]).to_device(dev).unwrap();
        let flops = (4 * hq * l * l * d) as f64; // QK^T and PV, the full (unmasked) products
        time(&format!("attention prefill L={l} Hq=32 Hkv=8 D=128 (GFLOP/s as GB/s)"), flops, 5, &|| {
            nuvec::attention(&q, &kk, &kk, l, 0.088).unwrap()
        });
    }
    // Qwen3-0.6B shapes and the 8B's LM head.
    for (n, kk) in [(2048usize, 1024usize), (3072, 1024), (1024, 3072), (151936, 1024), (4096, 14336), (128256, 4096)] {
        let w = quantized(&mut rng, n, kk, 4, 64, DType::BF16).to_device(dev).unwrap();
        let x = arr(&rng.vec(kk, 1.0), &[1, kk]).to_device(dev).unwrap();
        time(&format!("linear q4 g64 [1,{kk}] x [{n},{kk}]"), w.nbytes() as f64, 50, &|| x.linear(&w).unwrap());
    }
    // The 8B's fused q/k/v launch and its down projection of silu(gate) * up (one row).
    let qkv: Vec<Matrix> = [4096usize, 1024, 1024]
        .iter()
        .map(|&n| quantized(&mut rng, n, 4096, 4, 64, DType::BF16).to_device(dev).unwrap())
        .collect();
    let qkv_bytes = qkv.iter().map(|w| w.nbytes() as f64).sum::<f64>();
    let x = arr(&rng.vec(4096, 1.0), &[1, 4096]).to_device(dev).unwrap();
    let refs: Vec<&Matrix> = qkv.iter().collect();
    time("linear_many q4 g64 [1,4096] x q/k/v [4096|1024|1024,4096]", qkv_bytes, 50, &|| {
        x.linear_many(&refs).unwrap().remove(0)
    });
    let down = quantized(&mut rng, 4096, 14336, 4, 64, DType::BF16).to_device(dev).unwrap();
    let (g, u) = (arr(&rng.vec(14336, 1.0), &[1, 14336]), arr(&rng.vec(14336, 1.0), &[1, 14336]));
    let (g, u) = (g.to_device(dev).unwrap(), u.to_device(dev).unwrap());
    time("silu_mul_linear q4 g64 [1,14336] x [4096,14336]", down.nbytes() as f64, 50, &|| {
        g.silu_mul_linear(&u, &down).unwrap()
    });
    // The 8B's and Qwen3-0.6B's gate/up with silu(gate) * up: one gate_up_silu launch, against
    // linear_many then silu_mul (two).
    for (n, kk) in [(14336usize, 4096usize), (3072, 1024)] {
        let gate = quantized(&mut rng, n, kk, 4, 64, DType::BF16).to_device(dev).unwrap();
        let up = quantized(&mut rng, n, kk, 4, 64, DType::BF16).to_device(dev).unwrap();
        let bytes = (gate.nbytes() + up.nbytes()) as f64;
        let x = arr(&rng.vec(kk, 1.0), &[1, kk]).to_device(dev).unwrap();
        time(&format!("gate_up_silu q4 g64 [1,{kk}] x 2 x [{n},{kk}]"), bytes, 50, &|| {
            x.gate_up_silu(&gate, &up).unwrap()
        });
        time(&format!("linear_many + silu_mul q4 g64 [1,{kk}] x 2 x [{n},{kk}]"), bytes, 50, &|| {
            let [g, u]: [Array; 2] = x.linear_many(&[&gate, &up]).unwrap().try_into().unwrap();
            g.silu_mul(&u).unwrap()
        });
    }
    // Row ops of a decode step: the norms and the greedy pick over Qwen3's vocabulary.
    let (a, b) = (arr(&rng.vec(4096, 1.0), &[1, 4096]), arr(&rng.vec(4096, 1.0), &[1, 4096]));
    let (a, b) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
    let nw = arr(&rng.vec(4096, 1.0), &[4096]).to_device(dev).unwrap();
    time("add_rms_norm [1,4096]", (4 * 4096 * 4) as f64, 50, &|| a.add_rms_norm(&b, &nw, 1e-5).unwrap().1);
    let logits = arr(&rng.vec(151936, 1.0), &[1, 151936]).to_device(dev).unwrap();
    // `time` waits by reading its result's first row as f32: a row of the logits, read after the
    // u32 triple was enqueued on the same stream.
    time("argmax_gap [1,151936]", (151936 * 4) as f64, 50, &|| {
        let _pick = logits.argmax_gap().unwrap();
        logits.slice_rows(0, 1).unwrap()
    });
    // The copy bandwidth the roofline is measured against: add reads 2 and writes 1 array.
    let big = 1usize << 28;
    let a = Array::zeros_on(&[big], DType::F32, dev).unwrap();
    let b = Array::zeros_on(&[big], DType::F32, dev).unwrap();
    time("add of 2 x 1 GiB f32 (copy bandwidth: 3 GiB moved)", (3 * big * 4) as f64, 20, &|| a.add(&b).unwrap());
    let x = arr(&rng.vec(k, 1.0), &[1, k]).to_device(dev).unwrap();
    let w = arr(&rng.vec(k, 1.0), &[k]).to_device(dev).unwrap();
    time("rms_norm [1,4096] (launch-bound)", (k * 8) as f64, 200, &|| x.rms_norm(&w, 1e-5).unwrap());

    // Host cost per op: 1000 tiny dependent ops per call, with the allocation cache on and off
    // (off: every op allocates and frees through the driver, as before the cache), and the
    // residual add + norm of a decode step as two ops and as the fused one.
    let x = arr(&rng.vec(1024, 1.0), &[1, 1024]).to_device(dev).unwrap();
    let w = arr(&rng.vec(1024, 1.0), &[1024]).to_device(dev).unwrap();
    let per_op = |name: &str, f: &dyn Fn(&Array) -> Array| {
        let run = || {
            let mut y = x.clone();
            for _ in 0..1000 {
                y = f(&y);
            }
            y.to_vec::<f32>().unwrap()
        };
        run();
        let t = std::time::Instant::now();
        for _ in 0..5 {
            run();
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / 5000.0;
        eprintln!("TIMING {name:<52} {us:9.2} us per op (1000 per call)");
    };
    for (cache, limit) in [("cache on", 1usize << 30), ("cache off", 0)] {
        nuvec::backends::cuda::set_cache_limit(0, limit).unwrap();
        per_op(&format!("rms_norm [1,1024], {cache}"), &|y| y.rms_norm(&w, 1e-5).unwrap());
        per_op(&format!("add + rms_norm [1,1024], {cache}"), &|y| y.add(&x).unwrap().rms_norm(&w, 1e-5).unwrap());
        per_op(&format!("add_rms_norm [1,1024] (fused), {cache}"), &|y| y.add_rms_norm(&x, &w, 1e-5).unwrap().1);
    }
    nuvec::backends::cuda::set_cache_limit(0, 1 << 30).unwrap();
    // Phase 4: the prefill products in each matmul precision (8B shapes; TFLOP/s printed in the
    // GB/s column as GFLOP/s). Attention counts the full (unmasked) products, as above.
    let w = quantized(&mut rng, 14336, k, 4, 64, DType::BF16).to_device(dev).unwrap();
    let wb = Matrix::Dense(floats(&rng.vec(14336 * k, 0.02), &[14336, k], DType::BF16)).to_device(dev).unwrap();
    let xs: Vec<Array> =
        [512usize, 4096].iter().map(|&m| arr(&rng.vec(m * k, 1.0), &[m, k]).to_device(dev).unwrap()).collect();
    let (hq, hkv, d) = (32usize, 8usize, 128usize);
    let att: Vec<(usize, Array, Array)> = [2048usize, 4096]
        .iter()
        .map(|&l| {
            let q = arr(&rng.vec(l * hq * d, 1.0), &[l, hq, d]).to_device(dev).unwrap();
            let kk = arr(&rng.vec(hkv * l * d, 1.0), &[hkv, l, d]).to_device(dev).unwrap();
            (l, q, kk)
        })
        .collect();
    for precision in [MatmulPrecision::F32, MatmulPrecision::Tf32, MatmulPrecision::Bf16] {
        set_matmul_precision(precision);
        for x in &xs {
            let m = x.dim(0);
            let flops = (2 * m * 14336 * k) as f64;
            time(&format!("{precision} linear q4 g64 [{m},{k}] x [14336,{k}]"), flops, 10, &|| x.linear(&w).unwrap());
            time(&format!("{precision} linear bf16 [{m},{k}] x [14336,{k}]"), flops, 10, &|| x.linear(&wb).unwrap());
        }
        for (l, q, kk) in &att {
            let flops = (4 * hq * l * l * d) as f64;
            time(&format!("{precision} attention prefill L=kv={l} Hq=32 Hkv=8 D=128"), flops, 5, &|| {
                nuvec::attention(q, kk, kk, *l, 0.088).unwrap()
            });
        }
    }
    set_matmul_precision(MatmulPrecision::F32);
}

// ---- decode fusions and the caching allocator ----

#[test]
fn decode_fusions() {
    let dev = gpu();
    let mut rng = Rng::new(12);
    let to = |a: &Array| a.to_device(dev).unwrap();

    // add_rms_norm: the sum is exact, the norm as rms_norm's tolerance.
    for (rows, d) in [(1usize, 1024usize), (37, 100), (5, 4096), (3, 1)] {
        for wdtype in [DType::F32, DType::F16, DType::BF16] {
            let a = arr(&rng.vec(rows * d, 3.0), &[rows, d]);
            let b = arr(&rng.vec(rows * d, 3.0), &[rows, d]);
            let w = floats(&rng.vec(d, 1.0), &[d], wdtype);
            let (want_sum, want) = a.add_rms_norm(&b, &w, 1e-6).unwrap();
            let (got_sum, got) = to(&a).add_rms_norm(&to(&b), &to(&w), 1e-6).unwrap();
            let case = format!("add_rms_norm rows={rows} d={d} weight {wdtype}");
            exact(&format!("{case} (sum)"), &got_sum, &want_sum);
            close(&case, &got, &want);
        }
    }
    assert!(to(&arr(&[1.0; 8], &[2, 4]))
        .add_rms_norm(&to(&arr(&[1.0; 8], &[4, 2])), &to(&arr(&[1.0; 4], &[4])), 1e-6)
        .is_err());

    // rope_qk: q/k norms (Qwen3) or none, both layouts, partial rotation, GQA, L = 1 and 37.
    for (l, hq, hkv, d) in [(1usize, 16usize, 8usize, 128usize), (37, 4, 2, 64), (5, 3, 1, 80)] {
        for rotated in [d, d / 2] {
            let half = rotated / 2;
            let freqs: Vec<f32> = (0..half).map(|i| 1e6f32.powf(-2.0 * i as f32 / rotated as f32)).collect();
            for norm in [None, Some(DType::BF16), Some(DType::F32)] {
                for (traditional, offset) in [(false, 0usize), (true, 1000), (false, 517)] {
                    let q = arr(&rng.vec(l * hq * d, 2.0), &[l, hq, d]);
                    let k = arr(&rng.vec(l * hkv * d, 2.0), &[l, hkv, d]);
                    let ws = norm.map(|dt| (floats(&rng.vec(d, 1.0), &[d], dt), floats(&rng.vec(d, 1.0), &[d], dt)));
                    let cpu_norm = ws.as_ref().map(|(a, b)| (a, b, 1e-6f32));
                    let (wq, wk) = nuvec::rope_qk(&q, &k, cpu_norm, &freqs, offset, traditional).unwrap();
                    let gws = ws.as_ref().map(|(a, b)| (to(a), to(b)));
                    let gpu_norm = gws.as_ref().map(|(a, b)| (a, b, 1e-6f32));
                    let (gq, gk) = nuvec::rope_qk(&to(&q), &to(&k), gpu_norm, &freqs, offset, traditional).unwrap();
                    let case = format!(
                        "rope_qk L={l} Hq={hq} Hkv={hkv} D={d} rot={rotated} norm={norm:?} trad={traditional} off={offset}"
                    );
                    close(&format!("{case} q"), &gq, &wq);
                    close(&format!("{case} k"), &gk, &wk);
                }
            }
        }
    }

    // rope_qk_write_kv: one launch equals rope_qk then write_kv_rows on this device bit for bit
    // (queries and both caches), and the CPU (the trait's composition) at the file's tolerance;
    // a cache of another dtype takes the separate ops.
    for (l, hq, hkv, d, cap, at) in [(1usize, 32usize, 8usize, 128usize, 300usize, 17usize), (5, 4, 2, 64, 64, 59)] {
        let freqs: Vec<f32> = (0..d / 2).map(|i| 5e5f32.powf(-2.0 * i as f32 / d as f32)).collect();
        for norm in [None, Some(DType::BF16)] {
            let q = arr(&rng.vec(l * hq * d, 2.0), &[l, hq, d]);
            let k = arr(&rng.vec(l * hkv * d, 2.0), &[l, hkv, d]);
            let v = arr(&rng.vec(l * hkv * d, 2.0), &[l, hkv, d]);
            let (kc, vc) =
                (arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]), arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]));
            let ws = norm.map(|dt| (floats(&rng.vec(d, 1.0), &[d], dt), floats(&rng.vec(d, 1.0), &[d], dt)));
            let cpu_norm = ws.as_ref().map(|(a, b)| (a, b, 1e-6f32));
            let gws = ws.as_ref().map(|(a, b)| (to(a), to(b)));
            let gpu_norm = gws.as_ref().map(|(a, b)| (a, b, 1e-6f32));
            let case = format!("rope_qk_write_kv L={l} Hq={hq} Hkv={hkv} D={d} norm={norm:?} at {at}");
            let (mut wk, mut wv) = (kc.clone(), vc.clone());
            let wq = nuvec::rope_qk_write_kv(&q, &k, &v, cpu_norm, &freqs, 300, false, (&mut wk, &mut wv, at)).unwrap();
            let (mut gk, mut gv) = (to(&kc), to(&vc));
            let (gq_in, gk_in, gv_in) = (to(&q), to(&k), to(&v));
            let gq =
                nuvec::rope_qk_write_kv(&gq_in, &gk_in, &gv_in, gpu_norm, &freqs, 300, false, (&mut gk, &mut gv, at))
                    .unwrap();
            let (sq, sk) = nuvec::rope_qk(&gq_in, &gk_in, gpu_norm, &freqs, 300, false).unwrap();
            let (mut sk_cache, mut sv_cache) = (to(&kc), to(&vc));
            sk_cache.write_kv_rows(&mut sv_cache, &sk, &gv_in, at).unwrap();
            exact(&format!("{case}: queries = rope_qk's"), &gq, &sq);
            exact(&format!("{case}: key cache = rope_qk then write_kv_rows"), &gk, &sk_cache);
            exact(&format!("{case}: value cache = write_kv_rows'"), &gv, &sv_cache);
            close(&format!("{case} q against the CPU"), &gq, &wq);
            close(&format!("{case} key cache against the CPU"), &gk, &wk);
            exact(&format!("{case} value cache against the CPU"), &gv, &wv);
            // A bf16 cache: this backend's write_kv_rows refuses it, and so does the fused op
            // (it runs the separate ops for caches it does not take).
            let bf = |c: &Array| to(&c.astype(DType::BF16).unwrap());
            let (mut hk, mut hv) = (bf(&kc), bf(&vc));
            let fused =
                nuvec::rope_qk_write_kv(&gq_in, &gk_in, &gv_in, gpu_norm, &freqs, 300, false, (&mut hk, &mut hv, at));
            let (mut bk, mut bv) = (bf(&kc), bf(&vc));
            let separate = bk.write_kv_rows(&mut bv, &sk, &gv_in, at);
            assert_eq!(
                fused.is_ok(),
                separate.is_ok(),
                "{case}: a bf16 cache, fused {fused:?} / separate {separate:?}"
            );
        }
    }

    // write_kv_rows: both caches at once, bit for bit; a shared cache copy stays as it was.
    let (a, cap, c, n) = (4usize, 300usize, 64usize, 37usize);
    let kc = arr(&rng.vec(a * cap * c, 1.0), &[a, cap, c]);
    let vc = arr(&rng.vec(a * cap * c, 1.0), &[a, cap, c]);
    for (rows, offset) in [(1usize, 0usize), (n, 17), (1, cap - 1)] {
        let k = arr(&rng.vec(rows * a * c, 1.0), &[rows, a, c]);
        let v = arr(&rng.vec(rows * a * c, 1.0), &[rows, a, c]);
        let (mut wk, mut wv) = (kc.clone(), vc.clone());
        wk.write_kv_rows(&mut wv, &k, &v, offset).unwrap();
        let (mut gk, mut gv) = (to(&kc), to(&vc));
        let shared = gk.clone();
        gk.write_kv_rows(&mut gv, &to(&k), &to(&v), offset).unwrap();
        exact(&format!("write_kv_rows [{rows},{a},{c}] at {offset} (keys)"), &gk, &wk);
        exact(&format!("write_kv_rows [{rows},{a},{c}] at {offset} (values)"), &gv, &wv);
        exact("write_kv_rows leaves a shared copy alone", &shared, &to(&kc));
    }
    let one = arr(&rng.vec(2 * a * c, 1.0), &[2, a, c]);
    assert!(to(&kc).write_kv_rows(&mut to(&vc), &to(&one), &to(&one), cap - 1).is_err(), "past the capacity");

    // argmax_gap: index, maximum and gap bit for bit: ties, the maximum first or last, near
    // ties, NaN and infinities, long rows.
    let mut rows = rng.vec(8 * 1000, 5.0);
    rows[10] = 9.0; // row 0: maximum early, a tie later
    rows[900] = 9.0;
    rows[1000] = 9.0; // row 1: maximum first
    rows[2999] = 9.0; // row 2: maximum last, a near tie before it
    rows[2500] = 9.0 - 1e-6;
    rows[3100] = f32::NAN; // row 3: a NaN
    rows[4000] = f32::NAN; // row 4: a leading NaN
    rows[5000..6000].iter_mut().for_each(|v| *v = f32::NEG_INFINITY); // row 5: all -inf
    rows[6500] = f32::INFINITY; // row 6: +inf
    let x = arr(&rows, &[8, 1000]);
    let want = x.argmax_gap().unwrap();
    let got = to(&x).argmax_gap().unwrap();
    assert_eq!((got.dtype(), got.shape()), (DType::U32, &[8usize, 3][..]));
    let (g, w) = (got.to_vec::<u32>().unwrap(), want.to_vec::<u32>().unwrap());
    assert_eq!(g, w, "argmax_gap [8,1000]");
    let ids: Vec<u32> = w.chunks(3).map(|r| r[0]).collect();
    assert_eq!(ids, x.argmax().unwrap().to_vec::<u32>().unwrap(), "argmax_gap's index is argmax's");
    // Rows of 5000: the GPU cuts a row into ranges of 1024+ values, one block each, and combines
    // them: ties and near ties across ranges, a range of NaNs, the maximum at a range's start.
    let n = 5000;
    let mut rows = rng.vec(8 * n, 5.0);
    rows[100] = 9.0; // row 0: a tie two ranges later
    rows[3000] = 9.0;
    rows[n + 4999] = 9.0; // row 1: maximum last, a near tie in the first range
    rows[n + 7] = 9.0 - 1e-6;
    rows[2 * n + 1000..2 * n + 2000].iter_mut().for_each(|v| *v = f32::NAN); // row 2: a range of NaN
    rows[3 * n] = f32::NAN; // row 3: a leading NaN
    rows[4 * n + 1000] = 9.0; // row 4: the maximum at a range's first value
    rows[4 * n + 999] = 9.0 - 1e-6;
    rows[5 * n..6 * n].iter_mut().for_each(|v| *v = f32::NEG_INFINITY); // row 5: all -inf
    rows[6 * n + 4000] = f32::INFINITY; // row 6: +inf late
    rows[7 * n..8 * n].iter_mut().for_each(|v| *v = f32::NAN); // row 7: all NaN
    let x = arr(&rows, &[8, n]);
    let (g, w) = (to(&x).argmax_gap().unwrap(), x.argmax_gap().unwrap());
    assert_eq!(g.to_vec::<u32>().unwrap(), w.to_vec::<u32>().unwrap(), "argmax_gap [8,5000]");
    assert_eq!(
        to(&x).argmax().unwrap().to_vec::<u32>().unwrap(),
        x.argmax().unwrap().to_vec::<u32>().unwrap(),
        "argmax [8,5000]"
    );
    let x3 = arr(&rng.vec(2 * 151_936, 10.0), &[2, 151_936]);
    let (g, w) = (to(&x3).argmax_gap().unwrap(), x3.argmax_gap().unwrap());
    assert_eq!(g.to_vec::<u32>().unwrap(), w.to_vec::<u32>().unwrap(), "argmax_gap [2,151936]");
    eprintln!("RESULT {:<60} exact", "argmax_gap (ties, near ties, NaN, inf, across ranges, [2,151936])");

    // mask_rows (a constraint's mask before the greedy pick): bit for bit the CPU's, rows whose
    // length is not a multiple of 32, a row refusing everything, one allowing everything.
    let (rows_n, n) = (4usize, 151_939usize);
    let words = n.div_ceil(32);
    let mut bits: Vec<u32> = (0..rows_n * words).map(|i| (i as u32).wrapping_mul(2_654_435_761)).collect();
    bits[words..2 * words].fill(0);
    bits[2 * words..3 * words].fill(u32::MAX);
    let x = arr(&rng.vec(rows_n * n, 4.0), &[rows_n, n]);
    let (g, w) = (to(&x).mask_rows(&bits, f32::MIN).unwrap(), x.mask_rows(&bits, f32::MIN).unwrap());
    assert_eq!(g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap(), "mask_rows [4,151939]");
    let masked = w.to_vec::<f32>().unwrap();
    assert!(
        masked[n..2 * n].iter().all(|&v| v == f32::MIN)
            && masked[2 * n..3 * n] == x.to_vec::<f32>().unwrap()[2 * n..3 * n]
    );
    assert!(to(&x).mask_rows(&bits[1..], f32::MIN).is_err(), "a mask of the wrong length");
    eprintln!("RESULT {:<60} exact", "mask_rows [4,151939]");

    // masked_argmax_gap: the pick over those masked rows, never written out, bit for bit the
    // CPU's argmax_gap of them (the refusing row's pick is its first entry, the fill).
    let want = w.argmax_gap().unwrap().to_vec::<u32>().unwrap();
    let got = to(&x).masked_argmax_gap(&bits, f32::MIN).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(got, want, "masked_argmax_gap [4,151939]");
    assert_eq!(x.masked_argmax_gap(&bits, f32::MIN).unwrap().to_vec::<u32>().unwrap(), want, "the CPU's");
    assert_eq!(got[3], 0, "the row refusing everything");
    assert!(to(&x).masked_argmax_gap(&bits[1..], f32::MIN).is_err(), "a mask of the wrong length");
    eprintln!("RESULT {:<60} exact", "masked_argmax_gap [4,151939]");
}

#[test]
fn caching_allocator_reuses_memory_safely() {
    let dev = gpu();
    let mut rng = Rng::new(13);
    let limit = 8usize << 20;
    nuvec::backends::cuda::set_cache_limit(0, limit).unwrap();
    // Mixed sizes (small powers of two, odd sizes, over 1 MiB), allocated and dropped in
    // varying order; every result is checked against the CPU, so a buffer handed out while
    // still in use would show as a wrong value.
    let sizes = [1usize, 3, 64, 255, 256, 1000, 4096, 70_001, 262_144, 300_000, 1 << 20];
    let mut held: Vec<(Array, Vec<f32>)> = Vec::new();
    for round in 0..400 {
        let n = sizes[rng.next_u32() as usize % sizes.len()];
        let a = rng.vec(n, 1.0);
        let b = rng.vec(n, 1.0);
        let sum = to_gpu(&a, dev).add(&to_gpu(&b, dev)).unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        held.push((sum, want));
        // Drop a random held array now and then (its memory goes to the cache).
        if held.len() > 6 || round % 3 == 0 {
            let i = rng.next_u32() as usize % held.len();
            let (arr_gpu, want) = held.swap_remove(i);
            assert_eq!(arr_gpu.to_vec::<f32>().unwrap(), want, "round {round}: values changed while held");
        }
        let cached = nuvec::backends::cuda::cached_bytes(0).unwrap();
        assert!(cached <= limit, "round {round}: {cached} bytes cached over the limit of {limit}");
    }
    for (arr_gpu, want) in held {
        assert_eq!(arr_gpu.to_vec::<f32>().unwrap(), want);
    }
    // Zeroed arrays from reused memory are zero.
    for n in [5usize, 1000, 300_000] {
        let z = Array::zeros_on(&[n], DType::F32, dev).unwrap();
        assert!(z.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0), "zeros_on({n}) from the cache");
    }
    // An impossible allocation is an error (after handing the cache back), not a panic, and
    // the device works afterwards.
    let e = Array::zeros_on(&[1usize << 40], DType::F32, dev).unwrap_err().to_string();
    assert!(e.contains("allocating"), "{e}");
    let a = rng.vec(1000, 1.0);
    assert_eq!(
        to_gpu(&a, dev).add(&to_gpu(&a, dev)).unwrap().to_vec::<f32>().unwrap(),
        a.iter().map(|x| x + x).collect::<Vec<_>>()
    );
    // Turning the cache off frees what it holds.
    nuvec::backends::cuda::set_cache_limit(0, 0).unwrap();
    assert_eq!(nuvec::backends::cuda::cached_bytes(0).unwrap(), 0);
    nuvec::backends::cuda::set_cache_limit(0, 1 << 30).unwrap();
    eprintln!("RESULT {:<60} ok", "caching allocator (400 rounds of mixed sizes)");
}

fn to_gpu(data: &[f32], dev: Device) -> Array {
    Array::from_slice_on(data, &[data.len()], dev).unwrap()
}

/// A paged cache's quantized keys and values on the GPU (kernels/kv_quant.cu): rows quantized
/// into a store where they are give `quantize_affine`'s words, scales and biases bit for bit
/// (every width MLX allows, groups of 32, 64 and 128; f32, f16 and bf16 rows; a constant group and
/// a NaN), the other rows kept; a sequence's positions read back through a scattered block table
/// equal the CPU backend's gather of the same store; a block copied within the store is its source.
#[test]
fn quantized_kv_rows_on_the_device_are_the_hosts() {
    let dev = gpu();
    let mut rng = Rng::new(77);
    let (heads, dim, bs, blocks) = (2usize, 64usize, 4usize, 8usize);
    let (cols, store_rows) = (heads * dim, bs * blocks);
    for bits in [2usize, 3, 4, 5, 6, 8] {
        for group in [32usize, 64, 128] {
            let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
            let case = format!("{bits}-bit g{group}");
            let mut x = rng.vec(9 * cols, 3.0);
            x[..group].iter_mut().for_each(|v| *v = 0.75);
            x[cols + 3] = f32::NAN;
            let dtype = [DType::F32, DType::F16, DType::BF16][bits % 3];
            let rows = floats(&x, &[9, cols], dtype);
            let (words, groups) = (cols * bits / 32, cols / group);
            let zeros = |w, t| Array::zeros_on(&[store_rows, w], t, dev).unwrap();
            let mut store = Quantized::new(
                zeros(words, DType::U32),
                zeros(groups, DType::F32),
                zeros(groups, DType::F32),
                spec,
                cols,
            )
            .unwrap();
            let slots: Vec<usize> = (5..14).collect();
            nuvec::quantize_rows_into(&rows.to_device(dev).unwrap(), &mut store, &slots).unwrap();
            let want =
                nuvec::quantize::quantize_affine(&rows.to_f32_vec().unwrap(), 9, cols, spec, DType::F32).unwrap();
            let got_words = store.packed.to_vec::<u32>().unwrap();
            assert_eq!(&got_words[5 * words..14 * words], &want.packed.to_vec::<u32>().unwrap()[..], "{case}: words");
            assert!(
                got_words[..5 * words].iter().chain(&got_words[14 * words..]).all(|&w| w == 0),
                "{case}: other rows"
            );
            for (got, want, what) in [(&store.scales, &want.scales, "scales"), (&store.biases, &want.biases, "biases")]
            {
                let got = got.to_vec::<f32>().unwrap();
                let bits_of = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits_of(&got[5 * groups..14 * groups]),
                    bits_of(&want.to_vec::<f32>().unwrap()),
                    "{case}: {what}"
                );
            }
            // Positions 3 .. 9 of a sequence whose blocks are 3, 1, 2: rows 15, 4-7, 8-9, against
            // the host's rule (dequantize_rows) in the layout attention reads.
            let table = [3u32, 1, 2];
            let (scales, biases) = (store.scales.to_vec::<f32>().unwrap(), store.biases.to_vec::<f32>().unwrap());
            let mut want = vec![0f32; 7 * cols];
            let mut row = vec![0f32; cols];
            for (i, p) in (3..10).enumerate() {
                let r = table[p / bs] as usize * bs + p % bs;
                let (wr, gr) = (&got_words[r * words..(r + 1) * words], r * groups..(r + 1) * groups);
                nuvec::quantize::dequantize_rows(wr, &scales[gr.clone()], &biases[gr], cols, spec, &mut row);
                for h in 0..heads {
                    want[(h * 7 + i) * dim..(h * 7 + i + 1) * dim].copy_from_slice(&row[h * dim..(h + 1) * dim]);
                }
            }
            let got = nuvec::dequantize_paged(&store, heads, &table, bs, 3, 10).unwrap();
            assert_eq!(got.device(), dev);
            exact(&format!("{case}: dequantize_paged"), &got, &Array::from_slice(&want, &[heads, 7, dim]).unwrap());
            // Block 1 (rows 4-7) copied over block 6: the same words, scales and biases.
            for part in [&mut store.packed, &mut store.scales, &mut store.biases] {
                backend(dev).copy_rows_within(part, 4, 24, bs).unwrap();
            }
            let words_after = store.packed.to_vec::<u32>().unwrap();
            assert_eq!(words_after[24 * words..28 * words], words_after[4 * words..8 * words], "{case}: copied block");
            assert_eq!(words_after[..24 * words], got_words[..24 * words], "{case}: the rest kept");
            eprintln!("RESULT {:<60} bit for bit", format!("quantized KV rows {case} ({dtype})"));
        }
    }
}

/// Decode attention over quantized paged stores on the GPU (attention.cu
/// `paged_attention_split_quant_f32`, the codes read in place): three sequences of 1, 40 and 300
/// positions through scattered block tables, 4 and 8 bits, with and without sinks: each row bit
/// for bit attention over that sequence's positions dequantized (`dequantize_paged`), as a step
/// of few sequences keeps each one's own splits.
#[test]
fn paged_decode_over_quantized_stores_reads_the_codes_in_place() {
    let dev = gpu();
    let mut rng = Rng::new(91);
    let (hq, hkv, d, bs, blocks) = (8usize, 2usize, 64usize, 16usize, 24usize);
    let lens = [1usize, 40, 300];
    let tables = scattered_tables(&lens, bs, blocks);
    let cols = hkv * d;
    let scale = (d as f32).powf(-0.5);
    for (bits, group) in [(8usize, 64usize), (4, 32)] {
        let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
        let store = |rng: &mut Rng| {
            let zeros = |w, t| Array::zeros_on(&[blocks * bs, w], t, dev).unwrap();
            let mut q = Quantized::new(
                zeros(cols * bits / 32, DType::U32),
                zeros(cols / group, DType::F32),
                zeros(cols / group, DType::F32),
                spec,
                cols,
            )
            .unwrap();
            let rows = arr(&rng.vec(blocks * bs * cols, 2.0), &[blocks * bs, cols]).to_device(dev).unwrap();
            nuvec::quantize_rows_into(&rows, &mut q, &(0..blocks * bs).collect::<Vec<_>>()).unwrap();
            q
        };
        let (k, v) = (store(&mut rng), store(&mut rng));
        let q = arr(&rng.vec(lens.len() * hq * d, 1.0), &[lens.len(), hq, d]).to_device(dev).unwrap();
        let sinks: Vec<f32> = rng.vec(hq, 1.0);
        for sinks in [None, Some(&sinks[..])] {
            let seqs: Vec<nuvec::PagedSeq> =
                tables.iter().zip(lens).map(|(t, len)| nuvec::PagedSeq::new(t, len)).collect();
            let got = nuvec::paged_decode_attention_quantized(&q, &k, &v, &seqs, bs, scale, sinks).unwrap();
            for (i, s) in seqs.iter().enumerate() {
                let ks = nuvec::dequantize_paged(&k, hkv, s.table, bs, 0, s.len).unwrap();
                let vs = nuvec::dequantize_paged(&v, hkv, s.table, bs, 0, s.len).unwrap();
                let qi = q.slice_rows(i, i + 1).unwrap();
                let want = match sinks {
                    None => nuvec::attention(&qi, &ks, &vs, s.len, scale).unwrap(),
                    Some(sk) => nuvec::attention_sinks(&qi, &ks, &vs, s.len, scale, sk).unwrap(),
                };
                let case =
                    format!("{bits}-bit g{group}, sinks {}, sequence {i} of {} positions", sinks.is_some(), s.len);
                exact(&case, &got.slice_rows(i, i + 1).unwrap(), &want.reshape(&[1, hq * d]).unwrap());
            }
        }
        eprintln!("RESULT {:<60} bit for bit", format!("paged decode over {bits}-bit g{group} stores"));
    }
}
