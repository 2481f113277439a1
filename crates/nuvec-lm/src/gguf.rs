//! GGUF checkpoints: the config, weights and tokenizer a GGUF file carries, mapped onto the
//! names and layouts an MLX checkpoint uses so the same model files load them.

use std::collections::HashMap;
use std::path::Path;

use nuvec::io::{gguf_matrix, GgmlType, GgufFile, GgufTensor, GgufValue};
use nuvec::{Array, DType, Matrix, QuantSpec};
use serde_json::{json, Map, Value};

use crate::config::Config;
use crate::gguf_gemma4;
use crate::gguf_qwen35::{self, ValueHeads};
use crate::gguf_rope;
use crate::gguf_tokenizer;
use crate::models::Model;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;
use crate::{Error, Result};

/// GGUF architectures nuvec maps, and the model_type they load as.
const ARCHITECTURES: &[(&str, &str)] = &[
    ("llama", "llama"),
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
    ("qwen3moe", "qwen3_moe"),
    ("gpt-oss", "gpt_oss"),
    ("qwen35", "qwen3_5"),
    ("qwen35moe", "qwen3_5_moe"),
    ("gemma4", "gemma4_text"),
];

/// Loads a model and its tokenizer from one GGUF file.
pub fn load_gguf(path: &Path) -> Result<(Model, Tokenizer)> {
    load_gguf_on(path, nuvec::Device::Cpu)
}

/// [`load_gguf`] with the weights on `device`.
pub fn load_gguf_on(path: &Path, device: nuvec::Device) -> Result<(Model, Tokenizer)> {
    load_gguf_as(path, device, false)
}

/// [`load_gguf_on`], with the file's multi-token-prediction block when `mtp` (Qwen3.5's
/// `blk.N.nextn.*` past the decoder, [`crate::LoadOptions::mtp`]).
pub(crate) fn load_gguf_as(path: &Path, device: nuvec::Device, mtp: bool) -> Result<(Model, Tokenizer)> {
    let file = GgufFile::open(path)?;
    let label = path.display().to_string();
    let arch = meta_str(&file, "general.architecture")?;
    let Some(&(_, model_type)) = ARCHITECTURES.iter().find(|(a, _)| *a == arch) else {
        return Err(Error::Unsupported(format!(
            "{label}: GGUF architecture {arch:?} is not mapped (llama, mistral, qwen2, qwen3, qwen3moe, gpt-oss, \
             qwen35, qwen35moe, gemma4 are)"
        )));
    };
    let config = Config::from_json(&label, &config_json(&file, arch, model_type)?.to_string())?;
    // The tokenizer first: building it from the vocabulary takes transient memory, handed back
    // before the weights are converted, so the two peaks do not stack.
    let tokenizer = gguf_tokenizer::tokenizer(&file)?;
    nuvec::backends::cpu::release_free_memory();
    let weights = weights(&file, &config, arch, mtp)?.on_device(device);
    let mut model = Model::from_config_with(&config, &weights, mtp)?;
    drop(weights);
    model.set_eos_token_ids(tokenizer.eos_token_ids().to_vec());
    model.set_newline_token_ids(tokenizer.encode("\n", false)?);
    nuvec::backends::cpu::release_free_memory();
    Ok((model, tokenizer))
}

pub(crate) fn meta<'a>(file: &'a GgufFile, key: &str) -> Result<&'a GgufValue> {
    file.get(key)
        .ok_or_else(|| Error::config(file.path().display().to_string(), format!("GGUF metadata {key} is missing")))
}

pub(crate) fn meta_str<'a>(file: &'a GgufFile, key: &str) -> Result<&'a str> {
    meta(file, key)?
        .as_str()
        .ok_or_else(|| Error::config(file.path().display().to_string(), format!("GGUF metadata {key} is not a string")))
}

pub(crate) fn meta_u64(file: &GgufFile, key: &str) -> Result<u64> {
    meta(file, key)?.as_u64().ok_or_else(|| {
        Error::config(file.path().display().to_string(), format!("GGUF metadata {key} is not an integer"))
    })
}

/// A number that must be positive where the file has it (a rope base, an epsilon).
pub(crate) fn meta_positive(file: &GgufFile, key: &str) -> Result<Option<f64>> {
    match file.get(key).and_then(GgufValue::as_f64) {
        None => Ok(None),
        Some(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
        Some(v) => Err(bad_meta(file, key, &format!("= {v} must be a positive number"))),
    }
}

/// A metadata value no model can run with (JSON cannot even hold a NaN: it would turn into a
/// missing field).
pub(crate) fn bad_meta(file: &GgufFile, key: &str, what: &str) -> Error {
    Error::config(file.path().display().to_string(), format!("GGUF metadata {key} {what}; fix or re-convert the file"))
}

/// The config.json an MLX checkpoint of this model would have.
fn config_json(file: &GgufFile, arch: &str, model_type: &str) -> Result<Value> {
    if arch == "gemma4" {
        return gguf_gemma4::config(file);
    }
    let key = |k: &str| format!("{arch}.{k}");
    let heads = meta_u64(file, &key("attention.head_count"))?;
    let hidden = meta_u64(file, &key("embedding_length"))?;
    let vocab = match file.get(&key("vocab_size")).and_then(GgufValue::as_u64) {
        Some(v) => v,
        None => meta(file, "tokenizer.ggml.tokens")?.as_array().map_or(0, |t| t.len() as u64),
    };
    let rope_freqs = file.tensors().iter().find(|t| t.name == gguf_rope::ROPE_FREQS);
    if rope_freqs.is_some() && arch != "llama" {
        return Err(Error::Unsupported(format!(
            "{}: per-pair rope factors ({}) in a {arch} file are not mapped (Llama 3's are)",
            file.path().display(),
            gguf_rope::ROPE_FREQS
        )));
    }
    let mut config = Map::new();
    config.insert("model_type".into(), model_type.into());
    config.insert("hidden_size".into(), hidden.into());
    let layers = meta_u64(file, &key("block_count"))?;
    if layers == 0 {
        return Err(bad_meta(file, &key("block_count"), "= 0: a model needs at least one layer"));
    }
    config.insert("num_hidden_layers".into(), layers.into());
    if model_type == "qwen3_moe" || model_type == "gpt_oss" {
        moe_config(file, arch, model_type, &mut config)?;
    } else if !gguf_qwen35::is_hybrid(arch) {
        config.insert("intermediate_size".into(), meta_u64(file, &key("feed_forward_length"))?.into());
    }
    config.insert("num_attention_heads".into(), heads.into());
    config.insert(
        "num_key_value_heads".into(),
        file.get(&key("attention.head_count_kv")).and_then(GgufValue::as_u64).unwrap_or(heads).into(),
    );
    let head_dim = file.get(&key("attention.key_length")).and_then(GgufValue::as_u64).unwrap_or(hidden / heads.max(1));
    config.insert("head_dim".into(), head_dim.into());
    let eps_key = key("attention.layer_norm_rms_epsilon");
    let eps = meta(file, &eps_key)?.as_f64().unwrap_or(1e-5);
    if !(eps.is_finite() && eps > 0.0) {
        return Err(bad_meta(file, &eps_key, &format!("= {eps} must be a positive number")));
    }
    config.insert("rms_norm_eps".into(), json!(eps as f32));
    config.insert("vocab_size".into(), vocab.into());
    if let Some(theta) = meta_positive(file, &key("rope.freq_base"))? {
        config.insert("rope_theta".into(), json!(theta as f32));
    }
    if let Some(n) = file.get(&key("context_length")).and_then(GgufValue::as_u64) {
        config.insert("max_position_embeddings".into(), n.into());
    }
    match file.get(&key("rope.scaling.type")).and_then(GgufValue::as_str) {
        None | Some("none") => {}
        Some("linear") => {
            let factor = file.get(&key("rope.scaling.factor")).and_then(GgufValue::as_f64).unwrap_or(1.0);
            config.insert("rope_scaling".into(), json!({"type": "linear", "factor": factor}));
        }
        Some("yarn") => {
            // llama.cpp's yarn (corrections floored and ceiled, attention scaled by
            // 0.1 ln(factor) + 1) is mlx-lm's YarnRoPE with these settings.
            let get = |k: &str, default: f64| file.get(&key(k)).and_then(GgufValue::as_f64).unwrap_or(default);
            config.insert(
                "rope_scaling".into(),
                json!({
                    "rope_type": "yarn",
                    "factor": get("rope.scaling.factor", 1.0),
                    "original_max_position_embeddings": get("rope.scaling.original_context_length", 4096.0),
                    "beta_fast": get("rope.scaling.yarn_beta_fast", 32.0),
                    "beta_slow": get("rope.scaling.yarn_beta_slow", 1.0),
                }),
            );
        }
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "{}: GGUF rope scaling {other:?} is not mapped yet",
                file.path().display()
            )))
        }
    }
    if let Some(tensor) = rope_freqs {
        if config.contains_key("rope_scaling") {
            return Err(bad_meta(file, &key("rope.scaling.type"), &format!("is set beside {}", gguf_rope::ROPE_FREQS)));
        }
        let factors = file.float_array(tensor)?.to_vec::<f32>()?;
        let theta = config.get("rope_theta").and_then(Value::as_f64).unwrap_or(10000.0);
        let dims = file.get(&key("rope.dimension_count")).and_then(GgufValue::as_u64).unwrap_or(head_dim);
        let label = file.path().display().to_string();
        if let Some(scaling) = gguf_rope::llama3_scaling(&label, &factors, theta, dims as usize)? {
            config.insert("rope_scaling".into(), scaling);
        }
    }
    let tied = !file.tensors().iter().any(|t| t.name == "output.weight");
    config.insert("tie_word_embeddings".into(), tied.into());
    let has_bias = file.tensors().iter().any(|t| t.name == "blk.0.attn_q.bias");
    if model_type == "llama" {
        config.insert("attention_bias".into(), has_bias.into());
    }
    if gguf_qwen35::is_hybrid(arch) {
        gguf_qwen35::config(file, arch, &mut config)?;
    }
    Ok(Value::Object(config))
}

/// A mixture-of-experts file's expert count and experts used per token, checked.
pub(crate) fn expert_counts(file: &GgufFile, arch: &str) -> Result<(u64, u64)> {
    let key = |k: &str| format!("{arch}.{k}");
    let experts = meta_u64(file, &key("expert_count"))?;
    let used = meta_u64(file, &key("expert_used_count"))?;
    if experts == 0 || used == 0 || used > experts {
        let what = format!("= {used} must be between 1 and {arch}.expert_count = {experts}");
        return Err(bad_meta(file, &key("expert_used_count"), &what));
    }
    Ok((experts, used))
}

/// A mixture-of-experts file's experts as the family's config names them. `qwen3moe`: every
/// layer sparse and the chosen experts' probabilities renormalized, as llama.cpp runs it;
/// `gpt-oss`: its sliding window (every other layer, from the first, as llama.cpp's default
/// pattern and mlx-lm's default `layer_types`). The experts' width defaults as llama.cpp's does
/// (the feed-forward length over the experts used).
fn moe_config(file: &GgufFile, arch: &str, model_type: &str, config: &mut Map<String, Value>) -> Result<()> {
    let key = |k: &str| format!("{arch}.{k}");
    let (experts, used) = expert_counts(file, arch)?;
    let ffn = file.get(&key("feed_forward_length")).and_then(GgufValue::as_u64);
    let expert_ffn = match file.get(&key("expert_feed_forward_length")).and_then(GgufValue::as_u64) {
        Some(n) => n,
        None => ffn.map(|f| f / used).ok_or_else(|| {
            bad_meta(file, &key("expert_feed_forward_length"), "is missing (and so is feed_forward_length)")
        })?,
    };
    config.insert("num_experts_per_tok".into(), used.into());
    if model_type == "gpt_oss" {
        config.insert("intermediate_size".into(), expert_ffn.into());
        config.insert("num_local_experts".into(), experts.into());
        let window = meta_u64(file, &key("attention.sliding_window"))?;
        config.insert("sliding_window".into(), window.into());
        if file.get(&key("attention.sliding_window_pattern")).is_some() {
            return Err(Error::Unsupported(format!(
                "{}: {arch}.attention.sliding_window_pattern is not mapped yet (gpt-oss's own alternation is)",
                file.path().display()
            )));
        }
        return Ok(());
    }
    config.insert("intermediate_size".into(), ffn.unwrap_or(expert_ffn).into());
    config.insert("moe_intermediate_size".into(), expert_ffn.into());
    config.insert("num_experts".into(), experts.into());
    config.insert("norm_topk_prob".into(), true.into());
    config.insert("decoder_sparse_step".into(), 1.into());
    config.insert("mlp_only_layers".into(), json!([]));
    Ok(())
}

/// The checkpoint name of a GGUF tensor name of architecture `arch` (`blk.3.attn_q.weight` ->
/// `model.layers.3.self_attn.q_proj.weight`).
pub(crate) fn checkpoint_name(arch: &str, name: &str) -> Option<String> {
    if arch == "gemma4" {
        return gguf_gemma4::checkpoint_name(name);
    }
    if let Some(f) = common_global(name) {
        return Some(f.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let hybrid = gguf_qwen35::is_hybrid(arch);
    if hybrid {
        if let Some(special) = gguf_qwen35::special_name(layer, rest) {
            return Some(special);
        }
    }
    let (module, suffix) = rest.rsplit_once('.')?;
    if let Some(m) = gguf_qwen35::module_name(module).filter(|_| hybrid) {
        return Some(format!("model.layers.{layer}.{m}.{suffix}"));
    }
    if (module, suffix, arch) == ("attn_sinks", "weight", "gpt-oss") {
        return Some(format!("model.layers.{layer}.self_attn.sinks"));
    }
    // mlx-lm's names for the router and the stacked experts differ by family.
    let (router, experts) =
        if arch == "gpt-oss" { ("mlp.router", "mlp.experts") } else { ("mlp.gate", "mlp.switch_mlp") };
    let expert = |proj: &str| Some(format!("model.layers.{layer}.{experts}.{proj}.{suffix}"));
    match module {
        "ffn_gate_inp" => return Some(format!("model.layers.{layer}.{router}.{suffix}")),
        "ffn_gate_exps" => return expert("gate_proj"),
        "ffn_up_exps" => return expert("up_proj"),
        "ffn_down_exps" => return expert("down_proj"),
        _ => {}
    }
    let module = match module {
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" if arch == "gpt-oss" => "post_attention_layernorm",
        other => common_module(other)?,
    };
    Some(format!("model.layers.{layer}.{module}.{suffix}"))
}

/// The tensors outside the layers every architecture names alike.
pub(crate) fn common_global(name: &str) -> Option<&'static str> {
    Some(match name {
        "token_embd.weight" => "model.embed_tokens.weight",
        "output_norm.weight" => "model.norm.weight",
        "output.weight" => "lm_head.weight",
        _ => return None,
    })
}

/// The attention and MLP modules of a layer every architecture names alike (`attn_q` ->
/// `self_attn.q_proj`).
pub(crate) fn common_module(module: &str) -> Option<&'static str> {
    Some(match module {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    })
}

/// llama.cpp's converter interleaves the two rotary halves of each q/k head for the `llama`
/// architecture; row `r` of the original is row `order[r]` of the file.
fn unpermute_order(rows: usize, heads: usize) -> Vec<usize> {
    let dim = rows / heads;
    let half = dim / 2;
    (0..rows)
        .map(|r| {
            let (h, within) = (r / dim, r % dim);
            let (which, i) = (within / half, within % half);
            h * dim + 2 * i + which
        })
        .collect()
}

/// The row order of a q/k projection of `heads` heads (`key` names the metadata that says so),
/// refusing a head count that does not split its rows into heads of an even size.
fn head_rows(file: &GgufFile, tensor: &GgufTensor, arch: &str, key: &str, heads: usize) -> Result<Vec<usize>> {
    let rows = tensor.dims[1];
    if !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(Error::Config {
            file: file.path().display().to_string(),
            message: format!(
                "{arch}.attention.{key} = {heads} does not split the {rows} rows of {} into heads of an even \
                 size; the file's metadata is wrong: convert the model again",
                tensor.name
            ),
        });
    }
    Ok(unpermute_order(rows, heads))
}

fn weights(file: &GgufFile, config: &Config, arch: &str, mtp: bool) -> Result<Weights> {
    Ok(Weights::from_arrays(file.path(), converted_arrays(file, config, arch, Destination::Model { mtp })?.0))
}

/// Where converted arrays go.
#[derive(Clone, Copy)]
enum Destination {
    /// A model loaded now: the simple blocks' parameters stay in f16, ggml's type for them (fewer
    /// bytes a weight); with `mtp`, a Qwen3.5 file's multi-token-prediction block too.
    Model { mtp: bool },
    /// An MLX checkpoint (`nuvec convert`): the offset types' (Q4_0, Q5_0, Q8_0) parameters in
    /// f32, as before they were f16, since mlx-lm computes in the type a quantized embedding's
    /// rows come out in (its scales'): with f16 ones a checkpoint of f32 norms would run in f16.
    Checkpoint,
}

/// Every tensor the model uses, converted and named as an MLX checkpoint names it, and the
/// affine layout of each quantized module (by module path).
type Converted = (HashMap<String, Array>, HashMap<String, QuantSpec>);

/// For a model with `mtp`, a Qwen3.5 file's multi-token-prediction block is converted too (as
/// `mtp.*`); for a checkpoint, the offset types' parameters are f32 ([`Destination`]).
fn converted_arrays(file: &GgufFile, config: &Config, arch: &str, into: Destination) -> Result<Converted> {
    let mtp = matches!(into, Destination::Model { mtp: true });
    let heads = config.usize("num_attention_heads")?;
    let kv_heads = config.usize("num_key_value_heads")?;
    if heads == 0 || kv_heads == 0 {
        return Err(Error::Config {
            file: file.path().display().to_string(),
            message: format!(
                "{arch}.attention.head_count = {heads} and head_count_kv = {kv_heads}: both must be at least 1"
            ),
        });
    }
    // The Qwen3.5 hybrids' multi-token-prediction blocks follow the decoder's: read only when
    // asked for (the first), as the `mtp.*` tensors of a Hugging Face original.
    let layers = config.usize("num_hidden_layers")?;
    let hybrid = gguf_qwen35::is_hybrid(arch);
    // A tensor's checkpoint name; `None` for one not read, `Some(None)` for one not mapped.
    let mapped = |name: &str| -> Option<Option<String>> {
        let layer =
            name.strip_prefix("blk.").and_then(|r| r.split_once('.')).and_then(|(l, _)| l.parse::<usize>().ok());
        match layer {
            Some(l) if hybrid && l == layers && mtp => Some(gguf_qwen35::mtp_name(name, |n| checkpoint_name(arch, n))),
            Some(l) if hybrid && l >= layers => None,
            _ => Some(checkpoint_name(arch, name)),
        }
    };
    let heads_v = if gguf_qwen35::is_hybrid(arch) { Some(ValueHeads::of(config)?) } else { None };
    // llama.cpp refuses a file with tensors its model does not load ("wrong number of
    // tensors"), and so does mlx-lm for a checkpoint's: they are another model's weights.
    let unmapped: Vec<&str> = file
        .tensors()
        .iter()
        .map(|t| t.name.as_str())
        .filter(|n| mapped(n).is_some_and(|m| m.is_none()) && *n != gguf_rope::ROPE_FREQS)
        .collect();
    if !unmapped.is_empty() {
        let shown = unmapped.iter().take(5).copied().collect::<Vec<_>>().join(", ");
        return Err(Error::Weights {
            file: file.path().display().to_string(),
            message: format!(
                "{} tensors are not used by GGUF architecture {arch} ({shown}{}); llama.cpp refuses them too \
                 (\"wrong number of tensors\"): the file is another architecture or was converted wrongly",
                unmapped.len(),
                if unmapped.len() > 5 { ", ..." } else { "" }
            ),
        });
    }
    let mut arrays: HashMap<String, Array> = HashMap::new();
    let mut specs: HashMap<String, QuantSpec> = HashMap::new();
    for tensor in file.tensors() {
        let Some(Some(name)) = mapped(&tensor.name) else {
            continue;
        };
        // The module's GGUF name (`attn_q` of `blk.0.attn_q.weight`, `ssm_a` of `blk.0.ssm_a`).
        let module = tensor.name.split('.').nth(2).unwrap_or("");
        if tensor.dims.len() == 1 {
            let a = file.float_array(tensor)?;
            let a = match &heads_v {
                Some(h) => gguf_qwen35::vector(file, module, &a, h)?.unwrap_or(a),
                None => a,
            };
            arrays.insert(name, a);
            continue;
        }
        let order = match (arch, module) {
            ("llama", "attn_q") => Some(head_rows(file, tensor, arch, "head_count", heads)?),
            ("llama", "attn_k") => Some(head_rows(file, tensor, arch, "head_count_kv", kv_heads)?),
            _ => heads_v.as_ref().and_then(|h| h.rows_of(module, tensor.dims[1])),
        };
        // ssm_out's columns are the value heads: moved as whole blocks after the conversion.
        let columns = heads_v.as_ref().filter(|_| module == "ssm_out").and_then(ValueHeads::column_blocks);
        let base = name.trim_end_matches(".weight").to_string();
        // Stacked experts ([cols, rows, experts], innermost first) are one matrix of
        // experts x rows rows, each row converted alone; the parts then stack as MLX's do.
        let (flat, experts) = match tensor.dims[..] {
            [cols, rows, experts] => {
                let mut flat = tensor.clone();
                flat.dims = vec![cols, rows * experts];
                (flat, Some(experts))
            }
            _ => (tensor.clone(), None),
        };
        let stacked = |a: Array| -> Result<Array> {
            match (experts, a.shape()) {
                (Some(e), &[rows, cols]) if e > 0 && rows % e == 0 => Ok(a.reshape(&[e, rows / e, cols])?),
                _ => Ok(a),
            }
        };
        // Column blocks of `unit` weight columns, as an array of `per` elements per `of` columns.
        let moved = |a: Array, per: usize, of: usize| -> Result<Array> {
            let Some((unit, blocks)) = &columns else {
                return Ok(a);
            };
            if !(unit * per).is_multiple_of(of) {
                return Err(Error::Unsupported(format!(
                    "{}: {}'s value heads of {unit} columns do not fall on its blocks of {of}; this layout is not \
                     mapped",
                    file.path().display(),
                    tensor.name
                )));
            }
            gguf_qwen35::permute_column_blocks(&a, unit * per / of, blocks)
        };
        match gguf_matrix(file, &flat, order.as_deref())? {
            // mlx-lm's convolution is [channels, kernel, 1].
            Matrix::Dense(a) if module == "ssm_conv1d" => {
                let shape = [a.dim(0), a.dim(1), 1];
                arrays.insert(name, a.reshape(&shape)?);
            }
            Matrix::Dense(a) => {
                arrays.insert(name, stacked(moved(a, 1, 1)?)?);
            }
            Matrix::Quantized(mut q) => {
                if matches!(into, Destination::Checkpoint)
                    && matches!(tensor.ggml_type, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0)
                {
                    (q.scales, q.biases) = (q.scales.astype(DType::F32)?, q.biases.astype(DType::F32)?);
                }
                let (bits, group) = (q.spec.bits, q.spec.group_size);
                arrays.insert(format!("{base}.weight"), stacked(moved(q.packed, bits, 32)?)?);
                arrays.insert(format!("{base}.scales"), stacked(moved(q.scales, 1, group)?)?);
                if q.spec.mode.has_biases() {
                    arrays.insert(format!("{base}.biases"), stacked(moved(q.biases, 1, group)?)?);
                }
                specs.insert(base, q.spec);
            }
        }
    }
    if arch == "gemma4" {
        gguf_gemma4::finish(&mut arrays, &mut specs, config)?;
    }
    if mtp && hybrid {
        gguf_qwen35::finish_mtp(&mut arrays);
    }
    Ok((arrays, specs))
}

/// What a GGUF file holds, as an MLX checkpoint would hold it: config.json's fields, the
/// tensors (block-quantized ones converted exactly to affine), and the tokenizer.
pub struct GgufCheckpoint {
    /// config.json's fields (without the quantization entries).
    pub config: Value,
    /// Tensors by checkpoint name.
    pub tensors: HashMap<String, Array>,
    /// The affine layout of each quantized module (`model.layers.0.self_attn.q_proj`): groups of
    /// 32 for the simple block types, Q4_K and Q5_K; groups of 16 (which MLX cannot load) for
    /// Q2_K, Q3_K and Q6_K.
    pub specs: HashMap<String, QuantSpec>,
    /// The tokenizer built from the GGUF vocabulary.
    pub tokenizer: Tokenizer,
}

/// Reads a GGUF file as an MLX checkpoint's parts (for `nuvec convert`).
pub fn read_gguf(path: &Path) -> Result<GgufCheckpoint> {
    let file = GgufFile::open(path)?;
    let label = path.display().to_string();
    let arch = meta_str(&file, "general.architecture")?;
    let Some(&(_, model_type)) = ARCHITECTURES.iter().find(|(a, _)| *a == arch) else {
        return Err(Error::Unsupported(format!("{label}: GGUF architecture {arch:?} is not mapped")));
    };
    let mut config = config_json(&file, arch, model_type)?;
    let parsed = Config::from_json(&label, &config.to_string())?;
    let (tensors, specs) = converted_arrays(&file, &parsed, arch, Destination::Checkpoint)?;
    let tokenizer = gguf_tokenizer::tokenizer(&file)?;
    for (key, field) in
        [("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id")]
    {
        if let Some(id) = file.get(key).and_then(GgufValue::as_u64) {
            config[field] = id.into();
        }
    }
    Ok(GgufCheckpoint { config, tensors, specs, tokenizer })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        // convert_hf_to_gguf: reshape(heads, 2, dim/2) -> swapaxes(1, 2): file row (h, i, which)
        // holds original row (h, which, i).
        let (heads, dim) = (3, 8);
        let original: Vec<usize> = (0..heads * dim).collect();
        let mut file = vec![0; heads * dim];
        for h in 0..heads {
            for which in 0..2 {
                for i in 0..dim / 2 {
                    file[h * dim + 2 * i + which] = original[h * dim + which * dim / 2 + i];
                }
            }
        }
        let order = unpermute_order(heads * dim, heads);
        let back: Vec<usize> = order.iter().map(|&r| file[r]).collect();
        assert_eq!(back, original);
    }

    #[test]
    fn maps_tensor_names() {
        assert_eq!(
            checkpoint_name("llama", "blk.12.attn_k.weight").as_deref(),
            Some("model.layers.12.self_attn.k_proj.weight")
        );
        assert_eq!(
            checkpoint_name("llama", "blk.0.ffn_norm.weight").as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(checkpoint_name("llama", "token_embd.weight").as_deref(), Some("model.embed_tokens.weight"));
        assert_eq!(checkpoint_name("llama", "rope_freqs.weight"), None);
    }
}
