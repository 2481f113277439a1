// decode fusions: several ops of a decode step in one launch (ops/fused.rs). Each does the
// arithmetic of the separate kernels (elementwise.cu) in the same order and with the same block
// shapes, so the results match the unfused GPU path.

#define FUSED_GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// One block (256 threads, as rms_norm_f32) per row of `d`: sum = a + b, then
// out = sum * (1 / sqrt(mean(sum^2) + eps)) * w.
extern "C" __global__ void add_rms_norm_f32(float* sum, float* out, const float* a, const float* b, const void* w,
                                            int w_dt, int d, float eps) {
    __shared__ float scratch[33];
    size_t base = (size_t)blockIdx.x * d;
    float s = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = a[base + i] + b[base + i];
        sum[base + i] = v;
        s += v * v;
    }
    s = block_sum(s, scratch);
    float inv = 1.0f / sqrtf(s / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = a[base + i] + b[base + i];
        out[base + i] = v * inv * load_float(w, i, w_dt);
    }
}

// Queries q [L, hq, d] and keys k [L, hkv, d] of an attention step: one block (256 threads) per
// (head, position), heads 0..hq-1 being q's and hq.. k's. When `norm` is set the head is first
// RMS-normalized as rms_norm_f32 does it (weights qw / kw, dtype w_dt), then rotated as rope_f32
// does it (`half` frequencies; halves, or interleaved pairs if `traditional`). Dynamic shared
// memory: d floats. `step` (CUDA graphs; null in eager launches): the replayed step's scalars,
// whose step[0] (positions since the captured step) is added to `offset`.
extern "C" __global__ void rope_qk_f32(float* qo, float* ko, const float* q, const float* k, const void* qw,
                                       const void* kw, int w_dt, float eps, int norm, const float* inv_freqs,
                                       int half, int hq, int hkv, int d, long long offset, int traditional,
                                       const int* step) {
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
        int f, a, b;
        bool second;
        if (traditional) {
            f = j >> 1;
            a = 2 * f;
            b = a + 1;
            second = j & 1;
        } else {
            f = j < half ? j : j - half;
            a = f;
            b = f + half;
            second = j >= half;
        }
        float sn, cs;
        sincosf(pos * inv_freqs[f], &sn, &cs);
        float x1 = head[a], x2 = head[b];
        dst[j] = second ? x1 * sn + x2 * cs : x1 * cs - x2 * sn;
    }
}

// New keys and values [n, a, c] (positions first) into their caches [a, cap, c] at `offset`:
// write_axis1_rows_f32 of both in one grid (elements 0..n_each-1 are keys', the rest values').
// `step`: as in rope_qk_f32.
extern "C" __global__ void write_kv_rows_f32(float* kd, float* vd, const float* ks, const float* vs, size_t n_each,
                                             int a, int cap, int c, int offset, const int* step) {
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

// One block (256 threads) per row of n: out[3 * row] = the index r of the row's first maximum (as
// argmax_f32 finds it), out[3 * row + 1] = the f32 bits of x[r], out[3 * row + 2] = those of
// x[r] - (largest value before r) (+inf when r = 0; a quiet NaN when the row holds a NaN or an
// infinity).
extern "C" __global__ void argmax_gap_f32(u32* out, const float* x, int n) {
    __shared__ float sv[256];
    __shared__ int si[256];
    __shared__ float scratch[33];
    __shared__ int bad;
    __shared__ int best_at;
    const float* row = x + (size_t)blockIdx.x * n;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    float best = NEG_INF;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = row[i];
        if (!(fabsf(v) <= 3.402823466e38f)) atomicOr(&bad, 1);  // NaN or an infinity
        if (bi < 0 || v > best) {
            if (bi < 0 && !(v == v)) continue;  // a NaN never becomes a thread's best
            best = v;
            bi = i;
        }
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float v = sv[threadIdx.x + s];
            int vi = si[threadIdx.x + s];
            int ci = si[threadIdx.x];
            if (vi >= 0 && (ci < 0 || v > sv[threadIdx.x] || (v == sv[threadIdx.x] && vi < ci))) {
                sv[threadIdx.x] = v;
                si[threadIdx.x] = vi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int r = si[0];
        if (!(row[0] == row[0]) || r < 0) r = 0;
        best_at = r;
    }
    __syncthreads();
    int r = best_at;
    float before = NEG_INF;
    for (int i = threadIdx.x; i < r; i += blockDim.x) before = fmaxf(before, row[i]);
    before = block_max(before, scratch);
    if (threadIdx.x == 0) {
        float gap = bad ? __int_as_float(0x7fc00000) : row[r] - before;
        out[3 * (size_t)blockIdx.x] = (u32)r;
        out[3 * (size_t)blockIdx.x + 1] = __float_as_uint(row[r]);
        out[3 * (size_t)blockIdx.x + 2] = __float_as_uint(gap);
    }
}
