//! A model's KV cache together with the tokens it holds, so a conversation (or a prompt saved
//! to a file) continues without recomputing what the cache already has.

use crate::cache::{KvCache, LayerCache};
use crate::models::Model;
use crate::{Error, Result};

/// A cache and the token ids it was filled with, position by position.
#[derive(Debug)]
pub struct Session {
    pub(crate) cache: Vec<KvCache>,
    pub(crate) tokens: Vec<u32>,
}

impl Session {
    /// An empty session for `model`.
    pub fn new(model: &Model) -> Self {
        Session { cache: model.new_cache(), tokens: vec![] }
    }

    /// A session from a cache and the tokens it holds (as a prompt-cache file restores it).
    pub(crate) fn from_parts(cache: Vec<KvCache>, tokens: Vec<u32>) -> Self {
        Session { cache, tokens }
    }

    /// The tokens the cache holds, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The per-layer caches.
    pub fn cache(&self) -> &[KvCache] {
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
        for c in &mut self.cache {
            c.trim(n)?;
        }
        self.tokens.truncate(self.tokens.len() - n);
        Ok(())
    }

    /// Runs `tokens` through the model into the cache (all of them: no logits are needed),
    /// `step` positions per forward pass.
    pub fn prefill(&mut self, model: &Model, tokens: &[u32], step: usize) -> Result<()> {
        for chunk in tokens.chunks(step.max(1)) {
            model.prefill(chunk, &mut self.cache)?;
            self.tokens.extend_from_slice(chunk);
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
