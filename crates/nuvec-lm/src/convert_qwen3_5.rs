//! What `mlx_lm.convert` does to a Qwen3.5 checkpoint that it does to no other family (its
//! `models/qwen3_5.py` sanitize, applied when it loads the source, and its `cast_predicate`):
//! the vision tower's and the multi-token-prediction head's tensors are dropped, a Hugging Face
//! original's language model is named `language_model.model.*` / `language_model.lm_head.*` and
//! its convolutions (`[C, 1, K]`) become `[C, K, 1]` with its `1 + w` norms stored as
//! `1 + w` (in the stored dtype); a cast leaves `A_log` as it is. The MoE gates' 8 bits under
//! `-q` are `convert`'s `quant_override`.

use std::collections::BTreeMap;

use nuvec::Array;

use crate::models::qwen3_5::plus_one;
use crate::Result;

/// Whether `model_type` is a Qwen3.5 family.
pub(crate) fn is_qwen3_5(model_type: &str) -> bool {
    matches!(model_type, "qwen3_5" | "qwen3_5_moe")
}

/// Whether a cast leaves tensor `name` of a `model_type` checkpoint as it is.
pub(crate) fn keeps_dtype(model_type: &str, name: &str) -> bool {
    is_qwen3_5(model_type) && name.ends_with("A_log")
}

/// The norms a Hugging Face original stores as `w` for `1 + w`.
const SHIFTED_NORMS: [&str; 5] = [
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// mlx-lm's sanitize of a `model_type` checkpoint's tensors (nothing for other families).
pub(crate) fn sanitize(model_type: &str, tensors: &mut BTreeMap<String, Array>) -> Result<()> {
    if !is_qwen3_5(model_type) {
        return Ok(());
    }
    let hf_layout = tensors.iter().any(|(k, v)| k.contains("conv1d.weight") && v.shape().last() != Some(&1));
    // A Hugging Face original's names (model.language_model.*, lm_head) become mlx-lm's; a
    // text-only checkpoint's (model.*, a GGUF's among them) load as they are and stay.
    let hf_names = tensors.keys().any(|k| k.starts_with("model.language_model"));
    for (name, a) in std::mem::take(tensors) {
        if name.starts_with("vision_tower") || name.starts_with("model.visual") || name.contains("mtp.") {
            continue;
        }
        let name = match name.strip_prefix("model.language_model") {
            Some(rest) => format!("language_model.model{rest}"),
            None if hf_names && !name.starts_with("language_model.") => format!("language_model.{name}"),
            None => name,
        };
        let a = match *a.shape() {
            // [C, 1, K] -> [C, K, 1]: the same values in the same order.
            [c, 1, k] if name.contains("conv1d.weight") && k != 1 => a.reshape(&[c, k, 1])?,
            // Rounded to the dtype already: the cast back is exact.
            [n] if hf_layout && SHIFTED_NORMS.iter().any(|s| name.ends_with(s)) => {
                Array::from_slice(&plus_one(&a)?, &[n])?.astype(a.dtype())?
            }
            _ => a,
        };
        tensors.insert(name, a);
    }
    Ok(())
}
