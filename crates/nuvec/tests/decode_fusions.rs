//! The decode fusions (`add_rms_norm`, `linear_add_rms_norm`, `rope_qk`, `write_kv_rows`,
//! `gate_up_silu`, `argmax_gap`) on the CPU.
//!
//! The CPU backend runs the trait's composed defaults of the first five (on a CPU the fused
//! passes would save nothing measurable at decode sizes), so comparing them with the ops they
//! replace would compare the composition with itself. Their fused paths are the CUDA backend's,
//! tested against the composition in `tests/cuda_ops.rs` (`decode_fusions`,
//! `gate_up_silu_fused_and_composed`, `linear_add_rms_norm_folds_the_norm`,
//! `rope_and_paged_writes_of_a_decode_step_in_one_launch`) and `tests/cuda_graph.rs` on a GPU.
//! What is checked here: `argmax_gap` against a direct reading of each row, the refusals of bad
//! input that the defaults give every backend, and the down projection after `gate_up_silu`
//! through the CPU's own fused `silu_mul_linear`.

use nuvec::quantize::quantize_affine;
use nuvec::{backend, Array, DType, Device, Matrix, QuantMode, QuantSpec};

struct Rng(u64);

impl Rng {
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

fn arr(data: &[f32], shape: &[usize]) -> Array {
    Array::from_slice(data, shape).unwrap()
}

fn bits(a: &Array) -> Vec<u32> {
    a.to_f32_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

fn same(case: &str, got: &Array, want: &Array) {
    assert_eq!(got.shape(), want.shape(), "{case}: shapes");
    assert_eq!(bits(got), bits(want), "{case}: values");
}

#[test]
fn add_rms_norm_refuses_mismatched_shapes() {
    let w = arr(&[1.0; 4], &[4]);
    assert!(arr(&[1.0; 8], &[2, 4]).add_rms_norm(&arr(&[1.0; 8], &[4, 2]), &w, 1e-6).is_err(), "shapes differ");
    assert!(arr(&[1.0; 8], &[2, 4]).add_rms_norm(&arr(&[1.0; 8], &[2, 4]), &arr(&[1.0; 3], &[3]), 1e-6).is_err());
}

#[test]
fn rope_qk_refuses_q_and_k_of_different_lengths() {
    let q = arr(&[0.0; 2 * 4 * 8], &[2, 4, 8]);
    let k3 = arr(&[0.0; 3 * 4 * 8], &[3, 4, 8]);
    assert!(nuvec::rope_qk(&q, &k3, None, &[1.0], 0, false).is_err());
}

#[test]
fn write_kv_rows_refuses_rows_past_the_capacity() {
    let mut rng = Rng(9);
    let (a, cap, c) = (4usize, 300usize, 64usize);
    let mut k = arr(&rng.vec(a * cap * c, 1.0), &[a, cap, c]);
    let mut v = arr(&rng.vec(a * cap * c, 1.0), &[a, cap, c]);
    let two = arr(&rng.vec(2 * a * c, 1.0), &[2, a, c]);
    let before = (bits(&k), bits(&v));
    assert!(k.write_kv_rows(&mut v, &two, &two, cap - 1).is_err());
    assert_eq!((bits(&k), bits(&v)), before, "a refused write changes nothing");
}

#[test]
fn argmax_gap_reads_each_row() {
    let mut rng = Rng(10);
    let n = 1000;
    let mut rows = rng.vec(6 * n, 5.0);
    rows[10] = 9.0; // row 0: the first of two maxima, gap to the largest value before it
    rows[900] = 9.0;
    rows[n] = 9.0; // row 1: maximum first, gap infinite
    rows[3 * n - 1] = 9.0; // row 2: maximum last, a near tie before it
    rows[2 * n + 500] = 9.0 - 1e-6;
    rows[3 * n + 100] = f32::NAN; // row 3: a NaN, gap NaN
    rows[4 * n] = f32::NAN; // row 4: a leading NaN wins, as in argmax
    rows[5 * n + 7] = f32::INFINITY; // row 5: +inf
    let x = arr(&rows, &[6, n]);
    let out = backend(Device::Cpu).argmax_gap(&x).unwrap();
    assert_eq!((out.dtype(), out.shape()), (DType::U32, &[6usize, 3][..]));
    let out = out.to_vec::<u32>().unwrap();
    let argmax = x.argmax().unwrap().to_vec::<u32>().unwrap();
    for (r, got) in out.chunks(3).enumerate() {
        let row = &rows[r * n..(r + 1) * n];
        let (index, max, gap) = (got[0], f32::from_bits(got[1]), f32::from_bits(got[2]));
        assert_eq!(index, argmax[r], "row {r}: the index is argmax's");
        assert_eq!(max.to_bits(), row[index as usize].to_bits(), "row {r}: the maximum");
        if row.iter().any(|v| !v.is_finite()) {
            assert!(gap.is_nan(), "row {r}: a NaN or infinity makes the gap NaN, got {gap}");
        } else {
            let before = row[..index as usize].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(gap.to_bits(), (max - before).to_bits(), "row {r}: gap");
        }
    }
    assert_eq!((out[0], f32::from_bits(out[2]) > 0.0), (10, true), "row 0: the first maximum");
    assert_eq!((out[3], f32::from_bits(out[5])), (0, f32::INFINITY), "row 1: maximum first");
    assert_eq!(out[6], (n - 1) as u32, "row 2");
    assert!(f32::from_bits(out[8]) < 2e-6, "row 2: the near tie's gap");
    assert_eq!(out[12], 0, "row 4: a leading NaN");
    assert_eq!(out[15], 7, "row 5: +inf");
    assert!(arr(&[], &[2, 0]).argmax_gap().is_err(), "empty rows");
}

/// A gated MLP's gate or up weight `[n, k]`: dense f32, or 4/8-bit affine (the quantized shapes
/// the one-row fused pass of the CPU's `linear_many` takes, and one it does not: 3 bits).
fn mlp_weight(rng: &mut Rng, n: usize, k: usize, quant: Option<(usize, usize, DType)>) -> Matrix {
    let w = rng.vec(n * k, 0.5);
    match quant {
        None => Matrix::Dense(arr(&w, &[n, k])),
        Some((bits, group, dtype)) => {
            let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
            Matrix::Quantized(quantize_affine(&w, n, k, spec, dtype).unwrap())
        }
    }
}

#[test]
fn the_down_projection_after_gate_up_silu_is_the_fused_silu_mul_linear() {
    let mut rng = Rng(11);
    let quants = [
        None,
        Some((4, 32, DType::BF16)),
        Some((4, 64, DType::F16)),
        Some((4, 16, DType::F32)),
        Some((8, 128, DType::BF16)),
        Some((3, 32, DType::F16)),
    ];
    for (n, k) in [(96usize, 256usize), (1000, 512)] {
        for quant in quants {
            let gate = mlp_weight(&mut rng, n, k, quant);
            let up = mlp_weight(&mut rng, n, k, quant);
            for rows in [1usize, 3, 9] {
                let x = arr(&rng.vec(rows * k, 2.0), &[rows, k]);
                let got = x.gate_up_silu(&gate, &up).unwrap();
                let [g, u]: [Array; 2] = x.linear_many(&[&gate, &up]).unwrap().try_into().unwrap();
                let case = format!("n={n} k={k} {quant:?} rows={rows}");
                // The down projection the model runs next: the same bits as the CPU's fused
                // `silu_mul_linear` (its own kernel) that took silu(gate) * up before.
                let down = mlp_weight(&mut rng, k, n, quant.filter(|&(_, group, _)| n.is_multiple_of(group)));
                same(&format!("{case} down"), &got.linear(&down).unwrap(), &g.silu_mul_linear(&u, &down).unwrap());
            }
        }
    }
    let x = arr(&rng.vec(64, 1.0), &[1, 64]);
    let (gate, up) = (mlp_weight(&mut rng, 8, 64, None), mlp_weight(&mut rng, 9, 64, None));
    assert!(x.gate_up_silu(&gate, &up).is_err(), "gate and up of different rows");
    let narrow = mlp_weight(&mut rng, 8, 32, None);
    assert!(x.gate_up_silu(&narrow, &narrow).is_err(), "weights narrower than x");
}
