// The CUDA that the block-attention tensor-core kernels use, emulated on the CPU (tests/emu): one thread per
// CUDA thread of a block, barriers for __syncthreads and __syncwarp, shuffles, ldmatrix and mma.sync m16n8k16
// done warp-collectively through a per-warp exchange area, with the PTX fragment layouts, and cp.async with
// its commit groups. What only faults (or races) on the hardware is made to fail here: 16-byte accesses and
// ldmatrix rows must be 16-byte aligned and ldmatrix / cp.async destinations in shared memory (asserted), and
// a cp.async's destination reads as NaN from its issue until the wait that completes it. Compiled as C++ with
// KILN_CUDA_EMU in place of src/backend/cuda/attention/attn_common.cuh (this directory comes first on the include
// path), so src/backend/cuda/attention/attention_block_tc.cu's kernels build unchanged. Only what those kernels use is
// here.
#ifndef KILN_TESTS_EMU_ATTN_COMMON_CUH
#define KILN_TESTS_EMU_ATTN_COMMON_CUH

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

using std::max;
using std::min;

#define KILN_CEIL_DIV(a, b) (((a) + (b)-1) / (b))

// ---- bf16 -------------------------------------------------------------------------------------------------
struct bf16 {
    uint16_t u;
};
static inline float bf2f(bf16 x) {
    uint32_t w = (uint32_t)x.u << 16;
    float f;
    memcpy(&f, &w, 4);
    return f;
}
static inline bf16 f2bf(float f) { // round to nearest even, as __float2bfloat16_rn (NaN kept a NaN)
    uint32_t w;
    memcpy(&w, &f, 4);
    if ((w & 0x7fffffffu) > 0x7f800000u)
        return bf16{(uint16_t)((w >> 16) | 0x40)};
    w += 0x7fffu + ((w >> 16) & 1u);
    return bf16{(uint16_t)(w >> 16)};
}
static inline unsigned short __bfloat16_as_ushort(bf16 x) {
    return x.u;
}
static inline uint32_t pack_bf16(float lo, float hi) {
    return (uint32_t)f2bf(lo).u | ((uint32_t)f2bf(hi).u << 16);
}
// CUDA's fast log2 (glibc declares a __log2f of its own but libm does not export it)
#define __log2f(x) log2f(x)

#include "backend/cuda/alibi_slope.cuh" // (the kernels' own, from src)

// ---- threads, blocks, warps -------------------------------------------------------------------------------
struct emu_uint3 {
    unsigned x, y, z;
};
struct emu_warp {
    pthread_barrier_t bar;
    float f[32];
    uint32_t a[32][4], b[32][2];
    const unsigned char *row[32]; // ldmatrix: each lane's row address
};
struct emu_block {
    unsigned char *smem;
    size_t smem_bytes;
    pthread_barrier_t bar;
    emu_warp warps[32];
};
static thread_local emu_uint3 threadIdx, blockIdx, blockDim, gridDim;
static thread_local emu_block *emu_cur;

static inline unsigned char *tc_smem(void) {
    return emu_cur->smem;
}
static inline emu_warp &emu_my_warp(void) {
    return emu_cur->warps[threadIdx.x >> 5];
}
static inline void __syncthreads(void) {
    pthread_barrier_wait(&emu_cur->bar);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)mask;
    pthread_barrier_wait(&emu_my_warp().bar);
}
static inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    (void)mask;
    emu_warp &w = emu_my_warp();
    int lane = threadIdx.x & 31;
    w.f[lane] = v;
    pthread_barrier_wait(&w.bar);
    float r = w.f[lane ^ lane_mask];
    pthread_barrier_wait(&w.bar);
    return r;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, c += A (16 x 16) . B (16 x 8), from the PTX ISA's
// fragment layouts (g = lane / 4, t = lane % 4): A's register i of lane l holds row g + 8 (i & 1), columns
// 2t + 8 (i >> 1) and + 1 (low half first); B's register i holds rows 2t + 8 i (+ 1) of column g; c holds
// (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). Sums in double: the hardware's f32 order is
// unspecified.
static inline float emu_half(uint32_t r, int k) {
    return bf2f(bf16{(uint16_t)(k & 1 ? r >> 16 : r & 0xffffu)});
}
static inline void mma_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    emu_warp &w = emu_my_warp();
    int lane = threadIdx.x & 31;
    for (int i = 0; i < 4; i++)
        w.a[lane][i] = a[i];
    w.b[lane][0] = b0;
    w.b[lane][1] = b1;
    pthread_barrier_wait(&w.bar);
    int g = lane >> 2, t = lane & 3;
    for (int e = 0; e < 4; e++) {
        int r = g + 8 * (e >> 1), n = 2 * t + (e & 1);
        double acc = c[e];
        for (int k = 0; k < 16; k++) {
            float av = emu_half(w.a[(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k);
            float bv = emu_half(w.b[n * 4 + (k % 8) / 2][k >= 8], k);
            acc += (double)av * bv;
        }
        c[e] = (float)acc;
    }
    pthread_barrier_wait(&w.bar);
}

// ---- shared memory: ldmatrix, cp.async --------------------------------------------------------------------

// what would fault on the hardware aborts here (on in release builds, unlike assert)
#define EMU_CHECK(cond)                                                                                      \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "emu: %s:%d: %s fails (a fault on the GPU)\n", __FILE__, __LINE__, #cond);       \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

// 16 bytes at p lie in the block's shared memory, 16-byte aligned
static inline void emu_check_smem16(const void *p) {
    const unsigned char *b = (const unsigned char *)p;
    EMU_CHECK(((uintptr_t)b & 15) == 0);
    EMU_CHECK(b >= emu_cur->smem && b + 16 <= emu_cur->smem + emu_cur->smem_bytes);
}

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane l gives the address of row l % 8 of matrix l / 8 (16
// bytes, 16-byte aligned, in shared memory); register i of lane l (g = l / 4, t = l % 4) gets matrix i's row
// g, columns 2t and 2t + 1 (low half first), or with .trans its column g, rows 2t and 2t + 1.
static inline void emu_ldmatrix_x4(uint32_t *r, const bf16 *p, int trans) {
    emu_warp &w = emu_my_warp();
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    emu_check_smem16(p);
    w.row[lane] = (const unsigned char *)p;
    pthread_barrier_wait(&w.bar);
    for (int i = 0; i < 4; i++) {
        uint16_t h[2];
        for (int e = 0; e < 2; e++) {
            int row = trans ? 2 * t + e : g, col = trans ? g : 2 * t + e;
            memcpy(&h[e], w.row[i * 8 + row] + 2 * col, 2);
        }
        r[i] = (uint32_t)h[0] | ((uint32_t)h[1] << 16);
    }
    pthread_barrier_wait(&w.bar);
}
static inline void ldmatrix_x4(uint32_t *r, const bf16 *p) {
    emu_ldmatrix_x4(r, p, 0);
}
static inline void ldmatrix_x4_trans(uint32_t *r, const bf16 *p) {
    emu_ldmatrix_x4(r, p, 1);
}

// cp.async.cg.shared.global [s], [g], 16, valid ? 16 : 0: both addresses 16-byte aligned; 16 bytes copied, or
// zeros. The copy lands at the cp_async_wait that completes its group; until then the destination holds NaN
// (on the hardware: anything), so a read that comes too early, or a refill that overtakes a read, shows.
struct emu_copy {
    unsigned char *s;
    const unsigned char *g;
    int valid;
    long group; // the commit group it belongs to; -1 until committed
};
static thread_local std::vector<emu_copy> emu_copies;
static thread_local long emu_groups; // groups committed by this thread

static inline void cp_async16(bf16 *s, const bf16 *g, int valid) {
    emu_check_smem16(s);
    EMU_CHECK(((uintptr_t)g & 15) == 0);
    memset(s, 0xff, 16);
    emu_copies.push_back(emu_copy{(unsigned char *)s, (const unsigned char *)g, valid, -1});
}
static inline void cp_async_commit(void) {
    for (emu_copy &c : emu_copies)
        if (c.group < 0)
            c.group = emu_groups;
    emu_groups++;
}
// cp.async.wait_group N: every group but the newest N committed is complete
template <int N> static inline void cp_async_wait(void) {
    std::vector<emu_copy> left;
    for (const emu_copy &c : emu_copies) {
        if (c.group >= 0 && c.group < emu_groups - N) {
            if (c.valid)
                memcpy(c.s, c.g, 16);
            else
                memset(c.s, 0, 16);
        } else {
            left.push_back(c);
        }
    }
    emu_copies.swap(left);
}

// Runs kernel() for every block of grid (gx, gy), `threads` CPU threads a block (a multiple of 32), with
// `smem` bytes of shared memory each, blocks one after another.
template <class K> static void emu_launch(int gx, int gy, int threads, size_t smem, K kernel) {
    struct arg {
        emu_block *blk;
        unsigned tx, bx, by, nt, gx, gy;
        K *kernel;
    };
    int nw = threads / 32;
    emu_block *blk = new emu_block;
    blk->smem_bytes = smem;
    blk->smem = (unsigned char *)aligned_alloc(16, (smem + 15) / 16 * 16 + 16);
    pthread_barrier_init(&blk->bar, NULL, threads);
    for (int w = 0; w < nw; w++)
        pthread_barrier_init(&blk->warps[w].bar, NULL, 32);
    pthread_t *th = new pthread_t[threads];
    arg *args = new arg[threads];
    for (int by = 0; by < gy; by++)
        for (int bx = 0; bx < gx; bx++) {
            memset(blk->smem, 0xff, smem); // poison: a read of shared memory nothing wrote shows as NaN
            for (int i = 0; i < threads; i++) {
                args[i] = arg{blk,          (unsigned)i,  (unsigned)bx, (unsigned)by, (unsigned)threads,
                              (unsigned)gx, (unsigned)gy, &kernel};
                pthread_create(
                    &th[i], NULL,
                    [](void *v) -> void * {
                        arg *a = (arg *)v;
                        emu_cur = a->blk;
                        threadIdx = emu_uint3{a->tx, 0, 0};
                        blockIdx = emu_uint3{a->bx, a->by, 0};
                        blockDim = emu_uint3{a->nt, 1, 1};
                        gridDim = emu_uint3{a->gx, a->gy, 1};
                        emu_copies.clear();
                        emu_groups = 0;
                        (*a->kernel)();
                        return NULL;
                    },
                    &args[i]);
            }
            for (int i = 0; i < threads; i++)
                pthread_join(th[i], NULL);
        }
    delete[] th;
    delete[] args;
    for (int w = 0; w < nw; w++)
        pthread_barrier_destroy(&blk->warps[w].bar);
    pthread_barrier_destroy(&blk->bar);
    free(blk->smem);
    delete blk;
}

#endif
