//! `PagedCache`: the keys and values of many sequences in fixed-size blocks of one pool per
//! layer, each sequence a block table, so that memory is bounded up front and a finished
//! sequence's blocks serve the next at once. [`decode_batch`] advances several sequences, each
//! at its own length, in one forward pass ([`crate::StepBatch`]); [`PagedCache::step`] also takes
//! prefill chunks. Recurrent (Gated DeltaNet) layers keep each sequence's state in a slot of
//! their own, updated in place.

mod kv;
mod pool;

use std::sync::{Arc, Mutex};

use nuvec::Array;

pub use kv::PagedKv;
use pool::{lock, LayerPool};

use super::LayerCache;
use crate::models::Model;
use crate::step::StepBatch;
use crate::{Error, Result};

/// Positions per block by default (vLLM's and the seed's).
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// A sequence of a [`PagedCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u32);

/// Many sequences' caches in fixed-size blocks (see the module docs).
#[derive(Debug)]
pub struct PagedCache {
    /// One pool per attention layer (`None` for a recurrent layer).
    pools: Vec<Option<Arc<Mutex<LayerPool>>>>,
    block_size: usize,
    /// Sequence slots: `slots[id]` holds that sequence's caches, one per layer.
    slots: Vec<Option<Vec<LayerCache>>>,
    /// The model the cache was made for (its fingerprint and layer count).
    model: (String, usize),
    /// Steps run each sequence as a pass of its own ([`StepBatch::set_batch_invariant`]).
    invariant: bool,
}

impl PagedCache {
    /// A cache for `model` of `blocks` blocks of `block_size` positions per layer, for at most
    /// `max_seqs` sequences at once. Keys and values are stored in the model's KV type.
    pub fn new(model: &Model, blocks: usize, block_size: usize, max_seqs: usize) -> Result<Self> {
        for (name, v) in [("blocks", blocks), ("block_size", block_size), ("max_seqs", max_seqs)] {
            if v == 0 {
                return Err(Error::Invalid(format!("PagedCache: {name} must be at least 1")));
            }
        }
        let plain = model.new_cache();
        let dtype = model.kv_dtype().dtype();
        let pools = plain
            .iter()
            .enumerate()
            .map(|(i, c)| match c {
                LayerCache::Plain(_) => Ok(Some(Arc::new(Mutex::new(LayerPool::new(blocks, block_size, dtype))))),
                LayerCache::Recurrent(_) => Ok(None),
                other => Err(Error::Unsupported(format!(
                    "PagedCache: layer {i} of {} uses a {} cache, whose paged form is not built yet (plain and \
                     recurrent layers are)",
                    model.model_type(),
                    kind(other)
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PagedCache {
            pools,
            block_size,
            slots: (0..max_seqs).map(|_| None).collect(),
            model: (model.fingerprint().to_string(), model.num_layers()),
            invariant: false,
        })
    }

    /// Batch invariance for every later [`PagedCache::step`]: each sequence gets exactly the
    /// logits it gets alone (see [`StepBatch::set_batch_invariant`]).
    pub fn set_batch_invariant(&mut self, invariant: bool) {
        self.invariant = invariant;
    }

    /// Sequences the cache can hold at once.
    pub fn max_seqs(&self) -> usize {
        self.slots.len()
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks per attention layer that no sequence holds.
    pub fn free_blocks(&self) -> usize {
        self.pools.iter().flatten().map(|p| lock(p).free_blocks()).min().unwrap_or(0)
    }

    /// Blocks per attention layer in all.
    pub fn total_blocks(&self) -> usize {
        self.pools.iter().flatten().map(|p| lock(p).total_blocks()).next().unwrap_or(0)
    }

    /// Sequences held.
    pub fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Whether no sequence is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions sequence `id` holds.
    pub fn positions(&self, id: SeqId) -> Result<usize> {
        Ok(self.caches(id)?.first().map_or(0, LayerCache::offset))
    }

    /// A new, empty sequence (its prompt is then prefilled with [`PagedCache::step`]).
    pub fn add(&mut self) -> Result<SeqId> {
        let slot = self.slots.iter().position(Option::is_none).ok_or_else(|| {
            Error::Invalid(format!(
                "the paged cache holds {} sequences already, its most; remove one or make it with more",
                self.slots.len()
            ))
        })?;
        let caches = self
            .pools
            .iter()
            .map(|p| match p {
                Some(pool) => LayerCache::Paged(PagedKv::new(pool.clone())),
                None => LayerCache::Recurrent(super::RecurrentCache::new()),
            })
            .collect();
        self.slots[slot] = Some(caches);
        Ok(SeqId(slot as u32))
    }

    /// A sequence holding what `cache` (a prefilled plain cache of the same model, one per layer)
    /// holds: its keys and values copied into blocks, recurrent states taken as they are.
    pub fn insert(&mut self, cache: &[LayerCache]) -> Result<SeqId> {
        if cache.len() != self.pools.len() {
            return Err(Error::Invalid(format!(
                "a cache of {} layers inserted into a paged cache for {}",
                cache.len(),
                self.pools.len()
            )));
        }
        let id = self.add()?;
        let filled = self.fill(id, cache);
        if filled.is_err() {
            self.remove(id)?;
        }
        filled.map(|_| id)
    }

    fn fill(&mut self, id: SeqId, cache: &[LayerCache]) -> Result<()> {
        let caches = self.caches_mut(id)?;
        for (i, (to, from)) in caches.iter_mut().zip(cache).enumerate() {
            match (to, from) {
                (LayerCache::Paged(to), LayerCache::Plain(from)) => {
                    if let Some((k, v)) = from.state()? {
                        to.write(&k.transpose01()?, &v.transpose01()?)?;
                    }
                }
                (LayerCache::Recurrent(to), LayerCache::Recurrent(from)) => *to = from.clone(),
                (_, other) => {
                    return Err(Error::Unsupported(format!(
                        "layer {i}: a {} cache cannot be inserted into a paged cache (plain and recurrent can)",
                        kind(other)
                    )))
                }
            }
        }
        Ok(())
    }

    /// Removes sequence `id`; its blocks are free again at once.
    pub fn remove(&mut self, id: SeqId) -> Result<()> {
        self.caches(id)?;
        // Dropping the per-layer views gives their blocks back.
        self.slots[id.0 as usize] = None;
        Ok(())
    }

    /// Removes exactly the last `n` positions of sequence `id` from every layer (blocks no
    /// position uses any more are free again), or errors leaving it unchanged; a sequence of a
    /// hybrid model, whose recurrent state cannot forget positions, refuses any `n > 0`.
    pub fn trim(&mut self, id: SeqId, n: usize) -> Result<()> {
        let caches = self.caches_mut(id)?;
        let held = caches.first().map_or(0, LayerCache::offset);
        if n > held {
            return Err(Error::Invalid(format!("cannot trim {n} positions from sequence {} holding {held}", id.0)));
        }
        if n > 0 && caches.iter().any(|c| matches!(c, LayerCache::Recurrent(_))) {
            return Err(Error::Invalid(format!(
                "sequence {} has recurrent layers, which cannot forget positions: remove it and start afresh",
                id.0
            )));
        }
        for cache in caches.iter_mut() {
            cache.trim(n)?;
        }
        Ok(())
    }

    fn caches(&self, id: SeqId) -> Result<&Vec<LayerCache>> {
        self.slots.get(id.0 as usize).and_then(Option::as_ref).ok_or_else(|| missing(id))
    }

    fn caches_mut(&mut self, id: SeqId) -> Result<&mut Vec<LayerCache>> {
        self.slots.get_mut(id.0 as usize).and_then(Option::as_mut).ok_or_else(|| missing(id))
    }

    /// One forward pass of `model` over the given sequences, each with its new tokens (one to
    /// decode, or a prefill chunk): the logits `[B, vocab]` of each one's last new token, in the
    /// order given. A failed pass leaves every sequence as it was.
    pub fn step(&mut self, model: &Model, work: &[(SeqId, &[u32])]) -> Result<Array> {
        if (model.fingerprint(), model.num_layers()) != (self.model.0.as_str(), self.model.1) {
            return Err(Error::Invalid(format!(
                "this paged cache was made for another model (fingerprint {:?}, {} layers), not this one \
                 (fingerprint {:?}, {} layers)",
                self.model.0,
                self.model.1,
                model.fingerprint(),
                model.num_layers()
            )));
        }
        // Each slot can be lent once: a second mention of an id finds it taken.
        let mut slots: Vec<Option<&mut Vec<LayerCache>>> = self.slots.iter_mut().map(Option::as_mut).collect();
        let mut lent = vec![false; slots.len()];
        let mut batch = StepBatch::new();
        batch.set_batch_invariant(self.invariant);
        for &(id, tokens) in work {
            let slot = id.0 as usize;
            match slots.get_mut(slot).and_then(Option::take) {
                Some(caches) => batch.push(tokens, caches)?,
                None if lent.get(slot) == Some(&true) => {
                    return Err(Error::Invalid(format!("sequence {} appears twice in one step", id.0)))
                }
                None => return Err(missing(id)),
            }
            lent[slot] = true;
        }
        model.step(&mut batch)
    }
}

/// Advances each sequence `ids[i]` of `paged` by `tokens[i]` in one forward pass: the logits
/// `[B, vocab]` for the next token of each, as decoding each alone would give them (to rounding).
pub fn decode_batch(model: &Model, tokens: &[u32], ids: &[SeqId], paged: &mut PagedCache) -> Result<Array> {
    if tokens.len() != ids.len() {
        return Err(Error::Invalid(format!("decode_batch: {} tokens for {} sequences", tokens.len(), ids.len())));
    }
    let work: Vec<(SeqId, &[u32])> = ids.iter().zip(tokens).map(|(&id, t)| (id, std::slice::from_ref(t))).collect();
    paged.step(model, &work)
}

fn missing(id: SeqId) -> Error {
    Error::Invalid(format!("sequence {} is not in the paged cache (never added, or removed)", id.0))
}

fn kind(cache: &LayerCache) -> &'static str {
    match cache {
        LayerCache::Plain(_) => "plain",
        LayerCache::Rotating(_) => "rotating (sliding-window)",
        LayerCache::Quantized(_) => "quantized",
        LayerCache::QuantizedRotating(_) => "quantized rotating",
        LayerCache::Chunked(_) => "chunked",
        LayerCache::Recurrent(_) => "recurrent",
        LayerCache::Paged(_) => "paged",
    }
}
