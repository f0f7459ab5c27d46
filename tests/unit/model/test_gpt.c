// The whole model on the CPU reference backend: gradients against finite differences for every architecture
// option, recompute equivalence, the parallel block's fused input projection against its two-GEMM form,
// KV-cache decoding against the full forward, seeded determinism, the shared scratch arena against buffers
// apart, and the memory plan against what the model allocates.
#include "test_util.h"

#include "core/backend.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "optim/state.h"
#include "run/options.h"
#include "run/knobs.h"
#include "run/tuning.h"

struct fixture {
    struct kiln_backend be;
    struct kiln_model *g;
    struct kiln_model_config m;
    int B, T;
    int32_t *in, *tgt;
};

static void tiny_config(struct kiln_model_config *m) {
    struct kiln_config c;
    struct kiln_error e;
    assert_int_equal(kiln_config_init(&c, "shakespeare-char", &e), 0);
    *m = c.model;
    m->n_layer = 2;
    m->n_head = 4;
    m->n_embd = 16;
    m->block_size = 8;
    m->vocab_size = 11;
    m->vocab_multiple = 16; // padded vocab 16 > 11: padded logits must get no probability
}

static int fixture_offload_activations; // the next fixture_open's opts.offload_activations
static struct kiln_knobs fixture_knobs; // and its tuning knobs (run/tuning.h; main sets the defaults)

static void fixture_open(struct fixture *f, const struct kiln_model_config *m, enum kiln_recompute rc,
                         uint64_t seed) {
    memset(f, 0, sizeof(*f));
    f->m = *m;
    f->B = 2;
    f->T = 7; // not a multiple of anything
    struct kiln_error e;
    struct kiln_backend_opts bo = {0};
    assert_int_equal(kiln_backend_open("cpu", &bo, &f->be, &e), 0);
    struct kiln_model_opts o = {.B = f->B,
                              .T = f->T,
                              .recompute = rc,
                              .training = 1,
                              .offload_activations = fixture_offload_activations};
    kiln_model_tuning(&o, &fixture_knobs);
    if (kiln_model_create(&f->g, m, &f->be, &o, &e))
        fail_msg("create: %s", e.msg);
    kiln_model_init_params(f->g, seed);
    f->in = malloc(sizeof(int32_t) * f->B * f->T);
    f->tgt = malloc(sizeof(int32_t) * f->B * f->T);
    uint64_t s = test_seed() ^ seed;
    for (int i = 0; i < f->B * f->T; i++) {
        f->in[i] = (int32_t)(test_rand_u64(&s) % (uint64_t)m->vocab_size);
        f->tgt[i] = (int32_t)(test_rand_u64(&s) % (uint64_t)m->vocab_size);
    }
    f->tgt[3] = -1; // an ignored target
}

static void fixture_close(struct fixture *f) {
    kiln_model_free(f->g);
    kiln_backend_close(&f->be);
    free(f->in);
    free(f->tgt);
}

// Larger-than-GPT-2 init so every path carries signal, then analytic grads vs central differences in
// parameters sampled from every tensor.
static void check_gradients(const struct kiln_model_config *m, enum kiln_recompute rc, const char *what) {
    struct fixture f;
    fixture_open(&f, m, rc, 7);
    const struct kiln_param_table *pt = kiln_model_params(f.g);
    float *p = calloc(pt->total, sizeof(float)), *grad = calloc(pt->total, sizeof(float));
    kiln_model_get_params(f.g, p);
    uint64_t s = test_seed() + 99;
    for (int i = 0; i < pt->n; i++) {
        const struct kiln_param *q = &pt->p[i];
        for (size_t j = 0; j < q->count; j++)
            p[q->offset + j] += 0.3f * (test_rand_uniform(&s) - 0.5f);
    }
    kiln_model_set_params(f.g, p);
    int valid = f.B * f.T - 1;
    kiln_model_zero_grad(f.g);
    kiln_model_forward(f.g, f.in, f.tgt, 1.0f / (float)valid, 0.0f);
    kiln_model_backward(f.g);
    kiln_model_get_grads(f.g, grad);

    double num = 0, den = 0;
    const float eps = 1e-2f;
    for (int i = 0; i < pt->n; i++) {
        const struct kiln_param *q = &pt->p[i];
        for (int k = 0; k < 6; k++) {
            size_t j = q->offset + (size_t)(test_rand_u64(&s) % q->count);
            if ((i == pt->wte || i == pt->lm_head) &&
                (j - q->offset) / (size_t)q->shape[1] >= (size_t)m->vocab_size)
                continue; // padded vocab rows: both grads are exactly zero, checked below
            float orig = p[j];
            p[j] = orig + eps;
            kiln_model_set_params(f.g, p);
            double lp = kiln_model_forward(f.g, f.in, f.tgt, 0.0f, 0.0f);
            p[j] = orig - eps;
            kiln_model_set_params(f.g, p);
            double lm = kiln_model_forward(f.g, f.in, f.tgt, 0.0f, 0.0f);
            p[j] = orig;
            double fd = (lp - lm) / (2.0 * eps);
            num += (fd - grad[j]) * (fd - grad[j]);
            den += fd * fd;
        }
    }
    double rel = sqrt(num / den);
    fprintf(stderr, "[gpt grad] %-28s rel err %.2e\n", what, rel);
    if (!(rel < 2e-2))
        fail_msg("%s: gradient rel error %.3e vs finite differences (tolerance 2e-2)", what, rel);
    // the padded vocab rows of the head never receive gradient
    int head = m->tie_embeddings ? pt->wte : pt->lm_head;
    const struct kiln_param *h = &pt->p[head];
    for (size_t r = (size_t)m->vocab_size; r < (size_t)h->shape[0]; r++)
        for (int c = 0; c < h->shape[1]; c++)
            assert_true(grad[h->offset + r * h->shape[1] + c] == 0.0f);
    free(p);
    free(grad);
    fixture_close(&f);
}

static void test_gpt2_gradients_match_finite_differences(void **state) {
    struct kiln_model_config m;
    tiny_config(&m);
    check_gradients(&m, KILN_RECOMPUTE_NONE, "gpt2");
}

static void test_architecture_options_gradients_match_finite_differences(void **state) {
    struct kiln_model_config m;
    tiny_config(&m);
    m.pos = KILN_POS_ROPE;
    m.norm_rms = 1;
    m.mlp_swiglu = 1;
    m.mlp_hidden = 24;
    m.n_kv_head = 2;
    m.bias = 0;
    m.tie_embeddings = 0;
    check_gradients(&m, KILN_RECOMPUTE_NONE, "llama-style (rope,rms,swiglu,gqa)");
    tiny_config(&m);
    m.pos = KILN_POS_ALIBI;
    m.parallel_block = 1;
    m.norm_bias = 0;
    m.n_kv_head = 1;
    check_gradients(&m, KILN_RECOMPUTE_NONE, "parallel+alibi+mqa");
    tiny_config(&m);
    m.qk_norm = 1; // LayerNorm flavour
    check_gradients(&m, KILN_RECOMPUTE_NONE, "gpt2+qk-norm");
    tiny_config(&m);
    m.qk_norm = 1; // RMSNorm flavour, GQA, RoPE, as OLMo-2
    m.norm_rms = 1;
    m.n_kv_head = 2;
    m.pos = KILN_POS_ROPE;
    check_gradients(&m, KILN_RECOMPUTE_BLOCK, "qk-norm+rms+gqa+rope, recompute=block");
}

// Parallel blocks whose QKV and MLP input projections fuse into one GEMM: C = 64 with 4 heads (HS = 16) keeps
// QKV * C and QKV multiples of 64, so params.c stores [W_qkv; W_fc] and [b_qkv; b_fc] back to back.
enum par_variant {
    PAR_GELU_BIAS,
    PAR_SWIGLU_GQA_ROPE,
    PAR_GELU_GQA_ALIBI,
    PAR_SWIGLU_BIAS_MHA,
    PAR_GELU_MQA,
    PAR_N
};

static const char *par_name[PAR_N] = {"gelu+bias (learned pos)", "swiglu+gqa+rope+rms, no bias",
                                      "gelu+bias+gqa+alibi", "swiglu+bias, mha+rope",
                                      "gelu+mqa+alibi, no bias"};

static void parallel_config(struct kiln_model_config *m, enum par_variant v) {
    tiny_config(m);
    m->parallel_block = 1;
    m->n_embd = 64;
    m->n_head = 4;
    m->bias = v == PAR_GELU_BIAS || v == PAR_GELU_GQA_ALIBI || v == PAR_SWIGLU_BIAS_MHA;
    m->mlp_swiglu = v == PAR_SWIGLU_GQA_ROPE || v == PAR_SWIGLU_BIAS_MHA;
    m->mlp_hidden = m->mlp_swiglu ? 40 : 0;
    m->n_kv_head = v == PAR_SWIGLU_GQA_ROPE || v == PAR_GELU_GQA_ALIBI ? 2 : v == PAR_GELU_MQA ? 1 : 0;
    m->pos = v == PAR_SWIGLU_GQA_ROPE || v == PAR_SWIGLU_BIAS_MHA ? KILN_POS_ROPE
             : v == PAR_GELU_BIAS                                 ? KILN_POS_LEARNED
                                                                  : KILN_POS_ALIBI;
    m->norm_rms = v == PAR_SWIGLU_GQA_ROPE;
}

static void expect_fusion(struct kiln_model *g, int fwd, int bwd, const char *what) {
    int f, b;
    kiln_model_fused_projection(g, &f, &b);
    if (f != fwd || b != bwd)
        fail_msg("%s: fused projection forward %d backward %d, expected %d and %d", what, f, b, fwd, bwd);
}

static void test_parallel_fused_gradients_match_finite_differences(void **state) {
    struct kiln_model_config m;
    for (int v = 0; v < PAR_N; v++) {
        parallel_config(&m, (enum par_variant)v);
        check_gradients(&m, KILN_RECOMPUTE_NONE, par_name[v]);
    }
    parallel_config(&m, PAR_SWIGLU_BIAS_MHA);
    check_gradients(&m, KILN_RECOMPUTE_MLP, "swiglu+bias, recompute=mlp");
    parallel_config(&m, PAR_GELU_BIAS);
    check_gradients(&m, KILN_RECOMPUTE_BLOCK, "gelu+bias, recompute=block");
    check_gradients(&m, KILN_RECOMPUTE_SELECTIVE, "gelu+bias, recompute=selective");
    parallel_config(&m, PAR_SWIGLU_GQA_ROPE);
    m.qk_norm = 1; // fusion off: q and k pass through their norms between projection and attention
    check_gradients(&m, KILN_RECOMPUTE_NONE, "parallel+qk-norm (unfused)");
}

// Loss and every gradient of a model, after moving its parameters off GPT-2's init so that every path carries
// signal. fused 0 turns the fusion off for the model created here (KILN_PARALLEL_FUSED=0).
static double loss_and_grads(const struct kiln_model_config *m, enum kiln_recompute rc, int fused,
                             float *grad, const char *what) {
    fixture_knobs.parallel_fused = fused;
    struct fixture f;
    fixture_open(&f, m, rc, 21);
    fixture_knobs.parallel_fused = 1;
    expect_fusion(f.g, fused && rc != KILN_RECOMPUTE_MLP, fused, what);
    const struct kiln_param_table *pt = kiln_model_params(f.g);
    float *p = calloc(pt->total, sizeof(float));
    kiln_model_get_params(f.g, p);
    uint64_t s = 99;
    for (int i = 0; i < pt->n; i++)
        for (size_t j = 0; j < pt->p[i].count; j++)
            p[pt->p[i].offset + j] += 0.3f * (test_rand_uniform(&s) - 0.5f);
    kiln_model_set_params(f.g, p);
    kiln_model_zero_grad(f.g);
    double loss = kiln_model_forward(f.g, f.in, f.tgt, 1.0f / (float)(f.B * f.T - 1), 0.0f);
    kiln_model_backward(f.g);
    kiln_model_get_grads(f.g, grad);
    free(p);
    fixture_close(&f);
    return loss;
}

// The fused projection is the two-GEMM parallel block reassociated: in fp32 the loss and every gradient
// tensor agree to 1e-5 relative (the backward's dL/dln1 sums over QKV + FCO in one GEMM instead of two).
static void test_parallel_fused_projection_matches_two_gemms(void **state) {
    struct kiln_model_config m;
    enum kiln_recompute rcs[] = {KILN_RECOMPUTE_NONE, KILN_RECOMPUTE_MLP, KILN_RECOMPUTE_BLOCK};
    const char *rc_name[] = {"none", "mlp", "block"};
    for (int v = 0; v < PAR_N; v++)
        for (int r = 0; r < 3; r++) {
            parallel_config(&m, (enum par_variant)v);
            struct kiln_param_table pt;
            kiln_params_build(&pt, &m);
            float *gf = calloc(pt.total, sizeof(float)), *gu = calloc(pt.total, sizeof(float));
            char what[160];
            snprintf(what, sizeof(what), "%s, recompute=%s", par_name[v], rc_name[r]);
            double lf = loss_and_grads(&m, rcs[r], 1, gf, what);
            double lu = loss_and_grads(&m, rcs[r], 0, gu, what);
            if (!(fabs(lf - lu) <= 1e-5 * fabs(lu)))
                fail_msg("%s: loss fused %.9f, two GEMMs %.9f", what, lf, lu);
            double worst = 0;
            for (int i = 0; i < pt.n; i++) {
                double e = test_rel_err(gf + pt.p[i].offset, gu + pt.p[i].offset, pt.p[i].count);
                if (!(e <= 1e-5))
                    fail_msg("%s: gradient of %s differs by %.3e relative (tolerance 1e-5)", what,
                             pt.p[i].name, e);
                worst = e > worst ? e : worst;
            }
            fprintf(stderr, "[fused vs two gemms] %-44s loss rel %.1e, worst gradient rel %.1e\n", what,
                    fabs(lf - lu) / fabs(lu), worst);
            free(gf);
            free(gu);
            kiln_params_free(&pt);
        }
}

// Where padding separates W_qkv from W_fc (or the biases), the parallel block keeps two GEMMs.
static void test_parallel_block_falls_back_to_two_gemms_when_padding_separates_the_weights(void **state) {
    struct kiln_model_config m;
    parallel_config(&m, PAR_GELU_BIAS);
    m.n_kv_head = 1; // QKV = 96: the weights touch (96 * 64 elements), the biases do not
    struct kiln_param_table pt;
    kiln_params_build(&pt, &m);
    const int *ix = pt.layer[0];
    assert_true(pt.p[ix[KILN_QKV_W]].offset + pt.p[ix[KILN_QKV_W]].count == pt.p[ix[KILN_FC_W]].offset);
    assert_true(pt.p[ix[KILN_QKV_B]].offset + pt.p[ix[KILN_QKV_B]].count < pt.p[ix[KILN_FC_B]].offset);
    kiln_params_free(&pt);
    struct fixture f;
    fixture_open(&f, &m, KILN_RECOMPUTE_NONE, 1);
    expect_fusion(f.g, 0, 0, "mqa with biases");
    fixture_close(&f);
    m.bias = 0;
    fixture_open(&f, &m, KILN_RECOMPUTE_NONE, 1);
    expect_fusion(f.g, 1, 1, "mqa without biases");
    fixture_close(&f);
}

// recompute must not change any number: the same ops run on the same inputs
// (also for fused parallel blocks, whose --recompute=mlp forward runs two GEMMs: the CPU's GEMM gives each
// element the same sums whatever the matrix's width)
static void check_recompute_identical(const struct kiln_model_config *m) {
    float *ref = NULL;
    size_t total = 0;
    for (int rc = KILN_RECOMPUTE_NONE; rc <= KILN_RECOMPUTE_SELECTIVE; rc++) {
        struct fixture f;
        fixture_open(&f, m, (enum kiln_recompute)rc, 3);
        total = kiln_model_params(f.g)->total;
        float *grad = calloc(total, sizeof(float));
        kiln_model_zero_grad(f.g);
        kiln_model_forward(f.g, f.in, f.tgt, 0.01f, 0.0f);
        kiln_model_backward(f.g);
        kiln_model_get_grads(f.g, grad);
        if (!ref)
            ref = grad;
        else {
            assert_memory_equal(ref, grad, total * sizeof(float));
            free(grad);
        }
        fixture_close(&f);
    }
    free(ref);
}

static void test_recompute_gives_identical_gradients(void **state) {
    struct kiln_model_config m;
    tiny_config(&m);
    check_recompute_identical(&m);
    parallel_config(&m, PAR_GELU_BIAS);
    check_recompute_identical(&m);
    parallel_config(&m, PAR_SWIGLU_GQA_ROPE);
    check_recompute_identical(&m);
    tiny_config(&m); // sequential SwiGLU: --recompute=act recomputes a SwiGLU
    m.mlp_swiglu = 1;
    m.mlp_hidden = 24;
    check_recompute_identical(&m);
}

// An MLP run in chunks of rows (--recompute=block or mlp at long T) computes every token's result as the
// whole MLP does; only the weight gradients' sums are split by chunk: the loss and every gradient agree to
// 1e-5 relative. Two steps without zeroing in between check that the first chunk assigns and the others add
// (the buffers hold the last step's gradients), and a third accumulates.
static void loss_and_grads_rows(const struct kiln_model_config *m, enum kiln_recompute rc, const char *rows,
                                float *grad, double *loss) {
    struct kiln_error e;
    if (kiln_knobs_set(&fixture_knobs, KILN_KNOB_MLP_ROWS, rows, &e)) // as KILN_MLP_ROWS=rows would
        fail_msg("%s", e.msg);
    struct fixture f;
    fixture_open(&f, m, rc, 4);
    kiln_knobs_set(&fixture_knobs, KILN_KNOB_MLP_ROWS, NULL, &e);
    size_t total = kiln_model_params(f.g)->total;
    for (int step = 0; step < 2; step++) {
        kiln_model_zero_grad(f.g);
        loss[step] = kiln_model_forward(f.g, f.in, f.tgt, 0.01f, 0.0f);
        kiln_model_backward(f.g);
    }
    loss[2] = kiln_model_forward(f.g, f.in, f.tgt, 0.01f, 0.0f); // accumulated onto the second step's
    kiln_model_backward(f.g);
    kiln_model_get_grads(f.g, grad);
    (void)total;
    fixture_close(&f);
}

static void check_mlp_chunks(const struct kiln_model_config *m, const char *what) {
    struct kiln_param_table pt;
    kiln_params_build(&pt, m);
    enum kiln_recompute rcs[] = {KILN_RECOMPUTE_BLOCK, KILN_RECOMPUTE_MLP};
    for (int r = 0; r < 2; r++) {
        float *whole = calloc(pt.total, sizeof(float)), *chunked = calloc(pt.total, sizeof(float));
        double lw[3], lc[3];
        loss_and_grads_rows(m, rcs[r], "-1", whole, lw);
        loss_and_grads_rows(m, rcs[r], "3", chunked, lc); // 14 rows: chunks of 3, 3, 3, 3, 2
        for (int i = 0; i < 3; i++)
            if (!(fabs(lw[i] - lc[i]) <= 1e-6 * fabs(lw[i])))
                fail_msg("%s, recompute %d: loss %d whole %.9f, chunked %.9f", what, rcs[r], i, lw[i], lc[i]);
        double worst = 0;
        for (int i = 0; i < pt.n; i++) {
            double e = test_rel_err(chunked + pt.p[i].offset, whole + pt.p[i].offset, pt.p[i].count);
            if (!(e <= 1e-5))
                fail_msg("%s, recompute %d: gradient of %s differs by %.3e relative", what, rcs[r],
                         pt.p[i].name, e);
            worst = e > worst ? e : worst;
        }
        fprintf(stderr, "[mlp chunks] %-40s recompute %d: worst gradient rel %.1e\n", what, rcs[r], worst);
        free(whole);
        free(chunked);
    }
    kiln_params_free(&pt);
}

// Activation offload moves each layer's input to host memory and back: on the CPU the losses and gradients
// are bitwise those without it, over two steps and an accumulated third (the ring of 3 device slots is
// reused several times with 6 layers), with the MLP in chunks too; the plan keeps 3 inputs on the device.
// Under selective recompute each layer's attention output takes the same road, in a ring of its own.
static void check_offload_activations(const struct kiln_model_config *m, enum kiln_recompute rc,
                                      const char *rows, const char *what) {
    struct kiln_param_table pt;
    kiln_params_build(&pt, m);
    float *kept = calloc(pt.total, sizeof(float)), *moved = calloc(pt.total, sizeof(float));
    double lk[3], lm[3];
    loss_and_grads_rows(m, rc, rows, kept, lk);
    fixture_offload_activations = 1;
    loss_and_grads_rows(m, rc, rows, moved, lm);
    fixture_offload_activations = 0;
    for (int i = 0; i < 3; i++)
        if (lk[i] != lm[i])
            fail_msg("%s: loss %d %.9f kept, %.9f offloaded", what, i, lk[i], lm[i]);
    if (memcmp(kept, moved, pt.total * sizeof(float)))
        fail_msg("%s: the gradients with offloaded activations differ", what);
    free(kept);
    free(moved);
    kiln_params_free(&pt);
}

static void test_offloaded_activations_change_no_number(void **state) {
    struct kiln_model_config m;
    tiny_config(&m);
    m.n_layer = 6;
    for (int sel = 0; sel < 2; sel++) {
        enum kiln_recompute rc = sel ? KILN_RECOMPUTE_SELECTIVE : KILN_RECOMPUTE_BLOCK;
        m.n_layer = 6;
        check_offload_activations(&m, rc, "-1", sel ? "selective, 6 layers" : "sequential, 6 layers");
        check_offload_activations(&m, rc, "5",
                                  sel ? "selective, 6 layers, MLP in chunks" : "6 layers, MLP in chunks");
        m.n_layer = 2; // L + 1 = 3 inputs: all fit the ring, nothing moves
        check_offload_activations(&m, rc, "-1", sel ? "selective, 2 layers" : "sequential, 2 layers");
        m.n_layer = 4; // 5 inputs and 4 attention outputs: both rings of 3 move some
        check_offload_activations(&m, rc, "-1", sel ? "selective, 4 layers" : "sequential, 4 layers");
    }
    parallel_config(&m, PAR_SWIGLU_GQA_ROPE);
    m.n_layer = 5;
    check_offload_activations(&m, KILN_RECOMPUTE_BLOCK, "-1", "parallel swiglu gqa rope, 5 layers");
    check_offload_activations(&m, KILN_RECOMPUTE_SELECTIVE, "-1",
                              "parallel swiglu gqa rope, 5 layers, selective");
    struct kiln_model_opts o = {.B = 2, .T = 7, .recompute = KILN_RECOMPUTE_BLOCK, .training = 1};
    struct kiln_mem_plan kept, moved;
    kiln_model_plan(&m, &o, KILN_BF16, KILN_BF16, 0, &kept);
    o.offload_activations = 1;
    kiln_model_plan(&m, &o, KILN_BF16, KILN_BF16, 0, &moved);
    size_t x = (size_t)2 * 7 * m.n_embd * 2;                     // one layer input, bf16
    assert_int_equal(kept.acts_bytes - moved.acts_bytes, 3 * x); // 6 inputs kept, 3 on the device
    assert_int_equal(moved.host_bytes, 3 * x);
    assert_int_equal(kept.host_bytes, 0);
    // selective: 5 attention outputs too, 3 on the device (an output is as wide as an input here)
    o.recompute = KILN_RECOMPUTE_SELECTIVE;
    o.offload_activations = 0;
    kiln_model_plan(&m, &o, KILN_BF16, KILN_BF16, 0, &kept);
    o.offload_activations = 1;
    kiln_model_plan(&m, &o, KILN_BF16, KILN_BF16, 0, &moved);
    size_t ao = (size_t)2 * 7 * m.n_head * (m.n_embd / m.n_head) * 2;
    assert_int_equal(kept.acts_bytes - moved.acts_bytes, 3 * x + 2 * ao);
    assert_int_equal(moved.host_bytes, 3 * x + 2 * ao);
    assert_int_equal(kept.host_bytes, 0);
}

static void test_mlp_in_chunks_matches_the_whole_mlp(void **state) {
    struct kiln_model_config m;
    tiny_config(&m);
    check_mlp_chunks(&m, "sequential gelu");
    m.mlp_swiglu = 1;
    m.mlp_hidden = 24;
    check_mlp_chunks(&m, "sequential swiglu");
    for (int v = 0; v < PAR_N; v++) {
        parallel_config(&m, (enum par_variant)v);
        check_mlp_chunks(&m, par_name[v]);
    }
}

// decoding token by token with the KV cache gives the logits of the full causal forward at each position
static void check_decode(const struct kiln_model_config *mc);

static void test_kv_cache_decode_matches_full_forward(void **state) {
    struct kiln_model_config m;
    tiny_config(&m);
    m.pos = KILN_POS_LEARNED;
    check_decode(&m);
    m.qk_norm = 1;
    m.pos = KILN_POS_ROPE;
    m.n_kv_head = 2;
    check_decode(&m);
    parallel_config(&m, PAR_GELU_GQA_ALIBI); // decoding runs the fused projection too
    check_decode(&m);
    parallel_config(&m, PAR_SWIGLU_GQA_ROPE);
    check_decode(&m);
}

static void check_decode(const struct kiln_model_config *mc) {
    struct kiln_model_config m = *mc;
    struct fixture f;
    fixture_open(&f, &m, KILN_RECOMPUTE_NONE, 5);
    struct kiln_error e;
    assert_int_equal(kiln_model_decode_begin(f.g, 1, m.block_size, &e), 0);
    // the full forward's per-position loss, for the target = each vocab id, recovers the log-softmax; instead
    // compare losses: run the full forward on sequence 0 with its targets, and the decode loss per position
    int T = f.T;
    int32_t *tg = malloc(sizeof(int32_t) * f.B * T);
    for (int i = 0; i < f.B * T; i++)
        tg[i] = f.tgt[i] < 0 ? 0 : f.tgt[i];
    double full = kiln_model_forward(f.g, f.in, tg, 0.0f, 0.0f);
    (void)full;
    float *logits = malloc(sizeof(float) * m.vocab_size);
    double dec_sum = 0;
    for (int b = 0; b < f.B; b++) {
        assert_int_equal(kiln_model_decode_begin(f.g, 1, m.block_size, &e), 0);
        for (int t = 0; t < T; t++) {
            kiln_model_decode_step(f.g, &f.in[b * T + t], t, logits);
            double mx = -1e30, z = 0;
            for (int v = 0; v < m.vocab_size; v++)
                mx = logits[v] > mx ? logits[v] : mx;
            for (int v = 0; v < m.vocab_size; v++)
                z += exp(logits[v] - mx);
            dec_sum += log(z) + mx - logits[tg[b * T + t]];
        }
    }
    double dec = dec_sum / (f.B * T);
    if (fabs(dec - full) > 1e-4 * fabs(full))
        fail_msg("decode mean loss %.7f != full forward %.7f", dec, full);
    free(tg);
    free(logits);
    fixture_close(&f);
}

static void train_steps(const struct kiln_model_config *m, uint64_t seed, int steps, double *losses,
                        float *params_out) {
    struct fixture f;
    fixture_open(&f, m, KILN_RECOMPUTE_NONE, seed);
    struct kiln_model_buffers b;
    kiln_model_buffers(f.g, &b);
    // the optimizer's state over the model's weights, which on the CPU are its master
    struct kiln_optim_state_opts so = {.total = kiln_model_params(f.g)->total, .weights = b.weights};
    struct kiln_optim_state *os;
    struct kiln_error e;
    if (kiln_optim_state_create(&os, &f.be, &so, &e))
        fail_msg("optimizer state: %s", e.msg);
    struct kiln_adamw_buffers ab;
    kiln_optim_state_buffers(os, &ab);
    ab.grads = b.grads;
    int n_spans;
    struct kiln_param_span *spans = kiln_adamw_table_spans(kiln_model_params(f.g), &n_spans);
    for (int s = 0; s < steps; s++) {
        kiln_model_zero_grad(f.g);
        losses[s] = kiln_model_forward(f.g, f.in, f.tgt, 1.0f / (f.B * f.T), 0.0f);
        kiln_model_backward(f.g);
        double norm = kiln_adamw_grad_norm(&f.be, b.grads, kiln_model_params(f.g)->total);
        struct kiln_adamw_hparams h = {.lr = 1e-2f,
                                       .beta1 = 0.9f,
                                       .beta2 = 0.95f,
                                       .eps = 1e-8f,
                                       .weight_decay = 0.1f,
                                       .grad_clip = 1.0f,
                                       .grad_scale = 1.0f,
                                       .step = s + 1};
        kiln_adamw_step(&f.be, &ab, spans, n_spans, &h, norm);
    }
    free(spans);
    kiln_optim_state_get_master(os, 0, kiln_model_params(f.g)->total, params_out);
    kiln_optim_state_free(os);
    fixture_close(&f);
}

// kiln_model_zero_grad does not zero: the first micro-step's ops assign. A gradient some op forgot to assign
// would keep the previous step's value; so a step after another batch must give exactly the gradients of a
// fresh model, and two accumulated micro-steps the sum of their separate gradients.
static void grads_of(struct fixture *f, const int32_t *in, const int32_t *tgt, float *grad) {
    kiln_model_zero_grad(f->g);
    kiln_model_forward(f->g, in, tgt, 0.1f, 0.0f);
    kiln_model_backward(f->g);
    kiln_model_get_grads(f->g, grad);
}

static void check_no_stale_gradients(const struct kiln_model_config *m, const char *what, int fused) {
    struct fixture a, b;
    fixture_open(&a, m, KILN_RECOMPUTE_NONE, 5);
    fixture_open(&b, m, KILN_RECOMPUTE_NONE, 5);
    expect_fusion(a.g, fused, fused, what);
    size_t total = kiln_model_params(a.g)->total, n = (size_t)a.B * a.T;
    int32_t *in2 = malloc(n * sizeof(int32_t)), *tgt2 = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        in2[i] = (a.in[i] + 3) % m->vocab_size;
        tgt2[i] = (int32_t)((i * 7) % (size_t)m->vocab_size);
    }
    float *ga = malloc(total * 4), *gb = malloc(total * 4), *g1 = malloc(total * 4);
    grads_of(&a, a.in, a.tgt, g1); // batch 1 leaves its gradients behind
    grads_of(&a, in2, tgt2, ga);
    grads_of(&b, in2, tgt2, gb); // a fresh model: its buffer was zeroed at creation
    for (size_t i = 0; i < total; i++)
        if (memcmp(&ga[i], &gb[i], 4) != 0)
            fail_msg("%s: gradient %zu after another step %g, fresh %g", what, i, ga[i], gb[i]);
    // accumulation: batch 1 then batch 2 without zeroing in between
    kiln_model_zero_grad(a.g);
    kiln_model_forward(a.g, a.in, a.tgt, 0.1f, 0.0f);
    kiln_model_backward(a.g);
    kiln_model_forward(a.g, in2, tgt2, 0.1f, 0.0f);
    kiln_model_backward(a.g);
    kiln_model_get_grads(a.g, ga);
    for (size_t i = 0; i < total; i++)
        if (fabsf(ga[i] - (g1[i] + gb[i])) > 1e-5f * (1.0f + fabsf(g1[i]) + fabsf(gb[i])))
            fail_msg("%s: accumulated gradient %zu = %g, separate sum %g", what, i, ga[i], g1[i] + gb[i]);
    free(in2);
    free(tgt2);
    free(ga);
    free(gb);
    free(g1);
    fixture_close(&a);
    fixture_close(&b);
}

static void test_first_micro_step_overwrites_every_gradient(void **state) {
    struct kiln_model_config m;
    tiny_config(&m);
    check_no_stale_gradients(&m, "gpt2 (tied)", 0);
    m.tie_embeddings = 0;
    m.pos = KILN_POS_ROPE;
    m.norm_rms = 1;
    m.mlp_swiglu = 1;
    m.mlp_hidden = 24;
    m.n_kv_head = 2;
    m.qk_norm = 1;
    check_no_stale_gradients(&m, "untied, rope, rms, swiglu, gqa, qk-norm", 0);
    tiny_config(&m);
    m.parallel_block = 1;
    m.pos = KILN_POS_ALIBI;
    check_no_stale_gradients(&m, "parallel, alibi", 0); // QKV = 48 biases: two GEMMs
    m.n_embd = 64;                                      // wide enough for the fused input projection
    check_no_stale_gradients(&m, "parallel, alibi, fused projection", 1);
    m.mlp_swiglu = 1;
    m.mlp_hidden = 128;
    check_no_stale_gradients(&m, "parallel, swiglu, fused projection", 1);
}

static void test_same_seed_is_bitwise_identical_and_other_seed_differs(void **state) {
    struct kiln_model_config m;
    tiny_config(&m);
    struct kiln_param_table pt;
    kiln_params_build(&pt, &m);
    size_t total = pt.total;
    kiln_params_free(&pt);
    double l1[8], l2[8], l3[8];
    float *p1 = malloc(total * 4), *p2 = malloc(total * 4), *p3 = malloc(total * 4);
    train_steps(&m, 11, 8, l1, p1);
    train_steps(&m, 11, 8, l2, p2);
    train_steps(&m, 12, 8, l3, p3);
    assert_memory_equal(l1, l2, sizeof(l1));
    assert_memory_equal(p1, p2, total * 4);
    assert_true(memcmp(p1, p3, total * 4) != 0);
    assert_true(l1[7] < l1[0]); // it learns the fixed batch
    free(p1);
    free(p2);
    free(p3);
}

// ----------------------------------------------------------------------------
// the scratch arena: buffers that share memory (gpt.c's scratch_layout) are never live at the same time

struct scratch_case {
    const char *name;
    void (*config)(struct kiln_model_config *m);
    int fused; // the parallel block's input projections fuse (forward too, but under --recompute=mlp)
};

static void seq_gelu(struct kiln_model_config *m) {
    tiny_config(m);
}
static void seq_gelu_qk_norm(struct kiln_model_config *m) {
    tiny_config(m);
    m->qk_norm = 1;
}
static void seq_swiglu_qk_norm(struct kiln_model_config *m) { // OLMo-2-like: rope, rms, gqa, untied
    tiny_config(m);
    m->pos = KILN_POS_ROPE;
    m->norm_rms = 1;
    m->mlp_swiglu = 1;
    m->mlp_hidden = 24;
    m->n_kv_head = 2;
    m->bias = 0;
    m->tie_embeddings = 0;
    m->qk_norm = 1;
}
static void par_gelu_fused(struct kiln_model_config *m) {
    parallel_config(m, PAR_GELU_BIAS);
}
static void par_swiglu_fused(struct kiln_model_config *m) {
    parallel_config(m, PAR_SWIGLU_GQA_ROPE);
}
static void par_gelu_two_gemms(struct kiln_model_config *m) { // QKV = 48 biases: padding separates them
    tiny_config(m);
    m->parallel_block = 1;
    m->pos = KILN_POS_ALIBI;
}
static void par_swiglu_qk_norm(struct kiln_model_config *m) { // QK-norm keeps two GEMMs
    parallel_config(m, PAR_SWIGLU_GQA_ROPE);
    m->qk_norm = 1;
}

static const struct scratch_case scratch_cases[] = {
    {"sequential gelu", seq_gelu, 0},
    {"sequential gelu+qk-norm", seq_gelu_qk_norm, 0},
    {"sequential swiglu+qk-norm+gqa+rope+rms", seq_swiglu_qk_norm, 0},
    {"parallel gelu, fused", par_gelu_fused, 1},
    {"parallel swiglu+gqa+rope, fused", par_swiglu_fused, 1},
    {"parallel gelu+alibi, two gemms", par_gelu_two_gemms, 0},
    {"parallel swiglu+qk-norm, two gemms", par_swiglu_qk_norm, 0},
};

// What a model computes over two micro-steps (the second adds its gradients to the first's) on different
// batches, then an evaluation forward: the three losses and the gradients. Every scratch buffer is written
// and read there, in each order a training run uses. Returns the plan's scratch bytes.
static size_t scratch_run(const struct kiln_model_config *m, enum kiln_recompute rc, int fused,
                          double loss[3], float *grad, const char *what) {
    struct fixture f;
    fixture_open(&f, m, rc, 17);
    expect_fusion(f.g, fused && rc != KILN_RECOMPUTE_MLP, fused, what);
    const struct kiln_param_table *pt = kiln_model_params(f.g);
    float *p = calloc(pt->total, sizeof(float));
    kiln_model_get_params(f.g, p);
    uint64_t s = 5;
    for (int i = 0; i < pt->n; i++) // off GPT-2's init, so that every path carries signal
        for (size_t j = 0; j < pt->p[i].count; j++)
            p[pt->p[i].offset + j] += 0.3f * (test_rand_uniform(&s) - 0.5f);
    kiln_model_set_params(f.g, p);
    int n = f.B * f.T;
    int32_t *in2 = malloc((size_t)n * sizeof(int32_t)), *tgt2 = malloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        in2[i] = (f.in[i] * 5 + 2) % m->vocab_size;
        tgt2[i] = (f.tgt[n - 1 - i] + 1) % m->vocab_size;
    }
    kiln_model_zero_grad(f.g);
    loss[0] = kiln_model_forward(f.g, f.in, f.tgt, 0.05f, 0.0f);
    kiln_model_backward(f.g);
    loss[1] = kiln_model_forward(f.g, in2, tgt2, 0.05f, 1e-3f);
    kiln_model_backward(f.g);
    loss[2] = kiln_model_forward(f.g, in2, f.tgt, 0.0f, 0.0f);
    kiln_model_get_grads(f.g, grad);
    size_t scratch = kiln_model_mem_plan(f.g)->scratch_bytes;
    free(p);
    free(in2);
    free(tgt2);
    fixture_close(&f);
    return scratch;
}

// With the scratch shared, every number is what it is with every buffer apart (KILN_SCRATCH_SHARED=0), bit
// for bit: in every block type and recompute mode, with the LM head in one chunk and in three.
static void test_shared_scratch_changes_no_number(void **state) {
    const char *rc_name[] = {"none", "mlp", "block", "act"};
    for (size_t c = 0; c < sizeof(scratch_cases) / sizeof(scratch_cases[0]); c++) {
        struct kiln_model_config m;
        scratch_cases[c].config(&m);
        struct kiln_param_table pt;
        kiln_params_build(&pt, &m);
        float *gs = calloc(pt.total, sizeof(float)), *ga = calloc(pt.total, sizeof(float));
        for (int rc = KILN_RECOMPUTE_NONE; rc <= KILN_RECOMPUTE_ACT; rc++)
            for (int chunked = 0; chunked < 2; chunked++) {
                char what[160];
                snprintf(what, sizeof(what), "%s, recompute=%s, %s", scratch_cases[c].name, rc_name[rc],
                         chunked ? "3 classifier chunks" : "1 classifier chunk");
                fixture_knobs.classifier_rows = chunked ? 5 : 0; // 14 rows: 5 + 5 + 4
                double ls[3], la[3];
                size_t shared =
                    scratch_run(&m, (enum kiln_recompute)rc, scratch_cases[c].fused, ls, gs, what);
                fixture_knobs.scratch_shared = 0;
                size_t apart = scratch_run(&m, (enum kiln_recompute)rc, scratch_cases[c].fused, la, ga, what);
                fixture_knobs.scratch_shared = 1;
                fixture_knobs.classifier_rows = 0;
                if (!(shared < apart))
                    fail_msg("%s: the shared scratch takes %zu bytes, apart %zu", what, shared, apart);
                for (int k = 0; k < 3; k++)
                    if (memcmp(&ls[k], &la[k], sizeof(double)) != 0)
                        fail_msg("%s: loss %d is %.9g with the scratch shared, %.9g apart", what, k, ls[k],
                                 la[k]);
                for (int i = 0; i < pt.n; i++)
                    if (memcmp(gs + pt.p[i].offset, ga + pt.p[i].offset, pt.p[i].count * sizeof(float)) != 0)
                        fail_msg("%s: the gradient of %s differs with the scratch shared", what,
                                 pt.p[i].name);
            }
        free(gs);
        free(ga);
        kiln_params_free(&pt);
    }
}

// The plan is what the model allocates, byte for byte, and the model frees all it allocated.
static const struct kiln_ops *real_ops;
static size_t allocated_bytes;
static int live_allocations;

static void *counting_alloc(void *ctx, size_t bytes) {
    void *p = real_ops->alloc(ctx, bytes);
    if (p) {
        allocated_bytes += bytes;
        live_allocations++;
    }
    return p;
}

static void counting_free(void *ctx, void *p) {
    live_allocations--;
    real_ops->free(ctx, p);
}

static void test_plan_is_what_the_model_allocates(void **state) {
    struct kiln_backend be;
    struct kiln_error e;
    struct kiln_backend_opts bo = {0};
    assert_int_equal(kiln_backend_open("cpu", &bo, &be, &e), 0);
    real_ops = be.ops;
    struct kiln_ops counting = *be.ops;
    counting.alloc = counting_alloc;
    counting.free = counting_free;
    be.ops = &counting;
    for (size_t c = 0; c < sizeof(scratch_cases) / sizeof(scratch_cases[0]); c++)
        for (int rc = KILN_RECOMPUTE_NONE; rc <= KILN_RECOMPUTE_ACT; rc++)
            for (int training = 0; training < 2; training++)
                for (int apart = 0; apart < 8; apart++) { // 2, 3: the MLP in chunks of 4 rows; 4+: offload
                    struct kiln_model_config m;
                    scratch_cases[c].config(&m);
                    struct kiln_model_opts o = {.B = 3,
                                                .T = 5,
                                                .recompute = (enum kiln_recompute)rc,
                                                .training = training,
                                                .offload_activations = (apart & 4) != 0,
                                                .scratch_apart = (apart & 1) != 0, // KILN_SCRATCH_SHARED=0
                                                .mlp_rows = apart & 2 ? 4 : 0};    // KILN_MLP_ROWS=4
                    struct kiln_mem_plan plan;
                    kiln_model_plan(&m, &o, be.act_dtype, be.grad_dtype, be.weights_alias_master, &plan);
                    allocated_bytes = 0;
                    live_allocations = 0;
                    struct kiln_model *g;
                    if (kiln_model_create(&g, &m, &be, &o, &e))
                        fail_msg("create: %s", e.msg);
                    const struct kiln_mem_plan *own = kiln_model_mem_plan(g);
                    if (allocated_bytes != plan.total_bytes || own->total_bytes != plan.total_bytes)
                        fail_msg(
                            "%s, recompute %d, training %d, apart %d: allocated %zu bytes, planned %zu (the "
                            "model's own plan %zu)",
                            scratch_cases[c].name, rc, training, apart, allocated_bytes, plan.total_bytes,
                            own->total_bytes);
                    assert_true(plan.scratch_bytes > 0 && plan.scratch_bytes <= plan.acts_bytes);
                    kiln_model_free(g);
                    assert_int_equal(live_allocations, 0);
                }
    be.ops = real_ops;
    kiln_backend_close(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_gradients_match_finite_differences),
        cmocka_unit_test(test_architecture_options_gradients_match_finite_differences),
        cmocka_unit_test(test_parallel_fused_gradients_match_finite_differences),
        cmocka_unit_test(test_parallel_fused_projection_matches_two_gemms),
        cmocka_unit_test(test_parallel_block_falls_back_to_two_gemms_when_padding_separates_the_weights),
        cmocka_unit_test(test_recompute_gives_identical_gradients),
        cmocka_unit_test(test_kv_cache_decode_matches_full_forward),
        cmocka_unit_test(test_same_seed_is_bitwise_identical_and_other_seed_differs),
        cmocka_unit_test(test_first_micro_step_overwrites_every_gradient),
        cmocka_unit_test(test_shared_scratch_changes_no_number),
        cmocka_unit_test(test_plan_is_what_the_model_allocates),
        cmocka_unit_test(test_mlp_in_chunks_matches_the_whole_mlp),
        cmocka_unit_test(test_offloaded_activations_change_no_number),
    };
    kiln_knobs_defaults(&fixture_knobs);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
