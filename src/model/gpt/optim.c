// The model's AdamW entry points over its own buffers.
#include "model/gpt/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

// ----------------------------------------------------------------------------
// optimizer

double kiln_model_grad_norm(struct kiln_model *g) {
    KILN_ASSERT(g->grads);
    return sqrt(g->ops->sum_squares(g->ctx, g->grads, g->pt.total));
}

void kiln_model_adamw(struct kiln_model *g, const struct kiln_adamw_hparams *h, double grad_norm) {
    KILN_ASSERT(g->optim_elems == g->pt.total);
    kiln_model_adamw_spans(g, h, grad_norm, g->spans, g->n_spans);
}

static void adamw_over(struct kiln_model *g, const struct kiln_adamw_hparams *h, double grad_norm,
                       const struct kiln_param_span *spans, int n_spans, const void *grads, int compact);

void kiln_model_adamw_spans(struct kiln_model *g, const struct kiln_adamw_hparams *h, double grad_norm,
                          const struct kiln_param_span *spans, int n_spans) {
    KILN_ASSERT(g->grads && !g->opts.sharded_params);
    adamw_over(g, h, grad_norm, spans, n_spans, g->grads, 0);
}

void kiln_model_adamw_shard(struct kiln_model *g, const struct kiln_adamw_hparams *h, double grad_norm,
                          const struct kiln_param_span *spans, int n_spans, const void *grads) {
    adamw_over(g, h, grad_norm, spans, n_spans, grads, 1);
}

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
    a->seed = h->seed ^ ((uint64_t)h->step * 0x9E3779B97F4A7C15ULL);
}

static void adamw_over(struct kiln_model *g, const struct kiln_adamw_hparams *h, double grad_norm,
                       const struct kiln_param_span *spans, int n_spans, const void *grads, int compact) {
    KILN_ASSERT(!g->opts.offload_optimizer); // the data-parallel layer runs AdamW on the host
    struct kiln_adamw_args a = {.params = g->params,
                                .weights = g->weights == g->params ? NULL : g->weights,
                                .grads = grads,
                                .grads_compact = compact,
                                .params_compact = g->opts.sharded_params,
                                .m = g->m,
                                .v = g->v,
                                .spans = spans,
                                .n_spans = n_spans};
    kiln_adamw_args_from(h, grad_norm, &a);
    g->ops->adamw(g->ctx, &a);
}
