//! A mixture-of-experts router on a CUDA device (kernels/moe_router.cu): the top-k of logits
//! (`moe_route`), and for a few rows the router's product and the top-k in one launch
//! (`moe_route_dense`, for routers of plain f32, f16 or bf16 weights: a GGUF's, which llama.cpp
//! never quantizes, and an unquantized checkpoint's). A decode layer then spends one launch on its
//! routing where the product (cuBLAS's dot and reduction kernels for an f32 router), the top-k and
//! the settling of the norm before it (a pending norm's scale, which the kernel applies to the
//! logits instead) took four.

use cudarc::driver::LaunchConfig;

use super::moe::{MAX_EXPERTS, MAX_TOP_K};
use super::{float_code, to_i32, CudaBackend};
use crate::backends::cuda::State;
use crate::moe::{self, MoeRouting};
use crate::{Array, DType, Error, Matrix, Result};

/// Most rows the one-launch router takes (tickets: one counter per row); more run the product as
/// a matrix product, then `moe_route`.
const ROUTE_ROWS: usize = 8;
const _: () = assert!(ROUTE_ROWS <= crate::backends::cuda::TICKETS, "a counter per routed row");
/// Experts per block of `moe_route_dense` (moe_router.cu's `MOE_RL_EXPERTS`).
const ROUTE_EXPERTS_PER_BLOCK: usize = 4;
/// Threads per block of `moe_route` and `moe_route_dense` (`MOE_ROUTE_THREADS`, `32 * MOE_RL_WARPS`).
const ROUTE_THREADS: u32 = 256;

/// moe_router.cu's routing modes and whether the softmax-top-k renormalizes.
fn mode_args(routing: MoeRouting) -> (i32, i32) {
    match routing {
        MoeRouting::SoftmaxTopK { normalize } => (0, normalize as i32),
        MoeRouting::TopKSoftmax => (1, 0),
    }
}

impl CudaBackend {
    /// [`crate::Backend::moe_route`]: one block per row.
    /// With `bias`, [`crate::Backend::moe_route_bias`]: the bias row added in the same launch.
    pub(super) fn route_experts(
        &self,
        logits: &Array,
        bias: Option<&Array>,
        top_k: usize,
        routing: MoeRouting,
    ) -> Result<(Array, Array)> {
        let op = "moe_route";
        let (rows, n) = moe::check_route(logits, top_k)?;
        if n > MAX_EXPERTS || top_k > MAX_TOP_K || !self.bias_row_fits(bias, n) {
            let biased = bias.map(|b| logits.add_bias(b)).transpose()?;
            return moe::route_composed(biased.as_ref().unwrap_or(logits), top_k, routing);
        }
        let lp = self.f32_ptr(op, "logits", logits)?;
        let (bp, b_dt) = self.opt_float_ptr(op, "bias", bias)?;
        let ids = self.output(&[rows, top_k], DType::U32, false)?;
        let weights = self.output(&[rows, top_k], DType::F32, false)?;
        if rows > 0 {
            let (ip, wp) = (ids.cuda_ptr()?, weights.cuda_ptr()?);
            let (ni, ki) = (to_i32(op, "experts", n)?, to_i32(op, "top_k", top_k)?);
            let (mode, normalize) = mode_args(routing);
            let cfg = LaunchConfig {
                grid_dim: (to_i32(op, "rows", rows)? as u32, 1, 1),
                block_dim: (ROUTE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(self.st()?, op, "moe_route", cfg; ip, wp, lp, ni, ki, mode, normalize, bp, b_dt);
        }
        Ok((ids, weights))
    }

    /// [`crate::Backend::moe_route_linear`]: `moe_route_dense` for up to [`ROUTE_ROWS`] rows of
    /// a plain float router whose rows and `x` are 16-byte aligned, else the product and then
    /// [`CudaBackend::route_experts`] (`moe::route_linear_composed`).
    pub(super) fn route_linear(
        &self,
        x: &Array,
        router: &Matrix,
        bias: Option<&Array>,
        top_k: usize,
        routing: MoeRouting,
    ) -> Result<(Array, Array)> {
        let op = "moe_route_linear";
        let Some((w, rows)) = self.one_launch_router(x, router, bias, top_k)? else {
            return moe::route_linear_composed(self, x, router, bias, top_k, routing);
        };
        let (n, k) = (w.dim(0), w.dim(1));
        // A norm's output with its scale still pending is read as it is, the scale applied to
        // the logits (taking its address for values would settle it: one more launch).
        let pending = x.pending_norm_parts().unwrap_or(0);
        let xp = if pending != 0 { x.cuda_addr()? } else { self.f32_ptr(op, "x", x)? };
        let wp = self.ptr(op, "router", w)?;
        let w_dt = float_code(op, "router", w)?;
        let (bp, b_dt) = self.opt_float_ptr(op, "bias", bias)?;
        let ids = self.output(&[rows, top_k], DType::U32, false)?;
        let weights = self.output(&[rows, top_k], DType::F32, false)?;
        let logits = self.output(&[rows, n], DType::F32, false)?;
        let (ip, op_w, lp) = (ids.cuda_ptr()?, weights.cuda_ptr()?, logits.cuda_ptr()?);
        let st = self.st()?;
        let tickets = st.tickets();
        let (ni, ki, kk) = (to_i32(op, "experts", n)?, to_i32(op, "top_k", top_k)?, to_i32(op, "hidden", k)?);
        let (mode, normalize) = mode_args(routing);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(ROUTE_EXPERTS_PER_BLOCK) as u32, rows as u32, 1),
            block_dim: (ROUTE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(st, op, "moe_route_dense", cfg;
            ip, op_w, lp, tickets, xp, wp, w_dt, kk, ni, ki, mode, normalize, bp, b_dt, pending);
        Ok((ids, weights))
    }

    /// Whether a router's bias row (or none) is one the kernels add: `experts` values here.
    fn bias_row_fits(&self, bias: Option<&Array>, experts: usize) -> bool {
        bias.is_none_or(|b| b.len() == experts && b.device() == self.dev())
    }

    /// The router's weight and the row count when `moe_route_dense` takes them: f32 rows of x
    /// on this device (1 to [`ROUTE_ROWS`]), a plain float router `[experts, hidden]` here with
    /// hidden a multiple of 8, both 16-byte aligned, and a top-k and bias the routing takes.
    fn one_launch_router<'w>(
        &self,
        x: &Array,
        router: &'w Matrix,
        bias: Option<&Array>,
        top_k: usize,
    ) -> Result<Option<(&'w Array, usize)>> {
        let Matrix::Dense(w) = router else { return Ok(None) };
        let float = matches!(w.dtype(), DType::F32 | DType::F16 | DType::BF16);
        if !float || w.shape().len() != 2 || w.device() != self.dev() || !self.plain_input(x, None) {
            return Ok(None);
        }
        let (n, k) = (w.dim(0), w.dim(1));
        let rows = x.len() / k.max(1);
        let fits = x.dim(-1) == k
            && k.is_multiple_of(8)
            && (1..=ROUTE_ROWS).contains(&rows)
            && (1..=MAX_EXPERTS).contains(&n)
            && (1..=MAX_TOP_K.min(n)).contains(&top_k)
            && self.bias_row_fits(bias, n);
        if !fits || !x.cuda_addr()?.is_multiple_of(16) || !w.cuda_addr()?.is_multiple_of(16) {
            return Ok(None);
        }
        Ok(Some((w, rows)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_modes_match_the_kernels_defines() {
        let src = include_str!("../kernels/moe_router.cu");
        assert!(src.contains("#define MOE_ROUTE_SOFTMAX_TOPK 0") && src.contains("#define MOE_ROUTE_TOPK_SOFTMAX 1"));
        assert_eq!(mode_args(MoeRouting::SoftmaxTopK { normalize: true }), (0, 1));
        assert_eq!(mode_args(MoeRouting::TopKSoftmax), (1, 0));
        let per_block = "#define MOE_RL_EXPERTS (MOE_RL_WARPS / MOE_RL_SPLIT)";
        assert!(
            src.contains(per_block) && src.contains("#define MOE_RL_WARPS 8") && src.contains("#define MOE_RL_SPLIT 2")
        );
        assert!(src.contains(&format!("#define MOE_ROUTE_THREADS {ROUTE_THREADS}")));
        assert_eq!(ROUTE_EXPERTS_PER_BLOCK * 2 * 32, ROUTE_THREADS as usize);
    }
}
