//! Per-layer caches of past keys and values.
//!
//! Every cache kind keeps an exact trim contract: `trim(n)` removes exactly `n` positions or
//! returns an error, never silently fewer.

mod kv;

pub use kv::KvCache;

use crate::Result;

/// What every layer cache offers generation.
pub trait LayerCache {
    /// Positions held.
    fn offset(&self) -> usize;
    /// Removes exactly the last `n` positions, or errors leaving the cache unchanged.
    fn trim(&mut self, n: usize) -> Result<()>;
}
