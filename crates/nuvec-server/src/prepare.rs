//! A request body checked, its chat template rendered and its prompt encoded, ready for the
//! engine. Every protocol comes through here: `/v1/responses` and `/v1/messages` translate
//! their bodies into a chat completions body first, so one parser checks every field.

use nuvec_lm::chat::tools::ForcedTool;
use nuvec_lm::chat::{ChatOutput, ToolFormat};
use nuvec_lm::constrain::Grammar;
use serde_json::{Map, Value};

use crate::answer::ChatAnswer;
use crate::error::ApiError;
use crate::params::{self, Kind, Parsed, Prompt};
use crate::tools::ToolChoice;
use crate::AppState;

/// A request checked and tokenized, ready for the engine.
pub(crate) struct Prepared {
    pub parsed: Parsed,
    pub ids: Vec<u32>,
    /// Each choice's answer reader (`parsed.n` of them; None for a completion, whose text is
    /// all content).
    pub answers: Vec<Option<ChatAnswer>>,
}

/// Checks and encodes `body` for `kind` on a blocking thread (templates and tokenizers are CPU
/// work); 503 at once when the engine has failed.
pub(crate) async fn prepare(
    state: &std::sync::Arc<AppState>,
    kind: Kind,
    body: Map<String, Value>,
    request_id: &str,
) -> Result<Prepared, ApiError> {
    if state.shared.failure().is_some() {
        return Err(engine_gone(state));
    }
    let state = state.clone();
    tokio::task::spawn_blocking(move || prepare_now(&state, kind, &body))
        .await
        .map_err(|e| ApiError::internal(request_id, format!("preparing the prompt failed: {e}")))?
}

pub(crate) fn engine_gone(state: &AppState) -> ApiError {
    ApiError::unavailable(&state.shared.failure().unwrap_or_else(|| "the engine has stopped".into()))
}

/// The chat prompt for `messages`, a reader for each of its `parsed.n` answers, and the grammar
/// of a forced call: tools shown to the model are parsed back out of it in the template's
/// format, and tool_choice "required" or a named function starts the answer inside a call (the
/// call's opening is appended to the prompt and read first) and holds the rest to one call of
/// an offered tool (the named one), its arguments valid under the tool's `parameters` schema,
/// through the call's close, where the answer ends.
fn chat_prompt(
    state: &AppState,
    parsed: &Parsed,
    messages: &Value,
    args: &Map<String, Value>,
) -> Result<ChatPrompt, ApiError> {
    let tokenizer = &state.tokenizer;
    let template = tokenizer.chat_template().ok_or_else(|| {
        ApiError::invalid("messages", "this model has no chat template: use /v1/completions with a prompt")
    })?;
    let ctx = tokenizer.template_context(args.clone());
    let mut text = template
        .render_values(messages, true, false, &ctx)
        .map_err(|e| ApiError::invalid("messages", format!("the chat template failed on these messages: {e}")))?;
    let format = ToolFormat::of_template(template.source());
    let tools = parsed.tools.as_ref().filter(|t| t.parses_calls());
    if tools.is_some() && format.is_none() {
        return Err(ApiError::unsupported(
            "tools",
            format!(
                "the chat template ({}) writes no tool calls in a format this server reads (Hermes/Qwen <tool_call>, \
                 Llama 3 JSON, Mistral [TOOL_CALLS], gpt-oss harmony): serve a checkpoint whose template supports \
                 tools, or send no tools",
                template.origin()
            ),
        ));
    }
    let forced = match (tools, format) {
        (Some(t), Some(f)) => match &t.choice {
            ToolChoice::Required => Some((f, None)),
            ToolChoice::Named(name) => Some((f, Some(name.as_str()))),
            ToolChoice::Auto | ToolChoice::None => None,
        },
        _ => None,
    };
    let (prefix, grammar) = match (forced, tools) {
        (Some((f, name)), Some(t)) => (f.forced_prefix(name), Some(forced_call(state, parsed, f, &t.tools, name)?)),
        _ => (String::new(), None),
    };
    text.push_str(&prefix);
    let reader = || {
        let mut output = ChatOutput::new(template, &text, format, tools.is_some());
        // The opening is inside a call: nothing of it is final yet.
        let held = output.push(&prefix);
        debug_assert!(held.is_empty(), "a forced call's opening gave {held:?}");
        Some(ChatAnswer::new(output, format))
    };
    let readers = (0..parsed.n).map(|_| reader()).collect();
    Ok(ChatPrompt { text, answers: readers, grammar })
}

/// What [`chat_prompt`] makes of a chat request.
struct ChatPrompt {
    text: String,
    answers: Vec<Option<ChatAnswer>>,
    /// A forced call's grammar.
    grammar: Option<Grammar>,
}

/// The grammar of a forced call of `name` (any of `tools` when None) in `format`.
fn forced_call(
    state: &AppState,
    parsed: &Parsed,
    format: ToolFormat,
    tools: &[Value],
    name: Option<&str>,
) -> Result<Grammar, ApiError> {
    if parsed.options.ignore_eos || parsed.options.min_tokens > 0 {
        let which = if parsed.options.ignore_eos { "ignore_eos" } else { "min_tokens" };
        return Err(ApiError::invalid(
            which,
            format!(
                "{which} with tool_choice {}: the call's grammar decides where the answer ends; drop one",
                name.map_or("\"required\"".to_string(), |n| format!("naming {n:?}"))
            ),
        ));
    }
    let tools: Vec<ForcedTool> = tools
        .iter()
        .map(|t| ForcedTool {
            name: t["function"]["name"].as_str().unwrap_or_default().to_string(),
            parameters: t["function"].get("parameters").cloned(),
        })
        .collect();
    let bad = |e: String| {
        ApiError::invalid(
            "tools",
            format!("tool_choice forces a call, but the tools' parameters cannot hold it to them: {e}"),
        )
    };
    let constraint = format.forced_call(&tools, name).map_err(|e| bad(e.to_string()))?;
    state.grammars.compile(constraint).map_err(bad)
}

fn prepare_now(state: &AppState, kind: Kind, body: &Map<String, Value>) -> Result<Prepared, ApiError> {
    let tokenizer = &state.tokenizer;
    let cx = params::Context {
        model_id: &state.config.model_id,
        info: &state.info,
        defaults: &state.config.defaults,
        template_args: &state.config.template_args,
        vocab_size: state.info.vocab_size,
        tokenizer,
        grammars: &state.grammars,
    };
    let mut parsed = params::parse(kind, body, &cx)?;
    let mut answers = (0..parsed.n).map(|_| None).collect();
    let (ids, param) = match &parsed.prompt {
        Prompt::Messages(messages, args) => {
            let ChatPrompt { text, answers: readers, grammar } = chat_prompt(state, &parsed, messages, args)?;
            answers = readers;
            if grammar.is_some() {
                parsed.options.constraint = grammar;
            }
            // The template wrote the special tokens.
            (tokenizer.encode(&text, false), "messages")
        }
        Prompt::Text(text) => (tokenizer.encode(text, true), "prompt"),
        Prompt::Tokens(ids) => (Ok(ids.clone()), "prompt"),
    };
    let ids = ids.map_err(|e| ApiError::invalid(param, format!("the prompt could not be tokenized: {e}")))?;
    if ids.is_empty() {
        return Err(ApiError::invalid(param, "the prompt is empty: it encodes to no tokens"));
    }
    let limit = match parsed.options.context_length {
        Some(n) => Some(n),
        None if parsed.options.allow_past_context => None,
        None => state.info.context_length,
    };
    if let Some(limit) = limit.filter(|&l| ids.len() >= l) {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(
                param,
                format!(
                    "This model's maximum context length is {limit} tokens, and the prompt is {} tokens, which \
                     leaves no room for an answer; shorten the prompt",
                    ids.len()
                ),
            )
        });
    }
    Ok(Prepared { parsed, ids, answers })
}
