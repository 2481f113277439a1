//! What an output must be, and the grammar compiled from it.

use llguidance::api::TopLevelGrammar;
use llguidance::TokenParser;
use serde_json::Value;

use super::mask::TokenMask;
use super::vocabulary::Vocabulary;
use crate::{Error, Result};

/// What a constrained output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid under this schema (the keywords llguidance supports: types, properties,
    /// required, additionalProperties, items, prefixItems, enum, const, anyOf, oneOf, allOf,
    /// $ref, pattern, format, min/max length, items and values). A JSON Schema keyword it does
    /// not implement (uniqueItems, contains...) is refused, naming it; a key that is no JSON
    /// Schema keyword at all is an annotation, as the JSON Schema spec has it.
    ///
    /// JSON constraints give JSON on one line, `{"a": 1, "b": [2, 3]}` (Python's `json.dumps`
    /// layout): with free whitespace a small model can spend its whole budget on newlines. An
    /// `"x-guidance"` object in the schema sets llguidance's layout options instead.
    JsonSchema(Value),
    /// Text matching this regex whole (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar in llguidance's syntax (its `start` rule).
    Lark(String),
}

impl Constraint {
    /// What kind it is, for messages.
    fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonObject => "the json_object constraint",
            Constraint::JsonSchema(_) => "the JSON schema",
            Constraint::Regex(_) => "the regex",
            Constraint::Choice(_) => "the choice",
            Constraint::Lark(_) => "the grammar",
        }
    }

    fn top_level(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(one_line(serde_json::json!({"type": "object"})))
            }
            Constraint::JsonSchema(schema) => TopLevelGrammar::from_json_schema(one_line(schema.clone())),
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Choice(options) => {
                if options.is_empty() {
                    return Err(Error::Invalid("a choice constraint needs at least one string to choose".into()));
                }
                // Lark string literals take JSON's escapes.
                let alternatives: Vec<String> =
                    options.iter().map(|o| serde_json::to_string(o).expect("a string serializes")).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
            Constraint::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
        })
    }
}

/// `schema` with llguidance's layout options for one-line JSON (", " between items, ": " after
/// keys, no other whitespace), unless it sets its own (`"x-guidance"`) or is not an object.
pub(crate) fn one_line(mut schema: Value) -> Value {
    if let Some(map) = schema.as_object_mut() {
        map.entry("x-guidance").or_insert_with(
            || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// A [`Constraint`] compiled for one [`Vocabulary`]: requests with this grammar start from the
/// parser compiled here (so a bad schema, regex or grammar is refused when it is made, and the
/// compile is paid once). Cloning is cheap.
#[derive(Clone)]
pub struct Grammar {
    constraint: Constraint,
    parser: TokenParser,
    vocabulary: Vocabulary,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Grammar({:?})", self.constraint)
    }
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        self.constraint == other.constraint
    }
}

impl Grammar {
    /// `constraint` compiled for `vocabulary`; an error naming what is wrong with it (a keyword
    /// llguidance does not support, a regex or grammar that does not parse).
    pub fn new(constraint: Constraint, vocabulary: &Vocabulary) -> Result<Self> {
        let top = constraint.top_level()?;
        let parser = vocabulary
            .factory
            .create_parser(top)
            .map_err(|e| Error::Invalid(format!("{} cannot be used: {e}", constraint.kind())))?;
        Ok(Grammar { constraint, parser, vocabulary: vocabulary.clone() })
    }

    /// What the grammar was compiled from.
    pub fn constraint(&self) -> &Constraint {
        &self.constraint
    }

    /// Tokens of the vocabulary it was compiled for.
    pub fn vocabulary_size(&self) -> usize {
        self.vocabulary.size
    }

    /// A fresh walk of the grammar for one request.
    pub(crate) fn start(&self) -> Result<TokenMask> {
        TokenMask::new(self.parser.clone(), self.vocabulary.eos)
    }
}
