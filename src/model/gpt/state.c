// The GPT's state: creation and teardown, the compute weights and gradients, the windows through which the
// hooks point the model at weights and gradients held elsewhere, and the hook setters. The master weights and
// AdamW's moments are the optimizer's (optim/state.h), not the model's.
#include "model/gpt/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

// ----------------------------------------------------------------------------
// creation

int gpt_alloc(struct kiln_model *g, void **p, size_t bytes, struct kiln_error *err) {
    if (!bytes) {
        *p = NULL;
        return 0;
    }
    *p = g->ops->alloc(g->ctx, bytes);
    if (*p)
        return 0;
    // the model's plan and what is planned beside it (the optimizer's state): the numbers of the whole
    const struct kiln_mem_plan *pl = &g->plan, *bs = &g->opts.beside;
    return kiln_errorf(
        err, KILN_ERR_RUNTIME,
        "out of memory on %s (%s) allocating %.2f GiB: the plan needs %.2f GiB (params %.2f, "
        "weights %.2f, grads %.2f, optimizer %.2f, activations %.2f); lower --batch or --seq, or use "
        "--recompute=block",
        g->be->name, g->be->device_name, bytes / 1073741824.0,
        (pl->total_bytes + bs->total_bytes) / 1073741824.0,
        (pl->params_bytes + bs->params_bytes) / 1073741824.0,
        (pl->weights_bytes + bs->weights_bytes) / 1073741824.0,
        (pl->grads_bytes + bs->grads_bytes) / 1073741824.0,
        (pl->optim_bytes + bs->optim_bytes) / 1073741824.0, (pl->acts_bytes + bs->acts_bytes) / 1073741824.0);
}

int kiln_model_create(struct kiln_model **out, const struct kiln_model_config *m, struct kiln_backend *be,
                    const struct kiln_model_opts *o, struct kiln_error *err) {
    int src = kiln_model_split_check(m, &o->split, err);
    int seq = kiln_split_parts(o->split.seq);
    if (!src && seq > 1 && ((long)o->B * o->T) % seq)
        src = kiln_errorf(err, KILN_ERR_USAGE,
                          "%d token rows a step (--batch %d x --seq %d) cut into %d sequence parts: the parts "
                          "must divide them",
                          o->B * o->T, o->B, o->T, seq);
    if (src) {
        *out = NULL;
        return src;
    }
    struct kiln_model *g = kiln_xcalloc(1, sizeof(*g));
    g->cfg = *m;
    g->opts = *o;
    g->be = be;
    g->ops = be->ops;
    g->ctx = be->ctx;
    kiln_params_build_split(&g->pt, m, &o->split);
    kiln_model_plan(m, o, be->act_dtype, be->grad_dtype, be->weights_alias_master, &g->plan);
    struct dims d = dims_of(m, &o->split, o->B, o->T);
    g->fuse = gpt_fusion_of(m, &g->pt, o, kiln_dtype_bytes(be->act_dtype));
    size_t arena_bytes =
        gpt_acts_layout(&g->a, &g->classifier_rows, &d, o, &g->fuse, kiln_dtype_bytes(be->act_dtype));
    g->mlp_rows = gpt_mlp_rows_for(&d, o, kiln_dtype_bytes(be->act_dtype));
    *out = g;

    // the compute weights (counted as the master's bytes where they are the master)
    int rc = gpt_alloc(g, &g->weights, g->plan.params_bytes + g->plan.weights_bytes, err);
    if (!rc && o->training) {
        rc = gpt_alloc(g, &g->grads, g->plan.grads_bytes, err);
        if (!rc && g->grads)
            g->ops->zero(g->ctx, g->grads, g->plan.grads_bytes);
    }
    if (!rc)
        rc = gpt_alloc(g, &g->arena, arena_bytes, err);
    struct buf *bufs = (struct buf *)&g->a;
    for (size_t i = 0; i < N_ACT_BUFS && !rc; i++) {
        if (!bufs[i].in_arena)
            rc = gpt_alloc(g, &bufs[i].p, buf_bytes(&bufs[i]), err);
        else if (buf_bytes(&bufs[i]))
            bufs[i].p = (char *)g->arena + bufs[i].offset;
    }
    if (rc) {
        kiln_model_free(g);
        *out = NULL;
        return rc;
    }
    g->wwin = kiln_xcalloc((size_t)m->n_layer + 2, sizeof(*g->wwin));
    g->gwin = kiln_xcalloc((size_t)m->n_layer + 2, sizeof(*g->gwin));
    g->seg_begin = kiln_xcalloc((size_t)m->n_layer + 3, sizeof(*g->seg_begin));
    for (int l = 0; l <= m->n_layer; l++)
        g->seg_begin[1 + l] = g->pt.layer_begin[l];
    g->seg_begin[m->n_layer + 2] = g->pt.total;
    for (int s = 0; s < m->n_layer + 2; s++) {
        kiln_model_set_weight_window(g, s, NULL);
        kiln_model_set_grad_window(g, s, NULL);
    }
    g->tokens_host = kiln_xcalloc((size_t)d.N, sizeof(int32_t));
    g->losses_host = kiln_xcalloc((size_t)d.N, sizeof(float));
    // the offloaded layer inputs (and attention outputs), and an event each way for each
    if (g->plan.host_bytes) {
        g->host_acts = g->ops->host_alloc ? g->ops->host_alloc(g->ctx, g->plan.host_bytes) : NULL;
        if (!g->host_acts) {
            int sel = g->opts.recompute == KILN_RECOMPUTE_SELECTIVE;
            kiln_model_free(g);
            *out = NULL;
            return kiln_errorf(
                err, KILN_ERR_RUNTIME,
                "out of host memory (--offload=activations): %.2f GiB of pinned memory for the "
                "layer inputs%s; lower --seq or --batch, or leave the activations on the device",
                g->plan.host_bytes / 1073741824.0, sel ? " and attention outputs" : "");
        }
        char *host = g->host_acts;
        gpt_offl_init(g, &g->off_x, &g->a.x, d.L + 1, &host);
        if (g->opts.recompute == KILN_RECOMPUTE_SELECTIVE)
            gpt_offl_init(g, &g->off_atty, &g->a.atty, d.L, &host);
    }
    return 0;
}

void gpt_free_buf(struct kiln_model *g, struct buf *b) {
    if (b->p)
        g->ops->free(g->ctx, b->p);
    b->p = NULL;
}

void kiln_model_free(struct kiln_model *g) {
    if (!g)
        return;
    struct buf *bufs = (struct buf *)&g->a;
    for (size_t i = 0; i < N_ACT_BUFS; i++)
        if (!bufs[i].in_arena)
            gpt_free_buf(g, &bufs[i]);
    if (g->arena)
        g->ops->free(g->ctx, g->arena);
    struct buf *dec[] = {&g->dec.k,      &g->dec.v,       &g->dec.x,    &g->dec.ln,   &g->dec.pre,
                         &g->dec.qkv,    &g->dec.qkv_raw, &g->dec.atty, &g->dec.ao,   &g->dec.fc_pre,
                         &g->dec.fc_act, &g->dec.logits,  &g->dec.mean, &g->dec.rstd, &g->dec.tokens};
    for (size_t i = 0; i < sizeof(dec) / sizeof(dec[0]); i++)
        gpt_free_buf(g, dec[i]);
    free(g->dec.logits_host);
    void *owned[] = {g->weights, g->grads};
    for (int i = 0; i < 2; i++)
        if (owned[i])
            g->ops->free(g->ctx, owned[i]);
    if (g->host_acts)
        g->ops->host_free(g->ctx, g->host_acts);
    gpt_offl_free(g, &g->off_x);
    gpt_offl_free(g, &g->off_atty);
    kiln_params_free(&g->pt);
    free(g->tokens_host);
    free(g->losses_host);
    free(g->wwin);
    free(g->gwin);
    free(g->seg_begin);
    free(g);
}

int kiln_model_grad_segments(const struct kiln_model *g, const size_t **begins) {
    *begins = g->seg_begin;
    return g->cfg.n_layer + 2;
}

void kiln_model_set_grad_window(struct kiln_model *g, int seg, void *base) {
    KILN_ASSERT(seg >= 0 && seg < g->cfg.n_layer + 2);
    size_t gb = kiln_dtype_bytes(g->be->grad_dtype);
    g->gwin[seg] = base ? base : g->grads ? (char *)g->grads + g->seg_begin[seg] * gb : NULL;
}

void kiln_model_set_attention(struct kiln_model *g, const struct kiln_model_attention *a) {
    if (a)
        g->attn_impl = *a;
    else
        memset(&g->attn_impl, 0, sizeof(g->attn_impl));
}

void kiln_model_set_positions(struct kiln_model *g, int pos0, int split, int pos1) {
    g->pos0 = pos0;
    g->pos_split = split;
    g->pos1 = pos1;
}

void kiln_model_set_hooks(struct kiln_model *g, const struct kiln_model_hooks *h) {
    if (h)
        g->hooks = *h;
    else
        memset(&g->hooks, 0, sizeof(g->hooks));
}

const char *kiln_linear_name(enum kiln_linear k) {
    static const char *const names[KILN_LINEARS] = {"qkv",     "attn_out", "mlp_in",
                                                    "mlp_out", "fused_in", "head"};
    return k >= 0 && k < KILN_LINEARS ? names[k] : "unknown";
}

void kiln_model_set_linear(struct kiln_model *g, const struct kiln_model_linear *h, struct kiln_model_linear *prev) {
    if (prev)
        *prev = g->linear;
    if (h)
        g->linear = *h;
    else
        memset(&g->linear, 0, sizeof(g->linear));
}

void kiln_model_linear_forward_with(const struct kiln_model_linear *h, const struct kiln_backend *be, int l,
                                  enum kiln_linear k, const struct kiln_matmul_args *a) {
    if (h && h->forward)
        h->forward(h->user, l, k, a);
    else
        be->ops->matmul_forward(be->ctx, a);
}

void kiln_model_linear_backward_with(const struct kiln_model_linear *h, const struct kiln_backend *be, int l,
                                   enum kiln_linear k, const struct kiln_matmul_back_args *a) {
    if (h && h->backward)
        h->backward(h->user, l, k, a);
    else
        be->ops->matmul_backward(be->ctx, a);
}

void kiln_model_set_vocab(struct kiln_model *g, const struct kiln_model_vocab *v, struct kiln_model_vocab *prev) {
    if (prev)
        *prev = g->vocab;
    if (v)
        g->vocab = *v;
    else
        memset(&g->vocab, 0, sizeof(g->vocab));
}

void kiln_model_set_weight_window(struct kiln_model *g, int seg, const void *base) {
    KILN_ASSERT(seg >= 0 && seg < g->cfg.n_layer + 2);
    g->wwin[seg] = base ? base : g->weights ? act_at(g, g->weights, g->seg_begin[seg]) : NULL;
}

void kiln_model_set_layer_window(struct kiln_model *g, int l, const void *base) {
    KILN_ASSERT(l >= 0 && l < g->cfg.n_layer);
    kiln_model_set_weight_window(g, 1 + l, base);
}

void kiln_model_buffers(const struct kiln_model *g, struct kiln_model_buffers *out) {
    *out = (struct kiln_model_buffers){.weights = g->weights, .grads = g->grads};
}

const struct kiln_param_table *kiln_model_params(const struct kiln_model *g) {
    return &g->pt;
}

const struct kiln_model_config *kiln_model_get_config(const struct kiln_model *g) {
    return &g->cfg;
}

const struct kiln_mem_plan *kiln_model_mem_plan(const struct kiln_model *g) {
    return &g->plan;
}

size_t kiln_model_mem_peak(const struct kiln_model *g) {
    size_t peak = g->ops->mem_peak ? g->ops->mem_peak(g->ctx) : 0,
           plan = g->plan.total_bytes + g->opts.beside.total_bytes;
    return peak > plan ? peak : plan;
}

void kiln_model_fused_projection(const struct kiln_model *g, int *fwd, int *bwd) {
    *fwd = g->fuse.fwd;
    *bwd = g->fuse.on;
}

// ----------------------------------------------------------------------------
// parameters

void kiln_model_set_params(struct kiln_model *g, const float *host) {
    KILN_ASSERT(g->weights); // external weights are the strategy's to set
    g->ops->upload_f32(g->ctx, g->weights, g->be->act_dtype, host, g->pt.total);
}

void kiln_model_get_params(struct kiln_model *g, float *host) {
    KILN_ASSERT(g->weights);
    g->ops->download_f32(g->ctx, host, g->weights, g->be->act_dtype, g->pt.total);
}

void kiln_model_get_grads(struct kiln_model *g, float *host) {
    KILN_ASSERT(g->grads);
    g->ops->download_f32(g->ctx, host, g->grads, g->be->grad_dtype, g->pt.total);
}

void kiln_model_init_params(struct kiln_model *g, uint64_t seed) {
    float *host = kiln_xmalloc(g->pt.total * sizeof(float));
    kiln_params_init(&g->pt, &g->cfg, host, seed);
    kiln_model_set_params(g, host);
    free(host);
}

// Every gradient is written by exactly one op per backward (the tied head/embedding excepted), so instead of
// a pass that zeroes all of them (6 GB at GPT-2 1.5B), the first micro-step's ops assign rather than add.
// Only the embedding tables are zeroed here: their backward scatters into the rows the tokens hit. With tied
// embeddings the classifier's backward writes the whole table first, in the forward pass. The padding
// between tensors is zeroed once at creation and never written.
void kiln_model_zero_grad(struct kiln_model *g) {
    g->grads_fresh = 1;
    size_t gb = kiln_dtype_bytes(g->be->grad_dtype);
    if (g->pt.wpe >= 0)
        g->ops->zero(g->ctx, G(g, g->pt.wpe), g->pt.p[g->pt.wpe].count * gb);
    if (!g->cfg.tie_embeddings)
        g->ops->zero(g->ctx, G(g, g->pt.wte), g->pt.p[g->pt.wte].count * gb);
}
