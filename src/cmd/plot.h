// kiln plot: the runs' metrics (read by plot.c from RUN/metrics.jsonl) and their rendering into a PNG
// (plot_render.c with PLplot, built as the module libkiln_plot.so that plot_render_load.c loads; or
// plot_render_none.c in a build without PLplot).
#ifndef KILN_CMD_PLOT_H
#define KILN_CMD_PLOT_H

#include "util/error.h"

// One run's logged steps; a field the line lacks is NAN.
struct kiln_plot_run {
    char name[256]; // the RUN argument, for the legend
    int n;          // rows
    double *step, *tokens, *loss, *val_loss, *lr, *grad_norm, *tokens_per_s, *ms, *mfu,
        *peak_mem_bytes; // (n)
};

// A bar chart read from a CSV (kiln plot --bars): one panel per numeric column; along x the categories (the
// label column's values, in order of first appearance), and in each category one bar per series (the series
// column's values), side by side.
struct kiln_plot_bars {
    int n_cats, n_series, n_panels;
    char **cats, **series, **panels; // names: (n_cats), (n_series), (n_panels) column headers
    double *values;                  // (n_panels, n_cats, n_series); NAN: no bar
};

struct kiln_plot_spec {
    const char *out;   // FILE.png
    int width, height; // pixels
    int x_tokens;      // x axis: tokens (1) or step (0)
    int n_runs;
    const struct kiln_plot_run *runs;
    const struct kiln_plot_bars *bars; // non-NULL: draw these bars instead of runs
};

// 1 if kiln can draw plots here (a build with PLplot, whose module and libraries load), else 0 and
// kiln_plot_render says what is missing.
int kiln_plot_available(void);
// Draws the panels (loss and validation loss, learning rate, grad norm, tokens/s, MFU, peak memory) into
// spec->out, the runs overlaid with a legend; or, when spec->bars is set, its bar panels stacked one above
// the other, the series in the palette's colours with a legend.
int kiln_plot_render(const struct kiln_plot_spec *spec, struct kiln_error *err);
// kiln_plot_render's drawing itself, in the module (plot_render.c).
int kiln_plot_render_png(const struct kiln_plot_spec *spec, struct kiln_error *err);

#endif
