// Causal attention of a prefill chunk on the tensor cores, flash-style (issue 7): the scores of a
// block of queries never leave the SM. bf16 inputs, f32 accumulation and softmax, as the cuBLAS
// path of ops/prefill.rs computes it (which wrote every score and probability to memory).
//
// q f32 [L, Hq * D] (query t at position kv_len - L + t, seeing keys 0..=that position, or only
// the `window` newest of them when window > 0);
// kb, vb bf16 [Hkv, kv_len, D] (the cache's first kv_len rows, converted by gather3_bf16);
// out f32 [L, Hq * D]. Query head h reads KV head h / (Hq / Hkv). With sinks (one logit per query
// head, or null), each head's sink joins its softmax's denominator: it starts as the running
// maximum (in raw score units, sink / scale) with a sum of one, and adds no value.
//
// A block takes WARPS * 16 queries of one head; each warp 16 of them, with their q rows as
// mma.sync A fragments in registers for the whole call. Keys go by in tiles of FA_KEYS, K and V
// rows copied as they are into shared memory by cp.async, double-buffered: tile j + 1 lands while
// the warps compute tile j, and one barrier per tile both publishes tile j and retires tile j - 1's
// buffers. Each warp computes its 16 x FA_KEYS scores with m16n8k16 MMAs (K's B fragments by
// ldmatrix), keeps a running maximum and sum per query row (online softmax in base 2, the scale
// folded in), rounds the probabilities to bf16 as the A fragments of P V (the score accumulator's
// layout is the A operand's, so they never leave registers) and accumulates O in f32 (V's B
// fragments by ldmatrix.trans). Shared-memory rows are padded by 8 values so that the eight rows
// of an ldmatrix hit 32 different banks. The tiles take 4 * FA_KEYS * (D + 8) * 2 bytes of dynamic
// shared memory (68 KiB for D = 128; the host raises the kernels' limit).
#define FA_KEYS 64

// Rows j0.. of one head's K or V (D bf16 each) into the tile at shared address dst (rows of
// D + 8), zeros past kv_len; consecutive threads take consecutive 16-byte pieces of a row
// (coalesced), each thread the same piece of every (WARPS * 32 / (D / 8))-th row.
template <int D, int WARPS>
__device__ __forceinline__ void fa_load_tile(u32 dst, const u16* __restrict__ src, int j0, int kv_len) {
    constexpr int VEC = D / 8, PASS = WARPS * 32 / VEC;  // rows per pass of the block
    const int key0 = threadIdx.x / VEC, d0 = (threadIdx.x % VEC) * 8;
#pragma unroll
    for (int r = 0; r < FA_KEYS / PASS; ++r) {
        const int key = key0 + r * PASS;
        const bool in = j0 + key < kv_len;
        cp_async16(dst + 2 * (key * (D + 8) + d0), src + (size_t)(in ? j0 + key : 0) * D + d0, in);
    }
}

extern __shared__ __align__(16) u16 fa_smem[];

// One key tile's online-softmax step for a lane's two query rows: sc holds the tile's raw scores
// (NS n tiles of 8 keys; masked keys -inf; a row that has seen no key yet keeps maximum -inf
// and sum 0); m0/m1 and s0/s1 are the rows' running maximum
// and (the lane's part of) the sum of exp2((score - max) * c), c the scale times log2(e). Where a
// maximum grew, the sums and O (NT n tiles) are rescaled (rarely, after the first tiles); the
// probabilities come back rounded to bf16 as P's A fragments, one per 16 keys (the score
// accumulator's layout is the A operand's, so they never leave registers).
template <int NS, int NT, bool F16 = false>
__device__ __forceinline__ void fa_softmax_tile(const float (&sc)[NS][4], float c, float& m0, float& m1, float& s0,
                                                float& s1, float (&o)[NT][4], u32 (&pa)[NS / 2][4]) {
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
        mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
        mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
    }
    // The row's maximum over its four lanes (t = 0..3).
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if (__any_sync(0xffffffffu, mx0 != m0 || mx1 != m1)) {
        // A row still without a key (maximum -inf) has nothing to rescale.
        const float corr0 = mx0 == NEG_INF ? 1.0f : exp2_ftz((m0 - mx0) * c);
        const float corr1 = mx1 == NEG_INF ? 1.0f : exp2_ftz((m1 - mx1) * c);
        s0 *= corr0;
        s1 *= corr1;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[n][0] *= corr0;
            o[n][1] *= corr0;
            o[n][2] *= corr1;
            o[n][3] *= corr1;
        }
        m0 = mx0;
        m1 = mx1;
    }
    // Every score of a row without a key is -inf: shifted by 0, each exponential is 0 (not NaN).
    const float mc0 = m0 == NEG_INF ? 0.0f : m0 * c, mc1 = m1 == NEG_INF ? 0.0f : m1 * c;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
        const float p00 = exp2_ftz(fmaf(sc[n][0], c, -mc0)), p01 = exp2_ftz(fmaf(sc[n][1], c, -mc0));
        const float p10 = exp2_ftz(fmaf(sc[n][2], c, -mc1)), p11 = exp2_ftz(fmaf(sc[n][3], c, -mc1));
        s0 += p00 + p01;  // the lane's part; summed across the four lanes at the end
        s1 += p10 + p11;
        pa[n >> 1][(n & 1) * 2] = half2_rn<F16>(p00, p01);
        pa[n >> 1][(n & 1) * 2 + 1] = half2_rn<F16>(p10, p11);
    }
}

// A lane's Q rows as the A fragments of Q K^T, rounded to bf16 (or f16 with F16, after a
// multiply by qs): rows at q0p and q1p (f32, already at the lane's feature 2t), features
// 16 kk + 2t (+1, +8, +9) for each of the KS k steps; a row that is not `in` reads as zeros.
template <int KS, bool F16 = false>
__device__ __forceinline__ void fa_load_q(u32 (&qa)[KS][4], const float* q0p, const float* q1p, bool in0, bool in1,
                                          float qs = 1.0f) {
    const float2 z = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
        float2 a = in0 ? *(const float2*)(q0p + 16 * kk) : z, b = in1 ? *(const float2*)(q1p + 16 * kk) : z;
        float2 c = in0 ? *(const float2*)(q0p + 16 * kk + 8) : z;
        float2 e = in1 ? *(const float2*)(q1p + 16 * kk + 8) : z;
        if constexpr (F16) {
            a.x *= qs, a.y *= qs, b.x *= qs, b.y *= qs, c.x *= qs, c.y *= qs, e.x *= qs, e.y *= qs;
        }
        qa[kk][0] = half2_rn<F16>(a.x, a.y);
        qa[kk][1] = half2_rn<F16>(b.x, b.y);
        qa[kk][2] = half2_rn<F16>(c.x, c.y);
        qa[kk][3] = half2_rn<F16>(e.x, e.y);
    }
}

// S = Q K^T for a warp's 16 query rows (qa: their A fragments, KS k steps of 16 features) and
// the NS * 8 keys of a K tile (kt: this lane's ldmatrix address in it, rows of `row` bytes).
template <int NS, int KS, bool F16 = false>
__device__ __forceinline__ void fa_scores(float (&sc)[NS][4], const u32 (&qa)[KS][4], u32 kt, int row) {
#pragma unroll
    for (int n = 0; n < NS; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; kk += 2)
#pragma unroll
        for (int n = 0; n < NS; ++n) {
            u32 b[4];
            ldmatrix_x4<false>(b, kt + 8 * n * row + 32 * kk);
            const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma_half<F16>(sc[n], qa[kk], b0);
            mma_half<F16>(sc[n], qa[kk + 1], b1);
        }
}

// O += P V over the NK * 16 keys of a V tile (pa: P's A fragments, one per 16 keys; vt: this
// lane's ldmatrix.trans address in the tile, rows of `row` bytes): pairs of n tiles of 8 features.
template <int NK, int NT, bool F16 = false>
__device__ __forceinline__ void fa_accumulate(float (&o)[NT][4], const u32 (&pa)[NK][4], u32 vt, int row) {
#pragma unroll
    for (int kk = 0; kk < NK; ++kk)
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            u32 b[4];
            ldmatrix_x4<true>(b, vt + 16 * kk * row + 16 * n);
            const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma_half<F16>(o[n], pa[kk], b0);
            mma_half<F16>(o[n + 1], pa[kk], b1);
        }
}

// A lane's two rows' sums of exponentials over the row's four lanes (each held its part).
__device__ __forceinline__ void fa_row_sums(float& s0, float& s1) {
    s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
    s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
}

template <int D, int WARPS>
__device__ __forceinline__ void flash_attn_body(float* __restrict__ out, const float* __restrict__ q,
                                                const u16* __restrict__ kb, const u16* __restrict__ vb, int l,
                                                int kv_len, int hq, int hkv, float scale, const float* sinks,
                                                int window) {
    constexpr int KS = D / 16;                 // k steps of Q K^T
    constexpr int NT = D / 8;                  // n tiles of P V (8 output features each)
    constexpr int ROW = 2 * (D + 8);           // bytes per K or V row in shared memory
    constexpr int TILE = FA_KEYS * ROW;        // bytes per K or V tile
    static_assert(FA_KEYS % (WARPS * 32 / (D / 8)) == 0, "whole passes of fa_load_tile");
    const u32 ks = smem_addr(fa_smem), vs = ks + 2 * TILE;  // K tiles 0 and 1, then V tiles 0 and 1
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;  // fragment row group and column pair
    // Heads along x, query blocks along y from the last: the blocks with the most keys start
    // first (the causal work is uneven), and neighbouring blocks share a KV head in L2.
    const int h = blockIdx.x, kvh = h / (hq / hkv);
    const int first = kv_len - l;  // position of query 0
    const int q0 = (gridDim.y - 1 - blockIdx.y) * (WARPS * 16);
    const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;  // this lane's two query rows
    const size_t qstride = (size_t)hq * D;
    // Keys the block's last query sees.
    const int n_keys = min(kv_len, first + min(q0 + WARPS * 16, l));
    const u16* kh = kb + (size_t)kvh * kv_len * D;
    const u16* vh = vb + (size_t)kvh * kv_len * D;
    // The first tile holding a key the block's first query sees (0 without a window).
    const int j_first = window > 0 ? max(0, first + q0 - window + 1) / FA_KEYS * FA_KEYS : 0;
    fa_load_tile<D, WARPS>(ks, kh, j_first, kv_len);
    fa_load_tile<D, WARPS>(vs, vh, j_first, kv_len);
    cp_async_commit();
    // Q as A fragments: rows r0 / r1, features 16 kk + 2t (+1, +8, +9). Rows past L repeat L - 1.
    u32 qa[KS][4];
    fa_load_q<KS>(qa, q + (size_t)min(r0, l - 1) * qstride + (size_t)h * D + 2 * t,
                  q + (size_t)min(r1, l - 1) * qstride + (size_t)h * D + 2 * t, true, true);
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // Running maximum of the raw scores and running sum of exp2((score - max) * c) for rows r0
    // and r1 (softmax in base 2, the scale folded into one multiply-add per score).
    float m0 = NEG_INF, m1 = NEG_INF, s0 = 0.0f, s1 = 0.0f;
    if (sinks) {  // the sink as a raw score whose exponential (one lane's part of the sum) is 1
        m0 = m1 = sinks[h] / scale;
        s0 = s1 = t == 0 ? 1.0f : 0.0f;
    }
    const float c = scale * 1.4426950408889634f;
    const int pos0 = first + r0, pos1 = first + r1;
    // Keys at or before these have left the rows' windows (-1: none have).
    const int gone0 = window > 0 ? pos0 - window : -1, gone1 = window > 0 ? pos1 - window : -1;
    const int warp_pos = first + q0 + warp * 16;  // the warp's first query position
    // ldmatrix row addresses: K rows (keys) 8n + lane % 8 at features 8 (lane / 8) of a 32-feature
    // step (B fragments of two k steps); V rows 16 kk + lane % 16 at features 8 (lane / 16) of a
    // 16-feature pair of n tiles (B fragments of both).
    const u32 kl = ks + (lane & 7) * ROW + 16 * (lane >> 3);
    const u32 vl = vs + (lane & 15) * ROW + 16 * (lane >> 4);
    for (int j0 = j_first, buf = 0; j0 < n_keys; j0 += FA_KEYS, buf ^= 1) {
        cp_async_wait<0>();  // this thread's copies of tile j
        __syncthreads();     // everyone's; and every warp is done with tile j - 1's buffers
        if (j0 + FA_KEYS < n_keys) {
            fa_load_tile<D, WARPS>(ks + (buf ^ 1) * TILE, kh, j0 + FA_KEYS, kv_len);
            fa_load_tile<D, WARPS>(vs + (buf ^ 1) * TILE, vh, j0 + FA_KEYS, kv_len);
            cp_async_commit();
        }
        const u32 kt = kl + buf * TILE, vt = vl + buf * TILE;
        // S = Q K^T for this warp's 16 rows and the tile's keys: 8 n tiles of 8 keys.
        float sc[FA_KEYS / 8][4];
        fa_scores(sc, qa, kt, ROW);
        // Keys after a row's position (or past kv_len) out: only in tiles that reach past the
        // warp's first query (a warp-uniform test); with a window, also in tiles that reach below
        // its last query's window.
        if (j0 + FA_KEYS > warp_pos + 1 || j0 + FA_KEYS > kv_len || (window > 0 && j0 <= warp_pos + 15 - window)) {
#pragma unroll
            for (int n = 0; n < FA_KEYS / 8; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = j0 + 8 * n + 2 * t + e;
                    if (key > pos0 || key >= kv_len || key <= gone0) sc[n][e] = NEG_INF;
                    if (key > pos1 || key >= kv_len || key <= gone1) sc[n][2 + e] = NEG_INF;
                }
        }
        u32 pa[FA_KEYS / 16][4];  // P as A fragments, one per 16 keys
        fa_softmax_tile<FA_KEYS / 8, NT>(sc, c, m0, m1, s0, s1, o, pa);
        fa_accumulate(o, pa, vt, ROW);  // O += P V
    }
    fa_row_sums(s0, s1);
    const float inv0 = 1.0f / s0, inv1 = 1.0f / s1;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const int f = h * D + 8 * n + 2 * t;
        if (r0 < l) *(float2*)(out + (size_t)r0 * qstride + f) = make_float2(o[n][0] * inv0, o[n][1] * inv0);
        if (r1 < l) *(float2*)(out + (size_t)r1 * qstride + f) = make_float2(o[n][2] * inv1, o[n][3] * inv1);
    }
}

#define FA_PARAMS                                                                                                  \
    float *out, const float *q, const u16 *kb, const u16 *vb, int l, int kv_len, int hq, int hkv, float scale,      \
        const float *sinks, int window
#define FA_ARGS out, q, kb, vb, l, kv_len, hq, hkv, scale, sinks, window
// Grid (Hq, ceil(L / (16 * warps))), 32 * warps threads; one kernel per head size. Head size
// 128 takes 8 warps (each K/V tile serves 128 queries), 64 takes 4 (two or three blocks share an
// SM, out of step): random 8B prefill 4096 +0.6 % against 4 warps, random 1B 4096 +2 % against
// 8 (H200).
extern "C" __global__ void __launch_bounds__(128) flash_attn_bf16_d64(FA_PARAMS) {
    pdl_begin();
    flash_attn_body<64, 4>(FA_ARGS);
}
extern "C" __global__ void __launch_bounds__(256) flash_attn_bf16_d128(FA_PARAMS) {
    pdl_begin();
    flash_attn_body<128, 8>(FA_ARGS);
}

// Decode attention of many sequences over a paged bf16 store on the tensor cores: the query
// heads of one KV group are the rows of one warp's mma.sync tiles (up to 16 heads; the rows past
// them are zeros and go nowhere), so a key row read once serves every head of its group, and
// Q K^T and P V take m16n8k16 MMAs where the scalar kernel (attention.cu) spent a warp reduction
// per key and head. The arithmetic is the prefill kernel's above (q rounded to bf16, scores and
// softmax in f32, probabilities rounded to bf16 for P V, f32 accumulation); only the host's
// bf16-attention precision (ops/paged.rs) sends a step here.
//
// k, v [blocks * bs, Hkv * D] bf16; q f32 [n, Hq * D]; grid (Hkv, n, splits), one warp per block:
// block (x, t, s) takes KV head x of sequence t over keys [b + s keys, b + (s + 1) keys) of its
// lens[t], b = starts[t] (0 without starts), found through its table (tables + t * table_stride),
// and writes each head's partial (maximum of the scaled scores, sum of exponentials, unnormalized
// values [D]) where paged_attention_split_f32 writes it, for attention_merge_f32; a sequence with
// b > 0 leaves its last prefix_slots partials to paged_prefix_flash_bf16_d* (below). Tiles of PF_KEYS keys are copied into shared memory by
// cp.async, double-buffered: 4 * PF_KEYS * (D + 8) * 2 bytes (17 KiB at D = 128).
#define PF_KEYS 16

// Keys j0 .. j0 + KEYS of one KV head (column offset `head` of rows of `width` values) into the
// K and V tiles at shared addresses kd and vd, by the block's WARPS warps, through a sequence's
// block table (blocks of 2^shift rows when shift >= 0, else of bs); zeros from j_end on. A key's
// row is found once for both (a division per key where the block size is not a power of two).
template <int D, int WARPS, int KEYS>
__device__ __forceinline__ void pf_load_tiles(u32 kd, u32 vd, const u16* __restrict__ k, const u16* __restrict__ v,
                                              const int* table, int bs, int shift, size_t width, int head, int j0,
                                              int j_end) {
    constexpr int VEC = D / 8, PASS = WARPS * 32 / VEC;  // 16-byte pieces of a row; rows per pass
    static_assert(KEYS % PASS == 0, "whole passes of the block");
    const int key0 = threadIdx.x / VEC, d0 = (threadIdx.x % VEC) * 8;
#pragma unroll
    for (int r = 0; r < KEYS / PASS; ++r) {
        const int key = key0 + r * PASS, j = j0 + key;
        const bool in = j < j_end;
        const int blk = shift >= 0 ? j >> shift : j / bs, at = shift >= 0 ? j & (bs - 1) : j % bs;
        const size_t off = (in ? (size_t)table[blk] * bs + at : 0) * width + head + d0;
        const u32 dst = 2 * (key * (D + 8) + d0);
        cp_async16(kd + dst, k + off, in);
        cp_async16(vd + dst, v + off, in);
    }
}

// log2(bs) for a block size that is a power of two, else -1 (pf_load_tiles divides).
__device__ __forceinline__ int pf_shift(int bs) {
    if (bs & (bs - 1)) return -1;
    int shift = 0;
    while ((1 << shift) < bs) ++shift;
    return shift;
}

// One tile of NS * 8 keys from j0 for a warp's 16 rows, each seeing every key before j_end (a
// decode: no causal mask): the scores, those past j_end out, the online softmax and O += P V.
template <int NS, bool F16, int KS, int NT>
__device__ __forceinline__ void pf_tile(const u32 (&qa)[KS][4], u32 kt, u32 vt, int row, int j0, int j_end, float c,
                                        float& m0, float& m1, float& s0, float& s1, float (&o)[NT][4]) {
    float sc[NS][4];
    fa_scores<NS, KS, F16>(sc, qa, kt, row);
    if (j0 + 8 * NS > j_end) {
        const int tq = threadIdx.x & 3;
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                if (j0 + 8 * n + 2 * tq + e >= j_end) sc[n][e] = sc[n][2 + e] = NEG_INF;
    }
    u32 pa[NS / 2][4];  // P as A fragments, one per 16 keys
    fa_softmax_tile<NS, NT, F16>(sc, c, m0, m1, s0, s1, o, pa);
    fa_accumulate<NS / 2, NT, F16>(o, pa, vt, row);
}

// Row g + 8 half of a warp's MMAs as a partial at pv, in the scalar kernel's units (maximum of
// the scaled scores, sum of exponentials, unnormalized values): the four lanes of the row each
// write their features.
template <int NT>
__device__ __forceinline__ void pf_store_partial(float* pv, int half, float m0, float m1, float s0, float s1,
                                                 float scale, const float (&o)[NT][4]) {
    const int tq = threadIdx.x & 3;
    if (tq == 0) {
        pv[0] = (half ? m1 : m0) * scale;
        pv[1] = half ? s1 : s0;
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        pv[2 + 8 * n + 2 * tq] = o[n][2 * half];
        pv[3 + 8 * n + 2 * tq] = o[n][2 * half + 1];
    }
}

template <int D, bool F16>
__device__ __forceinline__ void paged_flash_body(float* __restrict__ part, const float* __restrict__ q,
                                                 const u16* __restrict__ k, const u16* __restrict__ v,
                                                 const int* tables, int table_stride, const int* lens, int hq, int hkv,
                                                 int bs, float scale, int keys, const int* starts, int prefix_slots) {
    constexpr int KS = D / 16, NT = D / 8, ROW = 2 * (D + 8), TILE = PF_KEYS * ROW;
    const int kvh = blockIdx.x, t = blockIdx.y, s = blockIdx.z, splits = gridDim.z;
    const int gh = hq / hkv, h0 = kvh * gh;
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    // A sequence whose first keys are shared with others (starts[t] > 0) attends from there; its
    // last prefix_slots partials are the shared keys' (paged_prefix_flash_bf16_d*).
    const int start = starts ? starts[t] : 0;
    if (start > 0 && s >= splits - prefix_slots) return;
    const int len = lens[t], j_begin = start + s * keys, j_end = min(len, j_begin + keys);
    float* pv0 = part + (((size_t)t * hq + h0) * splits + s) * (size_t)(D + 2);
    const size_t pv_step = (size_t)splits * (D + 2);
    if (j_begin >= j_end) {  // past the sequence's last key: the empty partials the merge skips
        for (int i = lane; i < gh * (D + 2); i += 32)
            pv0[(i / (D + 2)) * pv_step + i % (D + 2)] = i % (D + 2) == 0 ? NEG_INF : 0.0f;
        return;
    }
    const int* table = tables + (size_t)t * table_stride;
    const size_t width = (size_t)hkv * D;
    const u32 ks = smem_addr(fa_smem), vs = ks + 2 * TILE;
    const int shift = pf_shift(bs);
    pf_load_tiles<D, 1, PF_KEYS>(ks, vs, k, v, table, bs, shift, width, kvh * D, j_begin, j_end);
    cp_async_commit();
    // Q as A fragments: rows g and g + 8 are heads h0 + g and h0 + g + 8 (zeros past gh). In f16,
    // q times the scale (as llama.cpp's f16 attention), so that it stays far inside f16's range;
    // the scores are then scaled already.
    const float qs = F16 ? scale : 1.0f;
    scale = F16 ? 1.0f : scale;
    u32 qa[KS][4];
    {
        const bool in0 = g < gh, in1 = g + 8 < gh;
        fa_load_q<KS, F16>(qa, q + ((size_t)t * hq + h0 + (in0 ? g : 0)) * D + 2 * tq,
                           q + ((size_t)t * hq + h0 + (in1 ? g + 8 : 0)) * D + 2 * tq, in0, in1, qs);
    }
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, s0 = 0.0f, s1 = 0.0f;
    const float c = scale * 1.4426950408889634f;
    const u32 kl = ks + (lane & 7) * ROW + 16 * (lane >> 3);
    const u32 vl = vs + (lane & 15) * ROW + 16 * (lane >> 4);
    for (int j0 = j_begin, buf = 0; j0 < j_end; j0 += PF_KEYS, buf ^= 1) {
        cp_async_wait<0>();
        __syncwarp();  // every lane's copies of this tile landed; every lane done with the other buffer
        if (j0 + PF_KEYS < j_end) {
            pf_load_tiles<D, 1, PF_KEYS>(ks + (buf ^ 1) * TILE, vs + (buf ^ 1) * TILE, k, v, table, bs, shift, width,
                                         kvh * D, j0 + PF_KEYS, j_end);
            cp_async_commit();
        }
        const u32 kt = kl + buf * TILE, vt = vl + buf * TILE;
        pf_tile<PF_KEYS / 8, F16>(qa, kt, vt, ROW, j0, j_end, c, m0, m1, s0, s1, o);
    }
    fa_row_sums(s0, s1);
#pragma unroll
    for (int half = 0; half < 2; ++half)
        if (g + 8 * half < gh) pf_store_partial(pv0 + (g + 8 * half) * pv_step, half, m0, m1, s0, s1, scale, o);
}

#define PF_PARAMS                                                                                                 \
    float *part, const float *q, const u16 *k, const u16 *v, const int *tables, int table_stride, const int *lens, \
        int hq, int hkv, int bs, float scale, int keys, const int *starts, int prefix_slots
#define PF_ARGS part, q, k, v, tables, table_stride, lens, hq, hkv, bs, scale, keys, starts, prefix_slots
extern "C" __global__ void __launch_bounds__(32) paged_flash_decode_bf16_d64(PF_PARAMS) {
    pdl_begin();
    paged_flash_body<64, false>(PF_ARGS);
}
extern "C" __global__ void __launch_bounds__(32) paged_flash_decode_bf16_d128(PF_PARAMS) {
    pdl_begin();
    paged_flash_body<128, false>(PF_ARGS);
}
// The same over an f16 store (a GGUF model's caches): q and the probabilities rounded to f16.
extern "C" __global__ void __launch_bounds__(32) paged_flash_decode_f16_d64(PF_PARAMS) {
    pdl_begin();
    paged_flash_body<64, true>(PF_ARGS);
}
extern "C" __global__ void __launch_bounds__(32) paged_flash_decode_f16_d128(PF_PARAMS) {
    pdl_begin();
    paged_flash_body<128, true>(PF_ARGS);
}

// The keys several sequences of a paged decode step share (the same blocks of the store, as the
// prefix cache hands them out: a system prompt), read once for all of them (shared-prefix or
// cascade attention): the rows of a warp's MMAs are the query heads of a KV group of up to
// 16 / group members, and the block's PX_WARPS warps share each K/V tile, so one read of a
// shared key serves PX_WARPS * (16 / group) sequences where paged_flash_decode_bf16_d* reads it
// once per sequence. The arithmetic is that kernel's; each member's partials join its own keys'
// (paged_flash_decode_bf16_d* from starts[t]) in attention_merge_f32.
//
// Grid (Hkv, tiles, prefix splits), PX_WARPS warps. Tile y's descriptor, PX_TILE ints at
// tiles + y * PX_TILE: the sequence whose block table the keys are read through, the shared keys
// P, then the members (sequence indices; -1 past the last), 16 / group per warp. Block (x, y, s)
// takes KV head x over keys [s keys, (s + 1) keys) of P and writes each member head's partial in
// slot slots - gridDim.z + s of its row of `slots` partials (empty past P).
#define PX_WARPS 4
#define PX_KEYS 32
#define PX_TILE (2 + PX_WARPS * 16)
template <int D, bool F16>
__device__ __forceinline__ void paged_prefix_body(float* __restrict__ part, const float* __restrict__ q,
                                                  const u16* __restrict__ k, const u16* __restrict__ v,
                                                  const int* tables, int table_stride, const int* tiles, int hq,
                                                  int hkv, int bs, float scale, int keys, int slots) {
    constexpr int KS = D / 16, NT = D / 8, ROW = 2 * (D + 8), TILE = PX_KEYS * ROW;
    const int kvh = blockIdx.x, s = blockIdx.z, slot = slots - gridDim.z + s;
    const int gh = hq / hkv, per_warp = 16 / gh;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const int* tile = tiles + (size_t)blockIdx.y * PX_TILE;
    const int j_begin = s * keys, j_end = min(tile[1], j_begin + keys);
    // This lane's two rows (g and g + 8 of the warp's 16): a member and one of its heads, or none.
    int t_of[2], h_of[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = g + 8 * half;
        t_of[half] = r < per_warp * gh ? tile[2 + warp * per_warp + r / gh] : -1;
        h_of[half] = kvh * gh + r % gh;
    }
    auto partial = [&](int half) {
        return part + (((size_t)t_of[half] * hq + h_of[half]) * slots + slot) * (size_t)(D + 2);
    };
    if (j_begin >= j_end) {  // past the shared keys (another tile's are longer): empty partials
#pragma unroll
        for (int half = 0; half < 2; ++half)
            if (t_of[half] >= 0) {
                float* pv = partial(half);
                for (int i = tq; i < D + 2; i += 4) pv[i] = i == 0 ? NEG_INF : 0.0f;
            }
        return;
    }
    const int* table = tables + (size_t)tile[0] * table_stride;
    const size_t width = (size_t)hkv * D;
    const u32 ks = smem_addr(fa_smem), vs = ks + 2 * TILE;
    const int shift = pf_shift(bs);
    pf_load_tiles<D, PX_WARPS, PX_KEYS>(ks, vs, k, v, table, bs, shift, width, kvh * D, j_begin, j_end);
    cp_async_commit();
    // In f16, q times the scale (paged_flash_body).
    const float qs = F16 ? scale : 1.0f;
    scale = F16 ? 1.0f : scale;
    u32 qa[KS][4];
    fa_load_q<KS, F16>(qa, q + ((size_t)max(t_of[0], 0) * hq + h_of[0]) * D + 2 * tq,
                       q + ((size_t)max(t_of[1], 0) * hq + h_of[1]) * D + 2 * tq, t_of[0] >= 0, t_of[1] >= 0, qs);
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, s0 = 0.0f, s1 = 0.0f;
    const float c = scale * 1.4426950408889634f;
    const u32 kl = ks + (lane & 7) * ROW + 16 * (lane >> 3);
    const u32 vl = vs + (lane & 15) * ROW + 16 * (lane >> 4);
    for (int j0 = j_begin, buf = 0; j0 < j_end; j0 += PX_KEYS, buf ^= 1) {
        cp_async_wait<0>();  // this thread's copies of tile j
        __syncthreads();     // everyone's; and every warp is done with tile j - 1's buffers
        if (j0 + PX_KEYS < j_end) {
            pf_load_tiles<D, PX_WARPS, PX_KEYS>(ks + (buf ^ 1) * TILE, vs + (buf ^ 1) * TILE, k, v, table, bs, shift,
                                                width, kvh * D, j0 + PX_KEYS, j_end);
            cp_async_commit();
        }
        const u32 kt = kl + buf * TILE, vt = vl + buf * TILE;
        pf_tile<PX_KEYS / 8, F16>(qa, kt, vt, ROW, j0, j_end, c, m0, m1, s0, s1, o);
    }
    fa_row_sums(s0, s1);
#pragma unroll
    for (int half = 0; half < 2; ++half)
        if (t_of[half] >= 0) pf_store_partial(partial(half), half, m0, m1, s0, s1, scale, o);
}

#define PX_PARAMS                                                                                                 \
    float *part, const float *q, const u16 *k, const u16 *v, const int *tables, int table_stride, const int *tiles, \
        int hq, int hkv, int bs, float scale, int keys, int slots
#define PX_ARGS part, q, k, v, tables, table_stride, tiles, hq, hkv, bs, scale, keys, slots
extern "C" __global__ void __launch_bounds__(PX_WARPS * 32) paged_prefix_flash_bf16_d64(PX_PARAMS) {
    pdl_begin();
    paged_prefix_body<64, false>(PX_ARGS);
}
extern "C" __global__ void __launch_bounds__(PX_WARPS * 32) paged_prefix_flash_bf16_d128(PX_PARAMS) {
    pdl_begin();
    paged_prefix_body<128, false>(PX_ARGS);
}
extern "C" __global__ void __launch_bounds__(PX_WARPS * 32) paged_prefix_flash_f16_d64(PX_PARAMS) {
    pdl_begin();
    paged_prefix_body<64, true>(PX_ARGS);
}
extern "C" __global__ void __launch_bounds__(PX_WARPS * 32) paged_prefix_flash_f16_d128(PX_PARAMS) {
    pdl_begin();
    paged_prefix_body<128, true>(PX_ARGS);
}
