// The CPU backend's block attention (ops.h, struct kiln_attn_block_args) as a specification: one block over a
// whole sequence is the full causal op; any split of the sequence into query and key blocks, merged in any
// order (ring attention) or laid out as zigzag ranks, is the full op too; ALiBi heads may be a slice of the
// model's; the backward matches central finite differences of a double reference at nonzero offsets; a block
// that sees nothing changes nothing; and the result does not depend on the thread count.
#include "test_cpu_common.h"

#include "backend/cpu/cpu_internal.h"

#include <math.h>

static const char *pos_name(enum kiln_pos p) {
    return p == KILN_POS_ROPE    ? "rope"
           : p == KILN_POS_ALIBI ? "alibi"
           : p == KILN_POS_NONE  ? "none"
                                 : "learned";
}

// ---- the full op, and blocks as views into its buffers ---------------------------------------------------

struct cfg {
    int B, T, NH, NKV, HS;
    enum kiln_pos pos;
};

// The full op's inputs and results.
struct full {
    float *qkv;  // (B, T, W), W = (NH + 2 NKV) HS
    float *out;  // (B, T, C), C = NH HS
    float *lse;  // (B, NH, T)
    float *dout; // (B, T, C)
    float *dqkv; // (B, T, W)
};

static void full_run(const struct cfg *c, struct full *f) {
    size_t W = (size_t)(c->NH + 2 * c->NKV) * c->HS, C = (size_t)c->NH * c->HS, BT = (size_t)c->B * c->T;
    f->qkv = frand(BT * W, 1);
    f->out = falloc(BT * C);
    f->lse = falloc((size_t)c->B * c->NH * c->T);
    f->dout = frand(BT * C, 1);
    f->dqkv = falloc(BT * W);
    struct kiln_attn_args a = {.out = f->out,
                               .lse = f->lse,
                               .qkv = f->qkv,
                               .B = c->B,
                               .T = c->T,
                               .NH = c->NH,
                               .NKV = c->NKV,
                               .HS = c->HS,
                               .pos = c->pos,
                               .rope_theta = 10000.0f};
    g_be.ops->attention_forward(g_be.ctx, &a);
    struct kiln_attn_back_args ba = {.dqkv = f->dqkv,
                                     .dout = f->dout,
                                     .qkv = f->qkv,
                                     .out = f->out,
                                     .lse = f->lse,
                                     .B = c->B,
                                     .T = c->T,
                                     .NH = c->NH,
                                     .NKV = c->NKV,
                                     .HS = c->HS,
                                     .pos = c->pos,
                                     .rope_theta = 10000.0f};
    g_be.ops->attention_backward(g_be.ctx, &ba);
}

static void full_free(struct full *f) {
    ffree(f->qkv), ffree(f->out), ffree(f->lse), ffree(f->dout), ffree(f->dqkv);
}

// Queries [qa, qa + nq) against keys [ka, ka + nk) of the full layout: q, k and v are views into qkv (B, T,
// W), out into (B, T, C), lse into (B, NH, T).
static struct kiln_attn_block_args block_args(const struct cfg *c, const float *qkv, float *out, float *lse,
                                              int qa, int nq, int ka, int nk) {
    int W = (c->NH + 2 * c->NKV) * c->HS, C = c->NH * c->HS;
    return (struct kiln_attn_block_args){.out = out + (size_t)qa * C,
                                         .lse = lse + qa,
                                         .q = qkv + (size_t)qa * W,
                                         .k = qkv + (size_t)ka * W + c->NH * c->HS,
                                         .v = qkv + (size_t)ka * W + (c->NH + c->NKV) * c->HS,
                                         .B = c->B,
                                         .Tq = nq,
                                         .Tk = nk,
                                         .NH = c->NH,
                                         .NKV = c->NKV,
                                         .HS = c->HS,
                                         .q0 = qa,
                                         .k0 = ka,
                                         .q_bstride = (size_t)c->T * W,
                                         .kv_bstride = (size_t)c->T * W,
                                         .out_bstride = (size_t)c->T * C,
                                         .lse_stride = (size_t)c->T,
                                         .q_stride = W,
                                         .kv_stride = W,
                                         .out_stride = C,
                                         .pos = c->pos,
                                         .rope_theta = 10000.0f};
}

static void block_forward(const struct cfg *c, const float *qkv, float *out, float *lse, int qa, int nq,
                          int ka, int nk, int accumulate) {
    struct kiln_attn_block_args a = block_args(c, qkv, out, lse, qa, nq, ka, nk);
    a.accumulate = accumulate;
    g_be.ops->attention_block_forward(g_be.ctx, &a);
}

// The backward of that block, accumulated into dqkv (B, T, W).
static void block_backward(const struct cfg *c, const float *qkv, const float *out, const float *lse,
                           const float *dout, float *dqkv, int qa, int nq, int ka, int nk) {
    int W = (c->NH + 2 * c->NKV) * c->HS, C = c->NH * c->HS;
    struct kiln_attn_block_back_args a = {.blk =
                                              block_args(c, qkv, (float *)out, (float *)lse, qa, nq, ka, nk),
                                          .dq = dqkv + (size_t)qa * W,
                                          .dk = dqkv + (size_t)ka * W + c->NH * c->HS,
                                          .dv = dqkv + (size_t)ka * W + (c->NH + c->NKV) * c->HS,
                                          .dout = dout + (size_t)qa * C};
    g_be.ops->attention_block_backward(g_be.ctx, &a);
}

static void shuffle(int *x, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(test_rand_u64(&g_rng) % (uint64_t)(i + 1)), t = x[i];
        x[i] = x[j], x[j] = t;
    }
}

// Every op result of the block path against the full op's (rel_err <= 1e-5: merges and reordered sums only
// round differently).
static void check_against_full(const struct cfg *c, const struct full *f, const float *out, const float *lse,
                               const float *dqkv, const char *how) {
    size_t W = (size_t)(c->NH + 2 * c->NKV) * c->HS, C = (size_t)c->NH * c->HS, BT = (size_t)c->B * c->T;
    char what[160];
    snprintf(what, sizeof(what), "%s out pos=%s", how, pos_name(c->pos));
    assert_rel_err_le(out, f->out, BT * C, 1e-5, what);
    snprintf(what, sizeof(what), "%s lse pos=%s", how, pos_name(c->pos));
    assert_rel_err_le(lse, f->lse, (size_t)c->B * c->NH * c->T, 1e-5, what);
    snprintf(what, sizeof(what), "%s dqkv pos=%s", how, pos_name(c->pos));
    assert_rel_err_le(dqkv, f->dqkv, BT * W, 1e-5, what);
}

// ---- tests -----------------------------------------------------------------------------------------------

static const enum kiln_pos all_pos[] = {KILN_POS_LEARNED, KILN_POS_NONE, KILN_POS_ROPE, KILN_POS_ALIBI};

static void test_one_block_over_the_sequence_is_the_full_op(void **state) {
    for (int p = 0; p < 4; p++) {
        struct cfg c = {2, 13, 4, 2, 16, all_pos[p]};
        struct full f;
        full_run(&c, &f);
        size_t W = (size_t)(c.NH + 2 * c.NKV) * c.HS, BT = (size_t)c.B * c.T;
        float *out = frand(BT * c.NH * c.HS, 1), *lse = frand((size_t)c.B * c.NH * c.T, 1); // overwritten
        float *dqkv = falloc(BT * W);
        block_forward(&c, f.qkv, out, lse, 0, c.T, 0, c.T, 0);
        block_backward(&c, f.qkv, out, lse, f.dout, dqkv, 0, c.T, 0, c.T);
        check_against_full(&c, &f, out, lse, dqkv, "one block");
        ffree(out), ffree(lse), ffree(dqkv);
        full_free(&f);
    }
}

// Ring attention: each query chunk merges its blocks against every key chunk (future ones fully masked) in a
// random order, the first block written and the rest accumulated; the backward sums every block's share,
// given the merged out and lse.
static void test_blocks_merged_in_any_order_are_the_full_op(void **state) {
    static const int bounds[5] = {0, 3, 7, 12, 15}; // unequal chunks
    for (int p = 0; p < 4; p++)
        for (int trial = 0; trial < 3; trial++) {
            struct cfg c = {2, 15, 4, 2, 16, all_pos[p]};
            struct full f;
            full_run(&c, &f);
            size_t W = (size_t)(c.NH + 2 * c.NKV) * c.HS, BT = (size_t)c.B * c.T;
            float *out = frand(BT * c.NH * c.HS, 1), *lse = frand((size_t)c.B * c.NH * c.T, 1);
            float *dqkv = falloc(BT * W);
            for (int qc = 0; qc < 4; qc++) {
                int order[4] = {0, 1, 2, 3};
                shuffle(order, 4);
                for (int s = 0; s < 4; s++) {
                    int kc = order[s];
                    block_forward(&c, f.qkv, out, lse, bounds[qc], bounds[qc + 1] - bounds[qc], bounds[kc],
                                  bounds[kc + 1] - bounds[kc], s > 0);
                }
            }
            int pairs[16];
            for (int i = 0; i < 16; i++)
                pairs[i] = i;
            shuffle(pairs, 16);
            for (int s = 0; s < 16; s++) {
                int qc = pairs[s] / 4, kc = pairs[s] % 4;
                block_backward(&c, f.qkv, out, lse, f.dout, dqkv, bounds[qc], bounds[qc + 1] - bounds[qc],
                               bounds[kc], bounds[kc + 1] - bounds[kc]);
            }
            check_against_full(&c, &f, out, lse, dqkv, "ring of 4 chunks");
            ffree(out), ffree(lse), ffree(dqkv);
            full_free(&f);
        }
}

// Zigzag over 2 ranks: rank 0 holds chunks {0, 3}, rank 1 chunks {1, 2}, each in its own local buffers (q and
// [k | v] separate, so q, kv and out strides all differ, and batch strides are not Tq rows). Every rank
// attends each of its query chunks to every kv chunk of both ranks; dk and dv go back to the kv's owner.
static void test_zigzag_ranks_through_strided_views_are_the_full_op(void **state) {
    static const int chunks[2][2] = {{0, 3}, {1, 2}};
    for (int p = 0; p < 4; p++) {
        struct cfg c = {2, 16, 4, 2, 16, all_pos[p]};
        int L = c.T / 4, LT = 2 * L, C = c.NH * c.HS, KW = c.NKV * c.HS, W = C + 2 * KW;
        struct full f;
        full_run(&c, &f);
        // per rank: q, out, dout, dq (B, LT, C); kv, dkv (B, LT, 2 KW) rows [k | v]; lse (B, NH, LT)
        float *q[2], *kv[2], *out[2], *lse[2], *dout[2], *dq[2], *dkv[2];
        for (int r = 0; r < 2; r++) {
            q[r] = falloc((size_t)c.B * LT * C), kv[r] = falloc((size_t)c.B * LT * 2 * KW);
            out[r] = falloc((size_t)c.B * LT * C), lse[r] = falloc((size_t)c.B * c.NH * LT);
            dout[r] = falloc((size_t)c.B * LT * C);
            dq[r] = falloc((size_t)c.B * LT * C), dkv[r] = falloc((size_t)c.B * LT * 2 * KW);
            for (int b = 0; b < c.B; b++)
                for (int li = 0; li < LT; li++) {
                    int t = chunks[r][li / L] * L + li % L;
                    const float *row = f.qkv + ((size_t)b * c.T + t) * W;
                    memcpy(q[r] + ((size_t)b * LT + li) * C, row, C * sizeof(float));
                    memcpy(kv[r] + ((size_t)b * LT + li) * 2 * KW, row + C, 2 * KW * sizeof(float));
                    memcpy(dout[r] + ((size_t)b * LT + li) * C, f.dout + ((size_t)b * c.T + t) * C,
                           C * sizeof(float));
                }
        }
        struct kiln_attn_block_args fa = {.B = c.B,
                                          .Tq = L,
                                          .Tk = L,
                                          .NH = c.NH,
                                          .NKV = c.NKV,
                                          .HS = c.HS,
                                          .q_bstride = (size_t)LT * C,
                                          .kv_bstride = (size_t)LT * 2 * KW,
                                          .out_bstride = (size_t)LT * C,
                                          .lse_stride = (size_t)LT,
                                          .q_stride = C,
                                          .kv_stride = 2 * KW,
                                          .out_stride = C,
                                          .pos = c.pos,
                                          .rope_theta = 10000.0f};
        for (int r = 0; r < 2; r++)
            for (int step = 0; step < 2; step++) { // kv of rank s = r + step, as a ring passes it
                int s = (r + step) % 2;
                for (int ci = 0; ci < 2; ci++)
                    for (int cj = 0; cj < 2; cj++) {
                        fa.out = out[r] + (size_t)ci * L * C, fa.lse = lse[r] + ci * L;
                        fa.q = q[r] + (size_t)ci * L * C;
                        fa.k = kv[s] + (size_t)cj * L * 2 * KW, fa.v = kv[s] + (size_t)cj * L * 2 * KW + KW;
                        fa.q0 = chunks[r][ci] * L, fa.k0 = chunks[s][cj] * L;
                        fa.accumulate = step > 0 || cj > 0;
                        g_be.ops->attention_block_forward(g_be.ctx, &fa);
                    }
            }
        struct kiln_attn_block_back_args ba = {.blk.B = c.B,
                                               .blk.Tq = L,
                                               .blk.Tk = L,
                                               .blk.NH = c.NH,
                                               .blk.NKV = c.NKV,
                                               .blk.HS = c.HS,
                                               .blk.q_bstride = (size_t)LT * C,
                                               .blk.kv_bstride = (size_t)LT * 2 * KW,
                                               .blk.out_bstride = (size_t)LT * C,
                                               .blk.lse_stride = (size_t)LT,
                                               .blk.q_stride = C,
                                               .blk.kv_stride = 2 * KW,
                                               .blk.out_stride = C,
                                               .blk.pos = c.pos,
                                               .blk.rope_theta = 10000.0f};
        for (int r = 0; r < 2; r++)
            for (int step = 0; step < 2; step++) {
                int s = (r + step) % 2;
                for (int ci = 0; ci < 2; ci++)
                    for (int cj = 0; cj < 2; cj++) {
                        size_t qo = (size_t)ci * L * C, ko = (size_t)cj * L * 2 * KW;
                        ba.dq = dq[r] + qo, ba.dk = dkv[s] + ko, ba.dv = dkv[s] + ko + KW;
                        ba.dout = dout[r] + qo, ba.blk.out = out[r] + qo, ba.blk.lse = lse[r] + ci * L;
                        ba.blk.q = q[r] + qo, ba.blk.k = kv[s] + ko, ba.blk.v = kv[s] + ko + KW;
                        ba.blk.q0 = chunks[r][ci] * L, ba.blk.k0 = chunks[s][cj] * L;
                        g_be.ops->attention_block_backward(g_be.ctx, &ba);
                    }
            }
        // gather the ranks' rows back into the full layout
        size_t BT = (size_t)c.B * c.T;
        float *g_out = falloc(BT * C), *g_lse = falloc((size_t)c.B * c.NH * c.T), *g_dqkv = falloc(BT * W);
        for (int r = 0; r < 2; r++)
            for (int b = 0; b < c.B; b++)
                for (int li = 0; li < LT; li++) {
                    int t = chunks[r][li / L] * L + li % L;
                    size_t lrow = (size_t)b * LT + li, grow = (size_t)b * c.T + t;
                    memcpy(g_out + grow * C, out[r] + lrow * C, C * sizeof(float));
                    memcpy(g_dqkv + grow * W, dq[r] + lrow * C, C * sizeof(float));
                    memcpy(g_dqkv + grow * W + C, dkv[r] + lrow * 2 * KW, 2 * KW * sizeof(float));
                    for (int h = 0; h < c.NH; h++)
                        g_lse[((size_t)b * c.NH + h) * c.T + t] = lse[r][((size_t)b * c.NH + h) * LT + li];
                }
        check_against_full(&c, &f, g_out, g_lse, g_dqkv, "zigzag over 2 ranks");
        for (int r = 0; r < 2; r++) {
            ffree(q[r]), ffree(kv[r]), ffree(out[r]), ffree(lse[r]);
            ffree(dout[r]), ffree(dq[r]), ffree(dkv[r]);
        }
        ffree(g_out), ffree(g_lse), ffree(g_dqkv);
        full_free(&f);
    }
}

// Heads 2..3 of 4 (kv head 1 of 2) as their own op, with head0 = 2 of NH_total = 4: the ALiBi slopes are
// those heads', and the results are those columns of the full op. Nothing outside the slice is written.
static void test_a_slice_of_heads_is_those_heads_of_the_full_op(void **state) {
    static const enum kiln_pos poss[] = {KILN_POS_ALIBI, KILN_POS_ROPE};
    for (int p = 0; p < 2; p++) {
        struct cfg c = {2, 11, 4, 2, 16, poss[p]};
        int HS = c.HS, C = c.NH * HS, W = C + 2 * c.NKV * HS, T = c.T;
        size_t BT = (size_t)c.B * T;
        struct full f;
        full_run(&c, &f);
        float *out = falloc(BT * C), *lse = falloc((size_t)c.B * 2 * T), *dqkv = falloc(BT * W);
        // q: heads 2, 3; k, v: kv head 1; out: columns of heads 2, 3 of a (B, T, C) buffer
        struct kiln_attn_block_args a = {.out = out + 2 * HS,
                                         .lse = lse,
                                         .q = f.qkv + 2 * HS,
                                         .k = f.qkv + (c.NH + 1) * HS,
                                         .v = f.qkv + (c.NH + c.NKV + 1) * HS,
                                         .B = c.B,
                                         .Tq = T,
                                         .Tk = T,
                                         .NH = 2,
                                         .NKV = 1,
                                         .HS = HS,
                                         .q_bstride = (size_t)T * W,
                                         .kv_bstride = (size_t)T * W,
                                         .out_bstride = (size_t)T * C,
                                         .lse_stride = (size_t)T,
                                         .q_stride = W,
                                         .kv_stride = W,
                                         .out_stride = C,
                                         .pos = c.pos,
                                         .rope_theta = 10000.0f,
                                         .head0 = 2,
                                         .NH_total = 4};
        g_be.ops->attention_block_forward(g_be.ctx, &a);
        struct kiln_attn_block_back_args ba = {.dq = dqkv + 2 * HS,
                                               .dk = dqkv + (c.NH + 1) * HS,
                                               .dv = dqkv + (c.NH + c.NKV + 1) * HS,
                                               .dout = f.dout + 2 * HS,
                                               .blk.out = out + 2 * HS,
                                               .blk.lse = lse,
                                               .blk.q = a.q,
                                               .blk.k = a.k,
                                               .blk.v = a.v,
                                               .blk.B = c.B,
                                               .blk.Tq = T,
                                               .blk.Tk = T,
                                               .blk.NH = 2,
                                               .blk.NKV = 1,
                                               .blk.HS = HS,
                                               .blk.q_bstride = a.q_bstride,
                                               .blk.kv_bstride = a.kv_bstride,
                                               .blk.out_bstride = a.out_bstride,
                                               .blk.lse_stride = a.lse_stride,
                                               .blk.q_stride = W,
                                               .blk.kv_stride = W,
                                               .blk.out_stride = C,
                                               .blk.pos = c.pos,
                                               .blk.rope_theta = 10000.0f,
                                               .blk.head0 = 2,
                                               .blk.NH_total = 4};
        g_be.ops->attention_block_backward(g_be.ctx, &ba);
        // the full op's values where the slice writes, zero elsewhere
        float *want_out = falloc(BT * C), *want_lse = falloc((size_t)c.B * 2 * T),
              *want_dqkv = falloc(BT * W);
        for (size_t bt = 0; bt < BT; bt++) {
            memcpy(want_out + bt * C + 2 * HS, f.out + bt * C + 2 * HS, 2 * HS * sizeof(float));
            memcpy(want_dqkv + bt * W + 2 * HS, f.dqkv + bt * W + 2 * HS, 2 * HS * sizeof(float));
            memcpy(want_dqkv + bt * W + (c.NH + 1) * HS, f.dqkv + bt * W + (c.NH + 1) * HS,
                   HS * sizeof(float));
            memcpy(want_dqkv + bt * W + (c.NH + c.NKV + 1) * HS, f.dqkv + bt * W + (c.NH + c.NKV + 1) * HS,
                   HS * sizeof(float));
        }
        for (int b = 0; b < c.B; b++)
            memcpy(want_lse + (size_t)b * 2 * T, f.lse + ((size_t)b * c.NH + 2) * T, 2 * T * sizeof(float));
        char what[96];
        snprintf(what, sizeof(what), "heads 2..3 of 4 out pos=%s", pos_name(c.pos));
        assert_rel_err_le(out, want_out, BT * C, 1e-5, what);
        snprintf(what, sizeof(what), "heads 2..3 of 4 lse pos=%s", pos_name(c.pos));
        assert_rel_err_le(lse, want_lse, (size_t)c.B * 2 * T, 1e-5, what);
        snprintf(what, sizeof(what), "heads 2..3 of 4 dqkv pos=%s", pos_name(c.pos));
        assert_rel_err_le(dqkv, want_dqkv, BT * W, 1e-5, what);
        for (size_t i = 0; i < BT * C; i++) // outside the slice: exactly untouched
            if ((i % C) < (size_t)2 * HS)
                assert_true(out[i] == 0.0f);
        for (size_t i = 0; i < BT * W; i++) {
            int col = (int)(i % W), head = col / HS; // q heads 0..3, k heads 4, 5, v heads 6, 7
            if (head != 2 && head != 3 && head != c.NH + 1 && head != c.NH + c.NKV + 1)
                assert_true(dqkv[i] == 0.0f);
        }
        ffree(out), ffree(lse), ffree(dqkv), ffree(want_out), ffree(want_lse), ffree(want_dqkv);
        full_free(&f);
    }
}

// ---- a double reference at global positions, for finite differences ---------------------------------------

struct blk_ref {
    double *q, *k, *v; // (B, Tq, NH HS), (B, Tk, NKV HS) each
    double *out, *lse; // (B, Tq, NH HS), (B, NH, Tq); a row that sees nothing: out 0, lse -inf
    double *rq, *rk;   // scratch: rotated q and k
    const float *R;    // (B, Tq, NH HS): loss = sum(out * R)
    int B, Tq, Tk, NH, NKV, HS, q0, k0;
    int head0, NH_total; // a power of two NH_total: slope of global head g = 2^(-8 (g + 1) / NH_total)
    enum kiln_pos pos;
};

// GPT-NeoX rotation of the pairs (i, i + HS/2) by t * theta^(-2i/HS), theta = 10000
static void rotate_d(double *x, int HS, int t) {
    for (int i = 0; i < HS / 2; i++) {
        double ang = t * pow(10000.0, -2.0 * i / HS), c = cos(ang), s = sin(ang);
        double x1 = x[i], x2 = x[i + HS / 2];
        x[i] = x1 * c - x2 * s;
        x[i + HS / 2] = x2 * c + x1 * s;
    }
}

static double blk_ref_loss(void *p) {
    struct blk_ref *r = p;
    int NH = r->NH, NKV = r->NKV, HS = r->HS, QW = NH * HS, KW = NKV * HS;
    memcpy(r->rq, r->q, sizeof(double) * r->B * r->Tq * QW);
    memcpy(r->rk, r->k, sizeof(double) * r->B * r->Tk * KW);
    if (r->pos == KILN_POS_ROPE) {
        for (int bi = 0; bi < r->B * r->Tq; bi++)
            for (int h = 0; h < NH; h++)
                rotate_d(r->rq + (size_t)bi * QW + h * HS, HS, r->q0 + bi % r->Tq);
        for (int bj = 0; bj < r->B * r->Tk; bj++)
            for (int h = 0; h < NKV; h++)
                rotate_d(r->rk + (size_t)bj * KW + h * HS, HS, r->k0 + bj % r->Tk);
    }
    double sc[64];
    for (int b = 0; b < r->B; b++)
        for (int h = 0; h < NH; h++) {
            int kvh = h / (NH / NKV);
            double slope = r->pos == KILN_POS_ALIBI ? pow(2.0, -8.0 * (r->head0 + h + 1) / r->NH_total) : 0.0;
            for (int i = 0; i < r->Tq; i++) {
                const double *q = r->rq + ((size_t)b * r->Tq + i) * QW + h * HS;
                double *o = r->out + ((size_t)b * r->Tq + i) * QW + h * HS, mx = -INFINITY;
                int n = 0;
                for (int j = 0; j < r->Tk && r->k0 + j <= r->q0 + i; j++, n++) {
                    const double *k = r->rk + ((size_t)b * r->Tk + j) * KW + kvh * HS;
                    double d = 0;
                    for (int e = 0; e < HS; e++)
                        d += q[e] * k[e];
                    sc[j] = d / sqrt((double)HS) + slope * ((r->k0 + j) - (r->q0 + i));
                    mx = fmax(mx, sc[j]);
                }
                double sum = 0;
                for (int j = 0; j < n; j++)
                    sum += exp(sc[j] - mx);
                r->lse[((size_t)b * NH + h) * r->Tq + i] = n ? mx + log(sum) : -INFINITY;
                for (int e = 0; e < HS; e++) {
                    double acc = 0;
                    for (int j = 0; j < n; j++)
                        acc += exp(sc[j] - mx) / sum * r->v[((size_t)b * r->Tk + j) * KW + kvh * HS + e];
                    o[e] = acc;
                }
            }
        }
    return r->R ? dot_r(r->out, r->R, (size_t)r->B * r->Tq * QW) : 0.0;
}

struct fd_case {
    int Tq, Tk, q0, k0;
    enum kiln_pos pos;
};

static void check_block_gradient(const struct fd_case *fc) {
    int B = 2, NH = 4, NKV = 2, HS = 8, QW = NH * HS, KW = NKV * HS;
    int head0 = 4, NH_total = 8; // ALiBi slopes of heads 4..7 of 8
    size_t nq = (size_t)B * fc->Tq * QW, nk = (size_t)B * fc->Tk * KW, nl = (size_t)B * NH * fc->Tq;
    float *q = frand(nq, 1), *k = frand(nk, 1), *v = frand(nk, 1), *R = frand(nq, 1);
    float *out = frand(nq, 1), *lse = frand(nl, 1);                   // overwritten
    float *dq = frand(nq, 1), *dk = frand(nk, 1), *dv = frand(nk, 1); // accumulated into
    float *dq0 = falloc(nq), *dk0 = falloc(nk), *dv0 = falloc(nk);
    memcpy(dq0, dq, nq * sizeof(float)), memcpy(dk0, dk, nk * sizeof(float)),
        memcpy(dv0, dv, nk * sizeof(float));
    struct kiln_attn_block_args a = {.out = out,
                                     .lse = lse,
                                     .q = q,
                                     .k = k,
                                     .v = v,
                                     .B = B,
                                     .Tq = fc->Tq,
                                     .Tk = fc->Tk,
                                     .NH = NH,
                                     .NKV = NKV,
                                     .HS = HS,
                                     .q0 = fc->q0,
                                     .k0 = fc->k0,
                                     .q_bstride = (size_t)fc->Tq * QW,
                                     .kv_bstride = (size_t)fc->Tk * KW,
                                     .out_bstride = (size_t)fc->Tq * QW,
                                     .lse_stride = (size_t)fc->Tq,
                                     .q_stride = QW,
                                     .kv_stride = KW,
                                     .out_stride = QW,
                                     .pos = fc->pos,
                                     .rope_theta = 10000.0f,
                                     .head0 = head0,
                                     .NH_total = NH_total};
    g_be.ops->attention_block_forward(g_be.ctx, &a);
    struct kiln_attn_block_back_args ba = {.dq = dq,
                                           .dk = dk,
                                           .dv = dv,
                                           .dout = R,
                                           .blk.out = out,
                                           .blk.lse = lse,
                                           .blk.q = q,
                                           .blk.k = k,
                                           .blk.v = v,
                                           .blk.B = B,
                                           .blk.Tq = fc->Tq,
                                           .blk.Tk = fc->Tk,
                                           .blk.NH = NH,
                                           .blk.NKV = NKV,
                                           .blk.HS = HS,
                                           .blk.q0 = fc->q0,
                                           .blk.k0 = fc->k0,
                                           .blk.q_bstride = a.q_bstride,
                                           .blk.kv_bstride = a.kv_bstride,
                                           .blk.out_bstride = a.out_bstride,
                                           .blk.lse_stride = a.lse_stride,
                                           .blk.q_stride = QW,
                                           .blk.kv_stride = KW,
                                           .blk.out_stride = QW,
                                           .blk.pos = fc->pos,
                                           .blk.rope_theta = 10000.0f,
                                           .blk.head0 = head0,
                                           .blk.NH_total = NH_total};
    g_be.ops->attention_block_backward(g_be.ctx, &ba);

    struct blk_ref r = {d_of(q, nq),
                        d_of(k, nk),
                        d_of(v, nk),
                        malloc(sizeof(double) * nq),
                        malloc(sizeof(double) * nl),
                        malloc(sizeof(double) * nq),
                        malloc(sizeof(double) * nk),
                        R,
                        B,
                        fc->Tq,
                        fc->Tk,
                        NH,
                        NKV,
                        HS,
                        fc->q0,
                        fc->k0,
                        head0,
                        NH_total,
                        fc->pos};
    blk_ref_loss(&r);
    char what[160];
    snprintf(what, sizeof(what), "block Tq=%d Tk=%d q0=%d k0=%d pos=%s", fc->Tq, fc->Tk, fc->q0, fc->k0,
             pos_name(fc->pos));
    check_vs_double(out, r.out, nq, 2e-6, what);
    for (size_t i = 0; i < nl; i++) {
        if (isinf(r.lse[i])) { // a row that sees no key
            if (lse[i] != -INFINITY)
                fail_msg("%s: lse[%zu] = %g, want -inf", what, i, lse[i]);
        } else if (!(fabs(lse[i] - r.lse[i]) <= 1e-5 * (1 + fabs(r.lse[i])))) {
            fail_msg("%s: lse[%zu] = %.7g, reference %.7g", what, i, lse[i], r.lse[i]);
        }
    }
    // the op's contribution = what it added; against central differences of the double reference
    double *g = malloc(sizeof(double) * (nq > nk ? nq : nk));
    struct {
        const char *name;
        double *x;
        const float *got, *before;
        size_t n;
    } grads[3] = {{"dq", r.q, dq, dq0, nq}, {"dk", r.k, dk, dk0, nk}, {"dv", r.v, dv, dv0, nk}};
    float *added = malloc(sizeof(float) * (nq > nk ? nq : nk));
    for (int w = 0; w < 3; w++) {
        numgrad(blk_ref_loss, &r, grads[w].x, grads[w].n, 1e-5, g);
        for (size_t i = 0; i < grads[w].n; i++)
            added[i] = grads[w].got[i] - grads[w].before[i];
        char gw[200];
        snprintf(gw, sizeof(gw), "%s: %s", what, grads[w].name);
        check_vs_double(added, g, grads[w].n, 1e-4, gw);
    }
    free(added), free(g);
    free(r.q), free(r.k), free(r.v), free(r.out), free(r.lse), free(r.rq), free(r.rk);
    ffree(q), ffree(k), ffree(v), ffree(R), ffree(out), ffree(lse);
    ffree(dq), ffree(dk), ffree(dv), ffree(dq0), ffree(dk0), ffree(dv0);
}

static void test_block_gradients_at_offsets_match_finite_differences(void **state) {
    static const enum kiln_pos poss[] = {KILN_POS_LEARNED, KILN_POS_ROPE, KILN_POS_ALIBI};
    for (int p = 0; p < 3; p++) {
        struct fd_case past = {5, 6, 7, 4, poss[p]};   // queries 7..11, keys 4..9: partly masked
        struct fd_case future = {5, 4, 2, 4, poss[p]}; // queries 2..6, keys 4..7: rows 0, 1 see nothing
        check_block_gradient(&past);
        check_block_gradient(&future);
    }
}

// A block whose keys all lie after its queries: without accumulate, lse = -inf and out = 0; with accumulate,
// out and lse keep what they held, bit for bit; its backward adds nothing. In a partly visible block, only
// the rows that see nothing are left alone.
static void test_a_block_that_sees_nothing_changes_nothing(void **state) {
    int B = 2, NH = 4, NKV = 2, HS = 16, Tq = 5, Tk = 6, QW = NH * HS, KW = NKV * HS;
    size_t nq = (size_t)B * Tq * QW, nk = (size_t)B * Tk * KW, nl = (size_t)B * NH * Tq;
    float *q = frand(nq, 1), *k = frand(nk, 1), *v = frand(nk, 1), *dout = frand(nq, 1);
    float *out = frand(nq, 1), *lse = frand(nl, 1), *out0 = falloc(nq), *lse0 = falloc(nl);
    memcpy(out0, out, nq * sizeof(float)), memcpy(lse0, lse, nl * sizeof(float));
    static const enum kiln_pos poss[] = {KILN_POS_LEARNED, KILN_POS_ROPE, KILN_POS_ALIBI};
    for (int p = 0; p < 3; p++) {
        struct kiln_attn_block_args a = {.out = out,
                                         .lse = lse,
                                         .q = q,
                                         .k = k,
                                         .v = v,
                                         .B = B,
                                         .Tq = Tq,
                                         .Tk = Tk,
                                         .NH = NH,
                                         .NKV = NKV,
                                         .HS = HS,
                                         .q0 = 3,
                                         .k0 = 3 + Tq, // first key after the last query
                                         .q_bstride = (size_t)Tq * QW,
                                         .kv_bstride = (size_t)Tk * KW,
                                         .out_bstride = (size_t)Tq * QW,
                                         .lse_stride = (size_t)Tq,
                                         .q_stride = QW,
                                         .kv_stride = KW,
                                         .out_stride = QW,
                                         .pos = poss[p],
                                         .rope_theta = 10000.0f,
                                         .accumulate = 1};
        g_be.ops->attention_block_forward(g_be.ctx, &a);
        assert_memory_equal(out, out0, nq * sizeof(float));
        assert_memory_equal(lse, lse0, nl * sizeof(float));

        // backward with a finite final out and lse (as other blocks would leave them): nothing added
        float *dq = frand(nq, 1), *dk = frand(nk, 1), *dv = frand(nk, 1);
        float *dq0 = falloc(nq), *dk0 = falloc(nk), *dv0 = falloc(nk);
        memcpy(dq0, dq, nq * sizeof(float)), memcpy(dk0, dk, nk * sizeof(float));
        memcpy(dv0, dv, nk * sizeof(float));
        struct kiln_attn_block_back_args ba = {.dq = dq,
                                               .dk = dk,
                                               .dv = dv,
                                               .dout = dout,
                                               .blk.out = out,
                                               .blk.lse = lse,
                                               .blk.q = q,
                                               .blk.k = k,
                                               .blk.v = v,
                                               .blk.B = B,
                                               .blk.Tq = Tq,
                                               .blk.Tk = Tk,
                                               .blk.NH = NH,
                                               .blk.NKV = NKV,
                                               .blk.HS = HS,
                                               .blk.q0 = a.q0,
                                               .blk.k0 = a.k0,
                                               .blk.q_bstride = a.q_bstride,
                                               .blk.kv_bstride = a.kv_bstride,
                                               .blk.out_bstride = a.out_bstride,
                                               .blk.lse_stride = a.lse_stride,
                                               .blk.q_stride = QW,
                                               .blk.kv_stride = KW,
                                               .blk.out_stride = QW,
                                               .blk.pos = poss[p],
                                               .blk.rope_theta = 10000.0f};
        g_be.ops->attention_block_backward(g_be.ctx, &ba);
        assert_memory_equal(dq, dq0, nq * sizeof(float));
        assert_memory_equal(dk, dk0, nk * sizeof(float));
        assert_memory_equal(dv, dv0, nk * sizeof(float));

        a.accumulate = 0; // a block of its own: lse = -inf, out = 0
        g_be.ops->attention_block_forward(g_be.ctx, &a);
        for (size_t i = 0; i < nq; i++)
            assert_true(out[i] == 0.0f);
        for (size_t i = 0; i < nl; i++)
            assert_true(lse[i] == -INFINITY);
        memcpy(out, out0, nq * sizeof(float)), memcpy(lse, lse0, nl * sizeof(float));

        // keys 2.. against queries 0..4: rows 0 and 1 see nothing and keep their values, the others merge
        a.q0 = 0, a.k0 = 2, a.accumulate = 1;
        g_be.ops->attention_block_forward(g_be.ctx, &a);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tq; i++) {
                size_t o = ((size_t)b * Tq + i) * QW;
                int same = memcmp(out + o, out0 + o, QW * sizeof(float)) == 0;
                if (same != (i < 2))
                    fail_msg("%s: row %d of the partly visible block %s", pos_name(poss[p]), i,
                             i < 2 ? "changed" : "did not merge");
                for (int h = 0; h < NH; h++) {
                    size_t l = ((size_t)b * NH + h) * Tq + i;
                    assert_true((lse[l] == lse0[l]) == (i < 2));
                }
            }
        memcpy(out, out0, nq * sizeof(float)), memcpy(lse, lse0, nl * sizeof(float));
        ffree(dq), ffree(dk), ffree(dv), ffree(dq0), ffree(dk0), ffree(dv0);
    }
    ffree(q), ffree(k), ffree(v), ffree(dout), ffree(out), ffree(lse), ffree(out0), ffree(lse0);
}

static void test_block_attention_is_bitwise_identical_with_1_and_2_threads(void **state) {
    int B = 2, NH = 4, NKV = 2, HS = 16, Tq = 30, Tk = 40, QW = NH * HS, KW = NKV * HS;
    size_t nq = (size_t)B * Tq * QW, nk = (size_t)B * Tk * KW, nl = (size_t)B * NH * Tq;
    float *q = frand(nq, 1), *k = frand(nk, 1), *v = frand(nk, 1), *dout = frand(nq, 1);
    float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
    for (int t = 0; t < 2; t++) {
        struct kiln_backend be;
        struct kiln_error err;
        struct kiln_backend_opts opts = {.threads = t + 1};
        assert_int_equal(kiln_cpu_backend_open(&opts, &be, &err), 0);
        out[t] = falloc(nq), lse[t] = falloc(nl), dq[t] = falloc(nq), dk[t] = falloc(nk), dv[t] = falloc(nk);
        struct kiln_attn_block_args a = {.out = out[t],
                                         .lse = lse[t],
                                         .q = q,
                                         .k = k,
                                         .v = v,
                                         .B = B,
                                         .Tq = Tq,
                                         .Tk = Tk,
                                         .NH = NH,
                                         .NKV = NKV,
                                         .HS = HS,
                                         .q0 = 20,
                                         .k0 = 5,
                                         .q_bstride = (size_t)Tq * QW,
                                         .kv_bstride = (size_t)Tk * KW,
                                         .out_bstride = (size_t)Tq * QW,
                                         .lse_stride = (size_t)Tq,
                                         .q_stride = QW,
                                         .kv_stride = KW,
                                         .out_stride = QW,
                                         .pos = KILN_POS_ROPE,
                                         .rope_theta = 10000.0f};
        be.ops->attention_block_forward(be.ctx, &a);
        a.k0 = 30, a.accumulate = 1; // a second, partly visible block merged in
        be.ops->attention_block_forward(be.ctx, &a);
        struct kiln_attn_block_back_args ba = {.dq = dq[t],
                                               .dk = dk[t],
                                               .dv = dv[t],
                                               .dout = dout,
                                               .blk.out = out[t],
                                               .blk.lse = lse[t],
                                               .blk.q = q,
                                               .blk.k = k,
                                               .blk.v = v,
                                               .blk.B = B,
                                               .blk.Tq = Tq,
                                               .blk.Tk = Tk,
                                               .blk.NH = NH,
                                               .blk.NKV = NKV,
                                               .blk.HS = HS,
                                               .blk.q0 = 20,
                                               .blk.k0 = 5,
                                               .blk.q_bstride = a.q_bstride,
                                               .blk.kv_bstride = a.kv_bstride,
                                               .blk.out_bstride = a.out_bstride,
                                               .blk.lse_stride = a.lse_stride,
                                               .blk.q_stride = QW,
                                               .blk.kv_stride = KW,
                                               .blk.out_stride = QW,
                                               .blk.pos = KILN_POS_ROPE,
                                               .blk.rope_theta = 10000.0f};
        be.ops->attention_block_backward(be.ctx, &ba);
        ba.blk.k0 = 30;
        be.ops->attention_block_backward(be.ctx, &ba);
        kiln_backend_close(&be);
    }
    assert_memory_equal(out[0], out[1], nq * sizeof(float));
    assert_memory_equal(lse[0], lse[1], nl * sizeof(float));
    assert_memory_equal(dq[0], dq[1], nq * sizeof(float));
    assert_memory_equal(dk[0], dk[1], nk * sizeof(float));
    assert_memory_equal(dv[0], dv[1], nk * sizeof(float));
    for (int t = 0; t < 2; t++)
        ffree(out[t]), ffree(lse[t]), ffree(dq[t]), ffree(dk[t]), ffree(dv[t]);
    ffree(q), ffree(k), ffree(v), ffree(dout);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_block_over_the_sequence_is_the_full_op),
        cmocka_unit_test(test_blocks_merged_in_any_order_are_the_full_op),
        cmocka_unit_test(test_zigzag_ranks_through_strided_views_are_the_full_op),
        cmocka_unit_test(test_a_slice_of_heads_is_those_heads_of_the_full_op),
        cmocka_unit_test(test_block_gradients_at_offsets_match_finite_differences),
        cmocka_unit_test(test_a_block_that_sees_nothing_changes_nothing),
        cmocka_unit_test(test_block_attention_is_bitwise_identical_with_1_and_2_threads),
    };
    return cmocka_run_group_tests(tests, cpu_group_setup, cpu_group_teardown);
}
