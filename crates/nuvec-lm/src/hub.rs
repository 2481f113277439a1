//! Finding a model: a directory, or a Hugging Face repo id already in the local cache.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The Hugging Face hub cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn hub_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(dir));
    }
    if let Some(home) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(home).join("hub"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
}

/// Resolves `model` to a local path: an existing file or directory as it is, else a repo id
/// (`org/name`) looked up in the hub cache at its `refs/main` snapshot. Nothing is downloaded.
pub fn resolve(model: &str) -> Result<PathBuf> {
    let path = Path::new(model);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let parts: Vec<&str> = model.split('/').collect();
    let looks_like_repo = parts.len() == 2 && parts.iter().all(|p| !p.is_empty());
    let Some(cache) = hub_cache_dir().filter(|_| looks_like_repo) else {
        return Err(Error::NotFound(format!("{model}: no such file or directory")));
    };
    let repo = cache.join(format!("models--{}--{}", parts[0], parts[1]));
    let snapshot = std::fs::read_to_string(repo.join("refs/main"))
        .ok()
        .map(|commit| repo.join("snapshots").join(commit.trim()))
        .filter(|p| p.is_dir());
    snapshot.ok_or_else(|| {
        Error::NotFound(format!(
            "{model}: not a local path, and not in the Hugging Face cache ({}); nuvec does not \
             download models: fetch it first (e.g. `hf download {model}`) or pass a directory",
            repo.display()
        ))
    })
}
