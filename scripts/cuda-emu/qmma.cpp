// Runs the few-row quantized products on the tensor cores (qmma.cu) through cuda_emu.h on the CPU
// and compares them with the product written from its definition in f64, the weight never
// rounded (the kernels take each group as s * sum x q + b * sum x, q exact):
// - qmma_bN_mR (bf16 x): sum_c bf16(x) * fmaf(s, q, b), only x rounded as the kernel rounds it
//   (tolerance 1e-5 of |want| + mean|want|: the f32 sums);
// - qmma_bN_f32 (f32 x in two bf16 parts): sum_c x * fmaf(s, q, b), at the CUDA tests' f32
//   tolerance (1e-4);
// - qmma_bN_dR (bf16 x, bf16 scales and biases): sum_c bf16(x) * bf16(s q + b), the weight rounded
//   once as the kernel's bf16 fma rounds it, over several blocks of rows (gridDim.z);
// - qmma_bN_dRs (bf16 x, f32 or f16 scales and biases): sum_c bf16(x) * bf16(fmaf(s, q, b)), the
//   weight decoded in f32 and rounded once, as prefill.cu's qdequant_bf16 decodes it.
// 4 and 8 bits, groups of 32, 64 and 128, scales in f32, f16 and bf16, row counts that are not a
// multiple of the block's 128, K with a partial last chunk (K = 288), one range of K and several
// (partial slices added by qmma_reduce), eight chunks (every slot of the pipeline reused), and a row's bits at M = 2 and M = 32 (a row never depends
// on the rows beside it). Built and run by run.sh, which prepends the kernel sources.
#include "kernels_qmma.cpp"
#include "emu_check.h"
#include <cstdio>
#include <random>
#include <string>

static std::mt19937 rng(17);

// An affine weight [n, k] of `bits`: random words; scales and biases stored in dtype `dt`.
struct QW {
    int n, k, bits, group, dt;
    std::vector<unsigned> packed;
    std::vector<unsigned char> sc, bi;
    float param(const std::vector<unsigned char>& v, size_t i) const { return param_at(v, i, dt); }
    unsigned q(int r, int c) const {
        const size_t bit = (size_t)c * bits, words = (size_t)k * bits / 32;
        return (packed[(size_t)r * words + bit / 32] >> (bit % 32)) & ((1u << bits) - 1u);
    }
    size_t gi(int r, int c) const { return (size_t)r * (k / group) + c / group; }
    // The decoded value in f32, as the kernel computes it before rounding.
    float at(int r, int c) const { return std::fmaf(param(sc, gi(r, c)), (float)q(r, c), param(bi, gi(r, c))); }
    // The decoded value rounded once to bf16: the dR kernels' fma.rn.bf16x2 over bf16 scales, the
    // dRs kernels' f32 value (at) over others.
    float at_bf16(int r, int c) const {
        const size_t g = gi(r, c);
        if (dt != DT_BF16) return emu_bf16(emu_bf16_rn(at(r, c)));
        return emu_bf16(emu_bf16_rn_d((double)param(sc, g) * q(r, c) + param(bi, g)));
    }
};
static QW make(int n, int k, int bits, int group, int dt) {
    QW w{n, k, bits, group, dt, {}, {}, {}};
    w.packed.resize((size_t)n * k * bits / 32);
    for (auto& v : w.packed) v = rng();
    size_t groups = (size_t)n * (k / group);
    float s = bits == 4 ? 0.05f : 0.004f;
    random_params(w.sc, groups, dt, s, rng);
    random_params(w.bi, groups, dt, 4 * s, rng);
    return w;
}

typedef void (*Kernel)(float*, const void*, int, int, const u32*, const void*, const void*, int, int, int, int);

// Runs `f` over x ([m, k]: f32 for the f32 kernels, else bf16 bits) with `cps` chunks per range of K, then
// qmma_reduce when there are several ranges: out [m, n]. `block_rows`: the rows of one block over
// gridDim.z (the dR kernels; 0: one block takes them all).
static std::vector<float> run(Kernel f, const QW& w, const void* x, int m, int cps, int block_rows = 0) {
    const int chunks = (w.k + 127) / 128, splits = (chunks + cps - 1) / cps;
    const int lg = __builtin_ctz(w.group);
    const unsigned z = block_rows ? (unsigned)((m + block_rows - 1) / block_rows) : 1u;
    std::vector<float> part((size_t)splits * m * w.n, NAN), out((size_t)m * w.n, NAN);
    emu_launch({(unsigned)((w.n + 127) / 128), (unsigned)splits, z}, {128, 1, 1}, [&] {
        f(part.data(), x, m, w.n, w.packed.data(), w.sc.data(), w.bi.data(), w.dt, lg, w.k, cps);
    });
    if (splits == 1) return part;
    emu_launch({2, 1, 1}, {64, 1, 1}, [&] { qmma_reduce(out.data(), part.data(), splits, (size_t)m * w.n); });
    return out;
}

static void test(const char* name, Kernel f, bool f32x, int bits, int m, int n, int k, int group, int dt,
                 int block_rows = 0) {
    QW w = make(n, k, bits, group, dt);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> x((size_t)m * k);
    for (auto& v : x) v = d(rng);
    std::vector<unsigned short> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = emu_bf16_rn(x[i]);
    std::vector<double> want((size_t)m * n);
    for (int i = 0; i < m; ++i)
        for (int r = 0; r < n; ++r) {
            double a = 0;
            for (int c = 0; c < k; ++c) {
                const float wv = block_rows ? w.at_bf16(r, c) : w.at(r, c), xv = x[(size_t)i * k + c];
                a += (f32x ? (double)xv : (double)emu_bf16(emu_bf16_rn(xv))) * wv;
            }
            want[(size_t)i * n + r] = a;
        }
    const void* xk = f32x ? (const void*)x.data() : (const void*)xb.data();
    const int chunks = (k + 127) / 128;
    std::string tag = std::string(name) + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
                      std::to_string(k) + " g" + std::to_string(group) + " dt" + std::to_string(dt);
    const double tol = f32x ? 1e-4 : 1e-5;
    auto whole = run(f, w, xk, m, chunks, block_rows);
    cmp(tag + " one range", whole, want, tol);
    auto split = run(f, w, xk, m, 1, block_rows);
    cmp(tag + " ranges of one chunk", split, want, tol);
}

// Rows 0 and 1 of a 32-row product are bit for bit those of the same two rows alone.
static void test_rows_alone(Kernel wide, Kernel narrow) {
    QW w = make(136, 256, 4, 64, DT_BF16);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<unsigned short> xb((size_t)32 * 256);
    for (auto& v : xb) v = emu_bf16_rn(d(rng));
    auto all = run(wide, w, xb.data(), 32, 1);
    auto two = run(narrow, w, xb.data(), 2, 1);
    bool same = std::memcmp(all.data(), two.data(), two.size() * sizeof(float)) == 0;
    check(same, "qmma rows 0-1 at m=32 equal m=2");
    if (same) printf("ok   %-60s bit for bit\n", "qmma rows 0-1 at m=32 and at m=2");
}

int main() {
    const int dts[3] = {DT_F32, DT_F16, DT_BF16};
    int i = 0;
    for (int group : {32, 64, 128}) {
        for (int k : {256, 288}) {
            if (k % group) continue;
            const int dt = dts[i++ % 3];
            test("qmma_b4_m16", qmma_b4_m16, false, 4, 2, 136, k, group, dt);
            test("qmma_b4_m16", qmma_b4_m16, false, 4, 9, 40, k, group, dt);
            test("qmma_b8_m32", qmma_b8_m32, false, 8, 17, 136, k, group, dt);
            test("qmma_b4_f32", qmma_b4_f32, true, 4, 8, 136, k, group, dt);
            test("qmma_b8_f32", qmma_b8_f32, true, 8, 3, 40, k, group, dt);
        }
    }
    // Eight chunks: every slot of the kernels' pipeline is reused.
    test("qmma_b4_m16", qmma_b4_m16, false, 4, 5, 136, 1024, 64, DT_BF16);
    test("qmma_b4_f32", qmma_b4_f32, true, 4, 8, 40, 1024, 32, DT_F16);
    test("qmma_b8_m32", qmma_b8_m32, false, 8, 20, 40, 1024, 128, DT_BF16);
    test("qmma_b4_m32", qmma_b4_m32, false, 4, 32, 136, 256, 64, DT_BF16);
    test("qmma_b4_m32", qmma_b4_m32, false, 4, 25, 40, 288, 32, DT_F16);
    test("qmma_b8_m32", qmma_b8_m32, false, 8, 32, 136, 256, 128, DT_F32);
    test_rows_alone(qmma_b4_m32, qmma_b4_m16);
    // Weights decoded to bf16 (bf16 scales and biases only): 33 and 64 rows in one block, 100 in
    // two (the second partly past M), groups of 32, 64 and 128, a partial last chunk, 8 bits, and
    // the 16- and 32-row forms.
    test("qmma_b4_d64", qmma_b4_d64, false, 4, 33, 136, 256, 64, DT_BF16, 64);
    test("qmma_b4_d64", qmma_b4_d64, false, 4, 100, 40, 288, 32, DT_BF16, 64);
    test("qmma_b4_d64", qmma_b4_d64, false, 4, 64, 136, 1024, 128, DT_BF16, 64);
    test("qmma_b4_d32", qmma_b4_d32, false, 4, 20, 40, 256, 64, DT_BF16, 32);
    test("qmma_b4_d16", qmma_b4_d16, false, 4, 8, 136, 288, 64, DT_BF16, 16);
    test("qmma_b8_d64", qmma_b8_d64, false, 8, 70, 136, 288, 32, DT_BF16, 64);
    // Groups of 64 take a body compiled for that size (qmma_b4_m32 and the dR kernels): eight
    // chunks (every pipeline slot reused), a partial last chunk, rows past M in a second block.
    test("qmma_b4_d64", qmma_b4_d64, false, 4, 64, 136, 1024, 64, DT_BF16, 64);
    test("qmma_b4_d64", qmma_b4_d64, false, 4, 100, 40, 320, 64, DT_BF16, 64);
    test("qmma_b8_d64", qmma_b8_d64, false, 8, 40, 136, 1024, 64, DT_BF16, 64);
    test("qmma_b4_m32", qmma_b4_m32, false, 4, 30, 136, 1024, 64, DT_F16);
    test("qmma_b4_m32", qmma_b4_m32, false, 4, 17, 40, 320, 64, DT_F32);
    // Scales and biases as stored (a GGUF's f32 and f16 ones), each weight decoded in f32: the
    // same shapes as the bf16 forms', groups of 32 (GGUF's blocks) and 64 (the compiled size).
    test("qmma_b4_d64s", qmma_b4_d64s, false, 4, 33, 136, 256, 32, DT_F32, 64);
    test("qmma_b4_d64s", qmma_b4_d64s, false, 4, 100, 40, 288, 32, DT_F16, 64);
    test("qmma_b4_d64s", qmma_b4_d64s, false, 4, 64, 136, 1024, 64, DT_F32, 64);
    test("qmma_b4_d32s", qmma_b4_d32s, false, 4, 20, 40, 256, 32, DT_F32, 32);
    test("qmma_b4_d16s", qmma_b4_d16s, false, 4, 8, 136, 288, 64, DT_F16, 16);
    test("qmma_b8_d64s", qmma_b8_d64s, false, 8, 70, 136, 288, 32, DT_F32, 64);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
