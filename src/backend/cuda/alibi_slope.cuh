// ALiBi's slopes, for the attention kernels (attn_common.cuh) and tests/emu's emulation of them alike.
#ifndef KILN_BACKEND_CUDA_ALIBI_SLOPE_CUH
#define KILN_BACKEND_CUDA_ALIBI_SLOPE_CUH

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

#endif
