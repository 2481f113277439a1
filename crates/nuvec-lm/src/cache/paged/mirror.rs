//! A paged cache kept alike on every rank of a split model. Rank 0 leads
//! ([`PagedCache::lead`]): it tells each change of its cache to the other ranks, which follow
//! ([`follow`]) by making the same change to a cache of their own part of the model. A step is
//! told before it runs, since every rank's part of the model takes part in it, and its outcome
//! after; every other change after it succeeded on rank 0, with its outcome. Each follower checks
//! that it reached the same outcome, and stops with an error saying so where it did not. Other
//! changes that fail leave a cache as it was, on every rank alike, so none is told.

use std::time::Duration;

use nuvec::distributed::Group;

use super::{PagedCache, PrefixScope, SeqId};
use crate::adapter::AdapterId;
use crate::models::Model;
use crate::{Error, Result};

/// The settings a follower makes its cache with.
pub(super) struct Config {
    pub blocks: usize,
    pub block_size: usize,
    pub max_seqs: usize,
    /// Bits and group size of a quantized cache.
    pub quantized: Option<(usize, usize)>,
    pub invariant: bool,
    pub caching: bool,
    pub checkpoint_bytes: usize,
    pub rewind: usize,
    pub step_tokens: Option<usize>,
}

/// One change of the leader's cache.
pub(super) enum Op {
    New(Config),
    Invariant(bool),
    Caching(bool),
    CheckpointBytes(usize),
    Rewind(usize),
    StepTokens(usize),
    /// [`PagedCache::add_in`], which gave `id`.
    Add {
        scope: PrefixScope,
        id: SeqId,
    },
    /// [`PagedCache::add_with_prefix_in`], which gave `id` holding `held` positions.
    AddWithPrefix {
        tokens: Vec<u32>,
        chunk: usize,
        scope: PrefixScope,
        id: SeqId,
        held: usize,
    },
    Remove(SeqId),
    Trim(SeqId, usize),
    /// A step about to run: each sequence's new tokens, the rows whose logits are kept, and
    /// whether the hidden states are.
    Step {
        work: Vec<(SeqId, Vec<u32>)>,
        counts: Option<Vec<usize>>,
        hidden: bool,
    },
    /// Whether the step just told succeeded on rank 0.
    Stepped(bool),
    /// The leader's cache is gone.
    End,
    /// A pass of one token that measures the model's cache ([`kv_bytes_per_position`]).
    Probe,
}

impl PagedCache {
    /// Makes this cache, over rank 0's part of a model split across `group`, the one the other
    /// ranks' caches follow ([`follow`]): from now on each change is told to them. Call it on an
    /// empty cache, while every other rank calls [`follow`].
    pub(crate) fn lead(&mut self, group: &Group) -> Result<()> {
        if group.rank() != 0 || !self.is_empty() {
            return Err(Error::Invalid("PagedCache::lead: on rank 0, before adding sequences".into()));
        }
        self.leader = Some(group.clone());
        self.tell(&Op::New(Config {
            blocks: self.total_blocks(),
            block_size: self.block_size(),
            max_seqs: self.max_seqs(),
            quantized: self.quantized.map(|q| (q.bits, q.group_size)),
            invariant: self.invariant,
            caching: self.prefix_caching(),
            checkpoint_bytes: self.checkpoint_bytes,
            rewind: self.rewind,
            step_tokens: self.step_tokens,
        }))
    }

    /// Tells `op` to every follower, when this cache leads.
    pub(super) fn tell(&self, op: &Op) -> Result<()> {
        match &self.leader {
            Some(group) => tell(group, op),
            None => Ok(()),
        }
    }

    /// Whether this cache leads others: what they cannot follow is refused.
    pub(super) fn leads(&self) -> bool {
        self.leader.is_some()
    }
}

/// Tells `op` to every other rank of `group`.
fn tell(group: &Group, op: &Op) -> Result<()> {
    let bytes = encode(op);
    for rank in 1..group.size() {
        group.send(rank, &bytes)?;
    }
    Ok(())
}

/// [`Model::kv_bytes_per_position_by_kind`], measured by a pass that every rank of a split model
/// runs (told by rank 0, before the Batcher's cache is made, to the ranks that follow it).
pub(crate) fn kv_bytes_per_position(model: &Model) -> Result<(usize, usize)> {
    if let Some(group) = model.ranks().filter(|g| g.rank() == 0) {
        tell(group, &Op::Probe)?;
    }
    model.kv_bytes_per_position_by_kind()
}

impl Drop for PagedCache {
    fn drop(&mut self) {
        // A failure here is the group's, which every later call reports.
        let _ = self.tell(&Op::End);
    }
}

/// Follows the paged cache rank 0 leads over `model` (this rank's part of a model split across
/// ranks), from the cache's making to its end: every step rank 0's cache runs, this rank's part
/// of the model runs too. Waits as long as rank 0 sends nothing (an idle server); a step, once
/// told, is bounded by the group's timeout. Fails when the group does, or when this rank's cache
/// no longer agrees with rank 0's.
pub(crate) fn follow(model: &Model, group: &Group) -> Result<()> {
    // Long enough never to end: std waits without a deadline past what an instant can hold.
    let idle = group.clone().with_timeout(Duration::MAX);
    let mut cache = loop {
        match decode(&idle.recv(0)?)? {
            Op::New(c) => break make(model, &c)?,
            Op::Probe => drop(model.kv_bytes_per_position_by_kind()?),
            _ => return Err(disagree("a change to a cache before the cache was made".into())),
        }
    };
    loop {
        let op = decode(&idle.recv(0)?)?;
        if let Op::End = op {
            return Ok(());
        }
        let stepped = matches!(op, Op::Step { .. });
        let here = apply(&mut cache, model, op);
        if let Err(Error::Array(nuvec::Error::Distributed(cause))) = here {
            return Err(Error::Array(nuvec::Error::Distributed(cause)));
        }
        if !stepped {
            here?;
            continue;
        }
        // A step that failed on rank 0 failed alike here (and left both caches as they were).
        match (here, decode(&group.recv(0)?)?) {
            (Ok(()), Op::Stepped(true)) | (Err(_), Op::Stepped(false)) => {}
            (Err(e), Op::Stepped(true)) => return Err(disagree(format!("a step that ran on rank 0 failed here: {e}"))),
            (Ok(()), Op::Stepped(false)) => return Err(disagree("a step that failed on rank 0 ran here".into())),
            _ => return Err(disagree("a step's outcome was not told".into())),
        }
    }
}

const DISAGREE: &str = "this rank's paged cache no longer follows rank 0's";

fn disagree(what: String) -> Error {
    Error::Invalid(format!("{DISAGREE}: {what}"))
}

fn make(model: &Model, c: &Config) -> Result<PagedCache> {
    let mut cache = match c.quantized {
        Some((bits, group)) => PagedCache::new_quantized(model, c.blocks, c.block_size, c.max_seqs, bits, group)?,
        None => PagedCache::new(model, c.blocks, c.block_size, c.max_seqs)?,
    };
    cache.set_batch_invariant(c.invariant);
    cache.set_checkpoint_bytes(c.checkpoint_bytes);
    cache.set_prefix_caching(c.caching)?;
    cache.set_rewind(c.rewind)?;
    if let Some(n) = c.step_tokens {
        cache.set_step_tokens(n)?;
    }
    Ok(cache)
}

fn apply(cache: &mut PagedCache, model: &Model, op: Op) -> Result<()> {
    match op {
        Op::New(_) => return Err(disagree("a second cache made while the first lives".into())),
        Op::Invariant(on) => cache.set_batch_invariant(on),
        Op::Caching(on) => cache.set_prefix_caching(on)?,
        Op::CheckpointBytes(n) => cache.set_checkpoint_bytes(n),
        Op::Rewind(n) => cache.set_rewind(n)?,
        Op::StepTokens(n) => cache.set_step_tokens(n)?,
        Op::Add { scope, id } => {
            let got = cache.add_in(scope).map_err(|e| disagree(format!("adding sequence {}: {e}", id.0)))?;
            if got != id {
                return Err(disagree(format!("rank 0 added sequence {}, this rank {}", id.0, got.0)));
            }
        }
        Op::AddWithPrefix { tokens, chunk, scope, id, held } => {
            let got = cache.add_with_prefix_in(&tokens, chunk, scope);
            let got = got.map_err(|e| disagree(format!("adding sequence {}: {e}", id.0)))?;
            if got != (id, held) {
                return Err(disagree(format!(
                    "rank 0 added sequence {} on {held} cached positions, this rank sequence {} on {}",
                    id.0, got.0 .0, got.1
                )));
            }
        }
        Op::Remove(id) => cache.remove(id).map_err(|e| disagree(format!("removing: {e}")))?,
        Op::Trim(id, n) => cache.trim(id, n).map_err(|e| disagree(format!("trimming: {e}")))?,
        Op::Step { work, counts, hidden } => {
            let work: Vec<(SeqId, &[u32])> = work.iter().map(|(id, t)| (*id, &t[..])).collect();
            cache.step_rows(model, &work, counts.as_deref(), hidden, None)?;
        }
        Op::Probe => drop(model.kv_bytes_per_position_by_kind()?),
        Op::Stepped(_) => return Err(disagree("a step's outcome told without its step".into())),
        Op::End => {}
    }
    Ok(())
}

fn encode(op: &Op) -> Vec<u8> {
    let mut w = Writer(vec![]);
    match op {
        Op::New(c) => {
            w.tag(0);
            for n in [c.blocks, c.block_size, c.max_seqs, c.checkpoint_bytes, c.rewind] {
                w.num(n);
            }
            w.opt(c.quantized.map(|q| q.0));
            w.opt(c.quantized.map(|q| q.1));
            w.opt(c.step_tokens);
            w.flag(c.invariant);
            w.flag(c.caching);
        }
        Op::Invariant(on) => {
            w.tag(1);
            w.flag(*on);
        }
        Op::Caching(on) => {
            w.tag(2);
            w.flag(*on);
        }
        Op::CheckpointBytes(n) => {
            w.tag(3);
            w.num(*n);
        }
        Op::Rewind(n) => {
            w.tag(4);
            w.num(*n);
        }
        Op::StepTokens(n) => {
            w.tag(5);
            w.num(*n);
        }
        Op::Add { scope, id } => {
            w.tag(6);
            w.scope(scope);
            w.seq(*id);
        }
        Op::AddWithPrefix { tokens, chunk, scope, id, held } => {
            w.tag(7);
            w.tokens(tokens);
            w.num(*chunk);
            w.scope(scope);
            w.seq(*id);
            w.num(*held);
        }
        Op::Remove(id) => {
            w.tag(8);
            w.seq(*id);
        }
        Op::Trim(id, n) => {
            w.tag(9);
            w.seq(*id);
            w.num(*n);
        }
        Op::Step { work, counts, hidden } => {
            w.tag(10);
            w.num(work.len());
            for (id, tokens) in work {
                w.seq(*id);
                w.tokens(tokens);
            }
            w.flag(counts.is_some());
            for &c in counts.iter().flatten() {
                w.num(c);
            }
            w.flag(*hidden);
        }
        Op::End => w.tag(11),
        Op::Probe => w.tag(12),
        Op::Stepped(ok) => {
            w.tag(13);
            w.flag(*ok);
        }
    }
    w.0
}

fn decode(bytes: &[u8]) -> Result<Op> {
    let mut r = Reader(bytes);
    let op = match r.tag()? {
        0 => {
            let [blocks, block_size, max_seqs, checkpoint_bytes, rewind] =
                [r.num()?, r.num()?, r.num()?, r.num()?, r.num()?];
            let (bits, group) = (r.opt()?, r.opt()?);
            Op::New(Config {
                blocks,
                block_size,
                max_seqs,
                checkpoint_bytes,
                rewind,
                quantized: bits.zip(group),
                step_tokens: r.opt()?,
                invariant: r.flag()?,
                caching: r.flag()?,
            })
        }
        1 => Op::Invariant(r.flag()?),
        2 => Op::Caching(r.flag()?),
        3 => Op::CheckpointBytes(r.num()?),
        4 => Op::Rewind(r.num()?),
        5 => Op::StepTokens(r.num()?),
        6 => Op::Add { scope: r.scope()?, id: r.seq()? },
        7 => {
            Op::AddWithPrefix { tokens: r.tokens()?, chunk: r.num()?, scope: r.scope()?, id: r.seq()?, held: r.num()? }
        }
        8 => Op::Remove(r.seq()?),
        9 => Op::Trim(r.seq()?, r.num()?),
        10 => {
            let n = r.num()?;
            let work = (0..n).map(|_| Ok((r.seq()?, r.tokens()?))).collect::<Result<Vec<_>>>()?;
            let counts = match r.flag()? {
                true => Some((0..n).map(|_| r.num()).collect::<Result<Vec<_>>>()?),
                false => None,
            };
            Op::Step { work, counts, hidden: r.flag()? }
        }
        11 => Op::End,
        12 => Op::Probe,
        13 => Op::Stepped(r.flag()?),
        t => return Err(malformed(&format!("an unknown change {t}"))),
    };
    if !r.0.is_empty() {
        return Err(malformed("bytes past the end of a change"));
    }
    Ok(op)
}

fn malformed(what: &str) -> Error {
    disagree(format!("rank 0 sent {what} (are both ranks the same build of nuvec?)"))
}

struct Writer(Vec<u8>);

impl Writer {
    fn tag(&mut self, t: u8) {
        self.0.push(t);
    }
    fn flag(&mut self, on: bool) {
        self.0.push(on as u8);
    }
    fn num(&mut self, n: usize) {
        self.0.extend_from_slice(&(n as u64).to_le_bytes());
    }
    fn opt(&mut self, n: Option<usize>) {
        self.flag(n.is_some());
        self.num(n.unwrap_or(0));
    }
    fn seq(&mut self, id: SeqId) {
        self.num(id.0 as usize);
    }
    fn tokens(&mut self, tokens: &[u32]) {
        self.num(tokens.len());
        tokens.iter().for_each(|t| self.0.extend_from_slice(&t.to_le_bytes()));
    }
    fn scope(&mut self, scope: &PrefixScope) {
        self.opt(scope.adapter.map(|a| a.0));
        let salt = scope.salt.as_deref().map(str::as_bytes);
        self.flag(salt.is_some());
        self.num(salt.map_or(0, <[u8]>::len));
        self.0.extend_from_slice(salt.unwrap_or_default());
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if n > self.0.len() {
            return Err(malformed("a change cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn tag(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn flag(&mut self) -> Result<bool> {
        Ok(self.tag()? != 0)
    }
    fn num(&mut self) -> Result<usize> {
        let bytes: [u8; 8] = self.take(8)?.try_into().expect("eight bytes taken");
        usize::try_from(u64::from_le_bytes(bytes)).map_err(|_| malformed("a count past this machine's"))
    }
    fn opt(&mut self) -> Result<Option<usize>> {
        let some = self.flag()?;
        let n = self.num()?;
        Ok(some.then_some(n))
    }
    fn seq(&mut self) -> Result<SeqId> {
        let n = self.num()?;
        u32::try_from(n).map(SeqId).map_err(|_| malformed("a sequence id past u32"))
    }
    fn tokens(&mut self) -> Result<Vec<u32>> {
        let n = self.num()?;
        let bytes = self.take(n.checked_mul(4).ok_or_else(|| malformed("a token count past this machine's"))?)?;
        Ok(bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("four bytes"))).collect())
    }
    fn scope(&mut self) -> Result<PrefixScope> {
        let adapter = self.opt()?.map(AdapterId);
        let salted = self.flag()?;
        let n = self.num()?;
        let salt = String::from_utf8(self.take(n)?.to_vec()).map_err(|_| malformed("a salt that is not UTF-8"))?;
        Ok(PrefixScope { adapter, salt: salted.then_some(salt) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_reads_back_as_written() {
        let scope = PrefixScope { adapter: Some(AdapterId(2)), salt: Some("s€lt".into()) };
        let ops = [
            Op::New(Config {
                blocks: 7,
                block_size: 16,
                max_seqs: 3,
                quantized: Some((8, 64)),
                invariant: true,
                caching: false,
                checkpoint_bytes: 1 << 40,
                rewind: 2,
                step_tokens: None,
            }),
            Op::AddWithPrefix {
                tokens: vec![1, u32::MAX, 0],
                chunk: 512,
                scope: scope.clone(),
                id: SeqId(4),
                held: 32,
            },
            Op::Add { scope: PrefixScope::default(), id: SeqId(0) },
            Op::Step {
                work: vec![(SeqId(1), vec![5]), (SeqId(0), vec![6, 7])],
                counts: Some(vec![1, 2]),
                hidden: true,
            },
            Op::Step { work: vec![(SeqId(1), vec![5])], counts: None, hidden: false },
            Op::Trim(SeqId(9), 3),
            Op::StepTokens(4096),
            Op::Stepped(false),
        ];
        for op in &ops {
            let bytes = encode(op);
            assert_eq!(encode(&decode(&bytes).unwrap()), bytes);
            let e = decode(&bytes[..bytes.len() - 1]).map(drop).unwrap_err().to_string();
            assert!(e.contains("cut short"), "{e}");
        }
        match decode(&encode(&ops[1])).unwrap() {
            Op::AddWithPrefix { tokens, scope: s, held, .. } => {
                assert_eq!((tokens, s, held), (vec![1, u32::MAX, 0], scope, 32))
            }
            _ => panic!("another change"),
        }
        let e = decode(&[14]).map(drop).unwrap_err().to_string();
        assert!(e.contains("unknown change 14") && e.contains("same build"), "{e}");
    }
}
