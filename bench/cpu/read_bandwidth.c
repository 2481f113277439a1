// Streaming read bandwidth of this machine: THREADS threads each sum a disjoint share of a
// buffer of MIB mebibytes, ten passes per trial; prints the best trial's GB/s (bytes read per
// second, 1e9). The ceiling a memory-bound decode step reads its weights at (bench/compare-cpu).
//
//   cc -O3 -march=native -pthread read_bandwidth.c -o read_bandwidth && ./read_bandwidth 512 2
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t *buf;
static size_t words;
static int threads;
static volatile uint64_t sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *work(void *arg) {
    size_t id = (size_t)arg, per = words / threads;
    const uint64_t *p = buf + id * per;
    uint64_t a[8] = {0};
    for (int pass = 0; pass < 10; pass++)
        for (size_t i = 0; i + 8 <= per; i += 8)
            for (int j = 0; j < 8; j++) a[j] += p[i + j];
    sink = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MIB THREADS\n", argv[0]);
        return 2;
    }
    words = (size_t)atoi(argv[1]) * 1024 * 1024 / 8;
    threads = atoi(argv[2]);
    if (words == 0 || threads < 1 || threads > 256) return 2;
    buf = aligned_alloc(64, words * 8);
    for (size_t i = 0; i < words; i++) buf[i] = i;
    pthread_t th[256];
    double best = 0;
    for (int trial = 0; trial < 5; trial++) {
        double t0 = now();
        for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, work, (void *)(size_t)i);
        for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
        double gbs = 10.0 * (words / threads * threads) * 8 / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("%.2f\n", best);
    return 0;
}
