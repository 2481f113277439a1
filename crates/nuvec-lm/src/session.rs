//! A model's KV cache together with the tokens it holds, so a conversation (or a prompt saved
//! to a file) continues without recomputing what the cache already has.

use crate::cache::{CacheOptions, LayerCache};
use crate::models::Model;
use crate::{Error, Result};

/// A cache and the token ids it was filled with, position by position.
#[derive(Debug)]
pub struct Session {
    pub(crate) cache: Vec<LayerCache>,
    pub(crate) tokens: Vec<u32>,
}

impl Session {
    /// An empty session for `model`, with a plain cache.
    pub fn new(model: &Model) -> Self {
        Session { cache: model.new_cache(), tokens: vec![] }
    }

    /// An empty session with the cache `options` ask for (rotating, quantized).
    pub fn with_cache(model: &Model, options: &CacheOptions) -> Result<Self> {
        Ok(Session { cache: model.make_cache(options)?, tokens: vec![] })
    }

    /// Converts layer caches to quantized ones where `options` say so (after each forward pass).
    pub(crate) fn maybe_quantize(&mut self, options: &CacheOptions) -> Result<()> {
        self.cache.iter_mut().try_for_each(|c| c.maybe_quantize(options))
    }

    /// A session from a cache and the tokens it holds (as a prompt-cache file restores it).
    pub(crate) fn from_parts(cache: Vec<LayerCache>, tokens: Vec<u32>) -> Self {
        Session { cache, tokens }
    }

    /// The tokens the cache holds, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The per-layer caches.
    pub fn cache(&self) -> &[LayerCache] {
        &self.cache
    }

    /// Removes exactly the last `n` positions from every layer, or errors leaving the session
    /// unchanged.
    pub fn trim(&mut self, n: usize) -> Result<()> {
        if n > self.tokens.len() {
            return Err(Error::Invalid(format!(
                "cannot trim {n} positions from a session holding {}",
                self.tokens.len()
            )));
        }
        if let Some(c) = self.cache.iter().find(|c| c.offset() != self.tokens.len()) {
            return Err(Error::Invalid(format!(
                "the cache holds {} positions but the session {} tokens",
                c.offset(),
                self.tokens.len()
            )));
        }
        // A layer that cannot give the positions back says why before any other is touched, so
        // that the session is left unchanged.
        if let Some(c) = self.cache.iter_mut().find(|c| !c.can_trim(n)) {
            c.trim(n)?;
        }
        for c in &mut self.cache {
            c.trim(n)?;
        }
        self.tokens.truncate(self.tokens.len() - n);
        Ok(())
    }

    /// Runs `tokens` through the model into the cache (all of them: no logits are needed),
    /// `step` positions per forward pass, quantizing the cache as `options` say after each.
    pub fn prefill(&mut self, model: &Model, tokens: &[u32], step: usize, options: &CacheOptions) -> Result<()> {
        self.prefill_reporting(model, tokens, step, options, &|_, _| {})
    }

    /// [`Session::prefill`], calling `progress(done, total)` after each pass over `step` tokens
    /// (`total` is `tokens.len()`).
    pub fn prefill_reporting(
        &mut self,
        model: &Model,
        tokens: &[u32],
        step: usize,
        options: &CacheOptions,
        progress: &dyn Fn(usize, usize),
    ) -> Result<()> {
        let mut done = 0;
        for chunk in tokens.chunks(step.max(1)) {
            model.prefill(chunk, &mut self.cache)?;
            self.tokens.extend_from_slice(chunk);
            self.maybe_quantize(options)?;
            done += chunk.len();
            progress(done, tokens.len());
        }
        Ok(())
    }

    /// How many leading tokens of `prompt` the session can reuse: the common prefix, always
    /// leaving at least the prompt's last token to compute (its logits start generation).
    pub fn reusable(&self, prompt: &[u32]) -> usize {
        let common = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        common.min(prompt.len().saturating_sub(1))
    }
}
