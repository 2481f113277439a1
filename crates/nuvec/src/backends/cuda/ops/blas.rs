//! The f32 matrix products on cuBLAS: weight products by SGEMM (or TF32 GEMM under
//! `NUVEC_CUDA_MATMUL=tf32`), and the raw SGEMM the prefill attention runs per head.

use cudarc::cublas::sys::cublasOperation_t;

use super::prefill::MatmulPrecision;
use super::{to_i32, CudaBackend};
use crate::backends::cuda::State;
use crate::{Error, Result};

/// Whether the SGEMM weight products run on the tensor cores in TF32 (inputs rounded to 10-bit
/// mantissas, f32 accumulation): [`MatmulPrecision::Tf32`] (`NUVEC_CUDA_MATMUL=tf32`). Under
/// `F32` (and for what still calls SGEMM under `Bf16` and `Auto`, e.g. f32 weights under `Auto`)
/// it is plain SGEMM, whose results match the CPU backend to f32 rounding.
fn tf32_matmul(st: &State) -> bool {
    st.matmul_precision() == MatmulPrecision::Tf32
}

impl CudaBackend {
    /// Row-major `out[:, col0..col0+rows] (ld n) = x [m, k] @ w [rows, k]^T`, all f32, by cuBLAS
    /// SGEMM (column-major: `out^T = w · x^T`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sgemm(
        &self,
        op: &'static str,
        out: u64,
        x: u64,
        w: u64,
        m: usize,
        rows: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        let st = self.st()?;
        let (mi, ri, ki, ni) =
            (to_i32(op, "rows", m)?, to_i32(op, "rows", rows)?, to_i32(op, "k", k)?, to_i32(op, "n", n)?);
        let blas = st.blas.lock().unwrap_or_else(|p| p.into_inner());
        let (alpha, beta) = (1f32, 0f32);
        if tf32_matmul(self.st()?) {
            use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
            let f = cudaDataType::CUDA_R_32F;
            // SAFETY: as for the SGEMM below (same matrices, extents and leading dimensions);
            // alpha and beta are f32, as CUBLAS_COMPUTE_32F_FAST_TF32 requires.
            return unsafe {
                cudarc::cublas::result::gemm_ex(
                    *blas.handle(),
                    cublasOperation_t::CUBLAS_OP_T,
                    cublasOperation_t::CUBLAS_OP_N,
                    ri,
                    mi,
                    ki,
                    (&alpha as *const f32).cast(),
                    w as *const std::ffi::c_void,
                    f,
                    ki,
                    x as *const std::ffi::c_void,
                    f,
                    ki,
                    (&beta as *const f32).cast(),
                    out as *mut std::ffi::c_void,
                    f,
                    ni,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| Error::Device(format!("{op}: cuBLAS TF32 GEMM on cuda:{}: {e:?}", st.ordinal)));
        }
        // SAFETY: w holds rows x k f32 (row-major = column-major k x rows, lda k), x holds m x k
        // (column-major k x m, ldb k), out holds m rows of n >= rows f32 (column-major, ldc n);
        // all on this device; the handle's stream is the device stream.
        unsafe {
            cudarc::cublas::result::sgemm(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                ri,
                mi,
                ki,
                &alpha,
                w as *const f32,
                ki,
                x as *const f32,
                ki,
                &beta,
                out as *mut f32,
                ni,
            )
        }
        .map_err(|e| Error::Device(format!("{op}: cuBLAS SGEMM on cuda:{}: {e:?}", st.ordinal)))
    }

    /// Column-major `c (m x n, ldc) = alpha * op(a) op(b)` by cuBLAS SGEMM (f32, no TF32).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sgemm_raw(
        &self,
        op: &'static str,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        (a, lda): (u64, usize),
        (b, ldb): (u64, usize),
        (c, ldc): (u64, usize),
    ) -> Result<()> {
        let st = self.st()?;
        let t = |x: bool| if x { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let d = |v: usize| to_i32(op, "GEMM extent", v);
        let blas = st.blas.lock().unwrap_or_else(|p| p.into_inner());
        let beta = 0f32;
        // SAFETY: the callers pass addresses of live allocations of this device holding the
        // matrices with the extents and leading dimensions given; the handle's stream is the
        // device stream, so the product is ordered with the kernels around it.
        unsafe {
            cudarc::cublas::result::sgemm(
                *blas.handle(),
                t(ta),
                t(tb),
                d(m)?,
                d(n)?,
                d(k)?,
                &alpha,
                a as *const f32,
                d(lda)?,
                b as *const f32,
                d(ldb)?,
                &beta,
                c as *mut f32,
                d(ldc)?,
            )
        }
        .map_err(|e| Error::Device(format!("{op}: cuBLAS SGEMM on cuda:{}: {e:?}", st.ordinal)))
    }
}
