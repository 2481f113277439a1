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
/// Floating-point modes decode through [`crate::fpquant::dequantize_fp`].
pub fn dequantize(q: &Quantized) -> Result<Vec<f32>> {
    if q.spec.mode != QuantMode::Affine {
        return crate::fpquant::dequantize_fp(q);
    }
    let (rows, cols) = (q.rows(), q.cols());
    let (scales, biases) = (q.scales.to_f32_vec()?, q.biases.to_f32_vec()?);
    let words = q.packed.to_vec::<u32>()?;
    let mut out = vec![0f32; rows * cols];
    dequantize_rows(&words, &scales, &biases, cols, q.spec, &mut out);
    Ok(out)
}

/// Dequantizes rows of `cols` values from raw parts (`words` as MLX packs them, one scale and
/// bias per group) into `out` (`rows * cols` values). Widths that divide 32 (2, 4, 8 bits) unpack
/// a word at a time; the others bit by bit. Both give `scale * q + bias` for every value.
#[inline]
pub fn dequantize_rows(words: &[u32], scales: &[f32], biases: &[f32], cols: usize, spec: QuantSpec, out: &mut [f32]) {
    if 32 % spec.bits == 0 && spec.group_size.is_multiple_of(32 / spec.bits) {
        dequantize_whole_words(words, scales, biases, spec, out);
    } else {
        dequantize_bits(words, scales, biases, cols, spec, out);
    }
}

/// [`dequantize_rows`] for widths that divide 32: value `i` of a word in bits `i * bits ..`, a
/// group at a time.
#[inline]
fn dequantize_whole_words(words: &[u32], scales: &[f32], biases: &[f32], spec: QuantSpec, out: &mut [f32]) {
    let (bits, group) = (spec.bits, spec.group_size);
    let per_word = 32 / bits;
    let mask = (1u32 << bits) - 1;
    let groups = out.chunks_exact_mut(group).zip(words.chunks_exact(group / per_word));
    for (((out, words), &s), &b) in groups.zip(scales).zip(biases) {
        for (out, &word) in out.chunks_exact_mut(per_word).zip(words) {
            for (i, o) in out.iter_mut().enumerate() {
                *o = s * ((word >> (i * bits)) & mask) as f32 + b;
            }
        }
    }
}

/// [`dequantize_rows`] for any width, each value read bit by bit from the row's bytes.
fn dequantize_bits(words: &[u32], scales: &[f32], biases: &[f32], cols: usize, spec: QuantSpec, out: &mut [f32]) {
    let (bits, group) = (spec.bits, spec.group_size);
    let mask = (1u32 << bits) - 1;
    let row_words = cols * bits / 32;
    for (r, row) in out.chunks_mut(cols).enumerate() {
        let bytes: Vec<u8> = words[r * row_words..(r + 1) * row_words].iter().flat_map(|w| w.to_le_bytes()).collect();
        for (c, o) in row.iter_mut().enumerate() {
            let bit = c * bits;
            let lo = bytes[bit / 8] as u32;
            let hi = bytes.get(bit / 8 + 1).copied().unwrap_or(0) as u32;
            let v = ((lo | hi << 8) >> (bit % 8)) & mask;
            let g = r * (cols / group) + c / group;
            *o = scales[g] * v as f32 + biases[g];
        }
    }
}

/// Which values of an AutoAWQ word hold which column: AutoAWQ packs column `8j + ORDER[i]` into
/// nibble `i` of word `j`.
const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Unpacks AutoAWQ's interleaved 4-bit words `[rows, cols / 8]` into `[rows, cols]` values.
fn unpack_awq(words: &[i32], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows * cols];
    for r in 0..rows {
        for j in 0..cols / 8 {
            let w = words[r * (cols / 8) + j] as u32;
            for (i, &col) in AWQ_ORDER.iter().enumerate() {
                out[r * cols + 8 * j + col] = ((w >> (4 * i)) & 0xf) as u8;
            }
        }
    }
    out
}

/// Unpacks words holding `32 / bits` values each, LSB first, along `axis` 0 (`[rows * per, cols]`
/// values from `[rows, cols]` words) or 1 (`[rows, cols * per]` from `[rows, cols]`).
fn unpack_sequential(words: &[i32], rows: usize, cols: usize, bits: usize, along_rows: bool) -> Vec<u8> {
    let per = 32 / bits;
    let mask = (1u32 << bits) - 1;
    let (out_rows, out_cols) = if along_rows { (rows * per, cols) } else { (rows, cols * per) };
    let mut out = vec![0u8; out_rows * out_cols];
    for r in 0..rows {
        for c in 0..cols {
            let w = words[r * cols + c] as u32;
            for i in 0..per {
                let v = ((w >> (bits * i)) & mask) as u8;
                let (rr, cc) = if along_rows { (r * per + i, c) } else { (r, c * per + i) };
                out[rr * out_cols + cc] = v;
            }
        }
    }
    out
}

/// `w = (q - z) * s` as MLX's affine layout: `scale = s`, `bias = -z * s` (exact in f32), values
/// repacked LSB-first along the input. `q [in, out]`, `zeros`/`scales` `[in / group, out]`.
fn affine_from_zeros(
    q: &[u8],
    zeros: &[u8],
    scales: &[f32],
    (inputs, outputs): (usize, usize),
    bits: usize,
    group: usize,
) -> Result<Quantized> {
    let groups = inputs / group;
    let mut packed = vec![0u8; outputs * inputs * bits / 8];
    let mut row = vec![0u8; inputs];
    let (mut s_out, mut b_out) = (vec![0f32; outputs * groups], vec![0f32; outputs * groups]);
    for o in 0..outputs {
        for (i, v) in row.iter_mut().enumerate() {
            *v = q[i * outputs + o];
        }
        pack_lsb(&row, bits, &mut packed[o * inputs * bits / 8..(o + 1) * inputs * bits / 8]);
        for g in 0..groups {
            let s = scales[g * outputs + o];
            s_out[o * groups + g] = s;
            b_out[o * groups + g] = -(zeros[g * outputs + o] as f32) * s;
        }
    }
    let words: Vec<u32> = packed.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
    Quantized::new(
        Array::from_slice(&words, &[outputs, inputs * bits / 32])?,
        Array::from_slice(&s_out, &[outputs, groups])?,
        Array::from_slice(&b_out, &[outputs, groups])?,
        spec,
        inputs,
    )
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::shape("quantized checkpoint", format!("{what} holds {got} values, expected {want}")));
    }
    Ok(())
}

/// An AutoAWQ (GEMM) 4-bit layer as MLX affine: `qweight [in, out / 8]`, `qzeros [in / g, out / 8]`,
/// `scales [in / g, out]` (as f32), `w = (q - z) * s`.
pub fn from_awq(
    qweight: &[i32],
    qzeros: &[i32],
    scales: &[f32],
    inputs: usize,
    outputs: usize,
    group: usize,
) -> Result<Quantized> {
    if !outputs.is_multiple_of(8) || group == 0 || !inputs.is_multiple_of(group) {
        return Err(Error::shape("awq", format!("{inputs}x{outputs} with group {group} is not an AutoAWQ layout")));
    }
    check_len("qweight", qweight.len(), inputs * outputs / 8)?;
    check_len("qzeros", qzeros.len(), inputs / group * outputs / 8)?;
    check_len("scales", scales.len(), inputs / group * outputs)?;
    let q = unpack_awq(qweight, inputs, outputs);
    let z = unpack_awq(qzeros, inputs / group, outputs);
    affine_from_zeros(&q, &z, scales, (inputs, outputs), 4, group)
}

/// A GPTQ layer as MLX affine: `qweight [in * bits / 32, out]` packed along the input,
/// `qzeros [in / g, out * bits / 32]` packed along the output, `scales [in / g, out]` (as f32),
/// `w = (q - (z + zero_offset)) * s` (`zero_offset` is 1 for GPTQ's v1 checkpoints, 0 for v2).
pub fn from_gptq(
    qweight: &[i32],
    qzeros: &[i32],
    scales: &[f32],
    (inputs, outputs): (usize, usize),
    bits: usize,
    group: usize,
    zero_offset: u8,
) -> Result<Quantized> {
    let per = 32 / bits;
    if !matches!(bits, 4 | 8)
        || group == 0
        || !inputs.is_multiple_of(group)
        || !inputs.is_multiple_of(per)
        || !outputs.is_multiple_of(per)
    {
        return Err(Error::shape(
            "gptq",
            format!("{inputs}x{outputs} at {bits} bits, group {group}, is not a GPTQ layout nuvec reads"),
        ));
    }
    check_len("qweight", qweight.len(), inputs / per * outputs)?;
    check_len("qzeros", qzeros.len(), inputs / group * outputs / per)?;
    check_len("scales", scales.len(), inputs / group * outputs)?;
    let q = unpack_sequential(qweight, inputs / per, outputs, bits, true);
    let mut z = unpack_sequential(qzeros, inputs / group, outputs / per, bits, false);
    // v1 stores zero - 1; a wrapped stored value would not be a GPTQ zero point.
    let top = ((1u32 << bits) - 1) as u8;
    for v in z.iter_mut() {
        *v = v
            .checked_add(zero_offset)
            .filter(|&x| x <= top)
            .ok_or_else(|| Error::shape("gptq", "a zero point is out of range"))?;
    }
    affine_from_zeros(&q, &z, scales, (inputs, outputs), bits, group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_word_unpacking_reads_what_the_bits_say() {
        let (rows, cols) = (4, 128);
        let data: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        for (bits, group) in [(2, 32), (4, 32), (4, 64), (8, 64), (8, 128)] {
            let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
            let q = quantize_affine(&data, rows, cols, spec, DType::F32).unwrap();
            let (w, s, b) =
                (q.packed.to_vec::<u32>().unwrap(), q.scales.to_f32_vec().unwrap(), q.biases.to_f32_vec().unwrap());
            let (mut words, mut bitwise) = (vec![0f32; data.len()], vec![0f32; data.len()]);
            dequantize_whole_words(&w, &s, &b, spec, &mut words);
            dequantize_bits(&w, &s, &b, cols, spec, &mut bitwise);
            assert_eq!(words, bitwise, "{bits} bits, groups of {group}");
        }
    }

    #[test]
    fn round_trip_is_within_one_step() {
        let (rows, cols) = (4, 128);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 3000.0).collect();
        for bits in [2, 3, 4, 5, 6, 8] {
            for group in [16, 32, 64, 128] {
                let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
                let q = quantize_affine(&w, rows, cols, spec, DType::F32).unwrap();
                let back = dequantize(&q).unwrap();
                let scales = q.scales.to_f32_vec().unwrap();
                for (i, (a, b)) in w.iter().zip(&back).enumerate() {
                    // MLX makes the larger endpoint exact, which can cost the other end up to a
                    // whole step (its value is clipped to the last level).
                    let step = scales[i / group].abs();
                    assert!((a - b).abs() <= step * 1.0001 + 1e-7, "bits {bits} group {group} at {i}: {a} vs {b}");
                }
            }
        }
    }
}
