// Shared helpers for kiln's cmocka tests: fresh random inputs, error metrics, temp dirs.
#ifndef KILN_TESTS_TEST_UTIL_H
#define KILN_TESTS_TEST_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

// A per-run seed: tests draw fresh random inputs every run (printed, so a failure can be replayed with
// KILN_TEST_SEED=N).
static inline uint64_t test_seed(void) {
    static uint64_t seed = 0;
    if (!seed) {
        const char *s = getenv("KILN_TEST_SEED");
        seed = s ? strtoull(s, NULL, 10) : ((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20));
        if (!seed)
            seed = 1;
        fprintf(stderr, "[test] KILN_TEST_SEED=%llu\n", (unsigned long long)seed);
    }
    return seed;
}

// xorshift64* on a caller-held state
static inline uint64_t test_rand_u64(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}
static inline float test_rand_uniform(uint64_t *s) { // [0, 1)
    return (float)((test_rand_u64(s) >> 40) * (1.0 / 16777216.0));
}
static inline void test_fill_uniform(float *x, size_t n, float lo, float hi, uint64_t *s) {
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * test_rand_uniform(s);
}
static inline void test_fill_normal(float *x, size_t n, float stddev, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        float u1 = test_rand_uniform(s) + 1e-7f, u2 = test_rand_uniform(s);
        x[i] = stddev * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
    }
}

// ||a - b|| / ||b|| in double; NaN anywhere gives +inf.
static inline double test_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

// Asserts rel_err(a, b) <= tol, printing the value and what was compared on failure.
#define assert_rel_err_le(a, b, n, tol, what)                                                               \
    do {                                                                                                   \
        double _e = test_rel_err((a), (b), (n));                                                           \
        if (!(_e <= (tol)))                                                                                \
            fail_msg("%s: relative error %.3e > tolerance %.1e", (what), _e, (double)(tol));               \
    } while (0)

// A fresh temporary directory (mkdtemp); the caller removes it with test_rmrf.
static inline void test_tmpdir(char *out, size_t cap) {
    snprintf(out, cap, "/tmp/kiln_test_XXXXXX");
    if (!mkdtemp(out))
        fail_msg("mkdtemp failed");
}
static inline void test_rmrf(const char *path) {
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "[test] could not remove %s\n", path);
}

// The source tree (for data files), from the environment ctest sets, or the compile-time default.
static inline const char *test_source_dir(void) {
    const char *s = getenv("KILN_SOURCE_DIR");
    return s ? s : KILN_SOURCE_DIR;
}

#endif
