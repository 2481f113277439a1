// decode fusions: several ops of a decode step in one launch (ops/fused.rs). Each does the
// arithmetic of the separate kernels (elementwise.cu) in the same order and with the same block
// shapes, so the results match the unfused GPU path.

#define FUSED_GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// One block per row of `d`, shaped and ordered as rms_norm_f32 (same threads per row, the
// same 4 values per thread): sum = a + b, then out = sum * (1 / sqrt(mean(sum^2) + eps)) * w.
// `vec`: a, b and sum rows 16-byte aligned and d a multiple of 4 (the host checks).
extern "C" __global__ void add_rms_norm_f32(float* __restrict__ sum, float* __restrict__ out,
                                            const float* __restrict__ a, const float* __restrict__ b, const void* w,
                                            int w_dt, int d, float eps, int vec) {
    pdl_begin();
    __shared__ float scratch[33];
    size_t base = (size_t)blockIdx.x * d;
    float s = 0.0f;
    for (int i = 4 * threadIdx.x; i < d; i += 4 * blockDim.x) {
        float4 u = row_quad(a + base, i, d, vec), t = row_quad(b + base, i, d, vec);
        float4 v = make_float4(u.x + t.x, u.y + t.y, u.z + t.z, u.w + t.w);
        if (vec) *(float4*)(sum + base + i) = v;
        else {
            float r[4] = {v.x, v.y, v.z, v.w};
            for (int e = 0; e < 4 && i + e < d; ++e) sum[base + i + e] = r[e];
        }
        s += quad_sumsq(v);
    }
    s = block_sum(s, scratch);
    float inv = 1.0f / sqrtf(s / (float)d + eps);
    for (int i = 4 * threadIdx.x; i < d; i += 4 * blockDim.x) {
        float4 u = row_quad(a + base, i, d, vec), t = row_quad(b + base, i, d, vec);
        quad_norm_store(out + base, make_float4(u.x + t.x, u.y + t.y, u.z + t.z, u.w + t.w), i, d, inv, w, w_dt);
    }
}

// Queries q [L, hq, d] and keys k [L, hkv, d] of an attention step: one block (256 threads) per
// (head, position), heads 0..hq-1 being q's and hq.. k's. When `norm` is set the head is first
// RMS-normalized with rms_norm_f32's arithmetic (weights qw / kw, dtype w_dt; one value per thread,
// so its sums add in another order), then rotated as rope_f32
// does it (`half` frequencies; halves, or interleaved pairs if `traditional`). Dynamic shared
// memory: d floats. `step` (CUDA graphs; null in eager launches): the replayed step's scalars,
// whose step[0] (positions since the captured step) is added to `offset`.
extern "C" __global__ void rope_qk_f32(float* qo, float* ko, const float* q, const float* k, const void* qw,
                                       const void* kw, int w_dt, float eps, int norm, const float* inv_freqs,
                                       int half, int hq, int hkv, int d, long long offset, int traditional,
                                       const int* step) {
    pdl_begin();
    if (step) offset += step[0];
    extern __shared__ float head[];
    __shared__ float scratch[33];
    int h = blockIdx.x;
    size_t t = blockIdx.y;
    bool is_q = h < hq;
    int heads = is_q ? hq : hkv;
    size_t at = (t * heads + (is_q ? h : h - hq)) * (size_t)d;
    const float* src = (is_q ? q : k) + at;
    float* dst = (is_q ? qo : ko) + at;
    if (norm) {
        float s = 0.0f;
        for (int i = threadIdx.x; i < d; i += blockDim.x) s += src[i] * src[i];
        s = block_sum(s, scratch);
        float inv = 1.0f / sqrtf(s / (float)d + eps);
        const void* w = is_q ? qw : kw;
        for (int i = threadIdx.x; i < d; i += blockDim.x) head[i] = src[i] * inv * load_float(w, i, w_dt);
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x) head[i] = src[i];
    }
    __syncthreads();
    float pos = (float)(offset + (long long)t);
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        if (j >= 2 * half) {
            dst[j] = head[j];
            continue;
        }
        dst[j] = rope_feature(head, j, half, traditional, pos, inv_freqs);
    }
}

// New keys and values [n, a, c] (positions first) into their caches [a, cap, c] at `offset`:
// write_axis1_rows_f32 of both in one grid (elements 0..n_each-1 are keys', the rest values').
// `step`: as in rope_qk_f32.
extern "C" __global__ void write_kv_rows_f32(float* kd, float* vd, const float* ks, const float* vs, size_t n_each,
                                             int a, int cap, int c, int offset, const int* step) {
    pdl_begin();
    if (step) offset += step[0];
    FUSED_GRID_STRIDE(i, 2 * n_each) {
        bool values = i >= n_each;
        size_t e0 = values ? i - n_each : i;
        size_t e = e0 % c;
        size_t r = e0 / c;
        size_t ia = r % a;
        size_t j = r / a;
        (values ? vd : kd)[(ia * cap + offset + j) * c + e] = (values ? vs : ks)[e0];
    }
}
