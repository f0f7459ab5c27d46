// The ops that the parallel block's fused projection calls on column slices of wider rows (attention forward,
// backward and decode, GELU, SwiGLU, the matmul backward's dinp and DGELU input): a strided call gives
// bitwise the numbers of the dense call on the copied-out slice, reads nothing outside its slice (those
// elements are NaN and would propagate), and writes nothing outside it (those elements stay NaN).
#include "test_cpu_common.h"

#include <math.h>

// A (N, ld) buffer, NaN everywhere but columns [off, off + w), which hold dense (N, w) (or NaN if it is
// NULL).
static float *widen(const float *dense, int N, int w, int ld, int off) {
    float *x = falloc((size_t)N * ld);
    for (size_t i = 0; i < (size_t)N * ld; i++)
        x[i] = NAN;
    if (dense)
        for (int n = 0; n < N; n++)
            memcpy(x + (size_t)n * ld + off, dense + (size_t)n * w, (size_t)w * sizeof(float));
    return x;
}

// Columns [off, off + w) of wide equal dense bitwise; every other element is still NaN.
static void expect_slice(const float *wide, const float *dense, int N, int w, int ld, int off,
                         const char *what) {
    for (int n = 0; n < N; n++)
        for (int i = 0; i < ld; i++) {
            float got = wide[(size_t)n * ld + i];
            if (i >= off && i < off + w) {
                if (memcmp(&got, &dense[(size_t)n * w + i - off], sizeof(float)) != 0)
                    fail_msg("%s: row %d column %d: %.9g, the dense call gives %.9g", what, n, i - off, got,
                             dense[(size_t)n * w + i - off]);
            } else if (!isnan(got)) {
                fail_msg("%s: row %d column %d outside the slice was written (%.9g)", what, n, i, got);
            }
        }
}

static void expect_same(const float *a, const float *b, size_t n, const char *what) {
    if (memcmp(a, b, n * sizeof(float)) != 0)
        fail_msg("%s: the strided call differs from the dense one", what);
}

// ---- attention -----------------------------------------------------------------------------------------

struct attn_case {
    int B, T, NH, NKV, HS;
    enum kiln_pos pos;
    int extra; // columns after the qkv slice in each row (the MLP's part of a fused row)
};

static void attention_case(const struct attn_case *c) {
    int W = (c->NH + 2 * c->NKV) * c->HS, ld = W + c->extra, BT = c->B * c->T, AO = c->NH * c->HS;
    char what[160];
    snprintf(what, sizeof(what), "attention B=%d T=%d NH=%d NKV=%d HS=%d pos=%d stride=%d", c->B, c->T, c->NH,
             c->NKV, c->HS, (int)c->pos, ld);
    float *qkv = frand((size_t)BT * W, 1), *wqkv = widen(qkv, BT, W, ld, 0);
    float *out = falloc((size_t)BT * AO), *lse = falloc((size_t)c->B * c->NH * c->T);
    float *sout = falloc((size_t)BT * AO), *slse = falloc((size_t)c->B * c->NH * c->T);
    struct kiln_attn_args a = {.out = out,
                               .lse = lse,
                               .qkv = qkv,
                               .B = c->B,
                               .T = c->T,
                               .NH = c->NH,
                               .NKV = c->NKV,
                               .HS = c->HS,
                               .pos = c->pos,
                               .rope_theta = 10000.0f};
    g_be.ops->attention_forward(g_be.ctx, &a);
    struct kiln_attn_args sa = a;
    sa.out = sout;
    sa.lse = slse;
    sa.qkv = wqkv;
    sa.qkv_stride = ld;
    g_be.ops->attention_forward(g_be.ctx, &sa);
    expect_same(sout, out, (size_t)BT * AO, what);
    expect_same(slse, lse, (size_t)c->B * c->NH * c->T, what);

    // backward: dqkv into a slice of NaN rows of another stride (its own buffer, as the model's [dqkv | dfc])
    int dld = ld + 8;
    float *dout = frand((size_t)BT * AO, 1), *dqkv = falloc((size_t)BT * W),
          *wdqkv = widen(NULL, BT, W, dld, 0);
    struct kiln_attn_back_args b = {.dqkv = dqkv,
                                    .dout = dout,
                                    .qkv = qkv,
                                    .out = out,
                                    .lse = lse,
                                    .B = c->B,
                                    .T = c->T,
                                    .NH = c->NH,
                                    .NKV = c->NKV,
                                    .HS = c->HS,
                                    .pos = c->pos,
                                    .rope_theta = 10000.0f};
    g_be.ops->attention_backward(g_be.ctx, &b);
    struct kiln_attn_back_args sb = b;
    sb.dqkv = wdqkv;
    sb.qkv = wqkv;
    sb.qkv_stride = ld;
    sb.dqkv_stride = dld;
    g_be.ops->attention_backward(g_be.ctx, &sb);
    expect_slice(wdqkv, dqkv, BT, W, dld, 0, what);

    // decode: B rows of qkv, one token each
    int maxT = c->T + 1, pos = c->T - 1, KW = c->NKV * c->HS;
    float *kc = frand((size_t)c->B * maxT * KW, 1), *vc = frand((size_t)c->B * maxT * KW, 1);
    float *skc = falloc((size_t)c->B * maxT * KW), *svc = falloc((size_t)c->B * maxT * KW);
    memcpy(skc, kc, (size_t)c->B * maxT * KW * sizeof(float));
    memcpy(svc, vc, (size_t)c->B * maxT * KW * sizeof(float));
    struct kiln_attn_decode_args d = {.out = out,
                                      .kcache = kc,
                                      .vcache = vc,
                                      .qkv = qkv,
                                      .B = c->B,
                                      .maxT = maxT,
                                      .pos = pos,
                                      .NH = c->NH,
                                      .NKV = c->NKV,
                                      .HS = c->HS,
                                      .pos_kind = c->pos,
                                      .rope_theta = 10000.0f};
    g_be.ops->attention_decode(g_be.ctx, &d);
    struct kiln_attn_decode_args sd = d;
    sd.out = sout;
    sd.kcache = skc;
    sd.vcache = svc;
    sd.qkv = wqkv;
    sd.qkv_stride = ld;
    g_be.ops->attention_decode(g_be.ctx, &sd);
    expect_same(sout, out, (size_t)c->B * AO, what);
    expect_same(skc, kc, (size_t)c->B * maxT * KW, what);
    expect_same(svc, vc, (size_t)c->B * maxT * KW, what);
    ffree(qkv), ffree(wqkv), ffree(out), ffree(lse), ffree(sout), ffree(slse), ffree(dout), ffree(dqkv);
    ffree(wdqkv), ffree(kc), ffree(vc), ffree(skc), ffree(svc);
}

static void test_strided_attention_equals_dense_and_stays_in_its_slice(void **state) {
    struct attn_case cases[] = {
        {2, 7, 4, 4, 8, KILN_POS_LEARNED, 32}, {2, 9, 4, 2, 8, KILN_POS_ROPE, 24},
        {1, 13, 6, 1, 16, KILN_POS_ALIBI, 5},  {2, 5, 3, 3, 10, KILN_POS_NONE, 1},
        {1, 8, 4, 2, 8, KILN_POS_ROPE, 0}, // stride given, equal to the width
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        attention_case(&cases[i]);
}

// ---- activations ----------------------------------------------------------------------------------------

static void test_strided_gelu_and_swiglu_equal_dense_and_stay_in_their_slice(void **state) {
    int shapes[][4] = {{7, 24, 96, 48}, {5, 33, 70, 3}, {4, 16, 48, 0}}; // N, H, row stride, column offset
    for (int s = 0; s < 3; s++) {
        int N = shapes[s][0], H = shapes[s][1], ld = shapes[s][2], off = shapes[s][3];
        // gelu: out (N, H) from columns [off, off + H) of rows ld wide
        float *pre = frand((size_t)N * H, 1.5f), *wpre = widen(pre, N, H, ld, off);
        float *out = falloc((size_t)N * H), *sout = falloc((size_t)N * H);
        struct kiln_gelu_args ga = {.out = out, .inp = pre, .N = N, .H = H};
        g_be.ops->gelu_forward(g_be.ctx, &ga);
        struct kiln_gelu_args sga = {.out = sout, .inp = wpre + off, .N = N, .H = H, .inp_stride = ld};
        g_be.ops->gelu_forward(g_be.ctx, &sga);
        expect_same(sout, out, (size_t)N * H, "gelu_forward");

        // swiglu: [gate | up] (N, 2H) at column off of rows ld + H wide; dinp into another such buffer
        int sld = ld + H;
        float *inp = frand((size_t)N * 2 * H, 2), *winp = widen(inp, N, 2 * H, sld, off);
        struct kiln_swiglu_args fa = {.out = out, .inp = inp, .N = N, .H = H};
        g_be.ops->swiglu_forward(g_be.ctx, &fa);
        struct kiln_swiglu_args sfa = {.out = sout, .inp = winp + off, .N = N, .H = H, .inp_stride = sld};
        g_be.ops->swiglu_forward(g_be.ctx, &sfa);
        expect_same(sout, out, (size_t)N * H, "swiglu_forward");
        float *dout = frand((size_t)N * H, 1), *dinp = falloc((size_t)N * 2 * H);
        float *wdinp = widen(NULL, N, 2 * H, sld + 3, off);
        struct kiln_swiglu_back_args ba = {.dinp = dinp, .dout = dout, .inp = inp, .N = N, .H = H};
        g_be.ops->swiglu_backward(g_be.ctx, &ba);
        struct kiln_swiglu_back_args sba = {.dinp = wdinp + off,
                                            .dout = dout,
                                            .inp = winp + off,
                                            .N = N,
                                            .H = H,
                                            .inp_stride = sld,
                                            .dinp_stride = sld + 3};
        g_be.ops->swiglu_backward(g_be.ctx, &sba);
        expect_slice(wdinp, dinp, N, 2 * H, sld + 3, off, "swiglu_backward");
        ffree(pre), ffree(wpre), ffree(out), ffree(sout), ffree(inp), ffree(winp), ffree(dout), ffree(dinp);
        ffree(wdinp);
    }
}

// ---- matmul backward --------------------------------------------------------------------------------------

// dinp (a slice of wider rows) = or += dout @ W, times gelu'(pre) with pre another slice; dweight and dbias
// as the dense call.
static void matmul_back_case(int N, int IC, int OC, int ld, int off, int gelu, int acc) {
    char what[128];
    snprintf(what, sizeof(what), "matmul_backward N=%d IC=%d OC=%d stride=%d off=%d gelu=%d acc=%d", N, IC,
             OC, ld, off, gelu, acc);
    float *dout = frand((size_t)N * OC, 1), *inp = frand((size_t)N * IC, 1),
          *w = frand((size_t)OC * IC, 0.3f);
    float *pre = frand((size_t)N * IC, 1.5f), *wpre = widen(pre, N, IC, ld + 5, off);
    float *dinp = frand((size_t)N * IC, 1), *wdinp = widen(acc ? dinp : NULL, N, IC, ld, off);
    float *dw = frand((size_t)OC * IC, 1), *db = frand(OC, 1), *sdw = falloc((size_t)OC * IC),
          *sdb = falloc(OC);
    memcpy(sdw, dw, (size_t)OC * IC * sizeof(float));
    memcpy(sdb, db, (size_t)OC * sizeof(float));
    struct kiln_matmul_back_args a = {.dinp = dinp,
                                      .dweight = dw,
                                      .dbias = db,
                                      .dout = dout,
                                      .inp = inp,
                                      .weight = w,
                                      .dinp_gelu_pre = gelu ? pre : NULL,
                                      .N = N,
                                      .IC = IC,
                                      .OC = OC,
                                      .dinp_accumulate = acc};
    g_be.ops->matmul_backward(g_be.ctx, &a);
    struct kiln_matmul_back_args sa = a;
    sa.dinp = wdinp + off;
    sa.dweight = sdw;
    sa.dbias = sdb;
    sa.dinp_gelu_pre = gelu ? wpre + off : NULL;
    sa.dinp_stride = ld;
    sa.gelu_pre_stride = ld + 5;
    g_be.ops->matmul_backward(g_be.ctx, &sa);
    expect_slice(wdinp, dinp, N, IC, ld, off, what);
    expect_same(sdw, dw, (size_t)OC * IC, what);
    expect_same(sdb, db, OC, what);
    ffree(dout), ffree(inp), ffree(w), ffree(pre), ffree(wpre), ffree(dinp), ffree(wdinp), ffree(dw),
        ffree(db);
    ffree(sdw), ffree(sdb);
}

static void test_strided_matmul_backward_equals_dense_and_stays_in_its_slice(void **state) {
    for (int gelu = 0; gelu <= 1; gelu++)
        for (int acc = 0; acc <= 1; acc++) {
            matmul_back_case(13, 40, 24, 64, 24, gelu, acc);
            matmul_back_case(7, 17, 33, 20, 3, gelu, acc); // odd sizes: the GEMM's edge tiles
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strided_attention_equals_dense_and_stays_in_its_slice),
        cmocka_unit_test(test_strided_gelu_and_swiglu_equal_dense_and_stay_in_their_slice),
        cmocka_unit_test(test_strided_matmul_backward_equals_dense_and_stays_in_its_slice),
    };
    return cmocka_run_group_tests(tests, cpu_group_setup, cpu_group_teardown);
}
