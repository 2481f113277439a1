//! The decode loop, as mlx-lm's `generate_step` / `stream_generate`: the prompt is prefilled in
//! chunks, leaving its last token for the first decode step; each step runs the logits
//! processors on the raw logits, turns them into log-probabilities, and samples; end-of-sequence
//! and stop tokens end generation without being yielded; stop strings end it at the token that
//! completes them; `max_tokens` bounds it.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nuvec::{Array, Device};

use crate::cache::{CacheOptions, LayerCache};
use crate::constrain::Grammar;
use crate::decode_graph::DecodeGraph;
use crate::engine::request::Request;
use crate::models::Model;
use crate::processors::LogitsProcessors;
use crate::sample::Sampler;
use crate::session::Session;
use crate::stop::{Stop, Stopped};
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
    /// What the output must be (a JSON schema, a regex...: [`crate::constrain`]); default none.
    /// Tokens the grammar does not allow next get log-probability minus infinity after the
    /// logits processors, end-of-sequence is allowed exactly where the grammar may end, and the
    /// output ends where the grammar is complete. Stop strings still end it (possibly short of
    /// the grammar's end); `max_tokens` cuts it as any output. Refused with `ignore_eos` and with
    /// `min_tokens` (the grammar decides where the output ends).
    pub constraint: Option<Grammar>,
    /// Called as the prompt is prefilled, with the positions done and the prompt's length
    /// (mlx-lm's `prompt_progress_callback`): after each prefill pass, the last with the two
    /// equal. Default none.
    pub prompt_progress: Option<PromptProgress>,
    /// The served adapter the request runs with, by name ([`crate::Model::adapter_names`],
    /// [`crate::LoadOptions::served_adapters`]); default none (the base model). A
    /// [`crate::Batcher`] runs it; [`generate`] refuses it (load the model with
    /// [`crate::LoadOptions::adapter_path`] for one adapter on every generation).
    pub adapter: Option<String>,
    /// A request's cache salt (vLLM's `cache_salt`): in a [`crate::Batcher`] with prefix
    /// caching, its prompt shares cached blocks only with requests of the same salt (and
    /// adapter). Tenants with a salt of their own cannot tell from a faster first token what
    /// others asked. Non-empty when set; default none. A generation alone shares nothing.
    pub cache_salt: Option<String>,
}

/// A prompt-progress callback ([`GenerateOptions::prompt_progress`]): `(done, total)`.
#[derive(Clone)]
pub struct PromptProgress(pub std::sync::Arc<dyn Fn(usize, usize) + Send + Sync>);

impl std::fmt::Debug for PromptProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PromptProgress(..)")
    }
}

/// Prompt positions per prefill forward pass by default on `device`: 2048 (mlx-lm's
/// `prefill_step_size`) on the CPU, 4096 on a CUDA device. There every forward pass of more than
/// 8 positions decodes each quantized weight to bf16 tiles for the tensor cores (~7 % of an 8B's
/// 4096-token prefill at 2048, by ncu), so fewer, longer passes are faster: on an H200 a random
/// Llama-3.1-8B prefilled 4096 tokens 6 % faster and a 1B 9 % faster in one pass than in two
/// (the CUDA journal, `git show 83079a1:docs/cuda.md`, eighth session). A pass's activations grow
/// with it (an 8B's f32 gate and up outputs alone take 235 MB per 2048 positions); set
/// `prefill_step_size` lower where memory is short.
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
            constraint: None,
            prompt_progress: None,
            adapter: None,
            cache_salt: None,
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
        if self.cache_salt.as_ref().is_some_and(String::is_empty) {
            return Err(Error::Invalid("cache_salt is empty: give a non-empty string, or none".into()));
        }
        if let Some(n) = self.logprobs.filter(|&n| n > MAX_LOGPROBS) {
            return Err(Error::Invalid(format!("logprobs = {n}: at most {MAX_LOGPROBS} alternatives per token")));
        }
        if self.constraint.is_some() && (self.ignore_eos || self.min_tokens > 0) {
            let what = if self.ignore_eos { "ignore_eos (--ignore-eos)" } else { "min_tokens (--min-tokens)" };
            return Err(Error::Invalid(format!(
                "{what} with a constraint: the grammar decides where the output ends; drop one of them"
            )));
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
        if let Some(g) = self.constraint.as_ref().filter(|g| g.vocabulary_size() > model.vocab_size()) {
            return Err(Error::Invalid(format!(
                "the constraint was compiled for a vocabulary of {} tokens, more than the model's {}: \
                 compile it with this model's tokenizer",
                g.vocabulary_size(),
                model.vocab_size()
            )));
        }
        if let Some(name) = &self.adapter {
            model.adapter_id(name)?;
        }
        self.context_limit(model)?;
        Ok(())
    }

    /// Errs when a served adapter is chosen for `run`, a generation outside a Batcher (only the
    /// Batcher's steps carry a sequence's adapter to the projections).
    pub(crate) fn refuse_served_adapter(&self, run: &str) -> Result<()> {
        match &self.adapter {
            None => Ok(()),
            Some(name) => Err(Error::Unsupported(format!(
                "adapter {name:?} chosen for {run}: served adapters run in a Batcher (`nuvec serve \
                 --lora-modules`); for one adapter on every generation, load with LoadOptions::adapter_path \
                 (--adapter-path)"
            ))),
        }
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
    /// `max_tokens` were generated inside the constraint's grammar, where it may not end: the
    /// output does not satisfy the constraint (an OpenAI `length`, saying why).
    ConstraintUnfinished,
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
    /// Sampling, stops and finish reason: the part shared with the [`crate::Batcher`].
    request: Request,
    session: Held<'a>,
    reused: usize,
    /// The last step's raw logits `[1, vocab]`, where the model computed them.
    last_logits: Option<Array>,
    /// Their host copy, made when a step needed it or `last_logits()` asks.
    last_logits_host: OnceLock<Vec<f32>>,
    stats: Stats,
    clock: Option<Instant>,
    /// CUDA graphs: runs the one-token steps.
    decode_graph: DecodeGraph,
    /// Whether a request sampled at a temperature alone draws where the logits are
    /// (`NUVEC_DEVICE_SAMPLING`, as the Batcher's [`crate::BatcherOptions::device_sampling`]).
    device_sampling: bool,
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
    options.refuse_served_adapter("one generation")?;
    let request = Request::new(model, prompt, options)?;
    let mut reused = session.reusable(prompt);
    let stale = session.tokens().len() - reused;
    if session.trim(stale).is_err() {
        // The cache kind the options ask for (a recurrent layer's state is never trimmed, so a
        // changed prompt on a hybrid model always lands here).
        *session = Session::with_cache(model, &request.options.cache)?;
        reused = 0;
    }
    Ok(Generation {
        model,
        request,
        session,
        reused,
        last_logits: None,
        last_logits_host: OnceLock::new(),
        stats: Stats { prompt_tokens: prompt.len(), ..Stats::default() },
        clock: None,
        decode_graph: DecodeGraph::for_device(model.device())?,
        device_sampling: crate::engine::device_sampling_default(model.device())?,
    })
}

impl Generation<'_> {
    /// Why generation ended, once it has.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.request.finish_reason()
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
        self.request.logprobs()
    }

    /// The logits for the next token, `[1, vocab]` on the model's device.
    fn forward(&mut self) -> Result<Array> {
        let session = &mut *self.session;
        let (history, prompt_len) = (&self.request.history, self.request.prompt_len);
        let cache_options = &self.request.options.cache;
        let logits = if history.len() == prompt_len {
            self.clock = Some(Instant::now());
            let (head, last) = history[self.reused..].split_at(prompt_len - self.reused - 1);
            let progress = self.request.options.prompt_progress.as_ref();
            let mut done = self.reused;
            for chunk in head.chunks(self.request.options.prefill_step_size) {
                self.model.prefill(chunk, &mut session.cache)?;
                session.tokens.extend_from_slice(chunk);
                session.maybe_quantize(cache_options)?;
                done += chunk.len();
                if let Some(PromptProgress(report)) = progress {
                    report(done, prompt_len);
                }
            }
            let logits = self.model.forward_last(last, &mut session.cache)?;
            session.tokens.extend_from_slice(last);
            session.maybe_quantize(cache_options)?;
            if let Some(PromptProgress(report)) = progress {
                report(prompt_len, prompt_len);
            }
            logits
        } else {
            let last = *history.last().expect("history holds the prompt");
            let logits = self.decode_graph.step(self.model, &mut session.cache, last)?;
            session.tokens.push(last);
            session.maybe_quantize(cache_options)?;
            logits
        };
        Ok(logits)
    }

    fn step(&mut self) -> Result<u32> {
        let raw = self.forward()?;
        self.last_logits_host = OnceLock::new();
        let on_device = match self.request.greedy_on_device(&raw)? {
            None if self.device_sampling => self.request.sampled_on_device(&raw)?,
            picked => picked,
        };
        let token = match on_device {
            Some(token) => token,
            None => {
                let host = raw.to_vec::<f32>()?;
                // Already read: keep it for last_logits().
                let _ = self.last_logits_host.set(host.clone());
                self.request.sample_on_host(host)?
            }
        };
        self.last_logits = Some(raw);
        let now = Instant::now();
        if self.request.history.len() == self.request.prompt_len {
            self.stats.prompt_time = now - self.clock.unwrap_or(now);
            self.clock = Some(now);
        } else {
            self.stats.generation_time = now - self.clock.unwrap_or(now);
        }
        self.stats.generation_tokens += 1;
        Ok(token)
    }

    /// Closes the generation clock as the generation ends, as mlx-lm's last rate is taken when
    /// its final token is handed out: one token still gets an interval.
    fn close_clock(&mut self) {
        if let (Some(clock), true) = (self.clock, self.stats.generation_tokens > 0) {
            self.stats.generation_time = clock.elapsed();
        }
    }
}

impl Iterator for Generation<'_> {
    type Item = Result<u32>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.request.finish_reason().is_some() {
            return None;
        }
        if self.request.reached_limit() {
            self.close_clock();
            return None;
        }
        let token = match self.step() {
            Ok(t) => t,
            Err(e) => {
                self.request.fail();
                return Some(Err(e));
            }
        };
        let handed_out = self.request.accept(token);
        if self.request.finish_reason().is_some() {
            self.close_clock();
        }
        handed_out.map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::survives_log_softmax;
    use crate::sample::{argmax, log_softmax};

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
