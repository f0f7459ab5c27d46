// Hugging Face interop. See hf.h.
#include "interop/hf.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/fsutil.h"
#include "io/safetensors.h"
#include "model/params.h"

static const char *ARCH_NAMES[] = {"GPT2LMHeadModel", "LlamaForCausalLM", "OlmoForCausalLM"};
static const char *MODEL_TYPES[] = {"gpt2", "llama", "olmo"};

const char *kiln_hf_arch_name(enum kiln_hf_arch a) {
    return ARCH_NAMES[a];
}

// ----------------------------------------------------------------------------
// which architecture

#define REFUSE(...) kiln_errorf(err, KILN_ERR_USAGE, __VA_ARGS__)

int kiln_hf_arch_of(const struct kiln_model_config *m, enum kiln_hf_arch *arch, struct kiln_error *err) {
    const char *pre = "cannot export to Hugging Face (--format=hf)";
    if (m->pos == KILN_POS_ALIBI)
        return REFUSE(
            "%s: --pos=alibi has no equivalent in GPT2LMHeadModel, LlamaForCausalLM or OlmoForCausalLM; "
            "train with --pos=rope or --pos=learned to export",
            pre);
    if (m->pos == KILN_POS_NONE)
        return REFUSE(
            "%s: --pos=none has no equivalent in GPT2LMHeadModel, LlamaForCausalLM or OlmoForCausalLM; "
            "train with --pos=rope or --pos=learned to export",
            pre);
    if (m->parallel_block)
        return REFUSE("%s: --block=parallel has no equivalent in GPT2LMHeadModel, LlamaForCausalLM or "
                      "OlmoForCausalLM (all sequential); train with --block=sequential to export",
                      pre);
    if (m->qk_norm)
        return REFUSE(
            "%s: --qk-norm has no equivalent in GPT2LMHeadModel, LlamaForCausalLM or OlmoForCausalLM; "
            "train without it to export",
            pre);
    if (m->pos == KILN_POS_LEARNED) {
        const char *a = "GPT2LMHeadModel (the architecture of --pos=learned)";
        if (m->norm_rms)
            return REFUSE("%s: --norm=rmsnorm has no equivalent in %s; use --norm=layernorm", pre, a);
        if (!m->norm_bias)
            return REFUSE("%s: --norm-bias=0 has no equivalent in %s; use --norm-bias=1", pre, a);
        if (!m->bias)
            return REFUSE("%s: --bias=0 has no equivalent in %s; use --bias=1", pre, a);
        if (m->mlp_swiglu)
            return REFUSE("%s: --mlp=swiglu has no equivalent in %s; use --mlp=gelu, or --pos=rope for Llama",
                          pre, a);
        if (kiln_model_kv_heads(m) != m->n_head)
            return REFUSE(
                "%s: --kv-heads=%d has no equivalent in %s (no GQA); use --kv-heads=0, or --pos=rope for "
                "Llama",
                pre, m->n_kv_head, a);
        *arch = KILN_HF_GPT2;
        return 0;
    }
    // RoPE: Llama (RMSNorm) or OLMo-1 (LayerNorm without bias)
    if (!m->mlp_swiglu)
        return REFUSE(
            "%s: --mlp=gelu with --pos=rope has no equivalent in LlamaForCausalLM or OlmoForCausalLM "
            "(SwiGLU); use --mlp=swiglu",
            pre);
    if (m->norm_rms) {
        *arch = KILN_HF_LLAMA;
        return 0;
    }
    const char *a = "OlmoForCausalLM (the architecture of --pos=rope --norm=layernorm)";
    if (m->norm_bias)
        return REFUSE(
            "%s: --norm-bias=1 has no equivalent in %s; use --norm-bias=0, or --norm=rmsnorm for Llama", pre,
            a);
    if (m->bias)
        return REFUSE("%s: --bias=1 has no equivalent in %s (its MLP has no biases); use --bias=0, or "
                      "--norm=rmsnorm for Llama",
                      pre, a);
    if (fabsf(m->norm_eps - 1e-5f) > 1e-12f)
        return REFUSE("%s: --norm-eps=%g has no equivalent in %s (fixed at 1e-5); use --norm-eps=1e-5", pre,
                      (double)m->norm_eps, a);
    *arch = KILN_HF_OLMO;
    return 0;
}

// ----------------------------------------------------------------------------
// the tensor map: each HF tensor as a view of a kiln tensor

struct hf_map {
    char name[112];
    int ndim;
    int64_t shape[2]; // the HF shape
    int src;          // kiln parameter index
    int64_t row0;     // first row (2-D) or element (1-D) of src
    int transpose;    // HF holds the transpose of src (GPT-2's Conv1D)
    int fold;         // kiln norm-weight index whose values scale the columns (OLMo export), or -1
};

struct map_list {
    struct hf_map *e;
    int n, cap;
};

static struct hf_map *map_add(struct map_list *l, const char *name, int src, int64_t row0, int64_t d0,
                              int64_t d1) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        struct hf_map *e = kiln_xcalloc((size_t)l->cap, sizeof(*e));
        if (l->e)
            memcpy(e, l->e, (size_t)l->n * sizeof(*e));
        free(l->e);
        l->e = e;
    }
    struct hf_map *e = &l->e[l->n++];
    memset(e, 0, sizeof(*e));
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->src = src;
    e->row0 = row0;
    e->ndim = d1 ? 2 : 1;
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->fold = -1;
    return e;
}

// GPT-2: Conv1D weights (in, out) are the transposes of kiln's (out, in).
static void map_gpt2(struct map_list *l, const struct kiln_param_table *pt, const struct kiln_model_config *m,
                     int head_untied) {
    int V = m->vocab_size, C = m->n_embd;
    char n[112];
    map_add(l, "transformer.wte.weight", pt->wte, 0, V, C);
    map_add(l, "transformer.wpe.weight", pt->wpe, 0, m->block_size, C);
    for (int i = 0; i < m->n_layer; i++) {
        const int *ix = pt->layer[i];
        static const struct {
            int t;
            const char *s;
        } T[] = {{KILN_LN1_W, "ln_1.weight"},          {KILN_LN1_B, "ln_1.bias"},
                 {KILN_QKV_W, "attn.c_attn.weight"},   {KILN_QKV_B, "attn.c_attn.bias"},
                 {KILN_ATTNO_W, "attn.c_proj.weight"}, {KILN_ATTNO_B, "attn.c_proj.bias"},
                 {KILN_LN2_W, "ln_2.weight"},          {KILN_LN2_B, "ln_2.bias"},
                 {KILN_FC_W, "mlp.c_fc.weight"},       {KILN_FC_B, "mlp.c_fc.bias"},
                 {KILN_MLPO_W, "mlp.c_proj.weight"},   {KILN_MLPO_B, "mlp.c_proj.bias"}};
        for (size_t k = 0; k < sizeof(T) / sizeof(T[0]); k++) {
            const struct kiln_param *p = &pt->p[ix[T[k].t]];
            snprintf(n, sizeof(n), "transformer.h.%d.%s", i, T[k].s);
            if (p->ndim == 2)
                map_add(l, n, ix[T[k].t], 0, p->shape[1], p->shape[0])->transpose = 1;
            else
                map_add(l, n, ix[T[k].t], 0, p->shape[0], 0);
        }
    }
    map_add(l, "transformer.ln_f.weight", pt->lnf_w, 0, C, 0);
    map_add(l, "transformer.ln_f.bias", pt->lnf_b, 0, C, 0);
    if (head_untied)
        map_add(l, "lm_head.weight", pt->lm_head, 0, V, C);
}

// Llama and OLMo: split the fused [q | k | v] and [gate | up]; OLMo folds the norm weights (fold = 1).
static void map_llama(struct map_list *l, const struct kiln_param_table *pt,
                      const struct kiln_model_config *m, int fold, int head_untied) {
    int V = m->vocab_size, C = m->n_embd, HS = kiln_model_head_size(m), NH = m->n_head;
    int NKV = kiln_model_kv_heads(m), H = kiln_model_mlp_hidden(m);
    char n[112];
    map_add(l, "model.embed_tokens.weight", pt->wte, 0, V, C);
    for (int i = 0; i < m->n_layer; i++) {
        const int *ix = pt->layer[i];
        int ln1 = fold ? ix[KILN_LN1_W] : -1, ln2 = fold ? ix[KILN_LN2_W] : -1;
#define N(s) (snprintf(n, sizeof(n), "model.layers.%d.%s", i, s), n)
        if (!fold)
            map_add(l, N("input_layernorm.weight"), ix[KILN_LN1_W], 0, C, 0);
        map_add(l, N("self_attn.q_proj.weight"), ix[KILN_QKV_W], 0, (int64_t)NH * HS, C)->fold = ln1;
        map_add(l, N("self_attn.k_proj.weight"), ix[KILN_QKV_W], (int64_t)NH * HS, (int64_t)NKV * HS, C)
            ->fold = ln1;
        map_add(l, N("self_attn.v_proj.weight"), ix[KILN_QKV_W], (int64_t)(NH + NKV) * HS, (int64_t)NKV * HS,
                C)
            ->fold = ln1;
        if (m->bias) {
            map_add(l, N("self_attn.q_proj.bias"), ix[KILN_QKV_B], 0, (int64_t)NH * HS, 0);
            map_add(l, N("self_attn.k_proj.bias"), ix[KILN_QKV_B], (int64_t)NH * HS, (int64_t)NKV * HS, 0);
            map_add(l, N("self_attn.v_proj.bias"), ix[KILN_QKV_B], (int64_t)(NH + NKV) * HS,
                    (int64_t)NKV * HS, 0);
        }
        map_add(l, N("self_attn.o_proj.weight"), ix[KILN_ATTNO_W], 0, C, (int64_t)NH * HS);
        if (m->bias)
            map_add(l, N("self_attn.o_proj.bias"), ix[KILN_ATTNO_B], 0, C, 0);
        if (!fold)
            map_add(l, N("post_attention_layernorm.weight"), ix[KILN_LN2_W], 0, C, 0);
        map_add(l, N("mlp.gate_proj.weight"), ix[KILN_FC_W], 0, H, C)->fold = ln2;
        map_add(l, N("mlp.up_proj.weight"), ix[KILN_FC_W], H, H, C)->fold = ln2;
        map_add(l, N("mlp.down_proj.weight"), ix[KILN_MLPO_W], 0, C, H);
        if (m->bias) {
            map_add(l, N("mlp.gate_proj.bias"), ix[KILN_FC_B], 0, H, 0);
            map_add(l, N("mlp.up_proj.bias"), ix[KILN_FC_B], H, H, 0);
            map_add(l, N("mlp.down_proj.bias"), ix[KILN_MLPO_B], 0, C, 0);
        }
#undef N
    }
    if (!fold)
        map_add(l, "model.norm.weight", pt->lnf_w, 0, C, 0);
    if (head_untied)
        map_add(l, "lm_head.weight", m->tie_embeddings ? pt->wte : pt->lm_head, 0, V, C)->fold =
            fold ? pt->lnf_w : -1;
}

static void map_build(struct map_list *l, enum kiln_hf_arch arch, const struct kiln_param_table *pt,
                      const struct kiln_model_config *m, int head_untied) {
    memset(l, 0, sizeof(*l));
    if (arch == KILN_HF_GPT2)
        map_gpt2(l, pt, m, head_untied);
    else
        map_llama(l, pt, m, arch == KILN_HF_OLMO, head_untied);
}

// ----------------------------------------------------------------------------
// dtype conversion

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);         // round to nearest even
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float f16_to_f32(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, mant = h & 1023;
    float v;
    if (e == 0)
        v = ldexpf((float)mant, -24);
    else if (e == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexpf((float)(mant | 1024), e - 25);
    return s ? -v : v;
}

// element i of a safetensors tensor of dtype F32, BF16 or F16, as f32
static float st_get(const struct kiln_st_tensor *t, int64_t i) {
    const unsigned char *p = t->data;
    if (t->dtype == KILN_ST_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->dtype == KILN_ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// ----------------------------------------------------------------------------
// export

static int any_not_one(const float *w, int n) {
    for (int i = 0; i < n; i++)
        if (w[i] != 1.0f)
            return 1;
    return 0;
}

// cJSON prints doubles exactly; a float such as 1e-5f would print as 9.99999974737875e-06. Round to the
// float's shortest decimal form first.
static double clean(float f) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%.7g", (double)f);
    return strtod(buf, NULL);
}

static cJSON *hf_config_json(enum kiln_hf_arch arch, const struct kiln_model_config *m, int tie, int bf16) {
    cJSON *j = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(ARCH_NAMES[arch]));
    cJSON_AddStringToObject(j, "model_type", MODEL_TYPES[arch]);
    cJSON_AddNumberToObject(j, "vocab_size", m->vocab_size);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", tie);
    cJSON_AddStringToObject(j, "dtype", bf16 ? "bfloat16" : "float32");
    cJSON_AddStringToObject(j, "torch_dtype", bf16 ? "bfloat16" : "float32");
    if (m->vocab_size == 50257) { // GPT-2's <|endoftext|>
        cJSON_AddNumberToObject(j, "bos_token_id", 50256);
        cJSON_AddNumberToObject(j, "eos_token_id", 50256);
    } else {
        cJSON_AddNullToObject(j, "bos_token_id");
        cJSON_AddNullToObject(j, "eos_token_id");
    }
    cJSON_AddNullToObject(j, "pad_token_id");
    if (arch == KILN_HF_GPT2) {
        cJSON_AddNumberToObject(j, "n_layer", m->n_layer);
        cJSON_AddNumberToObject(j, "n_head", m->n_head);
        cJSON_AddNumberToObject(j, "n_embd", m->n_embd);
        cJSON_AddNumberToObject(j, "n_positions", m->block_size);
        cJSON_AddNumberToObject(j, "n_ctx", m->block_size);
        cJSON_AddNumberToObject(j, "n_inner", kiln_model_mlp_hidden(m));
        cJSON_AddStringToObject(j, "activation_function", "gelu_new"); // the tanh approximation, as kiln's
        cJSON_AddNumberToObject(j, "layer_norm_epsilon", clean(m->norm_eps));
        cJSON_AddBoolToObject(j, "scale_attn_weights", 1);
        cJSON_AddBoolToObject(j, "scale_attn_by_inverse_layer_idx", 0);
        cJSON_AddBoolToObject(j, "reorder_and_upcast_attn", 0);
        cJSON_AddNumberToObject(j, "resid_pdrop", 0);
        cJSON_AddNumberToObject(j, "embd_pdrop", 0);
        cJSON_AddNumberToObject(j, "attn_pdrop", 0);
        cJSON_AddNumberToObject(j, "initializer_range", 0.02);
        return j;
    }
    cJSON_AddNumberToObject(j, "num_hidden_layers", m->n_layer);
    cJSON_AddNumberToObject(j, "num_attention_heads", m->n_head);
    cJSON_AddNumberToObject(j, "num_key_value_heads", kiln_model_kv_heads(m));
    cJSON_AddNumberToObject(j, "hidden_size", m->n_embd);
    cJSON_AddNumberToObject(j, "head_dim", kiln_model_head_size(m));
    cJSON_AddNumberToObject(j, "intermediate_size", kiln_model_mlp_hidden(m));
    cJSON_AddNumberToObject(j, "max_position_embeddings", m->block_size);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddBoolToObject(j, "attention_bias", m->bias);
    cJSON_AddNumberToObject(j, "attention_dropout", 0);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    // transformers 5 reads rope_parameters; 4.x reads rope_theta. Both say the same.
    cJSON_AddNumberToObject(j, "rope_theta", clean(m->rope_theta));
    cJSON *rp = cJSON_AddObjectToObject(j, "rope_parameters");
    cJSON_AddStringToObject(rp, "rope_type", "default");
    cJSON_AddNumberToObject(rp, "rope_theta", clean(m->rope_theta));
    if (arch == KILN_HF_LLAMA) {
        cJSON_AddBoolToObject(j, "mlp_bias", m->bias);
        cJSON_AddNumberToObject(j, "rms_norm_eps", clean(m->norm_eps));
        cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    } else {
        cJSON_AddNullToObject(j, "clip_qkv");
    }
    return j;
}

static cJSON *kiln_json(const struct kiln_model_config *m, const struct kiln_run_tokenizer *tok) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "producer", "kiln");
    cJSON_AddStringToObject(j, "tokenizer", tok->name);
    cJSON_AddNumberToObject(j, "vocab_multiple", m->vocab_multiple);
    if (!strcmp(tok->name, "char")) {
        cJSON *a = cJSON_AddArrayToObject(j, "char_vocab"); // bytes, id order
        for (int i = 0; i < tok->n_chars; i++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)tok->chars[i]));
    }
    return j;
}

static int write_json(const char *dir, const char *name, cJSON *j, struct kiln_error *err) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write %s: out of memory", path);
    size_t n = strlen(text);
    text[n] = '\n'; // replaces the NUL; the length passed below includes the newline
    int rc = kiln_write_file_atomic(path, text, n + 1, err);
    free(text);
    return rc;
}

int kiln_hf_export(const char *dir, const struct kiln_model_config *m, const struct kiln_run_tokenizer *tok,
                   const float *params, const struct kiln_hf_export_opts *o, struct kiln_error *err) {
    enum kiln_hf_arch arch;
    int rc = kiln_hf_arch_of(m, &arch, err);
    if (rc)
        return rc;
    KILN_ASSERT(m->vocab_size > 0);
    struct kiln_param_table pt;
    kiln_params_build(&pt, m);
    // A tied OLMo model whose final norm weight is not 1 cannot fold it into a shared matrix: untie it.
    int tie = m->tie_embeddings;
    if (arch == KILN_HF_OLMO && tie && any_not_one(params + pt.p[pt.lnf_w].offset, m->n_embd))
        tie = 0;
    struct map_list l;
    map_build(&l, arch, &pt, m, !tie);

    struct kiln_st_tensor *t = kiln_xcalloc((size_t)l.n, sizeof(*t));
    void **owned = kiln_xcalloc((size_t)l.n, sizeof(void *));
    for (int i = 0; i < l.n; i++) {
        const struct hf_map *e = &l.e[i];
        const struct kiln_param *p = &pt.p[e->src];
        int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
        const float *src = params + p->offset + e->row0 * cols;
        int64_t n = e->shape[0] * (e->ndim == 2 ? e->shape[1] : 1);
        t[i].name = e->name;
        t[i].ndim = e->ndim;
        t[i].shape[0] = e->shape[0];
        t[i].shape[1] = e->shape[1];
        t[i].dtype = o->bf16 ? KILN_ST_BF16 : KILN_ST_F32;
        const float *data = src;
        float *tmp = NULL;
        if (e->transpose) {
            // HF (in, out)[r][c] = kiln (out, in)[c][r]
            tmp = kiln_xmalloc((size_t)n * sizeof(float));
            for (int64_t r = 0; r < e->shape[0]; r++)
                for (int64_t c = 0; c < e->shape[1]; c++)
                    tmp[r * e->shape[1] + c] = src[c * e->shape[0] + r];
            data = tmp;
        } else if (e->fold >= 0) {
            // W diag(w): column c scaled by the norm weight w[c]
            const float *w = params + pt.p[e->fold].offset;
            tmp = kiln_xmalloc((size_t)n * sizeof(float));
            for (int64_t r = 0; r < e->shape[0]; r++)
                for (int64_t c = 0; c < e->shape[1]; c++)
                    tmp[r * e->shape[1] + c] = src[r * e->shape[1] + c] * w[c];
            data = tmp;
        }
        if (o->bf16) {
            uint16_t *h = kiln_xmalloc((size_t)n * sizeof(uint16_t));
            for (int64_t k = 0; k < n; k++)
                h[k] = f32_to_bf16(data[k]);
            free(tmp);
            owned[i] = h;
            t[i].data = h;
        } else {
            owned[i] = tmp;
            t[i].data = data;
        }
    }
    rc = kiln_mkdir_p(dir, err);
    char path[1200];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    const char *meta[] = {"format", "pt", "producer", "kiln", NULL};
    if (!rc)
        rc = kiln_safetensors_write(path, t, l.n, meta, err);
    if (!rc)
        rc = write_json(dir, "config.json", hf_config_json(arch, m, tie, o->bf16), err);
    if (!rc)
        rc = write_json(dir, "kiln.json", kiln_json(m, tok), err);
    for (int i = 0; i < l.n; i++)
        free(owned[i]);
    free(owned);
    free(t);
    free(l.e);
    kiln_params_free(&pt);
    return rc;
}

// ----------------------------------------------------------------------------
// import: config.json

struct jctx {
    const cJSON *j;
    const char *path;
    struct kiln_error *err;
};

// An integer key; required unless def is given (has_def).
static int jint(const struct jctx *c, const char *key, int has_def, int def, int lo, int hi, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->j, key);
    if (!v || cJSON_IsNull(v)) {
        if (has_def) {
            *out = def;
            return 0;
        }
        return kiln_errorf(c->err, KILN_ERR_USAGE, "%s missing (%s): a Hugging Face config.json names it",
                           key, c->path);
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return kiln_errorf(c->err, KILN_ERR_USAGE, "%s is not an integer from %d to %d (%s)", key, lo, hi,
                           c->path);
    *out = (int)v->valuedouble;
    return 0;
}

static int jnum(const struct jctx *c, const char *key, double def, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->j, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0))
        return kiln_errorf(c->err, KILN_ERR_USAGE, "%s is not a positive number (%s)", key, c->path);
    *out = v->valuedouble;
    return 0;
}

static int jbool(const struct jctx *c, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->j, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

static const char *jstr(const struct jctx *c, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->j, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int read_json(const char *path, cJSON **out, struct kiln_error *err) {
    char *text;
    size_t n;
    int rc = kiln_read_file(path, &text, &n, err);
    if (rc)
        return rc;
    *out = cJSON_ParseWithLength(text, n);
    free(text);
    if (!*out || !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "%s is not a JSON object: is this a Hugging Face model directory?", path);
    }
    return 0;
}

static int import_arch(const struct jctx *c, enum kiln_hf_arch *arch) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(c->j, "architectures");
    const char *name = cJSON_IsArray(a) && cJSON_IsString(cJSON_GetArrayItem(a, 0))
                           ? cJSON_GetArrayItem(a, 0)->valuestring
                           : NULL;
    const char *type = jstr(c, "model_type");
    for (int i = 0; i < 3; i++)
        if ((name && !strcmp(name, ARCH_NAMES[i])) || (!name && type && !strcmp(type, MODEL_TYPES[i]))) {
            *arch = (enum kiln_hf_arch)i;
            return 0;
        }
    return kiln_errorf(c->err, KILN_ERR_USAGE,
                       "architecture %s (%s): kiln imports GPT2LMHeadModel, LlamaForCausalLM "
                       "and OlmoForCausalLM",
                       name   ? name
                       : type ? type
                              : "(none given)",
                       c->path);
}

// RoPE theta from rope_parameters (transformers 5) or rope_theta (4.x); scaled RoPE variants are refused.
static int import_rope(const struct jctx *c, struct kiln_model_config *m) {
    double theta = 10000.0;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c->j, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c->j, "rope_scaling");
    const cJSON *spec = cJSON_IsObject(rp) ? rp : cJSON_IsObject(rs) ? rs : NULL;
    if (spec) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(spec, "rope_type");
        if (!type)
            type = cJSON_GetObjectItemCaseSensitive(spec, "type");
        if (cJSON_IsString(type) && strcmp(type->valuestring, "default"))
            return kiln_errorf(c->err, KILN_ERR_USAGE,
                               "rope_type %s (%s): kiln's RoPE has no scaling; only "
                               "\"default\" imports",
                               type->valuestring, c->path);
    }
    const cJSON *t = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") : NULL;
    if (cJSON_IsNumber(t))
        theta = t->valuedouble;
    else if (jnum(c, "rope_theta", 10000.0, &theta))
        return KILN_ERR_USAGE;
    m->rope_theta = (float)theta;
    return 0;
}

static int import_tokenizer(const char *dir, struct kiln_config *cfg, struct kiln_run_tokenizer *tok,
                            struct kiln_error *err) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/kiln.json", dir);
    memset(tok, 0, sizeof(*tok));
    int V = cfg->model.vocab_size;
    FILE *f = fopen(path, "r");
    if (!f) {
        // not written by kiln export: only the GPT-2 tokenizer can be inferred, from the vocabulary size
        if (V != 50257)
            return kiln_errorf(
                err, KILN_ERR_USAGE,
                "no kiln.json in %s (kiln import): kiln export writes it to name the tokenizer; "
                "without it only GPT-2's can be assumed, and config.json has vocab_size %d, not "
                "50257; for a char model add %s/kiln.json: {\"tokenizer\": \"char\", "
                "\"char_vocab\": [the byte of each token id]}",
                dir, V, dir);
        fprintf(stderr, "kiln: no kiln.json in %s: vocab_size 50257, so the GPT-2 tokenizer\n", dir);
        snprintf(tok->name, sizeof(tok->name), "gpt2");
        snprintf(cfg->tokenizer, sizeof(cfg->tokenizer), "gpt2");
        return 0;
    }
    fclose(f);
    cJSON *j;
    int rc = read_json(path, &j, err);
    if (rc)
        return rc;
    struct jctx c = {j, path, err};
    const char *name = jstr(&c, "tokenizer");
    int vm = 128;
    rc = jint(&c, "vocab_multiple", 1, 128, 1, 4096, &vm);
    if (!rc && name && !strcmp(name, "gpt2") && V == 50257) {
        snprintf(tok->name, sizeof(tok->name), "gpt2");
    } else if (!rc && name && !strcmp(name, "char")) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "char_vocab");
        int n = cJSON_GetArraySize(a);
        if (!cJSON_IsArray(a) || n != V || n > 256) {
            rc = kiln_errorf(err, KILN_ERR_USAGE, "char_vocab (%s) must list vocab_size = %d bytes", path, V);
        } else {
            for (int i = 0; i < n; i++) {
                const cJSON *b = cJSON_GetArrayItem(a, i);
                if (!cJSON_IsNumber(b) || b->valuedouble < 0 || b->valuedouble > 255) {
                    rc = kiln_errorf(err, KILN_ERR_USAGE, "char_vocab[%d] (%s) is not a byte", i, path);
                    break;
                }
                tok->chars[i] = (char)(int)b->valuedouble;
            }
            tok->n_chars = n;
            snprintf(tok->name, sizeof(tok->name), "char");
        }
    } else if (!rc) {
        rc = kiln_errorf(err, KILN_ERR_USAGE,
                         "tokenizer %s with vocab_size %d (%s): kiln's tokenizers are gpt2 "
                         "(50257 tokens) and char",
                         name ? name : "(missing)", V, path);
    }
    cJSON_Delete(j);
    if (!rc) {
        snprintf(cfg->tokenizer, sizeof(cfg->tokenizer), "%s", tok->name);
        cfg->model.vocab_multiple = vm;
    }
    return rc;
}

int kiln_hf_import_config(const char *dir, struct kiln_config *cfg, struct kiln_run_tokenizer *tok,
                          struct kiln_error *err) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    cJSON *j;
    int rc = read_json(path, &j, err);
    if (rc)
        return rc;
    struct jctx c = {j, path, err};
    struct kiln_model_config *m = &cfg->model;
    enum kiln_hf_arch arch = KILN_HF_GPT2;
    int kv = 0, hidden = 0, head_dim = 0;
    double eps = 1e-5;
    m->qk_norm = 0;
    m->parallel_block = 0;
    m->n_kv_head = 0;
    if ((rc = import_arch(&c, &arch)) || (rc = jint(&c, "vocab_size", 0, 0, 1, 1 << 24, &m->vocab_size)))
        goto out;
    if (arch == KILN_HF_GPT2) {
        const char *act = jstr(&c, "activation_function");
        if ((rc = jint(&c, "n_layer", 0, 0, 1, 1024, &m->n_layer)) ||
            (rc = jint(&c, "n_head", 0, 0, 1, 1024, &m->n_head)) ||
            (rc = jint(&c, "n_embd", 0, 0, 8, 65536, &m->n_embd)) ||
            (rc = jint(&c, "n_positions", 0, 0, 1, 1 << 22, &m->block_size)) ||
            (rc = jint(&c, "n_inner", 1, 0, 0, 1 << 20, &hidden)) ||
            (rc = jnum(&c, "layer_norm_epsilon", 1e-5, &eps)))
            goto out;
        if (act && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh")) {
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "activation_function %s (%s): kiln's GELU is the tanh approximation "
                             "(gelu_new)",
                             act, path);
            goto out;
        }
        if (jbool(&c, "scale_attn_by_inverse_layer_idx", 0) || !jbool(&c, "scale_attn_weights", 1)) {
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "attention scaling (%s): kiln scales scores by 1/sqrt(head size) "
                             "only",
                             path);
            goto out;
        }
        m->pos = KILN_POS_LEARNED;
        m->norm_rms = 0;
        m->norm_bias = 1;
        m->bias = 1;
        m->mlp_swiglu = 0;
        m->mlp_hidden = hidden;
        m->tie_embeddings = jbool(&c, "tie_word_embeddings", 1);
    } else {
        const char *act = jstr(&c, "hidden_act");
        if ((rc = jint(&c, "num_hidden_layers", 0, 0, 1, 1024, &m->n_layer)) ||
            (rc = jint(&c, "num_attention_heads", 0, 0, 1, 1024, &m->n_head)) ||
            (rc = jint(&c, "num_key_value_heads", 1, m->n_head, 1, 1024, &kv)) ||
            (rc = jint(&c, "hidden_size", 0, 0, 8, 65536, &m->n_embd)) ||
            (rc = jint(&c, "intermediate_size", 0, 0, 1, 1 << 20, &m->mlp_hidden)) ||
            (rc = jint(&c, "max_position_embeddings", 0, 0, 1, 1 << 22, &m->block_size)) ||
            (rc = jint(&c, "head_dim", 1, 0, 0, 65536, &head_dim)) || (rc = import_rope(&c, m)))
            goto out;
        if (act && strcmp(act, "silu")) {
            rc = kiln_errorf(err, KILN_ERR_USAGE, "hidden_act %s (%s): kiln's SwiGLU uses silu", act, path);
            goto out;
        }
        if (head_dim && head_dim * m->n_head != m->n_embd) {
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "head_dim %d (%s): kiln's head size is hidden_size / "
                             "num_attention_heads = %d",
                             head_dim, path, m->n_embd / m->n_head);
            goto out;
        }
        m->n_kv_head = kv == m->n_head ? 0 : kv;
        m->pos = KILN_POS_ROPE;
        m->mlp_swiglu = 1;
        m->tie_embeddings = jbool(&c, "tie_word_embeddings", 0);
        int attn_bias = jbool(&c, "attention_bias", 0);
        if (arch == KILN_HF_LLAMA) {
            int mlp_bias = jbool(&c, "mlp_bias", 0);
            if (attn_bias != mlp_bias) {
                rc = kiln_errorf(err, KILN_ERR_USAGE,
                                 "attention_bias %d with mlp_bias %d (%s): kiln's --bias covers "
                                 "both; they must agree",
                                 attn_bias, mlp_bias, path);
                goto out;
            }
            if ((rc = jnum(&c, "rms_norm_eps", 1e-6, &eps)))
                goto out;
            m->norm_rms = 1; // (norm_bias has no meaning for RMSNorm: left as it is)
            m->bias = attn_bias;
        } else {
            const cJSON *clip = cJSON_GetObjectItemCaseSensitive(j, "clip_qkv");
            if (clip && !cJSON_IsNull(clip)) {
                rc = kiln_errorf(err, KILN_ERR_USAGE,
                                 "clip_qkv (%s): kiln does not clip q, k and v; only "
                                 "clip_qkv = null imports",
                                 path);
                goto out;
            }
            if (attn_bias) {
                rc = kiln_errorf(err, KILN_ERR_USAGE,
                                 "attention_bias true (%s): kiln's --bias=1 also gives the MLP "
                                 "biases that OLMo lacks",
                                 path);
                goto out;
            }
            m->norm_rms = 0;
            m->norm_bias = 0;
            m->bias = 0;
            eps = 1e-5; // OlmoLayerNorm's fixed epsilon
        }
    }
    m->norm_eps = (float)eps;
    rc = import_tokenizer(dir, cfg, tok, err);
    if (!rc && cfg->seq_len > m->block_size)
        cfg->seq_len = m->block_size;
    if (!rc)
        rc = kiln_config_validate(cfg, err);
out:
    cJSON_Delete(j);
    return rc;
}

// ----------------------------------------------------------------------------
// import: weights

// Tensors a Hugging Face file may hold that carry no parameters (buffers of older transformers versions).
static int ignorable(const char *name) {
    size_t n = strlen(name);
    static const char *suffixes[] = {".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"};
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        size_t k = strlen(suffixes[i]);
        if (n >= k && !strcmp(name + n - k, suffixes[i]))
            return 1;
    }
    return 0;
}

int kiln_hf_import_weights(const char *dir, const struct kiln_model_config *m, float *params,
                           struct kiln_error *err) {
    enum kiln_hf_arch arch;
    int rc = kiln_hf_arch_of(m, &arch, err);
    if (rc)
        return rc;
    char path[1200];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    struct kiln_safetensors *f;
    if ((rc = kiln_safetensors_open(&f, path, err)))
        return rc;
    struct kiln_param_table pt;
    kiln_params_build(&pt, m);
    memset(params, 0, pt.total * sizeof(float));
    struct map_list l;
    map_build(&l, arch, &pt, m, !m->tie_embeddings);
    for (int i = 0; i < l.n && !rc; i++) {
        const struct hf_map *e = &l.e[i];
        const struct kiln_st_tensor *t = kiln_safetensors_find(f, e->name);
        if (!t && arch == KILN_HF_GPT2 && !strncmp(e->name, "transformer.", 12))
            t = kiln_safetensors_find(f, e->name + 12); // the original gpt2 files have no prefix
        if (!t) {
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "tensor %s missing (%s): config.json and the weights disagree", e->name, path);
            break;
        }
        if (t->dtype != KILN_ST_F32 && t->dtype != KILN_ST_BF16 && t->dtype != KILN_ST_F16) {
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "tensor %s has dtype %s (%s): kiln imports F32, BF16 and F16", e->name,
                             kiln_st_dtype_name(t->dtype), path);
            break;
        }
        if (t->ndim != e->ndim || t->shape[0] != e->shape[0] ||
            (e->ndim == 2 && t->shape[1] != e->shape[1])) {
            rc = kiln_errorf(err, KILN_ERR_USAGE,
                             "tensor %s has shape [%lld, %lld] (%s): config.json implies [%lld, "
                             "%lld]",
                             e->name, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                             path, (long long)e->shape[0], (long long)e->shape[1]);
            break;
        }
        const struct kiln_param *p = &pt.p[e->src];
        int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
        float *dst = params + p->offset + e->row0 * cols;
        int64_t R = e->shape[0], Cn = e->ndim == 2 ? e->shape[1] : 1;
        for (int64_t r = 0; r < R && !rc; r++)
            for (int64_t c = 0; c < Cn; c++) {
                float v = st_get(t, r * Cn + c);
                if (!isfinite(v)) { // a NaN model would import, sample newlines and print "nan" logits
                    rc = kiln_nonfinite_error(err, path, t->name, r * Cn + c, v);
                    break;
                }
                if (e->transpose)
                    dst[c * R + r] = v;
                else
                    dst[r * Cn + c] = v;
            }
    }
    if (!rc && arch == KILN_HF_OLMO) {
        // OLMo's LayerNorm has no weight: kiln's is 1
        for (int i = 0; i < pt.n; i++)
            if (strstr(pt.p[i].name, "ln_1.weight") || strstr(pt.p[i].name, "ln_2.weight") || i == pt.lnf_w)
                for (size_t k = 0; k < pt.p[i].count; k++)
                    params[pt.p[i].offset + k] = 1.0f;
    }
    for (int i = 0; i < kiln_safetensors_count(f) && !rc; i++) {
        const char *name = kiln_safetensors_at(f, i)->name;
        if (ignorable(name) || (m->tie_embeddings && !strcmp(name, "lm_head.weight")))
            continue;
        int known = 0;
        for (int k = 0; k < l.n && !known; k++) {
            const char *mine = l.e[k].name;
            known = !strcmp(mine, name) || (!strncmp(mine, "transformer.", 12) && !strcmp(mine + 12, name));
        }
        if (!known)
            rc =
                kiln_errorf(err, KILN_ERR_USAGE, "unexpected tensor %s (%s): kiln's %s has no such parameter",
                            name, path, ARCH_NAMES[arch]);
    }
    free(l.e);
    kiln_params_free(&pt);
    kiln_safetensors_close(f);
    return rc;
}
