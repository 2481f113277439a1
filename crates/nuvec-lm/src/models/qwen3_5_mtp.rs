//! Qwen3.5's multi-token-prediction head: the checkpoint's `mtp.*` tensors, which mlx-lm drops
//! and vLLM, SGLang and llama.cpp run as a draft for speculative decoding. It is one more gated
//! full-attention decoder block with a cache of its own. At position `i` it reads the target's
//! final (normalized) hidden state there and the embedding of the token that followed it, each
//! through its own norm, joined `[embedding, hidden]` and projected back to the model's width by
//! `fc`; after the block, its own norm gives a hidden state whose logits (the target's output
//! head) guess the token after that one, and which stands in for the target's hidden state when
//! the head is run again on its own guess.

use nuvec::{Array, Matrix};

use super::qwen3_5::{Block, Parts};
use crate::layers::RmsNorm;
use crate::step::StepBatch;
use crate::{Error, Result};

/// A loaded multi-token-prediction head.
pub(super) struct Mtp {
    embedding_norm: RmsNorm,
    hidden_norm: RmsNorm,
    /// `[hidden, 2 hidden]`, over the normalized embedding then the normalized hidden state.
    fc: Matrix,
    block: Block,
    norm: RmsNorm,
    hidden: usize,
}

impl Mtp {
    /// The head of the checkpoint `parts` reads, under `mtp.` (a Hugging Face original's name;
    /// `model.mtp.` and `language_model.mtp.` are taken too).
    pub(super) fn load(parts: &Parts) -> Result<Self> {
        let weights = parts.weights;
        let prefix = ["mtp", "model.mtp", "language_model.mtp"]
            .into_iter()
            .find(|p| weights.has(&format!("{p}.fc.weight")))
            .ok_or_else(|| {
                Error::NotFound(
                    "this checkpoint has no multi-token-prediction head (no mtp.fc.weight tensor, in a GGUF no \
                     blk.N.nextn.* block): mlx-lm's conversions drop it, as llama.cpp's converter does with \
                     --no-mtp; use the Hugging Face original or a GGUF that keeps it, or speculate with a draft \
                     model or prompt lookup instead"
                        .into(),
                )
            })?;
        let layers = parts.text.opt_usize("mtp_num_hidden_layers")?.unwrap_or(1);
        if layers != 1 {
            return Err(Error::Unsupported(format!(
                "{}: mtp_num_hidden_layers = {layers}; nuvec runs multi-token-prediction heads of one layer \
                 (every Qwen3.5 checkpoint's)",
                parts.text.file()
            )));
        }
        let hidden = parts.hidden;
        Ok(Mtp {
            embedding_norm: parts.norm(&format!("{prefix}.pre_fc_norm_embedding"))?,
            hidden_norm: parts.norm(&format!("{prefix}.pre_fc_norm_hidden"))?,
            fc: weights.matrix(&format!("{prefix}.fc"), hidden, 2 * hidden)?,
            // The head's block is a full-attention one whatever the layer pattern.
            block: parts.block(&format!("{prefix}.layers.0"), false)?,
            norm: parts.norm(&format!("{prefix}.norm"))?,
            hidden,
        })
    }

    /// The head's hidden states `[rows, hidden]` for the step's rows: row `r` from the target's
    /// hidden state `target[r]` and the token `step.tokens()[r]` that followed it, at the
    /// position the step's cache gives it. `embed` is the target's embedding.
    pub(super) fn forward(&self, embed: &Matrix, target: &Array, step: &mut StepBatch) -> Result<Array> {
        let rows = step.tokens().len();
        if target.shape().len() != 2 || target.dim(0) != rows || target.dim(1) != self.hidden {
            return Err(Error::Invalid(format!(
                "the multi-token-prediction head got hidden states of shape {:?} for {rows} tokens of width {}",
                target.shape(),
                self.hidden
            )));
        }
        step.check_layers(1, "multi-token-prediction layers")?;
        let e = self.embedding_norm.forward(&step.embed(embed)?)?;
        let h = self.hidden_norm.forward(target)?;
        let joined = join_columns(&e, &h)?;
        let x = self.block.forward(&joined.linear(&self.fc)?, step, 0)?;
        self.norm.forward(&x)
    }
}

/// `[a | b]`: two `[rows, width]` arrays side by side, `[rows, 2 width]`.
fn join_columns(a: &Array, b: &Array) -> Result<Array> {
    let (rows, width) = (a.dim(0), a.dim(1));
    // Each row a "head" of two positions: the cache's join along positions does the copy.
    let joined = crate::cache::ops::concat_axis1(&[a.reshape(&[rows, 1, width])?, b.reshape(&[rows, 1, width])?])?;
    Ok(joined.reshape(&[rows, 2 * width])?)
}
