//! RMS normalization.

use nuvec::Array;

use crate::weights::Weights;
use crate::Result;

/// `x * rsqrt(mean(x^2) + eps) * weight` over the last axis.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    /// Loads `{path}.weight` of `dims` features (refused when it holds a NaN or an infinity).
    pub fn load(weights: &Weights, path: &str, dims: usize, eps: f32) -> Result<Self> {
        Ok(RmsNorm { weight: weights.norm_tensor(&format!("{path}.weight"), &[dims])?, eps })
    }

    /// A norm with the given `weight` (one per feature), e.g. one adjusted or computed at load (a
    /// router's `scale * hidden^-0.5`).
    pub fn from_weight(weight: Array, eps: f32) -> Self {
        RmsNorm { weight, eps }
    }

    /// Normalizes `x`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(x.rms_norm(&self.weight, self.eps)?)
    }

    /// `(x + residual, self.forward(x + residual))`: a residual add and this norm after it, in
    /// one op where the backend fuses them (the same values as `add` then `forward`).
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<(Array, Array)> {
        Ok(x.add_rms_norm(residual, &self.weight, self.eps)?)
    }

    /// [`RmsNorm::forward_add`] of `x` and `residual + bias` (`bias` one value per feature: the
    /// projection's that made `residual`), the bias added in the same op where the backend can.
    pub fn forward_add_bias(&self, x: &Array, residual: &Array, bias: &Array) -> Result<(Array, Array)> {
        Ok(x.add_bias_rms_norm(residual, bias, &self.weight, self.eps)?)
    }

    /// The learned scale, one per feature.
    pub fn weight(&self) -> &Array {
        &self.weight
    }

    /// The epsilon added to the mean square.
    pub fn eps(&self) -> f32 {
        self.eps
    }
}

// Gemma 4
impl RmsNorm {
    /// A norm without a learned scale (mlx's `rms_norm(x, None, eps)`): the weight is all ones,
    /// which multiplies exactly. Made on `device`, where the activations it normalizes are.
    pub fn without_scale(dims: usize, eps: f32, device: nuvec::Device) -> Result<Self> {
        Ok(RmsNorm { weight: Array::from_slice_on(&vec![1f32; dims], &[dims], device)?, eps })
    }
}
