// Quantized products of a few input rows (batched decode: 2 to 32 rows) on the tensor cores.
//
// out [M, N] = x [M, K] W^T for MLX affine-quantized W (4 or 8 bits, groups of 32, 64 or 128
// values, K a multiple of 32). Each packed weight is read from memory once per call. Each group
// is taken in its factored form, as mlx's own quantized vector kernels take it:
//   sum_k x_k (s q_k + b) = s * sum_k x_k q_k + b * sum_k x_k,
// with the integers q_k as bf16 (exact: 0..255 fit bf16's significand) multiplied on the tensor
// cores (mma.sync m16n8k16, f32 accumulation), sum_k x_k from the same mma against ones, and s and
// b applied in f32 once per group and output. So a weight is never rounded, and decoding two
// 4-bit values is a shift, one lop3 and one bf16x2 fma (the alternative, fmaf(s, q, b) per value
// and a conversion, made the kernel bound by its integer and float pipes, not by memory).
//
// Three forms:
// - qmma_bN_mR: x in bf16 (the caller converted it once for several weights), up to R rows.
// - qmma_bN_dR: x in bf16, R rows per block (more in blocks over gridDim.z), each weight decoded
//   in registers to the bf16 the prefill path's GEMM multiplies (s q + b rounded once; scales and
//   biases must be bf16, so exact operands of the bf16 fma; the qmma_bN_dRs forms take f32 or f16
//   ones and decode in f32, qm_decode_f32). No per-group sums: a block's
//   registers go to its accumulators, so one block takes 64 rows (the factored form at 64 rows
//   held 64 more registers of group sums and was slower than decoding whole weights for cuBLAS).
// - qmma_bN_f32: x in f32, at most 16 rows, for decode-sized calls that must stay at f32
//   accuracy: x = xh + xl, each part bf16 (the residue xl carries x to about 2^-17), and each
//   sum takes both parts against the exact q.
//
// Shape: a block of QM_WARPS warps covers QM_ROWS weight rows (each warp QM_NT tiles of 8 rows),
// 16 MT input rows (the dR kernels: the next 16 MT in the next block over gridDim.z) and one range
// of K (split-K over gridDim.y, in chunks of QM_CHUNK values); with several ranges each writes
// its partial sums to its own slice of `out` (the partial buffer) and qmma_reduce adds them in
// range order. The ranges depend on N, K, the kernel and the device only (ops/qmma.rs), so a
// row's result never depends on how many rows run with it in one kernel (M) or what they hold.
//
// K order (a dot product is the same sum in any order, and A and B use the same one): a group of
// G = 2^lg values is G / 16 whole mma steps, so no step mixes groups. In a group, quad lane t
// (lane % 4) holds the values t G/4 .. (t + 1) G/4 in pieces of 8 (one 4-bit word, two 8-bit
// words); the lane's piece i (0..3 over a chunk) feeds steps 2i and 2i + 1: with its values
// v0..v7, step 2i takes the pairs (v0, v4) and (v1, v5) as the lane's two B registers, step
// 2i + 1 (v2, v6) and (v3, v7) — what one mask of both 16-bit halves of a 4-bit word gives.

#define QM_WARPS 4
#define QM_NT 4
#define QM_ROWS (QM_WARPS * QM_NT * 8)
#define QM_CHUNK 128

// The first value, within its chunk, of piece i of quad lane t, for groups of 2^lg values.
__device__ __forceinline__ int qm_piece_k(int i, int t, int lg) {
    const int per = 1 << (lg - 5);  // a lane's pieces in one group (shifts: lg is not a constant)
    return ((i >> (lg - 5)) << lg) + (t << (lg - 2)) + (i & (per - 1)) * 8;
}

// The bf16 pair (q0, q1) of the 4-bit values in bits 0-3 and 16-19 of v: 0x4300 | q is the bf16
// 128 + q, and one fma takes the 128 off exactly.
__device__ __forceinline__ u32 qm_q4_pair(u32 v, u32 magic) {
    return bf16x2_fma(and_or<0x000F000Fu>(v, magic), 0x3F803F80u, 0xC300C300u);
}

// The bf16 pair of byte e of lo and byte e of hi (8-bit values), exactly.
__device__ __forceinline__ u32 qm_q8_pair(u32 lo, u32 hi, int e) {
    const float a = __uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7440 | e)) - 8388608.0f;
    const float b = __uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7440 | e)) - 8388608.0f;
    return bf16x2_rn(a, b);
}

// The bf16 pair of twice the e2m1 (mxfp4) values of the codes in bits 0-3 and 16-19 of v:
// magnitudes 0, 1, 2, 3, 4, 6, 8, 12 looked up by byte permutes (their bf16 low bytes, then high
// bytes, eight to a register pair), the code's sign bit as bf16's. Twice, so that the group's
// multiplier 2^(E - 128) (QmLoader::issue) stays in bf16's range for every e8m0 exponent E.
__device__ __forceinline__ u32 qm_fp4_pair(u32 v) {
    const u32 sel = (v & 0x7u) | ((v >> 12) & 0x70u);
    const u32 lo = __byte_perm(0x40008000u, 0x4000C080u, sel);
    const u32 hi = __byte_perm(0x40403F00u, 0x41414040u, sel);
    return __byte_perm(lo, hi, 0x5140u) | ((v & 0x00080008u) << 12);
}

// The lane's B registers of steps 2i (st = 0) and 2i + 1 from its piece i in w; FP4: e2m1 codes
// (qm_fp4_pair) instead of integers.
template <int BITS, bool FP4 = false>
__device__ __forceinline__ void qm_b(const u32 (&w)[BITS], int i, u32 magic, u32 (&b)[2][2]) {
    if constexpr (FP4) {
        const u32 v = w[i];
        b[0][0] = qm_fp4_pair(v);
        b[0][1] = qm_fp4_pair(v >> 4);
        b[1][0] = qm_fp4_pair(v >> 8);
        b[1][1] = qm_fp4_pair(v >> 12);
    } else if constexpr (BITS == 4) {
        const u32 v = w[i];
        b[0][0] = qm_q4_pair(v, magic);
        b[0][1] = qm_q4_pair(v >> 4, magic);
        b[1][0] = qm_q4_pair(v >> 8, magic);
        b[1][1] = qm_q4_pair(v >> 12, magic);
    } else {
        const u32 lo = w[2 * i], hi = w[2 * i + 1];
        b[0][0] = qm_q8_pair(lo, hi, 0);
        b[0][1] = qm_q8_pair(lo, hi, 1);
        b[1][0] = qm_q8_pair(lo, hi, 2);
        b[1][1] = qm_q8_pair(lo, hi, 3);
    }
}

// bf16 pairs (lo, hi) = (a, b) and their residues (a - bf16(a), b - bf16(b)) as bf16 pairs.
__device__ __forceinline__ float qm_half(u32 pair, bool hi) { return __uint_as_float(hi ? pair & 0xFFFF0000u : pair << 16); }
__device__ __forceinline__ void qm_split(float a, float b, u32& head, u32& tail) {
    head = bf16x2_rn(a, b);
    tail = bf16x2_rn(a - qm_half(head, false), b - qm_half(head, true));
}

// Chunks go through shared memory in a pipeline of QM_STAGES slots: while the block multiplies
// chunk c, cp.async is bringing chunks c + 1 .. c + QM_STAGES - 1 (weights and x), so that a
// chunk's memory round trip is never waited on alone (with one chunk in flight the kernel spent
// most of its time stalled on loads, at 0.5 TB/s). A slot holds:
// - the block's 128 weight rows of the chunk, QM_WROW(BITS) bytes each, in 16-byte pieces placed
//   at piece ^ qm_swz(row) so that the lanes of a warp read distinct banks;
// - x's rows of the chunk as they are in memory (f32 for the f32 kernels, bf16 else), padded by
//   16 bytes; the lanes permute their pieces into the steps' pairs as they read them;
// - each weight row's scales and biases of the chunk's groups (at most 4), as f32.
// Scales and biases (2 bytes each, not 16-byte aligned) come through registers instead: loaded
// when their chunk is issued, stored into the slot one iteration later.
// Two slots: one chunk in flight while one is multiplied is enough here (the loop is bound by
// issuing instructions; at 64 rows a third slot measured slower, at 8 to 32 the same).
#ifndef QM_STAGES
#define QM_STAGES 2
#endif
#define QM_WROW(BITS) (16 * (BITS))
#define QM_XROWS(MT, SPLIT) ((SPLIT) ? 8 : 16 * (MT))
#define QM_XROW(SPLIT) ((SPLIT) ? 528 : 272)
#define QM_SLOT(BITS, MT, SPLIT) (QM_ROWS * QM_WROW(BITS) + QM_XROWS(MT, SPLIT) * QM_XROW(SPLIT) + QM_ROWS * 4 * 2 * 4)

extern __shared__ __align__(16) unsigned char qm_smem[];

__device__ __forceinline__ int qm_swz(int row) { return ((row >> 2) & 1) | (((row >> 1) & 1) << 1); }

// Where a block's input rows come from and its outputs go. Plain (GATHER false): rows m0.. of x
// and of out. Gathered (the grouped products of mixture-of-experts layers, qmma_bN_g64): row i
// of the block is slot order[m0 + i] (-1: padding, no row), read from x row slot / div and
// written to out row slot, at column col0 of rows of ld values.
struct QmRows {
    const int* order;
    int div, ld, col0;
};

// Issues the chunks of one block into pipeline slots. A thread copies the same pieces of every
// chunk (its weight pieces: rows tid / WP + q 128 / WP, piece tid % WP; its x pieces likewise)
// and loads the scales and biases of weight row nb + tid, so their places, sources and row
// checks are found once, here, and a chunk only adds its offset (cp.async; zeros past N, M or
// K). A group size or scale dtype the caller knows when compiling folds into the code through
// inlining.
template <int BITS, int MT, bool SPLIT, bool GATHER, bool FP4 = false>
struct QmLoader {
    static constexpr int WP = QM_WROW(BITS) / 16;  // pieces of a weight row, and a thread's per chunk
    static constexpr int XP = SPLIT ? 32 : 16;     // pieces of an x row
    static constexpr int XV = SPLIT ? 4 : 8;       // values of an x piece
    static constexpr int XB = SPLIT ? 4 : 2;       // bytes of an x value
    static constexpr int XQ = QM_XROWS(MT, SPLIT) * XP / (QM_WARPS * 32);  // a thread's x pieces
    static constexpr int WRQ = QM_WARPS * 32 / WP, XRQ = QM_WARPS * 32 / XP;  // rows between them

    const unsigned char* w_src;  // the thread's first weight piece of chunk 0
    size_t w_step;               // bytes from one of its weight pieces to the next (WRQ rows)
    const unsigned char* x_src;  // the thread's first x piece of chunk 0 (plain rows)
    size_t x_step;               // bytes from one of its x pieces to the next (XRQ rows)
    int x_row[GATHER ? XQ : 1];  // gathered rows: the x row of each x piece, -1: none (zeros)
    const void* sc;              // the scale and bias arrays, and row nb + tid's first group in them
    const void* bi;
    size_t g_row;
    u32 w_dst, x_dst;            // the thread's first pieces within a slot
    int w_k, x_k, k, lg, p_dt;   // the first value of the thread's pieces in a chunk; K
    unsigned w_ok, x_ok;         // bit q: weight (x) piece q's row is below N (M)
    bool s_ok;                   // row nb + tid is below N

    __device__ __forceinline__ QmLoader(const void* x, int m, int m0, int n, int k_, int nb, const u32* packed,
                                        const void* scales, const void* biases, int p_dt_, int lg_,
                                        const QmRows& rows) {
        const int tid = threadIdx.x;
        k = k_;
        lg = lg_;
        p_dt = p_dt_;
        const size_t row_bytes = (size_t)k * BITS / 8;
        const int wr = tid / WP, wp = tid % WP;
        w_ok = 0;
#pragma unroll
        for (int q = 0; q < WP; ++q) w_ok |= (nb + wr + q * WRQ < n ? 1u : 0u) << q;
        w_src = (const unsigned char*)packed + (nb + wr < n ? (size_t)(nb + wr) * row_bytes + wp * 16 : 0);
        w_step = (size_t)WRQ * row_bytes;
        w_k = wp * (128 / BITS);
        w_dst = wr * QM_WROW(BITS) + ((wp ^ qm_swz(wr)) << 4);
        const int xr = tid / XP, xp = tid % XP;
        x_k = xp * XV;
        x_ok = 0;
#pragma unroll
        for (int q = 0; q < XQ; ++q) {
            const int r = m0 + xr + q * XRQ;
            if constexpr (GATHER) {
                const int from = r < m ? rows.order[r] : -1;
                x_row[q] = from >= 0 ? from / rows.div : -1;
                x_ok |= (from >= 0 ? 1u : 0u) << q;
            } else {
                x_ok |= (r < m ? 1u : 0u) << q;
            }
        }
        x_src = (const unsigned char*)x + (GATHER || m0 + xr >= m ? 0 : ((size_t)(m0 + xr) * k + x_k) * XB);
        x_step = (size_t)XRQ * k * XB;
        x_dst = QM_ROWS * QM_WROW(BITS) + xr * QM_XROW(SPLIT) + xp * 16;
        s_ok = nb + tid < n;
        sc = scales;
        bi = biases;
        g_row = (size_t)(nb + tid) * (size_t)(k >> lg);
    }

    // Chunk c's weights and x into slot `slot` (cp.async), and the scales and biases of row nb +
    // tid for its groups into s and b.
    __device__ __forceinline__ void issue(int slot, int c, float (&s)[4], float (&b)[4]) const {
        const u32 base = smem_addr(qm_smem) + slot * QM_SLOT(BITS, MT, SPLIT);
        const int k0 = c * QM_CHUNK;
        const bool wk = k0 + w_k < k;
        const unsigned char* wsrc = w_src + (size_t)c * QM_WROW(BITS);
#pragma unroll
        for (int q = 0; q < WP; ++q) {
            const bool valid = wk && ((w_ok >> q) & 1u);
            cp_async16(base + w_dst + q * WRQ * QM_WROW(BITS), valid ? wsrc + q * w_step : w_src, valid);
        }
        const bool xk = k0 + x_k < k;
#pragma unroll
        for (int q = 0; q < XQ; ++q) {
            const bool valid = xk && ((x_ok >> q) & 1u);
            const unsigned char* src = x_src;
            if constexpr (GATHER) {
                if (valid) src += ((size_t)x_row[q] * k + k0 + x_k) * XB;
            } else {
                if (valid) src += q * x_step + (size_t)k0 * XB;
            }
            cp_async16(base + x_dst + q * XRQ * QM_XROW(SPLIT), src, valid);
        }
        const int gpc = QM_CHUNK >> lg;  // groups in a chunk (lg 5 to 7)
#pragma unroll
        for (int gb = 0; gb < 4; ++gb) {
            const bool in = s_ok && gb < gpc && k0 + (gb << lg) < k;
            const size_t gi = g_row + (size_t)c * gpc + gb;
            if constexpr (FP4) {
                // The e8m0 scale 2^(E - 127) over the 2 qm_fp4_pair puts in: 2^(E - 128) (E = 0: the
                // f32 subnormal 2^-128).
                const u32 e = in ? ((const unsigned char*)sc)[gi] : 1u;
                s[gb] = in ? __uint_as_float(e == 0 ? 0x00200000u : (e - 1) << 23) : 0.0f;
                b[gb] = 0.0f;
            } else {
                s[gb] = in ? load_float(sc, gi, p_dt) : 0.0f;
                b[gb] = in ? load_float(bi, gi, p_dt) : 0.0f;
            }
        }
    }
};

// Stores the scales and biases loaded by QmLoader::issue into slot `slot`.
template <int BITS, int MT, bool SPLIT>
__device__ __forceinline__ void qm_put(int slot, const float (&s)[4], const float (&b)[4]) {
    float* sb = (float*)(qm_smem + slot * QM_SLOT(BITS, MT, SPLIT) + QM_ROWS * QM_WROW(BITS) +
                         QM_XROWS(MT, SPLIT) * QM_XROW(SPLIT)) +
                threadIdx.x * 8;
    *(float4*)sb = make_float4(s[0], b[0], s[1], b[1]);
    *(float4*)(sb + 4) = make_float4(s[2], b[2], s[3], b[3]);
}

// The lane's pieces of weight row `row` (of the block) from a slot's weights: for each group
// block of the chunk, the lane's run of G/4 values (G/8 bytes at 4 bits, G/4 at 8).
template <int BITS>
__device__ __forceinline__ void qm_read_w(const unsigned char* ws, int row, int t, int lg, u32 (&w)[BITS]) {
    const unsigned char* r = ws + row * QM_WROW(BITS);
    const int sw = qm_swz(row);
    const int lr = lg - 3 + (BITS == 8 ? 1 : 0), run = 1 << lr;  // bytes of a lane's run in a group
#define QM_AT(off) (r + (((((off) >> 4) ^ sw)) << 4) + ((off) & 15))
    if (run >= 16) {
#pragma unroll
        for (int q = 0; q < BITS / 4; ++q) {
            const int off = (((q * 16) >> lr) << (lr + 2)) + (t << lr) + ((q * 16) & (run - 1));
            const uint4 v = *(const uint4*)QM_AT(off);
            w[4 * q] = v.x;
            w[4 * q + 1] = v.y;
            w[4 * q + 2] = v.z;
            w[4 * q + 3] = v.w;
        }
    } else if (run == 8) {
#pragma unroll
        for (int q = 0; q < BITS / 2; ++q) {
            const int off = q * 32 + t * 8;
            const uint2 v = *(const uint2*)QM_AT(off);
            w[2 * q] = v.x;
            w[2 * q + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int q = 0; q < BITS; ++q) w[q] = *(const u32*)QM_AT(q * 16 + t * 4);
    }
#undef QM_AT
}

// The lane's x operands of steps 2i and 2i + 1 for rows r0 and r0 + 8 from a slot's x, piece i
// starting at value kp of the chunk: A fragments {row r0 pair 0, row r0 + 8 pair 0, row r0 pair
// 1, row r0 + 8 pair 1} per step, the pairs (v0, v4), (v1, v5) for step 2i and (v2, v6), (v3, v7)
// for 2i + 1. SPLIT: x is f32, `tail` gets the residues, and only rows below 8 are staged (the
// rows r0 + 8 are zeros).
template <bool SPLIT>
__device__ __forceinline__ void qm_read_a(const unsigned char* xs, int r0, int kp, u32 (&head)[2][4], u32 (&tail)[2][4]) {
    if constexpr (SPLIT) {
        const float4* p = (const float4*)(xs + r0 * QM_XROW(true) + kp * 4);
        const float4 a = p[0], b = p[1];
        qm_split(a.x, b.x, head[0][0], tail[0][0]);
        qm_split(a.y, b.y, head[0][2], tail[0][2]);
        qm_split(a.z, b.z, head[1][0], tail[1][0]);
        qm_split(a.w, b.w, head[1][2], tail[1][2]);
#pragma unroll
        for (int st = 0; st < 2; ++st) head[st][1] = head[st][3] = tail[st][1] = tail[st][3] = 0u;
    } else {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint4 v = *(const uint4*)(xs + (r0 + 8 * half) * QM_XROW(false) + kp * 2);
            // v.x holds (v0, v1), v.y (v2, v3), v.z (v4, v5), v.w (v6, v7).
            head[0][half] = __byte_perm(v.x, v.z, 0x5410);
            head[0][2 + half] = __byte_perm(v.x, v.z, 0x7632);
            head[1][half] = __byte_perm(v.y, v.w, 0x5410);
            head[1][2 + half] = __byte_perm(v.y, v.w, 0x7632);
        }
    }
}

// MT tiles of 16 input rows (rows from 16 MT blockIdx.z on); SPLIT: x is f32 (at most 8 rows),
// taken in two bf16 parts; DEQ: each weight decoded to bf16 (s q + b, one rounding) and multiplied
// as it is, instead of the factored sums.
// The block takes column block bx (QM_ROWS weight rows) and row block mz; GATHER: its rows as
// `rows` says. LG > 0: groups of 2^LG values, known when compiling (lg is then ignored).
// Two codes (a bf16 pair of exact integers) decoded in f32, s q + b, then rounded once to bf16: the
// decoding kernels' form for scales and biases bf16 does not hold exactly (a GGUF's f32 offsets and
// K-quant scales, f16 ones), the same arithmetic as prefill.cu's qdequant_bf16.
__device__ __forceinline__ u32 qm_decode_f32(u32 q, float s, float b) {
    return bf16x2_rn(fmaf(s, __uint_as_float(q << 16), b), fmaf(s, __uint_as_float(q & 0xFFFF0000u), b));
}

// SF32 (with DEQ): the scales and biases read as stored (p_dt) and each weight decoded by
// qm_decode_f32 instead of one bf16 fma.
template <int BITS, int MT, bool SPLIT, bool DEQ, bool GATHER = false, bool FP4 = false, int LG = 0, bool SF32 = false>
__device__ __forceinline__ void qmma_body(float* out, const void* x, int m, int n, const u32* packed,
                                          const void* scales, const void* biases, int p_dt, int lg, int k, int cps,
                                          int bx, int mz, const QmRows& rows) {
    if constexpr (LG > 0) lg = LG;
    // The bf16-fma decoding takes bf16 scales only (one fma rounding of s q + b needs them exact).
    if constexpr (DEQ && !FP4 && !SF32) p_dt = DT_BF16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int nb = bx * QM_ROWS, wr = warp * QM_NT * 8;  // the block's and the warp's first row
    const int m0 = mz * 16 * MT;                          // the block's first input row
    const int chunks = (k + QM_CHUNK - 1) / QM_CHUNK;
    const int c0 = blockIdx.y * cps, c1 = min(c0 + cps, chunks);
    const int per = 1 << (lg - 5);  // pieces of a lane per group
    const u32 magic = 0x43004300u;
    const u32 ones[2] = {0x3F803F80u, 0x3F803F80u};
    float acc[MT][QM_NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < QM_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    // The pipeline's first QM_STAGES - 1 chunks; `ps`, `pb` hold the scales of the chunk issued
    // last until they are stored.
    float ps[4], pb[4];
    const QmLoader<BITS, MT, SPLIT, GATHER, FP4> loader(x, m, m0, n, k, nb, packed, scales, biases, p_dt, lg,
                                                                 rows);
#pragma unroll
    for (int s = 0; s < QM_STAGES - 1; ++s) {
        if (s > 0) qm_put<BITS, MT, SPLIT>(s - 1, ps, pb);
        if (c0 + s < c1) loader.issue(s, c0 + s, ps, pb);
        cp_async_commit();
    }
    // Slots in turn: chunk c's, the one its predecessor's scales go to, the one chunk c + STAGES - 1
    // is issued into (counters, not c modulo STAGES, which costs a multiply-high a chunk).
    int slot = 0, put = QM_STAGES - 2, next = QM_STAGES - 1;
    for (int c = c0; c < c1; ++c) {
        // The scales loaded with the chunk issued last go into its slot before the barrier, which
        // then orders them before every warp's reads (with two slots that chunk is c itself).
        // The slot's last chunk was multiplied before the previous iteration's barrier.
        qm_put<BITS, MT, SPLIT>(put, ps, pb);
        cp_async_wait<QM_STAGES - 2>();  // chunk c's copies (this thread's) have landed
        __syncthreads();                 // everyone's have, and everyone is done with chunk c - 1
        if (c + QM_STAGES - 1 < c1) loader.issue(next, c + QM_STAGES - 1, ps, pb);
        cp_async_commit();
        const unsigned char* ws = qm_smem + slot * QM_SLOT(BITS, MT, SPLIT);
        const unsigned char* xs = ws + QM_ROWS * QM_WROW(BITS);
        const float* sb = (const float*)(xs + QM_XROWS(MT, SPLIT) * QM_XROW(SPLIT));
        u32 w[QM_NT][BITS];
#pragma unroll
        for (int j = 0; j < QM_NT; ++j) qm_read_w<BITS>(ws, wr + 8 * j + g, t, lg, w[j]);
        // One group's sums (factored form): part = sum x q per output, xsum = sum x per input row
        // (its four registers are those of the output registers' rows). DEQ: the scale and bias
        // of the lane's weight row in each tile, as bf16 pairs.
        float part[DEQ ? 1 : MT][QM_NT][4], xsum[DEQ ? 1 : MT][4];
        u32 sc2[QM_NT], bi2[QM_NT];
        float scf[QM_NT], bif[QM_NT];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if ((i & (per - 1)) == 0) {
                if constexpr (DEQ) {
                    const int gb = i >> (lg - 5);
#pragma unroll
                    for (int j = 0; j < QM_NT; ++j) {
                        const float2 v = *(const float2*)(sb + (wr + 8 * j + g) * 8 + 2 * gb);
                        if constexpr (SF32) {
                            scf[j] = v.x;
                            bif[j] = v.y;
                        } else {
                            sc2[j] = bf16x2_rn(v.x, v.x);
                            bi2[j] = bf16x2_rn(v.y, v.y);
                        }
                    }
                } else {
#pragma unroll
                    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            xsum[mi][e] = 0.0f;
#pragma unroll
                            for (int j = 0; j < QM_NT; ++j) part[mi][j][e] = 0.0f;
                        }
                }
            }
            u32 b[QM_NT][2][2];
#pragma unroll
            for (int j = 0; j < QM_NT; ++j) {
                qm_b<BITS, FP4>(w[j], i, magic, b[j]);
                if constexpr (DEQ) {
#pragma unroll
                    for (int st = 0; st < 2; ++st)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            if constexpr (SF32)
                                b[j][st][e] = qm_decode_f32(b[j][st][e], scf[j], bif[j]);
                            else
                                b[j][st][e] = bf16x2_fma(b[j][st][e], sc2[j], bi2[j]);
                        }
                }
            }
            const int kp = qm_piece_k(i, t, lg);
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                u32 a[2][4], al[2][4];
                qm_read_a<SPLIT>(xs, 16 * mi + g, kp, a, al);
#pragma unroll
                for (int st = 0; st < 2; ++st) {
                    if constexpr (DEQ) {
#pragma unroll
                        for (int j = 0; j < QM_NT; ++j) mma_bf16(acc[mi][j], a[st], b[j][st]);
                    } else {
                        if constexpr (SPLIT) {
                            mma_bf16(xsum[mi], al[st], ones);
#pragma unroll
                            for (int j = 0; j < QM_NT; ++j) mma_bf16(part[mi][j], al[st], b[j][st]);
                        }
                        mma_bf16(xsum[mi], a[st], ones);
#pragma unroll
                        for (int j = 0; j < QM_NT; ++j) mma_bf16(part[mi][j], a[st], b[j][st]);
                    }
                }
            }
            // The group's last piece: its scales and biases for the output columns 2t and 2t + 1
            // of each tile (zeros past N and for a group past K, which holds only zeros).
            if constexpr (!DEQ) {
                if ((i & (per - 1)) == per - 1) {
                    const int gb = i >> (lg - 5);
#pragma unroll
                    for (int j = 0; j < QM_NT; ++j) {
                        const float2 c0v = *(const float2*)(sb + (wr + 8 * j + 2 * t) * 8 + 2 * gb);
                        const float2 c1v = *(const float2*)(sb + (wr + 8 * j + 2 * t + 1) * 8 + 2 * gb);
                        const float sc[2] = {c0v.x, c1v.x}, bi[2] = {c0v.y, c1v.y};
#pragma unroll
                        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                acc[mi][j][e] =
                                    fmaf(sc[e & 1], part[mi][j][e], fmaf(bi[e & 1], xsum[mi][e], acc[mi][j][e]));
                    }
                }
            }
        }
        slot = slot == QM_STAGES - 1 ? 0 : slot + 1;
        put = put == QM_STAGES - 1 ? 0 : put + 1;
        next = next == QM_STAGES - 1 ? 0 : next + 1;
    }
    float* dst = out + (size_t)blockIdx.y * m * n;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < QM_NT; ++j) {
            const int col = nb + wr + 8 * j + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = m0 + 16 * i + g + 8 * (e >> 1), cc = col + (e & 1);
                if (r >= m || cc >= n) continue;
                if constexpr (GATHER) {
                    const int to = rows.order[r];
                    if (to >= 0) out[(size_t)to * rows.ld + rows.col0 + cc] = acc[i][j][e];
                } else {
                    dst[(size_t)r * n + cc] = acc[i][j][e];
                }
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
    if (blockIdx.z == 0 && r < n && c0 < c1) {
        const size_t row_words = (size_t)k * BITS / 32, w0 = (size_t)c0 * QM_CHUNK * BITS / 32;
        size_t w1 = (size_t)c1 * QM_CHUNK * BITS / 32;
        if (w1 > row_words) w1 = row_words;
        l2_prefetch(packed + (size_t)r * row_words + w0, (w1 - w0) * 4);
    }
}

#define QM_PARAMS                                                                                                \
    float *out, const void *x, int m, int n, const u32 *packed, const void *scales, const void *biases, int p_dt, \
        int lg, int k, int cps
#define QM_PLAIN blockIdx.x, blockIdx.z, QmRows{nullptr, 1, 0, 0}
#define QM_BF16(BITS, MT) \
    qmma_body<BITS, MT, false, false>(out, x, m, n, packed, scales, biases, p_dt, lg, k, cps, QM_PLAIN)
// The same body twice, the group size of 64 values (mlx's default) known when compiling: its
// addresses then fold into constants, about a third of the loop's instructions. Other sizes
// take the general body.
#define QM_LG64(BODY, ...)                                                                                    \
    if (lg == 6)                                                                                              \
        BODY<__VA_ARGS__, 6>(out, x, m, n, packed, scales, biases, p_dt, lg, k, cps, QM_PLAIN);               \
    else                                                                                                      \
        BODY<__VA_ARGS__, 0>(out, x, m, n, packed, scales, biases, p_dt, lg, k, cps, QM_PLAIN)
#define QM_BEGIN(BITS)                          \
    qm_prefetch<BITS>(packed, n, k, cps); \
    pdl_begin()
#define QM_F32(BITS) qmma_body<BITS, 1, true, false>(out, x, m, n, packed, scales, biases, p_dt, lg, k, cps, QM_PLAIN)
#define QM_DEQ(BITS, MT) QM_LG64(qmma_body, BITS, MT, false, true, false, false)
// The same with the scales as stored (SF32).
#define QM_DEQS(BITS, MT)                                                                                      \
    if (lg == 6)                                                                                               \
        qmma_body<BITS, MT, false, true, false, false, 6, true>(out, x, m, n, packed, scales, biases, p_dt, lg, k, \
                                                                cps, QM_PLAIN);                                \
    else                                                                                                       \
        qmma_body<BITS, MT, false, true, false, false, 0, true>(out, x, m, n, packed, scales, biases, p_dt, lg, k, \
                                                                cps, QM_PLAIN)

// Resident blocks per multiprocessor asked of ptxas for the 8- and 16-row kernels (a register
// cap: 65536 / (128 x QM_MIN_BLOCKS)); an experiment knob (NUVEC_NVRTC_DEFINES), 1 = no cap.
#ifndef QM_MIN_BLOCKS
#define QM_MIN_BLOCKS 1
#endif
extern "C" __global__ void __launch_bounds__(128, QM_MIN_BLOCKS) qmma_b4_m16(QM_PARAMS) { QM_BEGIN(4); QM_BF16(4, 1); }
extern "C" __global__ void __launch_bounds__(128) qmma_b4_m32(QM_PARAMS) {
    QM_BEGIN(4);
    QM_LG64(qmma_body, 4, 2, false, false, false, false);
}
extern "C" __global__ void __launch_bounds__(128, QM_MIN_BLOCKS) qmma_b8_m16(QM_PARAMS) { QM_BEGIN(8); QM_BF16(8, 1); }
extern "C" __global__ void __launch_bounds__(128) qmma_b8_m32(QM_PARAMS) { QM_BEGIN(8); QM_BF16(8, 2); }
extern "C" __global__ void __launch_bounds__(128, QM_MIN_BLOCKS) qmma_b4_f32(QM_PARAMS) { QM_BEGIN(4); QM_F32(4); }
extern "C" __global__ void __launch_bounds__(128, QM_MIN_BLOCKS) qmma_b8_f32(QM_PARAMS) { QM_BEGIN(8); QM_F32(8); }
// The same for the kernels decoding weights to bf16 (an experiment knob as QM_MIN_BLOCKS).
#ifndef QM_DEQ_MIN_BLOCKS
#define QM_DEQ_MIN_BLOCKS 1
#endif
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b4_d16(QM_PARAMS) { QM_BEGIN(4); QM_DEQ(4, 1); }
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b4_d32(QM_PARAMS) { QM_BEGIN(4); QM_DEQ(4, 2); }
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b4_d64(QM_PARAMS) { QM_BEGIN(4); QM_DEQ(4, 4); }
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b8_d64(QM_PARAMS) { QM_BEGIN(8); QM_DEQ(8, 4); }
// Scales and biases that are not bf16 (f32, f16), each weight decoded in f32 (qm_decode_f32).
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b4_d16s(QM_PARAMS) { QM_BEGIN(4); QM_DEQS(4, 1); }
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b4_d32s(QM_PARAMS) { QM_BEGIN(4); QM_DEQS(4, 2); }
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b4_d64s(QM_PARAMS) { QM_BEGIN(4); QM_DEQS(4, 4); }
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b8_d64s(QM_PARAMS) { QM_BEGIN(8); QM_DEQS(8, 4); }

// Grouped products of a mixture-of-experts layer, each expert's weights decoded as the d64
// kernels do: block (x, 0, z) takes tile z of `order` (64 slots routed to expert tile_expert[z],
// as moe.cu's moe_align laid them out; -1: an unused tile) against column block x of that
// expert's projection `proj`, found in the layer's expert index (moe.cu's layout, QM_MOE_SLOTS
// u64 per projection and expert: packed codes, bf16 scales, bf16 biases, ...; mxfp4: codes and
// e8m0 scales). With `pair`,
// the blocks past the projection's take projection proj + 1 into columns n.. (gate and up in
// one launch: out [slots, 2n]). x row of slot s: s / div (the token for gate and up, whose
// slots are (token, choice) pairs; the slot itself for down). All of K in one range, so a slot's
// result depends on its own row only, wherever the tile places it.
#define QM_MOE_SLOTS 6
template <int BITS, bool FP4 = false, bool SF32 = false>
__device__ __forceinline__ void qmma_grouped(float* out, const void* x, const int* order, const int* tile_expert,
                                             const u64* index, int experts, int proj, int pair, int div, int n, int k,
                                             int lg, int p_dt = DT_BF16) {
    const int e = tile_expert[blockIdx.z];
    if (e < 0) return;
    const int blocks = (n + QM_ROWS - 1) / QM_ROWS;
    int bx = blockIdx.x, p = proj, col0 = 0;
    if (pair && bx >= blocks) bx -= blocks, p += 1, col0 = n;
    const u64* ent = index + ((size_t)p * experts + e) * QM_MOE_SLOTS;
    const QmRows rows{order, div, pair ? 2 * n : n, col0};
    const int chunks = (k + QM_CHUNK - 1) / QM_CHUNK;
    // mxfp4's groups are always 32 values; affine ones of 64 (mlx's default) take a body compiled
    // for that size, as the plain kernels do (QM_LG64).
#define QMG_BODY(LG)                                                                                                   \
    qmma_body<BITS, 4, false, true, true, FP4, LG, SF32>(out, x, (int)gridDim.z * 64, n, (const u32*)ent[0],          \
                                                         (const void*)ent[1], (const void*)ent[2], p_dt, lg, k, chunks, \
                                                         bx, blockIdx.z, rows)
    if constexpr (FP4)
        QMG_BODY(5);
    else if (lg == 6)
        QMG_BODY(6);
    else
        QMG_BODY(0);
#undef QMG_BODY
}
#define QMG_PARAMS                                                                                                  \
    float *out, const void *x, const int *order, const int *tile_expert, const u64 *index, int experts, int proj, \
        int pair, int div, int n, int k, int lg
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b4_g64(QMG_PARAMS) {
    pdl_begin();
    qmma_grouped<4>(out, x, order, tile_expert, index, experts, proj, pair, div, n, k, lg);
}
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b8_g64(QMG_PARAMS) {
    pdl_begin();
    qmma_grouped<8>(out, x, order, tile_expert, index, experts, proj, pair, div, n, k, lg);
}
// Scales and biases of dtype p_dt that are not bf16 (a GGUF's f32 or f16 ones), each weight
// decoded in f32 (qm_decode_f32).
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b4_g64s(QMG_PARAMS, int p_dt) {
    pdl_begin();
    qmma_grouped<4, false, true>(out, x, order, tile_expert, index, experts, proj, pair, div, n, k, lg, p_dt);
}
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_b8_g64s(QMG_PARAMS, int p_dt) {
    pdl_begin();
    qmma_grouped<8, false, true>(out, x, order, tile_expert, index, experts, proj, pair, div, n, k, lg, p_dt);
}
// mxfp4 experts (e2m1 codes in groups of 32 under an e8m0 scale; lg = 5): each weight decoded
// exactly (a code's value times a power of two).
extern "C" __global__ void __launch_bounds__(128, QM_DEQ_MIN_BLOCKS) qmma_fp4_g64(QMG_PARAMS) {
    pdl_begin();
    qmma_grouped<4, true>(out, x, order, tile_expert, index, experts, proj, pair, div, n, k, lg);
}

// out [mn] = the sum of `splits` partial slices of `part` ([splits, mn]), in slice order.
extern "C" __global__ void qmma_reduce(float* out, const float* part, int splits, size_t mn) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < mn; i += (size_t)gridDim.x * blockDim.x) {
        float s = part[i];
        for (int p = 1; p < splits; ++p) s += part[(size_t)p * mn + i];
        out[i] = s;
    }
}
