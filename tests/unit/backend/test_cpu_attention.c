// The CPU backend's attention ops as specifications: forward against a naive O(T^2) softmax attention written
// here in double (with RoPE rotated by explicit cos/sin and ALiBi slopes from the paper's construction),
// backward against central finite differences of that reference, decode against the forward's rows, and
// bitwise determinism across thread counts.
#include "test_cpu_common.h"

#include "backend/cpu/cpu_internal.h"

#include <math.h>

// ---- the softmax's exponential ----------------------------------------------------------------------------

// ulps between two positive normal floats
static long ulps_apart(float a, float b) {
    union {
        float f;
        int32_t i;
    } ua = {.f = a}, ub = {.f = b};
    long d = (long)ua.i - (long)ub.i;
    return d < 0 ? -d : d;
}

// kiln_cpu_exp_neg: within 2 ulp of the exact e^x over the softmax's range, exact at 0, 0 below FLT_MIN's
// logarithm and for -inf, NaN kept; the array form (vectorized) gives the scalar's bits in every lane.
static void test_exp_neg_is_within_2_ulp_and_the_array_form_matches_the_scalar(void **state) {
    (void)state;
    long worst = 0;
    enum { N = 1 << 16 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) // evenly over [-87, 0], and the ends
        x[i] = i == 0 ? 0.0f : -87.0f * (float)i / (float)(N - 1);
    for (int i = 0; i < N; i++) {
        float got = kiln_cpu_exp_neg(x[i]), want = (float)exp((double)x[i]);
        long u = ulps_apart(got, want);
        worst = u > worst ? u : worst;
        y[i] = x[i] + 3.25f; // shifted back by kiln_cpu_exp_shifted
    }
    assert_true(worst <= 2);
    assert_true(kiln_cpu_exp_neg(0.0f) == 1.0f);
    assert_true(kiln_cpu_exp_neg(-88.0f) == 0.0f && kiln_cpu_exp_neg(-1e30f) == 0.0f);
    assert_true(kiln_cpu_exp_neg(-INFINITY) == 0.0f);
    assert_true(isnan(kiln_cpu_exp_neg(NAN)));
    assert_true(kiln_cpu_exp_neg(-87.0f) > 0.0f && isnormal(kiln_cpu_exp_neg(-87.3f)));
    kiln_cpu_exp_shifted(y, N, 3.25f);
    for (int i = 0; i < N; i++)
        if (memcmp(&y[i], &(float){kiln_cpu_exp_neg(x[i] + 3.25f - 3.25f)}, sizeof(float)))
            fail_msg("lane %d: %.9g against the scalar's %.9g", i, (double)y[i],
                     (double)kiln_cpu_exp_neg(x[i] + 3.25f - 3.25f));
    float odd[7] = {-1, -2, NAN, -INFINITY, -0.5f, -100, 0}; // a tail shorter than a vector, NaN and -inf in it
    kiln_cpu_exp_shifted(odd, 7, 0.0f);
    assert_true(isnan(odd[2]) && odd[3] == 0.0f && odd[5] == 0.0f && odd[6] == 1.0f);
    assert_true(ulps_apart(odd[0], (float)exp(-1.0)) <= 2 && ulps_apart(odd[4], (float)exp(-0.5)) <= 2);
}

// ---- the reference -------------------------------------------------------------------------------------

// ALiBi slopes as in the paper's reference code (get_slopes): for a power of two n, a geometric sequence
// starting at and with ratio 2^(-2^-(log2(n) - 3)); otherwise the closest power of two below, followed by
// every other slope of get_slopes(2 * closest).
static void slopes_pow2(int n, double *out) {
    double start = pow(2.0, -pow(2.0, -(log2((double)n) - 3)));
    for (int i = 0; i < n; i++)
        out[i] = start * pow(start, i);
}
static void alibi_slopes_ref(int n, double *out) {
    if ((n & (n - 1)) == 0) {
        slopes_pow2(n, out);
        return;
    }
    int closest = 1 << (int)floor(log2((double)n));
    slopes_pow2(closest, out);
    double extra[256];
    alibi_slopes_ref(2 * closest, extra);
    for (int i = 0; i < n - closest; i++)
        out[closest + i] = extra[2 * i];
}

struct attn_ref {
    double *qkv;       // (B, T, (NH + 2 NKV) HS)
    double *out, *lse; // (B, T, NH HS), (B, NH, T)
    double *rot;       // scratch (B, T, (NH + 2 NKV) HS)
    const float *R;    // (B, T, NH HS)
    int B, T, NH, NKV, HS;
    enum kiln_pos pos;
    double theta;
};

// GPT-NeoX rotation of the pairs (i, i + HS/2) by t * theta^(-2i/HS)
static void rotate_d(double *x, int HS, int t, double theta) {
    for (int i = 0; i < HS / 2; i++) {
        double ang = t * pow(theta, -2.0 * i / HS), c = cos(ang), s = sin(ang);
        double x1 = x[i], x2 = x[i + HS / 2];
        x[i] = x1 * c - x2 * s;
        x[i + HS / 2] = x2 * c + x1 * s;
    }
}

static double attn_ref_loss(void *p) {
    struct attn_ref *r = p;
    int T = r->T, NH = r->NH, NKV = r->NKV, HS = r->HS, W = (NH + 2 * NKV) * HS;
    assert_true(T <= 256 && NH <= 64); // (sc and slopes below)
    memcpy(r->rot, r->qkv, sizeof(double) * r->B * T * W);
    if (r->pos == KILN_POS_ROPE)
        for (int bt = 0; bt < r->B * T; bt++)
            for (int h = 0; h < NH + NKV; h++)
                rotate_d(r->rot + (size_t)bt * W + h * HS, HS, bt % T, r->theta);
    double slopes[64] = {0}, sc[256]; // (heads, and keys: T <= 256)
    if (r->pos == KILN_POS_ALIBI)
        alibi_slopes_ref(NH, slopes);
    for (int b = 0; b < r->B; b++)
        for (int h = 0; h < NH; h++) {
            int kvh = h / (NH / NKV);
            for (int t = 0; t < T; t++) {
                const double *q = r->rot + ((size_t)b * T + t) * W + h * HS;
                double mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const double *k = r->rot + ((size_t)b * T + s) * W + (NH + kvh) * HS;
                    double d = 0;
                    for (int i = 0; i < HS; i++)
                        d += q[i] * k[i];
                    sc[s] = d / sqrt((double)HS) - slopes[h] * (t - s);
                    mx = fmax(mx, sc[s]);
                }
                double sum = 0;
                for (int s = 0; s <= t; s++)
                    sum += exp(sc[s] - mx);
                r->lse[((size_t)b * NH + h) * T + t] = mx + log(sum);
                double *o = r->out + ((size_t)b * T + t) * NH * HS + h * HS;
                for (int i = 0; i < HS; i++) {
                    double acc = 0;
                    for (int s = 0; s <= t; s++)
                        acc += exp(sc[s] - mx) / sum *
                               r->rot[((size_t)b * T + s) * W + (NH + NKV + kvh) * HS + i];
                    o[i] = acc;
                }
            }
        }
    return r->R ? dot_r(r->out, r->R, (size_t)r->B * T * NH * HS) : 0.0;
}

static void ref_init(struct attn_ref *r, const float *qkv, const float *R, int B, int T, int NH, int NKV,
                     int HS, enum kiln_pos pos) {
    size_t W = (size_t)(NH + 2 * NKV) * HS;
    *r = (struct attn_ref){d_of(qkv, B * T * W),
                           malloc(sizeof(double) * B * T * NH * HS),
                           malloc(sizeof(double) * B * NH * T),
                           malloc(sizeof(double) * B * T * W),
                           R,
                           B,
                           T,
                           NH,
                           NKV,
                           HS,
                           pos,
                           10000.0};
}
static void ref_free(struct attn_ref *r) {
    free(r->qkv), free(r->out), free(r->lse), free(r->rot);
}

static const char *pos_name(enum kiln_pos p) {
    return p == KILN_POS_ROPE    ? "rope"
           : p == KILN_POS_ALIBI ? "alibi"
           : p == KILN_POS_NONE  ? "none"
                                 : "learned";
}

// ---- tests ---------------------------------------------------------------------------------------------

static void test_alibi_slopes_follow_the_paper(void **state) {
    for (int h = 0; h < 8; h++) // NH = 8: 2^-1 .. 2^-8
        assert_true(fabs(kiln_cpu_alibi_slope(h, 8) - ldexp(1.0, -(h + 1))) <= 1e-7 * ldexp(1.0, -(h + 1)));
    int nhs[] = {12, 6, 20, 1, 2, 3, 16, 25};
    for (int k = 0; k < 8; k++) {
        double ref[64];
        alibi_slopes_ref(nhs[k], ref);
        for (int h = 0; h < nhs[k]; h++)
            if (fabs(kiln_cpu_alibi_slope(h, nhs[k]) - ref[h]) > 1e-6 * ref[h])
                fail_msg("alibi slope NH=%d h=%d: %.9g, paper %.9g", nhs[k], h,
                         kiln_cpu_alibi_slope(h, nhs[k]), ref[h]);
    }
    // NH = 12 spelled out: 2^-1..2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    assert_true(fabs(kiln_cpu_alibi_slope(8, 12) - pow(2, -0.5)) < 1e-7);
    assert_true(fabs(kiln_cpu_alibi_slope(11, 12) - pow(2, -3.5)) < 1e-7);
}

struct attn_cfg {
    int B, T, NH, NKV, HS;
    enum kiln_pos pos;
};

static void run_forward(const struct attn_cfg *c, const float *qkv, float **out, float **lse) {
    *out = falloc((size_t)c->B * c->T * c->NH * c->HS);
    *lse = falloc((size_t)c->B * c->NH * c->T);
    struct kiln_attn_args a = {.out = *out,
                               .lse = *lse,
                               .qkv = qkv,
                               .B = c->B,
                               .T = c->T,
                               .NH = c->NH,
                               .NKV = c->NKV,
                               .HS = c->HS,
                               .pos = c->pos,
                               .rope_theta = 10000.0f};
    g_be.ops->attention_forward(g_be.ctx, &a);
}

// The backward's arguments for c's shape (dense rows)
static struct kiln_attn_back_args back_args(const struct attn_cfg *c, float *dqkv, const float *dout,
                                            const float *qkv, const float *out, const float *lse) {
    return (struct kiln_attn_back_args){.dqkv = dqkv,
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
}

static void test_attention_forward_matches_naive_softmax_attention(void **state) {
    static const enum kiln_pos poss[] = {KILN_POS_LEARNED, KILN_POS_NONE, KILN_POS_ROPE, KILN_POS_ALIBI};
    // (T = 70: two tiles of 64 query rows, the second past the first's keys)
    static const int nkvs[] = {6, 2, 1}, ts[] = {7, 13, 1, 40, 70}, hss[] = {24, 16};
    for (int p = 0; p < 4; p++)
        for (int k = 0; k < 3; k++)
            for (int t = 0; t < 5; t++)
                for (int s = 0; s < 2; s++) {
                    struct attn_cfg c = {2,       ts[t],  6,
                                         nkvs[k], hss[s], poss[p]}; // NH = 6: ALiBi off a power of 2
                    size_t W = (size_t)(c.NH + 2 * c.NKV) * c.HS;
                    float *qkv = frand((size_t)c.B * c.T * W, 1), *out, *lse;
                    run_forward(&c, qkv, &out, &lse);
                    struct attn_ref r;
                    ref_init(&r, qkv, NULL, c.B, c.T, c.NH, c.NKV, c.HS, c.pos);
                    attn_ref_loss(&r);
                    char what[128];
                    snprintf(what, sizeof(what), "attention out T=%d NKV=%d HS=%d pos=%s", c.T, c.NKV, c.HS,
                             pos_name(c.pos));
                    check_vs_double(out, r.out, (size_t)c.B * c.T * c.NH * c.HS, 2e-6, what);
                    snprintf(what, sizeof(what), "attention lse T=%d NKV=%d HS=%d pos=%s", c.T, c.NKV, c.HS,
                             pos_name(c.pos));
                    check_vs_double(lse, r.lse, (size_t)c.B * c.NH * c.T, 2e-6, what);
                    ref_free(&r);
                    ffree(qkv), ffree(out), ffree(lse);
                }
}

// RoPE and ALiBi must change the result (the reference above would agree with an op that ignores them only if
// the reference ignored them too; this pins down that both sides act).
static void test_rope_and_alibi_change_the_output(void **state) {
    struct attn_cfg c = {1, 9, 4, 2, 16, KILN_POS_NONE};
    float *qkv = frand((size_t)c.T * (c.NH + 2 * c.NKV) * c.HS, 1), *o0, *l0, *o1, *l1, *o2, *l2;
    run_forward(&c, qkv, &o0, &l0);
    c.pos = KILN_POS_ROPE;
    run_forward(&c, qkv, &o1, &l1);
    c.pos = KILN_POS_ALIBI;
    run_forward(&c, qkv, &o2, &l2);
    size_t n = (size_t)c.T * c.NH * c.HS;
    assert_true(test_rel_err(o1, o0, n) > 1e-3);
    assert_true(test_rel_err(o2, o0, n) > 1e-3);
    // row 0 attends to itself only: position encodings cannot change it
    assert_memory_equal(o0, o2, c.NH * c.HS * sizeof(float));
    ffree(qkv), ffree(o0), ffree(l0), ffree(o1), ffree(l1), ffree(o2), ffree(l2);
}

static void check_attention_gradient(const struct attn_cfg *c) {
    size_t W = (size_t)(c->NH + 2 * c->NKV) * c->HS, n = (size_t)c->B * c->T * W;
    float *qkv = frand(n, 1), *out, *lse, *R = frand((size_t)c->B * c->T * c->NH * c->HS, 1);
    run_forward(c, qkv, &out, &lse);
    float *dqkv = frand(n, 1); // overwritten
    struct kiln_attn_back_args ba = back_args(c, dqkv, R, qkv, out, lse);
    g_be.ops->attention_backward(g_be.ctx, &ba);
    struct attn_ref r;
    ref_init(&r, qkv, R, c->B, c->T, c->NH, c->NKV, c->HS, c->pos);
    double *g = malloc(sizeof(double) * n);
    numgrad(attn_ref_loss, &r, r.qkv, n, 1e-5, g);
    char what[160];
    snprintf(what, sizeof(what), "dqkv B=%d T=%d NH=%d NKV=%d HS=%d pos=%s", c->B, c->T, c->NH, c->NKV, c->HS,
             pos_name(c->pos));
    // fp32 backward against double central differences (truncation error ~1e-10): 1e-4 leaves room for fp32
    // sums over T keys, and catches any wrong term (those show up at 1e-2 or more)
    check_vs_double(dqkv, g, n, 1e-4, what);
    free(g);
    ref_free(&r);
    ffree(qkv), ffree(out), ffree(lse), ffree(R), ffree(dqkv);
}

static void test_attention_gradients_match_finite_differences(void **state) {
    static const enum kiln_pos poss[] = {KILN_POS_LEARNED, KILN_POS_ROPE, KILN_POS_ALIBI};
    static const int nkvs[] = {4, 2, 1};
    for (int p = 0; p < 3; p++)
        for (int k = 0; k < 3; k++) {
            struct attn_cfg c7 = {2, 7, 4, nkvs[k], 24, poss[p]}, c13 = {1, 13, 4, nkvs[k], 24, poss[p]};
            check_attention_gradient(&c7);
            check_attention_gradient(&c13);
        }
    struct attn_cfg c = {1, 5, 3, 3, 10, KILN_POS_NONE}; // NH = 3: ALiBi-free odd heads, HS = 10
    check_attention_gradient(&c);
    struct attn_cfg ca = {1, 6, 3, 1, 10, KILN_POS_ALIBI};
    check_attention_gradient(&ca);
    // batch x key/value heads >= 8: the one-pass backward, over two tiles of query rows
    struct attn_cfg c1 = {2, 66, 4, 4, 2, KILN_POS_ALIBI};
    check_attention_gradient(&c1);
}

// The two backwards agree: a batch of 8 sequences of one key/value head takes the one-pass backward (8
// tasks), each sequence alone the two-pass one; over three tiles of query rows, with every position kind.
static void test_attention_one_pass_backward_matches_two_pass(void **state) {
    static const enum kiln_pos poss[] = {KILN_POS_LEARNED, KILN_POS_ROPE, KILN_POS_ALIBI};
    for (int p = 0; p < 3; p++) {
        struct attn_cfg c = {8, 150, 2, 1, 16, poss[p]};
        size_t W = (size_t)(c.NH + 2 * c.NKV) * c.HS, per = (size_t)c.T * W, C = (size_t)c.NH * c.HS;
        float *qkv = frand(c.B * per, 1), *dy = frand((size_t)c.B * c.T * C, 1), *out, *lse;
        float *d8 = falloc(c.B * per), *d1 = falloc(c.B * per);
        run_forward(&c, qkv, &out, &lse);
        struct kiln_attn_back_args ba = back_args(&c, d8, dy, qkv, out, lse);
        g_be.ops->attention_backward(g_be.ctx, &ba);
        for (int b = 0; b < c.B; b++) {
            struct kiln_attn_back_args one = ba;
            one.B = 1;
            one.dqkv = d1 + b * per;
            one.dout = dy + (size_t)b * c.T * C;
            one.qkv = qkv + b * per;
            one.out = out + (size_t)b * c.T * C;
            one.lse = lse + (size_t)b * c.NH * c.T;
            g_be.ops->attention_backward(g_be.ctx, &one);
        }
        char what[96];
        snprintf(what, sizeof(what), "one-pass against two-pass backward, pos=%s", pos_name(c.pos));
        assert_rel_err_le(d8, d1, c.B * per, 1e-5, what);
        ffree(qkv), ffree(dy), ffree(out), ffree(lse), ffree(d8), ffree(d1);
    }
}

// Decoding positions 0..T-1 one at a time reproduces the forward's rows, and the caches hold k (rotated) and
// v.
static void test_attention_decode_reproduces_forward_rows(void **state) {
    static const enum kiln_pos poss[] = {KILN_POS_LEARNED, KILN_POS_ROPE, KILN_POS_ALIBI};
    for (int p = 0; p < 3; p++) {
        struct attn_cfg c = {2, 11, 6, 2, 24, poss[p]};
        int maxT = 16, W = (c.NH + 2 * c.NKV) * c.HS, KW = c.NKV * c.HS, C = c.NH * c.HS;
        float *qkv = frand((size_t)c.B * c.T * W, 1), *out, *lse;
        run_forward(&c, qkv, &out, &lse);
        float *kc = falloc((size_t)c.B * maxT * KW), *vc = falloc((size_t)c.B * maxT * KW);
        float *step_qkv = falloc((size_t)c.B * W), *step_out = falloc((size_t)c.B * C);
        for (int t = 0; t < c.T; t++) {
            for (int b = 0; b < c.B; b++)
                memcpy(step_qkv + (size_t)b * W, qkv + ((size_t)b * c.T + t) * W, W * sizeof(float));
            struct kiln_attn_decode_args da = {.out = step_out,
                                               .kcache = kc,
                                               .vcache = vc,
                                               .qkv = step_qkv,
                                               .B = c.B,
                                               .maxT = maxT,
                                               .pos = t,
                                               .NH = c.NH,
                                               .NKV = c.NKV,
                                               .HS = c.HS,
                                               .pos_kind = c.pos,
                                               .rope_theta = 10000.0f};
            g_be.ops->attention_decode(g_be.ctx, &da);
            for (int b = 0; b < c.B; b++) {
                char what[96];
                snprintf(what, sizeof(what), "decode pos=%d b=%d %s", t, b, pos_name(c.pos));
                // the same arithmetic as the forward: equal up to rounding (in practice bitwise)
                assert_rel_err_le(step_out + (size_t)b * C, out + ((size_t)b * c.T + t) * C, C, 1e-6, what);
            }
        }
        for (int b = 0; b < c.B; b++)
            for (int t = 0; t < c.T; t++) {
                const float *row = qkv + ((size_t)b * c.T + t) * W;
                assert_memory_equal(vc + ((size_t)b * maxT + t) * KW, row + (c.NH + c.NKV) * c.HS,
                                    KW * sizeof(float));
                double k[256];
                for (int i = 0; i < KW; i++)
                    k[i] = row[c.NH * c.HS + i];
                if (c.pos == KILN_POS_ROPE)
                    for (int h = 0; h < c.NKV; h++)
                        rotate_d(k + h * c.HS, c.HS, t, 10000.0);
                check_vs_double(kc + ((size_t)b * maxT + t) * KW, k, KW, 1e-6, "k cache");
            }
        for (int b = 0; b < c.B; b++) // positions past the last decoded one are untouched
            for (size_t i = (size_t)c.T * KW; i < (size_t)maxT * KW; i++)
                assert_true(kc[(size_t)b * maxT * KW + i] == 0.0f && vc[(size_t)b * maxT * KW + i] == 0.0f);
        ffree(qkv), ffree(out), ffree(lse), ffree(kc), ffree(vc), ffree(step_qkv), ffree(step_out);
    }
}

static void check_bitwise_with_1_and_2_threads(struct attn_cfg c) {
    size_t W = (size_t)(c.NH + 2 * c.NKV) * c.HS, n = (size_t)c.B * c.T * W,
           no = (size_t)c.B * c.T * c.NH * c.HS;
    float *qkv = frand(n, 1), *dout = frand(no, 1);
    float *out[2], *lse[2], *dqkv[2];
    for (int k = 0; k < 2; k++) {
        struct kiln_backend be;
        struct kiln_error err;
        struct kiln_backend_opts opts = {.threads = k + 1};
        assert_int_equal(kiln_cpu_backend_open(&opts, &be, &err), 0);
        out[k] = falloc(no), lse[k] = falloc((size_t)c.B * c.NH * c.T), dqkv[k] = falloc(n);
        struct kiln_attn_args a = {.out = out[k],
                                   .lse = lse[k],
                                   .qkv = qkv,
                                   .B = c.B,
                                   .T = c.T,
                                   .NH = c.NH,
                                   .NKV = c.NKV,
                                   .HS = c.HS,
                                   .pos = c.pos,
                                   .rope_theta = 10000.0f};
        be.ops->attention_forward(be.ctx, &a);
        struct kiln_attn_back_args ba = back_args(&c, dqkv[k], dout, qkv, out[k], lse[k]);
        be.ops->attention_backward(be.ctx, &ba);
        kiln_backend_close(&be);
    }
    assert_memory_equal(out[0], out[1], no * sizeof(float));
    assert_memory_equal(lse[0], lse[1], (size_t)c.B * c.NH * c.T * sizeof(float));
    assert_memory_equal(dqkv[0], dqkv[1], n * sizeof(float));
    for (int k = 0; k < 2; k++)
        ffree(out[k]), ffree(lse[k]), ffree(dqkv[k]);
    ffree(qkv), ffree(dout);
}

static void test_attention_is_bitwise_identical_with_1_and_2_threads(void **state) {
    check_bitwise_with_1_and_2_threads(
        (struct attn_cfg){2, 37, 4, 2, 24, KILN_POS_ROPE}); // two-pass backward
    check_bitwise_with_1_and_2_threads(
        (struct attn_cfg){4, 100, 4, 2, 16, KILN_POS_ROPE}); // one-pass, 2 tiles
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alibi_slopes_follow_the_paper),
        cmocka_unit_test(test_attention_forward_matches_naive_softmax_attention),
        cmocka_unit_test(test_exp_neg_is_within_2_ulp_and_the_array_form_matches_the_scalar),
        cmocka_unit_test(test_rope_and_alibi_change_the_output),
        cmocka_unit_test(test_attention_gradients_match_finite_differences),
        cmocka_unit_test(test_attention_one_pass_backward_matches_two_pass),
        cmocka_unit_test(test_attention_decode_reproduces_forward_rows),
        cmocka_unit_test(test_attention_is_bitwise_identical_with_1_and_2_threads),
    };
    return cmocka_run_group_tests(tests, cpu_group_setup, cpu_group_teardown);
}
