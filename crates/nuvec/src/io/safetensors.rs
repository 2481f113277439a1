//! Memory-mapped safetensors files.
//!
//! A tensor whose bytes sit at an offset aligned to its element size is used in place, without a
//! copy; mlx-community files have unpadded headers, so their tensors are often misaligned and are
//! copied once when taken.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::buffer::Bytes;
use crate::{Array, DType, Error, Result};

/// Where one tensor lies in its file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    offset: usize,
    len: usize,
}

impl TensorInfo {
    /// Where its bytes start, from the file's start.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// How many bytes it has.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A safetensors file, mapped, with its header parsed and checked.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    map: Arc<Mmap>,
    tensors: HashMap<String, TensorInfo>,
    metadata: HashMap<String, String>,
}

fn dtype_of(name: &str, dtype: StDtype, path: &Path) -> Result<DType> {
    Ok(match dtype {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::I32 => DType::I32,
        StDtype::U32 => DType::U32,
        StDtype::U8 => DType::U8,
        other => {
            return Err(Error::Format {
                path: path.display().to_string(),
                message: format!(
                    "tensor {name} has dtype {other:?}, which nuvec does not load \
                     (convert the checkpoint to f32, f16, bf16 or an MLX quantization)"
                ),
            })
        }
    })
}

impl SafetensorsFile {
    /// Maps `path` and checks its header: a truncated or malformed file is an error naming it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source| Error::Io { path: path.display().to_string(), source };
        let file = File::open(&path).map_err(io_err)?;
        // SAFETY: the map is read-only and shared; like every mmap-based loader we rely on the
        // checkpoint not being truncated or rewritten by another process while it is loaded.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        let format_err = |e: safetensors::SafeTensorError| Error::Format {
            path: path.display().to_string(),
            message: format!("not a valid safetensors file ({e}); is it truncated or still downloading?"),
        };
        let (_, meta) = SafeTensors::read_metadata(&map).map_err(format_err)?;
        let parsed = SafeTensors::deserialize(&map).map_err(format_err)?;
        let base = map.as_ptr() as usize;
        let mut tensors = HashMap::new();
        for (name, view) in parsed.tensors() {
            if name.starts_with(super::aligned::PAD_PREFIX) {
                continue; // an aligned copy's gap (io/aligned.rs)
            }
            let dtype = dtype_of(&name, view.dtype(), &path)?;
            let data = view.data();
            tensors.insert(
                name,
                TensorInfo {
                    dtype,
                    shape: view.shape().to_vec(),
                    offset: data.as_ptr() as usize - base,
                    len: data.len(),
                },
            );
        }
        let metadata = meta.metadata().clone().unwrap_or_default();
        drop(parsed);
        Ok(SafetensorsFile { path, map: Arc::new(map), tensors, metadata })
    }

    /// Whether every tensor starts at a multiple of its element size, so that all of them are
    /// used in place (mlx-community files' unpadded headers usually make them copies).
    pub fn aligned(&self) -> bool {
        self.tensors.values().all(|t| t.offset % t.dtype.size() == 0)
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor names and where they lie.
    pub fn tensors(&self) -> &HashMap<String, TensorInfo> {
        &self.tensors
    }

    /// The header's `__metadata__` strings.
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// The tensor `name` as an array: mapped in place when aligned, else copied.
    pub fn array(&self, name: &str) -> Result<Array> {
        let info = self.tensors.get(name).ok_or_else(|| Error::Format {
            path: self.path.display().to_string(),
            message: format!("has no tensor named {name}"),
        })?;
        let bytes = if info.offset % info.dtype.size() == 0 {
            Bytes::Mapped { map: self.map.clone(), offset: info.offset, len: info.len }
        } else {
            Bytes::copy_of(&self.map[info.offset..info.offset + info.len])
        };
        Array::from_bytes(bytes, info.shape.clone(), info.dtype)
    }
}

/// Writes `tensors` (with `metadata`) to `path` as safetensors.
pub fn save_safetensors(
    path: impl AsRef<Path>,
    tensors: &[(String, Array)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let path = path.as_ref();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, a)| {
            let dtype = match a.dtype() {
                DType::F32 => StDtype::F32,
                DType::F16 => StDtype::F16,
                DType::BF16 => StDtype::BF16,
                DType::I32 => StDtype::I32,
                DType::U32 => StDtype::U32,
                DType::U8 => StDtype::U8,
            };
            safetensors::tensor::TensorView::new(dtype, a.shape().to_vec(), a.raw_bytes())
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::Format { path: path.display().to_string(), message: e.to_string() })
        })
        .collect::<Result<_>>()?;
    safetensors::serialize_to_file(views, &metadata, path).map_err(|e| match e {
        // A full disk or a missing directory is the OS's word, not a format problem.
        safetensors::SafeTensorError::IoError(source) => Error::Io { path: path.display().to_string(), source },
        other => Error::Format { path: path.display().to_string(), message: other.to_string() },
    })
}
