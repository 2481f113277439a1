//! Writing what the user named, and nothing else, never half-way: output goes to a temporary
//! sibling of the target (the same directory, so the final rename stays on one filesystem and is
//! atomic), which is removed on every error path, and only a complete result is renamed into
//! place. An existing target is replaced only by that rename.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A file or directory being written under a temporary name beside its target.
#[derive(Debug)]
pub struct Staged {
    tmp: PathBuf,
    target: PathBuf,
    dir: bool,
    /// Parent directories this stage created, deepest first: removed again if it is dropped.
    created: Vec<PathBuf>,
    done: bool,
}

/// An I/O error about `path`.
pub(crate) fn io_error(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.display().to_string(), source }
}

/// An error while writing a stage, reworded about the user's `target` (not the temporary name),
/// with the operating system's cause ("No space left on device").
pub(crate) fn write_error(target: &Path) -> impl Fn(Error) -> Error + '_ {
    move |e| match e {
        Error::Io { source, .. } | Error::Array(nuvec::Error::Io { source, .. }) => {
            Error::Io { path: format!("cannot write {}", target.display()), source }
        }
        other => other,
    }
}

impl Staged {
    /// Starts writing the file `target`: creates its temporary sibling now, so that a target in
    /// a directory that does not exist or cannot be written is refused before any work is done.
    pub fn file(target: &Path) -> Result<Staged> {
        if target.is_dir() {
            return Err(Error::Invalid(format!("{} is a directory: name a file", target.display())));
        }
        let parent = parent_of(target);
        if !parent.is_dir() {
            return Err(Error::Invalid(format!(
                "{}: the directory {} does not exist; create it or name a file elsewhere",
                target.display(),
                parent.display()
            )));
        }
        let tmp = sibling(target, "partial")?;
        std::fs::File::create(&tmp).map_err(io_error(target))?;
        Ok(Staged { tmp, target: target.to_path_buf(), dir: false, created: vec![], done: false })
    }

    /// Starts writing the directory `target` (its missing parents are created, as mlx_lm.convert
    /// does, and removed again if the stage is dropped).
    pub fn dir(target: &Path) -> Result<Staged> {
        let parent = parent_of(target);
        let mut created = vec![];
        let mut missing = parent.clone();
        while !missing.as_os_str().is_empty() && !missing.exists() {
            created.push(missing.clone());
            missing = parent_of(&missing);
        }
        std::fs::create_dir_all(&parent).map_err(io_error(&parent))?;
        let mut stage = Staged { tmp: PathBuf::new(), target: target.to_path_buf(), dir: true, created, done: false };
        stage.tmp = sibling(target, "partial")?;
        std::fs::create_dir(&stage.tmp).map_err(io_error(target))?;
        Ok(stage)
    }

    /// Where to write: the temporary file or directory.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// The path the result will have.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Puts the result in place. A file replaces its target in one rename; a directory that
    /// replaces another first moves the old one aside, and moves it back if the second rename
    /// fails, so the target is always either the old directory or the new one.
    pub fn commit(mut self) -> Result<()> {
        let target = self.target.clone();
        if self.dir && target.exists() {
            let old = sibling(&target, "old")?;
            std::fs::rename(&target, &old).map_err(io_error(&target))?;
            if let Err(e) = std::fs::rename(&self.tmp, &target) {
                std::fs::rename(&old, &target).ok();
                return Err(Error::Io { path: target.display().to_string(), source: e });
            }
            self.done = true;
            return std::fs::remove_dir_all(&old).map_err(io_error(&old));
        }
        std::fs::rename(&self.tmp, &target).map_err(io_error(&target))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.dir {
            std::fs::remove_dir_all(&self.tmp).ok();
        } else {
            std::fs::remove_file(&self.tmp).ok();
        }
        for dir in &self.created {
            // Only if still empty: never anything someone else put there meanwhile.
            std::fs::remove_dir(dir).ok();
        }
    }
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `.NAME.nuvec-WHAT-PID` beside `target`: hidden, and named after what it is for.
fn sibling(target: &Path, what: &str) -> Result<PathBuf> {
    let name = target
        .file_name()
        .ok_or_else(|| Error::Invalid(format!("{} does not name a file or directory", target.display())))?;
    let name = format!(".{}.nuvec-{what}-{}", name.to_string_lossy(), std::process::id());
    Ok(parent_of(target).join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nuvec-staged-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_dropped_file_stage_leaves_the_old_file_and_nothing_else() {
        let dir = scratch("file");
        let target = dir.join("cache.safetensors");
        std::fs::write(&target, "old").unwrap();
        let stage = Staged::file(&target).unwrap();
        std::fs::write(stage.path(), "half").unwrap();
        drop(stage);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        assert_eq!(entries(&dir), ["cache.safetensors"]);
        let stage = Staged::file(&target).unwrap();
        std::fs::write(stage.path(), "new").unwrap();
        stage.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        assert_eq!(entries(&dir), ["cache.safetensors"]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_directory_stage_replaces_the_old_one_whole_or_not_at_all() {
        let dir = scratch("dir");
        let target = dir.join("out");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("config.json"), "old").unwrap();
        let stage = Staged::dir(&target).unwrap();
        std::fs::write(stage.path().join("config.json"), "half").unwrap();
        drop(stage);
        assert_eq!(std::fs::read_to_string(target.join("config.json")).unwrap(), "old");
        assert_eq!(entries(&dir), ["out"]);
        let stage = Staged::dir(&target).unwrap();
        std::fs::write(stage.path().join("model.safetensors"), "new").unwrap();
        stage.commit().unwrap();
        assert_eq!(entries(&target), ["model.safetensors"]);
        assert_eq!(entries(&dir), ["out"]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn parents_a_dropped_stage_created_are_removed_again() {
        let dir = scratch("parents");
        let stage = Staged::dir(&dir.join("a/b/out")).unwrap();
        assert!(dir.join("a/b").is_dir());
        drop(stage);
        assert!(entries(&dir).is_empty());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_file_in_a_missing_directory_or_a_directory_is_refused_at_once() {
        let dir = scratch("refuse");
        let err = Staged::file(&dir.join("no/such/f")).unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
        let err = Staged::file(&dir).unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
