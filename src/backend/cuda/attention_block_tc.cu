// Block attention on the tensor cores (ops.h: kiln_attn_block_args; attention_block.cuh): the kernels that
// ring and hybrid sequence parallelism run for every block of keys, for HS 64 and 128. Same function as the
// f32 kernels of attention_block.cu (KILN_ATTN_BLOCK=ref), with FA2's rounding: q and k are rotated in f32
// and rounded to bf16 once, P and dS are rounded to bf16 before their products, every sum is f32.
//
// Layout: 4 warps, each 16 rows of the block's 64 (queries in the forward and dQ, keys in dK/dV), tiles of 64
// rows staged in shared memory as bf16 rows HS + 8 apart. Matrix products are mma.sync m16n8k16 with operands
// read from shared memory as 32-bit pairs: an A fragment (16 x 16, row-major) is a0 (row g, cols 2t, 2t+1),
// a1 (row g + 8), a2 (cols + 8), a3 (both); a B fragment (16 x 8) is b0 (rows 2t, 2t+1 of column g) and b1
// (rows + 8); the accumulator c is (row g, cols 2t, 2t+1) then (row g + 8), with g = lane / 4, t = lane % 4.
// Where B[k][n] is a row-major tile's row n, a B pair is one 32-bit load; where it is the tile's column n, it
// is two 16-bit loads (blk_col2). Correctness first: no cp.async, no ldmatrix; the loads are plain and
// scalar.
//
// - forward: online softmax over the visible key tiles (warps skip tiles wholly above their rows), then the
//   block's (out, lse) merged into what out and lse hold, as the f32 kernel does.
// - backward (deterministic, no atomics): dQ over key tiles per (query tile, head); dK and dV over the
// group's
//   query heads and query tiles per key tile; each element of dq, dk, dv read, added to and rounded once.
#include "backend/cuda/attention_block.cuh"

#define TC_ROWS 64 // rows a block owns: 4 warps x 16
#define TC_KT 64   // rows of a staged tile
#define TC_THREADS 128

#ifndef KILN_CUDA_EMU // (tests/emu runs these kernels on the CPU, with shared memory of its own)
static __device__ __forceinline__ unsigned char *tc_smem(void) {
    extern __shared__ __align__(16) unsigned char tc_sm[];
    return tc_sm;
}
#endif

// a pair of bf16 as one 32-bit mma operand register
static __device__ __forceinline__ uint32_t blk_ld2(const bf16 *s) {
    return *(const uint32_t *)s;
}
// column c of rows r and r + 1 of a tile with rows ld apart: the lower k index in the low half
static __device__ __forceinline__ uint32_t blk_col2(const bf16 *s, int ld, int r, int c) {
    uint32_t lo = __bfloat16_as_ushort(s[r * ld + c]), hi = __bfloat16_as_ushort(s[(r + 1) * ld + c]);
    return lo | (hi << 16);
}

// Rows [row0, row0 + TC_KT) of one head (g: row 0 of the head, rows rs apart) into shared memory as bf16,
// rows ld apart, rotated at global position pos0 + row where ct is set; rows >= limit are zero.
template <int HS>
static __device__ void tc_load(bf16 *sm, int ld, const bf16 *g, int rs, int row0, int limit, int pos0,
                               const float *ct, const float *st) {
    for (int idx = threadIdx.x; idx < TC_KT * HS; idx += TC_THREADS) {
        int r = idx / HS, d = idx % HS, t = row0 + r;
        float x = 0.0f;
        if (t < limit)
            x = blk_rot(g + (size_t)t * rs, d, HS / 2, pos0 + t, ct, st);
        sm[r * ld + d] = f2bf(x);
    }
}

// A fragment of rows r0.. r0 + 15, columns k0.. k0 + 15 of a row-major tile
static __device__ __forceinline__ void tc_frag_a(uint32_t *a, const bf16 *s, int ld, int r0, int k0, int g,
                                                 int t) {
    a[0] = blk_ld2(s + (r0 + g) * ld + k0 + 2 * t);
    a[1] = blk_ld2(s + (r0 + g + 8) * ld + k0 + 2 * t);
    a[2] = blk_ld2(s + (r0 + g) * ld + k0 + 8 + 2 * t);
    a[3] = blk_ld2(s + (r0 + g + 8) * ld + k0 + 8 + 2 * t);
}

// C (16 x 64: 8 n tiles) = A (rows r0.. of tile As) . B^T, B's rows n0.. of tile Bs: both row-major over HS
template <int HS>
static __device__ __forceinline__ void tc_abt(float (*c)[4], const bf16 *As, int r0, const bf16 *Bs, int ld,
                                              int g, int t) {
#pragma unroll
    for (int n = 0; n < 8; n++)
        c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll
    for (int k0 = 0; k0 < HS; k0 += 16) {
        uint32_t a[4];
        tc_frag_a(a, As, ld, r0, k0, g, t);
#pragma unroll
        for (int n = 0; n < 8; n++) {
            const bf16 *br = Bs + (n * 8 + g) * ld + k0 + 2 * t;
            mma_bf16(c[n], a, blk_ld2(br), blk_ld2(br + 8));
        }
    }
}

// The A fragment of keys (or queries) kc * 16.. kc * 16 + 15 from accumulator tiles 2 kc and 2 kc + 1 of a
// 16 x 64 product (P, dS or their transposes), rounded to bf16: a C tile's layout is an A fragment's half.
static __device__ __forceinline__ void tc_acc_to_a(uint32_t *a, const float (*c)[4], int kc) {
    a[0] = pack_bf16(c[2 * kc][0], c[2 * kc][1]);
    a[1] = pack_bf16(c[2 * kc][2], c[2 * kc][3]);
    a[2] = pack_bf16(c[2 * kc + 1][0], c[2 * kc + 1][1]);
    a[3] = pack_bf16(c[2 * kc + 1][2], c[2 * kc + 1][3]);
}

// O (16 x HS: HS/8 n tiles) += P (16 x 64, accumulator fragments p[8][4], rounded to bf16 here) . V, V the
// row-major tile Vs (64 rows of HS): B[k][n] = Vs[k][n], a column pair
template <int HS>
static __device__ __forceinline__ void tc_pv(float (*o)[4], const float (*p)[4], const bf16 *Vs, int ld,
                                             int g, int t) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++) { // 16 keys: p tiles 2 kc and 2 kc + 1
        uint32_t a[4];
        tc_acc_to_a(a, p, kc);
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            mma_bf16(o[n], a, blk_col2(Vs, ld, kc * 16 + 2 * t, n * 8 + g),
                     blk_col2(Vs, ld, kc * 16 + 8 + 2 * t, n * 8 + g));
    }
}

// A gradient's accumulator fragments (16 rows x HS, rotated frame, times mul) back to the input frame at the
// rows' global positions and added to the bf16 rows dst + row * rs (read, added in f32, rounded once); rows
// >= limit are left alone. Columns d and d + HS/2 are tiles n and n + HS/16 of the same thread.
template <int HS>
static __device__ void tc_store_grad(bf16 *dst, int rs, const float (*x)[4], int r0, int limit, int pos0,
                                     float mul, const float *ct, const float *st, int g, int t) {
    const int half = HS / 2;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) { // rows g and g + 8
        int r = r0 + g + 8 * hr;
        if (r >= limit)
            continue;
        bf16 *row = dst + (size_t)r * rs;
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int d = n * 8 + 2 * t + e;
                float v = x[n][2 * hr + e] * mul;
                if (ct) {
                    int i = d < half ? d : d - half;
                    float cs = ct[(size_t)(pos0 + r) * half + i], sn = st[(size_t)(pos0 + r) * half + i];
                    float o = x[d < half ? n + HS / 16 : n - HS / 16][2 * hr + e] * mul;
                    v = d < half ? v * cs + o * sn : v * cs - o * sn;
                }
                row[d] = f2bf(bf2f(row[d]) + v);
            }
    }
}

// ---- forward ----------------------------------------------------------------------------------------------

// Grid (Tq / 64, B * NH). Shared: Qs, Ks, Vs, each 64 rows of HS + 8.
template <int HS> static __global__ void __launch_bounds__(TC_THREADS) tc_fwd_kernel(struct blk_params p) {
    unsigned char *tc_sm = tc_smem();
    const int ld = HS + 8;
    bf16 *Qs = (bf16 *)tc_sm, *Ks = Qs + TC_ROWS * ld, *Vs = Ks + TC_KT * ld;
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int i0 = blockIdx.x * TC_ROWS, r0 = warp * 16;
    const bf16 *kg = p.k + b * p.kv_bs + kvh * HS, *vg = p.v + b * p.kv_bs + kvh * HS;
    float slope2 = blk_slope2(p, h);
    tc_load<HS>(Qs, ld, p.q + b * p.q_bs + h * HS, p.q_rs, i0, p.Tq, p.q0, p.cos_tab, p.sin_tab);
    // this thread's two rows (g, g + 8 of the warp's 16): local index and global position
    int il[2] = {i0 + r0 + g, i0 + r0 + g + 8}, qpos[2] = {p.q0 + il[0], p.q0 + il[1]};
    int wlast = min(i0 + r0 + 15, p.Tq - 1); // the warp's last real query (< i0 + r0: none)
    float o[HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    int last = min(i0 + TC_ROWS, p.Tq) - 1;
    int nk = min(p.Tk, p.q0 + last - p.k0 + 1); // keys some query of the block sees
    for (int j0 = 0; j0 < nk; j0 += TC_KT) {
        __syncthreads(); // the previous tile is consumed (and Qs written, the first time)
        tc_load<HS>(Ks, ld, kg, p.kv_rs, j0, p.Tk, p.k0, p.cos_tab, p.sin_tab);
        tc_load<HS>(Vs, ld, vg, p.kv_rs, j0, p.Tk, 0, NULL, NULL);
        __syncthreads();
        if (wlast < i0 + r0 || p.k0 + j0 > p.q0 + wlast)
            continue; // warp-uniform: no row of this warp sees a key of the tile
        float s[8][4];
        tc_abt<HS>(s, Qs, r0, Ks, ld, g, t);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int hr = e >> 1, j = j0 + n * 8 + 2 * t + (e & 1), kpos = p.k0 + j;
                float x = -INFINITY;
                if (il[hr] < p.Tq && j < p.Tk && kpos <= qpos[hr])
                    x = s[n][e] * p.scale_log2 + slope2 * (float)(kpos - qpos[hr]);
                s[n][e] = x;
                mx[hr] = fmaxf(mx[hr], x);
            }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
            mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
        }
        float alpha[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mn = fmaxf(m[hr], mx[hr]);
            // mn = -inf: the row has seen no key yet; its p stay 0 and nothing scales
            alpha[hr] = mn == -INFINITY ? 1.0f : exp2f(m[hr] - mn);
            m[hr] = mn;
            l[hr] *= alpha[hr];
        }
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int hr = e >> 1;
                float pv = s[n][e] == -INFINITY ? 0.0f : exp2f(s[n][e] - m[hr]);
                s[n][e] = pv;
                l[hr] += pv;
            }
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        tc_pv<HS>(o, s, Vs, ld, g, t);
    }
    // the rows' sums over the quad's four threads
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
    }
    // merge (accumulate) or write this block's rows; every lane reads the old lse before any lane writes it
    float lo[2] = {-INFINITY, -INFINITY};
    float *lp[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        lp[hr] = p.lse + ((size_t)b * p.NH + h) * p.lse_s + (il[hr] < p.Tq ? il[hr] : 0);
        if (p.accumulate && il[hr] < p.Tq)
            lo[hr] = *lp[hr];
    }
    __syncwarp();
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        if (il[hr] >= p.Tq)
            continue;
        float lse_b = l[hr] > 0.0f ? (m[hr] + __log2f(l[hr])) * BLK_LN2 : -INFINITY;
        float wb = l[hr] > 0.0f ? 1.0f / l[hr] : 0.0f, wo = 0.0f, lse_n = lse_b; // weights: block, old out
        if (p.accumulate) {
            if (lse_b == -INFINITY)
                continue; // nothing to merge: out and lse keep what they hold
            if (lo[hr] != -INFINITY) {
                float mm = fmaxf(lo[hr], lse_b);
                lse_n = mm + logf(expf(lo[hr] - mm) + expf(lse_b - mm));
                wo = expf(lo[hr] - lse_n);
                wb *= expf(lse_b - lse_n);
            } // else the old row is empty: out may hold anything, it is not read
        }
        bf16 *orow = p.out + b * p.out_bs + (size_t)il[hr] * p.out_rs + h * HS;
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int d = n * 8 + 2 * t + e;
                float x = o[n][2 * hr + e] * wb;
                if (wo != 0.0f)
                    x = fmaf(wo, bf2f(orow[d]), x);
                orow[d] = f2bf(x);
            }
        if (t == 0)
            *lp[hr] = lse_n;
    }
}

// ---- backward ---------------------------------------------------------------------------------------------

// dq += scale * sum_j p_ij (dout_i . v_j - D_i) k_j, rotated back. Grid (Tq / 64, B * NH). Shared: Qs, dOs,
// Ks, Vs, each 64 rows of HS + 8.
template <int HS> static __global__ void __launch_bounds__(TC_THREADS) tc_dq_kernel(struct blk_params p) {
    unsigned char *tc_sm = tc_smem();
    const int ld = HS + 8;
    bf16 *Qs = (bf16 *)tc_sm, *dOs = Qs + TC_ROWS * ld, *Ks = dOs + TC_ROWS * ld, *Vs = Ks + TC_KT * ld;
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int i0 = blockIdx.x * TC_ROWS, r0 = warp * 16;
    const bf16 *kg = p.k + b * p.kv_bs + kvh * HS, *vg = p.v + b * p.kv_bs + kvh * HS;
    float slope2 = blk_slope2(p, h);
    tc_load<HS>(Qs, ld, p.q + b * p.q_bs + h * HS, p.q_rs, i0, p.Tq, p.q0, p.cos_tab, p.sin_tab);
    tc_load<HS>(dOs, ld, p.dout + b * p.out_bs + h * HS, p.out_rs, i0, p.Tq, 0, NULL, NULL);
    int il[2] = {i0 + r0 + g, i0 + r0 + g + 8}, qpos[2] = {p.q0 + il[0], p.q0 + il[1]};
    float lse2[2], D[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        int i = il[hr] < p.Tq ? il[hr] : 0;
        lse2[hr] = p.lse[((size_t)b * p.NH + h) * p.lse_s + i] * BLK_LOG2E;
        D[hr] = p.dsum[((size_t)b * p.NH + h) * p.Tq + i];
    }
    int wlast = min(i0 + r0 + 15, p.Tq - 1);
    float dq[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    int last = min(i0 + TC_ROWS, p.Tq) - 1;
    int nk = min(p.Tk, p.q0 + last - p.k0 + 1);
    for (int j0 = 0; j0 < nk; j0 += TC_KT) {
        __syncthreads();
        tc_load<HS>(Ks, ld, kg, p.kv_rs, j0, p.Tk, p.k0, p.cos_tab, p.sin_tab);
        tc_load<HS>(Vs, ld, vg, p.kv_rs, j0, p.Tk, 0, NULL, NULL);
        __syncthreads();
        if (wlast < i0 + r0 || p.k0 + j0 > p.q0 + wlast)
            continue;
        float s[8][4], dp[8][4];
        tc_abt<HS>(s, Qs, r0, Ks, ld, g, t);
        tc_abt<HS>(dp, dOs, r0, Vs, ld, g, t);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int hr = e >> 1, j = j0 + n * 8 + 2 * t + (e & 1), kpos = p.k0 + j;
                float pv = 0.0f;
                if (il[hr] < p.Tq && j < p.Tk && kpos <= qpos[hr] && lse2[hr] != -INFINITY)
                    pv = exp2f(s[n][e] * p.scale_log2 + slope2 * (float)(kpos - qpos[hr]) - lse2[hr]);
                s[n][e] = pv * (dp[n][e] - D[hr]); // dS
            }
            // dq (16 x HS) += dS (16 x 64) . K, K's rows the keys: B[k][n] = Ks[k][n], a column pair
#pragma unroll
        for (int kc = 0; kc < 4; kc++) {
            uint32_t a[4];
            tc_acc_to_a(a, s, kc);
#pragma unroll
            for (int n = 0; n < HS / 8; n++)
                mma_bf16(dq[n], a, blk_col2(Ks, ld, kc * 16 + 2 * t, n * 8 + g),
                         blk_col2(Ks, ld, kc * 16 + 8 + 2 * t, n * 8 + g));
        }
    }
    tc_store_grad<HS>(p.dq + b * p.q_bs + h * HS, p.q_rs, dq, i0 + r0, p.Tq, p.q0, p.scale, p.cos_tab,
                      p.sin_tab, g, t);
}

// dk += scale * sum_i p_ij (dout_i . v_j - D_i) q_i and dv += sum_i p_ij dout_i over the kv head's group of
// query heads, rotated back. Grid (Tk / 64, B * NKV). Shared: Ks, Vs (the block's keys), Qs, dOs (a query
// tile), each 64 rows of HS + 8, then the query tile's lse (log2) and D.
template <int HS> static __global__ void __launch_bounds__(TC_THREADS) tc_dkdv_kernel(struct blk_params p) {
    unsigned char *tc_sm = tc_smem();
    const int ld = HS + 8;
    bf16 *Ks = (bf16 *)tc_sm, *Vs = Ks + TC_ROWS * ld, *Qs = Vs + TC_ROWS * ld, *dOs = Qs + TC_KT * ld;
    float *Ls = (float *)(dOs + TC_KT * ld), *Ds = Ls + TC_KT;
    int b = blockIdx.y / p.NKV, kvh = blockIdx.y % p.NKV, grp = p.NH / p.NKV;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int j0 = blockIdx.x * TC_ROWS, r0 = warp * 16;
    tc_load<HS>(Ks, ld, p.k + b * p.kv_bs + kvh * HS, p.kv_rs, j0, p.Tk, p.k0, p.cos_tab, p.sin_tab);
    tc_load<HS>(Vs, ld, p.v + b * p.kv_bs + kvh * HS, p.kv_rs, j0, p.Tk, 0, NULL, NULL);
    int jl[2] = {j0 + r0 + g, j0 + r0 + g + 8}, kpos[2] = {p.k0 + jl[0], p.k0 + jl[1]};
    int wfirst = j0 + r0; // the warp's first key
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[n][e] = dv[n][e] = 0.0f;
    // queries that see some key of the block: i with q0 + i >= k0 + j0, from the tile holding the first
    int istart = max(0, p.k0 + j0 - p.q0) / TC_KT * TC_KT;
    for (int hg = 0; hg < grp; hg++) {
        int h = kvh * grp + hg;
        float slope2 = blk_slope2(p, h);
        for (int i0 = istart; i0 < p.Tq; i0 += TC_KT) {
            __syncthreads(); // the previous query tile is consumed (and Ks, Vs written, the first time)
            tc_load<HS>(Qs, ld, p.q + b * p.q_bs + h * HS, p.q_rs, i0, p.Tq, p.q0, p.cos_tab, p.sin_tab);
            tc_load<HS>(dOs, ld, p.dout + b * p.out_bs + h * HS, p.out_rs, i0, p.Tq, 0, NULL, NULL);
            for (int r = threadIdx.x; r < TC_KT; r += TC_THREADS) {
                int i = i0 + r;
                Ls[r] = i < p.Tq ? p.lse[((size_t)b * p.NH + h) * p.lse_s + i] * BLK_LOG2E : -INFINITY;
                Ds[r] = i < p.Tq ? p.dsum[((size_t)b * p.NH + h) * p.Tq + i] : 0.0f;
            }
            __syncthreads();
            int ilast = min(i0 + TC_KT, p.Tq) - 1;
            if (wfirst >= p.Tk || p.k0 + wfirst > p.q0 + ilast)
                continue; // warp-uniform: no query of the tile sees a key of this warp
            // S^T (keys x queries) = K . Q^T, dP^T = V . dO^T
            float s[8][4], dp[8][4];
            tc_abt<HS>(s, Ks, r0, Qs, ld, g, t);
            tc_abt<HS>(dp, Vs, r0, dOs, ld, g, t);
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int hr = e >> 1, ic = n * 8 + 2 * t + (e & 1), i = i0 + ic, qpos = p.q0 + i;
                    float pv = 0.0f;
                    if (i < p.Tq && jl[hr] < p.Tk && kpos[hr] <= qpos && Ls[ic] != -INFINITY)
                        pv = exp2f(s[n][e] * p.scale_log2 + slope2 * (float)(kpos[hr] - qpos) - Ls[ic]);
                    s[n][e] = pv;                        // P^T
                    dp[n][e] = pv * (dp[n][e] - Ds[ic]); // dS^T
                }
                // dv (16 keys x HS) += P^T . dO and dk += dS^T . Q, the tiles' rows the queries: column pairs
#pragma unroll
            for (int kc = 0; kc < 4; kc++) {
                uint32_t ap[4], ad[4];
                tc_acc_to_a(ap, s, kc);
                tc_acc_to_a(ad, dp, kc);
#pragma unroll
                for (int n = 0; n < HS / 8; n++) {
                    mma_bf16(dv[n], ap, blk_col2(dOs, ld, kc * 16 + 2 * t, n * 8 + g),
                             blk_col2(dOs, ld, kc * 16 + 8 + 2 * t, n * 8 + g));
                    mma_bf16(dk[n], ad, blk_col2(Qs, ld, kc * 16 + 2 * t, n * 8 + g),
                             blk_col2(Qs, ld, kc * 16 + 8 + 2 * t, n * 8 + g));
                }
            }
        }
    }
    tc_store_grad<HS>(p.dk + b * p.kv_bs + kvh * HS, p.kv_rs, dk, j0 + r0, p.Tk, p.k0, p.scale, p.cos_tab,
                      p.sin_tab, g, t);
    tc_store_grad<HS>(p.dv + b * p.kv_bs + kvh * HS, p.kv_rs, dv, j0 + r0, p.Tk, 0, 1.0f, NULL, NULL, g, t);
}

// ---- launchers --------------------------------------------------------------------------------------------
#ifndef KILN_CUDA_EMU // (tests/emu launches the kernels itself)

template <int HS> static void tc_forward(struct cuda_ctx *c, const struct blk_params &p) {
    size_t smem = (size_t)3 * TC_ROWS * (HS + 8) * sizeof(bf16);
    set_smem(tc_fwd_kernel<HS>, smem);
    dim3 grid(KILN_CEIL_DIV(p.Tq, TC_ROWS), p.B * p.NH);
    tc_fwd_kernel<HS><<<grid, TC_THREADS, smem, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
}

template <int HS> static void tc_backward(struct cuda_ctx *c, const struct blk_params &p) {
    size_t s_dq = (size_t)4 * TC_ROWS * (HS + 8) * sizeof(bf16);
    size_t s_kv = s_dq + (size_t)2 * TC_KT * sizeof(float);
    set_smem(tc_dq_kernel<HS>, s_dq);
    set_smem(tc_dkdv_kernel<HS>, s_kv);
    dim3 grid_q(KILN_CEIL_DIV(p.Tq, TC_ROWS), p.B * p.NH), grid_kv(KILN_CEIL_DIV(p.Tk, TC_ROWS), p.B * p.NKV);
    tc_dq_kernel<HS><<<grid_q, TC_THREADS, s_dq, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
    tc_dkdv_kernel<HS><<<grid_kv, TC_THREADS, s_kv, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
}

// the head sizes these kernels take
static int tc_takes(int HS) {
    return HS == 64 || HS == 128;
}

int blk_tc_forward(struct cuda_ctx *c, const struct blk_params &p) {
    if (!tc_takes(p.HS))
        return 0;
    p.HS == 64 ? tc_forward<64>(c, p) : tc_forward<128>(c, p);
    return 1;
}

int blk_tc_backward(struct cuda_ctx *c, const struct blk_params &p) {
    if (!tc_takes(p.HS))
        return 0;
    p.HS == 64 ? tc_backward<64>(c, p) : tc_backward<128>(c, p);
    return 1;
}
#endif
