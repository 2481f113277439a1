//! Fused dequantizing matrix-vector products over MLX affine weights (`w = scale * q + bias`).
//!
//! Per group `g` of a row, `Σ_k w[k] x[k] = scale_g * Σ_k q[k] x[k] + bias_g * Σ_k x[k]`: the group
//! sums of `x` are computed once per call, and each packed byte is read once and turned into floats
//! in registers (never a dequantized row in memory). Activations and accumulation stay f32.
//!
//! Kernels: 4-bit and 8-bit with AVX-512 (four rows per pass sharing the loads of `x`) and with
//! AVX2+FMA, 2/3/5/6-bit with AVX2+FMA (eight values unpacked per variable shift), and a generic
//! scalar kernel (every width) that is also the fallback; `row_reference`
//! (dequantize, then dot) is the reference the tests hold them to. Every kernel takes groups of
//! 16 (GGUF's Q2_K/Q3_K/Q6_K as loaded), 32, 64 and 128.
//!
//! The AVX-512 4-bit kernel dequantizes through a table: per group, the 16 possible values
//! `scale * q + bias` are one register, and `vpermps` with the nibbles as indices gives the
//! weights (it reads only the low 4 bits of each index, so no masking).

use half::{bf16, f16};

use super::linear::unpack_row;
use super::qgemv_i8::{self, Int8X};
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
            Params::F16(p) => simd::widen(&p[start..end], out),
            Params::BF16(p) => simd::widen(&p[start..end], out),
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

/// The input vector in the forms the kernels read: as is, its group sums, and for the 4-bit
/// kernels a permuted copy: AVX2 wants each block of 64 transposed 8x8 so that nibble `j` of
/// 32-bit lane `i` meets `x[8i + j]`; AVX-512 wants each block of 32 split into its even and its
/// odd elements (low and high nibbles of 16 consecutive bytes).
pub(crate) struct PreparedX {
    pub sums: Vec<f32>,
    pub perm: Vec<f32>,
    /// The ISA `perm` was laid out for.
    pub isa: Isa,
    /// The input quantized to int8 (`NUVEC_CPU_INT8_DOT`), kept between products so that its
    /// buffers are reused; read through [`PreparedX::int8`].
    int8: Int8X,
    /// Whether `int8` holds this input ([`qgemv_i8::runs`] took the product).
    int8_on: bool,
}

impl PreparedX {
    pub(crate) fn new() -> Self {
        PreparedX { sums: vec![], perm: vec![], isa: Isa::Scalar, int8: Int8X::new(), int8_on: false }
    }

    /// The int8 form of the input, where this product takes it.
    pub(crate) fn int8(&self) -> Option<&Int8X> {
        self.int8_on.then_some(&self.int8)
    }

    pub(crate) fn prepare(&mut self, x: &[f32], group: usize, bits: usize, isa: Isa) {
        self.isa = isa;
        self.perm.clear();
        self.int8_on = qgemv_i8::runs(isa, bits, group);
        if self.int8_on {
            // The int8 kernels carry their own group sums (of the quantized input).
            self.int8.prepare(x, group, bits);
            return;
        }
        self.sums.clear();
        self.sums.extend(x.chunks(group).map(|c| c.iter().sum::<f32>()));
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 && x512_kernel(bits, group) {
            let per_lane = 32 / bits;
            self.perm.resize(x.len().div_ceil(16 * per_lane) * 16 * per_lane, 0.0);
            lay_out_x512(x, per_lane, &mut self.perm);
            return;
        }
        if bits == 4 && isa != Isa::Scalar {
            self.perm.resize(x.len() / 64 * 64, 0.0);
            lay_out_avx2_4bit(x, &mut self.perm);
        }
    }
}

/// `x` as the AVX-512 kernels read it: blocks of 16 lanes x `per_lane` values, `dst[k0 + 16 j +
/// i] = x[k0 + per_lane i + j]`, zero-padded to whole blocks (`dst` holds `x.len()` rounded up
/// to a multiple of `16 * per_lane`; every element of it is written).
pub(crate) fn lay_out_x512(x: &[f32], per_lane: usize, dst: &mut [f32]) {
    let block = 16 * per_lane;
    assert!(per_lane <= 8 && dst.len() == x.len().div_ceil(block) * block);
    let mut tail = [0f32; 128];
    for (src, dst) in x.chunks(block).zip(dst.chunks_exact_mut(block)) {
        let src = if src.len() == block {
            src
        } else {
            tail[..src.len()].copy_from_slice(src);
            tail[src.len()..block].iter_mut().for_each(|v| *v = 0.0);
            &tail[..block]
        };
        for (i, lane) in src.chunks_exact(per_lane).enumerate() {
            for (j, &v) in lane.iter().enumerate() {
                dst[16 * j + i] = v;
            }
        }
    }
}

/// `x`'s whole blocks of 64 as the AVX2 4-bit kernels read them, each transposed 8x8 so that
/// nibble `j` of 32-bit lane `i` meets `x[8 i + j]` (`dst` holds `x.len() / 64 * 64`).
pub(crate) fn lay_out_avx2_4bit(x: &[f32], dst: &mut [f32]) {
    assert!(dst.len() == x.len() / 64 * 64);
    for (src, dst) in x.chunks_exact(64).zip(dst.chunks_exact_mut(64)) {
        for j in 0..8 {
            for i in 0..8 {
                dst[j * 8 + i] = src[8 * i + j];
            }
        }
    }
}

/// Whether the AVX-512 kernels take this width and group size.
fn x512_kernel(bits: usize, group: usize) -> bool {
    (bits == 4 || bits == 8) && matches!(group, 16 | 32 | 64 | 128)
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

/// Scratch floats [`rows`] needs: the scales and biases of the rows one pass reads.
pub(crate) fn params_len(w: &QMatrix) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        qgemv_i8::avx2::params_len(w)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        2 * w.groups()
    }
}

/// `out[r] = Σ_k w[r0 + r, k] x[k]` for the rows `r0..r0 + out.len()`. `params` is scratch of
/// [`params_len`] floats.
pub(crate) fn rows(w: &QMatrix, r0: usize, x: &[f32], xs: &PreparedX, params: &mut [f32], out: &mut [f32]) {
    let isa = xs.isa;
    #[cfg(target_arch = "x86_64")]
    if let Some(x8) = xs.int8() {
        // SAFETY: `prepare` makes the int8 form only where `qgemv_i8::runs` found the
        // instructions and the kernels take this width and group; it was laid out for them from
        // an `x` of `w.cols` values (the kernel asserts the shapes).
        unsafe { qgemv_i8::q_rows(isa, w, r0, x8, params, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && x512_kernel(w.bits, w.group) {
        // SAFETY: Avx512 is only chosen after detecting avx512f/bw/vl (and avx2, fma, f16c);
        // `prepare` laid out `xs` for this ISA and width; the kernel asserts the shapes.
        unsafe {
            if w.bits == 4 {
                x512::q_rows::<4>(w, r0, &xs.perm, &xs.sums, out)
            } else {
                x512::q_rows::<8>(w, r0, &xs.perm, &xs.sums, out)
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 || isa == Isa::Avx512 {
        // SAFETY: Avx2 is only chosen after detecting avx2+fma+f16c; `prepare` laid out `xs` for
        // this ISA and width from an `x` of `w.cols` values (the kernels check the lengths).
        unsafe { x86::rows(w, r0, x, xs, params, out) };
        return;
    }
    let _ = isa;
    for (i, o) in out.iter_mut().enumerate() {
        *o = row_scalar(w, r0 + i, x, xs, params);
    }
}

/// AVX-512 kernels: four rows per pass, per-group scales and biases converted 16 at a time.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x512 {
    use std::arch::x86_64::*;

    use super::{Params, QMatrix};

    /// Rows per pass.
    const R: usize = 4;
    /// How many rows ahead the kernels prefetch the packed weights.
    const PF_ROWS: usize = 8;

    /// Params `start..start + n` (n <= 16) as 16 f32 lanes (lanes past n are 0).
    ///
    /// # Safety
    /// avx512f/bw/vl and f16c must be available; `start + n` is within `p`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    pub(crate) unsafe fn params16(p: Params, start: usize, n: usize) -> __m512 {
        let mask: __mmask16 = if n >= 16 { 0xffff } else { (1u16 << n) - 1 };
        match p {
            Params::F32(v) => {
                assert!(start + n <= v.len());
                // SAFETY: the mask limits the load to start..start + n (asserted in bounds).
                _mm512_maskz_loadu_ps(mask, v.as_ptr().add(start))
            }
            Params::F16(v) => {
                assert!(start + n <= v.len());
                // SAFETY: as above, 16-bit elements.
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, v.as_ptr().add(start) as *const i16))
            }
            Params::BF16(v) => {
                assert!(start + n <= v.len());
                // SAFETY: as above; bf16 is the top half of an f32.
                let h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, v.as_ptr().add(start) as *const i16));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
            }
        }
    }

    /// `out[i] = Σ_k w[r0 + i, k] x[k]` for a 4-bit (`BITS = 4`) or 8-bit (`BITS = 8`) matrix.
    /// `xp` is `x` laid out by [`super::PreparedX`] for AVX-512 and `sums` its group sums.
    ///
    /// # Safety
    /// avx512f/bw/vl and f16c must be available; `w.bits == BITS`, `w.group` is 16, 32, 64 or 128,
    /// `xp` is the prepared layout of an `x` of `w.cols` floats, `sums.len() == w.groups()`, and
    /// rows `r0..r0 + out.len()` exist in `w`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    pub(crate) unsafe fn q_rows<const BITS: usize>(w: &QMatrix, r0: usize, xp: &[f32], sums: &[f32], out: &mut [f32]) {
        let mut i = 0;
        while i + R <= out.len() {
            // SAFETY: forwarded contract; rows r0 + i .. r0 + i + R exist.
            let v = q_block::<BITS, R>(w, r0 + i, xp, sums);
            out[i..i + R].copy_from_slice(&v);
            i += R;
        }
        while i < out.len() {
            // SAFETY: as above, one row.
            out[i] = q_block::<BITS, 1>(w, r0 + i, xp, sums)[0];
            i += 1;
        }
    }

    /// `N` rows of [`q_rows`]. Each 64-byte load holds 16 lanes of `32 / BITS` weights; lane `i`
    /// of a block starting at weight `k0` holds weights `k0 + (32 / BITS) i ..`, and value `j` of
    /// every lane (a shift and a mask away) meets the prepared `xp[k0 + 16 j ..][..16]`.
    /// Per block, `Σ q x` per lane is scaled by its group's scale (one `vpermps` of the 16
    /// scales loaded per 16 groups); the biases meet the group sums of `x` once per 16 groups.
    #[inline]
    #[allow(clippy::needless_range_loop)] // rows index several register arrays in step
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn q_block<const BITS: usize, const N: usize>(w: &QMatrix, r0: usize, xp: &[f32], sums: &[f32]) -> [f32; N] {
        let per_lane = 32 / BITS;
        let block = 16 * per_lane;
        let (cols, group) = (w.cols, w.group);
        let (g_total, rb) = (w.groups(), w.row_bytes());
        // A lane holds 32 / BITS <= 8 weights, so with any of these groups it lies in one group.
        assert!(w.bits == BITS && (BITS == 4 || BITS == 8) && matches!(group, 16 | 32 | 64 | 128));
        assert!(xp.len() == cols.div_ceil(block) * block && sums.len() == g_total && cols == g_total * group);
        assert!((r0 + N) * rb <= w.packed.len());
        let shift = _mm512_set1_epi32(group.trailing_zeros() as i32);
        let lane_first = _mm512_mullo_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32(per_lane as i32),
        );
        let mask_q = _mm512_set1_epi32((1 << BITS) - 1);
        let iota = _mm512_set_ps(15., 14., 13., 12., 11., 10., 9., 8., 7., 6., 5., 4., 3., 2., 1., 0.);
        let mut acc = [_mm512_setzero_ps(); N];
        let mut bacc = [_mm512_setzero_ps(); N];
        let (px, pb) = (xp.as_ptr(), w.packed.as_ptr().add(r0 * rb));
        let mut g0 = 0;
        while g0 < g_total {
            let gn = (g_total - g0).min(16);
            let gmask: __mmask16 = if gn >= 16 { 0xffff } else { (1u16 << gn) - 1 };
            // SAFETY: the mask limits the load to sums[g0..g0 + gn].
            let sumv = _mm512_maskz_loadu_ps(gmask, sums.as_ptr().add(g0));
            let mut sv = [_mm512_setzero_ps(); N];
            for r in 0..N {
                // SAFETY: groups g0..g0 + gn of row r0 + r exist (the row exists).
                sv[r] = params16(w.scales, (r0 + r) * g_total + g0, gn);
                let bv = params16(w.biases, (r0 + r) * g_total + g0, gn);
                bacc[r] = _mm512_fmadd_ps(bv, sumv, bacc[r]);
            }
            let k_end = (g0 + gn) * group;
            let mut k0 = g0 * group;
            while k0 < k_end {
                // Group of each lane's first weight, relative to g0.
                let idx = _mm512_sub_epi32(
                    _mm512_srlv_epi32(_mm512_add_epi32(_mm512_set1_epi32(k0 as i32), lane_first), shift),
                    _mm512_set1_epi32(g0 as i32),
                );
                let bytes = (k_end - k0).min(block) * BITS / 8;
                let lmask: __mmask16 = if bytes >= 64 { 0xffff } else { (1u16 << (bytes / 4)) - 1 };
                // SAFETY: xp holds whole blocks (zero-padded), so k0 + block <= xp.len().
                let xb = px.add(k0);
                if BITS == 4 && bytes == 32 {
                    // A half block at the end of the row (cols = 64 mod 128, e.g. 576): 8 lanes
                    // in 256-bit registers, half the work of a masked 512-bit block.
                    let mask8 = _mm256_set1_epi32(0xf);
                    let mut t8 = [_mm256_setzero_ps(); N];
                    let mut v8 = [_mm256_setzero_si256(); N];
                    for r in 0..N {
                        // SAFETY: the row's last 32 bytes, k0 / 2 .. k0 / 2 + 32 = rb.
                        v8[r] = _mm256_loadu_si256(pb.add(r * rb + k0 / 2) as *const __m256i);
                    }
                    for j in 0..8 {
                        // SAFETY: lanes 0..8 of the prepared block's row j (inside xp).
                        let xv = _mm256_loadu_ps(xb.add(16 * j));
                        let sh = _mm256_set1_epi32(4 * j as i32);
                        for r in 0..N {
                            let q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(v8[r], sh), mask8));
                            t8[r] = _mm256_fmadd_ps(q, xv, t8[r]);
                        }
                    }
                    for r in 0..N {
                        let scale = _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, sv[r]));
                        acc[r] = _mm512_add_ps(acc[r], _mm512_zextps256_ps512(_mm256_mul_ps(t8[r], scale)));
                    }
                    k0 += block;
                    continue;
                }
                let mut t = [_mm512_setzero_ps(); N];
                let mut u = [_mm512_setzero_ps(); N];
                let mut v = [_mm512_setzero_si512(); N];
                for r in 0..N {
                    // Rows are consumed a few at a time, as short strided streams the hardware
                    // prefetcher does not follow: fetch the same bytes PF_ROWS rows ahead.
                    let ahead = pb.wrapping_add((r + PF_ROWS) * rb + k0 * BITS / 8);
                    _mm_prefetch::<_MM_HINT_NTA>(ahead as *const i8);
                    // SAFETY: the mask limits the load to the row's bytes k0 * BITS / 8 ..
                    // + bytes, which lie inside row r0 + r.
                    v[r] = _mm512_maskz_loadu_epi32(lmask, pb.add(r * rb + k0 * BITS / 8) as *const i32);
                }
                for j in 0..per_lane {
                    let xv = _mm512_loadu_ps(xb.add(16 * j));
                    for r in 0..N {
                        let sh = _mm512_srlv_epi32(v[r], _mm512_set1_epi32((BITS * j) as i32));
                        // 4-bit: `vpermps` reads only the low 4 bits of each index, so a lookup in
                        // 0..16 is the mask and the conversion in one shuffle.
                        let q = if BITS == 4 {
                            _mm512_permutexvar_ps(sh, iota)
                        } else {
                            _mm512_cvtepi32_ps(_mm512_and_si512(sh, mask_q))
                        };
                        if j % 2 == 0 {
                            t[r] = _mm512_fmadd_ps(q, xv, t[r]);
                        } else {
                            u[r] = _mm512_fmadd_ps(q, xv, u[r]);
                        }
                    }
                }
                for r in 0..N {
                    acc[r] = _mm512_fmadd_ps(_mm512_add_ps(t[r], u[r]), _mm512_permutexvar_ps(idx, sv[r]), acc[r]);
                }
                k0 += block;
            }
            g0 += gn;
        }
        let mut out = [0f32; N];
        for r in 0..N {
            out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], bacc[r]));
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::super::simd::x86::hsum;
    use super::Params;

    /// [`super::rows`] on AVX2: each row's scales and biases widened, its bias term (the biases
    /// against `x`'s group sums) and its product, in one function so that the per-row steps
    /// inline (a row of a small model is a few hundred values: their calls cost as much as
    /// the row).
    ///
    /// # Safety
    /// avx2, fma and f16c must be available; `xs` prepared for `w` on AVX2 from `x`
    /// ([`super::PreparedX::prepare`]), `params` at least `2 * w.groups()` floats.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn rows(
        w: &super::QMatrix,
        r0: usize,
        x: &[f32],
        xs: &super::PreparedX,
        params: &mut [f32],
        out: &mut [f32],
    ) {
        if !matches!(w.bits, 2..=6 | 8) {
            for (i, o) in out.iter_mut().enumerate() {
                *o = super::row_scalar(w, r0 + i, x, xs, params);
            }
            return;
        }
        let (g, rb) = (w.groups(), w.row_bytes());
        let (s, b) = params[..2 * g].split_at_mut(g);
        for (i, o) in out.iter_mut().enumerate() {
            let r = r0 + i;
            let bytes = &w.packed[r * rb..(r + 1) * rb];
            read_params(w.scales, r * g, s);
            read_params(w.biases, r * g, b);
            let bias = super::super::simd::x86::dot(b, &xs.sums);
            *o = bias
                + match w.bits {
                    4 => q4(bytes, s, w.group, x, &xs.perm),
                    8 => q8(bytes, s, w.group, x),
                    2 => unpacked::<2>(bytes, s, w.group, x),
                    3 => unpacked::<3>(bytes, s, w.group, x),
                    5 => unpacked::<5>(bytes, s, w.group, x),
                    _ => unpacked::<6>(bytes, s, w.group, x),
                };
        }
    }

    /// The group of a column, `k / group`, as a shift where the group size is a power of two (every
    /// MLX and GGUF group size is): the kernels ask once or twice per block of columns, and an
    /// integer division there costs as much as the block's arithmetic.
    #[inline(always)]
    fn group_index(group: usize) -> impl Fn(usize) -> usize {
        let shift = group.trailing_zeros();
        let pow2 = group.is_power_of_two();
        move |k| if pow2 { k >> shift } else { k / group }
    }

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
                    out[j] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(src[j].to_bits()))));
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
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn q4(bytes: &[u8], s: &[f32], group: usize, x: &[f32], perm: &[f32]) -> f32 {
        let k = x.len();
        let blocks = k / 64;
        assert!(bytes.len() * 2 >= k && perm.len() >= blocks * 64 && s.len() * group >= k);
        let mask = _mm256_set1_epi32(0xf);
        let group_of = group_index(group);
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
            // Lane i holds elements 64b + 8i .. + 8: lanes 0..4 are the block's first 32 (one
            // scale from group 32 up), and with groups of 16 each pair of lanes has its own.
            let k0 = 64 * b;
            let sv = if group == 16 {
                let g = k0 / 16;
                _mm256_set_ps(s[g + 3], s[g + 3], s[g + 2], s[g + 2], s[g + 1], s[g + 1], s[g], s[g])
            } else {
                _mm256_set_m128(_mm_set1_ps(s[group_of(k0 + 32)]), _mm_set1_ps(s[group_of(k0)]))
            };
            if b % 2 == 0 {
                acc0 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sv, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sv, acc1);
            }
        }
        let mut total = hsum(_mm256_add_ps(acc0, acc1));
        // The rest of the row (cols not a multiple of 64), in natural order, group by group.
        let mut k0 = blocks * 64;
        while k0 < k {
            let end = ((k0 / group + 1) * group).min(k);
            let mut t = 0f32;
            for j in (k0..end).step_by(2) {
                let byte = bytes[j / 2];
                t += (byte & 0xf) as f32 * x[j] + (byte >> 4) as f32 * x[j + 1];
            }
            total += s[k0 / group] * t;
            k0 = end;
        }
        total
    }

    /// `Σ_g s[g] * Σ_{k in g} q[k] x[k]` for one row of 2, 3, 5 or 6 bits (no bias term).
    /// Eight values fill `BITS` whole bytes: read as one integer, its low 32 bits hold values
    /// 0..4 and the 32 bits from bit `4 * BITS` on values 4..8, so one variable shift per lane
    /// and a mask give all eight.
    ///
    /// # Safety
    /// avx2+fma must be available; `bytes` holds `x.len() * BITS / 8` bytes, `s` one scale per
    /// `group` of `x`, and `group` is a multiple of 16 dividing `x.len()`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn unpacked<const BITS: usize>(bytes: &[u8], s: &[f32], group: usize, x: &[f32]) -> f32 {
        let k = x.len();
        assert!(BITS <= 8 && group.is_multiple_of(16) && k.is_multiple_of(group) && s.len() * group >= k);
        assert!(bytes.len() * 8 >= k * BITS);
        let b = BITS as i32;
        let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 0, b, 2 * b, 3 * b);
        let mask = _mm256_set1_epi32((1 << BITS) - 1);
        let run = |r: usize| {
            let mut word = [0u8; 8];
            word[..BITS].copy_from_slice(&bytes[r * BITS..(r + 1) * BITS]);
            let v = u64::from_le_bytes(word);
            let (lo, hi) = (v as i32, (v >> (4 * BITS)) as i32);
            let lanes = _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
            _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(lanes, shifts), mask))
        };
        let px = x.as_ptr();
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        for (g, &scale) in s[..k / group].iter().enumerate() {
            let mut t0 = _mm256_setzero_ps();
            let mut t1 = _mm256_setzero_ps();
            let mut at = g * group;
            while at < (g + 1) * group {
                // SAFETY: at + 16 <= k (groups are multiples of 16 and divide k).
                t0 = _mm256_fmadd_ps(run(at / 8), _mm256_loadu_ps(px.add(at)), t0);
                t1 = _mm256_fmadd_ps(run(at / 8 + 1), _mm256_loadu_ps(px.add(at + 8)), t1);
                at += 16;
            }
            let sv = _mm256_set1_ps(scale);
            if g % 2 == 0 {
                acc0 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sv, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sv, acc1);
            }
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }

    /// `Σ_g s[g] * Σ_{k in g} q[k] x[k]` for one 8-bit row (no bias term).
    ///
    /// # Safety
    /// avx2+fma must be available; `bytes` holds `x.len()` bytes, `s` one scale per `group` of
    /// `x`, and `x.len()` is a multiple of 32 (of 16 with groups of 16).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn q8(bytes: &[u8], s: &[f32], group: usize, x: &[f32]) -> f32 {
        let k = x.len();
        assert!(bytes.len() >= k && k.is_multiple_of(group.min(32)) && s.len() * group >= k);
        let (pb, px) = (bytes.as_ptr(), x.as_ptr());
        // SAFETY (of both closures' reads): callers pass offsets with at most k bytes and floats.
        let q = |at: usize| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(pb.add(at) as *const __m128i)));
        let xv = |at: usize| _mm256_loadu_ps(px.add(at));
        let group_of = group_index(group);
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut k0 = 0;
        while k0 + 32 <= k {
            // Reads bytes and x at [k0, k0 + 32), inside k.
            if group == 16 {
                // Two groups: each half of the 32 gets its own scale.
                let lo = _mm256_fmadd_ps(q(k0 + 8), xv(k0 + 8), _mm256_mul_ps(q(k0), xv(k0)));
                let hi = _mm256_fmadd_ps(q(k0 + 24), xv(k0 + 24), _mm256_mul_ps(q(k0 + 16), xv(k0 + 16)));
                acc0 = _mm256_fmadd_ps(lo, _mm256_set1_ps(s[k0 / 16]), acc0);
                acc1 = _mm256_fmadd_ps(hi, _mm256_set1_ps(s[k0 / 16 + 1]), acc1);
                k0 += 32;
                continue;
            }
            let mut t0 = _mm256_mul_ps(q(k0), xv(k0));
            let mut t1 = _mm256_mul_ps(q(k0 + 8), xv(k0 + 8));
            t0 = _mm256_fmadd_ps(q(k0 + 16), xv(k0 + 16), t0);
            t1 = _mm256_fmadd_ps(q(k0 + 24), xv(k0 + 24), t1);
            let sv = _mm256_set1_ps(s[group_of(k0)]);
            if (k0 / 32) % 2 == 0 {
                acc0 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sv, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sv, acc1);
            }
            k0 += 32;
        }
        if k0 < k {
            // A last group of 16 (group 16, cols = 16 mod 32): reads [k0, k0 + 16) = [k0, k).
            let t = _mm256_fmadd_ps(q(k0 + 8), xv(k0 + 8), _mm256_mul_ps(q(k0), xv(k0)));
            acc0 = _mm256_fmadd_ps(t, _mm256_set1_ps(s[k0 / 16]), acc0);
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }
}

/// Random quantized weights for the kernels' tests.
#[cfg(test)]
pub(crate) mod test_weights {
    use half::{bf16, f16};

    use super::super::simd::tests::randoms;
    use super::{Params, QMatrix};

    /// `rows` rows of `cols` packed `bits`-wide values (drawn from `seed`) with per-group
    /// scales and biases, kept in f32, f16 and bf16.
    pub(crate) struct Weights {
        packed: Vec<u8>,
        s32: Vec<f32>,
        b32: Vec<f32>,
        s16: Vec<f16>,
        b16: Vec<f16>,
        sb: Vec<bf16>,
        bb: Vec<bf16>,
        bits: usize,
        group: usize,
        cols: usize,
    }

    impl Weights {
        pub(crate) fn new(bits: usize, group: usize, cols: usize, rows: usize, seed: u64) -> Self {
            let words = cols * bits / 32;
            let packed = randoms(rows * words * 4, seed).iter().map(|v| ((v + 1.0) * 127.9) as u8).collect();
            let g = cols / group;
            let s32: Vec<f32> = randoms(rows * g, 7).iter().map(|v| v * 0.1).collect();
            let b32: Vec<f32> = randoms(rows * g, 8).iter().map(|v| v * 0.5).collect();
            Weights {
                packed,
                s16: s32.iter().map(|&v| f16::from_f32(v)).collect(),
                b16: b32.iter().map(|&v| f16::from_f32(v)).collect(),
                sb: s32.iter().map(|&v| bf16::from_f32(v)).collect(),
                bb: b32.iter().map(|&v| bf16::from_f32(v)).collect(),
                s32,
                b32,
                bits,
                group,
                cols,
            }
        }

        /// The matrix with scales and biases as f32 (`kind` 0), f16 (1) or bf16 (2).
        pub(crate) fn matrix(&self, kind: u8) -> QMatrix<'_> {
            let (scales, biases) = match kind {
                1 => (Params::F16(&self.s16), Params::F16(&self.b16)),
                2 => (Params::BF16(&self.sb), Params::BF16(&self.bb)),
                _ => (Params::F32(&self.s32), Params::F32(&self.b32)),
            };
            QMatrix { packed: &self.packed, scales, biases, bits: self.bits, group: self.group, cols: self.cols }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::simd::tests::randoms;
    use super::*;

    /// Scales and biases stored as f32 (0), f16 (1) or bf16 (2).
    fn check(bits: usize, group: usize, cols: usize, rows_n: usize, kind: u8) {
        let g = cols / group;
        let weights = test_weights::Weights::new(bits, group, cols, rows_n, bits as u64);
        let w = weights.matrix(kind);
        let x = randoms(cols, 99);
        let mut params = vec![0f32; 2 * g];
        for isa in simd::testable() {
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
            for group in [16usize, 32, 64, 128] {
                for cols in [128usize, 384, 576] {
                    if cols % group == 0 && (cols * bits) % 32 == 0 {
                        check(bits, group, cols, 5, if bits == 4 { 1 } else { 2 });
                        check(bits, group, cols, 3, 0);
                    }
                }
            }
        }
        // cols = 32 mod 64 exercises the 4-bit kernel's half block.
        check(4, 32, 96, 4, 1);
        // Groups of 16 (GGUF's Q2_K/Q3_K/Q6_K): rows ending in a half block or a single group,
        // and more than 16 groups per row.
        for bits in [2usize, 3, 4, 5, 6, 8] {
            for cols in [96usize, 80, 16, 1536] {
                if (cols * bits) % 32 == 0 {
                    check(bits, 16, cols, 6, 1);
                    check(bits, 16, cols, 5, 0);
                }
            }
        }
        // Several 4-row blocks plus a remainder, more than 16 groups, bf16 params.
        for bits in [4usize, 8] {
            check(bits, 32, 1536, 11, 1);
            check(bits, 64, 1088, 6, 2);
            check(bits, 128, 1024, 9, 0);
        }
    }
}
