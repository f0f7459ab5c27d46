// A backend: an ops table paired with its opaque context, plus what the trainer needs to know about it.
#ifndef KILN_CORE_BACKEND_H
#define KILN_CORE_BACKEND_H

#include "core/ops.h"
#include "util/error.h"

// Where the CUDA backend has several kernels for one job, which one runs: for comparisons and measurements,
// each the index of a value in kiln_kernel_values (0: the default, the fastest measured). run/knobs.c fills
// them from the environment once at start-up (KILN_ATTN=ref, ...); tests and benchmarks switch them between
// calls with kiln_cuda_set_kernel. The CPU backend has one kernel of each and ignores them.
enum kiln_kernel {
    KILN_KERNEL_ATTN,       // KILN_ATTN: wgmma (Hopper kernels where they apply, else fa2), fa2, ref
    KILN_KERNEL_ATTN_BLOCK, // KILN_ATTN_BLOCK (sequence parallelism's blocks): wgmma, tc, ref
    KILN_KERNEL_WGMMA_FWD,  // KILN_WGMMA_FWD: pingpong, overlap
    KILN_KERNEL_WGMMA_DQ,   // KILN_WGMMA_DQ: tma-dqpw, tma, red, red-split, tma-early, ... (core/kernels.c)
    KILN_KERNEL_FA_VARIANT, // KILN_FA_VARIANT: FA2's tile shapes 0, 1, 2
    KILN_KERNEL_GEMM_TUNE,  // KILN_GEMM_TUNE: 1 (time cuBLASLt's candidates), 0 (its first choice)
    KILN_KERNEL_BGRAD,      // KILN_BGRAD: colsum (kiln's column sums), lt (cuBLASLt's BGRADB epilogue)
    KILN_KERNEL_COUNT
};
struct kiln_kernel_knob {
    const char *knob;          // its environment variable, e.g. "KILN_ATTN"
    const char *const *values; // values[0] is the default
    int n_values;
};
extern const struct kiln_kernel_knob kiln_kernel_values[KILN_KERNEL_COUNT];
// The kernel knob named `knob` (*which) and the index of `value` among its values (*index; NULL or "": 0, the
// default). Returns 0, or -1 for a name or value it does not know.
int kiln_kernel_lookup(const char *knob, const char *value, int *which, int *index);

struct kiln_backend_opts {
    int device_index;        // GPU ordinal (CUDA)
    int deterministic;       // bitwise-repeatable results (CUDA: no atomics in reductions)
    int threads;             // CPU threads, 0 = OpenMP default
    enum kiln_dtype grad_dtype; // parameter gradients: KILN_F32 (0, the default), or KILN_BF16 (CUDA only;
                                // for runs of one micro-step per optimizer step, which never add into them)
    int kernel[KILN_KERNEL_COUNT]; // CUDA: which kernels run (above); all 0: the defaults
    // CUDA: plan every GEMM for this many fewer SMs than the device has (KILN_GEMM_SM_MARGIN; 0: all of
    // them); at least one SM must remain
    int gemm_sm_margin;
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
// Switches a kernel choice of an open CUDA backend context (struct kiln_backend_opts.kernel, or
// KILN_GEMM_SM_MARGIN) for the calls that follow, so that a test or benchmark can compare kernels on the same
// inputs in one process: knob is the knob's name ("KILN_ATTN"), value one of its values (NULL or "": the
// default). Returns 0, or -1 (and changes nothing) for a name or value it does not know.
int kiln_cuda_set_kernel(void *ctx, const char *knob, const char *value);
#ifdef __cplusplus
}
#endif

// Peak dense bf16 FLOP/s by GPU name (the vendors' data sheets): H100/H200 989e12, A100 312e12; 0 when unknown.
double kiln_peak_flops_for(const char *device_name);

#endif
