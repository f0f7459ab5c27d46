// The model's tuning knobs from the environment, for tests and measurements (model/ reads no environment):
//   KILN_CLASSIFIER_ROWS=n   rows per LM-head chunk
//   KILN_PARALLEL_FUSED=0    parallel blocks run two input GEMMs
//   KILN_SCRATCH_SHARED=0    every scratch buffer in a range of its own
// and data parallelism's (parallel/dp.h):
//   KILN_OFFLOAD_CHUNK=n     elements per chunk of the offloaded optimizer's pipeline (tests use a few hundred)
//   KILN_OFFLOAD_DELAY_US=n  the host's AdamW sleeps n us before each chunk (tests: the forward must wait)
//   KILN_POISON_STAGING=1    ZeRO-2/3's gradient staging filled with NaN before each use (tests)
//   KILN_ZERO3_GATHER=1      ZeRO-3 gathers at world size 1 too (a trace of its prefetch on one GPU)
//   KILN_ZERO_GATHER=wait    ZeRO-1/2 wait for the whole weight gather after AdamW (the baseline of its overlap
//                            with the next forward; overlap, the default, lets the forward wait bucket by bucket)
// and the checkpoint writer's (run/train_ckpt.c):
//   KILN_CKPT_DELAY_MS=n     rank r's writer waits (r + 1) n ms before its files (tests: a commit steps later)
#ifndef KILN_RUN_TUNING_H
#define KILN_RUN_TUNING_H

#include "model/model.h"

void kiln_model_tuning_from_env(struct kiln_model_opts *o);
struct kiln_dp_opts;
void kiln_dp_tuning_from_env(struct kiln_dp_opts *o);
// The knobs above that a user may set for a measurement (KILN_ZERO_GATHER): a value that is none of its
// choices is a usage error naming the variable (the test-only ones are read as they are).
struct kiln_error;
int kiln_dp_tuning_check_env(struct kiln_error *err);

#endif
