//! vLLM's tokenizer routes: `POST /tokenize` turns a prompt (or chat messages, through the
//! chat template) into the ids the model would see, `POST /detokenize` turns ids back into
//! text. Request and response shapes are vLLM's, so its clients work unchanged.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};

use crate::api::json_object;
use crate::error::ApiError;
use crate::params::{self, Fields};
use crate::AppState;

/// `{"prompt": str}` or `{"messages": [...]}` (with `add_generation_prompt`,
/// `continue_final_message`, `chat_template_kwargs`), `add_special_tokens`,
/// `return_token_strs` → `{"count", "max_model_len", "tokens", "token_strs"}`.
pub(crate) async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = json_object(body, state.config.body_limit)?;
    // Templates and tokenizers are CPU work: off the async threads.
    let worker = state.clone();
    tokio::task::spawn_blocking(move || tokenize_body(&worker, &body))
        .await
        .map_err(|e| ApiError::internal("(tokenize)", format!("tokenizing failed: {e}")))?
        .map(Json)
}

fn check_model(f: &Fields, state: &AppState) -> Result<(), ApiError> {
    // Every served adapter shares the base model's tokenizer.
    state.info.adapter_named(f.string("model")?, &state.config.model_id).map(|_| ())
}

fn tokenize_body(state: &AppState, body: &Map<String, Value>) -> Result<Value, ApiError> {
    let f = Fields::new(body);
    check_model(&f, state)?;
    let tokenizer = &state.tokenizer;
    let (ids, param) = match (f.get("prompt"), f.get("messages")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("messages", "give either prompt or messages, not both"));
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "prompt",
                "prompt (a string) or messages (a list of {role, content}) is required",
            ))
        }
        (Some(_), None) => {
            let text = f.string("prompt")?.unwrap_or_default();
            // vLLM's default for a prompt: the tokenizer adds its special tokens (Llama's BOS).
            let special = f.boolean("add_special_tokens")?.unwrap_or(true);
            (tokenizer.encode(text, special), "prompt")
        }
        (None, Some(_)) => {
            let messages = params::messages(&f)?;
            let generation = f.boolean("add_generation_prompt")?.unwrap_or(true);
            let continued = f.boolean("continue_final_message")?.unwrap_or(false);
            if generation && continued {
                return Err(ApiError::invalid(
                    "continue_final_message",
                    "continue_final_message and add_generation_prompt cannot both be true: set \
                     add_generation_prompt to false to continue the last message",
                ));
            }
            let mut args = state.config.template_args.clone();
            if let Some(extra) = f.object("chat_template_kwargs")? {
                args.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            let text = params::chat_text(tokenizer, &messages, args, generation, continued)?;
            // vLLM's default for messages: the template already wrote the special tokens.
            let special = f.boolean("add_special_tokens")?.unwrap_or(false);
            (tokenizer.encode(&text, special), "messages")
        }
    };
    let ids = ids.map_err(|e| ApiError::invalid(param, format!("the prompt could not be tokenized: {e}")))?;
    let token_strs = match f.boolean("return_token_strs")?.unwrap_or(false) {
        true => {
            let table = tokenizer.token_bytes();
            Value::from(ids.iter().map(|&id| String::from_utf8_lossy(table.get(id)).into_owned()).collect::<Vec<_>>())
        }
        false => Value::Null,
    };
    Ok(json!({
        "count": ids.len(),
        "max_model_len": state.info.context_length,
        "tokens": ids,
        "token_strs": token_strs,
    }))
}

/// `{"tokens": [ids]}` → `{"prompt": text}` (special tokens kept, as vLLM decodes them).
pub(crate) async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = json_object(body, state.config.body_limit)?;
    let worker = state.clone();
    tokio::task::spawn_blocking(move || detokenize_body(&worker, &body))
        .await
        .map_err(|e| ApiError::internal("(detokenize)", format!("detokenizing failed: {e}")))?
        .map(Json)
}

fn detokenize_body(state: &AppState, body: &Map<String, Value>) -> Result<Value, ApiError> {
    let f = Fields::new(body);
    check_model(&f, state)?;
    let vocab = state.tokenizer.vocab_size();
    let list = match f.get("tokens") {
        None => return Err(ApiError::invalid("tokens", "tokens is required: a list of token ids")),
        Some(Value::Array(list)) => list,
        Some(v) => return Err(ApiError::invalid("tokens", format!("tokens must be a list of token ids, got {v}"))),
    };
    let ids = list
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(id) if (id as u128) < vocab as u128 => Ok(id as u32),
            _ => Err(ApiError::invalid(
                "tokens",
                format!("tokens[{i}] = {v} is not a token id of this tokenizer (integers in [0, {vocab}))"),
            )),
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let text = state
        .tokenizer
        .decode(&ids)
        .map_err(|e| ApiError::invalid("tokens", format!("these tokens could not be decoded: {e}")))?;
    Ok(json!({"prompt": text}))
}
