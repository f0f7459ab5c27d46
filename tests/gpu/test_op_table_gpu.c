// Every row of the op table (tests/ops/op_table.c) on CUDA against the CPU backend, as ggml's
// test-backend-ops runs every op on every backend: the same random inputs on both (rounded to bf16 first
// where CUDA holds them in bf16, so that the CPU computes on exactly what the GPU sees), outputs poisoned
// with NaN beforehand (those the op adds into start from the same random values on both), then every output
// and every gradient compared by NMSE, sum((gpu - cpu)^2) / sum(cpu^2), against the row's threshold for
// what the tensor is (op_table.h, struct opt_tol). One line per case and tensor.
// Three CUDA backends: the default; deterministic mode (also run twice: the same bits); parameter gradients
// in bf16 (the rows that have parameter gradients).
//
//   test_op_table_gpu                    the comparisons (a cmocka test per row); exit 77 without a GPU
//   test_op_table_gpu --perf [--runs N]  each row's cases timed on the GPU alone: the median of N runs
//                                        (default 25) of the forward and of the backward, as a table
// KILN_OP_TABLE_ROWS=name,name runs some rows; KILN_TEST_SEED=N replays the inputs of a run.
// KILN_OP_TABLE_GPU=cpu puts the CPU backend where the GPU goes (every comparison exact): the program's own
// check on a machine without a GPU.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

#include "core/backend.h"
#include "ops/op_table.h"

struct env {
    struct kiln_backend cpu;
    struct kiln_backend gpu[3]; // default, deterministic, bf16 parameter gradients
    const char *gpu_label[3];
    int failures;
};
static struct env g_env;

static void report(const char *row, const char *label, const char *shape, const char *tensor, double err,
                   double tol) {
    int ok = err <= tol;
    printf("%-16s %-5s %-56s %-12s nmse %.2e  tol %.1e  %s\n", row, label, shape, tensor, err, tol,
           ok ? "PASS" : "FAIL");
    if (!ok)
        g_env.failures++;
}

static int is_output(const struct opt_tensor *t) {
    return t->n && (t->role == OPT_OUT || t->role == OPT_SAVED || t->role == OPT_INOUT);
}

// Tensors of one role group, the GPU's against the CPU's
static void compare(const struct opt_inst *in, struct opt_on *cpu, struct opt_on *gpu, int grads,
                    const char *label, const char *shape) {
    for (int i = 0; i < in->nt; i++) {
        const struct opt_tensor *t = &in->t[i];
        if (grads ? !(t->n && t->role == OPT_DIN) : !is_output(t))
            continue;
        float *c = opt_on_get(cpu, i), *g = opt_on_get(gpu, i);
        report(in->row->name, label, shape, t->name, opt_nmse(g, c, t->n), opt_nmse_tol(in, i, gpu->be));
        free(c);
        free(g);
    }
}

// Every output and gradient of a second run bitwise equal to the first's
static void check_repeat(const struct opt_inst *in, struct opt_on *gpu, const char *label,
                         const char *shape) {
    float *first[OPT_MAX_TENSORS] = {0};
    for (int i = 0; i < in->nt; i++)
        if (is_output(&in->t[i]) || (in->t[i].n && in->t[i].role == OPT_DIN))
            first[i] = opt_on_get(gpu, i);
    opt_on_forward(gpu);
    if (in->row->backward)
        opt_on_backward(gpu);
    int same = 1;
    for (int i = 0; i < in->nt; i++) {
        if (!first[i])
            continue;
        float *again = opt_on_get(gpu, i);
        same &= memcmp(first[i], again, in->t[i].n * sizeof(float)) == 0;
        free(again);
        free(first[i]);
    }
    report(in->row->name, label, shape, "repeat bits", same ? 0.0 : 1.0, 0.0);
}

static int has_param_grads(const struct opt_inst *in) {
    for (int i = 0; i < in->nt; i++)
        if (in->t[i].n && in->t[i].dtype == OPT_GRAD)
            return 1;
    return 0;
}

// One case on GPU backend b against the CPU's results in c, from the same inputs
static void compare_on(const struct opt_inst *in, struct opt_on *c, int b, const char *shape) {
    struct opt_on g;
    opt_on_open(&g, in, &g_env.gpu[b]);
    opt_on_forward(&g);
    compare(in, c, &g, 0, g_env.gpu_label[b], shape);
    if (in->row->backward) {
        opt_on_backward(&g);
        compare(in, c, &g, 1, g_env.gpu_label[b], shape);
    }
    if (b == 1)
        check_repeat(in, &g, g_env.gpu_label[b], shape);
    opt_on_close(&g);
    fflush(stdout);
}

static void test_row(void **state) {
    const struct opt_row *row = *state;
    printf("%s: %s\n", row->name, row->about);
    // an op the backend does not have (the FP8 ops on a backend built without them) is skipped, and said so
    for (const struct opt_op *op = row->ops; op < row->ops + OPT_MAX_OPS && op->name; op++) {
        void (*fn)(void);
        memcpy(&fn, (const char *)g_env.gpu[0].ops + op->offset, sizeof(fn));
        if (!fn) {
            printf("%s: %s has no %s op: skipped\n", row->name, g_env.gpu[0].name, op->name);
            skip();
        }
    }
    for (int k = 0; k < row->n_gpu; k++) {
        // the default and the deterministic backend see the same inputs; the bf16-gradient one rounds the
        // parameter-gradient inputs (AdamW's, sum_squares') to bf16 as well, and differs only where a case
        // has such tensors
        for (int pass = 0; pass < 2; pass++) {
            struct opt_inst in;
            opt_inst_init(&in, row, &row->gpu_cases[k], opt_case_seed(test_seed(), row, k),
                          &g_env.gpu[pass ? 2 : 0]);
            if (pass == 1 && !has_param_grads(&in)) {
                opt_inst_free(&in);
                continue;
            }
            char shape[200];
            opt_describe(&in.c, shape, sizeof(shape));
            struct opt_on c;
            opt_on_open(&c, &in, &g_env.cpu);
            opt_on_forward(&c);
            if (row->backward)
                opt_on_backward(&c); // (a backward leaves the forward's outputs as they are)
            for (int b = pass ? 2 : 0; b <= (pass ? 2 : 1); b++)
                compare_on(&in, &c, b, shape);
            opt_on_close(&c);
            opt_inst_free(&in);
        }
    }
    if (g_env.failures) {
        int f = g_env.failures;
        g_env.failures = 0;
        fail_msg("%s: %d comparison(s) failed (the FAIL lines above)", row->name, f);
    }
}

// ---- perf mode --------------------------------------------------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The median time of one call, over `runs` samples. A sample times enough calls back to back (at least 1 ms
// of them) that the launch and the synchronization do not dominate a short op.
static double median_s(struct opt_on *on, int backward, int runs) {
    const struct kiln_backend *be = on->be;
    void (*call)(struct opt_on *) = backward ? opt_on_run_backward : opt_on_run_forward;
    be->ops->synchronize(be->ctx);
    double t0 = now_s();
    call(on);
    be->ops->synchronize(be->ctx);
    double one = now_s() - t0;
    int reps = one >= 1e-3 ? 1 : one <= 1e-6 ? 1000 : (int)(1e-3 / one) + 1;
    double *t = malloc(sizeof(double) * (size_t)runs);
    for (int r = 0; r < runs; r++) {
        be->ops->synchronize(be->ctx);
        t0 = now_s();
        for (int k = 0; k < reps; k++)
            call(on);
        be->ops->synchronize(be->ctx);
        t[r] = (now_s() - t0) / reps;
    }
    qsort(t, (size_t)runs, sizeof(double), cmp_double);
    double m = t[runs / 2];
    free(t);
    return m;
}

// Bytes of the tensors a call reads or writes (each once): the memory-bound ops' traffic
static double bytes_of(const struct opt_inst *in, const struct kiln_backend *be, int backward) {
    double sum = 0;
    for (int i = 0; i < in->nt; i++) {
        const struct opt_tensor *t = &in->t[i];
        int used = backward ? t->role != OPT_SCRATCH
                            : t->role == OPT_IN || t->role == OPT_INOUT || t->role == OPT_OUT ||
                                  t->role == OPT_SAVED;
        if (t->n && used)
            sum += (double)t->n * kiln_dtype_bytes(opt_dtype_on(be, t->dtype));
    }
    return sum;
}

static void print_rate(double flops, double bytes, double s) {
    if (flops > 0)
        printf(" %8.1f", flops / s * 1e-12);
    else
        printf(" %8s", "");
    printf(" %8.1f", bytes / s * 1e-9);
}

static int perf_main(int runs) {
    const struct kiln_backend *gpu = &g_env.gpu[0];
    printf("op table perf on %s: median of %d runs (a run: back-to-back calls, at least 1 ms)\n",
           gpu->device_name, runs);
    printf("%-16s %-60s %10s %8s %8s %10s %8s %8s\n", "row", "case", "fwd_ms", "TFLOP/s", "GB/s", "bwd_ms",
           "TFLOP/s", "GB/s");
    for (int r = 0; r < opt_n_rows; r++) {
        const struct opt_row *row = opt_rows[r];
        if (!opt_row_selected(row))
            continue;
        for (int k = 0; k < row->n_gpu; k++) {
            struct opt_inst in;
            opt_inst_init(&in, row, &row->gpu_cases[k], opt_case_seed(test_seed(), row, k), gpu);
            char shape[200];
            opt_describe(&in.c, shape, sizeof(shape));
            struct opt_on g;
            opt_on_open(&g, &in, gpu);
            opt_on_forward(&g); // inputs uploaded, and a first run (lazy set-up) left out of the timing
            double fwd = median_s(&g, 0, runs);
            printf("%-16s %-60s %10.4f", row->name, shape, fwd * 1e3);
            print_rate(row->flops ? row->flops(&in.c, 0) : 0, bytes_of(&in, gpu, 0), fwd);
            if (row->backward) {
                opt_on_backward(&g);
                double bwd = median_s(&g, 1, runs);
                printf(" %10.4f", bwd * 1e3);
                print_rate(row->flops ? row->flops(&in.c, 1) : 0, bytes_of(&in, gpu, 1), bwd);
            }
            printf("\n");
            fflush(stdout);
            opt_on_close(&g);
            opt_inst_free(&in);
        }
    }
    return 0;
}

// ---- main -------------------------------------------------------------------------------------------------

static int open_backends(void) {
    struct kiln_error err;
    struct kiln_backend_opts o = {0};
    const char *target = getenv("KILN_OP_TABLE_GPU");
    const char *name = target && *target ? target : "cuda";
    struct kiln_backend_opts det = {.deterministic = 1}, bf16 = {.grad_dtype = KILN_BF16};
    if (strcmp(name, "cuda") != 0) // a stand-in (the CPU): the bf16-gradient variant does not exist there
        bf16.grad_dtype = KILN_F32;
    if (kiln_backend_open("cpu", &o, &g_env.cpu, &err) || kiln_backend_open(name, &o, &g_env.gpu[0], &err) ||
        kiln_backend_open(name, &det, &g_env.gpu[1], &err) ||
        kiln_backend_open(name, &bf16, &g_env.gpu[2], &err)) {
        fprintf(stderr, "test_op_table_gpu: cannot open the backends: %s\n", err.msg);
        return -1;
    }
    g_env.gpu_label[0] = name;
    g_env.gpu_label[1] = "det";
    g_env.gpu_label[2] = "bf16g";
    return 0;
}

static void close_backends(void) {
    for (int b = 0; b < 3; b++)
        kiln_backend_close(&g_env.gpu[b]);
    kiln_backend_close(&g_env.cpu);
}

int main(int argc, char **argv) {
    int perf = 0, runs = 25;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--perf") == 0) {
            perf = 1;
        } else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--perf [--runs N]]\n", argv[0]);
            return 2;
        }
    }
    if (runs < 1)
        runs = 1;
    const char *target = getenv("KILN_OP_TABLE_GPU");
    if (!(target && *target) && kiln_backend_device_count("cuda") == 0) {
        printf("test_op_table_gpu: no GPU: skipped (kiln_backend_device_count(\"cuda\") == 0)\n");
        return 77;
    }
    if (open_backends())
        return 1;
    if (perf) {
        int rc = perf_main(runs);
        close_backends();
        return rc;
    }
    static struct CMUnitTest tests[64];
    static char names[64][96];
    int n = 0;
    for (int r = 0; r < opt_n_rows && n < 64; r++) {
        if (!opt_row_selected(opt_rows[r]))
            continue;
        snprintf(names[n], sizeof(names[n]), "%s_on_cuda_matches_the_cpu", opt_rows[r]->name);
        tests[n] = (struct CMUnitTest){
            .name = names[n], .test_func = test_row, .initial_state = (void *)opt_rows[r]};
        n++;
    }
    int rc = _cmocka_run_group_tests("op_table_gpu", tests, (size_t)n, NULL, NULL);
    close_backends();
    return rc;
}
