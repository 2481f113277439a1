// Quantized keys and values of a paged cache on the device: rows of `width` values (a position's
// heads, one after another) in MLX's affine format along the row, groups of `gs` (32, 64 or 128)
// values of `bits` (2-6 or 8) packed LSB-first into 32-bit words, one f32 scale and bias per
// group. The arithmetic is the host's (`nuvec::quantize::quantize_affine`, `dequantize_rows`)
// operation for operation, with no contraction into fused multiply-adds, so the device's rows
// are the host's bit for bit.

#define KVQ_WARPS 4
#define KVQ_MOST_GROUP 128

// The codes of one group, as the host's quantize_affine makes them: every lane of the warp holds
// the group's scale and bias; lane l's values are x[l + 32 i].
__device__ __forceinline__ void kvq_group(const float* x, int gs, float n_bins, unsigned char* codes, float* scale_out,
                                          float* bias_out) {
    const int lane = threadIdx.x & 31;
    float hi = NEG_INF, lo = -NEG_INF;
    for (int i = lane; i < gs; i += 32) {
        hi = fmaxf(hi, x[i]);
        lo = fminf(lo, x[i]);
    }
    for (int o = 16; o > 0; o >>= 1) {
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    }
    const bool min_wins = fabsf(lo) > fabsf(hi);
    float scale = fmaxf(__fdiv_rn(__fsub_rn(hi, lo), n_bins), 1e-7f);
    if (!min_wins) scale = -scale;
    const float edge = min_wins ? lo : hi;
    const float q0 = rintf(__fdiv_rn(edge, scale));
    float bias = 0.0f;
    if (q0 != 0.0f) {
        scale = __fdiv_rn(edge, q0);
        bias = edge;
    }
    for (int i = lane; i < gs; i += 32) {
        const float q = rintf(__fdiv_rn(__fsub_rn(x[i], bias), scale));
        // fmaxf turns NaN into 0, as the host's saturating cast does.
        codes[i] = (unsigned char)fminf(fmaxf(q, 0.0f), n_bins);
    }
    *scale_out = scale;
    *bias_out = bias;
}

// Word j of a group's codes packed LSB-first, `bits` each: stream bits 32 j .. 32 j + 31.
__device__ __forceinline__ u32 kvq_word(const unsigned char* codes, int j, int bits) {
    u32 w = 0;
    const int first = (32 * j) / bits, last = (32 * j + 31) / bits;
    for (int c = first; c <= last; ++c) {
        const int at = c * bits - 32 * j;
        const u32 v = codes[c];
        w |= at >= 0 ? v << at : v >> -at;
    }
    return w;
}

// rows [n, width] (f32), row i into row slots[i] of words [*, width * bits / 32], scales and
// biases [*, width / gs]. Grid (n), KVQ_WARPS warps: warp w takes groups w, w + KVQ_WARPS, ... of
// its row.
extern "C" __global__ void kv_quantize_rows_f32(const float* rows, const int* slots, u32* words, float* scales,
                                                float* biases, int width, int bits, int gs) {
    pdl_begin();
    __shared__ unsigned char codes[KVQ_WARPS][KVQ_MOST_GROUP];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t i = blockIdx.x, r = (size_t)slots[i];
    const int groups = width / gs, group_words = gs * bits / 32;
    const float n_bins = (float)((1u << bits) - 1u);
    for (int g = warp; g < groups; g += KVQ_WARPS) {
        float s, b;
        kvq_group(rows + i * width + (size_t)g * gs, gs, n_bins, codes[warp], &s, &b);
        __syncwarp();
        for (int j = lane; j < group_words; j += 32)
            words[r * (width / 32 * bits) + (size_t)g * group_words + j] = kvq_word(codes[warp], j, bits);
        if (lane == 0) {
            scales[r * groups + g] = s;
            biases[r * groups + g] = b;
        }
        __syncwarp();
    }
}

// Sequence positions from .. from + n of the store whose blocks are `table` (position p at
// physical row table[p / block_size] * block_size + p % block_size), dequantized to f32
// [heads, n, dim] as the host's dequantize_rows gives them (scale * code + bias, rounded twice).
// Grid (n, heads), threads over the head's values.
extern "C" __global__ void kv_dequantize_paged_f32(float* out, const u32* words, const float* scales,
                                                   const float* biases, const int* table, int block_size, int from,
                                                   int n, int heads, int dim, int bits, int gs) {
    pdl_begin();
    const int i = blockIdx.x, h = blockIdx.y;
    const int p = from + i;
    const size_t row = (size_t)table[p / block_size] * block_size + p % block_size;
    const int width = heads * dim;
    const u32* w = words + row * (width / 32 * bits);
    const u32 mask = (1u << bits) - 1u;
    float* o = out + ((size_t)h * n + i) * dim;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        const int idx = h * dim + c, bit = idx * bits, off = bit & 31;
        u32 v = w[bit >> 5] >> off;
        if (off + bits > 32) v |= w[(bit >> 5) + 1] << (32 - off);
        v &= mask;
        const size_t g = row * (width / gs) + idx / gs;
        o[c] = __fadd_rn(__fmul_rn(scales[g], (float)v), biases[g]);
    }
}
