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
//! Kernels, with AVX2+FMA: 4-bit (nibbles of 32-bit lanes against a transposed copy of `x`, as
//! `qgemv`'s), 8-bit (two weight rows per pass, sharing each load of `x`), and 2/3/5/6-bit
//! (eight values unpacked per variable shift). With AVX-512 the 4- and 8-bit widths have kernels
//! of their own (`x512`: 16 weights per instruction, each row's scales read in place, weight rows
//! in pairs); the others take the AVX2 ones. The copies of `x` start on a
//! cache line (a vector load across two lines costs two). The scalar ISA dequantizes the row
//! into scratch once and dots it with each input row. Every kernel takes groups of 16, 32, 64
//! and 128.

use super::qgemv::QMatrix;
use super::qgemv_i8::{self, Int8X};
use super::simd::{self, Isa};

/// Input rows one kernel pass accumulates against (one register of sums per row).
pub(crate) const TILE: usize = 8;
/// The most input rows [`max_rows`] gives.
pub(crate) const MAX_ROWS: usize = 32;

/// Input rows up to which [`rows`] beats decoding tiles of weight rows for `gemm` (measured on
/// an AVX2 Zen 3 with 576 and 1536 columns; the AVX-512 4-bit kernel up to 32 rows on an
/// AVX-512 Xeon, SmolLM2 at 32 sequences); 0 without a SIMD kernel, where the per-row
/// matrix-vector kernels do better.
pub(crate) fn max_rows(bits: usize, isa: Isa) -> usize {
    if isa == Isa::Scalar {
        return 0;
    }
    match bits {
        8 => MAX_ROWS,
        #[cfg(target_arch = "x86_64")]
        4 if isa == Isa::Avx512 => MAX_ROWS,
        4 => 20,
        _ => 16,
    }
}

/// Whether an AVX-512 kernel takes this width (groups of 16 to 128, as every kernel here).
#[cfg(target_arch = "x86_64")]
fn x512_kernel(bits: usize) -> bool {
    matches!(bits, 4 | 8)
}

/// Whether an AVX2 kernel takes this width.
#[cfg(target_arch = "x86_64")]
fn avx2_kernel(bits: usize) -> bool {
    matches!(bits, 2 | 3 | 4 | 5 | 6 | 8)
}

/// The input rows in the layout the kernels read. The 4-bit kernels want each row as
/// [`super::qgemv::PreparedX`] lays out one: under AVX2 its whole blocks of 64 transposed 8x8,
/// under AVX-512 blocks of 128 as 16 lanes of 8 (`perm[k0 + 16 j + i] = x[k0 + 8 i + j]`),
/// zero-padded to whole blocks.
pub(crate) struct PreparedRows {
    /// `m` rows of `stride` floats (4-bit SIMD only; empty otherwise).
    pub perm: Vec<f32>,
    /// Floats per row of `perm`.
    pub stride: usize,
    /// Where row 0 starts in `perm`: on a cache line, so that no vector load of it touches two.
    pub start: usize,
    /// The ISA the rows were laid out for.
    pub isa: Isa,
    /// The rows quantized to int8 (`NUVEC_CPU_INT8_DOT`), kept between products so that its
    /// buffers are reused; read through [`PreparedRows::int8`].
    int8: Int8X,
    /// Whether `int8` holds these rows ([`qgemv_i8::runs`] took the product).
    int8_on: bool,
}

/// Values of a row per block of the AVX-512 4-bit layout (16 lanes of 8 nibbles).
const X512_BLOCK: usize = 128;

impl PreparedRows {
    pub(crate) const fn new() -> Self {
        PreparedRows { perm: Vec::new(), stride: 0, start: 0, isa: Isa::Scalar, int8: Int8X::new(), int8_on: false }
    }

    /// The int8 form of the rows, where this product takes it.
    pub(crate) fn int8(&self) -> Option<&Int8X> {
        self.int8_on.then_some(&self.int8)
    }

    /// Lays out `x` (`x.len() / k` rows of `k`) for a matrix of `bits` in groups of `group`
    /// (int8 activations where [`qgemv_i8`] is on and takes them; else each row as
    /// [`super::qgemv::PreparedX`] lays out one (AVX-512: 4 bits its lanes of 8, 8 bits natural
    /// order; AVX2: 4 bits only), rows `stride` apart from a cache line on).
    pub(crate) fn prepare(&mut self, x: &[f32], k: usize, group: usize, bits: usize, isa: Isa) {
        self.isa = isa;
        self.perm.clear();
        (self.stride, self.start) = (0, 0);
        self.int8_on = k > 0 && qgemv_i8::runs(isa, bits, group);
        if k == 0 {
            return;
        }
        if self.int8_on {
            self.int8.prepare_rows(x, k, group, bits);
            return;
        }
        let stride = match (isa, bits) {
            (Isa::Scalar, _) => return,
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, 4) => k.div_ceil(X512_BLOCK) * X512_BLOCK,
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, 8) => k.next_multiple_of(16),
            #[cfg(target_arch = "x86_64")]
            (_, 4) => k / 64 * 64,
            #[cfg(target_arch = "x86_64")]
            _ => return,
        };
        if stride == 0 {
            return; // AVX2, rows shorter than one block: the kernel reads x itself
        }
        self.stride = stride;
        self.perm.resize(x.len() / k * stride + 16, 0.0);
        self.start = self.perm.as_ptr().align_offset(64).min(16);
        for (src, dst) in x.chunks_exact(k).zip(self.perm[self.start..].chunks_exact_mut(stride)) {
            match (isa, bits) {
                #[cfg(target_arch = "x86_64")]
                (Isa::Avx512, 4) => super::qgemv::lay_out_x512(src, 8, dst),
                #[cfg(target_arch = "x86_64")]
                (Isa::Avx512, _) => dst[..k].copy_from_slice(src),
                _ => super::qgemv::lay_out_avx2_4bit(src, dst),
            }
        }
    }
}

/// Weight rows one kernel pass unpacks together (each load of `x` then feeds that many FMAs).
const PAIR: usize = 2;
/// The most weight rows one call of [`rows`] takes ([`pass_rows`]).
pub(crate) const PASS_MAX: usize = 8;

/// Weight rows [`rows`] best takes at a time: [`PASS_MAX`] for the AVX-512 4- and 8-bit kernels
/// and the int8 ones (which read their rows' scales themselves, so a call costs little beyond its
/// rows), [`PAIR`] at 8 bits
/// (where each weight row's bytes are a load per 8 weights, so sharing the loads of `x` matters
/// most), one otherwise (where sharing the unpacking over a whole [`TILE`] matters more).
pub(crate) fn pass_rows(w: &QMatrix, xs: &PreparedRows) -> usize {
    #[cfg(target_arch = "x86_64")]
    if xs.int8().is_some() || (x512_kernel(w.bits) && xs.isa == Isa::Avx512) {
        // These kernels read their own scales: several rows per call spread the call.
        return PASS_MAX;
    }
    if w.bits == 8 && xs.isa != Isa::Scalar {
        PAIR
    } else {
        1
    }
}

/// Scratch floats [`rows`] needs: the scales and biases of [`PAIR`] rows and a dequantized row,
/// and at least what the int8 kernels' passes take ([`super::qgemv::params_len`]).
pub(crate) fn scratch_len(w: &QMatrix) -> usize {
    (2 * PAIR * w.groups() + w.cols).max(super::qgemv::params_len(w))
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
    assert!(x.len() >= m * k && scratch.len() >= scratch_len(w) && (1..=PASS_MAX).contains(&nr) && out.len() == nr * m);
    #[cfg(target_arch = "x86_64")]
    if let Some(x8) = xs.int8() {
        // SAFETY: `prepare` makes the int8 form only where `qgemv_i8::runs` found the
        // instructions and the kernels take this width and group, from `m` rows of `k` (the
        // kernel asserts the shapes).
        unsafe { qgemv_i8::rows(xs.isa, w, r, m, x8, scratch, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if x512_kernel(w.bits) && xs.isa == Isa::Avx512 {
        assert!(xs.stride >= k && xs.perm.len() >= xs.start + m * xs.stride);
        // SAFETY: Avx512 is only chosen after detecting avx512f/bw/vl and f16c; `prepare` laid
        // out `xs` for this width, and the kernels assert the rest.
        unsafe { x512::rows(w, r, nr, m, &xs.perm[xs.start..], xs.stride, out) };
        return;
    }
    assert!(nr <= PAIR, "{nr} weight rows in one pass: only the AVX-512 kernels take more than {PAIR}");
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
        assert!(w.bits != 4 || xs.perm.len() >= xs.start + m * kp);
        let tile = if nr == 1 { TILE } else { TILE / PAIR };
        let mut i = 0;
        while i < m {
            let t = (m - i).min(tile);
            let xt = &x[i * k..(i + t) * k];
            let pt = if w.bits == 4 { &xs.perm[xs.start + i * kp..xs.start + (i + t) * kp] } else { &[][..] };
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

#[cfg(target_arch = "x86_64")]
mod x512 {
    use std::arch::x86_64::*;

    use super::super::qgemv::x512::params16;
    use super::super::qgemv::QMatrix;

    /// `out[j * m + i] = Σ_k w[r0 + j, k] x[i][k]` for `nr` 4- or 8-bit weight rows from `r0`
    /// and `m` input rows laid out by [`super::PreparedRows`] for AVX-512 (`perm`, rows `stride`
    /// apart), in tiles of up to [`super::TILE`] input rows per pass over the weight rows (the
    /// later passes find them in L1); weight rows go in pairs that share each load of `x` (at 4
    /// bits pairs with tiles of 8 measured faster than single rows with tiles of 16: 39 against
    /// 30 GMAC/s on one core at 32 input rows of 576).
    ///
    /// # Safety
    /// avx512f/bw/vl and f16c must be available; as [`q4`] and [`q8`], for each row and tile.
    pub(super) unsafe fn rows(
        w: &QMatrix,
        r0: usize,
        nr: usize,
        m: usize,
        perm: &[f32],
        stride: usize,
        out: &mut [f32],
    ) {
        assert!(out.len() == nr * m && perm.len() >= m * stride);
        let mut ot = [0f32; 2 * super::TILE];
        let mut j = 0;
        while j < nr {
            let rows = (nr - j).min(2);
            let mut i = 0;
            while i < m {
                let t = (m - i).min(super::TILE);
                let p = &perm[i * stride..(i + t) * stride];
                let o = &mut ot[..rows * t];
                macro_rules! by_tile {
                    ($f:ident $(, $r:literal)?) => {
                        match t {
                            1 => $f::<$($r,)? 1>(w, r0 + j, p, stride, o),
                            2 => $f::<$($r,)? 2>(w, r0 + j, p, stride, o),
                            3 => $f::<$($r,)? 3>(w, r0 + j, p, stride, o),
                            4 => $f::<$($r,)? 4>(w, r0 + j, p, stride, o),
                            5 => $f::<$($r,)? 5>(w, r0 + j, p, stride, o),
                            6 => $f::<$($r,)? 6>(w, r0 + j, p, stride, o),
                            7 => $f::<$($r,)? 7>(w, r0 + j, p, stride, o),
                            _ => $f::<$($r,)? 8>(w, r0 + j, p, stride, o),
                        }
                    };
                }
                // SAFETY: forwarded contract; `t` is the tile's row count, `rows` the pass's.
                match (w.bits, rows) {
                    (4, 1) => by_tile!(q4, 1),
                    (4, _) => by_tile!(q4, 2),
                    (_, 1) => by_tile!(q8, 1),
                    _ => by_tile!(q8, 2),
                }
                for jj in 0..rows {
                    out[(j + jj) * m + i..(j + jj) * m + i + t].copy_from_slice(&ot[jj * t..(jj + 1) * t]);
                }
                i += t;
            }
            j += rows;
        }
    }

    /// `out[j * M + i] = Σ_k (s[k / group] q[k] + b[k / group]) x[i][k]` for 4-bit weight rows
    /// `r..r + R` of `w` and `M` input rows laid out for AVX-512 (`perm`, rows `stride` apart),
    /// each load of `x` shared by the `R` rows. Each 64-byte load
    /// holds 128 weights, lane `l` nibble `j` weight `8 l + j` of the block, which meets the
    /// prepared `x[k0 + 16 j ..][..16]`. A lane's 8 weights lie in one group (groups of 16 and
    /// more), the same one in every block: lane `l`'s group is `(8 l) / group` past the block's
    /// first. Weights are dequantized in registers once and feed every input row; past the row's
    /// end the masked load gives 0 and the padded `x` is 0.
    ///
    /// # Safety
    /// avx512f/bw/vl and f16c must be available; `w.bits == 4`, `w.group` is 16, 32, 64 or 128,
    /// rows `r..r + R` exist, `perm` holds `M` rows of `stride >= w.cols` rounded up to 128
    /// floats, and `out.len() == R * M`.
    #[inline]
    #[allow(clippy::needless_range_loop)] // rows index several register arrays in step
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn q4<const R: usize, const M: usize>(w: &QMatrix, r: usize, perm: &[f32], stride: usize, out: &mut [f32]) {
        let block = super::X512_BLOCK;
        let (k, group, g, rb) = (w.cols, w.group, w.groups(), w.row_bytes());
        assert!(w.bits == 4 && matches!(group, 16 | 32 | 64 | 128) && k == g * group && (r + R) * rb <= w.packed.len());
        assert!(stride >= k.div_ceil(block) * block && perm.len() >= M * stride && out.len() == R * M);
        let per_block = block / group;
        // Lane l's group relative to the block's first: (8 l) >> log2(group).
        let idx = _mm512_srlv_epi32(
            _mm512_set_epi32(120, 112, 104, 96, 88, 80, 72, 64, 56, 48, 40, 32, 24, 16, 8, 0),
            _mm512_set1_epi32(group.trailing_zeros() as i32),
        );
        let iota = _mm512_set_ps(15., 14., 13., 12., 11., 10., 9., 8., 7., 6., 5., 4., 3., 2., 1., 0.);
        // Two sets of sums when there are few, so that enough FMAs are in flight.
        let sets = if R * M <= 4 { 2 } else { 1 };
        let mut acc = [[[_mm512_setzero_ps(); M]; R]; 2];
        let (pb, px) = (w.packed.as_ptr().add(r * rb), perm.as_ptr());
        let mut k0 = 0;
        while k0 < k {
            let (g0, gn) = (k0 / group, (g - k0 / group).min(per_block));
            // k - k0 is a multiple of 16 (groups of 16 and more divide k): whole 4-byte lanes.
            let lanes = ((k - k0) / 8).min(16);
            let lmask: __mmask16 = if lanes >= 16 { 0xffff } else { (1u16 << lanes) - 1 };
            let mut sl = [_mm512_setzero_ps(); R];
            let mut bl = [_mm512_setzero_ps(); R];
            let mut v = [_mm512_setzero_si512(); R];
            for jr in 0..R {
                // SAFETY: groups g0..g0 + gn of row r + jr exist.
                sl[jr] = _mm512_permutexvar_ps(idx, params16(w.scales, (r + jr) * g + g0, gn));
                bl[jr] = _mm512_permutexvar_ps(idx, params16(w.biases, (r + jr) * g + g0, gn));
                // SAFETY: the mask limits the load to the row's bytes k0 / 2 .. k0 / 2 + 4 lanes.
                v[jr] = _mm512_maskz_loadu_epi32(lmask, pb.add(jr * rb + k0 / 2) as *const i32);
            }
            for j in 0..8 {
                let mut wv = [_mm512_setzero_ps(); R];
                for jr in 0..R {
                    // `vpermps` reads only the low 4 bits of each index: the mask and the
                    // conversion of nibble j in one shuffle.
                    let q = _mm512_permutexvar_ps(_mm512_srlv_epi32(v[jr], _mm512_set1_epi32(4 * j as i32)), iota);
                    wv[jr] = _mm512_fmadd_ps(q, sl[jr], bl[jr]);
                }
                let set = j % sets;
                for i in 0..M {
                    // SAFETY: row i's block k0 lies in perm [i stride, (i + 1) stride).
                    let xv = _mm512_loadu_ps(px.add(i * stride + k0 + 16 * j));
                    for jr in 0..R {
                        acc[set][jr][i] = _mm512_fmadd_ps(wv[jr], xv, acc[set][jr][i]);
                    }
                }
            }
            k0 += block;
        }
        for jr in 0..R {
            for i in 0..M {
                out[jr * M + i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][jr][i], acc[1][jr][i]));
            }
        }
    }

    /// `out[j * M + i] = Σ_k (s[k / group] q[k] + b[k / group]) x[i][k]` for 8-bit weight rows
    /// `r..r + R` of `w` and `M` input rows in natural order (`perm`, rows `stride` apart): 16
    /// weights widened per load, their group's scale and bias picked from 16 groups loaded at
    /// once, each load of `x` shared by the `R` rows.
    ///
    /// # Safety
    /// avx512f/bw/vl and f16c must be available; `w.bits == 8`, `w.group` is 16, 32, 64 or 128,
    /// rows `r..r + R` exist, `perm` holds `M` rows of `stride >= w.cols` floats, and
    /// `out.len() == R * M`.
    #[inline]
    #[allow(clippy::needless_range_loop)] // rows index several register arrays in step
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn q8<const R: usize, const M: usize>(w: &QMatrix, r: usize, perm: &[f32], stride: usize, out: &mut [f32]) {
        let (k, group, g, rb) = (w.cols, w.group, w.groups(), w.row_bytes());
        assert!(w.bits == 8 && matches!(group, 16 | 32 | 64 | 128) && k == g * group && (r + R) * rb <= w.packed.len());
        assert!(stride >= k && perm.len() >= M * stride && out.len() == R * M);
        let mut acc = [[_mm512_setzero_ps(); M]; R];
        let (pb, px) = (w.packed.as_ptr().add(r * rb), perm.as_ptr());
        let mut g0 = 0;
        while g0 < g {
            let gn = (g - g0).min(16);
            let mut sv = [_mm512_setzero_ps(); R];
            let mut bv = [_mm512_setzero_ps(); R];
            for j in 0..R {
                // SAFETY: groups g0..g0 + gn of row r + j exist.
                sv[j] = params16(w.scales, (r + j) * g + g0, gn);
                bv[j] = params16(w.biases, (r + j) * g + g0, gn);
            }
            let mut k0 = g0 * group;
            while k0 < (g0 + gn) * group {
                let gi = _mm512_set1_epi32((k0 / group - g0) as i32);
                let mut wv = [_mm512_setzero_ps(); R];
                for j in 0..R {
                    // SAFETY: k0 + 16 <= k (groups of 16 and more divide k): in row r + j.
                    let q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                        pb.add(j * rb + k0) as *const __m128i
                    )));
                    wv[j] = _mm512_fmadd_ps(q, _mm512_permutexvar_ps(gi, sv[j]), _mm512_permutexvar_ps(gi, bv[j]));
                }
                for i in 0..M {
                    // SAFETY: input row i occupies perm [i stride, i stride + k).
                    let xv = _mm512_loadu_ps(px.add(i * stride + k0));
                    for j in 0..R {
                        acc[j][i] = _mm512_fmadd_ps(wv[j], xv, acc[j][i]);
                    }
                }
                k0 += 16;
            }
            g0 += gn;
        }
        for j in 0..R {
            for i in 0..M {
                out[j * M + i] = _mm512_reduce_add_ps(acc[j][i]);
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
            xs.prepare(&x, cols, group, bits, isa);
            // Weight rows one at a time, in pairs, and as many as a pass takes.
            for nr in 1..=pass_rows(&w, &xs).max(PAIR).min(n) {
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
