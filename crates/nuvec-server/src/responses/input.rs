//! A Responses body as a chat completions body. `instructions` becomes a system message
//! first; `input` a string (one user message) or a list of items: messages (role user, system,
//! developer or assistant; content a string or `input_text`/`output_text` parts), `reasoning`
//! items (the next assistant message's `reasoning_content`), `function_call` items (the
//! assistant's `tool_calls`, joined to the assistant message before them) and
//! `function_call_output` items (role "tool" messages). Tools come in Responses' flat shape
//! `{"type": "function", "name", "description", "parameters"}` and go out in the chat shape.
//! The item structure is checked here, naming `input[i]…`; the sampler fields, copied under
//! their chat names, are checked by the chat parser, whose errors are renamed back.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::params::{text_parts, wrong_type, Fields};
use crate::tools::chat_function_tool;

/// The content parts the Responses API sends text in (`text` as chat completions does).
const TEXT_PARTS: (&[&str], &str) = (&["input_text", "output_text", "text"], "input_text and output_text");

/// What a response repeats of its request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Echo {
    pub instructions: Value,
    pub tools: Value,
    pub tool_choice: Value,
    pub parallel_tool_calls: Value,
    pub max_output_tokens: Value,
    pub reasoning: Value,
    pub metadata: Value,
    /// The output's format as asked (`{"format": {"type": "text"}}` when not).
    pub text: Value,
}

/// A Responses request, translated.
pub(crate) struct Request {
    /// The chat completions body.
    pub chat: Map<String, Value>,
    pub echo: Echo,
}

/// Fields that mean the same in both APIs (the sampler's extras as vLLM takes them on every
/// endpoint), copied as they are.
const SAME: [&str; 10] = [
    "model",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
];

pub(crate) fn translate(body: &Map<String, Value>) -> Result<Request, ApiError> {
    let f = Fields::new(body);
    refuse_unsupported(&f)?;
    let mut chat = Map::new();
    for key in SAME {
        if let Some(v) = f.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(v) = f.get("max_output_tokens") {
        chat.insert("max_tokens".into(), v.clone());
    }
    let mut args = f.object("chat_template_kwargs")?.cloned().unwrap_or_default();
    if let Some(reasoning) = f.object("reasoning")? {
        // gpt-oss' template reads the effort; "none" also turns Qwen3's thinking off.
        match Fields::with_prefix(reasoning, "reasoning.").string("effort")? {
            Some("none") => {
                args.insert("enable_thinking".into(), false.into());
            }
            Some(effort) => {
                args.insert("reasoning_effort".into(), effort.into());
            }
            None => {}
        }
    }
    if !args.is_empty() {
        chat.insert("chat_template_kwargs".into(), Value::Object(args));
    }
    let tools = tools(&f)?;
    if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = tool_choice(&f)? {
        chat.insert("tool_choice".into(), choice);
    }
    if let Some(format) = response_format(&f)? {
        chat.insert("response_format".into(), format);
    }
    chat.insert("messages".into(), Value::Array(messages(&f)?));
    let echo = Echo {
        instructions: f.get("instructions").cloned().unwrap_or(Value::Null),
        tools: f.get("tools").cloned().unwrap_or(json!([])),
        tool_choice: f.get("tool_choice").cloned().unwrap_or("auto".into()),
        parallel_tool_calls: f.get("parallel_tool_calls").cloned().unwrap_or(true.into()),
        max_output_tokens: f.get("max_output_tokens").cloned().unwrap_or(Value::Null),
        reasoning: f.get("reasoning").cloned().unwrap_or(Value::Null),
        metadata: f.get("metadata").cloned().unwrap_or(json!({})),
        text: f.get("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
    };
    Ok(Request { chat, echo })
}

/// `text.format` as chat completions' `response_format`: the Responses API gives a JSON
/// schema's name, schema and strict flag beside its type (chat nests them in `json_schema`).
fn response_format(f: &Fields) -> Result<Option<Value>, ApiError> {
    let Some(text) = f.object("text")? else { return Ok(None) };
    let Some(format) = Fields::with_prefix(text, "text.").object("format")? else { return Ok(None) };
    Ok(match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let mut spec = format.clone();
            spec.remove("type");
            Some(json!({"type": "json_schema", "json_schema": spec}))
        }
        _ => Some(Value::Object(format.clone())),
    })
}

/// Fields asking for what this server does not do: refused, saying what to do instead.
fn refuse_unsupported(f: &Fields) -> Result<(), ApiError> {
    for key in ["previous_response_id", "conversation"] {
        if f.get(key).is_some() {
            return Err(ApiError::unsupported(
                key,
                format!("{key}: this server keeps no state between requests; send the whole conversation as input"),
            ));
        }
    }
    if f.boolean("background")? == Some(true) {
        return Err(ApiError::unsupported(
            "background",
            "background = true is not supported: send the request and wait",
        ));
    }
    if f.count("top_logprobs")?.is_some_and(|n| n > 0) {
        return Err(ApiError::unsupported(
            "top_logprobs",
            "log-probabilities are not given on /v1/responses: use /v1/chat/completions with logprobs",
        ));
    }
    if f.string("truncation")? == Some("auto") {
        return Err(ApiError::unsupported(
            "truncation",
            "truncation \"auto\" is not supported: this server never drops input; send \"disabled\" or shorten the input",
        ));
    }
    Ok(())
}

/// Responses' flat function tools in the chat shape (a tool already in the chat shape is taken
/// as it is).
fn tools(f: &Fields) -> Result<Vec<Value>, ApiError> {
    let list = match f.get("tools") {
        None => return Ok(vec![]),
        Some(Value::Array(list)) => list,
        Some(v) => return Err(wrong_type("tools", "an array of {type: \"function\", name, parameters} objects", v)),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let map = tool.as_object().ok_or_else(|| wrong_type(&at, "an object", tool))?;
        let tf = Fields::with_prefix(map, &format!("{at}."));
        match tf.string("type")? {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::unsupported(
                    &format!("{at}.type"),
                    format!(
                        "{at}.type {other:?}: only \"function\" tools are supported (this server runs no hosted tools)"
                    ),
                ))
            }
            None => {
                return Err(ApiError::invalid(&format!("{at}.type"), format!("{at}.type is required: \"function\"")))
            }
        }
        if tf.get("function").is_some() {
            out.push(tool.clone());
            continue;
        }
        out.push(chat_function_tool(&tf, &at, "parameters")?);
    }
    Ok(out)
}

/// `tool_choice`: the strings as they are; `{"type": "function", "name"}` in the chat shape.
fn tool_choice(f: &Fields) -> Result<Option<Value>, ApiError> {
    match f.get("tool_choice") {
        None => Ok(None),
        Some(v @ Value::String(_)) => Ok(Some(v.clone())),
        Some(Value::Object(map)) => {
            let cf = Fields::with_prefix(map, "tool_choice.");
            match (cf.string("type")?, cf.string("name")?) {
                (Some("function"), Some(name)) => Ok(Some(json!({"type": "function", "function": {"name": name}}))),
                _ => Err(ApiError::unsupported(
                    "tool_choice",
                    "tool_choice as an object is {\"type\": \"function\", \"name\": ...}; hosted and allowed-tools \
                     choices are not supported",
                )),
            }
        }
        Some(v) => Err(wrong_type("tool_choice", "a string or an object", v)),
    }
}

/// `instructions` and `input` as chat messages.
fn messages(f: &Fields) -> Result<Vec<Value>, ApiError> {
    let mut out = vec![];
    if let Some(instructions) = f.string("instructions")? {
        out.push(json!({"role": "system", "content": instructions}));
    }
    match f.get("input") {
        None => {
            return Err(ApiError::invalid(
                "input",
                "input is required: a string, or a list of items (messages, function_call, function_call_output)",
            ))
        }
        Some(Value::String(s)) => out.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid("input", "input is empty: give at least one item"))
        }
        Some(Value::Array(items)) => Conversation::default().read(items, &mut out)?,
        Some(v) => return Err(wrong_type("input", "a string or an array of input items", v)),
    }
    Ok(out)
}

/// Reads input items into chat messages.
#[derive(Default)]
struct Conversation {
    /// Whether the last message is an assistant's that a following function_call joins.
    assistant_open: bool,
    /// A reasoning item's text, for the next assistant message.
    reasoning: Option<String>,
    /// Each call's function name by call_id, for the tool message answering it.
    names: HashMap<String, String>,
}

impl Conversation {
    fn read(mut self, items: &[Value], out: &mut Vec<Value>) -> Result<(), ApiError> {
        for (i, item) in items.iter().enumerate() {
            let at = format!("input[{i}]");
            let map = item.as_object().ok_or_else(|| wrong_type(&at, "an object", item))?;
            let itf = Fields::with_prefix(map, &format!("{at}."));
            let kind = match itf.string("type")? {
                Some(kind) => kind,
                None if map.contains_key("role") => "message",
                None => return Err(ApiError::invalid(&format!("{at}.type"), format!("{at}.type is required"))),
            };
            match kind {
                "message" => self.message(&at, &itf, out)?,
                "function_call" => self.call(&at, &itf, out)?,
                "function_call_output" => self.result(&at, &itf, out)?,
                "reasoning" => self.reasoning(&at, &itf)?,
                "item_reference" => {
                    return Err(ApiError::unsupported(
                        &format!("{at}.type"),
                        format!(
                            "{at}: this server keeps no state, so it has no items to refer to; send the item itself"
                        ),
                    ))
                }
                other => {
                    return Err(ApiError::unsupported(
                        &format!("{at}.type"),
                        format!(
                            "{at}.type {other:?}: only message, function_call, function_call_output and reasoning \
                             items are supported"
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    fn message(&mut self, at: &str, f: &Fields, out: &mut Vec<Value>) -> Result<(), ApiError> {
        let role = f
            .string("role")?
            .ok_or_else(|| ApiError::invalid(&format!("{at}.role"), format!("{at}.role is required")))?;
        if !matches!(role, "user" | "system" | "developer" | "assistant") {
            return Err(ApiError::invalid(
                &format!("{at}.role"),
                format!("{at}.role {role:?} is not one of user, system, developer, assistant"),
            ));
        }
        let content = match f.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => text_parts(&format!("{at}.content"), parts, TEXT_PARTS)?,
            None => return Err(ApiError::invalid(&format!("{at}.content"), format!("{at}.content is required"))),
            Some(v) => return Err(wrong_type(&format!("{at}.content"), "a string or an array of content parts", v)),
        };
        let mut message = json!({"role": role, "content": content});
        if role == "assistant" {
            if let Some(r) = self.reasoning.take() {
                message["reasoning_content"] = r.into();
            }
        }
        self.assistant_open = role == "assistant";
        out.push(message);
        Ok(())
    }

    fn call(&mut self, at: &str, f: &Fields, out: &mut Vec<Value>) -> Result<(), ApiError> {
        let required = |key: &str| {
            let here = format!("{at}.{key}");
            f.string(key)?.ok_or_else(|| ApiError::invalid(&here, format!("{here} is required")))
        };
        let (call_id, name, arguments) = (required("call_id")?, required("name")?, required("arguments")?);
        if let Err(e) = serde_json::from_str::<Value>(arguments) {
            return Err(ApiError::invalid(
                &format!("{at}.arguments"),
                format!(
                    "{at}.arguments is not JSON ({e}): send the arguments the model gave, a JSON object as a string"
                ),
            ));
        }
        self.names.insert(call_id.into(), name.into());
        let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
        match out.last_mut() {
            Some(Value::Object(last)) if self.assistant_open => match last.get_mut("tool_calls") {
                Some(Value::Array(calls)) => calls.push(call),
                _ => {
                    last.insert("tool_calls".into(), json!([call]));
                }
            },
            _ => {
                let mut message = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                if let Some(r) = self.reasoning.take() {
                    message["reasoning_content"] = r.into();
                }
                out.push(message);
                self.assistant_open = true;
            }
        }
        Ok(())
    }

    fn result(&mut self, at: &str, f: &Fields, out: &mut Vec<Value>) -> Result<(), ApiError> {
        let call_id = f.string("call_id")?.ok_or_else(|| {
            ApiError::invalid(
                &format!("{at}.call_id"),
                format!("{at}.call_id is required: the call_id of the function_call this answers"),
            )
        })?;
        let output = match f.get("output") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => text_parts(&format!("{at}.output"), parts, TEXT_PARTS)?,
            None => return Err(ApiError::invalid(&format!("{at}.output"), format!("{at}.output is required"))),
            Some(v) => return Err(wrong_type(&format!("{at}.output"), "a string or an array of input_text parts", v)),
        };
        let mut message = json!({"role": "tool", "tool_call_id": call_id, "content": output});
        if let Some(name) = self.names.get(call_id) {
            message["name"] = name.clone().into();
        }
        self.assistant_open = false;
        out.push(message);
        Ok(())
    }

    /// A reasoning item's text (its `reasoning_text` content, else its summary); an item with
    /// only encrypted content has none this server can read, and is skipped.
    fn reasoning(&mut self, at: &str, f: &Fields) -> Result<(), ApiError> {
        let mut text = String::new();
        for key in ["content", "summary"] {
            if let Some(list) = f.get(key) {
                let parts = list.as_array().ok_or_else(|| wrong_type(&format!("{at}.{key}"), "an array", list))?;
                for (j, part) in parts.iter().enumerate() {
                    let here = format!("{at}.{key}[{j}].text");
                    let piece = part.get("text").and_then(Value::as_str);
                    text.push_str(piece.ok_or_else(|| ApiError::invalid(&here, format!("{here} is required")))?);
                }
            }
            if !text.is_empty() {
                break;
            }
        }
        if !text.is_empty() {
            // A new turn of reasoning starts a new assistant message.
            self.assistant_open = false;
            self.reasoning = Some(text);
        }
        Ok(())
    }
}
