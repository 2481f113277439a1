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
        let rank = a.shape().get(1).copied().unwrap_or(0);
        if a.shape() != [inputs, rank] || rank == 0 {
            return Err(format!("lora_a is {:?}, expected [{inputs}, rank] for this projection", a.shape()));
        }
        if b.shape() != [rank, out] {
            return Err(format!("lora_b is {:?}, expected [{rank}, {out}]", b.shape()));
        }
        let floats = |x: &Array| x.to_f32_vec().map_err(|e| e.to_string());
        let (a_in_r, b_r_out) = (floats(a)?, floats(b)?);
        let a_t = transpose(&a_in_r, inputs, rank);
        let b_t: Vec<f32> = transpose(&b_r_out, rank, out).iter().map(|v| v * scale).collect();
        let gain = match m {
            None => None,
            Some(m) if m.shape() != [out] => return Err(format!("m is {:?}, expected [{out}]", m.shape())),
            Some(m) => Some(dora_gain(base, &a_t, &b_t, rank, &floats(m)?)?),
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
    let rank = a.shape().get(1).copied().unwrap_or(0);
    if a.shape() != [inputs, rank] || rank == 0 || b.shape() != [rank, out] {
        return Err(format!("lora_a {:?} and lora_b {:?} do not fit a {out}x{inputs} weight", a.shape(), b.shape()));
    }
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

fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}

/// `m[o] / ‖W[o] + Σₖ sB[o,k] A[k]‖` for every output `o`, with `W` dequantized as mlx-lm does.
fn dora_gain(base: &Matrix, a: &[f32], b: &[f32], rank: usize, m: &[f32]) -> std::result::Result<Vec<f32>, String> {
    let w = match base {
        Matrix::Dense(w) => w.to_f32_vec(),
        Matrix::Quantized(q) => nuvec::quantize::dequantize(q),
    }
    .map_err(|e| e.to_string())?;
    let inputs = base.cols();
    Ok(w.par_chunks(inputs)
        .enumerate()
        .map(|(o, row)| {
            let norm_sq: f32 = (0..inputs)
                .map(|j| {
                    let adapted = row[j] + (0..rank).map(|k| b[o * rank + k] * a[k * inputs + j]).sum::<f32>();
                    adapted * adapted
                })
                .sum();
            m[o] / norm_sq.sqrt()
        })
        .collect())
}
