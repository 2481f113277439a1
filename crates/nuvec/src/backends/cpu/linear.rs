//! Matrix products and embedding lookups over dense and quantized weights.
//!
//! - One input row (decode): a fused dequantizing matrix-vector product per format
//!   ([`super::qgemv`]), threaded over output rows in chunks sized by work.
//! - A few input rows (batched decode): over affine weights, a multi-row kernel that unpacks
//!   each weight once for all the rows ([`super::qbatch`]); other formats run the
//!   matrix-vector product per row.
//! - Many input rows (prefill): tiles of weight rows are decoded into a thread-local f32 buffer
//!   and multiplied with the `gemm` crate straight into the output's columns.
//!
//! A quantized matrix is never dequantized whole.

use std::cell::RefCell;

use super::fpgemv::FpMatrix;
use super::pool::{self, SendPtr};
use super::qbatch::{self, PreparedRows};
use super::qgemv::{self, Params, PreparedX, QMatrix};
use super::simd;
use crate::{Array, DType, Error, Matrix, QuantMode, Quantized, Result};
use half::{bf16, f16};

/// Below this many multiply-adds an op runs on the calling thread (a rayon fork costs more).
pub(crate) const PAR_MIN_WORK: usize = 1 << 16;
/// Input rows up to which the matrix-vector kernel beats decoding tiles for `gemm`.
const GEMV_MAX_ROWS: usize = 4;
/// The most input rows a dense weight takes through [`dense_rows`] (each weight row read once,
/// widened in registers, every output the one-row dot product): a speculative step verifies up to
/// this many positions at about one row's cost where the weights' bytes set the pace.
const DENSE_ROWS_MAX: usize = 8;

/// Weights [`linear_many`] runs as one pass at most.
const MANY_MAX: usize = 8;

thread_local! {
    /// Per-thread scratch: scales/biases of one row, decoded weight tiles.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's prepared input vector.
    static PREPARED: RefCell<PreparedX> = RefCell::new(PreparedX::new());
    /// The calling thread's prepared input rows.
    static PREPARED_ROWS: RefCell<PreparedRows> = const { RefCell::new(PreparedRows::new()) };
    /// The calling thread's `silu(gate) * up` row.
    static GATED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with the thread's [`PreparedX`] laid out for `x` (a fresh one if it is in use).
fn with_prepared<R>(x: &[f32], q: &QMatrix, f: impl FnOnce(&PreparedX) -> R) -> R {
    PREPARED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut xs) => {
            xs.prepare(x, q.group, q.bits, simd::isa());
            f(&xs)
        }
        Err(_) => {
            let mut xs = PreparedX::new();
            xs.prepare(x, q.group, q.bits, simd::isa());
            f(&xs)
        }
    })
}

/// Runs `f` with the thread's [`PreparedRows`] laid out for the rows of `x` (a fresh one if it
/// is in use).
fn with_prepared_rows<R>(x: &[f32], q: &QMatrix, f: impl FnOnce(&PreparedRows) -> R) -> R {
    PREPARED_ROWS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut xs) => {
            xs.prepare(x, q.cols, q.group, q.bits, simd::isa());
            f(&xs)
        }
        Err(_) => {
            let mut xs = PreparedRows::new();
            xs.prepare(x, q.cols, q.group, q.bits, simd::isa());
            f(&xs)
        }
    })
}

/// Runs `f` with a thread-local scratch buffer of at least `len` floats (a fresh one if the
/// thread's buffer is in use further up the stack).
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            f(&mut buf[..len])
        }
        Err(_) => f(&mut vec![0f32; len]),
    })
}

/// Splits `out` (one value per output row, `work` multiply-adds each) into chunks handed to
/// rayon, or runs it whole on this thread when the op is small. `f(first_row, chunk)`.
pub(crate) fn par_rows(out: &mut [f32], work: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let n = out.len();
    let threads = pool::threads();
    if threads <= 1 || n * work < PAR_MIN_WORK || n < 2 {
        f(0, out);
        return;
    }
    let chunk = n.div_ceil(threads * 4).next_multiple_of(4).max(4);
    pool::for_chunks(out, chunk, f);
}

/// A weight matrix as the kernels read it.
enum Weights<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    Affine(QMatrix<'a>),
    /// mxfp4, mxfp8 or nvfp4 (fpquant).
    Fp(FpMatrix<'a>),
}

fn params(a: &Array) -> Result<Params<'_>> {
    Ok(match a.dtype() {
        DType::F32 => Params::F32(a.host()?),
        DType::F16 => Params::F16(a.host()?),
        DType::BF16 => Params::BF16(a.host()?),
        other => return Err(Error::shape("linear", format!("scales must be float, got {other}"))),
    })
}

impl<'a> Weights<'a> {
    fn new(w: &'a Matrix) -> Result<Self> {
        Ok(match w {
            Matrix::Dense(a) => match a.dtype() {
                DType::F32 => Weights::F32(a.host()?),
                DType::F16 => Weights::F16(a.host()?),
                DType::BF16 => Weights::BF16(a.host()?),
                other => return Err(Error::shape("linear", format!("weights must be float, got {other}"))),
            },
            Matrix::Quantized(q) if q.spec.mode != QuantMode::Affine => Weights::Fp(FpMatrix::new(q)?),
            Matrix::Quantized(q) => Self::affine(q)?,
        })
    }

    fn affine(q: &'a Quantized) -> Result<Self> {
        if q.spec.mode != QuantMode::Affine {
            return Err(Error::shape("linear", format!("{} is not affine", q.spec.mode.name())));
        }
        if !crate::QuantSpec::AFFINE_GROUPS.contains(&q.spec.group_size) {
            return Err(Error::shape("linear", format!("group size {} is not 16, 32, 64 or 128", q.spec.group_size)));
        }
        Ok(Weights::Affine(QMatrix {
            packed: q.packed.raw_bytes(),
            scales: params(&q.scales)?,
            biases: params(&q.biases)?,
            bits: q.spec.bits,
            group: q.spec.group_size,
            cols: q.cols(),
        }))
    }

    /// Scratch floats `row` needs besides its output.
    fn row_scratch(&self, k: usize) -> usize {
        match self {
            Weights::Affine(q) => 2 * q.groups(),
            Weights::Fp(_) => 0,
            _ => k,
        }
    }

    /// Writes row `r` (of `out.len()` columns) into `out`; `scratch` has `row_scratch` floats.
    fn row(&self, r: usize, out: &mut [f32], scratch: &mut [f32]) {
        let k = out.len();
        match self {
            Weights::F32(w) => out.copy_from_slice(&w[r * k..(r + 1) * k]),
            Weights::F16(w) => simd::widen(&w[r * k..(r + 1) * k], out),
            Weights::BF16(w) => simd::widen(&w[r * k..(r + 1) * k], out),
            Weights::Affine(q) => q.dequantize_row(r, out, scratch),
            Weights::Fp(q) => q.dequantize_row(r, out),
        }
    }
}

/// Unpacks LSB-first `bits`-wide unsigned values from `bytes` into `out` (as floats).
pub(crate) fn unpack_row(bytes: &[u8], bits: usize, out: &mut [f32]) {
    match bits {
        8 => out.iter_mut().zip(bytes).for_each(|(o, &b)| *o = b as f32),
        4 => {
            for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
                pair[0] = (b & 0xf) as f32;
                pair[1] = (b >> 4) as f32;
            }
        }
        2 => {
            for (quad, &b) in out.chunks_exact_mut(4).zip(bytes) {
                for (i, o) in quad.iter_mut().enumerate() {
                    *o = ((b >> (2 * i)) & 3) as f32;
                }
            }
        }
        3 => unpack_runs::<3>(bytes, out),
        5 => unpack_runs::<5>(bytes, out),
        6 => unpack_runs::<6>(bytes, out),
        _ => unpack_bits(bytes, bits, out, 0),
    }
}

/// Values `first..` of a bit stream, one at a time (any width).
fn unpack_bits(bytes: &[u8], bits: usize, out: &mut [f32], first: usize) {
    let mask = (1u16 << bits) - 1;
    for (j, o) in out.iter_mut().enumerate() {
        let bit = (first + j) * bits;
        let (byte, shift) = (bit / 8, bit % 8);
        let lo = bytes[byte] as u16;
        let hi = bytes.get(byte + 1).copied().unwrap_or(0) as u16;
        *o = (((lo | (hi << 8)) >> shift) & mask) as f32;
    }
}

/// `BITS`-wide values, 8 at a time: 8 values fill `BITS` whole bytes, read as one integer (rows
/// and groups hold whole runs of 8 at 3, 5 and 6 bits; a partial run at the end goes bit by bit).
fn unpack_runs<const BITS: usize>(bytes: &[u8], out: &mut [f32]) {
    let mask = (1u64 << BITS) - 1;
    let whole = out.len() / 8;
    let (runs, rest) = out.split_at_mut(whole * 8);
    for (run, chunk) in runs.chunks_exact_mut(8).zip(bytes.chunks_exact(BITS)) {
        let mut word = [0u8; 8];
        word[..BITS].copy_from_slice(chunk);
        let v = u64::from_le_bytes(word);
        for (j, o) in run.iter_mut().enumerate() {
            *o = ((v >> (BITS * j)) & mask) as f32;
        }
    }
    unpack_bits(bytes, BITS, rest, whole * 8);
}

/// `out [N] = W x` for one input row.
fn gemv(w: &Weights, x: &[f32], out: &mut [f32]) {
    let k = x.len();
    match w {
        Weights::Affine(q) => with_prepared(x, q, |xs| {
            par_rows(out, k, |r0, o| with_scratch(qgemv::params_len(q), |p| qgemv::rows(q, r0, x, xs, p, o)));
        }),
        Weights::Fp(q) => par_rows(out, k, |r0, o| {
            for (i, o) in o.iter_mut().enumerate() {
                *o = q.dot_row(r0 + i, x);
            }
        }),
        Weights::F32(d) => par_rows(out, k, |r0, o| dense_gemv(d, x, r0, o)),
        Weights::F16(d) => par_rows(out, k, |r0, o| dense_gemv(d, x, r0, o)),
        Weights::BF16(d) => par_rows(out, k, |r0, o| dense_gemv(d, x, r0, o)),
    }
}

/// `out[i] = x · row r0 + i` of a dense weight `d` (rows of `x.len()`), half-precision rows
/// widened in registers (the products and order of widening into scratch first, without
/// writing and reading the copy).
fn dense_gemv<T: simd::RowElem>(d: &[T], x: &[f32], r0: usize, out: &mut [f32]) {
    let k = x.len();
    for (i, o) in out.iter_mut().enumerate() {
        *o = simd::dot(x, &d[(r0 + i) * k..(r0 + i + 1) * k]);
    }
}

/// Output rows `r0..r1` of `out [M, N] = x [M, K] W^T` through the multi-row kernel; `out`
/// points at row 0 column 0 of an output with `n` columns.
///
/// # Safety
/// `out` is valid for `M * n` floats, where `M = x.len() / q.cols`, and nothing else accesses
/// columns `r0..r1` of it during the call.
unsafe fn qbatch_rows(q: &QMatrix, x: &[f32], xs: &PreparedRows, r0: usize, r1: usize, out: SendPtr<f32>, n: usize) {
    let m = x.len() / q.cols.max(1);
    let mut vals = [0f32; qbatch::PASS_MAX * qbatch::MAX_ROWS];
    with_scratch(qbatch::scratch_len(q), |scratch| {
        let mut r = r0;
        while r < r1 {
            let nr = (r1 - r).min(qbatch::pass_rows(q, xs));
            qbatch::rows(q, r, m, x, xs, scratch, &mut vals[..nr * m]);
            for (j, col) in vals[..nr * m].chunks_exact(m).enumerate() {
                for (i, &v) in col.iter().enumerate() {
                    // SAFETY: i < M and r + j < r1 <= n (the caller's contract); the column is
                    // this call's.
                    unsafe { *out.0.add(i * n + r + j) = v };
                }
            }
            r += nr;
        }
    });
}

/// `out [M, N] = x [M, K] W^T` for a few input rows over a dense weight, threaded over output
/// columns: each weight row is read (and widened to f32) once for all M rows, where one GEMV per
/// row reads the whole weight M times (a speculative step's verification, a small batch). Each
/// output is the dot product the one-row GEMV computes, bit for bit.
fn dense_rows(w: &Weights, x: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
    assert!(x.len() == m * k && out.len() == m * n);
    let threads = pool::threads();
    let chunk = n.div_ceil(threads * 4).next_multiple_of(4).max(4);
    let tasks = n.div_ceil(chunk);
    let dst = SendPtr(out.as_mut_ptr());
    let task = |t: usize| {
        let (r0, r1) = (t * chunk, ((t + 1) * chunk).min(n));
        // SAFETY: dst is `out` (m x n), alive until this call returns; task t alone writes
        // columns r0..r1 < n.
        unsafe { dense_rows_range(w, x, k, r0, r1, dst, n) }
    };
    if threads <= 1 || n * k * m < PAR_MIN_WORK || n < 2 {
        (0..tasks).for_each(task);
    } else {
        pool::run(tasks, &task);
    }
}

/// Columns `r0..r1` of [`dense_rows`]' output.
///
/// # Safety
/// `out` is valid for `M * n` floats, where `M = x.len() / k`, `r1 <= n`, and nothing else
/// accesses columns `r0..r1` of it during the call.
unsafe fn dense_rows_range(w: &Weights, x: &[f32], k: usize, r0: usize, r1: usize, out: SendPtr<f32>, n: usize) {
    let m = x.len() / k.max(1);
    let mut dots = [0f32; DENSE_ROWS_MAX];
    let dots = &mut dots[..m];
    for r in r0..r1 {
        match w {
            Weights::F32(d) => simd::dot_rows(&d[r * k..(r + 1) * k], x, dots),
            Weights::F16(d) => simd::dot_rows(&d[r * k..(r + 1) * k], x, dots),
            Weights::BF16(d) => simd::dot_rows(&d[r * k..(r + 1) * k], x, dots),
            _ => unreachable!("dense_rows takes dense weights"),
        }
        for (i, &v) in dots.iter().enumerate() {
            // SAFETY: i < M and r < r1 <= n (the caller's contract); the column is this call's.
            unsafe { *out.0.add(i * n + r) = v };
        }
    }
}

/// `out [M, N] = x [M, K] W^T` for `M <= qbatch::MAX_ROWS` over affine weights, threaded over
/// output rows.
fn qbatch(q: &QMatrix, x: &[f32], m: usize, n: usize, out: &mut [f32]) {
    assert!(m <= qbatch::MAX_ROWS && x.len() == m * q.cols && out.len() == m * n);
    let threads = pool::threads();
    let chunk = n.div_ceil(threads * 4).next_multiple_of(4).max(4);
    let tasks = n.div_ceil(chunk);
    let dst = SendPtr(out.as_mut_ptr());
    with_prepared_rows(x, q, |xs| {
        let task = |t: usize| {
            let (r0, r1) = (t * chunk, ((t + 1) * chunk).min(n));
            // SAFETY: dst is `out` (m x n), alive until this region ends; task t alone writes
            // its columns r0..r1.
            unsafe { qbatch_rows(q, x, xs, r0, r1, dst, n) }
        };
        if threads <= 1 || n * q.cols * m < PAR_MIN_WORK || n < 2 {
            (0..tasks).for_each(task);
        } else {
            pool::run(tasks, &task);
        }
    });
}

/// `out [M, N] = x [M, K] W^T`: tiles of W's rows decoded into f32, then `gemm`.
fn gemm_tiles(w: &Weights, x: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
    let threads = pool::threads();
    let tile = n.div_ceil(threads * 4).next_multiple_of(16).clamp(16, 128);
    let tiles = n.div_ceil(tile);
    let dst = SendPtr(out.as_mut_ptr());
    let extra = w.row_scratch(k);
    pool::run(tiles, &|t| {
        let (r0, r1) = (t * tile, ((t + 1) * tile).min(n));
        let nt = r1 - r0;
        with_scratch(nt * k + extra, |buf| {
            let (tbuf, scratch) = buf.split_at_mut(nt * k);
            for (i, row) in tbuf.chunks_mut(k).enumerate() {
                w.row(r0 + i, row, scratch);
            }
            let p = dst;
            // SAFETY: dst points to `out` (m x n, row-major), alive until this parallel loop ends;
            // this task writes only columns r0..r1, which no other task touches. lhs is x (m x k,
            // row-major) and rhs the tile read as k x nt (column j = decoded row r0 + j); all
            // strides stay inside their buffers.
            unsafe {
                gemm::gemm(
                    m,
                    nt,
                    k,
                    p.0.add(r0),
                    1,
                    n as isize,
                    false,
                    x.as_ptr(),
                    1,
                    k as isize,
                    tbuf.as_ptr(),
                    k as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            }
        });
    });
}

pub(crate) fn linear(x: &Array, w: &Matrix) -> Result<Array> {
    let k = x.dim(-1);
    if k != w.cols() {
        return Err(Error::shape("linear", format!("input has {k} features, weight {}x{}", w.rows(), w.cols())));
    }
    let m = x.len() / k.max(1);
    let n = w.rows();
    let xs = super::f32s("linear", x)?;
    let weights = Weights::new(w)?;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("x has at least one axis") = n;
    let mut out = Array::zeros(&shape, DType::F32);
    let o = out.host_mut::<f32>()?;
    match &weights {
        Weights::Affine(q) if m >= 2 && m <= qbatch::max_rows(q.bits, simd::isa()) && k > 0 => {
            qbatch(q, xs, m, n, o);
            return Ok(out);
        }
        _ => {}
    }
    let dense = matches!(weights, Weights::F32(_) | Weights::F16(_) | Weights::BF16(_));
    if (2..=DENSE_ROWS_MAX).contains(&m) && k > 0 && dense {
        dense_rows(&weights, xs, m, k, n, o);
    } else if m <= GEMV_MAX_ROWS || k == 0 {
        for (xr, or) in xs.chunks(k.max(1)).zip(o.chunks_mut(n.max(1))) {
            gemv(&weights, xr, or);
        }
    } else {
        gemm_tiles(&weights, xs, m, k, n, o);
    }
    Ok(out)
}

/// `x @ ws[i]^T` for each weight. One input row, or a few (up to `qbatch::max_rows`), over affine
/// weights of one width and group size runs as a single parallel pass over all their rows (x
/// prepared once); anything else runs [`linear`] per weight.
pub(crate) fn linear_many(x: &Array, ws: &[&Matrix]) -> Result<Vec<Array>> {
    let k = x.dim(-1);
    let m = x.len() / k.max(1);
    let mut qs: [Option<QMatrix>; MANY_MAX] = [None; MANY_MAX];
    let fused = k > 0 && ws.len() <= MANY_MAX && x.dtype() == DType::F32 && {
        for (slot, w) in qs.iter_mut().zip(ws) {
            if let (Matrix::Quantized(q), true) = (w, w.cols() == k) {
                if let Ok(Weights::Affine(qm)) = Weights::affine(q) {
                    *slot = Some(qm);
                }
            }
        }
        let first = qs[0];
        let rows_ok = |f: &QMatrix| m == 1 || (2..=qbatch::max_rows(f.bits, simd::isa())).contains(&m);
        qs[..ws.len()].iter().all(|q| match (q, first) {
            (Some(q), Some(f)) => q.bits == f.bits && q.group == f.group && rows_ok(&f),
            _ => false,
        })
    };
    if !fused {
        return ws.iter().map(|w| linear(x, w)).collect();
    }
    let xs = super::f32s("linear", x)?;
    let mut outs: Vec<Array> = ws
        .iter()
        .map(|w| {
            let mut shape = x.shape().to_vec();
            *shape.last_mut().expect("x has at least one axis") = w.rows();
            Array::zeros(&shape, DType::F32)
        })
        .collect();
    let mut ptrs = [SendPtr(std::ptr::null_mut::<f32>()); MANY_MAX];
    for (p, o) in ptrs.iter_mut().zip(outs.iter_mut()) {
        *p = SendPtr(o.host_mut::<f32>()?.as_mut_ptr());
    }
    let n_total: usize = ws.iter().map(|w| w.rows()).sum();
    let threads = pool::threads();
    let chunk = n_total.div_ceil(threads * 4).next_multiple_of(4).max(4);
    let first = qs[0].expect("checked above");
    let mut task_ends = [0usize; MANY_MAX];
    let mut total = 0;
    for (end, w) in task_ends.iter_mut().zip(ws) {
        total += w.rows().div_ceil(chunk);
        *end = total;
    }
    let count = ws.len();
    // Weight i, and the rows r0..r1 of it that task t computes.
    let place = |t: usize| {
        let i = task_ends[..count].iter().position(|&e| t < e).expect("t < total");
        let start = if i == 0 { 0 } else { task_ends[i - 1] };
        let r0 = (t - start) * chunk;
        (i, r0, (r0 + chunk).min(ws[i].rows()))
    };
    let run = |task: &(dyn Fn(usize) + Sync)| {
        if threads <= 1 || n_total * k * m < PAR_MIN_WORK {
            (0..total).for_each(task);
        } else {
            pool::run(total, task);
        }
    };
    if m == 1 {
        with_prepared(xs, &first, |prepared| {
            run(&|t| {
                let (i, r0, r1) = place(t);
                let q = qs[i].as_ref().expect("checked above");
                let p = ptrs[i];
                // SAFETY: output i has ws[i].rows() floats, alive until this region ends; task t
                // alone writes its rows r0..r1 of it.
                let o = unsafe { std::slice::from_raw_parts_mut(p.0.add(r0), r1 - r0) };
                with_scratch(qgemv::params_len(q), |scratch| qgemv::rows(q, r0, xs, prepared, scratch, o));
            })
        });
    } else {
        with_prepared_rows(xs, &first, |prepared| {
            run(&|t| {
                let (i, r0, r1) = place(t);
                let q = qs[i].as_ref().expect("checked above");
                // SAFETY: output i is m x ws[i].rows(), alive until this region ends; task t alone
                // writes its columns r0..r1.
                unsafe { qbatch_rows(q, xs, prepared, r0, r1, ptrs[i], ws[i].rows()) }
            })
        });
    }
    Ok(outs)
}

/// `(silu(gate) * up) @ w^T`: one input row goes through a thread-local buffer into the GEMV.
pub(crate) fn silu_mul_linear(gate: &Array, up: &Array, w: &Matrix) -> Result<Array> {
    let k = gate.dim(-1);
    if gate.shape() != up.shape() || gate.len() != k || k != w.cols() {
        return linear(&super::elementwise::silu_mul(gate, up)?, w);
    }
    let (g, u) = (super::f32s("silu_mul", gate)?, super::f32s("silu_mul", up)?);
    let weights = Weights::new(w)?;
    let mut shape = gate.shape().to_vec();
    *shape.last_mut().expect("gate has at least one axis") = w.rows();
    let mut out = Array::zeros(&shape, DType::F32);
    let o = out.host_mut::<f32>()?;
    let mut run = |h: &mut Vec<f32>| {
        h.resize(k, 0.0);
        simd::silu_mul(g, u, h);
        gemv(&weights, h, o);
    };
    GATED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut h) => run(&mut h),
        Err(_) => run(&mut Vec::new()),
    });
    Ok(out)
}

pub(crate) fn embed(table: &Matrix, ids: &[u32]) -> Result<Array> {
    let (v, d) = (table.rows(), table.cols());
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= v) {
        return Err(Error::shape("embed", format!("token id {bad} is outside the vocabulary of {v}")));
    }
    let weights = Weights::new(table)?;
    let mut out = Array::zeros(&[ids.len(), d], DType::F32);
    let o = out.host_mut::<f32>()?;
    with_scratch(weights.row_scratch(d), |scratch| {
        for (o, &id) in o.chunks_mut(d.max(1)).zip(ids) {
            weights.row(id as usize, o, scratch);
        }
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::simd::tests::randoms;
    use super::*;
    use crate::QuantSpec;

    #[test]
    fn unpack_generic_matches_fast_paths() {
        let bytes: Vec<u8> = (0..48u32).map(|i| (i * 37 + 11) as u8).collect();
        for bits in [2usize, 3, 4, 5, 6, 8] {
            // Whole rows, and (at the widths unpacked 8 at a time) a last partial run of 8.
            let whole = bytes.len() * 8 / bits;
            for n in if matches!(bits, 3 | 5 | 6) { vec![whole, whole - 3] } else { vec![whole] } {
                let mut fast = vec![0f32; n];
                unpack_row(&bytes, bits, &mut fast);
                let mask = (1u32 << bits) - 1;
                let slow: Vec<f32> = (0..n)
                    .map(|j| {
                        let bit = j * bits;
                        let pair = bytes[bit / 8] as u32 | (bytes.get(bit / 8 + 1).copied().unwrap_or(0) as u32) << 8;
                        ((pair >> (bit % 8)) & mask) as f32
                    })
                    .collect();
                assert_eq!(fast, slow, "bits {bits}, {n} values");
            }
        }
    }

    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|t| x[i * k + t] as f64 * w[j * k + t] as f64).sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn linear_many_and_silu_mul_linear_match_separate_ops() {
        let k = 576usize;
        let make_g = |n: usize, seed: u64, bits: usize, group: usize| {
            let words = k * bits / 32;
            let packed: Vec<u32> = randoms(n * words, seed).iter().map(|v| v.to_bits() ^ 0x9e37_79b9).collect();
            let scales: Vec<f16> = randoms(n * k / group, seed + 1).iter().map(|v| f16::from_f32(v * 0.05)).collect();
            let biases: Vec<f16> = randoms(n * k / group, seed + 2).iter().map(|v| f16::from_f32(v * 0.2)).collect();
            Matrix::Quantized(
                Quantized::new(
                    Array::from_slice(&packed, &[n, words]).unwrap(),
                    Array::from_slice(&scales, &[n, k / group]).unwrap(),
                    Array::from_slice(&biases, &[n, k / group]).unwrap(),
                    QuantSpec { mode: QuantMode::Affine, bits, group_size: group },
                    k,
                )
                .unwrap(),
            )
        };
        let make = |n: usize, seed: u64, bits: usize| make_g(n, seed, bits, 32);
        let (a, b, c) = (make(576, 1, 4), make(192, 4, 4), make(100, 7, 4));
        let d = make(64, 9, 8);
        // Groups of 16 (a Q4_K_M file's Q6_K tensors beside its Q4_K ones).
        let (e, f) = (make_g(96, 11, 6, 16), make_g(40, 13, 6, 16));
        // One row (the matrix-vector kernel) and several (the multi-row kernel).
        for m in [1usize, 3, 10] {
            let x = Array::from_slice(&randoms(m * k, 3), &[m, k]).unwrap();
            for ws in [vec![&a, &b, &c], vec![&a, &d], vec![&c], vec![&e, &f], vec![&a, &e]] {
                let many = linear_many(&x, &ws).unwrap();
                for (w, got) in ws.iter().zip(&many) {
                    let want = linear(&x, w).unwrap().to_vec::<f32>().unwrap();
                    assert_eq!(got.shape(), &[m, w.rows()]);
                    for (g, w) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
                        assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "m {m}: {g} vs {w}");
                    }
                }
            }
        }
        let x = Array::from_slice(&randoms(k, 3), &[1, k]).unwrap();
        let up = Array::from_slice(&randoms(k, 5), &[1, k]).unwrap();
        let got = silu_mul_linear(&x, &up, &c).unwrap().to_vec::<f32>().unwrap();
        let h = super::super::elementwise::silu_mul(&x, &up).unwrap();
        let want = linear(&h, &c).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn linear_gemv_and_gemm_paths_match_reference() {
        // Groups of 16 are GGUF's Q2_K/Q3_K/Q6_K as loaded (with f32 scales).
        for (bits, group) in [(4usize, 32usize), (6, 16), (4, 16), (8, 16)] {
            check_linear_paths(bits, group);
        }
    }

    #[test]
    fn a_few_rows_over_dense_weights_equal_each_row_alone() {
        // dense_rows reads each weight row once for all the input rows; every output is still
        // the one-row GEMV's dot product, bit for bit (speculative verification relies on it).
        for (k, n) in [(200usize, 70usize), (203, 9)] {
            let w = randoms(n * k, 11);
            let weights = [
                Matrix::Dense(Array::from_slice(&w, &[n, k]).unwrap()),
                Matrix::Dense(
                    Array::from_slice(&w.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(), &[n, k]).unwrap(),
                ),
                Matrix::Dense(
                    Array::from_slice(&w.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(), &[n, k]).unwrap(),
                ),
            ];
            for wm in &weights {
                for m in 2..=DENSE_ROWS_MAX {
                    let x = randoms(m * k, 40 + m as u64);
                    let all = linear(&Array::from_slice(&x, &[m, k]).unwrap(), wm).unwrap().to_vec::<f32>().unwrap();
                    for t in 0..m {
                        let one = linear(&Array::from_slice(&x[t * k..(t + 1) * k], &[1, k]).unwrap(), wm).unwrap();
                        assert_eq!(&all[t * n..(t + 1) * n], &one.to_vec::<f32>().unwrap()[..], "m {m}, row {t}");
                    }
                }
            }
        }
    }

    fn check_linear_paths(bits: usize, group: usize) {
        let (k, n) = (192usize, 72usize);
        let words = k * bits / 32;
        let packed: Vec<u32> = randoms(n * words, 5).iter().map(|v| v.to_bits() ^ 0x9e37_79b9).collect();
        let scales: Vec<f16> = randoms(n * k / group, 6).iter().map(|v| f16::from_f32(v * 0.05)).collect();
        let biases: Vec<f16> = randoms(n * k / group, 7).iter().map(|v| f16::from_f32(v * 0.2)).collect();
        let q = Quantized::new(
            Array::from_slice(&packed, &[n, words]).unwrap(),
            Array::from_slice(&scales, &[n, k / group]).unwrap(),
            Array::from_slice(&biases, &[n, k / group]).unwrap(),
            QuantSpec { mode: QuantMode::Affine, bits, group_size: group },
            k,
        )
        .unwrap();
        let wq = Matrix::Quantized(q);
        let dense = embed(&wq, &(0..n as u32).collect::<Vec<_>>()).unwrap().to_vec::<f32>().unwrap();
        let wd = Matrix::Dense(Array::from_slice(&dense, &[n, k]).unwrap());
        let wh = Matrix::Dense(
            Array::from_slice(&dense.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(), &[n, k]).unwrap(),
        );
        let dense_bf: Vec<f32> = dense.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        // One row, the multi-row kernel (one tile, several, a partial one), the gemm tiles.
        for m in [1usize, 2, 3, 9, 17, 20, 21, 32, 33] {
            let x = randoms(m * k, m as u64);
            let xa = Array::from_slice(&x, &[m, k]).unwrap();
            for (w, wf) in [(&wq, &dense), (&wd, &dense), (&wh, &dense_bf)] {
                let got = linear(&xa, w).unwrap().to_vec::<f32>().unwrap();
                let want = reference(&x, wf, m, k, n);
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "bits {bits} group {group} m {m}: {g} vs {w}");
                }
            }
        }
    }
}
