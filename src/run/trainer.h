// The training loop: data, model, AdamW, schedule, evaluation, metrics, checkpoints, resume, health guards
// and the run directory.
#ifndef KILN_RUN_TRAINER_H
#define KILN_RUN_TRAINER_H

#include <stdint.h>

#include "core/backend.h"
#include "run/knobs.h"
#include "run/options.h"
#include "util/error.h"

// The exit status of `kiln train` stopped by SIGTERM, SIGINT or SIGUSR1 after saving a checkpoint
// (EX_TEMPFAIL: "try again", i.e. resume).
#define KILN_EXIT_STOPPED 75

struct kiln_train_result {
    int steps;             // loop steps done in total (skipped ones included), resumed ones too
    int start_step;        // the step resumed from (0 for a fresh run)
    double final_loss;     // last training loss
    double final_val_loss; // last validation loss (NaN if none)
    double tokens_per_s;   // mean over this process's steps, excluding its first (the first's own rate
                           // when it was the only one)
    int skipped_steps;     // all skipped steps of the run (non-finite, loss spike, grad-norm spike)
    int stop_signal;       // != 0: stopped by this signal after saving a checkpoint (exit KILN_EXIT_STOPPED)
    int checkpoints;       // checkpoints written by this process
    double max_ckpt_stall_ms; // the longest time the step loop waited for a checkpoint
    int rank, world;          // this process's place in the job
    int abort_job;            // an error with other ranks still running: cmd/ must end the whole job
                              // (kiln_comm_abort_job), never return normally into MPI_Finalize
    int end_job;              // an error every rank shares (a config that differs across ranks): cmd/
                              // reports it, then calls kiln_train_end_job
    int quiet_error;          // with end_job: another rank reports the error (an unusable checkpoint is
                              // reported once, by the first rank that found it); this one exits silently
};

// Trains per cfg. Writes cfg->out/{config, metrics.jsonl, model.safetensors, tokenizer files, ckpt/} when
// cfg->out is set, and resumes from cfg->out's newest complete checkpoint (cfg->resume = auto), from a given
// checkpoint directory, or not at all (never). Returns 0 (also when stopped by a signal: res->stop_signal),
// or an error: usage errors (a context longer than the data, a checkpoint of another model) give
// KILN_ERR_USAGE, and --max-bad-steps consecutive skipped steps give KILN_ERR_RUNTIME. knobs: the KILN_*
// knobs cmd/ read at start-up (run/knobs.h), passed down to the backend, the communicators, the model and
// data parallelism; NULL: every knob at its default.
int kiln_train(struct kiln_config *cfg, const struct kiln_knobs *knobs, struct kiln_train_result *res,
               struct kiln_error *err);

// Asks a running kiln_train to finish its current step, save a checkpoint and return. Async-signal-safe:
// meant to be called from a signal handler (cmd/train.c). Returns 1 when the step loop will act on it, 0
// while the run is still starting (reading data and checkpoints, opening the communicators): nothing there
// looks at the request, and a read may block for good (a FIFO, a hung network mount), so the caller ends
// the process itself; nothing has been trained since the newest checkpoint.
int kiln_train_request_stop(int signo);

// After an error every rank shares (res->end_job): the ranks meet once more and close the communicators,
// so that each has reported before any leaves. Nothing when there is nothing to end.
void kiln_train_end_job(void);

// --inject-stall: sleeps forever (testing the hang watchdog). Exported so that stack dumps name it.
void kiln_train_injected_stall(int64_t step);

#endif
