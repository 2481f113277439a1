//! decode fusions on a CUDA device (kernels/fused.cu): a residual add with the norm after it, the
//! q/k norms and rope of an attention step, both cache writes, and the greedy pick, each one
//! launch where the separate ops take two to six. Cases the kernels do not take (mixed dtypes,
//! very long rows) run the separate ops, as the trait's defaults do.

use cudarc::driver::LaunchConfig;

use super::{cfg_1d, float_code, norm_threads, rows_vectorizable, to_i32, CudaBackend};
use crate::backends::cuda::graph::StepPos;
use crate::backends::cuda::State;
use crate::{Array, Backend, DType, Error, Result};

/// Most features per head `rope_qk_f32` takes (its cos/sin table of d floats stays within the
/// 48 KiB of shared memory every device gives a block).
const ROPE_QK_MAX_DIM: usize = 8192;
/// Heads (warps) per block of `rope_qk_f32`.
const ROPE_QK_HEADS: usize = 8;

impl CudaBackend {
    pub(super) fn fused_add_rms_norm(&self, a: &Array, b: &Array, weight: &Array, eps: f32) -> Result<(Array, Array)> {
        let op = "add_rms_norm";
        if a.shape() != b.shape() {
            return Err(Error::shape(op, format!("{:?} and {:?} differ", a.shape(), b.shape())));
        }
        if a.shape().is_empty() {
            return Err(Error::shape(op, "input is 0-d"));
        }
        let d = a.dim(-1);
        if weight.len() != d {
            return Err(Error::shape(op, format!("weight of {} for rows of {d}", weight.len())));
        }
        let (ap, bp) = (self.f32_ptr(op, "a", a)?, self.f32_ptr(op, "b", b)?);
        let w_dt = float_code(op, "weight", weight)?;
        let wp = self.ptr(op, "weight", weight)?;
        let sum = self.output(a.shape(), DType::F32, false)?;
        let normed = self.output(a.shape(), DType::F32, false)?;
        let rows = a.len() / d.max(1);
        if rows == 0 || d == 0 {
            return Ok((sum, normed));
        }
        let (sp, np, di) = (sum.cuda_ptr()?, normed.cuda_ptr()?, to_i32(op, "row length", d)?);
        let grid = u32::try_from(rows).map_err(|_| Error::Unsupported(format!("{op}: {rows} rows")))?;
        let cfg =
            LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (norm_threads(d, rows), 1, 1), shared_mem_bytes: 0 };
        let vec = i32::from(rows_vectorizable(d, &[sp, np, ap, bp]));
        launch!(self.st()?, op, "add_rms_norm_f32", cfg; sp, np, ap, bp, wp, w_dt, di, eps, vec);
        Ok((sum, normed))
    }

    pub(super) fn fused_rope_qk(
        &self,
        q: &Array,
        k: &Array,
        qk_norm: Option<(&Array, &Array, f32)>,
        inv_freqs: &[f32],
        offset: usize,
        traditional: bool,
    ) -> Result<(Array, Array)> {
        let op = "rope_qk";
        let (&[l, hq, d], &[lk, hkv, dk]) = (q.shape(), k.shape()) else {
            return Err(Error::shape(
                op,
                format!("expected [L, H, D] q and k, got {:?} and {:?}", q.shape(), k.shape()),
            ));
        };
        if l != lk || d != dk {
            return Err(Error::shape(op, format!("q {:?} and k {:?} differ in L or D", q.shape(), k.shape())));
        }
        let half = inv_freqs.len();
        if 2 * half > d {
            return Err(Error::shape(op, format!("{half} frequencies for heads of {d}")));
        }
        let norm_dtypes = qk_norm.map(|(qw, kw, _)| (qw.dtype(), kw.dtype()));
        let fits = d <= ROPE_QK_MAX_DIM && l <= 65535 && norm_dtypes.is_none_or(|(a, b)| a == b);
        if !fits {
            // The separate ops (the trait's default).
            let (q, k) = match qk_norm {
                Some((qw, kw, eps)) => (self.rms_norm(q, qw, eps)?, self.rms_norm(k, kw, eps)?),
                None => (q.clone(), k.clone()),
            };
            return Ok((
                self.rope(&q, inv_freqs, offset, traditional)?,
                self.rope(&k, inv_freqs, offset, traditional)?,
            ));
        }
        let (qp, kp) = (self.f32_ptr(op, "q", q)?, self.f32_ptr(op, "k", k)?);
        let (qwp, kwp, w_dt, eps, norm) = match qk_norm {
            Some((qw, kw, eps)) => {
                for (name, w) in [("q norm weight", qw), ("k norm weight", kw)] {
                    if w.len() != d {
                        return Err(Error::shape(op, format!("{name} of {} for heads of {d}", w.len())));
                    }
                }
                let w_dt = float_code(op, "q norm weight", qw)?;
                (self.ptr(op, "q norm weight", qw)?, self.ptr(op, "k norm weight", kw)?, w_dt, eps, 1i32)
            }
            None => (0u64, 0u64, 0i32, 0f32, 0i32),
        };
        let qo = self.output(q.shape(), DType::F32, false)?;
        let ko = self.output(k.shape(), DType::F32, false)?;
        if l == 0 || d == 0 || hq + hkv == 0 {
            return Ok((qo, ko));
        }
        let fp = self.rope_table(if inv_freqs.is_empty() { &[0f32][..] } else { inv_freqs })?;
        let (qop, kop) = (qo.cuda_ptr()?, ko.cuda_ptr()?);
        let (halfi, hqi, hkvi, di) = (half as i32, to_i32(op, "heads", hq)?, to_i32(op, "heads", hkv)?, d as i32);
        let (offset, trad) = (offset as i64, traditional as i32);
        // A warp per head, ROPE_QK_HEADS heads of one position per block (which share its
        // cos/sin table of 2 * half floats).
        let cfg = LaunchConfig {
            grid_dim: ((hq + hkv).div_ceil(ROPE_QK_HEADS) as u32, l as u32, 1),
            block_dim: (32 * ROPE_QK_HEADS as u32, 1, 1),
            shared_mem_bytes: (2 * half * 4) as u32,
        };
        // CUDA graphs: while capturing, the kernel adds the step's delta to the offset.
        let step = self.st()?.step_scalars();
        launch!(self.st()?, op, "rope_qk_f32", cfg;
            qop, kop, qp, kp, qwp, kwp, w_dt, eps, norm, fp, halfi, hqi, hkvi, di, offset, trad, step);
        guard!(self.st()?, |_at| true);
        Ok((qo, ko))
    }

    pub(super) fn fused_write_kv_rows(
        &self,
        k_cache: &mut Array,
        v_cache: &mut Array,
        k: &Array,
        v: &Array,
        offset: usize,
    ) -> Result<()> {
        let op = "write_kv_rows";
        let one_launch = k_cache.shape() == v_cache.shape()
            && k.shape() == v.shape()
            && [k_cache.dtype(), v_cache.dtype(), k.dtype(), v.dtype()].iter().all(|&t| t == DType::F32);
        let (&[a, cap, c], &[n, sa, sc]) = (k_cache.shape(), k.shape()) else {
            return Err(Error::shape(
                op,
                format!("expected 3-d arrays, got {:?} and {:?}", k_cache.shape(), k.shape()),
            ));
        };
        if !one_launch || a != sa || c != sc || offset + n > cap {
            // The separate writes, which name what is wrong.
            self.write_axis1_from_rows(k_cache, k, offset)?;
            return self.write_axis1_from_rows(v_cache, v, offset);
        }
        let (kp, vp) = (self.f32_ptr(op, "k", k)?, self.f32_ptr(op, "v", v)?);
        self.ptr(op, "k cache", k_cache)?;
        self.ptr(op, "v cache", v_cache)?;
        let each = (a * n * c) as u64;
        if each == 0 {
            return Ok(());
        }
        let (kd, vd) = (k_cache.cuda_ptr_mut()?, v_cache.cuda_ptr_mut()?);
        let (ai, capi, ci, offi) = (
            to_i32(op, "heads", a)?,
            to_i32(op, "capacity", cap)?,
            to_i32(op, "row size", c)?,
            to_i32(op, "offset", offset)?,
        );
        // CUDA graphs: while capturing, the kernel adds the step's delta to the offset.
        let step = self.st()?.step_scalars();
        launch!(self.st()?, op, "write_kv_rows_f32", cfg_1d(2 * each as usize);
            kd, vd, kp, vp, each, ai, capi, ci, offi, step);
        guard!(self.st()?, |at| offset + at.delta + n <= cap);
        Ok(())
    }

    pub(super) fn fused_argmax_gap(&self, x: &Array) -> Result<Array> {
        let op = "argmax_gap";
        if x.shape().is_empty() || x.dim(-1) == 0 {
            return Err(Error::shape(op, format!("rows of {:?}", x.shape())));
        }
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("checked above") = 3;
        let out = self.output(&shape, DType::U32, false)?;
        self.argmax_rows(op, x, out.cuda_ptr()?, true)?;
        Ok(out)
    }
}
