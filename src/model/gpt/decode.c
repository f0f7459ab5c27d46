// KV-cache decoding (kiln sample, kiln logits, --sample-every): one token a step through the layers, with
// each layer's keys and values kept for the positions so far. The same ops and weights as the forward
// (block.c).
#include "model/gpt/internal.h"

#include <stdlib.h>
#include <string.h>

int gpt_decode_begin(struct kiln_model *g, int B, int maxT, struct kiln_error *err) {
    KILN_ASSERT(!g->opts.external_weights); // decoding runs on one process, over whole weights
    const struct kiln_model_split *sp = &g->opts.split;
    if (sp->heads > 1 || sp->kv_heads > 1 || sp->hidden > 1 || sp->vocab > 1)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "decoding a split model (kiln sample): sampling runs on one process over the whole "
            "weights; export or load the checkpoint whole first");
    struct dims d = dims_of(&g->cfg, &g->opts.split, B, 1);
    struct decode *dc = &g->dec;
    size_t ab = kiln_dtype_bytes(g->be->act_dtype), kv = (size_t)B * maxT * d.NKV * d.HS;
    size_t qkv = (size_t)B * d.QKV, fc = (size_t)B * d.FCO, pre = g->fuse.on ? qkv + fc : 0;
    dc->B = B;
    dc->maxT = maxT;
#define SET(b, n, s, eb) (dc->b = (struct buf){.elems = (n), .slots = (s), .elem_bytes = (eb)})
    SET(k, kv, d.L, ab);
    SET(v, kv, d.L, ab);
    SET(x, (size_t)B * d.C, 1, ab);
    SET(ln, (size_t)B * d.C, 1, ab);
    SET(pre, pre, 1, ab);
    SET(qkv, pre ? 0 : qkv, 1, ab);
    SET(qkv_raw, (size_t)(d.qk_norm ? B : 0) * d.QKV, 1, ab);
    SET(atty, (size_t)B * d.AO, 1, ab);
    SET(ao, (size_t)B * d.C, 1, ab);
    SET(fc_pre, pre ? 0 : fc, 1, ab);
    SET(fc_act, (size_t)B * d.H, 1, ab);
    SET(logits, (size_t)B * d.Vp, 1, ab);
    SET(mean, (size_t)B, 1, sizeof(float));
    SET(rstd, (size_t)B, 1, sizeof(float));
    SET(tokens, (size_t)B, 1, sizeof(int32_t));
#undef SET
    struct buf *bufs[] = {&dc->k,      &dc->v,       &dc->x,    &dc->ln,   &dc->pre,
                          &dc->qkv,    &dc->qkv_raw, &dc->atty, &dc->ao,   &dc->fc_pre,
                          &dc->fc_act, &dc->logits,  &dc->mean, &dc->rstd, &dc->tokens};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        gpt_free_buf(g, bufs[i]);
        int rc = gpt_alloc(g, &bufs[i]->p, buf_bytes(bufs[i]), err);
        if (rc)
            return rc;
    }
    free(dc->logits_host);
    dc->logits_host = kiln_xmalloc((size_t)B * d.Vp * sizeof(float));
    return 0;
}

void gpt_decode_step(struct kiln_model *g, const int32_t *tokens, int pos, float *logits) {
    struct decode *dc = &g->dec;
    KILN_ASSERT(dc->x.p && pos >= 0 && pos < dc->maxT);
    struct dims d = dims_of(&g->cfg, &g->opts.split, dc->B, 1);
    int B = dc->B;
    g->ops->upload(g->ctx, dc->tokens.p, tokens, (size_t)B * sizeof(int32_t));
    // x = wte[tok] + wpe[pos]: the embedding op with T = 1 and the position table shifted to pos
    const void *wpe = g->pt.wpe >= 0 ? act_at(g, W(g, g->pt.wpe), (size_t)pos * d.C) : NULL;
    struct kiln_embed_args e = {.out = dc->x.p,
                                .tokens = dc->tokens.p,
                                .tokens_host = tokens,
                                .wte = W(g, g->pt.wte),
                                .wpe = wpe,
                                .B = B,
                                .T = 1,
                                .C = d.C};
    g->ops->embed_forward(g->ctx, &e);
    int S = d.QKV + d.FCO;
    for (int l = 0; l < d.L; l++) {
        const int *ix = g->pt.layer[l];
        gpt_norm_fwd(g, dc->ln.p, dc->mean.p, dc->rstd.p, NULL, dc->x.p, NULL, ix[KILN_LN1_W], ix[KILN_LN1_B],
                     B);
        const void *qkv = g->fuse.on ? dc->pre.p : dc->qkv.p;
        if (g->fuse.on) { // [qkv | fc_pre] in one GEMM, as parallel_fused_fwd
            gpt_matmul_fwd(g, dc->pre.p, NULL, dc->ln.p, ix[KILN_QKV_W], ix[KILN_QKV_B], B, d.C, S,
                           KILN_ACT_NONE, 0);
        } else if (d.qk_norm) {
            gpt_matmul_fwd(g, dc->qkv_raw.p, NULL, dc->ln.p, ix[KILN_QKV_W], ix[KILN_QKV_B], B, d.C, d.QKV,
                           KILN_ACT_NONE, 0);
            gpt_qk_norm_forward(g, &d, l, dc->qkv.p, dc->qkv_raw.p, B, dc->mean.p, dc->rstd.p, dc->mean.p,
                                dc->rstd.p);
        } else {
            gpt_matmul_fwd(g, dc->qkv.p, NULL, dc->ln.p, ix[KILN_QKV_W], ix[KILN_QKV_B], B, d.C, d.QKV,
                           KILN_ACT_NONE, 0);
        }
        struct kiln_attn_decode_args at = {.out = dc->atty.p,
                                           .kcache = buf_at(&dc->k, l),
                                           .vcache = buf_at(&dc->v, l),
                                           .qkv = qkv,
                                           .B = B,
                                           .maxT = dc->maxT,
                                           .pos = pos,
                                           .NH = d.NH,
                                           .NKV = d.NKV,
                                           .HS = d.HS,
                                           .pos_kind = g->cfg.pos,
                                           .rope_theta = g->cfg.rope_theta,
                                           .qkv_stride = g->fuse.on ? S : 0};
        g->ops->attention_decode(g->ctx, &at);
        gpt_matmul_fwd(g, dc->ao.p, NULL, dc->atty.p, ix[KILN_ATTNO_W], ix[KILN_ATTNO_B], B, d.AO, d.C,
                       KILN_ACT_NONE, 0);
        if (g->fuse.on) {
            gpt_mlp_act_fwd(g, &d, l, act_at(g, dc->pre.p, (size_t)d.QKV), S, dc->fc_act.p, dc->ao.p, 1, B);
        } else if (g->cfg.parallel_block) {
            gpt_mlp_fwd(g, &d, l, dc->ln.p, dc->fc_pre.p, dc->fc_act.p, dc->ao.p, 1, B);
        } else {
            g->ops->add(g->ctx, dc->x.p, dc->x.p, dc->ao.p, (size_t)B * d.C);
            gpt_norm_fwd(g, dc->ln.p, dc->mean.p, dc->rstd.p, NULL, dc->x.p, NULL, ix[KILN_LN2_W],
                         ix[KILN_LN2_B], B);
            gpt_mlp_fwd(g, &d, l, dc->ln.p, dc->fc_pre.p, dc->fc_act.p, dc->ao.p, 0, B);
        }
        g->ops->add(g->ctx, dc->x.p, dc->x.p, dc->ao.p, (size_t)B * d.C);
    }
    gpt_norm_fwd(g, dc->ln.p, dc->mean.p, dc->rstd.p, NULL, dc->x.p, NULL, g->pt.lnf_w, g->pt.lnf_b, B);
    gpt_matmul_fwd(g, dc->logits.p, NULL, dc->ln.p, gpt_head_index(g), -1, B, d.C, d.Vp, KILN_ACT_NONE, 0);
    g->ops->download_f32(g->ctx, dc->logits_host, dc->logits.p, g->be->act_dtype, (size_t)B * d.Vp);
    for (int b = 0; b < B; b++)
        memcpy(logits + (size_t)b * d.V, dc->logits_host + (size_t)b * d.Vp, (size_t)d.V * sizeof(float));
}
