#include "run/schedule.h"

#include <math.h>

float kiln_lr_at(const struct kiln_config *c, int step) {
    double peak = c->lr, final = c->lr * c->final_lr_frac;
    if (step < c->warmup_steps)
        return (float)(peak * (step + 1) / c->warmup_steps);
    int decay_steps = c->max_steps - c->warmup_steps;
    double p = decay_steps > 1 ? (double)(step - c->warmup_steps) / (decay_steps - 1) : 1.0;
    if (p > 1)
        p = 1;
    switch (c->schedule) {
    case KILN_SCHED_COSINE:
        return (float)(final + (peak - final) * 0.5 * (1.0 + cos(M_PI * p)));
    case KILN_SCHED_LINEAR:
        return (float)(peak + (final - peak) * p);
    case KILN_SCHED_CONSTANT:
        return (float)peak;
    case KILN_SCHED_WSD: {
        // warmup-stable-decay: hold the peak, then decay linearly over the last wsd_decay_frac of the steps
        double start = 1.0 - c->wsd_decay_frac;
        if (p <= start || c->wsd_decay_frac <= 0)
            return (float)peak;
        return (float)(peak + (final - peak) * (p - start) / c->wsd_decay_frac);
    }
    }
    return (float)peak;
}
