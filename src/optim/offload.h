// The offloaded AdamW (--offload=optimizer): the f32 master weights and the moments of what this process
// updates live in host memory, and the step runs there, beside the training thread.
//
// The step streams through the host in chunks: while the host runs AdamW on chunk k, a copy thread brings
// chunk k+1's gradients down and takes chunk k-1's updated compute weights up, through two page-locked
// staging buffers each way, so the copies hide behind the host's arithmetic and host memory holds the master
// weights and moments only, not a second copy of the gradients or of the weights.
//
// kiln_offload_step starts the step and returns; whoever reads the compute weights next waits for the chunks
// it reads (kiln_offload_wait), so the host's AdamW overlaps the next forward. The chunks go in the order the
// pieces say that forward reads them. Everything else that reads or writes the host state or the gradients
// settles the step first. The host AdamW is core/adamw_host.c, the CPU backend's own code, so on the CPU the
// weights are bitwise those of kiln_adamw_step over the same spans.
#ifndef KILN_OPTIM_OFFLOAD_H
#define KILN_OPTIM_OFFLOAD_H

#include <stddef.h>

#include "core/ops.h"
#include "optim/adamw.h"

// elements a chunk of the pipeline, unless kiln_offload_opts says
#define KILN_OFFLOAD_CHUNK ((size_t)1 << 25)

// A run of the flat buffer that this process updates.
struct kiln_offload_piece {
    size_t lo, hi; // flat elements [lo, hi)
    size_t so;     // lo's state offset: where its master weights and moments sit in host memory (compact)
    int order;     // when the next forward first reads it: the chunks are ordered by it (ties keep the
                   // pieces' order)
};

struct kiln_offload_opts {
    size_t elems; // master weights and moments held (f32 each): every piece's and span's state offsets lie
                  // in [0, elems)
    size_t total; // the flat buffer's elements (the whole compute copy, when it is not compact)
    const struct kiln_offload_piece *pieces; // what this process updates (copied)
    int n_pieces;
    const struct kiln_param_span *spans; // AdamW's spans over the pieces, at their state offsets (copied)
    int n_spans;
    const void *grads; // backend, grad dtype: the reduced gradients, at flat offsets, or at state offsets
    int grads_compact; // with grads_compact (a ZeRO-2/3 shard)
    void *weights;     // backend, act dtype: the compute copy, where each chunk's updated weights go, at flat
    int weights_compact; // offsets, or at state offsets with weights_compact (a ZeRO-3 shard)
    size_t chunk;        // elements a chunk (0: KILN_OFFLOAD_CHUNK)
    int host_threads;    // the host AdamW's OpenMP threads (0: OpenMP's default)
    int delay_us; // tests: the host sleeps this long before each chunk's AdamW, so that readers must wait
};

struct kiln_offload_pipe;

// Plans the chunks and allocates the host state (master weights unset, moments zero) and the staging.
void kiln_offload_create(struct kiln_offload_pipe **out, struct kiln_backend *be,
                         const struct kiln_offload_opts *o);
void kiln_offload_free(struct kiln_offload_pipe *o); // settles a running step first; NULL is fine
// Host memory the pipeline holds for elems elements in chunks of chunk (0: the default): the master weights,
// the moments, and two staging chunks each way (the data-parallel layer's memory plan).
size_t kiln_offload_host_bytes(size_t elems, size_t chunk, enum kiln_dtype grad, enum kiln_dtype act);

// The host state, at state offsets (elems each): the master weights, and the moments. Settle before reading
// or writing them while a step may run.
float *kiln_offload_master(struct kiln_offload_pipe *o);
void kiln_offload_moments(struct kiln_offload_pipe *o, float **m, float **v);
// The whole flat master weights (host, opts.total) into the host master (each piece's part; nothing to copy
// where host is the master itself, laid out flat) and the compute copy (each piece's part where it is
// compact, else all of it). Settles first.
void kiln_offload_set_master(struct kiln_offload_pipe *o, const float *host);

// Starts a step: AdamW over the spans with these hyperparameters, the gradients read from the backend chunk
// by chunk and the updated compute weights written back; returns at once (a step still running is settled
// first). -1: its threads could not be started (nothing runs then).
int kiln_offload_step(struct kiln_offload_pipe *o, const struct kiln_adamw_hparams *h, double grad_norm);
// Whether a step is running (started and not yet settled). NULL: 0.
int kiln_offload_running(const struct kiln_offload_pipe *o);
// Waits until the running step (if any) has taken the first `chunks` chunks' weights up; with all of them the
// step is over and settled. NULL is fine.
void kiln_offload_wait(struct kiln_offload_pipe *o, int chunks);
// Waits until the running step (if any) has brought the first `chunks` chunks' gradients down: before they
// are overwritten. NULL is fine.
void kiln_offload_wait_grads(struct kiln_offload_pipe *o, int chunks);
// Waits for the whole running step. NULL is fine.
void kiln_offload_settle(struct kiln_offload_pipe *o);

// Chunks: their count, the chunks up to order `order` (what a reader of that part must wait for), and the
// chunks through the last one that holds part of the state offsets [so, so + n).
int kiln_offload_chunks(const struct kiln_offload_pipe *o);
int kiln_offload_chunks_through(const struct kiln_offload_pipe *o, int order);
int kiln_offload_chunks_over(const struct kiln_offload_pipe *o, size_t so, size_t n);

// Seconds the steps took so far (their wall time, from the start to the last chunk's weights up), seconds
// the callers waited for them, and the copies' own seconds and bytes (both directions).
struct kiln_offload_stats {
    double busy_s, wait_s, copy_s, copy_bytes;
};
void kiln_offload_stats(const struct kiln_offload_pipe *o, struct kiln_offload_stats *out);

#endif
