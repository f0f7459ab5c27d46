// Health guards. See guards.h.
#include "run/guards.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/checkpoint.h"

static const char *const SKIP_NAMES[KILN_SKIP_N] = {"", "nan", "spike_loss", "spike_grad"};

const char *kiln_skip_name(enum kiln_skip s) {
    return s >= 0 && s < KILN_SKIP_N ? SKIP_NAMES[s] : "";
}

static void window_init(struct kiln_spike_window *w, int cap) {
    w->cap = cap > 1 ? cap : 2;
    w->n = w->head = 0;
    w->x = kiln_xcalloc((size_t)w->cap, sizeof(double));
}

static void window_push(struct kiln_spike_window *w, double x) {
    if (w->n < w->cap) {
        w->x[(w->head + w->n) % w->cap] = x;
        w->n++;
    } else {
        w->x[w->head] = x; // overwrite the oldest
        w->head = (w->head + 1) % w->cap;
    }
}

static double window_at(const struct kiln_spike_window *w, int i) { // i = 0 is the oldest
    return w->x[(w->head + i) % w->cap];
}

void kiln_guards_init(struct kiln_guards *g, float spike_z, int window, int max_bad) {
    memset(g, 0, sizeof(*g));
    g->spike_z = spike_z;
    g->max_bad = max_bad > 0 ? max_bad : 1;
    window_init(&g->loss, window);
    window_init(&g->grad, window);
    g->last_z = NAN;
}

void kiln_guards_free(struct kiln_guards *g) {
    free(g->loss.x);
    free(g->grad.x);
    g->loss.x = g->grad.x = NULL;
}

// A loss or a gradient norm varies by factors, not by amounts (a 2x excursion of a norm of 0.6 and one of 60
// are alike), and a gradient norm's upper tail is long: a healthy char-level run's norm, steady around 0.6,
// reaches 1.4 and 2.0 now and then (2.3x and 2.9x its mean, 7.3 and 7.2 standard deviations above it, and
// skipped as spikes when the statistics were taken on the values). On their logarithms those steps are 5.1
// and 4.8 deviations out, while a step that is a real outlier (a gradient ten times the usual) stays far
// beyond any threshold. Values <= 0 count as 1e-30.
static double spike_log(double x) {
    return log(x > 1e-30 ? x : 1e-30);
}

double kiln_spike_z(const struct kiln_spike_window *w, double x) {
    int warm = w->cap < KILN_GUARD_MIN_SAMPLES ? w->cap : KILN_GUARD_MIN_SAMPLES;
    if (w->n < warm)
        return NAN;
    // two passes, oldest to newest: the same values always give the same bits (resume is bit-exact)
    double sum = 0;
    for (int i = 0; i < w->n; i++)
        sum += spike_log(window_at(w, i));
    double mean = sum / w->n, var = 0;
    for (int i = 0; i < w->n; i++) {
        double d = spike_log(window_at(w, i)) - mean;
        var += d * d;
    }
    double sd = sqrt(var / w->n);
    return sd > 0 ? (spike_log(x) - mean) / sd : NAN;
}

enum kiln_skip kiln_guards_check(struct kiln_guards *g, double loss, double grad_norm) {
    enum kiln_skip why = KILN_SKIP_NONE;
    if (!isfinite(loss) || !isfinite(grad_norm)) {
        why = KILN_SKIP_NAN;
    } else if (g->spike_z > 0) {
        double zl = kiln_spike_z(&g->loss, loss), zg = kiln_spike_z(&g->grad, grad_norm);
        if (zl > g->spike_z) {
            why = KILN_SKIP_SPIKE_LOSS;
            g->last_z = zl;
        } else if (zg > g->spike_z) {
            why = KILN_SKIP_SPIKE_GRAD;
            g->last_z = zg;
        }
    }
    // A spike's values enter the window too: a single outlier barely moves the statistics, but a genuine
    // change of level (a loss plateau ending, a new data mix) is learned within a few steps instead of being
    // skipped until --max-bad-steps stops the run. Non-finite values never enter.
    if (why != KILN_SKIP_NAN) {
        window_push(&g->loss, loss);
        window_push(&g->grad, grad_norm);
    }
    if (why == KILN_SKIP_NONE) {
        g->consecutive = 0;
    } else {
        g->consecutive++;
        g->skipped[why]++;
        g->skipped_total++;
    }
    return why;
}

// ----------------------------------------------------------------------------
// checkpoint state

static cJSON *window_to_json(const struct kiln_spike_window *w) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < w->n; i++) { // as "%.17g" strings: cJSON's own numbers do not round-trip every bit
        char s[40];
        snprintf(s, sizeof(s), "%.17g", window_at(w, i));
        cJSON_AddItemToArray(a, cJSON_CreateString(s));
    }
    return a;
}

static int window_from_json(struct kiln_spike_window *w, const cJSON *a, const char *name,
                            struct kiln_error *err) {
    if (!cJSON_IsArray(a))
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "guards.%s missing (state.json): not a kiln checkpoint state", name);
    int n = cJSON_GetArraySize(a), i = 0;
    w->n = w->head = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        char *end = NULL;
        double x = cJSON_IsString(v) ? strtod(v->valuestring, &end) : NAN;
        if (!end || end == v->valuestring || *end)
            return kiln_errorf(err, KILN_ERR_RUNTIME, "guards.%s holds a non-number (state.json)", name);
        if (i++ >= n - w->cap) // keep the newest cap values
            window_push(w, x);
    }
    return 0;
}

cJSON *kiln_guards_to_json(const struct kiln_guards *g) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "skipped_total", (double)g->skipped_total);
    for (int s = 1; s < KILN_SKIP_N; s++)
        cJSON_AddNumberToObject(j, kiln_skip_name(s), (double)g->skipped[s]);
    cJSON_AddNumberToObject(j, "consecutive", g->consecutive);
    cJSON_AddItemToObject(j, "loss_window", window_to_json(&g->loss));
    cJSON_AddItemToObject(j, "grad_norm_window", window_to_json(&g->grad));
    return j;
}

// The counters are checked among themselves: each skip has one reason, and skips in a row are skips. Each
// count is at most 2^53 (kiln_ckpt_state_count): guards.skipped_total 1e300 once came back as -9.2e18.
int kiln_guards_from_json(struct kiln_guards *g, const cJSON *j, struct kiln_error *err) {
    if (!cJSON_IsObject(j))
        return kiln_errorf(err, KILN_ERR_RUNTIME, "guards missing (state.json): not a kiln checkpoint state");
    int rc;
    uint64_t total = 0, consecutive = 0, reason[KILN_SKIP_N] = {0}, sum = 0;
    if ((rc = kiln_ckpt_state_count(j, "guards.skipped_total", &total, err)) ||
        (rc = kiln_ckpt_state_count(j, "guards.consecutive", &consecutive, err)))
        return rc;
    for (int s = 1; s < KILN_SKIP_N; s++) {
        char field[64];
        snprintf(field, sizeof(field), "guards.%s", kiln_skip_name(s));
        if ((rc = kiln_ckpt_state_count(j, field, &reason[s], err)))
            return rc;
        if (reason[s] > total)
            return kiln_errorf(
                err, KILN_ERR_RUNTIME,
                "state.json field '%s' is %llu: more than guards.skipped_total %llu (every skip has "
                "one reason); the checkpoint is damaged",
                field, (unsigned long long)reason[s], (unsigned long long)total);
        sum += reason[s]; // each at most 2^53: no overflow
    }
    if (sum != total)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "state.json field 'guards.skipped_total' is %llu: the reasons' counts add up to %llu; "
            "the checkpoint is damaged",
            (unsigned long long)total, (unsigned long long)sum);
    if (consecutive > total)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "state.json field 'guards.consecutive' is %llu: more than guards.skipped_total %llu "
            "(skips in a row are skips); the checkpoint is damaged",
            (unsigned long long)consecutive, (unsigned long long)total);
    if (consecutive > INT_MAX)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "state.json field 'guards.consecutive' is %llu: more than %d; the checkpoint is damaged",
            (unsigned long long)consecutive, INT_MAX);
    g->skipped_total = (int64_t)total;
    g->consecutive = (int)consecutive;
    for (int s = 1; s < KILN_SKIP_N; s++)
        g->skipped[s] = (int64_t)reason[s];
    if ((rc = window_from_json(&g->loss, cJSON_GetObjectItemCaseSensitive(j, "loss_window"), "loss_window",
                               err)))
        return rc;
    return window_from_json(&g->grad, cJSON_GetObjectItemCaseSensitive(j, "grad_norm_window"),
                            "grad_norm_window", err);
}
