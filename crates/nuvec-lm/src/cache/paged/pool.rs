//! The blocks of a [`super::PagedCache`] as bookkeeping (no tensors): which are free, how many
//! sequences hold each, and the prefix index — a full block's content hash to the block that
//! holds it, so a later sequence with the same prefix shares the block instead of computing it.
//!
//! A block no sequence holds any more keeps its content while it waits in the free list: one
//! that was never indexed is handed out first (most recently freed first, still warm), then
//! indexed ones, least recently freed first, each leaving the index as it is reused.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use super::prefix::Computed;

/// Free blocks, reference counts and the prefix index of one paged cache (every layer uses the
/// same block ids).
#[derive(Debug)]
pub(crate) struct BlockPool {
    block_size: usize,
    /// Sequences holding each block.
    refs: Vec<u32>,
    /// The content hash a block is indexed under.
    hash: Vec<Option<u64>>,
    /// Free blocks never indexed (or evicted).
    plain: Vec<u32>,
    /// Free indexed blocks, least recently freed first, as `(when freed, block)`; an entry whose
    /// time is not the block's `freed_at` is stale (the block was shared again) and skipped.
    cached: VecDeque<(u64, u32)>,
    freed_at: Vec<Option<u64>>,
    cached_free: usize,
    index: HashMap<u64, u32>,
    /// What each indexed block holds: its parent's hash, how it was computed and its tokens (a
    /// hit compares them, so a hash collision can never share the wrong keys and values).
    content: Vec<Option<(u64, Computed, Vec<u32>)>>,
    /// Indexed blocks that the first pass of the sequence that wrote them (from position 0)
    /// went on past.
    inside_first: Vec<bool>,
    clock: u64,
    /// Whether full blocks are indexed at all.
    caching: bool,
}

impl BlockPool {
    pub(crate) fn new(blocks: usize, block_size: usize) -> Self {
        BlockPool {
            block_size,
            refs: vec![0; blocks],
            hash: vec![None; blocks],
            plain: (0..blocks as u32).rev().collect(),
            cached: VecDeque::new(),
            freed_at: vec![None; blocks],
            cached_free: 0,
            index: HashMap::new(),
            content: vec![None; blocks],
            inside_first: vec![false; blocks],
            clock: 0,
            caching: false,
        }
    }

    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    pub(crate) fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks no sequence holds (indexed ones included: they are reused when needed).
    pub(crate) fn free(&self) -> usize {
        self.plain.len() + self.cached_free
    }

    /// Turns the prefix index on or off (off empties it).
    pub(crate) fn set_caching(&mut self, on: bool) {
        self.caching = on;
        if !on {
            let indexed: Vec<u32> = self.index.drain().map(|(_, b)| b).collect();
            for b in indexed {
                self.hash[b as usize] = None;
                self.content[b as usize] = None;
                if self.freed_at[b as usize].take().is_some() {
                    self.cached_free -= 1;
                    self.plain.push(b);
                }
            }
            self.cached.clear();
        }
    }

    pub(crate) fn caching(&self) -> bool {
        self.caching
    }

    /// Sequences holding block `b`.
    pub(crate) fn holders(&self, b: u32) -> u32 {
        self.refs[b as usize]
    }

    /// A free block, held once; `None` when every block is held.
    pub(crate) fn take(&mut self) -> Option<u32> {
        let b = match self.plain.pop() {
            Some(b) => b,
            None => loop {
                let (at, b) = self.cached.pop_front()?;
                if self.freed_at[b as usize] == Some(at) {
                    self.freed_at[b as usize] = None;
                    self.cached_free -= 1;
                    if let Some(h) = self.hash[b as usize].take() {
                        self.index.remove(&h);
                    }
                    self.content[b as usize] = None;
                    break b;
                }
            },
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// One more sequence holds block `b` (a prefix hit); a free block leaves the free list.
    pub(crate) fn share(&mut self, b: u32) {
        if self.refs[b as usize] == 0 && self.freed_at[b as usize].take().is_some() {
            self.cached_free -= 1;
        }
        self.refs[b as usize] += 1;
    }

    /// One sequence fewer holds block `b`; at none it is free (keeping its content if indexed).
    pub(crate) fn release(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        *r = r.saturating_sub(1);
        if *r > 0 {
            return;
        }
        if self.hash[b as usize].is_some() {
            self.clock += 1;
            self.freed_at[b as usize] = Some(self.clock);
            self.cached.push_back((self.clock, b));
            self.cached_free += 1;
        } else {
            self.plain.push(b);
        }
    }

    /// Indexes block `b` as holding `tokens`, computed as `computed`, after the prefix hashed
    /// `parent`, hashed `h` (a first holder of that content keeps the index; a block is indexed
    /// once; a `Mixed` block never is). `inside_first`: the first pass of the sequence that
    /// wrote it went on past it.
    pub(crate) fn register(
        &mut self,
        b: u32,
        h: u64,
        parent: u64,
        (computed, inside_first): (Computed, bool),
        tokens: &[u32],
    ) {
        if !self.caching
            || computed == Computed::Mixed
            || self.index.contains_key(&h)
            || self.hash[b as usize].is_some()
        {
            return;
        }
        self.index.insert(h, b);
        self.hash[b as usize] = Some(h);
        self.content[b as usize] = Some((parent, computed, tokens.to_vec()));
        self.inside_first[b as usize] = inside_first;
    }

    /// Whether indexed block `b` was written by a first pass that went on past it.
    pub(crate) fn inside_first_pass(&self, b: u32) -> bool {
        self.content[b as usize].is_some() && self.inside_first[b as usize]
    }

    /// The block holding `tokens`, computed as `computed`, after the prefix hashed `parent`
    /// (hashed `h`), if indexed.
    pub(crate) fn lookup(&self, h: u64, parent: u64, computed: Computed, tokens: &[u32]) -> Option<u32> {
        let b = *self.index.get(&h)?;
        match &self.content[b as usize] {
            Some((p, c, t)) if *p == parent && *c == computed && t[..] == *tokens => Some(b),
            _ => None,
        }
    }

    /// Takes block `b` out of the prefix index (its holder is about to write into it).
    pub(crate) fn unindex(&mut self, b: u32) {
        if let Some(h) = self.hash[b as usize].take() {
            self.index.remove(&h);
            self.content[b as usize] = None;
        }
    }
}

/// The pool behind `pool`: a panic while it was held cannot leave a block half handed out (each
/// change is a single push, pop or count), so a poisoned lock is taken as it is.
pub(crate) fn lock<T>(pool: &Mutex<T>) -> MutexGuard<'_, T> {
    pool.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Computed = Computed::Batched;

    #[test]
    fn indexed_blocks_wait_in_the_free_list_and_are_evicted_least_recent_first() {
        let mut p = BlockPool::new(3, 16);
        p.set_caching(true);
        let (a, b, c) = (p.take().unwrap(), p.take().unwrap(), p.take().unwrap());
        assert_eq!((p.take(), p.free()), (None, 0));
        p.register(a, 11, 0, (B, false), &[1]);
        p.register(b, 22, 0, (B, true), &[2]);
        assert!(p.inside_first_pass(b) && !p.inside_first_pass(a));
        p.release(a);
        p.release(b);
        p.release(c);
        assert_eq!(p.free(), 3);
        // The plain block first, then the least recently freed indexed one (a).
        assert_eq!(p.take(), Some(c));
        assert_eq!(p.take(), Some(a));
        assert_eq!((p.lookup(11, 0, B, &[1]), p.lookup(22, 0, B, &[2])), (None, Some(b)));
        assert_eq!(p.lookup(22, 0, B, &[3]), None, "a colliding hash of other tokens is no hit");
        // A hit on a free indexed block takes it out of the free list.
        p.share(b);
        assert_eq!((p.free(), p.holders(b)), (0, 1));
        assert_eq!(p.take(), None);
        p.share(b);
        p.release(b);
        assert_eq!(p.free(), 0, "still held once");
        p.release(b);
        assert_eq!((p.free(), p.lookup(22, 0, B, &[2])), (1, Some(b)));
        p.set_caching(false);
        assert_eq!((p.free(), p.lookup(22, 0, B, &[2])), (1, None));
    }
}
