//! The first maximum of each row (greedy sampling), in two launches: ranges of a row a block
//! each, then one block per row combining them.

use cudarc::driver::LaunchConfig;

use super::{to_i32, CudaBackend};
use crate::backends::cuda::{DeviceBuffer, State};
use crate::{Array, DType, Error, Result};

/// Values of a row per block of `argmax_part_f32` (at least; at most 1024 blocks per row): 4 per
/// thread of its 256.
const ARGMAX_CHUNK: usize = 1024;

impl CudaBackend {
    /// The first maximum of each row of `x` into `out` (u32s): its index (`gap` false: `argmax`),
    /// or its index, value and lead over the values before it (`gap` true: `argmax_gap`, three
    /// per row). Each row is cut into ranges of [`ARGMAX_CHUNK`] values or more, a block each
    /// (`argmax_part_f32`), then one block per row combines them (`argmax_final_f32`). With
    /// `mask` (`n.div_ceil(32)` words a row), the entries it refuses read as its fill value.
    pub(super) fn argmax_rows(
        &self,
        op: &'static str,
        x: &Array,
        out: u64,
        gap: bool,
        mask: Option<(&DeviceBuffer, f32)>,
    ) -> Result<()> {
        let n = x.dim(-1);
        let rows = x.len() / n;
        let xp = self.f32_ptr(op, "x", x)?;
        let words = n.div_ceil(32);
        let (mp, fill) = mask.map_or((0, 0.0), |(m, fill)| (m.ptr(), fill));
        let words_i = to_i32(op, "mask words", words)?;
        let parts = n.div_ceil(ARGMAX_CHUNK).clamp(1, 1024);
        let chunk = n.div_ceil(parts);
        let (ni, parts_i, chunk_i, gap_i) =
            (to_i32(op, "row length", n)?, parts as i32, to_i32(op, "chunk", chunk)?, i32::from(gap));
        let per_row = if gap { 3 } else { 1 };
        // The grid's second axis holds at most 65535 rows: larger batches go in pieces.
        for first in (0..rows).step_by(65535) {
            let count = (rows - first).min(65535);
            let part = DeviceBuffer::alloc(self.st()?, count * parts * 16)?;
            let pp = part.ptr();
            let xr = xp + (first * n * 4) as u64;
            let o = out + (first * per_row * 4) as u64;
            let m = if mp == 0 { 0 } else { mp + (first * words * 4) as u64 };
            let cfg =
                LaunchConfig { grid_dim: (parts as u32, count as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            launch!(self.st()?, op, "argmax_part_f32", cfg; pp, xr, ni, chunk_i, m, words_i, fill);
            let cfg = LaunchConfig { grid_dim: (count as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            launch!(self.st()?, op, "argmax_final_f32", cfg; o, pp, xr, ni, parts_i, gap_i, m, words_i, fill);
        }
        Ok(())
    }

    /// The index of each row's first maximum.
    pub(super) fn argmax_first(&self, x: &Array) -> Result<Array> {
        let op = "argmax";
        if x.shape().is_empty() || x.dim(-1) == 0 {
            return Err(Error::shape(op, format!("cannot take the argmax of rows of {:?}", x.shape())));
        }
        let shape = &x.shape()[..x.shape().len() - 1];
        let out = self.output(shape, DType::U32, false)?;
        self.argmax_rows(op, x, out.cuda_ptr()?, false, None)?;
        Ok(out)
    }
}
