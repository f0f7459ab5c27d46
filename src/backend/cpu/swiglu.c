// CPU backend: SwiGLU and the elementwise add.
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stddef.h>

// out = silu(gate) * up, inp rows = [gate (H) | up (H)], inp_stride apart
void kiln_cpu_swiglu_forward(void *ctx, const struct kiln_swiglu_args *a) {
    int N = a->N, H = a->H, ld = a->inp_stride ? a->inp_stride : 2 * H;
    const float *inp = a->inp;
    float *out = a->out;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)N * H))
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * ld, *u = g + H;
        float *o = out + (size_t)n * H;
        for (int i = 0; i < H; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

// dgate = dout * up * sig(g) * (1 + g * (1 - sig(g)));  dup = dout * silu(g)
void kiln_cpu_swiglu_backward(void *ctx, const struct kiln_swiglu_back_args *a) {
    int N = a->N, H = a->H;
    int ldi = a->inp_stride ? a->inp_stride : 2 * H, ldd = a->dinp_stride ? a->dinp_stride : 2 * H;
    const float *inp = a->inp, *dout = a->dout;
    float *dinp = a->dinp;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)N * H))
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * ldi, *u = g + H, *dy = dout + (size_t)n * H;
        float *dg = dinp + (size_t)n * ldd, *du = dg + H;
        for (int i = 0; i < H; i++) {
            float sig = 1.0f / (1.0f + expf(-g[i]));
            dg[i] = dy[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
            du[i] = dy[i] * g[i] * sig;
        }
    }
}

void kiln_cpu_add(void *ctx, void *out, const void *a, const void *b, size_t n) {
    const float *x = a, *y = b;
    float *o = out;
    long long nn = (long long)n;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR(nn))
    for (long long i = 0; i < nn; i++)
        o[i] = x[i] + y[i];
}
