// ZeRO's arithmetic (parallel/shard.h, and what parallel/dp.c plans with it) as a specification, over world
// sizes 1..8 and parameter tables of several shapes: buckets cut at layer boundaries, greedily, to
// --bucket-mb; every parameter element owned by exactly one rank; each rank's state compact; shares balanced
// to within one element a bucket; the resharding rule (kiln_dp_ranges_for) the same as the plan; ZeRO-3's
// buckets one layer each; the memory plan (kiln_dp_plan_memory) what attaching to a model allocates.
#include "test_util.h"

#include "core/backend.h"
#include "model/model.h"
#include "parallel/dp.h"
#include "parallel/shard.h"
#include "run/options.h"

#define MAX_WORLD 8

// ---- parameter tables ----

struct shape {
    const char *name;
    void (*edit)(struct kiln_model_config *m);
};

// GPT-2's layout at a small size: learned positions, LayerNorm with biases, linear biases, tied embeddings.
// C = 24 leaves padding after every norm and bias (tensors start on 64-element boundaries).
static void gpt2_like(struct kiln_model_config *m) {
    m->n_layer = 3;
    m->n_head = 4;
    m->n_embd = 24;
    m->block_size = 16;
    m->vocab_size = 50;
    m->vocab_multiple = 64;
}

// Llama's: untied, no biases, RMSNorm, GQA, RoPE (no position table), SwiGLU.
static void llama_like(struct kiln_model_config *m) {
    gpt2_like(m);
    m->n_layer = 5;
    m->n_head = 4;
    m->n_kv_head = 2;
    m->n_embd = 32;
    m->bias = 0;
    m->norm_rms = 1;
    m->norm_bias = 0;
    m->pos = KILN_POS_ROPE;
    m->mlp_swiglu = 1;
    m->tie_embeddings = 0;
}

// PaLM's parallel block (one norm a layer, [W_qkv; W_fc] adjacent), with biases and QK-norm.
static void parallel_like(struct kiln_model_config *m) {
    gpt2_like(m);
    m->n_layer = 4;
    m->n_embd = 16;
    m->parallel_block = 1;
    m->qk_norm = 1;
    m->tie_embeddings = 0;
}

// One layer: the top bucket and the bottom one are the same.
static void one_layer(struct kiln_model_config *m) {
    gpt2_like(m);
    m->n_layer = 1;
}

static const struct shape shapes[] = {
    {"gpt2-like (tied, biases)", gpt2_like},
    {"llama-like (untied, no biases, GQA)", llama_like},
    {"parallel block (QK-norm)", parallel_like},
    {"one layer", one_layer},
};
#define N_SHAPES ((int)(sizeof(shapes) / sizeof(shapes[0])))

static void model_of(int s, struct kiln_model_config *m) {
    struct kiln_config c;
    struct kiln_error e;
    assert_int_equal(kiln_config_init(&c, "shakespeare-char", &e), 0);
    *m = c.model;
    shapes[s].edit(m);
}

static void table_of(int s, struct kiln_param_table *pt) {
    struct kiln_model_config m;
    model_of(s, &m);
    kiln_params_build(pt, &m);
}

static int layers(const struct kiln_param_table *pt) {
    int L = 0;
    for (int i = 0; i < pt->n; i++)
        L = pt->p[i].layer + 1 > L ? pt->p[i].layer + 1 : L;
    return L;
}

// 1 where a tensor holds flat element i, 0 in the padding
static unsigned char *held_of(const struct kiln_param_table *pt) {
    unsigned char *held = calloc(pt->total, 1);
    for (int t = 0; t < pt->n; t++)
        memset(held + pt->p[t].offset, 1, pt->p[t].count);
    return held;
}

// The bucket sizes to plan for, in elements (of f32 gradients): one a layer, a few layers, exactly the top
// bucket's size (the boundary case), about a third of the table, everything in one.
#define N_WANTS 5
static void wants_of(const struct kiln_param_table *pt, size_t want[N_WANTS]) {
    int L = layers(pt);
    want[0] = 1;
    want[1] = pt->layer_begin[1] - pt->layer_begin[0] + 1; // a little more than a layer: two a bucket
    want[2] = pt->total - (L > 1 ? pt->layer_begin[L - 1] : 0);
    want[3] = pt->total / 3;
    want[4] = pt->total * 2;
}

static double mb_of(size_t want_elems) { // exact: a multiple of 4 bytes over a power of two
    return (double)want_elems * sizeof(float) / 1048576.0;
}

// ---- buckets ----

// Bounds descend from the total to 0 on layer boundaries; each bucket becomes ready after its lowest layer's
// backward; a bucket holds at least `want` elements (but the bottom one) and no layer more than it needs.
static void check_buckets(const struct kiln_param_table *pt, const struct kiln_shard_plan *p, size_t want,
                          const char *what) {
    int L = layers(pt);
    assert_true(p->nb >= 1 && p->nb <= (L ? L : 1));
    if (p->bounds[0] != pt->total || p->bounds[p->nb] != 0)
        fail_msg("%s: bounds run from %zu to %zu, not %zu to 0", what, p->bounds[0], p->bounds[p->nb],
                 pt->total);
    for (int i = 0; i < p->nb; i++) {
        const struct kiln_shard_bucket *b = &p->b[i];
        if (b->hi != p->bounds[i] || b->lo != p->bounds[i + 1] || b->lo >= b->hi)
            fail_msg("%s: bucket %d is [%zu, %zu), bounds [%zu, %zu)", what, i, b->lo, b->hi,
                     p->bounds[i + 1], p->bounds[i]);
        int lowest = -2; // the layer whose start is b->lo (-1: the embeddings, at 0)
        if (b->lo == 0)
            lowest = -1;
        for (int l = 1; l < L; l++)
            if (pt->layer_begin[l] == b->lo)
                lowest = l;
        if (lowest == -2)
            fail_msg("%s: bucket %d starts at %zu, not a layer boundary", what, i, b->lo);
        if (b->ready_layer != lowest)
            fail_msg("%s: bucket %d is ready after layer %d, its lowest is %d", what, i, b->ready_layer,
                     lowest);
        if (b->lo > 0 && b->hi - b->lo < want)
            fail_msg("%s: bucket %d holds %zu elements, under the %zu asked for", what, i, b->hi - b->lo,
                     want);
        // the next layer boundary above lo, inside the bucket: without its lowest layer the bucket would have
        // been short, else it should have been cut there
        for (int l = 1; l < L; l++)
            if (pt->layer_begin[l] > b->lo && pt->layer_begin[l] < b->hi) {
                if (b->hi - pt->layer_begin[l] >= want)
                    fail_msg("%s: bucket %d [%zu, %zu) could have ended at layer %d (%zu >= %zu)", what, i,
                             b->lo, b->hi, l, b->hi - pt->layer_begin[l], want);
                break;
            }
    }
}

static void test_buckets_cut_at_layer_boundaries_to_bucket_mb(void **state) {
    (void)state;
    for (int s = 0; s < N_SHAPES; s++) {
        struct kiln_param_table pt;
        table_of(s, &pt);
        size_t want[N_WANTS];
        wants_of(&pt, want);
        for (int k = 0; k < N_WANTS; k++) {
            struct kiln_shard_plan p;
            kiln_shard_plan(&p, &pt, 0, mb_of(want[k]), sizeof(float), 1, 0);
            char what[160];
            snprintf(what, sizeof(what), "%s, buckets of %zu elements", shapes[s].name, want[k]);
            check_buckets(&pt, &p, want[k], what);
            if (k == 0 && p.nb != (layers(&pt) ? layers(&pt) : 1))
                fail_msg("%s: %d buckets, not one a layer", what, p.nb);
            if (k == N_WANTS - 1 && p.nb != 1)
                fail_msg("%s: %d buckets, not one", what, p.nb);
            kiln_shard_plan_free(&p);
        }
        // the gradient's dtype sets the elements a MiB holds: bf16 buckets hold twice the elements of f32's
        struct kiln_shard_plan p32, p16;
        kiln_shard_plan(&p32, &pt, 0, mb_of(want[1]), sizeof(float), 1, 0);
        kiln_shard_plan(&p16, &pt, 0, mb_of(want[1]), 2, 1, 0);
        check_buckets(&pt, &p16, want[1] * 2, shapes[s].name);
        assert_true(p16.nb <= p32.nb);
        kiln_shard_plan_free(&p32);
        kiln_shard_plan_free(&p16);
        kiln_params_free(&pt);
    }
}

// ZeRO-3 gathers a bucket a layer: the last with the final norm and head, the first with the embeddings,
// whatever --bucket-mb says.
static void test_zero3_buckets_are_layers(void **state) {
    (void)state;
    for (int s = 0; s < N_SHAPES; s++) {
        struct kiln_param_table pt;
        table_of(s, &pt);
        int L = layers(&pt);
        for (int w = 1; w <= MAX_WORLD; w++) {
            struct kiln_shard_plan p;
            kiln_shard_plan(&p, &pt, 1, mb_of(pt.total * 4), sizeof(float), w, w - 1);
            assert_int_equal(p.nb, L);
            for (int i = 0; i < p.nb; i++) {
                int l = L - 1 - i; // b[0] is the last layer's
                size_t lo = l == 0 ? 0 : pt.layer_begin[l], hi = i == 0 ? pt.total : pt.layer_begin[l + 1];
                if (p.b[i].lo != lo || p.b[i].hi != hi || p.b[i].ready_layer != (l == 0 ? -1 : l))
                    fail_msg("%s, world %d: bucket %d is [%zu, %zu) ready after %d; layer %d is [%zu, %zu)",
                             shapes[s].name, w, i, p.b[i].lo, p.b[i].hi, p.b[i].ready_layer, l, lo, hi);
            }
            kiln_shard_plan_free(&p);
        }
        kiln_params_free(&pt);
    }
}

// ---- shards ----

// For every world size and rank: the ranges of all ranks cover every flat element exactly once (padding too:
// it is reduced and gathered with its bucket), AdamW's spans every parameter element exactly once and no
// padding; a rank's state offsets run 0, 1, ... through its ranges in bucket order, and its spans sit at
// their range's offsets; shares differ by at most one element a bucket.
static void check_shards(const struct kiln_param_table *pt, int layer_buckets, size_t want,
                         const char *name) {
    unsigned char *held = held_of(pt);
    unsigned char *range_cover = malloc(pt->total), *span_cover = malloc(pt->total);
    for (int w = 1; w <= MAX_WORLD; w++) {
        memset(range_cover, 0, pt->total);
        memset(span_cover, 0, pt->total);
        size_t owned_min = SIZE_MAX, owned_max = 0;
        int nb = 0;
        for (int r = 0; r < w; r++) {
            struct kiln_shard_plan p;
            kiln_shard_plan(&p, pt, layer_buckets, mb_of(want), sizeof(float), w, r);
            nb = p.nb;
            char what[200];
            snprintf(what, sizeof(what), "%s, %s buckets of %zu, rank %d of %d", name,
                     layer_buckets ? "layer" : "mb", want, r, w);
            // the ranges: in bucket order (descending), compact state offsets
            size_t state = 0;
            for (int q = 0; q < p.n_ranges; q++) {
                const struct kiln_dp_range *g = &p.ranges[q];
                assert_true(g->lo < g->hi && g->hi <= pt->total);
                if (g->state_offset != state)
                    fail_msg("%s: range %d [%zu, %zu) at state %zu, not %zu", what, q, g->lo, g->hi,
                             g->state_offset, state);
                if (q > 0 && g->hi > p.ranges[q - 1].lo)
                    fail_msg("%s: range %d is not below range %d", what, q, q - 1);
                for (size_t i = g->lo; i < g->hi; i++)
                    range_cover[i]++;
                state += g->hi - g->lo;
            }
            if (state != p.owned)
                fail_msg("%s: ranges hold %zu elements, owned says %zu", what, state, p.owned);
            // each bucket's slice: where the plan says, of floor or ceil of its share
            size_t bstate = 0;
            for (int i = 0; i < p.nb; i++) {
                const struct kiln_shard_bucket *b = &p.b[i];
                size_t n = b->hi - b->lo, len = b->slice_hi - b->slice_lo;
                if (len != n / (size_t)w && len != (n + (size_t)w - 1) / (size_t)w)
                    fail_msg("%s: bucket %d of %zu gives a slice of %zu", what, i, n, len);
                if (b->state_offset != bstate)
                    fail_msg("%s: bucket %d's slice at state %zu, not %zu", what, i, b->state_offset, bstate);
                bstate += len;
            }
            // the spans: inside the ranges, at the ranges' state offsets, never on padding
            for (int k = 0; k < p.n_spans; k++) {
                const struct kiln_param_span *sp = &p.spans[k];
                int in = 0;
                for (int q = 0; q < p.n_ranges; q++) {
                    const struct kiln_dp_range *g = &p.ranges[q];
                    if (sp->offset >= g->lo && sp->offset + sp->count <= g->hi) {
                        in = 1;
                        if (sp->state_offset != g->state_offset + (sp->offset - g->lo))
                            fail_msg("%s: span at %zu has state %zu, its range says %zu", what, sp->offset,
                                     sp->state_offset, g->state_offset + (sp->offset - g->lo));
                    }
                }
                if (!in)
                    fail_msg("%s: span [%zu, +%zu) lies outside the rank's ranges", what, sp->offset,
                             sp->count);
                for (size_t i = sp->offset; i < sp->offset + sp->count; i++) {
                    if (!held[i])
                        fail_msg("%s: span [%zu, +%zu) covers padding at %zu", what, sp->offset, sp->count,
                                 i);
                    span_cover[i]++;
                }
                // decay as its tensor's
                for (int t = 0; t < pt->n; t++)
                    if (sp->offset >= pt->p[t].offset && sp->offset < pt->p[t].offset + pt->p[t].count)
                        assert_int_equal(sp->decay, pt->p[t].decay);
            }
            // the padding: exactly the elements of each bucket no tensor holds
            for (int i = 0; i < p.nb; i++) {
                const struct kiln_shard_bucket *b = &p.b[i];
                size_t pad = 0;
                for (size_t e = b->lo; e < b->hi; e++)
                    pad += !held[e];
                size_t gaps = 0;
                for (int k = b->gap0; k < b->gap0 + b->n_gaps; k++) {
                    const struct kiln_shard_gap *gp = &p.gaps[k];
                    assert_true(gp->lo >= b->lo && gp->hi <= b->hi && gp->lo < gp->hi);
                    for (size_t e = gp->lo; e < gp->hi; e++)
                        if (held[e])
                            fail_msg("%s: bucket %d's gap [%zu, %zu) holds a parameter at %zu", what, i,
                                     gp->lo, gp->hi, e);
                    gaps += gp->hi - gp->lo;
                }
                if (gaps != pad)
                    fail_msg("%s: bucket %d has %zu padding elements, its gaps %zu", what, i, pad, gaps);
            }
            owned_min = p.owned < owned_min ? p.owned : owned_min;
            owned_max = p.owned > owned_max ? p.owned : owned_max;
            kiln_shard_plan_free(&p);
        }
        for (size_t i = 0; i < pt->total; i++) {
            if (range_cover[i] != 1)
                fail_msg("%s, world %d: flat element %zu is in %d ranks' ranges", name, w, i, range_cover[i]);
            if (span_cover[i] != held[i])
                fail_msg("%s, world %d: parameter element %zu is in %d ranks' spans", name, w, i,
                         span_cover[i]);
        }
        // balanced: a bucket's slices differ by at most one element, so shares by at most one a bucket
        if (owned_max - owned_min > (size_t)nb)
            fail_msg("%s, world %d: shares from %zu to %zu elements over %d buckets", name, w, owned_min,
                     owned_max, nb);
    }
    free(held);
    free(range_cover);
    free(span_cover);
}

static void test_every_element_has_one_owner_with_compact_balanced_state(void **state) {
    (void)state;
    for (int s = 0; s < N_SHAPES; s++) {
        struct kiln_param_table pt;
        table_of(s, &pt);
        size_t want[N_WANTS];
        wants_of(&pt, want);
        for (int k = 0; k < N_WANTS; k++)
            check_shards(&pt, 0, want[k], shapes[s].name);
        check_shards(&pt, 1, want[0], shapes[s].name);
        kiln_params_free(&pt);
    }
}

// Resharding reads bounds from a checkpoint, not a table: buckets of any size, some smaller than the world
// (rank r's slice of a bucket of n < world elements may be empty, and is then no range), some empty.
static void test_ranges_for_partitions_any_bounds(void **state) {
    (void)state;
    uint64_t rs = test_seed();
    for (int trial = 0; trial < 200; trial++) {
        int nb = 1 + (int)(test_rand_u64(&rs) % 9);
        size_t sizes[10], total = 0;
        for (int i = 0; i < nb; i++) {
            sizes[i] = (size_t)(test_rand_u64(&rs) % (trial % 2 ? 12 : 5000));
            total += sizes[i];
        }
        size_t bounds[11];
        bounds[0] = total;
        for (int i = 0; i < nb; i++)
            bounds[i + 1] = bounds[i] - sizes[i];
        unsigned char *cover = calloc(total + 1, 1);
        for (int w = 1; w <= MAX_WORLD; w++) {
            memset(cover, 0, total + 1);
            for (int r = 0; r < w; r++) {
                struct kiln_dp_range *v;
                int n = kiln_dp_ranges_for(bounds, nb, w, r, &v), q = 0;
                size_t at_state = 0;
                for (int i = 0; i < nb; i++) { // the rank's slice of each bucket, in bucket order, if any
                    size_t lo, hi;
                    kiln_comm_slice(sizes[i], w, r, &lo, &hi);
                    if (lo == hi)
                        continue;
                    if (q >= n || v[q].lo != bounds[i + 1] + lo || v[q].hi != bounds[i + 1] + hi ||
                        v[q].state_offset != at_state)
                        fail_msg(
                            "world %d, rank %d, bucket %d of %zu: range %d is not its slice [%zu, %zu) at "
                            "state %zu",
                            w, r, i, sizes[i], q, bounds[i + 1] + lo, bounds[i + 1] + hi, at_state);
                    at_state += hi - lo;
                    q++;
                }
                assert_int_equal(q, n); // no empty ranges, nothing else
                for (int k = 0; k < n; k++)
                    for (size_t e = v[k].lo; e < v[k].hi; e++)
                        cover[e]++;
                free(v);
            }
            for (size_t e = 0; e < total; e++)
                if (cover[e] != 1)
                    fail_msg("world %d: element %zu of %zu in %d ranks' ranges", w, e, total, cover[e]);
        }
        free(cover);
    }
}

// ---- the data-parallel layer plans with the same rules ----

// A communicator that only says where this process sits: kiln_dp_create and kiln_dp_attach communicate
// nothing, so planning and allocating can be checked for any world size in one process.
static struct kiln_comm fake_comm(int world, int rank) {
    return (struct kiln_comm){.kind = KILN_COMM_MPI, .rank = rank, .size = world};
}

// Allocations through the backend, counted by kind, so that the memory plan can be held to them.
static const struct kiln_ops *real_ops;
static size_t dev_bytes, host_bytes;

static void *count_alloc(void *ctx, size_t bytes) {
    dev_bytes += bytes;
    return real_ops->alloc(ctx, bytes);
}

static void *count_host_alloc(void *ctx, size_t bytes) {
    host_bytes += bytes;
    return real_ops->host_alloc(ctx, bytes);
}

static void open_counting_cpu(struct kiln_backend *be, struct kiln_ops *ops) {
    struct kiln_error e;
    struct kiln_backend_opts bo = {.threads = 1};
    assert_int_equal(kiln_backend_open("cpu", &bo, be, &e), 0);
    real_ops = be->ops;
    *ops = *be->ops;
    ops->alloc = count_alloc;
    ops->host_alloc = count_host_alloc;
    be->ops = ops;
}

static void close_counting_cpu(struct kiln_backend *be) {
    be->ops = real_ops;
    kiln_backend_close(be);
}

// kiln_dp_create's ranges and bounds are the shard plan's, and kiln_dp_ranges_for, the rule a checkpoint
// written at another world size is resharded by, gives every rank the same ranges from the bounds alone.
static void test_ranges_for_agrees_with_dp_create(void **state) {
    (void)state;
    struct kiln_backend be;
    struct kiln_ops ops;
    open_counting_cpu(&be, &ops);
    for (int s = 0; s < N_SHAPES; s++) {
        struct kiln_param_table pt;
        table_of(s, &pt);
        size_t want[N_WANTS];
        wants_of(&pt, want);
        for (int zero = 0; zero <= 3; zero++)
            for (int k = 0; k < N_WANTS; k++)
                for (int w = 1; w <= MAX_WORLD; w++)
                    for (int r = 0; r < w; r++) {
                        struct kiln_comm comm = fake_comm(w, r);
                        struct kiln_dp_opts o = {.zero = zero, .bucket_mb = mb_of(want[k])};
                        struct kiln_dp *dp;
                        kiln_dp_create(&dp, &comm, &be, &pt, &o);
                        int nb, n, n2;
                        const size_t *bounds = kiln_dp_bucket_bounds(dp, &nb);
                        const struct kiln_dp_range *got = kiln_dp_ranges(dp, &n);
                        struct kiln_dp_range *rule;
                        n2 = kiln_dp_ranges_for(bounds, nb, w, r, &rule);
                        struct kiln_shard_plan p;
                        kiln_shard_plan(&p, &pt, zero == 3, o.bucket_mb, sizeof(float), w, r);
                        assert_int_equal(nb, p.nb);
                        assert_memory_equal(bounds, p.bounds, (size_t)(nb + 1) * sizeof(size_t));
                        if (n != n2 || n != p.n_ranges || memcmp(got, rule, (size_t)n * sizeof(*got)) ||
                            memcmp(got, p.ranges, (size_t)n * sizeof(*got)))
                            fail_msg("%s, zero %d, world %d, rank %d: kiln_dp_create's %d ranges differ from "
                                     "kiln_dp_ranges_for's %d",
                                     shapes[s].name, zero, w, r, n, n2);
                        // ZeRO holds the moments of its slices only (at least one element), DDP all of them
                        size_t elems = zero ? (p.owned ? p.owned : 1) : pt.total;
                        assert_int_equal(kiln_dp_optim_elems(dp), elems);
                        free(rule);
                        kiln_shard_plan_free(&p);
                        kiln_dp_free(dp);
                    }
        kiln_params_free(&pt);
    }
    close_counting_cpu(&be);
}

// What kiln_dp_plan_memory says data parallelism adds (staging, the gradient shard and its addend, ZeRO-3's
// gathered weights, the offloaded optimizer's page-locked staging) is what attaching to a model and running
// micro-steps allocates, and the model and optimizer-state options it implies are kiln_dp_model_opts' and
// kiln_dp_optim_opts'. The model and the optimizer's state allocate what their plans say, with the compute
// weights as the master (the CPU) and apart from it (as on a GPU: variants 4-7 turn the aliasing off).
static void test_memory_plan_matches_allocations(void **state) {
    (void)state;
    struct kiln_backend be;
    struct kiln_ops ops;
    open_counting_cpu(&be, &ops);
    const int worlds[] = {1, 2, 3, 8};
    for (int s = 0; s < N_SHAPES; s++) {
        struct kiln_model_config m;
        model_of(s, &m);
        struct kiln_param_table pt;
        kiln_params_build(&pt, &m);
        for (int zero = 0; zero <= 3; zero++)
            for (int wi = 0; wi < 4; wi++)
                for (int variant = 0; variant < 8; variant++) {
                    int w = worlds[wi], r = w - 1, accum = 1 + (variant & 1), offload = (variant >> 1) & 1;
                    be.weights_alias_master = variant < 4;
                    struct kiln_dp_opts o = {.zero = zero,
                                             .bucket_mb = mb_of(pt.total / 3),
                                             .prefetch = 1 + (variant & 1),
                                             .keep_gathered = (variant & 3) == 3,
                                             .offload = offload,
                                             .offload_chunk = 100};
                    struct kiln_model_opts planned = {0};
                    struct kiln_optim_state_opts planned_st = {0};
                    struct kiln_dp_mem mem;
                    kiln_dp_plan_memory(&pt, &o, w, r, be.act_dtype, be.grad_dtype, accum, &planned,
                                        &planned_st, &mem);
                    struct kiln_comm comm = fake_comm(w, r);
                    struct kiln_dp *dp;
                    kiln_dp_create(&dp, &comm, &be, &pt, &o);
                    struct kiln_model_opts go = {.B = 1, .T = 4, .training = 1};
                    kiln_dp_model_opts(dp, &go);
                    struct kiln_optim_state_opts so = {0};
                    kiln_dp_optim_opts(dp, &so);
                    assert_int_equal(so.elems, planned_st.elems);
                    assert_int_equal(so.total, planned_st.total);
                    assert_int_equal(so.master_compact, planned_st.master_compact);
                    assert_int_equal(so.offload, planned_st.offload);
                    assert_int_equal(go.external_grads, planned.external_grads);
                    assert_int_equal(go.external_weights, planned.external_weights);
                    struct kiln_model *g;
                    struct kiln_error e;
                    dev_bytes = 0;
                    if (kiln_model_create(&g, &m, &be, &go, &e))
                        fail_msg("create: %s", e.msg);
                    struct kiln_model_buffers mb;
                    kiln_model_buffers(g, &mb);
                    so.weights = mb.weights;
                    struct kiln_optim_state *st;
                    if (kiln_optim_state_create(&st, &be, &so, &e))
                        fail_msg("optimizer state: %s", e.msg);
                    struct kiln_mem_plan mp;
                    kiln_model_plan(&m, &go, be.act_dtype, be.grad_dtype, be.weights_alias_master, &mp);
                    struct kiln_optim_plan op;
                    kiln_optim_state_plan(&so, be.act_dtype, be.weights_alias_master, &op);
                    if (dev_bytes != mp.total_bytes + op.total_bytes)
                        fail_msg("%s, zero %d, world %d, offload %d, alias %d: the model and the optimizer's "
                                 "state allocated %zu bytes, their plans say %zu + %zu",
                                 shapes[s].name, zero, w, offload, be.weights_alias_master, dev_bytes,
                                 mp.total_bytes, op.total_bytes);
                    dev_bytes = host_bytes = 0;
                    kiln_dp_attach(dp, g, st);
                    for (int micro = 0; micro < accum; micro++) // ZeRO-2's addend comes with micro-step 1
                        kiln_dp_micro_step(dp, micro, accum);
                    size_t want_dev = mem.staging + mem.grad_shard + mem.gathered;
                    size_t state_bytes = offload ? 3 * so.elems * sizeof(float) : 0; // malloc'd
                    if (dev_bytes != want_dev || host_bytes + state_bytes != mem.host)
                        fail_msg(
                            "%s, zero %d, world %d, accum %d, offload %d: allocated %zu bytes on the "
                            "backend and %zu pinned, the plan says %zu (staging %zu, shard %zu, gathered "
                            "%zu) and %zu on the host",
                            shapes[s].name, zero, w, accum, offload, dev_bytes, host_bytes, want_dev,
                            mem.staging, mem.grad_shard, mem.gathered, mem.host);
                    // ZeRO-3's gathered weights (dp.h): none at world size 1, where the model reads its shard
                    // in place; else the top and bottom buckets, and a ring of 2 + prefetch slots for the
                    // layers between (with keep_gathered, a slot for each of them)
                    if (zero == 3) {
                        struct kiln_shard_plan p;
                        kiln_shard_plan(&p, &pt, 1, 0, sizeof(float), w, r);
                        size_t top = p.b[0].hi - p.b[0].lo, bottom = 0, mid = kiln_shard_mid_elems(&p);
                        if (p.nb > 1)
                            bottom = p.b[p.nb - 1].hi - p.b[p.nb - 1].lo;
                        size_t slots =
                            o.keep_gathered ? (size_t)(p.nb > 3 ? p.nb - 2 : 1) : 2 + (size_t)o.prefetch;
                        size_t want_gathered = w == 1 ? 0 : (top + bottom + slots * mid) * sizeof(float);
                        if (mem.gathered != want_gathered)
                            fail_msg(
                                "%s, world %d, keep %d, prefetch %d: %zu bytes of gathered weights planned, "
                                "not %zu",
                                shapes[s].name, w, o.keep_gathered, o.prefetch, mem.gathered, want_gathered);
                        kiln_shard_plan_free(&p);
                    }
                    kiln_dp_free(dp);
                    kiln_optim_state_free(st);
                    kiln_model_free(g);
                }
        kiln_params_free(&pt);
    }
    be.weights_alias_master = 1;
    close_counting_cpu(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_cut_at_layer_boundaries_to_bucket_mb),
        cmocka_unit_test(test_zero3_buckets_are_layers),
        cmocka_unit_test(test_every_element_has_one_owner_with_compact_balanced_state),
        cmocka_unit_test(test_ranges_for_partitions_any_bounds),
        cmocka_unit_test(test_ranges_for_agrees_with_dp_create),
        cmocka_unit_test(test_memory_plan_matches_allocations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
