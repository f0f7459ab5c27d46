// kiln info: the resolved config, what the model costs, and what this machine offers.
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "cmd/cmd.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "dist/comm.h"
#include "train/tuning.h"
#include "train/embedded.h"

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
}

int cmd_info(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help")) {
            char *h[] = {"info"};
            return cmd_help(1, h);
        }
    struct kiln_config cfg;
    struct kiln_error err = {0};
    if (kiln_config_parse(&cfg, argc, argv, &err))
        return kiln_error_print(&err);
    // the vocabulary size comes from the tokenizer
    if (!strcmp(cfg.tokenizer, "char")) {
        size_t n;
        const char *text = kiln_embedded_shakespeare(&n);
        struct kiln_tokenizer *t = kiln_chartok_from_text(text, n);
        cfg.model.vocab_size = kiln_tokenizer_vocab_size(t);
        kiln_tokenizer_free(t);
    } else {
        struct kiln_tokenizer *t;
        if (kiln_tokenizer_open(&t, cfg.tokenizer, NULL, &err))
            return kiln_error_print(&err);
        cfg.model.vocab_size = kiln_tokenizer_vocab_size(t);
        kiln_tokenizer_free(t);
    }
    if (kiln_config_validate(&cfg, &err))
        return kiln_error_print(&err);

    kiln_config_write(&cfg, stdout);
    struct kiln_param_table pt;
    kiln_params_build(&pt, &cfg.model);
    const struct kiln_model_config *m = &cfg.model;
    printf("\nmodel: %d layers, %d heads (%d kv), dim %d, head size %d, mlp hidden %d, vocab %d (padded %d)\n",
           m->n_layer, m->n_head, kiln_model_kv_heads(m), m->n_embd, kiln_model_head_size(m), kiln_model_mlp_hidden(m),
           m->vocab_size, kiln_model_padded_vocab(m));
    printf("parameters: %zu (%.2fM), %d tensors\n", pt.n_params, pt.n_params / 1e6, pt.n);
    double fpt = kiln_model_flops_per_token(m, pt.n_params, cfg.seq_len, 0);
    double fptc = kiln_model_flops_per_token(m, pt.n_params, cfg.seq_len, 1);
    printf("FLOPs per token (T=%d): %.4g (6N + 12LHQT, for mfu), %.4g (causal, for mfu_causal)\n", cfg.seq_len, fpt,
           fptc);
    printf("FLOPs per step: %.4g (B=%d)\n", fpt * cfg.batch_size * cfg.seq_len, cfg.batch_size);
    kiln_params_free(&pt);

    struct kiln_gpt_opts go = {.B = cfg.batch_size, .T = cfg.seq_len, .recompute = cfg.recompute, .training = 1};
    struct kiln_mem_plan plan;
    printf("\n");
    kiln_gpt_tuning_from_env(&go);
    kiln_gpt_plan(m, &go, KILN_F32, KILN_F32, 1, &plan);
    print_plan("cpu: f32 everything", &plan, go.B * go.T);
    // the gradient dtype a CUDA run of this config gets (the trainer makes the same choice)
    enum kiln_dtype grad = kiln_config_grad_dtype(&cfg, 1);
    kiln_gpt_tuning_from_env(&go);
    kiln_gpt_plan(m, &go, KILN_BF16, grad, 0, &plan);
    print_plan(grad == KILN_BF16 ? "cuda: bf16 weights, activations and gradients, f32 master and AdamW"
                                 : "cuda: bf16 weights and activations, f32 master, gradients and AdamW",
               &plan, go.B * go.T);
    printf("\n");
    kiln_backends_describe(stdout);
    printf("transports compiled: %s\n", kiln_comm_compiled());
    return 0;
}
