//! Products of a few input rows (a batched decode step) over affine-quantized weights on the
//! tensor cores (kernels/qmma.cu): each packed weight is read once per call (per 64 rows above
//! 64). Up to 32 rows, its integers are multiplied exactly and each group's scale and bias applied
//! once per output; from 33 rows each weight is decoded in registers to the bf16 value the
//! prefill GEMM multiplies (with bf16 scales in one bf16 fma; with others, a GGUF's f32 or f16
//! ones, in f32 as the prefill path decodes them, where the precision puts the weight on bf16). The alternatives read each weight once per row (the
//! one-row GEMVs) or decode it whole to bf16 in memory first (the prefill GEMM path).

use cudarc::driver::LaunchConfig;

use super::{cfg_1d, fast_path_log_group, to_i32, CudaBackend, WeightArgs, DT_BF16};
use crate::backends::cuda::{DeviceBuffer, State};
use crate::{Error, Result};

/// Weight rows per block (`QM_ROWS`), values of K per chunk (`QM_CHUNK`) and threads per block
/// of the kernels.
pub(super) const QM_ROWS: usize = 128;
const QM_CHUNK: usize = 128;
pub(in crate::backends::cuda) const QM_THREADS: u32 = 128;
/// Pipeline slots of the kernels (`QM_STAGES`): 2, or what `NUVEC_NVRTC_DEFINES` sets it to
/// (an experiment knob: the kernels are compiled with the same definition).
fn qm_stages() -> usize {
    static STAGES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *STAGES.get_or_init(|| {
        super::super::nvrtc_define("QM_STAGES").and_then(|v| v.parse().ok()).filter(|&s| s >= 2).unwrap_or(2)
    })
}

/// Input rows per block of the kernels that decode weights to bf16 (`qmma_bN_d64`).
const QM_DEQ_ROWS: usize = 64;

/// The row counts the decoding kernels take: from 33 (below, the exact kernels) to 64, or what
/// `NUVEC_NVRTC_DEFINES` sets as `QM_DEQ_FROM` (17: `qmma_b4_d32` takes 17 to 32 rows) and
/// `QM_DEQ_MAX` (more rows read each weight once per 64; an experiment knob, as `QM_STAGES`).
fn deq_rows() -> std::ops::RangeInclusive<usize> {
    static ROWS: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    let (from, max) = *ROWS.get_or_init(|| {
        let at = |name: &str, default: usize| {
            super::super::nvrtc_define(name).and_then(|v| v.parse().ok()).filter(|&r| r >= 2).unwrap_or(default)
        };
        (at("QM_DEQ_FROM", 33), at("QM_DEQ_MAX", QM_DEQ_ROWS))
    });
    from..=max
}

/// The fewest rows whose products take x in bf16 (`QmmaInput::Bf16`): 9, fewer rows keeping f32
/// accuracy (`F32Split`), or what `NUVEC_NVRTC_DEFINES` sets as `QM_BF16_FROM` (an experiment
/// knob, at least 2).
pub(super) fn bf16_rows_from() -> usize {
    static FROM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *FROM.get_or_init(|| {
        super::super::nvrtc_define("QM_BF16_FROM")
            .and_then(|v| v.parse().ok())
            .filter(|&r| r >= 2)
            .unwrap_or(super::GEMV_MAX_ROWS + 1)
    })
}

/// The input of a [`CudaBackend::qmma`] product.
#[derive(Clone, Copy)]
pub(super) enum QmmaInput {
    /// `[m, k]` bf16, converted once by the caller: up to 32 rows the exact kernels (two tiles
    /// of 16 at most: with four, their per-group sums made them slower than decoding the weights
    /// to bf16 for a cuBLAS GEMM), from 33 the decoding ones where the scales are bf16.
    Bf16(u64),
    /// `[m, k]` f32, taken in two bf16 parts against the exact integers for f32 accuracy (m up
    /// to 8: the kernel stages 8 rows of x).
    F32Split(u64),
}

/// What launching a qmma kernel takes, read once at module load.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QmmaKernel {
    /// Blocks the device holds at once (multiprocessors times blocks per multiprocessor), for
    /// cutting the grid into whole waves.
    pub(crate) slots: usize,
    /// Its dynamic shared memory (its pipeline's slots).
    pub(crate) smem: usize,
}

/// The dynamic shared memory of qmma kernel `kernel` (its pipeline's slots: `QM_SLOT` in
/// kernels/qmma.cu), `None` for any other kernel. Every one passes the default 48 KiB, so the
/// module loader raises each kernel's limit to this.
pub(in crate::backends::cuda) fn qmma_smem_bytes(kernel: &str) -> Option<usize> {
    let (bits, form) = kernel.strip_prefix("qmma_")?.split_once('_')?;
    // b4, b8, or fp4 (mxfp4 codes: the 4-bit layout).
    let bits: usize = bits.strip_prefix('b').or(bits.strip_prefix("fp")).and_then(|b| b.parse().ok())?;
    // x's rows staged per slot and the bytes of each (padded); the `s` forms (scales as stored)
    // stage the same.
    let (x_rows, x_row) = match form.strip_suffix('s').unwrap_or(form) {
        "m16" | "d16" => (16, 272),
        "m32" | "d32" => (32, 272),
        "d64" | "g64" => (64, 272),
        "f32" => (8, 528),
        _ => return None,
    };
    Some(qm_stages() * (QM_ROWS * 16 * bits + x_rows * x_row + QM_ROWS * 32))
}

/// The log2 group size when the kernels take `w` for inputs of `k` features at `x`: affine 4- or
/// 8-bit weights with groups of 32 or more, K a multiple of 32, 16-byte aligned rows and input.
fn qmma_log_group(w: &WeightArgs, k: usize, x: u64) -> Option<i32> {
    if !matches!(w.bits, 4 | 8) {
        return None;
    }
    fast_path_log_group(w, k, x).filter(|&lg| lg >= 5)
}

impl CudaBackend {
    /// `out [m, n]` f32 at `o` = x times `w`^T with the tensor-core kernels; false (nothing done)
    /// when they do not take this weight, input or row count. The ranges of K depend on n, k, the
    /// kernel and the device only, so a row's result is the same whatever rows run beside it in
    /// one kernel (2 to 8 rows in f32, 9 to 16, 17 to 32 and 33 and more in bf16).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn qmma(
        &self,
        op: &'static str,
        o: u64,
        x: QmmaInput,
        m: usize,
        n: usize,
        k: usize,
        w: &WeightArgs,
    ) -> Result<bool> {
        // The kernel for this input, width and row count (a name from a table: this runs for
        // every weight of every batched decode step).
        // Decoding a weight to bf16 in one fma rounding needs its scale and bias exact in bf16;
        // others are decoded in f32 (the `s` forms) where the precision rounds the weight to bf16
        // anyway (a GGUF model's: `MatmulPrecision::Auto`).
        let deq = w.p_dt == DT_BF16 && deq_rows().contains(&m);
        let deq_f32 = w.p_dt != DT_BF16
            && deq_rows().contains(&m)
            && matches!(x, QmmaInput::Bf16(_))
            && self.st()?.matmul_precision().bf16_weight(-1, w.p_dt, crate::compute_dtype_hint());
        let (xp, name) = match (x, w.bits, m.div_ceil(16)) {
            (QmmaInput::Bf16(p), 4, 1) if deq => (p, "qmma_b4_d16"),
            (QmmaInput::Bf16(p), 4, 2) if deq => (p, "qmma_b4_d32"),
            (QmmaInput::Bf16(p), 4, 3..) if deq => (p, "qmma_b4_d64"),
            (QmmaInput::Bf16(p), 8, 3..) if deq => (p, "qmma_b8_d64"),
            (QmmaInput::Bf16(p), 4, 1) if deq_f32 => (p, "qmma_b4_d16s"),
            (QmmaInput::Bf16(p), 4, 2) if deq_f32 => (p, "qmma_b4_d32s"),
            (QmmaInput::Bf16(p), 4, 3..) if deq_f32 => (p, "qmma_b4_d64s"),
            (QmmaInput::Bf16(p), 8, 3..) if deq_f32 => (p, "qmma_b8_d64s"),
            (QmmaInput::Bf16(p), 4, 1) => (p, "qmma_b4_m16"),
            (QmmaInput::Bf16(p), 4, 2) => (p, "qmma_b4_m32"),
            (QmmaInput::Bf16(p), 8, 1) => (p, "qmma_b8_m16"),
            (QmmaInput::Bf16(p), 8, 2) => (p, "qmma_b8_m32"),
            (QmmaInput::F32Split(p), 4, 1) if m <= 8 => (p, "qmma_b4_f32"),
            (QmmaInput::F32Split(p), 8, 1) if m <= 8 => (p, "qmma_b8_f32"),
            _ => return Ok(false),
        };
        if m < 2 || n == 0 {
            return Ok(false);
        }
        let Some(lg) = qmma_log_group(w, k, xp) else {
            return Ok(false);
        };
        let chunks = k.div_ceil(QM_CHUNK);
        let blocks = n.div_ceil(QM_ROWS);
        let st = self.st()?;
        // Read at module load on sm_80+ only (the kernels' mma.sync and cp.async need it):
        // elsewhere the other paths take the product.
        let Some(&QmmaKernel { slots, smem }) = st.qmma_kernels.get(name) else {
            return Ok(false);
        };
        let (per_range, ranges) = ranges_of_k(chunks, blocks, slots, qm_stages());
        let row_blocks = if name.contains("_d") { m.div_ceil(QM_DEQ_ROWS) } else { 1 };
        let cfg = LaunchConfig {
            grid_dim: (
                to_i32(op, "blocks", blocks)? as u32,
                ranges as u32,
                to_i32(op, "row blocks", row_blocks)? as u32,
            ),
            block_dim: (QM_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        self.launch_ranged(op, name, cfg, o, xp, (m, n, k), w, lg, (per_range, ranges))?;
        Ok(true)
    }

    /// Launches few-row product kernel `name` (qmma.cu's or qimma.cu's shared-memory forms, whose
    /// parameters are the same: out, x, m, n, the weight, its log2 group size, k and the chunks
    /// per range) over `ranges` ranges of K of `per_range` chunks each, into `o` ([`Self::in_ranges`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_ranged(
        &self,
        op: &'static str,
        name: &str,
        cfg: LaunchConfig,
        o: u64,
        xp: u64,
        (m, n, k): (usize, usize, usize),
        w: &WeightArgs,
        lg: i32,
        (per_range, ranges): (usize, usize),
    ) -> Result<()> {
        let st = self.st()?;
        let WeightArgs { packed, scales, biases, p_dt, .. } = *w;
        let (mi, ni, ki, cps) = (m as i32, to_i32(op, "rows", n)?, to_i32(op, "k", k)?, per_range as i32);
        self.in_ranges(op, o, ranges, m * n, |dst| {
            launch!(st, op, name, cfg; dst, xp, mi, ni, packed, scales, biases, p_dt, lg, ki, cps);
            Ok(())
        })
    }

    /// Runs `product` (a launch writing `mn` f32 at the address it is given, one slice per range of
    /// K) into `o`: directly for one range, else into a partial buffer of `ranges` slices that
    /// `qmma_reduce` then adds in range order.
    pub(super) fn in_ranges(
        &self,
        op: &'static str,
        o: u64,
        ranges: usize,
        mn: usize,
        product: impl FnOnce(u64) -> Result<()>,
    ) -> Result<()> {
        if ranges == 1 {
            return product(o);
        }
        let st = self.st()?;
        let parts = DeviceBuffer::alloc(st, ranges * mn * 4)?;
        let pp = parts.ptr();
        product(pp)?;
        let (splits, n) = (ranges as i32, mn as u64);
        launch!(st, op, "qmma_reduce", cfg_1d(mn); o, pp, splits, n);
        Ok(())
    }
}

/// How K's `chunks` are cut into ranges for `blocks` column blocks on a device holding `slots`
/// blocks at once: (chunks per range, ranges). A block takes about its chunks plus the
/// `stages - 1` its pipeline needs to fill, and blocks run in waves of `slots`, so the product
/// takes about waves times that; the rule takes the fewest ranges (the least partial-sum traffic)
/// among those with the least of it.
/// It depends on N, K and the device only, never on the rows multiplied.
pub(super) fn ranges_of_k(chunks: usize, blocks: usize, slots: usize, stages: usize) -> (usize, usize) {
    let mut best = (chunks, 1, usize::MAX);
    for ranges in 1..=chunks {
        let per_range = chunks.div_ceil(ranges);
        let ranges = chunks.div_ceil(per_range);
        let span = (blocks * ranges).div_ceil(slots.max(1)) * (per_range + stages - 1);
        if span < best.2 {
            best = (per_range, ranges, span);
        }
    }
    (best.0, best.1)
}

#[cfg(test)]
mod tests {
    use super::ranges_of_k;

    #[test]
    fn ranges_fill_whole_waves() {
        // An 8B's gate/up (112 column blocks, 32 chunks) on 132 multiprocessors of 4 blocks:
        // 4 ranges of 8 chunks (448 blocks, one wave), not 5 of 7 (560 blocks, a wave and a tail).
        assert_eq!(ranges_of_k(32, 112, 528, 3), (8, 4));
        // q/o (32 blocks, 32 chunks): 16 ranges of 2, one wave.
        assert_eq!(ranges_of_k(32, 32, 528, 3), (2, 16));
        // One chunk: one range.
        assert_eq!(ranges_of_k(1, 1000, 528, 3), (1, 1));
        // More blocks than slots already: no cut.
        assert_eq!(ranges_of_k(32, 1000, 528, 3), (32, 1));
    }
}
