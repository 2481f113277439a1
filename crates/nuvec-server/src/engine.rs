//! The engine thread: it owns the model's [`Batcher`] (through [`EngineCore`]), takes
//! submissions from the HTTP handlers over a channel (a request's choices together, so they
//! are submitted in one go), steps while any request is in flight,
//! blocks on the channel when idle, and sends each request's tokens back over that request's
//! own channel. A request whose receiver is gone (its client disconnected) is cancelled at the
//! next step. A failed request fails alone; a failed step ends the engine and marks it failed,
//! which `/health` reports. The engine thread is also where the events are, so it keeps the
//! counters and latency histograms `/metrics` shows, and it frees each request's queue slot
//! (see [`QueueSlot`]) when the request is admitted.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Instant;

use nuvec_lm::{Batcher, BatcherStats, Event, FinishReason, GenerateOptions, RequestId, TokenLogprobs};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::metrics::Metrics;

/// What the engine thread drives: the [`Batcher`]'s request interface. The Batcher is the one
/// implementation a server runs; tests put others in its place (a core that fails) through
/// [`crate::Server::with_engine`].
pub trait EngineCore {
    /// Queues a request (see [`Batcher::submit`]).
    fn submit(&mut self, prompt: Vec<u32>, options: GenerateOptions) -> nuvec_lm::Result<RequestId>;
    /// Runs one step (see [`Batcher::step`]); an error means the core cannot go on.
    fn step(&mut self) -> nuvec_lm::Result<Vec<Event>>;
    /// Whether any request is waiting or running.
    fn is_busy(&self) -> bool;
    /// Ends a request at the next step (see [`Batcher::cancel`]).
    fn cancel(&mut self, id: RequestId) -> bool;
    /// Counts for monitoring.
    fn stats(&self) -> BatcherStats;
}

impl EngineCore for Batcher<'_> {
    fn submit(&mut self, prompt: Vec<u32>, options: GenerateOptions) -> nuvec_lm::Result<RequestId> {
        Batcher::submit(self, prompt, options)
    }
    fn step(&mut self) -> nuvec_lm::Result<Vec<Event>> {
        Batcher::step(self)
    }
    fn is_busy(&self) -> bool {
        Batcher::is_busy(self)
    }
    fn cancel(&mut self, id: RequestId) -> bool {
        Batcher::cancel(self, id)
    }
    fn stats(&self) -> BatcherStats {
        Batcher::stats(self)
    }
}

/// What a request's channel carries for each of its choices, in order: `Started` (unless it ends before admission),
/// tokens, then one `Finished` (a `Failed` before it when the request's step failed).
#[derive(Debug)]
pub(crate) enum Output {
    /// The request was admitted; this many prompt tokens came from the prefix cache.
    Started { cached_tokens: usize },
    /// A generated token, with its log-probabilities when the request asked for them.
    Token { token: u32, logprobs: Option<TokenLogprobs> },
    /// The request failed (the engine goes on); `Finished(Error)` follows.
    Failed(String),
    /// The request ended.
    Finished(FinishReason),
}

/// One choice of a request handed to the engine thread (a request of `n` choices is `n`
/// submissions sent together, each a request of the core's).
pub(crate) struct Submission {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    /// Which choice of its request this is (0 for the first).
    pub choice: usize,
    /// The request's outputs, each tagged with its choice; all its choices share the channel,
    /// so a client that leaves (the receiver dropped) cancels every one.
    pub outputs: Outputs,
    /// Whether the core took it (an invalid request is refused here, before any output).
    pub accepted: oneshot::Sender<nuvec_lm::Result<()>>,
    /// The HTTP request's id, for the log.
    pub request_id: String,
    /// When the HTTP request arrived (time to first token counts from here).
    pub arrived: Instant,
    /// Its place in the queue, given back once it is admitted (or ends).
    pub slot: QueueSlot,
}

/// A request's output channel: each output with the index of the choice it belongs to.
pub(crate) type Outputs = tmpsc::UnboundedSender<(usize, Output)>;

/// Counts the engine publishes after every step (read by `/health`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests queued, not yet admitted.
    pub waiting: usize,
    /// Requests running.
    pub running: usize,
    /// Requests that ended normally (a stop, end of sequence or a length limit).
    pub completed: u64,
    /// Requests cancelled because their client went away.
    pub cancelled: u64,
    /// Requests that failed.
    pub failed: u64,
    /// Tokens generated so far.
    pub generated_tokens: u64,
    /// KV cache blocks held by requests.
    pub blocks_used: usize,
    /// KV cache blocks in all.
    pub blocks_total: usize,
    /// Requests preempted so far.
    pub preemptions: u64,
    /// Guessed tokens fed to steps (prompt-lookup speculation).
    pub drafted_tokens: u64,
    /// Of those, the right guesses.
    pub accepted_tokens: u64,
}

/// What the engine thread shares with the handlers.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Set once the engine failed as a whole: the message. Requests then get 503.
    pub failure: Mutex<Option<String>>,
    pub stats: Mutex<EngineStats>,
    /// What `/metrics` shows besides the stats.
    pub metrics: Mutex<Metrics>,
    /// Submissions (choices) holding a [`QueueSlot`]: handed to the engine, not yet admitted.
    queued: AtomicUsize,
    /// Requests refused because the queue was full.
    pub rejected: AtomicU64,
    /// Set when a shutting-down server stops waiting for its requests: each one in flight then
    /// ends with an error saying so (its client must not take a cut answer for a whole one).
    aborting: AtomicBool,
}

/// A submission's place in the queue of those not yet admitted to the batch. The handler takes
/// one per choice before it hands a request to the engine ([`Shared::enqueue`] refuses when the queue is
/// full); dropping it gives the place back, so the count stays exact whichever way a request
/// leaves the queue: admitted, refused by the core, cancelled while waiting, or dropped with
/// the engine.
#[derive(Debug)]
pub(crate) struct QueueSlot(Arc<Shared>);

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shared {
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn stats(&self) -> EngineStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn fail(&self, message: String) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(message);
    }

    pub fn metrics(&self) -> MutexGuard<'_, Metrics> {
        self.metrics.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends every request in flight (and any that still arrives) at the engine's next step.
    pub fn abort_all(&self) {
        self.aborting.store(true, Ordering::Release);
    }

    fn aborting(&self) -> bool {
        self.aborting.load(Ordering::Acquire)
    }

    /// `count` places in the queue (one per choice of a request), all or none: none when fewer
    /// than `count` of `max` are free (then the refusal is counted, once for the request).
    pub fn enqueue(self: &Arc<Self>, max: usize, count: usize) -> Option<Vec<QueueSlot>> {
        let free = |n: usize| n.checked_add(count).filter(|&after| after <= max);
        match self.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, free) {
            Ok(_) => Some((0..count).map(|_| QueueSlot(self.clone())).collect()),
            Err(_) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// One request of the core's (a choice) in flight on the engine thread.
struct Live {
    outputs: Outputs,
    choice: usize,
    /// Log-probabilities reported for the token that comes next.
    logprobs: Option<TokenLogprobs>,
    cancelled: bool,
    request_id: String,
    prompt_tokens: usize,
    arrived: Instant,
    /// When its last token was sent (None before the first).
    last_token: Option<Instant>,
    /// Held until the request is admitted.
    slot: Option<QueueSlot>,
}

impl Live {
    /// Sends `output` to the choice's HTTP request (which may have gone: the next step cancels).
    fn send(&self, output: Output) {
        let _ = self.outputs.send((self.choice, output));
    }
}

/// The engine thread's side of the server: call [`EngineLoop::run`] with the core on the
/// thread [`crate::Server::with_engine`] starts; it returns when the server is gone and no
/// request is left, or when the core failed.
pub struct EngineLoop {
    pub(crate) submissions: mpsc::Receiver<Vec<Submission>>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) ready: Option<mpsc::Sender<()>>,
}

impl EngineLoop {
    /// Serves requests with `core` until the server is dropped (and every request ended) or
    /// the core fails (then `/health` reports 503 and new requests are refused).
    pub fn run<C: EngineCore>(mut self, mut core: C) {
        if let Some(ready) = self.ready.take() {
            let _ = ready.send(());
        }
        let mut live: HashMap<RequestId, Live> = HashMap::new();
        let mut counts = EngineStats::default();
        loop {
            if !core.is_busy() {
                self.publish(&core, &counts);
                match self.submissions.recv() {
                    Ok(choices) => admit(&mut core, &mut live, &self.shared, choices),
                    Err(_) => return, // the server is gone and nothing is in flight
                }
            }
            while let Ok(choices) = self.submissions.try_recv() {
                admit(&mut core, &mut live, &self.shared, choices);
            }
            let aborting = self.shared.aborting();
            for (id, l) in live.iter_mut() {
                if l.cancelled {
                    continue;
                }
                if aborting {
                    let why = "the server shut down before this request finished; send it again once it is back";
                    l.send(Output::Failed(why.into()));
                }
                if aborting || l.outputs.is_closed() {
                    core.cancel(*id);
                    l.cancelled = true;
                }
            }
            if !core.is_busy() {
                continue;
            }
            let step = catch_unwind(AssertUnwindSafe(|| core.step()));
            let events = match step {
                Ok(Ok(events)) => events,
                Ok(Err(error)) => return self.fail(live, format!("the engine's step failed: {error}")),
                Err(panic) => return self.fail(live, format!("the engine's step panicked: {}", panic_text(&panic))),
            };
            let now = Instant::now();
            let mut metrics = self.shared.metrics();
            for event in events {
                dispatch(&mut live, &mut counts, &mut metrics, event, now);
            }
            drop(metrics);
            self.publish(&core, &counts);
        }
    }

    fn publish<C: EngineCore>(&self, core: &C, counts: &EngineStats) {
        let stats = core.stats();
        let mut shared = self.shared.stats.lock().unwrap_or_else(|e| e.into_inner());
        *shared = EngineStats {
            waiting: stats.waiting,
            running: stats.running,
            generated_tokens: stats.generated_tokens,
            blocks_used: stats.blocks_used,
            blocks_total: stats.blocks_total,
            preemptions: stats.preemptions,
            drafted_tokens: stats.drafted_tokens,
            accepted_tokens: stats.accepted_tokens,
            ..counts.clone()
        };
    }

    /// The core cannot go on: every request in flight fails, and so does every later one.
    fn fail(self, live: HashMap<RequestId, Live>, message: String) {
        eprintln!("[ERROR] {message}; the server no longer takes requests (/health reports 503)");
        self.shared.fail(message.clone());
        for (_, l) in live {
            l.send(Output::Failed(message.clone()));
            l.send(Output::Finished(FinishReason::Error));
        }
        // Requests still queued in the channel are dropped with it: their senders see it closed.
    }
}

/// Submits a request's choices to the core, in order.
fn admit<C: EngineCore>(core: &mut C, live: &mut HashMap<RequestId, Live>, shared: &Shared, choices: Vec<Submission>) {
    for s in choices {
        admit_one(core, live, shared, s);
    }
}

fn admit_one<C: EngineCore>(core: &mut C, live: &mut HashMap<RequestId, Live>, shared: &Shared, s: Submission) {
    if s.outputs.is_closed() {
        return; // the client left before the engine saw the request
    }
    let prompt_tokens = s.prompt.len();
    let submitted = catch_unwind(AssertUnwindSafe(|| core.submit(s.prompt, s.options)))
        .unwrap_or_else(|panic| Err(nuvec_lm::Error::Unsupported(format!("submit panicked: {}", panic_text(&panic)))));
    match submitted {
        Ok(id) => {
            if s.accepted.send(Ok(())).is_err() {
                core.cancel(id);
            }
            shared.metrics().prompt_tokens += prompt_tokens as u64;
            let l = Live {
                outputs: s.outputs,
                choice: s.choice,
                logprobs: None,
                cancelled: false,
                request_id: s.request_id,
                prompt_tokens,
                arrived: s.arrived,
                last_token: None,
                slot: Some(s.slot),
            };
            live.insert(id, l);
        }
        Err(error) => {
            let _ = s.accepted.send(Err(error));
        }
    }
}

/// Sends `event` to its request, counting it; `now` is when its step ended.
fn dispatch(
    live: &mut HashMap<RequestId, Live>,
    counts: &mut EngineStats,
    m: &mut Metrics,
    event: Event,
    now: Instant,
) {
    match event {
        Event::Started { id, cached_tokens } => {
            if let Some(l) = live.get_mut(&id) {
                l.slot = None; // admitted: its place in the queue is free
                m.prefix_queries += l.prompt_tokens as u64;
                m.prefix_hits += cached_tokens as u64;
                l.send(Output::Started { cached_tokens });
            }
        }
        Event::Logprobs { id, logprobs } => {
            if let Some(l) = live.get_mut(&id) {
                l.logprobs = Some(logprobs);
            }
        }
        Event::Token { id, token } => {
            if let Some(l) = live.get_mut(&id) {
                match l.last_token {
                    None => m.ttft.observe(now - l.arrived),
                    Some(last) => m.itl.observe(now - last),
                }
                l.last_token = Some(now);
                m.generation_tokens += 1;
                let logprobs = l.logprobs.take();
                l.send(Output::Token { token, logprobs });
            }
        }
        Event::Failed { id, error } => {
            if let Some(l) = live.get_mut(&id) {
                eprintln!("[ERROR] request {} failed: {error}", l.request_id);
                l.send(Output::Failed(error.to_string()));
            }
        }
        Event::Finished { id, reason } => {
            if let Some(l) = live.remove(&id) {
                match reason {
                    FinishReason::Cancelled => counts.cancelled += 1,
                    FinishReason::Error => counts.failed += 1,
                    _ => counts.completed += 1,
                }
                m.finished.count(&reason);
                m.e2e.observe(now - l.arrived);
                l.send(Output::Finished(reason));
            }
        }
    }
}

pub(crate) fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}
