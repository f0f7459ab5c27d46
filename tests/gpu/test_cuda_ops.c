// Every CUDA op against the CPU reference (ggml test-backend-ops style): fresh random inputs per run, outputs
// poisoned with NaN beforehand (accumulating outputs pre-filled with the same random values on both sides),
// relative error ||gpu - cpu|| / ||cpu|| against per-op tolerances. One line per op, shape and tensor.
//
// Inputs of bf16 tensors are rounded to bf16 before the CPU sees them, so both backends compute on identical
// values and the error measures the kernels only. Tolerances (bf16 outputs carry 2^-9 = 2e-3 relative
// rounding each, and accumulate a few of them):
//   TOL_BF16  1e-2  bf16 outputs of elementwise ops, norms, matmuls, embedding, classifier gradients
//   TOL_ATTN  2e-2  attention output (P is rounded to bf16 before P.V, as in FlashAttention)
//   TOL_ATTNB 4e-2  attention gradients (each backend uses its own forward output and lse)
//   TOL_F32G  5e-3  f32 parameter gradients computed from bf16 inputs (summation order only)
//   TOL_BF16G 1e-2  bf16 parameter gradients (a third backend, opened with grad_dtype = KILN_BF16): the
//                   summation order of TOL_F32G plus one rounding (2^-9) per write
//   TOL_F32   1e-5  f32 optimizer state and master weights; f32 statistics (mean, rstd, lse, losses): 1e-3
// Exit 77 (skipped) without a GPU.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

#include "core/backend.h"
#include "run/knobs.h"

#define TOL_BF16 1e-2
#define TOL_ATTN 2e-2
#define TOL_ATTNB 4e-2
#define TOL_F32G 5e-3
#define TOL_BF16G 1e-2
#define TOL_F32 1e-5
#define TOL_STAT 1e-3

enum kind { ACT, GRAD, F32, I32 };

struct env {
    struct kiln_backend cpu, gpu, gpu_det; // gpu_det: deterministic mode
    struct kiln_backend gpu_bf16g;         // parameter gradients in bf16
    // each kernel knob's value on the GPU backends now (set_kernel; NULL: the default)
    const char *kernel[KILN_KERNEL_COUNT];
    uint64_t rng;
    int failures;
};

// A tensor on both backends plus a host copy of its inputs.
struct pair {
    void *c, *g;
    size_t n;
    enum kind kind;
    enum kiln_dtype dc, dg;
    struct env *e;
    struct kiln_backend *gb; // which GPU backend (gpu, gpu_det or gpu_bf16g)
};

static enum kiln_dtype dtype_of(const struct kiln_backend *b, enum kind k) {
    return k == ACT ? b->act_dtype : k == GRAD ? b->grad_dtype : k == F32 ? KILN_F32 : KILN_I32;
}
static size_t dsize(enum kiln_dtype d) {
    return d == KILN_BF16 ? 2 : 4;
}

static float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return f;
    u += 0x7fffu + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static struct pair pair_new_on(struct env *e, struct kiln_backend *gb, size_t n, enum kind k) {
    struct pair p = {0};
    p.n = n;
    p.kind = k;
    p.e = e;
    p.gb = gb;
    p.dc = dtype_of(&e->cpu, k);
    p.dg = dtype_of(gb, k);
    p.c = e->cpu.ops->alloc(e->cpu.ctx, n * dsize(p.dc) + 16);
    p.g = gb->ops->alloc(gb->ctx, n * dsize(p.dg) + 16);
    if (!p.c || !p.g)
        fail_msg("alloc of %zu elements failed", n);
    return p;
}
static struct pair pair_new(struct env *e, size_t n, enum kind k) {
    return pair_new_on(e, &e->gpu, n, k);
}
static void pair_free(struct pair *p) {
    p->e->cpu.ops->free(p->e->cpu.ctx, p->c);
    p->gb->ops->free(p->gb->ctx, p->g);
    memset(p, 0, sizeof(*p));
}

// Uploads the same values to both sides (rounded to the GPU dtype first, so the CPU sees what the GPU sees).
static void pair_set(struct pair *p, float *h) {
    if (p->dg == KILN_BF16)
        for (size_t i = 0; i < p->n; i++)
            h[i] = bf16_round(h[i]);
    p->e->cpu.ops->upload_f32(p->e->cpu.ctx, p->c, p->dc, h, p->n);
    p->gb->ops->upload_f32(p->gb->ctx, p->g, p->dg, h, p->n);
}
static void pair_randn(struct pair *p, float stddev) {
    float *h = malloc(p->n * sizeof(float) + 4);
    test_fill_normal(h, p->n, stddev, &p->e->rng);
    pair_set(p, h);
    free(h);
}
static void pair_fill(struct pair *p, float v) {
    float *h = malloc(p->n * sizeof(float) + 4);
    for (size_t i = 0; i < p->n; i++)
        h[i] = v;
    pair_set(p, h);
    free(h);
}
static void pair_poison(struct pair *p) {
    pair_fill(p, NAN);
}

// Gradient outputs: poisoned where the op assigns them (an unwritten element fails), random where it adds.
static void grads_prefill(int assign, struct pair *dw, struct pair *db) {
    if (assign) {
        pair_poison(dw);
        pair_poison(db);
    } else {
        pair_randn(dw, 1.0f);
        pair_randn(db, 1.0f);
    }
}

static float *pair_get(struct pair *p, int gpu) {
    float *h = malloc(p->n * sizeof(float) + 4);
    if (gpu)
        p->gb->ops->download_f32(p->gb->ctx, h, p->g, p->dg, p->n);
    else
        p->e->cpu.ops->download_f32(p->e->cpu.ctx, h, p->c, p->dc, p->n);
    return h;
}

// Element `elems` of a pair's tensor on one side (a view into it)
static void *pair_at(struct pair *p, int gpu, size_t elems) {
    return gpu ? (char *)p->g + elems * dsize(p->dg) : (char *)p->c + elems * dsize(p->dc);
}

// Compares GPU against CPU; one line of output; counts a failure.
static double check(struct env *e, const char *op, const char *shape, const char *what, struct pair *p,
                    double tol) {
    float *hc = pair_get(p, 0), *hg = pair_get(p, 1);
    double err = test_rel_err(hg, hc, p->n);
    int ok = err <= tol;
    printf("%-16s %-44s %-8s rel_err %.2e  tol %.0e  %s\n", op, shape, what, err, tol, ok ? "PASS" : "FAIL");
    fflush(stdout);
    if (!ok)
        e->failures++;
    free(hc);
    free(hg);
    return err;
}

static void expect(struct env *e, int cond, const char *op, const char *what) {
    printf("%-16s %-44s %-8s %s\n", op, "", what, cond ? "PASS" : "FAIL");
    if (!cond)
        e->failures++;
}

static void end_test(struct env *e) {
    if (e->failures) {
        int f = e->failures;
        e->failures = 0;
        fail_msg("%d comparison(s) failed (see the FAIL lines above)", f);
    }
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// ---- setup -----------------------------------------------------------------------------------------------

static int setup(void **state) {
    struct env *e = calloc(1, sizeof(*e));
    struct kiln_error err;
    // the kernel knobs from the environment, once (KILN_ATTN=ref test_cuda_ops runs the reference kernels
    // wherever a test does not choose its own); tests switch them with set_kernel
    struct kiln_knobs knobs;
    if (kiln_knobs_read(&knobs, NULL, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return -1;
    }
    for (int k = 0; k < KILN_KERNEL_COUNT; k++)
        e->kernel[k] = knobs.kernel[k] ? kiln_kernel_values[k].values[knobs.kernel[k]] : NULL;
    struct kiln_backend_opts o = {0};
    kiln_knobs_backend_opts(&knobs, &o);
    if (kiln_backend_open("cpu", &o, &e->cpu, &err) || kiln_backend_open("cuda", &o, &e->gpu, &err)) {
        fprintf(stderr, "cannot open backends: %s\n", err.msg);
        return -1;
    }
    o.deterministic = 1;
    if (kiln_backend_open("cuda", &o, &e->gpu_det, &err)) {
        fprintf(stderr, "cannot open the deterministic cuda backend: %s\n", err.msg);
        return -1;
    }
    struct kiln_backend_opts ob = {.grad_dtype = KILN_BF16};
    kiln_knobs_backend_opts(&knobs, &ob);
    if (kiln_backend_open("cuda", &ob, &e->gpu_bf16g, &err) || e->gpu_bf16g.grad_dtype != KILN_BF16) {
        fprintf(stderr, "cannot open the cuda backend with bf16 gradients: %s\n", err.msg);
        return -1;
    }
    e->rng = test_seed();
    printf("device: %s, act %s, grad %s, peak %.0f TFLOP/s, memory %.1f/%.1f GiB free\n", e->gpu.device_name,
           e->gpu.act_dtype == KILN_BF16 ? "bf16" : "f32", e->gpu.grad_dtype == KILN_F32 ? "f32" : "bf16",
           e->gpu.peak_flops / 1e12, e->gpu.mem_free_bytes / 1073741824.0,
           e->gpu.mem_total_bytes / 1073741824.0);
    *state = e;
    return 0;
}

static int teardown(void **state) {
    struct env *e = *state;
    kiln_backend_close(&e->cpu);
    kiln_backend_close(&e->gpu);
    kiln_backend_close(&e->gpu_det);
    kiln_backend_close(&e->gpu_bf16g);
    free(e);
    return 0;
}

#define RUN_ON(e, g, field, args)                                                                            \
    do {                                                                                                     \
        (e)->cpu.ops->field((e)->cpu.ctx, (args##_c));                                                       \
        (g)->ops->field((g)->ctx, (args##_g));                                                               \
        (g)->ops->synchronize((g)->ctx);                                                                     \
    } while (0)
#define RUN(e, field, args) RUN_ON(e, &(e)->gpu, field, args)

// ---- embedding -------------------------------------------------------------------------------------------

static void test_embedding_matches_cpu(void **state) {
    struct env *e = *state;
    // B, T, C, learned; B*T above 4096 exercises the device sort's global merge steps (2048 keys per block)
    int shapes[][4] = {{1, 1, 64, 1},    {2, 7, 72, 1},    {4, 100, 768, 1},
                       {3, 257, 100, 0}, {8, 1000, 64, 1}, {5, 1111, 36, 0}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], learned = shapes[s][3], Vp = 1024;
        char sh[128];
        snprintf(sh, sizeof(sh), "B=%d T=%d C=%d Vp=%d %s", B, T, C, Vp, learned ? "wpe" : "no-wpe");
        struct pair tok = pair_new(e, (size_t)B * T, I32), wte = pair_new(e, (size_t)Vp * C, ACT);
        struct pair wpe = pair_new(e, (size_t)T * C, ACT), out = pair_new(e, (size_t)B * T * C, ACT);
        float *ht = malloc((size_t)B * T * sizeof(float));
        int32_t *hti = malloc((size_t)B * T * sizeof(int32_t));
        for (int i = 0; i < B * T; i++) { // a small id range so that tokens repeat (bucketing matters)
            hti[i] = (int32_t)(test_rand_u64(&e->rng) % (uint64_t)(i % 3 ? 1000 : 17));
            ht[i] = (float)hti[i];
        }
        pair_set(&tok, ht);
        pair_randn(&wte, 1.0f);
        pair_randn(&wpe, 1.0f);
        pair_poison(&out);
        struct kiln_embed_args a_c = {out.c, tok.c, hti, wte.c, learned ? wpe.c : NULL, B, T, C, NULL, 0, 0, 0};
        struct kiln_embed_args a_g = {out.g, tok.g, hti, wte.g, learned ? wpe.g : NULL, B, T, C, NULL, 0, 0, 0};
        RUN(e, embed_forward, &a);
        check(e, "embed_forward", sh, "out", &out, TOL_BF16);

        struct pair dwte = pair_new(e, (size_t)Vp * C, GRAD), dwpe = pair_new(e, (size_t)T * C, GRAD);
        pair_randn(&dwte, 1.0f); // accumulate outputs: same random values on both sides
        pair_randn(&dwpe, 1.0f);
        pair_randn(&out, 1.0f); // reuse as dout
        for (int with_host = 1; with_host >= 0; with_host--) {
            struct kiln_embed_back_args b_c = {
                dwte.c, learned ? dwpe.c : NULL, out.c, tok.c, hti, B, T, C, NULL, 0, 0, 0};
            struct kiln_embed_back_args b_g = {
                dwte.g, learned ? dwpe.g : NULL, out.g, tok.g, with_host ? hti : NULL, B, T, C, NULL, 0, 0, 0};
            RUN(e, embed_backward, &b);
        }
        check(e, "embed_backward", sh, "dwte", &dwte, TOL_F32G);
        if (learned)
            check(e, "embed_backward", sh, "dwpe", &dwpe, TOL_F32G);
        free(ht);
        free(hti);
        pair_free(&tok);
        pair_free(&wte);
        pair_free(&wpe);
        pair_free(&out);
        pair_free(&dwte);
        pair_free(&dwpe);
    }
    end_test(e);
}

// Sequence parallelism's positions: the first pos_split columns read rows of wpe, the rest rows of wpe_hi
// (two runs of one table that do not overlap, as a rank's chunks of the sequence); pos_split 0 and T are one
// run and get no wpe_hi. The backward adds into both runs of dwpe and nowhere else (the table is random
// elsewhere, the same on both sides). C = 36: the scalar path; the others 16-byte vectors.
static void test_embedding_with_split_positions_matches_cpu(void **state) {
    struct env *e = *state;
    int shapes[][4] = {
        {2, 10, 64, 4}, {3, 9, 36, 5}, {2, 8, 64, 0}, {2, 8, 72, 8}, {1, 300, 768, 150}}; // B T C split
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], split = shapes[s][3], Vp = 256,
            maxT = 4 * T;
        int lo = T / 2 + 1,
            hi = 2 * T + 3; // first rows of the two runs: [lo, lo + split), [hi, hi + T - split)
        int two = split > 0 && split < T;
        char sh[128];
        snprintf(sh, sizeof(sh), "B=%d T=%d C=%d pos_split=%d", B, T, C, split);
        struct pair tok = pair_new(e, (size_t)B * T, I32), wte = pair_new(e, (size_t)Vp * C, ACT);
        struct pair wpe = pair_new(e, (size_t)maxT * C, ACT), out = pair_new(e, (size_t)B * T * C, ACT);
        float *ht = malloc((size_t)B * T * sizeof(float));
        int32_t *hti = malloc((size_t)B * T * sizeof(int32_t));
        for (int i = 0; i < B * T; i++) {
            hti[i] = (int32_t)(test_rand_u64(&e->rng) % (uint64_t)Vp);
            ht[i] = (float)hti[i];
        }
        pair_set(&tok, ht);
        pair_randn(&wte, 1.0f);
        pair_randn(&wpe, 1.0f);
        pair_poison(&out);
        struct kiln_embed_args a_c = {out.c,
                                      tok.c,
                                      hti,
                                      wte.c,
                                      pair_at(&wpe, 0, (size_t)lo * C),
                                      B,
                                      T,
                                      C,
                                      two ? pair_at(&wpe, 0, (size_t)hi * C) : NULL,
                                      split,
                                      0,
                                      0};
        struct kiln_embed_args a_g = {out.g,
                                      tok.g,
                                      hti,
                                      wte.g,
                                      pair_at(&wpe, 1, (size_t)lo * C),
                                      B,
                                      T,
                                      C,
                                      two ? pair_at(&wpe, 1, (size_t)hi * C) : NULL,
                                      split,
                                      0,
                                      0};
        RUN(e, embed_forward, &a);
        check(e, "embed_forward", sh, "out", &out, TOL_BF16);

        struct pair dwte = pair_new(e, (size_t)Vp * C, GRAD), dwpe = pair_new(e, (size_t)maxT * C, GRAD);
        pair_randn(&dwte, 1.0f);
        pair_randn(&dwpe, 1.0f);
        pair_randn(&out, 1.0f); // reuse as dout
        float *before = pair_get(&dwpe, 1);
        struct kiln_embed_back_args b_c = {dwte.c,
                                           pair_at(&dwpe, 0, (size_t)lo * C),
                                           out.c,
                                           tok.c,
                                           hti,
                                           B,
                                           T,
                                           C,
                                           two ? pair_at(&dwpe, 0, (size_t)hi * C) : NULL,
                                           split,
                                           0,
                                           0};
        struct kiln_embed_back_args b_g = {dwte.g,
                                           pair_at(&dwpe, 1, (size_t)lo * C),
                                           out.g,
                                           tok.g,
                                           hti,
                                           B,
                                           T,
                                           C,
                                           two ? pair_at(&dwpe, 1, (size_t)hi * C) : NULL,
                                           split,
                                           0,
                                           0};
        RUN(e, embed_backward, &b);
        check(e, "embed_backward", sh, "dwte", &dwte, TOL_F32G);
        check(e, "embed_backward", sh, "dwpe", &dwpe, TOL_F32G);
        // rows outside the runs are bitwise what they were
        float *after = pair_get(&dwpe, 1);
        int n_lo = two ? split : T, n_hi = two ? T - split : 0, same = 1;
        for (int r = 0; r < maxT; r++) {
            int in_run = (r >= lo && r < lo + n_lo) || (r >= hi && r < hi + n_hi);
            if (!in_run && memcmp(before + (size_t)r * C, after + (size_t)r * C, (size_t)C * sizeof(float)))
                same = 0;
        }
        expect(e, same, "embed_backward", "dwpe rows outside the runs untouched");
        free(before);
        free(after);
        free(ht);
        free(hti);
        struct pair *all[] = {&tok, &wte, &wpe, &out, &dwte, &dwpe};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            pair_free(all[i]);
    }
    end_test(e);
}

// ---- norms -----------------------------------------------------------------------------------------------

// QK-norm's use of the norm: rows of C elements inside rows of `stride` (a slice of qkv), backward assigning
// dinp. Elements outside the slice must be left untouched on both backends.
static void test_strided_norms_match_cpu(void **state) {
    struct env *e = *state;
    int shapes[][4] = {
        {37, 128, 384, 0}, {37, 128, 384, 128}, {5, 72, 216, 72}, {64, 64, 192, 128}}; // N C ld off
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int rms = 0; rms <= 1; rms++) {
            int N = shapes[s][0], C = shapes[s][1], ld = shapes[s][2], off = shapes[s][3];
            char sh[128];
            snprintf(sh, sizeof(sh), "N=%d C=%d stride=%d off=%d %s", N, C, ld, off,
                     rms ? "rms" : "layernorm");
            size_t nl = (size_t)N * ld;
            struct pair inp = pair_new(e, nl, ACT), out = pair_new(e, nl, ACT), w = pair_new(e, C, ACT);
            struct pair mean = pair_new(e, N, F32), rstd = pair_new(e, N, F32);
            pair_randn(&inp, 1.5f);
            pair_randn(&out, 1.0f); // the untouched columns keep these values on both sides
            pair_randn(&w, 1.0f);
            size_t eb = 2; // bf16 on the GPU
            struct kiln_norm_args a_c = {.out = (float *)out.c + off,
                                         .mean = rms ? NULL : mean.c,
                                         .rstd = rstd.c,
                                         .inp = (float *)inp.c + off,
                                         .weight = w.c,
                                         .N = N,
                                         .C = C,
                                         .rms = rms,
                                         .eps = 1e-5f,
                                         .stride = ld};
            struct kiln_norm_args a_g = {.out = (char *)out.g + off * eb,
                                         .mean = rms ? NULL : mean.g,
                                         .rstd = rstd.g,
                                         .inp = (char *)inp.g + off * eb,
                                         .weight = w.g,
                                         .N = N,
                                         .C = C,
                                         .rms = rms,
                                         .eps = 1e-5f,
                                         .stride = ld};
            RUN(e, norm_forward, &a);
            check(e, "norm_forward", sh, "out", &out, TOL_BF16);
            check(e, "norm_forward", sh, "rstd", &rstd, TOL_STAT);
            struct pair dout = pair_new(e, nl, ACT), dinp = pair_new(e, nl, ACT), dw = pair_new(e, C, GRAD);
            pair_randn(&dout, 1.0f);
            pair_randn(&dinp, 1.0f); // assigned inside the slice, untouched outside
            pair_fill(&dw, 0.0f);
            struct kiln_norm_back_args b_c = {.dinp = (float *)dinp.c + off,
                                              .dweight = dw.c,
                                              .dout = (float *)dout.c + off,
                                              .inp = (float *)inp.c + off,
                                              .weight = w.c,
                                              .mean = rms ? NULL : mean.c,
                                              .rstd = rstd.c,
                                              .N = N,
                                              .C = C,
                                              .rms = rms,
                                              .stride = ld,
                                              .dinp_assign = 1};
            struct kiln_norm_back_args b_g = {.dinp = (char *)dinp.g + off * eb,
                                              .dweight = dw.g,
                                              .dout = (char *)dout.g + off * eb,
                                              .inp = (char *)inp.g + off * eb,
                                              .weight = w.g,
                                              .mean = rms ? NULL : mean.g,
                                              .rstd = rstd.g,
                                              .N = N,
                                              .C = C,
                                              .rms = rms,
                                              .stride = ld,
                                              .dinp_assign = 1};
            RUN(e, norm_backward, &b);
            check(e, "norm_backward", sh, "dinp", &dinp, TOL_BF16);
            check(e, "norm_backward", sh, "dweight", &dw, TOL_F32G);
            struct pair *all[] = {&inp, &out, &w, &mean, &rstd, &dout, &dinp, &dw};
            for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
                pair_free(all[i]);
        }
    end_test(e);
}

static void test_norms_match_cpu(void **state) {
    struct env *e = *state;
    int shapes[][2] = {{1, 72},    {7, 768},     {100, 72},  {257, 100},
                       {64, 1600}, {4099, 1024}, {513, 512}, {301, 4096}}; // N, C
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int rms = 0; rms <= 1; rms++)
            for (int fused = 0; fused <= 1; fused++) {
                int N = shapes[s][0], C = shapes[s][1];
                char sh[128];
                snprintf(sh, sizeof(sh), "N=%d C=%d %s%s", N, C, rms ? "rms" : "layernorm",
                         fused ? " +residual" : "");
                size_t nc = (size_t)N * C;
                struct pair inp = pair_new(e, nc, ACT), res = pair_new(e, nc, ACT),
                            res_out = pair_new(e, nc, ACT);
                struct pair out = pair_new(e, nc, ACT), w = pair_new(e, C, ACT), bias = pair_new(e, C, ACT);
                struct pair mean = pair_new(e, N, F32), rstd = pair_new(e, N, F32);
                pair_randn(&inp, 1.0f);
                pair_randn(&res, 2.0f);
                pair_randn(&w, 1.0f);
                pair_randn(&bias, 0.5f);
                pair_poison(&out);
                pair_poison(&res_out);
                pair_poison(&mean);
                pair_poison(&rstd);
                struct kiln_norm_args a_c = {out.c,  rms ? NULL : mean.c,
                                             rstd.c, fused ? res_out.c : NULL,
                                             inp.c,  fused ? res.c : NULL,
                                             w.c,    rms ? NULL : bias.c,
                                             N,      C,
                                             rms,    1e-5f,
                                             0};
                struct kiln_norm_args a_g = {out.g,  rms ? NULL : mean.g,
                                             rstd.g, fused ? res_out.g : NULL,
                                             inp.g,  fused ? res.g : NULL,
                                             w.g,    rms ? NULL : bias.g,
                                             N,      C,
                                             rms,    1e-5f,
                                             0};
                RUN(e, norm_forward, &a);
                check(e, "norm_forward", sh, "out", &out, TOL_BF16);
                if (!fused) {
                    if (!rms)
                        check(e, "norm_forward", sh, "mean", &mean, TOL_STAT);
                    check(e, "norm_forward", sh, "rstd", &rstd, TOL_STAT);
                } else {
                    // With the residual fused, the CUDA op normalizes the bf16-rounded sum it stores (so that
                    // recompute from res_out reproduces it), the CPU the exact f32 sum. Against the CPU the
                    // statistics then differ by the rounding of x, which a near-zero mean amplifies without
                    // bound in relative terms; so the statistics are checked exactly against the stored x.
                    check(e, "norm_forward", sh, "res_out", &res_out, TOL_BF16);
                    float *x = pair_get(&res_out, 1), *mg = pair_get(&mean, 1), *rg = pair_get(&rstd, 1);
                    float *mref = malloc(N * sizeof(float)), *rref = malloc(N * sizeof(float));
                    for (int r = 0; r < N; r++) {
                        double m = 0, v = 0;
                        for (int j = 0; j < C; j++)
                            m += x[(size_t)r * C + j];
                        m = rms ? 0.0 : m / C;
                        for (int j = 0; j < C; j++)
                            v += (x[(size_t)r * C + j] - m) * (x[(size_t)r * C + j] - m);
                        mref[r] = (float)m;
                        rref[r] = (float)(1.0 / sqrt(v / C + 1e-5));
                    }
                    // the mean's error in units of the row's standard deviation (the mean itself may be ~0):
                    // 1e-5 is ~100 f32 roundings, far below the bf16 rounding of x (4e-3) a wrong x would
                    // show
                    double em = 0;
                    for (int r = 0; r < N && !rms; r++) {
                        double d = fabs((double)mg[r] - mref[r]) * rref[r];
                        em = d > em ? d : em;
                    }
                    double er = test_rel_err(rg, rref, N);
                    int ok = em <= 1e-5 && er <= TOL_STAT;
                    printf(
                        "%-16s %-44s %-8s mean err/std %.2e (tol 1e-05), rstd rel_err %.2e (tol %.0e)  %s\n",
                        "norm_forward", sh, "stats/x", em, er, TOL_STAT, ok ? "PASS" : "FAIL");
                    if (!ok)
                        e->failures++;
                    free(x);
                    free(mg);
                    free(rg);
                    free(mref);
                    free(rref);
                }

                struct pair dinp = pair_new(e, nc, ACT), dw = pair_new(e, C, GRAD), db = pair_new(e, C, GRAD);
                struct pair rb0 = pair_new(e, C, GRAD), rb1 = pair_new(e, C, GRAD); // residual-stream biases
                pair_randn(&dinp, 1.0f);                                            // += outputs
                int gassign = fused; // dweight, dbias assigned or added to
                grads_prefill(gassign, &dw, &db);
                grads_prefill(gassign, &rb0, &rb1);
                pair_randn(&out, 1.0f); // dout
                struct pair *x = fused ? &res_out : &inp;
                // both residual-bias outputs with LayerNorm, the first alone with RMSNorm
                struct kiln_norm_back_args b_c = {dinp.c,
                                                  dw.c,
                                                  rms ? NULL : db.c,
                                                  out.c,
                                                  x->c,
                                                  w.c,
                                                  rms ? NULL : mean.c,
                                                  rstd.c,
                                                  N,
                                                  C,
                                                  rms,
                                                  0,
                                                  0,
                                                  gassign,
                                                  {rb0.c, rms ? NULL : rb1.c}};
                struct kiln_norm_back_args b_g = {dinp.g,
                                                  dw.g,
                                                  rms ? NULL : db.g,
                                                  out.g,
                                                  x->g,
                                                  w.g,
                                                  rms ? NULL : mean.g,
                                                  rstd.g,
                                                  N,
                                                  C,
                                                  rms,
                                                  0,
                                                  0,
                                                  gassign,
                                                  {rb0.g, rms ? NULL : rb1.g}};
                RUN(e, norm_backward, &b);
                check(e, "norm_backward", sh, "dinp", &dinp, TOL_BF16);
                check(e, "norm_backward", sh, "dweight", &dw, TOL_F32G);
                if (!rms)
                    check(e, "norm_backward", sh, "dbias", &db, TOL_F32G);
                check(e, "norm_backward", sh, "dres_bias0", &rb0, TOL_F32G);
                if (!rms)
                    check(e, "norm_backward", sh, "dres_bias1", &rb1, TOL_F32G);
                struct pair *all[] = {&inp,  &res,  &res_out, &out, &w,   &bias, &mean,
                                      &rstd, &dinp, &dw,      &db,  &rb0, &rb1};
                for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
                    pair_free(all[i]);
            }
    end_test(e);
}

// ---- matmul ----------------------------------------------------------------------------------------------

static void test_matmul_matches_cpu(void **state) {
    struct env *e = *state;
    int shapes[][3] = {
        {1, 72, 72}, {7, 64, 200}, {100, 72, 288}, {257, 768, 2304}, {33, 100, 36}}; // N, IC, OC
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int variant = 0; variant < 4; variant++) { // 0 plain, 1 bias, 2 bias+gelu, 3 accumulate+bias
            int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
            int has_bias = variant >= 1, gelu = variant == 2, acc = variant == 3;
            char sh[128];
            snprintf(sh, sizeof(sh), "N=%d IC=%d OC=%d %s", N, IC, OC,
                     variant == 0   ? "plain"
                     : variant == 1 ? "bias"
                     : variant == 2 ? "bias+gelu"
                                    : "acc+bias");
            struct pair inp = pair_new(e, (size_t)N * IC, ACT), w = pair_new(e, (size_t)OC * IC, ACT);
            struct pair bias = pair_new(e, OC, ACT), out = pair_new(e, (size_t)N * OC, ACT);
            struct pair pre = pair_new(e, (size_t)N * OC, ACT);
            pair_randn(&inp, 1.0f);
            pair_randn(&w, 1.0f / sqrtf((float)IC));
            pair_randn(&bias, 0.5f);
            if (acc)
                pair_randn(&out, 1.0f);
            else
                pair_poison(&out);
            pair_poison(&pre);
            struct kiln_matmul_args a_c = {out.c,
                                           gelu ? pre.c : NULL,
                                           inp.c,
                                           w.c,
                                           has_bias ? bias.c : NULL,
                                           N,
                                           IC,
                                           OC,
                                           gelu ? KILN_ACT_GELU : KILN_ACT_NONE,
                                           acc,
                                           0};
            struct kiln_matmul_args a_g = {out.g,
                                           gelu ? pre.g : NULL,
                                           inp.g,
                                           w.g,
                                           has_bias ? bias.g : NULL,
                                           N,
                                           IC,
                                           OC,
                                           gelu ? KILN_ACT_GELU : KILN_ACT_NONE,
                                           acc,
                                           0};
            RUN(e, matmul_forward, &a);
            check(e, "matmul_forward", sh, "out", &out, TOL_BF16);
            if (gelu)
                check(e, "matmul_forward", sh, "pre", &pre, TOL_BF16);

            // backward: variant picks dinp mode: 0 overwrite, 1 accumulate, 2 gelu (pre of a previous layer),
            // 3 gelu + accumulate
            struct pair dinp = pair_new(e, (size_t)N * IC, ACT), dw = pair_new(e, (size_t)OC * IC, GRAD);
            struct pair db = pair_new(e, OC, GRAD), gpre = pair_new(e, (size_t)N * IC, ACT);
            int dacc = variant == 1 || variant == 3, dgelu = variant >= 2;
            if (dacc)
                pair_randn(&dinp, 1.0f);
            else
                pair_poison(&dinp);
            int gassign = variant == 0 || variant == 2; // dweight, dbias assigned or added to
            grads_prefill(gassign, &dw, &db);
            pair_randn(&gpre, 1.5f);
            pair_randn(&out, 1.0f); // dout
            struct kiln_matmul_back_args b_c = {dinp.c,
                                                dw.c,
                                                has_bias ? db.c : NULL,
                                                out.c,
                                                inp.c,
                                                w.c,
                                                dgelu ? gpre.c : NULL,
                                                N,
                                                IC,
                                                OC,
                                                dacc,
                                                gassign,
                                                0,
                                                0,
                                                0};
            struct kiln_matmul_back_args b_g = {dinp.g,
                                                dw.g,
                                                has_bias ? db.g : NULL,
                                                out.g,
                                                inp.g,
                                                w.g,
                                                dgelu ? gpre.g : NULL,
                                                N,
                                                IC,
                                                OC,
                                                dacc,
                                                gassign,
                                                0,
                                                0,
                                                0};
            RUN(e, matmul_backward, &b);
            char sh2[160];
            snprintf(sh2, sizeof(sh2), "N=%d IC=%d OC=%d dinp%s%s dW%s", N, IC, OC, dacc ? "+=" : "=",
                     dgelu ? "*gelu'" : "", gassign ? "=" : "+=");
            check(e, "matmul_backward", sh2, "dinp", &dinp, TOL_BF16);
            check(e, "matmul_backward", sh2, "dweight", &dw, TOL_F32G);
            if (has_bias)
                check(e, "matmul_backward", sh2, "dbias", &db, TOL_F32G);
            struct pair *all[] = {&inp, &w, &bias, &out, &pre, &dinp, &dw, &db, &gpre};
            for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
                pair_free(all[i]);
        }
    end_test(e);
}

// ---- attention -------------------------------------------------------------------------------------------

static const char *pos_name(enum kiln_pos p) {
    return p == KILN_POS_ROPE    ? "rope"
           : p == KILN_POS_ALIBI ? "alibi"
           : p == KILN_POS_NONE  ? "none"
                                 : "learned";
}

// Switches a kernel knob (KILN_ATTN, KILN_WGMMA_DQ, ...) on every GPU backend of the test at once, as
// setting the environment variable did when the kernels read it on each call (kiln_cuda_set_kernel); value
// NULL: its default. Returns the value it had (NULL: the default), for a later set_kernel to put back.
static const char *set_kernel(struct env *e, const char *knob, const char *value) {
    int which, index;
    if (kiln_kernel_lookup(knob, value, &which, &index))
        fail_msg("%s=%s: not a kernel knob and one of its values", knob, value ? value : "");
    struct kiln_backend *g[3] = {&e->gpu, &e->gpu_det, &e->gpu_bf16g};
    for (int i = 0; i < 3; i++)
        if (kiln_cuda_set_kernel(g[i]->ctx, knob, value))
            fail_msg("kiln_cuda_set_kernel(%s, %s) refused", knob, value ? value : "NULL");
    const char *was = e->kernel[which];
    e->kernel[which] = index ? kiln_kernel_values[which].values[index] : NULL;
    return was;
}

// Forward and backward on g against the CPU. bwd_path: NULL runs both under the current KILN_ATTN; otherwise
// the backward calls run with KILN_ATTN=bwd_path ("" for the default), the forward with the current setting.
// The backward runs twice on g: in deterministic mode the two results must be bitwise identical; in the
// default mode (dQ summed with atomics in arrival order) they must agree to rounding (rel_err 1e-2), which a
// missing barrier or a race would not.
static void attention_case_paths(struct env *e, struct kiln_backend *g, const char *bwd_path, int B, int T,
                                 int NH, int NKV, int HS, enum kiln_pos pos) {
    char sh[128];
    snprintf(sh, sizeof(sh), "B=%d T=%d NH=%d NKV=%d HS=%d %s", B, T, NH, NKV, HS, pos_name(pos));
    size_t W = (size_t)(NH + 2 * NKV) * HS, n_qkv = (size_t)B * T * W, n_out = (size_t)B * T * NH * HS;
    struct pair qkv = pair_new_on(e, g, n_qkv, ACT), out = pair_new_on(e, g, n_out, ACT),
                lse = pair_new_on(e, g, (size_t)B * NH * T, F32);
    pair_randn(&qkv, 1.0f);
    pair_poison(&out);
    pair_poison(&lse);
    struct kiln_attn_args a_c = {out.c, lse.c, qkv.c, B, T, NH, NKV, HS, pos, 10000.0f, 0};
    struct kiln_attn_args a_g = {out.g, lse.g, qkv.g, B, T, NH, NKV, HS, pos, 10000.0f, 0};
    double t0 = now_ms();
    g->ops->attention_forward(g->ctx, &a_g);
    g->ops->synchronize(g->ctx);
    double t_fwd = now_ms() - t0;
    e->cpu.ops->attention_forward(e->cpu.ctx, &a_c);
    check(e, "attention_fwd", sh, "out", &out, TOL_ATTN);
    check(e, "attention_fwd", sh, "lse", &lse, TOL_STAT);

    struct pair dout = pair_new_on(e, g, n_out, ACT), dqkv = pair_new_on(e, g, n_qkv, ACT);
    pair_randn(&dout, 1.0f);
    pair_poison(&dqkv);
    struct kiln_attn_back_args b_c = {dqkv.c, dout.c, qkv.c, out.c, lse.c,    B, T,
                                      NH,     NKV,    HS,    pos,   10000.0f, 0, 0};
    struct kiln_attn_back_args b_g = {dqkv.g, dout.g, qkv.g, out.g, lse.g,    B, T,
                                      NH,     NKV,    HS,    pos,   10000.0f, 0, 0};
    const char *fwd_path = bwd_path ? set_kernel(e, "KILN_ATTN", bwd_path[0] ? bwd_path : NULL) : NULL;
    t0 = now_ms();
    g->ops->attention_backward(g->ctx, &b_g);
    g->ops->synchronize(g->ctx);
    double t_bwd = now_ms() - t0;
    e->cpu.ops->attention_backward(e->cpu.ctx, &b_c);
    // q, k and v gradients separately: a wrong k or v slot must not hide behind a right q
    float *hc = pair_get(&dqkv, 0), *hg = pair_get(&dqkv, 1);
    const char *names[3] = {"dq", "dk", "dv"};
    size_t off[4] = {0, (size_t)NH * HS, (size_t)(NH + NKV) * HS, W};
    for (int part = 0; part < 3; part++) {
        size_t w = off[part + 1] - off[part], n = (size_t)B * T * w, k = 0;
        float *xc = malloc(n * sizeof(float)), *xg = malloc(n * sizeof(float));
        for (size_t r = 0; r < (size_t)B * T; r++)
            for (size_t i = 0; i < w; i++, k++) {
                xc[k] = hc[r * W + off[part] + i];
                xg[k] = hg[r * W + off[part] + i];
            }
        double err = test_rel_err(xg, xc, n);
        int ok = err <= TOL_ATTNB;
        printf("%-16s %-44s %-8s rel_err %.2e  tol %.0e  %s\n", "attention_bwd", sh, names[part], err,
               TOL_ATTNB, ok ? "PASS" : "FAIL");
        if (!ok)
            e->failures++;
        free(xc);
        free(xg);
    }
    printf("%-16s %-44s gpu fwd %.3f ms, bwd %.3f ms (one call, host clock)\n", "attention_time", sh, t_fwd,
           t_bwd);
    // second backward run on g (dqkv poisoned again: every element must be rewritten)
    {
        size_t bytes = n_qkv * dsize(dqkv.dg);
        void *first = malloc(bytes), *second = malloc(bytes);
        g->ops->download(g->ctx, first, dqkv.g, bytes);
        pair_poison(&dqkv);
        g->ops->attention_backward(g->ctx, &b_g);
        g->ops->synchronize(g->ctx);
        g->ops->download(g->ctx, second, dqkv.g, bytes);
        float *h2 = pair_get(&dqkv, 1);
        double err = test_rel_err(h2, hg, n_qkv);
        int det = g == &e->gpu_det, ok = det ? memcmp(first, second, bytes) == 0 : err <= 1e-2;
        printf("%-16s %-44s %-8s rel_err %.2e  %s  %s\n", "attention_bwd", sh, "repeat", err,
               det ? "bitwise" : "tol 1e-02", ok ? "PASS" : "FAIL");
        if (!ok)
            e->failures++;
        free(first);
        free(second);
        free(h2);
    }
    if (bwd_path)
        set_kernel(e, "KILN_ATTN", fwd_path);
    free(hc);
    free(hg);
    pair_free(&qkv);
    pair_free(&out);
    pair_free(&lse);
    pair_free(&dout);
    pair_free(&dqkv);
}

static void attention_case_on(struct env *e, struct kiln_backend *g, int B, int T, int NH, int NKV, int HS,
                              enum kiln_pos pos) {
    attention_case_paths(e, g, NULL, B, T, NH, NKV, HS, pos);
}

static void attention_case(struct env *e, int B, int T, int NH, int NKV, int HS, enum kiln_pos pos) {
    attention_case_on(e, &e->gpu, B, T, NH, NKV, HS, pos);
}

static void test_attention_matches_cpu(void **state) {
    struct env *e = *state;
    attention_case(e, 1, 1, 4, 4, 64, KILN_POS_LEARNED);
    attention_case(e, 2, 7, 4, 2, 64, KILN_POS_ROPE);
    attention_case(e, 2, 100, 4, 1, 128, KILN_POS_ALIBI);
    attention_case(e, 1, 257, 6, 2, 64, KILN_POS_ROPE);
    attention_case(e, 2, 257, 3, 3, 128, KILN_POS_NONE);
    attention_case(e, 1, 128, 12, 12, 64, KILN_POS_ALIBI); // exact tiles, NH not a power of two
    attention_case(e, 1, 100, 4, 2, 32, KILN_POS_ROPE);    // FA2 kernels at HS 32 (shakespeare-char's)
    attention_case(e, 2, 128, 4, 4, 32, KILN_POS_LEARNED); // the same, exact tiles
    attention_case(e, 1, 100, 4, 2, 16, KILN_POS_ROPE);    // simple path
    attention_case(e, 2, 65, 6, 3, 80, KILN_POS_ALIBI);    // FA2 at HS 80, non-power-of-two ALiBi
    attention_case(e, 1, 200, 4, 2, 48, KILN_POS_ROPE);    // FA2 at HS 48
    attention_case(e, 2, 150, 4, 4, 96, KILN_POS_ROPE);    // FA2 at HS 96
    attention_case(e, 1, 70, 2, 2, 40, KILN_POS_ALIBI);    // simple path (HS not a multiple of 16)
    attention_case(e, 1, 300, 8, 8, 128, KILN_POS_ROPE);
    attention_case(e, 1, 1100, 4, 2, 64, KILN_POS_ALIBI); // many key tiles: the double-buffered pipeline
    end_test(e);
}

// Each attention path against the CPU: the reference kernels (KILN_ATTN=ref), both tile variants of the FA2
// kernels (KILN_ATTN=fa2, KILN_FA_VARIANT) and the default selection (on an sm_90a build and device: the
// Hopper kernels), at the tile edges of each: T one past a 128-query block, T short of the 16/32/64-query
// tiles of dK/dV, exact 64-tiles, GQA, RoPE, ALiBi.
static void test_attention_paths_match_cpu(void **state) {
    struct env *e = *state;
    const char *attn[4] = {"ref", "fa2", "fa2", NULL}, *variant[4] = {"0", "0", "1", "0"};
    for (int k = 0; k < 4; k++) {
        if (attn[k])
            set_kernel(e, "KILN_ATTN", attn[k]);
        else
            set_kernel(e, "KILN_ATTN", NULL);
        set_kernel(e, "KILN_FA_VARIANT", variant[k]);
        printf("attention path: %s, variant %s\n", attn[k] ? attn[k] : "default", variant[k]);
        attention_case(e, 2, 129, 4, 1, 64, KILN_POS_ROPE);
        attention_case(e, 1, 33, 2, 2, 128, KILN_POS_ALIBI);
        attention_case(e, 1, 500, 4, 2, 128, KILN_POS_ROPE);
        attention_case(e, 2, 192, 3, 1, 64, KILN_POS_NONE);
        attention_case(e, 1, 17, 2, 1, 64, KILN_POS_ALIBI);
        attention_case(e, 2, 129, 4, 2, 32, KILN_POS_ROPE);
        attention_case(e, 1, 300, 3, 3, 32, KILN_POS_ALIBI);
        attention_case(e, 2, 129, 4, 2, 48, KILN_POS_NONE);
        attention_case(e, 1, 257, 6, 2, 80, KILN_POS_ROPE);
        attention_case(e, 1, 300, 4, 1, 96, KILN_POS_ALIBI);
    }
    set_kernel(e, "KILN_ATTN", NULL);
    set_kernel(e, "KILN_FA_VARIANT", NULL);
    end_test(e);
}

// FA2's backward (KILN_ATTN=fa2) in both modes against the CPU, both tile variants: default
// (cuda_ctx.deterministic == 0: single pass, dQ by atomics into f32) and deterministic (two kernels, dQ
// recomputed). T below one tile (17),
// one past the 128-key/64-query tiles (129), not a multiple of any tile (500); GQA groups of 1, 3 and 4;
// RoPE, ALiBi, none; HS 32, 48, 64, 80, 96 and 128; the single pass's third variant (KILN_FA_VARIANT=2) too.
static void test_attention_backward_modes_match_cpu(void **state) {
    struct env *e = *state;
    struct kiln_backend *g[2] = {&e->gpu, &e->gpu_det};
    const char *variant[3] = {"0", "1", "2"};
    set_kernel(e, "KILN_ATTN", "fa2");
    for (int m = 0; m < 2; m++)
        for (int v = 0; v < (m ? 2 : 3); v++) {
            set_kernel(e, "KILN_FA_VARIANT", variant[v]);
            printf("attention backward: %s mode, variant %s\n", m ? "deterministic" : "default", variant[v]);
            attention_case_on(e, g[m], 1, 17, 4, 1, 64, KILN_POS_ALIBI);
            attention_case_on(e, g[m], 1, 17, 2, 2, 128, KILN_POS_ROPE);
            attention_case_on(e, g[m], 2, 129, 6, 2, 64, KILN_POS_ROPE);
            attention_case_on(e, g[m], 2, 129, 4, 4, 128, KILN_POS_NONE);
            attention_case_on(e, g[m], 1, 500, 8, 2, 64, KILN_POS_NONE);
            attention_case_on(e, g[m], 1, 500, 6, 2, 128, KILN_POS_ROPE);
            attention_case_on(e, g[m], 2, 500, 12, 3, 64, KILN_POS_ALIBI); // NH not a power of two
            attention_case_on(e, g[m], 1, 129, 4, 1, 128, KILN_POS_ALIBI);
            attention_case_on(e, g[m], 1, 17, 4, 2, 32, KILN_POS_ROPE);
            attention_case_on(e, g[m], 2, 129, 4, 4, 32, KILN_POS_NONE);
            attention_case_on(e, g[m], 1, 500, 6, 2, 32, KILN_POS_ALIBI);
            attention_case_on(e, g[m], 2, 129, 4, 2, 48, KILN_POS_ROPE);
            attention_case_on(e, g[m], 1, 500, 4, 4, 80, KILN_POS_ALIBI);
            attention_case_on(e, g[m], 1, 300, 6, 3, 96, KILN_POS_ROPE);
        }
    set_kernel(e, "KILN_ATTN", NULL);
    set_kernel(e, "KILN_FA_VARIANT", NULL);
    end_test(e);
}

// ---- column slices (the parallel block's fused projection)
// -------------------------------------------------

// A (rows, ld) host array: normal(0, 1) in columns [off, off + w), NaN elsewhere (NaN read anywhere would
// reach the outputs; NaN still there afterwards shows nothing was written).
static float *slice_host(struct env *e, size_t rows, int w, int ld, int off, int fill) {
    float *h = malloc(rows * ld * sizeof(float) + 4);
    for (size_t i = 0; i < rows * ld; i++)
        h[i] = NAN;
    if (fill)
        for (size_t r = 0; r < rows; r++)
            test_fill_normal(h + r * ld + off, (size_t)w, 1.0f, &e->rng);
    return h;
}

// Compares columns [off, off + w) of (rows, ld) GPU and CPU tensors; on the GPU every other column must still
// be NaN.
static void check_slice(struct env *e, const char *op, const char *shape, const char *what, struct pair *p,
                        size_t rows, int w, int ld, int off, double tol) {
    float *hc = pair_get(p, 0), *hg = pair_get(p, 1);
    float *xc = malloc(rows * w * sizeof(float) + 4), *xg = malloc(rows * w * sizeof(float) + 4);
    size_t written = 0;
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < ld; i++) {
            float c = hc[r * ld + i], g = hg[r * ld + i];
            if (i >= off && i < off + w) {
                xc[r * w + i - off] = c;
                xg[r * w + i - off] = g;
            } else if (!isnan(g)) {
                written++;
            }
        }
    double err = test_rel_err(xg, xc, rows * w);
    int ok = err <= tol && written == 0;
    printf("%-16s %-44s %-8s rel_err %.2e  tol %.0e  outside written %zu  %s\n", op, shape, what, err, tol,
           written, ok ? "PASS" : "FAIL");
    fflush(stdout);
    if (!ok)
        e->failures++;
    free(hc), free(hg), free(xc), free(xg);
}

// Attention on qkv rows that are the first W columns of rows ld wide, dqkv into rows dld wide, decode on the
// same rows: GPU backend g (its mode, and the kernel family the environment selects) against the CPU.
static void strided_attention_case(struct env *e, struct kiln_backend *g, int B, int T, int NH, int NKV,
                                   int HS, enum kiln_pos pos, int ld, int dld) {
    char sh[128];
    snprintf(sh, sizeof(sh), "B=%d T=%d NH=%d NKV=%d HS=%d %s ld=%d/%d", B, T, NH, NKV, HS, pos_name(pos), ld,
             dld);
    size_t BT = (size_t)B * T, n_out = BT * NH * HS;
    int W = (NH + 2 * NKV) * HS;
    struct pair qkv = pair_new_on(e, g, BT * ld, ACT), out = pair_new_on(e, g, n_out, ACT),
                lse = pair_new_on(e, g, (size_t)B * NH * T, F32);
    float *h = slice_host(e, BT, W, ld, 0, 1);
    pair_set(&qkv, h);
    free(h);
    pair_poison(&out);
    pair_poison(&lse);
    struct kiln_attn_args a_c = {out.c, lse.c, qkv.c, B, T, NH, NKV, HS, pos, 10000.0f, ld};
    struct kiln_attn_args a_g = {out.g, lse.g, qkv.g, B, T, NH, NKV, HS, pos, 10000.0f, ld};
    e->cpu.ops->attention_forward(e->cpu.ctx, &a_c);
    g->ops->attention_forward(g->ctx, &a_g);
    check(e, "attention_fwd", sh, "out", &out, TOL_ATTN);
    check(e, "attention_fwd", sh, "lse", &lse, TOL_STAT);
    struct pair dout = pair_new_on(e, g, n_out, ACT), dqkv = pair_new_on(e, g, BT * dld, ACT);
    pair_randn(&dout, 1.0f);
    pair_poison(&dqkv);
    struct kiln_attn_back_args b_c = {dqkv.c, dout.c, qkv.c, out.c, lse.c,    B,  T,
                                      NH,     NKV,    HS,    pos,   10000.0f, ld, dld};
    struct kiln_attn_back_args b_g = {dqkv.g, dout.g, qkv.g, out.g, lse.g,    B,  T,
                                      NH,     NKV,    HS,    pos,   10000.0f, ld, dld};
    e->cpu.ops->attention_backward(e->cpu.ctx, &b_c);
    g->ops->attention_backward(g->ctx, &b_g);
    check_slice(e, "attention_bwd", sh, "dqkv", &dqkv, BT, W, dld, 0, TOL_ATTNB);
    // decode: position T - 1 of B sequences whose new tokens' qkv are the first B rows
    int KW = NKV * HS;
    struct pair kc = pair_new_on(e, g, (size_t)B * T * KW, ACT),
                vc = pair_new_on(e, g, (size_t)B * T * KW, ACT),
                dec = pair_new_on(e, g, (size_t)B * NH * HS, ACT);
    pair_randn(&kc, 1.0f);
    pair_randn(&vc, 1.0f);
    pair_poison(&dec);
    struct kiln_attn_decode_args d_c = {dec.c, kc.c, vc.c, qkv.c, B,        T, T - 1,
                                        NH,    NKV,  HS,   pos,   10000.0f, ld};
    struct kiln_attn_decode_args d_g = {dec.g, kc.g, vc.g, qkv.g, B,        T, T - 1,
                                        NH,    NKV,  HS,   pos,   10000.0f, ld};
    e->cpu.ops->attention_decode(e->cpu.ctx, &d_c);
    g->ops->attention_decode(g->ctx, &d_g);
    check(e, "attention_decode", sh, "out", &dec, TOL_ATTN);
    check(e, "attention_decode", sh, "kcache", &kc, TOL_BF16);
    check(e, "attention_decode", sh, "vcache", &vc, TOL_BF16);
    struct pair *all[] = {&qkv, &out, &lse, &dout, &dqkv, &kc, &vc, &dec};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        pair_free(all[i]);
}

// Row strides as the parallel block uses them (QKV + FCO, multiples of 8: the tiled kernels) and odd ones
// (the warp-per-row kernels take over), on the default kernels in both backward modes, on KILN_ATTN=fa2 and
// on KILN_ATTN=ref.
static void test_strided_attention_matches_cpu(void **state) {
    struct env *e = *state;
    const char *attn[3] = {NULL, "fa2", "ref"};
    for (int k = 0; k < 3; k++) {
        if (attn[k])
            set_kernel(e, "KILN_ATTN", attn[k]);
        else
            set_kernel(e, "KILN_ATTN", NULL);
        printf("strided attention: %s kernels\n", attn[k] ? attn[k] : "default");
        strided_attention_case(e, &e->gpu, 2, 129, 4, 1, 64, KILN_POS_ROPE, 384 + 1024, 384 + 1024);
        strided_attention_case(e, &e->gpu, 1, 100, 2, 2, 128, KILN_POS_ALIBI, 768 + 256, 768 + 512);
        strided_attention_case(e, &e->gpu, 2, 65, 4, 2, 64, KILN_POS_NONE, 512 + 7, 512 + 3);   // odd strides
        strided_attention_case(e, &e->gpu, 1, 33, 4, 2, 32, KILN_POS_ROPE, 256 + 16, 256 + 16); // simple path
    }
    set_kernel(e, "KILN_ATTN", NULL);
    printf("strided attention: deterministic mode (two-kernel backward)\n");
    strided_attention_case(e, &e->gpu_det, 2, 129, 6, 2, 64, KILN_POS_ROPE, 640 + 1024, 640 + 1024);
    strided_attention_case(e, &e->gpu_det, 1, 100, 2, 1, 128, KILN_POS_ALIBI, 512 + 256, 512 + 256);
    end_test(e);
}

// The Hopper forward (KILN_ATTN=wgmma: attention_wgmma.cu, wgmma + TMA) against the CPU where it applies (a
// build for sm_90a and an sm_90 device), skipped otherwise. Outputs poisoned first; T below one 128-row tile
// (17), one past it (129), many key tiles through the 2-stage ring (1024); HS 64 and 128; GQA groups of 1 to
// 4; RoPE, ALiBi (NH not a power of two), none. The backward (wgmma too, under the same KILN_ATTN) runs on
// the wgmma forward's output and lse: end to end; test_attention_wgmma_backward_matches_cpu takes the
// backward alone. Strided rows: a multiple of 8 (wgmma) and odd (falls back).
static void test_attention_wgmma_matches_cpu(void **state) {
    struct env *e = *state;
    if (!kiln_cuda_wgmma_attention_available(e->gpu.ctx)) {
        printf(
            "attention wgmma: not applicable here (needs a build with KILN_CUDA_ARCHS containing 90a and an "
            "sm_90 device): skipped\n");
        skip(); // reported as skipped, not passed
    }
    set_kernel(e, "KILN_ATTN", "wgmma");
    // the forward both ways (KILN_WGMMA_FWD): each consumer on its own, and in turns (the default)
    for (int pp = 0; pp < 2; pp++) {
        set_kernel(e, "KILN_WGMMA_FWD", pp ? "pingpong" : "overlap");
        printf("attention path: wgmma, forward %s\n",
               pp ? "ping-pong (KILN_WGMMA_FWD=pingpong, the default)" : "overlap");
        attention_case(e, 1, 17, 4, 1, 64, KILN_POS_ALIBI);
        attention_case(e, 1, 17, 2, 2, 128, KILN_POS_ROPE);
        attention_case(e, 2, 129, 6, 2, 64, KILN_POS_ROPE);
        attention_case(e, 2, 129, 4, 4, 128, KILN_POS_ALIBI);
        attention_case(e, 1, 1024, 4, 2, 64, KILN_POS_NONE);
        attention_case(e, 1, 1024, 4, 1, 128, KILN_POS_ROPE);
        attention_case(e, 1, 1024, 6, 3, 64, KILN_POS_ALIBI);
        attention_case(e, 1, 1024, 2, 2, 128, KILN_POS_ALIBI);
        attention_case(e, 1, 300, 8, 2, 128, KILN_POS_NONE);
        strided_attention_case(e, &e->gpu, 2, 129, 4, 1, 64, KILN_POS_ROPE, 384 + 1024, 384 + 1024);
        strided_attention_case(e, &e->gpu, 1, 100, 2, 2, 128, KILN_POS_ALIBI, 768 + 256, 768 + 512);
        strided_attention_case(e, &e->gpu, 2, 65, 4, 2, 64, KILN_POS_NONE, 512 + 7, 512 + 3); // FA2 fallback
    }
    set_kernel(e, "KILN_WGMMA_FWD", NULL);
    set_kernel(e, "KILN_ATTN", NULL);
    end_test(e);
}

// The Hopper backward (KILN_ATTN=wgmma for attention_backward: attention_wgmma.cu's wg_bwd_kernel, wgmma +
// TMA) alone against the CPU, where it applies (skipped otherwise): the forward is FA2's (KILN_ATTN=fa2),
// so a wrong wgmma forward cannot pass for a wrong backward, or the reverse. Same shapes as the forward's
// test: T below one 128-key block (17), one past it (129: the second block's second consumer has no keys <
// T), many query tiles through the 2-stage ring (300, 1024); HS 64 and 128; GQA groups of 1 to 4 (each head's
// diagonal tile skipped by consumer 1); RoPE (dK rotated back in registers, dQ by the convert kernel), ALiBi
// with NH not a power of two, none. dqkv poisoned first (every element must be written), a second run must
// agree within 1e-2 (dQ by atomics), and dq, dk, dv are checked separately. Then strided rows (dqkv's stride
// differs from qkv's; an odd one falls back to FA2), and deterministic mode, which must decline the path
// (FA2's two kernels, bitwise repeatable). All but the last five times: dQ added by REDs and by TMA, split
// between the consumers both ways, and split with dV and dK issued early (KILN_WGMMA_DQ).
static void test_attention_wgmma_backward_matches_cpu(void **state) {
    struct env *e = *state;
    if (!kiln_cuda_wgmma_attention_available(e->gpu.ctx)) {
        printf("attention wgmma backward: not applicable here (needs a build with KILN_CUDA_ARCHS containing "
               "90a "
               "and an sm_90 device): skipped\n");
        skip();
    }
    // both ways of adding dQ (KILN_WGMMA_DQ): TMA's reduce-add and vector REDs, each by one consumer a tile
    // or split (each tile's dQ by both consumers, a 64-column pass each, at HS 128), tma-early (tma-split
    // with each tile's dV and dK products issued as soon as their operands are in registers; HS 64: tma with
    // them), tma-early2 (that, with two dQ staging areas a consumer) and tma-dqfirst (tma-early with dK
    // issued after the dQ pass, running while the dQ is staged), tma-dqpw (that, the reduce-adds issued by
    // a producer warp: the default). KILN_TEST_DQ=MODE runs that mode alone (a sanitizer's run of one).
    const char *dq_modes[8] = {"red",       "tma",        "tma-split",   "red-split",
                               "tma-early", "tma-early2", "tma-dqfirst", "tma-dqpw"};
    const char *only = getenv("KILN_TEST_DQ");
    int ran = 0;
    for (int mode = 0; mode < 8; mode++) {
        if (only && *only && strcmp(only, dq_modes[mode]))
            continue;
        ran++;
        set_kernel(e, "KILN_WGMMA_DQ", dq_modes[mode]);
        printf("dQ added by KILN_WGMMA_DQ=%s%s\n", dq_modes[mode], mode == 7 ? " (the default)" : "");
        set_kernel(e, "KILN_ATTN", "fa2");
        printf("attention path: FA2 forward, wgmma backward\n");
        struct kiln_backend *g = &e->gpu;
        attention_case_paths(e, g, "wgmma", 1, 17, 4, 1, 64, KILN_POS_ALIBI);
        attention_case_paths(e, g, "wgmma", 1, 17, 2, 2, 128, KILN_POS_ROPE);
        attention_case_paths(e, g, "wgmma", 2, 129, 6, 2, 64, KILN_POS_ROPE);
        attention_case_paths(e, g, "wgmma", 2, 129, 4, 4, 128, KILN_POS_ALIBI);
        attention_case_paths(e, g, "wgmma", 1, 1024, 4, 2, 64, KILN_POS_NONE);
        attention_case_paths(e, g, "wgmma", 1, 1024, 4, 1, 128, KILN_POS_ROPE);
        attention_case_paths(e, g, "wgmma", 1, 1024, 6, 3, 64, KILN_POS_ALIBI);
        attention_case_paths(e, g, "wgmma", 1, 1024, 2, 2, 128, KILN_POS_ALIBI);
        attention_case_paths(e, g, "wgmma", 1, 300, 8, 2, 128, KILN_POS_NONE);
        set_kernel(e, "KILN_ATTN", "wgmma");
        printf("attention path: wgmma forward and backward, strided rows\n");
        strided_attention_case(e, g, 2, 129, 4, 1, 64, KILN_POS_ROPE, 384 + 1024, 384 + 1024);
        strided_attention_case(e, g, 1, 100, 2, 2, 128, KILN_POS_ALIBI, 768 + 256, 768 + 512);
        strided_attention_case(e, g, 2, 65, 4, 2, 64, KILN_POS_NONE, 512 + 7, 512 + 3); // FA2 fallback
    }
    if (!ran)
        fail_msg("KILN_TEST_DQ=%s: not one of the KILN_WGMMA_DQ modes", only);
    set_kernel(e, "KILN_WGMMA_DQ", NULL);
    printf(
        "attention path: KILN_ATTN=wgmma in deterministic mode (the backward must be FA2's two kernels)\n");
    attention_case_on(e, &e->gpu_det, 2, 129, 6, 2, 64, KILN_POS_ROPE);
    set_kernel(e, "KILN_ATTN", NULL);
    end_test(e);
}

// GELU and SwiGLU on the MLP's slice of [qkv | fc_pre] rows, and the matmul backward writing dfc into a slice
// of [dqkv | dfc] with the DGELU aux read at the pre-activation's row stride (cuBLASLt's EPILOGUE_AUX_LD).
static void test_strided_activations_match_cpu(void **state) {
    struct env *e = *state;
    int shapes[][4] = {
        {7, 512, 384 + 512, 384}, {100, 768, 1024 + 768, 1024}, {33, 100, 300, 60}}; // N H ld off
    for (int s = 0; s < 3; s++) {
        int N = shapes[s][0], H = shapes[s][1], ld = shapes[s][2], off = shapes[s][3];
        char sh[128];
        snprintf(sh, sizeof(sh), "N=%d H=%d ld=%d off=%d", N, H, ld, off);
        struct pair pre = pair_new(e, (size_t)N * ld, ACT), out = pair_new(e, (size_t)N * H, ACT);
        float *h = slice_host(e, N, H, ld, off, 1);
        pair_set(&pre, h);
        free(h);
        pair_poison(&out);
        size_t eb = 2;
        struct kiln_gelu_args g_c = {out.c, (float *)pre.c + off, N, H, ld};
        struct kiln_gelu_args g_g = {out.g, (char *)pre.g + off * eb, N, H, ld};
        RUN(e, gelu_forward, &g);
        check(e, "gelu_forward", sh, "out", &out, TOL_BF16);

        // swiglu: [gate | up] = 2H columns at off of rows sld wide
        int sld = ld + H;
        struct pair inp = pair_new(e, (size_t)N * sld, ACT), dinp = pair_new(e, (size_t)N * sld, ACT);
        h = slice_host(e, N, 2 * H, sld, off, 1);
        pair_set(&inp, h);
        free(h);
        pair_poison(&out);
        pair_poison(&dinp);
        struct kiln_swiglu_args s_c = {out.c, (float *)inp.c + off, N, H, sld};
        struct kiln_swiglu_args s_g = {out.g, (char *)inp.g + off * eb, N, H, sld};
        RUN(e, swiglu_forward, &s);
        check(e, "swiglu_forward", sh, "out", &out, TOL_BF16);
        pair_randn(&out, 1.0f); // dout
        struct kiln_swiglu_back_args sb_c = {
            (float *)dinp.c + off, out.c, (float *)inp.c + off, N, H, sld, sld};
        struct kiln_swiglu_back_args sb_g = {
            (char *)dinp.g + off * eb, out.g, (char *)inp.g + off * eb, N, H, sld, sld};
        RUN(e, swiglu_backward, &sb);
        check_slice(e, "swiglu_backward", sh, "dinp", &dinp, N, 2 * H, sld, off, TOL_BF16);

        // matmul backward: dinp (N, H) into columns off.. of rows ld wide (=, and += which stages the DGELU
        // result), gelu'(pre) read from the slice of `pre` at row stride ld
        int OC = 256;
        struct pair dout = pair_new(e, (size_t)N * OC, ACT), x = pair_new(e, (size_t)N * H, ACT);
        struct pair w = pair_new(e, (size_t)OC * H, ACT), dw = pair_new(e, (size_t)OC * H, GRAD);
        struct pair db = pair_new(e, OC, GRAD), mdinp = pair_new(e, (size_t)N * ld, ACT);
        pair_randn(&dout, 1.0f);
        pair_randn(&x, 1.0f);
        pair_randn(&w, 1.0f / sqrtf((float)OC));
        for (int acc = 0; acc <= 1; acc++) {
            pair_fill(&dw, 0.0f);
            pair_fill(&db, 0.0f);
            h = slice_host(e, N, H, ld, off, acc);
            pair_set(&mdinp, h);
            free(h);
            struct kiln_matmul_back_args m_c = {(float *)mdinp.c + off,
                                                dw.c,
                                                db.c,
                                                dout.c,
                                                x.c,
                                                w.c,
                                                (float *)pre.c + off,
                                                N,
                                                H,
                                                OC,
                                                acc,
                                                0,
                                                ld,
                                                ld,
                                                0};
            struct kiln_matmul_back_args m_g = {(char *)mdinp.g + off * eb,
                                                dw.g,
                                                db.g,
                                                dout.g,
                                                x.g,
                                                w.g,
                                                (char *)pre.g + off * eb,
                                                N,
                                                H,
                                                OC,
                                                acc,
                                                0,
                                                ld,
                                                ld,
                                                0};
            RUN(e, matmul_backward, &m);
            char sh2[160];
            snprintf(sh2, sizeof(sh2), "%s dinp%s*gelu'", sh, acc ? "+=" : "=");
            check_slice(e, "matmul_backward", sh2, "dinp", &mdinp, N, H, ld, off, TOL_BF16);
            check(e, "matmul_backward", sh2, "dweight", &dw, TOL_F32G);
            check(e, "matmul_backward", sh2, "dbias", &db, TOL_F32G);
        }
        struct pair *all[] = {&pre, &out, &inp, &dinp, &dout, &x, &w, &dw, &db, &mdinp};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            pair_free(all[i]);
    }
    end_test(e);
}

static void test_attention_decode_matches_cpu(void **state) {
    struct env *e = *state;
    int cases[][6] = {
        {2, 16, 5, 4, 2, 64}, {3, 40, 0, 6, 3, 80}, {1, 33, 32, 8, 8, 128}}; // B maxT pos NH NKV HS
    enum kiln_pos kinds[] = {KILN_POS_ROPE, KILN_POS_ALIBI, KILN_POS_NONE};
    for (int c = 0; c < 3; c++) {
        int B = cases[c][0], maxT = cases[c][1], pos = cases[c][2], NH = cases[c][3], NKV = cases[c][4],
            HS = cases[c][5];
        char sh[128];
        snprintf(sh, sizeof(sh), "B=%d maxT=%d pos=%d NH=%d NKV=%d HS=%d %s", B, maxT, pos, NH, NKV, HS,
                 pos_name(kinds[c]));
        struct pair qkv = pair_new(e, (size_t)B * (NH + 2 * NKV) * HS, ACT),
                    out = pair_new(e, (size_t)B * NH * HS, ACT);
        struct pair kc = pair_new(e, (size_t)B * maxT * NKV * HS, ACT),
                    vc = pair_new(e, (size_t)B * maxT * NKV * HS, ACT);
        pair_randn(&qkv, 1.0f);
        pair_randn(&kc, 1.0f); // earlier positions of the caches: same values on both sides
        pair_randn(&vc, 1.0f);
        pair_poison(&out);
        struct kiln_attn_decode_args a_c = {out.c, kc.c, vc.c, qkv.c,    B,        maxT, pos,
                                            NH,    NKV,  HS,   kinds[c], 10000.0f, 0};
        struct kiln_attn_decode_args a_g = {out.g, kc.g, vc.g, qkv.g,    B,        maxT, pos,
                                            NH,    NKV,  HS,   kinds[c], 10000.0f, 0};
        RUN(e, attention_decode, &a);
        check(e, "attention_decode", sh, "out", &out, TOL_ATTN);
        check(e, "attention_decode", sh, "kcache", &kc, TOL_BF16);
        check(e, "attention_decode", sh, "vcache", &vc, TOL_BF16);
        pair_free(&qkv);
        pair_free(&out);
        pair_free(&kc);
        pair_free(&vc);
    }
    end_test(e);
}

// ---- elementwise -----------------------------------------------------------------------------------------

static void test_swiglu_and_add_match_cpu(void **state) {
    struct env *e = *state;
    int shapes[][2] = {{1, 72}, {7, 100}, {257, 768}};
    for (int s = 0; s < 3; s++) {
        int N = shapes[s][0], H = shapes[s][1];
        char sh[64];
        snprintf(sh, sizeof(sh), "N=%d H=%d", N, H);
        struct pair inp = pair_new(e, (size_t)N * 2 * H, ACT), out = pair_new(e, (size_t)N * H, ACT);
        struct pair dinp = pair_new(e, (size_t)N * 2 * H, ACT);
        pair_randn(&inp, 2.0f);
        pair_poison(&out);
        pair_poison(&dinp);
        struct kiln_swiglu_args a_c = {out.c, inp.c, N, H, 0}, a_g = {out.g, inp.g, N, H, 0};
        RUN(e, swiglu_forward, &a);
        check(e, "swiglu_forward", sh, "out", &out, TOL_BF16);
        pair_randn(&out, 1.0f);
        struct kiln_swiglu_back_args b_c = {dinp.c, out.c, inp.c, N, H, 0, 0},
                                     b_g = {dinp.g, out.g, inp.g, N, H, 0, 0};
        RUN(e, swiglu_backward, &b);
        check(e, "swiglu_backward", sh, "dinp", &dinp, TOL_BF16);
        // add, also in place (out aliases a)
        size_t n = (size_t)N * H;
        struct pair x = pair_new(e, n, ACT), y = pair_new(e, n, ACT), z = pair_new(e, n, ACT);
        pair_randn(&x, 1.0f);
        pair_randn(&y, 1.0f);
        pair_poison(&z);
        e->cpu.ops->add(e->cpu.ctx, z.c, x.c, y.c, n);
        e->gpu.ops->add(e->gpu.ctx, z.g, x.g, y.g, n);
        check(e, "add", sh, "out", &z, TOL_BF16);
        e->cpu.ops->add(e->cpu.ctx, x.c, x.c, y.c, n);
        e->gpu.ops->add(e->gpu.ctx, x.g, x.g, y.g, n);
        check(e, "add", sh, "in-place", &x, TOL_BF16);
        struct pair *all[] = {&inp, &out, &dinp, &x, &y, &z};
        for (size_t i = 0; i < 6; i++)
            pair_free(all[i]);
    }
    end_test(e);
}

// ---- classifier ------------------------------------------------------------------------------------------

static void test_cross_entropy_matches_cpu(void **state) {
    struct env *e = *state;
    // rows up to 64k logits run the one-pass (registers) kernel; 70016 and the unaligned 1001 the two-pass
    // ones
    int shapes[][3] = {{1, 1000, 1024}, {7, 1000, 1024},   {100, 1000, 1024}, {8, 50257, 50304},
                       {5, 100, 104},   {3, 70000, 70016}, {4, 1000, 1001}};
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++)
        for (int mode = 0; mode < 3; mode++) { // 0: loss only, 1: with gradient, 2: gradient + z_loss
            int N = shapes[s][0], V = shapes[s][1], Vp = shapes[s][2];
            float dloss = mode ? 1.0f / N : 0.0f, z = mode == 2 ? 1e-4f : 0.0f;
            char sh[128];
            snprintf(sh, sizeof(sh), "N=%d V=%d Vp=%d dloss=%g z=%g", N, V, Vp, dloss, z);
            struct pair logits = pair_new(e, (size_t)N * Vp, ACT), losses = pair_new(e, N, F32);
            struct pair tgt = pair_new(e, N, I32);
            pair_randn(&logits, 3.0f);
            pair_poison(&losses);
            float *ht = malloc(N * sizeof(float));
            for (int i = 0; i < N; i++) // every 4th target ignored (-1)
                ht[i] = i % 4 == 3 ? -1.0f : (float)(test_rand_u64(&e->rng) % (uint64_t)V);
            pair_set(&tgt, ht);
            struct kiln_xent_args a_c = {logits.c, losses.c, tgt.c, N, V, Vp, dloss, z};
            struct kiln_xent_args a_g = {logits.g, losses.g, tgt.g, N, V, Vp, dloss, z};
            RUN(e, cross_entropy, &a);
            check(e, "cross_entropy", sh, "losses", &losses, TOL_STAT);
            check(e, "cross_entropy", sh, mode ? "dlogits" : "logits", &logits, mode ? TOL_BF16 : 0.0);
            if (mode) { // padded columns and ignored rows exactly 0 on the GPU
                float *hg = pair_get(&logits, 1);
                int bad = 0;
                for (int i = 0; i < N; i++)
                    for (int j = 0; j < Vp; j++)
                        if ((j >= V || ht[i] < 0) && hg[(size_t)i * Vp + j] != 0.0f)
                            bad++;
                expect(e, bad == 0, "cross_entropy", "padded/ignored dlogits are 0");
                free(hg);
            }
            free(ht);
            pair_free(&logits);
            pair_free(&losses);
            pair_free(&tgt);
        }
    end_test(e);
}

// ---- optimizer -------------------------------------------------------------------------------------------

static void test_adamw_and_sum_squares_match_cpu(void **state) {
    struct env *e = *state;
    size_t P = 100000;
    struct kiln_param_span spans[] = {{0, 7, 1, 0},
                                      {7, 30000, 1, 7},
                                      {30007, 1, 0, 30007},
                                      {30008, 4096, 0, 30008},
                                      {34104, 65896, 1, 34104}};
    for (int sr = 0; sr <= 1; sr++) {
        struct pair params = pair_new(e, P, F32), weights = pair_new(e, P, ACT), grads = pair_new(e, P, GRAD);
        struct pair m = pair_new(e, P, F32), v = pair_new(e, P, F32);
        pair_randn(&params, 1.0f);
        pair_fill(&m, 0.0f);
        pair_fill(&v, 0.0f);
        pair_poison(&weights);
        for (int step = 1; step <= 3; step++) {
            pair_randn(&grads, 0.01f);
            struct kiln_adamw_args a_c = {params.c, weights.c, grads.c, m.c,  v.c,  spans, 5,    3e-4f, 0.9f,
                                          0.95f,    1e-8f,     0.1f,    0.5f, step, sr,    1234, 0,     0};
            struct kiln_adamw_args a_g = a_c;
            a_g.params = params.g;
            a_g.weights = weights.g;
            a_g.grads = grads.g;
            a_g.m = m.g;
            a_g.v = v.g;
            RUN(e, adamw, &a);
            char sh[64];
            snprintf(sh, sizeof(sh), "P=%zu spans=5 step=%d sr=%d", P, step, sr);
            check(e, "adamw", sh, "params", &params, TOL_F32);
            check(e, "adamw", sh, "m", &m, TOL_F32);
            check(e, "adamw", sh, "v", &v, TOL_F32);
            check(e, "adamw", sh, "weights", &weights, TOL_BF16);
        }
        if (sr) { // the stochastically rounded bf16 copy stays within one bf16 ulp of the master
            float *hp = pair_get(&params, 1), *hw = pair_get(&weights, 1);
            int far = 0;
            for (size_t i = 0; i < P; i++)
                if (fabsf(hw[i] - hp[i]) > fabsf(hp[i]) * (1.0f / 128.0f))
                    far++;
            expect(e, far == 0, "adamw", "stochastic rounding within 1 ulp");
            free(hp);
            free(hw);
        }
        size_t n = P;
        double sc = e->cpu.ops->sum_squares(e->cpu.ctx, grads.c, n),
               sg = e->gpu.ops->sum_squares(e->gpu.ctx, grads.g, n);
        double err = fabs(sg - sc) / sc;
        printf("%-16s %-44s %-8s rel_err %.2e  tol %.0e  %s\n", "sum_squares", "n=100000", "sum", err, 1e-6,
               err <= 1e-6 ? "PASS" : "FAIL");
        if (!(err <= 1e-6))
            e->failures++;
        float nanv = NAN;
        e->gpu.ops->upload_f32(e->gpu.ctx, (char *)grads.g + 4 * 777, KILN_F32, &nanv, 1);
        expect(e, !isfinite(e->gpu.ops->sum_squares(e->gpu.ctx, grads.g, n)), "sum_squares",
               "NaN -> non-finite");
        struct pair *all[] = {&params, &weights, &grads, &m, &v};
        for (size_t i = 0; i < 5; i++)
            pair_free(all[i]);
    }
    end_test(e);
}

// ---- bf16 parameter gradients ----------------------------------------------------------------------------
// The ops that write or read parameter gradients, on the backend opened with grad_dtype = KILN_BF16, against
// the CPU's f32: assigned (the first micro-step's writes) and added to (the tied head and embedding table).

static void test_bf16_gradients_of_matmul_backward_match_cpu(void **state) {
    struct env *e = *state;
    struct kiln_backend *g = &e->gpu_bf16g;
    int shapes[][3] = {{1, 72, 72}, {100, 72, 288}, {257, 768, 2304}, {33, 100, 36}}; // N, IC, OC
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int variant = 0; variant < 3; variant++) { // 0: dW =, +dbias; 1: dW +=, +dbias; 2: dW =
            int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
            int gassign = variant != 1, has_bias = variant != 2;
            char sh[128];
            snprintf(sh, sizeof(sh), "N=%d IC=%d OC=%d dW%s%s bf16", N, IC, OC,
                     gassign ? "=" : "+=", has_bias ? " +dbias" : "");
            struct pair inp = pair_new_on(e, g, (size_t)N * IC, ACT),
                        w = pair_new_on(e, g, (size_t)OC * IC, ACT);
            struct pair dout = pair_new_on(e, g, (size_t)N * OC, ACT),
                        dinp = pair_new_on(e, g, (size_t)N * IC, ACT);
            struct pair dw = pair_new_on(e, g, (size_t)OC * IC, GRAD), db = pair_new_on(e, g, OC, GRAD);
            pair_randn(&inp, 1.0f);
            pair_randn(&w, 1.0f / sqrtf((float)IC));
            pair_randn(&dout, 1.0f);
            pair_poison(&dinp);
            grads_prefill(gassign, &dw, &db);
            struct kiln_matmul_back_args b_c = {.dinp = dinp.c,
                                                .dweight = dw.c,
                                                .dbias = has_bias ? db.c : NULL,
                                                .dout = dout.c,
                                                .inp = inp.c,
                                                .weight = w.c,
                                                .N = N,
                                                .IC = IC,
                                                .OC = OC,
                                                .grad_assign = gassign};
            struct kiln_matmul_back_args b_g = {.dinp = dinp.g,
                                                .dweight = dw.g,
                                                .dbias = has_bias ? db.g : NULL,
                                                .dout = dout.g,
                                                .inp = inp.g,
                                                .weight = w.g,
                                                .N = N,
                                                .IC = IC,
                                                .OC = OC,
                                                .grad_assign = gassign};
            RUN_ON(e, g, matmul_backward, &b);
            check(e, "matmul_backward", sh, "dinp", &dinp, TOL_BF16);
            check(e, "matmul_backward", sh, "dweight", &dw, TOL_BF16G);
            if (has_bias)
                check(e, "matmul_backward", sh, "dbias", &db, TOL_BF16G);
            struct pair *all[] = {&inp, &w, &dout, &dinp, &dw, &db};
            for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
                pair_free(all[i]);
        }
    end_test(e);
}

// C % 8 == 0 runs the one-kernel backward (the tile kernel up to C = 2048, the wide kernel and a second pass
// for dres_bias above), C = 100 the row kernel and the separate column sums
static void test_bf16_gradients_of_norm_backward_match_cpu(void **state) {
    struct env *e = *state;
    struct kiln_backend *g = &e->gpu_bf16g;
    int shapes[][2] = {{7, 768}, {257, 100}, {4099, 1024}, {300, 1600}, {33, 4096}}; // N, C
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int rms = 0; rms <= 1; rms++)
            for (int gassign = 0; gassign <= 1; gassign++) {
                int N = shapes[s][0], C = shapes[s][1];
                size_t nc = (size_t)N * C;
                char sh[128];
                snprintf(sh, sizeof(sh), "N=%d C=%d %s dW%s bf16", N, C, rms ? "rms" : "layernorm",
                         gassign ? "=" : "+=");
                struct pair x = pair_new_on(e, g, nc, ACT), dout = pair_new_on(e, g, nc, ACT);
                struct pair dinp = pair_new_on(e, g, nc, ACT), w = pair_new_on(e, g, C, ACT);
                struct pair mean = pair_new_on(e, g, N, F32), rstd = pair_new_on(e, g, N, F32);
                struct pair dw = pair_new_on(e, g, C, GRAD), db = pair_new_on(e, g, C, GRAD);
                struct pair rb = pair_new_on(e, g, C, GRAD), rb_unused = pair_new_on(e, g, C, GRAD);
                pair_randn(&x, 1.0f);
                pair_randn(&dout, 1.0f);
                pair_randn(&dinp, 1.0f);
                pair_randn(&w, 1.0f);
                pair_randn(&mean,
                           0.1f); // the same statistics on both sides: the backward is what is measured
                float *hr = malloc((size_t)N * sizeof(float));
                for (int r = 0; r < N; r++)
                    hr[r] = 0.5f + test_rand_uniform(&e->rng);
                pair_set(&rstd, hr);
                free(hr);
                grads_prefill(gassign, &dw, &db);
                grads_prefill(gassign, &rb, &rb_unused);
                struct kiln_norm_back_args b_c = {.dinp = dinp.c,
                                                  .dweight = dw.c,
                                                  .dbias = rms ? NULL : db.c,
                                                  .dout = dout.c,
                                                  .inp = x.c,
                                                  .weight = w.c,
                                                  .mean = rms ? NULL : mean.c,
                                                  .rstd = rstd.c,
                                                  .N = N,
                                                  .C = C,
                                                  .rms = rms,
                                                  .grad_assign = gassign,
                                                  .dres_bias = {rb.c}};
                struct kiln_norm_back_args b_g = {.dinp = dinp.g,
                                                  .dweight = dw.g,
                                                  .dbias = rms ? NULL : db.g,
                                                  .dout = dout.g,
                                                  .inp = x.g,
                                                  .weight = w.g,
                                                  .mean = rms ? NULL : mean.g,
                                                  .rstd = rstd.g,
                                                  .N = N,
                                                  .C = C,
                                                  .rms = rms,
                                                  .grad_assign = gassign,
                                                  .dres_bias = {rb.g}};
                RUN_ON(e, g, norm_backward, &b);
                check(e, "norm_backward", sh, "dinp", &dinp, TOL_BF16);
                check(e, "norm_backward", sh, "dweight", &dw, TOL_BF16G);
                if (!rms)
                    check(e, "norm_backward", sh, "dbias", &db, TOL_BF16G);
                check(e, "norm_backward", sh, "dres_bias", &rb, TOL_BF16G);
                struct pair *all[] = {&x, &dout, &dinp, &w, &mean, &rstd, &dw, &db, &rb, &rb_unused};
                for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
                    pair_free(all[i]);
            }
    end_test(e);
}

// Zeroed tables (as kiln_model_zero_grad leaves them), then two backward passes: the second adds to bf16 values
static void test_bf16_gradients_of_embedding_backward_match_cpu(void **state) {
    struct env *e = *state;
    struct kiln_backend *g = &e->gpu_bf16g;
    int shapes[][4] = {{4, 100, 768, 1}, {3, 257, 100, 0}, {8, 1000, 64, 1}}; // B, T, C, learned
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], learned = shapes[s][3], Vp = 1024,
            N = B * T;
        char sh[128];
        snprintf(sh, sizeof(sh), "B=%d T=%d C=%d Vp=%d %s bf16", B, T, C, Vp, learned ? "wpe" : "no-wpe");
        struct pair tok = pair_new_on(e, g, N, I32), dout = pair_new_on(e, g, (size_t)N * C, ACT);
        struct pair dwte = pair_new_on(e, g, (size_t)Vp * C, GRAD),
                    dwpe = pair_new_on(e, g, (size_t)T * C, GRAD);
        float *ht = malloc((size_t)N * sizeof(float));
        int32_t *hti = malloc((size_t)N * sizeof(int32_t));
        for (int i = 0; i < N; i++) { // a small id range so that tokens repeat
            hti[i] = (int32_t)(test_rand_u64(&e->rng) % (uint64_t)(i % 3 ? 1000 : 17));
            ht[i] = (float)hti[i];
        }
        pair_set(&tok, ht);
        pair_randn(&dout, 1.0f);
        pair_fill(&dwte, 0.0f);
        pair_fill(&dwpe, 0.0f);
        for (int pass = 0; pass < 2; pass++) {
            struct kiln_embed_back_args b_c = {
                dwte.c, learned ? dwpe.c : NULL, dout.c, tok.c, hti, B, T, C, NULL, 0, 0, 0};
            struct kiln_embed_back_args b_g = {
                dwte.g, learned ? dwpe.g : NULL, dout.g, tok.g, hti, B, T, C, NULL, 0, 0, 0};
            RUN_ON(e, g, embed_backward, &b);
        }
        check(e, "embed_backward", sh, "dwte", &dwte, TOL_BF16G);
        if (learned)
            check(e, "embed_backward", sh, "dwpe", &dwpe, TOL_BF16G);
        free(ht);
        free(hti);
        struct pair *all[] = {&tok, &dout, &dwte, &dwpe};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            pair_free(all[i]);
    }
    end_test(e);
}

// bf16 gradients are read exactly (the CPU gets the same rounded values), so the f32 tolerances hold
static void test_bf16_gradients_in_adamw_and_sum_squares_match_cpu(void **state) {
    struct env *e = *state;
    struct kiln_backend *g = &e->gpu_bf16g;
    size_t P = 100000;
    struct kiln_param_span spans[] = {{0, 7, 1, 0},
                                      {7, 30000, 1, 7},
                                      {30007, 1, 0, 30007},
                                      {30008, 4096, 0, 30008},
                                      {34104, 65896, 1, 34104}};
    struct pair params = pair_new_on(e, g, P, F32), weights = pair_new_on(e, g, P, ACT);
    struct pair grads = pair_new_on(e, g, P, GRAD), m = pair_new_on(e, g, P, F32),
                v = pair_new_on(e, g, P, F32);
    pair_randn(&params, 1.0f);
    pair_fill(&m, 0.0f);
    pair_fill(&v, 0.0f);
    pair_poison(&weights);
    for (int step = 1; step <= 3; step++) {
        pair_randn(&grads, 0.01f);
        struct kiln_adamw_args a_c = {params.c, weights.c, grads.c, m.c,  v.c,  spans, 5,    3e-4f, 0.9f,
                                      0.95f,    1e-8f,     0.1f,    0.5f, step, 0,     1234, 0,     0};
        struct kiln_adamw_args a_g = a_c;
        a_g.params = params.g;
        a_g.weights = weights.g;
        a_g.grads = grads.g;
        a_g.m = m.g;
        a_g.v = v.g;
        RUN_ON(e, g, adamw, &a);
        char sh[64];
        snprintf(sh, sizeof(sh), "P=%zu spans=5 step=%d bf16 grads", P, step);
        check(e, "adamw", sh, "params", &params, TOL_F32);
        check(e, "adamw", sh, "m", &m, TOL_F32);
        check(e, "adamw", sh, "v", &v, TOL_F32);
        check(e, "adamw", sh, "weights", &weights, TOL_BF16);
    }
    // a ZeRO-3 shard: params, compute weights, gradients and moments all compact at the spans' state offsets
    // (two slices of a flat buffer whose other elements this rank does not hold)
    struct kiln_param_span shard[] = {{1000, 5000, 1, 0}, {50000, 3000, 0, 5000}, {70000, 2000, 1, 8000}};
    size_t S = 10000;
    struct pair sp = pair_new_on(e, g, S, F32), sw = pair_new_on(e, g, S, ACT),
                sg2 = pair_new_on(e, g, S, GRAD), sm = pair_new_on(e, g, S, F32),
                sv = pair_new_on(e, g, S, F32);
    pair_randn(&sp, 1.0f);
    pair_fill(&sm, 0.0f);
    pair_fill(&sv, 0.0f);
    pair_poison(&sw);
    for (int step = 1; step <= 2; step++) {
        pair_randn(&sg2, 0.01f);
        struct kiln_adamw_args a = {.params = sp.c,
                                    .weights = sw.c,
                                    .grads = sg2.c,
                                    .m = sm.c,
                                    .v = sv.c,
                                    .spans = shard,
                                    .n_spans = 3,
                                    .lr = 3e-4f,
                                    .beta1 = 0.9f,
                                    .beta2 = 0.95f,
                                    .eps = 1e-8f,
                                    .weight_decay = 0.1f,
                                    .grad_scale = 0.5f,
                                    .step = step,
                                    .seed = 1234,
                                    .grads_compact = 1,
                                    .params_compact = 1};
        struct kiln_adamw_args a_c = a, a_g = a;
        a_c.weights = NULL; // the CPU's compute weights are its params
        a_g.params = sp.g;
        a_g.weights = sw.g;
        a_g.grads = sg2.g;
        a_g.m = sm.g;
        a_g.v = sv.g;
        e->cpu.ops->adamw(e->cpu.ctx, &a_c);
        g->ops->adamw(g->ctx, &a_g);
        g->ops->synchronize(g->ctx);
        char sh[64];
        snprintf(sh, sizeof(sh), "shard of %zu, 3 spans, step %d", S, step);
        check(e, "adamw compact", sh, "params", &sp, TOL_F32);
        check(e, "adamw compact", sh, "m", &sm, TOL_F32);
        check(e, "adamw compact", sh, "v", &sv, TOL_F32);
    }
    struct pair *shp[] = {&sp, &sw, &sg2, &sm, &sv};
    for (size_t i = 0; i < sizeof(shp) / sizeof(shp[0]); i++)
        pair_free(shp[i]);
    double sc = e->cpu.ops->sum_squares(e->cpu.ctx, grads.c, P), sg = g->ops->sum_squares(g->ctx, grads.g, P);
    double err = fabs(sg - sc) / sc;
    printf("%-16s %-44s %-8s rel_err %.2e  tol %.0e  %s\n", "sum_squares", "n=100000 bf16", "sum", err, 1e-6,
           err <= 1e-6 ? "PASS" : "FAIL");
    if (!(err <= 1e-6))
        e->failures++;
    float nanv = NAN;
    g->ops->upload_f32(g->ctx, (char *)grads.g + 2 * 777, KILN_BF16, &nanv, 1);
    expect(e, !isfinite(g->ops->sum_squares(g->ctx, grads.g, P)), "sum_squares", "bf16 NaN -> non-finite");
    struct pair *all[] = {&params, &weights, &grads, &m, &v};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        pair_free(all[i]);
    end_test(e);
}

// ---- determinism -----------------------------------------------------------------------------------------

// Runs fn twice on the deterministic backend from the same inputs; the outputs must be bitwise identical.
static int bitwise_same(struct kiln_backend *g, void *p, size_t bytes, void *snapshot) {
    void *h = malloc(bytes);
    g->ops->download(g->ctx, h, p, bytes);
    int same = memcmp(h, snapshot, bytes) == 0;
    free(h);
    return same;
}

static void test_deterministic_mode_is_bitwise_repeatable(void **state) {
    struct env *e = *state;
    struct kiln_backend *g = &e->gpu_det;
    int B = 4, T = 257, C = 768, NH = 12, HS = 64, N = B * T, OC = 2304, Vp = 1024;
    size_t Wq = (size_t)3 * C;
    struct pair inp = pair_new_on(e, g, (size_t)N * C, ACT), w = pair_new_on(e, g, (size_t)OC * C, ACT);
    struct pair dout = pair_new_on(e, g, (size_t)N * OC, ACT), dw = pair_new_on(e, g, (size_t)OC * C, GRAD);
    struct pair db = pair_new_on(e, g, OC, GRAD), dinp = pair_new_on(e, g, (size_t)N * C, ACT);
    struct pair dw0 = pair_new_on(e, g, (size_t)OC * C, GRAD);
    pair_randn(&inp, 1.0f);
    pair_randn(&w, 0.03f);
    pair_randn(&dout, 1.0f);
    pair_randn(&dw0, 1.0f);
    // matmul backward
    void *snap_dw = NULL, *snap_dinp = NULL, *snap_db = NULL;
    size_t bdw = (size_t)OC * C * 4, bdinp = (size_t)N * C * 2, bdb = (size_t)OC * 4;
    int same = 1;
    for (int run = 0; run < 2; run++) {
        g->ops->copy(g->ctx, dw.g, dw0.g, bdw);
        g->ops->zero(g->ctx, db.g, bdb);
        struct kiln_matmul_back_args b = {dinp.g, dw.g, db.g, dout.g, inp.g, w.g, NULL, N, C, OC, 0, 0, 0, 0, 0};
        g->ops->matmul_backward(g->ctx, &b);
        if (run == 0) {
            snap_dw = malloc(bdw);
            snap_dinp = malloc(bdinp);
            snap_db = malloc(bdb);
            g->ops->download(g->ctx, snap_dw, dw.g, bdw);
            g->ops->download(g->ctx, snap_dinp, dinp.g, bdinp);
            g->ops->download(g->ctx, snap_db, db.g, bdb);
        } else {
            same = bitwise_same(g, dw.g, bdw, snap_dw) && bitwise_same(g, dinp.g, bdinp, snap_dinp) &&
                   bitwise_same(g, db.g, bdb, snap_db);
        }
    }
    expect(e, same, "determinism", "matmul_backward dinp/dweight/dbias bitwise");
    free(snap_dw);
    free(snap_dinp);
    free(snap_db);

    // norm backward
    struct pair mean = pair_new_on(e, g, N, F32), rstd = pair_new_on(e, g, N, F32),
                nw = pair_new_on(e, g, C, ACT);
    struct pair nout = pair_new_on(e, g, (size_t)N * C, ACT), ndw = pair_new_on(e, g, C, GRAD),
                ndb = pair_new_on(e, g, C, GRAD), nrb = pair_new_on(e, g, C, GRAD);
    pair_randn(&nw, 1.0f);
    struct kiln_norm_args nf = {nout.g, mean.g, rstd.g, NULL, inp.g, NULL, nw.g, NULL, N, C, 0, 1e-5f, 0};
    g->ops->norm_forward(g->ctx, &nf);
    void *snaps[4] = {0};
    size_t nb[4] = {(size_t)N * C * 2, (size_t)C * 4, (size_t)C * 4, (size_t)C * 4};
    void *ptrs[4] = {dinp.g, ndw.g, ndb.g, nrb.g};
    same = 1;
    for (int run = 0; run < 2; run++) {
        for (int i = 0; i < 4; i++)
            g->ops->zero(g->ctx, ptrs[i], nb[i]);
        struct kiln_norm_back_args b = {dinp.g, ndw.g, ndb.g, nout.g, inp.g, nw.g, mean.g,       rstd.g,
                                        N,      C,     0,     0,      0,     0,    {nrb.g, NULL}};
        g->ops->norm_backward(g->ctx, &b);
        for (int i = 0; i < 4; i++) {
            if (run == 0) {
                snaps[i] = malloc(nb[i]);
                g->ops->download(g->ctx, snaps[i], ptrs[i], nb[i]);
            } else {
                same = same && bitwise_same(g, ptrs[i], nb[i], snaps[i]);
            }
        }
    }
    expect(e, same, "determinism", "norm_backward dinp/dweight/dbias/dres_bias bitwise");
    for (int i = 0; i < 4; i++)
        free(snaps[i]);

    // attention backward
    struct pair qkv = pair_new_on(e, g, (size_t)N * Wq, ACT), aout = pair_new_on(e, g, (size_t)N * C, ACT);
    struct pair lse = pair_new_on(e, g, (size_t)B * NH * T, F32),
                dqkv = pair_new_on(e, g, (size_t)N * Wq, ACT);
    pair_randn(&qkv, 1.0f);
    struct kiln_attn_args af = {aout.g, lse.g, qkv.g, B, T, NH, NH, HS, KILN_POS_ROPE, 10000.0f, 0};
    g->ops->attention_forward(g->ctx, &af);
    void *snap = malloc((size_t)N * Wq * 2);
    same = 1;
    for (int run = 0; run < 2; run++) {
        struct kiln_attn_back_args ab = {dqkv.g, inp.g, qkv.g, aout.g,        lse.g,    B, T,
                                         NH,     NH,    HS,    KILN_POS_ROPE, 10000.0f, 0, 0};
        g->ops->attention_backward(g->ctx, &ab);
        if (run == 0)
            g->ops->download(g->ctx, snap, dqkv.g, (size_t)N * Wq * 2);
        else
            same = bitwise_same(g, dqkv.g, (size_t)N * Wq * 2, snap);
    }
    expect(e, same, "determinism", "attention_backward dqkv bitwise");
    free(snap);

    // embedding backward
    struct pair tok = pair_new_on(e, g, N, I32), dwte = pair_new_on(e, g, (size_t)Vp * C, GRAD);
    int32_t *hti = malloc(N * sizeof(int32_t));
    float *ht = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        hti[i] = (int32_t)(test_rand_u64(&e->rng) % 50);
        ht[i] = (float)hti[i];
    }
    pair_set(&tok, ht);
    snap = malloc((size_t)Vp * C * 4);
    same = 1;
    for (int run = 0; run < 2; run++) {
        g->ops->zero(g->ctx, dwte.g, (size_t)Vp * C * 4);
        struct kiln_embed_back_args eb = {dwte.g, NULL, inp.g, tok.g, hti, B, T, C, NULL, 0, 0, 0};
        g->ops->embed_backward(g->ctx, &eb);
        if (run == 0)
            g->ops->download(g->ctx, snap, dwte.g, (size_t)Vp * C * 4);
        else
            same = bitwise_same(g, dwte.g, (size_t)Vp * C * 4, snap);
    }
    expect(e, same, "determinism", "embed_backward dwte bitwise");
    free(snap);
    free(hti);
    free(ht);
    struct pair *all[] = {&inp,  &w,   &dout, &dw,  &db,  &dinp, &dw0, &mean, &rstd, &nw,
                          &nout, &ndw, &ndb,  &nrb, &qkv, &aout, &lse, &dqkv, &tok,  &dwte};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        pair_free(all[i]);
    end_test(e);
}

// ---- errors ----------------------------------------------------------------------------------------------

static void test_out_of_memory_returns_null_and_backend_still_works(void **state) {
    struct env *e = *state;
    struct kiln_backend *g = &e->gpu;
    size_t peak0 = g->ops->mem_peak(g->ctx);
    void *p = g->ops->alloc(g->ctx, (size_t)1 << 50); // 1 PiB
    expect(e, p == NULL, "alloc", "1 PiB returns NULL");
    if (p)
        g->ops->free(g->ctx, p);
    expect(e, g->ops->mem_peak(g->ctx) == peak0, "mem_peak", "a failed allocation is not counted");
    // the peak counts what is held at once: on a fresh context (its cuBLASLt workspace held), 2 x 256 MiB,
    // one freed, then 128 MiB more: the peak is the workspace and 512 MiB
    struct kiln_backend f;
    struct kiln_error err;
    struct kiln_backend_opts o = {0};
    if (kiln_backend_open("cuda", &o, &f, &err) == 0) {
        size_t mib = (size_t)1 << 20, base = f.ops->mem_peak(f.ctx);
        void *a = f.ops->alloc(f.ctx, 256 * mib), *b = f.ops->alloc(f.ctx, 256 * mib);
        f.ops->free(f.ctx, a);
        void *c = f.ops->alloc(f.ctx, 128 * mib);
        size_t peak = f.ops->mem_peak(f.ctx);
        expect(e, a && b && c && base > 0 && peak == base + 512 * mib, "mem_peak",
               "bytes held at once, not all ever allocated");
        f.ops->free(f.ctx, b);
        f.ops->free(f.ctx, c);
        kiln_backend_close(&f);
    } else {
        expect(e, 0, "mem_peak", "a second CUDA context opens");
    }
    size_t n = 1000;
    struct pair x = pair_new(e, n, ACT), y = pair_new(e, n, ACT), z = pair_new(e, n, ACT);
    pair_randn(&x, 1.0f);
    pair_randn(&y, 1.0f);
    pair_poison(&z);
    e->cpu.ops->add(e->cpu.ctx, z.c, x.c, y.c, n);
    e->gpu.ops->add(e->gpu.ctx, z.g, x.g, y.g, n);
    check(e, "add", "after OOM", "out", &z, TOL_BF16);
    pair_free(&x);
    pair_free(&y);
    pair_free(&z);
    end_test(e);
}

// ---- block attention (sequence parallelism) ---------------------------------------------------------------

// One case of the block op: a sequence of T positions cut into nqb query blocks and nqb + 1 key blocks
// (uneven, so that query and key blocks do not line up), q, k and v read as views into qkv rows. pad > 0
// widens every row (qkv, out) and adds a row per batch and pad lse entries per head: odd strides, batch
// strides that are not T rows. base shifts every global position.
struct blk_case {
    int B, T, NH, NKV, HS;
    enum kiln_pos pos;
    int head0, NH_total; // ALiBi's global heads (0, 0: all of them)
    int pad, base, nqb;
};

struct blk_bufs {
    const struct blk_case *c;
    size_t W, rows, ors, lse_s; // qkv row width, rows per batch, out row stride, lse stride (elements)
    struct pair qkv, out, lse, dout, dqkv;
};

static void blk_fwd_args(struct kiln_attn_block_args *a, struct blk_bufs *u, int gpu, int i0, int Tq, int j0,
                         int Tk, int accumulate) {
    const struct blk_case *c = u->c;
    memset(a, 0, sizeof(*a));
    a->out = pair_at(&u->out, gpu, (size_t)i0 * u->ors);
    a->lse = pair_at(&u->lse, gpu, (size_t)i0);
    a->q = pair_at(&u->qkv, gpu, (size_t)i0 * u->W);
    a->k = pair_at(&u->qkv, gpu, (size_t)j0 * u->W + (size_t)c->NH * c->HS);
    a->v = pair_at(&u->qkv, gpu, (size_t)j0 * u->W + (size_t)(c->NH + c->NKV) * c->HS);
    a->B = c->B;
    a->Tq = Tq;
    a->Tk = Tk;
    a->NH = c->NH;
    a->NKV = c->NKV;
    a->HS = c->HS;
    a->q0 = c->base + i0;
    a->k0 = c->base + j0;
    a->q_bstride = a->kv_bstride = u->rows * u->W;
    a->out_bstride = u->rows * u->ors;
    a->lse_stride = u->lse_s;
    a->q_stride = a->kv_stride = (int)u->W;
    a->out_stride = (int)u->ors;
    a->pos = c->pos;
    a->rope_theta = 10000.0f;
    a->head0 = c->head0;
    a->NH_total = c->NH_total;
    a->accumulate = accumulate;
}

static void blk_back_args(struct kiln_attn_block_back_args *b, struct blk_bufs *u, int gpu, int i0, int Tq,
                          int j0, int Tk) {
    const struct blk_case *c = u->c;
    memset(b, 0, sizeof(*b));
    blk_fwd_args(&b->blk, u, gpu, i0, Tq, j0, Tk, 0);
    b->dq = pair_at(&u->dqkv, gpu, (size_t)i0 * u->W);
    b->dk = pair_at(&u->dqkv, gpu, (size_t)j0 * u->W + (size_t)c->NH * c->HS);
    b->dv = pair_at(&u->dqkv, gpu, (size_t)j0 * u->W + (size_t)(c->NH + c->NKV) * c->HS);
    b->dout = pair_at(&u->dout, gpu, (size_t)i0 * u->ors);
}

// Relative error of columns [off, off + w) of rows [r0, r1) of every batch (rows_b rows a batch, rs apart):
// one line, counts a failure.
static void check_rows(struct env *e, const char *op, const char *sh, const char *what, const float *hg,
                       const float *hc, int B, size_t rows_b, int r0, int r1, size_t rs, size_t off, size_t w,
                       double tol) {
    size_t n = (size_t)B * (r1 - r0) * w, k = 0;
    float *xg = malloc(n * sizeof(float) + 4), *xc = malloc(n * sizeof(float) + 4);
    for (int b = 0; b < B; b++)
        for (int r = r0; r < r1; r++)
            for (size_t i = 0; i < w; i++, k++) {
                xg[k] = hg[((size_t)b * rows_b + r) * rs + off + i];
                xc[k] = hc[((size_t)b * rows_b + r) * rs + off + i];
            }
    double err = test_rel_err(xg, xc, n);
    int ok = err <= tol;
    printf("%-16s %-44s %-8s rel_err %.2e  tol %.0e  %s\n", op, sh, what, err, tol, ok ? "PASS" : "FAIL");
    fflush(stdout);
    if (!ok)
        e->failures++;
    free(xg);
    free(xc);
}

// lse entries [r0, r1) of each of the nh rows lse_s apart: a query that saw no key (-inf) must be -inf on
// both sides; the finite ones by relative error.
static void check_lse(struct env *e, const char *op, const char *sh, const float *hg, const float *hc, int nh,
                      size_t lse_s, int r0, int r1) {
    size_t n = (size_t)nh * (r1 - r0), k = 0;
    float *xg = malloc(n * sizeof(float) + 4), *xc = malloc(n * sizeof(float) + 4);
    int inf_ok = 1, n_inf = 0;
    for (int h = 0; h < nh; h++)
        for (int r = r0; r < r1; r++, k++) {
            float g = hg[(size_t)h * lse_s + r], c = hc[(size_t)h * lse_s + r];
            int gi = isinf(g) && g < 0, ci = isinf(c) && c < 0;
            if (gi != ci)
                inf_ok = 0;
            n_inf += ci;
            xg[k] = gi && ci ? 0.0f : g;
            xc[k] = gi && ci ? 0.0f : c;
        }
    double err = test_rel_err(xg, xc, n);
    int ok = inf_ok && err <= TOL_STAT;
    printf("%-16s %-44s %-8s rel_err %.2e  tol %.0e  (%d of %zu -inf: %s)  %s\n", op, sh, "lse", err,
           TOL_STAT, n_inf, n, inf_ok ? "same" : "DIFFER", ok ? "PASS" : "FAIL");
    fflush(stdout);
    if (!ok)
        e->failures++;
    free(xg);
    free(xc);
}

static void shuffle(int *x, int n, uint64_t *rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(test_rand_u64(rng) % (uint64_t)(i + 1)), t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}

static void block_attention_case(struct env *e, const struct blk_case *c) {
    struct blk_bufs u = {.c = c};
    int B = c->B, T = c->T, NH = c->NH, NKV = c->NKV, HS = c->HS, nqb = c->nqb, nkb = c->nqb + 1, S = T / nqb;
    if (T % nqb) { // the query blocks must tile the sequence, or the rows past nqb S are never computed
        fail_msg("block case T=%d: not a multiple of its %d query blocks", T, nqb);
        return;
    }
    size_t C = (size_t)NH * HS;
    u.W = (size_t)(NH + 2 * NKV) * HS + c->pad;
    u.rows = (size_t)T + (c->pad ? 1 : 0);
    u.ors = C + c->pad;
    u.lse_s = (size_t)T + c->pad;
    char sh[160];
    snprintf(sh, sizeof(sh), "B=%d T=%d NH=%d/%d HS=%d %s h0=%d/%d pad=%d base=%d", B, T, NH, NKV, HS,
             c->pos == KILN_POS_ROPE    ? "rope"
             : c->pos == KILN_POS_ALIBI ? "alibi"
                                        : "none",
             c->head0, c->NH_total, c->pad, c->base);
    size_t n_qkv = (size_t)B * u.rows * u.W, n_out = (size_t)B * u.rows * u.ors,
           n_lse = (size_t)B * NH * u.lse_s;
    u.qkv = pair_new(e, n_qkv, ACT);
    u.out = pair_new(e, n_out, ACT);
    u.lse = pair_new(e, n_lse, F32);
    u.dout = pair_new(e, n_out, ACT);
    u.dqkv = pair_new(e, n_qkv, ACT);
    pair_randn(&u.qkv, 1.0f);
    int kb_at[16]; // key block kb covers [kb_at[kb], kb_at[kb + 1]): not aligned with the query blocks
    for (int kb = 0; kb <= nkb; kb++)
        kb_at[kb] = kb * T / nkb;

    // one block alone, no accumulate: queries [S, 2S) against keys [0, 2S) (the diagonal inside the block)
    pair_poison(&u.out);
    pair_poison(&u.lse);
    struct kiln_attn_block_args a_c, a_g;
    blk_fwd_args(&a_c, &u, 0, S, S, 0, 2 * S, 0);
    blk_fwd_args(&a_g, &u, 1, S, S, 0, 2 * S, 0);
    RUN(e, attention_block_forward, &a);
    float *hc = pair_get(&u.out, 0), *hg = pair_get(&u.out, 1);
    check_rows(e, "attn_block_fwd", sh, "out", hg, hc, B, u.rows, S, 2 * S, u.ors, 0, C, TOL_ATTN);
    free(hc);
    free(hg);
    hc = pair_get(&u.lse, 0);
    hg = pair_get(&u.lse, 1);
    check_lse(e, "attn_block_fwd", sh, hg, hc, B * NH, u.lse_s, S, 2 * S);
    free(hc);
    free(hg);

    // a block no query sees, no accumulate: out = 0 and lse = -inf
    blk_fwd_args(&a_c, &u, 0, 0, S, S, S, 0);
    blk_fwd_args(&a_g, &u, 1, 0, S, S, S, 0);
    RUN(e, attention_block_forward, &a);
    hg = pair_get(&u.out, 1);
    float *lg = pair_get(&u.lse, 1);
    int zero = 1, ninf = 1;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++) {
            for (size_t d = 0; d < C; d++)
                zero &= hg[((size_t)b * u.rows + i) * u.ors + d] == 0.0f;
            for (int h = 0; h < NH; h++)
                ninf &= isinf(lg[((size_t)b * NH + h) * u.lse_s + i]) &&
                        lg[((size_t)b * NH + h) * u.lse_s + i] < 0;
        }
    expect(e, zero && ninf, "attn_block_fwd", "masked: out 0, lse -inf");
    free(hg);
    free(lg);

    // every (query block, key block) pair, key blocks in a shuffled order, merged with accumulate; query
    // block 0 starts with a key block it cannot see (lse -inf, out 0), which later blocks must replace
    pair_randn(&u.out, 1.0f); // overwritten by each query block's first call
    pair_randn(&u.lse, 1.0f);
    int order[16][16];
    for (int qb = 0; qb < nqb; qb++) {
        for (int k = 0; k < nkb; k++)
            order[qb][k] = k;
        shuffle(order[qb], nkb, &e->rng);
        if (qb == 0)
            for (int k = 1; k < nkb; k++)
                if (order[0][k] == nkb - 1) {
                    order[0][k] = order[0][0];
                    order[0][0] = nkb - 1;
                }
        for (int k = 0; k < nkb; k++) {
            int kb = order[qb][k];
            blk_fwd_args(&a_c, &u, 0, qb * S, S, kb_at[kb], kb_at[kb + 1] - kb_at[kb], k > 0);
            blk_fwd_args(&a_g, &u, 1, qb * S, S, kb_at[kb], kb_at[kb + 1] - kb_at[kb], k > 0);
            RUN(e, attention_block_forward, &a);
        }
    }
    float *oc = pair_get(&u.out, 0), *og = pair_get(&u.out, 1);
    float *lc = pair_get(&u.lse, 0);
    lg = pair_get(&u.lse, 1);
    check_rows(e, "attn_block_merge", sh, "out", og, oc, B, u.rows, 0, T, u.ors, 0, C, TOL_ATTN);
    check_lse(e, "attn_block_merge", sh, lg, lc, B * NH, u.lse_s, 0, T);

    // the merged blocks are causal attention over the whole sequence (where the layouts and slopes agree)
    int whole = c->pad == 0 && c->base == 0 &&
                (c->pos != KILN_POS_ALIBI || (c->head0 == 0 && (c->NH_total == 0 || c->NH_total == NH)));
    struct pair fout = {0}, flse = {0}, fd = {0};
    if (whole) {
        fout = pair_new(e, (size_t)B * T * C, ACT);
        flse = pair_new(e, (size_t)B * NH * T, F32);
        struct kiln_attn_args f = {fout.c, flse.c, u.qkv.c, B, T, NH, NKV, HS, c->pos, 10000.0f, 0};
        e->cpu.ops->attention_forward(e->cpu.ctx, &f);
        float *fo = pair_get(&fout, 0), *fl = pair_get(&flse, 0);
        check_rows(e, "attn_block_whole", sh, "out", og, fo, B, T, 0, T, C, 0, C, TOL_ATTN);
        check_rows(e, "attn_block_whole", sh, "lse", lg, fl, B * NH, T, 0, T, 1, 0, 1, TOL_STAT);
        free(fo);
        free(fl);
    }
    free(oc);
    free(og);
    free(lc);
    free(lg);

    // backward of every pair (each backend on its own merged out and lse), dq, dk, dv summed (+=) onto the
    // same small random values on both sides
    pair_randn(&u.dout, 1.0f);
    float *pre = malloc(n_qkv * sizeof(float) + 4);
    test_fill_normal(pre, n_qkv, 0.05f, &e->rng);
    pair_set(&u.dqkv, pre); // rounds pre to bf16 in place
    for (int qb = 0; qb < nqb; qb++)
        for (int k = nkb - 1; k >= 0; k--) { // another order than the forward's
            int kb = order[qb][k];
            struct kiln_attn_block_back_args b_c, b_g;
            blk_back_args(&b_c, &u, 0, qb * S, S, kb_at[kb], kb_at[kb + 1] - kb_at[kb]);
            blk_back_args(&b_g, &u, 1, qb * S, S, kb_at[kb], kb_at[kb + 1] - kb_at[kb]);
            RUN(e, attention_block_backward, &b);
        }
    hc = pair_get(&u.dqkv, 0);
    hg = pair_get(&u.dqkv, 1);
    size_t off[4] = {0, C, (size_t)(NH + NKV) * HS, (size_t)(NH + 2 * NKV) * HS};
    const char *names[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++)
        check_rows(e, "attn_block_bwd", sh, names[part], hg, hc, B, u.rows, 0, T, u.W, off[part],
                   off[part + 1] - off[part], TOL_ATTNB);
    if (whole) { // what the blocks added is the whole sequence's gradient
        size_t nd = (size_t)B * T * u.W;
        fd = pair_new(e, nd, ACT);
        struct kiln_attn_back_args f = {fd.c, u.dout.c, u.qkv.c, fout.c, flse.c,   B, T,
                                        NH,   NKV,      HS,      c->pos, 10000.0f, 0, 0};
        e->cpu.ops->attention_backward(e->cpu.ctx, &f);
        float *fdh = pair_get(&fd, 0);
        for (size_t i = 0; i < nd; i++)
            hg[i] -= pre[i];
        for (int part = 0; part < 3; part++)
            check_rows(e, "attn_block_whole", sh, names[part], hg, fdh, B, T, 0, T, u.W, off[part],
                       off[part + 1] - off[part], TOL_ATTNB);
        free(fdh);
        pair_free(&fout);
        pair_free(&flse);
        pair_free(&fd);
    }
    free(hc);
    free(hg);
    free(pre);
    struct pair *all[] = {&u.qkv, &u.out, &u.lse, &u.dout, &u.dqkv};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        pair_free(all[i]);
}

// The block op of sequence parallelism against the CPU: one block with and without keys it may see, then
// every pair of blocks merged in a shuffled order (a fully masked block first), and the backward summed over
// the pairs; where the layouts allow, the merge and the sums against whole-sequence attention too. RoPE at
// shifted global positions, ALiBi with global heads (head0 of NH_total, NH_total not a power of two), GQA
// groups of 1 to 4, HS from 32 to 256 (80: not a multiple of 32), odd strides and padded batches, B = 2.
// Every kernel family: the f32 ones, the tensor-core ones (HS 64 and 128) and the Hopper ones.
static void test_attention_block_matches_cpu(void **state) {
    struct env *e = *state;
    struct blk_case cases[] = {
        {2, 96, 4, 2, 64, KILN_POS_ROPE, 0, 0, 0, 0, 3},
        {1, 100, 4, 1, 128, KILN_POS_ALIBI, 4, 8, 1, 0, 4},
        {2, 64, 6, 3, 80, KILN_POS_NONE, 0, 0, 1, 0, 2},
        {1, 60, 2, 2, 256, KILN_POS_ROPE, 0, 0, 0, 3000, 3},
        {2, 48, 3, 3, 32, KILN_POS_ALIBI, 0, 0, 0, 0, 4},
        {1, 50, 2, 1, 64, KILN_POS_ALIBI, 3, 6, 1, 100, 2},
        {2, 130, 8, 2, 128, KILN_POS_ROPE, 0, 0, 0, 0, 2},
        {2, 200, 4, 2, 128, KILN_POS_NONE, 0, 0, 0, 0, 4},
        {1, 150, 4, 4, 64, KILN_POS_ROPE, 0, 0, 0, 500, 3},
        {1, 768, 4, 2, 128, KILN_POS_ROPE, 0, 0, 0, 0, 2}, // blocks of several query and key tiles
        // the first block (queries [130, 260) against keys [0, 260)): the wgmma forward's consumer 0 has a
        // key tile wholly after its rows, which it skips, or under ping-pong runs masked
        {1, 260, 4, 2, 128, KILN_POS_ROPE, 0, 0, 0, 0, 2},
    };
    // the f32 kernels (KILN_ATTN_BLOCK=ref) at every case, then the tensor-core ones (KILN_ATTN_BLOCK=tc)
    // and the Hopper ones (the default, KILN_ATTN_BLOCK=wgmma: the blocks whose queries come at or after
    // their keys, without ALiBi, on an sm_90 device; the tensor-core kernels take the rest) at the head sizes
    // they take
    // (the third pass: the Hopper forward's consumers each on its own, KILN_WGMMA_FWD=overlap, and one
    // consumer a tile's dQ, KILN_WGMMA_DQ=tma; the fourth: in turns and split, tma-split; the last: the
    // backward's dV and dK issued early, KILN_WGMMA_DQ=tma-early, then tma-early2, tma-dqfirst, and the
    // default, tma-dqpw)
    const char *kernels[8] = {"ref", "tc", "wgmma", "wgmma", "wgmma", "wgmma", "wgmma", "wgmma"};
    const char *fwd[8] = {"overlap",  "overlap",  "overlap",  "pingpong",
                          "pingpong", "pingpong", "pingpong", "pingpong"};
    const char *dq[8] = {"tma",       "tma",        "tma",         "tma-split",
                         "tma-early", "tma-early2", "tma-dqfirst", "tma-dqpw"};
    for (int k = 0; k < 8; k++) {
        printf("attention block kernels: KILN_ATTN_BLOCK=%s", kernels[k]);
        if (k >= 3)
            printf(", KILN_WGMMA_FWD=%s, KILN_WGMMA_DQ=%s", fwd[k], dq[k]);
        printf("\n");
        set_kernel(e, "KILN_ATTN_BLOCK", kernels[k]);
        set_kernel(e, "KILN_WGMMA_FWD", fwd[k]);
        set_kernel(e, "KILN_WGMMA_DQ", dq[k]);
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            if (k == 0 || cases[i].HS == 64 || cases[i].HS == 128)
                block_attention_case(e, &cases[i]);
        set_kernel(e, "KILN_ATTN_BLOCK", NULL);
        set_kernel(e, "KILN_WGMMA_FWD", NULL);
        set_kernel(e, "KILN_WGMMA_DQ", NULL);
    }
    end_test(e);
}

int main(void) {
    if (kiln_cuda_device_count() == 0) {
        printf("test_cuda_ops: no GPU: skipped (kiln_cuda_device_count() == 0)\n");
        return 77;
    }
    const char *filter = getenv("KILN_TEST_FILTER"); // e.g. "*wgmma*": only the tests whose names match
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    const char *skip = getenv("KILN_TEST_SKIP"); // e.g. "*wgmma*": every test but those
    if (skip && *skip)
        cmocka_set_skip_filter(skip);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_matches_cpu),
        cmocka_unit_test(test_embedding_with_split_positions_matches_cpu),
        cmocka_unit_test(test_norms_match_cpu),
        cmocka_unit_test(test_strided_norms_match_cpu),
        cmocka_unit_test(test_matmul_matches_cpu),
        cmocka_unit_test(test_attention_matches_cpu),
        cmocka_unit_test(test_attention_paths_match_cpu),
        cmocka_unit_test(test_attention_backward_modes_match_cpu),
        cmocka_unit_test(test_attention_decode_matches_cpu),
        cmocka_unit_test(test_attention_block_matches_cpu),
        cmocka_unit_test(test_strided_attention_matches_cpu),
        cmocka_unit_test(test_attention_wgmma_matches_cpu),
        cmocka_unit_test(test_attention_wgmma_backward_matches_cpu),
        cmocka_unit_test(test_strided_activations_match_cpu),
        cmocka_unit_test(test_swiglu_and_add_match_cpu),
        cmocka_unit_test(test_cross_entropy_matches_cpu),
        cmocka_unit_test(test_adamw_and_sum_squares_match_cpu),
        cmocka_unit_test(test_bf16_gradients_of_matmul_backward_match_cpu),
        cmocka_unit_test(test_bf16_gradients_of_norm_backward_match_cpu),
        cmocka_unit_test(test_bf16_gradients_of_embedding_backward_match_cpu),
        cmocka_unit_test(test_bf16_gradients_in_adamw_and_sum_squares_match_cpu),
        cmocka_unit_test(test_deterministic_mode_is_bitwise_repeatable),
        cmocka_unit_test(test_out_of_memory_returns_null_and_backend_still_works),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
