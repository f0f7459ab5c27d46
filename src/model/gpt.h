// The GPT model: forward, backward and KV-cache decoding, written once against the ops table.
#ifndef KILN_MODEL_GPT_H
#define KILN_MODEL_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/config.h"
#include "model/params.h"

// Bytes the model needs on its backend, planned up front (kiln info, the out-of-memory message, metrics).
struct kiln_mem_plan {
    size_t params_bytes;  // f32 master weights
    size_t weights_bytes; // compute copy in act dtype (0 when it aliases the master weights)
    size_t grads_bytes;
    size_t optim_bytes;   // AdamW m and v
    size_t acts_bytes;    // activations kept for backward, plus the scratch arena
    size_t scratch_bytes; // of acts_bytes: the arena, where one-slot buffers never live at once share memory
    int classifier_rows;  // rows per chunk of the LM head, whose logits chunk is in the arena
    size_t total_bytes;
};

struct kiln_gpt_opts {
    int B, T;                     // activation shapes to plan for
    enum kiln_recompute recompute;
    int training;                 // 0: no gradients or optimizer state (sampling, eval-only)
};

// Plans memory without allocating (act_bytes/grad_bytes from the backend's dtypes).
void kiln_gpt_plan(const struct kiln_model_config *m, const struct kiln_gpt_opts *o, enum kiln_dtype act,
                   enum kiln_dtype grad, int weights_alias_master, struct kiln_mem_plan *plan);

struct kiln_gpt;

// Allocates everything on the backend. Out of memory is an error that quotes the plan.
int kiln_gpt_create(struct kiln_gpt **out, const struct kiln_model_config *m, struct kiln_backend *be,
                    const struct kiln_gpt_opts *o, struct kiln_error *err);
void kiln_gpt_free(struct kiln_gpt *g);

const struct kiln_param_table *kiln_gpt_params(const struct kiln_gpt *g);
const struct kiln_mem_plan *kiln_gpt_mem_plan(const struct kiln_gpt *g);
// Peak memory so far, in bytes: the most the backend has held at once (the plan's buffers, and on CUDA its
// scratch and library workspaces too), or the plan's total if that is larger or the backend does not count.
size_t kiln_gpt_mem_peak(const struct kiln_gpt *g);
// Whether parallel blocks run their attention and MLP input projections as one GEMM: in the backward and
// decoding (*bwd) and in the forward (*fwd). Both 0 for sequential blocks; gpt.c's struct fusion says when.
void kiln_gpt_fused_projection(const struct kiln_gpt *g, int *fwd, int *bwd);

// Master weights <-> host f32 (t->total floats, padding included). Setting refreshes the compute copy.
void kiln_gpt_set_params(struct kiln_gpt *g, const float *host);
void kiln_gpt_get_params(struct kiln_gpt *g, float *host);
void kiln_gpt_get_grads(struct kiln_gpt *g, float *host);       // for tests and checkpoints
void kiln_gpt_get_optim(struct kiln_gpt *g, float *m_host, float *v_host);
void kiln_gpt_set_optim(struct kiln_gpt *g, const float *m_host, const float *v_host);
void kiln_gpt_init_params(struct kiln_gpt *g, uint64_t seed);

// Forward over a (B, T) batch of token ids (host memory). Returns the mean cross-entropy over targets >= 0.
// With dloss != 0 (training) it also runs the classifier's backward, so that kiln_gpt_backward can follow;
// dloss scales the summed per-token loss (1 / (tokens per optimizer step) for a mean).
double kiln_gpt_forward(struct kiln_gpt *g, const int32_t *inputs, const int32_t *targets, float dloss,
                        float z_loss);
// Accumulates parameter gradients (+=) for the last forward.
void kiln_gpt_backward(struct kiln_gpt *g);
void kiln_gpt_zero_grad(struct kiln_gpt *g);

// AdamW step over all parameters (decay on 2-D weights). Returns the global gradient norm before clipping
// (grad_scale is applied to the raw gradients first). NaN/Inf norms skip nothing here; the trainer decides.
struct kiln_adamw_hparams {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_clip;   // 0 = off
    float grad_scale;  // multiplies raw gradients (1 / accumulation when dloss did not already average)
    int step;          // 1-based
    int stochastic_rounding; // round the bf16 weight copy stochastically (mixed-precision backends)
    uint64_t seed;     // with step, seeds the rounding so that runs stay repeatable
};
double kiln_gpt_grad_norm(struct kiln_gpt *g);
void kiln_gpt_adamw(struct kiln_gpt *g, const struct kiln_adamw_hparams *h, double grad_norm);

// KV-cache decoding for sampling: prepares caches for B sequences of up to maxT tokens, then each step feeds
// one token per sequence at position pos and returns the logits (B, V) in host f32.
int kiln_gpt_decode_begin(struct kiln_gpt *g, int B, int maxT, struct kiln_error *err);
void kiln_gpt_decode_step(struct kiln_gpt *g, const int32_t *tokens, int pos, float *logits);

#endif
