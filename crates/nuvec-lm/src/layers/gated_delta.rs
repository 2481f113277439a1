//! Gated DeltaNet: the linear-attention mixer of Qwen3.5 / Qwen3-Next hybrids (mlx-lm's
//! `GatedDeltaNet` in `models/qwen3_5.py`). Each position's queries, keys and values pass a
//! depthwise causal convolution, then a per-head matrix memory is decayed, corrected towards
//! the value along the key (the delta rule) and read by the query. Its cache is the
//! convolution's last inputs and that memory: constant in size, whatever the length.

use nuvec::{Array, DType, GatedDeltaDims, Matrix};

use super::{Linear, RmsNorm};
use crate::cache::{LayerCache, Positions, RecurrentCache};
use crate::parallel::Shard;
use crate::step::StepBatch;
use crate::weights::Weights;
use crate::{Error, Result};

/// Sizes of a Gated DeltaNet layer, from the config's `linear_*` fields.
#[derive(Debug, Clone, Copy)]
pub struct GatedDeltaShape {
    /// Model width.
    pub hidden: usize,
    /// Heads and head sizes of the recurrence.
    pub dims: GatedDeltaDims,
    /// Taps of the causal convolution (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// Epsilon of the gated output norm (`rms_norm_eps`).
    pub eps: f32,
}

/// One Gated DeltaNet mixer.
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    in_proj_qkv: Linear,
    in_proj_z: Linear,
    in_proj_b: Linear,
    in_proj_a: Linear,
    /// `[channels, taps]`.
    conv_weight: Array,
    a_log: Array,
    dt_bias: Array,
    norm: RmsNorm,
    out_proj: Linear,
    shape: GatedDeltaShape,
}

impl GatedDeltaNet {
    /// Loads `{path}.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, A_log, dt_bias,
    /// norm, out_proj}`. The convolution weight may be stored `[C, K, 1]` (MLX) or `[C, 1, K]`
    /// (PyTorch): both hold the same values in the same order.
    pub fn load(weights: &Weights, path: &str, shape: GatedDeltaShape) -> Result<Self> {
        let d = shape.dims;
        if d.key_heads == 0 || !d.value_heads.is_multiple_of(d.key_heads) || shape.conv_kernel == 0 {
            return Err(Error::Invalid(format!(
                "{path}: linear_num_value_heads = {} must be a multiple of linear_num_key_heads = {} and \
                 linear_conv_kernel_dim = {} at least 1",
                d.value_heads, d.key_heads, shape.conv_kernel
            )));
        }
        let (h, value_width, channels) = (shape.hidden, d.value_heads * d.value_dim, d.mixed_width());
        let conv_name = format!("{path}.conv1d.weight");
        let conv = weights.raw(&conv_name)?;
        let k = shape.conv_kernel;
        if !(conv.shape() == [channels, k, 1] || conv.shape() == [channels, 1, k]) || !conv.dtype().is_float() {
            return Err(Error::Invalid(format!(
                "{conv_name} is {} {:?}; the config asks for [{channels}, {k}, 1] (or [{channels}, 1, {k}]) floats",
                conv.dtype(),
                conv.shape()
            )));
        }
        let p = |name: &str| format!("{path}.{name}");
        Ok(GatedDeltaNet {
            in_proj_qkv: Linear::load(weights, &p("in_proj_qkv"), h, channels, false)?,
            in_proj_z: Linear::load(weights, &p("in_proj_z"), h, value_width, false)?,
            in_proj_b: Linear::load(weights, &p("in_proj_b"), h, d.value_heads, false)?,
            in_proj_a: Linear::load(weights, &p("in_proj_a"), h, d.value_heads, false)?,
            conv_weight: conv.reshape(&[channels, k])?.to_device(weights.device())?,
            a_log: weights.tensor(&p("A_log"), &[d.value_heads])?,
            dt_bias: weights.tensor(&p("dt_bias"), &[d.value_heads])?,
            norm: RmsNorm::load(weights, &p("norm"), d.value_dim, shape.eps)?,
            out_proj: Linear::load(weights, &p("out_proj"), value_width, h, false)?,
            shape,
        })
    }

    /// This rank's share of the mixer ([`crate::parallel`]): its share of the key heads with
    /// the value heads that read them (their query, key and value channels, convolution taps,
    /// gates, decays and output gate), and the output projection's columns for its value heads,
    /// its product summed over the group. The norm is per value head, whole on every rank.
    pub(crate) fn shard(&self, shard: &Shard) -> Result<GatedDeltaNet> {
        let d = self.shape.dims;
        let keys = shard.part(d.key_heads, "linear-attention key heads")?;
        let per = d.value_heads / d.key_heads;
        let values = keys.start * per..keys.end * per;
        let (kd, vd, k_width) = (d.key_dim, d.value_dim, d.key_heads * d.key_dim);
        // A `mixed` row is [queries | keys | values]: this rank's heads of each.
        let channels = [
            keys.start * kd..keys.end * kd,
            k_width + keys.start * kd..k_width + keys.end * kd,
            2 * k_width + values.start * vd..2 * k_width + values.end * vd,
        ];
        let conv_weight = match Matrix::Dense(self.conv_weight.clone()).rows_parts(&channels)? {
            Matrix::Dense(a) => a,
            Matrix::Quantized(_) => unreachable!("parts of a dense matrix are dense"),
        };
        let heads = |a: &Array| -> Result<Array> {
            Ok(a.reshape(&[a.len(), 1])?.slice_rows(values.start, values.end)?.reshape(&[values.len()])?)
        };
        let value_features = values.start * vd..values.end * vd;
        Ok(GatedDeltaNet {
            in_proj_qkv: self.in_proj_qkv.output_parts(&channels)?,
            in_proj_z: self.in_proj_z.output_part(value_features.clone())?,
            in_proj_b: self.in_proj_b.output_part(values.clone())?,
            in_proj_a: self.in_proj_a.output_part(values.clone())?,
            conv_weight,
            a_log: heads(&self.a_log)?,
            dt_bias: heads(&self.dt_bias)?,
            norm: self.norm.clone(),
            out_proj: self.out_proj.input_part(value_features, shard.group())?,
            shape: GatedDeltaShape {
                dims: GatedDeltaDims { key_heads: keys.len(), value_heads: values.len(), ..d },
                ..self.shape
            },
        })
    }

    /// Mixes the step's rows `x [T, hidden]`, each sequence's continuing from its layer-`layer`
    /// recurrent state (which advances by its rows): the projections over every row, the
    /// recurrence per sequence.
    pub fn forward(&self, x: &Array, step: &mut StepBatch, layer: usize) -> Result<Array> {
        let [qkv, z, b, a] =
            Linear::forward_many([&self.in_proj_qkv, &self.in_proj_z, &self.in_proj_b, &self.in_proj_a], x)?;
        let out = step.each([&qkv, &z, &b, &a], |[qkv, z, b, a], cache| match &mut cache[layer] {
            LayerCache::Recurrent(c) => self.mix_one([&qkv, &z, &b, &a], c),
            _ => Err(Error::Invalid("a Qwen3.5 linear-attention layer given a key/value cache".into())),
        })?;
        let d = self.shape.dims;
        self.out_proj.forward(&out.reshape(&[out.dim(0), d.value_heads * d.value_dim])?)
    }

    /// One sequence's rows of the input projections through its recurrent state: the gated
    /// norm's output `[L, value_heads, value_dim]`.
    fn mix_one(&self, [qkv, z, b, a]: [&Array; 4], cache: &mut RecurrentCache) -> Result<Array> {
        let (l, d) = (qkv.dim(0), self.shape.dims);
        let device = qkv.device();
        let (conv_state, state) = match cache.state() {
            Some((c, s)) => (c.clone(), s.clone()),
            None if cache.offset() == 0 => (
                Array::zeros_on(&[self.shape.conv_kernel - 1, d.mixed_width()], DType::F32, device)?,
                Array::zeros_on(&[d.value_heads, d.value_dim, d.key_dim], DType::F32, device)?,
            ),
            None => return Err(Error::Invalid("a recurrent cache holds positions but no state".into())),
        };
        let (conv_state, state) = (conv_state.to_device(device)?, state.to_device(device)?);
        let y = if cache.steps_one_by_one(l) {
            // A pass that may be taken back (speculative verification): the state after each
            // position is kept, each position computed as a one-token step computes it.
            let mut ys = Vec::with_capacity(l);
            let (mut conv_state, mut state) = (conv_state, state);
            for i in 0..l {
                let row = |x: &Array| x.slice_rows(i, i + 1);
                let (mixed, conv_next) = row(qkv)?.causal_conv1d_silu(&conv_state, &self.conv_weight)?;
                let (y, state_next) =
                    nuvec::gated_delta(&mixed, [&row(a)?, &row(b)?], [&self.a_log, &self.dt_bias], &state, d)?;
                cache.update(conv_next.clone(), state_next.clone(), 1);
                (conv_state, state) = (conv_next, state_next);
                ys.push(y);
            }
            crate::step::concat_rows(&ys)?
        } else {
            let (mixed, conv_next) = qkv.causal_conv1d_silu(&conv_state, &self.conv_weight)?;
            let (y, state_next) = nuvec::gated_delta(&mixed, [a, b], [&self.a_log, &self.dt_bias], &state, d)?;
            cache.update(conv_next, state_next, l);
            y
        };
        // The gated norm: silu(z) * rms_norm(y), per value head.
        let z = z.reshape(&[l, d.value_heads, d.value_dim])?;
        Ok(z.silu_mul(&self.norm.forward(&y)?)?)
    }
}
