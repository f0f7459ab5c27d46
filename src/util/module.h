// Optional parts of kiln built as shared modules (libkiln_cuda.so, libkiln_plot.so), installed beside the
// kiln binary and loaded the first time they are used, so that the libraries they need (CUDA, NCCL, PLplot)
// cost nothing to a command that does not use them.
#ifndef KILN_UTIL_MODULE_H
#define KILN_UTIL_MODULE_H

#include "util/error.h"

// The address of `symbol` in the module `file` (e.g. "libkiln_cuda.so") of the directory that holds the
// running binary. `what` names the part for messages ("the CUDA backend"), `hint` says what to do when the
// module is there but cannot be loaded (a library it needs is missing). Returns NULL and fills err (one line,
// KILN_ERR_RUNTIME) when the module or one of its libraries cannot be loaded. A module is loaded once; later
// calls return the same answer, the same error included. Thread-safe.
void *kiln_module_symbol(const char *file, const char *symbol, const char *what, const char *hint,
                         struct kiln_error *err);

#endif
