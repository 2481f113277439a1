//! The Hugging Face cache's repos, as `huggingface_hub.scan_cache_dir` reports them (what
//! `mlx_lm.manage` lists), and deleting a repo from it: `nuvec manage`.
//!
//! A repo is a folder `{models,datasets,spaces}--org--name` directly under the cache, with
//! `snapshots/<commit>/…` (links into `blobs/`) and `refs/<name>` files naming commits. Its size
//! is that of its distinct blobs (each link's first hop, as huggingface_hub counts it), its last
//! access and modification the latest of theirs. A folder that does not have that shape is
//! reported as a warning and left alone. Deleting removes the repo's folder and what is in it;
//! links are removed, never followed, so no file outside the cache is touched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::{Error, Result};

/// One cached repo.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedRepo {
    /// `org/name`.
    pub repo_id: String,
    /// `model`, `dataset` or `space`.
    pub repo_type: &'static str,
    /// Its folder in the cache.
    pub path: PathBuf,
    /// Bytes of its distinct blobs.
    pub size_on_disk: u64,
    /// How many distinct blobs its snapshots reference.
    pub files: usize,
    /// The latest access of one of its blobs (the folder's when it has none).
    pub last_accessed: SystemTime,
    /// The latest modification of one of its blobs (the folder's when it has none).
    pub last_modified: SystemTime,
}

/// What a scan found: the repos, sorted by path, and why the folders that are not repos were
/// left out.
#[derive(Debug, Clone, Default)]
pub struct CacheScan {
    /// The repos.
    pub repos: Vec<CachedRepo>,
    /// One line per folder that is not a valid repo.
    pub warnings: Vec<String>,
}

/// Entries huggingface_hub skips at the top of the cache and in snapshot and ref folders.
const IGNORED: [&str; 3] = [".DS_Store", "Thumbs.db", "desktop.ini"];

/// Scans the cache folder `cache` (see the module notes). A missing cache is an error naming it.
pub fn scan(cache: &Path) -> Result<CacheScan> {
    let root = cache.canonicalize().map_err(|e| {
        Error::NotFound(format!(
            "{}: no Hugging Face cache here ({e}); set HF_HUB_CACHE (or HF_HOME) to the cache folder",
            cache.display()
        ))
    })?;
    if !root.is_dir() {
        return Err(Error::NotFound(format!("{}: the Hugging Face cache is not a folder", root.display())));
    }
    let entries = std::fs::read_dir(&root).map_err(|source| io(&root, source))?;
    let mut scan = CacheScan::default();
    for entry in entries {
        let entry = entry.map_err(|source| io(&root, source))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if IGNORED.contains(&name.as_str()) || name == ".locks" || name == "CACHEDIR.TAG" {
            continue;
        }
        match scan_repo(&root.join(&name)) {
            Ok(repo) => scan.repos.push(repo),
            Err(why) => scan.warnings.push(why),
        }
    }
    scan.repos.sort_by(|a, b| a.path.cmp(&b.path));
    scan.warnings.sort();
    Ok(scan)
}

/// One repo folder, or why it is not one.
fn scan_repo(path: &Path) -> std::result::Result<CachedRepo, String> {
    let bad = |what: String| format!("{}: {what}; left alone", path.display());
    if !path.is_dir() {
        return Err(bad("not a folder".into()));
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let Some((prefix, id)) = name.split_once("--") else {
        return Err(bad("not a Hugging Face cache folder (no `type--org--name`)".into()));
    };
    let repo_type = match prefix {
        "models" => "model",
        "datasets" => "dataset",
        "spaces" => "space",
        other => return Err(bad(format!("repo type {other:?} is none of models, datasets, spaces"))),
    };
    let snapshots = path.join("snapshots");
    if !snapshots.is_dir() {
        return Err(bad("no snapshots folder".into()));
    }
    // The commits the refs name: each must have a snapshot.
    let mut refs = std::collections::BTreeSet::new();
    let refs_dir = path.join("refs");
    if refs_dir.is_file() {
        return Err(bad("refs is a file".into()));
    }
    if refs_dir.is_dir() {
        for file in files_below(&refs_dir).map_err(|e| bad(e.to_string()))? {
            if IGNORED.iter().any(|i| file.file_name().is_some_and(|n| n == *i)) {
                continue;
            }
            refs.insert(std::fs::read_to_string(&file).map_err(|e| bad(format!("{}: {e}", file.display())))?);
        }
    }
    let mut blobs: BTreeMap<PathBuf, std::fs::Metadata> = BTreeMap::new();
    for revision in std::fs::read_dir(&snapshots).map_err(|e| bad(e.to_string()))? {
        let revision = revision.map_err(|e| bad(e.to_string()))?.path();
        let commit = revision.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if IGNORED.contains(&commit.as_str()) {
            continue;
        }
        if revision.is_file() {
            return Err(bad(format!("snapshots holds a file, {commit}")));
        }
        for file in files_below(&revision).map_err(|e| bad(e.to_string()))? {
            // The link's first hop, as huggingface_hub takes it: the blob in this repo.
            let blob = match std::fs::read_link(&file) {
                Ok(target) => absolute(&file.parent().unwrap_or(&revision).join(target)),
                Err(_) => file.clone(),
            };
            if let std::collections::btree_map::Entry::Vacant(slot) = blobs.entry(blob) {
                let meta = std::fs::metadata(slot.key())
                    .map_err(|_| bad(format!("{} is a broken link (its blob is missing)", file.display())))?;
                slot.insert(meta);
            }
        }
        refs.remove(&commit);
    }
    if let Some(commit) = refs.iter().next() {
        return Err(bad(format!("a ref names commit {commit:?}, which has no snapshot")));
    }
    let (last_accessed, last_modified) = if blobs.is_empty() {
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        (meta.accessed().map_err(|e| bad(e.to_string()))?, meta.modified().map_err(|e| bad(e.to_string()))?)
    } else {
        let latest = |f: fn(&std::fs::Metadata) -> std::io::Result<SystemTime>| {
            blobs.values().filter_map(|m| f(m).ok()).max().unwrap_or(SystemTime::UNIX_EPOCH)
        };
        (latest(std::fs::Metadata::accessed), latest(std::fs::Metadata::modified))
    };
    Ok(CachedRepo {
        repo_id: id.replace("--", "/"),
        repo_type,
        path: path.to_path_buf(),
        size_on_disk: blobs.values().map(std::fs::Metadata::len).sum(),
        files: blobs.len(),
        last_accessed,
        last_modified,
    })
}

/// Every file below `dir` (links included, not followed into folders they name), recursively.
fn files_below(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if std::fs::symlink_metadata(&path)?.is_dir() {
                pending.push(path);
            } else if !path.is_dir() {
                // A link to a folder is neither entered nor counted, as Python's glob("**/*")
                // followed by is_dir() skips it.
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `p` with `.` and `..` folded away lexically (os.path.abspath), not resolving links.
fn absolute(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Deletes `repo` (one of `scan(cache)`'s repos) from `cache`: its folder and everything in it.
/// Refused, touching nothing, unless the folder sits directly in the cache and is a real folder
/// (not a link); links inside it are removed without following them.
pub fn delete(cache: &Path, repo: &CachedRepo) -> Result<()> {
    let root = cache.canonicalize().map_err(|source| io(cache, source))?;
    let meta = std::fs::symlink_metadata(&repo.path).map_err(|source| io(&repo.path, source))?;
    if repo.path.parent() != Some(root.as_path()) || !meta.is_dir() {
        return Err(Error::Invalid(format!(
            "{}: not a repo folder directly in the Hugging Face cache {} (a link, or elsewhere); not deleted",
            repo.path.display(),
            root.display()
        )));
    }
    std::fs::remove_dir_all(&repo.path).map_err(|source| io(&repo.path, source))
}

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.display().to_string(), source }
}

/// A size as huggingface_hub prints it: one decimal, units of 1000 (`42.2K`, `1.3G`).
pub fn format_size(bytes: u64) -> String {
    let mut n = bytes as f64;
    for unit in ["", "K", "M", "G", "T", "P", "E", "Z"] {
        if n.abs() < 1000.0 {
            return format!("{n:.1}{unit}");
        }
        n /= 1000.0;
    }
    format!("{n:.1}Y")
}

/// How long before `now` `t` was, as huggingface_hub prints it (`a few seconds ago`, `3 weeks
/// ago`), its halves rounded to even as Python's round.
pub fn format_since(t: SystemTime, now: SystemTime) -> String {
    let delta = match now.duration_since(t) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };
    if delta < 20.0 {
        return "a few seconds ago".into();
    }
    const UNITS: [(&str, f64, Option<f64>); 7] = [
        ("second", 1.0, Some(59.0)),
        ("minute", 60.0, Some(59.0)),
        ("hour", 3600.0, Some(23.0)),
        ("day", 86_400.0, Some(6.0)),
        ("week", 604_800.0, Some(6.0)),
        ("month", 2_592_000.0, Some(11.0)),
        ("year", 31_536_000.0, None),
    ];
    let mut shown = (0.0, "second");
    for (label, divider, max) in UNITS {
        let value = (delta / divider).round_ties_even();
        shown = (value, label);
        if max.is_some_and(|m| value <= m) {
            break;
        }
    }
    let (value, label) = shown;
    format!("{value} {label}{} ago", if value > 1.0 { "s" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The expected strings are what huggingface_hub 2.4.0's `_format_size` and
    /// `format_timesince` print for the same inputs (the oracle venv's, run with `time.time`
    /// fixed); `tests/manage.rs` compares whole tables with mlx_lm.manage.
    #[test]
    fn sizes_and_times_print_as_huggingface_hub_prints_them() {
        assert_eq!(format_size(0), "0.0");
        assert_eq!(format_size(999), "999.0");
        assert_eq!(format_size(42_200), "42.2K");
        assert_eq!(format_size(1_250_000_000), "1.2G");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let ago = |s: u64| format_since(now - Duration::from_secs(s), now);
        assert_eq!(ago(5), "a few seconds ago");
        assert_eq!(ago(45), "45 seconds ago");
        assert_eq!(ago(90), "2 minutes ago"); // 1.5 rounds to even
        assert_eq!(ago(150), "2 minutes ago"); // 2.5 too
        assert_eq!(ago(3600), "1 hour ago");
        assert_eq!(ago(86_400 * 3), "3 days ago");
        assert_eq!(ago(86_400 * 20), "3 weeks ago");
        assert_eq!(ago(86_400 * 200), "7 months ago");
        assert_eq!(ago(86_400 * 365 * 3), "3 years ago");
    }
}
