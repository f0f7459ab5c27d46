// The CPU backend's ops (everything but attention, see test_cpu_attention.c) as specifications: forward
// results against direct double-precision computations, backward results against central finite differences
// of those double references (L = sum(out * R) for a random R), and bitwise determinism across thread counts.
#include <stddef.h>
#include "test_cpu_common.h"

#include "backend/cpu/cpu_internal.h"

#include <math.h>

// ---- the backend itself ----------------------------------------------------------------------------

static void test_open_fills_every_op_and_describes_the_cpu(void **state) {
    struct kiln_backend be;
    struct kiln_error err;
    struct kiln_backend_opts opts = {.threads = 2};
    assert_int_equal(kiln_cpu_backend_open(&opts, &be, &err), 0);
    assert_string_equal(be.name, "cpu");
    assert_string_equal(be.device_name, "CPU (2 threads)");
    assert_int_equal(be.act_dtype, KILN_F32);
    assert_int_equal(be.grad_dtype, KILN_F32);
    assert_int_equal(be.weights_alias_master, 1);
    assert_true(be.peak_flops == 0);
    void (*const *fn)(void) = (void (*const *)(void))be.ops; // every slot of the table is a function pointer
    // every op up to the events; those are NULL on the CPU, whose ops complete before they return
    for (size_t i = 0; i < offsetof(struct kiln_ops, event_create) / sizeof(void (*)(void)); i++)
        assert_non_null(fn[i]);
    assert_null(be.ops->event_create);
    assert_null(be.ops->native_stream);
    assert_int_equal(be.device_memory, 0);
    kiln_backend_close(&be);
    assert_null(be.ctx);
}

static void test_open_rejects_negative_threads(void **state) {
    struct kiln_backend be;
    struct kiln_error err;
    struct kiln_backend_opts opts = {.threads = -3};
    assert_int_equal(kiln_cpu_backend_open(&opts, &be, &err), KILN_ERR_USAGE);
    assert_string_equal(err.msg, "threads -3 (--threads): must be >= 0; 0 uses all cores");
}

static void test_dtype_sizes_and_names(void **state) {
    assert_int_equal(kiln_dtype_bytes(KILN_F32), 4);
    assert_int_equal(kiln_dtype_bytes(KILN_BF16), 2);
    assert_int_equal(kiln_dtype_bytes(KILN_I32), 4);
    assert_string_equal(kiln_dtype_name(KILN_F32), "f32");
    assert_string_equal(kiln_dtype_name(KILN_BF16), "bf16");
    assert_string_equal(kiln_dtype_name(KILN_I32), "i32");
}

static void test_alloc_is_zeroed_and_64_byte_aligned(void **state) {
    size_t sizes[] = {1, 3, 64, 1000, 1 << 20};
    for (size_t s = 0; s < 5; s++) {
        unsigned char *p = g_be.ops->alloc(g_be.ctx, sizes[s]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        for (size_t i = 0; i < sizes[s]; i++)
            assert_int_equal(p[i], 0);
        g_be.ops->free(g_be.ctx, p);
    }
    assert_null(g_be.ops->alloc(g_be.ctx, SIZE_MAX - 10)); // impossible request: NULL, not a crash
}

// mem_peak: the most bytes held at once in alloc'd blocks (sizes rounded up to 64), not the sum of all
static void test_mem_peak_counts_bytes_held_at_once(void **state) {
    struct kiln_backend be;
    struct kiln_error err;
    struct kiln_backend_opts opts = {.threads = 1};
    assert_int_equal(kiln_cpu_backend_open(&opts, &be, &err), 0);
    size_t base = be.ops->mem_peak(be.ctx);
    void *a = be.ops->alloc(be.ctx, 1000), *b = be.ops->alloc(be.ctx, 2000);
    assert_int_equal(be.ops->mem_peak(be.ctx), base + 1024 + 2048);
    be.ops->free(be.ctx, a);
    void *c = be.ops->alloc(be.ctx, 500);
    assert_int_equal(be.ops->mem_peak(be.ctx), base + 1024 + 2048); // 2048 + 512 held now: below the peak
    void *d = be.ops->alloc(be.ctx, 4096);
    assert_int_equal(be.ops->mem_peak(be.ctx), base + 2048 + 512 + 4096);
    be.ops->free(be.ctx, b);
    be.ops->free(be.ctx, c);
    be.ops->free(be.ctx, d);
    kiln_backend_close(&be);
}

static void test_upload_f32_to_bf16_rounds_to_nearest_even(void **state) {
    // bf16 keeps 7 mantissa bits: the spacing just above 1 is 2^-7.
    float in[] = {1.0f + 0x1p-8f,     // exactly half way between 1 and 1 + 2^-7: ties to even -> 1
                  1.0f + 3 * 0x1p-8f, // half way between 1 + 2^-7 (odd) and 1 + 2^-6 (even) -> 1 + 2^-6
                  1.0f + 0x1p-8f + 0x1p-20f,  // just above half way -> 1 + 2^-7
                  -2.0f - 0x1p-7f + 0x1p-18f, // below half an ulp (2^-6 at 2) away from -2 -> -2
                  NAN,
                  INFINITY};
    float expect[] = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -2.0f, NAN, INFINITY};
    uint16_t dev[6];
    float back[6];
    g_be.ops->upload_f32(g_be.ctx, dev, KILN_BF16, in, 6);
    g_be.ops->download_f32(g_be.ctx, back, dev, KILN_BF16, 6);
    for (int i = 0; i < 4; i++)
        assert_true(back[i] == expect[i]);
    assert_true(isnan(back[4]));
    assert_true(isinf(back[5]) && back[5] > 0);
    // random values: the round trip is within half an ulp (2^-8 relative) and f32 is an exact copy
    float x[1000], y[1000], z[1000];
    uint16_t h[1000];
    test_fill_normal(x, 1000, 10.0f, &g_rng);
    g_be.ops->upload_f32(g_be.ctx, h, KILN_BF16, x, 1000);
    g_be.ops->download_f32(g_be.ctx, y, h, KILN_BF16, 1000);
    g_be.ops->upload_f32(g_be.ctx, z, KILN_F32, x, 1000);
    for (int i = 0; i < 1000; i++) {
        assert_true(fabsf(y[i] - x[i]) <= 0x1p-8f * fabsf(x[i]));
        assert_true(z[i] == x[i]);
    }
}

// ---- matmul --------------------------------------------------------------------------------------------

static double gelu_d(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// out (N, OC) = inp @ W^T + b in double
static void matmul_ref(double *out, const double *inp, const double *w, const double *b, int N, int IC,
                       int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int i = 0; i < IC; i++)
                s += inp[(size_t)n * IC + i] * w[(size_t)o * IC + i];
            out[(size_t)n * OC + o] = s;
        }
}

// |got - ref| <= (terms + 2) * 2^-24 * mag elementwise, mag = sum of |terms| (the fp32 summation error bound)
static void check_within_sum_bound(const float *got, const double *ref, const double *mag, size_t n,
                                   int terms, const char *what) {
    for (size_t i = 0; i < n; i++) {
        double bound = (terms + 2) * 0x1p-24 * mag[i] + 1e-30;
        if (!(fabs(got[i] - ref[i]) <= bound))
            fail_msg("%s: element %zu is %.9g, reference %.9g (bound %.3g)", what, i, got[i], ref[i], bound);
    }
}

// All three products against a textbook loop, including the accumulate flags, at shapes that leave partial
// micro-tiles and cross the KC, MB and NC block edges.
static void check_matmul_vs_naive(int N, int IC, int OC, int with_bias, int accumulate) {
    float *inp = frand((size_t)N * IC, 1), *w = frand((size_t)OC * IC, 1),
          *b = with_bias ? frand(OC, 1) : NULL;
    float *out = frand((size_t)N * OC, 1), *dout = frand((size_t)N * OC, 1), *dinp = frand((size_t)N * IC, 1);
    float *dw = frand((size_t)OC * IC, 1), *db = frand(OC, 1);
    double *out0 = d_of(out, (size_t)N * OC), *dinp0 = d_of(dinp, (size_t)N * IC),
           *dw0 = d_of(dw, (size_t)OC * IC);
    double *db0 = d_of(db, OC);
    struct kiln_matmul_args fa = {
        .out = out, .inp = inp, .weight = w, .bias = b, .N = N, .IC = IC, .OC = OC, .accumulate = accumulate};
    g_be.ops->matmul_forward(g_be.ctx, &fa);
    struct kiln_matmul_back_args ba = {.dinp = dinp,
                                       .dweight = dw,
                                       .dbias = db,
                                       .dout = dout,
                                       .inp = inp,
                                       .weight = w,
                                       .N = N,
                                       .IC = IC,
                                       .OC = OC,
                                       .dinp_accumulate = accumulate};
    g_be.ops->matmul_backward(g_be.ctx, &ba);

    double *di = d_of(inp, (size_t)N * IC), *dwt = d_of(w, (size_t)OC * IC), *dbs = b ? d_of(b, OC) : NULL;
    double *ddo = d_of(dout, (size_t)N * OC);
    size_t n_all = (size_t)N * OC + (size_t)N * IC + (size_t)OC * IC + OC;
    double *ref = malloc(sizeof(double) * n_all),
           *mag = malloc(sizeof(double) * n_all); // values, sum of |terms|
    double *rout = ref, *rdinp = rout + (size_t)N * OC, *rdw = rdinp + (size_t)N * IC,
           *rdb = rdw + (size_t)OC * IC;
    double *mout = mag, *mdinp = mout + (size_t)N * OC, *mdw = mdinp + (size_t)N * IC,
           *mdb = mdw + (size_t)OC * IC;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s0 = accumulate ? out0[(size_t)n * OC + o] : 0.0, b0 = b ? dbs[o] : 0.0;
            double s = s0 + b0, m = fabs(s0) + fabs(b0);
            for (int i = 0; i < IC; i++) {
                s += di[(size_t)n * IC + i] * dwt[(size_t)o * IC + i];
                m += fabs(di[(size_t)n * IC + i] * dwt[(size_t)o * IC + i]);
            }
            rout[(size_t)n * OC + o] = s, mout[(size_t)n * OC + o] = m;
        }
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double s = accumulate ? dinp0[(size_t)n * IC + i] : 0.0, m = fabs(s);
            for (int o = 0; o < OC; o++) {
                s += ddo[(size_t)n * OC + o] * dwt[(size_t)o * IC + i];
                m += fabs(ddo[(size_t)n * OC + o] * dwt[(size_t)o * IC + i]);
            }
            rdinp[(size_t)n * IC + i] = s, mdinp[(size_t)n * IC + i] = m;
        }
    for (int o = 0; o < OC; o++) {
        for (int i = 0; i < IC; i++) {
            double s = dw0[(size_t)o * IC + i], m = fabs(s);
            for (int n = 0; n < N; n++) {
                s += ddo[(size_t)n * OC + o] * di[(size_t)n * IC + i];
                m += fabs(ddo[(size_t)n * OC + o] * di[(size_t)n * IC + i]);
            }
            rdw[(size_t)o * IC + i] = s, mdw[(size_t)o * IC + i] = m;
        }
        double s = db0[o], m = fabs(s);
        for (int n = 0; n < N; n++)
            s += ddo[(size_t)n * OC + o], m += fabs(ddo[(size_t)n * OC + o]);
        rdb[o] = s, mdb[o] = m;
    }
    // Elementwise against the classic fp32 summation bound |err| <= (K + 2) u sum|terms|, u = 2^-24 (a sum
    // that cancels to near 0 is still judged fairly); any wrong or missing term is far outside it.
    char what[128];
    snprintf(what, sizeof(what), "forward N=%d IC=%d OC=%d bias=%d acc=%d", N, IC, OC, with_bias, accumulate);
    check_within_sum_bound(out, rout, mout, (size_t)N * OC, IC + 2, what);
    snprintf(what, sizeof(what), "dinp N=%d IC=%d OC=%d acc=%d", N, IC, OC, accumulate);
    check_within_sum_bound(dinp, rdinp, mdinp, (size_t)N * IC, OC + 1, what);
    snprintf(what, sizeof(what), "dweight N=%d IC=%d OC=%d", N, IC, OC);
    check_within_sum_bound(dw, rdw, mdw, (size_t)OC * IC, N + 1, what);
    snprintf(what, sizeof(what), "dbias N=%d OC=%d", N, OC);
    check_within_sum_bound(db, rdb, mdb, OC, N + 1, what);
    free(mag);
    free(ref), free(di), free(dwt), free(dbs), free(ddo), free(out0), free(dinp0), free(dw0), free(db0);
    ffree(inp), ffree(w), ffree(b), ffree(out), ffree(dout), ffree(dinp), ffree(dw), ffree(db);
}

static void test_matmul_matches_naive_loop_at_awkward_shapes(void **state) {
    static const int dims[] = {1, 3, 17, 33, 129, 300};
    int k = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int c = 0; c < 6; c++, k++)
                check_matmul_vs_naive(dims[a], dims[b], dims[c], k % 2, (k / 2) % 2);
    check_matmul_vs_naive(800, 20, 2100, 1, 0); // more rows than one packed A block, more columns than NC
    check_matmul_vs_naive(7, 600, 5, 0, 1);     // three KC panels deep
}

// Finite differences of L = sum(R * (act(inp @ W^T + b))) through the double reference.
struct mm_fd {
    double *inp, *w, *b, *pre, *tmp;
    const float *R;
    int N, IC, OC, gelu_inp; // gelu_inp: the matmul's input is gelu(pre) (the dinp_gelu_pre path)
};

static double mm_loss(void *p) {
    struct mm_fd *s = p;
    const double *x = s->inp;
    if (s->gelu_inp) {
        for (size_t k = 0; k < (size_t)s->N * s->IC; k++)
            s->inp[k] = gelu_d(s->pre[k]);
    }
    matmul_ref(s->tmp, x, s->w, s->b, s->N, s->IC, s->OC);
    return dot_r(s->tmp, s->R, (size_t)s->N * s->OC);
}

static void test_matmul_gradients_match_finite_differences(void **state) {
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        int N = 5, IC = 19, OC = 11;
        float *inp = frand((size_t)N * IC, 1), *w = frand((size_t)OC * IC, 1), *b = frand(OC, 1);
        float *R = frand((size_t)N * OC, 1), *dinp = frand((size_t)N * IC, 1), *dw = falloc((size_t)OC * IC);
        float *db = falloc(OC);
        struct kiln_matmul_back_args ba = {.dinp = dinp,
                                           .dweight = dw,
                                           .dbias = with_bias ? db : NULL,
                                           .dout = R,
                                           .inp = inp,
                                           .weight = w,
                                           .N = N,
                                           .IC = IC,
                                           .OC = OC};
        g_be.ops->matmul_backward(g_be.ctx, &ba);
        struct mm_fd s = {d_of(inp, (size_t)N * IC),
                          d_of(w, (size_t)OC * IC),
                          with_bias ? d_of(b, OC) : NULL,
                          NULL,
                          malloc(sizeof(double) * N * OC),
                          R,
                          N,
                          IC,
                          OC,
                          0};
        double *g = malloc(sizeof(double) * OC * IC);
        numgrad(mm_loss, &s, s.inp, (size_t)N * IC, 1e-4, g);
        check_vs_double(dinp, g, (size_t)N * IC, 1e-5, "matmul dinp vs finite differences");
        numgrad(mm_loss, &s, s.w, (size_t)OC * IC, 1e-4, g);
        check_vs_double(dw, g, (size_t)OC * IC, 1e-5, "matmul dweight vs finite differences");
        if (with_bias) {
            numgrad(mm_loss, &s, s.b, OC, 1e-4, g);
            check_vs_double(db, g, OC, 1e-5, "matmul dbias vs finite differences");
        } else {
            for (int o = 0; o < OC; o++)
                assert_true(db[o] == 0.0f); // dbias == NULL: untouched
        }
        free(g), free(s.inp), free(s.w), free(s.b), free(s.tmp);
        ffree(inp), ffree(w), ffree(b), ffree(R), ffree(dinp), ffree(dw), ffree(db);
    }
}

// Forward with the GELU epilogue (pre and out), the GELU op, and the backward's fused DGELU: with
// inp = gelu(pre), matmul_backward(dinp_gelu_pre = pre) must give dL/dpre.
static void test_matmul_gelu_epilogue_and_dgelu_match_references(void **state) {
    int N = 6, IC = 23, OC = 13;
    float *inp = frand((size_t)N * IC, 1.5f), *w = frand((size_t)OC * IC, 0.5f), *b = frand(OC, 1);
    float *out = falloc((size_t)N * OC), *pre = falloc((size_t)N * OC);
    struct kiln_matmul_args fa = {.out = out,
                                  .pre = pre,
                                  .inp = inp,
                                  .weight = w,
                                  .bias = b,
                                  .N = N,
                                  .IC = IC,
                                  .OC = OC,
                                  .act = KILN_ACT_GELU};
    g_be.ops->matmul_forward(g_be.ctx, &fa);
    double *di = d_of(inp, (size_t)N * IC), *dw = d_of(w, (size_t)OC * IC), *db = d_of(b, OC);
    double *rpre = malloc(sizeof(double) * N * OC), *rout = malloc(sizeof(double) * N * OC);
    matmul_ref(rpre, di, dw, db, N, IC, OC);
    for (int k = 0; k < N * OC; k++)
        rout[k] = gelu_d(rpre[k]);
    check_vs_double(pre, rpre, (size_t)N * OC, 1e-5, "gelu matmul pre-activation");
    check_vs_double(out, rout, (size_t)N * OC, 1e-5, "gelu matmul output");
    // the GELU op on its own (for a pre-activation a wider GEMM wrote) is the epilogue's GELU, bitwise
    float *gout = falloc((size_t)N * OC);
    struct kiln_gelu_args ga = {.out = gout, .inp = pre, .N = N, .H = OC};
    g_be.ops->gelu_forward(g_be.ctx, &ga);
    assert_memory_equal(gout, out, (size_t)N * OC * sizeof(float));
    ffree(gout);

    // DGELU: the next layer's matmul reads x = gelu(pre_x)
    for (int acc = 0; acc < 2; acc++) {
        float *pre_x = frand((size_t)N * IC, 1.5f), *x = falloc((size_t)N * IC),
              *R = frand((size_t)N * OC, 1);
        for (int k = 0; k < N * IC; k++)
            x[k] = (float)gelu_d(pre_x[k]);
        float *dpre = frand((size_t)N * IC, 1), *dwt = falloc((size_t)OC * IC);
        double *dpre0 = d_of(dpre, (size_t)N * IC);
        struct kiln_matmul_back_args ba = {.dinp = dpre,
                                           .dweight = dwt,
                                           .dout = R,
                                           .inp = x,
                                           .weight = w,
                                           .dinp_gelu_pre = pre_x,
                                           .N = N,
                                           .IC = IC,
                                           .OC = OC,
                                           .dinp_accumulate = acc};
        g_be.ops->matmul_backward(g_be.ctx, &ba);
        struct mm_fd s = {malloc(sizeof(double) * N * IC),
                          dw,
                          NULL,
                          d_of(pre_x, (size_t)N * IC),
                          malloc(sizeof(double) * N * OC),
                          R,
                          N,
                          IC,
                          OC,
                          1};
        double *g = malloc(sizeof(double) * N * IC);
        numgrad(mm_loss, &s, s.pre, (size_t)N * IC, 1e-5, g);
        for (int k = 0; k < N * IC; k++)
            g[k] += acc ? dpre0[k] : 0.0;
        check_vs_double(dpre, g, (size_t)N * IC, 1e-4,
                        "dinp through gelu'(dinp_gelu_pre) vs finite differences");
        free(g), free(s.inp), free(s.pre), free(s.tmp), free(dpre0);
        ffree(pre_x), ffree(x), ffree(R), ffree(dpre), ffree(dwt);
    }
    free(di), free(dw), free(db), free(rpre), free(rout);
    ffree(inp), ffree(w), ffree(b), ffree(out), ffree(pre);
}

// ---- norms ---------------------------------------------------------------------------------------------

struct norm_fd {
    double *inp, *res, *w, *b, *y, *mean, *rstd;
    const float *R;
    int N, C, rms;
    double eps;
};

static double norm_loss(void *p) {
    struct norm_fd *s = p;
    for (int n = 0; n < s->N; n++) {
        double x[256], mean = 0, var = 0;
        for (int i = 0; i < s->C; i++)
            x[i] = s->inp[(size_t)n * s->C + i] + (s->res ? s->res[(size_t)n * s->C + i] : 0.0);
        if (!s->rms) {
            for (int i = 0; i < s->C; i++)
                mean += x[i] / s->C;
        }
        for (int i = 0; i < s->C; i++)
            var += (x[i] - mean) * (x[i] - mean) / s->C;
        double rstd = 1.0 / sqrt(var + s->eps);
        s->mean[n] = mean;
        s->rstd[n] = rstd;
        for (int i = 0; i < s->C; i++)
            s->y[(size_t)n * s->C + i] = (x[i] - mean) * rstd * s->w[i] + (s->b ? s->b[i] : 0.0);
    }
    return dot_r(s->y, s->R, (size_t)s->N * s->C);
}

static void check_norm(int rms, int with_bias, int fused) {
    int N = 9, C = 70; // two column blocks in the dweight reduction
    float *inp = frand((size_t)N * C, 1), *res = fused ? frand((size_t)N * C, 1) : NULL;
    float *w = frand(C, 1), *b = with_bias ? frand(C, 1) : NULL, *R = frand((size_t)N * C, 1);
    float *out = falloc((size_t)N * C), *mean = falloc(N), *rstd = falloc(N),
          *res_out = falloc((size_t)N * C);
    float *dinp = frand((size_t)N * C, 1), *dw = frand(C, 1), *db = frand(C, 1);
    double *dinp0 = d_of(dinp, (size_t)N * C), *dw0 = d_of(dw, C), *db0 = d_of(db, C);
    float *rb[2] = {frand(C, 1), frand(C, 1)}; // residual-stream bias gradients (+=): the second with bias only
    double *rb0[2] = {d_of(rb[0], C), d_of(rb[1], C)};
    struct kiln_norm_args fa = {.out = out,
                                .mean = rms ? NULL : mean,
                                .rstd = rstd,
                                .res_out = fused ? res_out : NULL,
                                .inp = inp,
                                .res_in = res,
                                .weight = w,
                                .bias = b,
                                .N = N,
                                .C = C,
                                .rms = rms,
                                .eps = 1e-5f};
    g_be.ops->norm_forward(g_be.ctx, &fa);
    struct kiln_norm_back_args ba = {.dinp = dinp,
                                     .dweight = dw,
                                     .dbias = with_bias ? db : NULL,
                                     .dout = R,
                                     .inp = fused ? res_out : inp,
                                     .weight = w,
                                     .mean = rms ? NULL : mean,
                                     .rstd = rstd,
                                     .N = N,
                                     .C = C,
                                     .rms = rms,
                                     .dres_bias = {rb[0], with_bias ? rb[1] : NULL}};
    g_be.ops->norm_backward(g_be.ctx, &ba);
    for (int k = 0; k < 2; k++) { // dres_bias += column sums of dinp as the op left it
        for (int i = 0; i < C; i++) {
            double sum = rb0[k][i];
            for (int n = 0; n < N && (k == 0 || with_bias); n++)
                sum += dinp[(size_t)n * C + i];
            assert_true(fabs(rb[k][i] - sum) <= 1e-5 * (1 + fabs(sum)));
        }
        free(rb0[k]);
        ffree(rb[k]);
    }

    struct norm_fd s = {d_of(inp, (size_t)N * C),
                        fused ? d_of(res, (size_t)N * C) : NULL,
                        d_of(w, C),
                        b ? d_of(b, C) : NULL,
                        malloc(sizeof(double) * N * C),
                        malloc(sizeof(double) * N),
                        malloc(sizeof(double) * N),
                        R,
                        N,
                        C,
                        rms,
                        1e-5};
    norm_loss(&s);
    char what[160];
    snprintf(what, sizeof(what), "norm rms=%d bias=%d fused=%d", rms, with_bias, fused);
    check_vs_double(out, s.y, (size_t)N * C, 1e-5, what);
    check_vs_double(rstd, s.rstd, N, 1e-5, "rstd");
    if (!rms) {
        double num = 0; // mean is near 0, so compare absolutely
        for (int n = 0; n < N; n++)
            num = fmax(num, fabs(mean[n] - s.mean[n]));
        assert_true(num < 1e-5);
    }
    if (fused)
        for (int k = 0; k < N * C; k++)
            assert_true(res_out[k] == inp[k] + res[k]);
    double *g = malloc(sizeof(double) * N * C);
    // LayerNorm is smooth: h = 1e-5 gives central differences accurate to ~1e-9
    numgrad(norm_loss, &s, s.inp, (size_t)N * C, 1e-5, g);
    for (int k = 0; k < N * C; k++)
        g[k] += dinp0[k]; // dinp accumulates
    snprintf(what, sizeof(what), "norm dinp rms=%d bias=%d fused=%d", rms, with_bias, fused);
    check_vs_double(dinp, g, (size_t)N * C, 1e-4, what);
    if (fused) { // the residual input gets the same gradient
        numgrad(norm_loss, &s, s.res, (size_t)N * C, 1e-5, g);
        for (int k = 0; k < N * C; k++)
            g[k] += dinp0[k];
        check_vs_double(dinp, g, (size_t)N * C, 1e-4, "norm d(res_in)");
    }
    numgrad(norm_loss, &s, s.w, C, 1e-5, g);
    for (int i = 0; i < C; i++)
        g[i] += dw0[i];
    check_vs_double(dw, g, C, 1e-4, "norm dweight");
    if (with_bias) {
        numgrad(norm_loss, &s, s.b, C, 1e-5, g);
        for (int i = 0; i < C; i++)
            g[i] += db0[i];
        check_vs_double(db, g, C, 1e-4, "norm dbias");
    } else {
        for (int i = 0; i < C; i++)
            assert_true(db[i] == (float)db0[i]);
    }
    free(g), free(s.inp), free(s.res), free(s.w), free(s.b), free(s.y), free(s.mean), free(s.rstd);
    free(dinp0), free(dw0), free(db0);
    ffree(inp), ffree(res), ffree(w), ffree(b), ffree(R), ffree(out), ffree(mean), ffree(rstd),
        ffree(res_out);
    ffree(dinp), ffree(dw), ffree(db);
}

static void test_layernorm_gradients_match_finite_differences(void **state) {
    for (int fused = 0; fused < 2; fused++)
        for (int bias = 0; bias < 2; bias++)
            check_norm(0, bias, fused);
}

static void test_rmsnorm_gradients_match_finite_differences(void **state) {
    for (int fused = 0; fused < 2; fused++)
        check_norm(1, 0, fused);
}

// ---- embedding -----------------------------------------------------------------------------------------

struct embed_fd {
    double *wte, *wpe, *y;
    const int32_t *tokens;
    const float *R;
    int BT, T, C;
};

static double embed_loss(void *p) {
    struct embed_fd *s = p;
    for (int n = 0; n < s->BT; n++)
        for (int i = 0; i < s->C; i++)
            s->y[(size_t)n * s->C + i] = s->wte[(size_t)s->tokens[n] * s->C + i] +
                                         (s->wpe ? s->wpe[(size_t)(n % s->T) * s->C + i] : 0.0);
    return dot_r(s->y, s->R, (size_t)s->BT * s->C);
}

static void test_embed_gradients_match_finite_differences(void **state) {
    for (int learned = 0; learned < 2; learned++) {
        int B = 3, T = 5, C = 70, Vp = 6, maxT = 8; // few tokens: repeats must accumulate
        int32_t tokens[15];
        for (int n = 0; n < B * T; n++)
            tokens[n] = (int32_t)(test_rand_u64(&g_rng) % Vp);
        float *wte = frand((size_t)Vp * C, 1), *wpe = learned ? frand((size_t)maxT * C, 1) : NULL;
        float *out = falloc((size_t)B * T * C), *R = frand((size_t)B * T * C, 1);
        float *dwte = frand((size_t)Vp * C, 1), *dwpe = frand((size_t)maxT * C, 1);
        double *dwte0 = d_of(dwte, (size_t)Vp * C), *dwpe0 = d_of(dwpe, (size_t)maxT * C);
        struct kiln_embed_args fa = {.out = out,
                                     .tokens = tokens,
                                     .tokens_host = tokens,
                                     .wte = wte,
                                     .wpe = wpe,
                                     .B = B,
                                     .T = T,
                                     .C = C};
        g_be.ops->embed_forward(g_be.ctx, &fa);
        struct kiln_embed_back_args ba = {.dwte = dwte,
                                          .dwpe = learned ? dwpe : NULL,
                                          .dout = R,
                                          .tokens = tokens,
                                          .tokens_host = tokens,
                                          .B = B,
                                          .T = T,
                                          .C = C};
        g_be.ops->embed_backward(g_be.ctx, &ba);
        struct embed_fd s = {d_of(wte, (size_t)Vp * C),
                             learned ? d_of(wpe, (size_t)maxT * C) : NULL,
                             malloc(sizeof(double) * B * T * C),
                             tokens,
                             R,
                             B * T,
                             T,
                             C};
        embed_loss(&s);
        check_vs_double(out, s.y, (size_t)B * T * C, 1e-7, "embed forward");
        double *g = malloc(sizeof(double) * maxT * C);
        numgrad(embed_loss, &s, s.wte, (size_t)Vp * C, 1e-3, g);
        for (int k = 0; k < Vp * C; k++)
            g[k] += dwte0[k];
        check_vs_double(dwte, g, (size_t)Vp * C, 1e-6, "embed dwte");
        if (learned) {
            numgrad(embed_loss, &s, s.wpe, (size_t)maxT * C, 1e-3, g);
            for (int k = 0; k < maxT * C; k++)
                g[k] += dwpe0[k];
            check_vs_double(dwpe, g, (size_t)maxT * C, 1e-6, "embed dwpe");
        } else {
            for (int k = 0; k < maxT * C; k++)
                assert_true(dwpe[k] == (float)dwpe0[k]);
        }
        free(g), free(s.wte), free(s.wpe), free(s.y), free(dwte0), free(dwpe0);
        ffree(wte), ffree(wpe), ffree(out), ffree(R), ffree(dwte), ffree(dwpe);
    }
}

// ---- SwiGLU and add ------------------------------------------------------------------------------------

struct swiglu_fd {
    double *inp, *y;
    const float *R;
    int N, H;
};

static double swiglu_loss(void *p) {
    struct swiglu_fd *s = p;
    for (int n = 0; n < s->N; n++)
        for (int i = 0; i < s->H; i++) {
            double g = s->inp[(size_t)n * 2 * s->H + i], u = s->inp[(size_t)n * 2 * s->H + s->H + i];
            s->y[(size_t)n * s->H + i] = g / (1.0 + exp(-g)) * u; // F.silu(gate) * up
        }
    return dot_r(s->y, s->R, (size_t)s->N * s->H);
}

static void test_swiglu_gradients_match_finite_differences(void **state) {
    int N = 7, H = 33;
    float *inp = frand((size_t)N * 2 * H, 2), *out = falloc((size_t)N * H), *R = frand((size_t)N * H, 1);
    float *dinp = frand((size_t)N * 2 * H, 1); // overwritten
    struct kiln_swiglu_args fa = {.out = out, .inp = inp, .N = N, .H = H};
    g_be.ops->swiglu_forward(g_be.ctx, &fa);
    struct kiln_swiglu_back_args ba = {.dinp = dinp, .dout = R, .inp = inp, .N = N, .H = H};
    g_be.ops->swiglu_backward(g_be.ctx, &ba);
    struct swiglu_fd s = {d_of(inp, (size_t)N * 2 * H), malloc(sizeof(double) * N * H), R, N, H};
    swiglu_loss(&s);
    check_vs_double(out, s.y, (size_t)N * H, 1e-6, "swiglu forward");
    double *g = malloc(sizeof(double) * N * 2 * H);
    numgrad(swiglu_loss, &s, s.inp, (size_t)N * 2 * H, 1e-5, g);
    check_vs_double(dinp, g, (size_t)N * 2 * H, 1e-5, "swiglu dinp");
    free(g), free(s.inp), free(s.y);
    ffree(inp), ffree(out), ffree(R), ffree(dinp);
}

static void test_add_is_elementwise_and_may_alias(void **state) {
    size_t n = 10007;
    float *a = frand(n, 1), *b = frand(n, 1), *out = falloc(n);
    g_be.ops->add(g_be.ctx, out, a, b, n);
    for (size_t i = 0; i < n; i++)
        assert_true(out[i] == a[i] + b[i]);
    g_be.ops->add(g_be.ctx, a, a, b, n); // in place
    assert_memory_equal(a, out, n * sizeof(float));
    ffree(a), ffree(b), ffree(out);
}

// ---- cross-entropy -------------------------------------------------------------------------------------

struct xent_fd {
    double *logits, *losses;
    const int32_t *targets;
    int N, V, Vp;
    double dloss, z;
};

static double xent_loss(void *p) { // L = dloss * sum_i losses_i, straight from the definition
    struct xent_fd *s = p;
    double L = 0;
    for (int i = 0; i < s->N; i++) {
        s->losses[i] = 0;
        if (s->targets[i] < 0)
            continue;
        const double *row = s->logits + (size_t)i * s->Vp;
        double sum = 0;
        for (int j = 0; j < s->V; j++)
            sum += exp(row[j]);
        double lse = log(sum);
        s->losses[i] = lse - row[s->targets[i]] + s->z * lse * lse;
        L += s->losses[i];
    }
    return s->dloss * L;
}

static void test_cross_entropy_matches_direct_double_and_finite_differences(void **state) {
    int N = 8, V = 50, Vp = 64;
    int32_t targets[8];
    for (int i = 0; i < N; i++)
        targets[i] = (int32_t)(test_rand_u64(&g_rng) % V);
    targets[2] = -1; // ignored
    targets[5] = -100;
    targets[6] = V - 1; // the last real column
    float *logits = frand((size_t)N * Vp, 2), *losses = falloc(N);
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vp; j++)
            logits[(size_t)i * Vp + j] = 50.0f; // padding: must get no probability
    float *copy = falloc((size_t)N * Vp);
    memcpy(copy, logits, sizeof(float) * N * Vp);
    struct xent_fd s = {
        d_of(logits, (size_t)N * Vp), malloc(sizeof(double) * N), targets, N, V, Vp, 0.37, 1e-2};
    xent_loss(&s);

    // dloss == 0: losses only, logits untouched
    struct kiln_xent_args xa = {.logits = logits,
                                .losses = losses,
                                .targets = targets,
                                .N = N,
                                .V = V,
                                .Vp = Vp,
                                .dloss = 0.0f,
                                .z_loss = 1e-2f};
    g_be.ops->cross_entropy(g_be.ctx, &xa);
    check_vs_double(losses, s.losses, N, 1e-6, "cross-entropy losses (dloss = 0)");
    assert_memory_equal(logits, copy, sizeof(float) * N * Vp);
    assert_true(losses[2] == 0.0f && losses[5] == 0.0f);

    xa.dloss = 0.37f;
    g_be.ops->cross_entropy(g_be.ctx, &xa);
    check_vs_double(losses, s.losses, N, 1e-6, "cross-entropy losses");
    double *g = calloc((size_t)N * Vp, sizeof(double));
    numgrad(xent_loss, &s, s.logits, (size_t)N * Vp, 1e-5,
            g); // padded columns: exactly 0 in the reference too
    check_vs_double(logits, g, (size_t)N * Vp, 1e-5, "dlogits vs finite differences");
    for (int i = 0; i < N; i++)
        for (int j = 0; j < Vp; j++)
            if (j >= V || targets[i] < 0)
                assert_true(logits[(size_t)i * Vp + j] == 0.0f);
    free(g), free(s.logits), free(s.losses);
    ffree(logits), ffree(losses), ffree(copy);
}

// ---- optimizer -----------------------------------------------------------------------------------------

static void test_adamw_matches_pytorch_formula_on_decay_spans_only(void **state) {
    size_t P = 1000;
    struct kiln_param_span spans[] = {{0, 300, 1, 0}, {300, 100, 0, 300}, {500, 400, 1, 500}}; // 400..499, 900.. untouched
    float *p = frand(P, 1), *g = frand(P, 1), *m = frand(P, 0.1f), *v = frand(P, 0.1f);
    for (size_t i = 0; i < P; i++)
        v[i] = v[i] * v[i];
    double *p0 = d_of(p, P), *g0 = d_of(g, P), *m0 = d_of(m, P), *v0 = d_of(v, P);
    struct kiln_adamw_args a = {.params = p,
                                .grads = g,
                                .m = m,
                                .v = v,
                                .spans = spans,
                                .n_spans = 3,
                                .lr = 1e-2f,
                                .beta1 = 0.9f,
                                .beta2 = 0.95f,
                                .eps = 1e-8f,
                                .weight_decay = 0.1f,
                                .grad_scale = 0.5f,
                                .step = 3};
    g_be.ops->adamw(g_be.ctx, &a);
    double *rp = malloc(sizeof(double) * P), *rm = malloc(sizeof(double) * P),
           *rv = malloc(sizeof(double) * P);
    for (size_t i = 0; i < P; i++) {
        rp[i] = p0[i], rm[i] = m0[i], rv[i] = v0[i];
    }
    double lr = a.lr, b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay;
    for (int s = 0; s < 3; s++)
        for (size_t i = spans[s].offset; i < spans[s].offset + spans[s].count; i++) {
            double grad = g0[i] * a.grad_scale;
            if (spans[s].decay)
                rp[i] *= 1 - lr * wd; // decoupled weight decay
            rm[i] = b1 * rm[i] + (1 - b1) * grad;
            rv[i] = b2 * rv[i] + (1 - b2) * grad * grad;
            double mhat = rm[i] / (1 - pow(b1, a.step)), vhat = rv[i] / (1 - pow(b2, a.step));
            rp[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
    check_vs_double(p, rp, P, 1e-6, "adamw params");
    check_vs_double(m, rm, P, 1e-6, "adamw m");
    check_vs_double(v, rv, P, 1e-6, "adamw v");
    for (size_t i = 400; i < 500; i++)
        assert_true(p[i] == (float)p0[i] && m[i] == (float)m0[i] && v[i] == (float)v0[i]);
    for (size_t i = 900; i < P; i++)
        assert_true(p[i] == (float)p0[i]);
    // decay really happened: the no-decay span would differ if decayed (compare against a decayed reference)
    double diff = 0;
    for (size_t i = 300; i < 400; i++)
        diff = fmax(diff, fabs(rp[i] * (1 - lr * wd) - p[i]));
    assert_true(diff > 1e-6);
    free(rp), free(rm), free(rv), free(p0), free(g0), free(m0), free(v0);
    ffree(p), ffree(g), ffree(m), ffree(v);
}

static void test_sum_squares_matches_double_and_propagates_nan(void **state) {
    size_t n = 200003; // several 64K chunks and a ragged tail
    float *g = frand(n, 3);
    double ref = 0;
    for (size_t i = 0; i < n; i++)
        ref += (double)g[i] * g[i];
    double got = g_be.ops->sum_squares(g_be.ctx, g, n);
    assert_true(fabs(got - ref) <= 1e-12 * ref);
    assert_true(g_be.ops->sum_squares(g_be.ctx, g, 0) == 0.0);
    g[123456] = NAN;
    assert_true(isnan(g_be.ops->sum_squares(g_be.ctx, g, n)));
    g[123456] = INFINITY;
    assert_true(isinf(g_be.ops->sum_squares(g_be.ctx, g, n)));
    g[123456] = 1e30f; // overflows fp32 when squared, not in double
    assert_true(isfinite(g_be.ops->sum_squares(g_be.ctx, g, n)));
    ffree(g);
}

// ---- determinism ---------------------------------------------------------------------------------------

static void test_matmul_and_norm_are_bitwise_identical_with_1_and_2_threads(void **state) {
    struct kiln_backend be[2];
    struct kiln_error err;
    int N = 130, IC = 520, OC = 2100, C = 600; // big enough that every op runs in parallel
    float *inp = frand((size_t)N * IC, 1), *w = frand((size_t)OC * IC, 1), *b = frand(OC, 1);
    float *dout = frand((size_t)N * OC, 1), *x = frand((size_t)N * C, 1), *nw = frand(C, 1),
          *dn = frand((size_t)N * C, 1);
    float *res[2][8];
    for (int k = 0; k < 2; k++) {
        struct kiln_backend_opts opts = {.threads = k + 1};
        assert_int_equal(kiln_cpu_backend_open(&opts, &be[k], &err), 0);
        void *ctx = be[k].ctx;
        const struct kiln_ops *ops = be[k].ops;
        for (int j = 0; j < 8; j++)
            res[k][j] = NULL;
        res[k][0] = falloc((size_t)N * OC), res[k][1] = falloc((size_t)N * IC),
        res[k][2] = falloc((size_t)OC * IC);
        res[k][3] = falloc(OC), res[k][4] = falloc((size_t)N * C), res[k][5] = falloc(C),
        res[k][6] = falloc(C);
        res[k][7] = falloc(N * 2);
        struct kiln_matmul_args fa = {
            .out = res[k][0], .inp = inp, .weight = w, .bias = b, .N = N, .IC = IC, .OC = OC};
        ops->matmul_forward(ctx, &fa);
        struct kiln_matmul_back_args ba = {.dinp = res[k][1],
                                           .dweight = res[k][2],
                                           .dbias = res[k][3],
                                           .dout = dout,
                                           .inp = inp,
                                           .weight = w,
                                           .N = N,
                                           .IC = IC,
                                           .OC = OC};
        ops->matmul_backward(ctx, &ba);
        ops->matmul_backward(ctx, &ba); // accumulate twice: the order of accumulation is fixed too
        float *out = falloc((size_t)N * C);
        struct kiln_norm_args na = {.out = out,
                                    .mean = res[k][7],
                                    .rstd = res[k][7] + N,
                                    .inp = x,
                                    .weight = nw,
                                    .bias = nw,
                                    .N = N,
                                    .C = C,
                                    .eps = 1e-5f};
        ops->norm_forward(ctx, &na);
        struct kiln_norm_back_args nb = {.dinp = res[k][4],
                                         .dweight = res[k][5],
                                         .dbias = res[k][6],
                                         .dout = dn,
                                         .inp = x,
                                         .weight = nw,
                                         .mean = res[k][7],
                                         .rstd = res[k][7] + N,
                                         .N = N,
                                         .C = C};
        ops->norm_backward(ctx, &nb);
        ffree(out);
    }
    size_t sizes[8] = {(size_t)N * OC, (size_t)N * IC, (size_t)OC * IC, OC, (size_t)N * C, C, C,
                       (size_t)N * 2};
    const char *names[8] = {"matmul out", "dinp",         "dweight",    "dbias",
                            "norm dinp",  "norm dweight", "norm dbias", "norm stats"};
    for (int j = 0; j < 8; j++) {
        if (memcmp(res[0][j], res[1][j], sizes[j] * sizeof(float)) != 0)
            fail_msg("%s differs between 1 and 2 threads", names[j]);
        ffree(res[0][j]), ffree(res[1][j]);
    }
    kiln_backend_close(&be[0]);
    kiln_backend_close(&be[1]);
    ffree(inp), ffree(w), ffree(b), ffree(dout), ffree(x), ffree(nw), ffree(dn);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_fills_every_op_and_describes_the_cpu),
        cmocka_unit_test(test_open_rejects_negative_threads),
        cmocka_unit_test(test_dtype_sizes_and_names),
        cmocka_unit_test(test_alloc_is_zeroed_and_64_byte_aligned),
        cmocka_unit_test(test_mem_peak_counts_bytes_held_at_once),
        cmocka_unit_test(test_upload_f32_to_bf16_rounds_to_nearest_even),
        cmocka_unit_test(test_matmul_matches_naive_loop_at_awkward_shapes),
        cmocka_unit_test(test_matmul_gradients_match_finite_differences),
        cmocka_unit_test(test_matmul_gelu_epilogue_and_dgelu_match_references),
        cmocka_unit_test(test_layernorm_gradients_match_finite_differences),
        cmocka_unit_test(test_rmsnorm_gradients_match_finite_differences),
        cmocka_unit_test(test_embed_gradients_match_finite_differences),
        cmocka_unit_test(test_swiglu_gradients_match_finite_differences),
        cmocka_unit_test(test_add_is_elementwise_and_may_alias),
        cmocka_unit_test(test_cross_entropy_matches_direct_double_and_finite_differences),
        cmocka_unit_test(test_adamw_matches_pytorch_formula_on_decay_spans_only),
        cmocka_unit_test(test_sum_squares_matches_double_and_propagates_nan),
        cmocka_unit_test(test_matmul_and_norm_are_bitwise_identical_with_1_and_2_threads),
    };
    return cmocka_run_group_tests(tests, cpu_group_setup, cpu_group_teardown);
}
