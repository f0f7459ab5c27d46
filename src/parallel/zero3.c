// ZeRO-3's weights: each bucket (a layer; the top and bottom ones with the head and the embeddings) is
// all-gathered from its owners just before the model reads it, into the top and bottom buckets' own buffers
// (kept for the step) and a ring of slots for the layers between, --prefetch layers ahead on the comm stream;
// the model's weight windows point at the gathered copy. At world size 1 the shard is the whole bucket and
// the model reads it in place. See dp.h.
#include "parallel/dp_internal.h"

#include <stdlib.h>
#include <string.h>

#include "optim/offload.h"
#include "parallel/comm/flight.h"

// With the optimizer offloaded: the running step has taken bucket i's slice up (the host waits).
static void bucket_updated(struct kiln_dp *dp, int i) {
    if (!kiln_offload_running(dp->off))
        return;
    const struct kiln_shard_bucket *sb = &dp->sh.b[i];
    kiln_offload_wait(dp->off,
                      kiln_offload_chunks_over(dp->off, sb->state_offset, sb->slice_hi - sb->slice_lo));
}

// ---- the FP8 all-gather (dp_internal.h's struct dp_fp8) ----------------------------------------------------

static int fp8_bucket(const struct kiln_dp *dp, int i) {
    return dp->fp8 && i > 0 && i < dp->nb - 1;
}

// The step's codes and small tensors, once the weights are updated (see struct dp_fp8), on the compute stream
// and the communicator's; the layers' gathers follow in stream order
static void fp8_prepare(struct kiln_dp *dp) {
    struct dp_fp8 *f = dp->fp8;
    const struct kiln_ops *o = dp->be->ops;
    void *ctx = dp->be->ctx;
    size_t ab = kiln_dtype_bytes(dp->be->act_dtype);
    const char *w = dp->buf.weights;
    kiln_comm_wait_stream(dp->comm, f->s_work); // (the last step's, never waited for where no layer read it)
    o->zero(ctx, f->S, f->small_elems * ab);
    o->zero(ctx, f->amax, (size_t)f->ng * sizeof(float));
    for (int i = 0; i < f->nseg; i++) {
        const struct dp_fp8_seg *sg = &f->seg[i];
        size_t n = sg->hi - sg->lo;
        if (sg->g < 0) {
            o->copy(ctx, (char *)f->S + sg->at * ab, w + sg->so * ab, n * ab);
        } else {
            struct kiln_amax_args a = {.amax = &f->amax[sg->g], .x = w + sg->so * ab, .rows = 1, .cols = (int)n,
                                       .per = KILN_FP8_TENSOR};
            o->amax(ctx, &a);
        }
    }
    if (f->ev)
        o->event_record(ctx, f->ev);
    struct kiln_coll sum = {.op = KILN_COLL_ALL_REDUCE,
                            .send = f->S,
                            .recv = f->S,
                            .count = f->small_elems,
                            .dtype = dp->be->act_dtype,
                            .red = KILN_RED_SUM,
                            .device = dp->be->device_memory};
    f->s_work = kiln_comm_submit(dp->comm, &sum, f->ev);
    struct kiln_coll mx = {.op = KILN_COLL_ALL_REDUCE,
                           .send = f->amax,
                           .recv = f->amax,
                           .count = (size_t)f->ng,
                           .dtype = KILN_F32,
                           .red = KILN_RED_MAX,
                           .device = dp->be->device_memory};
    kiln_comm_wait_stream(dp->comm, kiln_comm_submit(dp->comm, &mx, f->ev));
    // every group's inverse scale (one cast of a row a group), then this rank's codes
    struct kiln_fp8_cast_args u = {.out = f->unit_q,
                                   .x = f->unit_x,
                                   .amax = f->amax,
                                   .scale_inv = f->sinv,
                                   .rows = f->ng,
                                   .cols = 1,
                                   .fmt = KILN_FP8_E4M3,
                                   .per = KILN_FP8_ROWS};
    o->fp8_cast(ctx, &u);
    for (int i = 0; i < f->nseg; i++) {
        const struct dp_fp8_seg *sg = &f->seg[i];
        if (sg->g < 0)
            continue;
        // in up to three casts: the elements before an 8-element boundary, the whole eights (16-byte loads
        // on a GPU), the rest
        size_t so = sg->so, n = sg->hi - sg->lo, head = (8 - so % 8) % 8;
        head = head < n ? head : n;
        size_t body = (n - head) / 8 * 8, part[3] = {head, body, n - head - body};
        for (int j = 0; j < 3; so += part[j], j++) {
            if (!part[j])
                continue;
            struct kiln_fp8_cast_args c = {.out = f->q + so,
                                           .x = w + so * ab,
                                           .amax = &f->amax[sg->g],
                                           .rows = 1,
                                           .cols = (int)part[j],
                                           .fmt = KILN_FP8_E4M3,
                                           .per = KILN_FP8_TENSOR};
            o->fp8_cast(ctx, &c);
        }
    }
    f->ready = 1;
}

int kiln_dp_fp8_weight(void *user, const void *w, size_t n, const uint8_t **codes, const float **scale_inv) {
    struct kiln_dp *dp = user;
    struct dp_fp8 *f = dp->fp8;
    if (!f)
        return -1;
    size_t ab = kiln_dtype_bytes(dp->be->act_dtype);
    for (int k = 0; k < dp->K; k++) {
        struct unit *u = &dp->slots[k];
        if (!u->valid || !u->q || !fp8_bucket(dp, u->bucket))
            continue;
        const struct kiln_shard_bucket *sb = &dp->sh.b[u->bucket];
        const char *p = u->p;
        if ((const char *)w < p || (const char *)w >= p + (sb->hi - sb->lo) * ab)
            continue;
        size_t off = (size_t)((const char *)w - p) / ab, at = sb->lo + off;
        int lo = 0, hi = f->ng - 1; // the group that starts at `at`
        while (lo <= hi) {
            int m = (lo + hi) / 2;
            if (f->grp[m].lo < at)
                lo = m + 1;
            else if (f->grp[m].lo > at)
                hi = m - 1;
            else {
                if (n > f->grp[m].hi - f->grp[m].lo)
                    return -1;
                *codes = u->q + off;
                *scale_inv = &f->sinv[m];
                return 0;
            }
        }
        return -1;
    }
    return -1;
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
    const struct kiln_shard_bucket *sb = &dp->sh.b[i];
    size_t ab = kiln_dtype_bytes(dp->be->act_dtype);
    struct kiln_coll k = {.op = KILN_COLL_ALL_GATHER,
                          .send = (const char *)dp->buf.weights + sb->state_offset * ab,
                          .recv = u->p,
                          .count = sb->hi - sb->lo,
                          .dtype = dp->be->act_dtype,
                          .device = dp->be->device_memory};
    if (fp8_bucket(dp, i)) { // the codes (the small tensors come from the step's all-reduced copy)
        if (!dp->fp8->ready)
            fp8_prepare(dp);
        k.send = dp->fp8->q + sb->state_offset;
        k.recv = u->q;
        k.dtype = KILN_U8;
    }
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
    const struct kiln_shard_bucket *sb = &dp->sh.b[u->bucket];
    size_t ab = kiln_dtype_bytes(dp->be->act_dtype);
    char *at = u->p;
    if (dp->in_place) {
        bucket_updated(dp, u->bucket);
        at = (char *)dp->buf.weights + sb->state_offset * ab;
    }
    if (fp8_bucket(dp, u->bucket)) { // the layer's small tensors into place beside its codes
        struct dp_fp8 *f = dp->fp8;
        kiln_comm_wait_stream(dp->comm, f->s_work);
        f->s_work = NULL;
        for (int j = 0; j < f->nsmall; j++)
            if (f->small[j].lo >= sb->lo && f->small[j].lo < sb->hi)
                dp->be->ops->copy(dp->be->ctx, at + (f->small[j].lo - sb->lo) * ab,
                                  (const char *)f->S + f->small[j].at * ab, f->small[j].n * ab);
    }
    for (int s = 0; s < dp->n_seg; s++)
        if (dp->seg_begin[s] >= sb->lo && dp->seg_begin[s] < sb->hi)
            kiln_model_set_weight_window(dp->g, s, at + (dp->seg_begin[s] - sb->lo) * ab);
}

// Layer l's unit: the bottom or top bucket's, or its slot in the ring.
static struct unit *layer_unit(struct kiln_dp *dp, int l, int *bucket) {
    *bucket = dp_bucket_of_seg(dp, 1 + l);
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
static void on_layer_begin(void *user, int l, int recompute) {
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
    dp_stage_layer(dp, l, recompute); // the gradients' staging
    have_layer(dp, l);
    for (int j = l - 1; j >= 0 && j >= l - (dp->ahead - 1); j--)
        want_layer(dp, j);
}

void dp_invalidate_units(struct kiln_dp *dp) {
    if (dp->fp8)
        dp->fp8->ready = 0;
    struct unit *units[] = {dp->top_w, dp->bottom_w};
    for (int i = 0; i < 2; i++)
        if (units[i])
            units[i]->valid = 0;
    for (int k = 0; dp->slots && k < dp->K; k++)
        dp->slots[k].valid = 0;
}

static void unit_alloc(struct kiln_dp *dp, struct unit *u, size_t elems) {
    *u = (struct unit){.bucket = -1};
    if (dp->in_place)
        return;
    u->p = dp_alloc_or_die(dp, elems * kiln_dtype_bytes(dp->be->act_dtype), "gathered weights");
    u->issued = dp->be->ops->event_create ? dp->be->ops->event_create(dp->be->ctx) : NULL;
}

static void unit_free(struct kiln_dp *dp, struct unit *u) {
    kiln_comm_wait(dp->comm, u->work);
    if (u->p)
        dp->be->ops->free(dp->be->ctx, u->p);
    if (u->issued)
        dp->be->ops->event_destroy(dp->be->ctx, u->issued);
}

// The FP8 all-gather's plan (the groups, this rank's pieces, the small tensors) and memory
static void fp8_attach(struct kiln_dp *dp) {
    const struct kiln_param_table *pt = kiln_model_params(dp->g);
    const int *grp = dp->fp8_groups;
    size_t lo = dp->nb > 2 ? dp->sh.b[dp->nb - 2].lo : 0, hi = dp->nb > 2 ? dp->sh.b[1].hi : 0; // the layers'
    struct dp_fp8 *f = kiln_xcalloc(1, sizeof(*f));
    f->grp = kiln_xcalloc((size_t)pt->n + 1, sizeof(*f->grp));
    f->small = kiln_xcalloc((size_t)pt->n + 1, sizeof(*f->small));
    for (int i = 0; i < pt->n; i++) { // (the table is in offset order)
        const struct kiln_param *p = &pt->p[i];
        if (p->offset < lo || p->offset >= hi)
            continue;
        if (grp[i] < 0) {
            f->small[f->nsmall++] = (struct dp_fp8_small){p->offset, p->count, f->small_elems};
            f->small_elems += p->count;
        } else if (grp[i] == i) {
            f->grp[f->ng++] = (struct dp_fp8_group){p->offset, p->offset + p->count};
        } else { // a tensor that joins the group before it
            KILN_ASSERT(f->ng > 0 && f->grp[f->ng - 1].hi == p->offset);
            f->grp[f->ng - 1].hi = p->offset + p->count;
        }
    }
    // this rank's pieces: its ranges in the layers' buckets, cut to the groups and the small tensors
    f->seg = kiln_xcalloc((size_t)(f->ng + f->nsmall) + 1, sizeof(*f->seg));
    for (int r = 0; r < dp->sh.n_ranges; r++) {
        const struct kiln_dp_range *rg = &dp->sh.ranges[r];
        for (int g = 0; g < f->ng; g++) {
            size_t a = rg->lo > f->grp[g].lo ? rg->lo : f->grp[g].lo, b = rg->hi < f->grp[g].hi ? rg->hi : f->grp[g].hi;
            if (a < b)
                f->seg[f->nseg++] = (struct dp_fp8_seg){g, a, b, rg->state_offset + (a - rg->lo), 0};
        }
        for (int j = 0; j < f->nsmall; j++) {
            size_t s0 = f->small[j].lo, s1 = s0 + f->small[j].n;
            size_t a = rg->lo > s0 ? rg->lo : s0, b = rg->hi < s1 ? rg->hi : s1;
            if (a < b)
                f->seg[f->nseg++] =
                    (struct dp_fp8_seg){-1, a, b, rg->state_offset + (a - rg->lo), f->small[j].at + (a - s0)};
        }
    }
    size_t ab = kiln_dtype_bytes(dp->be->act_dtype), ng = (size_t)(f->ng ? f->ng : 1);
    f->q = dp_alloc_or_die(dp, dp->optim_elems, "FP8 codes of the shard");
    f->S = dp_alloc_or_die(dp, (f->small_elems ? f->small_elems : 1) * ab, "layers' small tensors");
    f->amax = dp_alloc_or_die(dp, 2 * ng * sizeof(float), "FP8 scales");
    f->sinv = f->amax + ng;
    f->unit_x = dp_alloc_or_die(dp, ng * ab, "FP8 scales");
    dp->be->ops->zero(dp->be->ctx, f->unit_x, ng * ab);
    f->unit_q = dp_alloc_or_die(dp, ng, "FP8 scales");
    f->ev = dp->be->ops->event_create ? dp->be->ops->event_create(dp->be->ctx) : NULL;
    dp->fp8 = f;
    size_t mid = kiln_shard_mid_elems(&dp->sh);
    for (int k = 0; dp->slots && k < dp->K; k++)
        dp->slots[k].q = dp_alloc_or_die(dp, mid, "gathered FP8 codes");
}

static void fp8_free(struct kiln_dp *dp) {
    struct dp_fp8 *f = dp->fp8;
    if (!f)
        return;
    kiln_comm_wait(dp->comm, f->s_work);
    void *bufs[] = {f->q, f->S, f->amax, f->unit_x, f->unit_q};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        dp->be->ops->free(dp->be->ctx, bufs[i]);
    if (f->ev)
        dp->be->ops->event_destroy(dp->be->ctx, f->ev);
    free(f->grp);
    free(f->seg);
    free(f->small);
    free(f);
    dp->fp8 = NULL;
}

void dp_attach_zero3(struct kiln_dp *dp, struct kiln_model_hooks *h) {
    dp->L = dp->n_seg - 2;
    size_t mid = kiln_shard_mid_elems(&dp->sh);
    const struct kiln_shard_bucket *top = &dp->sh.b[0], *bottom = &dp->sh.b[dp->nb - 1];
    dp->top_w = kiln_xcalloc(1, sizeof(*dp->top_w));
    unit_alloc(dp, dp->top_w, top->hi - top->lo);
    if (dp->nb > 1) {
        dp->bottom_w = kiln_xcalloc(1, sizeof(*dp->bottom_w));
        unit_alloc(dp, dp->bottom_w, bottom->hi - bottom->lo);
    } else {
        dp->bottom_w = dp->top_w;
    }
    if (mid) {
        dp->slots = kiln_xcalloc((size_t)dp->K, sizeof(*dp->slots));
        for (int k = 0; k < dp->K; k++)
            unit_alloc(dp, &dp->slots[k], mid);
    }
    if (dp->fp8_groups && dp->slots)
        fp8_attach(dp);
    h->forward_begin = on_forward_begin;
    h->layer_begin = on_layer_begin;
}

void dp_free_zero3(struct kiln_dp *dp) {
    struct unit *units[] = {dp->top_w, dp->bottom_w};
    for (int i = 0; i < 2; i++)
        if (units[i] && (i == 0 || units[i] != dp->top_w))
            unit_free(dp, units[i]);
    for (int k = 0; dp->slots && k < dp->K; k++) {
        unit_free(dp, &dp->slots[k]);
        if (dp->slots[k].q)
            dp->be->ops->free(dp->be->ctx, dp->slots[k].q);
    }
    fp8_free(dp); // (after the units' gathers, which read its codes)
    free(dp->top_w != dp->bottom_w ? dp->bottom_w : NULL);
    free(dp->top_w);
    free(dp->slots);
}
