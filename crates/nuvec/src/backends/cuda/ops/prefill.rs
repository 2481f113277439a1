//! Phase 4 (issue 7): prefill on the tensor cores. Under [`MatmulPrecision::Bf16`], `linear` of
//! more than 8 input rows runs as cuBLAS GEMMs with bf16 inputs, f32 accumulation and f32
//! outputs (`cublasGemmEx`, `CUBLAS_COMPUTE_32F`), as mlx-lm, llama.cpp and vLLM compute
//! prefill: activations are rounded to bf16 once per call, weights decoded straight to bf16 tile
//! by tile (`kernels/prefill.cu`). `attention` of 64 queries or more takes bf16 operands too:
//! a flash-attention kernel for head sizes 64 and 128 (`kernels/flash_attention.cu`; scores stay
//! on the SM), otherwise cuBLAS GEMMs around a softmax that writes bf16 probabilities. Nothing is
//! kept between calls: memory use is as with f32.
//! Under [`MatmulPrecision::F32`] and [`MatmulPrecision::Tf32`] these paths are off and the f32
//! kernels of `ops.rs` run (SGEMM, or its TF32 mode for the weight products). Under
//! [`MatmulPrecision::Auto`] (the default) they follow the checkpoint, as mlx-lm computes it: a
//! weight product takes the bf16 path when its weight is stored in half precision (dense f16/bf16,
//! or quantized with f16/bf16 scales) and the model running, if any, computes in half precision
//! ([`crate::with_compute_dtype`]), plain SGEMM otherwise; attention takes it when the model
//! running computes in half precision.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaStream, LaunchConfig};

use super::{
    cfg_1d, fast_path_log_group, to_i32, CudaBackend, QmmaInput, WeightArgs, ATTN_GEMM_SCORE_BYTES, DT_BF16, DT_F16,
    DT_F32,
};
use crate::backends::cuda::{DeviceBuffer, State};
use crate::{Array, DType, Error, Matrix, QuantMode, Result};

/// How the CUDA backend multiplies matrices on the prefill paths (`linear` of more than 8 input
/// rows, `attention` of 64 queries or more). A one-row decode (the GEMV and split-key attention
/// kernels) is f32 whatever this says: it is limited by memory, not arithmetic. A batched decode
/// step's 2 to 64 rows over 4-bit weights with bf16 scales round x and the decoded weights to
/// bf16 where this allows bf16 (`ops/qimma.rs`, `qdec_*`, up to `NUVEC_QDEC_ROWS`); other few-row
/// products run in integers or with x in two bf16 parts against the weights' exact integers,
/// which keeps f32 accuracy (kernels/qimma.cu, kernels/qmma.cu).
///
/// Process-wide: [`set_matmul_precision`], else the environment variable `NUVEC_CUDA_MATMUL`
/// (`auto`, `f32`, `tf32` or `bf16`, read once), else [`MatmulPrecision::DEFAULT`] (`Auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// f32 SGEMM: results match the CPU backend to f32 rounding (about 1e-6 relative).
    F32,
    /// The weight products on the tensor cores in TF32 (inputs rounded to 10-bit mantissas,
    /// f32 accumulation); attention as with `F32`.
    Tf32,
    /// Weight products and attention on the tensor cores with bf16 inputs (8-bit significands,
    /// relative rounding 2^-9 per input) and f32 accumulation and outputs.
    Bf16,
    // precision: the checkpoint's own type (appended)
    /// As the checkpoint computes in mlx-lm: `Bf16` for a weight stored in half precision (dense
    /// f16/bf16 weights, quantized weights with f16/bf16 scales) unless the model running
    /// computes in f32, and for attention while the model running computes in half precision
    /// ([`crate::with_compute_dtype`]); `F32` otherwise (f32 weights, f32 models, and attention
    /// called outside a model). A quantized weight in a half-precision model takes `Bf16`
    /// whatever its scales' type: a GGUF's K-quant scales (products of two f16 numbers) and its
    /// Q4_0/Q8_0 offsets are kept in f32 to be exact, not because the model computes in f32, and
    /// llama.cpp computes those products in half precision on the tensor cores.
    Auto,
}

impl MatmulPrecision {
    /// What runs when neither the setter nor `NUVEC_CUDA_MATMUL` says otherwise: `Auto`, the
    /// checkpoint's own type, as mlx-lm computes it (bf16 on the tensor cores, about 4x f32's
    /// speed on an H200, for the usual bf16 checkpoints; f32 for f32 ones; see docs/cuda.md,
    /// "Precision", for what bf16 rounds).
    pub const DEFAULT: MatmulPrecision = MatmulPrecision::Auto;

    /// The name `NUVEC_CUDA_MATMUL` takes: `f32`, `tf32`, `bf16` or `auto`.
    pub fn name(self) -> &'static str {
        match self {
            MatmulPrecision::F32 => "f32",
            MatmulPrecision::Tf32 => "tf32",
            MatmulPrecision::Bf16 => "bf16",
            MatmulPrecision::Auto => "auto",
        }
    }

    /// Whether a prefill product with the weight stored as `w_dt` (dense, dtype code) or, for a
    /// quantized weight (`w_dt < 0`), with scales of `p_dt` runs on the bf16 path. `model`: the
    /// compute type of the model running ([`crate::compute_dtype_hint`]). Under `Auto` both must
    /// be half precision, as in mlx-lm, where a product's type is the promotion of its input's
    /// (the model's activations) and its weight's: a half weight in an f32 model (an AWQ
    /// checkpoint's f16 scales beside f32 norms) computes in f32. A quantized weight in a half
    /// model is half whatever its scales (see `Auto`). Without a hint (an op called outside a
    /// model) the weight decides.
    pub(super) fn bf16_weight(self, w_dt: i32, p_dt: i32, model: Option<DType>) -> bool {
        let half = |dt: i32| dt == DT_F16 || dt == DT_BF16;
        match self {
            MatmulPrecision::Bf16 => true,
            MatmulPrecision::Auto => match model {
                None => half(if w_dt >= 0 { w_dt } else { p_dt }),
                Some(DType::F16 | DType::BF16) => w_dt < 0 || half(w_dt),
                Some(_) => false,
            },
            MatmulPrecision::F32 | MatmulPrecision::Tf32 => false,
        }
    }

    /// Whether prefill attention runs on the bf16 path; `half_model`: the model running computes
    /// in f16 or bf16 ([`crate::hint_is_half`]).
    pub(crate) fn bf16_attention(self, half_model: bool) -> bool {
        match self {
            MatmulPrecision::Bf16 => true,
            MatmulPrecision::Auto => half_model,
            MatmulPrecision::F32 | MatmulPrecision::Tf32 => false,
        }
    }

    fn code(self) -> u8 {
        match self {
            MatmulPrecision::F32 => 1,
            MatmulPrecision::Tf32 => 2,
            MatmulPrecision::Bf16 => 3,
            MatmulPrecision::Auto => 4,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(MatmulPrecision::F32),
            2 => Some(MatmulPrecision::Tf32),
            3 => Some(MatmulPrecision::Bf16),
            4 => Some(MatmulPrecision::Auto),
            _ => None,
        }
    }
}

impl fmt::Display for MatmulPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MatmulPrecision {
    type Err = Error;

    /// `auto`, `f32`, `tf32` or `bf16` (any case).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(MatmulPrecision::F32),
            "tf32" => Ok(MatmulPrecision::Tf32),
            "bf16" => Ok(MatmulPrecision::Bf16),
            "auto" => Ok(MatmulPrecision::Auto),
            _ => Err(Error::Unsupported(format!(
                "matmul precision {s:?}: the CUDA backend knows auto (the checkpoint's own type, the default), f32 (exact to f32 rounding), tf32 and bf16"
            ))),
        }
    }
}

/// The setter's choice (0: none yet).
static CHOSEN: AtomicU8 = AtomicU8::new(0);

/// Sets the prefill matmul precision of every CUDA device for the rest of the process (or until
/// the next call); it overrides `NUVEC_CUDA_MATMUL`. Ops already enqueued keep theirs.
pub fn set_matmul_precision(precision: MatmulPrecision) {
    CHOSEN.store(precision.code(), Ordering::Relaxed);
}

/// The matmul precision in force on device `ordinal`: the last [`set_matmul_precision`], else
/// the device's `NUVEC_CUDA_MATMUL` (its settings, else the environment; a value it does not
/// take fails the device's start), else [`MatmulPrecision::DEFAULT`].
pub fn matmul_precision(ordinal: usize) -> Result<MatmulPrecision> {
    Ok(crate::backends::cuda::state(ordinal)?.matmul_precision())
}

impl State {
    /// [`matmul_precision`] of this device.
    pub(crate) fn matmul_precision(&self) -> MatmulPrecision {
        chosen_or(self.knobs.matmul)
    }
}

/// The setter's choice, else `knob`.
fn chosen_or(knob: MatmulPrecision) -> MatmulPrecision {
    MatmulPrecision::from_code(CHOSEN.load(Ordering::Relaxed)).unwrap_or(knob)
}

/// Packed words per thread of `qdequant_bf16_b4` (`QDB4_WORDS` in `kernels/prefill.cu`).
const QDB4_WORDS: usize = 4;

/// Values per bf16 weight tile (128 MiB: an 8B's gate or up projection in one GEMM; random 8B
/// prefill +2 % against 64 MiB tiles on the H200, no gain from larger ones, and a loss from
/// smaller ones, docs/cuda.md).
const TILE_BF16: usize = 1 << 26;
/// Queries per block of the bf16 attention path: the scores of a block are computed for the
/// keys its last query sees, so smaller blocks skip more of the masked triangle (at 4096 queries,
/// blocks of 256 compute 53 % of the full square) while keeping the GEMMs large.
const ATTN_BF16_QUERIES: usize = 256;

/// Warps per block of the flash-attention kernel for head size `d` (`kernels/flash_attention.cu`),
/// 16 queries each.
fn flash_warps(d: usize) -> usize {
    if d == 64 {
        4
    } else {
        8
    }
}

/// Keys per tile of the flash-attention kernels (`FA_KEYS`).
const FLASH_KEYS: usize = 64;

/// Dynamic shared memory of a flash-attention kernel for head size `d`: two K and two V tiles of
/// `FLASH_KEYS` rows padded by 8 bf16 values.
pub(crate) fn flash_smem_bytes(d: usize) -> usize {
    4 * FLASH_KEYS * (d + 8) * 2
}

/// A matrix operand of [`CudaBackend::gemm_bf16`]: device address, leading dimension and the
/// stride between batch entries (elements).
type Operand = (u64, usize, usize);

impl CudaBackend {
    /// `linear` of `m > 8` rows in bf16 (`out [m, n]` at `o`, f32): false (nothing done) unless
    /// the precision puts this weight on the bf16 path (`Bf16`, or `Auto` and a half-precision
    /// weight). Shapes and pointers were checked by `linear`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn prefill_linear(
        &self,
        op: &'static str,
        o: u64,
        xp: u64,
        m: usize,
        n: usize,
        k: usize,
        w: &WeightArgs,
    ) -> Result<bool> {
        if !self.st()?.matmul_precision().bf16_weight(w.w_dt, w.p_dt, crate::compute_dtype_hint()) {
            return Ok(false);
        }
        let xb = DeviceBuffer::alloc(self.st()?, m * k * 2)?;
        self.convert_bf16(op, &self.st()?.stream, xb.ptr(), xp, DT_F32, m * k)?;
        self.linear_bf16_rows(op, o, xb.ptr(), m, n, k, w)?;
        Ok(true)
    }

    /// `linear_many` (q/k/v, gate/up) of more than 8 rows in bf16, the input converted once for
    /// all the weights; with `up`, the `silu_mul_linear` down projection of `silu(x) * up`, the
    /// input made in one pass. `None` (nothing done) unless the precision puts every weight on
    /// the bf16 path and the case is plain (f32 input on this device, dense or affine weights of
    /// `x`'s width): `linear` then runs for each weight (deciding its path, and reporting what is
    /// wrong).
    pub(super) fn prefill_linear_many(
        &self,
        op: &'static str,
        x: &Array,
        ws: &[&Matrix],
        up: Option<&Array>,
    ) -> Result<Option<Vec<Array>>> {
        if !self.plain_input(x, up) {
            return Ok(None);
        }
        let k = x.dim(-1);
        let m = x.len() / k.max(1);
        let plain = |w: &&Matrix| match w {
            Matrix::Dense(_) => w.cols() == k,
            Matrix::Quantized(q) => q.spec.mode == QuantMode::Affine && w.cols() == k,
        };
        if k == 0 || m < super::qmma::bf16_rows_from().max(2) || ws.is_empty() || !ws.iter().all(plain) {
            return Ok(None);
        }
        let precision = self.st()?.matmul_precision();
        if precision == MatmulPrecision::F32 || precision == MatmulPrecision::Tf32 {
            return Ok(None);
        }
        let args = ws.iter().map(|w| self.weight_args(op, w)).collect::<Result<Vec<_>>>()?;
        let model = crate::compute_dtype_hint();
        if !args.iter().all(|a| precision.bf16_weight(a.w_dt, a.p_dt, model)) {
            return Ok(None);
        }
        let xb = DeviceBuffer::alloc(self.st()?, m * k * 2)?;
        let (xbp, xp) = (xb.ptr(), x.cuda_ptr()?);
        match up {
            Some(u) => {
                let (up_p, nl) = (u.cuda_ptr()?, (m * k) as u64);
                // Four values per thread where aligned (the kernel's grid-stride loops cover the
                // rest either way).
                launch!(self.st()?, op, "silu_mul_bf16", cfg_1d((m * k).div_ceil(4)); xbp, xp, up_p, nl);
            }
            None => self.convert_bf16(op, &self.st()?.stream, xbp, xp, DT_F32, m * k)?,
        }
        let mut outs = Vec::with_capacity(ws.len());
        for (w, a) in ws.iter().zip(&args) {
            let n = w.rows();
            let mut shape = x.shape().to_vec();
            *shape.last_mut().expect("x has an axis") = n;
            let out = self.output(&shape, DType::F32, false)?;
            if n > 0 {
                self.linear_bf16_rows(op, out.cuda_ptr()?, xbp, m, n, k, a)?;
            }
            outs.push(out);
        }
        Ok(Some(outs))
    }

    /// `out [m, n]` f32 (at `o`) = `xb [m, k]` (bf16) times `w [n, k]`: a bf16 weight as it is,
    /// others decoded to bf16 in tiles of `TILE_BF16` values, each one GEMM into its columns.
    #[allow(clippy::too_many_arguments)]
    fn linear_bf16_rows(
        &self,
        op: &'static str,
        o: u64,
        xb: u64,
        m: usize,
        n: usize,
        k: usize,
        w: &WeightArgs,
    ) -> Result<()> {
        // A few rows (a batched decode step) read each packed weight once, decoded in registers.
        if self.qmma(op, o, QmmaInput::Bf16(xb), m, n, k, w)? {
            return Ok(());
        }
        if w.w_dt == DT_BF16 {
            // A bf16 checkpoint's weights are the GEMM's operand as they are.
            return self.gemm_bf16(op, (true, false), (n, m, k), 1.0, (w.dense, k, 0), (xb, k, 0), (o, n, 0), 1);
        }
        let tile = (TILE_BF16 / k).max(64).next_multiple_of(64).min(n);
        let st = self.st()?;
        // Each tile decoded on the decode lane's stream while the device stream multiplies the
        // one before (decode_lane.rs), else into one scratch buffer on the device stream.
        let mut lane = st.decode_lane()?;
        let scratch = if lane.is_none() { Some(DeviceBuffer::alloc(st, tile * k * 2)?) } else { None };
        let mut r0 = 0;
        while r0 < n {
            let rows = tile.min(n - r0);
            let (buf, stream) = match lane.as_deref_mut() {
                Some(l) => (l.begin(rows * k * 2)?, l.stream()),
                None => (scratch.as_ref().expect("made without a lane").ptr(), &*st.stream),
            };
            self.decode_bf16(op, stream, buf, r0, rows, k, w)?;
            if let Some(l) = lane.as_deref() {
                l.ready(st)?;
            }
            let out = o + (r0 * 4) as u64;
            self.gemm_bf16(op, (true, false), (rows, m, k), 1.0, (buf, k, 0), (xb, k, 0), (out, n, 0), 1)?;
            if let Some(l) = lane.as_deref() {
                l.done(st)?;
            }
            r0 += rows;
        }
        Ok(())
    }

    /// Weight rows `row0..row0 + rows` of `w` (not bf16) decoded to bf16 at `out` ([rows, k]),
    /// on `stream` (the decode lane's, or the device stream).
    #[allow(clippy::too_many_arguments)]
    fn decode_bf16(
        &self,
        op: &'static str,
        stream: &CudaStream,
        out: u64,
        row0: usize,
        rows: usize,
        k: usize,
        w: &WeightArgs,
    ) -> Result<()> {
        if w.w_dt >= 0 {
            let size = if w.w_dt == DT_F32 { 4 } else { 2 };
            return self.convert_bf16(op, stream, out, w.dense + (row0 * k * size) as u64, w.w_dt, rows * k);
        }
        let WeightArgs { packed, scales, biases, p_dt, bits, group, .. } = *w;
        let (row0, ki) = (row0 as i64, to_i32(op, "k", k)?);
        let st = self.st()?;
        if let Some(lg) = fast_path_log_group(w, k, out) {
            let name = format!("qdequant_bf16_b{bits}");
            let rowsl = rows as i64;
            let cfg = if bits == 4 {
                // A thread per packed word, QDB4_WORDS of them: x over a row's words, y over rows.
                let words = k / 8;
                let threads = words.div_ceil(QDB4_WORDS).next_multiple_of(32).clamp(32, 256);
                let grid_x = words.div_ceil(threads * QDB4_WORDS);
                LaunchConfig {
                    grid_dim: (grid_x as u32, rows.min(65535) as u32, 1),
                    block_dim: (threads as u32, 1, 1),
                    shared_mem_bytes: 0,
                }
            } else {
                cfg_1d(rows * k / 32)
            };
            launch!(@on stream, st, op, name.as_str(), cfg;
                out, row0, rowsl, packed, scales, biases, p_dt, lg, ki);
        } else {
            let total = (rows * k) as u64;
            launch!(@on stream, st, op, "qdequant_bf16_any", cfg_1d(rows * k);
                out, row0, total, packed, scales, biases, p_dt, bits, group, ki);
        }
        Ok(())
    }

    /// `out [n]` bf16 = `src [n]` (dtype code `dt`) on `stream` (the device stream, or the decode
    /// lane's for weights); `out` is the start of a buffer (4-byte aligned).
    pub(super) fn convert_bf16(
        &self,
        op: &'static str,
        stream: &CudaStream,
        out: u64,
        src: u64,
        dt: i32,
        n: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        // A thread per four values where the kernel takes them so (f32, aligned), else per pair.
        let per_thread = if dt == DT_F32 && src.is_multiple_of(16) && out.is_multiple_of(8) { 4 } else { 2 };
        let nl = n as u64;
        let st = self.st()?;
        launch!(@on stream, st, op, "convert_bf16", cfg_1d(n.div_ceil(per_thread)); out, src, dt, nl);
        Ok(())
    }

    /// `out [B, A, C]` bf16 = `src[a * sa + b * sb + c]` (element strides; src of dtype code `dt`).
    fn to_bf16(
        &self,
        op: &'static str,
        out: u64,
        src: u64,
        dt: i32,
        (a, b, c): (usize, usize, usize),
        (sa, sb): (usize, usize),
    ) -> Result<()> {
        let total = a * b * c;
        if total == 0 {
            return Ok(());
        }
        // A thread per four values where the kernel takes them so (f32, rows of whole 16-byte
        // pieces, aligned), else per value.
        let quads = dt == DT_F32
            && [c, sa, sb].iter().all(|v| v.is_multiple_of(4))
            && src.is_multiple_of(16)
            && out.is_multiple_of(8);
        let threads = if quads { total / 4 } else { total };
        let (ai, bi, ci, sai, sbi, t) = (a as i64, b as i64, c as i64, sa as i64, sb as i64, total as u64);
        launch!(self.st()?, op, "gather3_bf16", cfg_1d(threads); out, src, dt, ai, bi, ci, sai, sbi, t);
        Ok(())
    }

    /// Column-major `C = alpha * op(A) op(B)` (`m x n`, inner `k`) with A and B bf16 and C f32,
    /// accumulated in f32 on the tensor cores, for `batch` entries (strides in elements).
    #[allow(clippy::too_many_arguments)]
    fn gemm_bf16(
        &self,
        op: &'static str,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        (a, lda, sa): Operand,
        (b, ldb, sb): Operand,
        (c, ldc, sc): Operand,
        batch: usize,
    ) -> Result<()> {
        let st = self.st()?;
        let t = |x: bool| if x { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let d = |v: usize| to_i32(op, "GEMM extent", v);
        let (mi, ni, ki, lda, ldb, ldc, bi) = (d(m)?, d(n)?, d(k)?, d(lda)?, d(ldb)?, d(ldc)?, d(batch)?);
        let (bf, f) = (cudaDataType::CUDA_R_16BF, cudaDataType::CUDA_R_32F);
        let (compute, algo) = (cublasComputeType_t::CUBLAS_COMPUTE_32F, cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT);
        let beta = 0f32;
        let (alpha_p, beta_p) = ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
        let (ap, bp, cp) = (a as *const std::ffi::c_void, b as *const std::ffi::c_void, c as *mut std::ffi::c_void);
        let blas = st.blas.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the callers pass addresses of live allocations of this device holding `batch`
        // bf16 matrices A and B and f32 matrices C with the extents, leading dimensions and
        // strides given (checked by the ops that call this); alpha and beta are f32, as
        // CUBLAS_COMPUTE_32F requires; the handle's stream is the device stream, so the product
        // is ordered with the kernels around it and the buffers outlive it.
        let r = unsafe {
            if batch == 1 {
                cudarc::cublas::result::gemm_ex(
                    *blas.handle(),
                    t(ta),
                    t(tb),
                    mi,
                    ni,
                    ki,
                    alpha_p,
                    ap,
                    bf,
                    lda,
                    bp,
                    bf,
                    ldb,
                    beta_p,
                    cp,
                    f,
                    ldc,
                    compute,
                    algo,
                )
            } else {
                cudarc::cublas::result::gemm_strided_batched_ex(
                    *blas.handle(),
                    t(ta),
                    t(tb),
                    mi,
                    ni,
                    ki,
                    alpha_p,
                    ap,
                    bf,
                    lda,
                    sa as i64,
                    bp,
                    bf,
                    ldb,
                    sb as i64,
                    beta_p,
                    cp,
                    f,
                    ldc,
                    sc as i64,
                    bi,
                    compute,
                    algo,
                )
            }
        };
        r.map_err(|e| Error::Device(format!("{op}: cuBLAS bf16 GEMM on cuda:{}: {e:?}", st.ordinal)))
    }

    /// Causal attention of `l >= 64` queries in bf16 (`out [l, hq * d]` at `o`, f32): false
    /// (nothing done) unless the precision is bf16 (or `Auto` while the model running computes in
    /// half precision, [`crate::hint_is_half`]). Shapes and pointers were checked by
    /// `attention`. K and V are converted to bf16 once; then, for head sizes 64 and 128, one
    /// flash-attention launch (`kernels/flash_attention.cu`: scores and probabilities stay on the
    /// SM, online softmax in f32, probabilities rounded to bf16 for P V). Otherwise (or with
    /// `NUVEC_FLASH_ATTENTION=0`), per block of queries: scores = Q K^T * scale for all KV groups
    /// in one batched GEMM (the query heads of a group side by side, so GQA needs no copies of K
    /// or V), the causal softmax writing bf16 probabilities, P V in one batched GEMM, then the
    /// heads back in order. Sinks (a device pointer, or 0) and a window (> 0: each query sees
    /// that many positions up to its own) only on the flash path (false without it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn prefill_attention(
        &self,
        op: &'static str,
        o: u64,
        (qp, kp, vp, kv_dt): (u64, u64, u64, i32),
        (l, hq, hkv, d): (usize, usize, usize, usize),
        cap: usize,
        kv_len: usize,
        scale: f32,
        (sinks, window): (u64, usize),
    ) -> Result<bool> {
        if !self.st()?.matmul_precision().bf16_attention(crate::hint_is_half()) {
            return Ok(false);
        }
        let st: &State = self.st()?;
        // Flash attention where it has a kernel: head sizes 64 and 128, q and out 8-byte aligned
        // (its float2 loads and stores), query blocks within a grid's y limit; a sink starts the
        // kernel's running maximum at sink / scale, which needs a positive scale.
        let warps = flash_warps(d);
        let query_blocks = l.div_ceil(16 * warps);
        let flash = st.flash
            && (d == 64 || d == 128)
            && qp.is_multiple_of(8)
            && o.is_multiple_of(8)
            && query_blocks <= 65535
            && (sinks == 0 || scale > 0.0);
        if !flash && (sinks != 0 || window > 0) {
            return Ok(false);
        }
        let group = hq / hkv;
        // K, V: the first kv_len rows of each head, [Hkv, kv_len, D] in bf16.
        let kb = DeviceBuffer::alloc(st, hkv * kv_len * d * 2)?;
        self.to_bf16(op, kb.ptr(), kp, kv_dt, (kv_len, hkv, d), (d, cap * d))?;
        let vb = DeviceBuffer::alloc(st, hkv * kv_len * d * 2)?;
        self.to_bf16(op, vb.ptr(), vp, kv_dt, (kv_len, hkv, d), (d, cap * d))?;
        if flash {
            let cfg = LaunchConfig {
                grid_dim: (to_i32(op, "heads", hq)? as u32, query_blocks as u32, 1),
                block_dim: (32 * warps as u32, 1, 1),
                shared_mem_bytes: flash_smem_bytes(d) as u32,
            };
            let name = if d == 64 { "flash_attn_bf16_d64" } else { "flash_attn_bf16_d128" };
            let (li, kvi, hqi, hkvi) = (to_i32(op, "queries", l)?, to_i32(op, "keys", kv_len)?, hq as i32, hkv as i32);
            let (kbp, vbp, wi) = (kb.ptr(), vb.ptr(), to_i32(op, "window", window)?);
            launch!(st, op, name, cfg; o, qp, kbp, vbp, li, kvi, hqi, hkvi, scale, sinks, wi);
            return Ok(true);
        }
        // Q [L, Hkv, group * D] -> [Hkv, L, group * D].
        let qb = DeviceBuffer::alloc(st, l * hq * d * 2)?;
        self.to_bf16(op, qb.ptr(), qp, DT_F32, (l, hkv, group * d), (hq * d, group * d))?;
        // Rows of scores and probabilities padded to 8 values (16-byte aligned bf16 rows).
        let ld_all = kv_len.next_multiple_of(8);
        let block = (ATTN_GEMM_SCORE_BYTES / (hq * ld_all * 6)).clamp(1, ATTN_BF16_QUERIES).min(l);
        let scores = DeviceBuffer::alloc(st, hq * block * ld_all * 4)?;
        let probs = DeviceBuffer::alloc(st, hq * block * ld_all * 2)?;
        let heads = DeviceBuffer::alloc(st, hq * block * d * 4)?;
        let (sp, pp, hp) = (scores.ptr(), probs.ptr(), heads.ptr());
        let (groupi, di) = (to_i32(op, "heads per KV head", group)?, to_i32(op, "head size", d)?);
        let mut t0 = 0;
        while t0 < l {
            let rows = block.min(l - t0);
            let first = kv_len - l + t0; // position of query t0
            let n = first + rows; // keys the last query of the block sees
            let ld = n.next_multiple_of(8);
            let gr = rows * group; // score rows per KV head
                                   // S_g (column-major n x gr, ld) = K_g^T (n x d) * Q_g (d x gr), for every KV head g.
            let q0 = qb.ptr() + (t0 * group * d * 2) as u64;
            self.gemm_bf16(
                op,
                (true, false),
                (n, gr, d),
                scale,
                (kb.ptr(), d, kv_len * d),
                (q0, d, l * group * d),
                (sp, ld, gr * ld),
                hkv,
            )?;
            let cfg = LaunchConfig {
                grid_dim: (to_i32(op, "score rows", gr)? as u32, hkv as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let (gri, ni, ldi, fi) = (gr as i32, to_i32(op, "keys", n)?, to_i32(op, "keys", ld)?, first as i64);
            launch!(st, op, "causal_softmax_bf16", cfg; pp, sp, gri, ni, ldi, fi, groupi);
            // O_g (column-major d x gr) = V_g (d x n) * P_g (n x gr, ld): heads [Hkv, rows, group * D].
            self.gemm_bf16(
                op,
                (false, false),
                (d, gr, n),
                1.0,
                (vb.ptr(), d, kv_len * d),
                (pp, ld, gr * ld),
                (hp, d, gr * d),
                hkv,
            )?;
            // [Hkv, rows, group * D] -> rows t0.. of out [L, Hkv * group * D].
            let out = o + (t0 * hq * d * 4) as u64;
            let (ai, bi, ci) = (hkv as i32, rows as i32, groupi * di);
            let total = (rows * hq * d) as u64;
            launch!(st, op, "transpose01_f32", cfg_1d(total as usize); out, hp, ai, bi, ci, total);
            t0 += rows;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_names_parse_both_ways() {
        for p in [MatmulPrecision::F32, MatmulPrecision::Tf32, MatmulPrecision::Bf16, MatmulPrecision::Auto] {
            assert_eq!(p.name().parse::<MatmulPrecision>().unwrap(), p);
            assert_eq!(p.to_string().to_uppercase().parse::<MatmulPrecision>().unwrap(), p);
            assert_eq!(MatmulPrecision::from_code(p.code()), Some(p));
        }
        let e = "fp8".parse::<MatmulPrecision>().unwrap_err().to_string();
        assert!(e.contains("\"fp8\"") && e.contains("f32") && e.contains("bf16") && e.contains("auto"), "{e}");
        assert_eq!(MatmulPrecision::from_code(0), None);
        assert_eq!(MatmulPrecision::DEFAULT, MatmulPrecision::Auto);
        assert_eq!(" Auto ".parse::<MatmulPrecision>().unwrap(), MatmulPrecision::Auto);
    }

    #[test]
    fn auto_follows_each_weights_stored_type() {
        use MatmulPrecision::*;
        // (w_dt, p_dt): dense weights carry their type, quantized ones (w_dt -1) their scales'.
        let half = [(DT_F16, 0), (DT_BF16, 0), (-1, DT_F16), (-1, DT_BF16)];
        let full = [(DT_F32, 0), (-1, DT_F32)];
        let (half_models, f32_model) = ([None, Some(DType::BF16), Some(DType::F16)], Some(DType::F32));
        for (w, p) in half {
            for model in half_models {
                assert!(Auto.bf16_weight(w, p, model), "half weight ({w}, {p}), model {model:?}");
            }
            // mlx-lm promotes the product to the f32 activations' type.
            assert!(!Auto.bf16_weight(w, p, f32_model), "half weight ({w}, {p}) in an f32 model");
        }
        for model in half_models.into_iter().chain([f32_model]) {
            assert!(!Auto.bf16_weight(DT_F32, 0, model), "f32 dense weight, model {model:?}");
        }
        // f32 scales: the weight decides outside a model; a half model (a GGUF's K-quants) runs
        // them in half precision, an f32 one in f32.
        assert!(!Auto.bf16_weight(-1, DT_F32, None));
        assert!(!Auto.bf16_weight(-1, DT_F32, f32_model));
        assert!(Auto.bf16_weight(-1, DT_F32, Some(DType::F16)) && Auto.bf16_weight(-1, DT_F32, Some(DType::BF16)));
        // The explicit settings ignore the weight and the model.
        for (w, p) in half.into_iter().chain(full) {
            for model in half_models.into_iter().chain([f32_model]) {
                assert!(Bf16.bf16_weight(w, p, model));
                assert!(!F32.bf16_weight(w, p, model) && !Tf32.bf16_weight(w, p, model));
            }
        }
    }

    #[test]
    fn auto_attention_follows_the_model() {
        use MatmulPrecision::*;
        assert!(Auto.bf16_attention(true) && !Auto.bf16_attention(false));
        assert!(Bf16.bf16_attention(false) && Bf16.bf16_attention(true));
        for p in [F32, Tf32] {
            assert!(!p.bf16_attention(true) && !p.bf16_attention(false));
        }
        // What the attention path reads: the model's scoped hint.
        assert!(crate::with_compute_dtype(DType::BF16, crate::hint_is_half));
        assert!(crate::with_compute_dtype(DType::F16, crate::hint_is_half));
        assert!(!crate::with_compute_dtype(DType::F32, crate::hint_is_half));
        assert!(!crate::hint_is_half());
    }

    #[test]
    fn the_setter_wins() {
        // The only test in this binary that sets it.
        assert_eq!(chosen_or(MatmulPrecision::Bf16), MatmulPrecision::Bf16);
        set_matmul_precision(MatmulPrecision::Tf32);
        assert_eq!(chosen_or(MatmulPrecision::Auto), MatmulPrecision::Tf32);
        set_matmul_precision(MatmulPrecision::F32);
        assert_eq!(chosen_or(MatmulPrecision::Bf16), MatmulPrecision::F32);
    }
}
