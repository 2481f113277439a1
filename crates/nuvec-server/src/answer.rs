//! A chat answer read into its parts by nuvec-lm's [`ChatOutput`]: content, reasoning and tool
//! calls (each call with an id minted in its template's style), in the order the model gave
//! them. Every protocol renders these parts in its own shape (`completions.rs`,
//! `responses/`, `messages/`), so the reading is done once.

use nuvec_lm::chat::{ChatDelta, ChatOutput, ToolFormat};

/// A final piece of an answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Part {
    /// Text for the answer itself.
    Content(String),
    /// Text the model thought in (Qwen3's `<think>`, gpt-oss' analysis channel).
    Reasoning(String),
    /// A whole tool call.
    Call(Call),
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    /// Which call of the answer this is (0 first).
    pub index: usize,
    /// Its id, as the template's format mints them (`call_…`; 9 letters and digits for Mistral).
    pub id: String,
    pub name: String,
    /// JSON text of an object.
    pub arguments: String,
}

/// One answer's reader, and the calls it has given so far.
#[derive(Debug)]
pub(crate) struct ChatAnswer {
    output: ChatOutput,
    /// Mints the calls' ids (None when the template has no tool-call format).
    format: Option<ToolFormat>,
    /// Calls given so far.
    calls: usize,
}

impl ChatAnswer {
    pub fn new(output: ChatOutput, format: Option<ToolFormat>) -> Self {
        ChatAnswer { output, format, calls: 0 }
    }

    /// Takes the next text of the answer (or, with `end`, the last): the parts that became
    /// final (none while the reader holds back text that may still be markup).
    pub fn read(&mut self, text: &str, end: bool) -> Vec<Part> {
        let mut deltas = self.output.push(text);
        if end {
            deltas.extend(self.output.finish());
        }
        deltas
            .into_iter()
            .map(|delta| match delta {
                ChatDelta::Content(t) => Part::Content(t),
                ChatDelta::Reasoning(t) => Part::Reasoning(t),
                ChatDelta::ToolCall(call) => {
                    let index = self.calls;
                    self.calls += 1;
                    let id = self.format.unwrap_or(ToolFormat::Hermes).call_id();
                    Part::Call(Call { index, id, name: call.name, arguments: call.arguments })
                }
            })
            .collect()
    }
}

/// A whole answer: its parts in order, adjacent text of one kind joined.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Answer {
    pub parts: Vec<Part>,
}

impl Answer {
    pub fn extend(&mut self, parts: Vec<Part>) {
        for part in parts {
            match (self.parts.last_mut(), part) {
                (Some(Part::Content(a)), Part::Content(b)) | (Some(Part::Reasoning(a)), Part::Reasoning(b)) => {
                    a.push_str(&b)
                }
                (_, part) => self.parts.push(part),
            }
        }
    }

    /// All the answer's content.
    pub fn content(&self) -> String {
        self.parts.iter().filter_map(|p| if let Part::Content(t) = p { Some(t.as_str()) } else { None }).collect()
    }

    /// All its reasoning.
    pub fn reasoning(&self) -> String {
        self.parts.iter().filter_map(|p| if let Part::Reasoning(t) = p { Some(t.as_str()) } else { None }).collect()
    }

    pub fn calls(&self) -> impl Iterator<Item = &Call> {
        self.parts.iter().filter_map(|p| if let Part::Call(c) = p { Some(c) } else { None })
    }
}
