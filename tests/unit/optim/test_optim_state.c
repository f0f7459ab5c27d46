// The optimizer's state (optim/state.h) on the CPU backend, as a specification: the whole master weights set
// from host f32 read back at every state offset it holds, with the compute copy it keeps in step; the moments
// read back as set; the backend bytes it allocates are its plan's; and where the backend's weights are the
// master (the CPU) a flat master is the model's compute copy itself, so AdamW updates one buffer.
#include "test_util.h"

#include "core/backend.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/offload.h"
#include "optim/state.h"
#include "parallel/shard.h"
#include "run/options.h"

// Allocations through the backend, counted, so that the plan can be held to them.
static const struct kiln_ops *real_ops;
static size_t dev_bytes;

static void *count_alloc(void *ctx, size_t bytes) {
    dev_bytes += bytes;
    return real_ops->alloc(ctx, bytes);
}

struct setup {
    struct kiln_backend be;
    struct kiln_ops ops;
    struct kiln_param_table pt;
    struct kiln_shard_plan sh;    // rank 1 of 3, a bucket a layer (ZeRO-3's)
    struct kiln_param_span *held; // the shard's ranges as held runs
    float *init;                  // (total) host: the whole master weights
    float *weights;               // backend (total): the model's compute copy
    void *grads;                  // backend (total): gradients, for the offloaded pipeline
};

static void setup_open(struct setup *s, int alias) {
    memset(s, 0, sizeof(*s));
    struct kiln_error e;
    struct kiln_backend_opts bo = {.threads = 1};
    assert_int_equal(kiln_backend_open("cpu", &bo, &s->be, &e), 0);
    real_ops = s->be.ops;
    s->ops = *s->be.ops;
    s->ops.alloc = count_alloc;
    s->be.ops = &s->ops;
    s->be.weights_alias_master = alias; // off: as on a GPU, a master apart from the compute copy
    struct kiln_config c;
    assert_int_equal(kiln_config_init(&c, "shakespeare-char", &e), 0);
    c.model.n_layer = 3;
    c.model.n_head = 2;
    c.model.n_embd = 24;
    c.model.block_size = 16;
    c.model.vocab_size = 50;
    kiln_params_build(&s->pt, &c.model);
    kiln_shard_plan(&s->sh, &s->pt, 1, 0, sizeof(float), 3, 1);
    s->held = calloc((size_t)s->sh.n_ranges, sizeof(*s->held));
    for (int r = 0; r < s->sh.n_ranges; r++) {
        const struct kiln_dp_range *q = &s->sh.ranges[r];
        s->held[r] = (struct kiln_param_span){q->lo, q->hi - q->lo, 0, q->state_offset};
    }
    uint64_t rs = test_seed();
    s->init = malloc(s->pt.total * sizeof(float));
    test_fill_normal(s->init, s->pt.total, 0.5f, &rs);
    s->weights = real_ops->alloc(s->be.ctx, s->pt.total * sizeof(float));
    s->grads = real_ops->alloc(s->be.ctx, s->pt.total * sizeof(float));
}

static void setup_close(struct setup *s) {
    real_ops->free(s->be.ctx, s->weights);
    real_ops->free(s->be.ctx, s->grads);
    free(s->init);
    free(s->held);
    kiln_shard_plan_free(&s->sh);
    kiln_params_free(&s->pt);
    s->be.ops = real_ops;
    kiln_backend_close(&s->be);
}

// Creates the state for opts (weights: the setup's compute copy where the master is flat), holding the
// backend bytes it allocates to its plan.
static struct kiln_optim_state *state_open(struct setup *s, struct kiln_optim_state_opts *o) {
    o->total = s->pt.total;
    if (!o->master_compact)
        o->weights = s->weights;
    struct kiln_optim_plan plan;
    kiln_optim_state_plan(o, s->be.act_dtype, s->be.weights_alias_master, &plan);
    dev_bytes = 0;
    struct kiln_optim_state *st;
    struct kiln_error e;
    if (kiln_optim_state_create(&st, &s->be, o, &e))
        fail_msg("create: %s", e.msg);
    if (dev_bytes != plan.total_bytes)
        fail_msg("compact %d, offload %d, alias %d: allocated %zu bytes, the plan says %zu",
                 o->master_compact, o->offload, s->be.weights_alias_master, dev_bytes, plan.total_bytes);
    assert_int_equal(plan.total_bytes, plan.params_bytes + plan.weights_bytes + plan.optim_bytes);
    return st;
}

// The offloaded pipeline over the state: the held runs (or everything) as pieces, AdamW's spans over them.
static void start_offload(struct setup *s, struct kiln_optim_state *st, int compact) {
    struct kiln_offload_piece all = {0, s->pt.total, 0, 0};
    struct kiln_offload_piece *pc = &all;
    int n = 1;
    if (compact) {
        n = s->sh.n_ranges;
        pc = calloc((size_t)n, sizeof(*pc));
        for (int r = 0; r < n; r++)
            pc[r] = (struct kiln_offload_piece){s->held[r].offset, s->held[r].offset + s->held[r].count,
                                                s->held[r].state_offset, r};
    }
    int n_spans;
    struct kiln_param_span *all_spans = kiln_adamw_table_spans(&s->pt, &n_spans);
    struct kiln_offload_opts o = {.pieces = pc,
                                  .n_pieces = n,
                                  .spans = compact ? s->sh.spans : all_spans,
                                  .n_spans = compact ? s->sh.n_spans : n_spans,
                                  .grads = s->grads};
    kiln_optim_state_offload(st, &o);
    assert_non_null(kiln_optim_state_pipe(st));
    free(all_spans);
    if (compact)
        free(pc);
}

// The master weights read back as set, at every state offset it holds, and the compute copy it keeps in step
// holding the same values; the moments read back as set.
static void expect_round_trip(struct setup *s, struct kiln_optim_state *st, int compact, const char *what) {
    size_t total = s->pt.total, elems = kiln_optim_state_elems(st);
    float *got = calloc(total, sizeof(float));
    const float *w = kiln_optim_state_weights(st);
    if (!compact) {
        kiln_optim_state_get_master(st, 0, total, got);
        if (memcmp(got, s->init, total * sizeof(float)) || memcmp(w, s->init, total * sizeof(float)))
            fail_msg("%s: the master weights or the compute copy differ from what was set", what);
    } else {
        for (int r = 0; r < s->sh.n_ranges; r++) {
            const struct kiln_param_span *q = &s->held[r];
            kiln_optim_state_get_master(st, q->state_offset, q->count, got + q->offset);
            if (memcmp(got + q->offset, s->init + q->offset, q->count * sizeof(float)) ||
                memcmp(w + q->state_offset, s->init + q->offset, q->count * sizeof(float)))
                fail_msg("%s: held run %d (flat %zu) differs from what was set", what, r, q->offset);
        }
    }
    float *m = malloc(elems * sizeof(float)), *v = malloc(elems * sizeof(float));
    float *gm = malloc(elems * sizeof(float)), *gv = malloc(elems * sizeof(float));
    uint64_t rs = test_seed() ^ 9;
    test_fill_normal(m, elems, 1.0f, &rs);
    test_fill_uniform(v, elems, 0.0f, 1.0f, &rs);
    kiln_optim_state_set_moments(st, m, v);
    kiln_optim_state_get_moments(st, 0, elems, gm, gv);
    assert_memory_equal(gm, m, elems * sizeof(float));
    assert_memory_equal(gv, v, elems * sizeof(float));
    size_t so = elems / 3, n = elems / 2; // a part of them, as a checkpoint reads a rank's ranges
    memset(gm, 0, elems * sizeof(float));
    kiln_optim_state_get_moments(st, so, n, gm, gv);
    assert_memory_equal(gm, m + so, n * sizeof(float));
    assert_memory_equal(gv, v + so, n * sizeof(float));
    free(m);
    free(v);
    free(gm);
    free(gv);
    free(got);
}

static void test_flat_master_round_trips_and_is_the_compute_copy_on_the_cpu(void **state) {
    (void)state;
    for (int alias = 1; alias >= 0; alias--) {
        struct setup s;
        setup_open(&s, alias);
        struct kiln_optim_state_opts o = {0};
        struct kiln_optim_state *st = state_open(&s, &o);
        assert_int_equal(kiln_optim_state_elems(st), s.pt.total); // elems 0: every element
        struct kiln_adamw_buffers b;
        kiln_optim_state_buffers(st, &b);
        assert_ptr_equal(b.weights, s.weights);
        if (alias)
            assert_ptr_equal(b.params, s.weights); // one buffer, which AdamW updates once
        else
            assert_ptr_not_equal(b.params, s.weights);
        assert_null(kiln_optim_state_host_master(st));
        kiln_optim_state_set_master(st, s.init);
        expect_round_trip(&s, st, 0, alias ? "flat, aliased" : "flat, apart");
        kiln_optim_state_free(st);
        setup_close(&s);
    }
}

static void test_compact_master_holds_its_runs_with_a_compute_copy_of_its_own(void **state) {
    (void)state;
    for (int alias = 1; alias >= 0; alias--) {
        struct setup s;
        setup_open(&s, alias);
        struct kiln_optim_state_opts o = {
            .elems = s.sh.owned, .held = s.held, .n_held = s.sh.n_ranges, .master_compact = 1};
        struct kiln_optim_state *st = state_open(&s, &o);
        struct kiln_adamw_buffers b;
        kiln_optim_state_buffers(st, &b);
        assert_true(b.params_compact);
        assert_ptr_equal(b.weights, kiln_optim_state_weights(st));
        if (alias)
            assert_ptr_equal(b.params, b.weights);
        kiln_optim_state_set_master(st, s.init);
        expect_round_trip(&s, st, 1, alias ? "compact, aliased" : "compact, apart");
        kiln_optim_state_free(st);
        setup_close(&s);
    }
}

// Offloaded, the master weights and moments are the pipeline's host memory (nothing of them on the backend);
// a flat host master is offered for initializing in place.
static void test_offloaded_state_lives_in_the_pipeline(void **state) {
    (void)state;
    for (int compact = 0; compact < 2; compact++) {
        struct setup s;
        setup_open(&s, 1);
        struct kiln_optim_state_opts o = {.offload = 1};
        if (compact)
            o = (struct kiln_optim_state_opts){.elems = s.sh.owned,
                                               .held = s.held,
                                               .n_held = s.sh.n_ranges,
                                               .master_compact = 1,
                                               .offload = 1};
        struct kiln_optim_state *st = state_open(&s, &o);
        start_offload(&s, st, compact);
        float *own = kiln_optim_state_host_master(st);
        if (compact) {
            assert_null(own);
            kiln_optim_state_set_master(st, s.init);
        } else { // filled in place, then taken as it is
            assert_non_null(own);
            memcpy(own, s.init, s.pt.total * sizeof(float));
            kiln_optim_state_set_master(st, own);
        }
        expect_round_trip(&s, st, compact, compact ? "offloaded, compact" : "offloaded, flat");
        kiln_optim_state_free(st);
        setup_close(&s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flat_master_round_trips_and_is_the_compute_copy_on_the_cpu),
        cmocka_unit_test(test_compact_master_holds_its_runs_with_a_compute_copy_of_its_own),
        cmocka_unit_test(test_offloaded_state_lives_in_the_pipeline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
