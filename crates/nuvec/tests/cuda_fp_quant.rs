//! mxfp4, mxfp8 and nvfp4 weights on CUDA against the CPU backend (itself checked against MLX in
//! tests/fp_quant.rs): `linear` on the matrix-vector path (up to 8 input rows) and the tiled
//! path, and `embed`, which must decode bit for bit.
//!
//! Needs a CUDA device: without one every test FAILS, saying so. Built only with
//! `--features cuda`. Tolerance as tests/cuda_ops.rs: `|gpu - cpu| <= 1e-4 * (|cpu| + mean|cpu|)`.

#![cfg(feature = "cuda")]

use nuvec::fpquant::quantize_fp;
use nuvec::{Array, Device, Matrix, QuantMode, QuantSpec, Quantized};

const TOL: f32 = 1e-4;

fn gpu() -> Device {
    match nuvec::backends::cuda::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => panic!("no CUDA device: the driver reports 0 devices (these tests need an NVIDIA GPU)"),
        Err(e) => panic!("no CUDA device: {e}"),
    }
    if let Err(e) = nuvec::backends::cuda::init(0) {
        panic!("CUDA device 0 is not usable: {e}");
    }
    Device::Cuda(0)
}

/// Deterministic pseudo-random floats in [-1, 1) times `scale`.
fn randoms(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A random matrix quantized in `mode` (optionally with an nvfp4 global scale).
fn matrix(mode: QuantMode, rows: usize, cols: usize, seed: u64, global: Option<f32>) -> Matrix {
    let (bits, group_size) = mode.fixed_shape().unwrap();
    let spec = QuantSpec { mode, bits, group_size };
    let q = quantize_fp(&randoms(rows * cols, seed, 0.3), rows, cols, spec).unwrap();
    Matrix::Quantized(Quantized::new_fp(q.packed, q.scales, global, spec, cols).unwrap())
}

fn close(case: &str, got: &Array, want: &Array) {
    assert_eq!(got.shape(), want.shape(), "{case}: shapes");
    let (g, w) = (got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap());
    let mean = w.iter().map(|v| v.abs()).sum::<f32>() / w.len().max(1) as f32;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= TOL * (b.abs() + mean), "{case}: element {i}: gpu {a} vs cpu {b}");
    }
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
        let (got, want) = (wg.embed(&ids).unwrap().to_f32_vec().unwrap(), w.embed(&ids).unwrap().to_f32_vec().unwrap());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(a.to_bits() == b.to_bits(), "{case} embed: element {i}: gpu {a} vs cpu {b}");
        }
        assert!(wg.embed(&[n as u32]).is_err(), "an id outside the vocabulary is an error");
        // decode fusions: one id (a decode step) is read without uploading the ids.
        for id in [0u32, 123, 199] {
            let (got, want) =
                (wg.embed(&[id]).unwrap().to_f32_vec().unwrap(), w.embed(&[id]).unwrap().to_f32_vec().unwrap());
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{case} embed of id {id}");
        }
    }
}
