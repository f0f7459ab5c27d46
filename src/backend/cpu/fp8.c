// CPU backend: the FP8 ops (core/ops.h), an exact emulation of what FP8 tensor cores compute: the casts
// round to e4m3 or e5m2 as the hardware's saturating conversion does (nearest even, subnormals, +-fmax for
// anything larger, NaN kept), and the GEMM multiplies the decoded values in f32 (a product of two FP8
// values is exact in f32) and sums them as the f32 GEMM does, then dequantizes.
#include "backend/cpu/cpu_internal.h"
#include "util/error.h"

#include <math.h>
#include <omp.h>
#include <string.h>

// ---- one value ----------------------------------------------------------------------------------------

struct fp8_format {
    int mbits, bias; // mantissa bits, exponent bias
    float max;       // largest finite value
    uint8_t max_code, nan_code;
};
static const struct fp8_format formats[2] = {
    [KILN_FP8_E4M3] = {.mbits = 3, .bias = 7, .max = 448.0f, .max_code = 0x7e, .nan_code = 0x7f},
    [KILN_FP8_E5M2] = {.mbits = 2, .bias = 15, .max = 57344.0f, .max_code = 0x7b, .nan_code = 0x7f},
};

uint8_t kiln_fp8_encode(float x, enum kiln_fp8_fmt fmt) {
    const struct fp8_format *f = &formats[fmt];
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return sign | f->nan_code;
    float a = fabsf(x);
    if (a >= f->max) // saturation: no rounding below max can reach past it (the next step up is not finite)
        return sign | f->max_code;
    // the quantum of a's binade, or of the subnormals below the smallest normal 2^(1 - bias)
    int e;
    frexpf(a, &e); // a = m 2^e, m in [0.5, 1): a's binade is 2^(e - 1)
    int E = e - 1 < 1 - f->bias ? 1 - f->bias : e - 1;
    float q = rintf(ldexpf(a, f->mbits - E)); // a / quantum, exact (a power of two), then nearest even
    // q counts quanta of 2^(E - mbits): q < 2^mbits is a subnormal's mantissa; q = 2^(mbits + 1) is the next
    // binade's first value (a carry), which the normal encoding below takes as it is
    if (q == 0.0f)
        return sign;
    int n = (int)q;
    if (E == 1 - f->bias && n < (1 << f->mbits))
        return sign | (uint8_t)n; // subnormal: exponent field 0
    if (n >= (2 << f->mbits)) { // carried into the next binade
        n >>= 1;
        E++;
    }
    return sign | (uint8_t)(((E + f->bias) << f->mbits) | (n - (1 << f->mbits)));
}

float kiln_fp8_decode(uint8_t c, enum kiln_fp8_fmt fmt) {
    const struct fp8_format *f = &formats[fmt];
    int sign = c & 0x80, ef = (c & 0x7f) >> f->mbits, m = c & ((1 << f->mbits) - 1);
    float v;
    if (fmt == KILN_FP8_E4M3 && (c & 0x7f) == 0x7f)
        v = NAN;
    else if (fmt == KILN_FP8_E5M2 && ef == 31)
        v = m ? NAN : INFINITY;
    else if (ef == 0)
        v = ldexpf((float)m, 1 - f->bias - f->mbits);
    else
        v = ldexpf((float)(m + (1 << f->mbits)), ef - f->bias - f->mbits);
    return sign ? -v : v;
}

// ---- amax ---------------------------------------------------------------------------------------------

// the larger magnitude, NaN sticking once seen
static inline float amax_step(float m, float v) {
    v = fabsf(v);
    return isnan(m) || isnan(v) ? NAN : (v > m ? v : m);
}

void kiln_cpu_amax(void *ctx, const struct kiln_amax_args *a) {
    int R = a->rows, C = a->cols, ld = a->stride ? a->stride : a->cols;
    const float *x = a->x;
    int th = kiln_cpu_threads(ctx);
    if (a->per == KILN_FP8_ROWS) {
#pragma omp parallel for num_threads(th) schedule(static) if (KILN_CPU_PAR((double)R * C))
        for (int r = 0; r < R; r++) {
            float m = 0.0f;
            for (int c = 0; c < C; c++)
                m = amax_step(m, x[(size_t)r * ld + c]);
            a->amax[r] = m;
        }
        return;
    }
    if (a->per == KILN_FP8_COLS) {
#pragma omp parallel for num_threads(th) schedule(static) if (KILN_CPU_PAR((double)R * C))
        for (int c = 0; c < C; c++) {
            float m = 0.0f;
            for (int r = 0; r < R; r++)
                m = amax_step(m, x[(size_t)r * ld + c]);
            a->amax[c] = m;
        }
        return;
    }
    float m = 0.0f; // a max is the same in any order: no need for a fixed one
#pragma omp parallel for num_threads(th) schedule(static) reduction(max : m) if (KILN_CPU_PAR((double)R * C))
    for (int r = 0; r < R; r++) {
        float mr = 0.0f;
        for (int c = 0; c < C; c++)
            mr = amax_step(mr, x[(size_t)r * ld + c]);
        m = isnan(mr) || isnan(m) ? NAN : (mr > m ? mr : m);
    }
    a->amax[0] = m;
}

// ---- cast ---------------------------------------------------------------------------------------------

void kiln_cpu_fp8_cast(void *ctx, const struct kiln_fp8_cast_args *a) {
    int R = a->rows, C = a->cols, ld = a->stride ? a->stride : a->cols;
    const float *x = a->x;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)R * C))
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float amax = a->amax[a->per == KILN_FP8_ROWS ? r : a->per == KILN_FP8_COLS ? c : 0];
            uint8_t q = kiln_fp8_encode(x[(size_t)r * ld + c] * kiln_fp8_scale(amax, a->fmt), a->fmt);
            if (a->out)
                a->out[(size_t)r * C + c] = q;
            if (a->out_t)
                a->out_t[(size_t)c * R + r] = q;
        }
    if (a->scale_inv) {
        int n = a->per == KILN_FP8_ROWS ? R : a->per == KILN_FP8_COLS ? C : 1;
        for (int i = 0; i < n; i++)
            a->scale_inv[i] = 1.0f / kiln_fp8_scale(a->amax[i], a->fmt);
    }
    if (a->amax_seen) {
        KILN_ASSERT(a->per == KILN_FP8_TENSOR);
        float m = a->amax_seen[0];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                m = amax_step(m, x[(size_t)r * ld + c]);
        a->amax_seen[0] = m;
    }
}

void kiln_cpu_fp8_transpose(void *ctx, uint8_t *out, const uint8_t *in, int rows, int cols) {
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)rows * cols))
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++)
            out[(size_t)c * rows + r] = in[(size_t)r * cols + c];
}

// ---- GEMM ---------------------------------------------------------------------------------------------

static float *decode_all(void *ctx, const uint8_t *q, size_t n, enum kiln_fp8_fmt fmt) {
    float table[256];
    for (int c = 0; c < 256; c++)
        table[c] = kiln_fp8_decode((uint8_t)c, fmt);
    float *out = kiln_cpu_alloc(ctx, n * sizeof(float));
    KILN_ASSERT(out);
    for (size_t i = 0; i < n; i++)
        out[i] = table[q[i]];
    return out;
}

void kiln_cpu_fp8_matmul(void *ctx, const struct kiln_fp8_matmul_args *a) {
    int M = a->M, N = a->N, K = a->K, ldc = a->ldc ? a->ldc : a->N;
    int ldp = a->gelu_pre_stride ? a->gelu_pre_stride : a->N;
    float *A = decode_all(ctx, a->a, (size_t)M * K, a->a_fmt), *B = decode_all(ctx, a->b, (size_t)N * K, a->b_fmt);
    float *acc = kiln_cpu_alloc(ctx, (size_t)M * N * sizeof(float));
    KILN_ASSERT(acc);
    struct kiln_cpu_gemm g = {
        .M = M, .N = N, .K = K, .A = A, .lda = K, .ta = 0, .B = B, .ldb = K, .tb = 1, .C = acc, .ldc = N};
    kiln_cpu_gemm(ctx, &g);
    const float *ia = a->a_scale_inv, *ib = a->b_scale_inv;
    const float *bias = a->bias, *gpre = a->gelu_pre;
    KILN_ASSERT(!a->pre || (!a->accumulate && !gpre));
    float *out = a->pre ? a->pre : a->out; // with the GELU: the pre-activation first, then its GELU
    int ldo = a->pre ? N : ldc;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)M * N))
    for (int m = 0; m < M; m++) {
        float sa = ia[a->a_rowwise ? m : 0];
        for (int n = 0; n < N; n++) {
            float v = acc[(size_t)m * N + n] * sa * ib[a->b_rowwise ? n : 0];
            if (bias)
                v += bias[n];
            if (gpre)
                v *= kiln_cpu_gelu_grad(gpre[(size_t)m * ldp + n]);
            float *o = &out[(size_t)m * ldo + n];
            *o = a->accumulate ? *o + v : v;
        }
    }
    if (a->pre) {
        KILN_ASSERT(ldc == N);
        struct kiln_gelu_args ga = {.out = a->out, .inp = a->pre, .N = M, .H = N};
        kiln_cpu_gelu_forward(ctx, &ga);
    }
    kiln_cpu_free(ctx, acc);
    kiln_cpu_free(ctx, A);
    kiln_cpu_free(ctx, B);
}

// dbias (N) [+]= column sums of x (M, N), each column's rows summed in order (as matmul_backward's dbias)
void kiln_cpu_bias_backward(void *ctx, const struct kiln_bias_back_args *a) {
    const float *x = a->x;
    float *db = a->dbias;
    int M = a->M, N = a->N, n_blocks = (N + 63) / 64;
#pragma omp parallel for num_threads(kiln_cpu_threads(ctx)) schedule(static) if (KILN_CPU_PAR((double)M * N))
    for (int bk = 0; bk < n_blocks; bk++) {
        int o0 = bk * 64, o1 = o0 + 64 < N ? o0 + 64 : N;
        float sum[64] = {0};
        for (int m = 0; m < M; m++)
            for (int o = o0; o < o1; o++)
                sum[o - o0] += x[(size_t)m * N + o];
        for (int o = o0; o < o1; o++)
            db[o] = a->assign ? sum[o - o0] : db[o] + sum[o - o0];
    }
}
