//! What proposes the tokens a speculative step verifies.

/// Proposes up to `k` tokens likely to follow `history` (the prompt and the output so far).
/// Proposals only decide how many positions one forward pass of the target verifies: every
/// token handed out is the target's own, so a poor proposer costs speed, never correctness.
pub trait Proposer {
    /// Up to `k` tokens to follow `history` (none: the step decodes one token as usual).
    fn propose(&mut self, history: &[u32], k: usize) -> crate::Result<Vec<u32>>;

    /// The distributions the last proposal's tokens were drawn from, one per token (their
    /// probability per vocabulary id), for the rejection rule; `None` (the default) when they
    /// were picked (lookup, a greedy draft): the target then takes a guess only where its own
    /// draw is the guess.
    fn drawn_from(&self) -> Option<&[Vec<f64>]> {
        None
    }

    /// After a step: `accepted` of the last proposal's tokens were taken (its state, if any,
    /// rewinds to them).
    fn accepted(&mut self, _accepted: usize) -> crate::Result<()> {
        Ok(())
    }

    /// Whether it reads the target's final hidden states ([`Proposer::observe`]), as a
    /// multi-token-prediction head does; the target then hands them over (false by default).
    fn wants_hidden(&self) -> bool {
        false
    }

    /// The target's final hidden states `[rows, hidden]` of history positions `first..first +
    /// rows`, once those positions are verified (the prompt's, then each step's pending token
    /// and accepted guesses), in order and without gaps.
    fn observe(&mut self, _first: usize, _hidden: &nuvec::Array) -> crate::Result<()> {
        Ok(())
    }
}
