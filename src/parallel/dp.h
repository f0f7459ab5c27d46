// Data parallelism on top of parallel/comm/comm.h: DDP with bucketed, overlapped gradient reduction, and ZeRO-1/2/3.
//
// Buckets: the flat gradient buffer is cut at layer boundaries into buckets of about --bucket-mb, in the
// order the backward completes them (the last layers first; the final norm and the LM head ride with the last
// layer's bucket, the embeddings with layer 0's). On the last micro-step of an optimizer step, a bucket's
// reduction is issued from the model's layer_backward_end hook as soon as its lowest layer's backward is
// done, and runs (on the comm thread or stream) while the backward goes on. Earlier micro-steps communicate
// nothing.
//
// Shards: rank r of n owns slice r (kiln_comm_slice) of every bucket. --zero=0 (DDP) all-reduces each bucket
// and every rank updates every parameter; --zero=1 reduce-scatters each bucket in place (each rank's slice
// summed where it lies in the whole gradient buffer, the rest left partial: half the bytes of an all-reduce),
// a rank keeps AdamW's moments for its own slices only, updates them, and the updated weights are
// all-gathered bucket by bucket; --zero=2 reduce-scatters each bucket into a compact shard, so a rank
// receives, and holds, the reduced gradient of its own slices only: bucket-sized staging buffers take each
// micro-step's gradients (kiln_dp_external_grads), which are reduced every micro-step, since the staging is
// reused (DeepSpeed's ZeRO-2 does the same).
// --zero=3 shards the weights too (FSDP): a rank holds its slices of the f32 master weights and of their
// compute copy, compact like the moments. Its buckets are layers (the last one with the final norm and head,
// the first with the embeddings; --bucket-mb does not apply), and each is all-gathered just before the model
// reads it: from the model's forward_begin and layer_begin hooks, --prefetch layers ahead on the comm stream,
// into a ring of 2 + prefetch slots (the top and bottom buckets stay gathered for the whole step); at world
// size 1 the shard is the whole bucket, and the model reads it in place. Gradients go as under ZeRO-2. The
// whole master weights exist only in host memory, gathered for a checkpoint.
// Gradients are summed, not averaged: the loss of every rank is scaled by 1 / (tokens of the whole step).
//
// The global gradient norm is the same sum at every --zero level: each rank sums the squares of its own
// slices, and the ranks' sums are added. So DDP, ZeRO-1 and ZeRO-2 compute bitwise the same update.
#ifndef KILN_PARALLEL_DP_H
#define KILN_PARALLEL_DP_H

#include "parallel/comm/comm.h"
#include "model/model.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/state.h"
#include "parallel/shard.h" // struct kiln_dp_range: one contiguous range of the flat buffer a rank owns

struct kiln_dp_opts {
    int zero;         // 0, 1, 2 or 3
    double bucket_mb; // MiB of gradients per bucket (at least one layer each)
    int prefetch;     // ZeRO-3: layers gathered ahead of the computing one
    int keep_gathered; // ZeRO-3: each layer's gathered weights stay from its forward to its backward (FSDP's
                       // reshard_after_forward=False): every layer gathered once a step
    int accumulate_whole; // ZeRO-3: whole gradients accumulate across micro-steps, reduce-scattered on the
                          // last one only (FSDP's no_sync)
    int offload;      // 1: master weights and moments in pinned host memory, AdamW on the CPU
    int host_threads; // the offloaded AdamW's OpenMP threads (0: OpenMP's default)
    size_t offload_chunk; // elements per chunk of the offloaded optimizer's pipeline (0: 32M)
    int offload_delay_us; // tests: the host's AdamW sleeps this long before each chunk
    int poison_staging;   // tests: ZeRO-2/3's staging buffers are filled with NaN before each use, so that
                          // any element the backward does not assign (and that is not padding) shows
    int gather_at_one;    // measurements: ZeRO-3 gathers at world size 1 too, instead of reading in place
                          // (to trace the prefetch's overlap on one GPU)
    int gather_wait;      // measurements: ZeRO-1/2 wait for the updated weights' gathers right after AdamW,
                          // instead of letting the next forward wait for each bucket as it reaches it
    // ZeRO-3, FP8 training: the blocks' linear weights of the layers between the top and bottom buckets are
    // all-gathered as e4m3 codes (half the bytes), with tensorwise scales every rank agrees on
    // (kiln_model_linear_groups's groups, the table's n entries; read at kiln_dp_create, NULL: off). The
    // FP8 hook takes them through kiln_dp_fp8_weight. Not with offload.
    const int *fp8_groups;
};

struct kiln_dp;

// Plans buckets and shards for the parameter table on comm's ranks (pt is read here only, not kept); the
// gradients' dtype, and so the wire's, is the backend's.
void kiln_dp_create(struct kiln_dp **out, struct kiln_comm *comm, struct kiln_backend *be,
                    const struct kiln_param_table *pt, const struct kiln_dp_opts *o);
void kiln_dp_free(struct kiln_dp *dp);
// kiln_fp8_set_weight_source's source under ZeRO-3's FP8 all-gather (user: the kiln_dp): the gathered codes
// of the GEMM weight at w (n elements, from a group's first tensor) and their inverse scale; nonzero where w is
// not such a weight of a gathered layer (the hook casts it then)
int kiln_dp_fp8_weight(void *user, const void *w, size_t n, const uint8_t **codes, const float **scale_inv);
// AdamW moments this rank holds (kiln_optim_state_opts.elems): every element under DDP, its slices' under ZeRO.
size_t kiln_dp_optim_elems(const struct kiln_dp *dp);
// Installs the model's hooks, and takes the optimizer's state to step (kept, not owned; offloaded: starts its
// pipeline). The model must have been created with kiln_dp_model_opts, the state with kiln_dp_optim_opts.
void kiln_dp_attach(struct kiln_dp *dp, struct kiln_model *g, struct kiln_optim_state *st);
// The next backward is micro-step `micro` of `accum`: the last one reduces its buckets as they complete.
void kiln_dp_micro_step(struct kiln_dp *dp, int micro, int accum);
// After each micro-step's backward: where it reduced, every bucket's reduction is ordered before what the
// compute stream does next (the host does not wait on the GPU), and ZeRO-2 adds it into the shard.
void kiln_dp_after_backward(struct kiln_dp *dp);
// ZeRO-2 holds no whole gradient buffer: the model is created with external_grads, every micro-step's
// gradients are written into bucket-sized staging buffers (the model's gradient windows), reduce-scattered
// onto the rank's shard as each bucket completes, and summed there over micro-steps. The trainer zeroes the
// model's gradients before every micro-step then.
int kiln_dp_external_grads(const struct kiln_dp *dp);
// What the model holds (kiln_model_opts): no gradient buffer (ZeRO-2 and up: external_grads), and no compute
// weights (ZeRO-3: external_weights, read through the gathered copies).
void kiln_dp_model_opts(const struct kiln_dp *dp, struct kiln_model_opts *o);
// What the optimizer's state holds (kiln_optim_state_opts; the caller sets weights): the moments of
// kiln_dp_optim_elems elements at the ranges' state offsets (ZeRO-1 and up), the master weights compact with
// a compute copy of their own (ZeRO-3), in host memory with --offload=optimizer. held points into dp.
void kiln_dp_optim_opts(const struct kiln_dp *dp, struct kiln_optim_state_opts *o);
// The plan of rank `rank` of `world` without creating anything (kiln info): what data parallelism adds to the
// model's plan, and the model and optimizer-state options it implies (*model: kiln_dp_model_opts; *optim:
// kiln_dp_optim_opts, without held; accum = micro-steps per step).
struct kiln_dp_mem {
    size_t staging;    // backend: ZeRO-2/3's gradient staging buffers
    size_t grad_shard; // backend: the reduced gradients of the rank's slices (with accumulation, their addend)
    size_t gathered;   // backend: ZeRO-3's gathered weights (the top and bottom buckets, the ring of layers;
                       // none at world size 1, where the shard is read in place)
    size_t host;       // --offload: host memory (master weights, moments, gradients, updated compute weights)
};
void kiln_dp_plan_memory(const struct kiln_param_table *pt, const struct kiln_dp_opts *o, int world, int rank,
                         enum kiln_dtype act, enum kiln_dtype grad, int accum, struct kiln_model_opts *model,
                         struct kiln_optim_state_opts *optim, struct kiln_dp_mem *out);
// The global gradient norm (the same value on every rank). *sum (may be NULL) is summed over the ranks in the
// same reduction: the loss, so that the step pays one round trip for both.
double kiln_dp_grad_norm(struct kiln_dp *dp, double *sum);
// Tensor parallelism: the norm's sum of squares is also summed over outer (the tensor-parallel group, whose
// ranks hold different parts of the model), with the elements in w (n ranges, parallel/tp.h) weighted: a
// tensor every rank of the group holds counts once. The reduced gradients in the ns ranges `sums` are first
// summed over outer (Megatron's sequence parallelism: what each rank computed from its rows alone). dp keeps
// copies of both.
struct kiln_norm_weight;
void kiln_dp_set_norm(struct kiln_dp *dp, struct kiln_comm *outer, const struct kiln_norm_weight *w, int n,
                      const struct kiln_norm_weight *sums, int ns);
// AdamW over this rank's part, then (ZeRO) the updated compute weights gathered from their owners: under
// ZeRO-1/2 the gathers are left running, and the next forward waits for each bucket as it reaches it.
void kiln_dp_adamw(struct kiln_dp *dp, const struct kiln_adamw_hparams *h, double grad_norm);
// ZeRO on a mixed-precision backend updates only its slices of the f32 master weights (the compute copy is
// what is gathered every step): this gathers the master weights too, before they are saved.
void kiln_dp_gather_master(struct kiln_dp *dp);
// The whole master weights (host f32, the table's total) as the last kiln_dp_gather_master left them (not a
// collective: every rank may call it, or only the one that writes them).
void kiln_dp_get_master(struct kiln_dp *dp, float *host);
// The whole master weights (host f32) into the optimizer's state (init, resume): this rank's part, and the
// compute copies; gathered copies of the old ones are stale.
void kiln_dp_set_master(struct kiln_dp *dp, const float *host);

// The ranges this rank owns (DDP: its slices too, which is what it writes to a checkpoint) and the bucket
// bounds (n_buckets + 1 flat offsets, descending from pt->total to 0), for checkpoints.
const struct kiln_dp_range *kiln_dp_ranges(const struct kiln_dp *dp, int *n);
const size_t *kiln_dp_bucket_bounds(const struct kiln_dp *dp, int *n_buckets);
int kiln_dp_zero(const struct kiln_dp *dp);
// Seconds the host spent waiting on the gradient reductions so far (the metrics' comm_wait_ms).
double kiln_dp_wait_s(const struct kiln_dp *dp);
// --offload=optimizer: the optimizer step runs on the host beside the training thread (kiln_dp_adamw starts it
// and returns; the next forward waits for each chunk of weights before it reads it). Seconds those steps took
// so far (their wall time: the metrics' offload_ms), and seconds the training thread waited for them
// (offload_wait_ms).
double kiln_dp_offload_s(const struct kiln_dp *dp);
double kiln_dp_offload_wait_s(const struct kiln_dp *dp);
// The bytes the offloaded steps' copies moved so far (both directions), and in *seconds the time they took.
double kiln_dp_offload_copies(const struct kiln_dp *dp, double *seconds);
// Waits for a running offloaded step and for ZeRO-1/2's weight gathers still in flight: before the weights
// are read other than by the forward (a sample).
void kiln_dp_settle(struct kiln_dp *dp);

// The ranges rank r of n owns under these bucket bounds (the same rule as kiln_dp_ranges): for resharding a
// checkpoint written by another world size. Returns the count; *out is malloc'd.
int kiln_dp_ranges_for(const size_t *bounds, int n_buckets, int n, int r, struct kiln_dp_range **out);

#endif
