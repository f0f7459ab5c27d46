// Learning-rate schedules: linear warmup, then cosine, linear, constant or WSD decay to a final fraction.
#ifndef KILN_TRAIN_SCHEDULE_H
#define KILN_TRAIN_SCHEDULE_H

#include "model/config.h"

// lr for optimizer step `step` (0-based) of cfg->max_steps.
float kiln_lr_at(const struct kiln_config *cfg, int step);

#endif
