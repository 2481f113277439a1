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
    /// The file `eos_token_id` came from, when not `file` (generation_config.json).
    eos_file: Option<String>,
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
                    config.eos_file = Some(g.file);
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
            Value::Object(values) => Ok(Config { file: file.to_string(), values, eos_file: None }),
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

    /// `eos_token_id` as a list, each id checked to be below `vocab_size` (an id past the
    /// vocabulary can never be sampled, so generation would never stop on it).
    pub fn eos_token_ids_within(&self, vocab_size: usize) -> Result<Vec<u32>> {
        let ids = self.eos_token_ids()?;
        match ids.iter().find(|&&id| id as usize >= vocab_size) {
            None => Ok(ids),
            Some(id) => Err(Error::config(
                self.eos_file.as_deref().unwrap_or(&self.file),
                format!(
                    "eos_token_id holds {id}, outside the vocabulary of {vocab_size} tokens; fix the id (or the \
                     checkpoint's vocab_size)"
                ),
            )),
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
                Ok(Config { file: format!("{} (text_config)", self.file), values: values.clone(), eos_file: None })
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
        Config { file: format!("{} ({key})", self.file), values, eos_file: None }
    }
}

// Values no model can run with, refused at load instead of computing NaN (mlx-lm takes them).
impl Config {
    /// Refuses `rms_norm_eps` (and `layer_norm_eps`) <= 0, `rope_theta` <= 0 (also inside
    /// `rope_parameters` / `rope_scaling`), and `num_hidden_layers` = 0, in this config and its
    /// `text_config`.
    pub fn check_ranges(&self) -> Result<()> {
        let text = self.text_config()?;
        for c in [self, &text] {
            for key in ["rms_norm_eps", "layer_norm_eps", "rope_theta"] {
                if let Some(v) = c.opt_f64(key)? {
                    if !(v.is_finite() && v > 0.0) {
                        return Err(c.error(key, format_args!("= {v} must be a positive number; fix config.json")));
                    }
                }
            }
            if c.opt_usize("num_hidden_layers")? == Some(0) {
                return Err(c.error("num_hidden_layers", "= 0: a model needs at least one layer; fix config.json"));
            }
            for key in ["rope_parameters", "rope_scaling"] {
                c.check_nested_theta(key)?;
            }
        }
        Ok(())
    }

    /// `rope_theta` in `key` (an object, or an object of them per layer type) must be positive.
    fn check_nested_theta(&self, key: &str) -> Result<()> {
        let Some(Value::Object(outer)) = self.get(key) else { return Ok(()) };
        let nested = outer.iter().filter_map(|(k, v)| v.as_object().map(|o| (format!("{key}.{k}"), o)));
        for (path, object) in std::iter::once((key.to_string(), outer)).chain(nested) {
            if let Some(v) = object.get("rope_theta").filter(|v| !v.is_null()) {
                if !v.as_f64().is_some_and(|t| t.is_finite() && t > 0.0) {
                    return Err(self.error(
                        &format!("{path}.rope_theta"),
                        format_args!("= {v} must be a positive number; fix config.json"),
                    ));
                }
            }
        }
        Ok(())
    }
}
