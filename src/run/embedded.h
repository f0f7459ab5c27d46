// Data compiled into the binary, so `kiln train` works with no files around it.
#ifndef KILN_RUN_EMBEDDED_H
#define KILN_RUN_EMBEDDED_H

#include <stddef.h>

// Tiny Shakespeare (public domain; see data/SOURCES.md), 1,115,394 bytes.
const char *kiln_embedded_shakespeare(size_t *n);

#endif
