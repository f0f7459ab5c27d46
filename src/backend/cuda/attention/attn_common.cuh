// Device primitives shared by kiln's attention kernels (attention.cu: the reference and decoding kernels;
// attention_fa2.cu: FlashAttention-2-style; attention_wgmma.cu: Hopper): ALiBi slopes, bf16 mma.sync,
// ldmatrix, packing, the forward's online softmax, and storing / RoPE-unrotating m16n8 accumulator fragments.
#ifndef KILN_BACKEND_CUDA_ATTN_COMMON_CUH
#define KILN_BACKEND_CUDA_ATTN_COMMON_CUH

#include "backend/cuda/common.cuh"

#include "backend/cuda/alibi_slope.cuh"

static __device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices: lane l supplies the row address of matrix l/8, row l%8.
static __device__ __forceinline__ void ldmatrix_x4(uint32_t *r, const bf16 *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// Four 8x8 b16 matrices, transposed: lane l supplies the row address of matrix l/8, row l%8.
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t *r, const bf16 *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x (low 16 bits) = lo
    return *(uint32_t *)&v;
}

// ALiBi bases of a thread's two accumulator rows, so that a score's bias slope2 (key - query) is one FMA with a
// compile-time column offset: sign 1, rows are queries (row[r]) and columns keys from col0: base = slope2
// (col0 - row[r]); sign -1 (the transposed backward tiles), rows are keys and columns queries from col0: base
// = slope2 (row[r] - col0). 0 without ALiBi (slope2 = 0).
static __device__ __forceinline__ void attn_alibi_bases(float *base, float slope2, const int *row, int col0,
                                                        int sign) {
    base[0] = slope2 * (float)(sign * (col0 - row[0]));
    base[1] = slope2 * (float)(sign * (col0 - row[1]));
}

// Online softmax of one key tile (the forward's, FA2's and the wgmma kernel's): s holds this thread's BN / 2
// scores in the m16n8 accumulator layout (element i: row qi[(i >> 1) & 1], key k0 + 8 (i >> 2) + 2 t4 +
// (i & 1); mma.sync's s[BN / 8][4] and wgmma's m64nBN fragment alike) and becomes P =
// exp2(s scale_log2 + slope2 (j - i) - mu) in f32, masked keys (j > i, j >= T) 0; m, l updated (log2
// domain); alpha the factor O must be rescaled by before this tile's P V is added. Without ALiBi the scale
// goes into the exp2's FMA (the max is taken on the raw scores: scale > 0), one FFMA and one EX2 an element;
// with it the bias comes from a per-row base plus a compile-time column offset (no int-to-float conversion
// per element: those run at the EX2's quarter rate).
template <int BN>
static __device__ __forceinline__ void attn_online_softmax(float *s, float *m, float *l, float *alpha, int k0,
                                                           const int *qi, int t4, bool alibi, float slope2,
                                                           float scale_log2, int T, bool need_mask) {
    float sc = scale_log2;
    if (alibi) {
        float rb[2];
        attn_alibi_bases(rb, slope2, qi, k0 + 2 * t4, 1);
#pragma unroll
        for (int i = 0; i < BN / 2; i++)
            s[i] = fmaf(s[i], scale_log2, fmaf(slope2, (float)((i >> 2) * 8 + (i & 1)), rb[(i >> 1) & 1]));
        sc = 1.0f;
    }
    if (need_mask) {
#pragma unroll
        for (int i = 0; i < BN / 2; i++) {
            int r = (i >> 1) & 1, kj = k0 + (i >> 2) * 8 + t4 * 2 + (i & 1);
            if (kj > qi[r] || kj >= T)
                s[i] = -INFINITY;
        }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    float mu[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        float mn = fmaxf(m[r], mx[r] * sc);
        mu[r] = mn == -INFINITY ? 0.0f : mn; // row fully masked so far: no inf - inf
        alpha[r] = exp2f(m[r] - mu[r]);
        m[r] = mn;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < BN / 2; i++) {
        float pv = exp2f(fmaf(s[i], sc, -mu[(i >> 1) & 1]));
        s[i] = pv;
        l[(i >> 1) & 1] += pv;
    }
}

// Inverse rotation of a gradient held in C fragments (16 rows x HS): column d and d + HS/2 sit in the same
// thread, at fragment dt and dt + HS/16. row_of(e) gives the position of the element's row.
template <int HS>
static __device__ __forceinline__ void rope_back_frag(float (*x)[4], int t_lo, int t_hi, int T,
                                                      const float *cos_tab, const float *sin_tab) {
    int t4 = (threadIdx.x & 31) & 3;
#pragma unroll
    for (int dt = 0; dt < HS / 16; dt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int t = e < 2 ? t_lo : t_hi;
            if (t >= T)
                continue;
            int d = dt * 8 + t4 * 2 + (e & 1);
            float cs = cos_tab[t * (HS / 2) + d], sn = sin_tab[t * (HS / 2) + d];
            float a = x[dt][e], b = x[dt + HS / 16][e];
            x[dt][e] = a * cs + b * sn;
            x[dt + HS / 16][e] = b * cs - a * sn;
        }
    }
}

// Stores a 16 x HS fragment block (rows t_lo / t_hi of this thread) to rows of a (B, T, stride) tensor.
template <int HS>
static __device__ __forceinline__ void store_frag(bf16 *base, int stride, int t_lo, int t_hi, int T,
                                                  float (*x)[4], float mul_lo, float mul_hi) {
    int t4 = (threadIdx.x & 31) & 3;
#pragma unroll
    for (int dt = 0; dt < HS / 8; dt++) {
        int d = dt * 8 + t4 * 2;
        if (t_lo < T)
            *(__nv_bfloat162 *)(base + (size_t)t_lo * stride + d) =
                __floats2bfloat162_rn(x[dt][0] * mul_lo, x[dt][1] * mul_lo);
        if (t_hi < T)
            *(__nv_bfloat162 *)(base + (size_t)t_hi * stride + d) =
                __floats2bfloat162_rn(x[dt][2] * mul_hi, x[dt][3] * mul_hi);
    }
}

// Kernels needing more than 48 KiB of dynamic shared memory must ask for it.
template <typename K> static void set_smem(K kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

#endif
