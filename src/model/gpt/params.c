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

// Tensor i of table t (GPT-2's init: norms 1, biases 0, weights N(0, 0.02), residual projections scaled by
// 1/sqrt(2L), padded vocabulary rows 0), into x (its count floats). Each tensor's stream derives from (seed,
// i), so adding a tensor later does not change the others' init.
void gpt_params_init_tensor(const struct kiln_param_table *t, const struct kiln_model_config *m, int i, float *x,
                            uint64_t seed) {
    const struct kiln_param *p = &t->p[i];
    memset(x, 0, p->count * sizeof(float));
    if (is_norm_weight(p->name)) {
        for (size_t j = 0; j < p->count; j++)
            x[j] = 1.0f;
        return;
    }
    if (p->ndim == 1)
        return; // biases start at zero
    float std = 0.02f;
    if (strstr(p->name, "c_proj.weight"))
        std *= 1.0f / sqrtf(2.0f * (float)m->n_layer); // GPT-2: residual projections scaled by 1/sqrt(2L)
    struct kiln_rng r;
    kiln_rng_seed(&r, seed ^ kiln_hash64((uint64_t)i + 1));
    size_t count = p->count;
    if (i == t->wte || i == t->lm_head)
        // padded vocab rows stay zero (a split table's rows are a slice: at most all of them real)
        count = (size_t)(m->vocab_size < p->shape[0] ? m->vocab_size : p->shape[0]) * (size_t)p->shape[1];
    for (size_t j = 0; j < count; j++)
        x[j] = std * kiln_rng_normal(&r);
}

void gpt_params_init(const struct kiln_param_table *t, const struct kiln_model_config *m, float *params,
                     uint64_t seed) {
    memset(params, 0, t->total * sizeof(float));
    // tensors in parallel (the normals of a 1.3B model take a minute on one core); each tensor's stream is
    // its own, so the values do not depend on the thread count
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < t->n; i++)
        gpt_params_init_tensor(t, m, i, params + t->p[i].offset, seed);
}

// The whole tensor's row of row lr of a row-split tensor of rank r (c_attn's [q | k | v] heads, c_fc's
// [gate | up] or hidden rows, the vocabulary's rows). Megatron's layout: rank r holds query heads
// [r NH/n, (r+1) NH/n), the same share of the key/value heads (or, with fewer heads than ranks, a copy of
// the one its query heads read), hidden units [r H/n, (r+1) H/n) of each of gate and up, and the vocabulary's
// r-th slice.
static int64_t whole_row(const struct kiln_model_config *m, const struct kiln_model_split *s, int r,
                         int kind, int64_t lr) {
    int HS = kiln_model_head_size(m), NH = m->n_head, NKV = kiln_model_kv_heads(m);
    if (kind == KILN_QKV_W || kind == KILN_QKV_B) {
        int n = kiln_split_parts(s->heads), nh = NH / n, nkv = NKV >= n ? NKV / n : 1;
        int kv0 = NKV >= n ? r * nkv : r * NKV / n; // the rank's first key/value head
        int64_t q = (int64_t)nh * HS, k = (int64_t)nkv * HS;
        if (lr < q)
            return (int64_t)r * q + lr;
        if (lr < q + k)
            return (int64_t)NH * HS + (int64_t)kv0 * HS + (lr - q);
        return (int64_t)(NH + NKV) * HS + (int64_t)kv0 * HS + (lr - q - k);
    }
    if (kind == KILN_FC_W || kind == KILN_FC_B) {
        int64_t H = kiln_model_mlp_hidden(m), h = H / kiln_split_parts(s->hidden);
        if (lr < h)
            return (int64_t)r * h + lr;
        return H + (int64_t)r * h + (lr - h); // SwiGLU's up half
    }
    return (int64_t)r * (kiln_model_padded_vocab(m) / kiln_split_parts(s->vocab)) + lr; // wte, lm_head
}

void gpt_split_runs(const struct kiln_model_config *m, const struct kiln_model_split *s, int r,
                    const struct kiln_param_table *local, int i,
                    void (*f)(void *user, size_t local_at, size_t whole_at, size_t n), void *user) {
    const struct kiln_param *p = &local->p[i];
    int kind = -1;
    if (p->layer >= 0)
        for (int k = 0; k < local->per_layer; k++)
            if (local->layer[p->layer][k] == i)
                kind = k;
    int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
    int row_split = i == local->wte || i == local->lm_head || kind == KILN_QKV_W || kind == KILN_QKV_B ||
                    kind == KILN_FC_W || kind == KILN_FC_B;
    int col_split = kind == KILN_ATTNO_W || kind == KILN_MLPO_W;
    if (!s || (!row_split && !col_split)) {
        f(user, 0, 0, p->count); // whole on every rank
        return;
    }
    if (row_split) { // consecutive local rows that stay consecutive in the whole tensor: one run
        int64_t r0 = 0;
        while (r0 < p->shape[0]) {
            int64_t w0 = whole_row(m, s, r, kind, r0), r1 = r0 + 1;
            while (r1 < p->shape[0] && whole_row(m, s, r, kind, r1) == w0 + (r1 - r0))
                r1++;
            f(user, (size_t)(r0 * cols), (size_t)(w0 * cols), (size_t)((r1 - r0) * cols));
            r0 = r1;
        }
        return;
    }
    // column-split (the output projections' inputs): each row's run of this rank's columns
    int64_t wcols = cols * (kind == KILN_ATTNO_W ? kiln_split_parts(s->heads) : kiln_split_parts(s->hidden));
    for (int64_t row = 0; row < p->shape[0]; row++)
        f(user, (size_t)(row * cols), (size_t)(row * wcols + r * cols), (size_t)cols);
}

// The blocks' GEMM weights: c_attn, attn.c_proj, c_fc (SwiGLU's [gate | up] is one tensor) and mlp.c_proj; a
// parallel block's c_fc joins c_attn's GEMM where the two touch (as gpt/layout.c decides)
void gpt_linear_groups(const struct kiln_model_config *m, const struct kiln_param_table *t, int *group) {
    for (int i = 0; i < t->n; i++)
        group[i] = -1;
    static const int kinds[] = {KILN_QKV_W, KILN_ATTNO_W, KILN_FC_W, KILN_MLPO_W};
    for (int l = 0; l < m->n_layer; l++) {
        const int *ix = t->layer[l];
        for (int k = 0; k < 4; k++)
            if (ix[kinds[k]] >= 0)
                group[ix[kinds[k]]] = ix[kinds[k]];
        int q = ix[KILN_QKV_W], f = ix[KILN_FC_W];
        if (m->parallel_block && q >= 0 && f >= 0 && t->p[f].offset == t->p[q].offset + t->p[q].count)
            group[f] = q;
    }
}
