//! One layer's block pool: `blocks` blocks of `block_size` positions of keys and values
//! (`[kv_heads, block_size, head_dim]` each, made on first use), handed out and taken back
//! through a free list.

use nuvec::{Array, DType, Device};

use crate::{Error, Result};

/// The keys and values of one block.
#[derive(Debug)]
pub(crate) struct Block {
    pub keys: Array,
    pub values: Array,
}

/// Blocks of one attention layer, shared by every sequence of a [`super::PagedCache`].
#[derive(Debug)]
pub(crate) struct LayerPool {
    block_size: usize,
    dtype: DType,
    blocks: Vec<Option<Block>>,
    /// Free block ids; the most recently freed is handed out first (still warm in cache).
    free: Vec<u32>,
}

impl LayerPool {
    pub fn new(blocks: usize, block_size: usize, dtype: DType) -> Self {
        LayerPool {
            block_size,
            dtype,
            blocks: (0..blocks).map(|_| None).collect(),
            free: (0..blocks as u32).rev().collect(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    pub fn total_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Takes a free block for `heads` heads of `dim` features on `device`.
    pub fn take(&mut self, heads: usize, dim: usize, device: Device) -> Result<u32> {
        let Some(id) = self.free.pop() else {
            return Err(Error::Invalid(format!(
                "the paged cache is full: all {} blocks of {} positions are in use; remove a sequence or \
                 make the cache with more blocks",
                self.blocks.len(),
                self.block_size
            )));
        };
        let slot = &mut self.blocks[id as usize];
        let fits =
            slot.as_ref().is_some_and(|b| b.keys.shape() == [heads, self.block_size, dim] && b.keys.device() == device);
        if !fits {
            let make = || Array::zeros_on(&[heads, self.block_size, dim], self.dtype, device);
            match (make(), make()) {
                (Ok(keys), Ok(values)) => *slot = Some(Block { keys, values }),
                (Err(e), _) | (_, Err(e)) => {
                    self.free.push(id);
                    return Err(e.into());
                }
            }
        }
        Ok(id)
    }

    /// Returns `ids` to the free list.
    pub fn give_back(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.free.extend(ids);
    }

    pub fn block(&self, id: u32) -> &Block {
        self.blocks[id as usize].as_ref().expect("a block in use was made when taken")
    }

    pub fn block_mut(&mut self, id: u32) -> &mut Block {
        self.blocks[id as usize].as_mut().expect("a block in use was made when taken")
    }
}
