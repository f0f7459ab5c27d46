// The training data loader: B x (T+1) windows of tokens from memory-mapped shards, in a deterministic,
// resumable, rank-partitioned order.
//
// Windows: within each source (shard file, or the one memory array), windows of T+1 tokens start at multiples
//   of T: tokens [k*T, k*T + T] for every k with k*T + T < n. They never cross a shard, so a shard of n
//   tokens has (n - 1) / T windows (0 when n <= T). Windows are numbered 0..W-1 in source order (files sorted
//   by name).
// Epochs: epoch e visits every window once, in the order perm_e(0), perm_e(1), ..., perm_e(W-1): the identity
//   when shuffle = 0, else a pseudorandom permutation seeded by (seed, e) (a Feistel network over [0, W) with
//   cycle walking: O(1) memory, random access, so any position can be resumed without replaying).
// Stream: the global stream is epoch 0's order, then epoch 1's, ...; element g is window perm_{g/W}(g % W).
// Ranks: rank r takes stream elements r, r + world, r + 2*world, ... A batch is B consecutive elements of
// that
//   sub-stream (batches may cross epoch boundaries); inputs[b*T + t] = window[t], targets[b*T + t] =
//   window[t + 1]. Across all ranks every window is seen exactly once per epoch.
// State: after every rank has taken k batches, the state is the global stream position k*B*world (as epoch
//   and position within the epoch). It is the same on every rank, and set_state restarts each rank at
//   position + rank, so a resumed run (even with a different world size) sees exactly the windows that
//   follow.
// Prefetch: a background thread prepares the next batch while the caller trains on the current one. Results
//   are identical with prefetch on or off.
#ifndef KILN_DATA_LOADER_H
#define KILN_DATA_LOADER_H

#include <stddef.h>
#include <stdint.h>

struct kiln_error;
struct kiln_loader;

struct kiln_loader_opts {
    int B, T;      // batch size (windows per batch) and sequence length
    uint64_t seed; // shuffle seed
    int rank, world;
    int shuffle;    // 0: windows in order every epoch (validation)
    int prefetch;   // 1: background thread
    int vocab_size; // ids >= this are an error at open (<= 0: not checked)
};

struct kiln_loader_state {
    uint64_t epoch, position; // exact resume point: position in [0, num_windows) of the epoch
};

// Opens every file matching glob_pattern (sorted): .bin shards (both layouts) or .npy arrays, memory-mapped
// and validated (shards.h). A pattern matching nothing, or data without a single window, is an error.
int kiln_loader_open_files(struct kiln_loader **out, const char *glob_pattern,
                           const struct kiln_loader_opts *o, struct kiln_error *err);
// Borrows tokens[0..n) (no copy): the caller keeps it alive and unchanged until kiln_loader_close.
int kiln_loader_open_memory(struct kiln_loader **out, const int32_t *tokens, size_t n,
                            const struct kiln_loader_opts *o, struct kiln_error *err);
// Fills inputs and targets, each (B, T) row-major, with the next batch of this rank. Returns 0.
int kiln_loader_next(struct kiln_loader *l, int32_t *inputs, int32_t *targets);
void kiln_loader_get_state(const struct kiln_loader *l, struct kiln_loader_state *s);
// Resumes at s (from get_state, possibly on another world size). position >= num_windows is an error.
int kiln_loader_set_state(struct kiln_loader *l, const struct kiln_loader_state *s, struct kiln_error *err);
void kiln_loader_reset(struct kiln_loader *l); // back to epoch 0 position 0 (for validation passes)
uint64_t kiln_loader_num_windows(const struct kiln_loader *l);  // W, over all ranks
uint64_t kiln_loader_num_tokens(const struct kiln_loader *l);   // tokens in all sources
uint64_t kiln_loader_rank_windows(const struct kiln_loader *l); // windows of one epoch this rank gets
int kiln_loader_num_files(const struct kiln_loader *l);
// Window w (0..W-1) as (source index, first token offset): for tests and tools.
void kiln_loader_window(const struct kiln_loader *l, uint64_t w, int *file, uint64_t *offset);
// The window of global stream element g: perm_{g / W}(g % W).
uint64_t kiln_loader_stream_window(const struct kiln_loader *l, uint64_t g);
void kiln_loader_close(struct kiln_loader *l);

#endif
