// The model's shape: what a family's code needs to lay out its parameters and run (model/gpt/), with the
// quantities derived from it (head size, padded vocabulary, MLP width, FLOPs per token). The run's options
// (run/options.h) hold one of these; nothing here knows of data, optimizers or parallelism.
#ifndef KILN_MODEL_CONFIG_H
#define KILN_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "core/ops.h"
#include "util/error.h"

// act: only the MLP activation's output is recomputed (from its kept input), as torch.compile does
// what the backward recomputes (docs/architecture.md): selective is block, less the attention, whose output
// and log-sum-exp each layer keeps
// auto: the least recompute whose memory plan fits the device, chosen when training starts (run/plan.h)
enum kiln_recompute {
    KILN_RECOMPUTE_NONE = 0,
    KILN_RECOMPUTE_MLP,
    KILN_RECOMPUTE_BLOCK,
    KILN_RECOMPUTE_ACT,
    KILN_RECOMPUTE_SELECTIVE,
    KILN_RECOMPUTE_AUTO
};

// Model families (model/family.h): the architecture a config describes. Each family has its own parameter
// layout, memory plan, passes and decoding under model/<family>/; the fields below are the shape every
// family reads, and a family may read more of them (the GPT's block options).
enum kiln_family { KILN_FAMILY_GPT = 0 };

struct kiln_model_config {
    enum kiln_family family; // --family
    int n_layer;        // L
    int n_head;         // NH
    int n_kv_head;      // NKV (GQA/MQA); 0 = n_head
    int n_embd;         // C
    int block_size;     // maximum sequence length (learned position table size)
    int vocab_size;     // V, real vocabulary (set from the tokenizer)
    int vocab_multiple; // Vp = V rounded up to this
    enum kiln_pos pos;
    float rope_theta;
    int norm_rms;  // 0 LayerNorm, 1 RMSNorm
    int norm_bias; // LayerNorm has a bias
    float norm_eps;
    int bias;           // linear layers have biases
    int mlp_swiglu;     // 0 GELU MLP, 1 SwiGLU
    int mlp_hidden;     // hidden size; 0 = 4C for GELU, 8C/3 rounded up to 256 for SwiGLU
    int parallel_block; // PaLM-style x + attn(ln(x)) + mlp(ln(x))
    int tie_embeddings;
    int qk_norm; // normalize q and k per head before attention (OLMo-2 style)
};

// 64-bit FNV-1a hash of the options that define the model shape (for refusing mismatched resumes).
uint64_t kiln_model_config_hash(const struct kiln_model_config *m);

// ---- derived quantities ----
int kiln_model_padded_vocab(const struct kiln_model_config *m);
int kiln_model_kv_heads(const struct kiln_model_config *m);
int kiln_model_head_size(const struct kiln_model_config *m);
int kiln_model_mlp_hidden(const struct kiln_model_config *m);

// FLOPs per token for MFU (nanoGPT's and PaLM's convention): 6N + 12*L*H*Q*T (causal = 0) or 6N + 6*L*H*Q*T (causal = 1),
// where N counts every parameter once (tied embeddings once).
double kiln_model_flops_per_token(const struct kiln_model_config *m, size_t n_params, int T, int causal);
// The extra FLOPs per token that activation recompute spends re-running forward work (for hfu, hardware FLOPs
// utilization; recompute FLOPs are not model FLOPs): the MLP GEMMs for MLP, each block's forward for BLOCK
// (GEMMs plus attention, in the same non-causal convention as the mfu numerator).
double kiln_model_recompute_flops_per_token(const struct kiln_model_config *m, enum kiln_recompute r, int T);

// ---- what one rank holds of a split model ----
// Tensor parallelism gives each rank a part of the attention heads, of the MLP's hidden width and of the
// padded vocabulary (docs/architecture.md, "Hook points and splits"). The model is then built and run
// at the rank's sizes: its parameter table holds the rank's rows or columns of each split tensor (under the
// same names), its activations the rank's heads and hidden columns, and the strategy's hooks (model/model.h)
// do the communication around the linear layers, the embedding and the loss. Each field is the number of
// parts a dimension is cut into: 0 or 1 means whole.
struct kiln_model_split {
    int heads;    // query heads (and the attention output projection's input columns)
    int kv_heads; // key/value heads: split where there are enough; with more parts than heads (a multiple of
                  // them, and as many parts as the query heads'), each part holds the one head its query
                  // heads read
    int hidden;   // the MLP's hidden width (SwiGLU: each of gate and up)
    int vocab;    // rows of the token embedding and the LM head (of the padded vocabulary)
    // Megatron's sequence parallelism inside tensor parallelism: the residual stream's B x T token rows cut
    // into this many parts. Part r holds rows [r N/seq, (r+1) N/seq): the embedding's output, the norms and
    // the residual adds run on those rows alone, while the linear layers, attention and the LM head see all
    // N (their hooks gather the rows before a column-parallel layer and reduce-scatter them after a
    // row-parallel one). Under a seq split the vocab hook's head args carry parts_stride (model/model.h).
    int seq;
};

// Megatron's tensor-parallel split into n parts: the heads, the key/value heads, the MLP's width and the
// vocabulary each cut n ways, and with seq the residual stream's token rows too
static inline struct kiln_model_split kiln_split_tensor_parallel(int n, int seq) {
    return (struct kiln_model_split){.heads = n, .kv_heads = n, .hidden = n, .vocab = n, .seq = seq ? n : 1};
}

// The parts a split field cuts its dimension into: 0 and 1 both mean whole
static inline int kiln_split_parts(int p) {
    return p > 1 ? p : 1;
}

// The sizes one rank holds under split s (NULL: the whole model)
struct kiln_model_local {
    int NH, NKV, H, Vp;
};
void kiln_model_local_of(const struct kiln_model_config *m, const struct kiln_model_split *s,
                         struct kiln_model_local *out);
// The model as the attention of one rank of split s sees it: its query and key/value heads, the same head
// size (what sequence parallelism and the attention's workspace plan for under tensor parallelism)
void kiln_model_heads_of(const struct kiln_model_config *m, const struct kiln_model_split *s,
                         struct kiln_model_config *out);
// Whether the model can be split so: each part divides its dimension, and nothing that needs every head at
// once (QK-norm over a token's whole q and k, ALiBi's slopes by global head index) is split. A usage error
// names the dimension otherwise.
int kiln_model_split_check(const struct kiln_model_config *m, const struct kiln_model_split *s,
                           struct kiln_error *err);

#endif
