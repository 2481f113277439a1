//! mxfp4, mxfp8 and nvfp4 weights on CUDA against the CPU backend (itself checked against MLX in
//! tests/fp_quant.rs): `linear` on the matrix-vector path (up to 8 input rows) and the tiled
//! path, and `embed`, which must decode bit for bit.
//!
//! Needs a CUDA device: without one every test FAILS, saying so. Built only with
//! `--features cuda`. Tolerance as tests/cuda_ops.rs: `|gpu - cpu| <= 1e-4 * (|cpu| + mean|cpu|)`.

#![cfg(feature = "cuda")]

use nuvec::fpquant::quantize_fp;
use nuvec::{Array, Matrix, QuantMode, QuantSpec, Quantized};

mod common;
use common::{close, exact, gpu, randoms};

/// A random matrix quantized in `mode` (optionally with an nvfp4 global scale).
fn matrix(mode: QuantMode, rows: usize, cols: usize, seed: u64, global: Option<f32>) -> Matrix {
    let (bits, group_size) = mode.fixed_shape().unwrap();
    let spec = QuantSpec { mode, bits, group_size };
    let q = quantize_fp(&randoms(rows * cols, seed, 0.3), rows, cols, spec).unwrap();
    Matrix::Quantized(Quantized::new_fp(q.packed, q.scales, global, spec, cols).unwrap())
}

#[test]
fn fp_linear_and_embed_match_the_cpu() {
    let dev = gpu();
    let (n, k) = (200usize, 512usize);
    for (mode, global) in
        [(QuantMode::Mxfp4, None), (QuantMode::Mxfp8, None), (QuantMode::Nvfp4, None), (QuantMode::Nvfp4, Some(2.5))]
    {
        let w = matrix(mode, n, k, 3, global);
        let wg = w.to_device(dev).unwrap();
        let case = format!("{}{}", mode.name(), if global.is_some() { " global" } else { "" });
        for m in [1usize, 3, 8, 9, 40] {
            let x = Array::from_slice(&randoms(m * k, m as u64, 1.0), &[m, k]).unwrap();
            let want = x.linear(&w).unwrap();
            let got = x.to_device(dev).unwrap().linear(&wg).unwrap();
            close(&format!("{case} linear m={m}"), &got, &want);
        }
        let ids: Vec<u32> = vec![0, 199, 7, 7, 123];
        exact(&format!("{case} embed"), &wg.embed(&ids).unwrap(), &w.embed(&ids).unwrap());
        assert!(wg.embed(&[n as u32]).is_err(), "an id outside the vocabulary is an error");
        // decode fusions: one id (a decode step) is read without uploading the ids.
        for id in [0u32, 123, 199] {
            exact(&format!("{case} embed of id {id}"), &wg.embed(&[id]).unwrap(), &w.embed(&[id]).unwrap());
        }
    }
}
