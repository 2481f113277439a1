//! A mixture of experts with an always-on shared expert (mlx-lm's `Qwen3NextSparseMoeBlock`,
//! which Qwen3.5-MoE uses): the routed experts of [`SparseMoe`] plus one gated MLP whose output
//! is scaled by `sigmoid(shared_expert_gate(x))`, a single number per token.

use nuvec::Array;

use super::{Linear, Mlp, MoeShape, SparseMoe};
use crate::weights::Weights;
use crate::Result;

/// Routed experts and the shared one.
#[derive(Debug, Clone)]
pub struct SharedExpertMoe {
    routed: SparseMoe,
    shared_expert: Mlp,
    shared_expert_gate: Linear,
}

impl SharedExpertMoe {
    /// Loads `{path}.gate`, `{path}.switch_mlp` (or `{path}.experts.{e}`), `{path}.shared_expert`
    /// (of `shared_intermediate` features) and `{path}.shared_expert_gate`.
    pub fn load(weights: &Weights, path: &str, shape: MoeShape, shared_intermediate: usize) -> Result<Self> {
        Ok(SharedExpertMoe {
            routed: SparseMoe::load(weights, path, shape)?,
            shared_expert: Mlp::load(
                weights,
                &format!("{path}.shared_expert"),
                shape.hidden,
                shared_intermediate,
                false,
            )?,
            shared_expert_gate: Linear::load(weights, &format!("{path}.shared_expert_gate"), shape.hidden, 1, false)?,
        })
    }

    /// Applies the block to `x [L, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (l, hidden) = (x.dim(0), x.dim(1));
        // Like the routing, the per-token gate is combined on the host ([L] gates, [L, hidden] rows).
        let routed = self.routed.forward(x)?.to_vec::<f32>()?;
        let shared = self.shared_expert.forward(x)?.to_vec::<f32>()?;
        let gates = self.shared_expert_gate.forward(x)?.to_vec::<f32>()?;
        let mut out = routed;
        for ((o, s), &g) in out.chunks_mut(hidden).zip(shared.chunks(hidden)).zip(&gates) {
            let g = 1.0 / (1.0 + (-g).exp());
            o.iter_mut().zip(s).for_each(|(o, s)| *o += g * s);
        }
        Ok(Array::from_slice_on(&out, &[l, hidden], x.device())?)
    }
}
