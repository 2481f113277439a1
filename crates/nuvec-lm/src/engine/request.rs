//! One request's state machine, the same for [`crate::generate`] and the [`super::Batcher`]: its
//! tokens so far, its random stream, logits processors, sampler, stops, log-probabilities and
//! why it ended. It never runs the model: it is handed each step's logits row and decides the
//! next token and whether the request goes on.

use nuvec::Array;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::constrain::TokenMask;
use crate::generate::{FinishReason, GenerateOptions, TokenLogprobs};
use crate::models::Model;
use crate::sample::{argmax, categorical_from_logits, draw, log_softmax};
use crate::stop::{StopMatcher, Stopped};
use crate::{Error, Result};

/// A request from its prompt to its finish reason.
pub(crate) struct Request {
    pub(crate) options: GenerateOptions,
    eos: Vec<u32>,
    xtc_exempt: Vec<u32>,
    /// The prompt, then every sampled token (the last one not yet fed to the model).
    pub(crate) history: Vec<u32>,
    pub(crate) prompt_len: usize,
    rng: ChaCha8Rng,
    matcher: StopMatcher,
    yielded: usize,
    finish: Option<FinishReason>,
    logprobs: Vec<TokenLogprobs>,
    /// Most tokens (prompt and generated) the sequence may hold.
    context_limit: Option<usize>,
    /// Where the request stands in its constraint's grammar, when it has one.
    mask: Option<TokenMask>,
    /// A token taken into the grammar ahead of [`Request::accept`] ([`commit_constraints`]),
    /// and whether the grammar took it.
    committed: Option<(u32, bool)>,
    /// The generator before the uniform of a draw where the logits are ([`Request::predraw`]),
    /// until the draw is taken or handed to the host path.
    before_draw: Option<ChaCha8Rng>,
}

impl Request {
    /// Checks `options` against `model` and `prompt` against the context limit. On a model split
    /// across ranks every rank samples alike (each calls this in turn, drawing rank 0's seed
    /// when `options` give none).
    pub(crate) fn new(model: &Model, prompt: &[u32], options: GenerateOptions) -> Result<Self> {
        Request::sampled_by(model, prompt, options, model.ranks())
    }

    /// [`Request::new`] for a request only this rank samples (a Batcher's, on rank 0).
    pub(crate) fn here(model: &Model, prompt: &[u32], options: GenerateOptions) -> Result<Self> {
        Request::sampled_by(model, prompt, options, None)
    }

    /// [`Request::new`]; `ranks`, when given, share the seed.
    fn sampled_by(
        model: &Model,
        prompt: &[u32],
        options: GenerateOptions,
        ranks: Option<&nuvec::distributed::Group>,
    ) -> Result<Self> {
        options.validate_for(model)?;
        if prompt.is_empty() {
            return Err(Error::Invalid("the prompt is empty: give at least one token".into()));
        }
        if let Some(&t) = prompt.iter().find(|&&t| t as usize >= model.vocab_size()) {
            return Err(Error::Invalid(format!(
                "prompt token {t} is outside the vocabulary of {} (was it encoded with another tokenizer?)",
                model.vocab_size()
            )));
        }
        let context_limit = options.context_limit(model)?;
        if let Some(limit) = context_limit.filter(|&l| prompt.len() >= l) {
            let (whose, fix) = match options.context_length {
                Some(_) => {
                    ("the context limit set by context_length (--ctx-size)", "or raise context_length (--ctx-size)")
                }
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
        let rng = match (options.seed, ranks) {
            (Some(seed), _) => ChaCha8Rng::seed_from_u64(seed),
            // Every rank of a split model samples, and must draw the same tokens.
            (None, Some(group)) => ChaCha8Rng::seed_from_u64(crate::parallel::seed_of_rank0(group)?),
            (None, None) => ChaCha8Rng::from_entropy(),
        };
        let mut eos = model.eos_token_ids().to_vec();
        eos.extend(&options.extra_eos_token_ids);
        let mut xtc_exempt = model.newline_token_ids().to_vec();
        xtc_exempt.extend(&eos);
        let mask = options.constraint.as_ref().map(|g| g.start()).transpose()?;
        Ok(Request {
            options,
            eos,
            xtc_exempt,
            history: prompt.to_vec(),
            prompt_len: prompt.len(),
            rng,
            matcher: StopMatcher::default(),
            yielded: 0,
            finish: None,
            logprobs: vec![],
            context_limit,
            mask,
            committed: None,
            before_draw: None,
        })
    }

    /// Why the request ended, once it has.
    pub(crate) fn finish_reason(&self) -> Option<&FinishReason> {
        self.finish.as_ref()
    }

    /// Log-probabilities of the handed-out tokens, when the options asked for them.
    pub(crate) fn logprobs(&self) -> &[TokenLogprobs] {
        &self.logprobs
    }

    /// Before a step: ends the request when it has its `max_tokens` or fills its context, so no
    /// step runs for it. Returns whether it ended.
    pub(crate) fn reached_limit(&mut self) -> bool {
        if self.finish.is_some() {
            return true;
        }
        if self.yielded >= self.options.max_tokens {
            self.end(FinishReason::Length);
        } else if let Some(limit) = self.context_limit.filter(|&l| self.history.len() >= l) {
            self.end(FinishReason::ContextLength(limit));
        }
        self.finish.is_some()
    }

    /// Whether the next token accepted ends the request by its limits ([`Request::reached_limit`]
    /// after it), whatever the token: a pipelined step leaves it out of the step after.
    pub(crate) fn last_before_limit(&self) -> bool {
        self.yielded + 1 >= self.options.max_tokens || self.context_limit.is_some_and(|l| self.history.len() + 1 >= l)
    }

    /// Ends the request for `reason` (a token not handed out keeps no log-probability entry).
    pub(crate) fn end(&mut self, reason: FinishReason) {
        self.finish = Some(reason);
        if self.logprobs.len() > self.yielded {
            self.logprobs.truncate(self.yielded);
        }
    }

    /// Whether the next token can be the raw logits' greedy pick without reading the row: no
    /// processors, log-probabilities or bans of `min_tokens` (see [`greedy_from_gap`]).
    pub(crate) fn plain_greedy(&self) -> bool {
        self.options.sampler.temperature == 0.0 && self.only_the_pick() && self.mask.is_none()
    }

    /// Whether the row is needed for nothing but the next token's pick: no processors,
    /// log-probabilities or bans of `min_tokens`.
    fn only_the_pick(&self) -> bool {
        let o = &self.options;
        o.processors.is_empty() && o.logprobs.is_none() && self.yielded >= o.min_tokens
    }

    /// The greedy token from one row's `argmax_gap` triple, when it is certainly the host
    /// path's pick.
    pub(crate) fn greedy_from_gap(&self, pick: &[u32], vocab: usize) -> Result<Option<u32>> {
        let [index, max, gap] = pick[..] else {
            return Err(Error::Invalid(format!("argmax_gap gave {} values for one row", pick.len())));
        };
        let (max, gap) = (f32::from_bits(max), f32::from_bits(gap));
        Ok(survives_log_softmax(max, gap, vocab).then_some(index))
    }

    /// The greedy token taken where `logits [1, vocab]` are, when nothing needs the whole row
    /// (a constraint's mask is applied there: [`Request::masked_greedy`]); `None` when the host
    /// path must decide.
    pub(crate) fn greedy_on_device(&mut self, logits: &Array) -> Result<Option<u32>> {
        if logits.shape().len() != 2 || logits.dim(0) != 1 {
            return Ok(None);
        }
        let vocab = logits.dim(1);
        if self.masked_greedy() {
            let mut bits = vec![0u32; vocab.div_ceil(32)];
            if !self.write_mask_bits(&mut bits) {
                return Ok(None);
            }
            let masked = logits.masked_argmax_gap(&bits, MASKED)?.to_vec::<u32>()?;
            return self.greedy_from_masked_gap(&masked, &logits.argmax_gap()?.to_vec::<u32>()?, vocab);
        }
        if !self.plain_greedy() {
            return Ok(None);
        }
        self.greedy_from_gap(&logits.argmax_gap()?.to_vec::<u32>()?, vocab)
    }

    /// Whether the next token can be the greedy pick of the raw logits with the constraint's
    /// mask applied where they are: greedy, a constraint, nothing else that needs the row.
    pub(crate) fn masked_greedy(&self) -> bool {
        self.mask.is_some() && self.options.sampler.temperature == 0.0 && self.only_the_pick()
    }

    /// Writes the tokens the constraint allows next into `bits` (a row's words, 32 tokens a
    /// word); false when there is no constraint or it failed (the host path then reports it).
    pub(crate) fn write_mask_bits(&mut self, bits: &mut [u32]) -> bool {
        let eos = &self.eos;
        self.mask.as_mut().is_some_and(|m| m.write_bits(bits, eos).is_ok())
    }

    /// The greedy token from a row's `argmax_gap` triples with the constraint's mask applied
    /// (refused tokens [`MASKED`]) and without it, when it is certainly the host path's pick
    /// (log-softmax over the whole row, then the mask): the host's log-sum-exp lies within
    /// ln(vocab) above the raw row's maximum, so its rounding is bounded as in
    /// [`survives_log_softmax`] with both maxima's magnitudes. A row whose every token is refused,
    /// or that holds a NaN or an infinity, goes the host path.
    pub(crate) fn greedy_from_masked_gap(&self, masked: &[u32], raw: &[u32], vocab: usize) -> Result<Option<u32>> {
        let (&[index, max, gap], &[_, raw_max, raw_gap]) = (masked, raw) else {
            return Err(Error::Invalid(format!(
                "argmax_gap gave {} and {} values for one row",
                masked.len(),
                raw.len()
            )));
        };
        let (max, gap, raw_max, raw_gap) =
            (f32::from_bits(max), f32::from_bits(gap), f32::from_bits(raw_max), f32::from_bits(raw_gap));
        if max <= MASKED || raw_gap.is_nan() {
            return Ok(None);
        }
        Ok(survives_log_softmax(max.abs() + raw_max.abs(), gap, vocab).then_some(index))
    }

    /// Whether the next token is a draw at 1/temperature alone from a row of `vocab` logits, with
    /// no filter, processors, log-probabilities, bans of `min_tokens` or constraint: the host path
    /// then draws from the raw logits ([`categorical_from_logits`]), and a device can draw it
    /// where the logits are (`nuvec::Array::sample_rows`).
    pub(crate) fn plain_sampled(&self, vocab: usize) -> bool {
        self.options.sampler.draws_plainly(vocab) && self.only_the_pick() && self.mask.is_none()
    }

    /// The scale and the uniform of the next draw, for a draw where the logits are: the uniform
    /// is the one the host path's draw would take from the request's generator, whose state
    /// before it is kept until [`Request::drawn_on_device`].
    pub(crate) fn predraw(&mut self) -> (f32, f64) {
        self.before_draw = Some(self.rng.clone());
        (self.options.sampler.scale(), self.rng.gen())
    }

    /// The token of a draw where the logits were (`sample_rows`' words for this row: token,
    /// certain, 0) when it is certainly the host path's; otherwise `None`, with the generator set
    /// back to before [`Request::predraw`], so that the host path draws the same uniform.
    pub(crate) fn drawn_on_device(&mut self, words: &[u32]) -> Result<Option<u32>> {
        let &[token, certain, _] = words else {
            return Err(Error::Invalid(format!("sample_rows gave {} values for one row", words.len())));
        };
        if certain == 1 {
            self.before_draw = None;
            return Ok(Some(token));
        }
        self.undraw();
        Ok(None)
    }

    /// Sets the generator back to before [`Request::predraw`] (a no-op after the draw was taken).
    fn undraw(&mut self) {
        if let Some(rng) = self.before_draw.take() {
            self.rng = rng;
        }
    }

    /// The token of a draw where `logits [1, vocab]` are (see [`Request::plain_sampled`]) when it
    /// is certainly the host path's; `None` when the host path must draw (the generator as it was).
    pub(crate) fn sampled_on_device(&mut self, logits: &Array) -> Result<Option<u32>> {
        if logits.shape().len() != 2 || logits.dim(0) != 1 || !self.plain_sampled(logits.dim(1)) {
            return Ok(None);
        }
        let (scale, u) = self.predraw();
        match logits.sample_rows(&[scale], &[u]).and_then(|w| w.to_vec::<u32>()) {
            Ok(words) => self.drawn_on_device(&words),
            Err(e) => {
                self.undraw();
                Err(e.into())
            }
        }
    }

    /// The token from the whole row on the host: the logits processors, the bans of
    /// `min_tokens`, log-softmax, the constraint's mask, the log-probabilities asked for, then
    /// the sampler. An error when the constraint fails or leaves no token.
    pub(crate) fn sample_on_host(&mut self, logits: Vec<f32>) -> Result<u32> {
        if self.plain_sampled(logits.len()) {
            // Nothing but the draw applies: from the raw logits, as the device's draw computes it.
            return Ok(categorical_from_logits(&logits, self.options.sampler.scale(), &mut self.rng));
        }
        let mut logprobs = self.processed(logits)?;
        let snapshot = self.options.logprobs.map(|_| logprobs.clone());
        let token = self.options.sampler.sample(&mut logprobs, &self.xtc_exempt, &mut self.rng);
        self.record_pick(snapshot, token);
        Ok(token)
    }

    /// Speculative decoding's rejection rule for a guess drawn from a draft's distribution `q`
    /// (its probability per token): the row's own distribution `p` takes the guess with
    /// probability min(1, p/q), else draws from max(0, p - q) renormalized, so the token is
    /// distributed as `p` whatever `q` was. Returns the token and whether it is the guess.
    /// Greedy decoding takes the row's argmax (the guess when they agree).
    pub(crate) fn verify_drawn_guess(&mut self, logits: Vec<f32>, guess: u32, q: &[f64]) -> Result<(u32, bool)> {
        let mut logprobs = self.processed(logits)?;
        let snapshot = self.options.logprobs.map(|_| logprobs.clone());
        let token = match self.options.sampler.distribution(&mut logprobs, &self.xtc_exempt, &mut self.rng) {
            None => argmax(&logprobs),
            Some(p) => {
                let (pg, qg) =
                    (p.get(guess as usize).copied().unwrap_or(0.0), q.get(guess as usize).copied().unwrap_or(0.0));
                let u: f64 = self.rng.gen();
                if qg > 0.0 && u * qg < pg {
                    guess
                } else {
                    let residual: Vec<f64> =
                        p.iter().zip(q.iter().chain(std::iter::repeat(&0.0))).map(|(a, b)| (a - b).max(0.0)).collect();
                    if residual.iter().any(|&r| r > 0.0) {
                        draw(&residual, &mut self.rng)
                    } else {
                        draw(&p, &mut self.rng)
                    }
                }
            }
        };
        self.record_pick(snapshot, token);
        Ok((token, token == guess))
    }

    /// A row's log-probabilities before the sampler: the logits processors, the bans of
    /// `min_tokens`, log-softmax, the constraint's mask; records the top log-probabilities asked for.
    fn processed(&mut self, mut logits: Vec<f32>) -> Result<Vec<f32>> {
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
        if let Some(mask) = self.mask.as_mut() {
            mask.apply(&mut logprobs, &self.eos)?;
        }
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
        Ok(logprobs)
    }

    /// Notes the picked token and its log-probability in the record [`Request::processed`] began.
    fn record_pick(&mut self, snapshot: Option<Vec<f32>>, token: u32) {
        if let (Some(all), Some(last)) = (snapshot, self.logprobs.last_mut()) {
            last.token = token;
            last.logprob = all[token as usize];
        }
    }

    /// Whether the request's output is held to a constraint.
    pub(crate) fn constrained(&self) -> bool {
        self.mask.is_some()
    }

    /// Whether [`Request::accept`] takes `token` into the constraint's grammar: there is one, and
    /// the token does not end the request first (end-of-sequence, a stop token).
    fn takes_into_grammar(&self, token: u32) -> bool {
        self.mask.is_some()
            && (self.options.ignore_eos || !self.eos.contains(&token))
            && !self.options.stop.tokens.contains(&token)
    }

    /// Takes the sampled `token`: end-of-sequence and stop tokens end the request without being
    /// handed out (`None`); any other token is handed out, and may end it (a stop string it
    /// completes, the last of `max_tokens`).
    pub(crate) fn accept(&mut self, token: u32) -> Option<u32> {
        self.history.push(token);
        if !self.options.ignore_eos && self.eos.contains(&token) {
            self.end(FinishReason::EndOfSequence);
            return None;
        }
        if self.options.stop.tokens.contains(&token) {
            self.end(FinishReason::Stop(Stopped::Token(token)));
            return None;
        }
        let committed = match self.committed.take() {
            Some((t, ok)) if t == token => Some(ok),
            _ => None,
        };
        if let Some(mask) = self.mask.as_mut() {
            if !committed.unwrap_or_else(|| mask.commit(token).is_ok()) {
                // The mask allowed only tokens the grammar takes: a parser fault, not the input's.
                self.end(FinishReason::Error);
                return None;
            }
        }
        self.yielded += 1;
        let armed = self.yielded >= self.options.min_tokens;
        if let Some((index, cut)) = self.matcher.push(&self.options.stop, token, armed) {
            self.finish = Some(FinishReason::Stop(Stopped::String { index, cut }));
        } else if self.mask.as_ref().is_some_and(TokenMask::is_complete) {
            // Nothing may follow but the end: the output ends here, as end-of-sequence would.
            self.finish = Some(FinishReason::EndOfSequence);
        } else if self.yielded == self.options.max_tokens {
            let unfinished = self.mask.as_mut().is_some_and(|m| !m.is_accepting());
            self.finish = Some(if unfinished { FinishReason::ConstraintUnfinished } else { FinishReason::Length });
        }
        Some(token)
    }

    /// Guessed tokens a step may feed after its last one: a right guess is handed out, so at
    /// most the tokens it may still hand out beyond the one the step samples anyway, none past
    /// its context, and none under a constraint (its mask follows the tokens taken one by one).
    pub(crate) fn draft_room(&self) -> usize {
        if self.mask.is_some() || self.finish.is_some() {
            return 0;
        }
        let left = self.options.max_tokens.saturating_sub(self.yielded + 1);
        let context = self.context_limit.map_or(usize::MAX, |l| l.saturating_sub(self.history.len() + 1));
        left.min(context)
    }

    /// Marks the request failed (its step's error is handed out by the caller).
    pub(crate) fn fail(&mut self) {
        self.finish = Some(FinishReason::Error);
    }
}

/// What a constraint's mask writes over a refused token's logit for the device's greedy pick: the
/// lowest finite f32, so that the row stays finite (`argmax_gap` reports no gap for a row holding
/// an infinity) and below every logit a model gives.
pub(crate) const MASKED: f32 = f32::MIN;

/// Whether the first maximum of a row of `vocab` logits, `max`, lying `gap` above every value
/// before it, is certainly also the first maximum of the row's log-softmax.
///
/// The host path takes the first maximum of `logits - c` (log-softmax, `c` its log-sum-exp,
/// between the maximum and the maximum + ln(vocab) + rounding). Subtracting `c` keeps the
/// order but rounding may turn an earlier logit just below the maximum into a tie, which the
/// host would then pick. A gap over `2^-18 (ln(vocab) + 4 + |max|)`, 16 times the widest
/// rounding interval of those differences, rules that out; a smaller gap, or a NaN or
/// infinity in the row (a NaN gap), goes the host path, so the token is always the host path's.
pub(crate) fn survives_log_softmax(max: f32, gap: f32, vocab: usize) -> bool {
    let bound = ((vocab as f32).ln() + 4.0 + max.abs()) * (-18f32).exp2();
    gap > bound
}

/// Takes each request's sampled token into its constraint's grammar ahead of
/// [`Request::accept`], all at once ([`crate::constrain::commit_all`]); `accept` of the same
/// token then finds it taken. Requests without a constraint, or whose token ends them first, are
/// left to `accept`.
pub(crate) fn commit_constraints(requests: &mut [(&mut Request, u32)]) {
    let mut masks = vec![];
    let mut owners = vec![];
    for (i, (request, token)) in requests.iter_mut().enumerate() {
        if request.takes_into_grammar(*token) {
            owners.push((i, *token));
            masks.push((request.mask.as_mut().expect("takes_into_grammar: a constraint"), *token));
        }
    }
    if masks.len() < 2 {
        return;
    }
    let taken = crate::constrain::commit_all(&mut masks);
    drop(masks);
    for ((i, token), ok) in owners.into_iter().zip(taken) {
        requests[i].0.committed = Some((token, ok.is_ok()));
    }
}
