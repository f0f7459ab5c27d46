// The model shape's derived quantities. See config.h.
#include "model/config.h"

#include <stdio.h>

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

static int parts(int p) {
    return p > 1 ? p : 1;
}

void kiln_model_local_of(const struct kiln_model_config *m, const struct kiln_model_split *s,
                         struct kiln_model_local *out) {
    out->NH = m->n_head / (s ? parts(s->heads) : 1);
    // more parts than key/value heads: each part holds the one its query heads read (replicated over the
    // parts that share it, as Megatron does where kv_heads < tp)
    int NKV = kiln_model_kv_heads(m), kv = s ? parts(s->kv_heads) : 1;
    out->NKV = kv > NKV ? 1 : NKV / kv;
    out->H = kiln_model_mlp_hidden(m) / (s ? parts(s->hidden) : 1);
    out->Vp = kiln_model_padded_vocab(m) / (s ? parts(s->vocab) : 1);
}

int kiln_model_split_check(const struct kiln_model_config *m, const struct kiln_model_split *s,
                           struct kiln_error *err) {
    if (!s)
        return 0;
    int h = parts(s->heads), kv = parts(s->kv_heads), hid = parts(s->hidden), v = parts(s->vocab);
    int NKV = kiln_model_kv_heads(m), H = kiln_model_mlp_hidden(m), Vp = kiln_model_padded_vocab(m);
    if (m->n_head % h)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "heads %d split %d ways (--heads): the parts must divide the heads", m->n_head, h);
    if (kv <= NKV ? NKV % kv : kv % NKV)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "kv-heads %d split %d ways (--kv-heads): the parts must divide the key/value heads, "
            "or (fewer heads than parts, each part holding a copy of one) be a multiple of them",
            NKV, kv);
    // a part's query heads read its key/value heads only: both cut the same number of ways
    if (kv != h)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "heads split %d ways and kv-heads %d ways: a part's query heads must find their "
                           "key/value heads in the same part; split both the same number of ways",
                           h, kv);
    if (H % hid)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "mlp-hidden %d split %d ways (--mlp-hidden): the parts must divide the MLP's width", H, hid);
    if (Vp % v)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "padded vocabulary %d split %d ways (--vocab-multiple): pad the vocabulary to a "
                           "multiple of %d x %d",
                           Vp, v, m->vocab_multiple, v);
    if (h > 1 && m->qk_norm)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "qk-norm with heads split %d ways (--qk-norm): QK-norm normalizes a token's whole q "
            "and k, across every head; leave the heads whole",
            h);
    if (h > 1 && m->pos == KILN_POS_ALIBI)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "pos alibi with heads split %d ways (--pos): ALiBi's slopes follow the global head "
            "index, which the attention op does not take; use rope or learned positions",
            h);
    return 0;
}
