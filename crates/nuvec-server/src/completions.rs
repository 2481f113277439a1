//! OpenAI's `POST /v1/chat/completions` and `POST /v1/completions`: the answer as a
//! `chat.completion` (each choice's message with `content`, `reasoning_content` with vLLM's
//! alias `reasoning`, and `tool_calls`) or a `text_completion`, whole or as chunks ending with
//! `data: [DONE]`, with log-probabilities when asked. A request of `n` choices has them at
//! `index` 0 to n-1; streamed, each chunk carries one choice, the choices' chunks interleaved
//! as their tokens come, and the usage chunk and `[DONE]` follow the last choice's end. A call is streamed as two deltas: its
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
use crate::generation::{self, Choice, End, Protocol, Usage};
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
        // A served adapter's requests are answered under its name, as vLLM does.
        model: prepared.parsed.options.adapter.clone().unwrap_or_else(|| state.config.model_id.clone()),
        table: state.tokenizer.token_bytes(),
        logprobs: prepared.parsed.options.logprobs.is_some(),
        choices: (0..prepared.parsed.n).map(|_| Sent::default()).collect(),
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
        FinishReason::Length
        | FinishReason::ConstraintUnfinished
        | FinishReason::ContextLength(_)
        | FinishReason::CacheFull => "length",
    }
}

/// One request's choices in OpenAI's shapes, and what each has still to send.
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    table: Arc<TokenBytes>,
    logprobs: bool,
    /// Each choice's log-probabilities, by its index.
    choices: Vec<Sent>,
    include_usage: bool,
}

/// One choice's log-probabilities: those not yet sent, and where its text has got to.
#[derive(Default)]
struct Sent {
    /// Log-probabilities of the tokens not yet sent.
    pending: Vec<TokenLogprobs>,
    /// Characters of the token strings sent so far (a completion's `text_offset`).
    offset: usize,
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

    /// The log-probabilities of choice `index`'s pending tokens in this endpoint's shape (None
    /// when not asked, or in a stream chunk when no token is pending).
    fn take_logprobs(&mut self, index: usize, streaming: bool) -> Option<Value> {
        let sent = self.choices.get_mut(index)?;
        if !self.logprobs || (streaming && sent.pending.is_empty()) {
            return None;
        }
        let pending = std::mem::take(&mut sent.pending);
        let mut offset = sent.offset;
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
                    offsets.push(offset);
                    offset += token.chars().count();
                    tokens.push(token);
                    values.push(finite(lp.logprob));
                    let top: Map<String, Value> =
                        lp.top.iter().map(|&(t, l)| (self.token_text(t).0, json!(finite(l)))).collect();
                    tops.push(Value::Object(top));
                }
                if let Some(sent) = self.choices.get_mut(index) {
                    sent.offset = offset;
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

    /// A stream chunk of choice `index`: a chat delta, or a completion's text.
    fn chunk(&mut self, index: usize, delta: Value, finish: Option<&'static str>) -> Value {
        let logprobs = self.take_logprobs(index, true);
        let choice = match self.kind {
            Kind::Chat => json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
            Kind::Completion => {
                json!({"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish})
            }
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

impl Reply {
    /// Choice `index` of a whole response.
    fn choice(&mut self, index: usize, choice: Choice) -> Value {
        let logprobs = self.take_logprobs(index, false);
        let finish = finish_reason(&choice.end.reason, choice.end.called);
        match self.kind {
            Kind::Chat => json!({
                "index": index, "message": message(&choice.answer), "logprobs": logprobs, "finish_reason": finish,
            }),
            Kind::Completion => json!({
                "index": index, "text": choice.answer.content(), "logprobs": logprobs, "finish_reason": finish,
            }),
        }
    }
}

impl Protocol for Reply {
    fn token(&mut self, choice: usize, logprobs: Option<TokenLogprobs>) {
        if let Some(lp) = logprobs.filter(|_| self.logprobs) {
            if let Some(sent) = self.choices.get_mut(choice) {
                sent.pending.push(lp);
            }
        }
    }

    fn whole(&mut self, first: Choice, others: Vec<Choice>, counts: &Usage) -> Value {
        let choices: Vec<Value> =
            std::iter::once(first).chain(others).enumerate().map(|(i, choice)| self.choice(i, choice)).collect();
        json!({
            "id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
            "choices": choices, "usage": usage(counts),
        })
    }

    fn opening(&mut self, choice: usize, _: &Usage) -> Vec<SseEvent> {
        match self.kind {
            Kind::Chat => vec![data(self.chunk(choice, json!({"role": "assistant", "content": ""}), None))],
            Kind::Completion => vec![],
        }
    }

    fn parts(&mut self, choice: usize, parts: Vec<Part>) -> Vec<SseEvent> {
        let mut events = vec![];
        for part in parts {
            match (self.kind, part) {
                (Kind::Completion, Part::Content(t)) => events.push(data(self.chunk(choice, Value::String(t), None))),
                // A completion's text is all content.
                (Kind::Completion, _) => {}
                (Kind::Chat, part) => {
                    for delta in deltas(part) {
                        events.push(data(self.chunk(choice, delta, None)));
                    }
                }
            }
        }
        events
    }

    fn closing(&mut self, choice: usize, end: &End) -> Vec<SseEvent> {
        let finish = Some(finish_reason(&end.reason, end.called));
        let last = match self.kind {
            Kind::Chat => self.chunk(choice, json!({}), finish),
            Kind::Completion => self.chunk(choice, Value::String(String::new()), finish),
        };
        vec![data(last)]
    }

    fn ending(&mut self, counts: &Usage) -> Vec<SseEvent> {
        let mut events = vec![];
        if self.include_usage {
            // The final chunk of `stream_options.include_usage`: no choices, the usage.
            events.push(data(json!({
                "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
                "choices": [], "usage": usage(counts),
            })));
        }
        events.push(done());
        events
    }

    fn failure(&mut self, error: ApiError) -> Vec<SseEvent> {
        vec![data(error.body()), done()]
    }
}
