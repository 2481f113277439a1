//! The decode loop, as mlx-lm's `generate_step` / `stream_generate`: the prompt is prefilled in
//! chunks, leaving its last token for the first decode step; each step samples one token; EOS
//! ends generation without being yielded; `max_tokens` bounds it.

use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::cache::KvCache;
use crate::models::Model;
use crate::sample::Sampler;
use crate::{Error, Result};

/// Options of one generation.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to generate (mlx_lm.generate's default: 256).
    pub max_tokens: usize,
    /// How to pick each token.
    pub sampler: Sampler,
    /// Seed of the sampler's random stream; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Prompt positions prefilled per forward pass.
    pub prefill_step_size: usize,
    /// More end-of-sequence ids, beside the model's.
    pub extra_eos_token_ids: Vec<u32>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampler: Sampler::default(),
            seed: None,
            prefill_step_size: 2048,
            extra_eos_token_ids: vec![],
        }
    }
}

impl GenerateOptions {
    /// Checks every option, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        self.sampler.validate()?;
        if self.prefill_step_size == 0 {
            return Err(Error::Invalid("prefill_step_size must be at least 1".into()));
        }
        Ok(())
    }
}

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence token (not yielded).
    EndOfSequence,
    /// `max_tokens` were generated.
    Length,
    /// A step failed; the error was yielded.
    Error,
}

/// Timing of a generation, as mlx_lm.generate reports it.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Time from the start to the first sampled token.
    pub prompt_time: Duration,
    /// Tokens sampled (the EOS that ended generation included, as mlx-lm counts).
    pub generation_tokens: usize,
    /// Time from the first sampled token to the last.
    pub generation_time: Duration,
}

impl Stats {
    /// Prompt tokens per second.
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    /// Generated tokens per second (mlx-lm's formula: n / time since the first token).
    pub fn generation_tps(&self) -> f64 {
        self.generation_tokens as f64 / self.generation_time.as_secs_f64().max(1e-9)
    }
}

/// A running generation: an iterator of token ids.
pub struct Generation<'a> {
    model: &'a Model,
    prompt: Vec<u32>,
    options: GenerateOptions,
    eos: Vec<u32>,
    cache: Vec<KvCache>,
    rng: ChaCha8Rng,
    last: Option<u32>,
    yielded: usize,
    finish: Option<FinishReason>,
    stats: Stats,
    clock: Option<Instant>,
}

/// Starts generating from `prompt` (token ids). Nothing runs until the first `next()`.
pub fn generate<'a>(model: &'a Model, prompt: &[u32], options: GenerateOptions) -> Result<Generation<'a>> {
    options.validate()?;
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt is empty: give at least one token".into()));
    }
    let rng = match options.seed {
        Some(seed) => ChaCha8Rng::seed_from_u64(seed),
        None => ChaCha8Rng::from_entropy(),
    };
    let mut eos = model.eos_token_ids().to_vec();
    eos.extend(&options.extra_eos_token_ids);
    Ok(Generation {
        model,
        prompt: prompt.to_vec(),
        eos,
        cache: model.new_cache(),
        rng,
        last: None,
        yielded: 0,
        finish: None,
        stats: Stats { prompt_tokens: prompt.len(), ..Stats::default() },
        clock: None,
        options,
    })
}

impl Generation<'_> {
    /// Why generation ended, once it has.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.finish.as_ref()
    }

    /// Timing so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The KV cache (one per layer), for inspection.
    pub fn cache(&self) -> &[KvCache] {
        &self.cache
    }

    fn step(&mut self) -> Result<u32> {
        let logits = match self.last {
            None => {
                self.clock = Some(Instant::now());
                let (head, last) = self.prompt.split_at(self.prompt.len() - 1);
                for chunk in head.chunks(self.options.prefill_step_size) {
                    self.model.prefill(chunk, &mut self.cache)?;
                }
                self.model.forward_last(last, &mut self.cache)?
            }
            Some(token) => self.model.forward_last(&[token], &mut self.cache)?,
        };
        let row = logits.to_vec::<f32>()?;
        let token = self.options.sampler.sample(&row, &mut self.rng)?;
        let now = Instant::now();
        if self.last.is_none() {
            self.stats.prompt_time = now - self.clock.unwrap_or(now);
            self.clock = Some(now);
        } else {
            self.stats.generation_time = now - self.clock.unwrap_or(now);
        }
        self.stats.generation_tokens += 1;
        self.last = Some(token);
        Ok(token)
    }
}

impl Iterator for Generation<'_> {
    type Item = Result<u32>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finish.is_some() {
            return None;
        }
        if self.yielded >= self.options.max_tokens {
            self.finish = Some(FinishReason::Length);
            return None;
        }
        match self.step() {
            Err(e) => {
                self.finish = Some(FinishReason::Error);
                Some(Err(e))
            }
            Ok(token) if self.eos.contains(&token) => {
                self.finish = Some(FinishReason::EndOfSequence);
                None
            }
            Ok(token) => {
                self.yielded += 1;
                if self.yielded == self.options.max_tokens {
                    self.finish = Some(FinishReason::Length);
                }
                Some(Ok(token))
            }
        }
    }
}
