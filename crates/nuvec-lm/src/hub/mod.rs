//! Finding a model: a directory, or a Hugging Face repo id, in the local cache or downloaded
//! into it (the layout `huggingface_hub` uses, so `hf`, mlx-lm and transformers find the same
//! files), and the cache's repos (`nuvec manage`).

mod cache_layout;
mod download;
mod options;
mod patterns;
mod transfer;

pub mod cache;

pub use options::{DownloadProgress, HubOptions, DEFAULT_ALLOW_PATTERNS};

use cache_layout::RepoId;

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

/// Resolves `model` to a local path with the options the environment gives
/// ([`HubOptions::from_env`]): see [`resolve_with`].
pub fn resolve(model: &str) -> Result<PathBuf> {
    resolve_with(model, &HubOptions::from_env())
}

/// Resolves `model` to a local path: an existing file or directory as it is; else a repo id
/// (`org/name`) at `options.revision`, from the hub cache when a snapshot of that revision is
/// there (the network is not asked), else downloaded into the cache (unless `options.offline`).
pub fn resolve_with(model: &str, options: &HubOptions) -> Result<PathBuf> {
    let path = Path::new(model);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let Some(repo) = RepoId::parse(model) else {
        return Err(Error::NotFound(format!("{model}: no such file or directory")));
    };
    let Some(cache) = options.cache.clone().or_else(hub_cache_dir) else {
        return Err(Error::NotFound(format!(
            "{model}: not a local path, and there is no Hugging Face cache to look in (no HOME); set HF_HUB_CACHE"
        )));
    };
    let revision = options.revision_checked()?;
    let repo_dir = cache.join(repo.folder());
    if let Some(snapshot) = cached_snapshot(&repo_dir, revision)? {
        return Ok(snapshot);
    }
    if options.offline {
        return Err(Error::NotFound(format!(
            "{model}: revision {revision} is not in the Hugging Face cache ({}), and downloads are off \
             (HF_HUB_OFFLINE or --offline); run without them to download it, or pass a directory",
            repo_dir.display()
        )));
    }
    download::snapshot(&cache, &repo, revision, options)
}

/// The snapshot of `revision` in `repo_dir` when the cache has it: the commit `refs/<revision>`
/// names, or `revision` itself when it is a commit whose snapshot is there.
fn cached_snapshot(repo_dir: &Path, revision: &str) -> Result<Option<PathBuf>> {
    let refs = repo_dir.join("refs").join(revision);
    let commit = match std::fs::read_to_string(&refs) {
        Ok(commit) => commit.trim().to_string(),
        Err(_) if is_commit(revision) && repo_dir.join("snapshots").join(revision).is_dir() => revision.to_string(),
        Err(_) => return Ok(None),
    };
    let snapshot = snapshot_dir(repo_dir, &refs, &commit)?;
    Ok(snapshot.is_dir().then_some(snapshot))
}

/// Whether `s` is a full commit hash (40 hex digits).
pub(crate) fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The snapshot a ref file `refs` names, refused unless it is a commit-like name (no `/`, no `..`)
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
