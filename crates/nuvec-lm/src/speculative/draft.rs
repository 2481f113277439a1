//! A draft model's proposals: a smaller model of the same tokenizer decodes the guesses greedily
//! from its own cache, which follows the history (kept where it agrees, trimmed exactly and
//! extended where it does not), as mlx_lm.generate's `--draft-model`.

use super::guesser::Guesser;
use super::proposer::Proposer;
use crate::cache::LayerCache;
use crate::models::Model;
use crate::sample::Sampler;
use crate::session::Session;
use crate::Result;

/// Proposes what `model` would say next, greedily.
pub struct DraftModel<'a> {
    model: &'a Model,
    session: Session,
    prefill_step: usize,
    /// Positions its recurrent layers (if any) can give back.
    rewind: usize,
    /// How it chooses its guesses.
    guesser: Guesser,
}

impl<'a> DraftModel<'a> {
    /// A proposer over `model` (its tokenizer must be the target's: compare them with
    /// [`crate::Tokenizer::differs_from`]), prefilling `prefill_step` tokens per pass.
    pub fn new(model: &'a Model, prefill_step: usize) -> Result<Self> {
        let session = Session::new(model);
        Ok(DraftModel { model, session, prefill_step: prefill_step.max(1), rewind: 0, guesser: Guesser::greedy() })
    }

    /// A proposer that draws its guesses from `model`'s distribution under `sampler` (its
    /// generator seeded with `seed`, or from the system's entropy) instead of picking them
    /// greedily: with a sampling target the rejection rule then takes more of them (see
    /// [`crate::speculative`]). A greedy `sampler` (temperature 0) picks, as [`DraftModel::new`].
    pub fn sampling(model: &'a Model, prefill_step: usize, sampler: Sampler, seed: Option<u64>) -> Result<Self> {
        let guesser = Guesser::sampling(sampler, seed)?;
        Ok(DraftModel { guesser, ..DraftModel::new(model, prefill_step)? })
    }
}

impl Proposer for DraftModel<'_> {
    fn drawn_from(&self) -> Option<&[Vec<f64>]> {
        self.guesser.drawn_from()
    }

    fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        if k == 0 || history.is_empty() {
            return Ok(vec![]);
        }
        // At most the k - 1 guesses it was fed one at a time are taken back: recurrent layers
        // keep the states from before them, sliding windows what each overwrote in the ring.
        if k > self.rewind {
            self.rewind = k;
            for cache in &mut self.session.cache {
                match cache {
                    LayerCache::Recurrent(c) => c.keep_rewind(k),
                    LayerCache::Rotating(c) => c.keep_steps(k),
                    LayerCache::QuantizedRotating(c) => c.keep_steps(k),
                    _ => {}
                }
            }
        }
        // The draft's cache holds what it agrees with of the history, but never the last token,
        // which the first guess is computed from.
        let held = self.session.tokens();
        let common = kept_prefix(held, history);
        self.session.trim(held.len() - common)?;
        // What it lacks goes in with the first guess's pass when it fits a prefill step: after a
        // step whose guesses were all taken that is the last guess (never fed back) and the
        // target's token, one pass instead of two.
        let pending = &history[common..];
        let split = if pending.len() <= self.prefill_step { 0 } else { pending.len() - 1 };
        self.session.prefill(self.model, &pending[..split], self.prefill_step, &Default::default())?;
        let mut input = pending[split..].to_vec();
        let mut guesses = Vec::with_capacity(k);
        self.guesser.clear();
        for _ in 0..k {
            let logits = self.model.forward_last(&input, &mut self.session.cache)?;
            self.session.tokens.extend_from_slice(&input);
            let guess = self.guesser.pick(&logits)?;
            guesses.push(guess);
            input.clear();
            input.push(guess);
        }
        Ok(guesses)
    }
}

/// How much of what a draft's cache `held` it keeps to follow `history`: the tokens both agree
/// on, never the history's last token, which goes in with the next guess's pass.
pub(crate) fn kept_prefix(held: &[u32], history: &[u32]) -> usize {
    held.iter().zip(history).take_while(|(a, b)| a == b).count().min(history.len().saturating_sub(1))
}
