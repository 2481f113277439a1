//! A model split over the ranks of a process group ([`nuvec::distributed`]).
//!
//! Pipeline parallelism, as mlx-lm's `--pipeline`: each rank holds a contiguous range of the
//! decoder layers and reads only their tensors; the highest rank runs the first layers (and the
//! embeddings), rank 0 the last ones (and the final norm and output head). A step's hidden states
//! go from stage to stage with send/receive, a few kilobytes per token; rank 0's logits are then
//! broadcast, so that every rank samples the same token from the same logits (rank 0's seed is
//! shared when a request gives none) and `generate` yields the same tokens on every rank.
//!
//! Tensor parallelism, as mlx-lm's `model.shard(group)`: every rank holds a slice of every
//! attention, MLP and expert projection (its share of the query heads with the key/value heads
//! they read, its share of the hidden units and of each expert's), and the output and down
//! projections' partial products are summed over the group; the embeddings, norms, routers and
//! head are whole on every rank, rank 0's logits broadcast as in a pipeline, except an untied
//! head whose rows divide: each rank computes its share of the vocabulary, and every rank
//! gathers the whole row of logits.

mod pipeline;
mod shard;
mod shared;
mod split;
mod wire;

pub use pipeline::{load_model_pipelined, Pipeline, Stage};
pub(crate) use shard::at as shard_at;
pub use shard::{load_model_sharded, Shard};
pub(crate) use shared::{logits_of, seed_of_rank0, sum_over};
pub use split::Split;
