// AdamW on the host: the CPU backend's optimizer, and the offloaded optimizer of any backend. See ops.h.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core/ops.h"

// f32 -> bf16, rounding to nearest even (NaN stays NaN); branch-free, so that the loops below vectorize
static inline uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

static inline float f32_of(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

// PyTorch's AdamW (torch.optim.AdamW, foreach=False), per element of each span:
//   g = grad * grad_scale;  p *= 1 - lr * wd (decay spans only)
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g^2
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
struct adam_consts {
    float b2, omb1, omb2, step_size, bc2_sqrt, eps, scale, decay;
};

// One span's elements, a function for each combination of operand dtypes (G: the gradient's load, W: the
// weight's store), so that each loop is branch-free and vectorizes (OpenMP outlines the loop body, so the
// dtypes must be fixed in the source, not passed in). Every element's arithmetic is the same whatever the
// dtypes and the thread count.
#define SPAN_UPDATE(NAME, GT, G, WT, W)                                                                      \
    static void NAME(const GT *g_, float *p, float *m, float *v, WT *w_, long long n, const struct adam_consts *k, \
                     int nt) {                                                                               \
        const float b2 = k->b2, omb1 = k->omb1, omb2 = k->omb2, ss = k->step_size, bc = k->bc2_sqrt,          \
                    eps = k->eps, sc = k->scale, dc = k->decay;                                              \
        (void)w_;                                                                                            \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if (n >= 65536)")                       \
        for (long long b = 0; b < n; b += 4096) {                                                           \
            long long e = b + 4096 < n ? b + 4096 : n;                                                       \
            for (long long i = b; i < e; i++) {                                                              \
                float g = (G) * sc;                                                                          \
                float mi = m[i] + omb1 * (g - m[i]);                                                         \
                float vi = b2 * v[i] + omb2 * g * g;                                                         \
                float pi = p[i] * dc;                                                                        \
                pi -= ss * mi / (sqrtf(vi) / bc + eps);                                                      \
                m[i] = mi;                                                                                   \
                v[i] = vi;                                                                                   \
                p[i] = pi;                                                                                   \
                W;                                                                                           \
            }                                                                                                \
        }                                                                                                    \
    }
SPAN_UPDATE(span_f32_none, float, g_[i], float, (void)0)
SPAN_UPDATE(span_f32_f32, float, g_[i], float, w_[i] = pi)
SPAN_UPDATE(span_f32_bf16, float, g_[i], uint16_t, w_[i] = bf16_of(pi))
SPAN_UPDATE(span_bf16_none, uint16_t, f32_of(g_[i]), float, (void)0)
SPAN_UPDATE(span_bf16_f32, uint16_t, f32_of(g_[i]), float, w_[i] = pi)
SPAN_UPDATE(span_bf16_bf16, uint16_t, f32_of(g_[i]), uint16_t, w_[i] = bf16_of(pi))

void kiln_adamw_host(const struct kiln_adamw_args *a, enum kiln_dtype grads_dtype, enum kiln_dtype weights_dtype,
                     size_t stage_offset, int threads) {
    double bc1 = 1.0 - pow(a->beta1, a->step), bc2 = 1.0 - pow(a->beta2, a->step);
    float step_size = (float)(a->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    // a staging buffer holds the compact gradients and weights from state offset stage_offset on
    const float *g32 = grads_dtype == KILN_F32 ? (const float *)a->grads - stage_offset : NULL;
    const uint16_t *g16 = grads_dtype == KILN_BF16 ? (const uint16_t *)a->grads - stage_offset : NULL;
    float *w32 = weights_dtype == KILN_F32 && a->weights ? (float *)a->weights - stage_offset : NULL;
    uint16_t *w16 = weights_dtype == KILN_BF16 && a->weights ? (uint16_t *)a->weights - stage_offset : NULL;
    int nt = threads > 0 ? threads : omp_get_max_threads();
    int gk = g32 ? 0 : 1, wk = w32 ? 1 : w16 ? 2 : 0;
    for (int s = 0; s < a->n_spans; s++) {
        size_t off = a->spans[s].offset, soff = a->spans[s].state_offset;
        size_t pi = a->params_compact ? soff : off, gi = a->grads_compact ? soff : off;
        struct adam_consts k = {.b2 = a->beta2,
                                .omb1 = 1.0f - a->beta1,
                                .omb2 = 1.0f - a->beta2,
                                .step_size = step_size,
                                .bc2_sqrt = bc2_sqrt,
                                .eps = a->eps,
                                .scale = a->grad_scale,
                                .decay = a->spans[s].decay ? 1.0f - a->lr * a->weight_decay : 1.0f};
        const void *g = gk ? (const void *)(g16 + gi) : (const void *)(g32 + gi);
        void *w = wk == 1 ? (void *)(w32 + pi) : wk == 2 ? (void *)(w16 + pi) : NULL;
        float *p = a->params + pi, *m = a->m + soff, *v = a->v + soff;
        long long n = (long long)a->spans[s].count;
        if (gk == 0 && wk == 0)
            span_f32_none(g, p, m, v, w, n, &k, nt);
        else if (gk == 0 && wk == 1)
            span_f32_f32(g, p, m, v, w, n, &k, nt);
        else if (gk == 0 && wk == 2)
            span_f32_bf16(g, p, m, v, w, n, &k, nt);
        else if (wk == 0)
            span_bf16_none(g, p, m, v, w, n, &k, nt);
        else if (wk == 1)
            span_bf16_f32(g, p, m, v, w, n, &k, nt);
        else
            span_bf16_bf16(g, p, m, v, w, n, &k, nt);
    }
}
