// The memory a training rank plans for: the model's plan (kiln_model_plan) under the data- and
// sequence-parallel options, and what dp.c and sp.c add. kiln info prints it; --recompute=auto chooses by it.
#ifndef KILN_RUN_PLAN_H
#define KILN_RUN_PLAN_H

#include "run/knobs.h"
#include "run/options.h"
#include "model/model.h"
#include "model/params.h"
#include "optim/state.h"
#include "parallel/dp.h"
#include "parallel/sp.h"

struct kiln_rank_plan {
    struct kiln_mem_plan model; // what the model and the optimizer's state hold (ZeRO shards the state)
    struct kiln_dp_mem dp;      // what data parallelism adds (zero when it is off)
    struct kiln_dp_opts dpo;    // the options it was planned with
    size_t sp_bytes;            // sequence parallelism's buffers
    size_t tp_bytes;            // tensor parallelism's (kiln_tp_buffer_bytes)
    int tp_keep;                // and they hold the gathered inputs (--tp-keep-gathered, where it applies)
    size_t attn_ws;             // the GPU's attention workspace (kiln_attn_workspace_bytes; 0 on the CPU)
    size_t total;               // on the device (on the CPU: kiln's counted allocations)
};

// Rank 0's plan (the ranks' differ by an element a bucket at most) with recompute rc, for a backend of these
// dtypes (alias: the compute weights are the master, as on the CPU). Data parallelism is counted where the
// trainer runs it: several ranks, --zero or --offload=optimizer. Under --tp the rank holds its part of the
// model (pt may be the whole model's table or the part's) and data parallelism runs over world / tp ranks;
// sp is the layout over those. k: the knobs that tune the model and data
// parallelism (run/tuning.h; NULL: the defaults).
void kiln_rank_plan(const struct kiln_config *cfg, const struct kiln_knobs *k,
                    const struct kiln_param_table *pt, int world, const struct kiln_sp_layout *sp,
                    enum kiln_recompute rc, enum kiln_dtype act, enum kiln_dtype grad, int alias,
                    struct kiln_rank_plan *out);

// Adds the optimizer state's plan (master weights, a compact compute copy, moments) to p's fields and total:
// what kiln info prints, --recompute=auto weighs and the model's out-of-memory message quotes.
void kiln_plan_add_optim(struct kiln_mem_plan *p, const struct kiln_optim_plan *o);

// What the CUDA backend's attention keeps in its own scratch for B sequences of T tokens (a rank's T under
// sequence parallelism), beyond the model's plan: the backward's f32 dQ accumulator (B T NH HS), q and k
// rotated for RoPE (B T (NH + NKV) HS, bf16) and D = rowsum(dO O) (B NH T, f32). They grow with T: on an H100
// at 128k-256k tokens of the 1.3B shape they were most of what the peaks ran over the plans (2.6 and 5.2
// GiB; with them counted, 0.6 and 1.2).
size_t kiln_attn_workspace_bytes(const struct kiln_model_config *m, int B, int T);

// The recompute modes from the most memory (and the fastest) to the least: none, act, mlp, selective, block.
extern const enum kiln_recompute kiln_recompute_by_memory[5];

// --recompute=auto: the fastest of none, act, mlp, selective and block (in that order, each holding less)
// whose plan fits `budget` bytes; with --offload=activations only selective and block, which it takes.
// block when none fits (the run then fails as it would have). *planned gets the choice's total.
enum kiln_recompute kiln_recompute_auto(const struct kiln_config *cfg, const struct kiln_knobs *k,
                                        const struct kiln_param_table *pt, int world,
                                        const struct kiln_sp_layout *sp, enum kiln_dtype act,
                                        enum kiln_dtype grad, int alias, size_t budget, size_t *planned);
const char *kiln_recompute_name(enum kiln_recompute rc);
// auto's budget: the KILN_MEM_BUDGET_MB knob where set (k->mem_budget_mb: tests, kiln info), else a device's
// free bytes less what the plans do not count (4% of them and 1 GiB: cuBLASLt's workspace, the allocator's
// rounding; H100s' peaks ran 0.0-1.2 GiB over the plans); 0: no limit (the CPU states none). k NULL: the
// defaults (no KILN_MEM_BUDGET_MB).
size_t kiln_recompute_budget(size_t free_bytes, const struct kiln_knobs *k);

#endif
