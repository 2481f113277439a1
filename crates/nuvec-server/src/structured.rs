//! Structured outputs over HTTP: OpenAI's `response_format` (`json_object`, `json_schema`) and
//! vLLM's `structured_outputs` extension (`json`, `regex`, `choice`, `grammar`: a Lark grammar
//! in llguidance's syntax), read into a [`Constraint`] and compiled once per distinct
//! constraint for the served tokenizer ([`Grammars`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use nuvec_lm::constrain::{Constraint, Grammar, Vocabulary};
use nuvec_lm::Tokenizer;
use serde_json::Value;

use crate::error::ApiError;
use crate::params::{wrong_type, Fields};

/// Distinct constraints kept compiled; past this many the cache starts over.
const MAX_CACHED: usize = 256;

/// The served tokenizer's vocabulary (built at the first constrained request) and the grammars
/// compiled for it, by constraint.
pub(crate) struct Grammars {
    tokenizer: Arc<Tokenizer>,
    vocabulary: OnceLock<Result<Vocabulary, String>>,
    compiled: Mutex<HashMap<String, Grammar>>,
}

impl Grammars {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Grammars { tokenizer, vocabulary: OnceLock::new(), compiled: Mutex::new(HashMap::new()) }
    }

    /// `constraint` compiled (or the compiled grammar of an equal one); the error says what is
    /// wrong with it.
    pub fn compile(&self, constraint: Constraint) -> Result<Grammar, String> {
        let key = format!("{constraint:?}");
        if let Some(g) = self.lock().get(&key) {
            return Ok(g.clone());
        }
        let vocabulary = self
            .vocabulary
            .get_or_init(|| Vocabulary::new(&self.tokenizer).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(Clone::clone)?;
        let grammar = Grammar::new(constraint, vocabulary).map_err(|e| e.to_string())?;
        let mut compiled = self.lock();
        if compiled.len() >= MAX_CACHED {
            compiled.clear();
        }
        compiled.insert(key, grammar.clone());
        Ok(grammar)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Grammar>> {
        self.compiled.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The constraint a request asks for, with the parameter that asked (for errors): at most one of
/// `response_format` (other than `text`) and `structured_outputs`.
pub(crate) fn requested(f: &Fields) -> Result<Option<(Constraint, &'static str)>, ApiError> {
    let from_format = match f.object("response_format")? {
        None => None,
        Some(format) => {
            let format = Fields::with_prefix(format, "response_format.");
            match format.string("type")? {
                None | Some("text") => None,
                Some("json_object") => Some((Constraint::JsonObject, "response_format")),
                Some("json_schema") => {
                    let Some(spec) = format.object("json_schema")? else {
                        return Err(ApiError::invalid(
                            "response_format.json_schema",
                            "response_format of type json_schema needs a json_schema object with its schema",
                        ));
                    };
                    let spec = Fields::with_prefix(spec, "response_format.json_schema.");
                    // `strict` may be true or false: the schema is enforced either way.
                    spec.boolean("strict")?;
                    let schema = match spec.get("schema") {
                        Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
                        Some(other) => {
                            return Err(wrong_type("response_format.json_schema.schema", "an object", other))
                        }
                        None => {
                            return Err(ApiError::invalid(
                                "response_format.json_schema.schema",
                                "response_format.json_schema needs its schema",
                            ))
                        }
                    };
                    Some((Constraint::JsonSchema(schema), "response_format.json_schema.schema"))
                }
                Some(other) => {
                    return Err(ApiError::invalid(
                        "response_format.type",
                        format!("response_format.type {other:?} is not one of text, json_object, json_schema"),
                    ))
                }
            }
        }
    };
    let from_extension =
        match f.object("structured_outputs")? {
            None => None,
            Some(so) => {
                let so = Fields::with_prefix(so, "structured_outputs.");
                let mut found = vec![];
                if let Some(schema) = so.get("json") {
                    let schema = match schema {
                        // vLLM takes the schema as an object or as its JSON text.
                        Value::String(text) => serde_json::from_str(text).map_err(|e| {
                            ApiError::invalid(
                                "structured_outputs.json",
                                format!("structured_outputs.json is not JSON: {e}"),
                            )
                        })?,
                        other => other.clone(),
                    };
                    found.push((Constraint::JsonSchema(schema), "structured_outputs.json"));
                }
                if let Some(rx) = so.string("regex")? {
                    found.push((Constraint::Regex(rx.to_string()), "structured_outputs.regex"));
                }
                if let Some(choice) = so.get("choice") {
                    let options: Option<Vec<String>> =
                        choice.as_array().and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect());
                    let Some(options) = options else {
                        return Err(wrong_type("structured_outputs.choice", "an array of strings", choice));
                    };
                    found.push((Constraint::Choice(options), "structured_outputs.choice"));
                }
                if let Some(grammar) = so.string("grammar")? {
                    found.push((Constraint::Lark(grammar.to_string()), "structured_outputs.grammar"));
                }
                if so.boolean("json_object")? == Some(true) {
                    found.push((Constraint::JsonObject, "structured_outputs.json_object"));
                }
                match found.len() {
                    0 => return Err(ApiError::invalid(
                        "structured_outputs",
                        "structured_outputs names no constraint: give one of json, regex, choice, grammar, json_object",
                    )),
                    1 => found.pop(),
                    _ => return Err(ApiError::invalid(
                        "structured_outputs",
                        "structured_outputs gives more than one constraint: give one of json, regex, choice, grammar, \
                         json_object",
                    )),
                }
            }
        };
    match (from_format, from_extension) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "structured_outputs",
            "both response_format and structured_outputs constrain the output: give one",
        )),
        (a, b) => Ok(a.or(b)),
    }
}
