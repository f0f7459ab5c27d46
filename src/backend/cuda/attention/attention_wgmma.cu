// Causal attention forward and backward on Hopper's warpgroup MMA (wgmma) and tensor-memory accelerator
// (TMA), after FlashAttention-3 (Shah et al. 2024). On an sm_90 device, in a build that targets sm_90a (the
// default KILN_CUDA_ARCHS, "90a;80"), these are the default forward and backward (KILN_ATTN=fa2 or =ref
// selects the older kernels); everywhere else kiln_cuda_wgmma_attention_forward and _backward return 0 and
// attention.cu runs the FA2 kernels (attention_fa2.cu). The forward is described at wg_fwd_kernel, the
// backward at wg_bwd_kernel; docs/wgmma_attention.md has the design, what is verified and the measurements.
//
// Same math and conventions as attention_fa2.cu: s_ij = scale q_i.k_j + slope_h (j - i) in the log2 domain,
// key j > query i masked, online softmax (attn_online_softmax, shared with FA2), P rounded to bf16 before
// P.V, the row sum taken over the unrounded P, lse (natural log) to (B, NH, T), out bf16 (B, T, NH HS). RoPE:
// q and k are pre-rotated into scratch by fa_setup's kernel (shared with attention_fa2.cu through
// kiln_cuda_fa_rope).
//
// Both kernels: 3 warpgroups (384 threads). Warpgroup 0, the producer, gives registers back (setmaxnreg.dec
// to 24) and one of its threads issues the TMA copies into rings of shared-memory stages, each guarded by a
// "full" mbarrier (TMA's byte count completes it) and an "empty" one (all 256 consumer threads arrive once
// done with the stage). Warpgroups 1 and 2, the consumers (setmaxnreg.inc to 240), run the wgmma: operands
// from shared memory through 128-byte-swizzled descriptors, or (P, dS) straight from the accumulator
// registers of the previous wgmma, whose layout is the register-A layout of the next (as with mma.sync).
// The forward's consumers take the tensor cores in turns (ping-pong, KILN_WGMMA_FWD=overlap: not); the
// backward's consumers split each tile's dQ by columns and add it through shared memory with TMA's bulk
// reduce-add (KILN_WGMMA_DQ=tma|red|red-split: one consumer a tile, or vector REDs; tma-early: the default's
// dV and dK products issued before the dS^T stores; tma-early2, tma-dqfirst, tma-dqpw: see wg_bwd_kernel).
// The PTX wrappers they are built from are in wgmma_primitives.cuh. Not done yet (see the doc): a TMA store
// of O.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attention/attention_block.cuh"
#include "backend/cuda/attention/attn_common.cuh"

#if defined(KILN_HAVE_SM90A)
#include <cuda.h> // CUtensorMap and its enums (the encoder itself comes through the runtime's entry point)
#include <cudaTypedefs.h>
#endif

#define WG_LOG2E 1.4426950408889634f
#define WG_LN2 0.6931471805599453f

#if defined(KILN_HAVE_SM90A)

// Device helpers exist only where they can be compiled and used: the sm_90a device pass (and the host pass,
// which ignores them); an sm_80 pass of a "90a;80" build sees the kernel's empty stub only.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_DEVICE_HELPERS 1
#endif

#include "backend/cuda/attention/wgmma_primitives.cuh"

// ---- the kernel -------------------------------------------------------------------------------------------
struct wg_params {
    CUtensorMap tq, tk,
        tv;     // 4-D maps (d, head, t, b) over q, k, v rows; boxes (64, 1, BM or BN, 1), swizzled
    bf16 *out;  // query i of batch b, head h at out + b out_bs + i out_rs + h HS
    float *lse; // (b NH + h) lse_s + i
    size_t out_bs, lse_s;
    int out_rs;
    // Tq queries, Tk keys; key j is visible to query i when j <= i + delta (the whole sequence: Tq = Tk = T,
    // delta 0; a block of the ring: the global positions' difference q0 - k0 >= 0, attention_block.cu)
    int Tq, Tk, delta, NH, NKV, B;
    int alibi;
    int accumulate; // 0: out, lse written; 1: merged into what they hold (the block op's accumulate)
    float scale_log2;
};

#define WG_BM 128 // query rows per work item: two consumer warpgroups of 64
#define WG_THREADS 384

// K/V ring stages: three where shared memory allows (HS 64), two at HS 128 (2 Q buffers + 2 x 2 x 32 KiB)
template <int HS> static constexpr __host__ __device__ int wg_stages(void) {
    return HS == 64 ? 3 : 2;
}

// Shared memory: Q [2 buffers][HS/64][BM][64] | K [stages][HS/64][BN][64] | V, same | mbarriers (q full and
// empty [2] each, k full, v full, k empty, v empty [stages] each); plus up to 1023 bytes to align the start
// to 1024.
template <int HS, int BN> static constexpr size_t wg_smem_bytes(void) {
    return (size_t)(2 * WG_BM + 2 * wg_stages<HS>() * BN) * HS * 2 + (4 + 4 * wg_stages<HS>()) * 8 + 1024;
}

#if defined(WG_DEVICE_HELPERS)
// Key tiles of BN that query tile q0's rows see: keys j < Tk with j <= i + delta for some row i < Tq of it.
template <int BN> static __device__ __forceinline__ int wg_key_tiles(const struct wg_params &p, int q0) {
    return KILN_CEIL_DIV(min(min(q0 + WG_BM, p.Tq) + p.delta, p.Tk), BN);
}

// Work item w (0 .. n_qt B NH - 1) -> query tile and (b, h): the longest tiles (causal: the most keys) first,
// so that blocks striding over the items by gridDim.x finish together.
static __device__ __forceinline__ void wg_item(int w, int n_qt, int NH, int B, int *qt, int *b, int *h) {
    int bh = w % (B * NH);
    *qt = n_qt - 1 - w / (B * NH);
    *b = bh / NH;
    *h = bh % NH;
}

// S (64 x BN) = Q (64 x HS) K^T: Q rows of this warpgroup at q_addr (column block c at + c cb_q bytes), K
// tile at k_addr (column block c at + c BN 128).
template <int HS, int BN>
static __device__ __forceinline__ void wg_qk(float *s, uint32_t q_addr, uint32_t k_addr) {
    constexpr uint32_t CB_Q = WG_BM * 128, CB_K = BN * 128;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t off = (kk & 3) * 32;
        uint64_t da = wg_desc(q_addr + (kk >> 2) * CB_Q + off, 16, 1024);
        uint64_t db = wg_desc(k_addr + (kk >> 2) * CB_K + off, 16, 1024);
        if (BN == 128)
            wgmma_ss_n128(s, da, db, kk > 0);
        else
            wgmma_ss_n64<0, 0>(s, da, db, kk > 0);
    }
}

// O (64 x HS) += P (64 x BN, bf16 register fragments p[BN / 16][4]) V (BN x HS at v_addr, MN-major)
template <int HS, int BN>
static __device__ __forceinline__ void wg_pv(float *o, const uint32_t (*p)[4], uint32_t v_addr) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        uint64_t db = wg_desc(v_addr + kk * 2048, BN * 128, 1024);
        if (HS == 128)
            wgmma_rs_n128(o, p[kk], db);
        else
            wgmma_rs_n64(o, p[kk], db);
    }
}

// P (f32 accumulator layout) rounded to bf16 into the register A fragments of P V: k-step kk covers columns
// 16 kk .. 16 kk + 15, i.e. accumulator n-blocks 2 kk (registers 8 kk .. 8 kk + 3) and 2 kk + 1.
template <int BN> static __device__ __forceinline__ void wg_pack_p(uint32_t (*pa)[4], const float *s) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
}
#endif // WG_DEVICE_HELPERS

// Forward. A work item is 128 query rows of one (b, h); each consumer warpgroup owns 64 of them, S (64 x BN)
// = Q K^T with both operands in shared memory, O (64 x HS) += P V with P from registers and V transposed by
// its descriptor (MN-major). Persistent: gridDim.x blocks (one per SM) stride over the items (wg_item). The
// producer runs ahead across items (Q double-buffered, K/V through the ring), so one item's first loads
// overlap the last one's tail and epilogue. Within a consumer warpgroup, FA3's intra-warpgroup overlap: the S
// = Q K^T wgmma of tile j is issued together with the P V wgmma of tile j - 1, and the softmax of tile j runs
// while P V is still on the tensor cores.
// PP: the two consumers' wgmmas in turns (pp_turn_wait); both then run every key tile of an item (no n_mine
// shortcut: it skips a tile only in blocks whose offset delta puts a key tile wholly after consumer 0's rows,
// never in the whole sequence or the zigzag ring's blocks), so that their turns pair up: n_kv + 1 turns each
// an item, and consumer 0's extra wait at the end takes consumer 1's first give (which opens the kernel).
template <int HS, int BN, bool PP>
static __global__ void __launch_bounds__(WG_THREADS, 1)
    wg_fwd_kernel(const __grid_constant__ struct wg_params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int CB = HS / 64;                  // 128-byte column blocks per row
    constexpr int NS = wg_stages<HS>();          // K/V ring stages
    constexpr uint32_t Q_BYTES = WG_BM * HS * 2; // one Q tile
    constexpr uint32_t KV_BYTES = BN * HS * 2;   // one K (or V) stage
    extern __shared__ __align__(16) unsigned char wg_smem[];
    uint32_t base = (uint32_t)__cvta_generic_to_shared(wg_smem);
    base = (base + 1023) & ~1023u;
    uint32_t q_s = base, k_s = q_s + 2 * Q_BYTES, v_s = k_s + NS * KV_BYTES, bars = v_s + NS * KV_BYTES;
    // mbarriers, 8 bytes each
    uint32_t q_full = bars, q_empty = bars + 16, k_full = bars + 32, v_full = k_full + 8 * NS,
             k_empty = v_full + 8 * NS, v_empty = k_empty + 8 * NS;
    int n_qt = KILN_CEIL_DIV(p.Tq, WG_BM), n_items = n_qt * p.B * p.NH;
    int wg = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; s++) {
            mbar_init(q_full + 8 * s, 1);
            mbar_init(q_empty + 8 * s, 2 * 128);
        }
        for (int s = 0; s < NS; s++) {
            mbar_init(k_full + 8 * s, 1);
            mbar_init(v_full + 8 * s, 1);
            mbar_init(k_empty + 8 * s, 2 * 128);
            mbar_init(v_empty + 8 * s, 2 * 128);
        }
        // make the initialized barriers visible to the async proxy (TMA's complete_tx)
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads(); // the last block-wide barrier: the warpgroups go separate ways below

    if (wg == 0) {
        // ---- producer: item i uses Q buffer i & 1; the block's c-th K/V tile uses stage c % NS ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (threadIdx.x == 0) {
            int kc = 0, ic = 0;
            for (int w = blockIdx.x; w < n_items; w += gridDim.x, ic++) {
                int qt, b, h;
                wg_item(w, n_qt, p.NH, p.B, &qt, &b, &h);
                int kvh = h / (p.NH / p.NKV), q0 = qt * WG_BM;
                int n_kv = wg_key_tiles<BN>(p, q0), qb = ic & 1;
                if (ic >= 2) // buffer qb last held item ic - 2
                    mbar_wait(q_empty + 8 * qb, ((ic >> 1) - 1) & 1);
                mbar_expect_tx(q_full + 8 * qb, Q_BYTES);
                for (int c = 0; c < CB; c++)
                    tma_load_4d(q_s + qb * Q_BYTES + c * WG_BM * 128, &p.tq, c * 64, h, q0, b,
                                q_full + 8 * qb);
                for (int j = 0; j < n_kv; j++, kc++) {
                    int s = kc % NS;
                    uint32_t ep = ((kc / NS) - 1) & 1; // the phase that released this stage's last use
                    if (kc >= NS)
                        mbar_wait(k_empty + 8 * s, ep);
                    mbar_expect_tx(k_full + 8 * s, KV_BYTES);
                    for (int c = 0; c < CB; c++)
                        tma_load_4d(k_s + s * KV_BYTES + c * BN * 128, &p.tk, c * 64, kvh, j * BN, b,
                                    k_full + 8 * s);
                    if (kc >= NS)
                        mbar_wait(v_empty + 8 * s, ep);
                    mbar_expect_tx(v_full + 8 * s, KV_BYTES);
                    for (int c = 0; c < CB; c++)
                        tma_load_4d(v_s + s * KV_BYTES + c * BN * 128, &p.tv, c * 64, kvh, j * BN, b,
                                    v_full + 8 * s);
                }
            }
        }
        return;
    }

    // ---- consumers ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    int cw = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    int kc = 0, ic = 0;
    if (PP && cw == 1)
        pp_turn_give(1); // consumer 0 goes first
    for (int w = blockIdx.x; w < n_items; w += gridDim.x, ic++) {
        int qt, b, h;
        wg_item(w, n_qt, p.NH, p.B, &qt, &b, &h);
        int q0 = qt * WG_BM, qb = ic & 1;
        int n_kv = wg_key_tiles<BN>(p, q0);
        int qw0 = q0 + cw * 64;                                     // first query row of this warpgroup
        int qi[2] = {qw0 + warp * 16 + g, qw0 + warp * 16 + g + 8}; // the two rows this thread holds
        // the keys' index of the last key each row sees (the mask's bound; qi itself for the whole sequence)
        int qv[2] = {qi[0] + p.delta, qi[1] + p.delta};
        // tiles with a key visible to this warpgroup's last row (the rest are all masked; PP runs them all)
        int n_mine = PP ? n_kv : min(n_kv, (qw0 + 63 + p.delta) / BN + 1);
        float slope2 = p.alibi ? alibi_slope(h, p.NH) * WG_LOG2E : 0.0f;
        uint32_t q_mine = q_s + qb * Q_BYTES + cw * 64 * 128; // this warpgroup's 64 rows of buffer qb

        float o[HS / 2], s[BN / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int i = 0; i < HS / 2; i++)
            o[i] = 0.0f;
        mbar_wait(q_full + 8 * qb, (ic >> 1) & 1);

        // tile 0: S, softmax, P
        {
            int st = kc % NS;
            uint32_t par = (kc / NS) & 1;
            mbar_wait(k_full + 8 * st, par);
            if (PP)
                pp_turn_wait(cw);
            reg_fence<BN / 2>(s);
            wgmma_fence();
            wg_qk<HS, BN>(s, q_mine, k_s + st * KV_BYTES);
            wgmma_commit();
            if (PP)
                pp_turn_give(cw);
            wgmma_wait<0>();
            reg_fence<BN / 2>(s);
            mbar_arrive(k_empty + 8 * st);
            attn_online_softmax<BN>(s, m, l, alpha, 0, qv, t4, p.alibi, slope2, p.scale_log2, p.Tk,
                                    BN - 1 > qw0 + p.delta || BN > p.Tk);
            wg_pack_p<BN>(pa, s);
        }
        for (int j = 1; j < n_mine; j++) {
            int st = (kc + j) % NS, sp = (kc + j - 1) % NS, k0 = j * BN;
            uint32_t par = ((kc + j) / NS) & 1, parp = ((kc + j - 1) / NS) & 1;
            mbar_wait(k_full + 8 * st, par);
            if (PP)
                pp_turn_wait(cw);
            reg_fence<BN / 2>(s);
            reg_fence<HS / 2>(o);
            reg_fence_u32<BN / 4>(&pa[0][0]); // the packs may not sink below the wgmma.fence
            wgmma_fence();
            wg_qk<HS, BN>(s, q_mine, k_s + st * KV_BYTES); // S(j)
            wgmma_commit();
            mbar_wait(v_full + 8 * sp, parp);
            wgmma_fence(); // orders nothing new, but ptxas would insert it (C7519) if it were left out
            wg_pv<HS, BN>(o, pa, v_s + sp * KV_BYTES); // O += P(j - 1) V(j - 1)
            wgmma_commit();
            if (PP)
                pp_turn_give(cw);
            wgmma_wait<1>(); // S(j) done; P V may still run
            reg_fence<BN / 2>(s);
            mbar_arrive(k_empty + 8 * st);
            attn_online_softmax<BN>(s, m, l, alpha, k0, qv, t4, p.alibi, slope2, p.scale_log2, p.Tk,
                                    k0 + BN - 1 > qw0 + p.delta || k0 + BN > p.Tk);
            wgmma_wait<0>();
            reg_fence<HS / 2>(o);
            reg_fence_u32<BN / 4>(&pa[0][0]); // P(j - 1)'s registers were the tensor cores' until the wait
            mbar_arrive(v_empty + 8 * sp);
#pragma unroll
            for (int i = 0; i < HS / 2; i++)
                o[i] *= alpha[(i >> 1) & 1];
            wg_pack_p<BN>(pa, s);
        }
        { // the last tile's P V
            int sp = (kc + n_mine - 1) % NS;
            mbar_wait(v_full + 8 * sp, ((kc + n_mine - 1) / NS) & 1);
            if (PP)
                pp_turn_wait(cw);
            reg_fence<HS / 2>(o);
            reg_fence_u32<BN / 4>(&pa[0][0]);
            wgmma_fence();
            wg_pv<HS, BN>(o, pa, v_s + sp * KV_BYTES);
            wgmma_commit();
            if (PP)
                pp_turn_give(cw);
            wgmma_wait<0>();
            reg_fence<HS / 2>(o);
            reg_fence_u32<BN / 4>(&pa[0][0]);
            mbar_arrive(v_empty + 8 * sp);
        }
        mbar_arrive(q_empty + 8 * qb);        // every S of this item is done: buffer qb may be refilled
        for (int j = n_mine; j < n_kv; j++) { // tiles wholly above this warpgroup's rows: keep phases in step
            int st = (kc + j) % NS;
            uint32_t par = ((kc + j) / NS) & 1;
            mbar_wait(k_full + 8 * st, par);
            mbar_arrive(k_empty + 8 * st);
            mbar_wait(v_full + 8 * st, par);
            mbar_arrive(v_empty + 8 * st);
        }
        kc += n_kv;

        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            inv[r] = 1.0f / l[r];
        }
        bf16 *og = p.out + (size_t)b * p.out_bs + h * HS;
        float *lg = p.lse + ((size_t)b * p.NH + h) * p.lse_s;
        float lse_n[2], wo[2] = {0.0f, 0.0f}; // the rows' log-sum-exp, and the weights of what out held
#pragma unroll
        for (int r = 0; r < 2; r++)
            lse_n[r] = (m[r] + __log2f(l[r])) * WG_LN2;
        if (p.accumulate) { // merged by the log-sum-exps, as the block kernels do (every row saw a key)
            float lo[2];
#pragma unroll
            for (int r = 0; r < 2; r++)
                lo[r] = qi[r] < p.Tq ? lg[qi[r]] : -INFINITY;
            __syncwarp(); // the quad's four threads have read the old lse before thread t4 = 0 rewrites it
#pragma unroll
            for (int r = 0; r < 2; r++)
                if (lo[r] != -INFINITY) { // (an old row that saw no key holds nothing to keep)
                    float mm = fmaxf(lo[r], lse_n[r]), ln = mm + logf(expf(lo[r] - mm) + expf(lse_n[r] - mm));
                    wo[r] = expf(lo[r] - ln);
                    inv[r] *= expf(lse_n[r] - ln);
                    lse_n[r] = ln;
                }
        }
#pragma unroll
        for (int i = 0; i < HS / 2; i += 2) {
            int r = (i >> 1) & 1, d = (i >> 2) * 8 + t4 * 2;
            if (qi[r] < p.Tq) {
                __nv_bfloat162 *dst = (__nv_bfloat162 *)(og + (size_t)qi[r] * p.out_rs + d);
                float x0 = o[i] * inv[r], x1 = o[i + 1] * inv[r];
                if (wo[r] != 0.0f) {
                    float2 old = __bfloat1622float2(*dst);
                    x0 = fmaf(wo[r], old.x, x0);
                    x1 = fmaf(wo[r], old.y, x1);
                }
                *dst = __floats2bfloat162_rn(x0, x1);
            }
        }
        if (t4 == 0) {
            for (int r = 0; r < 2; r++)
                if (qi[r] < p.Tq)
                    lg[qi[r]] = lse_n[r];
        }
    }
    if (PP && cw == 0) {
        __syncwarp();    // (the epilogue's branches reconverged before the aligned barrier)
        pp_turn_wait(0); // consumer 1's last give: every arrival at barriers 4 and 5 is taken
    }
#endif
}

// ---- backward ---------------------------------------------------------------------------------------------
// FlashAttention-3's backward, first stage: one block per WB_BN = 128 keys of one kv head, looping over the
// group's query heads and the query tiles of WB_BM = 64 from the diagonal on (as fa_bwd_fused_kernel).
//   - warpgroup 0, the producer (setmaxnreg.dec 24): thread 0 copies K and V once (TMA, kv_full), then Q
//     and dO of every tile into a 2-stage ring (full / empty mbarriers, as the forward's K/V ring); warps 1
//     and 2 put lse log2(e) and D of the tile's rows into the same stage (one row a thread);
//   - warpgroups 1 and 2, the consumers (setmaxnreg.inc 240): consumer c owns keys k0 + 64 c .. + 63 and
//     keeps their dK, dV (64 x HS each) in wgmma accumulators over all tiles. Per tile, with the operands
//     swapped (FA3's SdP_swapAB) so that P and dS come out keys-major, the layout the next wgmma wants as
//     register A:
//       S^T (64 keys x 64 queries) = K_c Q^T, dP^T = V_c dO^T      (SS, both K-major: the forward's wg_qk)
//       P^T = exp2(S^T scale_log2 + slope (j - i) - lse_i log2 e), masked to 0; dS^T = P^T (dP^T - D_i)
//       dV_c += P^T dO, dK_c += dS^T Q        (RS: P^T, dS^T rounded to bf16 in registers; dO, Q MN-major)
//       dS^T (bf16) -> shared memory [key][query], 128-byte swizzled; barrier of both consumers
//       dQ (64 queries x HS) += dS K           (by consumer it % 2 alone, or with SPLIT a 64-column pass by
//                                               each; over all 128 keys from both dS^T buffers; SS, both
//                                               MN-major; 64 d-columns a pass), added by TMA's reduce-add
//                                               (or vector REDs) to the f32 dq_acc that fa_dq_convert_kernel
//                                               finishes: one set of adds per query row and 128 keys.
// Rounding as fa_bwd_fused_kernel: lse in the log2 domain as lse * log2(e) (f32), P and dS unrounded for dS =
// P (dP - D), rounded to bf16 where they enter an MMA (dV, dK, dQ), dK scaled by 1/sqrt(HS) at the store,
// dq_acc unscaled (the convert kernel scales and rotates back), dK rotated back in registers (RoPE).
struct wg_bwd_params {
    CUtensorMap tq, tdo, tk, tv;    // 4-D maps (d, head, t, b); boxes (64, 1, rows, 1): q, dO BM; k, v BN
    CUtensorMap tdq;                // DQ_TMA: dq_acc as f32 (d, head, t, b), boxes (32, 1, BM, 1), swizzled
    const float *lse;               // (b NH + h) lse_s + i, natural log
    const float *dsum;              // (B, NH, Tq): D = rowsum(dO * O)
    float *dq_acc;                  // (B, Tq, NH, HS) f32, zeroed first: unscaled dQ in the rotated frame
    bf16 *dk, *dv;                  // key j of batch b, kv head g at + b kv_bs + j kv_rs + g HS
    const float *cos_tab, *sin_tab; // RoPE: rotate dK back (key j at row j of the tables); NULL otherwise
    size_t lse_s, kv_bs;
    int kv_rs;
    int add; // 0: dK, dV written; 1: added to what they hold (read, added in f32, rounded once)
    // Tq queries, Tk keys; key j is visible to query i when j <= i + delta (wg_params)
    int Tq, Tk, delta, NH, NKV;
    int alibi;
    float scale, scale_log2;
};

#define WB_BN 128 // keys per block: two consumer warpgroups of 64
#define WB_BM 64  // queries per tile of the ring

// Shared memory: K [HS/64][BN][64] | V, same | Q [2 stages][HS/64][BM][64] | dO, same | dS^T [2 consumers]
// [2 buffers][64 keys][64 queries] | lse log2(e), D [2 stages][2][BM] f32 | 5 mbarriers; plus up to 1023
// bytes to align the start to 1024.
// DQ_TMA adds [2 consumers][2 boxes][BM][32] f32 after dS^T: a 64-column pass of a consumer's dQ, staged for
// TMA's reduce-add; DB doubles it (two such areas a consumer, used in turns).
template <bool DQ_TMA, bool DB = false>
static constexpr __host__ __device__ uint32_t wb_dq_stage_bytes(void) {
    return DQ_TMA ? 2 * WB_BM * 64 * 4 * (DB ? 2 : 1) : 0;
}
// HS 128: 198,720 bytes (tma, tma-split), 231,488 (DB: 960 under the H100's 232,448 a block), 165,952 (red)
template <int HS, bool DQ_TMA, bool DB = false> static constexpr size_t wb_smem_bytes(void) {
    return (size_t)(2 * WB_BN + 4 * WB_BM) * HS * 2 + 4 * 64 * WB_BM * 2 + wb_dq_stage_bytes<DQ_TMA, DB>() +
           4 * WB_BM * 4 + 8 * 8 + 1024;
}

#if defined(WG_DEVICE_HELPERS)
// C (64 x 64) = A (64 rows at a_addr, K-major, column block c at + c CB_A) . B (64 rows at b_addr, K-major,
// column block c at + c CB_B)^T, reduction over HS: S^T = K_c Q^T and dP^T = V_c dO^T.
template <int HS, uint32_t CB_A, uint32_t CB_B>
static __device__ __forceinline__ void wb_abt(float *c, uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t off = (kk & 3) * 32;
        uint64_t da = wg_desc(a_addr + (kk >> 2) * CB_A + off, 16, 1024);
        uint64_t db = wg_desc(b_addr + (kk >> 2) * CB_B + off, 16, 1024);
        wgmma_ss_n64<0, 0>(c, da, db, kk > 0);
    }
}

static __device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// store_frag's adding twin, for the block op: rows t_lo / t_hi (< T) of base (stride apart) += mul x, each
// element read, added in f32 and rounded once
template <int HS>
static __device__ __forceinline__ void wb_add_frag(bf16 *base, int stride, int t_lo, int t_hi, int T,
                                                   float (*x)[4], float mul) {
    int t4 = (threadIdx.x & 31) & 3;
#pragma unroll
    for (int dt = 0; dt < HS / 8; dt++) {
        int d = dt * 8 + t4 * 2;
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            int t = hi ? t_hi : t_lo;
            if (t >= T)
                continue;
            __nv_bfloat162 *dst = (__nv_bfloat162 *)(base + (size_t)t * stride + d);
            float2 old = __bfloat1622float2(*dst);
            *dst =
                __floats2bfloat162_rn(fmaf(x[dt][2 * hi], mul, old.x), fmaf(x[dt][2 * hi + 1], mul, old.y));
        }
    }
}

// acc (64 x HS, f32) += a (the 64 x 64 register-A fragments) b (64 rows of HS at b_addr), one wgmma group of
// its own: the dV += P^T dO and dK += dS^T Q products the EARLY and DQF orders issue alone
template <int HS>
static __device__ __forceinline__ void wb_issue_rs(float *acc, uint32_t (*a)[4], uint32_t b_addr) {
    reg_fence<HS / 2>(acc);
    reg_fence_u32<WB_BM / 4>(&a[0][0]);
    wgmma_fence();
    wg_pv<HS, WB_BM>(acc, a, b_addr);
    wgmma_commit();
}
// A dQ pass's 64 x 64 f32 accumulators (register 4 i + e at row 16 warp + g + 8 (e / 2), column 8 i + 2 t4 +
// (e % 2)) into a consumer's two TMA boxes at dqb ([BM][32] f32 each, 128-byte swizzle: chunk c of row r at
// c ^ (r % 8), r % 8 = g)
static __device__ __forceinline__ void wb_dq_store(uint32_t dqb, const float *dq, int warp, int g, int t4) {
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
        int r = warp * 16 + g + 8 * ((i >> 1) & 1), col = (i >> 2) * 8 + t4 * 2;
        int chunk = (col & 31) >> 2;
        st_shared_v2f(dqb + (col >> 5) * (WB_BM * 128) + r * 128 + ((chunk ^ g) << 4) + (col & 3) * 4, dq[i],
                      dq[i + 1]);
    }
}
#endif // WG_DEVICE_HELPERS

// SPLIT (HS 128 only; KILN_WGMMA_DQ=tma-split, red-split, and every EARLY mode): each tile's dQ split by
// columns between the two consumers, one 64-column pass each, instead of all of it by one consumer every
// other tile. EARLY (KILN_WGMMA_DQ=tma-early; 1.2% faster than SPLIT alone on an H100): the tensor cores kept
// busy through each tile's elementwise work: dV += P^T dO is issued as soon as P^T is in registers, before
// the wait for dP^T, so it runs while dS^T is computed and stored; dK += dS^T Q is issued on its own once
// dS^T is stored, so it runs beside the barrier of both consumers and the dQ pass's issue. The same products,
// summed in the same order (bitwise the default's dK, dV; dQ's REDs or reduce-adds arrive in an order of
// their own either way). DB (KILN_WGMMA_DQ=tma-early2, with EARLY; 0.9-1.3% faster than SPLIT alone): two dQ
// staging areas a consumer, used in turns, so that a pass needs one barrier of the consumer's threads instead
// of two: thread 0 waits for the last pass's reduce-adds to have read the other area before the barrier that
// publishes this pass's stores, so once past it every thread knows the next pass's area is free. DQF
// (KILN_WGMMA_DQ=tma-dqfirst, with SPLIT, EARLY and DQ_TMA at HS 128; 2.2-3.1% faster than SPLIT):
// FlashAttention-3's order of a tile's last products. dV is issued early (EARLY); dK is issued after the dQ
// pass, not before the barrier, and the pass waits with one group outstanding (wgmma.wait_group 1), which
// retires dV and dQ and leaves dK on the tensor cores while the dQ is staged in shared memory and handed to
// the TMA unit. SPLIT and EARLY wait for every product before staging, so the tensor cores idle
// through the stores and the consumer's barriers. The stage (Q, dO) is released once dK has read Q. dK and
// dV are bitwise the default's (the same products and sums). DQF 2 (the default,
// KILN_WGMMA_DQ=tma-dqpw: 6.1-8.5%) also hands the staged dQ to the producer's idle warp 3, as FA3 does: the
// consumer waits at a barrier for its area to be empty (the last reduce-adds have read it: already so, a tile
// later), stores, fences and only *arrives* at the full barrier; warp 3 syncs there, issues the two
// reduce-adds, waits for their reads and arrives at the empty barrier. The consumers no longer wait for the
// TMA unit or meet twice a pass. (An earlier OWN, each consumer adding the dQ of its own keys without a
// barrier of both, ran 4.4% slower than SPLIT on an H100 and is gone.)
template <int HS, bool DQ_TMA, bool SPLIT, bool EARLY = false, bool DB = false, int DQF = 0>
static __global__ void __launch_bounds__(WG_THREADS, 1)
    wg_bwd_kernel(const __grid_constant__ struct wg_bwd_params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int CB = HS / 64;
    static_assert(!DQF || (DQ_TMA && SPLIT && EARLY && !DB && HS == 128),
                  "DQF: tma-split with EARLY at HS 128");
    static_assert(DQF != 2 || WG_THREADS == 384, "DQF 2: the producer warpgroup's warp 3 adds the dQ");
    constexpr uint32_t KV_BYTES = WB_BN * HS * 2; // K (or V): all the block's keys
    constexpr uint32_t QT_BYTES = WB_BM * HS * 2; // one Q (or dO) stage
    constexpr uint32_t DS_BYTES = 64 * WB_BM * 2; // one dS^T buffer of one consumer
    extern __shared__ __align__(16) unsigned char wg_smem[];
    uint32_t base = ((uint32_t)__cvta_generic_to_shared(wg_smem) + 1023) & ~1023u;
    uint32_t k_s = base, v_s = k_s + KV_BYTES, q_s = v_s + KV_BYTES, do_s = q_s + 2 * QT_BYTES;
    uint32_t ds_s = do_s + 2 * QT_BYTES, dq_s = ds_s + 4 * DS_BYTES;
    uint32_t stat_s = dq_s + wb_dq_stage_bytes<DQ_TMA, DB>(), bars = stat_s + 4 * WB_BM * 4;
    // mbarriers, 8 bytes each: K and V full, stage full [2] (Q, dO, lse, D), stage empty [2]
    uint32_t kv_full = bars, full = bars + 8, empty = bars + 24;
    // lse log2(e) and D of stage s's query rows: stat[s][0][row], stat[s][1][row] (plain loads and stores)
    float *stat = (float *)(wg_smem + (stat_s - (uint32_t)__cvta_generic_to_shared(wg_smem)));

    int kt = blockIdx.x; // key tile 0 meets the most query tiles: it starts first
    int b = blockIdx.y / p.NKV, kvh = blockIdx.y % p.NKV, group = p.NH / p.NKV;
    int k0 = kt * WB_BN;
    // the first query tile with a row that sees key k0, and the tiles from it on
    int qt0 = max(k0 - p.delta, 0) / WB_BM, n_q = max(KILN_CEIL_DIV(p.Tq, WB_BM) - qt0, 0),
        n_it = group * n_q;
    int wg = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        mbar_init(kv_full, 1);
        for (int s = 0; s < 2; s++) {
            mbar_init(full + 8 * s, 1 + WB_BM); // thread 0's expect_tx, and one per row of lse / D
            mbar_init(empty + 8 * s, 2 * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads(); // the last block-wide barrier

    if (wg == 0) {
        // ---- producer ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (threadIdx.x == 0) {
            mbar_expect_tx(kv_full, 2 * KV_BYTES);
            for (int c = 0; c < CB; c++) {
                tma_load_4d(k_s + c * WB_BN * 128, &p.tk, c * 64, kvh, k0, b, kv_full);
                tma_load_4d(v_s + c * WB_BN * 128, &p.tv, c * 64, kvh, k0, b, kv_full);
            }
            for (int it = 0; it < n_it; it++) {
                int s = it & 1, h = kvh * group + it / n_q, q0 = (qt0 + it % n_q) * WB_BM;
                if (it >= 2) // stage s last held tile it - 2: wait for both consumers to release it
                    mbar_wait(empty + 8 * s, ((it >> 1) - 1) & 1);
                mbar_expect_tx(full + 8 * s, 2 * QT_BYTES);
                for (int c = 0; c < CB; c++) {
                    tma_load_4d(q_s + s * QT_BYTES + c * WB_BM * 128, &p.tq, c * 64, h, q0, b, full + 8 * s);
                    tma_load_4d(do_s + s * QT_BYTES + c * WB_BM * 128, &p.tdo, c * 64, h, q0, b,
                                full + 8 * s);
                }
            }
        } else if (DQF == 2 && threadIdx.x >= 96) {
            // warp 3 (DQF 2): each tile's two staged dQ passes (consumer c's: columns 64 c ..) added into
            // dq_acc by TMA, in the consumers' order; the empty barriers' first phase is given at once, and
            // each later one once the last adds have read the area (n_it arrivals each, as the consumers'
            // n_it syncs)
            int lane = threadIdx.x & 31;
            if (n_it > 0) {
                dq_empty_arrive(0);
                dq_empty_arrive(1);
            }
            // (both consumers' adds issued before either's reads are waited for: consumer 0's area is
            // given back once its group has been read, wait_group.read 1, consumer 1's after, read 0)
            for (int it = 0; it < n_it; it++) {
                int h = kvh * group + it / n_q, q0 = (qt0 + it % n_q) * WB_BM;
                for (int c = 0; c < 2; c++) {
                    dq_full_sync(c);
                    if (lane == 0) {
                        uint32_t dqb = dq_s + c * (WB_BM * 64 * 4);
                        tma_reduce_add_4d(&p.tdq, dqb, c * 64, h, q0, b);
                        tma_reduce_add_4d(&p.tdq, dqb + WB_BM * 128, c * 64 + 32, h, q0, b);
                        bulk_commit();
                    }
                }
                if (lane == 0)
                    bulk_wait_read<1>();
                __syncwarp();
                if (it + 1 < n_it)
                    dq_empty_arrive(0);
                if (lane == 0)
                    bulk_wait_read<0>();
                __syncwarp();
                if (it + 1 < n_it)
                    dq_empty_arrive(1);
            }
            if (lane == 0)
                bulk_wait_all(); // the last reduce-adds done before the block ends
        } else if (threadIdx.x >= 32 && threadIdx.x < 32 + WB_BM) {
            // warps 1 and 2: lse (log2 domain, rounded as fa_bwd_fused_kernel) and D of one query row per
            // thread into the stage; the arrival (release) publishes the stores to the consumers' wait
            int r = threadIdx.x - 32;
            for (int it = 0; it < n_it; it++) {
                int s = it & 1, h = kvh * group + it / n_q, qi = (qt0 + it % n_q) * WB_BM + r;
                if (it >= 2)
                    mbar_wait(empty + 8 * s, ((it >> 1) - 1) & 1);
                size_t bh = (size_t)b * p.NH + h;
                stat[s * 2 * WB_BM + r] = qi < p.Tq ? p.lse[bh * p.lse_s + qi] * WG_LOG2E : 0.0f;
                stat[s * 2 * WB_BM + WB_BM + r] = qi < p.Tq ? p.dsum[bh * p.Tq + qi] : 0.0f;
                mbar_arrive(full + 8 * s);
            }
        }
        return;
    }

    // ---- consumers ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    int cw = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    int wk0 = k0 + cw * 64;                                     // first key of this warpgroup
    int kj[2] = {wk0 + warp * 16 + g, wk0 + warp * 16 + g + 8}; // the two keys (rows) this thread holds
    uint32_t k_mine = k_s + cw * 64 * 128, v_mine = v_s + cw * 64 * 128; // 8 swizzle groups into each block
    uint32_t ds_mine = ds_s + cw * 2 * DS_BYTES;

    // accumulators: register 4 i + e holds row 16 warp + g + 8 (e / 2), column 8 i + 2 t4 + (e % 2)
    float dk[HS / 2], dv[HS / 2];
#pragma unroll
    for (int i = 0; i < HS / 2; i++)
        dk[i] = dv[i] = 0.0f;
    mbar_wait(kv_full, 0);

    // Both consumers compute every tile (consumer 1's first tile of each head lies wholly above the diagonal
    // and keys past T are masked: P = dS = 0 there) and meet at one barrier per tile, after which consumer it
    // % 2 adds the tile's dQ over all 128 keys from both dS^T buffers (SPLIT: each consumer a 64-column pass
    // of it): one set of dQ adds per 128 keys, half the L2 traffic of one per warpgroup (the L2 bounded this
    // kernel: 88% busy with REDs). dS^T buffers alternate per tile; the barrier of tile it + 1 keeps either
    // consumer from rewriting buffer it % 2 before the dQ of tile it (issued by the other) has completed.
    int np = 0; // DB: this consumer's dQ passes so far (its staging area: np % 2)
    for (int it = 0; it < n_it; it++) {
        int st = it & 1, h = kvh * group + it / n_q, q0 = (qt0 + it % n_q) * WB_BM;
        uint32_t par = (it >> 1) & 1;
        mbar_wait(full + 8 * st, par);
        {
            uint32_t qb = q_s + st * QT_BYTES, dob = do_s + st * QT_BYTES,
                     dsb = ds_mine + (it & 1) * DS_BYTES;
            // S^T, dP^T (and dQ below) are overwritten by their first k-step (scale-d 0), but the asm reads
            // them ("+f"): zeroed here, they are not live across tiles (32 registers each)
            float s[32], dp[32];
#pragma unroll
            for (int i = 0; i < 32; i++)
                s[i] = dp[i] = 0.0f;
            reg_fence<32>(s);
            reg_fence<32>(dp);
            wgmma_fence();
            wb_abt<HS, WB_BN * 128, WB_BM * 128>(s, k_mine, qb); // S^T = K_c Q^T
            wgmma_commit();
            wb_abt<HS, WB_BN * 128, WB_BM * 128>(dp, v_mine, dob); // dP^T = V_c dO^T
            wgmma_commit();

            // lse log2(e) and D of query column 8 (i / 4) + 2 t4 + (i % 2) at ls[..], dd[..] (shared memory:
            // 16 registers each would not fit beside dK, dV at HS = 128)
            const float *ls = stat + st * 2 * WB_BM + t4 * 2, *dd = ls + WB_BM;
            float slope2 = p.alibi ? alibi_slope(h, p.NH) * WG_LOG2E : 0.0f;
            bool need_mask = q0 + p.delta < wk0 + 63 || q0 + WB_BM > p.Tq || wk0 + 64 > p.Tk;

            wgmma_wait<1>(); // S^T
            reg_fence<32>(s);
            // P^T = exp2(s scale_log2 + slope2 (kr - qi) - lse_i log2 e): one FFMA and one EX2 an element
            // without ALiBi; with it a per-key base plus a compile-time query offset (no int-to-float
            // conversion per element, as attn_online_softmax)
            if (p.alibi) {
                float kb[2];
                attn_alibi_bases(kb, slope2, kj, q0 + 2 * t4, -1);
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    int j = (i >> 2) * 8 + (i & 1);
                    s[i] = exp2f(fmaf(s[i], p.scale_log2, fmaf(-slope2, (float)j, kb[(i >> 1) & 1]) - ls[j]));
                }
            } else {
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    int j = (i >> 2) * 8 + (i & 1);
                    s[i] = exp2f(fmaf(s[i], p.scale_log2, -ls[j]));
                }
            }
            if (need_mask) {
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    int qi = q0 + (i >> 2) * 8 + (i & 1) + t4 * 2, kr = kj[(i >> 1) & 1];
                    if (qi + p.delta < kr || qi >= p.Tq || kr >= p.Tk)
                        s[i] = 0.0f; // P^T
                }
            }
            // P^T rounded to bf16 into the register A fragments of dV += P^T dO (k-step kk: queries 16 kk ..)
            uint32_t pa[WB_BM / 16][4], da[WB_BM / 16][4];
#pragma unroll
            for (int kk = 0; kk < WB_BM / 16; kk++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    pa[kk][e] = pack_bf16(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);

            if constexpr (EARLY) {
                // dV_c += P^T dO now: on the tensor cores while dS^T is computed
                wb_issue_rs<HS>(dv, pa, dob);
                wgmma_wait<1>(); // dP^T (dV may still run)
            } else {
                wgmma_wait<0>(); // dP^T
            }
            reg_fence<32>(dp);
#pragma unroll
            for (int i = 0; i < 32; i++) {
                dp[i] = s[i] * (dp[i] - dd[(i >> 2) * 8 + (i & 1)]); // dS^T (unscaled)
            }
            // dS^T rounded to bf16: register A fragments of dK += dS^T Q, and the same values to shared
            // memory as [key][query] (queries contiguous, 128-byte swizzle: chunk j of row r at j ^ (r % 8),
            // r % 8 = g), the MN-major A of dQ = dS K. Fragment e of k-step kk: row g + 8 (e & 1), chunk 2 kk
            // + e / 2.
#pragma unroll
            for (int kk = 0; kk < WB_BM / 16; kk++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    da[kk][e] = pack_bf16(dp[8 * kk + 2 * e], dp[8 * kk + 2 * e + 1]);
                    int r = warp * 16 + g + 8 * (e & 1), chunk = 2 * kk + (e >> 1);
                    st_shared_u32(dsb + r * 128 + ((chunk ^ g) << 4) + t4 * 4, da[kk][e]);
                }
            fence_proxy_async_smem(); // this thread's dS^T stores, before the barrier, for wgmma's reads
            if constexpr (DQF) {
                // dK is issued after the dQ pass (below)
            } else if constexpr (EARLY) {
                // dK_c += dS^T Q alone (dV runs already): beside the barrier and the dQ pass's issue. (After
                // the stores: the PTX ISA leaves reading a wgmma's A registers before its wait undefined.)
                wb_issue_rs<HS>(dk, da, qb); // dK_c += dS^T Q
            } else {
                reg_fence<HS / 2>(dv);
                reg_fence<HS / 2>(dk);
                reg_fence_u32<WB_BM / 4>(&pa[0][0]);
                reg_fence_u32<WB_BM / 4>(&da[0][0]);
                wgmma_fence();
                wg_pv<HS, WB_BM>(dv, pa, dob); // dV_c += P^T dO
                wg_pv<HS, WB_BM>(dk, da, qb);  // dK_c += dS^T Q
                wgmma_commit();
            }

            consumers_bar_sync(); // every warp's dS^T rows, of both consumers, are in their buffers
            constexpr bool SPL = SPLIT && CB == 2;
            if (SPL || (it & 1) == cw) {
                int cb0 = SPL ? cw : 0; // this consumer's passes: [cb0, cb0 + 1) split, all CB otherwise
#pragma unroll
                for (int cb = cb0; cb < (SPL ? cb0 + 1 : CB); cb++) {
                    float dq[32];
#pragma unroll
                    for (int i = 0; i < 32; i++)
                        dq[i] = 0.0f;
                    reg_fence<32>(dq);
                    wgmma_fence();
#pragma unroll
                    for (int kk = 0; kk < 8; kk++) { // 16 keys a step: consumer kk / 4's dS^T and K rows
                        uint32_t dsk =
                            ds_s + (kk >> 2) * 2 * DS_BYTES + (it & 1) * DS_BYTES + (kk & 3) * 2048;
                        uint32_t kk_addr = k_s + (kk >> 2) * 64 * 128 + cb * WB_BN * 128 + (kk & 3) * 2048;
                        uint64_t dsd = wg_desc(dsk, DS_BYTES, 1024);
                        uint64_t kd = wg_desc(kk_addr, WB_BN * 128, 1024);
                        wgmma_ss_n64<1, 1>(dq, dsd, kd, kk > 0);
                    }
                    wgmma_commit();
                    if constexpr (DQF) {
                        // dK_c += dS^T Q behind the pass, then wait for all but it: dV and this pass's dQ
                        // are done, and dK runs under the dQ's staging below
                        wb_issue_rs<HS>(dk, da, qb);
                        wgmma_wait<1>();
                        reg_fence<HS / 2>(dv); // (dV is done: its operands' registers are free again)
                        reg_fence_u32<WB_BM / 4>(&pa[0][0]);
                    } else {
                        wgmma_wait<0>(); // this pass's dQ, and (first pass) dV, dK: stage st is free
                    }
                    reg_fence<32>(dq);
                    if (!DQF && cb == cb0) {
                        reg_fence<HS / 2>(dv);
                        reg_fence<HS / 2>(dk);
                        reg_fence_u32<WB_BM / 4>(&pa[0][0]);
                        reg_fence_u32<WB_BM / 4>(&da[0][0]);
                        mbar_arrive(empty + 8 * st);
                    }
                    if constexpr (DQ_TMA) {
                        // the pass's 64 x 64 into this consumer's two boxes (DB: area np % 2 of two), once
                        // TMA has read what they held, and added to dq_acc by TMA. Without DB: a barrier
                        // before the stores (the boxes are free) and one after; with DB one, after (see DB
                        // above).
                        uint32_t dqb = dq_s + (DB ? cw * 2 + (np & 1) : cw) * (WB_BM * 64 * 4);
                        if constexpr (DQF == 2) {
                            // the producer's warp 3 adds it (above): wait for the area, store, hand over
                            dq_empty_sync(cw);
                            wb_dq_store(dqb, dq, warp, g, t4);
                            fence_proxy_async_smem();
                            dq_full_arrive(cw);
                        } else {
                            if constexpr (!DB) {
                                if (tid == 0)
                                    bulk_wait_read<0>();
                                __syncwarp(); // (warp 0 whole again before the aligned barrier)
                                consumer_bar_sync(cw);
                            }
                            wb_dq_store(dqb, dq, warp, g, t4);
                            fence_proxy_async_smem();
                            if constexpr (DB) {
                                if (tid == 0)
                                    bulk_wait_read<0>(); // the last pass's adds have read area (np + 1) % 2
                                __syncwarp();
                                np++;
                            }
                            consumer_bar_sync(cw);
                            if (tid == 0) {
                                tma_reduce_add_4d(&p.tdq, dqb, cb * 64, h, q0, b);
                                tma_reduce_add_4d(&p.tdq, dqb + WB_BM * 128, cb * 64 + 32, h, q0, b);
                                bulk_commit();
                            }
                            __syncwarp(); // (before the next pass's wgmma.fence, which is warp-aligned)
                        }
                        if constexpr (DQF) {
                            wgmma_wait<0>(); // dK: stage st (its Q) is no longer read
                            reg_fence<HS / 2>(dk);
                            reg_fence_u32<WB_BM / 4>(&da[0][0]);
                            mbar_arrive(empty + 8 * st);
                        }
                    } else {
                        float *dqg = p.dq_acc + ((size_t)b * p.Tq * p.NH + h) * HS;
                        size_t qstride = (size_t)p.NH * HS;
#pragma unroll
                        for (int i = 0; i < 32; i += 2) {
                            int qi = q0 + warp * 16 + g + 8 * ((i >> 1) & 1),
                                d = cb * 64 + (i >> 2) * 8 + t4 * 2;
                            if (qi < p.Tq)
                                wg_red2(dqg + (size_t)qi * qstride + d, dq[i], dq[i + 1]);
                        }
                    }
                }
            } else {
                wgmma_wait<0>(); // dV, dK: stage st is no longer read
                reg_fence<HS / 2>(dv);
                reg_fence<HS / 2>(dk);
                reg_fence_u32<WB_BM / 4>(&pa[0][0]);
                reg_fence_u32<WB_BM / 4>(&da[0][0]);
                mbar_arrive(empty + 8 * st);
            }
        }
    }

    if constexpr (DQ_TMA && DQF != 2) { // (DQF 2: the producer's warp 3 issued them, and waits)
        if (tid == 0)
            bulk_wait_all(); // the last reduce-adds: read out of shared memory and done before the block ends
    }
    float(*dk4)[4] = reinterpret_cast<float(*)[4]>(dk);
    float(*dv4)[4] = reinterpret_cast<float(*)[4]>(dv);
    if (p.cos_tab)
        rope_back_frag<HS>(dk4, kj[0], kj[1], p.Tk, p.cos_tab, p.sin_tab);
    size_t off = (size_t)b * p.kv_bs + kvh * HS;
    if (p.add) {
        wb_add_frag<HS>(p.dk + off, p.kv_rs, kj[0], kj[1], p.Tk, dk4, p.scale);
        wb_add_frag<HS>(p.dv + off, p.kv_rs, kj[0], kj[1], p.Tk, dv4, 1.0f);
    } else {
        store_frag<HS>(p.dk + off, p.kv_rs, kj[0], kj[1], p.Tk, dk4, p.scale, p.scale);
        store_frag<HS>(p.dv + off, p.kv_rs, kj[0], kj[1], p.Tk, dv4, 1.0f, 1.0f);
    }
#endif
}

// ---- host: tensor maps and launch -------------------------------------------------------------------------

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda); NULL if the
// driver does not offer it.
static PFN_cuTensorMapEncodeTiled_v12000 wg_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    static int tried;
    if (!tried) {
        tried = 1;
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)f;
        else
            (void)cudaGetLastError();
    }
    return fn;
}

// Tensor map over one of q, k, v: element (d, head, t, b) at base + b bs + t rs + head HS + d elements;
// boxes of 64 d (128 bytes: the widest a 128-byte swizzle allows) x 1 head x `rows` positions x 1 batch.
// Positions t >= T of a box read as zeros (the map's bound), so no tile needs a mask for loading.
static int wg_map(CUtensorMap *map, const bf16 *base, int HS, int heads, int T, int B, int rs, size_t bs,
                  int rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = wg_encoder();
    if (!enc) { // once, like the encode failure below: every forward call comes through here
        static int warned_driver;
        if (!warned_driver)
            fprintf(stderr, "kiln: Hopper attention: no cuTensorMapEncodeTiled in this driver, using FA2\n");
        warned_driver = 1;
        return 1;
    }
    cuuint64_t dims[4] = {(cuuint64_t)HS, (cuuint64_t)heads, (cuuint64_t)T, (cuuint64_t)B};
    cuuint64_t strides[3] = {(cuuint64_t)HS * 2, (cuuint64_t)rs * 2, (cuuint64_t)bs * 2}; // bytes, dims 1..3
    cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, estr[4] = {1, 1, 1, 1};
    CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)base, dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { // the opt-in path would fall back silently: say so once, so a run is not misread
        static int warned;
        if (!warned)
            fprintf(
                stderr,
                "kiln: Hopper attention: cuTensorMapEncodeTiled failed (CUresult %d), using FA2 (the ring's "
                "blocks: the tensor-core block kernels)\n",
                (int)r);
        warned = 1;
    }
    return r != CUDA_SUCCESS;
}

template <int HS, int BN, bool PP>
static void wg_launch_pp(struct cuda_ctx *c, const struct wg_params &p, int B) {
    size_t smem = wg_smem_bytes<HS, BN>();
    set_smem(wg_fwd_kernel<HS, BN, PP>, smem);
    int items = KILN_CEIL_DIV(p.Tq, WG_BM) * B * p.NH;
    wg_fwd_kernel<HS, BN, PP><<<min(items, c->prop.multiProcessorCount), WG_THREADS, smem, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
}

// KILN_WGMMA_FWD (the context's kernel[KILN_KERNEL_WGMMA_FWD], which kiln_cuda_set_kernel switches between
// calls, so that a test or attn_bench can compare both in one process):
// pingpong (the default: the consumers' wgmmas in turns, FlashAttention-3's warp scheduling, so that one
// consumer's softmax runs under the other's matrix products; on an H100 587/596 TFLOP/s against overlap's
// 540/542 at 32k/64k, HS 128, 2026-11-26) or overlap (each consumer overlaps its softmax with its own P V, no
// order between the consumers).
static int wg_fwd_pingpong(const struct cuda_ctx *c) {
    return c->kernel[KILN_KERNEL_WGMMA_FWD] == 0;
}

template <int HS, int BN> static void wg_launch(struct cuda_ctx *c, const struct wg_params &p, int B) {
    if (wg_fwd_pingpong(c))
        wg_launch_pp<HS, BN, true>(c, p, B);
    else
        wg_launch_pp<HS, BN, false>(c, p, B);
}

template <int HS, bool DQ_TMA, bool SPLIT, bool EARLY = false, bool DB = false, int DQF = 0>
static void wb_launch(struct cuda_ctx *c, const struct wg_bwd_params &p, int B) {
    size_t smem = wb_smem_bytes<HS, DQ_TMA, DB>();
    set_smem(wg_bwd_kernel<HS, DQ_TMA, SPLIT, EARLY, DB, DQF>, smem);
    dim3 grid(KILN_CEIL_DIV(p.Tk, WB_BN), B * p.NKV);
    wg_bwd_kernel<HS, DQ_TMA, SPLIT, EARLY, DB, DQF><<<grid, WG_THREADS, smem, c->stream>>>(p);
    CUDA_CHECK_LAUNCH();
}

// The f32 map of dq_acc (B, T, NH, HS) for DQ_TMA's reduce-adds: boxes of 32 d (128 bytes, the widest a
// 128-byte swizzle allows) x 1 head x BM rows x 1 batch; rows past T are not written (the map's bound).
static int wb_dq_map(CUtensorMap *map, float *dq_acc, int HS, int NH, int T, int B) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = wg_encoder();
    if (!enc)
        return 1;
    cuuint64_t dims[4] = {(cuuint64_t)HS, (cuuint64_t)NH, (cuuint64_t)T, (cuuint64_t)B};
    cuuint64_t strides[3] = {(cuuint64_t)HS * 4, (cuuint64_t)NH * HS * 4, (cuuint64_t)T * NH * HS * 4};
    cuuint32_t box[4] = {32, 1, WB_BM, 1}, estr[4] = {1, 1, 1, 1};
    CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, (void *)dq_acc, dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r != CUDA_SUCCESS;
}

// KILN_WGMMA_DQ (the context's kernel[KILN_KERNEL_WGMMA_DQ], which kiln_cuda_set_kernel switches between
// calls, so that a test or attn_bench can compare them in one process):
// tma-dqpw (the default): at HS 128 the two consumers take a 64-column pass of every tile's
// dQ each (SPLIT), staged in shared memory and added by the TMA unit, with each tile's dV products issued as
// soon as their operands are in registers (EARLY) and dK after the dQ pass, so that it runs while the dQ is
// staged, and the reduce-adds issued by a producer warp (DQF 2), as FlashAttention-3 orders them; HS 64
// takes tma. On an H100, backward TFLOP/s at 32k/64k, HS 128 (2026-11-26): tma-dqpw 503.6/482.3, tma-split
// 464.3/454.6, tma-dqfirst (DQF 1: the same order, the consumers issuing their own reduce-adds) 478.6/464.5,
// tma-early (EARLY alone) 470.0/459.9, tma-early2 (that, and two dQ staging areas a consumer, one barrier a
// pass instead of two: DB) 470.2/458.5, tma (one consumer a tile's whole dQ) 442.1/429.8, red (each consumer
// thread adds its dQ with vector REDs; red-split: split) 416.7/408.0. (tma-own, each consumer the dQ of its
// own keys, ran 4.4% slower than tma-split and is gone.) HS 64 takes tma-early under
// tma-early and tma-early2, tma otherwise.
// *tma, *split, *early: the choice (*early 2: EARLY and DB; 3: EARLY and DQF; 4: EARLY and DQF 2).
// The modes in kiln_kernel_values[KILN_KERNEL_WGMMA_DQ]'s order: tma-dqpw, tma, red, red-split, tma-early,
// tma-early2, tma-dqfirst, tma-split.
static void wb_dq_mode(const struct cuda_ctx *c, int *tma, int *split, int *early) {
    int m = c->kernel[KILN_KERNEL_WGMMA_DQ];
    *tma = m <= 1 || m >= 4;
    *split = m == 0 || m == 3 || m >= 4;
    *early = m == 0 ? 4 : m == 4 ? 1 : m == 5 ? 2 : m == 6 ? 3 : 0;
}

// The backward's kernel for HS, the dQ path, SPLIT (which HS 64, one pass a tile, does not take), EARLY and
// (early 2) DB or (early 3, 4, HS 128 only: HS 64 takes tma) DQF 1, 2, only with TMA's reduce-add: REDs,
// where the map failed to encode, run without them.
static void wb_run(struct cuda_ctx *c, const struct wg_bwd_params &p, int B, int HS, int tma, int split,
                   int early) {
    if (HS == 64 && tma && early && early < 3)
        early == 2 ? wb_launch<64, true, false, true, true>(c, p, B)
                   : wb_launch<64, true, false, true>(c, p, B);
    else if (HS == 64)
        tma ? wb_launch<64, true, false>(c, p, B) : wb_launch<64, false, false>(c, p, B);
    else if (tma && early >= 3)
        early == 4 ? wb_launch<128, true, true, true, false, 2>(c, p, B)
                   : wb_launch<128, true, true, true, false, 1>(c, p, B);
    else if (tma && early)
        early == 2 ? wb_launch<128, true, true, true, true>(c, p, B)
                   : wb_launch<128, true, true, true>(c, p, B);
    else if (split)
        tma ? wb_launch<128, true, true>(c, p, B) : wb_launch<128, false, true>(c, p, B);
    else
        tma ? wb_launch<128, true, false>(c, p, B) : wb_launch<128, false, false>(c, p, B);
}

#endif // KILN_HAVE_SM90A

extern "C" int kiln_cuda_wgmma_attention_available(void *ctx) {
#if defined(KILN_HAVE_SM90A)
    struct cuda_ctx *c = cuda_ctx_of(ctx);
    return c->prop.major == 9 && c->prop.minor == 0;
#else
    (void)ctx;
    return 0;
#endif
}

extern "C" int kiln_cuda_wgmma_attention_forward(struct cuda_ctx *c, const struct kiln_attn_args *a) {
    if (!kiln_cuda_wgmma_attention_available(c))
        return 0;
#if defined(KILN_HAVE_SM90A)
    int HS = a->HS, rs = a->qkv_stride ? a->qkv_stride : (a->NH + 2 * a->NKV) * HS;
    // TMA: global addresses 16-byte aligned, strides multiples of 16 bytes; out stored as bf16 pairs
    if ((HS != 64 && HS != 128) || ((uintptr_t)a->qkv & 15) || rs % 8 || ((uintptr_t)a->out & 3))
        return 0;
    const bf16 *x = (const bf16 *)a->qkv, *q = x, *k = x + a->NH * HS, *v = x + (a->NH + a->NKV) * HS;
    int q_rs = rs, k_rs = rs;
    if (a->pos == KILN_POS_ROPE) {
        const bf16 *qr = kiln_cuda_fa_rope(c, a->qkv, rs, a->B, a->T, a->NH, a->NKV, HS, a->rope_theta);
        q = qr;
        k = qr + (size_t)a->B * a->T * a->NH * HS;
        q_rs = a->NH * HS;
        k_rs = a->NKV * HS;
    }
    struct wg_params p;
    memset(&p, 0, sizeof(p));
    const int BN = 128;
    size_t T = (size_t)a->T;
    if (wg_map(&p.tq, q, HS, a->NH, a->T, a->B, q_rs, T * q_rs, WG_BM) ||
        wg_map(&p.tk, k, HS, a->NKV, a->T, a->B, k_rs, T * k_rs, BN) ||
        wg_map(&p.tv, v, HS, a->NKV, a->T, a->B, rs, T * rs, BN))
        return 0;
    p.out = (bf16 *)a->out;
    p.lse = a->lse;
    p.out_rs = a->NH * HS;
    p.out_bs = T * p.out_rs;
    p.lse_s = T;
    p.Tq = p.Tk = a->T;
    p.NH = a->NH;
    p.NKV = a->NKV;
    p.B = a->B;
    p.alibi = a->pos == KILN_POS_ALIBI;
    p.scale_log2 = 1.0f / sqrtf((float)HS) * WG_LOG2E;
    if (HS == 64)
        wg_launch<64, BN>(c, p, a->B);
    else
        wg_launch<128, BN>(c, p, a->B);
    return 1;
#else
    (void)a;
    return 0;
#endif
}

extern "C" int kiln_cuda_wgmma_attention_backward(struct cuda_ctx *c, const struct kiln_attn_back_args *a) {
    // deterministic mode wants FA2's two-kernel backward (no atomics)
    if (c->deterministic || !kiln_cuda_wgmma_attention_available(c))
        return 0;
#if defined(KILN_HAVE_SM90A)
    int HS = a->HS, rs = a->qkv_stride ? a->qkv_stride : (a->NH + 2 * a->NKV) * HS;
    int drs = a->dqkv_stride ? a->dqkv_stride : (a->NH + 2 * a->NKV) * HS;
    // TMA: 16-byte aligned bases and row strides; dK, dV stored as bf16 pairs, dQ as 8-byte groups
    if ((HS != 64 && HS != 128) || ((uintptr_t)a->qkv & 15) || ((uintptr_t)a->dout & 15) || rs % 8 ||
        ((uintptr_t)a->dqkv & 15) || drs % 8 || ((uintptr_t)a->out & 15))
        return 0;
    const bf16 *x = (const bf16 *)a->qkv, *q = x, *k = x + a->NH * HS, *v = x + (a->NH + a->NKV) * HS;
    int q_rs = rs, k_rs = rs;
    struct wg_bwd_params p;
    memset(&p, 0, sizeof(p));
    if (a->pos == KILN_POS_ROPE) {
        const bf16 *qr = kiln_cuda_fa_rope(c, a->qkv, rs, a->B, a->T, a->NH, a->NKV, HS, a->rope_theta);
        q = qr;
        k = qr + (size_t)a->B * a->T * a->NH * HS;
        q_rs = a->NH * HS;
        k_rs = a->NKV * HS;
        p.cos_tab = kiln_cuda_rope_table(c, a->T, HS, a->rope_theta, &p.sin_tab);
    }
    size_t T = (size_t)a->T;
    if (wg_map(&p.tq, q, HS, a->NH, a->T, a->B, q_rs, T * q_rs, WB_BM) ||
        wg_map(&p.tdo, (const bf16 *)a->dout, HS, a->NH, a->T, a->B, a->NH * HS, T * a->NH * HS, WB_BM) ||
        wg_map(&p.tk, k, HS, a->NKV, a->T, a->B, k_rs, T * k_rs, WB_BN) ||
        wg_map(&p.tv, v, HS, a->NKV, a->T, a->B, rs, T * rs, WB_BN))
        return 0;
    p.lse = a->lse;
    p.dsum = kiln_cuda_fa_dsum(c, a->dout, a->out, a->B, a->T, a->NH, HS);
    size_t nq = (size_t)a->B * a->T * a->NH * HS * sizeof(float);
    p.dq_acc = (float *)kiln_cuda_scratch(c, SCR_ATTN_DQ, nq);
    CUDA_CHECK(cudaMemsetAsync(p.dq_acc, 0, nq, c->stream));
    p.dk = (bf16 *)a->dqkv + a->NH * HS;
    p.dv = (bf16 *)a->dqkv + (a->NH + a->NKV) * HS;
    p.kv_rs = drs;
    p.kv_bs = T * drs;
    p.lse_s = T;
    p.Tq = p.Tk = a->T;
    p.NH = a->NH;
    p.NKV = a->NKV;
    p.alibi = a->pos == KILN_POS_ALIBI;
    p.scale = 1.0f / sqrtf((float)HS);
    p.scale_log2 = p.scale * WG_LOG2E;
    int tma, split, early;
    wb_dq_mode(c, &tma, &split, &early);
    if (tma && wb_dq_map(&p.tdq, p.dq_acc, HS, a->NH, a->T, a->B)) { // said once, so a run is not misread
        static int told;
        if (!told++)
            fprintf(stderr,
                    "kiln: the wgmma backward's dQ by TMA: the f32 tensor map of dQ failed to encode; REDs "
                    "add dQ\n");
        tma = 0;
    }
    wb_run(c, p, a->B, HS, tma, split, early);
    kiln_cuda_fa_dq_convert(c, (bf16 *)a->dqkv, p.dq_acc, a->B, a->T, a->NH, HS, drs, p.scale, p.cos_tab,
                            p.sin_tab);
    return 1;
#else
    (void)a;
    return 0;
#endif
}

// ---- the ring's blocks (the block op of ring and hybrid sequence parallelism) ----------------------------
// One block of queries [q0, q0 + Tq) against keys [k0, k0 + Tk) (global positions) on the kernels above,
// for KILN_ATTN_BLOCK=wgmma: key j is visible to query i when k0 + j <= q0 + i, so delta = q0 - k0. With
// q0 >= k0, as in every block the zigzag ring gives them (its diagonal blocks, q0 = k0, and blocks with
// every key before every query), each query sees key 0 and the kernels' loops hold; other blocks, ALiBi
// (its slopes need the global head, which these kernels do not take) and unaligned tensors return 0 and the
// tensor-core block kernels run. q and k are the call's sources after RoPE (attention_block_tc.cu rotates
// them into scratch at their global positions; rows q_rs / k_rs and batches q_bs / k_bs apart). The forward
// merges into out and lse as the block kernels do; the backward adds to dq, dk and dv (each element read,
// added in f32 and rounded once), and needs p.dsum.

#if defined(KILN_HAVE_SM90A)
static int wgb_al16(const void *x, size_t bs, int rs) {
    return ((uintptr_t)x & 15) == 0 && bs % 8 == 0 && rs % 8 == 0;
}

// the kernels' part of a block: what both directions require
static int wgb_takes(struct cuda_ctx *c, const struct blk_params &p, const bf16 *q, size_t q_bs, int q_rs,
                     const bf16 *k, size_t k_bs, int k_rs) {
    return kiln_cuda_wgmma_attention_available(c) && (p.HS == 64 || p.HS == 128) && !p.alibi &&
           p.q0 >= p.k0 && p.Tk > 0 && wgb_al16(q, q_bs, q_rs) && wgb_al16(k, k_bs, k_rs) &&
           wgb_al16(p.v, p.kv_bs, p.kv_rs) && ((uintptr_t)p.out & 3) == 0 && p.out_bs % 2 == 0 &&
           p.out_rs % 2 == 0;
}

// what both kernels' parameters take from the block: its shape, causal offset, lse and scale
template <typename W> static void wgb_shape(W &w, const struct blk_params &p) {
    w.lse = p.lse;
    w.lse_s = p.lse_s;
    w.Tq = p.Tq;
    w.Tk = p.Tk;
    w.delta = p.q0 - p.k0;
    w.NH = p.NH;
    w.NKV = p.NKV;
    w.scale_log2 = p.scale_log2;
}

// dq += scale R(q0 + i)^-1 acc: the block's f32 dQ accumulator (B, Tq, NH, HS; unscaled, rotated frame) into
// the op's dq rows; one thread a column pair (d, d + HS/2) of a row, grid-stride
// (rows B Tq NH < 2^32: the row's (b, i, h) by 32-bit divisions, not the 64-bit ones the GPU runs in
// software)
template <int HS>
static __global__ void wgb_dq_add_kernel(bf16 *dq, size_t q_bs, int q_rs, const float *acc, int B, int Tq,
                                         int NH, float scale, const float *ct, const float *st, int q0) {
    constexpr int half = HS / 2;
    size_t n = (size_t)B * Tq * NH * half;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(e & (half - 1));
        unsigned r = (unsigned)(e / half), bi = r / (unsigned)NH; // r = (b Tq + i) NH + h
        int h = (int)(r - bi * (unsigned)NH), i = (int)(bi % (unsigned)Tq), b = (int)(bi / (unsigned)Tq);
        float x = acc[(size_t)r * HS + d], y = acc[(size_t)r * HS + d + half];
        if (ct) {
            float cs = ct[(size_t)(q0 + i) * half + d], sn = st[(size_t)(q0 + i) * half + d], xa = x;
            x = xa * cs + y * sn;
            y = y * cs - xa * sn;
        }
        bf16 *row = dq + b * q_bs + (size_t)i * q_rs + h * HS;
        row[d] = f2bf(fmaf(x, scale, bf2f(row[d])));
        row[d + half] = f2bf(fmaf(y, scale, bf2f(row[d + half])));
    }
}
#endif

int blk_wgmma_forward(struct cuda_ctx *c, const struct blk_params &p, const bf16 *q, size_t q_bs, int q_rs,
                      const bf16 *k, size_t k_bs, int k_rs) {
#if defined(KILN_HAVE_SM90A)
    if (!wgb_takes(c, p, q, q_bs, q_rs, k, k_bs, k_rs))
        return 0;
    int HS = p.HS;
    const int BN = 128;
    struct wg_params w;
    memset(&w, 0, sizeof(w));
    if (wg_map(&w.tq, q, HS, p.NH, p.Tq, p.B, q_rs, q_bs, WG_BM) ||
        wg_map(&w.tk, k, HS, p.NKV, p.Tk, p.B, k_rs, k_bs, BN) ||
        wg_map(&w.tv, p.v, HS, p.NKV, p.Tk, p.B, p.kv_rs, p.kv_bs, BN))
        return 0;
    wgb_shape(w, p);
    w.out = p.out;
    w.out_bs = p.out_bs;
    w.out_rs = p.out_rs;
    w.B = p.B;
    w.accumulate = p.accumulate;
    if (HS == 64)
        wg_launch<64, BN>(c, w, p.B);
    else
        wg_launch<128, BN>(c, w, p.B);
    return 1;
#else
    (void)c, (void)p, (void)q, (void)q_bs, (void)q_rs, (void)k, (void)k_bs, (void)k_rs;
    return 0;
#endif
}

int blk_wgmma_backward(struct cuda_ctx *c, const struct blk_params &p, const bf16 *q, size_t q_bs, int q_rs,
                       const bf16 *k, size_t k_bs, int k_rs) {
#if defined(KILN_HAVE_SM90A)
    // deterministic mode keeps the tensor-core kernels (no atomics); dK, dV are added as bf16 pairs
    if (c->deterministic || !wgb_takes(c, p, q, q_bs, q_rs, k, k_bs, k_rs) ||
        !wgb_al16(p.dout, p.out_bs, p.out_rs) || ((uintptr_t)p.dk & 3) || ((uintptr_t)p.dv & 3) ||
        p.kv_rs % 2 || p.kv_bs % 2)
        return 0;
    int HS = p.HS;
    struct wg_bwd_params w;
    memset(&w, 0, sizeof(w));
    if (wg_map(&w.tq, q, HS, p.NH, p.Tq, p.B, q_rs, q_bs, WB_BM) ||
        wg_map(&w.tdo, p.dout, HS, p.NH, p.Tq, p.B, p.out_rs, p.out_bs, WB_BM) ||
        wg_map(&w.tk, k, HS, p.NKV, p.Tk, p.B, k_rs, k_bs, WB_BN) ||
        wg_map(&w.tv, p.v, HS, p.NKV, p.Tk, p.B, p.kv_rs, p.kv_bs, WB_BN))
        return 0;
    wgb_shape(w, p);
    w.dsum = p.dsum;
    size_t nq = (size_t)p.B * p.Tq * p.NH * HS * sizeof(float);
    w.dq_acc = (float *)kiln_cuda_scratch(c, SCR_ATTN_DQ, nq);
    CUDA_CHECK(cudaMemsetAsync(w.dq_acc, 0, nq, c->stream));
    w.dk = p.dk;
    w.dv = p.dv;
    w.kv_rs = p.kv_rs;
    w.kv_bs = p.kv_bs;
    w.add = 1;
    if (p.cos_tab) { // the keys' rows of the global tables
        w.cos_tab = p.cos_tab + (size_t)p.k0 * (HS / 2);
        w.sin_tab = p.sin_tab + (size_t)p.k0 * (HS / 2);
    }
    w.scale = p.scale;
    int tma, split, early;
    wb_dq_mode(c, &tma, &split, &early);
    tma = tma && !wb_dq_map(&w.tdq, w.dq_acc, HS, p.NH, p.Tq, p.B);
    wb_run(c, w, p.B, HS, tma, split, early);
    size_t n = (size_t)p.B * p.Tq * p.NH * (HS / 2);
    size_t want = KILN_CEIL_DIV(n, (size_t)256);
    unsigned blocks = (unsigned)(want < 8192 ? want : 8192); // grid-stride beyond
    if (HS == 64)
        wgb_dq_add_kernel<64><<<blocks, 256, 0, c->stream>>>(p.dq, p.q_bs, p.q_rs, w.dq_acc, p.B, p.Tq, p.NH,
                                                             p.scale, p.cos_tab, p.sin_tab, p.q0);
    else
        wgb_dq_add_kernel<128><<<blocks, 256, 0, c->stream>>>(p.dq, p.q_bs, p.q_rs, w.dq_acc, p.B, p.Tq, p.NH,
                                                              p.scale, p.cos_tab, p.sin_tab, p.q0);
    CUDA_CHECK_LAUNCH();
    return 1;
#else
    (void)c, (void)p, (void)q, (void)q_bs, (void)q_rs, (void)k, (void)k_bs, (void)k_rs;
    return 0;
#endif
}
