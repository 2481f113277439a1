//! Run-time CPU feature dispatch and the small vector primitives (dot, axpy) the kernels share.
//!
//! Every SIMD function here has a scalar twin that is the reference in the unit tests; the
//! dispatching wrappers pick the widest instruction set the CPU reports, once per process.
//! `NUVEC_CPU_ISA=scalar` forces the scalar paths and `NUVEC_CPU_ISA=avx2` caps x86 at AVX2 (for
//! comparisons and debugging).

use std::sync::OnceLock;

use half::{bf16, f16};

/// The instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Plain Rust (auto-vectorized at the build's baseline).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86-64 AVX-512 F/BW/VL on top of everything [`Isa::Avx2`] needs.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// Whether this CPU can run `isa`'s kernels (tests use it to try every available path).
#[cfg(test)]
pub(crate) fn supported(isa: Isa) -> bool {
    match isa {
        Isa::Scalar => true,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => has_avx2(),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => has_avx2() && has_avx512(),
    }
}

/// Every instruction set to test on this CPU (the scalar reference first).
#[cfg(test)]
pub(crate) fn testable() -> Vec<Isa> {
    let all = [
        Isa::Scalar,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512,
    ];
    all.into_iter().filter(|&i| supported(i)).collect()
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl")
}

/// The CPU features the kernels' choice rests on that this CPU reports (x86-64; none elsewhere).
pub(crate) fn detected_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut found = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        let checks: [(&str, bool); 10] = [
            ("avx2", is_x86_feature_detected!("avx2")),
            ("fma", is_x86_feature_detected!("fma")),
            ("f16c", is_x86_feature_detected!("f16c")),
            ("avx512f", is_x86_feature_detected!("avx512f")),
            ("avx512bw", is_x86_feature_detected!("avx512bw")),
            ("avx512vl", is_x86_feature_detected!("avx512vl")),
            ("avx512vnni", is_x86_feature_detected!("avx512vnni")),
            ("avx512bf16", is_x86_feature_detected!("avx512bf16")),
            ("avx512fp16", is_x86_feature_detected!("avx512fp16")),
            ("avxvnni", is_x86_feature_detected!("avxvnni")),
        ];
        found.extend(checks.iter().filter(|c| c.1).map(|c| c.0));
    }
    found
}

/// The instruction set chosen for this process: the best the processor has, capped by the CPU's
/// `NUVEC_CPU_ISA` (its setting, `nuvec::tuning::configure`, else the environment's).
pub(crate) fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = crate::tuning::setting("NUVEC_CPU_ISA", crate::Device::Cpu).unwrap_or_default();
        if cap == "scalar" {
            return Isa::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            return if cap != "avx2" && has_avx512() { Isa::Avx512 } else { Isa::Avx2 };
        }
        Isa::Scalar
    })
}

/// The element types of the second operand of [`dot`] and [`axpy`] (cached keys and values):
/// f32, or f16/bf16 widened as loaded, which is exact, so a product over half-precision elements
/// is bit for bit the product over them widened.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    F32,
    F16,
    Bf16,
}

/// An element [`dot`] and [`axpy`] read (see [`Kind`]).
pub(crate) trait RowElem: Copy + Send + Sync + 'static {
    const KIND: Kind;
    /// The value as f32 (exact).
    fn widen(self) -> f32;
}

impl RowElem for f32 {
    const KIND: Kind = Kind::F32;
    fn widen(self) -> f32 {
        self
    }
}

impl RowElem for f16 {
    const KIND: Kind = Kind::F16;
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

impl RowElem for bf16 {
    const KIND: Kind = Kind::Bf16;
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

/// `Σ a[i] * b[i]` (scalar reference; eight partial sums).
pub(crate) fn dot_scalar<T: RowElem>(a: &[f32], b: &[T]) -> f32 {
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

/// `Σ a[i] * b[i]` over the shorter length.
#[inline]
pub(crate) fn dot<T: RowElem>(a: &[f32], b: &[T]) -> f32 {
    let n = a.len().min(b.len());
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returns Avx2/Avx512 only after detecting avx2, fma and f16c on this CPU.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::dot(&a[..n], &b[..n]) },
        Isa::Scalar => dot_scalar(&a[..n], &b[..n]),
    }
}

/// `out[i] = dot(x row i, w)` for the `out.len()` rows of `xs` (each `w.len()` long), `w` read
/// from memory once for all of them and widened in registers; each sum in [`dot`]'s order, so
/// every output is bit for bit what [`dot`] gives for that row (a dense weight's rows in a
/// speculative step's verification or a small batch).
pub(crate) fn dot_rows<T: RowElem>(w: &[T], xs: &[f32], out: &mut [f32]) {
    let k = w.len();
    assert_eq!(xs.len(), k * out.len(), "dot_rows: {} inputs for {} rows of {k}", xs.len(), out.len());
    if k == 0 {
        out.fill(0.0);
        return;
    }
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returns Avx2/Avx512 only after detecting avx2, fma and f16c on this CPU;
        // xs holds out.len() rows of w.len() (asserted above).
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::dot_rows(w, xs, out) },
        Isa::Scalar => {
            for (o, x) in out.iter_mut().zip(xs.chunks_exact(k)) {
                *o = dot_scalar(x, w);
            }
        }
    }
}

/// `y[i] += a * x[i]` (scalar reference).
pub(crate) fn axpy_scalar<T: RowElem>(a: f32, x: &[T], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x.widen();
    }
}

/// `y[i] += a * x[i]` over the shorter length.
#[inline]
pub(crate) fn axpy<T: RowElem>(a: f32, x: &[T], y: &mut [f32]) {
    let n = x.len().min(y.len());
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returns Avx2/Avx512 only after detecting avx2, fma and f16c on this CPU.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::axpy(a, &x[..n], &mut y[..n]) },
        Isa::Scalar => axpy_scalar(a, &x[..n], &mut y[..n]),
    }
}

/// `src` widened to f32 into `dst` (same length; exact: every f16 and bf16 value is an f32
/// value). The cache's half-precision keys and values and half-precision group scales go through
/// here on every step: one conversion per eight values, inlined (`half`'s slice conversion calls
/// out per eight).
pub(crate) fn widen<T: RowElem>(src: &[T], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen: lengths differ");
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returns Avx2/Avx512 only after detecting avx2, fma and f16c on this CPU;
        // the lengths are equal (asserted above).
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::widen(src, dst) },
        Isa::Scalar => widen_scalar(src, dst),
    }
}

/// [`widen`]'s scalar reference.
pub(crate) fn widen_scalar<T: RowElem>(src: &[T], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s.widen();
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::{Kind, RowElem};

    /// # Safety
    /// The CPU must support avx2, fma and f16c; `src` and `dst` have the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn widen<T: RowElem>(src: &[T], dst: &mut [f32]) {
        debug_assert_eq!(src.len(), dst.len());
        let n = src.len();
        let (ps, pd) = (src.as_ptr(), dst.as_mut_ptr());
        let mut i = 0;
        // SAFETY (loads and stores below): indices stay below n, the length of both slices.
        while i + 8 <= n {
            _mm256_storeu_ps(pd.add(i), load8(ps.add(i)));
            i += 8;
        }
        super::widen_scalar(&src[i..], &mut dst[i..]);
    }

    /// Sum of the eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Eight elements at `p` as f32 lanes.
    ///
    /// # Safety
    /// The CPU must support avx2 and f16c; eight elements at `p` are readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8<T: RowElem>(p: *const T) -> __m256 {
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
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot<T: RowElem>(a: &[f32], b: &[T]) -> f32 {
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

    /// [`dot`] of `w` with each row of `xs`, two rows per pass over `w` (their eight sums and
    /// `w`'s four vectors fit the 16 registers), each in `dot`'s order of operations.
    ///
    /// # Safety
    /// The CPU must support avx2, fma and f16c; `xs` holds `out.len()` rows of `w.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_rows<T: RowElem>(w: &[T], xs: &[f32], out: &mut [f32]) {
        let (k, m) = (w.len(), out.len());
        debug_assert_eq!(xs.len(), k * m);
        let pw = w.as_ptr();
        let mut r = 0;
        while r + 2 <= m {
            // SAFETY (all loads below): rows r and r + 1 of xs and every index of w read are
            // below k; xs holds m rows of k.
            let (pa, pb) = (xs.as_ptr().add(r * k), xs.as_ptr().add((r + 1) * k));
            let (mut a, mut b) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
            let mut i = 0;
            while i + 32 <= k {
                for j in 0..4 {
                    let wv = load8(pw.add(i + 8 * j));
                    a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8 * j)), wv, a[j]);
                    b[j] = _mm256_fmadd_ps(_mm256_loadu_ps(pb.add(i + 8 * j)), wv, b[j]);
                }
                i += 32;
            }
            while i + 8 <= k {
                let wv = load8(pw.add(i));
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), wv, a[0]);
                b[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pb.add(i)), wv, b[0]);
                i += 8;
            }
            let mut sa = hsum(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
            let mut sb = hsum(_mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3])));
            while i < k {
                let wi = (*pw.add(i)).widen();
                sa += *pa.add(i) * wi;
                sb += *pb.add(i) * wi;
                i += 1;
            }
            out[r] = sa;
            out[r + 1] = sb;
            r += 2;
        }
        if r < m {
            out[r] = dot(&xs[r * k..(r + 1) * k], w);
        }
    }

    /// # Safety
    /// The CPU must support avx2, fma and f16c; `x` and `y` have the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn axpy<T: RowElem>(a: f32, x: &[T], y: &mut [f32]) {
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

/// AVX-512 vector primitives.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x512 {
    use std::arch::x86_64::*;

    /// `e^x` per lane: range reduction `x = n ln2 + r` (|r| <= ln2/2, ln2 split in two), Cephes'
    /// degree-6 polynomial for `e^r` (about 1 ulp), then `* 2^n` with `vscalefps`, which flushes
    /// results below f32's range to 0 and overflows to +inf like `f32::exp`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn exp(x: __m512) -> __m512 {
        let x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(89.0)), _mm512_set1_ps(-104.0));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            x,
            _mm512_set1_ps(std::f32::consts::LOG2_E),
        ));
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.398_2e-3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333_452e-3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166_579_6e-2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666_666_5e-1));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5));
        let r2 = _mm512_mul_ps(r, r);
        p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0)));
        _mm512_scalef_ps(p, n)
    }

    /// `out[i] = g[i] / (1 + e^-g[i]) * u[i]`.
    ///
    /// # Safety
    /// The CPU must support avx512f; the three slices have the same length.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
        let n = g.len();
        assert!(u.len() == n && out.len() == n);
        let (pg, pu, po) = (g.as_ptr(), u.as_ptr(), out.as_mut_ptr());
        let one = _mm512_set1_ps(1.0);
        let mut i = 0;
        while i < n {
            let mask: __mmask16 = if n - i >= 16 { 0xffff } else { (1u16 << (n - i)) - 1 };
            // SAFETY: the mask limits every access to indices i..min(i + 16, n) (asserted lengths).
            let gv = _mm512_maskz_loadu_ps(mask, pg.add(i));
            let uv = _mm512_maskz_loadu_ps(mask, pu.add(i));
            let e = exp(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            let r = _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), uv);
            _mm512_mask_storeu_ps(po.add(i), mask, r);
            i += 16;
        }
    }

    /// `s[i] = e^(scale * (s[i] - max))` in place; returns the sum of the results.
    ///
    /// # Safety
    /// The CPU must support avx512f.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn exp_shifted(s: &mut [f32], max: f32, scale: f32) -> f32 {
        let n = s.len();
        let p = s.as_mut_ptr();
        let (vm, vs) = (_mm512_set1_ps(max), _mm512_set1_ps(scale));
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let mask: __mmask16 = if n - i >= 16 { 0xffff } else { (1u16 << (n - i)) - 1 };
            // SAFETY: the mask limits the load and store to indices i..min(i + 16, n) of `s`.
            let v = _mm512_maskz_loadu_ps(mask, p.add(i));
            let e = exp(_mm512_mul_ps(_mm512_sub_ps(v, vm), vs));
            _mm512_mask_storeu_ps(p.add(i), mask, e);
            acc = _mm512_mask_add_ps(acc, mask, acc, e);
            i += 16;
        }
        _mm512_reduce_add_ps(acc)
    }
}

/// `out[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i]` (scalar reference).
pub(crate) fn silu_mul_scalar(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// `out[i] = silu(g[i]) * u[i]` over the shortest length.
pub(crate) fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = g.len().min(u.len()).min(out.len());
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returns Avx512 only after detecting avx512f on this CPU.
        Isa::Avx512 => unsafe { x512::silu_mul(&g[..n], &u[..n], &mut out[..n]) },
        _ => silu_mul_scalar(&g[..n], &u[..n], &mut out[..n]),
    }
}

/// `s[i] = e^(scale * (s[i] - max))` in place, returning the sum (scalar reference: `f32::exp`).
pub(crate) fn exp_shifted_scalar(s: &mut [f32], max: f32, scale: f32) -> f32 {
    let mut sum = 0.0;
    for v in s.iter_mut() {
        *v = ((*v - max) * scale).exp();
        sum += *v;
    }
    sum
}

/// `s[i] = e^(scale * (s[i] - max))` in place, returning the sum.
#[inline]
pub(crate) fn exp_shifted(s: &mut [f32], max: f32, scale: f32) -> f32 {
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returns Avx512 only after detecting avx512f on this CPU.
        Isa::Avx512 => unsafe { x512::exp_shifted(s, max, scale) },
        _ => exp_shifted_scalar(s, max, scale),
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
    fn vector_exp_matches_f64() {
        let mut xs: Vec<f32> = randoms(4000, 5).iter().map(|v| v * 80.0).collect();
        xs.extend([0.0, -0.0, 1.0, -1.0, 88.0, -87.0, -103.0, -200.0, 1e-8, -1e-8]);
        let max = 3.5;
        let mut fast = xs.clone();
        let mut slow = xs.clone();
        let sf = exp_shifted(&mut fast, max, 0.9);
        let ss = exp_shifted_scalar(&mut slow, max, 0.9);
        for ((&x, &f), &s) in xs.iter().zip(&fast).zip(&slow) {
            let want = (((x - max) * 0.9) as f64).exp();
            let tol = 4.0 * f32::EPSILON as f64 * want + 1e-44;
            assert!(((f as f64) - want).abs() <= tol, "exp({x}): {f} vs {want}");
            assert!(((s as f64) - want).abs() <= tol, "scalar exp({x}): {s} vs {want}");
        }
        assert!((sf - ss).abs() <= 1e-5 * ss.abs(), "{sf} vs {ss}");
    }

    #[test]
    fn vector_silu_mul_matches_scalar() {
        for n in [0usize, 1, 15, 16, 17, 1536] {
            let mut g: Vec<f32> = randoms(n, 21).iter().map(|v| v * 30.0).collect();
            if n > 4 {
                g[..4].copy_from_slice(&[-150.0, 150.0, 0.0, -90.0]);
            }
            let u = randoms(n, 22);
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            silu_mul_scalar(&g, &u, &mut a);
            silu_mul(&g, &u, &mut b);
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!((x - y).abs() <= 4.0 * f32::EPSILON * x.abs() + 1e-30, "n {n} g {}: {x} vs {y}", g[i]);
            }
        }
    }

    #[test]
    fn dot_rows_gives_each_row_its_own_dot_bit_for_bit() {
        // Lengths with and without whole 32-value blocks, 8-value steps and a scalar tail; odd
        // and even row counts (the last row of an odd count takes dot itself).
        for k in [0usize, 1, 7, 8, 31, 32, 33, 200, 203, 576] {
            let w = randoms(k, 31);
            let (h, b): (Vec<f16>, Vec<bf16>) = w.iter().map(|&v| (f16::from_f32(v), bf16::from_f32(v))).unzip();
            for m in 1..=5 {
                let xs = randoms(m * k, 32 + m as u64);
                let mut got = vec![f32::NAN; m];
                let rows = |got: &[f32], want: &dyn Fn(&[f32]) -> f32| {
                    for (r, g) in got.iter().enumerate() {
                        let x = &xs[r * k..(r + 1) * k];
                        assert_eq!(g.to_bits(), want(x).to_bits(), "k {k} m {m} row {r}");
                    }
                };
                dot_rows(&w, &xs, &mut got);
                rows(&got, &|x| dot(x, &w));
                dot_rows(&h, &xs, &mut got);
                rows(&got, &|x| dot(x, &h));
                dot_rows(&b, &xs, &mut got);
                rows(&got, &|x| dot(x, &b));
            }
        }
    }

    #[test]
    fn widening_half_floats_matches_scalar_bit_for_bit() {
        // Every bit pattern of f16 and bf16 (NaNs compared as bits), at lengths with and without
        // a tail past the last eight.
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for n in [all.len(), 13, 8, 7, 0] {
            let h: Vec<f16> = all[..n].iter().map(|&b| f16::from_bits(b)).collect();
            let b: Vec<bf16> = all[..n].iter().map(|&b| bf16::from_bits(b)).collect();
            let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
            widen_scalar(&h, &mut want);
            widen(&h, &mut got);
            let bits = |v: &[f32]| {
                v.iter().map(|x| x.to_bits() | if x.is_nan() { 0x0040_0000 } else { 0 }).collect::<Vec<_>>()
            };
            assert_eq!(bits(&got), bits(&want), "f16, n = {n}");
            widen_scalar(&b, &mut want);
            widen(&b, &mut got);
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "bf16, n = {n}"
            );
        }
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
