//! One chat answer read as it streams: its reasoning, its content and its tool calls, by the
//! reasoning splitter and the tool-call parser the chat template calls for.

use super::reasoning::ThinkSplitter;
use super::tools::{push_delta, ChatDelta, ToolFormat, ToolParser};
use super::ChatTemplate;

/// Reads a chat answer's text into [`ChatDelta`]s. With no reasoning block in the template and
/// no tools in the request it passes the text through as content, unchanged.
#[derive(Debug)]
pub struct ChatOutput {
    think: Option<ThinkSplitter>,
    tools: Option<Box<dyn ToolParser>>,
}

impl ChatOutput {
    /// The reader for an answer to `prompt` (as rendered by `template`): `<think>` blocks are
    /// split off when the template writes them, and tool calls in `format` are parsed when
    /// `tools` (the request offered tools; with `format` None there is nothing to parse).
    /// Harmony does both itself.
    pub fn new(template: &ChatTemplate, prompt: &str, format: Option<ToolFormat>, tools: bool) -> Self {
        if format == Some(ToolFormat::Harmony) {
            return ChatOutput { think: None, tools: Some(ToolFormat::Harmony.parser(tools)) };
        }
        let think =
            template.source().contains("<think>").then(|| ThinkSplitter::new(ThinkSplitter::starts_inside(prompt)));
        ChatOutput { think, tools: format.filter(|_| tools).map(|f| f.parser(true)) }
    }

    /// A reader with the given parts (for tests and callers that pick them themselves).
    pub fn with_parts(think: Option<ThinkSplitter>, tools: Option<Box<dyn ToolParser>>) -> Self {
        ChatOutput { think, tools }
    }

    /// Takes the next piece of the answer; returns what became final.
    pub fn push(&mut self, text: &str) -> Vec<ChatDelta> {
        let mut out = vec![];
        let answer = match &mut self.think {
            Some(t) => t.push(text, &mut out),
            None => text.to_string(),
        };
        match &mut self.tools {
            Some(p) => p.push(&answer, &mut out),
            None => push_delta(&mut out, ChatDelta::Content(answer)),
        }
        out
    }

    /// The answer has ended: returns whatever was held back.
    pub fn finish(&mut self) -> Vec<ChatDelta> {
        let mut out = vec![];
        let answer = match &mut self.think {
            Some(t) => t.finish(&mut out),
            None => String::new(),
        };
        match &mut self.tools {
            Some(p) => {
                p.push(&answer, &mut out);
                p.finish(&mut out);
            }
            None => push_delta(&mut out, ChatDelta::Content(answer)),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::tools::testing::*;
    use super::*;

    #[derive(Debug)]
    struct Whole(ChatOutput);

    impl ToolParser for Whole {
        fn push(&mut self, text: &str, out: &mut Vec<ChatDelta>) {
            out.extend(self.0.push(text));
        }
        fn finish(&mut self, out: &mut Vec<ChatDelta>) {
            out.extend(self.0.finish());
        }
    }

    #[test]
    fn reasoning_then_calls() {
        let make = || -> Box<dyn ToolParser> {
            Box::new(Whole(ChatOutput::with_parts(
                Some(ThinkSplitter::new(false)),
                Some(ToolFormat::Hermes.parser(true)),
            )))
        };
        let text = "<think>\nParis weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        assert_eq!(
            parse_every_way(&make, text),
            vec![reasoning("Paris weather."), call("get_weather", "{\"city\":\"Paris\"}")]
        );
    }

    #[test]
    fn a_forced_prefix_parses_with_the_rest() {
        for format in [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral, ToolFormat::Harmony] {
            let mut output = ChatOutput::with_parts(None, Some(format.parser(true)));
            let mut deltas = output.push(&format.forced_prefix(Some("get_weather")));
            let rest = match format {
                ToolFormat::Hermes => "{\"city\": \"Paris\"}}\n</tool_call>",
                ToolFormat::Mistral => "{\"city\": \"Paris\"}}]",
                ToolFormat::Llama3 => "{\"city\": \"Paris\"}}",
                ToolFormat::Harmony => "{\"city\": \"Paris\"}",
            };
            deltas.extend(output.push(rest));
            deltas.extend(output.finish());
            assert_eq!(normalized(deltas), vec![call("get_weather", "{\"city\":\"Paris\"}")], "{format:?}");
            let mut output = ChatOutput::with_parts(None, Some(format.parser(true)));
            let mut deltas = output.push(&format.forced_prefix(None));
            let rest = match format {
                ToolFormat::Hermes => "f\", \"arguments\": {}}</tool_call>",
                ToolFormat::Llama3 => "f\", \"parameters\": {}}",
                ToolFormat::Mistral => "f\", \"arguments\": {}}]",
                ToolFormat::Harmony => "f <|constrain|>json<|message|>{}",
            };
            deltas.extend(output.push(rest));
            deltas.extend(output.finish());
            assert_eq!(normalized(deltas), vec![call("f", "{}")], "{format:?}");
        }
    }
}
