// Gated DeltaNet (the linear-attention layers of Qwen3.5 hybrids), written as the CPU backend
// computes it (backends/cpu/gated_delta.rs): f32 activations and accumulation, weights f32, f16
// or bf16 (dtype codes of common.cuh).

#define GD_GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float gd_silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float gd_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// MLX's softplus, logaddexp(x, 0).
__device__ __forceinline__ float gd_softplus(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

// Depthwise causal convolution with SiLU. `in = state ++ x` ([keep + L, C], keep = K - 1):
// out[t, c] = silu(sum_j w[c, j] * in[t + j, c]) for t < L, and next = in's last `keep` rows.
// One thread per element of out, then of next.
extern "C" __global__ void conv1d_silu_f32(float* out, float* next, const float* x, const float* state,
                                           const void* w, int w_dt, long long l, long long c, int keep) {
    pdl_begin();
    const size_t n_out = (size_t)(l * c), n = n_out + (size_t)keep * c;
    const int taps = keep + 1;
    GD_GRID_STRIDE(i, n) {
        size_t t = i / c, ch = i % c;
        if (i < n_out) {
            float acc = 0.0f;
            for (int j = 0; j < taps; ++j) {
                size_t r = t + j;  // row of `in`
                float v = r < (size_t)keep ? state[r * c + ch] : x[(r - keep) * c + ch];
                acc = fmaf(load_float(w, ch * taps + j, w_dt), v, acc);
            }
            out[i] = gd_silu(acc);
        } else {
            size_t r = (size_t)l + (t - l);  // next's row t - l is in's row l + (t - l)
            next[i - n_out] = r < (size_t)keep ? state[r * c + ch] : x[(r - keep) * c + ch];
        }
    }
}

// x * sigmoid(gate).
extern "C" __global__ void sigmoid_mul_f32(float* out, const float* gate, const float* x, size_t n) {
    pdl_begin();
    GD_GRID_STRIDE(i, n) out[i] = x[i] * gd_sigmoid(gate[i]);
}

// ---- The gated delta rule ----
//
// mixed [L, 2*Hk*Dk + Hv*Dv] (queries, keys, values), a, b [L, Hv], a_log, dt_bias [Hv],
// state [Hv, Dv, Dk] -> y [L, Hv, Dv], next [Hv, Dv, Dk]. a_log and dt_bias have dtype codes of
// their own (mlx-lm's conversions keep A_log in f32 next to a bf16 dt_bias).
//
// The rows of a head's state never interact: row r only reads v[r]. So each warp owns GD_ROWS
// rows of one value head (held in registers, lane c keeping features c, c + 32, ...) and walks
// the L positions in order on its own: it normalizes the position's query and key (warp sums),
// computes the decay and write strength, then per row decays, reads the memory along k, moves it
// towards v by beta, and reads the output along q. Grid (Hv, ceil(Dv / (GD_WARPS * GD_ROWS))).

#define GD_WARPS 4
#define GD_ROWS 4
#define GD_SLOTS 8  // features per lane: Dk <= 32 * GD_SLOTS = 256

extern "C" __global__ void __launch_bounds__(32 * GD_WARPS)
    gated_delta_f32(float* y, float* next, const float* mixed, const float* a, const float* b, const void* a_log,
                    const void* dt_bias, int alog_dt, int bias_dt, const float* state, int l, int hk, int hv, int dk, int dv,
                    float eps, float q_scale, float k_scale) {
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.x, kh = h / (hv / hk);
    const int r0 = (blockIdx.y * GD_WARPS + warp) * GD_ROWS;
    if (r0 >= dv) return;  // no block-wide synchronization below
    const size_t width = (size_t)2 * hk * dk + (size_t)hv * dv;
    float s[GD_ROWS][GD_SLOTS];
#pragma unroll
    for (int i = 0; i < GD_ROWS; ++i) {
        const int r = r0 + i;
#pragma unroll
        for (int j = 0; j < GD_SLOTS; ++j) {
            const int c = lane + 32 * j;
            s[i][j] = (r < dv && c < dk) ? state[((size_t)h * dv + r) * dk + c] : 0.0f;
        }
    }
    const float decay = expf(load_float(a_log, h, alog_dt));
    const float bias = load_float(dt_bias, h, bias_dt);
    for (int t = 0; t < l; ++t) {
        const float* row = mixed + (size_t)t * width;
        const float* qv = row + (size_t)kh * dk;
        const float* kv = row + (size_t)hk * dk + (size_t)kh * dk;
        const float* vv = row + (size_t)2 * hk * dk + (size_t)h * dv;
        float q[GD_SLOTS], k[GD_SLOTS];
        float qq = 0.0f, kk = 0.0f;
#pragma unroll
        for (int j = 0; j < GD_SLOTS; ++j) {
            const int c = lane + 32 * j;
            q[j] = c < dk ? qv[c] : 0.0f;
            k[j] = c < dk ? kv[c] : 0.0f;
            qq = fmaf(q[j], q[j], qq);
            kk = fmaf(k[j], k[j], kk);
        }
        // mlx-lm's normalize_qk: rms_norm with eps 1e-6 / Dk, then 1 / Dk and 1 / sqrt(Dk).
        const float qi = 1.0f / sqrtf(warp_sum(qq) / (float)dk + eps);
        const float ki = 1.0f / sqrtf(warp_sum(kk) / (float)dk + eps);
#pragma unroll
        for (int j = 0; j < GD_SLOTS; ++j) {
            q[j] = q_scale * (q[j] * qi);
            k[j] = k_scale * (k[j] * ki);
        }
        const float g = expf(-decay * gd_softplus(a[(size_t)t * hv + h] + bias));
        const float beta = gd_sigmoid(b[(size_t)t * hv + h]);
        float* yt = y + ((size_t)t * hv + h) * dv;
#pragma unroll
        for (int i = 0; i < GD_ROWS; ++i) {
            const int r = r0 + i;
            if (r >= dv) break;  // the same for every lane
            float mem = 0.0f;
#pragma unroll
            for (int j = 0; j < GD_SLOTS; ++j) {
                s[i][j] *= g;
                mem = fmaf(s[i][j], k[j], mem);
            }
            const float delta = (vv[r] - warp_sum(mem)) * beta;
            float o = 0.0f;
#pragma unroll
            for (int j = 0; j < GD_SLOTS; ++j) {
                s[i][j] = fmaf(k[j], delta, s[i][j]);
                o = fmaf(s[i][j], q[j], o);
            }
            o = warp_sum(o);
            if (lane == 0) yt[r] = o;
        }
    }
#pragma unroll
    for (int i = 0; i < GD_ROWS; ++i) {
        const int r = r0 + i;
#pragma unroll
        for (int j = 0; j < GD_SLOTS; ++j) {
            const int c = lane + 32 * j;
            if (r < dv && c < dk) next[((size_t)h * dv + r) * dk + c] = s[i][j];
        }
    }
}
