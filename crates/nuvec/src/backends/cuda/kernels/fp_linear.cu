// Matrix products and embedding lookups over weights in MLX's floating-point quantization modes:
// mxfp4 and nvfp4 (e2m1 codes, 4 bits) and mxfp8 (e4m3 codes, 8 bits), packed LSB-first in u32
// words like affine values, with one u8 scale per group (e8m0 for the mx modes, groups of 32; e4m3
// for nvfp4, groups of 16) and no biases. nvfp4's optional global scale arrives folded into
// `factor` (global_scale / 2688, else 1) and multiplies the group scale first, as mx.dequantize
// does. Accumulation is f32. (fpquant; the host side is backends/cuda/ops/fp.rs.)

// A floating-point-mode matrix [rows, cols] as the kernels read it.
struct FpWeights {
    const u32* packed;
    const unsigned char* scales;
    int mode;
    float factor;
    int cols;
};

// Element (r, k): code value times (group scale times factor).
__device__ __forceinline__ float fp_weight(const FpWeights& w, size_t r, int k) {
    int bits = w.mode == FP_MXFP8 ? 8 : 4;
    int group = w.mode == FP_NVFP4 ? 16 : 32;
    u32 s = w.scales[r * (size_t)(w.cols / group) + k / group];
    float scale = (w.mode == FP_NVFP4 ? fp_e4m3(s) : fp_e8m0(s)) * w.factor;
    size_t words = (size_t)w.cols * bits / 32;
    u32 c = unpack(w.packed + r * words, (size_t)k, bits);
    return (bits == 8 ? fp_e4m3(c) : fp_e2m1(c)) * scale;
}

#define FP_GEMV_MAX_M 8
#define FP_GEMV_WARPS 8

// out [M, N] = x [M, K] W^T for M <= FP_GEMV_MAX_M: one warp per output row n, lanes striding K,
// f32 partial sums reduced across the warp.
extern "C" __global__ void fp_gemv(float* out, const float* x, int m, int n, const u32* packed,
                                   const unsigned char* scales, int mode, float factor, int k) {
    pdl_begin();
    FpWeights w = {packed, scales, mode, factor, k};
    int lane = threadIdx.x & 31;
    size_t r = (size_t)blockIdx.x * FP_GEMV_WARPS + (threadIdx.x >> 5);
    if (r >= (size_t)n) return;
    float acc[FP_GEMV_MAX_M];
#pragma unroll
    for (int i = 0; i < FP_GEMV_MAX_M; ++i) acc[i] = 0.0f;
    for (int c = lane; c < k; c += 32) {
        float wv = fp_weight(w, r, c);
#pragma unroll
        for (int i = 0; i < FP_GEMV_MAX_M; ++i)
            if (i < m) acc[i] = fmaf(wv, x[(size_t)i * k + c], acc[i]);
    }
#pragma unroll
    for (int i = 0; i < FP_GEMV_MAX_M; ++i) {
        if (i < m) {
            float s = warp_sum(acc[i]);
            if (lane == 0) out[(size_t)i * n + r] = s;
        }
    }
}

// out [rows, K] f32 = weight rows `ids[i]` (or `row0 + i` when ids is null), dequantized:
// embedding lookups, and the tiles of the dequantize-then-GEMM path.
extern "C" __global__ void fp_gather_rows(float* out, const u32* ids, long long row0, size_t total,
                                          const u32* packed, const unsigned char* scales, int mode,
                                          float factor, int k) {
    pdl_begin();
    FpWeights w = {packed, scales, mode, factor, k};
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / k;
        int c = (int)(i % k);
        size_t r = ids ? (size_t)ids[t] : (size_t)row0 + t;
        out[i] = fp_weight(w, r, c);
    }
}
