// What the two implementations of the block attention op share (ops.h: kiln_attn_block_args):
// attention_block.cu holds the f32 CUDA-core kernels (any even HS up to 256; KILN_ATTN_BLOCK=ref) and the
// launchers; attention_block_tc.cu the tensor-core kernels (bf16 mma.sync, HS 64 and 128), the default where
// they apply. Both compute the same function with the same conventions; the tensor-core kernels round the
// rotated q and k, and P and dS, to bf16 before their matrix products, as the FA2 kernels do.
#ifndef KILN_BACKEND_CUDA_ATTENTION_BLOCK_CUH
#define KILN_BACKEND_CUDA_ATTENTION_BLOCK_CUH

#include <math.h>
#include <string.h>

#include "backend/cuda/attention/attn_common.cuh"
#include "core/ops.h"

#define BLK_LOG2E 1.4426950408889634f
#define BLK_LN2 0.6931471805599453f

struct blk_params {
    const bf16 *q, *k, *v;
    bf16 *out;  // forward output, or the final output (backward)
    float *lse; // (b*NH + h) * lse_s + i
    const bf16 *dout;
    bf16 *dq, *dk, *dv;
    const float *dsum;              // (B, NH, Tq): rowsum(dout * out)
    const float *cos_tab, *sin_tab; // (positions, HS/2) each, NULL without RoPE
    int B, Tq, Tk, NH, NKV, HS;
    int q0, k0;
    size_t q_bs, kv_bs, out_bs, lse_s;
    int q_rs, kv_rs, out_rs;
    int alibi, head0, NH_total;
    float scale, scale_log2;
    int accumulate;
};

// The kernels' parameters from the op's arguments, all but the RoPE tables (the launchers' blk_setup, and
// tests/emu, build those) and the per-direction pointers (out, lse, dout, dq, dk, dv).
static inline struct blk_params blk_params_of(const struct kiln_attn_block_args *a) {
    struct blk_params p;
    memset(&p, 0, sizeof(p));
    p.q = (const bf16 *)a->q, p.k = (const bf16 *)a->k, p.v = (const bf16 *)a->v;
    p.B = a->B, p.Tq = a->Tq, p.Tk = a->Tk, p.NH = a->NH, p.NKV = a->NKV, p.HS = a->HS;
    p.q0 = a->q0, p.k0 = a->k0;
    p.q_bs = a->q_bstride, p.kv_bs = a->kv_bstride, p.out_bs = a->out_bstride, p.lse_s = a->lse_stride;
    p.q_rs = a->q_stride, p.kv_rs = a->kv_stride, p.out_rs = a->out_stride;
    p.alibi = a->pos == KILN_POS_ALIBI;
    p.head0 = a->NH_total ? a->head0 : 0;
    p.NH_total = a->NH_total ? a->NH_total : a->NH;
    p.scale = 1.0f / sqrtf((float)a->HS);
    p.scale_log2 = p.scale * BLK_LOG2E;
    return p;
}

// the global positions a block's RoPE tables must cover
static inline int blk_positions(const struct kiln_attn_block_args *a) {
    return a->q0 + a->Tq > a->k0 + a->Tk ? a->q0 + a->Tq : a->k0 + a->Tk;
}

// element d of a row after RoPE at global position pos
static __device__ __forceinline__ float blk_rot(const bf16 *row, int d, int half, int pos, const float *ct,
                                                const float *st) {
    float x = bf2f(row[d]);
    if (!ct)
        return x;
    int i = d < half ? d : d - half;
    float cs = ct[(size_t)pos * half + i], sn = st[(size_t)pos * half + i];
    return d < half ? x * cs - bf2f(row[d + half]) * sn : x * cs + bf2f(row[d - half]) * sn;
}

// the ALiBi slope of the block's head h, in the log2 domain (0 without ALiBi)
static __device__ __forceinline__ float blk_slope2(const struct blk_params &p, int h) {
    return p.alibi ? alibi_slope(p.head0 + h, p.NH_total) * BLK_LOG2E : 0.0f;
}

// The tensor-core kernels (attention_block_tc.cu), for HS 64 and 128: 1 when they ran, 0 when the head size
// is not theirs. The backward needs p.dsum.
// wgmma: try the Hopper kernels first (blk_wgmma_*), where they take the block.
int blk_tc_forward(struct cuda_ctx *c, const struct blk_params &p, int wgmma);
int blk_tc_backward(struct cuda_ctx *c, const struct blk_params &p, int wgmma);

// The Hopper kernels (attention_wgmma.cu) on one block whose queries all come at or after its keys (q0 >=
// k0), without ALiBi, HS 64 or 128, on an sm_90 device: 1 when they ran, 0 otherwise (nothing done). q and k:
// the sources after RoPE (rows q_rs / k_rs, batches q_bs / k_bs apart). The backward needs p.dsum.
int blk_wgmma_forward(struct cuda_ctx *c, const struct blk_params &p, const bf16 *q, size_t q_bs, int q_rs,
                      const bf16 *k, size_t k_bs, int k_rs);
int blk_wgmma_backward(struct cuda_ctx *c, const struct blk_params &p, const bf16 *q, size_t q_bs, int q_rs,
                       const bf16 *k, size_t k_bs, int k_rs);

#endif
