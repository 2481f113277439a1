// Causal scaled-dot-product attention with grouped KV heads, f32 throughout.
// q [L, Hq, D]; k, v [Hkv, cap, D] (first kv_len positions valid); out [L, Hq * D].
// Query t sits at position kv_len - L + t and sees keys 0..=that position.
//
// One block per (head, query). Keys go by in chunks of blockDim.x: each thread scores one key,
// the chunk's softmax weights (online, with a running maximum and sum) land in shared memory, and
// thread c accumulates output features c, c + blockDim.x, ... over the chunk.

#define ATTN_MAX_ACC 4

extern "C" __global__ void attention_f32(float* out, const float* q, const float* k, const float* v, int l, int hq,
                                         int hkv, int d, int cap, int kv_len, float scale) {
    extern __shared__ float smem[];
    float* qs = smem;            // d floats
    float* ps = smem + d;        // blockDim.x floats
    float* red = ps + blockDim.x;  // 33 floats
    int h = blockIdx.x, t = blockIdx.y;
    int kvh = h / (hq / hkv);
    int n = kv_len - l + t + 1;
    const float* qv = q + ((size_t)t * hq + h) * d;
    const float* keys = k + (size_t)kvh * cap * d;
    const float* vals = v + (size_t)kvh * cap * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = qv[c];
    __syncthreads();
    float acc[ATTN_MAX_ACC];
#pragma unroll
    for (int i = 0; i < ATTN_MAX_ACC; ++i) acc[i] = 0.0f;
    float run_max = NEG_INF, run_sum = 0.0f;
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
        int j = j0 + threadIdx.x;
        float s = NEG_INF;
        if (j < n) {
            const float* kr = keys + (size_t)j * d;
            float dot = 0.0f;
            for (int c = 0; c < d; ++c) dot = fmaf(qs[c], kr[c], dot);
            s = dot * scale;
        }
        float cmax = block_max(s, red);
        float new_max = fmaxf(run_max, cmax);
        float p = j < n ? expf(s - new_max) : 0.0f;
        ps[threadIdx.x] = p;
        float psum = block_sum(p, red);  // also orders the ps writes before the reads below
        float corr = expf(run_max - new_max);
        run_sum = run_sum * corr + psum;
        run_max = new_max;
        int cnt = min((int)blockDim.x, n - j0);
#pragma unroll
        for (int i = 0; i < ATTN_MAX_ACC; ++i) {
            int c = threadIdx.x + i * blockDim.x;
            if (c < d) {
                float a = acc[i] * corr;
                const float* vr = vals + (size_t)j0 * d + c;
                for (int jj = 0; jj < cnt; ++jj) a = fmaf(ps[jj], vr[(size_t)jj * d], a);
                acc[i] = a;
            }
        }
        __syncthreads();  // ps is rewritten by the next chunk
    }
    float inv = 1.0f / run_sum;
    float* o = out + ((size_t)t * hq + h) * d;
#pragma unroll
    for (int i = 0; i < ATTN_MAX_ACC; ++i) {
        int c = threadIdx.x + i * blockDim.x;
        if (c < d) o[c] = acc[i] * inv;
    }
}
