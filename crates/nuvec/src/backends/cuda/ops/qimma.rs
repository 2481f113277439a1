//! Products of 2 to 64 input rows (a batched decode step) over 4-bit affine weights, in integers
//! on the tensor cores (kernels/qimma.cu): x split once into the one-row integer GEMVs' int8
//! parts (`xsplit_f32` over all its rows), each packed weight read once per call, and each
//! 32-value chunk's sum exact in int32, so a row's result is its one-row result up to f32
//! rounding order. With `NUVEC_QIMMA=1` they take these rows before the bf16 forms of
//! `ops/qmma.rs` (which round x, and from 33 rows the weights); off by default: on the H200 they
//! are as fast at 8 rows and slower from 16 (docs/cuda.md).

use std::sync::OnceLock;

use cudarc::driver::LaunchConfig;

use super::qmma::{ranges_of_k, QmmaKernel};
use super::{fast_path_log_group, to_i32, CudaBackend, WeightArgs};
use crate::backends::cuda::State;
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
    let &(_, rows, threads) = KERNELS.iter().find(|k| k.0 == kernel)?;
    Some((threads, qi_stages() * (QI_ROWS * 64 + rows * QI_XROW + QI_ROWS * 32 + rows * 32)))
}

/// The kernel for `m` input rows (2 to 64): the first whose blocks take them all, else the
/// widest.
fn kernel_for(m: usize) -> (&'static str, usize, u32) {
    *KERNELS.iter().find(|k| m <= k.1).unwrap_or(&KERNELS[KERNELS.len() - 1])
}

/// Whether the integer products run: only with `NUVEC_QIMMA=1` (read once), until they are
/// faster than the bf16 forms they would replace (docs/cuda.md, "Few-row products in integers").
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("NUVEC_QIMMA").is_ok_and(|v| v == "1"))
}

impl CudaBackend {
    /// `x [.., k]` (f32, 2 to 64 rows) times each of `ws`, or with `up` silu(x) * up, through the
    /// integer kernels with x split once for all the weights they take (4-bit affine, groups of
    /// 32 and more, K a multiple of 32, on sm_80+; any other weight beside them takes `linear`);
    /// `None` (nothing done) when they take none of them or not this input.
    pub(super) fn qimma_many(
        &self,
        op: &'static str,
        x: &Array,
        ws: &[&Matrix],
        up: Option<&Array>,
    ) -> Result<Option<Vec<Array>>> {
        if !enabled() || !self.plain_input(x, up) {
            return Ok(None);
        }
        let k = x.dim(-1);
        let m = x.len() / k.max(1);
        if !(2..=QI_MAX_ROWS).contains(&m) || !k.is_multiple_of(32) || ws.is_empty() {
            return Ok(None);
        }
        let st = self.st()?;
        let kernel = kernel_for(m);
        // Read at module load on sm_80+ only (mma.sync, cp.async), as the qmma kernels.
        let Some(&launch) = st.qmma_kernels.get(kernel.0) else {
            return Ok(None);
        };
        // The weights these kernels take, with their log2 group size.
        let mut args = Vec::with_capacity(ws.len());
        for w in ws {
            let affine = matches!(w, Matrix::Quantized(q) if q.spec.mode == QuantMode::Affine && q.spec.bits == 4);
            let a = if affine && w.cols() == k { Some(self.weight_args(op, w)?) } else { None };
            args.push(a.and_then(|a| fast_path_log_group(&a, k, 0).filter(|&lg| lg >= 5).map(|lg| (a, lg))));
        }
        if args.iter().all(Option::is_none) || (up.is_some() && args.iter().any(Option::is_none)) {
            return Ok(None);
        }
        // silu(x) * up first where asked, then x's parts: m k values split as one row.
        let gated = match up {
            Some(u) => Some(Backend::silu_mul(self, x, u)?),
            None => None,
        };
        let parts = self.split_parts(op, gated.as_ref().unwrap_or(x).cuda_ptr()?, m * k)?;
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
        let st = self.st()?;
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
        let WeightArgs { packed, scales, biases, p_dt, .. } = *w;
        let (mi, ni, ki, cps) = (m as i32, to_i32(op, "rows", n)?, to_i32(op, "k", k)?, per_range as i32);
        self.in_ranges(op, o, ranges, m * n, |dst| {
            launch!(st, op, name, cfg; dst, xq, mi, ni, packed, scales, biases, p_dt, lg, ki, cps);
            Ok(())
        })
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
    }
}
