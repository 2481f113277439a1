//! The quantized KV cache (mlx-lm's `QuantizedKVCache`): keys and values stored in MLX's affine
//! format (`kv_bits`, groups of `kv_group_size` along the head dimension), quantized with MLX's own
//! algorithm. Attention reads them dequantized, which is the arithmetic of mlx-lm's quantized
//! attention (`q · (scale * k_q + bias)`).

use nuvec::{Array, QuantMode, QuantSpec};

use super::ops::{attend_causal, Sinks};
use super::store::{QuantRows, Store};
use crate::{Error, Result};

/// Keys and values of one layer, quantized position by position.
#[derive(Debug, Clone)]
pub struct QuantizedKvCache {
    spec: QuantSpec,
    keys: Option<QuantRows>,
    values: Option<QuantRows>,
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
        Ok(QuantizedKvCache { spec: kv_spec(bits, group_size)?, keys: None, values: None })
    }

    /// The quantization.
    pub fn spec(&self) -> QuantSpec {
        self.spec
    }

    /// Positions held.
    pub fn offset(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.len())
    }

    /// Removes exactly the last `n` positions, or errors leaving the cache unchanged.
    pub fn trim(&mut self, n: usize) -> Result<()> {
        let held = self.offset();
        if n > held {
            return Err(Error::Invalid(format!("cannot trim {n} positions from a cache holding {held}")));
        }
        for rows in [&mut self.keys, &mut self.values].into_iter().flatten() {
            rows.rows.truncate(held - n);
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
        for (held, new) in [(&mut self.keys, keys), (&mut self.values, values)] {
            let new = QuantRows::quantize(new, self.spec)?;
            *held = Some(match held.take() {
                Some(old) => QuantRows::concat(&[old, new])?,
                None => new,
            });
        }
        let (k, v) = (self.keys.as_ref().expect("set"), self.values.as_ref().expect("set"));
        attend_causal(q, &k.to_array()?, &v.to_array()?, scale, sinks)
    }

    /// A quantized copy of a plain cache's contents `[kv_heads, n, head_dim]` (mlx-lm's
    /// `KVCache.to_quantized`).
    pub fn from_plain(keys: &Array, values: &Array, bits: usize, group_size: usize) -> Result<Self> {
        let spec = kv_spec(bits, group_size)?;
        Ok(QuantizedKvCache {
            spec,
            keys: Some(QuantRows::quantize(keys, spec)?),
            values: Some(QuantRows::quantize(values, spec)?),
        })
    }

    /// The held keys and values (for a prompt-cache file).
    pub fn rows(&self) -> Option<(&QuantRows, &QuantRows)> {
        Some((self.keys.as_ref()?, self.values.as_ref()?))
    }

    /// A cache holding `keys` and `values`.
    pub fn from_rows(keys: QuantRows, values: QuantRows) -> Result<Self> {
        if keys.len() != values.len() || keys.spec != values.spec {
            return Err(Error::Invalid("quantized keys and values do not match".into()));
        }
        Ok(QuantizedKvCache { spec: keys.spec, keys: Some(keys), values: Some(values) })
    }
}

// Gemma 4
impl QuantizedKvCache {
    /// Attends `q [L, heads, head_dim]`, the queries of the last `L` positions added, causally
    /// over everything held, as [`QuantizedKvCache::attend`] did when it added them.
    pub fn attend_held(&self, q: &Array, scale: f32) -> Result<Array> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Err(Error::Invalid("attending over an empty quantized cache".into()));
        };
        if q.dim(0) > k.len() {
            return Err(Error::Invalid(format!("{} queries for a cache holding {}", q.dim(0), k.len())));
        }
        attend_causal(q, &k.to_array()?, &v.to_array()?, scale, None)
    }
}
