//! llama.cpp's `gemma4` files as mlx-lm's `gemma4_text` checkpoints. What the converter
//! (conversion/gemma.py, `Gemma4Model`) writes differently is read back here:
//! - per-layer metadata: `attention.sliding_window_pattern` (true: sliding) gives `layer_types`;
//!   `feed_forward_length` and `attention.head_count_kv` may be per-layer arrays (double-wide MLPs
//!   in the KV-shared layers; fewer key/value heads on full layers, whose values are then their
//!   keys: no `attn_v`); `key_length` is the full layers' head width, `key_length_swa` the
//!   sliding layers';
//! - the full layers' proportional rope is `rope_freqs.weight`: 1.0 for each rotated pair, 1e30
//!   (a frequency of zero) for the others;
//! - renamed tensors: `layer_output_scale` (mlx-lm's `layer_scalar`), `ffn_gate_inp.scale` (the
//!   router's scale), `ffn_down_exps.scale` (its per-expert scale), and the experts' gate and up
//!   rows in one `ffn_gate_up_exps` (the gate's first), split here;
//! - `layer_output_scale` and `ffn_down_exps.scale` are optional in llama.cpp (ones).
//!
//! Norms and embeddings are stored as mlx-lm stores them (no `1 + w`, no embedding scale).
//! KV-shared layers attend over the last earlier layer of their type (mlx-lm's and Hugging Face's
//! rule; llama.cpp takes layer `first_shared - 2` for sliding and `- 1` for full layers, the same
//! layers in every published Gemma 4).

use std::collections::HashMap;

use nuvec::io::{GgufFile, GgufValue};
use nuvec::{Array, DType, Element, QuantSpec};
use serde_json::{json, Map, Value};

use crate::gguf::{bad_meta as bad, common_global, common_module, expert_counts, meta, meta_positive, meta_u64};
use crate::gguf_rope::ROPE_FREQS;
use crate::{Error, Result};

const ARCH: &str = "gemma4";

fn key(k: &str) -> String {
    format!("{ARCH}.{k}")
}

fn unsupported(file: &GgufFile, what: String) -> Error {
    Error::Unsupported(format!("{}: {what}", file.path().display()))
}

fn has_tensor(file: &GgufFile, name: &str) -> bool {
    file.tensors().iter().any(|t| t.name == name)
}

/// A value given once for every layer or as one entry per layer.
fn per_layer(file: &GgufFile, k: &str, layers: usize) -> Result<Option<Vec<u64>>> {
    let Some(value) = file.get(&key(k)) else {
        return Ok(None);
    };
    if let Some(v) = value.as_u64() {
        return Ok(Some(vec![v; layers]));
    }
    let entries = value.as_array().ok_or_else(|| bad(file, &key(k), "is neither an integer nor an array"))?;
    let values: Option<Vec<u64>> = entries.iter().map(GgufValue::as_u64).collect();
    match values {
        Some(v) if v.len() == layers => Ok(Some(v)),
        _ => Err(bad(file, &key(k), &format!("must hold one non-negative integer per layer ({layers})"))),
    }
}

/// The config.json of the `gemma4_text` checkpoint a `gemma4` file holds.
pub(crate) fn config(file: &GgufFile) -> Result<Value> {
    let layers = meta_u64(file, &key("block_count"))? as usize;
    if layers == 0 {
        return Err(bad(file, &key("block_count"), "= 0: a model needs at least one layer"));
    }
    let hidden = meta_u64(file, &key("embedding_length"))?;
    let heads = meta_u64(file, &key("attention.head_count"))?;
    let pattern_key = key("attention.sliding_window_pattern");
    let sliding: Vec<bool> = meta(file, &pattern_key)?
        .as_array()
        .and_then(|a| a.iter().map(GgufValue::as_bool).collect::<Option<Vec<_>>>())
        .filter(|flags| flags.len() == layers)
        .ok_or_else(|| bad(file, &pattern_key, &format!("must be {layers} booleans, one per layer")))?;
    let shared = file.get(&key("attention.shared_kv_layers")).and_then(GgufValue::as_u64).unwrap_or(0) as usize;
    if shared >= layers {
        let what = format!("= {shared} leaves none of the {layers} layers to compute keys and values");
        return Err(bad(file, &key("attention.shared_kv_layers"), &what));
    }
    let first_shared = layers - shared;

    // One width, or twice it in every KV-shared layer (use_double_wide_mlp).
    let ffn = per_layer(file, "feed_forward_length", layers)?
        .ok_or_else(|| bad(file, &key("feed_forward_length"), "is missing"))?;
    let width = ffn[0];
    let double_wide = shared > 0 && ffn[first_shared..].iter().all(|&f| f == 2 * width) && width > 0;
    let widths_fit = ffn[..first_shared].iter().all(|&f| f == width)
        && (double_wide || ffn[first_shared..].iter().all(|&f| f == width));
    if !widths_fit {
        return Err(unsupported(
            file,
            format!(
                "{} = {ffn:?}: per-layer feed-forward widths other than one width (twice it in the KV-shared layers) \
                 are not mapped",
                key("feed_forward_length")
            ),
        ));
    }

    // Values are the keys on full layers that have no attn_v (attention_k_eq_v).
    let computing_full: Vec<usize> = (0..first_shared).filter(|&i| !sliding[i]).collect();
    let without_v = |i: &&usize| !has_tensor(file, &format!("blk.{i}.attn_v.weight"));
    let k_eq_v = match computing_full.iter().filter(without_v).count() {
        0 => false,
        n if n == computing_full.len() => true,
        _ => return Err(unsupported(file, "some full-attention layers have attn_v and some do not".into())),
    };
    if let Some(i) = (0..first_shared).find(|&i| sliding[i] && !has_tensor(file, &format!("blk.{i}.attn_v.weight"))) {
        return Err(unsupported(file, format!("sliding layer {i} has no blk.{i}.attn_v.weight")));
    }
    let kv = per_layer(file, "attention.head_count_kv", layers)?.unwrap_or_else(|| vec![heads; layers]);
    let of_kind = |want: bool| -> Result<Option<u64>> {
        let mut counts = (0..layers).filter(|&i| sliding[i] == want).map(|i| kv[i]);
        let first = counts.next();
        match first {
            Some(n) if counts.all(|c| c == n) => Ok(Some(n)),
            None => Ok(None),
            Some(_) => Err(unsupported(
                file,
                format!(
                    "{} = {kv:?} differs between layers of one kind; this is not mapped",
                    key("attention.head_count_kv")
                ),
            )),
        }
    };
    let kv_full = of_kind(false)?;
    let kv_sliding = of_kind(true)?.or(kv_full).unwrap_or(heads);
    let kv_full = kv_full.unwrap_or(kv_sliding);
    if kv_full != kv_sliding && !k_eq_v {
        return Err(unsupported(
            file,
            format!(
                "full layers with {kv_full} key/value heads beside sliding layers with {kv_sliding}, with separate \
                 value projections: mlx-lm's gemma4_text gives full layers their own count only when their values \
                 are their keys (attention_k_eq_v)"
            ),
        ));
    }

    let head_dim = meta_u64(file, &key("attention.key_length_swa"))?;
    let global_head_dim = meta_u64(file, &key("attention.key_length"))?;
    for (k, want) in [("attention.value_length_swa", head_dim), ("attention.value_length", global_head_dim)] {
        if let Some(v) = file.get(&key(k)).and_then(GgufValue::as_u64).filter(|&v| v != want) {
            return Err(unsupported(file, format!("{} = {v} differs from the key width {want}", key(k))));
        }
    }
    let eps_key = key("attention.layer_norm_rms_epsilon");
    meta(file, &eps_key)?;
    let eps = meta_positive(file, &eps_key)?.ok_or_else(|| bad(file, &eps_key, "is not a number"))?;
    let window = meta_u64(file, &key("attention.sliding_window"))?;
    if window == 0 {
        return Err(bad(file, &key("attention.sliding_window"), "= 0 must be at least 1"));
    }
    let softcap = match file.get(&key("final_logit_softcapping")).and_then(GgufValue::as_f64) {
        None => Value::Null,
        Some(0.0) => Value::Null,
        Some(c) if c.is_finite() && c > 0.0 => json!(c),
        Some(c) => return Err(bad(file, &key("final_logit_softcapping"), &format!("= {c} must be positive"))),
    };
    let vocab_of = |name: &str| file.tensors().iter().find(|t| t.name == name).and_then(|t| t.dims.get(1).copied());
    let vocab = vocab_of("token_embd.weight").ok_or_else(|| {
        Error::config(file.path().display().to_string(), "token_embd.weight is missing or not a matrix")
    })?;
    let per_layer_input = file.get(&key("embedding_length_per_layer_input")).and_then(GgufValue::as_u64).unwrap_or(0);

    let mut config = Map::new();
    config.insert("model_type".into(), "gemma4_text".into());
    config.insert("hidden_size".into(), hidden.into());
    config.insert("num_hidden_layers".into(), layers.into());
    config.insert("intermediate_size".into(), width.into());
    config.insert("use_double_wide_mlp".into(), double_wide.into());
    config.insert("num_attention_heads".into(), heads.into());
    config.insert("num_key_value_heads".into(), kv_sliding.into());
    config.insert("attention_k_eq_v".into(), k_eq_v.into());
    if k_eq_v {
        config.insert("num_global_key_value_heads".into(), kv_full.into());
    }
    config.insert("head_dim".into(), head_dim.into());
    config.insert("global_head_dim".into(), global_head_dim.into());
    config.insert("rms_norm_eps".into(), json!(eps as f32));
    config.insert("vocab_size".into(), vocab.into());
    config.insert("num_kv_shared_layers".into(), shared.into());
    config.insert("hidden_size_per_layer_input".into(), per_layer_input.into());
    if per_layer_input > 0 {
        let rows = vocab_of("per_layer_token_embd.weight").ok_or_else(|| {
            Error::config(
                file.path().display().to_string(),
                format!(
                    "{} = {per_layer_input} but per_layer_token_embd.weight is missing",
                    key("embedding_length_per_layer_input")
                ),
            )
        })?;
        config.insert("vocab_size_per_layer_input".into(), rows.into());
    }
    config.insert("sliding_window".into(), window.into());
    let types: Vec<&str> = sliding.iter().map(|&s| if s { "sliding_attention" } else { "full_attention" }).collect();
    config.insert("layer_types".into(), json!(types));
    config.insert("rope_parameters".into(), rope_parameters(file, head_dim, global_head_dim)?);
    config.insert("final_logit_softcapping".into(), softcap);
    config.insert("tie_word_embeddings".into(), (!has_tensor(file, "output.weight")).into());
    if let Some(n) = file.get(&key("context_length")).and_then(GgufValue::as_u64) {
        config.insert("max_position_embeddings".into(), n.into());
    }
    let routed: Vec<bool> = (0..layers).map(|i| has_tensor(file, &format!("blk.{i}.ffn_gate_inp.weight"))).collect();
    let moe = file.get(&key("expert_count")).and_then(GgufValue::as_u64).unwrap_or(0) > 0;
    config.insert("enable_moe_block".into(), moe.into());
    if moe {
        let (experts, used) = expert_counts(file, ARCH)?;
        config.insert("num_experts".into(), experts.into());
        config.insert("top_k_experts".into(), used.into());
        config.insert("moe_intermediate_size".into(), meta_u64(file, &key("expert_feed_forward_length"))?.into());
    }
    if let Some(i) = routed.iter().position(|&r| r != moe) {
        return Err(unsupported(
            file,
            format!(
                "layer {i} {} experts while {} says {}: a mixture of experts in some layers only is not mapped",
                if routed[i] { "has" } else { "has no" },
                key("expert_count"),
                if moe { "there are" } else { "there are none" }
            ),
        ));
    }
    Ok(Value::Object(config))
}

/// Each layer type's rope as mlx-lm's `rope_parameters`: sliding layers rotate their whole head
/// at `rope.freq_base_swa`; full layers at `rope.freq_base`, through `rope_freqs` when the file
/// has it (the leading 1.0 entries rotate, the 1e30 ones pass through: the proportional rope).
fn rope_parameters(file: &GgufFile, head_dim: u64, global_head_dim: u64) -> Result<Value> {
    let theta = |k: &str| -> Result<f64> { Ok(meta_positive(file, &key(k))?.unwrap_or(10000.0)) };
    let dims = file.get(&key("rope.dimension_count")).and_then(GgufValue::as_u64).unwrap_or(global_head_dim);
    let dims_swa = file.get(&key("rope.dimension_count_swa")).and_then(GgufValue::as_u64).unwrap_or(dims);
    for (k, got, want) in
        [("rope.dimension_count", dims, global_head_dim), ("rope.dimension_count_swa", dims_swa, head_dim)]
    {
        if got != want {
            return Err(unsupported(
                file,
                format!(
                    "{} = {got}: a rope over part of a {want}-wide head other than through {ROPE_FREQS} is not mapped",
                    key(k)
                ),
            ));
        }
    }
    let full = match file.tensors().iter().find(|t| t.name == ROPE_FREQS) {
        None => json!({"rope_type": "default", "rope_theta": theta("rope.freq_base")?}),
        Some(tensor) => {
            let factors = file.float_array(tensor)?.to_vec::<f32>()?;
            let rotated = factors.iter().take_while(|&&f| f == 1.0).count();
            let rest_still = factors[rotated..].iter().all(|&f| f >= 1e20);
            if factors.len() as u64 != global_head_dim / 2 || !rest_still {
                return Err(unsupported(
                    file,
                    format!(
                        "{ROPE_FREQS} is not 1.0 for the rotated pairs and 1e30 for the others over {} pairs; other \
                         factors are not mapped",
                        global_head_dim / 2
                    ),
                ));
            }
            json!({
                "rope_type": "proportional",
                "partial_rotary_factor": (2 * rotated) as f64 / global_head_dim as f64,
                "rope_theta": theta("rope.freq_base")?,
            })
        }
    };
    let sliding = json!({"rope_type": "default", "rope_theta": theta("rope.freq_base_swa")?});
    Ok(json!({"full_attention": full, "sliding_attention": sliding}))
}

/// The checkpoint name of a `gemma4` tensor (`blk.3.attn_q.weight` ->
/// `model.layers.3.self_attn.q_proj.weight`); `None` for what the model does not use.
pub(crate) fn checkpoint_name(name: &str) -> Option<String> {
    let global = match name {
        "per_layer_token_embd.weight" => Some("model.embed_tokens_per_layer.weight"),
        "per_layer_model_proj.weight" => Some("model.per_layer_model_projection.weight"),
        "per_layer_proj_norm.weight" => Some("model.per_layer_projection_norm.weight"),
        other => common_global(other),
    };
    if let Some(g) = global {
        return Some(g.to_string());
    }
    let (layer, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    let mapped = match rest {
        "layer_output_scale.weight" => "layer_scalar",
        "ffn_gate_inp.weight" => "router.proj.weight",
        "ffn_gate_inp.scale" => "router.scale",
        "ffn_down_exps.scale" => "router.per_expert_scale",
        "ffn_gate_up_exps.weight" => GATE_UP,
        "ffn_gate_exps.weight" => "experts.switch_glu.gate_proj.weight",
        "ffn_up_exps.weight" => "experts.switch_glu.up_proj.weight",
        "ffn_down_exps.weight" => "experts.switch_glu.down_proj.weight",
        _ => {
            let (module, suffix) = rest.rsplit_once('.')?;
            let module = match module {
                "post_attention_norm" => "post_attention_layernorm",
                "ffn_norm" => "pre_feedforward_layernorm",
                "post_ffw_norm" => "post_feedforward_layernorm",
                "inp_gate" => "per_layer_input_gate",
                "proj" => "per_layer_projection",
                "post_norm" => "post_per_layer_input_norm",
                "pre_ffw_norm_2" => "pre_feedforward_layernorm_2",
                "post_ffw_norm_1" => "post_feedforward_layernorm_1",
                "post_ffw_norm_2" => "post_feedforward_layernorm_2",
                other => common_module(other)?,
            };
            return Some(format!("model.layers.{layer}.{module}.{suffix}"));
        }
    };
    Some(format!("model.layers.{layer}.{mapped}"))
}

/// Where the fused gate and up rows are kept until [`finish`] splits them.
const GATE_UP: &str = "experts.switch_glu.gate_up_proj.weight";

/// The converted tensors as mlx-lm's gemma4_text names them: each layer's fused experts split
/// into gate and up (`[experts, 2 * width, cols]`, the gate's rows first, for the weight, scales
/// and biases alike), and the optional scalars llama.cpp takes as ones when a file lacks them.
pub(crate) fn finish(
    arrays: &mut HashMap<String, Array>,
    specs: &mut HashMap<String, QuantSpec>,
    config: &crate::config::Config,
) -> Result<()> {
    let fused_base = GATE_UP.trim_end_matches(".weight");
    let fused: Vec<String> = arrays.keys().filter(|k| k.contains(fused_base)).cloned().collect();
    for name in fused {
        let a = arrays.remove(&name).expect("listed above");
        if a.shape().len() != 3 || !a.dim(1).is_multiple_of(2) {
            return Err(Error::Invalid(format!("{name}: fused gate and up rows of shape {:?}", a.shape())));
        }
        let [gate, up] = halves(&a)?;
        arrays.insert(name.replace("gate_up_proj", "gate_proj"), gate);
        arrays.insert(name.replace("gate_up_proj", "up_proj"), up);
    }
    let fused_specs: Vec<String> = specs.keys().filter(|k| k.ends_with(fused_base)).cloned().collect();
    for base in fused_specs {
        let spec = specs.remove(&base).expect("listed above");
        for part in ["gate_proj", "up_proj"] {
            specs.insert(base.replace("gate_up_proj", part), spec);
        }
    }
    let experts = match config.bool_or("enable_moe_block", false)? {
        true => Some(config.usize("num_experts")?),
        false => None,
    };
    for i in 0..config.usize("num_hidden_layers")? {
        let mut ones = vec![(format!("model.layers.{i}.layer_scalar"), 1)];
        ones.extend(experts.map(|e| (format!("model.layers.{i}.router.per_expert_scale"), e)));
        for (name, n) in ones {
            if let std::collections::hash_map::Entry::Vacant(slot) = arrays.entry(name) {
                slot.insert(Array::from_slice_on(&vec![1f32; n], &[n], nuvec::Device::Cpu)?);
            }
        }
    }
    Ok(())
}

/// `a [experts, 2 * rows, ...]` as its first and second halves along axis 1.
fn halves(a: &Array) -> Result<[Array; 2]> {
    fn typed<T: Element>(a: &Array) -> Result<[Array; 2]> {
        let (experts, rows) = (a.dim(0), a.dim(1) / 2);
        let width: usize = a.shape()[2..].iter().product();
        let values = a.to_vec::<T>()?;
        let mut shape = a.shape().to_vec();
        shape[1] = rows;
        let part = |at: usize| -> Result<Array> {
            let mut out = Vec::with_capacity(values.len() / 2);
            for e in 0..experts {
                let start = (e * 2 * rows + at) * width;
                out.extend_from_slice(&values[start..start + rows * width]);
            }
            Ok(Array::from_slice(&out, &shape)?)
        };
        Ok([part(0)?, part(rows)?])
    }
    match a.dtype() {
        DType::F32 => typed::<f32>(a),
        DType::F16 => typed::<half::f16>(a),
        DType::BF16 => typed::<half::bf16>(a),
        DType::U32 => typed::<u32>(a),
        DType::U8 => typed::<u8>(a),
        other => Err(Error::Invalid(format!("fused expert rows of a {other} array are not supported"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_tensor_names() {
        let cases = [
            ("blk.2.attn_q.weight", "model.layers.2.self_attn.q_proj.weight"),
            ("blk.2.ffn_norm.weight", "model.layers.2.pre_feedforward_layernorm.weight"),
            ("blk.0.layer_output_scale.weight", "model.layers.0.layer_scalar"),
            ("blk.1.ffn_gate_inp.scale", "model.layers.1.router.scale"),
            ("blk.1.ffn_down_exps.scale", "model.layers.1.router.per_expert_scale"),
            ("blk.1.ffn_down_exps.weight", "model.layers.1.experts.switch_glu.down_proj.weight"),
            ("blk.4.inp_gate.weight", "model.layers.4.per_layer_input_gate.weight"),
            ("per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight"),
        ];
        for (gguf, checkpoint) in cases {
            assert_eq!(checkpoint_name(gguf).as_deref(), Some(checkpoint), "{gguf}");
        }
        assert_eq!(checkpoint_name("rope_freqs.weight"), None);
        assert_eq!(checkpoint_name("blk.0.ssm_a"), None);
    }

    #[test]
    fn fused_rows_split_per_expert() {
        // Two experts of 2 gate rows then 2 up rows, 3 columns each.
        let values: Vec<u32> = (0..24).collect();
        let a = Array::from_slice(&values, &[2, 4, 3]).unwrap();
        let [gate, up] = halves(&a).unwrap();
        assert_eq!(gate.shape(), &[2, 2, 3]);
        assert_eq!(gate.to_vec::<u32>().unwrap(), [0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 16, 17]);
        assert_eq!(up.to_vec::<u32>().unwrap(), [6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 22, 23]);
    }
}
