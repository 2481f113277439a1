//! A caching allocator in front of the stream-ordered `cuMemAllocAsync` / `cuMemFreeAsync`.
//!
//! Every op allocates its output and every dropped array frees one: two driver calls per op,
//! about as much host time as the launch itself on a decode step. Each device has exactly one
//! stream and all work on its memory is ordered on it, so a buffer dropped on the host can be
//! handed to the next allocation at once: whatever kernel still reads it was enqueued before
//! whatever kernel will write it. Freed buffers are kept per size class (powers of two up to
//! 1 MiB, multiples of 64 KiB above) up to a bound on the bytes kept; buffers over 256 MiB are
//! not kept. When the driver cannot allocate, the cache is handed back and the allocation tried
//! once more, so the cache never causes an out-of-memory error that would not happen without it.

use std::collections::HashMap;

use cudarc::driver::CudaSlice;

use super::{state, State};
use crate::{Error, Result};

/// Sizes up to this are rounded up to a power of two (at least `MIN_CLASS`).
const SMALL_MAX: usize = 1 << 20;
const MIN_CLASS: usize = 256;
/// Larger sizes are rounded up to a multiple of this.
const LARGE_STEP: usize = 64 << 10;
/// Buffers above this go back to the driver when dropped (its pool keeps the memory anyway;
/// the ops that use them run long enough that two driver calls do not matter).
const MAX_KEPT_BUFFER: usize = 256 << 20;
/// Default bound on the bytes kept, per device (`NUVEC_CUDA_ALLOC_CACHE_MB` overrides; 0 turns
/// the cache off).
pub(super) const DEFAULT_LIMIT: usize = 1 << 30;

/// The bytes actually allocated for a request of `len`.
fn size_class(len: usize) -> usize {
    let len = len.max(1);
    if len <= SMALL_MAX {
        len.next_power_of_two().max(MIN_CLASS)
    } else if len <= MAX_KEPT_BUFFER {
        len.next_multiple_of(LARGE_STEP)
    } else {
        len
    }
}

/// One device's freed buffers, by size class.
pub(crate) struct Cache {
    free: HashMap<usize, Vec<CudaSlice<u8>>>,
    /// Bytes held in `free`.
    kept: usize,
    /// The most bytes `free` may hold.
    limit: usize,
}

impl Cache {
    /// An empty cache keeping at most `limit` bytes (`NUVEC_CUDA_ALLOC_CACHE_MB`, knobs.rs).
    pub(crate) fn new(limit: usize) -> Self {
        Cache { free: HashMap::new(), kept: 0, limit }
    }

    /// Every kept buffer, leaving the cache empty.
    fn drain(&mut self) -> Vec<CudaSlice<u8>> {
        self.kept = 0;
        self.free.drain().flat_map(|(_, v)| v).collect()
    }
}

impl State {
    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `len` bytes: a kept one of the size class, else a fresh one (after
    /// handing the cache back to the driver if the first attempt fails).
    pub(super) fn take_or_alloc(&self, len: usize) -> Result<CudaSlice<u8>> {
        let class = size_class(len);
        {
            let mut cache = self.cache();
            if let Some(slice) = cache.free.get_mut(&class).and_then(Vec::pop) {
                cache.kept -= class;
                return Ok(slice);
            }
        }
        // SAFETY: the bytes are written before they are read (callers fill the whole buffer, or
        // zero it); u8 has no invalid values.
        match unsafe { self.stream.alloc::<u8>(class) } {
            Ok(slice) => Ok(slice),
            Err(first) => {
                if self.flush() == 0 {
                    return Err(self.alloc_error(len, first));
                }
                // SAFETY: as above.
                unsafe { self.stream.alloc::<u8>(class) }.map_err(|e| self.alloc_error(len, e))
            }
        }
    }

    fn alloc_error(&self, len: usize, e: cudarc::driver::DriverError) -> Error {
        Error::Device(format!("cuda:{}: allocating {len} bytes: {e:?}", self.ordinal))
    }

    /// Keeps a dropped buffer for reuse, or frees it (stream-ordered) when it is too large or
    /// the cache is full.
    pub(super) fn recycle(&self, slice: CudaSlice<u8>) {
        let class = slice.len();
        if class > MAX_KEPT_BUFFER || class != size_class(class) {
            drop(slice);
            return;
        }
        let mut cache = self.cache();
        if cache.kept + class <= cache.limit {
            cache.kept += class;
            cache.free.entry(class).or_default().push(slice);
            return;
        }
        drop(cache);
        drop(slice);
    }

    /// Frees every kept buffer; returns the bytes handed back.
    fn flush(&self) -> usize {
        let (bytes, slices) = {
            let mut cache = self.cache();
            let bytes = cache.kept;
            (bytes, cache.drain())
        };
        // Dropping a slice enqueues its free on the stream, after the work already there.
        drop(slices);
        bytes
    }
}

/// Bytes of freed buffers device `ordinal` keeps for reuse (at most the limit, see
/// [`set_cache_limit`]).
pub fn cached_bytes(ordinal: usize) -> Result<usize> {
    Ok(state(ordinal)?.cache().kept)
}

/// Bytes device `ordinal` can still hand out: what the driver reports free plus the freed
/// buffers this process keeps for reuse.
pub fn available_bytes(ordinal: usize) -> Result<usize> {
    let st = state(ordinal)?;
    let (free, _total) =
        st.stream.context().mem_get_info().map_err(|e| Error::Device(format!("cuda:{ordinal}: memory info: {e:?}")))?;
    Ok(free + st.cache().kept)
}

/// Sets the most bytes of freed buffers device `ordinal` keeps for reuse (default 1 GiB, or
/// `NUVEC_CUDA_ALLOC_CACHE_MB` MiB; 0 turns the cache off). Buffers kept beyond the new limit
/// are freed now.
pub fn set_cache_limit(ordinal: usize, bytes: usize) -> Result<()> {
    let st = state(ordinal)?;
    let excess = {
        let mut cache = st.cache();
        cache.limit = bytes;
        if cache.kept > bytes {
            cache.drain()
        } else {
            Vec::new()
        }
    };
    drop(excess);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_cover_the_request_and_are_fixed_points() {
        for len in [0, 1, 255, 256, 257, 4096, 12_288, 607_744, SMALL_MAX, SMALL_MAX + 1, 64 << 20, 300 << 20] {
            let c = size_class(len);
            assert!(c >= len.max(1), "{len} -> {c}");
            assert_eq!(size_class(c), c, "{len} -> {c} is not its own class");
            if len <= MAX_KEPT_BUFFER {
                assert!(c < 2 * len.max(MIN_CLASS), "{len} -> {c} wastes too much");
            }
        }
        assert_eq!(size_class(300 << 20), 300 << 20);
    }
}
