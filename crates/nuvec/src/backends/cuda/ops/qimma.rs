//! Products of 2 to 64 input rows (a batched decode step) over 4-bit affine weights on the tensor
//! cores (kernels/qimma.cu), each packed weight read once per call.
//! - The register kernels: a warp per 16 weight rows and share of K, its weights, scales and
//!   biases through a cp.async ring in shared memory, up to three weights per launch; K a
//!   multiple of 128, groups of 32 to 128. By default, where the scales are bf16 (mlx's bf16
//!   models), from 2 to 64 rows `qdec_b4_r8` .. `_r64`: each weight decoded to bf16 (s q + b, one
//!   rounding) and x rounded to bf16, f32 sums: the precision of the bf16 forms of `ops/qmma.rs`
//!   from 33 rows and of mlx-lm's bf16 activations, so only where the matmul precision allows it
//!   (`bf16`, or `auto` in a half-precision model); from 32 rows two tiles a block (`_t2`) where
//!   that still fills the GPU. x's bf16 tiles come from the kernel that made x where it wrote
//!   them (the batched norm, the paged attention merge: `bf16_tiles_for`, `Derived::Bf16Tiles`),
//!   are made with silu(x) · up for the down projection (`silu_mul_xbf16_tiles_f32`), else by
//!   `xbf16_tiles_f32`. `NUVEC_QDEC_ROWS` (16, 32) caps their rows (the qmma kernels take the
//!   rest). Measured: docs/cuda.md. Weights with f16 or f32 scales (GGUF's Q4_0, Q4_1 and
//!   K-quants) take their `s` forms (`qdec_b4_r16s` ..) from `NUVEC_QDEC_SCALED_FROM` (9) rows
//!   where the precision rounds such a weight to bf16, each weight decoded as `fmaf(s, q, b)` in
//!   f32 and rounded to bf16 (the prefill GEMM's decoding, and the qmma `s` forms' that they
//!   replace).
//! - Up to 16 rows otherwise (scales not bf16, below `NUVEC_QDEC_SCALED_FROM` rows or where the
//!   precision keeps f32), or with `NUVEC_QIMMA=int`, `qimma_b4_r8` / `_r16` in integers: x split
//!   once into the one-row integer GEMVs' int8 parts (`xsplit_tiles_f32`), each 32-value chunk's
//!   sum exact in int32, so a row's result is its one-row result up to f32 rounding order.
//! - 17 to 64 rows in integers, the shared-memory pipeline kernels (`qimma_b4_x8` .. `_x32`), only
//!   with `NUVEC_QIMMA=1`: slower than the bf16 forms there (docs/cuda.md).
//!
//! `NUVEC_QIMMA=0` turns them all off.

use std::sync::OnceLock;

use cudarc::driver::LaunchConfig;

use super::qmma::{ranges_of_k, QmmaKernel};
use super::{fast_path_log_group, to_i32, CudaBackend, WeightArgs, DT_BF16};
use crate::backends::cuda::knobs::Knobs;
use crate::backends::cuda::{Derived, DeviceBuffer, State};
use crate::{Array, Backend, DType, Error, Matrix, QuantMode, Result};

/// The most input rows these products take (above, cuBLAS over weights decoded to bf16 reads
/// them once where these would read them once per 32 rows).
pub(super) const QI_MAX_ROWS: usize = 64;
/// Weight rows per block (`QI_ROWS`) and values of K per chunk (`QI_CHUNK`).
const QI_ROWS: usize = 128;
const QI_CHUNK: usize = 128;
/// Bytes of an input row's parts of one chunk in shared memory (`QI_XROW`, padded).
const QI_XROW: usize = 416;

/// Pipeline slots of the kernels (`QI_STAGES`): 3, or what `NUVEC_NVRTC_DEFINES` sets it to (an
/// experiment knob: the kernels are compiled with the same definition).
fn qi_stages() -> usize {
    static STAGES: OnceLock<usize> = OnceLock::new();
    *STAGES.get_or_init(|| {
        super::super::nvrtc_define("QI_STAGES").and_then(|v| v.parse().ok()).filter(|&s| s >= 2).unwrap_or(3)
    })
}

/// The kernels: name, input rows per block (more rows take more blocks) and threads per block
/// (4 warps of two 16-row tiles for 8 and 16 input rows, 8 warps of one tile for 32).
const KERNELS: [(&str, usize, u32); 3] =
    [("qimma_b4_x8", 8, 128), ("qimma_b4_x16", 16, 128), ("qimma_b4_x32", 32, 256)];

/// Threads per block and dynamic shared memory of qimma kernel `kernel` (`QI_SLOT` in
/// kernels/qimma.cu times its slots: per chunk its weight rows' 64 bytes, its input rows' parts,
/// and both's scales and biases or sums), `None` for any other kernel.
pub(in crate::backends::cuda) fn qimma_launch(kernel: &str) -> Option<(u32, usize)> {
    if REG_KERNELS.iter().any(|k| k.0 == kernel) {
        return Some((QIR_THREADS, qir_smem(0)));
    }
    if DEC_KERNELS.iter().any(|k| k.0 == kernel) || DEC_WIDE.iter().any(|k| k.0 == kernel) {
        return Some((QIR_THREADS, qir_smem(2)));
    }
    if let Some(&(_, rows)) = WG_KERNELS.iter().find(|k| k.0 == kernel) {
        return Some((QIR_THREADS, qwg_smem(rows)));
    }
    if DEC_SCALED.iter().any(|k| k.1 == kernel) {
        // f32 scales' rings are the widest.
        return Some((QIR_THREADS, qir_smem(0)));
    }
    let &(_, rows, threads) = KERNELS.iter().find(|k| k.0 == kernel)?;
    Some((threads, qi_stages() * (QI_ROWS * 64 + rows * QI_XROW + QI_ROWS * 32 + rows * 32)))
}

/// The kernel for `m` input rows (2 to 64): the first whose blocks take them all, else the
/// widest.
fn kernel_for(m: usize) -> (&'static str, usize, u32) {
    *KERNELS.iter().find(|k| m <= k.1).unwrap_or(&KERNELS[KERNELS.len() - 1])
}

/// The register kernels (up to 16 input rows): name and input rows per block.
const REG_KERNELS: [(&str, usize); 2] = [("qimma_b4_r8", 8), ("qimma_b4_r16", 16)];
/// Their form with the weights decoded to bf16 and x in bf16 (bf16 scales; the default there).
const DEC_KERNELS: [(&str, usize); 4] =
    [("qdec_b4_r8", 8), ("qdec_b4_r16", 16), ("qdec_b4_r32", 32), ("qdec_b4_r64", 64)];
/// Threads per block of the register kernels (`QIR_WARPS` warps).
const QIR_THREADS: u32 = 256;
const QIR_WARPS: usize = 8;
/// Weight rows per block of the register kernels (one mma tile).
const QIR_TILE: usize = 16;

/// Slots of each warp's cp.async ring in the register kernels (`QIR_RING` in kernels/qimma.cu: 3,
/// or what `NUVEC_NVRTC_DEFINES` sets it to, an experiment knob the kernels are compiled with).
fn qir_ring() -> usize {
    static RING: OnceLock<usize> = OnceLock::new();
    *RING.get_or_init(|| {
        super::super::nvrtc_define("QIR_RING").and_then(|v| v.parse().ok()).filter(|&s| s >= 2).unwrap_or(3)
    })
}

/// Dynamic shared memory of a register-kernel launch whose scales have dtype code `p_dt` (0 f32,
/// 1 f16, 2 bf16; `QirRing` in kernels/qimma.cu): per warp, ring slots of a batch's 16 weight
/// rows (80 bytes each) and 32 parameter streams (16 bytes each for f32 scales, 8 for 16-bit).
fn qir_smem(p_dt: i32) -> usize {
    let stream = if p_dt == 0 { 16 } else { 8 };
    QIR_WARPS * qir_ring() * (QIR_TILE * 80 + 32 * stream)
}

/// Which few-row products run (`NUVEC_QIMMA`, read once): unset, the register kernels with the
/// weights and x in bf16 (`qdec_b4_r*`, 2 to `NUVEC_QDEC_ROWS` input rows) where every scale taken
/// is bf16 or (from `NUVEC_QDEC_SCALED_FROM` rows) f16 / f32 under a bf16 precision, in integers
/// (`qimma_b4_r*`, 2 to 16 rows) otherwise; `int` the integer register
/// kernels only (x at f32 accuracy, as one row alone); `1` those and the integer shared-memory
/// ones for 17 to 64 rows, which are slower than the bf16 forms they would replace (measured in
/// the CUDA journal, `git show 83079a1:docs/cuda.md`, "Few-row products in integers"); `0` none.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Off,
    Registers,
    All,
    Decoded,
}

/// The bf16 register kernels with several weight tiles per block: name, input rows, tiles.
const DEC_WIDE: [(&str, usize, usize); 2] = [("qdec_b4_r32_t2", 32, 2), ("qdec_b4_r64_t2", 64, 2)];
/// Each bf16 register kernel (bf16 scales) beside its form for f16 and f32 scales (the same
/// body, compiled apart so that the bf16 forms keep their registers).
const DEC_SCALED: [(&str, &str); 6] = [
    ("qdec_b4_r8", "qdec_b4_r8s"),
    ("qdec_b4_r16", "qdec_b4_r16s"),
    ("qdec_b4_r32", "qdec_b4_r32s"),
    ("qdec_b4_r64", "qdec_b4_r64s"),
    ("qdec_b4_r32_t2", "qdec_b4_r32s_t2"),
    ("qdec_b4_r64_t2", "qdec_b4_r64s_t2"),
];

/// The form of register kernel `name` (`rows` input rows per block) to launch for a product of
/// `blocks(t)` blocks of `t` weight tiles: the most tiles per block (up to `NUVEC_QDEC_TPB`) that
/// still fill every multiprocessor's slots once, else `name` itself (one tile). Only the bf16
/// kernels of 32 and 64 rows have wide forms, so the rows pick them.
fn wide_form(st: &State, name: &'static str, rows: usize, blocks: &dyn Fn(usize) -> usize) -> (&'static str, usize) {
    let fits = |&&(wide, r, tpb): &&(&'static str, usize, usize)| {
        r == rows && tpb <= st.knobs.qdec_tpb && st.qmma_kernels.get(wide).is_some_and(|k| blocks(tpb) >= k.slots)
    };
    DEC_WIDE.iter().filter(fits).max_by_key(|w| w.2).map_or((name, 1), |&(wide, _, tpb)| (wide, tpb))
}

/// The warpgroup forms of the 32- and 64-row bf16 kernels (bf16 scales; qwg_body in
/// kernels/qimma.cu): loaded only where the module was compiled for sm_90a (`wgmma_arch`).
const WG_KERNELS: [(&str, usize); 2] = [("qwg_b4_r32", 32), ("qwg_b4_r64", 64)];
/// Weight tiles per block of the warpgroup kernels (two warpgroups of four).
const QWG_TILES: usize = 8;

/// Dynamic shared memory of warpgroup kernel `rows` (32 or 64): the x ring (1024-aligned within
/// 1 KiB of slack; per slot two blocks of 64 values of K, 128 bytes a row) and the warps' weight
/// rings of the bf16 register kernels.
fn qwg_smem(rows: usize) -> usize {
    1024 + qir_ring() * 2 * rows * 128 + qir_smem(2)
}

/// Whether the module of architecture `major.minor` is compiled for sm_90a, where the warpgroup
/// kernels run (wgmma is not in later architectures' PTX).
pub(in crate::backends::cuda) fn wgmma_arch(major: i32, minor: i32) -> bool {
    (major, minor) == (9, 0)
}

/// Whether `kernel` is a warpgroup kernel (only loaded for use where `wgmma_arch`).
pub(in crate::backends::cuda) fn needs_wgmma(kernel: &str) -> bool {
    WG_KERNELS.iter().any(|k| k.0 == kernel)
}

/// Whether a run of `blocks` blocks of 8 weight tiles, K cut into `ranges`, takes the warpgroup
/// kernel with `slots` resident blocks (`NUVEC_QDEC_WGMMA`): unset, where the blocks
/// fill at least half the slots with K whole (an 8B's gate/up); `1` always, K in ranges where
/// needed (the partial slices' sums and x's restaging then cost about what the smaller
/// products gain at 64 rows, more at 32: docs/cuda.md); `0` never.
fn qwg_takes(knobs: &Knobs, blocks: usize, ranges: usize, slots: usize) -> bool {
    knobs.qdec_wgmma.unwrap_or(ranges == 1 && 2 * blocks >= slots)
}

/// Whether the device's matmul precision lets a batched product round x and bf16-scaled weights
/// to bf16 (as the prefill GEMM does: `Bf16`, or `Auto` in a half-precision model), else the
/// integer kernels keep f32 accuracy (`NUVEC_CUDA_MATMUL=f32`).
fn bf16_products(st: &State) -> bool {
    st.matmul_precision().bf16_weight(-1, DT_BF16, crate::compute_dtype_hint())
}

/// Whether a product of `m` rows of `k` takes the bf16 register kernels whatever its weights
/// (theirs must still be 4-bit, with bf16 scales or as `qimma_many` allows others): the default
/// mode, the precision allowing bf16, 2 to `NUVEC_QDEC_ROWS` rows, K a multiple of 128 (a batch
/// of the kernels).
fn bf16_rows(st: &State, m: usize, k: usize) -> bool {
    st.knobs.qimma == Mode::Decoded
        && (2..=st.knobs.qdec_rows.min(QI_MAX_ROWS)).contains(&m)
        && k.is_multiple_of(128)
        && bf16_products(st)
}

/// Room for `m` rows of `k` values as bf16 tiles (whole tiles of 8 rows).
fn bf16_tiles_buffer(st: &'static State, m: usize, k: usize) -> Result<DeviceBuffer> {
    DeviceBuffer::alloc(st, m.div_ceil(8) * 8 * k * 2)
}

impl CudaBackend {
    /// `x [.., k]` (f32, 2 to 64 rows) times each of `ws`, or with `up` silu(x) * up, through the
    /// integer kernels with x split once for all the weights they take (4-bit affine, groups of
    /// 32 and more, K a multiple of 32, on sm_80+; for the register kernels groups of at most 128,
    /// K a multiple of 128 and 16-byte aligned buffers; any other weight beside them takes `linear`);
    /// `None` (nothing done) when they take none of them or not this input.
    pub(super) fn qimma_many(
        &self,
        op: &'static str,
        x: &Array,
        ws: &[&Matrix],
        up: Option<&Array>,
    ) -> Result<Option<Vec<Array>>> {
        let mode = self.st()?.knobs.qimma;
        if mode == Mode::Off || !self.plain_input(x, up) {
            return Ok(None);
        }
        let k = x.dim(-1);
        let m = x.len() / k.max(1);
        if !(2..=QI_MAX_ROWS).contains(&m) || !k.is_multiple_of(32) || ws.is_empty() {
            return Ok(None);
        }
        // The register kernels load a batch of 128 values' weights, scales and biases at once;
        // their bf16 form may take more rows (`NUVEC_QDEC_ROWS`) where every scale is bf16.
        let batches = k.is_multiple_of(128);
        let reg = REG_KERNELS.iter().find(|r| m <= r.1 && batches).copied();
        let dec = if bf16_rows(self.st()?, m, k) { DEC_KERNELS.iter().find(|r| m <= r.1).copied() } else { None };
        let regs = reg.or(dec);
        if regs.is_none() && mode != Mode::All {
            return Ok(None);
        }
        let st = self.st()?;
        let kernel = kernel_for(m);
        // Read at module load on sm_80+ only (mma.sync, cp.async), as the qmma kernels.
        let Some(&launch) = st.qmma_kernels.get(regs.map_or(kernel.0, |r| r.0)) else {
            return Ok(None);
        };
        // The weights these kernels take, with their log2 group size.
        let mut args = Vec::with_capacity(ws.len());
        for w in ws {
            let affine = matches!(w, Matrix::Quantized(q) if q.spec.mode == QuantMode::Affine && q.spec.bits == 4);
            let a = if affine && w.cols() == k { Some(self.weight_args(op, w)?) } else { None };
            // The register kernels take groups of 32 to 128 values, and their 16-byte loads want
            // aligned weights, scales and biases.
            let max_lg = if regs.is_some() { 7 } else { i32::MAX };
            let aligned = |a: &WeightArgs| regs.is_none() || [a.packed, a.scales, a.biases].iter().all(|p| p % 16 == 0);
            args.push(a.and_then(|a| {
                fast_path_log_group(&a, k, 0).filter(|lg| (5..=max_lg).contains(lg) && aligned(&a)).map(|lg| (a, lg))
            }));
        }
        if args.iter().all(Option::is_none) || (up.is_some() && args.iter().any(Option::is_none)) {
            return Ok(None);
        }
        // The bf16 register kernels take bf16 scales, and from `NUVEC_QDEC_SCALED_FROM` rows f16 and f32
        // ones where the precision rounds such a weight to bf16 (the prefill GEMM's arithmetic).
        let precision = self.st()?.matmul_precision();
        let scaled = m >= self.st()?.knobs.qdec_scaled_from;
        let decodable = |a: &Option<(WeightArgs, i32)>| {
            a.as_ref().is_none_or(|(a, _)| {
                a.p_dt == DT_BF16 || (scaled && precision.bf16_weight(-1, a.p_dt, crate::compute_dtype_hint()))
            })
        };
        if let Some(dec) = dec.filter(|_| args.iter().all(decodable)) {
            // x in bf16 tiles: as the kernel that wrote x wrote them, else converted here.
            let converted;
            let xp = match x.derived(Derived::Bf16Tiles { k }).filter(|_| up.is_none()) {
                Some(made) => made,
                None => {
                    converted = self.bf16_tiles_of(op, x, up, (m, k))?;
                    converted.ptr()
                }
            };
            return self.qimma_reg(op, dec, x, xp, ws, &args, (m, k)).map(Some);
        }
        // silu(x) * up first where asked, then x's parts: m k values split as one row.
        let gated = match up {
            Some(u) => Some(Backend::silu_mul(self, x, u)?),
            None => None,
        };
        let xin = gated.as_ref().unwrap_or(x).cuda_ptr()?;
        if let Some(reg) = reg {
            let parts = self.split_tiles(op, xin, m, k)?;
            return self.qimma_reg(op, reg, x, parts.ptr(), ws, &args, (m, k)).map(Some);
        }
        if mode != Mode::All {
            // More rows than the integer register kernels take, and a scale not bf16.
            return Ok(None);
        }
        let parts = self.split_parts(op, xin, m * k)?;
        let pp = parts.ptr();
        let mut outs = Vec::with_capacity(ws.len());
        for (w, arg) in ws.iter().zip(&args) {
            // A weight of another kind beside them (q/k/v of mixed widths) takes its own path,
            // so that these keep their accuracy whatever is beside them.
            let Some((a, lg)) = arg else {
                outs.push(Backend::linear(self, x, w)?);
                continue;
            };
            let n = w.rows();
            let mut shape = x.shape().to_vec();
            *shape.last_mut().expect("x has an axis") = n;
            let out = self.output(&shape, DType::F32, false)?;
            if n > 0 {
                self.qimma(op, kernel, launch, out.cuda_ptr()?, pp, (m, n, k), a, *lg)?;
            }
            outs.push(out);
        }
        Ok(Some(outs))
    }

    /// A buffer for the bf16 register products' input (`qdec_tile_at`, kernels/common.cuh) when
    /// a product of `rows` input rows of `k` could take its weights through them (the default
    /// mode, 2 to `NUVEC_QDEC_ROWS` rows, K a multiple of 128, sm_80+), so that the kernel
    /// making such an input writes it too and the product converts nothing (the caller records
    /// it on the output: `Array::set_derived` with `Derived::Bf16Tiles`).
    pub(super) fn bf16_tiles_for(&self, rows: usize, k: usize) -> Result<Option<DeviceBuffer>> {
        let st = self.st()?;
        let takes = bf16_rows(st, rows, k) && st.qmma_kernels.contains_key(DEC_KERNELS[0].0);
        takes.then(|| bf16_tiles_buffer(st, rows, k)).transpose()
    }

    /// x (`m` rows of `k`) in bf16 tiles, or silu(x) * up where `up` is given
    /// (`xbf16_tiles_f32`, `silu_mul_xbf16_tiles_f32`), in a buffer that must outlive the
    /// launches reading it.
    fn bf16_tiles_of(
        &self,
        op: &'static str,
        x: &Array,
        up: Option<&Array>,
        (m, k): (usize, usize),
    ) -> Result<DeviceBuffer> {
        let st = self.st()?;
        let tiles = bf16_tiles_buffer(st, m, k)?;
        let (tp, xp, mi, ki) = (tiles.ptr(), x.cuda_ptr()?, to_i32(op, "rows", m)?, to_i32(op, "k", k)?);
        let cfg = super::cfg_1d(tiles.len() / 16);
        if let Some(u) = up {
            let upp = u.cuda_ptr()?;
            launch!(st, op, "silu_mul_xbf16_tiles_f32", cfg; tp, xp, upp, mi, ki);
        } else {
            launch!(st, op, "xbf16_tiles_f32", cfg; tp, xp, mi, ki);
        }
        Ok(tiles)
    }

    /// The products of up to three weights (`slot`: output, rows, packed, scales, biases) through
    /// warpgroup kernel `(name, input rows, smem)` in `wblocks` blocks of 8 tiles times `ranges`
    /// ranges of K:
    /// x's tiles at `xb` restaged once, and with several ranges each output's partial slices
    /// added by `qmma_reduce`.
    #[allow(clippy::too_many_arguments)]
    fn qwg(
        &self,
        op: &'static str,
        (name, rows, smem): (&'static str, usize, usize),
        xb: u64,
        (m, k): (usize, usize),
        (wblocks, ranges): (usize, usize),
        mut slot: [(u64, i32, u64, u64, u64); 3],
        lg: i32,
    ) -> Result<()> {
        let st = self.st()?;
        let xw = self.xwg_of(op, xb, (m, k), rows)?;
        let mut parts = Vec::new();
        if ranges > 1 {
            for s in slot.iter_mut().filter(|s| s.1 > 0) {
                let part = DeviceBuffer::alloc(st, ranges * m * s.1 as usize * 4)?;
                let out = std::mem::replace(&mut s.0, part.ptr());
                parts.push((out, part, m * s.1 as usize));
            }
        }
        let cfg = LaunchConfig {
            grid_dim: (to_i32(op, "blocks", wblocks)? as u32, ranges as u32, 1),
            block_dim: (QIR_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (xw, mi, ki, p_dt) = (xw.ptr(), m as i32, to_i32(op, "k", k)?, DT_BF16);
        let [(o0, n0, pk0, sc0, bi0), (o1, n1, pk1, sc1, bi1), (o2, n2, pk2, sc2, bi2)] = slot;
        launch!(st, op, name, cfg; xw, mi, p_dt, lg, ki, o0, n0, pk0, sc0, bi0, o1, n1, pk1, sc1, bi1, o2, n2, pk2, sc2, bi2);
        for (o, part, mn) in parts {
            let (pp, splits, n) = (part.ptr(), ranges as i32, mn as u64);
            launch!(st, op, "qmma_reduce", super::cfg_1d(mn); o, pp, splits, n);
        }
        Ok(())
    }

    /// x's bf16 tiles (at `xb`, `m` rows of `k`) in the warpgroup kernels' layout for `rows` (32
    /// or 64) rows (`xwg_from_tiles`; rows past `m` zero), in a buffer that must outlive the
    /// launches reading it.
    fn xwg_of(&self, op: &'static str, xb: u64, (m, k): (usize, usize), rows: usize) -> Result<DeviceBuffer> {
        let st = self.st()?;
        let xw = DeviceBuffer::alloc(st, rows * k * 2)?;
        let (wp, mi, ki, ri) = (xw.ptr(), to_i32(op, "rows", m)?, to_i32(op, "k", k)?, rows as i32);
        launch!(st, op, "xwg_from_tiles", super::cfg_1d(rows * k / 8); wp, xb, mi, ki, ri);
        Ok(xw)
    }

    /// x's parts (`m` rows of `k` at `xp`) in the register kernels' layout (`xsplit_tiles_f32`:
    /// whole tiles of 8 rows, the rows past `m` zero).
    fn split_tiles(&self, op: &'static str, xp: u64, m: usize, k: usize) -> Result<DeviceBuffer> {
        let st = self.st()?;
        let (tiles, chunks) = (m.div_ceil(8), k / 32);
        let parts = DeviceBuffer::alloc(st, tiles * chunks * (192 + 16) * 4)?;
        let (pp, mi, ki) = (parts.ptr(), to_i32(op, "rows", m)?, to_i32(op, "k", k)?);
        launch!(st, op, "xsplit_tiles_f32", super::cfg_1d(tiles * 8 * k); pp, xp, mi, ki);
        Ok(parts)
    }

    /// Each of `ws` times x (its parts at `xq`, `m` rows of `k`) through register kernel `(name,
    /// input rows per block)`: the weights `args` takes (with their log2 group size) in launches
    /// of up to three that share a scale type and group size, any other through `linear`.
    #[allow(clippy::too_many_arguments)]
    fn qimma_reg(
        &self,
        op: &'static str,
        (name, rows): (&'static str, usize),
        x: &Array,
        xq: u64,
        ws: &[&Matrix],
        args: &[Option<(WeightArgs, i32)>],
        (m, k): (usize, usize),
    ) -> Result<Vec<Array>> {
        let st = self.st()?;
        let mut outs = Vec::with_capacity(ws.len());
        for (w, arg) in ws.iter().zip(args) {
            outs.push(match arg {
                Some(_) => {
                    let mut shape = x.shape().to_vec();
                    *shape.last_mut().expect("x has an axis") = w.rows();
                    self.output(&shape, DType::F32, false)?
                }
                None => Backend::linear(self, x, w)?,
            });
        }
        // One launch per run of up to three taken weights of one scale type and group size.
        let taken: Vec<(usize, &(WeightArgs, i32))> =
            args.iter().enumerate().filter_map(|(i, a)| a.as_ref().map(|a| (i, a))).collect();
        let runs = taken.chunk_by(|(_, (a, la)), (_, (b, lb))| a.p_dt == b.p_dt && la == lb);
        for group in runs.flat_map(|run| run.chunks(3)) {
            let (a0, lg) = group[0].1;
            let mut slot = [(0u64, 0i32, 0u64, 0u64, 0u64); 3];
            for (s, &(i, (a, _))) in slot.iter_mut().zip(group) {
                let n = ws[i].rows();
                *s = (outs[i].cuda_ptr()?, to_i32(op, "rows", n)?, a.packed, a.scales, a.biases);
            }
            // Blocks of `tpb` weight tiles, each weight's first at a whole block.
            let blocks = |tpb: usize| group.iter().map(|&(i, _)| ws[i].rows().div_ceil(QIR_TILE * tpb)).sum::<usize>();
            if blocks(1) == 0 {
                continue;
            }
            // The warpgroup form where it is loaded (bf16 scales), K cut into ranges of batches as
            // the qmma kernels cut it where its blocks alone would not fill the GPU.
            let wg = WG_KERNELS.iter().find(|w| w.1 == rows && a0.p_dt == DT_BF16);
            if let Some((wname, wk)) = wg.and_then(|w| st.qmma_kernels.get(w.0).map(|k| (w.0, k))) {
                let wblocks = blocks(QWG_TILES);
                let (_, ranges) = ranges_of_k(k / 128, wblocks, wk.slots, qir_ring());
                if qwg_takes(&st.knobs, wblocks, ranges, wk.slots) {
                    self.qwg(op, (wname, rows, wk.smem), xq, (m, k), (wblocks, ranges), slot, *lg)?;
                    continue;
                }
            }
            let (name, tpb) = wide_form(st, name, rows, &blocks);
            // A bf16 register kernel's form for the run's f16 or f32 scales.
            let name = match DEC_SCALED.iter().find(|k| k.0 == name) {
                Some(&(_, scaled)) if a0.p_dt != DT_BF16 => scaled,
                _ => name,
            };
            let cfg = LaunchConfig {
                grid_dim: (to_i32(op, "blocks", blocks(tpb))? as u32, m.div_ceil(8).div_ceil(rows / 8) as u32, 1),
                block_dim: (QIR_THREADS, 1, 1),
                shared_mem_bytes: qir_smem(a0.p_dt) as u32,
            };
            let (mi, ki, p_dt, lgi) = (m as i32, to_i32(op, "k", k)?, a0.p_dt, *lg);
            let [(o0, n0, pk0, sc0, bi0), (o1, n1, pk1, sc1, bi1), (o2, n2, pk2, sc2, bi2)] = slot;
            launch!(st, op, name, cfg; xq, mi, p_dt, lgi, ki, o0, n0, pk0, sc0, bi0, o1, n1, pk1, sc1, bi1, o2, n2, pk2, sc2, bi2);
        }
        Ok(outs)
    }

    /// `out [m, n]` at `o` = x (its parts at `xq`) times `w`^T with kernel `(name, rows per
    /// block, threads)`, K cut into ranges as the bf16 forms cut it (by N, K, the kernel and the
    /// device only).
    #[allow(clippy::too_many_arguments)]
    fn qimma(
        &self,
        op: &'static str,
        (name, rows, threads): (&'static str, usize, u32),
        QmmaKernel { slots, smem }: QmmaKernel,
        o: u64,
        xq: u64,
        (m, n, k): (usize, usize, usize),
        w: &WeightArgs,
        lg: i32,
    ) -> Result<()> {
        let chunks = k.div_ceil(QI_CHUNK);
        let blocks = n.div_ceil(QI_ROWS);
        // A block runs its chunks with the next one's loads in flight: one chunk to fill. The
        // ranges count the column blocks of one block of input rows, so that they do not depend
        // on M.
        let (per_range, ranges) = ranges_of_k(chunks, blocks, slots, 2);
        let cfg = LaunchConfig {
            grid_dim: (to_i32(op, "blocks", blocks * m.div_ceil(rows))? as u32, ranges as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        self.launch_ranged(op, name, cfg, o, xq, (m, n, k), w, lg, (per_range, ranges))
    }
}

#[cfg(test)]
mod tests {
    use super::{kernel_for, qimma_launch};

    #[test]
    fn every_row_count_has_a_kernel_the_loader_knows() {
        // 2 to 64 rows: the kernel's blocks take 8, 16 or 32 input rows (more: more blocks), and
        // the module loader reads each one's threads and shared memory by its name.
        for m in 2..=super::QI_MAX_ROWS {
            let (name, rows, threads) = kernel_for(m);
            assert!(m <= rows || rows == 32, "{m} rows: {name}");
            assert_eq!(name, format!("qimma_b4_x{rows}"));
            // Three slots of the 32-row form fit an H100/H200 multiprocessor's 227 KiB twice.
            let (t, smem) = qimma_launch(name).unwrap();
            assert_eq!(t, threads);
            assert!(smem <= 113 * 1024, "{name}: {smem} bytes");
        }
        assert_eq!(kernel_for(9).0, "qimma_b4_x16");
        assert_eq!(qimma_launch("qmma_b4_m16"), None);
        // The register kernels: 8 warps, their rings (f32 scales: the most), 8 and 16 input rows
        // per block.
        for (name, rows) in super::REG_KERNELS {
            assert_eq!(qimma_launch(name), Some((256, super::qir_smem(0))), "{name}");
            assert!(super::qir_smem(0) <= 113 * 1024 && super::qir_smem(2) <= super::qir_smem(0));
            assert_eq!(name, format!("qimma_b4_r{rows}"));
        }
        // Their bf16 form: the same ring (bf16 scales); the sums of every warp's rows of the
        // block (4 floats per lane and 8-row tile) reuse it at the end.
        for (name, rows) in super::DEC_KERNELS {
            assert_eq!(qimma_launch(name), Some((256, super::qir_smem(2))), "{name}");
            assert!(super::QIR_WARPS * rows / 8 * 4 * 32 * 4 <= super::qir_smem(2), "{name}");
            assert_eq!(name, format!("qdec_b4_r{rows}"));
        }
        // Its forms for f16 and f32 scales: one for each, named after it, with the widest ring.
        let bf16_forms: Vec<&str> =
            super::DEC_KERNELS.iter().map(|k| k.0).chain(super::DEC_WIDE.iter().map(|k| k.0)).collect();
        assert_eq!(super::DEC_SCALED.map(|k| k.0).to_vec(), bf16_forms);
        for (name, scaled) in super::DEC_SCALED {
            assert_eq!(qimma_launch(scaled), Some((256, super::qir_smem(0))), "{scaled}");
            // qdec_b4_rN[_tT] -> qdec_b4_rNs[_tT]: the bf16 name holds no `s`.
            assert!(!name.contains('s') && scaled.replacen('s', "", 1) == name, "{name}: {scaled}");
        }
        // The warpgroup forms: their x ring beside the weights' rings, two blocks per multiprocessor.
        for (name, rows) in super::WG_KERNELS {
            let smem = super::qwg_smem(rows);
            assert_eq!(qimma_launch(name), Some((256, smem)), "{name}");
            assert!(smem <= 113 * 1024 && smem >= super::qir_smem(2) + 1024 + 3 * 2 * rows * 128, "{name}: {smem}");
            assert_eq!(name, format!("qwg_b4_r{rows}"));
        }
        for (name, rows, tpb) in super::DEC_WIDE {
            assert_eq!(qimma_launch(name), Some((256, super::qir_smem(2))), "{name}");
            assert!(super::QIR_WARPS * rows / 8 * 4 * 32 * 4 <= super::qir_smem(2), "{name}");
            assert_eq!(name, format!("qdec_b4_r{rows}_t{tpb}"));
        }
    }
}
