//! gpt-oss's harmony format: the answer is a run of messages, each a header and a body,
//! `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`.
//! The analysis channel is reasoning, the final channel (and commentary without a recipient,
//! a preamble) is content, and a message to `functions.NAME` (the recipient may be written
//! before or after the channel: `to=functions.NAME<|channel|>commentary json` or
//! `<|channel|>commentary to=functions.NAME <|constrain|>json`) is a call whose body is its
//! JSON arguments. A body ends at `<|end|>`, `<|call|>` or `<|return|>` (or where the answer
//! ends: the last two are end-of-sequence tokens, so they are not in the text).

use super::{arguments_text, find_first, partial_marker, push_delta, ChatDelta, ToolCall, ToolParser};

const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
/// What ends a body.
const ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"];

#[derive(Debug, Clone, PartialEq)]
enum Body {
    Reasoning,
    Content,
    /// A call to this function (its name without `functions.`).
    Call(String),
}

#[derive(Debug)]
pub(crate) struct Harmony {
    /// Whether the request offered tools (without, a call's body is content).
    tools: bool,
    /// None while reading a header.
    body: Option<Body>,
    pending: String,
}

impl Harmony {
    pub fn new(tools: bool) -> Self {
        Harmony { tools, body: None, pending: String::new() }
    }
}

/// The first word after `key` in `header` (up to a space or the next `<|`).
fn word_after<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let at = header.rfind(key)? + key.len();
    let rest = &header[at..];
    let end = rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len());
    Some(&rest[..end]).filter(|w| !w.is_empty())
}

/// What a message with `header` holds.
fn body_of(header: &str, tools: bool) -> Body {
    if let Some(recipient) = word_after(header, "to=") {
        return match recipient.strip_prefix("functions.") {
            Some(name) if tools && !name.is_empty() => Body::Call(name.to_string()),
            // A built-in tool's call (browser, python) or a call nobody offered: its body as text.
            _ => Body::Content,
        };
    }
    match word_after(header, CHANNEL) {
        Some("analysis") => Body::Reasoning,
        _ => Body::Content,
    }
}

impl Harmony {
    fn close(&mut self, body: Body, text: &str, out: &mut Vec<ChatDelta>) {
        match body {
            Body::Reasoning => push_delta(out, ChatDelta::Reasoning(text.to_string())),
            Body::Content => push_delta(out, ChatDelta::Content(text.to_string())),
            Body::Call(name) => {
                let arguments = serde_json::from_str(text.trim()).ok().and_then(|v| arguments_text(&v));
                match arguments {
                    Some(arguments) => out.push(ChatDelta::ToolCall(ToolCall { name, arguments })),
                    None => push_delta(out, ChatDelta::Content(text.to_string())),
                }
            }
        }
    }
}

impl ToolParser for Harmony {
    fn push(&mut self, text: &str, out: &mut Vec<ChatDelta>) {
        self.pending.push_str(text);
        loop {
            match self.body.clone() {
                None => {
                    let Some(at) = self.pending.find(MESSAGE) else { return };
                    self.body = Some(body_of(&self.pending[..at], self.tools));
                    self.pending.drain(..at + MESSAGE.len());
                }
                Some(body) => {
                    if let Some((at, end)) = find_first(&self.pending, &ENDS) {
                        let text = self.pending[..at].to_string();
                        // `<|start|>` opens the next header; the others end this message.
                        let skip = if end == "<|start|>" { 0 } else { end.len() };
                        self.pending.drain(..at + skip);
                        self.body = None;
                        self.close(body, &text, out);
                        continue;
                    }
                    if matches!(body, Body::Call(_)) {
                        return;
                    }
                    let keep = partial_marker(&self.pending, &ENDS);
                    let ready: String = self.pending.drain(..self.pending.len() - keep).collect();
                    self.close(body, &ready, out);
                    return;
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<ChatDelta>) {
        let rest = std::mem::take(&mut self.pending);
        match self.body.take() {
            Some(body) => self.close(body, &rest, out),
            // Text that never reached a `<|message|>`: not harmony, so the answer itself.
            None if !rest.trim().is_empty() && !rest.contains(CHANNEL) => push_delta(out, ChatDelta::Content(rest)),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    fn make() -> Box<dyn ToolParser> {
        Box::new(Harmony::new(true))
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        let text =
            "<|channel|>analysis<|message|>Simple: 4.<|end|><|start|>assistant<|channel|>final<|message|>2+2 = 4.";
        assert_eq!(parse_every_way(&make, text), vec![reasoning("Simple: 4."), content("2+2 = 4.")]);
    }

    #[test]
    fn a_message_to_a_function_is_a_call() {
        let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
        assert_eq!(
            parse_every_way(&make, text),
            vec![reasoning("Need weather."), call("get_weather", "{\"city\":\"Paris\"}")]
        );
        // The recipient before the channel, as the template writes past calls; no <|call|>
        // (it is an end-of-sequence token).
        let text = " to=functions.search<|channel|>commentary json<|message|>{\"query\": \"日本\"}";
        assert_eq!(parse_every_way(&make, text), vec![call("search", "{\"query\":\"日本\"}")]);
    }

    #[test]
    fn without_tools_or_with_bad_json_a_call_is_content() {
        let text = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": }<|call|>";
        assert_eq!(parse_every_way(&make, text), vec![content("{\"a\": }")]);
        let good = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}";
        assert_eq!(parse_every_way(&|| Box::new(Harmony::new(false)), good), vec![content("{\"a\": 1}")]);
    }

    #[test]
    fn a_preamble_is_content_and_plain_text_passes() {
        let text = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}";
        assert_eq!(parse_every_way(&make, text), vec![content("Checking."), call("f", "{}")]);
        assert_eq!(parse_every_way(&make, "no markup at all"), vec![content("no markup at all")]);
    }
}
