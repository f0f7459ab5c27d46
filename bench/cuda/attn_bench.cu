#include <string.h>
// Attention micro-benchmark: causal forward + backward of the CUDA backend's flash kernels.
// Times with CUDA events on the backend's stream: 3 warmup calls, then the median of 20.
// FLOPs (causal, the half computed): forward 2*2*B*NH*T*T*HS/2, backward 2.5x that (the FA-2 convention; the
// deterministic backward executes 3.5x the forward's work, recomputing S and dP for dQ without atomics).
// Each shape runs five paths on the same inputs: ref (KILN_ATTN=ref, the first kernels), det (the FA2
// kernels, KILN_ATTN=fa2, in deterministic mode: two-kernel backward), new (FA2 in the default mode:
// single-pass backward, dQ by atomics), new-v1 and new-v2 (KILN_FA_VARIANT=1, 2: other tile shapes of the
// single-pass backward; the forward is variant 1's in both), with the max relative error of each against ref
// and the backward's speedup over det. Where the Hopper kernels apply (a build with KILN_CUDA_ARCHS
// containing 90a, an sm_90 device), a sixth path, wgmma (KILN_ATTN=wgmma: attention_wgmma.cu's forward and
// backward, both wgmma + TMA), follows; its `fwd/new` and `bwd/new` columns are its speedups over the FA2
// forward and single-pass backward of `new`, `f+b` the two together (the defaults: the forward's consumers
// in turns, the backward's dQ split by columns between its consumers, dK issued after the dQ pass and the
// dQ's reduce-adds issued by a producer warp: KILN_WGMMA_DQ=tma-dqpw); then wgmma-red, dQ added by vector
// REDs (KILN_WGMMA_DQ=red), wgmma-ov, the forward's consumers each on its own (KILN_WGMMA_FWD=overlap),
// wgmma-tma, one consumer a tile's dQ (KILN_WGMMA_DQ=tma), and wgmma-early, the split dQ with each tile's dV
// and dK products issued as soon as their operands are ready (KILN_WGMMA_DQ=tma-early), wgmma-early2, that
// with two dQ staging areas a consumer (tma-early2), wgmma-dqf, tma-early with dK issued after the dQ pass,
// under the dQ's staging (tma-dqfirst), and wgmma-split, the split dQ alone (tma-split, the default before
// 2026-11-26).
// The last line counts CHECK-FAILs (exit 1 if any).
//   usage: attn_bench                 (the standard table)
//          attn_bench B T NH HS       (one shape)
//          attn_bench wgmma           (correctness shapes, then wgmma vs FA2 at T 1024/2048, HS 64/128)
//          attn_bench block T NH HS   (the ring's block op: f32 kernels against tensor cores, bench_block)
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "backend/cuda/common.cuh"

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// One path (env KILN_ATTN / KILN_FA_VARIANT as set by the caller): median fwd and bwd times in ms.
static void time_path(struct kiln_backend *be, const struct kiln_attn_args *fa,
                      const struct kiln_attn_back_args *ba, float *mf, float *mb) {
    struct cuda_ctx *c = cuda_ctx_of(be->ctx);
    cudaEvent_t e0, e1, e2;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventCreate(&e2));
    std::vector<float> tf, tb;
    for (int it = 0; it < 23; it++) {
        CUDA_CHECK(cudaEventRecord(e0, c->stream));
        be->ops->attention_forward(be->ctx, fa);
        CUDA_CHECK(cudaEventRecord(e1, c->stream));
        be->ops->attention_backward(be->ctx, ba);
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
    *mf = median(tf);
    *mb = median(tb);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaEventDestroy(e2));
}

// max |a - b| / max |b| over the elements selected by (row, column range) of a (rows, W) matrix
static double max_rel(const std::vector<float> &a, const std::vector<float> &b, size_t rows, size_t W,
                      size_t c0, size_t c1) {
    double md = 0, mr = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t i = c0; i < c1; i++) {
            double x = a[r * W + i], y = b[r * W + i];
            if (!(fabs(x - y) <= md)) // also catches NaN
                md = isnan(x - y) ? INFINITY : fabs(x - y);
            mr = std::max(mr, fabs(y));
        }
    return mr > 0 ? md / mr : md;
}

// A kernel knob's value (NULL: its default) on the context, for the calls that follow (kiln_cuda_set_kernel:
// the paths compared on the same inputs in one process).
static void set_kernel(void *ctx, const char *knob, const char *value) {
    if (kiln_cuda_set_kernel(ctx, knob, value)) {
        fprintf(stderr, "attn_bench: %s=%s: not a kernel choice\n", knob, value ? value : "");
        exit(2);
    }
}

static void set_path(void *ctx, const char *attn, const char *variant) {
    set_kernel(ctx, "KILN_ATTN", attn);
    set_kernel(ctx, "KILN_FA_VARIANT", variant);
}

// Runs the reference path (KILN_ATTN=ref) and the new one (variants 0 and 1) on the same inputs: times of
// each, and the new path's max relative error against the reference (out, lse, dq, dk, dv; each path's
// backward uses its own forward output and lse). A line ending in CHECK-FAIL means the new kernels disagree
// with the old.
static int n_checks, n_fail;

static int bench_one(struct kiln_backend *be, int B, int T, int NH, int NKV, int HS, enum kiln_pos pos) {
    const struct kiln_ops *ops = be->ops;
    size_t W = (size_t)(NH + 2 * NKV) * HS, n_qkv = (size_t)B * T * W, n_out = (size_t)B * T * NH * HS,
           n_lse = (size_t)B * NH * T;
    void *qkv = ops->alloc(be->ctx, n_qkv * 2), *dqkv = ops->alloc(be->ctx, n_qkv * 2);
    void *out = ops->alloc(be->ctx, n_out * 2), *dout = ops->alloc(be->ctx, n_out * 2);
    float *lse = (float *)ops->alloc(be->ctx, n_lse * 4);
    if (!qkv || !dqkv || !out || !dout || !lse) {
        printf("B=%d T=%d NH=%d HS=%d: out of memory, skipped\n", B, T, NH, HS);
        ops->free(be->ctx, qkv);
        ops->free(be->ctx, dqkv);
        ops->free(be->ctx, out);
        ops->free(be->ctx, dout);
        ops->free(be->ctx, lse);
        return 0;
    }
    { // random inputs: unit variance, bf16
        std::vector<float> h(std::max(n_qkv, n_out));
        uint64_t s = 88172645463325252ull;
        for (size_t i = 0; i < h.size(); i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            h[i] = (float)((s >> 11) * (1.0 / 9007199254740992.0)) * 3.4641f - 1.7320f;
        }
        ops->upload_f32(be->ctx, qkv, KILN_BF16, h.data(), n_qkv);
        for (size_t i = 0; i < n_out; i++) // dout: a different stream than q
            h[i] = h[(i * 7919 + 13) % h.size()];
        ops->upload_f32(be->ctx, dout, KILN_BF16, h.data(), n_out);
    }
    struct kiln_attn_args fa = {out, lse, qkv, B, T, NH, NKV, HS, pos, 10000.0f};
    struct kiln_attn_back_args ba = {dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, pos, 10000.0f};
    double fl_f = 2.0 * 2.0 * B * NH * (double)T * T * HS / 2.0, fl_b = 2.5 * fl_f;
    char sh[96];
    snprintf(sh, sizeof(sh), "B=%d T=%d NH=%d NKV=%d HS=%d %s", B, T, NH, NKV, HS,
             pos == KILN_POS_ROPE    ? "rope"
             : pos == KILN_POS_ALIBI ? "alibi"
                                     : "none");
    // (wgmma: the defaults, the forward's consumers in turns and the backward's tma-dqpw;
    // wgmma-red: dQ added by vector REDs, KILN_WGMMA_DQ=red; wgmma-ov: the forward's consumers each on its
    // own, KILN_WGMMA_FWD=overlap; wgmma-tma: one consumer a tile's whole dQ, KILN_WGMMA_DQ=tma;
    // wgmma-early: dV and dK issued early, KILN_WGMMA_DQ=tma-early; wgmma-early2: that and two dQ staging
    // areas a consumer, tma-early2; wgmma-dqf: tma-early with dK after the dQ pass, tma-dqfirst; wgmma-split:
    // the split dQ alone, tma-split)
    const char *names[13] = {"ref",          "det",       "new",        "new-v1",    "new-v2",
                             "wgmma",        "wgmma-red", "wgmma-ov",   "wgmma-tma", "wgmma-early",
                             "wgmma-early2", "wgmma-dqf", "wgmma-split"};
    const char *attn[13] = {"ref",   "fa2",   "fa2",   "fa2",   "fa2",   "wgmma", "wgmma",
                            "wgmma", "wgmma", "wgmma", "wgmma", "wgmma", "wgmma"};
    const char *var[13] = {"0", "0", "0", "1", "2", "0", "0", "0", "0", "0", "0", "0", "0"};
    // KILN_WGMMA_DQ of each path (NULL: unset, the default)
    const char *dqm[13] = {NULL, NULL,  NULL,        NULL,         NULL,          NULL,       "red",
                           NULL, "tma", "tma-early", "tma-early2", "tma-dqfirst", "tma-split"};
    int det[13] = {0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    int n_paths = kiln_cuda_wgmma_attention_available(be->ctx) ? 13 : 5;
    struct cuda_ctx *c = cuda_ctx_of(be->ctx);
    std::vector<float> r_out(n_out), r_lse(n_lse), r_d(n_qkv), x_out(n_out), x_lse(n_lse), x_d(n_qkv);
    std::vector<float> nan_fill(n_qkv, NAN);
    float ref_f = 0, ref_b = 0, det_b = 0, new_f = 0, new_b = 0;
    for (int k = 0; k < n_paths; k++) {
        set_path(be->ctx, attn[k], var[k]);
        set_kernel(be->ctx, "KILN_WGMMA_DQ", dqm[k]);
        set_kernel(be->ctx, "KILN_WGMMA_FWD", k == 7 ? "overlap" : NULL);
        c->deterministic = det[k];
        ops->upload_f32(be->ctx, dqkv, KILN_BF16, nan_fill.data(), n_qkv); // every element must be written
        ops->attention_forward(be->ctx, &fa);
        ops->attention_backward(be->ctx, &ba);
        ops->synchronize(be->ctx);
        std::vector<float> &o = k ? x_out : r_out, &l = k ? x_lse : r_lse, &d = k ? x_d : r_d;
        ops->download_f32(be->ctx, o.data(), out, KILN_BF16, n_out);
        ops->download_f32(be->ctx, l.data(), lse, KILN_F32, n_lse);
        ops->download_f32(be->ctx, d.data(), dqkv, KILN_BF16, n_qkv);
        float mf, mb;
        time_path(be, &fa, &ba, &mf, &mb);
        if (k == 0) {
            ref_f = mf;
            ref_b = mb;
        }
        if (k == 1)
            det_b = mb;
        if (k == 2) {
            new_f = mf;
            new_b = mb;
        }
        printf("%-40s %-9s fwd %7.3f ms %6.1f TF/s  bwd %7.3f ms %6.1f TF/s  f+b %6.1f TF/s  x%.2f", sh,
               names[k], mf, fl_f / (mf * 1e-3) / 1e12, mb, fl_b / (mb * 1e-3) / 1e12,
               (fl_f + fl_b) / ((mf + mb) * 1e-3) / 1e12, (ref_f + ref_b) / (mf + mb));
        if (k >= 2)
            printf("  bwd/det x%.2f", det_b / mb);
        if (k >= 5)
            printf("  fwd/new x%.2f bwd/new x%.2f", new_f / mf, new_b / mb);
        if (k) {
            size_t BT = (size_t)B * T;
            double eo = max_rel(x_out, r_out, BT, (size_t)NH * HS, 0, (size_t)NH * HS);
            double el = max_rel(x_lse, r_lse, 1, n_lse, 0, n_lse);
            double eq = max_rel(x_d, r_d, BT, W, 0, (size_t)NH * HS);
            double ek = max_rel(x_d, r_d, BT, W, (size_t)NH * HS, (size_t)(NH + NKV) * HS);
            double ev = max_rel(x_d, r_d, BT, W, (size_t)(NH + NKV) * HS, W);
            int ok = eo < 2e-2 && el < 1e-3 && eq < 4e-2 && ek < 4e-2 && ev < 4e-2;
            printf("  vs ref: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e %s", eo, el, eq, ek, ev,
                   ok ? "ok" : "CHECK-FAIL");
            n_checks++;
            n_fail += !ok;
        }
        printf("\n");
        fflush(stdout);
    }
    set_path(be->ctx, NULL, "0");
    set_kernel(be->ctx, "KILN_WGMMA_DQ", NULL);
    set_kernel(be->ctx, "KILN_WGMMA_FWD", NULL);
    c->deterministic = 0;
    ops->free(be->ctx, qkv);
    ops->free(be->ctx, dqkv);
    ops->free(be->ctx, out);
    ops->free(be->ctx, dout);
    ops->free(be->ctx, lse);
    return 0;
}

// The ring's attention-block op (sequence parallelism) at one length: queries of the sequence's second half
// against keys of its first (a whole block, as most ring steps are) and the diagonal block (causal), forward
// and backward, on the f32 kernels (KILN_ATTN_BLOCK=ref) and the tensor cores (tc); RoPE, as the 1.3B shape
// runs. TFLOP/s count the visible pairs: Tq x Tk whole, half of it on the diagonal. The last column is tc's
// largest relative error against ref over out and dq (a chunk of the sequence; ~1e-2 is bf16's P and dS).
static void bench_block(struct kiln_backend *be, int T, int NH, int HS) {
    const struct kiln_ops *ops = be->ops;
    struct cuda_ctx *c = cuda_ctx_of(be->ctx);
    int S = T / 2;
    size_t W = (size_t)3 * NH * HS, C = (size_t)NH * HS, n_qkv = (size_t)T * W, n_out = (size_t)T * C;
    void *qkv = ops->alloc(be->ctx, n_qkv * 2), *dqkv = ops->alloc(be->ctx, n_qkv * 2);
    void *out = ops->alloc(be->ctx, n_out * 2), *dout = ops->alloc(be->ctx, n_out * 2);
    float *lse = (float *)ops->alloc(be->ctx, (size_t)NH * T * 4);
    std::vector<float> h(n_qkv);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < h.size(); i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = (float)((s >> 11) * (1.0 / 9007199254740992.0)) * 3.4641f - 1.7320f;
    }
    ops->upload_f32(be->ctx, qkv, KILN_BF16, h.data(), n_qkv);
    ops->upload_f32(be->ctx, dout, KILN_BF16, h.data(), n_out);
    std::vector<float> zeros(n_qkv, 0.0f);
    const char *names[2] = {"whole", "diagonal"};
    std::vector<float> first[2];
    for (int kind = 0; kind < 2; kind++) {
        int j0 = kind ? S : 0; // keys [j0, j0 + S) for queries [S, T)
        bf16 *q = (bf16 *)qkv + (size_t)S * W, *k = (bf16 *)qkv + (size_t)j0 * W + C,
             *v = (bf16 *)qkv + (size_t)j0 * W + 2 * C;
        struct kiln_attn_block_args a = {};
        a.out = (bf16 *)out + (size_t)S * C, a.lse = lse + S, a.q = q, a.k = k, a.v = v;
        a.B = 1, a.Tq = S, a.Tk = S, a.NH = NH, a.NKV = NH, a.HS = HS, a.q0 = S, a.k0 = j0;
        a.q_bstride = a.kv_bstride = n_qkv, a.out_bstride = n_out, a.lse_stride = T;
        a.q_stride = a.kv_stride = (int)W, a.out_stride = (int)C;
        a.pos = KILN_POS_ROPE, a.rope_theta = 10000.0f;
        struct kiln_attn_block_back_args b = {};
        b.blk = a;
        b.dq = (bf16 *)dqkv + (size_t)S * W, b.dk = (bf16 *)dqkv + (size_t)j0 * W + C;
        b.dv = (bf16 *)dqkv + (size_t)j0 * W + 2 * C, b.dout = (bf16 *)dout + (size_t)S * C;
        double fl = 4.0 * S * S * HS * NH * (kind ? 0.5 : 1.0);
        float err = 0;
        for (int tc = 0; tc < 2; tc++) {
            set_kernel(be->ctx, "KILN_ATTN_BLOCK", tc ? "tc" : "ref");
            cudaEvent_t e0, e1, e2;
            CUDA_CHECK(cudaEventCreate(&e0));
            CUDA_CHECK(cudaEventCreate(&e1));
            CUDA_CHECK(cudaEventCreate(&e2));
            std::vector<float> tf, tb;
            int reps = tc ? 13 : 4; // (the f32 kernels are slow)
            // the first call's dq is its gradient alone
            ops->upload_f32(be->ctx, dqkv, KILN_BF16, zeros.data(), n_qkv);
            for (int it = 0; it < reps; it++) {
                CUDA_CHECK(cudaEventRecord(e0, c->stream));
                ops->attention_block_forward(be->ctx, &a);
                CUDA_CHECK(cudaEventRecord(e1, c->stream));
                ops->attention_block_backward(be->ctx, &b);
                CUDA_CHECK(cudaEventRecord(e2, c->stream));
                CUDA_CHECK(cudaEventSynchronize(e2));
                float f = 0, bw = 0;
                CUDA_CHECK(cudaEventElapsedTime(&f, e0, e1));
                CUDA_CHECK(cudaEventElapsedTime(&bw, e1, e2));
                if (it >= 1)
                    tf.push_back(f), tb.push_back(bw);
                if (it == 0) { // the first call's out and dq (later calls add to dq)
                    size_t n = std::min((size_t)1 << 20, (size_t)S * C);
                    std::vector<float> o(n), d(n);
                    ops->download_f32(be->ctx, o.data(), a.out, KILN_BF16, n);
                    ops->download_f32(be->ctx, d.data(), b.dq, KILN_BF16, n);
                    o.insert(o.end(), d.begin(), d.end());
                    if (!tc) {
                        first[kind] = o;
                    } else {
                        double num = 0, den = 0;
                        for (size_t i = 0; i < o.size(); i++)
                            num += (o[i] - first[kind][i]) * (o[i] - first[kind][i]),
                                den += first[kind][i] * first[kind][i];
                        err = (float)sqrt(num / (den > 0 ? den : 1));
                    }
                }
            }
            float mf = median(tf), mb = median(tb);
            printf("block T=%-7d NH=%-3d HS=%-4d %-8s %-3s fwd %9.3f ms %6.1f TF/s  bwd %9.3f ms %6.1f TF/s",
                   T, NH, HS, names[kind], tc ? "tc" : "ref", mf, fl / mf / 1e9, mb, 2.5 * fl / mb / 1e9);
            if (tc)
                printf("  vs ref %.1e", err);
            printf("\n");
            fflush(stdout);
            CUDA_CHECK(cudaEventDestroy(e0));
            CUDA_CHECK(cudaEventDestroy(e1));
            CUDA_CHECK(cudaEventDestroy(e2));
        }
    }
    set_kernel(be->ctx, "KILN_ATTN_BLOCK", NULL);
    ops->free(be->ctx, qkv);
    ops->free(be->ctx, dqkv);
    ops->free(be->ctx, out);
    ops->free(be->ctx, dout);
    ops->free(be->ctx, lse);
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
    if (argc == 2 && strcmp(argv[1], "wgmma") == 0) {
        // the Hopper forward + backward against FA2 (and ref): correctness shapes first, then the timing
        // shapes
        if (!kiln_cuda_wgmma_attention_available(be.ctx))
            printf("wgmma path not applicable (build KILN_CUDA_ARCHS without 90a, or not an sm_90 device)\n");
        bench_one(&be, 2, 1000, 8, 2, 64, KILN_POS_ROPE);
        bench_one(&be, 2, 777, 6, 3, 128, KILN_POS_ALIBI);
        bench_one(&be, 1, 17, 4, 1, 128, KILN_POS_NONE);
        int bt[][2] = {{32, 1024}, {16, 2048}};
        int hh[][2] = {{16, 64}, {16, 128}};
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                bench_one(&be, bt[i][0], bt[i][1], hh[j][0], hh[j][0], hh[j][1], KILN_POS_NONE);
        bench_one(&be, 8, 1024, 25, 25, 64, KILN_POS_NONE);  // GPT-2 1.5B
        bench_one(&be, 16, 1024, 16, 16, 64, KILN_POS_NONE); // GPT-2 350M
    } else if (argc == 2 && strcmp(argv[1], "pos") == 0) {
        // the cost of RoPE and ALiBi against plain causal attention (issue 5: within 10%)
        int shapes[][4] = {{16, 2048, 16, 128}, {4, 8192, 16, 128}, {16, 2048, 16, 64}, {4, 8192, 16, 64}};
        enum kiln_pos pos[] = {KILN_POS_NONE, KILN_POS_ROPE, KILN_POS_ALIBI};
        for (int i = 0; i < 4; i++)
            for (int p = 0; p < 3; p++)
                bench_one(&be, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][2], shapes[i][3], pos[p]);
    } else if (argc == 5 && strcmp(argv[1], "block") == 0) {
        bench_block(&be, atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    } else if (argc == 5) {
        bench_one(&be, atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[3]), atoi(argv[4]),
                  KILN_POS_NONE);
    } else {
        // correctness first (odd T, GQA, RoPE, ALiBi: each new-vs-ref line must end in "ok")
        bench_one(&be, 2, 1000, 8, 2, 64, KILN_POS_ROPE);
        bench_one(&be, 2, 777, 6, 3, 128, KILN_POS_ALIBI);
        bench_one(&be, 3, 100, 4, 4, 64, KILN_POS_NONE);
        bench_one(&be, 1, 4099, 4, 1, 128, KILN_POS_ROPE);
        bench_one(&be, 2, 129, 6, 2, 64, KILN_POS_ALIBI); // one query past a tile; GQA
        bench_one(&be, 1, 17, 4, 1, 128, KILN_POS_NONE);  // shorter than every tile
        // timings
        int bt[][2] = {{32, 1024}, {16, 2048}, {8, 8192}};
        int hh[][2] = {{12, 64}, {16, 64}, {16, 128}, {12, 128}};
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++)
                bench_one(&be, bt[i][0], bt[i][1], hh[j][0], hh[j][0], hh[j][1], KILN_POS_NONE);
        bench_one(&be, 16, 1024, 16, 16, 128, KILN_POS_ROPE); // RoPE: its cost
        bench_one(&be, 16, 1024, 16, 16, 128, KILN_POS_NONE);
        bench_one(&be, 8, 1024, 16, 16, 128, KILN_POS_NONE); // the 1.3B model's shape
        bench_one(&be, 8, 1024, 25, 25, 64, KILN_POS_NONE);  // GPT-2 1.5B
        bench_one(&be, 16, 1024, 16, 16, 64, KILN_POS_NONE); // GPT-2 350M
    }
    printf("attn_bench: %d of %d checks against ref failed%s\n", n_fail, n_checks,
           n_fail ? " (see CHECK-FAIL lines)" : "");
    kiln_backend_close(&be);
    return n_fail ? 1 : 0;
}
