//! Helpers of the CUDA test binaries (`cuda_ops.rs`, `cuda_hybrid_ops.rs`, `cuda_bf16.rs`,
//! `cuda_auto_precision.rs`, `cuda_fp_quant.rs`, `cuda_graph.rs`; each is
//! `#![cfg(feature = "cuda")]`): the device under test, seeded random inputs, and the GPU-vs-CPU
//! comparisons with the tolerance they share. Each binary uses part of it.
#![allow(dead_code)]

use half::{bf16, f16};
use nuvec::backends::cuda::{set_matmul_precision, MatmulPrecision};
use nuvec::{Array, DType, Device};

/// Float results must satisfy `|gpu - cpu| <= TOL * (|cpu| + mean|cpu|)` per element.
pub const TOL: f32 = 1e-4;

/// The device under test with the prefill products in `precision` (process-wide: every test of
/// a binary asks for the same); panics (fails the test) when there is no usable device.
pub fn gpu_with(precision: MatmulPrecision) -> Device {
    set_matmul_precision(precision);
    gpu()
}

/// The device under test, the process-wide prefill precision left as it is; panics (fails the
/// test) when there is no usable device.
pub fn gpu() -> Device {
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

/// xorshift64, seeded: the same inputs on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 16) as u32
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.next_u32() as f32 / 4_294_967_296.0) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

/// `n` seeded pseudo-random floats in [-1, 1) times `scale` (xorshift64, 24 bits per value): the
/// inputs of `cuda_fp_quant.rs` and `cuda_graph.rs`.
pub fn randoms(n: usize, seed: u64, scale: f32) -> Vec<f32> {
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

/// An f32 host array.
pub fn arr(data: &[f32], shape: &[usize]) -> Array {
    Array::from_slice(data, shape).unwrap()
}

/// `data` stored as `dtype` (f32, f16 or bf16) on the host.
pub fn floats(data: &[f32], shape: &[usize], dtype: DType) -> Array {
    match dtype {
        DType::F32 => arr(data, shape),
        DType::F16 => Array::from_slice(&data.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(), shape).unwrap(),
        DType::BF16 => Array::from_slice(&data.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(), shape).unwrap(),
        other => panic!("not a float dtype: {other}"),
    }
}

/// Checks `got` (from the GPU, which it must still be on) against `want` (from the CPU) within
/// [`TOL`] and prints the errors.
pub fn close(case: &str, got: &Array, want: &Array) {
    assert_eq!(got.shape(), want.shape(), "{case}: shapes");
    assert!(matches!(got.device(), Device::Cuda(_)), "{case}: the result should stay on the GPU");
    let (g, w) = (got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap());
    let mean = w.iter().map(|v| v.abs()).sum::<f32>() / w.len().max(1) as f32;
    let (mut max_abs, mut max_rel) = (0f32, 0f32);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let err = (a - b).abs();
        let rel = err / (b.abs() + mean).max(f32::MIN_POSITIVE);
        assert!(err <= TOL * (b.abs() + mean), "{case}: element {i}: gpu {a} vs cpu {b} (mean |cpu| {mean})");
        max_abs = max_abs.max(err);
        max_rel = max_rel.max(rel);
    }
    eprintln!("RESULT {case:<72} max_abs {max_abs:.3e} max_rel {max_rel:.3e}");
}

/// Checks bit-for-bit equality (shape and dtype too).
pub fn exact(case: &str, got: &Array, want: &Array) {
    assert_eq!(got.shape(), want.shape(), "{case}: shapes");
    assert_eq!(got.dtype(), want.dtype(), "{case}: dtypes");
    let (g, w) = (got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(a.to_bits() == b.to_bits(), "{case}: element {i}: gpu {a} vs cpu {b}");
    }
    eprintln!("RESULT {case:<72} exact");
}

/// Block tables for sequences of `lens` positions in blocks of `bs`, ids taken from a pool of
/// `blocks` in a scattered order (every 29th), so that no table is contiguous.
pub fn scattered_tables(lens: &[usize], bs: usize, blocks: usize) -> Vec<Vec<u32>> {
    let mut next = 5u32;
    lens.iter()
        .map(|&len| {
            (0..len.div_ceil(bs))
                .map(|_| {
                    next = (next + 29) % blocks as u32;
                    next
                })
                .collect()
        })
        .collect()
}

/// Positions `0..len` of one sequence of a paged store (`x`: rows of `hkv * d`, position-major)
/// through its block `table`, as a contiguous cache `[hkv, len, d]`.
pub fn gather_paged(x: &[f32], table: &[u32], len: usize, bs: usize, hkv: usize, d: usize) -> Vec<f32> {
    gather_window(x, table, 0..len, bs, hkv, d)
}

/// Positions `range` of one sequence of a paged store, as [`gather_paged`] gathers them: `[hkv,
/// range.len(), d]`.
pub fn gather_window(
    x: &[f32],
    table: &[u32],
    range: std::ops::Range<usize>,
    bs: usize,
    hkv: usize,
    d: usize,
) -> Vec<f32> {
    let (width, n) = (hkv * d, range.len());
    let mut out = vec![0f32; hkv * n * d];
    for (i, j) in range.enumerate() {
        let at = (table[j / bs] as usize * bs + j % bs) * width;
        for h in 0..hkv {
            out[(h * n + i) * d..][..d].copy_from_slice(&x[at + h * d..][..d]);
        }
    }
    out
}

/// `tables` with the entries of the blocks wholly before each sequence's last `window` of its
/// `lens` positions given back (`u32::MAX`, as a sliding-window layer's table marks them), and
/// the sequences as windowed [`nuvec::PagedSeq`]s over them.
pub fn windowed_tables(tables: &[Vec<u32>], lens: &[usize], bs: usize, window: usize) -> Vec<Vec<u32>> {
    tables
        .iter()
        .zip(lens)
        .map(|(t, &len)| {
            let gone = len.saturating_sub(window) / bs;
            t.iter().enumerate().map(|(b, &id)| if b < gone { u32::MAX } else { id }).collect()
        })
        .collect()
}
