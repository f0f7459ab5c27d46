// Sequence parallelism (docs/distributed.md, "Sequence parallelism"): the ranks of an SP group each hold a
// share of every sequence's tokens, and attention is the only place where they meet.
//
// Layout. world = sp x dp; the sp ranks of one group are consecutive (rank = dp_index * sp + sp_rank). An SP
// group is u Ulysses ranks times r ring ranks (sp_rank = ring_index * u + ulysses_index): ulysses mode is
// r = 1, ring mode u = 1, hybrid both (Ulysses inside a node, the ring across nodes). With a ring, the
// sequence is cut into 2r chunks and ring slot i holds chunks i and 2r-1-i (zigzag: causal work is the same
// on every slot); without one, the slot is the whole sequence. The u ranks of a slot split its tokens, in
// order, into runs of T / (r u): so a rank's tokens are at most two runs of positions.
//
// Attention. Ulysses: an all-to-all turns the slot's sequence-sharded q, k, v into head-sharded ones
// (NH / u heads, all of the slot's tokens), and another turns the output back. Ring: the slots' k/v blocks
// pass around the ring with send_recv while the attention-block op (ops.h) works on the block in hand; the
// results are merged through their log-sum-exp; the backward passes the k/v blocks and their gradients round,
// so that each block's gradient arrives back at its owner. Everything else in the model is per token.
#ifndef KILN_PARALLEL_SP_H
#define KILN_PARALLEL_SP_H

#include <stddef.h>
#include <stdint.h>

#include "core/ops.h"

#include "model/config.h"
#include "util/error.h"

enum kiln_sp_mode { KILN_SP_ULYSSES = 0, KILN_SP_RING, KILN_SP_HYBRID, KILN_SP_AUTO };

// What the layout is planned from (the run's --sp, --sp-mode, --sp-ulysses and --seq, and the model)
struct kiln_sp_opts {
    int sp;
    enum kiln_sp_mode mode;
    int ulysses; // hybrid: ranks of each Ulysses group (0: the ranks per node)
    int T;
    const struct kiln_model_config *model;
};

struct kiln_comm;
struct kiln_backend;
struct kiln_model;

struct kiln_sp_layout {
    int sp, ulysses, ring; // sp = ulysses * ring
    int sp_rank, uly_rank, ring_rank;
    int dp, dp_rank; // world / sp data-parallel groups, and this rank's
    int T, T_local;  // the sequence, and this rank's share (T / sp)
    int chunk;       // ring: T / (2 ring) positions per chunk; T without a ring
    // this rank's tokens: columns [0, split) at positions pos0.., the rest at pos1..
    int pos0, split, pos1;
};

// Plans the layout for a rank of `world` from o (--sp, --sp-mode, --sp-ulysses; local_world is the ranks
// per node, hybrid's default Ulysses size), checking what it needs: sp divides the world, the heads (and KV
// heads) divide among the Ulysses ranks, T divides among the ranks (in 2 x ring chunks under zigzag). A usage
// error names the option otherwise.
int kiln_sp_plan(struct kiln_sp_opts o, int world, int rank, int local_world, struct kiln_sp_layout *out,
                 struct kiln_error *err);

// This rank's columns of a (B, T) batch: (B, T_local), the layout's runs of positions.
void kiln_sp_slice(const struct kiln_sp_layout *lo, const int32_t *full, int B, int32_t *local);

// Where sequence parallelism keeps the slot's q, k, v and their gradient for B sequences (for kiln info):
// "the model's rows" (a ring alone), "the all-to-all's buffers" (Ulysses, one sequence a rank) or "copies of
// their own"
const char *kiln_sp_qkv_place(const struct kiln_sp_layout *lo, const struct kiln_model_config *m, int B);

// The bytes of backend memory kiln_sp_create allocates for B sequences (0 without sequence parallelism)
size_t kiln_sp_buffer_bytes(const struct kiln_sp_layout *lo, const struct kiln_model_config *m, int B,
                            enum kiln_dtype act);

struct kiln_sp;
// Splits the Ulysses and ring communicators off world (collective over world), allocates the buffers for B
// sequences, and takes over the model's attention (kiln_model_set_attention) and positions.
int kiln_sp_create(struct kiln_sp **out, const struct kiln_sp_layout *lo, struct kiln_comm *world,
                   struct kiln_backend *be, struct kiln_model *g, const struct kiln_model_config *m, int B,
                   struct kiln_error *err);
void kiln_sp_free(struct kiln_sp *s);

#endif
