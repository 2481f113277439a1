//! Mixture-of-experts feed-forward (mlx-lm's `SwitchGLU` behind a softmax router), as Qwen3-MoE
//! uses it: each token goes to its top-k experts, whose gated MLP outputs are summed with the
//! router's (optionally renormalized) probabilities. gpt-oss routes and activates differently
//! ([`MoeRouting`], [`Activation`]) and gives every projection a bias.

use nuvec::distributed::Group;
use nuvec::{Array, Experts, Matrix, MoeRouting};

use super::{Linear, Mlp, RmsNorm};
use crate::parallel::Shard;
use crate::weights::Weights;
use crate::{Error, Result};

/// The experts' gated activation (`silu(gate) * up`, or gpt-oss's clamped SwiGLU).
pub use nuvec::ExpertActivation as Activation;

/// The router and the experts of one layer.
#[derive(Debug, Clone)]
pub struct SparseMoe {
    gate: Linear,
    experts: Experts,
    top_k: usize,
    routing: MoeRouting,
    /// The ranks whose experts' outputs are summed, on a rank's share of a split model.
    sum_over: Option<Group>,
}

/// Sizes and options of a sparse block.
#[derive(Debug, Clone, Copy)]
pub struct MoeShape {
    /// Model width.
    pub hidden: usize,
    /// Each expert's intermediate width.
    pub intermediate: usize,
    /// Experts in the layer.
    pub experts: usize,
    /// Experts each token uses.
    pub top_k: usize,
    /// Renormalize the chosen experts' probabilities to sum to one.
    pub norm_topk_prob: bool,
}

impl SparseMoe {
    /// Loads `{path}.gate` and the experts of `{path}.switch_mlp` (or `{path}.experts.{e}`).
    pub fn load(weights: &Weights, path: &str, s: MoeShape) -> Result<Self> {
        let gate = Linear::load(weights, &format!("{path}.gate"), s.hidden, s.experts, false)?;
        let projection = |name: &str, rows, cols| {
            weights.experts(
                &format!("{path}.switch_mlp.{name}"),
                |e| format!("{path}.experts.{e}.{name}"),
                s.experts,
                rows,
                cols,
            )
        };
        let gates = projection("gate_proj", s.intermediate, s.hidden)?;
        let ups = projection("up_proj", s.intermediate, s.hidden)?;
        let downs = projection("down_proj", s.hidden, s.intermediate)?;
        let experts = Experts::new(gates, ups, downs, None, Activation::Silu)?;
        Ok(SparseMoe {
            gate,
            experts,
            top_k: s.top_k,
            routing: MoeRouting::SoftmaxTopK { normalize: s.norm_topk_prob },
            sum_over: None,
        })
    }

    /// A block from its parts: the `router` (biased or not), each expert's `[gate, up, down]`
    /// projections, and how it routes and activates (gpt-oss, and Qwen3.5-MoE's fused Hugging
    /// Face experts, build theirs this way).
    pub fn from_parts(
        router: Linear,
        experts: Vec<[Linear; 3]>,
        top_k: usize,
        routing: MoeRouting,
        activation: Activation,
    ) -> Result<Self> {
        Ok(SparseMoe { gate: router, experts: stack(experts, activation)?, top_k, routing, sum_over: None })
    }

    /// This rank's share of the block: the router whole (every rank routes alike: their inputs
    /// are the same bits), each expert's share of its hidden units, the outputs summed over the
    /// group.
    pub(crate) fn shard(&self, shard: &Shard) -> Result<SparseMoe> {
        let units = shard.part(self.experts.intermediate(), "expert hidden units")?;
        if self.gate.has_adapters() {
            return Err(Error::Unsupported(
                "an adapter on a model split across ranks: fuse it into the base first (`nuvec fuse`)".into(),
            ));
        }
        Ok(SparseMoe {
            experts: self.experts.units_part(units, shard.group().rank() == 0)?,
            sum_over: Some(shard.group().clone()),
            ..self.clone()
        })
    }

    /// Applies the block to `x [L, hidden]`: the router's choices and the experts' weighted sum
    /// stay on the weights' device.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        // The router's product (and its bias, gpt-oss's) with the choice, which the backend may
        // run as one pass; an adapter's term on the router needs the logits first.
        let (ids, weights) = match self.gate.adapted() {
            true => self.gate.forward(x)?.moe_route(self.top_k, self.routing)?,
            false => x.moe_route_linear(&self.gate.weight, self.gate.bias.as_ref(), self.top_k, self.routing)?,
        };
        let y = x.moe_experts(&self.experts, &ids, &weights)?;
        match &self.sum_over {
            Some(group) => crate::parallel::sum_over(group, y),
            None => Ok(y),
        }
    }
}

/// Per-expert layers as one [`Experts`]: biases on every projection of every expert, or on none.
fn stack(experts: Vec<[Linear; 3]>, activation: Activation) -> Result<Experts> {
    let with_bias = experts.iter().flatten().filter(|l| l.bias.is_some()).count();
    if with_bias != 0 && with_bias != 3 * experts.len() {
        return Err(Error::Invalid(format!(
            "{with_bias} of the experts' {} projections have a bias: all or none must",
            3 * experts.len()
        )));
    }
    if experts.iter().flatten().any(Linear::has_adapters) {
        return Err(Error::Unsupported("adapters on MoE experts are not supported yet".into()));
    }
    let mut parts: [Vec<Matrix>; 3] = Default::default();
    let mut biases: [Vec<Array>; 3] = Default::default();
    for expert in experts {
        for (p, layer) in expert.into_iter().enumerate() {
            parts[p].push(layer.weight);
            if let Some(b) = layer.bias {
                biases[p].push(b);
            }
        }
    }
    let [gate, up, down] = parts;
    Ok(Experts::new(gate, up, down, (with_bias != 0).then_some(biases), activation)?)
}

/// A layer's feed-forward block: dense, or a mixture of experts.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per layer, built once: boxing would only add a hop
pub enum FeedForward {
    /// One gated MLP.
    Dense(Mlp),
    /// Routed experts.
    Sparse(SparseMoe),
}

impl FeedForward {
    /// Applies the block to `x [L, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Sparse(m) => m.forward(x),
        }
    }

    /// `(h, norm(h))` for `h = residual + forward(x)`; see [`Mlp::forward_add_norm`].
    pub fn forward_add_norm(&self, x: &Array, residual: &Array, norm: &RmsNorm) -> Result<(Array, Array)> {
        match self {
            FeedForward::Dense(m) => m.forward_add_norm(x, residual, norm),
            FeedForward::Sparse(m) => norm.forward_add(residual, &m.forward(x)?),
        }
    }
}
