//! Structured output: which tokens a generation may take next, from a grammar (llguidance).
//!
//! A [`Constraint`] says what the output must be: a JSON object, a JSON schema, a regex, one of
//! some strings, or a Lark grammar. A [`Grammar`] is one compiled for a tokenizer's
//! [`Vocabulary`] (once; requests share it), and [`crate::GenerateOptions::constraint`] takes it.
//! Each request then walks the grammar with a mask of its own: before every token the tokens the
//! grammar cannot take get log-probability minus infinity (after the logits processors, before
//! the sampler's filters, so every sampler setting still applies), end-of-sequence is allowed
//! exactly where the grammar may end, and a grammar that is complete ends the output there.
//!
//! ```no_run
//! use nuvec_lm::constrain::{Constraint, Grammar, Vocabulary};
//! # fn main() -> nuvec_lm::Result<()> {
//! let (model, tokenizer) = nuvec_lm::load("path/to/model")?;
//! let vocabulary = Vocabulary::new(&tokenizer)?;
//! let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}},
//!                                 "required": ["name"]});
//! let grammar = Grammar::new(Constraint::JsonSchema(schema), &vocabulary)?;
//! let options = nuvec_lm::GenerateOptions { constraint: Some(grammar), ..Default::default() };
//! let prompt = tokenizer.encode("A person as JSON: ", true)?;
//! let text = tokenizer.decode(&nuvec_lm::generate(&model, &prompt, options)?.collect::<Result<Vec<_>, _>>()?)?;
//! # Ok(()) }
//! ```

mod grammar;
mod mask;
mod vocabulary;

pub(crate) use grammar::one_line;
pub use grammar::{Constraint, Grammar};
pub(crate) use mask::{commit_all, TokenMask};
pub use vocabulary::Vocabulary;
