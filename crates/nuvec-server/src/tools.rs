//! The tool-calling fields of a chat request: `tools`, `tool_choice`, and the messages that
//! carry calls (an assistant's `tool_calls`) and their results (`role: "tool"`), turned into
//! what chat templates read, as vLLM turns them before transformers' apply_chat_template: a
//! call's `function.arguments`, a JSON string in OpenAI's API, becomes the object it holds,
//! since the templates write it with `tojson`.

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::params::{wrong_type, Fields};

/// Which calls the request allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// The model decides ("auto", the default with tools).
    Auto,
    /// No calls: the tools are not shown to the model and its answer is not parsed for calls.
    None,
    /// A call of some tool ("required").
    Required,
    /// A call of this function.
    Named(String),
}

/// The request's tools as given, and its choice.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolRequest {
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
}

impl ToolRequest {
    /// Whether the answer is read for calls.
    pub fn parses_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }
}

/// `tools` and `tool_choice`; None when the request offers no tools.
pub(crate) fn parse(f: &Fields) -> Result<Option<ToolRequest>, ApiError> {
    for key in ["functions", "function_call"] {
        if f.get(key).is_some() {
            return Err(ApiError::unsupported(
                key,
                format!("{key} is OpenAI's deprecated form of tool calling: send tools and tool_choice instead"),
            ));
        }
    }
    let tools = match f.get("tools") {
        None => vec![],
        Some(Value::Array(items)) => items.clone(),
        Some(v) => return Err(wrong_type("tools", "an array of {type: \"function\", function} objects", v)),
    };
    let mut names = vec![];
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let map = tool.as_object().ok_or_else(|| wrong_type(&at, "an object", tool))?;
        let tf = Fields::with_prefix(map, &format!("{at}."));
        match tf.string("type")? {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::unsupported(
                    &format!("{at}.type"),
                    format!("{at}.type {other:?}: only \"function\" tools are supported"),
                ))
            }
            None => {
                return Err(ApiError::invalid(&format!("{at}.type"), format!("{at}.type is required: \"function\"")))
            }
        }
        let function = tf
            .object("function")?
            .ok_or_else(|| ApiError::invalid(&format!("{at}.function"), format!("{at}.function is required")))?;
        let ff = Fields::with_prefix(function, &format!("{at}.function."));
        let name = ff.string("name")?.filter(|n| !n.is_empty()).ok_or_else(|| {
            ApiError::invalid(&format!("{at}.function.name"), format!("{at}.function.name is required"))
        })?;
        ff.string("description")?;
        ff.object("parameters")?;
        names.push(name.to_string());
    }
    let choice = match f.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice {other:?} is not one of \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                ))
            }
        },
        Some(Value::Object(map)) => {
            let cf = Fields::with_prefix(map, "tool_choice.");
            let name = cf.object("function")?.and_then(|fun| fun.get("name")).and_then(Value::as_str);
            match (cf.string("type")?, name) {
                (Some("function"), Some(name)) => ToolChoice::Named(name.to_string()),
                _ => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        "tool_choice as an object is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            }
        }
        Some(v) => return Err(wrong_type("tool_choice", "a string or an object", v)),
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::Auto | ToolChoice::None => Ok(None),
            _ => {
                Err(ApiError::invalid("tool_choice", "tool_choice asks for a tool call, but the request has no tools"))
            }
        };
    }
    if let ToolChoice::Named(name) = &choice {
        if !names.contains(name) {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice names {name:?}, which is not among the tools ({})", names.join(", ")),
            ));
        }
    }
    Ok(Some(ToolRequest { tools, choice }))
}

/// An assistant message's `tool_calls`, with each call's arguments as the object they hold.
pub(crate) fn message_calls(at: &str, calls: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(calls.len());
    for (j, c) in calls.iter().enumerate() {
        let here = format!("{at}.tool_calls[{j}]");
        let map = c.as_object().ok_or_else(|| wrong_type(&here, "an object", c))?;
        let cf = Fields::with_prefix(map, &format!("{here}."));
        let function = cf
            .object("function")?
            .ok_or_else(|| ApiError::invalid(&format!("{here}.function"), format!("{here}.function is required")))?;
        let ff = Fields::with_prefix(function, &format!("{here}.function."));
        let name = ff.string("name")?.ok_or_else(|| {
            ApiError::invalid(&format!("{here}.function.name"), format!("{here}.function.name is required"))
        })?;
        let arguments = match ff.get("arguments") {
            None => json!({}),
            Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                ApiError::invalid(
                    &format!("{here}.function.arguments"),
                    format!("{here}.function.arguments is not JSON ({e}): send the arguments the model gave, a JSON object as a string"),
                )
            })?,
            // Some clients send the object itself.
            Some(v @ Value::Object(_)) => v.clone(),
            Some(v) => return Err(wrong_type(&format!("{here}.function.arguments"), "a JSON string", v)),
        };
        let mut call = Map::new();
        if let Some(id) = cf.string("id")? {
            call.insert("id".into(), id.into());
        }
        call.insert("type".into(), "function".into());
        call.insert("function".into(), json!({"name": name, "arguments": arguments}));
        out.push(Value::Object(call));
    }
    Ok(out)
}

/// A function tool of another protocol (`tf`, at `at` in its body) in the chat shape
/// `{"type": "function", "function": {name, description, parameters}}`, its JSON schema read from
/// `schema` (`parameters` in the Responses API, `input_schema` in Anthropic's).
pub(crate) fn chat_function_tool(tf: &Fields, at: &str, schema: &str) -> Result<Value, ApiError> {
    let name = tf
        .string("name")?
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::invalid(&format!("{at}.name"), format!("{at}.name is required")))?;
    let mut function = Map::new();
    function.insert("name".into(), name.into());
    if let Some(d) = tf.string("description")? {
        function.insert("description".into(), d.into());
    }
    if let Some(p) = tf.object(schema)? {
        function.insert("parameters".into(), Value::Object(p.clone()));
    }
    Ok(json!({"type": "function", "function": function}))
}
