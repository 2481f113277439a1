// decode fusions: several ops of a decode step in one launch (ops/fused.rs). Each does the
// arithmetic of the separate kernels (elementwise.cu) in the same order and with the same block
// shapes, so the results match the unfused GPU path.

#define FUSED_GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// b[i] + bias[i] (bias of dtype bias_dt, one per column; null: b[i]): add_bias_f32's sum, which a
// projection's bias takes before the residual add.
__device__ __forceinline__ float biased(const float* __restrict__ b, const void* bias, int bias_dt, int i) {
    return bias == nullptr ? b[i] : b[i] + load_float(bias, i, bias_dt);
}
// The same for the quad at i of a row of d (row_quad's loads).
__device__ __forceinline__ float4 biased_quad(const float* __restrict__ b, const void* bias, int bias_dt, int i,
                                              int d, int vec) {
    const float4 t = row_quad(b, i, d, vec);
    if (bias == nullptr) return t;
    const float4 c = norm_quad(t, bias, i, d, bias_dt).w;
    return make_float4(t.x + c.x, t.y + c.y, t.z + c.z, t.w + c.w);
}

// One block per row of `d`, shaped and ordered as rms_norm_f32 (norm_vthreads' layout,
// common.cuh): sum = a + (b + bias), then out = sum * (1 / sqrt(mean(sum^2) + eps)) * w.
// `bias` (dtype bias_dt, d values; else null): the projection's bias that made b, added first.
// `vec`: a, b and sum rows 16-byte aligned and d a multiple of 4 (the host checks). `tiles`
// (else null; d a multiple of 128): out in the bf16 register products' input too (common.cuh).
extern "C" __global__ void __launch_bounds__(1024) add_rms_norm_f32(float* __restrict__ sum, float* __restrict__ out,
                                            const float* __restrict__ a, const float* __restrict__ b,
                                            const void* bias, int bias_dt, const void* w, int w_dt, int d,
                                            float eps, int vec, u32* __restrict__ tiles) {
    pdl_begin();
    __shared__ float scratch[33];
    size_t base = (size_t)blockIdx.x * d;
    const int vt = norm_vthreads(d);
    float s[NORM_MAX_F] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto added = [&](int i) {
        float4 u = row_quad(a + base, i, d, vec), t = biased_quad(b + base, bias, bias_dt, i, d, vec);
        return make_float4(u.x + t.x, u.y + t.y, u.z + t.z, u.w + t.w);
    };
    row_quads(d, vt, added, [&](int k, int i, float4 v) {
        if (vec) *(float4*)(sum + base + i) = v;
        else {
            float r[4] = {v.x, v.y, v.z, v.w};
            for (int e = 0; e < 4 && i + e < d; ++e) sum[base + i + e] = r[e];
        }
        s[k] += quad_sumsq(v);
    });
    float inv = 1.0f / sqrtf(block_sum_slots(s, vt / blockDim.x, scratch) / (float)d + eps);
    // The weights load with the values (a store could alias them, so they would not be hoisted).
    auto weighted = [&](int i) { return norm_quad(added(i), w, i, d, w_dt); };
    row_quads(d, vt, weighted, [&](int, int i, NormQuad q) {
        const float4 n = quad_normed(q, inv);
        quad_store(out + base, n, i, d, vec);
        if (tiles) qdec_tile_quad(tiles, (int)blockIdx.x, i, d, n);
    });
}

// A decode row's norm spread over several blocks, which also writes the integer GEMVs' parts of
// its output (xsplit_chunk), so that neither the norm nor a split launch runs on one SM (issue 7:
// a one-block 4096-value norm took 5.8 us under ncu, its split launch 2.9). Each block sums the
// whole row's squares in norm_vthreads' layout (blockDim.x = VT / F, the host's choice), so its
// 1 / rms is the one-block kernels' bit for bit; then its warps take its 32-value chunks, a warp
// per chunk, and write them: sum = a + (b + bias) (when b is set; bias as in add_rms_norm_f32),
// out = v * inv * w (quad_normed's
// arithmetic), and the chunk's parts. The blocks re-read the row from L2, a few hundred cycles;
// no block waits for another. d is a multiple of 32, sum and out do not alias a or b (the host's
// fresh outputs).
__device__ __forceinline__ void norm_row_chunks(float* __restrict__ sum, float* __restrict__ out,
                                                const float* __restrict__ a, const float* __restrict__ b,
                                                const void* bias, int bias_dt, const void* w, int w_dt, int d,
                                                float eps, int vec, u32* __restrict__ parts) {
    __shared__ float scratch[33];
    const int vt = norm_vthreads(d);
    float s[NORM_MAX_F] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto load = [&](int i) {
        const float4 u = row_quad(a, i, d, vec);
        if (b == nullptr) return u;
        const float4 t = biased_quad(b, bias, bias_dt, i, d, vec);
        return make_float4(u.x + t.x, u.y + t.y, u.z + t.z, u.w + t.w);
    };
    row_quads(d, vt, load, [&](int k, int, float4 v) { s[k] += quad_sumsq(v); });
    const float inv = 1.0f / sqrtf(block_sum_slots(s, vt / blockDim.x, scratch) / (float)d + eps);
    const int lane = threadIdx.x & 31, warps = (int)(blockDim.x >> 5), chunks = d >> 5;
    for (int c = (int)blockIdx.x * warps + (int)(threadIdx.x >> 5); c < chunks; c += (int)gridDim.x * warps) {
        const int i = c * 32 + lane;
        const float v = b == nullptr ? a[i] : a[i] + biased(b, bias, bias_dt, i);
        if (sum != nullptr) sum[i] = v;
        const float o = v * inv * load_float(w, i, w_dt);
        out[i] = o;
        xsplit_chunk(parts, chunks, c, o, lane);
    }
}
extern "C" __global__ void __launch_bounds__(1024) add_rms_norm_row_f32(float* __restrict__ sum, float* __restrict__ out,
                                                                const float* __restrict__ a, const float* __restrict__ b,
                                                                const void* bias, int bias_dt, const void* w, int w_dt,
                                                                int d, float eps, int vec, u32* __restrict__ parts) {
    pdl_begin();
    norm_row_chunks(sum, out, a, b, bias, bias_dt, w, w_dt, d, eps, vec, parts);
}
extern "C" __global__ void __launch_bounds__(1024) rms_norm_row_f32(float* __restrict__ out, const float* __restrict__ x,
                                                            const void* w, int w_dt, int d, float eps, int vec,
                                                            u32* __restrict__ parts) {
    pdl_begin();
    norm_row_chunks(nullptr, out, x, nullptr, nullptr, 0, w, w_dt, d, eps, vec, parts);
}

// Queries q [L, hq, d] and keys k [L, hkv, d] of an attention step: a warp per (head, position),
// blockDim.x / 32 heads of one position per block, heads 0..hq-1 being q's and hq.. k's. The
// block first computes the position's cos and sin of each of the `half` frequencies once (into
// dynamic shared memory: 2 * half floats) for all its heads; a warp then takes its head's
// rotation pairs (rope_pair, rope_rotate: rope_f32's arithmetic) lane by lane. When `norm` is set
// the head is first RMS-normalized (weights qw / kw, dtype w_dt) with its sum of squares over the
// warp (rms_norm_f32 adds in another order). `step` (CUDA graphs; null in eager launches): the
// replayed step's scalars, whose step[0] (positions since the captured step) is added to `offset`.
// With `kc` set (rope_qk_kv_f32) the rotated keys go straight into the key cache [hkv, cap, d] at
// position cache_off + t (plus step[0] too) instead of `ko`, and hkv more warps (heads hq + hkv..)
// copy the values v [L, hkv, d] into the value cache `vc` likewise: write_kv_rows's writes,
// without its launch. The caches hold `kv_dt` (f32, f16 or bf16; rounded to nearest even).
__device__ __forceinline__ void rope_qk_run(float* qo, float* ko, const float* q, const float* k, const void* qw,
                                            const void* kw, int w_dt, float eps, int norm, const float* inv_freqs,
                                            int half, int hq, int hkv, int d, long long offset, int traditional,
                                            const int* step, const float* v, void* kc, void* vc, int cap,
                                            int cache_off, const long long* positions, const int* slots, int kv_dt) {
    if (step) offset += step[0], cache_off += step[0];
    extern __shared__ float rope_cs[];  // cos of frequency f at f, sin at half + f
    const size_t t = blockIdx.y;
    const int lane = threadIdx.x & 31, h = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const bool live = h < hq + hkv, is_q = h < hq;
    const int heads = is_q ? hq : hkv;
    const size_t at = live ? (t * heads + (is_q ? h : h - hq)) * (size_t)d : 0;
    const float* src = (is_q ? q : k) + at;
    // A paged store [positions, hkv * d] takes row t at its slot; a cache [hkv, cap, d] at cache_off + t.
    // (in values from the cache's start)
    auto cache_row = [&](int head) {
        return slots ? ((size_t)slots[t] * hkv + head) * d : ((size_t)head * cap + cache_off + t) * d;
    };
    // Where the head's output goes: an f32 query or key row, or a key row of the cache.
    const bool to_cache = !is_q && kc;
    void* dst = to_cache ? kc : is_q ? (void*)(qo + at) : (void*)(ko + at);
    const size_t dst_at = to_cache && live ? cache_row(h - hq) : 0;
    const int dst_dt = to_cache ? kv_dt : DT_F32;
    const void* w = is_q ? qw : kw;
    if (kc && h >= hq + hkv && h < hq + 2 * hkv) {  // a value row into its cache
        const int hv = h - hq - hkv;
        const float* vs = v + (t * hkv + hv) * (size_t)d;
        const size_t vd = cache_row(hv);
        for (int i = lane; i < d; i += 32) store_float(vc, vd + i, vs[i], kv_dt);
    }
    // Two rotation pairs per lane at a time (rope_pair's features a, b for f = f0 and f0 + 32),
    // loaded together; the first two before the cos/sin table is made (at decode they are all
    // there is).
    float x[2][2];
    auto load_pairs = [&](int f0) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            int a, b;
            rope_pair(f0 + 32 * u, half, traditional, a, b);
            if (f0 + 32 * u < half) x[u][0] = src[a], x[u][1] = src[b];
        }
    };
    float inv = 1.0f;
    if (live) {
        if (norm) {
            float s = 0.0f;
            for (int i = lane; i < d; i += 32) s = fmaf(src[i], src[i], s);
            inv = 1.0f / sqrtf(warp_sum(s) / (float)d + eps);
        }
        load_pairs(lane);
    }
    const float pos = (float)(positions ? positions[t] : offset + (long long)t);
    for (int f = threadIdx.x; f < half; f += blockDim.x) {
        float sn, cs;
        sincosf(pos * inv_freqs[f], &sn, &cs);
        rope_cs[f] = cs;
        rope_cs[half + f] = sn;
    }
    __syncthreads();
    if (!live) return;
    // Feature i as the rotation reads it: normalized first when `norm`.
    auto scaled = [&](float v, int i) { return norm ? v * inv * load_float(w, i, w_dt) : v; };
    for (int f0 = lane; f0 < half; f0 += 64) {
        if (f0 != lane) load_pairs(f0);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int f = f0 + 32 * u;
            if (f >= half) break;
            int a, b;
            rope_pair(f, half, traditional, a, b);
            const float x1 = scaled(x[u][0], a), x2 = scaled(x[u][1], b), cs = rope_cs[f], sn = rope_cs[half + f];
            store_float(dst, dst_at + a, rope_rotate(x1, x2, cs, sn, false), dst_dt);
            store_float(dst, dst_at + b, rope_rotate(x1, x2, cs, sn, true), dst_dt);
        }
    }
    for (int i = 2 * half + lane; i < d; i += 32) store_float(dst, dst_at + i, scaled(src[i], i), dst_dt);
}

extern "C" __global__ void rope_qk_f32(float* qo, float* ko, const float* q, const float* k, const void* qw,
                                       const void* kw, int w_dt, float eps, int norm, const float* inv_freqs,
                                       int half, int hq, int hkv, int d, long long offset, int traditional,
                                       const int* step) {
    pdl_begin();
    rope_qk_run(qo, ko, q, k, qw, kw, w_dt, eps, norm, inv_freqs, half, hq, hkv, d, offset, traditional, step,
                nullptr, nullptr, nullptr, 0, 0, nullptr, nullptr, DT_F32);
}
extern "C" __global__ void rope_qk_kv_f32(float* qo, void* kc, void* vc, const float* q, const float* k,
                                          const float* v, const void* qw, const void* kw, int w_dt, float eps,
                                          int norm, const float* inv_freqs, int half, int hq, int hkv, int d,
                                          long long offset, int traditional, const int* step, int cap,
                                          int cache_off, int kv_dt) {
    pdl_begin();
    rope_qk_run(qo, nullptr, q, k, qw, kw, w_dt, eps, norm, inv_freqs, half, hq, hkv, d, offset, traditional, step,
                v, kc, vc, cap, cache_off, nullptr, nullptr, kv_dt);
}
// A decode step of several paged sequences: row t of q, k, v at position positions[t], its key and
// value written into the stores kc, vc [positions, hkv * d] (of kv_dt) at row slots[t].
extern "C" __global__ void rope_qk_paged_f32(float* qo, void* kc, void* vc, const float* q, const float* k,
                                             const float* v, const void* qw, const void* kw, int w_dt, float eps,
                                             int norm, const float* inv_freqs, int half, int hq, int hkv, int d,
                                             int traditional, const long long* positions, const int* slots,
                                             int kv_dt) {
    pdl_begin();
    rope_qk_run(qo, nullptr, q, k, qw, kw, w_dt, eps, norm, inv_freqs, half, hq, hkv, d, 0, traditional, nullptr, v,
                kc, vc, 0, 0, positions, slots, kv_dt);
}

// New keys and values [n, a, c] (positions first, f32) into their caches [a, cap, c] (of kv_dt) at
// `offset`: write_axis1_rows of both in one grid (elements 0..n_each-1 are keys', the rest
// values'). `step`: as in rope_qk_f32.
extern "C" __global__ void write_kv_rows(void* kd, void* vd, const float* ks, const float* vs, size_t n_each, int a,
                                         int cap, int c, int offset, const int* step, int kv_dt) {
    pdl_begin();
    if (step) offset += step[0];
    FUSED_GRID_STRIDE(i, 2 * n_each) {
        bool values = i >= n_each;
        size_t e0 = values ? i - n_each : i;
        size_t e = e0 % c;
        size_t r = e0 / c;
        size_t ia = r % a;
        size_t j = r / a;
        store_float(values ? vd : kd, (ia * cap + offset + j) * c + e, (values ? vs : ks)[e0], kv_dt);
    }
}

// y [d] *= 1 / rms(h) for a row that qgemv_norm_b4_i4 wrote as u = h * w with its norm's scale
// pending in `parts` (common.cuh, xq_norm_scale): the norm's output, made when something other
// than an integer GEMV reads it. Grid-stride over d.
extern "C" __global__ void rms_settle_f32(float* y, const u32* parts, int d) {
    pdl_begin();
    const float scale = -xq_norm_scale(parts, d, true);  // 1 / rms(h)
    FUSED_GRID_STRIDE(i, (size_t)d) y[i] *= scale;
}
