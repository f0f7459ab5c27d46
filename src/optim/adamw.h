// AdamW over spans of one flat parameter buffer, on the backend: the trainer's optimizer step, and each
// data-parallel rank's step over its shard.
//
// The optimizer sees buffers and spans, not the model: the f32 master weights, their compute copy, the
// gradients and the two moments are plain backend pointers, and a span (core/ops.h) names a run of flat
// elements, whether it decays, and where its moments sit (its state offset). A whole update has one span per
// tensor with state offset = offset; a ZeRO rank's spans are its slices, with compact state offsets.
// The arithmetic is the backend's adamw op (core/adamw_host.c on the CPU: PyTorch's AdamW, element by
// element); optim/offload.h runs the same step in host memory.
#ifndef KILN_OPTIM_ADAMW_H
#define KILN_OPTIM_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "core/ops.h"
#include "model/params.h"

// One step's hyperparameters. The global gradient norm comes separately (kiln_adamw_grad_norm, or the
// data-parallel layer's sum over ranks): NaN/Inf norms skip nothing here; the trainer decides.
struct kiln_adamw_hparams {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_clip;         // 0 = off
    float grad_scale;        // multiplies raw gradients (1 / accumulation when dloss did not already average)
    int step;                // 1-based
    int stochastic_rounding; // round the bf16 weight copy stochastically (mixed-precision backends)
    uint64_t seed;           // with step, seeds the rounding so that runs stay repeatable
};

// The hyperparameters of a step (learning rate, the clipping scale from grad_norm, the rounding seed) into a,
// whose buffers and spans the caller sets (the offloaded optimizer's host buffers, a chunk's spans).
void kiln_adamw_args_from(const struct kiln_adamw_hparams *h, double grad_norm, struct kiln_adamw_args *a);

// Where a step reads and writes: backend memory.
struct kiln_adamw_buffers {
    float *params;      // f32 master weights: at flat offsets, or at state offsets with params_compact
    void *weights;      // act: their compute copy, laid out as params; NULL (or params) where it aliases them
    const void *grads;  // grad dtype: at flat offsets, or at state offsets with grads_compact
    float *m, *v;       // f32 moments, at state offsets
    int grads_compact;  // a ZeRO-2/3 rank's reduced shard
    int params_compact; // a ZeRO-3 rank's shard of the weights (master and compute copy)
};

// AdamW over spans (host memory, each with its state offset into m and v) of b's buffers.
void kiln_adamw_step(struct kiln_backend *be, const struct kiln_adamw_buffers *b,
                     const struct kiln_param_span *spans, int n_spans, const struct kiln_adamw_hparams *h,
                     double grad_norm);

// The spans of a whole update: one per tensor of the table, padding excluded, state offset = offset, and
// weight decay on the tensors the table marks (2-D weights). malloc'd; *n gets the count.
struct kiln_param_span *kiln_adamw_table_spans(const struct kiln_param_table *pt, int *n);

// sqrt of the sum of squares of n gradient elements (grad dtype, backend memory): a process's whole gradient
// norm. The data-parallel layer sums its ranks' squares before the root (kiln_dp_grad_norm).
double kiln_adamw_grad_norm(struct kiln_backend *be, const void *grads, size_t n);

#endif
