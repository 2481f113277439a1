//! The bytes behind an array: owned and 8-byte aligned, or a window of a memory-mapped file.

use std::sync::Arc;

use memmap2::Mmap;

/// Host memory holding an array's elements.
#[derive(Debug)]
pub(crate) enum Bytes {
    /// Owned; `u64` storage keeps every element type aligned.
    Owned { words: Vec<u64>, len: usize },
    /// A window of a mapped file, aligned to its element size (checked when made).
    Mapped { map: Arc<Mmap>, offset: usize, len: usize },
    /// Device memory (cargo feature `cuda`); read as host bytes through a copy made on demand.
    #[cfg(feature = "cuda")]
    Cuda(crate::backends::cuda::DeviceBuffer),
}

impl Bytes {
    pub(crate) fn zeroed(len: usize) -> Self {
        Bytes::Owned { words: vec![0u64; len.div_ceil(8)], len }
    }

    pub(crate) fn copy_of(bytes: &[u8]) -> Self {
        let mut out = Self::zeroed(bytes.len());
        out.as_mut_bytes().copy_from_slice(bytes);
        out
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Bytes::Owned { words, len } => &bytemuck::cast_slice(words)[..*len],
            Bytes::Mapped { map, offset, len } => &map[*offset..*offset + *len],
            #[cfg(feature = "cuda")]
            Bytes::Cuda(b) => b.host_mirror(),
        }
    }

    /// Writable bytes; a mapped window (or device memory) is copied into owned memory first.
    pub(crate) fn as_mut_bytes(&mut self) -> &mut [u8] {
        if !matches!(self, Bytes::Owned { .. }) {
            *self = Bytes::copy_of(self.as_bytes());
        }
        match self {
            Bytes::Owned { words, len } => &mut bytemuck::cast_slice_mut(words)[..*len],
            _ => unreachable!("replaced by an owned copy above"),
        }
    }
}
