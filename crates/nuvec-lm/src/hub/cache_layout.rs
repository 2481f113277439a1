//! The cache's layout, as `huggingface_hub` writes it: `models--org--name/` holding `blobs/<etag>`
//! (each file's bytes once), `snapshots/<commit>/<file>` (relative links into `blobs/`) and
//! `refs/<revision>` (the commit a branch or tag named), with transfers' locks in
//! `.locks/models--org--name/<etag>.lock`.

use std::path::{Component, Path, PathBuf};

use crate::{Error, Result};

/// A model repo's id, `org/name`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RepoId {
    pub org: String,
    pub name: String,
}

impl RepoId {
    /// `org/name` with both parts made of letters, digits, `-`, `_` and `.` (not `.` or `..`).
    pub fn parse(s: &str) -> Option<RepoId> {
        let (org, name) = s.split_once('/')?;
        let part = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        (part(org) && part(name)).then(|| RepoId { org: org.into(), name: name.into() })
    }

    /// Its folder in the cache.
    pub fn folder(&self) -> String {
        format!("models--{}--{}", self.org, self.name)
    }
}

impl std::fmt::Display for RepoId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.org, self.name)
    }
}

/// A repo's file name as the Hub lists it, refused unless it is a relative path that stays
/// inside the snapshot (no empty, `.` or `..` parts, no backslashes).
pub(crate) fn checked_file_name(name: &str) -> Result<&str> {
    let path = Path::new(name);
    let fine = !name.is_empty()
        && !name.contains('\\')
        && path.components().all(|c| matches!(c, Component::Normal(_)))
        && name.split('/').all(|p| !p.is_empty());
    match fine {
        true => Ok(name),
        false => Err(Error::Invalid(format!(
            "the Hub lists a file named {name:?}, which is not a path inside the repo; refused"
        ))),
    }
}

/// An ETag as the Hub sends it (quoted, perhaps weak) made into a blob's name: the sha256 of an
/// LFS file (64 hex digits) or the git blob id of another (40), else refused: it names a file.
pub(crate) fn checked_etag(raw: &str) -> Result<String> {
    let etag = raw.trim().trim_start_matches("W/").trim_matches('"').to_ascii_lowercase();
    match (etag.len() == 64 || etag.len() == 40) && etag.bytes().all(|b| b.is_ascii_hexdigit()) {
        true => Ok(etag),
        false => Err(Error::Invalid(format!(
            "the Hub sent the ETag {raw:?}, which is neither a sha256 nor a git blob id; refused"
        ))),
    }
}

/// Links `pointer` (a file in a snapshot) to `blob` by a relative path, as huggingface_hub
/// does, so the cache can move as a whole. An existing link is replaced.
pub(crate) fn link(blob: &Path, pointer: &Path) -> Result<()> {
    let parent = pointer.parent().expect("a snapshot file has a folder");
    std::fs::create_dir_all(parent).map_err(|source| io(parent, source))?;
    let target = relative(blob, parent);
    if pointer.symlink_metadata().is_ok() {
        std::fs::remove_file(pointer).map_err(|source| io(pointer, source))?;
    }
    std::os::unix::fs::symlink(&target, pointer).map_err(|source| io(pointer, source))
}

/// `to` as a path relative to folder `from` (both under the same cache folder).
fn relative(to: &Path, from: &Path) -> PathBuf {
    let to: Vec<Component> = to.components().collect();
    let from: Vec<Component> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut path: PathBuf = from[common..].iter().map(|_| Component::ParentDir).collect();
    path.extend(&to[common..]);
    path
}

/// Writes `refs/<revision>` = `commit` (through a temporary file, so a reader never sees half).
pub(crate) fn write_ref(repo_dir: &Path, revision: &str, commit: &str) -> Result<()> {
    let refs = repo_dir.join("refs").join(revision);
    let parent = refs.parent().expect("refs has a folder");
    std::fs::create_dir_all(parent).map_err(|source| io(parent, source))?;
    let tmp = refs.with_file_name(format!(".{}.nuvec-tmp", refs.file_name().unwrap_or_default().to_string_lossy()));
    std::fs::write(&tmp, commit).map_err(|source| io(&tmp, source))?;
    std::fs::rename(&tmp, &refs).map_err(|source| io(&refs, source))
}

pub(crate) fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.display().to_string(), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_leave_the_cache_are_refused() {
        assert!(RepoId::parse("org/name").is_some());
        for bad in ["org", "org/", "/name", "../x", "org/..", "a/b/c", "org/na me"] {
            assert!(RepoId::parse(bad).is_none(), "{bad}");
        }
        assert!(checked_file_name("sub/dir.txt").is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a\\b", "./x"] {
            assert!(checked_file_name(bad).is_err(), "{bad}");
        }
        assert_eq!(checked_etag("\"ABCDEF0123456789abcdef0123456789abcdef01\"").unwrap().len(), 40);
        assert!(checked_etag("W/\"../../x\"").is_err());
    }

    #[test]
    fn links_are_relative_to_the_snapshot_folder() {
        let to = Path::new("/c/models--a--b/blobs/e");
        assert_eq!(relative(to, Path::new("/c/models--a--b/snapshots/s")), Path::new("../../blobs/e"));
        assert_eq!(relative(to, Path::new("/c/models--a--b/snapshots/s/sub")), Path::new("../../../blobs/e"));
    }
}
