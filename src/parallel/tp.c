// Tensor parallelism: the plan, the gradient norm's weights, and the hooks. See tp.h.
#include "parallel/tp.h"

#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "parallel/comm/comm.h"

int kiln_tp_plan(int tp, int world, int rank, const struct kiln_model_config *m, struct kiln_tp_layout *out,
                 struct kiln_error *err) {
    memset(out, 0, sizeof(*out));
    tp = tp > 1 ? tp : 1;
    if (world % tp)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "--tp=%d (option): the world of %d ranks is not a multiple of it; start a multiple "
                           "of %d ranks",
                           tp, world, tp);
    out->tp = tp;
    out->tp_rank = rank % tp;
    out->cross = world / tp;
    out->cross_rank = rank / tp;
    if (tp == 1)
        return 0;
    out->split = (struct kiln_model_split){.heads = tp, .kv_heads = tp, .hidden = tp, .vocab = tp};
    struct kiln_error e = {0};
    if (kiln_model_split_check(m, &out->split, &e))
        return kiln_errorf(err, KILN_ERR_USAGE, "--tp=%d (option): %s", tp, e.msg);
    return 0;
}

// ---- the gradient norm's weights -------------------------------------------------------------------------

struct weights {
    struct kiln_norm_weight *w;
    int n, cap;
};

static void add_weight(struct weights *ws, size_t lo, size_t hi, double weight) {
    if (hi <= lo || weight == 1.0)
        return;
    if (ws->n && ws->w[ws->n - 1].hi == lo && ws->w[ws->n - 1].weight == weight) {
        ws->w[ws->n - 1].hi = hi;
        return;
    }
    if (ws->n == ws->cap) {
        ws->cap = ws->cap ? 2 * ws->cap : 16;
        ws->w = realloc(ws->w, (size_t)ws->cap * sizeof(*ws->w));
        KILN_ASSERT(ws->w);
    }
    ws->w[ws->n++] = (struct kiln_norm_weight){lo, hi, weight};
}

struct kiln_norm_weight *kiln_tp_norm_weights(const struct kiln_tp_layout *lo, const struct kiln_model_config *m,
                                              const struct kiln_param_table *local, int *n) {
    struct weights ws = {0};
    struct kiln_param_table whole;
    kiln_params_build(&whole, m);
    int NKV = kiln_model_kv_heads(m), HS = kiln_model_head_size(m);
    for (int i = 0; lo->tp > 1 && i < local->n; i++) {
        const struct kiln_param *p = &local->p[i];
        const struct kiln_param *w = &whole.p[kiln_params_find(&whole, p->name)];
        if (p->count == w->count) { // whole on every rank of the group
            add_weight(&ws, p->offset, p->offset + p->count, 1.0 / lo->tp);
            continue;
        }
        // c_attn with fewer key/value heads than ranks: its k and v rows are a copy shared by tp / NKV ranks
        int is_qkv = p->layer >= 0 && (local->layer[p->layer][KILN_QKV_W] == i || local->layer[p->layer][KILN_QKV_B] == i);
        if (is_qkv && NKV < lo->tp) {
            size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1;
            size_t q = (size_t)(m->n_head / lo->tp) * HS * cols;
            add_weight(&ws, p->offset + q, p->offset + p->count, (double)NKV / lo->tp);
        }
    }
    kiln_params_free(&whole);
    *n = ws.n;
    return ws.w;
}

// ---- the hooks ------------------------------------------------------------------------------------------

struct kiln_tp {
    struct kiln_tp_layout lo;
    struct kiln_comm *comm; // the tensor-parallel group
    struct kiln_comm *kv;   // the ranks that share a key/value head copy (NULL: no copies)
    struct kiln_backend *be;
    const struct kiln_model_config *m;
    struct kiln_model *g;
    struct kiln_model_linear next; // what was installed before (FP8's, or the backend's op)
    int v0, Vl;                    // the vocabulary rows this rank holds
    float *stats;                  // (3, rows) the vocabulary-parallel loss's per-row values (backend memory)
    size_t stats_rows;
    void *kv_dw, *kv_db; // a key/value copy's gradient before it is summed over its sharers (grad dtype)
    size_t kv_dw_n, kv_db_n;
    void *ev; // a compute-stream event (NULL on the CPU)
};

static void *after_compute(struct kiln_tp *t) {
    if (t->ev)
        t->be->ops->event_record(t->be->ctx, t->ev);
    return t->ev;
}

static void reduce(struct kiln_tp *t, struct kiln_comm *c, void *buf, size_t n, enum kiln_dtype dt,
                   enum kiln_red red) {
    struct kiln_coll k = {.op = KILN_COLL_ALL_REDUCE,
                          .send = buf,
                          .recv = buf,
                          .count = n,
                          .dtype = dt,
                          .red = red,
                          .device = t->be->device_memory};
    kiln_comm_wait_stream(c, kiln_comm_submit(c, &k, after_compute(t)));
}

static int column_parallel(enum kiln_linear k) {
    return k == KILN_LINEAR_QKV || k == KILN_LINEAR_MLP_IN || k == KILN_LINEAR_FUSED_IN;
}

static void tp_forward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_args *a) {
    struct kiln_tp *t = user;
    if (column_parallel(k) || k == KILN_LINEAR_HEAD) { // the head: the vocabulary hook's own local GEMM
        kiln_model_linear_forward_with(&t->next, t->be, l, k, a);
        return;
    }
    // row-parallel: this rank's partial sum over its input columns; rank 0 adds the bias and what out held
    // (accumulate), the others write theirs alone; the sum over the group is then the whole layer's
    KILN_ASSERT(a->act == KILN_ACT_NONE);
    struct kiln_matmul_args p = *a;
    if (t->lo.tp_rank != 0) {
        p.bias = NULL;
        p.accumulate = 0;
    }
    kiln_model_linear_forward_with(&t->next, t->be, l, k, &p);
    reduce(t, t->comm, a->out, (size_t)a->N * a->OC, t->be->act_dtype, KILN_RED_SUM);
}

// Adds n elements of src into dst (grad dtype), or copies them (assign)
static void grad_add(struct kiln_tp *t, void *dst, const void *src, size_t n, int assign) {
    const struct kiln_ops *o = t->be->ops;
    if (assign)
        o->copy(t->be->ctx, dst, src, n * kiln_dtype_bytes(t->be->grad_dtype));
    else if (t->be->grad_dtype == KILN_F32)
        o->accumulate_f32(t->be->ctx, dst, src, n);
    else {
        KILN_ASSERT(t->be->grad_dtype == t->be->act_dtype);
        o->add(t->be->ctx, dst, dst, src, n);
    }
}

// c_attn's backward where the key/value heads are copies: this micro-step's weight gradient goes to scratch,
// its k and v rows are summed over the copies' sharers, and the result accumulates as the model asked
static void qkv_backward_shared(struct kiln_tp *t, int l, const struct kiln_matmul_back_args *a,
                                const struct kiln_matmul_back_args *p) {
    struct kiln_matmul_back_args s = *p;
    size_t nw = (size_t)a->OC * a->IC, q = (size_t)(t->m->n_head / t->lo.tp) * kiln_model_head_size(t->m);
    KILN_ASSERT(nw <= t->kv_dw_n && (!a->dbias || (size_t)a->OC <= t->kv_db_n));
    s.dweight = t->kv_dw;
    s.dbias = a->dbias ? t->kv_db : NULL;
    s.grad_assign = 1;
    kiln_model_linear_backward_with(&t->next, t->be, l, KILN_LINEAR_QKV, &s);
    size_t gb = kiln_dtype_bytes(t->be->grad_dtype);
    reduce(t, t->kv, (char *)t->kv_dw + q * a->IC * gb, nw - q * a->IC, t->be->grad_dtype, KILN_RED_SUM);
    grad_add(t, a->dweight, t->kv_dw, nw, a->grad_assign);
    if (a->dbias) {
        reduce(t, t->kv, (char *)t->kv_db + q * gb, (size_t)a->OC - q, t->be->grad_dtype, KILN_RED_SUM);
        grad_add(t, a->dbias, t->kv_db, (size_t)a->OC, a->grad_assign);
    }
}

static void tp_backward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_back_args *a) {
    struct kiln_tp *t = user;
    struct kiln_matmul_back_args p = *a;
    int sum_dinp = column_parallel(k) && a->dinp;
    if (sum_dinp) {
        // this rank's output columns give a partial dL/dinput: as the forward's row-parallel sum
        KILN_ASSERT(!a->dinp_gelu_pre && (!a->dinp_stride || a->dinp_stride == a->IC));
        if (t->lo.tp_rank != 0)
            p.dinp_accumulate = 0;
    }
    if (t->kv && (k == KILN_LINEAR_QKV || k == KILN_LINEAR_FUSED_IN) && a->dweight) {
        KILN_ASSERT(k == KILN_LINEAR_QKV); // a parallel block's fused GEMM takes no key/value copies (tp_create)
        qkv_backward_shared(t, l, a, &p);
    } else {
        kiln_model_linear_backward_with(&t->next, t->be, l, k, &p);
    }
    if (sum_dinp)
        reduce(t, t->comm, a->dinp, (size_t)a->N * a->IC, t->be->act_dtype, KILN_RED_SUM);
}

// the embedding: this rank's vocabulary rows (others read zeros), positions on rank 0, summed over the group
static void tp_embed_forward(void *user, const struct kiln_embed_args *a) {
    struct kiln_tp *t = user;
    struct kiln_embed_args p = *a;
    p.vocab_lo = t->v0;
    p.vocab_n = t->Vl;
    if (t->lo.tp_rank != 0) {
        p.wpe = NULL;
        p.wpe_hi = NULL;
    }
    t->be->ops->embed_forward(t->be->ctx, &p);
    reduce(t, t->comm, a->out, (size_t)a->B * a->T * a->C, t->be->act_dtype, KILN_RED_SUM);
}

// dwte's rows this rank holds; dwpe whole (dout is whole on every rank: every rank's is the same)
static void tp_embed_backward(void *user, const struct kiln_embed_back_args *a) {
    struct kiln_tp *t = user;
    struct kiln_embed_back_args p = *a;
    p.vocab_lo = t->v0;
    p.vocab_n = t->Vl;
    t->be->ops->embed_backward(t->be->ctx, &p);
}

static void xent_phase(struct kiln_tp *t, const struct kiln_model_head_args *h, int phase) {
    struct kiln_xent_par_args x = {.logits = h->logits,
                                   .losses = h->losses,
                                   .targets = h->targets,
                                   .stats = t->stats,
                                   .N = h->rows,
                                   .Vl = h->Vp,
                                   .v0 = t->v0,
                                   .V = h->V,
                                   .phase = phase,
                                   .dloss = h->dloss,
                                   .z_loss = h->z_loss};
    t->be->ops->cross_entropy_parallel(t->be->ctx, &x);
}

// The vocabulary-parallel LM head and loss: local logits, the row statistics reduced over the group, this
// rank's dlogits, and dx summed over the group
static void tp_head(void *user, const struct kiln_model_head_args *h) {
    struct kiln_tp *t = user;
    size_t R = (size_t)h->rows;
    KILN_ASSERT(R <= t->stats_rows);
    struct kiln_matmul_args mf = {
        .out = h->logits, .inp = h->x, .weight = h->weight, .N = h->rows, .IC = h->C, .OC = h->Vp};
    kiln_model_linear_forward_with(&t->next, t->be, -1, KILN_LINEAR_HEAD, &mf);
    xent_phase(t, h, 0);
    reduce(t, t->comm, t->stats, R, KILN_F32, KILN_RED_MAX);
    reduce(t, t->comm, t->stats + 2 * R, R, KILN_F32, KILN_RED_SUM);
    xent_phase(t, h, 1);
    reduce(t, t->comm, t->stats + R, R, KILN_F32, KILN_RED_SUM);
    xent_phase(t, h, 2);
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
    kiln_model_linear_backward_with(&t->next, t->be, -1, KILN_LINEAR_HEAD, &mb);
    reduce(t, t->comm, h->dx, R * h->C, t->be->act_dtype, KILN_RED_SUM);
}

int kiln_tp_create(struct kiln_tp **out, const struct kiln_tp_layout *lo, struct kiln_comm *world,
                   struct kiln_backend *be, const struct kiln_model_config *m, int B, int T,
                   struct kiln_comm **cross, struct kiln_error *err) {
    *out = NULL;
    *cross = NULL;
    int rc;
    if (lo->tp == 1) { // everything runs over the world itself
        *cross = world;
        return 0;
    }
    struct kiln_tp *t = kiln_xcalloc(1, sizeof(*t));
    t->lo = *lo;
    t->be = be;
    t->m = m;
    // the group (consecutive ranks), then the cross communicator of each tp_rank (collective over world, in
    // the same order on every rank)
    if ((rc = kiln_comm_split(world, lo->cross_rank, lo->tp_rank, &t->comm, err)) ||
        (rc = kiln_comm_split(world, lo->tp_rank, lo->cross_rank, cross, err))) {
        kiln_tp_free(t);
        return rc;
    }
    int NKV = kiln_model_kv_heads(m);
    if (NKV < lo->tp) { // the ranks that hold a copy of the same key/value head
        if ((rc = kiln_comm_split(t->comm, lo->tp_rank * NKV / lo->tp, lo->tp_rank, &t->kv, err))) {
            kiln_tp_free(t);
            return rc;
        }
        if (m->parallel_block) {
            kiln_tp_free(t);
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "--tp=%d with --kv-heads=%d and --block=parallel: a parallel block's fused "
                               "input GEMM cannot hold key/value head copies; use at least %d kv heads",
                               lo->tp, NKV, lo->tp);
        }
        struct kiln_param_table pt;
        kiln_params_build_split(&pt, m, &lo->split);
        int qw = pt.layer[0][KILN_QKV_W], qb = pt.layer[0][KILN_QKV_B];
        t->kv_dw_n = pt.p[qw].count;
        t->kv_db_n = qb >= 0 ? pt.p[qb].count : 0;
        kiln_params_free(&pt);
        t->kv_dw = be->ops->alloc(be->ctx, t->kv_dw_n * kiln_dtype_bytes(be->grad_dtype));
        t->kv_db = be->ops->alloc(be->ctx, (t->kv_db_n + 1) * kiln_dtype_bytes(be->grad_dtype));
    }
    size_t lo_v, hi_v;
    kiln_comm_slice((size_t)kiln_model_padded_vocab(m), lo->tp, lo->tp_rank, &lo_v, &hi_v);
    t->v0 = (int)lo_v;
    t->Vl = (int)(hi_v - lo_v);
    t->stats_rows = (size_t)B * T;
    t->stats = be->ops->alloc(be->ctx, 3 * t->stats_rows * sizeof(float));
    if (!t->stats || (t->kv && (!t->kv_dw || !t->kv_db))) {
        kiln_tp_free(t);
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "out of memory for tensor parallelism's buffers (%s): a smaller --batch or --seq",
                           be->device_name);
    }
    if (be->ops->event_create)
        t->ev = be->ops->event_create(be->ctx);
    *out = t;
    return 0;
}

void kiln_tp_attach(struct kiln_tp *t, struct kiln_model *g) {
    if (!t)
        return;
    t->g = g;
    struct kiln_model_linear lin = {.user = t, .forward = tp_forward, .backward = tp_backward};
    kiln_model_set_linear(g, &lin, &t->next);
    struct kiln_model_vocab voc = {
        .user = t, .embed_forward = tp_embed_forward, .embed_backward = tp_embed_backward, .head = tp_head};
    kiln_model_set_vocab(g, &voc, NULL);
}

struct gather_runs {
    float *whole;
    const float *part;
};

static void gather_run(void *user, size_t local_at, size_t whole_at, size_t n) {
    struct gather_runs *c = user;
    memcpy(c->whole + whole_at, c->part + local_at, n * sizeof(float));
}

void kiln_tp_gather_whole(struct kiln_tp *t, const struct kiln_param_table *local, const float *part,
                          const struct kiln_param_table *whole, float *out) {
    size_t n = local->total;
    float *all = kiln_xmalloc(n * (size_t)t->lo.tp * sizeof(float));
    kiln_comm_all_gather_host(t->comm, part, all, n * sizeof(float));
    if (t->lo.tp_rank == 0) {
        memset(out, 0, whole->total * sizeof(float));
        for (int r = 0; r < t->lo.tp; r++)
            for (int i = 0; i < local->n; i++) {
                const struct kiln_param *w = &whole->p[kiln_params_find(whole, local->p[i].name)];
                struct gather_runs c = {out + w->offset, all + (size_t)r * n + local->p[i].offset};
                kiln_params_split_runs(t->m, &t->lo.split, r, local, i, gather_run, &c);
            }
    }
    free(all);
}

struct kiln_comm *kiln_tp_comm(const struct kiln_tp *t) {
    return t ? t->comm : NULL;
}

void kiln_tp_free(struct kiln_tp *t) {
    if (!t)
        return;
    const struct kiln_ops *o = t->be->ops;
    if (t->stats)
        o->free(t->be->ctx, t->stats);
    if (t->kv_dw)
        o->free(t->be->ctx, t->kv_dw);
    if (t->kv_db)
        o->free(t->be->ctx, t->kv_db);
    if (t->ev)
        o->event_destroy(t->be->ctx, t->ev);
    kiln_comm_close(t->kv);
    kiln_comm_close(t->comm);
    free(t);
}
