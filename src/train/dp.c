// Data parallelism: buckets, overlapped reductions, ZeRO-1/2. See dp.h.
#include "train/dp.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

struct bucket {
    size_t lo, hi;   // flat elements
    int ready_layer; // reduce after this layer's backward; -1: after the embeddings' (lo == 0)
    void *event;     // the compute stream's point where the bucket is complete (NULL on the CPU)
    struct kiln_comm_work *work;
    // ZeRO-2: where the bucket's gradients are written this micro-step (a staging buffer), or NULL
    void *stage;
    size_t state_offset; // its slice's place in the rank's shard
};

// ZeRO-2's staging buffers: the top bucket (the final norm and head, written from the classifier on) and the
// bottom one (the embeddings) have one each; the buckets between share two, in turn.
struct slot {
    void *p;
    int bucket; // whose gradients it holds now, -1: none
};

struct kiln_dp {
    struct kiln_comm *comm;
    struct kiln_backend *be;
    struct kiln_gpt *g;
    struct kiln_gpt_buffers buf;
    int zero;
    struct bucket *b; // in backward order: b[0] is the last layers'
    int nb;
    size_t *bounds;               // nb + 1 offsets: b[i] = [bounds[i+1], bounds[i])
    struct kiln_dp_range *ranges; // this rank's slice of each bucket, in bucket order
    int n_ranges;
    size_t optim_elems;
    struct kiln_param_span *spans; // AdamW's spans over the ranges (ZeRO), with shard-local state offsets
    int n_spans;
    int reducing; // this backward is the last micro-step: reduce buckets as they complete
    // ZeRO-2: the gradients live in staging buffers for one micro-step, then in the shard
    const size_t *seg_begin; // the model's gradient segments (kiln_gpt_grad_segments)
    int n_seg;
    void *top, *bottom; // staging of b[0] and b[nb - 1]
    struct slot mid[2];
    int next_slot;
    void *shard;     // (optim_elems) the reduced gradients of this rank's slices, summed over micro-steps
    void *shard_tmp; // (optim_elems) f32: a later micro-step's reduction, before it is added
    int micro;       // this micro-step's index
};

int kiln_dp_external_grads(const struct kiln_dp *dp) {
    return dp->zero == 2;
}

static size_t grad_bytes(const struct kiln_dp *dp) {
    return kiln_dtype_bytes(dp->be->grad_dtype);
}

int kiln_dp_ranges_for(const size_t *bounds, int n_buckets, int n, int r, struct kiln_dp_range **out) {
    struct kiln_dp_range *v = kiln_xcalloc((size_t)n_buckets + 1, sizeof(*v));
    size_t state = 0;
    int k = 0;
    for (int i = 0; i < n_buckets; i++) {
        size_t blo = bounds[i + 1], bhi = bounds[i], lo, hi;
        kiln_comm_slice(bhi - blo, n, r, &lo, &hi);
        if (hi == lo)
            continue;
        v[k++] = (struct kiln_dp_range){blo + lo, blo + hi, state};
        state += hi - lo;
    }
    *out = v;
    return k;
}

// Buckets at layer boundaries, from the top: each takes layers (downwards) until it holds bucket_mb.
static void plan_buckets(struct kiln_dp *dp, const struct kiln_param_table *pt, double bucket_mb) {
    int L = 0; // layers in the table
    for (int i = 0; i < pt->n; i++)
        if (pt->p[i].layer + 1 > L)
            L = pt->p[i].layer + 1;
    size_t want = (size_t)(bucket_mb * 1048576.0 / (double)grad_bytes(dp));
    if (want < 1)
        want = 1;
    dp->b = kiln_xcalloc((size_t)L + 1, sizeof(*dp->b));
    dp->bounds = kiln_xcalloc((size_t)L + 2, sizeof(*dp->bounds));
    size_t hi = pt->total;
    dp->nb = 0;
    dp->bounds[0] = hi;
    for (int l = L - 1; l >= 0; l--) {
        size_t lo = l == 0 ? 0 : pt->layer_begin[l];
        if (hi - lo < want && l > 0)
            continue; // take the next layer down too
        dp->b[dp->nb] = (struct bucket){.lo = lo, .hi = hi, .ready_layer = l == 0 ? -1 : l};
        dp->bounds[++dp->nb] = lo;
        hi = lo;
    }
    if (L == 0) { // no layers: one bucket, after the embeddings
        dp->b[0] = (struct bucket){.lo = 0, .hi = hi, .ready_layer = -1};
        dp->bounds[1] = 0;
        dp->nb = 1;
    }
}

// AdamW's spans: every tensor's span cut to the owned ranges, with the range's state offsets.
static void plan_spans(struct kiln_dp *dp, const struct kiln_param_table *pt) {
    dp->spans = kiln_xcalloc((size_t)pt->n * (size_t)(dp->n_ranges + 1), sizeof(*dp->spans));
    dp->n_spans = 0;
    for (int r = 0; r < dp->n_ranges; r++) {
        const struct kiln_dp_range *q = &dp->ranges[r];
        for (int i = 0; i < pt->n; i++) {
            size_t lo = pt->p[i].offset, hi = lo + pt->p[i].count;
            if (hi <= q->lo || lo >= q->hi)
                continue;
            lo = lo > q->lo ? lo : q->lo;
            hi = hi < q->hi ? hi : q->hi;
            dp->spans[dp->n_spans++] =
                (struct kiln_param_span){lo, hi - lo, pt->p[i].decay, q->state_offset + (lo - q->lo)};
        }
    }
}

void kiln_dp_create(struct kiln_dp **out, struct kiln_comm *comm, struct kiln_backend *be,
                    const struct kiln_param_table *pt, const struct kiln_dp_opts *o) {
    struct kiln_dp *dp = kiln_xcalloc(1, sizeof(*dp));
    dp->comm = comm;
    dp->be = be;
    dp->zero = o->zero;
    plan_buckets(dp, pt, o->bucket_mb);
    dp->n_ranges = kiln_dp_ranges_for(dp->bounds, dp->nb, comm->size, comm->rank, &dp->ranges);
    size_t owned = 0;
    for (int r = 0; r < dp->n_ranges; r++)
        owned += dp->ranges[r].hi - dp->ranges[r].lo;
    dp->optim_elems = dp->zero ? (owned ? owned : 1) : pt->total;
    plan_spans(dp, pt);
    for (int i = 0; i < dp->nb; i++)
        dp->b[i].event = be->ops->event_create ? be->ops->event_create(be->ctx) : NULL;
    *out = dp;
}

void kiln_dp_free(struct kiln_dp *dp) {
    if (!dp)
        return;
    for (int i = 0; i < dp->nb; i++) {
        kiln_comm_wait(dp->comm, dp->b[i].work);
        if (dp->b[i].event)
            dp->be->ops->event_destroy(dp->be->ctx, dp->b[i].event);
    }
    void *bufs[] = {dp->top, dp->bottom, dp->mid[0].p, dp->mid[1].p, dp->shard, dp->shard_tmp};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i] && (i != 1 || bufs[i] != dp->top))
            dp->be->ops->free(dp->be->ctx, bufs[i]);
    free(dp->b);
    free(dp->bounds);
    free(dp->ranges);
    free(dp->spans);
    free(dp);
}

size_t kiln_dp_optim_elems(const struct kiln_dp *dp) {
    return dp->optim_elems;
}

// Issues bucket i's reduction: all-reduce in place (DDP, ZeRO-1), or reduce-scatter onto this rank's slice.
static void reduce_bucket(struct kiln_dp *dp, struct bucket *b) {
    KILN_ASSERT(!b->work);
    size_t gb = grad_bytes(dp), lo, hi;
    kiln_comm_slice(b->hi - b->lo, dp->comm->size, dp->comm->rank, &lo, &hi);
    char *base = dp->zero == 2 ? (char *)b->stage : (char *)dp->buf.grads + b->lo * gb;
    // ZeRO-2: from the staging buffer onto the shard (a later micro-step's first into shard_tmp, then added)
    void *shard = dp->micro == 0 ? dp->shard : dp->shard_tmp;
    KILN_ASSERT(dp->zero != 2 || (base && shard));
    struct kiln_coll k = {.op = dp->zero == 2 ? KILN_COLL_REDUCE_SCATTER : KILN_COLL_ALL_REDUCE,
                          .send = base,
                          .recv = dp->zero == 2 ? (char *)shard + b->state_offset * gb : base,
                          .count = b->hi - b->lo,
                          .dtype = dp->be->grad_dtype,
                          .red = KILN_RED_SUM,
                          .device = dp->be->device_memory};
    if (b->event)
        dp->be->ops->event_record(dp->be->ctx, b->event);
    b->work = kiln_comm_submit(dp->comm, &k, b->event);
}

static void on_layer_backward_end(void *user, int l) {
    struct kiln_dp *dp = user;
    if (!dp->reducing)
        return;
    for (int i = 0; i < dp->nb; i++)
        if (dp->b[i].ready_layer == l)
            reduce_bucket(dp, &dp->b[i]);
}

static void on_embed_backward_end(void *user) {
    on_layer_backward_end(user, -1);
}

// ---- ZeRO-2's staging: each bucket's gradients are written into a buffer of the bucket's size, reduced onto
// the shard, and the buffer goes to the next bucket ----

// points the model's gradient windows of every segment in bucket i at its staging buffer
static void window_bucket(struct kiln_dp *dp, int i, void *stage) {
    struct bucket *b = &dp->b[i];
    b->stage = stage;
    size_t gb = grad_bytes(dp);
    for (int s = 0; s < dp->n_seg; s++)
        if (dp->seg_begin[s] >= b->lo && dp->seg_begin[s] < b->hi)
            kiln_gpt_set_grad_window(dp->g, s, (char *)stage + (dp->seg_begin[s] - b->lo) * gb);
}

static int bucket_of(const struct kiln_dp *dp, size_t at) {
    for (int i = 0; i < dp->nb; i++)
        if (at >= dp->b[i].lo && at < dp->b[i].hi)
            return i;
    return dp->nb - 1;
}

// Gives bucket i a staging buffer: the older of the two shared ones, once its reduction has read it (on the
// GPU the compute stream waits, not the host), zeroed so that the padding between tensors sums to zero.
static void stage_bucket(struct kiln_dp *dp, int i) {
    if (dp->b[i].stage)
        return;
    struct slot *s = &dp->mid[dp->next_slot];
    dp->next_slot ^= 1;
    if (s->bucket >= 0) {
        struct bucket *old = &dp->b[s->bucket];
        KILN_ASSERT(old->work ||
                    dp->comm->kind == KILN_COMM_SINGLE); // reduced before its slot is wanted again
        kiln_comm_wait_stream(dp->comm, old->work);
        old->work = NULL;
        old->stage = NULL;
    }
    s->bucket = i;
    dp->be->ops->zero(dp->be->ctx, s->p, (dp->b[i].hi - dp->b[i].lo) * grad_bytes(dp));
    window_bucket(dp, i, s->p);
}

// Before layer l's backward: its bucket, and layer l-1's (whose output-projection biases this layer's norm
// backward writes), have staging buffers.
static void on_layer_begin(void *user, int l, int recompute) {
    struct kiln_dp *dp = user;
    if (!recompute)
        return;
    stage_bucket(dp, bucket_of(dp, dp->seg_begin[1 + l]));
    if (l > 0)
        stage_bucket(dp, bucket_of(dp, dp->seg_begin[l]));
}

static void *alloc_or_die(struct kiln_dp *dp, size_t bytes, const char *what) {
    void *p = dp->be->ops->alloc(dp->be->ctx, bytes ? bytes : 16);
    if (!p) {
        fprintf(stderr, "kiln: out of memory on %s allocating ZeRO-2's %s (%.2f GiB)\n", dp->be->name, what,
                bytes / 1073741824.0);
        kiln_comm_abort_job(1);
    }
    return p;
}

void kiln_dp_attach(struct kiln_dp *dp, struct kiln_gpt *g) {
    dp->g = g;
    kiln_gpt_buffers(g, &dp->buf);
    KILN_ASSERT(dp->buf.optim_elems == dp->optim_elems);
    KILN_ASSERT(kiln_gpt_params(g)->total == dp->bounds[0]); // planned on this layout
    struct kiln_gpt_hooks h = {
        .user = dp, .layer_backward_end = on_layer_backward_end, .embed_backward_end = on_embed_backward_end};
    if (dp->zero == 2) {
        KILN_ASSERT(!dp->buf.grads); // the model was created with external_grads
        dp->n_seg = kiln_gpt_grad_segments(g, &dp->seg_begin);
        size_t gb = grad_bytes(dp), mid = 0, state = 0;
        for (int i = 0; i < dp->nb; i++) {
            size_t lo, hi, n = dp->b[i].hi - dp->b[i].lo;
            kiln_comm_slice(n, dp->comm->size, dp->comm->rank, &lo, &hi);
            dp->b[i].state_offset = state;
            state += hi - lo;
            if (i > 0 && i < dp->nb - 1 && n > mid)
                mid = n;
        }
        dp->top = alloc_or_die(dp, (dp->b[0].hi - dp->b[0].lo) * gb, "staging buffer");
        dp->bottom = dp->nb > 1 ? alloc_or_die(dp, (dp->b[dp->nb - 1].hi - dp->b[dp->nb - 1].lo) * gb,
                                               "staging buffer")
                                : dp->top;
        for (int k = 0; k < 2; k++)
            dp->mid[k] =
                (struct slot){.p = mid ? alloc_or_die(dp, mid * gb, "staging buffer") : NULL, .bucket = -1};
        dp->shard = alloc_or_die(dp, dp->optim_elems * gb, "gradient shard");
        h.layer_begin = on_layer_begin;
    }
    kiln_gpt_set_hooks(g, &h);
}

void kiln_dp_micro_step(struct kiln_dp *dp, int micro, int accum) {
    dp->micro = micro;
    if (dp->zero != 2) {
        dp->reducing = micro == accum - 1;
        return;
    }
    // ZeRO-2 reduces every micro-step's gradients onto the shard, since their staging buffers are reused
    dp->reducing = 1;
    if (micro > 0 && !dp->shard_tmp) {
        KILN_ASSERT(dp->be->grad_dtype == KILN_F32); // accumulation keeps fp32 gradients (config.c)
        dp->shard_tmp = alloc_or_die(dp, dp->optim_elems * sizeof(float), "gradient shard");
    }
    for (int i = 0; i < dp->nb; i++)
        dp->b[i].stage = NULL;
    dp->mid[0].bucket = dp->mid[1].bucket = -1;
    window_bucket(dp, 0, dp->top); // written from the forward on (the classifier's gradients)
    window_bucket(dp, dp->nb - 1, dp->bottom);
}

void kiln_dp_after_backward(struct kiln_dp *dp) {
    if (!dp->reducing)
        return;
    for (int i = 0; i < dp->nb; i++) {
        KILN_ASSERT(dp->b[i].work || dp->comm->kind == KILN_COMM_SINGLE ||
                    (dp->zero == 2 && !dp->b[i].stage));
        kiln_comm_wait_stream(dp->comm, dp->b[i].work);
        dp->b[i].work = NULL;
    }
    if (dp->zero == 2 && dp->micro > 0) // ordered after the reductions on the compute stream
        dp->be->ops->accumulate_f32(dp->be->ctx, dp->shard, dp->shard_tmp, dp->optim_elems);
    dp->reducing = 0;
}

double kiln_dp_grad_norm(struct kiln_dp *dp, double *also) {
    // this rank's slices, in bucket order, then the ranks' sums: the same additions at every --zero level
    double sum = 0;
    size_t gb = grad_bytes(dp);
    for (int r = 0; r < dp->n_ranges; r++) { // ZeRO-2's shard holds the same slices, compact, in this order
        const struct kiln_dp_range *q = &dp->ranges[r];
        const char *at = dp->zero == 2 ? (const char *)dp->shard + q->state_offset * gb
                                       : (const char *)dp->buf.grads + q->lo * gb;
        sum += dp->be->ops->sum_squares(dp->be->ctx, at, q->hi - q->lo);
    }
    double v[2] = {sum, also ? *also : 0};
    kiln_comm_all_reduce_host(dp->comm, v, 2, KILN_F64, KILN_RED_SUM);
    if (also)
        *also = v[1];
    return sqrt(v[0]);
}

// The compute weights (or, with master = 1, the f32 master weights) of every bucket, gathered from their
// owners in place.
static void gather_weights(struct kiln_dp *dp, int master) {
    void *base = master ? (void *)dp->buf.params : dp->buf.weights;
    enum kiln_dtype dt = master ? KILN_F32 : dp->be->act_dtype;
    size_t eb = kiln_dtype_bytes(dt);
    struct kiln_comm_work **w = kiln_xcalloc((size_t)dp->nb, sizeof(*w));
    for (int i = 0; i < dp->nb; i++) {
        const struct bucket *b = &dp->b[i];
        size_t lo, hi;
        kiln_comm_slice(b->hi - b->lo, dp->comm->size, dp->comm->rank, &lo, &hi);
        char *at = (char *)base + b->lo * eb;
        struct kiln_coll k = {.op = KILN_COLL_ALL_GATHER,
                              .send = at + lo * eb,
                              .recv = at,
                              .count = b->hi - b->lo,
                              .dtype = dt,
                              .device = dp->be->device_memory};
        w[i] = kiln_comm_submit(dp->comm, &k, NULL);
    }
    for (int i = 0; i < dp->nb; i++)
        kiln_comm_wait_stream(dp->comm, w[i]);
    free(w);
}

void kiln_dp_adamw(struct kiln_dp *dp, const struct kiln_adamw_hparams *h, double grad_norm) {
    if (!dp->zero) {
        kiln_gpt_adamw(dp->g, h, grad_norm);
        return;
    }
    if (dp->zero == 2)
        kiln_gpt_adamw_shard(dp->g, h, grad_norm, dp->spans, dp->n_spans, dp->shard);
    else
        kiln_gpt_adamw_spans(dp->g, h, grad_norm, dp->spans, dp->n_spans);
    gather_weights(dp, 0);
}

void kiln_dp_gather_master(struct kiln_dp *dp) {
    if (dp->zero && dp->buf.weights != dp->buf.params)
        gather_weights(dp, 1);
}

const struct kiln_dp_range *kiln_dp_ranges(const struct kiln_dp *dp, int *n) {
    *n = dp->n_ranges;
    return dp->ranges;
}

const size_t *kiln_dp_bucket_bounds(const struct kiln_dp *dp, int *n_buckets) {
    *n_buckets = dp->nb;
    return dp->bounds;
}

int kiln_dp_zero(const struct kiln_dp *dp) {
    return dp->zero;
}

double kiln_dp_wait_s(const struct kiln_dp *dp) {
    return dp->comm->wait_s;
}
