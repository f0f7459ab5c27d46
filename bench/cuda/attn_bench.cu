// Attention micro-benchmark: causal forward + backward of the CUDA backend's flash kernels.
// Times with CUDA events on the backend's stream: 3 warmup calls, then the median of 20.
// FLOPs (causal, the half computed): forward 2*2*B*NH*T*T*HS/2, backward 2.5x that (the FA-2 convention; the
// kernels here do 3.5x the forward's work in the backward, recomputing S and dP for dQ without atomics).
//   usage: attn_bench                 (the standard table)
//          attn_bench B T NH HS       (one shape)
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "backend/cuda/common.cuh"

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static int bench_one(struct kiln_backend *be, int B, int T, int NH, int HS, enum kiln_pos pos) {
    struct cuda_ctx *c = cuda_ctx_of(be->ctx);
    const struct kiln_ops *ops = be->ops;
    size_t n_qkv = (size_t)B * T * 3 * NH * HS, n_out = (size_t)B * T * NH * HS;
    void *qkv = ops->alloc(be->ctx, n_qkv * 2), *dqkv = ops->alloc(be->ctx, n_qkv * 2);
    void *out = ops->alloc(be->ctx, n_out * 2), *dout = ops->alloc(be->ctx, n_out * 2);
    float *lse = (float *)ops->alloc(be->ctx, (size_t)B * NH * T * 4);
    if (!qkv || !dqkv || !out || !dout || !lse) {
        printf("B=%d T=%d NH=%d HS=%d: out of memory, skipped\n", B, T, NH, HS);
        ops->free(be->ctx, qkv);
        ops->free(be->ctx, dqkv);
        ops->free(be->ctx, out);
        ops->free(be->ctx, dout);
        ops->free(be->ctx, lse);
        return 0;
    }
    { // random inputs: N(0, 1) in bf16
        std::vector<float> h(std::max(n_qkv, n_out));
        uint64_t s = 88172645463325252ull;
        for (size_t i = 0; i < h.size(); i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            h[i] = (float)((s >> 11) * (1.0 / 9007199254740992.0)) * 3.4641f - 1.7320f; // unit variance
        }
        ops->upload_f32(be->ctx, qkv, KILN_BF16, h.data(), n_qkv);
        ops->upload_f32(be->ctx, dout, KILN_BF16, h.data(), n_out);
    }
    struct kiln_attn_args fa = {out, lse, qkv, B, T, NH, NH, HS, pos, 10000.0f};
    struct kiln_attn_back_args ba = {dqkv, dout, qkv, out, lse, B, T, NH, NH, HS, pos, 10000.0f};
    cudaEvent_t e0, e1, e2;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventCreate(&e2));
    std::vector<float> tf, tb;
    for (int it = 0; it < 23; it++) {
        CUDA_CHECK(cudaEventRecord(e0, c->stream));
        ops->attention_forward(be->ctx, &fa);
        CUDA_CHECK(cudaEventRecord(e1, c->stream));
        ops->attention_backward(be->ctx, &ba);
        CUDA_CHECK(cudaEventRecord(e2, c->stream));
        CUDA_CHECK(cudaEventSynchronize(e2));
        float f = 0, b = 0;
        CUDA_CHECK(cudaEventElapsedTime(&f, e0, e1));
        CUDA_CHECK(cudaEventElapsedTime(&b, e1, e2));
        if (it >= 3) {
            tf.push_back(f);
            tb.push_back(b);
        }
    }
    double fl_f = 2.0 * 2.0 * B * NH * (double)T * T * HS / 2.0, fl_b = 2.5 * fl_f;
    float mf = median(tf), mb = median(tb);
    printf("B=%-3d T=%-5d NH=%-3d HS=%-4d %-5s  fwd %8.3f ms %6.1f TFLOP/s   bwd %8.3f ms %6.1f TFLOP/s   "
           "fwd+bwd %6.1f TFLOP/s\n",
           B, T, NH, HS, pos == KILN_POS_ROPE ? "rope" : "none", mf, fl_f / (mf * 1e-3) / 1e12, mb,
           fl_b / (mb * 1e-3) / 1e12, (fl_f + fl_b) / ((mf + mb) * 1e-3) / 1e12);
    fflush(stdout);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaEventDestroy(e2));
    ops->free(be->ctx, qkv);
    ops->free(be->ctx, dqkv);
    ops->free(be->ctx, out);
    ops->free(be->ctx, dout);
    ops->free(be->ctx, lse);
    return 0;
}

int main(int argc, char **argv) {
    if (kiln_cuda_device_count() == 0) {
        printf("attn_bench: no GPU: skipped\n");
        return 77;
    }
    struct kiln_backend be;
    struct kiln_error err;
    struct kiln_backend_opts o = {0, 0, 0};
    if (kiln_backend_open("cuda", &o, &be, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    printf("attn_bench on %s (causal, bf16, median of 20 after 3 warmup)\n", be.device_name);
    if (argc == 5) {
        bench_one(&be, atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), KILN_POS_NONE);
    } else {
        int bt[][2] = {{32, 1024}, {16, 2048}, {8, 8192}};
        int hh[][2] = {{12, 64}, {16, 64}, {16, 128}, {12, 128}};
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++)
                bench_one(&be, bt[i][0], bt[i][1], hh[j][0], hh[j][1], KILN_POS_NONE);
        bench_one(&be, 16, 1024, 16, 128, KILN_POS_ROPE); // RoPE inside the kernels: its cost
        bench_one(&be, 16, 1024, 16, 128, KILN_POS_NONE);
    }
    kiln_backend_close(&be);
    return 0;
}
