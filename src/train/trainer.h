// The training loop: data, model, AdamW, schedule, evaluation, metrics and the run directory.
#ifndef KILN_TRAIN_TRAINER_H
#define KILN_TRAIN_TRAINER_H

#include "backend/backend.h"
#include "model/config.h"
#include "util/error.h"

struct kiln_train_result {
    int steps;
    double final_loss;     // last training loss
    double final_val_loss; // last validation loss (NaN if none)
    double tokens_per_s;   // mean over the run, excluding the first step
    int skipped_steps;     // non-finite loss or gradient
};

// Trains per cfg. Writes cfg->out/{config, metrics.jsonl, model.safetensors, tokenizer files} when cfg->out is
// set. Returns 0, or an error (usage errors such as a context longer than the data give KILN_ERR_USAGE).
int kiln_train(struct kiln_config *cfg, struct kiln_train_result *res, struct kiln_error *err);

#endif
