//! gpt-oss, as mlx-lm's `models/gpt_oss.py`: attention with learned sinks and biases on every
//! projection, layers alternating between a sliding window and full attention (`layer_types`,
//! `sliding_window`), yarn rope, and a mixture of experts whose router picks the top k logits,
//! softmaxes those alone, and runs experts with biases and a clamped SwiGLU.
//!
//! Checkpoints: mlx-community's (experts stacked as `mlp.experts.{gate,up,down}_proj`, dense or
//! quantized, read through [`Weights::experts`]) and Hugging Face originals, whose fused
//! `gate_up_proj` alternates gate and up rows; mlx-lm's `sanitize` splits those, and so does
//! [`load_experts`] for the float form. The MXFP4 `_blocks`/`_scales` form is refused with an
//! error until nuvec has the mxfp4 quantization mode.

use nuvec::{Array, Matrix};

use super::llama::{Block, Llama};
use crate::cache::{KvCache, LayerCache, RotatingKvCache};
use crate::config::Config;
use crate::layers::{Activation, Attention, AttentionShape, FeedForward, Linear, RmsNorm, Rope, SparseMoe};
use crate::models::Architecture;
use crate::parallel::{Shard, Split, Stage};
use crate::step::StepBatch;
use crate::weights::Weights;
use crate::{Error, Result};

/// The expert activation's constants: mlx-lm's `SwigluOAI()` defaults (it does not read
/// config.json's `swiglu_limit`).
const SWIGLU_ALPHA: f32 = 1.702;
const SWIGLU_LIMIT: f32 = 7.0;

/// Which attention a layer uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerType {
    /// A causal window of `sliding_window` positions, over a rotating cache of that size.
    Sliding,
    /// Every earlier position.
    Full,
}

/// The gpt-oss decoder: Llama's, with blocks of its own and per-layer caches. A pipeline stage or
/// a rank's split holds its part, as Llama's does.
pub struct GptOss {
    decoder: Llama,
    /// Of the decoder's own layers.
    layer_types: Vec<LayerType>,
    sliding_window: usize,
}

/// config.json's `layer_types`, or mlx-lm's default (sliding, full, sliding, ...).
fn layer_types(config: &Config, layers: usize) -> Result<Vec<LayerType>> {
    let Some(value) = config.get("layer_types") else {
        if !layers.is_multiple_of(2) {
            return Err(config.error(
                "layer_types",
                format_args!("is missing, and the default (sliding, full) pairs cannot cover {layers} layers"),
            ));
        }
        return Ok((0..layers).map(|i| if i % 2 == 0 { LayerType::Sliding } else { LayerType::Full }).collect());
    };
    let names = value.as_array().ok_or_else(|| config.error("layer_types", format_args!("= {value} is not a list")))?;
    if names.len() != layers {
        let message = format_args!("lists {} layers, num_hidden_layers = {layers}", names.len());
        return Err(config.error("layer_types", message));
    }
    names
        .iter()
        .map(|name| match name.as_str() {
            Some("sliding_attention") => Ok(LayerType::Sliding),
            Some("full_attention") => Ok(LayerType::Full),
            _ => Err(config.error(
                "layer_types",
                format_args!("holds {name}; each entry is \"sliding_attention\" or \"full_attention\""),
            )),
        })
        .collect()
}

impl GptOss {
    /// Loads gpt-oss; absent fields take mlx-lm's `ModelArgs` defaults.
    pub fn load(config: &Config, weights: &Weights) -> Result<Self> {
        Self::load_stage(config, weights, None)
    }

    /// Loads gpt-oss, only `stage`'s part of it when given: its layers, the embeddings on the
    /// first stage, the final norm and head on the last.
    pub(crate) fn load_stage(config: &Config, weights: &Weights, stage: Option<Stage>) -> Result<Self> {
        let usize_or = |key: &str, default: usize| -> Result<usize> { Ok(config.opt_usize(key)?.unwrap_or(default)) };
        let layers = usize_or("num_hidden_layers", 36)?;
        let hidden = usize_or("hidden_size", 2880)?;
        let heads = usize_or("num_attention_heads", 64)?;
        let kv_heads = usize_or("num_key_value_heads", 8)?;
        let head_dim = usize_or("head_dim", 64)?;
        let vocab = usize_or("vocab_size", 201088)?;
        let sliding_window = usize_or("sliding_window", 128)?;
        let eps = config.opt_f64("rms_norm_eps")?.unwrap_or(1e-5) as f32;
        let experts = usize_or("num_local_experts", 128)?;
        let top_k = usize_or("num_experts_per_tok", 4)?;
        let intermediate = usize_or("intermediate_size", 2880)?;
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(config
                .error("num_key_value_heads", format_args!("= {kv_heads} must divide num_attention_heads = {heads}")));
        }
        if top_k == 0 || top_k > experts {
            let message = format_args!("= {top_k} must be between 1 and num_local_experts = {experts}");
            return Err(config.error("num_experts_per_tok", message));
        }
        if sliding_window == 0 {
            return Err(config.error("sliding_window", "= 0: the window must hold at least one position"));
        }
        let range = stage.as_ref().map_or(0..layers, Stage::layers);
        let layer_types = layer_types(config, layers)?[range.clone()].to_vec();
        // mlx-lm builds this rope non-traditional whatever config.json says; a config saying
        // otherwise is contradictory, so it is an error rather than silently ignored.
        if config.bool_or("rope_traditional", false)? {
            return Err(config.error("rope_traditional", "= true, but gpt-oss's rope is not traditional"));
        }
        let rope = Rope::from_config(config, head_dim, Some(150000.0))?;
        let shape =
            AttentionShape { hidden, heads, kv_heads, head_dim, qkv_bias: true, o_bias: true, qk_norm_eps: None };
        let blocks = range
            .map(|i| {
                let p = format!("model.layers.{i}");
                let attn = format!("{p}.self_attn");
                let router = Linear::load(weights, &format!("{p}.mlp.router"), hidden, experts, true)?;
                let experts = load_experts(weights, &format!("{p}.mlp.experts"), experts, intermediate, hidden)?;
                let activation = Activation::SwigluOai { alpha: SWIGLU_ALPHA, limit: SWIGLU_LIMIT };
                Ok(Block {
                    input_layernorm: RmsNorm::load(weights, &format!("{p}.input_layernorm"), hidden, eps)?,
                    self_attn: Attention::load(weights, &attn, shape.clone(), rope.clone())?
                        .with_sinks(weights, &attn)?,
                    post_attention_layernorm: RmsNorm::load(
                        weights,
                        &format!("{p}.post_attention_layernorm"),
                        hidden,
                        eps,
                    )?,
                    mlp: FeedForward::Sparse(SparseMoe::from_parts(
                        router,
                        experts,
                        top_k,
                        nuvec::MoeRouting::TopKSoftmax,
                        activation,
                    )?),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let head_here = stage.as_ref().is_none_or(Stage::has_head);
        let embeds_here = stage.as_ref().is_none_or(Stage::embeds);
        let decoder = Llama::from_parts(
            embeds_here.then(|| weights.matrix("model.embed_tokens", vocab, hidden)).transpose()?,
            blocks,
            head_here.then(|| RmsNorm::load(weights, "model.norm", hidden, eps)).transpose()?,
            head_here.then(|| weights.matrix("lm_head", vocab, hidden)).transpose()?,
            stage,
        );
        Ok(GptOss { decoder, layer_types, sliding_window })
    }
}

/// The `[gate, up, down]` projections of each of `num` experts under `path` (`mlp.experts`),
/// with their biases: stacked as mlx-lm writes them, or in Hugging Face's fused layout, split as
/// mlx-lm's `sanitize` splits it.
fn load_experts(
    weights: &Weights,
    path: &str,
    num: usize,
    intermediate: usize,
    hidden: usize,
) -> Result<Vec<[Linear; 3]>> {
    let name = |suffix: &str| format!("{path}.{suffix}");
    let stacked =
        |proj: &str, rows, cols| weights.experts(&name(proj), |e| format!("{path}.{e}.{proj}"), num, rows, cols);
    let (gates, ups, downs, gate_bias, up_bias, down_bias) = if weights.has(&name("gate_proj.weight")) {
        let gates = stacked("gate_proj", intermediate, hidden)?;
        let ups = stacked("up_proj", intermediate, hidden)?;
        let bias = |proj: &str, n| weights.tensor(&name(&format!("{proj}.bias")), &[num, n]);
        let downs = stacked("down_proj", hidden, intermediate)?;
        (
            gates,
            ups,
            downs,
            bias("gate_proj", intermediate)?,
            bias("up_proj", intermediate)?,
            bias("down_proj", hidden)?,
        )
    } else if weights.has(&name("gate_up_proj.weight")) {
        let [gates, ups] = weights.deinterleaved_experts(&name("gate_up_proj.weight"), num, intermediate, hidden)?;
        let [gate_bias, up_bias] = weights.deinterleaved_rows(&name("gate_up_proj_bias"), num, intermediate)?;
        let downs = stacked("down_proj", hidden, intermediate)?;
        (gates, ups, downs, gate_bias, up_bias, weights.tensor(&name("down_proj_bias"), &[num, hidden])?)
    } else if weights.has(&name("gate_up_proj_blocks")) {
        // Hugging Face's MXFP4 release: the experts in MLX's mxfp4 mode, as mlx-lm's sanitize
        // reads them.
        let mut fused = weights.mxfp4_experts(&name("gate_up_proj"), num, intermediate, hidden, true)?.into_iter();
        let (gates, ups) = (fused.next().expect("two halves"), fused.next().expect("two halves"));
        let downs = weights.mxfp4_experts(&name("down_proj"), num, hidden, intermediate, false)?.remove(0);
        let [gate_bias, up_bias] = weights.deinterleaved_rows(&name("gate_up_proj_bias"), num, intermediate)?;
        (gates, ups, downs, gate_bias, up_bias, weights.tensor(&name("down_proj_bias"), &[num, hidden])?)
    } else {
        return Err(unsanitized_experts_error(weights, path));
    };
    let linear = |weight: Matrix, bias: &Array, e: usize| -> Result<Linear> {
        Ok(Linear::plain(weight, Some(bias.index_first(e)?)))
    };
    gates
        .into_iter()
        .zip(ups)
        .zip(downs)
        .enumerate()
        .map(|(e, ((g, u), d))| Ok([linear(g, &gate_bias, e)?, linear(u, &up_bias, e)?, linear(d, &down_bias, e)?]))
        .collect()
}

/// Why the experts under `path` cannot be read: a layout nuvec does not load yet, or missing
/// tensors.
fn unsanitized_experts_error(weights: &Weights, path: &str) -> Error {
    let dir = weights.files().first().and_then(|f| f.parent().map(|d| d.display().to_string())).unwrap_or_default();
    if weights.has(&format!("{path}.gate_up_proj_blocks")) {
        return Error::Unsupported(format!(
            "{dir}: {path}.gate_up_proj_blocks is Hugging Face's MXFP4 layout, which nuvec does not rearrange \
             into MLX's mxfp4 mode yet; convert with `mlx_lm.convert` (its output loads), or use a bf16 checkpoint"
        ));
    }
    if weights.has(&format!("{path}.gate_up_proj")) {
        return Error::Unsupported(format!(
            "{dir}: {path}.gate_up_proj is transformers' in-memory [experts, hidden, 2 * intermediate] layout \
             (a re-saved or dequantized model), which mlx-lm does not load either; use an mlx-community \
             conversion or the original release"
        ));
    }
    Error::Weights {
        file: dir,
        message: format!(
            "{path}: no gate_proj.weight (mlx-lm's layout) or gate_up_proj.weight (Hugging Face's fused layout); \
             is this a gpt-oss checkpoint?"
        ),
    }
}

impl Architecture for GptOss {
    fn hidden(&self, step: &mut StepBatch) -> Result<Array> {
        self.decoder.hidden(step)
    }

    fn logits(&self, hidden: &Array) -> Result<Array> {
        self.decoder.logits(hidden)
    }

    fn num_layers(&self) -> usize {
        self.decoder.num_layers()
    }

    fn stage(&self) -> Option<&Stage> {
        self.decoder.stage()
    }

    fn shard(&self, shard: &Shard) -> Option<Result<Box<dyn Architecture>>> {
        let whole = self.decoder.stage().is_none() && self.decoder.sharded().is_none();
        whole.then(|| {
            let decoder = self.decoder.split_across(shard)?;
            let layer_types = self.layer_types.clone();
            Ok(Box::new(GptOss { decoder, layer_types, sliding_window: self.sliding_window }) as Box<dyn Architecture>)
        })
    }

    fn sharded(&self) -> Option<&Shard> {
        self.decoder.sharded()
    }

    fn pipeline(&self, group: &nuvec::distributed::Group, split: &Split) -> Option<Result<Box<dyn Architecture>>> {
        let stage = self.decoder.new_stage(group, split)?;
        Some(stage.map(|stage| {
            let layer_types = self.layer_types[stage.layers()].to_vec();
            let decoder = self.decoder.stage_of(stage);
            Box::new(GptOss { decoder, layer_types, sliding_window: self.sliding_window }) as Box<dyn Architecture>
        }))
    }

    /// mlx-lm's `make_cache`: a plain cache for full-attention layers, a rotating cache of
    /// `sliding_window` positions (nothing pinned) for sliding ones. The rotating cache's own
    /// mask is the sliding window, exactly as mlx-lm masks those layers.
    fn own_cache(&self, kv_dtype: nuvec::DType) -> Option<Vec<LayerCache>> {
        let caches = self
            .layer_types
            .iter()
            .map(|t| match t {
                LayerType::Full => LayerCache::Plain(KvCache::with_dtype(kv_dtype)),
                LayerType::Sliding => LayerCache::Rotating(
                    RotatingKvCache::with_context(self.sliding_window, 0, kv_dtype)
                        .expect("a window of at least 1 was checked at load"),
                ),
            })
            .collect();
        Some(caches)
    }
}
