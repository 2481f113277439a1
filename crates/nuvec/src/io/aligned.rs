//! Aligned copies of misaligned safetensors files (`NUVEC_ALIGNED_CACHE`).
//!
//! mlx-community checkpoints have unpadded headers, so their tensors sit at offsets that are not
//! multiples of their element size and each load copies them out of the map. With
//! `NUVEC_ALIGNED_CACHE=<dir>`, such a file is copied once into `<dir>` with every tensor at a
//! 256-byte boundary ([`align_safetensors`]), and every later load maps that copy in place. The
//! safetensors format has no gaps between tensors, so the copy fills them with U8 tensors named
//! `__nuvec_align_pad_<n>`, which [`SafetensorsFile`] does not list. A copy is named after the
//! source's path, size and modification time, so a changed source gets a new copy (old copies are
//! not evicted); it is written under a temporary name and renamed into place, so a crash or a
//! second process never leaves a partial copy under the final name. Nothing outside `<dir>` is
//! written, and the source is only read.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::safetensors::SafetensorsFile;
use crate::{Error, Result};

/// Where every tensor of a copy starts: a multiple of this many bytes from the file's start.
pub const ALIGNMENT: usize = 256;

/// The name prefix of the gap-filling tensors of a copy (never listed by [`SafetensorsFile`]).
pub const PAD_PREFIX: &str = "__nuvec_align_pad_";

/// Writes `src` to `dst` with every tensor's bytes at a multiple of [`ALIGNMENT`] from the
/// file's start, the header's metadata kept; through a temporary file beside `dst`, renamed into
/// place once complete.
pub fn align_safetensors(src: &Path, dst: &Path) -> Result<()> {
    write_aligned(&SafetensorsFile::open(src)?, dst)
}

/// [`align_safetensors`] of a file already open.
fn write_aligned(file: &SafetensorsFile, dst: &Path) -> Result<()> {
    let src = file.path();
    let mut order: Vec<(&String, usize, usize)> =
        file.tensors().iter().map(|(name, t)| (name, t.offset(), t.len())).collect();
    order.sort_by_key(|&(_, offset, _)| offset);
    // The header's entries, each tensor's data offsets relative to the data's start, and the
    // byte ranges of the source to copy (None: a gap of zeros).
    let mut header = serde_json::Map::new();
    if !file.metadata().is_empty() {
        let meta: BTreeMap<_, _> = file.metadata().iter().collect();
        header.insert("__metadata__".into(), serde_json::to_value(meta).map_err(|e| format_err(src, e))?);
    }
    // The data's start is padded to ALIGNMENT too (below), so offsets from it keep their alignment.
    let mut pieces: Vec<(Option<usize>, usize)> = Vec::new();
    let mut cursor = 0usize;
    for (pads, (name, offset, len)) in order.into_iter().enumerate() {
        let gap = (ALIGNMENT - cursor % ALIGNMENT) % ALIGNMENT;
        if gap > 0 {
            header.insert(
                format!("{PAD_PREFIX}{pads}"),
                serde_json::json!({"dtype": "U8", "shape": [gap], "data_offsets": [cursor, cursor + gap]}),
            );
            pieces.push((None, gap));
            cursor += gap;
        }
        let info = &file.tensors()[name];
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": safetensors_dtype(info.dtype),
                "shape": info.shape,
                "data_offsets": [cursor, cursor + len],
            }),
        );
        pieces.push((Some(offset), len));
        cursor += len;
    }
    let mut json = serde_json::to_vec(&header).map_err(|e| format_err(src, e))?;
    let padded = (8 + json.len()).div_ceil(ALIGNMENT) * ALIGNMENT - 8;
    json.resize(padded, b' ');

    let dir = dst.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.partial",
        dst.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut out = BufWriter::new(File::create(&tmp)?);
        out.write_all(&(json.len() as u64).to_le_bytes())?;
        out.write_all(&json)?;
        let zeros = [0u8; ALIGNMENT];
        for (from, len) in &pieces {
            match from {
                Some(offset) => out.write_all(&file.bytes()[*offset..*offset + *len])?,
                None => out.write_all(&zeros[..*len])?,
            }
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    if let Err(source) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::Io { path: tmp.display().to_string(), source });
    }
    std::fs::rename(&tmp, dst).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Io { path: dst.display().to_string(), source }
    })
}

/// The header's name of a dtype.
fn safetensors_dtype(dtype: crate::DType) -> &'static str {
    match dtype {
        crate::DType::F32 => "F32",
        crate::DType::F16 => "F16",
        crate::DType::BF16 => "BF16",
        crate::DType::I32 => "I32",
        crate::DType::U32 => "U32",
        crate::DType::U8 => "U8",
    }
}

fn format_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Format { path: path.display().to_string(), message: e.to_string() }
}

/// Opens the checkpoint file `path` for loading: in place when its tensors are aligned or no
/// cache folder is given, else through its aligned copy in `cache` (made if missing).
pub fn open_through_cache(path: &Path, cache: Option<&Path>) -> Result<SafetensorsFile> {
    let file = SafetensorsFile::open(path)?;
    let Some(cache) = cache else {
        return Ok(file);
    };
    if file.aligned() {
        return Ok(file);
    }
    let copy = copy_path(path, cache)?;
    if !copy.exists() {
        std::fs::create_dir_all(cache).map_err(|e| knob_err(cache, path, e))?;
        write_aligned(&file, &copy).map_err(|e| knob_err(cache, path, e))?;
    }
    SafetensorsFile::open(&copy).map_err(|e| Error::Format {
        path: copy.display().to_string(),
        message: format!("the aligned copy of {} is unreadable ({e}); delete it and it is made again", path.display()),
    })
}

/// [`open_through_cache`] with `NUVEC_ALIGNED_CACHE` (unset or empty: in place).
pub fn open_for_loading(path: &Path) -> Result<SafetensorsFile> {
    let cache = crate::tuning::env_os("NUVEC_ALIGNED_CACHE").filter(|v| !v.is_empty()).map(PathBuf::from);
    open_through_cache(path, cache.as_deref())
}

fn knob_err(cache: &Path, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!(
        "NUVEC_ALIGNED_CACHE={}: could not make the aligned copy of {} ({e}); point it at a writable \
         folder with room for the checkpoint, or unset it",
        cache.display(),
        path.display()
    ))
}

/// The copy's name in `cache`: the source's file name and a hash of its canonical path, size and
/// modification time (FNV-1a, stable across builds).
fn copy_path(path: &Path, cache: &Path) -> Result<PathBuf> {
    let io_err = |source| Error::Io { path: path.display().to_string(), source };
    let real = path.canonicalize().map_err(io_err)?;
    let meta = std::fs::metadata(&real).map_err(io_err)?;
    let modified = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
    let key = format!("{}\0{}\0{}.{:09}", real.display(), meta.len(), modified.as_secs(), modified.subsec_nanos());
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let stem = real.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(cache.join(format!("{stem}-{hash:016x}.safetensors")))
}
