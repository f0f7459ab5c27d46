// The whole GPT, top to bottom: embedding, the blocks (block.c), the final norm and the LM head with its
// loss, and the backward in reverse. The hooks (gpt.h) fire at the points marked HOOK.
#include "model/gpt/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int gpt_head_index(const struct kiln_model *g) {
    return g->cfg.tie_embeddings ? g->pt.wte : g->pt.lm_head;
}

// One chunk of the LM head and its loss, as the model runs it without a vocab hook: logits = x @ W^T (through
// the linear hooks), the cross-entropy (dlogits in place), then dx = dlogits @ W and dW.
void kiln_model_head_default(struct kiln_model *g, const struct kiln_model_head_args *h) {
    int head = gpt_head_index(g);
    struct kiln_matmul_args mf = {
        .out = h->logits, .inp = h->x, .weight = h->weight, .N = h->rows, .IC = h->C, .OC = h->Vp};
    gpt_linear_fwd(g, head, &mf);
    struct kiln_xent_args xa = {.logits = h->logits,
                                .losses = h->losses,
                                .targets = h->targets,
                                .N = h->rows,
                                .V = h->V,
                                .Vp = h->Vp,
                                .dloss = h->dloss,
                                .z_loss = h->z_loss};
    g->ops->cross_entropy(g->ctx, &xa);
    if (h->dloss == 0.0f)
        return;
    struct kiln_matmul_back_args mb = {.dinp = h->dx,
                                       .dweight = h->dweight,
                                       .dout = h->logits,
                                       .inp = h->x,
                                       .weight = h->weight,
                                       .N = h->rows,
                                       .IC = h->C,
                                       .OC = h->Vp,
                                       .grad_assign = h->grad_assign};
    gpt_linear_bwd(g, head, &mb);
}

// logits = lnf @ wte^T chunk by chunk; cross-entropy; with dloss, dlogits -> dlnf and dW_head.
static void classifier(struct kiln_model *g, const struct dims *d, float dloss, float z_loss) {
    struct acts *a = &g->a;
    int head = gpt_head_index(g);
    const void *lnf = buf_at(&a->ln1, d->L);
    // under a sequence split, this part's Nr rows in chunks; the hook takes every part's chunk at once
    for (int r0 = 0; r0 < d->Nr; r0 += g->classifier_rows) {
        int rows = d->Nr - r0 < g->classifier_rows ? d->Nr - r0 : g->classifier_rows;
        struct kiln_model_head_args h = {.x = act_at(g, lnf, (size_t)r0 * d->C),
                                         .weight = W(g, head),
                                         .dweight = dloss != 0.0f ? G(g, head) : NULL,
                                         .logits = a->logits.p,
                                         .losses = (float *)a->losses.p + r0,
                                         .targets = (const int32_t *)a->targets.p + r0,
                                         .dx = dloss != 0.0f ? act_at(g, a->dln.p, (size_t)r0 * d->C) : NULL,
                                         .rows = rows,
                                         .C = d->C,
                                         .V = d->V,
                                         .Vp = d->Vp,
                                         .dloss = dloss,
                                         .z_loss = z_loss,
                                         .grad_assign = g->grads_fresh && r0 == 0,
                                         .parts_stride = d->Nr < d->N ? d->Nr : 0};
        if (g->vocab.head)
            g->vocab.head(g->vocab.user, &h);
        else
            kiln_model_head_default(g, &h);
    }
}

double gpt_forward(struct kiln_model *g, const int32_t *inputs, const int32_t *targets, float dloss,
                   float z_loss) {
    KILN_ASSERT(g->opts.training || dloss == 0.0f);
    // a split vocabulary is the vocab hooks' to gather and reduce (the model's own embedding would index
    // its slice with global token ids)
    KILN_ASSERT(g->opts.split.vocab <= 1 ||
                (g->vocab.embed_forward && g->vocab.embed_backward && g->vocab.head));
    // and a sequence split's rows are theirs and the linear hook's to gather and scatter
    KILN_ASSERT(g->opts.split.seq <= 1 || (g->vocab.head && g->linear.forward && g->linear.backward));
    struct dims d = dims_of(&g->cfg, &g->opts.split, g->opts.B, g->opts.T);
    struct acts *a = &g->a;
    size_t tok_bytes = (size_t)d.N * sizeof(int32_t);
    memcpy(g->tokens_host, inputs, tok_bytes);
    g->ops->upload(g->ctx, a->tokens.p, inputs, tok_bytes);
    g->ops->upload(g->ctx, a->targets.p, targets, tok_bytes);
    if (g->hooks.forward_begin)
        g->hooks.forward_begin(g->hooks.user);

    // x = wte[idx] + wpe[t]
    const void *wpe = W(g, g->pt.wpe);
    struct kiln_embed_args e = {.out = buf_at(&a->x, 0),
                                .tokens = a->tokens.p,
                                .tokens_host = g->tokens_host,
                                .wte = W(g, g->pt.wte),
                                .wpe = wpe ? act_at(g, wpe, (size_t)g->pos0 * d.C) : NULL,
                                .wpe_hi = wpe ? act_at(g, wpe, (size_t)g->pos1 * d.C) : NULL,
                                .pos_split = g->pos_split,
                                .B = d.B,
                                .T = d.T,
                                .C = d.C};
    if (g->vocab.embed_forward)
        g->vocab.embed_forward(g->vocab.user, &e);
    else
        g->ops->embed_forward(g->ctx, &e);
    gpt_norm_fwd(g, buf_at(&a->ln1, 0), buf_at(&a->mean1, 0), buf_at(&a->rstd1, 0), NULL, buf_at(&a->x, 0),
                 NULL, g->pt.layer[0][KILN_LN1_W], g->pt.layer[0][KILN_LN1_B], d.Nr);
    int offload = dloss != 0.0f && g->host_acts; // a forward without a backward keeps nothing
    for (int l = 0; l < d.L; l++) {
        HOOK(g, layer_begin, l, 0);
        if (offload) { // layer l writes x[l + 1] and atty[l]
            gpt_offl_claim(g, &g->off_x, l + 1);
            gpt_offl_claim(g, &g->off_atty, l);
        }
        gpt_layer_forward(g, &d, l, 1);
        HOOK(g, layer_end, l, 0);
        const struct offl *offs[2] = {&g->off_x, &g->off_atty};
        for (int i = 0; offload && i < 2; i++)
            if (gpt_offl_has(offs[i], l))
                gpt_offl_copy(g, offs[i], l, 1);
    }
    classifier(g, &d, dloss, z_loss);
    g->has_grad_forward = dloss != 0.0f;

    g->ops->download(g->ctx, g->losses_host, a->losses.p, (size_t)d.N * sizeof(float));
    double sum = 0;
    long count = 0;
    for (int i = 0; i < d.N; i++)
        if (targets[i] >= 0) {
            sum += g->losses_host[i];
            count++;
        }
    return count ? sum / (double)count : 0.0;
}

void gpt_backward(struct kiln_model *g) {
    KILN_ASSERT(g->has_grad_forward);
    struct dims d = dims_of(&g->cfg, &g->opts.split, g->opts.B, g->opts.T);
    struct acts *a = &g->a;
    void *dres = a->dres.p; // dL/dx, the residual stream's gradient, flowing down the layers

    // final norm: dres = dL/dx[L]
    int rb0, rb1;
    gpt_proj_biases(g, d.L - 1, &rb0, &rb1);
    gpt_norm_bwd(g, dres, a->dln.p, buf_at(&a->x, d.L), buf_at(&a->mean1, d.L), buf_at(&a->rstd1, d.L),
                 g->pt.lnf_w, g->pt.lnf_b, d.Nr, 1, rb0, rb1);

    for (int l = d.L - 1; l >= 0; l--) {
        const int *ix = g->pt.layer[l];
        HOOK(g, layer_begin, l, 1); // its weights, for the recompute and the backward
        // the layer below's input (and attention output) come back while this one computes
        const struct offl *offs[2] = {&g->off_x, &g->off_atty};
        for (int i = 0; i < 2; i++) {
            if (gpt_offl_has(offs[i], l - 1))
                gpt_offl_copy(g, offs[i], l - 1, 0);
            if (gpt_offl_has(offs[i], l))
                gpt_offl_wait(g, offs[i], l, 0);
        }
        gpt_recompute_layer(g, &d, l);
        if (g->cfg.parallel_block && g->fuse.on) {
            gpt_parallel_fused_bwd(g, &d, l, dres, a->dln.p);
        } else if (g->cfg.parallel_block) {
            // both branches read ln1 and write dL/dln1 into dln; the residual passes dres straight through
            gpt_mlp_bwd(g, &d, l, buf_at(&a->ln1, l), dres, a->dln.p, 0);
            gpt_attn_bwd(g, &d, l, dres, a->dln.p, 1);
        } else {
            // x' = h + mlp(ln2(h)): dres is dL/dx' = dL/d(mlp out); then dres += ln2 backward -> dL/dh
            gpt_mlp_bwd(g, &d, l, buf_at(&a->ln2, l), dres, a->dln.p, 0);
            gpt_norm_bwd(g, dres, a->dln.p, buf_at(&a->mid, l), buf_at(&a->mean2, l), buf_at(&a->rstd2, l),
                         ix[KILN_LN2_W], ix[KILN_LN2_B], d.Nr, 0, ix[KILN_ATTNO_B], -1);
            // h = x + attn(ln1(x))
            gpt_attn_bwd(g, &d, l, dres, a->dln.p, 0);
        }
        gpt_proj_biases(g, l - 1, &rb0, &rb1);
        gpt_norm_bwd(g, dres, a->dln.p, buf_at(&a->x, l), buf_at(&a->mean1, l), buf_at(&a->rstd1, l),
                     ix[KILN_LN1_W], ix[KILN_LN1_B], d.Nr, 0, rb0, rb1);
        HOOK(g, layer_end, l, 1);
        HOOK(g, layer_backward_end, l);
    }
    char *dwpe = G(g, g->pt.wpe);
    size_t gb = kiln_dtype_bytes(g->be->grad_dtype);
    struct kiln_embed_back_args eb = {.dwte = G(g, g->pt.wte),
                                      .dwpe = dwpe ? dwpe + (size_t)g->pos0 * d.C * gb : NULL,
                                      .dwpe_hi = dwpe ? dwpe + (size_t)g->pos1 * d.C * gb : NULL,
                                      .pos_split = g->pos_split,
                                      .dout = dres,
                                      .tokens = a->tokens.p,
                                      .tokens_host = g->tokens_host,
                                      .B = d.B,
                                      .T = d.T,
                                      .C = d.C};
    if (g->vocab.embed_backward)
        g->vocab.embed_backward(g->vocab.user, &eb);
    else
        g->ops->embed_backward(g->ctx, &eb);
    if (g->hooks.embed_backward_end)
        g->hooks.embed_backward_end(g->hooks.user);
    g->has_grad_forward = 0;
    g->grads_fresh = 0;
}
