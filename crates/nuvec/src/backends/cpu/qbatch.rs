//! Fused dequantizing products of a few input rows (batched decode) over MLX affine weights.
//!
//! Running [`super::qgemv`] once per input row reads and unpacks every weight once per row.
//! Here each packed byte of an output row is read once and turned into floats once, in
//! registers, then multiplied with every input row of a tile of up to [`TILE`] rows; more rows
//! run as further tiles over the same weight row, by then in L1, so memory still sees one pass
//! over the weights.
//!
//! The unpacked weights are dequantized in registers (`scale * q + bias`, one FMA per vector of
//! eight shared by all the rows) instead of taking the bias through group sums of `x` as
//! `qgemv` does: with the unpacking shared, a bias term per group and input row would be the
//! only cost left that grows with the rows.
//!
//! Kernels, with AVX2+FMA (also used under AVX-512): 4-bit (nibbles of 32-bit lanes against a
//! transposed copy of `x`, as `qgemv`'s), 8-bit (two weight rows per pass, sharing each load
//! of `x`), and 2/3/5/6-bit (eight values unpacked per variable shift). The scalar ISA
//! dequantizes the row into scratch once and dots it with each input row. Every kernel takes
//! groups of 16, 32, 64 and 128.

use super::qgemv::QMatrix;
use super::simd::{self, Isa};

/// Input rows one kernel pass accumulates against (one register of sums per row).
pub(crate) const TILE: usize = 8;
/// The most input rows [`max_rows`] gives.
pub(crate) const MAX_ROWS: usize = 32;

/// Input rows up to which [`rows`] beats decoding tiles of weight rows for `gemm` (measured on
/// an AVX2 Zen 3 with 576 and 1536 columns); 0 without a SIMD kernel, where the per-row
/// matrix-vector kernels do better.
pub(crate) fn max_rows(bits: usize, isa: Isa) -> usize {
    if isa == Isa::Scalar {
        return 0;
    }
    match bits {
        8 => MAX_ROWS,
        4 => 20,
        _ => 16,
    }
}

/// Whether an AVX2 kernel takes this width.
#[cfg(target_arch = "x86_64")]
fn avx2_kernel(bits: usize) -> bool {
    matches!(bits, 2 | 3 | 4 | 5 | 6 | 8)
}

/// The input rows in the layout the kernels read. The 4-bit kernel wants each row's whole
/// blocks of 64 transposed 8x8, as [`super::qgemv::PreparedX`] lays out one row.
pub(crate) struct PreparedRows {
    /// `m` rows of `blocks * 64` floats (4-bit SIMD only; empty otherwise).
    pub perm: Vec<f32>,
    /// The ISA the rows were laid out for.
    pub isa: Isa,
}

impl PreparedRows {
    pub(crate) const fn new() -> Self {
        PreparedRows { perm: Vec::new(), isa: Isa::Scalar }
    }

    /// Lays out `x` (`x.len() / k` rows of `k`) for a matrix of `bits`.
    pub(crate) fn prepare(&mut self, x: &[f32], k: usize, bits: usize, isa: Isa) {
        self.isa = isa;
        self.perm.clear();
        if bits != 4 || isa == Isa::Scalar || k == 0 {
            return;
        }
        let kp = k / 64 * 64;
        self.perm.resize(x.len() / k * kp, 0.0);
        for (src, dst) in x.chunks_exact(k).zip(self.perm.chunks_exact_mut(kp.max(1))) {
            for (s, d) in src.chunks_exact(64).zip(dst.chunks_exact_mut(64)) {
                for j in 0..8 {
                    for i in 0..8 {
                        d[j * 8 + i] = s[8 * i + j];
                    }
                }
            }
        }
    }
}

/// Weight rows one kernel pass unpacks together (each load of `x` then feeds that many FMAs).
const PAIR: usize = 2;

/// Weight rows [`rows`] best takes at a time: [`PAIR`] at 8 bits (where each weight row's
/// bytes are a load per 8 weights, so sharing the loads of `x` matters most), one otherwise
/// (where sharing the unpacking over a whole [`TILE`] matters more).
pub(crate) fn pass_rows(w: &QMatrix, xs: &PreparedRows) -> usize {
    if w.bits == 8 && xs.isa != Isa::Scalar {
        PAIR
    } else {
        1
    }
}

/// Scratch floats [`rows`] needs: the scales and biases of [`PAIR`] rows, and a dequantized row.
pub(crate) fn scratch_len(w: &QMatrix) -> usize {
    2 * PAIR * w.groups() + w.cols
}

/// `out[j * m + i] = Σ_k w[r + j, k] x[i, k]` for `j < out.len() / m` (1 or [`PAIR`] weight
/// rows) and the `m` input rows of `x` (row-major, `w.cols` each), laid out by `xs`; `scratch`
/// has [`scratch_len`] floats.
pub(crate) fn rows(
    w: &QMatrix,
    r: usize,
    m: usize,
    x: &[f32],
    xs: &PreparedRows,
    scratch: &mut [f32],
    out: &mut [f32],
) {
    let (k, g) = (w.cols, w.groups());
    let nr = out.len() / m.max(1);
    assert!(x.len() >= m * k && scratch.len() >= scratch_len(w) && (1..=PAIR).contains(&nr) && out.len() == nr * m);
    let (params, dense) = scratch.split_at_mut(2 * PAIR * g);
    #[cfg(target_arch = "x86_64")]
    if xs.isa != Isa::Scalar && avx2_kernel(w.bits) {
        let rb = w.row_bytes();
        let bytes = &w.packed[r * rb..(r + nr) * rb];
        let (s, b) = params[..2 * nr * g].split_at_mut(nr * g);
        let kp = k / 64 * 64;
        // SAFETY: Avx2 and Avx512 are only chosen after detecting avx2+fma+f16c.
        unsafe {
            super::qgemv::x86::read_params(w.scales, r * g, s);
            super::qgemv::x86::read_params(w.biases, r * g, b);
        }
        assert!(w.bits != 4 || xs.perm.len() >= m * kp);
        let tile = if nr == 1 { TILE } else { TILE / PAIR };
        let mut i = 0;
        while i < m {
            let t = (m - i).min(tile);
            let xt = &x[i * k..(i + t) * k];
            let pt = if w.bits == 4 { &xs.perm[i * kp..(i + t) * kp] } else { &[][..] };
            let mut ot = [0f32; TILE];
            // SAFETY: as above; `prepare` laid out `xs` for this width (asserted above), and the
            // kernels assert the other lengths.
            unsafe { x86::tile(w.bits, nr, t, bytes, s, b, w.group, xt, pt, &mut ot[..nr * t]) };
            for j in 0..nr {
                out[j * m + i..j * m + i + t].copy_from_slice(&ot[j * t..(j + 1) * t]);
            }
            i += t;
        }
        return;
    }
    for j in 0..nr {
        w.dequantize_row(r + j, &mut dense[..k], params);
        for (o, xr) in out[j * m..(j + 1) * m].iter_mut().zip(x.chunks_exact(k.max(1))) {
            *o = if xs.isa == Isa::Scalar { simd::dot_scalar(&dense[..k], xr) } else { simd::dot(&dense[..k], xr) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::simd::x86::hsum;

    /// One tile: `nr` (1 or 2) weight rows against `t` input rows (1..=8 for one weight row,
    /// 1..=4 for two) through the `BITS`-wide kernel for those counts.
    ///
    /// # Safety
    /// As [`q4`] and [`qn`].
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile(
        bits: usize,
        nr: usize,
        t: usize,
        bytes: &[u8],
        s: &[f32],
        b: &[f32],
        group: usize,
        x: &[f32],
        perm: &[f32],
        out: &mut [f32],
    ) {
        macro_rules! by_rows {
            ($f:ident $(::<$bits:literal>)? $(, $arg:expr)*) => {
                match (nr, t) {
                    (1, 1) => $f::<$($bits,)? 1, 1>($($arg,)* out),
                    (1, 2) => $f::<$($bits,)? 1, 2>($($arg,)* out),
                    (1, 3) => $f::<$($bits,)? 1, 3>($($arg,)* out),
                    (1, 4) => $f::<$($bits,)? 1, 4>($($arg,)* out),
                    (1, 5) => $f::<$($bits,)? 1, 5>($($arg,)* out),
                    (1, 6) => $f::<$($bits,)? 1, 6>($($arg,)* out),
                    (1, 7) => $f::<$($bits,)? 1, 7>($($arg,)* out),
                    (1, _) => $f::<$($bits,)? 1, 8>($($arg,)* out),
                    (_, 1) => $f::<$($bits,)? 2, 1>($($arg,)* out),
                    (_, 2) => $f::<$($bits,)? 2, 2>($($arg,)* out),
                    (_, 3) => $f::<$($bits,)? 2, 3>($($arg,)* out),
                    (_, _) => $f::<$($bits,)? 2, 4>($($arg,)* out),
                }
            };
        }
        // SAFETY: forwarded contract; `nr` and `t` are the tile's counts (`out.len() == nr * t`).
        match bits {
            4 => by_rows!(q4, bytes, s, b, group, x, perm),
            8 => by_rows!(qn::<8>, bytes, s, b, group, x),
            2 => by_rows!(qn::<2>, bytes, s, b, group, x),
            3 => by_rows!(qn::<3>, bytes, s, b, group, x),
            5 => by_rows!(qn::<5>, bytes, s, b, group, x),
            _ => by_rows!(qn::<6>, bytes, s, b, group, x),
        }
    }

    /// Two sets of sums per pair of rows when there are few, so that enough FMAs are in flight.
    const fn sets(n: usize) -> usize {
        if n <= 4 {
            2
        } else {
            1
        }
    }

    /// `out[j * M + i] = Σ_k (s[j][k / group] q[j][k] + b[j][k / group]) x[i * k ..][k]` for
    /// `R` 4-bit weight rows `j` (`bytes`, `s`, `b`: the rows one after another) and `M` input
    /// rows. Each 32-byte load holds 64 weights (lane `l`, nibble `n`: weight `8l + n` of the
    /// block), which meet the prepared `perm` as in `qgemv`'s 4-bit kernel.
    ///
    /// # Safety
    /// avx2+fma must be available; `bytes` holds `R` rows of `k / 2` bytes, `x` `M` rows of `k`
    /// floats, `perm` their whole 64-blocks transposed by [`super::PreparedRows`], `s` and `b`
    /// `R` rows of one value per `group` (16, 32, 64 or 128), and `out.len() == R * M`.
    #[allow(clippy::needless_range_loop)] // rows index several register arrays in step
    #[target_feature(enable = "avx2,fma")]
    unsafe fn q4<const R: usize, const M: usize>(
        bytes: &[u8],
        s: &[f32],
        b: &[f32],
        group: usize,
        x: &[f32],
        perm: &[f32],
        out: &mut [f32],
    ) {
        let k = x.len() / M;
        let (kp, g, rb) = (k / 64 * 64, k / group, k / 2);
        assert!(matches!(group, 16 | 32 | 64 | 128) && k.is_multiple_of(group) && k.is_multiple_of(2));
        assert!(bytes.len() == R * rb && x.len() == M * k && perm.len() == M * kp);
        assert!(s.len() == R * g && b.len() == R * g && out.len() == R * M);
        let mask = _mm256_set1_epi32(0xf);
        let mut acc = [[[_mm256_setzero_ps(); M]; R]; 2];
        let (pb, pp) = (bytes.as_ptr(), perm.as_ptr());
        for blk in 0..kp / 64 {
            let k0 = 64 * blk;
            let mut v = [_mm256_setzero_si256(); R];
            let mut sv = [_mm256_setzero_ps(); R];
            let mut bv = [_mm256_setzero_ps(); R];
            for j in 0..R {
                // SAFETY: bytes [32 blk, 32 blk + 32) of row j lie inside it (k0 + 64 <= kp <= k).
                v[j] = _mm256_loadu_si256(pb.add(j * rb + 32 * blk) as *const __m256i);
                let (s, b) = (&s[j * g..(j + 1) * g], &b[j * g..(j + 1) * g]);
                // Lanes 0..4 are the block's first 32 weights (one group from 32 up); with groups
                // of 16 each pair of lanes has its own.
                (sv[j], bv[j]) = if group == 16 {
                    let g = k0 / 16;
                    (
                        _mm256_set_ps(s[g + 3], s[g + 3], s[g + 2], s[g + 2], s[g + 1], s[g + 1], s[g], s[g]),
                        _mm256_set_ps(b[g + 3], b[g + 3], b[g + 2], b[g + 2], b[g + 1], b[g + 1], b[g], b[g]),
                    )
                } else {
                    let (lo, hi) = (k0 / group, (k0 + 32) / group);
                    (
                        _mm256_set_m128(_mm_set1_ps(s[hi]), _mm_set1_ps(s[lo])),
                        _mm256_set_m128(_mm_set1_ps(b[hi]), _mm_set1_ps(b[lo])),
                    )
                };
            }
            for n in 0..8 {
                let mut wv = [_mm256_setzero_ps(); R];
                for j in 0..R {
                    let q = _mm256_cvtepi32_ps(_mm256_and_si256(v[j], mask));
                    v[j] = _mm256_srli_epi32::<4>(v[j]);
                    wv[j] = _mm256_fmadd_ps(q, sv[j], bv[j]);
                }
                let set = n % sets(R * M);
                for i in 0..M {
                    // SAFETY: input row i's block occupies perm [i kp + k0, i kp + k0 + 64).
                    let xv = _mm256_loadu_ps(pp.add(i * kp + k0 + 8 * n));
                    for j in 0..R {
                        acc[set][j][i] = _mm256_fmadd_ps(wv[j], xv, acc[set][j][i]);
                    }
                }
            }
        }
        for j in 0..R {
            for i in 0..M {
                out[j * M + i] = hsum(_mm256_add_ps(acc[0][j][i], acc[1][j][i]));
            }
        }
        // The rest of the rows (k not a multiple of 64), in natural order.
        for j in 0..R {
            for kk in (kp..k).step_by(2) {
                let byte = bytes[j * rb + kk / 2];
                let (sc, bi) = (s[j * g + kk / group], b[j * g + kk / group]);
                let (w0, w1) = (sc * (byte & 0xf) as f32 + bi, sc * (byte >> 4) as f32 + bi);
                for i in 0..M {
                    out[j * M + i] += w0 * x[i * k + kk] + w1 * x[i * k + kk + 1];
                }
            }
        }
    }

    /// [`q4`] for `BITS`-wide weight rows other than 4 (`x` in natural order). At 8 bits each
    /// 8 bytes widen to 8 lanes; otherwise 8 values fill `BITS` whole bytes, read as one integer
    /// whose low 32 bits hold values 0..4 and the 32 bits from bit `4 * BITS` on values 4..8,
    /// so one variable shift per lane and a mask give all eight (as `qgemv`'s kernels).
    ///
    /// # Safety
    /// avx2+fma must be available; `bytes` holds `R` rows of `k * BITS / 8` bytes, `x` `M` rows
    /// of `k` floats, `s` and `b` `R` rows of one value per `group` (a multiple of 16), and
    /// `out.len() == R * M`.
    #[allow(clippy::needless_range_loop)] // rows index several register arrays in step
    #[target_feature(enable = "avx2,fma")]
    unsafe fn qn<const BITS: usize, const R: usize, const M: usize>(
        bytes: &[u8],
        s: &[f32],
        b: &[f32],
        group: usize,
        x: &[f32],
        out: &mut [f32],
    ) {
        let k = x.len() / M;
        let (g, rb) = (k / group, k * BITS / 8);
        assert!(matches!(BITS, 2 | 3 | 5 | 6 | 8) && group.is_multiple_of(16) && k.is_multiple_of(group));
        assert!(bytes.len() == R * rb && x.len() == M * k && s.len() == R * g && b.len() == R * g);
        assert!(out.len() == R * M);
        let bi = BITS as i32;
        let shifts = _mm256_setr_epi32(0, bi, 2 * bi, 3 * bi, 0, bi, 2 * bi, 3 * bi);
        let mask = _mm256_set1_epi32((1 << BITS) - 1);
        let pb = bytes.as_ptr();
        // Weights k0..k0 + 8 of row j (k0 a multiple of 8) as floats.
        let unpack = |j: usize, k0: usize| {
            if BITS == 8 {
                // SAFETY: k0 + 8 <= k, so the 8 bytes lie in row j.
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(pb.add(j * rb + k0) as *const __m128i)))
            } else {
                let mut word = [0u8; 8];
                let at = j * rb + k0 / 8 * BITS;
                word[..BITS].copy_from_slice(&bytes[at..at + BITS]);
                let v = u64::from_le_bytes(word);
                let (lo, hi) = (v as i32, (v >> (4 * BITS)) as i32);
                let lanes = _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
                _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(lanes, shifts), mask))
            }
        };
        let mut acc = [[[_mm256_setzero_ps(); M]; R]; 2];
        let px = x.as_ptr();
        for gi in 0..g {
            let mut sv = [_mm256_setzero_ps(); R];
            let mut bv = [_mm256_setzero_ps(); R];
            for j in 0..R {
                (sv[j], bv[j]) = (_mm256_set1_ps(s[j * g + gi]), _mm256_set1_ps(b[j * g + gi]));
            }
            for at in (gi * group..(gi + 1) * group).step_by(16) {
                for h in 0..2 {
                    let k0 = at + 8 * h;
                    let mut wv = [_mm256_setzero_ps(); R];
                    for j in 0..R {
                        // k0 + 8 <= k: groups are multiples of 16 and divide k.
                        wv[j] = _mm256_fmadd_ps(unpack(j, k0), sv[j], bv[j]);
                    }
                    let set = h % sets(R * M);
                    for i in 0..M {
                        // SAFETY: input row i occupies x [i k, i k + k).
                        let xv = _mm256_loadu_ps(px.add(i * k + k0));
                        for j in 0..R {
                            acc[set][j][i] = _mm256_fmadd_ps(wv[j], xv, acc[set][j][i]);
                        }
                    }
                }
            }
        }
        for j in 0..R {
            for i in 0..M {
                out[j * M + i] = hsum(_mm256_add_ps(acc[0][j][i], acc[1][j][i]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::qgemv::{row_reference, test_weights};
    use super::super::simd::tests::randoms;
    use super::*;

    /// `m` input rows against `n` weight rows; scales and biases as f32 (0), f16 (1) or bf16 (2).
    fn check(bits: usize, group: usize, cols: usize, n: usize, m: usize, kind: u8) {
        let weights = test_weights::Weights::new(bits, group, cols, n, bits as u64 + m as u64);
        let w = weights.matrix(kind);
        let x = randoms(m * cols, 99 + m as u64);
        let mut scratch = vec![0f32; scratch_len(&w)];
        for isa in simd::testable() {
            let mut xs = PreparedRows::new();
            xs.prepare(&x, cols, bits, isa);
            // Weight rows one at a time and in pairs.
            for nr in 1..=PAIR {
                let mut out = vec![0f32; nr * m];
                for r in (0..n + 1 - nr).step_by(nr) {
                    rows(&w, r, m, &x, &xs, &mut scratch, &mut out);
                    for (ji, &o) in out.iter().enumerate() {
                        let (j, i) = (ji / m, ji % m);
                        let want = row_reference(&w, r + j, &x[i * cols..(i + 1) * cols]);
                        let tol = 1e-5 * (cols as f64).sqrt() * (1.0 + want.abs()) * 4.0;
                        assert!(
                            (o as f64 - want).abs() <= tol,
                            "bits {bits} group {group} cols {cols} isa {isa:?} weight row {} input row {i} of {m}: \
                             {o} vs {want}",
                            r + j
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn multi_row_matches_dequantize_then_dot() {
        for m in 1..=17 {
            for bits in [2usize, 3, 4, 5, 6, 8] {
                for group in [16usize, 32, 64, 128] {
                    // 576 = 9 blocks of 64; 96, 80 and 16 end in part of a 64-block.
                    for cols in [128usize, 576, 96, 80, 16] {
                        if cols % group == 0 && (cols * bits) % 32 == 0 {
                            check(bits, group, cols, 4, m, (m % 3) as u8);
                        }
                    }
                }
            }
        }
        // More than 16 groups, several tiles plus a remainder, every params dtype.
        for kind in 0..3 {
            check(4, 32, 1536, 5, 13, kind);
            check(8, 64, 1088, 4, 11, kind);
            check(4, 128, 1024, 3, 16, kind);
        }
    }
}
