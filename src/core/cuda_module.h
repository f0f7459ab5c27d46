// The CUDA part of kiln (the CUDA backend and the NCCL transport) as one table of entry points. kiln itself
// loads it from libkiln_cuda.so beside its binary the first time a GPU is asked about, so that a command that
// needs no GPU never maps the CUDA libraries (cudart, cuBLASLt and NCCL take seconds to load from a cold
// disk); test programs link it in instead. backend/registry.c is the one place that finds it
// (kiln_cuda_module).
#ifndef KILN_CORE_CUDA_MODULE_H
#define KILN_CORE_CUDA_MODULE_H

#include <stddef.h>
#include <stdio.h>

#include "core/backend.h"

// Raised whenever the table or the meaning of an entry changes; the sizes below catch the structs that cross
// the boundary changing under a module left over from another build.
#define KILN_CUDA_MODULE_ABI 1

struct kiln_comm;
struct kiln_dist_env;
struct kiln_comm_open_opts;

struct kiln_cuda_module {
    int abi;                // KILN_CUDA_MODULE_ABI of the build that made the module
    size_t struct_bytes[4]; // sizeof struct kiln_backend, kiln_backend_opts, kiln_ops, kiln_error there
    int (*device_count)(void);
    size_t (*device_free)(int index);
    void (*describe)(FILE *f);
    int (*backend_open)(const struct kiln_backend_opts *opts, struct kiln_backend *out,
                        struct kiln_error *err);
    // the NCCL transport (parallel/comm/comm_nccl.cu); NULL in a build without NCCL
    int (*nccl_open)(struct kiln_comm *c, const struct kiln_dist_env *env,
                     const struct kiln_comm_open_opts *o, struct kiln_error *err);
};

#define KILN_CUDA_MODULE_SIZES                                                                               \
    {                                                                                                        \
        sizeof(struct kiln_backend), sizeof(struct kiln_backend_opts), sizeof(struct kiln_ops),              \
            sizeof(struct kiln_error)                                                                        \
    }

#ifdef __cplusplus
extern "C" {
#endif
// The table that libkiln_cuda.so exports (backend/cuda/module.cu).
extern const struct kiln_cuda_module kiln_cuda_module_table;
// The CUDA part, loaded on first use: NULL (and err filled: a build without CUDA, a missing module or CUDA
// library, a module of another build) when it cannot be had. Thread-safe; later calls answer the same.
const struct kiln_cuda_module *kiln_cuda_module(struct kiln_error *err);
// The NCCL transport's opening, in the module (parallel/comm/comm_nccl.cu; comm.h's kiln_comm_nccl_open
// reaches it through the table).
int kiln_comm_nccl_open_gpu(struct kiln_comm *c, const struct kiln_dist_env *env,
                            const struct kiln_comm_open_opts *o, struct kiln_error *err);
#ifdef __cplusplus
}
#endif

#endif
