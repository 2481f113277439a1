//! The hash chain of a sequence's full blocks: block `i`'s hash covers its parent's hash, how
//! its keys and values were computed, and its own tokens, so equal hashes mean equal prefixes
//! computed alike (the pool compares the content too).

use std::hash::{Hash, Hasher};

use crate::adapter::AdapterId;

/// The parent hash of a sequence's first block, for the base model.
pub(crate) const ROOT: u64 = 0x6e75_7665_635f_7078;

/// What besides its tokens decides which sequences may share a sequence's blocks: the served
/// adapter its rows take (another adapter computes other keys and values) and a request's cache
/// salt (vLLM's `cache_salt`: requests of different salts never share, so one tenant cannot
/// learn from timing what another's prompts were). The default, no adapter and no salt, is the
/// base model's shared pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PrefixScope {
    /// The served adapter the sequence's rows take.
    pub adapter: Option<AdapterId>,
    /// The request's cache salt.
    pub salt: Option<String>,
}

impl PrefixScope {
    /// The parent hash of the sequence's first block: [`ROOT`] for the default scope, else one
    /// of the scope's own, so its hash chain meets no other scope's.
    pub(crate) fn root(&self) -> u64 {
        if *self == PrefixScope::default() {
            return ROOT;
        }
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new();
        ROOT.hash(&mut h);
        self.hash(&mut h);
        h.finish()
    }
}

/// How the rows of a block were computed, which decides whose bits they are.
///
/// A row's keys and values depend on the pass that computed it, not only on its tokens: the
/// products take other paths for other row counts, and attention splits its work by the pass's
/// start. In the default mode passes mix sequences anyway, so every block is `Batched` and a
/// hit matches a cold run to rounding. In batch-invariant mode a request's solo run computes
/// its prompt in chunks of `c` rows starting at multiples of `c`; a block whose rows all came
/// from such passes is `Chunks(c)`, and only those serve a hit there, so a hit is bit for bit
/// the cold run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Computed {
    /// In passes of the default mode (rows of several sequences together).
    Batched,
    /// In passes of a sequence alone, each `c` rows starting at a multiple of `c`.
    Chunks(usize),
    /// Any other way (a partial chunk, or rows from passes of different shapes): never indexed.
    Mixed,
}

impl Computed {
    /// How a block's rows were computed when `pass` computed its next ones after `earlier` (how
    /// the rows it already held were computed, `None` if it held none).
    pub(crate) fn after(earlier: Option<Computed>, pass: Computed) -> Computed {
        match earlier {
            Some(e) if e != pass => Computed::Mixed,
            _ => pass,
        }
    }

    /// How a pass of `rows` rows starting at position `start` computes them.
    pub(crate) fn pass(invariant: bool, start: usize, rows: usize) -> Computed {
        match invariant {
            false => Computed::Batched,
            true if rows > 0 && start.is_multiple_of(rows) => Computed::Chunks(rows),
            true => Computed::Mixed,
        }
    }
}

/// The hash of a block holding `tokens`, computed as `computed`, after the prefix hashed `parent`.
pub(crate) fn block_hash(parent: u64, computed: Computed, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: the same in every process, so hits do not depend on the run.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    parent.hash(&mut h);
    computed.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_a_chunk_only_alone_and_on_its_own_grid() {
        assert_eq!(Computed::pass(false, 5, 3), Computed::Batched);
        assert_eq!(Computed::pass(true, 64, 32), Computed::Chunks(32));
        assert_eq!(Computed::pass(true, 69, 1), Computed::Chunks(1));
        assert_eq!(Computed::pass(true, 64, 5), Computed::Mixed);
        assert_eq!(Computed::after(None, Computed::Chunks(1)), Computed::Chunks(1));
        assert_eq!(Computed::after(Some(Computed::Chunks(32)), Computed::Chunks(32)), Computed::Chunks(32));
        assert_eq!(Computed::after(Some(Computed::Chunks(32)), Computed::Chunks(1)), Computed::Mixed);
        assert_ne!(
            block_hash(ROOT, Computed::Batched, &[1, 2]),
            block_hash(ROOT, Computed::Chunks(2), &[1, 2]),
            "the same tokens computed otherwise are another block"
        );
    }
}
