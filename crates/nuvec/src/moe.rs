//! Mixture-of-experts layers as two ops: routing (each row's top-k experts and their weights,
//! from the router's logits) and the chosen experts' gated MLPs summed with those weights. A
//! backend may run both where the weights live without reading anything back to the host (the
//! GPU does, so that a decode step can be a CUDA graph); the composed forms below are the
//! reference every backend matches.

use crate::{backend, Array, Device, Error, Matrix, Result};

/// How router logits become each row's experts and their weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MoeRouting {
    /// Softmax over all experts, then the top k; renormalized to sum to one when `normalize`
    /// (Qwen3-MoE's `norm_topk_prob`).
    SoftmaxTopK {
        /// Divide the chosen probabilities by their sum.
        normalize: bool,
    },
    /// The top k logits, then a softmax over those k alone (gpt-oss).
    TopKSoftmax,
}

/// The experts' gated activation, `act(gate, up)` before the down projection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertActivation {
    /// `silu(gate) * up`.
    Silu,
    /// gpt-oss's clamped SwiGLU (see [`crate::Backend::swiglu_oai`]).
    SwigluOai {
        /// The sigmoid's slope.
        alpha: f32,
        /// The clamp.
        limit: f32,
    },
    /// `gelu_approx(gate) * up` (Gemma 4's experts; see [`crate::Backend::gelu_mul`]).
    GeluApprox,
}

/// One layer's experts: each a gated MLP (`gate`, `up`: `[intermediate, hidden]`, `down`:
/// `[hidden, intermediate]`), all of one shape, with optional bias rows per projection.
#[derive(Debug, Clone)]
pub struct Experts {
    gate: Vec<Matrix>,
    up: Vec<Matrix>,
    down: Vec<Matrix>,
    biases: Option<[Vec<Array>; 3]>,
    activation: ExpertActivation,
    /// A factor per expert on its routing weight (Gemma 4's `per_expert_scale`).
    output_scales: Option<Vec<f32>>,
    /// The backend's device-side index of the experts ([`crate::Backend::expert_index`]), made
    /// once here so that no step uploads or works it out.
    index: Option<ExpertIndex>,
}

/// What a backend makes once per layer so that its expert kernels need nothing else: a table
/// on the device (the experts' buffers, as its kernels read them) and the launch parameters of
/// the experts' format.
#[derive(Debug, Clone)]
pub struct ExpertIndex {
    /// The table the kernels read.
    pub table: Array,
    /// The format's launch parameters (the backend's own meaning).
    pub params: [i32; 4],
}

impl Experts {
    /// Experts from their projections (one entry per expert, in order) and, when the checkpoint
    /// has them, the bias rows of `[gate, up, down]`.
    pub fn new(
        gate: Vec<Matrix>,
        up: Vec<Matrix>,
        down: Vec<Matrix>,
        biases: Option<[Vec<Array>; 3]>,
        activation: ExpertActivation,
    ) -> Result<Self> {
        let bad = |m: String| Err(Error::shape("experts", m));
        let n = gate.len();
        if n == 0 || up.len() != n || down.len() != n {
            return bad(format!(
                "{n} gate, {} up and {} down projections: need one of each per expert",
                up.len(),
                down.len()
            ));
        }
        let (inter, hidden) = (gate[0].rows(), gate[0].cols());
        for e in 0..n {
            let shapes =
                [(gate[e].rows(), gate[e].cols()), (up[e].rows(), up[e].cols()), (down[e].rows(), down[e].cols())];
            if shapes != [(inter, hidden), (inter, hidden), (hidden, inter)] {
                return bad(format!(
                    "expert {e}: gate/up/down are {shapes:?}, expected [{inter}, {hidden}] twice and [{hidden}, {inter}]"
                ));
            }
        }
        if let Some(b) = &biases {
            let widths = [inter, inter, hidden];
            for (p, (rows, width)) in b.iter().zip(widths).enumerate() {
                if rows.len() != n || rows.iter().any(|r| r.shape() != [width]) {
                    return bad(format!("projection {p}'s biases must be {n} rows of {width}"));
                }
            }
        }
        let mut experts = Experts { gate, up, down, biases, activation, output_scales: None, index: None };
        experts.index = backend(experts.device()).expert_index(&experts)?;
        Ok(experts)
    }

    /// Each expert's hidden units `units` (a rank's share of a model split across ranks): the
    /// gate and up projections' rows, the down projection's columns; the down projection's bias
    /// stays where `down_bias` (the one rank that adds it to the summed output), zeros elsewhere.
    pub fn units_part(&self, units: std::ops::Range<usize>, down_bias: bool) -> Result<Experts> {
        let rows = |m: &[Matrix]| m.iter().map(|w| w.rows_part(units.clone())).collect::<Result<Vec<_>>>();
        let down = self.down.iter().map(|w| w.cols_part(units.clone())).collect::<Result<Vec<_>>>()?;
        let part = |b: &Array| b.reshape(&[b.len(), 1])?.slice_rows(units.start, units.end)?.reshape(&[units.len()]);
        let keep = |b: &Array| match down_bias {
            true => Ok(b.clone()),
            false => Array::zeros_on(b.shape(), b.dtype(), b.device()),
        };
        let biases = match &self.biases {
            None => None,
            Some([g, u, d]) => Some([
                g.iter().map(part).collect::<Result<Vec<_>>>()?,
                u.iter().map(part).collect::<Result<Vec<_>>>()?,
                d.iter().map(keep).collect::<Result<Vec<_>>>()?,
            ]),
        };
        let experts = Experts::new(rows(&self.gate)?, rows(&self.up)?, down, biases, self.activation)?;
        match &self.output_scales {
            Some(scales) => experts.with_output_scales(scales.clone()),
            None => Ok(experts),
        }
    }

    /// The same experts with each one's routing weight multiplied by `scales[e]` (one per expert).
    pub fn with_output_scales(mut self, scales: Vec<f32>) -> Result<Self> {
        if scales.len() != self.len() {
            return Err(Error::shape("experts", format!("{} output scales for {} experts", scales.len(), self.len())));
        }
        self.output_scales = Some(scales);
        self.index = backend(self.device()).expert_index(&self)?;
        Ok(self)
    }

    /// Expert `e`'s factor on its routing weight (1 unless [`Experts::with_output_scales`]).
    pub fn output_scale(&self, e: usize) -> Option<f32> {
        self.output_scales.as_ref().map(|s| s[e])
    }

    /// Number of experts.
    pub fn len(&self) -> usize {
        self.gate.len()
    }

    /// Always false: a layer has at least one expert.
    pub fn is_empty(&self) -> bool {
        self.gate.is_empty()
    }

    /// Model width (the input and output features).
    pub fn hidden(&self) -> usize {
        self.gate[0].cols()
    }

    /// Each expert's intermediate width.
    pub fn intermediate(&self) -> usize {
        self.gate[0].rows()
    }

    /// The device the weights are on.
    pub fn device(&self) -> Device {
        self.gate[0].device()
    }

    /// The activation between the gate/up and the down projections.
    pub fn activation(&self) -> ExpertActivation {
        self.activation
    }

    /// Expert `e`'s `[gate, up, down]` projections.
    pub fn projections(&self, e: usize) -> [&Matrix; 3] {
        [&self.gate[e], &self.up[e], &self.down[e]]
    }

    /// Expert `e`'s bias rows for `[gate, up, down]`, when it has them.
    pub fn biases(&self, e: usize) -> Option<[&Array; 3]> {
        self.biases.as_ref().map(|b| [&b[0][e], &b[1][e], &b[2][e]])
    }

    /// The backend's index of the experts, when it made one.
    pub fn index(&self) -> Option<&ExpertIndex> {
        self.index.as_ref()
    }
}

impl Array {
    /// Each row's top-k experts from router logits `self [L, experts]`; see
    /// [`crate::Backend::moe_route`].
    pub fn moe_route(&self, top_k: usize, routing: MoeRouting) -> Result<(Array, Array)> {
        backend(self.device()).moe_route(self, top_k, routing)
    }

    /// [`Array::moe_route`] of `self + bias` (a router's bias row); see
    /// [`crate::Backend::moe_route_bias`].
    pub fn moe_route_bias(&self, bias: &Array, top_k: usize, routing: MoeRouting) -> Result<(Array, Array)> {
        backend(self.device()).moe_route_bias(self, bias, top_k, routing)
    }

    /// Each row's top-k experts from the router's logits `self @ router^T (+ bias)`; see
    /// [`crate::Backend::moe_route_linear`].
    pub fn moe_route_linear(
        &self,
        router: &Matrix,
        bias: Option<&Array>,
        top_k: usize,
        routing: MoeRouting,
    ) -> Result<(Array, Array)> {
        backend(self.device()).moe_route_linear(self, router, bias, top_k, routing)
    }

    /// The experts' weighted sum for each row of `self [L, hidden]`; see
    /// [`crate::Backend::moe_experts`].
    pub fn moe_experts(&self, experts: &Experts, ids: &Array, weights: &Array) -> Result<Array> {
        backend(self.device()).moe_experts(self, experts, ids, weights)
    }
}

impl Array {
    /// `self + sigmoid(gate) * shared` with one gate per row; see
    /// [`crate::Backend::add_sigmoid_gated`].
    pub fn add_sigmoid_gated(&self, shared: &Array, gate: &Array) -> Result<Array> {
        backend(self.device()).add_sigmoid_gated(self, shared, gate)
    }
}

/// Checks `add_sigmoid_gated`'s arguments: `a, b [L, D]` and `gate [L, 1]`, all f32.
pub(crate) fn check_sigmoid_gated(a: &Array, b: &Array, gate: &Array) -> Result<(usize, usize)> {
    let f32s = [a, b, gate].iter().all(|x| x.dtype() == crate::DType::F32);
    if a.shape().len() != 2 || a.shape() != b.shape() || gate.shape() != [a.dim(0), 1] || !f32s {
        return Err(Error::shape(
            "add_sigmoid_gated",
            format!(
                "a {:?} and b {:?} must be f32 [rows, width], gate {:?} f32 [rows, 1]",
                a.shape(),
                b.shape(),
                gate.shape()
            ),
        ));
    }
    Ok((a.dim(0), a.dim(1)))
}

/// [`crate::Backend::add_sigmoid_gated`] on the host.
pub(crate) fn add_sigmoid_gated_composed(a: &Array, b: &Array, gate: &Array) -> Result<Array> {
    let (rows, width) = check_sigmoid_gated(a, b, gate)?;
    let (mut out, shared, gates) = (a.to_vec::<f32>()?, b.to_vec::<f32>()?, gate.to_vec::<f32>()?);
    for ((o, s), &g) in out.chunks_mut(width.max(1)).zip(shared.chunks(width.max(1))).zip(&gates) {
        let g = 1.0 / (1.0 + (-g).exp());
        o.iter_mut().zip(s).for_each(|(o, s)| *o += g * s);
    }
    Array::from_slice_on(&out, &[rows, width], a.device())
}

/// Checks `moe_route`'s arguments: `logits [L, E]` f32 and `1 <= top_k <= E`.
pub(crate) fn check_route(logits: &Array, top_k: usize) -> Result<(usize, usize)> {
    let op = "moe_route";
    if logits.shape().len() != 2 || logits.dtype() != crate::DType::F32 {
        return Err(Error::shape(
            op,
            format!("logits must be f32 [rows, experts], got {} {:?}", logits.dtype(), logits.shape()),
        ));
    }
    let (rows, n) = (logits.dim(0), logits.dim(1));
    if top_k == 0 || top_k > n {
        return Err(Error::shape(op, format!("top_k = {top_k} must be between 1 and the {n} experts")));
    }
    Ok((rows, n))
}

/// Checks `moe_experts`' arguments: `x [L, hidden]` f32, `ids [L, k]` u32, `weights [L, k]` f32.
pub(crate) fn check_experts(x: &Array, experts: &Experts, ids: &Array, weights: &Array) -> Result<(usize, usize)> {
    let op = "moe_experts";
    if x.shape().len() != 2 || x.dim(1) != experts.hidden() || x.dtype() != crate::DType::F32 {
        return Err(Error::shape(
            op,
            format!("x must be f32 [rows, {}], got {} {:?}", experts.hidden(), x.dtype(), x.shape()),
        ));
    }
    let rows = x.dim(0);
    let top_k = ids.shape().get(1).copied().unwrap_or(0);
    if ids.shape() != [rows, top_k] || ids.dtype() != crate::DType::U32 {
        return Err(Error::shape(op, format!("ids must be u32 [{rows}, k], got {} {:?}", ids.dtype(), ids.shape())));
    }
    if weights.shape() != ids.shape() || weights.dtype() != crate::DType::F32 {
        return Err(Error::shape(
            op,
            format!("weights must be f32 {:?} like ids, got {} {:?}", ids.shape(), weights.dtype(), weights.shape()),
        ));
    }
    Ok((rows, top_k))
}

/// [`crate::Backend::moe_route_linear`] from the other ops: `backend`'s product, then its
/// `moe_route` (`moe_route_bias` with a bias).
pub(crate) fn route_linear_composed<B: crate::Backend + ?Sized>(
    backend: &B,
    x: &Array,
    router: &Matrix,
    bias: Option<&Array>,
    top_k: usize,
    routing: MoeRouting,
) -> Result<(Array, Array)> {
    let logits = backend.linear(x, router)?;
    match bias {
        Some(bias) => backend.moe_route_bias(&logits, bias, top_k, routing),
        None => backend.moe_route(&logits, top_k, routing),
    }
}

/// [`crate::Backend::moe_route`] on the host: the logits are read, the choices written back to
/// their device.
pub(crate) fn route_composed(logits: &Array, top_k: usize, routing: MoeRouting) -> Result<(Array, Array)> {
    let (rows, n) = check_route(logits, top_k)?;
    let values = logits.to_f32_vec()?;
    let (mut ids, mut weights) = (Vec::with_capacity(rows * top_k), Vec::with_capacity(rows * top_k));
    for row in values.chunks(n.max(1)) {
        for (e, w) in route_row(row, top_k, routing) {
            ids.push(e as u32);
            weights.push(w);
        }
    }
    let device = logits.device();
    Ok((Array::from_slice_on(&ids, &[rows, top_k], device)?, Array::from_slice_on(&weights, &[rows, top_k], device)?))
}

/// One row's experts, best first (ties to the lower index), and their weights.
fn route_row(logits: &[f32], top_k: usize, routing: MoeRouting) -> Vec<(usize, f32)> {
    let by_value = |v: &[f32]| {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
        order.truncate(top_k);
        order
    };
    match routing {
        MoeRouting::SoftmaxTopK { normalize } => {
            let probs = softmax(logits);
            let chosen = by_value(&probs);
            let total: f32 = if normalize { chosen.iter().map(|&e| probs[e]).sum() } else { 1.0 };
            chosen.into_iter().map(|e| (e, probs[e] / total)).collect()
        }
        MoeRouting::TopKSoftmax => {
            let chosen = by_value(logits);
            let picked: Vec<f32> = chosen.iter().map(|&e| logits[e]).collect();
            chosen.into_iter().zip(softmax(&picked)).collect()
        }
    }
}

/// `softmax(x)` on the host (max subtracted, then `exp`, summed in order): the routing's, and
/// the samplers' in nuvec-lm.
pub fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|&v| (v - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

/// [`crate::Backend::moe_experts`] from the other ops: the choices are read to the host, each
/// expert runs once over the rows routed to it, and the weighted sum is taken on the host in
/// expert order.
pub(crate) fn experts_composed(x: &Array, experts: &Experts, ids: &Array, weights: &Array) -> Result<Array> {
    let (rows, top_k) = check_experts(x, experts, ids, weights)?;
    let hidden = experts.hidden();
    let (ids, weights) = (ids.to_vec::<u32>()?, weights.to_vec::<f32>()?);
    let n = experts.len();
    let mut routed: Vec<(Vec<u32>, Vec<f32>)> = vec![(vec![], vec![]); n];
    for (i, (&e, &w)) in ids.iter().zip(&weights).enumerate() {
        let Some(slot) = routed.get_mut(e as usize) else {
            return Err(Error::shape("moe_experts", format!("expert id {e} is not below the {n} experts")));
        };
        slot.0.push((i / top_k) as u32);
        slot.1.push(match experts.output_scale(e as usize) {
            Some(s) => w * s,
            None => w,
        });
    }
    let input = Matrix::Dense(x.clone());
    let mut out = vec![0f32; rows * hidden];
    for (e, (tokens, weights)) in routed.iter().enumerate() {
        if tokens.is_empty() {
            continue;
        }
        let [gate, up, down] = experts.projections(e);
        let biases = experts.biases(e);
        let with_bias = |y: Array, p: usize| match biases {
            Some(b) => y.add_bias(b[p]),
            None => Ok(y),
        };
        let xe = input.embed(tokens)?;
        let (g, u) = (with_bias(xe.linear(gate)?, 0)?, with_bias(xe.linear(up)?, 1)?);
        let a = match experts.activation() {
            ExpertActivation::Silu => g.silu_mul(&u)?,
            ExpertActivation::SwigluOai { alpha, limit } => g.swiglu_oai(&u, alpha, limit)?,
            ExpertActivation::GeluApprox => g.gelu_mul(&u)?,
        };
        let h = with_bias(a.linear(down)?, 2)?.to_vec::<f32>()?;
        for ((&t, &w), y) in tokens.iter().zip(weights).zip(h.chunks(hidden)) {
            let o = &mut out[t as usize * hidden..(t as usize + 1) * hidden];
            o.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
        }
    }
    Array::from_slice_on(&out, &[rows, hidden], x.device())
}
