// The op table: one row per numerical op of `struct kiln_ops` (core/ops.h), in the spirit of ggml's
// tests/test-backend-ops. A row says what an op is, once: its shapes, how to draw its inputs, which inputs
// are differentiable, the scalar loss of its outputs, forward and backward callbacks that go through the ops
// table of any backend, a double-precision reference of its forward, and its tolerances. Two programs run it:
//   tests/unit/backend/test_op_table.c      every row on the CPU backend: the forward against the reference, every
//                                   gradient against central finite differences, and bitwise repeatability
//   tests/gpu/test_op_table_gpu.c   every row on CUDA against the CPU on the same inputs (outputs and
//                                   gradients, ggml's NMSE per tensor), and `--perf`: each row timed
// Adding an op is its kernels plus one row in op_table.c (docs/architecture.md, "Testing an op").
//
// The loss of a row is L = sum over its DOUT tensors d of sum_i d[i] * out_d[i]: a fixed random projection
// of the outputs (a constant one where the op takes a scalar loss weight, as cross-entropy's dloss). The
// backward callback receives those projections as the output gradients, so its gradients are dL/dx.
#ifndef KILN_TESTS_OPS_OP_TABLE_H
#define KILN_TESTS_OPS_OP_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "core/ops.h"

#define OPT_MAX_TENSORS 24

// A tensor's dtype follows from the backend that holds it.
enum opt_dtype {
    OPT_ACT,  // the backend's act_dtype (CPU f32, CUDA bf16)
    OPT_GRAD, // the backend's grad_dtype (parameter gradients)
    OPT_F32,  // always f32 (statistics, losses, optimizer state)
    OPT_I32,  // token ids and targets
};

// A tensor's part in a row.
enum opt_role {
    OPT_IN,    // input, filled from `init` before every forward
    OPT_INOUT, // input that the forward updates in place (AdamW's state, a KV cache): filled, then compared
    OPT_OUT,   // forward output, compared; poisoned with NaN first, or filled from `init` where it is `accum`
    OPT_SAVED, // forward output that the backward reads (norm statistics, log-sum-exp); poisoned, compared
    OPT_DOUT,  // the loss's weights of output `of` (its gradient dL/d(out)), filled from `init`
    OPT_DIN,   // backward output dL/d(input `of`) (and of `of2`, where two inputs share one gradient)
    OPT_SCRATCH, // workspace of the callbacks, zero at allocation; neither filled nor compared
};

enum opt_init {
    OPT_NORMAL,   // a * N(0, 1) + b
    OPT_UNIFORM,  // uniform in [a, b)
    OPT_INTS,     // integers uniform in [a, b) (token ids)
    OPT_TARGETS,  // integers uniform in [0, b), with every fifth one -1 (an ignored target)
    OPT_CONST,    // every element a
    OPT_IDENTITY, // the (a, a) identity matrix
};

struct opt_tensor {
    const char *name;
    enum opt_dtype dtype;
    enum opt_role role;
    size_t n;           // elements; 0: absent in this case (its pointer is NULL)
    enum opt_init init; // of IN, INOUT and DOUT, and of OUT and DIN where `accum`
    float a, b;
    int diff;    // IN: the finite-difference check perturbs it (it has a DIN)
    int of, of2; // DOUT: the output it weights; DIN: the input(s) it is the gradient of (-1: none)
    int accum;   // OUT, DIN: the op adds into it (+=): it starts from `init`, which the finite
                 // differences subtract again, so that the check covers the addition too
    double nmse; // CUDA against CPU: this tensor's threshold, 0: the row's for its kind (opt_tol)
};

// One shape and variant of a row. Each row reads the fields that the comment above it names.
struct opt_case {
    int B, T, N, C, IC, OC, H;
    int NH, NKV, HS;
    int V, Vp;
    int Tq, Tk, q0, k0, head0, NH_total; // attention block: queries at q0.., keys at k0.., ALiBi's heads
    int maxT, pos_at;                    // decoding: cache rows, the new token's position
    size_t P;                            // elements (optimizer, reductions)
    enum kiln_pos pos;
    float rope_theta;
    int bias;     // a bias input
    int accum;    // outputs (matmul's out, dinp) add into what they hold
    int assign;   // parameter gradients are assigned (grad_assign: the first micro-step) instead of added
    int rms;      // RMSNorm instead of LayerNorm
    int residual; // the norm's fused residual add
    int res_bias; // 0-2 biases added into the residual stream upstream of the norm, whose gradients the
                  // norm's backward sums (dres_bias)
    int split;    // embedding: learned positions in two runs split at this column (0: one run)
    int learned;  // embedding: learned positions
    int vocab_lo, vocab_n; // embedding: a vocabulary-parallel table holding rows [vocab_lo, +vocab_n) of Vp
    int parts;    // cross_entropy_parallel: the vocabulary cut into this many parts of Vp / parts columns
    int merge;    // attention block: merged into an out and lse that hold another block's
    float z_loss, dloss;
    int step, stochastic; // AdamW
    // FP8 (op_rows_fp8.c): the amax's groups (enum kiln_fp8_per; the matmul: 1 = rowwise scales), the
    // operands' formats (enum kiln_fp8_fmt), operands stored transposed and cast to the "TN" layout, the
    // DGELU factor, an output in grad dtype, the forward's GELU (a pre-activation out too), casts that write
    // both layouts in one pass (and record the amax they saw), operands stored transposed cast as stored and
    // then put in the GEMM's layout by fp8_transpose (via_t)
    int per, fmt_a, fmt_b, ta, tb, dgelu, grad_out, gelu, both, via_t;
};

// What a callback sees.
struct opt_args {
    const struct kiln_backend *be;
    const struct opt_case *c;
    void *const *t;          // backend memory of each tensor, in the order the row describes them
    const void *const *host; // host values of each tensor (float, or int32_t for I32): inputs as uploaded
};

// Tolerances. CPU: relative errors ||got - want|| / ||want|| of each compared tensor. CUDA against the CPU:
// ggml's NMSE sum((gpu - cpu)^2) / sum(cpu^2) of each tensor, by what the tensor is on the GPU.
struct opt_tol {
    double ref;     // the CPU's forward outputs against the row's double reference
    double fd;      // the CPU's gradients against central differences (of L in double, the op in fp32)
    double fd_step; // the finite differences' step (the inputs are of order 1)
    double out;     // NMSE of act outputs (bf16 on CUDA)
    double stat;    // NMSE of f32 outputs (statistics, losses, optimizer state)
    double grad;    // NMSE of activation gradients (bf16 on CUDA)
    double pgrad;   // NMSE of parameter gradients (f32 on CUDA; bf16 ones take at least OPT_NMSE_BF16_GRAD)
};

// bf16 parameter gradients (a backend opened with grad_dtype = KILN_BF16): one rounding (2^-9) per write on
// top of the f32 gradients' summation order
#define OPT_NMSE_BF16_GRAD 1e-4

// An op of struct kiln_ops, named so that the compiler checks the name: OPT_OP(matmul_forward)
struct opt_op {
    size_t offset; // of its slot in struct kiln_ops
    const char *name;
};
#define OPT_OP(slot)                                                                                         \
    { offsetof(struct kiln_ops, slot), #slot }
#define OPT_MAX_OPS 4

struct opt_row {
    const char *name; // short, e.g. "matmul" (KILN_OP_TABLE_ROWS selects rows by it)
    // the ops its callbacks call, besides those without numerics (memory, copies): what test_op_table's
    // completeness check counts, and all the CPU lets the row call in its tests
    struct opt_op ops[OPT_MAX_OPS];
    const char *about; // one line: the ops it runs and what its cases cover
    // the CPU's checks (reference, finite differences, repeatability): small shapes, and one large enough
    // that the CPU backend runs it threaded
    const struct opt_case *fd_cases;
    int n_fd;
    const struct opt_case *gpu_cases; // larger and of the kernels' paths: CUDA against the CPU, and --perf
    int n_gpu;
    // fills t[0 .. count) and returns count (fixed per row: a tensor a case lacks has n == 0)
    int (*tensors)(const struct opt_case *c, struct opt_tensor *t);
    void (*forward)(const struct opt_args *x);
    // NULL: an op without a backward (the reference checks it). It leaves the forward's outputs as they are:
    // the GPU program compares the CPU's after it
    void (*backward)(const struct opt_args *x);
    // the forward in double on host values: v[i] holds tensor i (inputs as uploaded, accumulated outputs
    // prefilled as the op sees them, every other output 0); it writes the OUT, SAVED and INOUT tensors
    void (*reference)(const struct opt_case *c, double *const *v);
    // forward and backward FLOPs of a case (perf mode), or NULL
    double (*flops)(const struct opt_case *c, int backward);
    struct opt_tol tol;
};

// ---- writing a row ----------------------------------------------------------------------------------------

// CUDA-against-CPU thresholds the rows share (op_table.c's header says where they come from)
#define OPT_NMSE_BF16 1e-4   // bf16 outputs and activation gradients: relative error 1e-2
#define OPT_NMSE_F32G 2.5e-5 // f32 parameter gradients computed from bf16 inputs: 5e-3
#define OPT_NMSE_STAT 1e-6   // f32 statistics and losses: 1e-3

// Tensor descriptions: an input of N(0, stddev^2) values, differentiable or not
static inline struct opt_tensor opt_input(const char *name, enum opt_dtype d, size_t n, float stddev,
                                          int diff) {
    return (struct opt_tensor){.name = name,
                               .dtype = d,
                               .role = OPT_IN,
                               .n = n,
                               .init = OPT_NORMAL,
                               .a = stddev,
                               .diff = diff,
                               .of = -1,
                               .of2 = -1};
}
// an output; where the op adds into it (accum), it starts from N(0, 1) values
static inline struct opt_tensor opt_output(const char *name, enum opt_dtype d, size_t n, int accum) {
    return (struct opt_tensor){.name = name,
                               .dtype = d,
                               .role = OPT_OUT,
                               .n = n,
                               .init = OPT_NORMAL,
                               .a = 1,
                               .of = -1,
                               .of2 = -1,
                               .accum = accum};
}
static inline struct opt_tensor opt_saved(const char *name, enum opt_dtype d, size_t n) {
    return (struct opt_tensor){.name = name, .dtype = d, .role = OPT_SAVED, .n = n, .of = -1, .of2 = -1};
}
// the loss's weights of output `of`: N(0, 1)
static inline struct opt_tensor opt_dout(const char *name, enum opt_dtype d, size_t n, int of) {
    return (struct opt_tensor){
        .name = name, .dtype = d, .role = OPT_DOUT, .n = n, .init = OPT_NORMAL, .a = 1, .of = of, .of2 = -1};
}
// the gradient of input `of`; where the op adds into it (accum), it starts from N(0, 1) values
static inline struct opt_tensor opt_dinput(const char *name, enum opt_dtype d, size_t n, int of, int accum) {
    return (struct opt_tensor){.name = name,
                               .dtype = d,
                               .role = OPT_DIN,
                               .n = n,
                               .init = OPT_NORMAL,
                               .a = 1,
                               .of = of,
                               .of2 = -1,
                               .accum = accum};
}
static inline struct opt_tensor opt_scratch(const char *name, enum opt_dtype d, size_t n) {
    return (struct opt_tensor){.name = name, .dtype = d, .role = OPT_SCRATCH, .n = n, .of = -1, .of2 = -1};
}

// Element `elems` of an act tensor
static inline void *opt_act_at(const struct opt_args *x, void *p, size_t elems) {
    return (char *)p + elems * kiln_dtype_bytes(x->be->act_dtype);
}

#define OPT_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

// Rows kept beside op_table.c, one file per family of ops
extern const struct opt_row opt_row_attention, opt_row_attention_decode, opt_row_attention_block; // attention
extern const struct opt_row opt_row_amax, opt_row_fp8_matmul, opt_row_bias_backward; // op_rows_fp8.c

// Every row, and the ops of struct kiln_ops without numerics, which no row needs (op_table.c says why)
extern const struct opt_row *const opt_rows[];
extern const int opt_n_rows;
extern const struct opt_op opt_no_numerics[];
extern const int opt_n_no_numerics;

// ---- one case, instantiated -------------------------------------------------------------------------------

// A case's tensors and host values, drawn from a seed. Values of tensors that `round_to` holds in bf16 are
// rounded to bf16 first, so that the CPU computes on exactly what the GPU sees (NULL: no rounding).
struct opt_inst {
    const struct opt_row *row;
    struct opt_case c;
    struct opt_tensor t[OPT_MAX_TENSORS];
    int nt;
    void *host[OPT_MAX_TENSORS]; // float (or int32_t) values of IN, INOUT, DOUT and accumulated OUT/DIN
};
void opt_inst_init(struct opt_inst *in, const struct opt_row *row, const struct opt_case *c, uint64_t seed,
                   const struct kiln_backend *round_to);
void opt_inst_free(struct opt_inst *in);

// The instance on a backend.
struct opt_on {
    const struct opt_inst *in;
    const struct kiln_backend *be;
    void *dev[OPT_MAX_TENSORS];
};
void opt_on_open(struct opt_on *on, const struct opt_inst *in, const struct kiln_backend *be);
void opt_on_close(struct opt_on *on);
// Uploads the inputs (and the initial values of accumulated outputs, NaN into the others), then runs the
// forward. opt_on_run_forward runs it alone (perf mode: on what the buffers hold).
void opt_on_forward(struct opt_on *on);
// The same after a change to input `changed` alone: the other inputs keep what the last forward uploaded,
// and the outputs are not poisoned again (the finite differences' thousands of forwards)
void opt_on_forward_changed(struct opt_on *on, int changed);
void opt_on_run_forward(struct opt_on *on);
// Uploads the output gradients (and the initial values of accumulated gradients, NaN into the others), then
// runs the backward; opt_on_run_backward runs it alone.
void opt_on_backward(struct opt_on *on);
void opt_on_run_backward(struct opt_on *on);
// Tensor i as f32 on the host (ints converted), malloc'd; the caller frees.
float *opt_on_get(const struct opt_on *on, int i);
// The dtype a tensor of kind d has on a backend
enum kiln_dtype opt_dtype_on(const struct kiln_backend *be, enum opt_dtype d);
// A case in one line for the logs: its nonzero fields
void opt_describe(const struct opt_case *c, char *buf, size_t cap);

// ---- selecting rows, seeding cases ------------------------------------------------------------------------

// The rows that KILN_OP_TABLE_ROWS (name,name,...) names; every row when it is unset
int opt_row_selected(const struct opt_row *row);
// Case k of a row draws from a seed of its own, so that a run's seed replays any one of them alone
uint64_t opt_case_seed(uint64_t run_seed, const struct opt_row *row, int k);

// ---- metrics ----------------------------------------------------------------------------------------------

// sum((a - b)^2) / sum(b^2) in double (the sum alone where b is 0). Elements equal in both (infinities
// included: a query row that sees no key has lse = -inf) count as 0; any other non-finite gives +inf.
double opt_nmse(const float *a, const float *b, size_t n);
// ||a - b|| / ||b|| against a double reference, with the same rules
double opt_rel_err_d(const float *a, const double *b, size_t n);

// The NMSE threshold of tensor i when `gpu` holds it (opt_tol by kind, or the tensor's own)
double opt_nmse_tol(const struct opt_inst *in, int i, const struct kiln_backend *gpu);

#endif
