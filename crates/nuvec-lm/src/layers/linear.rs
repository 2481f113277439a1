//! `y = x W^T + b`, with W dense or quantized as the checkpoint stores it.

use nuvec::{Array, Matrix};

use super::RmsNorm;
use crate::weights::Weights;
use crate::{Error, Result};

/// A linear layer.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Matrix,
    /// `[out]`, when the layer has one.
    pub bias: Option<Array>,
}

impl Linear {
    /// Loads module `path` mapping `inputs` to `outputs` features; `bias` says whether the
    /// config gives it one.
    pub fn load(weights: &Weights, path: &str, inputs: usize, outputs: usize, bias: bool) -> Result<Self> {
        let weight = weights.matrix(path, outputs, inputs)?;
        let bias = if bias { Some(weights.tensor(&format!("{path}.bias"), &[outputs])?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// Applies the layer to `x [..., in]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.with_bias(x.linear(&self.weight)?)
    }

    /// Applies several layers to the same `x [..., in]` (q/k/v, gate/up), in order; the backend
    /// may run them as one pass. Same results as [`Linear::forward`] on each.
    pub fn forward_many<const N: usize>(layers: [&Linear; N], x: &Array) -> Result<[Array; N]> {
        let weights = layers.map(|l| &l.weight);
        let mut outs = x.linear_many(&weights)?;
        if outs.len() != N {
            return Err(Error::Invalid(format!("linear_many returned {} arrays for {N} weights", outs.len())));
        }
        for (y, layer) in outs.iter_mut().zip(layers) {
            if let Some(b) = &layer.bias {
                *y = y.add_bias(b)?;
            }
        }
        outs.try_into().map_err(|_| Error::Invalid("linear_many: length checked above".into()))
    }

    /// `(silu(gate) * up)` through this layer (a gated MLP's down projection); the backend may
    /// fuse the product into the matrix-vector pass. Same result as `forward(gate.silu_mul(up))`.
    pub fn forward_silu_mul(&self, gate: &Array, up: &Array) -> Result<Array> {
        self.with_bias(gate.silu_mul_linear(up, &self.weight)?)
    }

    /// `h = residual + self.forward(x)` and `(h, norm(h))`: an output or down projection with
    /// the residual add and the norm after it, which a backend may fold together
    /// ([`nuvec::Backend::linear_add_rms_norm`]; with a bias, the separate ops).
    pub fn forward_add_norm(&self, x: &Array, residual: &Array, norm: &RmsNorm) -> Result<(Array, Array)> {
        if self.bias.is_some() {
            return norm.forward_add(residual, &self.forward(x)?);
        }
        Ok(x.linear_add_rms_norm(&self.weight, residual, norm.weight(), norm.eps())?)
    }

    fn with_bias(&self, y: Array) -> Result<Array> {
        Ok(match &self.bias {
            Some(b) => y.add_bias(b)?,
            None => y,
        })
    }
}
