// Every rank runs the same job (docs/distributed.md, "What the ranks agree on"). A rank given other options
// than rank 0's would issue other collectives, of other sizes, or train another model, and the transports
// cannot tell: buffers overflow, collectives mismatch or hang, or the job ends with a model nobody asked for.
// So before any collective that depends on the config, and again on the checkpoint a run resumes from, every
// rank compares what it has with rank 0's and, where they differ, every rank stops with the same one-line
// error naming the first rank that differs, the first option and both values.
//
// Both checks are collective: every rank of comm calls them at the same point, and every rank takes part in
// the same operations whatever it finds (an all-gather of digests; when they differ, two broadcasts), so they
// end at once and never hang. Every rank returns the same verdict.
#ifndef KILN_RUN_AGREE_H
#define KILN_RUN_AGREE_H

#include "parallel/comm/comm.h"
#include "run/options.h"
#include "util/error.h"

// The options that shape the job, as resolved on this rank, against rank 0's. Options that only rank 0 uses
// or that stay on this rank (--log-every, --quiet, --threads, --tensorboard, ...) may differ; --out and
// --resume are compared in kind only (set or not; auto, never or a checkpoint). Returns 0 or a usage error.
int kiln_agree_config(struct kiln_comm *comm, const struct kiln_config *cfg, struct kiln_error *err);

// The checkpoint this rank is about to resume from (dir, its state.json text) against rank 0's: the same
// state.json on every rank, or a usage error naming both checkpoints.
int kiln_agree_checkpoint(struct kiln_comm *comm, const char *dir, const char *state_json, long long step,
                          struct kiln_error *err);

#endif
