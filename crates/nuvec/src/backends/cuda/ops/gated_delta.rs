//! The Gated DeltaNet ops of Qwen3.5 hybrids on a CUDA device (kernels/gated_delta.cu): the
//! depthwise causal convolution with SiLU and the gated delta rule, with the CPU backend's shape
//! checks and numerics (backends/cpu/gated_delta.rs). The recurrence runs in one launch for all L
//! positions: each warp owns a few rows of one value head's state, in registers, and walks the
//! positions in order.

use cudarc::driver::LaunchConfig;

use super::{cfg_1d, float_code, to_i32, CudaBackend};
use crate::backends::cuda::State;
use crate::{Array, DType, Error, GatedDeltaDims, Result};

/// Warps per block, state rows per warp and the most key features per head of `gated_delta_f32`
/// (`GD_WARPS`, `GD_ROWS`, `32 * GD_SLOTS`).
const GD_WARPS: usize = 4;
const GD_ROWS: usize = 4;
const GD_MAX_KEY_DIM: usize = 256;

impl CudaBackend {
    /// [`crate::Backend::causal_conv1d_silu`].
    pub(super) fn conv1d_silu(&self, x: &Array, state: &Array, weight: &Array) -> Result<(Array, Array)> {
        let op = "causal_conv1d_silu";
        let (&[l, c], &[keep, sc]) = (x.shape(), state.shape()) else {
            return Err(Error::shape(
                op,
                format!("expected x [L, C] and state [K-1, C], got {:?}, {:?}", x.shape(), state.shape()),
            ));
        };
        let taps = keep + 1;
        if sc != c || weight.len() != c * taps || weight.shape().first() != Some(&c) {
            return Err(Error::shape(
                op,
                format!(
                    "x {:?}, state {:?} and weight {:?} do not fit [C, K]",
                    x.shape(),
                    state.shape(),
                    weight.shape()
                ),
            ));
        }
        let (xp, sp) = (self.f32_ptr(op, "x", x)?, self.f32_ptr(op, "state", state)?);
        let w_dt = float_code(op, "weight", weight)?;
        let wp = self.ptr(op, "weight", weight)?;
        let out = self.output(&[l, c], DType::F32, false)?;
        let next = self.output(&[keep, c], DType::F32, false)?;
        let total = (l + keep) * c;
        if total > 0 {
            let (o, np) = (out.cuda_ptr()?, next.cuda_ptr()?);
            let (li, ci, keepi) = (l as i64, c as i64, to_i32(op, "kernel taps", keep)?);
            launch!(self.st()?, op, "conv1d_silu_f32", cfg_1d(total); o, np, xp, sp, wp, w_dt, li, ci, keepi);
        }
        Ok((out, next))
    }

    /// [`crate::Backend::gated_delta`].
    pub(super) fn gated_delta_rule(
        &self,
        mixed: &Array,
        [a, b]: [&Array; 2],
        [a_log, dt_bias]: [&Array; 2],
        state: &Array,
        d: GatedDeltaDims,
    ) -> Result<(Array, Array)> {
        let op = "gated_delta";
        let (hk, hv, dk, dv) = (d.key_heads, d.value_heads, d.key_dim, d.value_dim);
        let l = d.check_inputs(mixed, [a, b], [a_log, dt_bias], state)?;
        if dk > GD_MAX_KEY_DIM {
            return Err(Error::Unsupported(format!(
                "{op}: key heads of {dk} features (the CUDA kernel handles up to {GD_MAX_KEY_DIM})"
            )));
        }
        let mp = self.f32_ptr(op, "mixed", mixed)?;
        let (ap, bp) = (self.f32_ptr(op, "a", a)?, self.f32_ptr(op, "b", b)?);
        let sp = self.f32_ptr(op, "state", state)?;
        let (alog_dt, bias_dt) = (float_code(op, "a_log", a_log)?, float_code(op, "dt_bias", dt_bias)?);
        let (alp, dtp) = (self.ptr(op, "a_log", a_log)?, self.ptr(op, "dt_bias", dt_bias)?);
        let y = self.output(&[l, hv, dv], DType::F32, false)?;
        let next = self.output(&[hv, dv, dk], DType::F32, false)?;
        // As the CPU computes them: eps 1e-6 / Dk, queries scaled by 1 / Dk, keys by 1 / sqrt(Dk).
        let inv_scale = (dk as f64).powf(-0.5);
        let eps = (1e-6 * inv_scale * inv_scale) as f32;
        let (q_scale, k_scale) = ((inv_scale * inv_scale) as f32, inv_scale as f32);
        let (yp, np) = (y.cuda_ptr()?, next.cuda_ptr()?);
        let (li, hki, hvi) =
            (to_i32(op, "positions", l)?, to_i32(op, "key heads", hk)?, to_i32(op, "value heads", hv)?);
        let (dki, dvi) = (dk as i32, to_i32(op, "value features", dv)?);
        let grid_x = u32::try_from(hv).map_err(|_| Error::Unsupported(format!("{op}: {hv} value heads")))?;
        let grid_y = dv.div_ceil(GD_WARPS * GD_ROWS) as u32;
        let cfg = LaunchConfig {
            grid_dim: (grid_x, grid_y, 1),
            block_dim: (32 * GD_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let st: &State = self.st()?;
        launch!(st, op, "gated_delta_f32", cfg;
            yp, np, mp, ap, bp, alp, dtp, alog_dt, bias_dt, sp, li, hki, hvi, dki, dvi, eps, q_scale, k_scale);
        Ok((y, next))
    }
}
