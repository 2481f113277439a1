//! A multi-token-prediction head's proposals ([`crate::LoadOptions::mtp`]): the checkpoint's
//! own head, beside the target, guesses the token after next from the target's final hidden
//! state, as vLLM's and llama.cpp's MTP speculation do. Its cache follows the verified history:
//! each position the target keeps is run through the head once, with the target's hidden state
//! there and the token that followed; a proposal then chains the head on its own guesses (its own
//! output standing in for the target's hidden state), and those positions are taken back before
//! the next proposal. The head picks greedily.

use nuvec::Array;

use super::proposer::Proposer;
use crate::cache::LayerCache;
use crate::models::Model;
use crate::{Error, Result};

/// Proposes what `model`'s multi-token-prediction head guesses, greedily.
pub struct MtpHead<'a> {
    model: &'a Model,
    cache: Vec<LayerCache>,
    /// Positions run through the head with the target's hidden states (its cache holds them,
    /// and after a proposal, the positions of its chained guesses).
    committed: usize,
    /// The target's hidden states observed since, for positions `committed..`.
    pending: Vec<Array>,
    pending_rows: usize,
    /// The head's output at position `committed - 1`: its next guess's logits come from it.
    last: Option<Array>,
    /// The history tokens the committed positions read (`0..=committed`).
    seen: Vec<u32>,
}

impl<'a> MtpHead<'a> {
    /// A proposer over `model`'s multi-token-prediction head (an error when none was loaded).
    pub fn new(model: &'a Model) -> Result<Self> {
        let cache = model.new_mtp_cache()?;
        Ok(MtpHead { model, cache, committed: 0, pending: vec![], pending_rows: 0, last: None, seen: vec![] })
    }

    /// Runs the head over the observed positions, with the history's tokens after each.
    fn catch_up(&mut self, history: &[u32]) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let (from, to) = (self.committed, self.committed + self.pending_rows);
        if to >= history.len() {
            return Err(Error::Invalid(format!(
                "the multi-token-prediction head was given hidden states up to position {to} of a history of {}",
                history.len()
            )));
        }
        let target = crate::step::concat_rows(&std::mem::take(&mut self.pending))?;
        let out = self.model.mtp_hidden(&history[from + 1..=to], &target, &mut self.cache)?;
        self.committed = to;
        self.pending_rows = 0;
        self.seen = history[..=to].to_vec();
        self.last = Some(out.slice_rows(out.dim(0) - 1, out.dim(0))?);
        Ok(())
    }

    /// The head's greedy guess from its output row `h`.
    fn guess(&self, h: &Array) -> Result<u32> {
        Ok(self.model.logits(h)?.argmax()?.to_vec::<u32>()?[0])
    }
}

impl Proposer for MtpHead<'_> {
    fn wants_hidden(&self) -> bool {
        true
    }

    fn observe(&mut self, first: usize, hidden: &Array) -> Result<()> {
        let expected = self.committed + self.pending_rows;
        if first != expected {
            return Err(Error::Invalid(format!(
                "the multi-token-prediction head was given hidden states from position {first}; it needs them \
                 from {expected} on, without gaps"
            )));
        }
        if hidden.dim(0) > 0 {
            self.pending_rows += hidden.dim(0);
            self.pending.push(hidden.clone());
        }
        Ok(())
    }

    fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        if !history.starts_with(&self.seen) {
            return Err(Error::Invalid(
                "the history changed under the multi-token-prediction head: it follows one generation".into(),
            ));
        }
        // The positions of the last proposal's chained guesses go: the target's own states
        // replace them.
        let held = self.cache[0].offset();
        if held > self.committed {
            self.cache[0].trim(held - self.committed)?;
        }
        self.catch_up(history)?;
        // A guess for the token after the history's last needs every position before that one.
        let Some(mut h) = self.last.clone().filter(|_| k > 0 && self.committed + 1 == history.len()) else {
            return Ok(vec![]);
        };
        let mut guesses = vec![self.guess(&h)?];
        while guesses.len() < k {
            h = self.model.mtp_hidden(&guesses[guesses.len() - 1..], &h, &mut self.cache)?;
            guesses.push(self.guess(&h)?);
        }
        Ok(guesses)
    }
}
