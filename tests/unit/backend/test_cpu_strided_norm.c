// The norm op on a slice of wider rows (QK-norm's use): the same numbers as on the gathered contiguous slice,
// nothing outside the slice touched, and dinp_assign overwriting instead of accumulating.
#include "test_util.h"

#include "core/backend.h"

static void run_case(struct kiln_backend *be, int N, int C, int ld, int off, int rms) {
    uint64_t s = test_seed() ^ (uint64_t)(N * 131 + C * 7 + ld + off + rms);
    size_t nl = (size_t)N * ld, nc = (size_t)N * C;
    float *x = malloc(nl * 4), *out = malloc(nl * 4), *out0 = malloc(nl * 4), *w = malloc(C * 4);
    float *xs = malloc(nc * 4), *outs = malloc(nc * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
    float *means = malloc(N * 4), *rstds = malloc(N * 4);
    test_fill_normal(x, nl, 1.5f, &s);
    test_fill_normal(out, nl, 1.0f, &s);
    test_fill_normal(w, C, 1.0f, &s);
    memcpy(out0, out, nl * 4);
    for (int n = 0; n < N; n++)
        memcpy(xs + (size_t)n * C, x + (size_t)n * ld + off, C * 4);
    const struct kiln_ops *o = be->ops;
    struct kiln_norm_args a = {.out = out + off, .mean = rms ? NULL : mean, .rstd = rstd, .inp = x + off,
                               .weight = w, .N = N, .C = C, .rms = rms, .eps = 1e-5f, .stride = ld};
    struct kiln_norm_args b = {.out = outs, .mean = rms ? NULL : means, .rstd = rstds, .inp = xs, .weight = w,
                               .N = N, .C = C, .rms = rms, .eps = 1e-5f};
    o->norm_forward(be->ctx, &a);
    o->norm_forward(be->ctx, &b);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < ld; i++) {
            float got = out[(size_t)n * ld + i];
            if (i >= off && i < off + C)
                assert_true(got == outs[(size_t)n * C + i - off]);
            else
                assert_true(got == out0[(size_t)n * ld + i]); // untouched
        }
    // backward, assigning: dinp starts as garbage and must end equal to the contiguous result (which
    // accumulates into zeros); outside the slice it stays as it was
    float *dout = malloc(nl * 4), *douts = malloc(nc * 4), *dinp = malloc(nl * 4), *dinp0 = malloc(nl * 4);
    float *dinps = calloc(nc, 4), *dw = calloc(C, 4), *dws = calloc(C, 4);
    test_fill_normal(dout, nl, 1.0f, &s);
    test_fill_normal(dinp, nl, 3.0f, &s);
    memcpy(dinp0, dinp, nl * 4);
    for (int n = 0; n < N; n++)
        memcpy(douts + (size_t)n * C, dout + (size_t)n * ld + off, C * 4);
    struct kiln_norm_back_args ba = {.dinp = dinp + off, .dweight = dw, .dout = dout + off, .inp = x + off,
                                     .weight = w, .mean = rms ? NULL : mean, .rstd = rstd, .N = N, .C = C,
                                     .rms = rms, .stride = ld, .dinp_assign = 1};
    struct kiln_norm_back_args bb = {.dinp = dinps, .dweight = dws, .dout = douts, .inp = xs, .weight = w,
                                     .mean = rms ? NULL : means, .rstd = rstds, .N = N, .C = C, .rms = rms};
    o->norm_backward(be->ctx, &ba);
    o->norm_backward(be->ctx, &bb);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < ld; i++) {
            float got = dinp[(size_t)n * ld + i];
            if (i >= off && i < off + C)
                assert_true(got == dinps[(size_t)n * C + i - off]);
            else
                assert_true(got == dinp0[(size_t)n * ld + i]);
        }
    assert_memory_equal(dw, dws, C * 4);
    free(x), free(out), free(out0), free(w), free(xs), free(outs), free(mean), free(rstd), free(means), free(rstds);
    free(dout), free(douts), free(dinp), free(dinp0), free(dinps), free(dw), free(dws);
}

static void test_strided_norm_equals_contiguous_and_leaves_the_rest(void **state) {
    struct kiln_backend be;
    struct kiln_error e;
    struct kiln_backend_opts bo = {0};
    assert_int_equal(kiln_backend_open("cpu", &bo, &be, &e), 0);
    int cases[][4] = {{7, 16, 48, 0}, {7, 16, 48, 16}, {33, 24, 40, 16}, {5, 64, 192, 128}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (int rms = 0; rms <= 1; rms++)
            run_case(&be, cases[i][0], cases[i][1], cases[i][2], cases[i][3], rms);
    kiln_backend_close(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strided_norm_equals_contiguous_and_leaves_the_rest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
