//! Full attention with an output gate, as Qwen3.5 / Qwen3-Next interleave it with Gated DeltaNet
//! layers (mlx-lm's `Qwen3NextAttention`): `q_proj` yields each head's queries and a gate of
//! the same size; queries and keys are RMS-normalized per head and rotated on a part of their
//! features; the attention output is multiplied by `sigmoid(gate)` before `o_proj`.

use nuvec::Array;

use super::{decode_together, Linear, RmsNorm, Rope};
use crate::cache::paged::InPlace;
use crate::cache::LayerCache;
use crate::parallel::Shard;
use crate::step::StepBatch;
use crate::weights::Weights;
use crate::{Error, Result};

/// Sizes of a gated attention block.
#[derive(Debug, Clone, Copy)]
pub struct GatedAttentionShape {
    /// Model width.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (a divisor of `heads`).
    pub kv_heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// Biases on every projection (`attention_bias`).
    pub bias: bool,
}

/// Self-attention with a sigmoid output gate over a KV cache.
#[derive(Debug, Clone)]
pub struct GatedAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    rope: Rope,
    shape: GatedAttentionShape,
}

impl GatedAttention {
    /// Loads `{path}.{q,k,v,o}_proj`; the q/k norms (which a loader may have adjusted) and the
    /// rotary embedding come from the model file.
    pub fn load(
        weights: &Weights,
        path: &str,
        shape: GatedAttentionShape,
        [q_norm, k_norm]: [RmsNorm; 2],
        rope: Rope,
    ) -> Result<Self> {
        let s = &shape;
        let (q_out, kv_out) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let p = |name: &str| format!("{path}.{name}");
        Ok(GatedAttention {
            q_proj: Linear::load(weights, &p("q_proj"), s.hidden, 2 * q_out, s.bias)?,
            k_proj: Linear::load(weights, &p("k_proj"), s.hidden, kv_out, s.bias)?,
            v_proj: Linear::load(weights, &p("v_proj"), s.hidden, kv_out, s.bias)?,
            o_proj: Linear::load(weights, &p("o_proj"), q_out, s.hidden, s.bias)?,
            q_norm,
            k_norm,
            rope,
            shape,
        })
    }

    /// This rank's share of the block ([`crate::parallel`]): its share of the query heads (each
    /// head's queries and gate), the key/value heads they read, and the output projection's
    /// columns for its heads, its product summed over the group.
    pub(crate) fn shard(&self, shard: &Shard) -> Result<GatedAttention> {
        let s = &self.shape;
        let (heads, kv) = shard.heads(s.heads, s.kv_heads)?;
        let own = heads.len();
        let features = |r: &std::ops::Range<usize>, width: usize| r.start * width..r.end * width;
        Ok(GatedAttention {
            // Each head's row is [queries | gate].
            q_proj: self.q_proj.output_part(features(&heads, 2 * s.head_dim))?,
            k_proj: self.k_proj.output_part(features(&kv, s.head_dim))?,
            v_proj: self.v_proj.output_part(features(&kv, s.head_dim))?,
            o_proj: self.o_proj.input_part(features(&heads, s.head_dim), shard.group())?,
            q_norm: self.q_norm.clone(),
            k_norm: self.k_norm.clone(),
            rope: self.rope.clone(),
            shape: GatedAttentionShape { heads: own, kv_heads: kv.len(), ..*s },
        })
    }

    /// Attends the step's rows `x [T, hidden]`, each sequence's over its layer-`layer` cache
    /// (which grows by its rows): the projections over every row, attention per sequence (the
    /// decodes of several sequences over one paged cache as one op).
    pub fn forward(&self, x: &Array, step: &mut StepBatch, layer: usize) -> Result<Array> {
        let [q_and_gate, k, v] = Linear::forward_many([&self.q_proj, &self.k_proj, &self.v_proj], x)?;
        let out = step.each_with_decodes(
            layer,
            false,
            [&q_and_gate, &k, &v],
            |[q_and_gate, k, v], caches| self.attend_decodes(&q_and_gate, &k, &v, caches),
            |[q_and_gate, k, v], cache| match &mut cache[layer] {
                LayerCache::Recurrent(_) => {
                    Err(Error::Invalid("a Qwen3.5 attention layer given a recurrent cache".into()))
                }
                c => self.attend_one(&q_and_gate, &k, &v, c),
            },
        )?;
        self.o_proj.forward(&out)
    }

    /// Each head's row of `q_and_gate [L, heads * 2 * head_dim]` is [queries | gate]: the
    /// queries `[L, heads, head_dim]` and the gate `[L, heads * head_dim]`.
    fn split_gate(&self, q_and_gate: &Array) -> Result<(Array, Array)> {
        let s = &self.shape;
        let l = q_and_gate.dim(0);
        let halves = q_and_gate.reshape(&[l * s.heads, 2, s.head_dim])?.transpose01()?;
        let q = halves.slice_rows(0, 1)?.reshape(&[l, s.heads, s.head_dim])?;
        let gate = halves.slice_rows(1, 2)?.reshape(&[l, s.heads * s.head_dim])?;
        Ok((q, gate))
    }

    /// The rows of several paged sequences attended in place ([`decode_together`]), gated.
    fn attend_decodes(&self, q_and_gate: &Array, k: &Array, v: &Array, caches: InPlace<'_>) -> Result<Array> {
        let s = &self.shape;
        let n = q_and_gate.dim(0);
        let (q, gate) = self.split_gate(q_and_gate)?;
        let k = k.reshape(&[n, s.kv_heads, s.head_dim])?;
        let v = v.reshape(&[n, s.kv_heads, s.head_dim])?;
        let norms = (Some(&self.q_norm), Some(&self.k_norm));
        let scale = (s.head_dim as f32).powf(-0.5);
        let out = decode_together(&self.rope, norms, (&q, &k, &v), caches, (scale, None))?;
        Ok(out.reshape(&[n, s.heads * s.head_dim])?.sigmoid_mul(&gate)?)
    }

    /// One sequence's rows of the projections over its cache, gated.
    fn attend_one(&self, q_and_gate: &Array, k: &Array, v: &Array, cache: &mut LayerCache) -> Result<Array> {
        let s = &self.shape;
        let l = q_and_gate.dim(0);
        let offset = cache.offset();
        let (q, gate) = self.split_gate(q_and_gate)?;
        let q = self.rope.forward(&self.q_norm.forward(&q)?, offset)?;
        let k = self.rope.forward(&self.k_norm.forward(&k.reshape(&[l, s.kv_heads, s.head_dim])?)?, offset)?;
        let v = v.reshape(&[l, s.kv_heads, s.head_dim])?;
        let out = cache.attend(&q, &k, &v, (s.head_dim as f32).powf(-0.5))?;
        Ok(out.sigmoid_mul(&gate)?)
    }
}
