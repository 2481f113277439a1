//! The cache of a Gated DeltaNet layer (mlx-lm's `ArraysCache(size=2)`): the last `K - 1`
//! inputs of its causal convolution and the recurrent state. Both summarize every position seen,
//! so a position can be given back only where the state from before it was kept: speculative
//! decoding asks for the last few ([`RecurrentCache::keep_rewind`]) and its verification passes
//! then advance the state one position at a time, keeping each earlier one. Any other `trim(n)`
//! with `n > 0` is an error, and a session whose prompt changed starts afresh instead.

use std::collections::VecDeque;

use nuvec::Array;

use super::Positions;
use crate::{Error, Result};

/// The state as it was before position `offset`.
#[derive(Debug, Clone)]
struct Earlier {
    conv: Option<Array>,
    state: Option<Array>,
    offset: usize,
}

/// One linear-attention layer's state.
#[derive(Debug, Default, Clone)]
pub struct RecurrentCache {
    /// `[K - 1, conv channels]`: the convolution's trailing inputs.
    conv: Option<Array>,
    /// `[value heads, value dim, key dim]` f32: the delta rule's memory.
    state: Option<Array>,
    /// Positions folded into the state.
    offset: usize,
    /// How many positions a trim may give back (0: none).
    rewind: usize,
    /// The states replaced by the last updates, oldest first, at most `rewind` of them (the
    /// arrays are shared, not copied: an update replaces a state, it never writes into one).
    earlier: VecDeque<Earlier>,
}

impl RecurrentCache {
    /// An empty cache (the layer starts from zeros).
    pub fn new() -> Self {
        Self::default()
    }

    /// The convolution's trailing inputs and the recurrent state, `None` before the first step.
    pub fn state(&self) -> Option<(&Array, &Array)> {
        self.conv.as_ref().zip(self.state.as_ref())
    }

    /// Keeps the states of the last `n` positions from now on, so that a trim of up to `n`
    /// positions added one at a time (see [`RecurrentCache::steps_one_by_one`]) is exact.
    pub fn keep_rewind(&mut self, n: usize) {
        self.rewind = n;
        while self.earlier.len() > n {
            self.earlier.pop_front();
        }
    }

    /// Whether a step of `rows` positions should advance the state one position at a time:
    /// a pass short enough to be taken back (a speculative verification), when rewinds are kept.
    /// Longer passes (prefill chunks) go through at once and cannot be taken back.
    pub fn steps_one_by_one(&self, rows: usize) -> bool {
        self.rewind > 0 && rows > 1 && rows <= self.rewind + 1
    }

    /// Replaces both after a step over `n` new positions.
    pub fn update(&mut self, conv: Array, state: Array, n: usize) {
        if self.rewind > 0 {
            if self.earlier.len() == self.rewind {
                self.earlier.pop_front();
            }
            self.earlier.push_back(Earlier { conv: self.conv.take(), state: self.state.take(), offset: self.offset });
        }
        self.conv = Some(conv);
        self.state = Some(state);
        self.offset += n;
    }

    /// A cache holding `conv` and `state` after `offset` positions (a prompt-cache file's).
    pub fn from_state(conv: Array, state: Array, offset: usize) -> Result<Self> {
        if conv.shape().len() != 2 || state.shape().len() != 3 || offset == 0 {
            return Err(Error::Invalid(format!(
                "a recurrent state of conv {:?} and state {:?} after {offset} positions is not \
                 [K-1, channels] and [heads, value dim, key dim] after at least one position",
                conv.shape(),
                state.shape()
            )));
        }
        Ok(RecurrentCache { conv: Some(conv), state: Some(state), offset, ..Default::default() })
    }

    /// The same state without the earlier ones kept for a rewind (what a prefix checkpoint
    /// holds).
    pub fn settled(&self) -> Self {
        RecurrentCache { conv: self.conv.clone(), state: self.state.clone(), offset: self.offset, ..Default::default() }
    }

    /// Whether `trim(n)` would succeed.
    pub fn can_trim(&self, n: usize) -> bool {
        n == 0 || self.earlier.iter().any(|e| e.offset + n == self.offset)
    }
}

impl Positions for RecurrentCache {
    fn offset(&self) -> usize {
        self.offset
    }

    /// Gives back the last `n` positions when the state from before them was kept; otherwise
    /// an error, the cache unchanged.
    fn trim(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let Some(at) = self.earlier.iter().position(|e| e.offset + n == self.offset) else {
            return Err(Error::Invalid(format!(
                "cannot trim {n} positions from a recurrent (Gated DeltaNet) state: it folds all {} positions \
                 together and kept no state from before the last {n}; start from an empty cache instead",
                self.offset
            )));
        };
        let back = self.earlier.drain(at..).next().expect("found");
        self.conv = back.conv;
        self.state = back.state;
        self.offset = back.offset;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(v: f32) -> (Array, Array) {
        (Array::from_slice(&[v; 2], &[1, 2]).unwrap(), Array::from_slice(&[v; 2], &[1, 1, 2]).unwrap())
    }

    fn value(c: &RecurrentCache) -> f32 {
        c.state().unwrap().1.to_vec::<f32>().unwrap()[0]
    }

    #[test]
    fn a_kept_state_is_given_back_exactly_and_only_that() {
        let mut c = RecurrentCache::new();
        let (conv, s) = state(1.0);
        c.update(conv, s, 10);
        assert!(c.trim(1).is_err(), "nothing kept");
        c.keep_rewind(3);
        assert!(c.steps_one_by_one(4) && !c.steps_one_by_one(5) && !c.steps_one_by_one(1));
        for v in 2..=5 {
            let (conv, s) = state(v as f32);
            c.update(conv, s, 1);
        }
        // Offsets 11..=14 were added one by one; only the last 3 states before them are kept.
        assert_eq!(c.offset(), 14);
        assert!(!c.can_trim(4) && c.can_trim(3));
        assert!(c.trim(4).is_err());
        assert_eq!((c.offset(), value(&c)), (14, 5.0), "an error leaves it unchanged");
        c.trim(2).unwrap();
        assert_eq!((c.offset(), value(&c)), (12, 3.0));
        assert!(c.trim(2).is_err(), "the states after the one restored went with it");
        c.trim(1).unwrap();
        assert_eq!((c.offset(), value(&c)), (11, 2.0));
        // A chunk of several positions at once can be taken back only whole.
        let (conv, s) = state(9.0);
        c.update(conv, s, 4);
        assert!(c.trim(2).is_err());
        c.trim(4).unwrap();
        assert_eq!((c.offset(), value(&c)), (11, 2.0));
    }
}
