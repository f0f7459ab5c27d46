// CPU backend: LayerNorm and RMSNorm, with the optional fused residual add.
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stddef.h>

// x = inp (+ res_in -> res_out); out = (x - mean) * rstd * weight + bias   (LayerNorm)
//                                 out = x * rstd * weight                   (RMSNorm)
void kiln_cpu_norm_forward(void *ctx, const struct kiln_norm_args *a) {
    int N = a->N, C = a->C;
    size_t ld = a->stride ? (size_t)a->stride : (size_t)C; // row stride
    const float *inp = a->inp, *res_in = a->res_in, *w = a->weight, *bias = a->bias;
    float *out = a->out, *res_out = a->res_out;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)N * C))
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * ld;
        if (res_in) { // res_out may alias inp or res_in: each element is read before it is written
            float *r = res_out + (size_t)n * ld;
            const float *ri = res_in + (size_t)n * ld;
            for (int i = 0; i < C; i++)
                r[i] = x[i] + ri[i];
            x = r;
        }
        float mean = 0.0f;
        if (!a->rms) {
            double s = 0;
            for (int i = 0; i < C; i++)
                s += x[i];
            mean = (float)(s / C);
        }
        double v = 0;
        for (int i = 0; i < C; i++) {
            double d = (double)x[i] - mean;
            v += d * d;
        }
        float rstd = (float)(1.0 / sqrt(v / C + a->eps));
        float *o = out + (size_t)n * ld;
        for (int i = 0; i < C; i++) {
            float y = (x[i] - mean) * rstd * w[i];
            o[i] = bias && !a->rms ? y + bias[i] : y;
        }
        if (a->mean)
            a->mean[n] = mean;
        a->rstd[n] = rstd;
    }
}

// With xhat = (x - mean) * rstd and g = dout * weight (per row):
//   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))
//   dweight += sum over rows of dout * xhat;  dbias += sum over rows of dout;
//   dres_bias[k] += sum over rows of dinp as this op leaves it.
void kiln_cpu_norm_backward(void *ctx, const struct kiln_norm_back_args *a) {
    int N = a->N, C = a->C, nt = kiln_cpu_threads(ctx);
    size_t ld = a->stride ? (size_t)a->stride : (size_t)C; // row stride
    const float *dout = a->dout, *inp = a->inp, *w = a->weight;
    float *dinp = a->dinp;
    // dinp: one row per thread
#pragma omp parallel for num_threads(nt) schedule(static) if (KILN_CPU_PAR((double)N * C))
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * ld, *dy = dout + (size_t)n * ld;
        float mean = a->rms ? 0.0f : a->mean[n], rstd = a->rstd[n];
        double g_mean = 0, gx_mean = 0;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - mean) * rstd;
            float g = dy[i] * w[i];
            g_mean += g;
            gx_mean += (double)g * xhat;
        }
        g_mean = a->rms ? 0.0 : g_mean / C;
        gx_mean /= C;
        float gm = (float)g_mean, gxm = (float)gx_mean;
        float *dx = dinp + (size_t)n * ld;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - mean) * rstd;
            float g = dy[i] * w[i];
            float d = rstd * (g - gm - xhat * gxm);
            dx[i] = a->dinp_assign ? d : dx[i] + d;
        }
    }
    // dweight, dbias: each thread owns a block of columns and sums the rows in order
    float *dw = a->dweight, *db = a->dbias;
    int n_blocks = (C + 63) / 64;
#pragma omp parallel for num_threads(nt) schedule(static) if (KILN_CPU_PAR((double)N * C))
    for (int bk = 0; bk < n_blocks; bk++) {
        int c0 = bk * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        float sw[64] = {0}, sb[64] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * ld, *dy = dout + (size_t)n * ld;
            float mean = a->rms ? 0.0f : a->mean[n], rstd = a->rstd[n];
            for (int i = c0; i < c1; i++) {
                sw[i - c0] += dy[i] * ((x[i] - mean) * rstd);
                sb[i - c0] += dy[i];
            }
        }
        for (int i = c0; i < c1; i++) {
            dw[i] = a->grad_assign ? sw[i - c0] : dw[i] + sw[i - c0];
            if (db)
                db[i] = a->grad_assign ? sb[i - c0] : db[i] + sb[i - c0];
        }
    }
    if (!a->dres_bias[0] && !a->dres_bias[1])
        return;
    // the residual-stream biases: column sums of the finished dinp, rows in order (as a matmul's dbias)
#pragma omp parallel for num_threads(nt) schedule(static) if (KILN_CPU_PAR((double)N * C))
    for (int bk = 0; bk < n_blocks; bk++) {
        int c0 = bk * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        float sum[64] = {0};
        for (int n = 0; n < N; n++)
            for (int i = c0; i < c1; i++)
                sum[i - c0] += dinp[(size_t)n * ld + i];
        for (int k = 0; k < 2; k++) {
            float *rb = a->dres_bias[k];
            for (int i = c0; i < c1 && rb; i++)
                rb[i] = a->grad_assign ? sum[i - c0] : rb[i] + sum[i - c0];
        }
    }
}
