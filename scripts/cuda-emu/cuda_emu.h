// Minimal CPU emulation of the CUDA features nuvec's kernels use (no GPU needed): one std::thread
// per CUDA thread, blocks one after another, __syncthreads and warp shuffles as barriers. It checks
// a kernel's indexing and logic, not its speed or memory model.
#include <barrier>
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

struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
// For the shared chunk loader in common.cuh (qg_load), which these kernels do not call.
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
template <class T> T __ldg(const T* p) { return *p; }

thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

struct Warp { float buf[32]; std::unique_ptr<std::barrier<>> bar; };
struct Block {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<Warp> warps;
    std::atomic<int> any{0};  // __syncthreads_or
};
thread_local Block* t_block;
static float emu_dyn_smem[1 << 16];

inline void __syncthreads() { t_block->bar->arrive_and_wait(); }
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

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

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
