//! Mistral tool calls: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` (v3
//! tokenizers: Mistral 7B v0.3, Nemo), or `name[ARGS]{...}` with the token repeated before
//! each call (v11 and later: Mistral Small 3.2, Devstral), maybe with `[CALL_ID]id` before
//! `[ARGS]`. The calls run to the end of the answer, so they are held until it ends.

use serde_json::Value;

use super::{arguments_text, call_of, partial_marker, ChatDelta, Spacing, ToolCall, ToolParser};

const TAG: &str = "[TOOL_CALLS]";

#[derive(Debug, Default)]
pub(crate) struct Mistral {
    pending: String,
    in_calls: bool,
    spacing: Spacing,
}

/// The calls after `[TOOL_CALLS]` (its later repeats included); None when anything does not
/// parse.
fn calls(text: &str) -> Option<Vec<ToolCall>> {
    let mut found = vec![];
    for part in text.split(TAG).map(str::trim).filter(|p| !p.is_empty()) {
        if part.starts_with('[') || part.starts_with('{') {
            match serde_json::from_str::<Value>(part).ok()? {
                Value::Array(items) => {
                    for item in &items {
                        found.push(call_of(item, &["arguments", "parameters"])?);
                    }
                }
                item => found.push(call_of(&item, &["arguments", "parameters"])?),
            }
        } else {
            let (head, args) = part.split_once("[ARGS]")?;
            let name = head.split_once("[CALL_ID]").map_or(head, |(n, _)| n).trim();
            let valid = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || "_-.".contains(c));
            let arguments = arguments_text(&serde_json::from_str(args.trim()).ok()?)?;
            valid.then_some(())?;
            found.push(ToolCall { name: name.to_string(), arguments });
        }
    }
    (!found.is_empty()).then_some(found)
}

impl ToolParser for Mistral {
    fn push(&mut self, text: &str, out: &mut Vec<ChatDelta>) {
        self.pending.push_str(text);
        if self.in_calls {
            return;
        }
        if let Some(at) = self.pending.find(TAG) {
            let before = self.pending[..at].to_string();
            self.spacing.content(&before, out);
            self.pending.drain(..at + TAG.len());
            self.in_calls = true;
            return;
        }
        let keep = partial_marker(&self.pending, &[TAG]);
        let ready: String = self.pending.drain(..self.pending.len() - keep).collect();
        self.spacing.content(&ready, out);
    }

    fn finish(&mut self, out: &mut Vec<ChatDelta>) {
        let rest = std::mem::take(&mut self.pending);
        if !self.in_calls {
            self.spacing.content(&rest, out);
        } else {
            match calls(&rest) {
                Some(found) => found.into_iter().for_each(|c| self.spacing.call(c, out)),
                None => self.spacing.content(&format!("{TAG}{rest}"), out),
            }
        }
        self.spacing.finish(out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    fn make() -> Box<dyn ToolParser> {
        Box::new(Mistral::default())
    }

    #[test]
    fn a_list_of_calls() {
        let text = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"search\", \"arguments\": {\"query\": \"ç\"}}]";
        assert_eq!(
            parse_every_way(&make, text),
            vec![call("get_weather", "{\"city\":\"Paris\"}"), call("search", "{\"query\":\"ç\"}")]
        );
    }

    #[test]
    fn the_newer_name_args_form() {
        let text = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{\"query\": \"x\"}";
        assert_eq!(
            parse_every_way(&make, text),
            vec![content("Sure."), call("get_weather", "{\"city\":\"Paris\"}"), call("search", "{\"query\":\"x\"}")]
        );
    }

    #[test]
    fn malformed_calls_and_plain_text_are_content() {
        for text in [
            "No tools needed [TOOL",
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {]",
            "[TOOL_CALLS]f[ARGS]not json",
            "[TOOL_CALLS]",
        ] {
            assert_eq!(parse_every_way(&make, text), vec![content(text)], "{text:?}");
        }
    }
}
