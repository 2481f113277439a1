// Mixture-of-experts layers with nothing read back to the host, so that a decode step stays one
// CUDA graph: the router's top-k (moe_route), and for a few rows the chosen experts' gated MLPs
// read straight out of the layer's experts through an index of their buffers (moe_gate_up_*,
// then moe_down_*, which also takes the routing weights' sum). Accumulation is f32. Host side:
// backends/cuda/ops/moe.rs; the reference is the composed op of crates/nuvec/src/moe.rs.

// The index: for projection p (0 gate, 1 up, 2 down) and expert e, MOE_SLOTS u64 from
// (p * experts + e) * MOE_SLOTS: the weight (dense values or packed codes), its scales and
// biases (affine) or scales (fp modes), the projection's bias row (0: none), the f32 bits of an
// nvfp4 matrix's global factor (else 1.0f), and the f32 bits of the expert's factor on its
// routing weight (Gemma 4's per-expert scale; else 1.0f).
#define MOE_SLOTS 6
#define MOE_WARPS 4
#define MOE_MAX_EXPERTS 1024
#define MOE_MAX_TOP_K 32

#define MOE_ROUTE_SOFTMAX_TOPK 0
#define MOE_ROUTE_TOPK_SOFTMAX 1

#define MOE_ACT_SILU 0
#define MOE_ACT_SWIGLU_OAI 1
#define MOE_ACT_GELU_APPROX 2

#define MOE_FMT_DENSE 0
#define MOE_FMT_AFFINE 1
#define MOE_FMT_FP 2

// ids [rows, top_k], weights [rows, top_k] from logits [rows, experts]: one warp per row. The
// choice is made on the probabilities (softmax-top-k) or the logits (top-k-softmax), best first,
// ties to the lower index; a NaN is never chosen ahead of a number.
extern "C" __global__ void __launch_bounds__(32) moe_route(u32* __restrict__ ids, float* __restrict__ weights,
                                                           const float* __restrict__ logits, int experts, int top_k,
                                                           int mode, int normalize) {
    pdl_begin();
    __shared__ float v[MOE_MAX_EXPERTS];
    __shared__ float picked[MOE_MAX_TOP_K];
    const int lane = threadIdx.x;
    const float* row = logits + (size_t)blockIdx.x * experts;
    float mx = NEG_INF;
    for (int e = lane; e < experts; e += 32) {
        v[e] = row[e];
        mx = fmaxf(mx, v[e]);
    }
    mx = warp_max(mx);
    if (mode == MOE_ROUTE_SOFTMAX_TOPK) {
        float s = 0.0f;
        for (int e = lane; e < experts; e += 32) {
            v[e] = expf(v[e] - mx);
            s += v[e];
        }
        s = warp_sum(s);
        for (int e = lane; e < experts; e += 32) v[e] = v[e] / s;
    }
    u32 taken = 0;  // bit i: expert lane + 32 i is chosen
    u32* out_ids = ids + (size_t)blockIdx.x * top_k;
    for (int j = 0; j < top_k; ++j) {
        float best = NEG_INF;
        int bi = 0x7fffffff;
        for (int e = lane, i = 0; e < experts; e += 32, ++i) {
            if (taken >> i & 1u) continue;
            const float x = v[e];
            if (x > best || (x == best && e < bi)) best = x, bi = e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
        }
        if (bi == 0x7fffffff) {  // only NaNs left: the lowest index not yet chosen
            int lowest = 0x7fffffff;
            for (int e = lane, i = 0; e < experts; e += 32, ++i)
                if (!(taken >> i & 1u)) { lowest = e; break; }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) lowest = min(lowest, __shfl_xor_sync(0xffffffffu, lowest, o));
            bi = lowest;
            best = __int_as_float(0x7fc00000);
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == 0) {
            out_ids[j] = (u32)bi;
            picked[j] = best;
        }
    }
    if (lane == 0) {  // `picked` is lane 0's own
        float* w = weights + (size_t)blockIdx.x * top_k;
        if (mode == MOE_ROUTE_SOFTMAX_TOPK) {
            float total = 0.0f;
            for (int j = 0; j < top_k; ++j) total += picked[j];
            if (!normalize) total = 1.0f;
            for (int j = 0; j < top_k; ++j) w[j] = picked[j] / total;
        } else {
            float m = NEG_INF, s = 0.0f;
            for (int j = 0; j < top_k; ++j) m = fmaxf(m, picked[j]);
            for (int j = 0; j < top_k; ++j) s += expf(picked[j] - m);
            for (int j = 0; j < top_k; ++j) w[j] = expf(picked[j] - m) / s;
        }
    }
}

// The 32 weights of chunk c (columns 32c..32c+31) of row `row` of one expert's matrix of `k`
// columns, as f32. `dt`: the dense values' dtype (dense), the scales' dtype (affine), or the
// FP_* mode (fp); `lg`: log2 of the affine group size.
template <int FMT, int BITS>
__device__ __forceinline__ void moe_weights(const u64* ent, size_t row, int c, int k, int dt, int lg,
                                            float (&w)[32]) {
    const size_t first = row * (size_t)k + (size_t)c * 32;
    if constexpr (FMT == MOE_FMT_DENSE) {
        if (dt == DT_F32) {
            const float4* p = (const float4*)((const float*)ent[0] + first);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float4 q = __ldg(p + i);
                w[4 * i] = q.x, w[4 * i + 1] = q.y, w[4 * i + 2] = q.z, w[4 * i + 3] = q.w;
            }
        } else {
            const uint4* p = (const uint4*)((const u16*)ent[0] + first);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint4 q = __ldg(p + i);
                const u32 h[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const u16 lo = (u16)(h[j] & 0xffffu), hi = (u16)(h[j] >> 16);
                    w[8 * i + 2 * j] = dt == DT_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
                    w[8 * i + 2 * j + 1] = dt == DT_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
                }
            }
        }
    } else {
        u32 q[BITS];
        qg_load<BITS>(q, (const u32*)ent[0] + first / 32 * BITS);
        if constexpr (FMT == MOE_FMT_AFFINE) {
            float v[32];
            qg_decode<BITS>(q, v);
            const size_t gpr = (size_t)k >> lg, g0 = row * gpr + (((size_t)c << 5) >> lg),
                         g1 = row * gpr + ((((size_t)c << 5) + 16) >> lg);
            const void *sc = (const void*)ent[1], *bi = (const void*)ent[2];
            const float s0 = load_float(sc, g0, dt), b0 = load_float(bi, g0, dt);
            const float s1 = load_float(sc, g1, dt), b1 = load_float(bi, g1, dt);
#pragma unroll
            for (int j = 0; j < 16; ++j) w[j] = fmaf(s0, v[j], b0);
#pragma unroll
            for (int j = 16; j < 32; ++j) w[j] = fmaf(s1, v[j], b1);
        } else {
            // fp modes: e2m1 codes (mxfp4, nvfp4) or e4m3 (mxfp8), groups of 32 (e8m0 scales) or
            // 16 (nvfp4: e4m3 scales), the group scale times the global factor, as fp_linear.cu.
            const unsigned char* sc = (const unsigned char*)ent[1];
            const float factor = __uint_as_float((u32)ent[4]);
            const int group = dt == FP_NVFP4 ? 16 : 32;
            const size_t gpr = (size_t)(k / group);
            const size_t g0 = row * gpr + (size_t)c * 32 / group, g1 = row * gpr + ((size_t)c * 32 + 16) / group;
            const float s0 = (dt == FP_NVFP4 ? fp_e4m3(sc[g0]) : fp_e8m0(sc[g0])) * factor;
            const float s1 = (dt == FP_NVFP4 ? fp_e4m3(sc[g1]) : fp_e8m0(sc[g1])) * factor;
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                const float code = BITS == 8 ? fp_e4m3((q[j >> 2] >> (8 * (j & 3))) & 0xffu)
                                             : fp_e2m1((q[j >> 3] >> (4 * (j & 7))) & 0xfu);
                w[j] = code * (j < 16 ? s0 : s1);
            }
        }
    }
}

// Sum over one chunk: the 32 weights times x's 32 values (16-byte aligned).
__device__ __forceinline__ float moe_chunk_dot(const float (&w)[32], const float* __restrict__ x, float acc) {
    const float4* p = (const float4*)x;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float4 q = __ldg(p + i);
        acc = fmaf(w[4 * i], q.x, acc);
        acc = fmaf(w[4 * i + 1], q.y, acc);
        acc = fmaf(w[4 * i + 2], q.z, acc);
        acc = fmaf(w[4 * i + 3], q.w, acc);
    }
    return acc;
}

// The experts' activation of gate value g and up value u.
__device__ __forceinline__ float moe_activate(float g, float u, int activation, float alpha, float limit) {
    if (activation == MOE_ACT_SILU) return g / (1.0f + expf(-g)) * u;
    if (activation == MOE_ACT_SWIGLU_OAI) {  // gpt-oss's clamped SwiGLU, as gpt_oss.cu
        const float gc = fminf(g, limit);
        const float uc = u < -limit ? -limit : (u > limit ? limit : u);
        return (uc + 1.0f) * (gc * (1.0f / (1.0f + expf(-(alpha * gc)))));
    }
    // Gemma 4's GELU (tanh approximation), as gemma4.cu
    return 0.5f * g * (1.0f + tanhf(0.7978846f * (g + 0.044715f * (g * g * g)))) * u;
}

// act [rows * top_k, inter] = act(gate_e(x_t), up_e(x_t)) for each slot (t, j) with e = ids[t, j]:
// grid (inter / MOE_WARPS, rows * top_k), one warp per output row of both projections.
template <int FMT, int BITS>
__device__ __forceinline__ void moe_gate_up(float* __restrict__ act, const float* __restrict__ x,
                                            const u32* __restrict__ ids, const u64* __restrict__ index, int experts,
                                            int top_k, int inter, int hidden, int dt, int lg, int b_dt, int activation,
                                            float alpha, float limit) {
    const int slot = blockIdx.y, lane = threadIdx.x & 31;
    const int r = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (r >= inter) return;
    const u32 e = min(ids[slot], (u32)(experts - 1));
    const u64* g = index + ((size_t)e) * MOE_SLOTS;
    const u64* u = index + ((size_t)experts + e) * MOE_SLOTS;
    const float* xr = x + (size_t)(slot / top_k) * hidden;
    float ag = 0.0f, au = 0.0f;
    for (int c = lane; c < (hidden >> 5); c += 32) {
        float w[32];
        moe_weights<FMT, BITS>(g, r, c, hidden, dt, lg, w);
        ag = moe_chunk_dot(w, xr + 32 * c, ag);
        moe_weights<FMT, BITS>(u, r, c, hidden, dt, lg, w);
        au = moe_chunk_dot(w, xr + 32 * c, au);
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
    if (lane != 0) return;
    if (g[3]) ag += load_float((const void*)g[3], r, b_dt);
    if (u[3]) au += load_float((const void*)u[3], r, b_dt);
    act[(size_t)slot * inter + r] = moe_activate(ag, au, activation, alpha, limit);
}

// out [rows, hidden] = sum_j weights[t, j] s_e (down_e(act[t, j]) + bias_e) with e = ids[t, j]
// and s_e the expert's factor on its routing weight:
// grid (hidden / MOE_WARPS, rows), one warp per output row; its lanes take the (slot, chunk)
// pairs of all top_k slots.
template <int FMT, int BITS>
__device__ __forceinline__ void moe_down(float* __restrict__ out, const float* __restrict__ act,
                                         const u32* __restrict__ ids, const float* __restrict__ weights,
                                         const u64* __restrict__ index, int experts, int top_k, int hidden, int inter,
                                         int dt, int lg, int b_dt) {
    const int t = blockIdx.y, lane = threadIdx.x & 31;
    const int r = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (r >= hidden) return;
    const int chunks = inter >> 5;
    const u32* tid = ids + (size_t)t * top_k;
    const float* tw = weights + (size_t)t * top_k;
    float acc = 0.0f;
    for (int i = lane; i < top_k * chunks; i += 32) {
        const int j = i / chunks, c = i - j * chunks;
        const u32 e = min(tid[j], (u32)(experts - 1));
        const u64* ent = index + (2 * (size_t)experts + e) * MOE_SLOTS;
        float w[32];
        moe_weights<FMT, BITS>(ent, r, c, inter, dt, lg, w);
        const float weight = tw[j] * __uint_as_float((u32)ent[5]);
        acc = fmaf(weight, moe_chunk_dot(w, act + ((size_t)t * top_k + j) * inter + 32 * c, 0.0f), acc);
    }
    acc = warp_sum(acc);
    if (lane != 0) return;
    for (int j = 0; j < top_k; ++j) {
        const u64* ent = index + (2 * (size_t)experts + min(tid[j], (u32)(experts - 1))) * MOE_SLOTS;
        if (ent[3]) acc = fmaf(tw[j] * __uint_as_float((u32)ent[5]), load_float((const void*)ent[3], r, b_dt), acc);
    }
    out[(size_t)t * hidden + r] = acc;
}

// Many rows (a prefill) run grouped: the slots (token, choice) sorted by expert into tiles of
// MOE_TILE (moe_align), each tile one tensor-core product against its expert's weights
// (qmma.cu's qmma_bN_g64: gate and up into gu [slots, 2 inter], then down into y [slots,
// hidden]), the activation between them (moe_act_bf16) and the weighted sum per token in choice
// order (moe_combine), so no order of the tiles or of the slots in them changes a result.
#define MOE_TILE 64

// order [tiles * MOE_TILE]: each expert's slots (indices into ids [slots]) in a run of whole
// tiles, experts in order, -1 after an expert's last slot; tile_expert [tiles]: the expert of
// each tile, -1 for tiles past the last (`tiles` is the host's bound, slots / MOE_TILE rounded up
// plus one per expert). One block of 1024 threads; an id past the experts counts as the last
// expert, as the gathered kernels take it.
extern "C" __global__ void __launch_bounds__(1024) moe_align(int* __restrict__ order, int* __restrict__ tile_expert,
                                                             const u32* __restrict__ ids, int slots, int experts,
                                                             int tiles) {
    pdl_begin();
    __shared__ int count[MOE_MAX_EXPERTS], first[MOE_MAX_EXPERTS];
    __shared__ int used;
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int e = tid; e < experts; e += nt) count[e] = 0;
    __syncthreads();
    for (int s = tid; s < slots; s += nt) atomicAdd(&count[min(ids[s], (u32)(experts - 1))], 1);
    __syncthreads();
    if (tid == 0) {
        int t = 0;
        for (int e = 0; e < experts; ++e) {
            first[e] = t;
            t += (count[e] + MOE_TILE - 1) / MOE_TILE;
        }
        used = t;
    }
    __syncthreads();
    for (int e = tid; e < experts; e += nt) {
        const int n = (count[e] + MOE_TILE - 1) / MOE_TILE;
        for (int i = 0; i < n; ++i) tile_expert[first[e] + i] = e;
        count[e] = 0;  // from here on, the next free place in the expert's run
    }
    for (int t = used + tid; t < tiles; t += nt) tile_expert[t] = -1;
    for (int i = tid; i < tiles * MOE_TILE; i += nt) order[i] = -1;
    __syncthreads();
    for (int s = tid; s < slots; s += nt) {
        const int e = min(ids[s], (u32)(experts - 1));
        order[first[e] * MOE_TILE + atomicAdd(&count[e], 1)] = s;
    }
}

// act [slots, inter] bf16 = act(gate + bias, up + bias) of gu [slots, 2 inter] (gate values, then
// up values), with the bias rows of each slot's expert.
extern "C" __global__ void moe_act_bf16(u16* __restrict__ act, const float* __restrict__ gu, const u32* __restrict__ ids,
                                        const u64* __restrict__ index, int experts, int inter, int b_dt,
                                        int activation, float alpha, float limit, size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t slot = i / inter;
        const int r = (int)(i - slot * inter);
        const u32 e = min(ids[slot], (u32)(experts - 1));
        const u64 *g = index + (size_t)e * MOE_SLOTS, *u = index + ((size_t)experts + e) * MOE_SLOTS;
        float ag = gu[slot * 2 * inter + r], au = gu[slot * 2 * inter + inter + r];
        if (g[3]) ag += load_float((const void*)g[3], r, b_dt);
        if (u[3]) au += load_float((const void*)u[3], r, b_dt);
        act[i] = (u16)bf16_rn(moe_activate(ag, au, activation, alpha, limit));
    }
}

// out [rows, hidden] = sum_j weights[t, j] s_e (y[t top_k + j] + bias_e), in choice order, with
// e = ids[t, j] and s_e the expert's factor on its routing weight.
extern "C" __global__ void moe_combine(float* __restrict__ out, const float* __restrict__ y, const u32* __restrict__ ids,
                                       const float* __restrict__ weights, const u64* __restrict__ index, int experts,
                                       int top_k, int hidden, int b_dt, size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / hidden;
        const int r = (int)(i - t * hidden);
        float acc = 0.0f;
        for (int j = 0; j < top_k; ++j) {
            const size_t slot = t * top_k + j;
            const u64* ent = index + (2 * (size_t)experts + min(ids[slot], (u32)(experts - 1))) * MOE_SLOTS;
            float v = y[slot * hidden + r];
            if (ent[3]) v += load_float((const void*)ent[3], r, b_dt);
            acc = fmaf(weights[slot] * __uint_as_float((u32)ent[5]), v, acc);
        }
        out[i] = acc;
    }
}

// out [rows, width] = a + sigmoid(gate[row]) * b: a shared expert under its per-row gate
// (Qwen3.5-MoE), as the host adds it.
extern "C" __global__ void moe_shared_add(float* __restrict__ out, const float* __restrict__ a,
                                          const float* __restrict__ b, const float* __restrict__ gate, int width,
                                          size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = 1.0f / (1.0f + expf(-gate[i / width]));
        out[i] = a[i] + g * b[i];
    }
}

#define MOE_GU_PARAMS                                                                                            \
    float *act, const float *x, const u32 *ids, const u64 *index, int experts, int top_k, int inter, int hidden, \
        int dt, int lg, int b_dt, int activation, float alpha, float limit
#define MOE_GU_ARGS act, x, ids, index, experts, top_k, inter, hidden, dt, lg, b_dt, activation, alpha, limit
#define MOE_DOWN_PARAMS                                                                                        \
    float *out, const float *act, const u32 *ids, const float *weights, const u64 *index, int experts, int top_k, \
        int hidden, int inter, int dt, int lg, int b_dt
#define MOE_DOWN_ARGS out, act, ids, weights, index, experts, top_k, hidden, inter, dt, lg, b_dt

// One pair per weight format (the host picks by the experts' format; written out, as the host
// finds kernels by their `extern "C"` names).
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_dense(MOE_GU_PARAMS) { pdl_begin(); moe_gate_up<MOE_FMT_DENSE, 1>(MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_dense(MOE_DOWN_PARAMS) { pdl_begin(); moe_down<MOE_FMT_DENSE, 1>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b2(MOE_GU_PARAMS) { pdl_begin(); moe_gate_up<MOE_FMT_AFFINE, 2>(MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b2(MOE_DOWN_PARAMS) { pdl_begin(); moe_down<MOE_FMT_AFFINE, 2>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b3(MOE_GU_PARAMS) { pdl_begin(); moe_gate_up<MOE_FMT_AFFINE, 3>(MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b3(MOE_DOWN_PARAMS) { pdl_begin(); moe_down<MOE_FMT_AFFINE, 3>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b4(MOE_GU_PARAMS) { pdl_begin(); moe_gate_up<MOE_FMT_AFFINE, 4>(MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b4(MOE_DOWN_PARAMS) { pdl_begin(); moe_down<MOE_FMT_AFFINE, 4>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b5(MOE_GU_PARAMS) { pdl_begin(); moe_gate_up<MOE_FMT_AFFINE, 5>(MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b5(MOE_DOWN_PARAMS) { pdl_begin(); moe_down<MOE_FMT_AFFINE, 5>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b6(MOE_GU_PARAMS) { pdl_begin(); moe_gate_up<MOE_FMT_AFFINE, 6>(MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b6(MOE_DOWN_PARAMS) { pdl_begin(); moe_down<MOE_FMT_AFFINE, 6>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b8(MOE_GU_PARAMS) { pdl_begin(); moe_gate_up<MOE_FMT_AFFINE, 8>(MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b8(MOE_DOWN_PARAMS) { pdl_begin(); moe_down<MOE_FMT_AFFINE, 8>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_fp4(MOE_GU_PARAMS) { pdl_begin(); moe_gate_up<MOE_FMT_FP, 4>(MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_fp4(MOE_DOWN_PARAMS) { pdl_begin(); moe_down<MOE_FMT_FP, 4>(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_fp8(MOE_GU_PARAMS) { pdl_begin(); moe_gate_up<MOE_FMT_FP, 8>(MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_fp8(MOE_DOWN_PARAMS) { pdl_begin(); moe_down<MOE_FMT_FP, 8>(MOE_DOWN_ARGS); }
