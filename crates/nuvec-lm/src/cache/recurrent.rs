//! The cache of a Gated DeltaNet layer (mlx-lm's `ArraysCache(size=2)`): the last `K - 1`
//! inputs of its causal convolution and the recurrent state. Both summarize every position seen,
//! so no position can be removed: `trim(n)` with `n > 0` is an error, and a session whose prompt
//! changed starts afresh instead of trimming.

use nuvec::Array;

use super::Positions;
use crate::{Error, Result};

/// One linear-attention layer's state.
#[derive(Debug, Default, Clone)]
pub struct RecurrentCache {
    /// `[K - 1, conv channels]`: the convolution's trailing inputs.
    conv: Option<Array>,
    /// `[value heads, value dim, key dim]` f32: the delta rule's memory.
    state: Option<Array>,
    /// Positions folded into the state.
    offset: usize,
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

    /// Replaces both after a step over `n` new positions.
    pub fn update(&mut self, conv: Array, state: Array, n: usize) {
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
        Ok(RecurrentCache { conv: Some(conv), state: Some(state), offset })
    }
}

impl Positions for RecurrentCache {
    fn offset(&self) -> usize {
        self.offset
    }

    /// Only `trim(0)` succeeds: the state cannot give positions back.
    fn trim(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "cannot trim {n} positions from a recurrent (Gated DeltaNet) state: it folds all {} positions \
             together; start from an empty cache instead",
            self.offset
        )))
    }
}
