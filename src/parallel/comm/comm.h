// Collectives behind one interface (docs/architecture.md): a communicator is a group of ranks on one
// transport, and every operation goes through it. Three transports, none of them home-made:
//   single  one process: every operation is a copy or nothing;
//   mpi     OpenMPI, for host memory; device memory is staged through host memory by the backend's
//           download/upload (so that several ranks can share one GPU in tests);
//   nccl    NCCL, device memory, one GPU per rank (CUDA builds: comm_nccl.cu).
//
// Operations are asynchronous. Each returns a work handle, or NULL when it already completed; completion is
// awaited with kiln_comm_wait (the host blocks) or ordered on the backend's compute stream with
// kiln_comm_wait_stream (the host goes on; on the CPU that is a host wait too). Every rank must issue the
// same operations on a communicator in the same order: that is how the transports match them up.
// Operations on one communicator complete in the order they were issued; two communicators are independent,
// which is why the background checkpoint writer has one of its own (kiln_comm_dup).
//
// Faults in a transport (a peer that died, a timeout) abort the process with a message naming the rank and
// the operation: a collective that cannot complete has no result to return, and the launcher (kiln launch,
// mpirun, Slurm) brings the rest of the job down and restarts it from the last checkpoint.
#ifndef KILN_COMM_COMM_H
#define KILN_COMM_COMM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/ops.h"
#include "util/error.h"

struct kiln_backend;

enum kiln_red { KILN_RED_SUM = 0, KILN_RED_MAX = 1, KILN_RED_MIN = 2 };

enum kiln_coll_op {
    KILN_COLL_ALL_REDUCE = 0, // recv = reduce over ranks of send (count elements each; recv may == send)
    KILN_COLL_REDUCE_SCATTER, // recv = this rank's slice (kiln_comm_slice of count) of the reduction over
                              // ranks of send (count); in place when recv == send + lo
    KILN_COLL_ALL_GATHER,     // recv (count) = every rank's slice, each from that rank's send (its slice's
                              // length); in place when send == recv + lo
    KILN_COLL_ALL_TO_ALL,     // recv block j (count) = rank j's send block `rank` (count); send and recv
                              // (count*n)
    KILN_COLL_BROADCAST,      // recv (count) on every rank = root's send (count) (recv may == send)
    KILN_COLL_SEND,           // send (count) to peer
    KILN_COLL_RECV,           // recv (count) from peer
    KILN_COLL_BARRIER,        // no data
    KILN_COLL_SEND_RECV,      // send (count) to peer and recv (count) from src at once: a step around a ring,
                              // where a send before a receive on every rank would wait in a cycle
    KILN_COLL_N
};
const char *kiln_coll_name(enum kiln_coll_op op); // "all_reduce", ...

struct kiln_coll {
    enum kiln_coll_op op;
    const void *send;
    void *recv;
    size_t count; // elements per rank (see each op)
    enum kiln_dtype dtype;
    enum kiln_red red;
    int root;   // broadcast
    int peer;   // send/recv: a rank of this communicator
    int src;    // send_recv: the rank recv comes from (peer is where send goes)
    int device; // 1: send/recv are backend (device) memory; 0: host memory
};

enum kiln_comm_kind { KILN_COMM_SINGLE = 0, KILN_COMM_MPI = 1, KILN_COMM_NCCL = 2 };
const char *kiln_comm_kind_name(enum kiln_comm_kind k); // "single", "mpi", "nccl"

struct kiln_comm_work;

// A transport's side of a communicator (comm_single.c, comm_mpi.c, comm_nccl.cu).
struct kiln_comm_impl {
    const char *name;
    // Issues c. after_event: a backend event (ops->event_record) the operation must wait for before it reads
    // device memory (NULL: none, or host memory). Returns a work handle, or NULL when c already completed.
    struct kiln_comm_work *(*submit)(void *impl, const struct kiln_coll *c, void *after_event);
    void (*wait)(void *impl, struct kiln_comm_work *w);        // host waits, then frees w
    void (*wait_stream)(void *impl, struct kiln_comm_work *w); // compute stream waits, then frees w
    // the ranks that pass the same color, ordered by key: a new communicator (collective over this one);
    // flags: KILN_COMM_SPLIT_* (a transport ignores those it has no use for)
    int (*split)(void *impl, int color, int key, unsigned flags, void **out, int *rank, int *size,
                 struct kiln_error *err);
    void (*close)(void *impl); // frees this communicator
    // Unblocks every operation in flight so that the process can exit after a hang (ncclCommAbort); NULL
    // where ending the process is enough (MPI_Abort ends every rank's operations).
    void (*abort)(void *impl);
    // Device memory registered with the communicator as a symmetric window (collective over it; NULL hooks:
    // the transport has none). See kiln_comm_window_alloc.
    void *(*window_alloc)(void *impl, size_t bytes);
    void (*window_free)(void *impl, void *p);
};

struct kiln_comm {
    enum kiln_comm_kind kind;
    int rank, size; // in this group
    const struct kiln_comm_impl *impl;
    void *state;             // the transport's
    struct kiln_backend *be; // for device memory (staging, events); NULL: host memory only
    // time the host spent blocked in kiln_comm_wait, for the metrics' comm_wait_ms
    double wait_s;
    uint64_t seq; // operations issued so far (the flight recorder's sequence number)
    int id;       // the flight recorder's communicator id: creation order, the same on every rank
    struct kiln_comm_flight *flight; // work handles in flight and their recorder tokens (comm.c)
    // The one thread that issues its operations (the one that opened it): NCCL deadlocks where two threads'
    // collectives on one GPU reach the device in different orders on different ranks, so kiln_comm_submit
    // refuses a second thread, on every transport (the CPU's tests then catch what only GPUs would show).
    pthread_t owner;
};

// ---- the world ---------------------------------------------------------------------------------

// Where a process sits in the job, read from the environment of the launcher that started it (parallel/comm/env.h).
struct kiln_dist_env;

// NCCL's CTA policy (NCCL 2.27+), which trades collective speed for SMs left to the overlapped compute.
enum kiln_nccl_cta_policy { KILN_NCCL_CTA_DEFAULT = 0, KILN_NCCL_CTA_EFFICIENCY, KILN_NCCL_CTA_ZERO };

struct kiln_comm_open_opts {
    enum kiln_comm_kind kind;
    int device_is_gpu; // the backend holds tensors in device memory
    struct kiln_backend *be;
    double timeout_s; // rendezvous (the TCP store, NCCL's id exchange)
    // For measurements and tests; all 0 (or NULL) are the defaults. run/knobs.c fills them from the
    // environment (the knob each comment names), once at start-up; communicators split from this one
    // inherit them.
    // KILN_TRACE_COMM (nccl): a CSV trace of every device operation, written at close (comm_nccl.cu)
    const char *trace_path;
    enum kiln_nccl_cta_policy nccl_cta_policy; // KILN_NCCL_CTA_POLICY (nccl)
    int nccl_max_ctas;    // KILN_NCCL_MAX_CTAS (nccl): at most this many CTAs (1..64; 0: NCCL's default)
    int nccl_stream_high; // KILN_NCCL_STREAM_PRIORITY=high (nccl): the comm stream at the greatest priority
    // KILN_COMM_DELAY_US (mpi): the worker sleeps this long before each operation (tests: collectives that
    // complete late)
    int mpi_delay_us;
};

// Opens the world communicator of kind o->kind (resolved from --comm by kiln_comm_choose). A transport that
// this build lacks is a usage error naming what is missing.
int kiln_comm_open_world(const struct kiln_dist_env *env, const struct kiln_comm_open_opts *o,
                         struct kiln_comm **out, struct kiln_error *err);
// A communicator over the same ranks whose operations never wait for this one's (and vice versa).
int kiln_comm_dup(struct kiln_comm *c, struct kiln_comm **out, struct kiln_error *err);
// Sub-groups (the data-parallel and sequence-parallel groups of a mesh): every rank of c calls this, and the
// ranks that pass the same color form one new communicator, ranked by key (ties by their rank in c). Like
// every operation, it must be called in the same order on every rank.
int kiln_comm_split(struct kiln_comm *c, int color, int key, struct kiln_comm **out, struct kiln_error *err);
// KILN_COMM_SPLIT_COPY_ENGINE (NCCL 2.28+): the new communicator asks for NCCL's zero-CTA policy, under which
// an all-gather whose output lies in one of its windows (kiln_comm_window_alloc) runs on the GPU's copy
// engines, leaving every SM to the GEMMs it overlaps; its other collectives still run as kernels.
#define KILN_COMM_SPLIT_COPY_ENGINE 1u
int kiln_comm_split_flags(struct kiln_comm *c, int color, int key, unsigned flags, struct kiln_comm **out,
                          struct kiln_error *err);
// bytes of device memory registered with c as a symmetric window (every rank of c calls it, in the same
// order, with the same size), for the outputs of c's collectives; NULL where the transport has no windows
// (the caller allocates as usual). Free with kiln_comm_window_free before closing c.
void *kiln_comm_window_alloc(struct kiln_comm *c, size_t bytes);
void kiln_comm_window_free(struct kiln_comm *c, void *p); // NULL is fine
void kiln_comm_close(struct kiln_comm *c); // NULL is fine
// Ends this process after a fatal error in a job of several processes, so that no other rank waits forever
// in a collective it can never complete: MPI_Abort under MPI (mpirun then stops every rank), else exit(code)
// (kiln launch stops the rest of the group when one rank exits non-zero).
void kiln_comm_abort_job(int code);
// After a hang (the watchdog): aborts every open communicator that needs it (NCCL), then ends the job as
// kiln_comm_abort_job does. Never returns.
void kiln_comm_abort_all(int code);

// --comm=auto|nccl|mpi|single against what the job is: auto takes single for one process, nccl for CUDA
// devices when this build has it, else mpi. A choice that cannot work (nccl on the CPU, mpi in a build
// without MPI, mpi for several processes that mpirun did not start, single for more than one process) is a
// usage error naming the option; one process may run mpi without mpirun (world size 1).
int kiln_comm_choose(const char *opt, const struct kiln_dist_env *env, int device_is_gpu,
                     enum kiln_comm_kind *out, struct kiln_error *err);
// Which transports this build has: "single mpi nccl" or less.
const char *kiln_comm_compiled(void);

// Rank r's slice of count elements split over n ranks: [lo, hi) = [count*r/n, count*(r+1)/n). Every element
// is in exactly one slice, and slice sizes differ by at most one. The reduce-scatter and all-gather above use
// it, and so do ZeRO's shards.
void kiln_comm_slice(size_t count, int n, int r, size_t *lo, size_t *hi);

// ---- operations ---------------------------------------------------------------------------------

struct kiln_comm_work *kiln_comm_submit(struct kiln_comm *c, const struct kiln_coll *coll, void *after_event);
void kiln_comm_wait(struct kiln_comm *c, struct kiln_comm_work *w);        // NULL is fine
void kiln_comm_wait_stream(struct kiln_comm *c, struct kiln_comm_work *w); // NULL is fine

// Synchronous conveniences on host memory, for control values (losses, norms, flags, hashes).
void kiln_comm_all_reduce_host(struct kiln_comm *c, void *buf, size_t count, enum kiln_dtype dt,
                               enum kiln_red red);
void kiln_comm_broadcast_host(struct kiln_comm *c, void *buf, size_t bytes, int root);
void kiln_comm_all_gather_host(struct kiln_comm *c, const void *send, void *recv, size_t bytes);
void kiln_comm_barrier(struct kiln_comm *c);

// ---- transports (for comm.c) --------------------------------------------------------------------
int kiln_comm_single_open(struct kiln_comm *c, struct kiln_error *err);
int kiln_comm_mpi_available(void); // a build with MPI
int kiln_comm_mpi_open(struct kiln_comm *c, const struct kiln_dist_env *env,
                       const struct kiln_comm_open_opts *o, struct kiln_error *err);
void kiln_comm_mpi_abort(int code); // MPI_Abort on the world, when MPI is up (brings every rank down)
int kiln_comm_nccl_available(void); // a CUDA build with NCCL
int kiln_comm_nccl_open(struct kiln_comm *c, const struct kiln_dist_env *env,
                        const struct kiln_comm_open_opts *o, struct kiln_error *err);

#endif
