// The one-row 4-bit GEMV loop of kernels/linear.cu (qgemv4w_acc: a block of WARPS warps computes
// ROWS rows, lanes stride the 32-value chunks) timed with three ways of turning a 4-bit value into
// a float (the CUDA journal, `git show 83079a1:docs/cuda.md`, sixth session), at the shapes of
// the Llama-3.1-8B and Qwen3-0.6B decode step (affine 4-bit, group 64, bf16 scales and biases,
// f32 x and output):
//   DEC 0  2^23 + q, then minus 2^23 (what linear.cu does): byte_perm + FADD + FFMA per value;
//   DEC 1  1 + q/16 (q placed in the mantissa's top 4 bits): byte_perm + FFMA per value, and
//          sum(q x) = 16 (sum(f x) - sum(x)) per group;
//   DEC 2  2 + q/64 (no shift for the low nibbles): sum(q x) = 64 (sum(f x) - 2 sum(x)).
//   DEC 3  1 + q/16 as DEC 1, made as f16 pairs (one shift and one lop3 per two values) and
//          widened by cvt.f32.f16 (HADD2.F32, an FMA-pipe instruction) instead of one byte_perm
//          (an ALU-pipe instruction) per value: the same floats, so the same sums bit for bit.
// PF 1 also loads the lane's next chunk before multiplying the current one. Each shape's weight
// is copied until the copies fill >= 600 MB and the calls rotate through them (no L2 help); every
// variant is checked against a scalar kernel. Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 bench/cuda/gemv_decode_probe.cu -o /tmp/p && /tmp/p
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// The kernels' shared helpers (u32, u16, warp_sum, pdl_begin, and_or, f16_to_f32) and
// the GEMV kernels' row reduction (linear.cu, whose kernels compile along).
#include "../../crates/nuvec/src/backends/cuda/kernels/common.cuh"
#include "../../crates/nuvec/src/backends/cuda/kernels/linear.cu"
#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e = (x);                                                                      \
        if (e != cudaSuccess) {                                                                   \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));                      \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)


__global__ void ref_gemv(float* out, const float* x, const u32* packed, const u16* sc, const u16* bi, int n, int k,
                         int lg) {
    int r = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= n) return;
    size_t words = (size_t)k / 8;
    double acc = 0;
    for (int c = lane; c < k; c += 32) {
        u32 q = (packed[r * words + (c >> 3)] >> (4 * (c & 7))) & 15u;
        size_t g = (size_t)r * (k >> lg) + (c >> lg);
        acc += ((double)bf16_to_f32(sc[g]) * q + bf16_to_f32(bi[g])) * x[c];
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) out[r] = (float)acc;
}

// The 8 values of a word in order as floats: DEC 0 the values, DEC 1 1 + q/16, DEC 2 2 + q/64.
template <int DEC>
__device__ __forceinline__ void dec(u32 w, float (&q)[8]) {
    if (DEC == 3) {
        const u32 one = 0x3C003C00u;
        const u32 p0 = and_or<0x03C003C0u>(w << 6, one), p1 = and_or<0x03C003C0u>(w << 2, one),
                  p2 = and_or<0x03C003C0u>(w >> 2, one), p3 = and_or<0x03C003C0u>(w >> 6, one);
        const u32 p[4] = {p0, p1, p2, p3};
        for (int v = 0; v < 4; ++v) {
            q[v] = f16_to_f32((u16)(p[v] & 0xFFFFu));
            q[v + 4] = f16_to_f32((u16)(p[v] >> 16));
        }
    } else if (DEC == 0) {
        u32 lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            q[2 * b] = __uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7540 | b)) - 8388608.0f;
            q[2 * b + 1] = __uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7540 | b)) - 8388608.0f;
        }
    } else if (DEC == 1) {
        // byte = 1qqqq000: bit 7 is the exponent's low bit of 1.0 (0x3F800000), q the top mantissa bits
        u32 lo = ((w << 3) & 0x78787878u) | 0x80808080u, hi = ((w >> 1) & 0x78787878u) | 0x80808080u;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            q[2 * b] = __uint_as_float(__byte_perm(lo, 0x3F000000u, 0x7054 | (b << 8)));
            q[2 * b + 1] = __uint_as_float(__byte_perm(hi, 0x3F000000u, 0x7054 | (b << 8)));
        }
    } else {
        u32 lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            q[2 * b] = __uint_as_float(__byte_perm(lo, 0x40000000u, 0x7054 | (b << 8)));
            q[2 * b + 1] = __uint_as_float(__byte_perm(hi, 0x40000000u, 0x7054 | (b << 8)));
        }
    }
}

template <int ROWS>
__device__ __forceinline__ void load_rows(uint4 (&w)[ROWS], float (&s)[ROWS], float (&b)[ROWS],
                                          const u32* __restrict__ packed, const u16* __restrict__ sc,
                                          const u16* __restrict__ bi, int r0, int n, int c, size_t words, size_t gpr,
                                          int lg) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const size_t row = (size_t)min(r0 + r, n - 1);
        w[r] = __ldg((const uint4*)(packed + row * words + (size_t)c * 4));
        const size_t g = row * gpr + (((size_t)c << 5) >> lg);
        s[r] = bf16_to_f32(__ldg(sc + g));
        b[r] = bf16_to_f32(__ldg(bi + g));
    }
}

// The 32 x values at p and their sum.
__device__ __forceinline__ float load_x32(float (&xv)[32], const float* __restrict__ p) {
    const float4* xp = (const float4*)p;
#pragma unroll
    for (int v = 0; v < 8; ++v) {
        float4 t = __ldg(xp + v);
        xv[4 * v] = t.x; xv[4 * v + 1] = t.y; xv[4 * v + 2] = t.z; xv[4 * v + 3] = t.w;
    }
    float xs = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) xs += xv[j];
    return xs;
}

template <int ROWS, int DEC>
__device__ __forceinline__ void mul_chunk(float (&acc)[ROWS], const uint4 (&w)[ROWS], const float (&s)[ROWS],
                                          const float (&b)[ROWS], const float* __restrict__ x, int c) {
    float xv[32];
    const float xs = load_x32(xv, x + ((size_t)c << 5));
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const u32 ww[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
        float d = 0.0f;
        if (DEC == 9) {  // loads only: what the memory system gives this launch shape
            d = __uint_as_float((ww[0] ^ ww[1] ^ ww[2] ^ ww[3]) & 0x3FFFFFFFu);
            acc[r] += s[r] * d + b[r];
            continue;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float q[8];
            dec<DEC == 8 ? 1 : DEC>(ww[j], q);
            if (DEC == 8) {  // decoded, no multiplies
#pragma unroll
                for (int t = 0; t < 8; ++t) d += q[t];
                continue;
            }
#pragma unroll
            for (int t = 0; t < 8; ++t) d = fmaf(q[t], xv[8 * j + t], d);
        }
        if (DEC == 0) acc[r] += s[r] * d + b[r] * xs;
        else if (DEC == 1 || DEC == 3) acc[r] += (16.0f * s[r]) * d + (b[r] - 16.0f * s[r]) * xs;
        else acc[r] += (64.0f * s[r]) * d + (b[r] - 128.0f * s[r]) * xs;
    }
}

// Before waiting on the kernel before it (programmatic dependent launch), PRE 1 asks L2 for the
// block's rows with one bulk prefetch per row (and its scales and biases), PRE 2 with one
// prefetch.global.L2 per 128-byte line spread over the block's lanes. Weights are never written
// by an earlier kernel of a step, and L2 is where all writes land, so this cannot read stale data.
template <int ROWS, int PRE>
__device__ __forceinline__ void prefetch_rows(const u32* packed, const u16* sc, const u16* bi, int r0, int n,
                                              size_t words, size_t gpr) {
    if (PRE == 1) {
        if (threadIdx.x < ROWS) {
            const size_t row = (size_t)min(r0 + (int)threadIdx.x, n - 1);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(packed + row * words), "r"((u32)(words * 4))
                         : "memory");
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(sc + row * gpr), "r"((u32)(gpr * 2))
                         : "memory");
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(bi + row * gpr), "r"((u32)(gpr * 2))
                         : "memory");
        }
    } else if (PRE == 2) {
        const size_t lines = words * 4 / 128;
        for (size_t i = threadIdx.x; i < ROWS * lines; i += blockDim.x) {
            const size_t row = (size_t)min(r0 + (int)(i / lines), n - 1);
            asm volatile("prefetch.global.L2 [%0];" ::"l"((const char*)(packed + row * words) + (i % lines) * 128));
        }
    }
}


// The block's row sums (linear.cu's reduction): rows < n written.
template <int ROWS, int WARPS>
__device__ __forceinline__ void store_rows(float* out, const float (&acc)[ROWS], int r0, int n) {
    __shared__ float red[WARPS][ROWS];
    qg4_store_rows<ROWS, WARPS>(out, acc, red, r0, n);
}

template <int ROWS, int WARPS, int DEC, int PF, int PRE = 0>
__global__ void __launch_bounds__(WARPS * 32, (PF ? (ROWS >= 8 ? 256 : 512) : ROWS >= 16 ? 256 : ROWS >= 8 ? 512 : 768) / (WARPS * 32))
    gemv4(float* out, const float* __restrict__ x, const u32* __restrict__ packed, const u16* __restrict__ sc,
          const u16* __restrict__ bi, int n, int k, int lg) {
    const int r0 = blockIdx.x * ROWS;
    const int chunks = k >> 5;
    const size_t words = (size_t)chunks * 4, gpr = (size_t)(k >> lg);
    prefetch_rows<ROWS, PRE>(packed, sc, bi, r0, n, words, gpr);
    pdl_begin();
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    if (PF == 0) {
        for (int c = threadIdx.x; c < chunks; c += 32 * WARPS) {
            uint4 w[ROWS];
            float s[ROWS], b[ROWS];
            load_rows<ROWS>(w, s, b, packed, sc, bi, r0, n, c, words, gpr, lg);
            mul_chunk<ROWS, DEC>(acc, w, s, b, x, c);
        }
    } else {
        int c = threadIdx.x;
        if (c < chunks) {
            uint4 w[ROWS];
            float s[ROWS], b[ROWS];
            load_rows<ROWS>(w, s, b, packed, sc, bi, r0, n, c, words, gpr, lg);
            for (;;) {
                const int cn = c + 32 * WARPS;
                if (cn >= chunks) {
                    mul_chunk<ROWS, DEC>(acc, w, s, b, x, c);
                    break;
                }
                uint4 w2[ROWS];
                float s2[ROWS], b2[ROWS];
                load_rows<ROWS>(w2, s2, b2, packed, sc, bi, r0, n, cn, words, gpr, lg);
                mul_chunk<ROWS, DEC>(acc, w, s, b, x, c);
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    w[r] = w2[r];
                    s[r] = s2[r];
                    b[r] = b2[r];
                }
                c = cn;
            }
        }
    }
    store_rows<ROWS, WARPS>(out, acc, r0, n);
}

// ---- A GEMV whose weights stream through a per-warp cp.async ring (gemv4r): each lane keeps its
// next STAGES - 1 chunks of the warp's ROWS rows in flight in shared memory (bytes in flight
// without registers) while it multiplies the current one, and loads the next chunk's scales and
// biases into registers one chunk ahead. A lane reads back only the 16 bytes it copied itself,
// so cp.async.wait_group suffices (no barrier). Same arithmetic and order as gemv4 (the same sums
// bit for bit). MINW: the warps per SM the register cap is set for.
template <int ROWS>
__device__ __forceinline__ void load_scales(float (&s)[ROWS], float (&b)[ROWS], const u16* __restrict__ sc,
                                            const u16* __restrict__ bi, int r0, int n, int c, int chunks, size_t gpr,
                                            int lg) {
    if (c >= chunks) return;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const size_t g = (size_t)min(r0 + r, n - 1) * gpr + (((size_t)c << 5) >> lg);
        s[r] = bf16_to_f32(__ldg(sc + g));
        b[r] = bf16_to_f32(__ldg(bi + g));
    }
}

template <int ROWS, int WARPS, int STAGES, int DEC, int MINW>
__global__ void __launch_bounds__(WARPS * 32, MINW / WARPS)
    gemv4r(float* out, const float* __restrict__ x, const u32* __restrict__ packed, const u16* __restrict__ sc,
           const u16* __restrict__ bi, int n, int k, int lg) {
    static_assert(STAGES >= 2, "one chunk in flight at least");
    extern __shared__ __align__(16) unsigned char ring_raw[];
    const int r0 = blockIdx.x * ROWS;
    const int chunks = k >> 5, step = 32 * WARPS;
    const size_t words = (size_t)chunks * 4, gpr = (size_t)(k >> lg);
    // This lane's slot of (stage, row) is mine[(stage * ROWS + row) * 32].
    uint4* mine = (uint4*)ring_raw + (size_t)(threadIdx.x >> 5) * STAGES * ROWS * 32 + (threadIdx.x & 31);
    pdl_begin();
    auto issue = [&](int c, int stage) {
        if (c < chunks) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const size_t row = (size_t)min(r0 + r, n - 1);
                cp_async16(smem_addr(mine + (stage * ROWS + r) * 32), packed + row * words + (size_t)c * 4, true);
            }
        }
        cp_async_commit();  // an empty group past the end keeps the wait counts uniform
    };
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    int c = threadIdx.x;
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) issue(c + st * step, st);
    float s[ROWS], b[ROWS];
    load_scales<ROWS>(s, b, sc, bi, r0, n, c, chunks, gpr, lg);
    for (int i = 0; c < chunks; ++i, c += step) {
        cp_async_wait<STAGES - 2>();  // chunk c's group, the oldest in flight, has landed
        const int stage = i % STAGES;
        uint4 w[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) w[r] = mine[(stage * ROWS + r) * 32];
        issue(c + (STAGES - 1) * step, (i + STAGES - 1) % STAGES);  // the stage read one chunk ago
        float sn[ROWS], bn[ROWS];
        load_scales<ROWS>(sn, bn, sc, bi, r0, n, c + step, chunks, gpr, lg);
        mul_chunk<ROWS, DEC>(acc, w, s, b, x, c);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            s[r] = sn[r];
            b[r] = bn[r];
        }
    }
    cp_async_wait<0>();
    store_rows<ROWS, WARPS>(out, acc, r0, n);
}

// ---- Integer dot products (gemv4i): linear.cu's loop (qgemv4i_acc) over x's parts as linear.cu's
// xsplit_f32 writes them (the layout and rounding are described there), with this file's loads.
__device__ const u32* g_xparts;

template <int ROWS, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, (ROWS >= 8 ? 512 : 768) / (WARPS * 32))
    gemv4i(float* out, const float* __restrict__ /*x: read as g_xparts*/, const u32* __restrict__ packed,
           const u16* __restrict__ sc, const u16* __restrict__ bi, int n, int k, int lg) {
    const int r0 = blockIdx.x * ROWS;
    const size_t words = (size_t)(k >> 5) * 4, gpr = (size_t)(k >> lg);
    pdl_begin();
    auto load = [&](uint4 (&w)[ROWS], float (&s)[ROWS][1], float (&b)[ROWS][1], int c) {
        float s1[ROWS], b1[ROWS];
        load_rows<ROWS>(w, s1, b1, packed, sc, bi, r0, n, c, words, gpr, lg);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) s[r][0] = s1[r], b[r][0] = b1[r];
    };
    float acc[ROWS];
    qgemv4i_acc<ROWS, WARPS>(acc, g_xparts, k, load);
    store_rows<ROWS, WARPS>(out, acc, r0, n);
}

// x's parts for gemv4i (device buffers for K <= 28672, shared by the runs), made on `st`; with
// `pdl`, launched as the step's kernels are (the layer sim).
static void split_x(const float* x, int k, cudaStream_t st = 0, bool pdl = false);

// ---- TMA-fed GEMV: bulk copies (cp.async.bulk, mbarrier completion) stream each block's rows
// through a ring of STAGES shared-memory tiles of TK values, so the loads in flight do not depend
// on registers. Block = WARPS warps x RPW rows each; lane l multiplies the tile's 16-byte chunk l
// of its warp's rows (TK = 1024: 32 chunks). Warp 0's lanes r < ROWS issue row r's copies.
__device__ __forceinline__ u32 sh_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

template <int RPW, int WARPS, int STAGES, int DEC>
__global__ void __launch_bounds__(WARPS * 32) tma4(float* out, const float* __restrict__ x,
                                                   const u32* __restrict__ packed, const u16* __restrict__ sc,
                                                   const u16* __restrict__ bi, int n, int k, int lg) {
    constexpr int ROWS = RPW * WARPS, TK = 1024;
    constexpr int WB = TK / 2;  // weight bytes per row per tile
    extern __shared__ __align__(128) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * ROWS;
    const int tiles = k / TK;
    const int gpt = TK >> lg;           // groups per tile per row
    const u32 sbytes = (u32)gpt * 2u;   // scale (or bias) bytes per row per tile
    const u32 stage_bytes = ROWS * (WB + 2 * sbytes);
    unsigned long long* bars = (unsigned long long*)smem;
    unsigned char* ring = smem + 128;
    const size_t words = (size_t)k / 8, gpr = (size_t)(k >> lg);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sh_addr(bars + s)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    pdl_begin();
    auto issue = [&](int t) {  // warp 0
        const int s = t % STAGES;
        const u32 bar = sh_addr(bars + s);
        if (lane == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(stage_bytes) : "memory");
        __syncwarp();
        unsigned char* st = ring + (size_t)s * stage_bytes;
        for (int r = lane; r < ROWS; r += 32) {
            const size_t row = (size_t)min(r0 + r, n - 1);
            bulk_copy(sh_addr(st + r * WB), (const unsigned char*)(packed + row * words) + (size_t)t * WB, WB, bar);
            bulk_copy(sh_addr(st + ROWS * WB + r * sbytes), sc + row * gpr + (size_t)t * gpt, sbytes, bar);
            bulk_copy(sh_addr(st + ROWS * (WB + sbytes) + r * sbytes), bi + row * gpr + (size_t)t * gpt, sbytes, bar);
        }
    };
    if (warp == 0)
        for (int t = 0; t < STAGES && t < tiles; ++t) issue(t);
    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) acc[r] = 0.0f;
    for (int t = 0; t < tiles; ++t) {
        const int s = t % STAGES;
        float xv[32];
        const float xs = load_x32(xv, x + (size_t)t * TK + lane * 32);
        bar_wait(sh_addr(bars + s), (t / STAGES) & 1);
        const unsigned char* st = ring + (size_t)s * stage_bytes;
        const int g = (lane * 32) >> lg;
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
            const int rr = warp * RPW + r;
            const uint4 w = *(const uint4*)(st + rr * WB + lane * 16);
            const float sv = bf16_to_f32(((const u16*)(st + ROWS * WB + rr * sbytes))[g]);
            const float bv = bf16_to_f32(((const u16*)(st + ROWS * (WB + sbytes) + rr * sbytes))[g]);
            const u32 ww[4] = {w.x, w.y, w.z, w.w};
            float d = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float q[8];
                dec<DEC>(ww[j], q);
#pragma unroll
                for (int e = 0; e < 8; ++e) d = fmaf(q[e], xv[8 * j + e], d);
            }
            if (DEC == 0) acc[r] += sv * d + bv * xs;
            else if (DEC == 1) acc[r] += (16.0f * sv) * d + (bv - 16.0f * sv) * xs;
            else acc[r] += (64.0f * sv) * d + (bv - 128.0f * sv) * xs;
        }
        __syncthreads();  // every warp is done with stage s
        if (warp == 0 && t + STAGES < tiles) issue(t + STAGES);
    }
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
        float v = warp_sum(acc[r]);
        const int row = r0 + warp * RPW + r;
        if (lane == 0 && row < n) out[row] = v;
    }
}

__global__ void copy_k(float4* dst, const float4* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

// Stands in for a step's small kernels (norms, rope, cache write, attention): busy for `cycles`.
__global__ void spin(long long cycles) {
    pdl_begin();
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

typedef void (*Kern)(float*, const float*, const u32*, const u16*, const u16*, int, int, int);
struct Mat {
    u32* p;
    u16* s;
    u16* b;
};
struct V {
    const char* name;
    Kern f;
    int rows, threads, smem;
};

template <typename... A>
static void launch_pdl(void (*f)(A...), int grid, int threads, int smem, cudaStream_t st, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.stream = st;
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, f, args...));
}

static void split_x(const float* x, int k, cudaStream_t st, bool pdl) {
    static u32* parts = nullptr;
    if (!parts) {
        CK(cudaMalloc(&parts, 28672 / 32 * (QI_WORDS + 2) * 4));
        CK(cudaMemcpyToSymbol(g_xparts, &parts, sizeof(parts)));
    }
    const int grid = (k / 32 * 32 + 127) / 128;  // a warp per chunk
    if (pdl) launch_pdl(xsplit_f32, grid, 128, 0, st, parts, x, k);
    else xsplit_f32<<<grid, 128, 0, st>>>(parts, x, k);
    CK(cudaGetLastError());
}

// An 8B decode step's GEMVs (32 layers: q/k/v, o, gate+up, down; then the LM head) with spin
// kernels where the step's small kernels run, launched with programmatic dependent launch and
// captured in a CUDA graph, as the runtime runs a step. Prints ms per step.
struct Lin {
    Mat m;
    int n, k;
};
static Lin make_lin(int n, int k) {
    Lin l{{}, n, k};
    size_t words = (size_t)n * k / 8, groups = (size_t)n * (k / 64);
    CK(cudaMalloc(&l.m.p, words * 4));
    CK(cudaMalloc(&l.m.s, groups * 2));
    CK(cudaMalloc(&l.m.b, groups * 2));
    CK(cudaMemset(l.m.p, 0x35, words * 4));
    CK(cudaMemset(l.m.s, 0x3c, groups * 2));
    CK(cudaMemset(l.m.b, 0xbc, groups * 2));
    return l;
}
struct KL {
    Kern f;
    int threads, rows, smem;
};
struct Plan {
    const char* name;
    KL q, o, gu, dn, head;
    double small_us;  // spin time per layer (three spins: 20 %, 65 %, 15 %)
    bool xs = false;  // an xsplit launch before each layer GEMV (gemv4i's input parts)
};
static void layer_sim() {
    const int L = 32;
    std::vector<Lin> qkv, o, gu, dn;
    for (int l = 0; l < L; ++l) {
        qkv.push_back(make_lin(6144, 4096));
        o.push_back(make_lin(4096, 4096));
        gu.push_back(make_lin(28672, 4096));
        dn.push_back(make_lin(4096, 14336));
    }
    Lin head = make_lin(128256, 4096);
    float *x, *y;
    CK(cudaMalloc(&x, 28672 * 4 * 2));
    CK(cudaMalloc(&y, 128256 * 4));
    CK(cudaMemset(x, 0, 28672 * 8));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    split_x(x, 14336, st);  // gemv4i's parts of x (zeros), for the plans without an xsplit per GEMV
    CK(cudaStreamSynchronize(st));
    int clk_khz = 0;
    CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0));
    printf("\nlayer sim: 8B step (32 layers + head, PDL, one graph), SM clock %d MHz\n", clk_khz / 1000);
#define G(R, W, D, PRE) KL{gemv4<R, W, D, 0, PRE>, 32 * W, R, 0}
#define T(R, W, S, D) KL{tma4<R, W, S, D>, 32 * W, R * W, 128 + S * R * W * 576}
#define P(D, PRE, SMALL) \
    Plan { "dec" #D " pre" #PRE " small" #SMALL "us", G(8, 2, D, PRE), G(8, 4, D, PRE), G(8, 1, D, PRE), G(8, 4, D, PRE), G(8, 1, D, PRE), SMALL }
#define PT(R, W, S, SMALL) \
    Plan { "tma " #R "x" #W " s" #S " small" #SMALL "us", T(R, W, S, 1), T(R, W, S, 1), T(R, W, S, 1), T(R, W, S, 1), T(R, W, S, 1), SMALL }
#define PM(SMALL) \
    Plan { "tma qkv/o/down, gemv gu/head small" #SMALL "us", T(2, 4, 4, 1), T(2, 4, 4, 1), G(8, 1, 1, 0), T(4, 4, 4, 1), G(8, 1, 1, 0), SMALL }
#define GR(R, W, S, M) KL{gemv4r<R, W, S, 3, M>, 32 * W, R, W * S * R * 512}
#define GI(R, W) KL{gemv4i<R, W>, 32 * W, R, 0}
#define PI(NAME, SMALL, XS) \
    Plan { NAME " small" #SMALL "us", GI(8, 2), GI(8, 4), GI(8, 1), GI(8, 4), GI(8, 1), SMALL, XS }
#define PR(NAME, Q, O, GU, DN, HEAD, SMALL) \
    Plan { NAME " small" #SMALL "us", Q, O, GU, DN, HEAD, SMALL }
    Plan plans[] = {P(3, 0, 0), P(3, 0, 18),
                    PR("ring 4r s3", GR(4, 2, 3, 20), GR(4, 4, 3, 20), GR(4, 1, 3, 20), GR(4, 4, 3, 20), GR(4, 1, 3, 20), 0),
                    PR("ring 8r s2", GR(8, 2, 2, 16), GR(8, 4, 2, 16), GR(8, 1, 2, 16), GR(8, 4, 2, 16), GR(8, 1, 2, 16), 0),
                    PR("ring 4r s3", GR(4, 2, 3, 20), GR(4, 4, 3, 20), GR(4, 1, 3, 20), GR(4, 4, 3, 20), GR(4, 1, 3, 20), 18),
                    PR("ring 8r s2", GR(8, 2, 2, 16), GR(8, 4, 2, 16), GR(8, 1, 2, 16), GR(8, 4, 2, 16), GR(8, 1, 2, 16), 18),
                    PI("dp4a", 0, false), PI("dp4a + xsplit", 0, true), PI("dp4a", 18, false), PI("dp4a + xsplit", 18, true)};
    for (int rep = 0; rep < 2; ++rep)
        for (auto& p : plans) {
            auto run = [&](const KL& kl, const Lin& l, const float* in, float* out) {
                if (kl.smem > 48 * 1024)
                    CK(cudaFuncSetAttribute(kl.f, cudaFuncAttributeMaxDynamicSharedMemorySize, kl.smem));
                launch_pdl(kl.f, (l.n + kl.rows - 1) / kl.rows, kl.threads, kl.smem, st, out, in, (const u32*)l.m.p,
                           (const u16*)l.m.s, (const u16*)l.m.b, l.n, l.k, 6);
            };
            auto sp = [&](double us) {
                if (us > 0) launch_pdl(spin, 132, 128, 0, st, (long long)(us * clk_khz / 1000.0));
            };
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            auto xs = [&](int k) {
                if (p.xs) split_x(x, k, st, true);
            };
            for (int l = 0; l < L; ++l) {
                sp(p.small_us * 0.2);
                xs(4096);
                run(p.q, qkv[l], x, y);
                sp(p.small_us * 0.65);
                xs(4096);
                run(p.o, o[l], x, y);
                sp(p.small_us * 0.15);
                xs(4096);
                run(p.gu, gu[l], x, y);
                xs(14336);
                run(p.dn, dn[l], x, y);
            }
            run(p.head, head, x, y);
            CK(cudaStreamEndCapture(st, &g));
            cudaGraphExec_t ge;
            CK(cudaGraphInstantiate(&ge, g, 0));
            for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
            CK(cudaStreamSynchronize(st));
            std::vector<float> t;
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            for (int i = 0; i < 15; ++i) {
                cudaEventRecord(e0, st);
                CK(cudaGraphLaunch(ge, st));
                cudaEventRecord(e1, st);
                CK(cudaEventSynchronize(e1));
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                t.push_back(ms);
            }
            std::sort(t.begin(), t.end());
            printf("  %-24s median %.3f ms/step (min %.3f, max %.3f) -> %.0f steps/s\n", p.name, t[7], t[0], t[14],
                   1e3 / t[7]);
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
        }
}

#define VAR(R, W, D, P) {#R "r x" #W "w dec" #D " pf" #P, gemv4<R, W, D, P>, R, 32 * W, 0}
#define TMA(R, W, S, D) {"tma " #R "r x" #W "w s" #S " dec" #D, tma4<R, W, S, D>, R * W, 32 * W, 128 + S * R * W * (512 + 64)}
#define RING(R, W, S, M) {"ring " #R "r x" #W "w s" #S " m" #M, gemv4r<R, W, S, 3, M>, R, 32 * W, W * S * R * 512}
#define INT(R, W) {"dp4a " #R "r x" #W "w", gemv4i<R, W>, R, 32 * W, 0}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    {
        size_t n4 = (size_t)1 << 26;
        float4 *a, *b;
        CK(cudaMalloc(&a, n4 * 16));
        CK(cudaMalloc(&b, n4 * 16));
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        copy_k<<<132 * 8, 512>>>(b, a, n4);
        cudaEventRecord(e0);
        for (int i = 0; i < 10; ++i) copy_k<<<132 * 8, 512>>>(b, a, n4);
        cudaEventRecord(e1);
        CK(cudaEventSynchronize(e1));
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        printf("copy: %.2f TB/s (read+write)\n", 2.0 * n4 * 16 * 10 / (ms * 1e-3) / 1e12);
        cudaFree(a);
        cudaFree(b);
    }
    struct Shape {
        int n, k;
        const char* name;
    } shapes[] = {{6144, 4096, "8B qkv"},          {4096, 4096, "8B o"},        {28672, 4096, "8B gate+up"},
                  {4096, 14336, "8B down"},        {128256, 4096, "8B head"},   {4096, 1024, "0.6B qkv"},
                  {1024, 2048, "0.6B o"},          {6144, 1024, "0.6B gate+up"}, {1024, 3072, "0.6B down"},
                  {151936, 1024, "0.6B head"}};
    V vs[] = {VAR(8, 1, 3, 0),       VAR(8, 2, 3, 0),       VAR(8, 4, 3, 0),       VAR(8, 1, 9, 0),
              VAR(8, 4, 9, 0),       RING(8, 1, 2, 16),     RING(8, 1, 3, 16),     RING(8, 2, 2, 16),
              RING(8, 4, 2, 16),     RING(4, 1, 2, 20),     RING(4, 1, 3, 20),     RING(4, 2, 3, 20),
              RING(4, 4, 3, 20),     RING(4, 1, 4, 24),     RING(2, 1, 4, 32),     RING(2, 4, 4, 32),
              INT(8, 1),             INT(8, 2),             INT(8, 4),             INT(4, 1),
              INT(4, 4)};
    const int lg = 6;
    for (auto& sh : shapes) {
        if (argc > 1 && strcmp(argv[1], "shapes") != 0) break;  // "sim": the layer simulation only
        int n = sh.n, k = sh.k;
        size_t words = (size_t)n * k / 8, groups = (size_t)n * (k >> lg);
        size_t bytes = words * 4 + groups * 4;
        int copies = (int)std::max<size_t>(1, ((size_t)600 << 20) / bytes);
        std::vector<Mat> m(copies);
        std::vector<u32> hp(words);
        std::vector<u16> hs(groups), hb(groups);
        srand(1);
        for (auto& v : hp) v = (u32)rand() * 2654435761u ^ (u32)rand();
        for (size_t i = 0; i < groups; ++i) {
            float s = 0.01f + 0.02f * (rand() / (float)RAND_MAX), b = -8 * s;
            u32 su, bu;
            memcpy(&su, &s, 4);
            memcpy(&bu, &b, 4);
            hs[i] = su >> 16;
            hb[i] = bu >> 16;
        }
        for (auto& mm : m) {
            CK(cudaMalloc(&mm.p, words * 4));
            CK(cudaMalloc(&mm.s, groups * 2));
            CK(cudaMalloc(&mm.b, groups * 2));
            CK(cudaMemcpy(mm.p, hp.data(), words * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(mm.s, hs.data(), groups * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(mm.b, hb.data(), groups * 2, cudaMemcpyHostToDevice));
        }
        // x like a normed activation: mostly O(1), a few large
        std::vector<float> hx(k);
        for (int i = 0; i < k; ++i) hx[i] = (rand() / (float)RAND_MAX - 0.5f) * (i % 97 == 0 ? 40.0f : 2.0f);
        float *x, *out, *ref;
        CK(cudaMalloc(&x, k * 4));
        CK(cudaMalloc(&out, n * 4));
        CK(cudaMalloc(&ref, n * 4));
        CK(cudaMemcpy(x, hx.data(), k * 4, cudaMemcpyHostToDevice));
        ref_gemv<<<(n + 3) / 4, 128>>>(ref, x, m[0].p, m[0].s, m[0].b, n, k, lg);
        split_x(x, k);  // gemv4i reads x as its parts
        std::vector<float> href(n), hout(n);
        CK(cudaMemcpy(href.data(), ref, n * 4, cudaMemcpyDeviceToHost));
        double rsum = 0;
        for (int i = 0; i < n; ++i) rsum += fabs(href[i]);
        printf("\n%s %dx%d (%.1f MB, %d copies, mean|ref| %.3f)\n", sh.name, n, k, bytes / 1e6, copies, rsum / n);
        for (auto& v : vs) {
            int grid = (n + v.rows - 1) / v.rows;
            if (v.smem > 48 * 1024) CK(cudaFuncSetAttribute(v.f, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
            v.f<<<grid, v.threads, v.smem>>>(out, x, m[0].p, m[0].s, m[0].b, n, k, lg);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hout.data(), out, n * 4, cudaMemcpyDeviceToHost));
            double md = 0, mrel = 0;
            for (int i = 0; i < n; ++i) {
                double d = fabs((double)hout[i] - href[i]);
                md = std::max(md, d);
            }
            mrel = md / (rsum / n);
            float best = 1e30f;
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            for (int t = 0; t < 3; ++t) {
                int reps = std::max(30, copies * 4);
                cudaEventRecord(e0);
                for (int i = 0; i < reps; ++i) {
                    auto& mm = m[i % copies];
                    v.f<<<grid, v.threads, v.smem>>>(out, x, mm.p, mm.s, mm.b, n, k, lg);
                }
                cudaEventRecord(e1);
                CK(cudaEventSynchronize(e1));
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                best = std::min(best, ms * 1e3f / reps);
            }
            printf("  %-20s %8.2f us  %5.2f TB/s  maxdiff/mean %.1e\n", v.name, best, bytes / (best * 1e-6) / 1e12,
                   mrel);
        }
        for (auto& mm : m) {
            cudaFree(mm.p);
            cudaFree(mm.s);
            cudaFree(mm.b);
        }
        cudaFree(x);
        cudaFree(out);
        cudaFree(ref);
    }
    if (argc < 2 || strcmp(argv[1], "shapes") != 0) layer_sim();  // "shapes": the shapes only
    return 0;
}
