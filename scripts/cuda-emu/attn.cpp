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

int main() {
    std::mt19937 rng(7);
    test_flash(64, 70, 100, 4, 2, rng);   // one query block, cut; 30 earlier rows
    test_flash(64, 200, 230, 2, 1, rng);  // two query blocks, the second cut
    test_flash(64, 64, 64, 2, 2, rng);    // one block, keys = queries
    test_flash(128, 80, 150, 4, 1, rng);  // four query heads per KV head; a partial key tile
    test_flash(128, 16, 16, 1, 1, rng);   // fewer queries than a warp's rows in the block
    test_flash(128, 260, 300, 2, 2, rng);  // three query blocks, five key tiles (double-buffered)
    test_flash(128, 100, 300, 4, 2, rng);  // keys before the chunk in several tiles
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
