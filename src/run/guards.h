// Health guards: decide, step by step, whether an optimizer update may be applied.
//
// A step is skipped (no AdamW update, the optimizer's bias-correction step not advanced) when its loss or
// gradient norm is not finite, or when either is a spike: its logarithm more than spike_z standard deviations
// above the mean of the logarithms of the last `window` steps (population statistics, oldest to newest, in
// double; on logarithms because both vary by factors, and a gradient norm's healthy excursions of 2-3x its
// mean would be 7 deviations out on the values themselves: guards.c). The spike
// test only runs once the window holds KILN_GUARD_MIN_SAMPLES values (or the whole window, if smaller), the
// idea of llm.c's outlier detector. A spike's values enter the windows (a lasting change of level is
// learned within a few steps); non-finite values never do.
// max_bad consecutive skips exhaust the guard: the trainer stops the run.
#ifndef KILN_RUN_GUARDS_H
#define KILN_RUN_GUARDS_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "util/error.h"

#define KILN_GUARD_MIN_SAMPLES 20

enum kiln_skip { KILN_SKIP_NONE = 0, KILN_SKIP_NAN, KILN_SKIP_SPIKE_LOSS, KILN_SKIP_SPIKE_GRAD, KILN_SKIP_N };
const char *kiln_skip_name(enum kiln_skip s); // "nan", "spike_loss", "spike_grad" ("" for NONE)

// A ring of the last cap accepted values.
struct kiln_spike_window {
    int cap, n, head; // head: index of the oldest value
    double *x;        // (cap)
};

struct kiln_guards {
    float spike_z; // 0 = spike tests off
    int max_bad;
    struct kiln_spike_window loss, grad;
    int64_t skipped[KILN_SKIP_N]; // per reason; [KILN_SKIP_NONE] unused
    int64_t skipped_total;
    int consecutive; // skips in a row, ending at the last checked step
    double last_z;   // the z-score that caused the last spike skip
};

void kiln_guards_init(struct kiln_guards *g, float spike_z, int window, int max_bad);
void kiln_guards_free(struct kiln_guards *g);

// The z-score of log(x) against the logarithms of the window's values: NaN until it is warm, or when their
// spread is zero.
double kiln_spike_z(const struct kiln_spike_window *w, double x);

// Checks one step; counts a skip, or records the accepted values. Returns why the step must be skipped.
enum kiln_skip kiln_guards_check(struct kiln_guards *g, double loss, double grad_norm);
static inline int kiln_guards_exhausted(const struct kiln_guards *g) {
    return g->consecutive >= g->max_bad;
}

// Counters and windows as JSON (for checkpoints), and back. from_json keeps the newest values that fit the
// current window size, so --spike-window may change across a resume. It refuses counters above 2^53 or
// inconsistent with each other (a reason's count above skipped_total, reasons not adding up to it,
// consecutive above it), naming the field; kiln_train_state_from_json also checks skipped_total <= step.
cJSON *kiln_guards_to_json(const struct kiln_guards *g);
int kiln_guards_from_json(struct kiln_guards *g, const cJSON *j, struct kiln_error *err);

#endif
