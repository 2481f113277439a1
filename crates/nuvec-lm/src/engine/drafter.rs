//! A draft model's guesses for the Batcher's speculation ([`crate::Batcher::with_draft`]): the
//! draft keeps a paged cache of its own, with a sequence per request that has speculated, which
//! follows that request's history (kept where it agrees, trimmed where it does not, as
//! [`crate::speculative::DraftModel`] does for one generation). In a step, the speculating
//! requests' catch-up tokens go through the draft in one pass that gives their first guesses,
//! and each further guess is one batched decode of them all. The draft picks greedily, so each
//! request's tokens are those it gets without speculation.
//!
//! A step's draft pass takes at most the Batcher's token budget of catch-up rows: a request
//! whose draft lags further (a long prompt, when it first speculates) catches up over several
//! steps, guessing nothing until it has.
//!
//! The draft never fails a request: where its cache is full or its pass fails, the requests it
//! serves get no guesses that step (and start their draft sequences afresh later).

use std::collections::HashMap;

use crate::cache::paged::{decode_batch, PagedCache, SeqId};
use crate::models::Model;
use crate::sample::argmax;
use crate::Result;

/// A draft model and its cache, beside a Batcher's target.
pub(crate) struct Drafter<'m> {
    model: &'m Model,
    paged: PagedCache,
    /// Per request (its key): the draft's sequence and the tokens it holds.
    seqs: HashMap<u64, (SeqId, Vec<u32>)>,
    /// Catch-up rows a step's draft pass takes at most, over all its requests.
    budget: usize,
}

/// One request's ask: its key, its history (prompt and output), how many guesses at most.
pub(crate) type Ask<'a> = (u64, &'a [u32], usize);

impl<'m> Drafter<'m> {
    /// A drafter over `model` with a cache of `blocks` blocks of `block_size` positions for at
    /// most `max_seqs` requests, taking back up to `num_draft` positions (wrong guesses), its
    /// catch-up passes at most `budget` rows.
    pub(crate) fn new(
        model: &'m Model,
        (blocks, block_size, max_seqs): (usize, usize, usize),
        num_draft: usize,
        budget: usize,
    ) -> Result<Self> {
        let mut paged = PagedCache::new(model, blocks, block_size, max_seqs)?;
        // Each request's draft sequence is its own; sharing prompt blocks between them would
        // save little beside the target's cache.
        paged.set_prefix_caching(false)?;
        paged.set_rewind(num_draft)?;
        Ok(Drafter { model, paged, seqs: HashMap::new(), budget: budget.max(1) })
    }

    /// Up to `room` greedy guesses for each ask (none where the draft could not make them).
    pub(crate) fn propose(&mut self, asks: &[Ask]) -> Vec<Vec<u32>> {
        let mut out = vec![vec![]; asks.len()];
        // Each sequence brought to its request's history but the last token, which goes in with
        // what it lacks.
        let mut going: Vec<(usize, SeqId, Vec<u32>)> = vec![];
        // Requests that only catch up this step (part of what they lack, no guess).
        let mut lagging: Vec<(usize, SeqId, Vec<u32>)> = vec![];
        let mut left = self.budget;
        for (i, &(key, history, room)) in asks.iter().enumerate() {
            if room == 0 || history.is_empty() || left == 0 {
                continue;
            }
            match self.follow(key, history) {
                Ok((id, pending)) if pending.len() <= left => {
                    left -= pending.len();
                    going.push((i, id, pending));
                }
                Ok((id, mut pending)) => {
                    // Never the last token: that one goes in with the first guess's pass.
                    pending.truncate(left.min(pending.len() - 1));
                    left -= pending.len();
                    if !pending.is_empty() {
                        lagging.push((i, id, pending));
                    }
                }
                Err(_) => self.forget(key),
            }
        }
        if going.is_empty() && lagging.is_empty() {
            return out;
        }
        let work: Vec<(SeqId, &[u32])> = going.iter().chain(&lagging).map(|(_, id, p)| (*id, p.as_slice())).collect();
        let firsts = match self.paged.step(self.model, &work).and_then(|l| Ok(l.to_vec::<f32>()?)) {
            Ok(rows) => rows,
            Err(_) => {
                going.iter().chain(&lagging).for_each(|&(i, _, _)| self.forget(asks[i].0));
                return out;
            }
        };
        let vocab = firsts.len() / work.len();
        for (i, _, pending) in &lagging {
            self.held(asks[*i].0).extend_from_slice(pending);
        }
        for ((i, _, pending), row) in going.iter().zip(firsts.chunks_exact(vocab)) {
            self.held(asks[*i].0).extend_from_slice(pending);
            out[*i].push(argmax(row));
        }
        // Further guesses: each a decode of the requests that want more.
        let most = going.iter().map(|&(i, _, _)| asks[i].2).max().unwrap_or(0);
        for n in 1..most {
            let more: Vec<(usize, SeqId)> =
                going.iter().filter(|&&(i, _, _)| asks[i].2 > n).map(|&(i, id, _)| (i, id)).collect();
            if more.is_empty() {
                break;
            }
            let tokens: Vec<u32> = more.iter().map(|&(i, _)| out[i][n - 1]).collect();
            let ids: Vec<SeqId> = more.iter().map(|&(_, id)| id).collect();
            let rows =
                match decode_batch(self.model, &tokens, &ids, &mut self.paged).and_then(|l| Ok(l.to_vec::<f32>()?)) {
                    Ok(rows) => rows,
                    // The guesses made so far stand: the draft's cache simply holds fewer of them.
                    Err(_) => break,
                };
            for (&(i, _), (row, &fed)) in more.iter().zip(rows.chunks_exact(vocab).zip(&tokens)) {
                self.held(asks[i].0).push(fed);
                out[i].push(argmax(row));
            }
        }
        out
    }

    /// Brings request `key`'s draft sequence to its `history` but the last token: its sequence
    /// and the tokens it lacks (at least that last one). A sequence that cannot take back what
    /// differs starts afresh.
    fn follow(&mut self, key: u64, history: &[u32]) -> Result<(SeqId, Vec<u32>)> {
        if let Some((id, held)) = self.seqs.get_mut(&key) {
            let common = crate::speculative::kept_prefix(held, history);
            if self.paged.trim(*id, held.len() - common).is_ok() {
                held.truncate(common);
                return Ok((*id, history[common..].to_vec()));
            }
            self.forget(key);
        }
        let id = self.paged.add()?;
        self.seqs.insert(key, (id, vec![]));
        Ok((id, history.to_vec()))
    }

    /// The tokens request `key`'s draft sequence holds.
    fn held(&mut self, key: u64) -> &mut Vec<u32> {
        &mut self.seqs.get_mut(&key).expect("a sequence followed this step").1
    }

    /// Drops request `key`'s draft sequence.
    fn forget(&mut self, key: u64) {
        if let Some((id, _)) = self.seqs.remove(&key) {
            // The id came from this cache and was not removed since.
            let _ = self.paged.remove(id);
        }
    }

    /// Lets go of the sequences of requests that `running` no longer says run.
    pub(crate) fn retain(&mut self, running: impl Fn(u64) -> bool) {
        let gone: Vec<u64> = self.seqs.keys().copied().filter(|&k| !running(k)).collect();
        gone.into_iter().for_each(|k| self.forget(k));
    }
}
