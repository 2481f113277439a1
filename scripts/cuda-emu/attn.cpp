// Runs the flash-attention prefill kernels (flash_attention.cu) through cuda_emu.h on the CPU:
// causal attention with grouped KV heads against its definition in f64 on the same bf16-rounded
// q, k and v. The kernel also rounds the probabilities to bf16 before P V (as the cuBLAS path
// did), so the tolerance is bf16's (relative 8e-3 of |want| + mean|want|). Cases: head sizes 64
// and 128, a query block cut by L, keys past a tile's end, queries after earlier cache rows
// (kv_len > L) and one KV head per 1, 2 and 4 query heads; sliding windows (each query sees the
// `window` newest keys up to its own: rows whose first tiles hold none of their keys) and sink
// logits joining each head's softmax. Then the paged decode kernels of the
// same file: one sequence's keys per warp, and keys several sequences share read once for a
// group (below). Built and run by run.sh.
#include "kernels_attn.cpp"
#include "emu_check.h"
#include <cstdio>
#include <random>
#include <string>

static void test_flash(int d, int l, int kv_len, int hq, int hkv, std::mt19937& rng, int window = 0,
                       bool with_sinks = false) {
    const int warps = d == 64 ? 4 : 8;  // as the kernels take them
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q((size_t)l * hq * d), out((size_t)l * hq * d, NAN);
    std::vector<unsigned short> kb((size_t)hkv * kv_len * d), vb((size_t)hkv * kv_len * d);
    for (auto& v : q) v = 2.0f * nd(rng);
    for (auto& v : kb) v = emu_bf16_rn(nd(rng));
    for (auto& v : vb) v = emu_bf16_rn(nd(rng));
    std::vector<float> sinks(hq);
    for (auto& v : sinks) v = 3.0f * nd(rng);
    if (hq > 1) sinks[1] = 5.0f;  // weighs about as much as its head's best keys
    const float* sp = with_sinks ? sinks.data() : nullptr;
    const float scale = 1.0f / std::sqrt((float)d);
    auto kernel = d == 64 ? flash_attn_bf16_d64 : flash_attn_bf16_d128;
    emu_launch({(unsigned)hq, (unsigned)((l + 16 * warps - 1) / (16 * warps)), 1}, {(unsigned)warps * 32, 1, 1},
               [&] { kernel(out.data(), q.data(), kb.data(), vb.data(), l, kv_len, hq, hkv, scale, sp, window); });
    std::vector<double> want((size_t)l * hq * d);
    const int first = kv_len - l;
    for (int t = 0; t < l; ++t)
        for (int h = 0; h < hq; ++h) {
            const int kvh = h / (hq / hkv), n = first + t + 1, lo = window > 0 ? std::max(0, n - window) : 0;
            std::vector<double> s(n);
            double mx = with_sinks ? (double)sinks[h] : -INFINITY;
            for (int j = lo; j < n; ++j) {
                double dot = 0;
                for (int c = 0; c < d; ++c)
                    dot += (double)emu_bf16(emu_bf16_rn(q[((size_t)t * hq + h) * d + c])) *
                           emu_bf16(kb[((size_t)kvh * kv_len + j) * d + c]);
                s[j] = dot * scale;
                mx = std::max(mx, s[j]);
            }
            double sum = with_sinks ? std::exp((double)sinks[h] - mx) : 0.0;
            for (int j = lo; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
            for (int c = 0; c < d; ++c) {
                double o = 0;
                for (int j = lo; j < n; ++j) o += s[j] * emu_bf16(vb[((size_t)kvh * kv_len + j) * d + c]);
                want[((size_t)t * hq + h) * d + c] = o / sum;
            }
        }
    cmp("flash_attn_bf16_d" + std::to_string(d) + " l=" + std::to_string(l) + " kv=" + std::to_string(kv_len) +
            " hq=" + std::to_string(hq) + " hkv=" + std::to_string(hkv) + " window=" + std::to_string(window) +
            (with_sinks ? " sinks" : ""),
        out, want, 8e-3);
}

// The paged decode's partials of every (sequence, head) — `slots` of (maximum, sum, values[d])
// each — combined as attention_merge_f32 combines them (empty ones, maximum -inf, skipped).
static std::vector<float> merged(const std::vector<float>& part, int n, int hq, int d, int slots) {
    std::vector<float> out((size_t)n * hq * d);
    for (size_t row = 0; row < (size_t)n * hq; ++row) {
        const float* p = part.data() + row * slots * (d + 2);
        auto m_of = [&](int sp) { return (double)p[(size_t)sp * (d + 2)]; };
        double m = -INFINITY, tot = 0;
        for (int sp = 0; sp < slots; ++sp) m = std::max(m, m_of(sp));
        for (int sp = 0; sp < slots; ++sp)
            if (m_of(sp) != -INFINITY) tot += p[(size_t)sp * (d + 2) + 1] * std::exp(m_of(sp) - m);
        for (int c = 0; c < d; ++c) {
            double a = 0;
            for (int sp = 0; sp < slots; ++sp)
                if (m_of(sp) != -INFINITY) a += std::exp(m_of(sp) - m) * p[(size_t)sp * (d + 2) + 2 + c];
            out[row * d + c] = (float)(a / tot);
        }
    }
    return out;
}

// A store's half type: bf16, or f16 (then q is scaled before it is rounded, as the kernels do).
struct Half {
    bool f16;
    unsigned short round(float x) const { return f16 ? emu_float_to_half(x) : emu_bf16_rn(x); }
    double value(unsigned short h) const { return f16 ? emu_half_to_float(h) : emu_bf16(h); }
    const char* name() const { return f16 ? "f16" : "bf16"; }
    // The probabilities are rounded to the half type for P V: 8 significant bits, or 11.
    double tolerance() const { return f16 ? 2e-3 : 8e-3; }
};

// The definition of a paged decode on the half-rounded q, k and v: key j of sequence t is row
// tables[t * stride + j / bs] * bs + j % bs of the store (rows of hkv * d), over lens[t] keys.
static std::vector<double> paged_definition(const std::vector<float>& q, const std::vector<unsigned short>& kb,
                                            const std::vector<unsigned short>& vb, const std::vector<int>& tables,
                                            int stride, const std::vector<int>& lens, int hq, int hkv, int d, int bs,
                                            float scale, Half half) {
    const int n = (int)lens.size(), width = hkv * d;
    std::vector<double> want((size_t)n * hq * d);
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < hq; ++h) {
            const int kvh = h / (hq / hkv), len = lens[t];
            std::vector<double> sc(len);
            double mx = -INFINITY;
            auto at = [&](int j) { return ((size_t)tables[(size_t)t * stride + j / bs] * bs + j % bs) * width + (size_t)kvh * d; };
            for (int j = 0; j < len; ++j) {
                double dot = 0;
                for (int c = 0; c < d; ++c) {
                    const float x = q[((size_t)t * hq + h) * d + c];
                    dot += half.value(half.round(half.f16 ? x * scale : x)) * half.value(kb[at(j) + c]);
                }
                mx = std::max(mx, sc[j] = half.f16 ? dot : dot * scale);
            }
            double sum = 0;
            for (int j = 0; j < len; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
            for (int c = 0; c < d; ++c) {
                double o = 0;
                for (int j = 0; j < len; ++j) o += sc[j] * half.value(vb[at(j) + c]);
                want[((size_t)t * hq + h) * d + c] = o / sum;
            }
        }
    return want;
}

// The paged decode kernel (paged_flash_decode_{bf16,f16}_d*): n sequences of `lens` keys in a
// store of blocks of `bs` (16, or 12: not a power of two) taken in reverse order, `keys` per
// split; the partials combined here as attention_merge_f32 combines them, against the definition
// on the half-rounded q, k and v (the probabilities rounded as the prefill kernels round them:
// the same tolerance). Splits past a sequence's end must hold the empty partial (maximum -inf,
// sum 0). q's entries are `qmag` times normal ones (large ones would leave f16 unless scaled).
static void test_paged_flash(int d, int hq, int hkv, std::vector<int> lens, int keys, std::mt19937& rng,
                             int bs = 16, Half half = {false}, float qmag = 2.0f) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int n = (int)lens.size(), width = hkv * d;
    int splits = 0, total_blocks = 0;
    for (int l : lens) splits = std::max(splits, (l + keys - 1) / keys), total_blocks += (l + bs - 1) / bs;
    splits += 1;  // one split past every sequence's end
    int stride = 0;
    for (int l : lens) stride = std::max(stride, (l + bs - 1) / bs);
    std::vector<int> tables((size_t)n * stride, 0);
    for (int t = 0, next = total_blocks; t < n; ++t)
        for (int b = 0; b < (lens[t] + bs - 1) / bs; ++b) tables[(size_t)t * stride + b] = --next;
    std::vector<unsigned short> kb((size_t)total_blocks * bs * width), vb(kb.size());
    for (auto& x : kb) x = half.round(nd(rng));
    for (auto& x : vb) x = half.round(nd(rng));
    std::vector<float> q((size_t)n * hq * d);
    for (auto& x : q) x = qmag * nd(rng);
    std::vector<float> part((size_t)n * hq * splits * (d + 2), NAN);
    const float scale = 1.0f / std::sqrt((float)d);
    auto kernel = half.f16 ? (d == 64 ? paged_flash_decode_f16_d64 : paged_flash_decode_f16_d128)
                           : (d == 64 ? paged_flash_decode_bf16_d64 : paged_flash_decode_bf16_d128);
    emu_launch({(unsigned)hkv, (unsigned)n, (unsigned)splits}, {32, 1, 1}, [&] {
        kernel(part.data(), q.data(), kb.data(), vb.data(), tables.data(), stride, lens.data(), hq, hkv, bs, scale, keys,
               nullptr, 0);
    });
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < hq; ++h)
            for (int sp = (lens[t] + keys - 1) / keys; sp < splits; ++sp) {
                const float* p = part.data() + (((size_t)t * hq + h) * splits + sp) * (d + 2);
                check(p[0] == -INFINITY && p[1] == 0.0f, "paged flash: an empty split's partial");
            }
    const std::vector<float> got = merged(part, n, hq, d, splits);
    const std::vector<double> want = paged_definition(q, kb, vb, tables, stride, lens, hq, hkv, d, bs, scale, half);
    cmp(std::string("paged_flash_decode_") + half.name() + "_d" + std::to_string(d) + " hq=" + std::to_string(hq) +
            " hkv=" + std::to_string(hkv) + " qmag=" + std::to_string(qmag) +
            " keys=" + std::to_string(keys) + " sequences=" + std::to_string(n) + " bs=" + std::to_string(bs),
        got, want, half.tolerance());
}

// Shared-prefix decode: sequences of group p (group[t] = p, -1 for none) begin with the same
// shared[p] blocks of the store; their shared keys go through paged_prefix_flash_bf16_d* (`pkeys`
// per split, one split more than the longest prefix needs: empty partials) and their own keys
// through paged_flash_decode_bf16_d* from starts[t]; every partial slot must be written by exactly
// one of the two, and the merge must give each sequence's attention over all its keys.
static void test_paged_prefix(int d, int hq, int hkv, std::vector<int> lens, std::vector<int> group,
                              std::vector<int> shared, int keys, int pkeys, std::mt19937& rng, int bs = 16,
                              Half half = {false}) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int n = (int)lens.size(), width = hkv * d, gh = hq / hkv, per_tile = PX_WARPS * (16 / gh);
    int stride = 0, next = 0;
    for (int l : lens) stride = std::max(stride, (l + bs - 1) / bs);
    std::vector<int> tables((size_t)n * stride, 0), starts(n, 0);
    std::vector<std::vector<int>> prefix_blocks(shared.size());
    for (size_t p = 0; p < shared.size(); ++p)
        for (int b = 0; b < shared[p]; ++b) prefix_blocks[p].push_back(next++);
    for (int t = 0; t < n; ++t) {
        int b = 0;
        if (group[t] >= 0) {
            for (int blk : prefix_blocks[group[t]]) tables[(size_t)t * stride + b++] = blk;
            starts[t] = shared[group[t]] * bs;
        }
        for (; b < (lens[t] + bs - 1) / bs; ++b) tables[(size_t)t * stride + b] = next++;
    }
    std::vector<int> tiles;
    int prefix_slots = 0, own_grouped = 0, own_alone = 0;
    for (size_t p = 0; p < shared.size(); ++p) {
        std::vector<int> members;
        for (int t = 0; t < n; ++t)
            if (group[t] == (int)p) members.push_back(t);
        for (size_t i = 0; i < members.size(); i += per_tile) {
            tiles.push_back(members[0]);
            tiles.push_back(shared[p] * bs);
            for (int j = 0; j < PX_WARPS * 16; ++j)
                tiles.push_back(j < per_tile && i + j < members.size() ? members[i + j] : -1);
        }
        prefix_slots = std::max(prefix_slots, (shared[p] * bs + pkeys - 1) / pkeys + 1);
    }
    for (int t = 0; t < n; ++t) {
        const int own = (lens[t] - starts[t] + keys - 1) / keys;
        if (starts[t] > 0) own_grouped = std::max(own_grouped, own);
        else own_alone = std::max(own_alone, own);
    }
    const int slots = std::max(own_grouped + prefix_slots, own_alone);
    std::vector<unsigned short> kb((size_t)next * bs * width), vb(kb.size());
    for (auto& x : kb) x = half.round(nd(rng));
    for (auto& x : vb) x = half.round(nd(rng));
    std::vector<float> q((size_t)n * hq * d);
    for (auto& x : q) x = 2.0f * nd(rng);
    // Each kernel into a buffer of its own, so that a slot written by both shows.
    std::vector<float> part((size_t)n * hq * slots * (d + 2), NAN), own_part(part);
    const float scale = 1.0f / std::sqrt((float)d);
    auto own_kernel = half.f16 ? (d == 64 ? paged_flash_decode_f16_d64 : paged_flash_decode_f16_d128)
                               : (d == 64 ? paged_flash_decode_bf16_d64 : paged_flash_decode_bf16_d128);
    auto prefix_kernel = half.f16 ? (d == 64 ? paged_prefix_flash_f16_d64 : paged_prefix_flash_f16_d128)
                                  : (d == 64 ? paged_prefix_flash_bf16_d64 : paged_prefix_flash_bf16_d128);
    emu_launch({(unsigned)hkv, (unsigned)n, (unsigned)slots}, {32, 1, 1}, [&] {
        own_kernel(own_part.data(), q.data(), kb.data(), vb.data(), tables.data(), stride, lens.data(), hq, hkv, bs, scale,
                   keys, starts.data(), prefix_slots);
    });
    emu_launch({(unsigned)hkv, (unsigned)(tiles.size() / PX_TILE), (unsigned)prefix_slots}, {PX_WARPS * 32, 1, 1}, [&] {
        prefix_kernel(part.data(), q.data(), kb.data(), vb.data(), tables.data(), stride, tiles.data(), hq, hkv, bs,
                      scale, pkeys, slots);
    });
    for (size_t i = 0; i < part.size(); i += d + 2) {
        check(std::isnan(part[i]) != std::isnan(own_part[i]), "paged prefix: a partial slot written by both or neither");
        if (std::isnan(part[i])) std::copy(own_part.begin() + i, own_part.begin() + i + d + 2, part.begin() + i);
    }
    const std::vector<float> got = merged(part, n, hq, d, slots);
    const std::vector<double> want = paged_definition(q, kb, vb, tables, stride, lens, hq, hkv, d, bs, scale, half);
    cmp(std::string("paged_prefix_flash_") + half.name() + "_d" + std::to_string(d) + " hq=" + std::to_string(hq) + " hkv=" + std::to_string(hkv) +
            " sequences=" + std::to_string(n) + " tiles=" + std::to_string(tiles.size() / PX_TILE) + " bs=" + std::to_string(bs),
        got, want, half.tolerance());
}

int main() {
    std::mt19937 rng(7);
    test_flash(64, 70, 100, 4, 2, rng);   // one query block, cut; 30 earlier rows
    test_flash(64, 200, 230, 2, 1, rng);  // two query blocks, the second cut
    test_flash(64, 64, 64, 2, 2, rng);    // one block, keys = queries
    test_flash(128, 80, 150, 4, 1, rng);  // four query heads per KV head; a partial key tile
    test_flash(128, 16, 16, 1, 1, rng);   // fewer queries than a warp's rows in the block
    test_flash(128, 260, 300, 2, 2, rng);  // three query blocks, five key tiles (double-buffered)
    test_flash(128, 100, 300, 4, 2, rng);  // keys before the chunk in several tiles
    test_flash(64, 200, 200, 4, 2, rng, 40, true);  // windows shorter than a tile: rows start in later tiles
    test_flash(64, 130, 300, 2, 1, rng, 128, false);  // gpt-oss's window over earlier rows
    test_flash(128, 100, 100, 2, 2, rng, 1, true);  // each query sees itself (and the sink)
    test_flash(64, 70, 100, 2, 2, rng, 0, true);  // sinks, no window
    test_paged_flash(128, 8, 2, {1, 17, 40, 100}, 32, rng);  // 4 heads per KV head; partial tiles
    test_paged_flash(128, 32, 8, {300, 5}, 160, rng);       // Llama-3's shape; one split of 5 keys
    test_paged_flash(64, 16, 2, {64, 33}, 48, rng);         // 8 heads per KV head (gpt-oss)
    test_paged_flash(64, 4, 4, {20}, 16, rng);              // one head per KV head
    test_paged_flash(128, 8, 2, {70, 9}, 32, rng, 12);      // blocks of 12 rows
    // Llama-3's shape: 18 sequences in two groups (the first over two tiles of 16 members), two
    // alone; a member whose own keys are one.
    test_paged_prefix(128, 32, 8, {100, 70, 65, 90, 80, 66, 75, 99, 81, 82, 83, 84, 85, 86, 87, 88, 89, 77, 200, 9},
                      {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, -1, -1}, {4, 2}, 32, 64, rng);
    test_paged_prefix(128, 32, 8, {70, 90, 40}, {0, 0, 0}, {2}, 32, 32, rng);  // P = 32: whole tiles
    test_paged_prefix(64, 16, 2, {100, 120, 50, 300}, {0, 0, 0, -1}, {3}, 48, 32, rng, 12);  // 8 heads a group; bs 12
    test_paged_prefix(64, 4, 4, {40, 41}, {0, 0}, {2}, 16, 32, rng);  // one head per KV head: 16 members a warp
    test_paged_prefix(128, 12, 4, {60, 61, 62, 63, 64, 65}, {0, 0, 0, 0, 0, 0}, {3}, 32, 96, rng);  // 3 heads: 15 rows
    // Over f16 stores (a GGUF model's caches): the same kernels with f16 MMAs, q scaled first.
    const Half f16{true};
    test_paged_flash(128, 8, 2, {1, 17, 40, 100}, 32, rng, 16, f16);
    test_paged_flash(128, 32, 8, {300, 5}, 160, rng, 16, f16);
    test_paged_flash(64, 16, 2, {64, 33}, 48, rng, 12, f16);
    // |q| past f16's largest value (65504): in range once scaled (one-hot softmax rows).
    test_paged_flash(128, 8, 2, {40, 70}, 32, rng, 16, f16, 30000.0f);
    test_paged_prefix(128, 32, 8, {70, 90, 40}, {0, 0, 0}, {2}, 32, 32, rng, 16, f16);
    test_paged_prefix(64, 16, 2, {100, 120, 50, 300}, {0, 0, 0, -1}, {3}, 48, 32, rng, 12, f16);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
