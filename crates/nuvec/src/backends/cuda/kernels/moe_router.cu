// A mixture-of-experts router on the device: the top-k of logits (moe_route), and for a few rows
// (decode) the router's product and its top-k in one launch (moe_route_dense), so that a decode
// layer does not spend three launches (the product, cuBLAS's reduction, the top-k) and the
// settling of a pending norm before its experts. Host side: backends/cuda/ops/moe_router.rs; the
// reference is crates/nuvec/src/moe.rs (route_composed).

#define MOE_ROUTE_SOFTMAX_TOPK 0
#define MOE_ROUTE_TOPK_SOFTMAX 1

// The choice's order as an unsigned key: larger numbers larger keys, -0 as +0, a NaN below every
// number (-inf included), so that a NaN is never chosen ahead of a number.
__device__ __forceinline__ u32 moe_route_key(float v) {
    if (v != v) return 0u;
    const u32 b = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

// Threads per block of the routing (moe_route's launch; moe_route_dense's last block).
#define MOE_ROUTE_THREADS 256

// ids [top_k], weights [top_k] of one row of `experts` values row[e] * scale (+ bias[e]: a row of
// dtype bias_dt, or null), every thread of the block calling (P: the row's pointer type, volatile
// where other blocks of the launch wrote it). The choice is made on the probabilities
// (softmax-top-k) or the values (top-k-softmax), best first, ties to the lower index, a NaN after
// every number; each expert's place is the count of experts ahead of it, all experts at once (a
// warp choosing one expert per round of shuffles was a chain of top_k rounds).
template <class P>
__device__ __forceinline__ void moe_route_block(u32* __restrict__ out_ids, float* __restrict__ out_w, P row,
                                                float scale, int experts, int top_k, int mode, int normalize,
                                                const void* __restrict__ bias, int bias_dt) {
    __shared__ float v[MOE_MAX_EXPERTS];
    __shared__ u32 key[MOE_MAX_EXPERTS];
    __shared__ float picked[MOE_MAX_TOP_K];
    __shared__ float scratch[33];
    const int tid = threadIdx.x, nt = blockDim.x;
    float mx = NEG_INF;
    for (int e = tid; e < experts; e += nt) {
        const float x = bias != nullptr ? row[e] * scale + load_float(bias, e, bias_dt) : row[e] * scale;
        v[e] = x;
        mx = fmaxf(mx, x);
    }
    if (mode == MOE_ROUTE_SOFTMAX_TOPK) {
        mx = block_max(mx, scratch);
        float s = 0.0f;
        for (int e = tid; e < experts; e += nt) {
            v[e] = expf(v[e] - mx);
            s += v[e];
        }
        s = block_sum(s, scratch);
        for (int e = tid; e < experts; e += nt) v[e] = v[e] / s;
    }
    for (int e = tid; e < experts; e += nt) key[e] = moe_route_key(v[e]);
    __syncthreads();
    for (int e = tid; e < experts; e += nt) {
        const u32 ke = key[e];
        int place = 0;
#pragma unroll 8
        for (int j = 0; j < experts; ++j) {
            const u32 kj = key[j];
            place += kj > ke || (kj == ke && j < e);
        }
        if (place < top_k) {
            out_ids[place] = (u32)e;
            picked[place] = v[e];
        }
    }
    __syncthreads();
    if (tid == 0) {
        if (mode == MOE_ROUTE_SOFTMAX_TOPK) {
            float total = 0.0f;
            for (int j = 0; j < top_k; ++j) total += picked[j];
            if (!normalize) total = 1.0f;
            for (int j = 0; j < top_k; ++j) out_w[j] = picked[j] / total;
        } else {
            float m = NEG_INF, s = 0.0f;
            for (int j = 0; j < top_k; ++j) m = fmaxf(m, picked[j]);
            for (int j = 0; j < top_k; ++j) s += expf(picked[j] - m);
            for (int j = 0; j < top_k; ++j) out_w[j] = expf(picked[j] - m) / s;
        }
    }
}

// ids [rows, top_k], weights [rows, top_k] from logits [rows, experts] (plus `bias`, or null):
// one block of MOE_ROUTE_THREADS per row.
extern "C" __global__ void __launch_bounds__(MOE_ROUTE_THREADS)
    moe_route(u32* __restrict__ ids, float* __restrict__ weights, const float* __restrict__ logits, int experts,
              int top_k, int mode, int normalize, const void* __restrict__ bias, int bias_dt) {
    pdl_begin();
    const size_t r = blockIdx.x;
    moe_route_block(ids + r * top_k, weights + r * top_k, logits + r * experts, 1.0f, experts, top_k, mode, normalize,
                    bias, bias_dt);
}

// ---- The router's product and the top-k in one launch ----
// Block (b, r) takes experts [b E, b E + E) of row r (E = MOE_RL_EXPERTS), each expert's dot
// product over MOE_RL_SPLIT warps, every lane with MOE_RL_UNROLL 16-byte loads of the weight in
// flight per pass (a warp that waited out one memory latency per 128 values made the router
// slower than the three launches it replaced). The block writes its products to `logits`; the
// last of row r's blocks to finish (counted in tickets[r], which it sets back to 0 for the next
// launch) chooses from all of them as moe_route does, with all its threads.
#define MOE_RL_WARPS 8
#define MOE_RL_SPLIT 2
#define MOE_RL_EXPERTS (MOE_RL_WARPS / MOE_RL_SPLIT)
#define MOE_RL_UNROLL 8

// One warp's share of row `e` of W [experts, k] (dtype WDT) against x [k] f32: 16-byte vectors
// first, first + stride, ... (4 f32 or 8 half values each).
template <int WDT>
__device__ __forceinline__ float moe_router_dot(const void* __restrict__ w, const float* __restrict__ x, int e, int k,
                                                int first, int stride) {
    constexpr int VALS = WDT == DT_F32 ? 4 : 8;
    const int nvec = k / VALS;
    const uint4* wr = (const uint4*)w + (size_t)e * nvec;
    const float4* xv = (const float4*)x;
    float acc = 0.0f;
    for (int v0 = first; v0 < nvec; v0 += stride * MOE_RL_UNROLL) {
        uint4 q[MOE_RL_UNROLL];
#pragma unroll
        for (int u = 0; u < MOE_RL_UNROLL; ++u) {
            const int v = v0 + u * stride;
            q[u] = v < nvec ? __ldg(wr + v) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < MOE_RL_UNROLL; ++u) {
            const int v = v0 + u * stride;
            if (v >= nvec) break;
            if (WDT == DT_F32) {
                const float4 a = xv[v];
                acc = fmaf(__uint_as_float(q[u].x), a.x, acc);
                acc = fmaf(__uint_as_float(q[u].y), a.y, acc);
                acc = fmaf(__uint_as_float(q[u].z), a.z, acc);
                acc = fmaf(__uint_as_float(q[u].w), a.w, acc);
            } else {
                const float4 a = xv[2 * v], b = xv[2 * v + 1];
                const u32 words[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
                const float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const u16 lo = (u16)(words[i] & 0xFFFFu), hi = (u16)(words[i] >> 16);
                    const float w0 = WDT == DT_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
                    const float w1 = WDT == DT_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
                    acc = fmaf(w0, xs[2 * i], acc);
                    acc = fmaf(w1, xs[2 * i + 1], acc);
                }
            }
        }
    }
    return warp_sum(acc);
}

// The block's rows of W fetched into L2 while the kernel before it finishes (a hint: nothing
// writes W, so it cannot race).
__device__ __forceinline__ void moe_router_prefetch(const void* w, int w_dt, int k, int experts) {
    const int e = blockIdx.x * MOE_RL_EXPERTS + (int)(threadIdx.x >> 5);
    const size_t row_bytes = (size_t)k * (w_dt == DT_F32 ? 4 : 2);
    if (threadIdx.x % 32 == 0 && (int)(threadIdx.x >> 5) < MOE_RL_EXPERTS && e < experts)
        l2_prefetch((const char*)w + e * row_bytes, row_bytes);
}

// ids, weights [rows, top_k] of x [rows, k] (f32) through the router W [experts, k] (dtype
// w_dt) plus `bias` (or null; dtype bias_dt); `logits` [rows, experts] gets the products.
// `pending` (or null): x is one row of a norm's u whose scale is pending in these parts
// (common.cuh, xq_norm_scale), which the last block applies as it reads the products. k a
// multiple of 8; W and x 16-byte aligned (the host checks).
extern "C" __global__ void __launch_bounds__(32 * MOE_RL_WARPS)
    moe_route_dense(u32* __restrict__ ids, float* __restrict__ weights, float* logits, u32* tickets,
                    const float* __restrict__ x, const void* __restrict__ w, int w_dt, int k, int experts, int top_k,
                    int mode, int normalize, const void* __restrict__ bias, int bias_dt,
                    const u32* __restrict__ pending) {
    moe_router_prefetch(w, w_dt, k, experts);
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = blockIdx.y;
    const int e = blockIdx.x * MOE_RL_EXPERTS + warp / MOE_RL_SPLIT;
    __shared__ float part[MOE_RL_WARPS];
    __shared__ float scale;
    const float* xr = x + (size_t)r * k;
    const int first = (warp % MOE_RL_SPLIT) * 32 + lane, stride = 32 * MOE_RL_SPLIT;
    float dot = 0.0f;
    if (e < experts) {
        if (w_dt == DT_F32) dot = moe_router_dot<DT_F32>(w, xr, e, k, first, stride);
        else if (w_dt == DT_F16) dot = moe_router_dot<DT_F16>(w, xr, e, k, first, stride);
        else dot = moe_router_dot<DT_BF16>(w, xr, e, k, first, stride);
    }
    if (lane == 0) part[warp] = dot;
    __syncthreads();
    if (threadIdx.x < MOE_RL_EXPERTS) {
        const int ei = blockIdx.x * MOE_RL_EXPERTS + threadIdx.x;
        if (ei < experts) {
            float t = 0.0f;
#pragma unroll
            for (int s = 0; s < MOE_RL_SPLIT; ++s) t += part[threadIdx.x * MOE_RL_SPLIT + s];
            logits[(size_t)r * experts + ei] = t;
        }
    }
    if (!last_block_ticket(tickets + r, gridDim.x)) return;
    if (warp == 0) {
        const float s = pending != nullptr ? -xq_norm_scale(pending, k, true) : 1.0f;
        if (lane == 0) scale = s;
    }
    __syncthreads();
    const volatile float* row = logits + (size_t)r * experts;
    moe_route_block(ids + (size_t)r * top_k, weights + (size_t)r * top_k, row, scale, experts, top_k, mode,
                    normalize, bias, bias_dt);
    if (threadIdx.x == 0) tickets[r] = 0;
}
