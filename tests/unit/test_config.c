// Options that choose how a run computes rather than what it trains: --grad-dtype, parsed, resolved against
// the backend and the number of micro-steps, and refused where bf16 gradients would be wrong or unsupported.
// Config files: a directory given as --config is refused, and a value may be followed by a '# comment'.
#include "test_util.h"

#include "backend/backend.h"
#include "model/config.h"

// shakespeare-char (B=16, T=128: 2048 tokens per micro-step) with flags applied, validated
static int parse_validate(struct kiln_config *c, struct kiln_error *e, int argc, char **argv) {
    int rc = kiln_config_parse(c, argc, argv, e);
    if (!rc) {
        c->model.vocab_size = 65;
        rc = kiln_config_validate(c, e);
    }
    return rc;
}

static void test_grad_dtype_defaults_to_auto_and_parses_its_values(void **state) {
    struct kiln_config c;
    struct kiln_error e;
    char *none[] = {NULL};
    assert_int_equal(parse_validate(&c, &e, 0, none), 0);
    assert_int_equal(c.grad_dtype, KILN_GRAD_AUTO);
    const char *names[] = {"auto", "fp32", "bf16"};
    enum kiln_grad_dtype want[] = {KILN_GRAD_AUTO, KILN_GRAD_FP32, KILN_GRAD_BF16};
    for (int i = 0; i < 3; i++) {
        char flag[64];
        snprintf(flag, sizeof(flag), "--grad-dtype=%s", names[i]);
        char *argv[] = {flag};
        assert_int_equal(kiln_config_parse(&c, 1, argv, &e), 0);
        assert_int_equal(c.grad_dtype, want[i]);
    }
    char *bad[] = {"--grad-dtype=fp16"};
    assert_int_equal(kiln_config_parse(&c, 1, bad, &e), KILN_ERR_USAGE);
    assert_string_equal(e.msg,
                        "bad value 'fp16' for grad-dtype (--grad-dtype): allowed values are auto,fp32,bf16");
}

static void test_auto_is_bf16_only_on_cuda_with_one_micro_step(void **state) {
    struct kiln_config c;
    struct kiln_error e;
    char *one[] = {"--total-batch=2048"}; // == B*T: one micro-step, as with no --total-batch
    assert_int_equal(parse_validate(&c, &e, 1, one), 0);
    assert_int_equal(kiln_config_micro_steps(&c), 1);
    assert_int_equal(kiln_config_grad_dtype(&c, 1), KILN_BF16);
    assert_int_equal(kiln_config_grad_dtype(&c, 0), KILN_F32);
    char *four[] = {"--total-batch=8192"};
    assert_int_equal(parse_validate(&c, &e, 1, four), 0);
    assert_int_equal(kiln_config_micro_steps(&c), 4);
    assert_int_equal(kiln_config_grad_dtype(&c, 1), KILN_F32);
    char *fp32[] = {"--grad-dtype=fp32"};
    assert_int_equal(parse_validate(&c, &e, 1, fp32), 0);
    assert_int_equal(kiln_config_grad_dtype(&c, 1), KILN_F32);
    char *bf16[] = {"--grad-dtype=bf16", "--device=cuda"};
    assert_int_equal(parse_validate(&c, &e, 2, bf16), 0);
    assert_int_equal(kiln_config_grad_dtype(&c, 1), KILN_BF16);
}

static void test_bf16_gradients_with_accumulation_are_refused(void **state) {
    struct kiln_config c;
    struct kiln_error e;
    char *argv[] = {"--grad-dtype=bf16", "--total-batch=8192"};
    assert_int_equal(parse_validate(&c, &e, 2, argv), KILN_ERR_USAGE);
    assert_string_equal(e.msg, "grad-dtype bf16 with 4 micro-steps per step (--grad-dtype): gradients would "
                               "accumulate in bf16; use --grad-dtype=auto or fp32, or --total-batch=2048");
}

static void test_bf16_gradients_on_the_cpu_are_refused(void **state) {
    struct kiln_config c;
    struct kiln_error e;
    char *argv[] = {"--grad-dtype=bf16", "--device=cpu"};
    assert_int_equal(parse_validate(&c, &e, 2, argv), KILN_ERR_USAGE);
    assert_string_equal(e.msg, "grad-dtype bf16 on device cpu (--grad-dtype): the cpu backend keeps fp32 "
                               "gradients; use --grad-dtype=auto or fp32, or --device=cuda");
    // --device=auto passes validation (it may find a GPU); the CPU backend itself refuses, by the error path
    struct kiln_backend be;
    struct kiln_backend_opts bo = {.grad_dtype = KILN_BF16};
    assert_int_equal(kiln_backend_open("cpu", &bo, &be, &e), KILN_ERR_USAGE);
    assert_string_equal(e.msg, "grad-dtype bf16 (--grad-dtype): the cpu backend keeps fp32 gradients; use "
                               "--grad-dtype=auto or fp32, or --device=cuda");
    assert_null(be.ctx);
}

static void test_resolve_names_the_backend_auto_opens(void **state) {
    assert_string_equal(kiln_backend_resolve("cpu"), "cpu");
    assert_string_equal(kiln_backend_resolve("cuda"), "cuda");
    const char *r = kiln_backend_resolve("auto");
    assert_true(!strcmp(r, "cpu") || !strcmp(r, "cuda"));
    struct kiln_backend be;
    struct kiln_error e;
    struct kiln_backend_opts bo = {0};
    assert_int_equal(kiln_backend_open("auto", &bo, &be, &e), 0);
    assert_string_equal(be.name, r);
    kiln_backend_close(&be);
}

static void test_a_config_path_that_is_a_directory_is_a_usage_error(void **state) {
    (void)state;
    char dir[256], flag[300];
    test_tmpdir(dir, sizeof(dir));
    snprintf(flag, sizeof(flag), "--config=%s", dir);
    struct kiln_config c;
    struct kiln_error e;
    char *argv[] = {flag};
    // not read as an empty file (which would train on the defaults): refused as a missing file is
    assert_int_equal(kiln_config_parse(&c, 1, argv, &e), KILN_ERR_USAGE);
    char want[600];
    snprintf(want, sizeof(want),
             "cannot open config file '%s' (--config): it is a directory; give a file of "
             "name = value lines",
             dir);
    assert_string_equal(e.msg, want);
    // with --preset (the config file is then read once, for its settings only) the same
    char preset[] = "--preset=shakespeare-char";
    char *argv2[] = {preset, flag};
    assert_int_equal(kiln_config_parse(&c, 2, argv2, &e), KILN_ERR_USAGE);
    assert_string_equal(e.msg, want);
    test_rmrf(dir);
}

static void test_config_lines_may_end_in_a_comment(void **state) {
    (void)state;
    char dir[256], path[300], flag[320];
    test_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/run.cfg", dir);
    snprintf(flag, sizeof(flag), "--config=%s", path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("# a comment line\n"
          "lr = 0.003   # peak\n"
          "warmup = 7\t# steps\n"
          "max-steps=40 #\n"
          "data = shards/a#b.bin\n" // a '#' not preceded by blank space is part of the value
          "val-data = v#1 # held out\n",
          f);
    fclose(f);
    struct kiln_config c;
    struct kiln_error e;
    char *argv[] = {flag};
    if (kiln_config_parse(&c, 1, argv, &e))
        fail_msg("%s", e.msg);
    assert_true(c.lr == 0.003f);
    assert_int_equal(c.warmup_steps, 7);
    assert_int_equal(c.max_steps, 40);
    assert_string_equal(c.data, "shards/a#b.bin");
    assert_string_equal(c.val_data, "v#1");
    test_rmrf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_dtype_defaults_to_auto_and_parses_its_values),
        cmocka_unit_test(test_auto_is_bf16_only_on_cuda_with_one_micro_step),
        cmocka_unit_test(test_bf16_gradients_with_accumulation_are_refused),
        cmocka_unit_test(test_bf16_gradients_on_the_cpu_are_refused),
        cmocka_unit_test(test_resolve_names_the_backend_auto_opens),
        cmocka_unit_test(test_a_config_path_that_is_a_directory_is_a_usage_error),
        cmocka_unit_test(test_config_lines_may_end_in_a_comment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
