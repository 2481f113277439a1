//! AVX2 kernels over the same prepared input as [`super::x512`]: `vpmaddubsw` multiplies 32
//! unsigned weight codes by 32 signed input bytes and adds neighbours into 16-bit pairs, and
//! `vpmaddwd` against ones adds the pairs into 8 int32 lanes of four products each (llama.cpp's
//! AVX2 Q4_1 x Q8_1 arithmetic). A 64-byte block of the prepared layout is two 32-byte halves:
//! half `h` holds lanes `8h..8h + 8` of [`super::x512`]'s sixteen, so the same bytes meet the same
//! weights.
//!
//! The 16-bit pairs must not saturate. 4 bits: codes of at most 15 times inputs of at most 127,
//! four to a pair after the nibbles' two products are added, 7,620 at most. 8 bits: a code of up
//! to 255 times 127, twice, would reach 64,770, so the codes are taken as `q - 128` (signed, the
//! difference moved into the bias: `bias + 128 scale`), their magnitude against the input with
//! their sign (`vpsignb`), 32,512 at most.

use std::arch::x86_64::*;

use super::super::qgemv::x86::read_params;
use super::super::qgemv::QMatrix;
use super::super::simd::x86::hsum;
use super::Int8X;

/// How many rows ahead the kernels prefetch the packed weights (as the f32 kernels do).
const PF_ROWS: usize = 8;
/// Input rows one pass over a weight row takes (one register of sums each).
pub(crate) const TILE: usize = 4;
/// Weight rows one pass over a single input row takes: each load of the input's bytes and
/// scales, and the lanes' group indices, then serve four rows.
pub(crate) const ROWS: usize = 4;

/// Scratch floats the kernels need: [`ROWS`] rows' scales and biases.
pub(crate) fn params_len(w: &QMatrix) -> usize {
    2 * ROWS * w.groups()
}

/// `out[i] ≈ Σ_k w[r0 + i, k] x[k]` for a 4-bit or 8-bit matrix, `xs` prepared from one row
/// `x` for the matrix's width and groups ([`Int8X::prepare`]); `params` is scratch of
/// [`params_len`] floats.
///
/// # Safety
/// avx2, fma and f16c must be available; [`super::takes`] holds for `w`, `xs` was prepared
/// from an `x` of `w.cols` values for `w.bits` in groups of `w.group`, and rows
/// `r0..r0 + out.len()` exist in `w`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q_rows(w: &QMatrix, r0: usize, xs: &Int8X, params: &mut [f32], out: &mut [f32]) {
    let mut j = 0;
    while j < out.len() {
        let o = &mut out[j..];
        // SAFETY: forwarded contract; rows r0 + j.. exist as far as `o` reaches.
        if o.len() >= ROWS {
            tile_of::<ROWS, 1>(w, r0 + j, xs, 0, &xs.sums, params, &mut o[..ROWS]);
            j += ROWS;
        } else {
            tile_of::<1, 1>(w, r0 + j, xs, 0, &xs.sums, params, &mut o[..1]);
            j += 1;
        }
    }
}

/// `out[j * m + i] ≈ Σ_k w[r0 + j, k] x[i][k]` for `out.len() / m` weight rows from `r0` and
/// the `m` input rows `xs` was prepared from ([`Int8X::prepare_rows`]), in tiles of up to
/// [`TILE`] input rows per pass over a weight row.
///
/// # Safety
/// As [`q_rows`], with `xs` prepared from `m` rows of `w.cols` values in groups of `w.group`
/// for `w.bits`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows(w: &QMatrix, r0: usize, m: usize, xs: &Int8X, params: &mut [f32], out: &mut [f32]) {
    let g = w.groups();
    assert!(m > 0 && out.len().is_multiple_of(m) && xs.sums.len() == m * g);
    if m == 1 {
        // SAFETY: forwarded contract.
        return q_rows(w, r0, xs, params, out);
    }
    super::by_tiles(m, g, TILE, &xs.sums, out, |j, i, sums, o| {
        // SAFETY: forwarded contract; row r0 + j exists, input rows i..i + o.len() are prepared.
        match o.len() {
            1 => tile_of::<1, 1>(w, r0 + j, xs, i, sums, params, o),
            2 => tile_of::<1, 2>(w, r0 + j, xs, i, sums, params, o),
            3 => tile_of::<1, 3>(w, r0 + j, xs, i, sums, params, o),
            _ => tile_of::<1, 4>(w, r0 + j, xs, i, sums, params, o),
        }
    });
}

/// [`q_tile`] for the matrix's width.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_of<const R: usize, const M: usize>(
    w: &QMatrix,
    r: usize,
    xs: &Int8X,
    i0: usize,
    sums: &[f32],
    params: &mut [f32],
    out: &mut [f32],
) {
    // SAFETY: forwarded contract.
    if w.bits == 4 {
        q_tile::<4, R, M>(w, r, xs, i0, sums, params, out)
    } else {
        q_tile::<8, R, M>(w, r, xs, i0, sums, params, out)
    }
}

/// Weight rows `r..r + R` against the `M` prepared input rows from `i0` (`sums`: their group
/// sums of `x̂`, row after row) into `out[j * M + i]`. Per 32-byte half block of a row, lane `l`
/// of input row `i` sums its weights' codes times their input bytes in int32, then the sum, as
/// f32, meets the lane's group scale times its input scale. The bias terms (biases against the
/// group sums) go into the same registers: only their total is read.
#[inline]
#[allow(clippy::needless_range_loop)] // rows index several register arrays in step
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q_tile<const BITS: usize, const R: usize, const M: usize>(
    w: &QMatrix,
    r: usize,
    xs: &Int8X,
    i0: usize,
    sums: &[f32],
    params: &mut [f32],
    out: &mut [f32],
) {
    let block = super::block(BITS);
    let half = block / 2;
    let x_bytes = super::block_bytes(BITS);
    let (cols, group) = (w.cols, w.group);
    let (g, rb) = (w.groups(), w.row_bytes());
    assert!(w.bits == BITS && super::takes(BITS, group) && cols == g * group);
    let blocks = cols.div_ceil(block);
    assert!(xs.blocks == blocks && xs.xq.len() >= (i0 + M) * blocks * x_bytes);
    assert!(xs.lane_scale.len() >= (i0 + M) * blocks * 16 && sums.len() == M * g && out.len() == R * M);
    assert!((r + R) * rb <= w.packed.len() && params.len() >= 2 * R * g);
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    let mut tail = [[0f32; M]; R];
    let (scales, biases) = params[..2 * R * g].split_at_mut(R * g);
    // The rows' parameters lie one after another.
    read_params(w.scales, r * g, scales);
    read_params(w.biases, r * g, biases);
    for j in 0..R {
        let (s, b) = (&scales[j * g..(j + 1) * g], &mut biases[j * g..(j + 1) * g]);
        if BITS == 8 {
            // The codes are taken as q - 128 below.
            for (bias, &scale) in b.iter_mut().zip(s.iter()) {
                *bias += 128.0 * scale;
            }
        }
        // Into the row's registers rather than through `simd::x86::dot`: a row has a few dozen
        // groups, and the dot's own reduction and call made the kernel 15-25 % slower.
        for i in 0..M {
            let sm = &sums[i * g..(i + 1) * g];
            let mut k = 0;
            while k + 8 <= g {
                // SAFETY: k + 8 <= g bounds both loads.
                let (bv, sv) = (_mm256_loadu_ps(b.as_ptr().add(k)), _mm256_loadu_ps(sm.as_ptr().add(k)));
                acc[j][i] = _mm256_fmadd_ps(bv, sv, acc[j][i]);
                k += 8;
            }
            tail[j][i] = (k..g).map(|k| b[k] * sm[k]).sum();
        }
    }
    let shift = group.trailing_zeros();
    let nibble = _mm256_set1_epi8(0x0f);
    let flip = _mm256_set1_epi8(i8::MIN);
    let ones = _mm256_set1_epi16(1);
    let pb = w.packed.as_ptr().add(r * rb);
    let px = xs.xq.as_ptr().add(i0 * blocks * x_bytes);
    let pd = xs.lane_scale.as_ptr().add(i0 * blocks * 16);
    let ps = scales.as_ptr();
    // Groups of 32+ hold whole halves (64 or 32 values); a row of 4-bit weights may end half way
    // through its last half (32 values).
    let mut k0 = 0;
    while k0 < cols {
        let (bk, h) = (k0 / block, (k0 % block) / half);
        let whole = cols - k0 >= 64;
        // Lanes 0..4 of a 4-bit half are its first 32 values, lanes 4..8 the next 32 (past the
        // row's end: zero inputs, any scale).
        let (g_lo, g_hi) = (k0 >> shift, ((k0 + 32) >> shift).min(g - 1));
        let mut xv = [[_mm256_setzero_si256(); 2]; M];
        let mut dx = [_mm256_setzero_ps(); M];
        for i in 0..M {
            // SAFETY: half h of block bk of input row i0 + i exists (bk < blocks, asserted
            // sizes); at 4 bits its high nibbles' bytes lie 64 on.
            let xb = px.add((i * blocks + bk) * x_bytes + 32 * h);
            xv[i][0] = _mm256_loadu_si256(xb as *const __m256i);
            if BITS == 4 {
                xv[i][1] = _mm256_loadu_si256(xb.add(64) as *const __m256i);
            }
            dx[i] = _mm256_loadu_ps(pd.add((i * blocks + bk) * 16 + 8 * h));
        }
        for j in 0..R {
            let at = pb.add(j * rb + k0 * BITS / 8);
            if (k0 * BITS / 8).is_multiple_of(64) {
                _mm_prefetch::<_MM_HINT_NTA>(at.wrapping_add(PF_ROWS * rb) as *const i8);
            }
            let (wa, wb, ws) = if BITS == 4 {
                // SAFETY: 32 bytes (64 values) where the row has them, else its last 16.
                let v = if whole {
                    _mm256_loadu_si256(at as *const __m256i)
                } else {
                    _mm256_zextsi128_si256(_mm_loadu_si128(at as *const __m128i))
                };
                let sj = ps.add(j * g);
                let ws = _mm256_set_m128(_mm_broadcast_ss(&*sj.add(g_hi)), _mm_broadcast_ss(&*sj.add(g_lo)));
                (_mm256_and_si256(v, nibble), _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble), ws)
            } else {
                // SAFETY: 32 bytes (32 values): 8-bit rows are whole groups of 32+.
                let v = _mm256_xor_si256(_mm256_loadu_si256(at as *const __m256i), flip);
                (_mm256_abs_epi8(v), v, _mm256_broadcast_ss(&*ps.add(j * g + g_lo)))
            };
            for i in 0..M {
                let pairs = if BITS == 4 {
                    _mm256_add_epi16(_mm256_maddubs_epi16(wa, xv[i][0]), _mm256_maddubs_epi16(wb, xv[i][1]))
                } else {
                    _mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv[i][0], wb))
                };
                let sum = _mm256_madd_epi16(pairs, ones);
                acc[j][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(ws, dx[i]), acc[j][i]);
            }
        }
        k0 += half;
    }
    for j in 0..R {
        for i in 0..M {
            out[j * M + i] = hsum(acc[j][i]) + tail[j][i];
        }
    }
}

/// Quantizes `src`'s whole blocks of 32 values as [`Int8X`] does (bit for bit: the same largest
/// magnitude, scale and rounding to nearest even), writing the codes into `xq` (one row of the
/// layout for `BITS`), pushing each block's scale onto `scale` and adding `d · Σ codes` to its
/// group's sum in `sums`. Returns how many blocks it took; the rest of the row is the caller's.
///
/// # Safety
/// avx2, fma and f16c must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_row<const BITS: usize>(
    src: &[f32],
    group: usize,
    xq: &mut [i8],
    scale: &mut Vec<f32>,
    sums: &mut [f32],
) -> usize {
    let whole = src.len() / 32;
    let (block, bytes) = (super::block(BITS), super::block_bytes(BITS));
    assert!(xq.len() >= src.len().div_ceil(block) * bytes && sums.len() >= (32 * whole).div_ceil(group));
    let magnitude = _mm256_set1_ps(-0.0);
    // packs interleave the halves of their inputs: this puts the 32 codes back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    // Per 16 bytes: the even ones, then the odd ones.
    let split = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
    );
    let out = xq.as_mut_ptr();
    for c in 0..whole {
        // SAFETY: block c's 32 values lie in `src` (c < whole).
        let p = src.as_ptr().add(32 * c);
        let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
        let a = v.map(|v| _mm256_andnot_ps(magnitude, v));
        let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let d = amax / 127.0;
        let inv = _mm256_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
        // Rounds to nearest even (the default rounding mode), as `nearest`.
        let q = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, inv)));
        let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let total = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256::<1>(total));
        let total = _mm_add_epi32(total, _mm_shuffle_epi32::<0b01_00_11_10>(total));
        let codes = _mm_cvtsi128_si32(_mm_add_epi32(total, _mm_shuffle_epi32::<0b10_11_00_01>(total)));
        // Codes of at most 127 in magnitude: the packs do not saturate.
        let packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let packed = _mm256_permutevar8x32_epi32(packed, order);
        let (b, o) = (32 * c / block, 32 * c % block);
        // SAFETY: block b of the row's layout lies in `xq` (asserted); the 32 codes fill bytes
        // o..o + 32 of it (8 bits), or bytes o / 2..o / 2 + 16 of its low and high nibbles' halves.
        if BITS == 8 {
            _mm256_storeu_si256(out.add(b * bytes + o) as *mut __m256i, packed);
        } else {
            let halves = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(packed, split));
            _mm_storeu_si128(out.add(b * bytes + o / 2) as *mut __m128i, _mm256_castsi256_si128(halves));
            _mm_storeu_si128(out.add(b * bytes + 64 + o / 2) as *mut __m128i, _mm256_extracti128_si256::<1>(halves));
        }
        scale.push(d);
        sums[32 * c / group] += d * codes as f32;
    }
    whole
}
