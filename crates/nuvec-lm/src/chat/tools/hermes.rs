//! Hermes/Qwen tool calls: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, any
//! number of them, text before them being the content. A call cut off by the end of the answer
//! is parsed as far as it got (vLLM's Hermes parser takes it too).

use super::{call_of, partial_marker, ChatDelta, Spacing, ToolParser};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug, Default)]
pub(crate) struct Hermes {
    /// Text not yet let through: a possible start of `<tool_call>`, or a call's body.
    pending: String,
    in_call: bool,
    spacing: Spacing,
}

impl Hermes {
    /// The call in `body` (between the tags), or the whole markup back as content.
    fn close(&mut self, body: &str, closed: bool, out: &mut Vec<ChatDelta>) {
        let parsed = serde_json::from_str(body.trim()).ok().and_then(|v| call_of(&v, &["arguments", "parameters"]));
        match parsed {
            Some(call) => self.spacing.call(call, out),
            None => {
                let close = if closed { CLOSE } else { "" };
                self.spacing.content(&format!("{OPEN}{body}{close}"), out)
            }
        }
    }
}

impl ToolParser for Hermes {
    fn push(&mut self, text: &str, out: &mut Vec<ChatDelta>) {
        self.pending.push_str(text);
        loop {
            if self.in_call {
                let Some(end) = self.pending.find(CLOSE) else { return };
                let body = self.pending[..end].to_string();
                self.pending.drain(..end + CLOSE.len());
                self.in_call = false;
                self.close(&body, true, out);
            } else if let Some(start) = self.pending.find(OPEN) {
                let before = self.pending[..start].to_string();
                self.spacing.content(&before, out);
                self.pending.drain(..start + OPEN.len());
                self.in_call = true;
            } else {
                let keep = partial_marker(&self.pending, &[OPEN]);
                let ready: String = self.pending.drain(..self.pending.len() - keep).collect();
                self.spacing.content(&ready, out);
                return;
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<ChatDelta>) {
        let rest = std::mem::take(&mut self.pending);
        if self.in_call {
            self.in_call = false;
            self.close(&rest, false, out);
        } else {
            self.spacing.content(&rest, out);
        }
        self.spacing.finish(out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    fn make() -> Box<dyn ToolParser> {
        Box::new(Hermes::default())
    }

    #[test]
    fn calls_are_parsed_and_the_markup_never_reaches_content() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"é 日本\"}}\n</tool_call>";
        assert_eq!(
            parse_every_way(&make, text),
            vec![
                content("Let me check."),
                call("get_weather", "{\"city\":\"Paris\"}"),
                call("search", "{\"query\":\"é 日本\"}"),
            ]
        );
    }

    #[test]
    fn text_without_calls_is_content_as_it_is() {
        // An unfinished tag at the very end is held, then given back as text.
        for text in ["Plain answer.", "a < b and <tool is not a tag", "  spaced  \n", "x <tool_call"] {
            assert_eq!(parse_every_way(&make, text), vec![content(text)], "{text:?}");
        }
    }

    #[test]
    fn malformed_calls_come_back_as_content() {
        let bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>";
        assert_eq!(parse_every_way(&make, bad), vec![content(bad)]);
        let no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
        assert_eq!(parse_every_way(&make, no_name), vec![content(no_name)]);
        let not_object = "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>";
        assert_eq!(parse_every_way(&make, not_object), vec![content(not_object)]);
    }

    #[test]
    fn a_call_cut_off_at_the_end_is_taken_when_its_json_is_whole() {
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n";
        assert_eq!(parse_every_way(&make, text), vec![call("f", "{\"a\":1}")]);
        let cut = "<tool_call>\n{\"name\": \"f\", \"argu";
        assert_eq!(parse_every_way(&make, cut), vec![content(cut)]);
    }

    #[test]
    fn arguments_given_as_a_json_string_are_kept() {
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>";
        assert_eq!(parse_every_way(&make, text), vec![call("f", "{\"a\": 1}")]);
    }

    #[test]
    fn text_after_a_call_starts_at_its_first_word() {
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n\nDone.";
        assert_eq!(parse_every_way(&make, text), vec![call("f", "{}"), content("Done.")]);
    }
}
