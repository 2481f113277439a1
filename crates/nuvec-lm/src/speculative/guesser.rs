//! How a model-backed proposer (a draft model, a multi-token-prediction head) turns its logits
//! into guesses: picked greedily, or drawn under a sampler with each guess's distribution kept for
//! the rejection rule ([`super::Proposer::drawn_from`]).

use nuvec::Array;
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

    /// Whether guesses are drawn (each logits row then comes to the host).
    fn draws(&self) -> bool {
        self.sampling.as_ref().is_some_and(|(s, _)| s.temperature > 0.0)
    }

    /// A new proposal begins.
    pub(crate) fn clear(&mut self) {
        self.drawn.clear();
    }

    /// The next guess from a `[1, vocab]` logits row: drawn on the host (noting its
    /// distribution), or picked where the row is.
    pub(crate) fn pick(&mut self, logits: &Array) -> Result<u32> {
        if self.draws() {
            return Ok(self.guess(&logits.to_vec::<f32>()?));
        }
        Ok(logits.argmax()?.to_vec::<u32>()?[0])
    }

    fn guess(&mut self, row: &[f32]) -> u32 {
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
