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
use crate::staged::{write_error, Staged};
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

/// A prompt-cache file about to be written: the target was checked and its temporary sibling
/// made, so a path that cannot be written is refused before the prefill it would hold.
#[derive(Debug)]
pub struct PendingSave {
    stage: Staged,
}

/// Checks that `path` may be written before any work: an existing file is replaced only when it
/// is a nuvec prompt cache (or `force`), a directory or a missing directory is an error, and the
/// file is created under a temporary name, removed again on every error path.
pub fn prepare_save(path: &Path, force: bool) -> Result<PendingSave> {
    if path.is_file() && !force && !is_prompt_cache(path) {
        return Err(Error::Invalid(format!(
            "{} exists and is not a nuvec prompt cache; choose another file, or pass --force (force: true) \
             to replace it",
            path.display()
        )));
    }
    Ok(PendingSave { stage: Staged::file(path)? })
}

/// Whether `path` is a file `save` wrote (so replacing it loses nothing the user made otherwise).
fn is_prompt_cache(path: &Path) -> bool {
    SafetensorsFile::open(path).is_ok_and(|f| f.metadata().get("format").is_some_and(|v| v == FORMAT))
}

/// Saves `session` (made with `kv`) to `path`, as [`prepare_save`] (without force) then
/// [`PendingSave::save`].
pub fn save(
    path: &Path,
    model: &Model,
    model_name: &str,
    session: &Session,
    kv: &CacheOptions,
    prompt: &str,
) -> Result<()> {
    prepare_save(path, false)?.save(model, model_name, session, kv, prompt)
}

impl PendingSave {
    /// Writes `session` (made with `kv`): under the temporary name, then renamed over the target,
    /// so a failure (a full disk) never leaves half a file, nor removes the one that was there.
    pub fn save(
        self,
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
        let target = self.stage.target().to_path_buf();
        save_safetensors(self.stage.path(), &tensors, Some(metadata)).map_err(|e| write_error(&target)(e.into()))?;
        self.stage.commit()
    }
}

/// What the prompt-cache file at `path` says about itself, read from its header alone (so a
/// front end can load the model the file names).
pub fn read_info(path: &Path) -> Result<PromptCacheInfo> {
    let file = open(path)?;
    info_of(&file, path)
}

fn open(path: &Path) -> Result<SafetensorsFile> {
    if path.is_dir() {
        return Err(Error::Invalid(format!("{} is a directory: name a prompt-cache file", path.display())));
    }
    Ok(SafetensorsFile::open(path)?)
}

fn field(file: &SafetensorsFile, path: &Path, key: &str) -> Result<String> {
    file.metadata().get(key).cloned().ok_or_else(|| {
        Error::config(path.display().to_string(), format!("is not a nuvec prompt cache (no {key:?} in its metadata)"))
    })
}

fn info_of(file: &SafetensorsFile, path: &Path) -> Result<PromptCacheInfo> {
    let bad = |message: String| Error::config(path.display().to_string(), message);
    if field(file, path, "format")? != FORMAT {
        return Err(bad("is not a nuvec prompt cache (its format is not nuvec-prompt-cache)".into()));
    }
    let version = field(file, path, "version")?;
    if version != VERSION {
        return Err(bad(format!("is prompt-cache version {version}, this build reads {VERSION}")));
    }
    let kv: CacheOptions = serde_json::from_str(&field(file, path, "kv")?)
        .map_err(|e| bad(format!("has unreadable KV settings ({e})")))?;
    Ok(PromptCacheInfo {
        model: field(file, path, "model")?,
        fingerprint: field(file, path, "fingerprint")?,
        kv,
        prompt: field(file, path, "prompt")?,
    })
}

/// Loads the session saved at `path` for `model`, checking that it was made with this model and
/// the KV settings `kv` this run uses.
pub fn load(path: &Path, model: &Model, kv: &CacheOptions) -> Result<(Session, PromptCacheInfo)> {
    let kv = &model.cache_options(kv);
    let file = open(path)?;
    let label = path.display().to_string();
    let bad = |message: String| Error::Config { file: label.clone(), message };
    let mut info = info_of(&file, path)?;
    // Files from before the cache type was recorded stored the model's type.
    info.kv = model.cache_options(&info.kv);
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
            "holds a KV cache made with {}, but this run asks for {}; pass the same settings",
            info.kv.describe(),
            kv.describe()
        )));
    }
    let tokens: Vec<u32> = serde_json::from_str(&field(&file, path, "tokens")?)
        .map_err(|e| bad(format!("has unreadable token ids ({e})")))?;
    let layers: Vec<Value> = serde_json::from_str(&field(&file, path, "layers")?)
        .map_err(|e| bad(format!("has unreadable layers ({e})")))?;
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
