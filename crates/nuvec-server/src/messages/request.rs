//! A Messages body as a chat completions body. `system` (a string or text blocks) becomes a
//! system message first; each message's content is a string or blocks: `text`; in an
//! assistant turn `thinking` (its `reasoning_content`) and `tool_use` (its `tool_calls`, the
//! input object as the arguments' JSON); in a user turn `tool_result` (a role "tool" message,
//! before the turn's text). Tools `{"name", "description", "input_schema"}` go out in the chat
//! shape; `tool_choice` auto/any/tool/none as auto/required/the named function/none;
//! `thinking` enabled or disabled as the template's `enable_thinking`. The structure is checked
//! here, naming Anthropic's fields; the sampler's fields by the chat parser.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::params::{wrong_type, Fields};
use crate::tools::chat_function_tool;

/// A Messages request, translated.
pub(crate) struct Request {
    /// The chat completions body.
    pub chat: Map<String, Value>,
    /// `stop_sequences` as given (the answer names the one that matched).
    pub stop_sequences: Vec<String>,
}

/// Fields that mean the same in both APIs, copied as they are.
const SAME: [&str; 6] = ["model", "stream", "max_tokens", "temperature", "top_p", "top_k"];

/// Translates `body`; `generating` (every route but count_tokens) requires `max_tokens`, as
/// Anthropic does.
pub(crate) fn translate(body: &Map<String, Value>, generating: bool) -> Result<Request, ApiError> {
    let f = Fields::new(body);
    if generating && f.get("max_tokens").is_none() {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens is required on /v1/messages (the Messages API has no default): the most tokens to \
             generate, e.g. \"max_tokens\": 1024",
        ));
    }
    if let Some(config) = f.object("output_config")? {
        if Fields::with_prefix(config, "output_config.").get("format").is_some() {
            return Err(ApiError::unsupported(
                "output_config.format",
                "output_config.format: structured outputs are not supported by this server yet; leave it out",
            ));
        }
    }
    let mut chat = Map::new();
    for key in SAME {
        if let Some(v) = f.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    let stop_sequences = match f.get("stop_sequences") {
        None => vec![],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().map(str::to_string).ok_or_else(|| wrong_type(&format!("stop_sequences[{i}]"), "a string", v))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(wrong_type("stop_sequences", "an array of strings", v)),
    };
    if !stop_sequences.is_empty() {
        chat.insert("stop".into(), json!(stop_sequences));
    }
    if let Some(thinking) = f.object("thinking")? {
        let on = match Fields::with_prefix(thinking, "thinking.").string("type")? {
            Some("enabled" | "adaptive") => true,
            Some("disabled") => false,
            _ => {
                return Err(ApiError::invalid(
                    "thinking.type",
                    "thinking.type must be \"enabled\", \"adaptive\" or \"disabled\"",
                ))
            }
        };
        chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": on}));
    }
    let tools = tools(&f)?;
    if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = tool_choice(&f)? {
        chat.insert("tool_choice".into(), choice);
    }
    let mut messages = system(&f)?;
    Turns::default().read(&f, &mut messages)?;
    chat.insert("messages".into(), Value::Array(messages));
    Ok(Request { chat, stop_sequences })
}

/// `system` as the first message.
fn system(f: &Fields) -> Result<Vec<Value>, ApiError> {
    let text = match f.get("system") {
        None => return Ok(vec![]),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (i, block) in blocks.iter().enumerate() {
                let at = format!("system[{i}]");
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => text.push_str(required_text(&at, block, "text")?),
                    _ => return Err(ApiError::invalid(&format!("{at}.type"), format!("{at} must be a text block"))),
                }
            }
            text
        }
        Some(v) => return Err(wrong_type("system", "a string or an array of text blocks", v)),
    };
    Ok(vec![json!({"role": "system", "content": text})])
}

fn required_text<'a>(at: &str, block: &'a Value, key: &str) -> Result<&'a str, ApiError> {
    let here = format!("{at}.{key}");
    match block.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(ApiError::invalid(&here, format!("{here} is required"))),
        Some(v) => Err(wrong_type(&here, "a string", v)),
    }
}

/// Anthropic's tools in the chat shape; server tools (a `type` such as "web_search_…") are
/// refused, since this server runs none.
fn tools(f: &Fields) -> Result<Vec<Value>, ApiError> {
    let list = match f.get("tools") {
        None => return Ok(vec![]),
        Some(Value::Array(list)) => list,
        Some(v) => return Err(wrong_type("tools", "an array of {name, description, input_schema} objects", v)),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let map = tool.as_object().ok_or_else(|| wrong_type(&at, "an object", tool))?;
        let tf = Fields::with_prefix(map, &format!("{at}."));
        if let Some(kind) = tf.string("type")?.filter(|&k| k != "custom") {
            return Err(ApiError::unsupported(
                &format!("{at}.type"),
                format!("{at}.type {kind:?}: this server runs no server tools; give client tools (name, input_schema)"),
            ));
        }
        out.push(chat_function_tool(&tf, &at, "input_schema")?);
    }
    Ok(out)
}

fn tool_choice(f: &Fields) -> Result<Option<Value>, ApiError> {
    let Some(choice) = f.object("tool_choice")? else { return Ok(None) };
    let cf = Fields::with_prefix(choice, "tool_choice.");
    Ok(Some(match cf.string("type")? {
        Some("auto") => "auto".into(),
        Some("any") => "required".into(),
        Some("none") => "none".into(),
        Some("tool") => {
            let name = cf.string("name")?.ok_or_else(|| {
                ApiError::invalid("tool_choice.name", "tool_choice.name is required with type \"tool\"")
            })?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                "tool_choice.type must be \"auto\", \"any\", \"tool\" (with name) or \"none\"",
            ))
        }
    }))
}

/// Reads the turns into chat messages.
#[derive(Default)]
struct Turns {
    /// Each tool_use's name by its id, for the tool message answering it.
    names: HashMap<String, String>,
}

impl Turns {
    fn read(mut self, f: &Fields, out: &mut Vec<Value>) -> Result<(), ApiError> {
        let list = match f.get("messages") {
            None => {
                return Err(ApiError::invalid("messages", "messages is required: a list of {role, content} objects"))
            }
            Some(Value::Array(list)) if list.is_empty() => {
                return Err(ApiError::invalid("messages", "messages is empty: give at least one message"))
            }
            Some(Value::Array(list)) => list,
            Some(v) => return Err(wrong_type("messages", "an array", v)),
        };
        if list.last().and_then(|m| m.get("role")) == Some(&Value::from("assistant")) {
            return Err(ApiError::unsupported(
                &format!("messages[{}].role", list.len() - 1),
                format!(
                    "messages[{}].role is \"assistant\": continuing a prefilled answer is not supported; end with a \
                     user turn",
                    list.len() - 1
                ),
            ));
        }
        for (i, m) in list.iter().enumerate() {
            let at = format!("messages[{i}]");
            let map = m.as_object().ok_or_else(|| wrong_type(&at, "an object", m))?;
            let mf = Fields::with_prefix(map, &format!("{at}."));
            let role = mf.string("role")?;
            let blocks = match mf.get("content") {
                Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
                Some(Value::Array(blocks)) => blocks.clone(),
                None => return Err(ApiError::invalid(&format!("{at}.content"), format!("{at}.content is required"))),
                Some(v) => {
                    return Err(wrong_type(&format!("{at}.content"), "a string or an array of content blocks", v))
                }
            };
            match role {
                Some("user") => self.user(&at, &blocks, out)?,
                Some("assistant") => self.assistant(&at, &blocks, out)?,
                Some(other) => {
                    return Err(ApiError::invalid(
                        &format!("{at}.role"),
                        format!(
                            "{at}.role {other:?} is not \"user\" or \"assistant\" (the system prompt goes in system)"
                        ),
                    ))
                }
                None => return Err(ApiError::invalid(&format!("{at}.role"), format!("{at}.role is required"))),
            }
        }
        Ok(())
    }

    /// A block's type, checked to be an object with one.
    fn kind<'a>(at: &str, block: &'a Value) -> Result<&'a str, ApiError> {
        if !block.is_object() {
            return Err(wrong_type(at, "a content block object", block));
        }
        block
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(&format!("{at}.type"), format!("{at}.type is required")))
    }

    fn unsupported(at: &str, kind: &str, role: &str) -> ApiError {
        ApiError::unsupported(
            &format!("{at}.type"),
            format!("{at}.type {kind:?} in a {role} turn: this server reads text, tool_use (assistant), thinking (assistant) and tool_result (user) blocks"),
        )
    }

    /// A user turn: its tool results as tool messages, its text as a user message.
    fn user(&mut self, at: &str, blocks: &[Value], out: &mut Vec<Value>) -> Result<(), ApiError> {
        let mut text = String::new();
        let mut wrote = false;
        for (j, block) in blocks.iter().enumerate() {
            let here = format!("{at}.content[{j}]");
            match Self::kind(&here, block)? {
                "text" => text.push_str(required_text(&here, block, "text")?),
                "tool_result" => {
                    if !text.is_empty() {
                        out.push(json!({"role": "user", "content": std::mem::take(&mut text)}));
                    }
                    let id = required_text(&here, block, "tool_use_id")?;
                    let content = match block.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Array(parts)) => {
                            let mut joined = String::new();
                            for (k, part) in parts.iter().enumerate() {
                                let there = format!("{here}.content[{k}]");
                                match Self::kind(&there, part)? {
                                    "text" => joined.push_str(required_text(&there, part, "text")?),
                                    other => return Err(Self::unsupported(&there, other, "tool_result")),
                                }
                            }
                            joined
                        }
                        Some(v) => return Err(wrong_type(&format!("{here}.content"), "a string or text blocks", v)),
                    };
                    let mut message = json!({"role": "tool", "tool_call_id": id, "content": content});
                    if let Some(name) = self.names.get(id) {
                        message["name"] = name.clone().into();
                    }
                    out.push(message);
                    wrote = true;
                }
                other => return Err(Self::unsupported(&here, other, "user")),
            }
        }
        if !text.is_empty() || !wrote {
            out.push(json!({"role": "user", "content": text}));
        }
        Ok(())
    }

    /// An assistant turn: one message with its text, thinking and tool calls.
    fn assistant(&mut self, at: &str, blocks: &[Value], out: &mut Vec<Value>) -> Result<(), ApiError> {
        let (mut text, mut thinking, mut calls) = (String::new(), String::new(), vec![]);
        for (j, block) in blocks.iter().enumerate() {
            let here = format!("{at}.content[{j}]");
            match Self::kind(&here, block)? {
                "text" => text.push_str(required_text(&here, block, "text")?),
                "thinking" => thinking.push_str(required_text(&here, block, "thinking")?),
                // Its content is encrypted: nothing a template could show.
                "redacted_thinking" => {}
                "tool_use" => {
                    let id = required_text(&here, block, "id")?;
                    let name = required_text(&here, block, "name")?;
                    let input = match block.get("input") {
                        Some(v @ Value::Object(_)) => v.clone(),
                        None | Some(Value::Null) => json!({}),
                        Some(v) => return Err(wrong_type(&format!("{here}.input"), "an object", v)),
                    };
                    self.names.insert(id.into(), name.into());
                    calls.push(json!({"id": id, "type": "function",
                                      "function": {"name": name, "arguments": input.to_string()}}));
                }
                other => return Err(Self::unsupported(&here, other, "assistant")),
            }
        }
        let mut message = json!({"role": "assistant", "content": text});
        if !thinking.is_empty() {
            message["reasoning_content"] = thinking.into();
        }
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        out.push(message);
        Ok(())
    }
}
