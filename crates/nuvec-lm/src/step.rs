//! The one way a model runs: a [`StepBatch`] of sequences, each with its new tokens (one for a
//! decode step, a chunk for a prefill) and its own per-layer caches. Every projection, norm and
//! MoE runs once over the rows of all sequences; attention (and a hybrid's recurrence) runs per
//! sequence over its own cache ([`StepBatch::each`]). `generate` is a batch of one.

use nuvec::{Array, Matrix};

use crate::adapter::rows::RowAdapters;
use crate::adapter::AdapterId;
use crate::cache::paged::{InPlace, PagedKv};
use crate::cache::Positions;
use crate::cache::{LayerCache, RecurrentCache};
use crate::{Error, Result};

/// The most rows a sequence with a cached prefix may bring to a step's in-place attention
/// ([`StepBatch::each_with_decodes`]): up to here a chunk's rows attended as decodes cost no
/// more than the per-sequence gather they replace (each reads the prefix; a gather copies it),
/// and the CPU's attention of a few queries takes one row at a time anyway.
pub(crate) const IN_PLACE_MAX_ROWS: usize = 16;

/// One sequence of a step: how many rows (new tokens) it has and its caches, one per layer.
struct StepSeq<'a> {
    rows: usize,
    cache: &'a mut [LayerCache],
    /// The served adapter its rows take, if any.
    adapter: Option<AdapterId>,
}

/// Sequences run together through one forward pass. Rows are the sequences' new tokens, in
/// order: sequence 0's first, then sequence 1's, and so on.
pub struct StepBatch<'a> {
    tokens: Vec<u32>,
    seqs: Vec<StepSeq<'a>>,
    invariant: bool,
    fed: Option<Fed>,
}

/// Rows whose token is a previous step's greedy pick, still on the device ([`StepBatch::feed`]).
struct Fed {
    /// That step's `argmax_gap` (`[m, 3]` u32, the index first).
    picks: Array,
    /// (row of this step, row of `picks`).
    rows: Vec<(usize, usize)>,
}

impl<'a> StepBatch<'a> {
    /// An empty batch.
    pub fn new() -> Self {
        StepBatch { tokens: vec![], seqs: vec![], invariant: false, fed: None }
    }

    /// A batch of one sequence: `tokens` appended to `cache`.
    pub fn one(tokens: &[u32], cache: &'a mut [LayerCache]) -> Self {
        let seqs = vec![StepSeq { rows: tokens.len(), cache, adapter: None }];
        StepBatch { tokens: tokens.to_vec(), seqs, invariant: false, fed: None }
    }

    /// Adds a sequence whose `tokens` extend `cache`; an empty chunk is refused.
    pub fn push(&mut self, tokens: &[u32], cache: &'a mut [LayerCache]) -> Result<()> {
        self.push_adapted(tokens, cache, None)
    }

    /// [`StepBatch::push`] for a sequence whose rows take served adapter `adapter` (`None`: the
    /// base model), whatever the others take.
    pub fn push_adapted(
        &mut self,
        tokens: &[u32],
        cache: &'a mut [LayerCache],
        adapter: Option<AdapterId>,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::Invalid(format!("sequence {} of the step has no tokens", self.seqs.len())));
        }
        self.tokens.extend_from_slice(tokens);
        self.seqs.push(StepSeq { rows: tokens.len(), cache, adapter });
        Ok(())
    }

    /// Which rows take which served adapter; `None` when every row takes the base model.
    pub(crate) fn row_adapters(&self) -> Option<RowAdapters> {
        RowAdapters::from_sequences(self.seqs.iter().map(|s| (s.rows, s.adapter)))
    }

    /// Batch invariance: every sequence gets exactly (bit for bit) the logits it gets in a batch
    /// of its own, whatever it is batched with, because [`crate::Model::step`] then runs each
    /// sequence's rows as a pass of their own instead of one pass over all rows. It costs the
    /// batching's speed-up; the default (off) matches to rounding (row-batched products sum in
    /// another order) and gives the same greedy tokens on every model tested.
    pub fn set_batch_invariant(&mut self, invariant: bool) {
        self.invariant = invariant;
    }

    /// Whether [`StepBatch::set_batch_invariant`] asked for batch invariance.
    pub fn batch_invariant(&self) -> bool {
        self.invariant
    }

    /// Each sequence's new tokens, caches and served adapter, in order.
    pub(crate) fn sequences_mut(
        &mut self,
    ) -> impl Iterator<Item = (&[u32], &mut [LayerCache], Option<AdapterId>)> + use<'_, 'a> {
        let mut start = 0;
        let tokens = &self.tokens;
        self.seqs.iter_mut().map(move |s| {
            let rows = &tokens[start..start + s.rows];
            start += s.rows;
            (rows, &mut *s.cache, s.adapter)
        })
    }

    /// Every row's token, sequence by sequence; a row [`StepBatch::feed`] gives a token on the
    /// device holds 0 here until [`StepBatch::resolve_fed`] reads it.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Takes the tokens of `rows` (each a row of this step and a row of `picks`) from `picks`,
    /// a previous step's [`Array::argmax_gap`] on the device, instead of [`StepBatch::tokens`]:
    /// the step's embedding reads them there ([`StepBatch::embed`]), so it is enqueued before
    /// that step's picks reach the host (the Batcher's pipelined steps). Every pick must be a
    /// token of the model (the logits it came from no wider than the embedding).
    pub(crate) fn feed(&mut self, picks: Array, rows: Vec<(usize, usize)>) {
        self.fed = (!rows.is_empty()).then_some(Fed { picks, rows });
    }

    /// The embedding of every row's token: [`Matrix::embed`] of the tokens, the fed rows'
    /// spliced in from their picks on the device.
    pub(crate) fn embed(&self, table: &Matrix) -> Result<Array> {
        Ok(match &self.fed {
            Some(f) => table.embed_spliced(&self.tokens, &f.picks, &f.rows)?,
            None => table.embed(&self.tokens)?,
        })
    }

    /// Reads the fed rows' tokens into [`StepBatch::tokens`] (waiting for their step), for a
    /// model that needs the ids on the host beyond the embedding, or a pass run sequence by
    /// sequence.
    pub(crate) fn resolve_fed(&mut self) -> Result<()> {
        if let Some(f) = self.fed.take() {
            let picks = f.picks.to_vec::<u32>()?;
            for (row, pick) in f.rows {
                let token = picks.get(3 * pick).ok_or_else(|| {
                    Error::Invalid(format!("row {row} of the step fed from pick {pick} of {}", picks.len() / 3))
                })?;
                self.tokens[row] = *token;
            }
        }
        Ok(())
    }

    /// The batch cut into at most `n` batches of consecutive sequences, of about equal rows
    /// (a pipeline's micro-batches): each holds its sequences' tokens and caches. One part, the
    /// whole batch, when rows are fed from the device.
    pub(crate) fn parts(&mut self, n: usize) -> Vec<StepBatch<'_>> {
        let StepBatch { tokens, seqs, invariant, fed } = self;
        let n = match fed {
            Some(_) => 1,
            None => n.clamp(1, seqs.len().max(1)),
        };
        let (total, count) = (tokens.len(), seqs.len());
        let mut seqs = seqs.iter_mut();
        let (mut taken, mut row) = (0, 0);
        (0..n)
            .map(|p| {
                let target = (p + 1) * total / n;
                let mut part = StepBatch { tokens: vec![], seqs: vec![], invariant: *invariant, fed: None };
                // At least one sequence each, and one left for each part after this one.
                while taken < count - (n - 1 - p) && (part.seqs.is_empty() || row < target) {
                    let s = seqs.next().expect("counted");
                    part.tokens.extend_from_slice(&tokens[row..row + s.rows]);
                    part.seqs.push(StepSeq { rows: s.rows, cache: &mut *s.cache, adapter: s.adapter });
                    (taken, row) = (taken + 1, row + s.rows);
                }
                part
            })
            .collect()
    }

    /// Sequences in the batch.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Whether the batch has no sequence.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The row of each sequence's last token.
    pub fn last_rows(&self) -> Vec<usize> {
        let mut end = 0;
        self.seqs
            .iter()
            .map(|s| {
                end += s.rows;
                end - 1
            })
            .collect()
    }

    /// Errors unless every sequence has `layers` caches (`what` names them for the message).
    pub(crate) fn check_layers(&self, layers: usize, what: &str) -> Result<()> {
        match self.seqs.iter().position(|s| s.cache.len() != layers) {
            None => Ok(()),
            Some(i) => Err(Error::Invalid(format!(
                "sequence {i} has a cache of {} layers for a model with {layers} {what}",
                self.seqs[i].cache.len()
            ))),
        }
    }

    /// What a failed step must put back: each layer's position count in each sequence, and a
    /// copy of each recurrent state (which cannot be trimmed; a copy shares the arrays, which
    /// the step replaces rather than writes).
    pub(crate) fn checkpoint(&self) -> Checkpoint {
        let seqs = self
            .seqs
            .iter()
            .map(|s| {
                s.cache
                    .iter()
                    .map(|c| match c {
                        LayerCache::Recurrent(r) => Saved::State(r.clone()),
                        other => Saved::Offset(other.offset()),
                    })
                    .collect()
            })
            .collect();
        Checkpoint(seqs)
    }

    /// Puts every cache back as `saved` ([`StepBatch::checkpoint`]) holds it, so a step that
    /// failed half-way leaves each sequence as it was. A cache that cannot be trimmed back (a
    /// rotating cache that wrapped) is named in the error.
    pub(crate) fn restore(&mut self, saved: &Checkpoint) -> Result<()> {
        for (s, (seq, before)) in self.seqs.iter_mut().zip(&saved.0).enumerate() {
            for (layer, (cache, was)) in seq.cache.iter_mut().zip(before).enumerate() {
                match was {
                    Saved::State(r) => *cache = LayerCache::Recurrent(r.clone()),
                    Saved::Offset(n) => {
                        let grown = cache.offset().saturating_sub(*n);
                        if grown > 0 {
                            cache.trim(grown).map_err(|e| {
                                Error::Invalid(format!(
                                    "sequence {s}, layer {layer}: cannot undo the failed step ({e})"
                                ))
                            })?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// [`StepBatch::each`] with the rows of a paged store attended together: the sequences whose
    /// caches of `layer` are of one paged store that can be attended so
    /// ([`PagedKv::decodes_together`]: plain, or quantized past a first pass) and that decode one
    /// row or bring at most [`IN_PLACE_MAX_ROWS`] over a cached prefix, at least two of them, go
    /// to `decodes` together, with their rows of `xs` (in step order) and their caches and row
    /// counts, as one op can attend them ([`crate::cache::paged::attend_decodes`]); every other
    /// sequence (a prompt's first pass, a long chunk, another cache) goes to `f` alone. The
    /// results' rows are stacked in sequence order. Without two such sequences, `each` over all
    /// of them. `written`: whether the caches of `layer` hold the step's rows already (a layer
    /// reading an earlier layer's keys).
    pub(crate) fn each_with_decodes<const N: usize>(
        &mut self,
        layer: usize,
        written: bool,
        xs: [&Array; N],
        decodes: impl FnOnce([Array; N], InPlace<'_>) -> Result<Array>,
        mut f: impl FnMut([Array; N], &mut [LayerCache]) -> Result<Array>,
    ) -> Result<Array> {
        fn in_place<'s>(seq: &'s StepSeq<'_>, layer: usize, written: bool) -> Option<&'s PagedKv> {
            let Some(LayerCache::Paged(p)) = seq.cache.get(layer) else {
                return None;
            };
            let held = p.offset().saturating_sub(if written { seq.rows } else { 0 });
            let rows_fit = seq.rows == 1 || (seq.rows <= IN_PLACE_MAX_ROWS && held > 0);
            (rows_fit && p.decodes_together()).then_some(p)
        }
        let in_place = |seq| in_place(seq, layer, written);
        // The in-place sequences of the first one's store (a step's layers share one store).
        let first = self.seqs.iter().find_map(in_place);
        let batched: Vec<bool> =
            self.seqs.iter().map(|s| in_place(s).zip(first).is_some_and(|(p, f)| p.same_store(f))).collect();
        if batched.iter().filter(|&&b| b).count() < 2 {
            return self.each(xs, f);
        }
        // Each sequence's first row, and the in-place rows as runs of consecutive rows.
        let starts: Vec<usize> = self.seqs.iter().scan(0, |at, s| Some(std::mem::replace(at, *at + s.rows))).collect();
        let picked_rows = self.seqs.iter().zip(&batched).zip(&starts).filter(|((_, &b), _)| b);
        let runs = row_runs(picked_rows.flat_map(|((s, _), &at)| at..at + s.rows));
        let picked = xs.map(|x| rows_of(x, &runs));
        let mut caches = InPlace::new();
        let mut others = Vec::new();
        for ((seq, &b), &at) in self.seqs.iter_mut().zip(&batched).zip(&starts) {
            if !b {
                others.push((at, seq.rows, &mut *seq.cache));
            } else if let LayerCache::Paged(p) = &mut seq.cache[layer] {
                caches.push(p, seq.rows);
            }
        }
        let picked: [Array; N] = picked
            .into_iter()
            .collect::<Result<Vec<_>>>()?
            .try_into()
            .unwrap_or_else(|_| unreachable!("N arrays picked"));
        let decoded = decodes(picked, caches)?;
        if others.is_empty() {
            // Every sequence decoded: the rows are in step order already.
            return Ok(decoded);
        }
        // Every sequence's result in step order: the decoded rows by runs, the others' own.
        let mut parts: Vec<(usize, Array)> = Vec::with_capacity(runs.len() + others.len());
        let mut done = 0;
        for &(at, n) in &runs {
            parts.push((at, decoded.slice_rows(done, done + n)?));
            done += n;
        }
        for (at, rows, cache) in others {
            let mine = xs.iter().map(|x| x.slice_rows(at, at + rows)).collect::<nuvec::Result<Vec<_>>>()?;
            let mine: [Array; N] = mine.try_into().unwrap_or_else(|_| unreachable!("N arrays sliced"));
            parts.push((at, f(mine, cache)?));
        }
        parts.sort_by_key(|&(at, _)| at);
        concat_rows(&parts.into_iter().map(|(_, a)| a).collect::<Vec<_>>())
    }

    /// Runs `f` for each sequence on its rows of `xs` (each `[rows, ...]`) and its caches, and
    /// stacks the results' rows in sequence order. A batch of one passes the arrays as they are.
    pub(crate) fn each<const N: usize>(
        &mut self,
        xs: [&Array; N],
        mut f: impl FnMut([Array; N], &mut [LayerCache]) -> Result<Array>,
    ) -> Result<Array> {
        if let [seq] = &mut self.seqs[..] {
            return f(xs.map(Array::clone), seq.cache);
        }
        let mut parts = Vec::with_capacity(self.seqs.len());
        let mut start = 0;
        for seq in &mut self.seqs {
            let end = start + seq.rows;
            let rows = xs.iter().map(|x| x.slice_rows(start, end)).collect::<nuvec::Result<Vec<_>>>()?;
            let rows: [Array; N] = rows.try_into().unwrap_or_else(|_| unreachable!("N arrays sliced"));
            parts.push(f(rows, seq.cache)?);
            start = end;
        }
        concat_rows(&parts)
    }
}

/// The caches of a step's sequences as they were before it ([`StepBatch::checkpoint`]).
pub(crate) struct Checkpoint(Vec<Vec<Saved>>);

enum Saved {
    Offset(usize),
    State(RecurrentCache),
}

impl Default for StepBatch<'_> {
    fn default() -> Self {
        Self::new()
    }
}

/// Rows at the ascending positions `rows` as runs of consecutive rows: (first row, count).
fn row_runs(rows: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = vec![];
    for r in rows {
        match runs.last_mut() {
            Some((at, n)) if *at + *n == r => *n += 1,
            _ => runs.push((r, 1)),
        }
    }
    runs
}

/// The rows of `x` in `runs` (first row, count), stacked: `x` itself when they are all its rows.
fn rows_of(x: &Array, runs: &[(usize, usize)]) -> Result<Array> {
    if let [(0, n)] = runs {
        if *n == x.dim(0) {
            return Ok(x.clone());
        }
    }
    let parts = runs.iter().map(|&(at, n)| x.slice_rows(at, at + n)).collect::<nuvec::Result<Vec<_>>>()?;
    concat_rows(&parts)
}

/// The rows of `parts` (each `[r_i, ...]`, the same trailing shape) stacked into one array.
pub(crate) fn concat_rows(parts: &[Array]) -> Result<Array> {
    let first = parts.first().ok_or_else(|| Error::Invalid("no rows to stack".into()))?;
    if parts.len() == 1 {
        return Ok(first.clone());
    }
    let tail = &first.shape()[1..];
    if let Some(p) = parts.iter().find(|p| &p.shape()[1..] != tail) {
        return Err(Error::Invalid(format!("rows of shape {:?} stacked under {:?}", p.shape(), first.shape())));
    }
    let width: usize = tail.iter().product();
    // Rows are positions of one "head": the cache's join along positions does the copy.
    let views = parts.iter().map(|p| p.reshape(&[1, p.dim(0), width])).collect::<nuvec::Result<Vec<_>>>()?;
    let joined = crate::cache::ops::concat_axis1(&views)?;
    let mut shape = vec![joined.dim(1)];
    shape.extend_from_slice(tail);
    Ok(joined.reshape(&shape)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KvCache;

    #[test]
    fn parts_cut_consecutive_sequences_of_about_equal_rows() {
        let mut caches: Vec<Vec<LayerCache>> = (0..5).map(|_| vec![LayerCache::Plain(KvCache::default())]).collect();
        let rows = [6, 1, 1, 3, 1];
        let mut step = StepBatch::new();
        let mut next = 0;
        for (cache, &r) in caches.iter_mut().zip(&rows) {
            let tokens: Vec<u32> = (next..next + r).collect();
            next += r;
            step.push(&tokens, cache).unwrap();
        }
        let cut =
            |step: &mut StepBatch, n| -> Vec<Vec<u32>> { step.parts(n).iter().map(|p| p.tokens().to_vec()).collect() };
        // Twelve rows in two: the long first sequence alone reaches half.
        assert_eq!(cut(&mut step, 2), [(0..6).collect::<Vec<_>>(), (6..12).collect()]);
        let three = cut(&mut step, 3);
        assert_eq!(three.iter().map(Vec::len).collect::<Vec<_>>(), [6, 2, 4]);
        assert_eq!(three.concat(), (0..12).collect::<Vec<_>>());
        // No more parts than sequences, and never an empty one.
        let many = cut(&mut step, 9);
        assert_eq!(many.len(), 5);
        assert!(many.iter().all(|p| !p.is_empty()));
        assert_eq!(cut(&mut step, 1), [(0..12).collect::<Vec<_>>()]);
        assert_eq!(step.parts(4).iter().map(StepBatch::len).sum::<usize>(), 5);
    }
}
