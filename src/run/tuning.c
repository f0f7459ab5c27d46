// See tuning.h.
#include "run/tuning.h"

#include "parallel/dp.h"

void kiln_model_tuning(struct kiln_model_opts *o, const struct kiln_knobs *k) {
    o->classifier_rows = k ? k->classifier_rows : 0;
    o->mlp_rows = k ? k->mlp_rows : 0;
    o->no_parallel_fusion = k && !k->parallel_fused;
    o->scratch_apart = k && !k->scratch_shared;
}

void kiln_dp_tuning(struct kiln_dp_opts *o, const struct kiln_knobs *k) {
    o->offload_chunk = k ? k->offload_chunk : 0;
    o->offload_delay_us = k ? k->offload_delay_us : 0;
    o->poison_staging = k && k->poison_staging;
    o->gather_at_one = k && k->zero3_gather;
    o->gather_wait = k && k->zero_gather == 1; // "wait"
}
