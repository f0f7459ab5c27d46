// Checkpoints that survive crashes (docs/formats.md, "Checkpoints").
//
// Layout: RUN/ckpt/step_NNNNNNNN/ (8+ digits) holding the caller's safetensors files (model.safetensors,
// optim.safetensors) and state.json; RUN/ckpt/latest names the newest checkpoint ("step_NNNNNNNN\n").
// A checkpoint directory only ever appears under its final name complete and fsynced: it is assembled in
// RUN/ckpt/.tmp-step_N-<pid>-<nonce> and renamed. state.json carries "format": "kiln-ckpt-1", "step", and
// "files": {name: sha256hex}; readers check every hash. One writer per run directory.
#ifndef KILN_IO_CHECKPOINT_H
#define KILN_IO_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "io/safetensors.h"
#include "util/error.h"

#define KILN_CKPT_FORMAT "kiln-ckpt-1"

struct kiln_ckpt_file {
    const char *name; // "model.safetensors": a plain file name, no '/', not "state.json"
    const struct kiln_st_tensor *tensors;
    int n;
};

struct kiln_ckpt_policy {
    int keep_last;  // keep the newest K checkpoints; 0 = keep all
    int keep_every; // also keep every checkpoint with step % M == 0 forever; 0 = off
};

// Writes RUN/ckpt/step_N with the files and state.json, then points `latest` at it and prunes by the
// policy (never the checkpoint just written, never the newest). state_json is the caller's object (step,
// loader state, ...); it is not modified: the writer writes a copy with "format", "step" and "files" added.
// A "step" already in it must equal step. An existing step_N is replaced only once the new one is complete.
// Stale temp directories of killed writers are removed first. policy may be NULL (keep all).
int kiln_ckpt_save(const char *run_dir, int64_t step, const struct kiln_ckpt_file *files, int n_files,
                   const cJSON *state_json, const struct kiln_ckpt_policy *policy, struct kiln_error *err);

// A checkpoint written by a group of processes (data-parallel ranks): each writes its own files into one
// temporary directory; rank 0 writes state.json with every file's hash and renames the directory into place
// once every rank's files are durable. A kill at any moment leaves the previous checkpoint the newest. The
// caller (train/) implements the collectives on a communicator; every rank calls save_group in the same
// order.
struct kiln_ckpt_group {
    int rank, size;
    void *user;
    int (*agree)(void *user, int rc);                                          // the largest rc of all ranks
    void (*broadcast)(void *user, void *buf, size_t bytes);                    // rank 0's bytes to all
    void (*all_gather)(void *user, const void *mine, void *all, size_t bytes); // every rank's bytes, by rank
};
// File names must differ across ranks ("optim-00001-of-00004.safetensors"). grp NULL: one process, as save.
int kiln_ckpt_save_group(const char *run_dir, int64_t step, const struct kiln_ckpt_file *files, int n_files,
                         const cJSON *state_json, const struct kiln_ckpt_policy *policy,
                         const struct kiln_ckpt_group *grp, struct kiln_error *err);

// kiln_ckpt_save_group in three parts, so that the collectives (begin, finish) run on the thread that runs
// the step's collectives while the writes (write, none) run on another: with NCCL, two threads' collectives
// on one GPU, issued in different orders on different ranks, can deadlock. begin and finish are collective
// (every rank, in the same order); begin's error ends the save on every rank, and otherwise finish must
// follow (it reports write's failure on any rank to all).
#define KILN_CKPT_RECORD 4096 // one line per file, "name sha256hex\n", a rank's record in the all-gather
struct kiln_ckpt_part {
    int64_t step;
    char ckpt_dir[1024], name[64], tmp[1200];
    char mine[KILN_CKPT_RECORD]; // this rank's files and hashes, from write
    int write_rc;                // write's result (0: every file durable)
    int defer_prune;             // set after begin: finish leaves the pruning to kiln_ckpt_prune
};
int kiln_ckpt_group_begin(struct kiln_ckpt_part *part, const char *run_dir, int64_t step,
                          const struct kiln_ckpt_file *files, int n_files, const cJSON *state_json,
                          const struct kiln_ckpt_group *grp, struct kiln_error *err);
int kiln_ckpt_group_write(struct kiln_ckpt_part *part, const struct kiln_ckpt_file *files, int n_files,
                          struct kiln_error *err);
int kiln_ckpt_group_finish(struct kiln_ckpt_part *part, const char *run_dir, const cJSON *state_json,
                           const struct kiln_ckpt_policy *policy, const struct kiln_ckpt_group *grp,
                           struct kiln_error *err);
// The pruning a save does after installing step saved_step (rank 0's, no collectives: any thread), for a
// finish that deferred it: deleting old checkpoints can take long on a network filesystem.
int kiln_ckpt_prune(const char *run_dir, int64_t saved_step, const struct kiln_ckpt_policy *policy,
                    struct kiln_error *err);

// Checks one checkpoint directory: state.json parses, has the format tag (and a step matching the
// directory name), every listed file exists with the right sha256, and every .safetensors file opens.
// Returns 0 if good, else fills err with why, naming the file.
int kiln_ckpt_verify(const char *ckpt_dir, struct kiln_error *err);

// Complete checkpoint directories of a run, newest (highest step) first, found by scanning RUN/ckpt (the
// `latest` file is only a hint for people and tools). *paths is malloc'd (free each and the array).
// Returns the count (0 when RUN/ckpt does not exist) or -1 with err filled.
int kiln_ckpt_list(const char *run_dir, char ***paths, int64_t **steps, struct kiln_error *err);

// Returned by find_latest/load_latest when the run has no checkpoint at all (not an error). It is negative so
// that it cannot be confused with KILN_ERR_RUNTIME (1) or KILN_ERR_USAGE (2).
#define KILN_CKPT_NONE (-1)

// The newest checkpoint that verifies. Each corrupt one skipped on the way is reported via on_skip (may be
// NULL) with the reason. Returns 0 and the path in path_out; KILN_CKPT_NONE when the run has no checkpoint
// at all; an error code (> 0) when checkpoints exist but none verifies (refusing to silently start over and
// later prune them), or on I/O errors.
int kiln_ckpt_find_latest(const char *run_dir, char *path_out, size_t cap,
                          void (*on_skip)(void *user, const char *path, const char *why), void *user,
                          struct kiln_error *err);

struct kiln_ckpt {
    cJSON *state;                   // state.json (owned)
    struct kiln_safetensors *model; // model.safetensors (required)
    struct kiln_safetensors *optim; // optim.safetensors, NULL when the checkpoint has none
    char path[1024];
};
// Verifies (hashes every file once) and opens a checkpoint directory.
int kiln_ckpt_load(const char *ckpt_dir, struct kiln_ckpt *out, struct kiln_error *err);
// The same, hashing only the listed files whose index in state.json is share_rank modulo share_size (the
// rest is checked as load does: present, and every .safetensors opens). Ranks that resume together each take
// a share and agree on the verdict, so that the job hashes each file once.
int kiln_ckpt_load_share(const char *ckpt_dir, struct kiln_ckpt *out, int share_rank, int share_size,
                         struct kiln_error *err);
// find_latest + load in one pass (each file hashed once): 0 = loaded, KILN_CKPT_NONE, or an error (> 0).
int kiln_ckpt_load_latest(const char *run_dir, struct kiln_ckpt *out,
                          void (*on_skip)(void *user, const char *path, const char *why), void *user,
                          struct kiln_error *err);
void kiln_ckpt_close(struct kiln_ckpt *c); // safe on a zeroed or already closed struct

// The largest count state.json holds: its numbers are doubles, whole numbers exact up to 2^53. Beyond 2^64
// the conversion to an integer is undefined (a damaged opt_step of 1e300 came back as 0).
#define KILN_CKPT_COUNT_MAX 9007199254740992.0 // 2^53
// Reads the count field (a whole number in [0, 2^53]) of obj, an object of state.json; field is its full
// name for messages ("loader.epoch"), the key being the part after the last '.'. A value out of range is an
// error naming the field (KILN_ERR_RUNTIME).
int kiln_ckpt_state_count(const cJSON *obj, const char *field, uint64_t *out, struct kiln_error *err);

#endif
