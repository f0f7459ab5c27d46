// The FP8 linear layer (precision/fp8.c) as the model calls it, on the CPU's exact emulation:
//  - on operands whose FP8 casts are exact, every recipe's forward and straight-through backward equal the
//    f32 layer's (the transposes, the scales and the epilogues are wired right: bias, GELU, DGELU, +=, =);
//  - on random operands its gradients are the straight-through estimator's: the unquantized layer's
//    gradients (those of L = sum dout * (x W^T + b), here in double) within the formats' rounding, and not
//    equal to them (the GEMMs are FP8);
//  - delayed scaling scales by the history, not the tensor now, and its state survives JSON bit for bit;
//  - it composes: a hook installed after it runs its GEMMs through it; it refuses to go on top of another;
//  - the backward reuses the forward's input amax only where its input is the forward's whole input.
#include "test_util.h"

#include "core/backend.h"
#include "model/model.h"
#include "precision/fp8.h"

static struct kiln_backend g_be;
static uint64_t g_rng;

enum { N = 24, IC = 40, OC = 32 };

struct layer {
    float x[N * IC], w[OC * IC], b[OC], dout[N * OC], pre_prev[N * IC]; // pre_prev: the DGELU's input
    float out[N * OC], pre[N * OC], dinp[N * IC], dw[OC * IC], db[OC];
};

static struct kiln_model *tiny_model(void) {
    struct kiln_model_config m;
    memset(&m, 0, sizeof(m));
    m.n_layer = 2;
    m.n_head = 2;
    m.n_embd = 16;
    m.block_size = 8;
    m.vocab_size = 11;
    m.vocab_multiple = 16;
    m.pos = KILN_POS_LEARNED;
    m.norm_eps = 1e-5f;
    m.norm_bias = 1;
    m.bias = 1;
    struct kiln_model_opts o = {.B = 1, .T = 8, .recompute = KILN_RECOMPUTE_NONE, .training = 1};
    struct kiln_model *g;
    struct kiln_error e;
    assert_int_equal(kiln_model_create(&g, &m, &g_be, &o, &e), 0);
    return g;
}

// The FP8 hook of a recipe, taken back off the model it was applied to
static struct kiln_fp8 *fp8_hook(struct kiln_model *g, enum kiln_fp8_recipe r, enum kiln_fp8_fmt grad,
                                 struct kiln_model_linear *h) {
    struct kiln_fp8_opts o = {.recipe = r, .grad_fmt = grad, .history = 4};
    struct kiln_fp8 *f;
    struct kiln_error e;
    assert_int_equal(kiln_fp8_apply(&f, g, &g_be, &o, 2, &e), 0);
    kiln_model_set_linear(g, NULL, h);
    assert_non_null(h->forward);
    return f;
}

// forward and backward of one layer through h (NULL functions: the backend's f32 ops)
static void run_layer(const struct kiln_model_linear *h, struct layer *L, int gelu, int dgelu, int accum) {
    struct kiln_matmul_args a = {.out = L->out, .pre = gelu ? L->pre : NULL, .inp = L->x, .weight = L->w,
                                 .bias = L->b, .N = N, .IC = IC, .OC = OC,
                                 .act = gelu ? KILN_ACT_GELU : KILN_ACT_NONE, .accumulate = accum && !gelu};
    kiln_model_linear_forward_with(h, &g_be, 0, KILN_LINEAR_MLP_IN, &a);
    struct kiln_matmul_back_args b = {.dinp = L->dinp, .dweight = L->dw, .dbias = L->db, .dout = L->dout,
                                      .inp = L->x, .weight = L->w, .dinp_gelu_pre = dgelu ? L->pre_prev : NULL,
                                      .N = N, .IC = IC, .OC = OC, .dinp_accumulate = accum,
                                      .grad_assign = !accum};
    kiln_model_linear_backward_with(h, &g_be, 0, KILN_LINEAR_MLP_IN, &b);
}

// +-2^j, j in [-3, 3]: times any scale 448/2^k or 57344/2^k (7 times a power of two) still exact in FP8
static void fill_exact(float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = ldexpf(test_rand_u64(&g_rng) & 1 ? -1.0f : 1.0f, (int)(test_rand_u64(&g_rng) % 7) - 3);
}

static void fill(struct layer *L, int exact) {
    if (exact) {
        fill_exact(L->x, N * IC);
        fill_exact(L->w, OC * IC);
        fill_exact(L->dout, N * OC);
    } else {
        test_fill_normal(L->x, N * IC, 1.0f, &g_rng);
        test_fill_normal(L->w, OC * IC, 0.2f, &g_rng);
        test_fill_normal(L->dout, N * OC, 1e-3f, &g_rng); // gradients are small: the scale must adapt
    }
    test_fill_normal(L->b, OC, 0.5f, &g_rng);
    test_fill_normal(L->pre_prev, N * IC, 1.5f, &g_rng);
    test_fill_normal(L->out, N * OC, 1.0f, &g_rng); // what += adds to
    test_fill_normal(L->dinp, N * IC, 1.0f, &g_rng);
    test_fill_normal(L->dw, OC * IC, 1.0f, &g_rng);
    test_fill_normal(L->db, OC, 1.0f, &g_rng);
}

static void test_exact_operands_give_the_f32_layer_for_every_recipe_and_epilogue(void **state) {
    for (int r = 0; r < 3; r++)
        for (int gf = 0; gf < 2; gf++)
            for (int variant = 0; variant < 3; variant++) { // plain; GELU forward + DGELU; += everywhere
                struct kiln_model *g = tiny_model();
                struct kiln_model_linear h, none = {0};
                struct kiln_fp8 *f = fp8_hook(g, (enum kiln_fp8_recipe)r, (enum kiln_fp8_fmt)gf, &h);
                static struct layer a, b;
                fill(&a, 1);
                b = a;
                run_layer(&h, &a, variant == 1, variant == 1, variant == 2);
                run_layer(&none, &b, variant == 1, variant == 1, variant == 2);
                const char *what[] = {"out", "dinp", "dweight", "dbias"};
                const float *pa[] = {a.out, a.dinp, a.dw, a.db}, *pb[] = {b.out, b.dinp, b.dw, b.db};
                size_t n[] = {N * OC, N * IC, OC * IC, OC};
                for (int t = 0; t < 4; t++) {
                    double e = test_rel_err(pa[t], pb[t], n[t]);
                    if (!(e < 1e-6))
                        fail_msg("recipe %d grad %d variant %d: %s differs from f32 by %.3g", r, gf, variant,
                                 what[t], e);
                }
                kiln_fp8_free(f);
                kiln_model_free(g);
            }
}

// The straight-through estimator's gradients are the unquantized layer's: dinp = dout W, dW = dout^T x,
// db = column sums of dout (in double). FP8 operands (e4m3: 3 mantissa bits, a rounding error of up to 2^-4
// relative; e5m2: 2^-3) leave the dot products off by their RMS: about 3% and 5% here; the thresholds are
// twice that. The error must also be more than f32's: the GEMMs really are FP8.
static void test_random_operands_give_straight_through_gradients_within_fp8_rounding(void **state) {
    for (int r = 0; r < 3; r++)
        for (int gf = 0; gf < 2; gf++) {
            struct kiln_model *g = tiny_model();
            struct kiln_model_linear h;
            struct kiln_fp8 *f = fp8_hook(g, (enum kiln_fp8_recipe)r, (enum kiln_fp8_fmt)gf, &h);
            static struct layer L;
            fill(&L, 0);
            run_layer(&h, &L, 0, 0, 0);
            static float want_out[N * OC], want_dinp[N * IC], want_dw[OC * IC], want_db[OC];
            for (int i = 0; i < N; i++)
                for (int o = 0; o < OC; o++) {
                    double s = L.b[o];
                    for (int k = 0; k < IC; k++)
                        s += (double)L.x[i * IC + k] * L.w[o * IC + k];
                    want_out[i * OC + o] = (float)s;
                }
            for (int i = 0; i < N; i++)
                for (int k = 0; k < IC; k++) {
                    double s = 0;
                    for (int o = 0; o < OC; o++)
                        s += (double)L.dout[i * OC + o] * L.w[o * IC + k];
                    want_dinp[i * IC + k] = (float)s;
                }
            for (int o = 0; o < OC; o++) {
                double sb = 0;
                for (int k = 0; k < IC; k++) {
                    double s = 0;
                    for (int i = 0; i < N; i++)
                        s += (double)L.dout[i * OC + o] * L.x[i * IC + k];
                    want_dw[o * IC + k] = (float)s;
                }
                for (int i = 0; i < N; i++)
                    sb += L.dout[i * OC + o];
                want_db[o] = (float)sb;
            }
            double tol_fwd = 0.06, tol_bwd = gf == KILN_FP8_E5M2 ? 0.1 : 0.06;
            double e_out = test_rel_err(L.out, want_out, N * OC), e_dinp = test_rel_err(L.dinp, want_dinp, N * IC),
                   e_dw = test_rel_err(L.dw, want_dw, OC * IC), e_db = test_rel_err(L.db, want_db, OC);
            printf("recipe %-10s grad %s: out %.4f dinp %.4f dweight %.4f dbias %.2g\n",
                   kiln_fp8_recipe_name((enum kiln_fp8_recipe)r), gf ? "e5m2" : "e4m3", e_out, e_dinp, e_dw, e_db);
            assert_true(e_out < tol_fwd && e_out > 1e-3);
            assert_true(e_dinp < tol_bwd && e_dinp > 1e-3);
            assert_true(e_dw < tol_bwd && e_dw > 1e-3);
            assert_true(e_db < 1e-5); // the bias gradient is not quantized
            kiln_fp8_free(f);
            kiln_model_free(g);
        }
}

// Delayed scaling: step 1 scales by the tensor's own amax; after it, by the history's largest. An input twice
// as large as any seen saturates its largest elements at 448 (the recipe's known cost), where tensorwise
// scaling would not; the state goes through JSON bit for bit
static void test_delayed_scaling_uses_the_history_and_its_state_round_trips(void **state) {
    struct kiln_model *g = tiny_model(), *g2 = tiny_model();
    struct kiln_model_linear h, ht;
    struct kiln_fp8 *f = fp8_hook(g, KILN_FP8_DELAYED, KILN_FP8_E5M2, &h);
    struct kiln_fp8 *ft = fp8_hook(g2, KILN_FP8_TENSORWISE, KILN_FP8_E5M2, &ht);
    static struct layer a, t;
    fill(&a, 0);
    t = a;
    run_layer(&h, &a, 0, 0, 0);
    run_layer(&ht, &t, 0, 0, 0);
    assert_memory_equal(a.out, t.out, sizeof(a.out)); // the first step: the tensor's own amax, as tensorwise
    kiln_fp8_after_step(f);
    for (int i = 0; i < N * IC; i++)
        a.x[i] *= 2.0f;
    t = a;
    run_layer(&h, &a, 0, 0, 0);
    run_layer(&ht, &t, 0, 0, 0);
    // the largest input element of the step, x_max = 2 amax_1, was cast to 448 instead of 896/...: its row's
    // output moved, every element with |x| small enough is cast alike (448/amax_1 = 2 * 448/amax_2)
    assert_memory_not_equal(a.out, t.out, sizeof(a.out));
    kiln_fp8_after_step(f);

    cJSON *j = kiln_fp8_state_to_json(f);
    assert_non_null(j);
    struct kiln_model *g3 = tiny_model();
    struct kiln_model_linear h3;
    struct kiln_fp8 *f3 = fp8_hook(g3, KILN_FP8_DELAYED, KILN_FP8_E5M2, &h3);
    struct kiln_error e;
    assert_int_equal(kiln_fp8_state_from_json(f3, j, &e), 0);
    cJSON *j3 = kiln_fp8_state_to_json(f3);
    char *s1 = cJSON_PrintUnformatted(j), *s3 = cJSON_PrintUnformatted(j3);
    assert_string_equal(s1, s3);
    static struct layer c, d;
    fill(&c, 0);
    d = c;
    run_layer(&h, &c, 0, 0, 0);
    run_layer(&h3, &d, 0, 0, 0);
    assert_memory_equal(c.out, d.out, sizeof(c.out));
    assert_memory_equal(c.dw, d.dw, sizeof(c.dw));
    // a history of another length is refused with a usage error
    struct kiln_model *g4 = tiny_model();
    struct kiln_model_linear h4;
    struct kiln_fp8_opts o = {.recipe = KILN_FP8_DELAYED, .history = 5};
    struct kiln_fp8 *f4;
    assert_int_equal(kiln_fp8_apply(&f4, g4, &g_be, &o, 2, &e), 0);
    kiln_model_set_linear(g4, NULL, &h4);
    assert_int_equal(kiln_fp8_state_from_json(f4, j, &e), KILN_ERR_USAGE);
    free(s1);
    free(s3);
    cJSON_Delete(j);
    cJSON_Delete(j3);
    kiln_fp8_free(f);
    kiln_fp8_free(ft);
    kiln_fp8_free(f3);
    kiln_fp8_free(f4);
    kiln_model_free(g);
    kiln_model_free(g2);
    kiln_model_free(g3);
    kiln_model_free(g4);
}

// A strategy above FP8 (tensor parallelism's local GEMMs) runs them through it via prev
struct wrap {
    struct kiln_model_linear prev;
    int calls;
};
static void wrap_forward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_args *a) {
    struct wrap *w = user;
    w->calls++;
    kiln_model_linear_forward_with(&w->prev, &g_be, l, k, a);
}
static void wrap_backward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_back_args *a) {
    struct wrap *w = user;
    w->calls++;
    kiln_model_linear_backward_with(&w->prev, &g_be, l, k, a);
}

static void test_a_hook_above_runs_through_fp8_and_fp8_refuses_to_go_above_one(void **state) {
    struct kiln_model *g = tiny_model();
    struct kiln_fp8_opts o = {.recipe = KILN_FP8_TENSORWISE};
    struct kiln_fp8 *f;
    struct kiln_error e;
    assert_int_equal(kiln_fp8_apply(&f, g, &g_be, &o, 2, &e), 0);
    struct wrap w = {0};
    struct kiln_model_linear wh = {.user = &w, .forward = wrap_forward, .backward = wrap_backward}, fh;
    kiln_model_set_linear(g, &wh, &w.prev);
    fh = w.prev;
    static struct layer a, b;
    fill(&a, 0);
    b = a;
    run_layer(&wh, &a, 0, 0, 0);
    run_layer(&fh, &b, 0, 0, 0);
    assert_int_equal(w.calls, 2);
    assert_memory_equal(a.out, b.out, sizeof(a.out));
    assert_memory_equal(a.dw, b.dw, sizeof(a.dw));
    // FP8 on top of another hook: refused, and the other stays installed
    struct kiln_fp8 *f2;
    assert_int_equal(kiln_fp8_apply(&f2, g, &g_be, &o, 2, &e), KILN_ERR_USAGE);
    assert_non_null(strstr(e.msg, "applied first"));
    struct kiln_model_linear now;
    kiln_model_set_linear(g, NULL, &now);
    assert_ptr_equal(now.user, &w);
    kiln_fp8_free(f);
    kiln_model_free(g);
}

// One layer's forward on fx, then its backward on bx (rows_part as given to both): dweight into dw
static void forward_then_backward(const struct kiln_model_linear *h, struct layer *L, const float *fx,
                                  const float *bx, int part) {
    struct kiln_matmul_args a = {.out = L->out, .inp = fx, .weight = L->w, .bias = L->b, .N = N, .IC = IC,
                                 .OC = OC, .rows_part = part};
    kiln_model_linear_forward_with(h, &g_be, 0, KILN_LINEAR_MLP_IN, &a);
    struct kiln_matmul_back_args b = {.dinp = L->dinp, .dweight = L->dw, .dout = L->dout, .inp = bx,
                                      .weight = L->w, .N = N, .IC = IC, .OC = OC, .grad_assign = 1,
                                      .rows_part = part};
    kiln_model_linear_backward_with(h, &g_be, 0, KILN_LINEAR_MLP_IN, &b);
}

// Tensorwise scaling takes a layer's input amax once, in its forward, and the backward's transposed cast of
// the same input reuses it. Where the backward's input is another tensor (another place, or rows of a part
// that tensor parallelism's ring may refill in place), the backward takes the amax of what it is given: its
// weight gradient equals that of a layer that saw only that tensor. A reuse there would scale by the
// forward's smaller amax and saturate.
static void test_the_backward_reuses_the_forward_input_amax_only_for_the_same_whole_input(void **state) {
    static struct layer L, R;
    static float big[N * IC];
    fill(&L, 0);
    for (int i = 0; i < N * IC; i++)
        big[i] = 8.0f * L.x[i];
    for (int c = 0; c < 3; c++) { // the same input; another array; the same array refilled, rows_part
        struct kiln_model *g = tiny_model(), *g2 = tiny_model();
        struct kiln_model_linear h, h2;
        struct kiln_fp8 *f = fp8_hook(g, KILN_FP8_TENSORWISE, KILN_FP8_E4M3, &h);
        struct kiln_fp8 *f2 = fp8_hook(g2, KILN_FP8_TENSORWISE, KILN_FP8_E4M3, &h2);
        R = L;
        static float x[N * IC];
        memcpy(x, L.x, sizeof(x));
        const float *bx = c == 0 ? x : big;
        if (c == 2) { // the forward on x, then x refilled with the larger rows before the backward
            struct kiln_matmul_args a = {.out = L.out, .inp = x, .weight = L.w, .bias = L.b, .N = N, .IC = IC,
                                         .OC = OC, .rows_part = 1};
            kiln_model_linear_forward_with(&h, &g_be, 0, KILN_LINEAR_MLP_IN, &a);
            memcpy(x, big, sizeof(x));
            struct kiln_matmul_back_args b = {.dinp = L.dinp, .dweight = L.dw, .dout = L.dout, .inp = x,
                                              .weight = L.w, .N = N, .IC = IC, .OC = OC, .grad_assign = 1,
                                              .rows_part = 1};
            kiln_model_linear_backward_with(&h, &g_be, 0, KILN_LINEAR_MLP_IN, &b);
        } else {
            forward_then_backward(&h, &L, x, bx, 0);
        }
        forward_then_backward(&h2, &R, bx, bx, c == 2);
        if (memcmp(L.dw, R.dw, sizeof(L.dw)))
            fail_msg("case %d: the weight gradient differs from a layer that saw only the backward's input", c);
        kiln_fp8_free(f);
        kiln_fp8_free(f2);
        kiln_model_free(g);
        kiln_model_free(g2);
    }
}

static int setup(void **state) {
    struct kiln_backend_opts o = {.threads = 1};
    struct kiln_error e;
    if (kiln_cpu_backend_open(&o, &g_be, &e))
        return -1;
    g_rng = test_seed() | 1;
    return 0;
}

static int teardown(void **state) {
    kiln_backend_close(&g_be);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_operands_give_the_f32_layer_for_every_recipe_and_epilogue),
        cmocka_unit_test(test_random_operands_give_straight_through_gradients_within_fp8_rounding),
        cmocka_unit_test(test_delayed_scaling_uses_the_history_and_its_state_round_trips),
        cmocka_unit_test(test_a_hook_above_runs_through_fp8_and_fp8_refuses_to_go_above_one),
        cmocka_unit_test(test_the_backward_reuses_the_forward_input_amax_only_for_the_same_whole_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
