//! A sequence's keys and values for one layer of a [`super::PagedCache`]: a block table into
//! the layer's shared pool. New positions are written into the table's blocks; attention reads
//! the sequence's blocks, gathered into one array (a row gather and a transpose: the attention
//! op then reads exactly the values a plain cache would hold, so the result is the same bit for
//! bit; a kernel reading the blocks in place is the next step).

use std::sync::{Arc, Mutex};

use nuvec::Array;

use super::pool::{lock, LayerPool};
use crate::cache::ops::{sdpa, Sinks};
use crate::cache::Positions;
use crate::{Error, Result};

/// One layer of one paged sequence.
#[derive(Debug)]
pub struct PagedKv {
    pool: Arc<Mutex<LayerPool>>,
    table: Vec<u32>,
    len: usize,
}

impl PagedKv {
    pub(crate) fn new(pool: Arc<Mutex<LayerPool>>) -> Self {
        PagedKv { pool, table: vec![], len: 0 }
    }

    /// The block ids this sequence holds, in position order.
    pub fn block_table(&self) -> &[u32] {
        &self.table
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, LayerPool> {
        lock(&self.pool)
    }

    /// Appends `keys, values [L, kv_heads, head_dim]`, taking blocks as needed; on error (the
    /// pool ran out) nothing is written and the blocks taken are given back.
    pub(crate) fn write(&mut self, keys: &Array, values: &Array) -> Result<()> {
        let (l, heads, dim) = (keys.dim(0), keys.dim(1), keys.dim(2));
        let pool = self.pool.clone();
        let mut pool = lock(&pool);
        let bs = pool.block_size();
        let needed = (self.len + l).div_ceil(bs);
        let had = self.table.len();
        while self.table.len() < needed {
            match pool.take(heads, dim, keys.device()) {
                Ok(id) => self.table.push(id),
                Err(e) => {
                    pool.give_back(self.table.drain(had..));
                    return Err(e);
                }
            }
        }
        let mut at = 0;
        while at < l {
            let pos = self.len + at;
            let (id, within) = (self.table[pos / bs] as usize, pos % bs);
            let n = (bs - within).min(l - at);
            if n == l {
                pool.write(id * bs + within, keys, values)?;
            } else {
                pool.write(id * bs + within, &keys.slice_rows(at, at + n)?, &values.slice_rows(at, at + n)?)?;
            }
            at += n;
        }
        self.len += l;
        Ok(())
    }

    /// The held keys and values, `[kv_heads, blocks * block_size, head_dim]` each (valid up to
    /// `offset()`).
    pub(crate) fn gathered(&self) -> Result<(Array, Array)> {
        if self.table.is_empty() {
            return Err(Error::Invalid("a paged sequence with no positions has nothing to attend".into()));
        }
        self.pool().gather(&self.table)
    }

    /// Adds `keys, values [L, kv_heads, head_dim]` and attends `q [L, heads, head_dim]` over
    /// every position held (causal within the new ones), as a plain cache does.
    pub(crate) fn attend(
        &mut self,
        q: &Array,
        keys: &Array,
        values: &Array,
        scale: f32,
        sinks: Sinks,
    ) -> Result<Array> {
        self.write(keys, values)?;
        let (k, v) = self.gathered()?;
        sdpa(q, &k, &v, self.len, scale, sinks)
    }

    /// Gives every block back (the sequence is removed).
    pub(crate) fn release(&mut self) {
        let table = std::mem::take(&mut self.table);
        self.pool().give_back(table);
        self.len = 0;
    }
}

impl Positions for PagedKv {
    fn offset(&self) -> usize {
        self.len
    }

    /// Removes exactly `n` positions; blocks no position uses any more go back to the pool.
    fn trim(&mut self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(Error::Invalid(format!(
                "cannot trim {n} positions from a paged sequence holding {}",
                self.len
            )));
        }
        self.len -= n;
        let keep = self.len.div_ceil(self.pool().block_size());
        let freed: Vec<u32> = self.table.drain(keep..).collect();
        self.pool().give_back(freed);
        Ok(())
    }
}

impl Drop for PagedKv {
    fn drop(&mut self) {
        self.release();
    }
}
