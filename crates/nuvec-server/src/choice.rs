//! One choice of a request read as its tokens come: the text ([`TextStream`]: stop strings
//! cut, held back while they may still match), its answer parts ([`ChatAnswer`]) and its
//! token counts; and the counts of a request's choices together.

use std::sync::Arc;

use nuvec_lm::{FinishReason, TextStream};

use crate::answer::{Answer, ChatAnswer, Part};
use crate::params::{Kind, Parsed};

/// Token counts, of one choice or of a whole request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Tokens of the answer's reasoning (counted by encoding its text again at the end: the
    /// reader holds text back, so tokens cannot be told apart as they come).
    pub reasoning_tokens: usize,
}

impl Usage {
    /// A request's counts from its choices' (`choices[0]` first): the prompt once, with the
    /// first choice's cached tokens; the answers' tokens summed.
    pub fn of_request(choices: &[Usage]) -> Usage {
        let first = choices.first().copied().unwrap_or_default();
        Usage {
            completion_tokens: choices.iter().map(|u| u.completion_tokens).sum(),
            reasoning_tokens: choices.iter().map(|u| u.reasoning_tokens).sum(),
            ..first
        }
    }
}

/// How a choice ended.
#[derive(Debug)]
pub(crate) struct End {
    pub reason: FinishReason,
    /// Whether the model called a tool.
    pub called: bool,
    pub usage: Usage,
}

impl End {
    /// Whether a limit cut the answer (max_tokens, the context, or the KV cache).
    pub fn cut(&self) -> bool {
        matches!(
            self.reason,
            FinishReason::Length
                | FinishReason::ConstraintUnfinished
                | FinishReason::ContextLength(_)
                | FinishReason::CacheFull
        )
    }
}

/// A choice's whole answer and how it ended.
#[derive(Debug)]
pub(crate) struct Choice {
    pub answer: Answer,
    pub end: End,
}

/// One choice's answer as it is read: text, parts and counts.
pub(crate) struct Reading {
    text: TextStream,
    /// A chat answer's reader (None for a completion, whose text is all content).
    answer: Option<ChatAnswer>,
    pub usage: Usage,
    called: bool,
    reasoning: String,
    tokenizer: Arc<nuvec_lm::Tokenizer>,
    /// Whether a stream sent the choice's opening events.
    pub opened: bool,
    /// Set when the choice ended.
    pub end: Option<End>,
}

impl Reading {
    /// The reading of one choice of `parsed`, whose prompt is `prompt_tokens` long.
    pub fn new(
        tokenizer: &Arc<nuvec_lm::Tokenizer>,
        parsed: &Parsed,
        answer: Option<ChatAnswer>,
        prompt_tokens: usize,
    ) -> Self {
        let mut text = TextStream::new(tokenizer, &parsed.options);
        if parsed.kind == Kind::Chat {
            // The answer as mlx_lm.server and `nuvec generate` give it (a byte-level BPE
            // answer's first leading space dropped); a completion keeps it, so prompt + text is
            // the whole.
            text = text.with_mlx_lm_spacing();
        }
        Reading {
            text,
            answer,
            usage: Usage { prompt_tokens, ..Usage::default() },
            called: false,
            reasoning: String::new(),
            tokenizer: tokenizer.clone(),
            opened: false,
            end: None,
        }
    }

    /// The parts that became final with `token`.
    pub fn token(&mut self, token: u32) -> Vec<Part> {
        self.usage.completion_tokens += 1;
        let text = self.text.push(token);
        self.read(text, false)
    }

    /// The choice ended for `reason`: the parts held back until now. [`Reading::end`] says how
    /// it ended from then on.
    pub fn finish(&mut self, reason: FinishReason) -> Vec<Part> {
        let text = self.text.finish();
        let parts = self.read(text, true);
        if !self.reasoning.is_empty() {
            self.usage.reasoning_tokens = self.tokenizer.encode(&self.reasoning, false).map_or(0, |ids| ids.len());
        }
        self.end = Some(End { reason, called: self.called, usage: self.usage });
        parts
    }

    fn read(&mut self, text: String, end: bool) -> Vec<Part> {
        let parts = match &mut self.answer {
            Some(answer) => answer.read(&text, end),
            None if text.is_empty() => vec![],
            None => vec![Part::Content(text)],
        };
        for part in &parts {
            match part {
                Part::Call(_) => self.called = true,
                Part::Reasoning(t) => self.reasoning.push_str(t),
                Part::Content(_) => {}
            }
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_its_prompt_once_and_sums_its_answers() {
        let choice = |cached, completion, reasoning| Usage {
            prompt_tokens: 10,
            cached_tokens: cached,
            completion_tokens: completion,
            reasoning_tokens: reasoning,
        };
        let total = Usage::of_request(&[choice(0, 3, 1), choice(8, 4, 0), choice(8, 5, 2)]);
        assert_eq!(total, Usage { prompt_tokens: 10, cached_tokens: 0, completion_tokens: 12, reasoning_tokens: 3 });
        assert_eq!(Usage::of_request(&[choice(8, 4, 0)]), choice(8, 4, 0));
    }
}
