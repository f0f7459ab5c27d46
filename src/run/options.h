// The run's options: the model's shape (model/config.h) and everything around it (data, batch, optimizer,
// parallelism, checkpoints, guards), presets, parsing and validation.
//
// Every option has one name, used as `--name=value` on the command line and as `name = value` in a config
// file. The option table in options.c is the single source of truth for names, types, ranges and help.
#ifndef KILN_RUN_OPTIONS_H
#define KILN_RUN_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/ops.h"
#include "model/config.h"
#include "parallel/sp.h"
#include "util/error.h"

enum kiln_schedule { KILN_SCHED_COSINE = 0, KILN_SCHED_LINEAR, KILN_SCHED_CONSTANT, KILN_SCHED_WSD };

enum kiln_grad_dtype { KILN_GRAD_AUTO = 0, KILN_GRAD_FP32, KILN_GRAD_BF16 };
// what lives in host memory (bits): the optimizer's state, the layer inputs kept for the recompute, or both
enum kiln_zero3_accumulate { KILN_ACCUMULATE_SHARDED = 0, KILN_ACCUMULATE_WHOLE };
enum kiln_offload {
    KILN_OFFLOAD_NONE = 0,
    KILN_OFFLOAD_OPTIMIZER = 1,
    KILN_OFFLOAD_ACTIVATIONS = 2,
    KILN_OFFLOAD_ALL = 3
};

struct kiln_config {
    char preset[64];
    struct kiln_model_config model;

    // data
    char data[1024]; // shard glob, or "" for the embedded Tiny Shakespeare
    char val_data[1024];
    char tokenizer[1024]; // "char", "gpt2", or the path of a Hugging Face tokenizer.json (data/tokenizer.h)
    float val_fraction; // for a single text source: the tail fraction held out (0.1)

    // batch
    int batch_size;          // B, sequences per micro-step
    int seq_len;             // T
    long total_batch_tokens; // tokens per optimizer step; 0 = B*T (no accumulation)

    // optimization
    int max_steps;
    float lr;
    float final_lr_frac; // the schedule decays to lr * final_lr_frac
    int warmup_steps;
    enum kiln_schedule schedule;
    float wsd_decay_frac; // WSD: fraction of steps spent decaying at the end
    float beta1, beta2, eps, weight_decay;
    float grad_clip; // 0 = off
    float z_loss;
    int stochastic_rounding; // bf16 weight copy rounded stochastically (CUDA)

    // evaluation and logging
    int eval_every;
    int eval_steps;
    int log_every;
    int sample_every; // print a short sample every N steps (0 = never)
    int quiet;

    // run
    uint64_t seed;
    char device[16]; // cpu, cuda, auto
    int threads;     // CPU threads (0 = all)
    int deterministic;
    enum kiln_recompute recompute;
    enum kiln_grad_dtype grad_dtype; // parameter gradients; kiln_config_grad_dtype resolves auto
    double peak_flops;               // override for MFU; 0 = from the device table
    char out[1024];                  // run directory ("" = none)

    // many processes (docs/distributed.md)
    char comm[16];     // auto, nccl, mpi, single: the transport (parallel/comm/comm.h)
    int zero;          // 0 DDP, 1 optimizer state sharded, 2 gradients too, 3 parameters too (ZeRO-1/2/3);
                       // -1 auto until kiln_config_resolve
    int prefetch;      // ZeRO-3: layers gathered ahead of the computing one (1 or 2)
    int zero3_reshard; // ZeRO-3: a layer's gathered weights go after its forward (1), or stay to its
                       // backward (0)
    enum kiln_zero3_accumulate zero3_accumulate; // ZeRO-3: where gradients accumulate across micro-steps
    enum kiln_offload offload;                   // where the optimizer state lives
    float bucket_mb;                   // gradient bucket size for DDP's overlapped reduction, in MiB
    enum kiln_grad_dtype reduce_dtype; // the gradients' dtype on the wire: AUTO/FP32 = fp32, BF16 = bf16
    int world; // ranks: not an option but the job's size, set by the trainer from the launcher's
               // environment (1 for one process); the micro-steps follow from world / sp
    int tp;    // tensor parallelism: ranks that split each layer (world = tp x sp x data-parallel)
    int tp_sp; // and Megatron's sequence parallelism inside each tensor-parallel group
    int tp_overlap; // with tp_sp: its collectives under the GEMMs (1 ring) or not (0): enum kiln_tp_overlap
    int tp_keep_gathered; // with tp_sp: column-parallel inputs kept for the backward (struct kiln_tp_layout)
    int sp;    // sequence parallelism: ranks that share each sequence (world = tp x sp x data-parallel)
    enum kiln_sp_mode sp_mode;
    int sp_ulysses; // hybrid: ranks of each Ulysses group (0: the ranks per node), the ring the rest

    // precision (precision/fp8.h; run/trainer.c maps these to struct kiln_fp8_opts)
    int precision;   // 0 bf16 (the backend's own precision: f32 on the CPU), 1 fp8
    int fp8_recipe;  // enum kiln_fp8_recipe: tensorwise, rowwise, delayed
    int fp8_grad;    // the gradients' format: 0 e5m2, 1 e4m3
    int fp8_head;    // the LM head in FP8 too
    int fp8_history; // delayed: steps of amax history
    int fp8_all_gather; // ZeRO-3: the layers' linear weights gathered as FP8 codes

    // checkpoints and resume
    int checkpoint;    // write checkpoints at all (0: none, for benchmarks)
    int save_model;    // write RUN/model.safetensors at the end (0: metrics only, for benchmarks)
    int ckpt_every;    // steps between checkpoints (0 = only at the end and on signals)
    int keep_last;     // keep the newest K checkpoints (0 = all)
    int keep_every;    // also keep every checkpoint whose step is a multiple of M (0 = off)
    char resume[1024]; // auto (newest complete checkpoint in --out), never, or a checkpoint directory

    // health guards
    float
        spike_z; // skip a step whose loss or grad norm is this many std devs above the recent mean (0 = off)
    int spike_window;  // steps in the running statistics
    int max_bad_steps; // stop after this many consecutive skipped steps

    // cluster operations (docs/operations.md)
    float hang_timeout; // seconds without progress before the watchdog dumps RUN/hang/ and aborts (0 = off)
    char tensorboard[1024]; // TensorBoard event directory ("" = none)

    // fault injection, for tests only (docs/runs.md)
    char inject_nan[256];  // "STEP,STEP,...": make these steps' loss and grad norm NaN
    int inject_crash;      // abort() before step N of a run that started fresh (0 = off), checkpoints written
    char inject_stall[64]; // "RANK:STEP": that rank sleeps before step STEP, forever (the watchdog's tests)
};

// Fills cfg with the defaults and the named preset ("shakespeare-char" when NULL).
int kiln_config_init(struct kiln_config *cfg, const char *preset, struct kiln_error *err);

// Parses `--name=value` flags and `--config FILE` / `--config=FILE` (a file of `name = value` lines,
// '#' comments, also at the end of a line after a blank, optional [sections] ignored; a directory is
// refused). Order: preset, then the config file, then flags, whatever order they were written in.
// Positional arguments are an error. Returns 0, or fills err (exit code 2).
int kiln_config_parse(struct kiln_config *cfg, int argc, char **argv, struct kiln_error *err);

// Sets one option by name; `where` names the source for messages ("--lr", "cfg.ini:12").
int kiln_config_set(struct kiln_config *cfg, const char *name, const char *value, const char *where,
                    struct kiln_error *err);

// Checks cross-field constraints (heads divide dims, T <= block size, ...). Call after the vocab is known.
int kiln_config_validate(const struct kiln_config *cfg, struct kiln_error *err);

// Micro-steps per optimizer step on each rank: total-batch / (batch * seq * world), 1 without gradient
// accumulation. So the same --total-batch trains the same model on 1 or 8 ranks.
// The data-parallel ranks: world / (tp x sp), the groups that read different sequences
int kiln_config_dp(const struct kiln_config *c);
// Sets the world size and what "auto" left to it: --zero=auto becomes 1 with several data-parallel ranks, else 0.
void kiln_config_resolve(struct kiln_config *c, int world);
// The ZeRO level c runs with: --zero, or what auto becomes at c's world size.
int kiln_config_zero(const struct kiln_config *c);
// The same over dp data-parallel ranks (a plan for another world size than c's).
int kiln_config_zero_at(const struct kiln_config *c, int dp);
int kiln_config_micro_steps(const struct kiln_config *cfg);
// The parameter-gradient dtype of a run on a mixed-precision backend (mixed = 1: bf16 activations, as the
// GPU's) or on the fp32 reference (mixed = 0): KILN_BF16 when asked for, or for auto on a mixed backend with
// one micro-step per optimizer step (each gradient is then written once per step and never summed in bf16);
// else KILN_F32. Validation refuses bf16 where it would accumulate or where the device is the CPU.
enum kiln_dtype kiln_config_grad_dtype(const struct kiln_config *cfg, int mixed);

// Writes every option as `name = value` (the format --config reads back).
void kiln_config_write(const struct kiln_config *cfg, FILE *f);
// The option table walked by index (i < kiln_config_n_options()): an option's name, and its value in cfg
// formatted as kiln_config_write writes it (run/agree.c compares every rank's).
size_t kiln_config_n_options(void);
const char *kiln_config_option_name(size_t i);
void kiln_config_option_value(const struct kiln_config *cfg, size_t i, char *buf, size_t cap);

// Writes the options as kiln_config_write does, without its header line, and without the testing-only
// options (fault injection) unless all; returns how many it left out (for `kiln info`).
int kiln_config_print(const struct kiln_config *cfg, FILE *f, int all);

// Prints the option table with help text, each option's allowed values and its default (for `kiln help
// train`); the testing-only options only when all.
void kiln_config_print_help(FILE *f, int all);
// The vocabulary size of the published model whose shape preset copies, where the preset trains with
// another (llama-8b: Llama 3's 128,256 tokens, trained here with GPT-2's), and *whose ("Llama 3 8B's");
// 0 when the preset's is that model's own or the preset is unknown.
int kiln_config_preset_ref_vocab(const char *preset, const char **whose);
// Names of the presets, space-separated.
const char *kiln_config_preset_names(void);

// The same, for the named options only (names: NULL-terminated; for `kiln help info`).
void kiln_config_print_help_only(FILE *f, const char *const *names);

static inline struct kiln_sp_opts kiln_config_sp(const struct kiln_config *c) {
    return (struct kiln_sp_opts){c->sp, c->sp_mode, c->sp_ulysses, c->seq_len, &c->model};
}

#endif
