// Runs the 4-bit one-row GEMV kernels of linear.cu (the per-word _w2/_w1 shapes, and the production
// qgemv1_b4 / qgemv_multi_b4 as a control) through cuda_emu.h on the CPU and compares them with
// the affine product written from its definition in f64: out[r] = sum_c (s * q + b) * x[c]
// (tolerance 1e-4 relative to |want| + mean|want|). Every group size (16..128), scale dtype (f32, f16, bf16), row counts that
// are not a multiple of 8 and the three-weight block mapping. The gated MLP fusion
// (gate_up_silu_b4_*: silu(x . gate) * (x . up)) against the same f64 definition, and bit for bit
// against the composition it replaces: the qgemv_multi_b4 variant of the same loop and warps over
// [gate; up], then silu_mul_f32's expression. Built and run by run.sh, which prepends the kernel
// sources.
#include "kernels_linear.cpp"
#include "emu_check.h"
#include <cstdio>
#include <random>
#include <string>

static std::mt19937 rng(11);

// An affine 4-bit (or 8-bit) weight [n, k]: random words; scales and biases stored in dtype `dt`
// (random bit patterns of moderate magnitude, so the reference decodes exactly what the kernel reads).
struct QW {
    int n, k, group, dt, bits;
    std::vector<unsigned> packed;
    std::vector<unsigned char> sc, bi;  // raw bytes of the dtype
    float param(const std::vector<unsigned char>& v, size_t i) const { return param_at(v, i, dt); }
    double at(int r, int c) const {
        const int per = 32 / bits;  // values per word, value i of a word in its bits i * bits..
        unsigned q = (packed[(size_t)r * (k / per) + c / per] >> (bits * (c % per))) & ((1u << bits) - 1);
        size_t g = (size_t)r * (k / group) + c / group;
        return (double)param(sc, g) * q + param(bi, g);
    }
};
static QW make(int n, int k, int group, int dt, float s, int bits = 4) {
    QW w{n, k, group, dt, bits, {}, {}, {}};
    w.packed.resize((size_t)n * k * bits / 32);
    for (auto& v : w.packed) v = rng();
    size_t groups = (size_t)n * (k / group);
    random_params(w.sc, groups, dt, s, rng);
    random_params(w.bi, groups, dt, 4 * s, rng);  // biases larger than scales, as in the CUDA tests
    return w;
}
static std::vector<double> reference(const QW& w, const std::vector<float>& x) {
    std::vector<double> out(w.n);
    for (int r = 0; r < w.n; ++r) {
        double a = 0;
        for (int c = 0; c < w.k; ++c) a += w.at(r, c) * (double)x[c];
        out[r] = a;
    }
    return out;
}
static std::vector<float> rnd(size_t n) {
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// What a kernel reads as x: x itself, or for the integer variants (int_x) x's parts as xsplit_f32
// writes them (run through the emulator too), in `keep`.
static const float* kernel_x(const std::vector<float>& x, bool int_x, std::vector<unsigned>& keep) {
    if (!int_x) return x.data();
    const int k = (int)x.size(), chunks = k / 32;
    keep.assign(QI_PARTS_WORDS(chunks), 0u);
    emu_launch({(unsigned)((chunks * 32 + 127) / 128), 1, 1}, {128, 1, 1}, [&] { xsplit_f32(keep.data(), x.data(), k); });
    static bool checked = false;  // the split itself against its definition, once
    if (!checked) check_parts("xsplit_f32 k=" + std::to_string(k), keep.data(), x.data(), k), checked = true;
    return (const float*)keep.data();
}

typedef void (*One)(float*, const float*, int, int, const u32*, const void*, const void*, int, int, int);
typedef void (*Multi)(const float*, int, int, int, float*, int, const u32*, const void*, const void*, float*, int,
                      const u32*, const void*, const void*, float*, int, const u32*, const void*, const void*,
                      const void*, const void*, const void*, int);

static void test_one(const char* name, One f, int rows, int threads, int n, int k, int group, int dt, bool int_x,
                     int bits = 4) {
    QW w = make(n, k, group, dt, 0.05f, bits);
    auto x = rnd(k);
    std::vector<unsigned> parts;
    const float* xk = kernel_x(x, int_x, parts);
    std::vector<float> out(n, NAN);
    int lg = __builtin_ctz(group);
    emu_launch({(unsigned)((n + rows - 1) / rows), 1, 1}, {(unsigned)threads, 1, 1},
               [&] { f(out.data(), xk, 1, n, w.packed.data(), w.sc.data(), w.bi.data(), dt, lg, k); });
    cmp(std::string(name) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " g" + std::to_string(group) +
            " dt" + std::to_string(dt),
        out, reference(w, x));
}

// Three weights in one launch (q/k/v shape; weights 0 and 2 with a bias row added, as q and v
// of a layer with biases).
static void test_multi(const char* name, Multi f, int rows, int threads, int k, int group, int dt, bool int_x,
                       int bits = 4) {
    int ns[3] = {33, 77, 8};
    QW w[3] = {make(ns[0], k, group, dt, 0.05f, bits), make(ns[1], k, group, dt, 0.05f, bits),
               make(ns[2], k, group, dt, 0.05f, bits)};
    auto x = rnd(k);
    std::vector<unsigned> parts;
    const float* xk = kernel_x(x, int_x, parts);
    std::vector<float> o[3] = {std::vector<float>(ns[0], NAN), std::vector<float>(ns[1], NAN), std::vector<float>(ns[2], NAN)};
    int lg = __builtin_ctz(group);
    unsigned blocks = 0;
    for (int n : ns) blocks += (n + rows - 1) / rows;
    std::vector<float> add0 = rnd(ns[0]), add2 = rnd(ns[2]);
    emu_launch({blocks, 1, 1}, {(unsigned)threads, 1, 1}, [&] {
        f(xk, dt, lg, k, o[0].data(), ns[0], w[0].packed.data(), w[0].sc.data(), w[0].bi.data(), o[1].data(), ns[1], w[1].packed.data(), w[1].sc.data(), w[1].bi.data(), o[2].data(), ns[2],
          w[2].packed.data(), w[2].sc.data(), w[2].bi.data(), add0.data(), nullptr, add2.data(), DT_F32);
    });
    std::string tag = std::string(name) + " k=" + std::to_string(k) + " g" + std::to_string(group) + " dt" + std::to_string(dt);
    for (int i = 0; i < 3; ++i) {
        std::vector<double> want = reference(w[i], x);
        const std::vector<float>* add = i == 0 ? &add0 : i == 2 ? &add2 : nullptr;
        for (size_t r = 0; add != nullptr && r < want.size(); ++r) want[r] += (*add)[r];
        cmp(tag + " weight " + std::to_string(i) + (add ? " + bias" : ""), o[i], want);
    }
}

typedef void (*GateUp)(float*, const float*, int, const u32*, const void*, const void*, const u32*, const void*,
                       const void*, int, int, int);

static void test_gate_up(const char* name, GateUp f, Multi multi, int rows, int threads, int n, int k, int group, int dt,
                         bool int_x) {
    QW g = make(n, k, group, dt, 0.05f), u = make(n, k, group, dt, 0.05f);
    auto x = rnd(k);
    std::vector<unsigned> parts;
    const float* xk = kernel_x(x, int_x, parts);
    int lg = __builtin_ctz(group);
    std::vector<float> got(n, NAN), og(n, NAN), ou(n, NAN);
    // The fused launch: rows / 2 rows of gate (and as many of up) per block.
    emu_launch({(unsigned)((n + rows / 2 - 1) / (rows / 2)), 1, 1}, {(unsigned)threads, 1, 1}, [&] {
        f(got.data(), xk, n, g.packed.data(), g.sc.data(), g.bi.data(), u.packed.data(), u.sc.data(), u.bi.data(),
          dt, lg, k);
    });
    // The composition: one multi launch over [gate; up], then silu(g) * u as silu_mul_f32 writes it.
    unsigned blocks = 2 * ((n + rows - 1) / rows);
    emu_launch({blocks, 1, 1}, {(unsigned)threads, 1, 1}, [&] {
        multi(xk, dt, lg, k, og.data(), n, g.packed.data(), g.sc.data(), g.bi.data(), ou.data(), n,
              u.packed.data(), u.sc.data(), u.bi.data(), nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr,
              nullptr, DT_F32);
    });
    std::string tag = std::string(name) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " g" +
                      std::to_string(group) + " dt" + std::to_string(dt);
    auto rg = reference(g, x), ru = reference(u, x);
    std::vector<double> want(n);
    for (int i = 0; i < n; ++i) want[i] = rg[i] / (1.0 + std::exp(-rg[i])) * ru[i];
    cmp(tag, got, want);
    for (int i = 0; i < n; ++i) {
        float c = og[i] / (1.0f + expf(-og[i])) * ou[i];
        if (memcmp(&c, &got[i], 4) != 0) {
            printf("FAIL %s row %d: fused %.9g, multi then silu_mul %.9g\n", tag.c_str(), i, got[i], c);
            fails++;
            return;
        }
    }
    printf("ok   %-60s = multi + silu_mul bit for bit\n", tag.c_str());
}

// gate_up_silu_b4_i1_parts (_i1's blocks as the 8 warps of a 32-output block, writing the down
// projection's parts): its outputs equal _i1's bit for bit, and its parts are as defined.
static void test_gate_up_chunk(int n, int k, int group, int dt) {
    QW g = make(n, k, group, dt, 0.05f), u = make(n, k, group, dt, 0.05f);
    auto x = rnd(k);
    std::vector<unsigned> parts, hparts(QI_PARTS_WORDS(n / 32), 0xdeadbeefu);
    const float* xk = kernel_x(x, true, parts);
    const int lg = __builtin_ctz(group);
    std::vector<float> got(n, NAN), ref_i1(n, NAN);
    emu_launch({(unsigned)(n / 32), 1, 1}, {256, 1, 1}, [&] {
        gate_up_silu_b4_i1_parts(got.data(), xk, n, g.packed.data(), g.sc.data(), g.bi.data(), u.packed.data(), u.sc.data(),
                            u.bi.data(), dt, lg, k, hparts.data());
    });
    emu_launch({(unsigned)(n / 4), 1, 1}, {32, 1, 1}, [&] {
        gate_up_silu_b4_i1(ref_i1.data(), xk, n, g.packed.data(), g.sc.data(), g.bi.data(), u.packed.data(), u.sc.data(),
                            u.bi.data(), dt, lg, k);
    });
    const std::string tag = "gate_up_silu_b4_i1_parts n=" + std::to_string(n) + " k=" + std::to_string(k) + " g" +
                            std::to_string(group) + " dt" + std::to_string(dt);
    check(memcmp(got.data(), ref_i1.data(), 4 * (size_t)n) == 0, tag + " = _i1 bit for bit");
    check_parts(tag + " down projection's", hparts.data(), got.data(), n);
}

// qgemv_norm_b4_i4 (the o / down projection with the residual add and the next norm's first
// half): h = res + W x equals _i4's output plus res bit for bit, y holds u = h * w bit for bit,
// its parts are u's with the pending sign, the tail holds eps and the partial sums of squares;
// then the integer GEMVs over those parts (one row, the three-weight launch, the fused gate/up
// _i1 and _i1_parts) against the f64 product with y = rms_norm(h) * w, and the same GEMVs over
// x's own parts still bit for bit what they were (scale 1).
static void test_norm_rows(int n, int k, int group, int dt, int nw_dt) {
    QW w = make(n, k, group, dt, 0.05f);
    auto x = rnd(k), res = rnd(n), nwf = rnd(n);
    std::vector<unsigned char> nw(n * (nw_dt == DT_F32 ? 4 : 2));
    for (int i = 0; i < n; ++i) {  // the norm weight as its dtype stores it
        if (nw_dt == DT_F32) memcpy(&nw[4 * i], &nwf[i], 4);
        else { unsigned u; memcpy(&u, &nwf[i], 4); unsigned short hb = u >> 16; memcpy(&nw[2 * i], &hb, 2); nwf[i] = __uint_as_float((unsigned)hb << 16); }
    }
    const float eps = 1e-5f;
    std::vector<unsigned> xparts;
    const float* xk = kernel_x(x, true, xparts);
    const int lg = __builtin_ctz(group);
    std::vector<float> o14(n, NAN), h(n, NAN), y(n, NAN);
    std::vector<unsigned> parts(QI_PARTS_WORDS(n / 32), 0xdeadbeefu);
    emu_launch({(unsigned)(n / 8), 1, 1}, {128, 1, 1},
               [&] { qgemv1_b4_i4(o14.data(), xk, 1, n, w.packed.data(), w.sc.data(), w.bi.data(), dt, lg, k); });
    emu_launch({(unsigned)(n / 32), 1, 1}, {512, 1, 1}, [&] {
        qgemv_norm_b4_i4(h.data(), y.data(), xk, n, w.packed.data(), w.sc.data(), w.bi.data(), dt, lg, k, res.data(),
                          nw.data(), nw_dt, eps, parts.data());
    });
    const std::string tag = "qgemv_norm_b4_i4 n=" + std::to_string(n) + " k=" + std::to_string(k) + " g" +
                            std::to_string(group) + " dt" + std::to_string(dt) + " w" + std::to_string(nw_dt);
    bool h_ok = true, u_ok = true;
    for (int i = 0; i < n; ++i) {
        const float hv = res[i] + o14[i], u = hv * nwf[i];
        h_ok &= memcmp(&hv, &h[i], 4) == 0;
        u_ok &= memcmp(&u, &y[i], 4) == 0;
    }
    check(h_ok, tag + " h = res + _i4 bit for bit");
    check(u_ok, tag + " y = h * w bit for bit");
    check_parts(tag + " u's", parts.data(), y.data(), n, true);
    const float* tail = (const float*)(parts.data() + (size_t)(n / 32) * QI_WORDS) + 2 * (n / 32);
    double ss = 0, got = 0;
    for (int i = 0; i < n; ++i) ss += (double)h[i] * h[i];
    for (int c = 0; c < n / 32; ++c) got += tail[1 + c];
    check(tail[0] == eps && std::fabs(got - ss) <= 1e-5 * ss, tag + " tail: eps and the sum of squares");
    // The consumers, against y = rms_norm(h) * w in f64.
    std::vector<float> yref(n);
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; ++i) yref[i] = (float)(h[i] * inv * nwf[i]);
    const int m = 64;
    QW a = make(m, n, group, dt, 0.05f), b = make(m, n, group, dt, 0.05f), c3 = make(40, n, group, dt, 0.05f);
    const float* pk = (const float*)parts.data();
    std::vector<float> one(m, NAN), ma(m, NAN), mb(m, NAN), mc(40, NAN), gu13(m, NAN), gu16(m, NAN);
    emu_launch({(unsigned)(m / 8), 1, 1}, {128, 1, 1},
               [&] { qgemv1_b4_i4(one.data(), pk, 1, m, a.packed.data(), a.sc.data(), a.bi.data(), dt, lg, n); });
    cmp(tag + " -> qgemv1_b4_i4", one, reference(a, yref));
    emu_launch({(unsigned)(m / 8 + m / 8 + 5), 1, 1}, {64, 1, 1}, [&] {
        qgemv_multi_b4_i2(pk, dt, lg, n, ma.data(), m, a.packed.data(), a.sc.data(), a.bi.data(), mb.data(),
                           m, b.packed.data(), b.sc.data(), b.bi.data(), mc.data(), 40, c3.packed.data(),
                           c3.sc.data(), c3.bi.data(), nullptr, nullptr, nullptr, DT_F32);
    });
    cmp(tag + " -> qgemv_multi_b4_i2 weight 0", ma, reference(a, yref));
    cmp(tag + " -> qgemv_multi_b4_i2 weight 2", mc, reference(c3, yref));
    emu_launch({(unsigned)(m / 4), 1, 1}, {32, 1, 1}, [&] {
        gate_up_silu_b4_i1(gu13.data(), pk, m, a.packed.data(), a.sc.data(), a.bi.data(), b.packed.data(),
                            b.sc.data(), b.bi.data(), dt, lg, n);
    });
    std::vector<unsigned> dparts(QI_PARTS_WORDS(m / 32), 0u);
    emu_launch({(unsigned)(m / 32), 1, 1}, {256, 1, 1}, [&] {
        gate_up_silu_b4_i1_parts(gu16.data(), pk, m, a.packed.data(), a.sc.data(), a.bi.data(), b.packed.data(),
                            b.sc.data(), b.bi.data(), dt, lg, n, dparts.data());
    });
    auto ra = reference(a, yref), rb = reference(b, yref);
    std::vector<double> want(m);
    for (int i = 0; i < m; ++i) want[i] = ra[i] / (1.0 + std::exp(-ra[i])) * rb[i];
    cmp(tag + " -> gate_up_silu_b4_i1", gu13, want);
    check(gu13 == gu16, tag + " -> gate_up_silu_b4_i1_parts = _i1");
    check_parts(tag + " -> _i1_parts's own parts (not pending)", dparts.data(), gu16.data(), m);
}

int main() {
    // qg4_word: each value of a word exactly 1 + q/16, in order (the f16 pairs widened), for
    // every byte pattern in each position (a value in the wrong slot, or off by a bit, fails).
    {
        int bad = 0;
        for (unsigned v = 0; v < 256; ++v)
            for (int pos = 0; pos < 4; ++pos) {
                const unsigned w = (v << (8 * pos)) | (0x9E3779B9u & ~(0xFFu << (8 * pos)));
                float q[8];
                qg4_word(w, q);
                for (int t = 0; t < 8; ++t)
                    if (q[t] != 1.0f + (float)((w >> (4 * t)) & 15u) / 16.0f) ++bad;
            }
        printf("%s qg4_word: 8 values of 1024 words exactly 1 + q/16 (%d wrong)\n", bad ? "FAIL" : "ok  ", bad);
        fails += bad != 0;
    }
    // xw: the x-per-word and integer kernels (_xw1, _i1, _i2, _i4), which take no groups of 16;
    // int_x: the integer ones (_i1, _i2, _i4), which read x's parts.
    struct { const char* name; One one; Multi multi; int rows, threads; bool xw, int_x; } kernels[] = {
        {"qgemv1_b4_w2", qgemv1_b4_w2, qgemv_multi_b4_w2, 8, 64, false, false},
        {"qgemv1_b4_w1", qgemv1_b4_w1, qgemv_multi_b4_w1, 8, 32, false, false},
        {"qgemv1_b4_w4", qgemv1_b4_w4, qgemv_multi_b4_w4, 8, 128, false, false},
        {"qgemv1_b4_w8", qgemv1_b4_w8, qgemv_multi_b4_w8, 8, 256, false, false},
        {"qgemv1_b4_xw1", qgemv1_b4_xw1, qgemv_multi_b4_xw1, 8, 32, true, false},
        {"qgemv1_b4_i1", qgemv1_b4_i1, qgemv_multi_b4_i1, 8, 32, true, true},
        {"qgemv1_b4_i4", qgemv1_b4_i4, qgemv_multi_b4_i4, 8, 128, true, true},
        {"qgemv1_b4_i2", qgemv1_b4_i2, qgemv_multi_b4_i2, 8, 64, true, true},
        {"qgemv1_b4 (production)", qgemv1_b4, qgemv_multi_b4, QG_ROWS, 32 * QG_WARPS, false, false},
    };
    for (auto& kn : kernels)
        for (int group : {16, 32, 64, 128})
            for (int dt : {DT_F32, DT_F16, DT_BF16}) {
                if (kn.xw && group == 16) continue;
                test_one(kn.name, kn.one, kn.rows, kn.threads, 77, 384, group, dt, kn.int_x);
                test_one(kn.name, kn.one, kn.rows, kn.threads, 5, 4096, group, dt, kn.int_x);
                test_multi(kn.name, kn.multi, kn.rows, kn.threads, 1024, group, dt, kn.int_x);
            }
    // The 8-bit integer kernels (qi8_sums, 4 rows per block): groups of 32 and more, every scale
    // dtype; k of one partial pass of the lanes (384), of 90 chunks (gpt-oss's 2880) and 4096.
    struct { const char* name; One one; Multi multi; int threads; } b8[] = {
        {"qgemv1_b8_i1", qgemv1_b8_i1, qgemv_multi_b8_i1, 32},
        {"qgemv1_b8_i2", qgemv1_b8_i2, qgemv_multi_b8_i2, 64},
        {"qgemv1_b8_i4", qgemv1_b8_i4, qgemv_multi_b8_i4, 128},
    };
    for (auto& kn : b8)
        for (int group : {32, 64, 128})
            for (int dt : {DT_F32, DT_F16, DT_BF16}) {
                test_one(kn.name, kn.one, 4, kn.threads, 77, 384, group, dt, true, 8);
                test_one(kn.name, kn.one, 4, kn.threads, 5, 2880 % group ? 4096 : 2880, group, dt, true, 8);
                test_multi(kn.name, kn.multi, 4, kn.threads, 2880 % group ? 4096 : 2880, group, dt, true, 8);
            }
    // The gated MLP fusion, each kernel with the multi variant of the same loop and warps.
    struct { const char* name; GateUp f; Multi multi; int rows, threads; bool int_x; } fused[] = {
        {"gate_up_silu_b4_w2", gate_up_silu_b4_w2, qgemv_multi_b4_w2, 8, 64, false},
        {"gate_up_silu_b4_w1", gate_up_silu_b4_w1, qgemv_multi_b4_w1, 8, 32, false},
        {"gate_up_silu_b4_w4", gate_up_silu_b4_w4, qgemv_multi_b4_w4, 8, 128, false},
        {"gate_up_silu_b4_w8", gate_up_silu_b4_w8, qgemv_multi_b4_w8, 8, 256, false},
        {"gate_up_silu_b4_xw1", gate_up_silu_b4_xw1, qgemv_multi_b4_xw1, 8, 32, false},
        {"gate_up_silu_b4_i1", gate_up_silu_b4_i1, qgemv_multi_b4_i1, 8, 32, true},
        {"gate_up_silu_b4_i4", gate_up_silu_b4_i4, qgemv_multi_b4_i4, 8, 128, true},
        {"gate_up_silu_b4_i2", gate_up_silu_b4_i2, qgemv_multi_b4_i2, 8, 64, true},
    };
    for (auto& kn : fused)
        for (int group : {32, 64, 128})
            for (int dt : {DT_F32, DT_F16, DT_BF16}) {
                test_gate_up(kn.name, kn.f, kn.multi, kn.rows, kn.threads, 77, 384, group, dt, kn.int_x);
                test_gate_up(kn.name, kn.f, kn.multi, kn.rows, kn.threads, 6, 4096, group, dt, kn.int_x);
            }
    for (int group : {32, 64, 128})
        for (int dt : {DT_F32, DT_F16, DT_BF16}) {
            test_gate_up_chunk(64, 384, group, dt);
            test_gate_up_chunk(32, 4096, group, dt);
        }
    for (int group : {32, 64, 128})
        for (int dt : {DT_F32, DT_F16, DT_BF16})
            for (int nw_dt : {DT_F32, DT_BF16}) test_norm_rows(128, 512, group, dt, nw_dt);
    test_norm_rows(4096, 1024, 64, DT_BF16, DT_BF16);
    printf("%d failures\n", fails);
    return fails != 0;
}
