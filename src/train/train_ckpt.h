// The trainer's side of checkpoints (docs/formats.md, "Checkpoints"): what goes into state.json, an
// asynchronous writer (snapshot to host memory, write from a background thread), loading a checkpoint back
// into a model, the resume compatibility check, and metrics.jsonl truncation.
#ifndef KILN_TRAIN_TRAIN_CKPT_H
#define KILN_TRAIN_TRAIN_CKPT_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "data/loader.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/gpt.h"
#include "train/guards.h"
#include "util/error.h"

// Everything about the loop's position that the future depends on (besides weights, AdamW m/v and guards).
struct kiln_train_state {
    int64_t step;     // loop steps done, skipped ones included (the LR schedule and data position follow it)
    int64_t opt_step; // AdamW updates applied: the bias-correction step (skipped steps do not advance it)
    uint64_t tokens;  // training tokens consumed
    struct kiln_loader_state loader;
};

// Every option as {"name": "value"} strings, exactly as `RUN/config` writes them.
cJSON *kiln_config_to_json(const struct kiln_config *cfg);

// The whole state.json object (the checkpoint writer adds format, files and hashes).
cJSON *kiln_train_state_to_json(const struct kiln_train_state *s, const struct kiln_config *cfg,
                                const struct kiln_guards *g, float next_lr);
int kiln_train_state_from_json(const cJSON *j, struct kiln_train_state *s, struct kiln_error *err);

// Compares the checkpoint's config with cfg (whose vocab_size is already set from the tokenizer). A change of
// model shape or tokenizer is a usage error naming every difference ("layers 2 -> 3, dim 32 -> 64").
// Other changes are allowed: *changes gets a malloc'd list, one "name old -> new" per line ("" if none).
int kiln_resume_check_config(const cJSON *state, const struct kiln_config *cfg, char **changes,
                             struct kiln_error *err);

// Copies model.safetensors and optim.safetensors of ck into g. A missing tensor or a wrong shape is an error
// naming the tensor and file.
int kiln_ckpt_apply(const struct kiln_ckpt *ck, struct kiln_gpt *g, struct kiln_error *err);

// The asynchronous writer. start() waits for the write in flight, copies weights and AdamW state to host
// memory (the backend's download), then writes RUN/ckpt/step_N from a background thread; training may change
// the model as soon as start() returns. *stall_ms is how long start() kept the caller.
struct kiln_ckpt_writer;
void kiln_ckpt_writer_create(struct kiln_ckpt_writer **out, const char *run_dir,
                             const struct kiln_param_table *pt, const struct kiln_ckpt_policy *policy,
                             struct kiln_backend *be);
// Takes ownership of state.
int kiln_ckpt_writer_start(struct kiln_ckpt_writer *w, struct kiln_gpt *g, int64_t step, cJSON *state,
                           double *stall_ms, struct kiln_error *err);
// Waits for the write in flight (none: returns 0 at once); returns its result. wait_ms may be NULL.
int kiln_ckpt_writer_join(struct kiln_ckpt_writer *w, double *wait_ms, struct kiln_error *err);
double
kiln_ckpt_writer_last_write_ms(const struct kiln_ckpt_writer *w); // duration of the last finished write
void kiln_ckpt_writer_free(struct kiln_ckpt_writer *w);           // joins first; NULL is fine

// Rewrites path (atomically) without the lines of steps > step, and without a torn last line. A missing file
// is fine.
int kiln_metrics_truncate(const char *path, int64_t step, struct kiln_error *err);

#endif
