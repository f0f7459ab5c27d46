// Every row of the op table (tests/ops/op_table.c) on the CPU backend, the reference of every op:
//  - its forward against the row's double-precision reference (every output, statistics included; NaN
//    written into the outputs beforehand, so that an element left unwritten fails);
//  - each gradient of a differentiable input against central finite differences of the row's loss (L in
//    double over the fp32 op, extrapolated: central_difference), at every element of the small shapes (a
//    random 512 of larger tensors); a gradient the op adds into (+=) starts from random values, which are
//    subtracted again;
//  - bitwise repeatability: a second run gives the same bits, and so does OpenMP's default thread count
//    against one thread.
// And that every op of struct kiln_ops is a row's or listed as having no numerics, and that each row calls
// only the ops it names.
// Fresh random inputs every run (KILN_TEST_SEED=N replays one); KILN_OP_TABLE_ROWS=name,name runs some rows;
// KILN_OP_TABLE_FD_STEP=h takes that step in every row (to choose a new row's: the errors fall as h grows
// while the outputs' rounding dominates, and rise again once the truncation does).
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/backend.h"
#include "ops/op_table.h"

#define FD_MAX_ELEMS 512

static struct kiln_backend g_cpu1; // one thread: the finite differences (thousands of tiny forwards)
static struct kiln_backend g_cpu;  // OpenMP's default thread count
static int g_failures;

static void report(const char *row, const char *shape, const char *check, const char *tensor, double err,
                   double tol) {
    int ok = err <= tol;
    printf("%-16s %-50s %-5s %-12s rel_err %.2e  tol %.0e  %s\n", row, shape, check, tensor, err, tol,
           ok ? "PASS" : "FAIL");
    if (!ok)
        g_failures++;
}

// The row's loss after input `changed` took its current host values: sum over the DOUT tensors of
// weights . output
static double loss_at(struct opt_on *on, int changed) {
    const struct opt_inst *in = on->in;
    opt_on_forward_changed(on, changed);
    double L = 0;
    for (int d = 0; d < in->nt; d++) {
        if (in->t[d].role != OPT_DOUT || in->t[d].n == 0)
            continue;
        const float *w = in->host[d];
        float *out = opt_on_get(on, in->t[d].of);
        for (size_t i = 0; i < in->t[d].n; i++)
            L += (double)w[i] * out[i];
        free(out);
    }
    return L;
}

// dL/dx at one element x of an input by central differences, with Richardson's extrapolation: D(h) =
// (L(x + h) - L(x - h)) / 2h has the error h^2 f'''/6 + O(h^4), so (4 D(h) - D(2h)) / 3 has O(h^4) and allows
// a step large enough that the outputs' f32 rounding, over 2h, stays small. The steps are taken as rounded to
// f32, where the op sees them.
static double central_difference(struct opt_on *on, int i, float *x, double h) {
    float x0 = *x;
    double d[2];
    for (int k = 0; k < 2; k++) {
        float xp = (float)(x0 + (k + 1) * h), xm = (float)(x0 - (k + 1) * h);
        *x = xp;
        double lp = loss_at(on, i);
        *x = xm;
        double lm = loss_at(on, i);
        d[k] = (lp - lm) / ((double)xp - (double)xm);
    }
    *x = x0;
    return (4 * d[0] - d[1]) / 3;
}

// The forward's outputs against the reference's
static void check_reference(const struct opt_inst *in, struct opt_on *on, const char *shape) {
    double *v[OPT_MAX_TENSORS] = {0};
    for (int i = 0; i < in->nt; i++) {
        const struct opt_tensor *t = &in->t[i];
        if (t->n == 0)
            continue;
        v[i] = calloc(t->n, sizeof(double));
        assert_non_null(v[i]);
        if (in->host[i] && t->role != OPT_DOUT && t->role != OPT_DIN)
            for (size_t k = 0; k < t->n; k++)
                v[i][k] = t->dtype == OPT_I32 ? (double)((const int32_t *)in->host[i])[k]
                                              : (double)((const float *)in->host[i])[k];
    }
    in->row->reference(&in->c, v);
    opt_on_forward(on);
    for (int i = 0; i < in->nt; i++) {
        const struct opt_tensor *t = &in->t[i];
        if (t->n && (t->role == OPT_OUT || t->role == OPT_SAVED || t->role == OPT_INOUT)) {
            float *got = opt_on_get(on, i);
            report(in->row->name, shape, "ref", t->name, opt_rel_err_d(got, v[i], t->n), in->row->tol.ref);
            free(got);
        }
    }
    for (int i = 0; i < in->nt; i++)
        free(v[i]);
}

// The gradient tensor of input i
static int grad_of(const struct opt_inst *in, int i) {
    for (int g = 0; g < in->nt; g++)
        if (in->t[g].role == OPT_DIN && in->t[g].n && (in->t[g].of == i || in->t[g].of2 == i))
            return g;
    return -1;
}

// Every differentiable input's gradient against central differences of the loss
static void check_gradients(struct opt_inst *in, struct opt_on *on, const char *shape, uint64_t *rng) {
    const struct opt_tol *tol = &in->row->tol;
    opt_on_forward(on);
    opt_on_backward(on);
    float *an[OPT_MAX_TENSORS] = {0}; // the op's gradients, less what they started from
    for (int g = 0; g < in->nt; g++) {
        if (in->t[g].role != OPT_DIN || in->t[g].n == 0)
            continue;
        an[g] = opt_on_get(on, g);
        if (in->t[g].accum)
            for (size_t k = 0; k < in->t[g].n; k++)
                an[g][k] -= ((const float *)in->host[g])[k];
    }
    for (int i = 0; i < in->nt; i++) {
        const struct opt_tensor *t = &in->t[i];
        if (t->role != OPT_IN || !t->diff || t->n == 0)
            continue;
        int g = grad_of(in, i);
        if (g < 0 || !an[g]) {
            fail_msg("%s: input %s is differentiable but has no gradient tensor", in->row->name, t->name);
            return;
        }
        size_t n = t->n < FD_MAX_ELEMS ? t->n : FD_MAX_ELEMS;
        size_t *idx = malloc(sizeof(size_t) * t->n);
        for (size_t k = 0; k < t->n; k++)
            idx[k] = k;
        for (size_t k = 0; k < n && n < t->n; k++) { // a random sample: the first n of a shuffle
            size_t j = k + test_rand_u64(rng) % (t->n - k), s = idx[k];
            idx[k] = idx[j];
            idx[j] = s;
        }
        float *fd = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
        const char *step_env = getenv("KILN_OP_TABLE_FD_STEP"); // calibrating a row: one step for all
        double step = step_env ? atof(step_env) : tol->fd_step;
        opt_on_forward(on); // every input as drawn
        float *x = in->host[i];
        for (size_t k = 0; k < n; k++) {
            fd[k] = (float)central_difference(on, i, &x[idx[k]], step);
            got[k] = an[g][idx[k]];
        }
        char what[64];
        snprintf(what, sizeof(what), "d%s", t->name);
        report(in->row->name, shape, "fd", what, test_rel_err(got, fd, n), tol->fd);
        free(idx);
        free(fd);
        free(got);
    }
    for (int g = 0; g < in->nt; g++)
        free(an[g]);
}

// Outputs and gradients of one run, for bitwise comparisons
struct run {
    float *t[OPT_MAX_TENSORS];
};

static int compared(const struct opt_tensor *t) {
    return t->n && t->role != OPT_IN && t->role != OPT_DOUT && t->role != OPT_SCRATCH;
}

static void run_once(const struct opt_inst *in, const struct kiln_backend *be, struct run *r) {
    struct opt_on on;
    opt_on_open(&on, in, be);
    opt_on_forward(&on);
    if (in->row->backward)
        opt_on_backward(&on);
    for (int i = 0; i < in->nt; i++)
        r->t[i] = compared(&in->t[i]) ? opt_on_get(&on, i) : NULL;
    opt_on_close(&on);
}

static void run_free(const struct opt_inst *in, struct run *r) {
    for (int i = 0; i < in->nt; i++)
        free(r->t[i]);
}

static void check_repeatable(const struct opt_inst *in, const struct kiln_backend *cpu1,
                             const struct kiln_backend *cpu, const char *shape) {
    struct run one = {0}, a = {0}, b = {0};
    run_once(in, cpu1, &one);
    run_once(in, cpu, &a);
    run_once(in, cpu, &b);
    for (int i = 0; i < in->nt; i++) {
        if (!a.t[i] || !b.t[i] || !one.t[i])
            continue;
        size_t bytes = in->t[i].n * sizeof(float);
        int same = memcmp(a.t[i], b.t[i], bytes) == 0, threads = memcmp(a.t[i], one.t[i], bytes) == 0;
        report(in->row->name, shape, "bits", in->t[i].name, same && threads ? 0.0 : 1.0, 0.0);
    }
    run_free(in, &one);
    run_free(in, &a);
    run_free(in, &b);
}

// ---- every op is a row's, or has no numerics --------------------------------------------------------------
// The rows name the ops they call (opt_row.ops), and op_table.c lists the ops without numerics: together they
// must be every slot of struct kiln_ops, so that a new op fails this test until a row names it. And each row
// runs on a CPU table that holds its own ops and those without numerics alone (the other slots NULL), so that
// a row cannot call an op it does not name.

#define N_SLOTS ((int)(sizeof(struct kiln_ops) / sizeof(void (*)(void))))

static int slot_of(const struct opt_op *op) {
    return (int)(op->offset / sizeof(void (*)(void)));
}

static void test_every_op_of_the_table_is_a_row_or_has_no_numerics(void **state) {
    const char *owner[N_SLOTS] = {0}, *name[N_SLOTS] = {0};
    for (int i = 0; i < opt_n_no_numerics; i++) {
        owner[slot_of(&opt_no_numerics[i])] = "(no numerics)";
        name[slot_of(&opt_no_numerics[i])] = opt_no_numerics[i].name;
    }
    for (int r = 0; r < opt_n_rows; r++)
        for (const struct opt_op *op = opt_rows[r]->ops; op < opt_rows[r]->ops + OPT_MAX_OPS && op->name;
             op++) {
            int k = slot_of(op);
            if (owner[k] && strcmp(owner[k], "(no numerics)") == 0)
                fail_msg("row %s names %s, which opt_no_numerics lists as having none", opt_rows[r]->name,
                         op->name);
            owner[k] = opt_rows[r]->name;
            name[k] = op->name;
        }
    for (int k = 0; k < N_SLOTS; k++)
        if (!owner[k])
            fail_msg("op %d of struct kiln_ops (the one after %s) is no row's: give it a row in "
                     "tests/ops/op_table.c, or list it in opt_no_numerics if it has no numerics",
                     k, k > 0 && name[k - 1] ? name[k - 1] : "?");
}

// ---- every gradient the GPU program compares has a threshold
// ----------------------------------------------- A tensor of the grad dtype is a sum that a GPU forms in
// another order than the CPU: never bit for bit the same, so no GPU case may compare one at threshold 0 (the
// f32 kinds' default where a row's exact outputs, amaxes and scales, set it to 0), with f32 or bf16
// gradients.
static void test_every_gradient_the_gpu_compares_has_a_threshold(void **state) {
    for (int g = 0; g < 2; g++) {
        struct kiln_backend gpu = {.act_dtype = KILN_BF16, .grad_dtype = g ? KILN_BF16 : KILN_F32};
        for (int r = 0; r < opt_n_rows; r++)
            for (int k = 0; k < opt_rows[r]->n_gpu; k++) {
                struct opt_inst in;
                memset(&in, 0, sizeof(in));
                in.row = opt_rows[r];
                in.c = opt_rows[r]->gpu_cases[k];
                in.nt = in.row->tensors(&in.c, in.t);
                for (int i = 0; i < in.nt; i++) {
                    const struct opt_tensor *t = &in.t[i];
                    if (t->n && t->dtype == OPT_GRAD && t->role != OPT_IN && t->role != OPT_DOUT &&
                        t->role != OPT_SCRATCH && !(opt_nmse_tol(&in, i, &gpu) > 0))
                        fail_msg("row %s, GPU case %d: %s (grad dtype, %s gradients) is compared at "
                                 "threshold 0",
                                 in.row->name, k, t->name, g ? "bf16" : "f32");
                }
            }
    }
}

// be's ops table with only the row's ops and those without numerics left in it
static void restrict_to_row(const struct opt_row *row, const struct kiln_backend *be, struct kiln_ops *ops,
                            struct kiln_backend *out) {
    int allowed[N_SLOTS] = {0};
    for (int i = 0; i < opt_n_no_numerics; i++)
        allowed[slot_of(&opt_no_numerics[i])] = 1;
    for (const struct opt_op *op = row->ops; op < row->ops + OPT_MAX_OPS && op->name; op++)
        allowed[slot_of(op)] = 1;
    *ops = *be->ops;
    for (int k = 0; k < N_SLOTS; k++)
        if (!allowed[k]) // a NULL function pointer, written as bytes: the slots' types differ
            memset((char *)ops + (size_t)k * sizeof(void (*)(void)), 0, sizeof(void (*)(void)));
    *out = *be;
    out->ops = ops;
}

static void test_row(void **state) {
    const struct opt_row *row = *state;
    uint64_t seed = test_seed();
    printf("%s: %s\n", row->name, row->about);
    struct kiln_ops ops1, ops;
    struct kiln_backend cpu1, cpu;
    restrict_to_row(row, &g_cpu1, &ops1, &cpu1);
    restrict_to_row(row, &g_cpu, &ops, &cpu);
    for (int k = 0; k < row->n_fd; k++) {
        uint64_t case_seed = opt_case_seed(seed, row, k), rng = case_seed | 1;
        struct opt_inst in;
        opt_inst_init(&in, row, &row->fd_cases[k], case_seed, NULL);
        char shape[160];
        opt_describe(&in.c, shape, sizeof(shape));
        struct opt_on on;
        opt_on_open(&on, &in, &cpu1);
        check_reference(&in, &on, shape);
        if (row->backward)
            check_gradients(&in, &on, shape, &rng);
        opt_on_close(&on);
        check_repeatable(&in, &cpu1, &cpu, shape);
        opt_inst_free(&in);
    }
    fflush(stdout);
    if (g_failures) {
        int f = g_failures;
        g_failures = 0;
        fail_msg("%s: %d check(s) failed (the FAIL lines above)", row->name, f);
    }
}

// ---- main -------------------------------------------------------------------------------------------------

static int setup(void **state) {
    struct kiln_error err;
    struct kiln_backend_opts one = {.threads = 1}, all = {0};
    if (kiln_cpu_backend_open(&one, &g_cpu1, &err) || kiln_cpu_backend_open(&all, &g_cpu, &err)) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    kiln_backend_close(&g_cpu1);
    kiln_backend_close(&g_cpu);
    return 0;
}

int main(void) {
    static struct CMUnitTest tests[64];
    static char names[64][96];
    int n = 0;
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_every_op_of_the_table_is_a_row_or_has_no_numerics);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_every_gradient_the_gpu_compares_has_a_threshold);
    for (int r = 0; r < opt_n_rows && n < 64; r++) {
        if (!opt_row_selected(opt_rows[r]))
            continue;
        snprintf(names[n], sizeof(names[n]), "%s_matches_its_reference_and_finite_differences",
                 opt_rows[r]->name);
        tests[n] = (struct CMUnitTest){
            .name = names[n], .test_func = test_row, .initial_state = (void *)opt_rows[r]};
        n++;
    }
    return _cmocka_run_group_tests("op_table", tests, (size_t)n, setup, teardown);
}
