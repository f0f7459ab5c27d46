// The FP8 ops (core/ops.h) on CUDA: amax, the saturating casts (plain and transposing), the scaled FP8 GEMM
// through cuBLASLt, and the bias gradient (norm.cu's column sums).
//
// The casts must give the CPU's codes bit for bit (backend/cpu/fp8.c): the scale is fmax / amax rounded to
// nearest (__fdiv_rn: --use_fast_math would approximate a plain division), the product x * s is rounded once
// (__fmul_rn), and cvt.satfinite rounds to nearest even and saturates as the CPU does.
//
// The GEMM: kiln's row-major out (M, N) = a (M, K) . b (N, K)^T is, column-major, out^T (N x M) =
// b^T . a, which is the "TN" layout FP8 GEMMs need: cuBLAS's A is b (K x N, ld K) transposed, its B is a
// (K x M, ld K), both with K contiguous. The product goes to an f32 scratch with unit scales, and one
// epilogue kernel applies the dequantization (per tensor or per row), the bias, the DGELU factor and +=, and
// writes the output dtype: every recipe and epilogue takes the same road. Fusing the tensorwise scales and
// the bias into cuBLASLt's epilogue (A_SCALE_POINTER, B_SCALE_POINTER, BIAS) is the next step for speed.
// Shapes cuBLASLt's FP8 kernels do not take (K, M or N not multiples of 16) run a plain kernel instead.
#include <cuda_fp8.h>
#include <math.h>

#include "backend/cuda/common.cuh"

static __device__ __forceinline__ float fp8_scale_of(float amax, int fmt) {
    if (!isfinite(amax))
        return 1.0f;
    return __fdiv_rn(fmt == KILN_FP8_E5M2 ? 57344.0f : 448.0f, fmaxf(amax, 1e-12f));
}

static __device__ __forceinline__ uint8_t fp8_encode(float v, int fmt) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt == KILN_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
}

static __device__ __forceinline__ float fp8_decode(uint8_t q, int fmt) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, fmt == KILN_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
    return __half2float(__half(h));
}

// |x|'s bits: for non-negative floats the integer order is the float order, and a NaN's bits exceed every
// number's, so an integer max keeps a NaN
static __device__ __forceinline__ unsigned abs_bits(bf16 x) {
    return __float_as_uint(fabsf(bf2f(x)));
}

static __device__ __forceinline__ unsigned warp_max_u(unsigned v) {
    for (int o = 16; o > 0; o >>= 1) {
        unsigned w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// ---- amax ---------------------------------------------------------------------------------------------

// one amax (out zeroed first): grid-stride, a warp max, then one atomic per warp
__global__ void amax_tensor_kernel(unsigned *out, const bf16 *x, int R, int C, int ld) {
    unsigned m = 0;
    size_t n = (size_t)R * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned b = abs_bits(x[(i / C) * ld + i % C]);
        m = b > m ? b : m;
    }
    m = warp_max_u(m);
    if ((threadIdx.x & 31) == 0)
        atomicMax(out, m);
}

// one warp a row
__global__ void amax_rows_kernel(float *out, const bf16 *x, int R, int C, int ld) {
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= R)
        return;
    unsigned m = 0;
    for (int c = threadIdx.x & 31; c < C; c += 32) {
        unsigned b = abs_bits(x[(size_t)r * ld + c]);
        m = b > m ? b : m;
    }
    m = warp_max_u(m);
    if ((threadIdx.x & 31) == 0)
        out[r] = __uint_as_float(m);
}

// 32 columns a block, its 8 row groups reduced in shared memory, blocks over rows combined by atomics (out
// zeroed first)
__global__ void amax_cols_kernel(unsigned *out, const bf16 *x, int R, int C, int ld, int rows_per_block) {
    __shared__ unsigned sh[8][32];
    int c = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * rows_per_block;
    int r1 = min(R, r0 + rows_per_block);
    unsigned m = 0;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            unsigned b = abs_bits(x[(size_t)r * ld + c]);
            m = b > m ? b : m;
        }
    sh[threadIdx.y][threadIdx.x] = m;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int i = 1; i < 8; i++)
            m = sh[i][threadIdx.x] > m ? sh[i][threadIdx.x] : m;
        atomicMax(&out[c], m);
    }
}

extern "C" void kiln_cuda_amax(void *ctx, const struct kiln_amax_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    int R = a->rows, C = a->cols, ld = a->stride ? a->stride : a->cols;
    const bf16 *x = (const bf16 *)a->x;
    if (a->per == KILN_FP8_ROWS) {
        amax_rows_kernel<<<KILN_CEIL_DIV(R, 8), 256, 0, c->stream>>>(a->amax, x, R, C, ld);
    } else if (a->per == KILN_FP8_COLS) {
        CUDA_CHECK(cudaMemsetAsync(a->amax, 0, (size_t)C * sizeof(float), c->stream));
        int rpb = 256;
        dim3 grid(KILN_CEIL_DIV(C, 32), KILN_CEIL_DIV(R, rpb)), block(32, 8);
        amax_cols_kernel<<<grid, block, 0, c->stream>>>((unsigned *)a->amax, x, R, C, ld, rpb);
    } else {
        CUDA_CHECK(cudaMemsetAsync(a->amax, 0, sizeof(float), c->stream));
        size_t n = (size_t)R * C;
        int blocks = (int)(KILN_CEIL_DIV(n, 256) < 1024 ? KILN_CEIL_DIV(n, 256) : 1024);
        amax_tensor_kernel<<<blocks > 0 ? blocks : 1, 256, 0, c->stream>>>((unsigned *)a->amax, x, R, C, ld);
    }
    CUDA_CHECK_LAUNCH();
}

// ---- casts --------------------------------------------------------------------------------------------

__global__ void fp8_cast_kernel(uint8_t *out, const bf16 *x, const float *amax, int R, int C, int ld, int fmt,
                                int per) {
    size_t n = (size_t)R * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / C), col = (int)(i % C);
        float s = fp8_scale_of(amax[per == KILN_FP8_ROWS ? r : per == KILN_FP8_COLS ? col : 0], fmt);
        out[i] = fp8_encode(__fmul_rn(bf2f(x[(size_t)r * ld + col]), s), fmt);
    }
}

// 32 x 32 tiles through shared memory: reads along x's rows, writes along out's (x^T's) rows
__global__ void fp8_cast_t_kernel(uint8_t *out, const bf16 *x, const float *amax, int R, int C, int ld, int fmt,
                                  int per) {
    __shared__ uint8_t tile[32][33];
    int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int i = threadIdx.y; i < 32; i += 8) {
        int r = r0 + i, col = c0 + threadIdx.x;
        if (r < R && col < C) {
            float s = fp8_scale_of(amax[per == KILN_FP8_ROWS ? r : per == KILN_FP8_COLS ? col : 0], fmt);
            tile[i][threadIdx.x] = fp8_encode(__fmul_rn(bf2f(x[(size_t)r * ld + col]), s), fmt);
        }
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        int col = c0 + i, r = r0 + threadIdx.x;
        if (r < R && col < C)
            out[(size_t)col * R + r] = tile[threadIdx.x][i];
    }
}

extern "C" void kiln_cuda_fp8_cast(void *ctx, const struct kiln_fp8_cast_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    int R = a->rows, C = a->cols, ld = a->stride ? a->stride : a->cols;
    if (a->transpose) {
        dim3 grid(KILN_CEIL_DIV(C, 32), KILN_CEIL_DIV(R, 32)), block(32, 8);
        fp8_cast_t_kernel<<<grid, block, 0, c->stream>>>(a->out, (const bf16 *)a->x, a->amax, R, C, ld, a->fmt,
                                                         a->per);
    } else {
        size_t n = (size_t)R * C;
        int blocks = (int)(KILN_CEIL_DIV(n, 256) < 4096 ? KILN_CEIL_DIV(n, 256) : 4096);
        fp8_cast_kernel<<<blocks > 0 ? blocks : 1, 256, 0, c->stream>>>(a->out, (const bf16 *)a->x, a->amax, R,
                                                                        C, ld, a->fmt, a->per);
    }
    CUDA_CHECK_LAUNCH();
}

// ---- GEMM ---------------------------------------------------------------------------------------------

// acc (M, N) f32 = a (M, K) . b (N, K)^T on decoded values, one output a thread: the shapes cuBLASLt's FP8
// kernels refuse (small test models)
__global__ void fp8_gemm_plain_kernel(float *acc, const uint8_t *qa, const uint8_t *qb, int M, int N, int K,
                                      int fa, int fb) {
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= N)
        return;
    float s = 0.0f;
    for (int k = 0; k < K; k++)
        s = fmaf(fp8_decode(qa[(size_t)m * K + k], fa), fp8_decode(qb[(size_t)n * K + k], fb), s);
    acc[(size_t)m * N + n] = s;
}

static __device__ __forceinline__ float gelu_grad_d(float x) {
    const float k = 0.7978845608028654f;
    float cube = 0.044715f * x * x * x, t = tanhf(k * (x + cube));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x * x);
}

struct fp8_epi {
    void *out;
    const float *acc;
    const float *a_amax, *b_amax;
    int a_rowwise, b_rowwise, fa, fb;
    const bf16 *bias, *pre;
    int M, N, ldc, ldp, accumulate, out_f32;
};

__global__ void fp8_epilogue_kernel(struct fp8_epi e) {
    size_t n = (size_t)e.M * e.N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int m = (int)(i / e.N), j = (int)(i % e.N);
        float ia = __frcp_rn(fp8_scale_of(e.a_amax[e.a_rowwise ? m : 0], e.fa));
        float ib = __frcp_rn(fp8_scale_of(e.b_amax[e.b_rowwise ? j : 0], e.fb));
        float v = __fmul_rn(__fmul_rn(e.acc[i], ia), ib);
        if (e.bias)
            v += bf2f(e.bias[j]);
        if (e.pre)
            v *= gelu_grad_d(bf2f(e.pre[(size_t)m * e.ldp + j]));
        size_t o = (size_t)m * e.ldc + j;
        if (e.out_f32) {
            float *out = (float *)e.out;
            out[o] = e.accumulate ? out[o] + v : v;
        } else {
            bf16 *out = (bf16 *)e.out;
            out[o] = f2bf(e.accumulate ? bf2f(out[o]) + v : v);
        }
    }
}

static cudaDataType_t fp8_type(int fmt) {
    return fmt == KILN_FP8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
}

// acc (M, N) = a . b^T through cuBLASLt's FP8 GEMM; 0 where it has no algorithm for the shape
static int fp8_gemm_lt(struct cuda_ctx *c, float *acc, const struct kiln_fp8_matmul_args *a) {
    if (a->K % 16 || a->M % 16 || a->N % 16 || (a->a_fmt == KILN_FP8_E5M2 && a->b_fmt == KILN_FP8_E5M2))
        return 0; // FP8 kernels want multiples of 16, and no e5m2 x e5m2 product exists
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // cuBLAS's A is our b (K x N), its B our a (K x M); D^T = acc, (N x M) column-major
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, fp8_type(a->b_fmt), a->K, a->N, a->K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, fp8_type(a->a_fmt), a->K, a->M, a->K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, a->N, a->M, a->N));
    cublasLtMatmulPreference_t pref = NULL;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = c->workspace_bytes;
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t heur;
    int nres = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, desc, la, lb, ld, ld, pref, 1, &heur, &nres);
    int ok = st == CUBLAS_STATUS_SUCCESS && nres > 0;
    if (ok) {
        float alpha = 1.0f, beta = 0.0f;
        CUBLAS_CHECK(cublasLtMatmul(c->lt, desc, &alpha, a->b, la, a->a, lb, &beta, acc, ld, acc, ld, &heur.algo,
                                    c->workspace, c->workspace_bytes, c->stream));
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    return ok;
}

extern "C" void kiln_cuda_fp8_matmul(void *ctx, const struct kiln_fp8_matmul_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    float *acc = (float *)kiln_cuda_scratch(c, SCR_FP8, (size_t)a->M * a->N * sizeof(float));
    if (!fp8_gemm_lt(c, acc, a)) {
        dim3 grid(KILN_CEIL_DIV(a->N, 128), a->M);
        fp8_gemm_plain_kernel<<<grid, 128, 0, c->stream>>>(acc, a->a, a->b, a->M, a->N, a->K, a->a_fmt, a->b_fmt);
        CUDA_CHECK_LAUNCH();
    }
    struct fp8_epi e = {.out = a->out,
                        .acc = acc,
                        .a_amax = a->a_amax,
                        .b_amax = a->b_amax,
                        .a_rowwise = a->a_rowwise,
                        .b_rowwise = a->b_rowwise,
                        .fa = a->a_fmt,
                        .fb = a->b_fmt,
                        .bias = (const bf16 *)a->bias,
                        .pre = (const bf16 *)a->gelu_pre,
                        .M = a->M,
                        .N = a->N,
                        .ldc = a->ldc ? a->ldc : a->N,
                        .ldp = a->gelu_pre_stride ? a->gelu_pre_stride : a->N,
                        .accumulate = a->accumulate,
                        .out_f32 = a->out_grad && c->grad_dtype == KILN_F32};
    size_t n = (size_t)a->M * a->N;
    int blocks = (int)(KILN_CEIL_DIV(n, 256) < 4096 ? KILN_CEIL_DIV(n, 256) : 4096);
    fp8_epilogue_kernel<<<blocks > 0 ? blocks : 1, 256, 0, c->stream>>>(e);
    CUDA_CHECK_LAUNCH();
}

extern "C" void kiln_cuda_bias_backward(void *ctx, const struct kiln_bias_back_args *a) {
    kiln_cuda_colsum_bf16(cuda_ctx_of(ctx), a->dbias, (const bf16 *)a->x, a->M, a->N, a->assign);
}
