// The Hopper PTX that attention_wgmma.cu's kernels are built from, as inline device functions: the
// 128-byte-swizzled shared-memory descriptors, mbarriers, TMA loads and bulk reduce-adds, warpgroup MMA
// (wgmma) and its fences, named barriers, and shared-memory stores. Included by attention_wgmma.cu alone,
// after it defines WG_DEVICE_HELPERS (the sm_90a device pass and the host pass) and includes <cuda.h>.
#pragma once

#if defined(WG_DEVICE_HELPERS)
// ---- shared-memory layout ---------------------------------------------------------------------------------
// Every operand tile is stored as TMA writes it with CU_TENSOR_MAP_SWIZZLE_128B: column blocks of 64 bf16
// (128 bytes, one row of the swizzle pattern), each block [rows][64], rows 128 bytes apart; within every
// 1024-byte group of 8 rows, the 16-byte chunk c of row r sits at chunk c ^ (r % 8). A tile with HS = 128 is
// two such blocks one after the other ([2][rows][64]). Blocks start on 1024-byte boundaries, so the
// hardware's swizzle (a function of address bits 4-9) lines up with TMA's and the descriptors' base offset is
// 0.
//
// wgmma reads them through 64-bit matrix descriptors:
//   bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
//   49-51 base offset (0), 62-63 swizzle mode (1 = 128-byte).
// K-major operands (Q as A, K as B of S = Q K^T: the reduction dimension d is contiguous): 8-row groups
// 1024 bytes apart (stride byte offset); the leading byte offset is unused with 128-byte swizzle (set to 1,
// i.e. 16 bytes). A k-step of 16 (32 bytes) moves the start address by 32 bytes inside the 128-byte row;
// k-steps 4..7 of HS = 128 start in the second column block.
// MN-major operand (V as B of O = P V, reduction over keys, which are rows here; d contiguous): in units of
// 16 bytes the canonical layout is ((8, n), (8, k)) : ((1, LBO), (8, SBO)): 64 d-columns within one 128-
// byte row, the next 64 columns (HS = 128) LBO bytes away (the next column block: BN * 128), the next 8 keys
// SBO = 1024 bytes away. A k-step of 16 keys is 2048 bytes.
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// ---- mbarriers and TMA ------------------------------------------------------------------------------------
static __device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
static __device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase with the given parity has completed (phases alternate 0, 1, 0, ...).
// The retry loop lives inside one asm block (as CUTLASS's ClusterBarrier::wait does), and the warp is made
// whole again before returning: callers go on to wgmma.fence.sync.aligned, which needs the warp converged.
static __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n.reg .pred p;\nKILN_MBAR_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra KILN_MBAR_WAIT_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
    __syncwarp();
}
// Box at coordinates (c0 innermost .. c3) of a 4-D tensor map into shared memory; completes on bar.
static __device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *map, int c0, int c1,
                                                   int c2, int c3, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
        "%3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// ---- warpgroup MMA ----------------------------------------------------------------------------------------
// Accumulator fragment of m64nNk16 (f32), thread t of the warpgroup: warp w = t / 32 owns rows 16 w .. 16 w +
// 15; with g = (t % 32) / 4, t4 = t % 4, register 4 i + e holds row 16 w + g + 8 (e / 2), column 8 i + 2 t4 +
// (e % 2): the m16n8 C fragments of mma.sync, N / 8 of them side by side. The register A operand (bf16,
// 64 x 16) is the m16n8k16 A fragment per warp: {row g, k 2t4..+1}, {row g+8, same}, {row g, k 8+2t4..+1},
// {row g+8, same}.
static __device__ __forceinline__ void wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across the asynchronous MMA
// (the registers belong to the tensor cores between the issue and the wait).
template <int N> static __device__ __forceinline__ void reg_fence(float *d) {
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}
// The same for register A fragments (bf16 pairs): their writes must come before wgmma.fence, and they must
// stay live and unchanged until the wait (PTX: wgmma.fence orders "the input registers containing the
// fragments of matrix A" as well as the accumulators).
template <int N> static __device__ __forceinline__ void reg_fence_u32(uint32_t *a) {
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+r"(a[i])::"memory");
}

// ---- wgmma wrappers: the accumulators are N / 2 registers a thread, each an asm operand of its own
// (WG_ACC32/64: the "+f" operands of d[0..32) or d[0..64); WG_REGS32/64: their names, %0..%31 or %0..%63)
#define WG_ACC8(d, o)                                                                                        \
    "+f"((d)[(o) + 0]), "+f"((d)[(o) + 1]), "+f"((d)[(o) + 2]), "+f"((d)[(o) + 3]), "+f"((d)[(o) + 4]),      \
        "+f"((d)[(o) + 5]), "+f"((d)[(o) + 6]), "+f"((d)[(o) + 7])
#define WG_ACC32(d) WG_ACC8(d, 0), WG_ACC8(d, 8), WG_ACC8(d, 16), WG_ACC8(d, 24)
#define WG_ACC64(d) WG_ACC32(d), WG_ACC8(d, 32), WG_ACC8(d, 40), WG_ACC8(d, 48), WG_ACC8(d, 56)
#define WG_REGS32                                                                                            \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                                  \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS64                                                                                            \
    WG_REGS32 ","                                                                                            \
              "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"              \
              "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

// D (64 x 128, f32) (+)= A (64 x 16, smem desc) . B (16 x 128, smem desc); acc = 0: D is overwritten. TA, TB:
// imm-trans-a, -b, as wgmma_ss_n64's: 0, 0 for S = Q K^T (K-major)
template <int TA, int TB>
static __device__ __forceinline__ void wgmma_ss_n128_t(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS64
                 "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
                 : WG_ACC64(d)
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}

static __device__ __forceinline__ void wgmma_ss_n128(float *d, uint64_t da, uint64_t db, int acc) {
    wgmma_ss_n128_t<0, 0>(d, da, db, acc);
}

// D (64 x 64, f32) (+)= A (64 x 16, smem desc) . B (16 x 64, smem desc); acc = 0: D is overwritten. TA, TB:
// imm-trans-a, -b: 0 for K-major operands (S = Q K^T), 1 for MN-major ones, transposed by the descriptor (the
// backward's dQ = dS K, with dS stored keys-major ([key][query]) and K as TMA loaded it ([key][d])).
template <int TA, int TB>
static __device__ __forceinline__ void wgmma_ss_n64(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_REGS32
                 "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : WG_ACC32(d)
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}

// D (64 x 64, f32) += A (64 x 16, bf16 fragments in registers) . B (16 x 64, smem desc, MN-major)
static __device__ __forceinline__ void wgmma_rs_n64(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_REGS32
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// D (64 x 128, f32) += A (64 x 16, bf16 fragments in registers) . B (16 x 128, smem desc, MN-major)
static __device__ __forceinline__ void wgmma_rs_n128(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS64
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_ACC64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// ---- backward helpers
// Generic-proxy stores to shared memory (dS written by st.shared) made visible to the async proxy that
// wgmma's descriptors read through; each writing thread fences before the barrier that publishes them.
static __device__ __forceinline__ void fence_proxy_async_smem(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier over the 256 threads of the two consumer warpgroups (id 1; 0 is __syncthreads')
static __device__ __forceinline__ void consumers_bar_sync(void) {
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
}
// g[0] += x, g[1] += y (global, 8-byte aligned), one vector reduction, no result (as attention_fa2.cu's
// fa_red2 on sm_90). Four-wide REDs (lanes swapping halves: half the atomics) measured 12-14% slower in
// this kernel (docs/perf_notes.md).
static __device__ __forceinline__ void wg_red2(float *g, float x, float y) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(g), "f"(x), "f"(y) : "memory");
}
// DQ_TMA (FA3's dQ path): a box of shared memory added into global memory by the TMA unit, f32 element-wise
// (cp.reduce.async.bulk.tensor .add), one bulk group per commit; the issuing thread waits for its groups'
// reads of shared memory (.read) before the buffer is rewritten, and for all of them before the block ends.
static __device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap *map, uint32_t src, int c0, int c1,
                                                         int c2, int c3) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], "
        "[%1];\n" ::"l"(map),
        "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
static __device__ __forceinline__ void bulk_commit(void) {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// the issuing thread's bulk groups but the N most recent have read their shared memory (0: all of them)
template <int N> static __device__ __forceinline__ void bulk_wait_read(void) {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
static __device__ __forceinline__ void bulk_wait_all(void) {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Named barriers: bar.arrive (ARRIVE) or bar.sync at id ID of N threads, and at ID0 + w by w = 0 or 1 (a
// consumer warpgroup's own, or the other's). Immediates, so that ptxas counts the ids used, not the 16 a
// register id makes it assume.
template <bool ARRIVE, int ID, int N> static __device__ __forceinline__ void named_bar(void) {
    if constexpr (ARRIVE)
        asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(N) : "memory");
    else
        asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(N) : "memory");
}
template <bool ARRIVE, int ID0, int N> static __device__ __forceinline__ void named_bar_of(int w) {
    if (w == 0)
        named_bar<ARRIVE, ID0, N>();
    else
        named_bar<ARRIVE, ID0 + 1, N>();
}
// Barrier over one consumer warpgroup's 128 threads (ids 2 and 3)
static __device__ __forceinline__ void consumer_bar_sync(int cw) {
    named_bar_of<false, 2, 128>(cw);
}
// The backward's dQ hand-off to a producer warp (DQF 2): consumer cw's staging area is full at barrier 4 + cw
// (its 128 threads arrive, the producer warp's 32 sync) and empty again at 6 + cw (the producer warp arrives
// once its reduce-adds have read the area, the consumer's 128 sync before they rewrite it).
static __device__ __forceinline__ void dq_full_arrive(int cw) {
    named_bar_of<true, 4, 160>(cw);
}
static __device__ __forceinline__ void dq_full_sync(int cw) {
    named_bar_of<false, 4, 160>(cw);
}
static __device__ __forceinline__ void dq_empty_arrive(int cw) {
    named_bar_of<true, 6, 160>(cw);
}
static __device__ __forceinline__ void dq_empty_sync(int cw) {
    named_bar_of<false, 6, 160>(cw);
}
// The forward's ping-pong (FlashAttention-3's warp scheduling, the default; KILN_WGMMA_FWD=overlap: not):
// consumer cw waits for its turn at barrier 4 + cw (its own 128 threads sync there, the other consumer's 128
// arrive) before it issues a step's wgmmas, and gives the turn to the other (arrives at its barrier) once
// they are issued; so the tensor cores take the two consumers' matrix products in turn while the other runs
// its softmax.
static __device__ __forceinline__ void pp_turn_wait(int cw) {
    named_bar_of<false, 4, 256>(cw);
}
static __device__ __forceinline__ void pp_turn_give(int cw) { // (the other consumer's barrier: 5 - cw)
    if (cw == 0)
        asm volatile("bar.arrive 5, 256;\n" ::: "memory");
    else
        asm volatile("bar.arrive 4, 256;\n" ::: "memory");
}
static __device__ __forceinline__ void st_shared_v2f(uint32_t addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
#endif // WG_DEVICE_HELPERS
