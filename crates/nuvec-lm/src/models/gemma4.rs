//! Gemma 4 text models, as mlx-lm's `models/gemma4_text.py` (model_type `gemma4_text`), and the
//! language model inside a multimodal Gemma 4 checkpoint (`gemma4`, mlx-lm's `models/gemma4.py`:
//! `text_config` inside; vision and audio tensors are never read).
//!
//! What sets Gemma 4 apart from the Llama decoder:
//! - layers are `sliding_attention` (a rotating cache of `sliding_window` positions) or
//!   `full_attention`, each type with its own rope parameters; full layers may have wider heads
//!   (`global_head_dim`) and a proportional rope that rotates only part of each head;
//! - queries and keys are RMS-normalized per head (values too, without a scale) and attention is
//!   unscaled (scale 1);
//! - the last `num_kv_shared_layers` layers compute no keys or values: each attends over the
//!   cache of the last earlier layer of its type (and has no cache of its own);
//! - per-layer inputs: a second embedding table gives every layer a small vector per token,
//!   mixed with a projection of the embeddings and gated into the residual after the MLP;
//! - four norms per layer (before and after attention and MLP), a per-layer scalar, GELU-gated
//!   MLPs (double width in KV-shared layers when `use_double_wide_mlp`), embeddings scaled by
//!   `sqrt(hidden_size)` and logits soft-capped by `final_logit_softcapping`;
//! - optionally a mixture of experts beside the dense MLP (`enable_moe_block`).
//!
//! Norms are plain `x * rsqrt(mean(x^2) + eps) * weight` (mlx's `nn.RMSNorm`; the checkpoint
//! stores the full scale, not Gemma 3's `1 + weight`).

use nuvec::{Array, ExpertActivation, Matrix, MoeRouting};
use serde_json::Value;

use crate::cache::paged::attend_decodes;
use crate::cache::{KvCache, LayerCache, Positions, RotatingKvCache};
use crate::config::Config;
use crate::layers::{decode_together, GeluMlp, Linear, RmsNorm, Rope};
use crate::models::Architecture;
use crate::step::{concat_rows, StepBatch};
use crate::weights::Weights;
use crate::{Error, Result};

/// The two kinds of attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerType {
    Sliding,
    Full,
}

impl LayerType {
    fn key(self) -> &'static str {
        match self {
            LayerType::Sliding => "sliding_attention",
            LayerType::Full => "full_attention",
        }
    }
}

/// config.json's fields, with mlx-lm's `ModelArgs` defaults for absent ones.
struct Args {
    hidden: usize,
    layers: usize,
    intermediate: usize,
    heads: usize,
    head_dim: usize,
    global_head_dim: usize,
    eps: f32,
    vocab: usize,
    vocab_per_layer_input: usize,
    kv_heads: usize,
    global_kv_heads: Option<usize>,
    kv_shared_layers: usize,
    per_layer_input_dims: usize,
    rope_traditional: bool,
    sliding_window: usize,
    k_eq_v: bool,
    softcap: Option<f32>,
    double_wide_mlp: bool,
    moe: Option<MoeArgs>,
    layer_types: Vec<LayerType>,
    tie: bool,
}

#[derive(Clone, Copy)]
struct MoeArgs {
    experts: usize,
    top_k: usize,
    intermediate: usize,
}

impl Args {
    fn read(c: &Config) -> Result<Self> {
        let usize_or = |key: &str, default: usize| -> Result<usize> { Ok(c.opt_usize(key)?.unwrap_or(default)) };
        let layers = usize_or("num_hidden_layers", 35)?;
        let head_dim = usize_or("head_dim", 256)?;
        // A missing, null or zero global_head_dim means the sliding layers' head_dim.
        let global_head_dim = match c.get("global_head_dim") {
            None => 512,
            Some(_) => c.opt_usize("global_head_dim")?.filter(|&d| d > 0).unwrap_or(head_dim),
        };
        let softcap = match c.opt_f64("final_logit_softcapping")? {
            None if c.is_null("final_logit_softcapping") => None,
            None => Some(30.0),
            Some(cap) if cap > 0.0 => Some(cap as f32),
            Some(cap) => return Err(c.error("final_logit_softcapping", format_args!("= {cap} must be positive"))),
        };
        let layer_types = match c.get("layer_types") {
            Some(Value::Array(types)) => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(LayerType::Sliding),
                    Some("full_attention") => Ok(LayerType::Full),
                    _ => Err(c.error(
                        "layer_types",
                        format_args!("holds {t}, which is not \"sliding_attention\" or \"full_attention\""),
                    )),
                })
                .collect::<Result<Vec<_>>>()?,
            Some(other) => return Err(c.error("layer_types", format_args!("= {other} is not a list"))),
            None => {
                // mlx-lm's default: (pattern - 1) sliding layers, then a full one, repeated.
                let pattern = usize_or("sliding_window_pattern", 5)?;
                if pattern == 0 {
                    return Err(c.error("sliding_window_pattern", "= 0 must be at least 1"));
                }
                (0..layers)
                    .map(|i| if (i + 1).is_multiple_of(pattern) { LayerType::Full } else { LayerType::Sliding })
                    .collect()
            }
        };
        if layer_types.len() != layers {
            return Err(c.error(
                "layer_types",
                format_args!("lists {} layers; num_hidden_layers is {layers}", layer_types.len()),
            ));
        }
        let moe = match c.bool_or("enable_moe_block", false)? {
            false => None,
            true => Some(MoeArgs {
                experts: c.usize("num_experts")?,
                top_k: c.usize("top_k_experts")?,
                intermediate: c.usize("moe_intermediate_size")?,
            }),
        };
        if let Some(m) = moe {
            if m.top_k == 0 || m.top_k > m.experts {
                let message = format_args!("= {} must be between 1 and num_experts = {}", m.top_k, m.experts);
                return Err(c.error("top_k_experts", message));
            }
        }
        let args = Args {
            hidden: usize_or("hidden_size", 1536)?,
            layers,
            intermediate: usize_or("intermediate_size", 6144)?,
            heads: usize_or("num_attention_heads", 8)?,
            head_dim,
            global_head_dim,
            eps: c.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            vocab: usize_or("vocab_size", 262144)?,
            vocab_per_layer_input: usize_or("vocab_size_per_layer_input", 262144)?,
            kv_heads: usize_or("num_key_value_heads", 1)?,
            global_kv_heads: c.opt_usize("num_global_key_value_heads")?,
            kv_shared_layers: usize_or("num_kv_shared_layers", 20)?,
            per_layer_input_dims: usize_or("hidden_size_per_layer_input", 256)?,
            rope_traditional: c.bool_or("rope_traditional", false)?,
            sliding_window: usize_or("sliding_window", 512)?,
            k_eq_v: c.bool_or("attention_k_eq_v", false)?,
            softcap,
            double_wide_mlp: c.bool_or("use_double_wide_mlp", true)?,
            moe,
            layer_types,
            tie: c.bool_or("tie_word_embeddings", true)?,
        };
        if args.kv_shared_layers >= args.layers {
            let message =
                format_args!("= {} leaves no layer to compute keys and values (of {layers})", args.kv_shared_layers);
            return Err(c.error("num_kv_shared_layers", message));
        }
        if args.sliding_window == 0 {
            return Err(c.error("sliding_window", "= 0 must be at least 1"));
        }
        for (field, kv) in
            [("num_key_value_heads", Some(args.kv_heads)), ("num_global_key_value_heads", args.global_kv_heads)]
        {
            if let Some(kv) = kv {
                if kv == 0 || !args.heads.is_multiple_of(kv) {
                    return Err(c.error(field, format_args!("= {kv} must divide num_attention_heads = {}", args.heads)));
                }
            }
        }
        Ok(args)
    }

    /// Layers `0..first_shared` compute keys and values (and own a cache).
    fn first_shared(&self) -> usize {
        self.layers - self.kv_shared_layers
    }
}

/// The key and value projections of a layer that computes them.
struct KeyValue {
    k_proj: Linear,
    /// `None` when values are the keys' projection (`attention_k_eq_v` on full layers).
    v_proj: Option<Linear>,
    k_norm: RmsNorm,
    v_norm: RmsNorm,
}

struct Attention {
    q_proj: Linear,
    kv: Option<KeyValue>,
    o_proj: Linear,
    q_norm: RmsNorm,
    rope: Rope,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn load(weights: &Weights, config: &Config, args: &Args, path: &str, i: usize) -> Result<Self> {
        let kind = args.layer_types[i];
        let head_dim = if kind == LayerType::Full { args.global_head_dim } else { args.head_dim };
        let k_eq_v = args.k_eq_v && kind == LayerType::Full;
        let kv_heads = if k_eq_v { args.global_kv_heads.unwrap_or(args.kv_heads) } else { args.kv_heads };
        let (q_out, kv_out) = (args.heads * head_dim, kv_heads * head_dim);
        let kv = if i < args.first_shared() {
            Some(KeyValue {
                k_proj: Linear::load(weights, &format!("{path}.k_proj"), args.hidden, kv_out, false)?,
                v_proj: match k_eq_v {
                    true => None,
                    false => Some(Linear::load(weights, &format!("{path}.v_proj"), args.hidden, kv_out, false)?),
                },
                k_norm: RmsNorm::load(weights, &format!("{path}.k_norm"), head_dim, args.eps)?,
                v_norm: RmsNorm::without_scale(head_dim, args.eps, weights.device())?,
            })
        } else {
            None
        };
        let rope_parameters = config.get("rope_parameters");
        let params = match rope_parameters {
            // mlx-lm's default when the field is absent.
            None => Some(default_rope_parameters(kind)),
            Some(p) => p.get(kind.key()).cloned(),
        };
        let field = format!("rope_parameters.{}", kind.key());
        Ok(Attention {
            q_proj: Linear::load(weights, &format!("{path}.q_proj"), args.hidden, q_out, false)?,
            kv,
            o_proj: Linear::load(weights, &format!("{path}.o_proj"), q_out, args.hidden, false)?,
            q_norm: RmsNorm::load(weights, &format!("{path}.q_norm"), head_dim, args.eps)?,
            rope: Rope::from_parameters(config, &field, params.as_ref(), head_dim, args.rope_traditional)?,
            heads: args.heads,
            kv_heads,
            head_dim,
        })
    }

    /// Attends the step's rows `x [T, hidden]`: the projections over every row, then each
    /// sequence over its own keys and values (`Kv::Own`: layer `layer`'s cache) or an earlier
    /// layer's (`Kv::Shared`: layer `source`'s, already extended by this pass).
    fn forward(&self, x: &Array, step: &mut StepBatch, layer: usize, source: usize) -> Result<Array> {
        let heads = |a: &Array, n: usize| a.reshape(&[a.dim(0), n, self.head_dim]);
        let out = match &self.kv {
            Some(p) if source == layer => {
                let (q, k, v) = match &p.v_proj {
                    Some(v_proj) => {
                        let [q, k, v] = Linear::forward_many([&self.q_proj, &p.k_proj, v_proj], x)?;
                        (q, k, v)
                    }
                    None => {
                        let [q, k] = Linear::forward_many([&self.q_proj, &p.k_proj], x)?;
                        (q, k.clone(), k)
                    }
                };
                step.each_with_decodes(
                    layer,
                    false,
                    [&q, &k, &v],
                    |[q, k, v], caches| {
                        // Several paged sequences' rows attended in place as one op.
                        let (q, k) = (heads(&q, self.heads)?, heads(&k, self.kv_heads)?);
                        let v = p.v_norm.forward(&heads(&v, self.kv_heads)?)?;
                        let norms = (Some(&self.q_norm), Some(&p.k_norm));
                        decode_together(&self.rope, norms, (&q, &k, &v), caches, (1.0, None))
                    },
                    |[q, k, v], caches| {
                        let cache = &mut caches[layer];
                        let offset = cache.offset();
                        let q = self.rope.forward(&self.q_norm.forward(&heads(&q, self.heads)?)?, offset)?;
                        let k = self.rope.forward(&p.k_norm.forward(&heads(&k, self.kv_heads)?)?, offset)?;
                        let v = p.v_norm.forward(&heads(&v, self.kv_heads)?)?;
                        cache.attend(&q, &k, &v, 1.0)
                    },
                )?
            }
            None if source != layer => {
                let q = self.q_proj.forward(x)?;
                // The queries sit where the source layer's new keys do.
                let rotated =
                    |q: &Array, offset: usize| self.rope.forward(&self.q_norm.forward(&heads(q, self.heads)?)?, offset);
                step.each_with_decodes(
                    source,
                    true,
                    [&q],
                    |[q], caches| {
                        // Several paged sequences' rows over the source layer's caches (each
                        // holding this step's positions already): one attention op.
                        let mut rows = Vec::new();
                        for (c, span) in caches.iter() {
                            let offset = c.offset().checked_sub(span.len()).ok_or_else(|| {
                                Error::Invalid("a shared paged cache without this step's positions".into())
                            })?;
                            rows.push(rotated(&q.slice_rows(span.start, span.end)?, offset)?);
                        }
                        attend_decodes(&caches, &concat_rows(&rows)?, 1.0, None)
                    },
                    |[q], caches| {
                        let cache = &caches[source];
                        let l = q.dim(0);
                        let offset = cache.offset().checked_sub(l).ok_or_else(|| {
                            Error::Invalid(format!("a shared cache of {} positions for {l} new ones", cache.offset()))
                        })?;
                        cache.attend_held(&rotated(&q, offset)?, 1.0)
                    },
                )?
            }
            _ => return Err(Error::Invalid("a Gemma 4 layer given the wrong kind of key/value source".into())),
        };
        self.o_proj.forward(&out)
    }
}

/// mlx-lm's `rope_parameters` when config.json has none.
fn default_rope_parameters(kind: LayerType) -> Value {
    match kind {
        LayerType::Full => serde_json::json!({
            "partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"
        }),
        LayerType::Sliding => serde_json::json!({
            "partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"
        }),
    }
}

/// The mixture of experts beside the dense MLP: a router (RMS norm with a learned scale, a
/// projection, top-k of the raw scores, softmax over those, times a per-expert scale) and
/// GELU-gated experts (mlx-lm's `SwitchGLU` with `GeGLU`).
struct Experts {
    router_norm: RmsNorm,
    router_proj: Linear,
    /// The experts, each one's routing weight times its `per_expert_scale`.
    experts: nuvec::Experts,
    top_k: usize,
}

impl Experts {
    fn load(weights: &Weights, path: &str, args: &Args, m: MoeArgs) -> Result<Self> {
        let hidden = args.hidden;
        // mlx-lm: rms_norm(x, scale * hidden^-0.5): the product is formed once here.
        let scale = weights.tensor(&format!("{path}.router.scale"), &[hidden])?.to_f32_vec()?;
        let root = (hidden as f64).powf(-0.5) as f32;
        let scaled: Vec<f32> = scale.iter().map(|s| s * root).collect();
        let router_norm = RmsNorm::from_weight(Array::from_slice_on(&scaled, &[hidden], weights.device())?, args.eps);
        let per_expert_scale =
            weights.tensor(&format!("{path}.router.per_expert_scale"), &[m.experts])?.to_f32_vec()?;
        let projection = |name: &str, rows, cols| {
            weights.experts(
                &format!("{path}.experts.switch_glu.{name}"),
                |e| format!("{path}.experts.{e}.{name}"),
                m.experts,
                rows,
                cols,
            )
        };
        let (gates, ups, downs) = if weights.has(&format!("{path}.experts.gate_up_proj")) {
            fused_experts(weights, &format!("{path}.experts"), m, hidden)?
        } else {
            (
                projection("gate_proj", m.intermediate, hidden)?,
                projection("up_proj", m.intermediate, hidden)?,
                projection("down_proj", hidden, m.intermediate)?,
            )
        };
        let experts = nuvec::Experts::new(gates, ups, downs, None, ExpertActivation::GeluApprox)?
            .with_output_scales(per_expert_scale)?;
        Ok(Experts {
            router_norm,
            router_proj: Linear::load(weights, &format!("{path}.router.proj"), hidden, m.experts, false)?,
            experts,
            top_k: m.top_k,
        })
    }

    /// Routes on `h [L, hidden]` (the residual stream) and runs the chosen experts on `x` (its
    /// normalized copy): the top k raw scores, a softmax over those, each times its expert's
    /// scale; routing and the weighted sum stay on the weights' device.
    fn forward(&self, h: &Array, x: &Array) -> Result<Array> {
        let scores = self.router_proj.forward(&self.router_norm.forward(h)?)?;
        let (ids, weights) = scores.moe_route(self.top_k, MoeRouting::TopKSoftmax)?;
        Ok(x.moe_experts(&self.experts, &ids, &weights)?)
    }
}

/// Hugging Face's expert layout, which mlx-lm's `sanitize` splits: `{path}.gate_up_proj
/// [experts, 2 * intermediate, hidden]` (gate rows first, then up) and `{path}.down_proj
/// [experts, hidden, intermediate]`, dense. Each expert's matrices are views into them.
fn fused_experts(weights: &Weights, path: &str, m: MoeArgs, hidden: usize) -> Result<FusedParts> {
    let tensor = |name: &str, shape: [usize; 3]| -> Result<Array> {
        let full = format!("{path}.{name}");
        let a = weights.raw(&full)?;
        if a.shape() != shape || !a.dtype().is_float() {
            return Err(Error::Weights {
                file: weights.files().first().map_or_else(String::new, |f| f.display().to_string()),
                message: format!("{full}: {} {:?}, expected a float tensor {shape:?}", a.dtype(), a.shape()),
            });
        }
        Ok(a)
    };
    let gate_up = tensor("gate_up_proj", [m.experts, 2 * m.intermediate, hidden])?;
    let down = tensor("down_proj", [m.experts, hidden, m.intermediate])?;
    let device = weights.device();
    let (mut gates, mut ups, mut downs) = (vec![], vec![], vec![]);
    for e in 0..m.experts {
        let halves = gate_up.index_first(e)?.reshape(&[2, m.intermediate, hidden])?;
        gates.push(Matrix::Dense(halves.index_first(0)?).to_device(device)?);
        ups.push(Matrix::Dense(halves.index_first(1)?).to_device(device)?);
        downs.push(Matrix::Dense(down.index_first(e)?).to_device(device)?);
    }
    Ok((gates, ups, downs))
}

/// Every expert's gate, up and down matrices.
type FusedParts = (Vec<Matrix>, Vec<Matrix>, Vec<Matrix>);

/// The MoE half of a layer's feed-forward and its norms.
struct MoeBlock {
    experts: Experts,
    pre_feedforward_layernorm_2: RmsNorm,
    post_feedforward_layernorm_1: RmsNorm,
    post_feedforward_layernorm_2: RmsNorm,
}

/// A layer's gate for its per-layer input.
struct PerLayerGate {
    per_layer_input_gate: Linear,
    per_layer_projection: Linear,
    post_per_layer_input_norm: RmsNorm,
}

struct DecoderLayer {
    self_attn: Attention,
    mlp: GeluMlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    moe: Option<MoeBlock>,
    per_layer: Option<PerLayerGate>,
    layer_scalar: f32,
}

impl DecoderLayer {
    fn load(weights: &Weights, config: &Config, args: &Args, prefix: &str, i: usize) -> Result<Self> {
        let p = format!("{prefix}layers.{i}");
        let norm = |name: &str, dims| RmsNorm::load(weights, &format!("{p}.{name}"), dims, args.eps);
        // mlx-lm: `layer_idx >= first_kv_shared > 0`.
        let first_shared = args.first_shared();
        let wide = args.double_wide_mlp && i >= first_shared && first_shared > 0;
        let intermediate = args.intermediate * if wide { 2 } else { 1 };
        let moe = match args.moe {
            None => None,
            Some(m) => Some(MoeBlock {
                experts: Experts::load(weights, &p, args, m)?,
                pre_feedforward_layernorm_2: norm("pre_feedforward_layernorm_2", args.hidden)?,
                post_feedforward_layernorm_1: norm("post_feedforward_layernorm_1", args.hidden)?,
                post_feedforward_layernorm_2: norm("post_feedforward_layernorm_2", args.hidden)?,
            }),
        };
        let per_layer = match args.per_layer_input_dims {
            0 => None,
            dims => Some(PerLayerGate {
                per_layer_input_gate: Linear::load(
                    weights,
                    &format!("{p}.per_layer_input_gate"),
                    args.hidden,
                    dims,
                    false,
                )?,
                per_layer_projection: Linear::load(
                    weights,
                    &format!("{p}.per_layer_projection"),
                    dims,
                    args.hidden,
                    false,
                )?,
                post_per_layer_input_norm: norm("post_per_layer_input_norm", args.hidden)?,
            }),
        };
        let layer_scalar = weights.tensor(&format!("{p}.layer_scalar"), &[1])?.to_f32_vec()?[0];
        Ok(DecoderLayer {
            self_attn: Attention::load(weights, config, args, &format!("{p}.self_attn"), i)?,
            mlp: GeluMlp::load(weights, &format!("{p}.mlp"), args.hidden, intermediate)?,
            input_layernorm: norm("input_layernorm", args.hidden)?,
            post_attention_layernorm: norm("post_attention_layernorm", args.hidden)?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm", args.hidden)?,
            post_feedforward_layernorm: norm("post_feedforward_layernorm", args.hidden)?,
            moe,
            per_layer,
            layer_scalar,
        })
    }

    fn forward(
        &self,
        x: &Array,
        step: &mut StepBatch,
        [layer, source]: [usize; 2],
        per_layer_input: Option<&Array>,
    ) -> Result<Array> {
        let attn = self.self_attn.forward(&self.input_layernorm.forward(x)?, step, layer, source)?;
        let h = x.add(&self.post_attention_layernorm.forward(&attn)?)?;
        let ff = match &self.moe {
            None => self.mlp.forward(&self.pre_feedforward_layernorm.forward(&h)?)?,
            Some(m) => {
                let dense = self.mlp.forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
                let dense = m.post_feedforward_layernorm_1.forward(&dense)?;
                let sparse = m.experts.forward(&h, &m.pre_feedforward_layernorm_2.forward(&h)?)?;
                dense.add(&m.post_feedforward_layernorm_2.forward(&sparse)?)?
            }
        };
        let mut h = h.add(&self.post_feedforward_layernorm.forward(&ff)?)?;
        if let (Some(g), Some(input)) = (&self.per_layer, per_layer_input) {
            let gate = g.per_layer_input_gate.forward(&h)?.gelu_mul(input)?;
            let gate = g.post_per_layer_input_norm.forward(&g.per_layer_projection.forward(&gate)?)?;
            h = h.add(&gate)?;
        }
        Ok(h.scale(self.layer_scalar)?)
    }
}

/// The per-layer inputs: a second embedding table and a projection of the embeddings, one small
/// vector per token and layer.
struct PerLayerInputs {
    embed_tokens_per_layer: Matrix,
    per_layer_model_projection: Linear,
    per_layer_projection_norm: RmsNorm,
    dims: usize,
    layers: usize,
    hidden: usize,
}

impl PerLayerInputs {
    /// `[layers]` arrays `[L, dims]` for `tokens`, whose scaled embeddings are `h [L, hidden]`.
    fn compute(&self, tokens: &[u32], h: &Array) -> Result<Vec<Array>> {
        let (l, n, d) = (tokens.len(), self.layers, self.dims);
        let table = self.embed_tokens_per_layer.embed(tokens)?.scale((d as f64).sqrt() as f32)?;
        let projected = self.per_layer_model_projection.forward(h)?.scale((self.hidden as f64).powf(-0.5) as f32)?;
        let projected = self.per_layer_projection_norm.forward(&projected.reshape(&[l * n, d])?)?;
        let mixed = projected.reshape(&[l, n * d])?.add(&table)?.scale(0.5f64.sqrt() as f32)?;
        let by_layer = mixed.reshape(&[l, n, d])?.transpose01()?;
        (0..n).map(|i| Ok(by_layer.slice_rows(i, i + 1)?.reshape(&[l, d])?)).collect()
    }
}

/// A Gemma 4 text model.
pub struct Gemma4 {
    embed_tokens: Matrix,
    embed_scale: f32,
    per_layer_inputs: Option<PerLayerInputs>,
    layers: Vec<DecoderLayer>,
    layer_types: Vec<LayerType>,
    /// For each layer, the layer whose cache it attends over (itself, or for a KV-shared layer the
    /// last earlier layer of its type that computes keys and values).
    kv_source: Vec<usize>,
    sliding_window: usize,
    norm: RmsNorm,
    lm_head: Option<Matrix>,
    softcap: Option<f32>,
    vocab: usize,
}

impl Gemma4 {
    /// Loads a `gemma4_text` checkpoint.
    pub fn load_text(config: &Config, weights: &Weights) -> Result<Self> {
        Self::load_with(config, weights, "model.", "lm_head")
    }

    /// Loads the language model of a multimodal `gemma4` checkpoint: `text_config` (with the
    /// top-level `vocab_size`, mlx-lm's defaults for heads) and the tensors under
    /// `language_model.model.*` (as mlx-lm saves them) or `model.language_model.*` (as Hugging
    /// Face publishes them). Vision and audio tensors are never read.
    pub fn load_multimodal(config: &Config, weights: &Weights) -> Result<Self> {
        let mut text = match config.get("text_config") {
            None => serde_json::Map::new(),
            Some(Value::Object(t)) => t.clone(),
            Some(other) => return Err(config.error("text_config", format_args!("= {other} is not an object"))),
        };
        // mlx-lm's gemma4.ModelArgs: the top-level vocab_size (default 262144) wins, and heads
        // default to 8 query over 1 key/value.
        let vocab = config.opt_usize("vocab_size")?.unwrap_or(262144);
        text.insert("vocab_size".into(), vocab.into());
        text.entry("num_attention_heads").or_insert(8.into());
        text.entry("num_key_value_heads").or_insert(1.into());
        let text = config.sub_config("text_config", text);
        let (prefix, head) = if weights.has("model.language_model.embed_tokens.weight") {
            ("model.language_model.", "lm_head")
        } else {
            ("language_model.model.", "language_model.lm_head")
        };
        Self::load_with(&text, weights, prefix, head)
    }

    fn load_with(config: &Config, weights: &Weights, prefix: &str, head: &str) -> Result<Self> {
        let args = Args::read(config)?;
        let layers = (0..args.layers)
            .map(|i| DecoderLayer::load(weights, config, &args, prefix, i))
            .collect::<Result<Vec<_>>>()?;
        // mlx-lm's `previous_kvs`: a shared layer reads the last earlier computing layer of its type.
        let first_shared = args.first_shared();
        let kv_source = (0..args.layers)
            .map(|i| {
                if i < first_shared {
                    return Ok(i);
                }
                let kind = args.layer_types[i];
                (0..first_shared).rev().find(|&j| args.layer_types[j] == kind).ok_or_else(|| {
                    config.error(
                        "num_kv_shared_layers",
                        format_args!(
                            "= {} shares layer {i}'s keys and values but no earlier layer is {}",
                            args.kv_shared_layers,
                            kind.key()
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let per_layer_inputs = match args.per_layer_input_dims {
            0 => None,
            dims => Some(PerLayerInputs {
                embed_tokens_per_layer: weights.matrix(
                    &format!("{prefix}embed_tokens_per_layer"),
                    args.vocab_per_layer_input,
                    args.layers * dims,
                )?,
                per_layer_model_projection: Linear::load(
                    weights,
                    &format!("{prefix}per_layer_model_projection"),
                    args.hidden,
                    args.layers * dims,
                    false,
                )?,
                per_layer_projection_norm: RmsNorm::load(
                    weights,
                    &format!("{prefix}per_layer_projection_norm"),
                    dims,
                    args.eps,
                )?,
                dims,
                layers: args.layers,
                hidden: args.hidden,
            }),
        };
        Ok(Gemma4 {
            embed_tokens: weights.matrix(&format!("{prefix}embed_tokens"), args.vocab, args.hidden)?,
            embed_scale: (args.hidden as f64).sqrt() as f32,
            per_layer_inputs,
            layers,
            layer_types: args.layer_types.clone(),
            kv_source,
            sliding_window: args.sliding_window,
            norm: RmsNorm::load(weights, &format!("{prefix}norm"), args.hidden, args.eps)?,
            lm_head: if args.tie { None } else { Some(weights.matrix(head, args.vocab, args.hidden)?) },
            softcap: args.softcap,
            vocab: args.vocab,
        })
    }

    /// Layers that compute keys and values (the others reuse theirs).
    fn caching_layers(&self) -> usize {
        self.kv_source.iter().enumerate().filter(|&(i, &s)| i == s).count()
    }
}

impl Architecture for Gemma4 {
    fn hidden(&self, step: &mut StepBatch) -> Result<Array> {
        step.check_layers(self.caching_layers(), "layers that keep keys and values (KV-shared layers have none)")?;
        // The per-layer inputs look the ids up on the host.
        step.resolve_fed()?;
        let mut h = self.embed_tokens.embed(step.tokens())?.scale(self.embed_scale)?;
        let per_layer = self.per_layer_inputs.as_ref().map(|p| p.compute(step.tokens(), &h)).transpose()?;
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h, step, [i, self.kv_source[i]], per_layer.as_ref().map(|p| &p[i]))?;
        }
        self.norm.forward(&h)
    }

    fn logits(&self, hidden: &Array) -> Result<Array> {
        let logits = hidden.linear(self.lm_head.as_ref().unwrap_or(&self.embed_tokens))?;
        Ok(match self.softcap {
            Some(cap) => logits.softcap(cap)?,
            None => logits,
        })
    }

    /// Layers that keep a cache: KV-shared layers have none.
    fn num_layers(&self) -> usize {
        self.caching_layers()
    }

    fn own_cache(&self, kv_dtype: nuvec::DType) -> Option<Vec<LayerCache>> {
        // mlx-lm's make_cache: sliding layers rotate over the window (nothing pinned), full
        // layers keep everything.
        let caches = (0..self.caching_layers())
            .map(|i| match self.layer_types[i] {
                LayerType::Sliding => LayerCache::Rotating(
                    RotatingKvCache::with_context(self.sliding_window, 0, kv_dtype)
                        .expect("a window of at least 1 was checked at load"),
                ),
                LayerType::Full => LayerCache::Plain(KvCache::with_dtype(kv_dtype)),
            })
            .collect();
        Some(caches)
    }

    fn vocab_size(&self) -> Option<usize> {
        Some(self.vocab)
    }
}
