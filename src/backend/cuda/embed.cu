// Token + position embedding. Forward: out = wte[token] + wpe[t]. Bytes: 6*B*T*C; memory bound.
// Backward: dwte[token] += dout rows, dwpe[t] += sum over b. Deterministic without atomics: the host buckets
// the positions by token (it has the ids: tokens_host), and one block per (token, column range) sums its
// bucket's rows in position order. Bytes: 2*B*T*C read + 8*(distinct tokens)*C f32 rmw.
#include <string.h>

#include "backend/cuda/common.cuh"

static __global__ void embed_forward_kernel(bf16 *out, const int32_t *tokens, const bf16 *wte,
                                            const bf16 *wpe, int N, int T, int C, int vec) {
    int V = vec ? 8 : 1;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V; // element index in (N, C)
    if (i >= (size_t)N * C)
        return;
    int n = (int)(i / C), c = (int)(i % C), t = n % T;
    const bf16 *we = wte + (size_t)tokens[n] * C + c;
    const bf16 *pe = wpe ? wpe + (size_t)t * C + c : NULL;
    if (vec) {
        bf16x8 a, b, o;
        a.u = *(const uint4 *)we;
        if (pe)
            b.u = *(const uint4 *)pe;
        for (int k = 0; k < 8; k++)
            o.h[k] = f2bf(bf2f(a.h[k]) + (pe ? bf2f(b.h[k]) : 0.0f));
        *(uint4 *)(out + i) = o.u;
    } else {
        out[i] = f2bf(bf2f(*we) + (pe ? bf2f(*pe) : 0.0f));
    }
}

extern "C" void kiln_cuda_embed_forward(void *ctx, const struct kiln_embed_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    int N = a->B * a->T;
    if (N == 0)
        return;
    int vec = a->C % 8 == 0 && ((uintptr_t)a->out | (uintptr_t)a->wte | (uintptr_t)a->wpe) % 16 == 0;
    size_t threads = (size_t)N * a->C / (vec ? 8 : 1);
    embed_forward_kernel<<<(unsigned)KILN_CEIL_DIV(threads, 256), 256, 0, c->stream>>>(
        (bf16 *)a->out, a->tokens, (const bf16 *)a->wte, (const bf16 *)a->wpe, N, a->T, a->C, vec);
    CUDA_CHECK_LAUNCH();
}

// bucket k covers sorted positions [start[k], start[k+1]) of token tok[k]
static __global__ void embed_backward_wte_kernel(float *dwte, const bf16 *dout, const int32_t *start,
                                                 const int32_t *tok, const int32_t *pos, int C) {
    int k = blockIdx.x;
    int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= C)
        return;
    float s = 0.0f;
    for (int j = start[k]; j < start[k + 1]; j++)
        s += bf2f(dout[(size_t)pos[j] * C + col]);
    dwte[(size_t)tok[k] * C + col] += s;
}

static __global__ void embed_backward_wpe_kernel(float *dwpe, const bf16 *dout, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; // in (T, C)
    if (i >= (size_t)T * C)
        return;
    float s = 0.0f;
    for (int b = 0; b < B; b++)
        s += bf2f(dout[(size_t)b * T * C + i]);
    dwpe[i] += s;
}

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

extern "C" void kiln_cuda_embed_backward(void *ctx, const struct kiln_embed_back_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    int N = a->B * a->T;
    if (N == 0)
        return;
    if (a->dwpe) {
        size_t n = (size_t)a->T * a->C;
        embed_backward_wpe_kernel<<<(unsigned)KILN_CEIL_DIV(n, 256), 256, 0, c->stream>>>(
            (float *)a->dwpe, (const bf16 *)a->dout, a->B, a->T, a->C);
        CUDA_CHECK_LAUNCH();
    }
    // bucket positions by token on the host: key = token << 32 | position, sorted
    uint64_t *keys = (uint64_t *)kiln_xmalloc((size_t)N * sizeof(uint64_t));
    int32_t *ids = (int32_t *)a->tokens_host;
    int32_t *downloaded = NULL;
    if (!ids) {
        downloaded = (int32_t *)kiln_xmalloc((size_t)N * sizeof(int32_t));
        CUDA_CHECK(cudaMemcpyAsync(downloaded, a->tokens, (size_t)N * 4, cudaMemcpyDeviceToHost, c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        ids = downloaded;
    }
    for (int i = 0; i < N; i++)
        keys[i] = ((uint64_t)(uint32_t)ids[i] << 32) | (uint32_t)i;
    qsort(keys, (size_t)N, sizeof(uint64_t), cmp_u64);
    // layout in one int32 array: start (nb + 1) | tok (nb) | pos (N); nb <= N
    int32_t *h = (int32_t *)kiln_xmalloc(((size_t)3 * N + 1) * sizeof(int32_t));
    int32_t *hpos = h + 2 * N + 1;
    int nb = 0;
    int32_t *hstart = h, *htok = h + N + 1;
    for (int i = 0; i < N; i++) {
        int32_t t = (int32_t)(keys[i] >> 32);
        if (i == 0 || t != htok[nb - 1]) {
            htok[nb] = t;
            hstart[nb] = i;
            nb++;
        }
        hpos[i] = (int32_t)(keys[i] & 0xffffffffu);
    }
    hstart[nb] = N;
    int32_t *d = (int32_t *)kiln_cuda_scratch(c, SCR_EMBED, ((size_t)3 * N + 1) * sizeof(int32_t));
    CUDA_CHECK(
        cudaMemcpyAsync(d, h, ((size_t)3 * N + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream)); // h is freed below
    dim3 grid(nb, KILN_CEIL_DIV(a->C, 128));
    embed_backward_wte_kernel<<<grid, 128, 0, c->stream>>>((float *)a->dwte, (const bf16 *)a->dout, d,
                                                           d + N + 1, d + 2 * N + 1, a->C);
    CUDA_CHECK_LAUNCH();
    free(h);
    free(keys);
    free(downloaded);
}
