// A backend: an ops table paired with its opaque context, plus what the trainer needs to know about it.
#ifndef KILN_CORE_BACKEND_H
#define KILN_CORE_BACKEND_H

#include "core/ops.h"
#include "util/error.h"

struct kiln_backend_opts {
    int device_index;        // GPU ordinal (CUDA)
    int deterministic;       // bitwise-repeatable results (CUDA: no atomics in reductions)
    int threads;             // CPU threads, 0 = OpenMP default
    enum kiln_dtype grad_dtype; // parameter gradients: KILN_F32 (0, the default), or KILN_BF16 (CUDA only;
                                // for runs of one micro-step per optimizer step, which never add into them)
};

// struct kiln_backend is declared in core/ops.h, beside the ops table it carries.

// Opens the backend by name ("cpu", "cuda", or "auto": cuda when a GPU is present, else cpu).
int kiln_backend_open(const char *name, const struct kiln_backend_opts *opts, struct kiln_backend *out,
                      struct kiln_error *err);
void kiln_backend_close(struct kiln_backend *b);
// The backend that kiln_backend_open(name) would open: "cuda" or "cpu" for "auto", else name itself. Lets a
// caller choose options by backend (the gradient dtype) before opening it.
const char *kiln_backend_resolve(const char *name);

// Devices of a backend visible now: GPUs for "cuda" (0 in a build without CUDA), 1 for "cpu".
int kiln_backend_device_count(const char *name);
// The free memory of GPU `index` now, in bytes; 0 where there is none (or the build has no CUDA).
size_t kiln_backend_gpu_free(int index);

// Compiled-in backends, e.g. "cpu cuda", and a description of the devices visible now (for `kiln info`).
const char *kiln_backends_compiled(void);
void kiln_backends_describe(FILE *f);

// Per-backend entry points used by registry.c.
int kiln_cpu_backend_open(const struct kiln_backend_opts *opts, struct kiln_backend *out, struct kiln_error *err);
#ifdef __cplusplus
extern "C" {
#endif
int kiln_cuda_backend_open(const struct kiln_backend_opts *opts, struct kiln_backend *out,
                           struct kiln_error *err);
int kiln_cuda_device_count(void);
size_t kiln_cuda_device_free(int index);
void kiln_cuda_describe(FILE *f);
// 1 when the Hopper attention kernels (attention_wgmma.cu) can run on this CUDA backend context (a build for
// sm_90a and an sm_90 device), else 0; lets tests and benchmarks skip the path cleanly
int kiln_cuda_wgmma_attention_available(void *ctx);
#ifdef __cplusplus
}
#endif

// Peak dense bf16 FLOP/s by GPU name (PERF.md): H100/H200 989e12, A100 312e12; 0 when unknown.
double kiln_peak_flops_for(const char *device_name);

#endif
