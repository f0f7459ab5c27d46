// The model shape's derived quantities. See config.h.
#include "model/config.h"

#include <stdio.h>
#include <string.h>

int kiln_model_kv_heads(const struct kiln_model_config *m) {
    return m->n_kv_head ? m->n_kv_head : m->n_head;
}

int kiln_model_head_size(const struct kiln_model_config *m) {
    return m->n_embd / m->n_head;
}

int kiln_model_padded_vocab(const struct kiln_model_config *m) {
    int k = m->vocab_multiple > 0 ? m->vocab_multiple : 1;
    return (m->vocab_size + k - 1) / k * k;
}

int kiln_model_mlp_hidden(const struct kiln_model_config *m) {
    if (m->mlp_hidden)
        return m->mlp_hidden;
    if (m->mlp_swiglu) {
        int h = (8 * m->n_embd + 2) / 3;
        return (h + 255) / 256 * 256;
    }
    return 4 * m->n_embd;
}

uint64_t kiln_model_config_hash(const struct kiln_model_config *m) {
    // hash the printed shape fields, so padding bytes and field order don't matter
    char buf[512];
    snprintf(buf, sizeof(buf),
             "L%d H%d KV%d C%d B%d V%d VM%d P%d RT%.9g N%d NB%d NE%.9g BI%d S%d MH%d PB%d T%d QK%d",
             m->n_layer, m->n_head, kiln_model_kv_heads(m), m->n_embd, m->block_size, m->vocab_size,
             m->vocab_multiple, (int)m->pos, (double)m->rope_theta, m->norm_rms, m->norm_bias,
             (double)m->norm_eps, m->bias, m->mlp_swiglu, kiln_model_mlp_hidden(m), m->parallel_block,
             m->tie_embeddings, m->qk_norm);
    // a family other than the GPT joins the hash; the GPT's hash is what it was before families existed,
    // so that earlier checkpoints still resume
    if (m->family != KILN_FAMILY_GPT) {
        size_t at = strlen(buf);
        snprintf(buf + at, sizeof(buf) - at, " F%d", (int)m->family);
    }
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = buf; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    return h;
}

double kiln_model_flops_per_token(const struct kiln_model_config *m, size_t n_params, int T, int causal) {
    double attn = (causal ? 6.0 : 12.0) * m->n_layer * m->n_head * kiln_model_head_size(m) * (double)T;
    return 6.0 * (double)n_params + attn;
}

double kiln_model_recompute_flops_per_token(const struct kiln_model_config *m, enum kiln_recompute r, int T) {
    double C = m->n_embd, HS = kiln_model_head_size(m), NH = m->n_head, NKV = kiln_model_kv_heads(m);
    double H = kiln_model_mlp_hidden(m), FCO = m->mlp_swiglu ? 2 * H : H;
    double mlp = 2.0 * (C * FCO + H * C); // forward GEMMs, per token and layer
    double attn_gemms = 2.0 * (C * (NH + 2 * NKV) * HS + NH * HS * C);
    double attn_core = 4.0 * NH * HS * T; // q k^T and p v, non-causal count
    if (r == KILN_RECOMPUTE_MLP)
        return m->n_layer * mlp;
    if (r == KILN_RECOMPUTE_BLOCK)
        return m->n_layer * (mlp + attn_gemms + attn_core);
    if (r == KILN_RECOMPUTE_SELECTIVE)
        return m->n_layer * (mlp + attn_gemms);
    return 0;
}

void kiln_model_local_of(const struct kiln_model_config *m, const struct kiln_model_split *s,
                         struct kiln_model_local *out) {
    out->NH = m->n_head / (s ? kiln_split_parts(s->heads) : 1);
    // more parts than key/value heads: each part holds the one its query heads read (replicated over the
    // parts that share it, as Megatron does where kv_heads < tp)
    int NKV = kiln_model_kv_heads(m), kv = s ? kiln_split_parts(s->kv_heads) : 1;
    out->NKV = kv > NKV ? 1 : NKV / kv;
    out->H = kiln_model_mlp_hidden(m) / (s ? kiln_split_parts(s->hidden) : 1);
    out->Vp = kiln_model_padded_vocab(m) / (s ? kiln_split_parts(s->vocab) : 1);
}

void kiln_model_heads_of(const struct kiln_model_config *m, const struct kiln_model_split *s,
                         struct kiln_model_config *out) {
    struct kiln_model_local loc;
    kiln_model_local_of(m, s, &loc);
    *out = *m;
    out->n_embd = kiln_model_head_size(m) * loc.NH;
    out->n_head = loc.NH;
    out->n_kv_head = loc.NKV;
}
