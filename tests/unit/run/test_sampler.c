// kiln sample's token draw: frequencies follow softmax(logits / temperature), top-k restricts the support,
// temperature 0 is the argmax. Fresh logits every run.
#include "test_util.h"

#include "run/sampler.h"

enum { V = 12, DRAWS = 60000 };

// Draws DRAWS tokens and checks each frequency against the expected probability (within 5 standard errors).
static void check_frequencies(const float *logits, float temperature, int top_k, uint64_t seed) {
    double p[V], z = 0, kth = -INFINITY;
    if (top_k > 0 && top_k < V) {
        float sorted[V];
        memcpy(sorted, logits, sizeof(sorted));
        for (int i = 0; i < V; i++) // descending selection sort
            for (int j = i + 1; j < V; j++)
                if (sorted[j] > sorted[i]) {
                    float t = sorted[i];
                    sorted[i] = sorted[j];
                    sorted[j] = t;
                }
        kth = sorted[top_k - 1];
    }
    for (int i = 0; i < V; i++) {
        p[i] = logits[i] >= kth ? exp((double)logits[i] / temperature) : 0.0;
        z += p[i];
    }
    long count[V] = {0};
    struct kiln_rng r;
    kiln_rng_seed(&r, seed);
    float work[V];
    for (int d = 0; d < DRAWS; d++) {
        memcpy(work, logits, sizeof(work));
        int t = kiln_sample_token(work, V, temperature, top_k, &r);
        assert_true(t >= 0 && t < V);
        count[t]++;
    }
    for (int i = 0; i < V; i++) {
        double e = p[i] / z, f = (double)count[i] / DRAWS, se = sqrt(e * (1 - e) / DRAWS) + 1e-9;
        if (e == 0.0)
            assert_int_equal(count[i], 0); // outside the top k: never drawn
        else if (fabs(f - e) > 5 * se + 1e-4)
            fail_msg("token %d: frequency %.4f, expected %.4f (T=%.2f, top_k=%d)", i, f, e, temperature, top_k);
    }
}

static void test_frequencies_follow_the_tempered_softmax(void **state) {
    uint64_t s = test_seed();
    float logits[V];
    test_fill_normal(logits, V, 2.0f, &s);
    // the largest logit in the middle of the vocab, so tokens after it are covered too
    logits[V / 2] = 6.0f;
    check_frequencies(logits, 1.0f, 0, s + 1);
    check_frequencies(logits, 0.5f, 0, s + 2);
    check_frequencies(logits, 2.0f, 0, s + 3);
}

static void test_top_k_restricts_the_support(void **state) {
    uint64_t s = test_seed() + 7;
    float logits[V];
    test_fill_normal(logits, V, 1.0f, &s);
    check_frequencies(logits, 1.0f, 3, s + 1);
    check_frequencies(logits, 0.8f, 1, s + 2);
}

static void test_temperature_zero_is_the_argmax(void **state) {
    uint64_t s = test_seed() + 11;
    float logits[V];
    test_fill_normal(logits, V, 1.0f, &s);
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    struct kiln_rng r;
    kiln_rng_seed(&r, 1);
    assert_int_equal(kiln_sample_token(logits, V, 0.0f, 0, &r), best);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frequencies_follow_the_tempered_softmax),
        cmocka_unit_test(test_top_k_restricts_the_support),
        cmocka_unit_test(test_temperature_zero_is_the_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
