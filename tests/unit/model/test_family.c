// The model family table (model/family.h): every family the options can name has a row whose entry points
// are all there; a family's parameter table is what a model of that family allocates and what the generic
// entry points (kiln_params_build, kiln_model_plan) give; --family takes the table's names and refuses others
// in one line.
#include "test_util.h"

#include "core/backend.h"
#include "model/family.h"
#include "run/options.h"

static void test_every_family_has_a_complete_row(void **state) {
    (void)state;
    int n;
    const struct kiln_model_family *const *f = kiln_model_families(&n);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++) {
        assert_non_null(f[i]->name);
        assert_non_null(f[i]->about);
        assert_non_null(f[i]->check);
        assert_non_null(f[i]->params_build);
        assert_non_null(f[i]->params_init);
        assert_non_null(f[i]->plan);
        assert_non_null(f[i]->forward);
        assert_non_null(f[i]->backward);
        assert_non_null(f[i]->decode_begin);
        assert_non_null(f[i]->decode_step);
        struct kiln_model_config m = {.family = (enum kiln_family)i};
        assert_ptr_equal(kiln_model_family_of(&m), f[i]); // the enum's value i is row i
    }
    assert_string_equal(f[KILN_FAMILY_GPT]->name, "gpt");
}

static void test_a_familys_table_is_what_its_model_allocates(void **state) {
    (void)state;
    struct kiln_config c;
    struct kiln_error e;
    assert_int_equal(kiln_config_init(&c, "shakespeare-char", &e), 0);
    c.model.vocab_size = 65;
    struct kiln_backend be;
    struct kiln_backend_opts bo = {.threads = 1};
    assert_int_equal(kiln_backend_open("cpu", &bo, &be, &e), 0);
    struct kiln_model_opts o = {.B = 2, .T = 16, .training = 1};
    struct kiln_model *g;
    assert_int_equal(kiln_model_create(&g, &c.model, &be, &o, &e), 0);
    struct kiln_param_table direct, generic;
    kiln_model_family_of(&c.model)->params_build(&direct, &c.model, NULL);
    kiln_params_build(&generic, &c.model);
    const struct kiln_param_table *held = kiln_model_params(g);
    assert_int_equal(direct.n, held->n);
    assert_int_equal(generic.n, held->n);
    assert_int_equal(direct.total, held->total);
    for (int i = 0; i < held->n; i++) {
        assert_string_equal(direct.p[i].name, held->p[i].name);
        assert_int_equal(direct.p[i].offset, held->p[i].offset);
        assert_int_equal(generic.p[i].offset, held->p[i].offset);
    }
    struct kiln_mem_plan a, b;
    kiln_model_plan(&c.model, &o, be.act_dtype, be.grad_dtype, be.weights_alias_master, &a);
    kiln_model_family_of(&c.model)->plan(&c.model, &o, be.act_dtype, be.grad_dtype, be.weights_alias_master,
                                         &b);
    assert_int_equal(a.total_bytes, b.total_bytes);
    assert_int_equal(a.total_bytes, kiln_model_mem_plan(g)->total_bytes);
    kiln_params_free(&direct);
    kiln_params_free(&generic);
    kiln_model_free(g);
    kiln_backend_close(&be);
}

static void test_the_family_option_takes_the_tables_names(void **state) {
    (void)state;
    struct kiln_config c;
    struct kiln_error e = {0};
    assert_int_equal(kiln_config_init(&c, NULL, &e), 0);
    assert_int_equal(kiln_config_set(&c, "family", "gpt", "--family", &e), 0);
    assert_int_equal(c.model.family, KILN_FAMILY_GPT);
    assert_int_equal(kiln_config_set(&c, "family", "mamba", "--family", &e), KILN_ERR_USAGE);
    assert_non_null(strstr(e.msg, "--family"));
    assert_non_null(strstr(e.msg, "gpt"));
    assert_null(strchr(e.msg, '\n'));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_family_has_a_complete_row),
        cmocka_unit_test(test_a_familys_table_is_what_its_model_allocates),
        cmocka_unit_test(test_the_family_option_takes_the_tables_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
