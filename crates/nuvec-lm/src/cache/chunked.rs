//! mlx-lm's `ChunkedKVCache`: attention within fixed chunks of positions (Llama 4's local
//! layers). A query at position `p` sees the positions of its own chunk up to itself,
//! `[p / chunk * chunk, p]`, so the cache only needs the last `chunk_size` positions; it drops
//! older ones at the start of each forward pass (`maybe_trim_front`), as mlx-lm does.

use nuvec::Array;

use super::kv::KvCache;
use super::ops::attend_ranges;
use super::Positions;
use crate::{Error, Result};

/// Keys and values of one chunked-attention layer.
#[derive(Debug)]
pub struct ChunkedKvCache {
    /// Positions `start..offset`.
    held: KvCache,
    /// The first position still held.
    start: usize,
    chunk_size: usize,
}

impl ChunkedKvCache {
    /// An empty cache attending within chunks of `chunk_size` positions.
    pub fn new(chunk_size: usize) -> Result<Self> {
        if chunk_size == 0 {
            return Err(Error::Invalid("attention_chunk_size = 0: a chunk must hold at least one position".into()));
        }
        Ok(ChunkedKvCache { held: KvCache::new(), start: 0, chunk_size })
    }

    /// An empty cache whose next position is `start` (everything before it was dropped or trimmed).
    pub fn empty_at(start: usize, chunk_size: usize) -> Result<Self> {
        Ok(ChunkedKvCache { start, ..ChunkedKvCache::new(chunk_size)? })
    }

    /// Positions seen.
    pub fn offset(&self) -> usize {
        self.start + self.held.offset()
    }

    /// The first position still held (mlx-lm's `start_position`).
    pub fn start(&self) -> usize {
        self.start
    }

    /// The chunk length.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Keeps only the last `chunk_size` positions (mlx-lm's `maybe_trim_front`, which its model
    /// calls before each forward pass). Every position a later query can see stays.
    pub fn maybe_trim_front(&mut self) -> Result<()> {
        let valid = self.held.offset();
        if valid <= self.chunk_size {
            return Ok(());
        }
        let dropped = valid - self.chunk_size;
        let (k, v) = self.held.state()?.expect("a cache holding positions has state");
        let keep = |a: &Array| super::ops::slice_axis1(a, dropped, valid);
        self.held = KvCache::from_state(&keep(&k)?, &keep(&v)?)?;
        self.start += dropped;
        Ok(())
    }

    /// Removes exactly the last `n` positions (only those still held can go), or errors leaving
    /// the cache unchanged. mlx-lm trims fewer without a word when asked for more.
    pub fn trim(&mut self, n: usize) -> Result<()> {
        if n > self.held.offset() {
            return Err(Error::Invalid(format!(
                "cannot trim {n} positions from a chunked cache holding {} (positions {}..{}; older ones were \
                 dropped at a chunk boundary)",
                self.held.offset(),
                self.start,
                self.offset()
            )));
        }
        self.held.trim(n)
    }

    /// Adds `keys, values [L, kv_heads, head_dim]` and attends `q [L, heads, head_dim]` within
    /// each query's chunk. It first drops what no query can see any more (mlx-lm does that at the
    /// start of the forward pass, before any layer runs: the same thing, as each layer's cache is
    /// touched once per pass).
    pub fn attend(&mut self, q: &Array, keys: &Array, values: &Array, scale: f32) -> Result<Array> {
        self.maybe_trim_front()?;
        let first_query = self.offset();
        let (k, v) = self.held.update_and_fetch_rows(keys, values)?;
        let (start, chunk) = (self.start, self.chunk_size);
        attend_ranges(q, &k, &v, scale, None, |i| {
            let position = first_query + i;
            let chunk_start = (position / chunk * chunk).max(start);
            chunk_start - start..position + 1 - start
        })
    }

    /// The keys and values held `[kv_heads, n, head_dim]` and the first position they stand for.
    pub fn state(&self) -> Result<Option<(Array, Array, usize)>> {
        Ok(self.held.state()?.map(|(k, v)| (k, v, self.start)))
    }

    /// A cache holding `keys, values [kv_heads, n, head_dim]` for positions `start..start + n`.
    pub fn from_state(keys: &Array, values: &Array, start: usize, chunk_size: usize) -> Result<Self> {
        let mut cache = ChunkedKvCache::new(chunk_size)?;
        cache.held = KvCache::from_state(keys, values)?;
        cache.start = start;
        Ok(cache)
    }
}
