// Matrix products and embedding lookups over dense (f32/f16/bf16) and MLX affine-quantized
// weights (`w = scale * q + bias` per group of `group` values; `bits` in 2,3,4,5,6,8).
// Accumulation is f32.

// A weight matrix [rows, cols] as the kernels read it. `w_dt` is DT_F32/DT_F16/DT_BF16 for dense
// weights, or -1 for affine-quantized ones (then `packed`, `scales`, `biases`, `p_dt`, `bits` and
// `group` describe it).
struct Weights {
    const void* dense;
    const u32* packed;
    const void* scales;
    const void* biases;
    int w_dt;
    int p_dt;
    int bits;
    int group;
    int cols;
};

__device__ __forceinline__ float weight(const Weights& w, size_t r, int k) {
    if (w.w_dt >= 0) return load_float(w.dense, r * (size_t)w.cols + k, w.w_dt);
    size_t words = (size_t)w.cols * w.bits / 32;
    float q = (float)unpack(w.packed + r * words, (size_t)k, w.bits);
    size_t g = r * (size_t)(w.cols / w.group) + k / w.group;
    return load_float(w.scales, g, w.p_dt) * q + load_float(w.biases, g, w.p_dt);
}

#define GEMV_MAX_M 8
#define GEMV_WARPS 8

// out [M, N] = x [M, K] W^T for M <= GEMV_MAX_M: one warp per output row n, lanes striding K
// (consecutive lanes read consecutive weights), f32 partial sums reduced across the warp.
extern "C" __global__ void gemv(float* out, const float* x, int m, int n, const void* dense, const u32* packed,
                                const void* scales, const void* biases, int w_dt, int p_dt, int bits, int group,
                                int k) {
    Weights w = {dense, packed, scales, biases, w_dt, p_dt, bits, group, k};
    int lane = threadIdx.x & 31;
    size_t r = (size_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (r >= (size_t)n) return;
    float acc[GEMV_MAX_M];
#pragma unroll
    for (int i = 0; i < GEMV_MAX_M; ++i) acc[i] = 0.0f;
    for (int c = lane; c < k; c += 32) {
        float wv = weight(w, r, c);
#pragma unroll
        for (int i = 0; i < GEMV_MAX_M; ++i)
            if (i < m) acc[i] = fmaf(wv, x[(size_t)i * k + c], acc[i]);
    }
#pragma unroll
    for (int i = 0; i < GEMV_MAX_M; ++i) {
        if (i < m) {
            float s = warp_sum(acc[i]);
            if (lane == 0) out[(size_t)i * n + r] = s;
        }
    }
}

// out [rows, K] f32 = weight rows `ids[i]` (or `row0 + i` when ids is null), dequantized or
// converted: embedding lookups, and the tiles of the dequantize-then-GEMM path.
extern "C" __global__ void gather_rows(float* out, const u32* ids, long long row0, size_t total, const void* dense,
                                       const u32* packed, const void* scales, const void* biases, int w_dt, int p_dt,
                                       int bits, int group, int k) {
    Weights w = {dense, packed, scales, biases, w_dt, p_dt, bits, group, k};
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / k;
        int c = (int)(i % k);
        size_t r = ids ? (size_t)ids[t] : (size_t)row0 + t;
        out[i] = weight(w, r, c);
    }
}
