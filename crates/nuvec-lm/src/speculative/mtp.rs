//! A multi-token-prediction head's proposals ([`crate::LoadOptions::mtp`]): the checkpoint's
//! own head, beside the target, guesses the token after next from the target's final hidden
//! state, as vLLM's and llama.cpp's MTP speculation do. Its cache follows the verified history:
//! each position the target keeps is run through the head once, with the target's hidden state
//! there and the token that followed; a proposal then chains the head on its own guesses (its own
//! output standing in for the target's hidden state), and those positions are taken back before
//! the next proposal. The head picks greedily, or draws its guesses under a sampler
//! ([`MtpHead::sampling`]) for the rejection rule.
//!
//! A sequence's head may start after position 0 (a Batcher request whose prompt began in cached
//! blocks, whose hidden states were never computed): it then attends to the positions from the
//! first it was shown. Its cache counts positions from there, which leaves every rotary angle
//! between a query and a key, and so the attention, as it would be at the absolute positions.

use nuvec::Array;

use super::guesser::Guesser;
use super::proposer::Proposer;
use crate::cache::LayerCache;
use crate::models::Model;
use crate::sample::Sampler;
use crate::step::StepBatch;
use crate::{Error, Result};

/// One sequence's head: its cache over the verified positions it was shown, and what it has
/// been shown since it last ran.
pub(crate) struct MtpState {
    cache: Vec<LayerCache>,
    /// The first position it was shown (`None`: none yet).
    base: Option<usize>,
    /// Positions `base..committed` were run through the head with the target's hidden states
    /// (its cache holds them first, then after a proposal its chained guesses').
    committed: usize,
    /// The target's hidden states shown since, for positions `committed..`.
    pending: Vec<Array>,
    pending_rows: usize,
    /// The head's output at position `committed - 1`: its next guess's logits come from it.
    last: Option<Array>,
    /// The last history token the committed positions read (at position `committed`).
    read: Option<u32>,
}

impl MtpState {
    pub(crate) fn new(model: &Model) -> Result<Self> {
        let cache = model.new_mtp_cache()?;
        Ok(MtpState { cache, base: None, committed: 0, pending: vec![], pending_rows: 0, last: None, read: None })
    }

    /// The target's hidden states `[rows, hidden]` of positions `first..`: the next ones it
    /// lacks (or the first it is shown).
    pub(crate) fn observe(&mut self, first: usize, hidden: &Array) -> Result<()> {
        if self.base.is_none() {
            self.base = Some(first);
            self.committed = first;
        }
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

    /// Whether `history` goes on from what the positions it ran read (a history only grows: its
    /// last token read is still there).
    pub(crate) fn follows(&self, history: &[u32]) -> bool {
        self.read.is_none_or(|t| history.get(self.committed) == Some(&t))
    }

    /// Takes back the positions of the last proposal's chained guesses, and gives what it must
    /// run to catch up with `history` (the tokens after each shown position, and the target's
    /// hidden states there), if anything.
    pub(crate) fn catch_up_input(&mut self, history: &[u32]) -> Result<Option<(Vec<u32>, Array)>> {
        let Some(base) = self.base else { return Ok(None) };
        let held = self.cache[0].offset();
        if held > self.committed - base {
            self.cache[0].trim(held - (self.committed - base))?;
        }
        if self.pending.is_empty() {
            return Ok(None);
        }
        let (from, to) = (self.committed, self.committed + self.pending_rows);
        if to >= history.len() {
            return Err(Error::Invalid(format!(
                "the multi-token-prediction head was given hidden states up to position {to} of a history of {}",
                history.len()
            )));
        }
        let target = crate::step::concat_rows(&std::mem::take(&mut self.pending))?;
        Ok(Some((history[from + 1..=to].to_vec(), target)))
    }

    /// After the head ran the catch-up input (its outputs `out`, one row per position).
    pub(crate) fn caught_up(&mut self, out: &Array, history: &[u32]) -> Result<()> {
        self.committed += self.pending_rows;
        self.pending_rows = 0;
        self.read = history.get(self.committed).copied();
        self.last = Some(out.slice_rows(out.dim(0) - 1, out.dim(0))?);
        Ok(())
    }

    /// The head's output the first guess after `history` comes from, when it has caught up
    /// with every position before the history's last.
    pub(crate) fn ready(&self, history: &[u32]) -> Option<&Array> {
        self.last.as_ref().filter(|_| self.committed + 1 == history.len())
    }

    pub(crate) fn cache(&mut self) -> &mut [LayerCache] {
        &mut self.cache
    }

    /// The first position it was shown.
    pub(crate) fn base(&self) -> Option<usize> {
        self.base
    }
}

/// The head's greedy guesses from its output rows `h` (`[rows, hidden]`), one per row.
pub(crate) fn guesses(model: &Model, h: &Array) -> Result<Vec<u32>> {
    Ok(model.logits(h)?.argmax()?.to_vec::<u32>()?)
}

/// Runs the head over several sequences' rows in one pass: each sequence's `tokens`, the
/// target's (or its own) hidden states `target` of all rows in order. Returns the outputs of
/// all rows.
pub(crate) fn run(model: &Model, work: &mut [(&[u32], &mut [LayerCache])], target: &Array) -> Result<Array> {
    let mut step = StepBatch::new();
    for (tokens, cache) in work.iter_mut() {
        step.push(tokens, cache)?;
    }
    model.mtp_step(&mut step, target)
}

/// Proposes what `model`'s multi-token-prediction head guesses.
pub struct MtpHead<'a> {
    model: &'a Model,
    state: MtpState,
    guesser: Guesser,
}

impl<'a> MtpHead<'a> {
    /// A proposer over `model`'s multi-token-prediction head (an error when none was loaded),
    /// picking its guesses greedily.
    pub fn new(model: &'a Model) -> Result<Self> {
        Ok(MtpHead { model, state: MtpState::new(model)?, guesser: Guesser::greedy() })
    }

    /// A proposer that draws the head's guesses from its distribution under `sampler` (its
    /// generator seeded with `seed`, or from the system's entropy) instead of picking them, as
    /// [`super::DraftModel::sampling`]: with a sampling target the rejection rule then takes more
    /// of them and the output keeps the target's distribution. A greedy `sampler` picks.
    pub fn sampling(model: &'a Model, sampler: Sampler, seed: Option<u64>) -> Result<Self> {
        Ok(MtpHead { guesser: Guesser::sampling(sampler, seed)?, ..MtpHead::new(model)? })
    }
}

impl Proposer for MtpHead<'_> {
    fn drawn_from(&self) -> Option<&[Vec<f64>]> {
        self.guesser.drawn_from()
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn observe(&mut self, first: usize, hidden: &Array) -> Result<()> {
        self.state.observe(first, hidden)
    }

    fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        if !self.state.follows(history) {
            return Err(Error::Invalid(
                "the history changed under the multi-token-prediction head: it follows one generation".into(),
            ));
        }
        if let Some((tokens, target)) = self.state.catch_up_input(history)? {
            let out = self.model.mtp_hidden(&tokens, &target, self.state.cache())?;
            self.state.caught_up(&out, history)?;
        }
        self.guesser.clear();
        let Some(mut h) = self.state.ready(history).filter(|_| k > 0).cloned() else {
            return Ok(vec![]);
        };
        let mut chain = vec![self.guesser.pick(&self.model.logits(&h)?)?];
        while chain.len() < k {
            h = self.model.mtp_hidden(&chain[chain.len() - 1..], &h, self.state.cache())?;
            chain.push(self.guesser.pick(&self.model.logits(&h)?)?);
        }
        Ok(chain)
    }
}
