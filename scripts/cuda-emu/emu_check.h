// The checks the emulator programs (harness.cpp, qgemv.cpp, rows.cpp) share: a failure count and
// a comparison of kernel output with a reference in f64, relative to |want| + mean|want|.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static int fails = 0;

// `groups` random per-group scales or biases in [-s, s), as the bytes of dtype `dt` (DT_F32,
// DT_F16 or DT_BF16) that a kernel reads: bf16 truncated from f32, f16 with an exponent of 2^-7 ..
// 2^-1 and a random mantissa.
static void random_params(std::vector<unsigned char>& v, size_t groups, int dt, float s, std::mt19937& rng) {
    std::uniform_real_distribution<float> d(-s, s);
    v.resize(groups * (dt == DT_F32 ? 4 : 2));
    for (size_t i = 0; i < groups; ++i) {
        float f = d(rng);
        if (dt == DT_F32) { memcpy(&v[4 * i], &f, 4); continue; }
        unsigned short h;
        if (dt == DT_BF16) { unsigned u; memcpy(&u, &f, 4); h = u >> 16; }
        else h = (unsigned short)(((f < 0) << 15) | ((8 + rng() % 7) << 10) | (rng() & 1023));
        memcpy(&v[2 * i], &h, 2);
    }
}

// Value i of bytes made by random_params, as f32.
static float param_at(const std::vector<unsigned char>& v, size_t i, int dt) {
    if (dt == DT_F32) { float f; memcpy(&f, &v[4 * i], 4); return f; }
    unsigned short h; memcpy(&h, &v[2 * i], 2);
    return dt == DT_F16 ? emu_half_to_float(h) : __uint_as_float((unsigned)h << 16);
}

static void check(bool ok, const std::string& what) {
    if (!ok) {
        ++fails;
        printf("MISMATCH %s\n", what.c_str());
    }
}

static void cmp(const std::string& what, const std::vector<float>& got, const std::vector<double>& want,
                double tol = 1e-4) {
    double mean = 0;
    for (double w : want) mean += std::fabs(w);
    mean /= std::max<size_t>(1, want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        double e = std::fabs(got[i] - want[i]) / (std::fabs(want[i]) + mean + 1e-30);
        worst = std::max(worst, e);
        if (!(e <= tol)) {
            printf("FAIL %s at %zu: got %g want %g\n", what.c_str(), i, got[i], want[i]);
            fails++;
            return;
        }
    }
    printf("ok   %-60s max rel %.2e\n", what.c_str(), worst);
}

// The integer GEMVs' parts of a row x (common.cuh xsplit_chunk: per 32-value chunk, X = rint(x 2^e)
// with e = 22 - the exponent of the chunk's largest |x|, bytes hi (signed), mid, lo of X; value v at
// word (v / 8, v % 2) byte (v % 8) / 2 of each part; then the scales 2^-e and the sums) checked
// against that definition written out here: every byte and scale exactly, the sums to 1e-5.
// `pending`: the parts of a norm's u whose scale is pending (qgemv_norm_b4_i4), with the scales
// and sums negated.
static void check_parts(const std::string& what, const unsigned* parts, const float* x, int k, bool pending = false) {
    const int chunks = k / 32;
    const float* scale = (const float*)(parts + (size_t)chunks * 24);
    const float sign = pending ? -1.0f : 1.0f;
    for (int c = 0; c < chunks; ++c) {
        float m = 0;
        double sum = 0, asum = 0;
        for (int v = 0; v < 32; ++v) m = std::max(m, std::fabs(x[c * 32 + v])), sum += x[c * 32 + v], asum += std::fabs(x[c * 32 + v]);
        int ex = 0;
        if (m > 0) std::frexp(m, &ex);
        const int e = m > 0 ? 22 - ex : 0;
        if (scale[c] != sign * std::ldexp(1.0f, -e) || std::fabs(scale[chunks + c] - sign * sum) > 1e-5 * (asum + 1e-30)) {
            check(false, what + " chunk " + std::to_string(c) + " scale or sum");
            return;
        }
        for (int v = 0; v < 32; ++v) {
            const long X = std::lrint(std::ldexp((double)x[c * 32 + v], e));
            const int word = (v / 8) * 2 + v % 2, shift = 8 * ((v % 8) / 2);
            const unsigned* p = parts + (size_t)c * 24 + word;
            const long got = (long)(signed char)(p[0] >> shift) * 65536 + ((p[8] >> shift) & 255u) * 256 + ((p[16] >> shift) & 255u);
            if (got != X) {
                check(false, what + " chunk " + std::to_string(c) + " value " + std::to_string(v));
                return;
            }
        }
    }
    printf("ok   %-60s parts as defined\n", what.c_str());
}

// The bf16 register products' input tiles of x [m, k] (common.cuh qdec_tile_at) against their
// definition written out here: per tile of 8 rows and 32-value chunk, [row g][lane t] the words
// (x 8t, x 8t + 4), (+1, +5), (+2, +6), (+3, +7) of row g rounded to bf16, bit for bit, for
// the m rows (those past m are free).
static void check_tiles(const std::string& what, const unsigned* tiles, const float* x, int m, int k) {
    const int kc = k / 32;
    for (int row = 0; row < m; ++row)
        for (int c = 0; c < kc; ++c)
            for (int t = 0; t < 4; ++t)
                for (int j = 0; j < 4; ++j) {
                    const float* v = x + (size_t)row * k + c * 32 + 8 * t + j;
                    const size_t at = ((((size_t)(row / 8) * kc + c) * 8 + row % 8) * 4 + t) * 4 + j;
                    if (tiles[at] != bf16x2_rn(v[0], v[4])) {
                        check(false, what + ": row " + std::to_string(row) + " value " + std::to_string(c * 32 + 8 * t + j));
                        return;
                    }
                }
    printf("ok   %-60s tiles as defined\n", what.c_str());
}
