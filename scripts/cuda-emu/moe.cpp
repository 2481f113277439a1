// Runs the mixture-of-experts kernels of moe.cu and moe_router.cu through cuda_emu.h on the CPU.
// moe_route (with and without a bias row) and moe_route_dense (the router's product with it)
// against the host's rule (crates/nuvec/src/moe.rs: softmax-top-k with and without renormalizing,
// top-k-softmax; best first, ties to the lower index): ids exactly, weights to 1e-6. The
// gathered experts (moe_gate_up_* then moe_down_*) against their definition in f64,
// sum_j w_j (down_e(act(gate_e x + b, up_e x + b)) + b), for 4-, 3- and 8-bit affine weights
// (groups of 16, 32 and 64; f32, f16 and bf16 scales), dense bf16 and f32 ones, mxfp4, nvfp4
// (with a global factor) and mxfp8, SiLU, gpt-oss's clamped SwiGLU and Gemma 4's GELU with
// per-expert output scales, with and without bias rows (tolerance 1e-4 relative to
// |want| + mean|want|); the 4-bit integer kernels (moe_gate_up_b4_int, moe_down_b4_int, and the
// mxfp4 pair moe_gate_up_fp4_int, moe_down_fp4_int over xsplit_f32's parts, a norm's pending
// scale too) against the same definition and tolerance;
// moe_shared_add against the host's gated sum; and the grouped path of
// many rows (moe_align, qmma_bN_g64 for gate and up, moe_act_bf16, qmma_bN_g64 for down,
// moe_combine) for 4- and 8-bit weights with bf16 scales (f32 and f16 ones through the s kernels) and mxfp4 ones, against the same definition with x,
// the decoded weights and the activations rounded to bf16 as the path rounds them (tolerance
// 1e-3: an activation's rounding may land on the other side of a bf16 step), with an expert
// given more than one tile of slots and experts given none. Built and run by run.sh, which
// prepends the kernel sources.
#include "kernels_moe.cpp"
#include "emu_check.h"
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

static std::mt19937 rng(7);

// One expert matrix [n, k] in one format, with its values as the reference reads them.
struct Mat {
    std::vector<unsigned> packed;
    std::vector<unsigned char> sc, bi, dense;
    std::vector<double> value;  // [n, k]
    std::vector<double> value_bf16;  // affine: s q + b rounded once to bf16 (the grouped path's)
};

static double e2m1(unsigned c) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8) ? -mag[c & 7] : mag[c & 7];
}
static double e4m3(unsigned b) {
    unsigned e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? std::ldexp((double)m, -9) : std::ldexp(1.0 + m / 8.0, (int)e - 7);
    return (b & 0x80) ? -v : v;
}

// fmt: "b4" etc (affine, with `group` and scale dtype `dt`), "dense" (dtype `dt`), "mxfp4",
// "nvfp4", "mxfp8". `factor`: nvfp4's global factor.
static Mat make(const std::string& fmt, int n, int k, int group, int dt, float factor) {
    Mat m;
    m.value.resize((size_t)n * k);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    if (fmt == "dense") {
        m.dense.resize((size_t)n * k * (dt == DT_F32 ? 4 : 2));
        for (size_t i = 0; i < (size_t)n * k; ++i) {
            float f = u(rng);
            if (dt == DT_F32) { memcpy(&m.dense[4 * i], &f, 4); m.value[i] = f; continue; }
            unsigned x; memcpy(&x, &f, 4);
            unsigned short h = x >> 16;
            memcpy(&m.dense[2 * i], &h, 2);
            m.value[i] = __uint_as_float((unsigned)h << 16);
        }
        return m;
    }
    const bool fp = fmt[0] != 'b';
    const int bits = fp ? (fmt == "mxfp8" ? 8 : 4) : fmt[1] - '0';
    if (fp) group = fmt == "nvfp4" ? 16 : 32;
    std::vector<unsigned> q((size_t)n * k);
    for (auto& v : q) v = rng() & ((1u << bits) - 1);
    if (fmt == "mxfp8") for (auto& v : q) if ((v & 0x7f) == 0x7f) v ^= 1;  // no NaN codes
    m.packed.assign((size_t)n * k * bits / 32, 0);
    for (size_t i = 0; i < q.size(); ++i) {
        size_t bit = i * bits;
        m.packed[bit / 32] |= q[i] << (bit % 32);
        if (bit % 32 + bits > 32) m.packed[bit / 32 + 1] |= q[i] >> (32 - bit % 32);
    }
    const size_t groups = (size_t)n * (k / group);
    if (fp) {
        m.sc.resize(groups);
        for (auto& s : m.sc) s = fmt == "nvfp4" ? (unsigned char)(0x30 + rng() % 16) : (unsigned char)(122 + rng() % 8);
    } else {
        random_params(m.sc, groups, dt, 0.05f, rng);
        random_params(m.bi, groups, dt, 0.2f, rng);
    }
    for (int r = 0; r < n; ++r)
        for (int c = 0; c < k; ++c) {
            size_t i = (size_t)r * k + c, g = (size_t)r * (k / group) + c / group;
            if (!fp) {
                m.value[i] = (double)std::fmaf(param_at(m.sc, g, dt), (float)q[i], param_at(m.bi, g, dt));
                // bf16 scales: one bf16 fma; others (the s kernels): fmaf in f32, then one rounding.
                m.value_bf16.push_back(
                    dt == DT_BF16 ? emu_bf16(emu_bf16_rn_d((double)param_at(m.sc, g, dt) * q[i] + param_at(m.bi, g, dt)))
                                  : emu_bf16(emu_bf16_rn((float)m.value[i])));
            } else {
                double s = fmt == "nvfp4" ? e4m3(m.sc[g]) * factor : std::ldexp(1.0, (int)m.sc[g] - 127);
                m.value[i] = (bits == 8 ? e4m3(q[i]) : e2m1(q[i])) * s;
                m.value_bf16.push_back(m.value[i]);  // a code times a power of two: exact in bf16
            }
        }
    return m;
}

static double bf16_of(double v) { return emu_bf16(emu_bf16_rn_d(v)); }

// The experts' definition in f64: sum_j w_j s_e (down_e(act(gate_e x + b, up_e x + b)) + b) for
// mats [3][E] and bias rows bval [3][E]. `rounded`: as the grouped path rounds (x, the decoded
// weights and each activation to bf16), else the weights as the gathered kernels decode them.
static std::vector<double> expected(const std::vector<Mat>& mats, const std::vector<std::vector<double>>& bval,
                                    bool biases, int E, int top_k, int hidden, int inter, int activation, float alpha,
                                    float limit, bool scaled, const std::vector<float>& x,
                                    const std::vector<unsigned>& ids, const std::vector<float>& w, bool rounded) {
    const int rows = (int)(x.size() / hidden);
    auto weight = [&](int m, size_t i) { return rounded ? mats[m].value_bf16[i] : mats[m].value[i]; };
    std::vector<double> want((size_t)rows * hidden, 0.0);
    for (int t = 0; t < rows; ++t)
        for (int j = 0; j < top_k; ++j) {
            const int e = ids[t * top_k + j];
            std::vector<double> a(inter);
            for (int r = 0; r < inter; ++r) {
                double g = biases ? bval[e][r] : 0, v = biases ? bval[E + e][r] : 0;
                for (int c = 0; c < hidden; ++c) {
                    const double xv = rounded ? bf16_of(x[(size_t)t * hidden + c]) : x[(size_t)t * hidden + c];
                    g += weight(e, (size_t)r * hidden + c) * xv;
                    v += weight(E + e, (size_t)r * hidden + c) * xv;
                }
                if (activation == MOE_ACT_SILU) a[r] = g / (1 + std::exp(-g)) * v;
                else if (activation == MOE_ACT_GELU_APPROX)
                    a[r] = 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * v;
                else {
                    double gc = std::min(g, (double)limit), uc = std::clamp(v, -(double)limit, (double)limit);
                    a[r] = (uc + 1) * gc / (1 + std::exp(-alpha * gc));
                }
                if (rounded) a[r] = bf16_of(a[r]);
            }
            for (int r = 0; r < hidden; ++r) {
                double h = biases ? bval[2 * E + e][r] : 0;
                for (int c = 0; c < inter; ++c) h += weight(2 * E + e, (size_t)r * inter + c) * a[c];
                want[(size_t)t * hidden + r] += w[t * top_k + j] * (scaled ? 0.5 + 0.25 * e : 1.0) * h;
            }
        }
    return want;
}

// xsplit_f32's parts of the n values at v (several rows split as one), as the host launches it.
static std::vector<unsigned> split(const float* v, size_t n) {
    std::vector<unsigned> parts(QI_PARTS_WORDS(n / 32), 0x7fc00000u);
    emu_launch({(unsigned)((n + 127) / 128), 1, 1}, {128, 1, 1}, [&] { xsplit_f32(parts.data(), v, (int)n); });
    return parts;
}

// Integer: the 4-bit kernels on integer dot products (moe_gate_up_b4_int, moe_down_b4_int; mxfp4:
// the fp4_int pair) over
// xsplit_f32's parts; `pending` (one row): x's parts are a norm's with its scale pending (scales
// and sums negated, the norm tail holding eps and the chunks' sums of squares), x = u / rms(h).
enum class Path { Rows, Integer, IntegerPending };

// The parts of a norm's u (one row) with its scale pending, as qgemv_norm_b4_i4 writes them:
// scales and sums negated, then the tail of eps and each chunk's sum of squares of h.
static std::vector<unsigned> pending_parts(const std::vector<float>& u, const std::vector<float>& h, float eps) {
    std::vector<unsigned> xq = split(u.data(), u.size());
    const int chunks = (int)u.size() / 32;
    float* sc = (float*)(xq.data() + (size_t)chunks * QI_WORDS);
    for (int c = 0; c < chunks; ++c) sc[c] = -sc[c], sc[chunks + c] = -sc[chunks + c];
    sc[2 * chunks] = eps;
    for (int c = 0; c < chunks; ++c) {
        double p = 0;
        for (int i = 0; i < 32; ++i) p += (double)h[32 * c + i] * h[32 * c + i];
        sc[2 * chunks + 1 + c] = (float)p;
    }
    return xq;
}

static void test_experts(const std::string& fmt, int group, int dt, bool biases, int activation, int rows,
                         bool scaled = false, int hidden = 96, int inter = 64, Path path = Path::Rows) {
    const int E = 6, top_k = 2, b_dt = DT_BF16;
    const float alpha = 1.702f, limit = 7.0f, factor = 0.75f;
    std::vector<Mat> mats;  // [3][E]
    for (int p = 0; p < 3; ++p)
        for (int e = 0; e < E; ++e)
            mats.push_back(p < 2 ? make(fmt, inter, hidden, group, dt, factor) : make(fmt, hidden, inter, group, dt, factor));
    std::vector<std::vector<unsigned short>> brow(3 * E);
    std::vector<std::vector<double>> bval(3 * E);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int p = 0; p < 3; ++p)
        for (int e = 0; e < E; ++e) {
            int w = p < 2 ? inter : hidden;
            for (int i = 0; i < w; ++i) {
                float f = u(rng); unsigned x; memcpy(&x, &f, 4);
                brow[p * E + e].push_back(x >> 16);
                bval[p * E + e].push_back(__uint_as_float((x >> 16) << 16));
            }
        }
    std::vector<unsigned long long> index(3 * E * MOE_SLOTS, 0);
    const int mode = fmt == "mxfp4" ? 1 : fmt == "mxfp8" ? 2 : fmt == "nvfp4" ? 3 : 0;
    for (int i = 0; i < 3 * E; ++i) {
        Mat& m = mats[i];
        unsigned long long* ent = &index[i * MOE_SLOTS];
        ent[0] = fmt == "dense" ? (unsigned long long)m.dense.data() : (unsigned long long)m.packed.data();
        ent[1] = (unsigned long long)m.sc.data();
        ent[2] = (unsigned long long)m.bi.data();
        ent[3] = biases ? (unsigned long long)brow[i].data() : 0;
        float f = mode == 3 ? factor : 1.0f;
        ent[4] = __float_as_uint(f);
        ent[5] = __float_as_uint(scaled ? 0.5f + 0.25f * (i % E) : 1.0f);  // expert i % E's factor
    }
    std::vector<float> x((size_t)rows * hidden), w((size_t)rows * top_k);
    std::vector<unsigned> ids((size_t)rows * top_k);
    for (auto& v : x) v = u(rng);
    for (int t = 0; t < rows; ++t) {
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        for (int j = 0; j < top_k; ++j) ids[t * top_k + j] = order[j], w[t * top_k + j] = 0.3f + 0.2f * j;
    }
    const int dtk = fmt == "dense" || fmt[0] == 'b' ? dt : mode;
    int lg = 0;
    while ((1 << lg) < group) ++lg;
    std::vector<float> act((size_t)rows * top_k * inter, NAN), out((size_t)rows * hidden, NAN);
    auto gate_up = fmt == "dense" ? moe_gate_up_dense : fmt == "b4" ? moe_gate_up_b4 : fmt == "b3" ? moe_gate_up_b3
                 : fmt == "b8" ? moe_gate_up_b8 : fmt == "mxfp8" ? moe_gate_up_fp8 : moe_gate_up_fp4;
    auto down = fmt == "dense" ? moe_down_dense : fmt == "b4" ? moe_down_b4 : fmt == "b3" ? moe_down_b3
              : fmt == "b8" ? moe_down_b8 : fmt == "mxfp8" ? moe_down_fp8 : moe_down_fp4;
    // Output rows per block, as the host launches them (ops/moe.rs): a warp per row for dense
    // experts; moe_gu_rows per warp and MOE_DOWN_ROWS per block for the others.
    const int wide = fmt == "b8" || fmt == "mxfp8";
    const unsigned gu_rows = fmt == "dense" ? MOE_WARPS : MOE_WARPS * (wide ? 2 : 4);
    const unsigned down_rows = fmt == "dense" ? MOE_WARPS : MOE_DOWN_ROWS;
    if (path == Path::Rows) {
        emu_launch({(unsigned)((inter + gu_rows - 1) / gu_rows), (unsigned)(rows * top_k), 1}, {32 * MOE_WARPS, 1, 1}, [&] {
            gate_up(act.data(), x.data(), ids.data(), index.data(), E, top_k, inter, hidden, dtk, lg, b_dt, activation,
                    alpha, limit);
        });
        emu_launch({(unsigned)((hidden + down_rows - 1) / down_rows), (unsigned)rows, 1}, {32 * MOE_WARPS, 1, 1}, [&] {
            down(out.data(), act.data(), ids.data(), w.data(), index.data(), E, top_k, hidden, inter, dtk, lg, b_dt);
        });
    } else {
        std::vector<unsigned> xq = split(x.data(), x.size());
        if (path == Path::IntegerPending) {
            // x's parts become those of u = x rms(h) with the scale pending: the kernels must
            // multiply by -1 / rms(h) from the tail.
            std::vector<float> h(hidden);
            double ss = 0;
            for (auto& v : h) v = u(rng), ss += (double)v * v;
            const float eps = 1e-5f, rms = (float)std::sqrt(ss / hidden + eps);
            std::vector<float> uu(x.size());
            for (size_t i = 0; i < x.size(); ++i) uu[i] = x[i] * rms;
            xq = pending_parts(uu, h, eps);
        }
        auto gate_up_int = fmt == "mxfp4" ? moe_gate_up_fp4_int : moe_gate_up_b4_int;
        auto down_int = fmt == "mxfp4" ? moe_down_fp4_int : moe_down_b4_int;
        // gate/up writes the activations as the down kernel's parts, a 32-value chunk per block
        // (NaN-filled first, so that a word it leaves unwritten shows).
        std::vector<unsigned> aq(QI_PARTS_WORDS((size_t)rows * top_k * inter / 32), 0x7fc00000u);
        emu_launch({(unsigned)(inter / 32), (unsigned)(rows * top_k), 1}, {32 * MOE_GU_INT_WARPS, 1, 1}, [&] {
            gate_up_int((float*)aq.data(), (const float*)xq.data(), ids.data(), index.data(), E, top_k, inter, hidden,
                        dtk, lg, b_dt, activation, alpha, limit);
        });
        emu_launch({(unsigned)((hidden + down_rows - 1) / down_rows), (unsigned)rows, 1}, {32 * MOE_WARPS, 1, 1}, [&] {
            down_int(out.data(), (const float*)aq.data(), ids.data(), w.data(), index.data(), E, top_k, hidden,
                            inter, dtk, lg, b_dt);
        });
    }
    const std::vector<double> want = expected(mats, bval, biases, E, top_k, hidden, inter, activation, alpha, limit,
                                              scaled, x, ids, w, false);
    const char* act_name = activation == MOE_ACT_SILU ? " silu" : activation == MOE_ACT_GELU_APPROX ? " gelu" : " swiglu_oai";
    cmp("moe experts " + fmt + " group " + std::to_string(group) + " dt " + std::to_string(dt) + (biases ? " biases" : "") +
            act_name + (scaled ? " scaled" : "") + " rows " + std::to_string(rows) + " hidden " + std::to_string(hidden) +
            " inter " + std::to_string(inter) +
            (path == Path::Integer ? " integer" : path == Path::IntegerPending ? " integer pending-norm" : ""),
        out, want);
}

// The grouped path for `rows` tokens over E experts (b4 or b8 with scales of dtype `dt`: the s
// kernels for f32 and f16); `skew`: most tokens' first choice is expert 0 (more than one tile of
// slots).
static void test_grouped(const std::string& fmt, int group, int E, int hidden, int inter, bool biases, int activation,
                         int rows, bool skew, bool scaled, int dt = DT_BF16) {
    const int top_k = 2, b_dt = DT_BF16;
    const float alpha = 1.702f, limit = 7.0f;
    std::vector<Mat> mats;  // [3][E]
    for (int p = 0; p < 3; ++p)
        for (int e = 0; e < E; ++e)
            mats.push_back(p < 2 ? make(fmt, inter, hidden, group, dt, 1.0f) : make(fmt, hidden, inter, group, dt, 1.0f));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<std::vector<unsigned short>> brow(3 * E);
    std::vector<std::vector<double>> bval(3 * E);
    for (int i = 0; i < 3 * E; ++i)
        for (int c = 0; c < (i < 2 * E ? inter : hidden); ++c) {
            float f = u(rng); unsigned x; memcpy(&x, &f, 4);
            brow[i].push_back(x >> 16);
            bval[i].push_back(__uint_as_float((x >> 16) << 16));
        }
    std::vector<unsigned long long> index(3 * E * MOE_SLOTS, 0);
    for (int i = 0; i < 3 * E; ++i) {
        unsigned long long* ent = &index[i * MOE_SLOTS];
        ent[0] = (unsigned long long)mats[i].packed.data();
        ent[1] = (unsigned long long)mats[i].sc.data();
        ent[2] = (unsigned long long)mats[i].bi.data();
        ent[3] = biases ? (unsigned long long)brow[i].data() : 0;
        ent[4] = __float_as_uint(1.0f);
        ent[5] = __float_as_uint(scaled ? 0.5f + 0.25f * (i % E) : 1.0f);
    }
    const int slots = rows * top_k, tiles = (slots + MOE_TILE - 1) / MOE_TILE + std::min(E, slots);
    std::vector<float> x((size_t)rows * hidden), w(slots);
    std::vector<unsigned> ids(slots);
    for (auto& v : x) v = u(rng);
    for (int t = 0; t < rows; ++t) {
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        if (skew && rng() % 10) std::swap(order[0], *std::find(order.begin(), order.end(), 0));
        for (int j = 0; j < top_k; ++j) ids[t * top_k + j] = order[j], w[t * top_k + j] = 0.3f + 0.2f * j;
    }
    std::vector<unsigned short> xb(x.size()), act((size_t)slots * inter);
    for (size_t i = 0; i < x.size(); ++i) xb[i] = emu_bf16_rn(x[i]);
    std::vector<int> order((size_t)tiles * MOE_TILE, 7), tile_expert(tiles, 7);
    std::vector<float> gu((size_t)slots * 2 * inter, NAN), y((size_t)slots * hidden, NAN), out((size_t)rows * hidden, NAN);
    int lg = 0;
    while ((1 << lg) < group) ++lg;
    auto grouped = [&](float* o, const void* xin, int proj, int pair, int div, int n, int k) {
        if (dt != DT_BF16 && fmt == "b4")
            qmma_b4_g64s(o, xin, order.data(), tile_expert.data(), index.data(), E, proj, pair, div, n, k, lg, dt);
        else if (dt != DT_BF16)
            qmma_b8_g64s(o, xin, order.data(), tile_expert.data(), index.data(), E, proj, pair, div, n, k, lg, dt);
        else
            (fmt == "b4" ? qmma_b4_g64 : fmt == "b8" ? qmma_b8_g64 : qmma_fp4_g64)(
                o, xin, order.data(), tile_expert.data(), index.data(), E, proj, pair, div, n, k, lg);
    };
    emu_launch({1, 1, 1}, {1024, 1, 1}, [&] { moe_align(order.data(), tile_expert.data(), ids.data(), slots, E, tiles); });
    emu_launch({2 * (unsigned)((inter + 127) / 128), 1, (unsigned)tiles}, {128, 1, 1}, [&] {
        grouped(gu.data(), xb.data(), 0, 1, top_k, inter, hidden);
    });
    emu_launch({3, 1, 1}, {64, 1, 1}, [&] {
        moe_act_bf16(act.data(), gu.data(), ids.data(), index.data(), E, inter, b_dt, activation, alpha, limit,
                     (size_t)slots * inter);
    });
    emu_launch({(unsigned)((hidden + 127) / 128), 1, (unsigned)tiles}, {128, 1, 1}, [&] {
        grouped(y.data(), act.data(), 2, 0, 1, hidden, inter);
    });
    emu_launch({3, 1, 1}, {64, 1, 1}, [&] {
        moe_combine(out.data(), y.data(), ids.data(), w.data(), index.data(), E, top_k, hidden, b_dt, (size_t)rows * hidden);
    });
    const std::vector<double> want = expected(mats, bval, biases, E, top_k, hidden, inter, activation, alpha, limit,
                                              scaled, x, ids, w, true);
    // Every slot in exactly one place of `order`, each tile of one expert.
    std::vector<int> seen(slots, 0);
    bool laid_out = true;
    for (int i = 0; i < tiles * MOE_TILE; ++i) {
        const int s = order[i];
        if (s < 0) continue;
        laid_out = laid_out && s < slots && tile_expert[i / MOE_TILE] == (int)ids[s];
        if (s < slots) seen[s]++;
    }
    for (int c : seen) laid_out = laid_out && c == 1;
    const char* act_name = activation == MOE_ACT_SILU ? " silu" : activation == MOE_ACT_GELU_APPROX ? " gelu" : " swiglu_oai";
    const std::string tag = "moe grouped " + fmt + " dt" + std::to_string(dt) + " group " + std::to_string(group) + " experts " + std::to_string(E) +
                            (biases ? " biases" : "") + act_name + (scaled ? " scaled" : "") + (skew ? " skewed" : "") +
                            " " + std::to_string(hidden) + "x" + std::to_string(inter) + " rows " + std::to_string(rows);
    check(laid_out, tag + ": moe_align's layout");
    cmp(tag, out, want, 1e-3);
}

// The host's rule (crates/nuvec/src/moe.rs route_row).
static void route_ref(const std::vector<float>& l, int top_k, int mode, bool normalize, std::vector<unsigned>& ids,
                      std::vector<float>& w) {
    std::vector<float> v = l;
    if (mode == MOE_ROUTE_SOFTMAX_TOPK) {
        float mx = -INFINITY, s = 0;
        for (float x : v) mx = std::max(mx, x);
        for (float& x : v) x = std::exp(x - mx), s += x;
        for (float& x : v) x /= s;
    }
    std::vector<int> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[a] > v[b]; });
    std::vector<float> picked;
    for (int j = 0; j < top_k; ++j) ids.push_back(order[j]), picked.push_back(v[order[j]]);
    if (mode == MOE_ROUTE_SOFTMAX_TOPK) {
        float total = 0;
        for (float p : picked) total += p;
        if (!normalize) total = 1;
        for (float p : picked) w.push_back(p / total);
    } else {
        float mx = picked[0], s = 0;
        for (float p : picked) s += std::exp(p - mx);
        for (float p : picked) w.push_back(std::exp(p - mx) / s);
    }
}

// `biased`: a bf16 bias row added to the logits in the kernel, against the reference on the
// logits plus the bias (as add_bias_f32 adds them).
static void test_route(int rows, int experts, int top_k, int mode, bool normalize, bool ties, bool biased = false) {
    std::vector<float> logits((size_t)rows * experts);
    std::normal_distribution<float> nd(0, 2);
    for (auto& v : logits) v = ties ? (float)(rng() % 4) : nd(rng);
    std::vector<unsigned short> bias(experts);
    for (auto& b : bias) b = (unsigned short)(__float_as_uint(biased ? nd(rng) : 0.0f) >> 16);
    std::vector<unsigned> ids((size_t)rows * top_k);
    std::vector<float> w((size_t)rows * top_k);
    emu_launch({(unsigned)rows, 1, 1}, {MOE_ROUTE_THREADS, 1, 1}, [&] {
        moe_route(ids.data(), w.data(), logits.data(), experts, top_k, mode, normalize,
                  biased ? bias.data() : nullptr, DT_BF16);
    });
    std::vector<unsigned> want_ids;
    std::vector<float> want_w;
    for (int t = 0; t < rows; ++t) {
        std::vector<float> row(logits.begin() + (size_t)t * experts, logits.begin() + (size_t)(t + 1) * experts);
        for (int e = 0; e < experts && biased; ++e) row[e] += __uint_as_float((unsigned)bias[e] << 16);
        route_ref(row, top_k, mode, normalize, want_ids, want_w);
    }
    bool ok = ids == want_ids;
    for (size_t i = 0; i < w.size() && ok; ++i) ok = std::fabs(w[i] - want_w[i]) <= 1e-6f * (1 + std::fabs(want_w[i]));
    std::string tag = "moe_route rows " + std::to_string(rows) + " experts " + std::to_string(experts) + " top " +
                      std::to_string(top_k) + " mode " + std::to_string(mode) + (normalize ? " normalized" : "") +
                      (ties ? " ties" : "") + (biased ? " biased" : "");
    check(ok, tag);
    if (ok) printf("ok   %s\n", tag.c_str());
}

// The device's order where the host's total order says otherwise: -0 ties +0 (the lower index
// first), -inf is chosen before any NaN and NaNs come last, in index order.
static void test_route_special() {
    const std::vector<float> logits = {1.0f, NAN, -INFINITY, -0.0f, 0.0f, 2.0f, NAN, 2.0f};
    const std::vector<unsigned> want = {5, 7, 0, 3, 4, 2, 1, 6};
    std::vector<unsigned> ids(8);
    std::vector<float> w(8);
    emu_launch({1, 1, 1}, {MOE_ROUTE_THREADS, 1, 1}, [&] {
        moe_route(ids.data(), w.data(), logits.data(), 8, 8, MOE_ROUTE_TOPK_SOFTMAX, 0, nullptr, DT_F32);
    });
    check(ids == want, "moe_route NaN, -inf and signed zeros");
    if (ids == want) printf("ok   moe_route NaN, -inf and signed zeros\n");
}

// moe_route_dense (the router's product and the top-k in one launch) for `rows` rows of x [k]
// through W [experts, k] of dtype w_dt, with an f32 bias row or none; `pending` (one row): x is a
// norm's u = x rms(h) with the scale pending in its parts. Against the f64 product of the values
// the kernel reads, then the host's rule: ids exactly, weights and the products it writes to
// `logits` to 1e-5; launched twice,
// so the second launch shows that the first set its tickets back to 0.
static std::mt19937 route_rng(11);  // its own stream: the other tests' data stay as they were
static void test_route_dense(int rows, int experts, int k, int w_dt, int top_k, int mode, bool normalize, bool biased,
                             bool pending) {
    std::mt19937& rng = route_rng;
    std::normal_distribution<float> nd(0, 1);
    std::vector<unsigned> wbits((size_t)experts * k);
    std::vector<double> wval(wbits.size());
    for (size_t i = 0; i < wbits.size(); ++i) {
        const float v = nd(rng) * 2.0f / std::sqrt((float)k);
        if (w_dt == DT_F32) wbits[i] = __float_as_uint(v), wval[i] = v;
        else if (w_dt == DT_F16) wbits[i] = emu_float_to_half(v), wval[i] = emu_half_to_float((unsigned short)wbits[i]);
        else wbits[i] = emu_bf16_rn(v), wval[i] = emu_bf16(wbits[i]);
    }
    std::vector<float> wf32;
    std::vector<unsigned short> w16;
    for (unsigned b : wbits) w_dt == DT_F32 ? wf32.push_back(__uint_as_float(b)) : w16.push_back((unsigned short)b);
    const void* w = w_dt == DT_F32 ? (const void*)wf32.data() : (const void*)w16.data();
    std::vector<float> x((size_t)rows * k), bias(experts);
    for (auto& v : x) v = nd(rng);
    for (auto& v : bias) v = biased ? nd(rng) : 0.0f;
    // x as the kernel reads it (u, with the parts holding the pending scale) and as the product
    // takes it (x_eff).
    std::vector<float> xin = x;
    std::vector<double> x_eff(x.begin(), x.end());
    std::vector<unsigned> parts;
    if (pending) {
        std::vector<float> h(k);
        double ss = 0;
        for (auto& v : h) v = nd(rng), ss += (double)v * v;
        const float eps = 1e-5f;
        const double rms = std::sqrt(ss / k + eps);
        for (int i = 0; i < k; ++i) x_eff[i] = (double)xin[i] / rms;
        parts = pending_parts(xin, h, eps);
    }
    // `logits` gets the products of x as the kernel reads it (u, for a pending norm).
    std::vector<double> want_logits((size_t)rows * experts);
    std::vector<unsigned> want_ids;
    std::vector<float> want_w;
    for (int t = 0; t < rows; ++t) {
        std::vector<float> row(experts);
        for (int e = 0; e < experts; ++e) {
            double d = 0, raw = 0;
            for (int i = 0; i < k; ++i) {
                d += wval[(size_t)e * k + i] * x_eff[(size_t)t * k + i];
                raw += wval[(size_t)e * k + i] * xin[(size_t)t * k + i];
            }
            want_logits[(size_t)t * experts + e] = raw;
            row[e] = (float)(d + bias[e]);
        }
        route_ref(row, top_k, mode, normalize, want_ids, want_w);
    }
    std::vector<unsigned> tickets(8, 0);
    bool ok = true;
    for (int launch = 0; launch < 2 && ok; ++launch) {
        std::vector<unsigned> ids((size_t)rows * top_k, 0xFFFFFFFFu);
        std::vector<float> wts((size_t)rows * top_k, NAN), logits((size_t)rows * experts, NAN);
        emu_launch({(unsigned)((experts + MOE_RL_EXPERTS - 1) / MOE_RL_EXPERTS), (unsigned)rows, 1},
                   {32 * MOE_RL_WARPS, 1, 1}, [&] {
                       moe_route_dense(ids.data(), wts.data(), logits.data(), tickets.data(), xin.data(), w, w_dt, k,
                                       experts, top_k, mode, normalize, biased ? bias.data() : nullptr, DT_F32,
                                       pending ? parts.data() : nullptr);
                   });
        ok = ids == want_ids;
        for (size_t i = 0; i < wts.size() && ok; ++i) ok = std::fabs(wts[i] - want_w[i]) <= 1e-5f * (1 + std::fabs(want_w[i]));
        for (size_t i = 0; i < logits.size() && ok; ++i)
            ok = std::fabs(logits[i] - want_logits[i]) <= 1e-5 * (1 + std::fabs(want_logits[i]));
        for (unsigned t : tickets) ok = ok && t == 0;
    }
    std::string tag = "moe_route_dense rows " + std::to_string(rows) + " experts " + std::to_string(experts) + " k " +
                      std::to_string(k) + " dt " + std::to_string(w_dt) + " top " + std::to_string(top_k) + " mode " +
                      std::to_string(mode) + (normalize ? " normalized" : "") + (biased ? " biased" : "") +
                      (pending ? " pending-norm" : "");
    check(ok, tag);
    if (ok) printf("ok   %s\n", tag.c_str());
}

// moe_shared_add against the host's arithmetic (crates/nuvec/src/moe.rs): to 1e-6.
static void test_shared_add(int rows, int width) {
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    std::vector<float> a((size_t)rows * width), b(a.size()), gate(rows), out(a.size(), NAN);
    for (auto& v : a) v = u(rng);
    for (auto& v : b) v = u(rng);
    for (auto& v : gate) v = u(rng);
    emu_launch({2, 1, 1}, {64, 1, 1}, [&] {
        moe_shared_add(out.data(), a.data(), b.data(), gate.data(), width, a.size());
    });
    bool ok = true;
    for (size_t i = 0; i < a.size() && ok; ++i) {
        const float g = 1.0f / (1.0f + std::exp(-gate[i / width]));
        ok = std::fabs(out[i] - (a[i] + g * b[i])) <= 1e-6f * (1 + std::fabs(a[i]) + std::fabs(b[i]));
    }
    std::string tag = "moe_shared_add rows " + std::to_string(rows) + " width " + std::to_string(width);
    check(ok, tag);
    if (ok) printf("ok   %s\n", tag.c_str());
}

int main() {
    test_shared_add(3, 100);
    test_route(3, 128, 8, MOE_ROUTE_SOFTMAX_TOPK, true, false);
    test_route(2, 128, 8, MOE_ROUTE_SOFTMAX_TOPK, false, false);
    test_route(2, 32, 4, MOE_ROUTE_TOPK_SOFTMAX, false, false);
    test_route(2, 40, 6, MOE_ROUTE_TOPK_SOFTMAX, false, true);
    test_route(2, 512, 10, MOE_ROUTE_SOFTMAX_TOPK, true, true);
    test_route(3, 32, 4, MOE_ROUTE_TOPK_SOFTMAX, false, false, true);
    test_route(2, 128, 8, MOE_ROUTE_SOFTMAX_TOPK, true, false, true);
    test_route_special();
    // The router's product with the top-k: Qwen3-MoE's shape (128 experts, top 8, renormalized)
    // and gpt-oss's (32, top 4, biased, top-k-softmax), each weight dtype, expert counts that
    // leave a block part-filled, x longer than a pass of a warp's loads, a pending norm.
    test_route_dense(1, 128, 256, DT_F32, 8, MOE_ROUTE_SOFTMAX_TOPK, true, false, false);
    test_route_dense(1, 128, 256, DT_BF16, 8, MOE_ROUTE_SOFTMAX_TOPK, true, false, true);
    test_route_dense(3, 32, 1056, DT_F32, 4, MOE_ROUTE_TOPK_SOFTMAX, false, true, false);
    test_route_dense(2, 30, 136, DT_F16, 6, MOE_ROUTE_SOFTMAX_TOPK, false, true, false);
    test_route_dense(1, 61, 4608, DT_F32, 8, MOE_ROUTE_SOFTMAX_TOPK, true, false, true);
    test_experts("b4", 64, DT_BF16, false, MOE_ACT_SILU, 2, false, 128);
    test_experts("b4", 16, DT_F16, true, MOE_ACT_SWIGLU_OAI, 1);
    test_experts("b3", 32, DT_F32, false, MOE_ACT_SILU, 1);
    test_experts("b8", 32, DT_BF16, true, MOE_ACT_SILU, 2);
    test_experts("dense", 32, DT_BF16, false, MOE_ACT_SILU, 1);
    test_experts("dense", 32, DT_F32, true, MOE_ACT_SWIGLU_OAI, 1);
    test_experts("mxfp4", 32, 0, true, MOE_ACT_SWIGLU_OAI, 2);
    test_experts("nvfp4", 16, 0, false, MOE_ACT_SILU, 1);
    test_experts("mxfp8", 32, 0, false, MOE_ACT_SILU, 1);
    test_experts("b4", 32, DT_BF16, false, MOE_ACT_GELU_APPROX, 2, true);
    test_experts("dense", 32, DT_BF16, true, MOE_ACT_GELU_APPROX, 1, true);
    // Rows of more chunks than a warp's lanes (gate_up) and more (slot, chunk) pairs than a block's
    // threads (down), as a real model's.
    test_experts("b4", 64, DT_BF16, true, MOE_ACT_SILU, 2, false, 1088, 2112);
    test_experts("mxfp4", 32, 0, true, MOE_ACT_SWIGLU_OAI, 1, true, 1088, 2080);
    test_experts("b8", 64, DT_BF16, false, MOE_ACT_SILU, 1, false, 1088, 2112);
    test_grouped("b4", 64, 6, 192, 128, false, MOE_ACT_SILU, 80, true, false);
    test_grouped("b4", 32, 12, 160, 96, true, MOE_ACT_SWIGLU_OAI, 5, false, false);
    test_grouped("b8", 32, 6, 160, 96, true, MOE_ACT_GELU_APPROX, 40, false, true);
    test_grouped("mxfp4", 32, 6, 160, 96, true, MOE_ACT_SWIGLU_OAI, 80, true, false);
    // Scales as a GGUF's are stored (f32 Q4_0 / Q8_0 offsets, f16 Q4_1 ones): the s kernels.
    test_grouped("b4", 32, 6, 192, 128, false, MOE_ACT_SILU, 80, true, false, DT_F32);
    test_grouped("b8", 32, 6, 160, 96, true, MOE_ACT_SILU, 40, false, false, DT_F32);
    test_grouped("b4", 64, 6, 192, 128, false, MOE_ACT_SILU, 40, false, false, DT_F16);
    // 4-bit experts in groups of 32 and more on integer dot products, every scale dtype, one row
    // and several, bias rows, a norm's pending scale, rows longer than a warp's chunks.
    test_experts("b4", 64, DT_BF16, false, MOE_ACT_SILU, 1, false, 128, 64, Path::Integer);
    test_experts("b4", 32, DT_F16, true, MOE_ACT_SILU, 3, true, 96, 64, Path::Integer);
    test_experts("b4", 32, DT_F32, true, MOE_ACT_SWIGLU_OAI, 2, false, 96, 64, Path::Integer);
    test_experts("b4", 64, DT_F16, false, MOE_ACT_SILU, 1, false, 128, 64, Path::IntegerPending);
    test_experts("b4", 32, DT_F16, true, MOE_ACT_SILU, 2, false, 1088, 2080, Path::Integer);
    test_experts("b4", 64, DT_BF16, false, MOE_ACT_SILU, 1, false, 1152, 2048, Path::IntegerPending);
    test_experts("mxfp4", 32, 0, true, MOE_ACT_SWIGLU_OAI, 1, true, 96, 64, Path::Integer);
    test_experts("mxfp4", 32, 0, false, MOE_ACT_SILU, 3, false, 128, 96, Path::Integer);
    test_experts("mxfp4", 32, 0, true, MOE_ACT_SWIGLU_OAI, 1, false, 96, 64, Path::IntegerPending);
    test_experts("mxfp4", 32, 0, true, MOE_ACT_SWIGLU_OAI, 2, true, 1088, 2080, Path::Integer);
    printf(fails ? "moe: %d FAILED\n" : "moe: all passed\n", fails);
    return fails ? 1 : 0;
}
