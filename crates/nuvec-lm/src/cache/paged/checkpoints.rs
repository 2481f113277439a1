//! Recurrent-state checkpoints for prefix hits on hybrid models (Qwen3.5's Gated DeltaNet
//! layers). A shared prefix of attention blocks is not enough there: the recurrent layers fold
//! every position into one state, so a hit also needs that state as it was where the hit ends.
//! When a pass of several rows ends on a block boundary, the sequence's recurrent states are kept
//! under the hash of the block that ends there (the arrays are shared, not copied: a step
//! replaces a state, it never writes into one), bounded in bytes, least recently used dropped
//! first. A hit may end only on a block that has one.

use std::collections::HashMap;

use crate::cache::RecurrentCache;

/// Bytes of checkpoints a paged cache keeps by default.
pub const DEFAULT_CHECKPOINT_BYTES: usize = 256 << 20;

/// One block boundary's recurrent states, by layer.
#[derive(Debug)]
struct Entry {
    states: Vec<(usize, RecurrentCache)>,
    bytes: usize,
    used: u64,
}

/// The checkpoints of one paged cache.
#[derive(Debug)]
pub(crate) struct Checkpoints {
    entries: HashMap<u64, Entry>,
    bytes: usize,
    limit: usize,
    clock: u64,
}

impl Checkpoints {
    pub(crate) fn new(limit: usize) -> Self {
        Checkpoints { entries: HashMap::new(), bytes: 0, limit, clock: 0 }
    }

    /// Drops every checkpoint and keeps at most `limit` bytes from now on.
    pub(crate) fn reset(&mut self, limit: usize) {
        *self = Checkpoints::new(limit);
    }

    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.entries.contains_key(&hash)
    }

    /// Keeps `states` (layer index, state) under `hash`, dropping the least recently used
    /// checkpoints to stay within the limit (a checkpoint larger than the limit is not kept).
    pub(crate) fn insert(&mut self, hash: u64, states: Vec<(usize, RecurrentCache)>) {
        let bytes = states.iter().map(|(_, s)| state_bytes(s)).sum();
        if bytes > self.limit || self.entries.contains_key(&hash) {
            return;
        }
        while self.bytes + bytes > self.limit {
            let oldest = self.entries.iter().min_by_key(|(_, e)| e.used).map(|(&h, _)| h);
            let Some(oldest) = oldest else { break };
            let e = self.entries.remove(&oldest).expect("just found");
            self.bytes -= e.bytes;
        }
        self.clock += 1;
        self.bytes += bytes;
        self.entries.insert(hash, Entry { states, bytes, used: self.clock });
    }

    /// The states kept under `hash` (shared), marked as used now.
    pub(crate) fn get(&mut self, hash: u64) -> Option<Vec<(usize, RecurrentCache)>> {
        self.clock += 1;
        let e = self.entries.get_mut(&hash)?;
        e.used = self.clock;
        Some(e.states.clone())
    }
}

fn state_bytes(s: &RecurrentCache) -> usize {
    s.state().map_or(0, |(conv, state)| conv.len() * conv.dtype().size() + state.len() * state.dtype().size())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nuvec::Array;

    fn state(values: usize) -> RecurrentCache {
        let conv = Array::from_slice(&vec![0f32; values], &[1, values]).unwrap();
        let s = Array::from_slice(&vec![0f32; values], &[1, 1, values]).unwrap();
        RecurrentCache::from_state(conv, s, 1).unwrap()
    }

    #[test]
    fn the_least_recently_used_go_first_and_the_bytes_stay_bounded() {
        // Each checkpoint: 2 x 16 f32 = 128 bytes; room for three.
        let mut c = Checkpoints::new(400);
        for h in 1..=3 {
            c.insert(h, vec![(0, state(16))]);
        }
        assert!(c.get(1).is_some(), "1 is now the most recent");
        c.insert(4, vec![(0, state(16))]);
        assert!(!c.contains(2) && c.contains(1) && c.contains(3) && c.contains(4));
        c.insert(5, vec![(0, state(64))]);
        assert!(!c.contains(5), "larger than the whole limit");
        c.reset(100);
        assert!(!c.contains(1));
    }
}
