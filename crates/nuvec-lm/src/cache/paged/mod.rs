//! `PagedCache`: the keys and values of many sequences in fixed-size blocks of one store per
//! layer, each sequence a block table (the same ids in every layer), so that memory is bounded
//! up front and a finished sequence's blocks serve the next at once. [`decode_batch`] advances
//! several sequences, each at its own length, in one forward pass ([`crate::StepBatch`]);
//! [`PagedCache::step`] also takes prefill chunks. Recurrent (Gated DeltaNet) layers keep each
//! sequence's state in a slot of their own, updated in place. Sliding-window layers take their
//! blocks from a pool of their own and give them back as positions leave the window
//! (`window.rs`; [`PagedCache::set_step_tokens`] bounds that pool).
//!
//! With prefix caching on ([`PagedCache::set_prefix_caching`]), every full block a step
//! completes is indexed by the hash chain of its tokens; [`PagedCache::add_with_prefix`] starts a
//! sequence on the blocks that already hold its prompt's prefix, shared (reference-counted,
//! never copied: only full blocks are shared, and a sequence writes only past them; trimming
//! back into a shared block copies it first). Freed indexed blocks keep their content until the
//! pool needs them, least recently freed first.
//!
//! A block is indexed with how its rows were computed (`prefix::Computed`). With batch
//! invariance on, a hit takes only blocks that passes of the request's own prefill grid
//! computed, and only whole chunks of that grid, so its tokens and log-probabilities are bit for
//! bit those of the cold run; otherwise a hit matches the cold run to rounding, as batching does.

mod checkpoints;
mod kv;
mod mirror;
mod pool;
mod prefix;
mod quant_blocks;
pub(crate) use quant_blocks::QuantBlocks;
mod store;
mod window;

use std::sync::{Arc, Mutex};

use nuvec::{Array, QuantSpec};

use checkpoints::Checkpoints;
pub use checkpoints::DEFAULT_CHECKPOINT_BYTES;
pub use kv::PagedKv;
pub(crate) use kv::{attend_decodes, write_decodes, InPlace};
pub(crate) use mirror::{follow, kv_bytes_per_position};
use pool::{lock, BlockPool};
use prefix::Computed;
pub use prefix::PrefixScope;
use store::{KvForm, LayerStore};
use window::{Windows, FREED};

use super::LayerCache;
use crate::models::Model;
use crate::step::StepBatch;
use crate::{Error, Result};

/// Positions per block by default (vLLM's and the seed's).
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// A prefix hit: the full layers' blocks with their hashes, and the window layers' blocks its
/// end still reads, by index.
type PrefixHit = (Vec<(u32, u64)>, Vec<(usize, u32)>);

/// A sequence of a [`PagedCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u32);

/// One sequence: its per-layer caches and the block tables they share (the full layers' and
/// the sliding-window layers').
#[derive(Debug)]
struct Seq {
    caches: Vec<LayerCache>,
    table: Arc<Mutex<Vec<u32>>>,
    window_table: Arc<Mutex<Vec<u32>>>,
    /// The tokens in the cache, when known (a sequence inserted from a plain cache has none and
    /// is never indexed).
    tokens: Option<Vec<u32>>,
    /// The hash chain of its full blocks.
    hashes: Vec<u64>,
    /// How the rows of its partly filled last block were computed (`None`: it has none).
    open: Option<Computed>,
    /// Which sequences may share its blocks (and the served adapter its rows take).
    scope: PrefixScope,
}

/// Many sequences' caches in fixed-size blocks (see the module docs).
#[derive(Debug)]
pub struct PagedCache {
    /// One store per attention layer (`None` for a recurrent layer).
    stores: Vec<Option<Arc<Mutex<LayerStore>>>>,
    /// Each sliding-window layer's window (its blocks come from `window_pool`, `window.rs`).
    windows: Vec<Option<usize>>,
    pool: BlockPool,
    /// The sliding-window layers' blocks, when the model has such layers.
    window_pool: Option<Windows>,
    /// How each store holds keys and values (for stores made again by `set_step_tokens`).
    form: KvForm,
    slots: Vec<Option<Seq>>,
    /// The model the cache was made for (its fingerprint and layer count).
    model: (String, usize, String),
    /// Steps run each sequence as a pass of its own ([`StepBatch::set_batch_invariant`]).
    invariant: bool,
    /// Whether the model has recurrent layers (whose state a prefix hit takes from `checkpoints`).
    recurrent: bool,
    /// Recurrent states at block boundaries, for prefix hits on hybrid models.
    checkpoints: Checkpoints,
    /// Positions of a sequence's last pass that [`PagedCache::trim`] can take back on every
    /// layer kind ([`PagedCache::set_rewind`]).
    rewind: usize,
    checkpoint_bytes: usize,
    /// The quantization of keys and values, for a quantized cache.
    quantized: Option<QuantSpec>,
    /// The step size [`PagedCache::set_step_tokens`] sized the window layers for.
    step_tokens: Option<usize>,
    /// The group whose other ranks' caches follow this one (`mirror.rs`).
    leader: Option<nuvec::distributed::Group>,
}

impl PagedCache {
    /// A cache for `model` of `blocks` blocks of `block_size` positions per layer, for at most
    /// `max_seqs` sequences at once. Keys and values are stored in the model's KV type.
    pub fn new(model: &Model, blocks: usize, block_size: usize, max_seqs: usize) -> Result<Self> {
        Self::with_form(model, blocks, block_size, max_seqs, KvForm::Plain(model.kv_dtype().dtype()))
    }

    /// [`PagedCache::new`] with keys and values quantized to `bits` in groups of `group_size`
    /// along the head dimension (mlx-lm's quantized cache with `quantized_kv_start` 0: a
    /// sequence's first pass from position 0 attends its own rows in full precision, every
    /// later pass reads them quantized). On a GPU the rows are quantized and read there.
    pub fn new_quantized(
        model: &Model,
        blocks: usize,
        block_size: usize,
        max_seqs: usize,
        bits: usize,
        group_size: usize,
    ) -> Result<Self> {
        let spec = super::quantized::kv_spec(bits, group_size)?;
        // The head sizes show in a one-token pass: a group size that does not divide one is
        // refused now rather than at a request's first step.
        let mut probe = model.new_cache();
        model.prefill(&[0], &mut probe)?;
        for (i, c) in probe.iter().enumerate() {
            let keys = match c {
                LayerCache::Plain(kv) => kv.state()?.map(|(k, _)| k),
                LayerCache::Rotating(r) => r.state().map(|(k, _, _)| k),
                _ => None,
            };
            if let Some(dim) = keys.map(|k| k.dim(2)).filter(|d| !d.is_multiple_of(group_size)) {
                return Err(Error::Invalid(format!(
                    "kv_group_size = {group_size} does not divide the head dimension {dim} of layer {i} of {}; \
                     give a group size that does (32, 64 or 128), or run without kv_bits",
                    model.model_type()
                )));
            }
        }
        let plain = KvForm::Quantized(spec, model.kv_dtype().dtype());
        Self::with_form(model, blocks, block_size, max_seqs, plain)
    }

    fn with_form(model: &Model, blocks: usize, block_size: usize, max_seqs: usize, form: KvForm) -> Result<Self> {
        for (name, v) in [("blocks", blocks), ("block_size", block_size), ("max_seqs", max_seqs)] {
            if v == 0 {
                return Err(Error::Invalid(format!("PagedCache: {name} must be at least 1")));
            }
        }
        let plain = model.new_cache();
        let store = || Some(Arc::new(Mutex::new(LayerStore::new(blocks, block_size, form))));
        let layers = plain
            .iter()
            .enumerate()
            .map(|(i, c)| match c {
                LayerCache::Plain(_) => Ok((store(), None)),
                LayerCache::Rotating(_) if paged_window(c).is_some() => Ok((store(), paged_window(c))),
                LayerCache::Recurrent(_) => Ok((None, None)),
                other => Err(Error::Unsupported(format!(
                    "PagedCache: layer {i} of {} uses a {} cache, whose paged form is not built yet (plain, \
                     sliding-window and recurrent layers are)",
                    model.model_type(),
                    kind(other)
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let (stores, windows): (Vec<_>, Vec<_>) = layers.into_iter().unzip();
        let reach = windows.iter().flatten().max().copied();
        Ok(PagedCache {
            recurrent: stores.iter().any(Option::is_none),
            checkpoints: Checkpoints::new(DEFAULT_CHECKPOINT_BYTES),
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
            stores,
            windows,
            pool: BlockPool::new(blocks, block_size),
            window_pool: reach.map(|r| Windows::new(blocks, block_size, r, 0)),
            rewind: 0,
            form,
            slots: (0..max_seqs).map(|_| None).collect(),
            model: (model.fingerprint().to_string(), model.num_layers(), model.model_type().to_string()),
            invariant: false,
            quantized: match form {
                KvForm::Quantized(spec, _) => Some(spec),
                KvForm::Plain(_) => None,
            },
            step_tokens: None,
            leader: None,
        })
    }

    /// The quantization of keys and values, for a cache made by [`PagedCache::new_quantized`].
    pub fn kv_quantization(&self) -> Option<QuantSpec> {
        self.quantized
    }

    /// Bounds the sliding-window layers' blocks to what the cache's sequences need when no step
    /// adds more than `step_tokens` positions over all of them: each sequence's window, and the
    /// step's new positions (`window::Windows::bound`; at most as many as the full layers
    /// have). Those layers' stores then take that many blocks instead of `blocks`: a model whose
    /// windows are short next to its context keeps most of its cache for the full layers (the
    /// Batcher sets its token budget here). Refused once a sequence was added; a step beyond it
    /// fails as a full cache does. Nothing to do for a model without window layers.
    pub fn set_step_tokens(&mut self, step_tokens: usize) -> Result<()> {
        let Some(windows) = &self.window_pool else { return self.tell(&mirror::Op::StepTokens(step_tokens)) };
        if !self.is_empty() {
            return Err(Error::Invalid("PagedCache::set_step_tokens: call it before adding sequences".into()));
        }
        let bs = self.block_size();
        let blocks =
            Windows::bound(windows.reach(), windows.slack(), bs, self.max_seqs(), step_tokens).min(self.total_blocks());
        let caching = windows.pool.caching();
        let mut sized = Windows::new(blocks, bs, windows.reach(), windows.slack());
        sized.pool.set_caching(caching);
        for (store, window) in self.stores.iter_mut().zip(&self.windows) {
            if let (Some(store), Some(_)) = (store, window) {
                *store = Arc::new(Mutex::new(LayerStore::new(blocks, bs, self.form)));
            }
        }
        self.window_pool = Some(sized);
        self.step_tokens = Some(step_tokens);
        self.tell(&mirror::Op::StepTokens(step_tokens))
    }

    /// Blocks of the sliding-window layers in all (`None` for a model without them).
    pub fn window_blocks(&self) -> Option<usize> {
        self.window_pool.as_ref().map(|w| w.pool.total())
    }

    /// Sliding-window blocks no sequence holds.
    pub fn free_window_blocks(&self) -> Option<usize> {
        self.window_pool.as_ref().map(|w| w.pool.free())
    }

    /// Batch invariance for every later [`PagedCache::step`]: each sequence gets exactly the
    /// logits it gets alone (see [`StepBatch::set_batch_invariant`]).
    pub fn set_batch_invariant(&mut self, invariant: bool) {
        self.invariant = invariant;
        // A failure to tell is the group's, which its next call reports.
        let _ = self.tell(&mirror::Op::Invariant(invariant));
    }

    /// Turns prefix caching on or off (off by default; off forgets every indexed block). On a
    /// hybrid model a hit also needs its recurrent layers' state where it ends: those are kept
    /// when a pass of several rows ends on a block boundary (`checkpoints.rs`, at most
    /// [`PagedCache::set_checkpoint_bytes`]), and a hit ends only where one is.
    pub fn set_prefix_caching(&mut self, on: bool) -> Result<()> {
        if !on {
            self.checkpoints.reset(self.checkpoint_bytes);
        }
        self.pool.set_caching(on);
        if let Some(w) = &mut self.window_pool {
            w.pool.set_caching(on);
        }
        self.tell(&mirror::Op::Caching(on))
    }

    /// Bytes of recurrent-state checkpoints a hybrid model's prefix caching keeps at most
    /// (default [`DEFAULT_CHECKPOINT_BYTES`]; the least recently used go first). Forgets those
    /// kept so far.
    pub fn set_checkpoint_bytes(&mut self, bytes: usize) {
        self.checkpoint_bytes = bytes;
        self.checkpoints.reset(bytes);
        // A failure to tell is the group's, which its next call reports.
        let _ = self.tell(&mirror::Op::CheckpointBytes(bytes));
    }

    /// Lets [`PagedCache::trim`] take back up to `n` positions of a sequence's last pass on
    /// every layer kind (speculative decoding's wrong guesses): recurrent layers keep their
    /// states from before each of a short pass's positions (stepping them one at a time), and
    /// sliding-window layers keep `n` positions behind their window. Call it before adding
    /// sequences, and before [`PagedCache::set_step_tokens`], which sizes the window blocks.
    pub fn set_rewind(&mut self, n: usize) -> Result<()> {
        if !self.is_empty() {
            return Err(Error::Invalid("PagedCache::set_rewind: call it before adding sequences".into()));
        }
        self.rewind = n;
        if let Some(w) = self.window_pool.take() {
            let mut sized = Windows::new(w.pool.total(), self.block_size(), w.reach(), n);
            sized.pool.set_caching(w.pool.caching());
            self.window_pool = Some(sized);
        }
        self.tell(&mirror::Op::Rewind(n))
    }

    /// Whether the model has recurrent layers (a hybrid), whose prefix hits end only where a
    /// pass kept their states.
    pub fn has_recurrent_layers(&self) -> bool {
        self.recurrent
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.pool.caching()
    }

    /// Sequences the cache can hold at once.
    pub fn max_seqs(&self) -> usize {
        self.slots.len()
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    /// Blocks no sequence holds (including indexed ones kept for prefix hits, which are reused
    /// when needed).
    pub fn free_blocks(&self) -> usize {
        self.pool.free()
    }

    /// Blocks in all.
    pub fn total_blocks(&self) -> usize {
        self.pool.total()
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
        Ok(self.seq(id)?.caches.first().map_or(0, LayerCache::offset))
    }

    /// Blocks that only sequence `id` holds: what removing it frees.
    pub fn exclusive_blocks(&self, id: SeqId) -> Result<usize> {
        let seq = self.seq(id)?;
        Ok(lock(&seq.table).iter().filter(|&&b| self.pool.holders(b) == 1).count())
    }

    /// A new, empty sequence (its prompt is then prefilled with [`PagedCache::step`]).
    pub fn add(&mut self) -> Result<SeqId> {
        self.add_in(PrefixScope::default())
    }

    /// [`PagedCache::add`] for a sequence of `scope`: its rows take the scope's served adapter
    /// in every step, and its blocks are indexed for that scope only.
    pub fn add_in(&mut self, scope: PrefixScope) -> Result<SeqId> {
        let id = self.add_slot(scope.clone())?;
        self.tell(&mirror::Op::Add { scope, id })?;
        Ok(id)
    }

    fn add_slot(&mut self, scope: PrefixScope) -> Result<SeqId> {
        let slot = self.slots.iter().position(Option::is_none).ok_or_else(|| {
            Error::Invalid(format!(
                "the paged cache holds {} sequences already, its most; remove one or make it with more",
                self.slots.len()
            ))
        })?;
        let table = Arc::new(Mutex::new(Vec::new()));
        let window_table = Arc::new(Mutex::new(Vec::new()));
        let bs = self.block_size();
        let caches = self
            .stores
            .iter()
            .zip(&self.windows)
            .map(|(s, &window)| match s {
                Some(store) => {
                    let table = if window.is_some() { &window_table } else { &table };
                    LayerCache::Paged(PagedKv::new(store.clone(), table.clone(), bs, window))
                }
                None => {
                    let mut state = super::RecurrentCache::new();
                    state.keep_rewind(self.rewind);
                    LayerCache::Recurrent(state)
                }
            })
            .collect();
        let tokens = Some(vec![]);
        self.slots[slot] = Some(Seq { caches, table, window_table, tokens, hashes: vec![], open: None, scope });
        Ok(SeqId(slot as u32))
    }

    /// The blocks holding the longest indexed prefix of `tokens` (full blocks only, and never
    /// the last token, whose logits a request needs computed) for a request prefilled `chunk`
    /// rows per pass: with batch invariance, blocks its own grid computed, ending on that grid.
    /// With sliding-window layers, also the window blocks the hit's end still reads (`(index,
    /// block)`), all of which must still be indexed.
    fn prefix_blocks(&self, tokens: &[u32], chunk: usize, scope: &PrefixScope) -> PrefixHit {
        if !self.pool.caching() || tokens.is_empty() {
            return (vec![], vec![]);
        }
        let bs = self.block_size();
        let usable = &tokens[..(tokens.len() - 1) / bs * bs];
        let computed = match self.invariant {
            false => Computed::Batched,
            true => Computed::Chunks(chunk.max(1)),
        };
        let root = scope.root();
        let mut parent = root;
        let mut hits = vec![];
        for block in usable.chunks_exact(bs) {
            let h = prefix::block_hash(parent, computed, block);
            match self.pool.lookup(h, parent, computed, block) {
                Some(b) => hits.push((b, h)),
                None => break,
            }
            parent = h;
        }
        // Each condition on where a hit may end, checked again after every block given up.
        loop {
            // A hit ending inside a chunk would have the rest of that chunk computed in a pass
            // of another shape than the cold run's.
            let on_grid = match computed {
                Computed::Chunks(c) => (hits.len() * bs).is_multiple_of(c),
                _ => true,
            };
            let may_end = on_grid
                && hits.last().is_none_or(|&(b, h)| {
                    // A quantized cache's first pass attended its own rows in full precision; a
                    // hit that ends inside it would have the rest of that pass read them
                    // quantized.
                    !(self.quantized.is_some() && self.pool.inside_first_pass(b))
                    // A hybrid's hit ends where its recurrent state was kept.
                        && (!self.recurrent || self.checkpoints.contains(h))
                });
            let tail = match &self.window_pool {
                Some(w) if may_end => {
                    let hashes: Vec<u64> = hits.iter().map(|&(_, h)| h).collect();
                    let blocks: Vec<&[u32]> = usable.chunks_exact(bs).take(hits.len()).collect();
                    w.lookup_tail(root, &hashes, computed, &blocks)
                }
                _ => may_end.then(Vec::new),
            };
            match tail {
                Some(tail) => return (hits, tail),
                None => {
                    hits.pop();
                }
            }
        }
    }

    /// What [`PagedCache::add_with_prefix`] would find for `tokens` prefilled `chunk` rows per
    /// pass, changing nothing: the positions it would start with, and how many of their blocks
    /// are free now (a hit takes them out of the free count).
    pub fn probe_prefix(&self, tokens: &[u32], chunk: usize) -> (usize, usize) {
        self.probe_prefix_in(tokens, chunk, &PrefixScope::default())
    }

    /// [`PagedCache::probe_prefix`] for a sequence of `scope`.
    pub fn probe_prefix_in(&self, tokens: &[u32], chunk: usize, scope: &PrefixScope) -> (usize, usize) {
        let (hits, _) = self.prefix_blocks(tokens, chunk, scope);
        let revived = hits.iter().filter(|&&(b, _)| self.pool.holders(b) == 0).count();
        (hits.len() * self.block_size(), revived)
    }

    /// A new sequence for `tokens`, starting on the indexed blocks that already hold their
    /// longest prefix (shared, not copied): returns it and the positions it starts with. The
    /// caller then steps the rest of `tokens` from there, `chunk` rows per prefill pass (with
    /// batch invariance the hit is cut to that grid; see the module docs).
    pub fn add_with_prefix(&mut self, tokens: &[u32], chunk: usize) -> Result<(SeqId, usize)> {
        self.add_with_prefix_in(tokens, chunk, PrefixScope::default())
    }

    /// [`PagedCache::add_with_prefix`] for a sequence of `scope` ([`PagedCache::add_in`]): only
    /// blocks that sequences of the same scope computed are shared.
    pub fn add_with_prefix_in(&mut self, tokens: &[u32], chunk: usize, scope: PrefixScope) -> Result<(SeqId, usize)> {
        let (hits, tail) = self.prefix_blocks(tokens, chunk, &scope);
        let id = self.add_slot(scope.clone())?;
        let held = hits.len() * self.block_size();
        for &(b, _) in &hits {
            self.pool.share(b);
        }
        let mut window_table = vec![];
        if let Some(w) = &mut self.window_pool {
            window_table = vec![FREED; hits.len()];
            for &(i, b) in &tail {
                w.pool.share(b);
                window_table[i] = b;
            }
        }
        let states = match hits.last() {
            Some(&(_, h)) if self.recurrent => self.checkpoints.get(h).unwrap_or_default(),
            _ => vec![],
        };
        let seq = self.slots[id.0 as usize].as_mut().expect("just added");
        *lock(&seq.table) = hits.iter().map(|&(b, _)| b).collect();
        *lock(&seq.window_table) = window_table;
        for (layer, mut state) in states {
            state.keep_rewind(self.rewind);
            seq.caches[layer] = LayerCache::Recurrent(state);
        }
        for c in &mut seq.caches {
            if let LayerCache::Paged(kv) = c {
                kv.set_held(held);
            }
        }
        seq.tokens = Some(tokens[..held].to_vec());
        seq.hashes = hits.iter().map(|&(_, h)| h).collect();
        self.tell(&mirror::Op::AddWithPrefix { tokens: tokens.to_vec(), chunk, scope, id, held })?;
        Ok((id, held))
    }

    /// A sequence holding what `cache` (a prefilled plain cache of the same model, one per layer)
    /// holds: its keys and values copied into blocks, recurrent states taken as they are.
    pub fn insert(&mut self, cache: &[LayerCache]) -> Result<SeqId> {
        if self.leads() {
            return Err(Error::Unsupported(
                "inserting a prefilled cache into the paged cache of a model split across ranks: the other ranks \
                 hold no copy of it; step the prompt instead"
                    .into(),
            ));
        }
        if cache.len() != self.stores.len() {
            return Err(Error::Invalid(format!(
                "a cache of {} layers inserted into a paged cache for {}",
                cache.len(),
                self.stores.len()
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
        let held = cache.iter().find(|c| matches!(c, LayerCache::Plain(_))).map_or(0, LayerCache::offset);
        self.reserve(id, held)?;
        let seq = self.seq_mut(id)?;
        seq.tokens = None;
        for (i, (to, from)) in seq.caches.iter_mut().zip(cache).enumerate() {
            match (to, from) {
                (LayerCache::Paged(to), LayerCache::Plain(from)) => {
                    if let Some((k, v)) = from.state()? {
                        to.write(&k.transpose01()?, &v.transpose01()?)?;
                    }
                }
                (LayerCache::Recurrent(to), LayerCache::Recurrent(from)) => *to = from.clone(),
                (LayerCache::Paged(_), LayerCache::Rotating(_)) => {
                    return Err(Error::Unsupported(format!(
                        "layer {i}: inserting a sliding-window (rotating) cache into a paged cache is not built (its \
                         ring may have dropped positions the full layers still hold); prefill the sequence with \
                         PagedCache::step instead"
                    )))
                }
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

    /// Grows sequence `id`'s table to hold `more` positions beyond what it holds; on error (the
    /// pool ran out) nothing is taken.
    fn reserve(&mut self, id: SeqId, more: usize) -> Result<()> {
        let bs = self.block_size();
        let held = self.positions(id)?;
        let seq = self.slots[id.0 as usize].as_ref().expect("checked by positions");
        let mut table = lock(&seq.table);
        let had = table.len();
        let need = (held + more).div_ceil(bs);
        while table.len() < need {
            match self.pool.take() {
                Some(b) => table.push(b),
                None => {
                    for b in table.drain(had..) {
                        self.pool.release(b);
                    }
                    return Err(Error::Invalid(format!(
                        "the paged cache is full: all {} blocks of {bs} positions are in use; remove a sequence or \
                         make the cache with more blocks",
                        self.pool.total()
                    )));
                }
            }
        }
        if let Some(w) = &mut self.window_pool {
            if !w.grow(&mut lock(&seq.window_table), need) {
                for b in table.drain(had..) {
                    self.pool.release(b);
                }
                return Err(Error::Invalid(format!(
                    "the paged cache is full: all {} sliding-window blocks of {bs} positions are in use; remove a \
                     sequence, or make the cache with more blocks or a larger PagedCache::set_step_tokens",
                    w.pool.total()
                )));
            }
        }
        Ok(())
    }

    /// Gives back the blocks of sequence `id`'s table past what it holds.
    fn shrink(&mut self, id: SeqId) -> Result<()> {
        let bs = self.block_size();
        let keep = self.positions(id)?.div_ceil(bs);
        let seq = self.slots[id.0 as usize].as_mut().expect("checked by positions");
        let freed: Vec<u32> = {
            let mut table = lock(&seq.table);
            let keep = keep.min(table.len());
            table.drain(keep..).collect()
        };
        for b in freed {
            self.pool.release(b);
        }
        if let Some(w) = &mut self.window_pool {
            w.truncate(&mut lock(&seq.window_table), keep);
        }
        Ok(())
    }

    /// Removes sequence `id`; the blocks only it held are free again at once.
    pub fn remove(&mut self, id: SeqId) -> Result<()> {
        self.seq(id)?;
        let seq = self.slots[id.0 as usize].take().expect("checked above");
        for b in lock(&seq.table).drain(..) {
            self.pool.release(b);
        }
        if let Some(w) = &mut self.window_pool {
            w.truncate(&mut lock(&seq.window_table), 0);
        }
        self.tell(&mirror::Op::Remove(id))
    }

    /// Removes exactly the last `n` positions of sequence `id` from every layer (blocks no
    /// position uses any more are free again), or errors leaving it unchanged; a sequence of a
    /// hybrid model, whose recurrent state cannot forget positions, refuses any `n > 0` beyond
    /// what [`PagedCache::set_rewind`] keeps.
    pub fn trim(&mut self, id: SeqId, n: usize) -> Result<()> {
        self.trim_here(id, n)?;
        self.tell(&mirror::Op::Trim(id, n))
    }

    fn trim_here(&mut self, id: SeqId, n: usize) -> Result<()> {
        let bs = self.block_size();
        let seq = self.seq_mut(id)?;
        let held = seq.caches.first().map_or(0, LayerCache::offset);
        if n > held {
            return Err(Error::Invalid(format!("cannot trim {n} positions from sequence {} holding {held}", id.0)));
        }
        if seq.caches.iter().any(|c| matches!(c, LayerCache::Recurrent(_)) && !c.can_trim(n)) {
            return Err(Error::Invalid(format!(
                "sequence {} has recurrent layers, which cannot forget positions they did not keep the state \
                 before: remove it and start afresh",
                id.0
            )));
        }
        let keep = held - n;
        let window_table = seq.window_table.clone();
        if let Some(w) = &self.window_pool {
            if n > 0 && !w.holds_reach(&lock(&window_table), keep) {
                return Err(Error::Invalid(format!(
                    "cannot trim sequence {} back to {keep} positions: its sliding-window layers gave back the blocks \
                     of positions before {} as they left the window; remove it and start afresh",
                    id.0,
                    w.first_needed(held)
                )));
            }
        }
        if n > 0 && !keep.is_multiple_of(bs) {
            // The sequence will write into the block it now ends in.
            self.own_block(id, keep / bs)?;
        }
        let seq = self.seq_mut(id)?;
        for cache in seq.caches.iter_mut() {
            cache.trim(n)?;
        }
        if let Some(t) = seq.tokens.as_mut() {
            t.truncate(keep);
        }
        seq.hashes.truncate(keep / bs);
        // What passes computed the rows left in that block is no longer known.
        seq.open = (!keep.is_multiple_of(bs)).then_some(Computed::Mixed);
        self.shrink(id)
    }

    /// Makes block `i` of sequence `id`'s tables its own to write into: a block other sequences
    /// share is copied into a fresh one first, and an indexed block leaves the index.
    fn own_block(&mut self, id: SeqId, i: usize) -> Result<()> {
        let seq = self.seq(id)?;
        let (table, window_table) = (seq.table.clone(), seq.window_table.clone());
        let stores = |windowed: bool| -> Vec<Arc<Mutex<LayerStore>>> {
            let layers = self.stores.iter().zip(&self.windows);
            layers.filter(|(_, w)| w.is_some() == windowed).filter_map(|(s, _)| s.clone()).collect()
        };
        let (full, windowed) = (stores(false), stores(true));
        own_in(&mut self.pool, &table, i, &full, id)?;
        match &mut self.window_pool {
            Some(w) => own_in(&mut w.pool, &window_table, i, &windowed, id),
            None => Ok(()),
        }
    }

    fn seq(&self, id: SeqId) -> Result<&Seq> {
        self.slots.get(id.0 as usize).and_then(Option::as_ref).ok_or_else(|| missing(id))
    }

    fn seq_mut(&mut self, id: SeqId) -> Result<&mut Seq> {
        self.slots.get_mut(id.0 as usize).and_then(Option::as_mut).ok_or_else(|| missing(id))
    }

    /// One forward pass of `model` over the given sequences, each with its new tokens (one to
    /// decode, or a prefill chunk): the logits `[B, vocab]` of each one's last new token, in the
    /// order given. A failed pass leaves every sequence as it was.
    pub fn step(&mut self, model: &Model, work: &[(SeqId, &[u32])]) -> Result<Array> {
        Ok(self.step_rows(model, work, None, false, None)?.0)
    }

    /// [`PagedCache::step`] with the logits of the last `counts[i]` rows of sequence `i`, stacked
    /// in order ([`Model::step_last_rows`]; `None`: each one's last row).
    pub fn step_last_rows(&mut self, model: &Model, work: &[(SeqId, &[u32])], counts: &[usize]) -> Result<Array> {
        Ok(self.step_rows(model, work, Some(counts), false, None)?.0)
    }

    /// [`PagedCache::step_last_rows`], with the final hidden states of every row of the step
    /// ([`Model::step_last_rows_hidden`]).
    pub fn step_last_rows_hidden(
        &mut self,
        model: &Model,
        work: &[(SeqId, &[u32])],
        counts: &[usize],
    ) -> Result<(Array, Array)> {
        let (logits, hidden) = self.step_rows(model, work, Some(counts), true, None)?;
        Ok((logits, hidden.expect("asked for")))
    }

    /// [`PagedCache::step_last_rows`] where some sequences decode a token that a previous step
    /// picked greedily and that is still on the device: for each `(i, pick)` of `fed`, sequence
    /// `i` of `work` has one row, whose token (a placeholder in `work`) is the index in row
    /// `pick` of `picks` ([`nuvec::Array::argmax_gap`] of that step's logits, no wider than the
    /// model's vocabulary). The step is enqueued without reading `picks`. Those tokens are not
    /// known to the prefix cache until [`PagedCache::commit_fed`] tells them (or
    /// [`PagedCache::trim`] takes their positions back).
    pub fn step_fed(
        &mut self,
        model: &Model,
        work: &[(SeqId, &[u32])],
        counts: &[usize],
        picks: &Array,
        fed: &[(usize, usize)],
    ) -> Result<Array> {
        self.refuse_fed()?;
        if let Some(&(i, _)) = fed.iter().find(|&&(i, _)| work.get(i).is_none_or(|w| w.1.len() != 1)) {
            return Err(Error::Invalid(format!("sequence {i} of the step is fed a picked token but has not one row")));
        }
        Ok(self.step_rows(model, work, Some(counts), false, Some((picks, fed)))?.0)
    }

    /// Records the token that [`PagedCache::step_fed`] fed sequence `id` from the device, as
    /// the step's other tokens were recorded (the prefix cache indexes the block it completes).
    pub fn commit_fed(&mut self, id: SeqId, token: u32) -> Result<()> {
        self.refuse_fed()?;
        let held = self.positions(id)?;
        let seq = self.seq(id)?;
        if let Some(known) = seq.tokens.as_ref().filter(|t| t.len() + 1 != held) {
            return Err(Error::Invalid(format!(
                "sequence {} holds {held} positions and knows {} tokens: no fed token is waiting",
                id.0,
                known.len()
            )));
        }
        self.commit(id, &[token]);
        Ok(())
    }

    /// A token picked on the device is not on the other ranks of a split model.
    fn refuse_fed(&self) -> Result<()> {
        match self.leads() {
            true => Err(Error::Unsupported(
                "feeding a token picked on the device to a model split across ranks: read it first".into(),
            )),
            false => Ok(()),
        }
    }

    fn step_rows(
        &mut self,
        model: &Model,
        work: &[(SeqId, &[u32])],
        counts: Option<&[usize]>,
        hidden: bool,
        fed: Option<(&Array, &[(usize, usize)])>,
    ) -> Result<(Array, Option<Array>)> {
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
        let mut seen = vec![false; self.slots.len()];
        for &(id, tokens) in work {
            self.seq(id)?;
            if std::mem::replace(&mut seen[id.0 as usize], true) {
                return Err(Error::Invalid(format!("sequence {} appears twice in one step", id.0)));
            }
            if tokens.is_empty() {
                return Err(Error::Invalid(format!("sequence {} of the step has no tokens", id.0)));
            }
        }
        for (i, &(id, tokens)) in work.iter().enumerate() {
            if let Err(e) = self.reserve(id, tokens.len()) {
                for &(id, _) in &work[..i] {
                    self.shrink(id)?;
                }
                return Err(e);
            }
        }
        if self.leads() {
            let told = work.iter().map(|&(id, t)| (id, t.to_vec())).collect();
            let told = self.tell(&mirror::Op::Step { work: told, counts: counts.map(<[usize]>::to_vec), hidden });
            if let Err(e) = told {
                for &(id, _) in work {
                    self.shrink(id)?;
                }
                return Err(e);
            }
        }
        let result = self.run(model, work, counts, hidden, fed);
        for &(id, _) in work {
            if let Some(seq) = self.slots[id.0 as usize].as_mut() {
                for c in &mut seq.caches {
                    if let LayerCache::Paged(kv) = c {
                        kv.end_pass();
                    }
                }
            }
        }
        for (i, &(id, tokens)) in work.iter().enumerate() {
            // A fed token is recorded when it is known (`commit_fed`).
            if result.is_ok() && !fed.is_some_and(|(_, f)| f.iter().any(|&(j, _)| j == i)) {
                self.commit(id, tokens);
                self.checkpoint(id, tokens.len());
            }
            self.shrink(id)?;
            self.release_window(id)?;
        }
        // The followers check that the step went the same way there.
        let told = self.tell(&mirror::Op::Stepped(result.is_ok()));
        let result = result?;
        told?;
        Ok(result)
    }

    /// Keeps a hybrid sequence's recurrent states when its pass of `rows` rows (a prefill chunk:
    /// decode steps would keep one every block) ended on a block boundary.
    fn checkpoint(&mut self, id: SeqId, rows: usize) {
        if !self.recurrent || !self.pool.caching() || rows < 2 {
            return;
        }
        let bs = self.block_size();
        let Some(seq) = self.slots[id.0 as usize].as_ref() else { return };
        let Some(known) = seq.tokens.as_ref() else { return };
        if known.is_empty() || !known.len().is_multiple_of(bs) || seq.hashes.len() != known.len() / bs {
            return;
        }
        let states = seq
            .caches
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                LayerCache::Recurrent(r) => Some((i, r.settled())),
                _ => None,
            })
            .collect();
        let h = *seq.hashes.last().expect("a full block");
        self.checkpoints.insert(h, states);
    }

    /// Gives back the sliding-window blocks of sequence `id` that no later pass reads.
    fn release_window(&mut self, id: SeqId) -> Result<()> {
        let len = self.positions(id)?;
        if let (Some(w), Some(seq)) = (&mut self.window_pool, &self.slots[id.0 as usize]) {
            w.release_behind(&mut lock(&seq.window_table), len);
        }
        Ok(())
    }

    fn run(
        &mut self,
        model: &Model,
        work: &[(SeqId, &[u32])],
        counts: Option<&[usize]>,
        hidden: bool,
        fed: Option<(&Array, &[(usize, usize)])>,
    ) -> Result<(Array, Option<Array>)> {
        // Each slot is lent once (ids were checked distinct above).
        let mut slots: Vec<Option<&mut Seq>> = self.slots.iter_mut().map(Option::as_mut).collect();
        let mut batch = StepBatch::new();
        batch.set_batch_invariant(self.invariant);
        for &(id, tokens) in work {
            let seq = slots[id.0 as usize].take().expect("checked in step");
            batch.push_adapted(tokens, &mut seq.caches, seq.scope.adapter)?;
        }
        if let Some((picks, fed)) = fed {
            // Each fed sequence's one row, by its place among the step's rows.
            let firsts: Vec<usize> =
                work.iter().scan(0, |at, (_, t)| Some(std::mem::replace(at, *at + t.len()))).collect();
            batch.feed(picks.clone(), fed.iter().map(|&(i, pick)| (firsts[i], pick)).collect());
        }
        // Each sequence's last row unless told otherwise.
        let ones;
        let counts = match counts {
            Some(c) => c,
            None => {
                ones = vec![1; work.len()];
                &ones
            }
        };
        match hidden {
            true => model.step_last_rows_hidden(&mut batch, counts).map(|(logits, h)| (logits, Some(h))),
            false => model.step_last_rows(&mut batch, counts).map(|logits| (logits, None)),
        }
    }

    /// Records sequence `id`'s new `tokens` and indexes the blocks they completed.
    fn commit(&mut self, id: SeqId, tokens: &[u32]) {
        let bs = self.block_size();
        let Some(seq) = self.slots[id.0 as usize].as_mut() else { return };
        let Some(known) = seq.tokens.as_mut() else { return };
        let pass = Computed::pass(self.invariant, known.len(), tokens.len());
        // The end of the sequence's first pass, when this is it.
        let first_pass_end = known.is_empty().then_some(tokens.len());
        known.extend_from_slice(tokens);
        let table = lock(&seq.table);
        let mut open = seq.open.take();
        while seq.hashes.len() < known.len() / bs {
            let i = seq.hashes.len();
            let parent = seq.hashes.last().copied().unwrap_or_else(|| seq.scope.root());
            let block = &known[i * bs..(i + 1) * bs];
            let computed = Computed::after(open.take(), pass);
            let h = prefix::block_hash(parent, computed, block);
            let inside_first = first_pass_end.is_some_and(|end| (i + 1) * bs < end);
            self.pool.register(table[i], h, parent, (computed, inside_first), block);
            if let Some(w) = &mut self.window_pool {
                // The window layers' block of the same positions, while it is held.
                let wb = lock(&seq.window_table)[i];
                if wb != FREED {
                    w.pool.register(wb, h, parent, (computed, inside_first), block);
                }
            }
            seq.hashes.push(h);
        }
        if known.len() % bs != 0 {
            seq.open = Some(Computed::after(open, pass));
        }
    }
}

/// The window of a layer whose own cache rotates over it with nothing pinned (the sliding-window
/// layers a paged cache holds), in positions a query sees.
fn paged_window(cache: &LayerCache) -> Option<usize> {
    match cache {
        LayerCache::Rotating(r) if r.window().1 == 0 => Some(r.window().0),
        _ => None,
    }
}

/// The widest sliding window of `model`'s layers (positions a query sees), if it has any.
fn window_reach(model: &Model) -> Option<usize> {
    model.new_cache().iter().filter_map(paged_window).max()
}

/// The blocks `model`'s sliding-window layers take in a paged cache of `seqs` sequences whose
/// steps add at most `step_tokens` positions, each keeping `slack` more behind its window
/// ([`PagedCache::set_step_tokens`] sizes them so, at most the full layers' count); `None` for a
/// model without such layers.
pub(crate) fn window_blocks_for(
    model: &Model,
    block_size: usize,
    seqs: usize,
    step_tokens: usize,
    slack: usize,
) -> Option<usize> {
    window_reach(model).map(|reach| Windows::bound(reach, slack, block_size, seqs, step_tokens))
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

/// Makes entry `i` of `table` (blocks of `pool`, in `stores`) the sequence's own: a shared block
/// is copied into a fresh one, an indexed one leaves the index.
fn own_in(
    pool: &mut BlockPool,
    table: &Mutex<Vec<u32>>,
    i: usize,
    stores: &[Arc<Mutex<LayerStore>>],
    id: SeqId,
) -> Result<()> {
    let b = lock(table)[i];
    if pool.holders(b) <= 1 {
        pool.unindex(b);
        return Ok(());
    }
    let Some(copy) = pool.take() else {
        return Err(Error::Invalid(format!(
            "cannot trim sequence {} into a block it shares with another: copying it needs a free block, and all {} \
             are in use; remove a sequence first",
            id.0,
            pool.total()
        )));
    };
    for store in stores {
        if let Err(e) = lock(store).copy_block(b, copy) {
            pool.release(copy);
            return Err(e);
        }
    }
    lock(table)[i] = copy;
    pool.release(b);
    Ok(())
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
