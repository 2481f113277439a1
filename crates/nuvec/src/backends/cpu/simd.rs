//! Run-time CPU feature dispatch and the small vector primitives (dot, axpy) the kernels share.
//!
//! Every SIMD function here has a scalar twin that is the reference in the unit tests; the
//! dispatching wrappers pick the widest instruction set the CPU reports, once per process.
//! `NUVEC_CPU_ISA=scalar` forces the scalar paths (for comparisons and debugging).

use std::sync::OnceLock;

/// The instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Plain Rust (auto-vectorized at the build's baseline).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// The instruction set chosen for this process.
pub(crate) fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("NUVEC_CPU_ISA").is_ok_and(|v| v == "scalar") {
            return Isa::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            return Isa::Avx2;
        }
        Isa::Scalar
    })
}

/// `Σ a[i] * b[i]` (scalar reference; eight partial sums).
pub(crate) fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `Σ a[i] * b[i]` over the shorter length.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returned Avx2 only after detecting avx2, fma and f16c on this CPU.
        Isa::Avx2 => unsafe { x86::dot(&a[..n], &b[..n]) },
        Isa::Scalar => dot_scalar(&a[..n], &b[..n]),
    }
}

/// `y[i] += a * x[i]` (scalar reference).
pub(crate) fn axpy_scalar(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `y[i] += a * x[i]` over the shorter length.
#[inline]
pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returned Avx2 only after detecting avx2, fma and f16c on this CPU.
        Isa::Avx2 => unsafe { x86::axpy(a, &x[..n], &mut y[..n]) },
        Isa::Scalar => axpy_scalar(a, &x[..n], &mut y[..n]),
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// Sum of the eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// The CPU must support avx2 and fma; `a` and `b` have the same length.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY (all loads below): every index read is < n, the length of both slices.
        while i + 32 <= n {
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8 * j)), _mm256_loadu_ps(pb.add(i + 8 * j)), *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc[0]);
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum(v);
        while i < n {
            s += *pa.add(i) * *pb.add(i);
            i += 1;
        }
        s
    }

    /// # Safety
    /// The CPU must support avx2 and fma; `x` and `y` have the same length.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        debug_assert_eq!(x.len(), y.len());
        let n = x.len();
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        // SAFETY (all accesses below): every index is < n, the length of both slices.
        while i + 8 <= n {
            _mm256_storeu_ps(py.add(i), _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i))));
            i += 8;
        }
        while i < n {
            *py.add(i) += a * *px.add(i);
            i += 1;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic pseudo-random floats in [-1, 1).
    pub(crate) fn randoms(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn simd_dot_and_axpy_match_scalar() {
        for n in [0usize, 1, 7, 8, 31, 32, 33, 64, 100, 577] {
            let (a, b) = (randoms(n, 1), randoms(n, 2));
            let want = dot_scalar(&a, &b);
            assert!((dot(&a, &b) - want).abs() <= 1e-4 * (1.0 + want.abs()), "dot n={n}");
            let mut y1 = randoms(n, 3);
            let mut y2 = y1.clone();
            axpy_scalar(0.37, &a, &mut y1);
            axpy(0.37, &a, &mut y2);
            for (p, q) in y1.iter().zip(&y2) {
                assert!((p - q).abs() <= 1e-6, "axpy n={n}");
            }
        }
    }
}
