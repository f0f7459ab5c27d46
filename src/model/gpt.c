// The GPT forward and backward passes, written once against the ops table (DESIGN.md principle 1).
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
#include "model/gpt.h"
#include "model/gpt_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

// ----------------------------------------------------------------------------
// activation buffers: one slot per layer, or one (or two) shared slots when recomputed

// Rows per classifier chunk, given the bytes of scratch that the logits chunk overlaps for free. The full
// (N, Vp) logits are the largest activation of a small model (PyTorch keeps them whole, in f32: 6.6 GB for
// GPT-2 124M at B=32, T=1024), so the head runs in row chunks: as large as that free region, but at least
// 768 MiB (each chunk re-reads and re-writes the head's gradient: on the H100 7 chunks of 235 MiB cost GPT-2
// 350M 0.84 ms per step more than 2 of 1 GiB), at most 1 GiB, and never under 64 rows. Then the rows are
// spread evenly over the chunks that takes, so the last chunk is no sliver and the buffer no larger than it
// needs. opts.classifier_rows sets the rows outright (tests: several chunks at tiny shapes; benchmarks:
// what a chunk costs).
static int classifier_rows_for(const struct dims *d, size_t act_bytes, size_t free_bytes, int set) {
    if (set > 0)
        return set < d->N ? set : d->N;
    size_t row_bytes = (size_t)d->Vp * act_bytes, N = (size_t)d->N, rows = free_bytes / row_bytes;
    size_t lo = ((size_t)768 << 20) / row_bytes, hi = ((size_t)1 << 30) / row_bytes;
    rows = rows < lo ? lo : rows > hi ? hi : rows;
    rows = rows < 64 ? 64 : rows;
    size_t chunks = (N + rows - 1) / rows;
    return (int)((N + chunks - 1) / chunks);
}

// Rows per MLP chunk. Where the backward recomputes the MLP anyway (--recompute=block or mlp, training), the
// MLP runs over the tokens in chunks, forward and backward, so that its hidden activations (N x 4C, the
// largest per-layer buffers at long T: 8 GiB at the 1.3B shape and 512k tokens) and their gradients exist
// for one chunk at a time: chunks of at most 1 GiB of hidden activations, spread evenly. Every token's
// result is the same; the weight gradients are summed chunk by chunk. N (one chunk) otherwise.
static int mlp_rows_for(const struct dims *d, const struct kiln_gpt_opts *o, size_t act_bytes) {
    int recomputed =
        o->training && (o->recompute == KILN_RECOMPUTE_BLOCK || o->recompute == KILN_RECOMPUTE_MLP ||
                        o->recompute == KILN_RECOMPUTE_SELECTIVE);
    if (!recomputed || o->mlp_rows < 0)
        return d->N;
    if (o->mlp_rows > 0)
        return o->mlp_rows < d->N ? o->mlp_rows : d->N;
    size_t bytes = (size_t)d->N * d->FCO * act_bytes, chunks = (bytes + ((size_t)1 << 30) - 1) >> 30;
    chunks = chunks ? chunks : 1;
    return (int)(((size_t)d->N + chunks - 1) / chunks);
}

static int adjacent(const struct kiln_param_table *pt, int first, int second) {
    return first < 0 || (second >= 0 && pt->p[first].offset + pt->p[first].count == pt->p[second].offset);
}

static struct fusion fusion_of(const struct kiln_model_config *m, const struct kiln_param_table *pt,
                               const struct kiln_gpt_opts *o, size_t act_bytes) {
    struct fusion f = {0, 0};
    // a chunked MLP runs its own input projection chunk by chunk, apart from attention's
    struct dims d = dims_of(m, o->B, o->T);
    if (!m->parallel_block || m->qk_norm || o->no_parallel_fusion || mlp_rows_for(&d, o, act_bytes) < d.N)
        return f;
    for (int l = 0; l < m->n_layer; l++) {
        const int *ix = pt->layer[l];
        if (!adjacent(pt, ix[KILN_QKV_W], ix[KILN_FC_W]) || !adjacent(pt, ix[KILN_QKV_B], ix[KILN_FC_B]))
            return f;
    }
    f.on = 1;
    f.fwd = !(o->training && o->recompute == KILN_RECOMPUTE_MLP);
    return f;
}

// ----------------------------------------------------------------------------
// the scratch arena
//
// The one-slot scratch buffers share one allocation. Which of them are live at once (one stream: the order
// of the code is the order on the device):
//   forward, each layer    ao, then mo: a sequential block's ln2 consumes ao before its MLP writes mo, and a
//                          parallel block accumulates both branches in ao. So ao and mo share.
//   classifier             the logits chunk, and dln = dL/dlnf, filled chunk by chunk and read by backward's
//                          first op.
//   backward               dres, from the final norm's backward to the embedding's. Per layer, with dres:
//     recompute            ao, mo (block, mlp): nothing else of the scratch is live yet.
//     MLP                  dhid -> dfc -> dln, each read to write the next (dhid with dfc, dfc with dln).
//     attention            datty -> dqkv -> dqkv_raw -> dln likewise; in a parallel block dln is live
//                          throughout, as attention's input gradient adds to the MLP's.
//     fused parallel       dhid -> dpre's MLP slice, datty -> dpre's attention slice, dpre -> dln.
//     norms                dln -> dres.
// Hence the layout: [dln | dres | one layer: ao and mo, or its backward scratch], with the logits chunk over
// dres and the layer region (dead during the classifier: the layers are done and backward has not begun).
// Without training there is no backward: [ao and mo], with the logits chunk over them.
// opts.scratch_apart gives every buffer a range of its own (tests compare both; the chunk rows stay).

#define ARENA_ALIGN 256 // bytes: every buffer in the arena starts aligned for vector loads and cuBLASLt

static size_t align_up(size_t n) {
    return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

// puts b at offset; returns the offset after it
static size_t place(struct buf *b, size_t offset) {
    b->in_arena = 1;
    b->offset = offset;
    return offset + align_up(buf_bytes(b));
}

static size_t max_size(size_t a, size_t b) {
    return a > b ? a : b;
}

// Places the scratch buffers but the logits chunk (all sized); returns the arena's end so far and, in
// *logits_at, where the logits chunk goes: it may take the rest for free.
static size_t scratch_layout(struct acts *a, int training, int fused, size_t *logits_at) {
    size_t after_dln = training ? place(&a->dln, 0) : 0;
    size_t layer = training ? place(&a->dres, after_dln) : 0;
    size_t end = max_size(place(&a->ao, layer), place(&a->mo, layer));
    if (training && fused) {
        size_t after = place(&a->dpre, layer);        // [dqkv | dfc]
        end = max_size(end, place(&a->dhid, after));  // read to write dpre's MLP slice
        end = max_size(end, place(&a->datty, after)); // then read to write its attention slice
    } else if (training) {
        end = max_size(end, place(&a->dhid, place(&a->dfc, layer))); // the MLP
        size_t after = place(&a->dqkv, layer);                       // then the attention
        end = max_size(end, place(&a->datty, after));
        end = max_size(end, place(&a->dqkv_raw, after)); // written once datty is read
    }
    *logits_at = after_dln;
    return end;
}

// every scratch buffer in a range of its own (opts.scratch_apart); returns the arena's bytes
static size_t scratch_apart(struct acts *a) {
    struct buf *bufs = (struct buf *)a;
    size_t end = 0;
    for (size_t i = 0; i < N_ACT_BUFS; i++)
        if (bufs[i].in_arena)
            end = place(&bufs[i], end);
    return end;
}

// Activation offload (training with --recompute=block, which keeps only each layer's input x[l] and its
// norm's statistics): x[l] goes to pinned host memory once layer l's forward has read it, and comes back
// during the backward of layer l + 1, on the backend's copy stream beside the compute. The device keeps a
// ring of X_RING inputs: in the forward, layer l writes x[l + 1] over x[l + 1 - X_RING], whose copy out has
// had a layer's compute to finish; the last X_RING inputs stay for the backward, which brings each earlier
// one back a layer ahead of its use. --recompute=selective also keeps each layer's attention output atty[l];
// with offload it takes the same road, in a ring of X_RING of its own (its lse, N x heads f32, stays).
#define X_RING 3

// --recompute=block and selective keep only each layer's input (and, selective, its attention's output)
static int recomputes_blocks(enum kiln_recompute r) {
    return r == KILN_RECOMPUTE_BLOCK || r == KILN_RECOMPUTE_SELECTIVE;
}

static int offloads_acts(const struct kiln_gpt_opts *o) {
    return o->training && o->offload_activations && recomputes_blocks(o->recompute);
}

// the device's slots for the residual stream's layer inputs x[0..L] in training
static int x_slots(const struct dims *d, const struct kiln_gpt_opts *o) {
    return offloads_acts(o) && d->L + 1 > X_RING ? X_RING : d->L + 1;
}

// An offloaded buffer of n entries (struct offl): its host part from *host on, and its events.
static void offl_init(struct kiln_gpt *g, struct offl *o, struct buf *b, int n, char **host) {
    o->b = b;
    o->n = n;
    if (b->slots >= n)
        return; // every entry stays on the device
    o->host = *host;
    *host += (size_t)(n - b->slots) * b->elems * b->elem_bytes;
    if (g->ops->event_create) {
        o->out = kiln_xcalloc((size_t)n, sizeof(void *));
        o->in = kiln_xcalloc((size_t)n, sizeof(void *));
        for (int l = 0; l < n; l++)
            o->out[l] = g->ops->event_create(g->ctx), o->in[l] = g->ops->event_create(g->ctx);
    }
}

static void offl_free(struct kiln_gpt *g, struct offl *o) {
    for (int l = 0; o->out && l < o->n; l++) {
        g->ops->event_destroy(g->ctx, o->out[l]);
        g->ops->event_destroy(g->ctx, o->in[l]);
    }
    free(o->out);
    free(o->in);
    memset(o, 0, sizeof(*o));
}

// Lays out the activation buffers: sizes, and offsets in the scratch arena. Shared by the plan and the
// allocation so they cannot drift. Returns the arena's bytes, and the rows per classifier chunk in *rows.
static size_t acts_layout(struct acts *a, int *rows, const struct dims *d, const struct kiln_gpt_opts *o,
                          const struct fusion *fu, size_t ab) {
    memset(a, 0, sizeof(*a));
    int L = d->L, training = o->training;
    enum kiln_recompute rc = o->recompute;
    int per_layer = recomputes_blocks(rc) ? 1 : L;
    int mlp_slots = rc == KILN_RECOMPUTE_NONE ? L : 1;                             // fc_act
    int pre_slots = rc == KILN_RECOMPUTE_NONE || rc == KILN_RECOMPUTE_ACT ? L : 1; // fc_pre
    if (!training)
        per_layer = mlp_slots = pre_slots = 1;
    // selective keeps atty and lse a layer; with offload, atty's older layers wait on the host
    int lse_slots = training && rc == KILN_RECOMPUTE_SELECTIVE ? L : per_layer;
    int attn_slots = lse_slots == L && training && offloads_acts(o) && L > X_RING ? X_RING : lse_slots;
    size_t N = (size_t)d->N, f = sizeof(float), i = sizeof(int32_t);
    size_t mrows = (size_t)mlp_rows_for(d, o, ab); // the MLP's buffers hold one chunk
    // a fused forward keeps [qkv | fc_pre] in pre (pre_slots == per_layer then); a fused backward has dpre
    size_t qkv = N * d->QKV, fc = mrows * d->FCO, pre = fu->fwd ? qkv + N * d->FCO : 0,
           dpre = fu->on ? qkv + N * d->FCO : 0;
#define SET(b, n, s, eb) (a->b = (struct buf){.elems = (n), .slots = (s), .elem_bytes = (eb)})
    SET(x, N * d->C, training ? x_slots(d, o) : 2, ab);
    SET(ln1, N * d->C, (recomputes_blocks(rc) || !training) ? 2 : L + 1, ab);
    SET(mean1, N, L + 1, f);
    SET(rstd1, N, L + 1, f);
    SET(pre, pre, per_layer, ab);
    SET(qkv, pre ? 0 : qkv, per_layer, ab);
    size_t qk = d->qk_norm ? 1 : 0; // QK-norm's buffers are empty without it
    SET(qkv_raw, qk * N * d->QKV, per_layer, ab);
    SET(meanq, qk * N, per_layer, f);
    SET(rstdq, qk * N, per_layer, f);
    SET(meank, qk * N, per_layer, f);
    SET(rstdk, qk * N, per_layer, f);
    SET(atty, N * d->AO, attn_slots, ab);
    SET(lse, N * d->NH, lse_slots, f);
    SET(mid, N * d->C, per_layer, ab);
    SET(ln2, N * d->C, per_layer, ab);
    SET(mean2, N, per_layer, f);
    SET(rstd2, N, per_layer, f);
    SET(fc_pre, pre ? 0 : fc, pre_slots, ab);
    SET(fc_act, mrows * d->H, mlp_slots, ab);
    SET(ao, N * d->C, 1, ab);
    SET(mo, N * d->C, 1, ab);
    SET(losses, N, 1, f);
    SET(tokens, N, 1, i);
    SET(targets, N, 1, i);
    if (training) {
        SET(dln, N * d->C, 1, ab);
        SET(dres, N * d->C, 1, ab);
        SET(dpre, dpre, 1, ab);
        SET(dqkv, dpre ? 0 : qkv, 1, ab);
        SET(dqkv_raw, qk * N * d->QKV, 1, ab);
        SET(datty, N * d->AO, 1, ab);
        SET(dfc, dpre ? 0 : fc, 1, ab);
        if (d->FCO != d->H)
            SET(dhid, mrows * d->H, 1, ab);
    }
    size_t logits_at, end = scratch_layout(a, training, fu->on, &logits_at);
    *rows = classifier_rows_for(d, ab, end - logits_at, o->classifier_rows);
    SET(logits, (size_t)*rows * d->Vp, 1, ab);
#undef SET
    end = max_size(end, place(&a->logits, logits_at));
    return o->scratch_apart ? scratch_apart(a) : end;
}

void kiln_gpt_plan(const struct kiln_model_config *m, const struct kiln_gpt_opts *o, enum kiln_dtype act,
                   enum kiln_dtype grad, int weights_alias_master, struct kiln_mem_plan *plan) {
    struct kiln_param_table pt;
    kiln_params_build(&pt, m);
    struct dims d = dims_of(m, o->B, o->T);
    size_t ab = kiln_dtype_bytes(act);
    struct fusion fu = fusion_of(m, &pt, o, kiln_dtype_bytes(act));
    struct acts a;
    memset(plan, 0, sizeof(*plan));
    plan->scratch_bytes = acts_layout(&a, &plan->classifier_rows, &d, o, &fu, ab);
    // ZeRO-3 holds a shard (optim_elems) of the master weights and of their compute copy
    size_t held = o->sharded_params && o->optim_elems ? o->optim_elems : pt.total;
    // an offloaded optimizer keeps the master weights in host memory, except where they are the compute copy
    plan->params_bytes = o->offload_optimizer && !weights_alias_master ? 0 : held * sizeof(float);
    plan->weights_bytes = weights_alias_master ? 0 : held * ab;
    if (o->training) {
        plan->grads_bytes = o->external_grads ? 0 : pt.total * kiln_dtype_bytes(grad);
        plan->optim_bytes =
            o->offload_optimizer ? 0 : 2 * (o->optim_elems ? o->optim_elems : pt.total) * sizeof(float);
    }
    plan->acts_bytes = plan->scratch_bytes;
    if (o->training && a.x.slots < d.L + 1) // x[0 .. L - slots] live on the host
        plan->host_bytes = (size_t)(d.L + 1 - a.x.slots) * a.x.elems * ab;
    // and, selective, atty[0 .. L - 1 - slots]
    if (o->training && o->recompute == KILN_RECOMPUTE_SELECTIVE && a.atty.slots < d.L)
        plan->host_bytes += (size_t)(d.L - a.atty.slots) * a.atty.elems * ab;
    struct buf *bufs = (struct buf *)&a;
    for (size_t i = 0; i < N_ACT_BUFS; i++)
        if (!bufs[i].in_arena)
            plan->acts_bytes += buf_bytes(&bufs[i]);
    plan->total_bytes =
        plan->params_bytes + plan->weights_bytes + plan->grads_bytes + plan->optim_bytes + plan->acts_bytes;
    kiln_params_free(&pt);
}

// ----------------------------------------------------------------------------
// creation

int gpt_alloc(struct kiln_gpt *g, void **p, size_t bytes, struct kiln_error *err) {
    if (!bytes) {
        *p = NULL;
        return 0;
    }
    *p = g->ops->alloc(g->ctx, bytes);
    if (*p)
        return 0;
    const struct kiln_mem_plan *pl = &g->plan;
    return kiln_errorf(
        err, KILN_ERR_RUNTIME,
        "out of memory on %s (%s) allocating %.2f GiB: the plan needs %.2f GiB (params %.2f, "
        "weights %.2f, grads %.2f, optimizer %.2f, activations %.2f); lower --batch or --seq, or use "
        "--recompute=block",
        g->be->name, g->be->device_name, bytes / 1073741824.0, pl->total_bytes / 1073741824.0,
        pl->params_bytes / 1073741824.0, pl->weights_bytes / 1073741824.0, pl->grads_bytes / 1073741824.0,
        pl->optim_bytes / 1073741824.0, pl->acts_bytes / 1073741824.0);
}

static void build_spans(struct kiln_gpt *g) {
    // one span per tensor; adjacent tensors with the same decay setting merge, padding excluded
    g->spans = kiln_xcalloc((size_t)g->pt.n, sizeof(*g->spans));
    g->n_spans = 0;
    for (int i = 0; i < g->pt.n; i++) {
        const struct kiln_param *p = &g->pt.p[i];
        g->spans[g->n_spans++] = (struct kiln_param_span){p->offset, p->count, p->decay, p->offset};
    }
}

int kiln_gpt_create(struct kiln_gpt **out, const struct kiln_model_config *m, struct kiln_backend *be,
                    const struct kiln_gpt_opts *o, struct kiln_error *err) {
    struct kiln_gpt *g = kiln_xcalloc(1, sizeof(*g));
    g->cfg = *m;
    g->opts = *o;
    g->be = be;
    g->ops = be->ops;
    g->ctx = be->ctx;
    kiln_params_build(&g->pt, m);
    kiln_gpt_plan(m, o, be->act_dtype, be->grad_dtype, be->weights_alias_master, &g->plan);
    struct dims d = dims_of(m, o->B, o->T);
    g->fuse = fusion_of(m, &g->pt, o, kiln_dtype_bytes(be->act_dtype));
    g->optim_elems = o->optim_elems ? o->optim_elems : g->pt.total;
    KILN_ASSERT(g->optim_elems <= g->pt.total);
    size_t arena_bytes =
        acts_layout(&g->a, &g->classifier_rows, &d, o, &g->fuse, kiln_dtype_bytes(be->act_dtype));
    g->mlp_rows = mlp_rows_for(&d, o, kiln_dtype_bytes(be->act_dtype));
    *out = g;

    int rc = gpt_alloc(g, (void **)&g->params, g->plan.params_bytes, err);
    if (!rc && !be->weights_alias_master)
        rc = gpt_alloc(g, &g->weights, g->plan.weights_bytes, err);
    else
        g->weights = g->params;
    if (!rc && o->training) {
        rc = gpt_alloc(g, &g->grads, g->plan.grads_bytes, err);
        if (!rc && g->grads)
            g->ops->zero(g->ctx, g->grads, g->plan.grads_bytes);
        if (!rc)
            rc = gpt_alloc(g, (void **)&g->m, g->plan.optim_bytes / 2, err);
        if (!rc)
            rc = gpt_alloc(g, (void **)&g->v, g->plan.optim_bytes / 2, err);
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
        kiln_gpt_free(g);
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
        kiln_gpt_set_weight_window(g, s, NULL);
        kiln_gpt_set_grad_window(g, s, NULL);
    }
    g->tokens_host = kiln_xcalloc((size_t)d.N, sizeof(int32_t));
    g->losses_host = kiln_xcalloc((size_t)d.N, sizeof(float));
    build_spans(g);
    // the offloaded layer inputs (and attention outputs), and an event each way for each
    if (g->plan.host_bytes) {
        g->host_acts = g->ops->host_alloc ? g->ops->host_alloc(g->ctx, g->plan.host_bytes) : NULL;
        if (!g->host_acts) {
            int sel = g->opts.recompute == KILN_RECOMPUTE_SELECTIVE;
            kiln_gpt_free(g);
            *out = NULL;
            return kiln_errorf(
                err, KILN_ERR_RUNTIME,
                "out of host memory (--offload=activations): %.2f GiB of pinned memory for the "
                "layer inputs%s; lower --seq or --batch, or leave the activations on the device",
                g->plan.host_bytes / 1073741824.0, sel ? " and attention outputs" : "");
        }
        char *host = g->host_acts;
        offl_init(g, &g->off_x, &g->a.x, d.L + 1, &host);
        if (g->opts.recompute == KILN_RECOMPUTE_SELECTIVE)
            offl_init(g, &g->off_atty, &g->a.atty, d.L, &host);
    }
    return 0;
}

void gpt_free_buf(struct kiln_gpt *g, struct buf *b) {
    if (b->p)
        g->ops->free(g->ctx, b->p);
    b->p = NULL;
}

void kiln_gpt_free(struct kiln_gpt *g) {
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
    if (g->weights && g->weights != g->params)
        g->ops->free(g->ctx, g->weights);
    void *owned[] = {g->params, g->grads, g->m, g->v};
    for (int i = 0; i < 4; i++)
        if (owned[i])
            g->ops->free(g->ctx, owned[i]);
    if (g->host_acts)
        g->ops->host_free(g->ctx, g->host_acts);
    offl_free(g, &g->off_x);
    offl_free(g, &g->off_atty);
    kiln_params_free(&g->pt);
    free(g->tokens_host);
    free(g->losses_host);
    free(g->spans);
    free(g->wwin);
    free(g->gwin);
    free(g->seg_begin);
    free(g);
}

int kiln_gpt_grad_segments(const struct kiln_gpt *g, const size_t **begins) {
    *begins = g->seg_begin;
    return g->cfg.n_layer + 2;
}

void kiln_gpt_set_grad_window(struct kiln_gpt *g, int seg, void *base) {
    KILN_ASSERT(seg >= 0 && seg < g->cfg.n_layer + 2);
    size_t gb = kiln_dtype_bytes(g->be->grad_dtype);
    g->gwin[seg] = base ? base : g->grads ? (char *)g->grads + g->seg_begin[seg] * gb : NULL;
}

void kiln_gpt_set_attention(struct kiln_gpt *g, const struct kiln_gpt_attention *a) {
    if (a)
        g->attn_impl = *a;
    else
        memset(&g->attn_impl, 0, sizeof(g->attn_impl));
}

void kiln_gpt_set_positions(struct kiln_gpt *g, int pos0, int split, int pos1) {
    g->pos0 = pos0;
    g->pos_split = split;
    g->pos1 = pos1;
}

void kiln_gpt_set_hooks(struct kiln_gpt *g, const struct kiln_gpt_hooks *h) {
    if (h)
        g->hooks = *h;
    else
        memset(&g->hooks, 0, sizeof(g->hooks));
}

void kiln_gpt_set_weight_window(struct kiln_gpt *g, int seg, const void *base) {
    KILN_ASSERT(seg >= 0 && seg < g->cfg.n_layer + 2);
    g->wwin[seg] = base ? base : g->opts.sharded_params ? NULL : act_at(g, g->weights, g->seg_begin[seg]);
}

void kiln_gpt_set_layer_window(struct kiln_gpt *g, int l, const void *base) {
    KILN_ASSERT(l >= 0 && l < g->cfg.n_layer);
    kiln_gpt_set_weight_window(g, 1 + l, base);
}

void kiln_gpt_buffers(const struct kiln_gpt *g, struct kiln_gpt_buffers *out) {
    *out = (struct kiln_gpt_buffers){.params = g->params,
                                     .weights = g->weights,
                                     .grads = g->grads,
                                     .m = g->m,
                                     .v = g->v,
                                     .optim_elems = g->optim_elems};
}

const struct kiln_param_span *kiln_gpt_spans(const struct kiln_gpt *g, int *n) {
    *n = g->n_spans;
    return g->spans;
}

const struct kiln_param_table *kiln_gpt_params(const struct kiln_gpt *g) {
    return &g->pt;
}

const struct kiln_mem_plan *kiln_gpt_mem_plan(const struct kiln_gpt *g) {
    return &g->plan;
}

size_t kiln_gpt_mem_peak(const struct kiln_gpt *g) {
    size_t peak = g->ops->mem_peak ? g->ops->mem_peak(g->ctx) : 0;
    return peak > g->plan.total_bytes ? peak : g->plan.total_bytes;
}

void kiln_gpt_fused_projection(const struct kiln_gpt *g, int *fwd, int *bwd) {
    *fwd = g->fuse.fwd;
    *bwd = g->fuse.on;
}

// ----------------------------------------------------------------------------
// parameters

void kiln_gpt_set_params(struct kiln_gpt *g, const float *host) {
    if (g->opts.sharded_params || g->opts.offload_optimizer) {
        KILN_ASSERT(g->hooks.params_set);
        g->hooks.params_set(g->hooks.user, host);
        return;
    }
    g->ops->upload(g->ctx, g->params, host, g->pt.total * sizeof(float));
    if (g->weights != g->params)
        g->ops->upload_f32(g->ctx, g->weights, g->be->act_dtype, host, g->pt.total);
}

void kiln_gpt_get_params(struct kiln_gpt *g, float *host) {
    if (g->opts.sharded_params || g->opts.offload_optimizer) {
        KILN_ASSERT(g->hooks.params_get);
        g->hooks.params_get(g->hooks.user, host);
        return;
    }
    g->ops->download(g->ctx, host, g->params, g->pt.total * sizeof(float));
}

void kiln_gpt_get_grads(struct kiln_gpt *g, float *host) {
    KILN_ASSERT(g->grads);
    g->ops->download_f32(g->ctx, host, g->grads, g->be->grad_dtype, g->pt.total);
}

void kiln_gpt_get_optim(struct kiln_gpt *g, float *m_host, float *v_host) {
    if (g->opts.offload_optimizer) {
        KILN_ASSERT(g->hooks.optim_get);
        g->hooks.optim_get(g->hooks.user, m_host, v_host);
        return;
    }
    g->ops->download(g->ctx, m_host, g->m, g->optim_elems * sizeof(float));
    g->ops->download(g->ctx, v_host, g->v, g->optim_elems * sizeof(float));
}

void kiln_gpt_set_optim(struct kiln_gpt *g, const float *m_host, const float *v_host) {
    if (g->opts.offload_optimizer) {
        KILN_ASSERT(g->hooks.optim_set);
        g->hooks.optim_set(g->hooks.user, m_host, v_host);
        return;
    }
    g->ops->upload(g->ctx, g->m, m_host, g->optim_elems * sizeof(float));
    g->ops->upload(g->ctx, g->v, v_host, g->optim_elems * sizeof(float));
}

void kiln_gpt_init_params(struct kiln_gpt *g, uint64_t seed) {
    float *own = g->hooks.params_buffer ? g->hooks.params_buffer(g->hooks.user) : NULL;
    float *host = own ? own : kiln_xmalloc(g->pt.total * sizeof(float));
    kiln_params_init(&g->pt, &g->cfg, host, seed);
    kiln_gpt_set_params(g, host);
    if (!own)
        free(host);
}

// Every gradient is written by exactly one op per backward (the tied head/embedding excepted), so instead of
// a pass that zeroes all of them (6 GB at GPT-2 1.5B), the first micro-step's ops assign rather than add.
// Only the embedding tables are zeroed here: their backward scatters into the rows the tokens hit. With tied
// embeddings the classifier's backward writes the whole table first, in the forward pass. The padding
// between tensors is zeroed once at creation and never written.
void kiln_gpt_zero_grad(struct kiln_gpt *g) {
    g->grads_fresh = 1;
    size_t gb = kiln_dtype_bytes(g->be->grad_dtype);
    if (g->pt.wpe >= 0)
        g->ops->zero(g->ctx, G(g, g->pt.wpe), g->pt.p[g->pt.wpe].count * gb);
    if (!g->cfg.tie_embeddings)
        g->ops->zero(g->ctx, G(g, g->pt.wte), g->pt.p[g->pt.wte].count * gb);
}

// ----------------------------------------------------------------------------
// forward

void gpt_norm_fwd(struct kiln_gpt *g, void *out, float *mean, float *rstd, void *res_out, const void *inp,
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

void gpt_matmul_fwd(struct kiln_gpt *g, void *out, void *pre, const void *inp, int wi, int bi, int N, int IC,
                    int OC, enum kiln_act act, int accumulate) {
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
    g->ops->matmul_forward(g->ctx, &a);
}

// The MLP of layer l after its input projection: fc_act = act(fc_pre) (rows of fc_pre `stride` elements
// apart, 0 = FCO), then out = (or +=) self.c_proj(fc_act).
// fc_act = SwiGLU or GELU of fc_pre (rows stride apart, 0 = dense)
static void mlp_activation(struct kiln_gpt *g, const struct dims *d, const void *fc_pre, int stride,
                           void *fc_act, int N) {
    if (g->cfg.mlp_swiglu) {
        struct kiln_swiglu_args s = {.out = fc_act, .inp = fc_pre, .N = N, .H = d->H, .inp_stride = stride};
        g->ops->swiglu_forward(g->ctx, &s);
    } else {
        struct kiln_gelu_args s = {.out = fc_act, .inp = fc_pre, .N = N, .H = d->H, .inp_stride = stride};
        g->ops->gelu_forward(g->ctx, &s);
    }
}

void gpt_mlp_act_fwd(struct kiln_gpt *g, const struct dims *d, int l, const void *fc_pre, int stride,
                     void *fc_act, void *out, int accumulate, int N) {
    const int *ix = g->pt.layer[l];
    mlp_activation(g, d, fc_pre, stride, fc_act, N);
    if (out)
        gpt_matmul_fwd(g, out, NULL, fc_act, ix[KILN_MLPO_W], ix[KILN_MLPO_B], N, d->H, d->C, KILN_ACT_NONE,
                       accumulate);
}

// the MLP's hidden activation of N rows of `inp` (N, C): fc_pre, and fc_act from it
static void mlp_hidden(struct kiln_gpt *g, const struct dims *d, int l, const void *inp, void *fc_pre,
                       void *fc_act, int N) {
    const int *ix = g->pt.layer[l];
    if (g->cfg.mlp_swiglu) {
        // F.silu(gate) * up, where [gate | up] = self.c_fc(x)
        gpt_matmul_fwd(g, fc_pre, NULL, inp, ix[KILN_FC_W], ix[KILN_FC_B], N, d->C, d->FCO, KILN_ACT_NONE, 0);
        mlp_activation(g, d, fc_pre, 0, fc_act, N);
    } else { // gelu(self.c_fc(x)), the GELU in the GEMM's epilogue
        gpt_matmul_fwd(g, fc_act, fc_pre, inp, ix[KILN_FC_W], ix[KILN_FC_B], N, d->C, d->H, KILN_ACT_GELU, 0);
    }
}

// the MLP of layer l on input `inp` (N, C): fc_pre, fc_act, and (accumulated into) out = self.c_proj(fc_act),
// in chunks of g->mlp_rows rows (fc_pre and fc_act then hold the last chunk's). out NULL: the hidden
// activations alone (the backward's recompute: the MLP's backward never reads its output).
void gpt_mlp_fwd(struct kiln_gpt *g, const struct dims *d, int l, const void *inp, void *fc_pre, void *fc_act,
                 void *out, int accumulate, int N) {
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
void gpt_qk_norm_forward(struct kiln_gpt *g, const struct dims *d, int l, void *qkv, const void *raw, int N,
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
static void qk_norm_backward(struct kiln_gpt *g, const struct dims *d, int l, void *draw, const void *dqkv,
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
static void attn_core_fwd(struct kiln_gpt *g, const struct dims *d, int l, const void *qkv, int stride) {
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

static void attn_fwd(struct kiln_gpt *g, const struct dims *d, int l) {
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
static void parallel_fused_fwd(struct kiln_gpt *g, const struct dims *d, int l, int tail) {
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
static void layer_forward(struct kiln_gpt *g, const struct dims *d, int l, int tail) {
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
                     buf_at(&a->x, l), a->ao.p, ix[KILN_LN2_W], ix[KILN_LN2_B], d->N);
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
                 buf_at(&a->x, l + 1), resid, branch, wi, bi, d->N);
}

int gpt_head_index(const struct kiln_gpt *g) {
    return g->cfg.tie_embeddings ? g->pt.wte : g->pt.lm_head;
}

// logits = lnf @ wte^T chunk by chunk; cross-entropy; with dloss, dlogits -> dlnf and dW_head.
static void classifier(struct kiln_gpt *g, const struct dims *d, float dloss, float z_loss) {
    struct acts *a = &g->a;
    int head = gpt_head_index(g);
    const void *lnf = buf_at(&a->ln1, d->L);
    for (int r0 = 0; r0 < d->N; r0 += g->classifier_rows) {
        int rows = d->N - r0 < g->classifier_rows ? d->N - r0 : g->classifier_rows;
        const void *x = act_at(g, lnf, (size_t)r0 * d->C);
        gpt_matmul_fwd(g, a->logits.p, NULL, x, head, -1, rows, d->C, d->Vp, KILN_ACT_NONE, 0);
        struct kiln_xent_args xa = {.logits = a->logits.p,
                                    .losses = (float *)a->losses.p + r0,
                                    .targets = (const int32_t *)a->targets.p + r0,
                                    .N = rows,
                                    .V = d->V,
                                    .Vp = d->Vp,
                                    .dloss = dloss,
                                    .z_loss = z_loss};
        g->ops->cross_entropy(g->ctx, &xa);
        if (dloss != 0.0f) {
            struct kiln_matmul_back_args mb = {.dinp = act_at(g, a->dln.p, (size_t)r0 * d->C),
                                               .dweight = G(g, head),
                                               .dout = a->logits.p,
                                               .inp = x,
                                               .weight = W(g, head),
                                               .N = rows,
                                               .IC = d->C,
                                               .OC = d->Vp,
                                               .grad_assign = g->grads_fresh && r0 == 0};
            g->ops->matmul_backward(g->ctx, &mb);
        }
    }
}

// ---- activation offload (X_RING above) ----

// whether entry l of an offloaded buffer lives on the host between its forward and its backward
static int offl_has(const struct offl *o, int l) {
    return o->host && l >= 0 && l <= o->n - 1 - o->b->slots;
}

// entry l to or from its host copy, beside the compute
static void offl_copy(struct kiln_gpt *g, const struct offl *o, int l, int to_host) {
    size_t bytes = o->b->elems * o->b->elem_bytes;
    void *dev = buf_at(o->b, l), *host = (char *)o->host + (size_t)l * bytes;
    void **evs = to_host ? o->out : o->in;
    g->ops->copy_async(g->ctx, to_host ? host : dev, to_host ? dev : host, bytes, evs ? evs[l] : NULL);
}

// the compute stream waits for entry l's copy out (to_host) or back, where the backend has streams
static void offl_wait(struct kiln_gpt *g, const struct offl *o, int l, int to_host) {
    void **evs = to_host ? o->out : o->in;
    if (evs && g->ops->stream_wait)
        g->ops->stream_wait(g->ctx, evs[l]);
}

// before entry e is written into its slot: the entry that slot held must have reached the host
static void offl_claim(struct kiln_gpt *g, const struct offl *o, int e) {
    if (o->host && offl_has(o, e - o->b->slots))
        offl_wait(g, o, e - o->b->slots, 1);
}

double kiln_gpt_forward(struct kiln_gpt *g, const int32_t *inputs, const int32_t *targets, float dloss,
                        float z_loss) {
    KILN_ASSERT(g->opts.training || dloss == 0.0f);
    struct dims d = dims_of(&g->cfg, g->opts.B, g->opts.T);
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
    g->ops->embed_forward(g->ctx, &e);
    gpt_norm_fwd(g, buf_at(&a->ln1, 0), buf_at(&a->mean1, 0), buf_at(&a->rstd1, 0), NULL, buf_at(&a->x, 0),
                 NULL, g->pt.layer[0][KILN_LN1_W], g->pt.layer[0][KILN_LN1_B], d.N);
    int offload = dloss != 0.0f && g->host_acts; // a forward without a backward keeps nothing
    for (int l = 0; l < d.L; l++) {
        HOOK(g, layer_begin, l, 0);
        if (offload) { // layer l writes x[l + 1] and atty[l]
            offl_claim(g, &g->off_x, l + 1);
            offl_claim(g, &g->off_atty, l);
        }
        layer_forward(g, &d, l, 1);
        HOOK(g, layer_end, l, 0);
        const struct offl *offs[2] = {&g->off_x, &g->off_atty};
        for (int i = 0; offload && i < 2; i++)
            if (offl_has(offs[i], l))
                offl_copy(g, offs[i], l, 1);
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

// ----------------------------------------------------------------------------
// backward: the mirror of forward

// dres is the residual stream's gradient. The projections that add into the stream there have dres as their
// output gradient, so their biases' gradients (parameter indices rb0, rb1; -1: none) are dres's column sums:
// the norm backward adds them as it leaves dres, and those projections' backward skips them (no extra pass).
static void norm_bwd(struct kiln_gpt *g, void *dres, const void *dout, const void *inp, const float *mean,
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
static void proj_biases(const struct kiln_gpt *g, int l, int *rb0, int *rb1) {
    *rb0 = l < 0 ? -1 : g->pt.layer[l][KILN_MLPO_B];
    *rb1 = l < 0 || !g->cfg.parallel_block ? -1 : g->pt.layer[l][KILN_ATTNO_B];
}

static void matmul_bwd(struct kiln_gpt *g, void *dinp, const void *dout, const void *inp, int wi, int bi,
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
    g->ops->matmul_backward(g->ctx, &a);
}

// Backward of gpt_mlp_act_fwd, given dout = dL/d(mlp output): dfc = dL/d(fc_pre), rows dfc_stride apart
// (fc_pre's pre_stride; 0 = FCO). The projection bias's gradient comes from the norm backward that left dout
// (norm_bwd).
static void mlp_act_bwd(struct kiln_gpt *g, const struct dims *d, int l, const void *dout, const void *fc_pre,
                        int pre_stride, const void *fc_act, void *dfc, int dfc_stride, int N) {
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
        g->ops->matmul_backward(g->ctx, &m);
    }
}

// Backward of the MLP of layer l, given dout = dL/d(mlp output); writes dL/d(mlp input) into dinp. A chunked
// MLP (g->mlp_rows < N) recomputes each chunk's hidden activation first (the recompute left it out), and its
// weights' gradients add up over the chunks.
static void mlp_bwd(struct kiln_gpt *g, const struct dims *d, int l, const void *inp, const void *dout,
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
static void attn_core_bwd(struct kiln_gpt *g, const struct dims *d, int l, const void *dout, const void *qkv,
                          int qkv_stride, void *dqkv, int dqkv_stride) {
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
static void attn_bwd(struct kiln_gpt *g, const struct dims *d, int l, const void *dout, void *dinp,
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
static void parallel_fused_bwd(struct kiln_gpt *g, const struct dims *d, int l, const void *dout,
                               void *dinp) {
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

// Re-runs what backward needs but recompute did not keep.
static void recompute_layer(struct kiln_gpt *g, const struct dims *d, int l) {
    struct acts *a = &g->a;
    if (recomputes_blocks(g->opts.recompute)) {
        gpt_norm_fwd(g, buf_at(&a->ln1, l), buf_at(&a->mean1, l), buf_at(&a->rstd1, l), NULL,
                     buf_at(&a->x, l), NULL, g->pt.layer[l][KILN_LN1_W], g->pt.layer[l][KILN_LN1_B], d->N);
        g->recomputing = 1;
        layer_forward(g, d, l, 0);
        g->recomputing = 0;
    } else if (g->opts.recompute == KILN_RECOMPUTE_MLP && g->mlp_rows == d->N) { // chunked: in mlp_bwd
        const void *inp = g->cfg.parallel_block ? buf_at(&a->ln1, l) : buf_at(&a->ln2, l);
        gpt_mlp_fwd(g, d, l, inp, buf_at(&a->fc_pre, l), buf_at(&a->fc_act, l), NULL, 0, d->N);
    } else if (g->opts.recompute == KILN_RECOMPUTE_ACT) {
        // the activation's output from its kept input: fc_pre, or the MLP slice of a fused block's [qkv |
        // fc_pre]
        int S = d->QKV + d->FCO;
        const void *pre = g->fuse.fwd ? act_at(g, buf_at(&a->pre, l), (size_t)d->QKV) : buf_at(&a->fc_pre, l);
        mlp_activation(g, d, pre, g->fuse.fwd ? S : 0, buf_at(&a->fc_act, l), d->N);
    }
}

void kiln_gpt_backward(struct kiln_gpt *g) {
    KILN_ASSERT(g->has_grad_forward);
    struct dims d = dims_of(&g->cfg, g->opts.B, g->opts.T);
    struct acts *a = &g->a;
    void *dres = a->dres.p; // dL/dx, the residual stream's gradient, flowing down the layers

    // final norm: dres = dL/dx[L]
    int rb0, rb1;
    proj_biases(g, d.L - 1, &rb0, &rb1);
    norm_bwd(g, dres, a->dln.p, buf_at(&a->x, d.L), buf_at(&a->mean1, d.L), buf_at(&a->rstd1, d.L),
             g->pt.lnf_w, g->pt.lnf_b, d.N, 1, rb0, rb1);

    for (int l = d.L - 1; l >= 0; l--) {
        const int *ix = g->pt.layer[l];
        HOOK(g, layer_begin, l, 1); // its weights, for the recompute and the backward
        // the layer below's input (and attention output) come back while this one computes
        const struct offl *offs[2] = {&g->off_x, &g->off_atty};
        for (int i = 0; i < 2; i++) {
            if (offl_has(offs[i], l - 1))
                offl_copy(g, offs[i], l - 1, 0);
            if (offl_has(offs[i], l))
                offl_wait(g, offs[i], l, 0);
        }
        recompute_layer(g, &d, l);
        if (g->cfg.parallel_block && g->fuse.on) {
            parallel_fused_bwd(g, &d, l, dres, a->dln.p);
        } else if (g->cfg.parallel_block) {
            // both branches read ln1 and write dL/dln1 into dln; the residual passes dres straight through
            mlp_bwd(g, &d, l, buf_at(&a->ln1, l), dres, a->dln.p, 0);
            attn_bwd(g, &d, l, dres, a->dln.p, 1);
        } else {
            // x' = h + mlp(ln2(h)): dres is dL/dx' = dL/d(mlp out); then dres += ln2 backward -> dL/dh
            mlp_bwd(g, &d, l, buf_at(&a->ln2, l), dres, a->dln.p, 0);
            norm_bwd(g, dres, a->dln.p, buf_at(&a->mid, l), buf_at(&a->mean2, l), buf_at(&a->rstd2, l),
                     ix[KILN_LN2_W], ix[KILN_LN2_B], d.N, 0, ix[KILN_ATTNO_B], -1);
            // h = x + attn(ln1(x))
            attn_bwd(g, &d, l, dres, a->dln.p, 0);
        }
        proj_biases(g, l - 1, &rb0, &rb1);
        norm_bwd(g, dres, a->dln.p, buf_at(&a->x, l), buf_at(&a->mean1, l), buf_at(&a->rstd1, l),
                 ix[KILN_LN1_W], ix[KILN_LN1_B], d.N, 0, rb0, rb1);
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
    g->ops->embed_backward(g->ctx, &eb);
    if (g->hooks.embed_backward_end)
        g->hooks.embed_backward_end(g->hooks.user);
    g->has_grad_forward = 0;
    g->grads_fresh = 0;
}

// ----------------------------------------------------------------------------
// optimizer

double kiln_gpt_grad_norm(struct kiln_gpt *g) {
    KILN_ASSERT(g->grads);
    return sqrt(g->ops->sum_squares(g->ctx, g->grads, g->pt.total));
}

void kiln_gpt_adamw(struct kiln_gpt *g, const struct kiln_adamw_hparams *h, double grad_norm) {
    KILN_ASSERT(g->optim_elems == g->pt.total);
    kiln_gpt_adamw_spans(g, h, grad_norm, g->spans, g->n_spans);
}

static void adamw_over(struct kiln_gpt *g, const struct kiln_adamw_hparams *h, double grad_norm,
                       const struct kiln_param_span *spans, int n_spans, const void *grads, int compact);

void kiln_gpt_adamw_spans(struct kiln_gpt *g, const struct kiln_adamw_hparams *h, double grad_norm,
                          const struct kiln_param_span *spans, int n_spans) {
    KILN_ASSERT(g->grads && !g->opts.sharded_params);
    adamw_over(g, h, grad_norm, spans, n_spans, g->grads, 0);
}

void kiln_gpt_adamw_shard(struct kiln_gpt *g, const struct kiln_adamw_hparams *h, double grad_norm,
                          const struct kiln_param_span *spans, int n_spans, const void *grads) {
    adamw_over(g, h, grad_norm, spans, n_spans, grads, 1);
}

void kiln_adamw_args_from(const struct kiln_adamw_hparams *h, double grad_norm, struct kiln_adamw_args *a) {
    float scale = h->grad_scale;
    double norm = grad_norm * h->grad_scale;
    if (h->grad_clip > 0 && norm > h->grad_clip)
        scale *= (float)(h->grad_clip / norm);
    a->lr = h->lr;
    a->beta1 = h->beta1;
    a->beta2 = h->beta2;
    a->eps = h->eps;
    a->weight_decay = h->weight_decay;
    a->grad_scale = scale;
    a->step = h->step;
    a->stochastic_rounding = h->stochastic_rounding;
    a->seed = h->seed ^ ((uint64_t)h->step * 0x9E3779B97F4A7C15ULL);
}

static void adamw_over(struct kiln_gpt *g, const struct kiln_adamw_hparams *h, double grad_norm,
                       const struct kiln_param_span *spans, int n_spans, const void *grads, int compact) {
    KILN_ASSERT(!g->opts.offload_optimizer); // the data-parallel layer runs AdamW on the host
    struct kiln_adamw_args a = {.params = g->params,
                                .weights = g->weights == g->params ? NULL : g->weights,
                                .grads = grads,
                                .grads_compact = compact,
                                .params_compact = g->opts.sharded_params,
                                .m = g->m,
                                .v = g->v,
                                .spans = spans,
                                .n_spans = n_spans};
    kiln_adamw_args_from(h, grad_norm, &a);
    g->ops->adamw(g->ctx, &a);
}
