//! GGUF (v2, v3) files: metadata and tensors, memory-mapped.
//!
//! Every count, length and offset read from the file is checked against the bytes that remain
//! before anything is allocated from it, so a truncated or hostile file is an error, never a
//! panic or a huge allocation.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::buffer::Bytes;
use crate::{Array, DType, Error, Result};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any integer type (u8 ... i64), widened.
    Int(i128),
    /// f32 or f64.
    Float(f64),
    /// bool.
    Bool(bool),
    /// A UTF-8 string (invalid bytes replaced).
    String(String),
    /// An array of values.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            GgufValue::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }

    /// The value as a float (integers included).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            GgufValue::Float(f) => Some(*f),
            GgufValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            GgufValue::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

/// ggml's tensor types that nuvec reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// f32.
    F32,
    /// f16.
    F16,
    /// bf16.
    BF16,
    /// 32 values: f16 scale, 32 x i8.
    Q8_0,
    /// 32 values: f16 scale, 32 x 4 bits, offset -8.
    Q4_0,
    /// 32 values: f16 scale and min, 32 x 4 bits.
    Q4_1,
    /// 32 values: f16 scale, 32 x 5 bits, offset -16.
    Q5_0,
    /// 32 values: f16 scale and min, 32 x 5 bits.
    Q5_1,
    /// 32 values: an e8m0 scale, 32 x 4-bit e2m1 codes (gpt-oss's experts): MLX's mxfp4.
    Mxfp4,
    /// A type this build does not convert (its ggml number).
    Other(u32),
    // GGUF K-quants (kquants): 256-value super-blocks, converted by `gguf_kquants`.
    /// 256 values: 16 sub-blocks of 16 with 4-bit scale and min, f16 d and dmin, 2-bit values.
    Q2K,
    /// 256 values: 16 sub-blocks of 16 with 6-bit signed scales, f16 d, 3-bit values (offset 4).
    Q3K,
    /// 256 values: 8 sub-blocks of 32 with 6-bit scale and min, f16 d and dmin, 4-bit values.
    Q4K,
    /// 256 values: 8 sub-blocks of 32 with 6-bit scale and min, f16 d and dmin, 5-bit values.
    Q5K,
    /// 256 values: 16 sub-blocks of 16 with int8 scales, f16 d, 6-bit values (offset 32).
    Q6K,
}

impl GgmlType {
    fn from_id(id: u32) -> Self {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::BF16,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            39 => GgmlType::Mxfp4,
            other => GgmlType::Other(other),
        }
    }

    /// (values per block, bytes per block), for the types nuvec reads.
    pub fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q2K => (256, 84),
            GgmlType::Q3K => (256, 110),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
            GgmlType::Mxfp4 => (32, 17),
            GgmlType::Other(_) => return None,
        })
    }
}

/// One tensor's place in the file.
#[derive(Debug, Clone)]
pub struct GgufTensor {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, innermost first (ggml's `ne`): a matrix is `[cols, rows]`.
    pub dims: Vec<usize>,
    /// Element type.
    pub ggml_type: GgmlType,
    offset: usize,
    len: usize,
}

impl GgufTensor {
    /// Number of values.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// True when it has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A parsed, mapped GGUF file.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    file: File,
    map: Arc<Mmap>,
    /// Format version (2 or 3).
    pub version: u32,
    metadata: HashMap<String, GgufValue>,
    tensors: Vec<GgufTensor>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn err(&self, message: impl Into<String>) -> Error {
        Error::Format {
            path: self.path.display().to_string(),
            message: format!("GGUF at byte {}: {}", self.pos, message.into()),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.bytes.len() - self.pos {
            return Err(self.err(format!("needs {n} more bytes but the file ends (truncated?)")));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A count of items of at least `min_size` bytes each, checked against what remains.
    fn count(&mut self, what: &str, min_size: usize) -> Result<usize> {
        let n = self.u64()?;
        let remaining = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_size.max(1) as u64) > remaining {
            return Err(self.err(format!("{what} count {n} cannot fit in the {remaining} bytes left")));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String> {
        let n = self.count("string length", 1)?;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }

    fn value(&mut self, kind: u32, depth: usize) -> Result<GgufValue> {
        let le = |b: &[u8]| -> i128 {
            let mut buf = [0u8; 16];
            buf[..b.len()].copy_from_slice(b);
            u128::from_le_bytes(buf) as i128
        };
        Ok(match kind {
            0 => GgufValue::Int(le(self.take(1)?)),
            1 => GgufValue::Int(self.take(1)?[0] as i8 as i128),
            2 => GgufValue::Int(le(self.take(2)?)),
            3 => GgufValue::Int(i16::from_le_bytes(self.take(2)?.try_into().expect("2")) as i128),
            4 => GgufValue::Int(le(self.take(4)?)),
            5 => GgufValue::Int(i32::from_le_bytes(self.take(4)?.try_into().expect("4")) as i128),
            6 => GgufValue::Float(f32::from_le_bytes(self.take(4)?.try_into().expect("4")) as f64),
            7 => GgufValue::Bool(self.take(1)?[0] != 0),
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth > 2 {
                    return Err(self.err("arrays nested deeper than 2"));
                }
                let item = self.u32()?;
                let min = match item {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8..=12 => 8,
                    _ => return Err(self.err(format!("unknown array item type {item}"))),
                };
                let n = self.count("array", min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(item, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::Int(le(self.take(8)?)),
            11 => GgufValue::Int(i64::from_le_bytes(self.take(8)?.try_into().expect("8")) as i128),
            12 => GgufValue::Float(f64::from_le_bytes(self.take(8)?.try_into().expect("8"))),
            other => return Err(self.err(format!("unknown metadata value type {other}"))),
        })
    }
}

/// Two tensors whose bytes overlap, or one name given twice, make a file whose tensors are not
/// what they claim (one tensor's writes would show in another); llama.cpp refuses both.
fn refuse_overlaps(tensors: &[GgufTensor]) -> std::result::Result<(), String> {
    let mut names = std::collections::HashSet::new();
    if let Some(t) = tensors.iter().find(|t| !names.insert(t.name.as_str())) {
        return Err(format!("tensor {} is listed twice", t.name));
    }
    let mut by_offset: Vec<&GgufTensor> = tensors.iter().filter(|t| t.len > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].len > pair[1].offset {
            return Err(format!(
                "tensors {} and {} overlap in the file (bytes {}..{} and {}..); a corrupt file: re-convert it",
                pair[0].name,
                pair[1].name,
                pair[0].offset,
                pair[0].offset + pair[0].len,
                pair[1].offset
            ));
        }
    }
    Ok(())
}

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source| Error::Io { path: path.display().to_string(), source };
        let file = File::open(&path).map_err(io_err)?;
        // SAFETY: read-only shared map; the file must not be truncated or rewritten while in use,
        // as with every mmap-based model loader.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        Self::parse(path, file, Arc::new(map))
    }

    fn parse(path: PathBuf, file: File, map: Arc<Mmap>) -> Result<Self> {
        let mut r = Reader { bytes: &map, pos: 0, path: &path };
        if r.take(4).map_err(|_| r.err("too short to be a GGUF file"))? != b"GGUF" {
            return Err(Error::Format {
                path: path.display().to_string(),
                message: "not a GGUF file (bad magic)".into(),
            });
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(r.err(format!("version {version} is not supported (2 and 3 are)")));
        }
        // A tensor info takes at least 8 (name) + 4 + 4 + 8 bytes; a key/value at least 8 + 4 + 1.
        let tensor_count = r.count("tensor", 24)?;
        let kv_count = r.count("metadata", 13)?;
        let mut metadata = HashMap::new();
        for _ in 0..kv_count {
            let key = r.string()?;
            let kind = r.u32()?;
            let value = r.value(kind, 0)?;
            metadata.insert(key, value);
        }
        let mut infos = Vec::with_capacity(tensor_count);
        for _ in 0..tensor_count {
            let name = r.string()?;
            let n_dims = r.u32()? as usize;
            if n_dims == 0 || n_dims > 4 {
                return Err(r.err(format!("tensor {name} has {n_dims} dimensions (1 to 4 allowed)")));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(r.u64()? as usize);
            }
            let ggml_type = GgmlType::from_id(r.u32()?);
            let offset = r.u64()? as usize;
            infos.push((name, dims, ggml_type, offset));
        }
        let alignment = metadata.get("general.alignment").and_then(GgufValue::as_u64).unwrap_or(32) as usize;
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(r.err(format!("general.alignment = {alignment} is not a power of two")));
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(infos.len());
        for (name, dims, ggml_type, offset) in infos {
            let count = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let len = match (count, ggml_type.block()) {
                (Some(n), Some((per, bytes))) => {
                    if n % per != 0 {
                        return Err(r.err(format!("tensor {name}: {n} values do not fill blocks of {per}")));
                    }
                    (n / per).checked_mul(bytes)
                }
                (Some(_), None) => Some(0),
                (None, _) => None,
            }
            .ok_or_else(|| r.err(format!("tensor {name}: dimensions {dims:?} overflow")))?;
            let start = data_start.checked_add(offset).filter(|s| s.checked_add(len).is_some_and(|e| e <= map.len()));
            let Some(start) = start else {
                return Err(r.err(format!(
                    "tensor {name}: data at offset {offset} (+{len} bytes) lies past the end of the file (truncated?)"
                )));
            };
            // llama.cpp lays tensors out at aligned offsets and refuses any other layout.
            if !offset.is_multiple_of(alignment) {
                return Err(r.err(format!(
                    "tensor {name}: offset {offset} is not a multiple of general.alignment = {alignment} (a corrupt \
                     or hand-edited file; re-convert it)"
                )));
            }
            tensors.push(GgufTensor { name, dims, ggml_type, offset: start, len });
        }
        refuse_overlaps(&tensors).map_err(|m| r.err(m))?;
        Ok(GgufFile { path, file, map: map.clone(), version, metadata, tensors })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All metadata.
    pub fn metadata(&self) -> &HashMap<String, GgufValue> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// The tensors, in file order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    /// The raw bytes of `tensor`, in the mapped file.
    pub fn data(&self, tensor: &GgufTensor) -> &[u8] {
        &self.map[tensor.offset..tensor.offset + tensor.len]
    }

    /// A copy of `tensor`'s bytes, read from the file rather than through the map: a tensor that
    /// is converted at load is then never resident twice (file pages plus converted copy).
    pub fn read(&self, tensor: &GgufTensor) -> Result<Vec<u8>> {
        let mut out = vec![0u8; tensor.len];
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            self.file
                .read_exact_at(&mut out, tensor.offset as u64)
                .map_err(|source| Error::Io { path: self.path.display().to_string(), source })?;
        }
        #[cfg(not(unix))]
        out.copy_from_slice(self.data(tensor));
        Ok(out)
    }

    /// A float tensor as an array of shape `dims` reversed (outermost first), in place when
    /// its dtype allows.
    pub fn float_array(&self, tensor: &GgufTensor) -> Result<Array> {
        let dtype = match tensor.ggml_type {
            GgmlType::F32 => DType::F32,
            GgmlType::F16 => DType::F16,
            GgmlType::BF16 => DType::BF16,
            other => {
                return Err(Error::Format {
                    path: self.path.display().to_string(),
                    message: format!("tensor {} is {other:?}, not a float type", tensor.name),
                })
            }
        };
        let shape: Vec<usize> = tensor.dims.iter().rev().copied().collect();
        let bytes = if tensor.offset.is_multiple_of(dtype.size()) {
            Bytes::Mapped { map: self.map.clone(), offset: tensor.offset, len: tensor.len }
        } else {
            Bytes::copy_of(self.data(tensor))
        };
        Array::from_bytes(bytes, shape, dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("nuvec-gguf-test-{}-{n}.gguf", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let out = GgufFile::open(&path);
        std::fs::remove_file(&path).ok();
        out
    }

    fn header(tensors: u64, kvs: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(tensors.to_le_bytes());
        b.extend(kvs.to_le_bytes());
        b
    }

    #[test]
    fn rejects_bad_magic_and_version() {
        assert!(parse_bytes(b"GGML\x03\0\0\0".to_vec()).unwrap_err().to_string().contains("bad magic"));
        let mut b = header(0, 0);
        b[4] = 9;
        assert!(parse_bytes(b).unwrap_err().to_string().contains("version 9"));
    }

    #[test]
    fn rejects_absurd_counts_without_allocating() {
        let err = parse_bytes(header(u64::MAX, 0)).unwrap_err().to_string();
        assert!(err.contains("tensor count"), "{err}");
        let err = parse_bytes(header(0, 1 << 40)).unwrap_err().to_string();
        assert!(err.contains("metadata count"), "{err}");
    }

    #[test]
    fn rejects_truncated_strings_and_offsets_past_the_end() {
        let mut b = header(0, 1);
        b.extend(1000u64.to_le_bytes());
        b.extend(b"key");
        b.extend([0u8; 16]);
        assert!(parse_bytes(b).unwrap_err().to_string().contains("string length"));

        let mut b = header(1, 0);
        b.extend(1u64.to_le_bytes());
        b.push(b'w');
        b.extend(2u32.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        let err = parse_bytes(b).unwrap_err().to_string();
        assert!(err.contains("past the end"), "{err}");
    }

    #[test]
    fn rejects_unknown_value_types() {
        let mut b = header(0, 1);
        b.extend(1u64.to_le_bytes());
        b.push(b'k');
        b.extend(77u32.to_le_bytes());
        b.extend([0u8; 16]);
        assert!(parse_bytes(b).unwrap_err().to_string().contains("unknown metadata value type 77"));
    }
}
