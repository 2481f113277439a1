//! A categorical draw per row where the logits are, certified against the host's draw
//! (`sample_rows_f32`, kernels/sampling.cu): a sampled request's step then reads three words
//! instead of its whole row of logits.

use cudarc::driver::LaunchConfig;

use super::{to_i32, CudaBackend};
use crate::backends::cuda::State;
use crate::{Array, DType, Error, Result};

/// Threads per row's block (`SAMPLE_THREADS`).
const SAMPLE_THREADS: u32 = 512;
/// Most values a row may have (`SAMPLE_SEG * SAMPLE_MAX_SEGS`); longer rows are left to the host.
const SAMPLE_MOST_VALUES: usize = 256 * 4096;

impl CudaBackend {
    /// [`crate::Backend::sample_rows`]: the scales and uniforms uploaded as one f64 table, one
    /// block per row.
    pub(super) fn sampled_rows(&self, x: &Array, scales: &[f32], uniforms: &[f64]) -> Result<Array> {
        let op = "sample_rows";
        let n = crate::backend::check_sample_rows(x, scales, uniforms)?;
        let rows = x.dim(0);
        let xp = self.f32_ptr(op, "x", x)?;
        if n > SAMPLE_MOST_VALUES || rows > 65535 || rows == 0 {
            // More than one launch takes (no model comes near): every draw left to the host.
            return Array::from_slice_on(&vec![0u32; rows * 3], &[rows, 3], x.device());
        }
        let table: Vec<f64> = scales.iter().zip(uniforms).flat_map(|(&s, &u)| [s as f64, u]).collect();
        let table = self.upload(&table)?;
        let out = self.output(&[rows, 3], DType::U32, false)?;
        let (o, tp, ni) = (out.cuda_ptr()?, table.ptr(), to_i32(op, "row length", n)?);
        let cfg =
            LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (SAMPLE_THREADS, 1, 1), shared_mem_bytes: 0 };
        launch!(self.st()?, op, "sample_rows_f32", cfg; o, xp, ni, tp);
        Ok(out)
    }
}
