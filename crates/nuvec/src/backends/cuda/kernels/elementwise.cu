// Norms, rotary embeddings, copies and elementwise ops. Activations are f32. Element counts are
// 64-bit; 1-d launches use a grid-stride loop.

#define GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

extern "C" __global__ void add_f32(float* out, const float* a, const float* b, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

// silu(g) * u, written as the CPU backend writes it: g / (1 + exp(-g)) * u.
extern "C" __global__ void silu_mul_f32(float* out, const float* g, const float* u, size_t n) {
    GRID_STRIDE(i, n) {
        float x = g[i];
        out[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

// out [M, N] = x [M, N] + bias [N] (bias f32, f16 or bf16).
extern "C" __global__ void add_bias_f32(float* out, const float* x, const void* bias, int bias_dt, size_t n,
                                        size_t cols) {
    GRID_STRIDE(i, n) out[i] = x[i] + load_float(bias, i % cols, bias_dt);
}

// One block per row of `d`: out = x * (1 / sqrt(mean(x^2) + eps)) * w, as the CPU does it.
extern "C" __global__ void rms_norm_f32(float* out, const float* x, const void* w, int w_dt, int d, float eps) {
    __shared__ float scratch[33];
    const float* row = x + (size_t)blockIdx.x * d;
    float* o = out + (size_t)blockIdx.x * d;
    float s = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += row[i] * row[i];
    s = block_sum(s, scratch);
    float inv = 1.0f / sqrtf(s / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = row[i] * inv * load_float(w, i, w_dt);
}

// Rotary embedding of x [L, H, D] at positions offset..offset+L. `half` = number of frequencies;
// the first 2*half features of each head rotate (halves, or interleaved pairs if traditional).
// `step` (CUDA graphs; null in eager launches): the replayed step's scalars, whose step[0]
// (positions since the captured step) is added to `offset`.
extern "C" __global__ void rope_f32(float* out, const float* x, const float* inv_freqs, int half, int heads, int d,
                                    long long offset, int traditional, size_t n, const int* step) {
    if (step) offset += step[0];
    GRID_STRIDE(i, n) {
        int j = (int)(i % d);
        size_t t = i / ((size_t)d * heads);
        if (j >= 2 * half) {
            out[i] = x[i];
            continue;
        }
        const float* head = x + (i - j);
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
        float pos = (float)(offset + (long long)t);
        float s, c;
        sincosf(pos * inv_freqs[f], &s, &c);
        float x1 = head[a], x2 = head[b];
        out[i] = second ? x1 * s + x2 * c : x1 * c - x2 * s;
    }
}

// dst [A, cap, C] rows offset..offset+n of every A <- src [A, n, C]. `step`: as in rope_f32.
extern "C" __global__ void write_axis1_f32(float* dst, const float* src, size_t n_total, int n, int cap, int c,
                                           int offset, const int* step) {
    if (step) offset += step[0];
    GRID_STRIDE(i, n_total) {
        size_t e = i % c;
        size_t r = i / c;
        size_t j = r % n;
        size_t a = r / n;
        dst[(a * cap + offset + j) * c + e] = src[i];
    }
}

// [A, B, C] -> [B, A, C].
extern "C" __global__ void transpose01_f32(float* out, const float* x, int a, int b, int c, size_t n) {
    GRID_STRIDE(i, n) {
        size_t e = i % c;
        size_t r = i / c;
        size_t jb = r % b;
        size_t ia = r / b;
        out[(jb * a + ia) * c + e] = x[i];
    }
}

// One block per row of `n`: index of the first maximum (as the CPU: a value replaces the best
// only when strictly greater, starting from element 0; so a NaN first element wins).
extern "C" __global__ void argmax_f32(u32* out, const float* x, int n) {
    __shared__ float sv[1024];
    __shared__ int si[1024];
    const float* row = x + (size_t)blockIdx.x * n;
    float best = NEG_INF;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = row[i];
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
        out[blockIdx.x] = (u32)r;
    }
}

// dst [A, cap, C] rows offset..offset+n of every A <- src [n, A, C] (write_axis1 of src with its
// first two axes swapped: new keys or values [L, heads, head_dim] into a cache). `step`: as in
// rope_f32.
extern "C" __global__ void write_axis1_rows_f32(float* dst, const float* src, size_t n_total, int a, int cap, int c,
                                                int offset, const int* step) {
    if (step) offset += step[0];
    GRID_STRIDE(i, n_total) {
        size_t e = i % c;
        size_t r = i / c;
        size_t ia = r % a;
        size_t j = r / a;
        dst[(ia * cap + offset + j) * c + e] = src[i];
    }
}
