//! Qwen3.5 / Qwen3.6, dense and mixture-of-experts (mlx-lm's `models/qwen3_5.py` and
//! `qwen3_5_moe.py`): a hybrid decoder whose layers are Gated DeltaNet linear attention, except
//! every `full_attention_interval`-th, which is full attention with an output gate and partial
//! rotary embeddings. Feed-forward blocks are a gated MLP, or (when `num_experts > 0`) routed
//! experts plus a gated shared expert in every layer.
//!
//! The published checkpoints are multimodal: config.json nests the language model's fields in
//! `text_config`, and only the language model's tensors are read (never the vision tower's or
//! the multi-token-prediction head's, unless asked for: `qwen3_5_mtp.rs`). Tensor names follow mlx-lm's sanitized layout
//! (`language_model.model.*`), a Hugging Face original's (`model.language_model.*`, with the
//! convolution stored `[C, 1, K]` and the `1 + w` norms stored as `w`), or a text-only one's
//! (`model.*`).

use nuvec::{Array, DType, GatedDeltaDims, Matrix};
use serde_json::{json, Value};

use super::qwen3_5_mtp::Mtp;
use super::Architecture;
use crate::config::Config;
use crate::layers::{
    GatedAttention, GatedAttentionShape, GatedDeltaNet, GatedDeltaShape, Mlp, MoeShape, RmsNorm, Rope, SharedExpertMoe,
};
use crate::parallel::{Shard, Split, Stage};
use crate::step::StepBatch;
use crate::weights::Weights;
use crate::{Error, Result};

/// A layer's token mixer.
#[allow(clippy::large_enum_variant)] // one per layer, built once: boxing would only add a hop
#[derive(Clone)]
enum Mixer {
    Linear(GatedDeltaNet),
    Full(GatedAttention),
}

/// A layer's feed-forward block.
#[allow(clippy::large_enum_variant)] // as above
#[derive(Clone)]
enum FeedForward {
    Dense(Mlp),
    Sparse(SharedExpertMoe),
}

#[derive(Clone)]
pub(super) struct Block {
    input_layernorm: RmsNorm,
    mixer: Mixer,
    post_attention_layernorm: RmsNorm,
    mlp: FeedForward,
}

impl Block {
    pub(super) fn forward(&self, x: &Array, step: &mut StepBatch, layer: usize) -> Result<Array> {
        let normed = self.input_layernorm.forward(x)?;
        let r = match &self.mixer {
            Mixer::Linear(m) => m.forward(&normed, step, layer)?,
            Mixer::Full(m) => m.forward(&normed, step, layer)?,
        };
        let h = x.add(&r)?;
        let normed = self.post_attention_layernorm.forward(&h)?;
        let f = match &self.mlp {
            FeedForward::Dense(m) => m.forward(&normed)?,
            FeedForward::Sparse(m) => m.forward(&normed)?,
        };
        Ok(h.add(&f)?)
    }

    /// This rank's share of the block, layer `i` ([`crate::parallel`]): its share of the mixer's
    /// heads and of the feed-forward's hidden units; the norms whole.
    fn shard(&self, shard: &Shard, i: usize) -> Result<Block> {
        let at = |part: &str, e| crate::parallel::shard_at(&format!("model.layers.{i}.{part}"), e);
        Ok(Block {
            input_layernorm: self.input_layernorm.clone(),
            mixer: match &self.mixer {
                Mixer::Linear(m) => Mixer::Linear(m.shard(shard).map_err(|e| at("linear_attn", e))?),
                Mixer::Full(m) => Mixer::Full(m.shard(shard).map_err(|e| at("self_attn", e))?),
            },
            post_attention_layernorm: self.post_attention_layernorm.clone(),
            mlp: match &self.mlp {
                FeedForward::Dense(m) => FeedForward::Dense(m.shard(shard).map_err(|e| at("mlp", e))?),
                FeedForward::Sparse(m) => FeedForward::Sparse(m.shard(shard).map_err(|e| at("mlp", e))?),
            },
        })
    }
}

/// The Qwen3.5 decoder. A pipeline stage holds its own blocks, and of the rest only what it
/// runs (the embeddings on the first stage, the norm and head on the last).
pub struct Qwen3_5 {
    /// `None` on a stage that neither embeds the tokens nor has a head tied to them.
    embed_tokens: Option<Matrix>,
    layers: Vec<Block>,
    /// `None` on a stage without the head.
    norm: Option<RmsNorm>,
    /// `None` when tied to the embeddings, or on a stage without the head.
    lm_head: Option<Matrix>,
    /// The multi-token-prediction head, when loaded.
    mtp: Option<Mtp>,
    stage: Option<Stage>,
    shard: Option<Shard>,
    /// Whether `lm_head` is this rank's share of the vocabulary ([`Shard::head`]).
    vocab_split: bool,
}

/// Where a checkpoint keeps the language model's tensors.
struct Names {
    /// The decoder's prefix: `language_model.model`, `model.language_model` or `model`.
    model: &'static str,
    /// Hugging Face's layout: convolutions `[C, 1, K]` and norms stored as `w` for `1 + w`.
    hf_layout: bool,
}

impl Names {
    fn detect(weights: &Weights, linear_layers: &[usize]) -> Result<Self> {
        let model = ["language_model.model", "model.language_model", "model"]
            .into_iter()
            .find(|p| weights.has(&format!("{p}.embed_tokens.weight")))
            .ok_or_else(|| {
                Error::NotFound(
                    "no language_model.model.embed_tokens, model.language_model.embed_tokens or \
                     model.embed_tokens tensor: not a Qwen3.5 checkpoint"
                        .into(),
                )
            })?;
        // mlx-lm's sanitize: any convolution whose last axis is not 1 means a PyTorch original.
        let mut hf_layout = false;
        for i in linear_layers {
            let a = weights.raw(&format!("{model}.layers.{i}.linear_attn.conv1d.weight"))?;
            hf_layout |= a.shape().last().is_some_and(|&k| k != 1);
        }
        Ok(Names { model, hf_layout })
    }

    /// The output head's module, when untied.
    fn lm_head(&self, weights: &Weights) -> &'static str {
        match self.model {
            "language_model.model" if weights.has("language_model.lm_head.weight") => "language_model.lm_head",
            _ => "lm_head",
        }
    }
}

/// An RMS norm of `dims` features at `path`; `shifted` adds 1 to the stored weight in its own
/// dtype, as mlx-lm's sanitize does for Hugging Face originals (whose norm computes `1 + w`).
fn norm(weights: &Weights, path: &str, dims: usize, eps: f32, shifted: bool) -> Result<RmsNorm> {
    if !shifted {
        return RmsNorm::load(weights, path, dims, eps);
    }
    let w = weights.norm_tensor(&format!("{path}.weight"), &[dims])?;
    Ok(RmsNorm::from_weight(Array::from_slice_on(&plus_one(&w)?, &[dims], weights.device())?, eps))
}

/// A Hugging Face original's norm weight `w` as the `1 + w` mlx-lm's sanitize stores: each
/// value plus one, rounded to `w`'s dtype (as mlx adds a Python float), returned as f32.
pub(crate) fn plus_one(w: &Array) -> Result<Vec<f32>> {
    let round = |v: f32| match w.dtype() {
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        DType::F16 => half::f16::from_f32(v).to_f32(),
        _ => v,
    };
    Ok(w.to_f32_vec()?.iter().map(|&v| round(v + 1.0)).collect())
}

/// The rotary embedding of `rope_parameters` (mlx-lm's defaults when absent: theta 100000,
/// a quarter of each head rotated), for heads of `head_dim`.
fn rope(text: &Config, head_dim: usize) -> Result<Rope> {
    let params = text.get("rope_parameters").cloned().unwrap_or_else(|| json!({}));
    let Value::Object(fields) = &params else {
        return Err(text.error("rope_parameters", format_args!("= {params} is not an object")));
    };
    let number = |key: &str, default: f64| -> Result<f64> {
        match fields.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| text.error(&format!("rope_parameters.{key}"), format_args!("= {v} is not a number"))),
        }
    };
    let theta = number("rope_theta", 100000.0)?;
    let fraction = number("partial_rotary_factor", 0.25)?;
    let rotated = (head_dim as f64 * fraction) as usize;
    if rotated == 0 || rotated > head_dim || !rotated.is_multiple_of(2) {
        return Err(text.error(
            "rope_parameters.partial_rotary_factor",
            format_args!(
                "= {fraction} rotates {rotated} of {head_dim} features; it must be an even number, at least 2"
            ),
        ));
    }
    // mlx-lm hands rope_parameters to initialize_rope as the scaling config.
    let spec = json!({"rope_theta": theta, "rope_scaling": params});
    Rope::from_config(&Config::from_json(text.file(), &spec.to_string())?, rotated, None)
}

/// What every decoder block of a checkpoint is built from.
pub(super) struct Parts<'a> {
    pub(super) weights: &'a Weights,
    pub(super) text: Config,
    pub(super) hidden: usize,
    head_dim: usize,
    eps: f32,
    /// Norms stored as `w` for `1 + w` (a Hugging Face original).
    shifted: bool,
    delta: GatedDeltaShape,
    attention: GatedAttentionShape,
    rope: Rope,
    moe: MoeShape,
}

impl Parts<'_> {
    /// An RMS norm of the model's width at `path`.
    pub(super) fn norm(&self, path: &str) -> Result<RmsNorm> {
        norm(self.weights, path, self.hidden, self.eps, self.shifted)
    }

    /// The decoder block at `p`: Gated DeltaNet when `linear`, else gated full attention.
    pub(super) fn block(&self, p: &str, linear: bool) -> Result<Block> {
        let (weights, eps, head_dim) = (self.weights, self.eps, self.head_dim);
        let mixer = if linear {
            Mixer::Linear(GatedDeltaNet::load(weights, &format!("{p}.linear_attn"), self.delta)?)
        } else {
            let qk_norms = [
                norm(weights, &format!("{p}.self_attn.q_norm"), head_dim, eps, self.shifted)?,
                norm(weights, &format!("{p}.self_attn.k_norm"), head_dim, eps, self.shifted)?,
            ];
            let path = format!("{p}.self_attn");
            Mixer::Full(GatedAttention::load(weights, &path, self.attention, qk_norms, self.rope.clone())?)
        };
        let mlp = if self.moe.experts > 0 {
            let shared = self.text.usize("shared_expert_intermediate_size")?;
            FeedForward::Sparse(SharedExpertMoe::load(weights, &format!("{p}.mlp"), self.moe, shared)?)
        } else {
            let intermediate = self.text.usize("intermediate_size")?;
            FeedForward::Dense(Mlp::load(weights, &format!("{p}.mlp"), self.hidden, intermediate, false)?)
        };
        Ok(Block {
            input_layernorm: self.norm(&format!("{p}.input_layernorm"))?,
            mixer,
            post_attention_layernorm: self.norm(&format!("{p}.post_attention_layernorm"))?,
            mlp,
        })
    }
}

impl Qwen3_5 {
    /// Loads a `qwen3_5` or `qwen3_5_moe` checkpoint (flat or with `text_config`), with its
    /// multi-token-prediction head when `mtp` asks for it.
    pub fn load(config: &Config, weights: &Weights, mtp: bool) -> Result<Self> {
        Self::load_stage(config, weights, mtp, None)
    }

    /// [`Qwen3_5::load`], only `stage`'s part of it when given (no multi-token-prediction head
    /// then: the caller refuses it).
    pub(crate) fn load_stage(config: &Config, weights: &Weights, mtp: bool, stage: Option<Stage>) -> Result<Self> {
        let text = config.text_config()?;
        let hidden = text.usize("hidden_size")?;
        let layers = text.usize("num_hidden_layers")?;
        let heads = text.usize("num_attention_heads")?;
        let kv_heads = text.usize("num_key_value_heads")?;
        let vocab = text.usize("vocab_size")?;
        let eps = text.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32;
        let head_dim = text.opt_usize("head_dim")?.unwrap_or(hidden / heads.max(1));
        let interval = text.opt_usize("full_attention_interval")?.unwrap_or(4);
        if interval == 0 {
            return Err(text.error("full_attention_interval", "= 0: it must be at least 1"));
        }
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(text
                .error("num_key_value_heads", format_args!("= {kv_heads} must divide num_attention_heads = {heads}")));
        }
        let is_linear = |i: usize| !(i + 1).is_multiple_of(interval);
        let range = stage.as_ref().map_or(0..layers, Stage::layers);
        // The layout shows in any linear layer's convolution: the stage's own where it has one.
        let mut linear_layers: Vec<usize> = range.clone().filter(|&i| is_linear(i)).collect();
        if linear_layers.is_empty() {
            linear_layers = (0..layers).filter(|&i| is_linear(i)).take(1).collect();
        }
        let names = Names::detect(weights, &linear_layers)?;
        let delta = GatedDeltaShape {
            hidden,
            dims: GatedDeltaDims {
                key_heads: text.usize("linear_num_key_heads")?,
                value_heads: text.usize("linear_num_value_heads")?,
                key_dim: text.usize("linear_key_head_dim")?,
                value_dim: text.usize("linear_value_head_dim")?,
            },
            conv_kernel: text.opt_usize("linear_conv_kernel_dim")?.unwrap_or(4),
            eps,
        };
        let attention =
            GatedAttentionShape { hidden, heads, kv_heads, head_dim, bias: text.bool_or("attention_bias", false)? };
        let rope = rope(&text, head_dim)?;
        let experts = text.opt_usize("num_experts")?.unwrap_or(0);
        let moe = MoeShape {
            hidden,
            intermediate: if experts > 0 { text.usize("moe_intermediate_size")? } else { 0 },
            experts,
            top_k: text.opt_usize("num_experts_per_tok")?.unwrap_or(0),
            norm_topk_prob: text.bool_or("norm_topk_prob", true)?,
        };
        if experts > 0 && (moe.top_k == 0 || moe.top_k > experts) {
            let message = format_args!("= {} must be between 1 and num_experts = {experts}", moe.top_k);
            return Err(text.error("num_experts_per_tok", message));
        }
        let lm = names.model;
        // mlx-lm reads tie_word_embeddings from the text config only (default false).
        let tie = text.bool_or("tie_word_embeddings", false)?;
        let parts =
            Parts { weights, text, hidden, head_dim, eps, shifted: names.hf_layout, delta, attention, rope, moe };
        let blocks =
            range.map(|i| parts.block(&format!("{lm}.layers.{i}"), is_linear(i))).collect::<Result<Vec<_>>>()?;
        let head_here = stage.as_ref().is_none_or(Stage::has_head);
        let embeds_here = stage.as_ref().is_none_or(|s| s.holds_embeddings(tie));
        Ok(Qwen3_5 {
            embed_tokens: embeds_here
                .then(|| weights.matrix(&format!("{lm}.embed_tokens"), vocab, hidden))
                .transpose()?,
            layers: blocks,
            norm: head_here.then(|| parts.norm(&format!("{lm}.norm"))).transpose()?,
            lm_head: match tie || !head_here {
                true => None,
                false => Some(weights.matrix(names.lm_head(weights), vocab, hidden)?),
            },
            mtp: if mtp { Some(Mtp::load(&parts)?) } else { None },
            stage,
            shard: None,
            vocab_split: false,
        })
    }

    fn embeddings(&self) -> Result<&Matrix> {
        self.embed_tokens.as_ref().ok_or_else(|| Error::Invalid("this pipeline stage holds no embeddings".into()))
    }
}

impl Architecture for Qwen3_5 {
    fn hidden(&self, step: &mut StepBatch) -> Result<Array> {
        // A stage without the head passes its stream on unnormed.
        let through = |step: &mut StepBatch, h| -> Result<(Array, Array)> {
            let h = super::through_layers(&self.layers, step, h, |layer, h, step, i| layer.forward(h, step, i))?;
            let normed = match &self.norm {
                Some(norm) => norm.forward(&h)?,
                None => h.clone(),
            };
            Ok((h, normed))
        };
        match &self.stage {
            None => Ok(through(step, step.embed(self.embeddings()?)?)?.1),
            Some(stage) => stage.run(step, |step| step.embed(self.embeddings()?), through),
        }
    }

    fn logits(&self, hidden: &Array) -> Result<Array> {
        let head = self.lm_head.as_ref().or(self.embed_tokens.as_ref());
        crate::parallel::logits_of(
            hidden,
            head,
            self.stage.as_ref(),
            self.shard.as_ref().map(|s| (s, self.vocab_split)),
        )
    }

    fn shard(&self, shard: &Shard) -> Option<Result<Box<dyn Architecture>>> {
        if self.stage.is_some() || self.shard.is_some() {
            return None;
        }
        if self.mtp.is_some() {
            return Some(Err(Error::Unsupported(
                "a multi-token-prediction head on a model split across ranks: load the model without it".into(),
            )));
        }
        let split = || -> Result<Box<dyn Architecture>> {
            let layers = self.layers.iter().enumerate().map(|(i, b)| b.shard(shard, i)).collect::<Result<Vec<_>>>()?;
            let (lm_head, vocab_split) = shard.head(self.lm_head.as_ref())?;
            Ok(Box::new(Qwen3_5 {
                embed_tokens: self.embed_tokens.clone(),
                layers,
                norm: self.norm.clone(),
                lm_head,
                mtp: None,
                stage: None,
                shard: Some(shard.clone()),
                vocab_split,
            }))
        };
        Some(split())
    }

    fn sharded(&self) -> Option<&Shard> {
        self.shard.as_ref()
    }

    fn stage(&self) -> Option<&Stage> {
        self.stage.as_ref()
    }

    fn pipeline(&self, group: &nuvec::distributed::Group, split: &Split) -> Option<Result<Box<dyn Architecture>>> {
        let head = self.lm_head.as_ref().or(self.embed_tokens.as_ref())?;
        if self.stage.is_some() || self.shard.is_some() {
            return None;
        }
        if self.mtp.is_some() {
            return Some(Err(Error::Unsupported(
                "a multi-token-prediction head on a pipelined model: load the model without it".into(),
            )));
        }
        let stage = Stage::for_head(group, split, self.layers.len(), head);
        Some(stage.map(|stage| {
            let head_here = stage.has_head();
            Box::new(Qwen3_5 {
                embed_tokens: self.embed_tokens.clone().filter(|_| stage.holds_embeddings(self.lm_head.is_none())),
                layers: self.layers[stage.layers()].to_vec(),
                norm: self.norm.clone().filter(|_| head_here),
                lm_head: self.lm_head.clone().filter(|_| head_here),
                mtp: None,
                stage: Some(stage),
                shard: None,
                vocab_split: false,
            }) as Box<dyn Architecture>
        }))
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn is_recurrent(&self, layer: usize) -> bool {
        self.layers.get(layer).is_some_and(|b| matches!(b.mixer, Mixer::Linear(_)))
    }

    fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    fn mtp_hidden(&self, target: &Array, step: &mut StepBatch) -> Result<Array> {
        match &self.mtp {
            Some(mtp) => mtp.forward(self.embeddings()?, target, step),
            None => Err(super::no_mtp()),
        }
    }
}
