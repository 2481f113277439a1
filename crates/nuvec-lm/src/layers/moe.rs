//! Mixture-of-experts feed-forward (mlx-lm's `SwitchGLU` behind a softmax router), as Qwen3-MoE
//! uses it: each token goes to its top-k experts, whose gated MLP outputs are summed with the
//! router's (optionally renormalized) probabilities. gpt-oss routes and activates differently
//! ([`Routing`], [`Activation`]) and gives every projection a bias.

use nuvec::{Array, Matrix};

use super::{Linear, Mlp, RmsNorm};
use crate::weights::Weights;
use crate::Result;

/// The router and the experts of one layer.
#[derive(Debug, Clone)]
pub struct SparseMoe {
    gate: Linear,
    experts: Vec<[Linear; 3]>,
    top_k: usize,
    norm_topk_prob: bool,
    routing: Routing,
    activation: Activation,
}

/// How router logits become each token's experts and their weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// Softmax over all experts, then the top k (renormalized when `norm_topk_prob`): Qwen3-MoE.
    SoftmaxTopK,
    /// The top k logits, then a softmax over those k alone: gpt-oss.
    TopKSoftmax,
}

/// The experts' gated activation, `act(gate, up)` before the down projection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `silu(gate) * up`.
    Silu,
    /// gpt-oss's clamped SwiGLU (mlx-lm's `swiglu_oai`; see [`nuvec::Backend::swiglu_oai`]).
    SwigluOai {
        /// The sigmoid's slope.
        alpha: f32,
        /// The clamp.
        limit: f32,
    },
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
        let linear = |weight: Matrix| Linear { weight, bias: None };
        let experts =
            gates.into_iter().zip(ups).zip(downs).map(|((g, u), d)| [linear(g), linear(u), linear(d)]).collect();
        Ok(SparseMoe {
            gate,
            experts,
            top_k: s.top_k,
            norm_topk_prob: s.norm_topk_prob,
            routing: Routing::SoftmaxTopK,
            activation: Activation::Silu,
        })
    }

    /// A block from its parts: the `router` (biased or not), each expert's `[gate, up, down]`
    /// projections, and how it routes and activates (gpt-oss builds its own this way).
    pub fn from_parts(
        router: Linear,
        experts: Vec<[Linear; 3]>,
        top_k: usize,
        routing: Routing,
        activation: Activation,
    ) -> Self {
        SparseMoe { gate: router, experts, top_k, norm_topk_prob: false, routing, activation }
    }

    /// Applies the block to `x [L, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (l, hidden) = (x.dim(0), x.dim(1));
        // Routing and the weighted sum run on the host (small: [L, experts] logits in, [L, hidden]
        // out); the experts' matrices run on the weights' device.
        let router = self.gate.forward(x)?.to_vec::<f32>()?;
        let n = self.experts.len();
        // Per expert: the tokens routed to it and their weights.
        let mut routed: Vec<(Vec<u32>, Vec<f32>)> = vec![(vec![], vec![]); n];
        for (t, logits) in router.chunks(n).enumerate() {
            for (e, weight) in self.route(logits) {
                routed[e].0.push(t as u32);
                routed[e].1.push(weight);
            }
        }
        let rows = Matrix::Dense(x.clone());
        let mut out = vec![0f32; l * hidden];
        for (expert, (tokens, weights)) in self.experts.iter().zip(&routed) {
            if tokens.is_empty() {
                continue;
            }
            let [gate, up, down] = expert;
            let xe = rows.embed(tokens)?;
            let (g, u) = (gate.forward(&xe)?, up.forward(&xe)?);
            let a = match self.activation {
                Activation::Silu => g.silu_mul(&u)?,
                Activation::SwigluOai { alpha, limit } => g.swiglu_oai(&u, alpha, limit)?,
            };
            let h = down.forward(&a)?.to_vec::<f32>()?;
            for ((&t, &w), y) in tokens.iter().zip(weights).zip(h.chunks(hidden)) {
                let o = &mut out[t as usize * hidden..(t as usize + 1) * hidden];
                o.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
            }
        }
        Ok(Array::from_slice_on(&out, &[l, hidden], x.device())?)
    }
}

impl SparseMoe {
    /// A Qwen-style block (softmax over all experts, then the top k; SiLU experts) from its
    /// router (`[experts, hidden]`) and each expert's gate, up and down projections, for a
    /// loader that reads experts from another layout.
    pub fn softmax_top_k(gate: Linear, experts: Vec<[Linear; 3]>, top_k: usize, norm_topk_prob: bool) -> Self {
        SparseMoe { gate, experts, top_k, norm_topk_prob, routing: Routing::SoftmaxTopK, activation: Activation::Silu }
    }

    /// One token's experts and their weights from its router logits.
    fn route(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let by_value = |v: &[f32]| {
            let mut order: Vec<usize> = (0..v.len()).collect();
            order.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
            order.truncate(self.top_k);
            order
        };
        match self.routing {
            Routing::SoftmaxTopK => {
                let probs = crate::sample::softmax(logits);
                let chosen = by_value(&probs);
                let total: f32 = if self.norm_topk_prob { chosen.iter().map(|&e| probs[e]).sum() } else { 1.0 };
                chosen.into_iter().map(|e| (e, probs[e] / total)).collect()
            }
            Routing::TopKSoftmax => {
                let chosen = by_value(logits);
                let picked: Vec<f32> = chosen.iter().map(|&e| logits[e]).collect();
                chosen.into_iter().zip(crate::sample::softmax(&picked)).collect()
            }
        }
    }
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
