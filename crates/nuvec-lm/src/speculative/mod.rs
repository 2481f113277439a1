//! Speculative decoding: a proposer guesses the next few tokens, the target model verifies them
//! all in one forward pass, and every guess it agrees with is a decode step saved.
//!
//! Verification takes the target's rows in order, each through the request's own sampling (the
//! logits processors, bans, the constraint's mask, the sampler and its seeded generator, stops):
//! the token sampled at a position is handed out whatever was guessed there, and the next
//! position is used only when that token is the guess. Every token is therefore the target's own
//! draw from the distribution plain decoding gives it, drawn with the same generator in the same
//! order: greedy and seeded outputs equal plain decoding's (to the last bits of the logits, which
//! a pass over several positions sums in another order than a one-token step). This is the rule
//! mlx-lm's speculative decoding applies, and for a guess that was picked (lookup, a greedy
//! draft) it takes as many guesses as any rule can. A draft that *draws* its guesses
//! ([`DraftModel::sampling`]) says from which distributions ([`Proposer::drawn_from`]); those
//! guesses go through the standard rejection rule instead (taken with probability min(1, p/q),
//! else a draw from max(0, p - q)), which takes more of them and still gives every token the
//! target's distribution, though no longer the same draws as plain decoding. The cache keeps the
//! verified positions and is trimmed exactly past them.
//!
//! ```no_run
//! use nuvec_lm::speculative::{speculative_generate, PromptLookup};
//! # fn main() -> nuvec_lm::Result<()> {
//! let (model, tokenizer) = nuvec_lm::load("path/to/model")?;
//! let prompt = tokenizer.encode("Repeat after me: the quick brown fox.", true)?;
//! let mut g = speculative_generate(&model, &prompt, Default::default(), PromptLookup::default(), 4)?;
//! let tokens = g.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>()?;
//! println!("{} of {} drafted tokens accepted", g.stats().accepted, g.stats().drafted);
//! # Ok(()) }
//! ```

mod draft;
mod guesser;
mod lookup;
pub(crate) mod mtp;
mod proposer;

use std::collections::VecDeque;
use std::time::Instant;

pub(crate) use draft::kept_prefix;
pub use draft::DraftModel;
pub use lookup::PromptLookup;
pub use mtp::MtpHead;
pub use proposer::Proposer;

use crate::cache::LayerCache;
use crate::engine::request::Request;
use crate::generate::{FinishReason, GenerateOptions, Stats};
use crate::models::Model;
use crate::session::Session;
use crate::{Error, Result};

/// What speculation did over a generation.
#[derive(Debug, Clone, Default)]
pub struct SpeculativeStats {
    /// Forward passes of the target after the prompt (each verifies a proposal or decodes one token).
    pub steps: usize,
    /// Tokens proposed.
    pub drafted: usize,
    /// Proposed tokens the target agreed with.
    pub accepted: usize,
    /// Per draft position: (proposals that reached it, accepted there).
    pub by_position: Vec<(usize, usize)>,
}

impl SpeculativeStats {
    /// Tokens handed out per target step (1 without speculation).
    pub fn tokens_per_step(&self) -> f64 {
        (self.steps + self.accepted) as f64 / self.steps.max(1) as f64
    }
}

/// A running speculative generation: an iterator of token ids, as [`crate::generate`]'s.
pub struct Speculative<'a, P: Proposer> {
    model: &'a Model,
    request: Request,
    session: Session,
    proposer: P,
    num_draft: usize,
    /// Tokens verified but not yet handed out.
    ready: VecDeque<u32>,
    prefilled: bool,
    stats: Stats,
    spec: SpeculativeStats,
    clock: Option<Instant>,
}

/// Starts generating from `prompt` with up to `num_draft` tokens from `proposer` verified per
/// step. The options are [`crate::generate`]'s; every model family runs it, hybrids and
/// sliding windows (and `max_kv_size`) included. A quantized KV cache (`kv_bits`) is taken as
/// plain decoding takes it: no pass reaches past `quantized_kv_start` before the cache is
/// quantized there, so every position attends what it attends decoding one token at a time;
/// a quantized ring (`kv_bits` with `max_kv_size`, or a sliding-window model) is refused (its
/// rewind is not built).
pub fn speculative_generate<'a, P: Proposer>(
    model: &'a Model,
    prompt: &[u32],
    options: GenerateOptions,
    proposer: P,
    num_draft: usize,
) -> Result<Speculative<'a, P>> {
    if num_draft == 0 {
        return Err(Error::Invalid("num_draft must be at least 1 for speculative decoding".into()));
    }
    if model.ranks().is_some() {
        return Err(Error::Unsupported(
            "speculative decoding on a model split across ranks: run it on one process".into(),
        ));
    }
    options.refuse_served_adapter("speculative decoding")?;
    let request = Request::new(model, prompt, options)?;
    let mut session = Session::with_cache(model, &request.options.cache)?;
    let ring = session.cache.iter().any(|c| matches!(c, LayerCache::Rotating(_) | LayerCache::QuantizedRotating(_)));
    if request.options.cache.kv_bits.is_some() && ring {
        return Err(Error::Invalid(
            "speculative decoding over a quantized rotating KV cache (kv_bits with max_kv_size, or a sliding-window \
             model) is not supported yet: drop kv_bits or the draft"
                .into(),
        ));
    }
    // Every cache gives back a rejected guess exactly: key/value caches by position, a ring by
    // cutting the positions its last pass added (that pass kept the window it saw; its rows see
    // what one-token steps would), and a recurrent layer by the states it keeps from before
    // each verified position.
    for cache in &mut session.cache {
        match cache {
            LayerCache::Recurrent(c) => c.keep_rewind(num_draft),
            LayerCache::Rotating(c) => c.keep_rewind(num_draft),
            _ => {}
        }
    }
    Ok(Speculative {
        model,
        request,
        session,
        proposer,
        num_draft,
        ready: VecDeque::new(),
        prefilled: false,
        stats: Stats { prompt_tokens: prompt.len(), ..Stats::default() },
        spec: SpeculativeStats::default(),
        clock: None,
    })
}

impl<P: Proposer> Speculative<'_, P> {
    /// Why generation ended, once it has.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.request.finish_reason()
    }

    /// What speculation did so far: steps, guesses made and accepted.
    pub fn stats(&self) -> &SpeculativeStats {
        &self.spec
    }

    /// The target's caches, one per layer, as the last pass left them (as
    /// [`crate::Generation::cache`]).
    pub fn cache(&self) -> &[LayerCache] {
        &self.session.cache
    }

    /// Prompt and generation timing, as [`crate::Generation::stats`].
    pub fn timing(&self) -> &Stats {
        &self.stats
    }

    /// Log-probabilities of the yielded tokens, when the options asked for them.
    pub fn logprobs(&self) -> &[crate::TokenLogprobs] {
        self.request.logprobs()
    }

    /// Prefills all of the prompt but its last token, which the first step takes.
    fn prefill(&mut self) -> Result<()> {
        self.clock = Some(Instant::now());
        let prompt = &self.request.history[..self.request.prompt_len - 1];
        let step = self.request.options.prefill_step_size;
        if self.proposer.wants_hidden() {
            for chunk in prompt.chunks(step.max(1)) {
                let hidden = self.model.prefill_hidden(chunk, &mut self.session.cache)?;
                self.proposer.observe(self.session.tokens.len(), &hidden)?;
                self.session.tokens.extend_from_slice(chunk);
                self.session.maybe_quantize(&self.request.options.cache)?;
            }
        } else {
            self.session.prefill(self.model, prompt, step, &self.request.options.cache)?;
        }
        self.prefilled = true;
        Ok(())
    }

    /// One target pass: the pending token and a proposal after it, verified in order.
    fn step(&mut self) -> Result<()> {
        let last = *self.request.history.last().expect("the history holds the prompt");
        let left = self.request.options.max_tokens.saturating_sub(self.handed_out());
        // The pass hands out at most the accepted guesses and one token of the target's own.
        let k = self.num_draft.min(left.saturating_sub(1)).min(self.before_quantizing());
        let mut draft = self.proposer.propose(&self.request.history, k)?;
        draft.truncate(k);
        let mut input = Vec::with_capacity(draft.len() + 1);
        input.push(last);
        input.extend_from_slice(&draft);
        let first_position = self.session.tokens.len();
        let (hidden, logits) = match self.proposer.wants_hidden() {
            true => {
                let (h, logits) = self.model.forward_hidden(&input, &mut self.session.cache)?;
                (Some(h), logits)
            }
            false => (None, self.model.forward(&input, &mut self.session.cache)?),
        };
        self.session.tokens.extend_from_slice(&input);
        let vocab = logits.dim(1);
        let rows = logits.to_vec::<f32>()?;
        let first = self.stats.generation_tokens == 0;
        let mut accepted = 0;
        for (i, row) in rows.chunks_exact(vocab).enumerate() {
            if self.request.reached_limit() {
                break;
            }
            let drawn = self.proposer.drawn_from().and_then(|q| q.get(i)).filter(|_| i < draft.len());
            let (token, agrees) = match drawn {
                Some(q) => self.request.verify_drawn_guess(row.to_vec(), draft[i], q)?,
                None => {
                    let token = self.request.sample_on_host(row.to_vec())?;
                    (token, draft.get(i) == Some(&token))
                }
            };
            if let Some(t) = self.request.accept(token) {
                self.ready.push_back(t);
            }
            self.stats.generation_tokens += 1;
            if let Some(p) = self.position(i, draft.len()) {
                p.0 += 1;
                p.1 += agrees as usize;
            }
            if !agrees || self.request.finish_reason().is_some() {
                break;
            }
            accepted += 1;
        }
        self.spec.steps += 1;
        self.spec.drafted += draft.len();
        self.spec.accepted += accepted;
        // The cache keeps the pending token and the accepted guesses; the token sampled after
        // them is the next step's pending one.
        self.session.trim(draft.len() - accepted)?;
        self.session.maybe_quantize(&self.request.options.cache)?;
        self.proposer.accepted(accepted)?;
        if let Some(h) = hidden {
            self.proposer.observe(first_position, &h.slice_rows(0, accepted + 1)?)?;
        }
        let now = Instant::now();
        if first {
            self.stats.prompt_time = now - self.clock.unwrap_or(now);
            self.clock = Some(now);
        } else {
            self.stats.generation_time = now - self.clock.unwrap_or(now);
        }
        Ok(())
    }

    /// The guesses a pass may carry before a quantized cache would be quantized (unbounded
    /// without `kv_bits`): decoding one token at a time, the cache is quantized after the pass
    /// that brings it to `quantized_kv_start` positions (at least 1), and every later position
    /// attends the quantized rows, so no pass reaches past that point unquantized.
    fn before_quantizing(&self) -> usize {
        let cache = &self.request.options.cache;
        let held = self.session.tokens.len();
        match cache.kv_bits {
            Some(_) if held < cache.quantized_kv_start.max(1) => cache.quantized_kv_start.max(1) - held - 1,
            _ => usize::MAX,
        }
    }

    /// The per-position counter of draft position `i` (None past the proposal).
    fn position(&mut self, i: usize, drafted: usize) -> Option<&mut (usize, usize)> {
        if i >= drafted {
            return None;
        }
        if self.spec.by_position.len() <= i {
            self.spec.by_position.resize(i + 1, (0, 0));
        }
        self.spec.by_position.get_mut(i)
    }

    /// Tokens sampled so far (each handed out, but an end-of-sequence or stop token, which ends
    /// the generation).
    fn handed_out(&self) -> usize {
        self.request.history.len() - self.request.prompt_len
    }
}

impl<P: Proposer> Iterator for Speculative<'_, P> {
    type Item = Result<u32>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(t) = self.ready.pop_front() {
                return Some(Ok(t));
            }
            if self.request.finish_reason().is_some() || self.request.reached_limit() {
                return None;
            }
            let result = if self.prefilled { self.step() } else { self.prefill().and_then(|_| self.step()) };
            if let Err(e) = result {
                self.request.fail();
                return Some(Err(e));
            }
        }
    }
}
