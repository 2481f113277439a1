//! Samplers with mlx-lm's filters, applied in mlx-lm's order: top-p, min-p, top-k, then a
//! categorical draw at 1/temperature. Temperature 0 is greedy.

use rand::Rng;

use crate::{Error, Result};

/// Sampling settings. The defaults are mlx-lm's: greedy, every filter off.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampler {
    /// 0 is greedy (argmax).
    pub temperature: f32,
    /// Nucleus mass in (0, 1); 0 or 1 is off.
    pub top_p: f32,
    /// Minimum probability relative to the top token, in [0, 1]; 0 is off.
    pub min_p: f32,
    /// Tokens min-p always keeps (at least 1).
    pub min_tokens_to_keep: usize,
    /// Keep only the k most likely; 0 is off.
    pub top_k: usize,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler { temperature: 0.0, top_p: 0.0, min_p: 0.0, min_tokens_to_keep: 1, top_k: 0 }
    }
}

impl Sampler {
    /// Checks every setting against mlx-lm's ranges, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::Invalid(format!("temperature = {} must be a finite number >= 0", self.temperature)));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(Error::Invalid(format!("top_p = {} must be in [0, 1]", self.top_p)));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::Invalid(format!("min_p = {} must be in [0, 1]", self.min_p)));
        }
        if self.min_tokens_to_keep < 1 {
            return Err(Error::Invalid("min_tokens_to_keep must be at least 1".into()));
        }
        Ok(())
    }

    /// Settings that will have no effect, for front ends to warn about (never silently).
    pub fn ignored_settings(&self) -> Vec<&'static str> {
        let mut ignored = vec![];
        if self.temperature == 0.0 {
            if self.top_p > 0.0 && self.top_p < 1.0 {
                ignored.push("top_p (temperature is 0: greedy)");
            }
            if self.min_p > 0.0 {
                ignored.push("min_p (temperature is 0: greedy)");
            }
            if self.top_k > 0 {
                ignored.push("top_k (temperature is 0: greedy)");
            }
        }
        ignored
    }

    /// Picks the next token from `logits` (one row).
    pub fn sample(&self, logits: &[f32], rng: &mut impl Rng) -> Result<u32> {
        if self.temperature == 0.0 {
            return Ok(argmax(logits));
        }
        let mut logprobs = log_softmax(logits);
        if self.top_p > 0.0 && self.top_p < 1.0 {
            apply_top_p(&mut logprobs, self.top_p);
        }
        if self.min_p != 0.0 {
            apply_min_p(&mut logprobs, self.min_p, self.min_tokens_to_keep);
        }
        if self.top_k > 0 {
            if self.top_k >= logprobs.len() {
                return Err(Error::Invalid(format!(
                    "top_k = {} must be below the vocabulary size {}",
                    self.top_k,
                    logprobs.len()
                )));
            }
            apply_top_k(&mut logprobs, self.top_k);
        }
        Ok(categorical(&logprobs, 1.0 / self.temperature, rng))
    }
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

/// mlx-lm's `apply_min_p`: drops tokens below `min_p` times the top probability.
pub fn apply_min_p(logprobs: &mut [f32], min_p: f32, min_tokens_to_keep: usize) {
    let top = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let cutoff = top + min_p.ln();
    let mut keep: Vec<usize> = (0..logprobs.len()).collect();
    keep.sort_by(|&a, &b| logprobs[b].total_cmp(&logprobs[a]));
    let protected: std::collections::HashSet<usize> = keep.into_iter().take(min_tokens_to_keep).collect();
    for (i, x) in logprobs.iter_mut().enumerate() {
        if *x < cutoff && !protected.contains(&i) {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// mlx-lm's `apply_top_k`: keeps the k most likely tokens.
pub fn apply_top_k(logprobs: &mut [f32], k: usize) {
    let mut order: Vec<usize> = (0..logprobs.len()).collect();
    order.select_nth_unstable_by(k - 1, |&a, &b| logprobs[b].total_cmp(&logprobs[a]));
    for &i in &order[k..] {
        logprobs[i] = f32::NEG_INFINITY;
    }
}

/// A draw from `softmax(logprobs * scale)`.
pub fn categorical(logprobs: &[f32], scale: f32, rng: &mut impl Rng) -> u32 {
    let max = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = logprobs.iter().map(|&x| (((x - max) * scale) as f64).exp()).collect();
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
