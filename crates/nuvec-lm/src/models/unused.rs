//! Tensors a checkpoint holds that its model does not use. mlx-lm's `load_weights(strict=True)`
//! refuses them ("Received N parameters not in model"): a checkpoint of another architecture,
//! or one converted wrongly, loads with some of its weights silently left out. So do we, except
//! the tensors each family's `sanitize` in mlx-lm drops by name before that check.

use crate::weights::Weights;
use crate::{Error, Result};

/// True when mlx-lm's `sanitize` for `model_type` drops tensor `name` (that the model did not read).
fn dropped_by_sanitize(model_type: &str, name: &str) -> bool {
    // Every family drops (or never reads) lm_head when the embeddings are tied; an unread head
    // means the model ties it.
    let head = name.starts_with("lm_head.") || name.starts_with("language_model.lm_head.");
    match model_type {
        "llama" | "mistral" | "qwen2" => head || name.contains("self_attn.rotary_emb.inv_freq"),
        "qwen3" | "qwen3_moe" | "gpt_oss" => head,
        // The multimodal wrapper's vision tower, and multi-token-prediction heads.
        "qwen3_5" | "qwen3_5_moe" => {
            head || name.starts_with("vision_tower") || name.starts_with("model.visual") || name.contains("mtp.")
        }
        "gemma4" | "gemma4_text" => {
            const TOWERS: &[&str] = &[
                "vision_tower",
                "multi_modal_projector",
                "audio_tower",
                "embed_audio",
                "embed_vision",
                "vision_embedder",
            ];
            const TEXT: &[&str] = &["self_attn.rotary_emb", "input_max", "input_min", "output_max", "output_min"];
            // KV-shared layers reuse an earlier layer's keys and values: their k/v projections
            // and k_norm go unread here, as mlx-lm drops them.
            const SHARED: &[&str] = &[".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm"];
            let bare = name.strip_prefix("model.").unwrap_or(name);
            head || TOWERS.iter().any(|t| bare.starts_with(t))
                || TEXT.iter().any(|t| name.contains(t))
                || SHARED.iter().any(|t| name.contains(t))
        }
        _ => false,
    }
}

/// Refuses the tensors of `weights` the model of `model_type` did not read while it was built,
/// but those mlx-lm's sanitize drops and those `elsewhere` says another pipeline stage reads.
pub(crate) fn refuse_unused(model_type: &str, weights: &Weights, elsewhere: impl Fn(&str) -> bool) -> Result<()> {
    let extra: Vec<String> =
        weights.unread().into_iter().filter(|n| !dropped_by_sanitize(model_type, n) && !elsewhere(n)).collect();
    if extra.is_empty() {
        return Ok(());
    }
    const SHOWN: usize = 5;
    let mut names = extra.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if extra.len() > SHOWN {
        names.push_str(&format!(", and {} more", extra.len() - SHOWN));
    }
    Err(Error::Weights {
        file: weights.source().display().to_string(),
        message: format!(
            "{} tensors are not used by model_type {model_type} ({names}); mlx-lm refuses them too \
             (\"parameters not in model\"). The checkpoint is another architecture or was converted \
             wrongly: fix model_type in config.json, or re-convert it (e.g. with `mlx_lm.convert`)",
            extra.len()
        ),
    })
}
