//! A draft model's proposals: a smaller model of the same tokenizer decodes the guesses greedily
//! from its own cache, which follows the history (kept where it agrees, trimmed exactly and
//! extended where it does not), as mlx_lm.generate's `--draft-model`.

use super::proposer::Proposer;
use crate::cache::LayerCache;
use crate::models::Model;
use crate::session::Session;
use crate::{Error, Result};

/// Proposes what `model` would say next, greedily.
pub struct DraftModel<'a> {
    model: &'a Model,
    session: Session,
    prefill_step: usize,
    /// Positions its recurrent layers (if any) can give back.
    rewind: usize,
}

impl<'a> DraftModel<'a> {
    /// A proposer over `model` (its tokenizer must be the target's: compare them with
    /// [`crate::Tokenizer::differs_from`]), prefilling `prefill_step` tokens per pass.
    pub fn new(model: &'a Model, prefill_step: usize) -> Result<Self> {
        let session = Session::new(model);
        // The draft decodes its guesses one position at a time: a ring written in place cannot
        // take them back (a recurrent layer can: it keeps the states before its last guesses).
        if session.cache().iter().any(|c| matches!(c, LayerCache::Rotating(_))) {
            return Err(Error::Invalid(format!(
                "a {} draft model keeps sliding-window caches, which cannot take back guesses decoded one at a \
                 time: not supported yet as a draft (a model without sliding-window layers is)",
                model.model_type()
            )));
        }
        Ok(DraftModel { model, session, prefill_step: prefill_step.max(1), rewind: 0 })
    }
}

impl Proposer for DraftModel<'_> {
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        if k == 0 || history.is_empty() {
            return Ok(vec![]);
        }
        // At most the k - 1 guesses it was fed one at a time are taken back.
        if k > self.rewind {
            self.rewind = k;
            for cache in &mut self.session.cache {
                if let LayerCache::Recurrent(c) = cache {
                    c.keep_rewind(k);
                }
            }
        }
        // The draft's cache holds what it agrees with of the history, but never the last token,
        // which the first guess is computed from.
        let held = self.session.tokens();
        let common = held.iter().zip(history).take_while(|(a, b)| a == b).count().min(history.len() - 1);
        self.session.trim(held.len() - common)?;
        // What it lacks goes in with the first guess's pass when it fits a prefill step: after a
        // step whose guesses were all taken that is the last guess (never fed back) and the
        // target's token, one pass instead of two.
        let pending = &history[common..];
        let split = if pending.len() <= self.prefill_step { 0 } else { pending.len() - 1 };
        self.session.prefill(self.model, &pending[..split], self.prefill_step, &Default::default())?;
        let mut input = pending[split..].to_vec();
        let mut guesses = Vec::with_capacity(k);
        for _ in 0..k {
            let logits = self.model.forward_last(&input, &mut self.session.cache)?;
            self.session.tokens.extend_from_slice(&input);
            let guess = logits.argmax()?.to_vec::<u32>()?[0];
            guesses.push(guess);
            input.clear();
            input.push(guess);
        }
        Ok(guesses)
    }
}
