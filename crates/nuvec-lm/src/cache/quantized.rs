//! The quantized KV cache (mlx-lm's `QuantizedKVCache`): keys and values stored in MLX's affine
//! format (`kv_bits`, groups of `kv_group_size` along the head dimension), quantized with MLX's own
//! algorithm. Attention reads them dequantized, which is the arithmetic of mlx-lm's quantized
//! attention (`q · (scale * k_q + bias)`).

use nuvec::{Array, PagedSeq, QuantMode, QuantSpec};

use super::ops::{attend_causal, Sinks};
use super::paged::QuantBlocks;
use super::store::{QuantRows, Store};
use crate::{Error, Result};

/// Positions a cache's rows grow by (as the plain cache's buffers), and the block size its
/// rows are read through: one block table `0, 1, 2, ..` over them.
const STEP: usize = 256;

/// Keys and values of one layer, quantized position by position into rows on the device the
/// model's keys come from (as a paged cache's quantized blocks): a new position is quantized
/// where it is, a decode step attends the codes in place, and nothing crosses to the host.
#[derive(Debug, Clone)]
pub struct QuantizedKvCache {
    spec: QuantSpec,
    /// Boxed: a layer's cache is one variant of [`super::LayerCache`], kept small.
    rows: Option<Box<Rows>>,
}

/// The held rows: room for some positions, the first `len` held.
#[derive(Debug, Clone)]
struct Rows {
    keys: QuantBlocks,
    values: QuantBlocks,
    len: usize,
    /// The block table over every row (`0, 1, 2, ..`), remade only when the rows grow, so that
    /// a decode step allocates none.
    table: Vec<u32>,
}

impl Rows {
    fn capacity(&self) -> usize {
        self.keys.positions()
    }

    /// Rows of `keys` and `values` holding `len` positions, with their table.
    fn new(keys: QuantBlocks, values: QuantBlocks, len: usize) -> Self {
        let table = (0..keys.positions().div_ceil(STEP) as u32).collect();
        Rows { keys, values, len, table }
    }

    /// Quantizes `keys, values [kv_heads, L, head_dim]` into positions `len..`, growing the rows
    /// (by whole steps) when they have no room.
    fn append(&mut self, keys: &Array, values: &Array) -> Result<()> {
        let l = keys.dim(1);
        let need = self.len + l;
        if need > self.capacity() {
            let room = need.next_multiple_of(STEP);
            *self = Rows::new(self.keys.grown(self.len, room)?, self.values.grown(self.len, room)?, self.len);
        }
        self.keys.write(self.len, &keys.transpose01()?)?;
        self.values.write(self.len, &values.transpose01()?)?;
        self.len = need;
        Ok(())
    }

    /// Everything held, dequantized to f32 `[kv_heads, len, head_dim]`.
    fn dequantized(&self) -> Result<(Array, Array)> {
        let table = &self.table;
        Ok((self.keys.dequantize(table, STEP, 0, self.len)?, self.values.dequantize(table, STEP, 0, self.len)?))
    }

    /// Causal attention of `q [L, heads, head_dim]` over everything held: a decode step reads the
    /// codes in place ([`nuvec::paged_decode_attention_quantized`]: the attention over the rows
    /// dequantized, bit for bit), a longer pass over the rows dequantized.
    fn attend(&self, q: &Array, scale: f32, sinks: Sinks) -> Result<Array> {
        if q.dim(0) == 1 && self.keys.device() == q.device() {
            let seq = [PagedSeq::new(&self.table, self.len)];
            let (k, v) = (self.keys.rows(), self.values.rows());
            return Ok(nuvec::paged_decode_attention_quantized(q, k, v, &seq, STEP, scale, sinks)?);
        }
        let (k, v) = self.dequantized()?;
        attend_causal(q, &k, &v, scale, sinks)
    }
}

/// The quantization `bits`/`group_size` name, checked against MLX's affine formats.
pub fn kv_spec(bits: usize, group_size: usize) -> Result<QuantSpec> {
    let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size };
    spec.validate_mlx().map_err(|m| Error::Invalid(format!("KV cache quantization: {m}")))?;
    Ok(spec)
}

impl QuantizedKvCache {
    /// An empty cache quantizing to `bits` in groups of `group_size`.
    pub fn new(bits: usize, group_size: usize) -> Result<Self> {
        Ok(QuantizedKvCache { spec: kv_spec(bits, group_size)?, rows: None })
    }

    /// The quantization.
    pub fn spec(&self) -> QuantSpec {
        self.spec
    }

    /// Positions held.
    pub fn offset(&self) -> usize {
        self.rows.as_ref().map_or(0, |r| r.len)
    }

    /// Removes exactly the last `n` positions, or errors leaving the cache unchanged.
    pub fn trim(&mut self, n: usize) -> Result<()> {
        let held = self.offset();
        if n > held {
            return Err(Error::Invalid(format!("cannot trim {n} positions from a cache holding {held}")));
        }
        if let Some(rows) = &mut self.rows {
            rows.len -= n;
        }
        Ok(())
    }

    /// Appends `keys, values [kv_heads, L, head_dim]` (quantized) and attends `q` causally over
    /// everything held.
    pub fn attend(&mut self, q: &Array, keys: &Array, values: &Array, scale: f32) -> Result<Array> {
        self.attend_with_sinks(q, keys, values, scale, None)
    }

    /// [`QuantizedKvCache::attend`] with a sink logit per query head joining each softmax.
    pub fn attend_with_sinks(
        &mut self,
        q: &Array,
        keys: &Array,
        values: &Array,
        scale: f32,
        sinks: Sinks,
    ) -> Result<Array> {
        let (h, d, device) = (keys.dim(0), keys.dim(2), keys.device());
        let rows = match &mut self.rows {
            Some(rows) => rows,
            None => self.rows.insert(Box::new(Rows::new(
                QuantBlocks::new(0, h, d, self.spec, device)?,
                QuantBlocks::new(0, h, d, self.spec, device)?,
                0,
            ))),
        };
        if rows.keys.device() != device {
            // Rows read from a prompt-cache file start on the host.
            rows.keys = rows.keys.to_device(device)?;
            rows.values = rows.values.to_device(device)?;
        }
        rows.append(keys, values)?;
        rows.attend(q, scale, sinks)
    }

    /// A quantized copy of a plain cache's contents `[kv_heads, n, head_dim]` (mlx-lm's
    /// `KVCache.to_quantized`).
    pub fn from_plain(keys: &Array, values: &Array, bits: usize, group_size: usize) -> Result<Self> {
        let spec = kv_spec(bits, group_size)?;
        let (h, d, device) = (keys.dim(0), keys.dim(2), keys.device());
        let mut rows = Rows::new(QuantBlocks::new(0, h, d, spec, device)?, QuantBlocks::new(0, h, d, spec, device)?, 0);
        rows.append(keys, values)?;
        Ok(QuantizedKvCache { spec, rows: Some(Box::new(rows)) })
    }

    /// The held keys and values (for a prompt-cache file).
    pub fn rows(&self) -> Result<Option<(QuantRows, QuantRows)>> {
        let Some(rows) = &self.rows else { return Ok(None) };
        let take = |b: &QuantBlocks| b.held(rows.len);
        Ok(Some((take(&rows.keys)?, take(&rows.values)?)))
    }

    /// A cache holding `keys` and `values`.
    pub fn from_rows(keys: QuantRows, values: QuantRows) -> Result<Self> {
        if keys.len() != values.len() || keys.spec != values.spec {
            return Err(Error::Invalid("quantized keys and values do not match".into()));
        }
        let len = keys.len();
        // Room in whole steps, so that the rows are whole blocks of the table.
        let room = |r: &QuantRows| QuantBlocks::from_rows(r)?.grown(len, len.next_multiple_of(STEP));
        let rows = Rows::new(room(&keys)?, room(&values)?, len);
        Ok(QuantizedKvCache { spec: keys.spec, rows: Some(Box::new(rows)) })
    }
}

// Gemma 4
impl QuantizedKvCache {
    /// Attends `q [L, heads, head_dim]`, the queries of the last `L` positions added, causally
    /// over everything held, as [`QuantizedKvCache::attend`] did when it added them.
    pub fn attend_held(&self, q: &Array, scale: f32) -> Result<Array> {
        let Some(rows) = self.rows.as_ref().filter(|r| r.len > 0) else {
            return Err(Error::Invalid("attending over an empty quantized cache".into()));
        };
        if q.dim(0) > rows.len {
            return Err(Error::Invalid(format!("{} queries for a cache holding {}", q.dim(0), rows.len)));
        }
        rows.attend(q, scale, None)
    }
}
