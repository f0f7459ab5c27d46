// The KILN_* knobs (run/knobs.c): read once from an environment, typed, validated with one-line usage
// errors that name the variable, each value's source recorded, and carried into the options of the layers
// that consume them.
#include "test_util.h"

#include "core/backend.h"
#include "model/model.h"
#include "parallel/comm/comm.h"
#include "parallel/dp.h"
#include "run/knobs.h"
#include "run/tuning.h"

static const char *const no_env[] = {NULL};

static void read_ok(struct kiln_knobs *k, const char *const *envp) {
    struct kiln_error e = {0};
    if (kiln_knobs_read(k, envp, &e))
        fail_msg("kiln_knobs_read: %s", e.msg);
}

static void expect_all_default(const struct kiln_knobs *k) {
    for (int i = 0; i < KILN_KNOB_COUNT; i++)
        if (k->source[i] != KILN_KNOB_FROM_DEFAULT)
            fail_msg("%s: source environment, expected default", kiln_knob_table[i].name);
}

static void test_an_empty_environment_gives_every_default(void **state) {
    (void)state;
    struct kiln_knobs k;
    memset(&k, 0x5a, sizeof(k)); // whatever was there before is overwritten
    read_ok(&k, no_env);
    expect_all_default(&k);
    assert_int_equal(k.classifier_rows, 0);
    assert_int_equal(k.mlp_rows, 0);
    assert_int_equal(k.parallel_fused, 1);
    assert_int_equal(k.scratch_shared, 1);
    assert_int_equal(k.offload_chunk, 0);
    assert_int_equal(k.poison_staging, 0);
    assert_int_equal(k.zero_gather, 0);
    assert_true(k.mem_budget_mb == 0);
    for (int i = 0; i < KILN_KERNEL_COUNT; i++)
        assert_int_equal(k.kernel[i], 0);
    assert_int_equal(k.gemm_sm_margin, 0);
    assert_string_equal(k.trace_comm, "");
    assert_int_equal(k.nccl_max_ctas, 0);
    assert_string_equal(k.source_dir, KILN_SOURCE_DIR); // the build's source tree
    // kiln_knobs_defaults is the same thing
    struct kiln_knobs d;
    kiln_knobs_defaults(&d);
    assert_memory_equal(&d, &k, sizeof(k));
}

// Every row names a KILN_ variable once, says who reads it and what it does, and shows its default as the
// table spells it; the backend's choice knobs take exactly the backend's own list.
static void test_the_table_is_complete_and_consistent(void **state) {
    (void)state;
    struct kiln_knobs k;
    kiln_knobs_defaults(&k);
    for (int i = 0; i < KILN_KNOB_COUNT; i++) {
        const struct kiln_knob_def *d = &kiln_knob_table[i];
        assert_non_null(d->name);
        if (strncmp(d->name, "KILN_", 5))
            fail_msg("row %d: %s is not a KILN_ variable", i, d->name);
        for (int j = 0; j < i; j++)
            if (!strcmp(d->name, kiln_knob_table[j].name))
                fail_msg("%s is in the table twice", d->name);
        if (!d->layer || !*d->layer || !d->help || !*d->help || strchr(d->help, '\n'))
            fail_msg("%s: no layer or no one-line help", d->name);
        char v[KILN_KNOB_PATH_MAX];
        kiln_knobs_value(&k, (enum kiln_knob)i, v, sizeof(v));
        if (strcmp(v, d->def ? d->def : "unset"))
            fail_msg("%s: value %s at its default, the table says %s", d->name, v, d->def ? d->def : "unset");
    }
    for (int kk = 0; kk < KILN_KERNEL_COUNT; kk++) {
        const struct kiln_kernel_knob *kn = &kiln_kernel_values[kk];
        int found = 0;
        for (int i = 0; i < KILN_KNOB_COUNT; i++)
            if (!strcmp(kiln_knob_table[i].name, kn->knob)) {
                found = 1;
                assert_int_equal(kiln_knob_table[i].type, KILN_KNOB_CHOICE);
                assert_string_equal(kiln_knob_table[i].def, kn->values[0]);
                // every value of the backend's list is accepted and lands at its index in kernel[kk]
                for (int v = 0; v < kn->n_values; v++) {
                    struct kiln_error e = {0};
                    if (kiln_knobs_set(&k, (enum kiln_knob)i, kn->values[v], &e))
                        fail_msg("%s=%s: %s", kn->knob, kn->values[v], e.msg);
                    assert_int_equal(k.kernel[kk], v);
                    int which = -1, index = -1;
                    assert_int_equal(kiln_kernel_lookup(kn->knob, kn->values[v], &which, &index), 0);
                    assert_int_equal(which, kk);
                    assert_int_equal(index, v);
                }
            }
        if (!found)
            fail_msg("the backend's %s has no row in the knob table", kn->knob);
    }
    int which, index;
    assert_int_equal(kiln_kernel_lookup("KILN_ATTN", "bogus", &which, &index), -1);
    assert_int_equal(kiln_kernel_lookup("KILN_NOT_A_KNOB", "ref", &which, &index), -1);
}

// One variable of each type, read from an environment: its field holds the typed value, its source is the
// environment, and every other knob stays at its default.
static void test_each_type_is_parsed_into_its_field(void **state) {
    (void)state;
    static const struct {
        const char *env;
        enum kiln_knob which;
    } cases[] = {
        {"KILN_PARALLEL_FUSED=0", KILN_KNOB_PARALLEL_FUSED},          // bool
        {"KILN_POISON_STAGING=1", KILN_KNOB_POISON_STAGING},          // bool
        {"KILN_MLP_ROWS=-1", KILN_KNOB_MLP_ROWS},                     // int, at its minimum
        {"KILN_CLASSIFIER_ROWS=150", KILN_KNOB_CLASSIFIER_ROWS},      // int
        {"KILN_NCCL_MAX_CTAS=64", KILN_KNOB_NCCL_MAX_CTAS},           // int, at its maximum
        {"KILN_OFFLOAD_CHUNK=123456789012", KILN_KNOB_OFFLOAD_CHUNK}, // size, beyond 32 bits
        {"KILN_MEM_BUDGET_MB=1000.5", KILN_KNOB_MEM_BUDGET_MB},       // number
        {"KILN_ZERO_GATHER=wait", KILN_KNOB_ZERO_GATHER},             // choice
        {"KILN_WGMMA_DQ=tma-split", KILN_KNOB_WGMMA_DQ},              // choice: the backend's list
        {"KILN_TRACE_COMM=/tmp/trace.csv", KILN_KNOB_TRACE_COMM},     // path
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const char *envp[] = {"PATH=/bin", cases[c].env, "KILN_PART=offload", NULL}; // (not knobs)
        struct kiln_knobs k, d;
        read_ok(&k, envp);
        kiln_knobs_defaults(&d);
        for (int i = 0; i < KILN_KNOB_COUNT; i++) {
            enum kiln_knob_source want =
                i == (int)cases[c].which ? KILN_KNOB_FROM_ENV : KILN_KNOB_FROM_DEFAULT;
            if (k.source[i] != want)
                fail_msg("%s: %s has the wrong source", cases[c].env, kiln_knob_table[i].name);
            char a[KILN_KNOB_PATH_MAX], b[KILN_KNOB_PATH_MAX];
            kiln_knobs_value(&k, (enum kiln_knob)i, a, sizeof(a));
            kiln_knobs_value(&d, (enum kiln_knob)i, b, sizeof(b));
            if (i != (int)cases[c].which && strcmp(a, b))
                fail_msg("%s changed %s to %s", cases[c].env, kiln_knob_table[i].name, a);
            if (i == (int)cases[c].which && strcmp(a, strchr(cases[c].env, '=') + 1))
                fail_msg("%s reads back as %s", cases[c].env, a);
        }
    }
    const char *envp[] = {"KILN_PARALLEL_FUSED=0",     "KILN_MLP_ROWS=-1",
                          "KILN_CLASSIFIER_ROWS=150",  "KILN_OFFLOAD_CHUNK=123456789012",
                          "KILN_MEM_BUDGET_MB=1000.5", "KILN_ZERO_GATHER=wait",
                          "KILN_WGMMA_DQ=tma-split",   "KILN_TRACE_COMM=/tmp/trace.csv",
                          "KILN_NCCL_MAX_CTAS=64",     NULL};
    struct kiln_knobs k;
    read_ok(&k, envp);
    assert_int_equal(k.parallel_fused, 0);
    assert_int_equal(k.mlp_rows, -1);
    assert_int_equal(k.classifier_rows, 150);
    assert_true(k.offload_chunk == (size_t)123456789012ULL);
    assert_true(k.mem_budget_mb == 1000.5);
    assert_int_equal(k.zero_gather, 1);
    assert_int_equal(k.kernel[KILN_KERNEL_WGMMA_DQ], 7); // tma-split: the 8th of the backend's list
    assert_string_equal(k.trace_comm, "/tmp/trace.csv");
    assert_int_equal(k.nccl_max_ctas, 64);
}

// A bad value of any type: a usage error of one line, "KILN_X=value (environment): <why>; <hint>", and
// the knobs as they were.
static void test_bad_values_are_one_line_usage_errors_naming_the_variable(void **state) {
    (void)state;
    static char long_path[KILN_KNOB_PATH_MAX + 10];
    memset(long_path, 'a', sizeof(long_path) - 1);
    static const struct {
        enum kiln_knob which;
        const char *value, *why;
    } cases[] = {
        {KILN_KNOB_PARALLEL_FUSED, "yes", "0 or 1"},
        {KILN_KNOB_POISON_STAGING, "2", "0 or 1"},
        {KILN_KNOB_CLASSIFIER_ROWS, "abc", "a whole number 0 to 1073741824"},
        {KILN_KNOB_CLASSIFIER_ROWS, "12x", "a whole number 0 to 1073741824"},
        {KILN_KNOB_CLASSIFIER_ROWS, " 12", "a whole number 0 to 1073741824"},
        {KILN_KNOB_CLASSIFIER_ROWS, "-1", "a whole number 0 to 1073741824"},
        {KILN_KNOB_MLP_ROWS, "-2", "a whole number -1 to 1073741824"},
        {KILN_KNOB_CKPT_DELAY_MS, "99999999999999999999", "a whole number 0 to 3600000"},
        {KILN_KNOB_NCCL_MAX_CTAS, "0", "a whole number 1 to 64"},
        {KILN_KNOB_NCCL_MAX_CTAS, "65", "a whole number 1 to 64"},
        {KILN_KNOB_OFFLOAD_CHUNK, "-5", "a whole number 0 to 1099511627776"},
        {KILN_KNOB_MEM_BUDGET_MB, "lots", "a number above 0"},
        {KILN_KNOB_MEM_BUDGET_MB, "0", "a number above 0"},
        {KILN_KNOB_MEM_BUDGET_MB, "-100", "a number above 0"},
        {KILN_KNOB_ZERO_GATHER, "later", "overlap (the default) or wait"},
        {KILN_KNOB_ATTN, "REF", "one of wgmma (the default), fa2, ref"},
        {KILN_KNOB_NCCL_CTA_POLICY, "fast", "one of default, efficiency, zero"},
        {KILN_KNOB_NCCL_STREAM_PRIORITY, "urgent", "default or high"},
        {KILN_KNOB_FA_VARIANT, "1x", "one of 0 (the default), 1, 2"},
        {KILN_KNOB_SOURCE_DIR, long_path, "a path shorter than 4096 bytes"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const char *name = kiln_knob_table[cases[c].which].name;
        char var[KILN_KNOB_PATH_MAX + 64];
        snprintf(var, sizeof(var), "%s=%s", name, cases[c].value);
        const char *envp[] = {"KILN_ATTN=fa2", var, NULL};
        struct kiln_knobs k;
        struct kiln_error e = {0};
        assert_int_equal(kiln_knobs_read(&k, envp, &e), KILN_ERR_USAGE);
        assert_int_equal(e.code, KILN_ERR_USAGE);
        char want[200];
        snprintf(want, sizeof(want), "%s=%.64s (environment): %s; ", name, cases[c].value, cases[c].why);
        if (strncmp(e.msg, want, strlen(want)))
            fail_msg("%s: got \"%s\", expected it to start \"%s\"", var, e.msg, want);
        if (strchr(e.msg, '\n') || !strstr(e.msg, "kiln info --knobs"))
            fail_msg("%s: not one line with a hint: %s", var, e.msg);
        // kiln_knobs_set refuses it alike and leaves the knobs as they were
        struct kiln_knobs before;
        kiln_knobs_defaults(&k);
        assert_int_equal(kiln_knobs_set(&k, KILN_KNOB_ATTN, "ref", &e), 0);
        before = k;
        assert_int_equal(kiln_knobs_set(&k, cases[c].which, cases[c].value, &e), KILN_ERR_USAGE);
        assert_memory_equal(&k, &before, sizeof(k));
    }
}

// An empty value is the default (`VAR= cmd` clears one), the last definition of a name wins, and a name
// that only begins like a knob's is another variable.
static void test_empty_values_last_definitions_and_similar_names(void **state) {
    (void)state;
    struct kiln_knobs k;
    const char *empty[] = {"KILN_ATTN=", "KILN_ZERO_GATHER=", NULL};
    read_ok(&k, empty);
    expect_all_default(&k);
    const char *twice[] = {"KILN_ATTN=ref", "KILN_ATTN=fa2", NULL};
    read_ok(&k, twice);
    assert_int_equal(k.kernel[KILN_KERNEL_ATTN], 1);
    assert_int_equal(k.source[KILN_KNOB_ATTN], KILN_KNOB_FROM_ENV);
    const char *similar[] = {"KILN_ATTN_BLOCK=tc", "KILN_ATTNX=ref", "XKILN_ATTN=ref", NULL};
    read_ok(&k, similar);
    assert_int_equal(k.kernel[KILN_KERNEL_ATTN], 0);
    assert_int_equal(k.source[KILN_KNOB_ATTN], KILN_KNOB_FROM_DEFAULT);
    assert_int_equal(k.kernel[KILN_KERNEL_ATTN_BLOCK], 1);
    assert_int_equal(k.source[KILN_KNOB_ATTN_BLOCK], KILN_KNOB_FROM_ENV);
    // setting a knob back to NULL returns it to its default and its source to default
    struct kiln_error e;
    assert_int_equal(kiln_knobs_set(&k, KILN_KNOB_ATTN_BLOCK, NULL, &e), 0);
    assert_int_equal(k.kernel[KILN_KERNEL_ATTN_BLOCK], 0);
    expect_all_default(&k);
}

// envp NULL: the process's own environment.
static void test_the_process_environment_is_read_when_no_array_is_given(void **state) {
    (void)state;
    setenv("KILN_CKPT_DELAY_MS", "150", 1);
    setenv("KILN_NCCL_STREAM_PRIORITY", "high", 1);
    struct kiln_knobs k;
    read_ok(&k, NULL);
    unsetenv("KILN_CKPT_DELAY_MS");
    unsetenv("KILN_NCCL_STREAM_PRIORITY");
    assert_int_equal(k.ckpt_delay_ms, 150);
    assert_int_equal(k.source[KILN_KNOB_CKPT_DELAY_MS], KILN_KNOB_FROM_ENV);
    assert_int_equal(k.nccl_stream_priority, 1);
    setenv("KILN_BGRAD", "cublas", 1);
    struct kiln_error e = {0};
    assert_int_equal(kiln_knobs_read(&k, NULL, &e), KILN_ERR_USAGE);
    unsetenv("KILN_BGRAD");
    assert_non_null(strstr(e.msg, "KILN_BGRAD=cublas (environment): colsum (the default) or lt"));
}

// Each consumer's options get the values: the model's, data parallelism's, the backend's and the
// communicators'; NULL knobs give what zeroed options mean, the defaults.
static void test_the_options_of_each_layer_carry_the_knobs(void **state) {
    (void)state;
    const char *envp[] = {"KILN_CLASSIFIER_ROWS=5",
                          "KILN_MLP_ROWS=4",
                          "KILN_PARALLEL_FUSED=0",
                          "KILN_SCRATCH_SHARED=0",
                          "KILN_OFFLOAD_CHUNK=777",
                          "KILN_OFFLOAD_DELAY_US=2000",
                          "KILN_POISON_STAGING=1",
                          "KILN_ZERO3_GATHER=1",
                          "KILN_ZERO_GATHER=wait",
                          "KILN_ATTN=ref",
                          "KILN_BGRAD=lt",
                          "KILN_GEMM_TUNE=0",
                          "KILN_GEMM_SM_MARGIN=16",
                          "KILN_TRACE_COMM=/tmp/t",
                          "KILN_NCCL_CTA_POLICY=zero",
                          "KILN_NCCL_MAX_CTAS=4",
                          "KILN_NCCL_STREAM_PRIORITY=high",
                          "KILN_COMM_DELAY_US=3000",
                          "KILN_SOURCE_DIR=/src",
                          NULL};
    struct kiln_knobs k;
    read_ok(&k, envp);
    struct kiln_model_opts go = {.B = 3};
    kiln_model_tuning(&go, &k);
    assert_int_equal(go.B, 3); // the rest untouched
    assert_int_equal(go.classifier_rows, 5);
    assert_int_equal(go.mlp_rows, 4);
    assert_int_equal(go.no_parallel_fusion, 1);
    assert_int_equal(go.scratch_apart, 1);
    struct kiln_dp_opts dpo = {.zero = 2};
    kiln_dp_tuning(&dpo, &k);
    assert_int_equal(dpo.zero, 2);
    assert_int_equal(dpo.offload_chunk, 777);
    assert_int_equal(dpo.offload_delay_us, 2000);
    assert_int_equal(dpo.poison_staging, 1);
    assert_int_equal(dpo.gather_at_one, 1);
    assert_int_equal(dpo.gather_wait, 1);
    struct kiln_backend_opts bo = {.threads = 2};
    kiln_knobs_backend_opts(&k, &bo);
    assert_int_equal(bo.threads, 2);
    assert_int_equal(bo.kernel[KILN_KERNEL_ATTN], 2);      // ref
    assert_int_equal(bo.kernel[KILN_KERNEL_BGRAD], 1);     // lt
    assert_int_equal(bo.kernel[KILN_KERNEL_GEMM_TUNE], 1); // 0: untuned
    assert_int_equal(bo.kernel[KILN_KERNEL_WGMMA_DQ], 0);
    assert_int_equal(bo.gemm_sm_margin, 16);
    struct kiln_comm_open_opts co = {.timeout_s = 300};
    kiln_knobs_comm_opts(&k, &co);
    assert_true(co.timeout_s == 300);
    assert_string_equal(co.trace_path, "/tmp/t");
    assert_int_equal(co.nccl_cta_policy, KILN_NCCL_CTA_ZERO);
    assert_int_equal(co.nccl_max_ctas, 4);
    assert_int_equal(co.nccl_stream_high, 1);
    assert_int_equal(co.mpi_delay_us, 3000);
    assert_string_equal(kiln_knobs_source_dir(&k), "/src");

    // NULL: the defaults, the same as the default knobs give
    struct kiln_knobs d;
    kiln_knobs_defaults(&d);
    struct kiln_model_opts g1 = {0}, g2 = {0};
    kiln_model_tuning(&g1, NULL);
    kiln_model_tuning(&g2, &d);
    assert_memory_equal(&g1, &g2, sizeof(g1));
    assert_int_equal(g1.no_parallel_fusion, 0);
    struct kiln_dp_opts d1 = {0}, d2 = {0};
    kiln_dp_tuning(&d1, NULL);
    kiln_dp_tuning(&d2, &d);
    assert_memory_equal(&d1, &d2, sizeof(d1));
    kiln_knobs_backend_opts(NULL, &bo);
    for (int i = 0; i < KILN_KERNEL_COUNT; i++)
        assert_int_equal(bo.kernel[i], 0);
    assert_int_equal(bo.gemm_sm_margin, 0);
    kiln_knobs_comm_opts(&d, &co);
    assert_null(co.trace_path);
    assert_int_equal(co.nccl_cta_policy + co.nccl_max_ctas + co.nccl_stream_high + co.mpi_delay_us, 0);
    assert_string_equal(kiln_knobs_source_dir(NULL), KILN_SOURCE_DIR);
}

// kiln info --knobs: a header, then one line a knob with its name, value, source, reader and help.
static void test_the_listing_names_every_knob_its_value_and_source(void **state) {
    (void)state;
    const char *envp[] = {"KILN_ATTN=fa2", "KILN_MEM_BUDGET_MB=512", NULL};
    struct kiln_knobs k;
    read_ok(&k, envp);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    kiln_knobs_print(&k, f);
    fclose(f);
    int lines = 0;
    for (char *p = text; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 1 + KILN_KNOB_COUNT);
    for (int i = 0; i < KILN_KNOB_COUNT; i++) {
        const struct kiln_knob_def *d = &kiln_knob_table[i];
        char head[64];
        snprintf(head, sizeof(head), "\n%s ", d->name);
        char *line = strstr(text, head);
        if (!line)
            fail_msg("%s is not listed:\n%s", d->name, text);
        char *end = strchr(line + 1, '\n');
        *end = 0;
        char name[64], value[KILN_KNOB_PATH_MAX], source[32], want[KILN_KNOB_PATH_MAX];
        assert_int_equal(sscanf(line + 1, "%63s %4095s %31s", name, value, source), 3);
        kiln_knobs_value(&k, (enum kiln_knob)i, want, sizeof(want));
        assert_string_equal(value, want);
        int env = i == KILN_KNOB_ATTN || i == KILN_KNOB_MEM_BUDGET_MB;
        assert_string_equal(source, env ? "environment" : "default");
        if (!strstr(line + 1, d->help))
            fail_msg("%s: no help on its line", d->name);
        *end = '\n';
    }
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_an_empty_environment_gives_every_default),
        cmocka_unit_test(test_the_table_is_complete_and_consistent),
        cmocka_unit_test(test_each_type_is_parsed_into_its_field),
        cmocka_unit_test(test_bad_values_are_one_line_usage_errors_naming_the_variable),
        cmocka_unit_test(test_empty_values_last_definitions_and_similar_names),
        cmocka_unit_test(test_the_process_environment_is_read_when_no_array_is_given),
        cmocka_unit_test(test_the_options_of_each_layer_carry_the_knobs),
        cmocka_unit_test(test_the_listing_names_every_knob_its_value_and_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
