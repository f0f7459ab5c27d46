// Device primitives shared by kiln's attention kernels (attention.cu: the reference and decoding kernels;
// attention_fa2.cu: the FlashAttention-2-style default): ALiBi slopes, bf16 mma.sync, ldmatrix, packing,
// and storing / RoPE-unrotating m16n8 accumulator fragments.
#ifndef KILN_BACKEND_CUDA_ATTN_COMMON_CUH
#define KILN_BACKEND_CUDA_ATTN_COMMON_CUH

#include "backend/cuda/common.cuh"

// ALiBi slope of head h: 2^(-8(h+1)/NH) for power-of-two NH; otherwise the paper's interpolation: the slopes
// of the nearest lower power of two n, then every other slope of 2n.
static __device__ __forceinline__ float alibi_slope(int h, int NH) {
    int n = 1;
    while (n * 2 <= NH)
        n *= 2;
    if (h < n)
        return exp2f(-8.0f * (h + 1) / n);
    return exp2f(-4.0f * (2 * (h - n) + 1) / n);
}

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
