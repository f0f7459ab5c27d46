// CPU backend: the optimizer ops (AdamW, gradient sum of squares).
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stddef.h>

// kiln_adamw_host (core/adamw_host.c), shared with the offloaded optimizer of every backend: the same code,
// so that offload gives bitwise the same weights here.
void kiln_cpu_adamw(void *ctx, const struct kiln_adamw_args *a) {
    kiln_adamw_host(a, KILN_F32, KILN_F32, 0, kiln_cpu_threads(ctx));
}

void kiln_cpu_accumulate_f32(void *ctx, float *out, const float *x, size_t n) {
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((long long)n))
    for (long long i = 0; i < (long long)n; i++)
        out[i] += x[i];
}

// Sum of squares in double over fixed 64K-element chunks, added in chunk order: the result does not depend on
// the thread count. A NaN or Inf element makes the result NaN or Inf.
#define SUMSQ_CHUNK 65536

double kiln_cpu_sum_squares(void *ctx, const void *grads, size_t n) {
    const float *g = grads;
    long long n_chunks = (long long)((n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK);
    if (n_chunks == 0)
        return 0.0;
    double partial_stack[64];
    double *partial = n_chunks <= 64 ? partial_stack : kiln_cpu_alloc(ctx, (size_t)n_chunks * sizeof(double));
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (n_chunks > 1)
    for (long long c = 0; c < n_chunks; c++) {
        size_t i0 = (size_t)c * SUMSQ_CHUNK, i1 = i0 + SUMSQ_CHUNK < n ? i0 + SUMSQ_CHUNK : n;
        double s = 0;
        for (size_t i = i0; i < i1; i++)
            s += (double)g[i] * g[i];
        partial[c] = s;
    }
    double total = 0;
    for (long long c = 0; c < n_chunks; c++)
        total += partial[c];
    if (partial != partial_stack)
        kiln_cpu_free(ctx, partial);
    return total;
}
