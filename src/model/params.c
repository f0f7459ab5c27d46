// The parameter table. See params.h.
#include "model/params.h"

#include <math.h>
#include <string.h>

#include "util/error.h"
#include "util/rng.h"

#define ALIGN_ELEMS 64

int kiln_params_add(struct kiln_param_table *t, const char *name, int64_t d0, int64_t d1, int layer) {
    KILN_ASSERT(t->n < t->cap);
    struct kiln_param *p = &t->p[t->n];
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->ndim = d1 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->count = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    p->offset = kiln_params_aligned(t->total);
    p->layer = layer;
    p->decay = p->ndim == 2;
    t->total = p->offset + p->count;
    t->n_params += p->count;
    return t->n++;
}

size_t kiln_params_aligned(size_t elems) {
    return (elems + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
}

void kiln_params_alloc(struct kiln_param_table *t, int cap, int layers, int per_layer) {
    memset(t, 0, sizeof(*t));
    t->cap = cap;
    t->per_layer = per_layer;
    t->p = kiln_xcalloc((size_t)cap, sizeof(*t->p));
    // one block: the row pointers, then the rows of per_layer indices
    t->layer = kiln_xcalloc((size_t)layers * (sizeof(int *) + (size_t)per_layer * sizeof(int)) + 1, 1);
    int *rows = (int *)(t->layer + layers);
    for (int l = 0; l < layers; l++) {
        t->layer[l] = rows + (size_t)l * per_layer;
        for (int k = 0; k < per_layer; k++)
            t->layer[l][k] = -1;
    }
    t->layer_begin = kiln_xcalloc((size_t)layers + 1, sizeof(size_t));
    t->wte = t->wpe = t->lnf_w = t->lnf_b = t->lm_head = -1;
}

void kiln_params_free(struct kiln_param_table *t) {
    free(t->p);
    free(t->layer);
    free(t->layer_begin);
    memset(t, 0, sizeof(*t));
}

int kiln_params_find(const struct kiln_param_table *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->p[i].name, name) == 0)
            return i;
    return -1;
}
