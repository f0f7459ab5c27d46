// Matmuls through cuBLASLt with fused epilogues (bias, GELU with the pre-activation saved as aux, DGELU), in
// bf16 with fp32 accumulation. Parameter gradients (dweight, dbias) have the context's grad dtype (f32, or
// bf16: the GEMM rounds its fp32 result once) and accumulate. dbias is kiln's column sum over dout
// (kiln_cuda_colsum_bf16, norm.cu) after a plain dweight GEMM; KILN_BGRAD=lt uses cuBLASLt's BGRADB epilogue
// instead, which runs as a separate reduction kernel anyway (matmul_dweight). The output projections pass no
// dbias: the norm backward below them sums theirs (kiln_norm_back_args.dres_bias).
//
// Layout: kiln's row-major X (N, IC) is, for column-major cuBLAS, X^T (IC, N) with ld = IC. So
//   forward   out^T (OC, N)  = W^T^T (OC, IC) . X^T (IC, N):  A = W (IC x OC, ld IC) op T, B = X^T op N
//   dinp      dinp^T (IC, N) = W^T (IC, OC) . dout^T (OC, N): A = W op N,   B = dout^T op N
//   dweight   dW^T (IC, OC) += X^T (IC, N) . dout (N, OC):    A = X^T op N, B = dout^T (OC x N) op T
// The bias is a vector over D's rows (m); BGRADB (KILN_BGRAD=lt) reduces op(B) over k, i.e. dbias = sum over
// rows of dout.
//
// FLOPs: forward 2*N*IC*OC; backward 4*N*IC*OC (dinp + dweight). Bytes (bf16): 2*(N*IC + IC*OC + N*OC) per
// GEMM, plus 4*IC*OC twice for the f32 dweight read-modify-write (2*IC*OC twice with bf16 gradients). At
// N=32k, IC=768, OC=3072 the forward is 155 GFLOP against 250 MB: compute bound (AI ~600 FLOP/byte), so the
// floor is the tensor-core peak.
//
// When cuBLASLt has no algorithm for a fused epilogue (odd leading dimensions, unsupported type mix), the op
// falls back to a plain GEMM plus small kernels (below; dbias from norm.cu's column sums), so every shape
// works.
//
// dinp and the DGELU aux may be column slices of wider rows (the parallel block's fused projection): their
// leading dimensions are the row strides (ldd, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD), so nothing is copied.
// The GELU of a slice that a wider GEMM wrote is gelu_forward, below.
#include <math.h>
#include <string.h>

#include "backend/cuda/common.cuh"

struct lt_gemm {
    cublasOperation_t transa, transb;
    int m, n, k;
    const void *A;
    int lda;
    const void *B;
    int ldb;
    const void *C; // may equal D
    void *D;
    int ldd;
    cudaDataType_t dtype; // C and D
    float beta;
    cublasLtEpilogue_t epi;
    const void *bias;          // or bias-gradient output for BGRADB
    cudaDataType_t bias_dtype; // of bias
    void *aux;                 // GELU aux (pre-activation), bf16, m x n with ld = aux_ld
    int aux_ld;
};

static uint64_t ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    uint64_t a = 256;
    while (a > 1 && (u % a) != 0)
        a >>= 1;
    return a;
}

// Everything that decides the descriptors and the algorithm except the pointers themselves (their alignment
// is in: the heuristic's answer depends on it). Zero-filled before use so that memcmp compares it.
struct lt_key {
    int transa, transb, m, n, k, lda, ldb, ldd, dtype, beta_nz, epi, has_bias, bias_dtype, has_aux, aux_ld;
    int sm_target; // CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, 0: the device's count
    uint32_t al[4];
};

// One cached configuration: descriptors built once, the algorithm (or ok = 0: none / unsupported).
// The heuristic ranks up to LT_CANDIDATES algorithms; unless the context is deterministic, the first call
// times each of them on the real operands and keeps the fastest (tuned = 1), since the heuristic's first
// choice is not always the fastest for a shape. Deterministic contexts keep the heuristic's first choice, so
// that the same algorithm, and so the same rounding, runs every time.
#define LT_CANDIDATES 8
struct lt_entry {
    struct lt_key key;
    int ok, tuned, n_algos;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulAlgo_t algos[LT_CANDIDATES];
};

static void lt_entry_destroy(struct lt_entry *e) {
    if (e->desc)
        cublasLtMatmulDescDestroy(e->desc);
    if (e->la)
        cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb)
        cublasLtMatrixLayoutDestroy(e->lb);
    if (e->lc)
        cublasLtMatrixLayoutDestroy(e->lc);
    if (e->ld)
        cublasLtMatrixLayoutDestroy(e->ld);
    e->desc = NULL;
    e->la = e->lb = e->lc = e->ld = NULL;
}

extern "C" void kiln_cuda_matmul_cache_free(struct cuda_ctx *c) {
    struct lt_entry *t = (struct lt_entry *)c->lt_cache;
    for (int i = 0; i < c->lt_cache_n; i++)
        lt_entry_destroy(&t[i]);
    free(t);
    c->lt_cache = NULL;
    c->lt_cache_n = c->lt_cache_cap = 0;
}

// Builds the descriptors for g and asks the heuristic once (pointers are set per call, not here).
static void lt_entry_build(struct cuda_ctx *c, struct lt_entry *e, const struct lt_gemm *g) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &g->transa, sizeof(g->transa)));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &g->transb, sizeof(g->transb)));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g->epi, sizeof(g->epi)));
    if (g->bias) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                                    sizeof(g->bias)));
        int32_t bt = (int32_t)g->bias_dtype;
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    }
    if (e->key.sm_target > 0) {
        int32_t sm = e->key.sm_target;
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm, sizeof(sm)));
    }
    if (g->aux) {
        int64_t aux_ld = g->aux_ld;
        int32_t at = (int32_t)CUDA_R_16BF;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                    &g->aux, sizeof(g->aux)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                    sizeof(aux_ld)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at,
                                                    sizeof(at)));
    }
    int a_rows = g->transa == CUBLAS_OP_N ? g->m : g->k, a_cols = g->transa == CUBLAS_OP_N ? g->k : g->m;
    int b_rows = g->transb == CUBLAS_OP_N ? g->k : g->n, b_cols = g->transb == CUBLAS_OP_N ? g->n : g->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->la, CUDA_R_16BF, a_rows, a_cols, g->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->lb, CUDA_R_16BF, b_rows, b_cols, g->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->lc, g->dtype, g->m, g->n, g->ldd));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->ld, g->dtype, g->m, g->n, g->ldd));

    cublasLtMatmulPreference_t pref = NULL;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = c->workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                      sizeof(ws)));
    // Pointers carved out of big buffers need not be 256-byte aligned: tell the heuristic what they are.
    const uint32_t *al = e->key.al;
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], 4));
    cublasLtMatmulHeuristicResult_t heur[LT_CANDIDATES];
    int nres = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, e->desc, e->la, e->lb, e->lc, e->ld, pref,
                                                       LT_CANDIDATES, heur, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && nres > 0) {
        e->algo = heur[0].algo;
        e->n_algos = 0;
        for (int i = 0; i < nres; i++)
            if (heur[i].state == CUBLAS_STATUS_SUCCESS)
                e->algos[e->n_algos++] = heur[i].algo;
        // KILN_GEMM_TUNE=0 (kernel index 1): the heuristic's first choice everywhere
        e->tuned = c->deterministic || e->n_algos < 2 || c->kernel[KILN_KERNEL_GEMM_TUNE] != 0;
        e->ok = 1;
    } else {
        if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED &&
            st != CUBLAS_STATUS_INVALID_VALUE)
            CUBLAS_CHECK(st);
        e->ok = 0;
        lt_entry_destroy(e);
    }
}

// Times each candidate algorithm of e (2 runs after a warm-up) and keeps the fastest. Only configurations
// whose every output the real call then rewrites are timed on the real buffers: with beta != 0 (D
// accumulates) the timing runs would add into D, so those keep the heuristic's choice.
static void lt_tune(struct cuda_ctx *c, struct lt_entry *e, const struct lt_gemm *g) {
    e->tuned = 1;
    if (g->beta != 0.0f)
        return;
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    // Three rounds over all candidates, each candidate's best round kept: a candidate timed while the clocks
    // ramp up (tuning happens in the first step) or beside a hiccup is timed again later, so that one slow
    // timing does not decide the pick (step times of one build varied by up to 3% between H100 machines,
    // and the profiles showed different GEMM kernels picked).
    float alpha = 1.0f, beta = 0.0f, t[LT_CANDIDATES];
    int ok[LT_CANDIDATES];
    for (int i = 0; i < e->n_algos; i++) {
        t[i] = INFINITY;
        ok[i] = 1;
    }
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < e->n_algos; i++) {
            float ms = 0.0f;
            cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
            for (int r = 0; r < 3 && st == CUBLAS_STATUS_SUCCESS && ok[i]; r++) {
                if (r == 1)
                    CUDA_CHECK(cudaEventRecord(t0, c->stream));
                st = cublasLtMatmul(c->lt, e->desc, &alpha, g->A, e->la, g->B, e->lb, &beta, g->C, e->lc,
                                    g->D, e->ld, &e->algos[i], c->workspace, c->workspace_bytes, c->stream);
            }
            if (st != CUBLAS_STATUS_SUCCESS || !ok[i]) {
                ok[i] = 0; // this candidate cannot run these operands after all
                continue;
            }
            CUDA_CHECK(cudaEventRecord(t1, c->stream));
            CUDA_CHECK(cudaEventSynchronize(t1));
            CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
            t[i] = ms < t[i] ? ms : t[i];
        }
    float best = INFINITY;
    for (int i = 0; i < e->n_algos; i++)
        if (ok[i] && t[i] < best) {
            best = t[i];
            e->algo = e->algos[i];
        }
    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));
}

// KILN_GEMM_SM_MARGIN=N (the context's gemm_sm_margin): plan every GEMM for N fewer SMs than the device has
// (cuBLASLt's SM count target), as comm-overlapping stacks do for the SMs that NCCL's kernels hold while a
// reduction overlaps the backward. An experiment for the DDP weak-scaling loss (docs/benchmarks.md, 4 H100s:
// the backward slowed beside NCCL's kernels); 0: the device's count. The open refuses a margin that leaves
// no SM. The target is part of the cache key, so a margin switched between calls plans GEMMs anew.
static int gemm_sm_target(const struct cuda_ctx *c) {
    return c->gemm_sm_margin > 0 ? c->prop.multiProcessorCount - c->gemm_sm_margin : 0;
}

// Runs one cuBLASLt matmul; returns 0, or -1 when no algorithm supports this combination (then nothing ran).
// The heuristic is asked once per configuration (struct lt_key) and remembered in the context: a training
// step issues the same few dozen GEMMs every step, and each query costs tens of microseconds of host time.
static int lt_matmul(struct cuda_ctx *c, const struct lt_gemm *g) {
    struct lt_key key;
    memset(&key, 0, sizeof(key));
    key.transa = (int)g->transa;
    key.transb = (int)g->transb;
    key.m = g->m;
    key.n = g->n;
    key.k = g->k;
    key.lda = g->lda;
    key.ldb = g->ldb;
    key.ldd = g->ldd;
    key.dtype = (int)g->dtype;
    key.beta_nz = g->beta != 0.0f;
    key.epi = (int)g->epi;
    key.has_bias = g->bias != NULL;
    key.bias_dtype = g->bias ? (int)g->bias_dtype : 0;
    key.has_aux = g->aux != NULL;
    key.aux_ld = g->aux ? g->aux_ld : 0;
    key.sm_target = gemm_sm_target(c);
    key.al[0] = (uint32_t)ptr_align(g->A);
    key.al[1] = (uint32_t)ptr_align(g->B);
    key.al[2] = (uint32_t)ptr_align(g->C);
    key.al[3] = (uint32_t)ptr_align(g->D);
    if (g->bias)
        key.al[0] |= (uint32_t)ptr_align(g->bias) << 16; // bias alignment matters to the epilogue too
    if (g->aux)
        key.al[1] |= (uint32_t)ptr_align(g->aux) << 16;

    struct lt_entry *t = (struct lt_entry *)c->lt_cache, *e = NULL;
    for (int i = 0; i < c->lt_cache_n && !e; i++)
        if (memcmp(&t[i].key, &key, sizeof(key)) == 0)
            e = &t[i];
    if (!e) {
        if (c->lt_cache_n == c->lt_cache_cap) {
            int cap = c->lt_cache_cap ? 2 * c->lt_cache_cap : 64;
            t = (struct lt_entry *)realloc(t, (size_t)cap * sizeof(*t));
            KILN_ASSERT(t != NULL);
            c->lt_cache = t;
            c->lt_cache_cap = cap;
        }
        e = &t[c->lt_cache_n++];
        memset(e, 0, sizeof(*e));
        e->key = key;
        lt_entry_build(c, e, g);
    }
    if (!e->ok)
        return -1;
    if (g->bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                                    sizeof(g->bias)));
    if (g->aux)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                    &g->aux, sizeof(g->aux)));
    if (!e->tuned)
        lt_tune(c, e, g);
    float alpha = 1.0f, beta = g->beta;
    cublasStatus_t st = cublasLtMatmul(c->lt, e->desc, &alpha, g->A, e->la, g->B, e->lb, &beta, g->C, e->lc,
                                       g->D, e->ld, &e->algo, c->workspace, c->workspace_bytes, c->stream);
    if (st == CUBLAS_STATUS_SUCCESS)
        return 0;
    if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
        CUBLAS_CHECK(st);
    e->ok = 0; // remember: this configuration falls back from now on
    lt_entry_destroy(e);
    return -1;
}

// The plain GEMM must always work; if even it has no algorithm the shapes are broken.
static void lt_matmul_plain(struct cuda_ctx *c, struct lt_gemm g) {
    g.epi = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = NULL;
    g.aux = NULL;
    if (lt_matmul(c, &g) != 0) {
        fprintf(stderr, "kiln: internal error at %s:%d: cuBLASLt has no algorithm for m=%d n=%d k=%d\n",
                __FILE__, __LINE__, g.m, g.n, g.k);
        abort();
    }
}

// ---- fallback epilogues -----------------------------------------------------------------------------------

// x = y (+ bias[col]); pre = x when pre != NULL; y = gelu(x) when gelu, else x. (N, OC) row-major, in place.
static __global__ void bias_act_kernel(bf16 *y, bf16 *pre, const bf16 *bias, int N, int OC, int gelu) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * OC)
        return;
    float x = bf2f(y[i]);
    if (bias)
        x += bf2f(bias[i % OC]);
    if (pre) {
        bf16 xb = f2bf(x);
        pre[i] = xb;
        x = bf2f(xb);
    }
    y[i] = f2bf(gelu ? gelu_tanh(x) : x);
}

// y *= gelu'(pre), elementwise over (N, IC) with rows ldy and ldp elements apart
static __global__ void dgelu_kernel(bf16 *y, int ldy, const bf16 *pre, int ldp, int N, int IC) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * IC)
        return;
    size_t n = i / IC, c = i % IC;
    bf16 *yi = y + n * ldy + c;
    *yi = f2bf(bf2f(*yi) * gelu_tanh_grad(bf2f(pre[n * ldp + c])));
}

// dst += src over (N, IC): dst rows ldd apart, src dense; rounded as kiln_cuda_add rounds
static __global__ void add_rows_kernel(bf16 *dst, int ldd, const bf16 *src, int N, int IC) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * IC)
        return;
    bf16 *d = dst + (i / IC) * ldd + i % IC;
    *d = f2bf(bf2f(*d) + bf2f(src[i]));
}

// out (N, H) = gelu(inp), inp rows ld apart; from the bf16 pre-activation, as bias_act_kernel rounds it.
// Eight elements per thread: one 16-byte load and store when vec (H and ld multiples of 8, both aligned).
static __global__ void gelu_kernel(bf16 *out, const bf16 *inp, int ld, int N, int H, int vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8, n = (size_t)N * H;
    if (i >= n)
        return;
    if (vec) {
        bf16x8 x, y;
        x.u = *(const uint4 *)(inp + (i / H) * ld + i % H);
#pragma unroll
        for (int k = 0; k < 8; k++)
            y.h[k] = f2bf(gelu_tanh(bf2f(x.h[k])));
        *(uint4 *)(out + i) = y.u;
    } else {
        for (size_t k = i; k < i + 8 && k < n; k++)
            out[k] = f2bf(gelu_tanh(bf2f(inp[(k / H) * ld + k % H])));
    }
}

// ---- ops -----------------------------------------------------------------------------------------------

extern "C" void kiln_cuda_matmul_forward(void *ctx, const struct kiln_matmul_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (a->N == 0 || a->OC == 0)
        return;
    KILN_ASSERT(a->act == KILN_ACT_NONE || (a->pre && !a->accumulate));
    struct lt_gemm g;
    memset(&g, 0, sizeof(g));
    g.transa = CUBLAS_OP_T;
    g.transb = CUBLAS_OP_N;
    g.m = a->OC;
    g.n = a->N;
    g.k = a->IC;
    g.A = a->weight;
    g.lda = a->IC;
    g.B = a->inp;
    g.ldb = a->IC;
    g.C = a->out;
    g.D = a->out;
    g.ldd = a->OC;
    g.dtype = CUDA_R_16BF;
    g.beta = a->accumulate ? 1.0f : 0.0f;
    g.bias = a->bias;
    g.bias_dtype = CUDA_R_16BF;
    if (a->act == KILN_ACT_GELU) {
        g.epi = a->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        g.aux = a->pre;
        g.aux_ld = a->OC;
    } else {
        g.epi = a->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    }
    if (lt_matmul(c, &g) == 0)
        return;
    // fallback: plain GEMM (with beta for accumulate), then bias / GELU in one pass
    lt_matmul_plain(c, g);
    if (a->bias || a->act == KILN_ACT_GELU) {
        size_t n = (size_t)a->N * a->OC;
        bias_act_kernel<<<(unsigned)KILN_CEIL_DIV(n, 256), 256, 0, c->stream>>>(
            (bf16 *)a->out, (bf16 *)a->pre, (const bf16 *)a->bias, a->N, a->OC, a->act == KILN_ACT_GELU);
        CUDA_CHECK_LAUNCH();
    }
}

extern "C" void kiln_cuda_gelu_forward(void *ctx, const struct kiln_gelu_args *a) {
    size_t n = (size_t)a->N * a->H;
    if (n == 0)
        return;
    int ld = a->inp_stride ? a->inp_stride : a->H;
    int vec = a->H % 8 == 0 && ld % 8 == 0 && ((uintptr_t)a->inp & 15) == 0 && ((uintptr_t)a->out & 15) == 0;
    size_t threads = KILN_CEIL_DIV(n, 8);
    gelu_kernel<<<(unsigned)KILN_CEIL_DIV(threads, 256), 256, 0, cuda_ctx_of(ctx)->stream>>>(
        (bf16 *)a->out, (const bf16 *)a->inp, ld, a->N, a->H, vec);
    CUDA_CHECK_LAUNCH();
}

// out += x over n parameter-gradient elements (grad dtype); the bf16 sum is formed in f32 and rounded once
static void grad_add(struct cuda_ctx *c, void *out, const void *x, int n) {
    if (c->grad_dtype == KILN_BF16)
        kiln_cuda_add(c, out, out, x, (size_t)n);
    else
        kiln_cuda_add_f32(c, (float *)out, (const float *)x, n);
}

// Where a matmul's bias gradient comes from: kiln's column-sum kernel (default, KILN_BGRAD=colsum), or
// cuBLASLt's BGRADB epilogue (KILN_BGRAD=lt, kernel index 1), which runs as a separate reduction kernel over
// dout anyway (globalKernelBgradAB in a profile), not fused into the GEMM.
static int bgrad_from_lt(const struct cuda_ctx *c) {
    return c->kernel[KILN_KERNEL_BGRAD] == 1;
}

// dweight (+)= inp^T-ish GEMM (grad dtype), with dbias from kiln's column sums or the BGRADB epilogue
static void matmul_dweight(struct cuda_ctx *c, const struct kiln_matmul_back_args *a) {
    struct lt_gemm g;
    memset(&g, 0, sizeof(g));
    g.transa = CUBLAS_OP_N;
    g.transb = CUBLAS_OP_T;
    g.m = a->IC;
    g.n = a->OC;
    g.k = a->N;
    g.A = a->inp;
    g.lda = a->IC;
    g.B = a->dout;
    g.ldb = a->OC;
    g.C = a->dweight;
    g.D = a->dweight;
    g.ldd = a->IC;
    // cuBLASLt's bias gradient has the output's type (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE)
    g.dtype = c->grad_dtype == KILN_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    g.beta = a->grad_assign ? 0.0f : 1.0f;
    g.epi = CUBLASLT_EPILOGUE_DEFAULT;
    void *bgrad = NULL;
    if (a->dbias && bgrad_from_lt(c)) {
        // BGRADB overwrites its output: straight into dbias when assigning, else into scratch, then added
        bgrad = a->grad_assign
                    ? a->dbias
                    : kiln_cuda_scratch(c, SCR_BIASGRAD, (size_t)a->OC * kiln_dtype_bytes(c->grad_dtype));
        g.epi = CUBLASLT_EPILOGUE_BGRADB;
        g.bias = bgrad;
        g.bias_dtype = g.dtype;
    }
    if (lt_matmul(c, &g) != 0) { // no algorithm for BGRADB here: the plain GEMM and kiln's column sums
        lt_matmul_plain(c, g);
    } else if (bgrad) {
        if (!a->grad_assign)
            grad_add(c, a->dbias, bgrad, a->OC);
        return;
    }
    if (a->dbias)
        kiln_cuda_colsum_bf16(c, a->dbias, (const bf16 *)a->dout, a->N, a->OC, a->grad_assign);
}

extern "C" void kiln_cuda_matmul_backward(void *ctx, const struct kiln_matmul_back_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (a->N == 0)
        return;
    size_t n_inp = (size_t)a->N * a->IC;
    // ---- dinp = dout @ W (. gelu'(pre)) ----
    if (a->dinp) {
        int ldi = a->dinp_stride ? a->dinp_stride : a->IC;
        int ldp = a->gelu_pre_stride ? a->gelu_pre_stride : a->IC;
        // with accumulate and gelu both set, dinp += (dout @ W) . gelu'(pre): computed into a (dense)
        // temporary
        int tmp = a->dinp_accumulate && a->dinp_gelu_pre;
        bf16 *dst = tmp ? (bf16 *)kiln_cuda_scratch(c, SCR_GEMM, n_inp * sizeof(bf16)) : (bf16 *)a->dinp;
        int ldd = tmp ? a->IC : ldi; // of dst
        struct lt_gemm g;
        memset(&g, 0, sizeof(g));
        g.transa = CUBLAS_OP_N;
        g.transb = CUBLAS_OP_N;
        g.m = a->IC;
        g.n = a->N;
        g.k = a->OC;
        g.A = a->weight;
        g.lda = a->IC;
        g.B = a->dout;
        g.ldb = a->OC;
        g.C = dst;
        g.D = dst;
        g.ldd = ldd;
        g.dtype = CUDA_R_16BF;
        g.beta = (a->dinp_accumulate && !tmp) ? 1.0f : 0.0f;
        g.epi = CUBLASLT_EPILOGUE_DEFAULT;
        if (a->dinp_gelu_pre) {
            g.epi = CUBLASLT_EPILOGUE_DGELU;
            g.aux = (void *)a->dinp_gelu_pre;
            g.aux_ld = ldp;
        }
        if (lt_matmul(c, &g) != 0) {
            lt_matmul_plain(c, g);
            if (a->dinp_gelu_pre) {
                dgelu_kernel<<<(unsigned)KILN_CEIL_DIV(n_inp, 256), 256, 0, c->stream>>>(
                    dst, ldd, (const bf16 *)a->dinp_gelu_pre, ldp, a->N, a->IC);
                CUDA_CHECK_LAUNCH();
            }
        }
        if (tmp && ldi == a->IC) {
            kiln_cuda_add(ctx, a->dinp, a->dinp, dst, n_inp);
        } else if (tmp) {
            add_rows_kernel<<<(unsigned)KILN_CEIL_DIV(n_inp, 256), 256, 0, c->stream>>>((bf16 *)a->dinp, ldi,
                                                                                        dst, a->N, a->IC);
            CUDA_CHECK_LAUNCH();
        }
    }
    KILN_ASSERT(a->dweight || !a->dbias);
    if (a->dweight)
        matmul_dweight(c, a);
}
