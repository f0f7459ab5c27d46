// Hugging Face export and import (interop/hf.c): export -> import gives identical weights and loss for each
// architecture; the file layout HF expects, checked element by element here (GPT-2's Conv1D transpose and its
// V-row embedding, Llama's q/k/v and gate/up split, OLMo's folded norm weights); refusals name the option.
#include "test_util.h"

#include <cjson/cJSON.h>

#include "core/backend.h"
#include "io/fsutil.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "run/options.h"
#include "interop/hf.h"

// A tiny model: vocab 11 padded to 16, so the dropped padding rows are visible.
static void tiny(struct kiln_config *c) {
    struct kiln_error e;
    assert_int_equal(kiln_config_init(c, "shakespeare-char", &e), 0);
    struct kiln_model_config *m = &c->model;
    m->n_layer = 2;
    m->n_head = 4;
    m->n_embd = 16;
    m->block_size = 8;
    m->vocab_size = 11;
    m->vocab_multiple = 16;
    c->seq_len = 8;
}

static void llama(struct kiln_config *c) {
    tiny(c);
    c->model.pos = KILN_POS_ROPE;
    c->model.rope_theta = 5000.0f;
    c->model.norm_rms = 1;
    c->model.mlp_swiglu = 1;
    c->model.mlp_hidden = 24;
    c->model.n_kv_head = 2;
    c->model.bias = 0;
    c->model.tie_embeddings = 0;
}

static void olmo(struct kiln_config *c) {
    llama(c);
    c->model.norm_rms = 0;
    c->model.norm_bias = 0;
    c->model.n_kv_head = 0;
    c->model.tie_embeddings = 1;
}

static struct kiln_run_tokenizer char_tok(int V) {
    struct kiln_run_tokenizer t;
    memset(&t, 0, sizeof(t));
    snprintf(t.name, sizeof(t.name), "char");
    for (int i = 0; i < V; i++)
        t.chars[i] = (char)('a' + i);
    t.n_chars = V;
    return t;
}

// GPT-2 init plus noise on every real element (norm weights too), padding rows left at zero.
static float *random_params(const struct kiln_model_config *m, const struct kiln_param_table *pt,
                            int perturb_norms, uint64_t *s) {
    float *p = calloc(pt->total, sizeof(float));
    kiln_params_init(pt, m, p, test_rand_u64(s));
    for (int i = 0; i < pt->n; i++) {
        const struct kiln_param *q = &pt->p[i];
        int is_norm = strstr(q->name, "ln_") != NULL;
        if (is_norm && !perturb_norms)
            continue;
        size_t count = q->count;
        if (i == pt->wte || i == pt->lm_head)
            count = (size_t)m->vocab_size * (size_t)q->shape[1];
        for (size_t j = 0; j < count; j++)
            p[q->offset + j] += 0.2f * (test_rand_uniform(s) - 0.5f);
    }
    return p;
}

static double loss_of(const struct kiln_model_config *m, const float *params, const int32_t *in,
                      const int32_t *tgt) {
    struct kiln_backend be;
    struct kiln_backend_opts bo = {0};
    struct kiln_error e;
    assert_int_equal(kiln_backend_open("cpu", &bo, &be, &e), 0);
    struct kiln_model *g;
    struct kiln_model_opts o = {.B = 2, .T = 8, .recompute = KILN_RECOMPUTE_NONE, .training = 0};
    if (kiln_model_create(&g, m, &be, &o, &e))
        fail_msg("create: %s", e.msg);
    kiln_model_set_params(g, params);
    double loss = kiln_model_forward(g, in, tgt, 0.0f, 0.0f);
    kiln_model_free(g);
    kiln_backend_close(&be);
    return loss;
}

struct roundtrip {
    char dir[256];
    struct kiln_config back;
    float *orig, *imported;
    struct kiln_param_table pt; // of the original config
    double loss_orig, loss_back;
};

// export cfg's model with random params to a temp dir, import it back, compute both losses
static void roundtrip(struct roundtrip *r, const struct kiln_config *cfg, int perturb_norms, int bf16) {
    uint64_t s = test_seed() ^ kiln_model_config_hash(&cfg->model);
    struct kiln_error e;
    test_tmpdir(r->dir, sizeof(r->dir));
    kiln_params_build(&r->pt, &cfg->model);
    r->orig = random_params(&cfg->model, &r->pt, perturb_norms, &s);
    struct kiln_run_tokenizer tok = char_tok(cfg->model.vocab_size), tok2;
    struct kiln_hf_export_opts o = {.bf16 = bf16};
    if (kiln_hf_export(r->dir, &cfg->model, &tok, r->orig, &o, &e))
        fail_msg("export: %s", e.msg);
    assert_int_equal(kiln_config_init(&r->back, NULL, &e), 0);
    if (kiln_hf_import_config(r->dir, &r->back, &tok2, &e))
        fail_msg("import config: %s", e.msg);
    assert_string_equal(tok2.name, "char");
    assert_int_equal(tok2.n_chars, cfg->model.vocab_size);
    assert_memory_equal(tok2.chars, tok.chars, (size_t)tok.n_chars);
    struct kiln_param_table pt2;
    kiln_params_build(&pt2, &r->back.model);
    r->imported = calloc(pt2.total, sizeof(float));
    if (kiln_hf_import_weights(r->dir, &r->back.model, r->imported, &e))
        fail_msg("import weights: %s", e.msg);
    kiln_params_free(&pt2);
    int32_t in[16], tgt[16];
    for (int i = 0; i < 16; i++) {
        in[i] = (int32_t)(test_rand_u64(&s) % 11);
        tgt[i] = (int32_t)(test_rand_u64(&s) % 11);
    }
    r->loss_orig = loss_of(&cfg->model, r->orig, in, tgt);
    r->loss_back = loss_of(&r->back.model, r->imported, in, tgt);
}

static void roundtrip_free(struct roundtrip *r) {
    test_rmrf(r->dir);
    free(r->orig);
    free(r->imported);
    kiln_params_free(&r->pt);
}

// identical config (shape hash), bitwise identical weights and loss
static void check_identical(const struct kiln_config *cfg, int perturb_norms) {
    struct roundtrip r;
    roundtrip(&r, cfg, perturb_norms, 0);
    assert_true(kiln_model_config_hash(&r.back.model) == kiln_model_config_hash(&cfg->model));
    assert_memory_equal(r.imported, r.orig, r.pt.total * sizeof(float));
    assert_true(r.loss_back == r.loss_orig);
    roundtrip_free(&r);
}

static void test_gpt2_roundtrip_is_identical(void **state) {
    struct kiln_config c;
    tiny(&c);
    check_identical(&c, 1);
    c.model.tie_embeddings = 0;
    c.model.mlp_hidden = 40;
    c.model.norm_eps = 1e-6f;
    check_identical(&c, 1);
}

static void test_llama_roundtrip_is_identical(void **state) {
    struct kiln_config c;
    llama(&c);
    check_identical(&c, 1); // GQA, untied, no bias
    c.model.bias = 1;
    c.model.tie_embeddings = 1;
    c.model.n_kv_head = 1;
    check_identical(&c, 1); // MQA, tied, biases
}

static void test_olmo_roundtrip_is_identical_with_unit_norm_weights(void **state) {
    struct kiln_config c;
    olmo(&c);
    check_identical(&c, 0);
    c.model.tie_embeddings = 0;
    c.model.n_kv_head = 2;
    check_identical(&c, 0);
}

// kiln's LayerNorm weights (which OLMo lacks) fold into the next linear layers: same function, norm weights 1
static void test_olmo_export_folds_norm_weights_exactly(void **state) {
    struct kiln_config c;
    olmo(&c);
    struct roundtrip r;
    roundtrip(&r, &c, 1, 0);
    assert_int_equal(r.back.model.tie_embeddings, 0); // a tied head cannot absorb the final norm: untied
    double rel = fabs(r.loss_back - r.loss_orig) / r.loss_orig;
    if (!(rel < 1e-5))
        fail_msg("folded OLMo loss %.8f vs %.8f (rel %.2e)", r.loss_back, r.loss_orig, rel);
    struct kiln_error e;
    struct kiln_safetensors *f;
    char path[400];
    snprintf(path, sizeof(path), "%s/model.safetensors", r.dir);
    assert_int_equal(kiln_safetensors_open(&f, path, &e), 0);
    assert_null(kiln_safetensors_find(f, "model.layers.0.input_layernorm.weight"));
    assert_null(kiln_safetensors_find(f, "model.norm.weight"));
    // q_proj[r][c] = qkv[r][c] * ln_1.weight[c]
    const struct kiln_param *qkv = &r.pt.p[r.pt.layer[1][KILN_QKV_W]],
                            *ln1 = &r.pt.p[r.pt.layer[1][KILN_LN1_W]];
    const struct kiln_st_tensor *q = kiln_safetensors_find(f, "model.layers.1.self_attn.q_proj.weight");
    assert_non_null(q);
    const float *qd = q->data;
    for (int row = 0; row < 16; row++)
        for (int col = 0; col < 16; col++)
            assert_true(qd[row * 16 + col] ==
                        r.orig[qkv->offset + row * 16 + col] * r.orig[ln1->offset + col]);
    kiln_safetensors_close(f);
    roundtrip_free(&r);
}

static void test_bf16_export_rounds_to_within_bf16_precision(void **state) {
    struct kiln_config c;
    llama(&c);
    struct roundtrip r;
    roundtrip(&r, &c, 1, 1);
    for (int i = 0; i < r.pt.n; i++) {
        const struct kiln_param *p = &r.pt.p[i];
        for (size_t j = 0; j < p->count; j++) {
            float a = r.orig[p->offset + j], b = r.imported[p->offset + j];
            if (!(fabsf(a - b) <= fabsf(a) * (1.0f / 256.0f)))
                fail_msg("%s[%zu]: bf16 %.8g vs f32 %.8g", p->name, j, (double)b, (double)a);
        }
    }
    assert_true(fabs(r.loss_back - r.loss_orig) < 1e-2 * r.loss_orig);
    roundtrip_free(&r);
}

// ---- the layout HF expects, derived here from the definitions, not from hf.c's tables ----

static const struct kiln_st_tensor *must_find(struct kiln_safetensors *f, const char *name, int64_t d0,
                                              int64_t d1) {
    const struct kiln_st_tensor *t = kiln_safetensors_find(f, name);
    if (!t)
        fail_msg("tensor %s missing", name);
    assert_int_equal(t->dtype, KILN_ST_F32);
    assert_int_equal(t->ndim, d1 ? 2 : 1);
    assert_int_equal(t->shape[0], d0);
    if (d1)
        assert_int_equal(t->shape[1], d1);
    return t;
}

static cJSON *read_config_json(const char *dir) {
    char path[400], *text;
    size_t n;
    struct kiln_error e;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    assert_int_equal(kiln_read_file(path, &text, &n, &e), 0);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    return j;
}

static void test_gpt2_export_transposes_conv1d_weights_and_drops_vocab_padding(void **state) {
    struct kiln_config c;
    tiny(&c);
    struct roundtrip r;
    roundtrip(&r, &c, 1, 0);
    int C = 16, V = 11;
    struct kiln_error e;
    struct kiln_safetensors *f;
    char path[400];
    snprintf(path, sizeof(path), "%s/model.safetensors", r.dir);
    assert_int_equal(kiln_safetensors_open(&f, path, &e), 0);
    // wte: V rows (not Vp = 16), equal to kiln's first V rows
    const struct kiln_st_tensor *wte = must_find(f, "transformer.wte.weight", V, C);
    assert_memory_equal(wte->data, r.orig + r.pt.p[r.pt.wte].offset, (size_t)V * C * sizeof(float));
    assert_null(kiln_safetensors_find(f, "lm_head.weight")); // tied: HF re-ties on load
    must_find(f, "transformer.wpe.weight", 8, C);
    // Conv1D (in, out): c_attn is (C, 3C), element [i][o] = kiln's nn.Linear weight [o][i]
    const char *names[] = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                           "mlp.c_proj.weight"};
    const int kidx[] = {KILN_QKV_W, KILN_ATTNO_W, KILN_FC_W, KILN_MLPO_W};
    const int in_dim[] = {C, C, C, 4 * C}, out_dim[] = {3 * C, C, 4 * C, C};
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 4; k++) {
            char n[96];
            snprintf(n, sizeof(n), "transformer.h.%d.%s", l, names[k]);
            const struct kiln_st_tensor *t = must_find(f, n, in_dim[k], out_dim[k]);
            const float *hf = t->data, *kw = r.orig + r.pt.p[r.pt.layer[l][kidx[k]]].offset;
            for (int i = 0; i < in_dim[k]; i++)
                for (int o = 0; o < out_dim[k]; o++)
                    if (hf[i * out_dim[k] + o] != kw[o * in_dim[k] + i])
                        fail_msg("%s[%d][%d] is not kiln's [%d][%d]", n, i, o, o, i);
        }
    must_find(f, "transformer.h.1.attn.c_attn.bias", 3 * C, 0);
    must_find(f, "transformer.ln_f.bias", C, 0);
    assert_int_equal(kiln_safetensors_count(f), 2 + 2 * 12 + 2);
    kiln_safetensors_close(f);
    cJSON *j = read_config_json(r.dir);
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "architectures"), 0)->valuestring,
                        "GPT2LMHeadModel");
    assert_int_equal(cJSON_GetObjectItem(j, "vocab_size")->valueint, V);
    assert_int_equal(cJSON_GetObjectItem(j, "n_embd")->valueint, C);
    assert_int_equal(cJSON_GetObjectItem(j, "n_inner")->valueint, 4 * C);
    assert_string_equal(cJSON_GetObjectItem(j, "activation_function")->valuestring, "gelu_new");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "tie_word_embeddings")));
    cJSON_Delete(j);
    roundtrip_free(&r);
}

static void test_llama_export_splits_qkv_and_gate_up_rows(void **state) {
    struct kiln_config c;
    llama(&c);
    struct roundtrip r;
    roundtrip(&r, &c, 1, 0);
    int C = 16, HS = 4, NH = 4, NKV = 2, H = 24;
    struct kiln_error e;
    struct kiln_safetensors *f;
    char path[400];
    snprintf(path, sizeof(path), "%s/model.safetensors", r.dir);
    assert_int_equal(kiln_safetensors_open(&f, path, &e), 0);
    const float *qkv = r.orig + r.pt.p[r.pt.layer[1][KILN_QKV_W]].offset;
    const float *fc = r.orig + r.pt.p[r.pt.layer[1][KILN_FC_W]].offset;
    // rows [q: NH*HS | k: NKV*HS | v: NKV*HS] of kiln's (QKV, C) matrix, no permutation (rotate_half RoPE)
    const struct kiln_st_tensor *q = must_find(f, "model.layers.1.self_attn.q_proj.weight", NH * HS, C);
    const struct kiln_st_tensor *k = must_find(f, "model.layers.1.self_attn.k_proj.weight", NKV * HS, C);
    const struct kiln_st_tensor *v = must_find(f, "model.layers.1.self_attn.v_proj.weight", NKV * HS, C);
    assert_memory_equal(q->data, qkv, (size_t)NH * HS * C * 4);
    assert_memory_equal(k->data, qkv + NH * HS * C, (size_t)NKV * HS * C * 4);
    assert_memory_equal(v->data, qkv + (NH + NKV) * HS * C, (size_t)NKV * HS * C * 4);
    // [gate | up]: silu(gate) * up
    assert_memory_equal(must_find(f, "model.layers.1.mlp.gate_proj.weight", H, C)->data, fc,
                        (size_t)H * C * 4);
    assert_memory_equal(must_find(f, "model.layers.1.mlp.up_proj.weight", H, C)->data, fc + H * C,
                        (size_t)H * C * 4);
    must_find(f, "model.layers.1.mlp.down_proj.weight", C, H);
    must_find(f, "model.layers.0.input_layernorm.weight", C, 0);
    must_find(f, "model.layers.0.post_attention_layernorm.weight", C, 0);
    must_find(f, "model.norm.weight", C, 0);
    must_find(f, "lm_head.weight", 11, C);
    must_find(f, "model.embed_tokens.weight", 11, C);
    assert_int_equal(kiln_safetensors_count(f), 1 + 2 * 9 + 2);
    kiln_safetensors_close(f);
    cJSON *j = read_config_json(r.dir);
    assert_int_equal(cJSON_GetObjectItem(j, "num_key_value_heads")->valueint, NKV);
    assert_int_equal(cJSON_GetObjectItem(j, "intermediate_size")->valueint, H);
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "rope_parameters"), "rope_theta")->valuedouble ==
                5000.0);
    cJSON_Delete(j);
    roundtrip_free(&r);
}

// ---- refusals ----

static void expect_refusal(const struct kiln_model_config *m, const char *option) {
    enum kiln_hf_arch a;
    struct kiln_error e = {0};
    assert_int_equal(kiln_hf_arch_of(m, &a, &e), KILN_ERR_USAGE);
    if (!strstr(e.msg, option))
        fail_msg("refusal does not name %s: %s", option, e.msg);
    assert_null(strchr(e.msg, '\n'));
    // kiln_hf_export refuses the same way, writing nothing
    char dir[256];
    test_tmpdir(dir, sizeof(dir));
    struct kiln_run_tokenizer tok = char_tok(m->vocab_size);
    struct kiln_hf_export_opts o = {0};
    struct kiln_param_table pt;
    kiln_params_build(&pt, m);
    float *p = calloc(pt.total, sizeof(float));
    assert_int_equal(kiln_hf_export(dir, m, &tok, p, &o, &e), KILN_ERR_USAGE);
    char path[400];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    free(p);
    kiln_params_free(&pt);
    test_rmrf(dir);
}

static void test_unsupported_combinations_are_refused_naming_the_option(void **state) {
    struct kiln_config c;
    tiny(&c);
    c.model.pos = KILN_POS_ALIBI;
    expect_refusal(&c.model, "--pos=alibi");
    c.model.pos = KILN_POS_NONE;
    expect_refusal(&c.model, "--pos=none");
    tiny(&c);
    c.model.parallel_block = 1;
    expect_refusal(&c.model, "--block=parallel");
    tiny(&c);
    c.model.n_kv_head = 2;
    expect_refusal(&c.model, "--kv-heads=2");
    tiny(&c);
    c.model.mlp_swiglu = 1;
    expect_refusal(&c.model, "--mlp=swiglu");
    tiny(&c);
    c.model.norm_rms = 1;
    expect_refusal(&c.model, "--norm=rmsnorm");
    tiny(&c);
    c.model.bias = 0;
    expect_refusal(&c.model, "--bias=0");
    tiny(&c);
    c.model.norm_bias = 0;
    expect_refusal(&c.model, "--norm-bias=0");
    tiny(&c);
    c.model.qk_norm = 1;
    expect_refusal(&c.model, "--qk-norm");
    llama(&c);
    c.model.mlp_swiglu = 0;
    expect_refusal(&c.model, "--mlp=gelu");
    olmo(&c);
    c.model.norm_bias = 1;
    expect_refusal(&c.model, "--norm-bias=1");
    olmo(&c);
    c.model.bias = 1;
    expect_refusal(&c.model, "--bias=1");
    olmo(&c);
    c.model.norm_eps = 1e-6f;
    expect_refusal(&c.model, "--norm-eps");
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[400];
    struct kiln_error e;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    assert_int_equal(kiln_write_file_atomic(path, text, strlen(text), &e), 0);
}

static void expect_import_refusal(const char *config_json, const char *what) {
    char dir[256];
    test_tmpdir(dir, sizeof(dir));
    write_text(dir, "config.json", config_json);
    struct kiln_config c;
    struct kiln_run_tokenizer tok;
    struct kiln_error e = {0};
    assert_int_equal(kiln_config_init(&c, NULL, &e), 0);
    assert_int_equal(kiln_hf_import_config(dir, &c, &tok, &e), KILN_ERR_USAGE);
    if (!strstr(e.msg, what))
        fail_msg("import refusal does not say %s: %s", what, e.msg);
    test_rmrf(dir);
}

static void test_import_refuses_what_kiln_cannot_represent(void **state) {
    const char *llama3 =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":50257,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"hidden_size\":16,\"intermediate_size\":24,"
        "\"max_position_embeddings\":8,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}";
    expect_import_refusal(llama3, "rope_type llama3");
    expect_import_refusal("{\"architectures\":[\"MistralForCausalLM\"],\"vocab_size\":50257}",
                          "architecture MistralForCausalLM");
    const char *vocab =
        "{\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":32000,\"n_layer\":2,\"n_head\":4,"
        "\"n_embd\":16,\"n_positions\":8}";
    expect_import_refusal(vocab, "vocab_size 32000");
    const char *clip =
        "{\"architectures\":[\"OlmoForCausalLM\"],\"vocab_size\":50257,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"hidden_size\":16,\"intermediate_size\":24,"
        "\"max_position_embeddings\":8,\"clip_qkv\":8}";
    expect_import_refusal(clip, "clip_qkv");
    const char *gelu =
        "{\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":50257,\"n_layer\":2,\"n_head\":4,"
        "\"n_embd\":16,\"n_positions\":8,\"activation_function\":\"relu\"}";
    expect_import_refusal(gelu, "activation_function relu");
}

// A GPT-2 file as transformers' original checkpoints hold it (no "transformer." prefix, attn.bias buffers).
static void test_import_reads_unprefixed_gpt2_names_and_rejects_a_missing_tensor(void **state) {
    struct kiln_config c;
    tiny(&c);
    c.model.vocab_size = 50257; // gpt2, no kiln.json needed
    c.model.vocab_multiple = 128;
    c.model.n_layer = 1;
    struct kiln_param_table pt;
    kiln_params_build(&pt, &c.model);
    uint64_t s = test_seed();
    float *p = random_params(&c.model, &pt, 1, &s);
    char dir[256];
    test_tmpdir(dir, sizeof(dir));
    struct kiln_run_tokenizer tok = {.name = "gpt2"};
    struct kiln_hf_export_opts o = {0};
    struct kiln_error e;
    assert_int_equal(kiln_hf_export(dir, &c.model, &tok, p, &o, &e), 0);
    char path[400];
    snprintf(path, sizeof(path), "%s/kiln.json", dir);
    unlink(path);
    // rewrite the weights without the prefix, plus a causal-mask buffer, as an old GPT-2 checkpoint
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    struct kiln_safetensors *f;
    assert_int_equal(kiln_safetensors_open(&f, path, &e), 0);
    int n = kiln_safetensors_count(f);
    struct kiln_st_tensor *t = calloc((size_t)n + 1, sizeof(*t));
    char(*names)[128] = calloc((size_t)n, 128);
    for (int i = 0; i < n; i++) {
        t[i] = *kiln_safetensors_at(f, i);
        snprintf(names[i], 128, "%s", t[i].name + (strncmp(t[i].name, "transformer.", 12) ? 0 : 12));
        t[i].name = names[i];
    }
    float mask[64] = {0};
    t[n] = (struct kiln_st_tensor){
        .name = "h.0.attn.bias", .dtype = KILN_ST_F32, .ndim = 2, .shape = {8, 8}, .data = mask};
    char path2[400];
    snprintf(path2, sizeof(path2), "%s/model2.safetensors", dir);
    assert_int_equal(kiln_safetensors_write(path2, t, n + 1, NULL, &e), 0);
    kiln_safetensors_close(f);
    assert_int_equal(rename(path2, path), 0);
    struct kiln_config back;
    struct kiln_run_tokenizer tok2;
    assert_int_equal(kiln_config_init(&back, NULL, &e), 0);
    if (kiln_hf_import_config(dir, &back, &tok2, &e))
        fail_msg("import config: %s", e.msg);
    assert_string_equal(tok2.name, "gpt2");
    assert_string_equal(back.tokenizer, "gpt2");
    float *q = calloc(pt.total, sizeof(float));
    if (kiln_hf_import_weights(dir, &back.model, q, &e))
        fail_msg("import weights: %s", e.msg);
    assert_memory_equal(q, p, pt.total * sizeof(float));
    // drop one tensor: the import names it
    assert_int_equal(kiln_safetensors_write(path2, t + 1, n, NULL, &e), 0);
    assert_int_equal(rename(path2, path), 0);
    assert_int_equal(kiln_hf_import_weights(dir, &back.model, q, &e), KILN_ERR_USAGE);
    if (!strstr(e.msg, "tensor transformer.wte.weight missing"))
        fail_msg("missing-tensor message: %s", e.msg);
    free(t);
    free(names);
    free(p);
    free(q);
    kiln_params_free(&pt);
    test_rmrf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_roundtrip_is_identical),
        cmocka_unit_test(test_llama_roundtrip_is_identical),
        cmocka_unit_test(test_olmo_roundtrip_is_identical_with_unit_norm_weights),
        cmocka_unit_test(test_olmo_export_folds_norm_weights_exactly),
        cmocka_unit_test(test_bf16_export_rounds_to_within_bf16_precision),
        cmocka_unit_test(test_gpt2_export_transposes_conv1d_weights_and_drops_vocab_padding),
        cmocka_unit_test(test_llama_export_splits_qkv_and_gate_up_rows),
        cmocka_unit_test(test_unsupported_combinations_are_refused_naming_the_option),
        cmocka_unit_test(test_import_refuses_what_kiln_cannot_represent),
        cmocka_unit_test(test_import_reads_unprefixed_gpt2_names_and_rejects_a_missing_tensor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
