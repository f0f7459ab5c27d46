// The parameter table: every parameter tensor's name, shape and offset in one flat buffer.
//
// Parameters, gradients and optimizer state each live in one big buffer carved by this table
// (docs/architecture.md). Tensors are grouped by layer (embeddings, layer 0, layer 1, ..., final norm, head), so a
// sharded run can gather one layer at a time. Names are Hugging Face GPT-2 names; the layout of every weight
// is PyTorch nn.Linear's (out_features, in_features). Offsets are aligned to 64 elements so that every tensor
// starts on a 256-byte boundary whatever the dtype; the padding between tensors is never read or updated.
#ifndef KILN_MODEL_PARAMS_H
#define KILN_MODEL_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

// The tensors of one GPT block (the GPT family's; another family numbers its own, and the table keeps as many
// per layer as the family says). Absent ones (no bias, RMSNorm, ...) have index -1.
enum kiln_layer_tensor {
    KILN_LN1_W, KILN_LN1_B,
    KILN_QKV_W, KILN_QKV_B,       // (NH + 2*NKV)*HS rows: [q | k | v]
    KILN_ATTNO_W, KILN_ATTNO_B,   // (C, NH*HS)
    KILN_LN2_W, KILN_LN2_B,       // absent in parallel blocks (one norm feeds both branches)
    KILN_FC_W, KILN_FC_B,         // (H, C), or (2H, C) as [gate | up] for SwiGLU; parallel blocks store
                                  // them right after QKV_W / QKV_B (one GEMM for both, gpt/block.c)
    KILN_MLPO_W, KILN_MLPO_B,     // (C, H)
    KILN_QNORM_W, KILN_KNORM_W,   // (NH*HS), (NKV*HS): QK-norm over each token's whole q and k (OLMo-2)
    KILN_LAYER_TENSORS
};

struct kiln_param {
    char name[96];
    int ndim;
    int64_t shape[2];
    size_t offset;  // elements from the start of the buffer
    size_t count;   // elements
    int layer;      // -1 for embeddings and head
    int decay;      // 2-D weights get weight decay
};

struct kiln_param_table {
    struct kiln_param *p;
    int n;
    size_t total;          // buffer length in elements, including alignment padding
    size_t n_params;       // real parameter count
    int wte, wpe, lnf_w, lnf_b, lm_head;  // indices, -1 when absent
    int **layer;           // [L][tensor] -> index or -1 (per_layer tensors, the family's numbering)
    int per_layer;
    int cap;               // entries p has room for
    size_t *layer_begin;   // [L + 1] element offset where layer l's tensors start; [L] = end of the last
};

void kiln_params_build(struct kiln_param_table *t, const struct kiln_model_config *m);
// The table of what one rank holds of a split model (config.h's struct kiln_model_split; NULL: whole): the
// same tensors under the same names, each split one cut to the rank's part (c_attn's rows hold the rank's
// [q | k | v] heads, c_fc's its [gate | up] columns, c_proj's inputs the same, wte's and lm_head's rows its
// slice of the padded vocabulary). Which part a rank holds is the strategy's to say; the table knows sizes.
void kiln_params_build_split(struct kiln_param_table *t, const struct kiln_model_config *m,
                             const struct kiln_model_split *split);
void kiln_params_free(struct kiln_param_table *t);
int kiln_params_find(const struct kiln_param_table *t, const char *name); // index or -1

// For a family's table builder (model/<family>/params.c): room for cap tensors in `layers` layers of
// per_layer kinds each (every index -1), then each tensor appended in order at the next aligned offset
// (kiln_params_add returns its index), layer_begin[l] set where a layer's tensors start (aligned), and
// total rounded up at the end.
void kiln_params_alloc(struct kiln_param_table *t, int cap, int layers, int per_layer);
int kiln_params_add(struct kiln_param_table *t, const char *name, int64_t d0, int64_t d1, int layer);
size_t kiln_params_aligned(size_t elems);

// Fills params (t->total floats) with GPT-2's init: N(0, 0.02) weights, residual output projections scaled by
// 1/sqrt(2L), zero biases, unit norm weights, zero padding. Deterministic in seed.
void kiln_params_init(const struct kiln_param_table *t, const struct kiln_model_config *m, float *params,
                      uint64_t seed);

// The blocks' linear-layer weights of table t (the GEMM weights a precision hook casts, not the LM head's):
// group[i] (t->n entries) is the first tensor of the GEMM weight tensor i is part of (i itself, or the tensor
// before it where one GEMM reads two that touch: a parallel block's [c_attn; c_fc]), -1 for every other tensor.
void kiln_model_linear_groups(const struct kiln_model_config *m, const struct kiln_param_table *t, int *group);
// Where part r of split s of tensor i sits in the whole tensor: f gets each contiguous run of the part, as
// (element offset in the part's tensor, element offset in the whole tensor, elements), in order. A tensor
// the split leaves whole is one run. (Megatron's layout: part r holds the r-th share of the heads, of the
// hidden units of each of SwiGLU's halves, and of the padded vocabulary's rows.)
void kiln_params_split_runs(const struct kiln_model_config *m, const struct kiln_model_split *s, int r,
                            const struct kiln_param_table *local, int i,
                            void (*f)(void *user, size_t local_at, size_t whole_at, size_t n), void *user);
// kiln_params_init's values of part r of split s, into params (local->total floats, local the table built
// with s): each tensor's part of the whole model's init, one whole tensor at a time.
void kiln_params_init_split(const struct kiln_param_table *local, const struct kiln_model_config *m,
                            const struct kiln_model_split *s, int r, float *params, uint64_t seed);

#endif
