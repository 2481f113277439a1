//! The GELU-gated feed-forward block (GeGLU) of the Gemma family.

use nuvec::Array;

use super::Linear;
use crate::weights::Weights;
use crate::Result;

/// `down(gelu_approx(gate(x)) * up(x))`, with mlx's tanh approximation of GELU.
#[derive(Debug, Clone)]
pub struct GeluMlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl GeluMlp {
    /// Loads `{path}.{gate,up,down}_proj` (no biases) mapping `dims` features through `hidden`.
    pub fn load(weights: &Weights, path: &str, dims: usize, hidden: usize) -> Result<Self> {
        Ok(GeluMlp {
            gate_proj: Linear::load(weights, &format!("{path}.gate_proj"), dims, hidden, false)?,
            up_proj: Linear::load(weights, &format!("{path}.up_proj"), dims, hidden, false)?,
            down_proj: Linear::load(weights, &format!("{path}.down_proj"), hidden, dims, false)?,
        })
    }

    /// Builds the block from its three projections (`[hidden, dims]`, `[hidden, dims]`,
    /// `[dims, hidden]`), as a mixture of experts holds them.
    pub fn from_projections(gate_proj: Linear, up_proj: Linear, down_proj: Linear) -> Self {
        GeluMlp { gate_proj, up_proj, down_proj }
    }

    /// Applies the block to `x [L, dims]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let [gate, up] = Linear::forward_many([&self.gate_proj, &self.up_proj], x)?;
        self.down_proj.forward(&gate.gelu_mul(&up)?)
    }
}
