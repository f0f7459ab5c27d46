// Helpers shared by the CPU backend's op tests (tests/unit/backend/test_cpu_*.c): the backend under test,
// float/double conversion, and central finite differences of double-precision reference ops.
#ifndef KILN_TESTS_CPU_COMMON_H
#define KILN_TESTS_CPU_COMMON_H

#include "test_util.h"

#include "core/backend.h"

static struct kiln_backend g_be; // opened by the group setup
static uint64_t g_rng;

static inline int cpu_group_setup(void **state) {
    struct kiln_backend_opts opts = {0};
    struct kiln_error err;
    if (kiln_cpu_backend_open(&opts, &g_be, &err) != 0) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return -1;
    }
    g_rng = test_seed();
    return 0;
}

static inline int cpu_group_teardown(void **state) {
    kiln_backend_close(&g_be);
    return 0;
}

static inline float *falloc(size_t n) { // backend memory (host on the CPU)
    float *p = g_be.ops->alloc(g_be.ctx, n * sizeof(float));
    assert_non_null(p);
    return p;
}
static inline void ffree(void *p) {
    g_be.ops->free(g_be.ctx, p);
}
static inline float *frand(size_t n, float stddev) {
    float *p = falloc(n);
    test_fill_normal(p, n, stddev, &g_rng);
    return p;
}
static inline double *d_of(const float *x, size_t n) { // a double copy
    double *d = malloc(n * sizeof(double) + 8);
    assert_non_null(d);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}
static inline double dot_r(const double *y, const float *R, size_t n) { // L = sum(y * R)
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += y[i] * R[i];
    return s;
}

// Central differences: g[i] = (L(x + h e_i) - L(x - h e_i)) / 2h, where loss(st) reads x through st.
typedef double (*loss_fn)(void *st);
static inline void numgrad(loss_fn loss, void *st, double *x, size_t n, double h, double *g) {
    for (size_t i = 0; i < n; i++) {
        double xi = x[i];
        x[i] = xi + h;
        double lp = loss(st);
        x[i] = xi - h;
        double lm = loss(st);
        x[i] = xi;
        g[i] = (lp - lm) / (2 * h);
    }
}

// rel_err(got, ref in double) <= tol
static inline void check_vs_double(const float *got, const double *ref, size_t n, double tol,
                                   const char *what) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            fail_msg("%s: element %zu is not finite", what, i);
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    if (!(e <= tol))
        fail_msg("%s: relative error %.3e > tolerance %.1e", what, e, tol);
}

#endif
