// CPU backend: attention of a block of queries against a block of keys at global positions (ops.h,
// struct kiln_attn_block_args), the piece sequence parallelism builds attention from.
//
// The same arithmetic as attention.c, row for row: one score row per (b, h, i) task, lse saved, and a
// backward in two passes with one owner per gradient element and a fixed summation order (no atomics):
//   pass 1, one (b, h, i) per task:   dq_i += rot^-1(scale * sum_j p_ij (dout_i . v_j - D_i) k_j)
//   pass 2, one (b, kvh, j) per task: dk_j, dv_j += sums over the group's heads and the queries seeing j
// so that one block over a whole sequence reproduces the full op. Keys are causal on global positions: key j
// is visible to query i when k0 + j <= q0 + i, so the visible keys of a row are a prefix of the block.
#include "backend/cpu/cpu_internal.h"
#include "util/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---- positions -----------------------------------------------------------------------------------------

// (n, HS/2) tables of cos and sin for positions p0 .. p0 + n - 1.
struct rope_table {
    float *cos, *sin;
};

static struct rope_table rope_table_make(int p0, int n, int HS, float theta) {
    struct rope_table r = {malloc((size_t)n * (HS / 2) * sizeof(float) + 1),
                           malloc((size_t)n * (HS / 2) * sizeof(float) + 1)};
    KILN_ASSERT(r.cos && r.sin);
    for (int t = 0; t < n; t++)
        kiln_cpu_rope_angles(p0 + t, HS, theta, r.cos + (size_t)t * (HS / 2), r.sin + (size_t)t * (HS / 2));
    return r;
}

static void rope_table_free(struct rope_table *r) {
    free(r->cos);
    free(r->sin);
}

// A strided operand: row (b, i) at p + b * bstride + i * stride.
struct rows {
    const float *p;
    size_t bstride, stride;
};

static inline const float *row_at(struct rows x, int b, int i) {
    return x.p + (size_t)b * x.bstride + (size_t)i * x.stride;
}

// x (B, n rows of nheads*HS) rotated by positions p0 + i into a dense copy, or x itself without RoPE.
static struct rows rotated_rows(void *ctx, struct rows x, int B, int n, int nheads, int HS, int p0,
                                enum kiln_pos pos, float theta, float **owned) {
    *owned = NULL;
    if (pos != KILN_POS_ROPE)
        return x;
    KILN_ASSERT(HS % 2 == 0);
    int W = nheads * HS;
    float *r = malloc((size_t)B * n * W * sizeof(float) + 1);
    KILN_ASSERT(r);
    struct rope_table rt = rope_table_make(p0, n, HS, theta);
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx))                                                  \
    schedule(static) if (KILN_CPU_PAR((double)B * n * W))
    for (int bi = 0; bi < B * n; bi++) {
        int b = bi / n, i = bi % n;
        float *dst = r + (size_t)bi * W;
        memcpy(dst, row_at(x, b, i), (size_t)W * sizeof(float));
        for (int h = 0; h < nheads; h++)
            kiln_cpu_rope_apply(dst + h * HS, HS, rt.cos + (size_t)i * (HS / 2),
                                rt.sin + (size_t)i * (HS / 2), 0);
    }
    rope_table_free(&rt);
    *owned = r;
    return (struct rows){r, (size_t)n * W, (size_t)W};
}

// ---- the block's geometry --------------------------------------------------------------------------------

struct block {
    int B, Tq, Tk, NH, NKV, HS, group;
    int q0, k0;
    float scale;
    enum kiln_pos pos;
    int head0, NH_total;
};

static struct block block_of(int B, int Tq, int Tk, int NH, int NKV, int HS, int q0, int k0,
                             enum kiln_pos pos, int head0, int NH_total) {
    KILN_ASSERT(B >= 0 && Tq >= 0 && Tk >= 0 && HS > 0 && NKV > 0 && NH % NKV == 0);
    struct block g = {.B = B,
                      .Tq = Tq,
                      .Tk = Tk,
                      .NH = NH,
                      .NKV = NKV,
                      .HS = HS,
                      .group = NH / NKV,
                      .q0 = q0,
                      .k0 = k0,
                      .scale = 1.0f / sqrtf((float)HS),
                      .pos = pos,
                      .head0 = NH_total ? head0 : 0,
                      .NH_total = NH_total ? NH_total : NH};
    KILN_ASSERT(g.head0 >= 0 && g.head0 + NH <= g.NH_total);
    return g;
}

// Keys 0 .. n-1 of the block are visible to query i: n = clamp(q0 + i - k0 + 1, 0, Tk).
static inline int visible_keys(const struct block *g, int i) {
    long n = (long)g->q0 + i - g->k0 + 1;
    return n < 0 ? 0 : n > g->Tk ? g->Tk : (int)n;
}

// The first query that sees key j: max(0, k0 + j - q0).
static inline int first_query(const struct block *g, int j) {
    long i = (long)g->k0 + j - g->q0;
    return i < 0 ? 0 : i > g->Tq ? g->Tq : (int)i;
}

static inline float slope_of(const struct block *g, int h) {
    return g->pos == KILN_POS_ALIBI ? kiln_cpu_alibi_slope(g->head0 + h, g->NH_total) : 0.0f;
}

// ALiBi's bias slope * (kpos - qpos) on the global positions, in the same float arithmetic as attention.c.
static inline float score_of(const struct block *g, const float *q, const float *k, float slope, int i,
                             int j) {
    return g->scale * kiln_cpu_dot(q, k, g->HS) + slope * (float)((g->k0 + j) - (g->q0 + i));
}

// ---- forward ---------------------------------------------------------------------------------------------

// out = softmax(scores) @ v over the visible keys 0..last of query row q (at block row i); returns the
// log-sum-exp (-inf and out = 0 when last < 0: nothing visible).
static float attend_row(const struct block *g, const float *q, struct rows k, struct rows v, int b, int kvh,
                        int i, int last, float slope, float *scores, float *out) {
    int HS = g->HS;
    for (int c = 0; c < HS; c++)
        out[c] = 0.0f;
    if (last < 0)
        return -INFINITY;
    float maxv = -INFINITY;
    for (int j = 0; j <= last; j++) {
        scores[j] = score_of(g, q, row_at(k, b, j) + kvh * HS, slope, i, j);
        maxv = scores[j] > maxv ? scores[j] : maxv;
    }
    kiln_cpu_exp_shifted(scores, last + 1, maxv);
    double sum = scores[0];
    for (int j = 1; j <= last; j++)
        sum += scores[j];
    float inv = (float)(1.0 / sum);
    for (int j = 0; j <= last; j++) {
        float p = scores[j] * inv;
        const float *vj = row_at(v, b, j) + kvh * HS;
        for (int c = 0; c < HS; c++)
            out[c] += p * vj[c];
    }
    return maxv + (float)log(sum);
}

// Merges a block's (o_blk, lse_blk) into (out, *lse) through the log-sum-exp. A side at -inf carries no
// weight, so a block that saw nothing leaves the row as it was, and a row that held nothing takes the block.
static void merge_row(float *out, float *lse, const float *o_blk, float lse_blk, int HS) {
    if (lse_blk == -INFINITY)
        return;
    if (*lse == -INFINITY) {
        memcpy(out, o_blk, (size_t)HS * sizeof(float));
        *lse = lse_blk;
        return;
    }
    double a = *lse, b = lse_blk, m = a > b ? a : b;
    double lse_new = m + log1p(exp((a > b ? b : a) - m));
    float wa = (float)exp(a - lse_new), wb = (float)exp(b - lse_new);
    for (int c = 0; c < HS; c++)
        out[c] = wa * out[c] + wb * o_blk[c];
    *lse = (float)lse_new;
}

void kiln_cpu_attention_block_forward(void *ctx, const struct kiln_attn_block_args *a) {
    struct block g =
        block_of(a->B, a->Tq, a->Tk, a->NH, a->NKV, a->HS, a->q0, a->k0, a->pos, a->head0, a->NH_total);
    int HS = g.HS, NH = g.NH, NKV = g.NKV;
    KILN_ASSERT(a->q_stride >= NH * HS && a->kv_stride >= NKV * HS && a->out_stride >= NH * HS);
    KILN_ASSERT(g.Tq == 0 || a->lse_stride >= (size_t)g.Tq);
    float *qown, *kown;
    struct rows q = rotated_rows(ctx, (struct rows){a->q, a->q_bstride, (size_t)a->q_stride}, g.B, g.Tq, NH,
                                 HS, g.q0, g.pos, a->rope_theta, &qown);
    struct rows k = rotated_rows(ctx, (struct rows){a->k, a->kv_bstride, (size_t)a->kv_stride}, g.B, g.Tk,
                                 NKV, HS, g.k0, g.pos, a->rope_theta, &kown);
    struct rows v = {a->v, a->kv_bstride, (size_t)a->kv_stride};
    float *out = a->out;
#pragma omp parallel num_threads(kiln_cpu_threads(ctx)) if (KILN_CPU_PAR((double)g.B * NH * g.Tq * g.Tk * HS))
    {
        float *scores = malloc((size_t)g.Tk * sizeof(float) + 1);
        float *o_blk = malloc((size_t)HS * sizeof(float));
        KILN_ASSERT(scores && o_blk);
#pragma omp for schedule(dynamic, 4)
        for (int task = 0; task < g.B * NH * g.Tq; task++) {
            int i = g.Tq - 1 - task % g.Tq, h = (task / g.Tq) % NH, b = task / (g.Tq * NH); // long rows first
            float *o = out + (size_t)b * a->out_bstride + (size_t)i * a->out_stride + h * HS;
            float *l = a->lse + ((size_t)b * NH + h) * a->lse_stride + i;
            int n = visible_keys(&g, i);
            if (a->accumulate && n == 0)
                continue;
            float *dst = a->accumulate ? o_blk : o;
            float row_lse = attend_row(&g, row_at(q, b, i) + h * HS, k, v, b, h / g.group, i, n - 1,
                                       slope_of(&g, h), scores, dst);
            if (a->accumulate)
                merge_row(o, l, o_blk, row_lse, HS);
            else
                *l = row_lse;
        }
        free(scores);
        free(o_blk);
    }
    free(qown);
    free(kown);
}

// ---- backward --------------------------------------------------------------------------------------------

void kiln_cpu_attention_block_backward(void *ctx, const struct kiln_attn_block_back_args *a) {
    const struct kiln_attn_block_args *f = &a->blk; // the block, with the final out and lse
    struct block g =
        block_of(f->B, f->Tq, f->Tk, f->NH, f->NKV, f->HS, f->q0, f->k0, f->pos, f->head0, f->NH_total);
    int HS = g.HS, NH = g.NH, NKV = g.NKV, B = g.B, Tq = g.Tq, Tk = g.Tk;
    KILN_ASSERT(f->q_stride >= NH * HS && f->kv_stride >= NKV * HS && f->out_stride >= NH * HS);
    KILN_ASSERT(Tq == 0 || f->lse_stride >= (size_t)Tq);
    int rope = g.pos == KILN_POS_ROPE;
    float *qown, *kown;
    struct rows q = rotated_rows(ctx, (struct rows){f->q, f->q_bstride, (size_t)f->q_stride}, B, Tq, NH, HS,
                                 g.q0, g.pos, f->rope_theta, &qown);
    struct rows k = rotated_rows(ctx, (struct rows){f->k, f->kv_bstride, (size_t)f->kv_stride}, B, Tk, NKV,
                                 HS, g.k0, g.pos, f->rope_theta, &kown);
    struct rows v = {f->v, f->kv_bstride, (size_t)f->kv_stride};
    struct rows dout = {a->dout, f->out_bstride, (size_t)f->out_stride};
    struct rows out = {f->out, f->out_bstride, (size_t)f->out_stride};
    struct rope_table rq = {0}, rk = {0};
    if (rope) {
        rq = rope_table_make(g.q0, Tq, HS, f->rope_theta);
        rk = rope_table_make(g.k0, Tk, HS, f->rope_theta);
    }
    float *dq = a->dq, *dk = a->dk, *dv = a->dv;
    const float *lse = f->lse;
    float *D = malloc((size_t)B * NH * Tq * sizeof(float) + 1); // (B, NH, Tq) dout . out
    KILN_ASSERT(D);
#pragma omp parallel num_threads(kiln_cpu_threads(ctx)) if (KILN_CPU_PAR((double)B * NH * Tq * Tk * HS))
    {
        float *acc = malloc((size_t)2 * HS * sizeof(float)); // a gradient row (two in pass 2), rotated frame
        KILN_ASSERT(acc);
        // pass 1: D and dq
#pragma omp for schedule(dynamic, 4)
        for (int task = 0; task < B * NH * Tq; task++) {
            int i = Tq - 1 - task % Tq, h = (task / Tq) % NH, b = task / (Tq * NH);
            int kvh = h / g.group;
            const float *dy = row_at(dout, b, i) + h * HS;
            float Di = kiln_cpu_dot(dy, row_at(out, b, i) + h * HS, HS);
            float row_lse = lse[((size_t)b * NH + h) * f->lse_stride + i];
            D[((size_t)b * NH + h) * Tq + i] = Di;
            int n = visible_keys(&g, i);
            if (n == 0 || row_lse == -INFINITY)
                continue;
            const float *qi = row_at(q, b, i) + h * HS;
            float slope = slope_of(&g, h);
            for (int c = 0; c < HS; c++)
                acc[c] = 0.0f;
            for (int j = 0; j < n; j++) {
                const float *kj = row_at(k, b, j) + kvh * HS;
                float p = kiln_cpu_exp_neg(score_of(&g, qi, kj, slope, i, j) - row_lse);
                float ds = p * (kiln_cpu_dot(dy, row_at(v, b, j) + kvh * HS, HS) - Di) * g.scale;
                for (int c = 0; c < HS; c++)
                    acc[c] += ds * kj[c];
            }
            if (rope)
                kiln_cpu_rope_apply(acc, HS, rq.cos + (size_t)i * (HS / 2), rq.sin + (size_t)i * (HS / 2), 1);
            float *dqi = dq + (size_t)b * f->q_bstride + (size_t)i * f->q_stride + h * HS;
            for (int c = 0; c < HS; c++)
                dqi[c] += acc[c];
        }
        // pass 2: dk, dv, one (b, kvh, j) per task, summing over the group's heads and the queries in order
#pragma omp for schedule(dynamic, 4)
        for (int task = 0; task < B * NKV * Tk; task++) {
            int j = task % Tk, kvh = (task / Tk) % NKV, b = task / (Tk * NKV);
            int i0 = first_query(&g, j);
            if (i0 >= Tq)
                continue;
            const float *kj = row_at(k, b, j) + kvh * HS, *vj = row_at(v, b, j) + kvh * HS;
            float *dk_acc = acc, *dv_acc = acc + HS;
            for (int c = 0; c < HS; c++)
                dk_acc[c] = dv_acc[c] = 0.0f;
            for (int h = kvh * g.group; h < (kvh + 1) * g.group; h++) {
                float slope = slope_of(&g, h);
                for (int i = i0; i < Tq; i++) {
                    float row_lse = lse[((size_t)b * NH + h) * f->lse_stride + i];
                    if (row_lse == -INFINITY)
                        continue;
                    const float *qi = row_at(q, b, i) + h * HS;
                    const float *dy = row_at(dout, b, i) + h * HS;
                    float p = kiln_cpu_exp_neg(score_of(&g, qi, kj, slope, i, j) - row_lse);
                    float ds = p * (kiln_cpu_dot(dy, vj, HS) - D[((size_t)b * NH + h) * Tq + i]) * g.scale;
                    for (int c = 0; c < HS; c++) {
                        dk_acc[c] += ds * qi[c];
                        dv_acc[c] += p * dy[c];
                    }
                }
            }
            if (rope)
                kiln_cpu_rope_apply(dk_acc, HS, rk.cos + (size_t)j * (HS / 2), rk.sin + (size_t)j * (HS / 2),
                                    1);
            size_t off = (size_t)b * f->kv_bstride + (size_t)j * f->kv_stride + kvh * HS;
            for (int c = 0; c < HS; c++) {
                dk[off + c] += dk_acc[c];
                dv[off + c] += dv_acc[c];
            }
        }
        free(acc);
    }
    free(D);
    free(qown);
    free(kown);
    if (rope) {
        rope_table_free(&rq);
        rope_table_free(&rk);
    }
}
