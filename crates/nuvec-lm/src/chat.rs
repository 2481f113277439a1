//! Chat templates rendered as transformers renders them (jinja2 with trim_blocks and
//! lstrip_blocks, Python string methods, `raise_exception`, `strftime_now`), and the answers
//! read back: [`tools`] parses tool calls per family, [`reasoning`] splits off `<think>`
//! blocks, and [`ChatOutput`] does both for one answer as it streams.

use std::sync::Arc;

use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

use crate::{Error, Result};

mod limits;
mod output;
pub mod reasoning;
pub mod tools;

pub use limits::{FUEL, MAX_BYTES};
pub use output::ChatOutput;
pub use reasoning::ThinkSplitter;
pub use tools::{ChatDelta, ToolCall, ToolFormat, ToolParser};

/// One chat message.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Message {
    /// "system", "user", "assistant" or "tool".
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message of `role` with `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Message { role: role.to_string(), content: content.to_string() }
    }
}

/// A compiled chat template, rendered within [`FUEL`] instructions and [`MAX_BYTES`] of text.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    source: Arc<str>,
    origin: Arc<str>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

fn raise_exception(message: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, so tool schemas render byte for byte as they do there
/// (`", "` and `": "` between items, keys in their given order).
fn py_tojson(value: Value, kwargs: Kwargs) -> std::result::Result<String, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    limits::check_size(&value, "tojson")?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: separators takes two strings"))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = PyJson {
        indent,
        item,
        key,
        ascii: ensure_ascii.unwrap_or(false),
        sort: sort_keys.unwrap_or(false),
        overflow: Default::default(),
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    if style.overflow.get() || out.len() > MAX_BYTES {
        return Err(limits::too_large("tojson"));
    }
    Ok(out)
}

/// Python's json.dumps layout.
struct PyJson {
    indent: Option<usize>,
    item: String,
    key: String,
    ascii: bool,
    sort: bool,
    /// Set when the output would pass [`MAX_BYTES`].
    overflow: std::cell::Cell<bool>,
}

impl PyJson {
    fn string(&self, s: &str, out: &mut String) {
        let escaped = serde_json::to_string(s).expect("strings serialize");
        if !self.ascii {
            out.push_str(&escaped);
            return;
        }
        for c in escaped.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }

    fn newline(&self, level: usize, out: &mut String) {
        if let Some(n) = self.indent {
            if out.len().saturating_add(n.saturating_mul(level)) > MAX_BYTES {
                // A huge indent stops here; the caller refuses the result as too large.
                self.overflow.set(true);
                return;
            }
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    }

    fn write(&self, v: &serde_json::Value, level: usize, out: &mut String) {
        use serde_json::Value as J;
        if out.len() > MAX_BYTES {
            self.overflow.set(true);
            return;
        }
        match v {
            J::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(level + 1, out);
                    self.write(x, level + 1, out);
                }
                self.newline(level, out);
                out.push(']');
            }
            J::Object(map) if !map.is_empty() => {
                let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
                if self.sort {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(level + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key);
                    self.write(x, level + 1, out);
                }
                self.newline(level, out);
                out.push('}');
            }
            J::String(s) => self.string(s, out),
            other => out.push_str(&other.to_string()),
        }
    }
}

fn strftime_now(format: String) -> String {
    // Templates use it for "today's date" in system prompts; UTC, like a server without a TZ.
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = (secs / 86_400) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    format
        .replace("%Y", &year.to_string())
        .replace("%m", &format!("{month:02}"))
        .replace("%d", &format!("{day:02}"))
        .replace("%B", MONTHS[(month - 1) as usize])
        .replace("%b", &MONTHS[(month - 1) as usize][..3])
}

impl ChatTemplate {
    /// Compiles `source`; a template that does not parse is an error. `origin` names where it
    /// came from in errors (`.../tokenizer_config.json`, `.../chat_template.jinja`, or a GGUF
    /// file's `tokenizer.chat_template`).
    pub fn new(source: String, origin: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", py_tojson);
        limits::install(&mut env);
        let text: Arc<str> = source.as_str().into();
        let origin: Arc<str> = origin.into();
        let error = |message: String| Error::Template { origin: origin.to_string(), message };
        env.add_template_owned("chat", source).map_err(|e| error(format!("does not parse: {e:#}")))?;
        Ok(ChatTemplate { env: Arc::new(env), source: text, origin })
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Where the template came from (the file, or the GGUF metadata key).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    fn error(&self, message: String) -> Error {
        Error::Template { origin: self.origin.to_string(), message }
    }

    /// Runs the template on `ctx` within its limits (see [`limits`]).
    fn run(&self, ctx: Value) -> std::result::Result<String, minijinja::Error> {
        use minijinja::machinery::{get_compiled_template, make_string_output, Vm};
        let template = self.env.get_template("chat")?;
        let compiled = get_compiled_template(&template);
        let patched = limits::patch(&compiled.instructions);
        let mut rendered = String::new();
        limits::start_render();
        let mut out = make_string_output(&mut rendered);
        Vm::new(&self.env).eval(&patched, ctx, &compiled.blocks, &mut out, compiled.initial_auto_escape)?;
        Ok(rendered)
    }

    /// Renders `messages`; `extra` holds the template kwargs (`enable_thinking`, `tools`, ...)
    /// and the tokenizer's `bos_token`/`eos_token`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        self.render_values(
            &serde_json::to_value(messages).expect("messages serialize"),
            add_generation_prompt,
            false,
            extra,
        )
    }

    /// Renders arbitrary JSON messages (tool calls, lists of content parts).
    /// `continue_final_message` leaves the last message open, as transformers does.
    pub fn render_values(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        continue_final_message: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx = extra.clone();
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        let rendered = self.run(Value::from_serialize(&ctx)).map_err(|e| match e.kind() {
            ErrorKind::OutOfFuel => self.error(format!(
                "ran past {FUEL} instructions, the most a chat template may run (an endless or hostile loop?)"
            )),
            _ => self.error(format!("failed to render: {e:#}")),
        })?;
        if !continue_final_message {
            return Ok(rendered);
        }
        // Cut after the final message's content, as transformers' continue_final_message does.
        let last = messages
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m.get("content"))
            .and_then(|c| c.as_str())
            .unwrap_or("");
        let content = last.trim();
        match rendered.rfind(content) {
            Some(i) if !content.is_empty() => Ok(rendered[..i + content.len()].to_string()),
            _ => {
                Err(self
                    .error("continue_final_message: the final message's content is not in the rendered prompt".into()))
            }
        }
    }
}
