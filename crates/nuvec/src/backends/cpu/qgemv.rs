//! Fused dequantizing matrix-vector products over MLX affine weights (`w = scale * q + bias`).
//!
//! Per group `g` of a row, `Σ_k w[k] x[k] = scale_g * Σ_k q[k] x[k] + bias_g * Σ_k x[k]`: the group
//! sums of `x` are computed once per call, and each packed byte is read once and turned into floats
//! in registers (never a dequantized row in memory). Activations and accumulation stay f32.
//!
//! Kernels: 4-bit and 8-bit with AVX2+FMA, and a generic scalar kernel (every width) that is also
//! the fallback; `row_reference` (dequantize, then dot) is the reference the tests hold them to.

use half::{bf16, f16, slice::HalfFloatSliceExt};

use super::linear::unpack_row;
use super::simd::{self, Isa};

/// Per-group scales or biases in their stored dtype.
#[derive(Clone, Copy)]
pub(crate) enum Params<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl Params<'_> {
    /// Elements `start..start + out.len()` as f32.
    pub(crate) fn read(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            Params::F32(p) => out.copy_from_slice(&p[start..end]),
            Params::F16(p) => p[start..end].convert_to_f32_slice(out),
            Params::BF16(p) => p[start..end].convert_to_f32_slice(out),
        }
    }
}

/// A quantized matrix as the kernels see it.
#[derive(Clone, Copy)]
pub(crate) struct QMatrix<'a> {
    pub packed: &'a [u8],
    pub scales: Params<'a>,
    pub biases: Params<'a>,
    pub bits: usize,
    pub group: usize,
    pub cols: usize,
}

impl QMatrix<'_> {
    pub(crate) fn row_bytes(&self) -> usize {
        self.cols * self.bits / 8
    }

    pub(crate) fn groups(&self) -> usize {
        self.cols / self.group
    }

    /// Row `r` dequantized into `out` (`cols` floats).
    pub(crate) fn dequantize_row(&self, r: usize, out: &mut [f32], params: &mut [f32]) {
        let (g, rb) = (self.groups(), self.row_bytes());
        unpack_row(&self.packed[r * rb..(r + 1) * rb], self.bits, out);
        let (s, b) = params[..2 * g].split_at_mut(g);
        self.scales.read(r * g, s);
        self.biases.read(r * g, b);
        for (i, chunk) in out.chunks_mut(self.group).enumerate() {
            chunk.iter_mut().for_each(|v| *v = s[i] * *v + b[i]);
        }
    }
}

/// The input vector in the forms the kernels read: as is, its group sums, and (for the 4-bit
/// AVX2 kernel) each block of 64 transposed 8x8 so that nibble `j` of 32-bit lane `i` meets
/// `x[8i + j]`.
pub(crate) struct PreparedX {
    pub sums: Vec<f32>,
    pub perm: Vec<f32>,
}

impl PreparedX {
    pub(crate) fn new() -> Self {
        PreparedX { sums: vec![], perm: vec![] }
    }

    pub(crate) fn prepare(&mut self, x: &[f32], group: usize, bits: usize, isa: Isa) {
        self.sums.clear();
        self.sums.extend(x.chunks(group).map(|c| c.iter().sum::<f32>()));
        self.perm.clear();
        if bits == 4 && isa != Isa::Scalar {
            let blocks = x.len() / 64;
            self.perm.resize(blocks * 64, 0.0);
            for b in 0..blocks {
                let (src, dst) = (&x[b * 64..b * 64 + 64], &mut self.perm[b * 64..b * 64 + 64]);
                for j in 0..8 {
                    for i in 0..8 {
                        dst[j * 8 + i] = src[8 * i + j];
                    }
                }
            }
        }
    }
}

/// Reference: row `r` dequantized, then dotted with `x` in f64.
#[cfg(test)]
pub(crate) fn row_reference(w: &QMatrix, r: usize, x: &[f32]) -> f64 {
    let mut row = vec![0f32; w.cols];
    let mut params = vec![0f32; 2 * w.groups()];
    w.dequantize_row(r, &mut row, &mut params);
    row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum()
}

/// Generic kernel (any width): group by group, unpack to floats on the stack, dot.
pub(crate) fn row_scalar(w: &QMatrix, r: usize, x: &[f32], xs: &PreparedX, params: &mut [f32]) -> f32 {
    let (g, rb) = (w.groups(), w.row_bytes());
    let bytes = &w.packed[r * rb..(r + 1) * rb];
    let (s, b) = params[..2 * g].split_at_mut(g);
    w.scales.read(r * g, s);
    w.biases.read(r * g, b);
    let gb = w.group * w.bits / 8;
    let mut buf = [0f32; 128];
    let mut acc = 0f32;
    for i in 0..g {
        let q = &mut buf[..w.group];
        unpack_row(&bytes[i * gb..(i + 1) * gb], w.bits, q);
        acc += s[i] * simd::dot_scalar(q, &x[i * w.group..(i + 1) * w.group]) + b[i] * xs.sums[i];
    }
    acc
}

/// `out[r] = Σ_k w[r0 + r, k] x[k]` for the rows `r0..r0 + out.len()`. `params` is scratch of at
/// least `2 * groups` floats.
pub(crate) fn rows(w: &QMatrix, r0: usize, x: &[f32], xs: &PreparedX, params: &mut [f32], out: &mut [f32]) {
    let isa = simd::isa();
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        let (g, rb) = (w.groups(), w.row_bytes());
        for (i, o) in out.iter_mut().enumerate() {
            let r = r0 + i;
            let bytes = &w.packed[r * rb..(r + 1) * rb];
            let (s, b) = params[..2 * g].split_at_mut(g);
            // SAFETY: Avx2 is only chosen after detecting avx2+fma+f16c; the slices have the
            // lengths the kernels check (cols, groups, and the prepared perm).
            *o = unsafe {
                x86::read_params(w.scales, r * g, s);
                x86::read_params(w.biases, r * g, b);
                let bias = simd::x86::dot(b, &xs.sums);
                bias + match w.bits {
                    4 => x86::q4(bytes, s, w.group, x, &xs.perm),
                    8 => x86::q8(bytes, s, w.group, x),
                    _ => row_scalar(w, r, x, xs, params) - bias,
                }
            };
        }
        return;
    }
    let _ = isa;
    for (i, o) in out.iter_mut().enumerate() {
        *o = row_scalar(w, r0 + i, x, xs, params);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::super::simd::x86::hsum;
    use super::Params;

    /// `p[start..start + out.len()]` as f32 (F16C for f16, a shift for bf16).
    ///
    /// # Safety
    /// avx2 and f16c must be available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn read_params(p: Params, start: usize, out: &mut [f32]) {
        let n = out.len();
        let po = out.as_mut_ptr();
        let mut i = 0;
        match p {
            Params::F32(v) => out.copy_from_slice(&v[start..start + n]),
            Params::F16(v) => {
                let src = &v[start..start + n];
                let ps = src.as_ptr() as *const u16;
                // SAFETY: i + 8 <= n bounds both the 8 halfs read and the 8 floats written.
                while i + 8 <= n {
                    _mm256_storeu_ps(po.add(i), _mm256_cvtph_ps(_mm_loadu_si128(ps.add(i) as *const __m128i)));
                    i += 8;
                }
                for j in i..n {
                    out[j] = src[j].to_f32();
                }
            }
            Params::BF16(v) => {
                let src = &v[start..start + n];
                let ps = src.as_ptr() as *const u16;
                // SAFETY: as above.
                while i + 8 <= n {
                    let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(ps.add(i) as *const __m128i));
                    _mm256_storeu_ps(po.add(i), _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
                    i += 8;
                }
                for j in i..n {
                    out[j] = src[j].to_f32();
                }
            }
        }
    }

    /// `Σ_g s[g] * Σ_{k in g} q[k] x[k]` for one 4-bit row (no bias term).
    ///
    /// # Safety
    /// avx2+fma must be available; `bytes` holds `x.len() / 2` bytes, `s` one scale per `group`
    /// of `x`, `perm` the 64-blocks of `x` transposed as [`super::PreparedX`] writes them.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn q4(bytes: &[u8], s: &[f32], group: usize, x: &[f32], perm: &[f32]) -> f32 {
        let k = x.len();
        let blocks = k / 64;
        assert!(bytes.len() * 2 >= k && perm.len() >= blocks * 64 && s.len() * group >= k);
        let mask = _mm256_set1_epi32(0xf);
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let (pb, pp) = (bytes.as_ptr(), perm.as_ptr());
        for b in 0..blocks {
            // SAFETY: block b reads bytes [32b, 32b+32) < k/2 and perm [64b, 64b+64) (asserted).
            let v = _mm256_loadu_si256(pb.add(32 * b) as *const __m256i);
            let xp = pp.add(64 * b);
            let n0 = _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
            let n1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 4), mask));
            let n2 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8), mask));
            let n3 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 12), mask));
            let n4 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 16), mask));
            let n5 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 20), mask));
            let n6 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 24), mask));
            let n7 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 28));
            let mut t0 = _mm256_mul_ps(n0, _mm256_loadu_ps(xp));
            let mut t1 = _mm256_mul_ps(n1, _mm256_loadu_ps(xp.add(8)));
            t0 = _mm256_fmadd_ps(n2, _mm256_loadu_ps(xp.add(16)), t0);
            t1 = _mm256_fmadd_ps(n3, _mm256_loadu_ps(xp.add(24)), t1);
            t0 = _mm256_fmadd_ps(n4, _mm256_loadu_ps(xp.add(32)), t0);
            t1 = _mm256_fmadd_ps(n5, _mm256_loadu_ps(xp.add(40)), t1);
            t0 = _mm256_fmadd_ps(n6, _mm256_loadu_ps(xp.add(48)), t0);
            t1 = _mm256_fmadd_ps(n7, _mm256_loadu_ps(xp.add(56)), t1);
            // Lanes 0..4 hold elements 64b..64b+32, lanes 4..8 the next 32: one scale each.
            let k0 = 64 * b;
            let sv = _mm256_set_m128(_mm_set1_ps(s[(k0 + 32) / group]), _mm_set1_ps(s[k0 / group]));
            if b % 2 == 0 {
                acc0 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sv, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sv, acc1);
            }
        }
        let mut total = hsum(_mm256_add_ps(acc0, acc1));
        // A last half block of 32 (cols = 32 mod 64), in natural order.
        let k0 = blocks * 64;
        if k0 < k {
            let mut t = 0f32;
            for j in 0..(k - k0) / 2 {
                let byte = bytes[k0 / 2 + j];
                t += (byte & 0xf) as f32 * x[k0 + 2 * j] + (byte >> 4) as f32 * x[k0 + 2 * j + 1];
            }
            total += s[k0 / group] * t;
        }
        total
    }

    /// `Σ_g s[g] * Σ_{k in g} q[k] x[k]` for one 8-bit row (no bias term).
    ///
    /// # Safety
    /// avx2+fma must be available; `bytes` holds `x.len()` bytes, `s` one scale per `group` of
    /// `x`, and `x.len()` is a multiple of 32.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn q8(bytes: &[u8], s: &[f32], group: usize, x: &[f32]) -> f32 {
        let k = x.len();
        assert!(bytes.len() >= k && k.is_multiple_of(32) && s.len() * group >= k);
        let (pb, px) = (bytes.as_ptr(), x.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut k0 = 0;
        while k0 < k {
            // SAFETY: reads bytes and x at [k0, k0 + 32) with k0 + 32 <= k (asserted above).
            let q = |j: usize| {
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(pb.add(k0 + 8 * j) as *const __m128i)))
            };
            let mut t0 = _mm256_mul_ps(q(0), _mm256_loadu_ps(px.add(k0)));
            let mut t1 = _mm256_mul_ps(q(1), _mm256_loadu_ps(px.add(k0 + 8)));
            t0 = _mm256_fmadd_ps(q(2), _mm256_loadu_ps(px.add(k0 + 16)), t0);
            t1 = _mm256_fmadd_ps(q(3), _mm256_loadu_ps(px.add(k0 + 24)), t1);
            let sv = _mm256_set1_ps(s[k0 / group]);
            if (k0 / 32) % 2 == 0 {
                acc0 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sv, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sv, acc1);
            }
            k0 += 32;
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }
}

#[cfg(test)]
mod tests {
    use super::super::simd::tests::randoms;
    use super::*;

    fn check(bits: usize, group: usize, cols: usize, rows_n: usize, f16_params: bool) {
        let words = cols * bits / 32;
        let packed: Vec<u8> =
            randoms(rows_n * words * 4, bits as u64).iter().map(|v| ((v + 1.0) * 127.9) as u8).collect();
        let g = cols / group;
        let s32: Vec<f32> = randoms(rows_n * g, 7).iter().map(|v| v * 0.1).collect();
        let b32: Vec<f32> = randoms(rows_n * g, 8).iter().map(|v| v * 0.5).collect();
        let (s16, b16): (Vec<f16>, Vec<f16>) =
            (s32.iter().map(|&v| f16::from_f32(v)).collect(), b32.iter().map(|&v| f16::from_f32(v)).collect());
        let (scales, biases) =
            if f16_params { (Params::F16(&s16), Params::F16(&b16)) } else { (Params::F32(&s32), Params::F32(&b32)) };
        let w = QMatrix { packed: &packed, scales, biases, bits, group, cols };
        let x = randoms(cols, 99);
        let mut params = vec![0f32; 2 * g];
        for isa in [Isa::Scalar, simd::isa()] {
            let mut xs = PreparedX::new();
            xs.prepare(&x, group, bits, isa);
            let mut out = vec![0f32; rows_n];
            if isa == Isa::Scalar {
                for (r, o) in out.iter_mut().enumerate() {
                    *o = row_scalar(&w, r, &x, &xs, &mut params);
                }
            } else {
                rows(&w, 0, &x, &xs, &mut params, &mut out);
            }
            for (r, &o) in out.iter().enumerate() {
                let want = row_reference(&w, r, &x);
                let tol = 1e-5 * (cols as f64).sqrt() * (1.0 + want.abs()) * 4.0;
                assert!(
                    (o as f64 - want).abs() <= tol,
                    "bits {bits} group {group} cols {cols} isa {isa:?} row {r}: {o} vs {want}"
                );
            }
        }
    }

    #[test]
    fn fused_gemv_matches_dequantize_then_dot() {
        for bits in [2usize, 3, 4, 5, 6, 8] {
            for group in [32usize, 64, 128] {
                for cols in [128usize, 384, 576] {
                    if cols % group == 0 && (cols * bits) % 32 == 0 {
                        check(bits, group, cols, 5, bits == 4);
                        check(bits, group, cols, 3, false);
                    }
                }
            }
        }
        // cols = 32 mod 64 exercises the 4-bit kernel's half block.
        check(4, 32, 96, 4, true);
    }
}
