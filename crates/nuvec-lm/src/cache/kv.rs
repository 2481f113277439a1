//! The plain KV cache: keys and values `[kv_heads, capacity, head_dim]`, grown in blocks.

use nuvec::{Array, DType, Device};

use super::Positions;
use crate::{Error, Result};

/// Positions added at a time when the cache grows (mlx-lm's step).
const STEP: usize = 256;

/// Keys and values of one attention layer.
#[derive(Debug)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    /// The element type stored (new positions are narrowed to it as they are written).
    dtype: DType,
}

impl Default for KvCache {
    fn default() -> Self {
        KvCache::with_dtype(DType::F32)
    }
}

impl KvCache {
    /// An empty f32 cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache storing `dtype` (f32, f16 or bf16).
    pub fn with_dtype(dtype: DType) -> Self {
        KvCache { keys: None, values: None, offset: 0, dtype }
    }

    /// Appends `keys, values [kv_heads, L, head_dim]` and returns the whole buffers (valid up to
    /// `offset()`).
    pub fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (h, l, d) = (keys.dim(0), keys.dim(1), keys.dim(2));
        self.reserve(h, l, d, keys.device())?;
        let (k, v) = (self.keys.as_mut().expect("allocated above"), self.values.as_mut().expect("allocated above"));
        k.write_axis1(keys, self.offset)?;
        v.write_axis1(values, self.offset)?;
        self.offset += l;
        Ok((k.clone(), v.clone()))
    }

    /// [`KvCache::update_and_fetch`] with `keys, values [L, kv_heads, head_dim]` (positions first,
    /// as the projections produce them): written into the cache without a transposed copy.
    pub fn update_and_fetch_rows(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (l, h, d) = (keys.dim(0), keys.dim(1), keys.dim(2));
        self.reserve(h, l, d, keys.device())?;
        let (k, v) = (self.keys.as_mut().expect("allocated above"), self.values.as_mut().expect("allocated above"));
        // Both writes as one op (one launch on a GPU).
        k.write_kv_rows(v, keys, values, self.offset)?;
        self.offset += l;
        Ok((k.clone(), v.clone()))
    }

    /// Adds `l` positions of `h` heads of `d` features through `write(keys, values, at)`, which
    /// writes them into the cache buffers at position `at` and returns the queries (it may make
    /// them along: the rope of queries and keys with the cache write is one op on a GPU), then
    /// attends those queries over the cache as [`super::LayerCache::attend_with_sinks`] does.
    pub fn attend_written(
        &mut self,
        (l, h, d): (usize, usize, usize),
        device: Device,
        (scale, sinks): (f32, Option<&[f32]>),
        write: impl FnOnce(&mut Array, &mut Array, usize) -> Result<Array>,
    ) -> Result<Array> {
        self.reserve(h, l, d, device)?;
        let (k, v) = (self.keys.as_mut().expect("allocated above"), self.values.as_mut().expect("allocated above"));
        let q = write(k, v, self.offset)?;
        self.offset += l;
        super::ops::sdpa(&q, k, v, self.offset, scale, sinks)
    }

    /// Makes room for `l` more positions of `h` heads of `d` features.
    fn reserve(&mut self, h: usize, l: usize, d: usize, keys_device: Device) -> Result<()> {
        let needed = self.offset + l;
        let device = self.keys.as_ref().map(Array::device);
        if device.is_some_and(|d| d != keys_device) {
            // A cache restored on another device (a prompt-cache file read on the host) follows
            // the keys.
            for buffer in [&mut self.keys, &mut self.values].into_iter().flatten() {
                *buffer = buffer.to_device(keys_device)?;
            }
        }
        let capacity = self.keys.as_ref().map_or(0, |k| k.dim(1));
        if needed > capacity {
            let grown = needed.div_ceil(STEP) * STEP;
            for buffer in [&mut self.keys, &mut self.values] {
                let mut fresh = Array::zeros_on(&[h, grown, d], self.dtype, keys_device)?;
                if let Some(old) = buffer.take() {
                    if self.offset == old.dim(1) {
                        // Full (as after every whole step of a long prompt): all of it, as it is.
                        fresh.write_axis1(&old, 0)?;
                    } else if self.offset > 0 {
                        let kept = old.transpose01()?.slice_rows(0, self.offset)?.transpose01()?;
                        fresh.write_axis1(&kept, 0)?;
                    }
                }
                *buffer = Some(fresh);
            }
        }
        Ok(())
    }
}

impl Positions for KvCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn trim(&mut self, n: usize) -> Result<()> {
        if n > self.offset {
            return Err(Error::Invalid(format!("cannot trim {n} positions from a cache holding {}", self.offset)));
        }
        self.offset -= n;
        Ok(())
    }
}

impl KvCache {
    /// The keys and values held, `[kv_heads, offset, head_dim]` each (`None` when empty): what a
    /// prompt-cache file stores.
    pub fn state(&self) -> Result<Option<(Array, Array)>> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(None);
        };
        let held = |a: &Array| -> Result<Array> { Ok(a.transpose01()?.slice_rows(0, self.offset)?.transpose01()?) };
        Ok(Some((held(k)?, held(v)?)))
    }

    /// A cache holding `keys, values [kv_heads, n, head_dim]`.
    pub fn from_state(keys: &Array, values: &Array) -> Result<Self> {
        if keys.shape().len() != 3 || keys.shape() != values.shape() {
            let message =
                format!("keys {:?} and values {:?} are not [heads, positions, dim]", keys.shape(), values.shape());
            return Err(Error::Invalid(message));
        }
        let mut cache = KvCache::with_dtype(keys.dtype());
        if keys.dim(1) > 0 {
            cache.update_and_fetch(keys, values)?;
        }
        Ok(cache)
    }
}

// Gemma 4
impl KvCache {
    /// The buffers `[kv_heads, capacity, head_dim]` (valid up to [`Positions::offset`]), `None`
    /// before the first update.
    pub fn buffers(&self) -> Option<(&Array, &Array)> {
        Some((self.keys.as_ref()?, self.values.as_ref()?))
    }
}

// CUDA graphs: a replayed decode step wrote the cache on the device; the host only moves on.
impl KvCache {
    /// Positions the buffers hold before they must grow (0 before the first update).
    pub fn capacity(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.dim(1))
    }

    /// The element type stored.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Counts `n` more positions as held without writing anything: for a caller that wrote
    /// them into the buffers itself (a replayed CUDA graph of a decode step). Errors, leaving
    /// the cache unchanged, when the buffers have no room for them.
    pub fn advance(&mut self, n: usize) -> Result<()> {
        let capacity = self.capacity();
        if self.offset + n > capacity {
            return Err(Error::Invalid(format!(
                "cannot advance a cache holding {} of {capacity} positions by {n}",
                self.offset
            )));
        }
        self.offset += n;
        Ok(())
    }
}

#[cfg(test)]
mod advance_tests {
    use super::*;

    #[test]
    fn advance_moves_the_offset_within_capacity_only() {
        let mut c = KvCache::new();
        assert!(c.advance(1).is_err(), "an empty cache has no room");
        assert_eq!(c.advance(0).ok(), Some(()));
        let kv = Array::from_slice(&[1f32; 2 * 3 * 4], &[2, 3, 4]).unwrap();
        c.update_and_fetch(&kv, &kv).unwrap();
        assert_eq!((c.offset(), c.capacity()), (3, STEP));
        c.advance(STEP - 3).unwrap();
        assert_eq!(c.offset(), STEP);
        let err = c.advance(1).unwrap_err().to_string();
        assert!(err.contains("256 of 256"), "{err}");
        assert_eq!(c.offset(), STEP, "a refused advance changes nothing");
        c.trim(STEP - 3).unwrap();
        assert_eq!(c.offset(), 3);
    }
}

#[cfg(test)]
mod growth_tests {
    use super::*;

    /// Growing a full cache copies it whole; growing a partly filled one copies its held rows.
    /// Either way every position written reads back, in its place, for every head.
    #[test]
    fn growing_keeps_every_held_position() {
        let (h, d) = (2usize, 3usize);
        let rows = |start: usize, n: usize| -> Array {
            let data: Vec<f32> = (0..n * h * d).map(|i| (start * h * d + i) as f32).collect();
            Array::from_slice(&data, &[n, h, d]).unwrap()
        };
        for first in [STEP, STEP - 5] {
            let mut c = KvCache::new();
            c.update_and_fetch_rows(&rows(0, first), &rows(0, first)).unwrap();
            let (k, _) = c.update_and_fetch_rows(&rows(first, 7), &rows(first, 7)).unwrap();
            assert_eq!((c.offset(), k.dim(1)), (first + 7, 2 * STEP));
            let got = k.to_vec::<f32>().unwrap();
            for p in 0..first + 7 {
                for head in 0..h {
                    for f in 0..d {
                        let want = ((p * h + head) * d + f) as f32;
                        assert_eq!(got[(head * 2 * STEP + p) * d + f], want, "first={first} p={p} head={head}");
                    }
                }
            }
        }
    }
}
