// Benchmark of the CPU backend's matmul (the blocked, packed fp32 GEMM) at GPT-2 124M shapes.
// Prints GFLOP/s for the forward product (inp @ W^T), the two backward products (dinp = dout @ W and
// dweight += dout^T @ inp) and a naive triple loop for comparison.
// Usage: cpu_matmul [N=256] [threads=0 (all)] [reps=5]
#include "core/backend.h"
#include "backend/cpu/cpu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fill(float *x, size_t n, unsigned *seed) {
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        x[i] = (float)((*seed >> 8) * (1.0 / 16777216.0)) - 0.5f;
    }
}

// out (N, OC) = inp (N, IC) @ weight (OC, IC)^T, the textbook way
static void naive_forward(float *out, const float *inp, const float *weight, int N, int IC, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float s = 0.0f;
            for (int i = 0; i < IC; i++)
                s += inp[(size_t)n * IC + i] * weight[(size_t)o * IC + i];
            out[(size_t)n * OC + o] = s;
        }
}

int main(int argc, char **argv) {
    int N = argc > 1 ? atoi(argv[1]) : 256;
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    struct kiln_backend_opts opts = {.threads = threads};
    struct kiln_backend be;
    struct kiln_error err;
    if (kiln_cpu_backend_open(&opts, &be, &err) != 0)
        return kiln_error_print(&err);
    const struct kiln_ops *ops = be.ops;
    static const int shapes[][2] = {{768, 2304}, {768, 3072}, {3072, 768}, {768, 50304}}; // (IC, OC)
    printf("kiln cpu matmul, %s, N = %d, %d reps (GFLOP/s)\n", be.device_name, N, reps);
    printf("%-22s %9s %9s %9s %9s\n", "(N,IC)x(IC,OC)", "forward", "dinp", "dweight", "naive");
    double total_flops = 0, total_s = 0;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int IC = shapes[si][0], OC = shapes[si][1];
        unsigned seed = 1234u + (unsigned)si;
        float *inp = ops->alloc(be.ctx, (size_t)N * IC * 4), *w = ops->alloc(be.ctx, (size_t)OC * IC * 4);
        float *out = ops->alloc(be.ctx, (size_t)N * OC * 4), *dw = ops->alloc(be.ctx, (size_t)OC * IC * 4);
        float *dinp = ops->alloc(be.ctx, (size_t)N * IC * 4);
        if (!inp || !w || !out || !dw || !dinp) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        fill(inp, (size_t)N * IC, &seed);
        fill(w, (size_t)OC * IC, &seed);
        fill(out, (size_t)N * OC, &seed);
        double flops = 2.0 * N * IC * OC, t_fwd = 1e30, t_dinp = 1e30, t_dw = 1e30;
        struct kiln_matmul_args fa = {.out = out, .inp = inp, .weight = w, .N = N, .IC = IC, .OC = OC};
        struct kiln_cpu_gemm gd = {
            .M = N, .N = IC, .K = OC, .A = out, .lda = OC, .B = w, .ldb = IC, .C = dinp, .ldc = IC};
        struct kiln_matmul_back_args ba = {
            .dweight = dw, .dout = out, .inp = inp, .weight = w, .N = N, .IC = IC, .OC = OC};
        for (int r = 0; r < reps + 1; r++) { // the first round warms up; the best of the rest counts
            double t0 = now_s();
            kiln_cpu_gemm(be.ctx, &gd); // dout @ W, exactly as matmul_backward calls it
            double t1 = now_s();
            ops->matmul_backward(be.ctx, &ba); // dweight only (dinp = NULL)
            double t2 = now_s();
            ops->matmul_forward(be.ctx, &fa);
            double t3 = now_s();
            if (r > 0) {
                t_dinp = t1 - t0 < t_dinp ? t1 - t0 : t_dinp;
                t_dw = t2 - t1 < t_dw ? t2 - t1 : t_dw;
                t_fwd = t3 - t2 < t_fwd ? t3 - t2 : t_fwd;
            }
        }
        total_flops += 3 * flops;
        total_s += t_fwd + t_dinp + t_dw;
        char naive[32] = "-";
        if (OC * (double)IC <= 3072.0 * 768) { // the vocab shape would take half a minute
            double t0 = now_s();
            naive_forward(out, inp, w, N, IC, OC);
            snprintf(naive, sizeof(naive), "%.1f", flops / (now_s() - t0) * 1e-9);
        }
        char name[64];
        snprintf(name, sizeof(name), "(%d,%d)x(%d,%d)", N, IC, IC, OC);
        printf("%-22s %9.1f %9.1f %9.1f %9s\n", name, flops / t_fwd * 1e-9, flops / t_dinp * 1e-9,
               flops / t_dw * 1e-9, naive);
        ops->free(be.ctx, inp);
        ops->free(be.ctx, w);
        ops->free(be.ctx, out);
        ops->free(be.ctx, dw);
        ops->free(be.ctx, dinp);
    }
    printf("overall (all products, all shapes): %.1f GFLOP/s\n", total_flops / total_s * 1e-9);
    kiln_backend_close(&be);
    return 0;
}
