// The optimizer's state: master weights and moments, on the backend or offloaded. See state.h.
#include "optim/state.h"

#include <stdlib.h>
#include <string.h>

struct kiln_optim_state {
    struct kiln_backend *be;
    struct kiln_optim_state_opts o;
    struct kiln_param_span *held; // (n_held) a copy of o.held, or NULL: every element, flat
    struct kiln_optim_plan plan;
    float
        *master; // backend f32: flat (total) or compact (elems); NULL offloaded (the pipeline's host memory)
    void *weights;  // backend act: the compute copy AdamW updates (the model's, or compact: the state's own)
    float *m, *v;   // backend f32 (elems each); NULL offloaded
    int own_master; // master was allocated here (not the model's compute copy)
    int own_weights;
    struct kiln_offload_pipe *pipe; // offloaded, once started
};

void kiln_optim_state_plan(const struct kiln_optim_state_opts *o, enum kiln_dtype act,
                           int weights_alias_master, struct kiln_optim_plan *out) {
    memset(out, 0, sizeof(*out));
    size_t elems = o->elems ? o->elems : o->total, held = o->master_compact ? elems : o->total;
    // a compact master keeps a compute copy of its own: the master itself where they alias
    if (o->master_compact) {
        size_t copy = held * kiln_dtype_bytes(act);
        if (weights_alias_master)
            out->params_bytes += copy;
        else
            out->weights_bytes += copy;
    }
    // a flat master that aliases is the model's compute copy, which the model's plan counts
    if (!o->offload && !weights_alias_master)
        out->params_bytes += held * sizeof(float);
    if (!o->offload)
        out->optim_bytes = 2 * elems * sizeof(float);
    out->total_bytes = out->params_bytes + out->weights_bytes + out->optim_bytes;
}

static int state_alloc(struct kiln_optim_state *s, void **p, size_t bytes, struct kiln_error *err) {
    *p = NULL;
    if (!bytes)
        return 0;
    *p = s->be->ops->alloc(s->be->ctx, bytes);
    if (*p)
        return 0;
    const struct kiln_optim_plan *pl = &s->plan;
    const double gib = 1073741824.0;
    return kiln_errorf(
        err, KILN_ERR_RUNTIME,
        "out of memory on %s (%s) allocating %.2f GiB of the optimizer's state: the plan needs "
        "%.2f GiB (the model %.2f, master weights %.2f, their compact compute copy %.2f, "
        "AdamW m and v %.2f); lower --batch or --seq, shard the state with --zero, or use "
        "--offload=optimizer",
        s->be->name, s->be->device_name, bytes / gib, (pl->total_bytes + s->o.beside_bytes) / gib,
        s->o.beside_bytes / gib, pl->params_bytes / gib, pl->weights_bytes / gib, pl->optim_bytes / gib);
}

int kiln_optim_state_create(struct kiln_optim_state **out, struct kiln_backend *be,
                            const struct kiln_optim_state_opts *o, struct kiln_error *err) {
    struct kiln_optim_state *s = kiln_xcalloc(1, sizeof(*s));
    s->be = be;
    s->o = *o;
    s->o.elems = o->elems ? o->elems : o->total;
    KILN_ASSERT(s->o.elems <= s->o.total);
    KILN_ASSERT(o->weights || o->master_compact); // a flat master updates the model's compute copy
    if (o->held) {
        s->held = kiln_xcalloc((size_t)o->n_held + 1, sizeof(*s->held));
        memcpy(s->held, o->held, (size_t)o->n_held * sizeof(*s->held));
    }
    s->o.held = s->held;
    KILN_ASSERT(!o->master_compact || s->held); // a shard says where its runs sit
    kiln_optim_state_plan(&s->o, be->act_dtype, be->weights_alias_master, &s->plan);
    *out = s;
    size_t ab = kiln_dtype_bytes(be->act_dtype), n = s->o.elems;
    int rc = 0;
    if (o->master_compact) {
        rc = state_alloc(s, &s->weights, n * ab, err);
        s->own_weights = 1;
        if (!rc && !o->offload && be->weights_alias_master) {
            s->master = s->weights;
        } else if (!rc && !o->offload) {
            rc = state_alloc(s, (void **)&s->master, n * sizeof(float), err);
            s->own_master = 1;
        }
    } else {
        s->weights = o->weights;
        if (!o->offload && be->weights_alias_master) {
            s->master = o->weights;
        } else if (!o->offload) {
            rc = state_alloc(s, (void **)&s->master, s->o.total * sizeof(float), err);
            s->own_master = 1;
        }
    }
    if (!rc && !o->offload)
        rc = state_alloc(s, (void **)&s->m, n * sizeof(float), err);
    if (!rc && !o->offload)
        rc = state_alloc(s, (void **)&s->v, n * sizeof(float), err);
    if (rc) {
        kiln_optim_state_free(s);
        *out = NULL;
    }
    return rc;
}

void kiln_optim_state_free(struct kiln_optim_state *s) {
    if (!s)
        return;
    kiln_offload_free(s->pipe); // (a running step settles first)
    const struct kiln_ops *ops = s->be->ops;
    if (s->own_master && s->master)
        ops->free(s->be->ctx, s->master);
    if (s->own_weights && s->weights)
        ops->free(s->be->ctx, s->weights);
    if (s->m)
        ops->free(s->be->ctx, s->m);
    if (s->v)
        ops->free(s->be->ctx, s->v);
    free(s->held);
    free(s);
}

void kiln_optim_state_offload(struct kiln_optim_state *s, const struct kiln_offload_opts *o) {
    KILN_ASSERT(s->o.offload && !s->pipe);
    struct kiln_offload_opts oo = *o;
    oo.elems = s->o.elems;
    oo.total = s->o.total;
    oo.weights = s->weights;
    oo.weights_compact = s->o.master_compact;
    kiln_offload_create(&s->pipe, s->be, &oo);
}

struct kiln_offload_pipe *kiln_optim_state_pipe(const struct kiln_optim_state *s) {
    return s->pipe;
}

void kiln_optim_state_buffers(const struct kiln_optim_state *s, struct kiln_adamw_buffers *b) {
    KILN_ASSERT(!s->o.offload); // the pipeline steps an offloaded state
    *b = (struct kiln_adamw_buffers){.params = s->master,
                                     .weights = s->weights,
                                     .m = s->m,
                                     .v = s->v,
                                     .params_compact = s->o.master_compact};
}

void *kiln_optim_state_weights(const struct kiln_optim_state *s) {
    return s->weights;
}

size_t kiln_optim_state_elems(const struct kiln_optim_state *s) {
    return s->o.elems;
}

// the pipeline, settled, for reading or writing the host state
static struct kiln_offload_pipe *settled(struct kiln_optim_state *s) {
    KILN_ASSERT(s->pipe); // kiln_optim_state_offload first
    kiln_offload_settle(s->pipe);
    return s->pipe;
}

void kiln_optim_state_set_master(struct kiln_optim_state *s, const float *host) {
    if (s->o.offload) {
        kiln_offload_set_master(settled(s), host);
        return;
    }
    const struct kiln_ops *ops = s->be->ops;
    enum kiln_dtype act = s->be->act_dtype;
    if (!s->o.master_compact) {
        ops->upload(s->be->ctx, s->master, host, s->o.total * sizeof(float));
        if (s->weights != s->master)
            ops->upload_f32(s->be->ctx, s->weights, act, host, s->o.total);
        return;
    }
    for (int r = 0; r < s->o.n_held; r++) { // this shard's runs, compact
        const struct kiln_param_span *q = &s->held[r];
        ops->upload(s->be->ctx, s->master + q->state_offset, host + q->offset, q->count * sizeof(float));
        if (s->weights != s->master)
            ops->upload_f32(s->be->ctx, (char *)s->weights + q->state_offset * kiln_dtype_bytes(act), act,
                            host + q->offset, q->count);
    }
}

float *kiln_optim_state_host_master(struct kiln_optim_state *s) {
    if (!s->o.offload || s->held || s->o.elems != s->o.total)
        return NULL;
    return kiln_offload_master(settled(s));
}

void kiln_optim_state_get_master(struct kiln_optim_state *s, size_t so, size_t n, float *host) {
    size_t held = s->o.master_compact || s->o.offload ? s->o.elems : s->o.total;
    KILN_ASSERT(so + n <= held);
    if (s->o.offload)
        memcpy(host, kiln_offload_master(settled(s)) + so, n * sizeof(float));
    else
        s->be->ops->download(s->be->ctx, host, s->master + so, n * sizeof(float));
}

void kiln_optim_state_get_moments(struct kiln_optim_state *s, size_t so, size_t n, float *m, float *v) {
    KILN_ASSERT(so + n <= s->o.elems);
    if (s->o.offload) {
        float *hm, *hv;
        kiln_offload_moments(settled(s), &hm, &hv);
        memcpy(m, hm + so, n * sizeof(float));
        memcpy(v, hv + so, n * sizeof(float));
        return;
    }
    s->be->ops->download(s->be->ctx, m, s->m + so, n * sizeof(float));
    s->be->ops->download(s->be->ctx, v, s->v + so, n * sizeof(float));
}

void kiln_optim_state_set_moments(struct kiln_optim_state *s, const float *m, const float *v) {
    size_t bytes = s->o.elems * sizeof(float);
    if (s->o.offload) {
        float *hm, *hv;
        kiln_offload_moments(settled(s), &hm, &hv);
        memcpy(hm, m, bytes);
        memcpy(hv, v, bytes);
        return;
    }
    s->be->ops->upload(s->be->ctx, s->m, m, bytes);
    s->be->ops->upload(s->be->ctx, s->v, v, bytes);
}
