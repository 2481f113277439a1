//! One layer's block pool: keys and values of `blocks` blocks of `block_size` positions, held as
//! one array each, `[1, blocks * block_size, kv_heads * head_dim]` (positions first, as the
//! projections produce them; made on first use), and a free list of block ids.

use std::sync::{Mutex, MutexGuard};

use nuvec::{Array, DType, Device, Matrix};

use crate::{Error, Result};

/// Blocks of one attention layer, shared by every sequence of a [`super::PagedCache`].
#[derive(Debug)]
pub(crate) struct LayerPool {
    block_size: usize,
    blocks: usize,
    dtype: DType,
    /// Keys and values, and the heads and head size they were made for.
    store: Option<(Array, Array, [usize; 2])>,
    /// Free block ids; the most recently freed is handed out first (still warm in cache).
    free: Vec<u32>,
}

impl LayerPool {
    pub fn new(blocks: usize, block_size: usize, dtype: DType) -> Self {
        LayerPool { block_size, blocks, dtype, store: None, free: (0..blocks as u32).rev().collect() }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    pub fn total_blocks(&self) -> usize {
        self.blocks
    }

    /// Takes a free block, for keys of `heads` heads of `dim` features on `device` (the pool's
    /// arrays are made at the first take).
    pub fn take(&mut self, heads: usize, dim: usize, device: Device) -> Result<u32> {
        if self.free.is_empty() {
            return Err(Error::Invalid(format!(
                "the paged cache is full: all {} blocks of {} positions are in use; remove a sequence or \
                 make the cache with more blocks",
                self.blocks, self.block_size
            )));
        }
        match &self.store {
            Some((k, _, shape)) if *shape == [heads, dim] && k.device() == device => {}
            Some((_, _, shape)) => {
                return Err(Error::Invalid(format!(
                    "a paged layer made for {} heads of {} features on its first write was given {heads} of {dim}",
                    shape[0], shape[1]
                )))
            }
            None => {
                let shape = [1, self.blocks * self.block_size, heads * dim];
                let keys = Array::zeros_on(&shape, self.dtype, device)?;
                let values = Array::zeros_on(&shape, self.dtype, device)?;
                self.store = Some((keys, values, [heads, dim]));
            }
        }
        Ok(self.free.pop().expect("checked above"))
    }

    /// Returns `ids` to the free list.
    pub fn give_back(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.free.extend(ids);
    }

    /// Writes `keys, values [n, heads, dim]` at physical position `at` (within one block).
    pub fn write(&mut self, at: usize, keys: &Array, values: &Array) -> Result<()> {
        let (k, v, [heads, dim]) = self.store.as_mut().expect("a block was taken, so the store exists");
        let n = keys.dim(0);
        k.write_axis1(&keys.reshape(&[1, n, *heads * *dim])?, at)?;
        v.write_axis1(&values.reshape(&[1, n, *heads * *dim])?, at)?;
        Ok(())
    }

    /// The blocks of `table`, in order, as keys and values `[heads, table.len() * block_size,
    /// dim]` in f32 (the layout attention reads): one row gather and one transpose each.
    pub fn gather(&self, table: &[u32]) -> Result<(Array, Array)> {
        let (k, v, [heads, dim]) = self.store.as_ref().expect("a block was taken, so the store exists");
        let bs = self.block_size;
        let one = |a: &Array| -> Result<Array> {
            let rows = Matrix::Dense(a.reshape(&[self.blocks, bs * heads * dim])?).embed(table)?;
            Ok(rows.reshape(&[table.len() * bs, *heads, *dim])?.transpose01()?)
        };
        Ok((one(k)?, one(v)?))
    }
}

/// The pool behind `pool`: a panic while it was held cannot leave a block half handed out (the
/// free list changes in single pushes and pops), so a poisoned lock is taken as it is.
pub(crate) fn lock(pool: &Mutex<LayerPool>) -> MutexGuard<'_, LayerPool> {
    pool.lock().unwrap_or_else(|p| p.into_inner())
}
