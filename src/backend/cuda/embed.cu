// Token + position embedding. Forward: out = wte[token] + wpe[t]. Bytes: 6*B*T*C; memory bound.
// Under sequence parallelism the positions are two runs (ops.h: pos_split): column t < split reads row t of
// wpe, column t >= split row t - split of wpe_hi; split = T (one run) is the plain case.
// Backward: dwte[token] += dout rows, dwpe[t] += sum over b. Deterministic without atomics and without the
// host: the positions are sorted by token on the device and each token's rows are summed in position order.
// Bytes: 2*B*T*C read + 8*(distinct tokens)*C gradient read-modify-write in f32, 4*(distinct tokens)*C in
// bf16 (a run's sum is formed in f32, added to the stored value and rounded once).
#include <string.h>

#include "backend/cuda/common.cuh"

static __global__ void embed_forward_kernel(bf16 *out, const int32_t *tokens, const bf16 *wte,
                                            const bf16 *wpe, const bf16 *wpe_hi, int split, int N, int T,
                                            int C, int vec, int vlo, int vn) {
    int V = vec ? 8 : 1;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V; // element index in (N, C)
    if (i >= (size_t)N * C)
        return;
    int n = (int)(i / C), c = (int)(i % C), t = n % T;
    int row = tokens[n] - vlo; // a vocabulary-parallel wte holds rows [vlo, vlo + vn): others read zeros
    const bf16 *we = vn > 0 && (row < 0 || row >= vn) ? NULL : wte + (size_t)row * C + c;
    const bf16 *pe = !wpe ? NULL : t < split ? wpe + (size_t)t * C + c : wpe_hi + (size_t)(t - split) * C + c;
    if (vec) {
        bf16x8 a, b, o;
        a.u = we ? *(const uint4 *)we : make_uint4(0, 0, 0, 0);
        if (pe)
            b.u = *(const uint4 *)pe;
        for (int k = 0; k < 8; k++)
            o.h[k] = f2bf(bf2f(a.h[k]) + (pe ? bf2f(b.h[k]) : 0.0f));
        *(uint4 *)(out + i) = o.u;
    } else {
        out[i] = f2bf((we ? bf2f(*we) : 0.0f) + (pe ? bf2f(*pe) : 0.0f));
    }
}

// The column where the second run of positions starts: T when there is one run (pos_split 0 or T)
static int pos_split(int split, int T) {
    return split > 0 && split < T ? split : T;
}

extern "C" void kiln_cuda_embed_forward(void *ctx, const struct kiln_embed_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    int N = a->B * a->T;
    if (N == 0)
        return;
    int split = pos_split(a->pos_split, a->T);
    const void *wpe_hi = split < a->T ? a->wpe_hi : NULL;
    KILN_ASSERT(!a->wpe || split == a->T || wpe_hi);
    int vec = a->C % 8 == 0 &&
              ((uintptr_t)a->out | (uintptr_t)a->wte | (uintptr_t)a->wpe | (uintptr_t)wpe_hi) % 16 == 0;
    size_t threads = (size_t)N * a->C / (vec ? 8 : 1);
    embed_forward_kernel<<<(unsigned)KILN_CEIL_DIV(threads, 256), 256, 0, c->stream>>>(
        (bf16 *)a->out, a->tokens, (const bf16 *)a->wte, (const bf16 *)a->wpe, (const bf16 *)wpe_hi, split, N,
        a->T, a->C, vec, a->vocab_n > 0 ? a->vocab_lo : 0, a->vocab_n);
    CUDA_CHECK_LAUNCH();
}

// ---- backward: deterministic, on the device
// ----------------------------------------------------------------- Keys token << 32 | position are sorted on
// the device (bitonic, padded to a power of two P with ~0), so each token's positions form one run in
// position order. The thread at the start of a run sums the run's dout rows (8 columns, 16-byte loads) in
// that order: the same sums, in the same order, as a host bucketing, without a host round trip or a stream
// synchronization. Cost at N = 32k: ~10 small launches (~30 us) plus one read of dout; a token occurring r
// times makes its run's threads walk r rows (the old per-bucket blocks did too).

#define EMB_CH 2048 // keys per block in the shared-memory stages (1024 threads, one pair each)

static __device__ __forceinline__ void bitonic_cas(uint64_t *a, uint64_t *b, int up) {
    uint64_t x = *a, y = *b;
    if ((x > y) == (up != 0)) {
        *a = y;
        *b = x;
    }
}

static __global__ void emb_keys_kernel(uint64_t *keys, const int32_t *tokens, int N, int P) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < P)
        keys[i] = i < N ? ((uint64_t)(uint32_t)tokens[i] << 32) | (uint32_t)i : ~(uint64_t)0;
}

// mode 0: sorts each chunk of cs keys bitonically for k = 2 .. cs (direction from the global index);
// mode 1: the steps j = cs/2 .. 1 of the merge at size k. cs = min(P, EMB_CH); blockDim = cs / 2.
static __global__ void emb_bitonic_local(uint64_t *keys, int cs, int mode, int k_merge) {
    __shared__ uint64_t sk[EMB_CH];
    int base = blockIdx.x * cs, t = threadIdx.x;
    sk[t] = keys[base + t];
    sk[t + cs / 2] = keys[base + t + cs / 2];
    __syncthreads();
    int k0 = mode == 0 ? 2 : k_merge, k1 = mode == 0 ? cs : k_merge;
    for (int k = k0; k <= k1; k <<= 1)
        for (int j = (mode == 0 ? k : cs) >> 1; j > 0; j >>= 1) {
            int i = 2 * j * (t / j) + t % j;
            bitonic_cas(&sk[i], &sk[i + j], ((base + i) & k) == 0);
            __syncthreads();
        }
    keys[base + t] = sk[t];
    keys[base + t + cs / 2] = sk[t + cs / 2];
}

// one step (k, j >= EMB_CH) of the merge over all P keys: thread t owns the pair (i, i + j)
static __global__ void emb_bitonic_global(uint64_t *keys, int P, int k, int j) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= P / 2)
        return;
    int i = 2 * j * (t / j) + t % j;
    bitonic_cas(&keys[i], &keys[i + j], (i & k) == 0);
}

// thread (i, column chunk c): if sorted key i starts a run, dwte[token] += sum of the run's rows, in order
template <typename G>
static __global__ void emb_runs_kernel(G *dwte, const bf16 *dout, const uint64_t *keys, int N, int C,
                                       int vec, int vlo, int vn) {
    int V = vec ? 8 : 1, nc = C / V;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * nc)
        return;
    int i = (int)(idx / nc), c = (int)(idx % nc) * V;
    uint32_t tok = (uint32_t)(keys[i] >> 32);
    if (i > 0 && (uint32_t)(keys[i - 1] >> 32) == tok)
        return;
    if (vn > 0 && ((int)tok < vlo || (int)tok >= vlo + vn)) // a row this rank's vocabulary slice does not hold
        return;
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int r = i; r < N && (uint32_t)(keys[r] >> 32) == tok; r++) {
        const bf16 *row = dout + (size_t)(uint32_t)keys[r] * C + c;
        if (vec) {
            bf16x8 v;
            v.u = *(const uint4 *)row;
#pragma unroll
            for (int k = 0; k < 8; k++)
                s[k] += bf2f(v.h[k]);
        } else {
            s[0] += bf2f(*row);
        }
    }
    G *d = dwte + (size_t)((int)tok - (vn > 0 ? vlo : 0)) * C + c;
    for (int k = 0; k < V; k++)
        grad_store(d + k, grad_load(d + k) + s[k]);
}

template <typename G>
static __global__ void embed_backward_wpe_kernel(G *dwpe, G *dwpe_hi, int split, const bf16 *dout, int B,
                                                 int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; // in (T, C)
    if (i >= (size_t)T * C)
        return;
    float s = 0.0f;
    for (int b = 0; b < B; b++)
        s += bf2f(dout[(size_t)b * T * C + i]);
    G *d = i < (size_t)split * C ? dwpe + i : dwpe_hi + (i - (size_t)split * C);
    grad_store(d, grad_load(d) + s);
}

// dwpe (grad dtype) += sum over b of dout; from column split on, dwpe_hi
static void embed_backward_wpe(struct cuda_ctx *c, void *dwpe, void *dwpe_hi, int split, const bf16 *dout,
                               int B, int T, int C) {
    size_t n = (size_t)T * C;
    unsigned grid = (unsigned)KILN_CEIL_DIV(n, 256);
    if (c->grad_dtype == KILN_BF16)
        embed_backward_wpe_kernel<<<grid, 256, 0, c->stream>>>((bf16 *)dwpe, (bf16 *)dwpe_hi, split, dout, B,
                                                               T, C);
    else
        embed_backward_wpe_kernel<<<grid, 256, 0, c->stream>>>((float *)dwpe, (float *)dwpe_hi, split, dout,
                                                               B, T, C);
    CUDA_CHECK_LAUNCH();
}

// dwte (grad dtype) += the runs of sorted keys
static void embed_backward_runs(struct cuda_ctx *c, void *dwte, const bf16 *dout, const uint64_t *keys, int N,
                                int C, int vlo, int vn) {
    int vec = C % 8 == 0 && ((uintptr_t)dout % 16) == 0;
    size_t threads = (size_t)N * (C / (vec ? 8 : 1));
    unsigned grid = (unsigned)KILN_CEIL_DIV(threads, 256);
    if (c->grad_dtype == KILN_BF16)
        emb_runs_kernel<<<grid, 256, 0, c->stream>>>((bf16 *)dwte, dout, keys, N, C, vec, vlo, vn);
    else
        emb_runs_kernel<<<grid, 256, 0, c->stream>>>((float *)dwte, dout, keys, N, C, vec, vlo, vn);
    CUDA_CHECK_LAUNCH();
}

extern "C" void kiln_cuda_embed_backward(void *ctx, const struct kiln_embed_back_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    int N = a->B * a->T;
    if (N == 0)
        return;
    if (a->dwpe) {
        int split = pos_split(a->pos_split, a->T);
        KILN_ASSERT(split == a->T || a->dwpe_hi);
        embed_backward_wpe(c, a->dwpe, a->dwpe_hi, split, (const bf16 *)a->dout, a->B, a->T, a->C);
    }
    KILN_ASSERT(N <= (1 << 30));
    int P = 2;
    while (P < N)
        P <<= 1;
    uint64_t *keys = (uint64_t *)kiln_cuda_scratch(c, SCR_EMBED, (size_t)P * sizeof(uint64_t));
    emb_keys_kernel<<<KILN_CEIL_DIV(P, 256), 256, 0, c->stream>>>(keys, a->tokens, N, P);
    CUDA_CHECK_LAUNCH();
    int cs = P < EMB_CH ? P : EMB_CH;
    emb_bitonic_local<<<P / cs, cs / 2, 0, c->stream>>>(keys, cs, 0, 0);
    CUDA_CHECK_LAUNCH();
    for (int k = 2 * cs; k <= P; k <<= 1) {
        for (int j = k >> 1; j >= cs; j >>= 1) {
            emb_bitonic_global<<<KILN_CEIL_DIV(P / 2, 256), 256, 0, c->stream>>>(keys, P, k, j);
            CUDA_CHECK_LAUNCH();
        }
        emb_bitonic_local<<<P / cs, cs / 2, 0, c->stream>>>(keys, cs, 1, k);
        CUDA_CHECK_LAUNCH();
    }
    embed_backward_runs(c, a->dwte, (const bf16 *)a->dout, keys, N, a->C, a->vocab_n > 0 ? a->vocab_lo : 0,
                        a->vocab_n);
}
