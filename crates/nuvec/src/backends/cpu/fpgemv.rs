//! Products with weights in MLX's floating-point modes (mxfp4, mxfp8, nvfp4).
//!
//! A row's dot product runs group by group, as MLX accumulates it: the codes' values dotted with
//! the input, then times the group's scale. Rows are decoded whole only for the prefill tiles
//! ([`FpMatrix::dequantize_row`]). The AVX2 path decodes eight codes per step in registers: e2m1
//! through a permute of the eight magnitudes plus the sign bit, e4m3 by placing its exponent and
//! mantissa bits in an f32 and rescaling by 2^120 (which also makes its subnormals exact).

use super::simd::{self, Isa};
use crate::fpquant::{self, FP4_VALUES};
use crate::{Error, QuantMode, Quantized, Result};

/// A floating-point-mode matrix as the kernels read it.
#[derive(Clone, Copy)]
pub(crate) struct FpMatrix<'a> {
    /// Packed codes, `cols * bits / 8` bytes per row.
    pub packed: &'a [u8],
    /// One scale byte per group.
    pub scales: &'a [u8],
    pub mode: QuantMode,
    pub bits: usize,
    pub group: usize,
    pub cols: usize,
    /// nvfp4's global scale, as passed to [`fpquant::dequantize_row`].
    pub global_scale: Option<f32>,
}

impl<'a> FpMatrix<'a> {
    pub(crate) fn new(q: &'a Quantized) -> Result<Self> {
        let (bits, group) = q
            .spec
            .mode
            .fixed_shape()
            .ok_or_else(|| Error::shape("linear", "an affine matrix is not in a floating-point mode"))?;
        Ok(FpMatrix {
            packed: q.packed.raw_bytes(),
            scales: q.scales.host::<u8>()?,
            mode: q.spec.mode,
            bits,
            group,
            cols: q.cols(),
            global_scale: q.global_scale,
        })
    }

    fn groups(&self) -> usize {
        self.cols / self.group
    }

    fn row_parts(&self, r: usize) -> (&'a [u8], &'a [u8]) {
        let rb = self.cols * self.bits / 8;
        let g = self.groups();
        (&self.packed[r * rb..(r + 1) * rb], &self.scales[r * g..(r + 1) * g])
    }

    /// The group scales of a row as f32 (the global scale folded in, as MLX folds it).
    fn scale(&self, s: u8) -> f32 {
        let v = fpquant::scale_value(self.mode, s);
        match fpquant::global_factor(self.global_scale) {
            Some(f) => v * f,
            None => v,
        }
    }

    /// Row `r` as f32 values into `out` (`cols` long).
    pub(crate) fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (packed, scales) = self.row_parts(r);
        fpquant::dequantize_row(self.mode, packed, scales, self.global_scale, out);
    }

    /// `Σ row_r[i] * x[i]`, on the process's instruction set.
    pub(crate) fn dot_row(&self, r: usize, x: &[f32]) -> f32 {
        self.dot_row_on(simd::isa(), r, x)
    }

    pub(crate) fn dot_row_on(&self, isa: Isa, r: usize, x: &[f32]) -> f32 {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `isa` is Avx2/Avx512 only when the CPU has avx2, fma and f16c (simd::isa
            // detects them; tests pass only supported ones); x has `cols` values (checked by the
            // caller's shape check, asserted here).
            Isa::Avx2 | Isa::Avx512 => {
                assert!(x.len() >= self.cols);
                unsafe { x86::dot_row(self, r, x) }
            }
            Isa::Scalar => self.dot_row_scalar(r, x),
        }
    }

    /// The scalar reference of [`FpMatrix::dot_row`].
    pub(crate) fn dot_row_scalar(&self, r: usize, x: &[f32]) -> f32 {
        let (packed, scales) = self.row_parts(r);
        let gb = self.group * self.bits / 8;
        let mut acc = 0f32;
        for (g, (&s, xs)) in scales.iter().zip(x.chunks(self.group)).enumerate() {
            let bytes = &packed[g * gb..(g + 1) * gb];
            let mut sum = 0f32;
            if self.bits == 8 {
                for (&b, &xv) in bytes.iter().zip(xs) {
                    sum += xv * fpquant::e4m3_value(b);
                }
            } else {
                for (&b, pair) in bytes.iter().zip(xs.chunks_exact(2)) {
                    sum += pair[0] * FP4_VALUES[(b & 0xf) as usize];
                    sum += pair[1] * FP4_VALUES[(b >> 4) as usize];
                }
            }
            acc += self.scale(s) * sum;
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::FpMatrix;
    use crate::backends::cpu::simd::x86::hsum;

    /// Eight e2m1 codes (one `u32`, LSB first) as f32 values.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn fp4x8(word: u32, magnitudes: __m256) -> __m256 {
        let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        let codes = _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts);
        let mag = _mm256_permutevar8x32_ps(magnitudes, codes);
        let sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
        _mm256_xor_ps(mag, _mm256_castsi256_ps(sign))
    }

    /// Eight e4m3 codes (bytes) as f32 values.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn fp8x8(bytes: u64) -> __m256 {
        let b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes as i64));
        let em = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
        // Exponent and mantissa in f32's places read as 2^(e-127)(1 + m/8) (or a subnormal
        // m 2^-129); times 2^120 that is e4m3's value, subnormals included.
        let mag =
            _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(em, 20)), _mm256_set1_ps(f32::from_bits(0x7b80_0000)));
        let sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
        let v = _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
        let nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7f)));
        _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), nan)
    }

    /// `Σ x[i] * value(code i)` over one group of `values` codes at `w` (4-bit: `values / 8`
    /// words; 8-bit: `values / 8` runs of 8 bytes), two independent partial sums.
    ///
    /// # Safety
    /// The CPU must support avx2 and fma; `w` and `x` hold the group's codes and values.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn group_sum(w: *const u8, x: *const f32, values: usize, bits: usize, magnitudes: __m256) -> __m256 {
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let step_bytes = bits; // 8 codes take `bits` bytes
        let mut i = 0;
        while i + 16 <= values {
            // SAFETY: codes i..i+16 and values i..i+16 lie inside the group (caller's contract).
            let (w0, w1, x0, x1) =
                unsafe { (w.add(i / 8 * step_bytes), w.add((i / 8 + 1) * step_bytes), x.add(i), x.add(i + 8)) };
            let (v0, v1) = if bits == 8 {
                // SAFETY: 8 readable bytes at w0 and w1 (above).
                unsafe { (fp8x8((w0 as *const u64).read_unaligned()), fp8x8((w1 as *const u64).read_unaligned())) }
            } else {
                // SAFETY: 4 readable bytes at w0 and w1 (above).
                unsafe {
                    (
                        fp4x8((w0 as *const u32).read_unaligned(), magnitudes),
                        fp4x8((w1 as *const u32).read_unaligned(), magnitudes),
                    )
                }
            };
            // SAFETY: 8 readable floats at x0 and x1 (above).
            unsafe {
                s0 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(x0), s0);
                s1 = _mm256_fmadd_ps(v1, _mm256_loadu_ps(x1), s1);
            }
            i += 16;
        }
        _mm256_add_ps(s0, s1)
    }

    /// # Safety
    /// The CPU must support avx2 and fma; `x` holds at least `m.cols` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_row(m: &FpMatrix, r: usize, x: &[f32]) -> f32 {
        let (packed, scales) = m.row_parts(r);
        let magnitudes = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
        let gb = m.group * m.bits / 8;
        let (pw, px) = (packed.as_ptr(), x.as_ptr());
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let groups = scales.len();
        let mut g = 0;
        // Two groups at a time into independent accumulators.
        while g + 2 <= groups {
            // SAFETY: groups g and g + 1 are inside the row: their codes inside `packed`, their
            // values inside `x` (x holds cols = groups * group values).
            let (s0, s1) = unsafe {
                (
                    group_sum(pw.add(g * gb), px.add(g * m.group), m.group, m.bits, magnitudes),
                    group_sum(pw.add((g + 1) * gb), px.add((g + 1) * m.group), m.group, m.bits, magnitudes),
                )
            };
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(m.scale(scales[g])), s0, a0);
            a1 = _mm256_fmadd_ps(_mm256_set1_ps(m.scale(scales[g + 1])), s1, a1);
            g += 2;
        }
        if g < groups {
            // SAFETY: as above, for the last group.
            let s0 = unsafe { group_sum(pw.add(g * gb), px.add(g * m.group), m.group, m.bits, magnitudes) };
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(m.scale(scales[g])), s0, a0);
        }
        hsum(_mm256_add_ps(a0, a1))
    }
}

#[cfg(test)]
mod tests {
    use super::super::simd::tests::randoms;
    use super::*;
    use crate::{Array, QuantSpec};

    fn random_matrix(mode: QuantMode, rows: usize, cols: usize, seed: u64, global: Option<f32>) -> Quantized {
        let (bits, group) = mode.fixed_shape().unwrap();
        let words: Vec<u32> =
            randoms(rows * cols * bits / 32, seed).iter().map(|v| v.to_bits().wrapping_mul(0x9e37_79b9)).collect();
        // Keep clear of NaN codes and of scales that overflow, so sums compare as numbers.
        let words: Vec<u32> = if bits == 8 { words.iter().map(|w| w & 0xf7f7_f7f7).collect() } else { words };
        let scales: Vec<u8> = randoms(rows * cols / group, seed + 1)
            .iter()
            .map(|v| if mode == QuantMode::Nvfp4 { (v.abs() * 100.0) as u8 + 8 } else { 110 + (v.abs() * 20.0) as u8 })
            .collect();
        Quantized::new_fp(
            Array::from_slice(&words, &[rows, cols * bits / 32]).unwrap(),
            Array::from_slice(&scales, &[rows, cols / group]).unwrap(),
            global,
            QuantSpec { mode, bits, group_size: group },
            cols,
        )
        .unwrap()
    }

    #[test]
    fn every_isa_matches_the_scalar_reference_and_the_dequantized_rows() {
        let rows = 24;
        // Even and odd numbers of groups per row (the AVX2 path takes groups in pairs).
        for (mode, global, cols) in [
            (QuantMode::Mxfp4, None, 320),
            (QuantMode::Mxfp4, None, 352),
            (QuantMode::Mxfp8, None, 352),
            (QuantMode::Nvfp4, None, 320),
            (QuantMode::Nvfp4, Some(3.7), 336),
        ] {
            let q = random_matrix(mode, rows, cols, 11, global);
            let m = FpMatrix::new(&q).unwrap();
            let x = randoms(cols, 5);
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                m.dequantize_row(r, &mut row);
                let exact: f64 = row.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let magnitude: f64 = row.iter().zip(&x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let want = m.dot_row_scalar(r, &x);
                assert!((want as f64 - exact).abs() <= 1e-5 * magnitude + 1e-30, "{mode:?} row {r}: {want} vs {exact}");
                for isa in simd::testable() {
                    let got = m.dot_row_on(isa, r, &x);
                    assert!(
                        (got as f64 - want as f64).abs() <= 1e-5 * magnitude + 1e-30,
                        "{mode:?} {isa:?} row {r}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_decoders_match_the_tables() {
        if !simd::supported(Isa::Avx2) {
            return;
        }
        let x = vec![1f32; 8];
        for b in 0..=255u8 {
            // One code at lane 0 of an 8-byte run, scale 1 (e8m0 127), dotted with ones.
            let mut bytes = [0u8; 32];
            bytes[0] = b;
            let m = FpMatrix {
                packed: &bytes,
                scales: &[127],
                mode: QuantMode::Mxfp8,
                bits: 8,
                group: 32,
                cols: 32,
                global_scale: None,
            };
            let mut xs = x.clone();
            xs.resize(32, 0.0);
            // SAFETY: avx2 checked above; xs holds 32 values.
            let got = unsafe { x86::dot_row(&m, 0, &xs) };
            let want = fpquant::e4m3_value(b);
            assert!(got == want || (got.is_nan() && want.is_nan()), "e4m3 {b:#x}: {got} vs {want}");
        }
    }
}
