//! Tensor parallelism: one rank's share of every layer of a model split across a group.

use std::ops::Range;
use std::path::Path;

use nuvec::distributed::Group;
use nuvec::Matrix;

use crate::load::load_model;
use crate::models::Model;
use crate::{Error, Result};

/// Loads the checkpoint folder `path` and keeps this rank's share of every layer
/// ([`Model::shard`]). Every rank of `group` calls it.
pub fn load_model_sharded(path: &Path, group: &Group) -> Result<Model> {
    let mut model = load_model(path)?;
    model.shard(group)?;
    Ok(model)
}

/// A rank's place in a model split by tensor parallelism.
#[derive(Debug, Clone)]
pub struct Shard {
    group: Group,
}

impl Shard {
    pub(crate) fn new(group: &Group) -> Shard {
        Shard { group: group.clone() }
    }

    /// The group whose ranks share every layer.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// This rank's share of `n` units (heads, hidden units): the `rank`-th of `size` equal
    /// parts; `what` names the units when they do not divide.
    pub(crate) fn part(&self, n: usize, what: &str) -> Result<Range<usize>> {
        let size = self.group.size();
        if !n.is_multiple_of(size) {
            return Err(Error::Unsupported(format!("{n} {what} do not split evenly over {size} ranks")));
        }
        let share = n / size;
        Ok(self.group.rank() * share..(self.group.rank() + 1) * share)
    }

    /// This rank's query heads of `heads`, and the key/value heads of `kv_heads` they read (each
    /// shared by `heads / kv_heads` query heads: with fewer key/value heads than ranks, the ranks
    /// whose query heads share one each keep a copy).
    pub(crate) fn heads(&self, heads: usize, kv_heads: usize) -> Result<(Range<usize>, Range<usize>)> {
        let query = self.part(heads, "query heads")?;
        let (per_kv, own) = (heads / kv_heads, query.len());
        if !own.is_multiple_of(per_kv) && !per_kv.is_multiple_of(own) {
            return Err(Error::Unsupported(format!(
                "{own} query heads per rank do not cover whole groups of the {per_kv} that share a key/value head"
            )));
        }
        let kv = query.start / per_kv..(query.end - 1) / per_kv + 1;
        Ok((query, kv))
    }

    /// This rank's share of an untied output `head` split by vocabulary, when its rows divide
    /// over the ranks (`true` then: every rank gathers the logits, `shared::logits_of`); else
    /// the head as it is (whole, or `None` when tied to the embeddings).
    pub(crate) fn head(&self, head: Option<&Matrix>) -> Result<(Option<Matrix>, bool)> {
        match head {
            Some(h) if h.rows().is_multiple_of(self.group.size()) => {
                Ok((Some(h.rows_part(self.part(h.rows(), "vocabulary rows")?)?), true))
            }
            other => Ok((other.cloned(), false)),
        }
    }
}

/// `e` with the layer part it happened in named (`model.layers.3.self_attn`, ...).
pub(crate) fn at(place: &str, e: Error) -> Error {
    Error::Unsupported(format!(
        "{place}: cannot be split across ranks ({}); run on fewer ranks, or one whose count divides it",
        e.to_string().trim_start_matches("not supported: ")
    ))
}
