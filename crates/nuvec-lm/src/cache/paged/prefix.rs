//! The hash chain of a sequence's full blocks: block `i`'s hash covers its parent's hash and
//! its own tokens, so equal hashes mean equal prefixes (the pool compares the content too).

use std::hash::{Hash, Hasher};

/// The parent hash of a sequence's first block.
pub(crate) const ROOT: u64 = 0x6e75_7665_635f_7078;

/// The hash of a block holding `tokens` after the prefix hashed `parent`.
pub(crate) fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: the same in every process, so hits do not depend on the run.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}
