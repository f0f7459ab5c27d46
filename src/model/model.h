// The model as every layer above model/ sees it: its state (the flat buffers the parameter table carves, and
// the windows onto them), the hooks through which strategies enter, and the passes of its family
// (model/family.h: the GPT's are in model/gpt/), written once against the ops table.
#ifndef KILN_MODEL_MODEL_H
#define KILN_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/ops.h"
#include "util/error.h"
#include "model/config.h"
#include "model/params.h"

// Bytes the model needs on its backend, planned up front (kiln info, the out-of-memory message, metrics). The
// model holds no optimizer state: run/plan.c adds the optimizer's (optim/state.h: master weights, moments) to
// the same fields for what a rank holds.
struct kiln_mem_plan {
    size_t params_bytes;  // f32 master weights: the model's compute copy where it is the master (f32 backends)
    size_t weights_bytes; // compute copy in act dtype (0 when it is the master weights)
    size_t grads_bytes;
    size_t optim_bytes;   // AdamW m and v (the optimizer's; 0 in the model's own plan)
    size_t acts_bytes;    // activations kept for backward, plus the scratch arena
    size_t scratch_bytes; // of acts_bytes: the arena, where one-slot buffers never live at once share memory
    size_t host_bytes;    // pinned host memory: the layer inputs of offload_activations (not in total_bytes)
    int classifier_rows;  // rows per chunk of the LM head, whose logits chunk is in the arena
    size_t total_bytes;
};

struct kiln_model_opts {
    int B, T;                     // activation shapes to plan for
    enum kiln_recompute recompute;
    int training;                 // 0: no gradients (sampling, eval-only)
    // Tuning knobs for tests and measurements (0 = the default). model/ reads no environment: run/tuning.c's
    // kiln_model_tuning maps the knobs KILN_CLASSIFIER_ROWS, KILN_MLP_ROWS, KILN_PARALLEL_FUSED=0 and
    // KILN_SCRATCH_SHARED=0 here.
    int classifier_rows;          // rows per LM-head chunk (0: planned from the free scratch)
    int mlp_rows;                 // rows per MLP chunk (0: planned: chunks of at most 1 GiB of hidden
                                  // activations, with --recompute=block or mlp, where the MLP is recomputed in
                                  // the backward chunk by chunk; -1: never chunked)
    int no_parallel_fusion;       // parallel blocks run two input GEMMs instead of one
    int scratch_apart;            // every scratch buffer in a range of its own
    int external_grads;           // allocate no gradient buffer: every segment's gradients are written where
                                  // kiln_model_set_grad_window points (ZeRO-2's staging buffers), set before use
    int external_weights;         // allocate no compute weights: every segment's weights are read where
                                  // kiln_model_set_weight_window points (ZeRO-3's gathered copies), set before
                                  // use; kiln_model_set_params and decoding do not apply
    int offload_activations;      // --recompute=block's layer inputs go to pinned host memory during the forward
                                  // and come back, prefetched a layer ahead, during the backward: the model
                                  // holds 3 of them instead of L + 1
    struct kiln_model_split split; // what this rank holds of split dimensions (config.h; zeros: whole): the
                                   // model runs at the rank's sizes, and the hooks below do what crosses ranks
    struct kiln_mem_plan beside;   // what is planned beside the model on its backend (the optimizer's state):
                                   // the out-of-memory message quotes the sum, and kiln_model_mem_peak counts
                                   // it in its floor
};

struct kiln_model;

// ---- hooks: where parallelism enters (train/ fills them in on top of parallel/comm/; with one process all are NULL) --
// The model calls them at fixed points of a step and never calls communication code itself.
struct kiln_model_hooks {
    void *user;
    // before layer l's forward, and before its recompute in the backward (recompute = 1): its weights must be
    // in place (ZeRO-3 gathers them here and may point the layer's window at the gathered copy)
    void (*layer_begin)(void *user, int l, int recompute);
    // after layer l's forward (or recompute): its gathered weights may go
    void (*layer_end)(void *user, int l, int recompute);
    // after layer l's backward: every gradient of layer l's tensors is complete for this micro-step
    void (*layer_backward_end)(void *user, int l);
    // after the embedding's backward: the remaining gradients (embeddings, and with them the backward) are
    // complete; the final norm's and the LM head's were complete before layer L-1's backward began
    void (*embed_backward_end)(void *user);
    // at the start of every forward, before the embedding: the weights read outside the layers (embeddings,
    // final norm, head) and layer 0's must be in place (ZeRO-3 gathers them here)
    void (*forward_begin)(void *user);
};
void kiln_model_set_hooks(struct kiln_model *g, const struct kiln_model_hooks *h);

// ---- linear layers: where tensor parallelism splits a projection and FP8 casts it ----
// Every linear layer of the model has an identity: which projection of which layer (-1 for the LM head).
// A strategy can take over any of them: the hook gets the model's own call (its buffers, at the rank's sizes
// under a split) and must do what the backend's matmul_forward or matmul_backward would (Megatron's column-
// parallel layers gather their input first, row-parallel ones reduce their output after; FP8 casts the
// operands and scales them). The backward's args may carry the previous layer's fused GELU backward
// (dinp_gelu_pre) and row strides, as the op's do.
enum kiln_linear {
    KILN_LINEAR_QKV = 0,  // ln_1 -> [q | k | v] (column-parallel)
    KILN_LINEAR_ATTN_OUT, // attention output projection (row-parallel)
    KILN_LINEAR_MLP_IN,   // c_fc: GELU's input, or SwiGLU's [gate | up] (column-parallel)
    KILN_LINEAR_MLP_OUT,  // the MLP's output projection (row-parallel)
    KILN_LINEAR_FUSED_IN, // a parallel block's [qkv | fc] in one GEMM (column-parallel)
    KILN_LINEAR_HEAD,     // the LM head, with l = -1 (vocab-parallel); see also struct kiln_model_vocab
    KILN_LINEARS
};
const char *
kiln_linear_name(enum kiln_linear k); // "qkv", "attn_out", "mlp_in", "mlp_out", "fused_in", "head"

struct kiln_model_linear {
    void *user;
    void (*forward)(void *user, int l, enum kiln_linear k, const struct kiln_matmul_args *a);
    void (*backward)(void *user, int l, enum kiln_linear k, const struct kiln_matmul_back_args *a);
};
// Installs h (NULL: none, the backend's op for every layer). Where prev is not NULL it gets what was
// installed before, so that strategies compose: tensor parallelism's hook can run its local GEMMs through
// FP8's with kiln_model_linear_forward_with(prev, ...).
void kiln_model_set_linear(struct kiln_model *g, const struct kiln_model_linear *h, struct kiln_model_linear *prev);
// Runs a linear layer through h, or through the backend's op where h has no such function: how a hook calls
// the one it wraps.
void kiln_model_linear_forward_with(const struct kiln_model_linear *h, const struct kiln_backend *be, int l,
                                  enum kiln_linear k, const struct kiln_matmul_args *a);
void kiln_model_linear_backward_with(const struct kiln_model_linear *h, const struct kiln_backend *be, int l,
                                   enum kiln_linear k, const struct kiln_matmul_back_args *a);

// ---- the vocabulary: the embedding and the LM head with its loss (vocab-parallel) ----
// One chunk of rows of the LM head and its cross-entropy, with (dloss != 0) its backward: logits = x @ W^T,
// losses, then dx = dlogits @ W and dW (+=, or = with grad_assign). A vocab-parallel loss (Megatron's) takes
// this over whole, since the softmax's max and sum cross the ranks that hold the vocabulary's slices.
struct kiln_model_head_args {
    const void *x;          // act (rows, C): the final norm's output
    const void *weight;     // act (Vp, C): the head (the rank's rows of the padded vocabulary under a split)
    void *dweight;          // grad (Vp, C), or NULL without a backward
    void *logits;           // act (rows, Vp): the chunk's scratch; dlogits after the loss
    float *losses;          // (rows): per-token cross-entropy
    const int32_t *targets; // (rows), backend memory: global token ids, -1 = ignored
    void *dx;               // act (rows, C): dL/dx, written (=) when dloss != 0
    int rows, C, V, Vp;     // V: the real vocabulary (global); Vp: the rows weight holds
    // Under a sequence split (struct kiln_model_split.seq): x and dx are this part's chunk of rows, and
    // losses and targets point into arrays of all N rows where part q's rows of this chunk begin
    // parts_stride * q entries on (logits has room for seq x rows); 0 otherwise
    float dloss, z_loss;
    int grad_assign; // dweight = instead of += (the step's first write)
    int parts_stride;
};
struct kiln_model_vocab {
    void *user;
    void (*embed_forward)(void *user, const struct kiln_embed_args *a);
    void (*embed_backward)(void *user, const struct kiln_embed_back_args *a);
    void (*head)(void *user, const struct kiln_model_head_args *a);
};
// Installs v (NULL: none), as kiln_model_set_linear. A model whose vocabulary is split needs all three.
void kiln_model_set_vocab(struct kiln_model *g, const struct kiln_model_vocab *v, struct kiln_model_vocab *prev);
// The LM head chunk as the model runs it without a vocab hook: the head's GEMM through the linear hooks
// (KILN_LINEAR_HEAD), the backend's cross-entropy, the head's backward. For a vocab hook that wraps it.
void kiln_model_head_default(struct kiln_model *g, const struct kiln_model_head_args *a);

// Sequence parallelism: the attention core of every layer is computed by the caller (parallel/sp.c), which sees
// the rank's share of each sequence and talks to the other ranks of its group. The arguments are the model's
// own call's (its T columns, its buffers); forward must fill out and lse, backward dqkv's columns. NULL
// functions: the backend's attention op.
struct kiln_model_attention {
    void *user;
    void (*forward)(void *user, int l, const struct kiln_attn_args *a);
    void (*backward)(void *user, int l, const struct kiln_attn_back_args *a);
};
void kiln_model_set_attention(struct kiln_model *g, const struct kiln_model_attention *a);
// The global positions of the T columns, for learned position embeddings (sequence parallelism): column
// t < split sits at pos0 + t, the others at pos1 + (t - split). The default is pos0 = 0, split = T.
void kiln_model_set_positions(struct kiln_model *g, int pos0, int split, int pos1);

// Gradients are written through windows too, one per segment of the flat buffer: segment 0 is what comes
// before layer 0 (the embeddings), segment 1 + l is layer l, segment L + 1 what follows the last layer (the
// final norm and the LM head). *begins gets the segments' first elements (n + 1 entries, the last the table's
// total); returns n = L + 2. A window points at a copy of its segment, laid out as in the flat buffer from the
// segment's first element, in the grad dtype; NULL restores the model's own buffer.
int kiln_model_grad_segments(const struct kiln_model *g, const size_t **begins);
void kiln_model_set_grad_window(struct kiln_model *g, int seg, void *base);

// Weights are read through windows too, one per segment as above (the compute copy by default): base points
// at a copy of the segment's tensors laid out as in the flat buffer from the segment's first element, in the
// act dtype; NULL restores the default (none with external_weights: a window must be set before use).
void kiln_model_set_weight_window(struct kiln_model *g, int seg, const void *base);
// Layer l's window: segment 1 + l.
void kiln_model_set_layer_window(struct kiln_model *g, int l, const void *base);

// Plans memory without allocating (act_bytes/grad_bytes from the backend's dtypes).
void kiln_model_plan(const struct kiln_model_config *m, const struct kiln_model_opts *o, enum kiln_dtype act,
                   enum kiln_dtype grad, int weights_alias_master, struct kiln_mem_plan *plan);

struct kiln_model;

// Allocates everything on the backend. Out of memory is an error that quotes the plan.
int kiln_model_create(struct kiln_model **out, const struct kiln_model_config *m, struct kiln_backend *be,
                    const struct kiln_model_opts *o, struct kiln_error *err);
void kiln_model_free(struct kiln_model *g);

const struct kiln_param_table *kiln_model_params(const struct kiln_model *g);
const struct kiln_model_config *kiln_model_get_config(const struct kiln_model *g);
const struct kiln_mem_plan *kiln_model_mem_plan(const struct kiln_model *g);
// Peak memory so far, in bytes: the most the backend has held at once (the plan's buffers, and on CUDA its
// scratch and library workspaces too), or the plan's total if that is larger or the backend does not count.
size_t kiln_model_mem_peak(const struct kiln_model *g);
// Whether parallel blocks run their attention and MLP input projections as one GEMM: in the backward and
// decoding (*bwd) and in the forward (*fwd). Both 0 for sequential blocks; gpt/internal.h's struct fusion says when.
void kiln_model_fused_projection(const struct kiln_model *g, int *fwd, int *bwd);

// The compute weights <-> host f32 (t->total floats, padding included; not with external_weights). The f32
// master weights are the optimizer's (optim/state.h), which keeps this copy in step as it updates them; where
// the compute weights are the master (f32 backends), these are the master. Reading them back on a backend of
// narrower weights gives the rounded copy, not the master.
void kiln_model_set_params(struct kiln_model *g, const float *host);
void kiln_model_get_params(struct kiln_model *g, float *host);
void kiln_model_get_grads(struct kiln_model *g, float *host); // for tests
// Initializes the compute weights (kiln_params_init's, then kiln_model_set_params): sampling and tests. A
// trainer initializes the optimizer's master weights, which set the compute copy.
void kiln_model_init_params(struct kiln_model *g, uint64_t seed);

// Forward over a (B, T) batch of token ids (host memory). Returns the mean cross-entropy over targets >= 0.
// With dloss != 0 (training) it also runs the classifier's backward, so that kiln_model_backward can follow;
// dloss scales the summed per-token loss (1 / (tokens per optimizer step) for a mean).
double kiln_model_forward(struct kiln_model *g, const int32_t *inputs, const int32_t *targets, float dloss,
                        float z_loss);
// Accumulates parameter gradients (+=) for the last forward.
void kiln_model_backward(struct kiln_model *g);
void kiln_model_zero_grad(struct kiln_model *g);

// The model's buffers, for the optimizer and the data-parallel layer: the compute weights (act dtype; NULL
// with external_weights) and the gradients (grad dtype; NULL with external_grads or without training), both
// pt->total elements. Backend memory.
struct kiln_model_buffers {
    void *weights;
    void *grads;
};
void kiln_model_buffers(const struct kiln_model *g, struct kiln_model_buffers *out);

// KV-cache decoding for sampling: prepares caches for B sequences of up to maxT tokens, then each step feeds
// one token per sequence at position pos and returns the logits (B, V) in host f32.
int kiln_model_decode_begin(struct kiln_model *g, int B, int maxT, struct kiln_error *err);
void kiln_model_decode_step(struct kiln_model *g, const int32_t *tokens, int pos, float *logits);

#endif
