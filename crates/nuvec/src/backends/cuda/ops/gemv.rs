//! The one-row and few-row (up to 8) GEMVs over quantized weights (kernels/linear.cu): which
//! kernel shape a product takes (`qgemv4_variant`), the integer GEMVs' int8 parts of x (made by
//! `xsplit_f32`, or written by the kernel that made x: [`Derived::IntParts`]), the multi-weight
//! launch for q/k/v (with their biases) and gate/up (`fused_qgemv`), and the chunked weight
//! decoder for the f32 prefill tiles (`fast_dequant`).

use cudarc::driver::LaunchConfig;

use super::{cfg_1d, float_code, to_i32, CudaBackend, WeightArgs, DT_F32};
use crate::backends::cuda::knobs::Knobs;
use crate::backends::cuda::{Derived, DeviceBuffer, State};
use crate::{Array, DType, Error, Matrix, QuantMode, Result};

/// Output rows per block and threads per block of the fast quantized GEMV (`QG_ROWS`,
/// `QG_WARPS` in linear.cu), and the most input rows it takes (`QG_MAX_M`).
const QG_ROWS: usize = 4;
const QG_THREADS: u32 = 128;

/// The shape of the one-row 4-bit GEMV for `k` inputs and `rows` outputs (all weights of a
/// multi-weight launch together): `(kernel name suffix, output rows per block, threads per block)`.
///
/// Where `plain` (groups of 32 or more) the integer dot-product kernels
/// run: `xsplit_f32` first splits x into int8 parts, then each word of weights costs 2 masks, a
/// shift and 6 `dp4a` per row where the f32 loops issue ~24 instructions (they were bound by
/// issue: the CUDA journal, `git show 83079a1:docs/cuda.md`, eighth session). Measured on the
/// H200 (its ninth session): the 8B decoded at 427 tok/s against 347 with the f32 loops, a 1B at
/// 1308 against 1236. Long grids (LM heads, an 8B's gate/up) take 1 warp per block (`_i1`);
/// otherwise the warps per block grow from 1 while the grid holds fewer than
/// [`QG_TARGET_WARPS`] warps and every lane still gets a 32-value
/// chunk of each row (`_i1`, `_i2`, `_i4`): a [4096, 14336] down projection is only 512 blocks
/// of 8 rows. Groups of 16 take the per-word f32 loop (`_w1`, `_w2`,
/// `_w4`, `_w8`) by the same rule. `NUVEC_QGEMV_VARIANT=body|w1|w2|w4|w8|xw1|i1|i2|i4` forces one
/// shape (for timing them; see [`QGEMV4_SHAPES`]; `xw1` and the `i` shapes apply only where
/// `plain`), `NUVEC_QGEMV_INT=0` keeps the f32 loops (`_xw1` for long grids).
pub(super) fn qgemv4_variant(knobs: &Knobs, k: usize, rows: usize, plain: bool) -> (&'static str, usize, u32) {
    let forced = knobs.qgemv_variant.as_deref().and_then(|v| QGEMV4_SHAPES.iter().find(|s| s.knob_value() == v));
    let int = plain && int_gemvs(knobs);
    let suffix = match forced.filter(|s| plain || !s.plain_only) {
        Some(s) => s.suffix,
        None => {
            let (blocks, chunks) = (rows.div_ceil(8), k / 32);
            if plain && blocks >= QG_LONG_GRID {
                if int {
                    "_i1"
                } else {
                    "_xw1"
                }
            } else {
                match (grid_warps(blocks, chunks, 8, 2), int) {
                    (1, true) => "_i1",
                    (2, true) => "_i2",
                    (_, true) => "_i4",
                    (1, false) => "_w1",
                    (2, false) => "_w2",
                    (4, false) => "_w4",
                    _ => "_w8",
                }
            }
        }
    };
    let s = QGEMV4_SHAPES.iter().find(|s| s.suffix == suffix).expect("qgemv4_variant picks listed shapes only");
    (s.suffix, s.rows, s.threads)
}

/// A one-row 4-bit GEMV kernel: `qgemv1_b4{suffix}` (and `qgemv_multi_b4{suffix}`,
/// `gate_up_silu_b4{suffix}` where it has them), named by its loop (`w`: f32 per weight word,
/// `xw`: f32 with x per word, `i`: int8 dot products over x's parts) and its warps per block.
struct Qgemv4Shape {
    suffix: &'static str,
    /// Output rows per block.
    rows: usize,
    threads: u32,
    /// Only for groups of 32 and more.
    plain_only: bool,
}

impl Qgemv4Shape {
    /// Its `NUVEC_QGEMV_VARIANT` value: the suffix without its `_`, `body` for `qgemv1_b4`.
    fn knob_value(&self) -> &'static str {
        self.suffix.strip_prefix('_').unwrap_or("body")
    }
}

const fn shape(suffix: &'static str, rows: usize, threads: u32, plain_only: bool) -> Qgemv4Shape {
    Qgemv4Shape { suffix, rows, threads, plain_only }
}

/// Every one-row 4-bit GEMV shape. The first (no suffix; `body` to the knob) is `qgemv1_b4`, the
/// `qgemv_body` kernel every width has; earlier shapes that lost on the H200 are gone (the CUDA journal, `git show
/// 83079a1:docs/cuda.md`, third and fourth sessions; 4-row x-per-word shapes never picked).
const QGEMV4_SHAPES: &[Qgemv4Shape] = &[
    shape("", QG_ROWS, QG_THREADS, false),
    shape("_w1", 8, 32, false),
    shape("_w2", 8, 64, false),
    shape("_w4", 8, 128, false),
    shape("_w8", 8, 256, false),
    shape("_xw1", 8, 32, true),
    shape("_i1", 8, 32, true),
    shape("_i2", 8, 64, true),
    shape("_i4", 8, 128, true),
];

/// The one-row 8-bit integer GEMV's shape for `k` inputs and `rows` outputs (all weights of a
/// multi-weight launch together), `None` while the integer GEMVs are off: `(kernel name suffix,
/// output rows per block, threads per block)`. 4 rows per block (a row's 32-value chunk is 32
/// bytes, twice a 4-bit row's) and warps grown from 1 as [`qgemv4_variant`] grows them, while
/// every lane of a pass still has a chunk of each row (a [5120, 2880] q/k/v launch, 90 chunks a
/// row, keeps one warp: two would leave 38 of 128 lanes idle).
fn qgemv8_variant(knobs: &Knobs, k: usize, rows: usize) -> Option<(&'static str, usize, u32)> {
    if !int_gemvs(knobs) {
        return None;
    }
    Some(match grid_warps(rows.div_ceil(4), k / 32, 4, 3) {
        1 => ("_i1", 4, 32),
        2 => ("_i2", 4, 64),
        _ => ("_i4", 4, 128),
    })
}

/// Warps per block of a one-row GEMV grid of `blocks` blocks over rows of `chunks` 32-value
/// chunks: doubled from 1 (up to `max`) while the grid holds fewer than [`QG_TARGET_WARPS`]
/// warps and each warp's lanes still get `passes` chunks of a row.
fn grid_warps(blocks: usize, chunks: usize, max: usize, passes: usize) -> usize {
    let mut warps = 1;
    while warps < max && blocks * warps < QG_TARGET_WARPS && chunks >= 32 * passes * warps {
        warps *= 2;
    }
    warps
}

/// The shape of a one-row GEMV over `bits`-bit weights (`rows` outputs of all the launch's
/// weights, `k` inputs; `plain`: groups of 32 or more): the 4-bit
/// variants, the 8-bit integer ones, else `qgemv_body`'s.
fn one_row_shape(knobs: &Knobs, bits: i32, k: usize, rows: usize, plain: bool) -> (&'static str, usize, u32) {
    match bits {
        4 => qgemv4_variant(knobs, k, rows, plain),
        8 if plain => qgemv8_variant(knobs, k, rows).unwrap_or(("", QG_ROWS, QG_THREADS)),
        _ => ("", QG_ROWS, QG_THREADS),
    }
}

/// Whether the integer dot-product GEMVs are on (`NUVEC_QGEMV_INT=0` turns them off).
pub(super) fn int_gemvs(knobs: &Knobs) -> bool {
    knobs.qgemv_int
}

/// Whether `producer` ("norm": the row norms, "attention": the decode attention's merge,
/// "gate_up": the fused gate/up), which writes one-row f32 inputs of the integer GEMVs, also
/// writes the row's parts, so that no `xsplit_f32` launch is needed: while the integer GEMVs are
/// on, unless `NUVEC_PRODUCER_PARTS` is `0` (none; the separate split launches, for timing) or a
/// comma-separated list of the producers that do.
fn producer_parts(knobs: &Knobs, producer: &str) -> bool {
    int_gemvs(knobs) && knobs.producer_parts.as_ref().is_none_or(|list| list.iter().any(|p| p == producer))
}

/// Bytes of the integer GEMVs' parts of a `k`-value row (`xsplit_chunk`'s layout, with the norm
/// tail: `QI_PARTS_WORDS` in kernels/common.cuh).
pub(super) fn int_parts_bytes(k: usize) -> usize {
    ((k / 32) * (QI_WORDS + 3) + 1) * 4
}

/// Whether a one-row 4- or 8-bit variant reads x as `xsplit_f32`'s parts (integer dot products).
fn int_variant(suffix: &str) -> bool {
    matches!(suffix, "_i1" | "_i2" | "_i4")
}

/// u32 words of x's parts per 32-value chunk (`QI_WORDS` in `kernels/linear.cu`); a scale and a
/// sum follow the parts.
const QI_WORDS: usize = 24;

/// Blocks of 8 rows from which a one-row 4-bit GEMV is a long grid (LM heads, an 8B's gate/up):
/// there `_xw1` (8 rows x 1 warp, x per word, 96 registers) read fastest on the H200: the 8B's
/// LM head 110 us against 128 (`_w1`), Qwen3-0.6B's 44 against 50, a [14336, 4096] gate 17.8
/// against 19.2 (`timing_probe`, fourth session).
const QG_LONG_GRID: usize = 1536;

/// Warps a one-row 4-bit GEMV grid should hold before it adds warps per block: ~12 per SM of the
/// H200's 132 (the 128-register kernels fit 16 warps per SM). At 16 per SM an 8B's q/k/v launch
/// (768 blocks of 8 rows) took 4 warps per block, 1.45 waves of the 528 blocks an H200 holds;
/// with 2 warps (`_i2`, 1 056 resident) it is one wave, and the 8B decoded 1.5 % faster
/// (eleventh session: 451 against 444 tok/s, medians of 3); 1 024 (`_i2` for the o and down
/// projections too) was 3.5 % slower.
const QG_TARGET_WARPS: usize = 1536;

/// When the fast quantized kernels (`qgemv*`, `qdequant_b*`) can take `w`: affine-quantized with
/// a power-of-two group of at least 16, `k` a multiple of 32, the packed words aligned for the
/// width's wide loads and `wide` (the f32 side the kernel reads or writes in 16-byte units)
/// 16-byte aligned. Returns log2 of the group size.
pub(super) fn fast_path_log_group(w: &WeightArgs, k: usize, wide: u64) -> Option<i32> {
    let align = match w.bits {
        2 => 8,
        4 | 8 => 16,
        _ => 4,
    };
    let group = w.group as usize;
    let fits = w.w_dt == -1
        && k.is_multiple_of(32)
        && group.is_power_of_two()
        && group >= 16
        && w.packed.is_multiple_of(align)
        && wide.is_multiple_of(16);
    fits.then(|| group.trailing_zeros() as i32)
}

impl CudaBackend {
    /// The fast quantized GEMV (`qgemv1_bN` / `qgemv_bN`), when `w` is affine-quantized with a
    /// power-of-two group size >= 16, `k` is a multiple of 32 and the packed words are aligned
    /// for the kernel's wide loads. Returns false (nothing launched) otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fast_qgemv(
        &self,
        op: &'static str,
        out: u64,
        x: &Array,
        m: usize,
        n: usize,
        k: usize,
        w: &WeightArgs,
    ) -> Result<bool> {
        let Some(lg) = fast_path_log_group(w, k, x.cuda_addr()?) else {
            return Ok(false);
        };
        let WeightArgs { packed, scales, biases, p_dt, bits, .. } = *w;
        let (suffix, rows, threads) =
            if m == 1 { one_row_shape(&self.st()?.knobs, bits, k, n, lg > 4) } else { ("", QG_ROWS, QG_THREADS) };
        let name = format!("{}_b{bits}{suffix}", if m == 1 { "qgemv1" } else { "qgemv" });
        let (x, _parts) = self.gemv_input(op, suffix, x, k)?;
        let (mi, ni, ki) = (m as i32, to_i32(op, "rows", n)?, to_i32(op, "k", k)?);
        let blocks = to_i32(op, "blocks", n.div_ceil(rows))? as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
        launch!(self.st()?, op, name.as_str(), cfg; out, x, mi, ni, packed, scales, biases, p_dt, lg, ki);
        Ok(true)
    }

    /// The `x` argument of a one-row GEMV of variant `suffix`: for the integer variants x's parts
    /// (those its producer wrote, else `xsplit_f32`'s into a buffer that must outlive the
    /// launch), else x itself.
    pub(super) fn gemv_input(
        &self,
        op: &'static str,
        suffix: &str,
        x: &Array,
        k: usize,
    ) -> Result<(u64, Option<DeviceBuffer>)> {
        if !int_variant(suffix) {
            return Ok((x.cuda_ptr()?, None));
        }
        self.int_parts(op, x, k)
    }

    /// The integer products' parts of the `len` f32 values of `x`: those its producer wrote (a
    /// one-row norm's, possibly with its scale pending), else `xsplit_f32`'s (several rows split
    /// as one) into a buffer that must outlive the launches reading it.
    pub(super) fn int_parts(&self, op: &'static str, x: &Array, len: usize) -> Result<(u64, Option<DeviceBuffer>)> {
        if let Some(parts) = x.derived(Derived::IntParts) {
            return Ok((parts, None));
        }
        let parts = self.split_parts(op, x.cuda_ptr()?, len)?;
        Ok((parts.ptr(), Some(parts)))
    }

    /// The integer GEMVs' parts of the `len` f32 values at `xp` (`xsplit_f32`; several rows of a
    /// `len / rows`-value x split as one row: row i's chunks follow row i - 1's), in a buffer that
    /// must outlive the launches reading it.
    pub(super) fn split_parts(&self, op: &'static str, xp: u64, len: usize) -> Result<DeviceBuffer> {
        let st = self.st()?;
        let parts = DeviceBuffer::alloc(st, int_parts_bytes(len))?;
        let (pp, n) = (parts.ptr(), to_i32(op, "k", len)?);
        launch!(st, op, "xsplit_f32", cfg_1d(len); pp, xp, n);
        Ok(parts)
    }

    /// A buffer for the integer GEMVs' parts of a producer's output when it is one row of `d`
    /// values that such a GEMV could read, and `producer` writes parts (see [`producer_parts`]):
    /// the producer writes them, and the caller records the buffer on the output
    /// (`Array::set_derived`).
    pub(super) fn row_int_parts(&self, producer: &str, rows: usize, d: usize) -> Result<Option<DeviceBuffer>> {
        if rows != 1 || d == 0 || !d.is_multiple_of(32) || !producer_parts(&self.st()?.knobs, producer) {
            return Ok(None);
        }
        Ok(Some(DeviceBuffer::alloc(self.st()?, int_parts_bytes(d))?))
    }

    /// Decodes weight rows `row0..row0 + rows` of an affine-quantized `w` to f32 with the
    /// chunked kernel (`qdequant_bN`), under the fast GEMV's conditions; false if they do not hold.
    pub(super) fn fast_dequant(
        &self,
        op: &'static str,
        out: u64,
        row0: usize,
        rows: usize,
        k: usize,
        w: &WeightArgs,
    ) -> Result<bool> {
        let Some(lg) = fast_path_log_group(w, k, out) else {
            return Ok(false);
        };
        let WeightArgs { packed, scales, biases, p_dt, bits, .. } = *w;
        let name = format!("qdequant_b{bits}");
        let (row0, rowsl, ki) = (row0 as i64, rows as i64, to_i32(op, "k", k)?);
        launch!(self.st()?, op, name.as_str(), cfg_1d(rows * k / 32); out, row0, rowsl, packed, scales, biases, p_dt, lg, ki);
        Ok(true)
    }

    /// One launch of `qgemv_multi_bN` for one input row and up to three affine-quantized weights
    /// of one width, group size and scale dtype (q/k/v, gate/up). `adds`: a bias row per weight, of one float dtype,
    /// added to its outputs in the launch. `None` (nothing launched) when the case is not that.
    pub(super) fn fused_qgemv(
        &self,
        op: &'static str,
        x: &Array,
        ws: &[&Matrix],
        adds: Option<&[&Array]>,
    ) -> Result<Option<Vec<Array>>> {
        if ws.is_empty() || ws.len() > 3 || !self.plain_input(x, None) {
            return Ok(None);
        }
        // The bias rows' pointers (0: none) and their one dtype.
        let (mut add, mut add_dt) = ([0u64; 3], DT_F32);
        if let Some(adds) = adds {
            if adds.len() != ws.len() {
                return Ok(None);
            }
            for (i, (a, w)) in adds.iter().zip(ws).enumerate() {
                let dt = float_code(op, "bias", a)?;
                if a.len() != w.rows() || a.device() != self.dev() || (i > 0 && dt != add_dt) {
                    return Ok(None);
                }
                (add[i], add_dt) = (self.ptr(op, "bias", a)?, dt);
            }
        }
        let k = x.dim(-1);
        if x.len() != k
            || !k.is_multiple_of(32)
            || ws
                .iter()
                .any(|w| w.cols() != k || !matches!(w, Matrix::Quantized(q) if q.spec.mode == QuantMode::Affine))
        {
            // The floating-point modes (mxfp4, mxfp8, nvfp4) go through `linear`, which has
            // their kernels (ops/fp.rs).
            return Ok(None);
        }
        let args = ws.iter().map(|w| self.weight_args(op, w)).collect::<Result<Vec<_>>>()?;
        let a0 = &args[0];
        let group = a0.group as usize;
        let align = match a0.bits {
            2 => 8,
            4 | 8 => 16,
            _ => 4,
        };
        let same = args.iter().all(|a| a.bits == a0.bits && a.group == a0.group && a.p_dt == a0.p_dt);
        let xp = x.cuda_addr()?; // alignment only: gemv_input gives what the kernel reads
        if !same
            || !group.is_power_of_two()
            || group < 16
            || args.iter().any(|a| !a.packed.is_multiple_of(align))
            || !xp.is_multiple_of(16)
        {
            return Ok(None);
        }
        let rows: usize = ws.iter().map(|w| w.rows()).sum();
        let (suffix, rows_per_block, threads) = one_row_shape(&self.st()?.knobs, a0.bits, k, rows, group > 16);
        let mut outs = Vec::with_capacity(ws.len());
        let mut slots = [(0u64, 0i32, 0u64, 0u64, 0u64); 3];
        let mut blocks = 0usize;
        for (i, (w, a)) in ws.iter().zip(&args).enumerate() {
            let n = w.rows();
            let mut shape = x.shape().to_vec();
            *shape.last_mut().expect("x has an axis") = n;
            let out = self.output(&shape, DType::F32, false)?;
            slots[i] = (out.cuda_ptr()?, to_i32(op, "rows", n)?, a.packed, a.scales, a.biases);
            blocks += n.div_ceil(rows_per_block);
            outs.push(out);
        }
        if blocks == 0 {
            return Ok(Some(outs));
        }
        let (p_dt, lg, ki) = (a0.p_dt, group.trailing_zeros() as i32, to_i32(op, "k", k)?);
        let [(o0, n0, pk0, sc0, bi0), (o1, n1, pk1, sc1, bi1), (o2, n2, pk2, sc2, bi2)] = slots;
        let [add0, add1, add2] = add;
        let name = format!("qgemv_multi_b{}{suffix}", a0.bits);
        let (xp, _parts) = self.gemv_input(op, suffix, x, k)?;
        let cfg = LaunchConfig {
            grid_dim: (to_i32(op, "blocks", blocks)? as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self.st()?, op, name.as_str(), cfg;
            xp, p_dt, lg, ki, o0, n0, pk0, sc0, bi0, o1, n1, pk1, sc1, bi1, o2, n2, pk2, sc2, bi2,
            add0, add1, add2, add_dt);
        Ok(Some(outs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variant_knob_lists_every_shape() {
        let knob = crate::tuning::KNOBS.iter().find(|k| k.name == "NUVEC_QGEMV_VARIANT").unwrap();
        let values: Vec<&str> = super::QGEMV4_SHAPES.iter().map(|s| s.knob_value()).collect();
        assert_eq!(knob.values, values.join(", "));
    }

    #[test]
    fn one_row_shapes_follow_the_grid_rules() {
        // An 8B's q/k/v (6,144 rows of 4,096): 768 blocks of 8 rows, two warps fill the grid.
        assert_eq!(one_row_shape(&Knobs::default(), 4, 4096, 6144, true), ("_i2", 8, 64));
        // gpt-oss's q/k/v in 8 bits (5,120 rows of 2,880 = 90 chunks): two warps would leave a
        // pass of 64 lanes a third empty, so one; its o projection (2,880 rows of 4,096) takes two;
        // its LM head is a long grid of one warp a block.
        assert_eq!(one_row_shape(&Knobs::default(), 8, 2880, 5120, true), ("_i1", 4, 32));
        assert_eq!(one_row_shape(&Knobs::default(), 8, 4096, 2880, true), ("_i2", 4, 64));
        assert_eq!(one_row_shape(&Knobs::default(), 8, 2880, 201_088, true), ("_i1", 4, 32));
        // Groups of 16: the f32 body.
        assert_eq!(one_row_shape(&Knobs::default(), 8, 2880, 5120, false), ("", QG_ROWS, QG_THREADS));
        assert_eq!(one_row_shape(&Knobs::default(), 6, 4096, 4096, true), ("", QG_ROWS, QG_THREADS));
    }
}
