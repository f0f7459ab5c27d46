// Tensor parallelism: the plan, the gradient norm's weights, and the hooks. See tp.h.
#include "parallel/tp.h"

#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "parallel/comm/comm.h"

int kiln_tp_plan(int tp, int seq, int world, int rank, const struct kiln_model_config *m,
                 struct kiln_tp_layout *out, struct kiln_error *err) {
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
    out->split = kiln_split_tensor_parallel(tp, seq);
    kiln_tp_plan_overlap(out, KILN_TP_OVERLAP_OFF, 0);
    struct kiln_error e = {0};
    if (kiln_model_split_check(m, &out->split, &e))
        return kiln_errorf(err, KILN_ERR_USAGE, "--tp=%d (option): %s", tp, e.msg);
    return 0;
}

void kiln_tp_plan_overlap(struct kiln_tp_layout *lo, enum kiln_tp_overlap overlap, int keep_gathered) {
    lo->overlap = kiln_split_parts(lo->split.seq) > 1 ? overlap : KILN_TP_OVERLAP_OFF;
    lo->keep_gathered =
        kiln_split_parts(lo->split.seq) > 1 && lo->overlap != KILN_TP_OVERLAP_RING && keep_gathered;
}

// column-parallel inputs kept a layer under --tp-keep-gathered: qkv's (or a parallel block's fused [qkv |
// fc]) and the MLP's (a parallel block runs its two GEMMs apart where the model does not fuse them)
#define KEEP_SLOTS 2

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

struct kiln_norm_weight *kiln_tp_sum_ranges(const struct kiln_tp_layout *lo, const struct kiln_model_config *m,
                                            const struct kiln_param_table *local, int *n) {
    struct weights ws = {0};
    struct kiln_param_table whole;
    kiln_params_build(&whole, m);
    for (int i = 0; lo->split.seq > 1 && i < local->n; i++) {
        const struct kiln_param *p = &local->p[i];
        const struct kiln_param *w = &whole.p[kiln_params_find(&whole, p->name)];
        // whole on every rank and fed by this rank's rows alone: the norms and the row-parallel biases (the
        // position table's gradient comes from every row's, gathered, on every rank)
        if (p->count == w->count && i != local->wpe)
            add_weight(&ws, p->offset, p->offset + p->count, 0.5);
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
    // Megatron's sequence parallelism (split.seq): the step's N token rows, this rank's Nr of them, and two
    // act (N, C) buffers: an input gathered from every rank's rows, and a partial output before its
    // reduce-scatter; the LM head's gathered targets and losses (N each). Under --tp-overlap=ring (ring set)
    // the two buffers are 2 tp chunk slots of (Nr, C) for the ring's transfers and partial sums (slot()).
    int seq, ring, bulk; // bulk: --tp-overlap=bulk (column_backward_bulk)
    size_t N, Nr, C;
    void *gath, *part;
    void *gath_win; // gath, where it is the group's symmetric window (lo.copy_engine)
    // lo.keep_gathered: (N, C) a layer and column-parallel layer (keep_at), and which a forward has filled
    // (each forward refills its own before the backward reads it)
    void *keep;
    unsigned char *kept;
    int32_t *tgt;
    float *loss;
};

static void *after_compute(struct kiln_tp *t) {
    if (t->ev)
        t->be->ops->event_record(t->be->ctx, t->ev);
    return t->ev;
}

static size_t act_bytes(const struct kiln_tp *t) {
    return kiln_dtype_bytes(t->be->act_dtype);
}

static char *act_at(const struct kiln_tp *t, const void *base, size_t elems) {
    return (char *)base + elems * act_bytes(t);
}

// dst (rows x tp, w) = every rank's rows (rows, w) of x, in rank order
static struct kiln_comm_work *gather_rows_into(struct kiln_tp *t, void *dst, const void *x, size_t rows,
                                               size_t w) {
    struct kiln_coll k = {.op = KILN_COLL_ALL_GATHER,
                          .send = x,
                          .recv = dst,
                          .count = rows * w * t->lo.tp,
                          .dtype = t->be->act_dtype,
                          .device = t->be->device_memory};
    return kiln_comm_submit(t->comm, &k, after_compute(t));
}

// ... into gath
static struct kiln_comm_work *gather_rows_issue(struct kiln_tp *t, const void *x, size_t rows, size_t w) {
    return gather_rows_into(t, t->gath, x, rows, w);
}

static void gather_rows(struct kiln_tp *t, const void *x, size_t rows, size_t w) {
    kiln_comm_wait_stream(t->comm, gather_rows_issue(t, x, rows, w));
}

// --tp-keep-gathered: where layer l's column-parallel layer k keeps its gathered input (NULL: not kept)
static int keep_index(int l, enum kiln_linear k) {
    return l * KEEP_SLOTS + (k == KILN_LINEAR_MLP_IN);
}
static void *keep_at(const struct kiln_tp *t, int l, enum kiln_linear k) {
    return t->keep ? act_at(t, t->keep, (size_t)keep_index(l, k) * t->N * t->C) : NULL;
}
// the backward's: the forward's gathered input of layer l's k (it ran this micro-step, or its recompute
// did: the same rows), NULL without --tp-keep-gathered
static void *kept_input(const struct kiln_tp *t, int l, enum kiln_linear k) {
    if (!t->keep)
        return NULL;
    KILN_ASSERT(t->kept[keep_index(l, k)]); // (a backward without its forward)
    return keep_at(t, l, k);
}

// out (rows, w) = (or +=, accumulate) this rank's rows of the sum over the ranks of part (rows x tp, w)
static void scatter_rows(struct kiln_tp *t, void *out, size_t rows, size_t w, int accumulate) {
    size_t n = rows * w;
    void *mine = act_at(t, t->part, n * t->lo.tp_rank);
    struct kiln_coll k = {.op = KILN_COLL_REDUCE_SCATTER,
                          .send = t->part,
                          .recv = accumulate ? mine : out,
                          .count = n * t->lo.tp,
                          .dtype = t->be->act_dtype,
                          .red = KILN_RED_SUM,
                          .device = t->be->device_memory};
    kiln_comm_wait_stream(t->comm, kiln_comm_submit(t->comm, &k, after_compute(t)));
    if (accumulate)
        t->be->ops->add(t->be->ctx, out, out, mine, n);
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

// ---- --tp-overlap=ring: the sequence split's collectives folded into the GEMMs, a chunk at a time (tp.h) --

// Chunk slot i (Nr, C) of the 2 tp that the two sequence buffers hold
static void *slot(const struct kiln_tp *t, int i) {
    KILN_ASSERT(i >= 0 && i < 2 * t->lo.tp);
    size_t n = t->Nr * t->C;
    return i < t->lo.tp ? act_at(t, t->gath, n * i) : act_at(t, t->part, n * (i - t->lo.tp));
}

// Slots that the chunks a ring sends take turns in: two (one in flight while the GEMM reads or writes the
// other), one where the ring has a single transfer (tp 2). What a ring receives needs one slot: it is read
// before the next transfer is issued.
static int turns(const struct kiln_tp *t) {
    return t->lo.tp > 2 ? 2 : 1;
}

// The first row of the chunk a ring serves at step s: rank me + s's rows
static size_t chunk_row(const struct kiln_tp *t, int s) {
    return (size_t)((t->lo.tp_rank + s) % t->lo.tp) * t->Nr;
}

// One step around the ring: send (Nr, w) to rank me - 1 while (Nr, w) arrives from rank me + 1, once the
// compute stream has done all it was given so far (what send holds, and the last read of recv)
static struct kiln_comm_work *ring_pass(struct kiln_tp *t, const void *send, void *recv, size_t w) {
    int n = t->lo.tp, me = t->lo.tp_rank;
    struct kiln_coll k = {.op = KILN_COLL_SEND_RECV,
                          .send = send,
                          .recv = recv,
                          .count = t->Nr * w,
                          .dtype = t->be->act_dtype,
                          .peer = (me + n - 1) % n,
                          .src = (me + 1) % n,
                          .device = t->be->device_memory};
    return kiln_comm_submit(t->comm, &k, after_compute(t));
}

// Column-parallel forward: out's rows of rank me + s from its input rows, which step s - 1's transfer
// brought, while step s's brings rank me + s + 1's into the other gather slot (the all-gather, under the
// GEMMs)
static void column_forward_ring(struct kiln_tp *t, int l, enum kiln_linear k,
                                const struct kiln_matmul_args *a) {
    int n = t->lo.tp, g = turns(t);
    size_t IC = (size_t)a->IC, OC = (size_t)a->OC;
    const void *held = a->inp; // (Nr, IC) input rows of rank me + s
    struct kiln_comm_work *w = NULL;
    for (int s = 0; s < n; s++) {
        kiln_comm_wait_stream(t->comm, w); // (the rows held now)
        void *next = slot(t, s % g);
        w = s + 1 < n ? ring_pass(t, held, next, IC) : NULL;
        size_t r0 = chunk_row(t, s);
        struct kiln_matmul_args p = *a;
        p.inp = held;
        p.N = (int)t->Nr;
        p.rows_part = 1;
        p.out = act_at(t, a->out, r0 * OC);
        p.pre = a->pre ? act_at(t, a->pre, r0 * OC) : NULL;
        kiln_model_linear_forward_with(&t->next, t->be, l, k, &p);
        held = next;
    }
}

// Row-parallel forward (p: the layer with the bias on rank 0 alone): at step s the partial output of rank
// me + s + 1's rows, plus the partial sum for them received at step s - 1, goes on to rank me - 1; the last
// step's rows are this rank's own, written into out (=, or += with accumulate), and the other ranks' sum
// arrives to be added (the reduce-scatter, under the GEMMs)
static void row_forward_ring(struct kiln_tp *t, int l, enum kiln_linear k, const struct kiln_matmul_args *a,
                             const struct kiln_matmul_args *p) {
    int n = t->lo.tp, g = turns(t);
    size_t IC = (size_t)a->IC, OC = (size_t)a->OC, Nr = t->Nr;
    struct kiln_comm_work *w = NULL;
    void *got = NULL; // (Nr, OC) the partial sum received at the previous step
    for (int s = 0; s < n; s++) {
        int own = s == n - 1;
        struct kiln_matmul_args q = *p;
        q.inp = act_at(t, a->inp, chunk_row(t, s + 1) * IC);
        q.N = (int)Nr;
        q.rows_part = 1;
        q.out = own ? a->out : slot(t, s % g);
        q.accumulate = own ? a->accumulate : 0;
        kiln_model_linear_forward_with(&t->next, t->be, l, k, &q);
        kiln_comm_wait_stream(t->comm, w);
        if (got)
            t->be->ops->add(t->be->ctx, q.out, q.out, got, Nr * OC);
        if (!own) {
            got = slot(t, g);
            w = ring_pass(t, q.out, got, OC);
        }
    }
}

// Column-parallel backward (p: the layer as the caller wants its gradients): at step s the rows of rank
// me + s give dW (assigned on the first step as the caller asked, added after) from the input rows gathered
// around the ring, and a part of dL/dinput for those rows: this rank's own into dinp at step 0; from step 1,
// rank me + s's, plus the sum received for them, sent on to rank me - 1; the other ranks' sum of this rank's
// rows arrives after the last step and is added to dinp
static void column_backward_ring(struct kiln_tp *t, int l, enum kiln_linear k,
                                 const struct kiln_matmul_back_args *p) {
    int n = t->lo.tp, g = turns(t);
    size_t IC = (size_t)p->IC, OC = (size_t)p->OC, Nr = t->Nr;
    const void *held = p->inp; // (Nr, IC) input rows of rank me + s
    void *got = NULL;          // (Nr, IC) the partial dL/dinput received at the previous step
    struct kiln_comm_work *wi = NULL, *wd = NULL; // the input's transfer, dL/dinput's
    for (int s = 0; s < n; s++) {
        kiln_comm_wait_stream(t->comm, wi);
        void *next = slot(t, s % g);
        wi = s + 1 < n ? ring_pass(t, held, next, IC) : NULL;
        struct kiln_matmul_back_args q = *p;
        q.inp = held;
        q.dout = act_at(t, p->dout, chunk_row(t, s) * OC);
        q.N = (int)Nr;
        q.rows_part = 1;
        q.grad_assign = p->grad_assign && s == 0;
        if (p->dinp && s > 0) {
            q.dinp = slot(t, g + (s - 1) % g);
            q.dinp_accumulate = 0;
        }
        kiln_model_linear_backward_with(&t->next, t->be, l, k, &q);
        if (p->dinp && s > 0) {
            kiln_comm_wait_stream(t->comm, wd);
            if (got)
                t->be->ops->add(t->be->ctx, q.dinp, q.dinp, got, Nr * IC);
            got = slot(t, 2 * g);
            wd = ring_pass(t, q.dinp, got, IC);
        }
        held = next;
    }
    if (p->dinp) {
        kiln_comm_wait_stream(t->comm, wd);
        t->be->ops->add(t->be->ctx, p->dinp, p->dinp, got, Nr * IC);
    }
}

// Row-parallel backward: at step s the rows of rank me + s, their dL/doutput brought by step s - 1's
// transfer, give their rows of dL/dinput and a chunk of dW (assigned on the first step as the caller asked)
static void row_backward_ring(struct kiln_tp *t, int l, enum kiln_linear k,
                              const struct kiln_matmul_back_args *a) {
    int n = t->lo.tp, g = turns(t);
    size_t IC = (size_t)a->IC, OC = (size_t)a->OC;
    size_t ldi = a->dinp_stride ? (size_t)a->dinp_stride : IC;
    size_t ldp = a->gelu_pre_stride ? (size_t)a->gelu_pre_stride : IC;
    const void *held = a->dout; // (Nr, OC) dL/doutput of rank me + s's rows
    struct kiln_comm_work *w = NULL;
    for (int s = 0; s < n; s++) {
        kiln_comm_wait_stream(t->comm, w);
        void *next = slot(t, s % g);
        w = s + 1 < n ? ring_pass(t, held, next, OC) : NULL;
        size_t r0 = chunk_row(t, s);
        struct kiln_matmul_back_args q = *a;
        q.dout = held;
        q.inp = act_at(t, a->inp, r0 * IC);
        q.dinp = a->dinp ? act_at(t, a->dinp, r0 * ldi) : NULL;
        q.dinp_gelu_pre = a->dinp_gelu_pre ? act_at(t, a->dinp_gelu_pre, r0 * ldp) : NULL;
        q.N = (int)t->Nr;
        q.rows_part = 1;
        q.grad_assign = a->grad_assign && s == 0;
        kiln_model_linear_backward_with(&t->next, t->be, l, k, &q);
        held = next;
    }
}

// The row blocks a split GEMM runs in turn: this rank's own (from its own rows, mine, while the all-gather
// goes on), then those before and after it (from the gathered rows, w wide, once the gather is awaited)
struct row_block {
    size_t r0, rows;
    const void *src;
};
static void row_blocks(const struct kiln_tp *t, const void *mine, const void *gathered, size_t w,
                       struct row_block b[3]) {
    size_t Nr = t->Nr, me = (size_t)t->lo.tp_rank, n = (size_t)t->lo.tp;
    b[0] = (struct row_block){me * Nr, Nr, mine};
    b[1] = (struct row_block){0, me * Nr, gathered};
    b[2] = (struct row_block){(me + 1) * Nr, (n - 1 - me) * Nr, act_at(t, gathered, (me + 1) * Nr * w)};
}

// --tp-overlap=bulk, a column-parallel layer's forward under the sequence split: the input's all-gather is
// issued first, the GEMM of the rank's own rows (from its own input) runs under it, then one GEMM on the rows
// before them and one on the rows after, from the gathered input. Each output row is the same product as
// the GEMM on every row gives on the CPU (GPUs may take other algorithms for the smaller GEMMs).
static void column_forward_split(struct kiln_tp *t, int l, enum kiln_linear k,
                                 const struct kiln_matmul_args *a, void *dst) {
    size_t IC = (size_t)a->IC, OC = (size_t)a->OC;
    struct kiln_comm_work *wg = gather_rows_into(t, dst, a->inp, t->Nr, IC);
    struct row_block b[3];
    row_blocks(t, a->inp, dst, IC, b);
    for (int i = 0; i < 3; i++) {
        if (i == 1)
            kiln_comm_wait_stream(t->comm, wg);
        if (!b[i].rows)
            continue;
        struct kiln_matmul_args p = *a;
        p.inp = b[i].src;
        p.N = (int)b[i].rows;
        p.out = act_at(t, a->out, b[i].r0 * OC);
        p.pre = a->pre ? act_at(t, a->pre, b[i].r0 * OC) : NULL;
        p.rows_part = 1;
        kiln_model_linear_forward_with(&t->next, t->be, l, k, &p);
    }
}

static void tp_forward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_args *a) {
    struct kiln_tp *t = user;
    if (k == KILN_LINEAR_HEAD) { // the vocabulary hook's own local GEMM
        kiln_model_linear_forward_with(&t->next, t->be, l, k, a);
        return;
    }
    struct kiln_matmul_args p = *a;
    if (column_parallel(k)) { // under a sequence split, on the rows of every rank
        if (t->seq) {
            KILN_ASSERT((size_t)a->N == t->N && (size_t)a->IC <= t->C);
            if (t->ring) {
                column_forward_ring(t, l, k, a);
                return;
            }
            void *dst = t->keep ? keep_at(t, l, k) : t->gath;
            if (t->keep)
                t->kept[keep_index(l, k)] = 1;
            if (t->bulk) {
                column_forward_split(t, l, k, a, dst);
                return;
            }
            kiln_comm_wait_stream(t->comm, gather_rows_into(t, dst, a->inp, t->Nr, (size_t)a->IC));
            p.inp = dst;
        }
        kiln_model_linear_forward_with(&t->next, t->be, l, k, &p);
        return;
    }
    // row-parallel: this rank's partial sum over its input columns; rank 0 adds the bias (and, without a
    // sequence split, what out held); the sum over the group is the whole layer's, reduce-scattered to each
    // rank's rows under a sequence split
    KILN_ASSERT(a->act == KILN_ACT_NONE);
    if (t->lo.tp_rank != 0)
        p.bias = NULL;
    if (t->seq) {
        KILN_ASSERT((size_t)a->N == t->N && (size_t)a->OC <= t->C);
        if (t->ring) {
            row_forward_ring(t, l, k, a, &p);
            return;
        }
        p.out = t->part;
        p.accumulate = 0;
        kiln_model_linear_forward_with(&t->next, t->be, l, k, &p);
        scatter_rows(t, a->out, t->Nr, (size_t)a->OC, a->accumulate);
        return;
    }
    if (t->lo.tp_rank != 0)
        p.accumulate = 0;
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
// its k and v rows are summed over the copies' sharers, and the result accumulates as the model asked.
// The GEMMs run as p says, or (ring) around the ring from the model's args p.
static void qkv_backward_shared(struct kiln_tp *t, int l, const struct kiln_matmul_back_args *a,
                                const struct kiln_matmul_back_args *p, int ring) {
    struct kiln_matmul_back_args s = *p;
    size_t nw = (size_t)a->OC * a->IC, q = (size_t)(t->m->n_head / t->lo.tp) * kiln_model_head_size(t->m);
    KILN_ASSERT(nw <= t->kv_dw_n && (!a->dbias || (size_t)a->OC <= t->kv_db_n));
    s.dweight = t->kv_dw;
    s.dbias = a->dbias ? t->kv_db : NULL;
    s.grad_assign = 1;
    if (ring)
        column_backward_ring(t, l, KILN_LINEAR_QKV, &s);
    else
        kiln_model_linear_backward_with(&t->next, t->be, l, KILN_LINEAR_QKV, &s);
    size_t gb = kiln_dtype_bytes(t->be->grad_dtype);
    reduce(t, t->kv, (char *)t->kv_dw + q * a->IC * gb, nw - q * a->IC, t->be->grad_dtype, KILN_RED_SUM);
    grad_add(t, a->dweight, t->kv_dw, nw, a->grad_assign);
    if (a->dbias) {
        reduce(t, t->kv, (char *)t->kv_db + q * gb, (size_t)a->OC - q, t->be->grad_dtype, KILN_RED_SUM);
        grad_add(t, a->dbias, t->kv_db, (size_t)a->OC, a->grad_assign);
    }
}

// --tp-overlap=bulk: a column-parallel layer's backward under the sequence split (a: the model's args, every
// row). The input's all-gather is issued first and runs under the dinp GEMM, which does not read it; dinp's
// reduce-scatter is issued after that GEMM and runs under the dW GEMM, which reads the gathered input. The
// same GEMMs and collectives as the synchronous order, in another order in time: the same sums.
static void column_backward_bulk(struct kiln_tp *t, int l, enum kiln_linear k,
                                 const struct kiln_matmul_back_args *a) {
    size_t IC = (size_t)a->IC, n = t->Nr * IC;
    void *kept = kept_input(t, l, k); // (kept from the forward: no all-gather)
    struct kiln_comm_work *wg = kept ? NULL : gather_rows_issue(t, a->inp, t->Nr, IC);
    const void *gathered = kept ? kept : t->gath;
    struct kiln_matmul_back_args d = *a; // dL/dinput of every row, the partial sum of this rank's columns
    d.inp = gathered;                    // (not read without dweight)
    d.dinp = t->part;
    d.dinp_accumulate = 0;
    d.dweight = NULL;
    d.dbias = NULL;
    kiln_model_linear_backward_with(&t->next, t->be, l, k, &d);
    void *mine = act_at(t, t->part, n * t->lo.tp_rank);
    struct kiln_coll rs = {.op = KILN_COLL_REDUCE_SCATTER,
                           .send = t->part,
                           .recv = a->dinp_accumulate ? mine : a->dinp,
                           .count = n * t->lo.tp,
                           .dtype = t->be->act_dtype,
                           .red = KILN_RED_SUM,
                           .device = t->be->device_memory};
    struct kiln_comm_work *wr = kiln_comm_submit(t->comm, &rs, after_compute(t));
    kiln_comm_wait_stream(t->comm, wg);
    struct kiln_matmul_back_args w = *a; // dW (and dbias) from the gathered input
    w.inp = gathered;
    w.dinp = NULL;
    kiln_model_linear_backward_with(&t->next, t->be, l, k, &w);
    kiln_comm_wait_stream(t->comm, wr);
    if (a->dinp_accumulate)
        t->be->ops->add(t->be->ctx, a->dinp, a->dinp, mine, n);
}

// --tp-overlap=bulk, a row-parallel layer's backward under the sequence split: dL/doutput's all-gather is
// issued first, the dinp GEMM of the rank's own rows (from its own dL/doutput rows) runs under it, then the
// rows before and after, and dW from every row, as off computes it: the same products.
static void row_backward_split(struct kiln_tp *t, int l, enum kiln_linear k,
                               const struct kiln_matmul_back_args *a) {
    size_t IC = (size_t)a->IC, OC = (size_t)a->OC;
    size_t ldi = a->dinp_stride ? (size_t)a->dinp_stride : IC;
    size_t ldp = a->gelu_pre_stride ? (size_t)a->gelu_pre_stride : IC;
    struct kiln_comm_work *wg = gather_rows_issue(t, a->dout, t->Nr, OC);
    struct row_block b[3];
    row_blocks(t, a->dout, t->gath, OC, b);
    for (int i = 0; i < 3; i++) {
        if (i == 1)
            kiln_comm_wait_stream(t->comm, wg);
        if (!b[i].rows)
            continue;
        struct kiln_matmul_back_args d = *a; // dinp of these rows alone
        d.dout = b[i].src;
        d.inp = act_at(t, a->inp, b[i].r0 * IC); // (not read without dweight)
        d.N = (int)b[i].rows;
        d.dinp = act_at(t, a->dinp, b[i].r0 * ldi);
        d.dinp_gelu_pre = a->dinp_gelu_pre ? act_at(t, a->dinp_gelu_pre, b[i].r0 * ldp) : NULL;
        d.dweight = NULL;
        d.dbias = NULL;
        d.rows_part = 1;
        kiln_model_linear_backward_with(&t->next, t->be, l, k, &d);
    }
    struct kiln_matmul_back_args w = *a; // dW (and dbias) from every row
    w.dout = t->gath;
    w.dinp = NULL;
    kiln_model_linear_backward_with(&t->next, t->be, l, k, &w);
}

static void tp_backward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_back_args *a) {
    struct kiln_tp *t = user;
    struct kiln_matmul_back_args p = *a;
    int sum_dinp = column_parallel(k) && a->dinp;
    if (t->ring && k != KILN_LINEAR_HEAD) { // each collective chunk by chunk under the GEMMs
        KILN_ASSERT((size_t)a->N == t->N);
        if (!column_parallel(k)) {
            KILN_ASSERT((size_t)a->OC <= t->C);
            row_backward_ring(t, l, k, a);
        } else {
            KILN_ASSERT((size_t)a->IC <= t->C && !a->dinp_gelu_pre &&
                        (!a->dinp_stride || a->dinp_stride == a->IC));
            if (t->kv && (k == KILN_LINEAR_QKV || k == KILN_LINEAR_FUSED_IN) && a->dweight) {
                KILN_ASSERT(k == KILN_LINEAR_QKV); // (as below)
                qkv_backward_shared(t, l, a, a, 1);
            } else {
                column_backward_ring(t, l, k, a);
            }
        }
        return;
    }
    if (t->seq && k != KILN_LINEAR_HEAD) {
        KILN_ASSERT((size_t)a->N == t->N);
        if (column_parallel(k) && t->bulk && a->dinp && a->dweight &&
            !(t->kv && (k == KILN_LINEAR_QKV || k == KILN_LINEAR_FUSED_IN))) {
            KILN_ASSERT((size_t)a->IC <= t->C && !a->dinp_gelu_pre && (!a->dinp_stride || a->dinp_stride == a->IC));
            column_backward_bulk(t, l, k, a);
            return;
        }
        if (column_parallel(k)) { // the input as the forward saw it, and dL/dinput reduce-scattered below
            KILN_ASSERT((size_t)a->IC <= t->C && !a->dinp_gelu_pre && (!a->dinp_stride || a->dinp_stride == a->IC));
            void *kept = kept_input(t, l, k);
            if (!kept)
                gather_rows(t, a->inp, t->Nr, (size_t)a->IC);
            p.inp = kept ? kept : t->gath;
            p.dinp = a->dinp ? t->part : NULL;
            p.dinp_accumulate = 0;
        } else if (t->bulk && a->dinp) {
            KILN_ASSERT((size_t)a->OC <= t->C);
            row_backward_split(t, l, k, a);
            return;
        } else { // row-parallel: dL/doutput of every rank's rows
            KILN_ASSERT((size_t)a->OC <= t->C);
            gather_rows(t, a->dout, t->Nr, (size_t)a->OC);
            p.dout = t->gath;
        }
    } else if (sum_dinp) {
        // this rank's output columns give a partial dL/dinput: as the forward's row-parallel sum
        KILN_ASSERT(!a->dinp_gelu_pre && (!a->dinp_stride || a->dinp_stride == a->IC));
        if (t->lo.tp_rank != 0)
            p.dinp_accumulate = 0;
    }
    if (t->kv && (k == KILN_LINEAR_QKV || k == KILN_LINEAR_FUSED_IN) && a->dweight) {
        KILN_ASSERT(k == KILN_LINEAR_QKV); // a parallel block's fused GEMM takes no key/value copies (tp_create)
        qkv_backward_shared(t, l, a, &p, 0);
    } else {
        kiln_model_linear_backward_with(&t->next, t->be, l, k, &p);
    }
    if (sum_dinp && t->seq)
        scatter_rows(t, a->dinp, t->Nr, (size_t)a->IC, a->dinp_accumulate);
    else if (sum_dinp)
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
    if (t->seq) { // every row's partial embedding, reduce-scattered to this rank's rows
        p.out = t->part;
        t->be->ops->embed_forward(t->be->ctx, &p);
        scatter_rows(t, a->out, t->Nr, (size_t)a->C, 0);
        return;
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
    if (t->seq) { // the gradient of every rank's rows
        gather_rows(t, a->dout, t->Nr, (size_t)a->C);
        p.dout = t->gath;
    }
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
static void tp_head(void *user, const struct kiln_model_head_args *h0) {
    struct kiln_tp *t = user;
    struct kiln_model_head_args hs = *h0, *h = &hs;
    size_t rows = (size_t)h0->rows;
    if (t->seq) { // every part's chunk at once: their rows gathered, their targets and losses side by side
        KILN_ASSERT((size_t)h0->parts_stride == t->Nr);
        gather_rows(t, h0->x, rows, (size_t)h0->C);
        t->be->ops->copy_2d(t->be->ctx, t->tgt, rows * sizeof(int32_t), h0->targets, t->Nr * sizeof(int32_t),
                            rows * sizeof(int32_t), (size_t)t->lo.tp);
        hs.x = t->gath;
        hs.rows = (int)(rows * t->lo.tp);
        hs.targets = t->tgt;
        hs.losses = t->loss;
        hs.dx = h0->dx ? t->part : NULL;
    }
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
    if (t->seq)
        t->be->ops->copy_2d(t->be->ctx, h0->losses, t->Nr * sizeof(float), t->loss, rows * sizeof(float),
                            rows * sizeof(float), (size_t)t->lo.tp);
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
    if (t->seq)
        scatter_rows(t, h0->dx, rows, (size_t)h->C, 0);
    else
        reduce(t, t->comm, h->dx, R * h->C, t->be->act_dtype, KILN_RED_SUM);
}

size_t kiln_tp_buffer_bytes(const struct kiln_model_config *m, const struct kiln_model_split *split, int B,
                            int T, enum kiln_dtype act, enum kiln_dtype grad, int keep) {
    int tp = split ? kiln_split_parts(split->heads) : 1;
    if (tp == 1)
        return 0;
    size_t N = (size_t)B * T, bytes = 3 * N * sizeof(float); // the loss's statistics
    if (kiln_split_parts(split->seq) > 1) // gathered and partial rows, the head's targets and losses
        bytes += (2 + (keep ? (size_t)m->n_layer * KEEP_SLOTS : 0)) * N * (size_t)m->n_embd *
                     kiln_dtype_bytes(act) +
                 N * (sizeof(int32_t) + sizeof(float));
    if (kiln_model_kv_heads(m) < tp) { // a key/value copy's gradient before it is summed
        struct kiln_param_table pt;
        kiln_params_build_split(&pt, m, split);
        int qw = pt.layer[0][KILN_QKV_W], qb = pt.layer[0][KILN_QKV_B];
        bytes += (pt.p[qw].count + (qb >= 0 ? pt.p[qb].count : 0) + 1) * kiln_dtype_bytes(grad);
        kiln_params_free(&pt);
    }
    return bytes;
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
    if ((rc = kiln_comm_split_flags(world, lo->cross_rank, lo->tp_rank,
                                    lo->copy_engine && lo->split.seq > 1 ? KILN_COMM_SPLIT_COPY_ENGINE : 0,
                                    &t->comm, err)) ||
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
    int buffers_ok = t->stats && (!t->kv || (t->kv_dw && t->kv_db));
    if (lo->split.seq > 1) {
        t->seq = 1;
        t->ring = lo->overlap == KILN_TP_OVERLAP_RING;
        t->bulk = lo->overlap == KILN_TP_OVERLAP_BULK;
        t->N = (size_t)B * T;
        t->Nr = t->N / (size_t)lo->tp;
        t->C = (size_t)m->n_embd;
        size_t gb = t->N * t->C * kiln_dtype_bytes(be->act_dtype);
        if (lo->copy_engine) // (every rank of the group asks, in the same order)
            t->gath_win = kiln_comm_window_alloc(t->comm, gb);
        t->gath = t->gath_win ? t->gath_win : be->ops->alloc(be->ctx, gb);
        if (lo->keep_gathered) {
            size_t slots = (size_t)m->n_layer * KEEP_SLOTS;
            t->keep = be->ops->alloc(be->ctx, slots * gb);
            t->kept = kiln_xcalloc(slots, 1);
            buffers_ok = buffers_ok && t->keep;
        }
        t->part = be->ops->alloc(be->ctx, t->N * t->C * kiln_dtype_bytes(be->act_dtype));
        t->tgt = be->ops->alloc(be->ctx, t->N * sizeof(int32_t));
        t->loss = be->ops->alloc(be->ctx, t->N * sizeof(float));
        buffers_ok = buffers_ok && t->gath && t->part && t->tgt && t->loss;
    }
    if (!buffers_ok) {
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
    int keep = t->lo.tp_rank == 0 && out;
    if (keep)
        memset(out, 0, whole->total * sizeof(float));
    for (int i = 0; i < local->n; i++) { // a tensor at a time: the host holds one whole tensor at most
        size_t n = local->p[i].count;
        float *all = kiln_xmalloc(n * (size_t)t->lo.tp * sizeof(float));
        kiln_comm_all_gather_host(t->comm, part + local->p[i].offset, all, n * sizeof(float));
        for (int r = 0; keep && r < t->lo.tp; r++) {
            const struct kiln_param *w = &whole->p[kiln_params_find(whole, local->p[i].name)];
            struct gather_runs c = {out + w->offset, all + (size_t)r * n}; // rank r's tensor
            kiln_params_split_runs(t->m, &t->lo.split, r, local, i, gather_run, &c);
        }
        free(all);
    }
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
    if (t->gath_win)
        kiln_comm_window_free(t->comm, t->gath_win);
    else if (t->gath)
        o->free(t->be->ctx, t->gath);
    free(t->kept);
    void *bufs[] = {t->part, t->tgt, t->loss, t->keep};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i])
            o->free(t->be->ctx, bufs[i]);
    kiln_comm_close(t->kv);
    kiln_comm_close(t->comm);
    free(t);
}
