//! Multi-head attention with grouped key/value heads, optional q/k norms and biases.

use nuvec::Array;

use super::{Linear, RmsNorm, Rope};
use crate::cache::paged::{attend_decodes, write_decodes, InPlace};
use crate::cache::{LayerCache, Positions};
use crate::parallel::Shard;
use crate::step::{concat_rows, StepBatch};
use crate::weights::Weights;
use crate::Result;

/// The sizes and options of an attention block, as the model family reads them from its config.
#[derive(Debug, Clone)]
pub struct AttentionShape {
    /// Model width.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (a divisor of `heads`).
    pub kv_heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// Biases on q, k and v.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// RMS-normalize each query and key head before the rotary embedding (Qwen3), with this eps.
    pub qk_norm_eps: Option<f32>,
}

/// Self-attention over a KV cache.
#[derive(Debug, Clone)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    rope: Rope,
    shape: AttentionShape,
    /// One logit per query head joining each softmax (gpt-oss's attention sinks).
    sinks: Option<Vec<f32>>,
}

impl Attention {
    /// Loads `{path}.{q,k,v,o}_proj` (and `q_norm`/`k_norm` when the shape asks for them).
    pub fn load(weights: &Weights, path: &str, shape: AttentionShape, rope: Rope) -> Result<Self> {
        let s = &shape;
        let (q_out, kv_out) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let norm = |name: &str| -> Result<Option<RmsNorm>> {
            s.qk_norm_eps.map(|eps| RmsNorm::load(weights, &format!("{path}.{name}"), s.head_dim, eps)).transpose()
        };
        Ok(Attention {
            q_proj: Linear::load(weights, &format!("{path}.q_proj"), s.hidden, q_out, s.qkv_bias)?,
            k_proj: Linear::load(weights, &format!("{path}.k_proj"), s.hidden, kv_out, s.qkv_bias)?,
            v_proj: Linear::load(weights, &format!("{path}.v_proj"), s.hidden, kv_out, s.qkv_bias)?,
            o_proj: Linear::load(weights, &format!("{path}.o_proj"), q_out, s.hidden, s.o_bias)?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            rope,
            shape,
            sinks: None,
        })
    }

    /// The same block with attention sinks read from `{path}.sinks [heads]` (gpt-oss).
    pub fn with_sinks(mut self, weights: &Weights, path: &str) -> Result<Self> {
        let sinks = weights.tensor(&format!("{path}.sinks"), &[self.shape.heads])?;
        self.sinks = Some(sinks.to_f32_vec()?);
        Ok(self)
    }

    /// This rank's share of the block: its share of the query heads, the key/value heads they
    /// read (shared between ranks when there are fewer than ranks), and the output projection's
    /// columns for those heads, summed over the group.
    pub(crate) fn shard(&self, shard: &Shard) -> Result<Attention> {
        let s = &self.shape;
        let (heads, kv) = shard.heads(s.heads, s.kv_heads)?;
        let own = heads.len();
        let features = |r: &std::ops::Range<usize>| r.start * s.head_dim..r.end * s.head_dim;
        Ok(Attention {
            q_proj: self.q_proj.output_part(features(&heads))?,
            k_proj: self.k_proj.output_part(features(&kv))?,
            v_proj: self.v_proj.output_part(features(&kv))?,
            o_proj: self.o_proj.input_part(features(&heads), shard.group())?,
            q_norm: self.q_norm.clone(),
            k_norm: self.k_norm.clone(),
            rope: self.rope.clone(),
            shape: AttentionShape { heads: own, kv_heads: kv.len(), ..s.clone() },
            sinks: self.sinks.as_ref().map(|sinks| sinks[heads.clone()].to_vec()),
        })
    }

    /// Attends the step's rows `x [T, hidden]`, each sequence's over its layer-`layer` cache
    /// (which grows by its rows).
    pub fn forward(&self, x: &Array, step: &mut StepBatch, layer: usize) -> Result<Array> {
        self.o_proj.forward(&self.attend(x, step, layer)?)
    }

    /// [`Attention::forward`] with the residual add and the norm after it:
    /// `(h, norm(h))` for `h = residual + forward(x)` ([`Linear::forward_add_norm`]).
    pub fn forward_add_norm(
        &self,
        x: &Array,
        step: &mut StepBatch,
        layer: usize,
        residual: &Array,
        norm: &RmsNorm,
    ) -> Result<(Array, Array)> {
        self.o_proj.forward_add_norm(&self.attend(x, step, layer)?, residual, norm)
    }

    /// The heads' outputs `[T, heads * head_dim]`, before the output projection: the
    /// projections over every row, attention per sequence (the decodes and short chunks of
    /// several sequences over one paged cache as one op, also in a step that prefills others).
    fn attend(&self, x: &Array, step: &mut StepBatch, layer: usize) -> Result<Array> {
        let [q, k, v] = Linear::forward_many([&self.q_proj, &self.k_proj, &self.v_proj], x)?;
        step.each_with_decodes(
            layer,
            false,
            [&q, &k, &v],
            |[q, k, v], caches| self.attend_decodes(&q, &k, &v, caches),
            |[q, k, v], cache| self.attend_one(&q, &k, &v, &mut cache[layer]),
        )
    }

    /// The rows of several paged sequences attended in place ([`decode_together`]).
    fn attend_decodes(&self, q: &Array, k: &Array, v: &Array, caches: InPlace<'_>) -> Result<Array> {
        let s = &self.shape;
        let n = q.dim(0);
        let q = q.reshape(&[n, s.heads, s.head_dim])?;
        let k = k.reshape(&[n, s.kv_heads, s.head_dim])?;
        let v = v.reshape(&[n, s.kv_heads, s.head_dim])?;
        let scale = (s.head_dim as f32).powf(-0.5);
        let norms = (self.q_norm.as_ref(), self.k_norm.as_ref());
        decode_together(&self.rope, norms, (&q, &k, &v), caches, (scale, self.sinks.as_deref()))
    }

    /// The q/k norms as the fused rope ops take them ([`paired`]).
    fn paired_norms(&self) -> Option<Option<(&RmsNorm, &RmsNorm)>> {
        paired((self.q_norm.as_ref(), self.k_norm.as_ref()))
    }

    /// The q/k norms (where the family has them) and rope of both at `offset` ([`rotate`]).
    fn rotate(&self, q: Array, k: Array, offset: usize) -> Result<(Array, Array)> {
        rotate(&self.rope, (self.q_norm.as_ref(), self.k_norm.as_ref()), q, k, offset)
    }

    /// One sequence's rows of the projections `q, k, v [L, ...]` over its cache.
    fn attend_one(&self, q: &Array, k: &Array, v: &Array, cache: &mut LayerCache) -> Result<Array> {
        let s = &self.shape;
        let l = q.dim(0);
        let offset = cache.offset();
        let q = q.reshape(&[l, s.heads, s.head_dim])?;
        let k = k.reshape(&[l, s.kv_heads, s.head_dim])?;
        let v = v.reshape(&[l, s.kv_heads, s.head_dim])?;
        let scale = (s.head_dim as f32).powf(-0.5);
        // On a plain cache: the q/k norms (when the family has them), rope of both and the cache
        // write of k and v, as one op.
        if let (Some(norms), LayerCache::Plain(c)) = (self.paired_norms(), &mut *cache) {
            let shape = (l, s.kv_heads, s.head_dim);
            return c.attend_written(shape, k.device(), (scale, self.sinks.as_deref()), |kc, vc, at| {
                self.rope.forward_qk_into(&q, &k, &v, norms, offset, (kc, vc, at))
            });
        }
        // Otherwise the q/k norms and rope of both as one op, then the cache's attention.
        let (q, k) = self.rotate(q, k, offset)?;
        cache.attend_with_sinks(&q, &k, &v, scale, self.sinks.as_deref())
    }
}

/// The q/k norms of a block, as the fused rope ops take them: `Some(Some(..))` with both,
/// `Some(None)` with neither, `None` for one without the other (which only the separate ops
/// handle).
fn paired<'a>(norms: (Option<&'a RmsNorm>, Option<&'a RmsNorm>)) -> Option<Option<(&'a RmsNorm, &'a RmsNorm)>> {
    match norms {
        (Some(qn), Some(kn)) => Some(Some((qn, kn))),
        (None, None) => Some(None),
        _ => None,
    }
}

/// `q, k [L, heads, head_dim]` through the q/k norms (where given) and `rope` at `offset`: one
/// op where the norms come in pairs.
fn rotate(
    rope: &Rope,
    norms: (Option<&RmsNorm>, Option<&RmsNorm>),
    q: Array,
    k: Array,
    offset: usize,
) -> Result<(Array, Array)> {
    if let Some(pair) = paired(norms) {
        return rope.forward_qk(&q, &k, pair, offset);
    }
    let norm = |a: Array, n: Option<&RmsNorm>| match n {
        Some(n) => n.forward(&a),
        None => Ok(a),
    };
    rope.forward_qk(&norm(q, norms.0)?, &norm(k, norms.1)?, None, offset)
}

/// The rows of several paged sequences over one store attended in place (decodes, and short
/// chunks over a cached prefix), `q [rows, heads, head_dim]` and `k, v [rows, kv_heads,
/// head_dim]` in `caches`' order: per row the q/k norms (where given) and rope at its position
/// and its key and value written into its sequence's cache (one op where the rope fuses them),
/// then one attention op in which each row attends every position up to its own (a sliding
/// window's last ones in a window layer) with `(scale, sinks)`. Each row is what a decode of its
/// position alone computes (to rounding; bit for bit on the CPU).
pub(crate) fn decode_together(
    rope: &Rope,
    norms: (Option<&RmsNorm>, Option<&RmsNorm>),
    (q, k, v): (&Array, &Array, &Array),
    mut caches: InPlace<'_>,
    (scale, sinks): (f32, Option<&[f32]>),
) -> Result<Array> {
    let (kv_heads, head_dim) = (k.dim(1), k.dim(2));
    if let Some(pair) = paired(norms).filter(|&n| rope.fuses_paged(n)) {
        // Every row's norms, rope and cache write as one op.
        let dims = (kv_heads, head_dim, k.device());
        let rotated =
            write_decodes(&mut caches, dims, |rows, stores| rope.forward_qk_paged((q, k, v), pair, rows, stores))?;
        return attend_decodes(&caches, &rotated, scale, sinks);
    }
    let mut rotated = Vec::new();
    for (cache, span) in caches.iter_mut() {
        let mine = |a: &Array| a.slice_rows(span.start, span.end);
        let (q, k) = rotate(rope, norms, mine(q)?, mine(k)?, cache.offset())?;
        cache.write(&k, &mine(v)?)?;
        rotated.push(q);
    }
    attend_decodes(&caches, &concat_rows(&rotated)?, scale, sinks)
}
