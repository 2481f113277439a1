//! The text mlx_lm.perplexity evaluates: records of an mlx-lm dataset (JSON lines of `text`,
//! `messages` or `prompt`/`completion`), each turned into tokens as mlx-lm's `TextDataset`,
//! `ChatDataset` and `CompletionsDataset` do, taken in numpy's permutation of the seed and cut
//! into windows of the sequence length.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::permutation::numpy_permutation;
use crate::{Error, Result, Tokenizer};

/// How a dataset's records become tokens, told by its first record (as mlx-lm's
/// `create_dataset`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    /// `{"text": ...}`: the text's tokens (with the tokenizer's special tokens), then
    /// end-of-sequence unless they end with it.
    Text,
    /// `{"messages": [...], "tools": ...}`: the conversation through the chat template.
    Chat,
    /// `{"prompt": ..., "completion": ...}`: a user and an assistant message through the chat
    /// template.
    Completions,
}

/// The records of a dataset file, in file order.
pub struct Dataset {
    path: PathBuf,
    records: Vec<Map<String, Value>>,
    format: Format,
}

impl Dataset {
    /// Reads `path`: a folder in mlx-lm's local layout (its `train.jsonl`, the split
    /// mlx_lm.perplexity reads) or a JSON-lines file. A Hugging Face dataset id is refused: nuvec
    /// does not download datasets.
    pub fn open(path: &Path) -> Result<Self> {
        let file = if path.is_dir() {
            let train = path.join("train.jsonl");
            if !train.is_file() {
                return Err(Error::Invalid(format!(
                    "{}: no train.jsonl in this folder (mlx-lm's local dataset layout: train.jsonl, \
                     valid.jsonl, test.jsonl; perplexity reads train.jsonl)",
                    path.display()
                )));
            }
            train
        } else if path.is_file() {
            path.to_path_buf()
        } else {
            return Err(Error::Invalid(format!(
                "{}: no such file or folder; nuvec reads local datasets only (a folder holding \
                 train.jsonl, or a .jsonl file), it does not download Hugging Face datasets",
                path.display()
            )));
        };
        let text = std::fs::read_to_string(&file).map_err(|e| Error::Invalid(format!("{}: {e}", file.display())))?;
        let mut records = Vec::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            match serde_json::from_str::<Value>(line) {
                Ok(Value::Object(record)) => records.push(record),
                Ok(_) => return Err(bad_line(&file, i, "a JSON object")),
                Err(e) => return Err(bad_line(&file, i, &format!("JSON ({e})"))),
            }
        }
        let Some(first) = records.first() else {
            return Err(Error::Invalid(format!("{}: no records", file.display())));
        };
        let format = if first.contains_key("prompt") && first.contains_key("completion") {
            Format::Completions
        } else if first.contains_key("messages") {
            Format::Chat
        } else if first.contains_key("text") {
            Format::Text
        } else {
            return Err(Error::Invalid(format!(
                "{}: its first record has none of mlx-lm's dataset fields: \"text\", \"messages\", or \
                 \"prompt\" and \"completion\"",
                file.display()
            )));
        };
        Ok(Dataset { path: file, records, format })
    }

    /// The records' format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// How many records the file holds.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether it holds none (never, once opened).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Record `i`'s tokens, as mlx-lm's dataset classes make them.
    pub fn tokens(&self, i: usize, tokenizer: &Tokenizer) -> Result<Vec<u32>> {
        let record = &self.records[i];
        let field = |key: &str| -> Result<&Value> {
            record.get(key).ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: record {} has no \"{key}\" (as the first record)",
                    self.path.display(),
                    i + 1
                ))
            })
        };
        let messages = match self.format {
            Format::Text => {
                let text = field("text")?.as_str().ok_or_else(|| {
                    Error::Invalid(format!("{}: record {}: \"text\" is not a string", self.path.display(), i + 1))
                })?;
                let mut tokens = tokenizer.encode(text, true)?;
                let eos = eos_id(tokenizer)?;
                if tokens.last() != Some(&eos) {
                    tokens.push(eos);
                }
                return Ok(tokens);
            }
            Format::Chat => field("messages")?.clone(),
            Format::Completions => json!([
                {"role": "user", "content": field("prompt")?},
                {"role": "assistant", "content": field("completion")?},
            ]),
        };
        let template = tokenizer.chat_template().ok_or_else(|| {
            Error::Invalid(format!(
                "{}: chat records need the tokenizer's chat template, and this tokenizer has none",
                self.path.display()
            ))
        })?;
        let mut kwargs = Map::new();
        if let Some(tools) = record.get("tools").filter(|t| !t.is_null()) {
            kwargs.insert("tools".into(), tools.clone());
        }
        let text = template.render_values(&messages, false, false, &tokenizer.template_context(kwargs))?;
        // The template writes the special tokens (transformers' apply_chat_template).
        tokenizer.encode(&text, false)
    }

    /// mlx_lm.perplexity's windows: records in numpy's permutation of `seed`, their tokens
    /// joined until `samples` windows of `length` tokens are filled (every record when
    /// `samples` is `None`), cut into whole windows. Too few tokens is an error naming what
    /// was asked (mlx-lm fails with an index error there, and with `--num-samples -1` always).
    pub fn windows(
        &self,
        tokenizer: &Tokenizer,
        length: usize,
        samples: Option<usize>,
        seed: u32,
    ) -> Result<Vec<Vec<u32>>> {
        if length < 2 {
            return Err(Error::Invalid(format!("a sequence length of {length}: at least 2 tokens are needed")));
        }
        let wanted = samples.map(|s| s.saturating_mul(length));
        let mut data = Vec::new();
        for i in numpy_permutation(seed, self.len()) {
            if wanted.is_some_and(|w| data.len() >= w) {
                break;
            }
            data.extend(self.tokens(i, tokenizer)?);
        }
        let short = wanted.is_some_and(|w| data.len() < w) || data.len() < length;
        if short {
            return Err(Error::Invalid(format!(
                "{}: its {} records hold {} tokens, fewer than {} windows of {length} need; lower \
                 --num-samples or --sequence-length, or give more text",
                self.path.display(),
                self.len(),
                data.len(),
                samples.unwrap_or(1)
            )));
        }
        let mut windows: Vec<Vec<u32>> = data.chunks_exact(length).map(<[u32]>::to_vec).collect();
        if let Some(s) = samples {
            windows.truncate(s);
        }
        Ok(windows)
    }
}

fn bad_line(file: &Path, i: usize, what: &str) -> Error {
    Error::Invalid(format!("{}: line {} is not {what}", file.display(), i + 1))
}

/// The tokenizer's end-of-sequence token (transformers' `eos_token_id`, which mlx-lm's text
/// records end with).
fn eos_id(tokenizer: &Tokenizer) -> Result<u32> {
    tokenizer
        .eos_token()
        .and_then(|t| tokenizer.token_id(t))
        .or_else(|| tokenizer.eos_token_ids().first().copied())
        .ok_or_else(|| {
            Error::Invalid("the tokenizer names no end-of-sequence token, which text records end with".into())
        })
}
