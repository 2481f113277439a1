//! An answer as an Anthropic `message`: its parts become content blocks in the order the model
//! gave them (`thinking` with an empty signature, `text`, `tool_use` with the arguments as its
//! `input` object), and a stream is `message_start`, `ping`, then per block
//! `content_block_start`, `content_block_delta` (`thinking_delta`, `text_delta`,
//! `input_json_delta`) and `content_block_stop`, then `message_delta` (stop reason and usage)
//! and `message_stop`; a failure mid-stream is an `error` event. `usage.input_tokens` counts
//! the prompt tokens not read from the prefix cache, `cache_read_input_tokens` the others, as
//! Anthropic splits them.

use axum::response::sse::Event as SseEvent;
use nuvec_lm::{FinishReason, Stopped};
use serde_json::{json, Value};

use super::error_body;
use crate::answer::Part;
use crate::error::ApiError;
use crate::generation::{Choice, End, Protocol, Usage};

/// Which block is open for more text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
}

/// A message as it is built.
pub(crate) struct Rendering {
    id: String,
    model: String,
    stop_sequences: Vec<String>,
    /// The content blocks so far; the open one, if any, last.
    blocks: Vec<Value>,
    open: Option<Open>,
}

fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

fn event(kind: &str, data: Value) -> SseEvent {
    SseEvent::default().event(kind).data(data.to_string())
}

/// A tool_use id: Anthropic's `toolu_` in place of `call_`; Mistral's 9-character ids stay as
/// they are, since its template checks them when the call comes back.
fn tool_use_id(id: &str) -> String {
    match id.strip_prefix("call_") {
        Some(rest) => format!("toolu_{rest}"),
        None => id.to_string(),
    }
}

impl Rendering {
    pub fn new(id: &str, model: &str, stop_sequences: Vec<String>) -> Self {
        Rendering { id: id.into(), model: model.into(), stop_sequences, blocks: vec![], open: None }
    }

    /// Anthropic's stop reason, and the stop sequence that matched, if one did.
    fn stop_reason(&self, end: &End) -> (&'static str, Option<String>) {
        match &end.reason {
            _ if end.called => ("tool_use", None),
            FinishReason::Stop(Stopped::String { index, .. }) => {
                ("stop_sequence", self.stop_sequences.get(*index).cloned())
            }
            FinishReason::Length
            | FinishReason::ConstraintUnfinished
            | FinishReason::ContextLength(_)
            | FinishReason::CacheFull => ("max_tokens", None),
            _ => ("end_turn", None),
        }
    }

    fn message(&self, content: Value, end: Option<&End>, usage_now: Value) -> Value {
        let (reason, sequence) = match end {
            Some(end) => {
                let (r, s) = self.stop_reason(end);
                (Value::from(r), s.map_or(Value::Null, Value::from))
            }
            None => (Value::Null, Value::Null),
        };
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage_now,
        })
    }

    fn close(&mut self, events: &mut Vec<SseEvent>) {
        if self.open.take().is_some() {
            let index = self.blocks.len() - 1;
            events.push(event("content_block_stop", json!({"type": "content_block_stop", "index": index})));
        }
    }

    /// Starts block `block` (as it is sent at its start: empty).
    fn start(&mut self, block: Value, events: &mut Vec<SseEvent>) -> usize {
        self.close(events);
        let index = self.blocks.len();
        let data = json!({"type": "content_block_start", "index": index, "content_block": block});
        events.push(event("content_block_start", data));
        self.blocks.push(block);
        index
    }

    fn delta(index: usize, delta: Value) -> SseEvent {
        event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta}))
    }

    fn text(&mut self, open: Open, text: String, events: &mut Vec<SseEvent>) {
        if self.open != Some(open) {
            let block = match open {
                Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                Open::Text => json!({"type": "text", "text": ""}),
            };
            self.start(block, events);
            self.open = Some(open);
        }
        let index = self.blocks.len() - 1;
        let key = match open {
            Open::Thinking => "thinking",
            Open::Text => "text",
        };
        if let Some(block) = self.blocks.last_mut() {
            let so_far = block[key].as_str().unwrap_or("").to_string();
            block[key] = (so_far + &text).into();
        }
        let delta = match open {
            Open::Thinking => json!({"type": "thinking_delta", "thinking": text}),
            Open::Text => json!({"type": "text_delta", "text": text}),
        };
        events.push(Self::delta(index, delta));
    }

    fn push(&mut self, part: Part, events: &mut Vec<SseEvent>) {
        match part {
            Part::Reasoning(t) => self.text(Open::Thinking, t, events),
            Part::Content(t) => self.text(Open::Text, t, events),
            Part::Call(c) => {
                let block = json!({"type": "tool_use", "id": tool_use_id(&c.id), "name": c.name, "input": {}});
                let index = self.start(block, events);
                events.push(Self::delta(index, json!({"type": "input_json_delta", "partial_json": c.arguments})));
                // The reader gives a call only once its arguments are whole JSON.
                let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
                if let Some(block) = self.blocks.last_mut() {
                    block["input"] = input;
                }
                events.push(event("content_block_stop", json!({"type": "content_block_stop", "index": index})));
            }
        }
    }
}

impl Protocol for Rendering {
    // No `n` here: the request has one choice.
    fn whole(&mut self, first: Choice, _: Vec<Choice>, _: &Usage) -> Value {
        let Choice { answer, end } = first;
        let end = &end;
        let mut unsent = vec![];
        for part in answer.parts {
            self.push(part, &mut unsent);
        }
        self.message(Value::Array(self.blocks.clone()), Some(end), usage(&end.usage))
    }

    fn opening(&mut self, _: usize, usage_now: &Usage) -> Vec<SseEvent> {
        let mut start = usage(usage_now);
        start["output_tokens"] = 0.into();
        let message = self.message(json!([]), None, start);
        vec![
            event("message_start", json!({"type": "message_start", "message": message})),
            event("ping", json!({"type": "ping"})),
        ]
    }

    fn parts(&mut self, _: usize, parts: Vec<Part>) -> Vec<SseEvent> {
        let mut events = vec![];
        for part in parts {
            self.push(part, &mut events);
        }
        events
    }

    fn closing(&mut self, _: usize, end: &End) -> Vec<SseEvent> {
        let mut events = vec![];
        self.close(&mut events);
        let (reason, sequence) = self.stop_reason(end);
        let data = json!({
            "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(&end.usage),
        });
        events.push(event("message_delta", data));
        events.push(event("message_stop", json!({"type": "message_stop"})));
        events
    }

    fn failure(&mut self, error: ApiError) -> Vec<SseEvent> {
        vec![event("error", error_body(&error))]
    }
}
