//! OpenAI's `POST /v1/chat/completions` and `POST /v1/completions`: the answer as a
//! `chat.completion` (its message with `content`, `reasoning_content` with vLLM's alias
//! `reasoning`, and `tool_calls`) or a `text_completion`, whole or as chunks ending with
//! `data: [DONE]`, with log-probabilities when asked. A call is streamed as two deltas: its
//! index, id, type and name (with empty arguments), then its arguments, once the call's JSON is
//! complete.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::Event as SseEvent;
use axum::response::Response;
use nuvec_lm::token_bytes::TokenBytes;
use nuvec_lm::{FinishReason, TokenLogprobs};
use serde_json::{json, Map, Value};

use crate::answer::{Answer, Part};
use crate::api::json_object;
use crate::error::ApiError;
use crate::generation::{self, End, Protocol, Usage};
use crate::params::Kind;
use crate::prepare::prepare;
use crate::AppState;

/// Answers a chat completions or completions request.
pub(crate) async fn complete(
    state: Arc<AppState>,
    kind: Kind,
    body: Result<Bytes, BytesRejection>,
    id: &str,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = json_object(body, state.config.body_limit)?;
    let prepared = prepare(&state, kind, body, id).await?;
    let reply = Reply {
        kind,
        id: id.into(),
        created: crate::api::now(),
        model: state.config.model_id.clone(),
        table: state.tokenizer.token_bytes(),
        logprobs: prepared.parsed.options.logprobs.is_some(),
        pending: vec![],
        offset: 0,
        include_usage: prepared.parsed.include_usage,
    };
    generation::run(state, prepared, reply, id, arrived).await
}

/// OpenAI's finish reason for `reason` ("tool_calls" when the answer `called` a tool and
/// ended without an error, as vLLM reports it even when a limit cut the text after the call).
fn finish_reason(reason: &FinishReason, called: bool) -> &'static str {
    match reason {
        FinishReason::Error => "error",
        _ if called => "tool_calls",
        FinishReason::EndOfSequence | FinishReason::Stop(_) | FinishReason::Cancelled => "stop",
        // The KV cache ran out of room: cut short by a limit, as "length" says.
        FinishReason::Length | FinishReason::ContextLength(_) | FinishReason::CacheFull => "length",
    }
}

/// One request's answer in OpenAI's shapes, and the log-probabilities not yet sent.
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    table: Arc<TokenBytes>,
    logprobs: bool,
    /// Log-probabilities of the tokens not yet sent.
    pending: Vec<TokenLogprobs>,
    /// Characters of the token strings sent so far (a completion's `text_offset`).
    offset: usize,
    include_usage: bool,
}

/// OpenAI's floor for a log-probability that is not finite.
fn finite(lp: f32) -> f64 {
    if lp.is_finite() {
        lp as f64
    } else {
        -9999.0
    }
}

fn data(value: Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}

fn done() -> SseEvent {
    SseEvent::default().data("[DONE]")
}

fn usage(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// The chat message of a whole answer: `content` is null when the model only called tools;
/// the reasoning fields are there when it reasoned.
fn message(answer: &Answer) -> Value {
    let content = answer.content();
    let calls: Vec<Value> = answer
        .calls()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect();
    let content = match content.is_empty() && !calls.is_empty() {
        true => Value::Null,
        false => content.into(),
    };
    let mut message = json!({"role": "assistant", "content": content});
    let reasoning = answer.reasoning();
    if !reasoning.is_empty() {
        message["reasoning_content"] = reasoning.clone().into();
        message["reasoning"] = reasoning.into();
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    message
}

/// The chat stream deltas of `part`.
fn deltas(part: Part) -> Vec<Value> {
    match part {
        Part::Content(t) => vec![json!({"content": t})],
        Part::Reasoning(t) => vec![json!({"reasoning_content": t, "reasoning": t})],
        Part::Call(c) => vec![
            json!({"tool_calls": [{
                "index": c.index, "id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": ""},
            }]}),
            json!({"tool_calls": [{"index": c.index, "function": {"arguments": c.arguments}}]}),
        ],
    }
}

impl Reply {
    fn token_text(&self, id: u32) -> (String, &[u8]) {
        let bytes = self.table.get(id);
        (String::from_utf8_lossy(bytes).into_owned(), bytes)
    }

    /// The log-probabilities of the pending tokens in this endpoint's shape (None when not
    /// asked, or in a stream chunk when no token is pending).
    fn take_logprobs(&mut self, streaming: bool) -> Option<Value> {
        if !self.logprobs || (streaming && self.pending.is_empty()) {
            return None;
        }
        let pending = std::mem::take(&mut self.pending);
        Some(match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = pending
                    .iter()
                    .map(|lp| {
                        let (token, bytes) = self.token_text(lp.token);
                        let top: Vec<Value> = lp
                            .top
                            .iter()
                            .map(|&(t, l)| {
                                let (token, bytes) = self.token_text(t);
                                json!({"token": token, "logprob": finite(l), "bytes": bytes})
                            })
                            .collect();
                        json!({"token": token, "logprob": finite(lp.logprob), "bytes": bytes, "top_logprobs": top})
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
            Kind::Completion => {
                let (mut tokens, mut values, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
                for lp in &pending {
                    let (token, _) = self.token_text(lp.token);
                    offsets.push(self.offset);
                    self.offset += token.chars().count();
                    tokens.push(token);
                    values.push(finite(lp.logprob));
                    let top: Map<String, Value> =
                        lp.top.iter().map(|&(t, l)| (self.token_text(t).0, json!(finite(l)))).collect();
                    tops.push(Value::Object(top));
                }
                json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
            }
        })
    }

    fn object(&self, streaming: bool) -> &'static str {
        match (self.kind, streaming) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// A stream chunk of one choice: a chat delta, or a completion's text.
    fn chunk(&mut self, delta: Value, finish: Option<&'static str>) -> Value {
        let logprobs = self.take_logprobs(true);
        let choice = match self.kind {
            Kind::Chat => json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
            Kind::Completion => json!({"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish}),
        };
        let mut chunk = json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "choices": [choice],
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }
}

impl Protocol for Reply {
    fn token(&mut self, logprobs: Option<TokenLogprobs>) {
        if let Some(lp) = logprobs.filter(|_| self.logprobs) {
            self.pending.push(lp);
        }
    }

    fn whole(&mut self, answer: Answer, end: &End) -> Value {
        let logprobs = self.take_logprobs(false);
        let finish = finish_reason(end.reason, end.called);
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": 0, "message": message(&answer), "logprobs": logprobs, "finish_reason": finish,
            }),
            Kind::Completion => {
                json!({"index": 0, "text": answer.content(), "logprobs": logprobs, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
            "choices": [choice], "usage": usage(&end.usage),
        })
    }

    fn opening(&mut self, _: &Usage) -> Vec<SseEvent> {
        match self.kind {
            Kind::Chat => vec![data(self.chunk(json!({"role": "assistant", "content": ""}), None))],
            Kind::Completion => vec![],
        }
    }

    fn parts(&mut self, parts: Vec<Part>) -> Vec<SseEvent> {
        let mut events = vec![];
        for part in parts {
            match (self.kind, part) {
                (Kind::Completion, Part::Content(t)) => events.push(data(self.chunk(Value::String(t), None))),
                // A completion's text is all content.
                (Kind::Completion, _) => {}
                (Kind::Chat, part) => {
                    for delta in deltas(part) {
                        events.push(data(self.chunk(delta, None)));
                    }
                }
            }
        }
        events
    }

    fn closing(&mut self, end: &End) -> Vec<SseEvent> {
        let finish = Some(finish_reason(end.reason, end.called));
        let last = match self.kind {
            Kind::Chat => self.chunk(json!({}), finish),
            Kind::Completion => self.chunk(Value::String(String::new()), finish),
        };
        let mut events = vec![data(last)];
        if self.include_usage {
            // The final chunk of `stream_options.include_usage`: no choices, the usage.
            events.push(data(json!({
                "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
                "choices": [], "usage": usage(&end.usage),
            })));
        }
        events.push(done());
        events
    }

    fn failure(&mut self, error: ApiError) -> Vec<SseEvent> {
        vec![data(error.body()), done()]
    }
}
