// Quantized products of a few input rows (batched decode: 2 to 32 rows) on the tensor cores.
//
// out [M, N] = x [M, K] W^T for MLX affine-quantized W (4 or 8 bits, groups of 32, 64 or 128
// values, K a multiple of 32). Each packed weight is read from memory once per call and decoded
// in registers as qdequant_bf16 decodes it for prefill (fmaf(scale, q, bias) in f32, rounded to
// bf16), then multiplied on the tensor cores (mma.sync m16n8k16, f32 accumulation). The
// alternative for more than one row, decoding whole weights to bf16 in memory for a GEMM, moves
// four and a half times the packed bytes per step.
//
// Two input forms:
// - qmma_bN_mR: x in bf16 (the caller converted it once for several weights), up to R rows. 64
//   rows (four tiles) measured slower on an H200 than decoding the weights to bf16 for cuBLAS,
//   so the host stops at 32.
// - qmma_bN_x3: x in f32, at most 16 rows, for decode-sized calls that must stay at f32
//   accuracy: x = xh + xl and w = wh + wl, each part bf16, and the product is
//   xl wh + xh wl + xh wh (the dropped xl wl and the parts' residues are about 2^-16 of each
//   term, against bf16's 2^-8).
//
// Shape: a block of QM_WARPS warps covers QM_ROWS weight rows (each warp QM_NT tiles of 8 rows)
// and one range of K (split-K over gridDim.y, in chunks of QM_CHUNK values); with several
// ranges each writes its partial sums to its own slice of `out` (the partial buffer) and
// qmma_reduce adds them in range order. The ranges depend on N and K only, so a row's result
// never depends on how many rows run with it (M) or what they hold.
//
// The K order inside a chunk is permuted (a dot product is the same sum in any order, and A and
// B use the same permutation): in the chunk's mma step s (0..7), the quad lane t (lane % 4)
// holds the values 32 t + 4 s + {0, 1, 2, 3}, where the mma's own layout would give it columns
// 2t, 2t + 1, 2t + 8, 2t + 9. So a lane reads 16 contiguous bytes of a 4-bit row (32 bytes of an
// 8-bit one) per chunk, one scale and bias (a group holds all 32 of its values), and 8
// contiguous values of x per pair of steps.

#define QM_WARPS 4
#define QM_NT 4
#define QM_ROWS (QM_WARPS * QM_NT * 8)
#define QM_CHUNK 128

// Values 4s..4s+3 of a lane's 32 (BITS = 4: four words; 8: eight) as floats.
template <int BITS>
__device__ __forceinline__ void qm_values(const u32 (&w)[BITS], int s, float (&v)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        u32 q;
        if constexpr (BITS == 4) q = (w[s >> 1] >> (16 * (s & 1) + 4 * e)) & 15u;
        else q = (w[s] >> (8 * e)) & 255u;
        v[e] = __uint_as_float(q | 0x4B000000u) - 8388608.0f;
    }
}

// The bf16 value of the low (hi = false) or high half of a packed pair, as f32.
__device__ __forceinline__ float qm_half(u32 pair, bool hi) { return __uint_as_float(hi ? pair & 0xFFFF0000u : pair << 16); }

// bf16 pairs (lo, hi) = (a, b) and their residues (a - bf16(a), b - bf16(b)) as bf16 pairs.
__device__ __forceinline__ void qm_split(float a, float b, u32& head, u32& tail) {
    head = bf16x2_rn(a, b);
    tail = bf16x2_rn(a - qm_half(head, false), b - qm_half(head, true));
}

// x goes through shared memory a chunk at a time: the block stages the chunk's 128 values of every
// row (all loads in flight at once), then each lane reads its A fragments there. A row's values are
// laid out by (pair of steps s2, quad lane t): the 8 values 32 t + 8 s2 .. + 8 that lane t
// multiplies in steps 2 s2 and 2 s2 + 1 sit together at piece s2 * 4 + t, so the four lanes of a
// quad read 64 (bf16) or 128 (f32) contiguous bytes, and the row stride's padding puts the next
// row's quad on the other banks.
#define QM_RS_BF16 320
#define QM_RS_F32 576

// Stages chunk c of x ([m, k], bf16 or, SPLIT, f32) for `rows` rows (zeros past m or k) into xs.
template <bool SPLIT>
__device__ __forceinline__ void qm_stage(unsigned char* xs, const void* x, int rows, int m, int k, int c) {
    constexpr int PIECES = SPLIT ? 32 : 16;  // 16-byte pieces of a row's chunk
    const int k0 = c * QM_CHUNK;
    for (int i = threadIdx.x; i < rows * PIECES; i += QM_WARPS * 32) {
        const int r = i / PIECES, q = i % PIECES;
        const int v0 = q * (SPLIT ? 4 : 8);  // first value of the piece
        const int t = v0 / 32, s2 = (v0 % 32) / 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < m && k0 + v0 < k) {
            if constexpr (SPLIT) v = *(const uint4*)((const float*)x + (size_t)r * k + k0 + v0);
            else v = *(const uint4*)((const u16*)x + (size_t)r * k + k0 + v0);
        }
        const int at = SPLIT ? r * QM_RS_F32 + (s2 * 4 + t) * 32 + (v0 % 8) * 4 : r * QM_RS_BF16 + (s2 * 4 + t) * 16;
        *(uint4*)(xs + at) = v;
    }
}

// The lane's x operands of steps 2 s2 and 2 s2 + 1 for rows r0 and r1 = r0 + 8 from the staged
// chunk: A fragments {row r0 cols 2t.., row r1 cols 2t.., row r0 cols 2t+8.., row r1 cols 2t+8..},
// per step. SPLIT: x is f32 and `tail` gets the residues.
template <bool SPLIT>
__device__ __forceinline__ void qm_rows_a(const unsigned char* xs, int r0, int t, int s2, u32 (&head)[2][4],
                                          u32 (&tail)[2][4]) {
    u32 h[2][4], l[2][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = r0 + 8 * half;
        if constexpr (SPLIT) {
            const float4* p = (const float4*)(xs + r * QM_RS_F32 + (s2 * 4 + t) * 32);
            const float4 v0 = p[0], v1 = p[1];
            qm_split(v0.x, v0.y, h[half][0], l[half][0]);
            qm_split(v0.z, v0.w, h[half][1], l[half][1]);
            qm_split(v1.x, v1.y, h[half][2], l[half][2]);
            qm_split(v1.z, v1.w, h[half][3], l[half][3]);
        } else {
            const uint4 v = *(const uint4*)(xs + r * QM_RS_BF16 + (s2 * 4 + t) * 16);
            h[half][0] = v.x;
            h[half][1] = v.y;
            h[half][2] = v.z;
            h[half][3] = v.w;
        }
    }
#pragma unroll
    for (int st = 0; st < 2; ++st) {
        // Step st of the pair: values 4st..4st+3 of the eight, i.e. pairs 2st and 2st + 1.
        head[st][0] = h[0][2 * st];
        head[st][1] = h[1][2 * st];
        head[st][2] = h[0][2 * st + 1];
        head[st][3] = h[1][2 * st + 1];
        if constexpr (SPLIT) {
            tail[st][0] = l[0][2 * st];
            tail[st][1] = l[1][2 * st];
            tail[st][2] = l[0][2 * st + 1];
            tail[st][3] = l[1][2 * st + 1];
        }
    }
}

// The lane's 32 values of a chunk at kk (its words) in rows r0 + 8 j, with their scales and biases
// (zeros past N or past K).
template <int BITS>
__device__ __forceinline__ void qm_load(u32 (&w)[QM_NT][BITS], float (&sc)[QM_NT], float (&bi)[QM_NT], const u32* packed,
                                        const void* scales, const void* biases, int p_dt, int lg, int n, int k, int r0,
                                        int kk) {
    const size_t row_words = (size_t)k * BITS / 32, gpr = (size_t)(k >> lg);
#pragma unroll
    for (int j = 0; j < QM_NT; ++j) {
        const int r = r0 + 8 * j;
        if (r < n && kk < k) {
            const uint4* p = (const uint4*)(packed + (size_t)r * row_words + (size_t)kk * BITS / 32);
#pragma unroll
            for (int q = 0; q < BITS / 4; ++q) {
                const uint4 v = p[q];
                w[j][4 * q] = v.x;
                w[j][4 * q + 1] = v.y;
                w[j][4 * q + 2] = v.z;
                w[j][4 * q + 3] = v.w;
            }
            const size_t gi = (size_t)r * gpr + (size_t)(kk >> lg);
            sc[j] = load_float(scales, gi, p_dt);
            bi[j] = load_float(biases, gi, p_dt);
        } else {
#pragma unroll
            for (int q = 0; q < BITS; ++q) w[j][q] = 0u;
            sc[j] = 0.0f;
            bi[j] = 0.0f;
        }
    }
}

// MT tiles of 16 input rows; SPLIT: x is f32 and every product is taken in three bf16 parts.
template <int BITS, int MT, bool SPLIT>
__device__ __forceinline__ void qmma_body(float* out, const void* x, int m, int n, const u32* packed,
                                          const void* scales, const void* biases, int p_dt, int lg, int k, int cps) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int nw = blockIdx.x * QM_ROWS + warp * QM_NT * 8;
    const int chunks = (k + QM_CHUNK - 1) / QM_CHUNK;
    const int c0 = blockIdx.y * cps, c1 = min(c0 + cps, chunks);
    float acc[MT][QM_NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < QM_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    __shared__ __align__(16) unsigned char xs[SPLIT ? 16 * QM_RS_F32 : 16 * MT * QM_RS_BF16];
    u32 w[QM_NT][BITS];
    float sc[QM_NT], bi[QM_NT];
    for (int c = c0; c < c1; ++c) {
        const int kk = c * QM_CHUNK + 32 * t;
        // The weights' loads go out first, then x's, so that both are in flight together.
        qm_load<BITS>(w, sc, bi, packed, scales, biases, p_dt, lg, n, k, nw + g, kk);
        __syncthreads();  // every lane has read the chunk before
        qm_stage<SPLIT>(xs, x, 16 * MT, m, k, c);
        __syncthreads();
#pragma unroll
        for (int s2 = 0; s2 < 4; ++s2) {
            u32 b[QM_NT][2][2], bl[QM_NT][2][2];
#pragma unroll
            for (int j = 0; j < QM_NT; ++j)
#pragma unroll
                for (int st = 0; st < 2; ++st) {
                    float v[4];
                    qm_values<BITS>(w[j], 2 * s2 + st, v);
#pragma unroll
                    for (int e = 0; e < 4; ++e) v[e] = fmaf(sc[j], v[e], bi[j]);
                    if constexpr (SPLIT) {
                        qm_split(v[0], v[1], b[j][st][0], bl[j][st][0]);
                        qm_split(v[2], v[3], b[j][st][1], bl[j][st][1]);
                    } else {
                        b[j][st][0] = bf16x2_rn(v[0], v[1]);
                        b[j][st][1] = bf16x2_rn(v[2], v[3]);
                    }
                }
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                u32 a[2][4], al[2][4];
                qm_rows_a<SPLIT>(xs, 16 * i + g, t, s2, a, al);
#pragma unroll
                for (int st = 0; st < 2; ++st)
#pragma unroll
                    for (int j = 0; j < QM_NT; ++j) {
                        if constexpr (SPLIT) {
                            mma_bf16(acc[i][j], al[st], b[j][st]);
                            mma_bf16(acc[i][j], a[st], bl[j][st]);
                        }
                        mma_bf16(acc[i][j], a[st], b[j][st]);
                    }
            }
        }
    }
    float* dst = out + (size_t)blockIdx.y * m * n;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < QM_NT; ++j) {
            const int col = nw + 8 * j + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = 16 * i + g + 8 * (e >> 1), cc = col + (e & 1);
                if (r < m && cc < n) dst[(size_t)r * n + cc] = acc[i][j][e];
            }
        }
}

// Asks L2 for the packed bytes this block will read (its rows' words in its range of K), a row per
// thread, before pdl_begin: weights are never written by a kernel, and the whole range in flight at
// once keeps memory busy where the loop's loads, one chunk at a time, would wait on it.
template <int BITS>
__device__ __forceinline__ void qm_prefetch(const u32* packed, int n, int k, int cps) {
    const int r = blockIdx.x * QM_ROWS + threadIdx.x;
    const int chunks = (k + QM_CHUNK - 1) / QM_CHUNK;
    const int c0 = blockIdx.y * cps, c1 = min(c0 + cps, chunks);
    if (r < n && c0 < c1) {
        const size_t row_words = (size_t)k * BITS / 32, w0 = (size_t)c0 * QM_CHUNK * BITS / 32;
        size_t w1 = (size_t)c1 * QM_CHUNK * BITS / 32;
        if (w1 > row_words) w1 = row_words;
        l2_prefetch(packed + (size_t)r * row_words + w0, (w1 - w0) * 4);
    }
}

#define QM_PARAMS                                                                                                \
    float *out, const void *x, int m, int n, const u32 *packed, const void *scales, const void *biases, int p_dt, \
        int lg, int k, int cps
#define QM_BF16(BITS, MT) qmma_body<BITS, MT, false>(out, x, m, n, packed, scales, biases, p_dt, lg, k, cps)
#define QM_BEGIN(BITS)                          \
    qm_prefetch<BITS>(packed, n, k, cps); \
    pdl_begin()
#define QM_X3(BITS) qmma_body<BITS, 1, true>(out, x, m, n, packed, scales, biases, p_dt, lg, k, cps)

extern "C" __global__ void __launch_bounds__(128) qmma_b4_m16(QM_PARAMS) { QM_BEGIN(4); QM_BF16(4, 1); }
extern "C" __global__ void __launch_bounds__(128) qmma_b4_m32(QM_PARAMS) { QM_BEGIN(4); QM_BF16(4, 2); }
extern "C" __global__ void __launch_bounds__(128) qmma_b8_m16(QM_PARAMS) { QM_BEGIN(8); QM_BF16(8, 1); }
extern "C" __global__ void __launch_bounds__(128) qmma_b8_m32(QM_PARAMS) { QM_BEGIN(8); QM_BF16(8, 2); }
extern "C" __global__ void __launch_bounds__(128) qmma_b4_x3(QM_PARAMS) { QM_BEGIN(4); QM_X3(4); }
extern "C" __global__ void __launch_bounds__(128) qmma_b8_x3(QM_PARAMS) { QM_BEGIN(8); QM_X3(8); }

// out [mn] = the sum of `splits` partial slices of `part` ([splits, mn]), in slice order.
extern "C" __global__ void qmma_reduce(float* out, const float* part, int splits, size_t mn) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < mn; i += (size_t)gridDim.x * blockDim.x) {
        float s = part[i];
        for (int p = 1; p < splits; ++p) s += part[(size_t)p * mn + i];
        out[i] = s;
    }
}
