// Shapes of the 4-bit one-row GEMV timed against each other on the GPU machine (the CUDA
// journal, `git show 83079a1:docs/cuda.md`, "GEMV shapes measured without L2 help"): affine
// 4-bit, group 64, bf16 scales and biases, f32 x and output. Each shape's weight is copied until
// the copies fill >= 600 MB and the calls rotate through them, so L2 does not hold the weights;
// every variant is checked against a scalar kernel. Also prints the host cost of a kernel launch
// and of an allocation + free.
// Build and run there (nvcc is on the device; not part of the cargo build):
//   nvcc -O3 -arch=sm_90 -std=c++17 bench/cuda/gemv_probe.cu -o /tmp/gemv_probe && /tmp/gemv_probe
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstdint>
#include <cmath>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

typedef unsigned int u32;
typedef unsigned short u16;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ float bf(u16 h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
#define MAGIC 0x4B000000u

// reference: one thread per output row... slow but simple: one warp per row, scalar.
__global__ void ref_gemv(float* out, const float* x, const u32* packed, const u16* sc, const u16* bi, int n, int k, int lg, int bits) {
    int r = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= n) return;
    size_t words = (size_t)k * bits / 32;
    float acc = 0;
    for (int c = lane; c < k; c += 32) {
        size_t bit = (size_t)c * bits;
        u32 q = (packed[r * words + (bit >> 5)] >> (bit & 31)) & ((1u << bits) - 1);
        size_t g = (size_t)r * (k >> lg) + (c >> lg);
        acc += (bf(sc[g]) * (float)q + bf(bi[g])) * x[c];
    }
    acc = warp_sum(acc);
    if (lane == 0) out[r] = acc;
}

__device__ __forceinline__ void dec4(u32 w, float (&q)[8]) {
    u32 lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        q[2 * b] = __uint_as_float(__byte_perm(lo, MAGIC, 0x7540 | b)) - 8388608.0f;
        q[2 * b + 1] = __uint_as_float(__byte_perm(hi, MAGIC, 0x7540 | b)) - 8388608.0f;
    }
}
// LOP3-based: each value its own op.
__device__ __forceinline__ void dec4_lop(u32 w, float (&q)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = __uint_as_float(((w >> (4 * i)) & 0xFu) | MAGIC) - 8388608.0f;
}

// Warp-streaming kernel: WARPS warps per block, each warp ROWS rows; lane l handles chunks
// l, l+32, ...; U chunks per row loaded before any is decoded. Groups >= 32 (lg >= 5).
template <int ROWS, int U, int WARPS, int DEC>
__global__ void __launch_bounds__(WARPS * 32) ws4(float* out, const float* __restrict__ x, const u32* __restrict__ packed,
                                                  const u16* __restrict__ sc, const u16* __restrict__ bi, int n, int k, int lg) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = (blockIdx.x * WARPS + warp) * ROWS;
    if (r0 >= n) return;
    const int chunks = k >> 5;
    const size_t words = (size_t)chunks * 4;
    const size_t gpr = (size_t)(k >> lg);
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
        uint4 w[U][ROWS];
        float s[U][ROWS], b[U][ROWS];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int c = c0 + 32 * u;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                int row = min(r0 + r, n - 1);
                if (c < chunks) {
                    w[u][r] = __ldg((const uint4*)(packed + row * words + (size_t)c * 4));
                    size_t g = row * gpr + (((size_t)c << 5) >> lg);
                    s[u][r] = bf(__ldg(sc + g));
                    b[u][r] = bf(__ldg(bi + g));
                } else {
                    w[u][r] = make_uint4(0, 0, 0, 0);
                    s[u][r] = 0.f;
                    b[u][r] = 0.f;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int c = c0 + 32 * u;
            if (c < chunks) {
                float xv[32];
                const float4* xp = (const float4*)(x + ((size_t)c << 5));
#pragma unroll
                for (int v = 0; v < 8; ++v) {
                    float4 t = __ldg(xp + v);
                    xv[4 * v] = t.x; xv[4 * v + 1] = t.y; xv[4 * v + 2] = t.z; xv[4 * v + 3] = t.w;
                }
                float xs = 0.f;
#pragma unroll
                for (int j = 0; j < 32; ++j) xs += xv[j];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    u32 ww[4] = {w[u][r].x, w[u][r].y, w[u][r].z, w[u][r].w};
                    float d = 0.f;
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        float q[8];
                        if (DEC == 0) dec4(ww[j], q); else dec4_lop(ww[j], q);
                        // dec4 order: q[2b] = byte b low nibble = value 8j+2b; q[2b+1] = value 8j+2b+1
#pragma unroll
                        for (int t = 0; t < 8; ++t) d = fmaf(q[t], xv[8 * j + t], d);
                    }
                    acc[r] += s[u][r] * d + b[u][r] * xs;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < n) out[r0 + r] = v;
    }
}

// Same, with x staged in shared memory once per block (k <= 16384).
template <int ROWS, int U, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) ws4s(float* out, const float* __restrict__ x, const u32* __restrict__ packed,
                                                   const u16* __restrict__ sc, const u16* __restrict__ bi, int n, int k, int lg) {
    extern __shared__ float xs_sh[];
    for (int i = threadIdx.x * 4; i < k; i += WARPS * 32 * 4) *(float4*)(xs_sh + i) = __ldg((const float4*)(x + i));
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = (blockIdx.x * WARPS + warp) * ROWS;
    if (r0 >= n) return;
    const int chunks = k >> 5;
    const size_t words = (size_t)chunks * 4;
    const size_t gpr = (size_t)(k >> lg);
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
        uint4 w[U][ROWS];
        float s[U][ROWS], b[U][ROWS];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int c = c0 + 32 * u;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                int row = min(r0 + r, n - 1);
                if (c < chunks) {
                    w[u][r] = __ldg((const uint4*)(packed + row * words + (size_t)c * 4));
                    size_t g = row * gpr + (((size_t)c << 5) >> lg);
                    s[u][r] = bf(__ldg(sc + g));
                    b[u][r] = bf(__ldg(bi + g));
                } else {
                    w[u][r] = make_uint4(0, 0, 0, 0);
                    s[u][r] = 0.f; b[u][r] = 0.f;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int c = c0 + 32 * u;
            if (c < chunks) {
                // lane-rotated reads avoid bank conflicts: lane l reads chunk c (32 floats) starting at offset (l % 8)*4
                float xv[32];
#pragma unroll
                for (int v = 0; v < 8; ++v) {
                    float4 t = *(const float4*)(xs_sh + ((size_t)c << 5) + 4 * v);
                    xv[4 * v] = t.x; xv[4 * v + 1] = t.y; xv[4 * v + 2] = t.z; xv[4 * v + 3] = t.w;
                }
                float xsum = 0.f;
#pragma unroll
                for (int j = 0; j < 32; ++j) xsum += xv[j];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    u32 ww[4] = {w[u][r].x, w[u][r].y, w[u][r].z, w[u][r].w};
                    float d = 0.f;
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        float q[8];
                        dec4(ww[j], q);
#pragma unroll
                        for (int t = 0; t < 8; ++t) d = fmaf(q[t], xv[8 * j + t], d);
                    }
                    acc[r] += s[u][r] * d + b[u][r] * xsum;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < n) out[r0 + r] = v;
    }
}

// x staged transposed in shared memory: value j of chunk c at j * chunks + c (lanes read consecutive words).
template <int ROWS, int U, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) ws4t(float* out, const float* __restrict__ x, const u32* __restrict__ packed,
                                                   const u16* __restrict__ sc, const u16* __restrict__ bi, int n, int k, int lg) {
    extern __shared__ float xs_sh[];
    for (int i = threadIdx.x; i < k; i += WARPS * 32) xs_sh[(i & 31) * (k >> 5) + (i >> 5)] = __ldg(x + i);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = (blockIdx.x * WARPS + warp) * ROWS;
    if (r0 >= n) return;
    const int chunks = k >> 5;
    const size_t words = (size_t)chunks * 4;
    const size_t gpr = (size_t)(k >> lg);
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
        uint4 w[U][ROWS];
        float s[U][ROWS], b[U][ROWS];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int c = c0 + 32 * u;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                int row = min(r0 + r, n - 1);
                if (c < chunks) {
                    w[u][r] = __ldg((const uint4*)(packed + row * words + (size_t)c * 4));
                    size_t g = row * gpr + (((size_t)c << 5) >> lg);
                    s[u][r] = bf(__ldg(sc + g));
                    b[u][r] = bf(__ldg(bi + g));
                } else {
                    w[u][r] = make_uint4(0, 0, 0, 0);
                    s[u][r] = 0.f; b[u][r] = 0.f;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int c = c0 + 32 * u;
            if (c < chunks) {
                // lane-rotated reads avoid bank conflicts: lane l reads chunk c (32 floats) starting at offset (l % 8)*4
                float xv[32];
#pragma unroll
                for (int j = 0; j < 32; ++j) xv[j] = xs_sh[j * chunks + c];
                float xsum = 0.f;
#pragma unroll
                for (int j = 0; j < 32; ++j) xsum += xv[j];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    u32 ww[4] = {w[u][r].x, w[u][r].y, w[u][r].z, w[u][r].w};
                    float d = 0.f;
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        float q[8];
                        dec4(ww[j], q);
#pragma unroll
                        for (int t = 0; t < 8; ++t) d = fmaf(q[t], xv[8 * j + t], d);
                    }
                    acc[r] += s[u][r] * d + b[u][r] * xsum;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < n) out[r0 + r] = v;
    }
}

// The current production kernel shape (v0): 4 rows per block of 4 warps splitting K, one chunk per lane per row.
template <int ROWS, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) cur4(float* out, const float* __restrict__ x, const u32* __restrict__ packed,
                                                   const u16* __restrict__ sc, const u16* __restrict__ bi, int n, int k, int lg) {
    __shared__ float red[WARPS][ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * ROWS;
    const int chunks = k >> 5;
    const size_t words = (size_t)chunks * 4;
    const size_t gpr = (size_t)(k >> lg);
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
    for (int c = threadIdx.x; c < chunks; c += 32 * WARPS) {
        uint4 w[ROWS];
        float s[ROWS], b[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            int row = min(r0 + r, n - 1);
            w[r] = __ldg((const uint4*)(packed + row * words + (size_t)c * 4));
            size_t g = row * gpr + (((size_t)c << 5) >> lg);
            s[r] = bf(sc[g]); b[r] = bf(bi[g]);
        }
        float xv[32];
        const float4* xp = (const float4*)(x + ((size_t)c << 5));
#pragma unroll
        for (int v = 0; v < 8; ++v) {
            float4 t = xp[v];
            xv[4 * v] = t.x; xv[4 * v + 1] = t.y; xv[4 * v + 2] = t.z; xv[4 * v + 3] = t.w;
        }
        float xs = 0.f;
#pragma unroll
        for (int j = 0; j < 32; ++j) xs += xv[j];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            u32 ww[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
            float d = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float q[8];
                dec4(ww[j], q);
#pragma unroll
                for (int t = 0; t < 8; ++t) d = fmaf(q[t], xv[8 * j + t], d);
            }
            acc[r] += s[r] * d + b[r] * xs;
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        float v = warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < ROWS && r0 + threadIdx.x < n) {
        float v = 0;
        for (int wi = 0; wi < WARPS; ++wi) v += red[wi][threadIdx.x];
        out[r0 + threadIdx.x] = v;
    }
}

__global__ void empty_k(float* p) { if (p && threadIdx.x == 9999) p[0] = 1; }
__global__ void copy_k(float4* dst, const float4* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}

typedef void (*Kern)(float*, const float*, const u32*, const u16*, const u16*, int, int, int);

struct Mat { u32* p; u16* s; u16* b; };

int main() {
    int dev = 0; cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, dev));
    printf("%s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    // copy bandwidth
    {
        size_t n = (size_t)1 << 28; float4 *a, *b; CK(cudaMalloc(&a, n * 16 / 4)); CK(cudaMalloc(&b, n * 16 / 4));
        size_t n4 = n / 4; cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
        copy_k<<<132 * 8, 512>>>(b, a, n4); cudaEventRecord(e0);
        for (int i = 0; i < 10; ++i) copy_k<<<132 * 8, 512>>>(b, a, n4);
        cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); float ms; cudaEventElapsedTime(&ms, e0, e1);
        printf("copy: %.2f TB/s (read+write)\n", 2.0 * n4 * 16 * 10 / (ms * 1e-3) / 1e12);
        cudaFree(a); cudaFree(b);
    }
    {
        cudaStream_t st; cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
        for (int i = 0; i < 100; ++i) empty_k<<<1, 32, 0, st>>>(nullptr);
        cudaStreamSynchronize(st);
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 10000; ++i) empty_k<<<1, 32, 0, st>>>(nullptr);
        auto t1 = std::chrono::steady_clock::now();
        cudaStreamSynchronize(st);
        auto t2 = std::chrono::steady_clock::now();
        printf("launch: host %.2f us/launch, device drain %.2f us/launch\n", std::chrono::duration<double, std::micro>(t1 - t0).count() / 1e4, std::chrono::duration<double, std::micro>(t2 - t0).count() / 1e4);
        void* p; auto t3 = std::chrono::steady_clock::now();
        for (int i = 0; i < 10000; ++i) { cudaMallocAsync(&p, 4096 + (i & 7) * 256, st); cudaFreeAsync(p, st); }
        auto t4 = std::chrono::steady_clock::now();
        printf("mallocAsync+freeAsync: %.2f us/pair\n", std::chrono::duration<double, std::micro>(t4 - t3).count() / 1e4);
    }
    struct Shape { int n, k; const char* name; } shapes[] = {
        {4096, 4096, "8B q/o 4096x4096"}, {14336, 4096, "8B gate/up 14336x4096"}, {4096, 14336, "8B down 4096x14336"},
        {128256, 4096, "8B head"}, {1024, 1024, "0.6B k/v 1024x1024 (wait: k/v 1024)"}, {3072, 1024, "0.6B gate 3072x1024"},
        {1024, 3072, "0.6B down 1024x3072"}, {151936, 1024, "0.6B head"}};
    const int lg = 6;
    for (auto& sh : shapes) {
        int n = sh.n, k = sh.k;
        size_t words = (size_t)n * k / 8, groups = (size_t)n * (k >> lg);
        size_t bytes = words * 4 + groups * 4;
        int copies = (int)std::max<size_t>(1, ((size_t)600 << 20) / bytes);
        std::vector<Mat> m(copies);
        std::vector<u32> hp(words); std::vector<u16> hs(groups), hb(groups);
        srand(1);
        for (auto& v : hp) v = (u32)rand() * 2654435761u ^ (u32)rand();
        for (size_t i = 0; i < groups; ++i) {
            float s = 0.01f + 0.02f * (rand() / (float)RAND_MAX), b = -8 * s;
            u32 su, bu; memcpy(&su, &s, 4); memcpy(&bu, &b, 4); hs[i] = su >> 16; hb[i] = bu >> 16;
        }
        for (auto& mm : m) {
            CK(cudaMalloc(&mm.p, words * 4)); CK(cudaMalloc(&mm.s, groups * 2)); CK(cudaMalloc(&mm.b, groups * 2));
            CK(cudaMemcpy(mm.p, hp.data(), words * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(mm.s, hs.data(), groups * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(mm.b, hb.data(), groups * 2, cudaMemcpyHostToDevice));
        }
        std::vector<float> hx(k); for (auto& v : hx) v = rand() / (float)RAND_MAX - 0.5f;
        float *x, *out, *ref; CK(cudaMalloc(&x, k * 4)); CK(cudaMalloc(&out, n * 4)); CK(cudaMalloc(&ref, n * 4));
        CK(cudaMemcpy(x, hx.data(), k * 4, cudaMemcpyHostToDevice));
        ref_gemv<<<(n + 3) / 4, 128>>>(ref, x, m[0].p, m[0].s, m[0].b, n, k, lg, 4);
        std::vector<float> href(n), hout(n); CK(cudaMemcpy(href.data(), ref, n * 4, cudaMemcpyDeviceToHost));
        printf("\n%s (%.1f MB, %d copies)\n", sh.name, bytes / 1e6, copies);
        struct V { const char* name; Kern f; int rows_per_block; int threads; int smem; } vs[] = {
            {"cur v0 4r x4w", cur4<4, 4>, 4, 128, 0},
            {"cur v2-like 4r x1w", cur4<4, 1>, 4, 32, 0},
            {"cur 8r x4w", cur4<8, 4>, 8, 128, 0},
            {"cur 8r x1w", cur4<8, 1>, 8, 32, 0},
            {"cur 8r x2w", cur4<8, 2>, 8, 64, 0},
            {"ws R4 U2 W4", ws4<4, 2, 4, 0>, 16, 128, 0},
            {"ws R8 U1 W4", ws4<8, 1, 4, 0>, 32, 128, 0},
            {"ws R8 U2 W4", ws4<8, 2, 4, 0>, 32, 128, 0},
            {"ws R8 U1 W2", ws4<8, 1, 2, 0>, 16, 64, 0},
            {"ws R16 U1 W2", ws4<16, 1, 2, 0>, 32, 64, 0},
            {"ws R8 U1 W1", ws4<8, 1, 1, 0>, 8, 32, 0},
            {"wss R4 U2 W8", ws4s<4, 2, 8>, 32, 256, 1},
            {"wss R8 U1 W4", ws4s<8, 1, 4>, 32, 128, 1},
            {"wss R8 U2 W4", ws4s<8, 2, 4>, 32, 128, 1},
            {"wss R8 U1 W8", ws4s<8, 1, 8>, 64, 256, 1},
            {"wst R4 U2 W8", ws4t<4, 2, 8>, 32, 256, 1},
            {"wst R8 U1 W4", ws4t<8, 1, 4>, 32, 128, 1},
            {"wst R8 U2 W4", ws4t<8, 2, 4>, 32, 128, 1},
            {"wst R8 U1 W8", ws4t<8, 1, 8>, 64, 256, 1},
            {"wst R16 U1 W4", ws4t<16, 1, 4>, 64, 128, 1},
        };
        for (auto& v : vs) {
            int grid = (n + v.rows_per_block - 1) / v.rows_per_block;
            int smem = v.smem ? k * 4 : 0;
            if (smem > 48 * 1024) CK(cudaFuncSetAttribute(v.f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            v.f<<<grid, v.threads, smem>>>(out, x, m[0].p, m[0].s, m[0].b, n, k, lg);
            CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hout.data(), out, n * 4, cudaMemcpyDeviceToHost));
            double md = 0, mr = 0;
            for (int i = 0; i < n; ++i) { md = std::max(md, (double)fabs(hout[i] - href[i])); mr = std::max(mr, (double)fabs(href[i])); }
            cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
            int reps = std::max(20, copies * 4);
            cudaEventRecord(e0);
            for (int i = 0; i < reps; ++i) { auto& mm = m[i % copies]; v.f<<<grid, v.threads, smem>>>(out, x, mm.p, mm.s, mm.b, n, k, lg); }
            cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); float ms; cudaEventElapsedTime(&ms, e0, e1);
            double us = ms * 1e3 / reps;
            printf("  %-22s %8.2f us  %6.2f TB/s  maxdiff %.2e (max|ref| %.2f)\n", v.name, us, bytes / (us * 1e-6) / 1e12, md, mr);
        }
        for (auto& mm : m) { cudaFree(mm.p); cudaFree(mm.s); cudaFree(mm.b); }
        cudaFree(x); cudaFree(out); cudaFree(ref);
    }
    return 0;
}
