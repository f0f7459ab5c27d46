// Options that choose how a run computes rather than what it trains: --grad-dtype, parsed, resolved against
// the backend and the number of micro-steps, and refused where bf16 gradients would be wrong or unsupported.
// Config files: a directory given as --config is refused, and a value may be followed by a '# comment'.
// Issue 18: a NUL byte is reported as such, ranges print integers in full, floats print at the precision they
// were given and still read back to the same bits, and the help shows each option's range and default.
#include "test_util.h"

#include "core/backend.h"
#include "run/options.h"

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

// --zero defaults to auto: ZeRO-1 where there are several data-parallel ranks (world over tp x sp), else 0;
// a level given is kept at every world size, and a bad value names the range and auto
static void test_zero_auto_is_zero1_with_several_data_parallel_ranks(void **state) {
    struct kiln_config c;
    struct kiln_error e;
    char *none[] = {NULL};
    assert_int_equal(parse_validate(&c, &e, 0, none), 0);
    assert_int_equal(c.zero, -1);
    struct {
        int world, tp, sp, want;
    } cases[] = {{1, 1, 1, 0}, {2, 1, 1, 1}, {4, 2, 1, 1}, {4, 4, 1, 0}, {4, 2, 2, 0}, {8, 2, 2, 1}, {4, 1, 4, 0}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(parse_validate(&c, &e, 0, none), 0);
        c.tp = cases[i].tp, c.sp = cases[i].sp;
        c.world = cases[i].world;
        assert_int_equal(kiln_config_zero(&c), cases[i].want);
        kiln_config_resolve(&c, cases[i].world);
        assert_int_equal(c.zero, cases[i].want);
        assert_int_equal(c.world, cases[i].world);
    }
    char *zero0[] = {"--zero=0"}, *zero3[] = {"--zero=3"}, *autos[] = {"--zero=3", "--zero=auto"};
    assert_int_equal(parse_validate(&c, &e, 1, zero0), 0);
    kiln_config_resolve(&c, 4);
    assert_int_equal(c.zero, 0);
    assert_int_equal(parse_validate(&c, &e, 1, zero3), 0);
    kiln_config_resolve(&c, 1);
    assert_int_equal(c.zero, 3);
    assert_int_equal(parse_validate(&c, &e, 2, autos), 0);
    assert_int_equal(c.zero, -1);
    char *neg[] = {"--zero=-1"}, *word[] = {"--zero=all"};
    assert_int_equal(kiln_config_parse(&c, 1, neg, &e), KILN_ERR_USAGE);
    assert_string_equal(e.msg, "bad value '-1' for zero (--zero): allowed range is 0 to 3, or auto");
    assert_int_equal(kiln_config_parse(&c, 1, word, &e), KILN_ERR_USAGE);
    assert_string_equal(e.msg, "bad value 'all' for zero (--zero): expected an integer or auto");
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

// RUN/config as the trainer writes it, parsed back into a fresh config
static void write_and_reparse(const struct kiln_config *c, struct kiln_config *back, char **text) {
    size_t n = 0;
    FILE *m = open_memstream(text, &n);
    kiln_config_write(c, m);
    fclose(m);
    char dir[256], path[300], flag[320];
    test_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/config", dir);
    snprintf(flag, sizeof(flag), "--config=%s", path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(*text, f);
    fclose(f);
    struct kiln_error e;
    char *argv[] = {flag};
    if (kiln_config_parse(back, 1, argv, &e))
        fail_msg("%s", e.msg);
    test_rmrf(dir);
}

static void test_floats_print_as_given_and_read_back_exactly(void **state) {
    (void)state;
    struct kiln_config c, back;
    struct kiln_error e;
    char *argv[] = {"--lr=0.003", "--norm-eps=1e-5", "--beta2=0.95", "--peak-flops=989.5e12"};
    assert_int_equal(kiln_config_parse(&c, 4, argv, &e), 0);
    char *text = NULL;
    write_and_reparse(&c, &back, &text);
    // not lr = 0.00300000003, norm-eps = 9.99999975e-06
    assert_non_null(strstr(text, "\nlr = 0.003\n"));
    assert_non_null(strstr(text, "\nnorm-eps = 1e-05\n"));
    assert_non_null(strstr(text, "\nbeta2 = 0.95\n"));
    assert_non_null(strstr(text, "\npeak-flops = 989500000000000\n"));
    free(text);
    // any float reads back to the same bits: random ones, whose shortest form needs up to 9 digits
    uint64_t rng = test_seed() ^ 0xf10a7;
    for (int trial = 0; trial < 60; trial++) {
        assert_int_equal(kiln_config_init(&c, NULL, &e), 0);
        c.lr = 10.0f * test_rand_uniform(&rng);
        c.beta2 = 0.999999f * test_rand_uniform(&rng);
        c.model.norm_eps = 1e-12f + test_rand_uniform(&rng) * 1e-3f;
        c.model.rope_theta = 1.0f + 1e6f * test_rand_uniform(&rng);
        c.peak_flops = 1e15 * (double)test_rand_uniform(&rng) + 1.0 / 3.0;
        write_and_reparse(&c, &back, &text);
        free(text);
        if (back.lr != c.lr || back.beta2 != c.beta2 || back.model.norm_eps != c.model.norm_eps ||
            back.model.rope_theta != c.model.rope_theta || back.peak_flops != c.peak_flops)
            fail_msg(
                "trial %d: lr %.9g -> %.9g, beta2 %.9g -> %.9g, eps %.9g -> %.9g, theta %.9g -> %.9g, flops "
                "%.17g -> %.17g",
                trial, (double)c.lr, (double)back.lr, (double)c.beta2, (double)back.beta2,
                (double)c.model.norm_eps, (double)back.model.norm_eps, (double)c.model.rope_theta,
                (double)back.model.rope_theta, c.peak_flops, back.peak_flops);
    }
}

static void test_a_nul_byte_in_a_config_line_is_named(void **state) {
    (void)state;
    char dir[256], path[300], flag[320];
    test_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/bin.cfg", dir);
    snprintf(flag, sizeof(flag), "--config=%s", path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fwrite("layers = 2\nlr = 3e-3\0junk\n", 1, 27, f);
    fclose(f);
    struct kiln_config c;
    struct kiln_error e;
    char *argv[] = {flag};
    assert_int_equal(kiln_config_parse(&c, 1, argv, &e), KILN_ERR_USAGE);
    char want[600];
    snprintf(want, sizeof(want), "NUL byte in config file (%s:2)", path); // was "line too long"
    if (!strstr(e.msg, want))
        fail_msg("got \"%s\"", e.msg);
    test_rmrf(dir);
}

static void test_ranges_print_integers_in_full(void **state) {
    (void)state;
    struct kiln_config c;
    struct kiln_error e;
    char *argv[] = {"--batch=0"};
    assert_int_equal(kiln_config_parse(&c, 1, argv, &e), KILN_ERR_USAGE);
    assert_string_equal(
        e.msg, "bad value '0' for batch (--batch): allowed range is 1 to 1048576"); // not 1.04858e+06
    char *argv2[] = {"--norm-eps=0"};
    assert_int_equal(kiln_config_parse(&c, 1, argv2, &e), KILN_ERR_USAGE);
    assert_string_equal(e.msg, "bad value '0' for norm-eps (--norm-eps): allowed range is 1e-12 to 1");
}

static void test_help_shows_each_options_range_and_default(void **state) {
    (void)state;
    char *text = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&text, &n);
    kiln_config_print_help(m, 1);
    fclose(m);
    // the defaults are kiln train's: the shakespeare-char preset (layers 4, lr 3e-3) over the built-in ones
    assert_non_null(strstr(
        text, "  layers               number of transformer blocks (L) [integer 1 to 1024; default 4]\n"));
    assert_non_null(strstr(text, "[0 to 10; default 0.003]\n"));
    assert_non_null(strstr(text, "[integer 1 to 1048576; default 16]\n"));
    assert_non_null(strstr(text, "[one of learned,rope,alibi,none; default learned]\n"));
    // every option line carries its bracket
    int lines = 0, bracketed = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        if (!strncmp(l, "  ", 2) && l[2] != ' ' && strncmp(l, "  preset", 8) && strncmp(l, "  config", 8)) {
            lines++;
            bracketed += strstr(l, "; default ") != NULL;
        }
    assert_true(lines > 40);
    assert_int_equal(bracketed, lines);
    free(text);
}

// kiln help train and kiln info show the run's options; fault injection (tests only) only when asked (--all)
static void test_testing_only_options_are_hidden_unless_asked(void **state) {
    (void)state;
    for (int all = 0; all < 2; all++) {
        char *text = NULL;
        size_t n = 0;
        FILE *m = open_memstream(&text, &n);
        kiln_config_print_help(m, all);
        fclose(m);
        assert_int_equal(strstr(text, "inject-nan") != NULL, all);
        assert_int_equal(strstr(text, "kiln help train --all") == NULL, all);
        assert_non_null(strstr(text, "max-steps"));
        free(text);
        struct kiln_config c;
        assert_int_equal(kiln_config_init(&c, NULL, NULL), 0);
        text = NULL;
        m = open_memstream(&text, &n);
        int hidden = kiln_config_print(&c, m, all);
        fclose(m);
        assert_int_equal(strstr(text, "inject-crash =") != NULL, all);
        assert_true(all ? hidden == 0 : hidden >= 3);
        assert_non_null(strstr(text, "max-steps = "));
        free(text);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_testing_only_options_are_hidden_unless_asked),
        cmocka_unit_test(test_grad_dtype_defaults_to_auto_and_parses_its_values),
        cmocka_unit_test(test_auto_is_bf16_only_on_cuda_with_one_micro_step),
        cmocka_unit_test(test_bf16_gradients_with_accumulation_are_refused),
        cmocka_unit_test(test_bf16_gradients_on_the_cpu_are_refused),
        cmocka_unit_test(test_resolve_names_the_backend_auto_opens),
        cmocka_unit_test(test_a_config_path_that_is_a_directory_is_a_usage_error),
        cmocka_unit_test(test_config_lines_may_end_in_a_comment),
        cmocka_unit_test(test_floats_print_as_given_and_read_back_exactly),
        cmocka_unit_test(test_a_nul_byte_in_a_config_line_is_named),
        cmocka_unit_test(test_zero_auto_is_zero1_with_several_data_parallel_ranks),
        cmocka_unit_test(test_ranges_print_integers_in_full),
        cmocka_unit_test(test_help_shows_each_options_range_and_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
