// Runs the few-row 4-bit products in integers (qimma.cu) through cuda_emu.h on the CPU, over x's
// parts as xsplit_f32 (linear.cu) writes them for M rows, and compares them with:
// - what they multiply, written from its definition in f64: per group s * sum q X 2^-e + b * sum x
//   (X 2^-e the parts' value of x, q exact, the sums of x xsplit_f32's), to 1e-6 (f32 sums);
// - the product itself, sum x (s q + b) in f64, to the CUDA tests' f32 tolerance (1e-4).
// Groups of 32, 64 and 128, scales in f32, f16 and bf16, every form (8, 16 and 32 rows per block)
// at full and partial row counts, more rows than a block takes (33 and 64 rows in blocks of 32), N not a multiple of the block's 128, K with a partial last
// chunk of 128, one range of K and several (the partial slices added in range order, as
// qmma_reduce does), and a row's bits at M = 2 and M = 64 (a row never depends on the rows beside
// it). The register forms (qimma_b4_r8, _r16) over xsplit_tiles_f32's layout, two weights in one
// launch. Built and run by run.sh, which prepends the kernel sources.
#include "kernels_qimma.cpp"
#include "emu_check.h"
#include <cstdio>
#include <random>
#include <string>

static std::mt19937 rng(23);

struct QW {
    int n, k, group, dt;
    std::vector<unsigned> packed;
    std::vector<unsigned char> sc, bi;
    unsigned q(int r, int c) const { return (packed[(size_t)r * (k / 8) + c / 8] >> (4 * (c % 8))) & 15u; }
    size_t gi(int r, int c) const { return (size_t)r * (k / group) + c / group; }
    float s(int r, int c) const { return param_at(sc, gi(r, c), dt); }
    float b(int r, int c) const { return param_at(bi, gi(r, c), dt); }
};
static QW make(int n, int k, int group, int dt) {
    QW w{n, k, group, dt, {}, {}, {}};
    w.packed.resize((size_t)n * k / 8);
    for (auto& v : w.packed) v = rng();
    random_params(w.sc, (size_t)n * (k / group), dt, 0.05f, rng);
    random_params(w.bi, (size_t)n * (k / group), dt, 0.2f, rng);
    return w;
}

typedef void (*Kernel)(float*, const u32*, int, int, const u32*, const void*, const void*, int, int, int, int);

// x's parts for m rows of k values (xsplit_f32 over the m k values: row i's chunks follow row i - 1's).
static std::vector<unsigned> parts_of(const std::vector<float>& x, int m, int k) {
    const int chunks = m * k / 32;
    std::vector<unsigned> p((size_t)chunks * 27 + 1, 0u);
    emu_launch({(unsigned)((chunks * 32 + 127) / 128), 1, 1}, {128, 1, 1}, [&] { xsplit_f32(p.data(), x.data(), m * k); });
    return p;
}

// Runs `f` (`warps` warps, `rows` input rows per block) with `cps` 128-value chunks per range of
// K: out [m, n].
static std::vector<float> run(Kernel f, int warps, int rows, const QW& w, const std::vector<unsigned>& xq, int m, int cps) {
    const int chunks = (w.k + 127) / 128, splits = (chunks + cps - 1) / cps;
    const int lg = __builtin_ctz(w.group);
    std::vector<float> part((size_t)splits * m * w.n, NAN), out((size_t)m * w.n);
    const unsigned zs = (unsigned)((m + rows - 1) / rows);
    emu_launch({(unsigned)((w.n + 127) / 128) * zs, (unsigned)splits, 1}, {(unsigned)(32 * warps), 1, 1}, [&] {
        f(part.data(), xq.data(), m, w.n, w.packed.data(), w.sc.data(), w.bi.data(), w.dt, lg, w.k, cps);
    });
    for (size_t i = 0; i < out.size(); ++i) {
        float s = part[i];
        for (int p = 1; p < splits; ++p) s += part[(size_t)p * out.size() + i];
        out[i] = s;
    }
    return out;
}

// Random x of m rows of k values (a quarter of them 8 times larger).
static std::vector<float> random_x(int m, int k) {
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> x((size_t)m * k);
    for (auto& v : x) v = d(rng) * (rng() % 4 == 0 ? 8.0f : 1.0f);
    return x;
}

// x [m, k] times w^T in f64: what the kernels sum (`want`: per group s * sum q X 2^-e + b * sum x over
// x's parts `xq`, xsplit_f32's) and the product itself (`exact`: sum x (s q + b)).
static void references(const QW& w, const std::vector<float>& x, const std::vector<unsigned>& xq, int m,
                       std::vector<double>& want, std::vector<double>& exact) {
    const int k = w.k, n = w.n, kc = k / 32, group = w.group;
    const float* scale = (const float*)(xq.data() + (size_t)m * kc * 24);
    const float* sum = scale + (size_t)m * kc;
    // X of value c of row i from the parts (hi signed, mid and lo unsigned; word (v / 8, v % 2), byte (v % 8) / 2).
    auto X = [&](int i, int c) {
        const unsigned* ch = xq.data() + ((size_t)i * kc + c / 32) * 24;
        const int v = c % 32, word = (v / 8) * 2 + (v % 2), byte = (v % 8) / 2;
        auto at = [&](int p) { return (ch[p * 8 + word] >> (8 * byte)) & 255u; };
        return 65536 * (int)(signed char)at(0) + 256 * (int)at(1) + (int)at(2);
    };
    want.assign((size_t)m * n, 0.0);
    exact.assign((size_t)m * n, 0.0);
    for (int i = 0; i < m; ++i)
        for (int r = 0; r < n; ++r) {
            double a = 0, e = 0;
            for (int g0 = 0; g0 < k; g0 += group) {
                double qx = 0, xs = 0;
                for (int c = g0; c < g0 + group; ++c) {
                    qx += (double)w.q(r, c) * X(i, c) * scale[(size_t)i * kc + c / 32];
                    e += (double)x[(size_t)i * k + c] * ((double)w.s(r, c) * w.q(r, c) + w.b(r, c));
                }
                for (int c = g0; c < g0 + group; c += 32) xs += sum[(size_t)i * kc + c / 32];
                a += w.s(r, g0) * qx + w.b(r, g0) * xs;
            }
            want[(size_t)i * n + r] = a;
            exact[(size_t)i * n + r] = e;
        }
}

static void test(const char* name, Kernel f, int warps, int rows, int m, int n, int k, int group, int dt) {
    QW w = make(n, k, group, dt);
    const auto x = random_x(m, k);
    const auto xq = parts_of(x, m, k);
    std::vector<double> want, exact;
    references(w, x, xq, m, want, exact);
    const int chunks = (k + 127) / 128;
    std::string tag = std::string(name) + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
                      std::to_string(k) + " g" + std::to_string(group) + " dt" + std::to_string(dt);
    auto whole = run(f, warps, rows, w, xq, m, chunks);
    cmp(tag + " one range", whole, want, 1e-6);
    cmp(tag + " one range, the product", whole, exact, 1e-4);
    auto split = run(f, warps, rows, w, xq, m, 1);
    cmp(tag + " ranges of one chunk", split, want, 1e-6);
}

typedef void (*RegKernel)(const u32*, int, int, int, int, float*, int, const u32*, const void*, const void*, float*,
                          int, const u32*, const void*, const void*, float*, int, const u32*, const void*,
                          const void*);

// The register kernels (qimma_b4_r8, _r16: `nt` tiles of 8 input rows per block) over two weights
// of one launch (rows n and n2, so that the second weight's tiles follow the first's), x's parts
// in xsplit_tiles_f32's layout: against the same sums as `test` from xsplit_f32's parts (the two
// layouts hold the same words).
static void test_reg(const char* name, RegKernel f, int nt, int m, int n, int n2, int k, int group, int dt) {
    QW ws[2] = {make(n, k, group, dt), make(n2, k, group, dt)};
    const auto x = random_x(m, k);
    const auto xq = parts_of(x, m, k);
    const int kc = k / 32, tiles = (m + 7) / 8;
    std::vector<unsigned> xt((size_t)tiles * kc * 208, 0xDEADBEEFu);
    emu_launch({(unsigned)((tiles * 8 * k + 255) / 256), 1, 1}, {256, 1, 1}, [&] { xsplit_tiles_f32(xt.data(), x.data(), m, k); });
    std::vector<float> out0((size_t)m * n, NAN), out1((size_t)m * n2, NAN);
    const int lg = __builtin_ctz(group);
    const unsigned blocks = (unsigned)((n + 15) / 16 + (n2 + 15) / 16);
    emu_launch({blocks, (unsigned)((tiles + nt - 1) / nt), 1}, {256, 1, 1}, [&] {
        f(xt.data(), m, dt, lg, k, out0.data(), n, ws[0].packed.data(), ws[0].sc.data(), ws[0].bi.data(), out1.data(),
          n2, ws[1].packed.data(), ws[1].sc.data(), ws[1].bi.data(), nullptr, 0, nullptr, nullptr, nullptr);
    });
    for (int wi = 0; wi < 2; ++wi) {
        const QW& w = ws[wi];
        std::vector<double> want, exact;
        references(w, x, xq, m, want, exact);
        std::string tag = std::string(name) + " weight " + std::to_string(wi) + " m=" + std::to_string(m) +
                          " n=" + std::to_string(w.n) + " k=" + std::to_string(k) + " g" + std::to_string(group) +
                          " dt" + std::to_string(dt);
        const auto& got = wi ? out1 : out0;
        cmp(tag, got, want, 1e-6);
        cmp(tag + ", the product", got, exact, 1e-4);
    }
}

// Rows 0 and 1 of a 64-row product (two blocks of 32 rows) are bit for bit those of the same two
// rows alone (another form).
static void test_rows_alone() {
    QW w = make(136, 256, 64, DT_BF16);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> x((size_t)64 * 256);
    for (auto& v : x) v = d(rng);
    auto all = run(qimma_b4_x32, 8, 32, w, parts_of(x, 64, 256), 64, 1);
    x.resize((size_t)2 * 256);
    auto two = run(qimma_b4_x8, 4, 8, w, parts_of(x, 2, 256), 2, 1);
    bool same = std::memcmp(all.data(), two.data(), two.size() * sizeof(float)) == 0;
    check(same, "qimma rows 0-1 at m=64 equal m=2");
    if (same) printf("ok   %-60s bit for bit\n", "qimma rows 0-1 at m=64 and at m=2");
}

typedef void (*DecKernel)(const u32*, int, int, int, int, float*, int, const u32*, const void*, const void*, float*,
                          int, const u32*, const void*, const void*, float*, int, const u32*, const void*,
                          const void*);

// The bf16 forms (qdec_b4_r8 .. _r64) over xbf16_tiles_f32's layout, two weights in
// one launch: against their definition in f64, sum bf16(x) bf16(w) with w = s q + b exact for
// bf16 scales (each weight rounded once, as bf16x2_fma rounds it) and fmaf(s, q, b) for f16 and
// f32 scales (rounded to f32, then to bf16, as the prefill GEMM's qdequant_bf16), to 1e-5; and the
// product itself to 3e-2 (x and the weights in bf16).
static void test_dec(const char* name, DecKernel f, int nt, int m, int n, int n2, int k, int group, int tpb = 1,
                     int dt = DT_BF16, bool wg = false, int ranges = 1) {
    QW ws[2] = {make(n, k, group, dt), make(n2, k, group, dt)};
    const auto x = random_x(m, k);
    const int kc = k / 32, tiles = (m + 7) / 8;
    std::vector<unsigned> xb((size_t)tiles * kc * 32 * 4, 0xDEADBEEFu);
    emu_launch({(unsigned)((tiles * kc * 32 + 255) / 256), 1, 1}, {256, 1, 1},
               [&] { xbf16_tiles_f32((uint4*)xb.data(), x.data(), m, k); });
    check_tiles(std::string("xbf16_tiles_f32 m=") + std::to_string(m) + " k=" + std::to_string(k), xb.data(), x.data(), m, k);
    // The rows past m as a producer writing the tiles beside its output leaves them (anything:
    // here NaNs), which no stored result may depend on.
    for (int c = 0; c < kc; ++c)
        for (int row = m; row < tiles * 8; ++row)
            for (int j = 0; j < 16; ++j) xb[(((size_t)(row / 8) * kc + c) * 8 + row % 8) * 16 + j] = 0x7FC07FC0u;
    // ranges > 1 (the qwg kernels): slices of K's batches, each its own slice of the outputs,
    // then added in range order as qmma_reduce adds them.
    std::vector<float> out0((size_t)ranges * m * n, NAN), out1((size_t)ranges * m * n2, NAN);
    const int lg = __builtin_ctz(group);
    const unsigned blocks = (unsigned)((n + 16 * tpb - 1) / (16 * tpb) + (n2 + 16 * tpb - 1) / (16 * tpb));
    // wg: the qwg kernels, x in the xwg layout for 8 nt rows (one block row of input).
    std::vector<unsigned> xw;
    if (wg) {
        xw.assign((size_t)nt * 8 * k / 2, 0xDEADBEEFu);
        emu_launch({(unsigned)((k / 64 * nt * 64 + 255) / 256), 1, 1}, {256, 1, 1},
                   [&] { xwg_from_tiles((uint4*)xw.data(), (const uint4*)xb.data(), m, k, nt * 8); });
    }
    emu_launch({blocks, wg ? (unsigned)ranges : (unsigned)((tiles + nt - 1) / nt), 1}, {256, 1, 1}, [&] {
        f(wg ? xw.data() : xb.data(), m, dt, lg, k, out0.data(), n, ws[0].packed.data(), ws[0].sc.data(), ws[0].bi.data(),
          out1.data(), n2, ws[1].packed.data(), ws[1].sc.data(), ws[1].bi.data(), nullptr, 0, nullptr, nullptr, nullptr);
    });
    for (auto* o : {&out0, &out1}) {
        const size_t mn = o->size() / ranges;
        for (size_t i = 0; i < mn; ++i)
            for (int r = 1; r < ranges; ++r) (*o)[i] += (*o)[r * mn + i];
        o->resize(mn);
    }
    auto bf = [](double v) { return (double)emu_bf16(emu_bf16_rn_d(v)); };
    for (int wi = 0; wi < 2; ++wi) {
        const QW& w = ws[wi];
        std::vector<double> want((size_t)m * w.n), exact((size_t)m * w.n);
        for (int i = 0; i < m; ++i)
            for (int r = 0; r < w.n; ++r) {
                double a = 0, e = 0;
                for (int c = 0; c < k; ++c) {
                    const double xv = x[(size_t)i * k + c], wv = (double)w.s(r, c) * w.q(r, c) + w.b(r, c);
                    const double wr = dt == DT_BF16 ? wv : (double)fmaf(w.s(r, c), (float)w.q(r, c), w.b(r, c));
                    a += bf((float)xv) * bf(wr);
                    e += xv * wv;
                }
                want[(size_t)i * w.n + r] = a;
                exact[(size_t)i * w.n + r] = e;
            }
        std::string tag = std::string(name) + " weight " + std::to_string(wi) + " m=" + std::to_string(m) +
                          " n=" + std::to_string(w.n) + " k=" + std::to_string(k) + " g" + std::to_string(group) +
                          (dt == DT_F32 ? " f32" : dt == DT_F16 ? " f16" : "");
        const auto& got = wi ? out1 : out0;
        cmp(tag, got, want, 1e-5);
        cmp(tag + ", the product", got, exact, 3e-2);
    }
}

// silu(g) * u straight into the tiles: bit for bit the tiles of silu_mul_f32's output (its
// expression, elementwise.cu, in f32 here).
static void test_silu_tiles(int m, int k) {
    const auto g = random_x(m, k), u = random_x(m, k);
    std::vector<float> h((size_t)m * k);
    for (size_t i = 0; i < h.size(); ++i) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    const int tiles = (m + 7) / 8;
    std::vector<unsigned> xb((size_t)tiles * 8 * k / 2, 0xDEADBEEFu);
    emu_launch({(unsigned)((tiles * k + 255) / 256), 1, 1}, {256, 1, 1},
               [&] { silu_mul_xbf16_tiles_f32((uint4*)xb.data(), g.data(), u.data(), m, k); });
    check_tiles("silu_mul_xbf16_tiles_f32 m=" + std::to_string(m) + " k=" + std::to_string(k), xb.data(), h.data(), m, k);
}

int main() {
    const int dts[3] = {DT_F32, DT_F16, DT_BF16};
    int i = 0;
    for (int group : {32, 64, 128}) {
        for (int k : {256, 288, 384}) {
            if (k % group) continue;
            const int dt = dts[i++ % 3];
            test("qimma_b4_x8", qimma_b4_x8, 4, 8, 2, 136, k, group, dt);
            test("qimma_b4_x8", qimma_b4_x8, 4, 8, 8, 40, k, group, dt);
            test("qimma_b4_x16", qimma_b4_x16, 4, 16, 13, 136, k, group, dt);
            test("qimma_b4_x32", qimma_b4_x32, 8, 32, 32, 40, k, group, dt);
        }
    }
    test("qimma_b4_x16", qimma_b4_x16, 4, 16, 16, 200, 1024, 64, DT_BF16);
    test("qimma_b4_x32", qimma_b4_x32, 8, 32, 17, 136, 288, 32, DT_F16);
    test("qimma_b4_x32", qimma_b4_x32, 8, 32, 33, 136, 256, 64, DT_BF16);
    test("qimma_b4_x32", qimma_b4_x32, 8, 32, 64, 40, 384, 128, DT_F32);
    test_rows_alone();
    test_silu_tiles(3, 256);
    test_silu_tiles(17, 1024);
    i = 0;
    for (int group : {32, 64, 128})
        for (int k : {256, 384}) {
            if (k % group) continue;
            const int dt = dts[i++ % 3];
            test_reg("qimma_b4_r8", qimma_b4_r8, 1, 2, 40, 24, k, group, dt);
            test_reg("qimma_b4_r8", qimma_b4_r8, 1, 8, 136, 16, k, group, dt);
            test_reg("qimma_b4_r16", qimma_b4_r16, 2, 13, 40, 24, k, group, dt);
        }
    test_reg("qimma_b4_r8", qimma_b4_r8, 1, 5, 48, 33, 1024, 64, DT_BF16);
    test_reg("qimma_b4_r16", qimma_b4_r16, 2, 16, 32, 20, 1152, 32, DT_F16);
    for (int group : {32, 64, 128}) {
        test_dec("qdec_b4_r8", qdec_b4_r8, 1, 2, 40, 24, 384, group);
        test_dec("qdec_b4_r8", qdec_b4_r8, 1, 8, 136, 16, 256, group);
        test_dec("qdec_b4_r16", qdec_b4_r16, 2, 13, 40, 24, 384, group);
    }
    test_dec("qdec_b4_r8", qdec_b4_r8, 1, 5, 48, 33, 1024, 64);
    test_dec("qdec_b4_r16", qdec_b4_r16, 2, 16, 32, 20, 1152, 128);
    test_dec("qdec_b4_r32", qdec_b4_r32, 4, 17, 40, 24, 384, 64);
    test_dec("qdec_b4_r32", qdec_b4_r32, 4, 32, 16, 33, 256, 32);
    test_dec("qdec_b4_r64", qdec_b4_r64, 8, 33, 40, 16, 384, 128);
    test_dec("qdec_b4_r64", qdec_b4_r64, 8, 64, 24, 16, 256, 64);
    // Several tiles per block: a weight of 3 tiles (a block past its end) beside one of 2.
    test_dec("qdec_b4_r32_t2", qdec_b4_r32_t2, 4, 20, 40, 32, 384, 64, 2);
    test_dec("qdec_b4_r64_t2", qdec_b4_r64_t2, 8, 64, 40, 17, 256, 32, 2);
    test_dec("qdec_b4_r64_t2", qdec_b4_r64_t2, 8, 41, 72, 24, 1024, 128, 2);
    // The warpgroup forms: blocks of 8 tiles, x through xwg_from_tiles.
    test_dec("qwg_b4_r64", qwg_b4_r64, 8, 64, 136, 24, 256, 64, 8, DT_BF16, true);
    test_dec("qwg_b4_r64", qwg_b4_r64, 8, 41, 40, 130, 512, 128, 8, DT_BF16, true);
    test_dec("qwg_b4_r32", qwg_b4_r32, 4, 17, 24, 150, 384, 32, 8, DT_BF16, true);
    test_dec("qwg_b4_r32", qwg_b4_r32, 4, 32, 128, 16, 1024, 64, 8, DT_BF16, true);
    // K in ranges of batches: 3 of 3 and 3 of 2 + 1 (8 and 7 batches), 2 of 1.
    test_dec("qwg_b4_r64", qwg_b4_r64, 8, 50, 136, 24, 1024, 64, 8, DT_BF16, true, 3);
    test_dec("qwg_b4_r32", qwg_b4_r32, 4, 20, 40, 130, 896, 32, 8, DT_BF16, true, 3);
    test_dec("qwg_b4_r64", qwg_b4_r64, 8, 64, 24, 16, 256, 128, 8, DT_BF16, true, 2);
    // Their `s` forms: f16 scales (GGUF's Q4_0 / Q4_1) and f32 ones (its K-quants), each form and
    // group size.
    for (int dt : {DT_F16, DT_F32}) {
        test_dec("qdec_b4_r8s", qdec_b4_r8s, 1, 3, 40, 24, 384, 32, 1, dt);
        test_dec("qdec_b4_r16s", qdec_b4_r16s, 2, 16, 32, 20, 1152, dt == DT_F16 ? 32 : 64, 1, dt);
        test_dec("qdec_b4_r32s", qdec_b4_r32s, 4, 29, 40, 24, 384, dt == DT_F16 ? 128 : 32, 1, dt);
        test_dec("qdec_b4_r64s", qdec_b4_r64s, 8, 64, 24, 16, 256, 64, 1, dt);
        test_dec("qdec_b4_r32s_t2", qdec_b4_r32s_t2, 4, 32, 40, 32, 384, 32, 2, dt);
        test_dec("qdec_b4_r64s_t2", qdec_b4_r64s_t2, 8, 41, 72, 24, 1024, dt == DT_F16 ? 64 : 128, 2, dt);
    }
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
