// The family table. See family.h.
#include "model/family.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

// indexed by enum kiln_family
static const struct kiln_model_family *const FAMILIES[] = {&kiln_family_gpt};
#define N_FAMILIES ((int)(sizeof(FAMILIES) / sizeof(FAMILIES[0])))

const struct kiln_model_family *kiln_model_family_of(const struct kiln_model_config *m) {
    KILN_ASSERT((int)m->family >= 0 && (int)m->family < N_FAMILIES);
    return FAMILIES[m->family];
}

const struct kiln_model_family *const *kiln_model_families(int *n) {
    *n = N_FAMILIES;
    return FAMILIES;
}

// ---- what the layers above call: the config's family does it

int kiln_model_split_check(const struct kiln_model_config *m, const struct kiln_model_split *s,
                           struct kiln_error *err) {
    return kiln_model_family_of(m)->check(m, s, err);
}

void kiln_params_build_split(struct kiln_param_table *t, const struct kiln_model_config *m,
                             const struct kiln_model_split *split) {
    kiln_model_family_of(m)->params_build(t, m, split);
}

void kiln_params_build(struct kiln_param_table *t, const struct kiln_model_config *m) {
    kiln_params_build_split(t, m, NULL);
}

void kiln_params_init(const struct kiln_param_table *t, const struct kiln_model_config *m, float *params,
                      uint64_t seed) {
    kiln_model_family_of(m)->params_init(t, m, params, seed);
}

void kiln_params_split_runs(const struct kiln_model_config *m, const struct kiln_model_split *s, int r,
                            const struct kiln_param_table *local, int i,
                            void (*f)(void *user, size_t local_at, size_t whole_at, size_t n), void *user) {
    kiln_model_family_of(m)->split_runs(m, s, r, local, i, f, user);
}

void kiln_model_linear_groups(const struct kiln_model_config *m, const struct kiln_param_table *t, int *group) {
    kiln_model_family_of(m)->linear_groups(m, t, group);
}

struct copy_runs {
    float *dst;
    const float *src;
};

static void copy_run(void *user, size_t local_at, size_t whole_at, size_t n) {
    struct copy_runs *c = user;
    memcpy(c->dst + local_at, c->src + whole_at, n * sizeof(float));
}

void kiln_params_init_split(const struct kiln_param_table *local, const struct kiln_model_config *m,
                            const struct kiln_model_split *s, int r, float *params, uint64_t seed) {
    struct kiln_param_table whole;
    kiln_params_build(&whole, m);
    memset(params, 0, local->total * sizeof(float));
    // tensors in parallel, as kiln_params_init: each whole tensor's stream is its own
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < local->n; i++) {
        int j = kiln_params_find(&whole, local->p[i].name);
        KILN_ASSERT(j >= 0);
        float *x = kiln_xmalloc(whole.p[j].count * sizeof(float));
        kiln_model_family_of(m)->params_init_tensor(&whole, m, j, x, seed);
        struct copy_runs c = {params + local->p[i].offset, x};
        kiln_params_split_runs(m, s, r, local, i, copy_run, &c);
        free(x);
    }
    kiln_params_free(&whole);
}

void kiln_model_plan(const struct kiln_model_config *m, const struct kiln_model_opts *o, enum kiln_dtype act,
                     enum kiln_dtype grad, int weights_alias_master, struct kiln_mem_plan *plan) {
    kiln_model_family_of(m)->plan(m, o, act, grad, weights_alias_master, plan);
}

double kiln_model_forward(struct kiln_model *g, const int32_t *inputs, const int32_t *targets, float dloss,
                          float z_loss) {
    return kiln_model_family_of(kiln_model_get_config(g))->forward(g, inputs, targets, dloss, z_loss);
}

void kiln_model_backward(struct kiln_model *g) {
    kiln_model_family_of(kiln_model_get_config(g))->backward(g);
}

int kiln_model_decode_begin(struct kiln_model *g, int B, int maxT, struct kiln_error *err) {
    return kiln_model_family_of(kiln_model_get_config(g))->decode_begin(g, B, maxT, err);
}

void kiln_model_decode_step(struct kiln_model *g, const int32_t *tokens, int pos, float *logits) {
    kiln_model_family_of(kiln_model_get_config(g))->decode_step(g, tokens, pos, logits);
}
