// Mixture-of-experts layers with nothing read back to the host, so that a decode step stays one
// CUDA graph (the router's top-k: moe_router.cu): for a few rows the chosen experts' gated MLPs
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

#define MOE_ACT_SILU 0
#define MOE_ACT_SWIGLU_OAI 1
#define MOE_ACT_GELU_APPROX 2

#define MOE_FMT_DENSE 0
#define MOE_FMT_AFFINE 1
#define MOE_FMT_FP 2

// One 32-value chunk of a quantized expert row as loaded: its BITS words and the scale and bias
// (affine) or scale (fp modes; no bias) of its two 16-value halves. The many-row kernels below
// load every row's chunk before they decode any, so that each lane has all those loads in flight.
template <int BITS>
struct MoeChunk {
    u32 q[BITS];
    float s0, b0, s1, b1;
};

// Loads chunk c (columns 32c..32c+31) of row `row` of one expert's quantized matrix of `k`
// columns. `dt`: the scales' dtype (affine) or the FP_* mode (fp); `lg`: log2 of the affine
// group size. SDT: the affine scales' dtype when the caller knows it (else -1: `dt`); ONE: the
// chunk lies in one group (groups of 32 and more), so one scale (and bias) is loaded for both
// halves. Each specialization loads the same values the general one does.
template <int FMT, int BITS, int SDT = -1, bool ONE = false>
__device__ __forceinline__ void moe_load(const u64* ent, size_t row, int c, int k, int dt, int lg,
                                         MoeChunk<BITS>& m) {
    const size_t first = row * (size_t)k + (size_t)c * 32;
    qg_load<BITS>(m.q, (const u32*)ent[0] + first / 32 * BITS);
    if constexpr (FMT == MOE_FMT_AFFINE) {
        const int sdt = SDT >= 0 ? SDT : dt;
        const size_t gpr = (size_t)k >> lg, g0 = row * gpr + (((size_t)c << 5) >> lg);
        const void *sc = (const void*)ent[1], *bi = (const void*)ent[2];
        m.s0 = load_float(sc, g0, sdt), m.b0 = load_float(bi, g0, sdt);
        if constexpr (ONE) {
            m.s1 = m.s0, m.b1 = m.b0;
        } else {
            const size_t g1 = row * gpr + ((((size_t)c << 5) + 16) >> lg);
            m.s1 = load_float(sc, g1, sdt), m.b1 = load_float(bi, g1, sdt);
        }
    } else {
        // e2m1 codes (mxfp4, nvfp4) or e4m3 (mxfp8), groups of 32 (e8m0 scales) or 16 (nvfp4:
        // e4m3 scales), the group scale times the global factor, as fp_linear.cu.
        const unsigned char* sc = (const unsigned char*)ent[1];
        const float factor = __uint_as_float((u32)ent[4]);
        const int group = dt == FP_NVFP4 ? 16 : 32;
        const size_t gpr = (size_t)(k / group);
        const size_t g0 = row * gpr + (size_t)c * 32 / group;
        m.s0 = (dt == FP_NVFP4 ? fp_e4m3(sc[g0]) : fp_e8m0(sc[g0])) * factor;
        if constexpr (ONE) {
            m.s1 = m.s0;
        } else {
            const size_t g1 = row * gpr + ((size_t)c * 32 + 16) / group;
            m.s1 = (dt == FP_NVFP4 ? fp_e4m3(sc[g1]) : fp_e8m0(sc[g1])) * factor;
        }
        m.b0 = m.b1 = 0.0f;
    }
}

// A loaded chunk's 32 weights as f32.
template <int FMT, int BITS>
__device__ __forceinline__ void moe_decode(const MoeChunk<BITS>& m, float (&w)[32]) {
    if constexpr (FMT == MOE_FMT_AFFINE) {
        float v[32];
        qg_decode<BITS>(m.q, v);
#pragma unroll
        for (int j = 0; j < 16; ++j) w[j] = fmaf(m.s0, v[j], m.b0);
#pragma unroll
        for (int j = 16; j < 32; ++j) w[j] = fmaf(m.s1, v[j], m.b1);
    } else {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const float code = BITS == 8 ? fp_e4m3((m.q[j >> 2] >> (8 * (j & 3))) & 0xffu)
                                         : fp_e2m1((m.q[j >> 3] >> (4 * (j & 7))) & 0xfu);
            w[j] = code * (j < 16 ? m.s0 : m.s1);
        }
    }
}

// Two e2m1 codes of a word as f32: the nibbles at bits `shift` and `shift` + 16 of q. A code
// (sign bit 3, exponent bits 2-1, mantissa bit 0) placed at f16 bits 15 and 11-9 is its value
// times 2^-14 exactly (the zero exponent, 0 and 0.5, lands on f16's subnormals with the same
// factor), so two masks, shifts and widenings decode a pair where fp_e2m1 spent a dozen
// instructions per value; the chunk's dot product takes the 2^14 back with its scale.
__device__ __forceinline__ void fp4_pair(u32 q, int shift, float& a, float& b) {
    const u32 v = q >> shift;
    const u32 h = ((v & 0x00070007u) << 9) | ((v & 0x00080008u) << 12);
    a = f16_to_f32((u16)(h & 0xffffu));
    b = f16_to_f32((u16)(h >> 16));
}

// The 32 values of chunk c (columns 32c..32c+31) of row `row` of one dense expert matrix of `k`
// columns (dtype `dt`: f32, f16 or bf16), as f32.
__device__ __forceinline__ void moe_dense_weights(const u64* ent, size_t row, int c, int k, int dt,
                                                  float (&w)[32]) {
    const size_t first = row * (size_t)k + (size_t)c * 32;
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
}

// A chunk of x (16-byte aligned) in registers.
__device__ __forceinline__ void moe_chunk_x(const float* __restrict__ x, float (&v)[32]) {
    const float4* p = (const float4*)x;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float4 q = __ldg(p + i);
        v[4 * i] = q.x, v[4 * i + 1] = q.y, v[4 * i + 2] = q.z, v[4 * i + 3] = q.w;
    }
}

// acc plus the sum over one chunk of the 32 weights times x's 32 values, in order.
__device__ __forceinline__ float moe_dot(const float (&w)[32], const float (&v)[32], float acc) {
#pragma unroll
    for (int i = 0; i < 32; ++i) acc = fmaf(w[i], v[i], acc);
    return acc;
}

// acc plus a loaded chunk's 32 weights times x's 32 values. e2m1 codes (mxfp4, nvfp4): each half's
// codes times x summed (fp4_pair's values, 2^-14 times the codes), then times 2^14 (exact) and
// the half's scale; every other format: its weights decoded (moe_decode), then moe_dot.
template <int FMT, int BITS>
__device__ __forceinline__ float moe_chunk_dot(const MoeChunk<BITS>& m, const float (&v)[32], float acc) {
    if constexpr (FMT == MOE_FMT_FP && BITS == 4) {
        float half[2] = {0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < 4; ++w)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float a, b;
                fp4_pair(m.q[w], 4 * i, a, b);
                half[w >> 1] = fmaf(a, v[8 * w + i], half[w >> 1]);
                half[w >> 1] = fmaf(b, v[8 * w + i + 4], half[w >> 1]);
            }
        acc = fmaf(m.s0, half[0] * 16384.0f, acc);
        return fmaf(m.s1, half[1] * 16384.0f, acc);
    } else {
        float w[32];
        moe_decode<FMT, BITS>(m, w);
        return moe_dot(w, v, acc);
    }
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

// act [rows * top_k, inter] = act(gate_e(x_t), up_e(x_t)) for each slot (t, j) with e = ids[t, j],
// for dense experts: grid (inter / MOE_WARPS, rows * top_k), one warp per output row of both
// projections. (The quantized formats take moe_gate_up_rows below.)
__device__ __forceinline__ void moe_gate_up_dense_body(float* __restrict__ act, const float* __restrict__ x,
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
        float w[32], xv[32];
        moe_chunk_x(xr + 32 * c, xv);
        moe_dense_weights(g, r, c, hidden, dt, w);
        ag = moe_dot(w, xv, ag);
        moe_dense_weights(u, r, c, hidden, dt, w);
        au = moe_dot(w, xv, au);
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
    if (lane != 0) return;
    if (g[3]) ag += load_float((const void*)g[3], r, b_dt);
    if (u[3]) au += load_float((const void*)u[3], r, b_dt);
    act[(size_t)slot * inter + r] = moe_activate(ag, au, activation, alpha, limit);
}

// out [rows, hidden] = sum_j weights[t, j] s_e (down_e(act[t, j]) + bias_e) with e = ids[t, j]
// and s_e the expert's factor on its routing weight, for dense experts: grid (hidden / MOE_WARPS,
// rows), one warp per output row; its lanes take the (slot, chunk) pairs of all top_k slots.
__device__ __forceinline__ void moe_down_dense_body(float* __restrict__ out, const float* __restrict__ act,
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
        moe_dense_weights(ent, r, c, inter, dt, w);
        const float weight = tw[j] * __uint_as_float((u32)ent[5]);
        float av[32];
        moe_chunk_x(act + ((size_t)t * top_k + j) * inter + 32 * c, av);
        acc = fmaf(weight, moe_dot(w, av, 0.0f), acc);
    }
    acc = warp_sum(acc);
    if (lane != 0) return;
    for (int j = 0; j < top_k; ++j) {
        const u64* ent = index + (2 * (size_t)experts + min(tid[j], (u32)(experts - 1))) * MOE_SLOTS;
        if (ent[3]) acc = fmaf(tw[j] * __uint_as_float((u32)ent[5]), load_float((const void*)ent[3], r, b_dt), acc);
    }
    out[(size_t)t * hidden + r] = acc;
}

// The quantized formats' kernels, for the rows a decode step has (one per sequence): each warp
// of moe_gate_up_rows takes R output rows of both projections and each block of moe_down_rows R
// output rows, so that a lane loads x's (or the activation's) chunk once for R rows and has all
// their chunk loads in flight together, and the expert pointers are read once, not per chunk (a
// warp per row, as the dense kernels above, waited on that chain of loads in turn and reached a
// fifth of the memory bandwidth). moe_gate_up_rows sums each row in the dense kernel's order (e2m1 codes: by
// halves, moe_chunk_dot).
#define MOE_DOWN_ROWS 4

// gate_up's rows per warp: fewer for the wider codes, whose loaded chunks take more registers.
template <int BITS>
__device__ constexpr int moe_gu_rows() {
    return BITS <= 4 ? 4 : 2;
}

// As moe_gate_up_dense_body, R rows per warp: grid (inter / (MOE_WARPS R), rows * top_k).
// SDT, ONE: as moe_load's.
template <int FMT, int BITS, int R, int SDT, bool ONE>
__device__ __forceinline__ void moe_gate_up_rows(float* __restrict__ act, const float* __restrict__ x,
                                                 const u32* __restrict__ ids, const u64* __restrict__ index,
                                                 int experts, int top_k, int inter, int hidden, int dt, int lg,
                                                 int b_dt, int activation, float alpha, float limit) {
    const int slot = blockIdx.y, lane = threadIdx.x & 31;
    const int r0 = (blockIdx.x * MOE_WARPS + (threadIdx.x >> 5)) * R;
    if (r0 >= inter) return;
    const u32 e = min(ids[slot], (u32)(experts - 1));
    const u64* g = index + ((size_t)e) * MOE_SLOTS;
    const u64* u = index + ((size_t)experts + e) * MOE_SLOTS;
    const float* xr = x + (size_t)(slot / top_k) * hidden;
    float ag[R], au[R];
#pragma unroll
    for (int r = 0; r < R; ++r) ag[r] = au[r] = 0.0f;
    for (int c = lane; c < (hidden >> 5); c += 32) {
        MoeChunk<BITS> mg[R], mu[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {  // rows past the last load the last one's, never stored
            const size_t row = (size_t)min(r0 + r, inter - 1);
            moe_load<FMT, BITS, SDT, ONE>(g, row, c, hidden, dt, lg, mg[r]);
            moe_load<FMT, BITS, SDT, ONE>(u, row, c, hidden, dt, lg, mu[r]);
        }
        float xv[32];
        moe_chunk_x(xr + 32 * c, xv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            ag[r] = moe_chunk_dot<FMT, BITS>(mg[r], xv, ag[r]);
            au[r] = moe_chunk_dot<FMT, BITS>(mu[r], xv, au[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) ag[r] = warp_sum(ag[r]), au[r] = warp_sum(au[r]);
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r0 + r >= inter) break;
        if (g[3]) ag[r] += load_float((const void*)g[3], r0 + r, b_dt);
        if (u[3]) au[r] += load_float((const void*)u[3], r0 + r, b_dt);
        act[(size_t)slot * inter + r0 + r] = moe_activate(ag[r], au[r], activation, alpha, limit);
    }
}

// The down kernels' shared parts. Each slot's expert entry and its routing weight times the
// expert's factor for token t, read once by the block's first top_k threads.
__device__ __forceinline__ void moe_down_slots(const u64** ents, float* scaled, int t, const u32* __restrict__ ids,
                                               const float* __restrict__ weights, const u64* __restrict__ index,
                                               int experts, int top_k) {
    if (threadIdx.x < top_k) {
        const u64* ent =
            index + (2 * (size_t)experts + min(ids[(size_t)t * top_k + threadIdx.x], (u32)(experts - 1))) * MOE_SLOTS;
        ents[threadIdx.x] = ent;
        scaled[threadIdx.x] = weights[(size_t)t * top_k + threadIdx.x] * __uint_as_float((u32)ent[5]);
    }
    __syncthreads();
}
// out[t, r0 + r] for the block's R rows: each thread's sums over its (slot, chunk) pairs `acc`,
// added by warp, then across the warps in warp order, then the slots' bias rows.
template <int R>
__device__ __forceinline__ void moe_down_store(float* __restrict__ out, float (&acc)[R], float (*part)[R],
                                               const u64* const* ents, const float* scaled, int t, int r0,
                                               int hidden, int top_k, int b_dt) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; ++r) part[warp][r] = acc[r];
    __syncthreads();
    const int r = threadIdx.x;
    if (r >= R || r0 + r >= hidden) return;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < MOE_WARPS; ++w) sum += part[w][r];
    for (int j = 0; j < top_k; ++j)
        if (ents[j][3]) sum = fmaf(scaled[j], load_float((const void*)ents[j][3], r0 + r, b_dt), sum);
    out[(size_t)t * hidden + r0 + r] = sum;
}

// As moe_down_dense_body, R output rows per block: grid (hidden / R, rows); the block's lanes
// take the (slot, chunk) pairs of all top_k slots, the warps' sums meet in shared memory in warp
// order.
template <int FMT, int BITS, int R, int SDT, bool ONE>
__device__ __forceinline__ void moe_down_rows(float* __restrict__ out, const float* __restrict__ act,
                                              const u32* __restrict__ ids, const float* __restrict__ weights,
                                              const u64* __restrict__ index, int experts, int top_k, int hidden,
                                              int inter, int dt, int lg, int b_dt) {
    __shared__ const u64* ents[MOE_MAX_TOP_K];
    __shared__ float scaled[MOE_MAX_TOP_K];
    __shared__ float part[MOE_WARPS][R];
    const int t = blockIdx.y;
    const int r0 = blockIdx.x * R;
    moe_down_slots(ents, scaled, t, ids, weights, index, experts, top_k);
    const int chunks = inter >> 5;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int i = threadIdx.x; i < top_k * chunks; i += 32 * MOE_WARPS) {
        const int j = i / chunks, c = i - j * chunks;
        MoeChunk<BITS> m[R];
#pragma unroll
        for (int r = 0; r < R; ++r)
            moe_load<FMT, BITS, SDT, ONE>(ents[j], (size_t)min(r0 + r, hidden - 1), c, inter, dt, lg, m[r]);
        float av[32];
        moe_chunk_x(act + ((size_t)t * top_k + j) * inter + 32 * c, av);
        const float weight = scaled[j];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = fmaf(weight, moe_chunk_dot<FMT, BITS>(m[r], av, 0.0f), acc[r]);
    }
    moe_down_store<R>(out, acc, part, ents, scaled, t, r0, hidden, top_k, b_dt);
}

// The rows kernels' specializations, picked per launch: bf16 scales in groups of 32 and more
// (mlx-community's quantized experts) and fp groups of 32 (mxfp4, mxfp8) load one scale per chunk
// without a dtype branch; other groups and scale dtypes take the general form.
#define MOE_PICK(KERNEL, FMT, BITS, R, ARGS)                                     \
    do {                                                                           \
        if (FMT == MOE_FMT_AFFINE && lg >= 5 && dt == DT_BF16)                     \
            KERNEL<FMT, BITS, R, DT_BF16, true>(ARGS);                             \
        else if (FMT == MOE_FMT_FP && dt != FP_NVFP4)                              \
            KERNEL<FMT, BITS, R, -1, true>(ARGS);                                  \
        else                                                                       \
            KERNEL<FMT, BITS, R, -1, false>(ARGS);                                 \
    } while (0)

// 4-bit experts on integer dot products (as linear.cu's one-row GEMVs, qgemv4i_acc): affine
// ones in groups of 32 and more, mxfp4 ones (e2m1 codes, an e8m0 scale per 32). x and the
// activations come as xsplit_f32's parts, several rows split as one (row i's chunks after row
// i - 1's), and each (row, chunk) word costs 2 masks, a shift and 6 dp4a (affine: qi4_sums) or
// two table lookups and 6 dp4a (e2m1: qfp4_sums) where the f32 rows kernels above decode every
// value (they were bound by instructions issued, as the f32 GEMVs had been). One row's parts may
// be a norm's with its scale pending (negated scales: xq_norm_scale); split parts never are.
//
// A chunk's 16-byte codes and its scale (affine: its group's scale and bias, of dtype SDT; mxfp4:
// the e8m0 scale times the global factor, halved for qfp4_sums' doubled codes, and no bias).
template <int FMT, int SDT>
__device__ __forceinline__ void moe_load_int(const u64* ent, size_t row, int c, int k, int lg, uint4& w, float& s,
                                             float& b) {
    const size_t chunks = (size_t)k >> 5;
    w = __ldg((const uint4*)((const u32*)ent[0] + (row * chunks + c) * 4));
    if constexpr (FMT == MOE_FMT_AFFINE) {
        const size_t g = row * ((size_t)k >> lg) + (((size_t)c << 5) >> lg);
        s = load_float((const void*)ent[1], g, SDT), b = load_float((const void*)ent[2], g, SDT);
    } else {
        s = fp_e8m0(((const unsigned char*)ent[1])[row * chunks + c]) * (0.5f * __uint_as_float((u32)ent[4]));
        b = 0.0f;
    }
}
// Row r's chunk total before x's chunk scale (xsc) and sum (xs): affine s Σ(code x) + b Σx,
// mxfp4 s Σ(2 value x).
template <int FMT, int ROWS>
__device__ __forceinline__ void moe_int_sums(const uint4 (&w)[ROWS], const u32* __restrict__ xq_chunk,
                                             int (&S)[ROWS][3]) {
    if constexpr (FMT == MOE_FMT_AFFINE) qi4_sums<ROWS>(w, xq_chunk, S);
    else qfp4_sums<ROWS>(w, xq_chunk, S);
}
template <int FMT>
__device__ __forceinline__ float moe_int_total(const int (&S)[3], float s, float b, float xsc, float xs) {
    if constexpr (FMT == MOE_FMT_AFFINE) return s * (qi_total(S) * xsc) + b * xs;
    else return s * (qi_total(S) * xsc);
}

// Warps per block of the integer gate/up kernels: with R = moe_gu_rows<4>() rows each, a block
// makes one 32-value chunk of the activations, which it writes as the down kernel's parts.
#define MOE_GU_INT_WARPS 8

// As moe_gate_up_rows (4-bit: R = moe_gu_rows<4>() rows of gate and of up per warp) over x's
// parts `xq` (gridDim.y / top_k rows of `hidden` values): grid (inter / 32, rows * top_k), blocks
// of MOE_GU_INT_WARPS warps, inter a multiple of 32. The activations go out as xsplit_f32's parts
// `aq` of all slots' rows as one (slot s's chunks after slot s - 1's), what moe_down_int reads:
// each block's 32 values meet in shared memory and its first warp splits them (xsplit_chunk).
template <int FMT, int SDT>
__device__ __forceinline__ void moe_gate_up_int(u32* __restrict__ aq, const u32* __restrict__ xq,
                                                const u32* __restrict__ ids, const u64* __restrict__ index,
                                                int experts, int top_k, int inter, int hidden, int lg, int b_dt,
                                                int activation, float alpha, float limit) {
    constexpr int R = moe_gu_rows<4>();
    static_assert(R * MOE_GU_INT_WARPS == 32, "a block makes one chunk of the activations");
    __shared__ float chunk[32];
    const int slot = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = (blockIdx.x * MOE_GU_INT_WARPS + warp) * R;
    const u32 e = min(ids[slot], (u32)(experts - 1));
    const u64* g = index + ((size_t)e) * MOE_SLOTS;
    const u64* u = index + ((size_t)experts + e) * MOE_SLOTS;
    const int chunks = hidden >> 5, total = (int)(gridDim.y / top_k) * chunks, c0 = (slot / top_k) * chunks;
    const float* __restrict__ xscale = (const float*)(xq + (size_t)total * QI_WORDS);
    const float* __restrict__ xsum = xscale + total;
    float acc[2 * R];
#pragma unroll
    for (int r = 0; r < 2 * R; ++r) acc[r] = 0.0f;
    bool pending = false;
    for (int c = lane; c < chunks; c += 32) {
        uint4 w[2 * R];
        float s[2 * R], b[2 * R];
#pragma unroll
        for (int r = 0; r < R; ++r) {  // rows past the last load the last one's, never stored
            const size_t row = (size_t)min(r0 + r, inter - 1);
            moe_load_int<FMT, SDT>(g, row, c, hidden, lg, w[r], s[r], b[r]);
            moe_load_int<FMT, SDT>(u, row, c, hidden, lg, w[R + r], s[R + r], b[R + r]);
        }
        int S[2 * R][3];
        moe_int_sums<FMT, 2 * R>(w, xq + (size_t)(c0 + c) * QI_WORDS, S);
        const float xsc = __ldg(xscale + c0 + c), xs = __ldg(xsum + c0 + c);
        pending = xsc < 0.0f;
#pragma unroll
        for (int r = 0; r < 2 * R; ++r) acc[r] += moe_int_total<FMT>(S[r], s[r], b[r], xsc, xs);
    }
#pragma unroll
    for (int r = 0; r < 2 * R; ++r) acc[r] = warp_sum(acc[r]);
    // Only one row's parts can be a norm's (pending); its tail follows its sums as for a K-value x.
    const float scale = xq_norm_scale(xq, hidden, pending);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float ag = acc[r] * scale, au = acc[R + r] * scale;
            if (g[3]) ag += load_float((const void*)g[3], r0 + r, b_dt);
            if (u[3]) au += load_float((const void*)u[3], r0 + r, b_dt);
            chunk[warp * R + r] = moe_activate(ag, au, activation, alpha, limit);
        }
    }
    __syncthreads();
    const int act_chunks = inter >> 5;
    if (warp == 0) xsplit_chunk(aq, (int)gridDim.y * act_chunks, slot * act_chunks + (int)blockIdx.x, chunk[lane], lane);
}

// As moe_down_rows over the activations' parts `aq` (gridDim.y * top_k rows of `inter` values):
// grid (hidden / MOE_DOWN_ROWS, rows).
template <int FMT, int SDT>
__device__ __forceinline__ void moe_down_int(float* __restrict__ out, const u32* __restrict__ aq,
                                             const u32* __restrict__ ids, const float* __restrict__ weights,
                                             const u64* __restrict__ index, int experts, int top_k, int hidden,
                                             int inter, int lg, int b_dt) {
    constexpr int R = MOE_DOWN_ROWS;
    __shared__ const u64* ents[MOE_MAX_TOP_K];
    __shared__ float scaled[MOE_MAX_TOP_K];
    __shared__ float part[MOE_WARPS][R];
    const int t = blockIdx.y;
    const int r0 = blockIdx.x * R;
    moe_down_slots(ents, scaled, t, ids, weights, index, experts, top_k);
    const int chunks = inter >> 5, total = (int)gridDim.y * top_k * chunks;
    const float* __restrict__ ascale = (const float*)(aq + (size_t)total * QI_WORDS);
    const float* __restrict__ asum = ascale + total;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int i = threadIdx.x; i < top_k * chunks; i += 32 * MOE_WARPS) {
        const int j = i / chunks, c = i - j * chunks;
        uint4 w[R];
        float s[R], b[R];
#pragma unroll
        for (int r = 0; r < R; ++r)
            moe_load_int<FMT, SDT>(ents[j], (size_t)min(r0 + r, hidden - 1), c, inter, lg, w[r], s[r], b[r]);
        const int ac = (t * top_k + j) * chunks + c;
        int S[R][3];
        moe_int_sums<FMT, R>(w, aq + (size_t)ac * QI_WORDS, S);
        const float asc = __ldg(ascale + ac), as = __ldg(asum + ac), weight = scaled[j];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = fmaf(weight, moe_int_total<FMT>(S[r], s[r], b[r], asc, as), acc[r]);
    }
    moe_down_store<R>(out, acc, part, ents, scaled, t, r0, hidden, top_k, b_dt);
}

// The affine integer kernels' instances by scale dtype.
#define MOE_INT_PICK(KERNEL, ...)                                                    \
    do {                                                                             \
        if (dt == DT_BF16) KERNEL<MOE_FMT_AFFINE, DT_BF16>(__VA_ARGS__);             \
        else if (dt == DT_F16) KERNEL<MOE_FMT_AFFINE, DT_F16>(__VA_ARGS__);          \
        else KERNEL<MOE_FMT_AFFINE, DT_F32>(__VA_ARGS__);                            \
    } while (0)

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
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_dense(MOE_GU_PARAMS) { pdl_begin(); moe_gate_up_dense_body(MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_dense(MOE_DOWN_PARAMS) { pdl_begin(); moe_down_dense_body(MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b2(MOE_GU_PARAMS) { pdl_begin(); MOE_PICK(moe_gate_up_rows, MOE_FMT_AFFINE, 2, moe_gu_rows<2>(), MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b2(MOE_DOWN_PARAMS) { pdl_begin(); MOE_PICK(moe_down_rows, MOE_FMT_AFFINE, 2, MOE_DOWN_ROWS, MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b3(MOE_GU_PARAMS) { pdl_begin(); MOE_PICK(moe_gate_up_rows, MOE_FMT_AFFINE, 3, moe_gu_rows<3>(), MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b3(MOE_DOWN_PARAMS) { pdl_begin(); MOE_PICK(moe_down_rows, MOE_FMT_AFFINE, 3, MOE_DOWN_ROWS, MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b4(MOE_GU_PARAMS) { pdl_begin(); MOE_PICK(moe_gate_up_rows, MOE_FMT_AFFINE, 4, moe_gu_rows<4>(), MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b4(MOE_DOWN_PARAMS) { pdl_begin(); MOE_PICK(moe_down_rows, MOE_FMT_AFFINE, 4, MOE_DOWN_ROWS, MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b5(MOE_GU_PARAMS) { pdl_begin(); MOE_PICK(moe_gate_up_rows, MOE_FMT_AFFINE, 5, moe_gu_rows<5>(), MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b5(MOE_DOWN_PARAMS) { pdl_begin(); MOE_PICK(moe_down_rows, MOE_FMT_AFFINE, 5, MOE_DOWN_ROWS, MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b6(MOE_GU_PARAMS) { pdl_begin(); MOE_PICK(moe_gate_up_rows, MOE_FMT_AFFINE, 6, moe_gu_rows<6>(), MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b6(MOE_DOWN_PARAMS) { pdl_begin(); MOE_PICK(moe_down_rows, MOE_FMT_AFFINE, 6, MOE_DOWN_ROWS, MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_b8(MOE_GU_PARAMS) { pdl_begin(); MOE_PICK(moe_gate_up_rows, MOE_FMT_AFFINE, 8, moe_gu_rows<8>(), MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_b8(MOE_DOWN_PARAMS) { pdl_begin(); MOE_PICK(moe_down_rows, MOE_FMT_AFFINE, 8, MOE_DOWN_ROWS, MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_fp4(MOE_GU_PARAMS) { pdl_begin(); MOE_PICK(moe_gate_up_rows, MOE_FMT_FP, 4, moe_gu_rows<4>(), MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_fp4(MOE_DOWN_PARAMS) { pdl_begin(); MOE_PICK(moe_down_rows, MOE_FMT_FP, 4, MOE_DOWN_ROWS, MOE_DOWN_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_gate_up_fp8(MOE_GU_PARAMS) { pdl_begin(); MOE_PICK(moe_gate_up_rows, MOE_FMT_FP, 8, moe_gu_rows<8>(), MOE_GU_ARGS); }
extern "C" __global__ void __launch_bounds__(128) moe_down_fp8(MOE_DOWN_PARAMS) { pdl_begin(); MOE_PICK(moe_down_rows, MOE_FMT_FP, 8, MOE_DOWN_ROWS, MOE_DOWN_ARGS); }
// 4-bit experts on integer dot products (affine in groups of 32 and more; mxfp4): `x` and `act`
// are xsplit_f32's parts (u32 words) of x and of the activations; gate/up writes the latter.
extern "C" __global__ void __launch_bounds__(32 * MOE_GU_INT_WARPS) moe_gate_up_b4_int(MOE_GU_PARAMS) {
    pdl_begin();
    MOE_INT_PICK(moe_gate_up_int, (u32*)act, (const u32*)x, ids, index, experts, top_k, inter, hidden, lg, b_dt, activation, alpha, limit);
}
extern "C" __global__ void __launch_bounds__(128) moe_down_b4_int(MOE_DOWN_PARAMS) {
    pdl_begin();
    MOE_INT_PICK(moe_down_int, out, (const u32*)act, ids, weights, index, experts, top_k, hidden, inter, lg, b_dt);
}
extern "C" __global__ void __launch_bounds__(32 * MOE_GU_INT_WARPS) moe_gate_up_fp4_int(MOE_GU_PARAMS) {
    pdl_begin();
    moe_gate_up_int<MOE_FMT_FP, -1>((u32*)act, (const u32*)x, ids, index, experts, top_k, inter, hidden, lg, b_dt, activation, alpha, limit);
}
extern "C" __global__ void __launch_bounds__(128) moe_down_fp4_int(MOE_DOWN_PARAMS) {
    pdl_begin();
    moe_down_int<MOE_FMT_FP, -1>(out, (const u32*)act, ids, weights, index, experts, top_k, hidden, inter, lg, b_dt);
}
