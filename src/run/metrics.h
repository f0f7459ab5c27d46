// The run's metrics: one JSON line per logged step in RUN/metrics.jsonl (docs/runs.md), and, with
// --tensorboard=DIR, the same numbers as TensorBoard scalars.
#ifndef KILN_RUN_METRICS_H
#define KILN_RUN_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "run/options.h"
#include "util/error.h"

// One logged step. NAN (or 0 where noted) leaves a field out of the line.
struct kiln_metrics_row {
    int64_t step; // 1-based
    double loss, lr, grad_norm, tokens_per_s, ms;
    size_t peak_mem_bytes;
    double mfu, mfu_causal; // 0: unknown peak FLOP/s
    double hfu;             // 0: no recompute
    double val_loss;
    const char *skipped; // the guard that skipped this step's update, or NULL
    // the guards' running counts (written when skipped_total > 0)
    int64_t skipped_total, skipped_nan, skipped_spike_loss, skipped_spike_grad;
    double ckpt_stall_ms;
    double comm_wait_ms;       // several ranks: the host's wait on reductions so far
    double prev_ckpt_write_ms; // 0: none finished since the last line
    int64_t tokens;            // tokens trained on through this step, the whole job's (0: left out)
    double slowest_ms;         // several ranks: the slowest rank's step time (0: left out)
    double offload_ms;         // --offload: the host's optimizer steps that ended in this step (0: left out)
    double offload_wait_ms;    // --offload: how long this step waited for them
    double offload_copy_gbps;  // --offload: their copies' bandwidth, 1e9 bytes a second (0: left out)
    int64_t comm_ops;          // several ranks: collectives this rank issued on the job's communicator so far
                               // (0: left out)
};

struct kiln_metrics;

// Opens RUN/metrics.jsonl for appending after a resume at resumed_step (the lines of steps past it, written by
// a killed run, are dropped first), or fresh. cfg->tensorboard names an event directory to write too: each
// open starts a new event file there, with a session start at resumed_step + 1 and the config as text.
int kiln_metrics_open(const struct kiln_config *cfg, int64_t resumed_step, struct kiln_metrics **out,
                      struct kiln_error *err);
void kiln_metrics_write(struct kiln_metrics *m, const struct kiln_metrics_row *row);
void kiln_metrics_close(struct kiln_metrics *m); // NULL is fine

// Drops the lines of steps after `step` from a metrics.jsonl (a missing file is fine), atomically.
int kiln_metrics_truncate(const char *path, int64_t step, struct kiln_error *err);

#endif
