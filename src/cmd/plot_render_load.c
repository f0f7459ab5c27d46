// kiln plot in a build with PLplot: the drawing (plot_render.c) is the module libkiln_plot.so beside the kiln
// binary, loaded here on first use, so that no other command maps PLplot and the libraries it pulls in.
#include <string.h>

#include "cmd/plot.h"
#include "util/module.h"

typedef int (*render_fn)(const struct kiln_plot_spec *spec, struct kiln_error *err);

// the module's renderer, or NULL (and err filled)
static render_fn renderer(struct kiln_error *err) {
    void *sym = kiln_module_symbol("libkiln_plot.so", "kiln_plot_render_png", "kiln plot",
                                   "install PLplot's library and its cairo driver (libplplot17 and "
                                   "plplot-driver-cairo; scripts/install-deps.sh), or add their directory to "
                                   "LD_LIBRARY_PATH",
                                   err);
    render_fn f = NULL;
    memcpy(&f, &sym, sizeof(f)); // POSIX: the symbol's address is the function's
    return f;
}

int kiln_plot_available(void) {
    return renderer(NULL) != NULL;
}

int kiln_plot_render(const struct kiln_plot_spec *spec, struct kiln_error *err) {
    struct kiln_error e = {0};
    render_fn f = renderer(&e);
    if (!f) {
        if (err)
            *err = e;
        return e.code;
    }
    return f(spec, err);
}
