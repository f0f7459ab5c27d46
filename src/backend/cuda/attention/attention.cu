// Reference path (issue 4): for HS 64/128 the default kernels now live in attention_fa2.cu; the ones below run
// when KILN_ATTN=ref, for every other head size, and for decoding.
//
// Causal multi-head attention, FlashAttention-2 style: no (T, T) matrix in memory, bf16 tensor cores
// (mma.sync m16n8k16, fp32 accumulation), RoPE applied while tiles are loaded into shared memory, ALiBi added
// to the scores, GQA by indexing (query head h reads kv head h / (NH/NKV)), log-sum-exp saved for backward.
//
// Scores, in this op's convention:  s_ij = scale * q_i . k_j + slope_h * (j - i)   (j <= i), scale = HS^-1/2
//   lse_i = ln sum_j exp(s_ij);  out_i = sum_j exp(s_ij - lse_i) v_j.
// Kernels work in the log2 domain (exp2f), so scores are multiplied by log2(e) once.
//
// FLOPs (causal, counting the half that is computed): forward 2*2*B*NH*T*T*HS/2; backward 2.5x that in the
// FA-2 count. These are the first (reference) kernels, used for other head sizes, for decoding and with
// KILN_ATTN=ref; attention_fa2.cu holds the default ones. Here the backward recomputes S and dP in a second
// kernel for dQ so that nothing needs atomics (deterministic): 7 matmuls instead of 5, i.e. 3.5x the forward,
// in exchange for no fp32 dQ accumulator. Bytes: 2*B*T*(NH+2NKV)*HS in, 2*B*T*NH*HS out (+ K/V re-reads per q tile from
// L2). At T=1024, HS=64 this is compute bound (AI ~ T/2 FLOP/byte per head).
//
// Fast path: HS in {64, 128}. Block = 4 warps; each warp owns 16 query rows (forward, dQ) or 16 key rows
// (dK/dV). Tiles: 64 queries x 64 keys (forward, dQ); 64 keys x BR queries (dK/dV, BR = 64 or 32 for HS=128
// to keep accumulators in registers). Other head sizes (even, <= 256) run a simple warp-per-row kernel.
#include <math.h>
#include <string.h>

#include "backend/cuda/attention/attn_common.cuh"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

struct attn_params {
    const bf16 *qkv;                // (B, T, (NH + 2 NKV) HS), rows rs apart
    bf16 *out;                      // (B, T, NH HS)
    float *lse;                     // (B, NH, T)
    const bf16 *dout;               // (B, T, NH HS)
    bf16 *dqkv;                     // (B, T, (NH + 2 NKV) HS), rows drs apart
    float *dsum;                    // (B, NH, T): rowsum(dout * out)
    const float *cos_tab, *sin_tab; // (T, HS/2) each, NULL without RoPE
    int B, T, NH, NKV, HS;
    int rs, drs; // qkv, dqkv row strides: (NH + 2 NKV) HS, or wider rows holding them (the parallel block)
    int alibi;
    float scale;      // 1/sqrt(HS)
    float scale_log2; // scale * log2(e)
};

// ---- RoPE table -------------------------------------------------------------------------------------------

static __global__ void rope_table_kernel(float *cos_tab, float *sin_tab, int T, int half, double theta) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * half)
        return;
    int t = i / half, d = i % half;
    double inv_freq = pow(theta, -2.0 * d / (2.0 * half)); // theta^(-2d/HS)
    double ang = (double)t * inv_freq;
    cos_tab[i] = (float)cos(ang); // double precision: positions reach 10^4 radians
    sin_tab[i] = (float)sin(ang);
}

extern "C" const float *kiln_cuda_rope_table(struct cuda_ctx *c, int T, int HS, float theta,
                                             const float **sin) {
    if (!(c->rope_tab && c->rope_T >= T && c->rope_HS == HS && c->rope_theta == theta)) {
        int Tn = T;
        if (Tn < 1024)
            Tn = 1024; // most calls come with one T; a little headroom avoids rebuilds while decoding
        if (c->rope_tab) {
            CUDA_CHECK(cudaStreamSynchronize(c->stream));
            kiln_cuda_free(c, c->rope_tab);
        }
        CUDA_CHECK(kiln_cuda_malloc(c, (void **)&c->rope_tab, (size_t)Tn * HS * sizeof(float)));
        int half = HS / 2;
        rope_table_kernel<<<KILN_CEIL_DIV(Tn * half, 256), 256, 0, c->stream>>>(
            c->rope_tab, c->rope_tab + (size_t)Tn * half, Tn, half, (double)theta);
        CUDA_CHECK_LAUNCH();
        c->rope_T = Tn;
        c->rope_HS = HS;
        c->rope_theta = theta;
    }
    *sin = c->rope_tab + (size_t)c->rope_T * (HS / 2);
    return c->rope_tab;
}

// ---- tensor-core helpers (the shared ones are in attn_common.cuh) ---------------------------------------

static __device__ __forceinline__ uint32_t lds32(const bf16 *p) {
    return *(const uint32_t *)p;
}

// A fragment (16 x 16, row-major) from shared memory rows [row0, row0+16), columns [k0, k0+16).
template <int LD>
static __device__ __forceinline__ void load_a(uint32_t *a, const bf16 *s, int row0, int k0) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    a[0] = lds32(s + (row0 + g) * LD + k0 + t * 2);
    a[1] = lds32(s + (row0 + g + 8) * LD + k0 + t * 2);
    a[2] = lds32(s + (row0 + g) * LD + k0 + 8 + t * 2);
    a[3] = lds32(s + (row0 + g + 8) * LD + k0 + 8 + t * 2);
}

// S (16 x 8*NT) += A (16 x HS, smem rows a_row0..) . B^T where B's rows [0, 8*NT) are the n index (smem)
template <int HS, int NT, int LD>
static __device__ __forceinline__ void mma_abt(float (*s)[4], const bf16 *A, int a_row0, const bf16 *Bm) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t a[4];
        load_a<LD>(a, A, a_row0, kk * 16);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const bf16 *b = Bm + (nt * 8 + g) * LD + kk * 16 + t * 2;
            mma_bf16(s[nt], a, lds32(b), lds32(b + 8));
        }
    }
}

// O (16 x HS) += P (16 x 16*KT, C-fragment layout in p[2*KT][4]) . Vm (16*KT rows x HS, smem)
template <int HS, int KT, int LD>
static __device__ __forceinline__ void mma_pv(float (*o)[4], float (*p)[4], const bf16 *Vm) {
    int lane = threadIdx.x & 31, mi = lane >> 3, r = lane & 7;
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
            ldmatrix_x4_trans(b, Vm + (kk * 16 + (mi & 1) * 8 + r) * LD + dp * 16 + (mi >> 1) * 8);
            mma_bf16(o[2 * dp], a, b[0], b[1]);
            mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

// Loads rows [row0, row0 + NR) of one head (g0 points at t = 0 of that head in batch b) into shared memory
// (row stride LD), rotating pairs (d, d + HS/2) when cos_tab is set; rows >= T are zero.
template <int HS, int NR, int LD>
static __device__ __forceinline__ void load_tile(bf16 *sm, const bf16 *g0, int rs, int row0, int T,
                                                 const float *cos_tab, const float *sin_tab) {
    constexpr int CH = HS / 8; // 16-byte chunks per row
    for (int idx = threadIdx.x; idx < NR * CH; idx += blockDim.x) {
        int r = idx / CH, c8 = idx % CH, t = row0 + r;
        bf16x8 v;
        if (t < T) {
            v.u = *(const uint4 *)(g0 + (size_t)t * rs + c8 * 8);
            if (cos_tab) {
                int d0 = c8 * 8, lo = d0 < HS / 2;
                bf16x8 w;
                w.u = *(const uint4 *)(g0 + (size_t)t * rs + (lo ? d0 + HS / 2 : d0 - HS / 2));
                int i0 = lo ? d0 : d0 - HS / 2;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float cs = cos_tab[t * (HS / 2) + i0 + k], sn = sin_tab[t * (HS / 2) + i0 + k];
                    float x = bf2f(v.h[k]), y = bf2f(w.h[k]);
                    v.h[k] = f2bf(lo ? x * cs - y * sn : x * cs + y * sn);
                }
            }
        } else {
            v.u = make_uint4(0, 0, 0, 0);
        }
        *(uint4 *)(sm + r * LD + c8 * 8) = v.u;
    }
}

// ---- forward (fast path) --------------------------------------------------------------------------------

template <int HS> static __global__ void __launch_bounds__(128) flash_fwd_kernel(struct attn_params p) {
    constexpr int LD = HS + 8; // +16 bytes per row: the 8 rows a fragment load touches hit distinct banks
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Qs = (bf16 *)smem_raw, *Ks = Qs + 64 * LD, *Vs = Ks + 64 * LD;
    int qt = gridDim.x - 1 - blockIdx.x; // longest (last) query tiles first: better causal load balance
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int q0 = qt * 64;
    const bf16 *base = p.qkv + (size_t)b * p.T * p.rs;
    const bf16 *qg = base + h * HS, *kg = base + (p.NH + kvh) * HS, *vg = base + (p.NH + p.NKV + kvh) * HS;
    float slope2 = p.alibi ? alibi_slope(h, p.NH) * LOG2E : 0.0f;

    load_tile<HS, 64, LD>(Qs, qg, p.rs, q0, p.T, p.cos_tab, p.sin_tab);
    __syncthreads();
    uint32_t qf[HS / 16][4];
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++)
        load_a<LD>(qf[kk], Qs, warp * 16, kk * 16);

    float o[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int qi[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

    for (int j = 0; j <= qt; j++) { // causal: key tiles up to the diagonal
        __syncthreads();            // all warps are done with the previous K/V tile
        load_tile<HS, 64, LD>(Ks, kg, p.rs, j * 64, p.T, p.cos_tab, p.sin_tab);
        load_tile<HS, 64, LD>(Vs, vg, p.rs, j * 64, p.T, NULL, NULL);
        __syncthreads();
        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++)
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                const bf16 *bp = Ks + (nt * 8 + g) * LD + kk * 16 + t4 * 2;
                mma_bf16(s[nt], qf[kk], lds32(bp), lds32(bp + 8));
            }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1, kj = j * 64 + nt * 8 + t4 * 2 + (e & 1);
                float x = s[nt][e] * p.scale_log2 + slope2 * (float)(kj - qi[r]);
                if (j == qt && (kj > qi[r] || kj >= p.T)) // only the diagonal tile has masked keys
                    x = -INFINITY;
                s[nt][e] = x;
                mx[r] = fmaxf(mx[r], x);
            }
        float alpha[2], mu[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(m[r], mx[r]);
            mu[r] = mn == -INFINITY ? 0.0f : mn; // a fully masked row so far: avoid inf - inf
            alpha[r] = exp2f(m[r] - mu[r]);
            m[r] = mn;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float pv = exp2f(s[nt][e] - mu[e >> 1]);
                s[nt][e] = pv;
                l[e >> 1] += pv;
            }
#pragma unroll
        for (int dt = 0; dt < HS / 8; dt++) {
            o[dt][0] *= alpha[0];
            o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1];
            o[dt][3] *= alpha[1];
        }
        mma_pv<HS, 4, LD>(o, s, Vs);
    }
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = 1.0f / l[r];
    }
    bf16 *og = p.out + (size_t)b * p.T * p.NH * HS + h * HS;
    store_frag<HS>(og, p.NH * HS, qi[0], qi[1], p.T, o, inv[0], inv[1]);
    if (t4 == 0) {
        float *lg = p.lse + ((size_t)b * p.NH + h) * p.T;
        if (qi[0] < p.T)
            lg[qi[0]] = (m[0] + __log2f(l[0])) * LN2;
        if (qi[1] < p.T)
            lg[qi[1]] = (m[1] + __log2f(l[1])) * LN2;
    }
}

// ---- backward (fast path) -------------------------------------------------------------------------------

// dsum[b, h, t] = sum_d dout * out  (warp per row)
static __global__ void attn_dsum_kernel(struct attn_params p) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= p.B * p.T * p.NH)
        return;
    int h = row % p.NH, bt = row / p.NH, b = bt / p.T, t = bt % p.T;
    const bf16 *d = p.dout + (size_t)bt * p.NH * p.HS + h * p.HS,
               *o = p.out + (size_t)bt * p.NH * p.HS + h * p.HS;
    float s = 0.0f;
    for (int i = lane; i < p.HS; i += 32)
        s += bf2f(d[i]) * bf2f(o[i]);
    s = warp_sum(s);
    if (lane == 0)
        p.dsum[((size_t)b * p.NH + h) * p.T + t] = s;
}

// dK, dV for 64 keys of one kv head, summed over the query heads of its group and over query tiles.
template <int HS, int BR>
static __global__ void __launch_bounds__(128) flash_bwd_dkdv_kernel(struct attn_params p) {
    constexpr int LD = HS + 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Ks = (bf16 *)smem_raw, *Vs = Ks + 64 * LD, *Qs = Vs + 64 * LD, *dOs = Qs + BR * LD;
    float *lse_s = (float *)(dOs + BR * LD), *dsum_s = lse_s + BR;
    int kt = gridDim.x - 1 - blockIdx.x; // first key tiles see the most queries: start them first
    int b = blockIdx.y / p.NKV, kvh = blockIdx.y % p.NKV, group = p.NH / p.NKV;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int k0 = kt * 64;
    const bf16 *base = p.qkv + (size_t)b * p.T * p.rs;
    load_tile<HS, 64, LD>(Ks, base + (p.NH + kvh) * HS, p.rs, k0, p.T, p.cos_tab, p.sin_tab);
    load_tile<HS, 64, LD>(Vs, base + (p.NH + p.NKV + kvh) * HS, p.rs, k0, p.T, NULL, NULL);
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; i++)
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    int kj[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
    int n_qt = KILN_CEIL_DIV(p.T, BR);
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        float slope2 = p.alibi ? alibi_slope(h, p.NH) * LOG2E : 0.0f;
        const float *lg = p.lse + ((size_t)b * p.NH + h) * p.T, *dg = p.dsum + ((size_t)b * p.NH + h) * p.T;
        for (int qt = k0 / BR; qt < n_qt; qt++) {
            int q0 = qt * BR;
            __syncthreads(); // previous Q/dO tile fully consumed (and K/V loaded, on the first pass)
            load_tile<HS, BR, LD>(Qs, base + h * HS, p.rs, q0, p.T, p.cos_tab, p.sin_tab);
            load_tile<HS, BR, LD>(dOs, p.dout + (size_t)b * p.T * p.NH * HS + h * HS, p.NH * HS, q0, p.T,
                                  NULL, NULL);
            for (int i = threadIdx.x; i < BR; i += blockDim.x) {
                int t = q0 + i;
                lse_s[i] = t < p.T ? lg[t] * LOG2E : 0.0f;
                dsum_s[i] = t < p.T ? dg[t] : 0.0f;
            }
            __syncthreads();
            // S^T (16 keys x BR queries) = K Q^T ; dP^T = V dO^T
            float st[BR / 8][4], dpt[BR / 8][4];
#pragma unroll
            for (int nt = 0; nt < BR / 8; nt++)
                st[nt][0] = st[nt][1] = st[nt][2] = st[nt][3] = dpt[nt][0] = dpt[nt][1] = dpt[nt][2] =
                    dpt[nt][3] = 0.0f;
            mma_abt<HS, BR / 8, LD>(st, Ks, warp * 16, Qs);
            mma_abt<HS, BR / 8, LD>(dpt, Vs, warp * 16, dOs);
#pragma unroll
            for (int nt = 0; nt < BR / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int ql = nt * 8 + t4 * 2 + (e & 1), qi = q0 + ql, kr = kj[e >> 1];
                    float pv = 0.0f;
                    if (qi >= kr && qi < p.T && kr < p.T)
                        pv = exp2f(st[nt][e] * p.scale_log2 + slope2 * (float)(kr - qi) - lse_s[ql]);
                    st[nt][e] = pv;                              // P^T
                    dpt[nt][e] = pv * (dpt[nt][e] - dsum_s[ql]); // dS^T (unscaled)
                }
            mma_pv<HS, BR / 16, LD>(dv, st, dOs);
            mma_pv<HS, BR / 16, LD>(dk, dpt, Qs);
        }
    }
    if (p.cos_tab)
        rope_back_frag<HS>(dk, kj[0], kj[1], p.T, p.cos_tab, p.sin_tab);
    bf16 *dbase = p.dqkv + (size_t)b * p.T * p.drs;
    store_frag<HS>(dbase + (p.NH + kvh) * HS, p.drs, kj[0], kj[1], p.T, dk, p.scale, p.scale);
    store_frag<HS>(dbase + (p.NH + p.NKV + kvh) * HS, p.drs, kj[0], kj[1], p.T, dv, 1.0f, 1.0f);
}

// dQ for 64 queries of one head: recomputes S and dP over the key tiles up to the diagonal.
template <int HS> static __global__ void __launch_bounds__(128) flash_bwd_dq_kernel(struct attn_params p) {
    constexpr int LD = HS + 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Qs = (bf16 *)smem_raw, *dOs = Qs + 64 * LD, *Ks = dOs + 64 * LD, *Vs = Ks + 64 * LD;
    int qt = gridDim.x - 1 - blockIdx.x;
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int q0 = qt * 64;
    const bf16 *base = p.qkv + (size_t)b * p.T * p.rs;
    float slope2 = p.alibi ? alibi_slope(h, p.NH) * LOG2E : 0.0f;
    load_tile<HS, 64, LD>(Qs, base + h * HS, p.rs, q0, p.T, p.cos_tab, p.sin_tab);
    load_tile<HS, 64, LD>(dOs, p.dout + (size_t)b * p.T * p.NH * HS + h * HS, p.NH * HS, q0, p.T, NULL, NULL);
    int qi[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    float lse2[2], dsum[2];
    for (int r = 0; r < 2; r++) {
        size_t o = ((size_t)b * p.NH + h) * p.T + qi[r];
        lse2[r] = qi[r] < p.T ? p.lse[o] * LOG2E : 0.0f;
        dsum[r] = qi[r] < p.T ? p.dsum[o] : 0.0f;
    }
    float dq[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; i++)
        dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
    for (int j = 0; j <= qt; j++) {
        __syncthreads();
        load_tile<HS, 64, LD>(Ks, base + (p.NH + kvh) * HS, p.rs, j * 64, p.T, p.cos_tab, p.sin_tab);
        load_tile<HS, 64, LD>(Vs, base + (p.NH + p.NKV + kvh) * HS, p.rs, j * 64, p.T, NULL, NULL);
        __syncthreads();
        float s[8][4], dp[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.0f;
        mma_abt<HS, 8, LD>(s, Qs, warp * 16, Ks);
        mma_abt<HS, 8, LD>(dp, dOs, warp * 16, Vs);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1, kj = j * 64 + nt * 8 + t4 * 2 + (e & 1);
                float pv = 0.0f;
                if (kj <= qi[r] && kj < p.T && qi[r] < p.T)
                    pv = exp2f(s[nt][e] * p.scale_log2 + slope2 * (float)(kj - qi[r]) - lse2[r]);
                dp[nt][e] = pv * (dp[nt][e] - dsum[r]); // dS (unscaled)
            }
        mma_pv<HS, 4, LD>(dq, dp, Ks);
    }
    if (p.cos_tab)
        rope_back_frag<HS>(dq, qi[0], qi[1], p.T, p.cos_tab, p.sin_tab);
    store_frag<HS>(p.dqkv + (size_t)b * p.T * p.drs + h * HS, p.drs, qi[0], qi[1], p.T, dq, p.scale, p.scale);
}

// ---- simple path: any even HS <= 256, one warp per row
// -----------------------------------------------------

#define SIMPLE_MAX_HS 256

// element d of a row after RoPE at position t
static __device__ __forceinline__ float rot_elem(const bf16 *row, int d, int HS, int t, const float *cos_tab,
                                                 const float *sin_tab) {
    float x = bf2f(row[d]);
    if (!cos_tab)
        return x;
    int half = HS / 2, i = d < half ? d : d - half;
    float cs = cos_tab[t * half + i], sn = sin_tab[t * half + i];
    return d < half ? x * cs - bf2f(row[d + half]) * sn : x * cs + bf2f(row[d - half]) * sn;
}

// Rotated q (times qmul) into a warp's smem row.
static __device__ void warp_load_rot(float *dst, const bf16 *row, int HS, int t, const float *cos_tab,
                                     const float *sin_tab, float mul) {
    for (int d = threadIdx.x & 31; d < HS; d += 32)
        dst[d] = rot_elem(row, d, HS, t, cos_tab, sin_tab) * mul;
    __syncwarp();
}

// One query row against keys [0, nkeys): online softmax over chunks of 32 keys (lane = key), output in
// o[d / 32] of lane d % 32. k rows are rotated on the fly when cos_tab is set (positions = key index).
// q is in the log2 domain (pre-multiplied by scale*log2e). Returns the log2-domain lse.
static __device__ float warp_attend_row(float *o, const float *q, const bf16 *kbase, const bf16 *vbase,
                                        size_t kstride, int nkeys, int qpos, float slope2, int HS,
                                        const float *cos_tab, const float *sin_tab) {
    int lane = threadIdx.x & 31;
    float m = -INFINITY, l = 0.0f;
    for (int u = 0; u < SIMPLE_MAX_HS / 32; u++)
        o[u] = 0.0f;
    for (int j0 = 0; j0 < nkeys; j0 += 32) {
        int j = j0 + lane;
        float s = -INFINITY;
        if (j < nkeys) {
            const bf16 *kr = kbase + (size_t)j * kstride;
            float acc = 0.0f;
            for (int d = 0; d < HS; d++)
                acc += q[d] * rot_elem(kr, d, HS, j, cos_tab, sin_tab);
            s = acc + slope2 * (float)(j - qpos);
        }
        float mn = fmaxf(m, warp_max(s)); // key 0 is always valid: mn is finite
        float alpha = exp2f(m - mn);
        float pv = exp2f(s - mn);
        l = l * alpha + warp_sum(pv);
        m = mn;
        for (int u = 0; u < SIMPLE_MAX_HS / 32; u++)
            o[u] *= alpha;
        int nj = min(32, nkeys - j0);
        for (int jj = 0; jj < nj; jj++) {
            float pj = __shfl_sync(0xffffffffu, pv, jj);
            const bf16 *vr = vbase + (size_t)(j0 + jj) * kstride;
            for (int u = 0; u < SIMPLE_MAX_HS / 32; u++) {
                int d = u * 32 + lane;
                if (d < HS)
                    o[u] += pj * bf2f(vr[d]);
            }
        }
    }
    for (int u = 0; u < SIMPLE_MAX_HS / 32; u++)
        o[u] /= l;
    return m + __log2f(l);
}

static __global__ void attn_fwd_simple_kernel(struct attn_params p) {
    __shared__ float qs[4][SIMPLE_MAX_HS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.x * 4 + warp;
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    if (t >= p.T)
        return; // whole warp; no block barriers below
    int HS = p.HS;
    const bf16 *base = p.qkv + (size_t)b * p.T * p.rs;
    warp_load_rot(qs[warp], base + (size_t)t * p.rs + h * HS, HS, t, p.cos_tab, p.sin_tab, p.scale_log2);
    float o[SIMPLE_MAX_HS / 32];
    float slope2 = p.alibi ? alibi_slope(h, p.NH) * LOG2E : 0.0f;
    float lse2 = warp_attend_row(o, qs[warp], base + (p.NH + kvh) * HS, base + (p.NH + p.NKV + kvh) * HS,
                                 p.rs, t + 1, t, slope2, HS, p.cos_tab, p.sin_tab);
    bf16 *orow = p.out + ((size_t)b * p.T + t) * p.NH * HS + h * HS;
    for (int u = 0; u < SIMPLE_MAX_HS / 32; u++)
        if (u * 32 + lane < HS)
            orow[u * 32 + lane] = f2bf(o[u]);
    if (lane == 0)
        p.lse[((size_t)b * p.NH + h) * p.T + t] = lse2 * LN2;
}

// dQ of one query row: dq = scale * sum_j p_ij (dp_ij - D_i) k_j, then the inverse rotation.
static __global__ void attn_bwd_dq_simple_kernel(struct attn_params p) {
    __shared__ float qs[4][SIMPLE_MAX_HS], ds_[4][SIMPLE_MAX_HS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.x * 4 + warp;
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    if (t >= p.T)
        return;
    int HS = p.HS;
    const bf16 *base = p.qkv + (size_t)b * p.T * p.rs;
    const bf16 *kb = base + (p.NH + kvh) * HS, *vb = base + (p.NH + p.NKV + kvh) * HS;
    float *q = qs[warp], *dO = ds_[warp];
    warp_load_rot(q, base + (size_t)t * p.rs + h * HS, HS, t, p.cos_tab, p.sin_tab, p.scale_log2);
    const bf16 *dorow = p.dout + ((size_t)b * p.T + t) * p.NH * HS + h * HS;
    for (int d = lane; d < HS; d += 32)
        dO[d] = bf2f(dorow[d]);
    __syncwarp();
    size_t li = ((size_t)b * p.NH + h) * p.T + t;
    float lse2 = p.lse[li] * LOG2E, D = p.dsum[li];
    float slope2 = p.alibi ? alibi_slope(h, p.NH) * LOG2E : 0.0f;
    float dq[SIMPLE_MAX_HS / 32];
    for (int u = 0; u < SIMPLE_MAX_HS / 32; u++)
        dq[u] = 0.0f;
    for (int j0 = 0; j0 <= t; j0 += 32) {
        int j = j0 + lane;
        float ds = 0.0f;
        if (j <= t) {
            const bf16 *kr = kb + (size_t)j * p.rs, *vr = vb + (size_t)j * p.rs;
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < HS; d++) {
                s += q[d] * rot_elem(kr, d, HS, j, p.cos_tab, p.sin_tab);
                dp += dO[d] * bf2f(vr[d]);
            }
            float pv = exp2f(s + slope2 * (float)(j - t) - lse2);
            ds = pv * (dp - D);
        }
        int nj = min(32, t + 1 - j0);
        for (int jj = 0; jj < nj; jj++) {
            float dsj = __shfl_sync(0xffffffffu, ds, jj);
            const bf16 *kr = kb + (size_t)(j0 + jj) * p.rs;
            for (int u = 0; u < SIMPLE_MAX_HS / 32; u++) {
                int d = u * 32 + lane;
                if (d < HS)
                    dq[u] += dsj * rot_elem(kr, d, HS, j0 + jj, p.cos_tab, p.sin_tab);
            }
        }
    }
    // inverse rotation through smem (the partner column lives in another lane)
    __syncwarp();
    for (int u = 0; u < SIMPLE_MAX_HS / 32; u++)
        if (u * 32 + lane < HS)
            q[u * 32 + lane] = dq[u] * p.scale;
    __syncwarp();
    bf16 *dqrow = p.dqkv + ((size_t)b * p.T + t) * p.drs + h * HS;
    int half = HS / 2;
    for (int d = lane; d < HS; d += 32) {
        float x = q[d];
        if (p.cos_tab) {
            int i = d < half ? d : d - half;
            float cs = p.cos_tab[t * half + i], sn = p.sin_tab[t * half + i];
            x = d < half ? q[d] * cs + q[d + half] * sn : q[d] * cs - q[d - half] * sn;
        }
        dqrow[d] = f2bf(x);
    }
}

// dK, dV of one key row of kv head kvh, over the query heads of its group and queries i >= j.
static __global__ void attn_bwd_dkdv_simple_kernel(struct attn_params p) {
    __shared__ float ks[4][SIMPLE_MAX_HS], vs[4][SIMPLE_MAX_HS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int j = blockIdx.x * 4 + warp;
    int b = blockIdx.y / p.NKV, kvh = blockIdx.y % p.NKV, group = p.NH / p.NKV;
    if (j >= p.T)
        return;
    int HS = p.HS;
    const bf16 *base = p.qkv + (size_t)b * p.T * p.rs;
    float *k = ks[warp], *v = vs[warp];
    warp_load_rot(k, base + (size_t)j * p.rs + (p.NH + kvh) * HS, HS, j, p.cos_tab, p.sin_tab, p.scale_log2);
    warp_load_rot(v, base + (size_t)j * p.rs + (p.NH + p.NKV + kvh) * HS, HS, j, NULL, NULL, 1.0f);
    float dk[SIMPLE_MAX_HS / 32], dv[SIMPLE_MAX_HS / 32];
    for (int u = 0; u < SIMPLE_MAX_HS / 32; u++)
        dk[u] = dv[u] = 0.0f;
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        float slope2 = p.alibi ? alibi_slope(h, p.NH) * LOG2E : 0.0f;
        const bf16 *qb = base + h * HS, *dob = p.dout + (size_t)b * p.T * p.NH * HS + h * HS;
        for (int i0 = j; i0 < p.T; i0 += 32) {
            int i = i0 + lane;
            float pv = 0.0f, ds = 0.0f;
            if (i < p.T) {
                const bf16 *qr = qb + (size_t)i * p.rs, *dor = dob + (size_t)i * p.NH * HS;
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < HS; d++) {
                    s += k[d] * rot_elem(qr, d, HS, i, p.cos_tab, p.sin_tab);
                    dp += v[d] * bf2f(dor[d]);
                }
                size_t li = ((size_t)b * p.NH + h) * p.T + i;
                pv = exp2f(s + slope2 * (float)(j - i) - p.lse[li] * LOG2E);
                ds = pv * (dp - p.dsum[li]);
            }
            int ni = min(32, p.T - i0);
            for (int ii = 0; ii < ni; ii++) {
                float pi = __shfl_sync(0xffffffffu, pv, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
                const bf16 *qr = qb + (size_t)(i0 + ii) * p.rs, *dor = dob + (size_t)(i0 + ii) * p.NH * HS;
                for (int u = 0; u < SIMPLE_MAX_HS / 32; u++) {
                    int d = u * 32 + lane;
                    if (d < HS) {
                        dv[u] += pi * bf2f(dor[d]);
                        dk[u] += dsi * rot_elem(qr, d, HS, i0 + ii, p.cos_tab, p.sin_tab);
                    }
                }
            }
        }
    }
    __syncwarp();
    for (int u = 0; u < SIMPLE_MAX_HS / 32; u++)
        if (u * 32 + lane < HS)
            k[u * 32 + lane] = dk[u] * p.scale;
    __syncwarp();
    bf16 *drow = p.dqkv + ((size_t)b * p.T + j) * p.drs;
    int half = HS / 2;
    for (int d = lane; d < HS; d += 32) {
        float x = k[d];
        if (p.cos_tab) {
            int i = d < half ? d : d - half;
            float cs = p.cos_tab[j * half + i], sn = p.sin_tab[j * half + i];
            x = d < half ? k[d] * cs + k[d + half] * sn : k[d] * cs - k[d - half] * sn;
        }
        drow[(p.NH + kvh) * HS + d] = f2bf(x);
    }
    for (int u = 0; u < SIMPLE_MAX_HS / 32; u++)
        if (u * 32 + lane < HS)
            drow[(p.NH + p.NKV + kvh) * HS + u * 32 + lane] = f2bf(dv[u]);
}

// ---- launchers
// ---------------------------------------------------------------------------------------------

static struct attn_params attn_setup(struct cuda_ctx *c, int B, int T, int NH, int NKV, int HS,
                                     enum kiln_pos pos, float theta, const void *qkv, int qkv_stride) {
    KILN_ASSERT(NKV > 0 && NH % NKV == 0 && HS % 2 == 0 && HS <= SIMPLE_MAX_HS);
    KILN_ASSERT((uintptr_t)qkv % 16 == 0);
    struct attn_params p;
    memset(&p, 0, sizeof(p));
    p.qkv = (const bf16 *)qkv;
    p.B = B;
    p.T = T;
    p.NH = NH;
    p.NKV = NKV;
    p.HS = HS;
    p.rs = qkv_stride ? qkv_stride : (NH + 2 * NKV) * HS;
    p.drs = p.rs;
    p.alibi = pos == KILN_POS_ALIBI;
    p.scale = 1.0f / sqrtf((float)HS);
    p.scale_log2 = p.scale * LOG2E;
    if (pos == KILN_POS_ROPE)
        p.cos_tab = kiln_cuda_rope_table(c, T, HS, theta, &p.sin_tab);
    return p;
}

// The tiled kernels load rows in 16-byte chunks and store bf16 pairs: rows (of qkv and dqkv) must start on
// 16-byte boundaries, i.e. strides a multiple of 8 elements. Other strides take the warp-per-row kernels.
static int attn_tiled(const struct attn_params *p) {
    return (p->HS == 64 || p->HS == 128) && p->rs % 8 == 0 && p->drs % 8 == 0;
}

// Which kernel family the context runs (KILN_ATTN, kernel[KILN_KERNEL_ATTN]; kiln_cuda_set_kernel switches
// it between calls, so that a benchmark or test can compare paths on the same inputs): wgmma, the default
// (the Hopper kernels where they apply, else FA2), fa2 the FA2 kernels, ref these (first-generation) ones for
// every head size.
enum attn_path { ATTN_DEFAULT, ATTN_FA2, ATTN_REF }; // in kiln_kernel_values[KILN_KERNEL_ATTN]'s order
static enum attn_path attn_path(const struct cuda_ctx *c) {
    return (enum attn_path)c->kernel[KILN_KERNEL_ATTN];
}

extern "C" void kiln_cuda_attention_forward(void *ctx, const struct kiln_attn_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (a->B * a->T == 0)
        return;
    KILN_ASSERT(a->NKV > 0 && a->NH % a->NKV == 0);
    enum attn_path path = attn_path(c);
    if (path == ATTN_DEFAULT && kiln_cuda_wgmma_attention_forward(c, a)) // sm_90a build, sm_90 device
        return;
    if (path != ATTN_REF && kiln_cuda_fa2_forward(c, a))
        return;
    struct attn_params p =
        attn_setup(c, a->B, a->T, a->NH, a->NKV, a->HS, a->pos, a->rope_theta, a->qkv, a->qkv_stride);
    p.out = (bf16 *)a->out;
    p.lse = a->lse;
    KILN_ASSERT((uintptr_t)a->out % 4 == 0);
    if (attn_tiled(&p)) {
        dim3 grid(KILN_CEIL_DIV(a->T, 64), a->B * a->NH);
        size_t smem = (size_t)3 * 64 * (a->HS + 8) * sizeof(bf16);
        if (a->HS == 64) {
            set_smem(flash_fwd_kernel<64>, smem);
            flash_fwd_kernel<64><<<grid, 128, smem, c->stream>>>(p);
        } else {
            set_smem(flash_fwd_kernel<128>, smem);
            flash_fwd_kernel<128><<<grid, 128, smem, c->stream>>>(p);
        }
    } else {
        dim3 grid(KILN_CEIL_DIV(a->T, 4), a->B * a->NH);
        attn_fwd_simple_kernel<<<grid, 128, 0, c->stream>>>(p);
    }
    CUDA_CHECK_LAUNCH();
}

extern "C" void kiln_cuda_attention_backward(void *ctx, const struct kiln_attn_back_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    if (a->B * a->T == 0)
        return;
    KILN_ASSERT(a->NKV > 0 && a->NH % a->NKV == 0);
    enum attn_path path = attn_path(c);
    if (path == ATTN_DEFAULT && kiln_cuda_wgmma_attention_backward(c, a)) // as the forward; not deterministic
        return;
    if (path != ATTN_REF && kiln_cuda_fa2_backward(c, a))
        return;
    struct attn_params p =
        attn_setup(c, a->B, a->T, a->NH, a->NKV, a->HS, a->pos, a->rope_theta, a->qkv, a->qkv_stride);
    p.out = (bf16 *)a->out;
    p.lse = (float *)a->lse;
    p.dout = (const bf16 *)a->dout;
    p.dqkv = (bf16 *)a->dqkv;
    if (a->dqkv_stride)
        p.drs = a->dqkv_stride;
    KILN_ASSERT((uintptr_t)a->dout % 16 == 0 && (uintptr_t)a->dqkv % 4 == 0);
    p.dsum = (float *)kiln_cuda_scratch(c, SCR_ATTN_D, (size_t)a->B * a->NH * a->T * sizeof(float));
    int rows = a->B * a->T * a->NH;
    attn_dsum_kernel<<<KILN_CEIL_DIV(rows, 8), 256, 0, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
    if (attn_tiled(&p)) {
        dim3 grid_kv(KILN_CEIL_DIV(a->T, 64), a->B * a->NKV), grid_q(KILN_CEIL_DIV(a->T, 64), a->B * a->NH);
        if (a->HS == 64) {
            size_t s1 = (size_t)(2 * 64 + 2 * 64) * (64 + 8) * sizeof(bf16) + 2 * 64 * sizeof(float);
            size_t s2 = (size_t)4 * 64 * (64 + 8) * sizeof(bf16);
            set_smem(flash_bwd_dkdv_kernel<64, 64>, s1);
            set_smem(flash_bwd_dq_kernel<64>, s2);
            flash_bwd_dkdv_kernel<64, 64><<<grid_kv, 128, s1, c->stream>>>(p);
            CUDA_CHECK_LAUNCH();
            flash_bwd_dq_kernel<64><<<grid_q, 128, s2, c->stream>>>(p);
        } else {
            size_t s1 = (size_t)(2 * 64 + 2 * 32) * (128 + 8) * sizeof(bf16) + 2 * 32 * sizeof(float);
            size_t s2 = (size_t)4 * 64 * (128 + 8) * sizeof(bf16);
            set_smem(flash_bwd_dkdv_kernel<128, 32>, s1);
            set_smem(flash_bwd_dq_kernel<128>, s2);
            flash_bwd_dkdv_kernel<128, 32><<<grid_kv, 128, s1, c->stream>>>(p);
            CUDA_CHECK_LAUNCH();
            flash_bwd_dq_kernel<128><<<grid_q, 128, s2, c->stream>>>(p);
        }
    } else {
        dim3 grid_q(KILN_CEIL_DIV(a->T, 4), a->B * a->NH), grid_kv(KILN_CEIL_DIV(a->T, 4), a->B * a->NKV);
        attn_bwd_dq_simple_kernel<<<grid_q, 128, 0, c->stream>>>(p);
        CUDA_CHECK_LAUNCH();
        attn_bwd_dkdv_simple_kernel<<<grid_kv, 128, 0, c->stream>>>(p);
    }
    CUDA_CHECK_LAUNCH();
}

// ---- decode: one new token per sequence against a KV cache
// -------------------------------------------------

// writes the new token's k (rotated at position pos) and v into the caches
static __global__ void attn_decode_store_kernel(bf16 *kc, bf16 *vc, const bf16 *qkv, int rs, int B, int maxT,
                                                int pos, int NH, int NKV, int HS, const float *cos_tab,
                                                const float *sin_tab) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; // (B, NKV*HS)
    if (i >= B * NKV * HS)
        return;
    int b = i / (NKV * HS), e = i % (NKV * HS), kvh = e / HS, d = e % HS;
    const bf16 *row = qkv + (size_t)b * rs;
    size_t dst = ((size_t)b * maxT + pos) * NKV * HS + e;
    kc[dst] = f2bf(rot_elem(row + (NH + kvh) * HS, d, HS, pos, cos_tab, sin_tab));
    vc[dst] = row[(NH + NKV + kvh) * HS + d];
}

static __global__ void attn_decode_kernel(bf16 *out, const bf16 *kc, const bf16 *vc, const bf16 *qkv, int rs,
                                          int B, int maxT, int pos, int NH, int NKV, int HS, int alibi,
                                          float scale_log2, const float *cos_tab, const float *sin_tab) {
    __shared__ float qs[4][SIMPLE_MAX_HS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int bh = blockIdx.x * 4 + warp;
    if (bh >= B * NH)
        return;
    int b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    const bf16 *row = qkv + (size_t)b * rs;
    warp_load_rot(qs[warp], row + h * HS, HS, pos, cos_tab, sin_tab, scale_log2);
    float o[SIMPLE_MAX_HS / 32];
    float slope2 = alibi ? alibi_slope(h, NH) * LOG2E : 0.0f;
    size_t cb = (size_t)b * maxT * NKV * HS + kvh * HS;
    warp_attend_row(o, qs[warp], kc + cb, vc + cb, (size_t)NKV * HS, pos + 1, pos, slope2, HS, NULL, NULL);
    bf16 *orow = out + (size_t)b * NH * HS + h * HS;
    for (int u = 0; u < SIMPLE_MAX_HS / 32; u++)
        if (u * 32 + lane < HS)
            orow[u * 32 + lane] = f2bf(o[u]);
}

extern "C" void kiln_cuda_attention_decode(void *ctx, const struct kiln_attn_decode_args *a) {
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    KILN_ASSERT(a->pos >= 0 && a->pos < a->maxT && a->NH % a->NKV == 0 && a->HS <= SIMPLE_MAX_HS);
    const float *cos_tab = NULL, *sin_tab = NULL;
    if (a->pos_kind == KILN_POS_ROPE)
        cos_tab = kiln_cuda_rope_table(c, a->maxT, a->HS, a->rope_theta, &sin_tab);
    int n = a->B * a->NKV * a->HS, rs = a->qkv_stride ? a->qkv_stride : (a->NH + 2 * a->NKV) * a->HS;
    attn_decode_store_kernel<<<KILN_CEIL_DIV(n, 256), 256, 0, c->stream>>>(
        (bf16 *)a->kcache, (bf16 *)a->vcache, (const bf16 *)a->qkv, rs, a->B, a->maxT, a->pos, a->NH, a->NKV,
        a->HS, cos_tab, sin_tab);
    CUDA_CHECK_LAUNCH();
    float scale_log2 = LOG2E / sqrtf((float)a->HS);
    attn_decode_kernel<<<KILN_CEIL_DIV(a->B * a->NH, 4), 128, 0, c->stream>>>(
        (bf16 *)a->out, (const bf16 *)a->kcache, (const bf16 *)a->vcache, (const bf16 *)a->qkv, rs, a->B,
        a->maxT, a->pos, a->NH, a->NKV, a->HS, a->pos_kind == KILN_POS_ALIBI, scale_log2, cos_tab, sin_tab);
    CUDA_CHECK_LAUNCH();
}
