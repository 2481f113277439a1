//! Prompt-cache files: a [`Session`] (its per-layer caches and the token ids they hold) saved as
//! safetensors with metadata naming the model, the KV settings and the tokens, so a later run
//! computes only what follows. Loading with another model or other KV settings is an error —
//! including a quantized file loaded without asking for quantization, which mlx-lm silently
//! inherits — and nothing is replaced until a file has been read whole.

use std::collections::HashMap;
use std::path::Path;

use nuvec::io::{save_safetensors, SafetensorsFile};
use serde_json::Value;

use crate::cache::{CacheOptions, LayerCache};
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
    /// The KV cache settings the file was made with.
    pub kv: CacheOptions,
    /// Free-form text the maker stored (e.g. the prompt text, for a chat front end).
    pub prompt: String,
}

/// Saves `session` (made with `kv`) to `path`; the file is written under a temporary name and
/// renamed, so a failure never leaves half a file where a good one was.
pub fn save(
    path: &Path,
    model: &Model,
    model_name: &str,
    session: &Session,
    kv: &CacheOptions,
    prompt: &str,
) -> Result<()> {
    // The file records what the cache stores, not "the model's default".
    let kv = &model.cache_options(kv);
    let mut tensors = vec![];
    let mut layers = vec![];
    for (i, layer) in session.cache().iter().enumerate() {
        let (arrays, description) = layer.save_state()?;
        tensors.extend(arrays.into_iter().map(|(name, a)| (format!("layers.{i}.{name}"), a)));
        layers.push(description);
    }
    let metadata: HashMap<String, String> = [
        ("format", FORMAT.to_string()),
        ("version", VERSION.to_string()),
        ("model", model_name.to_string()),
        ("fingerprint", model.fingerprint().to_string()),
        ("kv", serde_json::to_string(kv).expect("options serialize")),
        ("layers", Value::Array(layers).to_string()),
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
/// the KV settings `kv` this run uses.
pub fn load(path: &Path, model: &Model, kv: &CacheOptions) -> Result<(Session, PromptCacheInfo)> {
    let kv = &model.cache_options(kv);
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
    let file_kv: CacheOptions =
        serde_json::from_str(&field("kv")?).map_err(|e| bad(format!("has unreadable KV settings ({e})")))?;
    let info = PromptCacheInfo {
        model: field("model")?,
        fingerprint: field("fingerprint")?,
        // Files from before the cache type was recorded stored the model's type.
        kv: model.cache_options(&file_kv),
        prompt: field("prompt")?,
    };
    if info.fingerprint != model.fingerprint() {
        return Err(bad(format!(
            "was made with another model ({}, fingerprint {}), not the one loaded (fingerprint {}); \
             make it again with `nuvec cache-prompt`",
            info.model,
            info.fingerprint,
            model.fingerprint()
        )));
    }
    if &info.kv != kv {
        return Err(bad(format!(
            "holds a KV cache made with {:?}, but this run asks for {kv:?}; pass the same --max-kv-size, \
             --kv-bits, --kv-group-size, --quantized-kv-start and --kv-dtype",
            info.kv
        )));
    }
    let tokens: Vec<u32> =
        serde_json::from_str(&field("tokens")?).map_err(|e| bad(format!("has unreadable token ids ({e})")))?;
    let layers: Vec<Value> =
        serde_json::from_str(&field("layers")?).map_err(|e| bad(format!("has unreadable layers ({e})")))?;
    if layers.len() != model.num_layers() {
        return Err(bad(format!("holds {} layers; the model has {}", layers.len(), model.num_layers())));
    }
    let mut cache = Vec::with_capacity(layers.len());
    for (i, description) in layers.iter().enumerate() {
        let get = |name: &str| -> Result<nuvec::Array> { Ok(file.array(&format!("layers.{i}.{name}"))?) };
        let layer = LayerCache::load_state(description, get, kv).map_err(|e| bad(format!("layer {i}: {e}")))?;
        if layer.offset() != tokens.len() {
            return Err(bad(format!("layer {i} holds {} positions for {} tokens", layer.offset(), tokens.len())));
        }
        cache.push(layer);
    }
    Ok((Session::from_parts(cache, tokens), info))
}
