// Tensor parallelism (docs/distributed.md, "Tensor parallelism"): Megatron's split of each block over the tp
// ranks of a group, applied to a model that knows nothing of it through its hooks (model/model.h).
//
// Layout. world = tp x (sp x dp): the tp ranks of a group are consecutive (rank = cross_rank * tp + tp_rank),
// innermost, so that a group sits on one node's fast links. Everything outside tensor parallelism (data
// parallelism with every ZeRO level, sequence parallelism, the loader) runs over the "cross" communicator of
// the world / tp ranks that share a tp_rank, and sees a model whose parameter table is this rank's part.
//
// What each rank holds and does (Megatron-LM's tensor parallelism, Shoeybi et al. 2019):
//   column-parallel layers (qkv, the MLP's input and SwiGLU's two halves, a parallel block's fused input):
//     the input is whole on every rank; each rank computes its output columns (its heads, its hidden
//     units); the backward sums the input's gradient over the group (an all-reduce);
//   row-parallel layers (attention out, MLP out): each rank multiplies its input columns, the bias is added
//     once (rank 0), and the output is summed over the group;
//   the vocabulary: each rank holds a slice of the padded vocabulary's rows of the embedding and the LM head;
//     the embedding's rows are summed over the group, and the loss (Megatron's vocabulary-parallel
//     cross-entropy) reduces each row's max, sum of exponentials and target logit over the group, so that no
//     rank ever holds a row of whole logits;
//   key/value heads fewer than tp: each rank holds a copy of the one its query heads read; the copies'
//     gradients are summed over the ranks that share the head, every micro-step, before they accumulate.
// Norms and biases of the row-parallel layers are whole on every rank and see the same gradients there.
//
// Under Megatron's sequence parallelism (--tp-sp) the residual stream holds this rank's Nr = N / tp token
// rows, and the collectives at the edges of the tensor-parallel region run one of three ways (--tp-overlap):
//   off   the synchronous order: an all-gather of the input rows, then one GEMM on all N rows (column-
//         parallel); one GEMM, then a reduce-scatter of its partial output (row-parallel); the compute
//         stream waits for each collective right after issuing it;
//   ring  the collective folded into the GEMM chunk by chunk (a "collective matmul", torchtitan's async TP):
//         tp steps around the group's ring, each a GEMM on one rank's Nr rows while a send/receive with the
//         neighbours (send to rank me - 1, receive from rank me + 1) moves the next chunk on the comm stream;
//         the compute stream waits for a transfer only right before the GEMM that reads what it brought.
//           column-parallel forward: at step s the input rows of rank me + s (its own first, then each
//             received in turn into one of two buffers), their output rows written in place;
//           row-parallel forward: at step s the partial output of rank me + s + 1's rows, plus the partial
//             sum received for them, is sent on; after tp - 1 steps the rank's own rows' GEMM (into out,
//             the bias on rank 0) adds the sum of every other rank's;
//           column-parallel backward: the input re-gathered around the ring for dW (accumulated chunk by
//             chunk, assigned on the first), and dL/dinput reduce-scattered around it: the own rows' part
//             first, into dinp, then rank me + s's part plus the sum received, sent on, and the other
//             ranks' sum added at the end (the one transfer not under a GEMM);
//           row-parallel backward: dL/doutput gathered around the ring, the dinp GEMM and dW per chunk.
//         The sums run in another order than the reduce-scatter's (within the tests' 1e-5), and the chunks
//         live in the two sequence buffers, so the ring takes no memory of its own. The LM head and the
//         embedding stay synchronous. On 4 H100s (llama-8b, T=8192, 2026-11-27) the ring ran 0.83x the
//         synchronous order's speed (NCCL's send/receive pairs and GEMMs of Nr rows against one
//         collective and one GEMM of N), so off is the default; the ring stays for measurement.
//   bulk  the synchronous order's collectives, whole, each issued early enough to run under a GEMM:
//           column-parallel forward: the input's all-gather, under the GEMM of the rank's own rows (from its
//             own input); then a GEMM on the rows before them and one on the rows after;
//           column-parallel backward (Megatron's bulk overlap): the input's all-gather issued before the dinp
//             GEMM, which does not read it, and dinp's reduce-scatter before the dW GEMM;
//           row-parallel backward: dL/doutput's all-gather, under the dinp GEMM of the rank's own rows; then
//             the rows before and after, and dW from every row.
//         Every output row is the same product as off's (to the bit on the CPU; a GPU may take other GEMM
//         algorithms for the row blocks, and FP8 scales each block by its own amax). The row-parallel forward's
//         reduce-scatter stays as off's.
#ifndef KILN_PARALLEL_TP_H
#define KILN_PARALLEL_TP_H

#include <stddef.h>

#include "core/ops.h"
#include "model/config.h"
#include "model/params.h"
#include "util/error.h"

// --tp-overlap: how the sequence split's all-gathers and reduce-scatters meet the GEMMs (above)
enum kiln_tp_overlap { KILN_TP_OVERLAP_OFF = 0, KILN_TP_OVERLAP_RING = 1, KILN_TP_OVERLAP_BULK = 2 };

struct kiln_tp_layout {
    int tp, tp_rank;         // the group's size, and this rank's place in it
    int cross, cross_rank;   // world / tp, and this rank's index among the ranks of its tp_rank
    struct kiln_model_split split; // what this rank holds (model/config.h)
    enum kiln_tp_overlap overlap;  // OFF without a sequence split
    // --tp-keep-gathered: each column-parallel layer's gathered input kept from the forward for its dW in the
    // backward, instead of gathered again (a third of the all-gathers; (B T, C) a layer and column-parallel
    // layer of memory). Off without a sequence split and under the ring, which never holds a whole one.
    int keep_gathered;
    // the sequence split's all-gathers on the copy engines where the transport has them (KILN_TP_COPY_ENGINE:
    // NCCL's zero-CTA policy for the group, the gathers' output in a symmetric window; comm.h)
    int copy_engine;
};

// Plans the layout of rank `rank` of `world` for --tp=tp and model m: tp divides the world, the heads, the
// MLP's width and the padded vocabulary, and the model can be split (a usage error naming the option
// otherwise). tp <= 1 is no tensor parallelism (tp = 1, the whole model).
// seq: Megatron's sequence parallelism inside the group (--tp-sp): the residual stream's rows split tp ways
// too (split.seq), all-gathers before column-parallel layers and reduce-scatters after row-parallel ones,
// issued whole (overlap OFF, the default; kiln_tp_plan_overlap asks for the ring).
int kiln_tp_plan(int tp, int seq, int world, int rank, const struct kiln_model_config *m,
                 struct kiln_tp_layout *out, struct kiln_error *err);
// --tp-overlap: how the layout's sequence split meets the GEMMs (kept OFF without one); --tp-keep-gathered
// (kept 0 where it has no meaning: struct kiln_tp_layout)
void kiln_tp_plan_overlap(struct kiln_tp_layout *lo, enum kiln_tp_overlap overlap, int keep_gathered);

// A weight for each element of the rank's flat parameter buffer that the group's ranks hold more than one
// copy of: the gradient norm counts each copy 1 / copies (replicated norms and biases: 1 / tp; key/value head
// copies: their sharers' share). Element ranges, in table order; *n gets the count. Free with free().
struct kiln_norm_weight {
    size_t lo, hi;
    double weight;
};
struct kiln_norm_weight *kiln_tp_norm_weights(const struct kiln_tp_layout *lo, const struct kiln_model_config *m,
                                              const struct kiln_param_table *local, int *n);

// Under a sequence split, the tensors whose gradients each rank computes from its own rows only (the norms'
// and the row-parallel layers' biases): their reduced gradients are summed over the group before the norm
// and the update (struct kiln_norm_weight's ranges; the weights mean nothing). *n 0 without one.
struct kiln_norm_weight *kiln_tp_sum_ranges(const struct kiln_tp_layout *lo, const struct kiln_model_config *m,
                                            const struct kiln_param_table *local, int *n);

// The backend memory kiln_tp_create allocates for B x T tokens a micro-step (0 without a split); keep:
// --tp-keep-gathered as kiln_tp_plan_overlap leaves it
size_t kiln_tp_buffer_bytes(const struct kiln_model_config *m, const struct kiln_model_split *split, int B,
                            int T, enum kiln_dtype act, enum kiln_dtype grad, int keep);

struct kiln_comm;
struct kiln_backend;
struct kiln_model;

struct kiln_tp;
// Splits the tensor-parallel and cross communicators off world (collective over world; *cross is the
// caller's to close) and allocates the buffers for B x T tokens a micro-step. With tp = 1, *out is NULL and
// *cross is world itself (not to be closed twice).
int kiln_tp_create(struct kiln_tp **out, const struct kiln_tp_layout *lo, struct kiln_comm *world,
                   struct kiln_backend *be, const struct kiln_model_config *m, int B, int T,
                   struct kiln_comm **cross, struct kiln_error *err);
// Installs the linear-layer and vocabulary hooks on g, a model built with lo->split (over what was installed
// before: FP8's hooks compose underneath). NULL t: nothing.
void kiln_tp_attach(struct kiln_tp *t, struct kiln_model *g);
// The whole model's tensors from every rank's part (collective over the group, a tensor at a time): part is
// this rank's local->total floats; out (whole->total floats) is filled on the group's rank 0 only, where it
// is not NULL.
void kiln_tp_gather_whole(struct kiln_tp *t, const struct kiln_param_table *local, const float *part,
                          const struct kiln_param_table *whole, float *out);
// The tensor-parallel group's communicator (NULL without tensor parallelism)
struct kiln_comm *kiln_tp_comm(const struct kiln_tp *t);
void kiln_tp_free(struct kiln_tp *t);

#endif
