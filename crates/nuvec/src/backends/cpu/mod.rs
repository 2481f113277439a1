//! The CPU backend: SIMD kernels with run-time dispatch (AVX-512, AVX2, scalar), threaded with a
//! small spinning fork-join pool. It runs every op at once (synchronously), which the
//! asynchronous API allows.

mod attention;
mod elementwise;
mod fpgemv;
mod gated_delta;
mod gemma4;
mod gpt_oss;
mod kv_dots;
mod kv_rows;
mod linear;
mod paged_attention;
mod pool;
mod qbatch;
mod qgemv;
mod qgemv_i8;
mod quantized_kv;
mod sampling;
mod simd;

use crate::{Array, Backend, DType, Device, Error, GatedDeltaDims, Matrix, Result};

/// The CPU backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

/// An f32 array's elements, or a shape error naming the op.
pub(crate) fn f32s<'a>(op: &'static str, a: &'a Array) -> Result<&'a [f32]> {
    if a.dtype() != DType::F32 {
        return Err(Error::shape(op, format!("activations must be float32, got {}", a.dtype())));
    }
    a.host::<f32>()
}

/// A float array's elements as f32 (converted when f16/bf16: weights such as norms are small).
pub(crate) fn floats<'a>(op: &'static str, a: &'a Array) -> Result<std::borrow::Cow<'a, [f32]>> {
    match a.dtype() {
        DType::F32 => Ok(std::borrow::Cow::Borrowed(a.host::<f32>()?)),
        DType::F16 | DType::BF16 => Ok(std::borrow::Cow::Owned(a.to_f32_vec()?)),
        other => Err(Error::shape(op, format!("expected a float array, got {other}"))),
    }
}

/// Hands heap pages freed so far back to the operating system. glibc keeps freed memory for
/// reuse, so the transient buffers of a load (a tokenizer's JSON, converted tensors) would stay
/// in the resident set for the life of the process; loaders call this when they are done. A
/// no-op where the C library is not glibc.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own free lists and returns whole free pages; it has
    // no preconditions and touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Sets the number of threads the CPU kernels use (the calling thread included). Call it once,
/// before the first op; a later call is an error.
pub fn set_num_threads(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::Device("threads must be at least 1".into()));
    }
    if !pool::set_threads(n) {
        return Err(Error::Device(format!("cannot set {n} CPU threads: the CPU kernels already started")));
    }
    // rayon's pool serves what still uses it; a pool already started keeps its size.
    let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
    Ok(())
}

/// The instruction set the CPU kernels run here (`avx512`, `avx2` or `scalar`: the widest the
/// CPU has, capped by `NUVEC_CPU_ISA`), and the CPU features that choice looks at which this CPU
/// reports.
pub fn kernel_isa() -> (&'static str, Vec<&'static str>) {
    let name = match simd::isa() {
        simd::Isa::Scalar => "scalar",
        #[cfg(target_arch = "x86_64")]
        simd::Isa::Avx2 => "avx2",
        #[cfg(target_arch = "x86_64")]
        simd::Isa::Avx512 => "avx512",
    };
    (name, simd::detected_features())
}

/// Turns int8 activations on or off for the CPU's 4- and 8-bit products of up to 32 input rows (the
/// default is `NUVEC_CPU_INT8_DOT`, off when unset): the rows quantized to int8 per 32 values, as
/// llama.cpp's Q8_1 products, on AVX2 (`vpmaddubsw`) or AVX-512 VNNI (`vpdpbusd`). Faster
/// decoding; each product then differs from the f32 one by at most `Σ |w| · d / 2` (`d` = the 32
/// values' largest magnitude / 127), so logits no longer match mlx-lm's to f32 tolerance.
/// Returns whether the path is on: false where the processor lacks AVX2, FMA and F16C (the f32
/// kernels run). Takes effect for the products that
/// follow, on every thread.
pub fn set_int8_activations(on: bool) -> bool {
    qgemv_i8::set(on)
}

/// Whether the CPU's 4- and 8-bit products of one or a few rows take int8 activations
/// ([`set_int8_activations`]).
pub fn int8_activations() -> bool {
    qgemv_i8::enabled()
}

/// Threads the CPU kernels use.
pub fn num_threads() -> usize {
    pool::threads()
}

pub(crate) fn output(data: Vec<f32>, shape: &[usize]) -> Result<Array> {
    Array::from_slice(&data, shape)
}

impl Backend for CpuBackend {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn linear(&self, x: &Array, w: &Matrix) -> Result<Array> {
        linear::linear(x, w)
    }

    fn linear_many(&self, x: &Array, ws: &[&Matrix]) -> Result<Vec<Array>> {
        linear::linear_many(x, ws)
    }

    fn silu_mul_linear(&self, gate: &Array, up: &Array, w: &Matrix) -> Result<Array> {
        linear::silu_mul_linear(gate, up, w)
    }

    fn embed(&self, table: &Matrix, ids: &[u32]) -> Result<Array> {
        linear::embed(table, ids)
    }

    fn rms_norm(&self, x: &Array, weight: &Array, eps: f32) -> Result<Array> {
        elementwise::rms_norm(x, weight, eps)
    }

    fn rope(&self, x: &Array, inv_freqs: &[f32], offset: usize, traditional: bool) -> Result<Array> {
        elementwise::rope(x, inv_freqs, offset, traditional)
    }

    fn attention(&self, q: &Array, k: &Array, v: &Array, kv_len: usize, scale: f32) -> Result<Array> {
        attention::attention(q, k, v, kv_len, scale)
    }

    fn write_axis1(&self, dst: &mut Array, src: &Array, offset: usize) -> Result<()> {
        elementwise::write_axis1(dst, src, offset)
    }

    fn write_axis1_from_rows(&self, dst: &mut Array, src: &Array, offset: usize) -> Result<()> {
        elementwise::write_axis1_from_rows(dst, src, offset)
    }

    fn transpose01(&self, x: &Array) -> Result<Array> {
        elementwise::transpose01(x)
    }

    fn add(&self, a: &Array, b: &Array) -> Result<Array> {
        elementwise::binary("add", a, b, |x, y| x + y)
    }

    fn add_bias(&self, x: &Array, bias: &Array) -> Result<Array> {
        elementwise::add_bias(x, bias)
    }

    fn mul_columns(&self, x: &Array, w: &Array) -> Result<Array> {
        elementwise::mul_columns(x, w)
    }

    fn add_linear(&self, y: &Array, t: &Array, w: &Array) -> Result<Array> {
        elementwise::add_linear(y, t, w)
    }

    fn silu_mul(&self, gate: &Array, up: &Array) -> Result<Array> {
        elementwise::silu_mul(gate, up)
    }

    fn slice_rows(&self, x: &Array, start: usize, end: usize) -> Result<Array> {
        elementwise::slice_rows(x, start, end)
    }

    fn argmax(&self, x: &Array) -> Result<Array> {
        elementwise::argmax(x)
    }

    fn argmax_gap(&self, x: &Array) -> Result<Array> {
        sampling::argmax_gap(x)
    }

    fn mask_rows(&self, x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
        sampling::mask_rows(x, bits, fill)
    }

    fn masked_argmax_gap(&self, x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
        sampling::masked_argmax_gap(x, bits, fill)
    }

    fn sample_rows(&self, x: &Array, scales: &[f32], uniforms: &[f64]) -> Result<Array> {
        sampling::sample_rows(x, scales, uniforms)
    }

    // ---- Gated DeltaNet ----

    fn causal_conv1d_silu(&self, x: &Array, state: &Array, weight: &Array) -> Result<(Array, Array)> {
        gated_delta::causal_conv1d_silu(x, state, weight)
    }

    fn gated_delta(
        &self,
        mixed: &Array,
        a: &Array,
        b: &Array,
        a_log: &Array,
        dt_bias: &Array,
        state: &Array,
        dims: GatedDeltaDims,
    ) -> Result<(Array, Array)> {
        gated_delta::gated_delta(mixed, a, b, a_log, dt_bias, state, dims)
    }

    fn sigmoid_mul(&self, gate: &Array, x: &Array) -> Result<Array> {
        gated_delta::sigmoid_mul(gate, x)
    }

    // Gemma 4
    fn gelu_mul(&self, gate: &Array, up: &Array) -> Result<Array> {
        gemma4::gelu_mul(gate, up)
    }

    fn scale(&self, x: &Array, s: f32) -> Result<Array> {
        gemma4::scale(x, s)
    }

    fn softcap(&self, x: &Array, cap: f32) -> Result<Array> {
        gemma4::softcap(x, cap)
    }

    // gpt-oss.

    fn paged_decode_attention(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        seqs: &[crate::PagedSeq<'_>],
        block_size: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        paged_attention::paged_decode_attention(q, k, v, seqs, block_size, scale, sinks)
    }

    fn quantize_rows_into(&self, rows: &Array, store: &mut crate::Quantized, slots: &[usize]) -> Result<()> {
        quantized_kv::quantize_rows_into(rows, store, slots)
    }

    fn copy_rows_within(&self, a: &mut Array, from: usize, to: usize, n: usize) -> Result<()> {
        quantized_kv::copy_rows_within(a, from, to, n)
    }

    fn dequantize_paged(
        &self,
        store: &crate::Quantized,
        heads: usize,
        table: &[u32],
        block_size: usize,
        from: usize,
        to: usize,
    ) -> Result<Array> {
        quantized_kv::dequantize_paged(store, heads, table, block_size, from, to)
    }

    fn paged_decode_attention_quantized(
        &self,
        q: &Array,
        k: &crate::Quantized,
        v: &crate::Quantized,
        seqs: &[crate::PagedSeq<'_>],
        block_size: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        quantized_kv::paged_decode_attention_quantized(q, k, v, seqs, block_size, scale, sinks)
    }

    fn attention_sinks(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        kv_len: usize,
        scale: f32,
        sinks: &[f32],
    ) -> Result<Array> {
        attention::attention_sinks(q, k, v, kv_len, scale, sinks)
    }

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
        attention::attention_window(q, k, v, kv_len, scale, window, sinks)
    }

    fn swiglu_oai(&self, gate: &Array, up: &Array, alpha: f32, limit: f32) -> Result<Array> {
        gpt_oss::swiglu_oai(gate, up, alpha, limit)
    }
}
