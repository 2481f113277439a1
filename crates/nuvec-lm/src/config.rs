//! `config.json` as the model files read it: typed getters over the JSON object, with errors
//! that name the field, as mlx-lm's `ModelArgs.from_dict` reads only the fields it knows.

use std::path::Path;

use serde_json::{Map, Value};

use crate::{Error, Result};

/// A model's config.json (with generation_config.json's end-of-sequence ids folded in).
#[derive(Debug, Clone)]
pub struct Config {
    file: String,
    values: Map<String, Value>,
}

impl Config {
    /// Reads `config.json` (and `generation_config.json`, whose `eos_token_id` replaces
    /// config.json's, as in mlx-lm) from `dir`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let mut config = Self::from_json_file(&path)?;
        let generation = dir.join("generation_config.json");
        if generation.exists() {
            // mlx-lm ignores a generation_config.json that does not parse; so do we.
            if let Ok(g) = Self::from_json_file(&generation) {
                if let Some(eos) = g.values.get("eos_token_id").filter(|v| !v.is_null()) {
                    config.values.insert("eos_token_id".into(), eos.clone());
                }
            }
        }
        Ok(config)
    }

    fn from_json_file(path: &Path) -> Result<Self> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: file.clone(), source })?;
        Self::from_json(&file, &text)
    }

    /// Parses config JSON text; `file` names it in errors.
    pub fn from_json(file: &str, text: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::config(file, format!("is not valid JSON ({e}); re-download or fix the file")))?;
        match value {
            Value::Object(values) => Ok(Config { file: file.to_string(), values }),
            _ => Err(Error::config(file, "must be a JSON object")),
        }
    }

    /// The file name, for errors.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key).filter(|v| !v.is_null())
    }

    /// An error about `key`.
    pub fn error(&self, key: &str, message: impl std::fmt::Display) -> Error {
        Error::config(&self.file, format!("{key} {message}"))
    }

    /// A required non-negative integer.
    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.error(key, "is missing"))
    }

    /// An optional non-negative integer.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.error(key, format_args!("= {v} is not a non-negative integer"))),
        }
    }

    /// A required number.
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?.ok_or_else(|| self.error(key, "is missing"))
    }

    /// An optional number.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.error(key, format_args!("= {v} is not a number"))),
        }
    }

    /// An optional boolean, `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.error(key, format_args!("= {v} is not true or false"))),
        }
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.get(key) {
            None => Err(self.error(key, "is missing")),
            Some(v) => v.as_str().ok_or_else(|| self.error(key, format_args!("= {v} is not a string"))),
        }
    }

    /// `eos_token_id` as a list (it may be one id or several).
    pub fn eos_token_ids(&self) -> Result<Vec<u32>> {
        match self.get("eos_token_id") {
            None => Ok(vec![]),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as u32)
                        .ok_or_else(|| self.error("eos_token_id", format_args!("holds {v}, not a token id")))
                })
                .collect(),
            Some(v) => v
                .as_u64()
                .map(|n| vec![n as u32])
                .ok_or_else(|| self.error("eos_token_id", format_args!("= {v} is not a token id or a list of them"))),
        }
    }
}

impl Config {
    /// The language model's fields of a multimodal config (`text_config`, as Qwen3.5's wrapper
    /// nests them), or this config itself when it has none (a text-only checkpoint), as
    /// mlx-lm's `ModelArgs.from_dict` reads either.
    pub fn text_config(&self) -> Result<Config> {
        match self.get("text_config") {
            None => Ok(self.clone()),
            Some(Value::Object(values)) => {
                Ok(Config { file: format!("{} (text_config)", self.file), values: values.clone() })
            }
            Some(v) => Err(self.error("text_config", format_args!("= {v} is not an object"))),
        }
    }
}

// Gemma 4
impl Config {
    /// True when `key` is present with the value `null`, which some fields read differently from
    /// an absent key (Gemma 4's `final_logit_softcapping`: null turns capping off, absent is 30).
    pub fn is_null(&self, key: &str) -> bool {
        self.values.get(key).is_some_and(Value::is_null)
    }

    /// The JSON object under `key` (a multimodal checkpoint's `text_config`) as a config of its
    /// own; errors name it as `file (key)`.
    pub fn sub_config(&self, key: &str, values: Map<String, Value>) -> Config {
        Config { file: format!("{} ({key})", self.file), values }
    }
}
