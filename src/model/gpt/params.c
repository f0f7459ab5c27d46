// The GPT's parameter table: its tensors in the order a step meets them (embeddings, each block's, the final
// norm and the head), under Hugging Face GPT-2's names, and GPT-2's initialization.
#include "model/gpt/internal.h"

#include <math.h>
#include <string.h>

#include "util/error.h"
#include "util/rng.h"

void gpt_params_build(struct kiln_param_table *t, const struct kiln_model_config *m,
                      const struct kiln_model_split *split) {
    struct kiln_model_local loc;
    kiln_model_local_of(m, split, &loc); // the rank's heads, hidden width and vocabulary rows
    int L = m->n_layer, C = m->n_embd, HS = kiln_model_head_size(m), NH = loc.NH;
    int NKV = loc.NKV, H = loc.H, Vp = loc.Vp;
    kiln_params_alloc(t, 5 + L * KILN_LAYER_TENSORS, L, KILN_LAYER_TENSORS);

    // transformer.wte.weight (Vp, C): the padded rows exist so the LM head GEMM has a friendly shape
    t->wte = kiln_params_add(t, "transformer.wte.weight", Vp, C, -1);
    if (m->pos == KILN_POS_LEARNED)
        t->wpe = kiln_params_add(t, "transformer.wpe.weight", m->block_size, C, -1);
    for (int l = 0; l < L; l++) {
        int *ix = t->layer[l];
        t->layer_begin[l] = kiln_params_aligned(t->total);
        char n[96];
#define NAME(s) (snprintf(n, sizeof(n), "transformer.h.%d.%s", l, s), n)
        ix[KILN_LN1_W] = kiln_params_add(t, NAME("ln_1.weight"), C, 0, l);
        if (!m->norm_rms && m->norm_bias)
            ix[KILN_LN1_B] = kiln_params_add(t, NAME("ln_1.bias"), C, 0, l);
        int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, FCO = (int64_t)(m->mlp_swiglu ? 2 : 1) * H;
        ix[KILN_QKV_W] = kiln_params_add(t, NAME("attn.c_attn.weight"), QKV, C, l);
        if (m->parallel_block) {
            // Both projections read ln_1: c_fc's weight (and bias) follow c_attn's, so that [W_qkv; W_fc] is
            // one (QKV + FCO, C) matrix for a single GEMM (gpt/block.c). They touch only where the 64-element
            // alignment adds no padding (QKV * C, and QKV with biases, multiples of 64: every real shape);
            // gpt/layout.c checks the offsets and runs two GEMMs otherwise.
            ix[KILN_FC_W] = kiln_params_add(t, NAME("mlp.c_fc.weight"), FCO, C, l);
            if (m->bias) {
                ix[KILN_QKV_B] = kiln_params_add(t, NAME("attn.c_attn.bias"), QKV, 0, l);
                ix[KILN_FC_B] = kiln_params_add(t, NAME("mlp.c_fc.bias"), FCO, 0, l);
            }
        } else if (m->bias) {
            ix[KILN_QKV_B] = kiln_params_add(t, NAME("attn.c_attn.bias"), QKV, 0, l);
        }
        if (m->qk_norm) {
            ix[KILN_QNORM_W] = kiln_params_add(t, NAME("attn.q_norm.weight"), (int64_t)NH * HS, 0, l);
            ix[KILN_KNORM_W] = kiln_params_add(t, NAME("attn.k_norm.weight"), (int64_t)NKV * HS, 0, l);
        }
        ix[KILN_ATTNO_W] = kiln_params_add(t, NAME("attn.c_proj.weight"), C, (int64_t)NH * HS, l);
        if (m->bias)
            ix[KILN_ATTNO_B] = kiln_params_add(t, NAME("attn.c_proj.bias"), C, 0, l);
        if (!m->parallel_block) {
            ix[KILN_LN2_W] = kiln_params_add(t, NAME("ln_2.weight"), C, 0, l);
            if (!m->norm_rms && m->norm_bias)
                ix[KILN_LN2_B] = kiln_params_add(t, NAME("ln_2.bias"), C, 0, l);
            ix[KILN_FC_W] = kiln_params_add(t, NAME("mlp.c_fc.weight"), FCO, C, l);
            if (m->bias)
                ix[KILN_FC_B] = kiln_params_add(t, NAME("mlp.c_fc.bias"), FCO, 0, l);
        }
        ix[KILN_MLPO_W] = kiln_params_add(t, NAME("mlp.c_proj.weight"), C, H, l);
        if (m->bias)
            ix[KILN_MLPO_B] = kiln_params_add(t, NAME("mlp.c_proj.bias"), C, 0, l);
#undef NAME
    }
    t->layer_begin[L] = t->total;
    t->lnf_w = kiln_params_add(t, "transformer.ln_f.weight", C, 0, -1);
    if (!m->norm_rms && m->norm_bias)
        t->lnf_b = kiln_params_add(t, "transformer.ln_f.bias", C, 0, -1);
    if (!m->tie_embeddings)
        t->lm_head = kiln_params_add(t, "lm_head.weight", Vp, C, -1);
    t->total = kiln_params_aligned(t->total);
}

static int is_norm_weight(const char *name) {
    return strstr(name, "ln_1.weight") || strstr(name, "ln_2.weight") || strstr(name, "ln_f.weight") ||
           strstr(name, "q_norm.weight") || strstr(name, "k_norm.weight");
}

void gpt_params_init(const struct kiln_param_table *t, const struct kiln_model_config *m, float *params,
                     uint64_t seed) {
    memset(params, 0, t->total * sizeof(float));
    // Each tensor gets its own stream derived from (seed, tensor index), so adding a tensor later does not
    // change the others' init.
    float resid_scale = 1.0f / sqrtf(2.0f * (float)m->n_layer);
    // tensors in parallel (the normals of a 1.3B model take a minute on one core); each tensor's stream is
    // its own, so the values do not depend on the thread count
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < t->n; i++) {
        const struct kiln_param *p = &t->p[i];
        float *x = params + p->offset;
        if (is_norm_weight(p->name)) {
            for (size_t j = 0; j < p->count; j++)
                x[j] = 1.0f;
            continue;
        }
        if (p->ndim == 1)
            continue; // biases start at zero
        float std = 0.02f;
        if (strstr(p->name, "c_proj.weight"))
            std *= resid_scale; // GPT-2: residual projections scaled by 1/sqrt(2L)
        struct kiln_rng r;
        kiln_rng_seed(&r, seed ^ kiln_hash64((uint64_t)i + 1));
        size_t count = p->count;
        if (i == t->wte || i == t->lm_head)
            // padded vocab rows stay zero (a split table's rows are a slice: at most all of them real)
            count = (size_t)(m->vocab_size < p->shape[0] ? m->vocab_size : p->shape[0]) * (size_t)p->shape[1];
        for (size_t j = 0; j < count; j++)
            x[j] = std * kiln_rng_normal(&r);
    }
}
