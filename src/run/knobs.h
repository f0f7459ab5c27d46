// The KILN_* knobs: environment variables for tests, comparisons and measurements (kernel choices, test
// delays, memory budgets, traces), as opposed to the run's options (--flags, run/options.h), which a run
// records. They are read once at start-up, by cmd/, into one typed struct, validated there (a bad value is a
// usage error naming the variable), and passed down as options: nothing below run/ and cmd/ reads the
// environment for them. `kiln info --knobs` lists them with their values and where each came from.
//
// The launcher's variables (RANK, WORLD_SIZE, SLURM_*, OMPI_*, MASTER_ADDR, KILN_LAUNCH_MPIRUN and
// KILN_LAUNCH_EXE) are not knobs: they say where a process sits in a job, and parallel/comm/env.c and
// cmd/launch.c read them.
#ifndef KILN_RUN_KNOBS_H
#define KILN_RUN_KNOBS_H

#include <stddef.h>
#include <stdio.h>

#include "core/backend.h"

struct kiln_error;
struct kiln_comm_open_opts;

enum kiln_knob {
    // the model (struct kiln_model_opts, through run/tuning.c)
    KILN_KNOB_CLASSIFIER_ROWS,
    KILN_KNOB_MLP_ROWS,
    KILN_KNOB_PARALLEL_FUSED,
    KILN_KNOB_SCRATCH_SHARED,
    // data parallelism (struct kiln_dp_opts, through run/tuning.c)
    KILN_KNOB_OFFLOAD_CHUNK,
    KILN_KNOB_OFFLOAD_DELAY_US,
    KILN_KNOB_POISON_STAGING,
    KILN_KNOB_ZERO3_GATHER,
    KILN_KNOB_ZERO_GATHER,
    // the trainer: checkpoints and --recompute=auto's budget (run/)
    KILN_KNOB_CKPT_DELAY_MS,
    KILN_KNOB_MEM_BUDGET_MB,
    // the CUDA backend (struct kiln_backend_opts)
    KILN_KNOB_ATTN,
    KILN_KNOB_ATTN_BLOCK,
    KILN_KNOB_WGMMA_FWD,
    KILN_KNOB_WGMMA_DQ,
    KILN_KNOB_FA_VARIANT,
    KILN_KNOB_GEMM_TUNE,
    KILN_KNOB_BGRAD,
    KILN_KNOB_GEMM_SM_MARGIN,
    // the communicators (struct kiln_comm_open_opts)
    KILN_KNOB_TRACE_COMM,
    KILN_KNOB_NCCL_CTA_POLICY,
    KILN_KNOB_NCCL_MAX_CTAS,
    KILN_KNOB_NCCL_STREAM_PRIORITY,
    KILN_KNOB_COMM_DELAY_US,
    KILN_KNOB_TP_COPY_ENGINE,
    // data: where the source tree's data/gpt2 is (data/tokenizer.h)
    KILN_KNOB_SOURCE_DIR,
    KILN_KNOB_COUNT
};

enum kiln_knob_type {
    KILN_KNOB_BOOL,   // 0 or 1, in an int
    KILN_KNOB_INT,    // a whole number in [min, max], in an int
    KILN_KNOB_SIZE,   // a whole number in [min, max], in a size_t
    KILN_KNOB_NUMBER, // a number above 0, in a double (0: unset)
    KILN_KNOB_CHOICE, // one of `choices`, its index in an int (0: the default)
    KILN_KNOB_PATH,   // a path, in a char[KILN_KNOB_PATH_MAX] ("": unset)
};

enum kiln_knob_source { KILN_KNOB_FROM_DEFAULT = 0, KILN_KNOB_FROM_ENV };

#define KILN_KNOB_PATH_MAX 4096

// One typed field per knob; kiln_knob_table says what each means. Choice knobs hold the index of their
// value among the table's choices (0 the default); the backend's kernel choices are kiln_kernel_values'
// indices (core/backend.h), kept in kernel[] in the backend options' order.
struct kiln_knobs {
    int classifier_rows;  // KILN_CLASSIFIER_ROWS: rows per LM-head chunk (0: the model's choice)
    int mlp_rows;         // KILN_MLP_ROWS: rows per MLP chunk under recompute (0: the model's, -1: none)
    int parallel_fused;   // KILN_PARALLEL_FUSED: a parallel block's input projections as one GEMM
    int scratch_shared;   // KILN_SCRATCH_SHARED: the one-slot buffers share one arena
    size_t offload_chunk; // KILN_OFFLOAD_CHUNK: elements a chunk of the offloaded optimizer (0: its own)
    int offload_delay_us; // KILN_OFFLOAD_DELAY_US: the host AdamW's sleep before each chunk
    int poison_staging;   // KILN_POISON_STAGING: ZeRO-2/3's gradient staging filled with NaN before use
    int zero3_gather;     // KILN_ZERO3_GATHER: ZeRO-3 gathers at world size 1 too
    int zero_gather;      // KILN_ZERO_GATHER: 0 overlap, 1 wait
    int tp_copy_engine;   // KILN_TP_COPY_ENGINE: struct kiln_tp_layout's copy_engine
    int ckpt_delay_ms;    // KILN_CKPT_DELAY_MS: rank r's checkpoint writer waits (r + 1) times this
    double mem_budget_mb; // KILN_MEM_BUDGET_MB: --recompute=auto's budget in MiB (0: the GPU's free memory)
    int kernel[KILN_KERNEL_COUNT];       // KILN_ATTN ... KILN_BGRAD (struct kiln_backend_opts.kernel)
    int gemm_sm_margin;                  // KILN_GEMM_SM_MARGIN
    char trace_comm[KILN_KNOB_PATH_MAX]; // KILN_TRACE_COMM: the NCCL transport's trace file ("": none)
    int nccl_cta_policy;                 // KILN_NCCL_CTA_POLICY: enum kiln_nccl_cta_policy
    int nccl_max_ctas;                   // KILN_NCCL_MAX_CTAS (0: NCCL's default)
    int nccl_stream_priority;            // KILN_NCCL_STREAM_PRIORITY: 0 default, 1 high
    int comm_delay_us;                   // KILN_COMM_DELAY_US: the MPI worker's sleep before each operation
    char source_dir[KILN_KNOB_PATH_MAX]; // KILN_SOURCE_DIR: the source tree (data/gpt2's fallback)
    enum kiln_knob_source source[KILN_KNOB_COUNT]; // where each value came from
};

// The table: one row per knob, in enum kiln_knob's order.
struct kiln_knob_def {
    const char *name; // the environment variable
    enum kiln_knob_type type;
    size_t offset;              // of its field in struct kiln_knobs
    const char *def;            // the default, as it would be written (NULL: unset)
    long long min, max;         // KILN_KNOB_INT, KILN_KNOB_SIZE
    const char *const *choices; // KILN_KNOB_CHOICE: choices[0] is the default
    int n_choices;
    const char *layer; // the layer that consumes it
    const char *help;  // one line
};
extern const struct kiln_knob_def kiln_knob_table[KILN_KNOB_COUNT];

// Every knob at its default (source: default).
void kiln_knobs_defaults(struct kiln_knobs *k);
// Reads every knob from envp, a NULL-terminated "NAME=value" array (NULL: this process's environment; the
// last definition of a name wins, and an empty value is the default, as `VAR= cmd` clears one), validating
// each: a bad value is a usage error, "KILN_X=value (environment): <why>; <hint>". cmd/ calls it once, at
// start-up.
int kiln_knobs_read(struct kiln_knobs *k, const char *const *envp, struct kiln_error *err);
// Sets one knob from text as the environment would (source: environment); NULL or "": its default (source:
// default). Returns 0, or a usage error as kiln_knobs_read's.
int kiln_knobs_set(struct kiln_knobs *k, enum kiln_knob which, const char *value, struct kiln_error *err);
// A knob's current value as text (its default's spelling; "unset" for an unset one), into buf.
const char *kiln_knobs_value(const struct kiln_knobs *k, enum kiln_knob which, char *buf, size_t cap);
// `kiln info --knobs`: one line a knob, its name, value, source, consumer and help.
void kiln_knobs_print(const struct kiln_knobs *k, FILE *f);

// The backend's and the communicators' share of the knobs, into their options (the other fields untouched).
// k NULL: the defaults.
void kiln_knobs_backend_opts(const struct kiln_knobs *k, struct kiln_backend_opts *o);
void kiln_knobs_comm_opts(const struct kiln_knobs *k, struct kiln_comm_open_opts *o);
// KILN_SOURCE_DIR for data/tokenizer.h's kiln_tokenizer_open_at (k NULL: the build's source tree).
const char *kiln_knobs_source_dir(const struct kiln_knobs *k);

#endif
