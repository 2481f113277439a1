//! gated MLP fusion on a CUDA device (`gate_up_silu_b4_*` in kernels/linear.cu): a decode row's
//! `silu(x gate^T) * (x up^T)` in the gate/up GEMV, one launch where `linear_many` then
//! `silu_mul` take two. It takes the case that `linear_many` runs as one `qgemv_multi_b4_*`
//! launch with groups of 32 or more, in the shape that launch would take, so its result equals
//! the composition bit for bit; anything else runs the composition.

use cudarc::driver::LaunchConfig;

use super::{qgemv4_variant, to_i32, CudaBackend};
use crate::backends::cuda::{Derived, State};
use crate::{Array, DType, Error, Matrix, QuantMode, Result};

impl CudaBackend {
    /// One `gate_up_silu_b4_*` launch for one input row (f32, 16-byte aligned, `k` a multiple of
    /// 32) and 4-bit affine `gate`, `up` of one shape, group size (32 or more) and scale dtype,
    /// their packed words 16-byte aligned. `None` (nothing launched) otherwise, or when
    /// `NUVEC_GATE_UP_SILU=0` (so that the two launches of the composition can be timed and
    /// compared against it).
    pub(super) fn fused_gate_up_silu(&self, x: &Array, gate: &Matrix, up: &Matrix) -> Result<Option<Array>> {
        let op = "gate_up_silu";
        if !self.st()?.knobs.gate_up_silu || x.shape().is_empty() || x.dtype() != DType::F32 || x.device() != self.dev()
        {
            return Ok(None);
        }
        let k = x.dim(-1);
        let (Matrix::Quantized(g), Matrix::Quantized(u)) = (gate, up) else {
            return Ok(None);
        };
        let n = gate.rows();
        let fits = x.len() == k
            && k.is_multiple_of(32)
            && gate.cols() == k
            && up.cols() == k
            && up.rows() == n
            && g.spec == u.spec
            && g.spec.mode == QuantMode::Affine
            && g.spec.bits == 4
            && g.spec.group_size >= 32;
        if !fits {
            return Ok(None);
        }
        let (ga, ua) = (self.weight_args(op, gate)?, self.weight_args(op, up)?);
        let xp = x.cuda_addr()?; // alignment only: gemv_input gives what the kernel reads
        if ga.p_dt != ua.p_dt || !(xp | ga.packed | ua.packed).is_multiple_of(16) {
            return Ok(None);
        }
        // The shape of the [gate; up] launch of `linear_many` (same warps per block, so each
        // row's sum adds in the same order).
        // Every shape has a fused twin `gate_up_silu_b4{suffix}` taking half its rows of gate per
        // block and as many of up, but `qgemv1_b4` (no suffix, `NUVEC_QGEMV_VARIANT=body`).
        let (suffix, rows, threads) = qgemv4_variant(&self.st()?.knobs, k, 2 * n, true);
        if suffix.is_empty() {
            return Ok(None);
        }
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("x has an axis") = n;
        let out = self.output(&shape, DType::F32, false)?;
        if n == 0 {
            return Ok(Some(out));
        }
        let (xp, _parts) = self.gemv_input(op, suffix, x, k)?;
        let st = self.st()?;
        let o = out.cuda_ptr()?;
        let (ni, p_dt, ki) = (to_i32(op, "rows", n)?, ga.p_dt, to_i32(op, "k", k)?);
        let lg = g.spec.group_size.trailing_zeros() as i32;
        let (pg, sg, bg, pu, su, bu) = (ga.packed, ga.scales, ga.biases, ua.packed, ua.scales, ua.biases);
        // Where _i1 is picked and the outputs are whole 32-value chunks, _i1_parts runs _i1's blocks as
        // the warps of a chunk's block and also writes the down projection's integer parts.
        let parts = if suffix == "_i1" && n.is_multiple_of(32) { self.row_int_parts("gate_up", 1, n)? } else { None };
        if let Some(parts) = parts {
            let pp = parts.ptr();
            let blocks = to_i32(op, "blocks", n / 32)? as u32;
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            launch!(st, op, "gate_up_silu_b4_i1_parts", cfg; o, xp, ni, pg, sg, bg, pu, su, bu, p_dt, lg, ki, pp);
            out.set_derived(Derived::IntParts, parts);
            return Ok(Some(out));
        }
        let (name, rows_per_block) = (format!("gate_up_silu_b4{suffix}"), rows / 2);
        let blocks = to_i32(op, "blocks", n.div_ceil(rows_per_block))? as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
        launch!(st, op, name.as_str(), cfg; o, xp, ni, pg, sg, bg, pu, su, bu, p_dt, lg, ki);
        Ok(Some(out))
    }
}
