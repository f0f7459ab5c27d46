// The model's hook points for strategies that act inside a layer (model/model.h): the linear layers' hook and
// the vocabulary's (embedding and LM head with its loss). A hook that hands every call on to what it wraps
// changes nothing, bit for bit; every linear layer of every block shape reaches the hook, forward and
// backward, with its identity; hooks compose (a second wraps the first); the parameter table of a split model
// holds each rank's share under the whole model's names; what cannot be split is refused in one line.
// The same seams carrying real tensor parallelism over MPI ranks: tests/mpi/test_model_split_mpi.c.
#include "test_util.h"

#include "core/backend.h"
#include "model/model.h"

// ---- a pass-through strategy that counts ----------------------------------------------------------------

struct counter {
    struct kiln_backend *be;
    struct kiln_model_linear next;
    struct kiln_model_vocab vnext;
    struct kiln_model *g;
    int fwd[KILN_LINEARS], bwd[KILN_LINEARS];
    int layers_seen[KILN_LINEARS]; // bit l: layer l came through (the head: bit 0 with l = -1)
    int bad_layer;                 // a call whose l does not fit its kind
    int embed_fwd, embed_bwd, heads;
};

static void note(struct counter *c, int l, enum kiln_linear k) {
    if ((k == KILN_LINEAR_HEAD) != (l < 0))
        c->bad_layer++;
    c->layers_seen[k] |= 1 << (l < 0 ? 0 : l);
}

static void count_forward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_args *a) {
    struct counter *c = user;
    c->fwd[k]++;
    note(c, l, k);
    kiln_model_linear_forward_with(&c->next, c->be, l, k, a);
}

static void count_backward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_back_args *a) {
    struct counter *c = user;
    c->bwd[k]++;
    note(c, l, k);
    kiln_model_linear_backward_with(&c->next, c->be, l, k, a);
}

static void count_embed_forward(void *user, const struct kiln_embed_args *a) {
    struct counter *c = user;
    c->embed_fwd++;
    c->be->ops->embed_forward(c->be->ctx, a);
}

static void count_embed_backward(void *user, const struct kiln_embed_back_args *a) {
    struct counter *c = user;
    c->embed_bwd++;
    c->be->ops->embed_backward(c->be->ctx, a);
}

static void count_head(void *user, const struct kiln_model_head_args *h) {
    struct counter *c = user;
    c->heads++;
    kiln_model_head_default(c->g, h);
}

// ---- models ---------------------------------------------------------------------------------------------

static void tiny(struct kiln_model_config *m) {
    memset(m, 0, sizeof(*m));
    m->n_layer = 3;
    m->n_head = 4;
    m->n_embd = 32;
    m->block_size = 16;
    m->vocab_size = 13;
    m->vocab_multiple = 16;
    m->pos = KILN_POS_LEARNED;
    m->rope_theta = 10000.0f;
    m->norm_eps = 1e-5f;
    m->norm_bias = 1;
    m->bias = 1;
}

struct run {
    double loss[2];
    float *grads;
    size_t n;
};

// Two micro-steps (the second accumulates) of a model with or without the counting hooks; c NULL: none.
static void run_model(const struct kiln_model_config *m, enum kiln_recompute rc, struct counter *c, int vocab,
                      struct run *out) {
    struct kiln_backend be;
    struct kiln_backend_opts bo = {.threads = 1};
    struct kiln_error e;
    assert_int_equal(kiln_backend_open("cpu", &bo, &be, &e), 0);
    int B = 2, T = 9, N = B * T;
    struct kiln_model_opts o = {.B = B, .T = T, .recompute = rc, .training = 1, .classifier_rows = 7};
    struct kiln_model *g;
    if (kiln_model_create(&g, m, &be, &o, &e))
        fail_msg("create: %s", e.msg);
    kiln_model_init_params(g, 77);
    if (c) {
        c->be = &be;
        c->g = g;
        struct kiln_model_linear lin = {.user = c, .forward = count_forward, .backward = count_backward};
        kiln_model_set_linear(g, &lin, &c->next);
        if (vocab) {
            struct kiln_model_vocab v = {.user = c,
                                       .embed_forward = count_embed_forward,
                                       .embed_backward = count_embed_backward,
                                       .head = count_head};
            kiln_model_set_vocab(g, &v, &c->vnext);
        }
    }
    int32_t in[18], tgt[18];
    for (int i = 0; i < N; i++) {
        in[i] = (i * 7 + 3) % m->vocab_size;
        tgt[i] = (i * 5 + 1) % m->vocab_size;
    }
    tgt[4] = -1;
    kiln_model_zero_grad(g);
    for (int s = 0; s < 2; s++) {
        out->loss[s] = kiln_model_forward(g, in, tgt, 1.0f / (float)(N - 1), 1e-3f);
        kiln_model_backward(g);
    }
    out->n = kiln_model_params(g)->total;
    out->grads = malloc(out->n * sizeof(float));
    kiln_model_get_grads(g, out->grads);
    kiln_model_free(g);
    kiln_backend_close(&be);
}

static void check_pass_through(const struct kiln_model_config *m, enum kiln_recompute rc, const char *what) {
    struct run plain, hooked;
    struct counter c = {0};
    run_model(m, rc, NULL, 0, &plain);
    run_model(m, rc, &c, 1, &hooked);
    if (plain.loss[0] != hooked.loss[0] || plain.loss[1] != hooked.loss[1])
        fail_msg("%s: the hooked model's loss %.9g differs from the plain one's %.9g", what, hooked.loss[1],
                 plain.loss[1]);
    assert_int_equal(plain.n, hooked.n);
    if (memcmp(plain.grads, hooked.grads, plain.n * sizeof(float)))
        fail_msg("%s: the hooked model's gradients differ from the plain one's", what);
    // every layer's projections, twice (two micro-steps) forward and backward, and the head's chunks
    int L = m->n_layer, all = (1 << L) - 1;
    assert_int_equal(c.bad_layer, 0);
    assert_int_equal(c.fwd[KILN_LINEAR_ATTN_OUT],
                     2 * L + (rc == KILN_RECOMPUTE_BLOCK && !m->parallel_block ? 2 * L : 0));
    assert_int_equal(c.bwd[KILN_LINEAR_ATTN_OUT], 2 * L);
    assert_int_equal(c.bwd[KILN_LINEAR_MLP_OUT], 2 * L);
    assert_int_equal(c.layers_seen[KILN_LINEAR_MLP_OUT], all);
    int in_bwd = c.bwd[KILN_LINEAR_QKV] + c.bwd[KILN_LINEAR_FUSED_IN];
    assert_int_equal(in_bwd, 2 * L);
    if (!m->parallel_block)
        assert_int_equal(c.bwd[KILN_LINEAR_MLP_IN], 2 * L);
    assert_int_equal(c.layers_seen[KILN_LINEAR_ATTN_OUT], all);
    // 18 rows in chunks of 7: 3 chunks, each once forward and once backward, per micro-step
    assert_int_equal(c.heads, 6);
    assert_int_equal(c.fwd[KILN_LINEAR_HEAD], 6);
    assert_int_equal(c.bwd[KILN_LINEAR_HEAD], 6);
    assert_int_equal(c.embed_fwd, 2);
    assert_int_equal(c.embed_bwd, 2);
    free(plain.grads);
    free(hooked.grads);
}

static void test_a_pass_through_hook_changes_nothing_and_sees_every_linear_layer(void **state) {
    (void)state;
    struct kiln_model_config m;
    tiny(&m); // GPT-2's block
    check_pass_through(&m, KILN_RECOMPUTE_NONE, "gpt2 block");
    check_pass_through(&m, KILN_RECOMPUTE_BLOCK, "gpt2 block, block recompute");
    tiny(&m); // Llama's block, GQA
    m.norm_rms = 1;
    m.bias = 0;
    m.mlp_swiglu = 1;
    m.pos = KILN_POS_ROPE;
    m.n_kv_head = 2;
    check_pass_through(&m, KILN_RECOMPUTE_ACT, "llama block");
    tiny(
        &m); // PaLM's parallel block: one fused input GEMM (no biases, so nothing pads the two weights apart)
    m.parallel_block = 1;
    m.bias = 0;
    m.tie_embeddings = 1;
    check_pass_through(&m, KILN_RECOMPUTE_NONE, "parallel block");
}

// a second strategy wraps the first: both see every call
static struct kiln_model_linear inner_prev;
static int outer_calls;
static struct kiln_backend *outer_be;
static void outer_forward(void *user, int l, enum kiln_linear k, const struct kiln_matmul_args *a) {
    (void)user;
    outer_calls++;
    kiln_model_linear_forward_with(&inner_prev, outer_be, l, k, a);
}

static void test_linear_hooks_compose(void **state) {
    (void)state;
    struct kiln_model_config m;
    tiny(&m);
    struct kiln_backend be;
    struct kiln_backend_opts bo = {.threads = 1};
    struct kiln_error e;
    assert_int_equal(kiln_backend_open("cpu", &bo, &be, &e), 0);
    struct kiln_model_opts o = {.B = 1, .T = 8, .recompute = KILN_RECOMPUTE_NONE, .training = 1};
    struct kiln_model *g;
    assert_int_equal(kiln_model_create(&g, &m, &be, &o, &e), 0);
    kiln_model_init_params(g, 3);
    struct counter c = {.be = &be, .g = g};
    struct kiln_model_linear lin = {.user = &c, .forward = count_forward, .backward = count_backward};
    kiln_model_set_linear(g, &lin, &c.next);
    outer_be = &be;
    struct kiln_model_linear outer = {.forward = outer_forward};
    kiln_model_set_linear(g, &outer, &inner_prev);
    assert_ptr_equal(inner_prev.user, &c);
    int32_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    kiln_model_forward(g, in, tgt, 0.0f, 0.0f);
    int inner = 0;
    for (int k = 0; k < KILN_LINEARS; k++)
        inner += c.fwd[k];
    assert_true(outer_calls > 0);
    assert_int_equal(outer_calls, inner);       // the outer hook handed every call to the inner one
    assert_int_equal(inner, 4 * m.n_layer + 1); // qkv, attn_out, mlp_in, mlp_out per layer, and the head
    kiln_model_set_linear(g, NULL, NULL);         // and off again: nothing more reaches either
    kiln_model_forward(g, in, tgt, 0.0f, 0.0f);
    assert_int_equal(outer_calls, inner);
    kiln_model_free(g);
    kiln_backend_close(&be);
}

static void test_a_split_table_holds_each_ranks_share_under_the_whole_names(void **state) {
    (void)state;
    struct kiln_model_config m;
    tiny(&m);
    m.n_head = 8;
    m.n_kv_head = 2;
    m.mlp_swiglu = 1;
    m.mlp_hidden = 64;
    m.vocab_multiple = 32; // Vp 32
    struct kiln_param_table whole, part;
    kiln_params_build(&whole, &m);
    struct kiln_model_split s = {.heads = 4, .kv_heads = 4, .hidden = 2, .vocab = 4};
    struct kiln_error e;
    assert_int_equal(kiln_model_split_check(&m, &s, &e), 0);
    kiln_params_build_split(&part, &m, &s);
    assert_int_equal(part.n, whole.n);
    int HS = 4; // 32 / 8
    for (int i = 0; i < part.n; i++) {
        const struct kiln_param *p = &part.p[i], *w = &whole.p[kiln_params_find(&whole, p->name)];
        int64_t r0 = w->shape[0], c0 = w->shape[1];
        if (strstr(p->name, "c_attn.")) // 2 query heads and a copy of one of the 2 key/value heads
            r0 = (2 + 2 * 1) * HS;
        else if (strstr(p->name, "mlp.c_fc.")) // [gate | up] of 32 columns each
            r0 = 2 * 32;
        else if (strstr(p->name, "attn.c_proj.weight"))
            c0 = 2 * HS;
        else if (strstr(p->name, "mlp.c_proj.weight"))
            c0 = 32;
        else if (strstr(p->name, "wte") || strstr(p->name, "lm_head"))
            r0 = 8;
        if (p->shape[0] != r0 || p->shape[1] != c0)
            fail_msg("%s: shape (%lld, %lld), want (%lld, %lld)", p->name, (long long)p->shape[0],
                     (long long)p->shape[1], (long long)r0, (long long)c0);
    }
    assert_true(part.n_params < whole.n_params);
    kiln_params_free(&whole);
    kiln_params_free(&part);
}

static void test_what_cannot_be_split_is_refused_in_one_line(void **state) {
    (void)state;
    struct kiln_model_config m;
    struct kiln_error e;
    struct {
        void (*edit)(struct kiln_model_config *m);
        struct kiln_model_split s;
        const char *names;
    } cases[] = {
        {NULL, {.heads = 3, .kv_heads = 3}, "--heads"},
        {NULL, {.heads = 2, .kv_heads = 1}, "kv-heads"},
        {NULL, {.hidden = 3}, "--mlp-hidden"},
        {NULL, {.vocab = 3}, "--vocab-multiple"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tiny(&m);
        memset(&e, 0, sizeof(e));
        assert_int_equal(kiln_model_split_check(&m, &cases[i].s, &e), KILN_ERR_USAGE);
        assert_non_null(strstr(e.msg, cases[i].names));
        assert_null(strchr(e.msg, '\n'));
    }
    tiny(&m);
    m.qk_norm = 1;
    struct kiln_model_split two = {.heads = 2, .kv_heads = 2};
    assert_int_equal(kiln_model_split_check(&m, &two, &e), KILN_ERR_USAGE);
    assert_non_null(strstr(e.msg, "--qk-norm"));
    tiny(&m);
    m.pos = KILN_POS_ALIBI;
    assert_int_equal(kiln_model_split_check(&m, &two, &e), KILN_ERR_USAGE);
    assert_non_null(strstr(e.msg, "--pos"));
    // the model refuses to be created so, and a split model refuses to decode
    struct kiln_backend be;
    struct kiln_backend_opts bo = {.threads = 1};
    assert_int_equal(kiln_backend_open("cpu", &bo, &be, &e), 0);
    struct kiln_model_opts o = {.B = 1, .T = 8, .training = 1, .split = two};
    struct kiln_model *g;
    assert_int_equal(kiln_model_create(&g, &m, &be, &o, &e), KILN_ERR_USAGE);
    assert_null(g);
    tiny(&m);
    assert_int_equal(kiln_model_create(&g, &m, &be, &o, &e), 0);
    assert_int_equal(kiln_model_decode_begin(g, 1, 8, &e), KILN_ERR_USAGE);
    assert_non_null(strstr(e.msg, "split"));
    kiln_model_free(g);
    kiln_backend_close(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_pass_through_hook_changes_nothing_and_sees_every_linear_layer),
        cmocka_unit_test(test_linear_hooks_compose),
        cmocka_unit_test(test_a_split_table_holds_each_ranks_share_under_the_whole_names),
        cmocka_unit_test(test_what_cannot_be_split_is_refused_in_one_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
