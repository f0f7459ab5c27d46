// kiln plot RUN... --out=FILE.png [--x=step|tokens] [--width=W] [--height=H]: reads each RUN/metrics.jsonl
// (docs/runs.md) and draws the runs overlaid (plot_render.c).
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd/cmd.h"
#include "cmd/plot.h"
#include "io/fsutil.h"
#include "model/config.h"

#define PLOT_USAGE "kiln plot RUN... --out=FILE.png [--x=step|tokens] [--width=W --height=H]"

// ----------------------------------------------------------------------------
// reading a run

static double field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void run_push(struct kiln_plot_run *r, int *cap, const cJSON *o) {
    if (r->n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        double **cols[] = {&r->step,      &r->tokens,       &r->loss, &r->val_loss, &r->lr,
                           &r->grad_norm, &r->tokens_per_s, &r->ms,   &r->mfu,      &r->peak_mem_bytes};
        for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++)
            *cols[i] = kiln_xrealloc(*cols[i], (size_t)*cap * sizeof(double));
    }
    int i = r->n++;
    r->step[i] = field(o, "step");
    r->tokens[i] = field(o, "tokens");
    r->loss[i] = field(o, "loss");
    r->val_loss[i] = field(o, "val_loss");
    r->lr[i] = field(o, "lr");
    r->grad_norm[i] = field(o, "grad_norm");
    r->tokens_per_s[i] = field(o, "tokens_per_s");
    r->ms[i] = field(o, "ms");
    r->mfu[i] = field(o, "mfu");
    r->peak_mem_bytes[i] = field(o, "peak_mem_bytes");
}

static void run_free(struct kiln_plot_run *r) {
    free(r->step);
    free(r->tokens);
    free(r->loss);
    free(r->val_loss);
    free(r->lr);
    free(r->grad_norm);
    free(r->tokens_per_s);
    free(r->ms);
    free(r->mfu);
    free(r->peak_mem_bytes);
}

// RUN/metrics.jsonl into r. A last line without its newline is a write in progress (a live run) and is left
// out; any other line that is not an object with a numeric step is an error naming the line.
static int run_read(const char *dir, struct kiln_plot_run *r, struct kiln_error *err) {
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%s", dir);
    size_t len = strlen(r->name);
    while (len > 1 && r->name[len - 1] == '/')
        r->name[--len] = '\0';
    struct stat st;
    int found = stat(dir, &st) == 0;
    if (!found || !S_ISDIR(st.st_mode))
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "no run directory (%s): %s; pass the --out directory of kiln train", dir,
                           found ? "not a directory" : strerror(errno));
    char path[1200];
    snprintf(path, sizeof(path), "%s/metrics.jsonl", r->name);
    FILE *probe = fopen(path, "rb");
    if (!probe)
        return kiln_errorf(err, KILN_ERR_USAGE, "no metrics (%s): %s; kiln train --out=DIR writes it", path,
                           strerror(errno));
    fclose(probe);
    char *data;
    size_t n;
    int rc = kiln_read_file(path, &data, &n, err);
    if (rc)
        return rc;
    int cap = 0, lineno = 0;
    for (char *line = data; line < data + n && !rc;) {
        char *nl = memchr(line, '\n', (size_t)(data + n - line));
        lineno++;
        if (!nl)
            break; // torn
        *nl = '\0';
        char *p = line;
        line = nl + 1;
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (!*p)
            continue;
        cJSON *o = cJSON_Parse(p);
        if (!cJSON_IsObject(o) || !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "step")))
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "malformed metrics line (%s:%d): %s; each line is one JSON object with a "
                             "\"step\" (docs/runs.md)",
                             path, lineno,
                             o && cJSON_IsObject(o) ? "no numeric \"step\"" : "not a JSON object");
        else
            run_push(r, &cap, o);
        cJSON_Delete(o);
    }
    free(data);
    if (!rc && r->n == 0)
        rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                         "no metrics (%s): the file has no complete line; plot a run "
                         "that has logged a step",
                         path);
    return rc;
}

// The tokens trained on through each row, when the lines lack a "tokens" field: step * tokens per step.
// RUN/config gives batch*seq and --total-batch; without --total-batch a step is batch*seq*ranks, and the
// ranks follow from a row's tokens_per_s * ms (rounded to whole batch*seq multiples).
static int run_tokens(struct kiln_plot_run *r, struct kiln_error *err) {
    int have = 1;
    for (int i = 0; i < r->n; i++)
        have &= !isnan(r->tokens[i]);
    if (have)
        return 0;
    char path[1200], arg[1220];
    snprintf(path, sizeof(path), "%s/config", r->name);
    snprintf(arg, sizeof(arg), "--config=%s", path);
    struct kiln_config cfg;
    struct kiln_error e;
    char *args[] = {arg};
    if (kiln_config_init(&cfg, NULL, &e) || kiln_config_parse(&cfg, 1, args, &e))
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot count tokens (%s): %s; plot against --x=step", path,
                           e.msg);
    double bt = (double)cfg.batch_size * cfg.seq_len, per_step = (double)cfg.total_batch_tokens;
    if (per_step <= 0) {
        int ranks = 1;
        for (int i = 0; i < r->n; i++)
            if (r->tokens_per_s[i] > 0 && r->ms[i] > 0) {
                ranks = (int)lround(r->tokens_per_s[i] * r->ms[i] * 1e-3 / bt);
                break;
            }
        per_step = bt * (ranks > 0 ? ranks : 1);
    }
    for (int i = 0; i < r->n; i++)
        if (isnan(r->tokens[i]))
            r->tokens[i] = r->step[i] * per_step;
    return 0;
}

// ----------------------------------------------------------------------------
// the command

static int parse_size(const char *name, const char *v, int *out, struct kiln_error *err) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < 200 || x > 10000)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "bad value '%s' for %s (--%s): a whole number of pixels, 200 to "
                           "10000",
                           v, name, name);
    *out = (int)x;
    return 0;
}

static int run_plot(int argc, char **argv, struct kiln_error *err) {
    struct kiln_plot_spec spec = {.width = 1500, .height = 900};
    const char **dirs = kiln_xcalloc((size_t)argc + 1, sizeof(*dirs));
    int n_dirs = 0, rc = 0;
    for (int i = 0; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "--out=", 6))
            spec.out = a + 6;
        else if (!strncmp(a, "--x=", 4)) {
            if (strcmp(a + 4, "step") && strcmp(a + 4, "tokens"))
                rc = kiln_errorf(err, KILN_ERR_USAGE,
                                 "bad value '%s' for x (--x): allowed values are step,tokens", a + 4);
            spec.x_tokens = !strcmp(a + 4, "tokens");
        } else if (!strncmp(a, "--width=", 8))
            rc = parse_size("width", a + 8, &spec.width, err);
        else if (!strncmp(a, "--height=", 9))
            rc = parse_size("height", a + 9, &spec.height, err);
        else if (!strncmp(a, "--", 2))
            rc = kiln_errorf(err, KILN_ERR_USAGE, "unknown option '%s' (kiln plot): write %s", a, PLOT_USAGE);
        else
            dirs[n_dirs++] = a;
    }
    if (!rc && (!spec.out || !spec.out[0]))
        rc = kiln_errorf(err, KILN_ERR_USAGE, "missing --out=FILE.png (kiln plot): write %s", PLOT_USAGE);
    if (!rc && n_dirs == 0)
        rc = kiln_errorf(err, KILN_ERR_USAGE, "no runs to plot (kiln plot): write %s", PLOT_USAGE);
    if (!rc && !kiln_plot_available()) // before reading anything: say what the build lacks
        rc = kiln_plot_render(&spec, err);
    struct kiln_plot_run *runs = kiln_xcalloc((size_t)n_dirs + 1, sizeof(*runs));
    for (int i = 0; i < n_dirs && !rc; i++) {
        rc = run_read(dirs[i], &runs[i], err);
        if (!rc && spec.x_tokens)
            rc = run_tokens(&runs[i], err);
    }
    if (!rc) {
        spec.runs = runs;
        spec.n_runs = n_dirs;
        rc = kiln_plot_render(&spec, err);
    }
    if (!rc)
        printf("wrote %s (%dx%d, %d run%s)\n", spec.out, spec.width, spec.height, n_dirs,
               n_dirs == 1 ? "" : "s");
    for (int i = 0; i < n_dirs; i++)
        run_free(&runs[i]);
    free(runs);
    free(dirs);
    return rc;
}

int cmd_plot(int argc, char **argv) {
    struct kiln_error err;
    int rc = run_plot(argc, argv, &err);
    return rc ? kiln_error_print(&err) : 0;
}
