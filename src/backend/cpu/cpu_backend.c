// CPU backend: the ops table and kiln_cpu_backend_open.
#include "core/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "util/progress.h"

#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

// ---- OpenMP waiting ----------------------------------------------------------------------------------
// Between parallel regions libgomp's idle threads spin (300,000 polls by default) before they sleep. A CPU
// training step runs hundreds of short regions, so kiln's threads spin nearly all the time; where other
// programs are busy they hold the cores those need and wait on each other: 10 steps of the default model
// took 3-15x longer beside two busy processes (docs/cpu_threads.md). Sleeping at once (passive waiting) costs
// a sleeping thread's wake-up at every region, about 100 us on a virtual machine: the demo model ran 15% slower
// on a quiet machine. A short spin, 1,000 polls (tens of microseconds) before sleeping, catches the next region
// while it is close and sleeps through everything longer: as fast as spinning when the machine is quiet, and
// as passive waiting when it is busy. libgomp reads GOMP_SPINCOUNT once, as it is loaded, before main and
// before this program's own constructors (setting it later changes nothing, and no omp_set_* call sets it),
// so the program sets it and starts itself again: same process, arguments and open files, before anything
// else has run. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept; so is the process as it is where the
// restart cannot happen.
#define KILN_CPU_SPINCOUNT "1000"

__attribute__((constructor)) static void cpu_wait_short(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc < 1 || !argv || getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
        return;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1); // the program's path, also under valgrind
    if (n <= 0)
        return;
    exe[n] = 0;
    if (setenv("GOMP_SPINCOUNT", KILN_CPU_SPINCOUNT, 0))
        return;
    execv(exe, argv);
    unsetenv("GOMP_SPINCOUNT"); // no restart (the file went away, say): this process spins as before
}

// On the CPU all memory is host memory: plain malloc.
static void *cpu_host_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    return malloc(bytes ? bytes : 1);
}

static void cpu_host_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

// The CPU states no memory limit (kiln_backend's mem_total_bytes is 0): nothing to plan against
static size_t cpu_mem_free(void *ctx) {
    (void)ctx;
    return 0;
}

// the offloaded optimizer's copies: memory is the host's on both sides; the host's clock times them
static double cpu_copy_side(void *ctx, void *dst, const void *src, size_t bytes) {
    double t0 = kiln_now_s();
    kiln_cpu_copy(ctx, dst, src, bytes);
    return kiln_now_s() - t0;
}

static const struct kiln_ops cpu_ops = {
    .alloc = kiln_cpu_alloc,
    .free = kiln_cpu_free,
    .zero = kiln_cpu_zero,
    .copy = kiln_cpu_copy,
    .upload = kiln_cpu_upload,
    .download = kiln_cpu_download,
    .upload_f32 = kiln_cpu_upload_f32,
    .download_f32 = kiln_cpu_download_f32,
    .synchronize = kiln_cpu_synchronize,
    .embed_forward = kiln_cpu_embed_forward,
    .embed_backward = kiln_cpu_embed_backward,
    .norm_forward = kiln_cpu_norm_forward,
    .norm_backward = kiln_cpu_norm_backward,
    .matmul_forward = kiln_cpu_matmul_forward,
    .matmul_backward = kiln_cpu_matmul_backward,
    .attention_forward = kiln_cpu_attention_forward,
    .attention_backward = kiln_cpu_attention_backward,
    .attention_decode = kiln_cpu_attention_decode,
    .attention_block_forward = kiln_cpu_attention_block_forward,
    .attention_block_backward = kiln_cpu_attention_block_backward,
    .swiglu_forward = kiln_cpu_swiglu_forward,
    .swiglu_backward = kiln_cpu_swiglu_backward,
    .gelu_forward = kiln_cpu_gelu_forward,
    .add = kiln_cpu_add,
    .cross_entropy = kiln_cpu_cross_entropy,
    .cross_entropy_parallel = kiln_cpu_cross_entropy_parallel,
    .sum_squares = kiln_cpu_sum_squares,
    .accumulate_f32 = kiln_cpu_accumulate_f32,
    .adamw = kiln_cpu_adamw,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .mem_peak = kiln_cpu_mem_peak,
    .mem_free = cpu_mem_free,
    .copy_2d = kiln_cpu_copy_2d,
    .copy_async = kiln_cpu_copy_async,
    .copy_side = cpu_copy_side,
    .amax = kiln_cpu_amax,
    .fp8_cast = kiln_cpu_fp8_cast,
    .fp8_matmul = kiln_cpu_fp8_matmul,
    .bias_backward = kiln_cpu_bias_backward,
    .fp8_transpose = kiln_cpu_fp8_transpose,
};

static void cpu_close(struct kiln_backend *b) {
    struct kiln_cpu_ctx *c = b->ctx;
    if (!c)
        return;
    kiln_cpu_free(NULL, c->apack);
    kiln_cpu_free(NULL, c->bpack);
    free(c);
    b->ctx = NULL;
}

int kiln_cpu_backend_open(const struct kiln_backend_opts *opts, struct kiln_backend *out,
                          struct kiln_error *err) {
    int threads = opts && opts->threads > 0 ? opts->threads : omp_get_max_threads();
    if (opts && opts->threads < 0)
        return kiln_errorf(err, KILN_ERR_USAGE, "threads %d (--threads): must be >= 0; 0 uses all cores",
                           opts->threads);
    // the reference computes in fp32 throughout; bf16 gradients are a CUDA memory and bandwidth saving
    if (opts && opts->grad_dtype != KILN_F32)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "grad-dtype %s (--grad-dtype): the cpu backend keeps fp32 gradients; use "
                           "--grad-dtype=auto or fp32, or --device=cuda",
                           kiln_dtype_name(opts->grad_dtype));
    if (opts && opts->threads > 0)
        omp_set_num_threads(threads);
    struct kiln_cpu_ctx *c = calloc(1, sizeof(*c));
    if (c) {
        c->threads = threads;
        c->apack = kiln_cpu_alloc(NULL, (size_t)KILN_CPU_MB * KILN_CPU_KC * sizeof(float));
        c->bpack = kiln_cpu_alloc(NULL, (size_t)KILN_CPU_KC * KILN_CPU_NC * sizeof(float));
    }
    if (!c || !c->apack || !c->bpack) {
        if (c) {
            kiln_cpu_free(NULL, c->apack);
            kiln_cpu_free(NULL, c->bpack);
        }
        free(c);
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cpu backend (open): out of host memory; free some memory");
    }
    out->name = "cpu";
    out->ops = &cpu_ops;
    out->ctx = c;
    out->act_dtype = KILN_F32;
    out->grad_dtype = KILN_F32;
    out->weights_alias_master = 1;
    out->device_memory = 0;
    snprintf(out->device_name, sizeof(out->device_name), "CPU (%d thread%s)", threads,
             threads == 1 ? "" : "s");
    out->peak_flops = 0;
    out->mem_total_bytes = 0;
    out->mem_free_bytes = 0;
    out->close = cpu_close;
    return 0;
}
