// Block attention (ops.h: kiln_attn_block_args): a block of queries against a block of keys at global
// positions, what sequence parallelism builds attention from. The merge through the log-sum-exp lets blocks
// arrive in any order; the backward, given the final out and lse, adds (+=) one block's contributions to dq,
// dk and dv.
//
// Scores, as attention.cu:  s_ij = scale * q_i . k_j + slope_h * (kpos_j - qpos_i),  kpos_j <= qpos_i,
// with q and k rotated by their global positions (RoPE) and the slope of global head head0 + h of NH_total.
// Kernels work in the log2 domain.
//
// Correctness first: f32 on the CUDA cores (no tensor cores), any even HS <= 256, any strides (scalar bf16
// loads), GQA by indexing. A block of 4 warps owns 16 rows (4 a warp); tiles of 32 keys (forward, dQ) or 32
// queries (dK/dV) are staged in shared memory in f32, one lane per key or query for the dot products and one
// lane per column for the accumulation.
// - forward: online softmax per query row; the block's (out, lse) is merged into what out and lse hold.
// - backward, deterministic and without atomics (as the CPU reference): D = rowsum(dout * out), then one pass
//   over query rows for dQ and one over key rows for dK and dV (summing a kv head's group of query heads in a
//   fixed order); each element of dq, dk, dv is read, added to in f32 and rounded once, by one thread.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attention/attention_block.cuh"

#define BLK_WARPS 4
#define BLK_RPW 4                      // rows a warp owns
#define BLK_ROWS (BLK_WARPS * BLK_RPW) // rows a block owns: 16
#define BLK_KT 32                      // rows of a staged tile: one per lane
#define BLK_MAX_HS 256

// Rows [row0, row0 + n) of one head (g: row 0 of the head, rows rs apart) into shared memory rows ld apart,
// in f32, rotated at position pos0 + row (when ct is set) and times mul; rows >= limit are zero.
static __device__ void blk_load(float *sm, int ld, const bf16 *g, int rs, int row0, int n, int limit, int HS,
                                int pos0, const float *ct, const float *st, float mul) {
    for (int idx = threadIdx.x; idx < n * HS; idx += blockDim.x) {
        int r = idx / HS, d = idx % HS, t = row0 + r;
        float x = 0.0f;
        if (t < limit)
            x = blk_rot(g + (size_t)t * rs, d, HS / 2, pos0 + t, ct, st) * mul;
        sm[r * ld + d] = x;
    }
}

// A warp's gradient row x (f32, HS, the rotated frame, in shared memory) back to the input frame at position
// pos, added to the bf16 row dst (read, added in f32, rounded once).
static __device__ void blk_store_grad(bf16 *dst, const float *x, int HS, int pos, const float *ct,
                                      const float *st) {
    int half = HS / 2;
    for (int d = threadIdx.x & 31; d < HS; d += 32) {
        float g = x[d];
        if (ct) {
            int i = d < half ? d : d - half;
            float cs = ct[(size_t)pos * half + i], sn = st[(size_t)pos * half + i];
            g = d < half ? x[d] * cs + x[d + half] * sn : x[d] * cs - x[d - half] * sn;
        }
        dst[d] = f2bf(bf2f(dst[d]) + g);
    }
}

// keys of the block visible to some query in [i0, i1): those j < Tk with k0 + j <= q0 + i1 - 1 (may be <= 0)
static __device__ __forceinline__ int blk_visible_keys(const struct blk_params &p, int i1) {
    return min(p.Tk, p.q0 + i1 - 1 - p.k0 + 1);
}

// ---- forward ----------------------------------------------------------------------------------------------

// NU = column chunks of 32 a lane holds (HS <= 32 NU). Grid (Tq / 16, B * NH).
// acc[u] += a * row[d] over this lane's columns d = u * 32 + lane of a row of HS (a warp spans the row)
template <int NU>
static __device__ __forceinline__ void blk_axpy(float *acc, float a, const float *row, int lane, int HS) {
#pragma unroll
    for (int u = 0; u < NU; u++) {
        int d = u * 32 + lane;
        if (d < HS)
            acc[u] = fmaf(a, row[d], acc[u]);
    }
}

template <int NU> static __global__ void __launch_bounds__(128) blk_fwd_kernel(struct blk_params p) {
    extern __shared__ float smf[];
    int HS = p.HS, ld = HS + 1;     // +1: lanes reading different rows hit different banks
    float *Qs = smf;                // (16, HS) rotated, times scale log2(e)
    float *Ks = Qs + BLK_ROWS * HS; // (32, ld) rotated
    float *Vs = Ks + BLK_KT * ld;   // (32, ld)
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int i0 = blockIdx.x * BLK_ROWS, i1 = min(i0 + BLK_ROWS, p.Tq);
    const bf16 *kg = p.k + b * p.kv_bs + kvh * HS, *vg = p.v + b * p.kv_bs + kvh * HS;
    float slope2 = blk_slope2(p, h);
    blk_load(Qs, HS, p.q + b * p.q_bs + h * HS, p.q_rs, i0, BLK_ROWS, p.Tq, HS, p.q0, p.cos_tab, p.sin_tab,
             p.scale_log2);
    float o[BLK_RPW][NU], m[BLK_RPW], l[BLK_RPW];
#pragma unroll
    for (int r = 0; r < BLK_RPW; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int u = 0; u < NU; u++)
            o[r][u] = 0.0f;
    }
    int nk = blk_visible_keys(p, i1);
    for (int j0 = 0; j0 < nk; j0 += BLK_KT) {
        __syncthreads(); // the previous tile is consumed (and Qs loaded, the first time)
        blk_load(Ks, ld, kg, p.kv_rs, j0, BLK_KT, p.Tk, HS, p.k0, p.cos_tab, p.sin_tab, 1.0f);
        blk_load(Vs, ld, vg, p.kv_rs, j0, BLK_KT, p.Tk, HS, 0, NULL, NULL, 1.0f);
        __syncthreads();
        int nj = min(BLK_KT, p.Tk - j0);
#pragma unroll
        for (int r = 0; r < BLK_RPW; r++) {
            int il = warp * BLK_RPW + r, qpos = p.q0 + i0 + il;
            if (i0 + il >= p.Tq)
                continue; // warp-uniform
            int j = j0 + lane;
            float s = -INFINITY;
            if (j < p.Tk && p.k0 + j <= qpos) {
                const float *qr = Qs + il * HS, *kr = Ks + lane * ld;
                float acc = 0.0f;
                for (int d = 0; d < HS; d++)
                    acc = fmaf(qr[d], kr[d], acc);
                s = acc + slope2 * (float)(p.k0 + j - qpos);
            }
            float mx = warp_max(s);
            if (mx == -INFINITY)
                continue; // no key of this tile is visible to the row
            float mn = fmaxf(m[r], mx);
            float alpha = exp2f(m[r] - mn); // 0 the first time (m = -inf)
            float pv = exp2f(s - mn);
            l[r] = l[r] * alpha + warp_sum(pv);
            m[r] = mn;
#pragma unroll
            for (int u = 0; u < NU; u++)
                o[r][u] *= alpha;
            for (int jj = 0; jj < nj; jj++) {
                float pj = __shfl_sync(0xffffffffu, pv, jj);
                blk_axpy<NU>(o[r], pj, Vs + jj * ld, lane, HS);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < BLK_RPW; r++) {
        int i = i0 + warp * BLK_RPW + r;
        if (i >= p.Tq)
            continue;
        float lse_b = l[r] > 0.0f ? (m[r] + __log2f(l[r])) * BLK_LN2 : -INFINITY;
        float wb = l[r] > 0.0f ? 1.0f / l[r] : 0.0f, wo = 0.0f, lse_n = lse_b; // weights of block and old out
        float *lp = p.lse + ((size_t)b * p.NH + h) * p.lse_s + i;
        bf16 *orow = p.out + b * p.out_bs + (size_t)i * p.out_rs + h * HS;
        if (p.accumulate) {
            if (lse_b == -INFINITY)
                continue; // nothing to merge: out and lse keep what they hold
            float lo = *lp;
            __syncwarp(); // every lane read lse before lane 0 writes it
            if (lo != -INFINITY) {
                float mx = fmaxf(lo, lse_b);
                lse_n = mx + logf(expf(lo - mx) + expf(lse_b - mx));
                wo = expf(lo - lse_n);
                wb *= expf(lse_b - lse_n);
            } // else the old row is empty: out may hold anything, it is not read
        }
#pragma unroll
        for (int u = 0; u < NU; u++) {
            int d = u * 32 + lane;
            if (d < HS) {
                float x = o[r][u] * wb;
                if (wo != 0.0f)
                    x = fmaf(wo, bf2f(orow[d]), x);
                orow[d] = f2bf(x);
            }
        }
        if (lane == 0)
            *lp = lse_n;
    }
}

// ---- backward ---------------------------------------------------------------------------------------------

// dsum[(b NH + h) Tq + i] = dout . out of query i, head h (warp per row)
static __global__ void blk_dsum_kernel(struct blk_params p, float *dsum) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= p.B * p.NH * p.Tq)
        return;
    int i = row % p.Tq, bh = row / p.Tq, h = bh % p.NH, b = bh / p.NH;
    size_t off = b * p.out_bs + (size_t)i * p.out_rs + h * p.HS;
    const bf16 *d = p.dout + off, *o = p.out + off;
    float s = 0.0f;
    for (int c = lane; c < p.HS; c += 32)
        s = fmaf(bf2f(d[c]), bf2f(o[c]), s);
    s = warp_sum(s);
    if (lane == 0)
        dsum[row] = s;
}

// dq += scale * sum_j p_ij (dout_i . v_j - D_i) k_j, rotated back. Grid (Tq / 16, B * NH).
template <int NU> static __global__ void __launch_bounds__(128) blk_dq_kernel(struct blk_params p) {
    extern __shared__ float smf[];
    int HS = p.HS, ld = HS + 1;
    float *Qs = smf;                 // (16, HS) rotated, times scale log2(e); the dq rows at the end
    float *dOs = Qs + BLK_ROWS * HS; // (16, HS)
    float *Ks = dOs + BLK_ROWS * HS; // (32, ld) rotated
    float *Vs = Ks + BLK_KT * ld;    // (32, ld)
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int i0 = blockIdx.x * BLK_ROWS, i1 = min(i0 + BLK_ROWS, p.Tq);
    const bf16 *kg = p.k + b * p.kv_bs + kvh * HS, *vg = p.v + b * p.kv_bs + kvh * HS;
    float slope2 = blk_slope2(p, h);
    blk_load(Qs, HS, p.q + b * p.q_bs + h * HS, p.q_rs, i0, BLK_ROWS, p.Tq, HS, p.q0, p.cos_tab, p.sin_tab,
             p.scale_log2);
    blk_load(dOs, HS, p.dout + b * p.out_bs + h * HS, p.out_rs, i0, BLK_ROWS, p.Tq, HS, 0, NULL, NULL, 1.0f);
    float lse2[BLK_RPW], D[BLK_RPW], dq[BLK_RPW][NU];
#pragma unroll
    for (int r = 0; r < BLK_RPW; r++) {
        int i = i0 + warp * BLK_RPW + r;
        lse2[r] = i < p.Tq ? p.lse[((size_t)b * p.NH + h) * p.lse_s + i] * BLK_LOG2E : -INFINITY;
        D[r] = i < p.Tq ? p.dsum[((size_t)b * p.NH + h) * p.Tq + i] : 0.0f;
#pragma unroll
        for (int u = 0; u < NU; u++)
            dq[r][u] = 0.0f;
    }
    int nk = blk_visible_keys(p, i1);
    for (int j0 = 0; j0 < nk; j0 += BLK_KT) {
        __syncthreads();
        blk_load(Ks, ld, kg, p.kv_rs, j0, BLK_KT, p.Tk, HS, p.k0, p.cos_tab, p.sin_tab, 1.0f);
        blk_load(Vs, ld, vg, p.kv_rs, j0, BLK_KT, p.Tk, HS, 0, NULL, NULL, 1.0f);
        __syncthreads();
        int nj = min(BLK_KT, p.Tk - j0);
#pragma unroll
        for (int r = 0; r < BLK_RPW; r++) {
            int il = warp * BLK_RPW + r, qpos = p.q0 + i0 + il;
            if (i0 + il >= p.Tq || lse2[r] == -INFINITY)
                continue; // a row that saw no key anywhere has no gradient
            int j = j0 + lane;
            float ds = 0.0f;
            if (j < p.Tk && p.k0 + j <= qpos) {
                const float *qr = Qs + il * HS, *dr = dOs + il * HS, *kr = Ks + lane * ld,
                            *vr = Vs + lane * ld;
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < HS; d++) {
                    s = fmaf(qr[d], kr[d], s);
                    dp = fmaf(dr[d], vr[d], dp);
                }
                float pv = exp2f(s + slope2 * (float)(p.k0 + j - qpos) - lse2[r]);
                ds = pv * (dp - D[r]);
            }
            for (int jj = 0; jj < nj; jj++) {
                float dsj = __shfl_sync(0xffffffffu, ds, jj);
                blk_axpy<NU>(dq[r], dsj, Ks + jj * ld, lane, HS);
            }
        }
    }
    // the inverse rotation pairs columns of different lanes: through the warp's own Qs rows, which other
    // threads loaded (with no key tile in between, nothing else orders their writes before these)
    __syncthreads();
#pragma unroll
    for (int r = 0; r < BLK_RPW; r++) {
        int il = warp * BLK_RPW + r, i = i0 + il;
        if (i >= p.Tq)
            continue;
        __syncwarp(); // every lane is done reading the row
#pragma unroll
        for (int u = 0; u < NU; u++)
            if (u * 32 + lane < HS)
                Qs[il * HS + u * 32 + lane] = dq[r][u] * p.scale;
        __syncwarp();
        blk_store_grad(p.dq + b * p.q_bs + (size_t)i * p.q_rs + h * HS, Qs + il * HS, HS, p.q0 + i, p.cos_tab,
                       p.sin_tab);
    }
}

// dk += scale * sum_i ds_ij q_i (rotated back), dv += sum_i p_ij dout_i, over the query heads of the kv
// head's group in order. Grid (Tk / 16, B * NKV).
template <int NU> static __global__ void __launch_bounds__(128) blk_dkdv_kernel(struct blk_params p) {
    extern __shared__ float smf[];
    int HS = p.HS, ld = HS + 1;
    float *Ks = smf;                                         // (16, HS) rotated; the dk rows at the end
    float *Vr = Ks + BLK_ROWS * HS;                          // (16, HS)
    float *Qs = Vr + BLK_ROWS * HS;                          // (32, ld) rotated
    float *dOs = Qs + BLK_KT * ld;                           // (32, ld)
    float *lse_s = dOs + BLK_KT * ld, *D_s = lse_s + BLK_KT; // (32) each, lse in the log2 domain
    int b = blockIdx.y / p.NKV, kvh = blockIdx.y % p.NKV, group = p.NH / p.NKV;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int j0 = blockIdx.x * BLK_ROWS;
    blk_load(Ks, HS, p.k + b * p.kv_bs + kvh * HS, p.kv_rs, j0, BLK_ROWS, p.Tk, HS, p.k0, p.cos_tab,
             p.sin_tab, 1.0f);
    blk_load(Vr, HS, p.v + b * p.kv_bs + kvh * HS, p.kv_rs, j0, BLK_ROWS, p.Tk, HS, 0, NULL, NULL, 1.0f);
    float dk[BLK_RPW][NU], dv[BLK_RPW][NU];
#pragma unroll
    for (int r = 0; r < BLK_RPW; r++)
#pragma unroll
        for (int u = 0; u < NU; u++)
            dk[r][u] = dv[r][u] = 0.0f;
    int istart = max(0, p.k0 + j0 - p.q0); // the first query that sees key j0
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        float slope2 = blk_slope2(p, h);
        const float *lg = p.lse + ((size_t)b * p.NH + h) * p.lse_s,
                    *dg = p.dsum + ((size_t)b * p.NH + h) * p.Tq;
        for (int it = istart; it < p.Tq; it += BLK_KT) {
            __syncthreads(); // the previous tile is consumed (and K, V loaded, the first time)
            blk_load(Qs, ld, p.q + b * p.q_bs + h * HS, p.q_rs, it, BLK_KT, p.Tq, HS, p.q0, p.cos_tab,
                     p.sin_tab, 1.0f);
            blk_load(dOs, ld, p.dout + b * p.out_bs + h * HS, p.out_rs, it, BLK_KT, p.Tq, HS, 0, NULL, NULL,
                     1.0f);
            if (threadIdx.x < BLK_KT) {
                int i = it + threadIdx.x;
                lse_s[threadIdx.x] = i < p.Tq ? lg[i] * BLK_LOG2E : -INFINITY;
                D_s[threadIdx.x] = i < p.Tq ? dg[i] : 0.0f;
            }
            __syncthreads();
            int ni = min(BLK_KT, p.Tq - it);
#pragma unroll
            for (int r = 0; r < BLK_RPW; r++) {
                int jl = warp * BLK_RPW + r, kpos = p.k0 + j0 + jl;
                if (j0 + jl >= p.Tk)
                    continue; // warp-uniform
                int i = it + lane, qpos = p.q0 + i;
                float pv = 0.0f, ds = 0.0f;
                if (i < p.Tq && kpos <= qpos && lse_s[lane] != -INFINITY) {
                    const float *qr = Qs + lane * ld, *dr = dOs + lane * ld, *kr = Ks + jl * HS,
                                *vr = Vr + jl * HS;
                    float s = 0.0f, dp = 0.0f;
                    for (int d = 0; d < HS; d++) {
                        s = fmaf(qr[d], kr[d], s);
                        dp = fmaf(dr[d], vr[d], dp);
                    }
                    pv = exp2f(s * p.scale_log2 + slope2 * (float)(kpos - qpos) - lse_s[lane]);
                    ds = pv * (dp - D_s[lane]);
                }
                for (int ii = 0; ii < ni; ii++) {
                    float pi = __shfl_sync(0xffffffffu, pv, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
                    blk_axpy<NU>(dv[r], pi, dOs + ii * ld, lane, HS);
                    blk_axpy<NU>(dk[r], dsi, Qs + ii * ld, lane, HS);
                }
            }
        }
    }
    __syncthreads(); // Ks, rewritten below by each warp, was loaded by all threads (no query tile may follow)
#pragma unroll
    for (int r = 0; r < BLK_RPW; r++) {
        int jl = warp * BLK_RPW + r, j = j0 + jl;
        if (j >= p.Tk)
            continue;
        size_t off = b * p.kv_bs + (size_t)j * p.kv_rs + kvh * HS;
        bf16 *dvrow = p.dv + off;
#pragma unroll
        for (int u = 0; u < NU; u++) {
            int d = u * 32 + lane;
            if (d < HS)
                dvrow[d] = f2bf(bf2f(dvrow[d]) + dv[r][u]);
        }
        __syncwarp(); // every lane is done reading the row
#pragma unroll
        for (int u = 0; u < NU; u++)
            if (u * 32 + lane < HS)
                Ks[jl * HS + u * 32 + lane] = dk[r][u] * p.scale;
        __syncwarp();
        blk_store_grad(p.dk + off, Ks + jl * HS, HS, p.k0 + j, p.cos_tab, p.sin_tab);
    }
}

// ---- launchers --------------------------------------------------------------------------------------------

// The block's arguments, which the backward's carry as blk.
static struct blk_params blk_setup(struct cuda_ctx *c, const struct kiln_attn_block_args *a) {
    KILN_ASSERT(a->NKV > 0 && a->NH % a->NKV == 0 && a->HS > 0 && a->HS % 2 == 0 && a->HS <= BLK_MAX_HS);
    KILN_ASSERT(a->q0 >= 0 && a->k0 >= 0 && a->head0 >= 0);
    struct blk_params p = blk_params_of(a);
    KILN_ASSERT(p.head0 + a->NH <= p.NH_total);
    if (a->pos == KILN_POS_ROPE)
        p.cos_tab = kiln_cuda_rope_table(c, blk_positions(a), a->HS, a->rope_theta, &p.sin_tab);
    return p;
}

// NU: 32-column chunks a lane accumulates, the smallest of 2, 4, 8 that covers HS
static int blk_nu(int HS) {
    return HS <= 64 ? 2 : HS <= 128 ? 4 : 8;
}

template <int NU> static void blk_forward_launch(struct cuda_ctx *c, const struct blk_params &p) {
    size_t smem = ((size_t)BLK_ROWS * p.HS + (size_t)2 * BLK_KT * (p.HS + 1)) * sizeof(float);
    set_smem(blk_fwd_kernel<NU>, smem);
    dim3 grid(KILN_CEIL_DIV(p.Tq, BLK_ROWS), p.B * p.NH);
    blk_fwd_kernel<NU><<<grid, 32 * BLK_WARPS, smem, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
}

template <int NU> static void blk_backward_launch(struct cuda_ctx *c, const struct blk_params &p) {
    size_t s_dq = ((size_t)2 * BLK_ROWS * p.HS + (size_t)2 * BLK_KT * (p.HS + 1)) * sizeof(float);
    size_t s_kv = s_dq + (size_t)2 * BLK_KT * sizeof(float);
    set_smem(blk_dq_kernel<NU>, s_dq);
    set_smem(blk_dkdv_kernel<NU>, s_kv);
    dim3 grid_q(KILN_CEIL_DIV(p.Tq, BLK_ROWS), p.B * p.NH),
        grid_kv(KILN_CEIL_DIV(p.Tk, BLK_ROWS), p.B * p.NKV);
    blk_dq_kernel<NU><<<grid_q, 32 * BLK_WARPS, s_dq, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
    blk_dkdv_kernel<NU><<<grid_kv, 32 * BLK_WARPS, s_kv, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
}

// Which kernels the context runs (KILN_ATTN_BLOCK, kernel[KILN_KERNEL_ATTN_BLOCK]; kiln_cuda_set_kernel
// switches it between calls, so that a test can compare them in one process):
// wgmma (the default: the Hopper kernels of attention_wgmma.cu for the blocks they take on an sm_90 device,
// the tensor-core kernels for the rest and elsewhere), tc (tensor cores where HS is 64 or 128, these kernels
// otherwise) or ref (these kernels). On 4 H100s (2026-11-26) the ring at 128k ran 32,202 tok/s on the wgmma
// blocks against 13,320 on the tensor-core ones, and matched one GPU as closely as the others.
enum blk_kernels { BLK_WGMMA, BLK_TC, BLK_REF }; // in kiln_kernel_values[KILN_KERNEL_ATTN_BLOCK]'s order
static enum blk_kernels blk_want(const struct cuda_ctx *c) {
    return (enum blk_kernels)c->kernel[KILN_KERNEL_ATTN_BLOCK];
}

extern "C" void kiln_cuda_attention_block_forward(void *ctx, const struct kiln_attn_block_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (a->B == 0 || a->Tq == 0 || a->NH == 0)
        return;
    struct blk_params p = blk_setup(c, a);
    p.out = (bf16 *)a->out;
    p.lse = a->lse;
    p.accumulate = a->accumulate;
    enum blk_kernels want = blk_want(c);
    if (want != BLK_REF && blk_tc_forward(c, p, want == BLK_WGMMA))
        return;
    switch (blk_nu(a->HS)) {
    case 2:
        blk_forward_launch<2>(c, p);
        break;
    case 4:
        blk_forward_launch<4>(c, p);
        break;
    default:
        blk_forward_launch<8>(c, p);
    }
}

extern "C" void kiln_cuda_attention_block_backward(void *ctx, const struct kiln_attn_block_back_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (a->blk.B == 0 || a->blk.Tq == 0 || a->blk.Tk == 0 || a->blk.NH == 0)
        return;
    struct blk_params p = blk_setup(c, &a->blk);
    p.out = (bf16 *)a->blk.out;
    p.lse = (float *)a->blk.lse;
    p.dout = (const bf16 *)a->dout;
    p.dq = (bf16 *)a->dq;
    p.dk = (bf16 *)a->dk;
    p.dv = (bf16 *)a->dv;
    float *dsum =
        (float *)kiln_cuda_scratch(c, SCR_ATTN_D, (size_t)a->blk.B * a->blk.NH * a->blk.Tq * sizeof(float));
    p.dsum = dsum;
    int rows = a->blk.B * a->blk.NH * a->blk.Tq;
    blk_dsum_kernel<<<KILN_CEIL_DIV(rows, 8), 256, 0, c->stream>>>(p, dsum);
    CUDA_CHECK_LAUNCH();
    enum blk_kernels want = blk_want(c);
    if (want != BLK_REF && blk_tc_backward(c, p, want == BLK_WGMMA))
        return;
    switch (blk_nu(a->blk.HS)) {
    case 2:
        blk_backward_launch<2>(c, p);
        break;
    case 4:
        blk_backward_launch<4>(c, p);
        break;
    default:
        blk_backward_launch<8>(c, p);
    }
}
