//! Float conversions on the device: [`crate::Array::astype`] of an array here, writes of rows
//! into a cache along its positions (converted to its type), and the widening of a
//! half-precision cache's rows for the attention paths that read f32 only.

use super::{cfg_1d, float_code, to_i32, CudaBackend, DT_BF16, DT_F16, DT_F32};
use crate::backends::cuda::graph::StepPos;
use crate::backends::cuda::{DeviceBuffer, State};
use crate::{Array, DType, Error, Result};

impl CudaBackend {
    /// [`crate::Backend::write_axis1`], and with `ring` (the first position a rotating cache
    /// reuses) [`crate::Backend::write_axis1_ring`]: the same write, and while a CUDA graph
    /// captures it, later replays write at the ring's slot instead of the next position.
    pub(super) fn write_axis1_at(
        &self,
        dst: &mut Array,
        src: &Array,
        offset: usize,
        ring: Option<usize>,
    ) -> Result<()> {
        let op = "write_axis1";
        let (&[a, cap, c], &[sa, n, sc]) = (dst.shape(), src.shape()) else {
            return Err(Error::shape(op, format!("expected 3-d arrays, got {:?} and {:?}", dst.shape(), src.shape())));
        };
        if a != sa || c != sc || offset + n > cap {
            return Err(Error::shape(op, format!("cannot write {:?} into {:?} at {offset}", src.shape(), dst.shape())));
        }
        // Any float dtypes: a cache of f16 or bf16 takes f32 rows rounded to its type.
        let (src_dt, dst_dt) = (float_code(op, "src", src)?, float_code(op, "dst", dst)?);
        let sp = self.ptr(op, "src", src)?;
        self.on_device(op, "dst", dst)?;
        let total = (a * n * c) as u64;
        if total == 0 {
            return Ok(());
        }
        let dp = dst.cuda_ptr_mut()?;
        let (ni, capi, ci, offi) = (
            to_i32(op, "rows", n)?,
            to_i32(op, "capacity", cap)?,
            to_i32(op, "row size", c)?,
            to_i32(op, "offset", offset)?,
        );
        if ring.is_some_and(|keep| n != 1 || keep >= cap || offset < keep) {
            return Err(Error::shape(op, format!("a ring write of {n} rows at {offset} into {cap} keeping {ring:?}")));
        }
        // CUDA graphs: while capturing, the kernel adds the step's delta to the offset (in a
        // ring, wrapping over the positions from `keep` on).
        let step = self.st()?.step_scalars();
        let ringi = ring.map_or(Ok(-1), |keep| to_i32(op, "ring", keep))?;
        launch!(self.st()?, op, "write_axis1", cfg_1d(total as usize);
            dp, dst_dt, sp, src_dt, total, ni, capi, ci, offi, step, ni, ringi);
        guard!(self.st()?, |at| ring.is_some() || offset + at.delta + n <= cap);
        Ok(())
    }

    /// The first `n` rows of each of the `a` heads of a cache `[a, cap, c]` at `src` (dtype
    /// `dt`) as a fresh f32 `[a, n, c]` buffer: what the f32-only attention paths read.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn widen_rows(
        &self,
        op: &'static str,
        src: u64,
        dt: i32,
        a: usize,
        cap: usize,
        n: usize,
        c: usize,
    ) -> Result<DeviceBuffer> {
        let out = DeviceBuffer::alloc(self.st()?, a * n * c * 4)?;
        let total = (a * n * c) as u64;
        if total > 0 {
            let (o, f32_dt, no_step) = (out.ptr(), DT_F32, 0u64);
            let (ni, ci, capi) = (to_i32(op, "rows", n)?, to_i32(op, "row size", c)?, to_i32(op, "capacity", cap)?);
            let (zero, src_cap, no_ring) = (0i32, capi, -1i32);
            launch!(self.st()?, op, "write_axis1", cfg_1d(total as usize);
                o, f32_dt, src, dt, total, ni, ni, ci, zero, no_step, src_cap, no_ring);
        }
        Ok(out)
    }

    /// `x` (f32, f16 or bf16) as `dtype` (one of those), converted on the device: what
    /// [`Array::astype`] does for an array here (half precision rounded to nearest even, as the
    /// host's conversion rounds).
    pub(crate) fn cast(&self, x: &Array, dtype: DType) -> Result<Array> {
        let op = "astype";
        let x_dt = float_code(op, "x", x)?;
        let out_dt = match dtype {
            DType::F32 => DT_F32,
            DType::F16 => DT_F16,
            DType::BF16 => DT_BF16,
            other => return Err(Error::shape(op, format!("{} to {other}: only float dtypes", x.dtype()))),
        };
        let xp = self.ptr(op, "x", x)?;
        let out = self.output(x.shape(), dtype, false)?;
        let n = x.len() as u64;
        if n > 0 {
            let o = out.cuda_ptr()?;
            launch!(self.st()?, op, "cast_float", cfg_1d(n as usize); o, out_dt, xp, x_dt, n);
        }
        Ok(out)
    }
}
