//! Reading a request body: each field OpenAI defines is checked for its type and range, and a
//! wrong one is a 400 naming it; fields this server does not know are ignored, as OpenAI
//! ignores them; fields it knows but cannot honour (echo, best_of) are refused saying so. The
//! tool-calling fields are read in [`crate::tools`].

use nuvec_lm::generate::MAX_LOGPROBS as MAX_LOGPROBS_ALTERNATIVES;
use nuvec_lm::{GenerateOptions, LogitsProcessors, Stop, Tokenizer};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::structured::{self, Grammars};
use crate::tools::{self, ToolRequest};

/// Which endpoint a body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// POST /v1/chat/completions
    Chat,
    /// POST /v1/completions
    Completion,
}

/// The prompt as the request gave it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Prompt {
    /// Chat messages, each `{"role", "content"}` with text content (and a call's or a
    /// result's fields), for the chat template; with the template's extra arguments (`tools`
    /// among them when the model is shown the tools).
    Messages(Value, Map<String, Value>),
    /// Text to encode as it is (the tokenizer adds its BOS as it does).
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// The most choices (`n`) one request may ask for.
pub(crate) const MAX_CHOICES: usize = 16;

/// A checked request.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub kind: Kind,
    pub prompt: Prompt,
    /// The options of choice 0; [`Parsed::choice_options`] gives each choice's.
    pub options: GenerateOptions,
    /// How many choices to generate (OpenAI's `n`, 1 to [`MAX_CHOICES`]).
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// A chat request's tools, when it offers some.
    pub tools: Option<ToolRequest>,
}

/// What parsing needs to know about the server.
pub(crate) struct Context<'a> {
    pub model_id: &'a str,
    /// What the handlers know of the model (its served adapters among it).
    pub info: &'a crate::ModelInfo,
    pub defaults: &'a GenerateOptions,
    pub template_args: &'a Map<String, Value>,
    pub vocab_size: usize,
    pub tokenizer: &'a Tokenizer,
    /// Grammars of structured outputs, compiled once per constraint.
    pub grammars: &'a Grammars,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn wrong_type(param: &str, expected: &str, got: &Value) -> ApiError {
    ApiError {
        code: Some("invalid_type"),
        ..ApiError::invalid(param, format!("{param} must be {expected}, got {}", type_name(got)))
    }
}

/// Typed access to a JSON object's fields; `null` counts as absent, as OpenAI reads it.
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// The path in front of each field name in messages ("messages[2].").
    prefix: String,
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Value>) -> Self {
        Fields { map, prefix: String::new() }
    }

    /// The fields of `map`, named in errors as `prefix` + the field ("tools[0].function.").
    pub fn with_prefix(map: &'a Map<String, Value>, prefix: &str) -> Self {
        Fields { map, prefix: prefix.to_string() }
    }

    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn number(&self, key: &str) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| wrong_type(&self.name(key), "a number", v)),
        }
    }

    /// An integer (an integral float such as 2.0 is taken too).
    pub fn integer(&self, key: &str) -> Result<Option<i128>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => integer_of(v).map(Some).ok_or_else(|| wrong_type(&self.name(key), "an integer", v)),
        }
    }

    /// A non-negative integer.
    pub fn count(&self, key: &str) -> Result<Option<usize>, ApiError> {
        match self.integer(key)? {
            None => Ok(None),
            Some(n) => usize::try_from(n).map(Some).map_err(|_| {
                ApiError::invalid(
                    &self.name(key),
                    format!("{} must be a non-negative integer, got {n}", self.name(key)),
                )
            }),
        }
    }

    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong_type(&self.name(key), "a boolean", v)),
        }
    }

    pub fn string(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| wrong_type(&self.name(key), "a string", v)),
        }
    }

    pub fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_object().map(Some).ok_or_else(|| wrong_type(&self.name(key), "an object", v)),
        }
    }

    /// A number in `[lo, hi]`.
    fn ranged(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        match self.number(key)? {
            Some(x) if !(lo..=hi).contains(&x) => {
                let range = match hi {
                    f64::MAX => format!(">= {lo}"),
                    _ => format!("in [{lo}, {hi}]"),
                };
                Err(ApiError::invalid(&self.name(key), format!("{} must be {range}, got {x}", self.name(key))))
            }
            x => Ok(x.map(|x| x as f32)),
        }
    }
}

fn integer_of(v: &Value) -> Option<i128> {
    if let Some(i) = v.as_i64() {
        return Some(i.into());
    }
    if let Some(u) = v.as_u64() {
        return Some(u.into());
    }
    v.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1e30).map(|f| f as i128)
}

/// Checks `body` for endpoint `kind`.
pub(crate) fn parse(kind: Kind, body: &Map<String, Value>, cx: &Context) -> Result<Parsed, ApiError> {
    let f = Fields::new(body);
    let adapter = cx.info.adapter_named(f.string("model")?, cx.model_id)?;
    refuse_unsupported(kind, &f)?;
    let n = match f.count("n")? {
        None => 1,
        Some(n) if (1..=MAX_CHOICES).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::invalid(
                "n",
                format!("n must be in [1, {MAX_CHOICES}] (choices per request), got {n}"),
            ))
        }
    };

    let stream = f.boolean("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(o) => Fields { map: o, prefix: "stream_options.".into() }.boolean("include_usage")?.unwrap_or(false),
        None => false,
    };

    let mut options = cx.defaults.clone();
    options.adapter = adapter;
    // vLLM's: prompt blocks are shared only among requests of one salt.
    options.cache_salt = match f.string("cache_salt")? {
        Some("") => return Err(ApiError::invalid("cache_salt", "cache_salt must be a non-empty string if given")),
        salt => salt.map(str::to_string),
    };
    let max_tokens = match kind {
        Kind::Chat => match f.count("max_completion_tokens")? {
            Some(n) => Some(("max_completion_tokens", n)),
            None => f.count("max_tokens")?.map(|n| ("max_tokens", n)),
        },
        Kind::Completion => f.count("max_tokens")?.map(|n| ("max_tokens", n)),
    };
    if let Some((name, n)) = max_tokens {
        if n == 0 {
            return Err(ApiError::invalid(name, format!("{name} must be at least 1, got 0")));
        }
        options.max_tokens = n;
    }

    let sampler = &mut options.sampler;
    if let Some(t) = f.ranged("temperature", 0.0, f64::MAX)? {
        if !t.is_finite() {
            return Err(ApiError::invalid("temperature", "temperature must be a finite number"));
        }
        sampler.temperature = t;
    }
    if let Some(p) = f.ranged("top_p", 0.0, 1.0)? {
        sampler.top_p = p;
    }
    if let Some(p) = f.ranged("min_p", 0.0, 1.0)? {
        sampler.min_p = p;
    }
    if let Some(k) = f.integer("top_k")? {
        // vLLM's -1 (and 0) turn top-k off.
        sampler.top_k = match k {
            -1 | 0 => 0,
            k if k > 0 && (k as u128) < cx.vocab_size as u128 => k as usize,
            k => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("top_k must be -1 or 0 (off) or in [1, {}), got {k}", cx.vocab_size),
                ))
            }
        };
    }
    if let Some(seed) = f.integer("seed")? {
        // Any 64-bit integer, negative ones included, names one stream.
        options.seed = Some(
            i64::try_from(seed)
                .map(|s| s as u64)
                .or_else(|_| u64::try_from(seed))
                .map_err(|_| ApiError::invalid("seed", format!("seed must be a 64-bit integer, got {seed}")))?,
        );
    }

    let stops = match f.get("stop") {
        None => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().map(str::to_string).ok_or_else(|| wrong_type(&format!("stop[{i}]"), "a string", v))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(wrong_type("stop", "a string or an array of strings", v)),
    };
    if !stops.is_empty() {
        let stop = Stop::strings(cx.tokenizer, &stops).map_err(|e| ApiError::invalid("stop", e.to_string()))?;
        options.stop = stop.with_tokens(cx.defaults.stop.tokens.iter().copied());
    }

    options.processors = processors(&f, cx)?;

    options.logprobs = match kind {
        Kind::Chat => {
            let asked = f.boolean("logprobs")?.unwrap_or(false);
            let top = f.count("top_logprobs")?;
            match (asked, top) {
                (_, Some(n)) if n > MAX_LOGPROBS_ALTERNATIVES => {
                    return Err(ApiError::invalid(
                        "top_logprobs",
                        format!("top_logprobs must be at most {MAX_LOGPROBS_ALTERNATIVES}, got {n}"),
                    ))
                }
                (false, Some(n)) if n > 0 => {
                    return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true"));
                }
                (true, top) => Some(top.unwrap_or(0)),
                (false, _) => None,
            }
        }
        Kind::Completion => match f.get("logprobs") {
            // The SDK's types say an integer; a boolean is read as OpenAI's legacy API reads it.
            Some(Value::Bool(b)) => b.then_some(0),
            _ => match f.count("logprobs")? {
                Some(n) if n > MAX_LOGPROBS_ALTERNATIVES => {
                    return Err(ApiError::invalid(
                        "logprobs",
                        format!("logprobs must be at most {MAX_LOGPROBS_ALTERNATIVES}, got {n}"),
                    ))
                }
                n => n,
            },
        },
    };

    if let Some(n) = f.count("min_tokens")? {
        options.min_tokens = n;
    }
    if let Some(b) = f.boolean("ignore_eos")? {
        options.ignore_eos = b;
    }
    if options.min_tokens > options.max_tokens {
        return Err(ApiError::invalid(
            "min_tokens",
            format!("min_tokens = {} is above max_tokens = {}", options.min_tokens, options.max_tokens),
        ));
    }
    let constraint = structured::requested(&f)?;
    if constraint.is_some() && (options.ignore_eos || options.min_tokens > 0) {
        let which = if options.ignore_eos { "ignore_eos" } else { "min_tokens" };
        return Err(ApiError::invalid(
            which,
            format!("{which} with a structured output: the grammar decides where the output ends; drop one"),
        ));
    }

    let (prompt, tools) = match kind {
        Kind::Chat => {
            let tools = tools::parse(&f)?;
            let mut args = cx.template_args.clone();
            if let Some(extra) = f.object("chat_template_kwargs")? {
                args.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            // tool_choice "none" keeps the tools from the model, as vLLM's
            // --exclude-tools-when-tool-choice-none does: it cannot be tempted to call them.
            if let Some(t) = tools.as_ref().filter(|t| t.parses_calls()) {
                args.insert("tools".into(), Value::Array(t.tools.clone()));
            }
            (Prompt::Messages(messages(&f)?, args), tools)
        }
        Kind::Completion => (completion_prompt(&f, cx.vocab_size)?, None),
    };
    if let Some((constraint, param)) = constraint {
        if tools.as_ref().is_some_and(|t| t.parses_calls()) {
            return Err(ApiError::unsupported(
                param,
                "a structured output with tools the model may call is not supported yet: send tool_choice \"none\", \
                 or no tools",
            ));
        }
        // Compiled last, once every other field has been accepted.
        let grammar = cx.grammars.compile(constraint).map_err(|e| ApiError::invalid(param, format!("{param}: {e}")))?;
        options.constraint = Some(grammar);
    }
    Ok(Parsed { kind, prompt, options, n, stream, include_usage, tools })
}

impl Parsed {
    /// The options of choice `index`: the request's, with its `seed` + `index` (wrapping) as
    /// the seed, so each choice of a seeded request can be had again alone (vLLM also derives
    /// each choice's generator from the seed). Without a seed every choice draws its own.
    pub fn choice_options(&self, index: usize) -> GenerateOptions {
        let mut options = self.options.clone();
        options.seed = options.seed.map(|seed| seed.wrapping_add(index as u64));
        options
    }
}

/// Fields that ask for what this server does not do: refused rather than ignored.
fn refuse_unsupported(kind: Kind, f: &Fields) -> Result<(), ApiError> {
    if kind == Kind::Completion {
        if f.boolean("echo")? == Some(true) {
            return Err(ApiError::unsupported("echo", "echo = true is not supported by this server yet"));
        }
        if let Some(b) = f.integer("best_of")? {
            if b != 1 {
                return Err(ApiError::unsupported("best_of", format!("best_of = {b}: only 1 is supported")));
            }
        }
        if f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::unsupported("suffix", "suffix (insertion) is not supported by this server"));
        }
    }
    Ok(())
}

fn processors(f: &Fields, cx: &Context) -> Result<LogitsProcessors, ApiError> {
    let mut p = cx.defaults.processors.clone();
    if let Some(x) = f.ranged("presence_penalty", -2.0, 2.0)? {
        p.presence_penalty = Some(x);
    }
    if let Some(x) = f.ranged("frequency_penalty", -2.0, 2.0)? {
        p.frequency_penalty = Some(x);
    }
    if let Some(x) = f.number("repetition_penalty")? {
        if !(x > 0.0 && x.is_finite()) {
            return Err(ApiError::invalid(
                "repetition_penalty",
                format!("repetition_penalty must be above 0, got {x}"),
            ));
        }
        p.repetition_penalty = Some(x as f32);
    }
    for (key, slot) in [
        ("repetition_context_size", &mut p.repetition_context_size),
        ("presence_context_size", &mut p.presence_context_size),
        ("frequency_context_size", &mut p.frequency_context_size),
    ] {
        if let Some(n) = f.count(key)? {
            if n == 0 {
                return Err(ApiError::invalid(key, format!("{key} must be at least 1")));
            }
            *slot = n;
        }
    }
    if let Some(bias) = f.object("logit_bias")? {
        p.logit_bias.clear();
        for (key, value) in bias {
            let id: u32 = key
                .trim()
                .parse()
                .map_err(|_| ApiError::invalid("logit_bias", format!("logit_bias: key {key:?} is not a token id")))?;
            if id as usize >= cx.vocab_size {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias: token {id} is outside the vocabulary of {}", cx.vocab_size),
                ));
            }
            let b = value.as_f64().ok_or_else(|| wrong_type(&format!("logit_bias.{key}"), "a number", value))?;
            if !(-100.0..=100.0).contains(&b) {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias.{key} must be in [-100, 100], got {b}"),
                ));
            }
            p.logit_bias.push((id, b as f32));
        }
    }
    Ok(p)
}

/// `messages` rendered by the model's chat template with its extra arguments `args`
/// (the text holds the special tokens the template writes).
pub(crate) fn chat_text(
    tokenizer: &Tokenizer,
    messages: &Value,
    args: Map<String, Value>,
    add_generation_prompt: bool,
    continue_final_message: bool,
) -> Result<String, ApiError> {
    let template = tokenizer.chat_template().ok_or_else(|| {
        ApiError::invalid("messages", "this model has no chat template: use /v1/completions with a prompt")
    })?;
    let ctx = tokenizer.template_context(args);
    template
        .render_values(messages, add_generation_prompt, continue_final_message, &ctx)
        .map_err(|e| ApiError::invalid("messages", format!("the chat template failed on these messages: {e}")))
}

/// The messages, each reduced to `{"role", "content"}` with text content, plus what a call or
/// its result carries: an assistant's `tool_calls` (see [`tools::message_calls`]) and its
/// `reasoning_content` (or `reasoning`), given to the template as both `reasoning_content`
/// (Qwen3 reads it) and `thinking` (gpt-oss does); a tool message's `tool_call_id` and `name`.
/// A key is only set when the request has it: templates test `'tool_calls' in message`.
pub(crate) fn messages(f: &Fields) -> Result<Value, ApiError> {
    let list = match f.get("messages") {
        None => return Err(ApiError::invalid("messages", "messages is required: a list of {role, content} objects")),
        Some(Value::Array(list)) => list,
        Some(v) => return Err(wrong_type("messages", "an array", v)),
    };
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "messages is empty: give at least one message"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let map = m.as_object().ok_or_else(|| wrong_type(&at, "an object", m))?;
        let mf = Fields { map, prefix: format!("{at}.") };
        let role = mf
            .string("role")?
            .ok_or_else(|| ApiError::invalid(&format!("{at}.role"), format!("{at}.role is required")))?;
        let role = match role {
            "system" | "user" | "assistant" | "tool" => role,
            // OpenAI's newer name for the system role.
            "developer" => "system",
            "function" => {
                return Err(ApiError::unsupported(
                    &format!("{at}.role"),
                    format!("{at}.role \"function\" is OpenAI's deprecated form: send role \"tool\" with tool_call_id"),
                ))
            }
            other => {
                return Err(ApiError::invalid(
                    &format!("{at}.role"),
                    format!("{at}.role {other:?} is not one of system, developer, user, assistant, tool"),
                ))
            }
        };
        let calls = match mf.get("tool_calls") {
            None => None,
            Some(Value::Array(calls)) if role == "assistant" => {
                Some(calls).filter(|c| !c.is_empty()).map(|c| tools::message_calls(&at, c)).transpose()?
            }
            Some(Value::Array(_)) => {
                return Err(ApiError::invalid(
                    &format!("{at}.tool_calls"),
                    format!("{at}.tool_calls: only an assistant message carries tool calls"),
                ))
            }
            Some(v) => return Err(wrong_type(&format!("{at}.tool_calls"), "an array", v)),
        };
        let content = match mf.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                text_parts(&format!("{at}.content"), parts, (&["text", "input_text"], "text"))?
            }
            None if role == "assistant" => String::new(),
            None => return Err(ApiError::invalid(&format!("{at}.content"), format!("{at}.content is required"))),
            Some(v) => return Err(wrong_type(&format!("{at}.content"), "a string or an array of content parts", v)),
        };
        let mut message = Map::new();
        message.insert("role".into(), role.into());
        message.insert("content".into(), content.into());
        if role == "assistant" {
            let reasoning = match mf.string("reasoning_content")? {
                Some(r) => Some(r),
                None => mf.string("reasoning")?,
            };
            if let Some(r) = reasoning {
                message.insert("reasoning_content".into(), r.into());
                message.insert("thinking".into(), r.into());
            }
            if let Some(calls) = calls {
                message.insert("tool_calls".into(), Value::Array(calls));
            }
        }
        if role == "tool" {
            for key in ["tool_call_id", "name"] {
                if let Some(v) = mf.string(key)? {
                    message.insert(key.into(), v.into());
                }
            }
        }
        out.push(Value::Object(message));
    }
    Ok(Value::Array(out))
}

/// The text of content `parts` (the array at `at`), each an object whose `type` is one of
/// `kinds` (`named` in the refusal of any other: this model reads text), joined as
/// mlx_lm.server joins them.
pub(crate) fn text_parts(at: &str, parts: &[Value], (kinds, named): (&[&str], &str)) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let here = format!("{at}[{j}]");
        let map = part.as_object().ok_or_else(|| wrong_type(&here, "an object", part))?;
        let pf = Fields { map, prefix: format!("{here}.") };
        match pf.string("type")? {
            Some(kind) if kinds.contains(&kind) => {}
            Some(other) => {
                return Err(ApiError::unsupported(
                    &format!("{here}.type"),
                    format!("{here}.type {other:?}: only {named} parts are supported (this model reads text)"),
                ));
            }
            None => return Err(ApiError::invalid(&format!("{here}.type"), format!("{here}.type is required"))),
        }
        let piece = pf
            .string("text")?
            .ok_or_else(|| ApiError::invalid(&format!("{here}.text"), format!("{here}.text is required")))?;
        text.push_str(piece);
    }
    Ok(text)
}

/// `prompt`: a string, a list of token ids, or a list of one of either (OpenAI's batch forms,
/// several prompts in one request, are refused).
fn completion_prompt(f: &Fields, vocab_size: usize) -> Result<Prompt, ApiError> {
    let ids = |list: &[Value], at: &str| -> Result<Vec<u32>, ApiError> {
        list.iter()
            .enumerate()
            .map(|(i, v)| match integer_of(v) {
                Some(id) if id >= 0 && (id as u128) < vocab_size as u128 => Ok(id as u32),
                Some(id) => Err(ApiError::invalid(
                    "prompt",
                    format!("{at}[{i}] = {id} is not a token id of this model (vocabulary of {vocab_size})"),
                )),
                None => Err(wrong_type(&format!("{at}[{i}]"), "a token id (an integer)", v)),
            })
            .collect()
    };
    match f.get("prompt") {
        None => Err(ApiError::invalid("prompt", "prompt is required: a string or a list of token ids")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(list)) => match list.first() {
            None => Err(ApiError::invalid("prompt", "prompt is an empty list")),
            Some(Value::String(_) | Value::Array(_)) if list.len() > 1 => Err(ApiError::unsupported(
                "prompt",
                format!("prompt holds {} prompts: this server completes one prompt per request", list.len()),
            )),
            Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
            Some(Value::Array(inner)) => Ok(Prompt::Tokens(ids(inner, "prompt[0]")?)),
            Some(_) => Ok(Prompt::Tokens(ids(list, "prompt")?)),
        },
        Some(v) => Err(wrong_type("prompt", "a string or a list of token ids", v)),
    }
}
