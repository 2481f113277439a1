//! Tool calls in a model's answer: one parser per family's markup, picked from the chat template.
//!
//! - [`ToolFormat::Hermes`] (Qwen 2.5/3, Hermes): `<tool_call>{"name", "arguments"}</tool_call>`.
//! - [`ToolFormat::Llama3`] (Llama 3.1-3.3): `{"name", "parameters"}` as the whole answer,
//!   possibly after `<|python_tag|>`, several separated by `;`.
//! - [`ToolFormat::Mistral`]: `[TOOL_CALLS][{"name", "arguments"}, ...]`, or the newer
//!   `[TOOL_CALLS]name[ARGS]{...}`.
//! - [`ToolFormat::Harmony`] (gpt-oss): `<|channel|>commentary to=functions.NAME ...<|message|>{...}`
//!   ending at `<|call|>`; its analysis channel is reasoning, its final channel the content.
//!
//! A parser takes the answer's text in pieces as it is generated and gives back
//! [`ChatDelta`]s once they are final: text that could still be the start of a tool-call tag is
//! held back until it cannot be, and each call is given whole once its JSON is complete. A call
//! whose JSON does not parse is given back as content, never dropped.

use serde_json::Value;

pub use forced::ForcedTool;

mod forced;
mod harmony;
mod hermes;
mod llama3;
mod mistral;

/// A tool call the model made: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments: JSON text (an object), as OpenAI's `function.arguments` carries it.
    pub arguments: String,
}

/// A piece of a chat answer that is final.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatDelta {
    /// Text for `content`.
    Content(String),
    /// Text for `reasoning_content`.
    Reasoning(String),
    /// A whole tool call.
    ToolCall(ToolCall),
}

/// Adds `delta` to `out`, joining it to the last delta when both are text of the same kind
/// (empty text is dropped).
pub(crate) fn push_delta(out: &mut Vec<ChatDelta>, delta: ChatDelta) {
    match (out.last_mut(), delta) {
        (_, ChatDelta::Content(t) | ChatDelta::Reasoning(t)) if t.is_empty() => {}
        (Some(ChatDelta::Content(a)), ChatDelta::Content(b)) => a.push_str(&b),
        (Some(ChatDelta::Reasoning(a)), ChatDelta::Reasoning(b)) => a.push_str(&b),
        (_, delta) => out.push(delta),
    }
}

/// One family's tool-call parser over an answer's text.
pub trait ToolParser: Send + std::fmt::Debug {
    /// Takes the next piece of the answer; adds what became final to `out`.
    fn push(&mut self, text: &str, out: &mut Vec<ChatDelta>);
    /// The answer has ended: adds whatever was held back.
    fn finish(&mut self, out: &mut Vec<ChatDelta>);
}

/// A family of tool-call markup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{json}</tool_call>` (Qwen, Hermes).
    Hermes,
    /// Bare JSON `{"name", "parameters"}`, maybe after `<|python_tag|>` (Llama 3.x).
    Llama3,
    /// `[TOOL_CALLS]` then the calls (Mistral).
    Mistral,
    /// OpenAI's harmony channels (gpt-oss).
    Harmony,
}

impl ToolFormat {
    /// The format a chat template asks its model to call tools in, read from the markup it
    /// writes; None for a template that writes no tool calls nuvec knows.
    pub fn of_template(source: &str) -> Option<Self> {
        if source.contains("<|channel|>") && source.contains("<|message|>") {
            Some(ToolFormat::Harmony)
        } else if source.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if source.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else if source.contains("<|start_header_id|>") && source.contains("\"parameters\"") {
            // Llama 3.1's template tells the model to answer {"name": ..., "parameters": ...}.
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    /// Its name in messages and docs.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "Hermes/Qwen <tool_call>",
            ToolFormat::Llama3 => "Llama 3 JSON",
            ToolFormat::Mistral => "Mistral [TOOL_CALLS]",
            ToolFormat::Harmony => "gpt-oss harmony",
        }
    }

    /// A parser of this format. `tools` says whether the request offered tools: without them
    /// harmony still splits its channels, and the other formats are not parsed at all
    /// ([`ChatOutput`](crate::chat::ChatOutput) passes the text through).
    pub fn parser(self, tools: bool) -> Box<dyn ToolParser> {
        match self {
            ToolFormat::Hermes => Box::new(hermes::Hermes::default()),
            ToolFormat::Llama3 => Box::new(llama3::Llama3::default()),
            ToolFormat::Mistral => Box::new(mistral::Mistral::default()),
            ToolFormat::Harmony => Box::new(harmony::Harmony::new(tools)),
        }
    }

    /// A fresh id for a call: Mistral's templates take exactly 9 letters and digits; the
    /// others get OpenAI's `call_` and 24 of them.
    pub fn call_id(self) -> String {
        match self {
            ToolFormat::Mistral => random_alnum(9),
            _ => format!("call_{}", random_alnum(24)),
        }
    }
}

/// `n` random letters and digits, from the process's hash seed and a counter (unique within
/// the process, unlikely to repeat across processes).
fn random_alnum(n: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let seed = std::collections::hash_map::RandomState::new();
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut out = String::with_capacity(n);
    let mut word = 0u64;
    for i in 0..n {
        if i % 8 == 0 {
            let mut h = seed.build_hasher();
            h.write_u64(count);
            h.write_usize(i);
            word = h.finish();
        }
        out.push(ALPHABET[(word % ALPHABET.len() as u64) as usize] as char);
        word /= ALPHABET.len() as u64;
    }
    out
}

/// How many bytes at the end of `text` could be the start of one of `markers` (a proper
/// prefix of it): that much must wait for more text before it can be let through.
pub(crate) fn partial_marker(text: &str, markers: &[&str]) -> usize {
    let bytes = text.as_bytes();
    markers
        .iter()
        .map(|m| {
            (1..m.len().min(bytes.len() + 1))
                .rev()
                .find(|&n| m.as_bytes().starts_with(&bytes[bytes.len() - n..]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// The earliest of `markers` in `text`: (its start, the marker).
pub(crate) fn find_first<'m>(text: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers.iter().filter_map(|m| text.find(m).map(|i| (i, *m))).min_by_key(|&(i, _)| i)
}

/// Arguments as OpenAI carries them: an object as its JSON text (a JSON string holding an
/// object is taken as that text); anything else is not a call's arguments.
pub(crate) fn arguments_text(value: &Value) -> Option<String> {
    match value {
        Value::Object(_) => Some(value.to_string()),
        Value::String(s) => matches!(serde_json::from_str::<Value>(s), Ok(Value::Object(_))).then(|| s.clone()),
        _ => None,
    }
}

/// `{"name": ..., <key>: {...}}` (the first of `keys` present) as a call.
pub(crate) fn call_of(value: &Value, keys: &[&str]) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let arguments = match keys.iter().find_map(|k| value.get(*k)) {
        Some(v) => arguments_text(v)?,
        None => "{}".to_string(),
    };
    Some(ToolCall { name: name.to_string(), arguments })
}

/// Content around tool calls: whitespace between a text and a call, between calls, or after
/// the last call is dropped (a model writes "\n" around its tags; it is markup, not an answer).
/// Whitespace is held until text follows it, so a stream never sends what is later dropped.
#[derive(Debug, Default)]
pub(crate) struct Spacing {
    held: String,
    after_call: bool,
    calls: usize,
}

impl Spacing {
    pub fn content(&mut self, text: &str, out: &mut Vec<ChatDelta>) {
        if text.is_empty() {
            return;
        }
        let body = text.trim_end();
        let trailing = &text[body.len()..];
        if body.is_empty() {
            self.held.push_str(text);
            return;
        }
        let held = std::mem::take(&mut self.held);
        let body = if self.after_call {
            // Text after a call starts at its first non-space character.
            body.trim_start()
        } else {
            push_delta(out, ChatDelta::Content(held));
            body
        };
        push_delta(out, ChatDelta::Content(body.to_string()));
        self.held.push_str(trailing);
        self.after_call = false;
    }

    pub fn call(&mut self, call: ToolCall, out: &mut Vec<ChatDelta>) {
        self.held.clear();
        self.after_call = true;
        self.calls += 1;
        out.push(ChatDelta::ToolCall(call));
    }

    pub fn finish(&mut self, out: &mut Vec<ChatDelta>) {
        let held = std::mem::take(&mut self.held);
        if self.calls == 0 {
            push_delta(out, ChatDelta::Content(held));
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Feeding a parser whole, char by char and split at every position, and checking that each
    //! way gives the same deltas.
    use super::*;

    /// Joins adjacent text deltas of one kind, so that differently split runs compare equal.
    pub fn normalized(deltas: Vec<ChatDelta>) -> Vec<ChatDelta> {
        let mut out = vec![];
        for d in deltas {
            push_delta(&mut out, d);
        }
        out
    }

    /// Runs `make()`'s parser over `pieces`.
    pub fn run(make: &dyn Fn() -> Box<dyn ToolParser>, pieces: &[&str]) -> Vec<ChatDelta> {
        let mut p = make();
        let mut out = vec![];
        for piece in pieces {
            p.push(piece, &mut out);
        }
        p.finish(&mut out);
        normalized(out)
    }

    /// The deltas of `text` fed whole; asserts that char by char and every split in two give
    /// the same.
    pub fn parse_every_way(make: &dyn Fn() -> Box<dyn ToolParser>, text: &str) -> Vec<ChatDelta> {
        let whole = run(make, &[text]);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(make, &refs), whole, "char by char: {text:?}");
        for (i, _) in text.char_indices().skip(1) {
            assert_eq!(run(make, &[&text[..i], &text[i..]]), whole, "split at {i}: {text:?}");
        }
        whole
    }

    pub fn content(s: &str) -> ChatDelta {
        ChatDelta::Content(s.into())
    }

    pub fn reasoning(s: &str) -> ChatDelta {
        ChatDelta::Reasoning(s.into())
    }

    pub fn call(name: &str, arguments: &str) -> ChatDelta {
        ChatDelta::ToolCall(ToolCall { name: name.into(), arguments: arguments.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_read_from_the_templates_markup() {
        assert_eq!(ToolFormat::of_template("{{ '<tool_call>' }}"), Some(ToolFormat::Hermes));
        assert_eq!(ToolFormat::of_template("<|channel|>x<|message|>"), Some(ToolFormat::Harmony));
        assert_eq!(ToolFormat::of_template("[TOOL_CALLS]"), Some(ToolFormat::Mistral));
        assert_eq!(
            ToolFormat::of_template("<|start_header_id|> {\"name\": x, \"parameters\": y}"),
            Some(ToolFormat::Llama3)
        );
        // Llama 3's plain template has no tool calls.
        assert_eq!(ToolFormat::of_template("<|start_header_id|>{{ message['content'] }}"), None);
    }

    #[test]
    fn partial_markers_hold_only_a_possible_start() {
        assert_eq!(partial_marker("abc <tool", &["<tool_call>"]), 5);
        assert_eq!(partial_marker("abc <tool_call", &["<tool_call>"]), 10);
        assert_eq!(partial_marker("abc <tx", &["<tool_call>"]), 0);
        assert_eq!(partial_marker("é<", &["<|end|>", "<|call|>"]), 1);
        assert_eq!(partial_marker("", &["<x>"]), 0);
    }

    #[test]
    fn call_ids_have_their_formats_shape() {
        let mistral = ToolFormat::Mistral.call_id();
        assert_eq!(mistral.len(), 9);
        assert!(mistral.chars().all(|c| c.is_ascii_alphanumeric()));
        let hermes = ToolFormat::Hermes.call_id();
        assert!(hermes.starts_with("call_") && hermes.len() == 29, "{hermes}");
        assert_ne!(ToolFormat::Hermes.call_id(), ToolFormat::Hermes.call_id());
    }
}
