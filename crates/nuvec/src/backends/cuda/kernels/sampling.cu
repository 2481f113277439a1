// ---- a categorical draw per row, certified against the host's (ops/sample.rs) ----
//
// Row r of x [rows, n]: weights w_i = exp((x_i - m) * s) in f64 (m the row's maximum, s =
// scales_uniforms[2 r]), the token the first i whose running sum passes u * total (u =
// scales_uniforms[2 r + 1]). The host computes the same weights but for exp's last bit and sums
// them in another order; with E = total (2^-50 + 8 n 2^-53) + n 1e-300, a target more than 3 E
// inside its token's interval is the host's token too (crate::backend::sample_row, the reference,
// says why). out[3 r .. 3 r + 2] = the token (the device's draw, certain or not; 0 when it found
// none), 1 if certain (else 0), 0.
//
// One block of SAMPLE_THREADS per row. The row is cut into segments of SAMPLE_SEG values (a warp
// each, 8 per lane, in order j * 32 + lane); warp 0 then scans the segments' sums (a range of
// segments per lane), the lane whose range holds the target finds its segment, and the warp walks
// that segment's values in order to the token.

#define SAMPLE_THREADS 512
#define SAMPLE_SEG 256
#define SAMPLE_MAX_SEGS 4096

// 2^-50 (crate::backend's SAMPLE_EXP_ROUNDING).
#define SAMPLE_EXP_ROUNDING 8.881784197001252e-16

// w_i of value v (the host's expression: v and m as f64, their difference times s, exp).
__device__ __forceinline__ double sample_weight(float v, double m, double s) {
    return exp(((double)v - m) * s);
}

__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

// Inclusive prefix sums over the warp's lanes.
__device__ __forceinline__ double warp_scan_f64(double v) {
    const int lane = threadIdx.x & 31;
    for (int o = 1; o < 32; o <<= 1) {
        const double t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    return v;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_rows_f32(u32* out, const float* x, int n, const double* scales_uniforms) {
    pdl_begin();
    __shared__ double seg_sum[SAMPLE_MAX_SEGS];
    __shared__ float scratch[33];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float* row = x + (size_t)blockIdx.x * n;
    u32* o = out + 3 * (size_t)blockIdx.x;
    const double s = scales_uniforms[2 * (size_t)blockIdx.x], u = scales_uniforms[2 * (size_t)blockIdx.x + 1];
    const int segs = (n + SAMPLE_SEG - 1) / SAMPLE_SEG;
    // The same for every thread: the whole block leaves together.
    if (s == 0.0 || !(s > 0.0 && s < 3.5e38 && u >= 0.0 && u < 1.0) || segs > SAMPLE_MAX_SEGS) {
        if (threadIdx.x == 0) o[0] = o[1] = o[2] = 0;
        return;
    }
    float top = NEG_INF;
    int bad = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = row[i];
        bad |= !(v == v) || v == -NEG_INF;  // a NaN or +inf
        top = fmaxf(top, v);
    }
    bad = __syncthreads_or(bad);
    top = block_max(top, scratch);
    if (bad || !(top > NEG_INF)) {
        if (threadIdx.x == 0) o[0] = o[1] = o[2] = 0;
        return;
    }
    const double m = (double)top;
    for (int g = warp; g < segs; g += warps) {
        double sum = 0.0;
        for (int j = 0; j < SAMPLE_SEG / 32; ++j) {
            const int i = g * SAMPLE_SEG + j * 32 + lane;
            if (i < n) sum += sample_weight(row[i], m, s);
        }
        sum = warp_sum_f64(sum);
        if (lane == 0) seg_sum[g] = sum;
    }
    __syncthreads();
    if (warp != 0) return;
    // Lane l's range of segments, its sum, and the sums before and through it.
    const int per = (segs + 31) / 32, lo = min(segs, lane * per), hi = min(segs, lo + per);
    double mine = 0.0;
    for (int g = lo; g < hi; ++g) mine += seg_sum[g];
    const double through = warp_scan_f64(mine);
    double before = __shfl_up_sync(0xffffffffu, through, 1);
    if (lane == 0) before = 0.0;
    const double total = __shfl_sync(0xffffffffu, through, 31);
    const double bound = total * (SAMPLE_EXP_ROUNDING + 8.0 * (double)n * 1.1102230246251565e-16) + (double)n * 1e-300;
    const double target = u * total;
    const unsigned passed = __ballot_sync(0xffffffffu, through > target);
    int seg = -1;
    double below = 0.0;
    if (passed) {
        const int holder = __ffs(passed) - 1;
        if (lane == holder) {
            below = before;
            for (int g = lo; g < hi; ++g) {
                if (below + seg_sum[g] > target) {
                    seg = g;
                    break;
                }
                below += seg_sum[g];
            }
        }
        seg = __shfl_sync(0xffffffffu, seg, holder);
        below = __shfl_sync(0xffffffffu, below, holder);
    }
    int token = -1;
    double lower = 0.0, upper = 0.0;
    for (int j = 0; seg >= 0 && j < SAMPLE_SEG / 32; ++j) {
        const int i = seg * SAMPLE_SEG + j * 32 + lane;
        const double w = i < n ? sample_weight(row[i], m, s) : 0.0;
        const double upto = warp_scan_f64(w);
        const unsigned hit = __ballot_sync(0xffffffffu, below + upto > target);
        if (hit) {
            const int k = __ffs(hit) - 1;
            const double up_k = __shfl_sync(0xffffffffu, upto, k);
            double before_k = __shfl_up_sync(0xffffffffu, upto, 1);
            before_k = __shfl_sync(0xffffffffu, lane == 0 ? 0.0 : before_k, k);
            token = seg * SAMPLE_SEG + j * 32 + k;
            lower = below + before_k;
            upper = below + up_k;
            break;
        }
        below += __shfl_sync(0xffffffffu, upto, 31);
    }
    if (lane == 0) {
        const bool certain = token >= 0 && token < n && target - lower > 3.0 * bound && upper - target > 3.0 * bound;
        o[0] = token >= 0 ? (u32)token : 0u;
        o[1] = certain ? 1u : 0u;
        o[2] = 0;
    }
}
