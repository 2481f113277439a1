// Elementwise ops Gemma 4 needs, written as the CPU backend writes them (backends/cpu/gemma4.rs).

#define GEMMA4_GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// gelu_approx(g) * u: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u.
extern "C" __global__ void gelu_mul_f32(float* out, const float* g, const float* u, size_t n) {
    pdl_begin();
    GEMMA4_GRID_STRIDE(i, n) {
        float x = g[i];
        out[i] = 0.5f * x * (1.0f + tanhf(0.7978846f * (x + 0.044715f * (x * x * x)))) * u[i];
    }
}

// x * s.
extern "C" __global__ void scale_f32(float* out, const float* x, float s, size_t n) {
    pdl_begin();
    GEMMA4_GRID_STRIDE(i, n) out[i] = x[i] * s;
}

// tanh(x / cap) * cap.
extern "C" __global__ void softcap_f32(float* out, const float* x, float cap, size_t n) {
    pdl_begin();
    GEMMA4_GRID_STRIDE(i, n) out[i] = tanhf(x[i] / cap) * cap;
}
