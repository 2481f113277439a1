// Matrix products and embedding lookups over dense (f32/f16/bf16) and MLX affine-quantized
// weights (`w = scale * q + bias` per group of `group` values; `bits` in 2,3,4,5,6,8).
// Accumulation is f32.

// A weight matrix [rows, cols] as the kernels read it. `w_dt` is DT_F32/DT_F16/DT_BF16 for dense
// weights, or -1 for affine-quantized ones (then `packed`, `scales`, `biases`, `p_dt`, `bits` and
// `group` describe it).
struct Weights {
    const void* dense;
    const u32* packed;
    const void* scales;
    const void* biases;
    int w_dt;
    int p_dt;
    int bits;
    int group;
    int cols;
};

__device__ __forceinline__ float weight(const Weights& w, size_t r, int k) {
    if (w.w_dt >= 0) return load_float(w.dense, r * (size_t)w.cols + k, w.w_dt);
    size_t words = (size_t)w.cols * w.bits / 32;
    float q = (float)unpack(w.packed + r * words, (size_t)k, w.bits);
    size_t g = r * (size_t)(w.cols / w.group) + k / w.group;
    return load_float(w.scales, g, w.p_dt) * q + load_float(w.biases, g, w.p_dt);
}

#define GEMV_MAX_M 8
#define GEMV_WARPS 8

// out [M, N] = x [M, K] W^T for M <= GEMV_MAX_M: one warp per output row n, lanes striding K
// (consecutive lanes read consecutive weights), f32 partial sums reduced across the warp.
extern "C" __global__ void gemv(float* out, const float* x, int m, int n, const void* dense, const u32* packed,
                                const void* scales, const void* biases, int w_dt, int p_dt, int bits, int group,
                                int k) {
    pdl_begin();
    Weights w = {dense, packed, scales, biases, w_dt, p_dt, bits, group, k};
    int lane = threadIdx.x & 31;
    size_t r = (size_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (r >= (size_t)n) return;
    float acc[GEMV_MAX_M];
#pragma unroll
    for (int i = 0; i < GEMV_MAX_M; ++i) acc[i] = 0.0f;
    for (int c = lane; c < k; c += 32) {
        float wv = weight(w, r, c);
#pragma unroll
        for (int i = 0; i < GEMV_MAX_M; ++i)
            if (i < m) acc[i] = fmaf(wv, x[(size_t)i * k + c], acc[i]);
    }
#pragma unroll
    for (int i = 0; i < GEMV_MAX_M; ++i) {
        if (i < m) {
            float s = warp_sum(acc[i]);
            if (lane == 0) out[(size_t)i * n + r] = s;
        }
    }
}

// out [rows, K] f32 = weight rows `ids[i]` (or `row0 + i` when ids is null), dequantized or
// converted: embedding lookups, and the tiles of the dequantize-then-GEMM path.
extern "C" __global__ void gather_rows(float* out, const u32* ids, long long row0, size_t total, const void* dense,
                                       const u32* packed, const void* scales, const void* biases, int w_dt, int p_dt,
                                       int bits, int group, int k) {
    pdl_begin();
    Weights w = {dense, packed, scales, biases, w_dt, p_dt, bits, group, k};
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / k;
        int c = (int)(i % k);
        size_t r = ids ? (size_t)ids[t] : (size_t)row0 + t;
        out[i] = weight(w, r, c);
    }
}

// ---- Fast quantized GEMV (issue 7, speed) ----
//
// out [M, N] = x [M, K] W^T for affine-quantized W, M <= QG_MAX_M, K a multiple of 32.
// The K axis is cut into chunks of 32 values, which are exactly BITS u32 words of a row (one
// 16-byte load for 4 bits, two for 8, one 8-byte load for 2, BITS scalar loads for 3/5/6).
// A chunk lies inside one group when the group size is >= 32, or covers two groups of 16.
// A block of QG_WARPS warps computes QG_ROWS output rows: its lanes stride the chunks (so the
// warps split K), each lane decodes the QG_ROWS rows' chunks once per input row and reuses its
// x values for all of them; per group it accumulates s * sum(q * x) + b * sum(x).
// The values become floats without an integer conversion: 0x4B000000 | q is the float 2^23 + q.

#define QG_MAX_M 8
#define QG_ROWS 4
#define QG_WARPS 4
// G16: groups of 16 (two per chunk); otherwise 1 << lg values per group (lg >= 5).
// `block` is this block's index among the blocks of this weight.
template <int BITS, bool G16, int MAXM>
__device__ __forceinline__ void qgemv_body(float* out, const float* x, int m, int n, const u32* packed,
                                           const void* scales, const void* biases, int p_dt, int lg, int k,
                                           int block) {
    constexpr int ROWS = QG_ROWS, WARPS = QG_WARPS;
    __shared__ float red[WARPS][ROWS][MAXM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = block * ROWS;
    const int chunks = k >> 5;
    const size_t words = (size_t)(k >> 5) * BITS;
    const size_t gpr = (size_t)(k >> lg);
    float acc[ROWS][MAXM];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int i = 0; i < MAXM; ++i) acc[r][i] = 0.0f;
#pragma unroll 1
    for (int c = threadIdx.x; c < chunks; c += 32 * WARPS) {
        u32 w[ROWS][BITS];
        float s[ROWS][2], b[ROWS][2];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            int row = min(r0 + r, n - 1);  // rows past the end repeat the last one; never written
            qg_load<BITS>(w[r], packed + row * words + (size_t)c * BITS);
            size_t g = row * gpr + (G16 ? 2 * (size_t)c : (((size_t)c << 5) >> lg));
            s[r][0] = load_float(scales, g, p_dt);
            b[r][0] = load_float(biases, g, p_dt);
            if (G16) {
                s[r][1] = load_float(scales, g + 1, p_dt);
                b[r][1] = load_float(biases, g + 1, p_dt);
            }
        }
#pragma unroll
        for (int i = 0; i < MAXM; ++i) {
            if (i < m) {
                float xv[32];
                const float4* xp = (const float4*)(x + (size_t)i * k + ((size_t)c << 5));
#pragma unroll
                for (int v = 0; v < 8; ++v) {
                    float4 t = xp[v];
                    xv[4 * v] = t.x; xv[4 * v + 1] = t.y; xv[4 * v + 2] = t.z; xv[4 * v + 3] = t.w;
                }
                float xs0 = 0.0f, xs1 = 0.0f;
#pragma unroll
                for (int j = 0; j < 16; ++j) xs0 += xv[j];
#pragma unroll
                for (int j = 16; j < 32; ++j) xs1 += xv[j];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    float q[32];
                    qg_decode<BITS>(w[r], q);
                    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
                    for (int j = 0; j < 16; ++j) d0 = fmaf(q[j], xv[j], d0);
#pragma unroll
                    for (int j = 16; j < 32; ++j) d1 = fmaf(q[j], xv[j], d1);
                    if (G16) acc[r][i] += s[r][0] * d0 + b[r][0] * xs0 + (s[r][1] * d1 + b[r][1] * xs1);
                    else acc[r][i] += s[r][0] * (d0 + d1) + b[r][0] * (xs0 + xs1);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int i = 0; i < MAXM; ++i)
            if (i < m) {
                float v = warp_sum(acc[r][i]);
                if (lane == 0) red[warp][r][i] = v;
            }
    __syncthreads();
    if (threadIdx.x < ROWS * MAXM) {
        int r = threadIdx.x / MAXM, i = threadIdx.x % MAXM;
        if (i < m && r0 + r < n) {
            float v = 0.0f;
#pragma unroll
            for (int wi = 0; wi < WARPS; ++wi) v += red[wi][r][i];
            out[(size_t)i * n + r0 + r] = v;
        }
    }
}

// out [rows, K] f32 = rows row0.. of an affine-quantized W, decoded: the tiles of the prefill
// GEMM. One thread per 32-value chunk (same loads and decoding as the GEMV), 16-byte stores.
template <int BITS>
__device__ __forceinline__ void qdequant_body(float* out, long long row0, long long rows, const u32* packed,
                                              const void* scales, const void* biases, int p_dt, int lg, int k) {
    const int chunks = k >> 5;
    const size_t words = (size_t)chunks * BITS;
    const size_t gpr = (size_t)(k >> lg);
    const size_t total = (size_t)rows * chunks;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r, c;
        u32 w[BITS];
        float s0, b0, s1, b1;
        qg_tile_chunk<BITS>(i, chunks, words, gpr, row0, packed, scales, biases, p_dt, lg, r, c, w, s0, b0, s1, b1);
        float q[32];
        qg_decode<BITS>(w, q);
        float4* o = (float4*)(out + r * (size_t)k + (c << 5));
#pragma unroll
        for (int v = 0; v < 8; ++v) {
            float sc = v < 4 ? s0 : s1, bi = v < 4 ? b0 : b1;
            o[v] = make_float4(fmaf(sc, q[4 * v], bi), fmaf(sc, q[4 * v + 1], bi), fmaf(sc, q[4 * v + 2], bi),
                               fmaf(sc, q[4 * v + 3], bi));
        }
    }
}

#define QD_PARAMS \
    float *out, long long row0, long long rows, const u32 *packed, const void *scales, const void *biases, int p_dt, \
        int lg, int k
#define QD_ARGS out, row0, rows, packed, scales, biases, p_dt, lg, k
extern "C" __global__ void qdequant_b2(QD_PARAMS) { pdl_begin(); qdequant_body<2>(QD_ARGS); }
extern "C" __global__ void qdequant_b3(QD_PARAMS) { pdl_begin(); qdequant_body<3>(QD_ARGS); }
extern "C" __global__ void qdequant_b4(QD_PARAMS) { pdl_begin(); qdequant_body<4>(QD_ARGS); }
extern "C" __global__ void qdequant_b5(QD_PARAMS) { pdl_begin(); qdequant_body<5>(QD_ARGS); }
extern "C" __global__ void qdequant_b6(QD_PARAMS) { pdl_begin(); qdequant_body<6>(QD_ARGS); }
extern "C" __global__ void qdequant_b8(QD_PARAMS) { pdl_begin(); qdequant_body<8>(QD_ARGS); }

// qgemv1_bN: one input row (decode); qgemv_bN: up to QG_MAX_M rows. Separate kernels so that
// the one-row kernel gets the registers (and occupancy) of its smaller accumulator. Written out
// (no macro) so that the host and scripts/check-cuda-kernels.sh find every name in the text.
#define QG_PARAMS \
    float *out, const float *x, int m, int n, const u32 *packed, const void *scales, const void *biases, int p_dt, \
        int lg, int k
#define QG_ARGS out, x, m, n, packed, scales, biases, p_dt, lg, k
#define QG_DISPATCH(BITS, MAXM) \
    if (lg == 4) qgemv_body<BITS, true, MAXM>(QG_ARGS, blockIdx.x); \
    else qgemv_body<BITS, false, MAXM>(QG_ARGS, blockIdx.x)

// One input row, up to three weights of the same width, group size and scale dtype in one launch
// (q/k/v, gate/up): blocks [0, nb0) compute weight 0, the next nb1 weight 1, then weight 2. addN, when
// set, is a row of nN values (dtype add_dt) added to weight N's outputs: a layer's bias, as
// add_bias_f32 would add it after the launch (q/k/v with biases: Qwen2, gpt-oss).
#define QGM_PARAMS                                                                                              \
    const float *x, int p_dt, int lg, int k, float *out0, int n0, const u32 *pk0, const void *sc0, const void *bi0, \
        float *out1, int n1, const u32 *pk1, const void *sc1, const void *bi1, float *out2, int n2,                   \
        const u32 *pk2, const void *sc2, const void *bi2, const void *add0, const void *add1, const void *add2,     \
        int add_dt
#define QGM_ARGS \
    x, p_dt, lg, k, out0, n0, pk0, sc0, bi0, out1, n1, pk1, sc1, bi1, out2, n2, pk2, sc2, bi2, add0, add1, add2, add_dt

// The weight a block of a multi-weight launch computes, at ROWS rows per block: blocks [0, nb0)
// weight 0, the next nb1 weight 1, the rest weight 2; `b` becomes the block's index among that
// weight's blocks, and `add` is the weight's bias row (or null).
template <int ROWS>
__device__ __forceinline__ void qgm_slot(QGM_PARAMS, float*& out, int& n, const u32*& pk, const void*& sc,
                                         const void*& bi, const void*& add, int& b) {
    int nb0 = (n0 + ROWS - 1) / ROWS, nb1 = (n1 + ROWS - 1) / ROWS;
    b = blockIdx.x;
    out = out0;
    n = n0;
    pk = pk0;
    sc = sc0;
    bi = bi0;
    add = add0;
    if (b >= nb0 + nb1) {
        out = out2; n = n2; pk = pk2; sc = sc2; bi = bi2; add = add2; b -= nb0 + nb1;
    } else if (b >= nb0) {
        out = out1; n = n1; pk = pk1; sc = sc1; bi = bi1; add = add1; b -= nb0;
    }
}
#define QGM_SLOT(ROWS)             \
    float* out;                    \
    int n, b;                      \
    const u32* pk;                 \
    const void *sc, *bi, *add;     \
    qgm_slot<ROWS>(QGM_ARGS, out, n, pk, sc, bi, add, b)
// The block's weight's bias row added to the rows it stored, by the threads that stored them
// (thread t row t of the block's ROWS, as qgemv_body and qg4_store_rows write one input row).
// Called after the product, so that the slot is picked again there and nothing of it stays live
// across the product's loop.
template <int ROWS>
__device__ __forceinline__ void qgm_add_bias(QGM_PARAMS) {
    QGM_SLOT(ROWS);
    const int r = b * ROWS + (int)threadIdx.x;
    if (add != nullptr && (int)threadIdx.x < ROWS && r < n) out[r] += load_float(add, r, add_dt);
}

#define QGM_DISPATCH(BITS)                                                                \
    QGM_SLOT(QG_ROWS);                                                                    \
    if (lg == 4) qgemv_body<BITS, true, 1>(out, x, 1, n, pk, sc, bi, p_dt, lg, k, b); \
    else qgemv_body<BITS, false, 1>(out, x, 1, n, pk, sc, bi, p_dt, lg, k, b);        \
    qgm_add_bias<QG_ROWS>(QGM_ARGS);

extern "C" __global__ void __launch_bounds__(128, 4) qgemv1_b2(QG_PARAMS) { pdl_begin(); QG_DISPATCH(2, 1); }
extern "C" __global__ void qgemv_b2(QG_PARAMS) { pdl_begin(); QG_DISPATCH(2, QG_MAX_M); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv1_b3(QG_PARAMS) { pdl_begin(); QG_DISPATCH(3, 1); }
extern "C" __global__ void qgemv_b3(QG_PARAMS) { pdl_begin(); QG_DISPATCH(3, QG_MAX_M); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv1_b4(QG_PARAMS) { pdl_begin(); QG_DISPATCH(4, 1); }
extern "C" __global__ void qgemv_b4(QG_PARAMS) { pdl_begin(); QG_DISPATCH(4, QG_MAX_M); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv1_b5(QG_PARAMS) { pdl_begin(); QG_DISPATCH(5, 1); }
extern "C" __global__ void qgemv_b5(QG_PARAMS) { pdl_begin(); QG_DISPATCH(5, QG_MAX_M); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv1_b6(QG_PARAMS) { pdl_begin(); QG_DISPATCH(6, 1); }
extern "C" __global__ void qgemv_b6(QG_PARAMS) { pdl_begin(); QG_DISPATCH(6, QG_MAX_M); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv1_b8(QG_PARAMS) { pdl_begin(); QG_DISPATCH(8, 1); }
extern "C" __global__ void qgemv_b8(QG_PARAMS) { pdl_begin(); QG_DISPATCH(8, QG_MAX_M); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv_multi_b2(QGM_PARAMS) { pdl_begin(); QGM_DISPATCH(2) }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv_multi_b3(QGM_PARAMS) { pdl_begin(); QGM_DISPATCH(3) }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv_multi_b4(QGM_PARAMS) { pdl_begin(); QGM_DISPATCH(4) }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv_multi_b5(QGM_PARAMS) { pdl_begin(); QGM_DISPATCH(5) }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv_multi_b6(QGM_PARAMS) { pdl_begin(); QGM_DISPATCH(6) }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv_multi_b8(QGM_PARAMS) { pdl_begin(); QGM_DISPATCH(8) }

// ---- 4-bit one-row GEMV in the probe's shape (_w2, _w1; issue 7) ----
//
// The loop of bench/cuda/gemv_probe.cu's `cur4`, which read 8B-sized weights faster than the
// `qgemv_body` at the same shape (8 rows per block; the CUDA journal,
// `git show 83079a1:docs/cuda.md`, third session): per chunk a lane loads its ROWS rows' 16-byte
// words and one scale/bias pair per row (two for groups of 16), loads the 32 x values once, then
// per row decodes and multiplies one u32 word (8 values) at a time, so only 8 decoded values are
// live instead of 32. Same arithmetic per group as qgemv_body:
// s * sum(q * x) + b * sum(x). The scale dtype is a template argument (PDT >= 0) for groups
// >= 32, picked once per launch from the runtime `p_dt`, so the loads need no per-load branch;
// groups of 16 (rare) pass PDT = -1 and read `p_dt` at run time. _w2 = 8 rows x 2 warps,
// _w1 = 8 rows x 1 warp.

// The 8 values q of one 4-bit word, in order, as the floats 1 + q / 16 (exact). Values v and
// v + 4 sit at bits 4v and 4v + 16; one shift puts both at bits 6-9 of their 16-bit half and one
// lop3 puts them under 0x3C00 (f16 1.0), giving the f16 pair (1 + q_v / 16, 1 + q_{v+4} / 16);
// f16_to_f32 (cvt.f32.f16, HADD2.F32 in SASS) widens each. The loops multiply that by x and fold
// the 1 into the group's sum of x, since sum(q x) = 16 (sum((1 + q/16) x) - sum(x)) (qg4_group).
// The same floats as the former byte_perm per value (a byte 1qqqq000 under 0x3F), so the same
// sums bit for bit, with the widening on the FMA pipe instead of the integer one: the same
// instruction count, random 8B decode +2 % on the H200 (the CUDA journal,
// `git show 83079a1:docs/cuda.md`, eighth session: the loop is bound by instructions issued,
// not by one pipe). Products and sums stay f32, relative error ~4e-6 of mean|out|.
__device__ __forceinline__ void qg4_word(u32 w, float (&q)[8]) {
    const u32 one = 0x3C003C00u;  // f16 1.0 in both halves
    const u32 p[4] = {and_or<0x03C003C0u>(w << 6, one), and_or<0x03C003C0u>(w << 2, one),
                      and_or<0x03C003C0u>(w >> 2, one), and_or<0x03C003C0u>(w >> 6, one)};
#pragma unroll
    for (int v = 0; v < 4; ++v) {
        q[v] = f16_to_f32((u16)(p[v] & 0xFFFFu));
        q[v + 4] = f16_to_f32((u16)(p[v] >> 16));
    }
}

// A group's share s * sum(q x) + b * sum(x), from d = sum((1 + q/16) x) (qg4_word) and xs = sum(x).
__device__ __forceinline__ float qg4_group(float s, float b, float d, float xs) {
    return (16.0f * s) * d + (b - 16.0f * s) * xs;
}

// A lane's chunk c of rows r0.. (COUNT of them, into slots FIRST.. of the ROWS-row arrays; rows
// past n repeat the last, never written): the 16-byte word group of each row and its scale/bias
// pair (two for groups of 16). gate_up_silu fills the first half from gate, the second from up.
template <bool G16, int ROWS, int FIRST = 0, int COUNT = ROWS>
__device__ __forceinline__ void qg4_load_rows(uint4 (&w)[ROWS], float (&s)[ROWS][G16 ? 2 : 1],
                                              float (&b)[ROWS][G16 ? 2 : 1], const u32* __restrict__ packed,
                                              const void* __restrict__ scales, const void* __restrict__ biases, int dt,
                                              int lg, int r0, int n, int c, size_t words, size_t gpr) {
    static_assert(FIRST + COUNT <= ROWS, "rows outside the arrays");
#pragma unroll
    for (int r = 0; r < COUNT; ++r) {
        const size_t row = (size_t)min(r0 + r, n - 1);
        w[FIRST + r] = __ldg((const uint4*)(packed + row * words + (size_t)c * 4));
        const size_t g = row * gpr + (G16 ? 2 * (size_t)c : (((size_t)c << 5) >> lg));
#pragma unroll
        for (int h = 0; h < (G16 ? 2 : 1); ++h) {
            s[FIRST + r][h] = load_float(scales, g + h, dt);
            b[FIRST + r][h] = load_float(biases, g + h, dt);
        }
    }
}

// The start of a block's weight rows r0.. (ROWS of them, fewer at the end) asked into L2 before
// its pdl_begin: the first QG_PF_BYTES of its packed words (k / 2 bytes a row), of its scales and
// of its biases, by thread t0 (the integer kernels _i1, _i2, _i4, _i1_parts; the others would spill). The blocks
// launch while the kernel before them (a norm, attention's merge, the GEMV before) still runs.
// Measured on the H200 (eleventh session, 8B decode): 2 KiB +1.2 %, 4 KiB +0.6 %, 8 KiB -0.8 %,
// 16 KiB -3 % and whole slices -10 % (the prefetches then compete with the loads of the kernel
// beside them); a 1B +2 % (with the attention split's).
#ifndef QG_PF_BYTES
#define QG_PF_BYTES 2048
#endif
template <int ROWS, int BITS = 4>
__device__ __forceinline__ void qg4_prefetch(const u32* packed, const void* scales, const void* biases, int p_dt, int lg,
                                             int k, int r0, int n, int t0 = 0) {
    const size_t cap = QG_PF_BYTES;
    if (cap == 0 || (int)threadIdx.x != t0 || r0 >= n) return;
    const size_t rows = (size_t)min(ROWS, n - r0), words = (size_t)k / (8 / BITS), params = (size_t)(k >> lg) * (p_dt == DT_F32 ? 4 : 2);
    const size_t pb = rows * words < cap ? rows * words : cap, sb = rows * params < cap ? rows * params : cap;
    l2_prefetch((const char*)packed + (size_t)r0 * words, pb);
    l2_prefetch((const char*)scales + (size_t)r0 * params, sb);
    l2_prefetch((const char*)biases + (size_t)r0 * params, sb);
}
// The kernels' first lines: their rows prefetched, then pdl_begin. One row (QG_PARAMS), several
// weights (QGM_PARAMS: the block's weight as qgm_slot picks it), and gate/up (GUS_PARAMS).
#define QG4_BEGIN(ROWS, ...)                                                                           \
    qg4_prefetch<ROWS, ##__VA_ARGS__>(packed, scales, biases, p_dt, lg, k, (int)blockIdx.x * (ROWS), n); \
    pdl_begin()
#define QGM4_BEGIN(ROWS, ...)                                                        \
    {                                                                                \
        QGM_SLOT(ROWS);                                                              \
        qg4_prefetch<ROWS, ##__VA_ARGS__>(pk, sc, bi, p_dt, lg, k, b * (ROWS), n); \
    }                                                                                \
    pdl_begin()
#define GUS_BEGIN(ROWS)                                                                  \
    qg4_prefetch<ROWS>(pg, sg, bg, p_dt, lg, k, (int)blockIdx.x * (ROWS), n);            \
    qg4_prefetch<ROWS>(pu, su, bu, p_dt, lg, k, (int)blockIdx.x * (ROWS), n, 1); \
    pdl_begin()

// The rows of one weight whose chunk a lane loads (qg4_load_rows into slots FIRST..): the row
// source of qgemv4w_acc / qgemv4x_acc.
template <bool G16, int ROWS, int FIRST = 0, int COUNT = ROWS>
struct Qg4Rows {
    const u32* packed;
    const void *scales, *biases;
    int dt, lg, r0, n;
    size_t words, gpr;
    __device__ __forceinline__ void operator()(uint4 (&w)[ROWS], float (&s)[ROWS][G16 ? 2 : 1],
                                               float (&b)[ROWS][G16 ? 2 : 1], int c) const {
        qg4_load_rows<G16, ROWS, FIRST, COUNT>(w, s, b, packed, scales, biases, dt, lg, r0, n, c, words, gpr);
    }
};

// The same for an 8-bit weight (the integer loop; groups of 32 and more): each row's chunk as two
// 16-byte loads (words 0-3, 4-7) and its scale/bias pair.
template <int ROWS>
struct Qg8Rows {
    const u32* packed;
    const void *scales, *biases;
    int dt, lg, r0, n;
    size_t words, gpr;
    __device__ __forceinline__ void operator()(uint4 (&w)[ROWS][2], float (&s)[ROWS][1], float (&b)[ROWS][1],
                                               int c) const {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const size_t row = (size_t)min(r0 + r, n - 1);
            const uint4* p = (const uint4*)(packed + row * words + (size_t)c * 8);
            w[r][0] = __ldg(p);
            w[r][1] = __ldg(p + 1);
            const size_t g = row * gpr + (((size_t)c << 5) >> lg);
            s[r][0] = load_float(scales, g, dt);
            b[r][0] = load_float(biases, g, dt);
        }
    }
};

// Each row's lane sums added across the warp into red[warp][row], then a barrier.
template <int ROWS, int WARPS>
__device__ __forceinline__ void qg4_reduce_rows(const float (&acc)[ROWS], float (&red)[WARPS][ROWS]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        float v = warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = v;
    }
    __syncthreads();
}

// Row r's total after qg4_reduce_rows: the warps' sums in order.
template <int ROWS, int WARPS>
__device__ __forceinline__ float qg4_row_total(const float (&red)[WARPS][ROWS], unsigned r) {
    float v = 0.0f;
#pragma unroll
    for (int wi = 0; wi < WARPS; ++wi) v += red[wi][r];
    return v;
}

// Each row's total; rows < n written.
// `scale`: xq_norm_scale's factor for the integer loop (1 otherwise, which changes no bit).
template <int ROWS, int WARPS>
__device__ __forceinline__ void qg4_store_rows(float* out, const float (&acc)[ROWS], float (&red)[WARPS][ROWS], int r0,
                                               int n, float scale = 1.0f) {
    qg4_reduce_rows<ROWS, WARPS>(acc, red);
    if (threadIdx.x < ROWS && r0 + (int)threadIdx.x < n)
        out[r0 + threadIdx.x] = qg4_row_total<ROWS, WARPS>(red, threadIdx.x) * scale;
}

// A lane's sums of the per-word loop: acc[r] over the chunks c = lane, lane + 32 * WARPS, ...
// of the ROWS rows that load(w, s, b, c) fetches (qg4_load_rows).
template <bool G16, int ROWS, int WARPS, class Load>
__device__ __forceinline__ void qgemv4w_acc(float (&acc)[ROWS], const float* __restrict__ x, int k, Load load) {
    const int chunks = k >> 5;
    constexpr int NG = G16 ? 2 : 1;  // scale/bias pairs per chunk
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    for (int c = threadIdx.x; c < chunks; c += 32 * WARPS) {
        uint4 w[ROWS];
        float s[ROWS][NG], b[ROWS][NG];
        load(w, s, b, c);
        float xv[32];
        const float4* xp = (const float4*)(x + ((size_t)c << 5));
#pragma unroll
        for (int v = 0; v < 8; ++v) {
            float4 t = __ldg(xp + v);
            xv[4 * v] = t.x; xv[4 * v + 1] = t.y; xv[4 * v + 2] = t.z; xv[4 * v + 3] = t.w;
        }
        float xs[NG];
#pragma unroll
        for (int h = 0; h < NG; ++h) {
            xs[h] = 0.0f;
#pragma unroll
            for (int j = 0; j < 32 / NG; ++j) xs[h] += xv[h * (32 / NG) + j];
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const u32 ww[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
            float d[NG];
#pragma unroll
            for (int h = 0; h < NG; ++h) d[h] = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float q[8];
                qg4_word(ww[j], q);
                const int h = G16 ? (j >> 1) : 0;  // words 0-1 are the chunk's first 16 values
#pragma unroll
                for (int t = 0; t < 8; ++t) d[h] = fmaf(q[t], xv[8 * j + t], d[h]);
            }
#pragma unroll
            for (int h = 0; h < NG; ++h) acc[r] += qg4_group(s[r][h], b[r][h], d[h], xs[h]);
        }
    }
}

// The same arithmetic with x read per word: for each of a chunk's 4 words, the lane
// loads its 8 x values and multiplies them with that word of every row, so 8 x values are live
// instead of 32. Each row's sums add in the order of qgemv4w_acc (words in order, values in
// order). The registers saved buy occupancy: at 64 registers
// (4 rows) an SM holds 32 warps where the 128 of qgemv4w_acc's kernels hold 16 (ncu on the H200: the _w1
// gate/up launch reached 1.8 TB/s at 13.5 active warps per SM, 4 per scheduler).
// A lane's sums with x read per word, over the rows that load fetches (as qgemv4w_acc).
template <bool G16, int ROWS, int WARPS, class Load>
__device__ __forceinline__ void qgemv4x_acc(float (&acc)[ROWS], const float* __restrict__ x, int k, Load load) {
    const int chunks = k >> 5;
    constexpr int NG = G16 ? 2 : 1;  // scale/bias pairs per chunk
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    for (int c = threadIdx.x; c < chunks; c += 32 * WARPS) {
        uint4 w[ROWS];
        float s[ROWS][NG], b[ROWS][NG];
        load(w, s, b, c);
        float d[ROWS][NG], xs[NG];
#pragma unroll
        for (int h = 0; h < NG; ++h) {
            xs[h] = 0.0f;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) d[r][h] = 0.0f;
        }
        const float4* xp = (const float4*)(x + ((size_t)c << 5));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int h = G16 ? (j >> 1) : 0;  // words 0-1 are the chunk's first 16 values
            float4 t0 = __ldg(xp + 2 * j), t1 = __ldg(xp + 2 * j + 1);
            float xv[8] = {t0.x, t0.y, t0.z, t0.w, t1.x, t1.y, t1.z, t1.w};
#pragma unroll
            for (int t = 0; t < 8; ++t) xs[h] += xv[t];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const u32 word = j == 0 ? w[r].x : j == 1 ? w[r].y : j == 2 ? w[r].z : w[r].w;
                float q[8];
                qg4_word(word, q);
#pragma unroll
                for (int t = 0; t < 8; ++t) d[r][h] = fmaf(q[t], xv[t], d[r][h]);
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int h = 0; h < NG; ++h) acc[r] += qg4_group(s[r][h], b[r][h], d[r][h], xs[h]);
    }
}

// ---- Integer dot products (issue 7; _i1, _i2, _i4, the default for groups of 32 and more) ----
//
// x split per 32-value chunk into a 24-bit block fixed point: X = rint(x 2^e), |X| <= 2^22 for the
// chunk's largest |x|, held as three int8 parts X = 65536 hi + 256 mid + lo (hi signed, mid and lo
// unsigned). Each value is x to within 2^-23 of its chunk's largest (what an f32 sum of the
// products resolves anyway). A word's 8 nibbles masked into two registers (values 0,2,4,6 and
// 1,3,5,7, a byte each) meet the parts' bytes in that order in dp4a: 2 masks, 1 shift and 6 dp4a
// per word and row (the f32 loops issue ~24), the int32 sums exact; per chunk and row the three
// sums join in f32 (65536 S_hi + 256 S_mid + S_lo), scale by 2^-e, and s * dot + b * sum(x).
// The sixth and eighth sessions' probes found the f32 loops bound by instructions issued per word.

// x's parts for the integer GEMVs (layout and rounding: xsplit_chunk, common.cuh), a warp per
// 32-value chunk. Producers that can (the row norms, attention_merge_f32, gate_up_silu_b4_*)
// write the parts of their one-row outputs themselves, which saves this launch.
extern "C" __global__ void xsplit_f32(u32* __restrict__ parts, const float* __restrict__ x, int k) {
    pdl_begin();
    const int chunks = k >> 5, lane = threadIdx.x & 31;
    const int warps = (int)((gridDim.x * blockDim.x) >> 5);
    for (int c = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5); c < chunks; c += warps)
        xsplit_chunk(parts, chunks, c, x[(size_t)c * 32 + lane], lane);
}

// A row's chunk of codes as the integer loop holds it: one uint4 of 4-bit codes, two of 8-bit.
template <int BITS>
struct QiChunk {
    using T = uint4;
};
template <>
struct QiChunk<8> {
    using T = uint4[2];
};

// A lane's sums over x's parts (xsplit_f32's buffer `xq`), over the rows that load fetches (as
// qgemv4x_acc; groups of 32 and more: one scale/bias pair per chunk), of BITS-bit codes (4: qi4_sums;
// 8: qi8_sums). `first`: the lane's first chunk where it is not threadIdx.x (gate_up_silu_b4_i1_parts's
// warps each run a block's loop of their own).
template <int ROWS, int WARPS, int BITS = 4, class Load>
__device__ __forceinline__ void qgemv4i_acc(float (&acc)[ROWS], bool& pending, const u32* __restrict__ xq, int k,
                                            Load load, int first = -1) {
    const int chunks = k >> 5;
    const float* __restrict__ xscale = (const float*)(xq + (size_t)chunks * QI_WORDS);
    const float* __restrict__ xsum = xscale + chunks;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    pending = false;
    for (int c = first < 0 ? (int)threadIdx.x : first; c < chunks; c += 32 * WARPS) {
        typename QiChunk<BITS>::T w[ROWS];
        float s[ROWS][1], b[ROWS][1];
        load(w, s, b, c);
        int S[ROWS][3];
        if constexpr (BITS == 8) qi8_sums<ROWS>(w, xq + (size_t)c * QI_WORDS, S);
        else qi4_sums<ROWS>(w, xq + (size_t)c * QI_WORDS, S);
        const float xsc = __ldg(xscale + c), xs = __ldg(xsum + c);
        pending = xsc < 0.0f;  // a norm's scale pending (every chunk's sign): the sums come out negated (common.cuh)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r] += s[r][0] * (qi_total(S[r]) * xsc) + b[r][0] * xs;
    }
}

// The loops of the one-row 4-bit kernels: per word (qgemv4w_acc), x per word (qgemv4x_acc) and
// integer dot products over x's parts (qgemv4i_acc, where the kernel's `x` argument is
// xsplit_f32's buffer). The last two take groups of 32 and more only.
#define QG_LOOP_WORD 0
#define QG_LOOP_XWORD 1
#define QG_LOOP_INT 2

// One block of a one-row launch (QG_PARAMS, `m` is 1, so that the host launches it like the
// other variants): groups of 16 with the runtime dtype, otherwise one instance per scale dtype.
// LOOP picks the loop (QG_LOOP_*); BITS = 8 (8-bit codes) takes the integer loop only.
template <bool G16, int PDT, int ROWS, int WARPS, int LOOP, int BITS = 4>
__device__ __forceinline__ void qgemv4_run(float* out, const float* __restrict__ x, int n,
                                           const u32* __restrict__ packed, const void* __restrict__ scales,
                                           const void* __restrict__ biases, int p_dt, int lg, int k, int block) {
    __shared__ float red[WARPS][ROWS];
    const int dt = PDT >= 0 ? PDT : p_dt;
    const int r0 = block * ROWS;
    static_assert(BITS == 4 || (BITS == 8 && LOOP == QG_LOOP_INT && !G16), "8-bit codes take the integer loop");
    const size_t words = (size_t)(k >> 5) * BITS, gpr = (size_t)(k >> lg);
    float acc[ROWS];
    bool pending = false;
    if constexpr (BITS == 8) {
        const Qg8Rows<ROWS> load{packed, scales, biases, dt, lg, r0, n, words, gpr};
        qgemv4i_acc<ROWS, WARPS, 8>(acc, pending, (const u32*)x, k, load);
    } else {
        const Qg4Rows<G16, ROWS> load{packed, scales, biases, dt, lg, r0, n, words, gpr};
        if constexpr (LOOP == QG_LOOP_INT) qgemv4i_acc<ROWS, WARPS>(acc, pending, (const u32*)x, k, load);
        else if constexpr (LOOP == QG_LOOP_XWORD) qgemv4x_acc<G16, ROWS, WARPS>(acc, x, k, load);
        else qgemv4w_acc<G16, ROWS, WARPS>(acc, x, k, load);
    }
    const float scale = LOOP == QG_LOOP_INT ? xq_norm_scale((const u32*)x, k, pending) : 1.0f;
    qg4_store_rows<ROWS, WARPS>(out, acc, red, r0, n, scale);
}

// The x-per-word and integer kernels take groups of 32 and more only: the x-per-word ones' register
// cap (64) would spill the two scale pairs per row of groups of 16, and x's parts carry one sum per
// 32 values, so the host never launches them for those (a launch that did would trap, not return
// wrong numbers).
template <int ROWS, int WARPS, int LOOP = QG_LOOP_WORD, int BITS = 4>
__device__ __forceinline__ void qgemv4w_one(QG_PARAMS) {
    if (LOOP != QG_LOOP_WORD && lg == 4) __trap();
    if constexpr (LOOP == QG_LOOP_WORD)
        if (lg == 4) return qgemv4_run<true, -1, ROWS, WARPS, LOOP>(out, x, n, packed, scales, biases, p_dt, lg, k, blockIdx.x);
    if (p_dt == DT_BF16)
        qgemv4_run<false, DT_BF16, ROWS, WARPS, LOOP, BITS>(out, x, n, packed, scales, biases, p_dt, lg, k, blockIdx.x);
    else if (p_dt == DT_F16)
        qgemv4_run<false, DT_F16, ROWS, WARPS, LOOP, BITS>(out, x, n, packed, scales, biases, p_dt, lg, k, blockIdx.x);
    else qgemv4_run<false, DT_F32, ROWS, WARPS, LOOP, BITS>(out, x, n, packed, scales, biases, p_dt, lg, k, blockIdx.x);
}

// The multi-weight launch: the block-to-weight mapping of qgm_slot, done inside each
// (group, dtype) instance: picking the weight before the dtype branch made ptxas spill at the
// 128-register cap (216 bytes), this order does not.
template <bool G16, int PDT, int ROWS, int WARPS, int LOOP, int BITS = 4>
__device__ __forceinline__ void qgemv4w_pick(QGM_PARAMS) {
    QGM_SLOT(ROWS);
    qgemv4_run<G16, PDT, ROWS, WARPS, LOOP, BITS>(out, x, n, pk, sc, bi, p_dt, lg, k, b);
    qgm_add_bias<ROWS>(QGM_ARGS);
}
template <int ROWS, int WARPS, int LOOP = QG_LOOP_WORD, int BITS = 4>
__device__ __forceinline__ void qgemv4w_multi(QGM_PARAMS) {
    if (LOOP != QG_LOOP_WORD && lg == 4) __trap();
    if constexpr (LOOP == QG_LOOP_WORD)
        if (lg == 4) return qgemv4w_pick<true, -1, ROWS, WARPS, LOOP>(QGM_ARGS);
    if (p_dt == DT_BF16) qgemv4w_pick<false, DT_BF16, ROWS, WARPS, LOOP, BITS>(QGM_ARGS);
    else if (p_dt == DT_F16) qgemv4w_pick<false, DT_F16, ROWS, WARPS, LOOP, BITS>(QGM_ARGS);
    else qgemv4w_pick<false, DT_F32, ROWS, WARPS, LOOP, BITS>(QGM_ARGS);
}

// Launch bounds as the probe compiled: 128 registers (8 blocks of 2 warps, or 16 of 1, per SM).
// Without the minimum-blocks bound ptxas gave these kernels ~250 registers (as it gave the removed
// 8-row qgemv_body shapes: 254), i.e. half the resident warps, although each (group, dtype) body
// needs 128.
extern "C" __global__ void __launch_bounds__(64, 8) qgemv1_b4_w2(QG_PARAMS) { pdl_begin(); qgemv4w_one<8, 2>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(32, 16) qgemv1_b4_w1(QG_PARAMS) { pdl_begin(); qgemv4w_one<8, 1>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(64, 8) qgemv_multi_b4_w2(QGM_PARAMS) { pdl_begin(); qgemv4w_multi<8, 2>(QGM_ARGS); }
extern "C" __global__ void __launch_bounds__(32, 16) qgemv_multi_b4_w1(QGM_PARAMS) { pdl_begin(); qgemv4w_multi<8, 1>(QGM_ARGS); }
// The same loop with 4 and 8 warps per block (_w4, _w8): for weights of few rows and long rows (an
// 8B's o and down projections: 512 blocks of 8 rows), where 2 warps per block leave most of the
// SMs' warp slots empty and each lane waits on its loads in turn. 128 registers, as _w2.
extern "C" __global__ void __launch_bounds__(128, 4) qgemv1_b4_w4(QG_PARAMS) { pdl_begin(); qgemv4w_one<8, 4>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 2) qgemv1_b4_w8(QG_PARAMS) { pdl_begin(); qgemv4w_one<8, 8>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv_multi_b4_w4(QGM_PARAMS) { pdl_begin(); qgemv4w_multi<8, 4>(QGM_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 2) qgemv_multi_b4_w8(QGM_PARAMS) { pdl_begin(); qgemv4w_multi<8, 8>(QGM_ARGS); }
// x per word (qgemv4x_acc; groups of 32 and more): _xw1 = 8 rows x 1 warp at 96 registers (20
// warps per SM), the long grids' kernel while the integer GEMVs are off. (v10 and v12, 4 rows x 1
// and x 4 warps, were never picked and went.)
extern "C" __global__ void __launch_bounds__(32, 20) qgemv1_b4_xw1(QG_PARAMS) { pdl_begin(); qgemv4w_one<8, 1, QG_LOOP_XWORD>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(32, 20) qgemv_multi_b4_xw1(QGM_PARAMS) { pdl_begin(); qgemv4w_multi<8, 1, QG_LOOP_XWORD>(QGM_ARGS); }
// Integer dot products over x's parts (the `x` argument is xsplit_f32's buffer): _i1 = 8 rows x 1
// warp, _i4 = 8 rows x 4 warps, _i2 = 8 rows x 2 warps, 128 registers.
extern "C" __global__ void __launch_bounds__(32, 16) qgemv1_b4_i1(QG_PARAMS) { QG4_BEGIN(8); qgemv4w_one<8, 1, QG_LOOP_INT>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv1_b4_i4(QG_PARAMS) { QG4_BEGIN(8); qgemv4w_one<8, 4, QG_LOOP_INT>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(32, 16) qgemv_multi_b4_i1(QGM_PARAMS) { QGM4_BEGIN(8); qgemv4w_multi<8, 1, QG_LOOP_INT>(QGM_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv_multi_b4_i4(QGM_PARAMS) { QGM4_BEGIN(8); qgemv4w_multi<8, 4, QG_LOOP_INT>(QGM_ARGS); }
extern "C" __global__ void __launch_bounds__(64, 8) qgemv1_b4_i2(QG_PARAMS) { QG4_BEGIN(8); qgemv4w_one<8, 2, QG_LOOP_INT>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(64, 8) qgemv_multi_b4_i2(QGM_PARAMS) { QGM4_BEGIN(8); qgemv4w_multi<8, 2, QG_LOOP_INT>(QGM_ARGS); }

// 8-bit codes (MLX's 8-bit affine, a GGUF's Q8_0; groups of 32 and more) on the same integer loop
// (qi8_sums: x's parts in value order, no masks), 4 rows per block (a row's chunk is 32 bytes)
// and 1, 2 or 4 warps (_i1, _i2, _i4: the host's qgemv8_variant); the f32 body (qgemv1_b8)
// decodes each byte to a float and issues about three instructions per value and row.
extern "C" __global__ void __launch_bounds__(32, 16) qgemv1_b8_i1(QG_PARAMS) { QG4_BEGIN(4, 8); qgemv4w_one<4, 1, QG_LOOP_INT, 8>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(64, 8) qgemv1_b8_i2(QG_PARAMS) { QG4_BEGIN(4, 8); qgemv4w_one<4, 2, QG_LOOP_INT, 8>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv1_b8_i4(QG_PARAMS) { QG4_BEGIN(4, 8); qgemv4w_one<4, 4, QG_LOOP_INT, 8>(QG_ARGS); }
extern "C" __global__ void __launch_bounds__(32, 16) qgemv_multi_b8_i1(QGM_PARAMS) { QGM4_BEGIN(4, 8); qgemv4w_multi<4, 1, QG_LOOP_INT, 8>(QGM_ARGS); }
extern "C" __global__ void __launch_bounds__(64, 8) qgemv_multi_b8_i2(QGM_PARAMS) { QGM4_BEGIN(4, 8); qgemv4w_multi<4, 2, QG_LOOP_INT, 8>(QGM_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 4) qgemv_multi_b8_i4(QGM_PARAMS) { QGM4_BEGIN(4, 8); qgemv4w_multi<4, 4, QG_LOOP_INT, 8>(QGM_ARGS); }

// ---- gate_up_silu: a gated MLP's hidden activations in the gate/up GEMV (issue 7) ----
//
// out[i] = silu(x . gate[i]) * (x . up[i]) for one input row, 4-bit affine gate and up of one
// shape, group size (32 and more) and scale dtype: one launch where linear_many then silu_mul
// took two. Each block takes ROWS rows of gate and the same ROWS rows of up as one 2 * ROWS-row
// pass of the per-word, x-per-word or integer loop (qgemv4w_acc, qgemv4x_acc, qgemv4i_acc), so
// each row's sum adds in the order of the qgemv_multi_b4 kernel of the same loop and warps per
// block; the host picks the variant that qgemv4_variant picks for the [gate; up] launch (the same
// grid: 2 * ROWS rows per block there too), so that the fused result equals linear_many then silu_mul
// bit for bit. The product is silu_mul_f32's expression.
// ROWS rows of gate into the first half of a block's row arrays, the same rows of up into the second.
template <int ROWS>
struct GateUpRows {
    Qg4Rows<false, 2 * ROWS, 0, ROWS> gate;
    Qg4Rows<false, 2 * ROWS, ROWS, ROWS> up;
    __device__ __forceinline__ void operator()(uint4 (&w)[2 * ROWS], float (&s)[2 * ROWS][1], float (&b)[2 * ROWS][1],
                                               int c) const {
        gate(w, s, b, c);
        up(w, s, b, c);
    }
};

template <int LOOP, int PDT, int ROWS, int WARPS>
__device__ __forceinline__ void gate_up_silu_body(float* out, const float* __restrict__ x, int n,
                                                  const u32* __restrict__ pg, const void* __restrict__ sg,
                                                  const void* __restrict__ bg, const u32* __restrict__ pu,
                                                  const void* __restrict__ su, const void* __restrict__ bu, int lg,
                                                  int k) {
    constexpr int R2 = 2 * ROWS;  // gate rows, then up rows
    __shared__ float red[WARPS][R2];
    const int r0 = blockIdx.x * ROWS;
    const size_t words = (size_t)(k >> 5) * 4, gpr = (size_t)(k >> lg);
    float acc[R2];
    const GateUpRows<ROWS> load{{pg, sg, bg, PDT, lg, r0, n, words, gpr}, {pu, su, bu, PDT, lg, r0, n, words, gpr}};
    bool pending = false;
    if constexpr (LOOP == QG_LOOP_INT) qgemv4i_acc<R2, WARPS>(acc, pending, (const u32*)x, k, load);
    else if constexpr (LOOP == QG_LOOP_XWORD) qgemv4x_acc<false, R2, WARPS>(acc, x, k, load);
    else qgemv4w_acc<false, R2, WARPS>(acc, x, k, load);
    qg4_reduce_rows<R2, WARPS>(acc, red);
    const float scale = LOOP == QG_LOOP_INT ? xq_norm_scale((const u32*)x, k, pending) : 1.0f;
    const unsigned t = threadIdx.x;
    if (t < ROWS && r0 + (int)t < n) {
        const float g = qg4_row_total<R2, WARPS>(red, t) * scale, u = qg4_row_total<R2, WARPS>(red, ROWS + t) * scale;
        out[r0 + t] = g / (1.0f + expf(-g)) * u;
    }
}

#define GUS_PARAMS                                                                                               \
    float *out, const float *x, int n, const u32 *pg, const void *sg, const void *bg, const u32 *pu, const void *su, \
        const void *bu, int p_dt, int lg, int k
#define GUS_ARGS out, x, n, pg, sg, bg, pu, su, bu, lg, k
#define GUS_CALL out, x, n, pg, sg, bg, pu, su, bu, p_dt, lg, k
// Groups of 16 trap: the host runs linear_many then silu_mul for those.
template <int ROWS, int WARPS, int LOOP>
__device__ __forceinline__ void gate_up_silu_b4(GUS_PARAMS) {
    if (lg < 5) __trap();
    if (p_dt == DT_BF16) gate_up_silu_body<LOOP, DT_BF16, ROWS, WARPS>(GUS_ARGS);
    else if (p_dt == DT_F16) gate_up_silu_body<LOOP, DT_F16, ROWS, WARPS>(GUS_ARGS);
    else gate_up_silu_body<LOOP, DT_F32, ROWS, WARPS>(GUS_ARGS);
}

// One per qgemv_multi_b4 variant of the per-word, x-per-word and integer loops, with its launch
// bounds: 4 rows of gate and 4 of up per block where the variant takes 8 rows (2 and 2 for 4).
extern "C" __global__ void __launch_bounds__(64, 8) gate_up_silu_b4_w2(GUS_PARAMS) { pdl_begin(); gate_up_silu_b4<4, 2, QG_LOOP_WORD>(GUS_CALL); }
extern "C" __global__ void __launch_bounds__(32, 16) gate_up_silu_b4_w1(GUS_PARAMS) { pdl_begin(); gate_up_silu_b4<4, 1, QG_LOOP_WORD>(GUS_CALL); }
extern "C" __global__ void __launch_bounds__(128, 4) gate_up_silu_b4_w4(GUS_PARAMS) { pdl_begin(); gate_up_silu_b4<4, 4, QG_LOOP_WORD>(GUS_CALL); }
extern "C" __global__ void __launch_bounds__(256, 2) gate_up_silu_b4_w8(GUS_PARAMS) { pdl_begin(); gate_up_silu_b4<4, 8, QG_LOOP_WORD>(GUS_CALL); }
extern "C" __global__ void __launch_bounds__(32, 20) gate_up_silu_b4_xw1(GUS_PARAMS) { pdl_begin(); gate_up_silu_b4<4, 1, QG_LOOP_XWORD>(GUS_CALL); }
extern "C" __global__ void __launch_bounds__(32, 16) gate_up_silu_b4_i1(GUS_PARAMS) { GUS_BEGIN(4); gate_up_silu_b4<4, 1, QG_LOOP_INT>(GUS_CALL); }
extern "C" __global__ void __launch_bounds__(128, 4) gate_up_silu_b4_i4(GUS_PARAMS) { GUS_BEGIN(4); gate_up_silu_b4<4, 4, QG_LOOP_INT>(GUS_CALL); }
extern "C" __global__ void __launch_bounds__(64, 8) gate_up_silu_b4_i2(GUS_PARAMS) { GUS_BEGIN(4); gate_up_silu_b4<4, 2, QG_LOOP_INT>(GUS_CALL); }

// _i1_parts: _i1's blocks (4 rows of gate and 4 of up, one warp, the integer loop) as the 8 warps of one
// block, which then holds 32 outputs: one 32-value chunk of the down projection's input, whose
// integer parts its first warp writes (xsplit_chunk) with the outputs, so that the down
// projection needs no xsplit_f32 launch. Each warp's loop, warp sums (qg4_reduce_rows, whose
// rows are per warp here) and 0 + sum (qg4_row_total over one warp) are _i1's, so the outputs
// equal _i1's bit for bit. The host takes it where _i1 is picked and n is a multiple of 32.
template <int PDT>
__device__ __forceinline__ void gate_up_silu_chunk(float* out, const u32* __restrict__ xq, int n,
                                                   const u32* __restrict__ pg, const void* __restrict__ sg,
                                                   const void* __restrict__ bg, const u32* __restrict__ pu,
                                                   const void* __restrict__ su, const void* __restrict__ bu, int lg,
                                                   int k, u32* __restrict__ parts) {
    __shared__ float red[8][8];  // [warp][gate rows, then up rows]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * 32 + warp * 4;
    const size_t words = (size_t)(k >> 5) * 4, gpr = (size_t)(k >> lg);
    float acc[8];
    const GateUpRows<4> load{{pg, sg, bg, PDT, lg, r0, n, words, gpr}, {pu, su, bu, PDT, lg, r0, n, words, gpr}};
    bool pending;
    qgemv4i_acc<8, 1>(acc, pending, xq, k, load, lane);
    qg4_reduce_rows<8, 8>(acc, red);  // each warp's own rows: red[warp][row]
    if (warp != 0) return;
    const float scale = xq_norm_scale(xq, k, pending);
    const float g = (0.0f + red[lane >> 2][lane & 3]) * scale, u = (0.0f + red[lane >> 2][4 + (lane & 3)]) * scale;
    const float h = g / (1.0f + expf(-g)) * u;
    out[blockIdx.x * 32 + lane] = h;
    xsplit_chunk(parts, n >> 5, (int)blockIdx.x, h, lane);
}
extern "C" __global__ void __launch_bounds__(256, 2) gate_up_silu_b4_i1_parts(GUS_PARAMS, u32* parts) {
    GUS_BEGIN(32);
    if (lg < 5 || (n & 31)) __trap();
    const u32* xq = (const u32*)x;
    if (p_dt == DT_BF16) gate_up_silu_chunk<DT_BF16>(out, xq, n, pg, sg, bg, pu, su, bu, lg, k, parts);
    else if (p_dt == DT_F16) gate_up_silu_chunk<DT_F16>(out, xq, n, pg, sg, bg, pu, su, bu, lg, k, parts);
    else gate_up_silu_chunk<DT_F32>(out, xq, n, pg, sg, bg, pu, su, bu, lg, k, parts);
}

// ---- The o and down projections with the residual add and half the next norm (issue 7) ----
//
// h = res + W x for one input row, 32 rows per block as four groups of _i4's 8 rows x 4 warps
// (the same loop, warp sums and 0 + sum over the group's warps, so h equals _i4's output plus
// res bit for bit), then, for the integer GEMVs that read the norm's output y = rms_norm(h) * w:
// the parts of u = h * w (xsplit_chunk) and the 32 rows' sum of squares of h in the parts' norm
// tail, with eps (common.cuh), so that those GEMVs scale their totals by 1 / rms(h) and no norm
// kernel runs. `y` gets u (the host scales it in place, rms_settle_f32, if anything else reads
// it). n a multiple of 32, groups of 32 and more, eps > 0 (the host checks).
template <int PDT>
__device__ __forceinline__ void qgemv_norm_rows(float* h, float* y, const u32* __restrict__ xq, int n,
                                                const u32* __restrict__ packed, const void* __restrict__ scales,
                                                const void* __restrict__ biases, int lg, int k,
                                                const float* __restrict__ res, const void* nw, int nw_dt, float eps,
                                                u32* __restrict__ parts) {
    __shared__ float red[16][8];  // [warp][row of its group]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, group = warp >> 2;
    const int r0 = blockIdx.x * 32 + group * 8;
    const size_t words = (size_t)(k >> 5) * 4, gpr = (size_t)(k >> lg);
    const Qg4Rows<false, 8> load{packed, scales, biases, PDT, lg, r0, n, words, gpr};
    float acc[8];
    bool pending;
    qgemv4i_acc<8, 4>(acc, pending, xq, k, load, (warp & 3) * 32 + lane);
    qg4_reduce_rows<8, 16>(acc, red);
    if (warp != 0) return;
    float t = 0.0f;
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) t += red[4 * (lane >> 3) + wi][lane & 7];
    t *= xq_norm_scale(xq, k, pending);  // its own input may be a pending norm's too
    const int row = blockIdx.x * 32 + lane, chunks = n >> 5;
    const float hv = res[row] + t, u = hv * load_float(nw, row, nw_dt);
    h[row] = hv;
    y[row] = u;
    xsplit_chunk(parts, chunks, (int)blockIdx.x, u, lane, true);
    const float ss = warp_sum(hv * hv);
    if (lane == 0) {
        float* tail = (float*)(parts + (size_t)chunks * QI_WORDS) + 2 * chunks;
        tail[1 + blockIdx.x] = ss;
        if (blockIdx.x == 0) tail[0] = eps;
    }
}
extern "C" __global__ void __launch_bounds__(512, 1) qgemv_norm_b4_i4(float* h, float* y, const float* x, int n,
                                                                     const u32* packed, const void* scales,
                                                                     const void* biases, int p_dt, int lg, int k,
                                                                     const float* res, const void* nw, int nw_dt,
                                                                     float eps, u32* parts) {
    QG4_BEGIN(32);
    if (lg < 5 || (n & 31)) __trap();
    const u32* xq = (const u32*)x;
    if (p_dt == DT_BF16) qgemv_norm_rows<DT_BF16>(h, y, xq, n, packed, scales, biases, lg, k, res, nw, nw_dt, eps, parts);
    else if (p_dt == DT_F16) qgemv_norm_rows<DT_F16>(h, y, xq, n, packed, scales, biases, lg, k, res, nw, nw_dt, eps, parts);
    else qgemv_norm_rows<DT_F32>(h, y, xq, n, packed, scales, biases, lg, k, res, nw, nw_dt, eps, parts);
}
