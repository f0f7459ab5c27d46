// Shared pieces of the CUDA backend: the context, check macros, bf16 helpers, scratch buffers, and the
// extern "C" launchers each op file provides (backend.cu puts them in the ops table).
//
// Precision (issue 4): activations and compute weights are bf16; everything accumulates in fp32; master
// weights and AdamW state are fp32. Parameter gradients are fp32, or bf16 when the context was opened with
// grad_dtype = KILN_BF16 (runs of one micro-step: each gradient is rounded once, never summed in bf16 across
// micro-steps). Kernels that touch them are templates on the gradient type (float or bf16, grad_load/store).
#ifndef KILN_BACKEND_CUDA_COMMON_CUH
#define KILN_BACKEND_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// kiln's headers are C: their functions have C linkage.
extern "C" {
#include "core/backend.h"
#include "core/ops.h"
#include "util/error.h"
}

typedef __nv_bfloat16 bf16;

// ---- checks: every CUDA / cuBLAS call goes through one of these (ops do not fail: a fault aborts) --------
static inline void kiln_cuda_check_at(cudaError_t e, const char *file, int line, const char *expr) {
    if (e != cudaSuccess) {
        fprintf(stderr,
                "kiln: internal error at %s:%d: CUDA %s: %s (in %s); hint: rerun with CUDA_LAUNCH_BLOCKING=1 "
                "or compute-sanitizer to find the failing kernel\n",
                file, line, cudaGetErrorName(e), cudaGetErrorString(e), expr);
        abort();
    }
}
static inline void kiln_cublas_check_at(cublasStatus_t s, const char *file, int line, const char *expr) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr,
                "kiln: internal error at %s:%d: cuBLAS %s (in %s); hint: check shapes and alignment\n", file,
                line, cublasLtGetStatusString(s), expr);
        abort();
    }
}
#define CUDA_CHECK(x) kiln_cuda_check_at((x), __FILE__, __LINE__, #x)
#define CUBLAS_CHECK(x) kiln_cublas_check_at((x), __FILE__, __LINE__, #x)
#define CUDA_CHECK_LAUNCH() kiln_cuda_check_at(cudaGetLastError(), __FILE__, __LINE__, "kernel launch")

// ---- context -----------------------------------------------------------------------------------------
enum cuda_scratch_slot {
    SCR_COLSUM = 0, // column-sum partials (norm backward, bias grads): (planes <= 3, chunks, C) f32
    SCR_BIASGRAD,   // cuBLASLt BGRADB output before it is added to dbias: (OC) grad dtype
    SCR_GEMM,       // bf16 temporary for unfused matmul epilogues: (N, OC)
    SCR_ATTN_D,     // attention backward rowsum(dO * O): (B, NH, T) f32
    SCR_EMBED,      // embedding backward: sorted token/position keys (u64)
    SCR_SUMSQ,      // sum_squares partials (double)
    SCR_ATTN_ROT,   // attention with RoPE: rotated q (B, T, NH, HS) then k (B, T, NKV, HS), bf16
    SCR_ATTN_DQ,    // attention backward, default mode: dQ accumulator (B, T, NH, HS) f32
    SCR_FP8,        // the FP8 GEMM's f32 product before its epilogue (fp8.cu): (M, N)
    SCR_COUNT
};

struct cuda_block {
    void *p;
    size_t bytes;
};

struct cuda_ctx {
    int device;
    int deterministic;
    // which kernels run where there are several (struct kiln_backend_opts.kernel: indices into
    // kiln_kernel_values, 0 the defaults), from the open's options; kiln_cuda_set_kernel switches them
    int kernel[KILN_KERNEL_COUNT];
    int gemm_sm_margin;         // GEMMs planned for this many fewer SMs than the device has (0: all)
    enum kiln_dtype grad_dtype; // of parameter gradients: KILN_F32 or KILN_BF16
    cudaStream_t stream;
    cudaDeviceProp prop;
    cublasLtHandle_t lt;
    void *workspace; // cuBLASLt workspace
    size_t workspace_bytes;
    void *scratch[SCR_COUNT];
    size_t scratch_bytes[SCR_COUNT];
    // RoPE cos/sin table (T, HS/2) x {cos, sin}, f32, built in double precision; rebuilt when (T, HS, theta)
    // outgrows it.
    float *rope_tab;
    int rope_T, rope_HS;
    float rope_theta;
    // AdamW: spans cached on the device as a block map (one entry per block of work), rebuilt only when the
    // span list changes.
    struct kiln_param_span *adam_spans_host;
    int adam_n_spans;
    int2 *adam_blocks; // (n_blocks) {span index, element offset within the span}
    int adam_n_blocks;
    struct kiln_param_span *adam_spans_dev;
    // cuBLASLt: descriptors and heuristic answers per GEMM configuration (matmul.cu), lt_cache_n entries
    void *lt_cache;
    int lt_cache_n, lt_cache_cap;
    // and the FP8 GEMMs' (fp8.cu), fp8_cache_n entries
    void *fp8_cache;
    int fp8_cache_n, fp8_cache_cap;
    // host staging for dtype conversion
    void *host_stage;
    size_t host_stage_bytes;
    // copy_async: a stream of its own beside the compute stream, and an event marking the compute stream's
    // end for it to wait on (made on first use)
    cudaStream_t copy_stream;
    cudaStream_t side_stream;          // copy_side's: the offloaded optimizer's copy thread
    cudaEvent_t side_start, side_stop; // and its copies' times (one thread uses them)
    cudaEvent_t copy_mark;
    // device memory held (kiln_cuda_malloc/free): bytes now, the most at once, and each live block's size
    size_t mem_now, mem_peak;
    struct cuda_block *mem_blocks;
    int mem_n, mem_cap;
};

static inline struct cuda_ctx *cuda_ctx_of(void *ctx) {
    return (struct cuda_ctx *)ctx;
}

#ifdef __cplusplus
extern "C" {
#endif
// Device memory, counted into the context's mem_now/mem_peak (every device allocation goes through these):
// cudaMalloc's status is returned; kiln_cuda_free(c, NULL) does nothing.
cudaError_t kiln_cuda_malloc(struct cuda_ctx *c, void **p, size_t bytes);
void kiln_cuda_free(struct cuda_ctx *c, void *p);
// scratch (backend.cu): a device buffer of at least `bytes`, grown on demand (contents not preserved)
void *kiln_cuda_scratch(struct cuda_ctx *c, int slot, size_t bytes);
// RoPE table for positions [0, T) at head size HS (attention.cu): cos (T, HS/2) returned, sin (T, HS/2) in
// *sin
const float *kiln_cuda_rope_table(struct cuda_ctx *c, int T, int HS, float theta, const float **sin);

// launchers, one family per file
void kiln_cuda_embed_forward(void *ctx, const struct kiln_embed_args *a);
void kiln_cuda_embed_backward(void *ctx, const struct kiln_embed_back_args *a);
void kiln_cuda_norm_forward(void *ctx, const struct kiln_norm_args *a);
void kiln_cuda_norm_backward(void *ctx, const struct kiln_norm_back_args *a);
void kiln_cuda_matmul_forward(void *ctx, const struct kiln_matmul_args *a);
void kiln_cuda_matmul_backward(void *ctx, const struct kiln_matmul_back_args *a);
void kiln_cuda_attention_forward(void *ctx, const struct kiln_attn_args *a);
void kiln_cuda_attention_backward(void *ctx, const struct kiln_attn_back_args *a);
void kiln_cuda_attention_decode(void *ctx, const struct kiln_attn_decode_args *a);
// block attention at global positions, for sequence parallelism (attention_block.cu)
void kiln_cuda_attention_block_forward(void *ctx, const struct kiln_attn_block_args *a);
void kiln_cuda_attention_block_backward(void *ctx, const struct kiln_attn_block_back_args *a);
// second-generation flash attention (attention_fa2.cu): returns 1 when it ran, 0 when the shape or alignment
// is not one it handles (HS not one kiln_cuda_attention_fast takes, pointers not 16-byte aligned);
// attention.cu then runs its own kernels
int kiln_cuda_attention_fast(int HS);
int kiln_cuda_fa2_forward(struct cuda_ctx *c, const struct kiln_attn_args *a);
int kiln_cuda_fa2_backward(struct cuda_ctx *c, const struct kiln_attn_back_args *a);
// RoPE pre-rotation shared by the flash kernels (attention_fa2.cu): rotated q (B, T, NH, HS) followed by
// rotated k (B, T, NKV, HS) in scratch slot SCR_ATTN_ROT, bf16; returns its start
const bf16 *kiln_cuda_fa_rope(struct cuda_ctx *c, const void *qkv, int qkv_rs, int B, int T, int NH, int NKV,
                              int HS, float theta);
// Backward pieces shared by the flash kernels (attention_fa2.cu), HS 64 / 128: D = rowsum(dO * O) into
// scratch slot SCR_ATTN_D, (B, NH, T) f32, returned; and the f32 dQ accumulator (B, T, NH, HS) scaled,
// rotated back (ct, st: RoPE tables, or NULL) and rounded into dqkv's q slice (rows rs apart)
const float *kiln_cuda_fa_dsum(struct cuda_ctx *c, const void *dout, const void *out, int B, int T, int NH,
                               int HS);
void kiln_cuda_fa_dq_convert(struct cuda_ctx *c, bf16 *dqkv, const float *acc, int B, int T, int NH, int HS,
                             int rs, float scale, const float *ct, const float *st);
// Hopper forward (attention_wgmma.cu; attention.cu asks it first unless KILN_ATTN says fa2 or ref): runs and
// returns 1 only when the build targets sm_90a, the device is sm_90 and the shape fits (HS 64/128, 16-byte
// aligned rows); else 0
int kiln_cuda_wgmma_attention_forward(struct cuda_ctx *c, const struct kiln_attn_args *a);
// its backward (same conditions, and not in deterministic mode): 1 when it ran, else 0 (FA2 then runs)
int kiln_cuda_wgmma_attention_backward(struct cuda_ctx *c, const struct kiln_attn_back_args *a);
void kiln_cuda_swiglu_forward(void *ctx, const struct kiln_swiglu_args *a);
void kiln_cuda_swiglu_backward(void *ctx, const struct kiln_swiglu_back_args *a);
void kiln_cuda_gelu_forward(void *ctx, const struct kiln_gelu_args *a); // matmul.cu, with the GELU epilogues
void kiln_cuda_add(void *ctx, void *out, const void *a, const void *b, size_t n);
void kiln_cuda_cross_entropy(void *ctx, const struct kiln_xent_args *a);
void kiln_cuda_cross_entropy_parallel(void *ctx, const struct kiln_xent_par_args *a);
double kiln_cuda_sum_squares(void *ctx, const void *grads, size_t n);
void kiln_cuda_adamw(void *ctx, const struct kiln_adamw_args *a);
// column sums (norm.cu): out[c] += sum_r x[r, c] (= when assign) for bf16 x (N, C) into a parameter gradient
// (grad dtype), deterministic (fixed-order partials)
void kiln_cuda_colsum_bf16(struct cuda_ctx *c, void *out, const bf16 *x, int N, int C, int assign);
void kiln_cuda_add_f32(struct cuda_ctx *c, float *out, const float *x, int n); // out += x
void kiln_cuda_matmul_cache_free(struct cuda_ctx *c); // matmul.cu: the cuBLASLt descriptor cache
void kiln_cuda_fp8_cache_free(struct cuda_ctx *c);    // fp8.cu: the FP8 GEMMs' cache
// FP8 (fp8.cu)
void kiln_cuda_amax(void *ctx, const struct kiln_amax_args *a);
void kiln_cuda_fp8_cast(void *ctx, const struct kiln_fp8_cast_args *a);
void kiln_cuda_fp8_transpose(void *ctx, uint8_t *out, const uint8_t *in, int rows, int cols);
void kiln_cuda_fp8_matmul(void *ctx, const struct kiln_fp8_matmul_args *a);
void kiln_cuda_bias_backward(void *ctx, const struct kiln_bias_back_args *a);
#ifdef __cplusplus
}
#endif

// ---- device helpers ---------------------------------------------------------------------------------
#define KILN_CEIL_DIV(a, b) (((a) + (b)-1) / (b))

// 16 bytes global -> shared, bypassing L1; valid == 0 writes 16 zero bytes and reads nothing.
static __device__ __forceinline__ void cp_async16(bf16 *s, const bf16 *g, int valid) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g), "r"(n) : "memory");
}
static __device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// wait until at most N of this thread's groups are pending
template <int N> static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide sum, every thread gets the result. `sh` holds >= 32 floats. Fixed order: deterministic.
static __device__ __forceinline__ float block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads(); // sh may still be read from a previous call
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}
static __device__ __forceinline__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

static __device__ __forceinline__ float bf2f(bf16 x) {
    return __bfloat162float(x);
}
static __device__ __forceinline__ bf16 f2bf(float x) {
    return __float2bfloat16_rn(x);
}

// Parameter gradients of either dtype: loads widen to f32, stores round to nearest (the f32 forms are plain
// loads and stores, so the f32 path's numbers do not change).
static __device__ __forceinline__ float grad_load(const float *p) {
    return *p;
}
static __device__ __forceinline__ float grad_load(const bf16 *p) {
    return bf2f(*p);
}
static __device__ __forceinline__ void grad_store(float *p, float v) {
    *p = v;
}
static __device__ __forceinline__ void grad_store(bf16 *p, float v) {
    *p = f2bf(v);
}

// 16-byte vector of 8 bf16
union bf16x8 {
    uint4 u;
    bf16 h[8];
};
static __device__ __forceinline__ int is_aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

// GELU, tanh approximation (GPT-2)
#define KILN_GELU_K 0.7978845608028654f // sqrt(2/pi)
static __device__ __forceinline__ float gelu_tanh(float x) {
    float u = KILN_GELU_K * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
static __device__ __forceinline__ float gelu_tanh_grad(float x) {
    float u = KILN_GELU_K * (x + 0.044715f * x * x * x);
    float t = tanhf(u);
    float du = KILN_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

#endif
