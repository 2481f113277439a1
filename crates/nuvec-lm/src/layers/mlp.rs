//! The gated (SwiGLU) feed-forward block.

use nuvec::Array;

use super::Linear;
use crate::weights::Weights;
use crate::Result;

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

    /// Applies the block to `x [L, dims]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let [gate, up] = Linear::forward_many([&self.gate_proj, &self.up_proj], x)?;
        self.down_proj.forward_silu_mul(&gate, &up)
    }
}
