//! The blocks of a paged cache's sliding-window layers: a pool of their own and a block table
//! per sequence beside the full layers' one (vLLM's hybrid allocator). A window layer's query
//! sees the last `window` positions, so once a sequence holds `len` positions no later pass
//! reads a position before `len - (window - 1)`: the blocks wholly before it go back to the
//! pool ([`FREED`] in the table), and the pool only needs room for what the windows reach.
//!
//! With prefix caching, window blocks are indexed under the same hashes as the full layers'
//! blocks of the same positions, and a hit takes only the window blocks its end still needs.

use super::pool::BlockPool;
use super::prefix::Computed;

/// A window table's entry for a block given back (its positions left every window).
pub(crate) const FREED: u32 = u32::MAX;

/// The sliding-window layers' block pool.
#[derive(Debug)]
pub(crate) struct Windows {
    pub(crate) pool: BlockPool,
    /// The widest window of the model's layers (positions a query sees, itself included).
    reach: usize,
    /// Positions kept behind the window, so that a trim of that many (a wrong guess taken back)
    /// still finds every block the shorter sequence reads.
    slack: usize,
}

impl Windows {
    pub(crate) fn new(blocks: usize, block_size: usize, reach: usize, slack: usize) -> Self {
        Windows { pool: BlockPool::new(blocks, block_size), reach: reach.max(1), slack }
    }

    /// Window blocks that `seqs` sequences need at most when each holds its window and a step
    /// adds `step_tokens` positions over all of them: each sequence's window over at most
    /// `(reach - 1 + slack) / bs + 2` blocks, and the step's new positions over their own blocks
    /// and each sequence's one more boundary.
    pub(crate) fn bound(reach: usize, slack: usize, block_size: usize, seqs: usize, step_tokens: usize) -> usize {
        let per_seq = (reach.saturating_sub(1) + slack).div_ceil(block_size) + 1;
        seqs * (per_seq + 1) + step_tokens.div_ceil(block_size)
    }

    pub(crate) fn reach(&self) -> usize {
        self.reach
    }

    pub(crate) fn slack(&self) -> usize {
        self.slack
    }

    /// The first position a later pass of a sequence holding `len` positions can read.
    pub(crate) fn first_needed(&self, len: usize) -> usize {
        len.saturating_sub(self.reach - 1)
    }

    /// Grows `table` to `blocks` entries from the pool; on failure gives back what it took and
    /// returns false.
    pub(crate) fn grow(&mut self, table: &mut Vec<u32>, blocks: usize) -> bool {
        let had = table.len();
        while table.len() < blocks {
            match self.pool.take() {
                Some(b) => table.push(b),
                None => {
                    self.truncate(table, had);
                    return false;
                }
            }
        }
        true
    }

    /// Cuts `table` to `blocks` entries, giving back the blocks cut.
    pub(crate) fn truncate(&mut self, table: &mut Vec<u32>, blocks: usize) {
        for b in table.drain(blocks.min(table.len())..) {
            if b != FREED {
                self.pool.release(b);
            }
        }
    }

    /// Gives back the blocks of `table` that no later pass of a sequence holding `len`
    /// positions reads.
    pub(crate) fn release_behind(&mut self, table: &mut [u32], len: usize) {
        let behind = self.first_needed(len).saturating_sub(self.slack) / self.pool.block_size();
        for b in table.iter_mut().take(behind) {
            if *b != FREED {
                self.pool.release(std::mem::replace(b, FREED));
            }
        }
    }

    /// Whether every block a sequence holding `len` positions still reads is in `table`.
    pub(crate) fn holds_reach(&self, table: &[u32], len: usize) -> bool {
        let bs = self.pool.block_size();
        table.get(self.first_needed(len) / bs..len.div_ceil(bs)).is_some_and(|t| t.iter().all(|&b| b != FREED))
    }

    /// The indexed window blocks a hit of `hashes.len()` full blocks needs (those from its
    /// window's first position on), each after the prefix hashed by the one before it (the
    /// first after `root`); `None` when one is missing. `blocks` are the hit's tokens, a block
    /// each.
    pub(crate) fn lookup_tail(
        &self,
        root: u64,
        hashes: &[u64],
        computed: Computed,
        blocks: &[&[u32]],
    ) -> Option<Vec<(usize, u32)>> {
        let bs = self.pool.block_size();
        let from = self.first_needed(hashes.len() * bs) / bs;
        (from..hashes.len())
            .map(|i| {
                let parent = if i == 0 { root } else { hashes[i - 1] };
                self.pool.lookup(hashes[i], parent, computed, blocks[i]).map(|b| (i, b))
            })
            .collect()
    }
}
