//! MLX's floating-point quantization modes: the codes, the scales, and whole-matrix quantizing
//! and dequantizing (for conversion and tests; inference kernels decode per group).
//!
//! - Codes: e2m1 (fp4: 1 sign, 2 exponent, 1 mantissa bit; values 0, 0.5, 1, 1.5, 2, 3, 4, 6)
//!   for mxfp4 and nvfp4, e4m3 (fp8 "fn": no infinities, `0x7f`/`0xff` are NaN, largest 448)
//!   for mxfp8; packed LSB-first in little-endian `u32` words, as affine values are.
//! - Scales, one `u8` per group: e8m0 (`2^(s - 127)`, with `s = 0` meaning `2^-127` and
//!   `s = 255` infinity, as MLX decodes it) for the mx modes, e4m3 for nvfp4.
//! - nvfp4 may carry an f32 global scale `g` per matrix: values are then
//!   `code * (scale * (g / 2688))` (2688 = 448 * 6, evaluated in that order, as `mx.dequantize`).
//!
//! [`quantize_fp`] reproduces `mx.quantize` (MLX 0.32.4) bit for bit on f32 and bf16 values:
//! the mx modes pick the smallest power of two `2^n >= max|w| / top` (top = 6 or 448), nvfp4
//! the e4m3 value nearest `max|w| / 6` (ties to even, saturating at 448); values are divided by
//! the scale and rounded to e2m1 with ties toward zero (a value rounding to zero is `+0`) or to
//! e4m3 with ties to even (the sign kept, so `-0`). Groups whose largest magnitude is subnormal
//! (below about 1.2e-38) are outside that promise: MLX treats them unevenly.

use crate::{Array, Error, QuantMode, QuantSpec, Quantized, Result};

/// The e2m1 values by code (bit 3 is the sign).
pub const FP4_VALUES: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// The largest e4m3 value.
pub const E4M3_MAX: f32 = 448.0;
/// The largest e2m1 value.
pub const E2M1_MAX: f32 = 6.0;

/// The f32 bit pattern of e4m3 code `b`.
const fn e4m3_bits(b: u8) -> u32 {
    let sign = ((b >> 7) as u32) << 31;
    let e = ((b >> 3) & 0xf) as u32;
    let m = (b & 7) as u32;
    if e == 0xf && m == 7 {
        return sign | 0x7fc0_0000;
    }
    if e == 0 {
        if m == 0 {
            return sign;
        }
        // m / 8 * 2^-6 = 2^(p - 9) * (m / 2^p) with p the top bit of m.
        let p = 31 - m.leading_zeros();
        return sign | ((p + 127 - 9) << 23) | ((m - (1 << p)) << (23 - p));
    }
    sign | ((e + 120) << 23) | (m << 20)
}

const fn e4m3_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_bits(i as u8);
        i += 1;
    }
    t
}

/// f32 bit patterns of the 256 e4m3 codes.
static E4M3_BITS: [u32; 256] = e4m3_table();

/// The value of e4m3 code `b` (NaN for `0x7f` and `0xff`).
#[inline]
pub fn e4m3_value(b: u8) -> f32 {
    f32::from_bits(E4M3_BITS[b as usize])
}

/// The value of e8m0 scale `s`, as MLX decodes it: `2^(s - 127)`, `s = 0` giving `2^-127` and
/// `s = 255` infinity.
#[inline]
pub fn e8m0_value(s: u8) -> f32 {
    if s == 0 {
        f32::from_bits(0x0040_0000)
    } else {
        f32::from_bits((s as u32) << 23)
    }
}

/// The value of a group's scale byte in `mode` (a floating-point mode).
#[inline]
pub fn scale_value(mode: QuantMode, s: u8) -> f32 {
    match mode {
        QuantMode::Nvfp4 => e4m3_value(s),
        _ => e8m0_value(s),
    }
}

/// The factor a global scale contributes: `g / 2688`, applied to the group scale first.
#[inline]
pub fn global_factor(global_scale: Option<f32>) -> Option<f32> {
    global_scale.map(|g| g / (E4M3_MAX * E2M1_MAX))
}

/// The e2m1 code nearest `x`, ties toward zero; a value rounding to zero is `+0` (code 0).
pub fn e2m1_code(x: f32) -> u8 {
    let a = x.abs();
    let m = if a > 5.0 {
        7
    } else if a > 3.5 {
        6
    } else if a > 2.5 {
        5
    } else if a > 1.75 {
        4
    } else if a > 1.25 {
        3
    } else if a > 0.75 {
        2
    } else if a > 0.25 {
        1
    } else {
        0
    };
    if m != 0 && x.is_sign_negative() {
        m | 8
    } else {
        m
    }
}

/// The e4m3 code nearest `x`, ties to even, saturating at ±448; the sign is kept (`-0` is `0x80`).
pub fn e4m3_code(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return 0x7f;
    }
    let mag = if a >= 448.0 {
        0x7e
    } else if a < f32::from_bits(0x3c80_0000) {
        // Below 2^-6: subnormal codes are multiples of 2^-9 (code 8 is 2^-6 itself).
        (a * 512.0).round_ties_even() as u32
    } else {
        // Round the f32 mantissa to 3 bits, ties to even, then rebias the exponent (127 -> 7).
        let bits = a.to_bits();
        let rounded = (bits + 0x7_ffff + ((bits >> 20) & 1)) >> 20;
        (rounded - ((127 - 7) << 3)).min(0x7e)
    };
    sign | mag as u8
}

/// Dequantizes one row of `cols` values in `mode` from its packed bytes (`cols * bits / 8`) and
/// its scale bytes (`cols / group`) into `out`.
pub fn dequantize_row(mode: QuantMode, packed: &[u8], scales: &[u8], global_scale: Option<f32>, out: &mut [f32]) {
    let (bits, group) = mode.fixed_shape().expect("a floating-point mode");
    let factor = global_factor(global_scale);
    for (g, (o, &s)) in out.chunks_mut(group).zip(scales).enumerate() {
        let scale = match factor {
            Some(f) => scale_value(mode, s) * f,
            None => scale_value(mode, s),
        };
        let bytes = &packed[g * group * bits / 8..(g + 1) * group * bits / 8];
        if bits == 8 {
            for (o, &b) in o.iter_mut().zip(bytes) {
                *o = e4m3_value(b) * scale;
            }
        } else {
            for (pair, &b) in o.chunks_exact_mut(2).zip(bytes) {
                pair[0] = FP4_VALUES[(b & 0xf) as usize] * scale;
                pair[1] = FP4_VALUES[(b >> 4) as usize] * scale;
            }
        }
    }
}

/// All values of a floating-point-mode matrix as f32, row-major `[rows, cols]`: what
/// `mx.dequantize(..., dtype=mx.float32)` returns.
pub fn dequantize_fp(q: &Quantized) -> Result<Vec<f32>> {
    if q.spec.mode.has_biases() {
        return Err(Error::shape("dequantize", "an affine matrix is not in a floating-point mode"));
    }
    let (rows, cols) = (q.rows(), q.cols());
    let words = q.packed.to_vec::<u32>()?;
    let bytes: &[u8] = bytemuck::cast_slice(&words);
    let scales = q.scales.to_vec::<u8>()?;
    let (row_bytes, groups) = (cols * q.spec.bits / 8, cols / q.spec.group_size);
    let mut out = vec![0f32; rows * cols];
    for (r, o) in out.chunks_mut(cols.max(1)).enumerate().take(rows) {
        let packed = &bytes[r * row_bytes..(r + 1) * row_bytes];
        dequantize_row(q.spec.mode, packed, &scales[r * groups..(r + 1) * groups], q.global_scale, o);
    }
    Ok(out)
}

/// The scale byte of a group whose largest magnitude is `amax`, and the scale's value.
fn group_scale(mode: QuantMode, amax: f32) -> (u8, f32) {
    match mode {
        QuantMode::Nvfp4 => {
            let s = e4m3_code(amax / E2M1_MAX);
            (s, e4m3_value(s))
        }
        _ => {
            let top = if mode == QuantMode::Mxfp8 { E4M3_MAX } else { E2M1_MAX };
            let r = amax / top;
            // The smallest n with 2^n >= r (n = 0 for an all-zero group), within e8m0's range.
            let n: i32 = if r == 0.0 {
                0
            } else if r.is_normal() {
                let bits = r.to_bits();
                ((bits >> 23) as i32 - 127) + i32::from(bits & 0x7f_ffff != 0)
            } else {
                -127
            };
            let s = (n.clamp(-127, 127) + 127) as u8;
            (s, e8m0_value(s))
        }
    }
}

/// Quantizes `w [rows, cols]` in a floating-point `spec` exactly as `mx.quantize` does (see the
/// module notes), without a global scale. Non-finite values are refused.
pub fn quantize_fp(w: &[f32], rows: usize, cols: usize, spec: QuantSpec) -> Result<Quantized> {
    spec.validate().map_err(|m| Error::shape("quantize", m))?;
    let (bits, group) =
        spec.mode.fixed_shape().ok_or_else(|| Error::shape("quantize", "affine is not a floating-point mode"))?;
    if w.len() != rows * cols || !cols.is_multiple_of(group) {
        return Err(Error::shape("quantize", format!("{rows}x{cols} does not split into groups of {group}")));
    }
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(Error::shape(
            "quantize",
            format!("value {} at row {}, column {} is not finite", w[i], i / cols, i % cols),
        ));
    }
    let mut packed = vec![0u8; rows * cols * bits / 8];
    let mut scales = Vec::with_capacity(rows * cols / group);
    for (g, chunk) in w.chunks(group).enumerate() {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (s, scale) = group_scale(spec.mode, amax);
        scales.push(s);
        let out = &mut packed[g * group * bits / 8..(g + 1) * group * bits / 8];
        let code = |v: f32| {
            let x = if scale == 0.0 { 0.0 } else { v / scale };
            if bits == 8 {
                e4m3_code(x)
            } else {
                e2m1_code(x)
            }
        };
        if bits == 8 {
            for (o, &v) in out.iter_mut().zip(chunk) {
                *o = code(v);
            }
        } else {
            for (o, pair) in out.iter_mut().zip(chunk.chunks_exact(2)) {
                *o = code(pair[0]) | (code(pair[1]) << 4);
            }
        }
    }
    let words: Vec<u32> = packed.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    Quantized::new_fp(
        Array::from_slice(&words, &[rows, cols * bits / 32])?,
        Array::from_slice(&scales, &[rows, cols / group])?,
        None,
        spec,
        cols,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_codes_round_trip_and_decode() {
        for b in 0..=255u8 {
            let v = e4m3_value(b);
            if b & 0x7f == 0x7f {
                assert!(v.is_nan());
                continue;
            }
            // The definition: (1 + m/8) 2^(e-7), or m/8 2^-6 when e = 0.
            let (e, m) = ((b >> 3) & 0xf, (b & 7) as f64);
            let mag = if e == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(e as i32 - 7) };
            let want = if b & 0x80 != 0 { -mag } else { mag };
            assert_eq!(v as f64, want, "code {b:#x}");
            assert_eq!(e4m3_code(v), b, "code {b:#x} ({v}) encodes back");
        }
        assert_eq!(e4m3_code(1000.0), 0x7e);
        assert_eq!(e4m3_code(-1e-9), 0x80);
    }

    #[test]
    fn e2m1_rounds_ties_toward_zero() {
        for (x, want) in [(0.25, 0.0), (0.26, 0.5), (0.75, 0.5), (2.5, 2.0), (3.5, 3.0), (5.0, 4.0), (7.0, 6.0)] {
            assert_eq!(FP4_VALUES[e2m1_code(x) as usize], want, "{x}");
            assert_eq!(FP4_VALUES[e2m1_code(-x) as usize], -want, "-{x}");
        }
        assert_eq!(e2m1_code(-0.1), 0);
    }

    #[test]
    fn scales_cover_the_group() {
        for mode in [QuantMode::Mxfp4, QuantMode::Mxfp8, QuantMode::Nvfp4] {
            for amax in [1e-3f32, 0.3, 1.0, 6.0, 7.5, 100.0, 448.0] {
                let (_, scale) = group_scale(mode, amax);
                let top = if mode == QuantMode::Mxfp8 { 448.0 } else { 6.0 };
                if mode != QuantMode::Nvfp4 {
                    assert!(amax / scale <= top && amax / scale > top / 2.0, "{mode:?} {amax}: {scale}");
                }
            }
        }
    }
}
