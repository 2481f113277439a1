//! llama.cpp's Qwen3.5 hybrids (`qwen35`, `qwen35moe`) as mlx-lm's `qwen3_5` / `qwen3_5_moe`
//! checkpoints. What llama.cpp's converter (conversion/qwen.py) changed is undone here:
//! - `ssm_a` holds `-exp(A_log)`: read back as `A_log = ln(-a)`;
//! - the value heads of every linear-attention tensor are tiled (head j of each key head, then
//!   head j + 1: ggml's broadcast order) where the checkpoint groups them by key head (the V rows
//!   of `attn_qkv` and the V channels of `ssm_conv1d`, the rows of `attn_gate`, `ssm_alpha` and
//!   `ssm_beta`, the entries of `ssm_a` and `ssm_dt`, the columns of `ssm_out`);
//! - the convolution is `[channels, kernel]` (mlx-lm's `[channels, kernel, 1]`);
//! - the shared expert's gate is a vector (`[1, hidden]`).
//!
//! The norms are stored as mlx-lm stores them (the `1 + w` of the original), so they load as
//! they are. The multi-token-prediction block past the decoder (`nextn_predict_layers`, what the
//! converter makes of the original's `mtp.*`) is read only when asked for
//! ([`crate::LoadOptions::mtp`]), as `mtp.*` again; otherwise it is skipped, as mlx-lm skips
//! the original's.

use nuvec::io::{GgufFile, GgufValue};
use nuvec::{Array, DType, Element};
use serde_json::{json, Map, Value};

use crate::gguf::{bad_meta as bad, expert_counts, meta_u64};
use crate::{Error, Result};

/// The GGUF architectures this file maps.
pub(crate) fn is_hybrid(arch: &str) -> bool {
    matches!(arch, "qwen35" | "qwen35moe")
}

/// The config fields of a Qwen3.5 file beyond the common ones (`config` holds those already).
pub(crate) fn config(file: &GgufFile, arch: &str, config: &mut Map<String, Value>) -> Result<()> {
    let key = |k: &str| format!("{arch}.{k}");
    let blocks = meta_u64(file, &key("block_count"))?;
    let nextn = file.get(&key("nextn_predict_layers")).and_then(GgufValue::as_u64).unwrap_or(0);
    if nextn >= blocks {
        return Err(bad(file, &key("nextn_predict_layers"), &format!("= {nextn} leaves none of the {blocks} blocks")));
    }
    let layers = blocks - nextn;
    config.insert("num_hidden_layers".into(), layers.into());
    if nextn > 0 {
        config.insert("mtp_num_hidden_layers".into(), nextn.into());
    }
    let interval = file.get(&key("full_attention_interval")).and_then(GgufValue::as_u64).unwrap_or(4);
    if interval == 0 {
        return Err(bad(file, &key("full_attention_interval"), "= 0: it must be at least 1"));
    }
    config.insert("full_attention_interval".into(), interval.into());
    // The converter writes the flags from the original's layer_types: they must be the pattern
    // the interval gives, which is the one the model runs.
    if let Some(flags) = file.get(&key("attention.recurrent_layers")).and_then(GgufValue::as_array) {
        for (i, flag) in flags.iter().enumerate().take(layers as usize) {
            let want = !(i as u64 + 1).is_multiple_of(interval);
            if flag.as_bool() != Some(want) {
                return Err(Error::Unsupported(format!(
                    "{}: {arch}.attention.recurrent_layers marks layer {i} {}, which full_attention_interval = \
                     {interval} does not: a layer pattern other than every {interval}th layer full attention is not \
                     mapped",
                    file.path().display(),
                    if flag.as_bool() == Some(true) { "recurrent" } else { "full attention" }
                )));
            }
        }
    }
    let k_heads = meta_u64(file, &key("ssm.group_count"))?;
    let v_heads = meta_u64(file, &key("ssm.time_step_rank"))?;
    let inner = meta_u64(file, &key("ssm.inner_size"))?;
    if k_heads == 0 || v_heads == 0 || !v_heads.is_multiple_of(k_heads) || !inner.is_multiple_of(v_heads) {
        return Err(bad(
            file,
            &key("ssm.time_step_rank"),
            &format!(
                "= {v_heads} value heads over {arch}.ssm.group_count = {k_heads} key heads and ssm.inner_size = \
                 {inner}: the value heads must be a multiple of the key heads and split the inner size"
            ),
        ));
    }
    config.insert("linear_num_key_heads".into(), k_heads.into());
    config.insert("linear_num_value_heads".into(), v_heads.into());
    config.insert("linear_key_head_dim".into(), meta_u64(file, &key("ssm.state_size"))?.into());
    config.insert("linear_value_head_dim".into(), (inner / v_heads).into());
    config.insert("linear_conv_kernel_dim".into(), meta_u64(file, &key("ssm.conv_kernel"))?.into());
    let head_dim = config.get("head_dim").and_then(Value::as_u64).unwrap_or(0).max(1);
    let rotated = file.get(&key("rope.dimension_count")).and_then(GgufValue::as_u64).unwrap_or(head_dim / 4);
    let mut rope = json!({"type": "default", "partial_rotary_factor": rotated as f64 / head_dim as f64});
    if let Some(theta) = config.remove("rope_theta") {
        rope["rope_theta"] = theta;
    }
    // Interleaved multimodal rope: with the text's one position per token, every section turns
    // at the same position, which is plain rope over the rotated features.
    if let Some(sections) = file.get(&key("rope.dimension_sections")).and_then(GgufValue::as_array) {
        let sections: Vec<u64> = sections.iter().filter_map(GgufValue::as_u64).filter(|&s| s > 0).collect();
        rope["mrope_section"] = json!(sections);
        rope["mrope_interleaved"] = true.into();
    }
    config.insert("rope_parameters".into(), rope);
    if arch == "qwen35moe" {
        let (experts, used) = expert_counts(file, arch)?;
        let width = meta_u64(file, &key("expert_feed_forward_length"))?;
        config.insert("num_experts".into(), experts.into());
        config.insert("num_experts_per_tok".into(), used.into());
        config.insert("moe_intermediate_size".into(), width.into());
        let shared = file.get(&key("expert_shared_feed_forward_length")).and_then(GgufValue::as_u64);
        config.insert("shared_expert_intermediate_size".into(), shared.unwrap_or(width).into());
        // llama.cpp renormalizes the chosen experts' weights for this architecture.
        config.insert("norm_topk_prob".into(), true.into());
    } else {
        config.insert("intermediate_size".into(), meta_u64(file, &key("feed_forward_length"))?.into());
    }
    Ok(())
}

/// The checkpoint module of a Qwen3.5 GGUF module of layer `layer`, where it differs from the
/// common names (`None`: not one of these).
pub(crate) fn module_name(module: &str) -> Option<&'static str> {
    Some(match module {
        "post_attention_norm" => "post_attention_layernorm",
        "attn_qkv" => "linear_attn.in_proj_qkv",
        "attn_gate" => "linear_attn.in_proj_z",
        "ssm_alpha" => "linear_attn.in_proj_a",
        "ssm_beta" => "linear_attn.in_proj_b",
        "ssm_out" => "linear_attn.out_proj",
        "ssm_norm" => "linear_attn.norm",
        "ssm_conv1d" => "linear_attn.conv1d",
        "ffn_gate_inp_shexp" => "mlp.shared_expert_gate",
        "ffn_gate_shexp" => "mlp.shared_expert.gate_proj",
        "ffn_up_shexp" => "mlp.shared_expert.up_proj",
        "ffn_down_shexp" => "mlp.shared_expert.down_proj",
        _ => return None,
    })
}

/// The checkpoint name of a tensor of the multi-token-prediction block (`blk.N.*`, N the
/// decoder's layer count), as the original names it under `mtp.`: its `nextn.*` tensors, and
/// the decoder-layer tensors `decoder` names for a layer 0 (under `mtp.layers.0.`).
pub(crate) fn mtp_name(name: &str, decoder: impl Fn(&str) -> Option<String>) -> Option<String> {
    let rest = name.strip_prefix("blk.")?.split_once('.')?.1;
    if let Some(nextn) = rest.strip_prefix("nextn.") {
        let (module, suffix) = nextn.rsplit_once('.')?;
        let module = match module {
            "eh_proj" => "fc",
            "enorm" => "pre_fc_norm_embedding",
            "hnorm" => "pre_fc_norm_hidden",
            "shared_head_norm" => "norm",
            _ => return None,
        };
        return Some(format!("mtp.{module}.{suffix}"));
    }
    let layer = decoder(&format!("blk.0.{rest}"))?;
    Some(format!("mtp.layers.0.{}", layer.strip_prefix("model.layers.0.")?))
}

/// A converted multi-token-prediction block without a norm of its own before the output head
/// (`nextn.shared_head_norm`) takes the model's final norm, as llama.cpp runs it.
pub(crate) fn finish_mtp(arrays: &mut std::collections::HashMap<String, Array>) {
    if arrays.contains_key("mtp.fc.weight") && !arrays.contains_key("mtp.norm.weight") {
        if let Some(norm) = arrays.get("model.norm.weight").cloned() {
            arrays.insert("mtp.norm.weight".into(), norm);
        }
    }
}

/// The checkpoint name of a Qwen3.5 GGUF tensor that has no `.weight`/`.bias` suffix or
/// another name: `blk.N.ssm_a` (A_log) and `blk.N.ssm_dt.bias` (the dt bias).
pub(crate) fn special_name(layer: &str, rest: &str) -> Option<String> {
    match rest {
        "ssm_a" => Some(format!("model.layers.{layer}.linear_attn.A_log")),
        "ssm_dt.bias" => Some(format!("model.layers.{layer}.linear_attn.dt_bias")),
        _ => None,
    }
}

/// How the value heads sit in a file: `key_heads` groups of `per_key` heads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ValueHeads {
    key_heads: usize,
    per_key: usize,
    /// Rows of q and k before the V rows of `attn_qkv` and the V channels of `ssm_conv1d`.
    qk_rows: usize,
    /// Each value head's width.
    width: usize,
}

impl ValueHeads {
    /// From the config `config::config` wrote.
    pub(crate) fn of(config: &crate::config::Config) -> Result<Self> {
        let (k, v) = (config.usize("linear_num_key_heads")?, config.usize("linear_num_value_heads")?);
        Ok(ValueHeads {
            key_heads: k,
            per_key: v / k.max(1),
            qk_rows: 2 * k * config.usize("linear_key_head_dim")?,
            width: config.usize("linear_value_head_dim")?,
        })
    }

    /// Whether the file's order differs from the checkpoint's (more value heads than key heads).
    fn reordered(&self) -> bool {
        self.per_key > 1
    }

    /// For each of `heads` value heads in the checkpoint's order, its place in the file.
    fn head_order(&self) -> Vec<usize> {
        let heads = self.key_heads * self.per_key;
        (0..heads).map(|h| (h % self.per_key) * self.key_heads + h / self.per_key).collect()
    }

    /// The file row of each checkpoint row for `rows` rows whose value heads (`unit` rows each)
    /// start at row `first`; `None` when nothing moves.
    fn row_order(&self, rows: usize, first: usize, unit: usize) -> Option<Vec<usize>> {
        if !self.reordered() {
            return None;
        }
        let heads = self.head_order();
        Some(
            (0..rows)
                .map(|r| if r < first { r } else { first + heads[(r - first) / unit] * unit + (r - first) % unit })
                .collect(),
        )
    }

    /// The file rows of a GGUF 2-D tensor's rows in the checkpoint's order, by module.
    pub(crate) fn rows_of(&self, module: &str, rows: usize) -> Option<Vec<usize>> {
        match module {
            "attn_qkv" | "ssm_conv1d" => self.row_order(rows, self.qk_rows, self.width),
            "attn_gate" => self.row_order(rows, 0, self.width),
            "ssm_alpha" | "ssm_beta" => self.row_order(rows, 0, 1),
            _ => None,
        }
    }

    /// The order of `ssm_out`'s column blocks (one value head each): block `b` of the result is
    /// block `order[b]` of the file; `None` when nothing moves.
    pub(crate) fn column_blocks(&self) -> Option<(usize, Vec<usize>)> {
        self.reordered().then(|| (self.width, self.head_order()))
    }

    /// A per-head vector (`ssm_a`, `ssm_dt`) in the checkpoint's order.
    fn per_head(&self, values: &[f32]) -> Vec<f32> {
        if !self.reordered() || values.len() != self.key_heads * self.per_key {
            return values.to_vec();
        }
        self.head_order().iter().map(|&p| values[p]).collect()
    }
}

/// A 1-D tensor of a Qwen3.5 file as the checkpoint holds it: `ssm_a` as A_log, `ssm_a` and
/// `ssm_dt` in the checkpoint's head order, the shared expert's gate as one row; `None` for any
/// other (taken as it is).
pub(crate) fn vector(file: &GgufFile, module: &str, a: &Array, heads: &ValueHeads) -> Result<Option<Array>> {
    match module {
        "ssm_a" => {
            let a_values = heads.per_head(&a.to_f32_vec()?);
            if let Some(v) = a_values.iter().find(|v| v.is_nan() || **v >= 0.0) {
                return Err(Error::Weights {
                    file: file.path().display().to_string(),
                    message: format!(
                        "ssm_a holds {v}; llama.cpp writes -exp(A_log) there, which is negative: the file is damaged"
                    ),
                });
            }
            let a_log: Vec<f32> = a_values.iter().map(|v| (-v).ln()).collect();
            Ok(Some(Array::from_slice(&a_log, &[a_log.len()])?))
        }
        "ssm_dt" => {
            let dt = heads.per_head(&a.to_f32_vec()?);
            Ok(Some(Array::from_slice(&dt, &[dt.len()])?))
        }
        "ffn_gate_inp_shexp" => Ok(Some(a.reshape(&[1, a.len()])?)),
        _ => Ok(None),
    }
}

/// `a` (`[rows, cols]`, any element type) with its column blocks of `unit` elements taken in
/// `order` (block `b` of the result is block `order[b]` of `a`).
pub(crate) fn permute_column_blocks(a: &Array, unit: usize, order: &[usize]) -> Result<Array> {
    fn typed<T: Element>(a: &Array, unit: usize, order: &[usize]) -> Result<Array> {
        let (rows, cols) = (a.dim(0), a.dim(1));
        let values = a.to_vec::<T>()?;
        let mut out = Vec::with_capacity(values.len());
        for row in values.chunks(cols.max(1)).take(rows) {
            for &b in order {
                out.extend_from_slice(&row[b * unit..(b + 1) * unit]);
            }
        }
        Ok(Array::from_slice(&out, a.shape())?)
    }
    if a.shape().len() != 2 || unit * order.len() != a.dim(1) {
        return Err(Error::Invalid(format!(
            "column blocks of {unit} in {} blocks do not tile an array of shape {:?}",
            order.len(),
            a.shape()
        )));
    }
    match a.dtype() {
        DType::F32 => typed::<f32>(a, unit, order),
        DType::F16 => typed::<half::f16>(a, unit, order),
        DType::BF16 => typed::<half::bf16>(a, unit, order),
        DType::U32 => typed::<u32>(a, unit, order),
        DType::U8 => typed::<u8>(a, unit, order),
        other => Err(Error::Invalid(format!("column blocks of a {other} array are not supported"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_value_heads_go_back_to_grouped() {
        // 2 key heads, 2 value heads each: llama.cpp's tiled order is [g0v0, g1v0, g0v1, g1v1];
        // the checkpoint's grouped order [g0v0, g0v1, g1v0, g1v1] reads file heads 0, 2, 1, 3.
        let heads = ValueHeads { key_heads: 2, per_key: 2, qk_rows: 4, width: 3 };
        assert_eq!(heads.head_order(), vec![0, 2, 1, 3]);
        let rows = heads.rows_of("attn_qkv", 4 + 12).unwrap();
        assert_eq!(&rows[..4], &[0, 1, 2, 3]);
        assert_eq!(&rows[4..10], &[4, 5, 6, 10, 11, 12]);
        assert_eq!(heads.per_head(&[0.0, 1.0, 2.0, 3.0]), vec![0.0, 2.0, 1.0, 3.0]);
        let one = ValueHeads { key_heads: 2, per_key: 1, qk_rows: 4, width: 3 };
        assert!(one.rows_of("attn_gate", 6).is_none() && one.column_blocks().is_none());
    }

    #[test]
    fn mtp_block_names_are_the_originals() {
        let decoder = |n: &str| crate::gguf::checkpoint_name("qwen35", n);
        assert_eq!(mtp_name("blk.4.nextn.eh_proj.weight", decoder).as_deref(), Some("mtp.fc.weight"));
        assert_eq!(mtp_name("blk.4.nextn.hnorm.weight", decoder).as_deref(), Some("mtp.pre_fc_norm_hidden.weight"));
        assert_eq!(mtp_name("blk.4.attn_q.weight", decoder).as_deref(), Some("mtp.layers.0.self_attn.q_proj.weight"));
        assert_eq!(
            mtp_name("blk.4.post_attention_norm.weight", decoder).as_deref(),
            Some("mtp.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(mtp_name("blk.4.nextn.embed_tokens.weight", decoder), None);
    }

    #[test]
    fn column_blocks_move_whole() {
        let a = Array::from_slice(&[0u32, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15], &[2, 6]).unwrap();
        let b = permute_column_blocks(&a, 2, &[2, 0, 1]).unwrap();
        assert_eq!(b.to_vec::<u32>().unwrap(), vec![4, 5, 0, 1, 2, 3, 14, 15, 10, 11, 12, 13]);
        assert!(permute_column_blocks(&a, 4, &[0, 1]).is_err());
    }
}
