// FP8 training: the blocks' linear layers run their three GEMMs in FP8, applied to the model through its
// linear-layer hook (model/model.h) as the parallel strategies are. The model does not know.
//
// Forward     out  = fp8(x, e4m3) @ fp8(W, e4m3)^T                     (+ bias; GELU as its own op after)
// Backward    dinp = fp8(dout, grad) @ fp8(W^T, e4m3)^T                (x gelu'(pre) where fused there)
//             dW   = fp8(dout^T, grad) @ fp8(x^T, e4m3)^T               (+=, or = on a step's first write)
//             dbias = column sums of dout (bias_backward, in the backward's own precision)
// Operands are cast with scales s = fmax / amax (core/ops.h). The recipes choose the amax:
//   tensorwise  the tensor's own, now (torchtitan's default: one amax pass before each cast);
//   rowwise     one per row along the GEMM's reduction dimension (the transposed operands of the backward:
//               one per column of the stored tensor); more accurate where rows differ in size;
//   delayed     the largest of the last `history` steps' amaxes of that operand (Transformer Engine's), the
//               tensor's own on the first step; the step's amaxes enter the history at kiln_fp8_after_step.
// Each GEMM's output is in the backend's act dtype (bf16 on a GPU, f32 on the CPU), the weight gradient in its
// grad dtype. The LM head stays in the backend's precision unless include_head.
#ifndef KILN_PRECISION_FP8_H
#define KILN_PRECISION_FP8_H

#include <cjson/cJSON.h>

#include "core/ops.h"
#include "model/model.h"
#include "util/error.h"

enum kiln_fp8_recipe { KILN_FP8_TENSORWISE = 0, KILN_FP8_ROWWISE = 1, KILN_FP8_DELAYED = 2 };

struct kiln_fp8_opts {
    enum kiln_fp8_recipe recipe;
    enum kiln_fp8_fmt grad_fmt; // of dout: e5m2 (range) or e4m3 (precision)
    int include_head;       // the LM head in FP8 too
    int history;            // delayed: steps of amax history (>= 1)
};

struct kiln_fp8;

const char *kiln_fp8_recipe_name(enum kiln_fp8_recipe r); // "tensorwise", "rowwise", "delayed"

// Whether be can run FP8 (0), or a usage error naming why not: a backend without the FP8 ops, or a GPU without
// FP8 tensor cores (below sm_89).
int kiln_fp8_check_backend(const struct kiln_backend *be, struct kiln_error *err);

// Creates the strategy for a model of n_layer layers and installs its hook on g. It must be the first linear
// hook (a strategy that splits linear layers, tensor parallelism, installs its own after it and runs its local
// GEMMs through this one). Errors: the backend cannot (kiln_fp8_check_backend), a hook is already there.
int kiln_fp8_apply(struct kiln_fp8 **out, struct kiln_model *g, const struct kiln_backend *be,
                   const struct kiln_fp8_opts *o, int n_layer, struct kiln_error *err);
// After each optimizer step (skipped ones too): delayed scaling's histories take the step's amaxes.
void kiln_fp8_after_step(struct kiln_fp8 *f);
// Several ranks: before the step's amaxes join the histories, reduce(user, amax, n) takes their largest over
// every rank (in place, n floats of backend memory), so that every rank scales each operand alike: data
// parallelism's ranks see other tokens, tensor parallelism's other parts of a weight (Transformer Engine
// reduces its amaxes so). It is called from kiln_fp8_after_step, on every rank at the same point.
void kiln_fp8_set_amax_reduce(struct kiln_fp8 *f, void (*reduce)(void *user, float *amax, size_t n),
                              void *user);
// Where weights may already be FP8 codes (ZeRO-3's FP8 all-gather): source(user, w, n) gives the e4m3 codes
// of the n elements at weight pointer w, laid out as w is, and their inverse scale (one, tensorwise, in
// backend memory), or returns nonzero where it holds none (the hook then casts w itself). Codes it gives must
// stay valid until the GEMMs that read them have run (the backend's stream orders them). Tensorwise only.
void kiln_fp8_set_weight_source(struct kiln_fp8 *f,
                                int (*source)(void *user, const void *w, size_t n, const uint8_t **codes,
                                              const float **scale_inv),
                                void *user);
// The recipe's state for a checkpoint (state.json's "precision"): the delayed histories, bit for bit. NULL
// where the recipe has none. The caller owns it.
cJSON *kiln_fp8_state_to_json(const struct kiln_fp8 *f);
// Restores it. A checkpoint without the state (written in bf16, or by another recipe) leaves the histories
// empty; one of another shape (history length, layers) is a usage error; a damaged one a runtime error.
int kiln_fp8_state_from_json(struct kiln_fp8 *f, const cJSON *j, struct kiln_error *err);
// What runs where, for kiln info and the log: "fp8 (emulated on the CPU), tensorwise, gradients e5m2, ..."
void kiln_fp8_describe(const struct kiln_fp8_opts *o, const char *device, char *buf, size_t cap);
void kiln_fp8_free(struct kiln_fp8 *f);

#endif
