//! The gated (SwiGLU) feed-forward block.

use nuvec::Array;

use super::{Linear, RmsNorm};
use crate::parallel::Shard;
use crate::weights::Weights;
use crate::Result;

/// Rows per block when a prefill chunk is longer (see [`Mlp::forward`]).
const ROW_BLOCK: usize = 512;

/// `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    /// Loads `{path}.{gate,up,down}_proj`.
    pub fn load(weights: &Weights, path: &str, dims: usize, hidden: usize, bias: bool) -> Result<Self> {
        Ok(Mlp {
            gate_proj: Linear::load(weights, &format!("{path}.gate_proj"), dims, hidden, bias)?,
            up_proj: Linear::load(weights, &format!("{path}.up_proj"), dims, hidden, bias)?,
            down_proj: Linear::load(weights, &format!("{path}.down_proj"), hidden, dims, bias)?,
        })
    }

    /// This rank's share of the block: its share of the hidden units, the down projection's
    /// products summed over the group.
    pub(crate) fn shard(&self, shard: &Shard) -> Result<Mlp> {
        let units = shard.part(self.gate_proj.weight.rows(), "hidden units")?;
        Ok(Mlp {
            gate_proj: self.gate_proj.output_part(units.clone())?,
            up_proj: self.up_proj.output_part(units.clone())?,
            down_proj: self.down_proj.input_part(units, shard.group())?,
        })
    }

    /// Applies the block to `x [L, dims]`. Rows are independent here, so a long prefill chunk
    /// runs in blocks of rows: the same arithmetic, without holding the `[L, hidden]`
    /// intermediates of the whole chunk at once.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let l = x.dim(0);
        // CUDA prefill (issue 7, phase 4): each product decodes its whole weight to bf16 tiles
        // per call, so blocks of rows would decode every weight once per block (4 times per
        // 2048-token chunk); the chunk's intermediates fit in GPU memory, so take it whole.
        if l <= ROW_BLOCK || x.device() != nuvec::Device::Cpu {
            return self.forward_rows(x);
        }
        let dims = x.dim(1);
        let mut out = Array::zeros_on(&[1, l, dims], nuvec::DType::F32, x.device())?;
        for start in (0..l).step_by(ROW_BLOCK) {
            let end = (start + ROW_BLOCK).min(l);
            let y = self.forward_rows(&x.slice_rows(start, end)?)?;
            out.write_axis1(&y.reshape(&[1, end - start, dims])?, start)?;
        }
        Ok(out.reshape(&[l, dims])?)
    }

    /// [`Mlp::forward`] with the residual add and the norm after it: `(h, norm(h))` for
    /// `h = residual + forward(x)`, the down projection folding them in on a decode row
    /// ([`Linear::forward_add_norm`]).
    pub fn forward_add_norm(&self, x: &Array, residual: &Array, norm: &RmsNorm) -> Result<(Array, Array)> {
        match self.decode_row_hidden(x)? {
            Some(hidden) => self.down_proj.forward_add_norm(&hidden, residual, norm),
            None => norm.forward_add(residual, &self.forward(x)?),
        }
    }

    fn forward_rows(&self, x: &Array) -> Result<Array> {
        if let Some(hidden) = self.decode_row_hidden(x)? {
            return self.down_proj.forward(&hidden);
        }
        let [gate, up] = Linear::forward_many([&self.gate_proj, &self.up_proj], x)?;
        self.down_proj.forward_silu_mul(&gate, &up)
    }

    /// silu(gate) * up for a decode row without biases, in one op (on CUDA inside the gate/up
    /// GEMV, one launch fewer per layer), with the bits of forward_rows' other path
    /// (linear_many, then silu_mul inside the down projection); `None` for other inputs. Longer
    /// inputs (prefill) keep that path: CUDA makes silu(gate) * up there in bf16 in the same
    /// pass that feeds the bf16 GEMM of the down projection.
    fn decode_row_hidden(&self, x: &Array) -> Result<Option<Array>> {
        let plain = |l: &Linear| l.bias.is_none() && !l.adapted();
        if x.dim(0) != 1 || !plain(&self.gate_proj) || !plain(&self.up_proj) {
            return Ok(None);
        }
        Ok(Some(x.gate_up_silu(&self.gate_proj.weight, &self.up_proj.weight)?))
    }
}
