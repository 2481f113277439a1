//! Prompt-lookup speculation in the Batcher (vLLM's `ngram` method): a decoding request guesses
//! its next tokens from where its last few tokens occurred earlier in its prompt or output, the
//! step computes its last token and the guesses as rows of one pass, and the rows are verified in
//! order: each row's token is sampled exactly as a plain decode step samples it (the request's
//! processors, sampler and generator, one draw per token), and the next row counts only while
//! the token sampled equals the guess that row was fed. So a request hands out the tokens it
//! would without speculation (to the rounding of a pass of other rows), and the cache keeps the
//! guesses that were right: the rest are trimmed.
//!
//! Speculation runs only in steps that decode and nothing else, with at most
//! [`BatchSpeculation::max_decodes`] requests: there a step is bound by reading the weights, and
//! a few rows more per request cost little; a larger or prefilling step is bound by arithmetic,
//! where guessed rows would slow everyone. And a request guesses only while its recent guesses
//! are right often enough ([`BatchSpeculation::min_acceptance`]): wrong guesses cost rows and
//! give nothing, so one whose answer stopped repeating its input pauses, then tries again.

use crate::speculative::{PromptLookup, Proposer};
use crate::{Error, Result};

/// Prompt-lookup speculation for a [`crate::Batcher`] ([`crate::BatcherOptions::speculation`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BatchSpeculation {
    /// The n-gram sizes matched.
    pub lookup: PromptLookup,
    /// Tokens guessed per request and step (default 3, as `nuvec generate --num-draft-tokens`).
    pub num_draft: usize,
    /// Most decoding requests in a step that speculates: a step with more, or with a prefill
    /// chunk, decodes plainly. `None` (the default) takes [`DEFAULT_MAX_DECODES_CPU`] on the CPU,
    /// where a few more rows already cost arithmetic, and [`DEFAULT_MAX_DECODES_GPU`] on a GPU.
    pub max_decodes: Option<usize>,
    /// The share of its recent guesses a request must have had right to go on guessing (default
    /// 0.5); below it, it decodes plainly for [`PAUSE_STEPS`] steps, then tries again (each
    /// pause after a failed try twice as long, up to 16 times).
    pub min_acceptance: f64,
}

/// [`BatchSpeculation::max_decodes`]'s default on the CPU.
pub const DEFAULT_MAX_DECODES_CPU: usize = 2;
/// [`BatchSpeculation::max_decodes`]'s default on a GPU.
pub const DEFAULT_MAX_DECODES_GPU: usize = 8;
/// Steps a request whose guesses were too often wrong decodes plainly before guessing again.
pub const PAUSE_STEPS: usize = 16;
/// How much of its record a request keeps per step of guesses (the rest is the new step's).
const DECAY: f64 = 0.5;

impl Default for BatchSpeculation {
    fn default() -> Self {
        BatchSpeculation { lookup: PromptLookup::default(), num_draft: 3, max_decodes: None, min_acceptance: 0.5 }
    }
}

impl BatchSpeculation {
    /// Checks the settings, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        self.lookup.validate()?;
        if !(0.0..=1.0).contains(&self.min_acceptance) {
            return Err(Error::Invalid(format!(
                "BatcherOptions::speculation.min_acceptance = {}: give a share in [0, 1]",
                self.min_acceptance
            )));
        }
        for (name, v) in [("num_draft", self.num_draft), ("max_decodes", self.max_decodes.unwrap_or(1))] {
            if v == 0 {
                return Err(Error::Invalid(format!(
                    "BatcherOptions::speculation.{name} = 0: give at least 1 (or speculation None)"
                )));
            }
        }
        Ok(())
    }

    /// At most `room` guesses of what follows `history`.
    pub(crate) fn propose(&self, history: &[u32], room: usize) -> Result<Vec<u32>> {
        let mut drafts = self.lookup.clone().propose(history, room.min(self.num_draft))?;
        drafts.truncate(room);
        Ok(drafts)
    }
}

/// A request's record of its recent guesses, which decides whether it guesses.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Record {
    drafted: f64,
    accepted: f64,
    /// Steps left before it guesses again.
    pause: usize,
    /// Pauses in a row: the next one lasts `PAUSE_STEPS << paused` steps.
    paused: u32,
}

/// The longest pause, as a power of two times [`PAUSE_STEPS`].
const MAX_BACKOFF: u32 = 4;

impl Record {
    /// Whether the request guesses in this step (a paused one counts the step off).
    pub(crate) fn guesses(&mut self) -> bool {
        match self.pause {
            0 => true,
            _ => {
                self.pause -= 1;
                false
            }
        }
    }

    /// Records a step's `drafted` guesses, `accepted` of them right: below `min` of its recent
    /// guesses right, the request pauses and starts a fresh record afterwards.
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize, min: f64) {
        self.drafted = self.drafted * DECAY + drafted as f64;
        self.accepted = self.accepted * DECAY + accepted as f64;
        if self.accepted < min * self.drafted {
            let paused = (self.paused + 1).min(MAX_BACKOFF);
            *self = Record { pause: PAUSE_STEPS << (paused - 1), paused, ..Record::default() };
        } else {
            self.paused = 0;
        }
    }
}

/// What verifying one request's rows gave.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Verified {
    /// Tokens sampled (each taken by the request).
    pub sampled: usize,
    /// Guesses that were right (the cache keeps them).
    pub accepted: usize,
}

/// Verifies guesses `drafts` against `rows` (one per row of the pass: the last token's, then each
/// guess's, `vocab` logits each): `sample` samples a row's token and has the request take it,
/// giving the token and whether the request goes on after it (`None`: the request was over
/// before this row). Stops after the first token that is not the guess fed next, or that ended
/// the request.
pub(crate) fn verify(
    drafts: &[u32],
    rows: &[f32],
    vocab: usize,
    mut sample: impl FnMut(Vec<f32>) -> Result<Option<(u32, bool)>>,
) -> Result<Verified> {
    let mut done = Verified::default();
    for (i, row) in rows.chunks_exact(vocab).enumerate() {
        let Some((token, goes_on)) = sample(row.to_vec())? else { break };
        done.sampled += 1;
        if !goes_on || drafts.get(i) != Some(&token) {
            break;
        }
        done.accepted += 1;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argmax(row: &[f32]) -> u32 {
        row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
    }

    /// Rows whose greedy tokens are `tokens`, over a vocabulary of 4.
    fn rows(tokens: &[u32]) -> Vec<f32> {
        tokens.iter().flat_map(|&t| (0..4).map(move |v| if v == t { 1.0 } else { 0.0 })).collect()
    }

    #[test]
    fn guesses_count_up_to_the_first_wrong_one() {
        let greedy = |row: Vec<f32>| Ok(Some((argmax(&row), true)));
        // Row 0 gives 2 (guess 0 right), row 1 gives 3 (guess 1 wrong): two tokens, one kept.
        assert_eq!(verify(&[2, 1], &rows(&[2, 3, 0]), 4, greedy).unwrap(), Verified { sampled: 2, accepted: 1 });
        // Every guess right: the row after the last guess gives one token more.
        assert_eq!(verify(&[2, 1], &rows(&[2, 1, 0]), 4, greedy).unwrap(), Verified { sampled: 3, accepted: 2 });
        // The first token wrong: one token, nothing kept.
        assert_eq!(verify(&[2, 1], &rows(&[0, 1, 0]), 4, greedy).unwrap(), Verified { sampled: 1, accepted: 0 });
    }

    #[test]
    fn a_request_that_ends_takes_no_more_rows() {
        // Its first token (the right guess) ends it: taken, the rest not sampled.
        let ends = |row: Vec<f32>| Ok(Some((argmax(&row), false)));
        assert_eq!(verify(&[2, 1], &rows(&[2, 1, 0]), 4, ends).unwrap(), Verified { sampled: 1, accepted: 0 });
        // Over before the first row: nothing.
        let over = |_: Vec<f32>| Ok(None);
        assert_eq!(verify(&[2, 1], &rows(&[2, 1, 0]), 4, over).unwrap(), Verified::default());
    }

    #[test]
    fn a_request_whose_guesses_are_wrong_pauses_then_tries_again() {
        let mut r = Record::default();
        assert!(r.guesses());
        r.record(3, 2, 0.5);
        assert!(r.guesses(), "two of three right");
        r.record(3, 2, 0.5);
        assert!(r.guesses(), "three of 4.5 (decayed) right");
        r.record(3, 0, 0.5);
        let paused = (0..PAUSE_STEPS).filter(|_| !r.guesses()).count();
        assert_eq!(paused, PAUSE_STEPS, "1.5 of 5.25 right: paused");
        assert!(r.guesses(), "and then it guesses again");
        // Wrong again: a pause twice as long; right: the next pause is short again.
        r.record(3, 0, 0.5);
        assert_eq!((0..4 * PAUSE_STEPS).filter(|_| !r.guesses()).count(), 2 * PAUSE_STEPS);
        r.record(3, 3, 0.5);
        r.record(3, 0, 0.5);
        assert_eq!((0..4 * PAUSE_STEPS).filter(|_| !r.guesses()).count(), PAUSE_STEPS);
    }

    #[test]
    fn proposals_stay_within_the_room() {
        let s = BatchSpeculation { num_draft: 3, ..Default::default() };
        let history = [5, 6, 7, 8, 9, 5, 6];
        assert_eq!(s.propose(&history, 10).unwrap(), vec![7, 8, 9]);
        assert_eq!(s.propose(&history, 1).unwrap(), vec![7]);
        assert_eq!(s.propose(&history, 0).unwrap(), Vec::<u32>::new());
        assert!(BatchSpeculation { num_draft: 0, ..Default::default() }.validate().is_err());
    }
}
