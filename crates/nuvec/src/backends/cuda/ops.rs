//! The [`Backend`] ops on a CUDA device: shape checks as the CPU backend does them, then kernel
//! launches (see `kernels/`) and cuBLAS calls enqueued on the device's stream.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::LaunchConfig;

use super::graph::{StepPos, STEP_TOKEN};
use super::{state, DeviceBuffer, State};
use crate::{Array, Backend, DType, Device, Error, GatedDeltaDims, Matrix, QuantMode, QuantSpec, Result};

// How kernels are launched: argument types, `launch!` and the CUDA-graph hooks (macros, so first).
#[macro_use]
mod launch;
use launch::{cfg_1d, to_i32};
// The f32 products on cuBLAS.
mod blas;
// Row norms and the pending scale of a folded norm.
mod norm;
// The first maximum of each row.
mod argmax;
// A certified categorical draw per row.
mod sample;

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
/// Threads per block of the split-key attention kernel (`ATTS_WARPS` warps), the most head
/// size it takes, and the blocks a decode step should spread over (about 4 per multiprocessor
/// of an H200).
const ATTS_THREADS: u32 = 128;
const ATTS_MAX_DIM: usize = 512;
const ATTS_TARGET_BLOCKS: usize = 512;
/// Queries from which attention runs as SGEMM + softmax + SGEMM per head (prefill), and the
/// most bytes of scores that path keeps at once.
const ATTN_GEMM_MIN_QUERIES: usize = 64;
const ATTN_GEMM_SCORE_BYTES: usize = 1 << 30;

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
    /// The backend of device `ordinal` (one per process). Every op on a GPU array asks for it,
    /// so the first devices are found without a lock.
    pub fn get(ordinal: usize) -> &'static CudaBackend {
        const FIXED: usize = 16;
        static FIRST: [CudaBackend; FIXED] = {
            let mut all = [const { CudaBackend { ordinal: 0 } }; FIXED];
            let mut i = 0;
            while i < FIXED {
                all[i].ordinal = i;
                i += 1;
            }
            all
        };
        if let Some(b) = FIRST.get(ordinal) {
            return b;
        }
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
        self.on_device(op, name, a)?;
        a.cuda_ptr()
    }

    /// The device address and float dtype code of an optional row a kernel adds (a bias), or
    /// `(0, DT_F32)` for none: the kernels read a null pointer as "no row".
    fn opt_float_ptr(&self, op: &'static str, name: &str, a: Option<&Array>) -> Result<(u64, i32)> {
        match a {
            Some(a) => Ok((self.ptr(op, name, a)?, float_code(op, name, a)?)),
            None => Ok((0, DT_F32)),
        }
    }

    /// An error unless `a` lives on this device.
    fn on_device(&self, op: &'static str, name: &str, a: &Array) -> Result<()> {
        if a.device() != self.dev() {
            return Err(Error::Device(format!(
                "{op}: {name} is on {} but the op runs on {}; move it with to_device({:?})",
                a.device(),
                self.dev(),
                self.dev()
            )));
        }
        Ok(())
    }

    /// Like `ptr`, for an f32 activation.
    fn f32_ptr(&self, op: &'static str, name: &str, a: &Array) -> Result<u64> {
        self.f32_check(op, name, a)?;
        a.cuda_ptr()
    }

    /// `f32_ptr`'s checks, without taking the address (which settles a pending norm's output).
    fn f32_check(&self, op: &'static str, name: &str, a: &Array) -> Result<()> {
        if a.dtype() != DType::F32 {
            return Err(Error::shape(op, format!("activations must be float32, got {} for {name}", a.dtype())));
        }
        self.on_device(op, name, a)
    }

    /// Whether `x` can be the input of the fused and few-row paths: an f32 array of at least one
    /// axis on this device, and `up` (silu(x) * up), where given, the same.
    fn plain_input(&self, x: &Array, up: Option<&Array>) -> bool {
        let f32_here = |a: &Array| !a.shape().is_empty() && a.dtype() == DType::F32 && a.device() == self.dev();
        f32_here(x) && up.is_none_or(|u| u.shape() == x.shape() && f32_here(u))
    }

    /// The addresses and dtype code of a cache's keys and values: one float dtype for both (f32,
    /// f16 or bf16), on this device.
    fn kv_ptrs(&self, op: &'static str, k: &Array, v: &Array) -> Result<(u64, u64, i32)> {
        if k.dtype() != v.dtype() {
            return Err(Error::shape(op, format!("keys are {} but values {}", k.dtype(), v.dtype())));
        }
        let dt = float_code(op, "keys", k)?;
        Ok((self.ptr(op, "k", k)?, self.ptr(op, "v", v)?, dt))
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

    /// [`DeviceBuffer::upload_shared`]: a read-only device copy of a step's table.
    fn upload_shared<T: bytemuck::Pod>(&self, data: &[T]) -> Result<std::sync::Arc<DeviceBuffer>> {
        DeviceBuffer::upload_shared(self.st()?, bytemuck::cast_slice(data))
    }
}

/// Whether the split-key attention kernels can read these rows: head sizes a multiple of 4, the
/// queries 16-byte aligned, and keys and values aligned for their loads of 4 values (one 16-byte
/// word of f32, one 8-byte word of f16 or bf16).
pub(super) fn split_rows_aligned(d: usize, qp: u64, kp: u64, vp: u64, kv_dt: i32) -> bool {
    let row_align = if kv_dt == DT_F32 { 16 } else { 8 };
    d.is_multiple_of(4) && qp.is_multiple_of(16) && (kp | vp).is_multiple_of(row_align)
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

/// The row norms' virtual threads for rows of `d` (kernels/common.cuh `norm_vthreads`): a thread
/// per 4 values, in whole warps, 32 to 1024.
pub(super) fn norm_vthreads(d: usize) -> usize {
    d.div_ceil(4).next_multiple_of(32).clamp(32, 1024)
}

/// Threads per block of the row-norm kernels (`rms_norm_f32`, `add_rms_norm_f32`) for `rows` rows
/// of `d`: the kernels sum a row as `norm_vthreads(d)` virtual threads do (a thread per 4 values,
/// 32 to 1024; common.cuh), whatever the block, so every shape adds in one order. A block runs
/// 1 virtual thread per thread for a few rows (decode: the most threads on one row), 4 for many
/// (prefill: four loads in flight per thread and four times the rows per SM; a 511 x 4096
/// add_rms_norm took 17.8 us with 1024-thread blocks and 11.3 us with 256 under ncu on the H200).
pub(super) fn norm_threads(d: usize, rows: usize) -> u32 {
    let virtual_threads = norm_vthreads(d);
    let per_thread =
        if rows < 64 { 1 } else { [4, 2, 1].into_iter().find(|f| virtual_threads.is_multiple_of(32 * f)).unwrap_or(1) };
    (virtual_threads / per_thread) as u32
}

/// Whether rows of `d` f32 values at these device addresses can be read 4 at a time (16-byte
/// loads): every row start is then 16-byte aligned.
pub(super) fn rows_vectorizable(d: usize, ptrs: &[u64]) -> bool {
    d.is_multiple_of(4) && ptrs.iter().all(|p| p.is_multiple_of(16))
}

// The one-row and few-row GEMVs over quantized weights (kernels/linear.cu): shapes, the integer
// GEMVs' parts of x, the multi-weight launch.
mod gemv;
use gemv::{fast_path_log_group, int_gemvs, int_parts_bytes, qgemv4_variant};
// Attention over a contiguous cache: split-key + merge for decode, SGEMM per head for prefill
// (kernels/attention.cu).
mod attention;
// The o and down projections with the residual add and the next norm (kernels/linear.cu
// qgemv_norm_b4_i4).
mod norm_fold;
// fpquant: linear and embed over mxfp4, mxfp8 and nvfp4 weights (kernels/fp_linear.cu).
mod fp;
// Qwen3.5 hybrids: the Gated DeltaNet ops (kernels/gated_delta.cu).
mod gated_delta;
// gpt-oss: the clamped SwiGLU (kernels/gpt_oss.cu) and the attention sinks' device tables.
mod gpt_oss;
mod moe;
mod moe_router;
pub use moe::{set_moe_gather_rows, set_moe_grouped_rows};
mod paged;
// a paged cache's quantized keys and values (kernels/kv_quant.cu)
mod kv_quant;
// which sequences of a paged decode step share their first keys
mod shared_prefix;
// keys and values of f16 or bf16: conversions on the device
mod convert;

// decode fusions (kernels/fused.cu).
mod fused;

// Phase 4: tensor-core prefill (bf16 weight products and attention, kernels/prefill.cu) and the
// process-wide matmul precision that selects it.
pub(super) mod prefill;
pub use prefill::{matmul_precision, set_matmul_precision, MatmulPrecision};

// gated MLP fusion: silu(gate) * up in the gate/up GEMV (kernels/linear.cu).
mod gate_up;

// Batched decode: products of 2 to 32 rows on the tensor cores (kernels/qmma.cu).
pub(super) mod qmma;
// Batched decode over 4-bit weights: products of 2 to 64 rows in integers (kernels/qimma.cu).
pub(super) mod qimma;
use qmma::QmmaInput;

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
                if q.spec.mode != QuantMode::Affine {
                    // fpquant: the floating-point modes have their own kernels (ops/fp.rs), for
                    // linear and embed only.
                    return Err(Error::Unsupported(format!(
                        "{op}: {} weights are not yet implemented on CUDA; run this model on the CPU",
                        q.spec.mode.name()
                    )));
                }
                let QuantSpec { bits, group_size, .. } = q.spec;
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

    /// A device copy of a rope frequency table, uploaded once per distinct table and kept, so
    /// that a decode step copies nothing from the host for rope.
    fn rope_table(&self, freqs: &[f32]) -> Result<u64> {
        static TABLES: ConstantTables = ConstantTables::new();
        TABLES.get(self, freqs)
    }

    /// `x [.., N]` with `row [N]` (f32, f16 or bf16) applied to each row by `kernel`.
    fn by_columns(&self, op: &'static str, kernel: &str, x: &Array, row: &Array) -> Result<Array> {
        if x.shape().is_empty() {
            return Err(Error::shape(op, "input is 0-d"));
        }
        let cols = x.dim(-1);
        if row.len() != cols {
            return Err(Error::shape(op, format!("a row of {} for rows of {cols}", row.len())));
        }
        let xp = self.f32_ptr(op, "x", x)?;
        let r_dt = float_code(op, "row", row)?;
        let rp = self.ptr(op, "row", row)?;
        let out = self.output(x.shape(), DType::F32, false)?;
        let n = x.len() as u64;
        if n > 0 {
            let (o, cols) = (out.cuda_ptr()?, cols as u64);
            launch!(self.st()?, op, kernel, cfg_1d(n as usize); o, xp, rp, r_dt, n, cols);
        }
        Ok(out)
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
        if let Matrix::Quantized(q) = w {
            if q.spec.mode != QuantMode::Affine {
                return self.fp_linear(x, q);
            }
        }
        self.f32_check(op, "x", x)?;
        let wa = self.weight_args(op, w)?;
        let m = x.len() / k.max(1);
        let n = w.rows();
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("x has at least one axis") = n;
        // A few rows over 4-bit weights (a batched decode step) in integers on the tensor cores
        // (ops/qimma.rs: 2 to 16 rows by default, NUVEC_QIMMA picks).
        if let Some(mut outs) = self.qimma_many(op, x, &[w], None)? {
            return Ok(outs.remove(0));
        }
        let out = self.output(&shape, DType::F32, k == 0)?;
        if m == 0 || n == 0 || k == 0 {
            return Ok(out);
        }
        let o = out.cuda_ptr()?;
        // A few rows of a half-precision model (a batched decode step) on the tensor cores, x
        // taken in two bf16 parts so that the products keep f32 accuracy.
        let bf16_from = qmma::bf16_rows_from();
        if (2..=GEMV_MAX_ROWS).contains(&m)
            && m < bf16_from
            && self.st()?.matmul_precision().bf16_weight(wa.w_dt, wa.p_dt, crate::compute_dtype_hint())
            && self.qmma(op, o, QmmaInput::F32Split(x.cuda_ptr()?), m, n, k, &wa)?
        {
            return Ok(out);
        }
        if (bf16_from.max(2)..=GEMV_MAX_ROWS).contains(&m) && self.prefill_linear(op, o, x.cuda_ptr()?, m, n, k, &wa)? {
            return Ok(out);
        }
        // The fast quantized GEMV first: its integer variants read x's parts, not x (a norm's
        // output with its scale pending stays pending for them; every other path reads x).
        if m <= GEMV_MAX_ROWS && wa.w_dt != DT_F32 && self.fast_qgemv(op, o, x, m, n, k, &wa)? {
            return Ok(out);
        }
        let xp = x.cuda_ptr()?;
        if m > GEMV_MAX_ROWS && self.prefill_linear(op, o, xp, m, n, k, &wa)? {
            // phase 4: bf16 on the tensor cores (ops/prefill.rs), under MatmulPrecision::Bf16 (or
            // Auto and a half-precision weight)
        } else if wa.w_dt == DT_F32 {
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
                if !self.fast_dequant(op, scratch.ptr(), r0, rows, k, &wa)? {
                    self.gather_rows(op, scratch.ptr(), 0, r0, rows, k, &wa)?;
                }
                self.sgemm(op, o + (r0 * 4) as u64, xp, scratch.ptr(), m, rows, k, n)?;
                r0 += rows;
            }
        }
        Ok(out)
    }

    fn linear_many_bias(&self, x: &Array, ws: &[&Matrix], biases: &[&Array]) -> Result<Vec<Array>> {
        // One input row: the biases added in the products' launch.
        if biases.len() == ws.len() {
            if let Some(outs) = self.fused_qgemv("linear_many_bias", x, ws, Some(biases))? {
                return Ok(outs);
            }
        }
        crate::backend::linear_many_bias_composed(self, x, ws, biases)
    }

    fn linear_many(&self, x: &Array, ws: &[&Matrix]) -> Result<Vec<Array>> {
        if let Some(outs) = self.fused_qgemv("linear_many", x, ws, None)? {
            return Ok(outs);
        }
        // A few rows over 4-bit weights, x split once for all of them (ops/qimma.rs).
        if let Some(outs) = self.qimma_many("linear_many", x, ws, None)? {
            return Ok(outs);
        }
        // phase 4: prefill in bf16, the input converted once for all the weights (ops/prefill.rs)
        if let Some(outs) = self.prefill_linear_many("linear_many", x, ws, None)? {
            return Ok(outs);
        }
        ws.iter().map(|w| self.linear(x, w)).collect()
    }

    fn silu_mul_linear(&self, gate: &Array, up: &Array, w: &Matrix) -> Result<Array> {
        // Decode: silu(gate) * up is one small launch, then the plain GEMV. Folding it into the
        // GEMV made every block of the down projection recompute all of it (an exp and a
        // division per value per block): the 8B's down projection took 45 us that way against
        // 37 us for gate and up together (twice its bytes; ncu, H200).
        if let Some(mut outs) = self.qimma_many("silu_mul_linear", gate, &[w], Some(up))? {
            return Ok(outs.remove(0));
        }
        // phase 4: prefill in bf16, silu(gate) * up made in bf16 in one pass (ops/prefill.rs)
        if let Some(mut outs) = self.prefill_linear_many("silu_mul_linear", gate, &[w], Some(up))? {
            return Ok(outs.remove(0));
        }
        self.linear(&self.silu_mul(gate, up)?, w)
    }

    fn embed(&self, table: &Matrix, ids: &[u32]) -> Result<Array> {
        let op = "embed";
        let (v, d) = (table.rows(), table.cols());
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= v) {
            return Err(Error::shape(op, format!("token id {bad} is outside the vocabulary of {v}")));
        }
        if let Matrix::Quantized(q) = table {
            if q.spec.mode != QuantMode::Affine {
                return self.fp_embed(q, ids);
            }
        }
        let wa = self.weight_args(op, table)?;
        let out = self.output(&[ids.len(), d], DType::F32, false)?;
        if ids.is_empty() || d == 0 {
            return Ok(out);
        }
        if let [id] = ids {
            // A decode step's one token goes as the first row: nothing to upload.
            let o = out.cuda_ptr()?;
            let step = self.st()?.step_scalars();
            if step == 0 {
                self.gather_rows(op, o, 0, *id as usize, 1, d, &wa)?;
            } else {
                // CUDA graphs: the one id is the step's token, read from the step scalars.
                self.gather_rows(op, o, step + 4 * STEP_TOKEN, 0, 1, d, &wa)?;
                guard!(self.st()?, |at| (at.token as usize) < v);
            }
            return Ok(out);
        }
        let idb = self.upload(ids)?;
        self.gather_rows(op, out.cuda_ptr()?, idb.ptr(), 0, ids.len(), d, &wa)?;
        Ok(out)
    }

    fn embed_spliced(&self, table: &Matrix, ids: &[u32], picks: &Array, spliced: &[(usize, usize)]) -> Result<Array> {
        let op = "embed_spliced";
        crate::backend::check_spliced(ids, picks, spliced)?;
        let affine = match table {
            Matrix::Quantized(q) => q.spec.mode == QuantMode::Affine,
            Matrix::Dense(_) => true,
        };
        let (v, d) = (table.rows(), table.cols());
        if !affine || spliced.is_empty() || d == 0 || self.st()?.step_scalars() != 0 {
            return crate::backend::embed_spliced_default(self, table, ids, picks, spliced);
        }
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= v) {
            return Err(Error::shape(op, format!("token id {bad} is outside the vocabulary of {v}")));
        }
        let pp = self.ptr(op, "picks", picks)?;
        let wa = self.weight_args(op, table)?;
        let out = self.output(&[ids.len(), d], DType::F32, false)?;
        let idb = self.upload(ids)?;
        let pairs: Vec<i32> =
            spliced.iter().flat_map(|&(row, pick)| [row, pick]).map(|x| to_i32(op, "row", x)).collect::<Result<_>>()?;
        let pairs = self.upload(&pairs)?;
        let (ip, pr) = (idb.ptr(), pairs.ptr());
        let (count, vi) = (to_i32(op, "spliced rows", spliced.len())?, to_i32(op, "vocabulary", v)?);
        launch!(self.st()?, op, "splice_ids_u32", cfg_1d(spliced.len()); ip, pp, pr, count, vi);
        self.gather_rows(op, out.cuda_ptr()?, ip, 0, ids.len(), d, &wa)?;
        Ok(out)
    }

    fn rms_norm(&self, x: &Array, weight: &Array, eps: f32) -> Result<Array> {
        self.rms_norm_rows(x, weight, eps)
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
        let fp = self.rope_table(if inv_freqs.is_empty() { &[0f32][..] } else { inv_freqs })?;
        let o = out.cuda_ptr()?;
        let (half, hi, di) = (half as i32, to_i32(op, "heads", h)?, to_i32(op, "head size", d)?);
        let (offset, trad) = (offset as i64, traditional as i32);
        // CUDA graphs: while capturing, the kernel adds the step's delta to the offset.
        let step = self.st()?.step_scalars();
        launch!(self.st()?, op, "rope_f32", cfg_1d(n as usize); o, xp, fp, half, hi, di, offset, trad, n, step);
        guard!(self.st()?, |_at| true);
        Ok(out)
    }

    fn attention(&self, q: &Array, k: &Array, v: &Array, kv_len: usize, scale: f32) -> Result<Array> {
        self.attention_over(q, k, v, kv_len, scale, None, None, false)
    }

    fn write_axis1(&self, dst: &mut Array, src: &Array, offset: usize) -> Result<()> {
        self.write_axis1_at(dst, src, offset, None)
    }

    fn write_axis1_ring(&self, dst: &mut Array, src: &Array, offset: usize, keep: usize) -> Result<()> {
        self.write_axis1_at(dst, src, offset, Some(keep))
    }

    fn attention_ring(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        kv_len: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        if let Some(s) = sinks.filter(|s| q.shape().len() != 3 || s.len() != q.dim(1)) {
            return Err(Error::shape(
                "attention_ring",
                format!("{} sinks for q {:?} (one per query head)", s.len(), q.shape()),
            ));
        }
        self.attention_over(q, k, v, kv_len, scale, sinks, None, true)
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
        // A cache of f16 or bf16 takes the rows rounded to its type.
        let dst_dt = float_code(op, "dst", dst)?;
        self.on_device(op, "dst", dst)?;
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
        // CUDA graphs: while capturing, the kernel adds the step's delta to the offset.
        let step = self.st()?.step_scalars();
        launch!(self.st()?, op, "write_axis1_rows", cfg_1d(total as usize);
            dp, dst_dt, sp, total, ai, capi, ci, offi, step);
        guard!(self.st()?, |at| offset + at.delta + n <= cap);
        Ok(())
    }

    fn transpose01(&self, x: &Array) -> Result<Array> {
        let op = "transpose01";
        let [a, b, c] = *x.shape() else {
            return Err(Error::shape(op, format!("expected [A, B, C], got {:?}", x.shape())));
        };
        // Elements of 4 bytes (f32) or 2 (a cache of f16 or bf16) keep their type.
        let kernel = match float_code(op, "x", x)? {
            DT_F32 => "transpose01_f32",
            _ => "transpose01_u16",
        };
        let xp = self.ptr(op, "x", x)?;
        let out = self.output(&[b, a, c], x.dtype(), false)?;
        let n = x.len() as u64;
        if n > 0 {
            let o = out.cuda_ptr()?;
            let (ai, bi, ci) = (to_i32(op, "A", a)?, to_i32(op, "B", b)?, to_i32(op, "C", c)?);
            launch!(self.st()?, op, kernel, cfg_1d(n as usize); o, xp, ai, bi, ci, n);
        }
        Ok(out)
    }

    fn add(&self, a: &Array, b: &Array) -> Result<Array> {
        self.binary("add", "add_f32", a, b)
    }

    fn add_bias(&self, x: &Array, bias: &Array) -> Result<Array> {
        self.by_columns("add_bias", "add_bias_f32", x, bias)
    }

    fn mul_columns(&self, x: &Array, w: &Array) -> Result<Array> {
        self.by_columns("mul_columns", "mul_columns_f32", x, w)
    }

    fn add_linear(&self, y: &Array, t: &Array, w: &Array) -> Result<Array> {
        let op = "add_linear";
        let (n, r) = crate::backend::check_add_linear(y, t, w)?;
        let (yp, tp, wp) = (self.f32_ptr(op, "y", y)?, self.f32_ptr(op, "t", t)?, self.f32_ptr(op, "w", w)?);
        let out = self.output(y.shape(), DType::F32, false)?;
        let total = y.len() as u64;
        if total > 0 {
            let (o, n, r) = (out.cuda_ptr()?, n as u64, r as i32);
            launch!(self.st()?, op, "add_linear_f32", cfg_1d(total as usize); o, yp, tp, wp, total, n, r);
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
        float_code(op, "x", x)?;
        self.on_device(op, "x", x)?;
        let row = x.len() / m.max(1);
        let mut shape = x.shape().to_vec();
        shape[0] = end - start;
        // A view sharing x's memory: arrays are values, and writes copy first.
        Ok(x.window(shape, start * row * x.dtype().size()))
    }

    fn argmax(&self, x: &Array) -> Result<Array> {
        self.argmax_first(x)
    }

    // ---- Gated DeltaNet (kernels/gated_delta.cu, launched by ops/gated_delta.rs) ----

    fn causal_conv1d_silu(&self, x: &Array, state: &Array, weight: &Array) -> Result<(Array, Array)> {
        self.conv1d_silu(x, state, weight)
    }

    fn gated_delta(
        &self,
        mixed: &Array,
        a: &Array,
        b: &Array,
        a_log: &Array,
        dt_bias: &Array,
        state: &Array,
        dims: GatedDeltaDims,
    ) -> Result<(Array, Array)> {
        self.gated_delta_rule(mixed, [a, b], [a_log, dt_bias], state, dims)
    }

    fn sigmoid_mul(&self, gate: &Array, x: &Array) -> Result<Array> {
        self.binary("sigmoid_mul", "sigmoid_mul_f32", gate, x)
    }

    // Gemma 4
    fn gelu_mul(&self, gate: &Array, up: &Array) -> Result<Array> {
        self.binary("gelu_mul", "gelu_mul_f32", gate, up)
    }

    fn scale(&self, x: &Array, s: f32) -> Result<Array> {
        self.with_scalar("scale", "scale_f32", x, s)
    }

    fn softcap(&self, x: &Array, cap: f32) -> Result<Array> {
        if !(cap > 0.0 && cap.is_finite()) {
            return Err(Error::shape("softcap", format!("cap must be a positive number, got {cap}")));
        }
        self.with_scalar("softcap", "softcap_f32", x, cap)
    }

    // gpt-oss (sinks: an argument of the attention kernels; swiglu_oai: kernels/gpt_oss.cu,
    // launched by ops/gpt_oss.rs)

    fn attention_sinks(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        kv_len: usize,
        scale: f32,
        sinks: &[f32],
    ) -> Result<Array> {
        if q.shape().len() != 3 || sinks.len() != q.dim(1) {
            return Err(Error::shape(
                "attention_sinks",
                format!("{} sinks for q {:?} (one per query head)", sinks.len(), q.shape()),
            ));
        }
        self.attention_over(q, k, v, kv_len, scale, Some(sinks), None, false)
    }

    fn attention_window(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        kv_len: usize,
        scale: f32,
        window: usize,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        crate::backend::check_attention_window(q, k, v, kv_len, window, sinks)?;
        self.attention_over(q, k, v, kv_len, scale, sinks, Some(window), false)
    }

    fn moe_route(&self, logits: &Array, top_k: usize, routing: crate::MoeRouting) -> Result<(Array, Array)> {
        self.route_experts(logits, None, top_k, routing)
    }

    fn moe_route_bias(
        &self,
        logits: &Array,
        bias: &Array,
        top_k: usize,
        routing: crate::MoeRouting,
    ) -> Result<(Array, Array)> {
        self.route_experts(logits, Some(bias), top_k, routing)
    }

    fn moe_route_linear(
        &self,
        x: &Array,
        router: &Matrix,
        bias: Option<&Array>,
        top_k: usize,
        routing: crate::MoeRouting,
    ) -> Result<(Array, Array)> {
        self.route_linear(x, router, bias, top_k, routing)
    }

    fn moe_experts(&self, x: &Array, experts: &crate::Experts, ids: &Array, weights: &Array) -> Result<Array> {
        self.run_experts(x, experts, ids, weights)
    }

    fn expert_index(&self, experts: &crate::Experts) -> Result<Option<crate::ExpertIndex>> {
        self.experts_index(experts)
    }

    fn add_sigmoid_gated(&self, a: &Array, b: &Array, gate: &Array) -> Result<Array> {
        self.sigmoid_gated_add(a, b, gate)
    }

    fn swiglu_oai(&self, gate: &Array, up: &Array, alpha: f32, limit: f32) -> Result<Array> {
        self.swiglu_oai_clamped(gate, up, alpha, limit)
    }

    fn rope_qk_write_paged(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        qk_norm: Option<(&Array, &Array, f32)>,
        inv_freqs: &[f32],
        traditional: bool,
        rows: (&[usize], &[usize]),
        stores: (&mut Array, &mut Array),
    ) -> Result<Array> {
        self.fused_rope_qk_write_paged(q, k, v, qk_norm, inv_freqs, traditional, rows, stores)
    }

    fn paged_decode_attention(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        seqs: &[crate::PagedSeq<'_>],
        block_size: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        self.paged_attention(q, k, v, seqs, block_size, scale, sinks)
    }

    fn paged_decode_attention_quantized(
        &self,
        q: &Array,
        k: &crate::Quantized,
        v: &crate::Quantized,
        seqs: &[crate::PagedSeq<'_>],
        block_size: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        self.paged_attention_quantized(q, k, v, seqs, block_size, scale, sinks)
    }

    fn copy_rows_within(&self, a: &mut Array, from: usize, to: usize, n: usize) -> Result<()> {
        self.rows_within(a, from, to, n)
    }

    fn quantize_rows_into(&self, rows: &Array, store: &mut crate::Quantized, slots: &[usize]) -> Result<()> {
        self.kv_quantize_rows(rows, store, slots)
    }

    fn dequantize_paged(
        &self,
        store: &crate::Quantized,
        heads: usize,
        table: &[u32],
        block_size: usize,
        from: usize,
        to: usize,
    ) -> Result<Array> {
        self.kv_dequantize_paged(store, heads, table, block_size, from, to)
    }
    // decode fusions (ops/fused.rs)

    fn add_rms_norm(&self, a: &Array, b: &Array, weight: &Array, eps: f32) -> Result<(Array, Array)> {
        self.fused_add_rms_norm(a, b, None, weight, eps)
    }

    fn add_bias_rms_norm(
        &self,
        a: &Array,
        b: &Array,
        bias: &Array,
        weight: &Array,
        eps: f32,
    ) -> Result<(Array, Array)> {
        self.fused_add_rms_norm(a, b, Some(bias), weight, eps)
    }

    fn linear_add_rms_norm(
        &self,
        x: &Array,
        w: &Matrix,
        residual: &Array,
        weight: &Array,
        eps: f32,
    ) -> Result<(Array, Array)> {
        match self.fused_linear_add_rms_norm(x, w, residual, weight, eps)? {
            Some(out) => Ok(out),
            None => crate::backend::linear_add_rms_norm_composed(self, x, w, residual, weight, eps),
        }
    }

    fn rope_qk(
        &self,
        q: &Array,
        k: &Array,
        qk_norm: Option<(&Array, &Array, f32)>,
        inv_freqs: &[f32],
        offset: usize,
        traditional: bool,
    ) -> Result<(Array, Array)> {
        self.fused_rope_qk(q, k, qk_norm, inv_freqs, offset, traditional)
    }

    fn write_kv_rows(
        &self,
        k_cache: &mut Array,
        v_cache: &mut Array,
        k: &Array,
        v: &Array,
        offset: usize,
    ) -> Result<()> {
        self.fused_write_kv_rows(k_cache, v_cache, k, v, offset)
    }

    fn argmax_gap(&self, x: &Array) -> Result<Array> {
        self.fused_argmax_gap(x)
    }

    fn mask_rows(&self, x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
        self.masked_rows(x, bits, fill)
    }

    fn masked_argmax_gap(&self, x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
        self.fused_masked_argmax_gap(x, bits, fill)
    }

    fn sample_rows(&self, x: &Array, scales: &[f32], uniforms: &[f64]) -> Result<Array> {
        self.sampled_rows(x, scales, uniforms)
    }

    // gated MLP fusion (ops/gate_up.rs)

    fn gate_up_silu(&self, x: &Array, gate: &Matrix, up: &Matrix) -> Result<Array> {
        match self.fused_gate_up_silu(x, gate, up)? {
            Some(hidden) => Ok(hidden),
            None => crate::backend::gate_up_silu_composed(self, x, gate, up),
        }
    }

    // rope with the cache write (ops/fused.rs)

    #[allow(clippy::too_many_arguments)]
    fn rope_qk_write_kv(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        qk_norm: Option<(&Array, &Array, f32)>,
        inv_freqs: &[f32],
        offset: usize,
        traditional: bool,
        cache: (&mut Array, &mut Array, usize),
    ) -> Result<Array> {
        self.fused_rope_qk_write_kv(q, k, v, qk_norm, inv_freqs, offset, traditional, cache)
    }
}

// Gemma 4
impl CudaBackend {
    /// An elementwise kernel `(out, x, scalar, n)` over all of `x`.
    fn with_scalar(&self, op: &'static str, kernel: &str, x: &Array, s: f32) -> Result<Array> {
        let xp = self.f32_ptr(op, "x", x)?;
        let out = self.output(x.shape(), DType::F32, false)?;
        let (o, n) = (out.cuda_ptr()?, x.len() as u64);
        if n > 0 {
            launch!(self.st()?, op, kernel, cfg_1d(n as usize); o, xp, s, n);
        }
        Ok(out)
    }
}

/// Small f32 tables the kernels read (rope frequencies, attention sinks), one device copy per
/// distinct table and device, found by value in a short list (no key is built per call: lookups
/// run in every layer of every decode step). Copies are kept for the process and never freed:
/// a launch enqueued by another thread, or a captured CUDA graph, may still read an address
/// handed out earlier (a model has a handful of tables, a few KB each).
pub(super) struct ConstantTables(OnceLock<Mutex<Vec<ConstantTable>>>);

/// One table: its device ordinal, its values, its device copy.
type ConstantTable = (usize, Vec<f32>, DeviceBuffer);

impl ConstantTables {
    pub(super) const fn new() -> Self {
        ConstantTables(OnceLock::new())
    }

    /// The device address of `values`' copy on `backend`'s device, uploaded on first use.
    pub(super) fn get(&self, backend: &CudaBackend, values: &[f32]) -> Result<u64> {
        let same = |t: &[f32]| t.len() == values.len() && t.iter().zip(values).all(|(a, b)| a.to_bits() == b.to_bits());
        let mut tables = self.0.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, b)) = tables.iter().find(|(o, t, _)| *o == backend.ordinal && same(t)) {
            return Ok(b.ptr());
        }
        let b = backend.upload(values)?;
        let p = b.ptr();
        tables.push((backend.ordinal, values.to_vec(), b));
        Ok(p)
    }
}
