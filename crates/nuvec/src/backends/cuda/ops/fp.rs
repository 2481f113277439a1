//! `linear` and `embed` over weights in MLX's floating-point modes (mxfp4, mxfp8, nvfp4) on a
//! CUDA device: the kernels of `kernels/fp_linear.cu`, laid out as the affine path in `ops.rs`
//! (a warp-per-row GEMV for a few input rows, decoded f32 tiles through cuBLAS for many).

use cudarc::driver::LaunchConfig;

use super::{cfg_1d, to_i32, CudaBackend, GEMV_MAX_ROWS, GEMV_ROWS_PER_BLOCK, TILE_FLOATS};
use crate::backends::cuda::graph::STEP_TOKEN;
use crate::backends::cuda::{DeviceBuffer, State};
use crate::fpquant::global_factor;
use crate::{Array, DType, Error, QuantMode, Quantized, Result};

/// Mode codes of `fp_linear.cu`.
pub(super) const FP_MXFP4: i32 = 1;
pub(super) const FP_MXFP8: i32 = 2;
pub(super) const FP_NVFP4: i32 = 3;

/// A floating-point-mode matrix as kernel arguments.
#[derive(Clone, Copy)]
struct FpArgs {
    packed: u64,
    scales: u64,
    mode: i32,
    factor: f32,
}

impl CudaBackend {
    fn fp_args(&self, op: &'static str, q: &Quantized) -> Result<FpArgs> {
        let mode = match q.spec.mode {
            QuantMode::Mxfp4 => FP_MXFP4,
            QuantMode::Mxfp8 => FP_MXFP8,
            QuantMode::Nvfp4 => FP_NVFP4,
            QuantMode::Affine => return Err(Error::shape(op, "an affine matrix is not in a floating-point mode")),
        };
        if q.scales.dtype() != DType::U8 {
            return Err(Error::shape(
                op,
                format!("{} scales must be uint8, got {}", q.spec.mode.name(), q.scales.dtype()),
            ));
        }
        Ok(FpArgs {
            packed: self.ptr(op, "packed weight", &q.packed)?,
            scales: self.ptr(op, "scales", &q.scales)?,
            mode,
            factor: global_factor(q.global_scale).unwrap_or(1.0),
        })
    }

    /// `out [rows, k]` f32 = rows `ids` (device u32, or 0 for `row0..`) of `w`, decoded.
    #[allow(clippy::too_many_arguments)]
    fn fp_gather_rows(
        &self,
        op: &'static str,
        out: u64,
        ids: u64,
        row0: usize,
        rows: usize,
        k: usize,
        w: FpArgs,
    ) -> Result<()> {
        let total = (rows * k) as u64;
        if total == 0 {
            return Ok(());
        }
        let (row0, k) = (row0 as i64, to_i32(op, "columns", k)?);
        let FpArgs { packed, scales, mode, factor } = w;
        launch!(self.st()?, op, "fp_gather_rows", cfg_1d(total as usize);
            out, ids, row0, total, packed, scales, mode, factor, k);
        Ok(())
    }

    /// [`crate::Backend::linear`] of `x [.., K]` with `q [N, K]` (shapes already checked).
    pub(super) fn fp_linear(&self, x: &Array, q: &Quantized) -> Result<Array> {
        let op = "linear";
        let k = x.dim(-1);
        let xp = self.f32_ptr(op, "x", x)?;
        let w = self.fp_args(op, q)?;
        let m = x.len() / k.max(1);
        let n = q.rows();
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("x has at least one axis") = n;
        let out = self.output(&shape, DType::F32, k == 0)?;
        if m == 0 || n == 0 || k == 0 {
            return Ok(out);
        }
        let o = out.cuda_ptr()?;
        if m <= GEMV_MAX_ROWS {
            let FpArgs { packed, scales, mode, factor } = w;
            let (mi, ni, ki) = (m as i32, to_i32(op, "rows", n)?, to_i32(op, "k", k)?);
            let blocks = to_i32(op, "blocks", n.div_ceil(GEMV_ROWS_PER_BLOCK))? as u32;
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (32 * GEMV_ROWS_PER_BLOCK as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(self.st()?, op, "fp_gemv", cfg; o, xp, mi, ni, packed, scales, mode, factor, ki);
        } else {
            let tile = (TILE_FLOATS / k).max(64).next_multiple_of(64).min(n);
            let scratch = DeviceBuffer::alloc(self.st()?, tile * k * 4)?;
            let mut r0 = 0;
            while r0 < n {
                let rows = tile.min(n - r0);
                self.fp_gather_rows(op, scratch.ptr(), 0, r0, rows, k, w)?;
                self.sgemm(op, o + (r0 * 4) as u64, xp, scratch.ptr(), m, rows, k, n)?;
                r0 += rows;
            }
        }
        Ok(out)
    }

    /// [`crate::Backend::embed`] from `q` (ids already checked against its rows).
    pub(super) fn fp_embed(&self, q: &Quantized, ids: &[u32]) -> Result<Array> {
        let op = "embed";
        let d = q.cols();
        let w = self.fp_args(op, q)?;
        let out = self.output(&[ids.len(), d], DType::F32, false)?;
        if ids.is_empty() || d == 0 {
            return Ok(out);
        }
        if let [id] = ids {
            // decode fusions: one token (a decode step) is the first row; nothing to upload.
            // CUDA graphs: while capturing, the id is the step's token, read from the step
            // scalars (a replay embeds its own token).
            let step = self.st()?.step_scalars();
            if step == 0 {
                self.fp_gather_rows(op, out.cuda_ptr()?, 0, *id as usize, 1, d, w)?;
            } else {
                self.fp_gather_rows(op, out.cuda_ptr()?, step + 4 * STEP_TOKEN, 0, 1, d, w)?;
                let rows = q.rows();
                self.st()?.guard(Box::new(move |at| (at.token as usize) < rows));
            }
            return Ok(out);
        }
        let idb = self.upload(ids)?;
        self.fp_gather_rows(op, out.cuda_ptr()?, idb.ptr(), 0, ids.len(), d, w)?;
        Ok(out)
    }
}
