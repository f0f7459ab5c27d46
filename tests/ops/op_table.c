// The op table's rows: one per numerical op of struct kiln_ops (core/ops.h), here or, for a family of ops,
// in a file beside it (op_rows_attention.c); opt_rows at the end lists them all. op_table.h says what a row
// is; tests/unit/backend/test_op_table.c and tests/gpu/test_op_table_gpu.c run them.
//
// The ops of struct kiln_ops and their rows:
//   embed_forward, embed_backward            embedding
//   norm_forward, norm_backward              norm
//   matmul_forward, matmul_backward          matmul; matmul_gelu (the GELU epilogue, and its backward as the
//                                            next matmul's DGELU: dinp_gelu_pre)
//   gelu_forward                             gelu (its derivative through matmul_backward's DGELU)
//   attention_forward, attention_backward    attention
//   attention_decode                         attention_decode (no backward: the reference checks it)
//   attention_block_forward, _backward       attention_block
//   swiglu_forward, swiglu_backward          swiglu
//   add                                      add (no backward)
//   cross_entropy                            cross_entropy (its dloss mode is the backward)
//   cross_entropy_parallel                   cross_entropy_parallel (a vocabulary in parts)
//   sum_squares, accumulate_f32, adamw       sum_squares, accumulate_f32, adamw (no backward)
//   amax, fp8_cast, fp8_matmul, bias_backward  amax, fp8_matmul (the casts and the scaled GEMM, no backward:
//                                            a rounded function has no finite differences; the FP8 linear
//                                            layer's straight-through gradients are precision/'s tests),
//                                            bias_backward
// No numerics, so no rows: alloc, free, zero, copy, upload, download, upload_f32, download_f32 (the harness
// uses them on every row; the bf16 rounding of upload_f32 has a test in test_cpu_ops.c), synchronize,
// host_alloc, host_free, mem_peak, mem_free, event_create, event_destroy, event_record, event_synchronize,
// native_stream, copy_2d, copy_async, stream_wait, copy_side (copies and their ordering, tested where they
// are used: test_cpu_ops.c, test_cuda_ops.c, the sequence-parallel and offload tests).
// The strided (column-slice) arguments of the ops and the CUDA kernel families chosen by KILN_ATTN* are not
// rows' business: the hand-written tests cover them (test_cpu_strided_*.c, test_cuda_ops.c).
//
// Tolerances. On the CPU, a reference's relative error is fp32 rounding: a few 1e-7 at most, against
// thresholds from 1e-7 (one rounding) to 1e-5 (long sums). A finite difference (central, extrapolated:
// test_op_table.c) errs by the outputs' f32 rounding over its step plus O(step^4): each row's step below was
// chosen by sweeping it (KILN_OP_TABLE_FD_STEP), and the errors stay under 1e-4 over many seeds, against a
// threshold of 1e-3; a gradient 1% off is 1e-2. CUDA against the CPU takes test_cuda_ops.c's relative
// errors, squared: bf16 outputs 1e-2 (NMSE 1e-4), attention 2e-2 (4e-4) and its gradients 4e-2 (1.6e-3), f32
// parameter gradients from bf16 inputs 5e-3 (2.5e-5), f32 statistics 1e-3 (1e-6), optimizer state 1e-5
// (1e-10).
#include "ops/op_table.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"

// ---- double-precision helpers of the references -----------------------------------------------------------

// GPT-2's GELU, the tanh approximation
static double gelu_d(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// ==== rows ===============================================================================================

// ---- matmul_forward + matmul_backward ---------------------------------------------------------------------
// Fields: N, IC, OC; bias; accum (out += and dinp +=); assign (dweight, dbias =).

enum { MM_INP, MM_W, MM_B, MM_OUT, MM_DOUT, MM_DINP, MM_DW, MM_DB, MM_COUNT };

static int matmul_tensors(const struct opt_case *c, struct opt_tensor *t) {
    size_t N = c->N, IC = c->IC, OC = c->OC;
    t[MM_INP] = opt_input("inp", OPT_ACT, N * IC, 1.0f, 1);                      // (N, IC)
    t[MM_W] = opt_input("weight", OPT_ACT, OC * IC, 1.0f / sqrtf((float)IC), 1); // (OC, IC)
    t[MM_B] = opt_input("bias", OPT_ACT, c->bias ? OC : 0, 0.5f, 1);             // (OC)
    t[MM_OUT] = opt_output("out", OPT_ACT, N * OC, c->accum);                    // (N, OC)
    t[MM_DOUT] = opt_dout("dout", OPT_ACT, N * OC, MM_OUT);
    t[MM_DINP] = opt_dinput("dinp", OPT_ACT, N * IC, MM_INP, c->accum);
    t[MM_DW] = opt_dinput("dweight", OPT_GRAD, OC * IC, MM_W, !c->assign);
    t[MM_DB] = opt_dinput("dbias", OPT_GRAD, c->bias ? OC : 0, MM_B, !c->assign);
    return MM_COUNT;
}

static void matmul_fwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_matmul_args a = {.out = x->t[MM_OUT],
                                 .inp = x->t[MM_INP],
                                 .weight = x->t[MM_W],
                                 .bias = x->t[MM_B],
                                 .N = c->N,
                                 .IC = c->IC,
                                 .OC = c->OC,
                                 .act = KILN_ACT_NONE,
                                 .accumulate = c->accum};
    x->be->ops->matmul_forward(x->be->ctx, &a);
}

static void matmul_bwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_matmul_back_args a = {.dinp = x->t[MM_DINP],
                                      .dweight = x->t[MM_DW],
                                      .dbias = x->t[MM_DB],
                                      .dout = x->t[MM_DOUT],
                                      .inp = x->t[MM_INP],
                                      .weight = x->t[MM_W],
                                      .N = c->N,
                                      .IC = c->IC,
                                      .OC = c->OC,
                                      .dinp_accumulate = c->accum,
                                      .grad_assign = c->assign};
    x->be->ops->matmul_backward(x->be->ctx, &a);
}

// out (N, OC) = [out +] inp @ W^T + b
static void linear_d(double *out, const double *inp, const double *w, const double *b, int N, int IC, int OC,
                     int accum) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = (accum ? out[(size_t)n * OC + o] : 0.0) + (b ? b[o] : 0.0);
            for (int i = 0; i < IC; i++)
                s += inp[(size_t)n * IC + i] * w[(size_t)o * IC + i];
            out[(size_t)n * OC + o] = s;
        }
}

static void matmul_ref(const struct opt_case *c, double *const *v) {
    linear_d(v[MM_OUT], v[MM_INP], v[MM_W], v[MM_B], c->N, c->IC, c->OC, c->accum);
}

static double matmul_flops(const struct opt_case *c, int backward) {
    return (backward ? 4.0 : 2.0) * c->N * c->IC * c->OC;
}

static const struct opt_case matmul_fd[] = {
    {.N = 5, .IC = 7, .OC = 9, .bias = 1},
    {.N = 6, .IC = 16, .OC = 8, .accum = 1},
    {.N = 4, .IC = 9, .OC = 5, .bias = 1, .assign = 1},
    {.N = 3, .IC = 5, .OC = 4, .bias = 1, .accum = 1, .assign = 1},
    {.N = 64, .IC = 300, .OC = 40, .bias = 1, .assign = 1}, // past a panel (KC), and threaded
};
static const struct opt_case matmul_gpu[] = {
    {.N = 256, .IC = 768, .OC = 2304, .bias = 1, .assign = 1},
    {.N = 100, .IC = 72, .OC = 288, .bias = 1, .accum = 1},
    {.N = 33, .IC = 100, .OC = 36},
    {.N = 4096, .IC = 768, .OC = 3072, .bias = 1, .assign = 1},
};
static const struct opt_row row_matmul = {
    .name = "matmul",
    .ops = {OPT_OP(matmul_forward), OPT_OP(matmul_backward)},
    .about = "matmul_forward + matmul_backward: bias, out +=, dinp +=, dweight/dbias = or +=",
    .fd_cases = matmul_fd,
    .n_fd = OPT_COUNT(matmul_fd),
    .gpu_cases = matmul_gpu,
    .n_gpu = OPT_COUNT(matmul_gpu),
    .tensors = matmul_tensors,
    .forward = matmul_fwd,
    .backward = matmul_bwd,
    .reference = matmul_ref,
    .flops = matmul_flops,
    .tol = {.ref = 1e-5,
            .fd = 1e-3,
            .fd_step = 0.1,
            .out = OPT_NMSE_BF16,
            .stat = OPT_NMSE_STAT,
            .grad = OPT_NMSE_BF16,
            .pgrad = OPT_NMSE_F32G},
};

// ---- matmul_forward with the GELU epilogue + matmul_backward with DGELU -----------------------------------
// An MLP, out = gelu(inp @ W1^T + b1) @ W2^T + b2, as the model runs it: the first matmul's epilogue applies
// the GELU (and keeps pre), the second's backward multiplies its dinp by gelu'(pre) (cuBLASLt's DGELU).
// On CUDA the first matmul's weight gradients come from a dpre that is itself computed in bf16 (from the
// bf16 pre), not an exact input as in the matmul row: their threshold is bf16's, not f32 gradients'.
// Fields: N, IC, H (hidden), OC; accum (dinp +=); assign (parameter gradients =).

enum {
    MG_INP,
    MG_W1,
    MG_B1,
    MG_W2,
    MG_B2,
    MG_PRE,
    MG_HID,
    MG_OUT,
    MG_DOUT,
    MG_DPRE,
    MG_DINP,
    MG_DW1,
    MG_DB1,
    MG_DW2,
    MG_DB2,
    MG_COUNT
};

static int matmul_gelu_tensors(const struct opt_case *c, struct opt_tensor *t) {
    size_t N = c->N, IC = c->IC, H = c->H, OC = c->OC;
    t[MG_INP] = opt_input("inp", OPT_ACT, N * IC, 1.0f, 1);                     // (N, IC)
    t[MG_W1] = opt_input("w_fc", OPT_ACT, H * IC, 1.5f / sqrtf((float)IC), 1);  // (H, IC): pre of spread ~1.5
    t[MG_B1] = opt_input("b_fc", OPT_ACT, H, 0.5f, 1);                          // (H)
    t[MG_W2] = opt_input("w_proj", OPT_ACT, OC * H, 1.0f / sqrtf((float)H), 1); // (OC, H)
    t[MG_B2] = opt_input("b_proj", OPT_ACT, OC, 0.5f, 1);                       // (OC)
    t[MG_PRE] = opt_saved("pre", OPT_ACT, N * H);                               // (N, H)
    t[MG_HID] = opt_saved("hid", OPT_ACT, N * H);                               // (N, H) gelu(pre)
    t[MG_OUT] = opt_output("out", OPT_ACT, N * OC, 0);                          // (N, OC)
    t[MG_DOUT] = opt_dout("dout", OPT_ACT, N * OC, MG_OUT);
    t[MG_DPRE] = opt_scratch("dpre", OPT_ACT, N * H);
    t[MG_DINP] = opt_dinput("dinp", OPT_ACT, N * IC, MG_INP, c->accum);
    t[MG_DW1] = opt_dinput("dw_fc", OPT_GRAD, H * IC, MG_W1, !c->assign);
    t[MG_DB1] = opt_dinput("db_fc", OPT_GRAD, H, MG_B1, !c->assign);
    t[MG_DW2] = opt_dinput("dw_proj", OPT_GRAD, OC * H, MG_W2, !c->assign);
    t[MG_DB2] = opt_dinput("db_proj", OPT_GRAD, OC, MG_B2, !c->assign);
    return MG_COUNT;
}

static void matmul_gelu_fwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_matmul_args fc = {.out = x->t[MG_HID],
                                  .pre = x->t[MG_PRE],
                                  .inp = x->t[MG_INP],
                                  .weight = x->t[MG_W1],
                                  .bias = x->t[MG_B1],
                                  .N = c->N,
                                  .IC = c->IC,
                                  .OC = c->H,
                                  .act = KILN_ACT_GELU};
    x->be->ops->matmul_forward(x->be->ctx, &fc);
    struct kiln_matmul_args proj = {.out = x->t[MG_OUT],
                                    .inp = x->t[MG_HID],
                                    .weight = x->t[MG_W2],
                                    .bias = x->t[MG_B2],
                                    .N = c->N,
                                    .IC = c->H,
                                    .OC = c->OC};
    x->be->ops->matmul_forward(x->be->ctx, &proj);
}

static void matmul_gelu_bwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_matmul_back_args proj = {.dinp = x->t[MG_DPRE],
                                         .dweight = x->t[MG_DW2],
                                         .dbias = x->t[MG_DB2],
                                         .dout = x->t[MG_DOUT],
                                         .inp = x->t[MG_HID],
                                         .weight = x->t[MG_W2],
                                         .dinp_gelu_pre = x->t[MG_PRE],
                                         .N = c->N,
                                         .IC = c->H,
                                         .OC = c->OC,
                                         .grad_assign = c->assign};
    x->be->ops->matmul_backward(x->be->ctx, &proj);
    struct kiln_matmul_back_args fc = {.dinp = x->t[MG_DINP],
                                       .dweight = x->t[MG_DW1],
                                       .dbias = x->t[MG_DB1],
                                       .dout = x->t[MG_DPRE],
                                       .inp = x->t[MG_INP],
                                       .weight = x->t[MG_W1],
                                       .N = c->N,
                                       .IC = c->IC,
                                       .OC = c->H,
                                       .dinp_accumulate = c->accum,
                                       .grad_assign = c->assign};
    x->be->ops->matmul_backward(x->be->ctx, &fc);
}

static void matmul_gelu_ref(const struct opt_case *c, double *const *v) {
    size_t NH = (size_t)c->N * c->H;
    linear_d(v[MG_PRE], v[MG_INP], v[MG_W1], v[MG_B1], c->N, c->IC, c->H, 0);
    for (size_t i = 0; i < NH; i++)
        v[MG_HID][i] = gelu_d(v[MG_PRE][i]);
    linear_d(v[MG_OUT], v[MG_HID], v[MG_W2], v[MG_B2], c->N, c->H, c->OC, 0);
}

static double matmul_gelu_flops(const struct opt_case *c, int backward) {
    return (backward ? 4.0 : 2.0) * c->N * c->H * ((double)c->IC + c->OC);
}

static const struct opt_case matmul_gelu_fd[] = {
    {.N = 4, .IC = 6, .H = 10, .OC = 5},
    {.N = 3, .IC = 8, .H = 12, .OC = 4, .accum = 1, .assign = 1},
    {.N = 32, .IC = 48, .H = 64, .OC = 24},
};
static const struct opt_case matmul_gelu_gpu[] = {
    {.N = 256, .IC = 768, .H = 3072, .OC = 768, .assign = 1},
    {.N = 100, .IC = 72, .H = 288, .OC = 72, .accum = 1},
    {.N = 4096, .IC = 768, .H = 3072, .OC = 768, .assign = 1},
};
static const struct opt_row row_matmul_gelu = {
    .name = "matmul_gelu",
    .ops = {OPT_OP(matmul_forward), OPT_OP(matmul_backward)},
    .about = "matmul_forward's GELU epilogue and matmul_backward's DGELU (dinp_gelu_pre): an MLP",
    .fd_cases = matmul_gelu_fd,
    .n_fd = OPT_COUNT(matmul_gelu_fd),
    .gpu_cases = matmul_gelu_gpu,
    .n_gpu = OPT_COUNT(matmul_gelu_gpu),
    .tensors = matmul_gelu_tensors,
    .forward = matmul_gelu_fwd,
    .backward = matmul_gelu_bwd,
    .reference = matmul_gelu_ref,
    .flops = matmul_gelu_flops,
    .tol = {.ref = 1e-5,
            .fd = 1e-3,
            .fd_step = 0.03,
            .out = OPT_NMSE_BF16,
            .stat = OPT_NMSE_STAT,
            .grad = OPT_NMSE_BF16,
            .pgrad = OPT_NMSE_BF16},
};

// ---- gelu_forward -----------------------------------------------------------------------------------------
// The GELU on its own (the parallel block's, on a slice of a wider GEMM's output). It has no backward op:
// the model's is matmul_backward's DGELU, so the row's backward is that, through an identity weight
// (exact in bf16 too), and the finite differences check that the two agree. Fields: N, H.

enum { GE_X, GE_EYE, GE_OUT, GE_DOUT, GE_DX, GE_DEYE, GE_COUNT };

static int gelu_tensors(const struct opt_case *c, struct opt_tensor *t) {
    size_t N = c->N, H = c->H;
    t[GE_X] = opt_input("inp", OPT_ACT, N * H, 2.0f, 1); // (N, H): the tails and the bend
    t[GE_EYE] = opt_input("identity", OPT_ACT, H * H, 0, 0);
    t[GE_EYE].init = OPT_IDENTITY;
    t[GE_EYE].a = (float)H;
    t[GE_OUT] = opt_output("out", OPT_ACT, N * H, 0);
    t[GE_DOUT] = opt_dout("dout", OPT_ACT, N * H, GE_OUT);
    t[GE_DX] = opt_dinput("dinp", OPT_ACT, N * H, GE_X, 0);
    t[GE_DEYE] = opt_scratch("didentity", OPT_GRAD, H * H);
    return GE_COUNT;
}

static void gelu_fwd(const struct opt_args *x) {
    struct kiln_gelu_args a = {.out = x->t[GE_OUT], .inp = x->t[GE_X], .N = x->c->N, .H = x->c->H};
    x->be->ops->gelu_forward(x->be->ctx, &a);
}

static void gelu_bwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_matmul_back_args a = {.dinp = x->t[GE_DX],
                                      .dweight = x->t[GE_DEYE],
                                      .dout = x->t[GE_DOUT],
                                      .inp = x->t[GE_X],
                                      .weight = x->t[GE_EYE],
                                      .dinp_gelu_pre = x->t[GE_X],
                                      .N = c->N,
                                      .IC = c->H,
                                      .OC = c->H,
                                      .grad_assign = 1};
    x->be->ops->matmul_backward(x->be->ctx, &a);
}

static void gelu_ref(const struct opt_case *c, double *const *v) {
    for (size_t i = 0; i < (size_t)c->N * c->H; i++)
        v[GE_OUT][i] = gelu_d(v[GE_X][i]);
}

static const struct opt_case gelu_fd[] = {{.N = 6, .H = 9}, {.N = 64, .H = 1100}};
static const struct opt_case gelu_gpu[] = {{.N = 512, .H = 1024}, {.N = 37, .H = 100}};
static const struct opt_row row_gelu = {
    .name = "gelu",
    .ops = {OPT_OP(gelu_forward), OPT_OP(matmul_backward)},
    .about = "gelu_forward, its derivative through matmul_backward's DGELU",
    .fd_cases = gelu_fd,
    .n_fd = OPT_COUNT(gelu_fd),
    .gpu_cases = gelu_gpu,
    .n_gpu = OPT_COUNT(gelu_gpu),
    .tensors = gelu_tensors,
    .forward = gelu_fwd,
    .backward = gelu_bwd,
    .reference = gelu_ref,
    .tol = {.ref = 1e-6,
            .fd = 1e-3,
            .fd_step = 0.03,
            .out = OPT_NMSE_BF16,
            .stat = OPT_NMSE_STAT,
            .grad = OPT_NMSE_BF16,
            .pgrad = OPT_NMSE_F32G},
};

// ---- norm_forward + norm_backward -------------------------------------------------------------------------
// LayerNorm (with or without bias) and RMSNorm, alone or with the fused residual add (res_out = inp + res_in,
// normalized), and the residual biases: res_bias biases broadcast into res_in upstream (as the projections
// that add into the residual stream have), whose gradients the backward sums from the finished dinp
// (dres_bias). The loss weights out and res_out: the backward starts dinp from res_out's gradient (the
// stream's gradient from above) and adds the norm's, which is then the gradient of inp and res_in both.
// Fields: N, C; rms; bias; residual; res_bias; accum (dinp +=, without the residual); assign (parameter
// gradients =).

enum {
    NO_INP,
    NO_RES,
    NO_RB0,
    NO_RB1,
    NO_W,
    NO_B,
    NO_OUT,
    NO_RESOUT,
    NO_MEAN,
    NO_RSTD,
    NO_XS,
    NO_DOUT,
    NO_DRESOUT,
    NO_DINP,
    NO_DW,
    NO_DB,
    NO_DRB0,
    NO_DRB1,
    NO_COUNT
};

static int norm_tensors(const struct opt_case *c, struct opt_tensor *t) {
    size_t N = c->N, C = c->C, r = c->residual ? 1 : 0, lnb = !c->rms && c->bias;
    t[NO_INP] = opt_input("inp", OPT_ACT, N * C, 1.0f, 1);                               // (N, C)
    t[NO_RES] = opt_input("res_in", OPT_ACT, r * N * C, 1.0f, 1);                        // (N, C)
    t[NO_RB0] = opt_input("res_bias0", OPT_ACT, r && c->res_bias >= 1 ? C : 0, 0.5f, 1); // (C)
    t[NO_RB1] = opt_input("res_bias1", OPT_ACT, r && c->res_bias >= 2 ? C : 0, 0.5f, 1); // (C)
    t[NO_W] = opt_input("weight", OPT_ACT, C, 1.0f, 1);                                  // (C)
    t[NO_W].b = 1.0f;                                                                    // N(1, 1)
    t[NO_B] = opt_input("bias", OPT_ACT, lnb ? C : 0, 0.5f, 1);                          // (C)
    t[NO_OUT] = opt_output("out", OPT_ACT, N * C, 0);
    t[NO_RESOUT] = opt_output("res_out", OPT_ACT, r * N * C, 0);
    t[NO_MEAN] = opt_saved("mean", OPT_F32, c->rms ? 0 : N);
    t[NO_RSTD] = opt_saved("rstd", OPT_F32, N);
    // With the residual fused, CUDA normalizes the bf16-rounded sum that it stores as res_out (so that a
    // recompute from res_out reproduces it), the CPU the f32 sum: the means, near 0, differ by that rounding
    // over sqrt(C), relative to their spread a rounding's 2^-9/sqrt(3) (NMSE ~1.3e-6), whatever C is
    t[NO_MEAN].nmse = r ? 1e-5 : 0;
    t[NO_XS] = opt_scratch("res_in+biases", OPT_ACT, c->res_bias ? N * C : 0);
    t[NO_DOUT] = opt_dout("dout", OPT_ACT, N * C, NO_OUT);
    t[NO_DRESOUT] = opt_dout("dres_out", OPT_ACT, r * N * C, NO_RESOUT);
    t[NO_DINP] = opt_dinput("dinp", OPT_ACT, N * C, NO_INP, !r && c->accum);
    t[NO_DINP].of2 = r ? NO_RES : -1;
    t[NO_DW] = opt_dinput("dweight", OPT_GRAD, C, NO_W, !c->assign);
    t[NO_DB] = opt_dinput("dbias", OPT_GRAD, lnb ? C : 0, NO_B, !c->assign);
    t[NO_DRB0] = opt_dinput("dres_bias0", OPT_GRAD, t[NO_RB0].n, NO_RB0, !c->assign);
    t[NO_DRB1] = opt_dinput("dres_bias1", OPT_GRAD, t[NO_RB1].n, NO_RB1, !c->assign);
    return NO_COUNT;
}

static void norm_fwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    const void *res = x->t[NO_RES];
    if (c->res_bias) { // res_in + the biases, broadcast over the rows
        for (int n = 0; n < c->N; n++) {
            void *row = opt_act_at(x, x->t[NO_XS], (size_t)n * c->C);
            x->be->ops->add(x->be->ctx, row, opt_act_at(x, x->t[NO_RES], (size_t)n * c->C), x->t[NO_RB0],
                            c->C);
            if (x->t[NO_RB1])
                x->be->ops->add(x->be->ctx, row, row, x->t[NO_RB1], c->C);
        }
        res = x->t[NO_XS];
    }
    struct kiln_norm_args a = {.out = x->t[NO_OUT],
                               .mean = x->t[NO_MEAN],
                               .rstd = x->t[NO_RSTD],
                               .res_out = x->t[NO_RESOUT],
                               .inp = x->t[NO_INP],
                               .res_in = res,
                               .weight = x->t[NO_W],
                               .bias = x->t[NO_B],
                               .N = c->N,
                               .C = c->C,
                               .rms = c->rms,
                               .eps = 1e-5f};
    x->be->ops->norm_forward(x->be->ctx, &a);
}

static void norm_bwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    if (c->residual) // the stream's gradient from above, which the norm's backward adds to
        x->be->ops->copy(x->be->ctx, x->t[NO_DINP], x->t[NO_DRESOUT],
                         (size_t)c->N * c->C * kiln_dtype_bytes(x->be->act_dtype));
    struct kiln_norm_back_args a = {.dinp = x->t[NO_DINP],
                                    .dweight = x->t[NO_DW],
                                    .dbias = x->t[NO_DB],
                                    .dout = x->t[NO_DOUT],
                                    .inp = c->residual ? x->t[NO_RESOUT] : x->t[NO_INP],
                                    .weight = x->t[NO_W],
                                    .mean = x->t[NO_MEAN],
                                    .rstd = x->t[NO_RSTD],
                                    .N = c->N,
                                    .C = c->C,
                                    .rms = c->rms,
                                    .dinp_assign = !c->residual && !c->accum,
                                    .grad_assign = c->assign,
                                    .dres_bias = {x->t[NO_DRB0], x->t[NO_DRB1]}};
    x->be->ops->norm_backward(x->be->ctx, &a);
}

static void norm_ref(const struct opt_case *c, double *const *v) {
    int C = c->C;
    double *xr = malloc(sizeof(double) * C);
    for (int n = 0; n < c->N; n++) {
        for (int i = 0; i < C; i++) {
            size_t k = (size_t)n * C + i;
            xr[i] = v[NO_INP][k];
            if (c->residual) {
                xr[i] += v[NO_RES][k] + (v[NO_RB0] ? v[NO_RB0][i] : 0) + (v[NO_RB1] ? v[NO_RB1][i] : 0);
                v[NO_RESOUT][k] = xr[i];
            }
        }
        double mean = 0, var = 0;
        if (!c->rms) {
            for (int i = 0; i < C; i++)
                mean += xr[i];
            mean /= C;
        }
        for (int i = 0; i < C; i++)
            var += (xr[i] - mean) * (xr[i] - mean);
        double rstd = 1.0 / sqrt(var / C + 1e-5);
        for (int i = 0; i < C; i++)
            v[NO_OUT][(size_t)n * C + i] = (xr[i] - mean) * rstd * v[NO_W][i] + (v[NO_B] ? v[NO_B][i] : 0.0);
        if (v[NO_MEAN])
            v[NO_MEAN][n] = mean;
        v[NO_RSTD][n] = rstd;
    }
    free(xr);
}

static const struct opt_case norm_fd[] = {
    {.N = 4, .C = 12, .bias = 1},
    {.N = 3, .C = 16, .bias = 1, .accum = 1, .assign = 1},
    {.N = 4, .C = 10, .bias = 1, .residual = 1, .res_bias = 2},
    {.N = 2, .C = 9},
    {.N = 5, .C = 8, .rms = 1},
    {.N = 3, .C = 12, .rms = 1, .residual = 1, .res_bias = 1, .assign = 1},
    {.N = 96, .C = 700, .bias = 1, .residual = 1, .res_bias = 1}, // threaded
};
static const struct opt_case norm_gpu[] = {
    {.N = 256, .C = 768, .bias = 1, .residual = 1, .res_bias = 2, .assign = 1},
    {.N = 512, .C = 1024, .rms = 1, .accum = 1},
    {.N = 100, .C = 2560, .bias = 1},
    {.N = 64, .C = 100, .rms = 1, .residual = 1, .res_bias = 1},
    {.N = 33, .C = 4096, .bias = 1, .residual = 1, .assign = 1},
};
static const struct opt_row row_norm = {
    .name = "norm",
    .ops = {OPT_OP(norm_forward), OPT_OP(norm_backward), OPT_OP(add)},
    .about = "norm_forward + norm_backward: LayerNorm, RMSNorm, fused residual add, dres_bias, = and +=",
    .fd_cases = norm_fd,
    .n_fd = OPT_COUNT(norm_fd),
    .gpu_cases = norm_gpu,
    .n_gpu = OPT_COUNT(norm_gpu),
    .tensors = norm_tensors,
    .forward = norm_fwd,
    .backward = norm_bwd,
    .reference = norm_ref,
    .tol = {.ref = 1e-5,
            .fd = 1e-3,
            .fd_step = 0.03,
            .out = OPT_NMSE_BF16,
            .stat = OPT_NMSE_STAT,
            .grad = OPT_NMSE_BF16,
            .pgrad = OPT_NMSE_F32G},
};

// ---- embed_forward + embed_backward -----------------------------------------------------------------------
// Token rows (of a padded table: rows V..Vp never read, their gradient stays what it was) plus learned
// positions, in one run (maxT >= T rows) or two (sequence parallelism's pos_split). Repeated tokens add into
// one gradient row. Fields: B, T, C, V, Vp; learned, maxT; split.

enum { EM_TOK, EM_WTE, EM_WPE, EM_WPEHI, EM_OUT, EM_DOUT, EM_DWTE, EM_DWPE, EM_DWPEHI, EM_COUNT };

static int embed_tensors(const struct opt_case *c, struct opt_tensor *t) {
    size_t BT = (size_t)c->B * c->T, C = c->C;
    size_t lo = !c->learned ? 0 : c->split ? (size_t)c->split : (size_t)(c->maxT ? c->maxT : c->T);
    size_t hi = c->learned && c->split ? (size_t)(c->T - c->split) : 0;
    t[EM_TOK] = opt_input("tokens", OPT_I32, BT, 0, 0);
    t[EM_TOK].init = OPT_INTS;
    t[EM_TOK].b = (float)c->V;
    size_t rows = c->vocab_n ? (size_t)c->vocab_n : (size_t)c->Vp;
    t[EM_WTE] = opt_input("wte", OPT_ACT, rows * C, 1.0f, 1); // (Vp, C), or the vocab_n rows a rank holds
    t[EM_WPE] = opt_input("wpe", OPT_ACT, lo * C, 1.0f, 1);            // (maxT or split, C)
    t[EM_WPEHI] = opt_input("wpe_hi", OPT_ACT, hi * C, 1.0f, 1);       // (T - split, C)
    t[EM_OUT] = opt_output("out", OPT_ACT, BT * C, 0);                 // (B*T, C)
    t[EM_DOUT] = opt_dout("dout", OPT_ACT, BT * C, EM_OUT);
    t[EM_DWTE] = opt_dinput("dwte", OPT_GRAD, t[EM_WTE].n, EM_WTE, 1);
    t[EM_DWPE] = opt_dinput("dwpe", OPT_GRAD, t[EM_WPE].n, EM_WPE, 1);
    t[EM_DWPEHI] = opt_dinput("dwpe_hi", OPT_GRAD, t[EM_WPEHI].n, EM_WPEHI, 1);
    return EM_COUNT;
}

static void embed_fwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_embed_args a = {.out = x->t[EM_OUT],
                                .tokens = x->t[EM_TOK],
                                .tokens_host = x->host[EM_TOK],
                                .wte = x->t[EM_WTE],
                                .wpe = x->t[EM_WPE],
                                .B = c->B,
                                .T = c->T,
                                .C = c->C,
                                .wpe_hi = x->t[EM_WPEHI],
                                .pos_split = c->split,
                                .vocab_lo = c->vocab_lo,
                                .vocab_n = c->vocab_n};
    x->be->ops->embed_forward(x->be->ctx, &a);
}

static void embed_bwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_embed_back_args a = {.dwte = x->t[EM_DWTE],
                                     .dwpe = x->t[EM_DWPE],
                                     .dout = x->t[EM_DOUT],
                                     .tokens = x->t[EM_TOK],
                                     .tokens_host = x->host[EM_TOK],
                                     .B = c->B,
                                     .T = c->T,
                                     .C = c->C,
                                     .dwpe_hi = x->t[EM_DWPEHI],
                                     .pos_split = c->split,
                                     .vocab_lo = c->vocab_lo,
                                     .vocab_n = c->vocab_n};
    x->be->ops->embed_backward(x->be->ctx, &a);
}

static void embed_ref(const struct opt_case *c, double *const *v) {
    int C = c->C, T = c->T;
    for (int n = 0; n < c->B * T; n++) {
        int tok = (int)v[EM_TOK][n], t = n % T;
        const double *p = !c->learned                 ? NULL
                          : c->split && t >= c->split ? v[EM_WPEHI] + (size_t)(t - c->split) * C
                                                      : v[EM_WPE] + (size_t)t * C;
        int row = c->vocab_n ? tok - c->vocab_lo : tok; // a token outside a vocabulary slice reads zeros
        int held = !c->vocab_n || (row >= 0 && row < c->vocab_n);
        for (int i = 0; i < C; i++)
            v[EM_OUT][(size_t)n * C + i] = (held ? v[EM_WTE][(size_t)row * C + i] : 0.0) + (p ? p[i] : 0.0);
    }
}

static const struct opt_case embed_fd[] = {
    {.B = 2, .T = 6, .C = 5, .V = 7, .Vp = 8, .learned = 1, .maxT = 8},
    {.B = 3, .T = 4, .C = 4, .V = 3, .Vp = 8},
    {.B = 2, .T = 6, .C = 6, .V = 9, .Vp = 16, .learned = 1, .split = 4},
    {.B = 4, .T = 64, .C = 256, .V = 50, .Vp = 64, .learned = 1, .maxT = 80}, // threaded
    {.B = 2, .T = 8, .C = 4, .V = 15, .Vp = 16, .vocab_lo = 4, .vocab_n = 4}, // tensor parallelism's slice
    {.B = 2, .T = 6, .C = 5, .V = 7, .Vp = 8, .learned = 1, .maxT = 8, .vocab_lo = 4, .vocab_n = 4}, // the last
};
static const struct opt_case embed_gpu[] = {
    {.B = 8, .T = 1024, .C = 768, .V = 50257, .Vp = 50304, .learned = 1, .maxT = 1024},
    {.B = 4, .T = 512, .C = 100, .V = 1000, .Vp = 1024},
    {.B = 3, .T = 2048, .C = 256, .V = 300, .Vp = 384, .learned = 1, .split = 1000}, // > 4096 sort keys
    {.B = 2, .T = 333, .C = 64, .V = 3, .Vp = 128, .learned = 1, .maxT = 400},       // long runs of a token
    {.B = 4, .T = 512, .C = 256, .V = 1000, .Vp = 1024, .vocab_lo = 256, .vocab_n = 256}, // a TP slice
};
static const struct opt_row row_embed = {
    .name = "embedding",
    .ops = {OPT_OP(embed_forward), OPT_OP(embed_backward)},
    .about = "embed_forward + embed_backward: padded table, learned positions in one or two runs",
    .fd_cases = embed_fd,
    .n_fd = OPT_COUNT(embed_fd),
    .gpu_cases = embed_gpu,
    .n_gpu = OPT_COUNT(embed_gpu),
    .tensors = embed_tensors,
    .forward = embed_fwd,
    .backward = embed_bwd,
    .reference = embed_ref,
    .tol = {.ref = 1e-6,
            .fd = 1e-3,
            .fd_step = 0.1,
            .out = OPT_NMSE_BF16,
            .stat = OPT_NMSE_STAT,
            .grad = OPT_NMSE_BF16,
            .pgrad = OPT_NMSE_F32G},
};

// ---- swiglu_forward + swiglu_backward ---------------------------------------------------------------------
// out = silu(gate) * up over rows [gate (H) | up (H)]. Fields: N, H.

enum { SW_INP, SW_OUT, SW_DOUT, SW_DINP, SW_COUNT };

static int swiglu_tensors(const struct opt_case *c, struct opt_tensor *t) {
    t[SW_INP] = opt_input("inp", OPT_ACT, (size_t)c->N * 2 * c->H, 1.5f, 1); // (N, 2H)
    t[SW_OUT] = opt_output("out", OPT_ACT, (size_t)c->N * c->H, 0);          // (N, H)
    t[SW_DOUT] = opt_dout("dout", OPT_ACT, t[SW_OUT].n, SW_OUT);
    t[SW_DINP] = opt_dinput("dinp", OPT_ACT, t[SW_INP].n, SW_INP, 0);
    return SW_COUNT;
}

static void swiglu_fwd(const struct opt_args *x) {
    struct kiln_swiglu_args a = {.out = x->t[SW_OUT], .inp = x->t[SW_INP], .N = x->c->N, .H = x->c->H};
    x->be->ops->swiglu_forward(x->be->ctx, &a);
}

static void swiglu_bwd(const struct opt_args *x) {
    struct kiln_swiglu_back_args a = {
        .dinp = x->t[SW_DINP], .dout = x->t[SW_DOUT], .inp = x->t[SW_INP], .N = x->c->N, .H = x->c->H};
    x->be->ops->swiglu_backward(x->be->ctx, &a);
}

static void swiglu_ref(const struct opt_case *c, double *const *v) {
    int H = c->H;
    for (int n = 0; n < c->N; n++)
        for (int i = 0; i < H; i++) {
            double g = v[SW_INP][(size_t)n * 2 * H + i], u = v[SW_INP][(size_t)n * 2 * H + H + i];
            v[SW_OUT][(size_t)n * H + i] = g / (1.0 + exp(-g)) * u;
        }
}

static const struct opt_case swiglu_fd[] = {{.N = 4, .H = 6}, {.N = 3, .H = 9}, {.N = 64, .H = 1100}};
static const struct opt_case swiglu_gpu[] = {{.N = 512, .H = 2048}, {.N = 100, .H = 100}, {.N = 7, .H = 36}};
static const struct opt_row row_swiglu = {
    .name = "swiglu",
    .ops = {OPT_OP(swiglu_forward), OPT_OP(swiglu_backward)},
    .about = "swiglu_forward + swiglu_backward",
    .fd_cases = swiglu_fd,
    .n_fd = OPT_COUNT(swiglu_fd),
    .gpu_cases = swiglu_gpu,
    .n_gpu = OPT_COUNT(swiglu_gpu),
    .tensors = swiglu_tensors,
    .forward = swiglu_fwd,
    .backward = swiglu_bwd,
    .reference = swiglu_ref,
    .tol = {.ref = 1e-6,
            .fd = 1e-3,
            .fd_step = 0.1,
            .out = OPT_NMSE_BF16,
            .stat = OPT_NMSE_STAT,
            .grad = OPT_NMSE_BF16,
            .pgrad = OPT_NMSE_F32G},
};

// ---- cross_entropy ----------------------------------------------------------------------------------------
// Losses over the real vocab V of padded (N, Vp) logits, with z-loss and ignored targets (-1: every fifth).
// The op takes its loss weight as a scalar (dloss), so the loss is dloss * sum(losses): its weights are that
// constant, and the backward is the op's dloss mode (dlogits in place of a copy of the logits). Fields: N,
// V, Vp; z_loss, dloss.

enum { XE_LOGITS, XE_TGT, XE_LOSSES, XE_DLOSSES, XE_DLOGITS, XE_SCRATCH, XE_COUNT };

static int xent_tensors(const struct opt_case *c, struct opt_tensor *t) {
    t[XE_LOGITS] = opt_input("logits", OPT_ACT, (size_t)c->N * c->Vp, 2.0f, 1); // (N, Vp)
    t[XE_TGT] = opt_input("targets", OPT_I32, c->N, 0, 0);
    t[XE_TGT].init = OPT_TARGETS;
    t[XE_TGT].b = (float)c->V;
    t[XE_LOSSES] = opt_output("losses", OPT_F32, c->N, 0);
    t[XE_DLOSSES] = opt_dout("dlosses", OPT_F32, c->N, XE_LOSSES);
    t[XE_DLOSSES].init = OPT_CONST;
    t[XE_DLOSSES].a = c->dloss;
    t[XE_DLOGITS] = opt_dinput("dlogits", OPT_ACT, t[XE_LOGITS].n, XE_LOGITS, 0);
    t[XE_SCRATCH] = opt_scratch("losses2", OPT_F32, c->N);
    return XE_COUNT;
}

static void xent_fwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_xent_args a = {.logits = x->t[XE_LOGITS],
                               .losses = x->t[XE_LOSSES],
                               .targets = x->t[XE_TGT],
                               .N = c->N,
                               .V = c->V,
                               .Vp = c->Vp,
                               .z_loss = c->z_loss};
    x->be->ops->cross_entropy(x->be->ctx, &a);
}

static void xent_bwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    x->be->ops->copy(x->be->ctx, x->t[XE_DLOGITS], x->t[XE_LOGITS],
                     (size_t)c->N * c->Vp * kiln_dtype_bytes(x->be->act_dtype));
    struct kiln_xent_args a = {.logits = x->t[XE_DLOGITS],
                               .losses = x->t[XE_SCRATCH],
                               .targets = x->t[XE_TGT],
                               .N = c->N,
                               .V = c->V,
                               .Vp = c->Vp,
                               .dloss = c->dloss,
                               .z_loss = c->z_loss};
    x->be->ops->cross_entropy(x->be->ctx, &a);
}

static void xent_ref(const struct opt_case *c, double *const *v) {
    for (int n = 0; n < c->N; n++) {
        const double *row = v[XE_LOGITS] + (size_t)n * c->Vp;
        int tgt = (int)v[XE_TGT][n];
        int jmax = 0; // logsumexp over the real vocab, around its largest logit (whose own term is 1)
        for (int j = 1; j < c->V; j++)
            jmax = row[j] > row[jmax] ? j : jmax;
        double s = 1.0;
        for (int j = 0; j < c->V; j++)
            s += j == jmax ? 0.0 : exp(row[j] - row[jmax]);
        double lse = row[jmax] + log(s);
        v[XE_LOSSES][n] = tgt < 0 ? 0.0 : lse - row[tgt] + c->z_loss * lse * lse;
    }
}

static const struct opt_case xent_fd[] = {
    {.N = 6, .V = 7, .Vp = 8, .dloss = 0.5f},
    {.N = 5, .V = 10, .Vp = 16, .z_loss = 0.5f, .dloss = 0.2f}, // the z-loss term dominates its gradient
    {.N = 256, .V = 250, .Vp = 256, .z_loss = 1e-4f, .dloss = 1.0f / 256}, // threaded
};
static const struct opt_case xent_gpu[] = {
    {.N = 256, .V = 50257, .Vp = 50304, .dloss = 1.0f / 256},
    {.N = 100, .V = 1000, .Vp = 1024, .z_loss = 1e-4f, .dloss = 0.01f},
    {.N = 64, .V = 65, .Vp = 128, .dloss = 1.0f / 64},
    {.N = 8, .V = 128256, .Vp = 128256, .z_loss = 1e-4f, .dloss = 0.125f}, // rows wider than one pass
};
static const struct opt_row row_xent = {
    .name = "cross_entropy",
    .ops = {OPT_OP(cross_entropy)},
    .about = "cross_entropy: padded vocab, z-loss, ignored targets; dloss mode as its backward",
    .fd_cases = xent_fd,
    .n_fd = OPT_COUNT(xent_fd),
    .gpu_cases = xent_gpu,
    .n_gpu = OPT_COUNT(xent_gpu),
    .tensors = xent_tensors,
    .forward = xent_fwd,
    .backward = xent_bwd,
    .reference = xent_ref,
    .tol = {.ref = 1e-6,
            .fd = 1e-3,
            .fd_step = 0.2,
            .out = OPT_NMSE_BF16,
            .stat = OPT_NMSE_STAT,
            .grad = OPT_NMSE_BF16,
            .pgrad = OPT_NMSE_F32G},
};

// ---- add --------------------------------------------------------------------------------------------------
// out = a + b elementwise (act). No backward. Fields: P.

enum { AD_A, AD_B, AD_OUT, AD_COUNT };

static int add_tensors(const struct opt_case *c, struct opt_tensor *t) {
    t[AD_A] = opt_input("a", OPT_ACT, c->P, 1.0f, 0);
    t[AD_B] = opt_input("b", OPT_ACT, c->P, 1.0f, 0);
    t[AD_OUT] = opt_output("out", OPT_ACT, c->P, 0);
    return AD_COUNT;
}

static void add_fwd(const struct opt_args *x) {
    x->be->ops->add(x->be->ctx, x->t[AD_OUT], x->t[AD_A], x->t[AD_B], x->c->P);
}

static void add_ref(const struct opt_case *c, double *const *v) {
    for (size_t i = 0; i < c->P; i++)
        v[AD_OUT][i] = v[AD_A][i] + v[AD_B][i];
}

static const struct opt_case add_fd[] = {{.P = 37}, {.P = 100000}};
static const struct opt_case add_gpu[] = {{.P = 1 << 22}, {.P = 1001}};
static const struct opt_row row_add = {
    .name = "add",
    .ops = {OPT_OP(add)},
    .about = "add (no backward)",
    .fd_cases = add_fd,
    .n_fd = OPT_COUNT(add_fd),
    .gpu_cases = add_gpu,
    .n_gpu = OPT_COUNT(add_gpu),
    .tensors = add_tensors,
    .forward = add_fwd,
    .reference = add_ref,
    .tol = {.ref = 1e-7, .out = OPT_NMSE_BF16, .stat = OPT_NMSE_STAT},
};

// ---- accumulate_f32 ---------------------------------------------------------------------------------------
// out += x (f32). No backward. Fields: P.

enum { AC_OUT, AC_X, AC_COUNT };

static int accumulate_tensors(const struct opt_case *c, struct opt_tensor *t) {
    t[AC_OUT] = opt_input("out", OPT_F32, c->P, 1.0f, 0);
    t[AC_OUT].role = OPT_INOUT;
    t[AC_X] = opt_input("x", OPT_F32, c->P, 1.0f, 0);
    t[AC_OUT].nmse = 1e-14; // f32 adds, one rounding each
    return AC_COUNT;
}

static void accumulate_fwd(const struct opt_args *x) {
    x->be->ops->accumulate_f32(x->be->ctx, x->t[AC_OUT], x->t[AC_X], x->c->P);
}

static void accumulate_ref(const struct opt_case *c, double *const *v) {
    for (size_t i = 0; i < c->P; i++)
        v[AC_OUT][i] += v[AC_X][i];
}

static const struct opt_case accumulate_fd[] = {{.P = 37}, {.P = 100000}};
static const struct opt_case accumulate_gpu[] = {{.P = (1 << 22) + 3}};
static const struct opt_row row_accumulate = {
    .name = "accumulate_f32",
    .ops = {OPT_OP(accumulate_f32)},
    .about = "accumulate_f32 (no backward)",
    .fd_cases = accumulate_fd,
    .n_fd = OPT_COUNT(accumulate_fd),
    .gpu_cases = accumulate_gpu,
    .n_gpu = OPT_COUNT(accumulate_gpu),
    .tensors = accumulate_tensors,
    .forward = accumulate_fwd,
    .reference = accumulate_ref,
    .tol = {.ref = 1e-7, .out = OPT_NMSE_BF16, .stat = OPT_NMSE_STAT},
};

// ---- sum_squares ------------------------------------------------------------------------------------------
// sum(g^2) over P gradients (grad dtype), returned in double: the row stores it as a one-element f32 output.
// No backward. Fields: P.

enum { SS_G, SS_OUT, SS_COUNT };

static int sum_squares_tensors(const struct opt_case *c, struct opt_tensor *t) {
    t[SS_G] = opt_input("grads", OPT_GRAD, c->P, 1.0f, 0);
    t[SS_OUT] = opt_output("sum", OPT_F32, 1, 0);
    t[SS_OUT].nmse = 1e-12; // accumulated in f32/f64 by both: summation order only
    return SS_COUNT;
}

static void sum_squares_fwd(const struct opt_args *x) {
    float s = (float)x->be->ops->sum_squares(x->be->ctx, x->t[SS_G], x->c->P);
    x->be->ops->upload_f32(x->be->ctx, x->t[SS_OUT], KILN_F32, &s, 1);
}

static void sum_squares_ref(const struct opt_case *c, double *const *v) {
    double s = 0;
    for (size_t i = 0; i < c->P; i++)
        s += v[SS_G][i] * v[SS_G][i];
    v[SS_OUT][0] = s;
}

static const struct opt_case sum_squares_fd[] = {{.P = 1000}, {.P = 200000}};
static const struct opt_case sum_squares_gpu[] = {{.P = 100000}, {.P = 3}, {.P = 1 << 24}};
static const struct opt_row row_sum_squares = {
    .name = "sum_squares",
    .ops = {OPT_OP(sum_squares)},
    .about = "sum_squares (no backward)",
    .fd_cases = sum_squares_fd,
    .n_fd = OPT_COUNT(sum_squares_fd),
    .gpu_cases = sum_squares_gpu,
    .n_gpu = OPT_COUNT(sum_squares_gpu),
    .tensors = sum_squares_tensors,
    .forward = sum_squares_fwd,
    .reference = sum_squares_ref,
    .tol = {.ref = 1e-7, .out = OPT_NMSE_BF16, .stat = OPT_NMSE_STAT},
};

// ---- adamw ------------------------------------------------------------------------------------------------
// PyTorch's AdamW over spans of one flat buffer (decay and no-decay spans, span edges at odd offsets), with
// the compute copy written (bf16 on CUDA, stochastically rounded where asked). No backward. Fields: P, step,
// stochastic.

enum { AW_P, AW_W, AW_G, AW_M, AW_V, AW_COUNT };

#define ADAMW_LR 1e-2f
#define ADAMW_BETA1 0.9f
#define ADAMW_BETA2 0.95f
#define ADAMW_EPS 1e-8f
#define ADAMW_WD 0.1f
#define ADAMW_GRAD_SCALE 0.5f

// four spans: decay, one no-decay element, no decay, decay
static int adamw_spans(size_t P, struct kiln_param_span *s) {
    size_t a = P / 3, b = a + 1, c = P / 2 + 7 < P ? P / 2 + 7 : P;
    s[0] = (struct kiln_param_span){0, a, 1, 0};
    s[1] = (struct kiln_param_span){a, 1, 0, a};
    s[2] = (struct kiln_param_span){b, c - b, 0, b};
    s[3] = (struct kiln_param_span){c, P - c, 1, c};
    return 4;
}

static int adamw_tensors(const struct opt_case *c, struct opt_tensor *t) {
    t[AW_P] = opt_input("params", OPT_F32, c->P, 1.0f, 0);
    t[AW_W] = opt_output("weights", OPT_ACT, c->P, 0);
    t[AW_G] = opt_input("grads", OPT_GRAD, c->P, 0.01f, 0);
    t[AW_M] = opt_input("m", OPT_F32, c->P, 0.005f, 0);
    t[AW_V] = opt_input("v", OPT_F32, c->P, 0, 0);
    t[AW_V].init = OPT_UNIFORM;
    t[AW_V].b = 1e-4f;
    t[AW_P].role = t[AW_M].role = t[AW_V].role = OPT_INOUT;
    t[AW_P].nmse = t[AW_M].nmse = t[AW_V].nmse = 1e-10;
    return AW_COUNT;
}

static void adamw_fwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    struct kiln_param_span spans[4];
    struct kiln_adamw_args a = {.params = x->t[AW_P],
                                .weights = x->t[AW_W],
                                .grads = x->t[AW_G],
                                .m = x->t[AW_M],
                                .v = x->t[AW_V],
                                .spans = spans,
                                .n_spans = adamw_spans(c->P, spans),
                                .lr = ADAMW_LR,
                                .beta1 = ADAMW_BETA1,
                                .beta2 = ADAMW_BETA2,
                                .eps = ADAMW_EPS,
                                .weight_decay = ADAMW_WD,
                                .grad_scale = ADAMW_GRAD_SCALE,
                                .step = c->step,
                                .stochastic_rounding = c->stochastic,
                                .seed = 1234};
    x->be->ops->adamw(x->be->ctx, &a);
}

static void adamw_ref(const struct opt_case *c, double *const *v) {
    struct kiln_param_span spans[4];
    int n = adamw_spans(c->P, spans);
    double b1 = ADAMW_BETA1, b2 = ADAMW_BETA2, lr = ADAMW_LR;
    double bc1 = 1 - pow(b1, c->step), bc2 = 1 - pow(b2, c->step);
    for (int s = 0; s < n; s++)
        for (size_t i = spans[s].offset; i < spans[s].offset + spans[s].count; i++) {
            double g = v[AW_G][i] * ADAMW_GRAD_SCALE, *p = &v[AW_P][i], *m = &v[AW_M][i], *vv = &v[AW_V][i];
            *m = b1 * *m + (1 - b1) * g;
            *vv = b2 * *vv + (1 - b2) * g * g;
            if (spans[s].decay)
                *p *= 1 - lr * ADAMW_WD;
            *p -= lr / bc1 * *m / (sqrt(*vv) / sqrt(bc2) + ADAMW_EPS);
            v[AW_W][i] = *p;
        }
}

static const struct opt_case adamw_fd[] = {
    {.P = 50, .step = 1}, {.P = 33, .step = 3}, {.P = 70000, .step = 2}};
static const struct opt_case adamw_gpu[] = {
    {.P = 100000, .step = 3},
    {.P = 100000, .step = 1, .stochastic = 1},
    {.P = 3 * 65536 + 1, .step = 7},
    {.P = 1 << 24, .step = 2},
};
static const struct opt_row row_adamw = {
    .name = "adamw",
    .ops = {OPT_OP(adamw)},
    .about = "adamw over spans, with the compute copy (no backward)",
    .fd_cases = adamw_fd,
    .n_fd = OPT_COUNT(adamw_fd),
    .gpu_cases = adamw_gpu,
    .n_gpu = OPT_COUNT(adamw_gpu),
    .tensors = adamw_tensors,
    .forward = adamw_fwd,
    .reference = adamw_ref,
    .tol = {.ref = 1e-6, .out = OPT_NMSE_BF16, .stat = OPT_NMSE_STAT},
};

// ---- cross_entropy_parallel ---------------------------------------------------------------------------
// The vocabulary-parallel loss's three phases, for a vocabulary cut into `parts` column slices of Vp / parts
// (each slice's logits contiguous, as a tensor-parallel rank holds them: logits are (parts, N, Vl)), with the
// reductions across the parts between the phases done on the host, as the ranks' all-reduces do. Its losses
// and dlogits are cross_entropy's. Fields: N, V, Vp, parts; z_loss, dloss.

enum { XP_LOGITS, XP_TGT, XP_LOSSES, XP_DLOSSES, XP_DLOGITS, XP_STATS, XP_LOSSES2, XP_COUNT };

static int xpar_tensors(const struct opt_case *c, struct opt_tensor *t) {
    t[XP_LOGITS] = opt_input("logits", OPT_ACT, (size_t)c->N * c->Vp, 2.0f, 1); // (parts, N, Vp / parts)
    t[XP_TGT] = opt_input("targets", OPT_I32, c->N, 0, 0);
    t[XP_TGT].init = OPT_TARGETS;
    t[XP_TGT].b = (float)c->V;
    t[XP_LOSSES] = opt_output("losses", OPT_F32, c->N, 0);
    t[XP_DLOSSES] = opt_dout("dlosses", OPT_F32, c->N, XP_LOSSES);
    t[XP_DLOSSES].init = OPT_CONST;
    t[XP_DLOSSES].a = c->dloss;
    t[XP_DLOGITS] = opt_dinput("dlogits", OPT_ACT, t[XP_LOGITS].n, XP_LOGITS, 0);
    t[XP_STATS] = opt_scratch("stats", OPT_F32, (size_t)c->parts * 3 * c->N); // (parts, 3, N)
    t[XP_LOSSES2] = opt_scratch("losses2", OPT_F32, (size_t)c->N);
    return XP_COUNT;
}

// Reduces stats row `which` (0 max, 1 sum, 2 target logit) over the parts, into every part's copy
static void xpar_reduce(const struct opt_args *x, int which) {
    const struct opt_case *c = x->c;
    size_t N = (size_t)c->N, n = (size_t)c->parts * 3 * N;
    float *h = malloc(n * sizeof(float));
    x->be->ops->download(x->be->ctx, h, x->t[XP_STATS], n * sizeof(float));
    for (size_t i = 0; i < N; i++) {
        float r = h[which * N + i];
        for (int p = 1; p < c->parts; p++) {
            float v = h[(size_t)p * 3 * N + which * N + i];
            r = which == 0 ? (v > r ? v : r) : r + v;
        }
        for (int p = 0; p < c->parts; p++)
            h[(size_t)p * 3 * N + which * N + i] = r;
    }
    x->be->ops->upload(x->be->ctx, x->t[XP_STATS], h, n * sizeof(float));
    free(h);
}

static void xpar_run(const struct opt_args *x, void *logits, float dloss) {
    const struct opt_case *c = x->c;
    int Vl = c->Vp / c->parts;
    size_t es = kiln_dtype_bytes(x->be->act_dtype);
    for (int phase = 0; phase < 3; phase++) {
        for (int p = 0; p < c->parts; p++) {
            struct kiln_xent_par_args a = {.logits = (char *)logits + (size_t)p * c->N * Vl * es,
                                           .losses = p == 0 ? x->t[XP_LOSSES] : x->t[XP_LOSSES2],
                                           .targets = x->t[XP_TGT],
                                           .stats = (float *)x->t[XP_STATS] + (size_t)p * 3 * c->N,
                                           .N = c->N,
                                           .Vl = Vl,
                                           .v0 = p * Vl,
                                           .V = c->V,
                                           .phase = phase,
                                           .dloss = dloss,
                                           .z_loss = c->z_loss};
            if (dloss != 0.0f && p == 0)
                a.losses = x->t[XP_LOSSES2]; // the backward leaves the forward's losses as they are
            x->be->ops->cross_entropy_parallel(x->be->ctx, &a);
        }
        if (phase == 0) {
            xpar_reduce(x, 0);
            xpar_reduce(x, 2);
        } else if (phase == 1) {
            xpar_reduce(x, 1);
        }
    }
}

static void xpar_fwd(const struct opt_args *x) {
    xpar_run(x, x->t[XP_LOGITS], 0.0f);
}

static void xpar_bwd(const struct opt_args *x) {
    const struct opt_case *c = x->c;
    x->be->ops->copy(x->be->ctx, x->t[XP_DLOGITS], x->t[XP_LOGITS],
                     (size_t)c->N * c->Vp * kiln_dtype_bytes(x->be->act_dtype));
    xpar_run(x, x->t[XP_DLOGITS], c->dloss);
}

static void xpar_ref(const struct opt_case *c, double *const *v) {
    int Vl = c->Vp / c->parts;
    double *row = malloc((size_t)c->V * sizeof(double));
    for (int n = 0; n < c->N; n++) {
        for (int j = 0; j < c->V; j++) // column j is part j / Vl's column j % Vl
            row[j] = v[XP_LOGITS][((size_t)(j / Vl) * c->N + n) * Vl + j % Vl];
        int tgt = (int)v[XP_TGT][n], jmax = 0;
        for (int j = 1; j < c->V; j++)
            jmax = row[j] > row[jmax] ? j : jmax;
        double s = 1.0;
        for (int j = 0; j < c->V; j++)
            s += j == jmax ? 0.0 : exp(row[j] - row[jmax]);
        double lse = row[jmax] + log(s);
        v[XP_LOSSES][n] = tgt < 0 ? 0.0 : lse - row[tgt] + c->z_loss * lse * lse;
    }
    free(row);
}

static const struct opt_case xpar_fd[] = {
    {.N = 6, .V = 7, .Vp = 8, .parts = 2, .dloss = 0.5f},   // the padding in the last part
    {.N = 5, .V = 9, .Vp = 16, .parts = 4, .z_loss = 0.5f, .dloss = 0.2f}, // a part of padding alone
    {.N = 256, .V = 250, .Vp = 256, .parts = 2, .z_loss = 1e-4f, .dloss = 1.0f / 256}, // threaded
};
static const struct opt_case xpar_gpu[] = {
    {.N = 256, .V = 50257, .Vp = 50304, .parts = 2, .dloss = 1.0f / 256},
    {.N = 64, .V = 65, .Vp = 128, .parts = 4, .z_loss = 1e-4f, .dloss = 1.0f / 64},
    {.N = 8, .V = 128256, .Vp = 128256, .parts = 4, .dloss = 0.125f},
};
static const struct opt_row row_xent_parallel = {
    .name = "cross_entropy_parallel",
    .ops = {OPT_OP(cross_entropy_parallel)},
    .about = "cross_entropy_parallel: a vocabulary in 2 or 4 parts, padding, z-loss, ignored targets",
    .fd_cases = xpar_fd,
    .n_fd = OPT_COUNT(xpar_fd),
    .gpu_cases = xpar_gpu,
    .n_gpu = OPT_COUNT(xpar_gpu),
    .tensors = xpar_tensors,
    .forward = xpar_fwd,
    .backward = xpar_bwd,
    .reference = xpar_ref,
    .tol = {.ref = 1e-6,
            .fd = 1e-3,
            .fd_step = 0.2,
            .out = OPT_NMSE_BF16,
            .stat = OPT_NMSE_STAT,
            .grad = OPT_NMSE_BF16,
            .pgrad = OPT_NMSE_F32G},
};

// ==== the table ========================================================================================

// The order the programs run them in: the model's ops from the input up, then the optimizer's
const struct opt_row *const opt_rows[] = {
    &row_embed,                // embed_forward, embed_backward
    &row_norm,                 // norm_forward, norm_backward
    &row_matmul,               // matmul_forward, matmul_backward
    &row_matmul_gelu,          // matmul_forward (GELU epilogue), matmul_backward (DGELU)
    &row_gelu,                 // gelu_forward
    &opt_row_attention,        // attention_forward, attention_backward (op_rows_attention.c)
    &opt_row_attention_decode, // attention_decode
    &opt_row_attention_block,  // attention_block_forward, attention_block_backward
    &row_swiglu,               // swiglu_forward, swiglu_backward
    &row_add,                  // add
    &row_xent,                 // cross_entropy
    &row_xent_parallel,        // cross_entropy_parallel
    &row_sum_squares,          // sum_squares
    &row_accumulate,           // accumulate_f32
    &row_adamw,                // adamw
    &opt_row_amax,             // amax (op_rows_fp8.c)
    &opt_row_fp8_matmul,       // amax, fp8_cast, fp8_matmul
    &opt_row_bias_backward,    // bias_backward
};
const int opt_n_rows = OPT_COUNT(opt_rows);

// Memory, copies, events and streams: no arithmetic of their own (this file's header)
const struct opt_op opt_no_numerics[] = {
    OPT_OP(alloc),
    OPT_OP(free),
    OPT_OP(zero),
    OPT_OP(copy),
    OPT_OP(upload),
    OPT_OP(download),
    OPT_OP(upload_f32),
    OPT_OP(download_f32),
    OPT_OP(synchronize),
    OPT_OP(host_alloc),
    OPT_OP(host_free),
    OPT_OP(mem_peak),
    OPT_OP(mem_free),
    OPT_OP(event_create),
    OPT_OP(event_destroy),
    OPT_OP(event_record),
    OPT_OP(event_synchronize),
    OPT_OP(native_stream),
    OPT_OP(copy_2d),
    OPT_OP(copy_async),
    OPT_OP(stream_wait),
    OPT_OP(copy_side),
};
const int opt_n_no_numerics = OPT_COUNT(opt_no_numerics);
