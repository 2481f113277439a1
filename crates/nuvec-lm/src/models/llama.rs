//! Llama (1, 2, 3.x) and Mistral, as mlx-lm's `models/llama.py`; Qwen 2 and 3 reuse it with
//! their own options.

use nuvec::{Array, Matrix};

use crate::config::Config;
use crate::layers::{Attention, AttentionShape, FeedForward, Mlp, MoeShape, RmsNorm, Rope, SparseMoe};
use crate::models::Architecture;
use crate::parallel::{Shard, Split, Stage};
use crate::step::StepBatch;
use crate::weights::Weights;
use crate::{Error, Result};
use nuvec::distributed::Group;

/// What differs between the families built on this decoder.
#[derive(Debug, Clone)]
pub struct Family {
    /// Biases on q, k, v.
    pub qkv_bias: bool,
    /// Bias on o_proj.
    pub o_bias: bool,
    /// Biases in the MLP.
    pub mlp_bias: bool,
    /// Qwen3's per-head q/k RMS norms.
    pub qk_norm: bool,
    /// `head_dim` when config.json has none: `None` means hidden / heads.
    pub head_dim_required: bool,
    /// `rope_theta` when config.json has none.
    pub default_rope_theta: Option<f64>,
    /// `tie_word_embeddings` when config.json has none (`None`: the field is required).
    pub default_tie: Option<bool>,
    /// Mixture-of-experts layers as Qwen3-MoE configures them (num_experts,
    /// num_experts_per_tok, moe_intermediate_size, decoder_sparse_step, mlp_only_layers,
    /// norm_topk_prob).
    pub moe: bool,
}

/// A pre-norm decoder block (also gpt-oss's, whose feed-forward is always sparse).
#[derive(Clone)]
pub(super) struct Block {
    pub(super) input_layernorm: RmsNorm,
    pub(super) self_attn: Attention,
    pub(super) post_attention_layernorm: RmsNorm,
    pub(super) mlp: FeedForward,
}

impl Block {
    /// The block on the residual stream `x`, given `normed = input_layernorm(x)`; `next_norm`
    /// is the norm that follows the block (the next block's input norm, or the model's final
    /// one). Returns the stream after the block and `next_norm` of it: each residual add runs
    /// with the projection before it and the norm after it (`Linear::forward_add_norm`), the
    /// values of `h = x + attn(norm(x)); out = h + mlp(norm(h))` followed by `next_norm(out)`
    /// (bit for bit where the backend composes them; CUDA folds a decode row's norms into the
    /// GEMVs, the same to rounding).
    pub(super) fn forward(
        &self,
        x: &Array,
        normed: &Array,
        next_norm: &RmsNorm,
        step: &mut StepBatch,
        layer: usize,
    ) -> Result<(Array, Array)> {
        let (h, h_normed) = self.self_attn.forward_add_norm(normed, step, layer, x, &self.post_attention_layernorm)?;
        self.mlp.forward_add_norm(&h_normed, &h, next_norm)
    }
}

/// The decoder: embeddings, blocks, final norm, and a head (or the embeddings, tied). A pipeline
/// stage holds its own blocks, and of the rest only what it runs.
pub struct Llama {
    /// `None` on a stage that neither embeds the tokens nor has a head tied to them.
    embed_tokens: Option<Matrix>,
    layers: Vec<Block>,
    /// `None` on a stage without the head.
    norm: Option<RmsNorm>,
    /// On a rank of a split model, its share of the vocabulary when `vocab_split`.
    lm_head: Option<Matrix>,
    stage: Option<Stage>,
    shard: Option<Shard>,
    /// Whether `lm_head` is this rank's share of the vocabulary ([`Shard::head`]).
    vocab_split: bool,
}

/// Llama's and Mistral's options on the decoder.
pub fn family(config: &Config) -> Result<Family> {
    Ok(Family {
        qkv_bias: config.bool_or("attention_bias", false)?,
        o_bias: config.bool_or("attention_bias", false)?,
        mlp_bias: config.bool_or("mlp_bias", false)?,
        qk_norm: false,
        head_dim_required: false,
        default_rope_theta: Some(10000.0),
        default_tie: Some(true),
        moe: false,
    })
}

impl Llama {
    /// Loads Llama or Mistral.
    pub fn load(config: &Config, weights: &Weights) -> Result<Self> {
        Self::load_family(config, weights, &family(config)?)
    }

    /// Loads any family on this decoder.
    pub fn load_family(config: &Config, weights: &Weights, family: &Family) -> Result<Self> {
        Self::load_stage(config, weights, family, None)
    }

    /// Loads any family on this decoder, only `stage`'s part of it when given.
    pub(crate) fn load_stage(
        config: &Config,
        weights: &Weights,
        family: &Family,
        stage: Option<Stage>,
    ) -> Result<Self> {
        let hidden = config.usize("hidden_size")?;
        let heads = config.usize("num_attention_heads")?;
        let kv_heads = config.opt_usize("num_key_value_heads")?.unwrap_or(heads);
        let vocab = config.usize("vocab_size")?;
        let layers = config.usize("num_hidden_layers")?;
        let intermediate = config.usize("intermediate_size")?;
        let eps = config.f64("rms_norm_eps")? as f32;
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(config
                .error("num_key_value_heads", format_args!("= {kv_heads} must divide num_attention_heads = {heads}")));
        }
        let head_dim = match config.opt_usize("head_dim")? {
            Some(d) => d,
            None if family.head_dim_required => return Err(config.error("head_dim", "is missing")),
            None => hidden / heads,
        };
        let tie = match (config.get("tie_word_embeddings"), family.default_tie) {
            (None, Some(default)) => default,
            (None, None) => return Err(config.error("tie_word_embeddings", "is missing")),
            _ => config.bool_or("tie_word_embeddings", false)?,
        };
        let rope = Rope::from_config(config, head_dim, family.default_rope_theta)?;
        let shape = AttentionShape {
            hidden,
            heads,
            kv_heads,
            head_dim,
            qkv_bias: family.qkv_bias,
            o_bias: family.o_bias,
            qk_norm_eps: family.qk_norm.then_some(eps),
        };
        let moe = match family.moe {
            false => None,
            true => Some(MoeShape {
                hidden,
                intermediate: config.usize("moe_intermediate_size")?,
                experts: config.usize("num_experts")?,
                top_k: config.usize("num_experts_per_tok")?,
                norm_topk_prob: config.bool_or("norm_topk_prob", false)?,
            }),
        };
        if let Some(m) = &moe {
            if m.top_k == 0 || m.top_k > m.experts {
                let message = format_args!("= {} must be between 1 and num_experts = {}", m.top_k, m.experts);
                return Err(config.error("num_experts_per_tok", message));
            }
        }
        // mlx-lm's rule: sparse unless listed in mlp_only_layers, every decoder_sparse_step-th layer.
        let mlp_only: Vec<usize> = match config.get("mlp_only_layers") {
            None => vec![],
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|_| config.error("mlp_only_layers", format_args!("= {v} is not a list of layer indices")))?,
        };
        let is_sparse = |i: usize| -> Result<bool> {
            let step = config.opt_usize("decoder_sparse_step")?.unwrap_or(1).max(1);
            Ok(!mlp_only.contains(&i) && (i + 1).is_multiple_of(step))
        };
        let range = stage.as_ref().map_or(0..layers, Stage::layers);
        let blocks = range
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Block {
                    input_layernorm: RmsNorm::load(weights, &format!("{p}.input_layernorm"), hidden, eps)?,
                    self_attn: Attention::load(weights, &format!("{p}.self_attn"), shape.clone(), rope.clone())?,
                    post_attention_layernorm: RmsNorm::load(
                        weights,
                        &format!("{p}.post_attention_layernorm"),
                        hidden,
                        eps,
                    )?,
                    mlp: match &moe {
                        Some(shape) if is_sparse(i)? => {
                            FeedForward::Sparse(SparseMoe::load(weights, &format!("{p}.mlp"), *shape)?)
                        }
                        _ => FeedForward::Dense(Mlp::load(
                            weights,
                            &format!("{p}.mlp"),
                            hidden,
                            intermediate,
                            family.mlp_bias,
                        )?),
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let head_here = stage.as_ref().is_none_or(Stage::has_head);
        let embeds_here = stage.as_ref().is_none_or(|s| s.holds_embeddings(tie));
        Ok(Llama {
            embed_tokens: embeds_here.then(|| weights.matrix("model.embed_tokens", vocab, hidden)).transpose()?,
            layers: blocks,
            norm: head_here.then(|| RmsNorm::load(weights, "model.norm", hidden, eps)).transpose()?,
            lm_head: match tie || !head_here {
                true => None,
                false => Some(weights.matrix("lm_head", vocab, hidden)?),
            },
            stage,
            shard: None,
            vocab_split: false,
        })
    }

    /// A decoder of these parts, loaded by a family that builds its own blocks (gpt-oss): a
    /// stage's own, with the embeddings, norm and head where it runs them.
    pub(super) fn from_parts(
        embed_tokens: Option<Matrix>,
        layers: Vec<Block>,
        norm: Option<RmsNorm>,
        lm_head: Option<Matrix>,
        stage: Option<Stage>,
    ) -> Llama {
        Llama { embed_tokens, layers, norm, lm_head, stage, shard: None, vocab_split: false }
    }

    /// Rank `group.rank()`'s stage of this whole decoder split as `split`; `None` once it is a
    /// stage or split already (or holds no head).
    pub(super) fn new_stage(&self, group: &Group, split: &Split) -> Option<Result<Stage>> {
        let head = self.lm_head.as_ref().or(self.embed_tokens.as_ref())?;
        let whole = self.stage.is_none() && self.shard.is_none();
        whole.then(|| Stage::for_head(group, split, self.layers.len(), head))
    }

    /// The stage `stage` of this whole decoder: its blocks, and the embeddings, norm and head
    /// where it runs them ([`crate::Model::pipeline`]).
    pub(crate) fn stage_of(&self, stage: Stage) -> Llama {
        let layers = self.layers[stage.layers()].to_vec();
        let head_here = stage.has_head();
        Llama {
            embed_tokens: self.embed_tokens.clone().filter(|_| stage.holds_embeddings(self.lm_head.is_none())),
            layers,
            norm: self.norm.clone().filter(|_| head_here),
            lm_head: self.lm_head.clone().filter(|_| head_here),
            stage: Some(stage),
            shard: None,
            vocab_split: false,
        }
    }

    /// This rank's share of every block ([`crate::parallel`]'s tensor parallelism); the
    /// embeddings, norms and head stay whole.
    pub(crate) fn split_across(&self, shard: &Shard) -> Result<Llama> {
        let at = crate::parallel::shard_at;
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let place = |part: &str| format!("model.layers.{i}.{part}");
                Ok(Block {
                    input_layernorm: b.input_layernorm.clone(),
                    self_attn: b.self_attn.shard(shard).map_err(|e| at(&place("self_attn"), e))?,
                    post_attention_layernorm: b.post_attention_layernorm.clone(),
                    mlp: match &b.mlp {
                        FeedForward::Dense(mlp) => {
                            FeedForward::Dense(mlp.shard(shard).map_err(|e| at(&place("mlp"), e))?)
                        }
                        FeedForward::Sparse(moe) => {
                            FeedForward::Sparse(moe.shard(shard).map_err(|e| at(&place("mlp"), e))?)
                        }
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (lm_head, vocab_split) = shard.head(self.lm_head.as_ref())?;
        Ok(Llama {
            embed_tokens: self.embed_tokens.clone(),
            layers,
            norm: self.norm.clone(),
            lm_head,
            stage: None,
            shard: Some(shard.clone()),
            vocab_split,
        })
    }

    fn embeddings(&self) -> Result<&Matrix> {
        self.embed_tokens.as_ref().ok_or_else(|| Error::Invalid("this pipeline stage holds no embeddings".into()))
    }
}

impl Architecture for Llama {
    fn hidden(&self, step: &mut StepBatch) -> Result<Array> {
        // A stage without the head ends on its last block's own input norm, whose output it drops.
        let final_norm = match (&self.norm, self.layers.last()) {
            (Some(norm), _) => norm,
            (None, Some(last)) => &last.input_layernorm,
            (None, None) => return Err(Error::Invalid("a pipeline stage with neither layers nor head".into())),
        };
        let through = |step: &mut StepBatch, h| {
            super::through_normed_layers(&self.layers, step, h, |l| &l.input_layernorm, final_norm, Block::forward)
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

    fn stage(&self) -> Option<&Stage> {
        self.stage.as_ref()
    }

    fn shard(&self, shard: &Shard) -> Option<Result<Box<dyn Architecture>>> {
        (self.stage.is_none() && self.shard.is_none())
            .then(|| Ok(Box::new(self.split_across(shard)?) as Box<dyn Architecture>))
    }

    fn sharded(&self) -> Option<&Shard> {
        self.shard.as_ref()
    }

    fn pipeline(&self, group: &Group, split: &Split) -> Option<Result<Box<dyn Architecture>>> {
        let stage = self.new_stage(group, split)?;
        Some(stage.map(|stage| Box::new(self.stage_of(stage)) as Box<dyn Architecture>))
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }
}
