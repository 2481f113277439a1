// Few-row 4-bit products in integers on the tensor cores (batched decode: 2 to 64 rows).
//
// out [M, N] = x [M, K] W^T for MLX affine 4-bit W (groups of 32, 64 or 128 values, K a multiple
// of 32), x given as the integer GEMVs' parts (xsplit_f32 over all M rows, common.cuh: per
// 32-value chunk of a row X = rint(x 2^e), |X| <= 2^22, in three int8 parts, a scale 2^-e and the
// chunk's sum of x). Per chunk and output one int32 sum S = sum q X, exact: mma.sync m16n8k32
// (the codes q as unsigned bytes, the parts as bytes), chained over the parts as
// C = (C << 8) + A B_part (|S| <= 32 * 15 * 2^22 < 2^31). Then in f32, per chunk as the one-row
// integer GEMV (linear.cu qgemv4i_acc) takes it: s (S 2^-e) + b sum(x), with the scale and bias
// of the chunk's group. That GEMV multiplies the same operands (x's parts, the exact codes), so a
// row's result in a batch differs from its result alone by f32 rounding only; the bf16 forms of
// qmma.cu round x (and, from 33 rows, the weights) instead. The aim is integer work per weight
// small enough that the products are bound by reading the weights: the 4-bit codes are the mma's
// operand as they are (two masks and a shift per 8), where the bf16 forms decode each value (the
// host runs these only when asked, until they are faster: ops/qimma.rs).
//
// Shape: a block of QI_ROWS / (16 MT) warps takes QI_ROWS weight rows (each warp MT tiles of 16), 8 NX
// input rows (NX tiles of 8; more rows go to further blocks, each reading the weights again) and
// one range of K (gridDim.y; as qmma.cu's kernels, several ranges write partial slices that
// qmma_reduce adds in range order, and the ranges depend on N, K, the kernel and the device
// only). Per 128 values of K the block copies its rows' 64 bytes each and its input rows' parts
// into shared memory (cp.async, the next chunk's copies in flight during this one's products;
// every warp reads the same parts: read from memory per warp, they were several times the
// weights' bytes), and each warp reads its rows back with ldmatrix, which hands quad lane t
// (lane % 4) word t of each 32-value chunk of rows lane / 4 and lane / 4 + 8: the 8 codes whose
// even and odd ones are that lane's A bytes (k slots 4t .. 4t + 3 and 16 + 4t ..), the order x's
// parts already have (xsplit_chunk: word t's even, then odd values).

#define QI_ROWS 128
#define QI_CHUNK 128

#ifndef NUVEC_CUDA_EMU
// d += A B for one m16n8k32 step: A 16 x 32 unsigned bytes (row-major), B 32 x 8 bytes
// (column-major), signed (SB) or unsigned, int32 sums (wrapping; the callers' sums fit). sm_80+,
// where the host launches the kernels using it (elsewhere it traps).
template <bool SB>
__device__ __forceinline__ void mma_u8(int (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#if __CUDA_ARCH__ >= 800
#define NUVEC_MMA_U8(bt)                                                                                \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8." bt ".s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "  \
                 "{%8,%9}, {%0,%1,%2,%3};"                                                              \
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])                                       \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
    if constexpr (SB) NUVEC_MMA_U8("s8");
    else NUVEC_MMA_U8("u8");
#undef NUVEC_MMA_U8
#else
    __trap();
#endif
}
#endif

// Shared memory, QI_STAGES slots (chunk c in one while the next chunks arrive in the others by
// cp.async), each holding for one chunk of 128 values:
// - the block's QI_ROWS weight rows (64 bytes each, pieces placed by qi_at);
// - its input rows' parts of the chunk's four 32-value chunks (4 x 96 bytes, rows padded to
//   QI_XROW so that the eight rows one B-operand read touches fall on distinct banks in pairs);
// - each weight row's scales and biases of the chunk's groups (at most 4; f32 pairs), and each
//   input row's scales 2^-e and sums of its four 32-value chunks (f32 pairs).
// The parameters (2- or 4-byte values, not 16-byte aligned) come through registers: loaded when
// their chunk is issued, stored into its slot one iteration later, so that their memory round
// trip is hidden behind a chunk's products (loaded where they were used, at each group's end,
// their latency was most of the kernel's time).
#ifndef QI_STAGES
#define QI_STAGES 3
#endif
#define QI_XROW 416
#define QI_WPAR(XR) (QI_ROWS * 64 + (XR) * QI_XROW)
#define QI_XPAR(XR) (QI_WPAR(XR) + QI_ROWS * 32)
#define QI_SLOT(XR) (QI_ROWS * 64 + (XR) * QI_XROW + QI_ROWS * 32 + (XR) * 32)
extern __shared__ __align__(16) unsigned char qi_smem[];

// The byte of piece p (16 bytes: one 32-value chunk) of weight row `row` in a slot: pieces placed
// at p ^ ((row >> 1) & 3), so that the eight rows an ldmatrix phase reads (and the two rows a
// phase of 16-byte copies writes) hit distinct banks.
__device__ __forceinline__ int qi_at(int row, int p) { return row * 64 + ((p ^ ((row >> 1) & 3)) << 4); }

// A thread's parameters of one chunk, in flight from its issue to its store: weight row
// threadIdx.x's (s, b) of the chunk's groups (threads below QI_ROWS), and pair
// threadIdx.x + i blockDim.x of the input rows' (scale, sum) pairs (row = pair / 4, 32-value
// chunk pair % 4).
template <int XR>
struct QiParams {
    static constexpr int XP = (XR * 4 + 127) / 128;  // blockDim.x is at least 128
    float s[4], b[4], xs[XP], xm[XP];
};

// Issues chunk c into slot `slot` (cp.async; zeros past N, M and K): the block's weight rows from
// nb and x's parts of input rows m0 .. m0 + XR, and loads the chunk's parameters into `pr`.
template <int XR>
__device__ __forceinline__ void qi_issue(int slot, int c, const u32* xq, int m, int m0, int kc, int n, int k, int nb,
                                         const u32* packed, const void* scales, const void* biases, int p_dt,
                                         int lg, QiParams<XR>& pr) {
    unsigned char* base = qi_smem + slot * QI_SLOT(XR);
    const size_t row_bytes = (size_t)k / 2;
    for (int q = threadIdx.x; q < QI_ROWS * 4; q += blockDim.x) {
        const int row = q >> 2, p = q & 3;
        const bool valid = nb + row < n && c * QI_CHUNK + p * 32 < k;
        const unsigned char* src =
            (const unsigned char*)packed + (valid ? (size_t)(nb + row) * row_bytes + (size_t)c * 64 + p * 16 : 0);
        cp_async16(smem_addr(base + qi_at(row, p)), src, valid);
    }
    unsigned char* xs = base + QI_ROWS * 64;
    for (int q = threadIdx.x; q < XR * 24; q += blockDim.x) {
        const int row = q / 24, p = q % 24, cc = c * 4 + p / 6;
        const bool valid = m0 + row < m && cc < kc;
        const unsigned char* src =
            (const unsigned char*)xq + (valid ? ((size_t)(m0 + row) * kc + c * 4) * QI_WORDS * 4 + p * 16 : 0);
        cp_async16(smem_addr(xs + row * QI_XROW + p * 16), src, valid);
    }
    const int r = nb + threadIdx.x;
    const size_t gpr = (size_t)(k >> lg);
#pragma unroll
    for (int gb = 0; gb < 4; ++gb) {
        const int k0 = c * QI_CHUNK + (gb << lg);
        const bool in = threadIdx.x < QI_ROWS && r < n && gb < (QI_CHUNK >> lg) && k0 < k;
        pr.s[gb] = in ? load_float(scales, (size_t)r * gpr + (k0 >> lg), p_dt) : 0.0f;
        pr.b[gb] = in ? load_float(biases, (size_t)r * gpr + (k0 >> lg), p_dt) : 0.0f;
    }
    const float* xscale = (const float*)(xq + (size_t)m * kc * QI_WORDS);
    const float* xsum = xscale + (size_t)m * kc;
#pragma unroll
    for (int i = 0; i < QiParams<XR>::XP; ++i) {
        const int q = threadIdx.x + i * blockDim.x, row = m0 + q / 4, cc = c * 4 + q % 4;
        const bool in = q < XR * 4 && row < m && cc < kc;
        pr.xs[i] = in ? __ldg(xscale + (size_t)row * kc + cc) : 0.0f;
        pr.xm[i] = in ? __ldg(xsum + (size_t)row * kc + cc) : 0.0f;
    }
}

// Stores the parameters qi_issue loaded into slot `slot`.
template <int XR>
__device__ __forceinline__ void qi_put(int slot, const QiParams<XR>& pr) {
    unsigned char* base = qi_smem + slot * QI_SLOT(XR);
    if (threadIdx.x < QI_ROWS) {
        float* w = (float*)(base + QI_WPAR(XR)) + threadIdx.x * 8;
        *(float4*)w = make_float4(pr.s[0], pr.b[0], pr.s[1], pr.b[1]);
        *(float4*)(w + 4) = make_float4(pr.s[2], pr.b[2], pr.s[3], pr.b[3]);
    }
    float2* x = (float2*)(base + QI_XPAR(XR));
#pragma unroll
    for (int i = 0; i < QiParams<XR>::XP; ++i) {
        const int q = threadIdx.x + i * blockDim.x;
        if (q < XR * 4) x[q] = make_float2(pr.xs[i], pr.xm[i]);
    }
}

// MT tiles of 16 weight rows per warp, NX tiles of 8 input rows.
template <int MT, int NX>
__device__ __forceinline__ void qimma_body(float* out, const u32* __restrict__ xq, int m, int n,
                                           const u32* __restrict__ packed, const void* __restrict__ scales,
                                           const void* __restrict__ biases, int p_dt, int lg, int k, int cps) {
    constexpr int XR = 8 * NX;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    // Blocks (bx, mz) next to each other over blockIdx.x: column block bx of the weight against
    // input rows mz 8 NX .. (the blocks that read the same weights run together, so all but the
    // first find them in L2).
    const int zs = (m + XR - 1) / XR, bx = blockIdx.x / zs, m0 = (blockIdx.x % zs) * XR;
    const int nb = bx * QI_ROWS, wr = warp * MT * 16;  // the block's and the warp's first weight row
    const int kc = k >> 5;                             // x's chunks per row
    const int chunks = (k + QI_CHUNK - 1) / QI_CHUNK;
    const int c0 = blockIdx.y * cps, c1 = min(c0 + cps, chunks);

    float acc[MT][NX][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NX; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    // The pipeline's first QI_STAGES - 1 chunks; `pr` holds the parameters of the chunk issued
    // last until they are stored.
    QiParams<XR> pr;
#pragma unroll
    for (int s = 0; s < QI_STAGES - 1; ++s) {
        if (s > 0) qi_put<XR>(s - 1, pr);
        if (c0 + s < c1) qi_issue<XR>(s, c0 + s, xq, m, m0, kc, n, k, nb, packed, scales, biases, p_dt, lg, pr);
        cp_async_commit();
    }
    u32 a[MT][4];
    for (int c = c0; c < c1; ++c) {
        const int it = c - c0, slot = it % QI_STAGES;
        cp_async_wait<QI_STAGES - 2>();  // chunk c's copies (this thread's) have landed
        __syncthreads();                 // everyone's have, and everyone is done with chunk c - 1
        qi_put<XR>((it + QI_STAGES - 2) % QI_STAGES, pr);
        if (c + QI_STAGES - 1 < c1)
            qi_issue<XR>((it + QI_STAGES - 1) % QI_STAGES, c + QI_STAGES - 1, xq, m, m0, kc, n, k, nb, packed, scales,
                         biases, p_dt, lg, pr);
        cp_async_commit();
        if (QI_STAGES == 2) __syncthreads();  // the parameters just stored are chunk c's own
        const unsigned char* wb = qi_smem + slot * QI_SLOT(XR);
        const unsigned char* xs = wb + QI_ROWS * 64;
        const float* wpar = (const float*)(wb + QI_WPAR(XR));
        const float2* xpar = (const float2*)(wb + QI_XPAR(XR));
        // Chunks 2h and 2h + 1 (one at a time, which keeps the x operands of two chunks in
        // registers, not of four): a[mt] = ldmatrix of {rows g, g + 8 of tile mt} x {chunk 2h, 2h + 1}.
#pragma unroll 1
        for (int j = 0; j < 4; ++j) {
            const int cc = c * 4 + j;  // x's chunk (of each row)
            if (cc >= kc) break;
            if ((j & 1) == 0) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const int mi = lane >> 3, row = wr + 16 * mt + (lane & 7) + 8 * (mi & 1);
                    ldmatrix_x4<false>(a[mt], smem_addr(wb + qi_at(row, j + (mi >> 1))));
                }
            }
            u32 A[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const u32 w0 = (j & 1) ? a[mt][2] : a[mt][0], w1 = (j & 1) ? a[mt][3] : a[mt][1];
                A[mt][0] = w0 & 0x0F0F0F0Fu;
                A[mt][1] = w1 & 0x0F0F0F0Fu;
                A[mt][2] = (w0 >> 4) & 0x0F0F0F0Fu;
                A[mt][3] = (w1 >> 4) & 0x0F0F0F0Fu;
            }
            // B: input row nx 8 + g of the block, word t of each part. Each part's products for
            // every tile before the next part's (the mma wrappers are volatile asm, kept in this
            // order), so that independent mmas follow one another instead of each waiting on
            // the one before.
            u32 B[NX][3][2];
#pragma unroll
            for (int nx = 0; nx < NX; ++nx)
#pragma unroll
                for (int p = 0; p < 3; ++p) {
                    const uint2 v = *(const uint2*)(xs + (nx * 8 + g) * QI_XROW + j * 96 + p * 32 + 8 * t);
                    B[nx][p][0] = v.x;
                    B[nx][p][1] = v.y;
                }
            int S[MT][NX][4];
#pragma unroll
            for (int p = 0; p < 3; ++p)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nx = 0; nx < NX; ++nx) {
                        if (p == 0) {
#pragma unroll
                            for (int e = 0; e < 4; ++e) S[mt][nx][e] = 0;
                            mma_u8<true>(S[mt][nx], A[mt], B[nx][0]);
                        } else {
#pragma unroll
                            for (int e = 0; e < 4; ++e) S[mt][nx][e] <<= 8;
                            mma_u8<false>(S[mt][nx], A[mt], B[nx][p]);
                        }
                    }
            // Per output, as the one-row integer GEMV: acc += s (S 2^-e) + b sum(x), with the
            // scale and bias of the weight row's group (rows g and g + 8 of each tile) and the
            // input row's chunk scale and sum (rows nx 8 + 2t and + 1: the lane's columns).
            const int gb = j >> (lg - 5);  // the group's index in the chunk of 128
            float2 wp[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) wp[mt][h] = *(const float2*)(wpar + (wr + 16 * mt + g + 8 * h) * 8 + 2 * gb);
#pragma unroll
            for (int nx = 0; nx < NX; ++nx) {
                const float2 xp[2] = {xpar[(nx * 8 + 2 * t) * 4 + j], xpar[(nx * 8 + 2 * t + 1) * 4 + j]};
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float2 w = wp[mt][e >> 1], x = xp[e & 1];
                        // s 2^-e is exact (a power of two), so s S 2^-e rounds once.
                        acc[mt][nx][e] = fmaf(w.x * x.x, (float)S[mt][nx][e], fmaf(w.y, x.y, acc[mt][nx][e]));
                    }
            }
        }
    }
    float* dst = out + (size_t)blockIdx.y * m * n;
    const int r0 = nb + wr;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nx = 0; nx < NX; ++nx)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = r0 + 16 * mt + g + 8 * (e >> 1), xr = m0 + nx * 8 + 2 * t + (e & 1);
                if (row < n && xr < m) dst[(size_t)xr * n + row] = acc[mt][nx][e];
            }
}

// Asks L2 for the packed bytes this block will read (its rows' bytes in its range of K), a row per
// thread, before pdl_begin: weights are never written by a kernel (as qmma.cu's qm_prefetch).
__device__ __forceinline__ void qi_prefetch(const u32* packed, int m, int n, int k, int cps, int rows) {
    const int zs = (m + rows - 1) / rows;
    const int r = (blockIdx.x / zs) * QI_ROWS + threadIdx.x;
    const int chunks = (k + QI_CHUNK - 1) / QI_CHUNK;
    const int c0 = blockIdx.y * cps, c1 = min(c0 + cps, chunks);
    if (blockIdx.x % zs == 0 && threadIdx.x < QI_ROWS && r < n && c0 < c1) {
        const size_t row_bytes = (size_t)k / 2, b0 = (size_t)c0 * 64;
        const size_t b1 = (size_t)c1 * 64 < row_bytes ? (size_t)c1 * 64 : row_bytes;
        l2_prefetch((const unsigned char*)packed + (size_t)r * row_bytes + b0, b1 - b0);
    }
}

#define QI_PARAMS                                                                                                \
    float *out, const u32 *xq, int m, int n, const u32 *packed, const void *scales, const void *biases, int p_dt, \
        int lg, int k, int cps
#define QI_BEGIN(ROWS)                           \
    qi_prefetch(packed, m, n, k, cps, ROWS); \
    pdl_begin()
#define QI_ARGS out, xq, m, n, packed, scales, biases, p_dt, lg, k, cps

// qimma_b4_xR: R input rows per block (more rows: more blocks, each reading the weights again).
// QI_X32_MIN_BLOCKS: resident blocks per multiprocessor asked of ptxas for the 32-row form (2: a
// 128-register cap, with a few spills; 1: 144 registers, no spills); an experiment knob
// (NUVEC_NVRTC_DEFINES).
#ifndef QI_X32_MIN_BLOCKS
#define QI_X32_MIN_BLOCKS 2
#endif
extern "C" __global__ void __launch_bounds__(128) qimma_b4_x8(QI_PARAMS) { QI_BEGIN(8); qimma_body<2, 1>(QI_ARGS); }
extern "C" __global__ void __launch_bounds__(128) qimma_b4_x16(QI_PARAMS) { QI_BEGIN(16); qimma_body<2, 2>(QI_ARGS); }
extern "C" __global__ void __launch_bounds__(256, QI_X32_MIN_BLOCKS) qimma_b4_x32(QI_PARAMS) { QI_BEGIN(32); qimma_body<1, 4>(QI_ARGS); }

// ---- Up to 16 input rows, each warp's own pipeline (qimma_b4_r8, qimma_b4_r16) ----
//
// The same sums as the forms above (per 32-value chunk S = sum q X exact in int32 over the three
// parts, then s (S 2^-e) + b sum(x) in f32), without a block-wide pipeline: a warp takes one tile
// of 16 weight rows over its share of K (the block's QIR_WARPS warps split K into whole batches
// of 4 chunks, then add their partials in warp order), and what bounds it is the load
// instructions per chunk, so every load is a wide one:
// - weights: quad lane t copies chunk t of a batch for rows g and g + 8 (16 bytes each) into the
//   warp's ring in shared memory (below), from which lane t reads word t of each chunk (its A
//   bytes, in the order x's parts have them; see the header);
// - scales and biases: a batch's groups of rows g and g + 8 in one copy per stream (K a multiple
//   of 128: whole groups, aligned), through the ring with the weights, the kernel specialized
//   per scale type;
// - x: xsplit_tiles_f32's layout, where one tile of 8 input rows' part p of a chunk is the 256
//   bytes a warp's B operands take (lane (g, t): words 2t and 2t + 1 of row g), and the tile's
//   scales and sums of a chunk are 64 bytes (lane t: rows 2t and 2t + 1's, its C columns).
// The blocks take the tiles of up to three weights of one launch in order (q/k/v, gate/up).
#define QIR_WARPS 8
#define QIR_BATCH 4
// x's parts of M rows (padded to whole tiles of 8) in the few-row layout: per tile and 32-value
// chunk, part p's words as [p][row][word] (64 u32 each), then per tile and chunk [row][scale,
// sum] floats. The same words and values as xsplit_f32's, a warp per (row, chunk).
extern "C" __global__ void xsplit_tiles_f32(u32* __restrict__ parts, const float* __restrict__ x, int m, int k) {
    pdl_begin();
    const int kc = k >> 5, lane = threadIdx.x & 31, tiles = (m + 7) >> 3;
    const int warps = (int)((gridDim.x * blockDim.x) >> 5);
    float* scales = (float*)(parts + (size_t)tiles * kc * 192);
    for (int q = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5); q < tiles * 8 * kc; q += warps) {
        const int row = q / kc, c = q % kc, tile = row >> 3, g = row & 7;
        const float v = row < m ? x[(size_t)row * k + (size_t)c * 32 + lane] : 0.0f;
        const XsplitWords w = xsplit_words(v, lane);
        const size_t tc = (size_t)tile * kc + c;
        if (((lane >> 1) & 3) == 0) {
            u32* out = parts + tc * 192 + g * 8 + (lane >> 3) * 2 + (lane & 1);
            out[0] = w.hi;
            out[64] = w.mid;
            out[128] = w.lo;
        }
        if (lane == 0) {
            scales[tc * 16 + g * 2] = ldexpf(1.0f, -w.e);
            scales[tc * 16 + g * 2 + 1] = w.sum;
        }
    }
}

// The scales (or biases) of a batch's 4 chunks as raw words, as one copy staged them: 4, 2 or 1
// groups of 32, 64 or 128 values (whole and aligned: K is a multiple of 128), in the scale type
// DT (f32, f16, bf16); qir_decode turns them into each chunk's value.
template <int DT>
struct QirRaw {
    static constexpr int WORDS = DT == DT_F32 ? 4 : 2;
    u32 w[WORDS];
};
template <int DT>
__device__ __forceinline__ void qir_decode(const QirRaw<DT>& r, int lg, float (&v)[4]) {
    const int ng = 4 >> (lg - 5);
    float g[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        if (DT == DT_F32) {
            g[e] = __uint_as_float(r.w[e % QirRaw<DT>::WORDS]);
        } else {
            const u16 h = (u16)(r.w[(e >> 1) % QirRaw<DT>::WORDS] >> (16 * (e & 1)));
            g[e] = DT == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = ng == 4 ? g[u] : ng == 2 ? g[u >> 1] : g[0];
}

// A warp's batches of weights, scales and biases go through a ring of QIR_RING slots in shared
// memory (cp.async), the copies QIR_RING - 1 batches ahead of the batch it multiplies, so that
// the bytes in flight cost no registers; the first copies are issued before pdl_begin (no kernel
// writes weights). A slot: the batch's 16 rows at a stride of 80 bytes (the reads of row g, word
// 4u + t hit 32 distinct banks), then per quad g and lane t parameter stream t (t = 0, 1: row
// g's scales and biases; 2, 3: row g + 8's), QirRing<DT>::PB bytes each. QIR_RING is an
// experiment knob (NUVEC_NVRTC_DEFINES; the host sizes the shared memory from the same value).
#ifndef QIR_RING
#define QIR_RING 3
#endif
template <int DT>
struct QirRing {
    // Bytes of one parameter stream of a batch (4 groups of 32 in the widest case).
    static constexpr int PB = DT == DT_F32 ? 16 : 8;
    static constexpr int WEIGHTS = 16 * 80;
    static constexpr int SLOT = WEIGHTS + 32 * PB;
};

// A batch's copies into a ring slot at `at` (qir_turn's layout): this lane's words of rows g and
// g + 8 (n0, n1) at `wdst`, its parameter stream (np, `cb` bytes: 16, 8 or 4, the last a word's
// aligned part) at `pdst`; the sources then advance by a batch (`sb` parameter bytes).
__device__ __forceinline__ void qir_copy_batch(u32 at, u32 wdst, u32 pdst, int cb, int sb,
                                               const uint4* __restrict__& n0, const uint4* __restrict__& n1,
                                               const unsigned char*& np) {
    cp_async16(at + wdst, n0, true);
    cp_async16(at + wdst + 8 * 80, n1, true);
    if (cb == 16) cp_async16(at + pdst, np, true);
    else if (cb == 8) cp_async_small<8>(at + pdst, np);
    else cp_async_small<4>(at + pdst, (const void*)((size_t)np & ~(size_t)3));
    n0 += QIR_BATCH, n1 += QIR_BATCH, np += sb;
}

// One batch's turn of a warp's ring: the slot the last batch was read from takes the batch
// QIR_RING - 1 ahead (`issue`); this batch's slot is whole once this lane's copies of it landed
// and the warp met. Reads this lane's words of the batch's 16 weight rows (row g into wa, g + 8
// into wb, word t of each 32-value chunk) and returns the slot for its scales and biases.
template <int DT, typename Issue>
__device__ __forceinline__ const unsigned char* qir_turn(Issue& issue, int bi, int b1, int slot,
                                                         const unsigned char* ring, u32 wread,
                                                         u32 (&wa)[QIR_BATCH], u32 (&wb)[QIR_BATCH]) {
    if (bi + QIR_RING - 1 < b1) issue(slot == 0 ? QIR_RING - 1 : slot - 1);
    cp_async_commit();
    cp_async_wait<QIR_RING - 1>();
    __syncwarp();
    const unsigned char* sl = ring + slot * QirRing<DT>::SLOT;
    const u32* tw = (const u32*)sl + wread;
#pragma unroll
    for (int u = 0; u < QIR_BATCH; ++u) {
        wa[u] = tw[4 * u];
        wb[u] = tw[8 * 20 + 4 * u];
    }
    return sl;
}

// Parameter streams 0-3 of a batch's slot at `pw` (row g's scales, biases, row g + 8's), as
// each chunk's values: s[h][u] and b[h][u] for row g + 8 h and chunk u.
template <int DT>
__device__ __forceinline__ void qir_params(const u32* pw, int sb, const int (&odd)[2], int bi, int lg,
                                           float (&s)[2][4], float (&b)[2][4]) {
    constexpr int PB = QirRing<DT>::PB;
#pragma unroll
    for (int st = 0; st < 4; ++st) {
        QirRaw<DT> r;
#pragma unroll
        for (int e = 0; e < QirRaw<DT>::WORDS; ++e) r.w[e] = pw[st * (PB / 4) + e];
        if (sb == 2 && ((odd[st >> 1] + bi) & 1)) r.w[0] >>= 16;
        qir_decode<DT>(r, lg, (st & 1) ? b[st >> 1] : s[st >> 1]);
    }
}

template <int NT, int DT>
__device__ __forceinline__ void qimma_reg_body(float* out, const u32* __restrict__ xq, int m, int n,
                                               const u32* __restrict__ packed, const void* __restrict__ scales,
                                               const void* __restrict__ biases, int lg, int k, int tile) {
    constexpr int SLOT = QirRing<DT>::SLOT, PB = QirRing<DT>::PB, DSZ = DT == DT_F32 ? 4 : 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int kc = k >> 5, batches = kc / QIR_BATCH, per = (batches + QIR_WARPS - 1) / QIR_WARPS;
    const int b0 = warp * per, b1 = min(b0 + per, batches);
    // This lane's copies per batch: chunk t of rows g and g + 8 (16 bytes each; rows past n read
    // the last row, never stored), and parameter stream t: cb bytes from the group of the
    // batch's first value (a 2-byte stream: the aligned 4 bytes holding it, its half picked when
    // decoded; `odd` is its row's first group's parity).
    const int r0 = min(tile * 16 + g, n - 1), r1 = min(tile * 16 + g + 8, n - 1);
    const uint4* __restrict__ w0 = (const uint4*)(packed + (size_t)r0 * (k >> 3)) + t;
    const uint4* __restrict__ w1 = (const uint4*)(packed + (size_t)r1 * (k >> 3)) + t;
    const size_t gpr = (size_t)(k >> lg);
    const int sb = (QIR_BATCH * 32 >> lg) * DSZ, cb = sb < 4 ? 4 : sb;
    const unsigned char* psrc =
        (const unsigned char*)((t & 1) ? biases : scales) + (size_t)(t >> 1 ? r1 : r0) * gpr * DSZ;
    const int odd[2] = {(int)((r0 * gpr) & 1), (int)((r1 * gpr) & 1)};
    unsigned char* ring = qi_smem + (size_t)warp * QIR_RING * SLOT;
    const u32 ring_a = smem_addr(ring);
    // The next batch's copies into `slot`, from sources that advance by a batch per call (the
    // batches are issued in order: no address is recomputed from the batch index).
    const uint4* __restrict__ n0 = w0 + (size_t)b0 * QIR_BATCH;
    const uint4* __restrict__ n1 = w1 + (size_t)b0 * QIR_BATCH;
    const unsigned char* np = psrc + (size_t)b0 * sb;
    const u32 wdst = g * 80 + 16 * t, pdst = QirRing<DT>::WEIGHTS + lane * PB;
    auto issue = [&](int slot) { qir_copy_batch(ring_a + slot * SLOT, wdst, pdst, cb, sb, n0, n1, np); };
#pragma unroll
    for (int s = 0; s < QIR_RING - 1; ++s) {
        if (b0 + s < b1) issue(s);
        cp_async_commit();
    }
    pdl_begin();
    const int tiles = (m + 7) >> 3, j0 = blockIdx.y * NT;
    // x's parts and scales of this warp's first batch, per input tile; a batch later is
    // QIR_BATCH chunks on (192 words of parts, 16 floats of scales and sums per chunk).
    const u32* __restrict__ xp[NT];
    const float* __restrict__ xs[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const size_t tc = (size_t)min(j0 + j, tiles - 1) * kc + (size_t)b0 * QIR_BATCH;
        xp[j] = xq + tc * 192 + g * 8 + 2 * t;
        xs[j] = (const float*)(xq + (size_t)tiles * kc * 192) + tc * 16 + 4 * t;
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    const u32 wread = g * 20 + t, pread = QirRing<DT>::WEIGHTS + g * 4 * PB;
    for (int bi = b0, slot = 0; bi < b1; ++bi) {
        u32 wa[QIR_BATCH], wb[QIR_BATCH];
        const unsigned char* sl = qir_turn<DT>(issue, bi, b1, slot, ring, wread, wa, wb);
        float s[2][4], b[2][4];
        qir_params<DT>((const u32*)(sl + pread), sb, odd, bi, lg, s, b);
        // Every lane has read the slot before the next batch's copies refill it.
        __syncwarp();
        slot = slot + 1 == QIR_RING ? 0 : slot + 1;
#pragma unroll
        for (int u = 0; u < QIR_BATCH; ++u) {
            const u32 A[4] = {wa[u] & 0x0F0F0F0Fu, wb[u] & 0x0F0F0F0Fu, (wa[u] >> 4) & 0x0F0F0F0Fu,
                              (wb[u] >> 4) & 0x0F0F0F0Fu};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                u32 B[3][2];
#pragma unroll
                for (int p = 0; p < 3; ++p) {
                    const uint2 v = __ldg((const uint2*)(xp[j] + u * 192 + p * 64));
                    B[p][0] = v.x;
                    B[p][1] = v.y;
                }
                const float4 x4 = __ldg((const float4*)(xs[j] + u * 16));  // rows 2t, 2t + 1: scale, sum
                int S[4] = {0, 0, 0, 0};
                mma_u8<true>(S, A, B[0]);
#pragma unroll
                for (int p = 1; p < 3; ++p) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) S[e] <<= 8;
                    mma_u8<false>(S, A, B[p]);
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float xe = (e & 1) ? x4.z : x4.x, xm = (e & 1) ? x4.w : x4.y;
                    acc[j][e] = fmaf(s[e >> 1][u] * xe, (float)S[e], fmaf(b[e >> 1][u], xm, acc[j][e]));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) xp[j] += QIR_BATCH * 192, xs[j] += QIR_BATCH * 16;
    }
    // The warps' partials, added in warp order, in the ring's memory once every copy landed.
    cp_async_wait<0>();
    __syncthreads();
    float(*red)[NT * 4][32] = (float(*)[NT * 4][32])qi_smem;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp][j * 4 + e][lane] = acc[j][e];
    __syncthreads();
    for (int q = threadIdx.x; q < NT * 128; q += blockDim.x) {
        const int je = q >> 5, l = q & 31, e = je & 3;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < QIR_WARPS; ++w) v += red[w][je][l];
        const int row = tile * 16 + (l >> 2) + 8 * (e >> 1), xr = (j0 + (je >> 2)) * 8 + 2 * (l & 3) + (e & 1);
        if (row < n && xr < m) out[(size_t)xr * n + row] = v;
    }
}

// Up to three weights of one width, group size and scale type: tiles [0, nt0) of weight 0, then
// weight 1's, then weight 2's (blockIdx.x); input tiles NT blockIdx.y .. (blockIdx.y).
#define QIR_PARAMS                                                                                                   \
    const u32 *xq, int m, int p_dt, int lg, int k, float *out0, int n0, const u32 *pk0, const void *sc0,            \
        const void *bi0, float *out1, int n1, const u32 *pk1, const void *sc1, const void *bi1, float *out2, int n2, \
        const u32 *pk2, const void *sc2, const void *bi2
#define QIR_ARGS xq, m, p_dt, lg, k, out0, n0, pk0, sc0, bi0, out1, n1, pk1, sc1, bi1, out2, n2, pk2, sc2, bi2
// The block's weight picked first and the body inlined once (three inlined bodies per scale
// type measured 2-3 % slower at 8 rows).
template <int NT, int DT>
__device__ __forceinline__ void qimma_reg_dt(QIR_PARAMS) {
    const int nt0 = (n0 + 15) / 16, nt1 = (n1 + 15) / 16;
    int tile = blockIdx.x, w = 0;
    if (tile >= nt0) tile -= nt0, w = 1;
    if (w == 1 && tile >= nt1) tile -= nt1, w = 2;
    float* out = w == 0 ? out0 : w == 1 ? out1 : out2;
    const int n = w == 0 ? n0 : w == 1 ? n1 : n2;
    const u32* pk = w == 0 ? pk0 : w == 1 ? pk1 : pk2;
    const void* sc = w == 0 ? sc0 : w == 1 ? sc1 : sc2;
    const void* bi = w == 0 ? bi0 : w == 1 ? bi1 : bi2;
    qimma_reg_body<NT, DT>(out, xq, m, n, pk, sc, bi, lg, k, tile);
}
// The kernels start with their first copies (qimma_reg_body), then pdl_begin.
template <int NT>
__device__ __forceinline__ void qimma_reg(QIR_PARAMS) {
    if (p_dt == DT_BF16) qimma_reg_dt<NT, DT_BF16>(QIR_ARGS);
    else if (p_dt == DT_F16) qimma_reg_dt<NT, DT_F16>(QIR_ARGS);
    else qimma_reg_dt<NT, DT_F32>(QIR_ARGS);
}
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qimma_b4_r8(QIR_PARAMS) { qimma_reg<1>(QIR_ARGS); }
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qimma_b4_r16(QIR_PARAMS) { qimma_reg<2>(QIR_ARGS); }

// ---- The register kernels with the weights decoded to bf16 (qdec_b4_r8, _r16) ----
//
// The ring, warps and tiles of qimma_reg_body, but each weight decoded to bf16 (s q + b, one
// rounding, as qmma.cu's decoding kernels from 33 rows; from f16 or f32 scales fmaf in f32, then
// rounded, as their `s` forms) and x rounded to bf16, multiplied by mma.sync m16n8k16 (bf16, f32
// sums) with the weights as A (16 rows) and 8 input rows as B: no int8 parts, no per-chunk
// epilogue. Quad lane t's word t of a 32-value chunk (values 8t .. 8t + 7 of rows g and g + 8)
// gives, through 0x4300 | q, the bf16 pairs (v0, v4), (v1, v5), (v2, v6), (v3, v7): the A
// registers of two k16 steps, in which the k order is permuted the same way for x, which
// xbf16_tiles_f32 stores per lane as those pairs. The default on the bf16 path (ops/qimma.rs):
// fewer instructions per weight than the integer chain's IMMAs, shifts and per-chunk epilogue,
// and fewer registers (3 blocks per SM).

// x [m, k] (f32) as bf16 in the qdec layout (common.cuh, qdec_tile_at), rows past m zero; `load`
// gives the 8 values of row `row` from `at` (x's values `at` .. `at + 7`).
template <class Load8>
__device__ __forceinline__ void xbf16_tiles(uint4* __restrict__ out, int m, int k, Load8 load) {
    const int kc = k >> 5, tiles = (m + 7) >> 3;
    const int total = tiles * kc * 32;
    for (int q = (int)(blockIdx.x * blockDim.x + threadIdx.x); q < total; q += (int)(gridDim.x * blockDim.x)) {
        const int t = q & 3, g = (q >> 2) & 7, tc = q >> 5, tile = tc / kc, c = tc % kc, row = tile * 8 + g;
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
        if (row < m) load((size_t)row * k + (size_t)c * 32 + 8 * t, v);
        out[q] = make_uint4(bf16x2_rn(v[0], v[4]), bf16x2_rn(v[1], v[5]), bf16x2_rn(v[2], v[6]), bf16x2_rn(v[3], v[7]));
    }
}
extern "C" __global__ void xbf16_tiles_f32(uint4* __restrict__ out, const float* __restrict__ x, int m, int k) {
    pdl_begin();
    xbf16_tiles(out, m, k, [&](size_t at, float (&v)[8]) {
        const float4 a = *(const float4*)(x + at), b = *(const float4*)(x + at + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    });
}
// silu(g) * u (silu_mul_value, as silu_mul_f32) straight into the tiles: the down projection's
// input without its f32 form.
extern "C" __global__ void silu_mul_xbf16_tiles_f32(uint4* __restrict__ out, const float* __restrict__ g,
                                                    const float* __restrict__ u, int m, int k) {
    pdl_begin();
    xbf16_tiles(out, m, k, [&](size_t at, float (&v)[8]) {
        const float4 ga = *(const float4*)(g + at), gb = *(const float4*)(g + at + 4);
        const float4 ua = *(const float4*)(u + at), ub = *(const float4*)(u + at + 4);
        const float gs[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
        const float us[8] = {ua.x, ua.y, ua.z, ua.w, ub.x, ub.y, ub.z, ub.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = silu_mul_value(gs[i], us[i]);
    });
}

// Chunk u's decoded weights A (two k16 steps of 16 rows) times the NT input tiles of x at xp,
// into acc: the qdec bodies' products, whatever the scales' type.
template <int NT>
__device__ __forceinline__ void qdec_mma(const u32 (&A)[2][4], const uint4* const __restrict__ (&xp)[NT], int u,
                                         float (&acc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const uint4 xv = __ldg(xp[j] + u * 32);
        const u32 B0[2] = {xv.x, xv.y}, B1[2] = {xv.z, xv.w};
        mma_bf16(acc[j], A[0], B0);
        mma_bf16(acc[j], A[1], B1);
    }
}

// One batch of the qdec body for f16 or f32 scales (DT): streams 0-3 of the slot at `pw` (row
// g's scales, biases, row g + 8's) decoded per chunk to f32, each weight fmaf(s, q, b) in f32
// and rounded to bf16, then the same mma.sync as the bf16 form; the warp meets once the slot is
// read, before the next batch's copies refill it.
template <int NT, int DT>
__device__ __forceinline__ void qdec_batch_f32(const unsigned char* pw8, int sb, const int (&odd)[2], int bi, int lg,
                                               const u32 (&wa)[QIR_BATCH], const u32 (&wb)[QIR_BATCH],
                                               const uint4* const __restrict__ (&xp)[NT], float (&acc)[NT][4]) {
    float s[2][4], b[2][4];
    qir_params<DT>((const u32*)pw8, sb, odd, bi, lg, s, b);
    // Every lane has read the slot before the next batch's copies refill it.
    __syncwarp();
    const u32 magic = 0x43004300u;
#pragma unroll
    for (int u = 0; u < QIR_BATCH; ++u) {
        u32 A[2][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // The exact codes (v i, v i + 4) as a bf16 pair, then each as f32 (its bf16 bits
                // in the high half).
                const u32 q = bf16x2_fma(and_or<0x000F000Fu>((h ? wb[u] : wa[u]) >> (4 * i), magic), 0x3F803F80u,
                                         0xC300C300u);
                const float lo = __uint_as_float(q << 16), hi = __uint_as_float(q & 0xFFFF0000u);
                A[i >> 1][(i & 1) * 2 + h] = bf16x2_rn(fmaf(s[h][u], lo, b[h][u]), fmaf(s[h][u], hi, b[h][u]));
            }
        }
        qdec_mma<NT>(A, xp, u, acc);
    }
}

// Streams 0-3 of a bf16-scaled batch's slot at `pw` (row g's scales, biases, row g + 8's scales,
// biases), two words each: up to four bf16 groups; a 2-byte stream's word holds its group in the
// half of its parity.
__device__ __forceinline__ void qdec_bf16_params(const u32* pw, int sb, const int (&odd)[2], int bi,
                                                 u32 (&pr)[4][2]) {
    constexpr int PB = QirRing<DT_BF16>::PB;
#pragma unroll
    for (int st = 0; st < 4; ++st) {
        pr[st][0] = pw[st * (PB / 4)];
        pr[st][1] = pw[st * (PB / 4) + 1];
        if (sb == 2 && ((odd[st >> 1] + bi) & 1)) pr[st][0] >>= 16;
    }
}
// Chunk u of a batch (its group u >> gsh of the batch's streams pr) decoded to bf16: the pairs
// (v i, v i + 4) of rows g (word wa) and g + 8 (wb) as A, the registers of the chunk's two k16
// steps (a0a1 / a2a3 from pair i, even i, a4a5 / a6a7 from the next).
__device__ __forceinline__ void qdec_bf16_chunk(const u32 (&pr)[4][2], int gsh, int u, u32 wa, u32 wb,
                                                u32 (&A)[2][4]) {
    const int gi = u >> gsh;
    u32 s2[2], b2[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 sw = (gi >> 1) ? pr[2 * h][1] : pr[2 * h][0];
        const u32 bw = (gi >> 1) ? pr[2 * h + 1][1] : pr[2 * h + 1][0];
        const u32 sel = (gi & 1) ? 0x3232u : 0x1010u;
        s2[h] = __byte_perm(sw, 0u, sel);
        b2[h] = __byte_perm(bw, 0u, sel);
    }
    const u32 magic = 0x43004300u;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 qa = bf16x2_fma(and_or<0x000F000Fu>(wa >> (4 * i), magic), 0x3F803F80u, 0xC300C300u);
        const u32 qb = bf16x2_fma(and_or<0x000F000Fu>(wb >> (4 * i), magic), 0x3F803F80u, 0xC300C300u);
        A[i >> 1][(i & 1) * 2] = bf16x2_fma(qa, s2[0], b2[0]);
        A[i >> 1][(i & 1) * 2 + 1] = bf16x2_fma(qb, s2[1], b2[1]);
    }
}

// TPB weight tiles per block (warp w takes tile w % TPB and share w / TPB of K): the warps of
// a block that read the same x at about the same time share its lines in L1, which matters
// from 32 input rows (x's bytes per weight byte grow with the rows).
// DT: the scales' type. Bf16 scales decode in bf16 (one fma rounding, exact inputs); f16 and f32
// ones (GGUF's simple blocks and K-quants) decode each weight as fmaf(s, q, b) in f32, rounded to
// bf16: the arithmetic of qmma.cu's `s` forms and of the prefill GEMM's qdequant_bf16.
template <int NT, int TPB, int DT>
__device__ __forceinline__ void qdec_reg_body(float* out, const uint4* __restrict__ xb, int m, int n,
                                              const u32* __restrict__ packed, const void* __restrict__ scales,
                                              const void* __restrict__ biases, int lg, int k, int tile0) {
    constexpr int SLOT = QirRing<DT>::SLOT, PB = QirRing<DT>::PB, SHARES = QIR_WARPS / TPB;
    constexpr int DSZ = DT == DT_F32 ? 4 : 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tile = tile0 + warp % TPB;
    const int kc = k >> 5, batches = kc / QIR_BATCH, per = (batches + SHARES - 1) / SHARES;
    const int b0 = warp / TPB * per, b1 = min(b0 + per, batches);
    const int r0 = min(tile * 16 + g, n - 1), r1 = min(tile * 16 + g + 8, n - 1);
    const size_t gpr = (size_t)(k >> lg);
    const int sb = (QIR_BATCH * 32 >> lg) * DSZ, cb = sb < 4 ? 4 : sb;
    const int odd[2] = {(int)((r0 * gpr) & 1), (int)((r1 * gpr) & 1)};
    const uint4* __restrict__ n0 = (const uint4*)(packed + (size_t)r0 * (k >> 3)) + t + (size_t)b0 * QIR_BATCH;
    const uint4* __restrict__ n1 = (const uint4*)(packed + (size_t)r1 * (k >> 3)) + t + (size_t)b0 * QIR_BATCH;
    const unsigned char* np = (const unsigned char*)((t & 1) ? biases : scales) +
                              ((size_t)(t >> 1 ? r1 : r0) * gpr) * DSZ + (size_t)b0 * sb;
    unsigned char* ring = qi_smem + (size_t)warp * QIR_RING * SLOT;
    const u32 ring_a = smem_addr(ring);
    const u32 wdst = g * 80 + 16 * t, pdst = QirRing<DT>::WEIGHTS + lane * PB;
    auto issue = [&](int slot) { qir_copy_batch(ring_a + slot * SLOT, wdst, pdst, cb, sb, n0, n1, np); };
#pragma unroll
    for (int s = 0; s < QIR_RING - 1; ++s) {
        if (b0 + s < b1) issue(s);
        cp_async_commit();
    }
    pdl_begin();
    const int tiles = (m + 7) >> 3, j0 = blockIdx.y * NT;
    const uint4* __restrict__ xp[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) xp[j] = xb + ((size_t)min(j0 + j, tiles - 1) * kc + (size_t)b0 * QIR_BATCH) * 32 + lane;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    const u32 wread = g * 20 + t, pread = QirRing<DT>::WEIGHTS + g * 4 * PB;
    // Chunk u's group within a batch: u >> (lg - 5) of the batch's (4 >> (lg - 5)) groups.
    const int gsh = lg - 5;
    for (int bi = b0, slot = 0; bi < b1; ++bi) {
        u32 wa[QIR_BATCH], wb[QIR_BATCH];
        const unsigned char* sl = qir_turn<DT>(issue, bi, b1, slot, ring, wread, wa, wb);
        if constexpr (DT != DT_BF16) {
            qdec_batch_f32<NT, DT>(sl + pread, sb, odd, bi, lg, wa, wb, xp, acc);
            slot = slot + 1 == QIR_RING ? 0 : slot + 1;
        } else {
            u32 pr[4][2];
            qdec_bf16_params((const u32*)(sl + pread), sb, odd, bi, pr);
            __syncwarp();
            slot = slot + 1 == QIR_RING ? 0 : slot + 1;
#pragma unroll
            for (int u = 0; u < QIR_BATCH; ++u) {
                u32 A[2][4];
                qdec_bf16_chunk(pr, gsh, u, wa[u], wb[u], A);
                qdec_mma<NT>(A, xp, u, acc);
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) xp[j] += QIR_BATCH * 32;
    }
    cp_async_wait<0>();
    __syncthreads();
    float(*red)[NT * 4][32] = (float(*)[NT * 4][32])qi_smem;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp][j * 4 + e][lane] = acc[j][e];
    __syncthreads();
    for (int q = threadIdx.x; q < TPB * NT * 128; q += blockDim.x) {
        const int tt = q / (NT * 128), je = (q >> 5) % (NT * 4), l = q & 31, e = je & 3;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < SHARES; ++w) v += red[w * TPB + tt][je][l];
        const int row = (tile0 + tt) * 16 + (l >> 2) + 8 * (e >> 1), xr = (j0 + (je >> 2)) * 8 + 2 * (l & 3) + (e & 1);
        if (row < n && xr < m) out[(size_t)xr * n + row] = v;
    }
}

// SCALED: the forms for f16 and f32 scales (the `s` kernels), apart from the bf16 ones so that
// each keeps its own registers.
// The weight of a block of TPB tiles and its first tile (qdec_reg's choice, for the qwg kernels):
// blocks of TPB tiles, each weight's first block at a whole block (its last may run past n).
struct QirWeight {
    float* out;
    int n;
    const u32* pk;
    const void* sc;
    const void* bi;
    int tile;
};
template <int TPB>
__device__ __forceinline__ QirWeight qir_weight(QIR_PARAMS) {
    const int nt0 = (n0 + 16 * TPB - 1) / (16 * TPB), nt1 = (n1 + 16 * TPB - 1) / (16 * TPB);
    int tile = blockIdx.x, w = 0;
    if (tile >= nt0) tile -= nt0, w = 1;
    if (w == 1 && tile >= nt1) tile -= nt1, w = 2;
    return {w == 0 ? out0 : w == 1 ? out1 : out2, w == 0 ? n0 : w == 1 ? n1 : n2, w == 0 ? pk0 : w == 1 ? pk1 : pk2,
            w == 0 ? sc0 : w == 1 ? sc1 : sc2,   w == 0 ? bi0 : w == 1 ? bi1 : bi2, tile * TPB};
}
template <int NT, int TPB = 1, bool SCALED = false>
__device__ __forceinline__ void qdec_reg(QIR_PARAMS) {
    // Blocks of TPB tiles, each weight's first block at a whole block (its last may run past n).
    const int nt0 = (n0 + 16 * TPB - 1) / (16 * TPB), nt1 = (n1 + 16 * TPB - 1) / (16 * TPB);
    int tile = blockIdx.x, w = 0;
    if (tile >= nt0) tile -= nt0, w = 1;
    if (w == 1 && tile >= nt1) tile -= nt1, w = 2;
    tile *= TPB;
    float* out = w == 0 ? out0 : w == 1 ? out1 : out2;
    const int n = w == 0 ? n0 : w == 1 ? n1 : n2;
    const u32* pk = w == 0 ? pk0 : w == 1 ? pk1 : pk2;
    const void* sc = w == 0 ? sc0 : w == 1 ? sc1 : sc2;
    const void* bi = w == 0 ? bi0 : w == 1 ? bi1 : bi2;
    if constexpr (!SCALED) qdec_reg_body<NT, TPB, DT_BF16>(out, (const uint4*)xq, m, n, pk, sc, bi, lg, k, tile);
    else if (p_dt == DT_F16) qdec_reg_body<NT, TPB, DT_F16>(out, (const uint4*)xq, m, n, pk, sc, bi, lg, k, tile);
    else qdec_reg_body<NT, TPB, DT_F32>(out, (const uint4*)xq, m, n, pk, sc, bi, lg, k, tile);
}
// 79 and 108 registers: three blocks of 8 warps per SM for the 8-row form.
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 3) qdec_b4_r8(QIR_PARAMS) { qdec_reg<1>(QIR_ARGS); }
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qdec_b4_r16(QIR_PARAMS) { qdec_reg<2>(QIR_ARGS); }
// 17 to 64 rows (NUVEC_QDEC_ROWS): each weight decoded once for 32 or 64 input rows.
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qdec_b4_r32(QIR_PARAMS) { qdec_reg<4>(QIR_ARGS); }
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qdec_b4_r64(QIR_PARAMS) { qdec_reg<8>(QIR_ARGS); }
// Two weight tiles per block where there are enough of them (NUVEC_QDEC_TPB; four measured slower).
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qdec_b4_r32_t2(QIR_PARAMS) { qdec_reg<4, 2>(QIR_ARGS); }
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qdec_b4_r64_t2(QIR_PARAMS) { qdec_reg<8, 2>(QIR_ARGS); }
// The same for f16 and f32 scales (p_dt 1 or 0), written out: the host finds kernels by their
// names in this text.
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 3) qdec_b4_r8s(QIR_PARAMS) {
    qdec_reg<1, 1, true>(QIR_ARGS);
}
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qdec_b4_r16s(QIR_PARAMS) {
    qdec_reg<2, 1, true>(QIR_ARGS);
}
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qdec_b4_r32s(QIR_PARAMS) {
    qdec_reg<4, 1, true>(QIR_ARGS);
}
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qdec_b4_r64s(QIR_PARAMS) {
    qdec_reg<8, 1, true>(QIR_ARGS);
}
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qdec_b4_r32s_t2(QIR_PARAMS) {
    qdec_reg<4, 2, true>(QIR_ARGS);
}
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qdec_b4_r64s_t2(QIR_PARAMS) {
    qdec_reg<8, 2, true>(QIR_ARGS);
}

// ---- The bf16 products on Hopper's warpgroup MMA (qwg_b4_r32, _r64; sm_90a) ----
//
// qdec's weights decoded the same way, but multiplied by wgmma.mma_async m64nNk16: the four warps
// of a warpgroup give the A operand (64 weight rows, each warp its 16 as qdec's A fragment, whose
// layout wgmma's register A shares) and the tensor cores read x (B: N = 32 or 64 input rows) from
// shared memory themselves. qdec's warps each load every input tile per 16 weight rows, so that
// x's reads (16 times the weights' bytes at 64 rows) bound its speed; here a block of two
// warpgroups copies x once per 128 weight rows and no warp loads it into registers.
//
// x in the xwg layout (xwg_from_tiles): per 64 values of K an [N rows][128 bytes] block; row n's
// 16-byte unit q = 4 c + u (chunk c of the two, unit u) at position q ^ (n & 7), wgmma's 128-byte
// swizzle; unit u of a chunk holds the bf16 pairs (x 8t + u, x 8t + u + 4) of t = 0 .. 3, so that
// wgmma's k order is the decoded weights' (k slot 8u + 2t + e of a chunk is value 8t + u + 4e:
// qdec_bf16_chunk's pair i = u of word t).

// x's bf16 tiles (qdec_tile_at; `m` rows of `k`) in the xwg layout for N = `rows` (rows past m
// zero): unit position q of (block, row) is the tiles' word u of the row's four 16-byte units.
extern "C" __global__ void xwg_from_tiles(uint4* __restrict__ out, const uint4* __restrict__ tiles, int m, int k,
                                          int rows) {
    pdl_begin();
    const int kc = k >> 5, total = (k >> 6) * rows * 8;
    for (int q = (int)(blockIdx.x * blockDim.x + threadIdx.x); q < total; q += (int)(gridDim.x * blockDim.x)) {
        const int pos = q & 7, n = (q >> 3) % rows, b = (q >> 3) / rows;
        const int unit = pos ^ (n & 7), c = 2 * b + (unit >> 2), u = unit & 3;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (n < m) {
            const u32* src = (const u32*)(tiles + qdec_tile_at(n, c, 0, kc));
            v = make_uint4(src[u], src[4 + u], src[8 + u], src[12 + u]);
        }
        out[q] = v;
    }
}

// wgmma's shared-memory descriptor of a K-major operand at `addr` in 128-byte swizzled rows
// (8-row groups 1024 bytes apart; the leading byte offset unused).
__device__ __forceinline__ unsigned long long wg_desc(u32 addr) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}
#ifndef NUVEC_CUDA_EMU
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NUVEC_WGMMA 1
#endif
// The warpgroup MMA's fence, commit and wait, and the fence that makes the generic proxy's
// writes (cp.async's) visible to wgmma's reads. Only on sm_90a, where the host launches
// the qwg kernels (elsewhere they trap).
__device__ __forceinline__ void wg_fence() {
#ifdef NUVEC_WGMMA
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void wg_commit_wait() {
#ifdef NUVEC_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_proxy_async() {
#ifdef NUVEC_WGMMA
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// d (64 rows of this warpgroup x N = 8 NT columns; this warp's 16 rows as mma.sync's C per 8
// columns) += A (this warp's 16 rows x 16, mma.sync's A fragment) B (16 x N at desc).
template <int NT>
__device__ __forceinline__ void wgmma_bf16(float (&d)[NT][4], const u32 (&a)[4], unsigned long long desc) {
#ifdef NUVEC_WGMMA
    if constexpr (NT == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    } else {
        static_assert(NT == 4, "wgmma_bf16: 32 or 64 columns");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
#else
    __trap();
#endif
}
#endif

// Bytes of x per 64 values of K for N = 8 NT rows, and of the x ring of the qwg kernels.
#define QWG_XBLK(NT) ((NT) * 8 * 128)
#define QWG_XRING(NT) (QIR_RING * 2 * QWG_XBLK(NT))

// A block of QIR_WARPS warps (two warpgroups) takes weight tiles tile0 .. tile0 + 7 (warp w tile
// tile0 + w) over range blockIdx.y of K's batches (gridDim.y ranges of equal whole batches, the
// last shorter; with several, range r writes slice r of out, [ranges][m][n], that qmma_reduce
// adds in range order), for bf16 scales. Its dynamic shared memory: the x ring
// (1024-aligned, QIR_RING slots of a batch's two x blocks), then each warp's weight ring as
// qdec_reg_body's. A batch's turn: this thread's copies of it landed, the proxy fence, the block
// meets (every thread's copies of it landed, and every warp is done with the slots the next
// batch's copies refill: its wgmma waited), the copies QIR_RING - 1 ahead, the decoding, the
// batch's eight wgmma.
template <int NT>
__device__ __forceinline__ void qwg_body(float* out, const uint4* __restrict__ xw, int m, int n,
                                         const u32* __restrict__ packed, const void* __restrict__ scales,
                                         const void* __restrict__ biases, int lg, int k, int tile0) {
    constexpr int SLOT = QirRing<DT_BF16>::SLOT, PB = QirRing<DT_BF16>::PB, XSLOT = 2 * QWG_XBLK(NT);
    constexpr int XCOPIES = XSLOT / (16 * 32 * QIR_WARPS);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tile = tile0 + warp;
    const int kc = k >> 5, batches = kc / QIR_BATCH, per = (batches + (int)gridDim.y - 1) / (int)gridDim.y;
    const int b0 = (int)blockIdx.y * per, b1 = min(b0 + per, batches);
    const int r0 = min(tile * 16 + g, n - 1), r1 = min(tile * 16 + g + 8, n - 1);
    const size_t gpr = (size_t)(k >> lg);
    const int sb = (QIR_BATCH * 32 >> lg) * 2, cb = sb < 4 ? 4 : sb;
    const int odd[2] = {(int)((r0 * gpr) & 1), (int)((r1 * gpr) & 1)};
    const uint4* __restrict__ n0 = (const uint4*)(packed + (size_t)r0 * (k >> 3)) + t + (size_t)b0 * QIR_BATCH;
    const uint4* __restrict__ n1 = (const uint4*)(packed + (size_t)r1 * (k >> 3)) + t + (size_t)b0 * QIR_BATCH;
    const unsigned char* np = (const unsigned char*)((t & 1) ? biases : scales) +
                              ((size_t)(t >> 1 ? r1 : r0) * gpr) * 2 + (size_t)b0 * sb;
    out += (size_t)blockIdx.y * m * n;
    const u32 base = smem_addr(qi_smem), xring = (base + 1023u) & ~1023u;
    const u32 ring_a = xring + QWG_XRING(NT) + warp * QIR_RING * SLOT;
    const unsigned char* ring = qi_smem + (ring_a - base);
    const u32 wdst = g * 80 + 16 * t, pdst = QirRing<DT_BF16>::WEIGHTS + lane * PB;
    auto issue_w = [&](int slot) { qir_copy_batch(ring_a + slot * SLOT, wdst, pdst, cb, sb, n0, n1, np); };
    auto issue_x = [&](int slot, int bi) {
        const u32 at = xring + slot * XSLOT + threadIdx.x * 16;
        const unsigned char* src = (const unsigned char*)xw + (size_t)bi * XSLOT + threadIdx.x * 16;
#pragma unroll
        for (int i = 0; i < XCOPIES; ++i) cp_async16(at + i * 16 * 32 * QIR_WARPS, src + i * 16 * 32 * QIR_WARPS, true);
    };
    // The weights' first copies before pdl_begin (no kernel writes them), x's after.
#pragma unroll
    for (int s = 0; s < QIR_RING - 1; ++s)
        if (b0 + s < b1) issue_w(s);
    pdl_begin();
#pragma unroll
    for (int s = 0; s < QIR_RING - 1; ++s) {
        if (b0 + s < b1) issue_x(s, b0 + s);
        cp_async_commit();
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    const u32 wread = g * 20 + t, pread = QirRing<DT_BF16>::WEIGHTS + g * 4 * PB;
    const int gsh = lg - 5;
    for (int bi = b0, slot = 0; bi < b1; ++bi) {
        cp_async_wait<QIR_RING - 2>();
        fence_proxy_async();
        __syncthreads();
        if (bi + QIR_RING - 1 < b1) {
            const int next = slot == 0 ? QIR_RING - 1 : slot - 1;
            issue_w(next);
            issue_x(next, bi + QIR_RING - 1);
        }
        cp_async_commit();
        const unsigned char* sl = ring + slot * SLOT;
        const u32* tw = (const u32*)sl + wread;
        u32 pr[4][2];
        qdec_bf16_params((const u32*)(sl + pread), sb, odd, bi, pr);
        u32 A[QIR_BATCH][2][4];
#pragma unroll
        for (int u = 0; u < QIR_BATCH; ++u) qdec_bf16_chunk(pr, gsh, u, tw[4 * u], tw[8 * 20 + 4 * u], A[u]);
        const u32 xs = xring + slot * XSLOT;
        wg_fence();
#pragma unroll
        for (int u = 0; u < QIR_BATCH; ++u)
#pragma unroll
            for (int s = 0; s < 2; ++s)
                wgmma_bf16<NT>(acc, A[u][s], wg_desc(xs + (u >> 1) * QWG_XBLK(NT) + 32 * (2 * (u & 1) + s)));
        wg_commit_wait();
        slot = slot + 1 == QIR_RING ? 0 : slot + 1;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = tile * 16 + g + 8 * (e >> 1), xr = 8 * j + 2 * t + (e & 1);
            if (row < n && xr < m) out[(size_t)xr * n + row] = acc[j][e];
        }
}
template <int NT>
__device__ __forceinline__ void qwg_reg(QIR_PARAMS) {
    const QirWeight w = qir_weight<QIR_WARPS>(QIR_ARGS);
    qwg_body<NT>(w.out, (const uint4*)xq, m, w.n, w.pk, w.sc, w.bi, lg, k, w.tile);
}
// x (xq) in the xwg layout for 32 or 64 rows; bf16 scales; blocks of 8 weight tiles.
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qwg_b4_r32(QIR_PARAMS) { qwg_reg<4>(QIR_ARGS); }
extern "C" __global__ void __launch_bounds__(32 * QIR_WARPS, 2) qwg_b4_r64(QIR_PARAMS) { qwg_reg<8>(QIR_ARGS); }
