// The GPT family's row in the family table (model/family.h): GPT-2's and its descendants' decoder-only
// blocks, sequential or parallel, with the position encodings, norms, MLPs and attention heads of
// model/config.h.
#include "model/family.h"
#include "model/gpt/internal.h"

// What the GPT cannot split: uneven parts, and what needs every head at once
static int gpt_check(const struct kiln_model_config *m, const struct kiln_model_split *s,
                     struct kiln_error *err) {
    if (!s)
        return 0;
    int h = kiln_split_parts(s->heads), kv = kiln_split_parts(s->kv_heads), hid = kiln_split_parts(s->hidden),
        v = kiln_split_parts(s->vocab);
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

const struct kiln_model_family kiln_family_gpt = {
    .name = "gpt",
    .about = "GPT-2-style decoder: learned/RoPE/ALiBi positions, LayerNorm/RMSNorm, GELU/SwiGLU, GQA, "
             "sequential or parallel blocks",
    .hooks =
        KILN_HOOKS_LAYER | KILN_HOOKS_ATTENTION | KILN_HOOKS_LINEAR | KILN_HOOKS_VOCAB | KILN_HOOKS_SPLIT,
    .check = gpt_check,
    .params_build = gpt_params_build,
    .params_init = gpt_params_init,
    .params_init_tensor = gpt_params_init_tensor,
    .split_runs = gpt_split_runs,
    .linear_groups = gpt_linear_groups,
    .plan = gpt_plan,
    .forward = gpt_forward,
    .backward = gpt_backward,
    .decode_begin = gpt_decode_begin,
    .decode_step = gpt_decode_step,
};
