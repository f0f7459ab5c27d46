// CPU backend: cross-entropy over the real vocab of padded logits, with z-loss, fused with its backward.
#include "backend/cpu/cpu_internal.h"
#include "util/error.h"

#include <math.h>
#include <stddef.h>

// losses[i] = lse_i - logits[i, target] + z_loss * lse_i^2, lse_i = logsumexp(logits[i, :V]).
// With dloss != 0: dlogits[i, j] = dloss * (p_j * (1 + 2 z_loss lse_i) - [j == target]) for j < V, else 0.
void kiln_cpu_cross_entropy(void *ctx, const struct kiln_xent_args *a) {
    int N = a->N, V = a->V, Vp = a->Vp;
    float *logits = a->logits;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)N * Vp))
    for (int i = 0; i < N; i++) {
        float *row = logits + (size_t)i * Vp;
        int target = a->targets[i];
        KILN_ASSERT(target < V);
        if (target < 0) {
            a->losses[i] = 0.0f;
            if (a->dloss != 0.0f)
                for (int j = 0; j < Vp; j++)
                    row[j] = 0.0f;
            continue;
        }
        float maxv = -INFINITY;
        for (int j = 0; j < V; j++)
            maxv = row[j] > maxv ? row[j] : maxv;
        double sum = 0;
        for (int j = 0; j < V; j++)
            sum += exp((double)row[j] - maxv);
        double lse = maxv + log(sum);
        a->losses[i] = (float)(lse - row[target] + a->z_loss * lse * lse);
        if (a->dloss != 0.0f) {
            double scale = 1.0 + 2.0 * a->z_loss * lse;
            for (int j = 0; j < V; j++) {
                double p = exp((double)row[j] - lse);
                row[j] = (float)(a->dloss * (p * scale - (j == target ? 1.0 : 0.0)));
            }
            for (int j = V; j < Vp; j++)
                row[j] = 0.0f;
        }
    }
}

// The vocabulary-parallel loss's phases (ops.h: struct kiln_xent_par_args), with cross_entropy's formulas over
// this rank's columns [v0, v0 + Vl): real columns are those below V.
void kiln_cpu_cross_entropy_parallel(void *ctx, const struct kiln_xent_par_args *a) {
    int N = a->N, Vl = a->Vl, nreal = a->V - a->v0;
    nreal = nreal < 0 ? 0 : nreal > Vl ? Vl : nreal;
    float *logits = a->logits, *mx = a->stats, *sum = a->stats + N, *tl = a->stats + 2 * (size_t)N;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)N * Vl))
    for (int i = 0; i < N; i++) {
        float *row = logits + (size_t)i * Vl;
        int target = a->targets[i], tj = target - a->v0;
        if (a->phase == 0) {
            float m = -INFINITY;
            for (int j = 0; j < nreal; j++)
                m = row[j] > m ? row[j] : m;
            mx[i] = m;
            tl[i] = target >= 0 && tj >= 0 && tj < nreal ? row[tj] : 0.0f;
        } else if (a->phase == 1) {
            double s = 0;
            for (int j = 0; j < nreal; j++)
                s += exp((double)row[j] - mx[i]);
            sum[i] = (float)s;
        } else {
            double lse = mx[i] + log((double)sum[i]);
            a->losses[i] = target < 0 ? 0.0f : (float)(lse - tl[i] + a->z_loss * lse * lse);
            if (a->dloss == 0.0f)
                continue;
            double scale = 1.0 + 2.0 * a->z_loss * lse;
            for (int j = 0; j < Vl; j++) {
                double p = j < nreal ? exp((double)row[j] - lse) : 0.0;
                row[j] = target < 0 || j >= nreal ? 0.0f : (float)(a->dloss * (p * scale - (j == tj ? 1.0 : 0.0)));
            }
        }
    }
}
