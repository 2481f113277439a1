//! `y = x W^T + b`, with W dense or quantized as the checkpoint stores it.

use std::ops::Range;

use nuvec::distributed::Group;
use nuvec::{Array, Matrix};

use super::RmsNorm;
use crate::adapter::{rows, AdapterId, LowRank};
use crate::weights::Weights;
use crate::{Error, Result};

/// A linear layer.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Matrix,
    /// `[out]`, when the layer has one.
    pub bias: Option<Array>,
    /// A LoRA / DoRA adapter's term, when one adapts this projection: every path below adds
    /// it (the fused ones around their fused base product).
    pub adapter: Option<LowRank>,
    /// Each served adapter's term (indexed by [`crate::AdapterId`]; `None` where that adapter
    /// leaves this projection alone), applied to the rows of the sequences that chose it
    /// ([`crate::StepBatch::push_adapted`]).
    pub served: Vec<Option<LowRank>>,
    /// The ranks whose products are summed into this layer's output: set on a rank's share of a
    /// projection's inputs when the model is split across ranks ([`crate::parallel`]), where
    /// each rank multiplies its slice of the inputs and the sum is the whole product.
    pub sum_over: Option<Group>,
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
        let served = weights
            .served_adapters()
            .iter()
            .map(|a| a.low_rank(path, &weight, weights.device()))
            .collect::<Result<_>>()?;
        Ok(Linear { weight, bias, adapter, served, sum_over: None })
    }

    /// A layer of `weight` and `bias` alone.
    pub fn plain(weight: Matrix, bias: Option<Array>) -> Self {
        Linear { weight, bias, adapter: None, served: vec![], sum_over: None }
    }

    /// This rank's share `rows` of the layer's outputs (its slice of the weight's rows and of
    /// the bias), for a model split across ranks. A layer with adapters is refused.
    pub(crate) fn output_part(&self, rows: Range<usize>) -> Result<Linear> {
        self.output_parts(std::slice::from_ref(&rows))
    }

    /// This rank's shares `parts` of the layer's outputs, stacked in order (a projection whose
    /// outputs are several parts split alike: queries, keys and values in one). A layer with
    /// adapters is refused.
    pub(crate) fn output_parts(&self, parts: &[Range<usize>]) -> Result<Linear> {
        self.refuse_adapters()?;
        let weight = self.weight.rows_parts(parts)?;
        let bias = match &self.bias {
            None => None,
            Some(b) => {
                let all = b.to_f32_vec()?;
                let kept: Vec<f32> = parts.iter().flat_map(|r| all[r.clone()].iter().copied()).collect();
                Some(Array::from_slice_on(&kept, &[kept.len()], b.device())?.astype(b.dtype())?)
            }
        };
        Ok(Linear::plain(weight, bias))
    }

    /// This rank's share `cols` of the layer's inputs, its products summed over `group` (the
    /// bias added once, on rank 0). A layer with adapters is refused.
    pub(crate) fn input_part(&self, cols: Range<usize>, group: &Group) -> Result<Linear> {
        self.refuse_adapters()?;
        let bias = self.bias.clone().filter(|_| group.rank() == 0);
        Ok(Linear { sum_over: Some(group.clone()), ..Linear::plain(self.weight.cols_part(cols)?, bias) })
    }

    fn refuse_adapters(&self) -> Result<()> {
        match self.has_adapters() {
            true => Err(Error::Unsupported(
                "an adapter on a model split across ranks: fuse it into the base first (`nuvec fuse`)".into(),
            )),
            false => Ok(()),
        }
    }

    /// Whether an adapter's term joins this projection in the running pass (the load's adapter,
    /// or a served one some row chose): then the fused paths that skip [`Linear::forward`]'s
    /// product do not apply.
    pub fn adapted(&self) -> bool {
        self.adapter.is_some() || self.served_in_pass()
    }

    /// Whether any adapter (the load's or a served one) has a term for this projection.
    pub fn has_adapters(&self) -> bool {
        self.adapter.is_some() || self.served.iter().any(Option::is_some)
    }

    /// Applies the layer to `x [..., in]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = self.finish(x, x.linear(&self.weight)?)?;
        match &self.sum_over {
            Some(group) => crate::parallel::sum_over(group, y),
            None => Ok(y),
        }
    }

    /// Applies several layers to the same `x [..., in]` (q/k/v, gate/up), in order; the backend
    /// may run them as one pass. Same results as [`Linear::forward`] on each.
    pub fn forward_many<const N: usize>(layers: [&Linear; N], x: &Array) -> Result<[Array; N]> {
        let weights = layers.map(|l| &l.weight);
        // Biases alone after the products (q/k/v of Qwen2, gpt-oss): the backend may add them in
        // the products' pass.
        let biases: Vec<&Array> = layers.iter().filter_map(|l| l.lone_bias()).collect();
        let outs = if N > 0 && biases.len() == N {
            x.linear_many_bias(&weights, &biases)?
        } else {
            let outs = x.linear_many(&weights)?;
            if outs.len() != N {
                return Err(Error::Invalid(format!("linear_many returned {} arrays for {N} weights", outs.len())));
            }
            outs.into_iter().zip(layers).map(|(y, l)| l.finish(x, y)).collect::<Result<_>>()?
        };
        outs.try_into().map_err(|v: Vec<Array>| Error::Invalid(format!("{} outputs for {N} weights", v.len())))
    }

    /// The bias when it is all that follows the product in the running pass (no adapter's term):
    /// a backend may then add it inside a fused op ([`Linear::forward_many`], a router's
    /// `moe_route_bias`).
    pub fn lone_bias(&self) -> Option<&Array> {
        self.bias.as_ref().filter(|_| !self.adapted())
    }

    /// `(silu(gate) * up)` through this layer (a gated MLP's down projection); the backend may
    /// fuse the product into the matrix-vector pass. Same result as `forward(gate.silu_mul(up))`.
    pub fn forward_silu_mul(&self, gate: &Array, up: &Array) -> Result<Array> {
        if self.sum_over.is_some() {
            return self.forward(&gate.silu_mul(up)?);
        }
        let y = gate.silu_mul_linear(up, &self.weight)?;
        match self.adapted() {
            true => self.finish(&gate.silu_mul(up)?, y),
            false => self.with_bias(y),
        }
    }

    /// `h = residual + self.forward(x)` and `(h, norm(h))`: an output or down projection with
    /// the residual add and the norm after it, which a backend may fold together
    /// ([`nuvec::Backend::linear_add_rms_norm`]; a lone bias joins the residual add
    /// ([`nuvec::Backend::add_bias_rms_norm`]); with a bias and an adapter or a DoRA adapter, the
    /// separate ops; a LoRA adapter's term joins the residual).
    pub fn forward_add_norm(&self, x: &Array, residual: &Array, norm: &RmsNorm) -> Result<(Array, Array)> {
        if self.sum_over.is_some() {
            // The residual joins the sum of every rank's share, not each share.
            return norm.forward_add(residual, &self.forward(x)?);
        }
        if let Some(bias) = self.lone_bias() {
            // A bias alone after the product (gpt-oss's o projection) joins the residual add.
            return norm.forward_add_bias(residual, &x.linear(&self.weight)?, bias);
        }
        match &self.adapter {
            _ if self.bias.is_some() || self.served_in_pass() => norm.forward_add(residual, &self.forward(x)?),
            Some(adapter) if !adapter.only_adds() => norm.forward_add(residual, &self.forward(x)?),
            Some(adapter) => {
                let residual = adapter.add_to(x, residual)?;
                Ok(x.linear_add_rms_norm(&self.weight, &residual, norm.weight(), norm.eps())?)
            }
            None => Ok(x.linear_add_rms_norm(&self.weight, residual, norm.weight(), norm.eps())?),
        }
    }

    /// The adapter's term (when the layer has one), the served adapters' on their rows, then
    /// the bias, on the base product `y`.
    fn finish(&self, x: &Array, y: Array) -> Result<Array> {
        let y = match &self.adapter {
            Some(adapter) => adapter.apply(x, y)?,
            None => y,
        };
        let y = self.apply_served(x, y)?;
        self.with_bias(y)
    }

    /// This projection's term of served adapter `id`, if it has one.
    fn served_term(&self, id: AdapterId) -> Option<&LowRank> {
        self.served.get(id.0)?.as_ref()
    }

    /// Whether rows of the running pass chose a served adapter with a term for this projection.
    fn served_in_pass(&self) -> bool {
        !self.served.is_empty()
            && rows::active().is_some_and(|a| a.runs.iter().any(|(id, _)| self.served_term(*id).is_some()))
    }

    /// `y` with each served adapter's term on the rows that chose it (the rest as they are).
    fn apply_served(&self, x: &Array, y: Array) -> Result<Array> {
        if self.served.is_empty() {
            return Ok(y);
        }
        let Some(active) = rows::active() else { return Ok(y) };
        let runs: Vec<(&LowRank, Range<usize>)> =
            active.runs.iter().filter_map(|(id, r)| Some((self.served_term(*id)?, r.clone()))).collect();
        if runs.is_empty() {
            return Ok(y);
        }
        let rows = active.rows;
        if x.shape().len() != 2 || x.dim(0) != rows {
            return Err(Error::Invalid(format!(
                "a served adapter's projection got an input of shape {:?} in a pass of {rows} rows",
                x.shape()
            )));
        }
        if let [(adapter, r)] = &runs[..] {
            if r.start == 0 && r.end == rows {
                return Ok(adapter.apply(x, y)?);
            }
        }
        let mut parts = Vec::with_capacity(2 * runs.len() + 1);
        let mut at = 0;
        for (adapter, r) in runs {
            if at < r.start {
                parts.push(y.slice_rows(at, r.start)?);
            }
            parts.push(adapter.apply(&x.slice_rows(r.start, r.end)?, y.slice_rows(r.start, r.end)?)?);
            at = r.end;
        }
        if at < rows {
            parts.push(y.slice_rows(at, rows)?);
        }
        crate::step::concat_rows(&parts)
    }

    fn with_bias(&self, y: Array) -> Result<Array> {
        Ok(match &self.bias {
            Some(b) => y.add_bias(b)?,
            None => y,
        })
    }
}
