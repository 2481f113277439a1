//! The kernels' PTX kept on disk between processes: NVRTC takes 10 to 25 seconds over the kernel
//! sources (linear.cu alone about half), which every process on a GPU paid before its first
//! token. An entry is keyed by everything that decides the PTX (the source with its prelude,
//! the NVRTC options, NVRTC's version), so an edited kernel, another architecture or another
//! NVRTC misses and compiles anew; its header carries the key, the PTX's length and its SHA-256,
//! so a cut or altered file is recompiled, never loaded. Entries are written to a temporary file
//! beside them and renamed into place (two processes storing the same entry both leave a whole
//! one). The folder is `$NUVEC_CACHE/cuda-kernels` (`~/.cache/nuvec/cuda-kernels`; with neither
//! set, no cache); `NUVEC_CUDA_KERNEL_CACHE=0` compiles every time. Nothing outside that folder is touched, and
//! in it only this module's own `*.ptx` entries: the newest [`KEEP`] of each source stay, older
//! ones (from earlier builds) are removed. A folder that cannot be written costs only the
//! compile, with one warning.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use crate::Result;

/// Entries kept per source (the newest), so that switching between a few builds stays cached.
pub(super) const KEEP: usize = 4;

/// What the header's first word says, so a file of another format is never read as an entry.
const MAGIC: &str = "// nuvec kernel cache v1";

/// The cache folder: `None` when `NUVEC_CUDA_KERNEL_CACHE=0`, or when neither `NUVEC_CACHE` nor
/// `HOME` says where it is (the kernels are then compiled, not written into the working folder).
pub(super) fn folder() -> Option<PathBuf> {
    let off = crate::tuning::env("NUVEC_CUDA_KERNEL_CACHE").is_ok_and(|v| v == "0");
    crate::tuning::known_cache_dir().filter(|_| !off).map(|dir| dir.join("cuda-kernels"))
}

/// The key of source `name` (as compiled: prelude included) under NVRTC `options` and NVRTC
/// `version`: hex SHA-256 of all of it, each part length-prefixed.
pub(super) fn key(name: &str, src: &str, options: &[String], version: (i32, i32)) -> String {
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    part(format!("nvrtc {}.{}", version.0, version.1).as_bytes());
    for o in options {
        part(o.as_bytes());
    }
    part(name.as_bytes());
    part(src.as_bytes());
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The entry file of `name` (a source file name such as `linear.cu`) under `key`.
fn entry_path(dir: &Path, name: &str, key: &str) -> PathBuf {
    dir.join(format!("{}-{}.ptx", stem(name), &key[..32]))
}

/// The part of a source's name its entries start with (`linear.cu` -> `linear`).
fn stem(name: &str) -> &str {
    name.strip_suffix(".cu").unwrap_or(name)
}

/// The PTX of source `name` under `key`: the entry in `dir` when it is whole and has this key,
/// else `compile()`'s, stored for the next process (`dir` None: compiled, nothing stored). A
/// compile error is returned as it is and stores nothing; a cache that cannot be read or written
/// only costs the compile.
pub(super) fn ptx(
    dir: Option<&Path>,
    name: &str,
    key: &str,
    compile: impl FnOnce() -> Result<String>,
) -> Result<String> {
    let Some(dir) = dir else {
        return compile();
    };
    let path = entry_path(dir, name, key);
    if let Some(ptx) = read_entry(&path, key) {
        return Ok(ptx);
    }
    let ptx = compile()?;
    if let Err(e) = store(dir, name, &path, key, &ptx) {
        warn_once(&format!(
            "cuda: could not keep the compiled kernels in {} ({e}); each start compiles them \
             (NUVEC_CUDA_KERNEL_CACHE=0 stops trying)",
            dir.display()
        ));
    }
    Ok(ptx)
}

/// The PTX of the entry at `path` if its header has `key` and its body the recorded length and
/// SHA-256.
fn read_entry(path: &Path, key: &str) -> Option<String> {
    let mut text = fs::read_to_string(path).ok()?;
    let body = text.split_off(text.find('\n')? + 1);
    let mut words = text.strip_prefix(MAGIC)?.split_whitespace();
    let (k, len, sum) = (words.next()?, words.next()?, words.next()?);
    let whole = k == key && len.parse::<usize>().ok() == Some(body.len()) && sum == hex(&Sha256::digest(&body));
    whole.then_some(body)
}

/// Writes the entry through a temporary file renamed into place, then removes the source's
/// entries past the newest [`KEEP`].
fn store(dir: &Path, name: &str, path: &Path, key: &str, ptx: &str) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    // Unique to this store: another process, or another device's thread of this one, may be
    // storing the same entry now.
    static STORES: AtomicUsize = AtomicUsize::new(0);
    let n = STORES.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{}-{}-{n}.tmp", stem(name), std::process::id()));
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        writeln!(f, "{MAGIC} {key} {} {}", ptx.len(), hex(&Sha256::digest(ptx)))?;
        f.write_all(ptx.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    prune(dir, name);
    Ok(())
}

/// Removes the entries of source `name` past the newest [`KEEP`] (by modification time): only
/// files named as this module names them.
fn prune(dir: &Path, name: &str) {
    let prefix = format!("{}-", stem(name));
    let Ok(list) = fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = list
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(".ptx"))
                .is_some_and(|k| k.len() == 32 && k.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, old) in entries.into_iter().skip(KEEP) {
        let _ = fs::remove_file(old);
    }
}

fn warn_once(message: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        eprintln!("warning: {message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nuvec-kernel-cache-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn an_entry_is_compiled_once_then_read() {
        let dir = scratch("once");
        let calls = Cell::new(0);
        let k = key("linear.cu", "src", &["--std=c++17".into()], (13, 0));
        let compile = || {
            calls.set(calls.get() + 1);
            Ok(".version 9.0\n// ptx".to_string())
        };
        assert_eq!(ptx(Some(&dir), "linear.cu", &k, compile).unwrap(), ".version 9.0\n// ptx");
        assert_eq!(ptx(Some(&dir), "linear.cu", &k, compile).unwrap(), ".version 9.0\n// ptx");
        assert_eq!(calls.get(), 1, "the second process reads the entry");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_key_covers_source_options_and_nvrtc() {
        let base = key("a.cu", "src", &["--gpu-architecture=compute_90".into()], (13, 0));
        assert_ne!(base, key("a.cu", "src2", &["--gpu-architecture=compute_90".into()], (13, 0)));
        assert_ne!(base, key("a.cu", "src", &["--gpu-architecture=compute_80".into()], (13, 0)));
        assert_ne!(base, key("a.cu", "src", &["--gpu-architecture=compute_90".into()], (13, 1)));
        assert_ne!(base, key("b.cu", "src", &["--gpu-architecture=compute_90".into()], (13, 0)));
        // Parts are length-prefixed: moving text between them changes the key.
        assert_ne!(key("a.cu", "xy", &["o".into()], (1, 0)), key("a.cu", "y", &["ox".into()], (1, 0)));
        assert_eq!(base, key("a.cu", "src", &["--gpu-architecture=compute_90".into()], (13, 0)));
    }

    #[test]
    fn a_cut_or_altered_entry_is_compiled_again() {
        let dir = scratch("damaged");
        let k = key("moe.cu", "src", &[], (13, 0));
        let body = "line one\nline two\n".repeat(100);
        ptx(Some(&dir), "moe.cu", &k, || Ok(body.clone())).unwrap();
        let path = entry_path(&dir, "moe.cu", &k);
        let whole = fs::read(&path).unwrap();
        for damaged in [whole[..whole.len() - 7].to_vec(), {
            let mut v = whole.clone();
            let at = v.len() - 3;
            v[at] ^= 1;
            v
        }] {
            fs::write(&path, damaged).unwrap();
            let calls = Cell::new(0);
            let got = ptx(Some(&dir), "moe.cu", &k, || {
                calls.set(calls.get() + 1);
                Ok(body.clone())
            })
            .unwrap();
            assert_eq!((got.as_str(), calls.get()), (body.as_str(), 1));
            assert_eq!(fs::read(&path).unwrap(), whole, "the entry is whole again");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_compile_error_stores_nothing() {
        let dir = scratch("error");
        let k = key("qmma.cu", "src", &[], (13, 0));
        let err = ptx(Some(&dir), "qmma.cu", &k, || Err(crate::Error::Device("cuda: NVRTC could not compile".into())));
        assert!(err.unwrap_err().to_string().contains("could not compile"));
        assert!(!entry_path(&dir, "qmma.cu", &k).exists());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_folder_that_cannot_be_made_only_costs_the_compile() {
        let dir = scratch("blocked");
        fs::write(&dir, "a file where the folder would go").unwrap();
        let k = key("fused.cu", "src", &[], (13, 0));
        for _ in 0..2 {
            assert_eq!(ptx(Some(&dir.join("sub")), "fused.cu", &k, || Ok("ptx".into())).unwrap(), "ptx");
        }
        assert_eq!(fs::read_to_string(&dir).unwrap(), "a file where the folder would go", "left as it was");
        fs::remove_file(&dir).unwrap();
    }

    #[test]
    fn old_entries_past_the_newest_few_are_removed_and_nothing_else() {
        let dir = scratch("prune");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("notes.txt"), "mine").unwrap();
        fs::write(dir.join("linear-short.ptx"), "not an entry name").unwrap();
        let other = key("attention.cu", "src", &[], (13, 0));
        ptx(Some(&dir), "attention.cu", &other, || Ok("attention".into())).unwrap();
        let mut keys = Vec::new();
        for i in 0..KEEP + 2 {
            let k = key("linear.cu", &format!("build {i}"), &[], (13, 0));
            ptx(Some(&dir), "linear.cu", &k, || Ok(format!("ptx {i}"))).unwrap();
            // Entries made in one second must still order: set each one's time apart.
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + 10 * i as u64);
            fs::File::options().write(true).open(entry_path(&dir, "linear.cu", &k)).unwrap().set_modified(t).unwrap();
            keys.push(k);
        }
        // One more store prunes by the times just set.
        let last = key("linear.cu", "build last", &[], (13, 0));
        ptx(Some(&dir), "linear.cu", &last, || Ok("ptx last".into())).unwrap();
        let kept: Vec<bool> = keys.iter().map(|k| entry_path(&dir, "linear.cu", k).exists()).collect();
        let newest = KEEP - 1;
        assert_eq!(kept.iter().filter(|&&k| k).count(), newest, "{kept:?}");
        assert!(kept[keys.len() - newest..].iter().all(|&k| k), "the newest stay: {kept:?}");
        assert!(entry_path(&dir, "linear.cu", &last).exists());
        assert!(entry_path(&dir, "attention.cu", &other).exists(), "another source's entry stays");
        assert!(dir.join("notes.txt").exists() && dir.join("linear-short.ptx").exists(), "other files stay");
        fs::remove_dir_all(&dir).unwrap();
    }
}
