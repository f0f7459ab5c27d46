// CPU backend: a cache-blocked fp32 GEMM (BLIS-style packing), the matmul ops built on it, and their GELU.
//
// Loop nest, for C (M, N) += A (M, K) @ B (K, N):
//   for jc in N by NC:            pack B[pc:pc+KC, jc:jc+NC] into NR-wide panels (bpack, shared)
//     for pc in K by KC:
//       for ic in M by MB:        pack A[ic:ic+MB, pc:pc+KC] into MR-tall panels (apack, shared)
//         parallel over tiles of (TM rows, TN columns): MR x NR micro-kernel, KC deep
// Determinism: each C element is accumulated as C = ((C0 + sum_kc0) + sum_kc1) + ..., every partial sum in
// the same k order, whichever thread computes its tile and however many threads there are.
#include "backend/cpu/cpu_internal.h"
#include "util/error.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KILN_CPU_AVX2 1
#endif

#define MR KILN_CPU_MR
#define NR KILN_CPU_NR
#define KC KILN_CPU_KC
#define MB KILN_CPU_MB
#define NC KILN_CPU_NC
#define TM (8 * MR) // rows of one parallel tile
#define TN (8 * NR) // columns of one parallel tile

// ---- packing ----------------------------------------------------------------------------------------

// ap[k*MR + i] = A(i0 + i, p0 + k), zero rows past M.
static void pack_a_panel(float *ap, const struct kiln_cpu_gemm *g, int i0, int p0, int kc) {
    int rows = g->M - i0 < MR ? g->M - i0 : MR;
    if (g->ta) {
        for (int k = 0; k < kc; k++) {
            const float *src = g->A + (size_t)(p0 + k) * g->lda + i0;
            int i = 0;
            for (; i < rows; i++)
                ap[k * MR + i] = src[i];
            for (; i < MR; i++)
                ap[k * MR + i] = 0.0f;
        }
    } else {
        for (int i = 0; i < MR; i++) {
            if (i < rows) {
                const float *src = g->A + (size_t)(i0 + i) * g->lda + p0;
                for (int k = 0; k < kc; k++)
                    ap[k * MR + i] = src[k];
            } else {
                for (int k = 0; k < kc; k++)
                    ap[k * MR + i] = 0.0f;
            }
        }
    }
}

// bp[k*NR + j] = B(p0 + k, j0 + j), zero columns past N.
static void pack_b_panel(float *bp, const struct kiln_cpu_gemm *g, int j0, int p0, int kc) {
    int cols = g->N - j0 < NR ? g->N - j0 : NR;
    if (g->tb) {
        for (int j = 0; j < NR; j++) {
            if (j < cols) {
                const float *src = g->B + (size_t)(j0 + j) * g->ldb + p0;
                for (int k = 0; k < kc; k++)
                    bp[k * NR + j] = src[k];
            } else {
                for (int k = 0; k < kc; k++)
                    bp[k * NR + j] = 0.0f;
            }
        }
    } else {
        for (int k = 0; k < kc; k++) {
            const float *src = g->B + (size_t)(p0 + k) * g->ldb + j0;
            int j = 0;
            for (; j < cols; j++)
                bp[k * NR + j] = src[j];
            for (; j < NR; j++)
                bp[k * NR + j] = 0.0f;
        }
    }
}

// ---- micro-kernel: acc (MR, NR) = ap (kc, MR)^T @ bp (kc, NR); then c = acc (first) or c += acc -------

#ifdef KILN_CPU_AVX2
static void micro_kernel(int kc, const float *restrict ap, const float *restrict bp, float *restrict c,
                         int ldc, int add) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(bp + k * NR);
        __m256 b1 = _mm256_load_ps(bp + k * NR + 8);
        __m256 a;
        a = _mm256_broadcast_ss(ap + k * MR + 0);
        c00 = _mm256_fmadd_ps(a, b0, c00);
        c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(ap + k * MR + 1);
        c10 = _mm256_fmadd_ps(a, b0, c10);
        c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(ap + k * MR + 2);
        c20 = _mm256_fmadd_ps(a, b0, c20);
        c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(ap + k * MR + 3);
        c30 = _mm256_fmadd_ps(a, b0, c30);
        c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(ap + k * MR + 4);
        c40 = _mm256_fmadd_ps(a, b0, c40);
        c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(ap + k * MR + 5);
        c50 = _mm256_fmadd_ps(a, b0, c50);
        c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (int i = 0; i < MR; i++) {
        float *ci = c + (size_t)i * ldc;
        if (add) {
            _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]));
            _mm256_storeu_ps(ci + 8, _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]));
        } else {
            _mm256_storeu_ps(ci, acc[i][0]);
            _mm256_storeu_ps(ci + 8, acc[i][1]);
        }
    }
}
#else
// Portable version: the same order of operations (one running sum per element over k, then one add).
static void micro_kernel(int kc, const float *restrict ap, const float *restrict bp, float *restrict c,
                         int ldc, int add) {
    float acc[MR][NR];
    memset(acc, 0, sizeof(acc));
    for (int k = 0; k < kc; k++)
        for (int i = 0; i < MR; i++) {
            float a = ap[k * MR + i];
            for (int j = 0; j < NR; j++)
                acc[i][j] = fmaf(a, bp[k * NR + j], acc[i][j]);
        }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            c[(size_t)i * ldc + j] = add ? c[(size_t)i * ldc + j] + acc[i][j] : acc[i][j];
}
#endif

// One MR x NR tile of C at (i0, j0): full tiles go straight to C, edge tiles through a temporary so nothing
// outside C is touched. Both paths perform the same arithmetic per element.
static void tile_update(const struct kiln_cpu_gemm *g, int kc, const float *ap, const float *bp, int i0,
                        int j0, int add) {
    float *c = g->C + (size_t)i0 * g->ldc + j0;
    int rows = g->M - i0 < MR ? g->M - i0 : MR;
    int cols = g->N - j0 < NR ? g->N - j0 : NR;
    if (rows == MR && cols == NR) {
        micro_kernel(kc, ap, bp, c, g->ldc, add);
        return;
    }
    float tmp[MR * NR];
    micro_kernel(kc, ap, bp, tmp, NR, 0);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            c[(size_t)i * g->ldc + j] = add ? c[(size_t)i * g->ldc + j] + tmp[i * NR + j] : tmp[i * NR + j];
}

// The loop nest on `threads` threads with the given packing buffers. With threads = 1 the region is inactive
// and its work-sharing loops run whole on the calling thread: that is how a task inside another parallel
// region (kiln_cpu_gemm_serial) runs it, with buffers of its own.
static void gemm_on(const struct kiln_cpu_gemm *g, float *apack, float *bpack, int threads) {
    if (g->M <= 0 || g->N <= 0)
        return;
    if (g->K <= 0) {
        if (!g->accumulate)
            for (int i = 0; i < g->M; i++)
                memset(g->C + (size_t)i * g->ldc, 0, (size_t)g->N * sizeof(float));
        return;
    }
#pragma omp parallel num_threads(threads) if (threads > 1 && KILN_CPU_PAR((double)g->M * g->N * g->K / 16))
    for (int jc = 0; jc < g->N; jc += NC) {
        int nc = g->N - jc < NC ? g->N - jc : NC;
        int n_panels = (nc + NR - 1) / NR;
        for (int pc = 0; pc < g->K; pc += KC) {
            int kc = g->K - pc < KC ? g->K - pc : KC;
            int add = g->accumulate || pc > 0;
#pragma omp for schedule(static)
            for (int jp = 0; jp < n_panels; jp++)
                pack_b_panel(bpack + (size_t)jp * KC * NR, g, jc + jp * NR, pc, kc);
            for (int ic = 0; ic < g->M; ic += MB) {
                int mc = g->M - ic < MB ? g->M - ic : MB;
                int m_panels = (mc + MR - 1) / MR;
#pragma omp for schedule(static)
                for (int ip = 0; ip < m_panels; ip++)
                    pack_a_panel(apack + (size_t)ip * KC * MR, g, ic + ip * MR, pc, kc);
                int tiles_m = (mc + TM - 1) / TM, tiles_n = (nc + TN - 1) / TN;
#pragma omp for schedule(dynamic, 1)
                for (int t = 0; t < tiles_m * tiles_n; t++) {
                    int tm = t % tiles_m, tn = t / tiles_m;
                    int jp_end = (tn + 1) * (TN / NR) < n_panels ? (tn + 1) * (TN / NR) : n_panels;
                    int ip_end = (tm + 1) * (TM / MR) < m_panels ? (tm + 1) * (TM / MR) : m_panels;
                    for (int jp = tn * (TN / NR); jp < jp_end; jp++)
                        for (int ip = tm * (TM / MR); ip < ip_end; ip++)
                            tile_update(g, kc, apack + (size_t)ip * KC * MR, bpack + (size_t)jp * KC * NR,
                                        ic + ip * MR, jc + jp * NR, add);
                }
            }
        }
    }
}

void kiln_cpu_gemm(struct kiln_cpu_ctx *ctx, const struct kiln_cpu_gemm *g) {
    gemm_on(g, ctx->apack, ctx->bpack, ctx->threads);
}

void kiln_cpu_gemm_serial(const struct kiln_cpu_gemm *g, float *apack, float *bpack) {
    gemm_on(g, apack, bpack, 1);
}

// ---- GELU (tanh approximation, as GPT-2) --------------------------------------------------------------

#define GELU_SCALE 0.7978845608028654f // sqrt(2 / pi)

// tanh from one exponential of a non-positive argument, e = e^(-2|u|): tanh |u| = (1 - e) / (1 + e), its sign
// u's. kiln_cpu_exp_neg vectorizes where glibc's tanhf (through expm1f) and expf are calls per element (they
// were a fifth, then a twentieth of a shakespeare-char step). The cancellation in (1 - e) for tiny u costs
// absolute error ~1e-7, which GELU's 0.5 x (1 + tanh) absorbs; past |u| = 9 the quotient rounds to 1.
static inline float fast_tanh(float u) {
    float e = kiln_cpu_exp_neg(-2.0f * fabsf(u));
    return copysignf((1.0f - e) / (1.0f + e), u);
}

static inline float gelu(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + fast_tanh(GELU_SCALE * (x + cube)));
}

static inline float gelu_grad(float x) {
    float cube = 0.044715f * x * x * x;
    float tanh_out = fast_tanh(GELU_SCALE * (x + cube));
    float sech2 = 1.0f - tanh_out * tanh_out;
    return 0.5f * (1.0f + tanh_out) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

float kiln_cpu_gelu_grad(float x) {
    return gelu_grad(x);
}

// ---- ops -------------------------------------------------------------------------------------------

// out = act(inp @ weight^T + bias)
void kiln_cpu_matmul_forward(void *ctx, const struct kiln_matmul_args *a) {
    struct kiln_cpu_ctx *c = ctx;
    KILN_ASSERT(a->act == KILN_ACT_NONE || (a->pre && !a->accumulate));
    float *dst = a->act == KILN_ACT_NONE ? a->out : a->pre; // (N, OC)
    struct kiln_cpu_gemm g = {.M = a->N,
                              .N = a->OC,
                              .K = a->IC,
                              .A = a->inp,
                              .lda = a->IC,
                              .ta = 0,
                              .B = a->weight,
                              .ldb = a->IC,
                              .tb = 1,
                              .C = dst,
                              .ldc = a->OC,
                              .accumulate = a->accumulate};
    kiln_cpu_gemm(c, &g);
    if (!a->bias && a->act == KILN_ACT_NONE)
        return;
    const float *bias = a->bias;
    float *out = a->out;
    int OC = a->OC;
#pragma omp parallel for num_threads(c->threads) schedule(static) if (KILN_CPU_PAR((double)a->N * OC))
    for (int n = 0; n < a->N; n++) {
        float *row = dst + (size_t)n * OC;
        if (bias)
            for (int o = 0; o < OC; o++)
                row[o] += bias[o];
        if (a->act == KILN_ACT_GELU)
            for (int o = 0; o < OC; o++)
                out[(size_t)n * OC + o] = gelu(row[o]);
    }
}

void kiln_cpu_matmul_backward(void *ctx, const struct kiln_matmul_back_args *a) {
    struct kiln_cpu_ctx *c = ctx;
    int N = a->N, IC = a->IC, OC = a->OC;
    if (a->dinp) {
        // dinp (N, IC) = dout (N, OC) @ weight (OC, IC) [* gelu'(pre)]
        int ldi = a->dinp_stride ? a->dinp_stride : IC, ldp = a->gelu_pre_stride ? a->gelu_pre_stride : IC;
        float *dst = a->dinp;
        int ldd = ldi; // of dst
        float *tmp = NULL;
        if (a->dinp_gelu_pre && a->dinp_accumulate) { // (dout @ W) * gelu'(pre) is added, so stage it
            tmp = kiln_cpu_alloc(ctx, (size_t)N * IC * sizeof(float));
            KILN_ASSERT(tmp);
            dst = tmp;
            ldd = IC;
        }
        struct kiln_cpu_gemm g = {.M = N,
                                  .N = IC,
                                  .K = OC,
                                  .A = a->dout,
                                  .lda = OC,
                                  .ta = 0,
                                  .B = a->weight,
                                  .ldb = IC,
                                  .tb = 0,
                                  .C = dst,
                                  .ldc = ldd,
                                  .accumulate = a->dinp_accumulate && !tmp};
        kiln_cpu_gemm(c, &g);
        if (a->dinp_gelu_pre) {
            const float *pre = a->dinp_gelu_pre;
            float *dinp = a->dinp;
#pragma omp parallel for num_threads(c->threads) schedule(static) if (KILN_CPU_PAR((double)N * IC))
            for (int n = 0; n < N; n++)
                for (int i = 0; i < IC; i++) {
                    size_t k = (size_t)n * ldi + i;
                    float v = dst[(size_t)n * ldd + i] * gelu_grad(pre[(size_t)n * ldp + i]);
                    dinp[k] = tmp ? dinp[k] + v : v;
                }
        }
        kiln_cpu_free(ctx, tmp);
    }
    // dweight (OC, IC) (+)= dout^T (OC, N) @ inp (N, IC)
    KILN_ASSERT(a->dweight || !a->dbias);
    if (!a->dweight)
        return;
    struct kiln_cpu_gemm gw = {.M = OC,
                               .N = IC,
                               .K = N,
                               .A = a->dout,
                               .lda = OC,
                               .ta = 1,
                               .B = a->inp,
                               .ldb = IC,
                               .tb = 0,
                               .C = a->dweight,
                               .ldc = IC,
                               .accumulate = !a->grad_assign};
    kiln_cpu_gemm(c, &gw);
    if (a->dbias) {
        // dbias (OC) += column sums of dout; each thread owns a column block and sums rows in order
        const float *dout = a->dout;
        float *dbias = a->dbias;
        int n_blocks = (OC + 63) / 64;
#pragma omp parallel for num_threads(c->threads) schedule(static) if (KILN_CPU_PAR((double)N * OC))
        for (int bk = 0; bk < n_blocks; bk++) {
            int o0 = bk * 64, o1 = o0 + 64 < OC ? o0 + 64 : OC;
            float sum[64] = {0};
            for (int n = 0; n < N; n++)
                for (int o = o0; o < o1; o++)
                    sum[o - o0] += dout[(size_t)n * OC + o];
            for (int o = o0; o < o1; o++)
                dbias[o] = a->grad_assign ? sum[o - o0] : dbias[o] + sum[o - o0];
        }
    }
}

// out = gelu(inp), inp rows inp_stride apart: the same GELU as the matmul epilogue above
void kiln_cpu_gelu_forward(void *ctx, const struct kiln_gelu_args *a) {
    int N = a->N, H = a->H, ld = a->inp_stride ? a->inp_stride : a->H;
    const float *inp = a->inp;
    float *out = a->out;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)N * H))
    for (int n = 0; n < N; n++)
        for (int i = 0; i < H; i++)
            out[(size_t)n * H + i] = gelu(inp[(size_t)n * ld + i]);
}
