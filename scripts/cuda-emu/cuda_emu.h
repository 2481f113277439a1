// Minimal CPU emulation of the CUDA features nuvec's kernels use (no GPU needed): one std::thread
// per CUDA thread, blocks one after another, __syncthreads and warp shuffles as barriers. It checks
// a kernel's indexing and logic, not its speed or memory model.
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
#include <algorithm>
#include <atomic>
#include <array>

struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
struct float2 { float x, y; };
inline float2 make_float2(float a, float b) { return {a, b}; }
template <class T> T __ldg(const T* p) { return *p; }

thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

// buf: a shuffle's values; mma_*: each lane's fragments of an mma.sync (mma_bf16 below); rows:
// each lane's row address of an ldmatrix.
struct Warp {
    float buf[32];
    std::unique_ptr<std::barrier<>> bar;
    unsigned mma_a[32][4], mma_b[32][2];
    const unsigned short* rows[32];  // ldmatrix's row addresses
};
struct Block {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<Warp> warps;
    // wgmma's exchange: each warpgroup's barrier and its threads' A fragments.
    std::vector<std::unique_ptr<std::barrier<>>> wg_bars;
    std::vector<std::array<unsigned, 4>> wg_a;
    std::atomic<int> any{0};  // __syncthreads_or
};
thread_local Block* t_block;
alignas(1024) static float emu_dyn_smem[1 << 16];

// The intrinsics that round each operation on its own (no contraction into a fused multiply-add):
// plain arithmetic here, built without FMA contraction.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline void __syncthreads() { t_block->bar->arrive_and_wait(); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
// Blocks run one after another, so every write is visible to the next block anyway.
inline void __threadfence() {}
// Every thread's v ORed; thread 0 clears the flag after the last read, before any thread can
// reach the next call's first barrier.
inline int __syncthreads_or(int v) {
    t_block->bar->arrive_and_wait();
    if (v) t_block->any.fetch_or(1);
    t_block->bar->arrive_and_wait();
    int r = t_block->any.load();
    t_block->bar->arrive_and_wait();
    if (threadIdx.x == 0) t_block->any.store(0);
    return r;
}
inline float __shfl_xor_sync(unsigned, float v, int o) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    Warp& w = t_block->warps[warp];
    w.bar->arrive_and_wait();
    w.buf[lane] = v;
    w.bar->arrive_and_wait();
    return w.buf[lane ^ o];
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
// The unsigned shuffle (xsplit_f32's byte words), through the float one's exchange.
inline unsigned __shfl_xor_sync(unsigned m, unsigned v, int o) {
    float f, r;
    std::memcpy(&f, &v, 4);
    r = __shfl_xor_sync(m, f, o);
    unsigned u;
    std::memcpy(&u, &r, 4);
    return u;
}
inline int __shfl_xor_sync(unsigned m, int v, int o) { return (int)__shfl_xor_sync(m, (unsigned)v, o); }
inline float __int_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes y:x (x the low four).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (sh & 31));
}
[[noreturn]] inline void __trap() { std::abort(); }
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float emu_half_to_float(unsigned short h) {
    unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = std::ldexp((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
// f to IEEE half bits, rounded to nearest, ties to even (cvt.rn.f16.f32).
inline unsigned short emu_float_to_half(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    unsigned s = (u >> 16) & 0x8000;
    if ((u & 0x7fffffff) > 0x7f800000) return (unsigned short)(s | 0x7e00 | ((u >> 13) & 0x3ff));
    float a = std::fabs(f);
    if (a >= 65520.0f) return (unsigned short)(s | 0x7c00);
    if (a < 6.103515625e-05f) return (unsigned short)(s | (unsigned)std::nearbyint(a * 16777216.0f));
    int e;
    std::frexp(a, &e);
    unsigned mant = (unsigned)std::nearbyint(std::ldexp(a, 11 - e));
    int exp = e - 1 + 15;
    if (mant == 2048) mant = 1024, ++exp;
    if (exp >= 31) return (unsigned short)(s | 0x7c00);
    return (unsigned short)(s | ((unsigned)exp << 10) | (mant - 1024));
}

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
// The kernel sources leave their inline-PTX wrappers out under this (mma_half, mma_bf16, half2_rn, bf16x2_rn, bf16x2_fma, smem_addr,
// cp_async*, ldmatrix_x4, exp2_ftz, and_or, dp4a_us/uu/ss/su below).
#define NUVEC_CUDA_EMU 1

void emu_launch(dim3 grid, dim3 block, std::function<void()> body) {
    gridDim = grid; blockDim = block;
    int n = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                Block b;
                b.bar = std::make_unique<std::barrier<>>(n);
                b.warps.resize((n + 31) / 32);
                for (auto& w : b.warps) w.bar = std::make_unique<std::barrier<>>(32);
                for (int g = 0; g < n / 128; ++g) b.wg_bars.push_back(std::make_unique<std::barrier<>>(128));
                b.wg_a.resize(n);
                std::vector<std::thread> ts;
                for (int t = 0; t < n; ++t)
                    ts.emplace_back([&, t, bx, by, bz] {
                        t_block = &b;
                        threadIdx = dim3{(unsigned)t, 0, 0};
                        blockIdx = dim3{bx, by, bz};
                        body();
                    });
                for (auto& t : ts) t.join();
            }
}

// common.cuh's tensor-core wrappers: bf16 rounding to nearest even, and the warp's m16n8k16 mma.sync
// from its lanes' fragments (A row-major, B column-major, f32 C), each output summed in f64 and
// rounded once (the hardware's f32 accumulation may differ in the last bits).
inline unsigned short emu_bf16_rn(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
inline float emu_bf16(unsigned v) { return __uint_as_float((v & 0xFFFFu) << 16); }
inline unsigned bf16x2_rn(float lo, float hi) { return emu_bf16_rn(lo) | ((unsigned)emu_bf16_rn(hi) << 16); }
// A double rounded once to bf16, to nearest even (normal range; the kernels' values are).
inline unsigned short emu_bf16_rn_d(double v) {
    if (v == 0 || std::isnan(v) || std::isinf(v)) return emu_bf16_rn((float)v);
    int e;
    const double m = std::frexp(v, &e);  // |m| in [0.5, 1): 8 significant bits are m * 2^8
    return emu_bf16_rn((float)std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8));
}
// fma.rn.bf16x2 per half: the product and sum exact in f64 (bf16 operands: a product has 16
// significant bits, and the kernels' sums stay within f64's 53), rounded once to bf16.
inline unsigned bf16x2_fma(unsigned a, unsigned b, unsigned c) {
    unsigned r = 0;
    for (int h = 0; h < 2; ++h) {
        double v = (double)emu_bf16(a >> 16 * h) * emu_bf16(b >> 16 * h) + emu_bf16(c >> 16 * h);
        r |= (unsigned)emu_bf16_rn_d(v) << 16 * h;
    }
    return r;
}
// Every lane's fragments of an mma.sync into its warp's exchange (then every lane reads them all).
inline Warp& emu_mma_share(const unsigned (&a)[4], const unsigned (&b)[2]) {
    int lane = threadIdx.x & 31;
    Warp& w = t_block->warps[threadIdx.x >> 5];
    w.bar->arrive_and_wait();
    std::memcpy(w.mma_a[lane], a, sizeof a);
    std::memcpy(w.mma_b[lane], b, sizeof b);
    w.bar->arrive_and_wait();
    return w;
}
// One m16n8k16 step over halves that `half` decodes (bf16 or f16).
template <class Half>
inline void emu_mma_half(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], Half half) {
    int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    Warp& w = emu_mma_share(a, b);
    // A[r][k]: lane (r % 8) * 4 + (k % 8) / 2, register (r >= 8) + 2 (k >= 8), half k % 2;
    // B[k][n]: lane n * 4 + (k % 8) / 2, register k >= 8, half k % 2.
    auto A = [&](int r, int k) {
        unsigned v = w.mma_a[(r & 7) * 4 + ((k & 7) >> 1)][(r >= 8) + 2 * (k >= 8)];
        return (double)half(k & 1 ? v >> 16 : v);
    };
    auto B = [&](int k, int n) {
        unsigned v = w.mma_b[n * 4 + ((k & 7) >> 1)][k >= 8];
        return (double)half(k & 1 ? v >> 16 : v);
    };
    double r[4];
    for (int i = 0; i < 4; ++i) {
        int row = g + 8 * (i >> 1), n = 2 * c + (i & 1);
        double s = d[i];
        for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, n);
        r[i] = s;
    }
    w.bar->arrive_and_wait();  // every lane has read the fragments before any lane's next call
    for (int i = 0; i < 4; ++i) d[i] = (float)r[i];
}
template <bool F16>
inline void mma_half(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    if constexpr (F16)
        emu_mma_half(d, a, b, [](unsigned v) { return emu_half_to_float((unsigned short)(v & 0xFFFFu)); });
    else emu_mma_half(d, a, b, [](unsigned v) { return emu_bf16(v); });
}
inline void mma_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) { mma_half<false>(d, a, b); }
// cvt.rn.{bf16,f16}x2.f32: two floats to the half type (nearest even), lo in the low half.
template <bool F16>
inline unsigned half2_rn(float lo, float hi) {
    if constexpr (F16) return emu_float_to_half(lo) | ((unsigned)emu_float_to_half(hi) << 16);
    else return bf16x2_rn(lo, hi);
}

// The m16n8k32 mma.sync on bytes (qimma.cu's mma_u8): A unsigned, B signed (SB) or unsigned,
// exact int32 sums (wrapping, as the hardware's without .satfinite).
// A[r][k]: lane (r % 8) * 4 + (k % 16) / 4, register (r >= 8) + 2 (k >= 16), byte k % 4;
// B[k][n]: lane n * 4 + (k % 16) / 4, register k >= 16, byte k % 4.
template <bool SB>
inline void mma_u8(int (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    Warp& w = emu_mma_share(a, b);
    auto A = [&](int r, int k) {
        return (long long)((w.mma_a[(r & 7) * 4 + ((k & 15) >> 2)][(r >= 8) + 2 * (k >= 16)] >> 8 * (k & 3)) & 255u);
    };
    auto B = [&](int k, int n) {
        unsigned v = (w.mma_b[n * 4 + ((k & 15) >> 2)][k >= 16] >> 8 * (k & 3)) & 255u;
        return SB ? (long long)(signed char)v : (long long)v;
    };
    int r[4];
    for (int i = 0; i < 4; ++i) {
        int row = g + 8 * (i >> 1), n = 2 * c + (i & 1);
        long long s = d[i];
        for (int k = 0; k < 32; ++k) s += A(row, k) * B(k, n);
        r[i] = (int)(unsigned)(unsigned long long)s;
    }
    w.bar->arrive_and_wait();  // every lane has read the fragments before any lane's next call
    for (int i = 0; i < 4; ++i) d[i] = r[i];
}
// The warp's lanes meet (a barrier of the warp's threads).
inline void __syncwarp(unsigned = 0xffffffffu) { t_block->warps[threadIdx.x >> 5].bar->arrive_and_wait(); }

// Shared memory by 32-bit address: the emulated window is emu_dyn_smem (the kernels' dynamic
// shared memory under run.sh's patch), an address the byte offset into it.
inline unsigned smem_addr(const void* p) { return (unsigned)((const char*)p - (const char*)emu_dyn_smem); }
inline void* emu_smem(unsigned a) { return (char*)emu_dyn_smem + a; }
// cp.async as a plain copy at once (the kernels wait and __syncthreads before reading, which
// the emulation then only has to honour as barriers).
inline void cp_async16(unsigned dst, const void* src, bool valid) {
    if (valid) std::memcpy(emu_smem(dst), src, 16);
    else std::memset(emu_smem(dst), 0, 16);
}
template <int N> void cp_async_small(unsigned dst, const void* src) { std::memcpy(emu_smem(dst), src, N); }
inline void cp_async_commit() {}
template <int N> void cp_async_wait() {}
// ldmatrix .x4: lane i gives row i % 8 of matrix i / 8; r[m] gets matrix m's row lane / 4, columns
// 2 (lane % 4) and + 1 (trans: rows 2 (lane % 4) and + 1 of column lane / 4).
inline void emu_ldmatrix(unsigned (&r)[4], unsigned addr, bool trans) {
    int lane = threadIdx.x & 31;
    Warp& w = t_block->warps[threadIdx.x >> 5];
    w.bar->arrive_and_wait();
    w.rows[lane] = (const unsigned short*)emu_smem(addr);
    w.bar->arrive_and_wait();
    for (int m = 0; m < 4; ++m) {
        unsigned short e[2];
        for (int i = 0; i < 2; ++i)
            e[i] = trans ? w.rows[8 * m + 2 * (lane & 3) + i][lane >> 2] : w.rows[8 * m + (lane >> 2)][2 * (lane & 3) + i];
        r[m] = e[0] | ((unsigned)e[1] << 16);
    }
    w.bar->arrive_and_wait();  // every lane has read before any lane's next call
}
template <bool TRANS> void ldmatrix_x4(unsigned (&r)[4], unsigned addr) { emu_ldmatrix(r, addr, TRANS); }
template <unsigned MASK> unsigned and_or(unsigned a, unsigned c) { return (a & MASK) | c; }
inline int dp4a_us(unsigned a, unsigned b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)((a >> 8 * i) & 255u) * (int)(signed char)((b >> 8 * i) & 255u);
    return c;
}
inline int dp4a_uu(unsigned a, unsigned b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)((a >> 8 * i) & 255u) * (int)((b >> 8 * i) & 255u);
    return c;
}
inline int dp4a_ss(unsigned a, unsigned b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)((a >> 8 * i) & 255u) * (int)(signed char)((b >> 8 * i) & 255u);
    return c;
}
inline int dp4a_su(unsigned a, unsigned b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)((a >> 8 * i) & 255u) * (int)((b >> 8 * i) & 255u);
    return c;
}
inline float exp2_ftz(float x) {
    float r = std::exp2(x);
    return std::fabs(r) < 1.17549435e-38f ? 0.0f : r;
}
// Whether any lane of the warp passes v.
inline bool __any_sync(unsigned, bool v) {
    int lane = threadIdx.x & 31;
    Warp& w = t_block->warps[threadIdx.x >> 5];
    w.bar->arrive_and_wait();
    w.buf[lane] = v ? 1.0f : 0.0f;
    w.bar->arrive_and_wait();
    bool any = false;
    for (int i = 0; i < 32; ++i) any = any || w.buf[i] != 0.0f;
    w.bar->arrive_and_wait();  // every lane has read before any lane's next call
    return any;
}

// wgmma.mma_async m64nNk16 (bf16, f32 sums; A from registers, B K-major from shared memory by a
// descriptor with the 128-byte swizzle), at once: the warpgroup's threads exchange their A
// fragments, each computes its own outputs (sums in f64, rounded once). B's element (k, n) is at
// start + (n / 8) SBO + (n % 8) 128 + 2 k, its 16-byte unit bits (4-6) XORed with bits 7-9.
template <int NT>
inline void wgmma_bf16(float (&d)[NT][4], const unsigned (&a)[4], unsigned long long desc) {
    const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31, g = lane >> 2, t = lane & 3;
    if ((desc >> 62) != 1) { fprintf(stderr, "wgmma emulation: only the 128-byte swizzle\n"); std::abort(); }
    const unsigned start = (unsigned)(desc & 0x3FFF) << 4, sbo = (unsigned)((desc >> 32) & 0x3FFF) << 4;
    Block& b = *t_block;
    b.wg_bars[wg]->arrive_and_wait();
    for (int i = 0; i < 4; ++i) b.wg_a[tid][i] = a[i];
    b.wg_bars[wg]->arrive_and_wait();
    // A[r][k] (r of this warp's 16): thread (warp, (r % 8) * 4 + (k % 8) / 2), register (r >= 8) + 2 (k >= 8).
    const int w0 = wg * 128 + ((tid >> 5) & 3) * 32;
    auto A = [&](int r, int k) {
        unsigned v = b.wg_a[w0 + (r & 7) * 4 + ((k & 7) >> 1)][(r >= 8) + 2 * (k >= 8)];
        return (double)emu_bf16(k & 1 ? v >> 16 : v);
    };
    auto B = [&](int k, int n) {
        unsigned at = start + (n / 8) * sbo + (n % 8) * 128 + 2 * k;
        at ^= ((at >> 7) & 7) << 4;
        unsigned short v;
        std::memcpy(&v, emu_smem(at), 2);
        return (double)emu_bf16(v);
    };
    double r[NT][4];
    for (int j = 0; j < NT; ++j)
        for (int e = 0; e < 4; ++e) {
            const int row = g + 8 * (e >> 1), n = 8 * j + 2 * t + (e & 1);
            double s = d[j][e];
            for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, n);
            r[j][e] = s;
        }
    b.wg_bars[wg]->arrive_and_wait();  // every thread has read the fragments before any thread's next call
    for (int j = 0; j < NT; ++j)
        for (int e = 0; e < 4; ++e) d[j][e] = (float)r[j][e];
}
inline void wg_fence() {}
inline void wg_commit_wait() {}
inline void fence_proxy_async() {}
