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
    let refs = repo.join("refs/main");
    let Ok(commit) = std::fs::read_to_string(&refs) else {
        return Err(Error::NotFound(format!(
            "{model}: not a local path, and not in the Hugging Face cache ({}); nuvec does not \
             download models: fetch it first (e.g. `hf download {model}`) or pass a directory",
            repo.display()
        )));
    };
    let snapshot = snapshot_dir(&repo, &refs, commit.trim())?;
    if !snapshot.is_dir() {
        return Err(Error::NotFound(format!(
            "{model}: {} names snapshot {}, which is not in the cache; fetch it again (e.g. `hf download {model}`)",
            refs.display(),
            snapshot.display()
        )));
    }
    Ok(snapshot)
}

/// The snapshot `refs/main` names, refused unless it is a commit-like name (no `/`, no `..`)
/// whose directory, and every file in it, resolves inside the repo's cache directory `repo`
/// (snapshot files are symlinks into `repo/blobs`): a cache is not a way to read other files.
fn snapshot_dir(repo: &Path, refs: &Path, commit: &str) -> Result<PathBuf> {
    let refused = |what: String| Error::Config { file: refs.display().to_string(), message: what };
    let commit_like = !commit.is_empty()
        && commit != "."
        && commit != ".."
        && commit.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !commit_like {
        return Err(refused(format!(
            "holds {commit:?}, not a commit hash; fix or delete the cache entry (`hf download` rewrites it)"
        )));
    }
    let snapshot = repo.join("snapshots").join(commit);
    let (Ok(root), Ok(resolved)) = (repo.canonicalize(), snapshot.canonicalize()) else {
        return Ok(snapshot);
    };
    let outside = |p: &Path| -> Result<()> {
        match p.canonicalize() {
            Ok(real) if !real.starts_with(&root) => Err(refused(format!(
                "snapshot {commit}: {} resolves to {}, outside {}; the cache is corrupt: fetch the model again",
                p.display(),
                real.display(),
                root.display()
            ))),
            _ => Ok(()),
        }
    };
    outside(&snapshot)?;
    if let Ok(entries) = std::fs::read_dir(&resolved) {
        for entry in entries.flatten() {
            outside(&snapshot.join(entry.file_name()))?;
        }
    }
    Ok(snapshot)
}
