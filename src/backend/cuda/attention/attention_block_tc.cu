// Block attention on the tensor cores (ops.h: kiln_attn_block_args; attention_block.cuh): the kernels that
// ring and hybrid sequence parallelism run for every block of keys, for HS 64 and 128. Same function as the
// f32 kernels of attention_block.cu (KILN_ATTN_BLOCK=ref), with FA2's rounding: q and k are rotated in f32
// and rounded to bf16 once, P and dS are rounded to bf16 before their products, every sum is f32.
//
// Why it is built this way: the first version staged every tile with scalar loads and rotated q and k per
// element per tile (each K tile once per query tile, each Q tile once per key tile), and loading took ~10x
// the time of the mma work (13-21 TF/s on an H100). Now, as attention_fa2.cu does:
//   - RoPE is applied once per call by tc_rope_kernel, into scratch slot SCR_ATTN_ROT: rotated q (B, Tq, NH,
//     HS) then rotated k (B, Tk, NKV, HS), bf16, at their global positions (blk_rot, so rounded exactly as
//     before). The slot is the flash kernels' RoPE scratch (kiln_cuda_fa_rope), which lives only within one
//     op call, as this use does. Without RoPE the tiles come from q and k directly, rows their strides apart;
//   - tiles arrive by cp.async (16 bytes a copy, every copy of a tile in flight at once), double-buffered:
//     the next K/V tile (forward, dQ) or Q/dO tile (dK/dV) loads while the tensor cores work on this one;
//     rows past the block are zero-filled by the copy itself. A source whose pointer, batch stride or row
//     stride is not a multiple of 16 bytes (tc_src.vec = 0) is staged with scalar loads instead;
//   - every mma operand comes from ldmatrix (x4, and x4.trans for the B operands stored [k][n]);
//   - query tiles go out longest first (forward, dQ); masks and the ALiBi bias are evaluated only where they
//     can change something (tiles on the diagonal or the block's edges; ALiBi on).
// This version has NOT yet run on a GPU: it is checked by tests/emu (the kernels compiled as C++ against an
// emulation of the CUDA they use, which aborts on misaligned 16-byte accesses and makes early reads of a
// cp.async's destination NaN) and compiles warning-free for sm_90a. The first version passed test_cuda_ops on
// an H100 (114 checks) and the 4-GPU ring.
//
// Layout: 4 warps, each 16 rows of the block's 64 (queries in the forward and dQ, keys in dK/dV), tiles of 64
// rows staged in shared memory as bf16 rows HS + 8 apart (16 bytes of padding: ldmatrix's eight rows fall in
// different banks). Matrix products are mma.sync m16n8k16: an A fragment (16 x 16, row-major) is a0 (row g,
// cols 2t, 2t+1), a1 (row g + 8), a2 (cols + 8), a3 (both); a B fragment (16 x 8) is b0 (rows 2t, 2t+1 of
// column g) and b1 (rows + 8); the accumulator c is (row g, cols 2t, 2t+1) then (row g + 8), with g = lane /
// 4, t = lane % 4.
//
// - forward: online softmax over the visible key tiles (warps skip tiles wholly above their rows), then the
//   block's (out, lse) merged into what out and lse hold, as the f32 kernel does.
// - backward (deterministic, no atomics): dQ over key tiles per (query tile, head); dK and dV over the
//   group's query heads and query tiles per key tile; each element of dq, dk, dv read, added to and rounded
//   once.
#include "backend/cuda/attention/attention_block.cuh"

#define TC_ROWS 64 // rows a block owns: 4 warps x 16
#define TC_KT 64   // rows of a staged tile
#define TC_THREADS 128
// blocks an SM should hold, which caps a thread's registers: shared memory allows 2 at HS 128 (85 and 102
// KiB) and 4 at HS 64; dK/dV (both accumulators in registers) keep 2, at 3 they spill at HS 64
#define TC_MINB(HS) ((HS) == 64 ? 3 : 2)
#define TC_MINB_DKDV 2

// Where a staged tile's rows come from: row t of batch b, head h at p + b bs + t rs + h HS. vec: p, bs and rs
// are all multiples of 16 bytes, so rows can be copied in 16-byte pieces.
struct tc_src {
    const bf16 *p;
    size_t bs;
    int rs, vec;
};

// The kernels' parameters: the op's (blk) and the sources of the staged tiles.
struct tc_params {
    struct blk_params blk;
    struct tc_src q, k, v, dout; // q, k: the inputs, or with RoPE their rotated copies in rot
    bf16 *rot;                   // (B, Tq, NH, HS) rotated q then (B, Tk, NKV, HS) rotated k; NULL: no RoPE
};

// elements of the rotated copies (0 without RoPE)
static inline size_t tc_rot_elems(const struct blk_params &p) {
    return p.cos_tab ? (size_t)p.B * ((size_t)p.Tq * p.NH + (size_t)p.Tk * p.NKV) * p.HS : 0;
}

static inline struct tc_src tc_src_of(const bf16 *p, size_t bs, int rs) {
    struct tc_src s = {p, bs, rs, 0};
    s.vec = ((uintptr_t)p & 15) == 0 && bs % 8 == 0 && rs % 8 == 0;
    return s;
}

// The tile sources for the op's parameters p, the rotated copies (with RoPE) to go at rot.
static inline struct tc_params tc_plan(const struct blk_params &p, bf16 *rot) {
    struct tc_params t;
    t.blk = p;
    t.rot = p.cos_tab ? rot : NULL;
    if (t.rot) {
        bf16 *kr = rot + (size_t)p.B * p.Tq * p.NH * p.HS;
        t.q = tc_src_of(rot, (size_t)p.Tq * p.NH * p.HS, p.NH * p.HS);
        t.k = tc_src_of(kr, (size_t)p.Tk * p.NKV * p.HS, p.NKV * p.HS);
    } else {
        t.q = tc_src_of(p.q, p.q_bs, p.q_rs);
        t.k = tc_src_of(p.k, p.kv_bs, p.kv_rs);
    }
    t.v = tc_src_of(p.v, p.kv_bs, p.kv_rs);
    t.dout = tc_src_of(p.dout, p.out_bs, p.out_rs);
    return t;
}

// dynamic shared memory of each kernel: tiles of 64 rows of HS + 8 bf16 (forward: Q, 2 x K, 2 x V; dQ: Q, dO,
// 2 x K, 2 x V; dK/dV: K, V, 2 x Q, 2 x dO, then 2 x 64 lse and 2 x 64 D in f32)
static inline size_t tc_tile_bytes(int HS) {
    return (size_t)TC_KT * (HS + 8) * sizeof(bf16);
}
static inline size_t tc_fwd_smem(int HS) {
    return 5 * tc_tile_bytes(HS);
}
static inline size_t tc_dq_smem(int HS) {
    return 6 * tc_tile_bytes(HS);
}
static inline size_t tc_dkdv_smem(int HS) {
    return 6 * tc_tile_bytes(HS) + (size_t)4 * TC_KT * sizeof(float);
}

#ifndef KILN_CUDA_EMU // (tests/emu runs these kernels on the CPU, with shared memory of its own)
static __device__ __forceinline__ unsigned char *tc_smem(void) {
    extern __shared__ __align__(16) unsigned char tc_sm[];
    return tc_sm;
}
#endif

// ---- RoPE pre-rotation ------------------------------------------------------------------------------------

// rot = rotated q rows [0, Tq) of the call's NH heads, then rotated k rows [0, Tk) of its NKV heads, at their
// global positions, rounded to bf16 once; one element a thread, grid-stride (consecutive threads read
// consecutive columns). Rotating in the kernels would redo it for every tile. HS is 64 or 128 (tc_takes): the
// column is a mask and the row a shift, and the row's (b, t, h) come from 32-bit divisions (rows < 2^32),
// not 64-bit ones, which the GPU runs in software.
static __global__ void tc_rope_kernel(struct tc_params tp) {
    const struct blk_params &p = tp.blk;
    int HS = p.HS, sh = HS == 64 ? 6 : 7;
    size_t nq = (size_t)p.B * p.Tq * p.NH * HS, n = nq + (size_t)p.B * p.Tk * p.NKV * HS;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int isq = i < nq;
        size_t e = isq ? i : i - nq;
        unsigned r = (unsigned)(e >> sh), heads = isq ? p.NH : p.NKV, T = isq ? p.Tq : p.Tk, rt = r / heads;
        int d = (int)(e & (size_t)(HS - 1)), h = (int)(r - rt * heads), t = (int)(rt % T), b = (int)(rt / T);
        const bf16 *row = isq ? p.q + b * p.q_bs + (size_t)t * p.q_rs + h * HS
                              : p.k + b * p.kv_bs + (size_t)t * p.kv_rs + h * HS;
        tp.rot[i] = f2bf(blk_rot(row, d, HS / 2, (isq ? p.q0 : p.k0) + t, p.cos_tab, p.sin_tab));
    }
}

// ---- tiles and fragments ----------------------------------------------------------------------------------

// Rows [row0, row0 + TC_KT) of head h of batch b of s into shared memory (rows HS + 8 apart); rows >= limit
// are zero. Vector sources go by cp.async (the caller commits and waits), others by plain loads.
template <int HS>
static __device__ __forceinline__ void tc_stage(bf16 *sm, const struct tc_src &s, int b, int h, int row0,
                                                int limit) {
    constexpr int CH = HS / 8, LD = HS + 8;
    const bf16 *g = s.p + b * s.bs + (size_t)h * HS;
    if (s.vec) { // thread: column chunk c of rows r, r + RP, ...
        constexpr int RP = TC_THREADS / CH;
        int r = threadIdx.x / CH, c = threadIdx.x % CH;
        const bf16 *src = g + (size_t)(row0 + r) * s.rs + c * 8;
        bf16 *dst = sm + r * LD + c * 8;
#pragma unroll
        for (int i = 0; i < TC_KT / RP; i++, src += (size_t)RP * s.rs) {
            int ok = row0 + r + i * RP < limit;
            cp_async16(dst + i * RP * LD, ok ? src : g, ok);
        }
    } else {
#pragma unroll 1 // (a rare fallback: unrolled, it holds registers the vector path needs)
        for (int idx = threadIdx.x; idx < TC_KT * HS; idx += TC_THREADS) {
            int r = idx / HS, d = idx % HS, t = row0 + r;
            sm[r * LD + d] = t < limit ? g[(size_t)t * s.rs + d] : f2bf(0.0f);
        }
    }
}

// A (16 x 16) at rows r0.., columns k0.. of a row-major tile: matrices a0 (r, k), a1 (r + 8, k), a2 (r, k +
// 8), a3 (r + 8, k + 8); as attention_fa2.cu's frag_a
template <int HS>
static __device__ __forceinline__ void tc_frag_a(uint32_t *a, const bf16 *s, int r0, int k0) {
    int l = threadIdx.x & 31;
    ldmatrix_x4(a, s + (r0 + (l & 7) + ((l >> 3) & 1) * 8) * (HS + 8) + k0 + (l >> 4) * 8);
}

// B of two n tiles (n0.., n0 + 8..) at k0.., from a tile stored [n][k]: b[0], b[1] the first n tile's, b[2],
// b[3] the second's
template <int HS>
static __device__ __forceinline__ void tc_frag_b(uint32_t *b, const bf16 *s, int n0, int k0) {
    int l = threadIdx.x & 31;
    ldmatrix_x4(b, s + (n0 + (l & 7) + (l >> 4) * 8) * (HS + 8) + k0 + ((l >> 3) & 1) * 8);
}

// Same, from a tile stored [k][n] (transposed by ldmatrix)
template <int HS>
static __device__ __forceinline__ void tc_frag_bt(uint32_t *b, const bf16 *s, int k0, int n0) {
    int l = threadIdx.x & 31;
    ldmatrix_x4_trans(b, s + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * (HS + 8) + n0 + (l >> 4) * 8);
}

// C (16 x 64: 8 n tiles) = A (rows r0.. of tile As) . B^T, B's rows the 64 rows of tile Bs: both row-major
// over HS
template <int HS>
static __device__ __forceinline__ void tc_abt(float (*c)[4], const bf16 *As, int r0, const bf16 *Bs) {
#pragma unroll
    for (int n = 0; n < 8; n++)
        c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll
    for (int k0 = 0; k0 < HS; k0 += 16) {
        uint32_t a[4];
        tc_frag_a<HS>(a, As, r0, k0);
#pragma unroll
        for (int np = 0; np < 4; np++) {
            uint32_t b[4];
            tc_frag_b<HS>(b, Bs, np * 16, k0);
            mma_bf16(c[2 * np], a, b[0], b[1]);
            mma_bf16(c[2 * np + 1], a, b[2], b[3]);
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

// X (16 x HS: HS/8 n tiles) += A (16 x 64, accumulator fragments x[8][4], rounded to bf16 here) . Bs, the
// row-major tile Bs (64 rows of HS): B[k][n] = Bs[k][n]. P V in the forward, dS K for dQ, P^T dO and dS^T Q
// for dV and dK.
template <int HS>
static __device__ __forceinline__ void tc_acc_b(float (*acc)[4], const float (*x)[4], const bf16 *Bs) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++) { // 16 rows of Bs: x tiles 2 kc and 2 kc + 1
        uint32_t a[4];
        tc_acc_to_a(a, x, kc);
#pragma unroll
        for (int np = 0; np < HS / 16; np++) {
            uint32_t b[4];
            tc_frag_bt<HS>(b, Bs, kc * 16, np * 16);
            mma_bf16(acc[2 * np], a, b[0], b[1]);
            mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
        }
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

// Scores of a 16 x 64 tile to the log2 domain with the ALiBi bias: x = s scale_log2 + slope2 (kpos - qpos),
// -inf where masked. Element (n, e) is row hr = e / 2 (local index il[hr], position qpos[hr]) and key j0 + 8
// n + 2 t + (e & 1). Without ALiBi the bias term is +0 and skipped (the same value); without need_mask every
// element is visible.
static __device__ __forceinline__ void tc_scores(float (*s)[4], const struct blk_params &p, const int *il,
                                                 const int *qpos, int j0, int t, float slope2,
                                                 bool need_mask) {
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int hr = e >> 1, j = j0 + n * 8 + 2 * t + (e & 1), kpos = p.k0 + j;
            float x =
                p.alibi ? s[n][e] * p.scale_log2 + slope2 * (float)(kpos - qpos[hr]) : s[n][e] * p.scale_log2;
            if (need_mask && !(il[hr] < p.Tq && j < p.Tk && kpos <= qpos[hr]))
                x = -INFINITY;
            s[n][e] = x;
        }
}

// ---- forward ----------------------------------------------------------------------------------------------

// Grid (Tq / 64, B * NH), the last query tile first (it sees the most keys). Shared: Qs, then K and V tiles
// double-buffered, each 64 rows of HS + 8.
template <int HS>
static __global__ void __launch_bounds__(TC_THREADS, TC_MINB(HS)) tc_fwd_kernel(struct tc_params tp) {
    const struct blk_params &p = tp.blk;
    constexpr int LD = HS + 8;
    bf16 *Qs = (bf16 *)tc_smem(), *Ks = Qs + TC_ROWS * LD, *Vs = Ks + 2 * TC_KT * LD; // Ks, Vs: [2][64][LD]
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int i0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS, r0 = warp * 16;
    float slope2 = blk_slope2(p, h);
    // this thread's two rows (g, g + 8 of the warp's 16): local index and global position
    int il[2] = {i0 + r0 + g, i0 + r0 + g + 8}, qpos[2] = {p.q0 + il[0], p.q0 + il[1]};
    int wlast = min(i0 + r0 + 15, p.Tq - 1); // the warp's last real query (< i0 + r0: none)
    float o[HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    int last = min(i0 + TC_ROWS, p.Tq) - 1;
    int nk = min(p.Tk, p.q0 + last - p.k0 + 1); // keys some query of the block sees
    if (nk > 0) {
        tc_stage<HS>(Qs, tp.q, b, h, i0, p.Tq);
        tc_stage<HS>(Ks, tp.k, b, kvh, 0, p.Tk);
        tc_stage<HS>(Vs, tp.v, b, kvh, 0, p.Tk);
        cp_async_commit();
    }
    for (int j0 = 0, buf = 0; j0 < nk; j0 += TC_KT, buf ^= 1) {
        if (j0 + TC_KT < nk) { // the next tile loads while this one is used
            tc_stage<HS>(Ks + (buf ^ 1) * TC_KT * LD, tp.k, b, kvh, j0 + TC_KT, p.Tk);
            tc_stage<HS>(Vs + (buf ^ 1) * TC_KT * LD, tp.v, b, kvh, j0 + TC_KT, p.Tk);
        }
        cp_async_commit(); // possibly empty: "all but the newest group" is then this tile
        cp_async_wait<1>();
        __syncthreads();
        // warp-uniform: some row of this warp sees a key of the tile
        if (wlast >= i0 + r0 && p.k0 + j0 <= p.q0 + wlast) {
            const bf16 *Kb = Ks + buf * TC_KT * LD, *Vb = Vs + buf * TC_KT * LD;
            bool need_mask =
                wlast < i0 + r0 + 15 || j0 + TC_KT > p.Tk || p.k0 + j0 + TC_KT - 1 > p.q0 + i0 + r0;
            float s[8][4];
            tc_abt<HS>(s, Qs, r0, Kb);
            tc_scores(s, p, il, qpos, j0, t, slope2, need_mask);
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
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
            tc_acc_b<HS>(o, s, Vb);
        }
        __syncthreads(); // buffer buf is refilled by the next iteration
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

// dq += scale * sum_j p_ij (dout_i . v_j - D_i) k_j, rotated back. Grid (Tq / 64, B * NH), the last query
// tile first. Shared: Qs, dOs, then K and V tiles double-buffered, each 64 rows of HS + 8.
template <int HS>
static __global__ void __launch_bounds__(TC_THREADS, TC_MINB(HS)) tc_dq_kernel(struct tc_params tp) {
    const struct blk_params &p = tp.blk;
    constexpr int LD = HS + 8;
    bf16 *Qs = (bf16 *)tc_smem(), *dOs = Qs + TC_ROWS * LD, *Ks = dOs + TC_ROWS * LD,
         *Vs = Ks + 2 * TC_KT * LD;
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH, kvh = h / (p.NH / p.NKV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int i0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS, r0 = warp * 16;
    float slope2 = blk_slope2(p, h);
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
    if (nk > 0) {
        tc_stage<HS>(Qs, tp.q, b, h, i0, p.Tq);
        tc_stage<HS>(dOs, tp.dout, b, h, i0, p.Tq);
        tc_stage<HS>(Ks, tp.k, b, kvh, 0, p.Tk);
        tc_stage<HS>(Vs, tp.v, b, kvh, 0, p.Tk);
        cp_async_commit();
    }
    for (int j0 = 0, buf = 0; j0 < nk; j0 += TC_KT, buf ^= 1) {
        if (j0 + TC_KT < nk) {
            tc_stage<HS>(Ks + (buf ^ 1) * TC_KT * LD, tp.k, b, kvh, j0 + TC_KT, p.Tk);
            tc_stage<HS>(Vs + (buf ^ 1) * TC_KT * LD, tp.v, b, kvh, j0 + TC_KT, p.Tk);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (wlast >= i0 + r0 && p.k0 + j0 <= p.q0 + wlast) {
            const bf16 *Kb = Ks + buf * TC_KT * LD, *Vb = Vs + buf * TC_KT * LD;
            bool need_mask =
                wlast < i0 + r0 + 15 || j0 + TC_KT > p.Tk || p.k0 + j0 + TC_KT - 1 > p.q0 + i0 + r0;
            float s[8][4], dp[8][4];
            tc_abt<HS>(s, Qs, r0, Kb);
            tc_abt<HS>(dp, dOs, r0, Vb);
            tc_scores(s, p, il, qpos, j0, t, slope2, need_mask);
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int hr = e >> 1;
                    float pv = 0.0f;
                    if (s[n][e] != -INFINITY && lse2[hr] != -INFINITY)
                        pv = exp2f(s[n][e] - lse2[hr]);
                    s[n][e] = pv * (dp[n][e] - D[hr]); // dS
                }
            tc_acc_b<HS>(dq, s, Kb); // dq (16 x HS) += dS (16 x 64) . K, K's rows the keys
        }
        __syncthreads();
    }
    tc_store_grad<HS>(p.dq + b * p.q_bs + h * HS, p.q_rs, dq, i0 + r0, p.Tq, p.q0, p.scale, p.cos_tab,
                      p.sin_tab, g, t);
}

// dk += scale * sum_i p_ij (dout_i . v_j - D_i) q_i and dv += sum_i p_ij dout_i over the kv head's group of
// query heads, rotated back. Grid (Tk / 64, B * NKV). Shared: Ks, Vs (the block's keys), then Q and dO tiles
// double-buffered, each 64 rows of HS + 8, then the query tiles' lse (log2) and D, double-buffered.
template <int HS>
static __global__ void __launch_bounds__(TC_THREADS, TC_MINB_DKDV) tc_dkdv_kernel(struct tc_params tp) {
    const struct blk_params &p = tp.blk;
    constexpr int LD = HS + 8;
    bf16 *Ks = (bf16 *)tc_smem(), *Vs = Ks + TC_ROWS * LD, *Qs = Vs + TC_ROWS * LD,
         *dOs = Qs + 2 * TC_KT * LD;
    float *Ls = (float *)(dOs + 2 * TC_KT * LD), *Ds = Ls + 2 * TC_KT; // [2][64] each
    int b = blockIdx.y / p.NKV, kvh = blockIdx.y % p.NKV, grp = p.NH / p.NKV;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int j0 = blockIdx.x * TC_ROWS, r0 = warp * 16;
    int jl[2] = {j0 + r0 + g, j0 + r0 + g + 8}, kpos[2] = {p.k0 + jl[0], p.k0 + jl[1]};
    int wfirst = j0 + r0; // the warp's first key
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[n][e] = dv[n][e] = 0.0f;
    // queries that see some key of the block: i with q0 + i >= k0 + j0, from the tile holding the first; the
    // iterations run over (head of the group, query tile from istart)
    int istart = max(0, p.k0 + j0 - p.q0) / TC_KT * TC_KT;
    int nq = istart < p.Tq ? KILN_CEIL_DIV(p.Tq - istart, TC_KT) : 0, n_it = grp * nq;
    if (n_it > 0) {
        int h = kvh * grp;
        tc_stage<HS>(Ks, tp.k, b, kvh, j0, p.Tk);
        tc_stage<HS>(Vs, tp.v, b, kvh, j0, p.Tk);
        tc_stage<HS>(Qs, tp.q, b, h, istart, p.Tq);
        tc_stage<HS>(dOs, tp.dout, b, h, istart, p.Tq);
        cp_async_commit();
        for (int r = threadIdx.x; r < TC_KT; r += TC_THREADS) {
            int i = istart + r;
            Ls[r] = i < p.Tq ? p.lse[((size_t)b * p.NH + h) * p.lse_s + i] * BLK_LOG2E : -INFINITY;
            Ds[r] = i < p.Tq ? p.dsum[((size_t)b * p.NH + h) * p.Tq + i] : 0.0f;
        }
    }
    for (int it = 0, buf = 0; it < n_it; it++, buf ^= 1) {
        int h = kvh * grp + it / nq, i0 = istart + it % nq * TC_KT;
        // the next tile's Q and dO load during this one's math; its lse and D (in registers) are stored after
        float nl = -INFINITY, nd = 0.0f;
        if (it + 1 < n_it) {
            int nh = kvh * grp + (it + 1) / nq, ni0 = istart + (it + 1) % nq * TC_KT,
                i = ni0 + (int)threadIdx.x;
            tc_stage<HS>(Qs + (buf ^ 1) * TC_KT * LD, tp.q, b, nh, ni0, p.Tq);
            tc_stage<HS>(dOs + (buf ^ 1) * TC_KT * LD, tp.dout, b, nh, ni0, p.Tq);
            if (threadIdx.x < TC_KT && i < p.Tq) {
                nl = p.lse[((size_t)b * p.NH + nh) * p.lse_s + i] * BLK_LOG2E;
                nd = p.dsum[((size_t)b * p.NH + nh) * p.Tq + i];
            }
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        int ilast = min(i0 + TC_KT, p.Tq) - 1;
        // warp-uniform: some query of the tile sees a key of this warp
        if (wfirst < p.Tk && p.k0 + wfirst <= p.q0 + ilast) {
            const bf16 *Qb = Qs + buf * TC_KT * LD, *dOb = dOs + buf * TC_KT * LD;
            const float *Lb = Ls + buf * TC_KT, *Db = Ds + buf * TC_KT;
            float slope2 = blk_slope2(p, h);
            bool need_mask = wfirst + 15 >= p.Tk || ilast < i0 + TC_KT - 1 || p.k0 + wfirst + 15 > p.q0 + i0;
            // S^T (keys x queries) = K . Q^T, dP^T = V . dO^T
            float s[8][4], dp[8][4];
            tc_abt<HS>(s, Ks, r0, Qb);
            tc_abt<HS>(dp, Vs, r0, dOb);
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int hr = e >> 1, ic = n * 8 + 2 * t + (e & 1), i = i0 + ic, qpos = p.q0 + i;
                    float pv = 0.0f;
                    if ((!need_mask || (i < p.Tq && jl[hr] < p.Tk && kpos[hr] <= qpos)) &&
                        Lb[ic] != -INFINITY) {
                        float x = p.alibi ? s[n][e] * p.scale_log2 + slope2 * (float)(kpos[hr] - qpos)
                                          : s[n][e] * p.scale_log2;
                        pv = exp2f(x - Lb[ic]);
                    }
                    s[n][e] = pv;                        // P^T
                    dp[n][e] = pv * (dp[n][e] - Db[ic]); // dS^T
                }
            // dv (16 keys x HS) += P^T . dO and dk += dS^T . Q, the tiles' rows the queries
            tc_acc_b<HS>(dv, s, dOb);
            tc_acc_b<HS>(dk, dp, Qb);
        }
        if (it + 1 < n_it && threadIdx.x < TC_KT) { // buffer buf ^ 1 was released by the last barrier
            Ls[(buf ^ 1) * TC_KT + threadIdx.x] = nl;
            Ds[(buf ^ 1) * TC_KT + threadIdx.x] = nd;
        }
        __syncthreads(); // buffer buf is refilled by the next iteration
    }
    tc_store_grad<HS>(p.dk + b * p.kv_bs + kvh * HS, p.kv_rs, dk, j0 + r0, p.Tk, p.k0, p.scale, p.cos_tab,
                      p.sin_tab, g, t);
    tc_store_grad<HS>(p.dv + b * p.kv_bs + kvh * HS, p.kv_rs, dv, j0 + r0, p.Tk, 0, 1.0f, NULL, NULL, g, t);
}

// ---- launchers --------------------------------------------------------------------------------------------
#ifndef KILN_CUDA_EMU // (tests/emu launches the kernels itself)

// The tiles' sources, with RoPE after rotating q and k into scratch slot SCR_ATTN_ROT (free between op calls:
// the flash kernels' kiln_cuda_fa_rope uses it only within theirs).
static struct tc_params tc_prepare(struct cuda_ctx *c, const struct blk_params &p) {
    size_t n = tc_rot_elems(p);
    bf16 *rot = n ? (bf16 *)kiln_cuda_scratch(c, SCR_ATTN_ROT, n * sizeof(bf16)) : NULL;
    struct tc_params tp = tc_plan(p, rot);
    if (n) {
        size_t want = KILN_CEIL_DIV(n, (size_t)256);
        unsigned blocks = (unsigned)(want < 4096 ? want : 4096); // grid-stride beyond
        tc_rope_kernel<<<blocks, 256, 0, c->stream>>>(tp);
        CUDA_CHECK_LAUNCH();
    }
    return tp;
}

template <int HS> static void tc_forward(struct cuda_ctx *c, const struct tc_params &tp) {
    size_t smem = tc_fwd_smem(HS);
    set_smem(tc_fwd_kernel<HS>, smem);
    dim3 grid(KILN_CEIL_DIV(tp.blk.Tq, TC_ROWS), tp.blk.B * tp.blk.NH);
    tc_fwd_kernel<HS><<<grid, TC_THREADS, smem, c->stream>>>(tp);
    CUDA_CHECK_LAUNCH();
}

template <int HS> static void tc_backward(struct cuda_ctx *c, const struct tc_params &tp) {
    const struct blk_params &p = tp.blk;
    size_t s_dq = tc_dq_smem(HS), s_kv = tc_dkdv_smem(HS);
    set_smem(tc_dq_kernel<HS>, s_dq);
    set_smem(tc_dkdv_kernel<HS>, s_kv);
    dim3 grid_q(KILN_CEIL_DIV(p.Tq, TC_ROWS), p.B * p.NH), grid_kv(KILN_CEIL_DIV(p.Tk, TC_ROWS), p.B * p.NKV);
    tc_dq_kernel<HS><<<grid_q, TC_THREADS, s_dq, c->stream>>>(tp);
    CUDA_CHECK_LAUNCH();
    tc_dkdv_kernel<HS><<<grid_kv, TC_THREADS, s_kv, c->stream>>>(tp);
    CUDA_CHECK_LAUNCH();
}

// the head sizes these kernels take
static int tc_takes(int HS) {
    return HS == 64 || HS == 128;
}

int blk_tc_forward(struct cuda_ctx *c, const struct blk_params &p, int wgmma) {
    if (!tc_takes(p.HS))
        return 0;
    struct tc_params tp = tc_prepare(c, p);
    if (wgmma && blk_wgmma_forward(c, p, tp.q.p, tp.q.bs, tp.q.rs, tp.k.p, tp.k.bs, tp.k.rs))
        return 1;
    p.HS == 64 ? tc_forward<64>(c, tp) : tc_forward<128>(c, tp);
    return 1;
}

int blk_tc_backward(struct cuda_ctx *c, const struct blk_params &p, int wgmma) {
    if (!tc_takes(p.HS))
        return 0;
    struct tc_params tp = tc_prepare(c, p);
    if (wgmma && blk_wgmma_backward(c, p, tp.q.p, tp.q.bs, tp.q.rs, tp.k.p, tp.k.bs, tp.k.rs))
        return 1;
    p.HS == 64 ? tc_backward<64>(c, tp) : tc_backward<128>(c, tp);
    return 1;
}
#endif
