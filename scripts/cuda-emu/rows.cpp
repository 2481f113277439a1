// Runs the row kernels of elementwise.cu and fused.cu (rms_norm_f32, add_rms_norm_f32, rope_qk_f32
// and the two-launch argmax: argmax_part_f32 + argmax_final_f32) through cuda_emu.h on the CPU. The norms
// against the definition in f64 (relative 1e-5), add_rms_norm bit for bit against add + rms_norm
// on the 16-byte and the scalar paths; argmax and argmax_gap bit for bit against the CPU backend's
// rule (first maximum, strictly greater replaces, a leading NaN wins, NaN/inf make the gap NaN)
// on rows cut into several ranges; write_axis1's ring slots in a CUDA graph's replays against
// the rotating cache's rule. Built and run by run.sh, which prepends the kernel sources.
#include "kernels_rows.cpp"
#include "emu_check.h"
#include <cstdio>
#include <random>
#include <string>

// ops.rs norm_threads: the virtual threads of a row (a thread per 4 values, 32..1024), run
// `per_thread` (1, 2 or 4) to a thread where that divides them into whole warps.
static unsigned threads_for(int d, int per_thread = 1) {
    unsigned t = ((d + 3) / 4 + 31) / 32 * 32;
    t = t < 32 ? 32 : (t > 1024 ? 1024 : t);
    while (per_thread > 1 && t % (32 * per_thread)) per_thread /= 2;
    return t / per_thread;
}

// `with_bias`: the fused kernels also take a bias row (bf16), added to b as add_bias_f32 adds it.
static void test_norms(int rows, int d, int vec, std::mt19937& rng, bool with_bias = false) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> a(rows * d), b(rows * d), w(d);
    for (auto& v : a) v = nd(rng);
    for (auto& v : b) v = nd(rng);
    for (auto& v : w) v = nd(rng);
    std::vector<uint16_t> bias_bits(d);
    for (auto& v : bias_bits) v = emu_bf16_rn(nd(rng));
    const void* bias = with_bias ? bias_bits.data() : nullptr;
    std::vector<float> sum(rows * d), out(rows * d), ref_sum(rows * d), ref_out(rows * d);
    std::string tag = "rows=" + std::to_string(rows) + " d=" + std::to_string(d) + " vec=" + std::to_string(vec) +
                      (with_bias ? " bias" : "");
    for (int i = 0; i < rows * d; ++i) {
        const float bb = with_bias ? b[i] + load_float(bias, i % d, DT_BF16) : b[i];
        ref_sum[i] = a[i] + bb;
    }
    float eps = 1e-5f;
    // The fused kernel with 4 virtual threads per thread (a prefill's blocks), the reference with
    // 1 (a decode row's): bit for bit equal, as the row order does not depend on the block.
    emu_launch({(unsigned)rows, 1, 1}, {threads_for(d, 4), 1, 1}, [&] {
        add_rms_norm_f32(sum.data(), out.data(), a.data(), b.data(), bias, DT_BF16, w.data(), DT_F32, d, eps, vec, nullptr);
    });
    if (d % 128 == 0) {  // with the bf16 tiles of its output (a batched decode step's rows)
        const int padded = (rows + 7) / 8 * 8;
        std::vector<float> s2(rows * d), o2(rows * d);
        std::vector<unsigned> tiles((size_t)padded * d / 2, 0xdeadbeefu);
        for (int f : {1, 4}) {
            emu_launch({(unsigned)rows, 1, 1}, {threads_for(d, f), 1, 1}, [&] {
                add_rms_norm_f32(s2.data(), o2.data(), a.data(), b.data(), bias, DT_BF16, w.data(), DT_F32, d, eps, vec, tiles.data());
            });
            check(o2 == out && s2 == sum, "add_rms_norm with tiles = without " + tag);
            check_tiles("add_rms_norm_f32 tiles " + std::to_string(f) + " per thread " + tag, tiles.data(), o2.data(), rows, d);
        }
    }
    emu_launch({(unsigned)rows, 1, 1}, {threads_for(d), 1, 1}, [&] {
        rms_norm_f32(ref_out.data(), ref_sum.data(), w.data(), DT_F32, d, eps, vec);
    });
    std::vector<float> out2(rows * d);  // and rms_norm itself with 2 per thread
    emu_launch({(unsigned)rows, 1, 1}, {threads_for(d, 2), 1, 1}, [&] {
        rms_norm_f32(out2.data(), ref_sum.data(), w.data(), DT_F32, d, eps, vec);
    });
    check(std::memcmp(out2.data(), ref_out.data(), 4 * out2.size()) == 0, "rms_norm 2 per thread " + tag);
    if (rows == 1 && d % 32 == 0) {  // a decode row: the multi-block norms that write the parts
        // ops/fused.rs norm_row_cfg: up to 512 threads (F = 1, 2, 4), a block per warps' chunks.
        unsigned vt = threads_for(d), f = 1;
        while (f < 4 && (vt / f > 512 || vt % (32 * f))) f *= 2;
        if (vt % (32 * f)) f = 1;
        const unsigned threads = vt / f, blocks = (d / 32 + threads / 32 - 1) / (threads / 32);
        std::vector<unsigned> pa(QI_PARTS_WORDS(d / 32), 0xdeadbeefu), pr(pa);
        std::vector<float> s1(d, NAN), o1(d, NAN), o2(d, NAN);
        emu_launch({blocks, 1, 1}, {threads, 1, 1}, [&] {
            add_rms_norm_row_f32(s1.data(), o1.data(), a.data(), b.data(), bias, DT_BF16, w.data(), DT_F32, d, eps, vec, pa.data());
        });
        emu_launch({blocks, 1, 1}, {threads, 1, 1}, [&] {
            rms_norm_row_f32(o2.data(), ref_sum.data(), w.data(), DT_F32, d, eps, vec, pr.data());
        });
        check(o1 == ref_out && o2 == ref_out && s1 == ref_sum,
              "row norms over " + std::to_string(blocks) + " blocks of " + std::to_string(threads) + " = one block " + tag);
        check_parts("add_rms_norm_row_f32 parts " + tag, pa.data(), o1.data(), d);
        check_parts("rms_norm_row_f32 parts " + tag, pr.data(), o2.data(), d);
    }
    check(std::memcmp(sum.data(), ref_sum.data(), 4 * sum.size()) == 0, "add_rms_norm sum " + tag);
    check(std::memcmp(out.data(), ref_out.data(), 4 * out.size()) == 0, "add_rms_norm == add + rms_norm " + tag);
    for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < d; ++i) ss += (double)ref_sum[r * d + i] * ref_sum[r * d + i];
        double inv = 1.0 / std::sqrt(ss / d + eps);
        for (int i = 0; i < d; ++i) {
            double want = ref_sum[r * d + i] * inv * w[i];
            if (std::fabs(ref_out[r * d + i] - want) > 1e-5 * (1 + std::fabs(want))) {
                check(false, "rms_norm value " + tag);
                return;
            }
        }
    }
}

// rope_qk_f32 (a warp per head, 8 per block, 2 * half floats of cos/sin) against rope_f32 on the
// same heads (bit for bit: the same sincosf arguments and products) and, with norms, against the
// norm and rotation in f64 (relative 1e-5).
static void test_rope_qk(int l, int hq, int hkv, int d, int half, int traditional, int norm, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> q((size_t)l * hq * d), k((size_t)l * hkv * d), qw(d), kw(d), freqs(half);
    for (auto& v : q) v = nd(rng);
    for (auto& v : k) v = nd(rng);
    for (auto& v : qw) v = nd(rng);
    for (auto& v : kw) v = nd(rng);
    for (int f = 0; f < half; ++f) freqs[f] = std::pow(1e4f, -2.0f * f / (2 * half));
    const long long offset = 517;
    std::vector<float> qo(q.size(), NAN), ko(k.size(), NAN);
    emu_launch({(unsigned)((hq + hkv + 7) / 8), (unsigned)l, 1}, {256, 1, 1}, [&] {
        rope_qk_f32(qo.data(), ko.data(), q.data(), k.data(), qw.data(), kw.data(), DT_F32, 1e-6f, norm, freqs.data(),
                    half, hq, hkv, d, offset, traditional, nullptr);
    });
    std::string tag = "rope_qk l=" + std::to_string(l) + " hq=" + std::to_string(hq) + " hkv=" + std::to_string(hkv) +
                      " d=" + std::to_string(d) + " half=" + std::to_string(half) + " trad=" + std::to_string(traditional) +
                      " norm=" + std::to_string(norm);
    {  // rope_qk_kv_f32: the same queries, and keys / values in their caches at cache_off + t
        const int cap = l + 9, at = 5;
        std::vector<float> v(k.size()), kc((size_t)hkv * cap * d, 7.0f), vc(kc), q2(q.size(), NAN);
        for (auto& x : v) x = nd(rng);
        emu_launch({(unsigned)((hq + 2 * hkv + 7) / 8), (unsigned)l, 1}, {256, 1, 1}, [&] {
            rope_qk_kv_f32(q2.data(), kc.data(), vc.data(), q.data(), k.data(), v.data(), qw.data(), kw.data(), DT_F32,
                           1e-6f, norm, freqs.data(), half, hq, hkv, d, offset, traditional, nullptr, cap, at, DT_F32);
        });
        bool same = std::memcmp(q2.data(), qo.data(), 4 * q2.size()) == 0;
        for (int h = 0; h < hkv; ++h)
            for (int p = 0; p < cap; ++p)
                for (int i = 0; i < d; ++i) {
                    const size_t c = ((size_t)h * cap + p) * d + i;
                    const bool row = p >= at && p < at + l;
                    const size_t src = ((size_t)(p - at) * hkv + h) * d + i;
                    const float wk = row ? ko[src] : 7.0f, wv = row ? v[src] : 7.0f;
                    same = same && std::memcmp(&kc[c], &wk, 4) == 0 && std::memcmp(&vc[c], &wv, 4) == 0;
                }
        check(same, tag + " rope_qk_kv_f32 == rope_qk_f32 + the cache writes");
        // Caches of f16 and bf16: the f32 cache's values rounded to nearest even.
        for (int dt : {DT_F16, DT_BF16}) {
            std::vector<unsigned short> kh(kc.size(), 0x3c00), vh(kc.size(), 0x3c00);
            emu_launch({(unsigned)((hq + 2 * hkv + 7) / 8), (unsigned)l, 1}, {256, 1, 1}, [&] {
                rope_qk_kv_f32(q2.data(), kh.data(), vh.data(), q.data(), k.data(), v.data(), qw.data(), kw.data(),
                               DT_F32, 1e-6f, norm, freqs.data(), half, hq, hkv, d, offset, traditional, nullptr, cap,
                               at, dt);
            });
            auto round = [&](float f) -> unsigned short {
                if (dt == DT_F16) return emu_float_to_half(f);
                unsigned u;
                std::memcpy(&u, &f, 4);
                return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            };
            bool same_half = std::memcmp(q2.data(), qo.data(), 4 * q2.size()) == 0;
            for (int h = 0; h < hkv; ++h)
                for (int p = at; p < at + l; ++p)
                    for (int i = 0; i < d; ++i) {
                        const size_t c = ((size_t)h * cap + p) * d + i;
                        same_half = same_half && kh[c] == round(kc[c]) && vh[c] == round(vc[c]);
                    }
            same_half = same_half && kh[0] == 0x3c00 && vh.back() == 0x3c00;  // rows before and after untouched
            check(same_half, tag + (dt == DT_F16 ? " f16" : " bf16") + " caches == the f32 cache rounded");
        }
    }
    for (int is_q = 1; is_q >= 0; --is_q) {
        const std::vector<float>& x = is_q ? q : k;
        const std::vector<float>& got = is_q ? qo : ko;
        const std::vector<float>& w = is_q ? qw : kw;
        const int heads = is_q ? hq : hkv;
        if (!norm) {
            std::vector<float> want(x.size(), NAN);
            emu_launch({1, 1, 1}, {256, 1, 1}, [&] {
                rope_f32(want.data(), x.data(), freqs.data(), half, heads, d, offset, traditional, x.size(), nullptr);
            });
            check(std::memcmp(got.data(), want.data(), 4 * got.size()) == 0, tag + (is_q ? " q" : " k") + " == rope");
            continue;
        }
        std::vector<double> want(x.size());
        for (size_t r = 0; r < x.size() / d; ++r) {
            const float* h = &x[r * d];
            double ss = 0;
            for (int i = 0; i < d; ++i) ss += (double)h[i] * h[i];
            const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
            std::vector<double> n(d);
            for (int i = 0; i < d; ++i) n[i] = h[i] * inv * w[i];
            const double pos = (double)(offset + (long long)(r / heads));
            for (int i = 0; i < d; ++i) want[r * d + i] = n[i];
            for (int f = 0; f < half; ++f) {
                const int a = traditional ? 2 * f : f, b = traditional ? a + 1 : f + half;
                const double th = (double)(float)(pos * freqs[f]), c = std::cos(th), sn = std::sin(th);
                want[r * d + a] = n[a] * c - n[b] * sn;
                want[r * d + b] = n[a] * sn + n[b] * c;
            }
        }
        cmp(tag + (is_q ? " q" : " k"), got, want, 1e-5);
    }
}

// The CPU backend's argmax_gap of one row (crates/nuvec/src/backend.rs argmax_gap_row).
static void cpu_argmax_gap(const float* row, int n, unsigned out[3]) {
    int r = 0;
    float best = row[0];
    for (int i = 1; i < n; ++i)
        if (row[i] > best) { best = row[i]; r = i; }
    bool bad = false;
    for (int i = 0; i < n; ++i) bad |= !(std::fabs(row[i]) <= 3.402823466e38f);
    float before = -INFINITY;
    for (int i = 0; i < r; ++i) before = std::fmax(before, row[i]);
    float gap = bad ? __int_as_float(0x7fc00000) : row[r] - before;
    out[0] = r;
    out[1] = __float_as_uint(row[r]);
    out[2] = __float_as_uint(gap);
}

static void test_argmax(const std::vector<float>& x, int rows, int n, int chunk_values) {
    int parts = std::min(1024, std::max(1, (n + chunk_values - 1) / chunk_values));
    int chunk = (n + parts - 1) / parts;
    std::vector<unsigned> part(4 * rows * parts), gap(3 * rows), idx(rows);
    emu_launch({(unsigned)parts, (unsigned)rows, 1}, {256, 1, 1},
               [&] { argmax_part_f32(part.data(), x.data(), n, chunk, nullptr, 0, 0.0f); });
    emu_launch({(unsigned)rows, 1, 1}, {256, 1, 1},
               [&] { argmax_final_f32(gap.data(), part.data(), x.data(), n, parts, 1, nullptr, 0, 0.0f); });
    emu_launch({(unsigned)rows, 1, 1}, {256, 1, 1},
               [&] { argmax_final_f32(idx.data(), part.data(), x.data(), n, parts, 0, nullptr, 0, 0.0f); });
    for (int r = 0; r < rows; ++r) {
        unsigned want[3];
        cpu_argmax_gap(x.data() + (size_t)r * n, n, want);
        std::string tag = "n=" + std::to_string(n) + " parts=" + std::to_string(parts) + " row " + std::to_string(r);
        check(std::memcmp(&gap[3 * r], want, 12) == 0,
              "argmax_gap " + tag + " got " + std::to_string(gap[3 * r]) + " want " + std::to_string(want[0]));
        check(idx[r] == want[0], "argmax " + tag);
    }
    // Through a mask (masked_argmax_gap): the pick over the rows with the refused entries set to
    // the fill, as mask_rows writes them; words of all, none and some entries, and a row of none.
    const int words = (n + 31) / 32;
    const float fill = -3.402823466e38f;
    std::vector<unsigned> mask((size_t)rows * words);
    unsigned state = 12345u;
    for (size_t i = 0; i < mask.size(); ++i) {
        state = state * 1664525u + 1013904223u;
        mask[i] = i % 5 == 0 ? 0xffffffffu : i % 5 == 1 ? 0u : state;
    }
    for (int w = 0; w < words; ++w) mask[w] = 0;  // row 0: every entry refused
    std::vector<float> masked(x);
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < n; ++i)
            if (!((mask[(size_t)r * words + i / 32] >> (i % 32)) & 1u)) masked[(size_t)r * n + i] = fill;
    emu_launch({(unsigned)parts, (unsigned)rows, 1}, {256, 1, 1},
               [&] { argmax_part_f32(part.data(), x.data(), n, chunk, mask.data(), words, fill); });
    emu_launch({(unsigned)rows, 1, 1}, {256, 1, 1},
               [&] { argmax_final_f32(gap.data(), part.data(), x.data(), n, parts, 1, mask.data(), words, fill); });
    for (int r = 0; r < rows; ++r) {
        unsigned want[3];
        cpu_argmax_gap(masked.data() + (size_t)r * n, n, want);
        std::string tag = "n=" + std::to_string(n) + " parts=" + std::to_string(parts) + " row " + std::to_string(r);
        check(std::memcmp(&gap[3 * r], want, 12) == 0,
              "masked argmax_gap " + tag + " got " + std::to_string(gap[3 * r]) + " want " + std::to_string(want[0]));
    }
}

// write_axis1 into a ring (positions keep.. of `cap` reused in turn), captured writing slot s0:
// `delta` steps later the row lands where the rotating cache's rule puts it (the slot after the
// last, wrapping from cap to keep), in every A, nothing else written.
static void test_write_ring(int cap, int keep, int s0) {
    const int a = 2, c = 3;
    int slot = s0;
    for (int delta = 0; delta < 3 * cap; ++delta) {
        std::vector<float> dst((size_t)a * cap * c, 0.0f), src((size_t)a * c);
        for (size_t i = 0; i < src.size(); ++i) src[i] = 1.0f + (float)i;
        int step[4] = {delta, 0, 0, 0};
        emu_launch({1, 1, 1}, {64, 1, 1}, [&] {
            write_axis1(dst.data(), DT_F32, src.data(), DT_F32, (size_t)a * c, 1, cap, c, s0, step, 1, keep);
        });
        bool ok = true;
        for (int x = 0; x < a; ++x)
            for (int p = 0; p < cap; ++p)
                for (int e = 0; e < c; ++e)
                    ok &= dst[((size_t)x * cap + p) * c + e] == (p == slot ? src[(size_t)x * c + e] : 0.0f);
        if (!ok) {
            printf("FAIL write_axis1 ring cap %d keep %d from slot %d, %d steps later: not at slot %d\n", cap, keep, s0,
                   delta, slot);
            fails++;
            return;
        }
        if (++slot == cap) slot = keep;
    }
    printf("ok   write_axis1 into a ring of %d (keep %d) from slot %d: the rotating cache's slots for %d steps\n", cap,
           keep, s0, 3 * cap);
}

int main() {
    std::mt19937 rng(7);
    for (int vec : {1, 0}) {
        test_norms(2, 4096, vec, rng);
        test_norms(3, 1024, vec, rng);
        test_norms(1, 128, vec, rng);
        test_norms(1, 4096, vec, rng);
        test_norms(1, 1536, vec, rng);  // 384 virtual threads: 192 threads of 2
        test_norms(1, 1920, vec, rng);  // 480: one per thread
    }
    test_norms(9, 384, 1, rng);    // tiles: two tiles of rows, one partly filled
    test_norms(2, 6144, 1, rng);   // tiles: several quads per thread
    test_norms(2, 1001, 0, rng);  // not a multiple of 4: the scalar path's tail
    test_norms(1, 6000, 0, rng);  // over 1024 virtual threads' 4 values, a partial last pass
    test_norms(1, 20000, 1, rng);  // several quads per virtual thread
    for (int vec = 0; vec < 2; ++vec) {  // a projection's bias joining the residual add
        test_norms(1, 2880, vec, rng, true);
        test_norms(3, 2880, vec, rng, true);
    }
    test_norms(2, 1001, 0, rng, true);
    std::mt19937 rr(11);
    for (int norm : {0, 1})
        for (int trad : {0, 1}) {
            test_rope_qk(3, 16, 8, 128, 64, trad, norm, rr);  // three blocks per position
            test_rope_qk(2, 3, 1, 80, 20, trad, norm, rr);    // partial rotation, a block part empty
            test_rope_qk(1, 5, 3, 256, 128, trad, norm, rr);  // two batches of pairs per lane
        }
    // argmax: the ops' ranges of 1024 values, and 100-value ranges for more of them per row.
    int n = 5000;
    std::normal_distribution<float> nd(0.0f, 5.0f);
    std::vector<float> x(9 * n);
    for (auto& v : x) v = nd(rng);
    x[100] = 30.0f;  // row 0: a tie in a later range
    x[3000] = 30.0f;
    x[n + 4999] = 30.0f;  // row 1: maximum last, near tie first
    x[n + 7] = std::nextafter(30.0f, 0.0f);
    for (int i = 1000; i < 2000; ++i) x[2 * n + i] = NAN;  // row 2: a range of NaN
    x[3 * n] = NAN;  // row 3: a leading NaN
    x[4 * n + 1000] = 30.0f;  // row 4: the maximum at a range's start
    x[4 * n + 999] = std::nextafter(30.0f, 0.0f);
    for (int i = 0; i < n; ++i) x[5 * n + i] = -INFINITY;  // row 5: all -inf
    x[6 * n + 4000] = INFINITY;  // row 6: +inf late
    for (int i = 0; i < n; ++i) x[7 * n + i] = NAN;  // row 7: all NaN
    x[8 * n + 0] = 30.0f;  // row 8: maximum first
    test_argmax(x, 9, n, 1024);
    test_argmax(x, 9, n, 100);
    test_argmax(std::vector<float>(x.begin(), x.begin() + 9 * 7), 9, 7, 1024);  // one short range
    test_write_ring(8, 0, 5);
    test_write_ring(10, 4, 9);
    test_write_ring(10, 4, 4);
    printf("%d failures\n", fails);
    return fails != 0;
}
