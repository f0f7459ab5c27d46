// Data parallelism's gradient side: each bucket's reduction issued as its last layer's backward ends (DDP's
// all-reduce, ZeRO-1's in-place reduce-scatter, ZeRO-2/3's onto the compact shard), ZeRO-2's staging buffers,
// and ZeRO-1/2's gathers of the updated weights, which the next forward waits for bucket by bucket. See dp.h.
#include "parallel/dp_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/flight.h"

// Issues bucket i's reduction: all-reduce in place (DDP), reduce-scatter in place (ZeRO-1), or reduce-scatter
// onto this rank's slice of the shard (ZeRO-2/3).
static void reduce_bucket(struct kiln_dp *dp, int i) {
    struct bucket *b = &dp->b[i];
    const struct kiln_shard_bucket *sb = &dp->sh.b[i];
    KILN_ASSERT(!b->work);
    size_t gb = dp_grad_bytes(dp);
    int staged = dp->zero >= 2 && !dp->whole;
    char *base = staged ? (char *)b->stage : (char *)dp->buf.grads + sb->lo * gb;
    // ZeRO-2: from the staging buffer onto the shard (a later micro-step's first into shard_tmp, then added);
    // whole gradients are reduced once a step, onto the shard
    void *shard = dp->micro == 0 || dp->whole ? dp->shard : dp->shard_tmp;
    KILN_ASSERT(dp->zero < 2 || (base && shard));
    // ZeRO-1: reduce-scattered in place, each rank's slice summed where it lies in the whole buffer (the
    // rest of the buffer is left partial: only the owner's AdamW and the norm read a slice), half the bytes
    // of DDP's all-reduce during the backward
    char *recv = dp->zero >= 2   ? (char *)shard + sb->state_offset * gb
                 : dp->zero == 1 ? base + sb->slice_lo * gb
                                 : base;
    struct kiln_coll k = {.op = dp->zero >= 1 ? KILN_COLL_REDUCE_SCATTER : KILN_COLL_ALL_REDUCE,
                          .send = base,
                          .recv = recv,
                          .count = sb->hi - sb->lo,
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
        if (dp->sh.b[i].ready_layer == l)
            reduce_bucket(dp, i);
}

static void on_embed_backward_end(void *user) {
    on_layer_backward_end(user, -1);
}

// ---- ZeRO-2's staging: each bucket's gradients are written into a buffer of the bucket's size, reduced onto
// the shard, and the buffer goes to the next bucket ----

// points the model's gradient windows of every segment in bucket i at its staging buffer
static void window_bucket(struct kiln_dp *dp, int i, void *stage) {
    const struct kiln_shard_bucket *sb = &dp->sh.b[i];
    dp->b[i].stage = stage;
    size_t gb = dp_grad_bytes(dp);
    for (int s = 0; s < dp->n_seg; s++)
        if (dp->seg_begin[s] >= sb->lo && dp->seg_begin[s] < sb->hi)
            kiln_model_set_grad_window(dp->g, s, (char *)stage + (dp->seg_begin[s] - sb->lo) * gb);
}

// A staging buffer about to take bucket i's gradients: its padding zeroed, since a buffer that held another
// bucket has that bucket's gradients there (tests: everything else NaN first, KILN_POISON_STAGING, so that
// an element the backward does not assign shows).
static void prepare_stage(struct kiln_dp *dp, void *stage, int i) {
    const struct kiln_shard_bucket *sb = &dp->sh.b[i];
    size_t gb = dp_grad_bytes(dp);
    if (dp->poison) {
        size_t n = (sb->hi - sb->lo) * gb;
        void *h = kiln_xmalloc(n ? n : 1);
        memset(h, 0xff, n); // all ones: a NaN in f32 and in bf16
        dp->be->ops->upload(dp->be->ctx, stage, h, n);
        free(h);
    }
    for (int k = sb->gap0; k < sb->gap0 + sb->n_gaps; k++) {
        const struct kiln_shard_gap *gp = &dp->sh.gaps[k];
        dp->be->ops->zero(dp->be->ctx, (char *)stage + (gp->lo - sb->lo) * gb, (gp->hi - gp->lo) * gb);
    }
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
void dp_stage_layer(struct kiln_dp *dp, int l, int recompute) {
    kiln_flight_set_layer(l);
    if (!recompute || dp->whole)
        return;
    stage_bucket(dp, dp_bucket_of_seg(dp, 1 + l));
    if (l > 0)
        stage_bucket(dp, dp_bucket_of_seg(dp, l));
}

static void on_layer_begin_staged(void *user, int l, int recompute) {
    dp_stage_layer(user, l, recompute);
}

void dp_stage_micro_step(struct kiln_dp *dp) {
    if (dp->micro > 0 && !dp->shard_tmp) {
        KILN_ASSERT(dp->be->grad_dtype == KILN_F32); // accumulation keeps fp32 gradients (config.c)
        dp->shard_tmp = dp_alloc_or_die(dp, dp->optim_elems * sizeof(float), "gradient shard");
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

// ---- ZeRO-1/2: the updated compute weights, gathered from their owners ----

void dp_issue_gathers(struct kiln_dp *dp, int master, struct kiln_comm_work **w) {
    void *base = master ? (void *)dp->buf.params : dp->buf.weights;
    enum kiln_dtype dt = master ? KILN_F32 : dp->be->act_dtype;
    size_t eb = kiln_dtype_bytes(dt);
    for (int i = dp->nb - 1; i >= 0; i--) {
        const struct kiln_shard_bucket *sb = &dp->sh.b[i];
        char *at = (char *)base + sb->lo * eb;
        struct kiln_coll k = {.op = KILN_COLL_ALL_GATHER,
                              .send = at + sb->slice_lo * eb,
                              .recv = at,
                              .count = sb->hi - sb->lo,
                              .dtype = dt,
                              .device = dp->be->device_memory};
        w[i] = kiln_comm_submit(dp->comm, &k, NULL);
    }
}

void dp_gather_weights(struct kiln_dp *dp, int master) {
    struct kiln_comm_work **w = kiln_xcalloc((size_t)dp->nb, sizeof(*w));
    dp_issue_gathers(dp, master, w);
    for (int i = 0; i < dp->nb; i++)
        kiln_comm_wait_stream(dp->comm, w[i]);
    free(w);
}

// The next forward reaches the flat elements below limit: the compute stream waits for the weight gathers of
// the buckets that hold any of them (SIZE_MAX: every one, before the weights are read other than by the
// forward, or written).
void dp_weights_through(struct kiln_dp *dp, size_t limit) {
    for (int i = 0; dp->wg && i < dp->nb; i++)
        if (dp->wg[i] && dp->sh.b[i].lo < limit) {
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
    dp_weights_through(dp, dp->seg_begin[2]);
}

static void on_layer_begin_gathered(void *user, int l, int recompute) {
    struct kiln_dp *dp = user;
    kiln_flight_set_layer(l);
    if (!recompute)
        dp_weights_through(dp, dp->seg_begin[3 + l]);
    else if (dp->zero >= 2 && !dp->whole)
        dp_stage_layer(dp, l, recompute);
}

void dp_attach_reduce(struct kiln_dp *dp, struct kiln_model_hooks *h) {
    h->layer_backward_end = on_layer_backward_end;
    h->embed_backward_end = on_embed_backward_end;
    if (dp->zero >= 2 && dp->whole) { // the model holds whole gradients; the shard takes one reduction a step
        dp->n_seg = kiln_model_grad_segments(dp->g, &dp->seg_begin);
        dp->shard = dp_alloc_or_die(dp, dp->optim_elems * dp_grad_bytes(dp), "gradient shard");
    } else if (dp->zero >= 2) {
        KILN_ASSERT(!dp->buf.grads); // the model was created with external_grads
        dp->n_seg = kiln_model_grad_segments(dp->g, &dp->seg_begin);
        size_t gb = dp_grad_bytes(dp), mid = kiln_shard_mid_elems(&dp->sh);
        const struct kiln_shard_bucket *top = &dp->sh.b[0], *bottom = &dp->sh.b[dp->nb - 1];
        dp->top = dp_alloc_or_die(dp, (top->hi - top->lo) * gb, "staging buffer");
        dp->bottom =
            dp->nb > 1 ? dp_alloc_or_die(dp, (bottom->hi - bottom->lo) * gb, "staging buffer") : dp->top;
        for (int k = 0; k < STAGING_SLOTS; k++)
            dp->mid[k] = (struct slot){.p = mid ? dp_alloc_or_die(dp, mid * gb, "staging buffer") : NULL,
                                       .bucket = -1};
        dp->shard = dp_alloc_or_die(dp, dp->optim_elems * gb, "gradient shard");
        h->layer_begin = on_layer_begin_staged;
    }
    if ((dp->zero == 1 || dp->zero == 2) && !dp->offload) {
        if (!dp->seg_begin)
            dp->n_seg = kiln_model_grad_segments(dp->g, &dp->seg_begin);
        dp->wg = kiln_xcalloc((size_t)dp->nb, sizeof(*dp->wg));
        h->forward_begin = on_forward_begin_gathered;
        h->layer_begin = on_layer_begin_gathered;
    }
}
