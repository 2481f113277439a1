//! One projection's adapter: `y = W x + s·B (A x)` (LoRA), and for DoRA each output then
//! rescaled to the learned magnitude `m` over the adapted row's norm (mlx-lm's `DoRALinear`),
//! the norms computed once from the base weight at load.

use nuvec::{Array, Device, Matrix};
use rayon::prelude::*;

/// `A` as `[r, in]` and `s·B` as `[out, r]` (mlx-lm stores `[in, r]` and `[r, out]`), in f32;
/// DoRA's per-output gain `m / ‖W + s·B A‖` (the adapted rows' norms) too.
#[derive(Debug, Clone)]
pub struct LowRank {
    a: Matrix,
    b: Array,
    /// `b` as a weight, for products of many rows (a prefill's), which the backend's matrix
    /// products run faster than [`Array::add_linear`]'s one thread per output.
    b_matrix: Matrix,
    gain: Option<Array>,
}

/// Rows up to which the second product and the sum are one [`Array::add_linear`].
const ADD_LINEAR_ROWS: usize = 64;

impl LowRank {
    /// From the file's `(lora_a, lora_b, m)` for base weight `base` `[out, in]`.
    pub(super) fn new(
        base: &Matrix,
        (a, b, m): (&Array, &Array, Option<&Array>),
        scale: f32,
        device: Device,
    ) -> std::result::Result<LowRank, String> {
        let (out, inputs) = (base.rows(), base.cols());
        let rank = rank_of(a, b, out, inputs)?;
        let floats = |x: &Array| x.to_f32_vec().map_err(|e| e.to_string());
        let a_t = transpose(&floats(a)?, inputs, rank);
        let b_t: Vec<f32> = transpose(&floats(b)?, rank, out).iter().map(|v| v * scale).collect();
        let gain = match m {
            None => None,
            Some(m) => Some(dora_gain(base, terms((a, b, Some(m)), scale, out, inputs)?)?),
        };
        let upload = |v: &[f32], shape: &[usize]| Array::from_slice_on(v, shape, device).map_err(|e| e.to_string());
        let b = upload(&b_t, &[out, rank])?;
        Ok(LowRank {
            a: Matrix::Dense(upload(&a_t, &[rank, inputs])?),
            b: b.clone(),
            b_matrix: Matrix::Dense(b),
            gain: match gain {
                Some(g) => Some(upload(&g, &[out])?),
                None => None,
            },
        })
    }

    /// The adapted output from `x [.., in]` and the base product `base = x Wᵀ [.., out]`
    /// (without the layer's bias, which comes after DoRA's rescaling).
    pub fn apply(&self, x: &Array, base: Array) -> nuvec::Result<Array> {
        let sum = self.add_to(x, &base)?;
        match &self.gain {
            Some(g) => sum.mul_columns(g),
            None => Ok(sum),
        }
    }

    /// `y + s·B (A x)`: the low-rank term added to `y [.., out]` (for a few rows two launches:
    /// the product by A, then the one by B with the sum).
    pub fn add_to(&self, x: &Array, y: &Array) -> nuvec::Result<Array> {
        let t = x.linear(&self.a)?;
        match t.len() / t.dim(-1).max(1) <= ADD_LINEAR_ROWS {
            true => y.add_linear(&t, &self.b),
            false => y.add(&t.linear(&self.b_matrix)?),
        }
    }

    /// Whether the adapter only adds its term (LoRA): then it can be added to whatever the
    /// base product is summed with (a residual) instead of to the product itself.
    pub fn only_adds(&self) -> bool {
        self.gain.is_none()
    }
}

/// `s·Bᵀ Aᵀ` (`[out, inputs]`) and DoRA's `m`, checked against a base of `out` x `inputs`.
pub(super) fn terms(
    (a, b, m): (&Array, &Array, Option<&Array>),
    scale: f32,
    out: usize,
    inputs: usize,
) -> std::result::Result<(Vec<f32>, Option<Vec<f32>>), String> {
    let rank = rank_of(a, b, out, inputs)?;
    let floats = |x: &Array| x.to_f32_vec().map_err(|e| e.to_string());
    let (a, b) = (floats(a)?, floats(b)?);
    let mut delta = vec![0f32; out * inputs];
    delta.par_chunks_mut(inputs).enumerate().for_each(|(o, row)| {
        for k in 0..rank {
            let bk = scale * b[k * out + o];
            for (j, d) in row.iter_mut().enumerate() {
                *d += bk * a[j * rank + k];
            }
        }
    });
    let m = match m {
        Some(m) if m.shape() != [out] => return Err(format!("m is {:?}, expected [{out}]", m.shape())),
        Some(m) => Some(floats(m)?),
        None => None,
    };
    Ok((delta, m))
}

/// The rank of `lora_a` `[inputs, r]` and `lora_b` `[r, out]`, checked against a base of `out` x
/// `inputs`.
fn rank_of(a: &Array, b: &Array, out: usize, inputs: usize) -> std::result::Result<usize, String> {
    let rank = a.shape().get(1).copied().unwrap_or(0);
    match a.shape() == [inputs, rank] && rank > 0 && b.shape() == [rank, out] {
        true => Ok(rank),
        false => Err(format!(
            "lora_a {:?} and lora_b {:?} do not fit this {out}x{inputs} weight (expected [{inputs}, r] and [r, {out}])",
            a.shape(),
            b.shape()
        )),
    }
}

fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}

/// `m[o] / ‖W[o] + delta[o]‖` for every output `o` (`delta` = `s·BᵀAᵀ`, [`terms`]), with `W`
/// dequantized as mlx-lm does.
fn dora_gain(base: &Matrix, (delta, m): (Vec<f32>, Option<Vec<f32>>)) -> std::result::Result<Vec<f32>, String> {
    let w = match base {
        Matrix::Dense(w) => w.to_f32_vec(),
        Matrix::Quantized(q) => nuvec::quantize::dequantize(q),
    }
    .map_err(|e| e.to_string())?;
    let m = m.expect("DoRA's terms carry m");
    let inputs = base.cols();
    Ok(w.par_chunks(inputs)
        .zip(delta.par_chunks(inputs))
        .zip(m.par_iter())
        .map(|((row, d), m)| m / row.iter().zip(d).map(|(w, d)| (w + d) * (w + d)).sum::<f32>().sqrt())
        .collect())
}
