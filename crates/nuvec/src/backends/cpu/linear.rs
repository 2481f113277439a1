//! Matrix products and embedding lookups over dense and quantized weights.
//!
//! Each output row of the weight is decoded once into f32 and dotted with every input row, so a
//! quantized matrix is never dequantized whole.

use half::{bf16, f16};
use rayon::prelude::*;

use super::{f32s, output};
use crate::{Array, DType, Error, Matrix, QuantMode, Quantized, Result};

/// Output rows handed to one thread at a time.
const ROWS_PER_TASK: usize = 16;

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorize the loop.
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// Decodes weight rows into f32.
enum RowDecoder<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    Affine { packed: &'a [u8], scales: Vec<f32>, biases: Vec<f32>, bits: usize, group: usize, row_bytes: usize },
}

impl<'a> RowDecoder<'a> {
    fn new(w: &'a Matrix) -> Result<Self> {
        Ok(match w {
            Matrix::Dense(a) => match a.dtype() {
                DType::F32 => RowDecoder::F32(a.host()?),
                DType::F16 => RowDecoder::F16(a.host()?),
                DType::BF16 => RowDecoder::BF16(a.host()?),
                other => return Err(Error::shape("linear", format!("weights must be float, got {other}"))),
            },
            Matrix::Quantized(q) => Self::affine(q)?,
        })
    }

    fn affine(q: &'a Quantized) -> Result<Self> {
        let QuantMode::Affine = q.spec.mode;
        Ok(RowDecoder::Affine {
            packed: q.packed.raw_bytes(),
            scales: q.scales.to_f32_vec()?,
            biases: q.biases.to_f32_vec()?,
            bits: q.spec.bits,
            group: q.spec.group_size,
            row_bytes: q.packed.dim(1) * 4,
        })
    }

    /// Writes row `r` (of `out.len()` columns) into `out`.
    fn row(&self, r: usize, out: &mut [f32]) {
        let k = out.len();
        match self {
            RowDecoder::F32(w) => out.copy_from_slice(&w[r * k..(r + 1) * k]),
            RowDecoder::F16(w) => out.iter_mut().zip(&w[r * k..(r + 1) * k]).for_each(|(o, v)| *o = v.to_f32()),
            RowDecoder::BF16(w) => out.iter_mut().zip(&w[r * k..(r + 1) * k]).for_each(|(o, v)| *o = v.to_f32()),
            RowDecoder::Affine { packed, scales, biases, bits, group, row_bytes } => {
                let bytes = &packed[r * row_bytes..(r + 1) * row_bytes];
                let groups = k / group;
                unpack_row(bytes, *bits, out);
                for (g, chunk) in out.chunks_mut(*group).enumerate() {
                    let (s, b) = (scales[r * groups + g], biases[r * groups + g]);
                    chunk.iter_mut().for_each(|v| *v = s * *v + b);
                }
            }
        }
    }
}

/// Unpacks LSB-first `bits`-wide unsigned values from `bytes` into `out` (as floats).
pub(crate) fn unpack_row(bytes: &[u8], bits: usize, out: &mut [f32]) {
    match bits {
        8 => out.iter_mut().zip(bytes).for_each(|(o, &b)| *o = b as f32),
        4 => {
            for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
                pair[0] = (b & 0xf) as f32;
                pair[1] = (b >> 4) as f32;
            }
        }
        2 => {
            for (quad, &b) in out.chunks_exact_mut(4).zip(bytes) {
                for (i, o) in quad.iter_mut().enumerate() {
                    *o = ((b >> (2 * i)) & 3) as f32;
                }
            }
        }
        _ => {
            let mask = (1u16 << bits) - 1;
            for (j, o) in out.iter_mut().enumerate() {
                let bit = j * bits;
                let (byte, shift) = (bit / 8, bit % 8);
                let lo = bytes[byte] as u16;
                let hi = bytes.get(byte + 1).copied().unwrap_or(0) as u16;
                *o = (((lo | (hi << 8)) >> shift) & mask) as f32;
            }
        }
    }
}

pub(crate) fn linear(x: &Array, w: &Matrix) -> Result<Array> {
    let k = x.dim(-1);
    if k != w.cols() {
        return Err(Error::shape("linear", format!("input has {k} features, weight {}x{}", w.rows(), w.cols())));
    }
    let m = x.len() / k.max(1);
    let n = w.rows();
    let xs = f32s("linear", x)?;
    let decoder = RowDecoder::new(w)?;
    // Computed transposed ([N, M]) so each task owns a contiguous block.
    let mut out_t = vec![0f32; n * m];
    out_t.par_chunks_mut(ROWS_PER_TASK * m).enumerate().for_each(|(task, block)| {
        let mut row = vec![0f32; k];
        for (i, outs) in block.chunks_mut(m).enumerate() {
            decoder.row(task * ROWS_PER_TASK + i, &mut row);
            for (o, xr) in outs.iter_mut().zip(xs.chunks(k)) {
                *o = dot(&row, xr);
            }
        }
    });
    let out = if m == 1 {
        out_t
    } else {
        let mut out = vec![0f32; n * m];
        for (j, col) in out_t.chunks(m).enumerate() {
            for (i, v) in col.iter().enumerate() {
                out[i * n + j] = *v;
            }
        }
        out
    };
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("x has at least one axis") = n;
    output(out, &shape)
}

pub(crate) fn embed(table: &Matrix, ids: &[u32]) -> Result<Array> {
    let (v, d) = (table.rows(), table.cols());
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= v) {
        return Err(Error::shape("embed", format!("token id {bad} is outside the vocabulary of {v}")));
    }
    let decoder = RowDecoder::new(table)?;
    let mut out = vec![0f32; ids.len() * d];
    for (o, &id) in out.chunks_mut(d).zip(ids) {
        decoder.row(id as usize, o);
    }
    output(out, &[ids.len(), d])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_generic_matches_fast_paths() {
        let bytes: Vec<u8> = (0..48u32).map(|i| (i * 37 + 11) as u8).collect();
        for bits in [2usize, 4, 8] {
            let n = bytes.len() * 8 / bits;
            let mut fast = vec![0f32; n];
            unpack_row(&bytes, bits, &mut fast);
            let mask = (1u32 << bits) - 1;
            let slow: Vec<f32> = (0..n)
                .map(|j| {
                    let bit = j * bits;
                    ((bytes[bit / 8] as u32 >> (bit % 8)) & mask) as f32
                })
                .collect();
            assert_eq!(fast, slow, "bits {bits}");
        }
    }
}
