// The op table's attention rows (op_table.h): attention_forward/backward, attention_decode and
// attention_block_forward/backward, with the double-precision attention their references share.
#include "ops/op_table.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"

// ---- double-precision attention ---------------------------------------------------------------------------

// GPT-NeoX's rotation of the pairs (i, i + HS/2) by t * theta^(-2i/HS)
static void rotate_d(double *x, int HS, int t, double theta) {
    for (int i = 0; i < HS / 2; i++) {
        double ang = t * pow(theta, -2.0 * i / HS), c = cos(ang), s = sin(ang);
        double x1 = x[i], x2 = x[i + HS / 2];
        x[i] = x1 * c - x2 * s;
        x[i + HS / 2] = x2 * c + x1 * s;
    }
}

// ALiBi's slopes as the paper's reference code builds them (get_slopes): for a power of two n a geometric
// sequence from 2^(-8/n) with that ratio; otherwise the closest power of two below, then every other slope
// of the construction for twice that
static void alibi_slopes(int n, double *out) {
    if ((n & (n - 1)) == 0) {
        for (int i = 0; i < n; i++)
            out[i] = pow(2.0, -8.0 * (i + 1) / n);
        return;
    }
    int closest = 1;
    while (closest * 2 <= n)
        closest *= 2;
    alibi_slopes(closest, out);
    double twice[512];
    alibi_slopes(2 * closest, twice);
    for (int i = 0; i < n - closest; i++)
        out[closest + i] = twice[2 * i];
}

// Softmax attention of one query q (HS, already rotated) at position qpos over keys and values j < n (rows
// `stride` apart in k and v) at positions kpos0 + j, with the bias slope * (kpos - qpos): writes out (HS)
// and returns the log-sum-exp of the scaled scores (-inf, and out = 0, when n = 0)
static double attend_d(const double *q, const double *k, const double *v, size_t stride, int n, int HS,
                       double slope, int qpos, int kpos0, double *out) {
    double scale = 1.0 / sqrt((double)HS), maxs = -INFINITY;
    double *s = calloc((size_t)n + 1, sizeof(double));
    for (int j = 0; j < n; j++) {
        double dot = 0;
        for (int i = 0; i < HS; i++)
            dot += q[i] * k[(size_t)j * stride + i];
        s[j] = scale * dot + slope * (double)(kpos0 + j - qpos);
        maxs = s[j] > maxs ? s[j] : maxs;
    }
    double sum = 0;
    for (int j = 0; j < n; j++)
        sum += exp(s[j] - maxs);
    for (int i = 0; i < HS; i++) {
        double o = 0;
        for (int j = 0; j < n; j++)
            o += exp(s[j] - maxs) / sum * v[(size_t)j * stride + i];
        out[i] = n ? o : 0.0;
    }
    free(s);
    return n ? maxs + log(sum) : -INFINITY;
}

// ---- attention_forward + attention_backward ---------------------------------------------------------------
// Causal attention over qkv rows [q (NH*HS) | k (NKV*HS) | v (NKV*HS)]: multi-head, grouped (GQA) and
// multi-query, with RoPE, ALiBi (power-of-two NH and not) or neither. Fields: B, T, NH, NKV, HS; pos,
// rope_theta.

enum { AT_QKV, AT_OUT, AT_LSE, AT_DOUT, AT_DQKV, AT_COUNT };

static int attention_tensors(const struct opt_case *c, struct opt_tensor *t) {
    size_t BT = (size_t)c->B * c->T, W = (size_t)(c->NH + 2 * c->NKV) * c->HS;
    t[AT_QKV] = opt_input("qkv", OPT_ACT, BT * W, 1.0f, 1);             // (B, T, W)
    t[AT_OUT] = opt_output("out", OPT_ACT, BT * c->NH * c->HS, 0);      // (B, T, NH*HS)
    t[AT_LSE] = opt_saved("lse", OPT_F32, (size_t)c->B * c->NH * c->T); // (B, NH, T)
    t[AT_DOUT] = opt_dout("dout", OPT_ACT, t[AT_OUT].n, AT_OUT);
    t[AT_DQKV] = opt_dinput("dqkv", OPT_ACT, t[AT_QKV].n, AT_QKV, 0);
    t[AT_OUT].nmse = 4e-4;    // P is rounded to bf16 before P.V, as in FlashAttention
    t[AT_DQKV].nmse = 1.6e-3; // and each backend differentiates its own forward
    return AT_COUNT;
}

static void attention_fwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_attn_args a = {.out = x->t[AT_OUT],
                               .lse = x->t[AT_LSE],
                               .qkv = x->t[AT_QKV],
                               .B = c->B,
                               .T = c->T,
                               .NH = c->NH,
                               .NKV = c->NKV,
                               .HS = c->HS,
                               .pos = c->pos,
                               .rope_theta = c->rope_theta};
    x->be->ops->attention_forward(x->be->ctx, &a);
}

static void attention_bwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_attn_back_args a = {.dqkv = x->t[AT_DQKV],
                                    .dout = x->t[AT_DOUT],
                                    .qkv = x->t[AT_QKV],
                                    .out = x->t[AT_OUT],
                                    .lse = x->t[AT_LSE],
                                    .B = c->B,
                                    .T = c->T,
                                    .NH = c->NH,
                                    .NKV = c->NKV,
                                    .HS = c->HS,
                                    .pos = c->pos,
                                    .rope_theta = c->rope_theta};
    x->be->ops->attention_backward(x->be->ctx, &a);
}

static void attention_ref(const struct opt_case *c, double *const *v) {
    int T = c->T, NH = c->NH, NKV = c->NKV, HS = c->HS, W = (NH + 2 * NKV) * HS;
    double slopes[256];
    alibi_slopes(NH, slopes);
    double *rot = malloc(sizeof(double) * (size_t)c->B * T * W); // qkv with q and k rotated
    memcpy(rot, v[AT_QKV], sizeof(double) * (size_t)c->B * T * W);
    if (c->pos == KILN_POS_ROPE)
        for (int bt = 0; bt < c->B * T; bt++)
            for (int h = 0; h < NH + NKV; h++)
                rotate_d(rot + (size_t)bt * W + h * HS, HS, bt % T, c->rope_theta);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *base = rot + (size_t)b * T * W;
                int kvh = h * NKV / NH; // = h / (NH / NKV): the kv head of h's group
                v[AT_LSE][((size_t)b * NH + h) * T + t] = attend_d(
                    base + (size_t)t * W + h * HS, base + (NH + kvh) * HS, base + (NH + NKV + kvh) * HS, W,
                    t + 1, HS, c->pos == KILN_POS_ALIBI ? slopes[h] : 0.0, t, 0,
                    v[AT_OUT] + ((size_t)b * T + t) * NH * HS + h * HS);
            }
    free(rot);
}

static double attention_flops(const struct opt_case *c, int backward) {
    // causal: half of the (T, T) scores; 2 GEMMs forward (QK^T, PV), 5 backward (recomputing QK^T)
    return (backward ? 5.0 : 2.0) * 2.0 * c->B * c->NH * ((double)c->T * c->T / 2) * c->HS;
}

static const struct opt_case attention_fd[] = {
    {.B = 1, .T = 5, .NH = 2, .NKV = 2, .HS = 4, .pos = KILN_POS_NONE},
    {.B = 2, .T = 4, .NH = 4, .NKV = 2, .HS = 6, .pos = KILN_POS_ROPE, .rope_theta = 10000},
    {.B = 1, .T = 6, .NH = 3, .NKV = 1, .HS = 4, .pos = KILN_POS_ALIBI},
    {.B = 1, .T = 5, .NH = 4, .NKV = 4, .HS = 8, .pos = KILN_POS_ALIBI},
    {.B = 1, .T = 4, .NH = 4, .NKV = 1, .HS = 8, .pos = KILN_POS_ROPE, .rope_theta = 100},
    {.B = 1, .T = 64, .NH = 4, .NKV = 2, .HS = 16, .pos = KILN_POS_ROPE, .rope_theta = 10000}, // threaded
};
static const struct opt_case attention_gpu[] = {
    {.B = 2, .T = 256, .NH = 8, .NKV = 2, .HS = 64, .pos = KILN_POS_ROPE, .rope_theta = 10000},
    {.B = 1, .T = 300, .NH = 4, .NKV = 4, .HS = 128, .pos = KILN_POS_NONE},
    {.B = 2, .T = 128, .NH = 6, .NKV = 3, .HS = 80, .pos = KILN_POS_ALIBI},
    {.B = 1, .T = 100, .NH = 4, .NKV = 2, .HS = 32, .pos = KILN_POS_ROPE, .rope_theta = 10000},
    {.B = 1, .T = 64, .NH = 2, .NKV = 1, .HS = 16, .pos = KILN_POS_NONE},
    {.B = 4, .T = 1024, .NH = 12, .NKV = 12, .HS = 64, .pos = KILN_POS_NONE},
    {.B = 1, .T = 2048, .NH = 16, .NKV = 4, .HS = 128, .pos = KILN_POS_ROPE, .rope_theta = 500000},
};
const struct opt_row opt_row_attention = {
    .name = "attention",
    .ops = {OPT_OP(attention_forward), OPT_OP(attention_backward)},
    .about = "attention_forward + attention_backward: causal, GQA/MQA, RoPE, ALiBi",
    .fd_cases = attention_fd,
    .n_fd = OPT_COUNT(attention_fd),
    .gpu_cases = attention_gpu,
    .n_gpu = OPT_COUNT(attention_gpu),
    .tensors = attention_tensors,
    .forward = attention_fwd,
    .backward = attention_bwd,
    .reference = attention_ref,
    .flops = attention_flops,
    .tol = {.ref = 1e-5,
            .fd = 1e-3,
            .fd_step = 0.1,
            .out = OPT_NMSE_BF16,
            .stat = OPT_NMSE_STAT,
            .grad = OPT_NMSE_BF16,
            .pgrad = OPT_NMSE_F32G},
};

// ---- attention_decode -------------------------------------------------------------------------------------
// One decoding step against a KV cache: the new token's k and v (k rotated) go into the caches at pos_at, and
// its q attends to positions 0..pos_at. No backward. Fields: B, maxT, pos_at, NH, NKV, HS; pos, rope_theta.

enum { DE_QKV, DE_KC, DE_VC, DE_OUT, DE_COUNT };

static int decode_tensors(const struct opt_case *c, struct opt_tensor *t) {
    size_t W = (size_t)(c->NH + 2 * c->NKV) * c->HS, KW = (size_t)c->NKV * c->HS;
    t[DE_QKV] = opt_input("qkv", OPT_ACT, (size_t)c->B * W, 1.0f, 0);              // (B, W)
    t[DE_KC] = opt_input("kcache", OPT_ACT, (size_t)c->B * c->maxT * KW, 1.0f, 0); // (B, maxT, NKV*HS)
    t[DE_VC] = opt_input("vcache", OPT_ACT, (size_t)c->B * c->maxT * KW, 1.0f, 0);
    t[DE_KC].role = t[DE_VC].role = OPT_INOUT;
    t[DE_OUT] = opt_output("out", OPT_ACT, (size_t)c->B * c->NH * c->HS, 0); // (B, NH*HS)
    t[DE_OUT].nmse = 4e-4;
    return DE_COUNT;
}

static void decode_fwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_attn_decode_args a = {.out = x->t[DE_OUT],
                                      .kcache = x->t[DE_KC],
                                      .vcache = x->t[DE_VC],
                                      .qkv = x->t[DE_QKV],
                                      .B = c->B,
                                      .maxT = c->maxT,
                                      .pos = c->pos_at,
                                      .NH = c->NH,
                                      .NKV = c->NKV,
                                      .HS = c->HS,
                                      .pos_kind = c->pos,
                                      .rope_theta = c->rope_theta};
    x->be->ops->attention_decode(x->be->ctx, &a);
}

static void decode_ref(const struct opt_case *c, double *const *v) {
    int NH = c->NH, NKV = c->NKV, HS = c->HS, W = (NH + 2 * NKV) * HS, KW = NKV * HS, p = c->pos_at;
    double slopes[256], *q = malloc(sizeof(double) * HS);
    alibi_slopes(NH, slopes);
    for (int b = 0; b < c->B; b++) {
        const double *row = v[DE_QKV] + (size_t)b * W;
        double *kc = v[DE_KC] + (size_t)b * c->maxT * KW, *vc = v[DE_VC] + (size_t)b * c->maxT * KW;
        memcpy(kc + (size_t)p * KW, row + NH * HS, sizeof(double) * KW);
        memcpy(vc + (size_t)p * KW, row + (NH + NKV) * HS, sizeof(double) * KW);
        if (c->pos == KILN_POS_ROPE)
            for (int h = 0; h < NKV; h++)
                rotate_d(kc + (size_t)p * KW + h * HS, HS, p, c->rope_theta);
        for (int h = 0; h < NH; h++) {
            memcpy(q, row + h * HS, sizeof(double) * HS);
            if (c->pos == KILN_POS_ROPE)
                rotate_d(q, HS, p, c->rope_theta);
            int kvh = h * NKV / NH;
            attend_d(q, kc + kvh * HS, vc + kvh * HS, KW, p + 1, HS,
                     c->pos == KILN_POS_ALIBI ? slopes[h] : 0.0, p, 0,
                     v[DE_OUT] + (size_t)b * NH * HS + h * HS);
        }
    }
    free(q);
}

static const struct opt_case decode_fd[] = {
    {.B = 2, .maxT = 6, .pos_at = 3, .NH = 4, .NKV = 2, .HS = 8, .pos = KILN_POS_ROPE, .rope_theta = 10000},
    {.B = 1, .maxT = 5, .pos_at = 0, .NH = 2, .NKV = 1, .HS = 4, .pos = KILN_POS_ALIBI},
    {.B = 2, .maxT = 4, .pos_at = 3, .NH = 3, .NKV = 3, .HS = 6, .pos = KILN_POS_NONE},
    {.B = 1, .maxT = 7, .pos_at = 5, .NH = 6, .NKV = 2, .HS = 4, .pos = KILN_POS_ALIBI},
    {.B = 2,
     .maxT = 300,
     .pos_at = 299,
     .NH = 4,
     .NKV = 2,
     .HS = 32,
     .pos = KILN_POS_ROPE,
     .rope_theta = 10000}, // threaded
};
static const struct opt_case decode_gpu[] = {
    {.B = 4,
     .maxT = 1024,
     .pos_at = 700,
     .NH = 12,
     .NKV = 4,
     .HS = 64,
     .pos = KILN_POS_ROPE,
     .rope_theta = 10000},
    {.B = 2, .maxT = 256, .pos_at = 255, .NH = 8, .NKV = 8, .HS = 128, .pos = KILN_POS_ALIBI},
    {.B = 1, .maxT = 64, .pos_at = 0, .NH = 6, .NKV = 2, .HS = 80, .pos = KILN_POS_NONE},
};
const struct opt_row opt_row_attention_decode = {
    .name = "attention_decode",
    .ops = {OPT_OP(attention_decode)},
    .about = "attention_decode: KV-cache step, GQA, RoPE, ALiBi (no backward)",
    .fd_cases = decode_fd,
    .n_fd = OPT_COUNT(decode_fd),
    .gpu_cases = decode_gpu,
    .n_gpu = OPT_COUNT(decode_gpu),
    .tensors = decode_tensors,
    .forward = decode_fwd,
    .reference = decode_ref,
    .tol = {.ref = 1e-5, .out = OPT_NMSE_BF16, .stat = OPT_NMSE_STAT},
};

// ---- attention_block_forward + attention_block_backward ---------------------------------------------------
// A block of queries (global positions q0..) against a block of keys (k0..), causal on the global positions,
// on its own (queries that see no key: lse = -inf, out = 0) or merged into another block's out and lse
// through the log-sum-exp; RoPE by global position, ALiBi with a rank's share of the heads (head0 of
// NH_total). The backward adds (+=) into dq, dk, dv. Fields: B, Tq, Tk, NH, NKV, HS, q0, k0, head0, NH_total;
// pos, rope_theta; merge.

enum { AB_Q, AB_K, AB_V, AB_OUT, AB_LSE, AB_DOUT, AB_DQ, AB_DK, AB_DV, AB_COUNT };

static int block_tensors(const struct opt_case *c, struct opt_tensor *t) {
    size_t nq = (size_t)c->B * c->Tq * c->NH * c->HS, nkv = (size_t)c->B * c->Tk * c->NKV * c->HS;
    t[AB_Q] = opt_input("q", OPT_ACT, nq, 1.0f, 1);  // (B, Tq, NH*HS)
    t[AB_K] = opt_input("k", OPT_ACT, nkv, 1.0f, 1); // (B, Tk, NKV*HS)
    t[AB_V] = opt_input("v", OPT_ACT, nkv, 1.0f, 1);
    t[AB_OUT] = opt_output("out", OPT_ACT, nq, 0);                       // (B, Tq, NH*HS)
    t[AB_LSE] = opt_saved("lse", OPT_F32, (size_t)c->B * c->NH * c->Tq); // (B, NH, Tq)
    if (c->merge) { // another block's result, merged into
        t[AB_OUT] = opt_input("out", OPT_ACT, nq, 1.0f, 0);
        t[AB_LSE] = opt_input("lse", OPT_F32, (size_t)c->B * c->NH * c->Tq, 1.0f, 0);
        t[AB_LSE].b = 1.0f;
        t[AB_OUT].role = t[AB_LSE].role = OPT_INOUT;
    }
    t[AB_DOUT] = opt_dout("dout", OPT_ACT, nq, AB_OUT);
    t[AB_DQ] = opt_dinput("dq", OPT_ACT, nq, AB_Q, 1);
    t[AB_DK] = opt_dinput("dk", OPT_ACT, nkv, AB_K, 1);
    t[AB_DV] = opt_dinput("dv", OPT_ACT, nkv, AB_V, 1);
    t[AB_OUT].nmse = 4e-4;
    t[AB_DQ].nmse = t[AB_DK].nmse = t[AB_DV].nmse = 1.6e-3;
    return AB_COUNT;
}

static struct kiln_attn_block_args block_args(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    int qw = c->NH * c->HS, kw = c->NKV * c->HS;
    return (struct kiln_attn_block_args){.out = x->t[AB_OUT],
                                         .lse = x->t[AB_LSE],
                                         .q = x->t[AB_Q],
                                         .k = x->t[AB_K],
                                         .v = x->t[AB_V],
                                         .B = c->B,
                                         .Tq = c->Tq,
                                         .Tk = c->Tk,
                                         .NH = c->NH,
                                         .NKV = c->NKV,
                                         .HS = c->HS,
                                         .q0 = c->q0,
                                         .k0 = c->k0,
                                         .q_bstride = (size_t)c->Tq * qw,
                                         .kv_bstride = (size_t)c->Tk * kw,
                                         .out_bstride = (size_t)c->Tq * qw,
                                         .lse_stride = (size_t)c->Tq,
                                         .q_stride = qw,
                                         .kv_stride = kw,
                                         .out_stride = qw,
                                         .pos = c->pos,
                                         .rope_theta = c->rope_theta,
                                         .head0 = c->head0,
                                         .NH_total = c->NH_total,
                                         .accumulate = c->merge};
}

static void block_fwd(const struct opt_args *x) {
    struct kiln_attn_block_args a = block_args(x);
    x->be->ops->attention_block_forward(x->be->ctx, &a);
}

static void block_bwd(const struct opt_args *x) {
    struct kiln_attn_block_back_args a = {
        .blk = block_args(x), .dq = x->t[AB_DQ], .dk = x->t[AB_DK], .dv = x->t[AB_DV], .dout = x->t[AB_DOUT]};
    x->be->ops->attention_block_backward(x->be->ctx, &a);
}

static void block_ref(const struct opt_case *c, double *const *v) {
    int NH = c->NH, NKV = c->NKV, HS = c->HS, qw = NH * HS, kw = NKV * HS;
    int NHt = c->NH_total ? c->NH_total : NH;
    double slopes[256];
    alibi_slopes(NHt, slopes);
    size_t nkv = (size_t)c->B * c->Tk * kw;
    double *k = malloc(sizeof(double) * nkv), *q = malloc(sizeof(double) * HS),
           *o = malloc(sizeof(double) * HS);
    memcpy(k, v[AB_K], sizeof(double) * nkv);
    if (c->pos == KILN_POS_ROPE)
        for (int bj = 0; bj < c->B * c->Tk; bj++)
            for (int h = 0; h < NKV; h++)
                rotate_d(k + (size_t)bj * kw + h * HS, HS, c->k0 + bj % c->Tk, c->rope_theta);
    for (int b = 0; b < c->B; b++)
        for (int i = 0; i < c->Tq; i++)
            for (int h = 0; h < NH; h++) {
                size_t qi = ((size_t)b * c->Tq + i) * qw + h * HS;
                memcpy(q, v[AB_Q] + qi, sizeof(double) * HS);
                if (c->pos == KILN_POS_ROPE)
                    rotate_d(q, HS, c->q0 + i, c->rope_theta);
                int n = c->q0 + i - c->k0 + 1, kvh = h * NKV / NH;
                n = n < 0 ? 0 : n > c->Tk ? c->Tk : n;
                double slope = c->pos == KILN_POS_ALIBI ? slopes[c->head0 + h] : 0.0;
                const double *kb = k + (size_t)b * c->Tk * kw + kvh * HS;
                const double *vb = v[AB_V] + (size_t)b * c->Tk * kw + kvh * HS;
                double lse = attend_d(q, kb, vb, kw, n, HS, slope, c->q0 + i, c->k0, o);
                double *out = v[AB_OUT] + qi, *L = v[AB_LSE] + ((size_t)b * NH + h) * c->Tq + i;
                if (c->merge) { // lse' = log(e^L + e^lse); out' = e^(L - lse') out + e^(lse - lse') o
                    if (n == 0)
                        continue;
                    double m = *L > lse ? *L : lse, merged = m + log(exp(*L - m) + exp(lse - m));
                    for (int d = 0; d < HS; d++)
                        out[d] = exp(*L - merged) * out[d] + exp(lse - merged) * o[d];
                    *L = merged;
                } else {
                    memcpy(out, o, sizeof(double) * HS);
                    *L = lse;
                }
            }
    free(k);
    free(q);
    free(o);
}

static double block_flops(const struct opt_case *c, int backward) {
    double pairs = 0; // visible (query, key) pairs
    for (int i = 0; i < c->Tq; i++) {
        int n = c->q0 + i - c->k0 + 1;
        pairs += n < 0 ? 0 : n > c->Tk ? c->Tk : n;
    }
    return (backward ? 5.0 : 2.0) * 2.0 * c->B * c->NH * pairs * c->HS;
}

static const struct opt_case block_fd[] = {
    {.B = 1,
     .Tq = 4,
     .Tk = 5,
     .NH = 2,
     .NKV = 1,
     .HS = 4,
     .q0 = 3,
     .k0 = 2,
     .pos = KILN_POS_ROPE,
     .rope_theta = 10000},
    {.B = 2, .Tq = 3, .Tk = 4, .NH = 2, .NKV = 2, .HS = 6, .q0 = 0, .k0 = 1, .pos = KILN_POS_NONE},
    {.B = 1,
     .Tq = 4,
     .Tk = 4,
     .NH = 3,
     .NKV = 1,
     .HS = 4,
     .q0 = 8,
     .k0 = 2,
     .head0 = 1,
     .NH_total = 6,
     .pos = KILN_POS_ALIBI,
     .merge = 1},
    {.B = 1,
     .Tq = 5,
     .Tk = 3,
     .NH = 4,
     .NKV = 2,
     .HS = 8,
     .q0 = 2,
     .k0 = 0,
     .pos = KILN_POS_ROPE,
     .rope_theta = 100,
     .merge = 1},
    {.B = 1,
     .Tq = 48,
     .Tk = 64,
     .NH = 4,
     .NKV = 2,
     .HS = 16,
     .q0 = 40,
     .k0 = 0,
     .pos = KILN_POS_ROPE,
     .rope_theta = 10000,
     .merge = 1}, // threaded
};
static const struct opt_case block_gpu[] = {
    {.B = 2,
     .Tq = 96,
     .Tk = 96,
     .NH = 4,
     .NKV = 2,
     .HS = 64,
     .q0 = 96,
     .k0 = 0,
     .pos = KILN_POS_ROPE,
     .rope_theta = 10000},
    {.B = 1,
     .Tq = 100,
     .Tk = 100,
     .NH = 4,
     .NKV = 1,
     .HS = 128,
     .head0 = 4,
     .NH_total = 8,
     .pos = KILN_POS_ALIBI,
     .merge = 1},
    {.B = 2, .Tq = 64, .Tk = 48, .NH = 6, .NKV = 3, .HS = 80, .q0 = 10, .k0 = 20, .pos = KILN_POS_NONE},
    {.B = 1,
     .Tq = 128,
     .Tk = 128,
     .NH = 8,
     .NKV = 2,
     .HS = 128,
     .q0 = 128,
     .k0 = 0,
     .pos = KILN_POS_ROPE,
     .rope_theta = 10000,
     .merge = 1},
    {.B = 1, .Tq = 512, .Tk = 512, .NH = 8, .NKV = 2, .HS = 128, .pos = KILN_POS_ROPE, .rope_theta = 10000},
};
const struct opt_row opt_row_attention_block = {
    .name = "attention_block",
    .ops = {OPT_OP(attention_block_forward), OPT_OP(attention_block_backward)},
    .about = "attention_block_forward + _backward: global positions, merge by lse, ALiBi head offsets",
    .fd_cases = block_fd,
    .n_fd = OPT_COUNT(block_fd),
    .gpu_cases = block_gpu,
    .n_gpu = OPT_COUNT(block_gpu),
    .tensors = block_tensors,
    .forward = block_fwd,
    .backward = block_bwd,
    .reference = block_ref,
    .flops = block_flops,
    .tol = {.ref = 1e-5,
            .fd = 1e-3,
            .fd_step = 0.1,
            .out = OPT_NMSE_BF16,
            .stat = OPT_NMSE_STAT,
            .grad = OPT_NMSE_BF16,
            .pgrad = OPT_NMSE_F32G},
};
