// The trainer's side of checkpoints (docs/formats.md, "Checkpoints"): what goes into state.json, an
// asynchronous writer (snapshot to host memory, write from a background thread), loading a checkpoint back
// into a model and the resume compatibility check.
#ifndef KILN_RUN_TRAIN_CKPT_H
#define KILN_RUN_TRAIN_CKPT_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/backend.h"
#include "data/loader.h"
#include "io/checkpoint.h"
#include "run/options.h"
#include "model/model.h"
#include "optim/state.h"
#include "run/guards.h"
#include "util/error.h"

// Everything about the loop's position that the future depends on (besides weights, AdamW m/v and guards).
struct kiln_train_state {
    int64_t step;     // loop steps done, skipped ones included (the LR schedule and data position follow it)
    int64_t opt_step; // AdamW updates applied: the bias-correction step (skipped steps do not advance it)
    uint64_t tokens;  // training tokens consumed
    struct kiln_loader_state loader;
    cJSON *precision; // the precision strategy's state (precision/fp8.h), or NULL: state.json's "precision",
                      // written (a copy) by kiln_train_state_to_json, read (a copy, the caller's to free) back
};

// Every option as {"name": "value"} strings, exactly as `RUN/config` writes them.
cJSON *kiln_config_to_json(const struct kiln_config *cfg);

// The whole state.json object (the checkpoint writer adds format, files and hashes).
cJSON *kiln_train_state_to_json(const struct kiln_train_state *s, const struct kiln_config *cfg,
                                const struct kiln_guards *g, float next_lr);
// Reads it back: checks state_sha256, then every count (at most 2^53, opt_step <= step, the guards'
// counters as kiln_guards_from_json does and guards.skipped_total <= step). Errors are KILN_ERR_RUNTIME.
int kiln_train_state_from_json(const cJSON *j, struct kiln_train_state *s, struct kiln_error *err);

// Compares the checkpoint's config with cfg (whose vocab_size is already set from the tokenizer). A change of
// model shape or tokenizer is a usage error naming every difference ("layers 2 -> 3, dim 32 -> 64").
// Other changes are allowed: *changes gets a malloc'd list, one "name old -> new" per line ("" if none).
int kiln_resume_check_config(const cJSON *state, const struct kiln_config *cfg, char **changes,
                             struct kiln_error *err);

// Copies model.safetensors and optim.safetensors of ck into the optimizer's state st (the master weights, and
// with them the model's compute copy; the moments). A missing tensor or a wrong shape is an error naming the
// tensor and file.
int kiln_ckpt_apply(const struct kiln_ckpt *ck, const struct kiln_param_table *pt,
                    const struct kiln_model_config *model, struct kiln_optim_state *st, struct kiln_error *err);

// The asynchronous writer. start() waits for the write in flight, copies weights and AdamW state to host
// memory (the backend's download), then writes RUN/ckpt/step_N from a background thread; training may change
// the model as soon as start() returns. *stall_ms is how long start() kept the caller.
struct kiln_ckpt_writer;
void kiln_ckpt_writer_create(struct kiln_ckpt_writer **out, const char *run_dir,
                             const struct kiln_param_table *pt, const struct kiln_ckpt_policy *policy,
                             struct kiln_backend *be);

// ---- checkpoints of several ranks (docs/formats.md, "Sharded checkpoints") ----
// Rank r of n writes optim-RRRRR-of-NNNNN.safetensors: tensors "m" and "v", the AdamW moments of the ranges
// it owns (kiln_dp_ranges) concatenated; rank 0 also writes model.safetensors, the whole f32 weights.
// state.json's "optim_layout" ({"world", "zero", "bucket_bounds"}) says which ranges each file holds, so any
// world size and --zero level can read them back (kiln_ckpt_read_optim).
struct kiln_dp;
struct kiln_comm;
// A writer for a group: the save's collectives run on ckpt_comm (a communicator of its own) from the caller's
// thread, never from the background thread, which writes this rank's files alone: with NCCL, collectives of
// two threads on one GPU, in different orders on different ranks, can deadlock (a run of Ulysses with one
// sequence a rank on 4 H100s hung so, 2026-11-26). start() runs the first (kiln_ckpt_group_begin);
// the write is installed by kiln_ckpt_writer_commit, which every rank calls at the same point: at a step
// boundary once no rank is busy (the trainer agrees on kiln_ckpt_writer_busy with the step's other
// agreements), or in join. dp gives the ranges and the buffers.
void kiln_ckpt_writer_create_group(struct kiln_ckpt_writer **out, const char *run_dir,
                                   const struct kiln_param_table *pt, const struct kiln_ckpt_policy *policy,
                                   struct kiln_backend *be, struct kiln_dp *dp, struct kiln_comm *ckpt_comm);
// Tests (KILN_CKPT_DELAY_MS, run/knobs.h): a group writer's rank r waits (r + 1) delay_ms before its files,
// so that the ranks' writes finish steps apart and the commit is seen to wait for the last.
void kiln_ckpt_writer_set_delay(struct kiln_ckpt_writer *w, int delay_ms);
// The whole AdamW moments (pt->total floats each, padding zero) of a checkpoint, from optim.safetensors (one
// process) or from every rank's optim shard (any world size).
// A tensor-parallel run's files (optim_layout.tp > 1) hold its parts' ranges: model (the checkpoint's model)
// says how its tensors were split.
int kiln_ckpt_read_optim(const struct kiln_ckpt *ck, const struct kiln_param_table *pt,
                         const struct kiln_model_config *model, float *m, float *v, struct kiln_error *err);
// What a tensor-parallel rank holds: part `rank` of the model split so, whose whole table is `whole`
struct kiln_ckpt_part_of {
    const struct kiln_model_config *model;
    struct kiln_model_split split;
    int rank;
    const struct kiln_param_table *whole;
};
// kiln_ckpt_apply for a data-parallel rank: the weights, and the moments this rank holds (every element under
// DDP, its ranges under ZeRO), from a checkpoint of any world size, --zero level and --tp degree. part: a
// tensor-parallel rank's (pt is then its part's table), NULL for the whole model.
int kiln_ckpt_apply_dp(const struct kiln_ckpt *ck, const struct kiln_param_table *pt, struct kiln_dp *dp,
                       struct kiln_optim_state *st, const struct kiln_ckpt_part_of *part,
                       const struct kiln_model_config *model, struct kiln_error *err);
// A group writer of a tensor-parallel run: model.safetensors holds the whole model (whole's tensors),
// gathered over tp's group from every part as the checkpoint starts; optim_layout says tp.
struct kiln_tp;
void kiln_ckpt_writer_set_tp(struct kiln_ckpt_writer *w, struct kiln_tp *tp, const struct kiln_param_table *whole);
// The whole f32 weights of a checkpoint (pt->total floats).
int kiln_ckpt_read_params(const struct kiln_ckpt *ck, const struct kiln_param_table *pt, float *params,
                          struct kiln_error *err);
// Takes ownership of state.
int kiln_ckpt_writer_start(struct kiln_ckpt_writer *w, struct kiln_optim_state *st, int64_t step,
                           cJSON *state, double *stall_ms, struct kiln_error *err);
// Waits for the write in flight (none: returns 0 at once); returns its result. wait_ms may be NULL. A group's
// write is committed here: every rank must call it at the same point.
int kiln_ckpt_writer_join(struct kiln_ckpt_writer *w, double *wait_ms, struct kiln_error *err);
// A group's write: whether one is begun and not yet committed (the same on every rank), whether this rank's
// files are still being written, and the commit (collective; 0 at once when none awaits).
int kiln_ckpt_writer_awaiting(const struct kiln_ckpt_writer *w);
int kiln_ckpt_writer_busy(const struct kiln_ckpt_writer *w);
int kiln_ckpt_writer_commit(struct kiln_ckpt_writer *w, struct kiln_error *err);
// Joins the thread without committing (an error path, where the ranks may not all be here): the write is
// never installed and the previous checkpoint stays the newest.
void kiln_ckpt_writer_abandon(struct kiln_ckpt_writer *w);
double
kiln_ckpt_writer_last_write_ms(const struct kiln_ckpt_writer *w); // duration of the last finished write
void kiln_ckpt_writer_free(struct kiln_ckpt_writer *w);           // joins first; NULL is fine

#endif
