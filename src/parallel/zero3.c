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
    h->forward_begin = on_forward_begin;
    h->layer_begin = on_layer_begin;
}

void dp_free_zero3(struct kiln_dp *dp) {
    struct unit *units[] = {dp->top_w, dp->bottom_w};
    for (int i = 0; i < 2; i++)
        if (units[i] && (i == 0 || units[i] != dp->top_w))
            unit_free(dp, units[i]);
    for (int k = 0; dp->slots && k < dp->K; k++)
        unit_free(dp, &dp->slots[k]);
    free(dp->top_w != dp->bottom_w ? dp->bottom_w : NULL);
    free(dp->top_w);
    free(dp->slots);
}
