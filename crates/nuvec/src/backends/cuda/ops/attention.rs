//! Attention over a contiguous cache: the split-key kernel and its merge for a decode step or a
//! short chunk, SGEMM + softmax + SGEMM per head for long prefills, and the choice between them
//! (kernels/attention.cu).

use cudarc::driver::LaunchConfig;

use super::{
    split_rows_aligned, to_i32, CudaBackend, ATTN_GEMM_MIN_QUERIES, ATTN_GEMM_SCORE_BYTES, ATTN_MAX_DIM, ATTN_THREADS,
    ATTS_MAX_DIM, ATTS_TARGET_BLOCKS, ATTS_THREADS, DT_F32,
};
use crate::backends::cuda::graph::{KArg, StepPos};
use crate::backends::cuda::{Derived, DeviceBuffer, State};
use crate::{Array, DType, Error, Result};

impl CudaBackend {
    /// Attention for a decode step or a short chunk: the split-key kernel, then the merge (which
    /// adds the sinks, a device pointer or 0, and writes the integer GEMVs' parts of the one
    /// output row into `parts` unless it is 0). Keys and values of dtype `kv_dt`. With `ring`
    /// (a rotating cache's full ring), a CUDA graph's replays attend at most `cap` keys.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_split(
        &self,
        op: &'static str,
        o: u64,
        parts: u64,
        (qp, kp, vp, kv_dt): (u64, u64, u64, i32),
        (l, hq, hkv, d): (usize, usize, usize, usize),
        cap: usize,
        kv_len: usize,
        scale: f32,
        (sinks, ring): (u64, bool),
    ) -> Result<()> {
        let want = ATTS_TARGET_BLOCKS.div_ceil(hq * l).max(1);
        let split = move |kv_len: usize| {
            let chunk = kv_len.div_ceil(want).max(32);
            (chunk, kv_len.div_ceil(chunk).max(1))
        };
        let (chunk, splits) = split(kv_len);
        // CUDA graphs: while capturing, the kernel reads the kv length from the step scalars and
        // takes its chunk by `split`'s rule on the device; the grid has `want` splits (`split`
        // never gives more, whatever the kv length), those past the last key write empty
        // partials that the merge skips: every later step's result is the eager one.
        let step = self.st()?.step_scalars();
        let grid_splits = if step != 0 { want.max(splits) } else { splits };
        let part = DeviceBuffer::alloc(self.st()?, l * hq * grid_splits * (d + 2) * 4)?;
        let pp = part.ptr();
        let (li, hqi, hkvi, di) = (l as i32, hq as i32, hkv as i32, d as i32);
        let (capi, kvi, chunki, si) = (to_i32(op, "capacity", cap)?, kv_len as i32, chunk as i32, grid_splits as i32);
        let wanti = to_i32(op, "splits", want)?;
        let cfg = LaunchConfig {
            grid_dim: (hq as u32, l as u32, grid_splits as u32),
            block_dim: (ATTS_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let ringi = ring as i32;
        let st = self.st()?;
        launch!(st, op, "attention_split_f32", cfg;
            pp, qp, kp, vp, li, hqi, hkvi, di, capi, kvi, scale, chunki, step, wanti, kv_dt, ringi);
        guard!(st, |at| ring || kv_len + at.delta <= cap);
        let cfg = LaunchConfig { grid_dim: (hq as u32, l as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let no_tiles = 0u64;
        launch!(st, op, "attention_merge_f32", cfg; o, pp, hqi, di, si, sinks, parts, no_tiles);
        Ok(())
    }

    /// Attention for a long chunk of queries (prefill): per query head, scores = Q K^T * scale
    /// by SGEMM, a causal softmax in place, then P V by SGEMM into the output columns; queries
    /// go in blocks so that the scores stay under `ATTN_GEMM_SCORE_BYTES`. The softmax adds the
    /// sinks (a device pointer or 0) and keeps each query's window (> 0) of positions.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_gemm(
        &self,
        op: &'static str,
        o: u64,
        (qp, kp, vp): (u64, u64, u64),
        (l, hq, hkv, d): (usize, usize, usize, usize),
        cap: usize,
        kv_len: usize,
        scale: f32,
        (sinks, window): (u64, usize),
    ) -> Result<()> {
        let group = hq / hkv;
        let rows_per_block = (ATTN_GEMM_SCORE_BYTES / (hq * kv_len * 4)).clamp(1, l);
        let scores = DeviceBuffer::alloc(self.st()?, hq * rows_per_block * kv_len * 4)?;
        let sp = scores.ptr();
        let mut t0 = 0;
        while t0 < l {
            let rows = rows_per_block.min(l - t0);
            let first = kv_len - l + t0; // position of query t0
            let n = first + rows; // keys the last query of the block sees
            for h in 0..hq {
                let g = h / group;
                let (qh, kg, _) =
                    (qp + ((t0 * hq + h) * d * 4) as u64, kp + (g * cap * d * 4) as u64, vp + (g * cap * d * 4) as u64);
                let s_h = sp + (h * rows * n * 4) as u64;
                // S^T (n x rows, col-major) = K_g^T(op T of d x n) * Q_h (d x rows, ld hq*d)
                self.sgemm_raw(op, (true, false), (n, rows, d), scale, (kg, d), (qh, hq * d), (s_h, n))?;
            }
            let cfg =
                LaunchConfig { grid_dim: (rows as u32, hq as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let (ri, ni, fi, wi) = (rows as i32, to_i32(op, "keys", n)?, first as i64, window as i64);
            launch!(self.st()?, op, "causal_softmax_f32", cfg; sp, ri, ni, fi, sinks, wi);
            for h in 0..hq {
                let g = h / group;
                let vg = vp + (g * cap * d * 4) as u64;
                let s_h = sp + (h * rows * n * 4) as u64;
                let oh = o + ((t0 * hq + h) * d * 4) as u64;
                // O^T (d x rows, ld hq*d) = V_g^T (d x n, ld d) * P^T (n x rows, ld n)
                self.sgemm_raw(op, (false, false), (d, rows, n), 1.0, (vg, d), (s_h, n), (oh, hq * d))?;
            }
            t0 += rows;
        }
        Ok(())
    }

    /// [`crate::Backend::attention`], and with `sinks` (one logit per query head, already checked
    /// against q's heads) [`crate::Backend::attention_sinks`]: every path takes the sinks as a device
    /// pointer, null for plain attention. With a `window` shorter than `kv_len`,
    /// [`crate::Backend::attention_window`]: the prefill paths (64 queries or more) keep each
    /// query's window, fewer queries attend one at a time over their own positions. With `ring`,
    /// [`crate::Backend::attention_ring`]: a CUDA graph's replays attend at most the capacity.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_over(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        kv_len: usize,
        scale: f32,
        sinks: Option<&[f32]>,
        window: Option<usize>,
        ring: bool,
    ) -> Result<Array> {
        let op = "attention";
        let (&[l, hq, d], &[hkv, cap, dk]) = (q.shape(), k.shape()) else {
            return Err(Error::shape(op, format!("q {:?}, k {:?}", q.shape(), k.shape())));
        };
        if v.shape() != k.shape() || dk != d || hkv == 0 || hq % hkv != 0 || kv_len > cap || l > kv_len {
            return Err(Error::shape(
                op,
                format!("q {:?}, k {:?}, v {:?}, kv_len {kv_len}", q.shape(), k.shape(), v.shape()),
            ));
        }
        if d > ATTN_MAX_DIM {
            return Err(Error::Unsupported(format!(
                "{op}: head size {d} (the CUDA kernel handles up to {ATTN_MAX_DIM})"
            )));
        }
        if l > 65535 {
            return Err(Error::Unsupported(format!("{op}: {l} queries in one call (at most 65535 on CUDA)")));
        }
        let qp = self.f32_ptr(op, "q", q)?;
        let (kp, vp, kv_dt) = self.kv_ptrs(op, k, v)?;
        let out = self.output(&[l, hq * d], DType::F32, false)?;
        if l == 0 || hq == 0 || d == 0 {
            return Ok(out);
        }
        let o = out.cuda_ptr()?;
        if l >= ATTN_GEMM_MIN_QUERIES {
            // CUDA graphs: these paths take positions in ways no replay patches.
            self.st()?.not_capturing("attention over 64 or more queries")?;
        }
        let sp = match sinks {
            Some(s) => self.sinks_table(s)?,
            None => 0,
        };
        // A window that reaches every position is plain causal attention.
        let window = window.filter(|&w| w < kv_len).unwrap_or(0);
        // Long chunks in bf16 on the tensor cores (ops/prefill.rs) where the precision says so.
        if l >= ATTN_GEMM_MIN_QUERIES
            && self.prefill_attention(op, o, (qp, kp, vp, kv_dt), (l, hq, hkv, d), cap, kv_len, scale, (sp, window))?
        {
            return Ok(out);
        }
        let aligned = split_rows_aligned(d, qp, kp, vp, kv_dt);
        if aligned && l >= ATTN_GEMM_MIN_QUERIES {
            let masks = (sp, window);
            if kv_dt == DT_F32 {
                return self
                    .attention_gemm(op, o, (qp, kp, vp), (l, hq, hkv, d), cap, kv_len, scale, masks)
                    .map(|_| out);
            }
            // SGEMM reads f32: the rows attended, widened (a prefill step's copy, next to its GEMMs).
            let (kw, vw) = (
                self.widen_rows(op, kp, kv_dt, hkv, cap, kv_len, d)?,
                self.widen_rows(op, vp, kv_dt, hkv, cap, kv_len, d)?,
            );
            let wide = (qp, kw.ptr(), vw.ptr());
            return self.attention_gemm(op, o, wide, (l, hq, hkv, d), kv_len, kv_len, scale, masks).map(|_| out);
        }
        if window > 0 {
            return crate::backend::attention_window_composed(self, q, k, v, kv_len, scale, window, sinks);
        }
        if aligned && d <= ATTS_MAX_DIM {
            // The merge writes the integer GEMVs' parts of a decode row (for o_proj) when its
            // warps hold whole 32-value chunks (head sizes a multiple of 32).
            let parts = if d.is_multiple_of(32) { self.row_int_parts("attention", l, hq * d)? } else { None };
            let pp = parts.as_ref().map_or(0, DeviceBuffer::ptr);
            self.attention_split(op, o, pp, (qp, kp, vp, kv_dt), (l, hq, hkv, d), cap, kv_len, scale, (sp, ring))?;
            if let Some(parts) = parts {
                out.set_derived(Derived::IntParts, parts);
            }
            return Ok(out);
        }
        let (li, hqi, hkvi, di) = (l as i32, to_i32(op, "heads", hq)?, hkv as i32, d as i32);
        let (capi, kvi) = (to_i32(op, "capacity", cap)?, kv_len as i32);
        let cfg = LaunchConfig {
            grid_dim: (hqi as u32, l as u32, 1),
            block_dim: (ATTN_THREADS as u32, 1, 1),
            shared_mem_bytes: ((d + ATTN_THREADS + 33) * 4) as u32,
        };
        launch!(self.st()?, op, "attention_f32", cfg; o, qp, kp, vp, li, hqi, hkvi, di, capi, kvi, scale, sp, kv_dt);
        record!(self.st()?, op, "attention_f32", |at| {
            let kv_len = if ring { (kv_len + at.delta).min(cap) } else { kv_len + at.delta };
            let kvi = i32::try_from(kv_len).ok().filter(|&n| n <= capi)?;
            Some((cfg, kargs![o, qp, kp, vp, li, hqi, hkvi, di, capi, kvi, scale, sp, kv_dt]))
        });
        Ok(out)
    }
}
