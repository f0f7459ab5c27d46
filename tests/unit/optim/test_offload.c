// The offloaded optimizer's pipeline (optim/offload.h) on the CPU backend, as a specification: over the same
// spans it gives bitwise the master weights, moments and compute weights of the plain AdamW step
// (optim/adamw.h) whatever the chunk size, step after step; and a reader that waits for the chunks it reads
// sees the updated weights even when the host is slow.
#include "test_util.h"

#include "core/backend.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/offload.h"
#include "parallel/shard.h"
#include "run/options.h"

// What a process updates, laid out as the data-parallel layer does it.
enum layout {
    WHOLE,         // DDP: every element, state offset = offset, whole gradients and weights
    SHARD,         // ZeRO-2: a rank's slices, its reduced gradients compact, the weights whole
    SHARD_WEIGHTS, // ZeRO-3: the weights (master and compute copy) compact too
};
static const char *layout_name[] = {"whole", "shard", "sharded weights"};

struct setup {
    struct kiln_backend be;
    struct kiln_param_table pt;
    enum layout lay;
    size_t total, elems;
    struct kiln_offload_piece *pieces;
    int n_pieces;
    struct kiln_param_span *spans;
    int n_spans;
    struct kiln_shard_plan sh; // SHARD, SHARD_WEIGHTS: rank 1 of 3, a bucket a layer
    float *init;               // (total) host: the initial master weights
    // the plain path's buffers (backend): master weights (whole, or compact for SHARD_WEIGHTS), gradients
    // (whole for WHOLE, else compact), moments
    float *p, *g, *m, *v;
    // the offloaded path's: the compute copy the pipeline writes (whole, or compact for SHARD_WEIGHTS)
    float *w;
};

static void table(struct kiln_param_table *pt) {
    struct kiln_config c;
    struct kiln_error e;
    assert_int_equal(kiln_config_init(&c, "shakespeare-char", &e), 0);
    struct kiln_model_config m = c.model;
    m.n_layer = 3;
    m.n_head = 4;
    m.n_embd = 24; // padding after every norm and bias
    m.block_size = 16;
    m.vocab_size = 50;
    m.vocab_multiple = 64;
    m.tie_embeddings = 0;
    kiln_params_build(pt, &m);
}

static int layers(const struct kiln_param_table *pt) {
    int L = 0;
    for (int i = 0; i < pt->n; i++)
        L = pt->p[i].layer + 1 > L ? pt->p[i].layer + 1 : L;
    return L;
}

static void *balloc(struct setup *s, size_t bytes) {
    void *p = s->be.ops->alloc(s->be.ctx, bytes);
    assert_non_null(p);
    return p;
}

static void setup_open(struct setup *s, enum layout lay) {
    memset(s, 0, sizeof(*s));
    struct kiln_error e;
    struct kiln_backend_opts bo = {.threads = 2};
    assert_int_equal(kiln_backend_open("cpu", &bo, &s->be, &e), 0);
    table(&s->pt);
    s->lay = lay;
    s->total = s->pt.total;
    int L = layers(&s->pt);
    if (lay == WHOLE) {
        // the segments (embeddings, each layer, the final norm and head), read in an order other than their
        // flat one, so that the pipeline must sort them: the head first, then the layers from the top down,
        // the embeddings last
        s->elems = s->total;
        s->spans = kiln_adamw_table_spans(&s->pt, &s->n_spans);
        s->pieces = calloc((size_t)L + 2, sizeof(*s->pieces));
        size_t lo = 0;
        for (int k = 0; k <= L + 1; k++) {
            size_t hi = k <= L ? s->pt.layer_begin[k] : s->total;
            s->pieces[s->n_pieces++] = (struct kiln_offload_piece){lo, hi, lo, L + 1 - k};
            lo = hi;
        }
    } else {
        // rank 1 of 3, a bucket a layer: each range a piece, read bottom first (as ZeRO-3 gathers them)
        kiln_shard_plan(&s->sh, &s->pt, 1, 0, sizeof(float), 3, 1);
        s->elems = s->sh.owned;
        s->n_spans = s->sh.n_spans;
        s->spans = malloc((size_t)s->n_spans * sizeof(*s->spans));
        memcpy(s->spans, s->sh.spans, (size_t)s->n_spans * sizeof(*s->spans));
        s->n_pieces = s->sh.n_ranges;
        s->pieces = calloc((size_t)s->n_pieces, sizeof(*s->pieces));
        for (int r = 0; r < s->n_pieces; r++) {
            const struct kiln_dp_range *q = &s->sh.ranges[r];
            s->pieces[r] = (struct kiln_offload_piece){q->lo, q->hi, q->state_offset, s->n_pieces - 1 - r};
        }
    }
    uint64_t rs = test_seed();
    s->init = malloc(s->total * sizeof(float));
    test_fill_normal(s->init, s->total, 0.5f, &rs);
    size_t np = lay == SHARD_WEIGHTS ? s->elems : s->total, ng = lay == WHOLE ? s->total : s->elems;
    s->p = balloc(s, np * sizeof(float));
    s->g = balloc(s, ng * sizeof(float));
    s->m = balloc(s, s->elems * sizeof(float));
    s->v = balloc(s, s->elems * sizeof(float));
    s->w = balloc(s, np * sizeof(float));
    if (lay == SHARD_WEIGHTS) // the rank's slices, compact
        for (int r = 0; r < s->sh.n_ranges; r++) {
            const struct kiln_dp_range *q = &s->sh.ranges[r];
            memcpy(s->p + q->state_offset, s->init + q->lo, (q->hi - q->lo) * sizeof(float));
        }
    else
        memcpy(s->p, s->init, s->total * sizeof(float));
}

static void setup_close(struct setup *s) {
    float *bufs[] = {s->p, s->g, s->m, s->v, s->w};
    for (int i = 0; i < 5; i++)
        s->be.ops->free(s->be.ctx, bufs[i]);
    free(s->init);
    free(s->pieces);
    free(s->spans);
    kiln_shard_plan_free(&s->sh);
    kiln_params_free(&s->pt);
    kiln_backend_close(&s->be);
}

static struct kiln_offload_pipe *offload_open(struct setup *s, size_t chunk, int delay_us) {
    struct kiln_offload_opts o = {.elems = s->elems,
                                  .total = s->total,
                                  .pieces = s->pieces,
                                  .n_pieces = s->n_pieces,
                                  .spans = s->spans,
                                  .n_spans = s->n_spans,
                                  .grads = s->g,
                                  .grads_compact = s->lay != WHOLE,
                                  .weights = s->w,
                                  .weights_compact = s->lay == SHARD_WEIGHTS,
                                  .chunk = chunk,
                                  .host_threads = 2,
                                  .delay_us = delay_us};
    struct kiln_offload_pipe *off;
    kiln_offload_create(&off, &s->be, &o);
    kiln_offload_set_master(off, s->init);
    return off;
}

// Fresh gradients for a step, on the backend (a few outliers, so that clipping and the moments see range).
static void new_grads(struct setup *s, uint64_t *rs) {
    size_t ng = s->lay == WHOLE ? s->total : s->elems;
    test_fill_normal(s->g, ng, 1.0f, rs);
    for (size_t i = 0; i < ng; i += 97)
        s->g[i] *= 30.0f;
}

static struct kiln_adamw_hparams hparams(int step) {
    return (struct kiln_adamw_hparams){.lr = 1e-2f,
                                       .beta1 = 0.9f,
                                       .beta2 = 0.95f,
                                       .eps = 1e-8f,
                                       .weight_decay = 0.1f,
                                       .grad_clip = 1.0f,
                                       .grad_scale = 0.5f,
                                       .step = step};
}

// The plain path's step over the same spans (the backend's adamw op).
static void plain_step(struct setup *s, const struct kiln_adamw_hparams *h, double norm) {
    struct kiln_adamw_buffers b = {.params = s->p,
                                   .weights = NULL,
                                   .grads = s->g,
                                   .m = s->m,
                                   .v = s->v,
                                   .grads_compact = s->lay != WHOLE,
                                   .params_compact = s->lay == SHARD_WEIGHTS};
    kiln_adamw_step(&s->be, &b, s->spans, s->n_spans, h, norm);
}

// where flat element i of a piece lives in the plain path's master and the pipeline's compute copy
static size_t at_of(const struct setup *s, const struct kiln_offload_piece *pc, size_t i) {
    return s->lay == SHARD_WEIGHTS ? pc->so + (i - pc->lo) : i;
}

// The compute weights of every parameter element in the pieces with order <= max_order are the plain path's;
// returns the first that is not (SIZE_MAX: none).
static size_t first_stale(const struct setup *s, int max_order) {
    for (int k = 0; k < s->n_spans; k++) {
        const struct kiln_param_span *sp = &s->spans[k];
        for (int r = 0; r < s->n_pieces; r++) {
            const struct kiln_offload_piece *pc = &s->pieces[r];
            if (pc->order > max_order || sp->offset < pc->lo || sp->offset >= pc->hi)
                continue;
            for (size_t i = sp->offset; i < sp->offset + sp->count; i++) {
                size_t a = at_of(s, pc, i);
                if (memcmp(&s->w[a], &s->p[a], sizeof(float)))
                    return i;
            }
        }
    }
    return SIZE_MAX;
}

// After a settled step: the host master and moments are bitwise the plain path's at every state offset, and
// the compute weights at every parameter element.
static void expect_same(struct setup *s, struct kiln_offload_pipe *off, const char *what) {
    float *m, *v, *master = kiln_offload_master(off);
    kiln_offload_moments(off, &m, &v);
    for (size_t so = 0; so < s->elems; so++) {
        size_t flat = so; // WHOLE: state offset = offset
        if (s->lay != WHOLE)
            for (int r = 0; r < s->sh.n_ranges; r++)
                if (so >= s->sh.ranges[r].state_offset &&
                    so < s->sh.ranges[r].state_offset + (s->sh.ranges[r].hi - s->sh.ranges[r].lo))
                    flat = s->sh.ranges[r].lo + (so - s->sh.ranges[r].state_offset);
        float want = s->p[s->lay == SHARD_WEIGHTS ? so : flat];
        if (memcmp(&master[so], &want, sizeof(float)) || memcmp(&m[so], &s->m[so], sizeof(float)) ||
            memcmp(&v[so], &s->v[so], sizeof(float)))
            fail_msg("%s: state offset %zu (flat %zu): master %.9g m %.9g v %.9g, plain %.9g %.9g %.9g", what,
                     so, flat, master[so], m[so], v[so], want, s->m[so], s->v[so]);
    }
    size_t bad = first_stale(s, 1 << 30);
    if (bad != SIZE_MAX)
        fail_msg("%s: compute weight at flat %zu differs from the plain path's", what, bad);
}

// Bitwise the plain step's result, over several chunk sizes: chunks that cut spans (7, 100 elements), one
// that is just a layer's size, exactly everything, and more than everything; and over four steps with fresh
// gradients each (the moments and the bias correction carry over).
static void check_bitwise(enum layout lay) {
    struct setup s;
    setup_open(&s, lay);
    size_t layer = s.pt.layer_begin[1] - s.pt.layer_begin[0];
    const size_t chunks[] = {7, 100, layer, s.elems, 10 * s.total};
    for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
        // the plain path starts over from the initial weights and zero moments
        memset(s.m, 0, s.elems * sizeof(float));
        memset(s.v, 0, s.elems * sizeof(float));
        if (lay == SHARD_WEIGHTS)
            for (int r = 0; r < s.sh.n_ranges; r++)
                memcpy(s.p + s.sh.ranges[r].state_offset, s.init + s.sh.ranges[r].lo,
                       (s.sh.ranges[r].hi - s.sh.ranges[r].lo) * sizeof(float));
        else
            memcpy(s.p, s.init, s.total * sizeof(float));
        struct kiln_offload_pipe *off = offload_open(&s, chunks[c], 0);
        if (chunks[c] >= s.elems)
            assert_int_equal(kiln_offload_chunks(off), s.n_pieces); // a chunk a piece
        uint64_t rs = test_seed() ^ (uint64_t)(c + 1);
        for (int step = 1; step <= 4; step++) {
            new_grads(&s, &rs);
            struct kiln_adamw_hparams h = hparams(step);
            double norm = 3.0 + step; // clipped: grad_scale * norm > grad_clip
            assert_int_equal(kiln_offload_step(off, &h, norm), 0);
            plain_step(&s, &h, norm);
            kiln_offload_settle(off);
            assert_false(kiln_offload_running(off));
            char what[160];
            snprintf(what, sizeof(what), "%s, chunks of %zu, step %d", layout_name[lay], chunks[c], step);
            expect_same(&s, off, what);
        }
        struct kiln_offload_stats st;
        kiln_offload_stats(off, &st);
        // every step moved each chunk's gradients down and its weights up once
        assert_true(st.copy_bytes == 4.0 * (double)s.elems * 2 * sizeof(float));
        kiln_offload_free(off);
    }
    setup_close(&s);
}

static void test_offload_is_bitwise_plain_adamw_whole(void **state) {
    (void)state;
    check_bitwise(WHOLE);
}

static void test_offload_is_bitwise_plain_adamw_shard(void **state) {
    (void)state;
    check_bitwise(SHARD);
}

static void test_offload_is_bitwise_plain_adamw_sharded_weights(void **state) {
    (void)state;
    check_bitwise(SHARD_WEIGHTS);
}

// A slow host (each chunk's AdamW starts 3 ms late): a reader that waits for the chunks up to the order it is
// about to read (kiln_offload_chunks_through) finds every piece of that order or less updated, order after
// order, while the step runs; ZeRO-3's reader, which waits for the chunks over a bucket's state
// (kiln_offload_chunks_over), finds that bucket's slice updated.
static void check_readers_wait(enum layout lay) {
    struct setup s;
    setup_open(&s, lay);
    size_t chunk = s.elems / 9 + 1; // about ten chunks, cutting spans and pieces
    struct kiln_offload_pipe *off = offload_open(&s, chunk, 3000);
    uint64_t rs = test_seed() ^ 77;
    for (int step = 1; step <= 2; step++) {
        new_grads(&s, &rs);
        struct kiln_adamw_hparams h = hparams(step);
        plain_step(&s, &h, 2.0);
        assert_int_equal(kiln_offload_step(off, &h, 2.0), 0);
        int max_order = 0;
        for (int r = 0; r < s.n_pieces; r++)
            max_order = s.pieces[r].order > max_order ? s.pieces[r].order : max_order;
        if (lay == SHARD_WEIGHTS) { // the buckets, bottom first, as the forward gathers them
            for (int i = s.sh.nb - 1; i >= 0; i--) {
                const struct kiln_shard_bucket *b = &s.sh.b[i];
                size_t n = b->slice_hi - b->slice_lo;
                kiln_offload_wait(off, kiln_offload_chunks_over(off, b->state_offset, n));
                for (int k = 0; k < s.n_spans; k++) {
                    const struct kiln_param_span *sp = &s.spans[k];
                    if (sp->state_offset < b->state_offset || sp->state_offset >= b->state_offset + n)
                        continue;
                    if (memcmp(s.w + sp->state_offset, s.p + sp->state_offset, sp->count * sizeof(float)))
                        fail_msg("step %d: bucket %d's span at %zu read stale after waiting for its chunks",
                                 step, i, sp->offset);
                }
            }
        }
        for (int o = 0; o <= max_order; o++) {
            kiln_offload_wait(off, kiln_offload_chunks_through(off, o));
            size_t bad = first_stale(&s, o);
            if (bad != SIZE_MAX)
                fail_msg("%s, step %d: after waiting for order %d, the weight at flat %zu is stale",
                         layout_name[lay], step, o, bad);
        }
        kiln_offload_settle(off);
        expect_same(&s, off, layout_name[lay]);
    }
    struct kiln_offload_stats st;
    kiln_offload_stats(off, &st);
    // the reader waited (the host slept 3 ms before each of ~10 chunks a step), within the steps' time: up to
    // the last chunk's weights, less the scheduler's delay in waking the reader after it (10 ms a step, for a
    // machine busy with other programs)
    assert_true(st.wait_s > 0.02 && st.wait_s <= st.busy_s + 0.02);
    kiln_offload_free(off);
    setup_close(&s);
}

static void test_readers_wait_for_their_chunks_whole(void **state) {
    (void)state;
    check_readers_wait(WHOLE);
}

static void test_readers_wait_for_their_chunks_sharded_weights(void **state) {
    (void)state;
    check_readers_wait(SHARD_WEIGHTS);
}

// Whoever overwrites the gradients next (DDP's zero_grad of the embeddings) waits until the chunks that hold
// them have gone down: the host copy is then the step's, whatever is written to the backend after.
static void test_gradients_are_read_before_the_wait_returns(void **state) {
    (void)state;
    struct setup s;
    setup_open(&s, WHOLE);
    struct kiln_offload_pipe *off = offload_open(&s, s.elems / 9 + 1, 3000);
    uint64_t rs = test_seed() ^ 5;
    new_grads(&s, &rs);
    struct kiln_adamw_hparams h = hparams(1);
    plain_step(&s, &h, 2.0);
    assert_int_equal(kiln_offload_step(off, &h, 2.0), 0);
    int first = kiln_offload_chunks_through(off, 0); // the pieces read first
    assert_true(first >= 1);
    kiln_offload_wait_grads(off, first);
    // garbage over the gradients of those pieces: the step must not see it
    for (int r = 0; r < s.n_pieces; r++)
        if (s.pieces[r].order == 0)
            memset(s.g + s.pieces[r].lo, 0xff, (s.pieces[r].hi - s.pieces[r].lo) * sizeof(float));
    kiln_offload_settle(off);
    expect_same(&s, off, "gradients overwritten after wait_grads");
    kiln_offload_free(off);
    setup_close(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_is_bitwise_plain_adamw_whole),
        cmocka_unit_test(test_offload_is_bitwise_plain_adamw_shard),
        cmocka_unit_test(test_offload_is_bitwise_plain_adamw_sharded_weights),
        cmocka_unit_test(test_readers_wait_for_their_chunks_whole),
        cmocka_unit_test(test_readers_wait_for_their_chunks_sharded_weights),
        cmocka_unit_test(test_gradients_are_read_before_the_wait_returns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
