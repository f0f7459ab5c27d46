// Causal attention, second generation (issue 4): the default path for HS in {32, 48, 64, 80, 96, 128} (the
// Hopper kernels take 64 and 128 where they apply); attention.cu keeps the first kernels as the reference
// path (KILN_ATTN=ref) and handles every other head size.
//
// Same math and conventions as attention.cu (scores s_ij = scale q_i.k_j + slope_h (j - i), log2 domain,
// P rounded to bf16 before P.V, lse in natural log). What changed, and why (docs/perf_notes.md has numbers):
//   - tiles arrive by cp.async (LDGSTS), double-buffered: the next K/V (or Q/dO) tile loads while the tensor
//     cores work on the current one; rows >= T are zero-filled by the copy itself;
//   - every mma operand comes from ldmatrix (LDSM, x4 and x4.trans), rows padded by 16 bytes (conflict free);
//   - forward and dQ: 128 queries per block (8 warps) for HS=64 share each K/V tile; warps whose 16 rows lie
//     wholly above a key tile skip it (causal), and only tiles on the diagonal or past T evaluate masks;
//   - RoPE is applied once by a small kernel into a scratch copy of q and k (bf16, rounded exactly as the
//     reference's load_tile rounds), and the gradients are rotated back in registers before the store;
//   - backward, default mode (cuda_ctx.deterministic == 0): FA-2's single pass, 5 matmuls: dK/dV of a key
//     block in registers over the query tiles, dQ added to an f32 scratch accumulator with vector atomics
//     (RED), then scaled, rotated back and rounded into dqkv by a small kernel. Not bitwise repeatable;
//   - backward, deterministic mode: two kernels (dK/dV over query tiles, then dQ over key tiles, S and dP
//     recomputed): no fp32 dQ accumulator, no atomics, 7 matmuls.
#include <math.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/attention/attn_common.cuh"

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

struct fa_params {
    const bf16 *q, *k, *v; // row t of batch b, head h at q + (b T + t) q_rs + h HS (k, v: kv head)
    int q_rs, k_rs, v_rs;
    bf16 *out;        // (B, T, NH HS)
    float *lse;       // (B, NH, T)
    const bf16 *dout; // (B, T, NH HS)
    const float *dsum;
    bf16 *dqkv;                     // (B, T, (NH + 2 NKV) HS), rows rs apart
    const float *cos_tab, *sin_tab; // set in backward with RoPE: rotate dq, dk back
    int B, T, NH, NKV, rs;          // rs: dqkv row stride ((NH + 2 NKV) HS, or wider: the parallel block)
    int alibi;
    float scale, scale_log2;
    float *dq_acc; // single-pass backward: unscaled dQ in the rotated frame, f32 (B, T, NH, HS), zeroed first
};

// ---- fragment loads (m16n8k16 bf16, row.col)
// ---------------------------------------------------------------- A (16 x 16) at rows r0.., columns k0.. of
// a row-major smem tile: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in the order a0 (r, k), a1 (r+8, k),
// a2 (r, k+8), a3 (r+8, k+8).
template <int LD> static __device__ __forceinline__ void frag_a(uint32_t *a, const bf16 *s, int r0, int k0) {
    int l = threadIdx.x & 31;
    ldmatrix_x4(a, s + (r0 + (l & 7) + ((l >> 3) & 1) * 8) * LD + k0 + (l >> 4) * 8);
}
// B of two n tiles (n0..n0+7, n0+8..n0+15) at k0.., from a tile stored [n][k]: b[0], b[1] for the first n
// tile, b[2], b[3] for the second.
template <int LD> static __device__ __forceinline__ void frag_b(uint32_t *b, const bf16 *s, int n0, int k0) {
    int l = threadIdx.x & 31;
    ldmatrix_x4(b, s + (n0 + (l & 7) + (l >> 4) * 8) * LD + k0 + ((l >> 3) & 1) * 8);
}
// Same, from a tile stored [k][n] (transposed on load).
template <int LD> static __device__ __forceinline__ void frag_bt(uint32_t *b, const bf16 *s, int k0, int n0) {
    int l = threadIdx.x & 31;
    ldmatrix_x4_trans(b, s + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * LD + n0 + (l >> 4) * 8);
}
// A (16 x 16) at rows m0.., columns k0.., from a tile stored [k][m] (transposed on load): matrices a0 (m, k),
// a1 (m+8, k), a2 (m, k+8), a3 (m+8, k+8) are stored rows k.. / k+8.., columns m.. / m+8..
template <int LD> static __device__ __forceinline__ void frag_at(uint32_t *a, const bf16 *s, int k0, int m0) {
    int l = threadIdx.x & 31;
    ldmatrix_x4_trans(a, s + (k0 + (l & 7) + (l >> 4) * 8) * LD + m0 + ((l >> 3) & 1) * 8);
}

// g[0] += x, g[1] += y (global, 8-byte aligned), no result: one vector reduction (RED) on sm_90, two on
// older GPUs
static __device__ __forceinline__ void fa_red2(float *g, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(g), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(g, x);
    atomicAdd(g + 1, y);
#endif
}

// C (16 x 8 NT) += A (16 x HS, fragments in registers or loaded from smem rows a_r0) . Bs[n0 .. n0 + 8 NT)^T
template <int HS, int NT, int LD, bool AREG>
static __device__ __forceinline__ void mm_abt(float (*c)[4], const uint32_t (*areg)[4], const bf16 *As,
                                              int a_r0, const bf16 *Bs) {
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t a[4];
        if (AREG) {
            a[0] = areg[kk][0];
            a[1] = areg[kk][1];
            a[2] = areg[kk][2];
            a[3] = areg[kk][3];
        } else {
            frag_a<LD>(a, As, a_r0, kk * 16);
        }
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t b[4];
            frag_b<LD>(b, Bs, np * 16, kk * 16);
            mma_bf16(c[2 * np], a, b[0], b[1]);
            mma_bf16(c[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// O (16 x HS) += P (16 x 16 KT, C fragments p[2 KT][4], rounded to bf16) . Vs (16 KT rows x HS, [k][n])
template <int HS, int KT, int LD>
static __device__ __forceinline__ void mm_pv(float (*o)[4], const float (*p)[4], const bf16 *Vs) {
#pragma unroll
    for (int kk = 0; kk < KT; kk++) {
        uint32_t a[4];
        a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
        a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
        a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < HS / 16; dp++) {
            uint32_t b[4];
            frag_bt<LD>(b, Vs, kk * 16, dp * 16);
            mma_bf16(o[2 * dp], a, b[0], b[1]);
            mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

// Rows [row0, row0 + NR) of one head (g0 = row 0 of that head) into smem (row stride HS + 8), NTH threads.
template <int HS, int NR, int NTH>
static __device__ __forceinline__ void tile_async(bf16 *sm, const bf16 *g0, int rs, int row0, int T) {
    constexpr int CH = HS / 8, LD = HS + 8, N = NR * CH;
#pragma unroll
    for (int i = 0; i < (N + NTH - 1) / NTH; i++) {
        int idx = i * NTH + threadIdx.x, r = idx / CH, c = idx % CH, t = row0 + r;
        if (N % NTH != 0 && idx >= N) // (HS 48, 80, 96: the chunks need not divide among the threads)
            break;
        int ok = t < T;
        cp_async16(sm + r * LD + c * 8, g0 + (size_t)(ok ? t : 0) * rs + c * 8, ok);
    }
}

template <int HS> static __device__ __forceinline__ void zero_acc(float (*x)[4]) {
#pragma unroll
    for (int i = 0; i < HS / 8; i++)
        x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.0f;
}

// Inverse RoPE of a gradient in C fragments (16 rows x HS): columns d and d + HS/2 are fragments dt and
// dt + HS/16 of the same thread.

// ---- RoPE pre-rotation -----------------------------------------------------------------------------------
// qr (B, T, NH, HS), kr (B, T, NKV, HS) = rotated q, k of qkv (rows rs apart). One thread: 8 pairs (d, d +
// HS/2).
static __global__ void fa_rope_kernel(bf16 *qr, bf16 *kr, const bf16 *qkv, int rs, int BT, int T, int NH,
                                      int NKV, int HS, const float *ct, const float *st) {
    int half = HS / 2, cph = half / 8, heads = NH + NKV;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)BT * heads * cph)
        return;
    int c = (int)(i % cph);
    long r = i / cph;
    int hh = (int)(r % heads);
    long bt = r / heads;
    int t = (int)(bt % T), d0 = c * 8;
    const bf16 *src = qkv + bt * (long)rs + (long)hh * HS;
    bf16 *dst = hh < NH ? qr + (bt * NH + hh) * HS : kr + (bt * NKV + (hh - NH)) * HS;
    bf16x8 x, y, xo, yo;
    x.u = *(const uint4 *)(src + d0);
    y.u = *(const uint4 *)(src + d0 + half);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float cs = ct[t * half + d0 + k], sn = st[t * half + d0 + k];
        float a = bf2f(x.h[k]), b = bf2f(y.h[k]);
        xo.h[k] = f2bf(a * cs - b * sn);
        yo.h[k] = f2bf(b * cs + a * sn);
    }
    *(uint4 *)(dst + d0) = xo.u;
    *(uint4 *)(dst + d0 + half) = yo.u;
}

// ---- forward --------------------------------------------------------------------------------------------

// Block: NW warps x 16 query rows; key tiles of 64, double-buffered. QREG keeps Q's fragments in registers.
template <int HS, int NW, bool QREG, int MINB>
static __global__ void __launch_bounds__(NW * 32, MINB) fa_fwd_kernel(struct fa_params p) {
    constexpr int LD = HS + 8, BM = NW * 16, BN = 64, NTH = NW * 32;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *Qs = (bf16 *)fa_smem, *Ks = Qs + BM * LD, *Vs = Ks + 2 * BN * LD; // Ks, Vs: [2][BN][LD]
    int qt = gridDim.x - 1 - blockIdx.x;                                    // longest query tiles first
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int q0 = qt * BM, wq0 = q0 + warp * 16;
    const bf16 *qg = p.q + (size_t)b * p.T * p.q_rs + h * HS;
    const bf16 *kg = p.k + (size_t)b * p.T * p.k_rs + kvh * HS;
    const bf16 *vg = p.v + (size_t)b * p.T * p.v_rs + kvh * HS;
    float slope2 = p.alibi ? alibi_slope(h, p.NH) * FA_LOG2E : 0.0f;
    int n_kv = KILN_CEIL_DIV(min(q0 + BM, p.T), BN);

    tile_async<HS, BM, NTH>(Qs, qg, p.q_rs, q0, p.T);
    tile_async<HS, BN, NTH>(Ks, kg, p.k_rs, 0, p.T);
    tile_async<HS, BN, NTH>(Vs, vg, p.v_rs, 0, p.T);
    cp_async_commit();

    int qi[2] = {wq0 + g, wq0 + g + 8};
    float o[HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    zero_acc<HS>(o);
    uint32_t qf[QREG ? HS / 16 : 1][4];
    for (int j = 0; j < n_kv; j++) {
        if (j + 1 < n_kv) {
            int nb = (j + 1) & 1;
            tile_async<HS, BN, NTH>(Ks + nb * BN * LD, kg, p.k_rs, (j + 1) * BN, p.T);
            tile_async<HS, BN, NTH>(Vs + nb * BN * LD, vg, p.v_rs, (j + 1) * BN, p.T);
        }
        cp_async_commit(); // possibly empty: keeps "all but the newest group" meaning tile j
        cp_async_wait<1>();
        __syncthreads();
        if (QREG && j == 0) {
#pragma unroll
            for (int kk = 0; kk < (QREG ? HS / 16 : 0); kk++)
                frag_a<LD>(qf[kk], Qs, warp * 16, kk * 16);
        }
        int k0 = j * BN;
        if (k0 <= wq0 + 15) { // else every key of the tile is above all 16 rows of this warp
            const bf16 *Kb = Ks + (j & 1) * BN * LD, *Vb = Vs + (j & 1) * BN * LD;
            float s[BN / 8][4];
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            mm_abt<HS, BN / 8, LD, QREG>(s, qf, Qs, warp * 16, Kb);
            float alpha[2];
            attn_online_softmax<BN>(&s[0][0], m, l, alpha, k0, qi, t4, p.alibi, slope2, p.scale_log2, p.T,
                                    k0 + BN - 1 > wq0 || k0 + BN > p.T);
#pragma unroll
            for (int dt = 0; dt < HS / 8; dt++) {
                o[dt][0] *= alpha[0];
                o[dt][1] *= alpha[0];
                o[dt][2] *= alpha[1];
                o[dt][3] *= alpha[1];
            }
            mm_pv<HS, BN / 16, LD>(o, s, Vb);
        }
        __syncthreads(); // buffer j & 1 is refilled at iteration j + 1
    }
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = 1.0f / l[r];
    }
    store_frag<HS>(p.out + (size_t)b * p.T * p.NH * HS + h * HS, p.NH * HS, qi[0], qi[1], p.T, o, inv[0],
                   inv[1]);
    if (t4 == 0) {
        float *lg = p.lse + ((size_t)b * p.NH + h) * p.T;
        if (qi[0] < p.T)
            lg[qi[0]] = (m[0] + __log2f(l[0])) * FA_LN2;
        if (qi[1] < p.T)
            lg[qi[1]] = (m[1] + __log2f(l[1])) * FA_LN2;
    }
}

// ---- backward -------------------------------------------------------------------------------------------

// Lanes of a row in fa_dsum_kernel: HS / 8 rounded up to a power of two (a shuffle reduction's width).
static constexpr __host__ __device__ int fa_dsum_lanes(int HS) {
    return HS / 8 <= 4 ? 4 : HS / 8 <= 8 ? 8 : HS / 8 <= 16 ? 16 : 32;
}

// dsum[b, h, t] = sum_d dout * out; fa_dsum_lanes(HS) lanes per row, HS / 8 of them loading 16 bytes each.
template <int HS>
static __global__ void fa_dsum_kernel(float *dsum, const bf16 *dout, const bf16 *out, int rows, int T,
                                      int NH) {
    constexpr int CH = fa_dsum_lanes(HS);
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long row = i / CH;
    int c = (int)(i % CH);
    float s = 0.0f;
    if (row < rows && c < HS / 8) {
        bf16x8 d, o;
        d.u = *(const uint4 *)(dout + row * HS + c * 8);
        o.u = *(const uint4 *)(out + row * HS + c * 8);
#pragma unroll
        for (int k = 0; k < 8; k++)
            s += bf2f(d.h[k]) * bf2f(o.h[k]);
    }
#pragma unroll
    for (int off = CH / 2; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    if (row < rows && c == 0) { // row = (b T + t) NH + h
        int h = (int)(row % NH);
        long bt = row / NH;
        long b = bt / T, t = bt % T;
        dsum[(b * NH + h) * T + t] = s;
    }
}

// dK, dV for 64 keys of one kv head (4 warps x 16 keys), summed over the group's query heads and the query
// tiles (BM queries each) at or below the diagonal. Q, dO, lse, dsum of the next tile load during this one.
template <int HS, int BM, bool KREG, int MINB>
static __global__ void __launch_bounds__(128, MINB) fa_bwd_dkdv_kernel(struct fa_params p) {
    constexpr int LD = HS + 8, BN = 64, NTH = 128;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *Ks = (bf16 *)fa_smem, *Vs = Ks + BN * LD, *Qs = Vs + BN * LD,
         *dOs = Qs + 2 * BM * LD;                                        // [2][BM][LD]
    float *lse_s = (float *)(dOs + 2 * BM * LD), *ds_s = lse_s + 2 * BM; // [2][BM]
    int kt = blockIdx.x; // key tile 0 sees the most queries: blocks go out in index order, so it starts first
    int b = blockIdx.y / p.NKV, kvh = blockIdx.y % p.NKV, group = p.NH / p.NKV;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int k0 = kt * BN, wk0 = k0 + warp * 16;
    const bf16 *qb = p.q + (size_t)b * p.T * p.q_rs, *dob = p.dout + (size_t)b * p.T * p.NH * HS;
    int qt0 = k0 / BM, n_q = KILN_CEIL_DIV(p.T, BM) - qt0, n_it = group * n_q;

    tile_async<HS, BN, NTH>(Ks, p.k + (size_t)b * p.T * p.k_rs + kvh * HS, p.k_rs, k0, p.T);
    tile_async<HS, BN, NTH>(Vs, p.v + (size_t)b * p.T * p.v_rs + kvh * HS, p.v_rs, k0, p.T);
    { // iteration 0: head kvh * group, query tile qt0
        int h = kvh * group, q0 = qt0 * BM;
        tile_async<HS, BM, NTH>(Qs, qb + h * HS, p.q_rs, q0, p.T);
        tile_async<HS, BM, NTH>(dOs, dob + h * HS, p.NH * HS, q0, p.T);
        for (int i = threadIdx.x; i < BM; i += NTH) {
            size_t o = ((size_t)b * p.NH + h) * p.T + q0 + i;
            lse_s[i] = q0 + i < p.T ? p.lse[o] * FA_LOG2E : 0.0f;
            ds_s[i] = q0 + i < p.T ? p.dsum[o] : 0.0f;
        }
    }
    cp_async_commit();

    float dk[HS / 8][4], dv[HS / 8][4];
    zero_acc<HS>(dk);
    zero_acc<HS>(dv);
    int kj[2] = {wk0 + g, wk0 + g + 8};
    uint32_t kf[KREG ? HS / 16 : 1][4], vf[KREG ? HS / 16 : 1][4];
    for (int it = 0; it < n_it; it++) {
        int h = kvh * group + it / n_q, q0 = (qt0 + it % n_q) * BM, buf = it & 1;
        float nl = 0.0f, nd = 0.0f; // lse, dsum of the next tile, stored to smem after this tile's math
        int nq0 = 0;
        if (it + 1 < n_it) {
            int nh = kvh * group + (it + 1) / n_q;
            nq0 = (qt0 + (it + 1) % n_q) * BM;
            tile_async<HS, BM, NTH>(Qs + (buf ^ 1) * BM * LD, qb + nh * HS, p.q_rs, nq0, p.T);
            tile_async<HS, BM, NTH>(dOs + (buf ^ 1) * BM * LD, dob + nh * HS, p.NH * HS, nq0, p.T);
            if (threadIdx.x < BM && nq0 + (int)threadIdx.x < p.T) {
                size_t o = ((size_t)b * p.NH + nh) * p.T + nq0 + threadIdx.x;
                nl = p.lse[o] * FA_LOG2E;
                nd = p.dsum[o];
            }
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (KREG && it == 0) {
#pragma unroll
            for (int kk = 0; kk < (KREG ? HS / 16 : 0); kk++) {
                frag_a<LD>(kf[kk], Ks, warp * 16, kk * 16);
                frag_a<LD>(vf[kk], Vs, warp * 16, kk * 16);
            }
        }
        if (q0 + BM - 1 >= wk0) { // else every query of the tile precedes all 16 keys of this warp
            const bf16 *Qb = Qs + buf * BM * LD, *dOb = dOs + buf * BM * LD;
            const float *ls = lse_s + buf * BM, *dss = ds_s + buf * BM;
            float slope2 = p.alibi ? alibi_slope(h, p.NH) * FA_LOG2E : 0.0f;
            // S^T (16 keys x BM queries) = K Q^T, dP^T = V dO^T
            float st[BM / 8][4], dpt[BM / 8][4];
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++)
                st[nt][0] = st[nt][1] = st[nt][2] = st[nt][3] = dpt[nt][0] = dpt[nt][1] = dpt[nt][2] =
                    dpt[nt][3] = 0.0f;
            mm_abt<HS, BM / 8, LD, KREG>(st, kf, Ks, warp * 16, Qb);
            mm_abt<HS, BM / 8, LD, KREG>(dpt, vf, Vs, warp * 16, dOb);
            bool need_mask = q0 < wk0 + 15 || q0 + BM > p.T || wk0 + 16 > p.T;
            float
                kb[2]; // ALiBi slope2 (kr - qi) = kb[key] - slope2 (8 nt + e % 2): no int-to-float per score
            attn_alibi_bases(kb, slope2, kj, q0 + 2 * t4, -1);
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int ql = nt * 8 + t4 * 2 + (e & 1), qi = q0 + ql, kr = kj[e >> 1];
                    float bias = fmaf(-slope2, (float)(nt * 8 + (e & 1)), kb[e >> 1]);
                    float pv = exp2f(fmaf(st[nt][e], p.scale_log2, bias - ls[ql]));
                    if (need_mask && (qi < kr || qi >= p.T || kr >= p.T))
                        pv = 0.0f;
                    st[nt][e] = pv;                           // P^T
                    dpt[nt][e] = pv * (dpt[nt][e] - dss[ql]); // dS^T (unscaled)
                }
            mm_pv<HS, BM / 16, LD>(dv, st, dOb);
            mm_pv<HS, BM / 16, LD>(dk, dpt, Qb);
        }
        if (it + 1 < n_it && threadIdx.x < BM) {
            lse_s[(buf ^ 1) * BM + threadIdx.x] = nl;
            ds_s[(buf ^ 1) * BM + threadIdx.x] = nd;
        }
        __syncthreads(); // buffer buf is refilled at iteration it + 1
    }
    if (p.cos_tab)
        rope_back_frag<HS>(dk, kj[0], kj[1], p.T, p.cos_tab, p.sin_tab);
    bf16 *dbase = p.dqkv + (size_t)b * p.T * p.rs;
    store_frag<HS>(dbase + (p.NH + kvh) * HS, p.rs, kj[0], kj[1], p.T, dk, p.scale, p.scale);
    store_frag<HS>(dbase + (p.NH + p.NKV + kvh) * HS, p.rs, kj[0], kj[1], p.T, dv, 1.0f, 1.0f);
}

// dQ for NW x 16 queries of one head: S and dP recomputed over the key tiles up to the diagonal, K/V
// double-buffered. QREG keeps Q's and dO's fragments in registers.
template <int HS, int NW, bool QREG, int BN, int MINB>
static __global__ void __launch_bounds__(NW * 32, MINB) fa_bwd_dq_kernel(struct fa_params p) {
    constexpr int LD = HS + 8, BM = NW * 16, NTH = NW * 32;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *Qs = (bf16 *)fa_smem, *dOs = Qs + BM * LD, *Ks = dOs + BM * LD, *Vs = Ks + 2 * BN * LD;
    int qt = gridDim.x - 1 - blockIdx.x;
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int q0 = qt * BM, wq0 = q0 + warp * 16;
    const bf16 *kg = p.k + (size_t)b * p.T * p.k_rs + kvh * HS;
    const bf16 *vg = p.v + (size_t)b * p.T * p.v_rs + kvh * HS;
    float slope2 = p.alibi ? alibi_slope(h, p.NH) * FA_LOG2E : 0.0f;
    int n_kv = KILN_CEIL_DIV(min(q0 + BM, p.T), BN);

    tile_async<HS, BM, NTH>(Qs, p.q + (size_t)b * p.T * p.q_rs + h * HS, p.q_rs, q0, p.T);
    tile_async<HS, BM, NTH>(dOs, p.dout + (size_t)b * p.T * p.NH * HS + h * HS, p.NH * HS, q0, p.T);
    tile_async<HS, BN, NTH>(Ks, kg, p.k_rs, 0, p.T);
    tile_async<HS, BN, NTH>(Vs, vg, p.v_rs, 0, p.T);
    cp_async_commit();

    int qi[2] = {wq0 + g, wq0 + g + 8};
    float lse2[2], dsum[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        size_t o = ((size_t)b * p.NH + h) * p.T + qi[r];
        lse2[r] = qi[r] < p.T ? p.lse[o] * FA_LOG2E : 0.0f;
        dsum[r] = qi[r] < p.T ? p.dsum[o] : 0.0f;
    }
    float dq[HS / 8][4];
    zero_acc<HS>(dq);
    uint32_t qf[QREG ? HS / 16 : 1][4], df[QREG ? HS / 16 : 1][4];
    for (int j = 0; j < n_kv; j++) {
        if (j + 1 < n_kv) {
            int nb = (j + 1) & 1;
            tile_async<HS, BN, NTH>(Ks + nb * BN * LD, kg, p.k_rs, (j + 1) * BN, p.T);
            tile_async<HS, BN, NTH>(Vs + nb * BN * LD, vg, p.v_rs, (j + 1) * BN, p.T);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (QREG && j == 0) {
#pragma unroll
            for (int kk = 0; kk < (QREG ? HS / 16 : 0); kk++) {
                frag_a<LD>(qf[kk], Qs, warp * 16, kk * 16);
                frag_a<LD>(df[kk], dOs, warp * 16, kk * 16);
            }
        }
        int k0 = j * BN;
        if (k0 <= wq0 + 15) {
            const bf16 *Kb = Ks + (j & 1) * BN * LD, *Vb = Vs + (j & 1) * BN * LD;
            float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] =
                    0.0f;
            mm_abt<HS, BN / 8, LD, QREG>(s, qf, Qs, warp * 16, Kb);
            mm_abt<HS, BN / 8, LD, QREG>(dp, df, dOs, warp * 16, Vb);
            bool need_mask = k0 + BN - 1 > wq0 || k0 + BN > p.T;
            float
                rb[2]; // ALiBi slope2 (kj - qi) = rb[row] + slope2 (8 nt + e % 2): no int-to-float per score
            attn_alibi_bases(rb, slope2, qi, k0 + 2 * t4, 1);
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = e >> 1, kj = k0 + nt * 8 + t4 * 2 + (e & 1);
                    float bias = fmaf(slope2, (float)(nt * 8 + (e & 1)), rb[r]);
                    float pv = exp2f(fmaf(s[nt][e], p.scale_log2, bias - lse2[r]));
                    if (need_mask && (kj > qi[r] || kj >= p.T || qi[r] >= p.T))
                        pv = 0.0f;
                    dp[nt][e] = pv * (dp[nt][e] - dsum[r]); // dS (unscaled)
                }
            mm_pv<HS, BN / 16, LD>(dq, dp, Kb);
        }
        __syncthreads();
    }
    if (p.cos_tab)
        rope_back_frag<HS>(dq, qi[0], qi[1], p.T, p.cos_tab, p.sin_tab);
    store_frag<HS>(p.dqkv + (size_t)b * p.T * p.rs + h * HS, p.rs, qi[0], qi[1], p.T, dq, p.scale, p.scale);
}

// ---- single-pass backward (default mode) -----------------------------------------------------------------

// FA-2's backward, for cuda_ctx.deterministic == 0: one block per BN = NW x 16 keys of one kv head (warp w
// owns keys w 16 .. w 16 + 15 and keeps their dK, dV in registers), looping over the group's query heads and
// the query tiles of BM from the diagonal on. Per tile: S^T = K Q^T and dP^T = V dO^T per warp, dV += P^T dO,
// dK += dS^T Q, dS^T (bf16) to shared memory; then dQ (BM x HS) += dS K, split into BM/16 row groups x CW
// column groups of HS/CW (one per warp), added to p.dq_acc with float2 atomics. 5 matmuls instead of 7; the
// atomics make dQ's rounding order-dependent (not bitwise repeatable). fa_dq_convert_kernel scales and
// rotates dq_acc into dqkv afterwards.
// Barriers: two per tile. The first (after the tile's copy landed) also means every warp is done with the
// previous tile, so the next tile's copy into the other buffer, its lse/dsum and this tile's dS^T may start;
// the second publishes dS^T to the dQ phase.
template <int HS, int NW, int BM, bool KREG, int MINB>
static __global__ void __launch_bounds__(NW * 32, MINB) fa_bwd_fused_kernel(struct fa_params p) {
    constexpr int LD = HS + 8, BN = NW * 16, NTH = NW * 32, LDS = BM + 8;
    constexpr int RW = BM / 16, CW = NW / RW, HSW = HS / CW; // dQ phase: row groups, column groups, width
    static_assert(BM % 16 == 0 && NW % RW == 0 && HSW % 16 == 0, "dQ phase: warps must tile BM x HS");
    static_assert(BM <= NTH, "one thread per query row loads lse and dsum");
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *Ks = (bf16 *)fa_smem, *Vs = Ks + BN * LD, *Qs = Vs + BN * LD; // Ks, Vs: [BN][LD]
    bf16 *dOs = Qs + 2 * BM * LD, *dSs = dOs + 2 * BM * LD;           // Qs, dOs: [2][BM][LD]; dSs: [BN][LDS]
    float *lse_s = (float *)(dSs + BN * LDS), *ds_s = lse_s + 2 * BM; // [2][BM]
    int kt = blockIdx.x; // key tile 0 sees the most queries: blocks go out in index order, so it starts first
    int b = blockIdx.y / p.NKV, kvh = blockIdx.y % p.NKV, group = p.NH / p.NKV;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int k0 = kt * BN, wk0 = k0 + warp * 16;
    int rg = warp % RW, c0 = (warp / RW) * HSW; // this warp's dQ rows rg 16 .., columns c0 ..
    const bf16 *qb = p.q + (size_t)b * p.T * p.q_rs, *dob = p.dout + (size_t)b * p.T * p.NH * HS;
    int qt0 = k0 / BM, n_q = KILN_CEIL_DIV(p.T, BM) - qt0, n_it = group * n_q;

    tile_async<HS, BN, NTH>(Ks, p.k + (size_t)b * p.T * p.k_rs + kvh * HS, p.k_rs, k0, p.T);
    tile_async<HS, BN, NTH>(Vs, p.v + (size_t)b * p.T * p.v_rs + kvh * HS, p.v_rs, k0, p.T);
    { // iteration 0: head kvh * group, query tile qt0
        int h = kvh * group, q0 = qt0 * BM;
        tile_async<HS, BM, NTH>(Qs, qb + h * HS, p.q_rs, q0, p.T);
        tile_async<HS, BM, NTH>(dOs, dob + h * HS, p.NH * HS, q0, p.T);
        for (int i = threadIdx.x; i < BM; i += NTH) {
            size_t o = ((size_t)b * p.NH + h) * p.T + q0 + i;
            lse_s[i] = q0 + i < p.T ? p.lse[o] * FA_LOG2E : 0.0f;
            ds_s[i] = q0 + i < p.T ? p.dsum[o] : 0.0f;
        }
    }
    cp_async_commit();

    float dk[HS / 8][4], dv[HS / 8][4];
    zero_acc<HS>(dk);
    zero_acc<HS>(dv);
    int kj[2] = {wk0 + g, wk0 + g + 8};
    uint32_t kf[KREG ? HS / 16 : 1][4], vf[KREG ? HS / 16 : 1][4];
    for (int it = 0; it < n_it; it++) {
        int h = kvh * group + it / n_q, q0 = (qt0 + it % n_q) * BM, buf = it & 1;
        cp_async_wait<0>(); // tile it (the only group in flight)
        __syncthreads();
        float nl = 0.0f, nd = 0.0f; // lse, dsum of the next tile, stored to smem after this tile's math
        if (it + 1 < n_it) {
            int nh = kvh * group + (it + 1) / n_q, nq0 = (qt0 + (it + 1) % n_q) * BM;
            tile_async<HS, BM, NTH>(Qs + (buf ^ 1) * BM * LD, qb + nh * HS, p.q_rs, nq0, p.T);
            tile_async<HS, BM, NTH>(dOs + (buf ^ 1) * BM * LD, dob + nh * HS, p.NH * HS, nq0, p.T);
            if (threadIdx.x < BM && nq0 + (int)threadIdx.x < p.T) {
                size_t o = ((size_t)b * p.NH + nh) * p.T + nq0 + threadIdx.x;
                nl = p.lse[o] * FA_LOG2E;
                nd = p.dsum[o];
            }
            cp_async_commit();
        }
        if (KREG && it == 0) {
#pragma unroll
            for (int kk = 0; kk < (KREG ? HS / 16 : 0); kk++) {
                frag_a<LD>(kf[kk], Ks, warp * 16, kk * 16);
                frag_a<LD>(vf[kk], Vs, warp * 16, kk * 16);
            }
        }
        const bf16 *Qb = Qs + buf * BM * LD, *dOb = dOs + buf * BM * LD;
        if (q0 + BM - 1 >= wk0) { // else every query of the tile precedes all 16 keys of this warp
            const float *ls = lse_s + buf * BM, *dss = ds_s + buf * BM;
            float slope2 = p.alibi ? alibi_slope(h, p.NH) * FA_LOG2E : 0.0f;
            // S^T (16 keys x BM queries) = K Q^T, dP^T = V dO^T
            float st[BM / 8][4], dpt[BM / 8][4];
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++)
                st[nt][0] = st[nt][1] = st[nt][2] = st[nt][3] = dpt[nt][0] = dpt[nt][1] = dpt[nt][2] =
                    dpt[nt][3] = 0.0f;
            mm_abt<HS, BM / 8, LD, KREG>(st, kf, Ks, warp * 16, Qb);
            mm_abt<HS, BM / 8, LD, KREG>(dpt, vf, Vs, warp * 16, dOb);
            bool need_mask = q0 < wk0 + 15 || q0 + BM > p.T || wk0 + 16 > p.T;
            float
                kb[2]; // ALiBi slope2 (kr - qi) = kb[key] - slope2 (8 nt + e % 2): no int-to-float per score
            attn_alibi_bases(kb, slope2, kj, q0 + 2 * t4, -1);
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int ql = nt * 8 + t4 * 2 + (e & 1), qi = q0 + ql, kr = kj[e >> 1];
                    float bias = fmaf(-slope2, (float)(nt * 8 + (e & 1)), kb[e >> 1]);
                    float pv = exp2f(fmaf(st[nt][e], p.scale_log2, bias - ls[ql]));
                    if (need_mask && (qi < kr || qi >= p.T || kr >= p.T))
                        pv = 0.0f;
                    st[nt][e] = pv;                           // P^T
                    dpt[nt][e] = pv * (dpt[nt][e] - dss[ql]); // dS^T (unscaled)
                }
            mm_pv<HS, BM / 16, LD>(dv, st, dOb);
            mm_pv<HS, BM / 16, LD>(dk, dpt, Qb);
            // dS^T rows warp 16 + g (+ 8), columns (queries) nt 8 + 2 t4 (+ 1): rounded as mm_pv rounds it
            bf16 *drow = dSs + (warp * 16 + g) * LDS + t4 * 2;
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++) {
                *(uint32_t *)(drow + nt * 8) = pack_bf16(dpt[nt][0], dpt[nt][1]);
                *(uint32_t *)(drow + 8 * LDS + nt * 8) = pack_bf16(dpt[nt][2], dpt[nt][3]);
            }
        }
        if (it + 1 < n_it && threadIdx.x < BM) {
            lse_s[(buf ^ 1) * BM + threadIdx.x] = nl;
            ds_s[(buf ^ 1) * BM + threadIdx.x] = nd;
        }
        __syncthreads(); // dS^T of every warp that had work is in dSs
        // dQ rows qr0 .. qr0 + 15 of the tile: key steps kk (keys k0 + 16 kk ..) up to the last row's
        // diagonal; those are exactly warps that computed dS^T above (their keys start at or before
        // qr0 + 15 <= q0 + BM - 1), so stale rows of skipped warps are never read.
        int qr0 = q0 + rg * 16;
        if (qr0 < p.T && qr0 + 15 >= k0) {
            int nk = min(BN / 16, (qr0 + 15 - k0) / 16 + 1);
            float dq[HSW / 8][4];
#pragma unroll
            for (int i = 0; i < HSW / 8; i++)
                dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                if (kk < nk) {
                    uint32_t a[4];
                    frag_at<LDS>(a, dSs, kk * 16, rg * 16);
#pragma unroll
                    for (int dp = 0; dp < HSW / 16; dp++) {
                        uint32_t bb[4];
                        frag_bt<LD>(bb, Ks, kk * 16, c0 + dp * 16);
                        mma_bf16(dq[2 * dp], a, bb[0], bb[1]);
                        mma_bf16(dq[2 * dp + 1], a, bb[2], bb[3]);
                    }
                }
            }
            size_t rstride = (size_t)p.NH * HS;
            float *dqg = p.dq_acc + ((size_t)b * p.T * p.NH + h) * HS + c0 + t4 * 2;
            int qlo = qr0 + g, qhi = qlo + 8;
#pragma unroll
            for (int dt = 0; dt < HSW / 8; dt++) {
                if (qlo < p.T)
                    fa_red2(dqg + (size_t)qlo * rstride + dt * 8, dq[dt][0], dq[dt][1]);
                if (qhi < p.T)
                    fa_red2(dqg + (size_t)qhi * rstride + dt * 8, dq[dt][2], dq[dt][3]);
            }
        }
    }
    if (p.cos_tab)
        rope_back_frag<HS>(dk, kj[0], kj[1], p.T, p.cos_tab, p.sin_tab);
    bf16 *dbase = p.dqkv + (size_t)b * p.T * p.rs;
    store_frag<HS>(dbase + (p.NH + kvh) * HS, p.rs, kj[0], kj[1], p.T, dk, p.scale, p.scale);
    store_frag<HS>(dbase + (p.NH + p.NKV + kvh) * HS, p.rs, kj[0], kj[1], p.T, dv, 1.0f, 1.0f);
}

// dqkv's q slice (B, T, NH HS at row stride rs, bf16) = scale R(t)^-1 acc, acc f32 (B, T, NH, HS); R(t) the
// RoPE rotation when ct != NULL (pairs d, d + HS/2, as rope_back_frag). One thread: 4 pairs, 16-byte loads.
template <int HS>
static __global__ void fa_dq_convert_kernel(bf16 *dqkv, const float *acc, long n, int T, int NH, int rs,
                                            float scale, const float *ct, const float *st) {
    constexpr int half = HS / 2, CPH = half / 4;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) // n = B T NH CPH
        return;
    int c = (int)(i % CPH), d0 = c * 4;
    long r = i / CPH; // (b T + t) NH + h
    int h = (int)(r % NH);
    long bt = r / NH;
    int t = (int)(bt % T);
    float4 xv = *(const float4 *)(acc + r * HS + d0), yv = *(const float4 *)(acc + r * HS + d0 + half);
    float x[4] = {xv.x, xv.y, xv.z, xv.w}, y[4] = {yv.x, yv.y, yv.z, yv.w};
    if (ct) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float cs = ct[t * half + d0 + k], sn = st[t * half + d0 + k], a = x[k], bb = y[k];
            x[k] = a * cs + bb * sn;
            y[k] = bb * cs - a * sn;
        }
    }
    __nv_bfloat162 xo[2] = {__floats2bfloat162_rn(x[0] * scale, x[1] * scale),
                            __floats2bfloat162_rn(x[2] * scale, x[3] * scale)};
    __nv_bfloat162 yo[2] = {__floats2bfloat162_rn(y[0] * scale, y[1] * scale),
                            __floats2bfloat162_rn(y[2] * scale, y[3] * scale)};
    bf16 *dst = dqkv + bt * rs + (long)h * HS;
    *(uint2 *)(dst + d0) = *(uint2 *)xo;
    *(uint2 *)(dst + d0 + half) = *(uint2 *)yo;
}

// ---- launchers ------------------------------------------------------------------------------------------

// Tile configuration: KILN_FA_VARIANT=1 (or 2: single-pass backward only, elsewhere as 1) picks alternative
// shapes, so one benchmark run can compare them (kiln_cuda_set_kernel); 0 (default) is the one expected to be
// faster. The values are "0", "1", "2": the index is the variant.
static int fa_variant(const struct cuda_ctx *c) {
    return c->kernel[KILN_KERNEL_FA_VARIANT];
}

static int fa_al16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

// The head sizes these kernels take (kiln_backend.attention_fast: the trainer says so when a model's is not
// one of them).
extern "C" int kiln_cuda_attention_fast(int HS) {
    return HS == 32 || HS == 48 || HS == 64 || HS == 80 || HS == 96 || HS == 128;
}

// Rows are copied in 16-byte chunks (cp.async, uint4): row strides must be multiples of 8 elements.
static int fa_applies(int HS, const void *p0, const void *p1, const void *p2, int rs) {
    return kiln_cuda_attention_fast(HS) && fa_al16(p0) && fa_al16(p1) && fa_al16(p2) && rs % 8 == 0;
}

// Calls f(std::integral_constant<int, HS>()) for each head size fa_applies takes.
template <typename F> static void fa_hs_dispatch(int HS, F f) {
    switch (HS) {
    case 32:
        f(std::integral_constant<int, 32>());
        break;
    case 48:
        f(std::integral_constant<int, 48>());
        break;
    case 64:
        f(std::integral_constant<int, 64>());
        break;
    case 80:
        f(std::integral_constant<int, 80>());
        break;
    case 96:
        f(std::integral_constant<int, 96>());
        break;
    default:
        KILN_ASSERT(HS == 128);
        f(std::integral_constant<int, 128>());
    }
}

static int fa_stride(int stride, int NH, int NKV, int HS) {
    return stride ? stride : (NH + 2 * NKV) * HS;
}

extern "C" const bf16 *kiln_cuda_fa_rope(struct cuda_ctx *c, const void *qkv, int qkv_rs, int B, int T,
                                         int NH, int NKV, int HS, float theta) {
    const float *st;
    const float *ct = kiln_cuda_rope_table(c, T, HS, theta, &st);
    size_t nq = (size_t)B * T * NH * HS, nk = (size_t)B * T * NKV * HS;
    bf16 *qr = (bf16 *)kiln_cuda_scratch(c, SCR_ATTN_ROT, (nq + nk) * sizeof(bf16));
    long n = (long)B * T * (NH + NKV) * (HS / 16);
    const bf16 *x = (const bf16 *)qkv;
    fa_rope_kernel<<<(unsigned)KILN_CEIL_DIV(n, 256), 256, 0, c->stream>>>(qr, qr + nq, x, qkv_rs, B * T, T,
                                                                           NH, NKV, HS, ct, st);
    CUDA_CHECK_LAUNCH();
    return qr;
}

// D = rowsum(dO * O) for the backward: (B, NH, T) f32 in scratch slot SCR_ATTN_D; returns it. fa_applies' HS.
extern "C" const float *kiln_cuda_fa_dsum(struct cuda_ctx *c, const void *dout, const void *out, int B, int T,
                                          int NH, int HS) {
    float *dsum = (float *)kiln_cuda_scratch(c, SCR_ATTN_D, (size_t)B * NH * T * sizeof(float));
    int rows = B * T * NH;
    long thr = (long)rows * fa_dsum_lanes(HS);
    unsigned nb = (unsigned)KILN_CEIL_DIV(thr, 256);
    const bf16 *d = (const bf16 *)dout, *o = (const bf16 *)out;
    fa_hs_dispatch(HS, [&](auto hs) {
        fa_dsum_kernel<decltype(hs)::value><<<nb, 256, 0, c->stream>>>(dsum, d, o, rows, T, NH);
    });
    CUDA_CHECK_LAUNCH();
    return dsum;
}

// dqkv's q slice = scale R(t)^-1 acc (acc: the f32 dQ accumulator (B, T, NH, HS), unscaled, rotated frame).
extern "C" void kiln_cuda_fa_dq_convert(struct cuda_ctx *c, bf16 *dqkv, const float *acc, int B, int T,
                                        int NH, int HS, int rs, float scale, const float *ct,
                                        const float *st) {
    long n = (long)B * T * NH * (HS / 8);
    unsigned nb = (unsigned)KILN_CEIL_DIV(n, 256);
    fa_hs_dispatch(HS, [&](auto hs) {
        fa_dq_convert_kernel<decltype(hs)::value>
            <<<nb, 256, 0, c->stream>>>(dqkv, acc, n, T, NH, rs, scale, ct, st);
    });
    CUDA_CHECK_LAUNCH();
}

// q, k, v pointers: straight from qkv (rows qkv_rs apart), or (RoPE) rotated copies in scratch. p.rs (dqkv's
// row stride) starts equal to qkv_rs.
static struct fa_params fa_setup(struct cuda_ctx *c, const void *qkv, int qkv_rs, int B, int T, int NH,
                                 int NKV, int HS, enum kiln_pos pos, float theta, const float **ct,
                                 const float **st) {
    struct fa_params p;
    memset(&p, 0, sizeof(p));
    const bf16 *x = (const bf16 *)qkv;
    p.B = B;
    p.T = T;
    p.NH = NH;
    p.NKV = NKV;
    p.rs = qkv_rs;
    p.alibi = pos == KILN_POS_ALIBI;
    p.scale = 1.0f / sqrtf((float)HS);
    p.scale_log2 = p.scale * FA_LOG2E;
    p.q = x;
    p.k = x + NH * HS;
    p.v = x + (NH + NKV) * HS;
    p.q_rs = p.k_rs = p.v_rs = p.rs;
    *ct = *st = NULL;
    if (pos == KILN_POS_ROPE) {
        *ct = kiln_cuda_rope_table(c, T, HS, theta, st);
        const bf16 *qr = kiln_cuda_fa_rope(c, qkv, qkv_rs, B, T, NH, NKV, HS, theta);
        p.q = qr;
        p.k = qr + (size_t)B * T * NH * HS;
        p.q_rs = NH * HS;
        p.k_rs = NKV * HS;
    }
    return p;
}

template <int HS, int NW, bool QREG, int MINB>
static void fa_fwd_launch(struct cuda_ctx *c, const struct fa_params &p) {
    constexpr int BM = NW * 16;
    size_t smem = (size_t)(BM + 4 * 64) * (HS + 8) * sizeof(bf16);
    set_smem(fa_fwd_kernel<HS, NW, QREG, MINB>, smem);
    dim3 grid(KILN_CEIL_DIV(p.T, BM), p.B * p.NH);
    fa_fwd_kernel<HS, NW, QREG, MINB><<<grid, NW * 32, smem, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
}

extern "C" int kiln_cuda_fa2_forward(struct cuda_ctx *c, const struct kiln_attn_args *a) {
    int rs = fa_stride(a->qkv_stride, a->NH, a->NKV, a->HS);
    if (!fa_applies(a->HS, a->qkv, a->out, a->qkv, rs))
        return 0;
    const float *ct, *st;
    struct fa_params p =
        fa_setup(c, a->qkv, rs, a->B, a->T, a->NH, a->NKV, a->HS, a->pos, a->rope_theta, &ct, &st);
    p.out = (bf16 *)a->out;
    p.lse = a->lse;
    int v = fa_variant(c);
    if (a->HS == 32) {
        // small models (shakespeare-char: 4 heads of 32): 64 queries per block, 4 blocks per SM (25 KiB of
        // shared memory each); variant 1: 128 queries, 2 blocks
        if (v == 0)
            fa_fwd_launch<32, 4, true, 4>(c, p);
        else
            fa_fwd_launch<32, 8, true, 2>(c, p);
    } else if (a->HS == 48 || a->HS == 80 || a->HS == 96) {
        // the head sizes between (one tile configuration each, not tuned: KILN_FA_VARIANT does not apply):
        // 64 queries per block, Q's fragments in registers
        if (a->HS == 48)
            fa_fwd_launch<48, 4, true, 3>(c, p);
        else if (a->HS == 80)
            fa_fwd_launch<80, 4, true, 2>(c, p);
        else
            fa_fwd_launch<96, 4, true, 2>(c, p);
    } else if (a->HS == 64) {
        // H100, 2026-11-21 (attn_bench): 64 queries per block and 3 blocks per SM beat 128 queries and 2
        // blocks by 15-18% at T = 1024..8192 (166 vs 140 TFLOP/s at B=32 T=1024 NH=12), so it is the default
        // here.
        if (v == 0)
            fa_fwd_launch<64, 4, true, 3>(c, p);
        else
            fa_fwd_launch<64, 8, true, 2>(c, p); // 128 queries per block, 2 blocks per SM (<= 128 registers)
    } else {
        if (v == 0)
            fa_fwd_launch<128, 8, false, 1>(c, p);
        else
            fa_fwd_launch<128, 4, false, 2>(c, p);
    }
    return 1;
}

// dK/dV: query tiles of BM, K/V fragments in registers if KREG, MINB1 blocks per SM;
// dQ: NWQ warps x 16 queries, key tiles of BNQ, Q/dO fragments in registers if QREG, MINB2 blocks per SM.
template <int HS, int BM, bool KREG, int MINB1, int NWQ, bool QREG, int BNQ, int MINB2>
static void fa_bwd_launch(struct cuda_ctx *c, const struct fa_params &p) {
    size_t s1 = (size_t)(2 * 64 + 4 * BM) * (HS + 8) * sizeof(bf16) + 4 * BM * sizeof(float);
    set_smem(fa_bwd_dkdv_kernel<HS, BM, KREG, MINB1>, s1);
    dim3 g1(KILN_CEIL_DIV(p.T, 64), p.B * p.NKV);
    fa_bwd_dkdv_kernel<HS, BM, KREG, MINB1><<<g1, 128, s1, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
    constexpr int BQ = NWQ * 16;
    size_t s2 = (size_t)(2 * BQ + 4 * BNQ) * (HS + 8) * sizeof(bf16);
    set_smem(fa_bwd_dq_kernel<HS, NWQ, QREG, BNQ, MINB2>, s2);
    dim3 g2(KILN_CEIL_DIV(p.T, BQ), p.B * p.NH);
    fa_bwd_dq_kernel<HS, NWQ, QREG, BNQ, MINB2><<<g2, NWQ * 32, s2, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
}

// Single-pass backward: NW warps x 16 keys per block, query tiles of BM, K/V fragments in registers if KREG,
// MINB blocks per SM; then dq_acc -> dqkv.
template <int HS, int NW, int BM, bool KREG, int MINB>
static void fa_bwd_fused_launch(struct cuda_ctx *c, const struct fa_params &p) {
    constexpr int BN = NW * 16;
    size_t smem = (size_t)(2 * BN + 4 * BM) * (HS + 8) * sizeof(bf16) + (size_t)BN * (BM + 8) * sizeof(bf16) +
                  4 * BM * sizeof(float);
    set_smem(fa_bwd_fused_kernel<HS, NW, BM, KREG, MINB>, smem);
    dim3 grid(KILN_CEIL_DIV(p.T, BN), p.B * p.NKV);
    fa_bwd_fused_kernel<HS, NW, BM, KREG, MINB><<<grid, NW * 32, smem, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
    kiln_cuda_fa_dq_convert(c, p.dqkv, p.dq_acc, p.B, p.T, p.NH, HS, p.rs, p.scale, p.cos_tab, p.sin_tab);
}

extern "C" int kiln_cuda_fa2_backward(struct cuda_ctx *c, const struct kiln_attn_back_args *a) {
    int rs = fa_stride(a->qkv_stride, a->NH, a->NKV, a->HS),
        drs = fa_stride(a->dqkv_stride, a->NH, a->NKV, a->HS);
    if (!fa_applies(a->HS, a->qkv, a->out, a->dout, rs) || !fa_al16(a->dqkv) || drs % 8 != 0)
        return 0;
    const float *ct, *st;
    struct fa_params p =
        fa_setup(c, a->qkv, rs, a->B, a->T, a->NH, a->NKV, a->HS, a->pos, a->rope_theta, &ct, &st);
    p.rs = drs;
    p.cos_tab = ct;
    p.sin_tab = st;
    p.lse = (float *)a->lse;
    p.dout = (const bf16 *)a->dout;
    p.dqkv = (bf16 *)a->dqkv;
    p.dsum = kiln_cuda_fa_dsum(c, a->dout, a->out, a->B, a->T, a->NH, a->HS);
    int v = fa_variant(c);
    if (!c->deterministic) { // single pass, dQ by atomics (float sums in arrival order)
        size_t nq = (size_t)a->B * a->T * a->NH * a->HS * sizeof(float);
        p.dq_acc = (float *)kiln_cuda_scratch(c, SCR_ATTN_DQ, nq);
        CUDA_CHECK(cudaMemsetAsync(p.dq_acc, 0, nq, c->stream));
        // ptxas (sm_90): HS 64: 247 / 242 / 168 registers (v2: 8 B spill); HS 128: 255 (4 B spill) / 255 (28
        // B spill) / 244. Keys per block set the dQ atomics (one HS row per key block and query row).
        if (a->HS == 32) {
            if (v == 0)
                fa_bwd_fused_launch<32, 4, 64, true, 3>(c, p); // 64 keys x 64 queries, 3 blocks per SM
            else if (v == 1)
                fa_bwd_fused_launch<32, 8, 64, true, 2>(c, p); // 128 keys
            else
                fa_bwd_fused_launch<32, 4, 32, true, 4>(c, p); // 64 x 32, 4 blocks per SM
        } else if (a->HS == 48) {
            fa_bwd_fused_launch<48, 4, 64, true, 2>(c, p); // as HS 64's
        } else if (a->HS == 80) {
            fa_bwd_fused_launch<80, 4, 64, false, 1>(c, p); // 64 x 64 (64 x 32 would split dQ's 80 columns)
        } else if (a->HS == 96) {
            fa_bwd_fused_launch<96, 4, 32, false, 2>(c, p); // as HS 128's
        } else if (a->HS == 64) {
            if (v == 0)
                fa_bwd_fused_launch<64, 4, 64, true, 2>(c, p); // 64 keys x 64 queries, 2 blocks per SM
            else if (v == 1)
                fa_bwd_fused_launch<64, 8, 64, true, 1>(c, p); // 128 keys: half the dQ atomics
            else
                fa_bwd_fused_launch<64, 4, 32, true, 3>(c, p); // 64 x 32, 3 blocks per SM
        } else {
            if (v == 0)
                fa_bwd_fused_launch<128, 4, 32, false, 2>(c, p); // 64 keys x 32 queries, 2 blocks per SM
            else if (v == 1)
                fa_bwd_fused_launch<128, 8, 32, false, 1>(c, p); // 128 keys x 32 queries
            else
                fa_bwd_fused_launch<128, 8, 16, false, 1>(c, p); // 128 keys x 16 queries
        }
        return 1;
    }
    if (a->HS == 32) {
        if (v == 0)
            fa_bwd_launch<32, 64, true, 2, 4, true, 64, 3>(c, p);
        else
            fa_bwd_launch<32, 32, true, 3, 4, true, 64, 3>(c, p);
    } else if (a->HS == 48) {
        fa_bwd_launch<48, 32, true, 2, 4, true, 64, 2>(c, p);
    } else if (a->HS == 80) {
        fa_bwd_launch<80, 32, false, 1, 4, false, 32, 2>(c, p);
    } else if (a->HS == 96) {
        fa_bwd_launch<96, 32, false, 1, 4, false, 32, 2>(c, p);
    } else if (a->HS == 64) {
        if (v == 0)
            fa_bwd_launch<64, 64, true, 1, 8, true, 64, 1>(c, p);
        else
            fa_bwd_launch<64, 32, true, 2, 4, true, 64, 2>(c, p);
    } else {
        if (v == 0)
            fa_bwd_launch<128, 32, false, 1, 4, false, 32, 2>(c, p);
        else
            fa_bwd_launch<128, 16, false, 2, 4, false, 32, 2>(c, p);
    }
    return 1;
}
