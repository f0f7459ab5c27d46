// Errors are values. A function that can fail on user input returns int (0 = ok) and fills a
// struct kiln_error; only cmd/ prints it and exits. The message reads "<what> (<where>): <why>; <hint>",
// and cmd/ prefixes "error: ".
#ifndef KILN_UTIL_ERROR_H
#define KILN_UTIL_ERROR_H

#include <stdio.h>
#include <stdlib.h>

enum { KILN_OK = 0, KILN_ERR_RUNTIME = 1, KILN_ERR_USAGE = 2 };

struct kiln_error {
    int code;       // KILN_ERR_USAGE (exit 2) or KILN_ERR_RUNTIME (exit 1)
    char msg[1024]; // one line, no trailing newline, no "error: " prefix
};

// Fills e (if non-NULL) and returns code, so callers can write `return kiln_errorf(e, KILN_ERR_USAGE, ...)`.
int kiln_errorf(struct kiln_error *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// Prints "error: <msg>" to stderr and returns e->code (for cmd/ only).
int kiln_error_print(const struct kiln_error *e);

// Internal invariants. Stays on in release builds (docs/architecture.md).
#define KILN_ASSERT(cond)                                                                                   \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "kiln: internal error at %s:%d: assertion failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                                                \
            abort();                                                                                       \
        }                                                                                                  \
    } while (0)

// malloc that aborts with a message on failure (host memory exhaustion is not recoverable here).
void *kiln_xmalloc(size_t bytes);
void *kiln_xcalloc(size_t n, size_t size);
void *kiln_xrealloc(void *p, size_t bytes);
char *kiln_xstrdup(const char *s);

#endif
