// CPU backend: the optimizer ops (AdamW, gradient sum of squares).
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stddef.h>

// PyTorch's AdamW (torch.optim.AdamW, foreach=False), per element of each span:
//   g = grad * grad_scale;  p *= 1 - lr * wd (decay spans only)
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g^2
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
void kiln_cpu_adamw(void *ctx, const struct kiln_adamw_args *a) {
    double bc1 = 1.0 - pow(a->beta1, a->step), bc2 = 1.0 - pow(a->beta2, a->step);
    float step_size = (float)(a->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float *grads = a->grads;
    float *weights = a->weights; // f32 on the CPU: a plain copy of the updated master weights
    for (int s = 0; s < a->n_spans; s++) {
        size_t off = a->spans[s].offset, soff = a->spans[s].state_offset;
        long long count = (long long)a->spans[s].count;
        float decay = a->spans[s].decay ? 1.0f - a->lr * a->weight_decay : 1.0f;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR(count))
        for (long long k = 0; k < count; k++) {
            size_t i = off + (size_t)k, si = soff + (size_t)k;
            float g = grads[a->grads_compact ? si : i] * a->grad_scale;
            float m = a->m[si] + (1.0f - a->beta1) * (g - a->m[si]);
            float v = a->beta2 * a->v[si] + (1.0f - a->beta2) * g * g;
            float p = a->params[i] * decay;
            p -= step_size * m / (sqrtf(v) / bc2_sqrt + a->eps);
            a->m[si] = m;
            a->v[si] = v;
            a->params[i] = p;
            if (weights)
                weights[i] = p;
        }
    }
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
