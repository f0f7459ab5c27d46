// ZeRO's arithmetic: the buckets of the flat parameter buffer, each rank's slices of them, where those slices
// sit in the rank's compact state, and AdamW's spans over them. Pure functions of the parameter table, the
// options and (world, rank): no backend, no communication. dp.c plans with them, kiln info's memory plan and
// the checkpoints' resharding use the same rules.
//
// Buckets are cut at layer boundaries, in the order the backward completes them: b[0] is the top (the last
// layers, with the final norm and the LM head), b[nb - 1] the bottom (layer 0's, with the embeddings). Each
// takes layers downwards until it holds bucket_mb of gradients (ZeRO-3: one layer each). Rank r of n owns
// slice r of every bucket (kiln_comm_slice: sizes differ by at most one element), and keeps the state of its
// slices compact, bucket after bucket, in bucket order.
#ifndef KILN_PARALLEL_SHARD_H
#define KILN_PARALLEL_SHARD_H

#include <stddef.h>

#include "core/ops.h"
#include "model/params.h"

// One contiguous range of the flat parameter buffer that a rank owns, and where its state sits.
struct kiln_dp_range {
    size_t lo, hi;       // flat elements [lo, hi)
    size_t state_offset; // its first element's index in the rank's moments
};

struct kiln_shard_bucket {
    size_t lo, hi;       // flat elements
    int ready_layer;     // complete after this layer's backward; -1: after the embeddings' (lo == 0)
    size_t state_offset; // where this rank's slice of it sits in the rank's compact state
    size_t slice_lo;     // this rank's slice: flat [lo + slice_lo, lo + slice_hi)
    size_t slice_hi;
    int gap0, n_gaps; // its padding between tensors: gaps[gap0 .. gap0 + n_gaps)
};

struct kiln_shard_gap {
    size_t lo, hi; // flat elements that no tensor holds
};

// What a rank of a data-parallel group owns, planned from the table alone.
struct kiln_shard_plan {
    int world, rank;
    struct kiln_shard_bucket *b; // (nb) in backward order
    int nb;
    size_t *bounds;               // (nb + 1) b[i] = [bounds[i + 1], bounds[i]), descending from total to 0
    struct kiln_dp_range *ranges; // this rank's non-empty slices, in bucket order, compact state offsets
    int n_ranges;
    size_t owned;                  // elements of the ranges
    struct kiln_param_span *spans; // every tensor cut to the ranges (padding excluded), with state offsets
    int n_spans;
    struct kiln_shard_gap *gaps; // every bucket's padding, bucket by bucket
    int n_gaps;
};

// Buckets of bucket_mb MiB of gradients of grad_bytes each (layer_buckets: one a layer, as ZeRO-3 gathers
// them), and rank `rank` of `world`'s share of them.
void kiln_shard_plan(struct kiln_shard_plan *p, const struct kiln_param_table *pt, int layer_buckets,
                     double bucket_mb, size_t grad_bytes, int world, int rank);
void kiln_shard_plan_free(struct kiln_shard_plan *p);
// The bucket that holds flat element at (the bottom one past the end).
int kiln_shard_bucket_of(const struct kiln_shard_plan *p, size_t at);
// The largest bucket between the top and the bottom one, in elements (0: none): the size of the buffers the
// buckets between share.
size_t kiln_shard_mid_elems(const struct kiln_shard_plan *p);

#endif
