// kiln info: the resolved config, what the model costs, and what this machine offers.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "cmd/cmd.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "optim/state.h"
#include "parallel/comm/comm.h"
#include "parallel/dp.h"
#include "precision/fp8.h"
#include "run/plan.h"
#include "parallel/sp.h"
#include "parallel/tp.h"
#include "run/embedded.h"
#include "run/knobs.h"
#include "run/tuning.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static void print_plan(const char *label, const struct kiln_mem_plan *p, int tokens) {
    printf("memory (%s):\n", label);
    printf("  parameters (f32 master)  %9.3f GiB\n", p->params_bytes / GIB);
    printf("  compute weights          %9.3f GiB\n", p->weights_bytes / GIB);
    printf("  gradients                %9.3f GiB\n", p->grads_bytes / GIB);
    printf("  optimizer (AdamW m, v)   %9.3f GiB\n", p->optim_bytes / GIB);
    printf("  activations              %9.3f GiB\n", p->acts_bytes / GIB);
    printf("    of which shared scratch %8.3f GiB (the LM head in %d chunks of at most %d rows)\n",
           p->scratch_bytes / GIB, (tokens + p->classifier_rows - 1) / p->classifier_rows,
           p->classifier_rows);
    printf("  total                    %9.3f GiB\n", p->total_bytes / GIB);
    if (p->host_bytes)
        printf("  host memory (offloaded activations) %9.3f GiB\n", p->host_bytes / GIB);
}

// Data parallelism's share of rank 0's memory (the ranks' differ by an element a bucket at most): what the
// Why the data-parallel level and the gradients' dtype are what they are (docs/distributed.md, Strategies).
static void print_dp_choice(const struct kiln_config *cfg, int zero_auto) {
    if (zero_auto)
        printf("data parallelism: zero %d (auto: ZeRO-1 over %d data-parallel ranks moves 6 bytes a parameter "
               "where DDP's all-reduce moves 8, and keeps 1/%d of the AdamW state; --zero=0 for DDP)\n",
               cfg->zero, kiln_config_dp(cfg), kiln_config_dp(cfg));
    if (cfg->reduce_dtype != KILN_GRAD_BF16)
        printf("gradients between ranks: fp32 (--reduce-dtype=bf16 is faster on GPUs, 96.4%% of one H100's "
               "speed a GPU against 92.8%% for ZeRO-1 on 4, but rounds every partial sum to bf16)\n");
}

// model holds under --zero/--offload, and what dp.c adds. The sharded state is what falls as 1/N.
static void print_rank_plan(const char *label, const struct kiln_config *cfg, const struct kiln_knobs *knobs,
                            const struct kiln_param_table *pt, int world, const struct kiln_sp_layout *sp,
                            enum kiln_dtype act, enum kiln_dtype grad, int alias) {
    struct kiln_rank_plan rp;
    kiln_rank_plan(cfg, knobs, pt, world, sp, cfg->recompute, act, grad, alias, &rp);
    const struct kiln_mem_plan *p = &rp.model;
    size_t state = p->params_bytes + p->weights_bytes + p->grads_bytes + p->optim_bytes + rp.dp.grad_shard;
    printf("per rank (%s; zero %d, %d ranks%s):\n", label, cfg->zero, world,
           rp.dpo.offload ? ", optimizer offloaded" : "");
    if (cfg->tp > 1)
        printf(
            "  tensor parallelism: tp %d x %d data- and sequence-parallel ranks, %s; each rank holds 1/%d of "
            "the heads, MLP width and vocabulary; buffers %.3f GiB%s\n",
            cfg->tp, world / cfg->tp,
            cfg->tp_sp ? "Megatron's sequence parallelism inside the group (norms and residual on 1/tp of "
                         "the rows)"
                       : "every rank holding every row",
            cfg->tp, rp.tp_bytes / GIB,
            rp.tp_keep ? " (with the column-parallel layers' gathered inputs kept for the backward)" : "");
    if (sp->sp > 1)
        printf("  sequence parallelism: sp %d (%d Ulysses x %d ring) x dp %d, %d of %d tokens a rank, "
               "buffers %.3f GiB (q, k, v: %s)\n",
               sp->sp, sp->ulysses, sp->ring, sp->dp, sp->T_local, sp->T, rp.sp_bytes / GIB,
               kiln_sp_qkv_place(sp, &cfg->model, cfg->batch_size));
    printf("  sharded state: %zu bytes (%.3f GiB: master %.3f, compute copy %.3f, gradients %.3f, moments "
           "%.3f)\n",
           state, state / GIB, p->params_bytes / GIB, p->weights_bytes / GIB,
           (p->grads_bytes + rp.dp.grad_shard) / GIB, p->optim_bytes / GIB);
    printf("  gradient staging %.3f GiB, gathered weights %.3f GiB%s, activations %.3f GiB\n",
           rp.dp.staging / GIB, rp.dp.gathered / GIB,
           rp.dpo.fp8_groups && rp.dpo.zero == 3 ? " (the layers' linear weights as FP8 codes)" : "",
           p->acts_bytes / GIB);
    if (rp.attn_ws)
        printf("  attention workspace %.3f GiB (dQ accumulator, RoPE's rotated q and k)\n", rp.attn_ws / GIB);
    if (rp.dpo.accumulate_whole) // counted in the gradients above, but whole on every rank: it does not fall
                                 // as 1/N
        printf("  of the gradients, whole on every rank (--zero3-accumulate=whole): %.3f GiB\n",
               p->grads_bytes / GIB);
    if (rp.dpo.offload)
        printf("  host memory (offload): %zu bytes (%.3f GiB)\n", rp.dp.host, rp.dp.host / GIB);
    printf("  per rank: %zu bytes (%.3f GiB) on the %s\n", rp.total, rp.total / GIB, alias ? "cpu" : "gpu");
}

// Whether a rank's GPU plan fits GPU 0 here, by the budget --recompute=auto uses (its free memory less the
// margin; KILN_MEM_BUDGET_MB stands in for it, as on a machine without a GPU). Nothing when there is neither.
static void print_fit(size_t on_gpu, const struct kiln_knobs *knobs) {
    size_t free_b = kiln_backend_gpu_free(0), budget = kiln_recompute_budget(free_b, knobs);
    if (!budget)
        return;
    int knob = knobs->mem_budget_mb > 0; // KILN_MEM_BUDGET_MB
    printf("\nfits %s: %s, %.3f GiB planned a rank of a %.3f GiB budget",
           knob ? "KILN_MEM_BUDGET_MB" : "GPU 0", on_gpu <= budget ? "yes" : "no", on_gpu / GIB,
           budget / GIB);
    if (!knob)
        printf(" (%.3f GiB free, less 4%% and 1 GiB)", free_b / GIB);
    printf("\n");
    if (on_gpu > budget)
        printf("  less memory: more recompute (--recompute=auto takes the least that fits), "
               "--offload=activations or =optimizer, --zero=3 over more ranks, or a smaller --batch\n");
}

// --recompute=auto: each candidate's per-rank plan on a GPU; the trainer takes the first that fits the GPU's
// free memory (less its margin, run/trainer.c), and act on the CPU, which states no limit. The rest of info
// plans with the CPU's choice (selective with --offload=activations).
static enum kiln_recompute print_auto(const struct kiln_config *cfg, const struct kiln_knobs *knobs,
                                      const struct kiln_param_table *pt, int world,
                                      const struct kiln_sp_layout *sp, enum kiln_dtype grad) {
    const enum kiln_recompute *order = kiln_recompute_by_memory;
    printf(
        "\n--recompute=auto: the first of these whose plan fits the GPU's free memory (cuda, per rank):\n");
    int first = cfg->offload & KILN_OFFLOAD_ACTIVATIONS ? 3 : 0;
    for (int i = first; i < 5; i++) {
        struct kiln_rank_plan rp;
        kiln_rank_plan(cfg, knobs, pt, world, sp, order[i], KILN_BF16, grad, 0, &rp);
        printf("  %-10s %.3f GiB\n", kiln_recompute_name(order[i]), rp.total / GIB);
    }
    // with KILN_MEM_BUDGET_MB, what the trainer would take under it with this machine's CPU (f32) plans
    size_t budget = kiln_recompute_budget(0, knobs), planned = 0;
    if (budget) {
        enum kiln_recompute rc = kiln_recompute_auto(cfg, knobs, pt, world, sp, KILN_F32,
                                                     kiln_config_grad_dtype(cfg, 0), 1, budget, &planned);
        printf("under KILN_MEM_BUDGET_MB (%zu bytes), on the cpu: %s (planned %zu bytes)\n", budget,
               kiln_recompute_name(rc), planned);
        return rc;
    }
    return first ? KILN_RECOMPUTE_SELECTIVE : KILN_RECOMPUTE_ACT;
}

// The first line of --strategies' and --lengths' tables; returns the budget their cells are marked against
// (GPU 0's free memory less auto's margin, or KILN_MEM_BUDGET_MB; 0: none, no marks).
static size_t print_table_head(const char *title, const struct kiln_config *cfg,
                               const struct kiln_knobs *knobs, int world, const char *what) {
    size_t budget = kiln_recompute_budget(kiln_backend_gpu_free(0), knobs);
    printf("\n%s (cuda, GiB a rank on the GPU at %d rank%s, B=%d%s", title, world, world > 1 ? "s" : "",
           cfg->batch_size, what);
    if (budget)
        printf("; * fits %s's %.3f GiB", knobs->mem_budget_mb > 0 ? "KILN_MEM_BUDGET_MB" : "GPU 0",
               budget / GIB);
    printf("):\n");
    return budget;
}

// --strategies: the per-rank GPU plan of each data-parallel strategy (DDP, ZeRO-1/2/3, ZeRO-3 with the
// optimizer in host memory) under each recompute mode, for this model, batch and --world: the two numbers
// users pick a strategy by are time and memory, and this is the memory, before a GPU is spent. Marked where
// it fits GPU 0's budget (or KILN_MEM_BUDGET_MB's), as --recompute=auto judges it; the last column is the
// offloaded optimizer's host memory. With --offload=activations only selective and block apply (a dash
// elsewhere).
static void print_strategies(const struct kiln_config *cfg, const struct kiln_knobs *knobs,
                             const struct kiln_param_table *pt, int world, const struct kiln_sp_layout *sp,
                             enum kiln_dtype grad) {
    static const struct {
        const char *name;
        int zero, offload;
    } rows[] = {{"DDP (--zero=0)", 0, 0},
                {"ZeRO-1", 1, 0},
                {"ZeRO-2", 2, 0},
                {"ZeRO-3", 3, 0},
                {"ZeRO-3 + optimizer offload", 3, 1}};
    int act_off = (cfg->offload & KILN_OFFLOAD_ACTIVATIONS) != 0;
    char what[64];
    snprintf(what, sizeof(what), ", T=%d", cfg->seq_len);
    size_t budget = print_table_head("strategies", cfg, knobs, world, what);
    printf("  %-28s", "strategy");
    for (int k = 0; k < 5; k++)
        printf(" %10s", kiln_recompute_name(kiln_recompute_by_memory[k]));
    printf(" %14s\n", "optimizer host");
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
        struct kiln_config c = *cfg;
        c.zero = rows[r].zero;
        c.offload =
            (cfg->offload & KILN_OFFLOAD_ACTIVATIONS) | (rows[r].offload ? KILN_OFFLOAD_OPTIMIZER : 0);
        if (c.zero != 3) { // ZeRO-3's own options mean nothing to the other levels
            c.zero3_reshard = 1;
            c.zero3_accumulate = KILN_ACCUMULATE_SHARDED;
        }
        printf("  %-28s", rows[r].name);
        size_t host = 0;
        for (int k = 0; k < 5; k++) {
            enum kiln_recompute rc = kiln_recompute_by_memory[k];
            if (act_off && rc != KILN_RECOMPUTE_SELECTIVE && rc != KILN_RECOMPUTE_BLOCK) {
                printf(" %10s", "-");
                continue;
            }
            struct kiln_rank_plan rp;
            kiln_rank_plan(&c, knobs, pt, world, sp, rc, KILN_BF16, grad, 0, &rp);
            printf(" %9.2f%s", rp.total / GIB, budget && rp.total <= budget ? "*" : " ");
            host = rp.dp.host; // the offloaded optimizer's (the same under every recompute mode)
        }
        printf(" %14.2f\n", host / GIB);
    }
}

// --lengths=T1,T2,...: the per-rank GPU plan at each sequence length (block size = T, as long-context runs
// set it) under each recompute mode, and with activation offload (selective and block; the host memory each
// takes in the last two columns), for this model, batch, --world and --sp: which mode a length needs on this
// GPU (* where it fits the budget, as --recompute=auto judges). A length the layout cannot split (--sp) says
// why.
static void print_lengths(const struct kiln_config *cfg, const struct kiln_knobs *knobs, const int *lengths,
                          int n, int world, enum kiln_dtype grad) {
    size_t budget = print_table_head("lengths", cfg, knobs, world, "");
    printf("  %10s", "tokens");
    for (int k = 0; k < 5; k++)
        printf(" %10s", kiln_recompute_name(kiln_recompute_by_memory[k]));
    printf(" %14s %14s   host GiB: selective+off, block+off\n", "selective+off", "block+off");
    for (int i = 0; i < n; i++) {
        struct kiln_config c = *cfg;
        c.seq_len = c.model.block_size = lengths[i];
        struct kiln_sp_layout sp;
        struct kiln_error err = {0};
        printf("  %10d", lengths[i]);
        int cross = world / (c.tp > 1 ? c.tp : 1);
        if (kiln_sp_plan(kiln_config_sp(&c), cross, 0, cross, &sp, &err)) {
            printf("  (%s)\n", err.msg);
            continue;
        }
        struct kiln_param_table pt;
        kiln_params_build(&pt, &c.model);
        size_t host[2] = {0, 0};
        for (int k = 0; k < 7; k++) {
            int off = k >= 5;
            enum kiln_recompute rc = off ? (k == 5 ? KILN_RECOMPUTE_SELECTIVE : KILN_RECOMPUTE_BLOCK)
                                         : kiln_recompute_by_memory[k];
            c.offload = (cfg->offload & KILN_OFFLOAD_OPTIMIZER) | (off ? KILN_OFFLOAD_ACTIVATIONS : 0);
            struct kiln_rank_plan rp;
            kiln_rank_plan(&c, knobs, &pt, world, &sp, rc, KILN_BF16, grad, 0, &rp);
            printf(off ? " %13.2f%s" : " %9.2f%s", rp.total / GIB, budget && rp.total <= budget ? "*" : " ");
            if (off)
                host[k - 5] = rp.model.host_bytes + rp.dp.host;
        }
        printf("   %9.2f %9.2f\n", host[0] / GIB, host[1] / GIB);
        kiln_params_free(&pt);
    }
}

// --lengths=LIST: removed from argv into lengths[] (at most max, each 1 .. 2^26); *n 0 when absent
static int take_lengths(int *argc, char **argv, int *lengths, int max, int *n, struct kiln_error *err) {
    *n = 0;
    int k = 0;
    for (int i = 0; i < *argc; i++) {
        if (strncmp(argv[i], "--lengths=", 10)) {
            argv[k++] = argv[i];
            continue;
        }
        const char *p = argv[i] + 10;
        *n = 0;
        do {
            char *end;
            long t = strtol(p, &end, 10);
            if (end == p || (*end && *end != ',') || (*end == ',' && !end[1]) || t < 1 || t > 1 << 26 ||
                *n == max)
                return kiln_errorf(
                    err, KILN_ERR_USAGE,
                    "bad value '%s' for lengths (--lengths): a comma-separated list of at most "
                    "%d token counts, each 1 to %d",
                    argv[i] + 10, max, 1 << 26);
            lengths[(*n)++] = (int)t;
            p = *end ? end + 1 : end;
        } while (*p);
    }
    *argc = k;
    return 0;
}

// --world=N (kiln info only: a training job's size comes from its launcher): removed from argv, 1 when absent
static int take_world(int *argc, char **argv, int *world, struct kiln_error *err) {
    *world = 1;
    int k = 0;
    for (int i = 0; i < *argc; i++) {
        if (strncmp(argv[i], "--world=", 8)) {
            argv[k++] = argv[i];
            continue;
        }
        char *end;
        long w = strtol(argv[i] + 8, &end, 10);
        if (end == argv[i] + 8 || *end || w < 1 || w > 1 << 20)
            return kiln_errorf(err, KILN_ERR_USAGE,
                               "bad value '%s' for world (--world): allowed range is 1 to %d", argv[i] + 8,
                               1 << 20);
        *world = (int)w;
    }
    *argc = k;
    return 0;
}

int cmd_info(int argc, char **argv, const struct kiln_knobs *knobs) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help")) {
            char *h[] = {"info"};
            return cmd_help(1, h, knobs);
        }
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--knobs")) { // the knobs alone: they need no model
            struct kiln_error err = {0};
            if (argc > 1) {
                kiln_errorf(&err, KILN_ERR_USAGE,
                            "knobs (--knobs): kiln info --knobs takes no other option; run it on its own");
                return kiln_error_print(&err);
            }
            kiln_knobs_print(knobs, stdout);
            return 0;
        }
    struct kiln_config cfg;
    struct kiln_error err = {0};
    int world, strategies = 0, all = 0;
    for (int i = 0, k = 0; i < argc; i++) { // --strategies and --all (kiln info only), removed from argv
        if (!strcmp(argv[i], "--strategies"))
            strategies = 1;
        else if (!strcmp(argv[i], "--all"))
            all = 1;
        else
            argv[k++] = argv[i];
        if (i == argc - 1)
            argc = k;
    }
    int lengths[32], n_lengths;
    if (take_world(&argc, argv, &world, &err) || take_lengths(&argc, argv, lengths, 32, &n_lengths, &err) ||
        kiln_config_parse(&cfg, argc, argv, &err))
        return kiln_error_print(&err);
    int zero_auto = cfg.zero < 0;
    kiln_config_resolve(&cfg, world);
    // the vocabulary size comes from the tokenizer
    if (!strcmp(cfg.tokenizer, "char")) {
        size_t n;
        const char *text = kiln_embedded_shakespeare(&n);
        struct kiln_tokenizer *t = kiln_chartok_from_text(text, n);
        cfg.model.vocab_size = kiln_tokenizer_vocab_size(t);
        kiln_tokenizer_free(t);
    } else {
        struct kiln_tokenizer *t;
        if (kiln_tokenizer_open_at(&t, cfg.tokenizer, NULL, kiln_knobs_source_dir(knobs), &err))
            return kiln_error_print(&err);
        cfg.model.vocab_size = kiln_tokenizer_vocab_size(t);
        kiln_tokenizer_free(t);
    }
    // the plan is rank 0's (hybrid's default Ulysses group: every rank, as on one node)
    // under --tp, sequence and data parallelism run over world / tp ranks, with a rank's share of the heads
    struct kiln_sp_layout sp;
    struct kiln_tp_layout tlo;
    if (kiln_config_validate(&cfg, &err) ||
        kiln_tp_plan(cfg.tp, cfg.tp_sp, world, 0, &cfg.model, &tlo, &err))
        return kiln_error_print(&err);
    struct kiln_sp_opts spo = kiln_config_sp(&cfg);
    struct kiln_model_config heads;
    kiln_model_heads_of(&cfg.model, tlo.tp > 1 ? &tlo.split : NULL, &heads);
    spo.model = &heads;
    if (kiln_sp_plan(spo, tlo.cross, 0, tlo.cross, &sp, &err))
        return kiln_error_print(&err);

    // the model first: what it is and what it costs; then the options that make the run
    struct kiln_param_table pt;
    kiln_params_build(&pt, &cfg.model);
    const struct kiln_model_config *m = &cfg.model;
    printf(
        "model: %s, %d layers, %d heads (%d kv), dim %d, head size %d, mlp hidden %d, vocab %d (padded %d), "
        "%s tokenizer\n",
        cfg.preset, m->n_layer, m->n_head, kiln_model_kv_heads(m), m->n_embd, kiln_model_head_size(m),
        kiln_model_mlp_hidden(m), m->vocab_size, kiln_model_padded_vocab(m), cfg.tokenizer);
    printf("parameters: %zu (%.2fM), %d tensors\n", pt.n_params, pt.n_params / 1e6, pt.n);
    const char *whose = NULL;
    int ref_vocab = kiln_config_preset_ref_vocab(cfg.preset, &whose);
    if (ref_vocab && ref_vocab != m->vocab_size) { // the published model's vocabulary, at this shape
        struct kiln_model_config rm = *m;
        rm.vocab_size = ref_vocab;
        struct kiln_param_table rpt;
        kiln_params_build(&rpt, &rm);
        printf("  note: this preset copies a shape, not its vocabulary: it trains with the %s tokenizer's %d "
               "tokens;\n  %s %d-token vocabulary would give %zu (%.2fM) parameters at this shape;\n"
               "  to train with it, give its Hugging Face directory's tokenizer.json: "
               "--tokenizer=DIR/tokenizer.json\n",
               cfg.tokenizer, m->vocab_size, whose, ref_vocab, rpt.n_params, rpt.n_params / 1e6);
        kiln_params_free(&rpt);
    }
    double fpt = kiln_model_flops_per_token(m, pt.n_params, cfg.seq_len, 0);
    double fptc = kiln_model_flops_per_token(m, pt.n_params, cfg.seq_len, 1);
    printf("FLOPs per token (T=%d): %.4g (6N + 12LHQT, for mfu), %.4g (causal, for mfu_causal)\n",
           cfg.seq_len, fpt, fptc);
    printf("FLOPs per step: %.4g (B=%d)\n", fpt * cfg.batch_size * cfg.seq_len, cfg.batch_size);
    if (cfg.precision) { // MFU stays counted against the bf16 peak, as the peers count it
        struct kiln_fp8_opts fo = {.recipe = (enum kiln_fp8_recipe)cfg.fp8_recipe,
                                   .grad_fmt = cfg.fp8_grad ? KILN_FP8_E4M3 : KILN_FP8_E5M2,
                                   .include_head = cfg.fp8_head,
                                   .history = cfg.fp8_history};
        char what[256];
        kiln_fp8_describe(&fo, cfg.device, what, sizeof(what));
        printf("precision: %s; MFU against the bf16 peak\n", what);
    } else {
        printf("precision: bf16 (the backend's: f32 on the CPU)\n");
    }

    printf("\nconfig (resolved; kiln train --config=FILE reads these lines):\n");
    int hidden = kiln_config_print(&cfg, stdout, all);
    if (hidden)
        printf("(%d fault-injection options, for tests, are not shown: kiln info --all)\n", hidden);
    if (cfg.recompute == KILN_RECOMPUTE_AUTO) {
        cfg.recompute = print_auto(&cfg, knobs, &pt, world, &sp, kiln_config_grad_dtype(&cfg, 1));
        printf("(the plans below: --recompute=%s)\n", kiln_recompute_name(cfg.recompute));
    }

    struct kiln_model_opts go = {.B = cfg.batch_size,
                               .T = cfg.seq_len,
                               .recompute = cfg.recompute,
                               .training = 1,
                               .offload_activations = (cfg.offload & KILN_OFFLOAD_ACTIVATIONS) != 0};
    struct kiln_mem_plan plan;
    // one process: the optimizer's state holds the master weights and the moments of every element
    struct kiln_optim_state_opts so = {.total = pt.total};
    struct kiln_optim_plan op;
    printf("\n");
    kiln_model_tuning(&go, knobs);
    kiln_model_plan(m, &go, KILN_F32, KILN_F32, 1, &plan);
    kiln_optim_state_plan(&so, KILN_F32, 1, &op);
    kiln_plan_add_optim(&plan, &op);
    print_plan("cpu: f32 everything", &plan, go.B * go.T);
    // the gradient dtype a CUDA run of this config gets (the trainer makes the same choice)
    enum kiln_dtype grad = kiln_config_grad_dtype(&cfg, 1);
    kiln_model_tuning(&go, knobs);
    kiln_model_plan(m, &go, KILN_BF16, grad, 0, &plan);
    kiln_optim_state_plan(&so, KILN_BF16, 0, &op);
    kiln_plan_add_optim(&plan, &op);
    print_plan(grad == KILN_BF16 ? "cuda: bf16 weights, activations and gradients, f32 master and AdamW"
                                 : "cuda: bf16 weights and activations, f32 master, gradients and AdamW",
               &plan, go.B * go.T);
    size_t ws = kiln_attn_workspace_bytes(m, go.B, go.T);
    printf("  + attention workspace   %8.3f GiB (the backend's own: dQ accumulator, RoPE's q and k)\n",
           ws / GIB);
    printf("  total on the GPU        %8.3f GiB\n", (plan.total_bytes + ws) / GIB);
    size_t on_gpu = plan.total_bytes + ws; // what one rank holds on its GPU
    if (world > 1 || cfg.zero || (cfg.offload & KILN_OFFLOAD_OPTIMIZER)) {
        printf("\n");
        print_rank_plan("cpu", &cfg, knobs, &pt, world, &sp, KILN_F32, kiln_config_grad_dtype(&cfg, 0), 1);
        print_rank_plan("cuda", &cfg, knobs, &pt, world, &sp, KILN_BF16, grad, 0);
        struct kiln_rank_plan rp;
        kiln_rank_plan(&cfg, knobs, &pt, world, &sp, cfg.recompute, KILN_BF16, grad, 0, &rp);
        on_gpu = rp.total;
        if (kiln_config_dp(&cfg) > 1)
            print_dp_choice(&cfg, zero_auto);
    }
    print_fit(on_gpu, knobs);
    if (strategies)
        print_strategies(&cfg, knobs, &pt, world, &sp, grad);
    if (n_lengths)
        print_lengths(&cfg, knobs, lengths, n_lengths, world, grad);
    kiln_params_free(&pt);
    printf("\n");
    kiln_backends_describe(stdout);
    printf("transports compiled: %s\n", kiln_comm_compiled());
    return 0;
}
