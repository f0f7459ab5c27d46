// LayerNorm / RMSNorm, forward with the residual add fused, backward yielding dinp, dweight and dbias, and the
// column sums of dinp for the residual-stream biases (dres_bias).
//
// Forward: one warp per row, fp32 statistics. C <= 2048 (C % 8 == 0): the row arrives in shared memory by
//   cp.async (every chunk of a lane in flight at once) and the three passes read it there; other C: 16-byte
//   (or scalar) loads, the passes re-reading through L1.
//   Bytes: 2*N*C (inp) [+ 2*N*C res_in + 2*N*C res_out] + 2*N*C out; FLOPs ~8*N*C: memory bound, floor
//   = bytes / 3 TB/s (GPT-2 350M, N=16k, C=1024, fused: 134 MB -> ~45 us; H100: 44.5 us).
// Backward, C <= 2048 (C % 8 == 0): the tile kernel (comment at norm_backward_tile_kernel): warp per row for
//   dinp, then threads owning 8 columns for the column sums, through shared memory; one partial row per block
//   and plane, added in block order by colsum_reduce_kernel. Bytes: 2*N*C*2 (dout, x) + 2*N*C*2 (dinp
//   read-modify-write) = 8*N*C (350M: 134 MB -> ~45 us; H100: 56 us, 50 us at 1.5B's C = 1600 and N = 8k).
//   Wider rows: one warp per row with per-warp column slices in shared memory (norm_backward_wide_kernel),
//   dres_bias then a second pass. Other shapes: a row kernel for dinp, then column partials and the reduce.
//   Every path is bitwise deterministic for a given shape and device.
#include "backend/cuda/common.cuh"

template <int V> static __device__ __forceinline__ void ldv(const bf16 *p, float *f) {
    if (V == 8) {
        bf16x8 v;
        v.u = *(const uint4 *)p;
#pragma unroll
        for (int k = 0; k < 8; k++)
            f[k] = bf2f(v.h[k]);
    } else {
        f[0] = bf2f(p[0]);
    }
}
template <int V> static __device__ __forceinline__ void stv(bf16 *p, const float *f) {
    if (V == 8) {
        bf16x8 v;
#pragma unroll
        for (int k = 0; k < 8; k++)
            v.h[k] = f2bf(f[k]);
        *(uint4 *)p = v.u;
    } else {
        p[0] = f2bf(f[0]);
    }
}

// x = inp (+ res_in, rounded to bf16 as res_out stores it)
template <int V>
static __device__ __forceinline__ void load_x(const bf16 *inp, const bf16 *res, size_t off, float *x) {
    ldv<V>(inp + off, x);
    if (res) {
        float r[V];
        ldv<V>(res + off, r);
#pragma unroll
        for (int k = 0; k < V; k++)
            x[k] = bf2f(f2bf(x[k] + r[k]));
    }
}

template <int V>
static __global__ void norm_forward_kernel(bf16 *out, float *mean_out, float *rstd_out, bf16 *res_out,
                                           const bf16 *inp, const bf16 *res_in, const bf16 *weight,
                                           const bf16 *bias, int N, int C, int ld, int rms, float eps) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N)
        return; // whole warps exit together: no block-level barrier below
    size_t base = (size_t)row * ld;
    float s = 0.0f;
    for (int i = lane * V; i < C; i += 32 * V) {
        float x[V];
        load_x<V>(inp, res_in, base + i, x);
        if (res_out)
            stv<V>(res_out + base + i, x);
#pragma unroll
        for (int k = 0; k < V; k++)
            s += rms ? x[k] * x[k] : x[k];
    }
    s = warp_sum(s);
    float mean = 0.0f, rstd;
    if (rms) {
        rstd = rsqrtf(s / C + eps);
    } else {
        mean = s / C;
        float v = 0.0f; // second pass: numerically safer than E[x^2] - mean^2
        for (int i = lane * V; i < C; i += 32 * V) {
            float x[V];
            load_x<V>(inp, res_in, base + i, x);
#pragma unroll
            for (int k = 0; k < V; k++)
                v += (x[k] - mean) * (x[k] - mean);
        }
        v = warp_sum(v);
        rstd = rsqrtf(v / C + eps);
    }
    for (int i = lane * V; i < C; i += 32 * V) {
        float x[V], w[V], b[V], o[V];
        load_x<V>(inp, res_in, base + i, x);
        ldv<V>(weight + i, w);
        if (bias)
            ldv<V>(bias + i, b);
#pragma unroll
        for (int k = 0; k < V; k++)
            o[k] = (x[k] - mean) * rstd * w[k] + (bias ? b[k] : 0.0f);
        stv<V>(out + base + i, o);
    }
    if (lane == 0) {
        if (mean_out)
            mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

// The forward for C <= 2048 (C % 8 == 0, 16-byte aligned rows): as norm_forward_kernel<8>, but each warp's
// row (inp, res_in) arrives in shared memory by cp.async, all of a lane's chunks in flight at once, and the
// three passes (sum, variance, output) read it from there instead of from L1/L2.
static __global__ void __launch_bounds__(256)
    norm_forward_tile_kernel(bf16 *out, float *mean_out, float *rstd_out, bf16 *res_out, const bf16 *inp,
                             const bf16 *res_in, const bf16 *weight, const bf16 *bias, int N, int C, int ld,
                             int rms, float eps) {
    extern __shared__ float4 smem4[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= N)
        return; // whole warps exit together: no block-level barrier below
    bf16 *sx = (bf16 *)smem4 + (size_t)warp * 2 * C, *sr = sx + C;
    size_t base = (size_t)row * ld;
    for (int i = lane * 8; i < C; i += 256) {
        cp_async16(sx + i, inp + base + i, 1);
        if (res_in)
            cp_async16(sr + i, res_in + base + i, 1);
    }
    cp_async_commit();
    cp_async_wait<0>(); // a lane reads back only the chunks it copied
    float s = 0.0f;
    for (int i = lane * 8; i < C; i += 256) {
        float x[8];
        ldv<8>(sx + i, x);
        if (res_in) {
            float r[8];
            ldv<8>(sr + i, r);
#pragma unroll
            for (int k = 0; k < 8; k++)
                x[k] = x[k] + r[k];
            stv<8>(sx + i, x); // x rounded to bf16, as res_out stores it
            ldv<8>(sx + i, x);
        }
        if (res_out)
            stv<8>(res_out + base + i, x);
#pragma unroll
        for (int k = 0; k < 8; k++)
            s += rms ? x[k] * x[k] : x[k];
    }
    s = warp_sum(s);
    float mean = 0.0f, rstd;
    if (rms) {
        rstd = rsqrtf(s / C + eps);
    } else {
        mean = s / C;
        float v = 0.0f; // second pass: numerically safer than E[x^2] - mean^2
        for (int i = lane * 8; i < C; i += 256) {
            float x[8];
            ldv<8>(sx + i, x);
#pragma unroll
            for (int k = 0; k < 8; k++)
                v += (x[k] - mean) * (x[k] - mean);
        }
        v = warp_sum(v);
        rstd = rsqrtf(v / C + eps);
    }
    for (int i = lane * 8; i < C; i += 256) {
        float x[8], w[8], b[8], o[8];
        ldv<8>(sx + i, x);
        ldv<8>(weight + i, w);
        if (bias)
            ldv<8>(bias + i, b);
#pragma unroll
        for (int k = 0; k < 8; k++)
            o[k] = (x[k] - mean) * rstd * w[k] + (bias ? b[k] : 0.0f);
        stv<8>(out + base + i, o);
    }
    if (lane == 0) {
        if (mean_out)
            mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

extern "C" void kiln_cuda_norm_forward(void *ctx, const struct kiln_norm_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (a->N == 0)
        return;
    KILN_ASSERT(a->rms || a->mean);
    int ld = a->stride ? a->stride : a->C; // row stride
    int vec = a->C % 8 == 0 && ld % 8 == 0 && ((uintptr_t)a->out | (uintptr_t)a->inp | (uintptr_t)a->res_in |
                                (uintptr_t)a->res_out | (uintptr_t)a->weight | (uintptr_t)a->bias) %
                                       16 ==
                                   0;
    int rows_per_block = 8;
    unsigned grid = KILN_CEIL_DIV(a->N, rows_per_block);
    float *mean = a->rms ? NULL : a->mean;
    if (vec && a->C <= 2048) {
        size_t smem = (size_t)rows_per_block * 2 * a->C * sizeof(bf16);
        static size_t smem_set = 0; // the opt-in above 48 KiB is per function, process-wide
        if (smem > 48 << 10 && smem > smem_set) {
            CUDA_CHECK(cudaFuncSetAttribute(norm_forward_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)smem));
            smem_set = smem;
        }
        norm_forward_tile_kernel<<<grid, 32 * rows_per_block, smem, c->stream>>>(
            (bf16 *)a->out, mean, a->rstd, (bf16 *)a->res_out, (const bf16 *)a->inp, (const bf16 *)a->res_in,
            (const bf16 *)a->weight, (const bf16 *)a->bias, a->N, a->C, ld, a->rms, a->eps);
    } else if (vec)
        norm_forward_kernel<8><<<grid, 32 * rows_per_block, 0, c->stream>>>(
            (bf16 *)a->out, mean, a->rstd, (bf16 *)a->res_out, (const bf16 *)a->inp, (const bf16 *)a->res_in,
            (const bf16 *)a->weight, (const bf16 *)a->bias, a->N, a->C, ld, a->rms, a->eps);
    else
        norm_forward_kernel<1><<<grid, 32 * rows_per_block, 0, c->stream>>>(
            (bf16 *)a->out, mean, a->rstd, (bf16 *)a->res_out, (const bf16 *)a->inp, (const bf16 *)a->res_in,
            (const bf16 *)a->weight, (const bf16 *)a->bias, a->N, a->C, ld, a->rms, a->eps);
    CUDA_CHECK_LAUNCH();
}

// The two row means the backward needs, over one row (d, x: global or shared memory) by one warp:
// *m_dn = mean(dn) (0 for RMSNorm) and *m_dnx = mean(dn * xhat), dn = dout * weight. V columns a lane in turn.
template <int V>
static __device__ __forceinline__ void row_means(const bf16 *d_row, const bf16 *x_row, const bf16 *weight, int C,
                                                 float mean, float rstd, int rms, float *m_dn, float *m_dnx) {
    int lane = threadIdx.x & 31;
    float s_dn = 0.0f, s_dnx = 0.0f;
    for (int i = lane * V; i < C; i += 32 * V) {
        float d[V], x[V], w[V];
        ldv<V>(d_row + i, d);
        ldv<V>(x_row + i, x);
        ldv<V>(weight + i, w);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float dn = d[k] * w[k];
            s_dn += dn;
            s_dnx += dn * (x[k] - mean) * rstd;
        }
    }
    *m_dn = rms ? 0.0f : warp_sum(s_dn) / C;
    *m_dnx = warp_sum(s_dnx) / C;
}

// dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * w  (RMS: no mean term)
template <int V>
static __global__ void norm_backward_dinp_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp,
                                                 const bf16 *weight, const float *mean_in,
                                                 const float *rstd_in, int N, int C, int ld, int rms,
                                                 int assign) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N)
        return;
    size_t base = (size_t)row * ld;
    float mean = rms ? 0.0f : mean_in[row], rstd = rstd_in[row], s_dn, s_dnx;
    row_means<V>(dout + base, inp + base, weight, C, mean, rstd, rms, &s_dn, &s_dnx);
    for (int i = lane * V; i < C; i += 32 * V) {
        float d[V], x[V], w[V], g[V];
        ldv<V>(dout + base + i, d);
        ldv<V>(inp + base + i, x);
        ldv<V>(weight + i, w);
        if (!assign)
            ldv<V>(dinp + base + i, g);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float xhat = (x[k] - mean) * rstd;
            float dx = rstd * (d[k] * w[k] - s_dn - xhat * s_dnx);
            g[k] = assign ? dx : g[k] + dx;
        }
        stv<V>(dinp + base + i, g);
    }
}

template <int V>
static __device__ __forceinline__ void colsum_load(const bf16 *p, bf16 *v) {
    if (V == 8) {
        bf16x8 t;
        t.u = *(const uint4 *)p;
#pragma unroll
        for (int k = 0; k < V; k++)
            v[k] = t.h[k];
    } else {
        v[0] = *p;
    }
}

// Per-chunk column partial sums over rows [chunk*R, chunk*R + R):
//   part_b[chunk, c] = sum dout[r, c];  part_w[chunk, c] = sum dout[r, c] * xhat[r, c]  (when x != NULL)
// V = 8: each thread owns 8 adjacent columns and reads them with one 16-byte load per row (C % 8 == 0, rows
// 16-byte aligned); V = 1: one column per thread. The order of the sums (rows in order within a chunk, chunks
// in order in the reduce) does not depend on V's launch geometry: deterministic either way.
// Rows are taken 4 at a time, their loads issued together (the sums still add the rows in order).
template <int V>
static __global__ void colsum_partial_kernel(float *part_w, float *part_b, const bf16 *dout, const bf16 *x,
                                             const float *mean_in, const float *rstd_in, int rms, int N,
                                             int C, int ld, int R) {
    int col = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    int chunk = blockIdx.y;
    if (col >= C)
        return;
    int r0 = chunk * R, r1 = min(N, r0 + R);
    float sw[V], sb[V];
#pragma unroll
    for (int k = 0; k < V; k++)
        sw[k] = sb[k] = 0.0f;
    for (int r = r0; r < r1; r += 4) {
        int nr = min(4, r1 - r);
        bf16 d[4][V], xv[4][V];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (u < nr) {
                size_t o = (size_t)(r + u) * ld + col;
                colsum_load<V>(dout + o, d[u]);
                if (x)
                    colsum_load<V>(x + o, xv[u]);
            }
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (u < nr) {
                float m = 0.0f, rs = 0.0f;
                if (x) {
                    m = rms ? 0.0f : mean_in[r + u];
                    rs = rstd_in[r + u];
                }
#pragma unroll
                for (int k = 0; k < V; k++) {
                    float dd = bf2f(d[u][k]);
                    sb[k] += dd;
                    if (x)
                        sw[k] += dd * (bf2f(xv[u][k]) - m) * rs;
                }
            }
    }
#pragma unroll
    for (int k = 0; k < V; k++) {
        part_b[(size_t)chunk * C + col + k] = sb[k];
        if (x)
            part_w[(size_t)chunk * C + col + k] = sw[k];
    }
}

// Where the column sums go: plane p of the partials into to[p][0] and to[p][1] (NULL ones skipped), gradients
// of the context's grad dtype. The norm backward's planes are dout*xhat (dweight), dout (dbias) and the
// finished dinp (dres_bias); a plain column sum has one plane.
struct colsum_dst {
    void *to[3][2];
};

template <typename G> static __device__ __forceinline__ void colsum_put(void *dst, int col, float v, int assign) {
    G *p = (G *)dst + col;
    grad_store(p, assign ? v : grad_load(p) + v);
}

// dst[c] (+)= sum_k part[plane][k, c] for each plane (= when assign), part = [planes][chunks][C] f32, rounded
// once into G. Block (8, 64): thread (x, y) adds chunks y, y+64, ... of column blockIdx.x*8 + x in order (four
// loads in flight), then row y == 0 adds the 64 sums in order: deterministic. Eight columns a block (32-byte
// sectors) spread the few MB of partials over C/8 blocks: at C = 1024, 128 SMs rather than 32.
template <typename G>
static __global__ void __launch_bounds__(512)
    colsum_reduce_kernel(struct colsum_dst dst, const float *part, int planes, int chunks, int C, int assign) {
    __shared__ float sh[3][64][9];
    int col = blockIdx.x * 8 + threadIdx.x, y = threadIdx.y;
    for (int p = 0; p < planes; p++) {
        float v = 0.0f;
        if (col < C) {
            const float *q = part + (size_t)p * chunks * C + col;
#pragma unroll 4
            for (int k = y; k < chunks; k += 64)
                v += q[(size_t)k * C];
        }
        sh[p][y][threadIdx.x] = v;
    }
    __syncthreads();
    if (y != 0 || col >= C)
        return;
    for (int p = 0; p < planes; p++) {
        float v = 0.0f;
        for (int k = 0; k < 64; k++)
            v += sh[p][k][threadIdx.x];
        for (int o = 0; o < 2; o++)
            if (dst.to[p][o])
                colsum_put<G>(dst.to[p][o], col, v, assign);
    }
}

static void colsum_reduce(struct cuda_ctx *c, struct colsum_dst dst, const float *part, int planes, int chunks,
                          int C, int assign) {
    dim3 grid(KILN_CEIL_DIV(C, 8)), block(8, 64);
    if (c->grad_dtype == KILN_BF16)
        colsum_reduce_kernel<bf16><<<grid, block, 0, c->stream>>>(dst, part, planes, chunks, C, assign);
    else
        colsum_reduce_kernel<float><<<grid, block, 0, c->stream>>>(dst, part, planes, chunks, C, assign);
    CUDA_CHECK_LAUNCH();
}

// With x: w (+)= colsum(dout * xhat), b[] (+)= colsum(dout); without: b[] (+)= colsum(dout). = when assign.
static void colsums(struct cuda_ctx *c, void *w, void *b0, void *b1, const bf16 *dout, const bf16 *x,
                    const float *mean, const float *rstd, int rms, int N, int C, int ld, int assign) {
    int vec = C % 8 == 0 && ld % 8 == 0 && ((uintptr_t)dout | (uintptr_t)x) % 16 == 0;
    int bt = vec ? 128 : 256, bx = KILN_CEIL_DIV(C, bt * (vec ? 8 : 1));
    // enough chunks to fill the GPU ~8x, at least 64 rows each (the partials a few % of the rows' bytes);
    // depends only on shapes and the device
    int chunks = KILN_CEIL_DIV(8 * c->prop.multiProcessorCount, bx);
    if (chunks > KILN_CEIL_DIV(N, 64))
        chunks = KILN_CEIL_DIV(N, 64);
    if (chunks < 1)
        chunks = 1;
    int R = KILN_CEIL_DIV(N, chunks);
    chunks = KILN_CEIL_DIV(N, R);
    int planes = x ? 2 : 1; // [dout*xhat,] dout
    float *part = (float *)kiln_cuda_scratch(c, SCR_COLSUM, (size_t)chunks * C * planes * sizeof(float));
    float *part_b = part + (size_t)(planes - 1) * chunks * C;
    dim3 grid(bx, chunks);
    if (vec)
        colsum_partial_kernel<8>
            <<<grid, bt, 0, c->stream>>>(part, part_b, dout, x, mean, rstd, rms, N, C, ld, R);
    else
        colsum_partial_kernel<1>
            <<<grid, bt, 0, c->stream>>>(part, part_b, dout, x, mean, rstd, rms, N, C, ld, R);
    CUDA_CHECK_LAUNCH();
    struct colsum_dst dst = {{{w, NULL}, {b0, b1}, {NULL, NULL}}};
    if (!x)
        dst = (struct colsum_dst){{{b0, b1}, {NULL, NULL}, {NULL, NULL}}};
    colsum_reduce(c, dst, part, planes, chunks, C, assign);
}

// The wide-row fused backward (C > 2048). Lane l of a warp owns columns 256*j + 8*l + k (k < 8); its running
// sums live in shared memory at [(8*j + k)*32 + l] of its warp's slice (conflict-free), padded to
// CP = 256*ceil(C/256).
static __device__ __forceinline__ int acc_index(int c) {
    return (((c >> 8) * 8 + (c & 7)) << 5) + ((c >> 3) & 31);
}

static __global__ void __launch_bounds__(256)
    norm_backward_wide_kernel(bf16 *dinp, float *part_w, float *part_b, const bf16 *dout, const bf16 *inp,
                              const bf16 *weight, const float *mean_in, const float *rstd_in, int N, int C,
                              int CP, int ld, int rms, int assign, int R) {
    extern __shared__ float acc[]; // [warps][2][CP]: dw then db sums
    int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *aw = acc + (size_t)warp * 2 * CP, *ab = aw + CP;
    for (int i = lane * 8; i < C; i += 256)
#pragma unroll
        for (int k = 0; k < 8; k++)
            aw[acc_index(i + k)] = ab[acc_index(i + k)] = 0.0f;
    int r1 = min(N, (blockIdx.x + 1) * R);
    for (int row = blockIdx.x * R + warp; row < r1; row += warps) {
        size_t base = (size_t)row * ld;
        float mean = rms ? 0.0f : mean_in[row], rstd = rstd_in[row], s_dn, s_dnx;
        row_means<8>(dout + base, inp + base, weight, C, mean, rstd, rms, &s_dn, &s_dnx);
        for (int i = lane * 8; i < C; i += 256) {
            float d[8], x[8], w[8], g[8];
            ldv<8>(dout + base + i, d);
            ldv<8>(inp + base + i, x);
            ldv<8>(weight + i, w);
            if (!assign)
                ldv<8>(dinp + base + i, g);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float xhat = (x[k] - mean) * rstd;
                float dx = rstd * (d[k] * w[k] - s_dn - xhat * s_dnx);
                g[k] = assign ? dx : g[k] + dx;
                int ai = acc_index(i + k);
                aw[ai] += d[k] * xhat;
                ab[ai] += d[k];
            }
            stv<8>(dinp + base + i, g);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) { // warps in order
        int ai = acc_index(c);
        float sw = 0.0f, sb = 0.0f;
        for (int w = 0; w < warps; w++) {
            sw += acc[(size_t)w * 2 * CP + ai];
            sb += acc[(size_t)w * 2 * CP + CP + ai];
        }
        part_w[(size_t)blockIdx.x * C + c] = sw;
        part_b[(size_t)blockIdx.x * C + c] = sb;
    }
}

// The fused backward for C <= 2048 (C % 8 == 0). A block owns rows [blockIdx.x*R, +R) and takes them in
// tiles of one row per warp, in two phases per tile:
//   A (warp per row): the row's dout and x (and dinp when adding) arrive in the tile in shared memory by
//     cp.async, all of a lane's 16-byte chunks in flight at once (no registers held); the row's two
//     reductions give dinp, which is written to memory and, as stored (bf16), back into the tile.
//   B (thread per 8 columns; RL = blockDim / (C/8) row lanes): each thread adds its columns' dout*xhat, dout
//     and dinp over its lane's rows of the tile, in registers.
// At the end the row lanes are added in order (through shared memory) into one partial row per block and
// plane: [3][chunks][C] = dout*xhat, dout, dinp. Bitwise deterministic for a given shape and device.
// DRAM traffic is the floor (dout, x once; dinp read-modify-write); shared memory carries the transpose.
static __global__ void __launch_bounds__(256)
    norm_backward_tile_kernel(bf16 *dinp, float *part, const bf16 *dout, const bf16 *inp, const bf16 *weight,
                              const float *mean_in, const float *rstd_in, int N, int C, int ld, int rms,
                              int assign, int R, int chunks, int dres_sum) {
    extern __shared__ float4 smem4[];
    int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *t_mean = (float *)smem4, *t_rstd = t_mean + warps;
    bf16 *td = (bf16 *)(t_rstd + warps + (-2 * warps & 3)); // 16-byte aligned: tile rows of dout, x, dinp
    bf16 *tx = td + (size_t)warps * C, *tg = tx + (size_t)warps * C;
    bf16 *rd = td + (size_t)warp * C, *rx = tx + (size_t)warp * C, *rg = tg + (size_t)warp * C; // this warp's
    int G = C >> 3, RL = blockDim.x / G, cg = threadIdx.x % G, rl = threadIdx.x / G;
    float aw[8], ab[8], as[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        aw[k] = ab[k] = as[k] = 0.0f;
    int r0 = blockIdx.x * R, r1 = min(N, r0 + R);
    for (int t0 = r0; t0 < r1; t0 += warps) {
        int row = t0 + warp;
        if (row < r1) { // phase A
            size_t base = (size_t)row * ld;
            for (int i = lane * 8; i < C; i += 256) {
                cp_async16(rd + i, dout + base + i, 1);
                cp_async16(rx + i, inp + base + i, 1);
                if (!assign)
                    cp_async16(rg + i, dinp + base + i, 1);
            }
            cp_async_commit();
            float mean = rms ? 0.0f : mean_in[row], rstd = rstd_in[row];
            cp_async_wait<0>(); // a lane reads back only the chunks it copied
            float s_dn, s_dnx;
            row_means<8>(rd, rx, weight, C, mean, rstd, rms, &s_dn, &s_dnx);
            for (int i = lane * 8; i < C; i += 256) {
                float d[8], x[8], w[8], g[8];
                ldv<8>(rd + i, d);
                ldv<8>(rx + i, x);
                ldv<8>(weight + i, w);
                if (!assign)
                    ldv<8>(rg + i, g);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float dx = rstd * (d[k] * w[k] - s_dn - (x[k] - mean) * rstd * s_dnx);
                    g[k] = assign ? dx : g[k] + dx;
                }
                stv<8>(dinp + base + i, g);
                if (dres_sum)
                    stv<8>(rg + i, g);
            }
            if (lane == 0) {
                t_mean[warp] = mean;
                t_rstd[warp] = rstd;
            }
        }
        __syncthreads();
        int rows = min(warps, r1 - t0);
        if (rl < RL) // phase B
            for (int r = rl; r < rows; r += RL) {
                float d[8], x[8], g[8] = {0};
                ldv<8>(td + (size_t)r * C + cg * 8, d);
                ldv<8>(tx + (size_t)r * C + cg * 8, x);
                if (dres_sum)
                    ldv<8>(tg + (size_t)r * C + cg * 8, g);
                float mean = t_mean[r], rstd = t_rstd[r];
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    aw[k] += d[k] * ((x[k] - mean) * rstd);
                    ab[k] += d[k];
                    as[k] += g[k];
                }
            }
        __syncthreads();
    }
    // row lanes in order: [RL][3][C] f32 over the tile's space (sized for it at launch)
    float *red = (float *)smem4;
    if (rl < RL)
#pragma unroll
        for (int k = 0; k < 8; k++) {
            red[((size_t)rl * 3 + 0) * C + cg * 8 + k] = aw[k];
            red[((size_t)rl * 3 + 1) * C + cg * 8 + k] = ab[k];
            red[((size_t)rl * 3 + 2) * C + cg * 8 + k] = as[k];
        }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        for (int p = 0; p < 2 + dres_sum; p++) {
            float v = 0.0f;
            for (int l = 0; l < RL; l++)
                v += red[((size_t)l * 3 + p) * C + c];
            part[((size_t)p * chunks + blockIdx.x) * C + c] = v;
        }
}

// Launches a fused backward (the tile kernel up to C = 2048, the wide one above); returns -1 when the shape
// suits neither (then nothing ran). Writes the norm's gradients and, where asked (dres_bias), dinp's column
// sums.
static int norm_backward_fused(struct cuda_ctx *c, const struct kiln_norm_back_args *a, const float *mean, int ld) {
    const size_t smem_max = 200 << 10; // of the H100's 227 KiB a block may have
    int C = a->C, warps = 8, tile = C <= 2048, dres_sum = a->dres_bias[0] || a->dres_bias[1];
    static size_t smem_set[2] = {0}; // the opt-in above 48 KiB is per function, process-wide
    const void *kernel;
    size_t smem = 0;
    int ki = tile;
    if (tile) {
        // 8 warps (one tile row each; phase B has a thread per 8 columns). Fewer warps in more blocks did not
        // help: at C = 1600 three blocks of 7 warps ran 53.6 us a call against 50 us for two blocks of 8 (H100).
        size_t rows = 2 * warps * sizeof(float) + 16 + (size_t)3 * warps * C * sizeof(bf16);
        size_t red = (size_t)(256 / (C / 8)) * 3 * C * sizeof(float);
        smem = rows > red ? rows : red;
        kernel = (const void *)norm_backward_tile_kernel;
    } else {
        size_t per_warp = (size_t)2 * KILN_CEIL_DIV(C, 256) * 256 * sizeof(float);
        warps = (int)(smem_max / per_warp) < 8 ? (int)(smem_max / per_warp) : 8;
        if (warps < 2)
            return -1;
        smem = warps * per_warp;
        kernel = (const void *)norm_backward_wide_kernel;
    }
    if (smem > 48 << 10 && smem > smem_set[ki]) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set[ki] = smem;
    }
    int per_sm = 0; // blocks that fit on one SM at once (registers and shared memory)
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * warps, smem));
    if (per_sm < 1)
        per_sm = 1;
    // one wave of blocks; chunks of at least 2 rows per warp keep the partials small next to the rows
    int chunks = per_sm * c->prop.multiProcessorCount;
    if (chunks > KILN_CEIL_DIV(a->N, 2 * warps))
        chunks = KILN_CEIL_DIV(a->N, 2 * warps);
    int R = KILN_CEIL_DIV(a->N, chunks);
    chunks = KILN_CEIL_DIV(a->N, R);
    float *part = (float *)kiln_cuda_scratch(c, SCR_COLSUM, (size_t)chunks * C * 3 * sizeof(float));
    struct colsum_dst dst = {{{a->dweight, NULL}, {a->dbias, NULL}, {a->dres_bias[0], a->dres_bias[1]}}};
    if (tile) {
        norm_backward_tile_kernel<<<chunks, 32 * warps, smem, c->stream>>>(
            (bf16 *)a->dinp, part, (const bf16 *)a->dout, (const bf16 *)a->inp, (const bf16 *)a->weight, mean,
            a->rstd, a->N, C, ld, a->rms, a->dinp_assign, R, chunks, dres_sum);
        CUDA_CHECK_LAUNCH();
        colsum_reduce(c, dst, part, 2 + dres_sum, chunks, C, a->grad_assign);
        return 0;
    }
    norm_backward_wide_kernel<<<chunks, 32 * warps, smem, c->stream>>>(
        (bf16 *)a->dinp, part, part + (size_t)chunks * C, (const bf16 *)a->dout, (const bf16 *)a->inp,
        (const bf16 *)a->weight, mean, a->rstd, a->N, C, KILN_CEIL_DIV(C, 256) * 256, ld, a->rms, a->dinp_assign,
        R);
    CUDA_CHECK_LAUNCH();
    colsum_reduce(c, dst, part, 2, chunks, C, a->grad_assign);
    if (dres_sum) // a second pass over the finished dinp
        colsums(c, NULL, a->dres_bias[0], a->dres_bias[1], (const bf16 *)a->dinp, NULL, NULL, NULL, 1, a->N, C,
                ld, a->grad_assign);
    return 0;
}

extern "C" void kiln_cuda_colsum_bf16(struct cuda_ctx *c, void *out, const bf16 *x, int N, int C,
                                      int assign) {
    if (N == 0 || C == 0)
        return;
    colsums(c, NULL, out, NULL, x, NULL, NULL, NULL, 1, N, C, C, assign);
}

extern "C" void kiln_cuda_norm_backward(void *ctx, const struct kiln_norm_back_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (a->N == 0)
        return;
    const float *mean = a->rms ? NULL : a->mean;
    KILN_ASSERT(a->rms || mean);
    int ld = a->stride ? a->stride : a->C; // row stride
    int vec = a->C % 8 == 0 && ld % 8 == 0 &&
              ((uintptr_t)a->dinp | (uintptr_t)a->dout | (uintptr_t)a->inp | (uintptr_t)a->weight) % 16 == 0;
    if (vec && norm_backward_fused(c, a, mean, ld) == 0)
        return;
    unsigned grid = KILN_CEIL_DIV(a->N, 8);
    if (vec)
        norm_backward_dinp_kernel<8>
            <<<grid, 256, 0, c->stream>>>((bf16 *)a->dinp, (const bf16 *)a->dout, (const bf16 *)a->inp,
                                          (const bf16 *)a->weight, mean, a->rstd, a->N, a->C, ld, a->rms,
                                          a->dinp_assign);
    else
        norm_backward_dinp_kernel<1>
            <<<grid, 256, 0, c->stream>>>((bf16 *)a->dinp, (const bf16 *)a->dout, (const bf16 *)a->inp,
                                          (const bf16 *)a->weight, mean, a->rstd, a->N, a->C, ld, a->rms,
                                          a->dinp_assign);
    CUDA_CHECK_LAUNCH();
    colsums(c, a->dweight, a->dbias, NULL, (const bf16 *)a->dout,
            (const bf16 *)a->inp, mean, a->rstd, a->rms, a->N, a->C, ld, a->grad_assign);
    if (a->dres_bias[0] || a->dres_bias[1])
        colsums(c, NULL, a->dres_bias[0], a->dres_bias[1], (const bf16 *)a->dinp, NULL, NULL, NULL, 1, a->N,
                a->C, ld, a->grad_assign);
}
