//! Logits processors with mlx-lm's formulas. They see the raw logits and the token history
//! (the prompt included) and run before the sampler, in mlx-lm's order: logit bias, then the
//! repetition, presence and frequency penalties.

use crate::{Error, Result};

/// Penalties and biases applied to the logits before sampling. All off by default.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitsProcessors {
    /// Sign-aware multiplicative penalty on tokens of the recent history (>= 0; 1 is neutral).
    pub repetition_penalty: Option<f32>,
    /// History length the repetition penalty looks at (default 20).
    pub repetition_context_size: usize,
    /// Subtracted once from every token present in the recent history.
    pub presence_penalty: Option<f32>,
    /// History length for the presence penalty (default 20).
    pub presence_context_size: usize,
    /// Subtracted for every occurrence of a token in the recent history.
    pub frequency_penalty: Option<f32>,
    /// History length for the frequency penalty (default 20).
    pub frequency_context_size: usize,
    /// Added to the logits of the given tokens.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for LogitsProcessors {
    fn default() -> Self {
        LogitsProcessors {
            repetition_penalty: None,
            repetition_context_size: 20,
            presence_penalty: None,
            presence_context_size: 20,
            frequency_penalty: None,
            frequency_context_size: 20,
            logit_bias: vec![],
        }
    }
}

fn recent(history: &[u32], size: usize) -> &[u32] {
    &history[history.len().saturating_sub(size)..]
}

impl LogitsProcessors {
    /// Checks the settings against `vocab_size`, naming the bad one.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        if let Some(p) = self.repetition_penalty {
            if !(p >= 0.0 && p.is_finite()) {
                return Err(Error::Invalid(format!("repetition_penalty must be a non-negative float, got {p}")));
            }
        }
        for (name, size) in [
            ("repetition_context_size", self.repetition_context_size),
            ("presence_context_size", self.presence_context_size),
            ("frequency_context_size", self.frequency_context_size),
        ] {
            // mlx-lm slices tokens[-0:], which is the whole history: refuse rather than surprise.
            if size == 0 {
                return Err(Error::Invalid(format!("{name} must be at least 1")));
            }
        }
        for (name, p) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if p.is_some_and(|p| !p.is_finite()) {
                return Err(Error::Invalid(format!("{name} must be a finite number")));
            }
        }
        if let Some((id, _)) = self.logit_bias.iter().find(|(id, _)| *id as usize >= vocab_size) {
            return Err(Error::Invalid(format!("logit_bias names token {id}, outside the vocabulary of {vocab_size}")));
        }
        if let Some((id, b)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
            return Err(Error::Invalid(format!("logit_bias for token {id} is {b}, not a finite number")));
        }
        Ok(())
    }

    /// True when no processor is set.
    pub fn is_empty(&self) -> bool {
        let off = |p: Option<f32>| p.is_none_or(|p| p == 0.0);
        self.logit_bias.is_empty()
            && off(self.repetition_penalty)
            && off(self.presence_penalty)
            && off(self.frequency_penalty)
    }

    /// Applies every set processor to `logits`, given the history so far.
    pub fn apply(&self, history: &[u32], logits: &mut [f32]) {
        for &(id, bias) in &self.logit_bias {
            logits[id as usize] += bias;
        }
        if history.is_empty() {
            return;
        }
        if let Some(p) = self.repetition_penalty.filter(|&p| p != 0.0) {
            let mut tokens = recent(history, self.repetition_context_size).to_vec();
            tokens.sort_unstable();
            tokens.dedup();
            for t in tokens {
                let x = &mut logits[t as usize];
                *x = if *x < 0.0 { *x * p } else { *x / p };
            }
        }
        if let Some(p) = self.presence_penalty.filter(|&p| p != 0.0) {
            let mut tokens = recent(history, self.presence_context_size).to_vec();
            tokens.sort_unstable();
            tokens.dedup();
            tokens.into_iter().for_each(|t| logits[t as usize] -= p);
        }
        if let Some(p) = self.frequency_penalty.filter(|&p| p != 0.0) {
            for &t in recent(history, self.frequency_context_size) {
                logits[t as usize] -= p;
            }
        }
    }
}
