// Data parallelism: the struct's life, the model's hooks, the step's entry points over the optimizer's state
// (its master weights set, gathered and read), and the offloaded optimizer's glue. ddp.c reduces the
// gradients, zero3.c gathers ZeRO-3's weights, shard.c plans what each rank owns. See dp.h.
#include "parallel/dp_internal.h"
#include "parallel/tp.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/adamw.h"
#include "optim/offload.h"
#include "parallel/comm/flight.h"

int kiln_dp_external_grads(const struct kiln_dp *dp) {
    return dp->zero >= 2 && !dp->whole;
}

void kiln_dp_model_opts(const struct kiln_dp *dp, struct kiln_model_opts *o) {
    o->external_grads = kiln_dp_external_grads(dp);
    o->external_weights = dp->zero == 3;
}

void kiln_dp_optim_opts(const struct kiln_dp *dp, struct kiln_optim_state_opts *o) {
    o->total = dp->sh.bounds[0];
    o->elems = dp->optim_elems;
    o->held = dp->held;
    o->n_held = dp->held ? dp->sh.n_ranges : 0;
    o->master_compact = dp->zero == 3;
    o->offload = dp->offload;
}

// Buckets, ranges and spans for rank `rank` of `world`, and what the options make of them (no backend
// memory).
static void plan(struct kiln_dp *dp, const struct kiln_param_table *pt, const struct kiln_dp_opts *o,
                 int world, int rank) {
    dp->zero = o->zero;
    dp->offload = o->offload;
    dp->host_threads = o->host_threads;
    dp->chunk = o->offload_chunk;
    dp->delay_us = o->offload_delay_us;
    dp->poison = o->poison_staging;
    dp->gather_wait = o->gather_wait;
    kiln_shard_plan(&dp->sh, pt, o->zero == 3, o->bucket_mb, kiln_dtype_bytes(dp->be->grad_dtype), world,
                    rank);
    dp->nb = dp->sh.nb;
    dp->ahead = 1 + (o->prefetch > 0 ? o->prefetch : 1);
    dp->keep = o->zero == 3 && o->keep_gathered;
    dp->whole = o->zero == 3 && o->accumulate_whole;
    dp->in_place = o->zero == 3 && world == 1 && !o->gather_at_one;
    // the layers between the top and bottom buckets (nb - 2 of them) each keep a slot, or share a ring
    dp->K = dp->keep ? (dp->nb > 3 ? dp->nb - 2 : 1) : 1 + dp->ahead;
    dp->optim_elems = dp->zero ? (dp->sh.owned ? dp->sh.owned : 1) : pt->total;
    dp->all_spans = kiln_adamw_table_spans(pt, &dp->n_all_spans);
}

// The ranges as the optimizer state's held runs (ZeRO: where a compact master sits), NULL under DDP
static struct kiln_param_span *held_of(const struct kiln_shard_plan *sh, int zero) {
    if (!zero)
        return NULL;
    struct kiln_param_span *h = kiln_xcalloc((size_t)sh->n_ranges + 1, sizeof(*h));
    for (int r = 0; r < sh->n_ranges; r++)
        h[r] = (struct kiln_param_span){sh->ranges[r].lo, sh->ranges[r].hi - sh->ranges[r].lo, 0,
                                        sh->ranges[r].state_offset};
    return h;
}

void kiln_dp_create(struct kiln_dp **out, struct kiln_comm *comm, struct kiln_backend *be,
                    const struct kiln_param_table *pt, const struct kiln_dp_opts *o) {
    struct kiln_dp *dp = kiln_xcalloc(1, sizeof(*dp));
    dp->comm = comm;
    dp->be = be;
    plan(dp, pt, o, comm->size, comm->rank);
    if (o->fp8_groups && dp->zero == 3 && !dp->in_place && !dp->offload) {
        dp->fp8_groups = kiln_xcalloc((size_t)pt->n, sizeof(int));
        memcpy(dp->fp8_groups, o->fp8_groups, (size_t)pt->n * sizeof(int));
    }
    dp->held = held_of(&dp->sh, dp->zero);
    dp->b = kiln_xcalloc((size_t)dp->nb, sizeof(*dp->b));
    for (int i = 0; i < dp->nb; i++)
        dp->b[i].event = be->ops->event_create ? be->ops->event_create(be->ctx) : NULL;
    *out = dp;
}

void kiln_dp_plan_memory(const struct kiln_param_table *pt, const struct kiln_dp_opts *o, int world, int rank,
                         enum kiln_dtype act, enum kiln_dtype grad, int accum, struct kiln_model_opts *model,
                         struct kiln_optim_state_opts *optim, struct kiln_dp_mem *out) {
    struct kiln_backend be = {.act_dtype = act, .grad_dtype = grad};
    struct kiln_dp dp = {.be = &be};
    plan(&dp, pt, o, world, rank);
    kiln_dp_model_opts(&dp, model);
    kiln_dp_optim_opts(&dp, optim); // (held NULL: planning counts elements only)
    size_t gb = kiln_dtype_bytes(grad), ab = kiln_dtype_bytes(act);
    const struct kiln_shard_bucket *b = dp.sh.b;
    size_t top = b[0].hi - b[0].lo, bottom = dp.nb > 1 ? b[dp.nb - 1].hi - b[dp.nb - 1].lo : 0;
    size_t mid = kiln_shard_mid_elems(&dp.sh), n = dp.optim_elems;
    memset(out, 0, sizeof(*out));
    if (dp.whole) { // the model holds whole gradients; the shard takes the one reduction a step
        out->grad_shard = n * gb;
    } else if (dp.zero >= 2) {
        // staging (two shared between), the gradient shard, and with accumulation its addend
        out->staging = (top + bottom + STAGING_SLOTS * mid) * gb;
        out->grad_shard = n * gb + (accum > 1 ? n * sizeof(float) : 0);
    }
    if (dp.zero == 3 && !dp.in_place) // the gathered top and bottom buckets, and the ring of layers
        out->gathered = (top + bottom + (size_t)dp.K * mid) * ab;
    if (o->fp8_groups && dp.zero == 3 && !dp.in_place && !dp.offload) // the layers' codes, and the shard's
        out->gathered += (size_t)dp.K * mid + n;
    if (dp.offload) // master and moments in f32, and the pipeline's staging (two chunks each way)
        out->host = kiln_offload_host_bytes(n, dp.chunk, grad, act);
    kiln_shard_plan_free(&dp.sh);
    free(dp.all_spans);
}

void *dp_alloc_or_die(struct kiln_dp *dp, size_t bytes, const char *what) {
    void *p = dp->be->ops->alloc(dp->be->ctx, bytes ? bytes : 16);
    if (!p) {
        fprintf(stderr, "kiln: out of memory on %s allocating ZeRO-%d's %s (%.2f GiB)\n", dp->be->name,
                dp->zero, what, bytes / 1073741824.0);
        kiln_comm_abort_job(1);
    }
    return p;
}

void kiln_dp_free(struct kiln_dp *dp) {
    if (!dp)
        return;
    kiln_offload_settle(dp->off); // (the state frees its pipeline)
    free(dp->norm_w);
    free(dp->sum_w);
    free(dp->fp8_groups);
    for (int i = 0; dp->wg && i < dp->nb; i++)
        kiln_comm_wait(dp->comm, dp->wg[i]);
    free(dp->wg);
    for (int i = 0; i < dp->nb; i++) {
        kiln_comm_wait(dp->comm, dp->b[i].work);
        if (dp->b[i].event)
            dp->be->ops->event_destroy(dp->be->ctx, dp->b[i].event);
    }
    void *bufs[] = {dp->top, dp->bottom, dp->shard, dp->shard_tmp};
    for (int k = 0; k < STAGING_SLOTS; k++)
        if (dp->mid[k].p)
            dp->be->ops->free(dp->be->ctx, dp->mid[k].p);
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i] && (i != 1 || bufs[i] != dp->top))
            dp->be->ops->free(dp->be->ctx, bufs[i]);
    dp_free_zero3(dp);
    free(dp->host_master);
    free(dp->held);
    free(dp->b);
    kiln_shard_plan_free(&dp->sh);
    free(dp->all_spans);
    free(dp);
}

size_t kiln_dp_optim_elems(const struct kiln_dp *dp) {
    return dp->optim_elems;
}

// ---- the master weights: the optimizer state's, gathered whole for a checkpoint ----

void kiln_dp_set_master(struct kiln_dp *dp, const float *host) {
    kiln_dp_settle(dp);
    kiln_optim_state_set_master(dp->st, host);
    dp_invalidate_units(dp);
}

// The whole master weights, as the last kiln_dp_gather_master left them; the host copy goes with the call
// (the caller has its own; a 7B model's would be 28 GB held between checkpoints).
void kiln_dp_get_master(struct kiln_dp *dp, float *host) {
    size_t total = dp->sh.bounds[0];
    kiln_offload_settle(dp->off);
    if (!dp->host_master) { // whole in the state: flat on the backend, or an offloaded DDP's host master
        KILN_ASSERT(dp->zero < 3 && !(dp->offload && dp->zero)); // else kiln_dp_gather_master first
        kiln_optim_state_get_master(dp->st, 0, total, host);
        return;
    }
    memcpy(host, dp->host_master, total * sizeof(float));
    free(dp->host_master);
    dp->host_master = NULL;
}

// ZeRO-3's (and an offloaded ZeRO-1/2's) kiln_dp_gather_master: each rank's slices of the f32 master weights,
// gathered into host memory.
static void gather_master_host(struct kiln_dp *dp) {
    size_t total = dp->sh.bounds[0];
    if (!dp->host_master)
        dp->host_master = kiln_xmalloc(total * sizeof(float));
    struct kiln_comm_work **w = kiln_xcalloc((size_t)dp->nb, sizeof(*w));
    for (int i = 0; i < dp->nb; i++) {
        const struct kiln_shard_bucket *sb = &dp->sh.b[i];
        size_t lo = sb->slice_lo, n = sb->slice_hi - sb->slice_lo, so = sb->state_offset;
        float *at = dp->host_master + sb->lo;
        kiln_optim_state_get_master(dp->st, so, n, at + lo);
        struct kiln_coll k = {.op = KILN_COLL_ALL_GATHER,
                              .send = at + lo,
                              .recv = at,
                              .count = sb->hi - sb->lo,
                              .dtype = KILN_F32,
                              .device = 0};
        w[i] = kiln_comm_submit(dp->comm, &k, NULL);
    }
    for (int i = 0; i < dp->nb; i++)
        kiln_comm_wait(dp->comm, w[i]);
    free(w);
}

// ---- --offload=optimizer: AdamW on the host (optim/offload.h) ----

// The step's reduced gradients of this rank's ranges to the host, AdamW there, and the updated compute
// weights back to the backend (then, under ZeRO-1/2, gathered from their owners as without offload), started
// here and left running: the next forward waits, layer by layer, for the chunks it reads (the hooks), so the
// host's AdamW overlaps it.
static void offload_adamw(struct kiln_dp *dp, const struct kiln_adamw_hparams *h, double grad_norm) {
    if (kiln_offload_step(dp->off, h, grad_norm)) {
        fprintf(stderr, "kiln: cannot start the offloaded optimizer's threads\n");
        kiln_comm_abort_job(1);
    }
    if (dp->zero == 3) {
        dp_invalidate_units(dp); // each gather waits for its bucket's chunks (zero3.c)
    } else if (dp->zero) {       // the owners' weights are gathered by a collective of the training thread's
        kiln_offload_settle(dp->off);
        dp_gather_weights(dp, 0);
    }
}

// When the forward first reads segment s (segment 0: the embeddings, 1 + l: layer l, the last: the final norm
// and head): the embeddings first, then the layers in turn, and the top last, after the last layer; under
// ZeRO-3 the top second, since it is gathered with the embeddings at the forward's start. The offloaded
// step's chunks go in this order.
static int seg_order(const struct kiln_dp *dp, int s) {
    int n = dp->n_seg;
    return s == 0 ? 0 : s < n - 1 ? s + 1 : dp->zero == 3 ? 1 : n;
}

// The pieces of the flat buffer this rank updates, with the order the forward reads them in: the segments
// (DDP: the whole buffer, state offset = offset), or the owned ranges (ZeRO), each first read at its least
// segment's order.
static int plan_pieces(const struct kiln_dp *dp, struct kiln_offload_piece **out) {
    struct kiln_dp_range all = {0, dp->sh.bounds[0], 0};
    int n = dp->zero ? dp->sh.n_ranges : 1;
    const struct kiln_dp_range *q = dp->zero ? dp->sh.ranges : &all;
    struct kiln_offload_piece *pc = kiln_xcalloc((size_t)(n + dp->n_seg) + 1, sizeof(*pc));
    int np = 0;
    for (int r = 0; r < n; r++)
        for (int s = 0; s < dp->n_seg; s++) {
            size_t lo = dp->seg_begin[s] > q[r].lo ? dp->seg_begin[s] : q[r].lo;
            size_t hi = dp->seg_begin[s + 1] < q[r].hi ? dp->seg_begin[s + 1] : q[r].hi;
            if (lo >= hi)
                continue;
            int o = seg_order(dp, s);
            if (dp->zero && np > 0 && pc[np - 1].hi == lo &&
                pc[np - 1].so + (pc[np - 1].hi - pc[np - 1].lo) == q[r].state_offset + (lo - q[r].lo)) {
                // ZeRO: a range stays one piece (its bucket is gathered whole), first read at its least order
                pc[np - 1].hi = hi;
                pc[np - 1].order = o < pc[np - 1].order ? o : pc[np - 1].order;
                continue;
            }
            pc[np++] = (struct kiln_offload_piece){lo, hi, q[r].state_offset + (lo - q[r].lo), o};
        }
    *out = pc;
    return np;
}

// DDP with offload: the forward's start reads the embeddings and layer 0's first norm; layer l's forward its
// own weights and layer l + 1's first norm (the last layer's, the top's: everything).
static void on_forward_begin_offload(void *user) {
    struct kiln_dp *dp = user;
    kiln_flight_set_layer(-1);
    kiln_offload_wait(dp->off, kiln_offload_chunks_through(dp->off, seg_order(dp, 1)));
}

static void on_layer_begin_offload(void *user, int l, int recompute) {
    struct kiln_dp *dp = user;
    kiln_flight_set_layer(l);
    if (!recompute)
        kiln_offload_wait(dp->off, kiln_offload_chunks_through(dp->off, seg_order(dp, 2 + l)));
}

static void attach_offload(struct kiln_dp *dp, struct kiln_model_hooks *h) {
    if (!dp->zero) {
        h->forward_begin = on_forward_begin_offload;
        h->layer_begin = on_layer_begin_offload;
    }
    dp->n_seg = kiln_model_grad_segments(dp->g, &dp->seg_begin);
    struct kiln_offload_piece *pieces;
    int n_pieces = plan_pieces(dp, &pieces);
    struct kiln_offload_opts o = {.pieces = pieces,
                                  .n_pieces = n_pieces,
                                  .spans = dp->zero ? dp->sh.spans : dp->all_spans,
                                  .n_spans = dp->zero ? dp->sh.n_spans : dp->n_all_spans,
                                  .grads = dp->zero >= 2 ? dp->shard : dp->buf.grads,
                                  .grads_compact = dp->zero >= 2,
                                  .chunk = dp->chunk,
                                  .host_threads = dp->host_threads,
                                  .delay_us = dp->delay_us};
    kiln_optim_state_offload(dp->st, &o); // (elems, total and the compute copy: the state's)
    dp->off = kiln_optim_state_pipe(dp->st);
    free(pieces);
}

// ---- the step ----

void kiln_dp_attach(struct kiln_dp *dp, struct kiln_model *g, struct kiln_optim_state *st) {
    dp->g = g;
    dp->st = st;
    struct kiln_model_buffers mb;
    kiln_model_buffers(g, &mb);
    KILN_ASSERT(kiln_optim_state_elems(st) == dp->optim_elems);
    KILN_ASSERT(kiln_model_params(g)->total == dp->sh.bounds[0]); // planned on this layout
    dp->buf = (struct dp_buffers){.weights = kiln_optim_state_weights(st), .grads = mb.grads};
    if (!dp->offload) {
        struct kiln_adamw_buffers ab;
        kiln_optim_state_buffers(st, &ab);
        dp->buf.params = ab.params;
        dp->buf.m = ab.m;
        dp->buf.v = ab.v;
    }
    struct kiln_model_hooks h = {.user = dp};
    dp_attach_reduce(dp, &h);
    if (dp->zero == 3)
        dp_attach_zero3(dp, &h);
    if (dp->offload)
        attach_offload(dp, &h);
    kiln_model_set_hooks(g, &h);
}

void kiln_dp_micro_step(struct kiln_dp *dp, int micro, int accum) {
    dp->micro = micro;
    // zero_grad is next: the embeddings' gradients must have gone down (DDP)
    if (kiln_offload_running(dp->off) && micro == 0)
        kiln_offload_wait_grads(dp->off, kiln_offload_chunks_through(dp->off, seg_order(dp, 0)));
    if (micro > 0)
        kiln_offload_settle(dp->off); // (the forward before settled it)
    if (dp->zero < 2 || dp->whole) {
        dp->reducing = micro == accum - 1;
        return;
    }
    // ZeRO-2 reduces every micro-step's gradients onto the shard, since their staging buffers are reused
    dp->reducing = 1;
    dp_stage_micro_step(dp);
}

void kiln_dp_after_backward(struct kiln_dp *dp) {
    kiln_offload_settle(dp->off); // (the forward settled it: the last layer's waits for every chunk)
    if (!dp->reducing)
        return;
    for (int i = 0; i < dp->nb; i++) {
        KILN_ASSERT(dp->b[i].work || dp->comm->kind == KILN_COMM_SINGLE ||
                    (dp->zero >= 2 && !dp->b[i].stage));
        kiln_comm_wait_stream(dp->comm, dp->b[i].work);
        dp->b[i].work = NULL;
    }
    if (kiln_dp_external_grads(dp) && dp->micro > 0) // ordered after the reductions on the compute stream
        dp->be->ops->accumulate_f32(dp->be->ctx, dp->shard, dp->shard_tmp, dp->optim_elems);
    dp->reducing = 0;
}

static struct kiln_norm_weight *copy_ranges(const struct kiln_norm_weight *w, int n) {
    struct kiln_norm_weight *c = n ? kiln_xmalloc((size_t)n * sizeof(*w)) : NULL;
    if (n)
        memcpy(c, w, (size_t)n * sizeof(*w));
    return c;
}

void kiln_dp_set_norm(struct kiln_dp *dp, struct kiln_comm *outer, const struct kiln_norm_weight *w, int n,
                      const struct kiln_norm_weight *sums, int ns) {
    dp->norm_outer = outer;
    free(dp->norm_w);
    free(dp->sum_w);
    free(dp->sum_w);
    dp->norm_w = copy_ranges(w, n);
    dp->n_norm_w = n;
    dp->sum_w = copy_ranges(sums, ns);
    dp->n_sum_w = ns;
}

// The reduced gradients that fall in dp->sum_w, summed over dp->norm_outer in place: this rank's slices
// (ZeRO, whose update reads those alone), or the whole buffer (DDP: every rank updates every tensor)
static void sum_over_outer(struct kiln_dp *dp) {
    size_t gb = dp_grad_bytes(dp);
    dp->be->ops->synchronize(dp->be->ctx); // the reductions the compute stream waited for are done
    struct kiln_dp_range all = {0, dp->sh.bounds[0], 0};
    int n = dp->zero ? dp->sh.n_ranges : 1;
    for (int r = 0; r < n; r++) {
        const struct kiln_dp_range *q = dp->zero ? &dp->sh.ranges[r] : &all;
        char *at = dp->zero >= 2 ? (char *)dp->shard + q->state_offset * gb : (char *)dp->buf.grads + q->lo * gb;
        for (int k = 0; k < dp->n_sum_w; k++) {
            size_t lo = dp->sum_w[k].lo > q->lo ? dp->sum_w[k].lo : q->lo;
            size_t hi = dp->sum_w[k].hi < q->hi ? dp->sum_w[k].hi : q->hi;
            if (lo >= hi)
                continue;
            struct kiln_coll c = {.op = KILN_COLL_ALL_REDUCE,
                                  .send = at + (lo - q->lo) * gb,
                                  .recv = at + (lo - q->lo) * gb,
                                  .count = hi - lo,
                                  .dtype = dp->be->grad_dtype,
                                  .red = KILN_RED_SUM,
                                  .device = dp->be->device_memory};
            kiln_comm_wait(dp->norm_outer, kiln_comm_submit(dp->norm_outer, &c, NULL));
        }
    }
}

double kiln_dp_grad_norm(struct kiln_dp *dp, double *also) {
    kiln_flight_set_layer(-1);
    if (dp->n_sum_w)
        sum_over_outer(dp);
    // this rank's slices, in bucket order, then the ranks' sums: the same additions at every --zero level
    double sum = 0;
    size_t gb = dp_grad_bytes(dp);
    for (int r = 0; r < dp->sh.n_ranges;
         r++) { // ZeRO-2's shard holds the same slices, compact, in this order
        const struct kiln_dp_range *q = &dp->sh.ranges[r];
        const char *at = dp->zero >= 2 ? (const char *)dp->shard + q->state_offset * gb
                                       : (const char *)dp->buf.grads + q->lo * gb;
        sum += dp->be->ops->sum_squares(dp->be->ctx, at, q->hi - q->lo);
        for (int k = 0; k < dp->n_norm_w; k++) { // copies that the tensor-parallel group counts once
            const struct kiln_norm_weight *w = &dp->norm_w[k];
            size_t lo = w->lo > q->lo ? w->lo : q->lo, hi = w->hi < q->hi ? w->hi : q->hi;
            if (lo < hi)
                sum += (w->weight - 1.0) * dp->be->ops->sum_squares(dp->be->ctx, at + (lo - q->lo) * gb, hi - lo);
        }
    }
    double v[2] = {sum, also ? *also : 0};
    kiln_comm_all_reduce_host(dp->comm, v, 2, KILN_F64, KILN_RED_SUM);
    if (dp->norm_outer)
        kiln_comm_all_reduce_host(dp->norm_outer, v, 1, KILN_F64, KILN_RED_SUM);
    if (also)
        *also = v[1];
    return sqrt(v[0]);
}

void kiln_dp_adamw(struct kiln_dp *dp, const struct kiln_adamw_hparams *h, double grad_norm) {
    // the last step's gathers read this rank's slices, which AdamW writes (a forward waited for every one;
    // a step without one has not)
    dp_weights_through(dp, SIZE_MAX);
    if (dp->offload) {
        offload_adamw(dp, h, grad_norm);
        return;
    }
    // DDP updates every tensor; ZeRO its slices, with ZeRO-2/3's reduced gradients compact in the shard, and
    // ZeRO-3's weights too
    struct kiln_adamw_buffers b = {.params = dp->buf.params,
                                   .weights = dp->buf.weights,
                                   .grads = dp->zero >= 2 ? dp->shard : dp->buf.grads,
                                   .m = dp->buf.m,
                                   .v = dp->buf.v,
                                   .grads_compact = dp->zero >= 2,
                                   .params_compact = dp->zero == 3};
    if (!dp->zero) {
        kiln_adamw_step(dp->be, &b, dp->all_spans, dp->n_all_spans, h, grad_norm);
        return;
    }
    kiln_adamw_step(dp->be, &b, dp->sh.spans, dp->sh.n_spans, h, grad_norm);
    if (dp->zero == 3) { // gathered again as the next forward needs them
        dp_invalidate_units(dp);
        return;
    }
    dp_issue_gathers(dp, 0, dp->wg);
    if (dp->gather_wait)
        dp_weights_through(dp, SIZE_MAX);
}

void kiln_dp_gather_master(struct kiln_dp *dp) {
    kiln_offload_settle(dp->off);
    dp_weights_through(dp, SIZE_MAX);
    if (dp->offload && dp->zero)
        gather_master_host(dp);
    else if (dp->offload)
        return; // the host master is whole
    else if (dp->zero == 3)
        gather_master_host(dp);
    else if (dp->zero && dp->buf.weights != dp->buf.params)
        dp_gather_weights(dp, 1);
}

// ---- what the trainer and the checkpoints read ----

const struct kiln_dp_range *kiln_dp_ranges(const struct kiln_dp *dp, int *n) {
    *n = dp->sh.n_ranges;
    return dp->sh.ranges;
}

const size_t *kiln_dp_bucket_bounds(const struct kiln_dp *dp, int *n_buckets) {
    *n_buckets = dp->nb;
    return dp->sh.bounds;
}

int kiln_dp_zero(const struct kiln_dp *dp) {
    return dp->zero;
}

static struct kiln_offload_stats offload_stats(const struct kiln_dp *dp) {
    struct kiln_offload_stats st = {0};
    if (dp->off)
        kiln_offload_stats(dp->off, &st);
    return st;
}

double kiln_dp_offload_s(const struct kiln_dp *dp) {
    return offload_stats(dp).busy_s;
}

double kiln_dp_offload_wait_s(const struct kiln_dp *dp) {
    return offload_stats(dp).wait_s;
}

double kiln_dp_offload_copies(const struct kiln_dp *dp, double *seconds) {
    struct kiln_offload_stats st = offload_stats(dp);
    *seconds = st.copy_s;
    return st.copy_bytes;
}

void kiln_dp_settle(struct kiln_dp *dp) {
    kiln_offload_settle(dp->off);
    dp_weights_through(dp, SIZE_MAX);
}

double kiln_dp_wait_s(const struct kiln_dp *dp) {
    return dp->comm->wait_s;
}
