//! Mixture-of-experts layers on a CUDA device (kernels/moe.cu; the router: moe_router.rs): for a
//! few rows (a decode step) the chosen experts read straight out of the layer's weights
//! through an index of their buffers, made once per layer ([`CudaBackend::expert_index`]), so a
//! decode step reads nothing back to the host and can be captured as a CUDA graph. 4-bit affine
//! experts in groups of 32 and more, and mxfp4 ones, run those products on int8 dot products over
//! x's and the activations' parts, as the one-row GEMVs do (`NUVEC_QGEMV_INT=0`: the f32 loops);
//! the gate/up kernel writes the activations' parts itself. From
//! `NUVEC_MOE_GROUPED_ROWS` rows (default 8: a batched step, a prefill) they run grouped where the
//! experts are 4- or 8-bit affine with bf16 scales, or mxfp4, and the precision puts them on bf16:
//! the slots sorted by expert on the device (`moe_align`), each tile of 64 slots one tensor-core
//! product with its expert's weights decoded in registers (qmma.cu's `qmma_bN_g64`), each chosen
//! expert read once for all its rows, nothing read back to the host. Experts the grouped products
//! do not take run gathered up to `NUVEC_MOE_GATHER_ROWS` rows (default 64) and the composed op
//! above (each expert once over the rows routed to it).

use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::LaunchConfig;

use super::fp::{FP_MXFP4, FP_MXFP8, FP_NVFP4};
use super::gemv::{int_gemvs, int_parts_bytes};
use super::qmma::{QmmaKernel, QM_ROWS, QM_THREADS};
use super::{cfg_1d, to_i32, CudaBackend, DT_BF16, DT_F16, DT_F32};
use crate::backends::cuda::{DeviceBuffer, State};
use crate::fpquant::global_factor;
use crate::moe::{self, ExpertActivation, ExpertIndex, Experts};
use crate::{Array, DType, Error, Matrix, QuantMode, Result};

/// u64 entries per (projection, expert) in the index (moe.cu's `MOE_SLOTS`).
const SLOTS: usize = 6;
/// Warps per block of the expert kernels (moe.cu's `MOE_WARPS`).
const WARPS: usize = 4;
/// Warps per block of the integer gate/up kernels (moe.cu's `MOE_GU_INT_WARPS`): one 32-value
/// chunk of the activations per block.
const GU_INT_WARPS: usize = 8;
/// Most experts and top-k the kernels take (common.cuh's `MOE_MAX_EXPERTS`, `MOE_MAX_TOP_K`).
pub(super) const MAX_EXPERTS: usize = 1024;
pub(super) const MAX_TOP_K: usize = 32;

/// Slots per tile of the grouped products (moe.cu's `MOE_TILE`, the rows of qmma.cu's g64
/// kernels).
const TILE: usize = 64;

/// A row count a test may set for every device ([`RowLimit::set`]), else the device's knob.
struct RowLimit(AtomicUsize);

impl RowLimit {
    const fn new() -> Self {
        RowLimit(AtomicUsize::new(usize::MAX))
    }

    /// The set value, else `knob`.
    fn or(&self, knob: usize) -> usize {
        match self.0.load(Ordering::Relaxed) {
            usize::MAX => knob,
            rows => rows,
        }
    }

    fn set(&self, rows: Option<usize>) {
        self.0.store(rows.unwrap_or(usize::MAX), Ordering::Relaxed);
    }
}

/// Rows (tokens) up to which the experts run as gathered matrix-vector products where the grouped
/// products do not take them, each chosen expert's weights read once per row; above, each expert
/// runs once over its rows (`NUVEC_MOE_GATHER_ROWS`, default 64).
static GATHER_ROWS: RowLimit = RowLimit::new();

/// Rows from which a layer whose experts the grouped products take runs them grouped, each chosen
/// expert's weights read once for all its rows: 8 rows of Qwen3-30B-A3B choose 64 slots, which
/// the gathered kernels read one by one, among about 51 distinct experts (16 rows: 128 slots,
/// about 82 experts). One row (a decode step alone) is faster gathered (`NUVEC_MOE_GROUPED_ROWS`,
/// default 8).
static GROUPED_ROWS: RowLimit = RowLimit::new();

/// Sets the most rows for which a mixture-of-experts layer runs its chosen experts as gathered
/// products on the device (0: never; more rows run grouped where the experts' format allows,
/// else each expert over its rows with the routing read to the host); `None` goes back to
/// `NUVEC_MOE_GATHER_ROWS` or the default (64).
pub fn set_moe_gather_rows(rows: Option<usize>) {
    GATHER_ROWS.set(rows);
}

/// Sets the rows from which a mixture-of-experts layer runs its experts as grouped products where
/// their format and the precision allow (fewer rows read each chosen expert per row); `None` goes
/// back to `NUVEC_MOE_GROUPED_ROWS` or the default (8).
pub fn set_moe_grouped_rows(rows: Option<usize>) {
    GROUPED_ROWS.set(rows);
}

/// A format's kernel pair (moe.cu) and the output rows each block of them computes.
#[derive(Clone, Copy)]
struct ExpertKernels {
    gate_up: &'static str,
    down: &'static str,
    /// `MOE_WARPS` times the rows per warp (`moe_gu_rows`; one for dense experts).
    gate_up_rows: usize,
    /// `MOE_WARPS` for dense experts (a warp per row), `MOE_DOWN_ROWS` for the others.
    down_rows: usize,
}

/// Dense experts' kernels: a warp per output row of either.
const fn dense(gate_up: &'static str, down: &'static str) -> ExpertKernels {
    ExpertKernels { gate_up, down, gate_up_rows: WARPS, down_rows: WARPS }
}

/// A quantized format's kernels: `rows_per_warp` (moe.cu's `moe_gu_rows`) rows of gate/up a warp,
/// `DOWN_ROWS` output rows of down a block.
const fn quantized(gate_up: &'static str, down: &'static str, rows_per_warp: usize) -> ExpertKernels {
    ExpertKernels { gate_up, down, gate_up_rows: WARPS * rows_per_warp, down_rows: DOWN_ROWS }
}

/// Rows per block of the quantized formats' down kernels (moe.cu's `MOE_DOWN_ROWS`).
const DOWN_ROWS: usize = 4;

/// The kernels by format, indexed by [`Format::kernels`].
const KERNELS: [ExpertKernels; 9] = [
    dense("moe_gate_up_dense", "moe_down_dense"),
    quantized("moe_gate_up_b2", "moe_down_b2", 4),
    quantized("moe_gate_up_b3", "moe_down_b3", 4),
    quantized("moe_gate_up_b4", "moe_down_b4", 4),
    quantized("moe_gate_up_b5", "moe_down_b5", 2),
    quantized("moe_gate_up_b6", "moe_down_b6", 2),
    quantized("moe_gate_up_b8", "moe_down_b8", 2),
    quantized("moe_gate_up_fp4", "moe_down_fp4", 4),
    quantized("moe_gate_up_fp8", "moe_down_fp8", 2),
];

/// How every matrix of a layer's experts is stored, as the kernels take it: the kernel pair
/// (into [`KERNELS`]), the `dt` argument (dense dtype, affine scales' dtype, or fp mode) and log2
/// of the group size.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Format {
    kernels: i32,
    dt: i32,
    lg: i32,
}

fn float_dt(dtype: DType) -> Option<i32> {
    match dtype {
        DType::F32 => Some(DT_F32),
        DType::F16 => Some(DT_F16),
        DType::BF16 => Some(DT_BF16),
        _ => None,
    }
}

fn format_of(m: &Matrix) -> Option<Format> {
    match m {
        Matrix::Dense(a) => Some(Format { kernels: 0, dt: float_dt(a.dtype())?, lg: 0 }),
        Matrix::Quantized(q) => {
            let kernels = match (q.spec.mode, q.spec.bits) {
                (QuantMode::Affine, 2) => 1,
                (QuantMode::Affine, 3) => 2,
                (QuantMode::Affine, 4) => 3,
                (QuantMode::Affine, 5) => 4,
                (QuantMode::Affine, 6) => 5,
                (QuantMode::Affine, 8) => 6,
                (QuantMode::Mxfp4 | QuantMode::Nvfp4, 4) => 7,
                (QuantMode::Mxfp8, 8) => 8,
                _ => return None,
            };
            let (dt, lg) = match q.spec.mode {
                QuantMode::Affine => {
                    if q.biases.dtype() != q.scales.dtype() || !q.spec.group_size.is_power_of_two() {
                        return None;
                    }
                    (float_dt(q.scales.dtype())?, q.spec.group_size.trailing_zeros() as i32)
                }
                QuantMode::Mxfp4 => (FP_MXFP4, 0),
                QuantMode::Mxfp8 => (FP_MXFP8, 0),
                QuantMode::Nvfp4 => (FP_NVFP4, 0),
            };
            (q.spec.mode == QuantMode::Affine || q.scales.dtype() == DType::U8).then_some(Format { kernels, dt, lg })
        }
    }
}

/// The format all of `experts`' matrices share and their bias rows' dtype (DT_F32 without
/// biases), when the kernels take them: one format, widths that are whole 32-value chunks.
fn layer_format(experts: &Experts) -> Option<(Format, i32)> {
    let format = format_of(experts.projections(0)[0])?;
    let (hidden, inter) = (experts.hidden(), experts.intermediate());
    if !hidden.is_multiple_of(32) || !inter.is_multiple_of(32) || hidden == 0 || inter == 0 {
        return None;
    }
    let same = (0..experts.len()).all(|e| experts.projections(e).iter().all(|m| format_of(m) == Some(format)));
    let b_dt = match experts.biases(0) {
        Some(b) => float_dt(b[0].dtype())?,
        None => DT_F32,
    };
    let same_bias = (0..experts.len())
        .all(|e| experts.biases(e).is_none_or(|b| b.iter().all(|r| float_dt(r.dtype()) == Some(b_dt))));
    (same && same_bias).then_some((format, b_dt))
}

/// The activation as the kernels take it: (moe.cu's `MOE_ACT_*`, alpha, limit).
fn activation_args(activation: ExpertActivation) -> (i32, f32, f32) {
    match activation {
        ExpertActivation::Silu => (0, 0.0, 0.0),
        ExpertActivation::SwigluOai { alpha, limit } => (1, alpha, limit),
        ExpertActivation::GeluApprox => (2, 0.0, 0.0),
    }
}

impl CudaBackend {
    /// [`crate::Backend::expert_index`]: for each projection and expert, the addresses the
    /// kernels read (see moe.cu), and the format's launch parameters `[kernel pair, dt, lg, bias
    /// dtype]`; `None` when the experts' format is not one the kernels take.
    pub(super) fn experts_index(&self, experts: &Experts) -> Result<Option<ExpertIndex>> {
        let op = "experts";
        let Some((format, b_dt)) = layer_format(experts) else {
            return Ok(None);
        };
        let n = experts.len();
        let mut index = vec![0u64; 3 * n * SLOTS];
        for p in 0..3 {
            for e in 0..n {
                let entry = &mut index[(p * n + e) * SLOTS..][..SLOTS];
                match experts.projections(e)[p] {
                    Matrix::Dense(a) => {
                        entry[0] = self.ptr(op, "weight", a)?;
                        entry[4] = 1f32.to_bits() as u64;
                    }
                    Matrix::Quantized(q) => {
                        entry[0] = self.ptr(op, "packed weight", &q.packed)?;
                        entry[1] = self.ptr(op, "scales", &q.scales)?;
                        if q.spec.mode == QuantMode::Affine {
                            entry[2] = self.ptr(op, "biases", &q.biases)?;
                        }
                        entry[4] = global_factor(q.global_scale).unwrap_or(1.0).to_bits() as u64;
                    }
                }
                if let Some(b) = experts.biases(e) {
                    entry[3] = self.ptr(op, "bias", b[p])?;
                }
                entry[5] = experts.output_scale(e).unwrap_or(1.0).to_bits() as u64;
                // The kernels read 16 bytes at a time from each matrix (8 for 2-bit codes).
                if !entry[0].is_multiple_of(16) {
                    return Ok(None);
                }
            }
        }
        let words: Vec<u32> = index.iter().flat_map(|&v| [v as u32, (v >> 32) as u32]).collect();
        let table = Array::from_slice_on(&words, &[3, n, 2 * SLOTS], self.dev())?;
        Ok(Some(ExpertIndex { table, params: [format.kernels, format.dt, format.lg, b_dt] }))
    }

    /// [`crate::Backend::moe_experts`]: the gathered kernels for a few rows of experts they
    /// take, else the composed op.
    pub(super) fn run_experts(&self, x: &Array, experts: &Experts, ids: &Array, weights: &Array) -> Result<Array> {
        let op = "moe_experts";
        let (rows, top_k) = moe::check_experts(x, experts, ids, weights)?;
        let Some(index) = experts.index() else {
            return moe::experts_composed(x, experts, ids, weights);
        };
        if ids.device() != self.dev() || weights.device() != self.dev() {
            return moe::experts_composed(x, experts, ids, weights);
        }
        let knobs = &self.st()?.knobs;
        let gathered = rows <= GATHER_ROWS.or(knobs.moe_gather_rows) && x.cuda_addr()?.is_multiple_of(16);
        if rows >= GROUPED_ROWS.or(knobs.moe_grouped_rows) || !gathered {
            if let Some(out) = self.grouped_experts(x, experts, index, ids, weights)? {
                return Ok(out);
            }
            if !gathered {
                return moe::experts_composed(x, experts, ids, weights);
            }
        }
        let (hidden, inter, n) = (experts.hidden(), experts.intermediate(), experts.len());
        let out = self.output(&[rows, hidden], DType::F32, false)?;
        if rows == 0 {
            return Ok(out);
        }
        let [kernels, dt, lg, b_dt] = index.params;
        let ExpertKernels { gate_up, down, gate_up_rows, down_rows } = KERNELS[kernels as usize];
        // 4-bit affine experts in groups of 32 and more, and mxfp4 ones, take x and the
        // activations as the integer GEMVs' parts (int8 dot products, as the one-row GEMVs): one
        // row's may be its norm's.
        let int_kernels = match gate_up {
            "moe_gate_up_b4" if lg >= 5 => Some(("moe_gate_up_b4_int", "moe_down_b4_int")),
            "moe_gate_up_fp4" if dt == FP_MXFP4 => Some(("moe_gate_up_fp4_int", "moe_down_fp4_int")),
            _ => None,
        }
        .filter(|_| int_gemvs(knobs) && inter.is_multiple_of(32));
        let integer = int_kernels.is_some();
        let (gate_up, down) = int_kernels.unwrap_or((gate_up, down));
        self.f32_check(op, "x", x)?;
        let (xp, _x_parts) = if integer { self.int_parts(op, x, rows * hidden)? } else { (x.cuda_ptr()?, None) };
        let (ip, wp, tp) =
            (self.ptr(op, "ids", ids)?, self.ptr(op, "weights", weights)?, self.ptr(op, "index", &index.table)?);
        // The activations: f32, or (integer kernels) the down kernel's parts of them, which the
        // gate/up kernel writes a 32-value chunk per block.
        let st = self.st()?;
        let (ap, _act, _act_parts) = if integer {
            let parts = DeviceBuffer::alloc(st, int_parts_bytes(rows * top_k * inter))?;
            (parts.ptr(), None, Some(parts))
        } else {
            let act = self.output(&[rows * top_k, inter], DType::F32, false)?;
            (act.cuda_ptr()?, Some(act), None)
        };
        let o = out.cuda_ptr()?;
        let (ni, ki) = (to_i32(op, "experts", n)?, to_i32(op, "top_k", top_k)?);
        let (ii, hi) = (to_i32(op, "intermediate", inter)?, to_i32(op, "hidden", hidden)?);
        let (activation, alpha, limit) = activation_args(experts.activation());
        let block = (32 * WARPS as u32, 1, 1);
        let slots = to_i32(op, "rows * top_k", rows * top_k)? as u32;
        let (gu_grid, gu_block) = match integer {
            true => (inter / 32, (32 * GU_INT_WARPS as u32, 1, 1)),
            false => (inter.div_ceil(gate_up_rows), block),
        };
        let cfg = LaunchConfig { grid_dim: (gu_grid as u32, slots, 1), block_dim: gu_block, shared_mem_bytes: 0 };
        launch!(st, op, gate_up, cfg; ap, xp, ip, tp, ni, ki, ii, hi, dt, lg, b_dt, activation, alpha, limit);
        let cfg = LaunchConfig {
            grid_dim: (hidden.div_ceil(down_rows) as u32, rows as u32, 1),
            block_dim: block,
            shared_mem_bytes: 0,
        };
        launch!(st, op, down, cfg; o, ap, ip, wp, tp, ni, ki, hi, ii, dt, lg, b_dt);
        Ok(out)
    }

    /// [`crate::Backend::moe_experts`] of many rows as grouped tensor-core products (see the
    /// module's note); `None` (nothing done) where they do not take the experts or the
    /// precision keeps the products in f32.
    fn grouped_experts(
        &self,
        x: &Array,
        experts: &Experts,
        index: &ExpertIndex,
        ids: &Array,
        weights: &Array,
    ) -> Result<Option<Array>> {
        let op = "moe_experts";
        let [kernels, dt, lg, b_dt] = index.params;
        // `NUVEC_MOE_GROUPED=0`: the composed op, for comparisons.
        if !self.st()?.knobs.moe_grouped {
            return Ok(None);
        }
        // Decoding an affine weight to bf16 in one fma rounding needs its scale and bias exact in
        // bf16 (other scales, a GGUF's f32 or f16 ones: decoded in f32 by the `s` kernels); an
        // mxfp4 weight is a code times a power of two, exact.
        let (name, lg, stored) = match (KERNELS[kernels as usize].gate_up, dt) {
            ("moe_gate_up_b4", DT_BF16) if lg >= 5 => ("qmma_b4_g64", lg, DT_BF16),
            ("moe_gate_up_b8", DT_BF16) if lg >= 5 => ("qmma_b8_g64", lg, DT_BF16),
            ("moe_gate_up_b4", DT_F32 | DT_F16) if lg >= 5 => ("qmma_b4_g64s", lg, dt),
            ("moe_gate_up_b8", DT_F32 | DT_F16) if lg >= 5 => ("qmma_b8_g64s", lg, dt),
            ("moe_gate_up_fp4", FP_MXFP4) => ("qmma_fp4_g64", 5, DT_BF16),
            _ => return Ok(None),
        };
        let n = experts.len();
        if n > MAX_EXPERTS {
            return Ok(None);
        }
        if !self.st()?.matmul_precision().bf16_weight(-1, stored, crate::compute_dtype_hint()) {
            return Ok(None);
        }
        let st = self.st()?;
        // Read at module load on sm_80+ only (mma.sync and cp.async need it).
        let Some(&QmmaKernel { smem, .. }) = st.qmma_kernels.get(name) else {
            return Ok(None);
        };
        let (rows, top_k) = (x.dim(0), ids.dim(1));
        let (hidden, inter, slots) = (experts.hidden(), experts.intermediate(), rows * top_k);
        // Each expert's slots in whole tiles: at most one partly filled tile per expert.
        let tiles = slots.div_ceil(TILE) + n.min(slots);
        let order = DeviceBuffer::alloc(st, tiles * TILE * 4)?;
        let tile_expert = DeviceBuffer::alloc(st, tiles * 4)?;
        let xb = DeviceBuffer::alloc(st, rows * hidden * 2)?;
        let gu = DeviceBuffer::alloc(st, slots * 2 * inter * 4)?;
        let act = DeviceBuffer::alloc(st, slots * inter * 2)?;
        let y = DeviceBuffer::alloc(st, slots * hidden * 4)?;
        let out = self.output(&[rows, hidden], DType::F32, false)?;
        let (ip, wp, tp) =
            (self.ptr(op, "ids", ids)?, self.ptr(op, "weights", weights)?, self.ptr(op, "index", &index.table)?);
        let (op_, tep, xbp, gup, ap, yp) = (order.ptr(), tile_expert.ptr(), xb.ptr(), gu.ptr(), act.ptr(), y.ptr());
        let (si, ni, ti) = (to_i32(op, "slots", slots)?, to_i32(op, "experts", n)?, to_i32(op, "tiles", tiles)?);
        let (ki, hi, ii) =
            (to_i32(op, "top_k", top_k)?, to_i32(op, "hidden", hidden)?, to_i32(op, "intermediate", inter)?);
        let align = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        launch!(st, op, "moe_align", align; op_, tep, ip, si, ni, ti);
        self.convert_bf16(op, &st.stream, xbp, self.f32_ptr(op, "x", x)?, DT_F32, rows * hidden)?;
        let grouped = |columns: usize, pair: bool| LaunchConfig {
            grid_dim: ((columns.div_ceil(QM_ROWS) * if pair { 2 } else { 1 }) as u32, 1, tiles as u32),
            block_dim: (QM_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // gate and up (projections 0 and 1) of token slot / top_k; down (2) of the slot itself.
        let (gate, down, pair, single, one) = (0i32, 2i32, 1i32, 0i32, 1i32);
        let as_stored = stored != DT_BF16;
        if as_stored {
            launch!(st, op, name, grouped(inter, true); gup, xbp, op_, tep, tp, ni, gate, pair, ki, ii, hi, lg, stored);
        } else {
            launch!(st, op, name, grouped(inter, true); gup, xbp, op_, tep, tp, ni, gate, pair, ki, ii, hi, lg);
        }
        let (activation, alpha, limit) = activation_args(experts.activation());
        let values = (slots * inter) as u64;
        launch!(st, op, "moe_act_bf16", cfg_1d(slots * inter); ap, gup, ip, tp, ni, ii, b_dt, activation, alpha, limit, values);
        if as_stored {
            launch!(st, op, name, grouped(hidden, false); yp, ap, op_, tep, tp, ni, down, single, one, hi, ii, lg, stored);
        } else {
            launch!(st, op, name, grouped(hidden, false); yp, ap, op_, tep, tp, ni, down, single, one, hi, ii, lg);
        }
        let (o, values) = (out.cuda_ptr()?, (rows * hidden) as u64);
        launch!(st, op, "moe_combine", cfg_1d(rows * hidden); o, yp, ip, wp, tp, ni, ki, hi, b_dt, values);
        Ok(Some(out))
    }

    /// [`crate::Backend::add_sigmoid_gated`]: one thread per value.
    pub(super) fn sigmoid_gated_add(&self, a: &Array, b: &Array, gate: &Array) -> Result<Array> {
        let op = "add_sigmoid_gated";
        let (rows, width) = moe::check_sigmoid_gated(a, b, gate)?;
        let (ap, bp, gp) = (self.f32_ptr(op, "a", a)?, self.f32_ptr(op, "b", b)?, self.f32_ptr(op, "gate", gate)?);
        let out = self.output(&[rows, width], DType::F32, false)?;
        let n = (rows * width) as u64;
        if n > 0 {
            let (o, wi) = (out.cuda_ptr()?, to_i32(op, "width", width)?);
            launch!(self.st()?, op, "moe_shared_add", super::cfg_1d(n as usize); o, ap, bp, gp, wi, n);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::RowLimit;

    #[test]
    fn row_limits_take_a_set_value_then_the_knob() {
        static LIMIT: RowLimit = RowLimit::new();
        assert_eq!(LIMIT.or(8), 8);
        LIMIT.set(Some(2));
        assert_eq!(LIMIT.or(8), 2);
        LIMIT.set(None);
        assert_eq!(LIMIT.or(24), 24);
    }
}
