//! [`Model::warm_up`]: what a first request would pay, paid before any arrives.

use crate::cache::paged::{decode_batch, PagedCache, DEFAULT_BLOCK_SIZE};
use crate::{Model, Result};

impl Model {
    /// Runs the model once as requests will: a prefill of a few tokens and a one-token step in a
    /// cache of its own, then a step of two sequences in a small paged cache (the batched path a
    /// server's steps take). So the device's kernels are compiled and loaded (on a GPU, NVRTC's
    /// compile of each kernel module at its first use, which can take a minute), the CPU's
    /// threads started and the buffers allocated before the first request, which then pays none
    /// of it. The caches it used are dropped: the model is left as it was, and the tokens of any
    /// later generation are those it would give without it. `nuvec serve` calls it before it
    /// listens.
    pub fn warm_up(&self) -> Result<()> {
        // Ids every vocabulary has; the logits are not looked at.
        let tokens: Vec<u32> = (1..=4u32).map(|t| t.min(self.vocab_size().saturating_sub(1) as u32)).collect();
        let mut cache = self.new_cache();
        self.prefill(&tokens[..3], &mut cache)?;
        self.forward_last(&tokens[3..], &mut cache)?.to_f32_vec()?;
        let mut paged = PagedCache::new(self, 4, DEFAULT_BLOCK_SIZE, 2)?;
        let ids = [paged.add()?, paged.add()?];
        paged.step(self, &[(ids[0], &tokens[..3]), (ids[1], &tokens[..2])])?;
        decode_batch(self, &tokens[..2], &ids, &mut paged)?.to_f32_vec()?;
        Ok(())
    }
}
