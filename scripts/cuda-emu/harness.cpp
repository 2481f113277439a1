// Runs the Gated DeltaNet and gpt-oss kernels (and the attention paths with and without sinks, and split
// attention reading its kv length from a graph's step scalars, against eager bit for bit) through
// cuda_emu.h on the CPU and compares them with the ops written from their definitions in f64
// (tolerance 1e-4 relative to |want| + mean|want|; the convolution's next state exactly).
// Built and run by run.sh, which prepends the kernel sources.
#include "kernels.cpp"
#include "emu_check.h"
#include <cstdio>
#include <random>

static std::mt19937 rng(7);
static std::vector<float> rnd(size_t n, float s) {
    std::uniform_real_distribution<float> d(-s, s);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}
static unsigned short to_bf16(float f) { unsigned u; memcpy(&u, &f, 4); return (u + 0x7fff + ((u >> 16) & 1)) >> 16; }
static float from_bf16(unsigned short h) { unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f; }

// ---- conv ----
static void test_conv(int l, int c, int k, int wdt) {
    int keep = k - 1;
    auto x = rnd((size_t)l * c, 2), st = rnd((size_t)keep * c, 1), w = rnd((size_t)c * k, 0.5);
    std::vector<unsigned short> wb(w.size());
    if (wdt == DT_BF16) for (size_t i = 0; i < w.size(); ++i) { wb[i] = to_bf16(w[i]); w[i] = from_bf16(wb[i]); }
    std::vector<float> out((size_t)l * c), next((size_t)keep * c);
    const void* wp = wdt == DT_BF16 ? (const void*)wb.data() : (const void*)w.data();
    emu_launch({2, 1, 1}, {64, 1, 1}, [&] { conv1d_silu_f32(out.data(), next.data(), x.data(), st.data(), wp, wdt, l, c, keep); });
    auto row = [&](int r, int ch) -> double { return r < keep ? st[(size_t)r * c + ch] : x[(size_t)(r - keep) * c + ch]; };
    std::vector<double> want((size_t)l * c), wn((size_t)keep * c);
    for (int t = 0; t < l; ++t) for (int ch = 0; ch < c; ++ch) {
        double acc = 0; for (int j = 0; j < k; ++j) acc += w[(size_t)ch * k + j] * row(t + j, ch);
        want[(size_t)t * c + ch] = acc / (1 + std::exp(-acc));
    }
    for (int r = 0; r < keep; ++r) for (int ch = 0; ch < c; ++ch) wn[(size_t)r * c + ch] = row(l + r, ch);
    char name[200]; snprintf(name, 200, "conv L=%d C=%d K=%d wdt=%d", l, c, k, wdt);
    cmp(name, out, want);
    cmp(std::string(name) + " next", next, wn, 0);
}

// ---- gated delta ----
static void test_delta(int hk, int hv, int dk, int dv, int l, bool bias_bf16 = false) {
    int width = 2 * hk * dk + hv * dv;
    auto mixed = rnd((size_t)l * width, 1), a = rnd((size_t)l * hv, 3), b = rnd((size_t)l * hv, 3);
    auto alog = rnd(hv, 1), dtb = rnd(hv, 1), state = rnd((size_t)hv * dv * dk, 0.3);
    std::vector<unsigned short> dtb16(hv);  // dt_bias in bf16 next to an f32 a_log, as mlx-lm converts
    for (int h = 0; h < hv; ++h) { dtb16[h] = to_bf16(dtb[h]); if (bias_bf16) dtb[h] = from_bf16(dtb16[h]); }
    const void* dtp = bias_bf16 ? (const void*)dtb16.data() : (const void*)dtb.data();
    std::vector<float> y((size_t)l * hv * dv), next((size_t)hv * dv * dk);
    double inv_scale = std::pow((double)dk, -0.5);
    float eps = (float)(1e-6 * inv_scale * inv_scale), qs = (float)(inv_scale * inv_scale), ks = (float)inv_scale;
    dim3 grid{(unsigned)hv, (unsigned)((dv + 15) / 16), 1};
    emu_launch(grid, {128, 1, 1}, [&] {
        gated_delta_f32(y.data(), next.data(), mixed.data(), a.data(), b.data(), alog.data(), dtp, DT_F32,
                        bias_bf16 ? DT_BF16 : DT_F32, state.data(), l, hk, hv, dk, dv, eps, qs, ks);
    });
    // reference in double from the definition
    std::vector<double> S(state.begin(), state.end()), wy((size_t)l * hv * dv);
    for (int t = 0; t < l; ++t) {
        const float* row = &mixed[(size_t)t * width];
        for (int h = 0; h < hv; ++h) {
            int kh = h / (hv / hk);
            auto norm = [&](const float* x, double scale) {
                double ss = 0; for (int i = 0; i < dk; ++i) ss += (double)x[i] * x[i];
                std::vector<double> o(dk);
                for (int i = 0; i < dk; ++i) o[i] = x[i] / std::sqrt(ss / dk + 1e-6 / dk) * scale;
                return o;
            };
            auto q = norm(row + kh * dk, 1.0 / dk), k = norm(row + hk * dk + kh * dk, inv_scale);
            const float* v = row + 2 * hk * dk + h * dv;
            double x = a[(size_t)t * hv + h] + dtb[h];
            double sp = std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x)));
            double g = std::exp(-std::exp((double)alog[h]) * sp), beta = 1 / (1 + std::exp(-(double)b[(size_t)t * hv + h]));
            for (int r = 0; r < dv; ++r) {
                double* s = &S[((size_t)h * dv + r) * dk];
                double mem = 0; for (int j = 0; j < dk; ++j) { s[j] *= g; mem += s[j] * k[j]; }
                double delta = (v[r] - mem) * beta, o = 0;
                for (int j = 0; j < dk; ++j) { s[j] += k[j] * delta; o += s[j] * q[j]; }
                wy[((size_t)t * hv + h) * dv + r] = o;
            }
        }
    }
    char name[200];
    snprintf(name, 200, "gated_delta Hk=%d Hv=%d Dk=%d Dv=%d L=%d dt_bias %s", hk, hv, dk, dv, l, bias_bf16 ? "bf16" : "f32");
    cmp(name, y, wy);
    cmp(std::string(name) + " state", next, S);
}

// ---- attention with sinks ----
// window > 0 (the softmax path only): each query sees the `window` newest keys up to its own.
static void test_attn(int l, int kv, int hq, int hkv, int d, bool sink, int path, int window = 0) {
    int cap = kv + 5;
    auto q = rnd((size_t)l * hq * d, 1), k = rnd((size_t)hkv * cap * d, 1), v = rnd((size_t)hkv * cap * d, 1);
    auto sinks = rnd(hq, 3); sinks[0] = 12; if (hq > 1) sinks[1] = -12;
    const float* sp = sink ? sinks.data() : nullptr;
    float scale = 1 / std::sqrt((float)d);
    std::vector<float> out((size_t)l * hq * d);
    if (path == 0) {  // fallback
        emu_launch({(unsigned)hq, (unsigned)l, 1}, {128, 1, 1}, [&] {
            attention_f32(out.data(), q.data(), k.data(), v.data(), l, hq, hkv, d, cap, kv, scale, sp, DT_F32);
        });
    } else if (path == 1) {  // split
        int want = std::max(1, (512 + hq * l - 1) / (hq * l));
        int chunk = std::max(32, (kv + want - 1) / want), splits = std::max(1, (kv + chunk - 1) / chunk);
        std::vector<float> part((size_t)l * hq * splits * (d + 2));
        emu_launch({(unsigned)hq, (unsigned)l, (unsigned)splits}, {128, 1, 1}, [&] {
            attention_split_f32(part.data(), q.data(), k.data(), v.data(), l, hq, hkv, d, cap, kv, scale, chunk, nullptr, want, DT_F32, 0);
        });
        emu_launch({(unsigned)hq, (unsigned)l, 1}, {128, 1, 1}, [&] { attention_merge_f32(out.data(), part.data(), hq, d, splits, sp, nullptr, nullptr); });
    } else {  // scores by hand (as the SGEMM would), then the causal softmax kernel, then PV by hand
        int first = kv - l, n = kv;
        std::vector<float> sc((size_t)hq * l * n);
        for (int h = 0; h < hq; ++h) for (int r = 0; r < l; ++r) for (int j = 0; j < n; ++j) {
            int g = h / (hq / hkv); double dot = 0;
            for (int c = 0; c < d; ++c) dot += (double)q[((size_t)r * hq + h) * d + c] * k[((size_t)g * cap + j) * d + c];
            sc[((size_t)h * l + r) * n + j] = (float)(dot * scale);
        }
        emu_launch({(unsigned)l, (unsigned)hq, 1}, {256, 1, 1}, [&] { causal_softmax_f32(sc.data(), l, n, first, sp, window); });
        for (int h = 0; h < hq; ++h) for (int r = 0; r < l; ++r) for (int c = 0; c < d; ++c) {
            int g = h / (hq / hkv); double acc = 0;
            for (int j = 0; j < n; ++j) acc += (double)sc[((size_t)h * l + r) * n + j] * v[((size_t)g * cap + j) * d + c];
            out[((size_t)r * hq + h) * d + c] = (float)acc;
        }
    }
    std::vector<double> want(out.size());
    for (int t = 0; t < l; ++t) for (int h = 0; h < hq; ++h) {
        int g = h / (hq / hkv), n = kv - l + t + 1, lo = window > 0 ? std::max(0, n - window) : 0;
        std::vector<double> s(n, -INFINITY); double m = sink ? sinks[h] : -INFINITY;
        for (int j = lo; j < n; ++j) { double dot = 0; for (int c = 0; c < d; ++c) dot += (double)q[((size_t)t * hq + h) * d + c] * k[((size_t)g * cap + j) * d + c]; s[j] = dot * scale; m = std::max(m, s[j]); }
        double den = sink ? std::exp(sinks[h] - m) : 0;
        for (int j = lo; j < n; ++j) den += std::exp(s[j] - m);
        for (int c = 0; c < d; ++c) { double acc = 0; for (int j = lo; j < n; ++j) acc += std::exp(s[j] - m) / den * v[((size_t)g * cap + j) * d + c]; want[((size_t)t * hq + h) * d + c] = acc; }
    }
    char name[200]; snprintf(name, 200, "attention path=%d sinks=%d L=%d kv=%d Hq=%d Hkv=%d D=%d window=%d", path, sink, l, kv, hq, hkv, d, window);
    cmp(name, out, want);
    if (path == 1 && l == 1 && d % 32 == 0) {  // a decode row: the merge again, writing the parts too
        int want_s = std::max(1, (512 + hq - 1) / hq);
        int chunk = std::max(32, (kv + want_s - 1) / want_s), splits = std::max(1, (kv + chunk - 1) / chunk);
        std::vector<float> part((size_t)hq * splits * (d + 2)), o2(out.size());
        std::vector<unsigned> parts(QI_PARTS_WORDS(hq * d / 32), 0xdeadbeefu);
        emu_launch({(unsigned)hq, 1, (unsigned)splits}, {128, 1, 1}, [&] {
            attention_split_f32(part.data(), q.data(), k.data(), v.data(), l, hq, hkv, d, cap, kv, scale, chunk, nullptr, want_s, DT_F32, 0);
        });
        emu_launch({(unsigned)hq, 1, 1}, {128, 1, 1}, [&] { attention_merge_f32(o2.data(), part.data(), hq, d, splits, sp, parts.data(), nullptr); });
        check(o2 == out, std::string(name) + " with parts: same output");
        check_parts(std::string(name) + " merge parts", parts.data(), o2.data(), hq * d);
    }
    if (path == 1 && d % 32 == 0) {  // the merge again, writing the output's bf16 tiles too
        int want_s = std::max(1, (512 + hq * l - 1) / (hq * l));
        int chunk = std::max(32, (kv + want_s - 1) / want_s), splits = std::max(1, (kv + chunk - 1) / chunk);
        std::vector<float> part((size_t)l * hq * splits * (d + 2)), o2(out.size());
        std::vector<unsigned> tiles((size_t)(l + 7) / 8 * 8 * hq * d / 2, 0xdeadbeefu);
        emu_launch({(unsigned)hq, (unsigned)l, (unsigned)splits}, {128, 1, 1}, [&] {
            attention_split_f32(part.data(), q.data(), k.data(), v.data(), l, hq, hkv, d, cap, kv, scale, chunk, nullptr, want_s, DT_F32, 0);
        });
        emu_launch({(unsigned)hq, (unsigned)l, 1}, {128, 1, 1}, [&] { attention_merge_f32(o2.data(), part.data(), hq, d, splits, sp, nullptr, tiles.data()); });
        check(o2 == out, std::string(name) + " with tiles: same output");
        check_tiles(std::string(name) + " merge tiles", tiles.data(), o2.data(), l, hq * d);
    }
}

// ---- split attention reading its kv length from the step scalars (CUDA graphs) ----
// The launch a graph captured at kv length kv0 (grid of `want` splits, chunk of kv0, step
// scalars {kv - kv0, token}) against the eager launch at kv (its own splits and chunk): the
// outputs must be equal bit for bit.
static void split_launch(std::vector<float>& out, const std::vector<float>& q, const std::vector<float>& k,
                         const std::vector<float>& v, int l, int hq, int hkv, int d, int cap, int kv, float scale,
                         const float* sp, const int* step, int kv_arg, int want, int chunk, int splits, int ring = 0) {
    std::vector<float> part((size_t)l * hq * splits * (d + 2));
    emu_launch({(unsigned)hq, (unsigned)l, (unsigned)splits}, {128, 1, 1}, [&] {
        attention_split_f32(part.data(), q.data(), k.data(), v.data(), l, hq, hkv, d, cap, kv_arg, scale, chunk, step, want, DT_F32, ring);
    });
    emu_launch({(unsigned)hq, (unsigned)l, 1}, {128, 1, 1}, [&] { attention_merge_f32(out.data(), part.data(), hq, d, splits, sp, nullptr, nullptr); });
}
// A rotating cache's ring of `cap` slots, captured at kv0 < cap: a replay `delta` steps later
// attends min(kv0 + delta, cap) slots, bit for bit the eager launch over that many.
static void test_attn_ring(int hq, int hkv, int d, bool sink, int cap, int kv0, std::vector<int> deltas) {
    const int l = 1;
    auto q = rnd((size_t)hq * d, 1), k = rnd((size_t)hkv * cap * d, 1), v = rnd((size_t)hkv * cap * d, 1);
    auto sinks = rnd(hq, 3);
    const float* sp = sink ? sinks.data() : nullptr;
    float scale = 1 / std::sqrt((float)d);
    int want = std::max(1, (512 + hq - 1) / hq);
    auto split = [&](int kv, int& chunk, int& splits) {
        chunk = std::max(32, (kv + want - 1) / want);
        splits = std::max(1, (kv + chunk - 1) / chunk);
    };
    int chunk0, splits0;
    split(kv0, chunk0, splits0);
    for (int delta : deltas) {
        int kv = std::min(kv0 + delta, cap), chunk, splits;
        split(kv, chunk, splits);
        std::vector<float> eager((size_t)hq * d), graph((size_t)hq * d);
        split_launch(eager, q, k, v, l, hq, hkv, d, cap, kv, scale, sp, nullptr, kv, want, chunk, splits);
        int step[4] = {delta, 0, 0, 0};
        split_launch(graph, q, k, v, l, hq, hkv, d, cap, kv, scale, sp, step, kv0, want, chunk0, std::max(want, splits0), 1);
        bool same = memcmp(eager.data(), graph.data(), eager.size() * 4) == 0;
        printf("%s attention split over a ring of %d, captured at %d, %d steps later (sinks=%d): %s\n",
               same ? "ok  " : "FAIL", cap, kv0, delta, sink, same ? "bit-identical to eager" : "differs from eager");
        fails += !same;
    }
}

static void test_attn_step(int l, int hq, int hkv, int d, bool sink, int kv0, std::vector<int> kvs) {
    int cap = 700;
    auto q = rnd((size_t)l * hq * d, 1), k = rnd((size_t)hkv * cap * d, 1), v = rnd((size_t)hkv * cap * d, 1);
    auto sinks = rnd(hq, 3);
    const float* sp = sink ? sinks.data() : nullptr;
    float scale = 1 / std::sqrt((float)d);
    int want = std::max(1, (512 + hq * l - 1) / (hq * l));
    auto split = [&](int kv, int& chunk, int& splits) {
        chunk = std::max(32, (kv + want - 1) / want);
        splits = std::max(1, (kv + chunk - 1) / chunk);
    };
    int chunk0, splits0;
    split(kv0, chunk0, splits0);
    for (int kv : kvs) {
        int chunk, splits;
        split(kv, chunk, splits);
        std::vector<float> eager((size_t)l * hq * d), graph((size_t)l * hq * d);
        split_launch(eager, q, k, v, l, hq, hkv, d, cap, kv, scale, sp, nullptr, kv, want, chunk, splits);
        int step[4] = {kv - kv0, 0, 0, 0};
        split_launch(graph, q, k, v, l, hq, hkv, d, cap, kv, scale, sp, step, kv0, want, chunk0, std::max(want, splits0));
        bool same = memcmp(eager.data(), graph.data(), eager.size() * 4) == 0;
        printf("%s attention split, step scalars: kv %d captured at %d, L=%d Hq=%d D=%d sinks=%d (%d of %d splits used): %s\n",
               same ? "ok  " : "FAIL", kv, kv0, l, hq, d, sink, splits, std::max(want, splits0),
               same ? "bit-identical to eager" : "differs from eager");
        fails += !same;
    }
}

// ---- keys and values in f16 or bf16: the split kernel and the fallback over a cache of them,
// against f64 over the rounded values; the paged kernel over the same rows scattered into blocks
// through a reversed table, bit for bit the split kernel's (a decode row per sequence) ----
static unsigned short round_half(float f, int dt) { return dt == DT_F16 ? emu_float_to_half(f) : to_bf16(f); }
static float widen_half(unsigned short h, int dt) { return dt == DT_F16 ? emu_half_to_float(h) : from_bf16(h); }
static void test_attn_half(int l, int kv, int hq, int hkv, int d, int dt, bool sink) {
    const int cap = kv + 3, bs = 16;
    auto q = rnd((size_t)l * hq * d, 1), kf = rnd((size_t)hkv * cap * d, 1), vf = rnd((size_t)hkv * cap * d, 1);
    std::vector<unsigned short> kh(kf.size()), vh(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
        kh[i] = round_half(kf[i], dt), kf[i] = widen_half(kh[i], dt);
        vh[i] = round_half(vf[i], dt), vf[i] = widen_half(vh[i], dt);
    }
    auto sinks = rnd(hq, 3);
    const float* sp = sink ? sinks.data() : nullptr;
    float scale = 1 / std::sqrt((float)d);
    std::vector<double> want((size_t)l * hq * d);
    for (int t = 0; t < l; ++t) for (int h = 0; h < hq; ++h) {
        int g = h / (hq / hkv), n = kv - l + t + 1;
        std::vector<double> sc(n); double m = sink ? sinks[h] : -INFINITY;
        for (int j = 0; j < n; ++j) { double dot = 0; for (int c = 0; c < d; ++c) dot += (double)q[((size_t)t * hq + h) * d + c] * kf[((size_t)g * cap + j) * d + c]; sc[j] = dot * scale; m = std::max(m, sc[j]); }
        double den = sink ? std::exp(sinks[h] - m) : 0;
        for (int j = 0; j < n; ++j) den += std::exp(sc[j] - m);
        for (int c = 0; c < d; ++c) { double acc = 0; for (int j = 0; j < n; ++j) acc += std::exp(sc[j] - m) / den * vf[((size_t)g * cap + j) * d + c]; want[((size_t)t * hq + h) * d + c] = acc; }
    }
    char name[200];
    snprintf(name, 200, "attention over a %s cache sinks=%d L=%d kv=%d Hq=%d Hkv=%d D=%d", dt == DT_F16 ? "f16" : "bf16", sink, l, kv, hq, hkv, d);
    int want_s = std::max(1, (512 + hq * l - 1) / (hq * l));
    int chunk = std::max(32, (kv + want_s - 1) / want_s), splits = std::max(1, (kv + chunk - 1) / chunk);
    std::vector<float> split((size_t)l * hq * d), fallback(split.size());
    {
        std::vector<float> part((size_t)l * hq * splits * (d + 2));
        emu_launch({(unsigned)hq, (unsigned)l, (unsigned)splits}, {128, 1, 1}, [&] {
            attention_split_f32(part.data(), q.data(), kh.data(), vh.data(), l, hq, hkv, d, cap, kv, scale, chunk, nullptr, want_s, dt, 0);
        });
        emu_launch({(unsigned)hq, (unsigned)l, 1}, {128, 1, 1}, [&] { attention_merge_f32(split.data(), part.data(), hq, d, splits, sp, nullptr, nullptr); });
        cmp(std::string(name) + " split", split, want);
    }
    emu_launch({(unsigned)hq, (unsigned)l, 1}, {128, 1, 1}, [&] {
        attention_f32(fallback.data(), q.data(), kh.data(), vh.data(), l, hq, hkv, d, cap, kv, scale, sp, dt);
    });
    cmp(std::string(name) + " fallback", fallback, want);
    if (l != 1) return;
    // The paged store: the same rows of every KV head, position-major, in blocks of 16 in reverse
    // order; the kernel's splits for one query are the split kernel's.
    const int blocks = (kv + bs - 1) / bs;
    std::vector<int> table(blocks);
    for (int b = 0; b < blocks; ++b) table[b] = blocks - 1 - b;  // the last block first
    std::vector<unsigned short> ks((size_t)blocks * bs * hkv * d, 0), vs(ks.size(), 0);
    for (int j = 0; j < kv; ++j) for (int g = 0; g < hkv; ++g) for (int c = 0; c < d; ++c) {
        size_t at = (((size_t)table[j / bs] * bs + j % bs) * hkv + g) * d + c, from = ((size_t)g * cap + j) * d + c;
        ks[at] = kh[from], vs[at] = vh[from];
    }
    std::vector<float> part((size_t)hq * want_s * (d + 2)), paged(split.size());
    int lens[1] = {kv};
    emu_launch({(unsigned)hq, 1, (unsigned)want_s}, {128, 1, 1}, [&] {
        paged_attention_split_f32(part.data(), q.data(), ks.data(), vs.data(), table.data(), blocks, lens, nullptr, hq, hkv, d, bs, scale, want_s, 0, dt, 1);
    });
    emu_launch({(unsigned)hq, 1, 1}, {128, 1, 1}, [&] { attention_merge_f32(paged.data(), part.data(), hq, d, want_s, sp, nullptr, nullptr); });
    check(std::memcmp(paged.data(), split.data(), 4 * split.size()) == 0, std::string(name) + " paged == split, bit for bit");
    // A sliding window: the paged kernel from a first key (starts) is the split kernel over the
    // window's keys alone, bit for bit; the table's entries for blocks wholly before the window
    // are -1 (given back: never to be read).
    for (int window : {kv - 1, kv / 2 + 3, 33, 7}) {
        if (window < 1 || window >= kv) continue;
        const int first = kv - window, wcap = window + 3;
        std::vector<unsigned short> kw((size_t)hkv * wcap * d, 0), vw(kw.size(), 0);
        for (int g = 0; g < hkv; ++g) for (int j = 0; j < window; ++j) for (int c = 0; c < d; ++c) {
            kw[((size_t)g * wcap + j) * d + c] = kh[((size_t)g * cap + first + j) * d + c];
            vw[((size_t)g * wcap + j) * d + c] = vh[((size_t)g * cap + first + j) * d + c];
        }
        const int wchunk = std::max(32, (window + want_s - 1) / want_s), wsplits = std::max(1, (window + wchunk - 1) / wchunk);
        std::vector<float> wpart((size_t)hq * wsplits * (d + 2)), alone(split.size()), windowed(split.size());
        emu_launch({(unsigned)hq, 1, (unsigned)wsplits}, {128, 1, 1}, [&] {
            attention_split_f32(wpart.data(), q.data(), kw.data(), vw.data(), 1, hq, hkv, d, wcap, window, scale, wchunk, nullptr, want_s, dt, 0);
        });
        emu_launch({(unsigned)hq, 1, 1}, {128, 1, 1}, [&] { attention_merge_f32(alone.data(), wpart.data(), hq, d, wsplits, sp, nullptr, nullptr); });
        std::vector<int> wtable(table);
        for (int b = 0; b < first / bs; ++b) wtable[b] = -1;
        int starts[1] = {first};
        std::vector<float> ppart((size_t)hq * want_s * (d + 2), NAN);
        emu_launch({(unsigned)hq, 1, (unsigned)want_s}, {128, 1, 1}, [&] {
            paged_attention_split_f32(ppart.data(), q.data(), ks.data(), vs.data(), wtable.data(), blocks, lens, starts, hq, hkv, d, bs, scale, want_s, 0, dt, 1);
        });
        emu_launch({(unsigned)hq, 1, 1}, {128, 1, 1}, [&] { attention_merge_f32(windowed.data(), ppart.data(), hq, d, want_s, sp, nullptr, nullptr); });
        check(std::memcmp(windowed.data(), alone.data(), 4 * alone.size()) == 0,
              std::string(name) + " paged from key " + std::to_string(first) + " == split over the window alone, bit for bit");
    }
    // A step of many sequences: one chunk of 64 keys for all, one split more than the sequence
    // needs (an empty partial the merge skips), against the definition.
    {
        const int keys = 64, splits = (kv + keys - 1) / keys + 1;
        std::vector<float> part_k((size_t)hq * splits * (d + 2), NAN), chunked(split.size());
        emu_launch({(unsigned)hq, 1, (unsigned)splits}, {128, 1, 1}, [&] {
            paged_attention_split_f32(part_k.data(), q.data(), ks.data(), vs.data(), table.data(), blocks, lens, nullptr, hq, hkv, d, bs, scale, want_s, keys, dt, 1);
        });
        emu_launch({(unsigned)hq, 1, 1}, {128, 1, 1}, [&] { attention_merge_f32(chunked.data(), part_k.data(), hq, d, splits, sp, nullptr, nullptr); });
        cmp(std::string(name) + " paged, 64 keys per split", chunked, want);
    }
    // The heads of a KV group in one block (D <= 128): the same partials, bit for bit.
    const int group = hq / hkv;
    if (d > 128 || group < 2) return;
    const int gh = group % 4 == 0 ? 4 : group % 3 == 0 ? 3 : group % 2 == 0 ? 2 : 1;
    std::vector<float> part_g(part.size(), NAN);
    emu_launch({(unsigned)(hq / gh), 1, (unsigned)want_s}, {128, 1, 1}, [&] {
        paged_attention_split_f32(part_g.data(), q.data(), ks.data(), vs.data(), table.data(), blocks, lens, nullptr, hq, hkv, d, bs, scale, want_s, 0, dt, gh);
    });
    check(std::memcmp(part_g.data(), part.data(), 4 * part.size()) == 0,
          std::string(name) + " paged, " + std::to_string(gh) + " heads per block == one per block, bit for bit");
    printf("ok   %s: paged with %d heads per block == one per block\n", name, gh);
}

static void test_swiglu() {
    size_t n = 5000; auto g = rnd(n, 12), u = rnd(n, 12);
    std::vector<float> out(n);
    emu_launch({4, 1, 1}, {256, 1, 1}, [&] { swiglu_oai_f32(out.data(), g.data(), u.data(), 1.702f, 7.0f, n); });
    std::vector<double> want(n);
    for (size_t i = 0; i < n; ++i) { double gg = std::min((double)g[i], 7.0), uu = std::max(-7.0, std::min((double)u[i], 7.0)); want[i] = (uu + 1) * gg / (1 + std::exp(-1.702 * gg)); }
    cmp("swiglu_oai", out, want);
    std::vector<float> o2(n);
    emu_launch({4, 1, 1}, {256, 1, 1}, [&] { sigmoid_mul_f32(o2.data(), g.data(), u.data(), n); });
    for (size_t i = 0; i < n; ++i) want[i] = u[i] / (1 + std::exp(-(double)g[i]));
    cmp("sigmoid_mul", o2, want);
}

int main() {
    test_conv(1, 96, 4, DT_F32); test_conv(37, 200, 4, DT_BF16); test_conv(5, 33, 2, DT_F32); test_conv(4, 10, 1, DT_F32);
    test_delta(2, 2, 16, 16, 1); test_delta(2, 4, 16, 16, 37); test_delta(1, 2, 32, 40, 5); test_delta(2, 6, 64, 96, 3);
    test_delta(2, 4, 128, 128, 4); test_delta(3, 3, 48, 24, 9, true);
    for (int s = 0; s < 2; ++s) {
        test_attn(1, 1, 4, 2, 64, s, 1); test_attn(1, 300, 8, 2, 128, s, 1); test_attn(3, 70, 8, 8, 16, s, 1);
        // split path at head sizes 256 and 512 (2 and 4 float4 slots per lane, keys 2 and 1 at a time)
        test_attn(1, 45, 2, 1, 256, s, 1); test_attn(2, 37, 2, 2, 512, s, 1); test_attn(9, 40, 4, 2, 64, s, 1);
        test_attn(2, 50, 4, 2, 30, s, 0); test_attn(1, 77, 4, 1, 30, s, 0); test_attn(1, 300, 4, 2, 16, s, 0);
        test_attn(64, 64, 4, 1, 64, s, 2); test_attn(10, 57, 2, 2, 16, s, 2);
        test_attn(64, 100, 4, 2, 16, s, 2, 8); test_attn(20, 20, 2, 1, 16, s, 2, 1);
    }
    test_attn_step(1, 8, 2, 64, false, 1, {1, 2, 31, 32, 33, 65, 257, 511, 512, 513, 700});
    test_attn_step(1, 16, 4, 128, true, 9, {9, 10, 300, 699});
    test_attn_ring(64, 8, 64, true, 128, 40, {0, 1, 87, 88, 89, 500});
    test_attn_ring(8, 2, 64, false, 700, 699, {0, 1, 2, 3000});
    test_attn_step(1, 32, 8, 64, false, 3, {3, 513, 600, 699});  // chunks over 32 (kv > 32 * want)
    for (int dt : {DT_F16, DT_BF16}) {
        test_attn_half(1, 300, 8, 2, 128, dt, false); test_attn_half(1, 77, 4, 1, 64, dt, true);
        test_attn_half(1, 45, 2, 1, 256, dt, false); test_attn_half(1, 37, 2, 2, 512, dt, true);
        test_attn_half(3, 70, 8, 8, 16, dt, false); test_attn_half(1, 1, 4, 2, 64, dt, false);
        test_attn_half(1, 200, 9, 3, 32, dt, true); test_attn_half(1, 130, 16, 2, 128, dt, false);
    }
    test_swiglu();
    printf("%d failures\n", fails);
    return fails != 0;
}
