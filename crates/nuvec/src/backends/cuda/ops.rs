//! The [`Backend`] ops on a CUDA device: shape checks as the CPU backend does them, then kernel
//! launches (see `kernels/`) and cuBLAS calls enqueued on the device's stream.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{state, DeviceBuffer, State};
use crate::{Array, Backend, DType, Device, Error, Matrix, QuantMode, QuantSpec, Result};

/// Input rows up to which `linear` runs the fused matrix-vector kernel (must match `GEMV_MAX_M`).
const GEMV_MAX_ROWS: usize = 8;
/// Output rows per block of the matrix-vector kernel (`GEMV_WARPS`).
const GEMV_ROWS_PER_BLOCK: usize = 8;
/// Floats of dequantized weights per tile on the GEMM path (64 MiB).
const TILE_FLOATS: usize = 1 << 24;
/// Threads per block of the attention kernel, and the most features it handles per head
/// (`ATTN_MAX_ACC` accumulators per thread).
const ATTN_THREADS: usize = 128;
const ATTN_MAX_DIM: usize = 4 * ATTN_THREADS;

const DT_F32: i32 = 0;
const DT_F16: i32 = 1;
const DT_BF16: i32 = 2;

/// The backend of one CUDA device. Ops fail with [`Error::Device`] when the device cannot be
/// used (no driver, no such device), and name the op and input when an array lives elsewhere.
#[derive(Debug)]
pub struct CudaBackend {
    ordinal: usize,
}

impl CudaBackend {
    /// The backend of device `ordinal` (one per process).
    pub fn get(ordinal: usize) -> &'static CudaBackend {
        static BACKENDS: OnceLock<Mutex<HashMap<usize, &'static CudaBackend>>> = OnceLock::new();
        let mut all = BACKENDS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        all.entry(ordinal).or_insert_with(|| Box::leak(Box::new(CudaBackend { ordinal })))
    }

    fn st(&self) -> Result<&'static State> {
        state(self.ordinal)
    }

    fn dev(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    /// The device address of `a`, checking it lives on this device.
    fn ptr(&self, op: &'static str, name: &str, a: &Array) -> Result<u64> {
        if a.device() != self.dev() {
            return Err(Error::Device(format!(
                "{op}: {name} is on {} but the op runs on {}; move it with to_device({:?})",
                a.device(),
                self.dev(),
                self.dev()
            )));
        }
        a.cuda_ptr()
    }

    /// Like `ptr`, for an f32 activation.
    fn f32_ptr(&self, op: &'static str, name: &str, a: &Array) -> Result<u64> {
        if a.dtype() != DType::F32 {
            return Err(Error::shape(op, format!("activations must be float32, got {} for {name}", a.dtype())));
        }
        self.ptr(op, name, a)
    }

    /// A fresh f32/u32 array on this device (contents unspecified unless `zero`).
    fn output(&self, shape: &[usize], dtype: DType, zero: bool) -> Result<Array> {
        let st = self.st()?;
        let len = shape.iter().product::<usize>() * dtype.size();
        let buf = if zero { DeviceBuffer::zeroed(st, len)? } else { DeviceBuffer::alloc(st, len)? };
        Ok(Array::from_device_buffer(buf, shape.to_vec(), dtype, self.dev()))
    }

    fn upload<T: bytemuck::Pod>(&self, data: &[T]) -> Result<DeviceBuffer> {
        DeviceBuffer::upload(self.st()?, bytemuck::cast_slice(data))
    }
}

/// The dtype code of a float array, for kernels that read f32, f16 or bf16.
fn float_code(op: &'static str, name: &str, a: &Array) -> Result<i32> {
    match a.dtype() {
        DType::F32 => Ok(DT_F32),
        DType::F16 => Ok(DT_F16),
        DType::BF16 => Ok(DT_BF16),
        other => Err(Error::shape(op, format!("{name} must be a float array, got {other}"))),
    }
}

/// A grid-stride launch over `n` elements.
fn cfg_1d(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1 << 20) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

fn to_i32(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Unsupported(format!("{op}: {what} = {v} is over the CUDA kernels' 2^31 limit")))
}

/// Launches kernel `$name` with `$cfg` and the given arguments (locals of the kernel's exact
/// parameter types: u64 for pointers and size_t, i32 for int, i64 for long long, f32 for float).
macro_rules! launch {
    ($st:expr, $op:expr, $name:expr, $cfg:expr; $($arg:ident),* $(,)?) => {{
        let st: &State = $st;
        let f = st.func($name)?;
        let mut b = st.stream.launch_builder(f);
        $(b.arg(&$arg);)*
        // SAFETY: every pointer argument is the address of a live device allocation of this
        // device (held by an Array or DeviceBuffer that outlives the enqueue; frees are ordered
        // after the kernel on the same stream), sized for the extents passed alongside it, which
        // the caller checked; the argument types match the kernel's parameters.
        unsafe { b.launch($cfg) }
            .map_err(|e| Error::Device(format!("{}: launching {} on cuda:{}: {e:?}", $op, $name, st.ordinal)))?;
    }};
}

/// A weight matrix as kernel arguments (see `struct Weights` in linear.cu).
struct WeightArgs {
    dense: u64,
    packed: u64,
    scales: u64,
    biases: u64,
    w_dt: i32,
    p_dt: i32,
    bits: i32,
    group: i32,
}

impl CudaBackend {
    fn weight_args(&self, op: &'static str, w: &Matrix) -> Result<WeightArgs> {
        match w {
            Matrix::Dense(a) => {
                if a.shape().len() != 2 {
                    return Err(Error::shape(op, format!("weights must be 2-d, got {:?}", a.shape())));
                }
                let w_dt = match a.dtype() {
                    DType::F32 => DT_F32,
                    DType::F16 => DT_F16,
                    DType::BF16 => DT_BF16,
                    other => return Err(Error::shape(op, format!("weights must be float, got {other}"))),
                };
                let dense = self.ptr(op, "weight", a)?;
                Ok(WeightArgs { dense, packed: 0, scales: 0, biases: 0, w_dt, p_dt: 0, bits: 0, group: 0 })
            }
            Matrix::Quantized(q) => {
                let QuantSpec { mode: QuantMode::Affine, bits, group_size } = q.spec;
                if !QuantSpec::AFFINE_BITS.contains(&bits) || !QuantSpec::AFFINE_GROUPS.contains(&group_size) {
                    return Err(Error::shape(
                        op,
                        format!("affine bits {bits} / group size {group_size} not supported"),
                    ));
                }
                let p_dt = float_code(op, "scales", &q.scales)?;
                float_code(op, "biases", &q.biases)?;
                if q.scales.dtype() != q.biases.dtype() {
                    return Err(Error::shape(op, "scales and biases must share one float dtype"));
                }
                Ok(WeightArgs {
                    dense: 0,
                    packed: self.ptr(op, "packed weight", &q.packed)?,
                    scales: self.ptr(op, "scales", &q.scales)?,
                    biases: self.ptr(op, "biases", &q.biases)?,
                    w_dt: -1,
                    p_dt,
                    bits: bits as i32,
                    group: group_size as i32,
                })
            }
        }
    }

    /// `out [rows, k]` f32 = weight rows `ids` (device u32, or 0 for `row0..`), decoded.
    #[allow(clippy::too_many_arguments)]
    fn gather_rows(
        &self,
        op: &'static str,
        out: u64,
        ids: u64,
        row0: usize,
        rows: usize,
        k: usize,
        w: &WeightArgs,
    ) -> Result<()> {
        let total = (rows * k) as u64;
        if total == 0 {
            return Ok(());
        }
        let (row0, k) = (row0 as i64, to_i32(op, "columns", k)?);
        let WeightArgs { dense, packed, scales, biases, w_dt, p_dt, bits, group } = *w;
        launch!(self.st()?, op, "gather_rows", cfg_1d(total as usize);
            out, ids, row0, total, dense, packed, scales, biases, w_dt, p_dt, bits, group, k);
        Ok(())
    }

    /// Row-major `out[:, col0..col0+rows] (ld n) = x [m, k] @ w [rows, k]^T`, all f32, by cuBLAS
    /// SGEMM (column-major: `out^T = w · x^T`).
    #[allow(clippy::too_many_arguments)]
    fn sgemm(
        &self,
        op: &'static str,
        out: u64,
        x: u64,
        w: u64,
        m: usize,
        rows: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        let st = self.st()?;
        let (mi, ri, ki, ni) =
            (to_i32(op, "rows", m)?, to_i32(op, "rows", rows)?, to_i32(op, "k", k)?, to_i32(op, "n", n)?);
        let blas = st.blas.lock().unwrap_or_else(|p| p.into_inner());
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: w holds rows x k f32 (row-major = column-major k x rows, lda k), x holds m x k
        // (column-major k x m, ldb k), out holds m rows of n >= rows f32 (column-major, ldc n);
        // all on this device; the handle's stream is the device stream.
        unsafe {
            cudarc::cublas::result::sgemm(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                ri,
                mi,
                ki,
                &alpha,
                w as *const f32,
                ki,
                x as *const f32,
                ki,
                &beta,
                out as *mut f32,
                ni,
            )
        }
        .map_err(|e| Error::Device(format!("{op}: cuBLAS SGEMM on cuda:{}: {e:?}", st.ordinal)))
    }

    fn binary(&self, op: &'static str, kernel: &str, a: &Array, b: &Array) -> Result<Array> {
        if a.shape() != b.shape() {
            return Err(Error::shape(op, format!("{:?} and {:?} differ", a.shape(), b.shape())));
        }
        let (ap, bp) = (self.f32_ptr(op, "a", a)?, self.f32_ptr(op, "b", b)?);
        let out = self.output(a.shape(), DType::F32, false)?;
        let (o, n) = (out.cuda_ptr()?, a.len() as u64);
        if n > 0 {
            launch!(self.st()?, op, kernel, cfg_1d(n as usize); o, ap, bp, n);
        }
        Ok(out)
    }
}

impl Backend for CudaBackend {
    fn device(&self) -> Device {
        self.dev()
    }

    fn linear(&self, x: &Array, w: &Matrix) -> Result<Array> {
        let op = "linear";
        if x.shape().is_empty() {
            return Err(Error::shape(op, "input is 0-d"));
        }
        let k = x.dim(-1);
        if k != w.cols() {
            return Err(Error::shape(op, format!("input has {k} features, weight {}x{}", w.rows(), w.cols())));
        }
        let xp = self.f32_ptr(op, "x", x)?;
        let wa = self.weight_args(op, w)?;
        let m = x.len() / k.max(1);
        let n = w.rows();
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("x has at least one axis") = n;
        let out = self.output(&shape, DType::F32, k == 0)?;
        if m == 0 || n == 0 || k == 0 {
            return Ok(out);
        }
        let o = out.cuda_ptr()?;
        if wa.w_dt == DT_F32 {
            self.sgemm(op, o, xp, wa.dense, m, n, k, n)?;
        } else if m <= GEMV_MAX_ROWS {
            let WeightArgs { dense, packed, scales, biases, w_dt, p_dt, bits, group } = wa;
            let (mi, ni, ki) = (m as i32, to_i32(op, "rows", n)?, to_i32(op, "k", k)?);
            let blocks = to_i32(op, "blocks", n.div_ceil(GEMV_ROWS_PER_BLOCK))? as u32;
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (32 * GEMV_ROWS_PER_BLOCK as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(self.st()?, op, "gemv", cfg; o, xp, mi, ni, dense, packed, scales, biases, w_dt, p_dt, bits, group, ki);
        } else {
            // Tiles of weight rows decoded to f32, each multiplied by SGEMM into its columns.
            let tile = (TILE_FLOATS / k).max(64).next_multiple_of(64).min(n);
            let scratch = DeviceBuffer::alloc(self.st()?, tile * k * 4)?;
            let mut r0 = 0;
            while r0 < n {
                let rows = tile.min(n - r0);
                self.gather_rows(op, scratch.ptr(), 0, r0, rows, k, &wa)?;
                self.sgemm(op, o + (r0 * 4) as u64, xp, scratch.ptr(), m, rows, k, n)?;
                r0 += rows;
            }
        }
        Ok(out)
    }

    fn embed(&self, table: &Matrix, ids: &[u32]) -> Result<Array> {
        let op = "embed";
        let (v, d) = (table.rows(), table.cols());
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= v) {
            return Err(Error::shape(op, format!("token id {bad} is outside the vocabulary of {v}")));
        }
        let wa = self.weight_args(op, table)?;
        let out = self.output(&[ids.len(), d], DType::F32, false)?;
        if ids.is_empty() || d == 0 {
            return Ok(out);
        }
        let idb = self.upload(ids)?;
        self.gather_rows(op, out.cuda_ptr()?, idb.ptr(), 0, ids.len(), d, &wa)?;
        Ok(out)
    }

    fn rms_norm(&self, x: &Array, weight: &Array, eps: f32) -> Result<Array> {
        let op = "rms_norm";
        if x.shape().is_empty() {
            return Err(Error::shape(op, "input is 0-d"));
        }
        let d = x.dim(-1);
        if weight.len() != d {
            return Err(Error::shape(op, format!("weight of {} for rows of {d}", weight.len())));
        }
        let xp = self.f32_ptr(op, "x", x)?;
        let w_dt = float_code(op, "weight", weight)?;
        let wp = self.ptr(op, "weight", weight)?;
        let out = self.output(x.shape(), DType::F32, false)?;
        let rows = x.len() / d.max(1);
        if rows == 0 || d == 0 {
            return Ok(out);
        }
        let (o, di) = (out.cuda_ptr()?, to_i32(op, "row length", d)?);
        let grid = u32::try_from(rows).map_err(|_| Error::Unsupported(format!("{op}: {rows} rows")))?;
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        launch!(self.st()?, op, "rms_norm_f32", cfg; o, xp, wp, w_dt, di, eps);
        Ok(out)
    }

    fn rope(&self, x: &Array, inv_freqs: &[f32], offset: usize, traditional: bool) -> Result<Array> {
        let op = "rope";
        let [l, h, d] = *x.shape() else {
            return Err(Error::shape(op, format!("expected [L, H, D], got {:?}", x.shape())));
        };
        let half = inv_freqs.len();
        if 2 * half > d {
            return Err(Error::shape(op, format!("{half} frequencies for heads of {d}")));
        }
        let xp = self.f32_ptr(op, "x", x)?;
        let out = self.output(x.shape(), DType::F32, false)?;
        let n = (l * h * d) as u64;
        if n == 0 {
            return Ok(out);
        }
        let freqs = self.upload(if inv_freqs.is_empty() { &[0f32][..] } else { inv_freqs })?;
        let (o, fp) = (out.cuda_ptr()?, freqs.ptr());
        let (half, hi, di) = (half as i32, to_i32(op, "heads", h)?, to_i32(op, "head size", d)?);
        let (offset, trad) = (offset as i64, traditional as i32);
        launch!(self.st()?, op, "rope_f32", cfg_1d(n as usize); o, xp, fp, half, hi, di, offset, trad, n);
        Ok(out)
    }

    fn attention(&self, q: &Array, k: &Array, v: &Array, kv_len: usize, scale: f32) -> Result<Array> {
        let op = "attention";
        let (&[l, hq, d], &[hkv, cap, dk]) = (q.shape(), k.shape()) else {
            return Err(Error::shape(op, format!("q {:?}, k {:?}", q.shape(), k.shape())));
        };
        if v.shape() != k.shape() || dk != d || hkv == 0 || hq % hkv != 0 || kv_len > cap || l > kv_len {
            return Err(Error::shape(
                op,
                format!("q {:?}, k {:?}, v {:?}, kv_len {kv_len}", q.shape(), k.shape(), v.shape()),
            ));
        }
        if d > ATTN_MAX_DIM {
            return Err(Error::Unsupported(format!(
                "{op}: head size {d} (the CUDA kernel handles up to {ATTN_MAX_DIM})"
            )));
        }
        if l > 65535 {
            return Err(Error::Unsupported(format!("{op}: {l} queries in one call (at most 65535 on CUDA)")));
        }
        let (qp, kp, vp) = (self.f32_ptr(op, "q", q)?, self.f32_ptr(op, "k", k)?, self.f32_ptr(op, "v", v)?);
        let out = self.output(&[l, hq * d], DType::F32, false)?;
        if l == 0 || hq == 0 || d == 0 {
            return Ok(out);
        }
        let o = out.cuda_ptr()?;
        let (li, hqi, hkvi, di) = (l as i32, to_i32(op, "heads", hq)?, hkv as i32, d as i32);
        let (capi, kvi) = (to_i32(op, "capacity", cap)?, kv_len as i32);
        let cfg = LaunchConfig {
            grid_dim: (hqi as u32, l as u32, 1),
            block_dim: (ATTN_THREADS as u32, 1, 1),
            shared_mem_bytes: ((d + ATTN_THREADS + 33) * 4) as u32,
        };
        launch!(self.st()?, op, "attention_f32", cfg; o, qp, kp, vp, li, hqi, hkvi, di, capi, kvi, scale);
        Ok(out)
    }

    fn write_axis1(&self, dst: &mut Array, src: &Array, offset: usize) -> Result<()> {
        let op = "write_axis1";
        let (&[a, cap, c], &[sa, n, sc]) = (dst.shape(), src.shape()) else {
            return Err(Error::shape(op, format!("expected 3-d arrays, got {:?} and {:?}", dst.shape(), src.shape())));
        };
        if a != sa || c != sc || offset + n > cap {
            return Err(Error::shape(op, format!("cannot write {:?} into {:?} at {offset}", src.shape(), dst.shape())));
        }
        let sp = self.f32_ptr(op, "src", src)?;
        self.f32_ptr(op, "dst", dst)?;
        let total = (a * n * c) as u64;
        if total == 0 {
            return Ok(());
        }
        let dp = dst.cuda_ptr_mut()?;
        let (ni, capi, ci, offi) = (
            to_i32(op, "rows", n)?,
            to_i32(op, "capacity", cap)?,
            to_i32(op, "row size", c)?,
            to_i32(op, "offset", offset)?,
        );
        launch!(self.st()?, op, "write_axis1_f32", cfg_1d(total as usize); dp, sp, total, ni, capi, ci, offi);
        Ok(())
    }

    fn write_axis1_from_rows(&self, dst: &mut Array, src: &Array, offset: usize) -> Result<()> {
        let op = "write_axis1_from_rows";
        let (&[a, cap, c], &[n, sa, sc]) = (dst.shape(), src.shape()) else {
            return Err(Error::shape(op, format!("expected 3-d arrays, got {:?} and {:?}", dst.shape(), src.shape())));
        };
        if a != sa || c != sc || offset + n > cap {
            return Err(Error::shape(
                op,
                format!("cannot write {:?} (rows) into {:?} at {offset}", src.shape(), dst.shape()),
            ));
        }
        let sp = self.f32_ptr(op, "src", src)?;
        self.f32_ptr(op, "dst", dst)?;
        let total = (a * n * c) as u64;
        if total == 0 {
            return Ok(());
        }
        let dp = dst.cuda_ptr_mut()?;
        let (ai, capi, ci, offi) = (
            to_i32(op, "heads", a)?,
            to_i32(op, "capacity", cap)?,
            to_i32(op, "row size", c)?,
            to_i32(op, "offset", offset)?,
        );
        launch!(self.st()?, op, "write_axis1_rows_f32", cfg_1d(total as usize); dp, sp, total, ai, capi, ci, offi);
        Ok(())
    }

    fn transpose01(&self, x: &Array) -> Result<Array> {
        let op = "transpose01";
        let [a, b, c] = *x.shape() else {
            return Err(Error::shape(op, format!("expected [A, B, C], got {:?}", x.shape())));
        };
        let xp = self.f32_ptr(op, "x", x)?;
        let out = self.output(&[b, a, c], DType::F32, false)?;
        let n = x.len() as u64;
        if n > 0 {
            let o = out.cuda_ptr()?;
            let (ai, bi, ci) = (to_i32(op, "A", a)?, to_i32(op, "B", b)?, to_i32(op, "C", c)?);
            launch!(self.st()?, op, "transpose01_f32", cfg_1d(n as usize); o, xp, ai, bi, ci, n);
        }
        Ok(out)
    }

    fn add(&self, a: &Array, b: &Array) -> Result<Array> {
        self.binary("add", "add_f32", a, b)
    }

    fn add_bias(&self, x: &Array, bias: &Array) -> Result<Array> {
        let op = "add_bias";
        if x.shape().is_empty() {
            return Err(Error::shape(op, "input is 0-d"));
        }
        let cols = x.dim(-1);
        if bias.len() != cols {
            return Err(Error::shape(op, format!("bias of {} for rows of {cols}", bias.len())));
        }
        let xp = self.f32_ptr(op, "x", x)?;
        let b_dt = float_code(op, "bias", bias)?;
        let bp = self.ptr(op, "bias", bias)?;
        let out = self.output(x.shape(), DType::F32, false)?;
        let n = x.len() as u64;
        if n > 0 {
            let (o, cols) = (out.cuda_ptr()?, cols as u64);
            launch!(self.st()?, op, "add_bias_f32", cfg_1d(n as usize); o, xp, bp, b_dt, n, cols);
        }
        Ok(out)
    }

    fn silu_mul(&self, gate: &Array, up: &Array) -> Result<Array> {
        self.binary("silu_mul", "silu_mul_f32", gate, up)
    }

    fn slice_rows(&self, x: &Array, start: usize, end: usize) -> Result<Array> {
        let op = "slice_rows";
        if x.shape().is_empty() {
            return Err(Error::shape(op, "input is 0-d"));
        }
        let m = x.dim(0);
        if start > end || end > m {
            return Err(Error::shape(op, format!("rows {start}..{end} of {m}")));
        }
        self.f32_ptr(op, "x", x)?;
        let row = x.len() / m.max(1);
        let mut shape = x.shape().to_vec();
        shape[0] = end - start;
        // A view sharing x's memory: arrays are values, and writes copy first.
        Ok(x.window(shape, start * row * 4))
    }

    fn argmax(&self, x: &Array) -> Result<Array> {
        let op = "argmax";
        if x.shape().is_empty() || x.dim(-1) == 0 {
            return Err(Error::shape(op, format!("cannot take the argmax of rows of {:?}", x.shape())));
        }
        let n = x.dim(-1);
        let xp = self.f32_ptr(op, "x", x)?;
        let shape = &x.shape()[..x.shape().len() - 1];
        let out = self.output(shape, DType::U32, false)?;
        let rows = x.len() / n;
        if rows > 0 {
            let (o, ni) = (out.cuda_ptr()?, to_i32(op, "row length", n)?);
            let grid = u32::try_from(rows).map_err(|_| Error::Unsupported(format!("{op}: {rows} rows")))?;
            let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            launch!(self.st()?, op, "argmax_f32", cfg; o, xp, ni);
        }
        Ok(out)
    }

    // gpt-oss: not built on CUDA yet; the CPU backend has them.

    fn attention_sinks(
        &self,
        _q: &Array,
        _k: &Array,
        _v: &Array,
        _kv_len: usize,
        _scale: f32,
        _sinks: &[f32],
    ) -> Result<Array> {
        Err(not_on_cuda("attention_sinks (gpt-oss attention sinks)"))
    }

    fn swiglu_oai(&self, _gate: &Array, _up: &Array, _alpha: f32, _limit: f32) -> Result<Array> {
        Err(not_on_cuda("swiglu_oai (gpt-oss's clamped SwiGLU)"))
    }

    fn scale(&self, _x: &Array, _s: f32) -> Result<Array> {
        Err(not_on_cuda("scale"))
    }
}

/// The error of an op the CUDA backend does not have yet.
fn not_on_cuda(op: &str) -> Error {
    Error::Unsupported(format!("{op} is not yet implemented on CUDA; run this model with --device cpu"))
}
