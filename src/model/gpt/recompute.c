// What the backward re-runs (recompute_layer) and the activation offload ring: layer inputs (and, under
// selective recompute, attention outputs) that go to pinned host memory during the forward and come back
// a layer ahead during the backward.
#include "model/gpt/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

void gpt_offl_init(struct kiln_model *g, struct offl *o, struct buf *b, int n, char **host) {
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

void gpt_offl_free(struct kiln_model *g, struct offl *o) {
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
// ---- activation offload (X_RING above) ----

// whether entry l of an offloaded buffer lives on the host between its forward and its backward
int gpt_offl_has(const struct offl *o, int l) {
    return o->host && l >= 0 && l <= o->n - 1 - o->b->slots;
}

// entry l to or from its host copy, beside the compute
void gpt_offl_copy(struct kiln_model *g, const struct offl *o, int l, int to_host) {
    size_t bytes = o->b->elems * o->b->elem_bytes;
    void *dev = buf_at(o->b, l), *host = (char *)o->host + (size_t)l * bytes;
    void **evs = to_host ? o->out : o->in;
    g->ops->copy_async(g->ctx, to_host ? host : dev, to_host ? dev : host, bytes, evs ? evs[l] : NULL);
}

// the compute stream waits for entry l's copy out (to_host) or back, where the backend has streams
void gpt_offl_wait(struct kiln_model *g, const struct offl *o, int l, int to_host) {
    void **evs = to_host ? o->out : o->in;
    if (evs && g->ops->stream_wait)
        g->ops->stream_wait(g->ctx, evs[l]);
}

// before entry e is written into its slot: the entry that slot held must have reached the host
void gpt_offl_claim(struct kiln_model *g, const struct offl *o, int e) {
    if (o->host && gpt_offl_has(o, e - o->b->slots))
        gpt_offl_wait(g, o, e - o->b->slots, 1);
}

// Re-runs what backward needs but recompute did not keep.
void gpt_recompute_layer(struct kiln_model *g, const struct dims *d, int l) {
    struct acts *a = &g->a;
    if (gpt_recomputes_blocks(g->opts.recompute)) {
        gpt_norm_fwd(g, buf_at(&a->ln1, l), buf_at(&a->mean1, l), buf_at(&a->rstd1, l), NULL,
                     buf_at(&a->x, l), NULL, g->pt.layer[l][KILN_LN1_W], g->pt.layer[l][KILN_LN1_B], d->Nr);
        g->recomputing = 1;
        gpt_layer_forward(g, d, l, 0);
        g->recomputing = 0;
    } else if (g->opts.recompute == KILN_RECOMPUTE_MLP && g->mlp_rows == d->N) { // chunked: in mlp_bwd
        const void *inp = g->cfg.parallel_block ? buf_at(&a->ln1, l) : buf_at(&a->ln2, l);
        gpt_mlp_fwd(g, d, l, inp, buf_at(&a->fc_pre, l), buf_at(&a->fc_act, l), NULL, 0, d->N);
    } else if (g->opts.recompute == KILN_RECOMPUTE_ACT) {
        // the activation's output from its kept input: fc_pre, or the MLP slice of a fused block's [qkv |
        // fc_pre]
        int S = d->QKV + d->FCO;
        const void *pre = g->fuse.fwd ? act_at(g, buf_at(&a->pre, l), (size_t)d->QKV) : buf_at(&a->fc_pre, l);
        gpt_mlp_activation(g, d, pre, g->fuse.fwd ? S : 0, buf_at(&a->fc_act, l), d->N);
    }
}
