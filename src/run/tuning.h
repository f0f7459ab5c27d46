// The knobs (run/knobs.h) that tune the model and data parallelism, into their options: model/ and
// parallel/ read no environment, so the values come down from the struct cmd/ read once at start-up.
//   KILN_CLASSIFIER_ROWS=n   rows per LM-head chunk
//   KILN_MLP_ROWS=n          rows per MLP chunk where the backward recomputes the MLP
//   KILN_PARALLEL_FUSED=0    parallel blocks run two input GEMMs
//   KILN_SCRATCH_SHARED=0    every scratch buffer in a range of its own
// and data parallelism's (parallel/dp.h):
//   KILN_OFFLOAD_CHUNK=n     elements per chunk of the offloaded optimizer's pipeline (tests: a few hundred)
//   KILN_OFFLOAD_DELAY_US=n  the host's AdamW sleeps n us before each chunk (tests: the forward must wait)
//   KILN_POISON_STAGING=1    ZeRO-2/3's gradient staging filled with NaN before each use (tests)
//   KILN_ZERO3_GATHER=1      ZeRO-3 gathers at world size 1 too (a trace of its prefetch on one GPU)
//   KILN_ZERO_GATHER=wait    ZeRO-1/2 wait for the whole weight gather after AdamW (the baseline of its
//                            overlap with the next forward; overlap, the default, lets the forward wait
//                            bucket by bucket)
// (The checkpoint writer's KILN_CKPT_DELAY_MS goes to run/train_ckpt.h's kiln_ckpt_writer_set_delay.)
#ifndef KILN_RUN_TUNING_H
#define KILN_RUN_TUNING_H

#include "model/model.h"
#include "run/knobs.h"

// Fills o's tuning fields from k (NULL: the defaults), the rest of o untouched.
void kiln_model_tuning(struct kiln_model_opts *o, const struct kiln_knobs *k);
struct kiln_dp_opts;
void kiln_dp_tuning(struct kiln_dp_opts *o, const struct kiln_knobs *k);

#endif
