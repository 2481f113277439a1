//! A paged cache's quantized keys and values on a CUDA device (kernels/kv_quant.cu): new rows
//! quantized where they are, and a sequence's positions dequantized through its block table for
//! attention, both bit for bit what the host computes (`quantize_affine`, `dequantize_rows`).

use cudarc::driver::LaunchConfig;

use super::{to_i32, CudaBackend};
use crate::backend::{check_quantized_paged, check_quantized_rows, check_rows_within};
use crate::backends::cuda::graph::copy_device;
use crate::backends::cuda::State;
use crate::{Array, DType, Error, Quantized, Result};

/// Threads of a block of `kv_quantize_rows_f32` (KVQ_WARPS warps).
const QUANTIZE_THREADS: u32 = 128;

impl CudaBackend {
    /// [`crate::Backend::copy_rows_within`]: one copy on the device's stream.
    pub(super) fn rows_within(&self, a: &mut Array, from: usize, to: usize, n: usize) -> Result<()> {
        let row = check_rows_within(a, from, to, n)?;
        self.on_device("copy_rows_within", "a", a)?;
        if n == 0 || row == 0 {
            return Ok(());
        }
        let base = a.cuda_ptr_mut()?;
        copy_device(self.st()?, base + (to * row) as u64, base + (from * row) as u64, n * row)
    }

    /// [`crate::Backend::quantize_rows_into`].
    pub(super) fn kv_quantize_rows(&self, rows: &Array, store: &mut Quantized, slots: &[usize]) -> Result<()> {
        let op = "quantize_rows_into";
        let n = check_quantized_rows(rows, store, slots)?;
        if n == 0 {
            return Ok(());
        }
        if n > 0x7fff_ffff {
            return Err(Error::shape(op, format!("{n} rows: more than one launch takes")));
        }
        let (cols, bits, gs) = (store.cols(), store.spec.bits, store.spec.group_size);
        let rows = rows.astype(DType::F32)?;
        let rp = self.f32_ptr(op, "rows", &rows)?;
        for part in [&store.packed, &store.scales, &store.biases] {
            self.on_device(op, "store", part)?;
        }
        let slots = slots.iter().map(|&s| to_i32(op, "slot", s)).collect::<Result<Vec<i32>>>()?;
        // A decode step's keys and values go to the same slots: one upload for both.
        let slots = self.upload_shared(&slots)?;
        let sl = slots.ptr();
        let (wp, sp, bp) = (store.packed.cuda_ptr_mut()?, store.scales.cuda_ptr_mut()?, store.biases.cuda_ptr_mut()?);
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (QUANTIZE_THREADS, 1, 1), shared_mem_bytes: 0 };
        let (ci, bi, gi) = (to_i32(op, "row width", cols)?, bits as i32, gs as i32);
        launch!(self.st()?, op, "kv_quantize_rows_f32", cfg; rp, sl, wp, sp, bp, ci, bi, gi);
        Ok(())
    }

    /// [`crate::Backend::dequantize_paged`].
    pub(super) fn kv_dequantize_paged(
        &self,
        store: &Quantized,
        heads: usize,
        table: &[u32],
        block_size: usize,
        from: usize,
        to: usize,
    ) -> Result<Array> {
        let op = "dequantize_paged";
        check_quantized_paged(store, heads, table, block_size, from, to)?;
        let (n, dim) = (to - from, store.cols() / heads);
        let out = self.output(&[heads, n, dim], DType::F32, false)?;
        if n == 0 || dim == 0 {
            return Ok(out);
        }
        if n > 0x7fff_ffff || heads > 65535 {
            return Err(Error::shape(op, format!("{n} positions of {heads} heads: more than one launch takes")));
        }
        let (wp, sp, bp) = (
            self.ptr(op, "words", &store.packed)?,
            self.ptr(op, "scales", &store.scales)?,
            self.ptr(op, "biases", &store.biases)?,
        );
        let blocks = &table[..to.div_ceil(block_size)];
        let ids = blocks.iter().map(|&b| to_i32(op, "block id", b as usize)).collect::<Result<Vec<i32>>>()?;
        // A step's layers read the same table: one upload for all of them.
        let ids = self.upload_shared(&ids)?;
        let o = out.cuda_ptr()?;
        let st: &State = self.st()?;
        let cfg = LaunchConfig {
            grid_dim: (n as u32, heads as u32, 1),
            block_dim: (dim.next_multiple_of(32).min(128) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (tp, bsi, fromi, ni) =
            (ids.ptr(), to_i32(op, "block size", block_size)?, to_i32(op, "first position", from)?, n as i32);
        let (hi, di, bi, gi) = (heads as i32, dim as i32, store.spec.bits as i32, store.spec.group_size as i32);
        launch!(st, op, "kv_dequantize_paged_f32", cfg; o, wp, sp, bp, tp, bsi, fromi, ni, hi, di, bi, gi);
        Ok(out)
    }
}
