// LayerNorm / RMSNorm, forward with the residual add fused, backward yielding dinp, dweight and dbias.
//
// Forward: one warp per row, fp32 statistics, 16-byte vector loads when C % 8 == 0.
//   Bytes: 2*N*C (inp) [+ 2*N*C res_in + 2*N*C res_out] + 2*N*C out; FLOPs ~8*N*C: memory bound, floor
//   = bytes / 3 TB/s (GPT-2 124M, N=32k, C=768, fused: 200 MB -> ~67 us).
// Backward (C % 8 == 0, the usual case): one kernel. Each block owns a contiguous chunk of rows and its warps
//   take the rows in turn (warp per row: dinp from the row's two reductions). The column sums for dweight and
//   dbias (dout*xhat and dout) accumulate in a per-warp slice of shared memory, each lane owning fixed
//   columns, so no atomics; the block adds its warps' slices in warp order into one partial row per chunk, and
//   a small kernel adds the chunks in chunk order. Bitwise deterministic for a given shape and device.
//   Bytes: 2*N*C*2 (dout, x) + 2*N*C*2 (dinp read-modify-write) = 8*N*C; the partials are ~1% of that
//   (GPT-2 350M, N=16k, C=1024: 134 MB -> ~45 us at 3 TB/s). The profile before fusion (H100): 47 us for dinp
//   plus 32 us for a separate column-partials pass over dout and x plus 38 us for a one-thread-per-column
//   reduce.
// Other shapes: a row kernel for dinp, then column partials and the reduce, as separate passes.
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
    if (vec)
        norm_forward_kernel<8><<<grid, 32 * rows_per_block, 0, c->stream>>>(
            (bf16 *)a->out, mean, a->rstd, (bf16 *)a->res_out, (const bf16 *)a->inp, (const bf16 *)a->res_in,
            (const bf16 *)a->weight, (const bf16 *)a->bias, a->N, a->C, ld, a->rms, a->eps);
    else
        norm_forward_kernel<1><<<grid, 32 * rows_per_block, 0, c->stream>>>(
            (bf16 *)a->out, mean, a->rstd, (bf16 *)a->res_out, (const bf16 *)a->inp, (const bf16 *)a->res_in,
            (const bf16 *)a->weight, (const bf16 *)a->bias, a->N, a->C, ld, a->rms, a->eps);
    CUDA_CHECK_LAUNCH();
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
    float mean = rms ? 0.0f : mean_in[row], rstd = rstd_in[row];
    float s_dn = 0.0f, s_dnx = 0.0f;
    for (int i = lane * V; i < C; i += 32 * V) {
        float d[V], x[V], w[V];
        ldv<V>(dout + base + i, d);
        ldv<V>(inp + base + i, x);
        ldv<V>(weight + i, w);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float dn = d[k] * w[k];
            s_dn += dn;
            s_dnx += dn * (x[k] - mean) * rstd;
        }
    }
    s_dn = rms ? 0.0f : warp_sum(s_dn) / C;
    s_dnx = warp_sum(s_dnx) / C;
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

// Per-chunk column partial sums over rows [chunk*R, chunk*R + R):
//   part_b[chunk, c] = sum dout[r, c];  part_w[chunk, c] = sum dout[r, c] * xhat[r, c]  (when x != NULL)
// V = 8: each thread owns 8 adjacent columns and reads them with one 16-byte load per row (C % 8 == 0, rows
// 16-byte aligned); V = 1: one column per thread. The order of the sums (rows in order within a chunk, chunks
// in order in the reduce) does not depend on V's launch geometry: deterministic either way.
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
    for (int r = r0; r < r1; r++) {
        size_t o = (size_t)r * ld + col;
        bf16 d[V], xv[V];
        if (V == 8) {
            bf16x8 t;
            t.u = *(const uint4 *)(dout + o);
#pragma unroll
            for (int k = 0; k < V; k++)
                d[k] = t.h[k];
            if (x) {
                t.u = *(const uint4 *)(x + o);
#pragma unroll
                for (int k = 0; k < V; k++)
                    xv[k] = t.h[k];
            }
        } else {
            d[0] = dout[o];
            if (x)
                xv[0] = x[o];
        }
        float m = 0.0f, rs = 0.0f;
        if (x) {
            m = rms ? 0.0f : mean_in[r];
            rs = rstd_in[r];
        }
#pragma unroll
        for (int k = 0; k < V; k++) {
            float dd = bf2f(d[k]);
            sb[k] += dd;
            if (x)
                sw[k] += dd * (bf2f(xv[k]) - m) * rs;
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++) {
        part_b[(size_t)chunk * C + col + k] = sb[k];
        if (x)
            part_w[(size_t)chunk * C + col + k] = sw[k];
    }
}

// dw[c] (+)= sum_k part_w[k, c], db[c] (+)= sum_k part_b[k, c] (= when assign), G the gradient type (the sum
// is f32 and rounded once into bf16). Block (32, 8): thread (x, y) adds chunks y, y+8, ... of column
// blockIdx.x*32 + x in order, then row y == 0 adds the 8 sums in order: deterministic.
template <typename G>
static __global__ void colsum_reduce_kernel(G *dw, G *db, const float *part_w, const float *part_b,
                                            int chunks, int C, int assign) {
    __shared__ float sw[8][33], sb[8][33];
    int col = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
    float w = 0.0f, b = 0.0f;
    if (col < C)
        for (int k = y; k < chunks; k += 8) {
            if (dw)
                w += part_w[(size_t)k * C + col];
            if (db)
                b += part_b[(size_t)k * C + col];
        }
    sw[y][threadIdx.x] = w;
    sb[y][threadIdx.x] = b;
    __syncthreads();
    if (y != 0 || col >= C)
        return;
    w = b = 0.0f;
    for (int k = 0; k < 8; k++) {
        w += sw[k][threadIdx.x];
        b += sb[k][threadIdx.x];
    }
    if (dw)
        grad_store(dw + col, assign ? w : grad_load(dw + col) + w);
    if (db)
        grad_store(db + col, assign ? b : grad_load(db + col) + b);
}

// dw, db: parameter gradients of the context's grad dtype (or NULL)
static void colsum_reduce(struct cuda_ctx *c, void *dw, void *db, const float *part_w, const float *part_b,
                          int chunks, int C, int assign) {
    dim3 grid(KILN_CEIL_DIV(C, 32)), block(32, 8);
    if (c->grad_dtype == KILN_BF16)
        colsum_reduce_kernel<<<grid, block, 0, c->stream>>>((bf16 *)dw, (bf16 *)db, part_w, part_b, chunks, C,
                                                            assign);
    else
        colsum_reduce_kernel<<<grid, block, 0, c->stream>>>((float *)dw, (float *)db, part_w, part_b, chunks,
                                                            C, assign);
    CUDA_CHECK_LAUNCH();
}

// dw (+)= colsum(dout * xhat) (when x), db (+)= colsum(dout) (when db); = when assign
static void colsums(struct cuda_ctx *c, void *dw, void *db, const bf16 *dout, const bf16 *x,
                    const float *mean, const float *rstd, int rms, int N, int C, int ld, int assign) {
    int vec = C % 8 == 0 && ld % 8 == 0 && ((uintptr_t)dout | (uintptr_t)x) % 16 == 0;
    int bt = vec ? 128 : 256, bx = KILN_CEIL_DIV(C, bt * (vec ? 8 : 1));
    // enough chunks to fill the GPU ~4x, at least 32 rows each; depends only on shapes and the device
    int chunks = KILN_CEIL_DIV(4 * c->prop.multiProcessorCount, bx);
    if (chunks > KILN_CEIL_DIV(N, 32))
        chunks = KILN_CEIL_DIV(N, 32);
    if (chunks < 1)
        chunks = 1;
    int R = KILN_CEIL_DIV(N, chunks);
    chunks = KILN_CEIL_DIV(N, R);
    float *part = (float *)kiln_cuda_scratch(c, SCR_COLSUM, (size_t)chunks * C * 2 * sizeof(float));
    float *part_w = part, *part_b = part + (size_t)chunks * C;
    dim3 grid(bx, chunks);
    if (vec)
        colsum_partial_kernel<8>
            <<<grid, bt, 0, c->stream>>>(part_w, part_b, dout, x, mean, rstd, rms, N, C, ld, R);
    else
        colsum_partial_kernel<1>
            <<<grid, bt, 0, c->stream>>>(part_w, part_b, dout, x, mean, rstd, rms, N, C, ld, R);
    CUDA_CHECK_LAUNCH();
    colsum_reduce(c, x ? dw : NULL, db, part_w, part_b, chunks, C, assign);
}

// The fused backward (header). Lane l of a warp owns columns 256*j + 8*l + k (k < 8); its running sums live in
// shared memory at [(8*j + k)*32 + l] of its warp's slice (conflict-free), padded to CP = 256*ceil(C/256).
static __device__ __forceinline__ int acc_index(int c) {
    return (((c >> 8) * 8 + (c & 7)) << 5) + ((c >> 3) & 31);
}

// Pass 2 over the 8 columns at i of one row: dinp (=, or +=), and the row's dout*xhat and dout added to sw, sb.
static __device__ __forceinline__ void row_chunk_back(bf16 *dinp, const bf16 *dout, const bf16 *inp,
                                                      const bf16 *weight, size_t base, int i, float mean,
                                                      float rstd, float s_dn, float s_dnx, int assign, float *sw,
                                                      float *sb) {
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
        sw[k] += d[k] * xhat;
        sb[k] += d[k];
    }
    stv<8>(dinp + base + i, g);
}

// J > 0 (C <= 256 J): a lane's running sums stay in registers until the rows are done, then go to its warp's
// shared slice once. J == 0 (any C): they live in the shared slice throughout. Both add the same values in the
// same order, so the results are the same bit for bit.
template <int J>
static __global__ void __launch_bounds__(256, 2)
    norm_backward_fused_kernel(bf16 *dinp, float *part_w, float *part_b, const bf16 *dout, const bf16 *inp,
                               const bf16 *weight, const float *mean_in, const float *rstd_in, int N, int C,
                               int CP, int ld, int rms, int assign, int R) {
    extern __shared__ float acc[]; // [warps][2][CP]: dw then db sums
    int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *aw = acc + (size_t)warp * 2 * CP, *ab = aw + CP;
    float rw[J > 0 ? J : 1][8], rb[J > 0 ? J : 1][8];
#pragma unroll
    for (int j = 0; j < (J > 0 ? J : 1); j++)
#pragma unroll
        for (int k = 0; k < 8; k++)
            rw[j][k] = rb[j][k] = 0.0f;
    for (int i = lane * 8; i < C && J == 0; i += 256)
#pragma unroll
        for (int k = 0; k < 8; k++)
            aw[acc_index(i + k)] = ab[acc_index(i + k)] = 0.0f;
    int r1 = min(N, (blockIdx.x + 1) * R);
    for (int row = blockIdx.x * R + warp; row < r1; row += warps) {
        size_t base = (size_t)row * ld;
        float mean = rms ? 0.0f : mean_in[row], rstd = rstd_in[row];
        float s_dn = 0.0f, s_dnx = 0.0f;
        for (int i = lane * 8; i < C; i += 256) {
            float d[8], x[8], w[8];
            ldv<8>(dout + base + i, d);
            ldv<8>(inp + base + i, x);
            ldv<8>(weight + i, w);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float dn = d[k] * w[k];
                s_dn += dn;
                s_dnx += dn * (x[k] - mean) * rstd;
            }
        }
        s_dn = rms ? 0.0f : warp_sum(s_dn) / C;
        s_dnx = warp_sum(s_dnx) / C;
        if (J > 0) {
#pragma unroll
            for (int j = 0; j < (J > 0 ? J : 1); j++)
                if (lane * 8 + 256 * j < C)
                    row_chunk_back(dinp, dout, inp, weight, base, lane * 8 + 256 * j, mean, rstd, s_dn, s_dnx,
                                   assign, rw[j], rb[j]);
        } else {
            for (int i = lane * 8; i < C; i += 256) {
                float sw[8], sb[8];
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    sw[k] = aw[acc_index(i + k)];
                    sb[k] = ab[acc_index(i + k)];
                }
                row_chunk_back(dinp, dout, inp, weight, base, i, mean, rstd, s_dn, s_dnx, assign, sw, sb);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    aw[acc_index(i + k)] = sw[k];
                    ab[acc_index(i + k)] = sb[k];
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < (J > 0 ? J : 0); j++)
        if (lane * 8 + 256 * j < C)
#pragma unroll
            for (int k = 0; k < 8; k++) {
                aw[acc_index(lane * 8 + 256 * j + k)] = rw[j][k];
                ab[acc_index(lane * 8 + 256 * j + k)] = rb[j][k];
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

// Launches the fused backward; returns 0 when the shape does not suit it (then nothing ran).
typedef void (*norm_bwd_kernel_t)(bf16 *, float *, float *, const bf16 *, const bf16 *, const bf16 *,
                                  const float *, const float *, int, int, int, int, int, int, int);

static int norm_backward_fused(struct cuda_ctx *c, const struct kiln_norm_back_args *a, const float *mean, int ld) {
    const size_t smem_max = 200 << 10; // of the H100's 227 KiB a block may have
    int C = a->C, CP = KILN_CEIL_DIV(C, 256) * 256;
    size_t per_warp = (size_t)2 * CP * sizeof(float);
    int warps = (int)(smem_max / per_warp) < 8 ? (int)(smem_max / per_warp) : 8;
    if (warps < 2)
        return -1;
    static const norm_bwd_kernel_t kernels[5] = {norm_backward_fused_kernel<0>, norm_backward_fused_kernel<1>,
                                                 norm_backward_fused_kernel<2>, norm_backward_fused_kernel<3>,
                                                 norm_backward_fused_kernel<4>};
    norm_bwd_kernel_t kernel = kernels[CP / 256 <= 4 ? CP / 256 : 0]; // registers up to C = 1024
    size_t smem = warps * per_warp;
    static size_t smem_set[5] = {0}; // the opt-in above 48 KiB is per function, process-wide
    int ki = CP / 256 <= 4 ? CP / 256 : 0;
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
    float *part = (float *)kiln_cuda_scratch(c, SCR_COLSUM, (size_t)chunks * C * 2 * sizeof(float));
    float *part_w = part, *part_b = part + (size_t)chunks * C;
    kernel<<<chunks, 32 * warps, smem, c->stream>>>((bf16 *)a->dinp, part_w, part_b, (const bf16 *)a->dout,
                                                    (const bf16 *)a->inp, (const bf16 *)a->weight, mean, a->rstd,
                                                    a->N, C, CP, ld, a->rms, a->dinp_assign, R);
    CUDA_CHECK_LAUNCH();
    colsum_reduce(c, a->dweight, a->dbias, part_w, part_b, chunks, C, a->grad_assign);
    return 0;
}

extern "C" void kiln_cuda_colsum_bf16(struct cuda_ctx *c, void *out, const bf16 *x, int N, int C,
                                      int assign) {
    if (N == 0 || C == 0)
        return;
    colsums(c, NULL, out, x, NULL, NULL, NULL, 1, N, C, C, assign);
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
    colsums(c, a->dweight, a->dbias, (const bf16 *)a->dout, (const bf16 *)a->inp, mean, a->rstd, a->rms, a->N,
            a->C, ld, a->grad_assign);
}
