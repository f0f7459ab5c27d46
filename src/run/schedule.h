// Learning-rate schedules: linear warmup, then cosine, linear, constant or WSD decay to a final fraction.
#ifndef KILN_RUN_SCHEDULE_H
#define KILN_RUN_SCHEDULE_H

#include "run/options.h"

// lr for optimizer step `step` (0-based) of cfg->max_steps.
float kiln_lr_at(const struct kiln_config *cfg, int step);

#endif
