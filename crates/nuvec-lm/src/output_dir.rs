//! Which directory `convert` may write to: a new path, or with `force` an existing directory that
//! is recognisably a model checkpoint and nothing else. Never the working directory, the root,
//! the home directory, or the source itself or a directory holding it.

use std::path::{Path, PathBuf};

use crate::convert::TOKENIZER_FILES;
use crate::{Error, Result};

/// Names a checkpoint directory may hold besides weight files (`*.safetensors`, `*.gguf`).
const CHECKPOINT_FILES: &[&str] = &["config.json", "model.safetensors.index.json", "README.md", ".gitattributes"];

/// Refuses `out` unless writing a converted `source` there can only replace a previous checkpoint
/// (or an empty directory).
pub fn check_output(out: &Path, source: &Path, force: bool) -> Result<()> {
    let refuse = |why: String| Err(Error::Invalid(format!("--mlx-path {}: {why}", out.display())));
    if !out.exists() {
        return Ok(());
    }
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let target = canonical(out);
    let home = std::env::var_os("HOME").map(|h| canonical(&PathBuf::from(h)));
    let cwd = std::env::current_dir().map(|d| canonical(&d)).ok();
    if target.parent().is_none() || Some(&target) == home.as_ref() || Some(&target) == cwd.as_ref() {
        return refuse(
            "is the root, the home or the working directory: name a new directory for the checkpoint".into(),
        );
    }
    if canonical(source).starts_with(&target) {
        return refuse(format!(
            "holds the source {} (or is it): the output must be a directory of its own",
            source.display()
        ));
    }
    if !target.is_dir() {
        return refuse("exists and is not a directory: name a directory for the checkpoint".into());
    }
    if !force {
        return refuse("already exists; delete it, choose another --mlx-path, or pass --force to replace it".into());
    }
    let mut foreign = vec![];
    let (mut config, mut weights, mut empty) = (false, false, true);
    let entries = std::fs::read_dir(out).map_err(|source| Error::Io { path: out.display().to_string(), source })?;
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io { path: out.display().to_string(), source })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        empty = false;
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let weight = name.ends_with(".safetensors") || name.ends_with(".gguf");
        config |= name == "config.json";
        weights |= is_file && weight;
        let known = weight || CHECKPOINT_FILES.contains(&name.as_str()) || TOKENIZER_FILES.contains(&name.as_str());
        if !is_file || !known {
            foreign.push(name);
        }
    }
    if !foreign.is_empty() {
        foreign.sort();
        let shown: Vec<&str> = foreign.iter().take(5).map(String::as_str).collect();
        let more = if foreign.len() > 5 { format!(" and {} more", foreign.len() - 5) } else { String::new() };
        return refuse(format!(
            "--force replaces only a model checkpoint, and this directory also holds {}{more}; \
             move those away or choose another --mlx-path",
            shown.join(", ")
        ));
    }
    let checkpoint = config && weights;
    if !empty && !checkpoint {
        return refuse(
            "--force replaces only a model checkpoint (config.json and weight files), and this directory \
             is not one; choose another --mlx-path"
                .into(),
        );
    }
    Ok(())
}
