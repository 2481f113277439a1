// Runs the quantized KV kernels of kv_quant.cu (kv_quantize_rows_f32, kv_dequantize_paged_f32)
// through cuda_emu.h on the CPU, bit for bit against the host's rules: quantize_affine (the
// nuvec crate's quantize.rs, restated here operation for operation) for every width MLX allows
// and groups of 32, 64 and 128, including constant groups (a zero edge code), groups led by their
// minimum and by their maximum, and a NaN; then every position gathered back through a block
// table, against scale * code + bias. Then attention.cu's paged decode over a quantized store
// (paged_attention_split_quant_f32): its partials bit for bit those of paged_attention_split_f32
// over the same store dequantized, for one head and KV groups per block, solo and common
// splits. Built and run by run.sh, which prepends the kernel sources.
#include "kernels_kvq.cpp"
#include "emu_check.h"
#include <cstdio>
#include <random>
#include <string>
#include <tuple>

// quantize_affine of one row of `width` values, as quantize.rs computes it.
static void host_quantize(const float* x, int width, int bits, int gs, std::vector<unsigned>& words,
                          std::vector<float>& scales, std::vector<float>& biases) {
    const float n_bins = (float)((1u << bits) - 1u);
    std::vector<unsigned char> codes(width);
    for (int g = 0; g < width / gs; ++g) {
        const float* c = x + g * gs;
        float hi = -INFINITY, lo = INFINITY;
        for (int i = 0; i < gs; ++i) {
            hi = std::isnan(c[i]) ? hi : std::max(hi, c[i]);
            lo = std::isnan(c[i]) ? lo : std::min(lo, c[i]);
        }
        const bool min_wins = std::fabs(lo) > std::fabs(hi);
        float scale = (hi - lo) / n_bins;
        scale = std::isnan(scale) || scale < 1e-7f ? 1e-7f : scale;
        if (!min_wins) scale = -scale;
        const float edge = min_wins ? lo : hi;
        const float q0 = std::nearbyint(edge / scale);
        float bias = 0.0f;
        if (q0 != 0.0f) {
            scale = edge / q0;
            bias = edge;
        }
        for (int i = 0; i < gs; ++i) {
            float q = std::nearbyint((c[i] - bias) / scale);
            codes[g * gs + i] = std::isnan(q) ? 0 : (unsigned char)std::min(std::max(q, 0.0f), n_bins);
        }
        scales.push_back(scale);
        biases.push_back(bias);
    }
    // pack_lsb: the codes as one LSB-first bit stream, read as little-endian words.
    std::vector<unsigned> row(width * bits / 32, 0);
    for (int i = 0; i < width; ++i)
        for (int b = 0; b < bits; ++b)
            if (codes[i] >> b & 1) row[(i * bits + b) / 32] |= 1u << ((i * bits + b) % 32);
    words.insert(words.end(), row.begin(), row.end());
}

static void test(int heads, int dim, int bits, int gs, std::mt19937& rng) {
    const int width = heads * dim, rows = 21, bs = 4, at = 3;  // rows 3 .. 23 of a 7-block store
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> x((size_t)rows * width);
    for (auto& v : x) v = nd(rng);
    // A constant group (its edge code is 0), groups led by their minimum and by their maximum.
    for (int i = 0; i < gs; ++i) {
        x[i] = 0.75f;
        x[width + i] = i == 0 ? -9.0f : std::fabs(x[width + i]);
        x[2 * width + i] = i == 1 ? 9.0f : -std::fabs(x[2 * width + i]);
    }
    x[3 * width + 5] = NAN;
    const int row_words = width * bits / 32, groups = width / gs, store_rows = 28;
    std::vector<unsigned> words((size_t)store_rows * row_words, 0xdeadbeefu);
    std::vector<float> scales((size_t)store_rows * groups, -1.0f), biases((size_t)store_rows * groups, -1.0f);
    std::vector<int> slots(rows);
    for (int i = 0; i < rows; ++i) slots[i] = at + i;
    emu_launch({(unsigned)rows, 1, 1}, {128, 1, 1}, [&] {
        kv_quantize_rows_f32(x.data(), slots.data(), words.data(), scales.data(), biases.data(), width, bits, gs);
    });
    std::vector<unsigned> want_w;
    std::vector<float> want_s, want_b;
    for (int r = 0; r < rows; ++r) host_quantize(x.data() + (size_t)r * width, width, bits, gs, want_w, want_s, want_b);
    std::string tag = "heads=" + std::to_string(heads) + " dim=" + std::to_string(dim) + " bits=" +
                      std::to_string(bits) + " gs=" + std::to_string(gs);
    bool same = std::equal(want_w.begin(), want_w.end(), words.begin() + at * row_words) &&
                std::memcmp(want_s.data(), scales.data() + at * groups, want_s.size() * 4) == 0 &&
                std::memcmp(want_b.data(), biases.data() + at * groups, want_b.size() * 4) == 0;
    bool kept = words[at * row_words - 1] == 0xdeadbeefu && words[(at + rows) * row_words] == 0xdeadbeefu &&
                scales[at * groups - 1] == -1.0f && biases[(at + rows) * groups] == -1.0f;
    check(same && kept, "kv_quantize_rows_f32 = quantize_affine, other rows kept " + tag);
    printf("%s kv_quantize_rows_f32 %s\n", same && kept ? "ok  " : "FAIL", tag.c_str());

    // Positions 2 .. 19 of a sequence whose blocks are 5, 0, 3, 1, 4 (store rows 20.., 0.., ...).
    const std::vector<int> table = {5, 0, 3, 1, 4};
    const int from = 2, n = 18;
    std::vector<float> out((size_t)heads * n * dim, NAN), want((size_t)heads * n * dim);
    for (int i = 0; i < n; ++i) {
        const int p = from + i, row = table[p / bs] * bs + p % bs;
        for (int h = 0; h < heads; ++h)
            for (int c = 0; c < dim; ++c) {
                const int idx = h * dim + c, bit = idx * bits;
                unsigned v = 0;
                for (int b = 0; b < bits; ++b) v |= (words[(size_t)row * row_words + (bit + b) / 32] >> ((bit + b) % 32) & 1u) << b;
                const size_t g = (size_t)row * groups + idx / gs;
                const float prod = scales[g] * (float)v;
                want[((size_t)h * n + i) * dim + c] = prod + biases[g];
            }
    }
    emu_launch({(unsigned)n, (unsigned)heads, 1}, {(unsigned)std::min(128, (dim + 31) / 32 * 32), 1, 1}, [&] {
        kv_dequantize_paged_f32(out.data(), words.data(), scales.data(), biases.data(), table.data(), bs, from, n, heads,
                                dim, bits, gs);
    });
    const bool exact = std::memcmp(out.data(), want.data(), out.size() * 4) == 0;
    check(exact, "kv_dequantize_paged_f32 = scale * code + bias " + tag);
    printf("%s kv_dequantize_paged_f32 %s\n", exact ? "ok  " : "FAIL", tag.c_str());
}

// n sequences of `lens` keys in a quantized store of 16-position blocks (each sequence's blocks in
// reverse order), the decode partials of the quantized kernel against the f32 kernel's over the
// dequantized rows.
static void test_paged_quant(int hq, int hkv, int d, int bits, int gs, const std::vector<int>& lens, std::mt19937& rng) {
    const int bs = 16, width = hkv * d, n = (int)lens.size();
    int stride = 0, blocks = 0;
    for (int len : lens) { stride = std::max(stride, (len + bs - 1) / bs); blocks += (len + bs - 1) / bs; }
    std::vector<int> tables((size_t)n * stride, 0);
    for (int t = 0, next = 0; t < n; ++t) {
        const int own = (lens[t] + bs - 1) / bs;
        for (int b = 0; b < own; ++b) tables[(size_t)t * stride + b] = next + own - 1 - b;
        next += own;
    }
    const int rows = blocks * bs, row_words = width * bits / 32, groups = width / gs;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> kx((size_t)rows * width), vx(kx.size()), q((size_t)n * hq * d);
    for (auto* v : {&kx, &vx, &q}) for (auto& x : *v) x = nd(rng);
    std::vector<unsigned> kw((size_t)rows * row_words), vw(kw.size());
    std::vector<float> ks((size_t)rows * groups), kb(ks.size()), vs(ks.size()), vb(ks.size());
    // Row i into row rows - 1 - i: the slots a decode step writes are scattered.
    std::vector<int> slots(rows);
    for (int i = 0; i < rows; ++i) slots[i] = rows - 1 - i;
    emu_launch({(unsigned)rows, 1, 1}, {128, 1, 1}, [&] {
        kv_quantize_rows_f32(kx.data(), slots.data(), kw.data(), ks.data(), kb.data(), width, bits, gs);
        kv_quantize_rows_f32(vx.data(), slots.data(), vw.data(), vs.data(), vb.data(), width, bits, gs);
    });
    // The store dequantized by the host's rule, position-major as the f32 kernel reads it.
    std::vector<float> kf(kx.size()), vf(kx.size());
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < width; ++i) {
            unsigned ck = 0, cv = 0;
            for (int b = 0; b < bits; ++b) {
                const int bit = i * bits + b;
                ck |= (kw[(size_t)r * row_words + bit / 32] >> (bit % 32) & 1u) << b;
                cv |= (vw[(size_t)r * row_words + bit / 32] >> (bit % 32) & 1u) << b;
            }
            const size_t g = (size_t)r * groups + i / gs;
            const float pk = ks[g] * (float)ck, pv = vs[g] * (float)cv;
            kf[(size_t)r * width + i] = pk + kb[g];
            vf[(size_t)r * width + i] = pv + vb[g];
        }
    const float scale = 1.0f / std::sqrt((float)d);
    const int want = std::max(1, (512 + hq - 1) / hq), group = hq / hkv;
    const int gh_group = d <= 128 ? (group % 4 == 0 ? 4 : group % 3 == 0 ? 3 : group % 2 == 0 ? 2 : 1) : 1;
    int longest = 0;
    for (int len : lens) longest = std::max(longest, len);
    // Sliding windows of 9 keys (from key lens[t] - 9 on): the same partials both ways too.
    std::vector<int> firsts(n);
    for (int t = 0; t < n; ++t) firsts[t] = std::max(0, lens[t] - 9);
    for (auto [keys, gh, starts] : std::vector<std::tuple<int, int, const int*>>{
             {0, 1, nullptr}, {0, gh_group, nullptr}, {64, 1, nullptr}, {64, gh_group, nullptr},
             {0, gh_group, firsts.data()}, {32, 1, firsts.data()}}) {
        int splits = want;
        if (keys > 0) splits = (longest + keys - 1) / keys + 1;
        std::vector<float> pf((size_t)n * hq * splits * (d + 2), NAN), pq(pf.size(), NAN);
        emu_launch({(unsigned)(hq / gh), (unsigned)n, (unsigned)splits}, {128, 1, 1}, [&] {
            paged_attention_split_f32(pf.data(), q.data(), kf.data(), vf.data(), tables.data(), stride, lens.data(),
                                      starts, hq, hkv, d, bs, scale, want, keys, DT_F32, gh);
        });
        emu_launch({(unsigned)(hq / gh), (unsigned)n, (unsigned)splits}, {128, 1, 1}, [&] {
            paged_attention_split_quant_f32(pq.data(), q.data(), kw.data(), ks.data(), kb.data(), vw.data(), vs.data(),
                                            vb.data(), tables.data(), stride, lens.data(), starts, hq, hkv, d, bs,
                                            scale, want, keys, bits, gs, gh);
        });
        const bool same = std::memcmp(pf.data(), pq.data(), pf.size() * 4) == 0;
        std::string tag = "paged_attention_split_quant_f32 hq=" + std::to_string(hq) + " hkv=" + std::to_string(hkv) +
                          " d=" + std::to_string(d) + " bits=" + std::to_string(bits) + " gs=" + std::to_string(gs) +
                          " keys=" + std::to_string(keys) + " gh=" + std::to_string(gh) +
                          (starts ? " windows of 9" : "");
        check(same, tag + " = the f32 kernel over the dequantized store");
        printf("%s %s\n", same ? "ok  " : "FAIL", tag.c_str());
    }
}

int main() {
    std::mt19937 rng(7);
    for (int bits : {2, 3, 4, 5, 6, 8})
        for (int gs : {32, 64, 128}) test(2, 128, bits, gs, rng);
    test(3, 64, 4, 64, rng);
    test(1, 256, 8, 32, rng);
    test(4, 160, 3, 32, rng);
    test_paged_quant(8, 2, 64, 8, 64, {1, 17, 70, 33}, rng);
    test_paged_quant(8, 2, 64, 4, 32, {1, 17, 70, 33}, rng);
    test_paged_quant(6, 2, 128, 4, 64, {40, 3}, rng);
    test_paged_quant(2, 1, 256, 8, 128, {50, 20}, rng);
    printf("%d failures\n", fails);
    return fails != 0;
}
