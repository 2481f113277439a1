//! One rank's stage of a pipeline: which layers it runs, and how a step's hidden states and
//! logits cross between the stages.

use std::ops::Range;
use std::path::Path;

use nuvec::distributed::Group;
use nuvec::{Array, Device, Matrix};

use super::{wire, Split};
use crate::load::{load_model_with, LoadOptions};
use crate::models::Model;
use crate::step::StepBatch;
use crate::{Error, Result};

/// A pipeline to load a model as ([`LoadOptions::pipeline`]): the group whose ranks share the
/// layers, and how.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// The ranks, one stage each.
    pub group: Group,
    /// The layers of each rank.
    pub split: Split,
}

/// Loads the checkpoint folder `path` as this rank's stage of a pipeline over `group`: only the
/// stage's tensors are read (the embeddings on the first stage, the highest rank; the final norm
/// and head on the last, rank 0, with the embeddings there too when the head is tied to them).
/// Every rank calls it, with the same `split`.
pub fn load_model_pipelined(path: &Path, group: &Group, split: Split) -> Result<Model> {
    let pipeline = Pipeline { group: group.clone(), split };
    load_model_with(path, &LoadOptions { pipeline: Some(pipeline), ..Default::default() })
}

/// This rank's part of a pipelined model.
#[derive(Debug, Clone)]
pub struct Stage {
    group: Group,
    layers: Range<usize>,
    hidden: usize,
    vocab: usize,
    device: Device,
    /// Micro-batches a step of several sequences runs as ([`Stage::micro_batches`]).
    micro_batches: usize,
}

impl Stage {
    /// Rank `group.rank()`'s stage of a model of `layers` decoder layers (of `hidden` units and
    /// `vocab` logits) split as `split` says.
    pub(crate) fn new(
        group: &Group,
        split: &Split,
        layers: usize,
        hidden: usize,
        vocab: usize,
        device: Device,
    ) -> Result<Stage> {
        if device != Device::Cpu {
            return Err(Error::Unsupported(format!(
                "a pipeline on {device:?}: process groups move host memory (MPI), and GPU stages (NCCL) are not \
                 built; pipeline CPU ranks"
            )));
        }
        let ranges = super::split::ranges_of(&split.plan(group, layers, None)?);
        let micro_batches = micro_batches(group)?;
        Ok(Stage { group: group.clone(), layers: ranges[group.rank()].clone(), hidden, vocab, device, micro_batches })
    }

    /// [`Stage::new`] for a decoder of `layers` layers whose output head (or tied embeddings)
    /// is `head`: its sizes and device are the model's.
    pub(crate) fn for_head(group: &Group, split: &Split, layers: usize, head: &Matrix) -> Result<Stage> {
        Stage::new(group, split, layers, head.cols(), head.rows(), head.device())
    }

    /// The group of the pipeline.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The model's layers this rank runs (numbered as in the checkpoint).
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// Whether this rank runs the first layers, from the tokens' embeddings (the highest rank).
    pub fn embeds(&self) -> bool {
        self.group.rank() + 1 == self.group.size()
    }

    /// Whether this stage holds the token embeddings: to embed the step's tokens, or as the
    /// output head when the model's is `tied` to them.
    pub fn holds_embeddings(&self, tied: bool) -> bool {
        self.embeds() || (self.has_head() && tied)
    }

    /// Whether this rank runs the last layers, the final norm and the output head (rank 0).
    pub fn has_head(&self) -> bool {
        self.group.rank() == 0
    }

    /// Whether checkpoint tensor `name` belongs to the model's other stages, or to the parts
    /// around the layers that another stage may hold instead (embeddings, final norm, head):
    /// a stage reads those it needs, and leaves the rest unread. The decoder's tensors are
    /// found under the prefixes checkpoints use (a multimodal wrapper's too).
    pub(crate) fn elsewhere(&self, name: &str) -> bool {
        const DECODER: [&str; 3] = ["language_model.model.", "model.language_model.", "model."];
        let Some(rest) = DECODER.iter().find_map(|p| name.strip_prefix(p)) else {
            return ["lm_head.", "language_model.lm_head."].iter().any(|p| name.starts_with(p));
        };
        if let Some(rest) = rest.strip_prefix("layers.") {
            let layer = rest.split('.').next().and_then(|i| i.parse::<usize>().ok());
            return layer.is_some_and(|i| !self.layers.contains(&i));
        }
        ["embed_tokens.", "norm."].iter().any(|p| rest.starts_with(p))
    }

    /// The stage's part of a step: the rows' embeddings (`embed`, on the first stage) or the
    /// hidden states the stage before sent, through `layers` (giving the residual stream and its
    /// final norm); the normed states on rank 0, which has the head; elsewhere the stream, also
    /// sent on to the next stage (the caller's logits come from rank 0: [`Stage::share_logits`]).
    /// A step of several sequences runs as micro-batches ([`Stage::micro_batches`]): while a
    /// stage runs one, the stage before it runs the next.
    pub(crate) fn run(
        &self,
        step: &mut StepBatch,
        embed: impl Fn(&StepBatch) -> Result<Array>,
        layers: impl Fn(&mut StepBatch, Array) -> Result<(Array, Array)>,
    ) -> Result<Array> {
        let n = self.micro_batches(step.len());
        if n <= 1 {
            return self.run_part(step, &embed, &layers);
        }
        let outs =
            step.parts(n).iter_mut().map(|part| self.run_part(part, &embed, &layers)).collect::<Result<Vec<_>>>()?;
        crate::step::concat_rows(&outs)
    }

    fn run_part(
        &self,
        step: &mut StepBatch,
        embed: &impl Fn(&StepBatch) -> Result<Array>,
        layers: &impl Fn(&mut StepBatch, Array) -> Result<(Array, Array)>,
    ) -> Result<Array> {
        let rank = self.group.rank();
        let h = match self.embeds() {
            true => embed(step)?,
            false => {
                let bytes = self.group.recv(rank + 1)?;
                let from = format!("rank {}", rank + 1);
                wire::decode(&bytes, &[step.tokens().len(), self.hidden], self.device, &from)?
            }
        };
        let (h, normed) = layers(step, h)?;
        if self.has_head() {
            return Ok(normed);
        }
        self.group.send(rank - 1, &wire::encode(&h)?)?;
        Ok(h)
    }

    /// Micro-batches a step of `sequences` runs as: `NUVEC_PIPELINE_MICRO_BATCHES` (1 turns them
    /// off; read when the stage is made), else one per stage; at most one per sequence.
    pub fn micro_batches(&self, sequences: usize) -> usize {
        self.micro_batches.min(sequences)
    }

    /// The logits of `rows` rows: `head()`'s on rank 0, broadcast to every rank.
    pub(crate) fn share_logits(&self, rows: usize, head: impl FnOnce() -> Result<Array>) -> Result<Array> {
        super::shared::logits_of_rank0(&self.group, (rows, self.vocab), self.device, head)
    }
}

/// `NUVEC_PIPELINE_MICRO_BATCHES`, else the pipeline's ranks. Every rank must read the same value.
fn micro_batches(group: &Group) -> Result<usize> {
    match nuvec::tuning::env("NUVEC_PIPELINE_MICRO_BATCHES") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
            Error::Invalid(format!(
                "NUVEC_PIPELINE_MICRO_BATCHES={v:?}: give a whole number of at least 1 (1: no micro-batches)"
            ))
        }),
        _ => Ok(group.size()),
    }
}
