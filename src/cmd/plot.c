// kiln plot RUN... --out=FILE.png [--x=step|tokens] [--width=W] [--height=H]: reads each RUN/metrics.jsonl
// (docs/runs.md) and draws the runs overlaid (plot_render.c).
// kiln plot --bars=FILE.csv --out=FILE.png [--label=COL] [--series=COL] [--panels=COL,...]: grouped bars from
// a CSV with a header row (bench/strategies.sh writes one), a panel per numeric column.
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
#include "run/options.h"

#define PLOT_USAGE                                                                                           \
    "kiln plot RUN... --out=FILE.png [--x=step|tokens] [--width=W --height=H], or kiln plot "                \
    "--bars=FILE.csv --out=FILE.png [--label=COL] [--series=COL] [--panels=COL,...]"

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
// reading a CSV for --bars

// The options of the bars mode; NULL: not given.
struct bars_opts {
    const char *file, *label, *series, *panels;
};

struct csv {
    int n_cols, n_rows;
    char **head;  // (n_cols)
    char ***rows; // (n_rows, n_cols), pointers into data
    int *lineno;  // (n_rows): the file's line of each row
    char *data;
};

static void csv_free(struct csv *c) {
    for (int i = 0; i < c->n_rows; i++)
        free(c->rows[i]);
    free(c->rows);
    free(c->head);
    free(c->lineno);
    free(c->data);
}

static char *trim(char *p) {
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\r'))
        p[--n] = '\0';
    return p;
}

// Splits a line at its commas (no quoting: a field holds no comma) into at most max fields; the count.
static int split(char *line, char **fields, int max) {
    int n = 0;
    for (char *p = line;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (n < max)
            fields[n] = trim(p);
        n++;
        if (!comma)
            return n;
        p = comma + 1;
    }
}

// FILE into c: the header row, then rows of as many fields; blank lines are skipped.
static int csv_read(const char *path, struct csv *c, struct kiln_error *err) {
    memset(c, 0, sizeof(*c));
    FILE *probe = fopen(path, "rb");
    if (!probe)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "cannot read the CSV (%s): %s; pass --bars=FILE.csv, a header "
                           "row then a row per bar",
                           path, strerror(errno));
    fclose(probe);
    size_t n;
    int rc = kiln_read_file(path, &c->data, &n, err);
    if (rc)
        return rc;
    int cap = 0, lineno = 0;
    for (char *line = c->data; line < c->data + n && !rc;) {
        char *nl = memchr(line, '\n', (size_t)(c->data + n - line));
        if (nl) // else the last line, ended by the NUL that kiln_read_file puts after the data
            *nl = '\0';
        char *p = line;
        line = nl ? nl + 1 : c->data + n;
        lineno++;
        if (!*trim(p))
            continue;
        if (!c->head) {
            c->n_cols = 1;
            for (const char *q = p; *q; q++)
                c->n_cols += *q == ',';
            c->head = kiln_xcalloc((size_t)c->n_cols, sizeof(char *));
            split(p, c->head, c->n_cols);
            for (int j = 0; j < c->n_cols && !rc; j++)
                if (!c->head[j][0])
                    rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                                     "bad CSV header (%s:%d): column %d has no name; the first line names "
                                     "every column",
                                     path, lineno, j + 1);
            continue;
        }
        char **f = kiln_xcalloc((size_t)c->n_cols, sizeof(char *));
        int got = split(p, f, c->n_cols);
        if (got != c->n_cols) {
            free(f);
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "bad CSV row (%s:%d): %d fields, the header has %d; one value per column, no "
                             "commas inside a value",
                             path, lineno, got, c->n_cols);
            break;
        }
        if (c->n_rows == cap) {
            cap = cap ? 2 * cap : 16;
            c->rows = kiln_xrealloc(c->rows, (size_t)cap * sizeof(*c->rows));
            c->lineno = kiln_xrealloc(c->lineno, (size_t)cap * sizeof(int));
        }
        c->rows[c->n_rows] = f;
        c->lineno[c->n_rows++] = lineno;
    }
    if (!rc && !c->n_rows)
        rc = kiln_errorf(err, KILN_ERR_RUNTIME, "no data (%s): %s; a header row, then a row per bar", path,
                         c->head ? "only a header row" : "the file is empty");
    return rc;
}

static int csv_column(const struct csv *c, const char *name) {
    for (int j = 0; j < c->n_cols; j++)
        if (!strcmp(c->head[j], name))
            return j;
    return -1;
}

// A cell as a number: 1 and *v, or 0 for an empty or "n/a" cell (no bar), or -1 for anything else.
static int cell_number(const char *s, double *v) {
    if (!*s || !strcmp(s, "n/a") || !strcmp(s, "NA") || !strcmp(s, "-"))
        return 0;
    char *end;
    *v = strtod(s, &end);
    return *end || !isfinite(*v) ? -1 : 1;
}

// The index of name in the list, appended when new.
static int intern(char ***names, int *n, const char *name) {
    for (int i = 0; i < *n; i++)
        if (!strcmp((*names)[i], name))
            return i;
    *names = kiln_xrealloc(*names, (size_t)(*n + 1) * sizeof(char *));
    (*names)[*n] = kiln_xstrdup(name);
    return (*n)++;
}

static void bars_free(struct kiln_plot_bars *b) {
    for (int i = 0; i < b->n_cats; i++)
        free(b->cats[i]);
    for (int i = 0; i < b->n_series; i++)
        free(b->series[i]);
    for (int i = 0; i < b->n_panels; i++)
        free(b->panels[i]);
    free(b->cats);
    free(b->series);
    free(b->panels);
    free(b->values);
}

static int missing_column(const char *path, const char *opt, const char *name, struct kiln_error *err) {
    return kiln_errorf(err, KILN_ERR_USAGE, "no column '%s' in %s (%s): name a column of its header row",
                       name, path, opt);
}

// The CSV's rows as bars: categories from the label column (default the first), series from the series
// column (default one), a panel per --panels column (default every numeric column but those two).
static int bars_read(const struct bars_opts *o, struct kiln_plot_bars *b, struct kiln_error *err) {
    memset(b, 0, sizeof(*b));
    struct csv c;
    int rc = csv_read(o->file, &c, err);
    int label = 0, series = -1;
    if (!rc && o->label && (label = csv_column(&c, o->label)) < 0)
        rc = missing_column(o->file, "--label", o->label, err);
    if (!rc && o->series && (series = csv_column(&c, o->series)) < 0)
        rc = missing_column(o->file, "--series", o->series, err);
    int *cols = kiln_xcalloc((size_t)c.n_cols + 1, sizeof(int));
    int n_cols = 0;
    if (!rc && o->panels) {
        char *list = kiln_xstrdup(o->panels), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
            int j = csv_column(&c, trim(t));
            if (j < 0)
                rc = missing_column(o->file, "--panels", trim(t), err);
            else if (n_cols < c.n_cols)
                cols[n_cols++] = j;
        }
        free(list);
    } else if (!rc) {
        for (int j = 0; j < c.n_cols; j++) {
            int numeric = j != label && j != series, any = 0;
            for (int i = 0; i < c.n_rows && numeric; i++) {
                double v;
                int k = cell_number(c.rows[i][j], &v);
                numeric = k >= 0;
                any |= k > 0;
            }
            if (numeric && any)
                cols[n_cols++] = j;
        }
    }
    if (!rc && !n_cols)
        rc = kiln_errorf(err, KILN_ERR_USAGE,
                         "nothing to draw (%s): no column of numbers besides the label and series; name "
                         "some with --panels=COL,...",
                         o->file);
    for (int i = 0; i < c.n_rows && !rc; i++) {
        intern(&b->cats, &b->n_cats, c.rows[i][label]);
        intern(&b->series, &b->n_series, series >= 0 ? c.rows[i][series] : "");
    }
    if (!rc) {
        b->n_panels = n_cols;
        b->panels = kiln_xcalloc((size_t)n_cols, sizeof(char *));
        for (int p = 0; p < n_cols; p++)
            b->panels[p] = kiln_xstrdup(c.head[cols[p]]);
        size_t n_values = (size_t)n_cols * b->n_cats * b->n_series;
        b->values = kiln_xmalloc(n_values * sizeof(double));
        for (size_t k = 0; k < n_values; k++)
            b->values[k] = NAN;
        char *seen = kiln_xcalloc((size_t)b->n_cats * b->n_series, 1);
        for (int i = 0; i < c.n_rows && !rc; i++) {
            int ci = intern(&b->cats, &b->n_cats, c.rows[i][label]);
            int si = intern(&b->series, &b->n_series, series >= 0 ? c.rows[i][series] : "");
            if (seen[ci * b->n_series + si]++) {
                rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                                 "duplicate bar (%s:%d): another row has %s '%s'%s%s; one row per bar, or "
                                 "name the column that tells them apart with --series",
                                 o->file, c.lineno[i], c.head[label], c.rows[i][label],
                                 series >= 0 ? " and series " : "", series >= 0 ? c.rows[i][series] : "");
                break;
            }
            for (int p = 0; p < n_cols && !rc; p++) {
                const char *cell = c.rows[i][cols[p]];
                double v;
                int k = cell_number(cell, &v);
                if (k < 0)
                    rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                                     "bad number '%s' in column %s (%s:%d): a bar's value is a number, or "
                                     "empty or n/a for no bar",
                                     cell, c.head[cols[p]], o->file, c.lineno[i]);
                else if (k > 0)
                    b->values[((size_t)p * b->n_cats + ci) * b->n_series + si] = v;
            }
        }
        free(seen);
    }
    free(cols);
    csv_free(&c);
    return rc;
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

static int run_bars(struct kiln_plot_spec *spec, const struct bars_opts *o, struct kiln_error *err) {
    if (!o->file[0])
        return kiln_errorf(err, KILN_ERR_USAGE, "empty --bars (kiln plot): write --bars=FILE.csv");
    if (!kiln_plot_available()) // before reading anything: say what the build lacks
        return kiln_plot_render(spec, err);
    struct kiln_plot_bars b;
    int rc = bars_read(o, &b, err);
    if (!rc) {
        spec->bars = &b;
        rc = kiln_plot_render(spec, err);
        spec->bars = NULL;
    }
    if (!rc)
        printf("wrote %s (%dx%d, %d panel%s of %d bar group%s)\n", spec->out, spec->width, spec->height,
               b.n_panels, b.n_panels == 1 ? "" : "s", b.n_cats, b.n_cats == 1 ? "" : "s");
    bars_free(&b);
    return rc;
}

static int run_plot(int argc, char **argv, struct kiln_error *err) {
    struct kiln_plot_spec spec = {.width = 1500, .height = 900};
    const char **dirs = kiln_xcalloc((size_t)argc + 1, sizeof(*dirs));
    struct bars_opts bo = {0};
    int n_dirs = 0, rc = 0, x_given = 0;
    for (int i = 0; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "--out=", 6))
            spec.out = a + 6;
        else if (!strncmp(a, "--bars=", 7))
            bo.file = a + 7;
        else if (!strncmp(a, "--label=", 8))
            bo.label = a + 8;
        else if (!strncmp(a, "--series=", 9))
            bo.series = a + 9;
        else if (!strncmp(a, "--panels=", 9))
            bo.panels = a + 9;
        else if (!strncmp(a, "--x=", 4)) {
            x_given = 1;
            if (strcmp(a + 4, "step") && strcmp(a + 4, "tokens"))
                rc = kiln_errorf(err, KILN_ERR_USAGE,
                                 "bad value '%s' for x (--x): allowed values are step,tokens", a + 4);
            spec.x_tokens = !strcmp(a + 4, "tokens");
        } else if (!strncmp(a, "--width=", 8))
            rc = parse_size("width", a + 8, &spec.width, err);
        else if (!strncmp(a, "--height=", 9))
            rc = parse_size("height", a + 9, &spec.height, err);
        else if (!strncmp(a, "--", 2)) {
            static const char *const names[] = {"out",   "x",      "width",  "height", "bars",
                                                "label", "series", "panels", "help",   NULL};
            rc = cmd_unknown_option(err, "plot", a, names,
                                    "--out, --x, --width, --height, --bars, --label, "
                                    "--series, --panels (kiln help plot)");
        } else
            dirs[n_dirs++] = a;
    }
    if (!rc && (!spec.out || !spec.out[0]))
        rc = kiln_errorf(err, KILN_ERR_USAGE, "missing --out=FILE.png (kiln plot): write %s", PLOT_USAGE);
    if (!rc && bo.file && (n_dirs || x_given))
        rc = kiln_errorf(err, KILN_ERR_USAGE,
                         "%s with --bars (kiln plot): --bars draws a CSV; plot runs in a second call",
                         n_dirs ? "run directories" : "--x");
    if (!rc && !bo.file && (bo.label || bo.series || bo.panels))
        rc = kiln_errorf(err, KILN_ERR_USAGE,
                         "--label, --series and --panels without --bars (kiln plot): they pick a CSV's "
                         "columns; write %s",
                         PLOT_USAGE);
    if (!rc && bo.file) {
        free(dirs);
        return run_bars(&spec, &bo, err);
    }
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

int cmd_plot(int argc, char **argv, const struct kiln_knobs *knobs) {
    (void)knobs; // (it reads metrics files, nothing the knobs tune)
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf(
                "usage: %s\n"
                "  RUN...: run directories (their metrics.jsonl), drawn overlaid in panels of loss, learning "
                "rate,\n"
                "  grad norm, tok/s, MFU and memory; --x=tokens puts tokens seen on the x axis.\n"
                "  --bars: grouped bars from a CSV with a header row, a panel per numeric column "
                "(--panels),\n"
                "  a bar group per --label value and a bar per --series value.\n"
                "  --width, --height: the PNG's size in pixels (default 1500x900).\n",
                PLOT_USAGE);
            return 0;
        }
    struct kiln_error err;
    int rc = run_plot(argc, argv, &err);
    return rc ? kiln_error_print(&err) : 0;
}
