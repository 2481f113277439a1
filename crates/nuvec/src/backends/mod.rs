//! Device backends. Each folder implements [`crate::Backend`] for one device.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// The CPU backend behind a check that every input lives in host memory: with the `cuda`
/// feature an array may live on a GPU, and a CPU op given one returns an error naming the op,
/// the input and its device instead of reading device memory.
#[cfg(feature = "cuda")]
pub(crate) mod host_checked {
    use super::cpu::CpuBackend;
    use crate::{Array, Backend, Device, Error, GatedDeltaDims, Matrix, Result};

    #[derive(Debug, Clone, Copy, Default)]
    pub(crate) struct HostChecked;

    fn on_host(op: &str, inputs: &[(&str, &Array)]) -> Result<()> {
        match inputs.iter().find(|(_, a)| a.device() != Device::Cpu) {
            None => Ok(()),
            Some((name, a)) => Err(Error::Device(format!(
                "{op}: {name} is on {} but the op runs on the cpu; move it with to_device(Device::Cpu)",
                a.device()
            ))),
        }
    }

    fn matrix<'a>(name: &'a str, w: &'a Matrix) -> Vec<(&'a str, &'a Array)> {
        match w {
            Matrix::Dense(a) => vec![(name, a)],
            Matrix::Quantized(q) => vec![(name, &q.packed), ("scales", &q.scales), ("biases", &q.biases)],
        }
    }

    impl Backend for HostChecked {
        fn device(&self) -> Device {
            Device::Cpu
        }

        fn linear(&self, x: &Array, w: &Matrix) -> Result<Array> {
            on_host("linear", &[&[("x", x)][..], &matrix("weight", w)].concat())?;
            CpuBackend.linear(x, w)
        }

        fn embed(&self, table: &Matrix, ids: &[u32]) -> Result<Array> {
            on_host("embed", &matrix("table", table))?;
            CpuBackend.embed(table, ids)
        }

        fn rms_norm(&self, x: &Array, weight: &Array, eps: f32) -> Result<Array> {
            on_host("rms_norm", &[("x", x), ("weight", weight)])?;
            CpuBackend.rms_norm(x, weight, eps)
        }

        fn rope(&self, x: &Array, inv_freqs: &[f32], offset: usize, traditional: bool) -> Result<Array> {
            on_host("rope", &[("x", x)])?;
            CpuBackend.rope(x, inv_freqs, offset, traditional)
        }

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
            on_host("paged_decode_attention", &[("q", q), ("k", k), ("v", v)])?;
            CpuBackend.paged_decode_attention(q, k, v, seqs, block_size, scale, sinks)
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
            on_host("paged_decode_attention_quantized", &[("q", q), ("keys", &k.packed), ("values", &v.packed)])?;
            CpuBackend.paged_decode_attention_quantized(q, k, v, seqs, block_size, scale, sinks)
        }

        fn quantize_rows_into(&self, rows: &Array, store: &mut crate::Quantized, slots: &[usize]) -> Result<()> {
            on_host("quantize_rows_into", &[("rows", rows), ("store", &store.packed)])?;
            CpuBackend.quantize_rows_into(rows, store, slots)
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
            on_host("dequantize_paged", &[("store", &store.packed)])?;
            CpuBackend.dequantize_paged(store, heads, table, block_size, from, to)
        }

        fn copy_rows_within(&self, a: &mut Array, from: usize, to: usize, n: usize) -> Result<()> {
            on_host("copy_rows_within", &[("a", a)])?;
            CpuBackend.copy_rows_within(a, from, to, n)
        }

        fn attention(&self, q: &Array, k: &Array, v: &Array, kv_len: usize, scale: f32) -> Result<Array> {
            on_host("attention", &[("q", q), ("k", k), ("v", v)])?;
            CpuBackend.attention(q, k, v, kv_len, scale)
        }

        fn write_axis1(&self, dst: &mut Array, src: &Array, offset: usize) -> Result<()> {
            on_host("write_axis1", &[("dst", dst), ("src", src)])?;
            CpuBackend.write_axis1(dst, src, offset)
        }

        fn linear_many(&self, x: &Array, ws: &[&Matrix]) -> Result<Vec<Array>> {
            let mut inputs = vec![("x", x)];
            ws.iter().for_each(|w| inputs.extend(matrix("weight", w)));
            on_host("linear_many", &inputs)?;
            CpuBackend.linear_many(x, ws)
        }

        fn silu_mul_linear(&self, gate: &Array, up: &Array, w: &Matrix) -> Result<Array> {
            on_host("silu_mul_linear", &[&[("gate", gate), ("up", up)][..], &matrix("weight", w)].concat())?;
            CpuBackend.silu_mul_linear(gate, up, w)
        }

        fn write_axis1_from_rows(&self, dst: &mut Array, src: &Array, offset: usize) -> Result<()> {
            on_host("write_axis1_from_rows", &[("dst", dst), ("src", src)])?;
            CpuBackend.write_axis1_from_rows(dst, src, offset)
        }

        fn transpose01(&self, x: &Array) -> Result<Array> {
            on_host("transpose01", &[("x", x)])?;
            CpuBackend.transpose01(x)
        }

        fn add(&self, a: &Array, b: &Array) -> Result<Array> {
            on_host("add", &[("a", a), ("b", b)])?;
            CpuBackend.add(a, b)
        }

        fn add_bias(&self, x: &Array, bias: &Array) -> Result<Array> {
            on_host("add_bias", &[("x", x), ("bias", bias)])?;
            CpuBackend.add_bias(x, bias)
        }

        fn mul_columns(&self, x: &Array, w: &Array) -> Result<Array> {
            on_host("mul_columns", &[("x", x), ("w", w)])?;
            CpuBackend.mul_columns(x, w)
        }

        fn add_linear(&self, y: &Array, t: &Array, w: &Array) -> Result<Array> {
            on_host("add_linear", &[("y", y), ("t", t), ("w", w)])?;
            CpuBackend.add_linear(y, t, w)
        }

        fn silu_mul(&self, gate: &Array, up: &Array) -> Result<Array> {
            on_host("silu_mul", &[("gate", gate), ("up", up)])?;
            CpuBackend.silu_mul(gate, up)
        }

        fn slice_rows(&self, x: &Array, start: usize, end: usize) -> Result<Array> {
            on_host("slice_rows", &[("x", x)])?;
            CpuBackend.slice_rows(x, start, end)
        }

        fn argmax(&self, x: &Array) -> Result<Array> {
            on_host("argmax", &[("x", x)])?;
            CpuBackend.argmax(x)
        }

        // ---- Gated DeltaNet ----

        fn causal_conv1d_silu(&self, x: &Array, state: &Array, weight: &Array) -> Result<(Array, Array)> {
            on_host("causal_conv1d_silu", &[("x", x), ("state", state), ("weight", weight)])?;
            CpuBackend.causal_conv1d_silu(x, state, weight)
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
            let inputs =
                [("mixed", mixed), ("a", a), ("b", b), ("a_log", a_log), ("dt_bias", dt_bias), ("state", state)];
            on_host("gated_delta", &inputs)?;
            CpuBackend.gated_delta(mixed, a, b, a_log, dt_bias, state, dims)
        }

        fn sigmoid_mul(&self, gate: &Array, x: &Array) -> Result<Array> {
            on_host("sigmoid_mul", &[("gate", gate), ("x", x)])?;
            CpuBackend.sigmoid_mul(gate, x)
        }

        // Gemma 4
        fn gelu_mul(&self, gate: &Array, up: &Array) -> Result<Array> {
            on_host("gelu_mul", &[("gate", gate), ("up", up)])?;
            CpuBackend.gelu_mul(gate, up)
        }

        // gpt-oss.

        fn attention_sinks(
            &self,
            q: &Array,
            k: &Array,
            v: &Array,
            kv_len: usize,
            scale: f32,
            sinks: &[f32],
        ) -> Result<Array> {
            on_host("attention_sinks", &[("q", q), ("k", k), ("v", v)])?;
            CpuBackend.attention_sinks(q, k, v, kv_len, scale, sinks)
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
            on_host("attention_window", &[("q", q), ("k", k), ("v", v)])?;
            CpuBackend.attention_window(q, k, v, kv_len, scale, window, sinks)
        }

        fn swiglu_oai(&self, gate: &Array, up: &Array, alpha: f32, limit: f32) -> Result<Array> {
            on_host("swiglu_oai", &[("gate", gate), ("up", up)])?;
            CpuBackend.swiglu_oai(gate, up, alpha, limit)
        }

        fn scale(&self, x: &Array, s: f32) -> Result<Array> {
            on_host("scale", &[("x", x)])?;
            CpuBackend.scale(x, s)
        }

        fn softcap(&self, x: &Array, cap: f32) -> Result<Array> {
            on_host("softcap", &[("x", x)])?;
            CpuBackend.softcap(x, cap)
        }

        // decode fusions

        fn add_rms_norm(&self, a: &Array, b: &Array, weight: &Array, eps: f32) -> Result<(Array, Array)> {
            on_host("add_rms_norm", &[("a", a), ("b", b), ("weight", weight)])?;
            CpuBackend.add_rms_norm(a, b, weight, eps)
        }

        fn rope_qk(
            &self,
            q: &Array,
            k: &Array,
            qk_norm: Option<(&Array, &Array, f32)>,
            inv_freqs: &[f32],
            offset: usize,
            traditional: bool,
        ) -> Result<(Array, Array)> {
            let mut inputs = vec![("q", q), ("k", k)];
            if let Some((qw, kw, _)) = qk_norm {
                inputs.extend([("q norm weight", qw), ("k norm weight", kw)]);
            }
            on_host("rope_qk", &inputs)?;
            CpuBackend.rope_qk(q, k, qk_norm, inv_freqs, offset, traditional)
        }

        fn write_kv_rows(
            &self,
            k_cache: &mut Array,
            v_cache: &mut Array,
            k: &Array,
            v: &Array,
            offset: usize,
        ) -> Result<()> {
            on_host("write_kv_rows", &[("k cache", k_cache), ("v cache", v_cache), ("k", k), ("v", v)])?;
            CpuBackend.write_kv_rows(k_cache, v_cache, k, v, offset)
        }

        fn argmax_gap(&self, x: &Array) -> Result<Array> {
            on_host("argmax_gap", &[("x", x)])?;
            CpuBackend.argmax_gap(x)
        }

        fn mask_rows(&self, x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
            on_host("mask_rows", &[("x", x)])?;
            CpuBackend.mask_rows(x, bits, fill)
        }

        fn masked_argmax_gap(&self, x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
            on_host("masked_argmax_gap", &[("x", x)])?;
            CpuBackend.masked_argmax_gap(x, bits, fill)
        }

        fn sample_rows(&self, x: &Array, scales: &[f32], uniforms: &[f64]) -> Result<Array> {
            on_host("sample_rows", &[("x", x)])?;
            CpuBackend.sample_rows(x, scales, uniforms)
        }

        // gated MLP fusion

        fn gate_up_silu(&self, x: &Array, gate: &Matrix, up: &Matrix) -> Result<Array> {
            on_host("gate_up_silu", &[&[("x", x)][..], &matrix("gate", gate), &matrix("up", up)].concat())?;
            CpuBackend.gate_up_silu(x, gate, up)
        }
    }
}
