// The spike guard on a healthy run and on real spikes: the default demo's own loss and gradient norm, step by
// step (tests/data/char_demo_healthy.tsv), pass the guard at its defaults without a skip, and the same run
// with one step's gradient norm made ten times larger, or its loss half again as large, has that step
// skipped.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

#include "run/guards.h"
#include "run/options.h"

#define MAX_STEPS 4096

struct traj {
    int n;
    double loss[MAX_STEPS], grad[MAX_STEPS];
};

static void read_traj(struct traj *t) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/data/char_demo_healthy.tsv", test_source_dir());
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    char line[256];
    t->n = 0;
    while (fgets(line, sizeof(line), f)) {
        int step;
        double l, g;
        if (line[0] == '#')
            continue;
        assert_int_equal(sscanf(line, "%d %lf %lf", &step, &l, &g), 3);
        assert_int_equal(step, t->n + 1);
        assert_true(t->n < MAX_STEPS);
        t->loss[t->n] = l;
        t->grad[t->n] = g;
        t->n++;
    }
    fclose(f);
    assert_true(t->n >= 300);
}

// the guard as kiln train sets it up by default (--spike-z, --spike-window, --max-bad-steps)
static void guards_default(struct kiln_guards *g) {
    struct kiln_config c;
    assert_int_equal(kiln_config_init(&c, NULL, NULL), 0);
    assert_true(c.spike_z > 0);
    kiln_guards_init(g, c.spike_z, c.spike_window, c.max_bad_steps);
}

static void test_a_healthy_run_has_no_step_skipped(void **state) {
    (void)state;
    static struct traj t;
    read_traj(&t);
    struct kiln_guards g;
    guards_default(&g);
    for (int i = 0; i < t.n; i++) {
        enum kiln_skip why = kiln_guards_check(&g, t.loss[i], t.grad[i]);
        if (why != KILN_SKIP_NONE)
            fail_msg("step %d (loss %g, grad norm %g) skipped as %s, z = %.2f", i + 1, t.loss[i], t.grad[i],
                     kiln_skip_name(why), g.last_z);
    }
    assert_int_equal(g.skipped_total, 0);
    kiln_guards_free(&g);
}

static void test_a_real_spike_in_the_same_run_is_skipped(void **state) {
    (void)state;
    static struct traj t;
    read_traj(&t);
    int at[2] = {t.n - 60, t.n - 20}; // late in the run: the windows are full
    for (int k = 0; k < 2; k++) {
        struct kiln_guards g;
        guards_default(&g);
        for (int i = 0; i < t.n; i++) {
            double l = t.loss[i], gn = t.grad[i];
            if (i == at[k]) {
                if (k == 0)
                    gn *= 10; // a gradient an order of magnitude off
                else
                    l *= 1.5; // the loss half again as large
            }
            enum kiln_skip why = kiln_guards_check(&g, l, gn);
            if (i == at[k])
                assert_int_equal(why, k == 0 ? KILN_SKIP_SPIKE_GRAD : KILN_SKIP_SPIKE_LOSS);
            else if (why != KILN_SKIP_NONE)
                fail_msg("step %d skipped as %s", i + 1, kiln_skip_name(why));
        }
        assert_int_equal(g.skipped_total, 1);
        kiln_guards_free(&g);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_healthy_run_has_no_step_skipped),
        cmocka_unit_test(test_a_real_spike_in_the_same_run_is_skipped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
