// TensorBoard event files in a build without protobuf-c: --tensorboard says what is missing.
#include "io/tensorboard.h"

#include <stddef.h>

int kiln_tb_available(void) {
    return 0;
}

int kiln_tb_open(const char *dir, const char *what, struct kiln_tb **out, struct kiln_error *err) {
    *out = NULL;
    return kiln_errorf(
        err, KILN_ERR_USAGE,
        "TensorBoard events are not in this build (%s=%s): kiln was built without protobuf-c; "
        "install libprotobuf-c-dev and protobuf-c-compiler (scripts/install-deps.sh) and rebuild",
        what, dir);
}

int kiln_tb_write_start(struct kiln_tb *tb, int64_t step, struct kiln_error *err) {
    return kiln_errorf(err, KILN_ERR_RUNTIME, "TensorBoard events are not in this build");
}

int kiln_tb_write_scalars(struct kiln_tb *tb, int64_t step, const struct kiln_tb_scalar *v, int n,
                          struct kiln_error *err) {
    return kiln_errorf(err, KILN_ERR_RUNTIME, "TensorBoard events are not in this build");
}

int kiln_tb_write_text(struct kiln_tb *tb, int64_t step, const char *tag, const char *text,
                       struct kiln_error *err) {
    return kiln_errorf(err, KILN_ERR_RUNTIME, "TensorBoard events are not in this build");
}

const char *kiln_tb_path(const struct kiln_tb *tb) {
    return "";
}

void kiln_tb_close(struct kiln_tb *tb) {}
