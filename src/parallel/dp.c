// Data parallelism: buckets, overlapped reductions, ZeRO-1/2. See dp.h.
#include "parallel/dp.h"

#include "optim/adamw.h"
#include "optim/offload.h"
#include "parallel/comm/flight.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// ZeRO-2/3's staging buffers shared by the buckets between the top and the bottom one. A layer's backward
// holds two (its own and, for the biases its norm writes, the layer below's), so with two the backward waits
// for each reduce-scatter before reusing its buffer. A third hides those waits (the compute stream's wait
// fell from 13.3 to 1.8 ms in 8 steps on the H100 at world size 1, KILN_TRACE_COMM) but the step got slower,
// from 136.9 to 138.2 ms at the 1.3B shape: the reduction then runs beside the compute and takes SMs from
// it. Two it is, until it is measured on several GPUs (issue 17).
#define STAGING_SLOTS 2

struct bucket {
    size_t lo, hi;   // flat elements
    int ready_layer; // reduce after this layer's backward; -1: after the embeddings' (lo == 0)
    void *event;     // the compute stream's point where the bucket is complete (NULL on the CPU)
    struct kiln_comm_work *work;
    // ZeRO-2: where the bucket's gradients are written this micro-step (a staging buffer), or NULL
    void *stage;
    size_t state_offset; // its slice's place in the rank's shard (ZeRO's compact state)
    int gap0, n_gaps;    // ZeRO-2/3: its padding between tensors, dp->gaps[gap0 .. gap0 + n_gaps)
};

struct gap {
    size_t lo, hi; // flat elements that no tensor holds
};

// ZeRO-3: one bucket's compute weights, gathered, and whether they are the current ones (until AdamW)
struct unit {
    void *p;      // NULL when the model reads the shard in place (world size 1)
    int bucket;   // whose weights it holds, -1: none
    int valid;    // gathered (or being gathered) since the last update
    void *issued; // the compute stream's point where its gather was issued (NULL on the CPU)
    struct kiln_comm_work *work;
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
    struct kiln_model *g;
    struct kiln_model_buffers buf;
    int zero;
    struct bucket *b; // in backward order: b[0] is the last layers'
    int nb;
    size_t *bounds;               // nb + 1 offsets: b[i] = [bounds[i+1], bounds[i])
    struct kiln_dp_range *ranges; // this rank's slice of each bucket, in bucket order
    int n_ranges;
    size_t optim_elems;
    struct kiln_param_span *spans; // AdamW's spans over the ranges (ZeRO), with shard-local state offsets
    int n_spans;
    struct kiln_param_span *all_spans; // DDP's: every tensor, state offset = offset
    int n_all_spans;
    int reducing; // this backward is the last micro-step: reduce buckets as they complete
    // ZeRO-2: the gradients live in staging buffers for one micro-step, then in the shard
    const size_t *seg_begin; // the model's gradient segments (kiln_model_grad_segments)
    int n_seg;
    void *top, *bottom; // staging of b[0] and b[nb - 1]
    struct slot mid[STAGING_SLOTS];
    int next_slot;
    struct gap *gaps; // every bucket's padding, bucket by bucket (plan_gaps)
    void *shard;      // (optim_elems) the reduced gradients of this rank's slices, summed over micro-steps
    void *shard_tmp;  // (optim_elems) f32: a later micro-step's reduction, before it is added
    int micro;        // this micro-step's index
    // ZeRO-3: the compute weights of each bucket are gathered from their owners when the model needs them.
    // The top bucket (the last layer, final norm, head) and the bottom one (embeddings, layer 0) stay
    // gathered from the first forward of a step to its last backward; each layer between has its own bucket
    // and comes through a ring of K slots: the computing layer, the next one (whose first norm ends this
    // one's forward) and --prefetch more; with keep_gathered, a slot for each of them, kept until the weights
    // change.
    int L, K;
    int ahead; // layers gathered ahead of the computing one: the next and --prefetch more
    int keep;  // keep_gathered
    int whole; // accumulate_whole: ZeRO-3's gradients live whole in the model's buffer (as DDP's), not staged
    // ZeRO-3 at world size 1: a bucket's shard is the whole bucket, laid out as its gathered copy would be,
    // so the model reads the shard in place; the units only name the bucket, and hold no memory
    int in_place;
    struct unit *top_w, *bottom_w; // the top and bottom buckets' gathered weights
    struct unit *slots;            // (K) the layers' between, slot l % K for layer l
    const size_t *layer_begin;     // the model's (L + 1), for windows into a gathered bucket
    float *host_master; // (the table's total) the whole master weights, after kiln_dp_gather_master
    // --offload=optimizer: this rank's part (optim_elems, at the spans' state offsets) of the f32 master
    // weights and AdamW's moments live in host memory, where the optimizer's pipeline updates them
    int offload, host_threads;
    size_t chunk; // elements a chunk of the pipeline (0: its default)
    int delay_us; // tests: the host's AdamW sleeps this long before each chunk
    struct kiln_offload *off;
    // ZeRO-1/2 with the optimizer on the device: the updated compute weights' gathers, one a bucket, issued
    // after AdamW in the forward's order (bottom bucket first) and waited for by the next forward as it
    // reaches each bucket (the compute stream waits, not the host), so that they run under it; NULL once
    // waited. gather_wait: all waited for at once, right after AdamW (KILN_ZERO_GATHER=wait, a baseline)
    struct kiln_comm_work **wg;
    int gather_wait;
    int poison; // tests: staging filled with NaN before each use (kiln_dp_opts)
};

static void gather_weights(struct kiln_dp *dp, int master);
static void weights_through(struct kiln_dp *dp, size_t limit);
static int seg_order(const struct kiln_dp *dp, int s);

int kiln_dp_external_grads(const struct kiln_dp *dp) {
    return dp->zero >= 2 && !dp->whole;
}

void kiln_dp_model_opts(const struct kiln_dp *dp, struct kiln_model_opts *o) {
    o->optim_elems = dp->optim_elems;
    o->external_grads = kiln_dp_external_grads(dp);
    o->sharded_params = dp->zero == 3;
    o->offload_optimizer = dp->offload;
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

// ZeRO-3's buckets are its gathering units: the last layer with the final norm and head, each layer between
// on its own, and layer 0 with the embeddings (--bucket-mb does not apply).
static void plan_layer_buckets(struct kiln_dp *dp, const struct kiln_param_table *pt) {
    int L = 0;
    for (int i = 0; i < pt->n; i++)
        if (pt->p[i].layer + 1 > L)
            L = pt->p[i].layer + 1;
    dp->b = kiln_xcalloc((size_t)L + 1, sizeof(*dp->b));
    dp->bounds = kiln_xcalloc((size_t)L + 2, sizeof(*dp->bounds));
    size_t hi = pt->total;
    dp->nb = 0;
    dp->bounds[0] = hi;
    for (int l = L - 1; l >= 0 || dp->nb == 0; l--) {
        size_t lo = l <= 0 ? 0 : pt->layer_begin[l];
        dp->b[dp->nb] = (struct bucket){.lo = lo, .hi = hi, .ready_layer = l <= 0 ? -1 : l};
        dp->bounds[++dp->nb] = lo;
        hi = lo;
        if (l <= 0)
            break;
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

// Buckets, ranges and spans for rank `rank` of `world` (no backend memory).
static void plan(struct kiln_dp *dp, const struct kiln_param_table *pt, const struct kiln_dp_opts *o,
                 int world, int rank) {
    dp->zero = o->zero;
    dp->offload = o->offload;
    dp->host_threads = o->host_threads;
    dp->chunk = o->offload_chunk;
    dp->delay_us = o->offload_delay_us;
    dp->poison = o->poison_staging;
    dp->gather_wait = o->gather_wait;
    if (o->zero == 3)
        plan_layer_buckets(dp, pt);
    else
        plan_buckets(dp, pt, o->bucket_mb);
    dp->ahead = 1 + (o->prefetch > 0 ? o->prefetch : 1);
    dp->keep = o->zero == 3 && o->keep_gathered;
    dp->whole = o->zero == 3 && o->accumulate_whole;
    dp->in_place = o->zero == 3 && world == 1 && !o->gather_at_one;
    // the layers between the top and bottom buckets (nb - 2 of them) each keep a slot, or share a ring
    dp->K = dp->keep ? (dp->nb > 3 ? dp->nb - 2 : 1) : 1 + dp->ahead;
    dp->n_ranges = kiln_dp_ranges_for(dp->bounds, dp->nb, world, rank, &dp->ranges);
    size_t state = 0; // where each bucket's slice sits in the rank's shard (the ranges skip empty slices)
    for (int i = 0; i < dp->nb; i++) {
        size_t lo, hi;
        kiln_comm_slice(dp->b[i].hi - dp->b[i].lo, world, rank, &lo, &hi);
        dp->b[i].state_offset = state;
        state += hi - lo;
    }
    size_t owned = 0;
    for (int r = 0; r < dp->n_ranges; r++)
        owned += dp->ranges[r].hi - dp->ranges[r].lo;
    dp->optim_elems = dp->zero ? (owned ? owned : 1) : pt->total;
    plan_spans(dp, pt);
    dp->all_spans = kiln_adamw_table_spans(pt, &dp->n_all_spans);
}

void kiln_dp_create(struct kiln_dp **out, struct kiln_comm *comm, struct kiln_backend *be,
                    const struct kiln_param_table *pt, const struct kiln_dp_opts *o) {
    struct kiln_dp *dp = kiln_xcalloc(1, sizeof(*dp));
    dp->comm = comm;
    dp->be = be;
    plan(dp, pt, o, comm->size, comm->rank);
    for (int i = 0; i < dp->nb; i++)
        dp->b[i].event = be->ops->event_create ? be->ops->event_create(be->ctx) : NULL;
    *out = dp;
}

// the largest bucket between the top and the bottom one (0: none)
static size_t mid_elems(const struct kiln_dp *dp) {
    size_t mid = 0;
    for (int i = 1; i < dp->nb - 1; i++)
        if (dp->b[i].hi - dp->b[i].lo > mid)
            mid = dp->b[i].hi - dp->b[i].lo;
    return mid;
}

void kiln_dp_plan_memory(const struct kiln_param_table *pt, const struct kiln_dp_opts *o, int world, int rank,
                         enum kiln_dtype act, enum kiln_dtype grad, int accum, struct kiln_model_opts *model,
                         struct kiln_dp_mem *out) {
    struct kiln_backend be = {.act_dtype = act, .grad_dtype = grad};
    struct kiln_dp dp = {.be = &be};
    plan(&dp, pt, o, world, rank);
    kiln_dp_model_opts(&dp, model);
    size_t gb = kiln_dtype_bytes(grad), ab = kiln_dtype_bytes(act);
    size_t top = dp.b[0].hi - dp.b[0].lo, bottom = dp.nb > 1 ? dp.b[dp.nb - 1].hi - dp.b[dp.nb - 1].lo : 0;
    size_t mid = mid_elems(&dp), n = dp.optim_elems;
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
    if (dp.offload) // master and moments in f32, and the pipeline's staging (two chunks each way)
        out->host = kiln_offload_host_bytes(n, dp.chunk, grad, act);
    free(dp.b);
    free(dp.bounds);
    free(dp.ranges);
    free(dp.spans);
    free(dp.all_spans);
}

static void unit_free(struct kiln_dp *dp, struct unit *u) {
    kiln_comm_wait(dp->comm, u->work);
    if (u->p)
        dp->be->ops->free(dp->be->ctx, u->p);
    if (u->issued)
        dp->be->ops->event_destroy(dp->be->ctx, u->issued);
}

void kiln_dp_free(struct kiln_dp *dp) {
    if (!dp)
        return;
    kiln_offload_free(dp->off); // (a running step settles first)
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
    struct unit *units[] = {dp->top_w, dp->bottom_w};
    for (int i = 0; i < 2; i++)
        if (units[i] && (i == 0 || units[i] != dp->top_w))
            unit_free(dp, units[i]);
    for (int k = 0; dp->slots && k < dp->K; k++)
        unit_free(dp, &dp->slots[k]);
    free(dp->top_w != dp->bottom_w ? dp->bottom_w : NULL);
    free(dp->top_w);
    free(dp->slots);
    free(dp->host_master);
    free(dp->gaps);
    free(dp->b);
    free(dp->bounds);
    free(dp->ranges);
    free(dp->spans);
    free(dp->all_spans);
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
    int staged = dp->zero >= 2 && !dp->whole;
    char *base = staged ? (char *)b->stage : (char *)dp->buf.grads + b->lo * gb;
    // ZeRO-2: from the staging buffer onto the shard (a later micro-step's first into shard_tmp, then added);
    // whole gradients are reduced once a step, onto the shard
    void *shard = dp->micro == 0 || dp->whole ? dp->shard : dp->shard_tmp;
    KILN_ASSERT(dp->zero < 2 || (base && shard));
    // ZeRO-1: reduce-scattered in place, each rank's slice summed where it lies in the whole buffer (the
    // rest of the buffer is left partial: only the owner's AdamW and the norm read a slice), half the bytes
    // of DDP's all-reduce during the backward
    char *recv = dp->zero >= 2 ? (char *)shard + b->state_offset * gb : dp->zero == 1 ? base + lo * gb : base;
    struct kiln_coll k = {.op = dp->zero >= 1 ? KILN_COLL_REDUCE_SCATTER : KILN_COLL_ALL_REDUCE,
                          .send = base,
                          .recv = recv,
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
    kiln_flight_set_layer(l); // -1: the embeddings' (the flight recorder's "where")
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
            kiln_model_set_grad_window(dp->g, s, (char *)stage + (dp->seg_begin[s] - b->lo) * gb);
}

static int bucket_of(const struct kiln_dp *dp, size_t at) {
    for (int i = 0; i < dp->nb; i++)
        if (at >= dp->b[i].lo && at < dp->b[i].hi)
            return i;
    return dp->nb - 1;
}

// The padding of every bucket: the elements between its tensors (the table aligns each tensor's start), which
// no backward writes. A staging buffer that held another bucket has that bucket's gradients there.
static void plan_gaps(struct kiln_dp *dp, const struct kiln_param_table *pt) {
    dp->gaps = kiln_xcalloc((size_t)pt->n + (size_t)dp->nb + 1, sizeof(*dp->gaps));
    int n = 0;
    for (int i = 0; i < dp->nb; i++) {
        struct bucket *b = &dp->b[i];
        b->gap0 = n;
        size_t at = b->lo; // the tensors are in offset order
        for (int t = 0; t < pt->n; t++) {
            size_t lo = pt->p[t].offset, hi = lo + pt->p[t].count;
            if (hi <= b->lo || lo >= b->hi)
                continue;
            if (lo > at)
                dp->gaps[n++] = (struct gap){at, lo};
            at = hi > at ? hi : at;
        }
        if (at < b->hi)
            dp->gaps[n++] = (struct gap){at, b->hi};
        b->n_gaps = n - b->gap0;
    }
}

// A staging buffer about to take bucket i's gradients: its padding zeroed (tests: everything else NaN first,
// KILN_POISON_STAGING, so that an element the backward does not assign shows).
static void prepare_stage(struct kiln_dp *dp, void *stage, int i) {
    const struct bucket *b = &dp->b[i];
    size_t gb = grad_bytes(dp);
    if (dp->poison) {
        size_t n = (b->hi - b->lo) * gb;
        void *h = kiln_xmalloc(n ? n : 1);
        memset(h, 0xff, n); // all ones: a NaN in f32 and in bf16
        dp->be->ops->upload(dp->be->ctx, stage, h, n);
        free(h);
    }
    for (int k = b->gap0; k < b->gap0 + b->n_gaps; k++)
        dp->be->ops->zero(dp->be->ctx, (char *)stage + (dp->gaps[k].lo - b->lo) * gb,
                          (dp->gaps[k].hi - dp->gaps[k].lo) * gb);
}

// Gives bucket i a staging buffer: the oldest of the shared ones, once its reduction has read it (on the
// GPU the compute stream waits, not the host). The backward assigns every tensor's gradients there on its
// first write of the micro-step (kiln_model_zero_grad); only the padding between tensors, which it never
// writes, is zeroed, so that it sums to zero (a whole bucket's zeroing was 2.6 GB a step at the 1.3B shape).
static void stage_bucket(struct kiln_dp *dp, int i) {
    if (dp->b[i].stage)
        return;
    struct slot *s = &dp->mid[dp->next_slot];
    dp->next_slot = (dp->next_slot + 1) % STAGING_SLOTS;
    if (s->bucket >= 0) {
        struct bucket *old = &dp->b[s->bucket];
        KILN_ASSERT(old->work ||
                    dp->comm->kind == KILN_COMM_SINGLE); // reduced before its slot is wanted again
        kiln_comm_wait_stream(dp->comm, old->work);
        old->work = NULL;
        old->stage = NULL;
    }
    s->bucket = i;
    prepare_stage(dp, s->p, i);
    window_bucket(dp, i, s->p);
}

// Before layer l's backward: its bucket, and layer l-1's (whose output-projection biases this layer's norm
// backward writes), have staging buffers.
static void on_layer_begin(void *user, int l, int recompute) {
    struct kiln_dp *dp = user;
    kiln_flight_set_layer(l);
    if (!recompute || dp->whole)
        return;
    stage_bucket(dp, bucket_of(dp, dp->seg_begin[1 + l]));
    if (l > 0)
        stage_bucket(dp, bucket_of(dp, dp->seg_begin[l]));
}

static void *alloc_or_die(struct kiln_dp *dp, size_t bytes, const char *what) {
    void *p = dp->be->ops->alloc(dp->be->ctx, bytes ? bytes : 16);
    if (!p) {
        fprintf(stderr, "kiln: out of memory on %s allocating ZeRO-%d's %s (%.2f GiB)\n", dp->be->name,
                dp->zero, what, bytes / 1073741824.0);
        kiln_comm_abort_job(1);
    }
    return p;
}

// ---- ZeRO-3: gathering the compute weights ----

// With the optimizer offloaded: the running step has taken bucket i's slice up (the host waits).
static void bucket_updated(struct kiln_dp *dp, int i) {
    if (!kiln_offload_running(dp->off))
        return;
    size_t lo, hi;
    kiln_comm_slice(dp->b[i].hi - dp->b[i].lo, dp->comm->size, dp->comm->rank, &lo, &hi);
    kiln_offload_wait(dp->off, kiln_offload_chunks_over(dp->off, dp->b[i].state_offset, hi - lo));
}

// Issues the gather of bucket i's compute weights into u (nothing when u holds them already). It is ordered
// after everything the compute stream was given so far: the update of the shard, and the last reads of what
// the slot held before. Read in place, there is nothing to gather: u names the bucket for unit_use.
static void unit_gather(struct kiln_dp *dp, struct unit *u, int i) {
    if (u->bucket == i && u->valid)
        return;
    if (dp->in_place) {
        u->bucket = i;
        u->valid = 1;
        return;
    }
    // an offloaded step has taken this bucket's shard up
    bucket_updated(dp, i);
    kiln_comm_wait_stream(dp->comm, u->work); // a gather never waited for (a slot is only reused once read)
    const struct bucket *b = &dp->b[i];
    size_t ab = kiln_dtype_bytes(dp->be->act_dtype), lo, hi;
    kiln_comm_slice(b->hi - b->lo, dp->comm->size, dp->comm->rank, &lo, &hi);
    struct kiln_coll k = {.op = KILN_COLL_ALL_GATHER,
                          .send = (const char *)dp->buf.weights + b->state_offset * ab,
                          .recv = u->p,
                          .count = b->hi - b->lo,
                          .dtype = dp->be->act_dtype,
                          .device = dp->be->device_memory};
    if (u->issued)
        dp->be->ops->event_record(dp->be->ctx, u->issued);
    u->work = kiln_comm_submit(dp->comm, &k, u->issued);
    u->bucket = i;
    u->valid = 1;
}

// Points the model's weight windows of every segment in u's bucket at u, once the gather is done (the compute
// stream waits, not the host). Read in place, they point at the bucket's shard, once the offloaded step has
// taken it up (the host waits, as DDP's hooks do); without offload AdamW wrote it on the compute stream,
// before the kernels that read it.
static void unit_use(struct kiln_dp *dp, struct unit *u) {
    kiln_comm_wait_stream(dp->comm, u->work);
    u->work = NULL;
    const struct bucket *b = &dp->b[u->bucket];
    size_t ab = kiln_dtype_bytes(dp->be->act_dtype);
    char *at = u->p;
    if (dp->in_place) {
        bucket_updated(dp, u->bucket);
        at = (char *)dp->buf.weights + b->state_offset * ab;
    }
    for (int s = 0; s < dp->n_seg; s++)
        if (dp->seg_begin[s] >= b->lo && dp->seg_begin[s] < b->hi)
            kiln_model_set_weight_window(dp->g, s, at + (dp->seg_begin[s] - b->lo) * ab);
}

// Layer l's unit: the bottom or top bucket's, or its slot in the ring.
static struct unit *layer_unit(struct kiln_dp *dp, int l, int *bucket) {
    *bucket = bucket_of(dp, dp->seg_begin[1 + l]);
    if (*bucket == dp->nb - 1)
        return dp->bottom_w;
    if (*bucket == 0)
        return dp->top_w;
    return &dp->slots[l % dp->K];
}

static void want_layer(struct kiln_dp *dp, int l) { // a prefetch
    int i;
    struct unit *u = layer_unit(dp, l, &i);
    unit_gather(dp, u, i);
}

static void have_layer(struct kiln_dp *dp, int l) {
    int i;
    struct unit *u = layer_unit(dp, l, &i);
    unit_gather(dp, u, i);
    unit_use(dp, u);
}

// Before the embedding: the top and bottom buckets (gathered once a step), and the first layers' prefetch.
static void on_forward_begin(void *user) {
    struct kiln_dp *dp = user;
    kiln_flight_set_layer(-1);
    unit_gather(dp, dp->bottom_w, dp->nb - 1);
    unit_gather(dp, dp->top_w, 0);
    for (int j = 1; j < dp->L && j <= dp->ahead; j++)
        want_layer(dp, j);
    unit_use(dp, dp->bottom_w);
    if (dp->top_w != dp->bottom_w)
        unit_use(dp, dp->top_w);
}

// Layer l's forward reads its weights and the next layer's first norm; its backward (and recompute) its own.
// The ring holds K = 2 + prefetch layers, so each prefetch goes into the slot of a layer that is done.
static void on_layer_begin_zero3(void *user, int l, int recompute) {
    struct kiln_dp *dp = user;
    kiln_flight_set_layer(l);
    if (!recompute) {
        have_layer(dp, l);
        if (l + 1 < dp->L)
            have_layer(dp, l + 1);
        for (int j = l + 2; j < dp->L && j <= l + dp->ahead; j++)
            want_layer(dp, j);
        return;
    }
    on_layer_begin(user, l, recompute); // the gradients' staging
    have_layer(dp, l);
    for (int j = l - 1; j >= 0 && j >= l - (dp->ahead - 1); j--)
        want_layer(dp, j);
}

// The shards changed (AdamW, or new parameters): every gathered copy is stale.
static void invalidate_units(struct kiln_dp *dp) {
    struct unit *units[] = {dp->top_w, dp->bottom_w};
    for (int i = 0; i < 2; i++)
        if (units[i])
            units[i]->valid = 0;
    for (int k = 0; dp->slots && k < dp->K; k++)
        dp->slots[k].valid = 0;
}

// The whole master weights to the shards (init, resume): this rank uploads its slices.
static void on_params_set(void *user, const float *host) {
    struct kiln_dp *dp = user;
    if (dp->offload) {
        kiln_offload_set_master(dp->off, host);
        invalidate_units(dp);
        return;
    }
    const struct kiln_ops *ops = dp->be->ops;
    for (int r = 0; r < dp->n_ranges; r++) {
        const struct kiln_dp_range *q = &dp->ranges[r];
        size_t n = q->hi - q->lo;
        ops->upload(dp->be->ctx, dp->buf.params + q->state_offset, host + q->lo, n * sizeof(float));
        if (dp->buf.weights != dp->buf.params)
            ops->upload_f32(dp->be->ctx,
                            (char *)dp->buf.weights + q->state_offset * kiln_dtype_bytes(dp->be->act_dtype),
                            dp->be->act_dtype, host + q->lo, n);
    }
    invalidate_units(dp);
}

// The whole master weights, as the last kiln_dp_gather_master left them; the host copy goes with the call
// (the caller has its own; a 7B model's would be 28 GB held between checkpoints).
static void on_params_get(void *user, float *host) {
    struct kiln_dp *dp = user;
    kiln_offload_settle(dp->off);
    if (dp->offload && !dp->zero) { // the host master is whole
        memcpy(host, kiln_offload_master(dp->off), dp->bounds[0] * sizeof(float));
        return;
    }
    KILN_ASSERT(dp->host_master); // kiln_dp_gather_master first: a collective, which this is not
    memcpy(host, dp->host_master, dp->bounds[0] * sizeof(float));
    free(dp->host_master);
    dp->host_master = NULL;
}

// ZeRO-3's (and an offloaded ZeRO-1/2's) kiln_dp_gather_master: each rank's slices of the f32 master weights,
// gathered into host memory.
static void gather_master_host(struct kiln_dp *dp) {
    size_t total = dp->bounds[0];
    if (!dp->host_master)
        dp->host_master = kiln_xmalloc(total * sizeof(float));
    struct kiln_comm_work **w = kiln_xcalloc((size_t)dp->nb, sizeof(*w));
    for (int i = 0; i < dp->nb; i++) {
        const struct bucket *b = &dp->b[i];
        size_t lo, hi;
        kiln_comm_slice(b->hi - b->lo, dp->comm->size, dp->comm->rank, &lo, &hi);
        float *at = dp->host_master + b->lo;
        size_t so = b->state_offset;
        if (dp->offload)
            memcpy(at + lo, kiln_offload_master(dp->off) + so, (hi - lo) * sizeof(float));
        else
            dp->be->ops->download(dp->be->ctx, at + lo, dp->buf.params + so, (hi - lo) * sizeof(float));
        struct kiln_coll k = {.op = KILN_COLL_ALL_GATHER,
                              .send = at + lo,
                              .recv = at,
                              .count = b->hi - b->lo,
                              .dtype = KILN_F32,
                              .device = 0};
        w[i] = kiln_comm_submit(dp->comm, &k, NULL);
    }
    for (int i = 0; i < dp->nb; i++)
        kiln_comm_wait(dp->comm, w[i]);
    free(w);
}

// ---- --offload=optimizer: AdamW on the host (optim/offload.h) ----

// The ranges of the flat buffer this rank updates, with their place in the host buffers: its slices under
// ZeRO, everything (state offset = offset) under DDP.
static const struct kiln_dp_range *update_ranges(const struct kiln_dp *dp, int *n,
                                                 struct kiln_dp_range *all) {
    if (dp->zero) {
        *n = dp->n_ranges;
        return dp->ranges;
    }
    *all = (struct kiln_dp_range){0, dp->bounds[0], 0};
    *n = 1;
    return all;
}

// DDP's offloaded master weights are whole: the model initializes them in place.
static float *on_params_buffer(void *user) {
    struct kiln_dp *dp = user;
    return dp->offload && !dp->zero ? kiln_offload_master(dp->off) : NULL;
}

static void on_optim_get(void *user, float *m, float *v) {
    struct kiln_dp *dp = user;
    float *hm, *hv;
    kiln_offload_settle(dp->off);
    kiln_offload_moments(dp->off, &hm, &hv);
    memcpy(m, hm, dp->optim_elems * sizeof(float));
    memcpy(v, hv, dp->optim_elems * sizeof(float));
}

static void on_optim_set(void *user, const float *m, const float *v) {
    struct kiln_dp *dp = user;
    float *hm, *hv;
    kiln_offload_settle(dp->off);
    kiln_offload_moments(dp->off, &hm, &hv);
    memcpy(hm, m, dp->optim_elems * sizeof(float));
    memcpy(hv, v, dp->optim_elems * sizeof(float));
}

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
        invalidate_units(dp); // each gather waits for its bucket's chunks (unit_gather)
    } else if (dp->zero) {    // the owners' weights are gathered by a collective of the training thread's
        kiln_offload_settle(dp->off);
        gather_weights(dp, 0);
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
// (DDP: the whole buffer), or the owned ranges (ZeRO), each first read at its least segment's order.
static int plan_pieces(const struct kiln_dp *dp, struct kiln_offload_piece **out) {
    struct kiln_dp_range all;
    int n;
    const struct kiln_dp_range *q = update_ranges(dp, &n, &all);
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
    struct kiln_offload_opts o = {.elems = dp->optim_elems,
                                  .total = dp->bounds[0],
                                  .pieces = pieces,
                                  .n_pieces = n_pieces,
                                  .spans = dp->zero ? dp->spans : dp->all_spans,
                                  .n_spans = dp->zero ? dp->n_spans : dp->n_all_spans,
                                  .grads = dp->zero >= 2 ? dp->shard : dp->buf.grads,
                                  .grads_compact = dp->zero >= 2,
                                  .weights = dp->buf.weights,
                                  .weights_compact = dp->zero == 3,
                                  .chunk = dp->chunk,
                                  .host_threads = dp->host_threads,
                                  .delay_us = dp->delay_us};
    kiln_offload_create(&dp->off, dp->be, &o);
    free(pieces);
    h->params_buffer = on_params_buffer;
    h->params_get = on_params_get;
    h->params_set = on_params_set;
    h->optim_get = on_optim_get;
    h->optim_set = on_optim_set;
}

static void unit_alloc(struct kiln_dp *dp, struct unit *u, size_t elems) {
    *u = (struct unit){.bucket = -1};
    if (dp->in_place)
        return;
    u->p = alloc_or_die(dp, elems * kiln_dtype_bytes(dp->be->act_dtype), "gathered weights");
    u->issued = dp->be->ops->event_create ? dp->be->ops->event_create(dp->be->ctx) : NULL;
}

static void attach_zero3(struct kiln_dp *dp, struct kiln_model_hooks *h) {
    dp->L = dp->n_seg - 2;
    size_t mid = mid_elems(dp);
    dp->top_w = kiln_xcalloc(1, sizeof(*dp->top_w));
    unit_alloc(dp, dp->top_w, dp->b[0].hi - dp->b[0].lo);
    if (dp->nb > 1) {
        dp->bottom_w = kiln_xcalloc(1, sizeof(*dp->bottom_w));
        unit_alloc(dp, dp->bottom_w, dp->b[dp->nb - 1].hi - dp->b[dp->nb - 1].lo);
    } else {
        dp->bottom_w = dp->top_w;
    }
    if (mid) {
        dp->slots = kiln_xcalloc((size_t)dp->K, sizeof(*dp->slots));
        for (int k = 0; k < dp->K; k++)
            unit_alloc(dp, &dp->slots[k], mid);
    }
    h->forward_begin = on_forward_begin;
    h->layer_begin = on_layer_begin_zero3;
    h->params_get = on_params_get;
    h->params_set = on_params_set;
}

// Issues the in-place gathers, from their owners, of every bucket's compute weights (or, with master = 1, its
// f32 master weights), the bottom bucket first: the forward's order. Bucket i's work goes to w[i].
static void issue_gathers(struct kiln_dp *dp, int master, struct kiln_comm_work **w) {
    void *base = master ? (void *)dp->buf.params : dp->buf.weights;
    enum kiln_dtype dt = master ? KILN_F32 : dp->be->act_dtype;
    size_t eb = kiln_dtype_bytes(dt);
    for (int i = dp->nb - 1; i >= 0; i--) {
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
}

// The same, waited for before anything else runs on the compute stream.
static void gather_weights(struct kiln_dp *dp, int master) {
    struct kiln_comm_work **w = kiln_xcalloc((size_t)dp->nb, sizeof(*w));
    issue_gathers(dp, master, w);
    for (int i = 0; i < dp->nb; i++)
        kiln_comm_wait_stream(dp->comm, w[i]);
    free(w);
}

// The next forward reaches the flat elements below limit: the compute stream waits for the weight gathers of
// the buckets that hold any of them (SIZE_MAX: every one, before the weights are read other than by the
// forward, or written).
static void weights_through(struct kiln_dp *dp, size_t limit) {
    for (int i = 0; dp->wg && i < dp->nb; i++)
        if (dp->wg[i] && dp->b[i].lo < limit) {
            kiln_comm_wait_stream(dp->comm, dp->wg[i]);
            dp->wg[i] = NULL;
        }
}

// ZeRO-1/2 with the optimizer on the device: the forward's start reads the embeddings and layer 0's first
// norm (segments 0 and 1), layer l's forward its own weights and layer l + 1's first norm (segment 2 + l; the
// last layer's is the top: the final norm and head). ZeRO-2's staging hooks in before each layer's backward.
static void on_forward_begin_gathered(void *user) {
    struct kiln_dp *dp = user;
    kiln_flight_set_layer(-1);
    weights_through(dp, dp->seg_begin[2]);
}

static void on_layer_begin_gathered(void *user, int l, int recompute) {
    struct kiln_dp *dp = user;
    kiln_flight_set_layer(l);
    if (!recompute)
        weights_through(dp, dp->seg_begin[3 + l]);
    else if (dp->zero >= 2 && !dp->whole)
        on_layer_begin(user, l, recompute);
}

void kiln_dp_attach(struct kiln_dp *dp, struct kiln_model *g) {
    dp->g = g;
    kiln_model_buffers(g, &dp->buf);
    KILN_ASSERT(dp->buf.optim_elems == dp->optim_elems);
    KILN_ASSERT(kiln_model_params(g)->total == dp->bounds[0]); // planned on this layout
    struct kiln_model_hooks h = {
        .user = dp, .layer_backward_end = on_layer_backward_end, .embed_backward_end = on_embed_backward_end};
    if (dp->zero >= 2 && dp->whole) {
        dp->n_seg = kiln_model_grad_segments(g, &dp->seg_begin);
        dp->shard = alloc_or_die(dp, dp->optim_elems * grad_bytes(dp), "gradient shard");
    } else if (dp->zero >= 2) {
        KILN_ASSERT(!dp->buf.grads); // the model was created with external_grads
        dp->n_seg = kiln_model_grad_segments(g, &dp->seg_begin);
        size_t gb = grad_bytes(dp), mid = mid_elems(dp);
        dp->top = alloc_or_die(dp, (dp->b[0].hi - dp->b[0].lo) * gb, "staging buffer");
        dp->bottom = dp->nb > 1 ? alloc_or_die(dp, (dp->b[dp->nb - 1].hi - dp->b[dp->nb - 1].lo) * gb,
                                               "staging buffer")
                                : dp->top;
        for (int k = 0; k < STAGING_SLOTS; k++)
            dp->mid[k] =
                (struct slot){.p = mid ? alloc_or_die(dp, mid * gb, "staging buffer") : NULL, .bucket = -1};
        dp->shard = alloc_or_die(dp, dp->optim_elems * gb, "gradient shard");
        plan_gaps(dp, kiln_model_params(g));
        h.layer_begin = on_layer_begin;
    }
    if ((dp->zero == 1 || dp->zero == 2) && !dp->offload) {
        if (!dp->seg_begin)
            dp->n_seg = kiln_model_grad_segments(g, &dp->seg_begin);
        dp->wg = kiln_xcalloc((size_t)dp->nb, sizeof(*dp->wg));
        h.forward_begin = on_forward_begin_gathered;
        h.layer_begin = on_layer_begin_gathered;
    }
    if (dp->zero == 3)
        attach_zero3(dp, &h);
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
    if (micro > 0 && !dp->shard_tmp) {
        KILN_ASSERT(dp->be->grad_dtype == KILN_F32); // accumulation keeps fp32 gradients (config.c)
        dp->shard_tmp = alloc_or_die(dp, dp->optim_elems * sizeof(float), "gradient shard");
    }
    for (int i = 0; i < dp->nb; i++)
        dp->b[i].stage = NULL;
    for (int k = 0; k < STAGING_SLOTS; k++)
        dp->mid[k].bucket = -1;
    prepare_stage(dp, dp->top, 0); // (a few small zeroings: each holds one bucket, always the same)
    if (dp->nb > 1)
        prepare_stage(dp, dp->bottom, dp->nb - 1);
    window_bucket(dp, 0, dp->top); // written from the forward on (the classifier's gradients)
    window_bucket(dp, dp->nb - 1, dp->bottom);
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

double kiln_dp_grad_norm(struct kiln_dp *dp, double *also) {
    kiln_flight_set_layer(-1);
    // this rank's slices, in bucket order, then the ranks' sums: the same additions at every --zero level
    double sum = 0;
    size_t gb = grad_bytes(dp);
    for (int r = 0; r < dp->n_ranges; r++) { // ZeRO-2's shard holds the same slices, compact, in this order
        const struct kiln_dp_range *q = &dp->ranges[r];
        const char *at = dp->zero >= 2 ? (const char *)dp->shard + q->state_offset * gb
                                       : (const char *)dp->buf.grads + q->lo * gb;
        sum += dp->be->ops->sum_squares(dp->be->ctx, at, q->hi - q->lo);
    }
    double v[2] = {sum, also ? *also : 0};
    kiln_comm_all_reduce_host(dp->comm, v, 2, KILN_F64, KILN_RED_SUM);
    if (also)
        *also = v[1];
    return sqrt(v[0]);
}

void kiln_dp_adamw(struct kiln_dp *dp, const struct kiln_adamw_hparams *h, double grad_norm) {
    // the last step's gathers read this rank's slices, which AdamW writes (a forward waited for every one;
    // a step without one has not)
    weights_through(dp, SIZE_MAX);
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
    kiln_adamw_step(dp->be, &b, dp->spans, dp->n_spans, h, grad_norm);
    if (dp->zero == 3) { // gathered again as the next forward needs them
        invalidate_units(dp);
        return;
    }
    issue_gathers(dp, 0, dp->wg);
    if (dp->gather_wait)
        weights_through(dp, SIZE_MAX);
}

void kiln_dp_gather_master(struct kiln_dp *dp) {
    kiln_offload_settle(dp->off);
    weights_through(dp, SIZE_MAX);
    if (dp->offload && dp->zero)
        gather_master_host(dp);
    else if (dp->offload)
        return; // the host master is whole
    else if (dp->zero == 3)
        gather_master_host(dp);
    else if (dp->zero && dp->buf.weights != dp->buf.params)
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

int kiln_dp_host_moments(const struct kiln_dp *dp, const float **m, const float **v) {
    float *hm = NULL, *hv = NULL;
    if (dp->off)
        kiln_offload_moments(dp->off, &hm, &hv);
    *m = hm;
    *v = hv;
    return dp->offload;
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
    weights_through(dp, SIZE_MAX);
}

double kiln_dp_wait_s(const struct kiln_dp *dp) {
    return dp->comm->wait_s;
}
