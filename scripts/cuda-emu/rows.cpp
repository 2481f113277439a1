// Runs the row kernels of elementwise.cu and fused.cu (rms_norm_f32, add_rms_norm_f32, and the
// two-launch argmax: argmax_part_f32 + argmax_final_f32) through cuda_emu.h on the CPU. The norms
// against the definition in f64 (relative 1e-5), add_rms_norm bit for bit against add + rms_norm
// on the 16-byte and the scalar paths; argmax and argmax_gap bit for bit against the CPU backend's
// rule (first maximum, strictly greater replaces, a leading NaN wins, NaN/inf make the gap NaN)
// on rows cut into several ranges. Built and run by run.sh, which prepends the kernel sources.
#include "kernels_rows.cpp"
#include "emu_check.h"
#include <cstdio>
#include <random>
#include <string>

static unsigned threads_for(int d) {  // ops.rs norm_threads
    unsigned t = ((d + 3) / 4 + 31) / 32 * 32;
    return t < 32 ? 32 : (t > 1024 ? 1024 : t);
}

static void test_norms(int rows, int d, int vec, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> a(rows * d), b(rows * d), w(d);
    for (auto& v : a) v = nd(rng);
    for (auto& v : b) v = nd(rng);
    for (auto& v : w) v = nd(rng);
    std::vector<float> sum(rows * d), out(rows * d), ref_sum(rows * d), ref_out(rows * d);
    for (int i = 0; i < rows * d; ++i) ref_sum[i] = a[i] + b[i];
    float eps = 1e-5f;
    emu_launch({(unsigned)rows, 1, 1}, {threads_for(d), 1, 1}, [&] {
        add_rms_norm_f32(sum.data(), out.data(), a.data(), b.data(), w.data(), DT_F32, d, eps, vec);
    });
    emu_launch({(unsigned)rows, 1, 1}, {threads_for(d), 1, 1}, [&] {
        rms_norm_f32(ref_out.data(), ref_sum.data(), w.data(), DT_F32, d, eps, vec);
    });
    std::string tag = "rows=" + std::to_string(rows) + " d=" + std::to_string(d) + " vec=" + std::to_string(vec);
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
    emu_launch({(unsigned)parts, (unsigned)rows, 1}, {256, 1, 1}, [&] { argmax_part_f32(part.data(), x.data(), n, chunk); });
    emu_launch({(unsigned)rows, 1, 1}, {256, 1, 1}, [&] { argmax_final_f32(gap.data(), part.data(), x.data(), n, parts, 1); });
    emu_launch({(unsigned)rows, 1, 1}, {256, 1, 1}, [&] { argmax_final_f32(idx.data(), part.data(), x.data(), n, parts, 0); });
    for (int r = 0; r < rows; ++r) {
        unsigned want[3];
        cpu_argmax_gap(x.data() + (size_t)r * n, n, want);
        std::string tag = "n=" + std::to_string(n) + " parts=" + std::to_string(parts) + " row " + std::to_string(r);
        check(std::memcmp(&gap[3 * r], want, 12) == 0,
              "argmax_gap " + tag + " got " + std::to_string(gap[3 * r]) + " want " + std::to_string(want[0]));
        check(idx[r] == want[0], "argmax " + tag);
    }
}

int main() {
    std::mt19937 rng(7);
    for (int vec : {1, 0}) {
        test_norms(2, 4096, vec, rng);
        test_norms(3, 1024, vec, rng);
        test_norms(1, 128, vec, rng);
    }
    test_norms(2, 1001, 0, rng);  // not a multiple of 4: the scalar path's tail
    test_norms(1, 6000, 0, rng);  // over 1024 threads' 4 values: two passes per thread
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
    printf("%d failures\n", fails);
    return fails != 0;
}
