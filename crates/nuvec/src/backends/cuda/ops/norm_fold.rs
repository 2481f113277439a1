//! The output and down projections of a decode row with the residual add and the next norm
//! folded in (`qgemv_norm_b4_i4`, kernels/linear.cu; issue 7). The GEMV writes `h = residual +
//! x w^T` and, for the norm's output, `u = h * weight` with its integer parts and the sums of
//! squares of `h` (common.cuh, the parts' norm tail): the integer GEMVs that read the norm's
//! output scale their totals by `1 / rms(h)`, so no norm kernel runs. The output array holds `u`
//! until something reads it as values (`DeviceBuffer::settle` scales it in place then).

use cudarc::driver::LaunchConfig;

use super::{float_code, int_gemvs, int_parts_bytes, to_i32, CudaBackend};
use crate::backends::cuda::{Derived, DeviceBuffer, State};
use crate::{Array, DType, Error, Matrix, QuantMode, Result};

/// Whether the fold is on (`NUVEC_NORM_FOLD=0` keeps the projection and the norm apart).
fn enabled(st: &State) -> bool {
    st.knobs.norm_fold && int_gemvs(&st.knobs)
}

impl CudaBackend {
    /// One `qgemv_norm_b4_i4` launch for one f32 input row of `k` (a multiple of 32) and a 4-bit
    /// affine `w` with groups of 32 or more and `n` rows (a multiple of 32), the residual one f32
    /// row of `n`, `eps` > 0. `None` (nothing launched) otherwise.
    pub(super) fn fused_linear_add_rms_norm(
        &self,
        x: &Array,
        w: &Matrix,
        residual: &Array,
        weight: &Array,
        eps: f32,
    ) -> Result<Option<(Array, Array)>> {
        let op = "linear_add_rms_norm";
        if !enabled(self.st()?) || x.shape().is_empty() || residual.shape().is_empty() {
            return Ok(None);
        }
        let Matrix::Quantized(q) = w else {
            return Ok(None);
        };
        let (k, n) = (x.dim(-1), w.rows());
        let fits = x.len() == k
            && k.is_multiple_of(32)
            && w.cols() == k
            && n > 0
            && n.is_multiple_of(32)
            && residual.len() == n
            && residual.dim(-1) == n
            && weight.len() == n
            && eps > 0.0
            && x.dtype() == DType::F32
            && residual.dtype() == DType::F32
            && x.device() == self.dev()
            && residual.device() == self.dev()
            && weight.device() == self.dev()
            && q.spec.mode == QuantMode::Affine
            && q.spec.bits == 4
            && q.spec.group_size >= 32
            && q.spec.group_size.is_power_of_two();
        if !fits {
            return Ok(None);
        }
        let wa = self.weight_args(op, w)?;
        if !(wa.packed | x.cuda_addr()?).is_multiple_of(16) {
            return Ok(None);
        }
        let (xq, _split) = self.gemv_input(op, "_i4", x, k)?;
        let rp = self.f32_ptr(op, "residual", residual)?;
        let (nw_dt, nwp) = (float_code(op, "weight", weight)?, self.ptr(op, "weight", weight)?);
        let h = self.output(residual.shape(), DType::F32, false)?;
        let normed = self.output(residual.shape(), DType::F32, false)?;
        let parts = DeviceBuffer::alloc(self.st()?, int_parts_bytes(n))?;
        let (hp, yp, pp) = (h.cuda_addr()?, normed.cuda_addr()?, parts.ptr());
        let (ni, ki) = (to_i32(op, "rows", n)?, to_i32(op, "k", k)?);
        let (packed, scales, biases, p_dt) = (wa.packed, wa.scales, wa.biases, wa.p_dt);
        let lg = q.spec.group_size.trailing_zeros() as i32;
        let blocks = to_i32(op, "blocks", n / 32)? as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
        launch!(self.st()?, op, "qgemv_norm_b4_i4", cfg;
            hp, yp, xq, ni, packed, scales, biases, p_dt, lg, ki, rp, nwp, nw_dt, eps, pp);
        normed.set_derived(Derived::IntParts, parts);
        normed.set_pending_norm();
        Ok(Some((h, normed)))
    }
}
