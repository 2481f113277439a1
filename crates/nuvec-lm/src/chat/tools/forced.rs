//! Forced tool calls (OpenAI's tool_choice "required" or a named function): the opening of a
//! call appended to the prompt, and the grammar of the rest, so that the answer is exactly one
//! call in the template's own markup, its arguments valid under the tool's JSON schema.

use serde_json::Value;

use super::ToolFormat;
use crate::constrain::{one_line, Constraint};
use crate::{Error, Result};

/// A tool a forced call may name: its function's name and the JSON schema of its arguments
/// (OpenAI's `function.parameters`; none: any object).
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedTool {
    /// The function's name.
    pub name: String,
    /// The JSON schema of its arguments.
    pub parameters: Option<Value>,
}

impl ToolFormat {
    /// The start of a call this format's model is made to continue, for tool_choice
    /// "required" (`name` None) or a named function: appended to the prompt, so the answer
    /// begins inside a call (and fed to the parser first, so the call parses whole).
    pub fn forced_prefix(self, name: Option<&str>) -> String {
        match (self, name) {
            (ToolFormat::Hermes, None) => "<tool_call>\n{\"name\": \"".into(),
            (ToolFormat::Hermes, Some(n)) => format!("<tool_call>\n{{\"name\": {}, \"arguments\": ", quoted(n)),
            (ToolFormat::Llama3, None) => "{\"name\": \"".into(),
            (ToolFormat::Llama3, Some(n)) => format!("{{\"name\": {}, \"parameters\": ", quoted(n)),
            (ToolFormat::Mistral, None) => "[TOOL_CALLS][{\"name\": \"".into(),
            (ToolFormat::Mistral, Some(n)) => format!("[TOOL_CALLS][{{\"name\": {}, \"arguments\": ", quoted(n)),
            (ToolFormat::Harmony, None) => "<|channel|>commentary to=functions.".into(),
            (ToolFormat::Harmony, Some(n)) => {
                format!("<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>")
            }
        }
    }

    /// What must follow [`forced_prefix`](Self::forced_prefix)`(name)`: the name of one of
    /// `tools` (with `name` None), then its arguments as one-line JSON valid under its schema,
    /// then the call's close in this format; the answer ends there (harmony's `<|call|>`, like
    /// Llama's end of turn, is the model's end-of-sequence token, which the grammar allows once
    /// the arguments are whole). A grammar for llguidance ([`Constraint::Lark`]); a schema it
    /// cannot take is refused when the grammar is compiled.
    pub fn forced_call(self, tools: &[ForcedTool], name: Option<&str>) -> Result<Constraint> {
        let chosen: Vec<&ForcedTool> = tools.iter().filter(|t| name.is_none_or(|n| t.name == n)).collect();
        if chosen.is_empty() {
            return Err(Error::Invalid(match name {
                Some(n) => format!("a forced call of {n:?}: no tool has that name"),
                None => "a forced call needs at least one tool".into(),
            }));
        }
        let mut alternatives = Vec::with_capacity(chosen.len());
        let mut rules = Vec::with_capacity(chosen.len());
        for (i, tool) in chosen.iter().enumerate() {
            let schema = match &tool.parameters {
                None => serde_json::json!({"type": "object"}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(other) => {
                    return Err(Error::Invalid(format!(
                        "the parameters of tool {:?} are {other}, not a JSON schema object",
                        tool.name
                    )))
                }
            };
            rules.push(format!("args_{i}: %json {}", one_line(schema)));
            let head = if name.is_some() { String::new() } else { self.name_then_arguments(&tool.name) };
            alternatives.push(format!("{head} args_{i} {}", self.close()).trim().to_string());
        }
        Ok(Constraint::Lark(format!("start: {}\n{}\n", alternatives.join(" | "), rules.join("\n"))))
    }

    /// In Lark, the function's name and what comes between it and the arguments, after the
    /// "required" prefix.
    fn name_then_arguments(self, name: &str) -> String {
        let inner = quoted(name);
        let inner = &inner[1..inner.len() - 1];
        match self {
            ToolFormat::Hermes | ToolFormat::Mistral => literal(&format!("{inner}\", \"arguments\": ")),
            ToolFormat::Llama3 => literal(&format!("{inner}\", \"parameters\": ")),
            // Special tokens as llguidance writes them.
            ToolFormat::Harmony => {
                format!("{} <|constrain|> {} <|message|>", literal(&format!("{name} ")), literal("json"))
            }
        }
    }

    /// In Lark, what closes a call after its arguments.
    fn close(self) -> String {
        match self {
            ToolFormat::Hermes => literal("}\n</tool_call>"),
            ToolFormat::Llama3 => literal("}"),
            ToolFormat::Mistral => literal("}]"),
            ToolFormat::Harmony => String::new(),
        }
    }
}

/// `s` as a JSON string, quotes included.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

/// `s` as a Lark string literal (they take JSON's escapes).
fn literal(s: &str) -> String {
    quoted(s)
}
