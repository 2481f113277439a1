//! The op set inference needs, one implementation per device.
//!
//! Activations are f32; weights may be f32, f16, bf16 or quantized ([`Matrix`]). Shapes are
//! documented per op; every op checks them and returns an error rather than panicking.

use crate::moe::{self, ExpertIndex, Experts, MoeRouting};
use crate::{Array, DType, Device, Error, Matrix, QuantMode, Quantized, Result};

/// One device's implementation of the ops.
pub trait Backend: Send + Sync {
    /// The device it runs on.
    fn device(&self) -> Device;

    /// `x [M, K] @ w[N, K]^T -> [M, N]`.
    fn linear(&self, x: &Array, w: &Matrix) -> Result<Array>;

    /// [`Backend::linear`] of one input with several weights (q/k/v, gate/up): `x @ ws[i]^T` for
    /// each `i`, in order. A backend may run them as one pass (the CPU does for a single input
    /// row); the default runs them one by one.
    fn linear_many(&self, x: &Array, ws: &[&Matrix]) -> Result<Vec<Array>> {
        ws.iter().map(|w| self.linear(x, w)).collect()
    }

    /// [`Backend::linear_many`] with `biases[i]` (a row of `ws[i].rows()` values) added to
    /// output `i` (q/k/v of a layer with biases). A backend may add them in the products' pass;
    /// the default runs [`Backend::linear_many`] then [`Backend::add_bias`] on each.
    fn linear_many_bias(&self, x: &Array, ws: &[&Matrix], biases: &[&Array]) -> Result<Vec<Array>> {
        linear_many_bias_composed(self, x, ws, biases)
    }

    /// `(silu(gate) * up) @ w^T` for `gate, up [M, K]` (the down projection of a gated MLP). A
    /// backend may skip materializing the product; the default is
    /// [`Backend::silu_mul`] then [`Backend::linear`].
    fn silu_mul_linear(&self, gate: &Array, up: &Array, w: &Matrix) -> Result<Array> {
        self.linear(&self.silu_mul(gate, up)?, w)
    }

    /// Rows `ids` of `table [V, D]` -> `[len(ids), D]`.
    fn embed(&self, table: &Matrix, ids: &[u32]) -> Result<Array>;

    /// [`Backend::embed`] where some rows' ids are read on the device: for each `(row, pick)` of
    /// `spliced`, row `row` takes the index of row `pick` of `picks` (`[m, 3]` u32, what
    /// [`Backend::argmax_gap`] gives: the index is its first word) instead of `ids[row]`. A step
    /// fed the previous step's greedy picks is enqueued without reading them first. Every
    /// spliced index must lie in the table; the default reads `picks` to the host and checks.
    fn embed_spliced(&self, table: &Matrix, ids: &[u32], picks: &Array, spliced: &[(usize, usize)]) -> Result<Array> {
        embed_spliced_default(self, table, ids, picks, spliced)
    }

    /// RMS norm over the last axis: `x * rsqrt(mean(x^2) + eps) * weight`.
    fn rms_norm(&self, x: &Array, weight: &Array, eps: f32) -> Result<Array>;

    /// Rotary embedding of `x [L, H, D]` at positions `offset..offset+L`, rotating the first
    /// `2 * inv_freqs.len()` features of each head (halves, or interleaved pairs if `traditional`).
    fn rope(&self, x: &Array, inv_freqs: &[f32], offset: usize, traditional: bool) -> Result<Array>;

    /// Causal attention of `q [L, Hq, D]` over the first `kv_len` positions of
    /// `k, v [Hkv, capacity, D]`; query `i` sits at position `kv_len - L + i`.
    /// Returns `[L, Hq * D]`.
    fn attention(&self, q: &Array, k: &Array, v: &Array, kv_len: usize, scale: f32) -> Result<Array>;

    /// Writes `src [A, n, C]` into `dst [A, capacity, C]` at `offset` along axis 1, in place.
    fn write_axis1(&self, dst: &mut Array, src: &Array, offset: usize) -> Result<()>;

    /// [`Backend::write_axis1`] of one position into a ring (a rotating cache's keys or values,
    /// whose positions from `keep` on are reused in turn): the same write. Where a CUDA graph
    /// captures a decode step, its replays write each later step at the ring's slot for it,
    /// `keep + (offset - keep + steps) mod (capacity - keep)`, where a plain write moves on.
    fn write_axis1_ring(&self, dst: &mut Array, src: &Array, offset: usize, _keep: usize) -> Result<()> {
        self.write_axis1(dst, src, offset)
    }

    /// Writes `src [n, A, C]` into `dst [A, capacity, C]` at `offset` along axis 1, in place:
    /// [`Backend::write_axis1`] of `src` with its first two axes swapped (new keys or values
    /// `[L, heads, head_dim]` into a `[heads, capacity, head_dim]` cache). The default transposes,
    /// then writes.
    fn write_axis1_from_rows(&self, dst: &mut Array, src: &Array, offset: usize) -> Result<()> {
        let t = self.transpose01(src)?;
        self.write_axis1(dst, &t, offset)
    }

    /// `[A, B, C] -> [B, A, C]`.
    fn transpose01(&self, x: &Array) -> Result<Array>;

    /// Elementwise `a + b` (same shape).
    fn add(&self, a: &Array, b: &Array) -> Result<Array>;

    /// `x [M, N] + bias [N]`.
    fn add_bias(&self, x: &Array, bias: &Array) -> Result<Array>;

    /// `x [M, N] * w [N]`: each row scaled entry by entry (a DoRA adapter's magnitudes).
    fn mul_columns(&self, x: &Array, w: &Array) -> Result<Array>;

    /// `y [M, N] + t [M, R] · wᵀ` with `w` f32 `[N, R]`, R small: a low-rank adapter's second
    /// product added to the base one in one pass, in f32.
    fn add_linear(&self, y: &Array, t: &Array, w: &Array) -> Result<Array>;

    /// `silu(gate) * up`, elementwise.
    fn silu_mul(&self, gate: &Array, up: &Array) -> Result<Array>;

    /// Rows `start..end` of `x [M, ...]`.
    fn slice_rows(&self, x: &Array, start: usize, end: usize) -> Result<Array>;

    /// Index of the largest value along the last axis: `[..., N] -> u32 [...]`.
    fn argmax(&self, x: &Array) -> Result<Array>;

    // ---- Gated DeltaNet (the linear-attention layers of Qwen3.5 / Qwen3-Next hybrids) ----

    /// Depthwise causal convolution with SiLU over `x [L, C]`, continuing from the `K - 1` rows
    /// before it (`state [K - 1, C]`, zeros at the start of a sequence), with one kernel of `K`
    /// taps per channel (`weight [C, K]`, f32/f16/bf16):
    /// `out[t, c] = silu(sum_j weight[c, j] * in[t + j, c])` where `in = state ++ x`
    /// (a cross-correlation, as MLX's `conv1d`). Returns `(out [L, C], in's last K - 1 rows)`,
    /// the latter being the state for the next call.
    fn causal_conv1d_silu(&self, x: &Array, state: &Array, weight: &Array) -> Result<(Array, Array)>;

    /// The gated delta rule over `L` positions, as mlx-lm's `normalize_qk` followed by
    /// `gated_delta_update` (scalar gate, no mask):
    /// - `mixed [L, 2 * Hk * Dk + Hv * Dv]` holds each position's queries, keys (`Hk` heads of
    ///   `Dk`) and values (`Hv` heads of `Dv`), in that order (the convolution's output);
    ///   queries and keys are RMS-normalized per head (eps `1e-6 / Dk`) and scaled by `1 / Dk`
    ///   and `1 / sqrt(Dk)` respectively; value head `h` reads key head `h / (Hv / Hk)`;
    /// - `a, b [L, Hv]` give the decay `g = exp(-exp(a_log) * softplus(a + dt_bias))` and the
    ///   write strength `beta = sigmoid(b)` (`a_log, dt_bias [Hv]`, any float dtype);
    /// - `state [Hv, Dv, Dk]` f32 (zeros at the start of a sequence) is, per position,
    ///   decayed by `g`, corrected towards `v` along `k` by `beta`, and read out by `q`.
    ///
    /// Returns `(y [L, Hv, Dv], the state after the last position)`.
    #[allow(clippy::too_many_arguments)]
    fn gated_delta(
        &self,
        mixed: &Array,
        a: &Array,
        b: &Array,
        a_log: &Array,
        dt_bias: &Array,
        state: &Array,
        dims: GatedDeltaDims,
    ) -> Result<(Array, Array)>;

    /// `x * sigmoid(gate)`, elementwise (same shape): the output gate of gated attention.
    fn sigmoid_mul(&self, gate: &Array, x: &Array) -> Result<Array>;

    // Gemma 4

    /// `gelu_approx(gate) * up`, elementwise, with mlx's tanh approximation of GELU:
    /// `0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))` (Gemma's gated MLP and per-layer gate).
    fn gelu_mul(&self, gate: &Array, up: &Array) -> Result<Array>;

    /// `x * s` elementwise, for a scalar `s`.
    fn scale(&self, x: &Array, s: f32) -> Result<Array>;

    /// Logit soft-capping, `tanh(x / cap) * cap` elementwise; `cap` must be positive.
    fn softcap(&self, x: &Array, cap: f32) -> Result<Array>;

    // gpt-oss: attention sinks, the clamped SwiGLU of its experts, and a scalar multiply (yarn's
    // rope magnitude correction).

    /// [`Backend::attention`] with one learned logit per query head (`sinks [Hq]`) joining each
    /// softmax: the weights become `exp(scale * s_j) / (exp(sink) + sum_i exp(scale * s_i))`
    /// (the sink is not scaled) and the sink adds no value, so the weights sum to less than one.
    fn attention_sinks(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        kv_len: usize,
        scale: f32,
        sinks: &[f32],
    ) -> Result<Array>;

    /// Causal attention over a sliding window (mlx-lm's `create_causal_mask(L, offset, window)`):
    /// as [`Backend::attention`], but query `i`, at position `p = kv_len - L + i`, sees only the
    /// positions `p - window < j <= p`; with `sinks`, as [`Backend::attention_sinks`]. A sliding
    /// layer's prefill chunk over more positions than its window. The default attends one query
    /// at a time over its own positions.
    #[allow(clippy::too_many_arguments)]
    fn attention_window(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        kv_len: usize,
        scale: f32,
        window: usize,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        attention_window_composed(self, q, k, v, kv_len, scale, window, sinks)
    }

    /// A decode step's attention over a ring (a rotating cache, its slots in any order): as
    /// [`Backend::attention`] over the first `kv_len` slots (with `sinks`, as
    /// [`Backend::attention_sinks`]). Where a CUDA graph captures it, its replays attend
    /// `min(kv_len + steps, capacity)` slots, where a plain cache's attention grows past it.
    #[allow(clippy::too_many_arguments)]
    fn attention_ring(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        kv_len: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        attention_or_sinks(self, q, k, v, kv_len, scale, sinks)
    }

    /// A decode step's rope and cache writes for several paged sequences, as one op: row `i` of
    /// `q [n, Hq, D]` and `k, v [n, Hkv, D]` sits at position `positions[i]`; q and k are
    /// RMS-normalized per head first when `qk_norm` is given (as [`Backend::rope_qk`]), and the
    /// rotated key and the value of row `i` are written into `stores` (keys, values; each
    /// `[1, P, Hkv * D]`, position-major) at row `slots[i]`. Returns the rotated
    /// queries `[n, Hq, D]`: per row what [`Backend::rope_qk`] and the writes give, which is what
    /// the default does row by row.
    #[allow(clippy::too_many_arguments)]
    fn rope_qk_write_paged(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        qk_norm: Option<(&Array, &Array, f32)>,
        inv_freqs: &[f32],
        traditional: bool,
        rows: (&[usize], &[usize]),
        stores: (&mut Array, &mut Array),
    ) -> Result<Array> {
        rope_qk_write_paged_composed(self, q, k, v, qk_norm, inv_freqs, traditional, rows, stores)
    }

    /// Decode attention of several sequences over one paged cache, as one op: query row `i`
    /// of `q [n, Hq, D]` is sequence `seqs[i]`'s next position and attends that sequence's
    /// positions `first .. len` (all of them, or a sliding window's), which sit in the blocks its
    /// `table` lists (block `b` holds positions `b * block_size ..` of the store) of `k, v
    /// [blocks * block_size, Hkv * D]` (position-major, as the projections write them; any
    /// leading axes of length 1 are allowed). With `sinks`, as [`Backend::attention_sinks`].
    /// Returns `[n, Hq * D]`, each row what [`Backend::attention`] gives over those positions
    /// gathered, which is what the default does; a backend may read the blocks in place instead.
    #[allow(clippy::too_many_arguments)]
    fn paged_decode_attention(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        seqs: &[PagedSeq<'_>],
        block_size: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        paged_decode_attention_composed(self, q, k, v, seqs, block_size, scale, sinks)
    }

    /// Quantizes `rows [n, cols]` (any float type), row `i` into row `slots[i]` of `store`
    /// (affine, f32 scales and biases, `cols` values a row), keeping its other rows: the words,
    /// scales and biases [`crate::quantize::quantize_affine`] makes of them with f32 scales, bit
    /// for bit (a paged cache's quantized keys or values).
    fn quantize_rows_into(&self, rows: &Array, store: &mut Quantized, slots: &[usize]) -> Result<()>;

    /// [`Backend::paged_decode_attention`] over stores of quantized rows (as
    /// [`Backend::quantize_rows_into`] writes them, `kv_heads * head_dim` values a row): each row
    /// what attention over that sequence's positions dequantized ([`Backend::dequantize_paged`])
    /// gives (what [`paged_decode_attention_quantized_composed`] computes), reading the codes in
    /// place where the backend can.
    #[allow(clippy::too_many_arguments)]
    fn paged_decode_attention_quantized(
        &self,
        q: &Array,
        k: &Quantized,
        v: &Quantized,
        seqs: &[PagedSeq<'_>],
        block_size: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array>;

    /// Copies `n` rows of the 2-D array `a` (any element type) from row `from` over those from
    /// row `to`, in place (a paged cache's block copied before a write). The two ranges must not
    /// overlap.
    fn copy_rows_within(&self, a: &mut Array, from: usize, to: usize, n: usize) -> Result<()>;

    /// Positions `from .. to` of a paged sequence in `store` (rows as
    /// [`Backend::quantize_rows_into`] writes them, each `heads` heads of `cols / heads` values;
    /// position `p` in row `table[p / block_size] * block_size + p % block_size`), dequantized to
    /// f32 `[heads, to - from, cols / heads]` (the layout attention reads), each value
    /// `scale * code + bias` as [`crate::quantize::dequantize_rows`] computes it.
    #[allow(clippy::too_many_arguments)]
    fn dequantize_paged(
        &self,
        store: &Quantized,
        heads: usize,
        table: &[u32],
        block_size: usize,
        from: usize,
        to: usize,
    ) -> Result<Array>;

    /// gpt-oss's expert activation (mlx-lm's `swiglu_oai`), elementwise over `gate, up` of one
    /// shape: `g = min(gate, limit)`, `u = clip(up, -limit, limit)`,
    /// `(u + 1) * g * sigmoid(alpha * g)`.
    fn swiglu_oai(&self, gate: &Array, up: &Array, alpha: f32, limit: f32) -> Result<Array>;

    /// Each row's `top_k` experts and their weights from router logits `[L, experts]` (f32):
    /// `(ids, weights)`, `[L, top_k]` u32 and f32 on the logits' device, best first, ties to the
    /// lower index. The default reads the logits to the host.
    fn moe_route(&self, logits: &Array, top_k: usize, routing: MoeRouting) -> Result<(Array, Array)> {
        moe::route_composed(logits, top_k, routing)
    }

    /// [`Backend::moe_route`] of `logits + bias` (`bias [experts]`, a router's bias row). A
    /// backend may add the bias where it reads the logits; the default runs
    /// [`Backend::add_bias`] first.
    fn moe_route_bias(
        &self,
        logits: &Array,
        bias: &Array,
        top_k: usize,
        routing: MoeRouting,
    ) -> Result<(Array, Array)> {
        self.moe_route(&self.add_bias(logits, bias)?, top_k, routing)
    }

    /// [`Backend::moe_route`] of a router's logits `x @ router^T (+ bias)` for `x [L, hidden]`:
    /// the product and the choice as one op, which a backend may run as one pass. The default
    /// runs [`Backend::linear`], then [`Backend::moe_route`] ([`Backend::moe_route_bias`] with a
    /// bias).
    fn moe_route_linear(
        &self,
        x: &Array,
        router: &Matrix,
        bias: Option<&Array>,
        top_k: usize,
        routing: MoeRouting,
    ) -> Result<(Array, Array)> {
        moe::route_linear_composed(self, x, router, bias, top_k, routing)
    }

    /// `out[t] = sum_j weights[t, j] * s_e * expert_e(x[t])` with `e = ids[t, j]` for
    /// `x [L, hidden]`, each expert `down(act(gate(x), up(x)))` with its bias rows and `s_e` its
    /// output scale (1 unless [`Experts::with_output_scales`]). The default reads the choices to
    /// the host and runs each chosen expert over its rows.
    fn moe_experts(&self, x: &Array, experts: &Experts, ids: &Array, weights: &Array) -> Result<Array> {
        moe::experts_composed(x, experts, ids, weights)
    }

    /// `a + sigmoid(gate) * b` for `a, b [L, D]` and one gate per row, `gate [L, 1]` (a shared
    /// expert under its gate, as Qwen3.5-MoE adds it). The default reads them to the host.
    fn add_sigmoid_gated(&self, a: &Array, b: &Array, gate: &Array) -> Result<Array> {
        moe::add_sigmoid_gated_composed(a, b, gate)
    }

    /// A device-side index of `experts`' buffers for [`Backend::moe_experts`], made once when
    /// the experts are built (`None`: this backend needs none).
    fn expert_index(&self, _experts: &Experts) -> Result<Option<ExpertIndex>> {
        Ok(None)
    }

    // decode fusions: several ops of a decode step as one (one kernel launch on a GPU, where the
    // host cost of each launch is what a small model's decode step spends its time on). Each
    // default composes the ops above, and a backend's own version gives the same results.

    /// A residual add and the norm after it: `(a + b, rms_norm(a + b, weight, eps))`.
    fn add_rms_norm(&self, a: &Array, b: &Array, weight: &Array, eps: f32) -> Result<(Array, Array)> {
        let sum = self.add(a, b)?;
        let normed = self.rms_norm(&sum, weight, eps)?;
        Ok((sum, normed))
    }

    /// [`Backend::add_rms_norm`] of `a` and `b + bias` (`bias` one value per column, added as
    /// [`Backend::add_bias`] adds it): a projection's bias joins the residual add.
    fn add_bias_rms_norm(
        &self,
        a: &Array,
        b: &Array,
        bias: &Array,
        weight: &Array,
        eps: f32,
    ) -> Result<(Array, Array)> {
        self.add_rms_norm(a, &self.add_bias(b, bias)?, weight, eps)
    }

    /// A projection, the residual add after it and the norm after that:
    /// `h = residual + x @ w^T` and `(h, rms_norm(h, weight, eps))` (an attention block's output
    /// projection or an MLP's down projection, and the next norm). A backend may fold the norm
    /// into the projection and the kernels that read its output (CUDA, one decode row of 4-bit
    /// weights): its values then match the composition to rounding, not bit for bit.
    fn linear_add_rms_norm(
        &self,
        x: &Array,
        w: &Matrix,
        residual: &Array,
        weight: &Array,
        eps: f32,
    ) -> Result<(Array, Array)> {
        linear_add_rms_norm_composed(self, x, w, residual, weight, eps)
    }

    /// The queries `q [L, Hq, D]` and keys `k [L, Hkv, D]` of an attention step, each first
    /// RMS-normalized per head when `qk_norm` gives `(q weight [D], k weight [D], eps)` (Qwen3),
    /// then rotated by [`Backend::rope`] with the same frequencies and positions. `q` and `k`
    /// must share `L` and `D`.
    fn rope_qk(
        &self,
        q: &Array,
        k: &Array,
        qk_norm: Option<(&Array, &Array, f32)>,
        inv_freqs: &[f32],
        offset: usize,
        traditional: bool,
    ) -> Result<(Array, Array)> {
        let (qs, ks) = (q.shape(), k.shape());
        if qs.len() != 3 || ks.len() != 3 || qs[0] != ks[0] || qs[2] != ks[2] {
            let message = format!("q {qs:?} and k {ks:?} must be [L, heads, D] of one L and D");
            return Err(crate::Error::shape("rope_qk", message));
        }
        let (q, k) = match qk_norm {
            Some((qw, kw, eps)) => (self.rms_norm(q, qw, eps)?, self.rms_norm(k, kw, eps)?),
            None => (q.clone(), k.clone()),
        };
        Ok((self.rope(&q, inv_freqs, offset, traditional)?, self.rope(&k, inv_freqs, offset, traditional)?))
    }

    /// New keys and values `[L, heads, head_dim]` written into their caches
    /// `[heads, capacity, head_dim]` at `offset`: [`Backend::write_axis1_from_rows`] of each.
    fn write_kv_rows(
        &self,
        k_cache: &mut Array,
        v_cache: &mut Array,
        k: &Array,
        v: &Array,
        offset: usize,
    ) -> Result<()> {
        self.write_axis1_from_rows(k_cache, k, offset)?;
        self.write_axis1_from_rows(v_cache, v, offset)
    }

    /// Per row of `x [..., N]` (f32): the index of its first maximum, the maximum, and how far
    /// the largest value before that index lies below it, as `u32 [..., 3]` holding the index
    /// and the f32 bits of the other two (the gap is `f32::INFINITY` when the maximum comes
    /// first, NaN when the row holds a NaN or an infinity). Greedy decoding needs only this from
    /// the logits, not the whole row (see `nuvec-lm`'s generation). The default reads `x` to
    /// the host.
    fn argmax_gap(&self, x: &Array) -> Result<Array> {
        if x.shape().is_empty() || x.dim(-1) == 0 {
            return Err(crate::Error::shape("argmax_gap", format!("rows of {:?}", x.shape())));
        }
        let n = x.dim(-1);
        let values = x.to_vec::<f32>()?;
        let out: Vec<u32> = values
            .chunks(n)
            .flat_map(|row| {
                let (index, max, gap) = argmax_gap_row(row);
                [index, max.to_bits(), gap.to_bits()]
            })
            .collect();
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("checked above") = 3;
        Array::from_slice_on(&out, &shape, self.device())
    }

    /// `x [rows, N]` (f32) with every entry whose bit is clear in `bits` (per row `N.div_ceil(32)`
    /// words, bit `i % 32` of word `i / 32` for entry `i`) replaced by `fill`: a structured-output
    /// constraint's mask applied where the logits are, before the greedy pick. The default reads
    /// `x` to the host.
    fn mask_rows(&self, x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
        let n = check_mask_rows(x, bits)?;
        let mut values = x.to_vec::<f32>()?;
        let words = n.div_ceil(32);
        for (row, mask) in values.chunks_mut(n).zip(bits.chunks(words)) {
            for (i, v) in row.iter_mut().enumerate() {
                if mask[i / 32] >> (i % 32) & 1 == 0 {
                    *v = fill;
                }
            }
        }
        Array::from_slice_on(&values, x.shape(), self.device())
    }

    /// [`Backend::argmax_gap`] of [`Backend::mask_rows`]`(x, bits, fill)`, bit for bit, without
    /// writing the masked rows out: a constrained batch's greedy pick (64 rows of a 128k
    /// vocabulary are 33 MB a step). The default composes the two.
    fn masked_argmax_gap(&self, x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
        self.argmax_gap(&self.mask_rows(x, bits, fill)?)
    }

    /// A categorical draw per row of `x [rows, N]` (f32 logits), certified against the host's
    /// draw: row `r` draws from `softmax(x[r] * scales[r])` with the uniform `uniforms[r]` in
    /// `[0, 1)`, as the first token whose running weight passes `uniforms[r]` times the total, and
    /// gives `u32 [rows, 3]`: the token, 1 when it is certainly the token the host's draw from
    /// the same row with that uniform gives (else 0: the caller draws on the host), and 0 (the
    /// layout of [`Backend::argmax_gap`], the token first). See [`sample_row`] for the weights and
    /// the bound that decides certainty. A row with scale 0 is skipped (0, 0, 0). The default
    /// reads `x` to the host.
    fn sample_rows(&self, x: &Array, scales: &[f32], uniforms: &[f64]) -> Result<Array> {
        let n = check_sample_rows(x, scales, uniforms)?;
        let values = x.to_vec::<f32>()?;
        let out: Vec<u32> = values
            .chunks(n)
            .zip(scales.iter().zip(uniforms))
            .flat_map(|(row, (&scale, &u))| {
                let (token, certain) = sample_row(row, scale, u);
                [token, u32::from(certain), 0]
            })
            .collect();
        Array::from_slice_on(&out, &[x.dim(0), 3], self.device())
    }

    // gated MLP fusion: the SwiGLU hidden activations of one gate/up pass (one kernel launch
    // fewer per layer in a GPU decode step).

    /// The hidden activations of a gated (SwiGLU) MLP: `silu(x @ gate^T) * (x @ up^T)` for
    /// `x [..., K]` and `gate, up [N, K]`, `-> [..., N]`. The default is
    /// [`Backend::linear_many`] of `[gate, up]` then [`Backend::silu_mul`] (see
    /// [`gate_up_silu_composed`]); a backend's own version gives the same results.
    fn gate_up_silu(&self, x: &Array, gate: &Matrix, up: &Matrix) -> Result<Array> {
        gate_up_silu_composed(self, x, gate, up)
    }

    // rope with the cache write: an attention step's rope and its key/value cache write as one
    // (one kernel launch fewer per layer in a GPU decode step).

    /// [`Backend::rope_qk`] of `q, k`, then [`Backend::write_kv_rows`] of the rotated keys and
    /// `v [L, kv_heads, head_dim]` into `k_cache, v_cache [kv_heads, capacity, head_dim]` at
    /// `cache_offset`; returns the rotated queries. The default is those two ops; a backend's own
    /// version gives the same results.
    #[allow(clippy::too_many_arguments)]
    fn rope_qk_write_kv(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        qk_norm: Option<(&Array, &Array, f32)>,
        inv_freqs: &[f32],
        offset: usize,
        traditional: bool,
        cache: (&mut Array, &mut Array, usize),
    ) -> Result<Array> {
        rope_qk_write_kv_composed(self, q, k, v, qk_norm, inv_freqs, offset, traditional, cache)
    }
}

/// [`Backend::rope_qk_write_kv`] as its default composes it (for backends that fuse only some
/// cases and fall back to this for the rest).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_qk_write_kv_composed<B: Backend + ?Sized>(
    backend: &B,
    q: &Array,
    k: &Array,
    v: &Array,
    qk_norm: Option<(&Array, &Array, f32)>,
    inv_freqs: &[f32],
    offset: usize,
    traditional: bool,
    (k_cache, v_cache, cache_offset): (&mut Array, &mut Array, usize),
) -> Result<Array> {
    let (q, k) = backend.rope_qk(q, k, qk_norm, inv_freqs, offset, traditional)?;
    backend.write_kv_rows(k_cache, v_cache, &k, v, cache_offset)?;
    Ok(q)
}

/// [`Backend::gate_up_silu`] as its default composes it (for backends that fuse only some cases
/// and fall back to this for the rest).
pub(crate) fn gate_up_silu_composed<B: Backend + ?Sized>(
    backend: &B,
    x: &Array,
    gate: &Matrix,
    up: &Matrix,
) -> Result<Array> {
    let outs = backend.linear_many(x, &[gate, up])?;
    match outs.as_slice() {
        [g, u] => backend.silu_mul(g, u),
        _ => Err(Error::shape("gate_up_silu", format!("linear_many returned {} arrays for 2 weights", outs.len()))),
    }
}

/// `(N, R)` of an [`crate::Backend::add_linear`] call, checked: `y [.., N]`, `t [.., R]` of as
/// many rows, `w` f32 `[N, R]`.
pub(crate) fn check_add_linear(y: &Array, t: &Array, w: &Array) -> crate::Result<(usize, usize)> {
    let fits = !y.shape().is_empty()
        && !t.shape().is_empty()
        && w.shape().len() == 2
        && w.dtype() == crate::DType::F32
        && w.dim(0) == y.dim(-1)
        && w.dim(1) == t.dim(-1)
        && w.dim(1) > 0
        && y.len() / w.dim(0).max(1) == t.len() / w.dim(1);
    match fits {
        true => Ok((w.dim(0), w.dim(1))),
        false => Err(crate::Error::shape(
            "add_linear",
            format!(
                "y {:?}, t {:?}, w {:?} ({}): expected [.., N], [.., R] of as many rows, f32 [N, R]",
                y.shape(),
                t.shape(),
                w.shape(),
                w.dtype()
            ),
        )),
    }
}

/// The row length of a [`Backend::mask_rows`] call, checked: `x` f32 `[rows, N]`, `bits` a mask
/// of `N.div_ceil(32)` words per row. Every backend runs this check.
pub(crate) fn check_mask_rows(x: &Array, bits: &[u32]) -> Result<usize> {
    let &[rows, n] = x.shape() else {
        return Err(crate::Error::shape("mask_rows", format!("x {:?} must be [rows, n]", x.shape())));
    };
    if x.dtype() != crate::DType::F32 || bits.len() != rows * n.div_ceil(32) {
        return Err(crate::Error::shape(
            "mask_rows",
            format!(
                "{} words of mask for {} x {rows} x {n} (f32 and {} words needed)",
                bits.len(),
                x.dtype(),
                rows * n.div_ceil(32)
            ),
        ));
    }
    Ok(n)
}

/// Checks [`Backend::sample_rows`]' inputs: `x [rows, N]` f32 with a scale and a uniform per
/// row; returns `N`.
pub(crate) fn check_sample_rows(x: &Array, scales: &[f32], uniforms: &[f64]) -> Result<usize> {
    let &[rows, n] = x.shape() else {
        return Err(crate::Error::shape("sample_rows", format!("x {:?} must be [rows, n]", x.shape())));
    };
    if x.dtype() != crate::DType::F32 || n == 0 || scales.len() != rows || uniforms.len() != rows {
        return Err(crate::Error::shape(
            "sample_rows",
            format!(
                "{} scales and {} uniforms for {} x [{rows}, {n}] (f32, n > 0, one of each per row)",
                scales.len(),
                uniforms.len(),
                x.dtype()
            ),
        ));
    }
    Ok(n)
}

/// 2^-50: two weights computed by `exp` on two machines, each within an ulp of the exact value,
/// with room.
const SAMPLE_EXP_ROUNDING: f64 = 8.881_784_197_001_252e-16;

/// [`Backend::sample_rows`] of one row (the reference the device kernels follow): `(token,
/// certain)`, the token the draw found (0 when none).
///
/// The host (nuvec-lm's `categorical_from_logits`) weighs token `i` by `w_i = exp((f64(x_i) -
/// f64(m)) * f64(scale))` (`m` the row's maximum), sums the weights in order in f64, and takes the
/// first token whose running sum passes `u` times the total. Here the weights are the same IEEE
/// operations but for `exp`, which on either side lies within an ulp, so each weight is within
/// `2^-50 w_i` of the host's; the running sums differ further by both sides' f64 summation
/// (within `8 N 2^-53` of the total, whatever the order) and underflows (a weight one side rounds
/// to 0 is below 1e-300 on the other). So with `E` the sum of those bounds, a target more than
/// `3E` inside its token's interval is certainly the host's token. A NaN or `+inf` in the row, a
/// row all `-inf`, a scale that is not finite and positive or a uniform outside `[0, 1)` is
/// uncertain (`-inf` entries weigh 0 on both sides).
pub(crate) fn sample_row(row: &[f32], scale: f32, u: f64) -> (u32, bool) {
    if !(scale.is_finite() && scale > 0.0 && (0.0..1.0).contains(&u)) {
        return (0, false);
    }
    let n = row.len();
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() || !row.iter().all(|&v| v.is_finite() || v == f32::NEG_INFINITY) {
        return (0, false);
    }
    let (s, m) = (scale as f64, m as f64);
    let weight = |v: f32| ((v as f64 - m) * s).exp();
    let total: f64 = row.iter().map(|&v| weight(v)).sum();
    let bound = sample_bound(total, n);
    let target = u * total;
    let mut below = 0.0f64;
    for (i, &v) in row.iter().enumerate() {
        let upto = below + weight(v);
        if upto > target {
            return (i as u32, target - below > 3.0 * bound && upto - target > 3.0 * bound);
        }
        below = upto;
    }
    (0, false)
}

/// `E` of [`sample_row`] for `n` weights summing to `total`.
pub(crate) fn sample_bound(total: f64, n: usize) -> f64 {
    total * (SAMPLE_EXP_ROUNDING + 8.0 * n as f64 * f64::EPSILON / 2.0) + n as f64 * 1e-300
}

/// [`Backend::embed_spliced`] through the host: `picks` read, the ids spliced, then
/// [`Backend::embed`].
pub(crate) fn embed_spliced_default<B: Backend + ?Sized>(
    b: &B,
    table: &Matrix,
    ids: &[u32],
    picks: &Array,
    spliced: &[(usize, usize)],
) -> Result<Array> {
    check_spliced(ids, picks, spliced)?;
    let p = picks.to_vec::<u32>()?;
    let mut ids = ids.to_vec();
    for &(row, pick) in spliced {
        ids[row] = p[3 * pick];
    }
    b.embed(table, &ids)
}

/// Checks [`Backend::embed_spliced`]'s arguments: `picks` `[m, 3]` u32, each row of `ids` spliced
/// at most once from a row of `picks`.
pub(crate) fn check_spliced(ids: &[u32], picks: &Array, spliced: &[(usize, usize)]) -> Result<()> {
    let op = "embed_spliced";
    if picks.dtype() != crate::DType::U32 || picks.shape().len() != 2 || picks.dim(1) != 3 {
        return Err(crate::Error::shape(op, format!("picks of {:?} {}, not [m, 3] u32", picks.shape(), picks.dtype())));
    }
    let mut seen = vec![false; ids.len()];
    for &(row, pick) in spliced {
        if row >= ids.len() || pick >= picks.dim(0) {
            return Err(crate::Error::shape(
                op,
                format!("row {row} from pick {pick}, with {} rows and {} picks", ids.len(), picks.dim(0)),
            ));
        }
        if std::mem::replace(&mut seen[row], true) {
            return Err(crate::Error::shape(op, format!("row {row} spliced twice")));
        }
    }
    Ok(())
}

/// [`Backend::argmax_gap`] of one row (the reference the device kernels follow).
pub(crate) fn argmax_gap_row(row: &[f32]) -> (u32, f32, f32) {
    // The first maximum, as `argmax` finds it (a leading NaN wins there).
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    if row.iter().any(|v| !v.is_finite()) {
        return (best as u32, row[best], f32::NAN);
    }
    let before = row[..best].iter().copied().fold(f32::NEG_INFINITY, f32::max);
    (best as u32, row[best], row[best] - before)
}

/// Head counts and sizes of a Gated DeltaNet layer (see [`Backend::gated_delta`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatedDeltaDims {
    /// Query/key heads (`Hk`).
    pub key_heads: usize,
    /// Value heads (`Hv`), a multiple of `key_heads`.
    pub value_heads: usize,
    /// Features per query/key head (`Dk`).
    pub key_dim: usize,
    /// Features per value head (`Dv`).
    pub value_dim: usize,
}

impl GatedDeltaDims {
    /// Width of a `mixed` row: queries, keys and values.
    pub fn mixed_width(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// Checks the inputs of [`Backend::gated_delta`] against these dimensions (every backend
    /// runs the same check) and returns the number of positions `L`.
    pub(crate) fn check_inputs(
        &self,
        mixed: &Array,
        [a, b]: [&Array; 2],
        [a_log, dt_bias]: [&Array; 2],
        state: &Array,
    ) -> Result<usize> {
        let op = "gated_delta";
        let (hk, hv, dk, dv) = (self.key_heads, self.value_heads, self.key_dim, self.value_dim);
        if hk == 0 || hv == 0 || !hv.is_multiple_of(hk) || dk == 0 || dv == 0 {
            return Err(Error::shape(op, format!("{self:?}: value heads must be a non-zero multiple of key heads")));
        }
        let l = mixed.shape().first().copied().unwrap_or(0);
        let fits = mixed.shape() == [l, self.mixed_width()]
            && a.shape() == [l, hv]
            && b.shape() == [l, hv]
            && a_log.len() == hv
            && dt_bias.len() == hv
            && state.shape() == [hv, dv, dk];
        if !fits {
            return Err(Error::shape(
                op,
                format!(
                    "mixed {:?}, a {:?}, b {:?}, a_log {:?}, dt_bias {:?}, state {:?} do not fit {self:?}",
                    mixed.shape(),
                    a.shape(),
                    b.shape(),
                    a_log.shape(),
                    dt_bias.shape(),
                    state.shape()
                ),
            ));
        }
        Ok(l)
    }
}

/// The checks of [`Backend::copy_rows_within`]; returns a row's bytes.
pub(crate) fn check_rows_within(a: &Array, from: usize, to: usize, n: usize) -> Result<usize> {
    let rows = a.shape().first().copied().unwrap_or(0);
    if a.shape().len() != 2 || from.max(to) + n > rows || (from < to + n && to < from + n && n > 0) {
        return Err(Error::shape(
            "copy_rows_within",
            format!(
                "rows {from}..{} over {to}..{} of {:?}: two ranges of a 2-d array that do not overlap",
                from + n,
                to + n,
                a.shape()
            ),
        ));
    }
    Ok(a.dim(1) * a.dtype().size())
}

/// The checks of [`Backend::quantize_rows_into`]: an affine store of f32 scales, `rows`
/// `[n, cols]` of a float type, a slot in the store for each. Returns `n`.
pub(crate) fn check_quantized_rows(rows: &Array, store: &Quantized, slots: &[usize]) -> Result<usize> {
    let op = "quantize_rows_into";
    if store.spec.mode != QuantMode::Affine || store.scales.dtype() != DType::F32 {
        return Err(Error::shape(op, "the store must be affine with f32 scales and biases"));
    }
    if rows.shape().len() != 2 || rows.dim(1) != store.cols() || !rows.dtype().is_float() {
        return Err(Error::shape(
            op,
            format!("rows must be float [n, {}], got {} {:?}", store.cols(), rows.dtype(), rows.shape()),
        ));
    }
    let n = rows.dim(0);
    if slots.len() != n {
        return Err(Error::shape(op, format!("{} slots for {n} rows", slots.len())));
    }
    if let Some(bad) = slots.iter().find(|&&s| s >= store.rows()) {
        return Err(Error::shape(op, format!("slot {bad} of a store of {} rows", store.rows())));
    }
    Ok(n)
}

/// The checks of [`Backend::dequantize_paged`]; returns the store rows of positions `from .. to`.
pub(crate) fn check_quantized_paged(
    store: &Quantized,
    heads: usize,
    table: &[u32],
    block_size: usize,
    from: usize,
    to: usize,
) -> Result<Vec<u32>> {
    let op = "dequantize_paged";
    if heads == 0 || !store.cols().is_multiple_of(heads) || block_size == 0 {
        return Err(Error::shape(op, format!("{heads} heads, block size {block_size}, rows of {}", store.cols())));
    }
    if from > to || to.div_ceil(block_size) > table.len() {
        return Err(Error::shape(
            op,
            format!("positions {from}..{to} through a table of {} blocks of {block_size}", table.len()),
        ));
    }
    let rows = store.rows();
    (from..to)
        .map(|p| {
            let row = table[p / block_size] as usize * block_size + p % block_size;
            match u32::try_from(row) {
                Ok(r) if row < rows => Ok(r),
                _ => Err(Error::shape(op, format!("position {p} is in row {row} of a store of {rows}"))),
            }
        })
        .collect()
}

/// One sequence of [`Backend::paged_decode_attention`]: its blocks in position order, how
/// many positions it holds (its new one included) and the first one its query attends.
#[derive(Debug, Clone, Copy)]
pub struct PagedSeq<'a> {
    /// Block ids into the store, in position order. Entries for blocks wholly before `first`
    /// are never read (a sliding-window layer's table marks them given back).
    pub table: &'a [u32],
    /// Positions held, the query's own included (at least 1).
    pub len: usize,
    /// The first position attended: 0, or where a sliding window starts (below `len`).
    pub first: usize,
}

impl<'a> PagedSeq<'a> {
    /// A sequence whose query attends every position it holds.
    pub fn new(table: &'a [u32], len: usize) -> Self {
        PagedSeq { table, len, first: 0 }
    }

    /// A sequence whose query sees only its last `window` positions (itself included), as a
    /// sliding-window layer's decode does.
    pub fn windowed(table: &'a [u32], len: usize, window: usize) -> Self {
        PagedSeq { table, len, first: len.saturating_sub(window) }
    }

    /// The positions attended.
    pub fn attended(&self) -> usize {
        self.len - self.first
    }

    /// The table's entries the attended positions lie in.
    pub(crate) fn used_blocks(&self, block_size: usize) -> &'a [u32] {
        &self.table[self.first / block_size..self.len.div_ceil(block_size)]
    }
}

/// The dimensions of a [`Backend::paged_decode_attention`] call, checked: `(n, Hq, Hkv, D,
/// blocks)`. Every backend runs this check.
pub(crate) fn check_paged(
    q: &Array,
    k: &Array,
    v: &Array,
    seqs: &[PagedSeq<'_>],
    block_size: usize,
    sinks: Option<&[f32]>,
) -> Result<(usize, usize, usize, usize, usize)> {
    let op = "paged_decode_attention";
    let width = k.shape().last().copied().unwrap_or(0);
    let positions = k.len().checked_div(width).unwrap_or(0);
    let leading_ones = k.shape().len() >= 2 && k.shape()[..k.shape().len() - 2].iter().all(|&a| a == 1);
    let (q_shape, k_shape, v_shape) = (q.shape(), k.shape(), v.shape());
    let bad = || format!("q {q_shape:?}, k {k_shape:?}, v {v_shape:?}: keys must be [positions, kv_heads * head_dim]");
    if v.shape() != k.shape() || !leading_ones {
        return Err(Error::shape(op, bad()));
    }
    check_paged_dims(op, q, (width, positions), seqs, block_size, sinks, bad)
}

/// [`check_paged`] of a store of `positions` rows of `width` values (`width` a multiple of q's
/// head size); `bad` says what is wrong with keys whose rows are not whole heads.
fn check_paged_dims(
    op: &'static str,
    q: &Array,
    (width, positions): (usize, usize),
    seqs: &[PagedSeq<'_>],
    block_size: usize,
    sinks: Option<&[f32]>,
    bad: impl FnOnce() -> String,
) -> Result<(usize, usize, usize, usize, usize)> {
    let &[n, hq, d] = q.shape() else {
        return Err(Error::shape(op, format!("q {:?} must be [n, heads, head_dim]", q.shape())));
    };
    let hkv = width.checked_div(d).unwrap_or(0);
    if hkv == 0 || hkv * d != width || hq % hkv != 0 {
        return Err(Error::shape(op, bad()));
    }
    if block_size == 0 || !positions.is_multiple_of(block_size) || seqs.len() != n {
        return Err(Error::shape(
            op,
            format!("{} sequences for {n} queries over {positions} positions in blocks of {block_size}", seqs.len()),
        ));
    }
    let blocks = positions / block_size;
    for (i, s) in seqs.iter().enumerate() {
        let fits = s.first < s.len && s.table.len() * block_size >= s.len;
        if !fits || s.used_blocks(block_size).iter().any(|&b| b as usize >= blocks) {
            return Err(Error::shape(
                op,
                format!(
                    "sequence {i} holds {} positions (attending from {}) in blocks {:?} of a store of {blocks} blocks of {block_size}",
                    s.len, s.first, s.table
                ),
            ));
        }
    }
    if let Some(s) = sinks.filter(|s| s.len() != hq) {
        return Err(Error::shape(op, format!("{} sinks for {hq} query heads", s.len())));
    }
    Ok((n, hq, hkv, d, blocks))
}

/// The checks of [`Backend::paged_decode_attention_quantized`]: [`check_paged`]'s, over stores
/// of one quantization.
pub(crate) fn check_paged_quantized(
    q: &Array,
    k: &Quantized,
    v: &Quantized,
    seqs: &[PagedSeq<'_>],
    block_size: usize,
    sinks: Option<&[f32]>,
) -> Result<(usize, usize, usize, usize, usize)> {
    let op = "paged_decode_attention_quantized";
    if k.spec != v.spec || k.rows() != v.rows() || k.cols() != v.cols() {
        return Err(Error::shape(op, "keys and values must be stores of one shape and quantization"));
    }
    let bad = || format!("q {:?} over rows of {} values: not a whole number of its heads", q.shape(), k.cols());
    check_paged_dims(op, q, (k.cols(), k.rows()), seqs, block_size, sinks, bad)
}

/// [`Backend::paged_decode_attention_quantized`] composed of other ops (what it must give, and
/// the backends' path for what their kernels do not take): each sequence's
/// positions dequantized ([`Backend::dequantize_paged`]), then [`Backend::attention`] (or its
/// sinks variant).
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_decode_attention_quantized_composed<B: Backend + ?Sized>(
    backend: &B,
    q: &Array,
    k: &Quantized,
    v: &Quantized,
    seqs: &[PagedSeq<'_>],
    block_size: usize,
    scale: f32,
    sinks: Option<&[f32]>,
) -> Result<Array> {
    let (n, hq, hkv, d, _) = check_paged_quantized(q, k, v, seqs, block_size, sinks)?;
    let mut out = Array::zeros_on(&[1, n, hq * d], DType::F32, q.device())?;
    for (i, s) in seqs.iter().enumerate() {
        let ks = backend.dequantize_paged(k, hkv, s.table, block_size, s.first, s.len)?;
        let vs = backend.dequantize_paged(v, hkv, s.table, block_size, s.first, s.len)?;
        let qi = backend.slice_rows(q, i, i + 1)?;
        let row = attention_or_sinks(backend, &qi, &ks, &vs, s.attended(), scale, sinks)?;
        backend.write_axis1(&mut out, &row.reshape(&[1, 1, hq * d])?, i)?;
    }
    out.reshape(&[n, hq * d])
}

/// The dimensions of a [`Backend::rope_qk_write_paged`] call, checked: `(n, Hq, Hkv, D,
/// store positions)`.
pub(crate) fn check_rope_paged(
    q: &Array,
    k: &Array,
    v: &Array,
    (positions, slots): (&[usize], &[usize]),
    (ks, vs): (&Array, &Array),
) -> Result<(usize, usize, usize, usize, usize)> {
    let op = "rope_qk_write_paged";
    let (&[n, hq, d], &[nk, hkv, dk]) = (q.shape(), k.shape()) else {
        return Err(Error::shape(op, format!("q {:?}, k {:?} must be [n, heads, head_dim]", q.shape(), k.shape())));
    };
    let width = hkv * d;
    let store_rows = match ks.shape() {
        &[1, rows, w] if w == width => rows,
        _ => usize::MAX,
    };
    if nk != n || dk != d || v.shape() != k.shape() || vs.shape() != ks.shape() || store_rows == usize::MAX {
        return Err(Error::shape(
            op,
            format!("q {:?}, k {:?}, v {:?} into stores {:?}", q.shape(), k.shape(), v.shape(), ks.shape()),
        ));
    }
    if positions.len() != n || slots.len() != n || slots.iter().any(|&s| s >= store_rows) {
        return Err(Error::shape(
            op,
            format!("{} positions and slots {slots:?} for {n} rows into a store of {store_rows}", positions.len()),
        ));
    }
    Ok((n, hq, hkv, d, store_rows))
}

/// [`Backend::rope_qk_write_paged`] as its default composes it: per row [`Backend::rope_qk`] at
/// its position, then its key and value written at its slot.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_qk_write_paged_composed<B: Backend + ?Sized>(
    backend: &B,
    q: &Array,
    k: &Array,
    v: &Array,
    qk_norm: Option<(&Array, &Array, f32)>,
    inv_freqs: &[f32],
    traditional: bool,
    (positions, slots): (&[usize], &[usize]),
    (ks, vs): (&mut Array, &mut Array),
) -> Result<Array> {
    let (n, hq, hkv, d, _) = check_rope_paged(q, k, v, (positions, slots), (ks, vs))?;
    let mut out = Array::zeros_on(&[1, n, hq * d], crate::DType::F32, q.device())?;
    for i in 0..n {
        let (qi, ki) = (backend.slice_rows(q, i, i + 1)?, backend.slice_rows(k, i, i + 1)?);
        let (qr, kr) = backend.rope_qk(&qi, &ki, qk_norm, inv_freqs, positions[i], traditional)?;
        backend.write_axis1(&mut out, &qr.reshape(&[1, 1, hq * d])?, i)?;
        backend.write_axis1(ks, &kr.reshape(&[1, 1, hkv * d])?, slots[i])?;
        let vi = backend.slice_rows(v, i, i + 1)?;
        backend.write_axis1(vs, &vi.reshape(&[1, 1, hkv * d])?, slots[i])?;
    }
    out.reshape(&[n, hq, d])
}

/// [`Backend::attention`], or [`Backend::attention_sinks`] with `sinks`: what the composed
/// defaults below call per sequence or query.
fn attention_or_sinks<B: Backend + ?Sized>(
    backend: &B,
    q: &Array,
    k: &Array,
    v: &Array,
    kv_len: usize,
    scale: f32,
    sinks: Option<&[f32]>,
) -> Result<Array> {
    match sinks {
        None => backend.attention(q, k, v, kv_len, scale),
        Some(s) => backend.attention_sinks(q, k, v, kv_len, scale, s),
    }
}

/// [`Backend::paged_decode_attention`] as its default composes it: each sequence's attended
/// positions gathered into `[Hkv, positions, D]`, then [`Backend::attention`] (or its sinks
/// variant).
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_decode_attention_composed<B: Backend + ?Sized>(
    backend: &B,
    q: &Array,
    k: &Array,
    v: &Array,
    seqs: &[PagedSeq<'_>],
    block_size: usize,
    scale: f32,
    sinks: Option<&[f32]>,
) -> Result<Array> {
    let (n, hq, hkv, d, blocks) = check_paged(q, k, v, seqs, block_size, sinks)?;
    let rows = |a: &Array| a.reshape(&[blocks * block_size, hkv * d]);
    let (k_rows, v_rows) = (Matrix::Dense(rows(k)?), Matrix::Dense(rows(v)?));
    let mut out = Array::zeros_on(&[1, n, hq * d], crate::DType::F32, q.device())?;
    for (i, s) in seqs.iter().enumerate() {
        let at = |p: usize| {
            let row = s.table[p / block_size] as usize * block_size + p % block_size;
            u32::try_from(row).map_err(|_| Error::shape("paged_decode_attention", format!("store row {row}")))
        };
        let positions = (s.first..s.len).map(at).collect::<Result<Vec<u32>>>()?;
        let gather = |m: &Matrix| -> Result<Array> {
            let g = backend.embed(m, &positions)?.reshape(&[positions.len(), hkv, d])?;
            backend.transpose01(&g)
        };
        let (ks, vs) = (gather(&k_rows)?, gather(&v_rows)?);
        let qi = backend.slice_rows(q, i, i + 1)?;
        let row = attention_or_sinks(backend, &qi, &ks, &vs, s.attended(), scale, sinks)?;
        backend.write_axis1(&mut out, &row.reshape(&[1, 1, hq * d])?, i)?;
    }
    out.reshape(&[n, hq * d])
}

/// The shapes [`Backend::attention_window`] takes: `(L, Hq, D)`, with an error naming what does
/// not fit (the window, the sinks, q against k and v).
pub(crate) fn check_attention_window(
    q: &Array,
    k: &Array,
    v: &Array,
    kv_len: usize,
    window: usize,
    sinks: Option<&[f32]>,
) -> Result<(usize, usize, usize)> {
    let op = "attention_window";
    let (&[l, hq, d], &[hkv, cap, dk]) = (q.shape(), k.shape()) else {
        return Err(crate::Error::shape(op, format!("q {:?}, k {:?}", q.shape(), k.shape())));
    };
    if v.shape() != k.shape() || dk != d || hkv == 0 || hq % hkv != 0 || kv_len > cap || l > kv_len {
        return Err(crate::Error::shape(
            op,
            format!("q {:?}, k {:?}, v {:?}, kv_len {kv_len}", q.shape(), k.shape(), v.shape()),
        ));
    }
    if window == 0 {
        return Err(crate::Error::shape(op, "a window of 0 positions (each query sees at least itself)"));
    }
    if let Some(s) = sinks.filter(|s| s.len() != hq) {
        return Err(crate::Error::shape(op, format!("{} sinks for {hq} query heads (one per head)", s.len())));
    }
    Ok((l, hq, d))
}

/// [`Backend::attention_window`] as its default composes it: each query over its own window's
/// positions through [`Backend::attention`] (or its sinks variant).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_window_composed<B: Backend + ?Sized>(
    backend: &B,
    q: &Array,
    k: &Array,
    v: &Array,
    kv_len: usize,
    scale: f32,
    window: usize,
    sinks: Option<&[f32]>,
) -> Result<Array> {
    let (l, hq, d) = check_attention_window(q, k, v, kv_len, window, sinks)?;
    // Positions first, once: each query then copies only its range.
    let (kt, vt) = (backend.transpose01(k)?, backend.transpose01(v)?);
    let mut out = Array::zeros_on(&[1, l, hq * d], crate::DType::F32, q.device())?;
    for i in 0..l {
        let last = kv_len - l + i;
        let first = (last + 1).saturating_sub(window);
        let range = |a: &Array| -> Result<Array> { backend.transpose01(&backend.slice_rows(a, first, last + 1)?) };
        let (ki, vi) = (range(&kt)?, range(&vt)?);
        let qi = backend.slice_rows(q, i, i + 1)?;
        let row = attention_or_sinks(backend, &qi, &ki, &vi, last + 1 - first, scale, sinks)?;
        backend.write_axis1(&mut out, &row.reshape(&[1, 1, hq * d])?, i)?;
    }
    out.reshape(&[l, hq * d])
}

/// The backend of `device`.
pub fn backend(device: Device) -> &'static dyn Backend {
    match device {
        #[cfg(not(feature = "cuda"))]
        Device::Cpu => &crate::backends::cpu::CpuBackend,
        // With GPU arrays about, CPU ops first check that their inputs are in host memory.
        #[cfg(feature = "cuda")]
        Device::Cpu => &crate::backends::host_checked::HostChecked,
        #[cfg(feature = "cuda")]
        Device::Cuda(i) => crate::backends::cuda::CudaBackend::get(i),
    }
}

/// [`Backend::linear_many_bias`] composed: the products, then each bias.
pub(crate) fn linear_many_bias_composed<B: Backend + ?Sized>(
    b: &B,
    x: &Array,
    ws: &[&Matrix],
    biases: &[&Array],
) -> Result<Vec<Array>> {
    if biases.len() != ws.len() {
        return Err(Error::shape("linear_many_bias", format!("{} biases for {} weights", biases.len(), ws.len())));
    }
    b.linear_many(x, ws)?.iter().zip(biases).map(|(y, bias)| b.add_bias(y, bias)).collect()
}

/// [`Backend::linear_add_rms_norm`] as its default composes it (for backends that fold only some
/// cases and fall back to this for the rest).
pub(crate) fn linear_add_rms_norm_composed<B: Backend + ?Sized>(
    backend: &B,
    x: &Array,
    w: &Matrix,
    residual: &Array,
    weight: &Array,
    eps: f32,
) -> Result<(Array, Array)> {
    let y = backend.linear(x, w)?;
    backend.add_rms_norm(residual, &y, weight, eps)
}

#[cfg(test)]
mod tests {
    use crate::Array;

    #[test]
    fn mask_rows_keeps_the_allowed_entries() {
        // Two rows of 33: the second word of each row holds the 33rd entry.
        let x = Array::from_slice(&(0..66).map(|v| v as f32).collect::<Vec<_>>(), &[2, 33]).unwrap();
        let bits = [0b101, 1, u32::MAX, 0];
        let got = x.mask_rows(&bits, -1.0).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f32> = (0..66)
            .map(|i| {
                let (row, col) = (i / 33, i % 33);
                let keep = bits[row * 2 + col / 32] >> (col % 32) & 1 == 1;
                if keep {
                    i as f32
                } else {
                    -1.0
                }
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!((got[0], got[1], got[2], got[32], got[65]), (0.0, -1.0, 2.0, 32.0, -1.0));
        assert!(x.mask_rows(&bits[..3], 0.0).is_err(), "a mask of the wrong length");
        assert!(x.reshape(&[66]).unwrap().mask_rows(&bits, 0.0).is_err(), "not rows");
    }

    #[test]
    fn spliced_rows_take_the_picked_index() {
        let (v, d) = (7usize, 3usize);
        let table = crate::Matrix::Dense(
            Array::from_slice(&(0..v * d).map(|x| x as f32).collect::<Vec<_>>(), &[v, d]).unwrap(),
        );
        // Two rows of picks (index, max, gap): 5 and 2.
        let logits =
            Array::from_slice(&[0.0f32, 1.0, 0.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0], &[2, 7]);
        let picks = logits.unwrap().argmax_gap().unwrap();
        let got = table.embed_spliced(&[1, 0, 3, 0], &picks, &[(1, 0), (3, 1)]).unwrap();
        assert_eq!(got.to_vec::<f32>().unwrap(), table.embed(&[1, 5, 3, 2]).unwrap().to_vec::<f32>().unwrap());
        for (bad, words) in [(&[(4, 0)][..], "row 4"), (&[(0, 2)], "pick 2"), (&[(1, 0), (1, 1)], "twice")] {
            let e = table.embed_spliced(&[1, 0, 3, 0], &picks, bad).unwrap_err().to_string();
            assert!(e.contains(words), "{words}: {e}");
        }
        assert!(table.embed_spliced(&[1], &logits_of(2), &[(0, 0)]).is_err(), "picks must be [m, 3] u32");
    }

    fn logits_of(n: usize) -> Array {
        Array::from_slice(&vec![0.5f32; 3 * n], &[n, 3]).unwrap()
    }

    #[test]
    fn a_pending_read_gives_the_values() {
        let a = Array::from_slice(&[3u32, 1, 4, 1, 5, 9], &[2, 3]).unwrap();
        let pending = a.read_later().unwrap();
        assert_eq!(pending.wait::<u32>().unwrap(), vec![3, 1, 4, 1, 5, 9]);
        assert!(pending.wait::<f32>().is_err(), "read as another type");
    }
}
