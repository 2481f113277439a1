//! Prompt-cache files: a [`Session`] (its KV cache and the token ids it holds) saved as
//! safetensors with metadata naming the model, the KV settings and the tokens, so a later run
//! computes only what follows. Loading with another model or other KV settings is an error, and
//! nothing is overwritten until a file has been read whole.

use std::collections::HashMap;
use std::path::Path;

use nuvec::io::{save_safetensors, SafetensorsFile};

use crate::cache::KvCache;
use crate::models::Model;
use crate::session::Session;
use crate::{Error, Result};

const FORMAT: &str = "nuvec-prompt-cache";
const VERSION: &str = "1";

/// What a prompt-cache file says about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptCacheInfo {
    /// The model as given when the file was made (path or repo id).
    pub model: String,
    /// The loaded model's fingerprint (see [`Model::fingerprint`]).
    pub fingerprint: String,
    /// The KV cache kind and settings, as JSON.
    pub kv: String,
    /// Free-form text the maker stored (e.g. the prompt text, for a chat front end).
    pub prompt: String,
}

/// The KV settings string of the caches this build makes.
pub fn kv_settings() -> String {
    r#"{"kind":"kv"}"#.to_string()
}

/// Saves `session` to `path` (the whole file is written to a temporary name first, then renamed).
pub fn save(path: &Path, model: &Model, model_name: &str, session: &Session, prompt: &str) -> Result<()> {
    let mut tensors = vec![];
    for (i, layer) in session.cache().iter().enumerate() {
        if let Some((k, v)) = layer.state()? {
            tensors.push((format!("layers.{i}.keys"), k));
            tensors.push((format!("layers.{i}.values"), v));
        }
    }
    let metadata: HashMap<String, String> = [
        ("format", FORMAT.to_string()),
        ("version", VERSION.to_string()),
        ("model", model_name.to_string()),
        ("fingerprint", model.fingerprint().to_string()),
        ("kv", kv_settings()),
        ("tokens", serde_json::to_string(session.tokens()).expect("ids serialize")),
        ("prompt", prompt.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let tmp = path.with_extension("safetensors.partial");
    save_safetensors(&tmp, &tensors, Some(metadata))?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io { path: path.display().to_string(), source })
}

/// Loads the session saved at `path` for `model`, checking that it was made with this model and
/// these KV settings.
pub fn load(path: &Path, model: &Model) -> Result<(Session, PromptCacheInfo)> {
    let file = SafetensorsFile::open(path)?;
    let label = path.display().to_string();
    let bad = |message: String| Error::Config { file: label.clone(), message };
    let meta = file.metadata();
    let field = |key: &str| -> Result<String> {
        meta.get(key).cloned().ok_or_else(|| bad(format!("is not a nuvec prompt cache (no {key:?} in its metadata)")))
    };
    if field("format")? != FORMAT {
        return Err(bad("is not a nuvec prompt cache (its format is not nuvec-prompt-cache)".into()));
    }
    if field("version")? != VERSION {
        return Err(bad(format!("is prompt-cache version {}, this build reads {VERSION}", field("version")?)));
    }
    let info = PromptCacheInfo { model: field("model")?, fingerprint: field("fingerprint")?, kv: field("kv")?, prompt: field("prompt")? };
    if info.fingerprint != model.fingerprint() {
        return Err(bad(format!(
            "was made with another model ({}, fingerprint {}), not the one loaded (fingerprint {}); \
             make it again with `nuvec cache-prompt`",
            info.model,
            info.fingerprint,
            model.fingerprint()
        )));
    }
    if info.kv != kv_settings() {
        return Err(bad(format!("holds a KV cache of settings {}, but this run uses {}", info.kv, kv_settings())));
    }
    let tokens: Vec<u32> = serde_json::from_str(&field("tokens")?).map_err(|e| bad(format!("has unreadable token ids ({e})")))?;
    let mut cache = Vec::with_capacity(model.num_layers());
    for i in 0..model.num_layers() {
        let (k, v) = (format!("layers.{i}.keys"), format!("layers.{i}.values"));
        let layer = if tokens.is_empty() {
            KvCache::new()
        } else {
            let (keys, values) = (file.array(&k)?, file.array(&v)?);
            if keys.dim(1) != tokens.len() {
                return Err(bad(format!("layer {i} holds {} positions for {} tokens", keys.dim(1), tokens.len())));
            }
            KvCache::from_state(&keys, &values).map_err(|e| bad(format!("layer {i}: {e}")))?
        };
        cache.push(layer);
    }
    Ok((Session::from_parts(cache, tokens), info))
}
