//! Llama 3.x tool calls: the answer is `{"name": ..., "parameters": {...}}` (Llama 3.1's
//! template asks for exactly that), possibly after `<|python_tag|>`, several separated by `;`.
//! A JSON answer can only be told from a call once it is whole, so an answer that starts with
//! `{` (or the tag) is held to the end; one that starts otherwise is content, up to a tag.

use super::{call_of, partial_marker, ChatDelta, Spacing, ToolCall, ToolParser};

const TAG: &str = "<|python_tag|>";
/// End-of-message tokens a call may end with when they are not end-of-sequence tokens.
const ENDS: [&str; 2] = ["<|eom_id|>", "<|eot_id|>"];

#[derive(Debug, Default, PartialEq)]
enum State {
    /// Nothing but whitespace yet.
    #[default]
    Start,
    /// Plain content.
    Text,
    /// Calls, held to the end; `tagged` when they came after `<|python_tag|>`.
    Calls { tagged: bool },
}

#[derive(Debug, Default)]
pub(crate) struct Llama3 {
    state: State,
    pending: String,
    spacing: Spacing,
}

/// The calls in `text`: JSON objects separated by `;` or whitespace, each a call; None when
/// anything else is there.
fn calls(text: &str) -> Option<Vec<ToolCall>> {
    let mut text = text.trim();
    for end in ENDS {
        text = text.strip_suffix(end).unwrap_or(text).trim_end();
    }
    let mut found = vec![];
    let mut rest = text;
    loop {
        rest = rest.trim_start().trim_start_matches(';').trim_start();
        if rest.is_empty() {
            break;
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
        let value = values.next()?.ok()?;
        found.push(call_of(&value, &["parameters", "arguments"])?);
        rest = &rest[values.byte_offset()..];
    }
    (!found.is_empty()).then_some(found)
}

impl ToolParser for Llama3 {
    fn push(&mut self, text: &str, out: &mut Vec<ChatDelta>) {
        self.pending.push_str(text);
        if self.state == State::Start {
            let t = self.pending.trim_start();
            if let Some(after) = t.strip_prefix(TAG) {
                self.pending = after.to_string();
                self.state = State::Calls { tagged: true };
            } else if t.starts_with('{') {
                self.state = State::Calls { tagged: false };
            } else if t.is_empty() || TAG.starts_with(t) {
                return;
            } else {
                self.state = State::Text;
            }
        }
        if self.state != State::Text {
            return;
        }
        if let Some(at) = self.pending.find(TAG) {
            let before = self.pending[..at].to_string();
            self.spacing.content(&before, out);
            self.pending.drain(..at + TAG.len());
            self.state = State::Calls { tagged: true };
            return;
        }
        let keep = partial_marker(&self.pending, &[TAG]);
        let ready: String = self.pending.drain(..self.pending.len() - keep).collect();
        self.spacing.content(&ready, out);
    }

    fn finish(&mut self, out: &mut Vec<ChatDelta>) {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Calls { tagged } => match calls(&rest) {
                Some(found) => found.into_iter().for_each(|c| self.spacing.call(c, out)),
                None => self.spacing.content(&format!("{}{rest}", if tagged { TAG } else { "" }), out),
            },
            _ => self.spacing.content(&rest, out),
        }
        self.spacing.finish(out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    fn make() -> Box<dyn ToolParser> {
        Box::new(Llama3::default())
    }

    #[test]
    fn a_json_answer_is_a_call() {
        let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        assert_eq!(parse_every_way(&make, text), vec![call("get_weather", "{\"city\":\"Paris\"}")]);
        let tagged = "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}<|eom_id|>";
        assert_eq!(parse_every_way(&make, tagged), vec![call("f", "{}")]);
    }

    #[test]
    fn several_calls_are_separated_by_semicolons() {
        let text = " {\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"arguments\": {\"y\": [2]}}";
        assert_eq!(parse_every_way(&make, text), vec![call("a", "{\"x\":1}"), call("b", "{\"y\":[2]}")]);
    }

    #[test]
    fn text_then_a_tag_is_content_then_calls() {
        let text = "I will look.\n<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"ü\"}}";
        assert_eq!(parse_every_way(&make, text), vec![content("I will look."), call("f", "{\"q\":\"ü\"}")]);
    }

    #[test]
    fn plain_text_and_json_that_is_no_call_are_content() {
        for text in [
            "Paris is the capital.",
            "{\"answer\": 42}",
            "{\"name\": \"f\", \"parameters\": {",
            "<|python_tag|>brave_search.call(query=\"x\")",
            "<|pyth",
        ] {
            assert_eq!(parse_every_way(&make, text), vec![content(text)], "{text:?}");
        }
    }
}
