// kiln plot's drawing, with PLplot's pngcairo device (Debian's plplot-driver-cairo; no display needed).
// A grid of 3x2 panels, one per metric, the runs overlaid in the same colour in every panel; or (--bars) a
// column of bar panels, one per CSV column, the series side by side in each category.
// Built as the module libkiln_plot.so, which kiln plot loads (plot_render_load.c): no other command maps
// PLplot.
#include <errno.h>
#include <math.h>
#include <plplot.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd/plot.h"

#define DEVICE "pngcairo"

enum { COL_BG = 0, COL_FG = 1, COL_GRID = 2, COL_RUN0 = 3, N_RUN_COLORS = 10 };

// tab10, the usual palette of line plots: distinct for the first ten runs, then it repeats
static const int RUN_RGB[N_RUN_COLORS][3] = {
    {31, 119, 180}, {255, 127, 14},  {44, 160, 44},   {214, 39, 40},  {148, 103, 189},
    {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};

enum metric { M_LOSS, M_VAL_LOSS, M_LR, M_GRAD_NORM, M_TOKENS_PER_S, M_MFU, M_PEAK_MEM };

struct panel {
    const char *title;
    enum metric m, m2; // m2: a second metric drawn dashed (validation loss), or m again
};

static const struct panel PANELS[] = {
    {"loss (dashed: validation)", M_LOSS, M_VAL_LOSS},
    {"learning rate", M_LR, M_LR},
    {"grad norm", M_GRAD_NORM, M_GRAD_NORM},
    {"tokens/s", M_TOKENS_PER_S, M_TOKENS_PER_S},
    {"MFU (%)", M_MFU, M_MFU},
    {"peak memory", M_PEAK_MEM, M_PEAK_MEM},
};
#define N_PANELS ((int)(sizeof(PANELS) / sizeof(PANELS[0])))

static const double *column(const struct kiln_plot_run *r, enum metric m) {
    switch (m) {
    case M_LOSS:
        return r->loss;
    case M_VAL_LOSS:
        return r->val_loss;
    case M_LR:
        return r->lr;
    case M_GRAD_NORM:
        return r->grad_norm;
    case M_TOKENS_PER_S:
        return r->tokens_per_s;
    case M_MFU:
        return r->mfu;
    case M_PEAK_MEM:
        return r->peak_mem_bytes;
    }
    return r->loss;
}

// Display units: MFU in percent, memory in GiB or MiB (whichever keeps the numbers readable).
static double unit_of(const struct kiln_plot_spec *s, enum metric m, const char **label) {
    *label = "";
    if (m == M_MFU)
        return 100.0;
    if (m != M_PEAK_MEM)
        return 1.0;
    double mx = 0;
    for (int k = 0; k < s->n_runs; k++)
        for (int i = 0; i < s->runs[k].n; i++)
            if (s->runs[k].peak_mem_bytes[i] > mx)
                mx = s->runs[k].peak_mem_bytes[i];
    *label = mx >= 1024.0 * 1024 * 1024 ? "GiB" : "MiB";
    return mx >= 1024.0 * 1024 * 1024 ? 1.0 / (1024.0 * 1024 * 1024) : 1.0 / (1024.0 * 1024);
}

struct range {
    double lo, hi;
    int any;
};

static void range_add(struct range *g, double v) {
    if (!isfinite(v))
        return;
    g->lo = g->any && g->lo < v ? g->lo : v;
    g->hi = g->any && g->hi > v ? g->hi : v;
    g->any = 1;
}

static void range_pad(struct range *g) {
    double span = g->hi - g->lo, pad = span > 0 ? 0.05 * span : (g->hi != 0 ? 0.05 * fabs(g->hi) : 1.0);
    g->lo -= pad;
    g->hi += pad;
}

// The finite (x, y) points of a series, scaled; n is returned.
static int points(const struct kiln_plot_run *r, const double *xs, const double *ys, double scale, PLFLT *px,
                  PLFLT *py) {
    int n = 0;
    for (int i = 0; i < r->n; i++)
        if (isfinite(xs[i]) && isfinite(ys[i])) {
            px[n] = xs[i];
            py[n] = ys[i] * scale;
            n++;
        }
    return n;
}

// Short tick labels (150k, 2.5M, 6e-4): PLplot's own scale factor ("x10^-3") sits outside the panel, where
// small plots cut it off.
static void tick_label(PLINT axis, PLFLT v, char *label, PLINT length, PLPointer data) {
    double a = fabs(v);
    size_t n = (size_t)length;
    if (a < 1e-15)
        snprintf(label, n, "0");
    else if (a >= 1e9)
        snprintf(label, n, "%.3gG", v / 1e9);
    else if (a >= 1e6)
        snprintf(label, n, "%.3gM", v / 1e6);
    else if (a >= 1e4)
        snprintf(label, n, "%.3gk", v / 1e3);
    else if (a >= 0.01)
        snprintf(label, n, "%.4g", v);
    else {
        int e = (int)floor(log10(a));
        snprintf(label, n, "%.2ge%d", v / pow(10, e), e);
    }
}

// The panel's plotting area inside its subpage: room for the tick labels on the left and below, the title
// above.
static void set_viewport(void) {
    plvpor(0.17, 0.96, 0.16, 0.88);
}

static void draw_panel(const struct kiln_plot_spec *s, const struct panel *p, PLFLT *px, PLFLT *py) {
    const char *unit;
    double scale = unit_of(s, p->m, &unit);
    struct range xr = {0}, yr = {0};
    for (int k = 0; k < s->n_runs; k++) {
        const struct kiln_plot_run *r = &s->runs[k];
        const double *xs = s->x_tokens ? r->tokens : r->step, *y1 = column(r, p->m), *y2 = column(r, p->m2);
        for (int i = 0; i < r->n; i++) {
            range_add(&xr, xs[i]); // every panel spans every logged step, so that they line up
            range_add(&yr, y1[i] * scale);
            range_add(&yr, y2[i] * scale);
        }
    }
    char title[96];
    snprintf(title, sizeof(title), "%s%s%s", p->title, unit[0] ? ", " : "", unit);
    pladv(0);
    set_viewport();
    if (!yr.any) { // e.g. MFU of a device with no known peak FLOP/s
        plwind(0, 1, 0, 1);
        plcol0(COL_FG);
        plbox("bc", 0, 0, "bc", 0, 0);
        pllab(s->x_tokens ? "tokens" : "step", "", title);
        plptex(0.5, 0.5, 1, 0, 0.5, "not logged");
        return;
    }
    range_pad(&yr);
    if (xr.hi <= xr.lo)
        range_pad(&xr);
    plwind(xr.lo, xr.hi, yr.lo, yr.hi);
    plcol0(COL_GRID);
    plwidth(1);
    plbox("g", 0, 0, "g", 0, 0);
    plcol0(COL_FG);
    plbox("bcnsto", 0, 0, "bcnstvo", 0, 0);
    pllab(s->x_tokens ? "tokens" : "step", "", title);
    plwidth(2);
    for (int k = 0; k < s->n_runs; k++) {
        const struct kiln_plot_run *r = &s->runs[k];
        const double *xs = s->x_tokens ? r->tokens : r->step;
        plcol0(COL_RUN0 + k % N_RUN_COLORS);
        pllsty(1);
        int n = points(r, xs, column(r, p->m), scale, px, py);
        plline(n, px, py);
        if (n == 1)
            plpoin(1, px, py, 17);
        if (p->m2 != p->m) {
            n = points(r, xs, column(r, p->m2), scale, px, py);
            pllsty(2);
            plline(n, px, py);
            plssym(0, 0.7);
            plpoin(n, px, py, 17);
            pllsty(1);
        }
    }
}

// One entry per run, in its colour, in the first panel's top right corner (the loss falls away from it).
static void draw_legend(const struct kiln_plot_spec *s) {
    int n = s->n_runs;
    PLINT *opt = calloc((size_t)n, sizeof(PLINT)), *colors = calloc((size_t)n, sizeof(PLINT)),
          *styles = calloc((size_t)n, sizeof(PLINT));
    PLFLT *widths = calloc((size_t)n, sizeof(PLFLT));
    const char **text = calloc((size_t)n, sizeof(char *));
    if (!opt || !colors || !styles || !widths || !text)
        abort();
    for (int k = 0; k < n; k++) {
        opt[k] = PL_LEGEND_LINE;
        colors[k] = COL_RUN0 + k % N_RUN_COLORS;
        styles[k] = 1;
        widths[k] = 2;
        text[k] = s->runs[k].name;
    }
    PLFLT w, h;
    pladv(1); // back to the loss panel
    set_viewport();
    plwind(0, 1, 0, 1);
    plschr(0, 0.8);
    pllegend(&w, &h, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX,
             PL_POSITION_TOP | PL_POSITION_RIGHT | PL_POSITION_INSIDE, 0.02, 0.02, 0.08, COL_BG, COL_FG, 1, 0,
             0, n, opt, 0.8, 0.8, 1.6, 0, colors, text, NULL, NULL, NULL, NULL, colors, styles, widths, NULL,
             NULL, NULL, NULL);
    free(opt);
    free(colors);
    free(styles);
    free(widths);
    free(text);
}

// ----------------------------------------------------------------------------
// bars (--bars)

// A column's display scale: bytes in GiB or MiB, whichever keeps the numbers readable.
static double bars_unit(const struct kiln_plot_bars *b, int p, const char **label) {
    *label = "";
    size_t n = strlen(b->panels[p]);
    if (n < 6 || strcmp(b->panels[p] + n - 6, "_bytes"))
        return 1.0;
    double mx = 0;
    for (int k = 0; k < b->n_cats * b->n_series; k++) {
        double v = fabs(b->values[(size_t)p * b->n_cats * b->n_series + k]);
        mx = v > mx ? v : mx;
    }
    *label = mx >= 1024.0 * 1024 * 1024 ? "GiB" : "MiB";
    return mx >= 1024.0 * 1024 * 1024 ? 1.0 / (1024.0 * 1024 * 1024) : 1.0 / (1024.0 * 1024);
}

// Category k spans [k, k+1] on x; its bars fill the middle 80%, one slot per series, each with its value on
// top.
static void draw_bar_panel(const struct kiln_plot_bars *b, int p) {
    const char *unit;
    double scale = bars_unit(b, p, &unit);
    const double *v = b->values + (size_t)p * b->n_cats * b->n_series;
    struct range yr = {.lo = 0, .hi = 0, .any = 1}; // bars stand on zero
    for (int k = 0; k < b->n_cats * b->n_series; k++)
        range_add(&yr, v[k] * scale);
    if (yr.hi <= yr.lo)
        yr.hi = yr.lo + 1;
    double span = yr.hi - yr.lo;
    yr.hi += yr.hi > 0 ? 0.12 * span : 0; // room for the value labels
    yr.lo -= yr.lo < 0 ? 0.12 * span : 0;
    char title[160];
    snprintf(title, sizeof(title), "%s%s%s", b->panels[p], unit[0] ? ", " : "", unit);
    pladv(0);
    plvpor(0.08, 0.98, 0.16, 0.88);
    plwind(0, b->n_cats, yr.lo, yr.hi);
    plcol0(COL_GRID);
    plwidth(1);
    plbox("", 0, 0, "g", 0, 0);
    plcol0(COL_FG);
    plbox("bc", 0, 0, "bcnstvo", 0, 0);
    pllab("", "", title);
    double slot = 0.8 / b->n_series;
    for (int c = 0; c < b->n_cats; c++) {
        plcol0(COL_FG);
        plschr(0, 0.9);
        plmtex("b", 1.5, (c + 0.5) / b->n_cats, 0.5, b->cats[c]);
        for (int s = 0; s < b->n_series; s++) {
            double y = v[c * b->n_series + s] * scale;
            if (!isfinite(y))
                continue;
            double x0 = c + 0.1 + s * slot, x1 = x0 + slot * 0.92;
            PLFLT bx[5] = {x0, x1, x1, x0, x0}, by[5] = {0, 0, y, y, 0};
            plcol0(COL_RUN0 + s % N_RUN_COLORS);
            plfill(4, bx, by);
            plcol0(COL_FG);
            plwidth(1);
            plline(5, bx, by);
            char text[32];
            tick_label(PL_Y_AXIS, y, text, sizeof(text), NULL);
            plschr(0, 0.6);
            plptex((x0 + x1) / 2, y + (y >= 0 ? 0.02 : -0.06) * (yr.hi - yr.lo), 1, 0, 0.5, text);
        }
    }
    plschr(0, 1.0);
}

// The series' colours, in the first panel's top right corner; nothing when there is one unnamed series.
static void draw_bar_legend(const struct kiln_plot_bars *b) {
    int n = b->n_series;
    if (n == 1 && !b->series[0][0])
        return;
    PLINT *opt = calloc((size_t)n, sizeof(PLINT)), *colors = calloc((size_t)n, sizeof(PLINT)),
          *patterns = calloc((size_t)n, sizeof(PLINT)), *text_colors = calloc((size_t)n, sizeof(PLINT));
    PLFLT *scales = calloc((size_t)n, sizeof(PLFLT)), *widths = calloc((size_t)n, sizeof(PLFLT));
    if (!opt || !colors || !patterns || !text_colors || !scales || !widths)
        abort();
    for (int k = 0; k < n; k++) {
        opt[k] = PL_LEGEND_COLOR_BOX;
        colors[k] = COL_RUN0 + k % N_RUN_COLORS;
        text_colors[k] = COL_FG;
        scales[k] = 0.8;
        widths[k] = 1;
    }
    PLFLT w, h;
    pladv(1);
    plvpor(0.08, 0.98, 0.16, 0.88);
    plwind(0, 1, 0, 1);
    plschr(0, 0.8);
    pllegend(&w, &h, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX,
             PL_POSITION_TOP | PL_POSITION_RIGHT | PL_POSITION_INSIDE, 0.01, 0.01, 0.05, COL_BG, COL_FG, 1, 0,
             0, n, opt, 0.8, 0.8, 1.6, 0, text_colors, (const char *const *)b->series, colors, patterns,
             scales, widths, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    free(opt);
    free(colors);
    free(patterns);
    free(text_colors);
    free(scales);
    free(widths);
}

// ----------------------------------------------------------------------------
// the page

static int device_present(void) {
    const char *menu[128], *names[128];
    PLCHAR_VECTOR *pm = menu, *pn = names;
    int n = 128;
    plgDevs(&pm, &pn, &n);
    for (int i = 0; i < n; i++)
        if (!strcmp(pn[i], DEVICE))
            return 1;
    return 0;
}

int kiln_plot_render_png(const struct kiln_plot_spec *s, struct kiln_error *err) {
    // PLplot exits the process on a fatal error, so what could fail is checked first
    if (!device_present())
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "PLplot has no %s device (%s): install plplot-driver-cairo, or "
                           "point PLPLOT_DRV_DIR at its drivers directory",
                           DEVICE, s->out);
    FILE *probe = fopen(s->out, "wb");
    if (!probe)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write the plot (%s): %s; pick a writable --out",
                           s->out, strerror(errno));
    fclose(probe);
    int n_max = 1;
    for (int k = 0; k < s->n_runs && !s->bars; k++)
        n_max = s->runs[k].n > n_max ? s->runs[k].n : n_max;
    PLFLT *px = kiln_xmalloc((size_t)n_max * sizeof(PLFLT)),
          *py = kiln_xmalloc((size_t)n_max * sizeof(PLFLT));

    plsdev(DEVICE);
    plsfnam(s->out);
    plspage(0, 0, s->width, s->height, 0, 0);
    plscmap0n(COL_RUN0 + N_RUN_COLORS);
    plscol0(COL_BG, 255, 255, 255);
    plscol0(COL_FG, 0, 0, 0);
    plscol0(COL_GRID, 220, 220, 220);
    for (int i = 0; i < N_RUN_COLORS; i++)
        plscol0(COL_RUN0 + i, RUN_RGB[i][0], RUN_RGB[i][1], RUN_RGB[i][2]);
    if (s->bars) {
        plstar(1, s->bars->n_panels);
        plslabelfunc(tick_label, NULL);
        for (int p = 0; p < s->bars->n_panels; p++)
            draw_bar_panel(s->bars, p);
        draw_bar_legend(s->bars);
    } else {
        plstar(3, 2);
        plslabelfunc(tick_label, NULL);
        for (int i = 0; i < N_PANELS; i++)
            draw_panel(s, &PANELS[i], px, py);
        draw_legend(s);
    }
    plend();
    free(px);
    free(py);

    struct stat st;
    if (stat(s->out, &st) != 0 || st.st_size == 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "PLplot wrote nothing (%s): the %s device failed; run with "
                           "PLplot's messages on stderr to see why",
                           s->out, DEVICE);
    return 0;
}
