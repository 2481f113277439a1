//! One request's walk through its grammar.

use llguidance::{Matcher, TokenParser};

use crate::{Error, Result};

/// Where one request stands in its grammar: the tokens it may take next, and each token it took.
pub(crate) struct TokenMask {
    matcher: Matcher,
    /// The vocabulary's end-of-sequence id (the one llguidance's masks speak of).
    eos: u32,
}

impl TokenMask {
    pub(super) fn new(parser: TokenParser, eos: u32) -> Result<Self> {
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::Invalid(format!("starting the constraint: {e}")));
        }
        Ok(TokenMask { matcher, eos })
    }

    /// Sets every entry of `logprobs` the grammar does not allow next to minus infinity; the
    /// request's end-of-sequence ids `eos` keep theirs exactly when the grammar may end here.
    pub(crate) fn apply(&mut self, logprobs: &mut [f32], eos: &[u32]) -> Result<()> {
        let mask = self.matcher.compute_mask().map_err(|e| Error::Invalid(format!("the constraint failed: {e}")))?;
        let may_end = mask.is_allowed(self.eos);
        let kept: Vec<(usize, f32)> =
            eos.iter().filter_map(|&t| logprobs.get(t as usize).map(|&v| (t as usize, v))).collect();
        let known = mask.len().min(logprobs.len());
        for (i, v) in logprobs[..known].iter_mut().enumerate() {
            if !mask.get(i) {
                *v = f32::NEG_INFINITY;
            }
        }
        logprobs[known..].fill(f32::NEG_INFINITY);
        for (t, v) in kept {
            logprobs[t] = if may_end { v } else { f32::NEG_INFINITY };
        }
        if logprobs.iter().all(|v| *v == f32::NEG_INFINITY) {
            return Err(Error::Invalid(
                "the constraint allows no token here that the model can take (its allowed tokens are banned, \
                 e.g. by a logit bias of -inf, or end-of-sequence is ignored where only it fits)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Takes `token` (not an end-of-sequence id) into the grammar.
    pub(crate) fn commit(&mut self, token: u32) -> Result<()> {
        self.matcher
            .consume_token(token)
            .map_err(|e| Error::Invalid(format!("the constraint refused token {token}: {e}")))
    }

    /// Whether the grammar is complete: nothing may follow but the end.
    pub(crate) fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}
