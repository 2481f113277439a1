// Norms, rotary embeddings, copies and elementwise ops. Activations are f32. Element counts are
// 64-bit; 1-d launches use a grid-stride loop.

#define GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

extern "C" __global__ void add_f32(float* out, const float* a, const float* b, size_t n) {
    pdl_begin();
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

// silu(g) * u (silu_mul_value, common.cuh).
extern "C" __global__ void silu_mul_f32(float* out, const float* g, const float* u, size_t n) {
    pdl_begin();
    GRID_STRIDE(i, n) out[i] = silu_mul_value(g[i], u[i]);
}

// out [M, N] = x [M, N] + bias [N] (bias f32, f16 or bf16).
extern "C" __global__ void add_bias_f32(float* out, const float* x, const void* bias, int bias_dt, size_t n,
                                        size_t cols) {
    pdl_begin();
    GRID_STRIDE(i, n) out[i] = x[i] + load_float(bias, i % cols, bias_dt);
}

// out [M, N] = y [M, N] + t [M, R] . w [N, R]^T, R small (a low-rank adapter's second product
// added to the base one): one thread per output, the R terms summed in order as the CPU sums them.
extern "C" __global__ void add_linear_f32(float* out, const float* y, const float* t, const float* w, size_t total,
                                          size_t n, int r) {
    pdl_begin();
    GRID_STRIDE(i, total) {
        const float* tr = t + (i / n) * r;
        const float* wr = w + (i % n) * r;
        float acc = 0.f;
        for (int k = 0; k < r; ++k) acc += tr[k] * wr[k];
        out[i] = y[i] + acc;
    }
}

// out [M, N] = x [M, N] * w [N] (w f32, f16 or bf16): a DoRA adapter's magnitudes.
extern "C" __global__ void mul_columns_f32(float* out, const float* x, const void* w, int w_dt, size_t n,
                                           size_t cols) {
    pdl_begin();
    GRID_STRIDE(i, n) out[i] = x[i] * load_float(w, i % cols, w_dt);
}

// One block per row of `d`, summed in norm_vthreads' layout (common.cuh; a decode row gets a thread
// per 4 values up to 1024, so that a 4096-wide row is one 16-byte load per thread: a 256-thread
// loop over it took 15 us under ncu on the H200, a decode step has two per layer):
// out = x * (1 / sqrt(mean(x^2) + eps)) * w.
extern "C" __global__ void __launch_bounds__(1024) rms_norm_f32(float* out, const float* __restrict__ x, const void* w, int w_dt, int d,
                                        float eps, int vec) {
    pdl_begin();
    __shared__ float scratch[33];
    const float* row = x + (size_t)blockIdx.x * d;
    float* o = out + (size_t)blockIdx.x * d;
    const int vt = norm_vthreads(d);
    float s[NORM_MAX_F] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto load = [&](int i) { return row_quad(row, i, d, vec); };
    row_quads(d, vt, load, [&](int k, int, float4 v) { s[k] += quad_sumsq(v); });
    float inv = 1.0f / sqrtf(block_sum_slots(s, vt / blockDim.x, scratch) / (float)d + eps);
    // The weights load with the values (a store could alias them, so they would not be hoisted).
    auto weighted = [&](int i) { return norm_quad(load(i), w, i, d, w_dt); };
    row_quads(d, vt, weighted, [&](int, int i, NormQuad q) { quad_store(o, quad_normed(q, inv), i, d, vec); });
}

// Rotary embedding of x [L, H, D] at positions offset..offset+L. `half` = number of frequencies;
// the first 2*half features of each head rotate (halves, or interleaved pairs if traditional).
// `step` (CUDA graphs; null in eager launches): the replayed step's scalars, whose step[0]
// (positions since the captured step) is added to `offset`.
extern "C" __global__ void rope_f32(float* out, const float* x, const float* inv_freqs, int half, int heads, int d,
                                    long long offset, int traditional, size_t n, const int* step) {
    pdl_begin();
    if (step) offset += step[0];
    GRID_STRIDE(i, n) {
        int j = (int)(i % d);
        size_t t = i / ((size_t)d * heads);
        if (j >= 2 * half) {
            out[i] = x[i];
            continue;
        }
        out[i] = rope_feature(x + (i - j), j, half, traditional, (float)(offset + (long long)t), inv_freqs);
    }
}

// dst [A, cap, C] rows offset..offset+n of every A <- the first n rows of each A of src
// [A, src_cap, C], converted from src_dt to dst_dt (f32, f16 or bf16; to half precision rounded
// to nearest even). `step`: as in rope_f32; with `ring` >= 0 (a rotating cache's one-row write,
// positions ring.. of each A reused in turn) a replay writes at the ring's slot for offset +
// step[0]: ring + (offset - ring + step[0]) mod (cap - ring).
extern "C" __global__ void write_axis1(void* dst, int dst_dt, const void* src, int src_dt, size_t n_total, int n,
                                       int cap, int c, int offset, const int* step, int src_cap, int ring) {
    pdl_begin();
    if (step) offset = ring >= 0 ? ring + (offset - ring + step[0]) % (cap - ring) : offset + step[0];
    GRID_STRIDE(i, n_total) {
        size_t e = i % c;
        size_t r = i / c;
        size_t j = r % n;
        size_t a = r / n;
        store_float(dst, (a * cap + offset + j) * c + e, load_float(src, (a * src_cap + j) * c + e, src_dt), dst_dt);
    }
}

// Every element of x (f32, f16 or bf16) as out's dtype.
extern "C" __global__ void cast_float(void* out, int out_dt, const void* x, int x_dt, size_t n) {
    pdl_begin();
    GRID_STRIDE(i, n) store_float(out, i, load_float(x, i, x_dt), out_dt);
}

// [A, B, C] -> [B, A, C], of 4-byte elements (f32) or 2-byte ones (f16, bf16: transpose01_u16).
template <class T>
__device__ __forceinline__ void transpose01(T* out, const T* x, int a, int b, int c, size_t n) {
    GRID_STRIDE(i, n) {
        size_t e = i % c;
        size_t r = i / c;
        size_t jb = r % b;
        size_t ia = r / b;
        out[(jb * a + ia) * c + e] = x[i];
    }
}
extern "C" __global__ void transpose01_f32(float* out, const float* x, int a, int b, int c, size_t n) {
    pdl_begin();
    transpose01(out, x, a, b, c, n);
}
extern "C" __global__ void transpose01_u16(u16* out, const u16* x, int a, int b, int c, size_t n) {
    pdl_begin();
    transpose01(out, x, a, b, c, n);
}

// out [rows, n] = x with every entry whose bit is clear in `bits` (`words` u32 per row, bit i % 32
// of word i / 32 for entry i) replaced by `fill`: a structured-output constraint's mask applied
// to the logits before the greedy pick (ops/fused.rs `masked_rows`). Grid (ceil(n / 256), rows).
extern "C" __global__ void mask_rows_f32(float* out, const float* x, const u32* bits, int n, int words, float fill) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t at = (size_t)blockIdx.y * n + i;
    const u32 w = bits[(size_t)blockIdx.y * words + (i >> 5)];
    out[at] = ((w >> (i & 31)) & 1u) ? x[at] : fill;
}

// ---- argmax over rows, in two launches (argmax and argmax_gap; ops.rs, ops/fused.rs) ----
//
// The CPU's argmax: the index of the first maximum, a value replacing the best only when strictly
// greater, starting from element 0 (so a NaN first element wins, and other NaNs never do). One
// block per row took 55 us for a 32000-entry row on the H200 (ncu), and a 151936-entry one is
// Qwen3's: a decode step's greedy pick was a tenth of the step. So each row is cut into `parts`
// ranges of `chunk` values, a block each (argmax_part_f32), and one block per row combines them
// (argmax_final_f32). With `mask` (non-null: `words` words a row, bit i % 32 of word i / 32 for
// entry i), an entry whose bit is clear reads as `fill`: the pick over mask_rows_f32's output
// without writing it.

// Entry i of a row, or `fill` where its mask (null: none) refuses it.
__device__ __forceinline__ float argmax_entry(const float* row, const u32* mask, int i, float fill) {
    return (mask == nullptr || (mask[i >> 5] >> (i & 31)) & 1u) ? row[i] : fill;
}

// (value, index) of the block's first maximum among its threads' (index -1: none), in sv/si[0].
__device__ void argmax_block_pick(float best, int bi, float* sv, int* si) {
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
}

// Block (p, row), 256 threads: over x[row][p * chunk, min(n, (p + 1) * chunk)) writes part[4 * (row
// * parts + p) + 0..3] = the first maximum's f32 bits, its index (-1 when the range is all NaN),
// the largest value before it in the range (-inf if none), and 1 if the range holds a NaN or an
// infinity (else 0).
extern "C" __global__ void argmax_part_f32(u32* part, const float* x, int n, int chunk, const u32* mask, int words,
                                           float fill) {
    pdl_begin();
    __shared__ float sv[256];
    __shared__ int si[256];
    __shared__ float scratch[33];
    const int p = blockIdx.x, parts = gridDim.x;
    const float* row = x + (size_t)blockIdx.y * n;
    const u32* m = mask ? mask + (size_t)blockIdx.y * words : nullptr;
    const int lo = p * chunk, hi = min(n, lo + chunk);
    float best = NEG_INF;
    int bi = -1, bad = 0;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = argmax_entry(row, m, i, fill);
        bad |= !(fabsf(v) <= 3.402823466e38f);  // NaN or an infinity
        if (bi < 0 || v > best) {
            if (bi < 0 && !(v == v)) continue;  // a NaN never becomes a thread's best
            best = v;
            bi = i;
        }
    }
    bad = __syncthreads_or(bad);
    argmax_block_pick(best, bi, sv, si);
    const int r = si[0];
    const float top = sv[0];
    float before = NEG_INF;
    for (int i = lo + threadIdx.x; i < r; i += blockDim.x) before = fmaxf(before, argmax_entry(row, m, i, fill));
    before = block_max(before, scratch);
    if (threadIdx.x == 0) {
        u32* o = part + 4 * ((size_t)blockIdx.y * parts + p);
        o[0] = __float_as_uint(top);
        o[1] = (u32)r;
        o[2] = __float_as_uint(before);
        o[3] = (u32)bad;
    }
}

// One block per row (256 threads) over its `parts` partial results. gap == 0 (argmax): out[row] =
// the index. gap == 1 (argmax_gap): out[3 * row + 0..2] = the index r, the f32 bits of x[r] and of
// x[r] - (largest value before r) (+inf when r = 0; a quiet NaN when the row holds a NaN or an
// infinity).
extern "C" __global__ void argmax_final_f32(u32* out, const u32* part, const float* x, int n, int parts, int gap,
                                            const u32* mask, int words, float fill) {
    pdl_begin();
    __shared__ float sv[256];
    __shared__ int si[256];
    __shared__ float scratch[33];
    __shared__ int at_part;
    const u32* pr = part + 4 * (size_t)blockIdx.x * parts;
    const float* row = x + (size_t)blockIdx.x * n;
    const u32* m = mask ? mask + (size_t)blockIdx.x * words : nullptr;
    float best = NEG_INF;
    int bi = -1, bp = -1, bad = 0;
    for (int q = threadIdx.x; q < parts; q += blockDim.x) {  // parts in order: the first wins ties
        float v = __uint_as_float(pr[4 * q]);
        int vi = (int)pr[4 * q + 1];
        bad |= (int)pr[4 * q + 3];
        if (vi >= 0 && (bi < 0 || v > best)) {
            best = v;
            bi = vi;
            bp = q;
        }
    }
    bad = __syncthreads_or(bad);
    argmax_block_pick(best, bi, sv, si);
    int r = si[0];
    // The part that holds r: the one whose range contains it.
    if (threadIdx.x == 0) at_part = -1;
    __syncthreads();
    if (bp >= 0 && bi == r) at_part = bp;
    __syncthreads();
    const int rp = at_part;
    // Largest value before r: the maxima of the parts before r's, and what r's part saw before it.
    float before = NEG_INF;
    for (int q = threadIdx.x; q < rp; q += blockDim.x)
        if ((int)pr[4 * q + 1] >= 0) before = fmaxf(before, __uint_as_float(pr[4 * q]));
    before = block_max(before, scratch);
    if (threadIdx.x == 0) {
        if (rp >= 0) before = fmaxf(before, __uint_as_float(pr[4 * rp + 2]));
        const float first = argmax_entry(row, m, 0, fill);
        if (!(first == first) || r < 0) {
            r = 0;
            before = NEG_INF;
        }
        if (gap) {
            const float top = argmax_entry(row, m, r, fill);
            float g = bad ? __int_as_float(0x7fc00000) : top - before;
            out[3 * (size_t)blockIdx.x] = (u32)r;
            out[3 * (size_t)blockIdx.x + 1] = __float_as_uint(top);
            out[3 * (size_t)blockIdx.x + 2] = __float_as_uint(g);
        } else {
            out[blockIdx.x] = (u32)r;
        }
    }
}

// dst [A, cap, C] rows offset..offset+n of every A <- src [n, A, C] (write_axis1 of src with its
// first two axes swapped: new keys or values [L, heads, head_dim] into a cache), f32 into a cache
// of dst_dt. `step`: as in rope_f32.
extern "C" __global__ void write_axis1_rows(void* dst, int dst_dt, const float* src, size_t n_total, int a, int cap,
                                            int c, int offset, const int* step) {
    pdl_begin();
    if (step) offset += step[0];
    GRID_STRIDE(i, n_total) {
        size_t e = i % c;
        size_t r = i / c;
        size_t ia = r % a;
        size_t j = r / a;
        store_float(dst, (ia * cap + offset + j) * c + e, src[i], dst_dt);
    }
}

// ids[pairs[2 i]] = picks[3 pairs[2 i + 1]] for i < count: a step's token ids with the rows fed by
// the previous step's greedy picks (argmax_gap's [m, 3] words, the index first) spliced in on the
// device (ops.rs `embed_spliced`), so the step is enqueued before those picks are read. The
// caller guarantees every pick lies in the table (logits no wider than it); an index past it is
// clamped so that a broken caller cannot make the gather read outside the table.
extern "C" __global__ void splice_ids_u32(u32* ids, const u32* picks, const int* pairs, int count, int vocab) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const u32 id = picks[3 * (size_t)pairs[2 * i + 1]];
    ids[pairs[2 * i]] = id < (u32)vocab ? id : (u32)(vocab - 1);
}
