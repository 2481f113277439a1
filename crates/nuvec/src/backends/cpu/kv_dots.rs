//! Decode attention's two products over cached rows read where they lie: the scores `q_g · k_j`
//! and the weighted sum `Σ_j p_j v_j`, for rows of f32, f16 or bf16 at any offsets (a paged
//! sequence's rows are scattered over its blocks). Each row goes through `simd::dot` /
//! `simd::axpy`, which widen half-precision elements as they load them (exactly) and add in the
//! f32 order: so a row gives bit for bit what it gives widened and copied out first, without the
//! copy. AVX-512 has kernels of its own for rows of a multiple of 16.

use super::simd::{self, isa, Isa, RowElem};

/// Rows ahead of the one being read that [`dots_rows`] prefetches.
const ROWS_AHEAD: usize = 12;

/// The row of `d` elements of `data` starting at `start`.
fn row<T>(data: &[T], start: usize, d: usize) -> &[T] {
    &data[start..start + d]
}

/// Asks the CPU for the cache lines of the row at `start` (a hint: out of range reads nothing).
#[inline(always)]
fn prefetch_row<T>(data: &[T], start: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = d * std::mem::size_of::<T>();
        let base = data.as_ptr().wrapping_add(start) as *const i8;
        for line in (0..bytes).step_by(64) {
            // SAFETY: sse is part of the x86_64 baseline; a prefetch never dereferences its
            // address, and `wrapping_add` keeps an out-of-range one a valid pointer value.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(line)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, start, d);
}

/// Before reading row `j` of `starts`: the key row [`ROWS_AHEAD`] rows on and the value row
/// at the same start (read next, by [`weighted_rows`]).
#[inline(always)]
fn prefetch_for<T>(keys: &[T], values: &[T], starts: &[usize], j: usize, d: usize) {
    if let Some(&ahead) = starts.get(j + ROWS_AHEAD) {
        prefetch_row(keys, ahead, d);
    }
    prefetch_row(values, starts[j], d);
}

/// `scores[g * n + j] = q_g · k_j` for the query rows `qs` (G x d) and the key rows of `keys`
/// at `starts` (n of them); prefetches the keys a few rows ahead and the value rows of `values`
/// (read next) at the same starts.
pub(crate) fn dots_rows<T: RowElem>(
    qs: &[f32],
    keys: &[T],
    values: &[T],
    starts: &[usize],
    d: usize,
    scores: &mut [f32],
) {
    let (n, groups) = (starts.len(), qs.len() / d.max(1));
    assert!(scores.len() >= groups * n, "dots_rows: {} scores for {groups} x {n}", scores.len());
    assert!(starts.iter().all(|&s| s + d <= keys.len() && s + d <= values.len()), "dots_rows: a row past the data");
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returns Avx512 only after detecting avx512f (and avx2, fma, f16c) on
        // this CPU; every row is in range (asserted above), d a multiple of 16.
        Isa::Avx512 if d.is_multiple_of(16) && d > 0 => unsafe { x512::dots_rows(qs, keys, values, starts, d, scores) },
        _ => {
            for (j, &s) in starts.iter().enumerate() {
                prefetch_for(keys, values, starts, j, d);
                let k = row(keys, s, d);
                for (g, q) in qs.chunks_exact(d.max(1)).enumerate() {
                    scores[g * n + j] = simd::dot(q, k);
                }
            }
        }
    }
}

/// `out[g * d..][..d] = Σ_j p[g * n + j] v_j` for the value rows of `values` at `starts`.
pub(crate) fn weighted_rows<T: RowElem>(p: &[f32], values: &[T], starts: &[usize], d: usize, out: &mut [f32]) {
    let n = starts.len();
    let groups = out.len() / d.max(1);
    assert!(p.len() >= groups * n, "weighted_rows: {} weights for {groups} x {n}", p.len());
    assert!(starts.iter().all(|&s| s + d <= values.len()), "weighted_rows: a row past the data");
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returns Avx512 only after detecting avx512f on this CPU; rows in range.
        Isa::Avx512 if d == 64 => unsafe { x512::weighted_rows::<4, T>(p, values, starts, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512 if d == 128 => unsafe { x512::weighted_rows::<8, T>(p, values, starts, out) },
        _ => {
            for (g, o) in out.chunks_exact_mut(d.max(1)).enumerate() {
                o.iter_mut().for_each(|v| *v = 0.0);
                for (j, &s) in starts.iter().enumerate() {
                    simd::axpy(p[g * n + j], row(values, s, d), o);
                }
            }
        }
    }
}

/// AVX-512 forms, for rows of a multiple of 16 elements.
#[cfg(target_arch = "x86_64")]
mod x512 {
    use std::arch::x86_64::*;

    use super::{prefetch_for, RowElem};
    use crate::backends::cpu::simd::Kind;

    /// Sixteen elements at `p` as f32 lanes.
    ///
    /// # Safety
    /// The CPU must support avx512f; sixteen elements at `p` are readable.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16<T: RowElem>(p: *const T) -> __m512 {
        match T::KIND {
            Kind::F32 => _mm512_loadu_ps(p as *const f32),
            Kind::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
            Kind::Bf16 => {
                let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
            }
        }
    }

    /// See [`super::dots_rows`].
    ///
    /// # Safety
    /// The CPU must support avx512f; `d` is a multiple of 16, every row at `starts` lies inside
    /// `keys` and `values`, `scores` holds G x n floats.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dots_rows<T: RowElem>(
        qs: &[f32],
        keys: &[T],
        values: &[T],
        starts: &[usize],
        d: usize,
        scores: &mut [f32],
    ) {
        let (n, groups) = (starts.len(), qs.len() / d);
        let (pk, pq) = (keys.as_ptr(), qs.as_ptr());
        for (j, &s) in starts.iter().enumerate() {
            prefetch_for(keys, values, starts, j, d);
            for g in 0..groups {
                let mut acc = _mm512_setzero_ps();
                let mut c = 0;
                while c < d {
                    // SAFETY: the key row at s and row g of qs hold d elements (c + 16 <= d).
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(pq.add(g * d + c)), load16(pk.add(s + c)), acc);
                    c += 16;
                }
                scores[g * n + j] = _mm512_reduce_add_ps(acc);
            }
        }
    }

    /// See [`super::weighted_rows`], for rows of `16 * D16` elements.
    ///
    /// # Safety
    /// The CPU must support avx512f; every row at `starts` lies inside `values`, `p` holds G x n
    /// floats for G = out.len() / (16 D16).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weighted_rows<const D16: usize, T: RowElem>(
        p: &[f32],
        values: &[T],
        starts: &[usize],
        out: &mut [f32],
    ) {
        let d = 16 * D16;
        let (n, groups) = (starts.len(), out.len() / d);
        let pv = values.as_ptr();
        for g in 0..groups {
            let mut acc = [_mm512_setzero_ps(); D16];
            for (j, &s) in starts.iter().enumerate() {
                let w = _mm512_set1_ps(p[g * n + j]);
                for (c, a) in acc.iter_mut().enumerate() {
                    // SAFETY: the value row at s holds d = 16 D16 elements.
                    *a = _mm512_fmadd_ps(w, load16(pv.add(s + 16 * c)), *a);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                // SAFETY: row g of out holds d floats (groups = out.len() / d).
                _mm512_storeu_ps(out.as_mut_ptr().add(g * d + 16 * c), *a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;
    use crate::backends::cpu::simd::tests::randoms;
    use crate::backends::cpu::simd::{axpy_scalar, dot_scalar};

    fn widened<T: RowElem>(v: &[T]) -> Vec<f32> {
        v.iter().map(|x| x.widen()).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Both products over rows at `starts`: (scores, weighted sums).
    fn products<T: RowElem>(
        qs: &[f32],
        p: &[f32],
        keys: &[T],
        values: &[T],
        starts: &[usize],
        d: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let (groups, n) = (qs.len() / d, starts.len());
        let (mut scores, mut out) = (vec![0f32; groups * n], vec![0f32; groups * d]);
        dots_rows(qs, keys, values, starts, d, &mut scores);
        weighted_rows(p, values, starts, d, &mut out);
        (scores, out)
    }

    /// Half-precision rows read in place give bit for bit what the same rows widened to f32
    /// give, and every element type matches the scalar definition to rounding, at the row
    /// widths the models use and a few others, rows scattered, out of order and overlapping,
    /// on whichever ISA this CPU runs (and, under `NUVEC_CPU_ISA`, the capped ones).
    #[test]
    fn rows_in_place_equal_rows_widened_bit_for_bit() {
        for (d, groups, n) in
            [(64usize, 3usize, 37usize), (128, 2, 5), (32, 4, 9), (48, 1, 1), (64, 1, 100), (80, 2, 20)]
        {
            let len = (n + 7) * d + 5;
            let (kf, vf) = (randoms(len, 2), randoms(len, 3));
            let (qs, p) = (randoms(groups * d, 1), randoms(groups * n, 4));
            let starts: Vec<usize> = (0..n).map(|j| ((j * 7 + 3) % (n + 7)) * d + (j % 3)).collect();
            let kh: Vec<f16> = kf.iter().map(|&x| f16::from_f32(x)).collect();
            let vh: Vec<f16> = vf.iter().map(|&x| f16::from_f32(x)).collect();
            let kb: Vec<bf16> = kf.iter().map(|&x| bf16::from_f32(x)).collect();
            let vb: Vec<bf16> = vf.iter().map(|&x| bf16::from_f32(x)).collect();
            let cases = [
                ("f32", kf.clone(), vf.clone(), products(&qs, &p, &kf, &vf, &starts, d)),
                ("f16", widened(&kh), widened(&vh), products(&qs, &p, &kh, &vh, &starts, d)),
                ("bf16", widened(&kb), widened(&vb), products(&qs, &p, &kb, &vb, &starts, d)),
            ];
            for (name, k, v, (scores, out)) in &cases {
                let (wide_scores, wide_out) = products(&qs, &p, &k[..], &v[..], &starts, d);
                assert_eq!(bits(scores), bits(&wide_scores), "{name} dots d {d}");
                assert_eq!(bits(out), bits(&wide_out), "{name} weighted d {d}");
                for (j, &s) in starts.iter().enumerate() {
                    for g in 0..groups {
                        let want = dot_scalar(&qs[g * d..(g + 1) * d], &k[s..s + d]);
                        let got = scores[g * n + j];
                        assert!((want - got).abs() <= 1e-5 * (1.0 + want.abs()), "{name} dots d {d}: {got} vs {want}");
                    }
                }
                for g in 0..groups {
                    let mut want = vec![0f32; d];
                    for (j, &s) in starts.iter().enumerate() {
                        axpy_scalar(p[g * n + j], &v[s..s + d], &mut want);
                    }
                    for (x, y) in want.iter().zip(&out[g * d..(g + 1) * d]) {
                        assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "{name} weighted d {d}: {y} vs {x}");
                    }
                }
            }
        }
    }
}
