// ZeRO's arithmetic: buckets, slices, ranges, spans and padding. See shard.h.
#include "parallel/shard.h"

#include <stdlib.h>

#include "parallel/comm/comm.h"
#include "parallel/dp.h"
#include "util/error.h"

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

static int layers_of(const struct kiln_param_table *pt) {
    int L = 0;
    for (int i = 0; i < pt->n; i++)
        if (pt->p[i].layer + 1 > L)
            L = pt->p[i].layer + 1;
    return L;
}

static void add_bucket(struct kiln_shard_plan *p, size_t lo, size_t hi, int ready_layer) {
    p->b[p->nb] = (struct kiln_shard_bucket){.lo = lo, .hi = hi, .ready_layer = ready_layer};
    p->bounds[++p->nb] = lo;
}

// Buckets at layer boundaries, from the top: each takes layers (downwards) until it holds `want` elements.
static void plan_buckets(struct kiln_shard_plan *p, const struct kiln_param_table *pt, size_t want) {
    int L = layers_of(pt);
    size_t hi = pt->total;
    for (int l = L - 1; l >= 0; l--) {
        size_t lo = l == 0 ? 0 : pt->layer_begin[l];
        if (hi - lo < want && l > 0)
            continue; // take the next layer down too
        add_bucket(p, lo, hi, l == 0 ? -1 : l);
        hi = lo;
    }
    if (L == 0) // no layers: one bucket, after the embeddings
        add_bucket(p, 0, hi, -1);
}

// ZeRO-3's buckets are its gathering units: the last layer with the final norm and head, each layer between
// on its own, and layer 0 with the embeddings (--bucket-mb does not apply).
static void plan_layer_buckets(struct kiln_shard_plan *p, const struct kiln_param_table *pt) {
    int L = layers_of(pt);
    size_t hi = pt->total;
    for (int l = L - 1; l >= 0 || p->nb == 0; l--) {
        size_t lo = l <= 0 ? 0 : pt->layer_begin[l];
        add_bucket(p, lo, hi, l <= 0 ? -1 : l);
        hi = lo;
        if (l <= 0)
            break;
    }
}

// AdamW's spans: every tensor's span cut to the owned ranges, with the range's state offsets.
static void plan_spans(struct kiln_shard_plan *p, const struct kiln_param_table *pt) {
    p->spans = kiln_xcalloc((size_t)pt->n * (size_t)(p->n_ranges + 1), sizeof(*p->spans));
    for (int r = 0; r < p->n_ranges; r++) {
        const struct kiln_dp_range *q = &p->ranges[r];
        for (int i = 0; i < pt->n; i++) {
            size_t lo = pt->p[i].offset, hi = lo + pt->p[i].count;
            if (hi <= q->lo || lo >= q->hi)
                continue;
            lo = lo > q->lo ? lo : q->lo;
            hi = hi < q->hi ? hi : q->hi;
            p->spans[p->n_spans++] =
                (struct kiln_param_span){lo, hi - lo, pt->p[i].decay, q->state_offset + (lo - q->lo)};
        }
    }
}

// The padding of every bucket: the elements between its tensors (the table aligns each tensor's start), which
// no backward writes.
static void plan_gaps(struct kiln_shard_plan *p, const struct kiln_param_table *pt) {
    p->gaps = kiln_xcalloc((size_t)pt->n + (size_t)p->nb + 1, sizeof(*p->gaps));
    int n = 0;
    for (int i = 0; i < p->nb; i++) {
        struct kiln_shard_bucket *b = &p->b[i];
        b->gap0 = n;
        size_t at = b->lo; // the tensors are in offset order
        for (int t = 0; t < pt->n; t++) {
            size_t lo = pt->p[t].offset, hi = lo + pt->p[t].count;
            if (hi <= b->lo || lo >= b->hi)
                continue;
            if (lo > at)
                p->gaps[n++] = (struct kiln_shard_gap){at, lo};
            at = hi > at ? hi : at;
        }
        if (at < b->hi)
            p->gaps[n++] = (struct kiln_shard_gap){at, b->hi};
        b->n_gaps = n - b->gap0;
    }
    p->n_gaps = n;
}

void kiln_shard_plan(struct kiln_shard_plan *p, const struct kiln_param_table *pt, int layer_buckets,
                     double bucket_mb, size_t grad_bytes, int world, int rank) {
    *p = (struct kiln_shard_plan){.world = world, .rank = rank};
    int L = layers_of(pt);
    p->b = kiln_xcalloc((size_t)L + 1, sizeof(*p->b));
    p->bounds = kiln_xcalloc((size_t)L + 2, sizeof(*p->bounds));
    p->bounds[0] = pt->total;
    if (layer_buckets) {
        plan_layer_buckets(p, pt);
    } else {
        size_t want = (size_t)(bucket_mb * 1048576.0 / (double)grad_bytes);
        plan_buckets(p, pt, want < 1 ? 1 : want);
    }
    p->n_ranges = kiln_dp_ranges_for(p->bounds, p->nb, world, rank, &p->ranges);
    size_t state = 0; // where each bucket's slice sits in the rank's shard (the ranges skip empty slices)
    for (int i = 0; i < p->nb; i++) {
        struct kiln_shard_bucket *b = &p->b[i];
        kiln_comm_slice(b->hi - b->lo, world, rank, &b->slice_lo, &b->slice_hi);
        b->state_offset = state;
        state += b->slice_hi - b->slice_lo;
    }
    p->owned = state;
    plan_spans(p, pt);
    plan_gaps(p, pt);
}

void kiln_shard_plan_free(struct kiln_shard_plan *p) {
    free(p->b);
    free(p->bounds);
    free(p->ranges);
    free(p->spans);
    free(p->gaps);
    *p = (struct kiln_shard_plan){0};
}

int kiln_shard_bucket_of(const struct kiln_shard_plan *p, size_t at) {
    for (int i = 0; i < p->nb; i++)
        if (at >= p->b[i].lo && at < p->b[i].hi)
            return i;
    return p->nb - 1;
}

size_t kiln_shard_mid_elems(const struct kiln_shard_plan *p) {
    size_t mid = 0;
    for (int i = 1; i < p->nb - 1; i++)
        if (p->b[i].hi - p->b[i].lo > mid)
            mid = p->b[i].hi - p->b[i].lo;
    return mid;
}
