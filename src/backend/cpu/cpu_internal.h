// The CPU backend's private interface: its context and the op functions each file defines.
// The CPU backend is the numerical reference (docs/architecture.md): fp32, OpenMP, and deterministic
// independently of the thread count: every output element is computed by exactly one thread, and every
// reduction runs in a fixed order (no atomics, no scheduling-dependent reductions).
#ifndef KILN_BACKEND_CPU_INTERNAL_H
#define KILN_BACKEND_CPU_INTERNAL_H

#include "core/ops.h"

#include <stddef.h>
#include <stdint.h>

// GEMM blocking (see matmul.c). Fixed constants: the blocking decides the summation order, so it must not
// depend on the thread count.
#define KILN_CPU_MR 6    // micro-tile rows
#define KILN_CPU_NR 16   // micro-tile columns (two AVX2 vectors)
#define KILN_CPU_KC 256  // depth of one packed panel
#define KILN_CPU_MB 768  // rows of A packed at once (multiple of MR)
#define KILN_CPU_NC 2048 // columns of B packed at once (multiple of NR)

struct kiln_cpu_ctx {
    int threads;  // OpenMP threads used by every parallel region
    float *apack; // (KILN_CPU_MB * KILN_CPU_KC) packed A block
    float *bpack; // (KILN_CPU_KC * KILN_CPU_NC) packed B panel
    size_t mem_now, mem_peak; // bytes held in alloc'd blocks (kiln_cpu_alloc with this context), and the most
};

static inline int kiln_cpu_threads(void *ctx) {
    return ((struct kiln_cpu_ctx *)ctx)->threads;
}

// a . b in 8 lanes (head sizes are multiples of 8 in practice; a tail is added last): the compiler makes one
// vector FMA of each step, where one running sum is a chain of dependent scalar FMAs (attention's dot
// products were most of a shakespeare-char step). The lanes are summed in a fixed order. attention.c and
// attention_block.c both score with it, so that the ring's blocks do the whole sequence's arithmetic.
static inline float kiln_cpu_dot(const float *a, const float *b, int n) {
    float lane[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += a[i + j] * b[i + j];
    float s = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

// exp(x) for the softmax's x <= 0 (a score less its row's maximum or log-sum-exp), in plain float operations
// that gcc vectorizes (8 lanes under AVX2) where libm's expf is a call per element: the attention's softmax
// spent a quarter of its time in expf. x = n ln2 + r with n = round(x / ln2) (by the 1.5 * 2^23 trick) and
// |r| <= ln2 / 2 (ln2 in two parts, Cody-Waite); e^r by Cephes' degree-6 minimax polynomial; 2^n from its
// exponent bits. Within 2 ulp of e^x over [-87, 0] (1 ulp at most over 2e7 points, as libm's expf); x below
// -87.3 (e^x under FLT_MIN, -inf included) gives 0. The same operations in the same order in every lane and in
// scalar code: results do not depend on whether or how the loop was vectorized (ISO C: no FMA contraction).
static inline float kiln_cpu_exp_neg(float x) {
    const float lo = -87.33654f;       // ln(FLT_MIN): 2^n below stays a normal number
    float keep = x < lo ? 0.0f : 1.0f; // a NaN keeps its NaN
    x = x < lo ? lo : x;
    float t = x * 1.44269504088896341f + 12582912.0f; // n = round(x / ln2) in t's low mantissa bits (1.5 * 2^23)
    float n = t - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union {
        float f;
        uint32_t u;
    } tb = {.f = t}, two_n;
    two_n.u = (tb.u - 0x4B400000u + 127u) << 23; // 2^n: n's biased exponent, no float-to-int conversion
    return p * two_n.f * keep;
}

// x[i] = e^(x[i] - shift) for i < n, where every x[i] <= shift (kiln_cpu_exp_neg)
void kiln_cpu_exp_shifted(float *x, int n, float shift);

// Parallel regions only pay off above some work (and spinning threads hurt a loaded machine): regions use
// `if (KILN_CPU_PAR(work))` with work ~ the number of element operations. The result is the same either way.
#define KILN_CPU_PAR(work) ((double)(work) >= 65536.0)

// C (M, N) = or += A (M, K) @ B (K, N), where A(i, k) = ta ? A[k*lda + i] : A[i*lda + k] and
// B(k, j) = tb ? B[j*ldb + k] : B[k*ldb + j]. Row-major C with leading dimension ldc.
struct kiln_cpu_gemm {
    int M, N, K;
    const float *A;
    int lda, ta;
    const float *B;
    int ldb, tb;
    float *C;
    int ldc;
    int accumulate;
};
void kiln_cpu_gemm(struct kiln_cpu_ctx *ctx, const struct kiln_cpu_gemm *g);
// The same product on the calling thread alone, inside another parallel region: apack holds
// KILN_CPU_MB x KILN_CPU_KC floats and bpack KILN_CPU_KC x KILN_CPU_NC, both 64-byte aligned, the caller's
// own. Each element's arithmetic is kiln_cpu_gemm's.
void kiln_cpu_gemm_serial(const struct kiln_cpu_gemm *g, float *apack, float *bpack);

// 64-byte aligned, zero-filled host memory; NULL on failure.
void *kiln_cpu_alloc(void *ctx, size_t bytes);
void kiln_cpu_free(void *ctx, void *p);
size_t kiln_cpu_mem_peak(void *ctx);
void kiln_cpu_zero(void *ctx, void *p, size_t bytes);
void kiln_cpu_copy(void *ctx, void *dst, const void *src, size_t bytes);
void kiln_cpu_copy_async(void *ctx, void *dst, const void *src, size_t bytes, void *done);
void kiln_cpu_copy_2d(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                      size_t rows);
void kiln_cpu_upload(void *ctx, void *dst, const void *host_src, size_t bytes);
void kiln_cpu_download(void *ctx, void *host_dst, const void *src, size_t bytes);
void kiln_cpu_upload_f32(void *ctx, void *dst, enum kiln_dtype dt, const float *host_src, size_t n);
void kiln_cpu_download_f32(void *ctx, float *host_dst, const void *src, enum kiln_dtype dt, size_t n);
void kiln_cpu_synchronize(void *ctx);

void kiln_cpu_embed_forward(void *ctx, const struct kiln_embed_args *a);
void kiln_cpu_embed_backward(void *ctx, const struct kiln_embed_back_args *a);
void kiln_cpu_norm_forward(void *ctx, const struct kiln_norm_args *a);
void kiln_cpu_norm_backward(void *ctx, const struct kiln_norm_back_args *a);
void kiln_cpu_matmul_forward(void *ctx, const struct kiln_matmul_args *a);
void kiln_cpu_matmul_backward(void *ctx, const struct kiln_matmul_back_args *a);
void kiln_cpu_attention_forward(void *ctx, const struct kiln_attn_args *a);
void kiln_cpu_attention_backward(void *ctx, const struct kiln_attn_back_args *a);
void kiln_cpu_attention_decode(void *ctx, const struct kiln_attn_decode_args *a);
void kiln_cpu_attention_block_forward(void *ctx, const struct kiln_attn_block_args *a);
void kiln_cpu_attention_block_backward(void *ctx, const struct kiln_attn_block_back_args *a);
// cos/sin of the RoPE angles at position t (HS/2 each), computed once for every op that rotates
void kiln_cpu_rope_angles(int t, int HS, float theta, float *cos_out, float *sin_out);
// Rotates the pairs (x[i], x[i + HS/2]) by those angles (inverse: by minus them, mapping a gradient in the
// rotated frame back)
void kiln_cpu_rope_apply(float *x, int HS, const float *c, const float *s, int inverse);
void kiln_cpu_swiglu_forward(void *ctx, const struct kiln_swiglu_args *a);
void kiln_cpu_swiglu_backward(void *ctx, const struct kiln_swiglu_back_args *a);
void kiln_cpu_gelu_forward(void *ctx, const struct kiln_gelu_args *a);
void kiln_cpu_add(void *ctx, void *out, const void *a, const void *b, size_t n);
void kiln_cpu_cross_entropy(void *ctx, const struct kiln_xent_args *a);
void kiln_cpu_cross_entropy_parallel(void *ctx, const struct kiln_xent_par_args *a);
double kiln_cpu_sum_squares(void *ctx, const void *grads, size_t n);
void kiln_cpu_accumulate_f32(void *ctx, float *out, const float *x, size_t n);
void kiln_cpu_adamw(void *ctx, const struct kiln_adamw_args *a);

// FP8 (fp8.c): the ops, and one value each way, exactly as the hardware's saturating conversion rounds
void kiln_cpu_amax(void *ctx, const struct kiln_amax_args *a);
void kiln_cpu_fp8_cast(void *ctx, const struct kiln_fp8_cast_args *a);
void kiln_cpu_fp8_transpose(void *ctx, uint8_t *out, const uint8_t *in, int rows, int cols);
void kiln_cpu_fp8_matmul(void *ctx, const struct kiln_fp8_matmul_args *a);
void kiln_cpu_bias_backward(void *ctx, const struct kiln_bias_back_args *a);
uint8_t kiln_fp8_encode(float x, enum kiln_fp8_fmt fmt);
float kiln_fp8_decode(uint8_t c, enum kiln_fp8_fmt fmt);
// gelu'(x) of the GELU the matmul epilogue applies (matmul.c)
float kiln_cpu_gelu_grad(float x);

// ALiBi slope of query head h of NH (the ALiBi paper's construction), exposed for the tests.
float kiln_cpu_alibi_slope(int h, int NH);

// f32 <-> bf16 (round to nearest even; NaN stays NaN).
uint16_t kiln_f32_to_bf16(float x);
float kiln_bf16_to_f32(uint16_t h);

#endif
