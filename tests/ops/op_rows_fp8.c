// The op table's FP8 rows (op_table.h): amax; the scaled FP8 GEMM with the casts that feed it (amax,
// fp8_cast, fp8_matmul); bias_backward. Their references round to e4m3 and e5m2 in double from the formats'
// definition, with the scales computed as core/ops.h defines them (kiln_fp8_scale, in f32), so that the CPU
// must produce the same codes and differ from the reference only by its f32 sums. On CUDA the codes are the
// same again (the same bf16 inputs, the same f32 scale, the same rounding), so the GEMM's outputs differ by
// the order of the f32 sums and the bf16 output's rounding: the thresholds are bf16's.
#include "ops/op_table.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

// ---- FP8 in double: the formats' definition -----------------------------------------------------------

// x rounded to the nearest value of the format (ties to even), saturating to +-fmax, NaN kept
static double round_fp8_d(double x, enum kiln_fp8_fmt f) {
    int mbits = f == KILN_FP8_E4M3 ? 3 : 2, bias = f == KILN_FP8_E4M3 ? 7 : 15;
    double fmax = kiln_fp8_max(f), a = fabs(x);
    if (isnan(x))
        return x;
    if (a >= fmax)
        return copysign(fmax, x);
    int e;
    frexp(a, &e);
    int E = e - 1 < 1 - bias ? 1 - bias : e - 1; // the binade, or the subnormals'
    double quantum = ldexp(1.0, E - mbits);
    double r = nearbyint(a / quantum) * quantum; // the default rounding mode: to nearest, ties to even
    return copysign(r > fmax ? fmax : r, x);
}

static double gelu_grad_d(double x) {
    double k = sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// amax of each group of x (rows, cols): per tensor (1), row (rows) or column (cols)
static void amax_d(const double *x, int rows, int cols, int per, double *out) {
    int n = per == KILN_FP8_ROWS ? rows : per == KILN_FP8_COLS ? cols : 1;
    for (int i = 0; i < n; i++)
        out[i] = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            double *m = &out[per == KILN_FP8_ROWS ? r : per == KILN_FP8_COLS ? c : 0];
            *m = fabs(x[(size_t)r * cols + c]) > *m ? fabs(x[(size_t)r * cols + c]) : *m;
        }
}

// ---- amax -------------------------------------------------------------------------------------------------
// Fields: N (rows), C (cols), per.

enum { AM_X, AM_OUT, AM_COUNT };

static int amax_groups(const struct opt_case *c) {
    return c->per == KILN_FP8_ROWS ? c->N : c->per == KILN_FP8_COLS ? c->C : 1;
}

static int amax_tensors(const struct opt_case *c, struct opt_tensor *t) {
    t[AM_X] = opt_input("x", OPT_ACT, (size_t)c->N * c->C, 2.0f, 0);   // (N, C)
    t[AM_OUT] = opt_output("amax", OPT_F32, (size_t)amax_groups(c), 0); // (1), (N) or (C)
    return AM_COUNT;
}

static void amax_fwd(const struct opt_args *x) {
    struct kiln_amax_args a = {
        .amax = x->t[AM_OUT], .x = x->t[AM_X], .rows = x->c->N, .cols = x->c->C, .per = x->c->per};
    x->be->ops->amax(x->be->ctx, &a);
}

static void amax_ref(const struct opt_case *c, double *const *v) {
    amax_d(v[AM_X], c->N, c->C, c->per, v[AM_OUT]);
}

static const struct opt_case amax_fd[] = {
    {.N = 5, .C = 7},
    {.N = 6, .C = 9, .per = KILN_FP8_ROWS},
    {.N = 4, .C = 11, .per = KILN_FP8_COLS},
    {.N = 300, .C = 400, .per = KILN_FP8_COLS}, // threaded
    {.N = 300, .C = 400},
};
static const struct opt_case amax_gpu[] = {
    {.N = 4096, .C = 768},
    {.N = 4096, .C = 768, .per = KILN_FP8_ROWS},
    {.N = 4096, .C = 768, .per = KILN_FP8_COLS},
    {.N = 33, .C = 100, .per = KILN_FP8_COLS},
    {.N = 8192, .C = 2048},
};
const struct opt_row opt_row_amax = {
    .name = "amax",
    .ops = {OPT_OP(amax)},
    .about = "amax of a tensor, of each row, of each column (no backward)",
    .fd_cases = amax_fd,
    .n_fd = OPT_COUNT(amax_fd),
    .gpu_cases = amax_gpu,
    .n_gpu = OPT_COUNT(amax_gpu),
    .tensors = amax_tensors,
    .forward = amax_fwd,
    .reference = amax_ref,
    .tol = {.ref = 0, .out = OPT_NMSE_BF16, .stat = 0}, // a max of the same values is exact everywhere
};

// ---- fp8_matmul, with the amax and the casts of its operands ----------------------------------------------
// out (M, N) [+]= (fp8(a sa) / sa) @ (fp8(b sb) / sb)^T [+ bias] [* gelu'(pre)], M = N rows, K = IC, N = OC.
// Fields: N, IC, OC; per (1: rowwise scales); fmt_a, fmt_b; ta, tb (an operand stored (K, M) or (K, N), its
// amax per column and its cast transposing it); bias; accum; dgelu; grad_out; gelu (out = gelu(pre), pre the
// sum); both (each cast writes both layouts in one pass, the GEMM reads the one it needs, and the cast
// records the amax it saw into a value that starts at 2).

enum {
    FM_A,
    FM_B,
    FM_BIAS,
    FM_PRE,
    FM_AMAXA,
    FM_AMAXB,
    FM_SINVA,
    FM_SINVB,
    FM_SEENA,
    FM_SEENB,
    FM_QA,
    FM_QB,
    FM_QA2,
    FM_QB2,
    FM_OUT,
    FM_PREACT,
    FM_COUNT
};

static struct opt_tensor seen_tensor(const char *name, int present) {
    return (struct opt_tensor){.name = name,
                               .dtype = OPT_F32,
                               .role = OPT_INOUT,
                               .n = present ? 1 : 0,
                               .init = OPT_CONST,
                               .a = 2.0f,
                               .of = -1,
                               .of2 = -1};
}

static int fp8mm_tensors(const struct opt_case *c, struct opt_tensor *t) {
    size_t M = c->N, K = c->IC, N = c->OC;
    t[FM_A] = opt_input("a", OPT_ACT, M * K, 1.0f, 0);
    t[FM_B] = opt_input("b", OPT_ACT, N * K, 1.0f / sqrtf((float)K), 0);
    t[FM_BIAS] = opt_input("bias", OPT_ACT, c->bias ? N : 0, 0.5f, 0);
    t[FM_PRE] = opt_input("gelu_pre", OPT_ACT, c->dgelu ? M * N : 0, 1.5f, 0);
    t[FM_AMAXA] = opt_saved("amax_a", OPT_F32, c->per ? M : 1);
    t[FM_AMAXB] = opt_saved("amax_b", OPT_F32, c->per ? N : 1);
    t[FM_SINVA] = opt_saved("scale_inv_a", OPT_F32, c->per ? M : 1); // 1/s: exact everywhere
    t[FM_SINVB] = opt_saved("scale_inv_b", OPT_F32, c->per ? N : 1);
    t[FM_SEENA] = seen_tensor("amax_seen_a", c->both && !c->per);
    t[FM_SEENB] = seen_tensor("amax_seen_b", c->both && !c->per);
    t[FM_QA] = opt_scratch("a_fp8", OPT_ACT, M * K); // bytes enough for M*K codes on any backend
    t[FM_QB] = opt_scratch("b_fp8", OPT_ACT, N * K);
    t[FM_QA2] = opt_scratch("a_fp8_other", OPT_ACT, c->both || c->via_t ? M * K : 0);
    t[FM_QB2] = opt_scratch("b_fp8_other", OPT_ACT, c->both || c->via_t ? N * K : 0);
    t[FM_OUT] = opt_output("out", c->grad_out ? OPT_GRAD : OPT_ACT, M * N, c->accum);
    // a weight gradient in f32 on the GPU is a sum of products in another order than the CPU's: not exact, so
    // not the row's f32 threshold (0: the amaxes and inverse scales are); a parameter gradient's
    if (c->grad_out)
        t[FM_OUT].nmse = OPT_NMSE_F32G;
    t[FM_PREACT] = opt_output("pre", OPT_ACT, c->gelu ? M * N : 0, 0);
    return FM_COUNT;
}

// amax and cast of one operand, (rows, K) as the GEMM reads it, stored transposed when tr; with both, the
// cast writes the stored layout's codes too (into q2) and records the amax it saw into seen
static void cast_operand(const struct opt_args *x, const void *src, float *amax, float *sinv, float *seen,
                         uint8_t *q, uint8_t *q2, int rows, int K, int tr, enum kiln_fp8_fmt fmt) {
    enum kiln_fp8_per per = !x->c->per ? KILN_FP8_TENSOR : tr ? KILN_FP8_COLS : KILN_FP8_ROWS;
    struct kiln_amax_args am = {.amax = amax, .x = src, .rows = tr ? K : rows, .cols = tr ? rows : K, .per = per};
    x->be->ops->amax(x->be->ctx, &am);
    int via = tr && x->c->via_t; // the stored layout's codes alone, then their transpose by fp8_transpose
    struct kiln_fp8_cast_args ca = {.out = tr ? q2 : q,
                                    .out_t = via ? NULL : tr ? q : q2,
                                    .x = src,
                                    .amax = amax,
                                    .scale_inv = sinv,
                                    .amax_seen = seen,
                                    .rows = am.rows,
                                    .cols = am.cols,
                                    .fmt = fmt,
                                    .per = per};
    x->be->ops->fp8_cast(x->be->ctx, &ca);
    if (via)
        x->be->ops->fp8_transpose(x->be->ctx, q, q2, am.rows, am.cols);
}

static void fp8mm_fwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    cast_operand(x, x->t[FM_A], x->t[FM_AMAXA], x->t[FM_SINVA], x->t[FM_SEENA], x->t[FM_QA], x->t[FM_QA2],
                 c->N, c->IC, c->ta, c->fmt_a);
    cast_operand(x, x->t[FM_B], x->t[FM_AMAXB], x->t[FM_SINVB], x->t[FM_SEENB], x->t[FM_QB], x->t[FM_QB2],
                 c->OC, c->IC, c->tb, c->fmt_b);
    struct kiln_fp8_matmul_args a = {.out = x->t[FM_OUT],
                                     .pre = x->t[FM_PREACT],
                                     .a = x->t[FM_QA],
                                     .b = x->t[FM_QB],
                                     .a_fmt = c->fmt_a,
                                     .b_fmt = c->fmt_b,
                                     .a_scale_inv = x->t[FM_SINVA],
                                     .b_scale_inv = x->t[FM_SINVB],
                                     .a_rowwise = c->per,
                                     .b_rowwise = c->per,
                                     .bias = x->t[FM_BIAS],
                                     .gelu_pre = x->t[FM_PRE],
                                     .M = c->N,
                                     .N = c->OC,
                                     .K = c->IC,
                                     .out_grad = c->grad_out,
                                     .accumulate = c->accum};
    x->be->ops->fp8_matmul(x->be->ctx, &a);
}

// One operand (rows, K) in double as the GEMM sees it, its elements rounded to the format after the f32
// scaling, and 1/s of each row (f32, as the op defines it)
static double *quantize_d(const double *src, int rows, int K, int tr, int rowwise, enum kiln_fp8_fmt fmt,
                          double *amax_out, double *inv) {
    double *x = malloc(sizeof(double) * rows * K), *q = malloc(sizeof(double) * rows * K);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < K; k++)
            x[(size_t)r * K + k] = tr ? src[(size_t)k * rows + r] : src[(size_t)r * K + k];
    amax_d(x, rows, K, rowwise ? KILN_FP8_ROWS : KILN_FP8_TENSOR, amax_out);
    for (int r = 0; r < rows; r++) {
        float s = kiln_fp8_scale((float)amax_out[rowwise ? r : 0], fmt);
        inv[r] = 1.0f / s;
        for (int k = 0; k < K; k++)
            q[(size_t)r * K + k] = round_fp8_d((float)x[(size_t)r * K + k] * s, fmt);
    }
    free(x);
    return q;
}

static double gelu_d(double x) {
    double k = sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

static void fp8mm_ref(const struct opt_case *c, double *const *v) {
    int M = c->N, K = c->IC, N = c->OC;
    double *ia = malloc(sizeof(double) * M), *ib = malloc(sizeof(double) * N);
    double *qa = quantize_d(v[FM_A], M, K, c->ta, c->per, c->fmt_a, v[FM_AMAXA], ia);
    double *qb = quantize_d(v[FM_B], N, K, c->tb, c->per, c->fmt_b, v[FM_AMAXB], ib);
    for (int i = 0; i < (c->per ? M : 1); i++)
        v[FM_SINVA][i] = ia[i];
    for (int i = 0; i < (c->per ? N : 1); i++)
        v[FM_SINVB][i] = ib[i];
    if (c->both && !c->per) {
        v[FM_SEENA][0] = v[FM_AMAXA][0] > v[FM_SEENA][0] ? v[FM_AMAXA][0] : v[FM_SEENA][0];
        v[FM_SEENB][0] = v[FM_AMAXB][0] > v[FM_SEENB][0] ? v[FM_AMAXB][0] : v[FM_SEENB][0];
    }
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += qa[(size_t)m * K + k] * qb[(size_t)n * K + k];
            s *= ia[m] * ib[n];
            if (c->bias)
                s += v[FM_BIAS][n];
            if (c->dgelu)
                s *= gelu_grad_d(v[FM_PRE][(size_t)m * N + n]);
            double *o = &v[FM_OUT][(size_t)m * N + n];
            if (c->gelu) {
                v[FM_PREACT][(size_t)m * N + n] = s;
                *o = gelu_d(s);
            } else {
                *o = c->accum ? *o + s : s;
            }
        }
    free(qa);
    free(qb);
    free(ia);
    free(ib);
}

static double fp8mm_flops(const struct opt_case *c, int backward) {
    return 2.0 * c->N * c->IC * c->OC;
}

// the model's three GEMMs of a linear layer: forward (e4m3 x e4m3, bias, GELU), dinp (e5m2 dout x e4m3 W^T,
// the weight stored (OC, IC) = (K, N): tb; DGELU), dweight (e5m2 dout^T x e4m3 inp^T: ta and tb, grad out,
// +=); casts of both layouts at once (the weights' and the output gradient's)
static const struct opt_case fp8mm_fd[] = {
    {.N = 5, .IC = 7, .OC = 9, .bias = 1},
    {.N = 6, .IC = 16, .OC = 8, .per = 1, .accum = 1},
    {.N = 4, .IC = 9, .OC = 5, .fmt_a = KILN_FP8_E5M2, .ta = 1, .tb = 1, .grad_out = 1, .accum = 1},
    {.N = 7, .IC = 6, .OC = 10, .fmt_a = KILN_FP8_E5M2, .tb = 1, .dgelu = 1, .per = 1},
    {.N = 3, .IC = 8, .OC = 4, .fmt_a = KILN_FP8_E5M2, .fmt_b = KILN_FP8_E5M2, .bias = 1},
    {.N = 64, .IC = 300, .OC = 40, .bias = 1, .per = 1}, // past a panel (KC), and threaded
    {.N = 6, .IC = 5, .OC = 7, .bias = 1, .gelu = 1},
    {.N = 5, .IC = 6, .OC = 4, .ta = 1, .both = 1, .accum = 1},
    {.N = 4, .IC = 7, .OC = 6, .tb = 1, .both = 1, .per = 1},
    {.N = 5, .IC = 6, .OC = 7, .fmt_a = KILN_FP8_E5M2, .ta = 1, .tb = 1, .via_t = 1, .grad_out = 1},
};
static const struct opt_case fp8mm_gpu[] = {
    {.N = 256, .IC = 768, .OC = 2304, .bias = 1},
    {.N = 128, .IC = 256, .OC = 512, .per = 1},
    {.N = 512, .IC = 1024, .OC = 256, .fmt_a = KILN_FP8_E5M2, .ta = 1, .tb = 1, .grad_out = 1, .accum = 1},
    {.N = 256, .IC = 3072, .OC = 768, .fmt_a = KILN_FP8_E5M2, .tb = 1, .dgelu = 1},
    {.N = 256, .IC = 768, .OC = 768, .fmt_a = KILN_FP8_E5M2, .tb = 1, .per = 1, .accum = 1},
    {.N = 4096, .IC = 768, .OC = 3072, .bias = 1},
    {.N = 1024, .IC = 768, .OC = 3072, .bias = 1, .gelu = 1},
    {.N = 512, .IC = 1024, .OC = 256, .fmt_a = KILN_FP8_E5M2, .ta = 1, .tb = 1, .grad_out = 1, .both = 1},
    {.N = 512, .IC = 768, .OC = 1024, .tb = 1, .both = 1, .accum = 1},
    {.N = 256, .IC = 3072, .OC = 768, .fmt_a = KILN_FP8_E5M2, .tb = 1, .dgelu = 1, .accum = 1},
    {.N = 100, .IC = 72, .OC = 40, .bias = 1, .gelu = 1}, // not multiples of 16: the plain kernel
    {.N = 200, .IC = 300, .OC = 130, .ta = 1, .both = 1}, // the casts' edges
    {.N = 256, .IC = 768, .OC = 512, .fmt_a = KILN_FP8_E5M2, .tb = 1, .via_t = 1}, // fp8_transpose's words
    {.N = 200, .IC = 300, .OC = 130, .ta = 1, .tb = 1, .via_t = 1},                 // and its edges
};
const struct opt_row opt_row_fp8_matmul = {
    .name = "fp8_matmul",
    .ops = {OPT_OP(amax), OPT_OP(fp8_cast), OPT_OP(fp8_matmul), OPT_OP(fp8_transpose)},
    .about = "amax + fp8_cast (plain, transposing, both, or fp8_transpose after) + fp8_matmul: e4m3/e5m2, "
             "tensorwise and rowwise, "
             "bias, GELU, +=, DGELU, grad out (no backward)",
    .fd_cases = fp8mm_fd,
    .n_fd = OPT_COUNT(fp8mm_fd),
    .gpu_cases = fp8mm_gpu,
    .n_gpu = OPT_COUNT(fp8mm_gpu),
    .tensors = fp8mm_tensors,
    .forward = fp8mm_fwd,
    .reference = fp8mm_ref,
    .flops = fp8mm_flops,
    .tol = {.ref = 1e-5, .out = OPT_NMSE_BF16, .stat = 0, .pgrad = OPT_NMSE_F32G},
};

// ---- bias_backward ----------------------------------------------------------------------------------------
// Fields: N (rows), C (columns); assign.

enum { BB_X, BB_DB, BB_COUNT };

static int biasb_tensors(const struct opt_case *c, struct opt_tensor *t) {
    t[BB_X] = opt_input("x", OPT_ACT, (size_t)c->N * c->C, 1.0f, 0); // (N, C)
    t[BB_DB] = opt_output("dbias", OPT_GRAD, (size_t)c->C, !c->assign);
    return BB_COUNT;
}

static void biasb_fwd(const struct opt_args *x) {
    struct kiln_bias_back_args a = {
        .dbias = x->t[BB_DB], .x = x->t[BB_X], .M = x->c->N, .N = x->c->C, .assign = x->c->assign};
    x->be->ops->bias_backward(x->be->ctx, &a);
}

static void biasb_ref(const struct opt_case *c, double *const *v) {
    for (int j = 0; j < c->C; j++) {
        double s = c->assign ? 0 : v[BB_DB][j];
        for (int i = 0; i < c->N; i++)
            s += v[BB_X][(size_t)i * c->C + j];
        v[BB_DB][j] = s;
    }
}

static const struct opt_case biasb_fd[] = {
    {.N = 5, .C = 7, .assign = 1}, {.N = 9, .C = 70}, {.N = 300, .C = 130, .assign = 1}};
static const struct opt_case biasb_gpu[] = {
    {.N = 4096, .C = 768, .assign = 1}, {.N = 100, .C = 2304}, {.N = 8192, .C = 3072}};
const struct opt_row opt_row_bias_backward = {
    .name = "bias_backward",
    .ops = {OPT_OP(bias_backward)},
    .about = "bias_backward: column sums, = or += (no backward: it is one)",
    .fd_cases = biasb_fd,
    .n_fd = OPT_COUNT(biasb_fd),
    .gpu_cases = biasb_gpu,
    .n_gpu = OPT_COUNT(biasb_gpu),
    .tensors = biasb_tensors,
    .forward = biasb_fwd,
    .reference = biasb_ref,
    .tol = {.ref = 1e-5, .out = OPT_NMSE_BF16, .stat = OPT_NMSE_F32G},
};
