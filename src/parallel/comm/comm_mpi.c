// The MPI transport (OpenMPI): collectives on host memory, and on device memory staged through host memory.
//
// Each communicator has a worker thread that runs its operations in the order they were submitted, with
// MPI's blocking calls: the caller goes on computing (the backward's next layers) while a bucket travels,
// which is the overlap DDP needs, and MPI's own progress needs no polling from the training loop. Two
// communicators are two threads, so MPI is initialized with MPI_THREAD_MULTIPLE.
//
// Reductions are reduce-scatter then all-gather over kiln_comm_slice's slices, never MPI_Allreduce: an
// element's sum is then formed by the same MPI_Reduce_scatter call whether DDP all-reduces a bucket or ZeRO-2
// reduce-scatters it, so every --zero level gets bitwise the same gradients (MPI_Allreduce picks algorithms,
// and so summation orders, of its own by message size).
//
// Device memory (several ranks sharing one GPU in tests): the worker waits for the operation's event, copies
// the operands to host memory with the backend's download, reduces bf16 in f32, and uploads the result. The
// caller then waits for the work on the host before it reads the result.
#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm/comm.h"
#include "parallel/comm/env.h"
#include "parallel/comm/peers.h"

enum {
    OP_SPLIT = KILN_COLL_N
}; // internal: MPI_Comm_split is collective too, so it runs in the queue's order

struct kiln_comm_work {
    struct kiln_coll k;
    int op; // k.op, or OP_SPLIT
    void *after_event;
    int color, key;
    MPI_Comm split_out;
    int done;
    struct kiln_comm_work *next;
};

struct mpi_state {
    MPI_Comm comm;
    int rank, size;
    struct kiln_backend *be;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t queued, finished;
    struct kiln_comm_work *head, *tail;
    int stop;
    // host staging for device operands (f32 when the device holds bf16), and a slice-sized scratch
    void *stage[3];
    size_t stage_bytes[3];
    int *counts, *displs; // (size) per-rank slice lengths and offsets, for the v-variants
    // tests: KILN_COMM_DELAY_US=n, the comm thread sleeps n us before each operation, so that a caller that
    // reads a result it has not waited for reads it before it lands
    int delay_us;
};

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int open_comms;     // communicators open in this process
static int we_initialized; // MPI_Init_thread was ours, so MPI_Finalize is too

int kiln_comm_mpi_available(void) {
    return 1;
}

static MPI_Datatype mpi_type(enum kiln_dtype dt) {
    switch (dt) {
    case KILN_F32:
    case KILN_BF16: // reduced in f32 after staging
        return MPI_FLOAT;
    case KILN_I32:
        return MPI_INT;
    case KILN_U8:
        return MPI_UNSIGNED_CHAR;
    case KILN_F64:
        return MPI_DOUBLE;
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(enum kiln_red r) {
    return r == KILN_RED_MAX ? MPI_MAX : r == KILN_RED_MIN ? MPI_MIN : MPI_SUM;
}

static void *stage_at(struct mpi_state *s, int i, size_t bytes) {
    if (s->stage_bytes[i] < bytes) {
        free(s->stage[i]);
        s->stage[i] = kiln_xmalloc(bytes);
        s->stage_bytes[i] = bytes;
    }
    return s->stage[i];
}

// ---- bf16 <-> f32 (round to nearest even, as the backends) ----

static void bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}

static void f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            dst[i] = (uint16_t)((u >> 16) | 0x40); // NaN stays a (quiet) NaN
        else
            dst[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

// ---- host collectives over slices ----

static void set_slices(struct mpi_state *s, size_t count) {
    for (int r = 0; r < s->size; r++) {
        size_t lo, hi;
        kiln_comm_slice(count, s->size, r, &lo, &hi);
        KILN_ASSERT(hi - lo <= (size_t)INT32_MAX && lo <= (size_t)INT32_MAX); // MPI counts are ints
        s->counts[r] = (int)(hi - lo);
        s->displs[r] = (int)lo;
    }
}

// out (this rank's slice) = reduction of in (count); out may be in + lo
static void host_reduce_scatter(struct mpi_state *s, const void *in, void *out, size_t count, MPI_Datatype t,
                                size_t esize, MPI_Op op) {
    set_slices(s, count);
    size_t mine = (size_t)s->counts[s->rank] * esize;
    void *tmp = stage_at(s, 2, mine ? mine : 1);
    MPI_Reduce_scatter(in, tmp, s->counts, t, op, s->comm);
    memcpy(out, tmp, mine);
}

// out (count) = every rank's slice; in is this rank's slice, possibly out + lo
static void host_all_gather(struct mpi_state *s, const void *in, void *out, size_t count, MPI_Datatype t,
                            size_t esize) {
    set_slices(s, count);
    const char *mine = (const char *)out + (size_t)s->displs[s->rank] * esize;
    MPI_Allgatherv(in == mine ? MPI_IN_PLACE : in, s->counts[s->rank], t, out, s->counts, s->displs, t,
                   s->comm);
}

// The operation on host buffers: send/recv already host memory (f32 for bf16 device operands).
static void run_host(struct mpi_state *s, const struct kiln_coll *k, const void *send, void *recv,
                     enum kiln_dtype dt) {
    MPI_Datatype t = mpi_type(dt);
    size_t es = kiln_dtype_bytes(dt), lo, hi;
    kiln_comm_slice(k->count, s->size, s->rank, &lo, &hi);
    KILN_ASSERT(k->count <= (size_t)INT32_MAX);
    int n = (int)k->count;
    switch (k->op) {
    case KILN_COLL_ALL_REDUCE: {
        // the slice's reduction lands in place in recv, then everyone's slices are gathered around it
        char *slice = (char *)recv + lo * es;
        host_reduce_scatter(s, send, slice, k->count, t, es, mpi_op(k->red));
        host_all_gather(s, slice, recv, k->count, t, es);
        break;
    }
    case KILN_COLL_REDUCE_SCATTER:
        host_reduce_scatter(s, send, recv, k->count, t, es, mpi_op(k->red));
        break;
    case KILN_COLL_ALL_GATHER:
        host_all_gather(s, send, recv, k->count, t, es);
        break;
    case KILN_COLL_ALL_TO_ALL:
        MPI_Alltoall(send, n, t, recv, n, t, s->comm);
        break;
    case KILN_COLL_BROADCAST:
        if (s->rank == k->root && send != recv)
            memcpy(recv, send, k->count * es);
        MPI_Bcast(recv, n, t, k->root, s->comm);
        break;
    case KILN_COLL_SEND:
        MPI_Send(send, n, t, k->peer, 7, s->comm);
        break;
    case KILN_COLL_RECV:
        MPI_Recv(recv, n, t, k->peer, 7, s->comm, MPI_STATUS_IGNORE);
        break;
    case KILN_COLL_BARRIER:
        MPI_Barrier(s->comm);
        break;
    case KILN_COLL_SEND_RECV:
        MPI_Sendrecv(send, n, t, k->peer, 8, recv, n, t, k->src, 8, s->comm, MPI_STATUS_IGNORE);
        break;
    case KILN_COLL_N:
        KILN_ASSERT(0);
    }
}

// The elements of send an operation reads and of recv it writes, as [offset, offset + n).
static void extents(const struct mpi_state *s, const struct kiln_coll *k, size_t *s_off, size_t *s_n,
                    size_t *r_off, size_t *r_n) {
    size_t lo, hi, total = k->count;
    kiln_comm_slice(k->count, s->size, s->rank, &lo, &hi);
    if (k->op == KILN_COLL_ALL_TO_ALL)
        total = k->count * (size_t)s->size;
    *s_off = *r_off = 0;
    *s_n = *r_n = total;
    if (k->op == KILN_COLL_REDUCE_SCATTER) {
        *r_n = hi - lo;
    } else if (k->op == KILN_COLL_ALL_GATHER) {
        *s_n = hi - lo;
    } else if (k->op == KILN_COLL_SEND) {
        *r_n = 0;
    } else if (k->op == KILN_COLL_RECV || (k->op == KILN_COLL_BROADCAST && s->rank != k->root)) {
        *s_n = 0;
    } else if (k->op == KILN_COLL_BARRIER) {
        *s_n = *r_n = 0;
    }
}

// Device operands: download what the operation reads, run it on host copies, upload what it wrote.
static void run_device(struct mpi_state *s, const struct kiln_coll *k, void *after_event) {
    const struct kiln_ops *ops = s->be->ops;
    void *ctx = s->be->ctx;
    if (after_event && ops->event_synchronize)
        ops->event_synchronize(ctx, after_event);
    int bf16 = k->dtype == KILN_BF16;
    enum kiln_dtype host_dt = bf16 ? KILN_F32 : k->dtype;
    size_t es = kiln_dtype_bytes(k->dtype), hs = kiln_dtype_bytes(host_dt);
    size_t s_off, s_n, r_off, r_n;
    extents(s, k, &s_off, &s_n, &r_off, &r_n);
    size_t lo, hi;
    kiln_comm_slice(k->count, s->size, s->rank, &lo, &hi);
    size_t total = k->op == KILN_COLL_ALL_TO_ALL ? k->count * (size_t)s->size : k->count;
    // host images of send and recv with the device layout: a slice sits at lo in a full-size image, so that
    // in-place operations stay in place
    char *hsend = stage_at(s, 0, total * hs + 1), *hrecv = stage_at(s, 1, total * hs + 1);
    size_t send_at = k->op == KILN_COLL_ALL_GATHER ? lo : 0;
    if (s_n) {
        char *dst = hsend + send_at * hs;
        if (bf16) {
            uint16_t *raw = (uint16_t *)(hrecv); // hrecv is free until the operation runs
            ops->download(ctx, raw, k->send, s_n * es);
            bf16_to_f32((float *)dst, raw, s_n);
        } else {
            ops->download(ctx, dst, k->send, s_n * es);
        }
    }
    const void *src = hsend + send_at * hs;
    void *dst = hrecv;
    if (k->op == KILN_COLL_ALL_GATHER) { // gather around the slice, in place in the image
        memcpy(hrecv + lo * hs, src, s_n * hs);
        src = hrecv + lo * hs;
    }
    run_host(s, k, src, dst, host_dt);
    if (r_n) {
        if (bf16) {
            uint16_t *raw = (uint16_t *)hsend; // done with send
            f32_to_bf16(raw, (const float *)(hrecv + r_off * hs), r_n);
            ops->upload(ctx, k->recv, raw, r_n * es);
        } else {
            ops->upload(ctx, k->recv, hrecv + r_off * hs, r_n * es);
        }
    }
}

static void run_work(struct mpi_state *s, struct kiln_comm_work *w) {
    if (w->op == OP_SPLIT) {
        MPI_Comm_split(s->comm, w->color, w->key, &w->split_out);
        return;
    }
    if (w->k.device)
        run_device(s, &w->k, w->after_event);
    else
        run_host(s, &w->k, w->k.send, w->k.recv, w->k.dtype);
}

static void *worker_main(void *arg) {
    struct mpi_state *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->queued, &s->mu);
        if (!s->head)
            break; // stopping, and nothing left
        struct kiln_comm_work *w = s->head;
        pthread_mutex_unlock(&s->mu);
        if (s->delay_us > 0)
            usleep((useconds_t)s->delay_us);
        run_work(s, w);
        pthread_mutex_lock(&s->mu);
        s->head = w->next;
        if (!s->head)
            s->tail = NULL;
        w->done = 1;
        pthread_cond_broadcast(&s->finished);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static struct kiln_comm_work *enqueue(struct mpi_state *s, struct kiln_comm_work *w) {
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = w;
    else
        s->head = w;
    s->tail = w;
    pthread_cond_signal(&s->queued);
    pthread_mutex_unlock(&s->mu);
    return w;
}

static void await(struct mpi_state *s, struct kiln_comm_work *w) {
    pthread_mutex_lock(&s->mu);
    while (!w->done)
        pthread_cond_wait(&s->finished, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static struct kiln_comm_work *mpi_submit(void *impl, const struct kiln_coll *k, void *after_event) {
    struct mpi_state *s = impl;
    KILN_ASSERT(!k->device || s->be);
    KILN_ASSERT(k->dtype != KILN_BF16 || k->device); // host reductions are f32/f64/ints
    if ((k->op == KILN_COLL_SEND || k->op == KILN_COLL_RECV))
        KILN_ASSERT(k->peer >= 0 && k->peer < s->size && k->peer != s->rank);
    if (k->op == KILN_COLL_SEND_RECV)
        KILN_ASSERT(k->peer >= 0 && k->peer < s->size && k->src >= 0 && k->src < s->size);
    struct kiln_comm_work *w = kiln_xcalloc(1, sizeof(*w));
    w->k = *k;
    w->op = k->op;
    w->after_event = after_event;
    return enqueue(s, w);
}

static void mpi_wait(void *impl, struct kiln_comm_work *w) {
    await(impl, w);
    free(w);
}

// delay_us: the open's mpi_delay_us (KILN_COMM_DELAY_US), which communicators split from this one inherit
static struct mpi_state *state_new(MPI_Comm comm, struct kiln_backend *be, int delay_us) {
    struct mpi_state *s = kiln_xcalloc(1, sizeof(*s));
    s->comm = comm;
    MPI_Comm_rank(comm, &s->rank);
    MPI_Comm_size(comm, &s->size);
    s->be = be;
    s->delay_us = delay_us;
    s->counts = kiln_xcalloc((size_t)s->size, sizeof(int));
    s->displs = kiln_xcalloc((size_t)s->size, sizeof(int));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->queued, NULL);
    pthread_cond_init(&s->finished, NULL);
    KILN_ASSERT(pthread_create(&s->thread, NULL, worker_main, s) == 0);
    pthread_setname_np(s->thread, "kiln-mpi-comm"); // as the hang watchdog's stack dumps name it
    pthread_mutex_lock(&init_mu);
    open_comms++;
    pthread_mutex_unlock(&init_mu);
    return s;
}

static int mpi_split(void *impl, int color, int key, unsigned flags, void **out, int *rank, int *size,
                     struct kiln_error *err) {
    (void)err;
    (void)flags;
    struct mpi_state *s = impl;
    struct kiln_comm_work w = {.op = OP_SPLIT, .color = color, .key = key};
    await(s, enqueue(s, &w));
    struct mpi_state *d = state_new(w.split_out, s->be, s->delay_us);
    *rank = d->rank;
    *size = d->size;
    *out = d;
    return 0;
}

static void mpi_close(void *impl) {
    struct mpi_state *s = impl;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->queued);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    MPI_Comm_free(&s->comm);
    for (int i = 0; i < 3; i++)
        free(s->stage[i]);
    free(s->counts);
    free(s->displs);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->queued);
    pthread_cond_destroy(&s->finished);
    free(s);
    pthread_mutex_lock(&init_mu);
    if (--open_comms == 0 && we_initialized) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized)
            MPI_Finalize();
    }
    pthread_mutex_unlock(&init_mu);
}

static const struct kiln_comm_impl mpi_impl = {
    .name = "mpi",
    .submit = mpi_submit,
    .wait = mpi_wait,
    .wait_stream = mpi_wait, // the upload that ends a staged operation is complete when the work is
    .split = mpi_split,
    .close = mpi_close,
};

int kiln_comm_mpi_open(struct kiln_comm *c, const struct kiln_dist_env *env,
                       const struct kiln_comm_open_opts *o, struct kiln_error *err) {
    pthread_mutex_lock(&init_mu);
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        we_initialized = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    pthread_mutex_unlock(&init_mu);
    if (provided < MPI_THREAD_MULTIPLE)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "MPI (MPI_Init_thread): this MPI library gives thread level %d, and kiln's comm threads "
            "need MPI_THREAD_MULTIPLE (%d); use an OpenMPI built with thread support",
            provided, MPI_THREAD_MULTIPLE);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != env->rank || size != env->world)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "MPI world (MPI_Comm_size): rank %d of %d, but the environment (%s) says rank %d of %d; "
            "start every rank with the same mpirun",
            rank, size, kiln_launcher_name(env->launcher), env->rank, env->world);
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    // who every rank is, so that one on this machine that dies is noticed (peers.h); MPI's own call, not
    // one of the job's collectives (the flight recorder does not count it)
    struct kiln_peer me, *all = kiln_xmalloc((size_t)size * sizeof(*all));
    kiln_peer_self(&me);
    MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, all, (int)sizeof(me), MPI_BYTE, comm);
    kiln_peers_set(rank, size, all);
    free(all);
    c->impl = &mpi_impl;
    c->state = state_new(comm, c->be, o->mpi_delay_us);
    return 0;
}

void kiln_comm_mpi_abort(int code) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized)
        MPI_Abort(MPI_COMM_WORLD, code);
}
