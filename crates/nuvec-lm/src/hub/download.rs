//! Downloading a repo's snapshot into the cache: its listing at a revision, the files the
//! allow-patterns pick, each into `blobs/` (skipped when there already), linked from
//! `snapshots/<commit>/`, and `refs/<revision>` written last, so that a download that stopped
//! part way is never taken for a complete snapshot.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::cache_layout::{checked_file_name, io, link, write_ref, RepoId};
use super::is_commit;
use super::options::{DownloadProgress, HubOptions};
use super::patterns::allowed;
use super::transfer::{verify, Client};
use crate::{Error, Result};

/// Downloads `repo` at `revision` into `cache`; the snapshot's folder.
pub(super) fn snapshot(cache: &Path, repo: &RepoId, revision: &str, options: &HubOptions) -> Result<PathBuf> {
    let client = Client::new(options);
    let encoded = revision.replace('/', "%2F");
    let listing_url = format!("{}/api/models/{repo}/revision/{encoded}", options.endpoint);
    let listing = client.json(&listing_url).map_err(|f| f.into_error(&format!("{repo}: listing the repo")))?;
    let commit = listing["sha"].as_str().unwrap_or_default().to_string();
    if !is_commit(&commit) {
        return Err(Error::NotFound(format!("{listing_url}: the listing names no commit (\"sha\"); is this the Hub?")));
    }
    let names: Vec<String> = listing["siblings"]
        .as_array()
        .map(|s| s.iter().filter_map(|f| f["rfilename"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let wanted: Vec<&str> = names.iter().map(String::as_str).filter(|n| allowed(n, &options.allow_patterns)).collect();
    if !wanted.iter().any(|n| n.ends_with(".safetensors")) {
        let ggufs: Vec<&str> = names.iter().map(String::as_str).filter(|n| n.ends_with(".gguf")).collect();
        if !ggufs.is_empty() {
            return Err(Error::Unsupported(format!(
                "{repo} holds GGUF files ({}), and nuvec downloads safetensors checkpoints only: download the \
                 one you want (`hf download {repo} <file>`) and pass its path",
                ggufs.join(", ")
            )));
        }
    }
    let repo_dir = cache.join(repo.folder());
    let snapshot = repo_dir.join("snapshots").join(&commit);
    for name in wanted {
        let name = checked_file_name(name)?;
        fetch_file(&client, cache, repo, &repo_dir, &commit, name, options.progress.as_ref())?;
    }
    std::fs::create_dir_all(&snapshot).map_err(|source| io(&snapshot, source))?;
    if revision != commit {
        write_ref(&repo_dir, revision, &commit)?;
    }
    Ok(snapshot)
}

/// Puts file `name` of `commit` into the cache, unless its link is there already.
fn fetch_file(
    client: &Client,
    cache: &Path,
    repo: &RepoId,
    repo_dir: &Path,
    commit: &str,
    name: &str,
    progress: Option<&DownloadProgress>,
) -> Result<()> {
    let pointer = repo_dir.join("snapshots").join(commit).join(name);
    if pointer.exists() {
        return Ok(());
    }
    let encoded: String = name.split('/').map(percent_encode).collect::<Vec<_>>().join("/");
    let url = format!("{}/{repo}/resolve/{commit}/{encoded}", client.endpoint());
    let meta = client.meta(&url).map_err(|f| f.into_error(&format!("{repo}: {name}")))?;
    let blob = repo_dir.join("blobs").join(&meta.etag);
    if !blob.exists() {
        let blobs = repo_dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(|source| io(&blobs, source))?;
        // One process fetches a blob at a time (huggingface_hub's lock path, so it waits for us
        // and we for it); the lock goes with the file handle.
        let locks = cache.join(".locks").join(repo.folder());
        std::fs::create_dir_all(&locks).map_err(|source| io(&locks, source))?;
        let lock_path = locks.join(format!("{}.lock", meta.etag));
        let lock = File::create(&lock_path).map_err(|source| io(&lock_path, source))?;
        lock.lock().map_err(|source| io(&lock_path, source))?;
        if !blob.exists() {
            let part = repo_dir.join("blobs").join(format!("{}.incomplete", meta.etag));
            client.fetch(&url, &part, name, meta.size)?;
            verify(&part, &meta.etag, meta.size, name)?;
            std::fs::rename(&part, &blob).map_err(|source| io(&blob, source))?;
        }
        drop(lock);
    }
    if let Some(DownloadProgress(f)) = progress {
        let size = blob.metadata().map(|m| m.len()).unwrap_or(0);
        f(name, size, size);
    }
    link(&blob, &pointer)
}

/// A path segment for a URL: unreserved characters as they are, the rest `%XX`.
fn percent_encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            true => (b as char).to_string(),
            false => format!("%{b:02X}"),
        })
        .collect()
}
