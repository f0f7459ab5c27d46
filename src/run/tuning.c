// See tuning.h.
#include "run/tuning.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/dp.h"
#include "util/error.h"

void kiln_model_tuning_from_env(struct kiln_model_opts *o) {
    const char *rows = getenv("KILN_CLASSIFIER_ROWS"), *fused = getenv("KILN_PARALLEL_FUSED"),
               *shared = getenv("KILN_SCRATCH_SHARED"), *mlp = getenv("KILN_MLP_ROWS");
    o->classifier_rows = rows ? atoi(rows) : 0;
    o->mlp_rows = mlp ? atoi(mlp) : 0;
    o->no_parallel_fusion = fused && strcmp(fused, "0") == 0;
    o->scratch_apart = shared && strcmp(shared, "0") == 0;
}

void kiln_dp_tuning_from_env(struct kiln_dp_opts *o) {
    const char *chunk = getenv("KILN_OFFLOAD_CHUNK");
    const char *delay = getenv("KILN_OFFLOAD_DELAY_US"), *poison = getenv("KILN_POISON_STAGING");
    const char *gather = getenv("KILN_ZERO3_GATHER");
    o->offload_chunk = chunk ? strtoull(chunk, NULL, 10) : 0;
    o->offload_delay_us = delay ? atoi(delay) : 0;
    o->poison_staging = poison && strcmp(poison, "1") == 0;
    o->gather_at_one = gather && strcmp(gather, "1") == 0;
    const char *zg = getenv("KILN_ZERO_GATHER");
    o->gather_wait = zg && strcmp(zg, "wait") == 0;
}

int kiln_dp_tuning_check_env(struct kiln_error *err) {
    const char *zg = getenv("KILN_ZERO_GATHER");
    if (zg && *zg && strcmp(zg, "overlap") && strcmp(zg, "wait"))
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "KILN_ZERO_GATHER=%s (environment): overlap (the default) or wait", zg);
    return 0;
}
