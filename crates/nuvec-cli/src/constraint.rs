//! `nuvec generate`'s structured-output flags: what the output must be.

use nuvec_lm::constrain::{Constraint, Grammar, Vocabulary};
use nuvec_lm::Tokenizer;

/// At most one of these: the output is then held to it token by token (llguidance).
#[derive(clap::Args, Debug, Default)]
#[group(multiple = false)]
pub struct ConstraintArgs {
    /// The output is a JSON object.
    #[arg(long)]
    json: bool,
    /// The output is JSON valid under this schema: a file, or the schema itself.
    #[arg(long, value_name = "FILE|JSON")]
    json_schema: Option<String>,
    /// The output matches this regex whole (Rust regex syntax).
    #[arg(long)]
    regex: Option<String>,
    /// The output is exactly one of these strings.
    #[arg(long, num_args = 1..)]
    choice: Vec<String>,
    /// The output follows this Lark grammar (llguidance's syntax; its `start` rule), from a file.
    #[arg(long, value_name = "FILE")]
    grammar: Option<std::path::PathBuf>,
    /// What compiling took (vocabulary, constraint), set by `grammar`.
    #[arg(skip)]
    timing: std::cell::Cell<Option<(std::time::Duration, std::time::Duration)>>,
}

impl ConstraintArgs {
    /// The constraint asked for, compiled for `tokenizer`'s vocabulary; `None` without one.
    pub fn grammar(&self, tokenizer: &Tokenizer) -> Result<Option<Grammar>, Box<dyn std::error::Error>> {
        let constraint = if self.json {
            Constraint::JsonObject
        } else if let Some(schema) = &self.json_schema {
            Constraint::JsonSchema(schema_value(schema)?)
        } else if let Some(rx) = &self.regex {
            Constraint::Regex(rx.clone())
        } else if !self.choice.is_empty() {
            Constraint::Choice(self.choice.clone())
        } else if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--grammar {}: {e} (give a file holding a Lark grammar)", path.display()))?;
            Constraint::Lark(text)
        } else {
            return Ok(None);
        };
        let start = std::time::Instant::now();
        let vocabulary = Vocabulary::new(tokenizer)?;
        let built = start.elapsed();
        let grammar = Grammar::new(constraint, &vocabulary)?;
        self.timing.set(Some((built, start.elapsed() - built)));
        Ok(Some(grammar))
    }

    /// How long the last [`grammar`](Self::grammar) call took to build the tokenizer's
    /// vocabulary for llguidance and to compile the constraint, when it made one.
    pub fn timing(&self) -> Option<(std::time::Duration, std::time::Duration)> {
        self.timing.get()
    }
}

/// `--json-schema`'s value: inline JSON when it starts like JSON, else a file holding it.
fn schema_value(arg: &str) -> Result<serde_json::Value, String> {
    let (text, whence) = if arg.trim_start().starts_with(['{', '[']) {
        (arg.to_string(), "the schema given".to_string())
    } else {
        let text =
            std::fs::read_to_string(arg).map_err(|e| format!("--json-schema {arg}: {e} (give a file or the JSON)"))?;
        (text, format!("--json-schema {arg}"))
    };
    serde_json::from_str(&text).map_err(|e| format!("{whence} is not JSON: {e}"))
}
