// AdamW on the host: the CPU backend's optimizer, and the offloaded optimizer of any backend. See ops.h.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "model/ops.h"

// f32 -> bf16, rounding to nearest even (NaN stays NaN)
static inline uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu))
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
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
    for (int s = 0; s < a->n_spans; s++) {
        size_t off = a->spans[s].offset, soff = a->spans[s].state_offset;
        long long count = (long long)a->spans[s].count;
        float decay = a->spans[s].decay ? 1.0f - a->lr * a->weight_decay : 1.0f;
#pragma omp parallel for num_threads(nt) schedule(static) if (count >= 65536)
        for (long long k = 0; k < count; k++) {
            size_t i = off + (size_t)k, si = soff + (size_t)k, pi = a->params_compact ? si : i;
            size_t gi = a->grads_compact ? si : i;
            float g = (g32 ? g32[gi] : f32_of(g16[gi])) * a->grad_scale;
            float m = a->m[si] + (1.0f - a->beta1) * (g - a->m[si]);
            float v = a->beta2 * a->v[si] + (1.0f - a->beta2) * g * g;
            float p = a->params[pi] * decay;
            p -= step_size * m / (sqrtf(v) / bc2_sqrt + a->eps);
            a->m[si] = m;
            a->v[si] = v;
            a->params[pi] = p;
            if (w32)
                w32[a->params_compact ? si : i] = p;
            else if (w16)
                w16[a->params_compact ? si : i] = bf16_of(p);
        }
    }
}
