// AdamW over spans on the backend. See adamw.h.
#include "optim/adamw.h"

#include <math.h>

#include "util/error.h"

void kiln_adamw_args_from(const struct kiln_adamw_hparams *h, double grad_norm, struct kiln_adamw_args *a) {
    float scale = h->grad_scale;
    double norm = grad_norm * h->grad_scale;
    if (h->grad_clip > 0 && norm > h->grad_clip)
        scale *= (float)(h->grad_clip / norm);
    a->lr = h->lr;
    a->beta1 = h->beta1;
    a->beta2 = h->beta2;
    a->eps = h->eps;
    a->weight_decay = h->weight_decay;
    a->grad_scale = scale;
    a->step = h->step;
    a->stochastic_rounding = h->stochastic_rounding;
    // a seed per step: the same rounding on a resumed run, a fresh one each step
    a->seed = h->seed ^ ((uint64_t)h->step * 0x9E3779B97F4A7C15ULL);
}

void kiln_adamw_step(struct kiln_backend *be, const struct kiln_adamw_buffers *b,
                     const struct kiln_param_span *spans, int n_spans, const struct kiln_adamw_hparams *h,
                     double grad_norm) {
    KILN_ASSERT(b->params && b->grads && b->m && b->v);
    struct kiln_adamw_args a = {.params = b->params,
                                .weights = b->weights == b->params ? NULL : b->weights,
                                .grads = b->grads,
                                .grads_compact = b->grads_compact,
                                .params_compact = b->params_compact,
                                .m = b->m,
                                .v = b->v,
                                .spans = spans,
                                .n_spans = n_spans};
    kiln_adamw_args_from(h, grad_norm, &a);
    be->ops->adamw(be->ctx, &a);
}

struct kiln_param_span *kiln_adamw_table_spans(const struct kiln_param_table *pt, int *n) {
    struct kiln_param_span *s = kiln_xcalloc((size_t)pt->n + 1, sizeof(*s));
    for (int i = 0; i < pt->n; i++) {
        const struct kiln_param *p = &pt->p[i];
        s[i] = (struct kiln_param_span){p->offset, p->count, p->decay, p->offset};
    }
    *n = pt->n;
    return s;
}

double kiln_adamw_grad_norm(struct kiln_backend *be, const void *grads, size_t n) {
    KILN_ASSERT(grads);
    return sqrt(be->ops->sum_squares(be->ctx, grads, n));
}
