// The whole model on CUDA (bf16 mixed precision) against the CPU fp32 reference: loss and gradients of one
// step (parallel blocks with their fused input projection among them), a 50-step training trajectory on Tiny
// Shakespeare, bitwise determinism, the shared scratch against buffers apart, and the out-of-memory message;
// with bf16 parameter gradients (a backend opened with grad_dtype = KILN_BF16), one step against the CPU and
// a trajectory against fp32 gradients'. Exits 77 (skipped) where no GPU is present.
#include "test_util.h"

#include "core/backend.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "optim/state.h"
#include "run/knobs.h"
#include "run/options.h"
#include "run/tuning.h"
#include "run/embedded.h"

static struct kiln_backend cpu, gpu, gpu_bf16; // gpu_bf16: parameter gradients in bf16
// The knobs, read from the environment once in main (so that KILN_ATTN=ref and the like choose the kernels
// of a whole run, as for kiln train); tests change the model's tuning fields directly, and restore them.
static struct kiln_knobs knobs;

static void small_config(struct kiln_model_config *m, int variant) {
    struct kiln_config c;
    struct kiln_error e;
    assert_int_equal(kiln_config_init(&c, "shakespeare-char", &e), 0);
    *m = c.model;
    m->n_layer = 2;
    m->n_head = 2;
    m->n_embd = 128; // head size 64: the fast attention path
    m->block_size = 128;
    m->vocab_size = 65;
    if (variant == 1) { // Llama-style
        m->pos = KILN_POS_ROPE;
        m->norm_rms = 1;
        m->mlp_swiglu = 1;
        m->n_kv_head = 1;
        m->bias = 0;
        m->tie_embeddings = 0;
    } else if (variant == 3) { // OLMo-2-style: QK-norm with RMSNorm, GQA, RoPE
        m->pos = KILN_POS_ROPE;
        m->norm_rms = 1;
        m->qk_norm = 1;
        m->n_kv_head = 1;
        m->mlp_swiglu = 1;
        m->bias = 0;
    } else if (variant == 2) { // OLMo/PaLM-style, GELU with biases: fused projection rows of 384 + 512
        m->pos = KILN_POS_ALIBI;
        m->parallel_block = 1;
        m->norm_bias = 0;
    } else if (variant == 4) { // parallel, SwiGLU, GQA, RoPE, RMSNorm, no biases: fused rows of 256 + 1024
        m->pos = KILN_POS_ROPE;
        m->parallel_block = 1;
        m->norm_rms = 1;
        m->mlp_swiglu = 1;
        m->n_kv_head = 1;
        m->bias = 0;
    }
}

// a batch of windows of the embedded text, char-encoded by byte value mapped into [0, 65)
static void text_batch(int B, int T, uint64_t *s, int32_t *in, int32_t *tgt) {
    size_t n;
    const char *text = kiln_embedded_shakespeare(&n);
    static int32_t map[256];
    static int ready = 0;
    if (!ready) {
        int k = 0;
        for (int c = 0; c < 256; c++)
            map[c] = -1;
        for (size_t i = 0; i < n; i++)
            if (map[(unsigned char)text[i]] < 0)
                map[(unsigned char)text[i]] = k++;
        ready = 1;
    }
    for (int b = 0; b < B; b++) {
        size_t off = (size_t)(test_rand_u64(s) % (n - (size_t)T - 1));
        for (int t = 0; t < T; t++) {
            in[b * T + t] = map[(unsigned char)text[off + t]];
            tgt[b * T + t] = map[(unsigned char)text[off + t + 1]];
        }
    }
}

static struct kiln_model *make_rc(struct kiln_backend *be, const struct kiln_model_config *m, int B, int T,
                                enum kiln_recompute rc) {
    struct kiln_model *g;
    struct kiln_error e;
    struct kiln_model_opts o = {.B = B, .T = T, .recompute = rc, .training = 1};
    kiln_model_tuning(&o, &knobs);
    if (kiln_model_create(&g, m, be, &o, &e))
        fail_msg("create on %s: %s", be->name, e.msg);
    kiln_model_init_params(g, 1234);
    return g;
}

static struct kiln_model *make(struct kiln_backend *be, const struct kiln_model_config *m, int B, int T) {
    return make_rc(be, m, B, T, KILN_RECOMPUTE_NONE);
}

// One forward+backward on the same batch: loss within 1e-2 relative, each tensor's gradient within 6e-2. The
// GPU model runs on backend gb with recompute mode rc (the CPU's numbers do not depend on it).
static void check_step_matches_cpu_rc(struct kiln_backend *gb, int variant, enum kiln_recompute rc,
                                      const char *what) {
    struct kiln_model_config m;
    small_config(&m, variant);
    int B = 4, T = 100; // T not a multiple of the 64-wide attention tiles
    struct kiln_model *gc = make(&cpu, &m, B, T), *gg = make_rc(gb, &m, B, T, rc);
    if (m.parallel_block) { // these shapes fuse the two input projections (gpt.c's struct fusion)
        int fwd, bwd;
        kiln_model_fused_projection(gg, &fwd, &bwd);
        if (!bwd || fwd != (rc != KILN_RECOMPUTE_MLP))
            fail_msg("%s: fused projection forward %d backward %d", what, fwd, bwd);
    }
    int32_t *in = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
    uint64_t s = test_seed();
    text_batch(B, T, &s, in, tgt);
    kiln_model_zero_grad(gc);
    kiln_model_zero_grad(gg);
    double lc = kiln_model_forward(gc, in, tgt, 1.0f / (B * T), 0.0f);
    double lg = kiln_model_forward(gg, in, tgt, 1.0f / (B * T), 0.0f);
    kiln_model_backward(gc);
    kiln_model_backward(gg);
    fprintf(stderr, "[model %s] loss cpu %.6f cuda %.6f\n", what, lc, lg);
    if (!(fabs(lc - lg) <= 1e-2 * fabs(lc)))
        fail_msg("%s: loss cpu %.6f vs cuda %.6f", what, lc, lg);
    const struct kiln_param_table *pt = kiln_model_params(gc);
    float *dc = malloc(pt->total * sizeof(float)), *dg = malloc(pt->total * sizeof(float));
    kiln_model_get_grads(gc, dc);
    kiln_model_get_grads(gg, dg);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < pt->n; i++) {
        double e = test_rel_err(dg + pt->p[i].offset, dc + pt->p[i].offset, pt->p[i].count);
        if (e > worst) {
            worst = e;
            worst_name = pt->p[i].name;
        }
    }
    fprintf(stderr, "[model %s] worst gradient rel err %.3e (%s)\n", what, worst, worst_name);
    if (!(worst <= 6e-2))
        fail_msg("%s: gradient of %s differs by %.3e (tolerance 6e-2)", what, worst_name, worst);
    free(dc);
    free(dg);
    free(in);
    free(tgt);
    kiln_model_free(gc);
    kiln_model_free(gg);
}

static void check_step_matches_cpu(int variant, const char *what) {
    check_step_matches_cpu_rc(&gpu, variant, KILN_RECOMPUTE_NONE, what);
}

static void test_gpt2_step_matches_cpu(void **state) {
    check_step_matches_cpu(0, "gpt2");
}
static void test_llama_style_step_matches_cpu(void **state) {
    check_step_matches_cpu(1, "llama-style");
}
static void test_parallel_alibi_step_matches_cpu(void **state) {
    check_step_matches_cpu(2, "parallel+alibi");
}
// The parallel block's fused projection with SwiGLU, and with --recompute=mlp (two GEMMs forward, the fused
// backward writing dfc at one row stride while the DGELU reads the pre-activation at another).
static void test_parallel_swiglu_step_matches_cpu(void **state) {
    check_step_matches_cpu(4, "parallel+swiglu+gqa+rope");
}
static void test_parallel_recompute_steps_match_cpu(void **state) {
    check_step_matches_cpu_rc(&gpu, 2, KILN_RECOMPUTE_MLP, "parallel+alibi, recompute=mlp");
    check_step_matches_cpu_rc(&gpu, 4, KILN_RECOMPUTE_BLOCK, "parallel+swiglu, recompute=block");
}
// --recompute=act: the GELU (or SwiGLU) output recomputed before each layer's backward, from the kept input
static void test_activation_recompute_steps_match_cpu(void **state) {
    check_step_matches_cpu_rc(&gpu, 0, KILN_RECOMPUTE_ACT, "gpt2, recompute=act");
    check_step_matches_cpu_rc(&gpu, 1, KILN_RECOMPUTE_ACT, "llama-style, recompute=act");
    check_step_matches_cpu_rc(&gpu_bf16, 2, KILN_RECOMPUTE_ACT, "parallel+alibi (fused), recompute=act, bf16 grads");
}
static void test_qk_norm_step_matches_cpu(void **state) {
    check_step_matches_cpu(3, "qk-norm+rms+gqa+rope");
}

static void train(struct kiln_backend *be, const struct kiln_model_config *m, int steps, double *losses,
                  float *params_out) {
    int B = 8, T = 64;
    struct kiln_model *g = make(be, m, B, T);
    struct kiln_model_buffers b;
    kiln_model_buffers(g, &b);
    // the optimizer's state: f32 master weights and moments, keeping the model's compute copy in step
    size_t total = kiln_model_params(g)->total;
    struct kiln_optim_state_opts so = {.total = total, .weights = b.weights};
    struct kiln_optim_state *os;
    struct kiln_error e;
    if (kiln_optim_state_create(&os, be, &so, &e))
        fail_msg("optimizer state on %s: %s", be->name, e.msg);
    float *init = malloc(total * sizeof(float)); // the master from the model's initial weights (f32 on the host)
    kiln_params_init(kiln_model_params(g), m, init, 1234);
    kiln_optim_state_set_master(os, init);
    free(init);
    struct kiln_adamw_buffers ab;
    kiln_optim_state_buffers(os, &ab);
    ab.grads = b.grads;
    int n_spans;
    struct kiln_param_span *spans = kiln_adamw_table_spans(kiln_model_params(g), &n_spans);
    int32_t *in = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
    uint64_t s = 42; // the same batches on every backend and run
    for (int step = 0; step < steps; step++) {
        text_batch(B, T, &s, in, tgt);
        kiln_model_zero_grad(g);
        losses[step] = kiln_model_forward(g, in, tgt, 1.0f / (B * T), 0.0f);
        kiln_model_backward(g);
        double norm = kiln_adamw_grad_norm(be, b.grads, kiln_model_params(g)->total);
        struct kiln_adamw_hparams h = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f,
                                       .weight_decay = 0.1f, .grad_clip = 1.0f, .grad_scale = 1.0f, .step = step + 1};
        kiln_adamw_step(be, &ab, spans, n_spans, &h, norm);
    }
    free(spans);
    if (params_out)
        kiln_optim_state_get_master(os, 0, total, params_out);
    kiln_optim_state_free(os);
    free(in);
    free(tgt);
    kiln_model_free(g);
}

// 50 steps on Tiny Shakespeare follow the CPU trajectory: every step's loss within 3% (bf16 drift), and both
// learn (the final loss is well below the initial ln(65) = 4.17).
static void test_training_follows_cpu_trajectory(void **state) {
    struct kiln_model_config m;
    small_config(&m, 0);
    double lc[50], lg[50];
    train(&cpu, &m, 50, lc, NULL);
    train(&gpu, &m, 50, lg, NULL);
    double worst = 0;
    for (int i = 0; i < 50; i++) {
        double d = fabs(lc[i] - lg[i]) / lc[i];
        worst = d > worst ? d : worst;
    }
    fprintf(stderr, "[trajectory] step 1 cpu %.4f cuda %.4f | step 50 cpu %.4f cuda %.4f | worst rel diff %.3e\n",
            lc[0], lg[0], lc[49], lg[49], worst);
    assert_true(worst < 3e-2);
    assert_true(lc[49] < 3.0 && lg[49] < 3.0);
}

// bf16 gradients, one step: the same tolerances as fp32 gradients (their one rounding, 2^-9, is far inside
// 6e-2), over a tied head with learned positions (classifier then embedding write the table), an untied
// Llama-style model (no biases, RMSNorm), and the parallel block's fused projection (one GEMM writes [dW_qkv;
// dW_fc]). The plan holds 2 bytes per gradient.
static void test_bf16_gradient_steps_match_cpu(void **state) {
    check_step_matches_cpu_rc(&gpu_bf16, 0, KILN_RECOMPUTE_NONE, "gpt2, bf16 grads");
    check_step_matches_cpu_rc(&gpu_bf16, 1, KILN_RECOMPUTE_NONE, "llama-style, bf16 grads");
    check_step_matches_cpu_rc(&gpu_bf16, 2, KILN_RECOMPUTE_NONE, "parallel+alibi, bf16 grads");
    struct kiln_model_config m;
    small_config(&m, 0);
    struct kiln_model *g = make(&gpu_bf16, &m, 4, 100);
    assert_int_equal(kiln_model_mem_plan(g)->grads_bytes, kiln_model_params(g)->total * 2);
    kiln_model_free(g);
}

// 50 steps with bf16 gradients follow the fp32-gradient trajectory on the same GPU: every step's loss within
// 2% (the runs differ only by the gradients' rounding, which AdamW's normalized update carries into the
// weights), and the run learns as well (final loss below 3.0, as the fp32 runs).
static void test_bf16_gradient_training_follows_fp32_gradients(void **state) {
    struct kiln_model_config m;
    small_config(&m, 0);
    double lf[50], lb[50];
    train(&gpu, &m, 50, lf, NULL);
    train(&gpu_bf16, &m, 50, lb, NULL);
    double worst = 0;
    for (int i = 0; i < 50; i++) {
        double d = fabs(lb[i] - lf[i]) / lf[i];
        worst = d > worst ? d : worst;
    }
    fprintf(stderr,
            "[trajectory bf16 grads] step 1 fp32 %.4f bf16 %.4f | step 50 fp32 %.4f bf16 %.4f | worst rel "
            "diff %.3e\n",
            lf[0], lb[0], lf[49], lb[49], worst);
    assert_true(worst < 2e-2);
    assert_true(lb[49] < 3.0);
}

static void test_gpu_training_is_bitwise_repeatable(void **state) {
    struct kiln_model_config m;
    small_config(&m, 1);
    struct kiln_param_table pt;
    kiln_params_build(&pt, &m);
    size_t total = pt.total;
    kiln_params_free(&pt);
    double l1[10], l2[10];
    float *p1 = malloc(total * 4), *p2 = malloc(total * 4);
    train(&gpu, &m, 10, l1, p1);
    train(&gpu, &m, 10, l2, p2);
    assert_memory_equal(l1, l2, sizeof(l1));
    assert_memory_equal(p1, p2, total * 4);
    free(p1);
    free(p2);
}

// Two micro-steps on different batches (the second adds its gradients to the first's): both losses and the
// gradients, for a model created with the environment as it is.
static void scratch_steps(int variant, enum kiln_recompute rc, double loss[2], float *grad);

// --recompute=selective keeps each layer's attention output and log-sum-exp instead of recomputing them: the
// recomputed ones are bitwise the kept ones (deterministic kernels), so every loss and gradient is block's,
// bit for bit, in every block type (RoPE, whose backward rotates q and k itself, included).
static void test_selective_recompute_matches_block(void **state) {
    for (int v = 0; v <= 4; v++) {
        struct kiln_model_config m;
        small_config(&m, v);
        struct kiln_param_table pt;
        kiln_params_build(&pt, &m);
        float *gb = malloc(pt.total * sizeof(float)), *gs = malloc(pt.total * sizeof(float));
        double lb[2], ls[2];
        scratch_steps(v, KILN_RECOMPUTE_BLOCK, lb, gb);
        scratch_steps(v, KILN_RECOMPUTE_SELECTIVE, ls, gs);
        fprintf(stderr, "[selective] variant %d: losses %.6f %.6f (block %.6f %.6f)\n", v, ls[0], ls[1], lb[0],
                lb[1]);
        if (memcmp(lb, ls, sizeof(lb)) != 0 || memcmp(gb, gs, pt.total * sizeof(float)) != 0)
            fail_msg("variant %d: --recompute=selective differs from block", v);
        free(gb);
        free(gs);
        kiln_params_free(&pt);
    }
}

static void scratch_steps(int variant, enum kiln_recompute rc, double loss[2], float *grad) {
    struct kiln_model_config m;
    small_config(&m, variant);
    int B = 4, T = 100;
    struct kiln_model *g = make_rc(&gpu, &m, B, T, rc);
    int32_t *in = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
    uint64_t s = 77;
    kiln_model_zero_grad(g);
    for (int k = 0; k < 2; k++) {
        text_batch(B, T, &s, in, tgt);
        loss[k] = kiln_model_forward(g, in, tgt, 1.0f / (2 * B * T), 0.0f);
        kiln_model_backward(g);
    }
    kiln_model_get_grads(g, grad);
    free(in);
    free(tgt);
    kiln_model_free(g);
}

// The scratch buffers that share memory (gpt.c's scratch arena) change no number on CUDA either: bit for bit
// what every buffer apart gives (KILN_SCRATCH_SHARED=0, deterministic mode), in every block type and
// recompute mode, with the LM head in one chunk and in three.
static void test_shared_scratch_changes_no_number(void **state) {
    const char *rc_name[] = {"none", "mlp", "block", "act", "selective"};
    for (int v = 0; v <= 4; v++) {
        struct kiln_model_config m;
        small_config(&m, v);
        struct kiln_param_table pt;
        kiln_params_build(&pt, &m);
        float *gs = malloc(pt.total * sizeof(float)), *ga = malloc(pt.total * sizeof(float));
        for (int rc = KILN_RECOMPUTE_NONE; rc <= KILN_RECOMPUTE_SELECTIVE; rc++)
            for (int chunked = 0; chunked < 2; chunked++) {
                struct kiln_knobs was = knobs;
                if (chunked)
                    knobs.classifier_rows = 150; // 400 rows: 150 + 150 + 100
                double ls[2], la[2];
                scratch_steps(v, (enum kiln_recompute)rc, ls, gs);
                knobs.scratch_shared = 0;
                scratch_steps(v, (enum kiln_recompute)rc, la, ga);
                knobs = was;
                fprintf(stderr,
                        "[scratch] variant %d, recompute=%s, %d chunk(s): loss %.6f shared, %.6f apart\n", v,
                        rc_name[rc], chunked ? 3 : 1, ls[1], la[1]);
                if (memcmp(ls, la, sizeof(ls)) != 0)
                    fail_msg("variant %d, recompute=%s: losses %.9g %.9g shared, %.9g %.9g apart", v,
                             rc_name[rc], ls[0], ls[1], la[0], la[1]);
                for (int i = 0; i < pt.n; i++)
                    if (memcmp(gs + pt.p[i].offset, ga + pt.p[i].offset, pt.p[i].count * sizeof(float)) != 0)
                        fail_msg("variant %d, recompute=%s, %d chunk(s): the gradient of %s differs with the "
                                 "scratch shared",
                                 v, rc_name[rc], chunked ? 3 : 1, pt.p[i].name);
            }
        free(gs);
        free(ga);
        kiln_params_free(&pt);
    }
}

// An impossible plan is an error quoting the plan, not a crash; the backend keeps working afterwards.
static void test_out_of_memory_is_a_clear_error(void **state) {
    struct kiln_config c;
    struct kiln_error e;
    assert_int_equal(kiln_config_init(&c, "gpt2-1.5b", &e), 0);
    c.model.vocab_size = 50257;
    struct kiln_model *g = NULL;
    struct kiln_model_opts o = {.B = 2048, .T = 1024, .recompute = KILN_RECOMPUTE_NONE, .training = 1};
    kiln_model_tuning(&o, &knobs);
    int rc = kiln_model_create(&g, &c.model, &gpu, &o, &e);
    assert_int_equal(rc, KILN_ERR_RUNTIME);
    assert_null(g);
    fprintf(stderr, "[oom] %s\n", e.msg);
    assert_non_null(strstr(e.msg, "out of memory on cuda"));
    assert_non_null(strstr(e.msg, "the plan needs"));
    assert_non_null(strstr(e.msg, "--recompute=block"));
    struct kiln_model_config m;
    small_config(&m, 0);
    double l[2];
    train(&gpu, &m, 2, l, NULL);
    assert_true(isfinite(l[1]));
}

int main(void) {
    if (kiln_cuda_device_count() == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    struct kiln_error e;
    if (kiln_knobs_read(&knobs, NULL, &e)) {
        fprintf(stderr, "error: %s\n", e.msg);
        return 2;
    }
    // deterministic mode: the default may use atomics (faster attention backward); this mode must be bitwise
    // repeatable, which test_gpu_training_is_bitwise_repeatable checks
    struct kiln_backend_opts o = {.deterministic = 1}, ob = {.deterministic = 1, .grad_dtype = KILN_BF16};
    kiln_knobs_backend_opts(&knobs, &o);
    kiln_knobs_backend_opts(&knobs, &ob);
    if (kiln_backend_open("cpu", &o, &cpu, &e) || kiln_backend_open("cuda", &o, &gpu, &e) ||
        kiln_backend_open("cuda", &ob, &gpu_bf16, &e)) {
        fprintf(stderr, "error: %s\n", e.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_step_matches_cpu),
        cmocka_unit_test(test_llama_style_step_matches_cpu),
        cmocka_unit_test(test_parallel_alibi_step_matches_cpu),
        cmocka_unit_test(test_parallel_swiglu_step_matches_cpu),
        cmocka_unit_test(test_parallel_recompute_steps_match_cpu),
        cmocka_unit_test(test_activation_recompute_steps_match_cpu),
        cmocka_unit_test(test_qk_norm_step_matches_cpu),
        cmocka_unit_test(test_training_follows_cpu_trajectory),
        cmocka_unit_test(test_bf16_gradient_steps_match_cpu),
        cmocka_unit_test(test_bf16_gradient_training_follows_fp32_gradients),
        cmocka_unit_test(test_gpu_training_is_bitwise_repeatable),
        cmocka_unit_test(test_shared_scratch_changes_no_number),
        cmocka_unit_test(test_selective_recompute_matches_block),
        cmocka_unit_test(test_out_of_memory_is_a_clear_error),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kiln_backend_close(&cpu);
    kiln_backend_close(&gpu);
    kiln_backend_close(&gpu_bf16);
    return rc;
}
