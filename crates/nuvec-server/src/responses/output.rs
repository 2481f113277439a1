//! An answer as a Responses `response`: its parts become output items in the order the model
//! gave them (`reasoning` with `reasoning_text` content, `message` with one `output_text`
//! part, `function_call`), and a stream is the typed events that build those items
//! (`response.output_item.added`, `…content_part.added`, `…output_text.delta`, …, `…done`),
//! each with `event:` named as its `type` and a `sequence_number`, between
//! `response.created`/`response.in_progress` and `response.completed` (`response.incomplete`
//! when a limit cut the answer, `response.failed` when it failed). The items are built the same
//! way whether streamed or not, so the final response carries the streamed items' ids, as the
//! SDK's stream helper checks.

use axum::response::sse::Event as SseEvent;
use nuvec_lm::GenerateOptions;
use serde_json::{json, Value};

use super::input::Echo;
use crate::answer::Part;
use crate::error::ApiError;
use crate::generation::{fresh_id, Choice, End, Protocol, Usage};

/// Which output item is open for more text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
}

/// A response as it is built.
pub(crate) struct Rendering {
    id: String,
    created_at: u64,
    model: String,
    echo: Echo,
    temperature: f32,
    top_p: f32,
    /// The output items so far; the open one, if any, last.
    items: Vec<Value>,
    open: Option<Open>,
    sequence: u64,
}

fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

impl Rendering {
    pub fn new(id: &str, model: &str, echo: Echo, options: &GenerateOptions) -> Self {
        Rendering {
            id: id.into(),
            created_at: crate::api::now(),
            model: model.into(),
            echo,
            temperature: options.sampler.temperature,
            top_p: options.sampler.top_p,
            items: vec![],
            open: None,
            sequence: 0,
        }
    }

    /// The response object, with the items so far.
    fn response(&self, status: &str, end: Option<&End>, error: Option<&ApiError>) -> Value {
        let incomplete = end.filter(|e| e.cut()).map(|_| json!({"reason": "max_output_tokens"}));
        let mut response = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": self.items,
            "error": error.map(|e| json!({"code": "server_error", "message": e.message})),
            "incomplete_details": incomplete,
            "instructions": self.echo.instructions, "max_output_tokens": self.echo.max_output_tokens,
            "metadata": self.echo.metadata, "parallel_tool_calls": self.echo.parallel_tool_calls,
            "previous_response_id": null, "reasoning": self.echo.reasoning, "store": false,
            "temperature": self.temperature, "top_p": self.top_p, "text": self.echo.text,
            "tool_choice": self.echo.tool_choice, "tools": self.echo.tools, "truncation": "disabled",
            "usage": end.map(|e| usage(&e.usage)),
        });
        if status == "completed" {
            response["completed_at"] = crate::api::now().into();
        }
        response
    }

    /// An event of type `kind` (also its SSE `event:` name), numbered.
    fn event(&mut self, kind: &str, mut data: Value) -> SseEvent {
        data["type"] = kind.into();
        data["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        SseEvent::default().event(kind).data(data.to_string())
    }

    fn last_id(&self) -> Value {
        self.items.last().map_or(Value::Null, |item| item["id"].clone())
    }

    /// Where the open item is, in the events' terms.
    fn place(&self) -> Value {
        json!({"item_id": self.last_id(), "output_index": self.items.len().saturating_sub(1), "content_index": 0})
    }

    fn with_place(&self, fields: Value) -> Value {
        let mut data = self.place();
        if let (Some(data), Value::Object(fields)) = (data.as_object_mut(), fields) {
            data.extend(fields);
        }
        data
    }

    /// Starts a new output item (`item` in progress; `part` its empty content part, if any).
    fn start(&mut self, item: Value, part: Option<Value>, events: &mut Vec<SseEvent>) {
        self.close("completed", events);
        let output_index = self.items.len();
        events.push(self.event("response.output_item.added", json!({"output_index": output_index, "item": item})));
        self.items.push(item);
        if let Some(part) = part {
            let data = self.with_place(json!({"part": part}));
            events.push(self.event("response.content_part.added", data));
            if let Some(content) = self.items.last_mut().and_then(|item| item["content"].as_array_mut()) {
                content.push(part);
            }
        }
    }

    /// Ends the open item, if any, with `status`.
    fn close(&mut self, status: &str, events: &mut Vec<SseEvent>) {
        let Some(open) = self.open.take() else { return };
        let Some(item) = self.items.last_mut() else { return };
        item["status"] = status.into();
        let part = item["content"][0].clone();
        let text = part["text"].clone();
        let done = match open {
            Open::Message => ("response.output_text.done", json!({"text": text, "logprobs": []})),
            Open::Reasoning => ("response.reasoning_text.done", json!({"text": text})),
        };
        let data = self.with_place(done.1);
        events.push(self.event(done.0, data));
        let data = self.with_place(json!({"part": part}));
        events.push(self.event("response.content_part.done", data));
        self.item_done(events);
    }

    fn item_done(&mut self, events: &mut Vec<SseEvent>) {
        let output_index = self.items.len().saturating_sub(1);
        let item = self.items.last().cloned().unwrap_or(Value::Null);
        events.push(self.event("response.output_item.done", json!({"output_index": output_index, "item": item})));
    }

    /// Adds `text` to the open item of kind `open` (starting one if another is open).
    fn text(&mut self, open: Open, text: String, events: &mut Vec<SseEvent>) {
        if self.open != Some(open) {
            let (item, part) = match open {
                Open::Message => (
                    json!({"id": fresh_id("msg_"), "type": "message", "role": "assistant", "status": "in_progress",
                           "content": []}),
                    json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
                ),
                Open::Reasoning => (
                    json!({"id": fresh_id("rs_"), "type": "reasoning", "summary": [], "status": "in_progress",
                           "content": []}),
                    json!({"type": "reasoning_text", "text": ""}),
                ),
            };
            self.start(item, Some(part), events);
            self.open = Some(open);
        }
        if let Some(item) = self.items.last_mut() {
            let so_far = item["content"][0]["text"].as_str().unwrap_or("").to_string();
            item["content"][0]["text"] = (so_far + &text).into();
        }
        let kind = match open {
            Open::Message => "response.output_text.delta",
            Open::Reasoning => "response.reasoning_text.delta",
        };
        let mut data = self.with_place(json!({"delta": text}));
        if open == Open::Message {
            data["logprobs"] = json!([]);
        }
        events.push(self.event(kind, data));
    }

    fn push(&mut self, part: Part, events: &mut Vec<SseEvent>) {
        match part {
            Part::Content(t) => self.text(Open::Message, t, events),
            Part::Reasoning(t) => self.text(Open::Reasoning, t, events),
            Part::Call(c) => {
                let item = json!({"id": fresh_id("fc_"), "type": "function_call", "call_id": c.id, "name": c.name,
                                  "arguments": "", "status": "in_progress"});
                self.start(item, None, events);
                let data =
                    json!({"item_id": self.last_id(), "output_index": self.items.len() - 1, "delta": c.arguments});
                events.push(self.event("response.function_call_arguments.delta", data));
                let data = json!({"item_id": self.last_id(), "output_index": self.items.len() - 1,
                                  "arguments": c.arguments, "name": c.name});
                events.push(self.event("response.function_call_arguments.done", data));
                if let Some(item) = self.items.last_mut() {
                    item["arguments"] = c.arguments.into();
                    item["status"] = "completed".into();
                }
                self.item_done(events);
            }
        }
    }

    /// Closes the answer's items (an answer with none gets an empty message, so there is
    /// always output text to read): the final status and its events.
    fn finish(&mut self, end: &End, events: &mut Vec<SseEvent>) -> &'static str {
        if self.items.is_empty() {
            self.text(Open::Message, String::new(), events);
        }
        let status = if end.cut() { "incomplete" } else { "completed" };
        self.close(status, events);
        status
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
        let status = self.finish(end, &mut unsent);
        self.response(status, Some(end), None)
    }

    fn opening(&mut self, _: usize, _: &Usage) -> Vec<SseEvent> {
        let response = self.response("in_progress", None, None);
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
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
        let status = self.finish(end, &mut events);
        let response = self.response(status, Some(end), None);
        let kind = if status == "incomplete" { "response.incomplete" } else { "response.completed" };
        events.push(self.event(kind, json!({"response": response})));
        events
    }

    fn failure(&mut self, error: ApiError) -> Vec<SseEvent> {
        let mut events = vec![];
        self.close("incomplete", &mut events);
        let response = self.response("failed", None, Some(&error));
        events.push(self.event("response.failed", json!({"response": response})));
        events
    }
}
