//! Products of 4- and 8-bit affine weights with the input quantized to int8, llama.cpp's
//! arithmetic for its Q4_1 / Q8_0 dot products (`x ≈ d_b · xq`, one scale `d_b = max|x| / 127`
//! per 32 values, `xq` rounded to nearest). On AVX-512 VNNI ([`x512`]) `vpdpbusd` multiplies 64
//! unsigned weight codes by 64 signed input bytes and adds them four by four into 16 int32 lanes,
//! one instruction where the f32 kernel ([`super::qgemv::x512`]) spends three per 16 weights; on
//! AVX2 ([`avx2`]) `vpmaddubsw` and `vpmaddwd` do the same for 32 codes, two instructions where
//! the f32 kernel ([`super::qgemv::x86`]) widens each weight to a float and spends an FMA on it.
//!
//! The products are of the weights with the quantized input `x̂ = d_b · xq`, bias terms included:
//! per group `g`, `Σ_k w_k x̂_k = scale_g · Σ_k q_k x̂_k + bias_g · Σ_k x̂_k`, the second sum taken
//! over `x̂`, as llama.cpp's Q8_1 blocks carry it. (With the exact `Σ_k x_k` there instead, the
//! rounding errors `x̂_k − x_k` would meet `scale_g q_k`, which is never negative, rather than
//! `w_k`, which is centred: for an 8-bit weight, whose bias is about `−128 · scale`, several
//! times the error.) So a row's error is `Σ_k w_k (x̂_k − x_k)`, at most `Σ_k |w_k| d_b / 2`
//! (what the tests hold the kernels to, beside the int8 arithmetic itself).
//! Off unless `NUVEC_CPU_INT8_DOT=1` or [`super::set_int8_activations`] (issue 28: an approximate
//! path stays opt-in). One input row ([`super::qgemv`]'s products) or a few (batched decode,
//! [`super::qbatch`]'s).

use std::sync::atomic::{AtomicU8, Ordering};

#[cfg(target_arch = "x86_64")]
use super::qgemv::QMatrix;
use super::simd::Isa;

/// Values sharing one input scale.
pub(crate) const QBLOCK: usize = 32;

/// 0: not decided yet (the knob decides at the first product), 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Whether the path is on: [`set`], else the CPU's `NUVEC_CPU_INT8_DOT=1` (its setting, else the
/// environment's), and the processor runs it ([`supported`]).
pub(crate) fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        0 => set(crate::tuning::setting("NUVEC_CPU_INT8_DOT", crate::Device::Cpu).is_ok_and(|v| v == "1")),
        s => s == 2,
    }
}

/// Turns the path on or off for the products that follow; returns whether it is on (never where
/// the processor lacks the instructions).
pub(crate) fn set(on: bool) -> bool {
    let on = on && supported();
    STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
    on
}

/// Whether this processor has the instructions some kernel needs (AVX2, FMA and F16C; AVX-512
/// VNNI for [`x512`]).
pub(crate) fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether this processor runs [`x512`] (AVX-512 F/BW/VL with VNNI).
#[cfg(target_arch = "x86_64")]
fn vnni() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Whether the kernels take this width and group size: a lane's 4 or 8 weights lie in one group
/// and one input block of 32.
pub(crate) fn takes(bits: usize, group: usize) -> bool {
    (bits == 4 || bits == 8) && matches!(group, 32 | 64 | 128)
}

/// Whether a product of this width and group, under `isa`, runs here: the path is on and the
/// kernels take it (AVX-512 under VNNI, else AVX2).
pub(crate) fn runs(isa: Isa, bits: usize, group: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa != Isa::Scalar && takes(bits, group) && enabled()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, bits, group);
        false
    }
}

/// [`x512::q_rows`] where `isa` is AVX-512 and the processor has VNNI, else [`avx2::q_rows`];
/// `params` is scratch of [`avx2::params_len`] floats.
///
/// # Safety
/// [`runs`] held for `isa` and `w`'s width and group when `xs` was prepared from an `x` of
/// `w.cols` values; rows `r0..r0 + out.len()` exist in `w`.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn q_rows(isa: Isa, w: &QMatrix, r0: usize, xs: &Int8X, params: &mut [f32], out: &mut [f32]) {
    if isa == Isa::Avx512 && vnni() {
        x512::q_rows(w, r0, xs, out)
    } else {
        avx2::q_rows(w, r0, xs, params, out)
    }
}

/// [`x512::rows`] or [`avx2::rows`], as [`q_rows`] chooses.
///
/// # Safety
/// As [`q_rows`], with `xs` prepared from `m` rows.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn rows(isa: Isa, w: &QMatrix, r0: usize, m: usize, xs: &Int8X, params: &mut [f32], out: &mut [f32]) {
    if isa == Isa::Avx512 && vnni() {
        x512::rows(w, r0, m, xs, out)
    } else {
        avx2::rows(w, r0, m, xs, params, out)
    }
}

/// Weights per 64-byte load: 16 lanes of `32 / bits`.
fn block(bits: usize) -> usize {
    16 * 32 / bits
}

/// Bytes of the prepared input per block: 4 bits, one 64-byte register per nibble.
fn block_bytes(bits: usize) -> usize {
    if bits == 4 {
        128
    } else {
        64
    }
}

/// The input as the kernels read it, for one width: [`Int8X::prepare`] lays out one row,
/// [`Int8X::prepare_rows`] several, each `blocks` blocks long.
pub(crate) struct Int8X {
    /// Per row and block of [`block`] values: 4 bits, 64 bytes meeting the low nibbles (lane `i`,
    /// byte `t`: `xq[k0 + 8 i + 2 t]`) then 64 meeting the high ones (`xq[k0 + 8 i + 2 t + 1]`);
    /// 8 bits, the 64 values in order. Zero past the row's end.
    pub xq: Vec<i8>,
    /// Per row and block, lane `i`'s input scale (the scale of the 32 values its weights meet).
    pub lane_scale: Vec<f32>,
    /// Per row, the group sums of `x̂` (the bias terms meet them).
    pub sums: Vec<f32>,
    /// Blocks per row.
    pub blocks: usize,
    /// Scratch: the current 32 values' scales.
    scale: Vec<f32>,
}

impl Int8X {
    pub(crate) const fn new() -> Self {
        Int8X { xq: Vec::new(), lane_scale: Vec::new(), sums: Vec::new(), blocks: 0, scale: Vec::new() }
    }

    /// Quantizes `x` (one row) and lays it out for `bits`-wide weights in groups of `group`.
    pub(crate) fn prepare(&mut self, x: &[f32], group: usize, bits: usize) {
        self.prepare_rows(x, x.len(), group, bits);
    }

    /// Quantizes the rows of `x` (`k` values each) for `bits`-wide weights in groups of `group`,
    /// with each row's group sums of `x̂`.
    pub(crate) fn prepare_rows(&mut self, x: &[f32], k: usize, group: usize, bits: usize) {
        if bits == 4 {
            self.lay_out::<4>(x, k, group, true)
        } else {
            self.lay_out::<8>(x, k, group, true)
        }
    }

    /// [`Int8X::prepare_rows`] without SIMD (the reference the tests hold the SIMD form to).
    #[cfg(test)]
    fn lay_out_scalar(&mut self, x: &[f32], k: usize, group: usize, bits: usize) {
        if bits == 4 {
            self.lay_out::<4>(x, k, group, false)
        } else {
            self.lay_out::<8>(x, k, group, false)
        }
    }

    fn lay_out<const BITS: usize>(&mut self, x: &[f32], k: usize, group: usize, simd: bool) {
        let (per_lane, block, bytes) = (32 / BITS, block(BITS), block_bytes(BITS));
        let rows = x.len().checked_div(k).unwrap_or(0);
        self.blocks = k.div_ceil(block);
        self.xq.clear();
        self.xq.resize(rows * self.blocks * bytes, 0);
        self.lane_scale.clear();
        self.lane_scale.resize(rows * self.blocks * 16, 0.0);
        self.sums.clear();
        let simd = simd && supported();
        for (row, src) in x.chunks_exact(k.max(1)).enumerate() {
            self.scale.clear();
            let xq = &mut self.xq[row * self.blocks * bytes..(row + 1) * self.blocks * bytes];
            // A group holds whole blocks of 32 (groups of 32+), so each block adds to one sum.
            let first_sum = self.sums.len();
            self.sums.resize(first_sum + k.div_ceil(group), 0.0);
            let done = if simd {
                simd_blocks::<BITS>(src, group, xq, &mut self.scale, &mut self.sums[first_sum..])
            } else {
                0
            };
            for (c, chunk) in src.chunks(QBLOCK).enumerate().skip(done) {
                let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                self.scale.push(d);
                let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                let mut codes = 0i32;
                for (j, &v) in chunk.iter().enumerate() {
                    let (kk, q) = (c * QBLOCK + j, nearest(v * inv));
                    codes += q as i32;
                    let (b, o) = (kk / block, kk % block);
                    // 4 bits: lane o / 8, its byte (o % 8) / 2, in the low or the high nibbles' half.
                    let at = if BITS == 4 { 64 * (o % 2) + 4 * (o / 8) + (o % 8) / 2 } else { o };
                    xq[b * bytes + at] = q;
                }
                self.sums[first_sum + c * QBLOCK / group] += d * codes as f32;
            }
            let lanes = &mut self.lane_scale[row * self.blocks * 16..(row + 1) * self.blocks * 16];
            for (l, d) in lanes.iter_mut().enumerate() {
                let first = (l / 16) * block + per_lane * (l % 16);
                *d = self.scale.get(first / QBLOCK).copied().unwrap_or(0.0);
            }
        }
    }
}

/// [`avx2::quantize_row`] where this processor runs it ([`supported`]; the caller checked),
/// else no block: how many of `src`'s blocks of 32 it quantized.
fn simd_blocks<const BITS: usize>(
    src: &[f32],
    group: usize,
    xq: &mut [i8],
    scale: &mut Vec<f32>,
    sums: &mut [f32],
) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller found avx2, fma and f16c (`supported`).
        unsafe { avx2::quantize_row::<BITS>(src, group, xq, scale, sums) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (src, group, xq, scale, sums);
        0
    }
}

/// `v` (within ±127.5) rounded to the nearest integer, ties to even: adding and taking away
/// 1.5 · 2^23 leaves no fraction bits (as `vroundps` would; `f32::round` is a libm call here).
fn nearest(v: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    ((v + MAGIC) - MAGIC) as i8
}

/// `out[j * m + i]` (`out.len() / m` weight rows against `m` input rows) in passes of one weight
/// row and up to `tile` (at most 8) input rows: `pass(j, i, those rows' group sums of x̂ (`g`
/// each), the pass's outputs)`.
#[cfg(target_arch = "x86_64")]
fn by_tiles(
    m: usize,
    g: usize,
    tile: usize,
    sums: &[f32],
    out: &mut [f32],
    mut pass: impl FnMut(usize, usize, &[f32], &mut [f32]),
) {
    let mut buf = [0f32; 8];
    for j in 0..out.len() / m {
        let mut i = 0;
        while i < m {
            let t = (m - i).min(tile);
            pass(j, i, &sums[i * g..(i + t) * g], &mut buf[..t]);
            out[j * m + i..j * m + i + t].copy_from_slice(&buf[..t]);
            i += t;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

/// AVX-512 VNNI kernels, one weight row per pass: with the arithmetic this cheap the weights'
/// reads set the pace, and a matrix read row after row is one stream the hardware prefetcher
/// follows, where four rows at a time (the f32 one-row kernels' passes) are four short ones.
/// Several input rows share each weight row's loads and nibble split.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x512 {
    use std::arch::x86_64::*;

    use super::super::qgemv::x512::params16;
    use super::super::qgemv::QMatrix;
    use super::Int8X;

    /// How many rows ahead the kernels prefetch the packed weights (as the f32 kernels do).
    const PF_ROWS: usize = 8;
    /// Input rows one pass over a weight row takes (one register of sums each, plus the bias
    /// sums').
    pub(crate) const TILE: usize = 8;

    /// `out[i] ≈ Σ_k w[r0 + i, k] x[k]` for a 4-bit or 8-bit matrix, `xs` prepared from one row
    /// `x` for the matrix's width and groups ([`Int8X::prepare`]).
    ///
    /// # Safety
    /// avx512f/bw/vl/vnni and f16c must be available ([`super::supported`]); [`super::takes`]
    /// holds for `w`, `xs` was prepared from an `x` of `w.cols` values for `w.bits` in groups of
    /// `w.group`, and rows `r0..r0 + out.len()` exist in `w`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub(crate) unsafe fn q_rows(w: &QMatrix, r0: usize, xs: &Int8X, out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            let mut v = [0f32];
            // SAFETY: forwarded contract; row r0 + i exists.
            tile_of::<1>(w, r0 + i, xs, 0, &xs.sums, &mut v);
            *o = v[0];
        }
    }

    /// `out[j * m + i] ≈ Σ_k w[r0 + j, k] x[i][k]` for `nr = out.len() / m` weight rows from
    /// `r0` and the `m` input rows `xs` was prepared from ([`Int8X::prepare_rows`]), in tiles of
    /// up to [`TILE`] input rows per pass over a weight row.
    ///
    /// # Safety
    /// As [`q_rows`], with `xs` prepared from `m` rows of `w.cols` values in groups of `w.group`
    /// for `w.bits`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub(crate) unsafe fn rows(w: &QMatrix, r0: usize, m: usize, xs: &Int8X, out: &mut [f32]) {
        let g = w.groups();
        assert!(m > 0 && out.len().is_multiple_of(m) && xs.sums.len() == m * g);
        super::by_tiles(m, g, TILE, &xs.sums, out, |j, i, sums, o| {
            // SAFETY: forwarded contract; row r0 + j exists, input rows i..i + o.len() are
            // prepared.
            match o.len() {
                1 => tile_of::<1>(w, r0 + j, xs, i, sums, o),
                2 => tile_of::<2>(w, r0 + j, xs, i, sums, o),
                3 => tile_of::<3>(w, r0 + j, xs, i, sums, o),
                4 => tile_of::<4>(w, r0 + j, xs, i, sums, o),
                5 => tile_of::<5>(w, r0 + j, xs, i, sums, o),
                6 => tile_of::<6>(w, r0 + j, xs, i, sums, o),
                7 => tile_of::<7>(w, r0 + j, xs, i, sums, o),
                _ => tile_of::<8>(w, r0 + j, xs, i, sums, o),
            }
        });
    }

    /// [`q_tile`] for the matrix's width.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    unsafe fn tile_of<const M: usize>(w: &QMatrix, r: usize, xs: &Int8X, i0: usize, sums: &[f32], out: &mut [f32]) {
        // SAFETY: forwarded contract.
        if w.bits == 4 {
            q_tile::<4, M>(w, r, xs, i0, sums, out)
        } else {
            q_tile::<8, M>(w, r, xs, i0, sums, out)
        }
    }

    /// Weight row `r` against the `M` prepared input rows from `i0` (`sums`: their group sums of
    /// `x̂`, row after row). Per 64-byte load of the row, lane `l` of input row `i` sums its weights'
    /// codes times their input bytes in int32 (two `vpdpbusd` at 4 bits, one per nibble; one at
    /// 8), then the sum, as f32, meets the lane's group scale times its input scale.
    #[inline]
    #[allow(clippy::needless_range_loop)] // input rows index several register arrays in step
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    unsafe fn q_tile<const BITS: usize, const M: usize>(
        w: &QMatrix,
        r: usize,
        xs: &Int8X,
        i0: usize,
        sums: &[f32],
        out: &mut [f32],
    ) {
        let per_lane = 32 / BITS;
        let block = super::block(BITS);
        let x_bytes = super::block_bytes(BITS);
        let (cols, group) = (w.cols, w.group);
        let (g_total, rb) = (w.groups(), w.row_bytes());
        assert!(w.bits == BITS && super::takes(BITS, group) && cols == g_total * group);
        let blocks = cols.div_ceil(block);
        assert!(xs.blocks == blocks && xs.xq.len() >= (i0 + M) * blocks * x_bytes);
        assert!(xs.lane_scale.len() >= (i0 + M) * blocks * 16 && sums.len() == M * g_total && out.len() == M);
        assert!((r + 1) * rb <= w.packed.len());
        let shift = _mm512_set1_epi32(group.trailing_zeros() as i32);
        let lane_first = _mm512_mullo_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32(per_lane as i32),
        );
        let nibble = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); M];
        let mut bacc = [_mm512_setzero_ps(); M];
        let pb = w.packed.as_ptr().add(r * rb);
        let px = xs.xq.as_ptr().add(i0 * blocks * x_bytes);
        let pd = xs.lane_scale.as_ptr().add(i0 * blocks * 16);
        let mut g0 = 0;
        while g0 < g_total {
            let gn = (g_total - g0).min(16);
            let gmask: __mmask16 = if gn >= 16 { 0xffff } else { (1u16 << gn) - 1 };
            // SAFETY: groups g0..g0 + gn of row r exist (the row exists).
            let sv = params16(w.scales, r * g_total + g0, gn);
            let bv = params16(w.biases, r * g_total + g0, gn);
            for i in 0..M {
                // SAFETY: the mask limits the load to input row i's sums g0..g0 + gn.
                let sumv = _mm512_maskz_loadu_ps(gmask, sums.as_ptr().add(i * g_total + g0));
                bacc[i] = _mm512_fmadd_ps(bv, sumv, bacc[i]);
            }
            // 16 groups of 32+ hold whole blocks (128 or 64 values), so no block straddles two
            // runs of g0.
            let k_end = (g0 + gn) * group;
            let mut k0 = g0 * group;
            while k0 < k_end {
                let b = k0 / block;
                let idx = _mm512_sub_epi32(
                    _mm512_srlv_epi32(_mm512_add_epi32(_mm512_set1_epi32(k0 as i32), lane_first), shift),
                    _mm512_set1_epi32(g0 as i32),
                );
                let scale = _mm512_permutexvar_ps(idx, sv);
                let bytes = (k_end - k0).min(block) * BITS / 8;
                let lmask: __mmask16 = if bytes >= 64 { 0xffff } else { (1u16 << (bytes / 4)) - 1 };
                let ahead = pb.wrapping_add(PF_ROWS * rb + k0 * BITS / 8);
                _mm_prefetch::<_MM_HINT_NTA>(ahead as *const i8);
                // SAFETY: the mask limits the load to the row's bytes k0 * BITS / 8 .. + bytes,
                // inside row r.
                let v = _mm512_maskz_loadu_epi32(lmask, pb.add(k0 * BITS / 8) as *const i32);
                let (lo, hi) = if BITS == 4 {
                    (_mm512_and_si512(v, nibble), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble))
                } else {
                    (v, _mm512_setzero_si512())
                };
                for i in 0..M {
                    // SAFETY: block b of input row i0 + i exists (b < blocks, asserted sizes).
                    let xb = px.add((i * blocks + b) * x_bytes);
                    let s = if BITS == 4 {
                        let x_lo = _mm512_loadu_si512(xb as *const __m512i);
                        let x_hi = _mm512_loadu_si512(xb.add(64) as *const __m512i);
                        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x_lo), hi, x_hi)
                    } else {
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xb as *const __m512i))
                    };
                    let dx = _mm512_loadu_ps(pd.add((i * blocks + b) * 16));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scale, dx), acc[i]);
                }
                k0 += block;
            }
            g0 += gn;
        }
        for i in 0..M {
            out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i], bacc[i]));
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::qgemv::test_weights::Weights;
    use super::super::qgemv::{row_reference, Params, QMatrix};
    use super::*;

    /// The bound of the module doc for row `r`, plus f32 rounding of the exact product's terms.
    fn bound(w: &QMatrix, r: usize, x: &[f32]) -> f64 {
        let mut row = vec![0f32; w.cols];
        let mut params = vec![0f32; 2 * w.groups()];
        w.dequantize_row(r, &mut row, &mut params);
        let mut total = 0f64;
        let mut magnitude = 0f64;
        for (k, (&wk, &xk)) in row.iter().zip(x).enumerate() {
            let amax = x[k / QBLOCK * QBLOCK..((k / QBLOCK + 1) * QBLOCK).min(x.len())]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            total += wk.abs() as f64 * (amax / 127.0) as f64 / 2.0;
            magnitude += (wk * xk).abs() as f64;
        }
        total * (1.0 + 1e-3) + magnitude * 1e-5
    }

    /// The int8 arithmetic itself, in f64: `x` quantized as [`Int8X`] does, each weight times
    /// its input's `d_b · xq`. The kernels must give this up to f32 accumulation (the tolerance it
    /// returns), whatever `x`'s scales per 32 values.
    fn emulated(w: &QMatrix, r: usize, x: &[f32]) -> (f64, f64) {
        let mut row = vec![0f32; w.cols];
        let mut params = vec![0f32; 2 * w.groups()];
        w.dequantize_row(r, &mut row, &mut params);
        let (mut total, mut magnitude) = (0f64, 0f64);
        for (c, chunk) in x.chunks(QBLOCK).enumerate() {
            let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            for (j, &v) in chunk.iter().enumerate() {
                let term = row[c * QBLOCK + j] as f64 * d as f64 * nearest(v * inv) as f64;
                total += term;
                magnitude += term.abs();
            }
        }
        (total, magnitude * 1e-5 + 1e-6)
    }

    /// An input whose 32-value blocks differ in scale (1 to 32) and one of which holds an
    /// outlier 40 times its neighbours, as decoder activations do.
    fn input(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let v = (((i + seed) * 37 % 101) as f32 - 50.0) / 17.0;
                let spike = if i % 97 == 5 { 40.0 } else { 1.0 };
                v * (1 << ((i / QBLOCK + seed) % 6)) as f32 * spike
            })
            .collect()
    }

    /// Each output against the emulated int8 arithmetic (tight) and the exact product (within
    /// the bound).
    fn holds(w: &QMatrix, r: usize, x: &[f32], o: f32, what: &str) {
        let (want, tol) = emulated(w, r, x);
        assert!((o as f64 - want).abs() <= tol, "{what}: {o} vs the int8 arithmetic's {want} (tolerance {tol})");
        let (exact, b) = (row_reference(w, r, x), bound(w, r, x));
        assert!((o as f64 - exact).abs() <= b, "{what}: {o} vs {exact} exactly (bound {b})");
    }

    /// The instruction sets whose int8 kernels run here: AVX2's, and AVX-512's where VNNI is.
    fn kernels() -> Vec<Isa> {
        let mut isas = Vec::new();
        if supported() {
            isas.push(Isa::Avx2);
        } else {
            eprintln!("no AVX2 here: the int8 kernels are not run");
        }
        if vnni() {
            isas.push(Isa::Avx512);
        }
        isas
    }

    fn check(bits: usize, group: usize, cols: usize, rows_n: usize, kind: u8) {
        for isa in kernels() {
            check_on(isa, bits, group, cols, rows_n, kind);
        }
    }

    fn check_on(isa: Isa, bits: usize, group: usize, cols: usize, rows_n: usize, kind: u8) {
        let weights = Weights::new(bits, group, cols, rows_n, 7 + bits as u64 + cols as u64);
        let w = weights.matrix(kind);
        let x = input(cols, 0);
        let mut xs = Int8X::new();
        xs.prepare(&x, group, bits);
        for r0 in [0, 1] {
            let mut out = vec![0f32; rows_n - r0];
            // SAFETY: kernels() checked the features; the shapes are the kernel's contract.
            unsafe { q_rows(isa, &w, r0, &xs, &mut vec![0.0; avx2::params_len(&w)], &mut out) }
            for (i, &o) in out.iter().enumerate() {
                let r = r0 + i;
                holds(&w, r, &x, o, &format!("{isa:?} bits {bits} group {group} cols {cols} kind {kind} row {r}"));
            }
        }
    }

    #[test]
    fn int8_products_within_the_quantization_bound() {
        for kind in 0..3 {
            for &(bits, group, cols) in &[
                (4, 32, 576),
                (4, 64, 576),
                (4, 128, 1536),
                (4, 32, 1536),
                (4, 64, 96 * 64),
                (4, 32, 32 * 3),
                (8, 32, 576),
                (8, 64, 1536),
                (8, 128, 384),
                (8, 32, 32 * 5),
            ] {
                check(bits, group, cols, 11, kind);
            }
        }
    }

    /// `m` input rows through [`rows`], against each row's exact product and bound.
    fn check_rows(bits: usize, group: usize, cols: usize, n: usize, m: usize, kind: u8) {
        for isa in kernels() {
            check_rows_on(isa, bits, group, cols, n, m, kind);
        }
    }

    fn check_rows_on(isa: Isa, bits: usize, group: usize, cols: usize, n: usize, m: usize, kind: u8) {
        let weights = Weights::new(bits, group, cols, n, 3 + m as u64);
        let w = weights.matrix(kind);
        let x: Vec<f32> = (0..m).flat_map(|i| input(cols, 3 * i + 1)).collect();
        let mut xs = Int8X::new();
        xs.prepare_rows(&x, cols, group, bits);
        for nr in [1, 3, 6] {
            let mut out = vec![0f32; nr * m];
            // SAFETY: kernels() checked the features; the shapes are the kernel's contract.
            unsafe { rows(isa, &w, n - nr, m, &xs, &mut vec![0.0; avx2::params_len(&w)], &mut out) };
            for (ji, &o) in out.iter().enumerate() {
                let (r, xi) = (n - nr + ji / m, &x[(ji % m) * cols..(ji % m + 1) * cols]);
                let what = format!("{isa:?} bits {bits} group {group} cols {cols} m {m} row {r} input {}", ji % m);
                holds(&w, r, xi, o, &what);
            }
        }
    }

    #[test]
    fn int8_rows_within_the_quantization_bound() {
        for m in [1, 2, 3, 4, 5, 7, 8, 9, 17] {
            check_rows(4, 32, 576, 8, m, (m % 3) as u8);
            check_rows(4, 64, 1536, 8, m, 1);
            check_rows(8, 32, 576, 8, m, 2);
            check_rows(8, 128, 384, 8, m, 0);
        }
    }

    /// Codes at both ends of their range against inputs at both ends of theirs, so that every
    /// pair of products the AVX2 kernels add in 16 bits is as large as it can be (7,620 at 4 bits,
    /// 32,512 at 8 once the codes are taken as `q - 128`): no sum saturates.
    #[test]
    fn extreme_codes_do_not_saturate() {
        for &bits in &[4usize, 8] {
            let (group, cols) = (32, 256);
            let x: Vec<f32> = (0..cols).map(|i| if (i / 3) % 2 == 0 { -1.0 } else { 1.0 }).collect();
            let mut xs = Int8X::new();
            xs.prepare(&x, group, bits);
            for byte in [0x00u8, 0xff, 0x0f, 0xf0] {
                let packed = vec![byte; 2 * cols * bits / 8];
                let (scales, biases) = (vec![0.5f32; 2 * cols / group], vec![-0.25f32; 2 * cols / group]);
                let w = QMatrix {
                    packed: &packed,
                    scales: Params::F32(&scales),
                    biases: Params::F32(&biases),
                    bits,
                    group,
                    cols,
                };
                for isa in kernels() {
                    let mut out = [0f32; 2];
                    // SAFETY: kernels() checked the features; two rows of `cols` exist.
                    unsafe { q_rows(isa, &w, 0, &xs, &mut vec![0.0; avx2::params_len(&w)], &mut out) };
                    for (r, &o) in out.iter().enumerate() {
                        let exact = row_reference(&w, r, &x);
                        assert!(
                            (o as f64 - exact).abs() < 1e-3,
                            "{isa:?} {bits} bits, bytes {byte:#x}: {o} vs {exact}"
                        );
                    }
                }
            }
        }
    }

    /// The AVX2 quantizer gives the scalar one's layout, scales and sums bit for bit.
    #[test]
    fn simd_quantization_is_the_scalar_one() {
        if !supported() {
            return;
        }
        for &(bits, group, k) in &[(4usize, 32usize, 576usize), (4, 64, 1536), (4, 128, 160), (8, 32, 576), (8, 64, 96)]
        {
            let x: Vec<f32> = (0..3).flat_map(|i| input(k, i)).collect();
            let mut zeros = x.clone();
            zeros[..40].iter_mut().for_each(|v| *v = 0.0);
            for x in [x, zeros] {
                let mut simd = Int8X::new();
                simd.prepare_rows(&x, k, group, bits);
                let mut scalar = Int8X::new();
                scalar.lay_out_scalar(&x, k, group, bits);
                assert_eq!(simd.xq, scalar.xq, "{bits} bits, group {group}, {k} values");
                assert_eq!(simd.lane_scale, scalar.lane_scale);
                assert_eq!(
                    simd.sums.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    scalar.sums.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn the_input_is_laid_out_per_lane() {
        let x: Vec<f32> = (0..160).map(|i| i as f32 - 80.0).collect();
        let mut xs = Int8X::new();
        xs.prepare(&x, 32, 4);
        // 160 values pad to two blocks of 128; block 0 lane 1 byte 2 (lo) is xq[8 + 4] = x[12].
        assert_eq!(xs.xq.len(), 256);
        let d0 = 80.0 / 127.0;
        assert_eq!(xs.xq[4 + 2], (x[12] / d0).round() as i8);
        assert_eq!(xs.xq[64 + 4 + 2], (x[13] / d0).round() as i8);
        assert_eq!((nearest(2.5), nearest(-2.5), nearest(3.5), nearest(-127.4), nearest(0.49)), (2, -2, 4, -127, 0));
        // Past the input: zeros, and zero scales.
        let block1 = &xs.xq[128..];
        assert!(block1[16..64].iter().chain(&block1[64 + 16..]).all(|&q| q == 0));
        assert!(xs.lane_scale[16 + 4..].iter().all(|&d| d == 0.0));
        // The group sums are of x̂: group 1 (x[32..64]) is -48..-17 quantized.
        let (d1, sum1) = (48.0 / 127.0, (32..64).map(|i| ((i as f32 - 80.0) * 127.0 / 48.0).round()).sum::<f32>());
        assert!((xs.sums[1] - d1 * sum1).abs() < 1e-4, "{} vs {}", xs.sums[1], d1 * sum1);
        xs.prepare(&x, 32, 8);
        assert_eq!((xs.xq.len(), xs.lane_scale.len()), (192, 48));
        assert_eq!(xs.lane_scale[8], (x[32..64].iter().fold(0f32, |m, v| m.max(v.abs()))) / 127.0);
        assert!(takes(4, 32) && takes(8, 128) && !takes(4, 16) && !takes(3, 32));
    }
}
