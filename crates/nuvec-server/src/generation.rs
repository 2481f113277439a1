//! One prepared request through the engine, for every protocol: it takes a queue slot, is
//! submitted, and its outputs come back as text ([`TextStream`]: stop strings cut, held back
//! while they may still match), then as answer parts ([`ChatAnswer`]); a [`Protocol`] renders
//! those as one whole response or as server-sent events. A streaming client that leaves
//! drops its receiver, which makes the engine cancel the request.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use nuvec_lm::{FinishReason, TextStream, TokenLogprobs};
use serde_json::Value;
use tokio::sync::{mpsc as tmpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use crate::answer::{Answer, ChatAnswer, Part};
use crate::engine::{Output, Submission};
use crate::error::ApiError;
use crate::params::Kind;
use crate::prepare::{engine_gone, Prepared};
use crate::AppState;

/// A request's token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Tokens of the answer's reasoning (counted by encoding its text again at the end: the
    /// reader holds text back, so tokens cannot be told apart as they come).
    pub reasoning_tokens: usize,
}

/// How an answer ended.
#[derive(Debug)]
pub(crate) struct End<'a> {
    pub reason: &'a FinishReason,
    /// Whether the model called a tool.
    pub called: bool,
    pub usage: Usage,
}

impl End<'_> {
    /// Whether a limit cut the answer (max_tokens, the context, or the KV cache).
    pub fn cut(&self) -> bool {
        matches!(self.reason, FinishReason::Length | FinishReason::ContextLength(_) | FinishReason::CacheFull)
    }
}

/// How one protocol renders an answer. Events of a stream go out in the order given.
pub(crate) trait Protocol: Send + 'static {
    /// Sees each token's log-probabilities before the token's text (only chat completions
    /// give them back).
    fn token(&mut self, _logprobs: Option<TokenLogprobs>) {}
    /// The whole response.
    fn whole(&mut self, answer: Answer, end: &End) -> Value;
    /// A stream's first events, sent when the engine's first output for the request arrives.
    fn opening(&mut self, usage: &Usage) -> Vec<SseEvent>;
    /// The events for answer parts that became final.
    fn parts(&mut self, parts: Vec<Part>) -> Vec<SseEvent>;
    /// A stream's last events.
    fn closing(&mut self, end: &End) -> Vec<SseEvent>;
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

/// The answer as it is read: text, parts and counts.
struct Reading {
    text: TextStream,
    /// A chat answer's reader (None for a completion, whose text is all content).
    answer: Option<ChatAnswer>,
    usage: Usage,
    called: bool,
    reasoning: String,
    tokenizer: Arc<nuvec_lm::Tokenizer>,
}

impl Reading {
    fn token(&mut self, token: u32) -> Vec<Part> {
        self.usage.completion_tokens += 1;
        let text = self.text.push(token);
        self.read(text, false)
    }

    fn finish(&mut self) -> Vec<Part> {
        let text = self.text.finish();
        let parts = self.read(text, true);
        if !self.reasoning.is_empty() {
            self.usage.reasoning_tokens = self.tokenizer.encode(&self.reasoning, false).map_or(0, |ids| ids.len());
        }
        parts
    }

    fn read(&mut self, text: String, end: bool) -> Vec<Part> {
        let parts = match &mut self.answer {
            Some(answer) => answer.read(&text, end),
            None if text.is_empty() => vec![],
            None => vec![Part::Content(text)],
        };
        for part in &parts {
            match part {
                Part::Call(_) => self.called = true,
                Part::Reasoning(t) => self.reasoning.push_str(t),
                Part::Content(_) => {}
            }
        }
        parts
    }
}

/// Runs `prepared` and answers it through `protocol`: whole, or streamed when the request
/// asked. `arrived` is when the HTTP request came (time to first token counts from there).
pub(crate) async fn run<P: Protocol>(
    state: Arc<AppState>,
    prepared: Prepared,
    mut protocol: P,
    request_id: &str,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let Prepared { parsed, ids, answer } = prepared;
    // After the checks, so a bad request hears what is wrong with it whatever the load.
    let max_queue = state.config.max_queue;
    let slot = state.shared.enqueue(max_queue).ok_or_else(|| ApiError::queue_full(max_queue))?;

    let (outputs, mut receiver) = tmpsc::unbounded_channel();
    let (accepted, was_accepted) = oneshot::channel();
    let prompt_tokens = ids.len();
    let submission = Submission {
        prompt: ids,
        options: parsed.options.clone(),
        outputs,
        accepted,
        request_id: request_id.into(),
        arrived,
        slot,
    };
    state.engine.send(submission).map_err(|_| engine_gone(&state))?;
    match was_accepted.await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return Err(refused(request_id, error)),
        Err(_) => return Err(engine_gone(&state)),
    }

    let mut text = TextStream::new(&state.tokenizer, &parsed.options);
    if parsed.kind == Kind::Chat {
        // The answer as mlx_lm.server and `nuvec generate` give it (a byte-level BPE answer's
        // first leading space dropped); a completion keeps it, so prompt + text is the whole.
        text = text.with_mlx_lm_spacing();
    }
    let mut reading = Reading {
        text,
        answer,
        usage: Usage { prompt_tokens, ..Usage::default() },
        called: false,
        reasoning: String::new(),
        tokenizer: state.tokenizer.clone(),
    };
    if !parsed.stream {
        let mut whole = Answer::default();
        let mut failed = None;
        let reason = loop {
            match receiver.recv().await {
                Some(Output::Started { cached_tokens }) => reading.usage.cached_tokens = cached_tokens,
                Some(Output::Token { token, logprobs }) => {
                    protocol.token(logprobs);
                    whole.extend(reading.token(token));
                }
                Some(Output::Failed(message)) => failed = Some(message),
                Some(Output::Finished(reason)) => break reason,
                None => return Err(engine_gone(&state)),
            }
        };
        if let Some(message) = failed {
            return Err(ApiError::internal(request_id, message));
        }
        whole.extend(reading.finish());
        let end = End { reason: &reason, called: reading.called, usage: reading.usage };
        return Ok(Json(protocol.whole(whole, &end)).into_response());
    }

    let (events, body) = tmpsc::channel::<Result<SseEvent, Infallible>>(64);
    let request_id = request_id.to_string();
    tokio::spawn(async move {
        let send = |batch: Vec<SseEvent>| {
            let events = events.clone();
            async move {
                for event in batch {
                    if events.send(Ok(event)).await.is_err() {
                        return false;
                    }
                }
                true
            }
        };
        let mut opened = false;
        let mut failed = None;
        loop {
            let output = tokio::select! {
                // The client left: dropping the receiver makes the engine cancel the request.
                _ = events.closed() => return,
                output = receiver.recv() => output,
            };
            if let Some(Output::Started { cached_tokens }) = &output {
                reading.usage.cached_tokens = *cached_tokens;
            }
            if !opened {
                opened = true;
                if !send(protocol.opening(&reading.usage)).await {
                    return;
                }
            }
            match output {
                Some(Output::Started { .. }) => {}
                Some(Output::Token { token, logprobs }) => {
                    protocol.token(logprobs);
                    let parts = reading.token(token);
                    if !parts.is_empty() && !send(protocol.parts(parts)).await {
                        return;
                    }
                }
                Some(Output::Failed(message)) => failed = Some(message),
                Some(Output::Finished(reason)) => {
                    let last = match failed.take() {
                        Some(message) => protocol.failure(ApiError::internal(&request_id, message)),
                        None => {
                            let mut last = protocol.parts(reading.finish());
                            let end = End { reason: &reason, called: reading.called, usage: reading.usage };
                            last.extend(protocol.closing(&end));
                            last
                        }
                    };
                    send(last).await;
                    return;
                }
                None => {
                    let why = "the engine stopped before the request finished";
                    send(protocol.failure(ApiError::internal(&request_id, why))).await;
                    return;
                }
            }
        }
    });
    Ok(Sse::new(ReceiverStream::new(body)).into_response())
}
