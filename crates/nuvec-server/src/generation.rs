//! One prepared request through the engine, for every protocol: its choices (one, or OpenAI's
//! `n`) take their queue slots and are submitted together, and each one's outputs come back
//! as text and answer parts (`choice.rs`); a [`Protocol`] renders those as one whole response
//! or as server-sent events. A streaming client that leaves drops the request's receiver,
//! which makes the engine cancel every choice.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use nuvec_lm::TokenLogprobs;
use serde_json::Value;
use tokio::sync::{mpsc as tmpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use crate::answer::{Answer, Part};
use crate::choice::Reading;
pub(crate) use crate::choice::{Choice, End, Usage};
use crate::engine::{Output, Submission};
use crate::error::ApiError;
use crate::prepare::{engine_gone, Prepared};
use crate::AppState;

/// How one protocol renders a request's choices (one unless chat completions or completions
/// asked for `n`). Events of a stream go out in the order given; those of different choices
/// interleave as their tokens come.
pub(crate) trait Protocol: Send + 'static {
    /// Sees each token's log-probabilities before the token's text (only chat completions
    /// and completions give them back).
    fn token(&mut self, _choice: usize, _logprobs: Option<TokenLogprobs>) {}
    /// The whole response: choice 0, the other choices in order, and the request's counts.
    fn whole(&mut self, first: Choice, others: Vec<Choice>, usage: &Usage) -> Value;
    /// A choice's first events, sent when the engine's first output for it arrives.
    fn opening(&mut self, choice: usize, usage: &Usage) -> Vec<SseEvent>;
    /// The events for answer parts of a choice that became final.
    fn parts(&mut self, choice: usize, parts: Vec<Part>) -> Vec<SseEvent>;
    /// A choice's last events.
    fn closing(&mut self, choice: usize, end: &End) -> Vec<SseEvent>;
    /// The events after every choice closed, with the request's counts.
    fn ending(&mut self, _usage: &Usage) -> Vec<SseEvent> {
        vec![]
    }
    /// The events that end a stream whose request failed.
    fn failure(&mut self, error: ApiError) -> Vec<SseEvent>;
}

/// A fresh id, `prefix` then 16 hex digits: unique within the process and unlikely across them.
pub(crate) fn fresh_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{prefix}{:016x}", h.finish())
}

/// The runtime's refusal of a request: bad input is a 400, anything else a 500.
fn refused(request_id: &str, error: nuvec_lm::Error) -> ApiError {
    match error {
        nuvec_lm::Error::Invalid(message) => ApiError::bad_request(message),
        nuvec_lm::Error::Unsupported(message) => ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::bad_request(format!("not supported: {message}"))
        },
        other => {
            eprintln!("[ERROR] request {request_id} was refused: {other}");
            ApiError::internal(request_id, other)
        }
    }
}

/// Runs `prepared` and answers it through `protocol`: whole, or streamed when the request
/// asked. Each of its `n` choices is a request of the engine's, submitted together with the
/// others, with its own seed (see [`crate::params::Parsed::choice_options`]); all take their
/// queue places at once. `arrived` is when the HTTP request came (time to first token counts
/// from there).
pub(crate) async fn run<P: Protocol>(
    state: Arc<AppState>,
    prepared: Prepared,
    protocol: P,
    request_id: &str,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let Prepared { parsed, ids, answers } = prepared;
    let n = parsed.n;
    let max_queue = state.config.max_queue;
    if n > max_queue {
        // Could never be served: a 429 would have the client retry for ever.
        return Err(ApiError::invalid(
            "n",
            format!("n = {n} is more than the server's queue holds (--max-queue {max_queue}); ask for fewer choices"),
        ));
    }
    // After the checks, so a bad request hears what is wrong with it whatever the load.
    let slots = state.shared.enqueue(max_queue, n).ok_or_else(|| ApiError::queue_full(max_queue))?;

    let (outputs, receiver) = tmpsc::unbounded_channel();
    let mut accepted = Vec::with_capacity(n);
    let submissions = slots
        .into_iter()
        .enumerate()
        .map(|(choice, slot)| {
            let (sender, was_accepted) = oneshot::channel();
            accepted.push(was_accepted);
            Submission {
                prompt: ids.clone(),
                options: parsed.choice_options(choice),
                choice,
                outputs: outputs.clone(),
                accepted: sender,
                request_id: request_id.into(),
                arrived,
                slot,
            }
        })
        .collect();
    // The submissions hold the only senders: once the engine drops them, the receiver ends.
    drop(outputs);
    state.engine.send(submissions).map_err(|_| engine_gone(&state))?;
    for was_accepted in accepted {
        // A refusal drops the receiver, which cancels the choices the core took.
        match was_accepted.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(refused(request_id, error)),
            Err(_) => return Err(engine_gone(&state)),
        }
    }

    let readings =
        answers.into_iter().map(|answer| Reading::new(&state.tokenizer, &parsed, answer, ids.len())).collect();
    let request = Request { state, protocol, readings, receiver, request_id: request_id.into() };
    match parsed.stream {
        false => request.whole().await,
        true => Ok(request.stream()),
    }
}

/// A request's choices in flight.
struct Request<P> {
    state: Arc<AppState>,
    protocol: P,
    readings: Vec<Reading>,
    /// Every choice's outputs, tagged with its index. Dropping it cancels every choice.
    receiver: tmpsc::UnboundedReceiver<(usize, Output)>,
    request_id: String,
}

impl<P: Protocol> Request<P> {
    /// The request's counts over its choices.
    fn usage(&self) -> Usage {
        Usage::of_request(&self.readings.iter().map(|r| r.usage).collect::<Vec<_>>())
    }

    fn done(&self) -> bool {
        self.readings.iter().all(|r| r.end.is_some())
    }

    /// Reads every choice to its end. A choice that fails fails the request (500 naming its
    /// id): the others are cancelled as the receiver is dropped.
    async fn whole(mut self) -> Result<Response, ApiError> {
        let mut answers: Vec<Answer> = self.readings.iter().map(|_| Answer::default()).collect();
        while !self.done() {
            let Some((i, output)) = self.receiver.recv().await else { return Err(engine_gone(&self.state)) };
            let (Some(reading), Some(answer)) = (self.readings.get_mut(i), answers.get_mut(i)) else { continue };
            match output {
                Output::Started { cached_tokens } => reading.usage.cached_tokens = cached_tokens,
                Output::Token { token, logprobs } => {
                    self.protocol.token(i, logprobs);
                    answer.extend(reading.token(token));
                }
                Output::Failed(message) => return Err(ApiError::internal(&self.request_id, message)),
                Output::Finished(reason) => answer.extend(reading.finish(reason)),
            }
        }
        let usage = self.usage();
        let mut choices =
            answers.into_iter().zip(self.readings).filter_map(|(answer, r)| Some(Choice { answer, end: r.end? }));
        let Some(first) = choices.next() else { return Err(engine_gone(&self.state)) };
        Ok(Json(self.protocol.whole(first, choices.collect(), &usage)).into_response())
    }

    /// The events of choice `i`'s output, and whether the stream goes on after them.
    fn events(&mut self, i: usize, output: Output) -> (Vec<SseEvent>, bool) {
        let Some(reading) = self.readings.get_mut(i) else { return (vec![], true) };
        if let Output::Started { cached_tokens } = output {
            reading.usage.cached_tokens = cached_tokens;
        }
        let mut events = vec![];
        if !reading.opened {
            reading.opened = true;
            events = self.protocol.opening(i, &reading.usage);
        }
        match output {
            Output::Started { .. } => {}
            Output::Token { token, logprobs } => {
                self.protocol.token(i, logprobs);
                let parts = reading.token(token);
                if !parts.is_empty() {
                    events.extend(self.protocol.parts(i, parts));
                }
            }
            // One choice failing ends the stream; dropping the receiver cancels the others.
            Output::Failed(message) => {
                events.extend(self.protocol.failure(ApiError::internal(&self.request_id, message)));
                return (events, false);
            }
            Output::Finished(reason) => {
                let parts = reading.finish(reason);
                events.extend(self.protocol.parts(i, parts));
                if let Some(end) = &reading.end {
                    events.extend(self.protocol.closing(i, end));
                }
                if self.done() {
                    let usage = self.usage();
                    events.extend(self.protocol.ending(&usage));
                    return (events, false);
                }
            }
        }
        (events, true)
    }

    /// The choices as server-sent events, interleaved as they come. A client that leaves
    /// drops the stream, and with it the receiver: the engine cancels every choice.
    fn stream(mut self) -> Response {
        let (events, body) = tmpsc::channel::<Result<SseEvent, Infallible>>(64);
        tokio::spawn(async move {
            loop {
                let output = tokio::select! {
                    _ = events.closed() => return,
                    output = self.receiver.recv() => output,
                };
                let (batch, more) = match output {
                    Some((i, output)) => self.events(i, output),
                    None => {
                        let why = "the engine stopped before the request finished";
                        let mut batch = match self.readings.iter().any(|r| r.opened) {
                            false => self.protocol.opening(0, &self.usage()),
                            true => vec![],
                        };
                        batch.extend(self.protocol.failure(ApiError::internal(&self.request_id, why)));
                        (batch, false)
                    }
                };
                for event in batch {
                    if events.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
                if !more {
                    return;
                }
            }
        });
        Sse::new(ReceiverStream::new(body)).into_response()
    }
}
