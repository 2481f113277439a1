//! Reasoning written between `<think>` and `</think>` (Qwen3, DeepSeek-R1 and their kin): the
//! block at the start of an answer is `reasoning_content`, the rest is the answer. A template
//! whose generation prompt opens `<think>` makes the answer start inside the block.
//!
//! The newlines the model writes inside the tags and after `</think>` are layout, not text
//! (Qwen3's template strips them when it writes a past answer back), so they are dropped; a
//! stream holds them back until it knows which they are.

use super::tools::{partial_marker, push_delta, ChatDelta};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start of the answer, where a block may open.
    Before,
    /// Inside the block.
    Inside,
    /// After it (or with none): the answer.
    After,
}

/// Splits an answer's reasoning block from the rest.
#[derive(Debug, Clone)]
pub struct ThinkSplitter {
    state: State,
    pending: String,
    /// Newlines at the start of the block or of the answer after it are still to be dropped.
    trim_start: bool,
}

impl ThinkSplitter {
    /// A splitter for an answer that starts inside the block (`inside`) or where one may open.
    pub fn new(inside: bool) -> Self {
        let state = if inside { State::Inside } else { State::Before };
        ThinkSplitter { state, pending: String::new(), trim_start: inside }
    }

    /// Whether the answer to `prompt` starts inside a block: the generation prompt ends by
    /// opening one.
    pub fn starts_inside(prompt: &str) -> bool {
        prompt.trim_end().ends_with(OPEN)
    }

    /// Takes the next piece: adds the reasoning that became final to `out` and returns the
    /// answer's text that did.
    pub fn push(&mut self, text: &str, out: &mut Vec<ChatDelta>) -> String {
        self.pending.push_str(text);
        let mut answer = String::new();
        loop {
            if self.trim_start {
                let trimmed = self.pending.trim_start_matches(['\n', '\r']);
                if trimmed.is_empty() {
                    self.pending.clear();
                    return answer;
                }
                self.pending = trimmed.to_string();
                self.trim_start = false;
            }
            match self.state {
                State::Before => {
                    let t = self.pending.trim_start();
                    if let Some(after) = t.strip_prefix(OPEN) {
                        self.pending = after.to_string();
                        self.state = State::Inside;
                        self.trim_start = true;
                        continue;
                    }
                    if OPEN.starts_with(t) {
                        return answer; // nothing yet, or the tag's start
                    }
                    self.state = State::After;
                }
                State::Inside => {
                    if let Some(at) = self.pending.find(CLOSE) {
                        let reasoning = self.pending[..at].trim_end_matches(['\n', '\r']).to_string();
                        push_delta(out, ChatDelta::Reasoning(reasoning));
                        self.pending.drain(..at + CLOSE.len());
                        self.state = State::After;
                        self.trim_start = true;
                        continue;
                    }
                    // Hold a possible `</think>` and the newlines that may come before it.
                    let keep = partial_marker(&self.pending, &[CLOSE]);
                    let body = &self.pending[..self.pending.len() - keep];
                    let ready = body.trim_end_matches(['\n', '\r']).len();
                    push_delta(out, ChatDelta::Reasoning(self.pending[..ready].to_string()));
                    self.pending.drain(..ready);
                    return answer;
                }
                State::After => {
                    answer.push_str(&std::mem::take(&mut self.pending));
                    return answer;
                }
            }
        }
    }

    /// The answer has ended: adds the rest of the reasoning to `out`, returns the rest of the
    /// answer.
    pub fn finish(&mut self, out: &mut Vec<ChatDelta>) -> String {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Inside => {
                push_delta(out, ChatDelta::Reasoning(rest.trim_end_matches(['\n', '\r']).to_string()));
                String::new()
            }
            _ if self.trim_start => String::new(),
            _ => rest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tools::testing::*;
    use super::super::tools::ToolParser;
    use super::*;

    /// The splitter as a parser whose answer text is content.
    #[derive(Debug)]
    struct Split(ThinkSplitter);

    impl ToolParser for Split {
        fn push(&mut self, text: &str, out: &mut Vec<ChatDelta>) {
            let answer = self.0.push(text, out);
            push_delta(out, ChatDelta::Content(answer));
        }
        fn finish(&mut self, out: &mut Vec<ChatDelta>) {
            let answer = self.0.finish(out);
            push_delta(out, ChatDelta::Content(answer));
        }
    }

    fn outside() -> Box<dyn ToolParser> {
        Box::new(Split(ThinkSplitter::new(false)))
    }

    fn inside() -> Box<dyn ToolParser> {
        Box::new(Split(ThinkSplitter::new(true)))
    }

    #[test]
    fn a_block_at_the_start_is_reasoning() {
        let text = "<think>\nThe user asks 2+2.\n\nIt is 4.\n</think>\n\nIt is 4.";
        assert_eq!(
            parse_every_way(&outside, text),
            vec![reasoning("The user asks 2+2.\n\nIt is 4."), content("It is 4.")]
        );
    }

    #[test]
    fn an_answer_that_starts_inside() {
        let text = "Hmm, 2+2.\n</think>\n\n4";
        assert_eq!(parse_every_way(&inside, text), vec![reasoning("Hmm, 2+2."), content("4")]);
        // Cut off while thinking: all of it is reasoning.
        assert_eq!(parse_every_way(&inside, "still thinking\n"), vec![reasoning("still thinking")]);
    }

    #[test]
    fn text_without_a_block_is_the_answer() {
        for text in ["Plain.", "  <thin is not a tag", "A <think> later is text", "<thi"] {
            assert_eq!(parse_every_way(&outside, text), vec![content(text)], "{text:?}");
        }
        // An empty block (enable_thinking off writes one into the prompt; a model may too).
        assert_eq!(parse_every_way(&outside, "<think>\n\n</think>\n\nOK"), vec![content("OK")]);
    }

    #[test]
    fn the_prompt_says_where_the_answer_starts() {
        assert!(ThinkSplitter::starts_inside("<|im_start|>assistant\n<think>\n"));
        assert!(!ThinkSplitter::starts_inside("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!ThinkSplitter::starts_inside("<|im_start|>assistant\n"));
    }
}
