//! The op set inference needs, one implementation per device.
//!
//! Activations are f32; weights may be f32, f16, bf16 or quantized ([`Matrix`]). Shapes are
//! documented per op; every op checks them and returns an error rather than panicking.

use crate::{Array, Device, Matrix, Result};

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

    /// `(silu(gate) * up) @ w^T` for `gate, up [M, K]` (the down projection of a gated MLP). A
    /// backend may skip materializing the product; the default is
    /// [`Backend::silu_mul`] then [`Backend::linear`].
    fn silu_mul_linear(&self, gate: &Array, up: &Array, w: &Matrix) -> Result<Array> {
        self.linear(&self.silu_mul(gate, up)?, w)
    }

    /// Rows `ids` of `table [V, D]` -> `[len(ids), D]`.
    fn embed(&self, table: &Matrix, ids: &[u32]) -> Result<Array>;

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

    /// `silu(gate) * up`, elementwise.
    fn silu_mul(&self, gate: &Array, up: &Array) -> Result<Array>;

    /// Rows `start..end` of `x [M, ...]`.
    fn slice_rows(&self, x: &Array, start: usize, end: usize) -> Result<Array>;

    /// Index of the largest value along the last axis: `[..., N] -> u32 [...]`.
    fn argmax(&self, x: &Array) -> Result<Array>;

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

    /// gpt-oss's expert activation (mlx-lm's `swiglu_oai`), elementwise over `gate, up` of one
    /// shape: `g = min(gate, limit)`, `u = clip(up, -limit, limit)`,
    /// `(u + 1) * g * sigmoid(alpha * g)`.
    fn swiglu_oai(&self, gate: &Array, up: &Array, alpha: f32, limit: f32) -> Result<Array>;

    /// `x * s` elementwise, for a scalar `s` (the same op as the Gemma 4 branch's: keep one).
    fn scale(&self, x: &Array, s: f32) -> Result<Array>;
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
