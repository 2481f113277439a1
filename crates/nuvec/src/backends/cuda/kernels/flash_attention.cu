// Causal attention of a prefill chunk on the tensor cores, flash-style (issue 7): the scores of a
// block of queries never leave the SM. bf16 inputs, f32 accumulation and softmax, as the cuBLAS
// path of ops/prefill.rs computes it (which wrote every score and probability to memory).
//
// q f32 [L, Hq * D] (query t at position kv_len - L + t, seeing keys 0..=that position);
// kb, vb bf16 [Hkv, kv_len, D] (the cache's first kv_len rows, converted by gather3_bf16);
// out f32 [L, Hq * D]. Query head h reads KV head h / (Hq / Hkv).
//
// A block takes FA_WARPS * 16 queries of one head; each warp 16 of them, with their q rows as
// mma.sync A fragments in registers for the whole call. Keys go by in tiles of FA_KEYS: the block
// copies the tile's K rows and V (transposed, so that P V's B fragments are 4-byte loads) into
// shared memory; each warp computes its 16 x FA_KEYS scores with m16n8k16 MMAs, keeps a running
// maximum and sum per query row (online softmax in base 2, the scale folded in), rounds the
// probabilities to bf16 as the A fragments of P V (the score accumulator's layout is the A
// operand's, so they never leave registers) and accumulates O in f32. Shared-memory rows are
// padded by 8 values so that a warp's fragment loads hit 32 different banks.

// 8 warps (128 queries) per block rather than 4: each K/V tile copied to shared memory serves
// twice the queries (random 8B prefill 4096: +2 %, 16384: +7 %; random 1B 4096: +5 % on the H200).
#define FA_WARPS 8
#define FA_KEYS 64

template <int D>
__device__ __forceinline__ void flash_attn_body(float* __restrict__ out, const float* __restrict__ q,
                                                const u16* __restrict__ kb, const u16* __restrict__ vb, int l,
                                                int kv_len, int hq, int hkv, float scale) {
    constexpr int KS = D / 16;       // k steps of Q K^T
    constexpr int NT = D / 8;        // n tiles of P V (8 output features each)
    constexpr int KROW = D + 8;      // bf16 per K row in shared memory
    constexpr int VROW = FA_KEYS + 8;  // bf16 per transposed V row (one feature, FA_KEYS keys)
    __shared__ __align__(16) u16 ks[FA_KEYS * KROW];
    __shared__ __align__(16) u16 vt[D * VROW];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;  // fragment row group and column pair
    const int h = blockIdx.y, kvh = h / (hq / hkv);
    const int first = kv_len - l;           // position of query 0
    const int q0 = blockIdx.x * (FA_WARPS * 16);
    const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;  // this lane's two query rows
    const size_t qstride = (size_t)hq * D;
    // Q as A fragments: rows r0 / r1, features 16 kk + 2t (+1, +8, +9). Rows past L repeat L - 1.
    u32 qa[KS][4];
    {
        const float* q0p = q + (size_t)min(r0, l - 1) * qstride + (size_t)h * D + 2 * t;
        const float* q1p = q + (size_t)min(r1, l - 1) * qstride + (size_t)h * D + 2 * t;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            const float2 a = *(const float2*)(q0p + 16 * kk), b = *(const float2*)(q1p + 16 * kk);
            const float2 c = *(const float2*)(q0p + 16 * kk + 8), e = *(const float2*)(q1p + 16 * kk + 8);
            qa[kk][0] = bf16x2_rn(a.x, a.y);
            qa[kk][1] = bf16x2_rn(b.x, b.y);
            qa[kk][2] = bf16x2_rn(c.x, c.y);
            qa[kk][3] = bf16x2_rn(e.x, e.y);
        }
    }
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // Running maximum (of scores times scale * log2 e) and sum for rows r0 and r1.
    float m0 = NEG_INF, m1 = NEG_INF, s0 = 0.0f, s1 = 0.0f;
    const float c = scale * 1.4426950408889634f;
    const int pos0 = first + r0, pos1 = first + r1;
    // Keys the block's last query sees.
    const int n_keys = min(kv_len, first + min(q0 + FA_WARPS * 16, l));
    const u16* kh = kb + (size_t)kvh * kv_len * D;
    const u16* vh = vb + (size_t)kvh * kv_len * D;
    for (int j0 = 0; j0 < n_keys; j0 += FA_KEYS) {
        __syncthreads();  // the previous tile's readers are done
        // K rows j0.. as they are, V transposed; 8 values (16 bytes) per step, keys past the end 0.
        // Consecutive threads take consecutive keys, so that a warp's transposed V stores fall
        // into consecutive addresses of one feature row.
        constexpr int VEC = D / 8;  // 16-byte vectors per row
        for (int i = threadIdx.x; i < FA_KEYS * VEC; i += FA_WARPS * 32) {
            const int key = i % FA_KEYS, d0 = (i / FA_KEYS) * 8;
            uint4 kw = make_uint4(0u, 0u, 0u, 0u), vw = make_uint4(0u, 0u, 0u, 0u);
            if (j0 + key < kv_len) {
                kw = *(const uint4*)(kh + (size_t)(j0 + key) * D + d0);
                vw = *(const uint4*)(vh + (size_t)(j0 + key) * D + d0);
            }
            *(uint4*)(ks + key * KROW + d0) = kw;
            const u32 vv[4] = {vw.x, vw.y, vw.z, vw.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                vt[(d0 + 2 * e) * VROW + key] = (u16)(vv[e] & 0xFFFFu);
                vt[(d0 + 2 * e + 1) * VROW + key] = (u16)(vv[e] >> 16);
            }
        }
        __syncthreads();
        // S = Q K^T for this warp's 16 rows and the tile's keys: 8 n tiles of 8 keys.
        float sc[FA_KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < FA_KEYS / 8; ++n) {
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
            const u16* kr = ks + (8 * n + g) * KROW + 2 * t;
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) {
                const u32 b[2] = {*(const u32*)(kr + 16 * kk), *(const u32*)(kr + 16 * kk + 8)};
                mma_bf16(sc[n], qa[kk], b);
            }
        }
        // Scaled scores; keys after a row's position (or past kv_len) out.
        const bool edge = j0 + FA_KEYS > pos0 + 1 || j0 + FA_KEYS > kv_len;
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int n = 0; n < FA_KEYS / 8; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = j0 + 8 * n + 2 * t + e;
                float a = sc[n][e] * c, b = sc[n][2 + e] * c;
                if (edge) {
                    if (key > pos0 || key >= kv_len) a = NEG_INF;
                    if (key > pos1 || key >= kv_len) b = NEG_INF;
                }
                sc[n][e] = a;
                sc[n][2 + e] = b;
                mx0 = fmaxf(mx0, a);
                mx1 = fmaxf(mx1, b);
            }
        // The row's maximum over its four lanes (t = 0..3).
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float nm0 = fmaxf(m0, mx0), nm1 = fmaxf(m1, mx1);
        // Every row sees key 0 in the first tile, so nm is finite from then on.
        const float corr0 = exp2f(m0 - nm0), corr1 = exp2f(m1 - nm1);
        m0 = nm0;
        m1 = nm1;
        float ps0 = 0.0f, ps1 = 0.0f;
        u32 pa[FA_KEYS / 16][4];  // P as A fragments, one per 16 keys
#pragma unroll
        for (int n = 0; n < FA_KEYS / 8; ++n) {
            const float p00 = exp2f(sc[n][0] - nm0), p01 = exp2f(sc[n][1] - nm0);
            const float p10 = exp2f(sc[n][2] - nm1), p11 = exp2f(sc[n][3] - nm1);
            ps0 += p00 + p01;
            ps1 += p10 + p11;
            pa[n >> 1][(n & 1) * 2] = bf16x2_rn(p00, p01);
            pa[n >> 1][(n & 1) * 2 + 1] = bf16x2_rn(p10, p11);
        }
        s0 = s0 * corr0 + ps0;  // the lane's part; summed across the four lanes at the end
        s1 = s1 * corr1 + ps1;
        // O = O * corr + P V: k steps of 16 keys, n tiles of 8 features.
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[n][0] *= corr0;
            o[n][1] *= corr0;
            o[n][2] *= corr1;
            o[n][3] *= corr1;
            const u16* vr = vt + (8 * n + g) * VROW + 2 * t;
#pragma unroll
            for (int kk = 0; kk < FA_KEYS / 16; ++kk) {
                const u32 b[2] = {*(const u32*)(vr + 16 * kk), *(const u32*)(vr + 16 * kk + 8)};
                mma_bf16(o[n], pa[kk], b);
            }
        }
    }
    s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
    s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
    const float inv0 = 1.0f / s0, inv1 = 1.0f / s1;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const int f = h * D + 8 * n + 2 * t;
        if (r0 < l) *(float2*)(out + (size_t)r0 * qstride + f) = make_float2(o[n][0] * inv0, o[n][1] * inv0);
        if (r1 < l) *(float2*)(out + (size_t)r1 * qstride + f) = make_float2(o[n][2] * inv1, o[n][3] * inv1);
    }
}

#define FA_PARAMS                                                                                                  \
    float *out, const float *q, const u16 *kb, const u16 *vb, int l, int kv_len, int hq, int hkv, float scale
#define FA_ARGS out, q, kb, vb, l, kv_len, hq, hkv, scale
// Grid (ceil(L / (16 * FA_WARPS)), Hq), FA_WARPS * 32 threads; one kernel per head size.
extern "C" __global__ void __launch_bounds__(FA_WARPS * 32) flash_attn_bf16_d64(FA_PARAMS) {
    pdl_begin();
    flash_attn_body<64>(FA_ARGS);
}
extern "C" __global__ void __launch_bounds__(FA_WARPS * 32) flash_attn_bf16_d128(FA_PARAMS) {
    pdl_begin();
    flash_attn_body<128>(FA_ARGS);
}
