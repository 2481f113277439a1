//! Decode attention's two products over cached rows read where they lie: the scores `q_g · k_j`
//! and the weighted sum `Σ_j p_j v_j`, for rows of f32, f16 or bf16 at any offsets (a paged
//! sequence's rows are scattered over its blocks). Half-precision elements are widened as they
//! are loaded, which is exact, and every kernel adds in the order the f32 kernels add
//! (`simd::dot`, `simd::axpy`): so a row gives bit for bit what it gives widened and copied out
//! first, without the copy.

use half::{bf16, f16};

use super::simd::{isa, Isa};

/// The element types of cached keys and values.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    F32,
    F16,
    Bf16,
}

/// An element of cached keys and values.
pub(crate) trait KvElem: Copy + Send + Sync + 'static {
    const KIND: Kind;
    /// The value as f32 (exact).
    fn widen(self) -> f32;
}

impl KvElem for f32 {
    const KIND: Kind = Kind::F32;
    fn widen(self) -> f32 {
        self
    }
}

impl KvElem for f16 {
    const KIND: Kind = Kind::F16;
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

impl KvElem for bf16 {
    const KIND: Kind = Kind::Bf16;
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

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

/// `Σ a[i] * b[i]` with `simd::dot_scalar`'s eight partial sums (scalar reference).
pub(crate) fn dot_scalar<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i].widen();
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(x, y)| x * y.widen()).sum();
    acc.iter().sum::<f32>() + tail
}

/// `y[i] += a * x[i]` (scalar reference).
fn axpy_scalar<T: KvElem>(a: f32, x: &[T], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x.widen();
    }
}

/// `scores[g * n + j] = q_g · k_j` for the query rows `qs` (G x d) and the key rows of `keys`
/// at `starts` (n of them); prefetches the keys a few rows ahead and the value rows of `values`
/// (read next) at the same starts.
pub(crate) fn dots_rows<T: KvElem>(
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
        Isa::Scalar => {
            for (j, &s) in starts.iter().enumerate() {
                for (g, q) in qs.chunks_exact(d.max(1)).enumerate() {
                    scores[g * n + j] = dot_scalar(q, row(keys, s, d));
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        _ => {
            for (j, &s) in starts.iter().enumerate() {
                if let Some(&ahead) = starts.get(j + ROWS_AHEAD) {
                    prefetch_row(keys, ahead, d);
                }
                prefetch_row(values, s, d);
                let k = row(keys, s, d);
                for (g, q) in qs.chunks_exact(d.max(1)).enumerate() {
                    // SAFETY: `isa()` returns Avx2/Avx512 only after detecting avx2, fma and f16c;
                    // q and k both hold d elements.
                    scores[g * n + j] = unsafe { x86::dot(q, k) };
                }
            }
        }
    }
}

/// `out[g * d..][..d] = Σ_j p[g * n + j] v_j` for the value rows of `values` at `starts`.
pub(crate) fn weighted_rows<T: KvElem>(p: &[f32], values: &[T], starts: &[usize], d: usize, out: &mut [f32]) {
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
        Isa::Scalar => {
            for (g, o) in out.chunks_exact_mut(d.max(1)).enumerate() {
                o.iter_mut().for_each(|v| *v = 0.0);
                for (j, &s) in starts.iter().enumerate() {
                    axpy_scalar(p[g * n + j], row(values, s, d), o);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        _ => {
            for (g, o) in out.chunks_exact_mut(d.max(1)).enumerate() {
                o.iter_mut().for_each(|v| *v = 0.0);
                for (j, &s) in starts.iter().enumerate() {
                    // SAFETY: as in `dots_rows`; the row and `o` both hold d elements.
                    unsafe { x86::axpy(p[g * n + j], row(values, s, d), o) };
                }
            }
        }
    }
}

/// AVX2 forms of `simd::x86::dot` and `simd::x86::axpy` over f32, f16 or bf16 rows, adding in
/// the same order.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Kind, KvElem};
    use crate::backends::cpu::simd::x86::hsum;

    /// Eight elements at `p` as f32 lanes.
    ///
    /// # Safety
    /// The CPU must support avx2 and f16c; eight elements at `p` are readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8<T: KvElem>(p: *const T) -> __m256 {
        match T::KIND {
            Kind::F32 => _mm256_loadu_ps(p as *const f32),
            Kind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            Kind::Bf16 => {
                let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
            }
        }
    }

    /// # Safety
    /// The CPU must support avx2, fma and f16c; `a` and `b` have the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY (all loads below): every index read is < n, the length of both slices.
        while i + 32 <= n {
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8 * j)), load8(pb.add(i + 8 * j)), *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), load8(pb.add(i)), acc[0]);
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum(v);
        while i < n {
            s += *pa.add(i) * (*pb.add(i)).widen();
            i += 1;
        }
        s
    }

    /// # Safety
    /// The CPU must support avx2, fma and f16c; `x` and `y` have the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy<T: KvElem>(a: f32, x: &[T], y: &mut [f32]) {
        debug_assert_eq!(x.len(), y.len());
        let n = x.len();
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        // SAFETY (all accesses below): every index is < n, the length of both slices.
        while i + 8 <= n {
            _mm256_storeu_ps(py.add(i), _mm256_fmadd_ps(va, load8(px.add(i)), _mm256_loadu_ps(py.add(i))));
            i += 8;
        }
        while i < n {
            *py.add(i) += a * (*px.add(i)).widen();
            i += 1;
        }
    }
}

/// AVX-512 forms, for rows of a multiple of 16 elements.
#[cfg(target_arch = "x86_64")]
mod x512 {
    use std::arch::x86_64::*;

    use super::{prefetch_row, Kind, KvElem, ROWS_AHEAD};

    /// Sixteen elements at `p` as f32 lanes.
    ///
    /// # Safety
    /// The CPU must support avx512f; sixteen elements at `p` are readable.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16<T: KvElem>(p: *const T) -> __m512 {
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
    pub(super) unsafe fn dots_rows<T: KvElem>(
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
            if let Some(&ahead) = starts.get(j + ROWS_AHEAD) {
                prefetch_row(keys, ahead, d);
            }
            prefetch_row(values, s, d);
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
    pub(super) unsafe fn weighted_rows<const D16: usize, T: KvElem>(
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
    use super::*;
    use crate::backends::cpu::simd;
    use crate::backends::cpu::simd::tests::randoms;

    /// Rows at scattered starts of f32 data, and the same data as f16 and bf16 (rounded).
    fn data(len: usize, seed: u64) -> (Vec<f32>, Vec<f16>, Vec<bf16>) {
        let v = randoms(len, seed);
        (v.clone(), v.iter().map(|&x| f16::from_f32(x)).collect(), v.iter().map(|&x| bf16::from_f32(x)).collect())
    }

    fn widened<T: KvElem>(v: &[T]) -> Vec<f32> {
        v.iter().map(|x| x.widen()).collect()
    }

    /// The kernels over f16 and bf16 rows read in place give bit for bit what the f32 kernels
    /// give over the rows widened, and over f32 rows what `simd::dot` / `simd::axpy` give row
    /// by row (the kernels attention used before), at every row width the models use and a few
    /// others, rows in any order.
    #[test]
    fn rows_in_place_equal_rows_widened_bit_for_bit() {
        for (d, groups, n) in
            [(64usize, 3usize, 37usize), (128, 2, 5), (32, 4, 9), (48, 1, 1), (64, 1, 100), (80, 2, 20)]
        {
            let len = (n + 7) * d + 5;
            let (kf, kh, kb) = data(len, 2);
            let (vf, vh, vb) = data(len, 3);
            let qs = randoms(groups * d, 1);
            let p = randoms(groups * n, 4);
            // Scattered, out of order, some overlapping.
            let starts: Vec<usize> = (0..n).map(|j| ((j * 7 + 3) % (n + 7)) * d + (j % 3)).collect();
            let dots = |keys: &[f32], values: &[f32]| {
                let mut s = vec![0f32; groups * n];
                dots_rows(&qs, keys, values, &starts, d, &mut s);
                s
            };
            let weighted = |values: &[f32]| {
                let mut o = vec![0f32; groups * d];
                weighted_rows(&p, values, &starts, d, &mut o);
                o
            };
            // f32 rows: what attention computed before, row by row.
            let mut want = vec![0f32; groups * n];
            for (j, &s) in starts.iter().enumerate() {
                for g in 0..groups {
                    want[g * n + j] = simd::dot(&qs[g * d..(g + 1) * d], &kf[s..s + d]);
                }
            }
            if !matches!(isa(), Isa::Avx512) || !d.is_multiple_of(16) {
                assert_eq!(bits(&dots(&kf, &vf)), bits(&want), "f32 dots d {d}");
            }
            let mut want_w = vec![0f32; groups * d];
            for (g, o) in want_w.chunks_exact_mut(d).enumerate() {
                for (j, &s) in starts.iter().enumerate() {
                    simd::axpy(p[g * n + j], &vf[s..s + d], o);
                }
            }
            if !matches!(isa(), Isa::Avx512) || !(d == 64 || d == 128) {
                assert_eq!(bits(&weighted(&vf)), bits(&want_w), "f32 weighted d {d}");
            }
            // Half-precision rows: the f32 kernels over the rows widened.
            for (name, k, v) in [("f16", widened(&kh), widened(&vh)), ("bf16", widened(&kb), widened(&vb))] {
                let mut got = vec![0f32; groups * n];
                let mut got_w = vec![0f32; groups * d];
                if name == "f16" {
                    dots_rows(&qs, &kh, &vh, &starts, d, &mut got);
                    weighted_rows(&p, &vh, &starts, d, &mut got_w);
                } else {
                    dots_rows(&qs, &kb, &vb, &starts, d, &mut got);
                    weighted_rows(&p, &vb, &starts, d, &mut got_w);
                }
                assert_eq!(bits(&got), bits(&dots(&k, &v)), "{name} dots d {d}");
                assert_eq!(bits(&got_w), bits(&weighted(&v)), "{name} weighted d {d}");
            }
            // And every path against the scalar reference, to rounding.
            let mut reference = vec![0f32; groups * n];
            for (j, &s) in starts.iter().enumerate() {
                for g in 0..groups {
                    reference[g * n + j] = dot_scalar(&qs[g * d..(g + 1) * d], &kh[s..s + d]);
                }
            }
            let mut got = vec![0f32; groups * n];
            dots_rows(&qs, &kh, &vh, &starts, d, &mut got);
            for (x, y) in reference.iter().zip(&got) {
                assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "f16 dots d {d}: {x} vs {y}");
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }
}
