//! A chat answer in OpenAI's shape: its text read by nuvec-lm's [`ChatOutput`] into content,
//! `reasoning_content` (with vLLM's alias `reasoning`) and `tool_calls`, as a whole message or
//! as stream deltas. A call is streamed as two deltas: its index, id, type and name (with empty
//! arguments), then its arguments, once the call's JSON is complete.

use nuvec_lm::chat::{ChatDelta, ChatOutput, ToolCall, ToolFormat};
use serde_json::{json, Value};

/// One answer's reader, and the calls it has given so far.
#[derive(Debug)]
pub(crate) struct ChatAnswer {
    output: ChatOutput,
    /// Mints the calls' ids (None when the template has no tool-call format).
    format: Option<ToolFormat>,
    /// Calls given so far.
    calls: usize,
    /// The whole answer, for a response that is not streamed.
    content: String,
    reasoning: String,
    tool_calls: Vec<Value>,
}

impl ChatAnswer {
    pub fn new(output: ChatOutput, format: Option<ToolFormat>) -> Self {
        ChatAnswer { output, format, calls: 0, content: String::new(), reasoning: String::new(), tool_calls: vec![] }
    }

    /// Whether the model called a tool (the finish reason is then "tool_calls").
    pub fn called(&self) -> bool {
        self.calls > 0
    }

    fn call_json(&mut self, call: ToolCall) -> (usize, String, ToolCall) {
        let index = self.calls;
        self.calls += 1;
        let id = self.format.unwrap_or(ToolFormat::Hermes).call_id();
        (index, id, call)
    }

    /// Takes the next text of the answer (or, with `end`, the last): the stream deltas that
    /// became final.
    pub fn stream(&mut self, text: &str, end: bool) -> Vec<Value> {
        let mut deltas = self.output.push(text);
        if end {
            deltas.extend(self.output.finish());
        }
        let mut out = vec![];
        for delta in deltas {
            match delta {
                ChatDelta::Content(t) => out.push(json!({"content": t})),
                ChatDelta::Reasoning(t) => out.push(json!({"reasoning_content": t, "reasoning": t})),
                ChatDelta::ToolCall(call) => {
                    let (index, id, call) = self.call_json(call);
                    out.push(json!({"tool_calls": [{
                        "index": index, "id": id, "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }]}));
                    out.push(json!({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]}));
                }
            }
        }
        out
    }

    /// Takes text of an answer that is not streamed (with `end`, the last).
    pub fn gather(&mut self, text: &str, end: bool) {
        let mut deltas = self.output.push(text);
        if end {
            deltas.extend(self.output.finish());
        }
        for delta in deltas {
            match delta {
                ChatDelta::Content(t) => self.content.push_str(&t),
                ChatDelta::Reasoning(t) => self.reasoning.push_str(&t),
                ChatDelta::ToolCall(call) => {
                    let (_, id, call) = self.call_json(call);
                    self.tool_calls.push(json!({
                        "id": id, "type": "function", "function": {"name": call.name, "arguments": call.arguments},
                    }));
                }
            }
        }
    }

    /// The gathered answer as a message: `content` is null when the model only called tools;
    /// the reasoning fields are there when it reasoned.
    pub fn message(&self) -> Value {
        let content = match self.content.is_empty() && !self.tool_calls.is_empty() {
            true => Value::Null,
            false => self.content.clone().into(),
        };
        let mut message = json!({"role": "assistant", "content": content});
        if !self.reasoning.is_empty() {
            message["reasoning_content"] = self.reasoning.clone().into();
            message["reasoning"] = self.reasoning.clone().into();
        }
        if !self.tool_calls.is_empty() {
            message["tool_calls"] = Value::Array(self.tool_calls.clone());
        }
        message
    }
}
