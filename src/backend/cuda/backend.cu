// The CUDA backend: device selection, the context, memory ops, dtype conversion, and the ops table.
#include <math.h>
#include <string.h>

#include "backend/cuda/common.cuh"

// ---- device memory, counted ----------------------------------------------------------------------------

extern "C" cudaError_t kiln_cuda_malloc(struct cuda_ctx *c, void **p, size_t bytes) {
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess)
        return e;
    if (c->mem_n == c->mem_cap) {
        c->mem_cap = c->mem_cap ? 2 * c->mem_cap : 64;
        c->mem_blocks =
            (struct cuda_block *)kiln_xrealloc(c->mem_blocks, c->mem_cap * sizeof(*c->mem_blocks));
    }
    c->mem_blocks[c->mem_n++] = (struct cuda_block){*p, bytes};
    c->mem_now += bytes;
    if (c->mem_now > c->mem_peak)
        c->mem_peak = c->mem_now;
    return cudaSuccess;
}

extern "C" void kiln_cuda_free(struct cuda_ctx *c, void *p) {
    if (!p)
        return;
    for (int i = c->mem_n - 1; i >= 0; i--)
        if (c->mem_blocks[i].p == p) {
            c->mem_now -= c->mem_blocks[i].bytes;
            c->mem_blocks[i] = c->mem_blocks[--c->mem_n];
            break;
        }
    CUDA_CHECK(cudaFree(p));
}

static size_t cuda_mem_peak(void *ctx) {
    return cuda_ctx_of(ctx)->mem_peak;
}

static size_t cuda_mem_free(void *ctx) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    CUDA_CHECK(cudaSetDevice(c->device));
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    return fr;
}

// ---- scratch ------------------------------------------------------------------------------------------

extern "C" void *kiln_cuda_scratch(struct cuda_ctx *c, int slot, size_t bytes) {
    KILN_ASSERT(slot >= 0 && slot < SCR_COUNT);
    if (bytes == 0)
        bytes = 16;
    if (c->scratch_bytes[slot] < bytes) {
        if (c->scratch[slot]) {
            CUDA_CHECK(cudaStreamSynchronize(c->stream)); // kernels in flight may still read it
            kiln_cuda_free(c, c->scratch[slot]);
        }
        // exactly what is asked the first time (the plans count that: a quarter more was 4 GiB over them at
        // 1M tokens, 2026-11-26); geometrically after, so that shapes that creep up do not realloc often
        size_t want = c->scratch[slot] ? bytes + bytes / 4 : bytes;
        CUDA_CHECK(kiln_cuda_malloc(c, &c->scratch[slot], want));
        c->scratch_bytes[slot] = want;
    }
    return c->scratch[slot];
}

static void *host_stage(struct cuda_ctx *c, size_t bytes) {
    if (c->host_stage_bytes < bytes) {
        free(c->host_stage);
        c->host_stage = kiln_xmalloc(bytes);
        c->host_stage_bytes = bytes;
    }
    return c->host_stage;
}

// ---- memory -------------------------------------------------------------------------------------------

static void *cuda_alloc(void *ctx, size_t bytes) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    void *p = NULL;
    if (bytes == 0)
        bytes = 16;
    cudaError_t e = kiln_cuda_malloc(c, &p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); // out of memory is not sticky: clear it and let the caller report the plan
        return NULL;
    }
    CUDA_CHECK(e);
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, c->stream));
    return p;
}

static void cuda_free(void *ctx, void *p) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (!p)
        return;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    kiln_cuda_free(c, p);
}

static void cuda_zero(void *ctx, void *p, size_t bytes) {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_ctx_of(ctx)->stream));
}

static void cuda_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_ctx_of(ctx)->stream));
}

static void cuda_copy_2d(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                         size_t width, size_t rows) {
    if (!rows || !width)
        return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                                 cuda_ctx_of(ctx)->stream));
}

static void cuda_upload(void *ctx, void *dst, const void *host_src, size_t bytes) {
    CUDA_CHECK(cudaSetDevice(cuda_ctx_of(ctx)->device)); // the comm layer's thread stages through here too
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream)); // the caller may reuse host_src at once
}

static void cuda_download(void *ctx, void *host_dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaSetDevice(cuda_ctx_of(ctx)->device));
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

// f32 -> bf16, round to nearest even; NaN stays NaN (quiet)
static uint16_t host_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float host_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void cuda_upload_f32(void *ctx, void *dst, enum kiln_dtype dt, const float *src, size_t n) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (dt == KILN_F32) {
        cuda_upload(ctx, dst, src, n * 4);
    } else if (dt == KILN_BF16) {
        uint16_t *h = (uint16_t *)host_stage(c, n * 2);
        for (size_t i = 0; i < n; i++)
            h[i] = host_f32_to_bf16(src[i]);
        cuda_upload(ctx, dst, h, n * 2);
    } else {
        KILN_ASSERT(dt == KILN_I32);
        int32_t *h = (int32_t *)host_stage(c, n * 4);
        for (size_t i = 0; i < n; i++)
            h[i] = (int32_t)src[i];
        cuda_upload(ctx, dst, h, n * 4);
    }
}

static void cuda_download_f32(void *ctx, float *dst, const void *src, enum kiln_dtype dt, size_t n) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (dt == KILN_F32) {
        cuda_download(ctx, dst, src, n * 4);
    } else if (dt == KILN_BF16) {
        uint16_t *h = (uint16_t *)host_stage(c, n * 2);
        cuda_download(ctx, h, src, n * 2);
        for (size_t i = 0; i < n; i++)
            dst[i] = host_bf16_to_f32(h[i]);
    } else {
        KILN_ASSERT(dt == KILN_I32);
        int32_t *h = (int32_t *)host_stage(c, n * 4);
        cuda_download(ctx, h, src, n * 4);
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)h[i];
    }
}

static void cuda_synchronize(void *ctx) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_ctx_of(ctx)->stream));
}

// ---- add: out = a + b (bf16), 16-byte vectors. Bytes: 6n, FLOPs: n. ----------------------------------

static __global__ void add_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i + 8 <= n && is_aligned16(out + i) && is_aligned16(a + i) && is_aligned16(b + i)) {
        bf16x8 va, vb, vo;
        va.u = *(const uint4 *)(a + i);
        vb.u = *(const uint4 *)(b + i);
        for (int k = 0; k < 8; k++)
            vo.h[k] = f2bf(bf2f(va.h[k]) + bf2f(vb.h[k]));
        *(uint4 *)(out + i) = vo.u;
    } else {
        for (size_t k = i; k < i + 8 && k < n; k++)
            out[k] = f2bf(bf2f(a[k]) + bf2f(b[k]));
    }
}

extern "C" void kiln_cuda_add(void *ctx, void *out, const void *a, const void *b, size_t n) {
    if (n == 0)
        return;
    size_t threads = KILN_CEIL_DIV(n, 8);
    add_kernel<<<(unsigned)KILN_CEIL_DIV(threads, 256), 256, 0, cuda_ctx_of(ctx)->stream>>>(
        (bf16 *)out, (const bf16 *)a, (const bf16 *)b, n);
    CUDA_CHECK_LAUNCH();
}

static __global__ void add_f32_kernel(float *out, const float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] += x[i];
}
extern "C" void kiln_cuda_add_f32(struct cuda_ctx *c, float *out, const float *x, int n) {
    if (n <= 0)
        return;
    add_f32_kernel<<<KILN_CEIL_DIV(n, 256), 256, 0, c->stream>>>(out, x, n);
    CUDA_CHECK_LAUNCH();
}

static void cuda_accumulate_f32(void *ctx, float *out, const float *x, size_t n) {
    for (size_t at = 0; at < n; at += (size_t)1 << 30) // the kernel counts in int
        kiln_cuda_add_f32(cuda_ctx_of(ctx), out + at, x + at,
                          (int)(n - at < ((size_t)1 << 30) ? n - at : (size_t)1 << 30));
}

// ---- host memory: page-locked, so that device-to-host copies run at full PCIe/NVLink-C2C speed ----------

static void *cuda_host_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 16) != cudaSuccess) {
        (void)cudaGetLastError(); // not sticky: the caller falls back to pageable memory
        return NULL;
    }
    return p;
}

static void cuda_host_free(void *ctx, void *p) {
    (void)ctx;
    if (p)
        CUDA_CHECK(cudaFreeHost(p));
}

// ---- events: what communication orders itself against (the comm layer may call these from its own thread,
// so each one selects the context's device first: the CUDA runtime's current device is per thread) --------

static void *cuda_event_create(void *ctx) {
    CUDA_CHECK(cudaSetDevice(cuda_ctx_of(ctx)->device));
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return (void *)e;
}

static void cuda_event_destroy(void *ctx, void *ev) {
    (void)ctx;
    if (ev)
        CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev));
}

static void cuda_event_record(void *ctx, void *ev) {
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, cuda_ctx_of(ctx)->stream));
}

// Activation offload's copies run on a stream of their own, after what the compute stream was given so far,
// so that the compute goes on while they move; the compute stream waits on `done` only where it needs them.
static void cuda_copy_async(void *ctx, void *dst, const void *src, size_t bytes, void *done) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (!c->copy_stream) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&c->copy_mark, cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventRecord(c->copy_mark, c->stream));
    CUDA_CHECK(cudaStreamWaitEvent(c->copy_stream, c->copy_mark, 0));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->copy_stream));
    if (done)
        CUDA_CHECK(cudaEventRecord((cudaEvent_t)done, c->copy_stream));
}

static double cuda_copy_side(void *ctx, void *dst, const void *src, size_t bytes) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    CUDA_CHECK(cudaSetDevice(c->device)); // called from a thread of its own
    CUDA_CHECK(cudaEventRecord(c->side_start, c->side_stream));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->side_stream));
    CUDA_CHECK(cudaEventRecord(c->side_stop, c->side_stream));
    CUDA_CHECK(cudaEventSynchronize(c->side_stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, c->side_start, c->side_stop));
    return ms / 1e3;
}

static void cuda_stream_wait(void *ctx, void *ev) {
    CUDA_CHECK(cudaStreamWaitEvent(cuda_ctx_of(ctx)->stream, (cudaEvent_t)ev, 0));
}

static void cuda_event_synchronize(void *ctx, void *ev) {
    CUDA_CHECK(cudaSetDevice(cuda_ctx_of(ctx)->device));
    CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev));
}

static void *cuda_native_stream(void *ctx) {
    return (void *)cuda_ctx_of(ctx)->stream;
}

// ---- the table ----------------------------------------------------------------------------------------

static const struct kiln_ops cuda_ops = {
    cuda_alloc,
    cuda_free,
    cuda_zero,
    cuda_copy,
    cuda_upload,
    cuda_download,
    cuda_upload_f32,
    cuda_download_f32,
    cuda_synchronize,
    kiln_cuda_embed_forward,
    kiln_cuda_embed_backward,
    kiln_cuda_norm_forward,
    kiln_cuda_norm_backward,
    kiln_cuda_matmul_forward,
    kiln_cuda_matmul_backward,
    kiln_cuda_attention_forward,
    kiln_cuda_attention_backward,
    kiln_cuda_attention_decode,
    kiln_cuda_attention_block_forward,
    kiln_cuda_attention_block_backward,
    kiln_cuda_swiglu_forward,
    kiln_cuda_swiglu_backward,
    kiln_cuda_gelu_forward,
    kiln_cuda_add,
    kiln_cuda_cross_entropy,
    kiln_cuda_cross_entropy_parallel,
    kiln_cuda_sum_squares,
    cuda_accumulate_f32,
    kiln_cuda_adamw,
    cuda_host_alloc,
    cuda_host_free,
    cuda_mem_peak,
    cuda_mem_free,
    cuda_event_create,
    cuda_event_destroy,
    cuda_event_record,
    cuda_event_synchronize,
    cuda_native_stream,
    cuda_copy_2d,
    cuda_copy_async,
    cuda_stream_wait,
    cuda_copy_side,
    kiln_cuda_amax,
    kiln_cuda_fp8_cast,
    kiln_cuda_fp8_matmul,
    kiln_cuda_bias_backward,
    kiln_cuda_fp8_transpose,
};

static void cuda_close(struct kiln_backend *b) {
    struct cuda_ctx *c = cuda_ctx_of(b->ctx);
    if (!c)
        return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    cudaStreamDestroy(c->side_stream);
    cudaEventDestroy(c->side_start);
    cudaEventDestroy(c->side_stop);
    if (c->copy_stream) {
        cudaStreamSynchronize(c->copy_stream);
        cudaStreamDestroy(c->copy_stream);
        cudaEventDestroy(c->copy_mark);
    }
    for (int i = 0; i < SCR_COUNT; i++)
        cudaFree(c->scratch[i]);
    cudaFree(c->rope_tab);
    cudaFree(c->adam_blocks);
    cudaFree(c->adam_spans_dev);
    free(c->adam_spans_host);
    free(c->host_stage);
    kiln_cuda_matmul_cache_free(c);
    kiln_cuda_fp8_cache_free(c);
    cudaFree(c->workspace);
    free(c->mem_blocks);
    if (c->lt)
        cublasLtDestroy(c->lt);
    cudaStreamDestroy(c->stream);
    free(c);
    b->ctx = NULL;
}

extern "C" int kiln_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); // no driver or no GPU: not an error here
        return 0;
    }
    return n;
}

extern "C" size_t kiln_cuda_device_free(int index) {
    size_t fr = 0, tot = 0;
    if (index < 0 || index >= kiln_cuda_device_count() || cudaSetDevice(index) != cudaSuccess ||
        cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return fr;
}

extern "C" void kiln_cuda_describe(FILE *f) {
    int n = kiln_cuda_device_count();
    if (n == 0) {
        fprintf(f, "gpus: none visible (no NVIDIA driver or GPU)\n");
        return;
    }
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    fprintf(f, "gpus: %d (driver %d.%d, runtime %d.%d)\n", n, drv / 1000, (drv % 1000) / 10, rt / 1000,
            (rt % 1000) / 10);
    for (int i = 0; i < n; i++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        double peak = kiln_peak_flops_for(p.name);
        fprintf(f, "  gpu %d: %s, sm_%d%d, %d SMs, %.1f GiB", i, p.name, p.major, p.minor,
                p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
        if (peak > 0)
            fprintf(f, ", peak bf16 %.0f TFLOP/s\n", peak / 1e12);
        else
            fprintf(f, ", peak bf16 n/a\n");
    }
}

extern "C" int kiln_cuda_backend_open(const struct kiln_backend_opts *opts, struct kiln_backend *out,
                                      struct kiln_error *err) {
    int n = kiln_cuda_device_count();
    int dev = opts ? opts->device_index : 0;
    enum kiln_dtype grad_dtype = opts ? opts->grad_dtype : KILN_F32;
    if (grad_dtype != KILN_F32 && grad_dtype != KILN_BF16)
        return kiln_errorf(err, KILN_ERR_USAGE, "grad-dtype %s (--grad-dtype): allowed values are fp32, bf16",
                           kiln_dtype_name(grad_dtype));
    if (n == 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "device cuda (--device): no CUDA GPU is visible; check nvidia-smi and "
                           "CUDA_VISIBLE_DEVICES, or use --device=cpu");
    if (dev < 0 || dev >= n)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "GPU index %d (--device-index): only %d GPU(s) visible; use 0..%d", dev, n, n - 1);
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "GPU %d (cudaSetDevice): %s; check the driver with nvidia-smi", dev,
                           cudaGetErrorString(e));
    }
    struct cuda_ctx *c = (struct cuda_ctx *)kiln_xcalloc(1, sizeof(*c));
    c->device = dev;
    c->deterministic = opts ? opts->deterministic : 0;
    c->grad_dtype = grad_dtype;
    for (int k = 0; k < KILN_KERNEL_COUNT; k++) {
        int v = opts ? opts->kernel[k] : 0;
        KILN_ASSERT(v >= 0 && v < kiln_kernel_values[k].n_values); // run/knobs.c validated it
        c->kernel[k] = v;
    }
    c->gemm_sm_margin = opts ? opts->gemm_sm_margin : 0;
    CUDA_CHECK(cudaGetDeviceProperties(&c->prop, dev));
    if (c->prop.major < 8) {
        int major = c->prop.major, minor = c->prop.minor;
        free(c);
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "GPU %d (sm_%d%d): kiln's bf16 kernels need compute capability 8.0 or newer (A100, "
            "H100); use --device=cpu",
            dev, major, minor);
    }
    if (c->gemm_sm_margin < 0 || c->gemm_sm_margin >= c->prop.multiProcessorCount) {
        int margin = c->gemm_sm_margin, sms = c->prop.multiProcessorCount;
        free(c);
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "KILN_GEMM_SM_MARGIN=%d (environment): not below GPU %d's %d SMs; leave at least "
                           "one SM to the GEMMs, or unset it",
                           margin, dev, sms);
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->side_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&c->side_start));
    CUDA_CHECK(cudaEventCreate(&c->side_stop));
    CUBLAS_CHECK(cublasLtCreate(&c->lt));
    // 32 MiB: what cuBLASLt asks for on Hopper for its best kernels (NVIDIA's recommendation for sm_90).
    c->workspace_bytes = (size_t)32 << 20;
    CUDA_CHECK(kiln_cuda_malloc(c, &c->workspace, c->workspace_bytes));

    out->name = "cuda";
    out->ops = &cuda_ops;
    out->ctx = c;
    out->act_dtype = KILN_BF16;
    // Parameter gradients are f32 unless asked otherwise: micro-batch accumulation adds many small terms,
    // which bf16 (8 mantissa bits) would truncate. With one micro-step each gradient is one rounded GEMM or
    // reduction result (relative error 2^-9), which AdamW tolerates, and bf16 halves their memory and the
    // bytes AdamW and the global norm read.
    out->grad_dtype = grad_dtype;
    out->weights_alias_master = 0;
    out->device_memory = 1;
    snprintf(out->device_name, sizeof(out->device_name), "%s", c->prop.name);
    out->peak_flops = kiln_peak_flops_for(c->prop.name);
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    out->mem_total_bytes = tot;
    out->mem_free_bytes = fr;
    out->attention_fast = kiln_cuda_attention_fast;
    out->fp8_tensor_cores = c->prop.major * 10 + c->prop.minor >= 89; // Ada, Hopper and later
    out->close = cuda_close;
    return 0;
}

extern "C" int kiln_cuda_set_kernel(void *ctx, const char *knob, const char *value) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (!strcmp(knob, "KILN_GEMM_SM_MARGIN")) {
        char *end = NULL;
        long v = value && *value ? strtol(value, &end, 10) : 0;
        if ((value && *value && *end) || v < 0 || v >= c->prop.multiProcessorCount)
            return -1;
        c->gemm_sm_margin = (int)v; // (part of the GEMM cache's key: new plans for the new target)
        return 0;
    }
    int which, index;
    if (kiln_kernel_lookup(knob, value, &which, &index))
        return -1;
    if (which == KILN_KERNEL_GEMM_TUNE && c->kernel[which] != index) {
        // whether to time the candidates is decided when a GEMM configuration is first planned: plan anew
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        kiln_cuda_matmul_cache_free(c);
        kiln_cuda_fp8_cache_free(c);
    }
    c->kernel[which] = index;
    return 0;
}
