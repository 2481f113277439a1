//! One request's walk through its grammar.

use std::sync::mpsc::{channel, Receiver};
use std::sync::OnceLock;

use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, TokenParser};

use crate::{Error, Result};

/// Where one request stands in its grammar: the tokens it may take next, and each token it took.
/// The next mask is computed on the masks' thread pool as soon as a token is taken (and, for the
/// first, as soon as the request starts), so that it is ready, or nearly, when the forward pass
/// that needs it ends: generation and the Batcher's steps wait for it only at the sampler.
pub(crate) struct TokenMask {
    state: State,
    /// The vocabulary's end-of-sequence id (the one llguidance's masks speak of).
    eos: u32,
    /// Whether the grammar is complete: nothing may follow but the end.
    complete: bool,
    /// The mask of the next token once computed, until a token is taken.
    ready: Option<SimpleVob>,
}

/// A mask, or llguidance's error as text.
type MaskResult = std::result::Result<SimpleVob, String>;

enum State {
    /// The matcher, its next mask not asked for (boxed: it is large beside a thread's handle).
    Idle(Box<Matcher>),
    /// The matcher computing its next mask; the matcher comes back with it.
    Computing(Receiver<(Matcher, MaskResult)>),
    /// A failed computation took the matcher with it.
    Lost,
}

/// The threads masks are computed on: one fewer than the cores, so the thread that launches the
/// forward pass keeps one (a batch of constrained rows otherwise starts as many masks as rows at
/// every step, each on a thread made for it). A panicking computation drops its sender, which
/// its request reads as a failed constraint; the pool goes on.
fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(cores.saturating_sub(1).max(1))
            .thread_name(|i| format!("nuvec-mask-{i}"))
            .panic_handler(|_| {})
            .build()
            .expect("a thread pool for the constraints' masks")
    })
}

fn compute(mut matcher: Matcher) -> Receiver<(Matcher, MaskResult)> {
    let (tx, rx) = channel();
    pool().spawn(move || {
        let mask = matcher.compute_mask().map_err(|e| e.to_string());
        let _ = tx.send((matcher, mask));
    });
    rx
}

impl TokenMask {
    pub(super) fn new(parser: TokenParser, eos: u32) -> Result<Self> {
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::Invalid(format!("starting the constraint: {e}")));
        }
        Ok(TokenMask { state: State::Computing(compute(matcher)), eos, complete: false, ready: None })
    }

    /// The matcher, out of the state (waiting for its thread if it still runs), with the mask
    /// that thread computed; the state is `Lost` until the caller puts it back.
    fn take(&mut self) -> Result<(Matcher, Option<MaskResult>)> {
        match std::mem::replace(&mut self.state, State::Lost) {
            State::Idle(m) => Ok((*m, None)),
            State::Computing(result) => result
                .recv()
                .map(|(m, mask)| (m, Some(mask)))
                .map_err(|_| Error::Invalid("the constraint's mask computation panicked".into())),
            State::Lost => Err(Error::Invalid("the constraint failed on an earlier token".into())),
        }
    }

    /// The mask of the tokens allowed next (computed once per token taken).
    fn next_mask(&mut self) -> Result<&SimpleVob> {
        if self.ready.is_none() {
            let (mut matcher, mask) = self.take()?;
            let mask = mask.unwrap_or_else(|| matcher.compute_mask().map_err(|e| e.to_string()));
            self.state = State::Idle(Box::new(matcher));
            self.ready = Some(mask.map_err(|e| Error::Invalid(format!("the constraint failed: {e}")))?);
        }
        Ok(self.ready.as_ref().expect("set above"))
    }

    /// Writes the tokens allowed next into `bits` (`vocab.div_ceil(32)` words for a row of
    /// `vocab`: bit `t % 32` of word `t / 32`), as [`TokenMask::apply`] leaves them: the request's
    /// end-of-sequence ids `eos` allowed exactly when the grammar may end here, tokens past the
    /// grammar's vocabulary refused.
    pub(crate) fn write_bits(&mut self, bits: &mut [u32], eos: &[u32]) -> Result<()> {
        let vocab = bits.len() * 32;
        let own_eos = self.eos;
        let mask = self.next_mask()?;
        let may_end = mask.is_allowed(own_eos);
        let known = mask.len().min(vocab);
        bits.fill(0);
        let whole = known / 32;
        bits[..whole].copy_from_slice(&mask.as_slice()[..whole]);
        if known % 32 != 0 {
            bits[whole] = mask.as_slice()[whole] & (u32::MAX >> (32 - known % 32));
        }
        for &t in eos.iter().filter(|&&t| (t as usize) < vocab) {
            let (word, bit) = (t as usize / 32, t % 32);
            bits[word] = if may_end { bits[word] | 1 << bit } else { bits[word] & !(1 << bit) };
        }
        Ok(())
    }

    /// Sets every entry of `logprobs` the grammar does not allow next to minus infinity; the
    /// request's end-of-sequence ids `eos` keep theirs exactly when the grammar may end here.
    pub(crate) fn apply(&mut self, logprobs: &mut [f32], eos: &[u32]) -> Result<()> {
        let own_eos = self.eos;
        let mask = self.next_mask()?;
        let may_end = mask.is_allowed(own_eos);
        let kept: Vec<(usize, f32)> =
            eos.iter().filter_map(|&t| logprobs.get(t as usize).map(|&v| (t as usize, v))).collect();
        let known = mask.len().min(logprobs.len());
        // 32 tokens a word: most words are all allowed or all refused.
        for (word, chunk) in mask.as_slice().iter().zip(logprobs[..known].chunks_mut(32)) {
            match *word {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                bits => {
                    for (i, v) in chunk.iter_mut().enumerate() {
                        if bits >> i & 1 == 0 {
                            *v = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        logprobs[known..].fill(f32::NEG_INFINITY);
        for (t, v) in kept {
            logprobs[t] = if may_end { v } else { f32::NEG_INFINITY };
        }
        if logprobs.iter().all(|v| *v == f32::NEG_INFINITY) {
            return Err(Error::Invalid(
                "the constraint allows no token here that the model can take (its allowed tokens are banned, \
                 e.g. by a logit bias of -inf, or end-of-sequence is ignored where only it fits)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Takes `token` (not an end-of-sequence id) into the grammar, and starts computing the mask
    /// after it unless the grammar is complete.
    pub(crate) fn commit(&mut self, token: u32) -> Result<()> {
        self.consume(token)?;
        self.start_next();
        Ok(())
    }

    /// Takes `token` into the grammar; the next mask is not asked for.
    fn consume(&mut self, token: u32) -> Result<()> {
        self.ready = None;
        let (mut matcher, _) = self.take()?;
        matcher
            .consume_token(token)
            .map_err(|e| Error::Invalid(format!("the constraint refused token {token}: {e}")))?;
        self.complete = matcher.is_stopped();
        self.state = State::Idle(Box::new(matcher));
        Ok(())
    }

    /// Starts computing the next mask on the pool, unless the grammar is complete (or failed).
    fn start_next(&mut self) {
        if self.complete {
            return;
        }
        if let State::Idle(matcher) = std::mem::replace(&mut self.state, State::Lost) {
            self.state = State::Computing(compute(*matcher));
        }
    }

    /// Whether the grammar is complete: nothing may follow but the end.
    pub(crate) fn is_complete(&self) -> bool {
        self.complete
    }

    /// Whether the output may end here (the grammar accepts what it took); false once the
    /// constraint has failed.
    pub(crate) fn is_accepting(&mut self) -> bool {
        let Ok((mut matcher, _)) = self.take() else { return false };
        let accepting = matcher.is_accepting().unwrap_or(false);
        self.state = State::Idle(Box::new(matcher));
        accepting
    }
}

/// [`TokenMask::commit`] for many masks at once (a Batcher step's constrained rows): every token
/// is taken into its grammar first, the grammars spread over the masks' pool, then each next
/// mask is started. One after another, each commit ran beside the masks that the commits
/// before it had started, and a batch of 64 spent milliseconds a step in them. Gives each
/// commit's outcome, in order.
pub(crate) fn commit_all(masks: &mut [(&mut TokenMask, u32)]) -> Vec<Result<()>> {
    use rayon::prelude::*;
    // A mask still being computed is waited for here, not on the pool, whose threads may all be
    // taken by the consumes (one thread on two cores) while the computation waits behind them.
    for (mask, _) in masks.iter_mut() {
        if matches!(mask.state, State::Computing(_)) {
            // A failed computation leaves the state lost: the consume below reports it.
            let _ = mask.next_mask();
        }
    }
    let taken: Vec<Result<()>> = pool().install(|| masks.par_iter_mut().map(|(m, token)| m.consume(*token)).collect());
    for ((mask, _), ok) in masks.iter_mut().zip(&taken) {
        if ok.is_ok() {
            mask.start_next();
        }
    }
    taken
}
