//! A model split over the ranks of a process group ([`nuvec::distributed`]).
//!
//! Pipeline parallelism, as mlx-lm's `--pipeline`: each rank holds a contiguous range of the
//! decoder layers and reads only their tensors; the highest rank runs the first layers (and the
//! embeddings), rank 0 the last ones (and the final norm and output head). A step's hidden states
//! go from stage to stage with send/receive, a few kilobytes per token; rank 0's logits are then
//! broadcast, so that every rank samples the same token from the same logits (rank 0's seed is
//! shared when a request gives none) and `generate` yields the same tokens on every rank.
//!
//! Tensor parallelism (every layer split across the ranks) is not built.

mod pipeline;
mod split;
mod wire;

pub use pipeline::{load_model_pipelined, Pipeline, Stage};
pub use split::Split;
