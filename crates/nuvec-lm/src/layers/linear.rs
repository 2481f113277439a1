//! `y = x W^T + b`, with W dense or quantized as the checkpoint stores it.

use nuvec::{Array, Matrix};

use crate::weights::Weights;
use crate::Result;

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
        let y = x.linear(&self.weight)?;
        Ok(match &self.bias {
            Some(b) => y.add_bias(b)?,
            None => y,
        })
    }
}
