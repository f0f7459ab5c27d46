// The host <-> GPU link as the offloaded optimizer uses it (issue 14: its copies should reach 80% of what the
// link gives): page-locked host buffers, cudaMemcpyAsync on a stream, each direction alone and both at once
// (two streams), for copies of a chunk's size. Times with CUDA events: 2 warmup copies, then the median of 10.
// Prints one JSON line: GB/s (1e9 bytes a second) host to device, device to host, and both together.
//   usage: link_bench [MiB]   (default 128: a 32M-element chunk of f32 gradients)
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(x)                                                                                            \
    do {                                                                                                    \
        cudaError_t e_ = (x);                                                                               \
        if (e_ != cudaSuccess) {                                                                            \
            fprintf(stderr, "error: %s (%s:%d): %s\n", #x, __FILE__, __LINE__, cudaGetErrorString(e_));     \
            exit(1);                                                                                        \
        }                                                                                                   \
    } while (0)

// median ms of `reps` rounds of copies: h2d and/or d2h, on their own streams
static float time_copies(void *dev_a, void *dev_b, void *host_a, void *host_b, size_t bytes, int h2d, int d2h,
                         cudaStream_t s1, cudaStream_t s2) {
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    std::vector<float> ms;
    for (int r = 0; r < 12; r++) {
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaEventRecord(t0, s1));
        CHECK(cudaStreamWaitEvent(s2, t0, 0));
        if (h2d)
            CHECK(cudaMemcpyAsync(dev_a, host_a, bytes, cudaMemcpyHostToDevice, s1));
        if (d2h)
            CHECK(cudaMemcpyAsync(host_b, dev_b, bytes, cudaMemcpyDeviceToHost, s2));
        cudaEvent_t done;
        CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
        CHECK(cudaEventRecord(done, s2));
        CHECK(cudaStreamWaitEvent(s1, done, 0));
        CHECK(cudaEventRecord(t1, s1));
        CHECK(cudaEventSynchronize(t1));
        CHECK(cudaEventDestroy(done));
        float m;
        CHECK(cudaEventElapsedTime(&m, t0, t1));
        if (r >= 2)
            ms.push_back(m);
    }
    CHECK(cudaEventDestroy(t0));
    CHECK(cudaEventDestroy(t1));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

int main(int argc, char **argv) {
    long mib = argc > 1 ? strtol(argv[1], NULL, 10) : 128;
    if (mib < 1 || mib > 65536) {
        fprintf(stderr, "error: bad size '%s' (link_bench MiB): 1 to 65536\n", argv[1]);
        return 2;
    }
    size_t bytes = (size_t)mib << 20;
    void *dev_a, *dev_b, *host_a, *host_b;
    CHECK(cudaMalloc(&dev_a, bytes));
    CHECK(cudaMalloc(&dev_b, bytes));
    CHECK(cudaMallocHost(&host_a, bytes));
    CHECK(cudaMallocHost(&host_b, bytes));
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    float h2d = time_copies(dev_a, dev_b, host_a, host_b, bytes, 1, 0, s1, s2);
    float d2h = time_copies(dev_a, dev_b, host_a, host_b, bytes, 0, 1, s1, s2);
    float both = time_copies(dev_a, dev_b, host_a, host_b, bytes, 1, 1, s1, s2);
    double gb = (double)bytes / 1e9;
    printf("{\"bytes\":%zu,\"h2d_gbps\":%.2f,\"d2h_gbps\":%.2f,\"both_gbps\":%.2f}\n", bytes, gb / (h2d / 1e3),
           gb / (d2h / 1e3), 2 * gb / (both / 1e3));
    CHECK(cudaFreeHost(host_a));
    CHECK(cudaFreeHost(host_b));
    CHECK(cudaFree(dev_a));
    CHECK(cudaFree(dev_b));
    return 0;
}
