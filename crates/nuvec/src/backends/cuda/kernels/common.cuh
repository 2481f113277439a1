// Shared by every nuvec kernel source: prepended to each .cu file before NVRTC compiles it.
// No headers: NVRTC compiles this without the CUDA include folder.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

// Float dtypes of weights and per-group parameters, as the host passes them.
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2

#define NEG_INF __int_as_float(0xff800000)

// Programmatic dependent launch (sm_90+): the host launches kernels so that one may start while
// the kernel before it on the stream is finishing (State::launch_raw). Every kernel calls this
// first: griddepcontrol.wait returns once the kernels it depends on have completed and their
// writes are visible (at once for a launch without that dependency), and launch_dependents then
// lets the next kernel start launching; its blocks in turn wait here. A kernel that read or
// wrote global memory before this call could race with the kernel before it.
__device__ __forceinline__ void pdl_begin() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Bytes [p, p + bytes) fetched into L2 without waiting (the 16-byte-aligned part inside the
// range; a no-op before sm_90). A hint only: L2 is where every write lands, so what it fetches
// can never be stale, and kernels call it before pdl_begin for data they will read (issue 7: a
// GEMV's blocks, launched while the kernel before them runs, stream their weights into L2 then,
// when HBM would otherwise be idle).
__device__ __forceinline__ void l2_prefetch(const void* p, size_t bytes) {
#if __CUDA_ARCH__ >= 900
    const size_t a = ((size_t)p + 15) & ~(size_t)15, e = ((size_t)p + bytes) & ~(size_t)15;
    if (e > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((u32)(e - a)) : "memory");
#endif
}

// Most experts and top-k of a mixture-of-experts layer the kernels take (moe.cu, moe_router.cu;
// the host's MAX_EXPERTS and MAX_TOP_K in ops/moe.rs).
#define MOE_MAX_EXPERTS 1024
#define MOE_MAX_TOP_K 32

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

// Element i of a float array of dtype `dt` (f32, f16 or bf16), as f32.
__device__ __forceinline__ float load_float(const void* p, size_t i, int dt) {
    if (dt == DT_F32) return ((const float*)p)[i];
    u16 h = ((const u16*)p)[i];
    return dt == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

// Value `k` of a row of MLX affine-packed values: `bits`-wide unsigned integers packed LSB-first
// into a little-endian stream of u32 words. `row` points at the row's first word.
__device__ __forceinline__ u32 unpack(const u32* row, size_t k, int bits) {
    size_t bit = k * (size_t)bits;
    size_t word = bit >> 5;
    int shift = (int)(bit & 31);
    u32 v = row[word] >> shift;
    if (shift + bits > 32) v |= row[word + 1] << (32 - shift);
    return v & ((1u << bits) - 1u);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The sum of f * blockDim.x values (at most 1024 in all, blockDim.x a multiple of 32) as a block
// of that many threads adds them (each warp's, then the warps' in order), thread t holding the
// values of threads t + blockDim.x k in s[k] (k < f <= NORM_MAX_F): warp w then holds warps
// w + (blockDim.x / 32) k whole. Every thread gets the result (s is overwritten). `scratch`
// holds 33 floats of shared memory; the call synchronizes the block.
#define NORM_MAX_F 4
__device__ __forceinline__ float block_sum_slots(float (&s)[NORM_MAX_F], int f, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
    for (int k = 0; k < NORM_MAX_F; ++k)
        if (k < f) s[k] = warp_sum(s[k]);  // in place: s is the caller's scratch
    __syncthreads();
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < NORM_MAX_F; ++k)
            if (k < f) scratch[warp + warps * k] = s[k];
    __syncthreads();
    if (warp == 0) {
        float t = lane < warps * f ? scratch[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) scratch[32] = t;
    }
    __syncthreads();
    return scratch[32];
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 33 floats of shared memory; the call synchronizes the block.
__device__ float block_sum(float v, float* scratch) {
    float s[NORM_MAX_F] = {v, 0.0f, 0.0f, 0.0f};
    return block_sum_slots(s, 1, scratch);
}

// Maximum over the block; same contract as block_sum.
__device__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < warps ? scratch[lane] : NEG_INF;
        t = warp_max(t);
        if (lane == 0) scratch[32] = t;
    }
    __syncthreads();
    return scratch[32];
}

// Whether this block is the last of `blocks` to arrive at `*counter` (every thread of the block
// calling, after the writes the last block will read): each thread's writes are made visible
// before the block takes its ticket, and the last block's reads after it see every block's. The
// last block sets the counter back to 0 when it is done (the next launch on the stream starts
// after it), so a counter is 0 between launches.
__device__ __forceinline__ bool last_block_ticket(u32* counter, u32 blocks) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == blocks - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// The rotary embedding's pair f (of `half`): features a and b, the two halves of the rotated
// features, or neighbours (2f, 2f + 1) when `traditional`. Feature f of each pair turns by
// pos * inv_freqs[f]: rope_rotate gives a's value (x1 c - x2 s) or, `second`, b's (x1 s + x2 c).
// rope_f32 (elementwise.cu, by rope_feature) and rope_qk_f32 (fused.cu) share them, so that they
// agree bit for bit.
__device__ __forceinline__ void rope_pair(int f, int half, int traditional, int& a, int& b) {
    a = traditional ? 2 * f : f;
    b = traditional ? a + 1 : f + half;
}
__device__ __forceinline__ float rope_rotate(float x1, float x2, float c, float s, bool second) {
    return second ? x1 * s + x2 * c : x1 * c - x2 * s;
}

// Feature j (j < 2 * half) of one head after the rotary embedding at position `pos`, from the
// head's input `head`.
__device__ __forceinline__ float rope_feature(const float* head, int j, int half, int traditional, float pos,
                                              const float* inv_freqs) {
    int f, a, b;
    bool second;
    if (traditional) {
        f = j >> 1;
        second = j & 1;
    } else {
        f = j < half ? j : j - half;
        second = j >= half;
    }
    rope_pair(f, half, traditional, a, b);
    float s, c;
    sincosf(pos * inv_freqs[f], &s, &c);
    return rope_rotate(head[a], head[b], c, s, second);
}

// The 4 consecutive values of a row at i (i a multiple of 4), zero past `d`: one 16-byte load
// when `vec` (d a multiple of 4 and the row 16-byte aligned; the host checks), else scalar loads.
// The row kernels give thread t the values 4t..4t+3, 4(t + T)..., whichever the loads, so that a
// row's sum of squares adds in one order on every path (add_rms_norm_f32 in fused.cu matches rms_norm_f32 in elementwise.cu).
__device__ __forceinline__ float4 row_quad(const float* __restrict__ row, int i, int d, int vec) {
    if (vec) return *(const float4*)(row + i);
    return make_float4(row[i], i + 1 < d ? row[i + 1] : 0.0f, i + 2 < d ? row[i + 2] : 0.0f,
                       i + 3 < d ? row[i + 3] : 0.0f);
}

// The row-norm kernels' layout (rms_norm_f32, add_rms_norm_f32): a row of d values is summed as by
// VT = norm_vthreads(d) "virtual" threads, v taking the quads at 4v, 4(v + VT), ... in that order,
// and the VT partial sums reduced as block_sum reduces VT threads' values. A block of T = VT / F
// real threads (F = 1, 2 or 4: the host's choice, norm_threads in ops.rs) runs it with thread t
// as the virtual threads t + T k (k < F), their sums added by block_sum_slots, so the order of
// every sum is that of VT threads whatever F is. A decode row takes F = 1 (most threads on one
// row), a prefill's thousands of rows F = 4 (more rows per SM, four loads in flight per thread).
__device__ __forceinline__ int norm_vthreads(int d) {
    const int t = ((d + 3) / 4 + 31) / 32 * 32;
    return t < 32 ? 32 : (t > 1024 ? 1024 : t);
}
// One pass over the row: for each step of the virtual threads, this thread's (up to F) quads are
// all loaded (`load(i)`: a float4, or one with its weights) before any is used (`use(k, i, q)`,
// k the virtual thread's slot), so that their loads are in flight together.
template <class Load, class Use>
__device__ __forceinline__ void row_quads(int d, int vt, Load load, Use use) {
    const int f = vt / blockDim.x;
    for (int i0 = 4 * threadIdx.x; i0 < d; i0 += 4 * vt) {
        decltype(load(0)) v[NORM_MAX_F];
#pragma unroll
        for (int k = 0; k < NORM_MAX_F; ++k) {
            const int i = i0 + 4 * blockDim.x * k;
            if (k < f && i < d) v[k] = load(i);
        }
#pragma unroll
        for (int k = 0; k < NORM_MAX_F; ++k) {
            const int i = i0 + 4 * blockDim.x * k;
            if (k < f && i < d) use(k, i, v[k]);
        }
    }
}
__device__ __forceinline__ float quad_sumsq(float4 v) {
    float s = v.x * v.x;
    s = fmaf(v.y, v.y, s);
    s = fmaf(v.z, v.z, s);
    return fmaf(v.w, v.w, s);
}

// A row value quad and the norm weights at the same features (zero past `d`).
struct NormQuad {
    float4 v, w;
};
__device__ __forceinline__ NormQuad norm_quad(float4 v, const void* w, int i, int d, int w_dt) {
    float r[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) r[e] = i + e < d ? load_float(w, i + e, w_dt) : 0.0f;
    return {v, make_float4(r[0], r[1], r[2], r[3])};
}

// v * inv * w for a quad.
__device__ __forceinline__ float4 quad_normed(NormQuad q, float inv) {
    return make_float4(q.v.x * inv * q.w.x, q.v.y * inv * q.w.y, q.v.z * inv * q.w.z, q.v.w * inv * q.w.w);
}
// o[i .. i + 3] = n, those below d: one 16-byte store when `vec` (as row_quad).
__device__ __forceinline__ void quad_store(float* __restrict__ o, float4 n, int i, int d, int vec) {
    if (vec) {
        *(float4*)(o + i) = n;
        return;
    }
    const float r[4] = {n.x, n.y, n.z, n.w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
        if (i + e < d) o[i + e] = r[e];
}

// silu(g) * u as the CPU backend writes it: g / (1 + exp(-g)) * u.
__device__ __forceinline__ float silu_mul_value(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// The BITS u32 words of one 32-value chunk of an MLX affine-packed row (32 values of BITS bits
// are exactly BITS words): one 16-byte load for 4 bits, two for 8, 8 bytes for 2, BITS word loads
// for 3/5/6. `p` is aligned to the load width (checked by the host). Used by the GEMV, the f32
// dequantizer (linear.cu) and the bf16 one (prefill.cu).
template <int BITS>
__device__ __forceinline__ void qg_load(u32 (&w)[BITS], const u32* p) {
    if constexpr (BITS == 4) {
        uint4 v = __ldg((const uint4*)p);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else if constexpr (BITS == 8) {
        uint4 a = __ldg((const uint4*)p), b = __ldg((const uint4*)p + 1);
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else if constexpr (BITS == 2) {
        uint2 v = __ldg((const uint2*)p);
        w[0] = v.x; w[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < BITS; ++i) w[i] = __ldg(p + i);
    }
}

// Flat chunk i of the tile dequantizers (linear.cu's f32 tiles, prefill.cu's bf16 ones): the
// row `r` within the tile (rows row0.., `chunks` 32-value chunks each, `words` u32 per row,
// `gpr` groups per row) and chunk `c` it names, the chunk's BITS words, and the scale and bias of
// its two 16-value halves (one group unless groups of 16).
template <int BITS>
__device__ __forceinline__ void qg_tile_chunk(size_t i, int chunks, size_t words, size_t gpr, long long row0,
                                              const u32* packed, const void* scales, const void* biases, int p_dt,
                                              int lg, size_t& r, size_t& c, u32 (&w)[BITS], float& s0, float& b0,
                                              float& s1, float& b1) {
    r = i / chunks;
    c = i % chunks;
    const size_t row = (size_t)row0 + r;
    qg_load<BITS>(w, packed + row * words + c * BITS);
    const size_t g0 = row * gpr + ((c << 5) >> lg), g1 = row * gpr + (((c << 5) + 16) >> lg);
    s0 = load_float(scales, g0, p_dt);
    b0 = load_float(biases, g0, p_dt);
    s1 = load_float(scales, g1, p_dt);
    b1 = load_float(biases, g1, p_dt);
}

// The 8 values of one 4-bit word (nibble i is value i), exactly, as floats: each byte of the
// masked words holds one value, which byte_perm puts under 0x4B (the float 2^23 + q), minus 2^23.
// No integer-to-float conversion. The f32 GEMV's chunk decoder (linear.cu) and the bf16 weight
// decoder (prefill.cu) share it.
__device__ __forceinline__ void q4_values(u32 w, float (&q)[8]) {
    const u32 lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;  // values 2b and 2b + 1 in byte b
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        q[2 * b] = __uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7540 | b)) - 8388608.0f;
        q[2 * b + 1] = __uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7540 | b)) - 8388608.0f;
    }
}

// f to bf16 bits, rounded to nearest, ties to even, as the host's `half::bf16::from_f32` does.
__device__ __forceinline__ u32 bf16_rn(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;  // NaN stays a (quiet) NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // carries into the exponent when rounding up (inf past max)
    return u >> 16;
}

// f as IEEE half bits, rounded to nearest, ties to even, as the host's `half::f16::from_f32` does.
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Element i of a float array of dtype `dt` (f32, f16 or bf16) set to v, rounded to nearest even
// (the caches of keys and values, kept in half precision, store so).
__device__ __forceinline__ void store_float(void* p, size_t i, float v, int dt) {
    if (dt == DT_F32) {
        ((float*)p)[i] = v;
    } else {
        ((u16*)p)[i] = dt == DT_F16 ? f32_to_f16(v) : (u16)bf16_rn(v);
    }
}

#ifndef NUVEC_CUDA_EMU
// Tensor-core helpers (flash attention, the bf16 weight decoder); the CPU emulator
// (scripts/cuda-emu/cuda_emu.h) defines its own of each.
// d += A B for one m16n8k16 step (A row-major, B column-major, f32 accumulation) over halves of
// PTX type TYPE ("bf16" or "f16").
#define MMA_M16N8K16(TYPE)                                                                             \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
                 "{%8,%9}, {%0,%1,%2,%3};"                                                             \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
// The tensor-core kernels' two half types: F16 false takes bf16 (bf16 caches, the prefill's
// converted keys, the weight decoders), true f16 (a GGUF model's f16 caches, read as stored).
// mma.sync on halves needs sm_80, where the host launches the kernels using it (elsewhere it traps).
template <bool F16>
__device__ __forceinline__ void mma_half(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    if constexpr (F16) MMA_M16N8K16("f16");
    else MMA_M16N8K16("bf16");
#else
    __trap();
#endif
}
// Two floats rounded to the half type (nearest even), lo in the low half: one cvt on sm_80+
// (for bf16 the same rounding as bf16_rn, except that a NaN becomes the canonical NaN 0x7FFF;
// beyond f16's range, infinities), bf16_rn / f32_to_f16 before.
template <bool F16>
__device__ __forceinline__ u32 half2_rn(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    u32 r;
    if constexpr (F16) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    if constexpr (F16) return (u32)f32_to_f16(lo) | ((u32)f32_to_f16(hi) << 16);
    else return bf16_rn(lo) | (bf16_rn(hi) << 16);
#endif
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    mma_half<false>(d, a, b);
}
__device__ __forceinline__ u32 bf16x2_rn(float lo, float hi) { return half2_rn<false>(lo, hi); }

// a * b + c per bf16 half, rounded once to bf16 (nearest even); sm_80+, where the host launches
// the kernels using it (elsewhere it traps).
__device__ __forceinline__ u32 bf16x2_fma(u32 a, u32 b, u32 c) {
#if __CUDA_ARCH__ >= 800
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    __trap();
    return 0u;
#endif
}

// Shared-memory staging for the tensor cores (flash attention; sm_80+, where the host launches
// the kernels using them, elsewhere they trap). Shared memory by its 32-bit address in the shared
// window (smem_addr), so that offsets stay 32-bit adds the instructions can take as immediates.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// 16 bytes from global to shared memory without passing through registers (cp.async, L2 only);
// zeros when !valid (src is then not read, but must be a valid address).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
#else
    __trap();
#endif
}
// N (4 or 8) bytes from global to shared memory through L1 (cp.async .ca), for small
// parameters staged beside cp_async16's copies; src and dst aligned to N.
template <int N>
__device__ __forceinline__ void cp_async_small(u32 dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(src), "n"(N) : "memory");
#else
    __trap();
#endif
}
// Closes a group of this thread's cp.async copies.
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's groups are in flight (the newest ones); a
// __syncthreads after it makes every thread's copies visible to the block.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
// Four 8x8 bf16 matrices from shared memory, lane i giving the address of row i % 8 of matrix
// i / 8 (16 bytes): r[m] holds matrix m's row lane / 4, columns 2 (lane % 4) and + 1, i.e. an
// mma fragment. TRANS (ldmatrix .trans) gives rows 2 (lane % 4) and + 1 of column lane / 4.
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
#if __CUDA_ARCH__ >= 800
#define NUVEC_LDMATRIX_X4(form)                                                                 \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4" form ".shared.b16 {%0,%1,%2,%3}, [%4];"         \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                                 \
                 : "r"(addr))
    if constexpr (TRANS) NUVEC_LDMATRIX_X4(".trans");
    else NUVEC_LDMATRIX_X4("");
#undef NUVEC_LDMATRIX_X4
#else
    r[0] = r[1] = r[2] = r[3] = 0u;
    __trap();
#endif
}
// (a & MASK) | c in one lop3, with c in a register: from two constants the compiler makes an and
// and an or (one more instruction per use in the 4-bit GEMVs' decoding).
template <u32 MASK>
__device__ __forceinline__ u32 and_or(u32 a, u32 c) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(MASK), "r"(c));
    return d;
}
// c + the dot product of a's 4 bytes with b's 4 bytes, exact: dp4a_XY takes a's as unsigned (u)
// or signed (s) and b's as Y.
#define DP4A(NAME, TYPES)                                                        \
    __device__ __forceinline__ int NAME(u32 a, u32 b, int c) {                   \
        int d;                                                                   \
        asm("dp4a." TYPES " %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); \
        return d;                                                                \
    }
DP4A(dp4a_us, "u32.s32")
DP4A(dp4a_uu, "u32.u32")
DP4A(dp4a_ss, "s32.s32")
DP4A(dp4a_su, "s32.u32")
#undef DP4A
// 2^x in one MUFU instruction, results below 2^-126 flushed to 0 (exp2f adds a range fix-up
// around it for those; softmax probabilities that small round to nothing anyway).
__device__ __forceinline__ float exp2_ftz(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
#endif

// ---- The bf16 register products' input (qimma.cu's qdec kernels) ----
//
// x [m, k] as bf16: per tile of 8 rows and 32-value chunk, [row g][lane t] 16 bytes = the pairs
// (x 8t, x 8t + 4), (+1, +5), (+2, +6), (+3, +7) of row g, the B fragments of two k16 steps.
// Rows past m are never stored from (an MMA's output column depends on its input row alone), so
// a tile's rows past m may hold anything. Written by xbf16_tiles_f32 from an f32 x, or by the
// kernel that makes x (a norm, an attention merge) beside its f32 output (ops/qimma.rs).

// The 16-byte unit of (row, chunk c, lane t) for rows of kc chunks.
__device__ __forceinline__ size_t qdec_tile_at(int row, int c, int t, int kc) {
    return (((size_t)(row >> 3) * kc + c) * 8 + (row & 7)) * 4 + t;
}
// Value v = x[row][i] into the tiles, from a warp whose lanes hold 32 consecutive values of one
// row (i's warp 32-aligned, every lane calling): lane i & 7 < 4 takes i + 4's from its lane and
// writes their pair, one 4-byte word.
__device__ __forceinline__ void qdec_tile_value(u32* __restrict__ tiles, int row, int i, int k, float v) {
    const float up = __shfl_xor_sync(0xffffffffu, v, 4);
    if ((i & 7) < 4) tiles[qdec_tile_at(row, i >> 5, (i >> 3) & 3, k >> 5) * 4 + (i & 3)] = bf16x2_rn(v, up);
}
// Values r = x[row][i .. i + 3] (i a multiple of 4) into the tiles, from a warp whose lanes hold
// 32 consecutive quads of one row (128-aligned, every lane calling): a lane pair (i, i + 4)
// swaps halves and each writes two of its 8 values' four pairs, 8 bytes.
__device__ __forceinline__ void qdec_tile_quad(u32* __restrict__ tiles, int row, int i, int k, float4 r) {
    const bool high = (i & 4) != 0;
    const float p0 = __shfl_xor_sync(0xffffffffu, high ? r.x : r.z, 1);
    const float p1 = __shfl_xor_sync(0xffffffffu, high ? r.y : r.w, 1);
    // The low lane holds values 0-3 of the 8 (pairs (0, 4), (1, 5)), the high one 4-7 ((2, 6), (3, 7)).
    const u32 w0 = high ? bf16x2_rn(p0, r.z) : bf16x2_rn(r.x, p0);
    const u32 w1 = high ? bf16x2_rn(p1, r.w) : bf16x2_rn(r.y, p1);
    const size_t at = qdec_tile_at(row, i >> 5, (i >> 3) & 3, k >> 5) * 4 + (high ? 2 : 0);
    *(uint2*)(tiles + at) = make_uint2(w0, w1);
}

// ---- x's parts for the integer GEMVs (linear.cu qgemv4i_acc) ----
// Layout for a K-value x: [chunks][QI_WORDS] u32 parts ([part][word][even, odd] bytes), then
// chunks f32 scales 2^-e, then chunks f32 sums of x (chunks = K / 32), then a norm tail of one
// f32 eps and chunks f32 partial sums. Scales are positive for x's own parts. Negated scales and
// sums (-2^-e, -sum(u): written by qgemv_norm_b4_i4) mark the parts of u = h * w of an RMS norm
// whose scale is pending: x = u / rms(h), rms(h) = sqrt(sum of the tail's partials / K + eps).
// The integer GEMVs' sums then come out negated, and they multiply their totals by
// -1 / rms(h) (xq_norm_scale), having seen the sign in the scales they load anyway. The tail is
// read only then.
#define QI_WORDS 24
// u32 words of a K-value x's parts (chunks = K / 32).
#define QI_PARTS_WORDS(chunks) ((size_t)(chunks) * (QI_WORDS + 3) + 1)
// Chunk c of x, lane v of a full warp holding value v: the chunk's largest |x| and its sum by warp
// reductions, X = rint(x 2^e) with |X| <= 2^22, split X = 65536 hi + 256 mid + lo; lane
// 8j + 2t + eo holds byte t of word (j, eo) of each part, ORed into the word over the lanes that
// share it (lane bits 1-2), so that lanes with t == 0 hold whole words. Every producer of parts
// calls this, so the parts are the same whoever writes them (xsplit_chunk here, qimma.cu's tiled
// layout for the few-row kernels).
struct XsplitWords {
    u32 hi, mid, lo;
    int e;
    float sum;
};
__device__ __forceinline__ XsplitWords xsplit_words(float v, int lane) {
    const float m = warp_max(fabsf(v)), sx = warp_sum(v);
    int ex = 0;
    if (m > 0.0f) frexpf(m, &ex);  // m < 2^ex
    const int e = m > 0.0f ? 22 - ex : 0;
    const int X = (int)rintf(ldexpf(v, e));
    const int t = (lane >> 1) & 3;
    u32 hi = ((u32)(X >> 16) & 255u) << (8 * t), mid = ((u32)(X >> 8) & 255u) << (8 * t), lo = ((u32)X & 255u) << (8 * t);
#pragma unroll
    for (int o = 2; o <= 4; o <<= 1) {
        hi |= __shfl_xor_sync(0xffffffffu, hi, o);
        mid |= __shfl_xor_sync(0xffffffffu, mid, o);
        lo |= __shfl_xor_sync(0xffffffffu, lo, o);
    }
    return {hi, mid, lo, e, sx};
}
// xsplit_words stored in the layout above (scale and sum negated for a norm's pending scale).
__device__ __forceinline__ void xsplit_chunk(u32* __restrict__ parts, int chunks, int c, float v, int lane,
                                             bool pending = false) {
    const XsplitWords w = xsplit_words(v, lane);
    if (((lane >> 1) & 3) == 0) {
        u32* out = parts + (size_t)c * QI_WORDS + (lane >> 3) * 2 + (lane & 1);
        out[0] = w.hi;
        out[8] = w.mid;
        out[16] = w.lo;
    }
    if (lane == 0) {
        float* scale = (float*)(parts + (size_t)chunks * QI_WORDS);
        scale[c] = pending ? -ldexpf(1.0f, -w.e) : ldexpf(1.0f, -w.e);
        scale[chunks + c] = pending ? -w.sum : w.sum;
    }
}

// The integer sums of one 32-value chunk of 4-bit codes against x's parts of it (xp: the chunk's
// QI_WORDS words), for each of ROWS rows' chunk words w[r]: a word's 8 nibbles masked into two
// registers (values 0,2,4,6 and 1,3,5,7, a byte each) meet the parts' bytes in that order, S[r]
// = (hi, mid, lo) sums, exact in int32 (qi_total joins them).
template <int ROWS>
__device__ __forceinline__ void qi4_sums(const uint4 (&w)[ROWS], const u32* __restrict__ xq_chunk, int (&S)[ROWS][3]) {
    const uint4* xp = (const uint4*)xq_chunk;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) S[r][0] = S[r][1] = S[r][2] = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // words 2h and 2h + 1: one uint4 of each part
        const uint4 xh = __ldg(xp + h), xm = __ldg(xp + 2 + h), xl = __ldg(xp + 4 + h);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
            const u32 he = jj ? xh.z : xh.x, ho = jj ? xh.w : xh.y, me = jj ? xm.z : xm.x, mo = jj ? xm.w : xm.y;
            const u32 le = jj ? xl.z : xl.x, lo = jj ? xl.w : xl.y;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const int j = 2 * h + jj;
                const u32 word = j == 0 ? w[r].x : j == 1 ? w[r].y : j == 2 ? w[r].z : w[r].w;
                const u32 ev = word & 0x0F0F0F0Fu, od = (word >> 4) & 0x0F0F0F0Fu;
                S[r][0] = dp4a_us(od, ho, dp4a_us(ev, he, S[r][0]));
                S[r][1] = dp4a_uu(od, mo, dp4a_uu(ev, me, S[r][1]));
                S[r][2] = dp4a_uu(od, lo, dp4a_uu(ev, le, S[r][2]));
            }
        }
    }
}
// A chunk's dot product from its three sums (qi4_sums), before x's chunk scale.
__device__ __forceinline__ float qi_total(const int (&S)[3]) {
    return fmaf((float)S[0], 65536.0f, fmaf((float)S[1], 256.0f, (float)S[2]));
}

// Twice the value of an e2m1 code (mxfp4, nvfp4) as a signed byte, for the integer sums below:
// codes 0-7 are {0, 1, 2, 3, 4, 6, 8, 12} (table P, two words), codes 8-15 their negations (N).
#define FP4I_P0 0x03020100u
#define FP4I_P1 0x0C080604u
#define FP4I_N0 0xFDFEFF00u
#define FP4I_N1 0xF4F8FAFCu
// The 8 e2m1 codes of a word (nibble i: value i) as twice their values, bytes in value order:
// v03 holds values 0-3, v47 values 4-7. Per 4 codes one byte permute in each table (a selector
// nibble's low 3 bits pick the byte) and one picking N's byte where the code's sign bit is set.
__device__ __forceinline__ void fp4_bytes(u32 q, u32& v03, u32& v47) {
    const u32 pick = and_or<0x44444444u>(q >> 1, 0x32103210u);
    v03 = __byte_perm(__byte_perm(FP4I_P0, FP4I_P1, q), __byte_perm(FP4I_N0, FP4I_N1, q), pick);
    const u32 qh = q >> 16;
    v47 = __byte_perm(__byte_perm(FP4I_P0, FP4I_P1, qh), __byte_perm(FP4I_N0, FP4I_N1, qh), pick >> 16);
}
// x's parts of the chunk's values 8j..8j+7 (j = 2h + jj; xh, xm, xl: the h-th uint4 of the hi, mid
// and lo parts, which hold words j = 2h and 2h + 1 as (even, odd) byte pairs) in value order: hi,
// mid and lo of values 0-3 (x03) and of values 4-7 (x47).
struct XqOrdered {
    u32 h03, h47, m03, m47, l03, l47;
};
__device__ __forceinline__ XqOrdered xq_value_order(uint4 xh, uint4 xm, uint4 xl, int jj) {
    const u32 he = jj ? xh.z : xh.x, ho = jj ? xh.w : xh.y, me = jj ? xm.z : xm.x, mo = jj ? xm.w : xm.y;
    const u32 le = jj ? xl.z : xl.x, lo = jj ? xl.w : xl.y;
    return {__byte_perm(he, ho, 0x5140), __byte_perm(he, ho, 0x7362), __byte_perm(me, mo, 0x5140),
            __byte_perm(me, mo, 0x7362), __byte_perm(le, lo, 0x5140), __byte_perm(le, lo, 0x7362)};
}

// The integer sums of a chunk over x's parts in value order: S zeroed, then for each quarter (h, jj)
// of the chunk (values 8j..8j+7, j = 2h + jj) its parts (xq_value_order, once for all ROWS rows)
// handed to row(r, h, jj, x, S[r]) for each row, which adds that row's dp4a.
template <int ROWS, class Row>
__device__ __forceinline__ void qi_ordered_sums(const u32* __restrict__ xq_chunk, int (&S)[ROWS][3], Row row) {
    const uint4* xp = (const uint4*)xq_chunk;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) S[r][0] = S[r][1] = S[r][2] = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint4 xh = __ldg(xp + h), xm = __ldg(xp + 2 + h), xl = __ldg(xp + 4 + h);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
            const XqOrdered x = xq_value_order(xh, xm, xl, jj);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) row(r, h, jj, x, S[r]);
        }
    }
}

// As qi4_sums for e2m1 codes: S[r] = (hi, mid, lo) sums of twice the codes' values (fp4_bytes)
// times x's parts, exact in int32; each row's word costs its two lookups and 6 dp4a.
template <int ROWS>
__device__ __forceinline__ void qfp4_sums(const uint4 (&w)[ROWS], const u32* __restrict__ xq_chunk,
                                          int (&S)[ROWS][3]) {
    qi_ordered_sums<ROWS>(xq_chunk, S, [&](int r, int h, int jj, const XqOrdered& x, int (&s)[3]) {
        const int j = 2 * h + jj;
        u32 v03, v47;
        fp4_bytes(j == 0 ? w[r].x : j == 1 ? w[r].y : j == 2 ? w[r].z : w[r].w, v03, v47);
        s[0] = dp4a_ss(v47, x.h47, dp4a_ss(v03, x.h03, s[0]));
        s[1] = dp4a_su(v47, x.m47, dp4a_su(v03, x.m03, s[1]));
        s[2] = dp4a_su(v47, x.l47, dp4a_su(v03, x.l03, s[2]));
    });
}

// As qi4_sums for 8-bit codes: each row's chunk as two uint4 (words 0-3, 4-7), word i holding
// values 4i..4i+3 as unsigned bytes in order, so values 8j..8j+7 are words 2j and 2j + 1: 6 dp4a
// per pair of words and no masks.
template <int ROWS>
__device__ __forceinline__ void qi8_sums(const uint4 (&w)[ROWS][2], const u32* __restrict__ xq_chunk,
                                         int (&S)[ROWS][3]) {
    qi_ordered_sums<ROWS>(xq_chunk, S, [&](int r, int h, int jj, const XqOrdered& x, int (&s)[3]) {
        const u32 a = jj ? w[r][h].z : w[r][h].x, b = jj ? w[r][h].w : w[r][h].y;
        s[0] = dp4a_us(b, x.h47, dp4a_us(a, x.h03, s[0]));
        s[1] = dp4a_uu(b, x.m47, dp4a_uu(a, x.m03, s[1]));
        s[2] = dp4a_uu(b, x.l47, dp4a_uu(a, x.l03, s[2]));
    });
}

// What the integer GEMVs multiply their totals by for parts `xq` of a K-value x: 1, or when a
// norm's scale is pending (`pending`: a negative scale seen, any lane of the warp) -1 / rms(h)
// from the norm tail (the layout above; the totals came out negated). Every warp that calls it
// gets the same value (the lanes add the partials in one order).
__device__ __forceinline__ float xq_norm_scale(const u32* __restrict__ xq, int k, bool pending) {
    if (!__any_sync(0xffffffffu, pending)) return 1.0f;
    const int chunks = k >> 5;
    const float* tail = (const float*)(xq + (size_t)chunks * QI_WORDS) + 2 * chunks;
    float s = 0.0f;
    for (int c = (int)(threadIdx.x & 31); c < chunks; c += 32) s += tail[1 + c];
    return -1.0f / sqrtf(warp_sum(s) / (float)k + tail[0]);
}

// ---- Decoding a 32-value chunk of MLX affine-packed values (the GEMVs of linear.cu, moe.cu) ----

#define QG_MAGIC 0x4B000000u

__device__ __forceinline__ float qg_f(u32 bits23) { return __uint_as_float(bits23 | QG_MAGIC) - 8388608.0f; }

// The 32 values of a chunk as floats.
template <int BITS>
__device__ __forceinline__ void qg_decode(const u32 (&w)[BITS], float (&q)[32]) {
    if constexpr (BITS == 8) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int b = 0; b < 4; ++b) q[4 * j + b] = __uint_as_float(__byte_perm(w[j], QG_MAGIC, 0x7540 | b)) - 8388608.0f;
    } else if constexpr (BITS == 4) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float v[8];
            q4_values(w[j], v);
#pragma unroll
            for (int t = 0; t < 8; ++t) q[8 * j + t] = v[t];
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int bit = i * BITS, word = bit >> 5, sh = bit & 31;
            u32 v;
            if (sh + BITS <= 32) v = w[word] >> sh;
            else v = __funnelshift_r(w[word], w[word + 1], sh);
            q[i] = qg_f(v & ((1u << BITS) - 1u));
        }
    }
}

// ---- MLX's floating-point quantization codes (fp_linear.cu, moe.cu) ----

#define FP_MXFP4 1
#define FP_MXFP8 2
#define FP_NVFP4 3

// e4m3 ("fn": no infinities, 0x7f/0xff NaN): exponent and mantissa moved to f32's places read
// 2^(e-127)(1 + m/8), or the subnormal m 2^-129; times 2^120 that is the e4m3 value, exactly.
__device__ __forceinline__ float fp_e4m3(u32 b) {
    u32 sign = (b & 0x80u) << 24;
    u32 em = b & 0x7fu;
    if (em == 0x7fu) return __uint_as_float(sign | 0x7fc00000u);
    float mag = __uint_as_float(em << 20) * __uint_as_float(0x7b800000u);
    return __uint_as_float(sign | __float_as_uint(mag));
}

// e2m1: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign.
__device__ __forceinline__ float fp_e2m1(u32 c) {
    u32 e = (c >> 1) & 3u, m = c & 1u;
    float mag = e == 0 ? 0.5f * (float)m : __uint_as_float(((e + 126u) << 23) | (m << 22));
    return (c & 8u) ? -mag : mag;
}

// e8m0 as MLX decodes it: 2^(s-127), with s = 0 giving 2^-127 and s = 255 infinity.
__device__ __forceinline__ float fp_e8m0(u32 s) {
    return s == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(s << 23);
}
