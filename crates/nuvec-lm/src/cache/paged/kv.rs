//! A sequence's keys and values for one layer of a [`super::PagedCache`]: its length, and the
//! sequence's block table (shared by all its layers, grown by the cache before each step) into
//! the layer's store. The rows of a step's sequences that bring one row (a decode) or a few over
//! a cached prefix (a short prefill chunk, a verification pass) are attended together in one op
//! that reads the blocks in place ([`attend_decodes`]), each row as a decode at its position
//! computes it; otherwise attention reads the sequence's blocks gathered into one array (a row
//! gather and a transpose) and gives bit for bit what a plain cache's pass of those rows gives.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use nuvec::{Array, DType, Device, PagedSeq};

use super::pool::lock;
use super::store::{runs, LayerStore};
use crate::cache::ops::{attend_causal, attend_windowed, on_device_of, sdpa, Sinks};
use crate::cache::Positions;
use crate::{Error, Result};

/// One layer of one paged sequence.
#[derive(Debug)]
pub struct PagedKv {
    store: Arc<Mutex<LayerStore>>,
    table: Arc<Mutex<Vec<u32>>>,
    block_size: usize,
    len: usize,
    /// A sliding-window layer's window: each query sees the last `window` positions, itself
    /// included (what mlx-lm's rotating cache with nothing pinned gives, prefilled whole, in
    /// chunks or decoding).
    window: Option<usize>,
    /// In a quantized store, the rows of a first pass (from position 0) as it computed them,
    /// `[kv_heads, L, head_dim]`, until the pass ends: its KV-shared layers read what it read.
    fresh: Option<(Array, Array)>,
}

impl PagedKv {
    pub(crate) fn new(
        store: Arc<Mutex<LayerStore>>,
        table: Arc<Mutex<Vec<u32>>>,
        block_size: usize,
        window: Option<usize>,
    ) -> Self {
        PagedKv { store, table, block_size, len: 0, window, fresh: None }
    }

    /// Whether `other` is a layer of the same paged cache's store.
    pub(crate) fn same_store(&self, other: &PagedKv) -> bool {
        Arc::ptr_eq(&self.store, &other.store)
    }

    /// The sliding window, for a sliding-window layer.
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Starts the layer at `len` positions already in its table's blocks (a shared prefix).
    pub(crate) fn set_held(&mut self, len: usize) {
        self.len = len;
    }

    /// The block ids this sequence holds, in position order.
    pub fn block_table(&self) -> Vec<u32> {
        lock(&self.table).clone()
    }

    /// Appends `keys, values [L, kv_heads, head_dim]` into the blocks the cache reserved.
    pub(crate) fn write(&mut self, keys: &Array, values: &Array) -> Result<()> {
        let l = keys.dim(0);
        let bs = self.block_size;
        let table = lock(&self.table);
        if table.len() * bs < self.len + l {
            return Err(Error::Invalid(format!(
                "a paged sequence of {} positions in {} blocks was given {l} more without blocks reserved for them",
                self.len,
                table.len()
            )));
        }
        let mut store = lock(&self.store);
        let mut at = 0;
        for (start, n) in runs(&table, bs, self.len, self.len + l) {
            if n == l {
                store.write(start, keys, values)?;
            } else {
                store.write(start, &keys.slice_rows(at, at + n)?, &values.slice_rows(at, at + n)?)?;
            }
            at += n;
        }
        self.len += l;
        Ok(())
    }

    /// The held keys and values, `[kv_heads, blocks * block_size, head_dim]` each (valid up to
    /// `offset()`).
    pub(crate) fn gathered(&self) -> Result<(Array, Array)> {
        let table = lock(&self.table);
        let used = self.len.div_ceil(self.block_size);
        if used == 0 {
            return Err(Error::Invalid("a paged sequence with no positions has nothing to attend".into()));
        }
        lock(&self.store).gather(&table[..used])
    }

    /// Adds `keys, values [L, kv_heads, head_dim]` and attends `q [L, heads, head_dim]` over
    /// every position held (causal within the new ones), as a plain cache does; a
    /// sliding-window layer over the window of each query.
    pub(crate) fn attend(
        &mut self,
        q: &Array,
        keys: &Array,
        values: &Array,
        scale: f32,
        sinks: Sinks,
    ) -> Result<Array> {
        let plain = lock(&self.store).first_pass_dtype();
        if let Some(dtype) = plain.filter(|_| self.len == 0) {
            // mlx-lm quantizes a cache after the pass that filled it (`quantized_kv_start` 0):
            // the first pass holds its rows in the plain cache's type and attends them so;
            // they are quantized from those values, and every later pass reads them quantized.
            let (keys, values) = (keys.astype(dtype)?, values.astype(dtype)?);
            self.write(&keys, &values)?;
            let (k, v) = (keys.transpose01()?, values.transpose01()?);
            let out = self.attend_rows(q, &k, &v, 0, scale, sinks);
            self.fresh = Some((k, v));
            return out;
        }
        self.write(keys, values)?;
        self.attend_held(q, scale, sinks)
    }

    /// Ends a forward pass: what the layer attends from now on is read from its store.
    pub(crate) fn end_pass(&mut self) {
        self.fresh = None;
    }

    /// Whether a decode step of this layer can attend it with the other sequences of its store
    /// in one op ([`attend_decodes`]): a plain store, or quantized rows past the sequence's first
    /// pass (which attends its own rows in full precision, as do the layers that share its keys
    /// until it ends).
    pub(crate) fn decodes_together(&self) -> bool {
        let store = lock(&self.store);
        let past_first_pass = self.len > 0 && self.fresh.is_none();
        store.reads_in_place() && (store.first_pass_dtype().is_none() || past_first_pass)
    }

    /// Attends `q [L, heads, head_dim]`, the queries of the last `L` positions added, over what
    /// they see (Gemma 4's KV-shared layers call it alone, over an earlier layer's cache).
    pub(crate) fn attend_held(&self, q: &Array, scale: f32, sinks: Sinks) -> Result<Array> {
        let l = q.dim(0);
        if l == 0 || l > self.len {
            return Err(Error::Invalid(format!("{l} queries for a paged sequence holding {}", self.len)));
        }
        if let Some((k, v)) = self.fresh.as_ref().filter(|(k, _)| k.dim(1) == self.len) {
            return self.attend_rows(q, k, v, self.len - l, scale, sinks);
        }
        let Some(window) = self.window else {
            let (k, v) = self.gathered()?;
            return sdpa(q, &k, &v, self.len, scale, sinks);
        };
        // The positions before the new ones that a window still reaches (mlx-lm's rotating cache
        // keeps `window - 1` of them for a chunk, and a decode step sees the last `window`).
        let first_new = self.len - l;
        let from = first_new.saturating_sub(window - 1);
        let (k, v) = lock(&self.store).gather_range(&lock(&self.table), from, self.len)?;
        self.attend_rows(q, &k, &v, first_new - from, scale, sinks)
    }

    /// Attends `q [L, heads, head_dim]`, the queries of the last `L` of the rows `k, v [kv_heads,
    /// held + L, head_dim]` (`held` earlier positions, then the new ones), over what each sees:
    /// all of them causally, or a sliding-window layer's window.
    fn attend_rows(&self, q: &Array, k: &Array, v: &Array, held: usize, scale: f32, sinks: Sinks) -> Result<Array> {
        let l = q.dim(0);
        let Some(window) = self.window else {
            return sdpa(q, k, v, held + l, scale, sinks);
        };
        if l == 1 {
            let (k, v) = on_device_of(q, k, v)?;
            sdpa(q, &k, &v, held + 1, scale, sinks)
        } else if held + l > window {
            attend_windowed(q, k, v, held, window, scale, sinks)
        } else {
            attend_causal(q, k, v, scale, sinks)
        }
    }
}

/// The sequences of one step whose rows are attended in place together over one paged store:
/// each one's layer and how many new rows it brings (one for a decode; a short prefill chunk or a
/// verification pass over a cached prefix brings several, each attended as a decode at its own
/// position).
pub(crate) struct InPlace<'c> {
    seqs: Vec<&'c mut PagedKv>,
    rows: Vec<usize>,
}

impl<'c> InPlace<'c> {
    /// No sequences yet.
    pub(crate) fn new() -> Self {
        InPlace { seqs: vec![], rows: vec![] }
    }

    /// Adds a sequence's layer with its `rows` new rows (the next rows of the step's arrays).
    pub(crate) fn push(&mut self, seq: &'c mut PagedKv, rows: usize) {
        self.seqs.push(seq);
        self.rows.push(rows);
    }

    /// The rows of every sequence, in order.
    pub(crate) fn total_rows(&self) -> usize {
        self.rows.iter().sum()
    }

    /// Each sequence's layer and its rows of the step's in-place arrays, in order.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&mut PagedKv, Range<usize>)> + use<'_, 'c> {
        self.seqs.iter_mut().map(|s| &mut **s).zip(spans(&self.rows))
    }

    /// Each sequence's layer and its rows of the step's in-place arrays, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&PagedKv, Range<usize>)> + use<'_, 'c> {
        self.seqs.iter().map(|s| &**s).zip(spans(&self.rows))
    }

    /// The first sequence's layer: every sequence's must be of its store.
    fn first_of_one_store(&self) -> Result<&PagedKv> {
        let Some(first) = self.seqs.first() else {
            return Err(Error::Invalid("a step attended in place with no sequences".into()));
        };
        if self.seqs.iter().any(|s| !s.same_store(first)) {
            return Err(Error::Invalid("sequences attended in place together must share one paged layer".into()));
        }
        Ok(first)
    }
}

/// Consecutive ranges of `rows[i]` rows each, from row 0.
fn spans(rows: &[usize]) -> impl Iterator<Item = Range<usize>> + '_ {
    rows.iter().scan(0, |at, &n| {
        *at += n;
        Some(*at - n..*at)
    })
}

/// The rows of the new positions of `seqs` (layers of one store), in order, written by `write`:
/// it gets each row's position and its row in the store, and the store's keys and values (made
/// for `heads` heads of `dim` features on `device` at the first write), and returns what the
/// layer goes on with. Each sequence then holds its rows more.
pub(crate) fn write_decodes(
    seqs: &mut InPlace<'_>,
    (heads, dim, device): (usize, usize, Device),
    write: impl FnOnce((&[usize], &[usize]), (&mut Array, &mut Array)) -> Result<Array>,
) -> Result<Array> {
    let store = seqs.first_of_one_store()?.store.clone();
    let n = seqs.total_rows();
    let mut positions = Vec::with_capacity(n);
    let mut slots = Vec::with_capacity(n);
    for (s, span) in seqs.iter() {
        let rows = span.len();
        let table = lock(&s.table);
        for pos in s.len..s.len + rows {
            let Some(&block) = table.get(pos / s.block_size) else {
                return Err(Error::Invalid(format!(
                    "a paged sequence of {} positions in {} blocks was given {rows} more without blocks reserved for them",
                    s.len,
                    table.len()
                )));
            };
            positions.push(pos);
            slots.push(block as usize * s.block_size + pos % s.block_size);
        }
    }
    let mut store = lock(&store);
    let out = if store.first_pass_dtype().is_some() {
        // Quantized rows: `write` puts them into f32 rows of their own, quantized into the
        // sequences' slots after.
        let mut keys = Array::zeros_on(&[1, n, heads * dim], DType::F32, device)?;
        let mut values = Array::zeros_on(&[1, n, heads * dim], DType::F32, device)?;
        let own: Vec<usize> = (0..n).collect();
        let out = write((&positions, &own), (&mut keys, &mut values))?;
        let rows = |a: Array| a.reshape(&[n, heads * dim]);
        store.write_quantized_slots(&slots, &rows(keys)?, &rows(values)?)?;
        out
    } else {
        write((&positions, &slots), store.arrays_mut(heads, dim, device)?)?
    };
    for (s, span) in seqs.iter_mut() {
        s.len += span.len();
    }
    Ok(out)
}

/// Attends `q [rows, heads, head_dim]`, the rows of `seqs` in order (each sequence's last rows,
/// their keys and values written already), each row over the positions up to its own (a
/// sliding-window layer's: the last `window` of them), as one op over the store the sequences
/// share: what [`PagedKv::attend_held`] gives each sequence's rows, without the per-sequence
/// gathers, each row as a decode at its position computes it.
pub(crate) fn attend_decodes(seqs: &InPlace<'_>, q: &Array, scale: f32, sinks: Sinks) -> Result<Array> {
    let first = seqs.first_of_one_store()?;
    // Each sequence has a table of its own (a step holds a sequence once), so holding them all
    // at once cannot deadlock.
    let tables: Vec<_> = seqs.iter().map(|(s, _)| lock(&s.table)).collect();
    let mut paged: Vec<PagedSeq> = Vec::with_capacity(seqs.total_rows());
    for ((s, span), t) in seqs.iter().zip(&tables) {
        let rows = span.len();
        if rows == 0 || rows > s.len {
            return Err(Error::Invalid(format!("{rows} rows of a paged sequence holding {}", s.len)));
        }
        // Row `j` of the sequence's last `rows` is the query at position `len - rows + j`.
        paged.extend((s.len + 1 - rows..=s.len).map(|len| match s.window {
            Some(window) => PagedSeq::windowed(t, len, window),
            None => PagedSeq::new(t, len),
        }));
    }
    let store = lock(&first.store);
    if let Some((k, v)) = store.quantized_rows() {
        return Ok(nuvec::paged_decode_attention_quantized(q, k, v, &paged, first.block_size, scale, sinks)?);
    }
    let (k, v) = store.arrays()?;
    Ok(nuvec::paged_decode_attention(q, k, v, &paged, first.block_size, scale, sinks)?)
}

impl Positions for PagedKv {
    fn offset(&self) -> usize {
        self.len
    }

    /// Removes exactly `n` positions (their blocks go back when the cache trims the table).
    fn trim(&mut self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(Error::Invalid(format!(
                "cannot trim {n} positions from a paged sequence holding {}",
                self.len
            )));
        }
        self.len -= n;
        Ok(())
    }
}
