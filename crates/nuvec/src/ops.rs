//! Ops as methods on [`Array`], dispatched to the array's device backend.

use crate::{backend, Array, Matrix, Result};

impl Array {
    /// `self [M, K] @ w^T -> [M, N]`.
    pub fn linear(&self, w: &Matrix) -> Result<Array> {
        backend(self.device()).linear(self, w)
    }

    /// `self @ ws[i]^T` for each weight, in order; see [`crate::Backend::linear_many`].
    pub fn linear_many(&self, ws: &[&Matrix]) -> Result<Vec<Array>> {
        backend(self.device()).linear_many(self, ws)
    }

    /// `self @ ws[i]^T + biases[i]` for each weight, in order; see
    /// [`crate::Backend::linear_many_bias`].
    pub fn linear_many_bias(&self, ws: &[&Matrix], biases: &[&Array]) -> Result<Vec<Array>> {
        backend(self.device()).linear_many_bias(self, ws, biases)
    }

    /// `(silu(self) * up) @ w^T`; see [`crate::Backend::silu_mul_linear`].
    pub fn silu_mul_linear(&self, up: &Array, w: &Matrix) -> Result<Array> {
        backend(self.device()).silu_mul_linear(self, up, w)
    }

    /// RMS norm over the last axis.
    pub fn rms_norm(&self, weight: &Array, eps: f32) -> Result<Array> {
        backend(self.device()).rms_norm(self, weight, eps)
    }

    /// Rotary embedding; see [`crate::Backend::rope`].
    pub fn rope(&self, inv_freqs: &[f32], offset: usize, traditional: bool) -> Result<Array> {
        backend(self.device()).rope(self, inv_freqs, offset, traditional)
    }

    /// `[A, B, C] -> [B, A, C]`.
    pub fn transpose01(&self) -> Result<Array> {
        backend(self.device()).transpose01(self)
    }

    /// Elementwise sum.
    pub fn add(&self, other: &Array) -> Result<Array> {
        backend(self.device()).add(self, other)
    }

    /// Adds a bias row to every row.
    pub fn add_bias(&self, bias: &Array) -> Result<Array> {
        backend(self.device()).add_bias(self, bias)
    }

    /// `self [M, N] + t [M, R] · wᵀ` (`w` f32 `[N, R]`); see [`crate::Backend::add_linear`].
    pub fn add_linear(&self, t: &Array, w: &Array) -> Result<Array> {
        backend(self.device()).add_linear(self, t, w)
    }

    /// Multiplies every row by `w` entry by entry.
    pub fn mul_columns(&self, w: &Array) -> Result<Array> {
        backend(self.device()).mul_columns(self, w)
    }

    /// `silu(self) * up`.
    pub fn silu_mul(&self, up: &Array) -> Result<Array> {
        backend(self.device()).silu_mul(self, up)
    }

    /// Rows `start..end`.
    pub fn slice_rows(&self, start: usize, end: usize) -> Result<Array> {
        backend(self.device()).slice_rows(self, start, end)
    }

    /// Index of the largest value along the last axis.
    pub fn argmax(&self) -> Result<Array> {
        backend(self.device()).argmax(self)
    }

    /// Writes `src` into `self` at `offset` along axis 1; see [`crate::Backend::write_axis1`].
    pub fn write_axis1(&mut self, src: &Array, offset: usize) -> Result<()> {
        backend(self.device()).write_axis1(self, src, offset)
    }

    /// Writes one position `src` into `self`, a ring whose positions from `keep` on are reused
    /// in turn, at `offset`; see [`crate::Backend::write_axis1_ring`].
    pub fn write_axis1_ring(&mut self, src: &Array, offset: usize, keep: usize) -> Result<()> {
        backend(self.device()).write_axis1_ring(self, src, offset, keep)
    }

    /// Writes `src [n, A, C]` into `self [A, capacity, C]` at `offset` along axis 1; see
    /// [`crate::Backend::write_axis1_from_rows`].
    pub fn write_axis1_from_rows(&mut self, src: &Array, offset: usize) -> Result<()> {
        backend(self.device()).write_axis1_from_rows(self, src, offset)
    }
}

// Gemma 4
impl Array {
    /// `gelu_approx(self) * up`; see [`crate::Backend::gelu_mul`].
    pub fn gelu_mul(&self, up: &Array) -> Result<Array> {
        backend(self.device()).gelu_mul(self, up)
    }

    /// gpt-oss's clamped SwiGLU of `self` (the gate) and `up`; see [`crate::Backend::swiglu_oai`].
    pub fn swiglu_oai(&self, up: &Array, alpha: f32, limit: f32) -> Result<Array> {
        backend(self.device()).swiglu_oai(self, up, alpha, limit)
    }

    /// `self * s`.
    pub fn scale(&self, s: f32) -> Result<Array> {
        backend(self.device()).scale(self, s)
    }

    /// `tanh(self / cap) * cap`; see [`crate::Backend::softcap`].
    pub fn softcap(&self, cap: f32) -> Result<Array> {
        backend(self.device()).softcap(self, cap)
    }
}

/// Causal attention with per-head sink logits; see [`crate::Backend::attention_sinks`].
pub fn attention_sinks(q: &Array, k: &Array, v: &Array, kv_len: usize, scale: f32, sinks: &[f32]) -> Result<Array> {
    backend(q.device()).attention_sinks(q, k, v, kv_len, scale, sinks)
}

/// A decode step's attention over a rotating cache's ring, with sink logits when given; see
/// [`crate::Backend::attention_ring`].
pub fn attention_ring(
    q: &Array,
    k: &Array,
    v: &Array,
    kv_len: usize,
    scale: f32,
    sinks: Option<&[f32]>,
) -> Result<Array> {
    backend(q.device()).attention_ring(q, k, v, kv_len, scale, sinks)
}

/// Causal attention over a sliding window of `window` positions, with sink logits when given;
/// see [`crate::Backend::attention_window`].
pub fn attention_window(
    q: &Array,
    k: &Array,
    v: &Array,
    kv_len: usize,
    scale: f32,
    window: usize,
    sinks: Option<&[f32]>,
) -> Result<Array> {
    backend(q.device()).attention_window(q, k, v, kv_len, scale, window, sinks)
}

impl Matrix {
    /// Rows `ids` as f32 `[len(ids), cols]` (an embedding lookup).
    pub fn embed(&self, ids: &[u32]) -> Result<Array> {
        let device = match self {
            Matrix::Dense(a) => a.device(),
            Matrix::Quantized(q) => q.packed.device(),
        };
        backend(device).embed(self, ids)
    }

    /// [`Matrix::embed`] with some rows' ids read on the device from `picks` (see
    /// [`crate::Backend::embed_spliced`]).
    pub fn embed_spliced(&self, ids: &[u32], picks: &Array, spliced: &[(usize, usize)]) -> Result<Array> {
        let device = match self {
            Matrix::Dense(a) => a.device(),
            Matrix::Quantized(q) => q.packed.device(),
        };
        backend(device).embed_spliced(self, ids, picks, spliced)
    }
}

/// Rope and cache writes of a decode step of several paged sequences, as one op (one launch on a
/// GPU); see [`crate::Backend::rope_qk_write_paged`].
#[allow(clippy::too_many_arguments)]
pub fn rope_qk_write_paged(
    q: &Array,
    k: &Array,
    v: &Array,
    qk_norm: Option<(&Array, &Array, f32)>,
    inv_freqs: &[f32],
    traditional: bool,
    rows: (&[usize], &[usize]),
    stores: (&mut Array, &mut Array),
) -> Result<Array> {
    backend(q.device()).rope_qk_write_paged(q, k, v, qk_norm, inv_freqs, traditional, rows, stores)
}

/// Decode attention of several sequences over one paged cache's blocks; see
/// [`crate::Backend::paged_decode_attention`].
pub fn paged_decode_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    seqs: &[crate::PagedSeq<'_>],
    block_size: usize,
    scale: f32,
    sinks: Option<&[f32]>,
) -> Result<Array> {
    backend(q.device()).paged_decode_attention(q, k, v, seqs, block_size, scale, sinks)
}

/// Decode attention of several sequences over quantized paged stores; see
/// [`crate::Backend::paged_decode_attention_quantized`].
pub fn paged_decode_attention_quantized(
    q: &Array,
    k: &crate::Quantized,
    v: &crate::Quantized,
    seqs: &[crate::PagedSeq<'_>],
    block_size: usize,
    scale: f32,
    sinks: Option<&[f32]>,
) -> Result<Array> {
    backend(q.device()).paged_decode_attention_quantized(q, k, v, seqs, block_size, scale, sinks)
}

/// Quantizes `rows` into rows `slots` of `store`, on the store's device; see
/// [`crate::Backend::quantize_rows_into`].
pub fn quantize_rows_into(rows: &Array, store: &mut crate::Quantized, slots: &[usize]) -> Result<()> {
    backend(store.packed.device()).quantize_rows_into(rows, store, slots)
}

/// Positions `from .. to` of a paged sequence in a quantized store, dequantized; see
/// [`crate::Backend::dequantize_paged`].
pub fn dequantize_paged(
    store: &crate::Quantized,
    heads: usize,
    table: &[u32],
    block_size: usize,
    from: usize,
    to: usize,
) -> Result<Array> {
    backend(store.packed.device()).dequantize_paged(store, heads, table, block_size, from, to)
}

/// Causal attention; see [`crate::Backend::attention`].
pub fn attention(q: &Array, k: &Array, v: &Array, kv_len: usize, scale: f32) -> Result<Array> {
    backend(q.device()).attention(q, k, v, kv_len, scale)
}

// ---- Gated DeltaNet ----

impl Array {
    /// Depthwise causal convolution with SiLU, continuing from `state`; see
    /// [`crate::Backend::causal_conv1d_silu`].
    pub fn causal_conv1d_silu(&self, state: &Array, weight: &Array) -> Result<(Array, Array)> {
        backend(self.device()).causal_conv1d_silu(self, state, weight)
    }

    /// `self * sigmoid(gate)`; see [`crate::Backend::sigmoid_mul`].
    pub fn sigmoid_mul(&self, gate: &Array) -> Result<Array> {
        backend(self.device()).sigmoid_mul(gate, self)
    }
}

/// The gated delta rule over `mixed`'s positions from `state`; see [`crate::Backend::gated_delta`].
pub fn gated_delta(
    mixed: &Array,
    [a, b]: [&Array; 2],
    [a_log, dt_bias]: [&Array; 2],
    state: &Array,
    dims: crate::GatedDeltaDims,
) -> Result<(Array, Array)> {
    backend(mixed.device()).gated_delta(mixed, a, b, a_log, dt_bias, state, dims)
}

// decode fusions
impl Array {
    /// `(self + other, rms_norm(self + other, weight, eps))`; see [`crate::Backend::add_rms_norm`].
    pub fn add_rms_norm(&self, other: &Array, weight: &Array, eps: f32) -> Result<(Array, Array)> {
        backend(self.device()).add_rms_norm(self, other, weight, eps)
    }

    /// `add_rms_norm` of `self` and `other + bias` (`bias` one value per column); see
    /// [`crate::Backend::add_bias_rms_norm`].
    pub fn add_bias_rms_norm(&self, other: &Array, bias: &Array, weight: &Array, eps: f32) -> Result<(Array, Array)> {
        backend(self.device()).add_bias_rms_norm(self, other, bias, weight, eps)
    }

    /// `h = residual + self @ w^T` and `(h, rms_norm(h, weight, eps))`; see
    /// [`crate::Backend::linear_add_rms_norm`].
    pub fn linear_add_rms_norm(
        &self,
        w: &Matrix,
        residual: &Array,
        weight: &Array,
        eps: f32,
    ) -> Result<(Array, Array)> {
        backend(self.device()).linear_add_rms_norm(self, w, residual, weight, eps)
    }

    /// Per row, the first maximum's index, the maximum and its gap to the values before it
    /// (`u32 [..., 3]`, the last two as f32 bits);
    /// see [`crate::Backend::argmax_gap`].
    pub fn argmax_gap(&self) -> Result<Array> {
        backend(self.device()).argmax_gap(self)
    }

    /// `self [rows, N]` (f32) with the entries whose bit is clear in `bits` (`N.div_ceil(32)`
    /// words per row) replaced by `fill`; see [`crate::Backend::mask_rows`].
    pub fn mask_rows(&self, bits: &[u32], fill: f32) -> Result<Array> {
        backend(self.device()).mask_rows(self, bits, fill)
    }

    /// [`Array::argmax_gap`] of [`Array::mask_rows`]`(bits, fill)` without the masked rows
    /// written out; see [`crate::Backend::masked_argmax_gap`].
    pub fn masked_argmax_gap(&self, bits: &[u32], fill: f32) -> Result<Array> {
        backend(self.device()).masked_argmax_gap(self, bits, fill)
    }

    /// A categorical draw per row of `self [rows, N]` (f32 logits) at `scales` (1 / temperature)
    /// with `uniforms`, and whether each is certainly the host's draw (`u32 [rows, 3]`: token,
    /// certain, 0); see [`crate::Backend::sample_rows`].
    pub fn sample_rows(&self, scales: &[f32], uniforms: &[f64]) -> Result<Array> {
        backend(self.device()).sample_rows(self, scales, uniforms)
    }

    /// Writes new keys `k` and values `v` `[L, heads, head_dim]` into the caches `self` (keys)
    /// and `v_cache` `[heads, capacity, head_dim]` at `offset`; see
    /// [`crate::Backend::write_kv_rows`].
    pub fn write_kv_rows(&mut self, v_cache: &mut Array, k: &Array, v: &Array, offset: usize) -> Result<()> {
        backend(self.device()).write_kv_rows(self, v_cache, k, v, offset)
    }
}

// gated MLP fusion
impl Array {
    /// `silu(self @ gate^T) * (self @ up^T)`, a gated MLP's hidden activations; see
    /// [`crate::Backend::gate_up_silu`].
    pub fn gate_up_silu(&self, gate: &Matrix, up: &Matrix) -> Result<Array> {
        backend(self.device()).gate_up_silu(self, gate, up)
    }
}

/// Queries and keys of an attention step, optionally RMS-normalized per head, then rotated; see
/// [`crate::Backend::rope_qk`].
pub fn rope_qk(
    q: &Array,
    k: &Array,
    qk_norm: Option<(&Array, &Array, f32)>,
    inv_freqs: &[f32],
    offset: usize,
    traditional: bool,
) -> Result<(Array, Array)> {
    backend(q.device()).rope_qk(q, k, qk_norm, inv_freqs, offset, traditional)
}

/// [`rope_qk`], then the rotated keys and `v` written into `k_cache, v_cache` at `cache_offset`
/// (as [`Array::write_kv_rows`]); returns the rotated queries. One launch on a GPU; see
/// [`crate::Backend::rope_qk_write_kv`].
#[allow(clippy::too_many_arguments)]
pub fn rope_qk_write_kv(
    q: &Array,
    k: &Array,
    v: &Array,
    qk_norm: Option<(&Array, &Array, f32)>,
    inv_freqs: &[f32],
    offset: usize,
    traditional: bool,
    cache: (&mut Array, &mut Array, usize),
) -> Result<Array> {
    backend(q.device()).rope_qk_write_kv(q, k, v, qk_norm, inv_freqs, offset, traditional, cache)
}
