//! Samplers with mlx-lm's filters, applied in mlx-lm's order to log-probabilities: top-p, min-p,
//! XTC, top-k, then a categorical draw at 1/temperature. Temperature 0 is greedy.

use rand::Rng;

use crate::{Error, Result};

/// `softmax(x)` on the host (one implementation with the routing's).
pub use nuvec::softmax;

/// Sampling settings. Each has one default, the same in the library and the CLI.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampler {
    /// 0 (the default) is greedy: argmax, and every filter below is off.
    pub temperature: f32,
    /// Nucleus mass; filters only inside (0, 1). Default 1.0 (off).
    pub top_p: f32,
    /// Minimum probability relative to the top token, in [0, 1]; 0 (default) is off.
    pub min_p: f32,
    /// Tokens min-p always keeps (at least 1).
    pub min_tokens_to_keep: usize,
    /// Probability of applying XTC at a step, in [0, 1]; 0 (default) is off.
    pub xtc_probability: f32,
    /// XTC removes every token above this probability but the least likely of them, in [0, 0.5].
    /// Default 0.1. Newline and end-of-sequence tokens are always exempt.
    pub xtc_threshold: f32,
    /// Keep only the k most likely; 0 (default) is off.
    pub top_k: usize,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler {
            temperature: 0.0,
            top_p: 1.0,
            min_p: 0.0,
            min_tokens_to_keep: 1,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            top_k: 0,
        }
    }
}

impl Sampler {
    /// Checks every setting against mlx-lm's ranges, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature has to be a finite float >= 0, but is {}", self.temperature));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad(format!("top_p has to be a float in the [0, 1] interval, but is {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p has to be a float in the [0, 1] interval, but is {}", self.min_p));
        }
        if self.min_tokens_to_keep < 1 {
            return bad(format!("min_tokens_to_keep has to be a positive integer, but is {}", self.min_tokens_to_keep));
        }
        if !(0.0..=0.5).contains(&self.xtc_threshold) {
            return bad(format!(
                "xtc_threshold has to be a float in the [0, 0.5] interval, but is {}",
                self.xtc_threshold
            ));
        }
        if !(0.0..=1.0).contains(&self.xtc_probability) {
            return bad(format!(
                "xtc_probability has to be a float in the [0, 1] interval, but is {}",
                self.xtc_probability
            ));
        }
        Ok(())
    }

    /// Checks settings that depend on the vocabulary size.
    pub fn validate_for(&self, vocab_size: usize) -> Result<()> {
        self.validate()?;
        if self.top_k > 0 && self.top_k >= vocab_size {
            return Err(Error::Invalid(format!(
                "top_k has to be an integer in the (0, {vocab_size}) interval, but is {}",
                self.top_k
            )));
        }
        Ok(())
    }

    /// Settings that will have no effect (or a surprising one), for front ends to warn about,
    /// so that nothing is silently ignored.
    pub fn ignored_settings(&self) -> Vec<String> {
        let mut notes = vec![];
        if self.temperature == 0.0 {
            let filters = [
                ("top_p", self.top_p > 0.0 && self.top_p < 1.0),
                ("min_p", self.min_p > 0.0),
                ("top_k", self.top_k > 0),
                ("xtc_probability", self.xtc_probability > 0.0),
            ];
            for (name, set) in filters {
                if set {
                    notes.push(format!("{name} has no effect: temperature is 0 (greedy decoding)"));
                }
            }
        }
        if self.top_p == 0.0 && self.temperature > 0.0 {
            notes.push("top_p = 0 turns nucleus sampling off (as 1.0 does)".into());
        }
        if self.xtc_probability > 0.0 && self.xtc_threshold == 0.0 {
            notes.push("xtc_threshold = 0 makes XTC remove every token but the least likely".into());
        }
        notes
    }

    /// Whether a draw over a row of `vocab` at these settings is the plain categorical draw at
    /// 1/temperature: sampling, with no filter that would apply and nothing drawn before it
    /// (what `nuvec::Array::sample_rows` draws where the logits are).
    pub fn draws_plainly(&self, vocab: usize) -> bool {
        self.temperature > 0.0
            && !(self.top_p > 0.0 && self.top_p < 1.0)
            && self.min_p == 0.0
            && self.xtc_probability <= 0.0
            && !(self.top_k > 0 && self.top_k < vocab)
    }

    /// The factor the draw scales log-probabilities by: 1/temperature, as [`Sampler::sample`]
    /// computes it.
    pub fn scale(&self) -> f32 {
        1.0 / self.temperature
    }

    /// Applies the filters to `logprobs` in mlx-lm's order (the draw is separate).
    /// `xtc_exempt` are the newline and end-of-sequence ids.
    pub fn filter(&self, logprobs: &mut [f32], xtc_exempt: &[u32], rng: &mut impl Rng) {
        if self.top_p > 0.0 && self.top_p < 1.0 {
            apply_top_p(logprobs, self.top_p);
        }
        if self.min_p != 0.0 {
            apply_min_p(logprobs, self.min_p, self.min_tokens_to_keep);
        }
        if self.xtc_probability > 0.0 {
            // One uniform draw per step decides whether XTC applies, as in mlx-lm.
            let u: f32 = rng.gen();
            if u <= self.xtc_probability {
                apply_xtc(logprobs, self.xtc_threshold, xtc_exempt);
            }
        }
        if self.top_k > 0 && self.top_k < logprobs.len() {
            apply_top_k(logprobs, self.top_k);
        }
    }

    /// Picks the next token from log-probabilities (one row).
    pub fn sample(&self, logprobs: &mut [f32], xtc_exempt: &[u32], rng: &mut impl Rng) -> u32 {
        if self.temperature == 0.0 {
            return argmax(logprobs);
        }
        self.filter(logprobs, xtc_exempt, rng);
        categorical(logprobs, self.scale(), rng)
    }

    /// The distribution [`Sampler::sample`] draws from, as probabilities (the filters applied,
    /// with their random part drawn from `rng` as a draw would); `None` when decoding greedily.
    pub fn distribution(&self, logprobs: &mut [f32], xtc_exempt: &[u32], rng: &mut impl Rng) -> Option<Vec<f64>> {
        if self.temperature == 0.0 {
            return None;
        }
        self.filter(logprobs, xtc_exempt, rng);
        Some(probabilities(logprobs, 1.0 / self.temperature))
    }
}

/// `softmax(logprobs * scale)` in f64, as [`categorical`] weighs the tokens.
pub fn probabilities(logprobs: &[f32], scale: f32) -> Vec<f64> {
    let max = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = logprobs.iter().map(|&x| (((x - max) * scale) as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    weights.into_iter().map(|w| w / total).collect()
}

/// A draw from `weights` (non-negative, not all zero; they need not sum to 1).
pub fn draw(weights: &[f64], rng: &mut impl Rng) -> u32 {
    let total: f64 = weights.iter().sum();
    let mut u = rng.gen::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i as u32;
        }
        u -= w;
    }
    // Rounding left a sliver: the last token with any weight.
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
}

/// Index of the first maximum.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// `x - logsumexp(x)`.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&x| (x - max).exp()).sum();
    let lse = max + sum.ln();
    logits.iter().map(|&x| x - lse).collect()
}

/// mlx-lm's `apply_top_p`: keeps the smallest set of most likely tokens whose mass reaches `p`.
pub fn apply_top_p(logprobs: &mut [f32], p: f32) {
    let mut sorted: Vec<f32> = logprobs.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let probs: Vec<f32> = sorted.iter().map(|x| x.exp()).collect();
    // mass_above[i]: probability of the tokens ranked above position i (ascending order).
    let mut mass_above = vec![0f32; probs.len()];
    let mut acc = 0f32;
    for i in (0..probs.len()).rev() {
        mass_above[i] = acc;
        acc += probs[i];
    }
    let total = mass_above[0] + probs[0];
    let dropped = mass_above.iter().filter(|&&m| m >= p * total).count();
    let threshold = sorted[dropped.min(sorted.len() - 1)];
    logprobs.iter_mut().filter(|x| **x < threshold).for_each(|x| *x = f32::NEG_INFINITY);
}

/// mlx-lm's `apply_min_p`: drops tokens below `min_p` times the top probability, keeping at
/// least `min_tokens_to_keep`.
pub fn apply_min_p(logprobs: &mut [f32], min_p: f32, min_tokens_to_keep: usize) {
    let top = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let cutoff = top + min_p.ln();
    let mut protected = vec![false; logprobs.len()];
    if min_tokens_to_keep > 1 {
        let mut order: Vec<usize> = (0..logprobs.len()).collect();
        let k = min_tokens_to_keep.min(order.len());
        order.select_nth_unstable_by(k - 1, |&a, &b| by_rank(logprobs, a, b));
        order[..k].iter().for_each(|&i| protected[i] = true);
    }
    for (x, keep) in logprobs.iter_mut().zip(protected) {
        if *x < cutoff && !keep {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// mlx-lm's `apply_xtc` (when it fires): removes every token whose probability exceeds the
/// smallest probability above `threshold`, except the `exempt` tokens.
pub fn apply_xtc(logprobs: &mut [f32], threshold: f32, exempt: &[u32]) {
    let probs: Vec<f32> = softmax(logprobs);
    let floor = probs.iter().copied().filter(|&p| p > threshold).fold(f32::INFINITY, f32::min);
    for (i, (x, p)) in logprobs.iter_mut().zip(&probs).enumerate() {
        if *p > floor && !exempt.contains(&(i as u32)) {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// Most likely first; among equal values the lower id first, so ties at a cut are decided the
/// same way every time (as MLX's partition decides them on the oracle's records).
fn by_rank(logprobs: &[f32], a: usize, b: usize) -> std::cmp::Ordering {
    logprobs[b].total_cmp(&logprobs[a]).then(a.cmp(&b))
}

/// mlx-lm's `apply_top_k`: keeps the k most likely tokens.
pub fn apply_top_k(logprobs: &mut [f32], k: usize) {
    let mut order: Vec<usize> = (0..logprobs.len()).collect();
    order.select_nth_unstable_by(k - 1, |&a, &b| by_rank(logprobs, a, b));
    for &i in &order[k..] {
        logprobs[i] = f32::NEG_INFINITY;
    }
}

/// A draw from `softmax(logits * scale)` weighed from the raw logits in f64: token `i` weighs
/// `exp((f64(x_i) - f64(max)) * f64(scale))`. The distribution of [`categorical`] over the
/// logits' log-softmax, without its f32 roundings, so that a device computing the same weights
/// (`nuvec::Array::sample_rows`, whose weights differ only in `exp`'s last bit) can tell when its
/// draw is certainly this one. What a request sampled at a temperature alone draws with.
pub fn categorical_from_logits(logits: &[f32], scale: f32, rng: &mut impl Rng) -> u32 {
    let (max, scale) = (logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64, scale as f64);
    let weights: Vec<f64> = logits.iter().map(|&x| ((x as f64 - max) * scale).exp()).collect();
    draw(&weights, rng)
}

/// A draw from `softmax(logprobs * scale)`.
pub fn categorical(logprobs: &[f32], scale: f32, rng: &mut impl Rng) -> u32 {
    let max = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = logprobs.iter().map(|&x| (((x - max) * scale) as f64).exp()).collect();
    draw(&weights, rng)
}
