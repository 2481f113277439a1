// Phase 4 (issue 7): prefill on the tensor cores in bf16. The weight products and attention of
// long chunks run as cuBLAS GEMMs with bf16 inputs and f32 accumulation and outputs; these kernels
// make their bf16 operands: activations converted once per call, weight tiles decoded straight to
// bf16 (from MLX affine-quantized rows, or dense f32/f16), probabilities written by the softmax.
// bf16 values are u16 bit patterns (no cuda_bf16.h under NVRTC); every conversion rounds to
// nearest, ties to even, as the host's `half::bf16::from_f32` does.

// Two values as bf16 in software (bf16_rn, common.cuh: NaN payloads kept), lo in the low half.
__device__ __forceinline__ u32 pf_bf16x2(float lo, float hi) { return bf16_rn(lo) | (bf16_rn(hi) << 16); }

// out [B, A, C] bf16 = src[a * sa + b * sb + c] (element strides) for a < A, b < B, c < C; src is
// f32, f16 or bf16 (`dt`). For attention the queries [L, Hkv, group * D] become
// [Hkv, L, group * D] (the heads of one KV group side by side) and the first kv_len rows of each
// KV head of the cache [Hkv, cap, D] become [Hkv, kv_len, D]. Index math in 32 bits where it fits.
// Four values (16-byte loads, an 8-byte store) per thread when src is f32, C, both strides and
// src are multiples of 4 values (16 bytes) and out is 8-byte aligned (the cache's K and V).
extern "C" __global__ void gather3_bf16(u16* out, const void* src, int dt, long long a_n, long long b_n, long long c_n,
                                        long long sa, long long sb, size_t total) {
    pdl_begin();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if (dt == DT_F32 && ((c_n | sa | sb) & 3) == 0 && ((size_t)src & 15) == 0 && ((size_t)out & 7) == 0) {
        const size_t quads = total / 4, cq = (size_t)c_n / 4;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < quads; i += stride) {
            const size_t c = i % cq, r = i / cq, a = r % (size_t)a_n, b = r / (size_t)a_n;
            const float4 v = *(const float4*)((const float*)src + a * (size_t)sa + b * (size_t)sb + 4 * c);
            ((uint2*)out)[i] = make_uint2(pf_bf16x2(v.x, v.y), pf_bf16x2(v.z, v.w));
        }
        return;
    }
    if (total <= 0xffffffffull) {
        const u32 an = (u32)a_n, cn = (u32)c_n;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += stride) {
            u32 ii = (u32)i, c = ii % cn, r = ii / cn, a = r % an, b = r / an;
            out[i] = (u16)bf16_rn(load_float(src, a * (size_t)sa + b * (size_t)sb + c, dt));
        }
        return;
    }
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += stride) {
        size_t c = i % (size_t)c_n;
        size_t r = i / (size_t)c_n;
        size_t a = r % (size_t)a_n;
        size_t b = r / (size_t)a_n;
        out[i] = (u16)bf16_rn(load_float(src, a * (size_t)sa + b * (size_t)sb + c, dt));
    }
}

// out [n] bf16 = src [n] (f32, f16 or bf16 `dt`): activations and dense weight tiles. Pairs of
// values per thread, written as one u32 (`out` 4-byte aligned: the host passes buffer starts).
// f32 sources 16-byte aligned with out 8-byte aligned take four values per thread (16-byte loads,
// an 8-byte store; the host then launches a thread per four), the rest a pair.
extern "C" __global__ void convert_bf16(u16* out, const void* src, int dt, size_t n) {
    pdl_begin();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if (dt == DT_F32 && ((size_t)src & 15) == 0 && ((size_t)out & 7) == 0) {
        const size_t quads = n / 4;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < quads; i += stride) {
            const float4 v = ((const float4*)src)[i];
            ((uint2*)out)[i] = make_uint2(pf_bf16x2(v.x, v.y), pf_bf16x2(v.z, v.w));
        }
        if (blockIdx.x == 0 && threadIdx.x < (n & 3))
            out[4 * quads + threadIdx.x] = (u16)bf16_rn(((const float*)src)[4 * quads + threadIdx.x]);
        return;
    }
    const size_t pairs = n / 2;
    u32* out2 = (u32*)out;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < pairs; i += stride)
        out2[i] = pf_bf16x2(load_float(src, 2 * i, dt), load_float(src, 2 * i + 1, dt));
    if ((n & 1) && blockIdx.x == 0 && threadIdx.x == 0) out[n - 1] = (u16)bf16_rn(load_float(src, n - 1, dt));
}

// out [n] bf16 = silu(g) * u, computed in f32 as silu_mul_f32 computes it (g / (1 + exp(-g)) * u),
// then rounded: the input of a down projection, made in one pass. Four values per thread
// (16-byte loads, an 8-byte store) where n is a multiple of 4 and the arrays are aligned for
// that (the host passes buffer starts), one otherwise.
__device__ __forceinline__ float pf_silu_mul(float x, float y) { return x / (1.0f + expf(-x)) * y; }
extern "C" __global__ void silu_mul_bf16(u16* out, const float* g, const float* u, size_t n) {
    pdl_begin();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const bool vec = (n & 3) == 0 && (((size_t)out & 7) | ((size_t)g & 15) | ((size_t)u & 15)) == 0;
    if (vec) {
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n / 4; i += stride) {
            const float4 a = ((const float4*)g)[i], b = ((const float4*)u)[i];
            ((uint2*)out)[i] = make_uint2(pf_bf16x2(pf_silu_mul(a.x, b.x), pf_silu_mul(a.y, b.y)),
                                          pf_bf16x2(pf_silu_mul(a.z, b.z), pf_silu_mul(a.w, b.w)));
        }
        return;
    }
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = (u16)bf16_rn(pf_silu_mul(g[i], u[i]));
}

// Value i of a chunk (LSB-first bit stream; i is a constant once unrolled).
template <int BITS>
__device__ __forceinline__ float pf_value(const u32 (&w)[BITS], int i) {
    const int bit = i * BITS, word = bit >> 5, sh = bit & 31;
    u32 v = sh + BITS <= 32 ? w[word] >> sh : __funnelshift_r(w[word], w[word + 1], sh);
    return (float)(v & ((1u << BITS) - 1u));
}

// out [rows, K] bf16 = rows row0.. of an affine-quantized W (K a multiple of 32, groups of 1 << lg
// values, lg >= 4), each value fmaf(scale, q, bias) in f32, then rounded to bf16. One thread per
// 32-value chunk: BITS words in, 64 bytes out in four 16-byte stores.
template <int BITS>
__device__ __forceinline__ void qdequant_bf16_body(u16* out, long long row0, long long rows, const u32* packed,
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
        u32 o[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            float sc = j < 8 ? s0 : s1, bi = j < 8 ? b0 : b1;
            o[j] = pf_bf16x2(fmaf(sc, pf_value<BITS>(w, 2 * j), bi), fmaf(sc, pf_value<BITS>(w, 2 * j + 1), bi));
        }
        uint4* dst = (uint4*)(out + r * (size_t)k + (c << 5));
#pragma unroll
        for (int v = 0; v < 4; ++v) dst[v] = make_uint4(o[4 * v], o[4 * v + 1], o[4 * v + 2], o[4 * v + 3]);
    }
}

#define QDB_PARAMS \
    u16 *out, long long row0, long long rows, const u32 *packed, const void *scales, const void *biases, int p_dt, \
        int lg, int k
#define QDB_ARGS out, row0, rows, packed, scales, biases, p_dt, lg, k
extern "C" __global__ void qdequant_bf16_b2(QDB_PARAMS) { pdl_begin(); qdequant_bf16_body<2>(QDB_ARGS); }
extern "C" __global__ void qdequant_bf16_b3(QDB_PARAMS) { pdl_begin(); qdequant_bf16_body<3>(QDB_ARGS); }
// 4 bits, the common width, laid out for bandwidth (the chunk-per-thread body above reached
// ~1.7 TB/s on the H200, a third of an 8B's 512-token prefill): one thread per packed word
// (8 values, always in one group, groups being >= 16), QDB4_WORDS words per thread a block width
// apart, so that a warp's 4-byte loads and 16-byte stores are contiguous and a thread's loads are
// in flight together. Grid: x over a row's words (QDB4_WORDS * blockDim.x per block), y over the
// rows (strided past 65535). The values become floats by q4_values (no integer conversion), then
// fmaf(scale, q, bias) as for the other widths.
#define QDB4_WORDS 4
extern "C" __global__ void qdequant_bf16_b4(QDB_PARAMS) {
    pdl_begin();
    const u32 wpr = (u32)k >> 3;  // words per row
    const size_t gpr = (size_t)(k >> lg);
    const u32 j0 = blockIdx.x * blockDim.x * QDB4_WORDS + threadIdx.x;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const size_t row = (size_t)(row0 + r);
        const u32* src = packed + row * wpr;
        u16* dst = out + (size_t)r * k;
        u32 w[QDB4_WORDS];
#pragma unroll
        for (int i = 0; i < QDB4_WORDS; ++i) {
            const u32 j = j0 + i * blockDim.x;
            w[i] = j < wpr ? __ldg(src + j) : 0u;
        }
#pragma unroll
        for (int i = 0; i < QDB4_WORDS; ++i) {
            const u32 j = j0 + i * blockDim.x;
            if (j >= wpr) break;
            const size_t g = row * gpr + (((size_t)j << 3) >> lg);
            const float sc = load_float(scales, g, p_dt), bi = load_float(biases, g, p_dt);
            float q[8];
            q4_values(w[i], q);
            u32 o[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) o[e] = bf16x2_rn(fmaf(sc, q[2 * e], bi), fmaf(sc, q[2 * e + 1], bi));
            *(uint4*)(dst + (size_t)j * 8) = make_uint4(o[0], o[1], o[2], o[3]);
        }
    }
}
extern "C" __global__ void qdequant_bf16_b5(QDB_PARAMS) { pdl_begin(); qdequant_bf16_body<5>(QDB_ARGS); }
extern "C" __global__ void qdequant_bf16_b6(QDB_PARAMS) { pdl_begin(); qdequant_bf16_body<6>(QDB_ARGS); }
extern "C" __global__ void qdequant_bf16_b8(QDB_PARAMS) { pdl_begin(); qdequant_bf16_body<8>(QDB_ARGS); }

// The same for any affine case the chunked kernel does not take (K not a multiple of 32, words not
// aligned for its wide loads): one thread per value, read through the bit stream.
extern "C" __global__ void qdequant_bf16_any(u16* out, long long row0, size_t total, const u32* packed,
                                             const void* scales, const void* biases, int p_dt, int bits, int group,
                                             int k) {
    pdl_begin();
    const size_t words = (size_t)k * bits / 32;
    const size_t gpr = (size_t)(k / group);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t row = (size_t)row0 + i / k;
        int c = (int)(i % k);
        float q = (float)unpack(packed + row * words, (size_t)c, bits);
        size_t g = row * gpr + c / group;
        out[i] = (u16)bf16_rn(fmaf(load_float(scales, g, p_dt), q, load_float(biases, g, p_dt)));
    }
}

// The causal softmax of the bf16 attention path. `scores` [Hkv, rows, ld] f32 (the first n of
// each row's ld entries used) holds Q K^T * scale for the query heads of each KV group side by
// side: row r is query `first + r / group` (head `r % group` of its group), which sees keys
// 0..=first + r / group. Writes the normalized probabilities to `probs` (same layout, bf16; 0 past
// the causal limit, up to n). One block of SMX_THREADS per (row, KV head). Rows of up to
// SMX_THREADS * SMX_PER keys stay in registers (one read of the scores, one write of the
// probabilities); longer ones use `scores` as scratch for the exponentials.
#define SMX_THREADS 256
#define SMX_PER 16

extern "C" __global__ void __launch_bounds__(SMX_THREADS) causal_softmax_bf16(u16* probs, float* scores, int rows,
                                                                              int n, int ld, long long first,
                                                                              int group) {
    pdl_begin();
    __shared__ float scratch[33];
    const int r = blockIdx.x, h = blockIdx.y;
    const size_t off = ((size_t)h * rows + r) * ld;
    float* row = scores + off;
    u16* out = probs + off;
    const int valid = (int)min((long long)n, first + r / group + 1);
    if (n <= SMX_THREADS * SMX_PER) {
        float e[SMX_PER];
        float m = NEG_INF;
#pragma unroll
        for (int i = 0; i < SMX_PER; ++i) {
            int j = threadIdx.x + i * SMX_THREADS;
            e[i] = j < valid ? row[j] : NEG_INF;
            m = fmaxf(m, e[i]);
        }
        m = block_max(m, scratch);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < SMX_PER; ++i) {
            int j = threadIdx.x + i * SMX_THREADS;
            e[i] = j < valid ? expf(e[i] - m) : 0.0f;
            sum += e[i];
        }
        sum = block_sum(sum, scratch);
        float inv = 1.0f / sum;
#pragma unroll
        for (int i = 0; i < SMX_PER; ++i) {
            int j = threadIdx.x + i * SMX_THREADS;
            if (j < n) out[j] = (u16)bf16_rn(e[i] * inv);  // 0 past the causal limit
        }
        return;
    }
    float m = NEG_INF;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m, scratch);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) {
        float e = expf(row[j] - m);
        row[j] = e;
        sum += e;
    }
    sum = block_sum(sum, scratch);
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < n; j += blockDim.x) out[j] = j < valid ? (u16)bf16_rn(row[j] * inv) : (u16)0;
}
