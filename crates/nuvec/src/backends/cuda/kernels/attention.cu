// Causal scaled-dot-product attention with grouped KV heads, in f32 over keys and values kept in
// f32, f16 or bf16 (`kv_dt`: each value widened to f32 as it is read).
// q [L, Hq, D]; k, v [Hkv, cap, D] (first kv_len positions valid); out [L, Hq * D].
// Query t sits at position kv_len - L + t and sees keys 0..=that position.
// `sinks` (null for plain attention) gives one logit per query head (gpt-oss's attention sinks)
// that joins each softmax's denominator as it is (not scaled) and adds no value.
//
// One block per (head, query). Keys go by in chunks of blockDim.x: each thread scores one key,
// the chunk's softmax weights (online, with a running maximum and sum) land in shared memory, and
// thread c accumulates output features c, c + blockDim.x, ... over the chunk.

#define ATTN_MAX_ACC 4

extern "C" __global__ void attention_f32(float* out, const float* q, const void* k, const void* v, int l, int hq,
                                         int hkv, int d, int cap, int kv_len, float scale, const float* sinks,
                                         int kv_dt) {
    pdl_begin();
    extern __shared__ float smem[];
    float* qs = smem;            // d floats
    float* ps = smem + d;        // blockDim.x floats
    float* red = ps + blockDim.x;  // 33 floats
    int h = blockIdx.x, t = blockIdx.y;
    int kvh = h / (hq / hkv);
    int n = kv_len - l + t + 1;
    const float* qv = q + ((size_t)t * hq + h) * d;
    const size_t head = (size_t)kvh * cap * d;  // where this KV head's rows start, in values
    for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = qv[c];
    __syncthreads();
    float acc[ATTN_MAX_ACC];
#pragma unroll
    for (int i = 0; i < ATTN_MAX_ACC; ++i) acc[i] = 0.0f;
    // A sink starts the online softmax as one more term of weight exp(sink) and value 0.
    float run_max = sinks ? sinks[h] : NEG_INF, run_sum = sinks ? 1.0f : 0.0f;
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
        int j = j0 + threadIdx.x;
        float s = NEG_INF;
        if (j < n) {
            const size_t kr = head + (size_t)j * d;
            float dot = 0.0f;
            for (int c = 0; c < d; ++c) dot = fmaf(qs[c], load_float(k, kr + c, kv_dt), dot);
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
                const size_t vr = head + (size_t)j0 * d + c;
                for (int jj = 0; jj < cnt; ++jj) a = fmaf(ps[jj], load_float(v, vr + (size_t)jj * d, kv_dt), a);
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

// ---- Split-key attention (issue 7, speed) ----
//
// For head sizes that are a multiple of 4 (up to 512). Grid (Hq, L, S): block (h, t, s) handles
// keys [s * chunk, min((s + 1) * chunk, n_t)) of query t, head h. Each of its warps takes every
// ATTS_WARPS-th key: the warp reads the key row with 16-byte loads (lane c holds features
// 4c..4c+3, then 128 + 4c.., ...), reduces the dot product by shuffles, and keeps an online softmax
// (running maximum, sum and weighted values). The warps' states are combined in shared memory and
// written as a partial (max, sum, values[D]); attention_merge_f32 combines the S partials (and
// the sink of the head, when `sinks` is not null).
// Keys are read coalesced, and with S > 1 a short decode step still fills the GPU.
//
// CUDA graphs: with `step` (null in eager launches) the kv length is kv_len + step[0] (positions
// since the captured step) and the chunk is recomputed from it by the host's rule,
// max(ceil(kv_len / want), 32); the grid then has as many splits as the largest kv length needs
// (`want`), and the splits past the last key write an empty partial (maximum -inf, sum 0) that
// attention_merge_f32 skips, so the result is the eager launch's, bit for bit. With `ring` (a
// rotating cache: every slot of a full ring is a key, in any order) the kv length stops at cap.

#define ATTS_WARPS 4
#define ATTS_SLOTS 4  // float4 slots per lane: D <= 32 * 4 * ATTS_SLOTS = 512
// The keys [j_begin, j_end) that split s of query t attends, with the step scalars' delta added
// to kv_len (and the chunk taken by the host's rule on the device) when `step` is set (CUDA
// graphs). atts_body and atts_prefetch both take their range here.
__device__ __forceinline__ void atts_keys(int l, int t, int s, int kv_len, int chunk, const int* step, int want,
                                          int ring_cap, int& j_begin, int& j_end) {
    if (step) {
        kv_len += step[0];
        if (ring_cap > 0) kv_len = min(kv_len, ring_cap);
        chunk = max((kv_len + want - 1) / want, 32);
    }
    j_begin = s * chunk;
    j_end = min(kv_len - l + t + 1, j_begin + chunk);
}

// The body for head sizes up to 128 * SLOTS. A warp takes its keys KB at a time (4 / SLOTS rows
// of f32, twice as many of f16 or bf16: the same bytes): their rows' loads are in flight
// together, and the running maximum and sum move once per group (a key at a time, a 512-key
// decode step spent 11.5 us on the H200 mostly waiting on each key's loads in turn). The rows held
// take the registers one key of D = 512 did (8 f32 keys per group for D = 128 measured even:
// eleventh session).
// How a cache's values are read, 4 at a time: f32 rows as float4 (16 bytes), f16 and bf16 rows
// as uint2 (8 bytes), each widened to f32 where it is used.
struct F32Kv {
    typedef float4 raw;
    static __device__ __forceinline__ float4 widen(float4 r) { return r; }
};
template <int DT>
struct HalfKv {
    typedef uint2 raw;
    static __device__ __forceinline__ float4 widen(uint2 r) {
        if (DT == DT_F16)
            return make_float4(f16_to_f32((u16)(r.x & 0xffffu)), f16_to_f32((u16)(r.x >> 16)),
                               f16_to_f32((u16)(r.y & 0xffffu)), f16_to_f32((u16)(r.y >> 16)));
        return make_float4(__uint_as_float(r.x << 16), __uint_as_float(r.x & 0xffff0000u),
                           __uint_as_float(r.y << 16), __uint_as_float(r.y & 0xffff0000u));
    }
};
// Where key and value row j of one KV head are: consecutive rows of a [Hkv, capacity, D] cache,
// or (PagedRows) the rows of a paged store [blocks * block_size, Hkv * D] through a block table;
// in units of 4 values.
template <class E>
struct ContigRows {
    typedef E Kv;
    const typename E::raw* keys;
    const typename E::raw* vals;
    int d4;
    __device__ __forceinline__ const typename E::raw* key(int j) const { return keys + (size_t)j * d4; }
    __device__ __forceinline__ const typename E::raw* val(int j) const { return vals + (size_t)j * d4; }
    __device__ __forceinline__ typename E::raw load_key(int j, int c) const { return key(j)[c]; }
    __device__ __forceinline__ typename E::raw load_val(int j, int c) const { return val(j)[c]; }
};
template <class E>
struct PagedRows {
    typedef E Kv;
    const typename E::raw* k;
    const typename E::raw* v;
    const int* table;
    int block_size, width4, head4;
    __device__ __forceinline__ size_t at(int j) const {
        return ((size_t)table[j / block_size] * block_size + j % block_size) * width4 + head4;
    }
    __device__ __forceinline__ const typename E::raw* key(int j) const { return k + at(j); }
    __device__ __forceinline__ const typename E::raw* val(int j) const { return v + at(j); }
    __device__ __forceinline__ typename E::raw load_key(int j, int c) const { return key(j)[c]; }
    __device__ __forceinline__ typename E::raw load_val(int j, int c) const { return val(j)[c]; }
    // The rows of KV head kvh (heads of 4 * d4 values) of the sequence whose blocks are seq_table.
    __device__ __forceinline__ PagedRows of(const int* seq_table, int kvh, int d4) const {
        PagedRows r = *this;
        r.table = seq_table;
        r.head4 = kvh * d4;
        return r;
    }
};
// Keys and values quantized to BITS (4 or 8) as kv_quant.cu stores them: row r holds
// `width` values in words [r, width * BITS / 32] and one scale and bias per group of gs
// [r, width / gs]. A lane's 4 values are one 32-bit word (8 bits) or half of one (4 bits), within
// one group (gs a multiple of 4), widened as kv_dequantize_paged_f32 writes them (scale * code +
// bias, each rounded), so attention over them is attention over those f32 values bit for bit.
struct QuantRaw {
    u32 codes;
    float scale, bias;
};
template <int BITS>
struct QuantKv {
    typedef QuantRaw raw;
    static __device__ __forceinline__ float4 widen(QuantRaw r) {
        const u32 m = (1u << BITS) - 1u;
        return make_float4(__fadd_rn(__fmul_rn(r.scale, (float)(r.codes & m)), r.bias),
                           __fadd_rn(__fmul_rn(r.scale, (float)((r.codes >> BITS) & m)), r.bias),
                           __fadd_rn(__fmul_rn(r.scale, (float)((r.codes >> (2 * BITS)) & m)), r.bias),
                           __fadd_rn(__fmul_rn(r.scale, (float)((r.codes >> (3 * BITS)) & m)), r.bias));
    }
};
template <int BITS>
struct QuantPagedRows {
    typedef QuantKv<BITS> Kv;
    const u32* kw;
    const float* ks;
    const float* kb;
    const u32* vw;
    const float* vs;
    const float* vb;
    const int* table;
    int block_size, width, head, gs;
    __device__ __forceinline__ QuantRaw load(const u32* w, const float* s, const float* b, int j, int c) const {
        const size_t row = (size_t)table[j / block_size] * block_size + j % block_size;
        const int idx = head + 4 * c, bit = idx * BITS;
        const u32 word = w[row * (size_t)(width / 32 * BITS) + (bit >> 5)];
        const size_t g = row * (size_t)(width / gs) + idx / gs;
        return QuantRaw{BITS == 8 ? word : word >> (bit & 31), s[g], b[g]};
    }
    __device__ __forceinline__ QuantRaw load_key(int j, int c) const { return load(kw, ks, kb, j, c); }
    __device__ __forceinline__ QuantRaw load_val(int j, int c) const { return load(vw, vs, vb, j, c); }
    __device__ __forceinline__ QuantPagedRows of(const int* seq_table, int kvh, int d4) const {
        QuantPagedRows r = *this;
        r.table = seq_table;
        r.head = kvh * 4 * d4;
        return r;
    }
};

// The warps' states (running maximum, sum and values of their keys) combined into one split's
// partial (max, sum, values[D]) at pv; the shared arrays are free again when it returns.
template <int SLOTS>
__device__ __forceinline__ void atts_merge(float* pv, const float4 (&acc)[SLOTS], float run_m, float run_l, int d4,
                                           float* sm_m, float* sm_l, float4 (*sm_acc)[32 * ATTS_SLOTS]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sm_m[warp] = run_m; sm_l[warp] = run_l; }
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
        int c = lane + 32 * i;
        if (c < d4) sm_acc[warp][c] = acc[i];
    }
    __syncthreads();
    float m = NEG_INF;
#pragma unroll
    for (int w = 0; w < ATTS_WARPS; ++w) m = fmaxf(m, sm_m[w]);
    float wts[ATTS_WARPS], tot = 0.0f;
#pragma unroll
    for (int w = 0; w < ATTS_WARPS; ++w) {
        wts[w] = sm_m[w] == NEG_INF ? 0.0f : expf(sm_m[w] - m);
        tot += sm_l[w] * wts[w];
    }
    if (threadIdx.x == 0) { pv[0] = m; pv[1] = tot; }
    for (int c = threadIdx.x; c < d4; c += blockDim.x) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < ATTS_WARPS; ++w) {
            float4 b = sm_acc[w][c];
            a.x = fmaf(wts[w], b.x, a.x); a.y = fmaf(wts[w], b.y, a.y);
            a.z = fmaf(wts[w], b.z, a.z); a.w = fmaf(wts[w], b.w, a.w);
        }
        pv[2 + 4 * c] = a.x; pv[3 + 4 * c] = a.y; pv[4 + 4 * c] = a.z; pv[5 + 4 * c] = a.w;
    }
    __syncthreads();
}

// One split's partial (max, sum, values[D]) into `pv`: query `qv` over key rows [j_begin, j_end).
template <int SLOTS, class Rows>
__device__ __forceinline__ void atts_core(float* pv, const float4* qv, Rows rows, int d, float scale, int j_begin,
                                          int j_end, float* sm_m, float* sm_l, float4 (*sm_acc)[32 * ATTS_SLOTS]) {
    typedef typename Rows::Kv Kv;
    typedef typename Kv::raw Raw;
    constexpr int KB = 4 / SLOTS * (int)(sizeof(float4) / sizeof(Raw));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int d4 = d >> 2;
    float4 qr[SLOTS], acc[SLOTS];
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
        int c = lane + 32 * i;
        float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
        qr[i] = c < d4 ? qv[c] : z;
        qr[i].x *= scale; qr[i].y *= scale; qr[i].z *= scale; qr[i].w *= scale;
        acc[i] = z;
    }
    float run_m = NEG_INF, run_l = 0.0f;
    // This warp's keys are j_begin + warp + ATTS_WARPS * i; a group is KB consecutive i.
    for (int j0 = j_begin + warp; j0 < j_end; j0 += ATTS_WARPS * KB) {
        Raw kk[KB][SLOTS], vv[KB][SLOTS];
#pragma unroll
        for (int b = 0; b < KB; ++b) {
            const int j = j0 + ATTS_WARPS * b;
            // Past the end no row is addressed (a paged table has no entry there).
#pragma unroll
            for (int i = 0; i < SLOTS; ++i) {
                int c = lane + 32 * i;
                if (j < j_end && c < d4) {
                    kk[b][i] = rows.load_key(j, c);
                    vv[b][i] = rows.load_val(j, c);
                } else {
                    kk[b][i] = vv[b][i] = Raw{};
                }
            }
        }
        float sc[KB];
        float gm = run_m;
#pragma unroll
        for (int b = 0; b < KB; ++b) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < SLOTS; ++i) {
                int c = lane + 32 * i;
                if (c < d4) {
                    const float4 kf = Kv::widen(kk[b][i]);
                    dot = fmaf(qr[i].x, kf.x, dot); dot = fmaf(qr[i].y, kf.y, dot);
                    dot = fmaf(qr[i].z, kf.z, dot); dot = fmaf(qr[i].w, kf.w, dot);
                }
            }
            dot = warp_sum(dot);  // every lane takes part: j is the same across the warp
            sc[b] = j0 + ATTS_WARPS * b < j_end ? dot : NEG_INF;
            gm = fmaxf(gm, sc[b]);
        }
        // The group's first key exists, so gm is a score (run_m = -inf on the first group:
        // exp(-inf) = 0); keys past the end weigh exp(-inf) = 0.
        float corr = expf(run_m - gm);
        run_l *= corr;
#pragma unroll
        for (int i = 0; i < SLOTS; ++i) {
            acc[i].x *= corr; acc[i].y *= corr; acc[i].z *= corr; acc[i].w *= corr;
        }
#pragma unroll
        for (int b = 0; b < KB; ++b) {
            if (j0 + ATTS_WARPS * b >= j_end) break;
            float p = expf(sc[b] - gm);
            run_l += p;
#pragma unroll
            for (int i = 0; i < SLOTS; ++i) {
                int c = lane + 32 * i;
                if (c < d4) {
                    const float4 vf = Kv::widen(vv[b][i]);
                    acc[i].x = fmaf(p, vf.x, acc[i].x); acc[i].y = fmaf(p, vf.y, acc[i].y);
                    acc[i].z = fmaf(p, vf.z, acc[i].z); acc[i].w = fmaf(p, vf.w, acc[i].w);
                }
            }
        }
        run_m = gm;
    }
    atts_merge<SLOTS>(pv, acc, run_m, run_l, d4, sm_m, sm_l, sm_acc);
}

// The head-size dispatch of one split, over rows of the cache's element type E.
template <class Rows>
__device__ __forceinline__ void atts_sized(float* pv, const float4* qv, Rows rows, int d, float scale, int j_begin,
                                           int j_end, float* sm_m, float* sm_l, float4 (*sm_acc)[32 * ATTS_SLOTS]) {
    if (d <= 128) atts_core<1>(pv, qv, rows, d, scale, j_begin, j_end, sm_m, sm_l, sm_acc);
    else if (d <= 256) atts_core<2>(pv, qv, rows, d, scale, j_begin, j_end, sm_m, sm_l, sm_acc);
    else atts_core<4>(pv, qv, rows, d, scale, j_begin, j_end, sm_m, sm_l, sm_acc);
}

template <class E>
__device__ __forceinline__ void atts_body(float* part, const float* q, const void* k, const void* v, int l, int hq,
                                          int hkv, int d, int cap, int kv_len, float scale, int chunk, const int* step,
                                          int want, int ring, float* sm_m, float* sm_l,
                                          float4 (*sm_acc)[32 * ATTS_SLOTS]) {
    typedef typename E::raw Raw;
    const int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z, splits = gridDim.z;
    const int kvh = h / (hq / hkv);
    int j_begin, j_end;
    atts_keys(l, t, s, kv_len, chunk, step, want, ring ? cap : 0, j_begin, j_end);
    const int d4 = d >> 2;
    const float4* qv = (const float4*)(q + ((size_t)t * hq + h) * d);
    const size_t head4 = (size_t)kvh * cap * d4;
    ContigRows<E> rows{(const Raw*)k + head4, (const Raw*)v + head4, d4};
    float* pv = part + (((size_t)t * hq + h) * splits + s) * (size_t)(d + 2);
    atts_sized(pv, qv, rows, d, scale, j_begin, j_end, sm_m, sm_l, sm_acc);
}

// Before pdl_begin (issue 7): the keys and values of the split's cached positions asked into L2
// while the kernel before (rope and the cache write) runs; one query head per key head asks.
// A hint only (the newest position, being written, comes through L2 like any other).
#ifndef ATT_PF
#define ATT_PF 1
#endif
__device__ __forceinline__ void atts_prefetch(const void* k, const void* v, int l, int hq, int hkv, int d, int cap,
                                              int kv_len, int chunk, const int* step, int want, int kv_dt, int ring) {
    const int h = blockIdx.x, t = blockIdx.y;
    if (!ATT_PF || threadIdx.x != 0 || t != 0 || h % (hq / hkv) != 0) return;
    int j_begin, j_end;
    atts_keys(l, t, blockIdx.z, kv_len, chunk, step, want, ring ? cap : 0, j_begin, j_end);
    if (j_end <= j_begin) return;
    const size_t row = (size_t)d * (kv_dt == DT_F32 ? 4 : 2), first = ((size_t)(h / (hq / hkv)) * cap + j_begin) * row;
    l2_prefetch((const char*)k + first, (size_t)(j_end - j_begin) * row);
    l2_prefetch((const char*)v + first, (size_t)(j_end - j_begin) * row);
}

// One split's partial over a contiguous cache of dtype kv_dt (f32, f16 or bf16).
__device__ __forceinline__ void atts_split(float* part, const float* q, const void* k, const void* v, int l, int hq,
                                           int hkv, int d, int cap, int kv_len, float scale, int chunk,
                                           const int* step, int want, int kv_dt, int ring) {
    __shared__ float sm_m[ATTS_WARPS], sm_l[ATTS_WARPS];
    __shared__ float4 sm_acc[ATTS_WARPS][32 * ATTS_SLOTS];
    if (kv_dt == DT_F32)
        atts_body<F32Kv>(part, q, k, v, l, hq, hkv, d, cap, kv_len, scale, chunk, step, want, ring, sm_m, sm_l,
                         sm_acc);
    else if (kv_dt == DT_F16)
        atts_body<HalfKv<DT_F16>>(part, q, k, v, l, hq, hkv, d, cap, kv_len, scale, chunk, step, want, ring, sm_m,
                                  sm_l, sm_acc);
    else
        atts_body<HalfKv<DT_BF16>>(part, q, k, v, l, hq, hkv, d, cap, kv_len, scale, chunk, step, want, ring, sm_m,
                                   sm_l, sm_acc);
}

// Keys and values of dtype kv_dt (f32, f16 or bf16: 16- or 8-byte aligned rows).
extern "C" __global__ void attention_split_f32(float* part, const float* q, const void* k, const void* v, int l, int hq,
                                               int hkv, int d, int cap, int kv_len, float scale, int chunk,
                                               const int* step, int want, int kv_dt, int ring) {
    atts_prefetch(k, v, l, hq, hkv, d, cap, kv_len, chunk, step, want, kv_dt, ring);
    pdl_begin();
    atts_split(part, q, k, v, l, hq, hkv, d, cap, kv_len, scale, chunk, step, want, kv_dt, ring);
}

// GH query heads of one KV group (head sizes up to 128) in one block: each key and value row is
// loaded once for all of them instead of once per head. Per head the arithmetic is atts_core's for
// SLOTS = 1, in the same order (the same key groups, the same online softmax, the same merge of
// the warps), so every partial is bit for bit what a block of that head alone writes. Head g's
// query is qv0 + g * d4 and its partial pv0 + g * pv_step.
template <int GH, class Rows>
__device__ __forceinline__ void atts_group(float* pv0, size_t pv_step, const float4* qv0, Rows rows, int d, float scale,
                                           int j_begin, int j_end, float* sm_m, float* sm_l,
                                           float4 (*sm_acc)[32 * ATTS_SLOTS]) {
    typedef typename Rows::Kv Kv;
    typedef typename Kv::raw Raw;
    constexpr int KB = 4 * (int)(sizeof(float4) / sizeof(Raw));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int d4 = d >> 2;
    const bool on = lane < d4;
    float4 qr[GH], acc[GH];
    float run_m[GH], run_l[GH];
#pragma unroll
    for (int g = 0; g < GH; ++g) {
        const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
        qr[g] = on ? qv0[(size_t)g * d4 + lane] : z;
        qr[g].x *= scale; qr[g].y *= scale; qr[g].z *= scale; qr[g].w *= scale;
        acc[g] = z;
        run_m[g] = NEG_INF;
        run_l[g] = 0.0f;
    }
    for (int j0 = j_begin + warp; j0 < j_end; j0 += ATTS_WARPS * KB) {
        Raw kk[KB], vv[KB];
#pragma unroll
        for (int b = 0; b < KB; ++b) {
            const int j = j0 + ATTS_WARPS * b;
            if (j < j_end && on) {
                kk[b] = rows.load_key(j, lane);
                vv[b] = rows.load_val(j, lane);
            } else {
                kk[b] = vv[b] = Raw{};
            }
        }
#pragma unroll
        for (int g = 0; g < GH; ++g) {
            float sc[KB];
            float gm = run_m[g];
#pragma unroll
            for (int b = 0; b < KB; ++b) {
                float dot = 0.0f;
                if (on) {
                    const float4 kf = Kv::widen(kk[b]);
                    dot = fmaf(qr[g].x, kf.x, dot); dot = fmaf(qr[g].y, kf.y, dot);
                    dot = fmaf(qr[g].z, kf.z, dot); dot = fmaf(qr[g].w, kf.w, dot);
                }
                dot = warp_sum(dot);
                sc[b] = j0 + ATTS_WARPS * b < j_end ? dot : NEG_INF;
                gm = fmaxf(gm, sc[b]);
            }
            float corr = expf(run_m[g] - gm);
            run_l[g] *= corr;
            acc[g].x *= corr; acc[g].y *= corr; acc[g].z *= corr; acc[g].w *= corr;
#pragma unroll
            for (int b = 0; b < KB; ++b) {
                if (j0 + ATTS_WARPS * b >= j_end) break;
                float p = expf(sc[b] - gm);
                run_l[g] += p;
                if (on) {
                    const float4 vf = Kv::widen(vv[b]);
                    acc[g].x = fmaf(p, vf.x, acc[g].x); acc[g].y = fmaf(p, vf.y, acc[g].y);
                    acc[g].z = fmaf(p, vf.z, acc[g].z); acc[g].w = fmaf(p, vf.w, acc[g].w);
                }
            }
            run_m[g] = gm;
        }
    }
    // The warps' states combined head by head, as atts_core combines them.
#pragma unroll
    for (int g = 0; g < GH; ++g) {
        const float4 head_acc[1] = {acc[g]};
        atts_merge<1>(pv0 + g * pv_step, head_acc, run_m[g], run_l[g], d4, sm_m, sm_l, sm_acc);
    }
}

// Decode attention of many sequences over one paged store (k, v [blocks * bs, Hkv * D], of dtype
// kv_dt): grid (Hq / gh, n, splits); block (x, t, s) takes query heads gh * x .. gh * x + gh - 1
// (gh > 1: heads of one KV group and D <= 128, atts_group; gh = 1: atts_core) and keys
// [s chunk, (s + 1) chunk) of query t. `keys` = 0: chunk by the host's split rule for one query,
// max(ceil(len / want), 32), so each sequence gets the partials its own decode gets and the merge
// (over the splits, the empty ones skipped) gives its result bit for bit, whatever gh. `keys` > 0
// (a step of many sequences, where the sequences alone fill the GPU): chunk = keys for every
// sequence, so each block has work of one size and a sequence takes as many splits as its length
// needs. Sequence t's blocks are tables[t * table_stride ..], its length lens[t]; with `starts`,
// it attends keys [starts[t], lens[t]) (a sliding window), split as a decode over those keys
// alone: the splits count from starts[t], so the partials are those of that decode, bit for bit.
// `stores`: the rows of every sequence and KV head, as base (Rows::of picks sequence t's and
// head kvh's).
template <class Rows>
__device__ __forceinline__ void paged_body(float* part, const float* q, Rows stores, const int* tables,
                                           int table_stride, const int* lens, const int* starts, int hq, int hkv,
                                           int d, float scale, int want, int keys, int gh, float* sm_m, float* sm_l,
                                           float4 (*sm_acc)[32 * ATTS_SLOTS]) {
    const int h = blockIdx.x * gh, t = blockIdx.y, s = blockIdx.z;
    const int start = starts ? starts[t] : 0, kv_len = lens[t] - start;
    const int chunk = keys > 0 ? keys : max((kv_len + want - 1) / want, 32);
    const int j_begin = start + s * chunk, j_end = min(lens[t], j_begin + chunk);
    const int kvh = h / (hq / hkv), d4 = d >> 2;
    float* pv = part + (((size_t)t * hq + h) * gridDim.z + s) * (size_t)(d + 2);
    const size_t pv_step = (size_t)gridDim.z * (d + 2);
    if (j_begin >= j_end) {
        // A split past the sequence's last key: the empty partial the merge skips (maximum -inf,
        // sum 0, values 0: what atts_merge writes for no keys), without the loop and the merges.
        for (int i = threadIdx.x; i < gh * (d + 2); i += blockDim.x) {
            const int g = i / (d + 2), c = i % (d + 2);
            pv[g * pv_step + c] = c == 0 ? NEG_INF : 0.0f;
        }
        return;
    }
    const Rows rows = stores.of(tables + (size_t)t * table_stride, kvh, d4);
    const float4* qv = (const float4*)(q + ((size_t)t * hq + h) * d);
    if (gh == 4) atts_group<4>(pv, pv_step, qv, rows, d, scale, j_begin, j_end, sm_m, sm_l, sm_acc);
    else if (gh == 3) atts_group<3>(pv, pv_step, qv, rows, d, scale, j_begin, j_end, sm_m, sm_l, sm_acc);
    else if (gh == 2) atts_group<2>(pv, pv_step, qv, rows, d, scale, j_begin, j_end, sm_m, sm_l, sm_acc);
    else atts_sized(pv, qv, rows, d, scale, j_begin, j_end, sm_m, sm_l, sm_acc);
}
template <class E>
__device__ __forceinline__ PagedRows<E> paged_store(const void* k, const void* v, int block_size, int hkv, int d) {
    typedef typename E::raw Raw;
    return PagedRows<E>{(const Raw*)k, (const Raw*)v, nullptr, block_size, hkv * (d >> 2), 0};
}
extern "C" __global__ void paged_attention_split_f32(float* part, const float* q, const void* k, const void* v,
                                                     const int* tables, int table_stride, const int* lens,
                                                     const int* starts, int hq, int hkv, int d, int block_size,
                                                     float scale, int want, int keys, int kv_dt, int gh) {
    pdl_begin();
    __shared__ float sm_m[ATTS_WARPS], sm_l[ATTS_WARPS];
    __shared__ float4 sm_acc[ATTS_WARPS][32 * ATTS_SLOTS];
    if (kv_dt == DT_F32)
        paged_body(part, q, paged_store<F32Kv>(k, v, block_size, hkv, d), tables, table_stride, lens, starts, hq, hkv,
                   d, scale, want, keys, gh, sm_m, sm_l, sm_acc);
    else if (kv_dt == DT_F16)
        paged_body(part, q, paged_store<HalfKv<DT_F16>>(k, v, block_size, hkv, d), tables, table_stride, lens, starts,
                   hq, hkv, d, scale, want, keys, gh, sm_m, sm_l, sm_acc);
    else
        paged_body(part, q, paged_store<HalfKv<DT_BF16>>(k, v, block_size, hkv, d), tables, table_stride, lens,
                   starts, hq, hkv, d, scale, want, keys, gh, sm_m, sm_l, sm_acc);
}
// paged_attention_split_f32 over a quantized store (QuantPagedRows: words kw / vw, scales ks / vs,
// biases kb / vb, `bits` 4 or 8 in groups of gs): the same splits and partials as over the store
// dequantized to f32, bit for bit.
extern "C" __global__ void paged_attention_split_quant_f32(float* part, const float* q, const u32* kw,
                                                           const float* ks, const float* kb, const u32* vw,
                                                           const float* vs, const float* vb, const int* tables,
                                                           int table_stride, const int* lens, const int* starts,
                                                           int hq, int hkv, int d, int block_size, float scale,
                                                           int want, int keys, int bits, int gs, int gh) {
    pdl_begin();
    __shared__ float sm_m[ATTS_WARPS], sm_l[ATTS_WARPS];
    __shared__ float4 sm_acc[ATTS_WARPS][32 * ATTS_SLOTS];
    if (bits == 8) {
        QuantPagedRows<8> stores{kw, ks, kb, vw, vs, vb, nullptr, block_size, hkv * d, 0, gs};
        paged_body(part, q, stores, tables, table_stride, lens, starts, hq, hkv, d, scale, want, keys, gh, sm_m, sm_l,
                   sm_acc);
    } else {
        QuantPagedRows<4> stores{kw, ks, kb, vw, vs, vb, nullptr, block_size, hkv * d, 0, gs};
        paged_body(part, q, stores, tables, table_stride, lens, starts, hq, hkv, d, scale, want, keys, gh, sm_m, sm_l,
                   sm_acc);
    }
}

// out [L, Hq * D] from the S partials of each (query, head): one block per (head, query).
// `parts` (L = 1, D a multiple of 32, so that a warp holds whole chunks; else null): the integer
// GEMVs' parts of out too (xsplit_chunk), for the output projection. `tiles` (several queries,
// D a multiple of 32 and 128 threads; else null): out in the bf16 register products' input too
// (common.cuh), the output projection's over a batch.
extern "C" __global__ void attention_merge_f32(float* out, const float* part, int hq, int d, int splits,
                                               const float* sinks, u32* parts, u32* tiles) {
    pdl_begin();
    const int h = blockIdx.x, t = blockIdx.y;
    const float* p = part + ((size_t)t * hq + h) * splits * (size_t)(d + 2);
    // The sink is one more partial: maximum `sink`, sum 1, values 0.
    float m = sinks ? sinks[h] : NEG_INF;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, p[(size_t)s * (d + 2)]);
    float tot = sinks ? expf(sinks[h] - m) : 0.0f;
    for (int s = 0; s < splits; ++s) {
        float ms = p[(size_t)s * (d + 2)];
        if (ms != NEG_INF) tot += p[(size_t)s * (d + 2) + 1] * expf(ms - m);
    }
    float inv = 1.0f / tot;
    float* o = out + ((size_t)t * hq + h) * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < splits; ++s) {
            const float* ps = p + (size_t)s * (d + 2);
            const float m_s = ps[0];
            if (m_s != NEG_INF) a = fmaf(expf(m_s - m), ps[2 + c], a);
        }
        o[c] = a * inv;
        if (parts) xsplit_chunk(parts, (hq * d) >> 5, (h * d + c) >> 5, a * inv, (int)(threadIdx.x & 31));
        if (tiles) qdec_tile_value(tiles, t, h * d + c, hq * d, a * inv);
    }
}

// Causal softmax in place over scores [H, rows, n] (the prefill path: scores = Q K^T * scale by
// SGEMM, then this, then P V by SGEMM). Row r of every head is query `first + r`, which sees keys
// 0..=first + r; later entries become 0. One block per (row, head). With `sinks`, head h's sink
// logit joins the denominator (the weights then sum to less than one).
extern "C" __global__ void causal_softmax_f32(float* scores, int rows, int n, long long first, const float* sinks,
                                              long long window) {
    pdl_begin();
    __shared__ float scratch[33];
    const int r = blockIdx.x, h = blockIdx.y;
    float* row = scores + ((size_t)h * rows + r) * n;
    const int valid = (int)min((long long)n, first + r + 1);
    // With a window (> 0), the keys before the row's window are out too.
    const int lo = window > 0 ? (int)max(0LL, first + r + 1 - window) : 0;
    float m = NEG_INF;
    for (int j = lo + threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m, scratch);
    if (sinks) m = fmaxf(m, sinks[h]);
    float sum = 0.0f;
    for (int j = lo + threadIdx.x; j < valid; j += blockDim.x) {
        float e = expf(row[j] - m);
        row[j] = e;
        sum += e;
    }
    sum = block_sum(sum, scratch);
    if (sinks) sum += expf(sinks[h] - m);
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < n; j += blockDim.x) row[j] = j >= lo && j < valid ? row[j] * inv : 0.0f;
}
