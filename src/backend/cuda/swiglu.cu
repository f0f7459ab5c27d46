// SwiGLU: out = silu(gate) * up, inp rows [gate (H) | up (H)], ld (inp) and ldd (dinp) elements apart (2H
// when dense, wider for the parallel block's fused projection). Bytes 6*N*H forward, 10*N*H backward.
#include "backend/cuda/common.cuh"

static __global__ void swiglu_forward_kernel(bf16 *out, const bf16 *inp, int ld, int N, int H) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * H)
        return;
    size_t n = i / H, h = i % H;
    float g = bf2f(inp[n * ld + h]), u = bf2f(inp[n * ld + H + h]);
    out[i] = f2bf(g / (1.0f + __expf(-g)) * u);
}

static __global__ void swiglu_backward_kernel(bf16 *dinp, int ldd, const bf16 *dout, const bf16 *inp, int ld,
                                              int N, int H) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * H)
        return;
    size_t n = i / H, h = i % H;
    float g = bf2f(inp[n * ld + h]), u = bf2f(inp[n * ld + H + h]), d = bf2f(dout[i]);
    float sg = 1.0f / (1.0f + __expf(-g));
    dinp[n * ldd + h] = f2bf(d * u * sg * (1.0f + g * (1.0f - sg)));
    dinp[n * ldd + H + h] = f2bf(d * g * sg);
}

extern "C" void kiln_cuda_swiglu_forward(void *ctx, const struct kiln_swiglu_args *a) {
    size_t n = (size_t)a->N * a->H;
    if (n == 0)
        return;
    int ld = a->inp_stride ? a->inp_stride : 2 * a->H;
    swiglu_forward_kernel<<<(unsigned)KILN_CEIL_DIV(n, 256), 256, 0, cuda_ctx_of(ctx)->stream>>>(
        (bf16 *)a->out, (const bf16 *)a->inp, ld, a->N, a->H);
    CUDA_CHECK_LAUNCH();
}

extern "C" void kiln_cuda_swiglu_backward(void *ctx, const struct kiln_swiglu_back_args *a) {
    size_t n = (size_t)a->N * a->H;
    if (n == 0)
        return;
    int ld = a->inp_stride ? a->inp_stride : 2 * a->H, ldd = a->dinp_stride ? a->dinp_stride : 2 * a->H;
    swiglu_backward_kernel<<<(unsigned)KILN_CEIL_DIV(n, 256), 256, 0, cuda_ctx_of(ctx)->stream>>>(
        (bf16 *)a->dinp, ldd, (const bf16 *)a->dout, (const bf16 *)a->inp, ld, a->N, a->H);
    CUDA_CHECK_LAUNCH();
}
