// The optimizer's state: the f32 master weights that AdamW updates and its moments m and v, held apart from
// the model, which keeps only its compute weights (model/model.h) and reads them where a strategy points it.
//
// The master weights are flat (the parameter table's total elements, laid out as the model's compute copy)
// or, for a shard of the weights (ZeRO-3), compact: the held runs of the flat buffer one after another, at
// their state offsets, with a compute copy of their own (act dtype) that AdamW updates beside them. The
// moments are `elems` each, at state offsets (one per element, or a ZeRO rank's slices). They live in backend
// memory or, offloaded, in host memory: the buffers of the offloaded pipeline (optim/offload.h), which
// kiln_optim_state_offload starts over the state.
//
// Where the backend's compute weights are the master (be->weights_alias_master: the CPU, in f32), a flat
// master is the model's compute copy itself and a compact one is its own compute copy: one buffer, which
// AdamW updates once, so that the CPU's numbers are those of a model that held its master.
#ifndef KILN_OPTIM_STATE_H
#define KILN_OPTIM_STATE_H

#include <stddef.h>

#include "core/ops.h"
#include "optim/adamw.h"
#include "optim/offload.h"
#include "util/error.h"

struct kiln_optim_state_opts {
    size_t total; // the flat buffer's elements (the parameter table's total)
    size_t elems; // moments held, each of m and v (0: total, state offset = offset); a ZeRO rank's slices
    // Where the held runs of the flat buffer sit in the compact state: span k is flat [offset, offset +
    // count) at state offset state_offset (decay unused), copied. NULL: every element, state offset =
    // offset. Read where the master is compact (master_compact, or offloaded under ZeRO).
    const struct kiln_param_span *held;
    int n_held;
    int master_compact; // the master weights are compact too (ZeRO-3), with their own compute copy: the model
                        // holds none (kiln_model_opts.external_weights)
    int offload;        // master and moments in host memory (kiln_optim_state_offload starts the pipeline)
    void *weights;      // the model's compute copy (backend, act dtype, total elements) that a flat master
                        // updates with it; where the backend's weights alias the master, the master itself
    size_t beside_bytes; // what is planned beside the state on its backend (the model's plan): the
                         // out-of-memory message quotes the sum
};

// Backend bytes the state holds, planned without allocating.
struct kiln_optim_plan {
    size_t params_bytes;  // f32 master weights (a compact compute copy where it is the master)
    size_t weights_bytes; // a compact compute copy of its own (act dtype)
    size_t optim_bytes;   // AdamW m and v
    size_t total_bytes;
};
void kiln_optim_state_plan(const struct kiln_optim_state_opts *o, enum kiln_dtype act,
                           int weights_alias_master, struct kiln_optim_plan *out);

struct kiln_optim_state;

// Allocates the state on be (master weights unset, moments zero; offloaded: nothing on the host until
// kiln_optim_state_offload). Out of memory is an error that quotes the plan.
int kiln_optim_state_create(struct kiln_optim_state **out, struct kiln_backend *be,
                            const struct kiln_optim_state_opts *o, struct kiln_error *err);
void kiln_optim_state_free(
    struct kiln_optim_state *s); // a running offloaded step settles first; NULL is fine

// Offloaded: starts the pipeline over the state's host memory. o's pieces, spans, gradients, chunk and
// threads are the caller's (the data-parallel layer's order of reading); elems, total and the compute copy
// (weights, weights_compact) are the state's, set here.
void kiln_optim_state_offload(struct kiln_optim_state *s, const struct kiln_offload_opts *o);
// The pipeline (NULL unless offloaded and started): its steps, waits and statistics.
struct kiln_offload_pipe *kiln_optim_state_pipe(const struct kiln_optim_state *s);

// Where an AdamW step on the backend reads and writes (not offloaded): the master weights, the compute copy,
// the moments and params_compact; grads and grads_compact are the caller's to set.
void kiln_optim_state_buffers(const struct kiln_optim_state *s, struct kiln_adamw_buffers *b);
// The compute copy the state updates: the model's (flat), or its own compact one.
void *kiln_optim_state_weights(const struct kiln_optim_state *s);
size_t kiln_optim_state_elems(const struct kiln_optim_state *s);

// The whole flat master weights (host f32, total elements) into the state: its held runs of them, and the
// compute copy it updates (the model's, or its own compact one). Settles an offloaded step first.
void kiln_optim_state_set_master(struct kiln_optim_state *s, const float *host);
// Offloaded with a flat host master (every element, state offset = offset): that buffer, which
// kiln_optim_state_set_master then takes in place (a second copy of an 8B model's weights would not fit the
// host); else NULL.
float *kiln_optim_state_host_master(struct kiln_optim_state *s);
// State offsets [so, so + n) of the master weights, and of the moments, to host f32 (a checkpoint's
// snapshot); a flat master's state offsets are its flat ones. Settles an offloaded step first.
void kiln_optim_state_get_master(struct kiln_optim_state *s, size_t so, size_t n, float *host);
void kiln_optim_state_get_moments(struct kiln_optim_state *s, size_t so, size_t n, float *m, float *v);
// All the moments (elems each) from host f32.
void kiln_optim_state_set_moments(struct kiln_optim_state *s, const float *m, const float *v);

#endif
