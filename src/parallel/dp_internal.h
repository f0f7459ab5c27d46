// Data parallelism's insides, shared by its files: dp.c (the struct's life, the hooks' dispatch, the step's
// entry points, the offloaded optimizer's glue), ddp.c (bucketed reductions, ZeRO-2's staging, ZeRO-1/2's
// weight gathers), zero3.c (ZeRO-3's gathered weights). shard.c plans what each rank owns. Not an interface:
// parallel/dp.h is.
#ifndef KILN_PARALLEL_DP_INTERNAL_H
#define KILN_PARALLEL_DP_INTERNAL_H

#include "parallel/dp.h"
#include "parallel/shard.h"
#include "optim/state.h"

// ZeRO-2/3's staging buffers shared by the buckets between the top and the bottom one. A layer's backward
// holds two (its own and, for the biases its norm writes, the layer below's), so with two the backward waits
// for each reduce-scatter before reusing its buffer. A third hides those waits (the compute stream's wait
// fell from 13.3 to 1.8 ms in 8 steps on the H100 at world size 1, KILN_TRACE_COMM) but the step got slower,
// from 136.9 to 138.2 ms at the 1.3B shape: the reduction then runs beside the compute and takes SMs from
// it. Two it is, until it is measured on several GPUs (issue 17).
#define STAGING_SLOTS 2

// A bucket's reduction in flight (its place and slice: the plan's bucket of the same index)
struct bucket {
    void *event; // the compute stream's point where the bucket is complete (NULL on the CPU)
    struct kiln_comm_work *work;
    // ZeRO-2: where the bucket's gradients are written this micro-step (a staging buffer), or NULL
    void *stage;
};

// ZeRO-3: one bucket's compute weights, gathered, and whether they are the current ones (until AdamW)
struct unit {
    void *p;      // NULL when the model reads the shard in place (world size 1)
    int bucket;   // whose weights it holds, -1: none
    int valid;    // gathered (or being gathered) since the last update
    void *issued; // the compute stream's point where its gather was issued (NULL on the CPU)
    struct kiln_comm_work *work;
    uint8_t *q;   // FP8 all-gather: the bucket's codes (a layer between the top and bottom buckets), or NULL
};

// ZeRO-3's FP8 all-gather (kiln_dp_opts.fp8_groups). Each step, once the weights are updated: the small
// tensors of the layers between (norms, biases: whatever no GEMM casts) go to every rank by one all-reduce
// (each rank writes its own elements, zeros elsewhere: the sum is exact); each GEMM weight's amax is the
// largest of the ranks' (one all-reduce of a float each); each rank casts its slices of those weights to
// e4m3 codes with that scale. Each layer's gather then moves the codes (one byte an element), and the small
// tensors are copied into the gathered buffer from the all-reduced copy.
struct dp_fp8_group {
    size_t lo, hi; // flat elements of the GEMM weight (its tensors, touching)
};
struct dp_fp8_seg {
    int g;         // the group (codes), or -1 (a small tensor)
    size_t lo, hi; // flat elements: a piece of this rank's range
    size_t so;     // its state offset (in the shard's weights and codes)
    size_t at;     // small: where it sits in the all-reduced copy
};
struct dp_fp8_small {
    size_t lo, n, at; // a small tensor of a gathered layer: flat elements, and its place in the copy
};
struct dp_fp8 {
    struct dp_fp8_group *grp; // sorted by lo
    int ng;
    struct dp_fp8_seg *seg; // this rank's pieces
    int nseg;
    struct dp_fp8_small *small; // every rank's, sorted by lo
    int nsmall;
    size_t small_elems;
    uint8_t *q;         // (optim_elems) this rank's codes at its ranges' state offsets
    void *S;            // (small_elems) act dtype: the small tensors, all-reduced
    float *amax, *sinv; // (ng) each group's amax (the largest of the ranks') and inverse scale
    void *unit_x;       // (ng) act dtype zeros, and (ng) bytes: what the inverse scales' one cast reads and writes
    uint8_t *unit_q;
    void *ev;           // the compute stream's point before each of the step's two all-reduces
    int ready;          // cast since the last update
    struct kiln_comm_work *s_work; // the small tensors' all-reduce, until a layer waits for it
};

// ZeRO-2's staging buffers: the top bucket (the final norm and head, written from the classifier on) and the
// bottom one (the embeddings) have one each; the buckets between share two, in turn.
struct slot {
    void *p;
    int bucket; // whose gradients it holds now, -1: none
};

// Where the step reads and writes, backend memory: the optimizer state's master weights (f32; NULL offloaded)
// and compute copy (the model's, or under ZeRO-3 the state's compact one), the model's gradients (NULL under
// ZeRO-2/3, which stage them), and the state's moments.
struct dp_buffers {
    float *params;
    void *weights;
    void *grads;
    float *m, *v;
};

struct kiln_dp {
    struct kiln_comm *comm;
    struct kiln_backend *be;
    struct kiln_model *g;
    struct kiln_optim_state *st; // the optimizer's state: master weights and moments (the caller's)
    struct dp_buffers buf;
    struct kiln_param_span *held; // (sh.n_ranges) the ranges as the state's held runs (ZeRO), or NULL (DDP)
    int zero;
    struct kiln_shard_plan sh; // buckets (sh.b[0] is the last layers'), this rank's ranges and spans
    struct bucket *b;          // (sh.nb) the buckets' reductions
    int nb;                    // sh.nb
    size_t optim_elems;
    struct kiln_param_span *all_spans; // DDP's: every tensor, state offset = offset
    int n_all_spans;
    int reducing; // this backward is the last micro-step: reduce buckets as they complete
    // ZeRO-2: the gradients live in staging buffers for one micro-step, then in the shard
    const size_t *seg_begin; // the model's gradient segments (kiln_model_grad_segments)
    int n_seg;
    void *top, *bottom; // staging of b[0] and b[nb - 1]
    struct slot mid[STAGING_SLOTS];
    int next_slot;
    void *shard;     // (optim_elems) the reduced gradients of this rank's slices, summed over micro-steps
    void *shard_tmp; // (optim_elems) f32: a later micro-step's reduction, before it is added
    int micro;       // this micro-step's index
    // ZeRO-3: the compute weights of each bucket are gathered from their owners when the model needs them.
    // The top bucket (the last layer, final norm, head) and the bottom one (embeddings, layer 0) stay
    // gathered from the first forward of a step to its last backward; each layer between has its own bucket
    // and comes through a ring of K slots: the computing layer, the next one (whose first norm ends this
    // one's forward) and --prefetch more; with keep_gathered, a slot for each of them, kept until the weights
    // change.
    int L, K;
    int ahead; // layers gathered ahead of the computing one: the next and --prefetch more
    int keep;  // keep_gathered
    int whole; // accumulate_whole: ZeRO-3's gradients live whole in the model's buffer (as DDP's), not staged
    // ZeRO-3 at world size 1: a bucket's shard is the whole bucket, laid out as its gathered copy would be,
    // so the model reads the shard in place; the units only name the bucket, and hold no memory
    int in_place;
    struct unit *top_w, *bottom_w; // the top and bottom buckets' gathered weights
    int *fp8_groups;               // (the table's n) kiln_dp_opts.fp8_groups, or NULL
    struct dp_fp8 *fp8;            // the FP8 all-gather's state, once attached (NULL: off)
    struct unit *slots;            // (K) the layers' between, slot l % K for layer l
    float *host_master; // (the table's total) the whole master weights, after kiln_dp_gather_master
    // --offload=optimizer: this rank's part (optim_elems, at the spans' state offsets) of the f32 master
    // weights and AdamW's moments live in host memory, where the optimizer's pipeline updates them (the
    // state's: it starts the pipeline over its host memory, and frees it)
    int offload, host_threads;
    size_t chunk;                  // elements a chunk of the pipeline (0: its default)
    int delay_us;                  // tests: the host's AdamW sleeps this long before each chunk
    struct kiln_offload_pipe *off; // the state's pipeline, once attached
    // ZeRO-1/2 with the optimizer on the device: the updated compute weights' gathers, one a bucket, issued
    // after AdamW in the forward's order (bottom bucket first) and waited for by the next forward as it
    // reaches each bucket (the compute stream waits, not the host), so that they run under it; NULL once
    // waited. gather_wait: all waited for at once, right after AdamW (KILN_ZERO_GATHER=wait, a baseline)
    struct kiln_comm_work **wg;
    int gather_wait;
    int poison; // tests: staging filled with NaN before each use (kiln_dp_opts)
    // tensor parallelism: the gradient norm counts each copy a group holds once (kiln_dp_set_norm)
    struct kiln_comm *norm_outer;
    struct kiln_norm_weight *norm_w, *sum_w;
    int n_norm_w, n_sum_w;
};

// Backend memory, or the job's end with a message naming what did not fit.
void *dp_alloc_or_die(struct kiln_dp *dp, size_t bytes, const char *what);
static inline size_t dp_grad_bytes(const struct kiln_dp *dp) {
    return kiln_dtype_bytes(dp->be->grad_dtype);
}
// The bucket that holds the model's gradient segment s.
static inline int dp_bucket_of_seg(const struct kiln_dp *dp, int s) {
    return kiln_shard_bucket_of(&dp->sh, dp->seg_begin[s]);
}

// ---- ddp.c: reductions, ZeRO-2's staging, ZeRO-1/2's gathers of the updated weights ----
// Installs the hooks of gradient reduction and, under ZeRO-1/2/3, the staging and gathers; allocates them.
void dp_attach_reduce(struct kiln_dp *dp, struct kiln_model_hooks *h);
// Before layer l's backward (recompute = 1): its bucket and the one below have staging buffers (ZeRO-2).
void dp_stage_layer(struct kiln_dp *dp, int l, int recompute);
// The next backward's buckets and staging (kiln_dp_micro_step's ZeRO-2 part).
void dp_stage_micro_step(struct kiln_dp *dp);
// Issues the in-place gathers of every bucket's compute weights (master = 1: its f32 master weights), the
// bottom bucket first, into w[i]; dp_gather_weights waits for them on the compute stream.
void dp_issue_gathers(struct kiln_dp *dp, int master, struct kiln_comm_work **w);
void dp_gather_weights(struct kiln_dp *dp, int master);
// The compute stream waits for the weight gathers of the buckets below flat element limit (SIZE_MAX: all).
void dp_weights_through(struct kiln_dp *dp, size_t limit);

// ---- zero3.c: ZeRO-3's gathered weights ----
void dp_attach_zero3(struct kiln_dp *dp, struct kiln_model_hooks *h);
void dp_free_zero3(struct kiln_dp *dp);
// The shards changed (AdamW, or new parameters): every gathered copy is stale.
void dp_invalidate_units(struct kiln_dp *dp);

#endif
