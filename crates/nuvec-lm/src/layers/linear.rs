//! `y = x W^T + b`, with W dense or quantized as the checkpoint stores it.

use nuvec::{Array, Matrix};

use super::RmsNorm;
use crate::adapter::LowRank;
use crate::weights::Weights;
use crate::{Error, Result};

/// A linear layer.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Matrix,
    /// `[out]`, when the layer has one.
    pub bias: Option<Array>,
    /// A LoRA / DoRA adapter's term, when one adapts this projection: the fused paths below
    /// then take the plain ones, so the term is never skipped.
    pub adapter: Option<LowRank>,
}

impl Linear {
    /// Loads module `path` mapping `inputs` to `outputs` features; `bias` says whether the
    /// config gives it one.
    pub fn load(weights: &Weights, path: &str, inputs: usize, outputs: usize, bias: bool) -> Result<Self> {
        let weight = weights.matrix(path, outputs, inputs)?;
        let bias = if bias { Some(weights.tensor(&format!("{path}.bias"), &[outputs])?) } else { None };
        let adapter = match weights.adapter() {
            Some(a) => a.low_rank(path, &weight, weights.device())?,
            None => None,
        };
        Ok(Linear { weight, bias, adapter })
    }

    /// A layer of `weight` and `bias` alone.
    pub fn plain(weight: Matrix, bias: Option<Array>) -> Self {
        Linear { weight, bias, adapter: None }
    }

    /// Applies the layer to `x [..., in]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = x.linear(&self.weight)?;
        match &self.adapter {
            Some(adapter) => self.with_bias(adapter.apply(x, y)?),
            None => self.with_bias(y),
        }
    }

    /// Applies several layers to the same `x [..., in]` (q/k/v, gate/up), in order; the backend
    /// may run them as one pass. Same results as [`Linear::forward`] on each.
    pub fn forward_many<const N: usize>(layers: [&Linear; N], x: &Array) -> Result<[Array; N]> {
        if layers.iter().any(|l| l.adapter.is_some()) {
            let outs: Vec<Array> = layers.iter().map(|l| l.forward(x)).collect::<Result<_>>()?;
            return outs.try_into().map_err(|_| Error::Invalid("forward_many: one output per layer".into()));
        }
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
        if self.adapter.is_some() {
            return self.forward(&gate.silu_mul(up)?);
        }
        self.with_bias(gate.silu_mul_linear(up, &self.weight)?)
    }

    /// `h = residual + self.forward(x)` and `(h, norm(h))`: an output or down projection with
    /// the residual add and the norm after it, which a backend may fold together
    /// ([`nuvec::Backend::linear_add_rms_norm`]; with a bias, the separate ops).
    pub fn forward_add_norm(&self, x: &Array, residual: &Array, norm: &RmsNorm) -> Result<(Array, Array)> {
        if self.bias.is_some() || self.adapter.is_some() {
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
