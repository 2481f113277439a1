// gpt-oss's elementwise expert activation, as the CPU backend writes it (backends/cpu/gpt_oss.rs).
// Its attention sinks are an argument of the attention kernels (attention.cu).

// mlx-lm's swiglu_oai: g = min(gate, limit), u = clip(up, -limit, limit),
// (u + 1) * g * sigmoid(alpha * g). A NaN gate gives `limit` (as Rust's f32::min), a NaN up
// stays NaN (as f32::clamp).
extern "C" __global__ void swiglu_oai_f32(float* out, const float* gate, const float* up, float alpha, float limit,
                                          size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = fminf(gate[i], limit);
        float u = up[i];
        u = u < -limit ? -limit : (u > limit ? limit : u);
        const float sig = 1.0f / (1.0f + expf(-(alpha * g)));
        out[i] = (u + 1.0f) * (g * sig);
    }
}
