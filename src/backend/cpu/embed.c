// CPU backend: token (+ learned position) embedding.
#include "backend/cpu/cpu_internal.h"

#include <stddef.h>

// Row of column t in a position table given as two runs (ops.h: pos_split)
static const float *split_row(const void *lo, const void *hi, int split, int T, int t, int C) {
    if (split > 0 && split < T && t >= split)
        return (const float *)hi + (size_t)(t - split) * C;
    return (const float *)lo + (size_t)t * C;
}

// The row of wte that token tok reads, or -1 where a vocabulary-parallel wte does not hold it
static long vocab_row(int tok, int lo, int n) {
    if (n <= 0)
        return tok;
    return tok >= lo && tok < lo + n ? tok - lo : -1;
}

// out[b, t, :] = wte[tokens[b, t], :] (+ wpe[t, :], or wpe_hi[t - pos_split, :] from column pos_split on)
void kiln_cpu_embed_forward(void *ctx, const struct kiln_embed_args *a) {
    int BT = a->B * a->T, T = a->T, C = a->C;
    const float *wte = a->wte, *wpe = a->wpe;
    float *out = a->out;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)BT * C))
    for (int n = 0; n < BT; n++) {
        long row = vocab_row(a->tokens[n], a->vocab_lo, a->vocab_n);
        const float *e = row >= 0 ? wte + (size_t)row * C : NULL;
        float *o = out + (size_t)n * C;
        const float *p = wpe ? split_row(wpe, a->wpe_hi, a->pos_split, T, n % T, C) : NULL;
        for (int i = 0; i < C; i++)
            o[i] = (e ? e[i] : 0.0f) + (p ? p[i] : 0.0f);
    }
}

// dwte[tokens[n], :] += dout[n, :];  dwpe[t, :] += sum over b of dout[b, t, :].
// Deterministic without atomics: each thread owns a block of columns and walks all rows in order.
void kiln_cpu_embed_backward(void *ctx, const struct kiln_embed_back_args *a) {
    int BT = a->B * a->T, T = a->T, C = a->C;
    const float *dout = a->dout;
    float *dwte = a->dwte, *dwpe = a->dwpe;
    int n_blocks = (C + 63) / 64;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)BT * C))
    for (int bk = 0; bk < n_blocks; bk++) {
        int c0 = bk * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int n = 0; n < BT; n++) {
            const float *d = dout + (size_t)n * C;
            long row = vocab_row(a->tokens[n], a->vocab_lo, a->vocab_n);
            float *e = row >= 0 ? dwte + (size_t)row * C : NULL;
            for (int i = c0; e && i < c1; i++)
                e[i] += d[i];
            if (dwpe) {
                float *p = (float *)split_row(dwpe, a->dwpe_hi, a->pos_split, T, n % T, C);
                for (int i = c0; i < c1; i++)
                    p[i] += d[i];
            }
        }
    }
}
