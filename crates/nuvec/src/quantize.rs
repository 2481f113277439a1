//! Quantizing and dequantizing whole matrices in MLX's affine layout (for conversion, not for
//! inference: kernels never dequantize a whole matrix).

use half::{bf16, f16};

use crate::{Array, DType, Error, QuantMode, QuantSpec, Quantized, Result};

/// Quantizes `w [rows, cols]` (f32 values) as MLX's `mx.quantize` does in affine mode: per group
/// the endpoint of larger magnitude is made exactly representable (the scale may be negative),
/// then `q = clip(round((w - bias) / scale), 0, 2^bits - 1)`. Scales and biases are stored in
/// `dtype`, as MLX keeps them in the weight's dtype.
pub fn quantize_affine(w: &[f32], rows: usize, cols: usize, spec: QuantSpec, dtype: DType) -> Result<Quantized> {
    spec.validate().map_err(|m| Error::shape("quantize", m))?;
    let (bits, group) = (spec.bits, spec.group_size);
    if w.len() != rows * cols || !cols.is_multiple_of(group) {
        return Err(Error::shape("quantize", format!("{rows}x{cols} does not split into groups of {group}")));
    }
    let n_bins = ((1u32 << bits) - 1) as f32;
    let groups = cols / group;
    let mut packed = vec![0u8; rows * cols * bits / 8];
    let (mut scales, mut biases) = (Vec::with_capacity(rows * groups), Vec::with_capacity(rows * groups));
    let mut q = vec![0u8; group];
    for (g, chunk) in w.chunks(group).enumerate() {
        let max = chunk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let min = chunk.iter().copied().fold(f32::INFINITY, f32::min);
        let min_wins = min.abs() > max.abs();
        let mut scale = ((max - min) / n_bins).max(1e-7);
        if !min_wins {
            scale = -scale;
        }
        let edge = if min_wins { min } else { max };
        let q0 = (edge / scale).round_ties_even();
        let (scale, bias) = if q0 != 0.0 { (edge / q0, edge) } else { (scale, 0.0) };
        for (v, &x) in q.iter_mut().zip(chunk) {
            *v = ((x - bias) / scale).round_ties_even().clamp(0.0, n_bins) as u8;
        }
        let at = g * group * bits / 8;
        pack_lsb(&q, bits, &mut packed[at..at + group * bits / 8]);
        scales.push(scale);
        biases.push(bias);
    }
    let words: Vec<u32> = packed.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    let packed = Array::from_slice(&words, &[rows, cols * bits / 32])?;
    let store = |v: &[f32]| -> Result<Array> {
        match dtype {
            DType::F32 => Array::from_slice(v, &[rows, groups]),
            DType::F16 => Array::from_slice(&v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(), &[rows, groups]),
            DType::BF16 => {
                Array::from_slice(&v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>(), &[rows, groups])
            }
            other => Err(Error::shape("quantize", format!("scales cannot be {other}"))),
        }
    };
    Quantized::new(packed, store(&scales)?, store(&biases)?, spec, cols)
}

/// Packs `values` (each < 2^bits) LSB-first into `out`, as MLX stores affine weights.
pub fn pack_lsb(values: &[u8], bits: usize, out: &mut [u8]) {
    let mut acc: u32 = 0;
    let mut filled = 0;
    let mut at = 0;
    for &v in values {
        acc |= (v as u32) << filled;
        filled += bits;
        while filled >= 8 {
            out[at] = acc as u8;
            at += 1;
            acc >>= 8;
            filled -= 8;
        }
    }
}

/// All values of `q` as f32, row-major `[rows, cols]`.
pub fn dequantize(q: &Quantized) -> Result<Vec<f32>> {
    let QuantMode::Affine = q.spec.mode;
    let (rows, cols, bits, group) = (q.rows(), q.cols(), q.spec.bits, q.spec.group_size);
    let (scales, biases) = (q.scales.to_f32_vec()?, q.biases.to_f32_vec()?);
    let words = q.packed.to_vec::<u32>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mask = (1u32 << bits) - 1;
    let row_bytes = cols * bits / 8;
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
        for c in 0..cols {
            let bit = c * bits;
            let lo = row[bit / 8] as u32;
            let hi = row.get(bit / 8 + 1).copied().unwrap_or(0) as u32;
            let v = ((lo | hi << 8) >> (bit % 8)) & mask;
            let g = r * (cols / group) + c / group;
            out.push(scales[g] * v as f32 + biases[g]);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_is_within_half_a_step() {
        let (rows, cols) = (4, 128);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 3000.0).collect();
        for bits in [2, 3, 4, 5, 6, 8] {
            for group in [32, 64, 128] {
                let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
                let q = quantize_affine(&w, rows, cols, spec, DType::F32).unwrap();
                let back = dequantize(&q).unwrap();
                let scales = q.scales.to_f32_vec().unwrap();
                for (i, (a, b)) in w.iter().zip(&back).enumerate() {
                    let step = scales[i / group].abs();
                    assert!(
                        (a - b).abs() <= 0.5 * step * 1.0001 + 1e-7,
                        "bits {bits} group {group} at {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
