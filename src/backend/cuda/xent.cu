// Fused classifier: softmax + cross-entropy (+ z-loss) over bf16 logits, writing dL/dlogits in place. One
// block per row; no fp32 probability buffer. FLOPs ~5*Vp (exp): memory bound.
// Rows of up to 64k logits (GPT-2's 50304) are read once into registers (16 16-byte chunks per thread), then
// the gradient is written from them: 2*Vp read + 2*Vp write bytes per row (N=32k, Vp=50304: 6.6 GB -> ~2.2 ms
// at 3 TB/s). Wider rows take two passes over memory (online max/sum, then re-read for the gradient): 6*Vp.
// The H100 profile of the two-pass kernel at GPT-2 350M (N=16k): 1.64 ms a step, 3 passes' worth.
//   losses[i] = lse_i - x_i[t_i] + z * lse_i^2
//   dlogits_ij = dloss * ((1 + 2 z lse_i) * softmax_ij - [j == t_i]), padded columns j >= V get 0.
#include "backend/cuda/common.cuh"

#define XENT_THREADS 512

// one logit into a thread's running (max, sum of exp(v - max))
static __device__ __forceinline__ void online_add(float v, float &m, float &s) {
    if (v > m) {
        s = s * __expf(m - v) + 1.0f;
        m = v;
    } else {
        s += __expf(v - m);
    }
}

// The row's log-sum-exp from every thread's (m, s); thread 0 stores the loss.
static __device__ __forceinline__ float row_lse(float m, float s, float xt, int t, float z_loss, float *loss,
                                                float *sh) {
    float M = block_max(m, sh);
    float S = block_sum(m == -INFINITY ? 0.0f : s * __expf(m - M), sh);
    float lse = M + __logf(S);
    if (threadIdx.x == 0)
        *loss = t >= 0 ? lse - xt + z_loss * lse * lse : 0.0f;
    return lse;
}

// dL/dlogit j of a row with target t (0 for padded columns and ignored rows). Takes the bf16 logit and
// converts it only where needed: with a float argument, ptxas spilled the one-pass kernel's registers.
static __device__ __forceinline__ float dlogit(bf16 x, int j, int t, int V, float lse, float scale, float dloss) {
    return (t < 0 || j >= V) ? 0.0f : scale * __expf(bf2f(x) - lse) - (j == t ? dloss : 0.0f);
}


template <int VEC>
static __global__ void __launch_bounds__(XENT_THREADS)
    xent_kernel(bf16 *logits, float *losses, const int32_t *targets, int V, int Vp, float dloss,
                float z_loss) {
    __shared__ float sh[32];
    int row = blockIdx.x;
    bf16 *x = logits + (size_t)row * Vp;
    int t = targets[row];
    // pass 1: per-thread online (max, sum of exp)
    float m = -INFINITY, s = 0.0f;
    for (int j0 = threadIdx.x * VEC; j0 < V; j0 += XENT_THREADS * VEC) {
        float v[VEC];
        if (VEC == 8) {
            bf16x8 u;
            u.u = *(const uint4 *)(x + j0);
            for (int k = 0; k < 8; k++)
                v[k] = bf2f(u.h[k]);
        } else {
            v[0] = bf2f(x[j0]);
        }
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (j0 + k < V)
                online_add(v[k], m, s);
    }
    float xt = (t >= 0 && t < V) ? bf2f(x[t]) : 0.0f; // read before any thread overwrites the row
    float lse = row_lse(m, s, xt, t, z_loss, losses + row, sh);
    if (dloss == 0.0f)
        return;
    __syncthreads(); // every thread read x[t] before the reductions: the row may be overwritten now
    float scale = dloss * (1.0f + 2.0f * z_loss * lse);
    for (int j0 = threadIdx.x * VEC; j0 < Vp; j0 += XENT_THREADS * VEC) {
        float v[VEC];
        if (VEC == 8) {
            bf16x8 u;
            u.u = *(const uint4 *)(x + j0);
            for (int k = 0; k < 8; k++)
                v[k] = bf2f(u.h[k]);
        } else {
            v[0] = bf2f(x[j0]);
        }
        float d[VEC];
#pragma unroll
        for (int k = 0; k < VEC; k++)
            d[k] = dlogit(f2bf(v[k]), j0 + k, t, V, lse, scale, dloss); // v[k] came from bf16: exact
        if (VEC == 8) {
            bf16x8 u;
            for (int k = 0; k < 8; k++)
                u.h[k] = f2bf(d[k]);
            *(uint4 *)(x + j0) = u.u;
        } else {
            x[j0] = f2bf(d[0]);
        }
    }
}

// One pass over memory: thread i holds chunks i, i + XENT_THREADS, ... (8 logits each) of the row in registers.
#define XENT_CHUNKS 16
static __global__ void __launch_bounds__(XENT_THREADS, 1)
    xent_reg_kernel(bf16 *logits, float *losses, const int32_t *targets, int V, int Vp, float dloss,
                    float z_loss) {
    __shared__ float sh[32];
    int row = blockIdx.x;
    bf16 *x = logits + (size_t)row * Vp;
    int t = targets[row];
    bf16x8 r[XENT_CHUNKS];
#pragma unroll
    for (int i = 0; i < XENT_CHUNKS; i++) {
        int j0 = (i * XENT_THREADS + threadIdx.x) * 8;
        if (j0 < Vp)
            r[i].u = *(const uint4 *)(x + j0);
    }
    float xt = (t >= 0 && t < V) ? bf2f(x[t]) : 0.0f;
    float m = -INFINITY, s = 0.0f;
#pragma unroll
    for (int i = 0; i < XENT_CHUNKS; i++) {
        int j0 = (i * XENT_THREADS + threadIdx.x) * 8;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            if (j0 + k >= V)
                break;
            online_add(bf2f(r[i].h[k]), m, s);
        }
    }
    float lse = row_lse(m, s, xt, t, z_loss, losses + row, sh);
    if (dloss == 0.0f)
        return;
    __syncthreads(); // every thread read x[t] before the reductions: the row may be overwritten now
    float scale = dloss * (1.0f + 2.0f * z_loss * lse);
#pragma unroll
    for (int i = 0; i < XENT_CHUNKS; i++) {
        int j0 = (i * XENT_THREADS + threadIdx.x) * 8;
        if (j0 >= Vp)
            break;
        bf16x8 u;
#pragma unroll
        for (int k = 0; k < 8; k++)
            u.h[k] = f2bf(dlogit(r[i].h[k], j0 + k, t, V, lse, scale, dloss));
        *(uint4 *)(x + j0) = u.u;
    }
}

extern "C" void kiln_cuda_cross_entropy(void *ctx, const struct kiln_xent_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (a->N == 0)
        return;
    KILN_ASSERT(a->V <= a->Vp);
    int vec = a->Vp % 8 == 0 && (uintptr_t)a->logits % 16 == 0;
    if (vec && a->Vp <= XENT_CHUNKS * XENT_THREADS * 8)
        xent_reg_kernel<<<a->N, XENT_THREADS, 0, c->stream>>>((bf16 *)a->logits, a->losses, a->targets, a->V, a->Vp,
                                                           a->dloss, a->z_loss);
    else if (vec)
        xent_kernel<8><<<a->N, XENT_THREADS, 0, c->stream>>>((bf16 *)a->logits, a->losses, a->targets, a->V,
                                                             a->Vp, a->dloss, a->z_loss);
    else
        xent_kernel<1><<<a->N, XENT_THREADS, 0, c->stream>>>((bf16 *)a->logits, a->losses, a->targets, a->V,
                                                             a->Vp, a->dloss, a->z_loss);
    CUDA_CHECK_LAUNCH();
}

// The vocabulary-parallel loss's phases (ops.h: struct kiln_xent_par_args): one block per row, over this
// rank's nreal real columns (of Vl). Two passes over the row's bf16 logits and one write: the rank's share of
// the whole loss's traffic, plus three (N) f32 reductions across the ranks between the phases.
static __global__ void __launch_bounds__(XENT_THREADS)
    xent_par_kernel(bf16 *logits, float *losses, const int32_t *targets, float *stats, int N, int Vl, int v0,
                    int nreal, int phase, float dloss, float z_loss) {
    __shared__ float sh[32];
    int row = blockIdx.x;
    bf16 *x = logits + (size_t)row * Vl;
    int t = targets[row], tj = t - v0;
    float *mx = stats, *sum = stats + N, *tl = stats + 2 * (size_t)N;
    if (phase == 0) {
        float m = -INFINITY;
        for (int j = threadIdx.x; j < nreal; j += XENT_THREADS)
            m = fmaxf(m, bf2f(x[j]));
        m = block_max(m, sh);
        if (threadIdx.x == 0) {
            mx[row] = m;
            tl[row] = t >= 0 && tj >= 0 && tj < nreal ? bf2f(x[tj]) : 0.0f;
        }
    } else if (phase == 1) {
        float M = mx[row], s = 0.0f;
        for (int j = threadIdx.x; j < nreal; j += XENT_THREADS)
            s += __expf(bf2f(x[j]) - M);
        s = block_sum(s, sh);
        if (threadIdx.x == 0)
            sum[row] = s;
    } else {
        float lse = mx[row] + __logf(sum[row]);
        if (threadIdx.x == 0)
            losses[row] = t >= 0 ? lse - tl[row] + z_loss * lse * lse : 0.0f;
        if (dloss == 0.0f)
            return;
        float scale = dloss * (1.0f + 2.0f * z_loss * lse);
        for (int j = threadIdx.x; j < Vl; j += XENT_THREADS)
            x[j] = f2bf(t < 0 || j >= nreal ? 0.0f : scale * __expf(bf2f(x[j]) - lse) - (j == tj ? dloss : 0.0f));
    }
}

extern "C" void kiln_cuda_cross_entropy_parallel(void *ctx, const struct kiln_xent_par_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (a->N == 0)
        return;
    int nreal = a->V - a->v0;
    nreal = nreal < 0 ? 0 : nreal > a->Vl ? a->Vl : nreal;
    xent_par_kernel<<<a->N, XENT_THREADS, 0, c->stream>>>((bf16 *)a->logits, a->losses, a->targets, a->stats,
                                                          a->N, a->Vl, a->v0, nreal, a->phase, a->dloss,
                                                          a->z_loss);
    CUDA_CHECK_LAUNCH();
}
