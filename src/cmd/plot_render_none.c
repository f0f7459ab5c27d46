// kiln plot in a build without PLplot: says what is missing.
#include "cmd/plot.h"

int kiln_plot_available(void) {
    return 0;
}

int kiln_plot_render(const struct kiln_plot_spec *spec, struct kiln_error *err) {
    return kiln_errorf(
        err, KILN_ERR_USAGE,
        "kiln plot is not in this build (%s): kiln was built without PLplot; install libplplot-dev "
        "and plplot-driver-cairo (scripts/install-deps.sh) and rebuild",
        spec->out);
}
