// See knobs.h.
#include "run/knobs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/comm.h"
#include "util/error.h"

extern char **environ;

// ---- the table --------------------------------------------------------------------------------------------

static const char *const zero_gather[] = {"overlap", "wait"};
// in enum kiln_nccl_cta_policy's order
static const char *const nccl_cta_policy[] = {"default", "efficiency", "zero"};
static const char *const nccl_stream_priority[] = {"default", "high"};

#define FIELD(f) offsetof(struct kiln_knobs, f)
#define KERNEL(k) (FIELD(kernel) + (size_t)(k) * sizeof(int))
#define CHOICES(a) .choices = a, .n_choices = (int)(sizeof(a) / sizeof(a[0]))
// The kernel knobs' choices are the backend's own list (kiln_kernel_values, core/kernels.c), which
// choices_of looks up: another object's contents are no constant expression for this table.

// One row a knob; the help is one line. Choice knobs list their values (the backend's come from
// kiln_kernel_values), int and size knobs their range.
const struct kiln_knob_def kiln_knob_table[KILN_KNOB_COUNT] = {
    [KILN_KNOB_CLASSIFIER_ROWS] =
        {.name = "KILN_CLASSIFIER_ROWS",
         .type = KILN_KNOB_INT,
         .offset = FIELD(classifier_rows),
         .def = "0",
         .min = 0,
         .max = 1 << 30,
         .layer = "model",
         .help = "rows per LM-head chunk (0: the model's own, 768 MiB to 1 GiB of logits)"},
    [KILN_KNOB_MLP_ROWS] =
        {.name = "KILN_MLP_ROWS",
         .type = KILN_KNOB_INT,
         .offset = FIELD(mlp_rows),
         .def = "0",
         .min = -1,
         .max = 1 << 30,
         .layer = "model",
         .help = "rows per MLP chunk where the backward recomputes the MLP (0: the model's own, -1: never "
                 "chunked)"},
    [KILN_KNOB_PARALLEL_FUSED] = {.name = "KILN_PARALLEL_FUSED",
                                  .type = KILN_KNOB_BOOL,
                                  .offset = FIELD(parallel_fused),
                                  .def = "1",
                                  .layer = "model",
                                  .help = "0: a parallel block runs its two input projections as two GEMMs"},
    [KILN_KNOB_SCRATCH_SHARED] = {.name = "KILN_SCRATCH_SHARED",
                                  .type = KILN_KNOB_BOOL,
                                  .offset = FIELD(scratch_shared),
                                  .def = "1",
                                  .layer = "model",
                                  .help = "0: every one-slot scratch buffer in a range of its own (tests)"},
    [KILN_KNOB_OFFLOAD_CHUNK] =
        {.name = "KILN_OFFLOAD_CHUNK",
         .type = KILN_KNOB_SIZE,
         .offset = FIELD(offload_chunk),
         .def = "0",
         .min = 0,
         .max = 1LL << 40,
         .layer = "parallel/dp",
         .help = "elements a chunk of the offloaded optimizer's pipeline (0: its own, 32M)"},
    [KILN_KNOB_OFFLOAD_DELAY_US] =
        {.name = "KILN_OFFLOAD_DELAY_US",
         .type = KILN_KNOB_INT,
         .offset = FIELD(offload_delay_us),
         .def = "0",
         .min = 0,
         .max = 60000000,
         .layer = "parallel/dp",
         .help = "the offloaded optimizer's host AdamW sleeps this long before each chunk (tests)"},
    [KILN_KNOB_POISON_STAGING] =
        {.name = "KILN_POISON_STAGING",
         .type = KILN_KNOB_BOOL,
         .offset = FIELD(poison_staging),
         .def = "0",
         .layer = "parallel/dp",
         .help = "1: ZeRO-2/3's gradient staging filled with NaN before each use (tests)"},
    [KILN_KNOB_TP_COPY_ENGINE] = {.name = "KILN_TP_COPY_ENGINE",
                                  .type = KILN_KNOB_BOOL,
                                  .offset = FIELD(tp_copy_engine),
                                  .def = "0",
                                  .layer = "parallel/tp",
                                  .help = "1: --tp's sequence all-gathers on the copy engines (NCCL 2.28's "
                                          "zero-CTA policy and a symmetric window; docs/distributed.md)"},
    [KILN_KNOB_ZERO3_GATHER] = {.name = "KILN_ZERO3_GATHER",
                                .type = KILN_KNOB_BOOL,
                                .offset = FIELD(zero3_gather),
                                .def = "0",
                                .layer = "parallel/dp",
                                .help = "1: ZeRO-3 gathers at world size 1 too (a trace of its prefetch)"},
    [KILN_KNOB_ZERO_GATHER] =
        {.name = "KILN_ZERO_GATHER",
         .type = KILN_KNOB_CHOICE,
         .offset = FIELD(zero_gather),
         .def = "overlap",
         CHOICES(zero_gather),
         .layer = "parallel/dp",
         .help = "wait: ZeRO-1/2 wait for the whole weight gather after AdamW (the baseline of its overlap "
                 "with the next forward)"},
    [KILN_KNOB_CKPT_DELAY_MS] =
        {.name = "KILN_CKPT_DELAY_MS",
         .type = KILN_KNOB_INT,
         .offset = FIELD(ckpt_delay_ms),
         .def = "0",
         .min = 0,
         .max = 3600000,
         .layer = "run/train_ckpt",
         .help = "rank r's checkpoint writer waits (r + 1) times this before its files (tests)"},
    [KILN_KNOB_MEM_BUDGET_MB] =
        {.name = "KILN_MEM_BUDGET_MB",
         .type = KILN_KNOB_NUMBER,
         .offset = FIELD(mem_budget_mb),
         .layer = "run/plan",
         .help = "MiB that --recompute=auto and kiln info plan against, in place of the GPU's free memory"},
    [KILN_KNOB_ATTN] =
        {.name = "KILN_ATTN",
         .type = KILN_KNOB_CHOICE,
         .offset = KERNEL(KILN_KERNEL_ATTN),
         .def = "wgmma",
         .layer = "backend/cuda",
         .help =
             "attention kernels: wgmma (Hopper's where they apply, else fa2), fa2, or ref (the first ones)"},
    [KILN_KNOB_ATTN_BLOCK] =
        {.name = "KILN_ATTN_BLOCK",
         .type = KILN_KNOB_CHOICE,
         .offset = KERNEL(KILN_KERNEL_ATTN_BLOCK),
         .def = "wgmma",
         .layer = "backend/cuda",
         .help = "sequence parallelism's block attention: wgmma, tc (tensor cores) or ref (f32)"},
    [KILN_KNOB_WGMMA_FWD] = {.name = "KILN_WGMMA_FWD",
                             .type = KILN_KNOB_CHOICE,
                             .offset = KERNEL(KILN_KERNEL_WGMMA_FWD),
                             .def = "pingpong",
                             .layer = "backend/cuda",
                             .help =
                                 "the Hopper attention forward's consumers: pingpong (in turns) or overlap"},
    [KILN_KNOB_WGMMA_DQ] = {.name = "KILN_WGMMA_DQ",
                            .type = KILN_KNOB_CHOICE,
                            .offset = KERNEL(KILN_KERNEL_WGMMA_DQ),
                            .def = "tma-dqpw",
                            .layer = "backend/cuda",
                            .help = "the Hopper attention backward's dQ path (docs/wgmma_attention.md)"},
    [KILN_KNOB_FA_VARIANT] =
        {.name = "KILN_FA_VARIANT",
         .type = KILN_KNOB_CHOICE,
         .offset = KERNEL(KILN_KERNEL_FA_VARIANT),
         .def = "0",
         .layer = "backend/cuda",
         .help = "FA2's tile shapes: 0, or the alternatives 1 and 2 (2: the single-pass backward's)"},
    [KILN_KNOB_GEMM_TUNE] =
        {.name = "KILN_GEMM_TUNE",
         .type = KILN_KNOB_CHOICE,
         .offset = KERNEL(KILN_KERNEL_GEMM_TUNE),
         .def = "1",
         .layer = "backend/cuda",
         .help = "0: cuBLASLt's first algorithm for every GEMM, without timing its candidates"},
    [KILN_KNOB_BGRAD] =
        {.name = "KILN_BGRAD",
         .type = KILN_KNOB_CHOICE,
         .offset = KERNEL(KILN_KERNEL_BGRAD),
         .def = "colsum",
         .layer = "backend/cuda",
         .help = "matmul bias gradients: colsum (kiln's column sums) or lt (cuBLASLt's BGRADB epilogue)"},
    [KILN_KNOB_GEMM_SM_MARGIN] =
        {.name = "KILN_GEMM_SM_MARGIN",
         .type = KILN_KNOB_INT,
         .offset = FIELD(gemm_sm_margin),
         .def = "0",
         .min = 0,
         .max = 1023,
         .layer = "backend/cuda",
         .help = "plan every GEMM for this many fewer SMs than the GPU has (room for NCCL's kernels)"},
    [KILN_KNOB_TRACE_COMM] =
        {.name = "KILN_TRACE_COMM",
         .type = KILN_KNOB_PATH,
         .offset = FIELD(trace_comm),
         .layer = "parallel/comm",
         .help = "write a CSV trace of the NCCL operations and the compute stream's waits to this file "
                 "(FILE.rankN with several ranks)"},
    [KILN_KNOB_NCCL_CTA_POLICY] =
        {.name = "KILN_NCCL_CTA_POLICY",
         .type = KILN_KNOB_CHOICE,
         .offset = FIELD(nccl_cta_policy),
         .def = "default",
         CHOICES(nccl_cta_policy),
         .layer = "parallel/comm",
         .help = "NCCL 2.27+'s CTA policy (efficiency, zero: more SMs left to the compute)"},
    [KILN_KNOB_NCCL_MAX_CTAS] = {.name = "KILN_NCCL_MAX_CTAS",
                                 .type = KILN_KNOB_INT,
                                 .offset = FIELD(nccl_max_ctas),
                                 .min = 1,
                                 .max = 64,
                                 .layer = "parallel/comm",
                                 .help = "at most this many CTAs for NCCL's kernels (unset: NCCL's own)"},
    [KILN_KNOB_NCCL_STREAM_PRIORITY] = {.name = "KILN_NCCL_STREAM_PRIORITY",
                                        .type = KILN_KNOB_CHOICE,
                                        .offset = FIELD(nccl_stream_priority),
                                        .def = "default",
                                        CHOICES(nccl_stream_priority),
                                        .layer = "parallel/comm",
                                        .help = "high: the NCCL comm stream at the GPU's greatest priority"},
    [KILN_KNOB_COMM_DELAY_US] =
        {.name = "KILN_COMM_DELAY_US",
         .type = KILN_KNOB_INT,
         .offset = FIELD(comm_delay_us),
         .def = "0",
         .min = 0,
         .max = 60000000,
         .layer = "parallel/comm",
         .help = "the MPI transport's worker sleeps this long before each operation (tests)"},
    [KILN_KNOB_SOURCE_DIR] =
        {.name = "KILN_SOURCE_DIR",
         .type = KILN_KNOB_PATH,
         .offset = FIELD(source_dir),
         .def = KILN_SOURCE_DIR,
         .layer = "data",
         .help = "the source tree: data/gpt2 is looked for there when the working directory has none"},
};

// A choice knob's values: its row's, or for the backend's kernel knobs kiln_kernel_values' (core/backend.h).
static const char *const *choices_of(enum kiln_knob which, int *n) {
    const struct kiln_knob_def *d = &kiln_knob_table[which];
    if (d->choices) {
        *n = d->n_choices;
        return d->choices;
    }
    for (int k = 0; k < KILN_KERNEL_COUNT; k++)
        if (!strcmp(kiln_kernel_values[k].knob, d->name)) {
            *n = kiln_kernel_values[k].n_values;
            return kiln_kernel_values[k].values;
        }
    *n = 0;
    return NULL;
}

// ---- parsing --------------------------------------------------------------------------------------------

// What a knob allows, for its errors: "0 or 1", "a whole number 1 to 64", "overlap (the default) or wait".
static void allowed(enum kiln_knob which, char *buf, size_t cap) {
    const struct kiln_knob_def *d = &kiln_knob_table[which];
    switch (d->type) {
    case KILN_KNOB_BOOL:
        snprintf(buf, cap, "0 or 1");
        return;
    case KILN_KNOB_INT:
    case KILN_KNOB_SIZE:
        snprintf(buf, cap, "a whole number %lld to %lld", d->min, d->max);
        return;
    case KILN_KNOB_NUMBER:
        snprintf(buf, cap, "a number above 0");
        return;
    case KILN_KNOB_PATH:
        snprintf(buf, cap, "a path shorter than %d bytes", KILN_KNOB_PATH_MAX);
        return;
    case KILN_KNOB_CHOICE:
        break;
    }
    int n;
    const char *const *c = choices_of(which, &n);
    // the default is named as such, unless its name says so already ("default")
    int said = strcmp(c[0], "default") != 0;
    size_t len =
        (size_t)snprintf(buf, cap, "%s%s%s", n > 2 ? "one of " : "", c[0], said ? " (the default)" : "");
    for (int i = 1; i < n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", n > 2 ? ", " : " or ", c[i]);
}

static int bad_value(enum kiln_knob which, const char *value, struct kiln_error *err) {
    const struct kiln_knob_def *d = &kiln_knob_table[which];
    char why[256];
    allowed(which, why, sizeof(why));
    // (a choice's default is named among its values already, a path's is long)
    if (d->def && d->type != KILN_KNOB_PATH && d->type != KILN_KNOB_CHOICE)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "%s=%.64s (environment): %s; unset it for the default (%s), or see kiln info --knobs", d->name,
            value, why, d->def);
    return kiln_errorf(err, KILN_ERR_USAGE,
                       "%s=%.64s (environment): %s; unset it for the default, or see kiln info --knobs",
                       d->name, value, why);
}

// A whole decimal number in [min, max], nothing else in s.
static int parse_whole(const char *s, long long min, long long max, long long *out) {
    if (!(*s >= '0' && *s <= '9') && !(*s == '-' && s[1] >= '0' && s[1] <= '9'))
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno == ERANGE || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

// Parses value (non-empty) into which's field of k.
static int parse(struct kiln_knobs *k, enum kiln_knob which, const char *value, struct kiln_error *err) {
    const struct kiln_knob_def *d = &kiln_knob_table[which];
    void *field = (char *)k + d->offset;
    long long v;
    switch (d->type) {
    case KILN_KNOB_BOOL:
        if (strcmp(value, "0") && strcmp(value, "1"))
            return bad_value(which, value, err);
        *(int *)field = value[0] == '1';
        return 0;
    case KILN_KNOB_INT:
        if (parse_whole(value, d->min, d->max, &v))
            return bad_value(which, value, err);
        *(int *)field = (int)v;
        return 0;
    case KILN_KNOB_SIZE:
        if (parse_whole(value, d->min, d->max, &v))
            return bad_value(which, value, err);
        *(size_t *)field = (size_t)v;
        return 0;
    case KILN_KNOB_NUMBER: {
        char *end;
        errno = 0;
        double x = strtod(value, &end);
        if (*end || end == value || errno == ERANGE || !(x > 0 && x < 1e12))
            return bad_value(which, value, err);
        *(double *)field = x;
        return 0;
    }
    case KILN_KNOB_CHOICE: {
        int n;
        const char *const *c = choices_of(which, &n);
        for (int i = 0; i < n; i++)
            if (!strcmp(value, c[i])) {
                *(int *)field = i;
                return 0;
            }
        return bad_value(which, value, err);
    }
    case KILN_KNOB_PATH:
        if (strlen(value) >= KILN_KNOB_PATH_MAX)
            return bad_value(which, value, err);
        snprintf((char *)field, KILN_KNOB_PATH_MAX, "%s", value);
        return 0;
    }
    return bad_value(which, value, err);
}

// Resets which's field to its unset state (the default parsed below, or zero/empty).
static void clear(struct kiln_knobs *k, enum kiln_knob which) {
    const struct kiln_knob_def *d = &kiln_knob_table[which];
    void *field = (char *)k + d->offset;
    switch (d->type) {
    case KILN_KNOB_BOOL:
    case KILN_KNOB_INT:
    case KILN_KNOB_CHOICE:
        *(int *)field = 0;
        break;
    case KILN_KNOB_SIZE:
        *(size_t *)field = 0;
        break;
    case KILN_KNOB_NUMBER:
        *(double *)field = 0;
        break;
    case KILN_KNOB_PATH:
        ((char *)field)[0] = 0;
        break;
    }
    if (d->def) {
        struct kiln_error e;
        KILN_ASSERT(parse(k, which, d->def, &e) == 0); // every default is one of its own values
    }
    k->source[which] = KILN_KNOB_FROM_DEFAULT;
}

// ---- the entry points -------------------------------------------------------------------------------------

void kiln_knobs_defaults(struct kiln_knobs *k) {
    memset(k, 0, sizeof(*k));
    for (int i = 0; i < KILN_KNOB_COUNT; i++)
        clear(k, (enum kiln_knob)i);
}

int kiln_knobs_set(struct kiln_knobs *k, enum kiln_knob which, const char *value, struct kiln_error *err) {
    KILN_ASSERT((unsigned)which < KILN_KNOB_COUNT);
    if (!value || !*value) {
        clear(k, which);
        return 0;
    }
    struct kiln_knobs t = *k; // a bad value leaves k as it was
    int rc = parse(&t, which, value, err);
    if (rc)
        return rc;
    *k = t;
    k->source[which] = KILN_KNOB_FROM_ENV;
    return 0;
}

// The value of name in envp (the last definition), or NULL.
static const char *env_get(const char *const *envp, const char *name) {
    size_t n = strlen(name);
    const char *found = NULL;
    for (const char *const *p = envp; *p; p++)
        if (!strncmp(*p, name, n) && (*p)[n] == '=')
            found = *p + n + 1;
    return found;
}

int kiln_knobs_read(struct kiln_knobs *k, const char *const *envp, struct kiln_error *err) {
    if (!envp)
        envp = (const char *const *)environ;
    kiln_knobs_defaults(k);
    for (int i = 0; i < KILN_KNOB_COUNT; i++) {
        int rc = kiln_knobs_set(k, (enum kiln_knob)i, env_get(envp, kiln_knob_table[i].name), err);
        if (rc)
            return rc;
    }
    return 0;
}

const char *kiln_knobs_value(const struct kiln_knobs *k, enum kiln_knob which, char *buf, size_t cap) {
    const struct kiln_knob_def *d = &kiln_knob_table[which];
    const void *field = (const char *)k + d->offset;
    int n;
    switch (d->type) {
    case KILN_KNOB_BOOL:
        snprintf(buf, cap, "%d", *(const int *)field);
        break;
    case KILN_KNOB_INT:
        if (!d->def && *(const int *)field == 0)
            snprintf(buf, cap, "unset");
        else
            snprintf(buf, cap, "%d", *(const int *)field);
        break;
    case KILN_KNOB_SIZE:
        snprintf(buf, cap, "%zu", *(const size_t *)field);
        break;
    case KILN_KNOB_NUMBER:
        if (*(const double *)field > 0)
            snprintf(buf, cap, "%g", *(const double *)field);
        else
            snprintf(buf, cap, "unset");
        break;
    case KILN_KNOB_CHOICE:
        snprintf(buf, cap, "%s", choices_of(which, &n)[*(const int *)field]);
        break;
    case KILN_KNOB_PATH:
        snprintf(buf, cap, "%s", *(const char *)field ? (const char *)field : "unset");
        break;
    }
    return buf;
}

void kiln_knobs_print(const struct kiln_knobs *k, FILE *f) {
    fprintf(f, "%-26s %-12s %-11s %-15s %s\n", "knob", "value", "source", "read by", "what it does");
    for (int i = 0; i < KILN_KNOB_COUNT; i++) {
        const struct kiln_knob_def *d = &kiln_knob_table[i];
        char value[KILN_KNOB_PATH_MAX], why[256];
        kiln_knobs_value(k, (enum kiln_knob)i, value, sizeof(value));
        allowed((enum kiln_knob)i, why, sizeof(why));
        fprintf(f, "%-26s %-12s %-11s %-15s %s [%s]\n", d->name, value,
                k->source[i] == KILN_KNOB_FROM_ENV ? "environment" : "default", d->layer, d->help, why);
    }
}

void kiln_knobs_backend_opts(const struct kiln_knobs *k, struct kiln_backend_opts *o) {
    if (!k) { // the defaults are the zero options
        memset(o->kernel, 0, sizeof(o->kernel));
        o->gemm_sm_margin = 0;
        return;
    }
    memcpy(o->kernel, k->kernel, sizeof(o->kernel));
    o->gemm_sm_margin = k->gemm_sm_margin;
}

void kiln_knobs_comm_opts(const struct kiln_knobs *k, struct kiln_comm_open_opts *o) {
    if (!k) { // the defaults are the zero options
        o->trace_path = NULL;
        o->nccl_cta_policy = KILN_NCCL_CTA_DEFAULT;
        o->nccl_max_ctas = o->nccl_stream_high = o->mpi_delay_us = 0;
        return;
    }
    o->trace_path = k->trace_comm[0] ? k->trace_comm : NULL;
    o->nccl_cta_policy = (enum kiln_nccl_cta_policy)k->nccl_cta_policy;
    o->nccl_max_ctas = k->nccl_max_ctas;
    o->nccl_stream_high = k->nccl_stream_priority == 1;
    o->mpi_delay_us = k->comm_delay_us;
}

const char *kiln_knobs_source_dir(const struct kiln_knobs *k) {
    return k ? k->source_dir : KILN_SOURCE_DIR;
}
