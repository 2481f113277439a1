//! How a model-backed proposer (a draft model, a multi-token-prediction head) turns its logits
//! into guesses: picked greedily, or drawn under a sampler with each guess's distribution kept for
//! the rejection rule ([`super::Proposer::drawn_from`]).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::sample::{argmax, draw, log_softmax, Sampler};
use crate::Result;

/// Greedy picks, or draws under a sampler with their own generator.
pub(crate) struct Guesser {
    sampling: Option<(Sampler, ChaCha8Rng)>,
    /// The distributions the current proposal's guesses were drawn from, one per guess.
    drawn: Vec<Vec<f64>>,
}

impl Guesser {
    pub(crate) fn greedy() -> Self {
        Guesser { sampling: None, drawn: vec![] }
    }

    /// Draws under `sampler` (validated), the generator seeded with `seed` or from the system's
    /// entropy. A greedy sampler (temperature 0) picks.
    pub(crate) fn sampling(sampler: Sampler, seed: Option<u64>) -> Result<Self> {
        sampler.validate()?;
        let rng = seed.map_or_else(ChaCha8Rng::from_entropy, ChaCha8Rng::seed_from_u64);
        Ok(Guesser { sampling: Some((sampler, rng)), drawn: vec![] })
    }

    /// Whether guesses are drawn (then [`Guesser::guess`] needs each logits row on the host).
    pub(crate) fn draws(&self) -> bool {
        self.sampling.as_ref().is_some_and(|(s, _)| s.temperature > 0.0)
    }

    /// A new proposal begins.
    pub(crate) fn clear(&mut self) {
        self.drawn.clear();
    }

    /// The next guess from a logits row: drawn (noting its distribution) or picked.
    pub(crate) fn guess(&mut self, row: &[f32]) -> u32 {
        if let Some((sampler, rng)) = &mut self.sampling {
            let mut logprobs = log_softmax(row);
            if let Some(q) = sampler.distribution(&mut logprobs, &[], rng) {
                let guess = draw(&q, rng);
                self.drawn.push(q);
                return guess;
            }
        }
        argmax(row)
    }

    /// The distributions the current proposal was drawn from, when it draws.
    pub(crate) fn drawn_from(&self) -> Option<&[Vec<f64>]> {
        self.draws().then_some(self.drawn.as_slice())
    }
}
