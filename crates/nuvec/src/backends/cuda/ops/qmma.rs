//! Products of a few input rows (a batched decode step: 2 to 32 rows) over affine-quantized
//! weights on the tensor cores (kernels/qmma.cu): each packed weight is read once per call and
//! decoded in registers, where the alternatives read it once per row (the one-row GEMVs) or
//! decode it whole to bf16 in memory first (the prefill GEMM path).

use cudarc::driver::LaunchConfig;

use super::{cfg_1d, fast_path_log_group, to_i32, CudaBackend, WeightArgs};
use crate::backends::cuda::{DeviceBuffer, State};
use crate::{Error, Result};

/// Weight rows per block (`QM_ROWS`), values of K per chunk (`QM_CHUNK`) and threads per block
/// of the kernels.
const QM_ROWS: usize = 128;
const QM_CHUNK: usize = 128;
const QM_THREADS: u32 = 128;
/// Blocks a product should spread over (about four per multiprocessor of an H200): K is cut
/// into ranges until the blocks of N times the ranges reach this.
const QMMA_TARGET_BLOCKS: usize = 512;

/// The input of a [`CudaBackend::qmma`] product.
#[derive(Clone, Copy)]
pub(super) enum QmmaInput {
    /// `[m, k]` bf16, converted once by the caller (m up to 32, two tiles of 16: at 64 rows the
    /// kernel was slower on an H200 than decoding the weights to bf16 for a cuBLAS GEMM, random
    /// 8B 2 943 against 3 331 generated tok/s; at 32 and fewer faster, 2 671 against 2 132 at 32).
    Bf16(u64),
    /// `[m, k]` f32, taken in three bf16 parts for f32 accuracy (m up to 16; the caller passes 8).
    F32Split(u64),
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
    /// when they do not take this weight, input or row count. The ranges of K depend on n and k
    /// only, so a row's result is the same whatever rows run beside it.
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
        let (xp, name) = match (x, w.bits, m.div_ceil(16)) {
            (QmmaInput::Bf16(p), 4, 1) => (p, "qmma_b4_m16"),
            (QmmaInput::Bf16(p), 4, 2) => (p, "qmma_b4_m32"),
            (QmmaInput::Bf16(p), 8, 1) => (p, "qmma_b8_m16"),
            (QmmaInput::Bf16(p), 8, 2) => (p, "qmma_b8_m32"),
            (QmmaInput::F32Split(p), 4, 1) => (p, "qmma_b4_x3"),
            (QmmaInput::F32Split(p), 8, 1) => (p, "qmma_b8_x3"),
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
        let per_range = chunks.div_ceil(QMMA_TARGET_BLOCKS.div_ceil(blocks).clamp(1, chunks));
        let ranges = chunks.div_ceil(per_range);
        let cfg = LaunchConfig {
            grid_dim: (to_i32(op, "blocks", blocks)? as u32, ranges as u32, 1),
            block_dim: (QM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let WeightArgs { packed, scales, biases, p_dt, .. } = *w;
        let (mi, ni, ki, cps) = (m as i32, to_i32(op, "rows", n)?, to_i32(op, "k", k)?, per_range as i32);
        let st = self.st()?;
        if ranges == 1 {
            launch!(st, op, name, cfg; o, xp, mi, ni, packed, scales, biases, p_dt, lg, ki, cps);
            return Ok(true);
        }
        // Each range's partial sums in a slice of their own, then added in range order.
        let parts = DeviceBuffer::alloc(st, ranges * m * n * 4)?;
        let pp = parts.ptr();
        launch!(st, op, name, cfg; pp, xp, mi, ni, packed, scales, biases, p_dt, lg, ki, cps);
        let (splits, mn) = (ranges as i32, (m * n) as u64);
        launch!(st, op, "qmma_reduce", cfg_1d(m * n); o, pp, splits, mn);
        Ok(true)
    }
}
