// The GPT forward and backward passes, written once against the ops table (docs/architecture.md).
//
// A sequential block (GPT-2):           a parallel block (PaLM, GPT-J):
//   h = x + attn(norm1(x))                x' = x + attn(norm1(x)) + mlp(norm1(x))
//   x' = h + mlp(norm2(h))
//
// Residual adds are fused into the next normalization: the norm that ends layer l computes
// x[l+1] = residual + branch and normalizes it as layer l+1's norm1 (or as the final norm). So layer l owns
// the tail op that produces ln1[l+1]; backward mirrors this.
//
// A parallel block's two input projections both read norm1(x): they run as one GEMM over [W_qkv; W_fc]
// (params.c stores the two back to back), writing [qkv | fc_pre] rows that attention and the MLP's activation
// read as column slices (the ops take row strides). The backward gathers [dqkv | dfc] the same way, for one
// GEMM giving dL/dln1 and one giving d[W_qkv; W_fc]. struct fusion says when that applies.
//
// This file holds one block's forward (layer_forward) and its mirror, the backward's pieces; model.c strings
// the blocks together between the embedding and the loss.
#include "model/gpt/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

// ----------------------------------------------------------------------------
// forward

void gpt_norm_fwd(struct kiln_model *g, void *out, float *mean, float *rstd, void *res_out, const void *inp,
                  const void *res_in, int wi, int bi, int N) {
    struct kiln_norm_args a = {.out = out,
                               .mean = g->cfg.norm_rms ? NULL : mean,
                               .rstd = rstd,
                               .res_out = res_out,
                               .inp = inp,
                               .res_in = res_in,
                               .weight = W(g, wi),
                               .bias = W(g, bi),
                               .N = N,
                               .C = g->cfg.n_embd,
                               .rms = g->cfg.norm_rms,
                               .eps = g->cfg.norm_eps};
    g->ops->norm_forward(g->ctx, &a);
}

void gpt_matmul_fwd(struct kiln_model *g, void *out, void *pre, const void *inp, int wi, int bi, int N,
                    int IC, int OC, enum kiln_act act, int accumulate) {
    struct kiln_matmul_args a = {.out = out,
                                 .pre = pre,
                                 .inp = inp,
                                 .weight = W(g, wi),
                                 .bias = W(g, bi),
                                 .N = N,
                                 .IC = IC,
                                 .OC = OC,
                                 .act = act,
                                 .accumulate = accumulate};
    gpt_linear_fwd(g, wi, &a);
}

// ---- linear layers: the backend's GEMM, or the hook a strategy put in its place (model/model.h)

void gpt_linear_fwd(struct kiln_model *g, int wi, const struct kiln_matmul_args *a) {
    int l;
    enum kiln_linear k = linear_of(g, wi, a->OC, &l);
    kiln_model_linear_forward_with(&g->linear, g->be, l, k, a);
}

void gpt_linear_bwd(struct kiln_model *g, int wi, const struct kiln_matmul_back_args *a) {
    int l;
    enum kiln_linear k = linear_of(g, wi, a->OC, &l);
    kiln_model_linear_backward_with(&g->linear, g->be, l, k, a);
}

// The MLP of layer l after its input projection: fc_act = act(fc_pre) (rows of fc_pre `stride` elements
// apart, 0 = FCO), then out = (or +=) self.c_proj(fc_act).
// fc_act = SwiGLU or GELU of fc_pre (rows stride apart, 0 = dense)
void gpt_mlp_activation(struct kiln_model *g, const struct dims *d, const void *fc_pre, int stride,
                        void *fc_act, int N) {
    if (g->cfg.mlp_swiglu) {
        struct kiln_swiglu_args s = {.out = fc_act, .inp = fc_pre, .N = N, .H = d->H, .inp_stride = stride};
        g->ops->swiglu_forward(g->ctx, &s);
    } else {
        struct kiln_gelu_args s = {.out = fc_act, .inp = fc_pre, .N = N, .H = d->H, .inp_stride = stride};
        g->ops->gelu_forward(g->ctx, &s);
    }
}

void gpt_mlp_act_fwd(struct kiln_model *g, const struct dims *d, int l, const void *fc_pre, int stride,
                     void *fc_act, void *out, int accumulate, int N) {
    const int *ix = g->pt.layer[l];
    gpt_mlp_activation(g, d, fc_pre, stride, fc_act, N);
    if (out)
        gpt_matmul_fwd(g, out, NULL, fc_act, ix[KILN_MLPO_W], ix[KILN_MLPO_B], N, d->H, d->C, KILN_ACT_NONE,
                       accumulate);
}

// the MLP's hidden activation of N rows of `inp` (N, C): fc_pre, and fc_act from it
static void mlp_hidden(struct kiln_model *g, const struct dims *d, int l, const void *inp, void *fc_pre,
                       void *fc_act, int N) {
    const int *ix = g->pt.layer[l];
    if (g->cfg.mlp_swiglu) {
        // F.silu(gate) * up, where [gate | up] = self.c_fc(x)
        gpt_matmul_fwd(g, fc_pre, NULL, inp, ix[KILN_FC_W], ix[KILN_FC_B], N, d->C, d->FCO, KILN_ACT_NONE, 0);
        gpt_mlp_activation(g, d, fc_pre, 0, fc_act, N);
    } else { // gelu(self.c_fc(x)), the GELU in the GEMM's epilogue
        gpt_matmul_fwd(g, fc_act, fc_pre, inp, ix[KILN_FC_W], ix[KILN_FC_B], N, d->C, d->H, KILN_ACT_GELU, 0);
    }
}

// the MLP of layer l on input `inp` (N, C): fc_pre, fc_act, and (accumulated into) out = self.c_proj(fc_act),
// in chunks of g->mlp_rows rows (fc_pre and fc_act then hold the last chunk's). out NULL: the hidden
// activations alone (the backward's recompute: the MLP's backward never reads its output).
void gpt_mlp_fwd(struct kiln_model *g, const struct dims *d, int l, const void *inp, void *fc_pre,
                 void *fc_act, void *out, int accumulate, int N) {
    const int *ix = g->pt.layer[l];
    for (int r0 = 0; r0 < N; r0 += g->mlp_rows) {
        int n = N - r0 < g->mlp_rows ? N - r0 : g->mlp_rows;
        size_t at = (size_t)r0 * d->C;
        mlp_hidden(g, d, l, act_at(g, inp, at), fc_pre, fc_act, n);
        if (out)
            gpt_matmul_fwd(g, act_at(g, out, at), NULL, fc_act, ix[KILN_MLPO_W], ix[KILN_MLPO_B], n, d->H,
                           d->C, KILN_ACT_NONE, accumulate);
    }
}

// QK-norm: qkv = raw with its q and k slices normalized (v copied as is). N rows of stride QKV.
void gpt_qk_norm_forward(struct kiln_model *g, const struct dims *d, int l, void *qkv, const void *raw, int N,
                         float *meanq, float *rstdq, float *meank, float *rstdk) {
    const int *ix = g->pt.layer[l];
    g->ops->copy(g->ctx, qkv, raw, (size_t)N * d->QKV * kiln_dtype_bytes(g->be->act_dtype));
    int rms = g->cfg.norm_rms;
    struct kiln_norm_args q = {.out = qkv,
                               .mean = rms ? NULL : meanq,
                               .rstd = rstdq,
                               .inp = raw,
                               .weight = W(g, ix[KILN_QNORM_W]),
                               .N = N,
                               .C = d->NH * d->HS,
                               .rms = rms,
                               .eps = g->cfg.norm_eps,
                               .stride = d->QKV};
    g->ops->norm_forward(g->ctx, &q);
    size_t koff = (size_t)d->NH * d->HS;
    struct kiln_norm_args k = {.out = act_at(g, qkv, koff),
                               .mean = rms ? NULL : meank,
                               .rstd = rstdk,
                               .inp = act_at(g, raw, koff),
                               .weight = W(g, ix[KILN_KNORM_W]),
                               .N = N,
                               .C = d->NKV * d->HS,
                               .rms = rms,
                               .eps = g->cfg.norm_eps,
                               .stride = d->QKV};
    g->ops->norm_forward(g->ctx, &k);
}

// Its backward: draw = dqkv with the q and k slices taken back through their norms.
static void qk_norm_backward(struct kiln_model *g, const struct dims *d, int l, void *draw, const void *dqkv,
                             const void *raw, const float *meanq, const float *rstdq, const float *meank,
                             const float *rstdk) {
    const int *ix = g->pt.layer[l];
    g->ops->copy(g->ctx, draw, dqkv, (size_t)d->N * d->QKV * kiln_dtype_bytes(g->be->act_dtype));
    int rms = g->cfg.norm_rms;
    struct kiln_norm_back_args q = {.dinp = draw,
                                    .dweight = G(g, ix[KILN_QNORM_W]),
                                    .dout = dqkv,
                                    .inp = raw,
                                    .weight = W(g, ix[KILN_QNORM_W]),
                                    .mean = rms ? NULL : meanq,
                                    .rstd = rstdq,
                                    .N = d->N,
                                    .C = d->NH * d->HS,
                                    .rms = rms,
                                    .stride = d->QKV,
                                    .dinp_assign = 1,
                                    .grad_assign = g->grads_fresh};
    g->ops->norm_backward(g->ctx, &q);
    size_t koff = (size_t)d->NH * d->HS;
    struct kiln_norm_back_args k = {.dinp = act_at(g, draw, koff),
                                    .dweight = G(g, ix[KILN_KNORM_W]),
                                    .dout = act_at(g, dqkv, koff),
                                    .inp = act_at(g, raw, koff),
                                    .weight = W(g, ix[KILN_KNORM_W]),
                                    .mean = rms ? NULL : meank,
                                    .rstd = rstdk,
                                    .N = d->N,
                                    .C = d->NKV * d->HS,
                                    .rms = rms,
                                    .stride = d->QKV,
                                    .dinp_assign = 1,
                                    .grad_assign = g->grads_fresh};
    g->ops->norm_backward(g->ctx, &k);
}

// y = softmax(q k^T / sqrt(HS) + mask) v over qkv (rows `stride` apart, 0 = QKV); ao = self.c_proj(y)
static void attn_core_fwd(struct kiln_model *g, const struct dims *d, int l, const void *qkv, int stride) {
    struct acts *a = &g->a;
    const int *ix = g->pt.layer[l];
    struct kiln_attn_args at = {.out = buf_at(&a->atty, l),
                                .lse = buf_at(&a->lse, l),
                                .qkv = qkv,
                                .B = d->B,
                                .T = d->T,
                                .NH = d->NH,
                                .NKV = d->NKV,
                                .HS = d->HS,
                                .pos = g->cfg.pos,
                                .rope_theta = g->cfg.rope_theta,
                                .qkv_stride = stride};
    if (g->recomputing && g->opts.recompute == KILN_RECOMPUTE_SELECTIVE)
        ; // --recompute=selective: atty[l] and lse[l] were kept
    else if (g->attn_impl.forward)
        g->attn_impl.forward(g->attn_impl.user, l, &at);
    else
        g->ops->attention_forward(g->ctx, &at);
    // A parallel block's recompute needs no branch output (its backward reads ln1, qkv, atty and the MLP's
    // hidden activations); a sequential block's needs ao for mid and ln2.
    if (g->recomputing && g->cfg.parallel_block)
        return;
    gpt_matmul_fwd(g, a->ao.p, NULL, buf_at(&a->atty, l), ix[KILN_ATTNO_W], ix[KILN_ATTNO_B], d->N, d->AO,
                   d->C, KILN_ACT_NONE, 0);
}

static void attn_fwd(struct kiln_model *g, const struct dims *d, int l) {
    struct acts *a = &g->a;
    const int *ix = g->pt.layer[l];
    // qkv = self.c_attn(ln1), then attention
    if (d->qk_norm) {
        // q = q_norm(q), k = k_norm(k), each over a token's whole q (NH*HS) or k (NKV*HS), as OLMo-2
        void *raw = buf_at(&a->qkv_raw, l);
        gpt_matmul_fwd(g, raw, NULL, buf_at(&a->ln1, l), ix[KILN_QKV_W], ix[KILN_QKV_B], d->N, d->C, d->QKV,
                       KILN_ACT_NONE, 0);
        gpt_qk_norm_forward(g, d, l, buf_at(&a->qkv, l), raw, d->N, buf_at(&a->meanq, l),
                            buf_at(&a->rstdq, l), buf_at(&a->meank, l), buf_at(&a->rstdk, l));
    } else {
        gpt_matmul_fwd(g, buf_at(&a->qkv, l), NULL, buf_at(&a->ln1, l), ix[KILN_QKV_W], ix[KILN_QKV_B], d->N,
                       d->C, d->QKV, KILN_ACT_NONE, 0);
    }
    attn_core_fwd(g, d, l, buf_at(&a->qkv, l), 0);
}

// A parallel block's branches from one projection: [qkv | fc_pre] = ln1 @ [W_qkv; W_fc]^T + [b_qkv; b_fc];
// attention reads the first QKV columns of each row, the MLP's activation the other FCO, and the MLP output
// accumulates onto the attention output in ao.
static void parallel_fused_fwd(struct kiln_model *g, const struct dims *d, int l, int tail) {
    struct acts *a = &g->a;
    const int *ix = g->pt.layer[l];
    void *pre = buf_at(&a->pre, l);
    int S = d->QKV + d->FCO;
    gpt_matmul_fwd(g, pre, NULL, buf_at(&a->ln1, l), ix[KILN_QKV_W], ix[KILN_QKV_B], d->N, d->C, S,
                   KILN_ACT_NONE, 0);
    attn_core_fwd(g, d, l, pre, S);
    gpt_mlp_act_fwd(g, d, l, act_at(g, pre, (size_t)d->QKV), S, buf_at(&a->fc_act, l), tail ? a->ao.p : NULL,
                    1, d->N);
}

// Layer l, from ln1[l] (already computed) up to the branch outputs. With tail set, it also produces x[l+1]
// and its normalization ln1[l+1] (the next layer's norm1, or the final norm after the last layer).
void gpt_layer_forward(struct kiln_model *g, const struct dims *d, int l, int tail) {
    struct acts *a = &g->a;
    const int *ix = g->pt.layer[l];
    // the backward's recompute (no tail) leaves a chunked MLP to mlp_bwd, which recomputes it chunk by chunk
    int mlp_needed = tail || g->mlp_rows == d->N;
    const void *resid; // what the tail adds the branch output to
    if (g->cfg.parallel_block) {
        // x' = x + attn(ln1) + mlp(ln1): the MLP output accumulates onto the attention output
        if (g->fuse.fwd) {
            parallel_fused_fwd(g, d, l, tail);
        } else {
            attn_fwd(g, d, l);
            if (mlp_needed)
                gpt_mlp_fwd(g, d, l, buf_at(&a->ln1, l), buf_at(&a->fc_pre, l), buf_at(&a->fc_act, l),
                            tail ? a->ao.p : NULL, 1, d->N);
        }
        resid = buf_at(&a->x, l);
    } else {
        attn_fwd(g, d, l);
        // h = x + attn(ln1(x)), normalized as ln2
        gpt_norm_fwd(g, buf_at(&a->ln2, l), buf_at(&a->mean2, l), buf_at(&a->rstd2, l), buf_at(&a->mid, l),
                     buf_at(&a->x, l), a->ao.p, ix[KILN_LN2_W], ix[KILN_LN2_B], d->Nr);
        if (mlp_needed)
            gpt_mlp_fwd(g, d, l, buf_at(&a->ln2, l), buf_at(&a->fc_pre, l), buf_at(&a->fc_act, l),
                        tail ? a->mo.p : NULL, 0, d->N);
        resid = buf_at(&a->mid, l);
    }
    if (!tail)
        return;
    const void *branch = g->cfg.parallel_block ? a->ao.p : a->mo.p;
    int last = l == d->L - 1;
    int wi = last ? g->pt.lnf_w : g->pt.layer[l + 1][KILN_LN1_W];
    int bi = last ? g->pt.lnf_b : g->pt.layer[l + 1][KILN_LN1_B];
    gpt_norm_fwd(g, buf_at(&a->ln1, l + 1), buf_at(&a->mean1, l + 1), buf_at(&a->rstd1, l + 1),
                 buf_at(&a->x, l + 1), resid, branch, wi, bi, d->Nr);
}

// ----------------------------------------------------------------------------
// backward: the mirror of forward

// dres is the residual stream's gradient. The projections that add into the stream there have dres as their
// output gradient, so their biases' gradients (parameter indices rb0, rb1; -1: none) are dres's column sums:
// the norm backward adds them as it leaves dres, and those projections' backward skips them (no extra pass).
void gpt_norm_bwd(struct kiln_model *g, void *dres, const void *dout, const void *inp, const float *mean,
                  const float *rstd, int wi, int bi, int N, int dinp_assign, int rb0, int rb1) {
    struct kiln_norm_back_args a = {.dinp = dres,
                                    .dweight = G(g, wi),
                                    .dbias = G(g, bi),
                                    .dout = dout,
                                    .inp = inp,
                                    .weight = W(g, wi),
                                    .mean = g->cfg.norm_rms ? NULL : mean,
                                    .rstd = rstd,
                                    .N = N,
                                    .C = g->cfg.n_embd,
                                    .rms = g->cfg.norm_rms,
                                    .dinp_assign = dinp_assign,
                                    .grad_assign = g->grads_fresh,
                                    .dres_bias = {G(g, rb0), G(g, rb1)}};
    g->ops->norm_backward(g->ctx, &a);
}

// The output-projection biases of layer l (-1 where there is no such layer): what the norm backward below
// the layer's output fills in. Parallel blocks have two; a sequential block's MLP projection alone adds
// there.
void gpt_proj_biases(const struct kiln_model *g, int l, int *rb0, int *rb1) {
    *rb0 = l < 0 ? -1 : g->pt.layer[l][KILN_MLPO_B];
    *rb1 = l < 0 || !g->cfg.parallel_block ? -1 : g->pt.layer[l][KILN_ATTNO_B];
}

static void matmul_bwd(struct kiln_model *g, void *dinp, const void *dout, const void *inp, int wi, int bi,
                       int N, int IC, int OC, const void *gelu_pre, int dinp_accumulate) {
    struct kiln_matmul_back_args a = {.dinp = dinp,
                                      .dweight = G(g, wi),
                                      .dbias = G(g, bi),
                                      .dout = dout,
                                      .inp = inp,
                                      .weight = W(g, wi),
                                      .dinp_gelu_pre = gelu_pre,
                                      .N = N,
                                      .IC = IC,
                                      .OC = OC,
                                      .dinp_accumulate = dinp_accumulate,
                                      .grad_assign = g->grads_fresh};
    gpt_linear_bwd(g, wi, &a);
}

// Backward of gpt_mlp_act_fwd, given dout = dL/d(mlp output): dfc = dL/d(fc_pre), rows dfc_stride apart
// (fc_pre's pre_stride; 0 = FCO). The projection bias's gradient comes from the norm backward that left dout
// (norm_bwd).
static void mlp_act_bwd(struct kiln_model *g, const struct dims *d, int l, const void *dout,
                        const void *fc_pre, int pre_stride, const void *fc_act, void *dfc, int dfc_stride,
                        int N) {
    struct acts *a = &g->a;
    const int *ix = g->pt.layer[l];
    if (g->cfg.mlp_swiglu) {
        matmul_bwd(g, a->dhid.p, dout, fc_act, ix[KILN_MLPO_W], -1, N, d->H, d->C, NULL, 0);
        struct kiln_swiglu_back_args s = {.dinp = dfc,
                                          .dout = a->dhid.p,
                                          .inp = fc_pre,
                                          .N = N,
                                          .H = d->H,
                                          .inp_stride = pre_stride,
                                          .dinp_stride = dfc_stride};
        g->ops->swiglu_backward(g->ctx, &s);
    } else {
        // dfc = (dout @ W_proj) * gelu'(fc_pre), fused into the projection's backward
        struct kiln_matmul_back_args m = {.dinp = dfc,
                                          .dweight = G(g, ix[KILN_MLPO_W]),
                                          .dout = dout,
                                          .inp = fc_act,
                                          .weight = W(g, ix[KILN_MLPO_W]),
                                          .dinp_gelu_pre = fc_pre,
                                          .N = N,
                                          .IC = d->H,
                                          .OC = d->C,
                                          .grad_assign = g->grads_fresh,
                                          .dinp_stride = dfc_stride,
                                          .gelu_pre_stride = pre_stride};
        gpt_linear_bwd(g, ix[KILN_MLPO_W], &m);
    }
}

// Backward of the MLP of layer l, given dout = dL/d(mlp output); writes dL/d(mlp input) into dinp. A chunked
// MLP (g->mlp_rows < N) recomputes each chunk's hidden activation first (the recompute left it out), and its
// weights' gradients add up over the chunks.
void gpt_mlp_bwd(struct kiln_model *g, const struct dims *d, int l, const void *inp, const void *dout,
                 void *dinp, int dinp_accumulate) {
    struct acts *a = &g->a;
    const int *ix = g->pt.layer[l];
    int fresh = g->grads_fresh, chunked = g->mlp_rows < d->N;
    for (int r0 = 0; r0 < d->N; r0 += g->mlp_rows) {
        int n = d->N - r0 < g->mlp_rows ? d->N - r0 : g->mlp_rows;
        size_t at = (size_t)r0 * d->C;
        void *fc_pre = buf_at(&a->fc_pre, l), *fc_act = buf_at(&a->fc_act, l);
        if (chunked)
            mlp_hidden(g, d, l, act_at(g, inp, at), fc_pre, fc_act, n);
        mlp_act_bwd(g, d, l, act_at(g, dout, at), fc_pre, 0, fc_act, a->dfc.p, 0, n);
        matmul_bwd(g, act_at(g, dinp, at), a->dfc.p, act_at(g, inp, at), ix[KILN_FC_W], ix[KILN_FC_B], n,
                   d->C, d->FCO, NULL, dinp_accumulate);
        g->grads_fresh = 0; // the next chunks add to what this one wrote
    }
    g->grads_fresh = fresh;
}

// Backward of attn_core_fwd, given dout = dL/d(ao): dqkv (rows dqkv_stride apart) from qkv (rows qkv_stride
// apart) as the forward read it.
static void attn_core_bwd(struct kiln_model *g, const struct dims *d, int l, const void *dout,
                          const void *qkv, int qkv_stride, void *dqkv, int dqkv_stride) {
    struct acts *a = &g->a;
    const int *ix = g->pt.layer[l];
    // the bias's gradient comes from the norm backward that left dout (norm_bwd)
    matmul_bwd(g, a->datty.p, dout, buf_at(&a->atty, l), ix[KILN_ATTNO_W], -1, d->N, d->AO, d->C, NULL, 0);
    struct kiln_attn_back_args ab = {.dqkv = dqkv,
                                     .dout = a->datty.p,
                                     .qkv = qkv,
                                     .out = buf_at(&a->atty, l),
                                     .lse = buf_at(&a->lse, l),
                                     .B = d->B,
                                     .T = d->T,
                                     .NH = d->NH,
                                     .NKV = d->NKV,
                                     .HS = d->HS,
                                     .pos = g->cfg.pos,
                                     .rope_theta = g->cfg.rope_theta,
                                     .qkv_stride = qkv_stride,
                                     .dqkv_stride = dqkv_stride};
    if (g->attn_impl.backward)
        g->attn_impl.backward(g->attn_impl.user, l, &ab);
    else
        g->ops->attention_backward(g->ctx, &ab);
}

// Backward of the attention of layer l, given dout = dL/d(attention branch output); writes dL/d(ln1) to dinp.
void gpt_attn_bwd(struct kiln_model *g, const struct dims *d, int l, const void *dout, void *dinp,
                  int dinp_accumulate) {
    struct acts *a = &g->a;
    const int *ix = g->pt.layer[l];
    attn_core_bwd(g, d, l, dout, buf_at(&a->qkv, l), 0, a->dqkv.p, 0);
    const void *dqkv = a->dqkv.p;
    if (d->qk_norm) {
        qk_norm_backward(g, d, l, a->dqkv_raw.p, a->dqkv.p, buf_at(&a->qkv_raw, l), buf_at(&a->meanq, l),
                         buf_at(&a->rstdq, l), buf_at(&a->meank, l), buf_at(&a->rstdk, l));
        dqkv = a->dqkv_raw.p;
    }
    matmul_bwd(g, dinp, dqkv, buf_at(&a->ln1, l), ix[KILN_QKV_W], ix[KILN_QKV_B], d->N, d->C, d->QKV, NULL,
               dinp_accumulate);
}

// Backward of a fused parallel block, given dout = dL/d(both branches' sum): both branches write their input
// gradients into one [dqkv | dfc] buffer, then one GEMM gives dinp = dL/dln1 (overwritten) and another
// d[W_qkv; W_fc] (and d[b_qkv; b_fc]).
void gpt_parallel_fused_bwd(struct kiln_model *g, const struct dims *d, int l, const void *dout, void *dinp) {
    struct acts *a = &g->a;
    const int *ix = g->pt.layer[l];
    // the forward kept [qkv | fc_pre] rows of S, or (--recompute=mlp: two GEMMs) dense qkv and fc_pre (ks 0)
    int S = d->QKV + d->FCO, ks = g->fuse.fwd ? S : 0;
    const void *qkv = ks ? buf_at(&a->pre, l) : buf_at(&a->qkv, l);
    const void *fc_pre = ks ? act_at(g, qkv, (size_t)d->QKV) : buf_at(&a->fc_pre, l);
    mlp_act_bwd(g, d, l, dout, fc_pre, ks, buf_at(&a->fc_act, l), act_at(g, a->dpre.p, (size_t)d->QKV), S,
                d->N);
    attn_core_bwd(g, d, l, dout, qkv, ks, a->dpre.p, S);
    matmul_bwd(g, dinp, a->dpre.p, buf_at(&a->ln1, l), ix[KILN_QKV_W], ix[KILN_QKV_B], d->N, d->C, S, NULL,
               0);
}
