//! Per-layer caches of past keys and values, in the kinds mlx-lm has: plain (grows in blocks),
//! rotating (`max_kv_size`, with `keep` pinned positions), quantized (`kv_bits`) and chunked
//! (attention within fixed chunks, Llama 4's local layers). Each kind
//! owns the attention mask its layout implies, as mlx-lm's caches make their masks.
//!
//! Every kind keeps an exact trim contract: `trim(n)` removes exactly `n` positions or returns an
//! error, never silently fewer.
//!
//! Hybrid models (Qwen3.5) also have recurrent layers, whose [`RecurrentCache`] holds a state
//! rather than positions: it cannot be trimmed at all.

mod chunked;
mod kv;
pub(crate) mod ops;
pub mod paged;
mod quantized;
mod recurrent;
mod rotating;
mod store;

pub use chunked::ChunkedKvCache;
pub use kv::KvCache;
pub use quantized::{kv_spec, QuantizedKvCache};
pub use recurrent::RecurrentCache;
pub use rotating::RotatingKvCache;
pub use store::{QuantRows, Store};

use nuvec::{Array, DType};
use serde_json::json;

use crate::{Error, Result};

/// Positions held and exact trimming, for the plain cache.
pub trait Positions {
    /// Positions held.
    fn offset(&self) -> usize;
    /// Removes exactly the last `n` positions, or errors leaving the cache unchanged.
    fn trim(&mut self, n: usize) -> Result<()>;
}

/// The element type a cache stores keys and values in (attention still computes in f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    /// 4 bytes per value.
    F32,
    /// IEEE half precision: llama.cpp's default cache type.
    F16,
    /// bfloat16: what mlx-lm stores for a bf16 checkpoint.
    Bf16,
}

impl KvDtype {
    /// Parses `f32`, `f16` or `bf16`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "f32" | "float32" => Ok(KvDtype::F32),
            "f16" | "float16" => Ok(KvDtype::F16),
            "bf16" | "bfloat16" => Ok(KvDtype::Bf16),
            other => Err(Error::Invalid(format!("kv dtype {other:?} is not one of f32, f16, bf16"))),
        }
    }

    /// The array dtype.
    pub fn dtype(self) -> DType {
        match self {
            KvDtype::F32 => DType::F32,
            KvDtype::F16 => DType::F16,
            KvDtype::Bf16 => DType::BF16,
        }
    }

    /// The cache type for arrays of `dtype` (f32 for anything that is not half precision).
    pub fn of(dtype: DType) -> Self {
        match dtype {
            DType::F16 => KvDtype::F16,
            DType::BF16 => KvDtype::Bf16,
            _ => KvDtype::F32,
        }
    }
}

/// Which cache a generation uses. The defaults are mlx-lm's (`quantized_kv_start` 5000, the
/// same in the library and the CLI; `keep` 4 as `make_prompt_cache`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheOptions {
    /// Bound each layer's cache to this many positions (a rotating cache); `None` grows freely.
    pub max_kv_size: Option<usize>,
    /// Positions a rotating cache never evicts (the prompt's first tokens).
    pub keep: usize,
    /// Quantize keys and values to this many bits (4 or 8, or any MLX affine width).
    pub kv_bits: Option<usize>,
    /// Values per quantization group along the head dimension.
    pub kv_group_size: usize,
    /// Quantize a layer's cache once it holds this many positions.
    pub quantized_kv_start: usize,
    /// Store keys and values in this type; `None` takes the model's ([`crate::Model::kv_dtype`]:
    /// the dtype mlx-lm computes the checkpoint in, f16 for GGUF files as llama.cpp).
    #[serde(default)]
    pub kv_dtype: Option<KvDtype>,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            max_kv_size: None,
            keep: 4,
            kv_bits: None,
            kv_group_size: 64,
            quantized_kv_start: 5000,
            kv_dtype: None,
        }
    }
}

impl CacheOptions {
    /// The settings as the command-line flags that ask for them (`--kv-bits 4 --kv-group-size
    /// 64 ...`), for messages about a mismatch.
    pub fn describe(&self) -> String {
        let mut flags = vec![];
        if let Some(n) = self.max_kv_size {
            flags.push(format!("--max-kv-size {n}"));
            if self.keep != CacheOptions::default().keep {
                flags.push(format!("keep {}", self.keep));
            }
        }
        if let Some(bits) = self.kv_bits {
            flags.push(format!(
                "--kv-bits {bits} --kv-group-size {} --quantized-kv-start {}",
                self.kv_group_size, self.quantized_kv_start
            ));
        }
        if let Some(dtype) = self.kv_dtype {
            flags.push(format!("--kv-dtype {}", dtype.dtype()));
        }
        if self.max_kv_size.is_none() {
            flags.push("no --max-kv-size".into());
        }
        if self.kv_bits.is_none() {
            flags.push("no --kv-bits".into());
        }
        format!("({})", flags.join(", "))
    }

    /// Checks the combination, naming the bad setting.
    pub fn validate(&self) -> Result<()> {
        if let Some(max) = self.max_kv_size {
            if max <= self.keep {
                return Err(Error::Invalid(format!("max_kv_size = {max} must exceed keep = {}", self.keep)));
            }
        }
        if let Some(bits) = self.kv_bits {
            QuantizedKvCache::new(bits, self.kv_group_size)?;
        }
        Ok(())
    }
}

/// One layer's cache.
#[derive(Debug)]
pub enum LayerCache {
    /// Grows in blocks of 256 positions.
    Plain(KvCache),
    /// Bounded, with pinned positions.
    Rotating(RotatingKvCache),
    /// Quantized keys and values.
    Quantized(QuantizedKvCache),
    /// Bounded, with pinned positions, quantized (mlx-lm refuses this combination).
    QuantizedRotating(RotatingKvCache<QuantRows>),
    /// Attention within chunks of positions; a model's layer asks for it, not [`CacheOptions`].
    Chunked(ChunkedKvCache),
    // ---- Gated DeltaNet ----
    /// A linear-attention layer's convolution inputs and recurrent state (trimmed only where it
    /// kept the states to go back to).
    Recurrent(RecurrentCache),
    /// One sequence's block table into a [`paged::PagedCache`]'s shared pool.
    Paged(paged::PagedKv),
}

impl LayerCache {
    /// A fresh cache of the kind `options` asks for (a quantized one starts plain and is
    /// converted at `quantized_kv_start`, as in mlx-lm), storing `options.kv_dtype` (f32 when
    /// unset; [`crate::Model::make_cache`] fills in the model's).
    pub fn new(options: &CacheOptions) -> Result<Self> {
        let dtype = options.kv_dtype.unwrap_or(KvDtype::F32).dtype();
        Ok(match options.max_kv_size {
            Some(max) => LayerCache::Rotating(RotatingKvCache::with_context(max, options.keep, dtype)?),
            None => LayerCache::Plain(KvCache::with_dtype(dtype)),
        })
    }

    /// Positions seen (a rotating cache may hold fewer).
    pub fn offset(&self) -> usize {
        match self {
            LayerCache::Plain(c) => c.offset(),
            LayerCache::Rotating(c) => c.offset(),
            LayerCache::Quantized(c) => c.offset(),
            LayerCache::QuantizedRotating(c) => c.offset(),
            LayerCache::Chunked(c) => c.offset(),
            LayerCache::Recurrent(c) => c.offset(),
            LayerCache::Paged(c) => c.offset(),
        }
    }

    /// Removes exactly the last `n` positions, or errors leaving the cache unchanged.
    pub fn trim(&mut self, n: usize) -> Result<()> {
        match self {
            LayerCache::Plain(c) => c.trim(n),
            LayerCache::Rotating(c) => c.trim(n),
            LayerCache::Quantized(c) => c.trim(n),
            LayerCache::QuantizedRotating(c) => c.trim(n),
            LayerCache::Chunked(c) => c.trim(n),
            LayerCache::Recurrent(c) => c.trim(n),
            LayerCache::Paged(c) => c.trim(n),
        }
    }

    /// Whether `trim(n)` would succeed: the caches whose old positions are gone (a wrapped ring,
    /// a recurrent state) give back only what they kept (see [`RecurrentCache::keep_rewind`]).
    pub fn can_trim(&self, n: usize) -> bool {
        match self {
            LayerCache::Rotating(c) => c.can_trim(n),
            LayerCache::QuantizedRotating(c) => c.can_trim(n),
            LayerCache::Recurrent(c) => c.can_trim(n),
            _ => n <= self.offset(),
        }
    }

    /// Adds `keys, values [L, kv_heads, head_dim]` (positions first, as the projections give
    /// them) and attends `q [L, heads, head_dim]` over what the cache holds, with its mask.
    pub fn attend(&mut self, q: &Array, keys: &Array, values: &Array, scale: f32) -> Result<Array> {
        self.attend_with_sinks(q, keys, values, scale, None)
    }

    /// [`LayerCache::attend`] with `sinks` (one logit per query head, gpt-oss's attention
    /// sinks) joining each softmax when given.
    pub fn attend_with_sinks(
        &mut self,
        q: &Array,
        keys: &Array,
        values: &Array,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        match self {
            LayerCache::Plain(c) => {
                let (k, v) = c.update_and_fetch_rows(keys, values)?;
                ops::sdpa(q, &k, &v, c.offset(), scale, sinks)
            }
            LayerCache::Rotating(c) => {
                c.attend_with_sinks(q, &keys.transpose01()?, &values.transpose01()?, scale, sinks)
            }
            LayerCache::Quantized(c) => {
                c.attend_with_sinks(q, &keys.transpose01()?, &values.transpose01()?, scale, sinks)
            }
            LayerCache::QuantizedRotating(c) => {
                c.attend_with_sinks(q, &keys.transpose01()?, &values.transpose01()?, scale, sinks)
            }
            LayerCache::Chunked(c) if sinks.is_none() => c.attend(q, keys, values, scale),
            LayerCache::Chunked(_) => {
                Err(Error::Unsupported("attention sinks over a chunked cache are not built (no model has both)".into()))
            }
            LayerCache::Recurrent(_) => {
                Err(Error::Invalid("an attention layer was given a recurrent (Gated DeltaNet) cache".into()))
            }
            LayerCache::Paged(c) => c.attend(q, keys, values, scale, sinks),
        }
    }

    /// mlx-lm's `maybe_quantize_kv_cache`: a cache holding at least `quantized_kv_start`
    /// positions becomes a quantized one (after each forward pass). A rotating cache becomes a
    /// quantized rotating one, keeping its ring.
    pub fn maybe_quantize(&mut self, options: &CacheOptions) -> Result<()> {
        let Some(bits) = options.kv_bits else {
            return Ok(());
        };
        if self.offset() < options.quantized_kv_start || self.offset() == 0 {
            return Ok(());
        }
        match self {
            LayerCache::Plain(c) => {
                let (k, v) = c.state()?.expect("a cache holding positions has state");
                *self = LayerCache::Quantized(QuantizedKvCache::from_plain(&k, &v, bits, options.kv_group_size)?);
            }
            LayerCache::Rotating(c) => {
                *self = LayerCache::QuantizedRotating(c.convert(kv_spec(bits, options.kv_group_size)?)?);
            }
            LayerCache::Quantized(_) | LayerCache::QuantizedRotating(_) | LayerCache::Recurrent(_) => {}
            // mlx-lm leaves such a layer in full precision without a word.
            LayerCache::Chunked(_) => {
                return Err(Error::Unsupported(
                    "kv_bits: quantized keys and values for a chunked-attention layer are not built; run \
                     without --kv-bits"
                        .into(),
                ))
            }
            LayerCache::Paged(_) => {
                return Err(Error::Unsupported(
                    "kv_bits: a paged cache is quantized when it is made (PagedCache::new_quantized, \
                     BatcherOptions::kv_bits), not converted later"
                        .into(),
                ))
            }
        }
        Ok(())
    }

    /// The cache as named arrays and a JSON description, for a prompt-cache file.
    pub fn save_state(&self) -> Result<(Vec<(String, Array)>, serde_json::Value)> {
        type Named = (Vec<(String, Array)>, [usize; 2]);
        let named = |prefix: &str, rows: &QuantRows| -> Result<Named> {
            let (parts, shape) = rows.to_parts()?;
            let names = ["words", "scales", "biases"].map(|n| format!("{prefix}_{n}"));
            Ok((names.into_iter().zip(parts).collect(), shape))
        };
        Ok(match self {
            LayerCache::Plain(c) => match c.state()? {
                Some((k, v)) => (vec![("keys".into(), k), ("values".into(), v)], json!({"kind": "kv"})),
                None => (vec![], json!({"kind": "kv"})),
            },
            LayerCache::Rotating(c) => match c.state() {
                Some((k, v, counters)) => {
                    (vec![("keys".into(), k), ("values".into(), v)], json!({"kind": "rotating", "counters": counters}))
                }
                None => (vec![], json!({"kind": "rotating", "counters": null})),
            },
            LayerCache::Quantized(c) => {
                let spec = c.spec();
                let mut arrays = vec![];
                let mut shape = [0, 0];
                if let Some((k, v)) = c.rows()? {
                    let (ka, s) = named("key", &k)?;
                    let (va, _) = named("value", &v)?;
                    arrays = ka.into_iter().chain(va).collect();
                    shape = s;
                }
                (arrays, json!({"kind": "quantized", "bits": spec.bits, "group_size": spec.group_size, "shape": shape}))
            }
            LayerCache::QuantizedRotating(c) => {
                let spec = *c.context();
                let (k, v, counters) = c.state().expect("a quantized rotating cache holds positions");
                let (ka, shape) = named("key", &k)?;
                let (va, _) = named("value", &v)?;
                let description = json!({"kind": "quantized-rotating", "bits": spec.bits, "group_size": spec.group_size,
                                         "shape": shape, "counters": counters});
                (ka.into_iter().chain(va).collect(), description)
            }
            LayerCache::Chunked(c) => {
                let chunk = c.chunk_size();
                match c.state()? {
                    Some((k, v, start)) => (
                        vec![("keys".into(), k), ("values".into(), v)],
                        json!({"kind": "chunked", "chunk_size": chunk, "start": start}),
                    ),
                    None => (vec![], json!({"kind": "chunked", "chunk_size": chunk, "start": c.start()})),
                }
            }
            LayerCache::Recurrent(c) => match c.state() {
                Some((conv, state)) => (
                    vec![("conv".into(), conv.clone()), ("state".into(), state.clone())],
                    json!({"kind": "recurrent", "offset": c.offset()}),
                ),
                None => (vec![], json!({"kind": "recurrent", "offset": 0})),
            },
            LayerCache::Paged(_) => {
                return Err(Error::Unsupported(
                    "saving a paged sequence to a prompt-cache file is not built yet; save a plain cache".into(),
                ))
            }
        })
    }

    /// A cache restored from [`LayerCache::save_state`]'s description and arrays (`get` fetches
    /// one by name). `options` makes the empty caches a file lists without arrays.
    pub fn load_state(
        description: &serde_json::Value,
        get: impl Fn(&str) -> Result<Array>,
        options: &CacheOptions,
    ) -> Result<Self> {
        let bad = |m: &str| Error::Invalid(format!("a cache described as {description}: {m}"));
        let count =
            |v: &serde_json::Value| v.as_u64().map(|n| n as usize).ok_or_else(|| bad("a count is not a number"));
        let counters = || -> Result<Option<[usize; 4]>> {
            match description["counters"].as_array() {
                Some(c) if c.len() == 4 => Ok(Some([count(&c[0])?, count(&c[1])?, count(&c[2])?, count(&c[3])?])),
                _ => Ok(None),
            }
        };
        let rows = |prefix: &str| -> Result<QuantRows> {
            let spec = kv_spec(count(&description["bits"])?, count(&description["group_size"])?)?;
            let shape = description["shape"].as_array().ok_or_else(|| bad("no shape"))?;
            let shape = [count(&shape[0])?, count(&shape[1])?];
            let parts = ["words", "scales", "biases"].map(|n| get(&format!("{prefix}_{n}")));
            let [w, s, b] = parts;
            QuantRows::from_parts(spec, [&w?, &s?, &b?], shape)
        };
        match description["kind"].as_str() {
            Some("kv") => match get("keys") {
                Ok(k) => Ok(LayerCache::Plain(KvCache::from_state(&k, &get("values")?)?)),
                Err(_) => Ok(LayerCache::Plain(KvCache::new())),
            },
            Some("rotating") => match counters()? {
                Some(c) => {
                    let keys = get("keys")?;
                    let dtype = keys.dtype();
                    Ok(LayerCache::Rotating(RotatingKvCache::from_state(keys, get("values")?, dtype, c)?))
                }
                None => LayerCache::new(options),
            },
            Some("quantized") => match get("key_words") {
                Ok(_) => Ok(LayerCache::Quantized(QuantizedKvCache::from_rows(rows("key")?, rows("value")?)?)),
                Err(_) => Ok(LayerCache::Quantized(QuantizedKvCache::new(
                    count(&description["bits"])?,
                    count(&description["group_size"])?,
                )?)),
            },
            Some("quantized-rotating") => {
                let c = counters()?.ok_or_else(|| bad("no counters"))?;
                let spec = kv_spec(count(&description["bits"])?, count(&description["group_size"])?)?;
                Ok(LayerCache::QuantizedRotating(RotatingKvCache::from_state(rows("key")?, rows("value")?, spec, c)?))
            }
            Some("chunked") => {
                let (chunk, start) = (count(&description["chunk_size"])?, count(&description["start"])?);
                match get("keys") {
                    Ok(k) => Ok(LayerCache::Chunked(ChunkedKvCache::from_state(&k, &get("values")?, start, chunk)?)),
                    Err(_) => Ok(LayerCache::Chunked(ChunkedKvCache::empty_at(start, chunk)?)),
                }
            }
            Some("recurrent") => match count(&description["offset"])? {
                0 => Ok(LayerCache::Recurrent(RecurrentCache::new())),
                n => Ok(LayerCache::Recurrent(RecurrentCache::from_state(get("conv")?, get("state")?, n)?)),
            },
            _ => Err(bad("unknown kind")),
        }
    }
}

// Gemma 4
impl LayerCache {
    /// Attends `q [L, heads, head_dim]`, the queries of the last `L` positions added, over the
    /// keys and values this cache holds, with the mask [`LayerCache::attend`] used when it added
    /// them. Gemma 4's KV-shared layers attend this way over an earlier layer's cache, in the
    /// same forward pass, without a cache of their own.
    pub fn attend_held(&self, q: &Array, scale: f32) -> Result<Array> {
        match self {
            LayerCache::Plain(c) => {
                let (l, held) = (q.dim(0), c.offset());
                let Some((k, v)) = c.buffers().filter(|_| l > 0 && l <= held) else {
                    return Err(Error::Invalid(format!("{l} queries for a cache holding {held} positions")));
                };
                Ok(nuvec::attention(q, k, v, held, scale)?)
            }
            LayerCache::Rotating(c) => c.attend_held(q, scale),
            LayerCache::Quantized(c) => c.attend_held(q, scale),
            LayerCache::QuantizedRotating(c) => c.attend_held(q, scale),
            LayerCache::Paged(c) => c.attend_held(q, scale, None),
            LayerCache::Chunked(_) | LayerCache::Recurrent(_) => Err(Error::Invalid(
                "a KV-shared layer can only attend over a plain, rotating, quantized or paged cache".into(),
            )),
        }
    }
}
