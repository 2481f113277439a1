//! decode fusions on a CUDA device (kernels/fused.cu): a residual add with the norm after it, the
//! q/k norms and rope of an attention step, both cache writes, and the greedy pick, each one
//! launch where the separate ops take two to six. Cases the kernels do not take (mixed dtypes,
//! very long rows) run the separate ops, as the trait's defaults do.

use cudarc::driver::LaunchConfig;

use super::{cfg_1d, float_code, norm_threads, norm_vthreads, rows_vectorizable, to_i32, CudaBackend};
use crate::backends::cuda::graph::StepPos;
use crate::backends::cuda::{Derived, DeviceBuffer, State};
use crate::{Array, Backend, DType, Error, Result};

/// Most features per head `rope_qk_f32` takes (its cos/sin table of d floats stays within the
/// 48 KiB of shared memory every device gives a block).
const ROPE_QK_MAX_DIM: usize = 8192;
/// Heads (warps) per block of `rope_qk_f32`.
const ROPE_QK_HEADS: usize = 8;

/// The dtype code of a pair of caches the fused writes take (f32, f16 or bf16, one for both).
fn cache_code(k_cache: &Array, v_cache: &Array) -> Option<i32> {
    let code = float_code("cache write", "keys", k_cache).ok()?;
    (k_cache.dtype() == v_cache.dtype()).then_some(code)
}

/// What one `rope_qk_f32` launch takes: heads of at most ROPE_QK_MAX_DIM features, at most 65535
/// positions (the grid's y), and q and k norm weights of one dtype.
fn rope_qk_fits(d: usize, l: usize, qk_norm: Option<(&Array, &Array, f32)>) -> bool {
    d <= ROPE_QK_MAX_DIM && l <= 65535 && qk_norm.is_none_or(|(qw, kw, _)| qw.dtype() == kw.dtype())
}

/// The arguments of `rope_qk` (see [`Backend::rope_qk`]).
#[derive(Clone, Copy)]
struct RopeArgs<'a> {
    q: &'a Array,
    k: &'a Array,
    qk_norm: Option<(&'a Array, &'a Array, f32)>,
    inv_freqs: &'a [f32],
    offset: usize,
    traditional: bool,
}

/// Where `rope_qk_kv_f32` writes keys and values: the values' device address, both caches'
/// (`[kv_heads, cap, head_dim]`), and the position of the first new row; or, with `paged`
/// (`rope_qk_paged_f32`), two paged stores `[positions, kv_heads * head_dim]` and the device
/// addresses of each row's position (i64) and store row (i32).
#[derive(Clone, Copy)]
struct CacheTarget {
    v: u64,
    kd: u64,
    vd: u64,
    /// The caches' dtype code (f32, f16 or bf16).
    kv_dt: i32,
    cap: usize,
    at: usize,
    paged: Option<(u64, u64)>,
}

/// The launch of a one-row norm that also writes its output's integer parts
/// (`add_rms_norm_row_f32`, `rms_norm_row_f32`; `d` a multiple of 32): blocks of norm_vthreads'
/// virtual threads run F = 1, 2 or 4 per thread (at most 512 threads where F allows: 16 warps
/// share a block's sum), and a block per 16 chunks of 32 values, so that a 4096-value row is
/// written by 8 blocks. The 8B decoded 1.8 % faster than with 256 threads and 16 blocks, 1.3 %
/// with 1024 and 4 (H200, eleventh session); F does not change the sums (norm_vthreads' layout).
pub(super) fn norm_row_cfg(d: usize) -> LaunchConfig {
    let vt = norm_vthreads(d);
    let divides = |f: &usize| vt.is_multiple_of(32 * f);
    let per_thread = [1usize, 2, 4]
        .into_iter()
        .find(|f| divides(f) && vt / f <= 512)
        .or_else(|| [4usize, 2, 1].into_iter().find(divides))
        .unwrap_or(1);
    let threads = vt / per_thread;
    let blocks = (d / 32).div_ceil(threads / 32).max(1);
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (threads as u32, 1, 1), shared_mem_bytes: 0 }
}

impl CudaBackend {
    /// `(a + (b + bias), rms_norm(that))`, `bias` one value per column (a projection's, added
    /// as `add_bias` adds it) or none.
    pub(super) fn fused_add_rms_norm(
        &self,
        a: &Array,
        b: &Array,
        bias: Option<&Array>,
        weight: &Array,
        eps: f32,
    ) -> Result<(Array, Array)> {
        let op = if bias.is_some() { "add_bias_rms_norm" } else { "add_rms_norm" };
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
        if let Some(c) = bias.filter(|c| c.len() != d) {
            return Err(Error::shape(op, format!("bias of {} for rows of {d}", c.len())));
        }
        let (bias_p, bias_dt) = self.opt_float_ptr(op, "bias", bias)?;
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
        let vec = i32::from(rows_vectorizable(d, &[sp, np, ap, bp]));
        if let Some(parts) = self.row_int_parts("norm", rows, d)? {
            let (cfg, pp) = (norm_row_cfg(d), parts.ptr());
            launch!(self.st()?, op, "add_rms_norm_row_f32", cfg; sp, np, ap, bp, bias_p, bias_dt, wp, w_dt, di, eps, vec, pp);
            normed.set_derived(Derived::IntParts, parts);
            return Ok((sum, normed));
        }
        // The rows as the batched products' bf16 input too, where one could read them so.
        let tiles = self.bf16_tiles_for(rows, d)?;
        let tp = tiles.as_ref().map_or(0, DeviceBuffer::ptr);
        let grid = u32::try_from(rows).map_err(|_| Error::Unsupported(format!("{op}: {rows} rows")))?;
        let cfg =
            LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (norm_threads(d, rows), 1, 1), shared_mem_bytes: 0 };
        launch!(self.st()?, op, "add_rms_norm_f32", cfg; sp, np, ap, bp, bias_p, bias_dt, wp, w_dt, di, eps, vec, tp);
        if let Some(tiles) = tiles {
            normed.set_derived(Derived::Bf16Tiles { k: d }, tiles);
        }
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
        let rope = RopeArgs { q, k, qk_norm, inv_freqs, offset, traditional };
        match self.rope_qk_launch(&rope, None)? {
            (qo, Some(ko)) => Ok((qo, ko)),
            (qo, None) => Err(Error::Device(format!("rope_qk: no keys came back for queries {:?}", qo.shape()))),
        }
    }

    /// `rope_qk_kv_f32`: rope_qk with the keys written into the key cache and `v` into the value
    /// cache (write_kv_rows' writes) by the same launch. Shapes or dtypes that kernel does not
    /// take run the two ops.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_rope_qk_write_kv(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        qk_norm: Option<(&Array, &Array, f32)>,
        inv_freqs: &[f32],
        offset: usize,
        traditional: bool,
        (k_cache, v_cache, cache_offset): (&mut Array, &mut Array, usize),
    ) -> Result<Array> {
        let (&[a, cap, c], &[l, hkv, d]) = (k_cache.shape(), k.shape()) else {
            return Err(Error::shape(
                "rope_qk_write_kv",
                format!(
                    "expected a [heads, capacity, D] cache and [L, heads, D] keys, got {:?} and {:?}",
                    k_cache.shape(),
                    k.shape()
                ),
            ));
        };
        let kv_dt = cache_code(k_cache, v_cache);
        // `NUVEC_ROPE_KV=0` runs rope_qk then write_kv_rows, for timing.
        let one_launch = self.st()?.knobs.rope_kv
            && [k.dtype(), v.dtype()].iter().all(|&t| t == DType::F32)
            && kv_dt.is_some()
            && k_cache.shape() == v_cache.shape()
            && v.shape() == k.shape()
            && a == hkv
            && c == d
            && cache_offset + l <= cap
            && rope_qk_fits(d, l, qk_norm);
        if !one_launch {
            let cache = (k_cache, v_cache, cache_offset);
            return crate::backend::rope_qk_write_kv_composed(
                self,
                q,
                k,
                v,
                qk_norm,
                inv_freqs,
                offset,
                traditional,
                cache,
            );
        }
        let op = "rope_qk_write_kv";
        let vp = self.f32_ptr(op, "v", v)?;
        self.ptr(op, "k cache", k_cache)?;
        self.ptr(op, "v cache", v_cache)?;
        let (kd, vd) = (k_cache.cuda_ptr_mut()?, v_cache.cuda_ptr_mut()?);
        let kv_dt = kv_dt.expect("checked with one_launch");
        let target = CacheTarget { v: vp, kd, vd, kv_dt, cap, at: cache_offset, paged: None };
        let rope = RopeArgs { q, k, qk_norm, inv_freqs, offset, traditional };
        let (qo, _) = self.rope_qk_launch(&rope, Some(target))?;
        guard!(self.st()?, |at| cache_offset + at.delta + l <= cap);
        Ok(qo)
    }

    /// [`crate::Backend::rope_qk_write_paged`]: `rope_qk_paged_f32`, one launch for every row
    /// (shapes or dtypes it does not take run the rows one by one).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_rope_qk_write_paged(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        qk_norm: Option<(&Array, &Array, f32)>,
        inv_freqs: &[f32],
        traditional: bool,
        (positions, slots): (&[usize], &[usize]),
        (ks, vs): (&mut Array, &mut Array),
    ) -> Result<Array> {
        let op = "rope_qk_write_paged";
        let (n, _, _, d, rows) = crate::backend::check_rope_paged(q, k, v, (positions, slots), (ks, vs))?;
        let kv_dt = cache_code(ks, vs);
        let f32s = [k.dtype(), v.dtype()].iter().all(|&t| t == DType::F32);
        let one_launch = self.st()?.knobs.rope_kv;
        let Some(kv_dt) = kv_dt.filter(|_| one_launch && f32s && rope_qk_fits(d, n, qk_norm)) else {
            let rows = (positions, slots);
            return crate::backend::rope_qk_write_paged_composed(
                self,
                q,
                k,
                v,
                qk_norm,
                inv_freqs,
                traditional,
                rows,
                (ks, vs),
            );
        };
        // Positions and slots per row: a grid no graph replay patches.
        self.st()?.not_capturing("the rope and cache writes of several paged sequences")?;
        let positions = positions.iter().map(|&p| p as i64).collect::<Vec<i64>>();
        let slots = slots.iter().map(|&s| to_i32(op, "store row", s)).collect::<Result<Vec<i32>>>()?;
        let (positions, slots) = (self.upload_shared(&positions)?, self.upload_shared(&slots)?);
        let vp = self.f32_ptr(op, "v", v)?;
        self.ptr(op, "k store", ks)?;
        self.ptr(op, "v store", vs)?;
        let (kd, vd) = (ks.cuda_ptr_mut()?, vs.cuda_ptr_mut()?);
        let paged = Some((positions.ptr(), slots.ptr()));
        let target = CacheTarget { v: vp, kd, vd, kv_dt, cap: rows, at: 0, paged };
        let rope = RopeArgs { q, k, qk_norm, inv_freqs, offset: 0, traditional };
        let (qo, _) = self.rope_qk_launch(&rope, Some(target))?;
        Ok(qo)
    }

    /// rope_qk_f32, or rope_qk_kv_f32 when `cache` is given (the keys then go into it, and no
    /// key output is made).
    fn rope_qk_launch(&self, r: &RopeArgs, cache: Option<CacheTarget>) -> Result<(Array, Option<Array>)> {
        let op = if cache.is_some() { "rope_qk_write_kv" } else { "rope_qk" };
        let RopeArgs { q, k, qk_norm, inv_freqs, offset, traditional } = *r;
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
        if !rope_qk_fits(d, l, qk_norm) {
            if cache.is_some() {
                // fused_rope_qk_write_kv checks `rope_qk_fits` first.
                return Err(Error::Unsupported(format!("{op}: heads of {d} over {l} positions in one launch")));
            }
            // The separate ops (the trait's default).
            let (q, k) = match qk_norm {
                Some((qw, kw, eps)) => (self.rms_norm(q, qw, eps)?, self.rms_norm(k, kw, eps)?),
                None => (q.clone(), k.clone()),
            };
            let (qo, ko) =
                (self.rope(&q, inv_freqs, offset, traditional)?, self.rope(&k, inv_freqs, offset, traditional)?);
            return Ok((qo, Some(ko)));
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
        let ko = if cache.is_none() { Some(self.output(k.shape(), DType::F32, false)?) } else { None };
        if l == 0 || d == 0 || hq + hkv == 0 {
            return Ok((qo, ko));
        }
        let fp = self.rope_table(if inv_freqs.is_empty() { &[0f32][..] } else { inv_freqs })?;
        let qop = qo.cuda_ptr()?;
        let (halfi, hqi, hkvi, di) = (half as i32, to_i32(op, "heads", hq)?, to_i32(op, "heads", hkv)?, d as i32);
        let (offset, trad) = (offset as i64, traditional as i32);
        // A warp per head (and per value row when writing the cache), ROPE_QK_HEADS heads of one
        // position per block (which share its cos/sin table of 2 * half floats).
        let warps = hq + hkv + if cache.is_some() { hkv } else { 0 };
        let cfg = LaunchConfig {
            grid_dim: (warps.div_ceil(ROPE_QK_HEADS) as u32, l as u32, 1),
            block_dim: (32 * ROPE_QK_HEADS as u32, 1, 1),
            shared_mem_bytes: (2 * half * 4) as u32,
        };
        // CUDA graphs: while capturing, the kernel adds the step's delta to the offsets.
        let step = self.st()?.step_scalars();
        match (&ko, cache) {
            (Some(ko), _) => {
                let kop = ko.cuda_ptr()?;
                launch!(self.st()?, op, "rope_qk_f32", cfg;
                    qop, kop, qp, kp, qwp, kwp, w_dt, eps, norm, fp, halfi, hqi, hkvi, di, offset, trad, step);
            }
            (None, Some(CacheTarget { v: vp, kd, vd, kv_dt, paged: Some((pp, sp)), .. })) => {
                launch!(self.st()?, op, "rope_qk_paged_f32", cfg;
                    qop, kd, vd, qp, kp, vp, qwp, kwp, w_dt, eps, norm, fp, halfi, hqi, hkvi, di, trad, pp, sp, kv_dt);
            }
            (None, Some(t)) => {
                let (vp, kd, vd, kv_dt) = (t.v, t.kd, t.vd, t.kv_dt);
                let (capi, ati) = (to_i32(op, "capacity", t.cap)?, to_i32(op, "offset", t.at)?);
                launch!(self.st()?, op, "rope_qk_kv_f32", cfg;
                    qop, kd, vd, qp, kp, vp, qwp, kwp, w_dt, eps, norm, fp, halfi, hqi, hkvi, di, offset, trad, step,
                    capi, ati, kv_dt);
            }
            (None, None) => return Err(Error::Device(format!("{op}: neither a key output nor a cache"))),
        }
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
        let kv_dt = cache_code(k_cache, v_cache);
        let one_launch = k_cache.shape() == v_cache.shape()
            && k.shape() == v.shape()
            && kv_dt.is_some()
            && [k.dtype(), v.dtype()].iter().all(|&t| t == DType::F32);
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
        let kv_dt = kv_dt.expect("checked with one_launch");
        launch!(self.st()?, op, "write_kv_rows", cfg_1d(2 * each as usize);
            kd, vd, kp, vp, each, ai, capi, ci, offi, step, kv_dt);
        guard!(self.st()?, |at| offset + at.delta + n <= cap);
        Ok(())
    }

    /// [`crate::Backend::mask_rows`]: the mask uploaded, one launch over every row.
    pub(super) fn masked_rows(&self, x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
        let op = "mask_rows";
        let n = crate::backend::check_mask_rows(x, bits)?;
        let rows = x.dim(0);
        if rows > 65535 {
            return Err(Error::shape(op, format!("{rows} rows: at most 65535 a call")));
        }
        let xp = self.f32_ptr(op, "x", x)?;
        let mask = self.upload(bits)?;
        let out = self.output(x.shape(), DType::F32, false)?;
        let (o, mp) = (out.cuda_ptr()?, mask.ptr());
        let (ni, wordsi) = (to_i32(op, "row length", n)?, to_i32(op, "mask words", n.div_ceil(32))?);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256) as u32, rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self.st()?, op, "mask_rows_f32", cfg; o, xp, mp, ni, wordsi, fill);
        Ok(out)
    }

    pub(super) fn fused_argmax_gap(&self, x: &Array) -> Result<Array> {
        let op = "argmax_gap";
        if x.shape().is_empty() || x.dim(-1) == 0 {
            return Err(Error::shape(op, format!("rows of {:?}", x.shape())));
        }
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("checked above") = 3;
        let out = self.output(&shape, DType::U32, false)?;
        self.argmax_rows(op, x, out.cuda_ptr()?, true, None)?;
        Ok(out)
    }

    /// [`crate::Backend::masked_argmax_gap`]: the argmax kernels reading each entry through the
    /// mask, so the masked rows are never written.
    pub(super) fn fused_masked_argmax_gap(&self, x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
        let op = "masked_argmax_gap";
        crate::backend::check_mask_rows(x, bits)?;
        let mask = self.upload(bits)?;
        let out = self.output(&[x.dim(0), 3], DType::U32, false)?;
        self.argmax_rows(op, x, out.cuda_ptr()?, true, Some((&mask, fill)))?;
        Ok(out)
    }
}
