//! Row norms: RMS norm over rows (the decode path's kept integer parts included), and the
//! pending scale of a norm folded into the next product, settled when another op reads it.

use cudarc::driver::LaunchConfig;

use super::{cfg_1d, float_code, fused, norm_threads, rows_vectorizable, to_i32, CudaBackend};
use crate::backends::cuda::{Derived, DeviceBuffer, State};
use crate::{Array, DType, Error, Result};

impl DeviceBuffer {
    /// Scales a norm's output whose scale is pending (`set_pending_norm`) in place, once, so that
    /// its bytes hold the norm's values (`rms_settle_f32`); nothing otherwise.
    pub(crate) fn settle(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        // A plain load first: every kernel input passes here, and almost none is pending.
        if !self.is_pending_norm() || !self.pending_norm.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let op = "rms_norm (pending scale)";
        let parts =
            self.derived(Derived::IntParts).ok_or_else(|| Error::Device(format!("{op}: the norm's parts are gone")))?;
        let (y, d) = (self.ptr(), self.len() / 4);
        let di = to_i32(op, "row length", d)?;
        launch!(self.st, op, "rms_settle_f32", cfg_1d(d); y, parts, di);
        Ok(())
    }
}

impl CudaBackend {
    /// `x` normalized per row (RMS) and scaled by `weight`: the decode path records its integer
    /// parts for the next product (`Derived::IntParts`), the rest runs `rms_norm_f32`.
    pub(super) fn rms_norm_rows(&self, x: &Array, weight: &Array, eps: f32) -> Result<Array> {
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
        let vec = i32::from(rows_vectorizable(d, &[xp, o]));
        if let Some(parts) = self.row_int_parts("norm", rows, d)? {
            let (cfg, pp) = (fused::norm_row_cfg(d), parts.ptr());
            launch!(self.st()?, op, "rms_norm_row_f32", cfg; o, xp, wp, w_dt, di, eps, vec, pp);
            out.set_derived(Derived::IntParts, parts);
            return Ok(out);
        }
        let grid = u32::try_from(rows).map_err(|_| Error::Unsupported(format!("{op}: {rows} rows")))?;
        let cfg =
            LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (norm_threads(d, rows), 1, 1), shared_mem_bytes: 0 };
        launch!(self.st()?, op, "rms_norm_f32", cfg; o, xp, wp, w_dt, di, eps, vec);
        Ok(out)
    }
}
