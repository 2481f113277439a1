//! Mixture-of-experts feed-forward (mlx-lm's `SwitchGLU` behind a softmax router), as Qwen3-MoE
//! uses it: each token goes to its top-k experts, whose gated MLP outputs are summed with the
//! router's (optionally renormalized) probabilities.

use nuvec::{Array, Matrix};

use super::{Linear, Mlp};
use crate::weights::Weights;
use crate::Result;

/// The router and the experts of one layer.
#[derive(Debug, Clone)]
pub struct SparseMoe {
    gate: Linear,
    experts: Vec<[Linear; 3]>,
    top_k: usize,
    norm_topk_prob: bool,
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
        Ok(SparseMoe { gate, experts, top_k: s.top_k, norm_topk_prob: s.norm_topk_prob })
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
            let probs = crate::sample::softmax(logits);
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            let chosen = &order[..self.top_k];
            let total: f32 = if self.norm_topk_prob { chosen.iter().map(|&e| probs[e]).sum() } else { 1.0 };
            for &e in chosen {
                routed[e].0.push(t as u32);
                routed[e].1.push(probs[e] / total);
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
            let h = down.forward(&gate.forward(&xe)?.silu_mul(&up.forward(&xe)?)?)?.to_vec::<f32>()?;
            for ((&t, &w), y) in tokens.iter().zip(weights).zip(h.chunks(hidden)) {
                let o = &mut out[t as usize * hidden..(t as usize + 1) * hidden];
                o.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
            }
        }
        Ok(Array::from_slice_on(&out, &[l, hidden], x.device())?)
    }
}

impl SparseMoe {
    /// A block from its router (`[experts, hidden]`) and each expert's gate, up and down
    /// projections, for a loader that reads experts from another layout.
    pub fn from_parts(gate: Linear, experts: Vec<[Linear; 3]>, top_k: usize, norm_topk_prob: bool) -> Self {
        SparseMoe { gate, experts, top_k, norm_topk_prob }
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
}
