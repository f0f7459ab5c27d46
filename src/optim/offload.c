// The offloaded AdamW's pipeline. See offload.h.
#include "optim/offload.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"
#include "util/progress.h"

// A chunk of the pipeline: a run of state offsets and where its gradients and weights are on the backend.
struct ochunk {
    const void *grads;  // backend: the chunk's reduced gradients (grad dtype)
    void *weights;      // backend: where its updated compute weights go (act dtype)
    size_t so, n;       // state offsets [so, so + n)
    int span0, n_spans; // its spans in o->c_spans (cut to the chunk)
    int order;          // when the forward first reads it (the pieces'); the chunks are sorted by it
};

// One step: a stepper thread runs AdamW over the chunks, a copier thread moves them.
struct opipe {
    struct kiln_offload_pipe *o;
    struct kiln_adamw_args a;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int grads_in, adam_done, weights_out; // chunks done by each stage, in order
    int failed;                           // a thread could not start: the other one gives up
    pthread_t stepper, copier;
    double t0;     // when the caller started it
    double busy_s; // the step's wall time, from its start to its last chunk's weights up (so every wait for
                   // it lies within)
    double copy_s; // the copies' own time (the backend's, as link_bench times the link) and their bytes
    size_t copy_bytes;
};

struct kiln_offload_pipe {
    struct kiln_backend *be;
    size_t elems, total, chunk;
    int host_threads, delay_us;
    const void *grads;
    void *weights;
    int grads_compact, weights_compact;
    struct kiln_offload_piece *pieces; // sorted by order
    int n_pieces;
    struct kiln_param_span *spans; // AdamW's (state offsets)
    int n_spans;
    struct ochunk *chunks; // the pieces cut into chunks
    int n_chunks;
    struct kiln_param_span *c_spans; // the spans cut to the chunks
    // host memory: the master weights and moments (elems each), and the staging buffers: a chunk's gradients
    // on the way down (g[0-1], host_alloc 0-1) and its updated weights on the way up (w[0-1], host_alloc 2-3)
    float *master, *m, *v;
    void *gstage[2], *wstage[2];
    unsigned pinned;    // bit k: staging buffer k is the backend's host memory (else malloc'd)
    struct opipe *pipe; // the step running beside the caller, or NULL
    struct kiln_offload_stats stats;
};

size_t kiln_offload_host_bytes(size_t elems, size_t chunk, enum kiln_dtype grad, enum kiln_dtype act) {
    chunk = chunk ? chunk : KILN_OFFLOAD_CHUNK;
    chunk = elems < chunk ? elems : chunk;
    return elems * 3 * sizeof(float) + 2 * chunk * (kiln_dtype_bytes(grad) + kiln_dtype_bytes(act));
}

// Page-locked host memory where the backend has it (copies at the link's speed), else malloc'd: bit k of
// o->pinned says which, for staging buffer k.
static void *host_alloc(struct kiln_offload_pipe *o, size_t bytes, int k) {
    void *p = o->be->ops->host_alloc ? o->be->ops->host_alloc(o->be->ctx, bytes ? bytes : 16) : NULL;
    if (p)
        o->pinned |= 1u << k;
    else
        p = kiln_xcalloc(1, bytes ? bytes : 16);
    return p;
}

static void host_free(struct kiln_offload_pipe *o, void *p, int k) {
    if (p && (o->pinned >> k & 1u))
        o->be->ops->host_free(o->be->ctx, p);
    else
        free(p);
}

// Cuts the pieces (sorted by order) into chunks, and AdamW's spans to them.
static void plan_chunks(struct kiln_offload_pipe *o) {
    size_t gb = kiln_dtype_bytes(o->be->grad_dtype), ab = kiln_dtype_bytes(o->be->act_dtype);
    int cap = 0;
    for (int r = 0; r < o->n_pieces; r++)
        cap += (int)((o->pieces[r].hi - o->pieces[r].lo + o->chunk - 1) / o->chunk);
    o->chunks = kiln_xcalloc((size_t)cap + 1, sizeof(*o->chunks));
    o->c_spans = kiln_xcalloc((size_t)(o->n_spans + cap) + 1, sizeof(*o->c_spans));
    int ns = 0;
    for (int r = 0; r < o->n_pieces; r++) {
        const struct kiln_offload_piece *pc = &o->pieces[r];
        for (size_t at = pc->lo; at < pc->hi; at += o->chunk) {
            size_t len = pc->hi - at < o->chunk ? pc->hi - at : o->chunk;
            size_t so = pc->so + (at - pc->lo);
            const char *g = (const char *)o->grads + (o->grads_compact ? so : at) * gb;
            char *w = (char *)o->weights + (o->weights_compact ? so : at) * ab;
            struct ochunk *c = &o->chunks[o->n_chunks++];
            *c = (struct ochunk){
                .grads = g, .weights = w, .so = so, .n = len, .span0 = ns, .order = pc->order};
            for (int i = 0; i < o->n_spans; i++) { // the spans' parts in [so, so + len)
                const struct kiln_param_span *sp = &o->spans[i];
                size_t lo = sp->state_offset > so ? sp->state_offset : so;
                size_t hi = sp->state_offset + sp->count < so + len ? sp->state_offset + sp->count : so + len;
                if (lo >= hi)
                    continue;
                o->c_spans[ns++] =
                    (struct kiln_param_span){sp->offset + (lo - sp->state_offset), hi - lo, sp->decay, lo};
            }
            c->n_spans = ns - c->span0;
        }
    }
}

void kiln_offload_create(struct kiln_offload_pipe **out, struct kiln_backend *be,
                         const struct kiln_offload_opts *opts) {
    struct kiln_offload_pipe *o = kiln_xcalloc(1, sizeof(*o));
    o->be = be;
    o->elems = opts->elems;
    o->total = opts->total;
    o->chunk = opts->chunk ? opts->chunk : KILN_OFFLOAD_CHUNK;
    o->host_threads = opts->host_threads;
    o->delay_us = opts->delay_us;
    o->grads = opts->grads;
    o->weights = opts->weights;
    o->grads_compact = opts->grads_compact;
    o->weights_compact = opts->weights_compact;
    o->n_pieces = opts->n_pieces;
    o->pieces = kiln_xcalloc((size_t)o->n_pieces + 1, sizeof(*o->pieces));
    memcpy(o->pieces, opts->pieces, (size_t)o->n_pieces * sizeof(*o->pieces));
    for (int i = 1; i < o->n_pieces; i++) // a stable sort by order
        for (int j = i; j > 0 && o->pieces[j - 1].order > o->pieces[j].order; j--) {
            struct kiln_offload_piece t = o->pieces[j];
            o->pieces[j] = o->pieces[j - 1];
            o->pieces[j - 1] = t;
        }
    o->n_spans = opts->n_spans;
    o->spans = kiln_xcalloc((size_t)o->n_spans + 1, sizeof(*o->spans));
    memcpy(o->spans, opts->spans, (size_t)o->n_spans * sizeof(*o->spans));
    // only the staging buffers are copied to and from the device, so only they are page-locked
    size_t n = o->elems;
    o->master = kiln_xmalloc((n ? n : 1) * sizeof(float));
    o->m = kiln_xcalloc(n ? n : 1, sizeof(float));
    o->v = kiln_xcalloc(n ? n : 1, sizeof(float));
    size_t chunk = n < o->chunk ? n : o->chunk;
    for (int k = 0; k < 2; k++) {
        o->gstage[k] = host_alloc(o, chunk * kiln_dtype_bytes(be->grad_dtype), k);
        o->wstage[k] = host_alloc(o, chunk * kiln_dtype_bytes(be->act_dtype), 2 + k);
    }
    plan_chunks(o);
    *out = o;
}

void kiln_offload_free(struct kiln_offload_pipe *o) {
    if (!o)
        return;
    kiln_offload_settle(o);
    free(o->master);
    free(o->m);
    free(o->v);
    for (int k = 0; k < 2; k++) {
        host_free(o, o->gstage[k], k);
        host_free(o, o->wstage[k], 2 + k);
    }
    free(o->pieces);
    free(o->spans);
    free(o->chunks);
    free(o->c_spans);
    free(o);
}

float *kiln_offload_master(struct kiln_offload_pipe *o) {
    return o->master;
}

void kiln_offload_moments(struct kiln_offload_pipe *o, float **m, float **v) {
    *m = o->m;
    *v = o->v;
}

// Host f32 to the backend's compute copy, a chunk at a time (the backend converts through a staging buffer of
// the size it is given).
static void upload_weights(struct kiln_offload_pipe *o, void *dst, const float *src, size_t n) {
    size_t ab = kiln_dtype_bytes(o->be->act_dtype);
    for (size_t at = 0; at < n; at += o->chunk)
        o->be->ops->upload_f32(o->be->ctx, (char *)dst + at * ab, o->be->act_dtype, src + at,
                               n - at < o->chunk ? n - at : o->chunk);
}

void kiln_offload_set_master(struct kiln_offload_pipe *o, const float *host) {
    kiln_offload_settle(o);
    size_t ab = kiln_dtype_bytes(o->be->act_dtype);
    for (int r = 0; r < o->n_pieces; r++) {
        const struct kiln_offload_piece *pc = &o->pieces[r];
        if (o->master + pc->so != host + pc->lo) // (not when initialized in place)
            memcpy(o->master + pc->so, host + pc->lo, (pc->hi - pc->lo) * sizeof(float));
        if (o->weights_compact) // the compute copy is a shard too
            upload_weights(o, (char *)o->weights + pc->so * ab, host + pc->lo, pc->hi - pc->lo);
    }
    if (!o->weights_compact)
        upload_weights(o, o->weights, host, o->total);
}

// ---- the step's threads ----

// Waits until *counter reaches at_least; -1 when the step failed to start instead.
static int opipe_wait(struct opipe *p, const int *counter, int at_least) {
    pthread_mutex_lock(&p->mu);
    while (*counter < at_least && !p->failed)
        pthread_cond_wait(&p->cv, &p->mu);
    int failed = p->failed;
    pthread_mutex_unlock(&p->mu);
    return failed ? -1 : 0;
}

static void opipe_bump(struct opipe *p, int *counter) {
    pthread_mutex_lock(&p->mu);
    (*counter)++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

// The copy thread: chunk k's gradients down into staging k % 2 once AdamW is done with what it held (chunk
// k - 2), then chunk k - 1's weights up once AdamW wrote them. Its copies are not ordered after the compute
// stream's work: the caller starts the step after the gradients are complete (the trainer: after the
// gradient norm, which waited for the backward), and readers wait for a chunk's weights before they read
// them.
static void *offload_copier(void *arg) {
    struct opipe *p = arg;
    struct kiln_offload_pipe *o = p->o;
    const struct kiln_ops *ops = o->be->ops;
    size_t gb = kiln_dtype_bytes(o->be->grad_dtype), ab = kiln_dtype_bytes(o->be->act_dtype);
    for (int k = 0; k <= o->n_chunks; k++) {
        if (k < o->n_chunks) {
            if (opipe_wait(p, &p->adam_done, k - 1))
                return NULL;
            const struct ochunk *c = &o->chunks[k];
            p->copy_s += ops->copy_side(o->be->ctx, o->gstage[k % 2], c->grads, c->n * gb);
            p->copy_bytes += c->n * gb;
            opipe_bump(p, &p->grads_in);
        }
        if (k > 0) {
            if (opipe_wait(p, &p->adam_done, k))
                return NULL;
            const struct ochunk *c = &o->chunks[k - 1];
            p->copy_s += ops->copy_side(o->be->ctx, c->weights, o->wstage[(k - 1) % 2], c->n * ab);
            p->copy_bytes += c->n * ab;
            opipe_bump(p, &p->weights_out);
        }
    }
    return NULL;
}

// The stepper thread: AdamW on each chunk as its gradients arrive, into the staging its weights leave from.
static void *offload_stepper(void *arg) {
    struct opipe *p = arg;
    struct kiln_offload_pipe *o = p->o;
    struct kiln_adamw_args a = p->a;
    for (int k = 0; k < o->n_chunks; k++) {
        const struct ochunk *c = &o->chunks[k];
        if (opipe_wait(p, &p->grads_in, k + 1) || opipe_wait(p, &p->weights_out, k - 1)) // staging k % 2
            return NULL;                                                                 // was taken up
        if (o->delay_us) // tests: a slow host, so that the reader must wait for every chunk it reads
            usleep((useconds_t)o->delay_us);
        a.grads = o->gstage[k % 2];
        a.weights = o->wstage[k % 2];
        a.spans = o->c_spans + c->span0;
        a.n_spans = c->n_spans;
        kiln_adamw_host(&a, o->be->grad_dtype, o->be->act_dtype, c->so, o->host_threads);
        opipe_bump(p, &p->adam_done);
    }
    if (opipe_wait(p, &p->weights_out, o->n_chunks) == 0) // the copier's last copy
        p->busy_s = kiln_now_s() - p->t0;
    return NULL;
}

static void opipe_free(struct opipe *p) {
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int kiln_offload_step(struct kiln_offload_pipe *o, const struct kiln_adamw_hparams *h, double grad_norm) {
    kiln_offload_settle(o);
    struct opipe *p = kiln_xcalloc(1, sizeof(*p));
    p->o = o;
    p->a = (struct kiln_adamw_args){
        .params = o->master, .grads_compact = 1, .params_compact = 1, .m = o->m, .v = o->v};
    kiln_adamw_args_from(h, grad_norm, &p->a);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->t0 = kiln_now_s();
    if (pthread_create(&p->copier, NULL, offload_copier, p)) {
        opipe_free(p);
        return -1;
    }
    if (pthread_create(&p->stepper, NULL, offload_stepper, p)) {
        pthread_mutex_lock(&p->mu);
        p->failed = 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->copier, NULL);
        opipe_free(p);
        return -1;
    }
    o->pipe = p;
    return 0;
}

int kiln_offload_running(const struct kiln_offload_pipe *o) {
    return o && o->pipe;
}

void kiln_offload_wait(struct kiln_offload_pipe *o, int chunks) {
    struct opipe *p = o ? o->pipe : NULL;
    if (!p)
        return;
    double t0 = kiln_now_s();
    opipe_wait(p, &p->weights_out, chunks < o->n_chunks ? chunks : o->n_chunks);
    o->stats.wait_s += kiln_now_s() - t0; // for the weights, not for the threads' ends below
    if (chunks >= o->n_chunks) {
        pthread_join(p->stepper, NULL);
        pthread_join(p->copier, NULL);
        o->stats.busy_s += p->busy_s;
        o->stats.copy_s += p->copy_s;
        o->stats.copy_bytes += (double)p->copy_bytes;
        opipe_free(p);
        o->pipe = NULL;
    }
}

void kiln_offload_wait_grads(struct kiln_offload_pipe *o, int chunks) {
    if (o && o->pipe)
        opipe_wait(o->pipe, &o->pipe->grads_in, chunks);
}

void kiln_offload_settle(struct kiln_offload_pipe *o) {
    if (o)
        kiln_offload_wait(o, o->n_chunks);
}

int kiln_offload_chunks(const struct kiln_offload_pipe *o) {
    return o->n_chunks;
}

int kiln_offload_chunks_through(const struct kiln_offload_pipe *o, int order) {
    int k = 0;
    while (k < o->n_chunks && o->chunks[k].order <= order)
        k++;
    return k;
}

int kiln_offload_chunks_over(const struct kiln_offload_pipe *o, size_t so, size_t n) {
    int need = 0;
    for (int k = 0; k < o->n_chunks; k++)
        if (o->chunks[k].so < so + n && o->chunks[k].so + o->chunks[k].n > so)
            need = k + 1;
    return need;
}

void kiln_offload_stats(const struct kiln_offload_pipe *o, struct kiln_offload_stats *out) {
    *out = o->stats;
}
