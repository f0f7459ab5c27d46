// The per-rank memory plan and --recompute=auto (plan.h).
#include "run/plan.h"

#include <string.h>

#include "parallel/tp.h"
#include "run/tuning.h"

void kiln_rank_plan(const struct kiln_config *cfg, const struct kiln_knobs *k,
                    const struct kiln_param_table *pt, int world, const struct kiln_sp_layout *sp,
                    enum kiln_recompute rc, enum kiln_dtype act, enum kiln_dtype grad, int alias,
                    struct kiln_rank_plan *out) {
    memset(out, 0, sizeof(*out));
    // tensor parallelism: a rank holds its part of the model (pt may be the whole table: the part's is built
    // here), and data parallelism runs over world / tp ranks
    int tp = cfg->tp > 1 ? cfg->tp : 1;
    struct kiln_model_split split = {0};
    struct kiln_param_table part;
    if (tp > 1) {
        split = kiln_split_tensor_parallel(tp, cfg->tp_sp);
        kiln_params_build_split(&part, &cfg->model, &split);
        pt = &part;
        world = world / tp > 0 ? world / tp : 1;
    }
    // --zero=auto over this plan's data-parallel ranks (world / sp here)
    int zero = kiln_config_zero_at(cfg, world / (sp && sp->sp > 1 ? sp->sp : 1));
    struct kiln_dp_opts o = {.zero = zero,
                             .bucket_mb = cfg->bucket_mb,
                             .prefetch = cfg->prefetch,
                             .keep_gathered = !cfg->zero3_reshard,
                             .accumulate_whole = cfg->zero3_accumulate == KILN_ACCUMULATE_WHOLE,
                             .offload = (cfg->offload & KILN_OFFLOAD_OPTIMIZER) != 0};
    // --fp8-all-gather: the plan counts the codes' buffers (it reads no groups: any non-NULL stands for them)
    static const int fp8_groups_planned = 0;
    if (cfg->precision && cfg->fp8_all_gather)
        o.fp8_groups = &fp8_groups_planned;
    kiln_dp_tuning(&o, k);
    out->dpo = o;
    struct kiln_model_opts go = {.B = cfg->batch_size,
                               .T = sp->T_local,
                               .recompute = rc,
                               .training = 1,
                               .offload_activations = (cfg->offload & KILN_OFFLOAD_ACTIVATIONS) != 0,
                               .split = split};
    kiln_model_tuning(&go, k);
    struct kiln_optim_state_opts so = {.total = pt->total}; // without data parallelism: every element, flat
    if (world > 1 || zero || o.offload || tp > 1)
        kiln_dp_plan_memory(pt, &o, world, 0, act, grad, kiln_config_micro_steps(cfg), &go, &so, &out->dp);
    kiln_model_plan(&cfg->model, &go, act, grad, alias, &out->model);
    struct kiln_optim_plan op;
    kiln_optim_state_plan(&so, act, alias, &op);
    kiln_plan_add_optim(&out->model, &op);
    // sequence parallelism and attention see this rank's heads
    struct kiln_model_config heads;
    kiln_model_heads_of(&cfg->model, tp > 1 ? &split : NULL, &heads);
    if (tp > 1) {
        struct kiln_tp_layout lo = {.split = split};
        kiln_tp_plan_overlap(&lo, (enum kiln_tp_overlap)cfg->tp_overlap, cfg->tp_keep_gathered);
        out->tp_bytes = kiln_tp_buffer_bytes(&cfg->model, &split, cfg->batch_size, sp->T_local, act, grad,
                                             lo.keep_gathered);
        out->tp_keep = lo.keep_gathered;
        kiln_params_free(&part);
    }
    out->sp_bytes = kiln_sp_buffer_bytes(sp, &heads, cfg->batch_size, act);
    out->attn_ws = alias ? 0 : kiln_attn_workspace_bytes(&heads, cfg->batch_size, sp->T_local);
    out->total = out->model.total_bytes + out->dp.staging + out->dp.grad_shard + out->dp.gathered +
                 out->sp_bytes + out->attn_ws + out->tp_bytes;
}

void kiln_plan_add_optim(struct kiln_mem_plan *p, const struct kiln_optim_plan *o) {
    p->params_bytes += o->params_bytes;
    p->weights_bytes += o->weights_bytes;
    p->optim_bytes += o->optim_bytes;
    p->total_bytes += o->total_bytes;
}

size_t kiln_attn_workspace_bytes(const struct kiln_model_config *m, int B, int T) {
    size_t NH = (size_t)m->n_head, NKV = (size_t)kiln_model_kv_heads(m), HS = (size_t)kiln_model_head_size(m);
    size_t rows = (size_t)B * T;
    size_t bytes = rows * NH * HS * sizeof(float) + rows * NH * sizeof(float);
    if (m->pos == KILN_POS_ROPE)
        bytes += rows * (NH + NKV) * HS * 2;
    return bytes;
}

const enum kiln_recompute kiln_recompute_by_memory[5] = {KILN_RECOMPUTE_NONE, KILN_RECOMPUTE_ACT,
                                                         KILN_RECOMPUTE_MLP, KILN_RECOMPUTE_SELECTIVE,
                                                         KILN_RECOMPUTE_BLOCK};

enum kiln_recompute kiln_recompute_auto(const struct kiln_config *cfg, const struct kiln_knobs *k,
                                        const struct kiln_param_table *pt, int world,
                                        const struct kiln_sp_layout *sp, enum kiln_dtype act,
                                        enum kiln_dtype grad, int alias, size_t budget, size_t *planned) {
    const enum kiln_recompute *order = kiln_recompute_by_memory;
    int first = cfg->offload & KILN_OFFLOAD_ACTIVATIONS ? 3 : 0; // the offload needs whole-block recompute
    struct kiln_rank_plan p;
    for (int i = first; i < 5; i++) {
        kiln_rank_plan(cfg, k, pt, world, sp, order[i], act, grad, alias, &p);
        *planned = p.total;
        if (p.total <= budget || i == 4)
            return order[i];
    }
    return KILN_RECOMPUTE_BLOCK;
}

const char *kiln_recompute_name(enum kiln_recompute rc) {
    static const char *const names[] = {"none", "mlp", "block", "act", "selective", "auto"};
    return (unsigned)rc < sizeof(names) / sizeof(names[0]) ? names[rc] : "?";
}

size_t kiln_recompute_budget(size_t free_bytes, const struct kiln_knobs *k) {
    if (k && k->mem_budget_mb > 0) // (run/knobs.c validated it: above 0, below 1e12)
        return (size_t)(k->mem_budget_mb * 1048576.0);
    // The margin covers what the plan leaves out (cuBLASLt's workspace, the allocator's rounding). Measured
    // on H100s (2026-11-26, test_plan), with the attention workspace counted: the peaks run 0.0-1.2 GiB over
    // the plans, so 4% of the free memory (3.1 GiB of 78) and 1 GiB. (10% had kept --recompute=mlp out at 64k
    // tokens of the 1.3B shape, where it fits, peaking at 73.0 of 78.6 GiB free, and runs 2.7% faster than
    // selective.)
    return free_bytes > ((size_t)1 << 30) ? free_bytes - free_bytes / 25 - ((size_t)1 << 30) : 0;
}
