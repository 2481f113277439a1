//! The decode loop, as mlx-lm's `generate_step` / `stream_generate`: the prompt is prefilled in
//! chunks, leaving its last token for the first decode step; each step runs the logits
//! processors on the raw logits, turns them into log-probabilities, and samples; end-of-sequence
//! and stop tokens end generation without being yielded; stop strings end it at the token that
//! completes them; `max_tokens` bounds it.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nuvec::{Array, Device};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::cache::{CacheOptions, LayerCache};
use crate::decode_graph::DecodeGraph;
use crate::models::Model;
use crate::processors::LogitsProcessors;
use crate::sample::{log_softmax, Sampler};
use crate::session::Session;
use crate::stop::{Stop, StopMatcher, Stopped};
use crate::{Error, Result};

/// Most alternatives [`GenerateOptions::logprobs`] may ask for.
pub const MAX_LOGPROBS: usize = 20;

/// Options of one generation. Every field has one default, shared by the library and the CLI
/// (the prefill step by device: [`GenerateOptions::for_device`]).
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to generate (default 256, mlx-lm's `generate` default).
    pub max_tokens: usize,
    /// How to pick each token (default greedy).
    pub sampler: Sampler,
    /// Penalties and biases applied before sampling (default none).
    pub processors: LogitsProcessors,
    /// Seed of this request's random stream: the same seed gives the same tokens, whatever else
    /// the process does. `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Prompt positions prefilled per forward pass (default 2048, mlx-lm's;
    /// [`GenerateOptions::for_device`] gives 4096 on CUDA, see [`default_prefill_step`]).
    pub prefill_step_size: usize,
    /// Stop tokens and strings (default none).
    pub stop: Stop,
    /// Before this many tokens, end-of-sequence and stop tokens have probability zero and no
    /// stop string ends generation (default 0).
    pub min_tokens: usize,
    /// Treat end-of-sequence tokens as ordinary tokens (default false).
    pub ignore_eos: bool,
    /// Record each token's log-probability and this many most likely alternatives (at most 20).
    pub logprobs: Option<usize>,
    /// More end-of-sequence ids, beside the model's.
    pub extra_eos_token_ids: Vec<u32>,
    /// The KV cache: rotating (`max_kv_size`), quantized (`kv_bits`...), or plain (default).
    pub cache: CacheOptions,
    /// Most positions (prompt and generated tokens) a generation may reach, as llama.cpp's
    /// `--ctx-size`; `None` (the default) takes the model's [`Model::context_length`]. A longer
    /// prompt is refused; a generation that fills it ends with [`FinishReason::ContextLength`].
    /// Above the model's context it is refused unless `allow_past_context`.
    pub context_length: Option<usize>,
    /// Run past the model's trained context (positions its rope never saw, where output
    /// degrades), as `--allow-past-context` does; a rotating cache (`cache.max_kv_size`) does
    /// too, as mlx-lm's does. Default false.
    pub allow_past_context: bool,
}

/// Prompt positions per prefill forward pass by default on `device`: 2048 (mlx-lm's
/// `prefill_step_size`) on the CPU, 4096 on a CUDA device. There every forward pass of more than
/// 8 positions decodes each quantized weight to bf16 tiles for the tensor cores (~7 % of an 8B's
/// 4096-token prefill at 2048, by ncu), so fewer, longer passes are faster: on an H200 a random
/// Llama-3.1-8B prefilled 4096 tokens 6 % faster and a 1B 9 % faster in one pass than in two
/// (docs/cuda.md, eighth session). A pass's activations grow with it (an 8B's f32 gate and up
/// outputs alone take 235 MB per 2048 positions); set `prefill_step_size` lower where memory is
/// short.
pub fn default_prefill_step(device: Device) -> usize {
    match device {
        Device::Cpu => 2048,
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => 4096,
    }
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampler: Sampler::default(),
            processors: LogitsProcessors::default(),
            seed: None,
            prefill_step_size: 2048,
            stop: Stop::default(),
            min_tokens: 0,
            ignore_eos: false,
            logprobs: None,
            extra_eos_token_ids: vec![],
            cache: CacheOptions::default(),
            context_length: None,
            allow_past_context: false,
        }
    }
}

impl GenerateOptions {
    /// The defaults for a model on `device`: [`GenerateOptions::default`] with
    /// [`default_prefill_step`]'s step (the step the CLI's commands default to).
    pub fn for_device(device: Device) -> Self {
        GenerateOptions { prefill_step_size: default_prefill_step(device), ..Default::default() }
    }

    /// Checks every option that does not depend on the model, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        self.sampler.validate()?;
        self.cache.validate()?;
        if self.prefill_step_size == 0 {
            return Err(Error::Invalid("prefill_step_size must be at least 1".into()));
        }
        if let Some(n) = self.logprobs.filter(|&n| n > MAX_LOGPROBS) {
            return Err(Error::Invalid(format!("logprobs = {n}: at most {MAX_LOGPROBS} alternatives per token")));
        }
        Ok(())
    }

    /// Checks every option against `model` too (vocabulary-dependent settings).
    pub fn validate_for(&self, model: &Model) -> Result<()> {
        self.validate()?;
        self.sampler.validate_for(model.vocab_size())?;
        self.processors.validate(model.vocab_size())?;
        if let Some(t) = self.stop.tokens.iter().find(|&&t| t as usize >= model.vocab_size()) {
            return Err(Error::Invalid(format!("stop token {t} is outside the vocabulary of {}", model.vocab_size())));
        }
        if self.min_tokens > self.max_tokens {
            return Err(Error::Invalid(format!(
                "min_tokens = {} is above max_tokens = {}: generation would end before it may (--min-tokens, \
                 --max-tokens)",
                self.min_tokens, self.max_tokens
            )));
        }
        self.context_limit(model)?;
        Ok(())
    }

    /// The most positions a generation with these options may reach on `model` (`None`: no
    /// bound), or an error for a `context_length` that cannot hold.
    pub fn context_limit(&self, model: &Model) -> Result<Option<usize>> {
        let trained = model.context_length();
        let past_allowed = self.allow_past_context || self.cache.max_kv_size.is_some();
        match self.context_length {
            Some(0) => Err(Error::Invalid("context_length (--ctx-size) = 0: give at least 1 position".into())),
            Some(n) => match trained {
                Some(t) if n > t && !past_allowed => Err(Error::Invalid(format!(
                    "context_length (--ctx-size) = {n} is above the model's context of {t} positions \
                     (max_position_embeddings); use at most {t}, or pass allow_past_context \
                     (--allow-past-context) to run past what the model was trained for"
                ))),
                _ => Ok(Some(n)),
            },
            None if past_allowed => Ok(None),
            None => Ok(trained),
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence token (not yielded).
    EndOfSequence,
    /// `max_tokens` were generated.
    Length,
    /// A stop token or stop string.
    Stop(Stopped),
    /// The request was cancelled.
    Cancelled,
    /// The KV cache had no room for another position.
    CacheFull,
    /// The sequence reached the context limit ([`GenerateOptions::context_length`], by default
    /// the model's): as `max_tokens`, an OpenAI `length`, but saying why.
    ContextLength(usize),
    /// A step failed; the error was yielded.
    Error,
}

/// A generated token's log-probability and the most likely alternatives at its step.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The token.
    pub token: u32,
    /// Its log-probability (after the logits processors, before the sampler's filters).
    pub logprob: f32,
    /// The most likely tokens at this step, most likely first.
    pub top: Vec<(u32, f32)>,
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
    /// Time from the first sampled token to the end of generation (as mlx-lm's, whose last
    /// rate is taken as its final token is handed out).
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
    options: GenerateOptions,
    eos: Vec<u32>,
    xtc_exempt: Vec<u32>,
    history: Vec<u32>,
    prompt_len: usize,
    session: Held<'a>,
    reused: usize,
    rng: ChaCha8Rng,
    matcher: StopMatcher,
    yielded: usize,
    finish: Option<FinishReason>,
    logprobs: Vec<TokenLogprobs>,
    /// The last step's raw logits `[1, vocab]`, where the model computed them.
    last_logits: Option<Array>,
    /// Their host copy, made when a step needed it or `last_logits()` asks.
    last_logits_host: OnceLock<Vec<f32>>,
    stats: Stats,
    clock: Option<Instant>,
    /// CUDA graphs: runs the one-token steps.
    decode_graph: DecodeGraph,
    /// Most tokens (prompt and generated) the sequence may hold.
    context_limit: Option<usize>,
}

/// The session a generation fills: its own, or one lent by the caller.
enum Held<'a> {
    Own(Session),
    Lent(&'a mut Session),
}

impl std::ops::Deref for Held<'_> {
    type Target = Session;
    fn deref(&self) -> &Session {
        match self {
            Held::Own(s) => s,
            Held::Lent(s) => s,
        }
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Session {
        match self {
            Held::Own(s) => s,
            Held::Lent(s) => s,
        }
    }
}

/// Starts generating from `prompt` (token ids). Options are checked now; the model runs on the
/// first `next()`.
pub fn generate<'a>(model: &'a Model, prompt: &[u32], options: GenerateOptions) -> Result<Generation<'a>> {
    let session = Session::with_cache(model, &options.cache)?;
    start(model, Held::Own(session), prompt, options)
}

/// Like [`generate`], continuing `session`: the longest prefix of `prompt` that the session
/// already holds is reused, the rest of its cache is trimmed exactly, and only the remainder is
/// computed. After the generation the session holds the prompt and every generated token that
/// was fed back (all but the last). A cache that cannot be trimmed there is started afresh.
pub fn generate_in<'a>(
    model: &'a Model,
    session: &'a mut Session,
    prompt: &[u32],
    options: GenerateOptions,
) -> Result<Generation<'a>> {
    start(model, Held::Lent(session), prompt, options)
}

fn start<'a>(
    model: &'a Model,
    mut session: Held<'a>,
    prompt: &[u32],
    options: GenerateOptions,
) -> Result<Generation<'a>> {
    options.validate_for(model)?;
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt is empty: give at least one token".into()));
    }
    let context_limit = options.context_limit(model)?;
    if let Some(limit) = context_limit.filter(|&l| prompt.len() >= l) {
        let (whose, fix) = match options.context_length {
            Some(_) => ("the context limit set by context_length (--ctx-size)", "or raise context_length (--ctx-size)"),
            None => (
                "the model's context (max_position_embeddings)",
                "bound the cache with max_kv_size (--max-kv-size), or pass allow_past_context \
                 (--allow-past-context) to run past it",
            ),
        };
        return Err(Error::Invalid(format!(
            "the prompt is {} tokens, and {whose} is {limit} positions, which leaves no room to generate; \
             shorten the prompt, {fix}",
            prompt.len()
        )));
    }
    let rng = match options.seed {
        Some(seed) => ChaCha8Rng::seed_from_u64(seed),
        None => ChaCha8Rng::from_entropy(),
    };
    let mut eos = model.eos_token_ids().to_vec();
    eos.extend(&options.extra_eos_token_ids);
    let mut xtc_exempt = model.newline_token_ids().to_vec();
    xtc_exempt.extend(&eos);
    let mut reused = session.reusable(prompt);
    let stale = session.tokens().len() - reused;
    if session.trim(stale).is_err() {
        // The cache kind the options ask for (a recurrent layer's state is never trimmed, so a
        // changed prompt on a hybrid model always lands here).
        *session = Session::with_cache(model, &options.cache)?;
        reused = 0;
    }
    Ok(Generation {
        model,
        eos,
        xtc_exempt,
        history: prompt.to_vec(),
        prompt_len: prompt.len(),
        session,
        reused,
        rng,
        matcher: StopMatcher::default(),
        yielded: 0,
        finish: None,
        logprobs: vec![],
        last_logits: None,
        last_logits_host: OnceLock::new(),
        stats: Stats { prompt_tokens: prompt.len(), ..Stats::default() },
        clock: None,
        decode_graph: DecodeGraph::from_env()?,
        context_limit,
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
    pub fn cache(&self) -> &[LayerCache] {
        self.session.cache()
    }

    /// The model's raw logits at the last step (before processors and sampling), if one ran.
    /// A greedy step on a GPU leaves them there; this copies them to the host on first call
    /// (`None` if that copy fails, as it does only when the device itself fails).
    pub fn last_logits(&self) -> Option<&[f32]> {
        let logits = self.last_logits.as_ref()?;
        if let Some(host) = self.last_logits_host.get() {
            return Some(host);
        }
        let host = logits.to_vec::<f32>().ok()?;
        Some(self.last_logits_host.get_or_init(|| host))
    }

    /// How the one-token steps ran (CUDA graphs replayed, captured, given up).
    pub fn decode_graph(&self) -> &DecodeGraph {
        &self.decode_graph
    }

    /// Prompt tokens taken from the session instead of being computed.
    pub fn reused_tokens(&self) -> usize {
        self.reused
    }

    /// Log-probabilities of the yielded tokens, when [`GenerateOptions::logprobs`] asked for them.
    pub fn logprobs(&self) -> &[TokenLogprobs] {
        &self.logprobs
    }

    /// The logits for the next token, `[1, vocab]` on the model's device.
    fn forward(&mut self) -> Result<Array> {
        let session = &mut *self.session;
        let logits = if self.history.len() == self.prompt_len {
            self.clock = Some(Instant::now());
            let (head, last) = self.history[self.reused..].split_at(self.prompt_len - self.reused - 1);
            for chunk in head.chunks(self.options.prefill_step_size) {
                self.model.prefill(chunk, &mut session.cache)?;
                session.tokens.extend_from_slice(chunk);
                session.maybe_quantize(&self.options.cache)?;
            }
            let logits = self.model.forward_last(last, &mut session.cache)?;
            session.tokens.extend_from_slice(last);
            session.maybe_quantize(&self.options.cache)?;
            logits
        } else {
            let last = *self.history.last().expect("history holds the prompt");
            let logits = self.decode_graph.step(self.model, &mut session.cache, last)?;
            session.tokens.push(last);
            session.maybe_quantize(&self.options.cache)?;
            logits
        };
        Ok(logits)
    }

    /// The greedy token taken where the logits are, when nothing else needs the whole row (no
    /// processors, log-probabilities or banned tokens): only the index, the maximum and its gap
    /// cross to the host, not the row. `None` when the full host path must decide.
    ///
    /// The host path takes the first maximum of `logits - c` (log-softmax, `c` its log-sum-exp,
    /// between the maximum and the maximum + ln(vocab) + rounding). Subtracting `c` keeps the
    /// order but rounding may turn an earlier logit just below the maximum into a tie, which the
    /// host would then pick. A gap over `2^-18 (ln(vocab) + 4 + |max|)`, 16 times the widest
    /// rounding interval of those differences, rules that out; a smaller gap, or a NaN or
    /// infinity in the row, goes the host path, so the token is always the host path's.
    fn greedy_on_device(&self, logits: &Array) -> Result<Option<u32>> {
        let o = &self.options;
        let plain = o.sampler.temperature == 0.0
            && o.processors.is_empty()
            && o.logprobs.is_none()
            && self.yielded >= o.min_tokens;
        if !plain || logits.shape().len() != 2 || logits.dim(0) != 1 {
            return Ok(None);
        }
        let pick = logits.argmax_gap()?.to_vec::<u32>()?;
        let [index, max, gap] = pick[..] else {
            return Err(Error::Invalid(format!("argmax_gap gave {} values for one row", pick.len())));
        };
        let (max, gap) = (f32::from_bits(max), f32::from_bits(gap));
        Ok(survives_log_softmax(max, gap, logits.dim(1)).then_some(index))
    }

    fn step(&mut self) -> Result<u32> {
        let raw = self.forward()?;
        self.last_logits_host = OnceLock::new();
        let token = match self.greedy_on_device(&raw)? {
            Some(token) => token,
            None => self.sample_on_host(&raw)?,
        };
        self.last_logits = Some(raw);
        let now = Instant::now();
        if self.history.len() == self.prompt_len {
            self.stats.prompt_time = now - self.clock.unwrap_or(now);
            self.clock = Some(now);
        } else {
            self.stats.generation_time = now - self.clock.unwrap_or(now);
        }
        self.stats.generation_tokens += 1;
        self.history.push(token);
        Ok(token)
    }

    /// The token from the whole row on the host: the logits processors, the bans of
    /// `min_tokens`, log-softmax, the log-probabilities asked for, then the sampler.
    fn sample_on_host(&mut self, raw: &Array) -> Result<u32> {
        let mut logits = raw.to_vec::<f32>()?;
        // Already read: keep it for last_logits().
        let _ = self.last_logits_host.set(logits.clone());
        self.options.processors.apply(&self.history, &mut logits);
        if self.yielded < self.options.min_tokens {
            let banned =
                self.options.stop.tokens.iter().chain(if self.options.ignore_eos { &[][..] } else { &self.eos[..] });
            for &t in banned {
                if let Some(x) = logits.get_mut(t as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        let mut logprobs = log_softmax(&logits);
        if let Some(n) = self.options.logprobs {
            let mut order: Vec<u32> = (0..logprobs.len() as u32).collect();
            let n = n.min(order.len());
            if n > 0 {
                order.select_nth_unstable_by(n - 1, |&a, &b| logprobs[b as usize].total_cmp(&logprobs[a as usize]));
                order.truncate(n);
                order.sort_by(|&a, &b| logprobs[b as usize].total_cmp(&logprobs[a as usize]));
            }
            let top = order.iter().take(n).map(|&t| (t, logprobs[t as usize])).collect();
            self.logprobs.push(TokenLogprobs { token: 0, logprob: 0.0, top });
        }
        let snapshot = self.options.logprobs.map(|_| logprobs.clone());
        let token = self.options.sampler.sample(&mut logprobs, &self.xtc_exempt, &mut self.rng);
        if let (Some(all), Some(last)) = (snapshot, self.logprobs.last_mut()) {
            last.token = token;
            last.logprob = all[token as usize];
        }
        Ok(token)
    }

    /// Records why generation ended, and closes the generation clock there, as mlx-lm's last
    /// rate is taken when its final token is handed out: one token still gets an interval.
    fn set_finish(&mut self, reason: FinishReason) {
        if let (Some(clock), true) = (self.clock, self.stats.generation_tokens > 0) {
            self.stats.generation_time = clock.elapsed();
        }
        self.finish = Some(reason);
    }

    fn end(&mut self, reason: FinishReason) -> Option<Result<u32>> {
        self.set_finish(reason);
        // A token that is not yielded has no log-probability entry either.
        if self.logprobs.len() > self.yielded {
            self.logprobs.truncate(self.yielded);
        }
        None
    }
}

/// Whether the first maximum of a row of `vocab` logits, `max`, lying `gap` above every value
/// before it, is certainly also the first maximum of the row's log-softmax (see
/// `Generation::greedy_on_device`). NaN gaps (a row with NaN or infinities) are not.
fn survives_log_softmax(max: f32, gap: f32, vocab: usize) -> bool {
    let bound = ((vocab as f32).ln() + 4.0 + max.abs()) * (-18f32).exp2();
    gap > bound
}

impl Iterator for Generation<'_> {
    type Item = Result<u32>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finish.is_some() {
            return None;
        }
        if self.yielded >= self.options.max_tokens {
            return self.end(FinishReason::Length);
        }
        if let Some(limit) = self.context_limit.filter(|&l| self.history.len() >= l) {
            return self.end(FinishReason::ContextLength(limit));
        }
        let token = match self.step() {
            Ok(t) => t,
            Err(e) => {
                self.finish = Some(FinishReason::Error);
                return Some(Err(e));
            }
        };
        if !self.options.ignore_eos && self.eos.contains(&token) {
            return self.end(FinishReason::EndOfSequence);
        }
        if self.options.stop.tokens.contains(&token) {
            return self.end(FinishReason::Stop(Stopped::Token(token)));
        }
        self.yielded += 1;
        let armed = self.yielded >= self.options.min_tokens;
        if let Some((index, cut)) = self.matcher.push(&self.options.stop, token, armed) {
            self.set_finish(FinishReason::Stop(Stopped::String { index, cut }));
        } else if self.yielded == self.options.max_tokens {
            self.set_finish(FinishReason::Length);
        }
        Some(Ok(token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::argmax;

    /// The prefill pass size by device: mlx-lm's 2048 on the CPU (also the device-free default),
    /// 4096 on CUDA; `for_device` changes nothing else.
    #[test]
    fn prefill_step_by_device() {
        assert_eq!(default_prefill_step(Device::Cpu), 2048);
        assert_eq!(
            GenerateOptions::for_device(Device::Cpu).prefill_step_size,
            GenerateOptions::default().prefill_step_size
        );
        #[cfg(feature = "cuda")]
        {
            assert_eq!(default_prefill_step(Device::Cuda(1)), 4096);
            let cuda = GenerateOptions::for_device(Device::Cuda(0));
            assert_eq!(cuda.prefill_step_size, 4096);
            assert_eq!(
                format!("{:?}", GenerateOptions { prefill_step_size: 2048, ..cuda }),
                format!("{:?}", GenerateOptions::default())
            );
        }
    }

    /// The greedy token taken from (index, max, gap) must be the host path's,
    /// `argmax(log_softmax(row))`, whenever `survives_log_softmax` trusts it: random rows of
    /// several scales, and rows with an earlier value a few ulps to a few bounds below the
    /// maximum (where rounding in the log-softmax can make a tie).
    #[test]
    fn trusted_greedy_picks_equal_the_host_path() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        let (mut trusted, mut fell_back, mut would_differ) = (0, 0, 0);
        for case in 0..3000 {
            let vocab = [7usize, 1000, 5000][case % 3];
            let scale = [0.01f32, 1.0, 30.0, 3000.0][(case / 3) % 4];
            let shift = [0.0f32, -50.0, 200.0][(case / 12) % 3];
            let mut row: Vec<f32> = (0..vocab).map(|_| (next() * 2.0 - 1.0) * scale + shift).collect();
            let t = (next() * vocab as f32) as usize % vocab;
            let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) + next() * scale * 0.01;
            row[t] = top;
            if t > 0 && case % 2 == 1 {
                // An earlier near tie: k ulps below, or a multiple of the bound below.
                let j = (next() * t as f32) as usize % t;
                row[j] = if case % 4 == 1 {
                    f32::from_bits(top.to_bits() - 1 - (next() * 64.0) as u32)
                } else {
                    let bound = ((vocab as f32).ln() + 4.0 + top.abs()) * (-18f32).exp2();
                    top - bound * (0.5 + 2.0 * next())
                };
            }
            let array = Array::from_slice(&row, &[1, vocab]).unwrap();
            let pick = array.argmax_gap().unwrap().to_vec::<u32>().unwrap();
            let (index, max, gap) = (pick[0], f32::from_bits(pick[1]), f32::from_bits(pick[2]));
            let host = argmax(&log_softmax(&row));
            if index != host {
                would_differ += 1;
            }
            if survives_log_softmax(max, gap, vocab) {
                trusted += 1;
                assert_eq!(index, host, "case {case}: vocab {vocab}, max {max}, gap {gap}");
            } else {
                fell_back += 1;
            }
        }
        eprintln!("{trusted} trusted, {fell_back} fell back, {would_differ} where argmax(raw) != host path");
        assert!(trusted > 1400, "the device path should decide the ordinary rows ({trusted} of 3000 decided)");
        assert!(fell_back > 0, "the near ties should reach the host path");
    }

    #[test]
    fn rows_with_nan_or_infinity_go_to_the_host() {
        for row in [vec![1.0, f32::NAN, 0.5], vec![f32::NEG_INFINITY, 0.0, 2.0], vec![1.0, f32::INFINITY]] {
            let a = Array::from_slice(&row, &[1, row.len()]).unwrap();
            let pick = a.argmax_gap().unwrap().to_vec::<u32>().unwrap();
            assert!(!survives_log_softmax(f32::from_bits(pick[1]), f32::from_bits(pick[2]), row.len()), "{row:?}");
        }
    }
}
