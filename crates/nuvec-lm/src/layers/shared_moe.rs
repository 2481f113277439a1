//! A mixture of experts with an always-on shared expert (mlx-lm's `Qwen3NextSparseMoeBlock`,
//! which Qwen3.5-MoE uses): the routed experts of [`SparseMoe`] plus one gated MLP whose output
//! is scaled by `sigmoid(shared_expert_gate(x))`, a single number per token. The experts may be
//! stacked as MLX stores them, one module each, or fused as Hugging Face's Qwen3.5-MoE stores them.

use nuvec::{Array, Matrix};

use super::{Linear, Mlp, MoeShape, SparseMoe};
use crate::parallel::Shard;
use crate::weights::Weights;
use crate::{Error, Result};

/// Routed experts and the shared one.
#[derive(Debug, Clone)]
pub struct SharedExpertMoe {
    routed: SparseMoe,
    shared_expert: Mlp,
    shared_expert_gate: Linear,
}

impl SharedExpertMoe {
    /// Loads `{path}.gate`, `{path}.switch_mlp` (or `{path}.experts.{e}`, or the fused
    /// `{path}.experts.gate_up_proj` and `{path}.experts.down_proj`), `{path}.shared_expert` (of
    /// `shared_intermediate` features) and `{path}.shared_expert_gate`.
    pub fn load(weights: &Weights, path: &str, shape: MoeShape, shared_intermediate: usize) -> Result<Self> {
        let routed = if weights.has(&format!("{path}.experts.gate_up_proj")) {
            fused_experts(weights, path, shape)?
        } else {
            SparseMoe::load(weights, path, shape)?
        };
        Ok(SharedExpertMoe {
            routed,
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

    /// This rank's share of the block ([`crate::parallel`]): each routed expert's and the
    /// shared expert's share of their hidden units (each summed over the group); the router and
    /// the shared expert's gate whole.
    pub(crate) fn shard(&self, shard: &Shard) -> Result<SharedExpertMoe> {
        Ok(SharedExpertMoe {
            routed: self.routed.shard(shard)?,
            shared_expert: self.shared_expert.shard(shard)?,
            shared_expert_gate: self.shared_expert_gate.clone(),
        })
    }

    /// Applies the block to `x [L, hidden]`: the routed experts plus the shared one under its
    /// per-token gate, all on the weights' device.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let routed = self.routed.forward(x)?;
        let shared = self.shared_expert.forward(x)?;
        let gates = self.shared_expert_gate.forward(x)?;
        Ok(routed.add_sigmoid_gated(&shared, &gates)?)
    }
}

/// Hugging Face's fused experts: `gate_up_proj [E, 2I, H]` (each expert's gate rows, then its up
/// rows) and `down_proj [E, H, I]`, dense. Seen as `[2E, I, H]`, entry `2e` is expert `e`'s gate
/// and `2e + 1` its up projection: views, no copy (mlx-lm's sanitize splits them the same way).
fn fused_experts(weights: &Weights, path: &str, s: MoeShape) -> Result<SparseMoe> {
    let (gate_up_name, down_name) = (format!("{path}.experts.gate_up_proj"), format!("{path}.experts.down_proj"));
    let (gate_up, down) = (weights.raw(&gate_up_name)?, weights.raw(&down_name)?);
    let (e, i, h) = (s.experts, s.intermediate, s.hidden);
    if gate_up.shape() != [e, 2 * i, h] || down.shape() != [e, h, i] || !gate_up.dtype().is_float() {
        return Err(Error::Invalid(format!(
            "{gate_up_name} {:?} and {down_name} {:?} are not [{e}, {}, {h}] and [{e}, {h}, {i}] floats \
             (num_experts, moe_intermediate_size, hidden_size)",
            gate_up.shape(),
            down.shape(),
            2 * i
        )));
    }
    let halves = gate_up.reshape(&[2 * e, i, h])?;
    let device = weights.device();
    let dense = |a: Array| -> Result<Linear> { Ok(Linear::plain(Matrix::Dense(a.to_device(device)?), None)) };
    let experts = (0..e)
        .map(|x| {
            Ok([
                dense(halves.index_first(2 * x)?)?,
                dense(halves.index_first(2 * x + 1)?)?,
                dense(down.index_first(x)?)?,
            ])
        })
        .collect::<Result<Vec<_>>>()?;
    let gate = Linear::load(weights, &format!("{path}.gate"), h, e, false)?;
    let routing = nuvec::MoeRouting::SoftmaxTopK { normalize: s.norm_topk_prob };
    SparseMoe::from_parts(gate, experts, s.top_k, routing, super::Activation::Silu)
}
