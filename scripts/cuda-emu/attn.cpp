// Runs the flash-attention prefill kernels (flash_attention.cu) through cuda_emu.h on the CPU:
// causal attention with grouped KV heads against its definition in f64 on the same bf16-rounded
// q, k and v. The kernel also rounds the probabilities to bf16 before P V (as the cuBLAS path
// did), so the tolerance is bf16's (relative 8e-3 of |want| + mean|want|). Cases: head sizes 64
// and 128, a query block cut by L, keys past a tile's end, queries after earlier cache rows
// (kv_len > L) and one KV head per 1, 2 and 4 query heads. Built and run by run.sh.
#include "kernels_attn.cpp"
#include "emu_check.h"
#include <cstdio>
#include <random>
#include <string>

static void test_flash(int d, int l, int kv_len, int hq, int hkv, std::mt19937& rng) {
    const int warps = d == 64 ? 4 : 8;  // as the kernels take them
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q((size_t)l * hq * d), out((size_t)l * hq * d, NAN);
    std::vector<unsigned short> kb((size_t)hkv * kv_len * d), vb((size_t)hkv * kv_len * d);
    for (auto& v : q) v = 2.0f * nd(rng);
    for (auto& v : kb) v = emu_bf16_rn(nd(rng));
    for (auto& v : vb) v = emu_bf16_rn(nd(rng));
    const float scale = 1.0f / std::sqrt((float)d);
    auto kernel = d == 64 ? flash_attn_bf16_d64 : flash_attn_bf16_d128;
    emu_launch({(unsigned)hq, (unsigned)((l + 16 * warps - 1) / (16 * warps)), 1}, {(unsigned)warps * 32, 1, 1},
               [&] { kernel(out.data(), q.data(), kb.data(), vb.data(), l, kv_len, hq, hkv, scale); });
    std::vector<double> want((size_t)l * hq * d);
    const int first = kv_len - l;
    for (int t = 0; t < l; ++t)
        for (int h = 0; h < hq; ++h) {
            const int kvh = h / (hq / hkv), n = first + t + 1;
            std::vector<double> s(n);
            double mx = -INFINITY;
            for (int j = 0; j < n; ++j) {
                double dot = 0;
                for (int c = 0; c < d; ++c)
                    dot += (double)emu_bf16(emu_bf16_rn(q[((size_t)t * hq + h) * d + c])) *
                           emu_bf16(kb[((size_t)kvh * kv_len + j) * d + c]);
                s[j] = dot * scale;
                mx = std::max(mx, s[j]);
            }
            double sum = 0;
            for (int j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
            for (int c = 0; c < d; ++c) {
                double o = 0;
                for (int j = 0; j < n; ++j) o += s[j] * emu_bf16(vb[((size_t)kvh * kv_len + j) * d + c]);
                want[((size_t)t * hq + h) * d + c] = o / sum;
            }
        }
    cmp("flash_attn_bf16_d" + std::to_string(d) + " l=" + std::to_string(l) + " kv=" + std::to_string(kv_len) +
            " hq=" + std::to_string(hq) + " hkv=" + std::to_string(hkv),
        out, want, 8e-3);
}

// The paged decode kernel (paged_flash_decode_bf16_d*): n sequences of `lens` keys in a store of
// blocks of `bs` (16, or 12: not a power of two) taken in reverse order, `keys` per split; the partials combined here as
// attention_merge_f32 combines them, against the definition on the bf16-rounded q, k and v (the
// probabilities rounded as the prefill kernels round them: the same tolerance). Splits past a
// sequence's end must hold the empty partial (maximum -inf, sum 0).
static void test_paged_flash(int d, int hq, int hkv, std::vector<int> lens, int keys, std::mt19937& rng,
                             int bs = 16) {
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
    for (auto& x : kb) x = emu_bf16_rn(nd(rng));
    for (auto& x : vb) x = emu_bf16_rn(nd(rng));
    std::vector<float> q((size_t)n * hq * d);
    for (auto& x : q) x = 2.0f * nd(rng);
    std::vector<float> part((size_t)n * hq * splits * (d + 2), NAN);
    const float scale = 1.0f / std::sqrt((float)d);
    auto kernel = d == 64 ? paged_flash_decode_bf16_d64 : paged_flash_decode_bf16_d128;
    emu_launch({(unsigned)hkv, (unsigned)n, (unsigned)splits}, {32, 1, 1}, [&] {
        kernel(part.data(), q.data(), kb.data(), vb.data(), tables.data(), stride, lens.data(), hq, hkv, bs, scale, keys);
    });
    std::vector<float> got((size_t)n * hq * d);
    std::vector<double> want(got.size());
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < hq; ++h) {
            const float* p = part.data() + ((size_t)t * hq + h) * splits * (d + 2);
            const int used = (lens[t] + keys - 1) / keys;
            for (int sp = used; sp < splits; ++sp)
                check(p[(size_t)sp * (d + 2)] == -INFINITY && p[(size_t)sp * (d + 2) + 1] == 0.0f,
                      "paged flash: an empty split's partial");
            double m = -INFINITY, tot = 0;
            for (int sp = 0; sp < splits; ++sp) m = std::max(m, (double)p[(size_t)sp * (d + 2)]);
            for (int sp = 0; sp < used; ++sp) tot += p[(size_t)sp * (d + 2) + 1] * std::exp(p[(size_t)sp * (d + 2)] - m);
            for (int c = 0; c < d; ++c) {
                double a = 0;
                for (int sp = 0; sp < used; ++sp) a += std::exp(p[(size_t)sp * (d + 2)] - m) * p[(size_t)sp * (d + 2) + 2 + c];
                got[((size_t)t * hq + h) * d + c] = (float)(a / tot);
            }
            // The definition: key j of sequence t is row table[j / bs] * bs + j % bs of the store.
            const int kvh = h / (hq / hkv), len = lens[t];
            std::vector<double> sc(len);
            double mx = -INFINITY;
            auto at = [&](int j) { return ((size_t)tables[(size_t)t * stride + j / bs] * bs + j % bs) * width + (size_t)kvh * d; };
            for (int j = 0; j < len; ++j) {
                double dot = 0;
                for (int c = 0; c < d; ++c) dot += (double)emu_bf16(emu_bf16_rn(q[((size_t)t * hq + h) * d + c])) * emu_bf16(kb[at(j) + c]);
                mx = std::max(mx, sc[j] = dot * scale);
            }
            double sum = 0;
            for (int j = 0; j < len; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
            for (int c = 0; c < d; ++c) {
                double o = 0;
                for (int j = 0; j < len; ++j) o += sc[j] * emu_bf16(vb[at(j) + c]);
                want[((size_t)t * hq + h) * d + c] = o / sum;
            }
        }
    cmp("paged_flash_decode_bf16_d" + std::to_string(d) + " hq=" + std::to_string(hq) + " hkv=" + std::to_string(hkv) +
            " keys=" + std::to_string(keys) + " sequences=" + std::to_string(n) + " bs=" + std::to_string(bs),
        got, want, 8e-3);
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
    test_paged_flash(128, 8, 2, {1, 17, 40, 100}, 32, rng);  // 4 heads per KV head; partial tiles
    test_paged_flash(128, 32, 8, {300, 5}, 160, rng);       // Llama-3's shape; one split of 5 keys
    test_paged_flash(64, 16, 2, {64, 33}, 48, rng);         // 8 heads per KV head (gpt-oss)
    test_paged_flash(64, 4, 4, {20}, 16, rng);              // one head per KV head
    test_paged_flash(128, 8, 2, {70, 9}, 32, rng, 12);      // blocks of 12 rows
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
