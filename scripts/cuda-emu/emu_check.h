// The checks the emulator programs (harness.cpp, qgemv.cpp, rows.cpp) share: a failure count and
// a comparison of kernel output with a reference in f64, relative to |want| + mean|want|.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

static int fails = 0;

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
