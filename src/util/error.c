#include "util/error.h"

#include <stdarg.h>
#include <string.h>

int kiln_errorf(struct kiln_error *e, int code, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
        va_end(ap);
        e->code = code;
    }
    return code;
}

int kiln_error_print(const struct kiln_error *e) {
    fprintf(stderr, "error: %s\n", e->msg);
    return e->code ? e->code : KILN_ERR_RUNTIME;
}

void *kiln_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "error: out of host memory (allocating %zu bytes)\n", bytes);
        exit(KILN_ERR_RUNTIME);
    }
    return p;
}

void *kiln_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "error: out of host memory (allocating %zu x %zu bytes)\n", n, size);
        exit(KILN_ERR_RUNTIME);
    }
    return p;
}

void *kiln_xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) {
        fprintf(stderr, "error: out of host memory (allocating %zu bytes)\n", bytes);
        exit(KILN_ERR_RUNTIME);
    }
    return q;
}

char *kiln_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = kiln_xmalloc(n);
    memcpy(p, s, n);
    return p;
}
