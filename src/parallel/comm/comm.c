// The transport-independent half of comm.h: choosing and opening a transport, dispatch, and the host
// conveniences for control values.
#include "parallel/comm/comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm/env.h"
#include "parallel/comm/flight.h"
#include "parallel/comm/peers.h"
#include "util/progress.h"

// ---- the flight recorder's side of a communicator ----

// Work handles in flight on one communicator, oldest first, with their recorder tokens. Operations on a
// communicator complete in issue order, so a wait on one also completes every older one.
struct in_flight {
    struct kiln_comm_work *w;
    uint64_t token;
};
struct kiln_comm_flight {
    pthread_mutex_t mu; // a communicator may be used by two threads in turn (the checkpoint writer's)
    struct in_flight *q;
    int n, cap;
};

// Every open communicator, for kiln_comm_abort_all.
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kiln_comm **open_list;
static int n_open, cap_open;

static void flight_attach(struct kiln_comm *c, const char *name) {
    c->flight = kiln_xcalloc(1, sizeof(*c->flight));
    pthread_mutex_init(&c->flight->mu, NULL);
    c->id = kiln_flight_comm_register(name, c->rank, c->size);
    pthread_mutex_lock(&open_mu);
    if (n_open == cap_open) {
        cap_open = cap_open ? 2 * cap_open : 8;
        open_list = kiln_xrealloc(open_list, (size_t)cap_open * sizeof(*open_list));
    }
    open_list[n_open++] = c;
    pthread_mutex_unlock(&open_mu);
}

static void flight_detach(struct kiln_comm *c) {
    pthread_mutex_lock(&open_mu);
    for (int i = 0; i < n_open; i++)
        if (open_list[i] == c) {
            open_list[i] = open_list[--n_open];
            break;
        }
    pthread_mutex_unlock(&open_mu);
    pthread_mutex_destroy(&c->flight->mu);
    free(c->flight->q);
    free(c->flight);
}

static void flight_push(struct kiln_comm *c, struct kiln_comm_work *w, uint64_t token) {
    struct kiln_comm_flight *f = c->flight;
    pthread_mutex_lock(&f->mu);
    if (f->n == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 16;
        f->q = kiln_xrealloc(f->q, (size_t)f->cap * sizeof(*f->q));
    }
    f->q[f->n].w = w;
    f->q[f->n].token = token;
    f->n++;
    pthread_mutex_unlock(&f->mu);
}

// w's place in f's queue (under f->mu), or -1
static int flight_find(const struct kiln_comm_flight *f, const struct kiln_comm_work *w) {
    for (int i = 0; i < f->n; i++)
        if (f->q[i].w == w)
            return i;
    return -1;
}

// w completed, and with it everything issued before it on c
static void flight_complete(struct kiln_comm *c, const struct kiln_comm_work *w) {
    struct kiln_comm_flight *f = c->flight;
    pthread_mutex_lock(&f->mu);
    int at = flight_find(f, w);
    for (int i = 0; i <= at; i++)
        kiln_flight_done(f->q[i].token);
    if (at >= 0) {
        memmove(f->q, f->q + at + 1, (size_t)(f->n - at - 1) * sizeof(*f->q));
        f->n -= at + 1;
    }
    pthread_mutex_unlock(&f->mu);
}

// the host waits for w, and with it for everything issued before it on c
static void flight_waiting(struct kiln_comm *c, const struct kiln_comm_work *w) {
    struct kiln_comm_flight *f = c->flight;
    pthread_mutex_lock(&f->mu);
    int at = flight_find(f, w);
    for (int i = 0; i <= at; i++)
        kiln_flight_waiting(f->q[i].token);
    pthread_mutex_unlock(&f->mu);
}

const char *kiln_coll_name(enum kiln_coll_op op) {
    static const char *const names[KILN_COLL_N] = {"all_reduce", "reduce_scatter", "all_gather",
                                                   "all_to_all", "broadcast",      "send",
                                                   "recv",       "barrier",        "send_recv"};
    return op >= 0 && op < KILN_COLL_N ? names[op] : "unknown";
}

const char *kiln_comm_kind_name(enum kiln_comm_kind k) {
    return k == KILN_COMM_MPI ? "mpi" : k == KILN_COMM_NCCL ? "nccl" : "single";
}

const char *kiln_comm_compiled(void) {
    int mpi = kiln_comm_mpi_available(), nccl = kiln_comm_nccl_available();
    return mpi && nccl ? "single mpi nccl" : mpi ? "single mpi" : nccl ? "single nccl" : "single";
}

void kiln_comm_slice(size_t count, int n, int r, size_t *lo, size_t *hi) {
    // rank r's slice: [count*r/n, count*(r+1)/n), every element in exactly one slice, sizes differing by <= 1
    *lo = (size_t)((unsigned __int128)count * (unsigned)r / (unsigned)n);
    *hi = (size_t)((unsigned __int128)count * (unsigned)(r + 1) / (unsigned)n);
}

int kiln_comm_choose(const char *opt, const struct kiln_dist_env *env, int device_is_gpu,
                     enum kiln_comm_kind *out, struct kiln_error *err) {
    int under_mpirun = env->launcher == KILN_LAUNCHER_MPIRUN;
    if (!strcmp(opt, "auto")) {
        if (env->world == 1)
            *out = KILN_COMM_SINGLE;
        else if (device_is_gpu && kiln_comm_nccl_available())
            *out = KILN_COMM_NCCL;
        else
            *out = KILN_COMM_MPI;
    } else if (!strcmp(opt, "single")) {
        *out = KILN_COMM_SINGLE;
    } else if (!strcmp(opt, "mpi")) {
        *out = KILN_COMM_MPI;
    } else if (!strcmp(opt, "nccl")) {
        *out = KILN_COMM_NCCL;
    } else {
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "unknown comm '%s' (--comm): allowed values are auto, nccl, mpi, "
                           "single",
                           opt);
    }
    if (*out == KILN_COMM_SINGLE && env->world > 1)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "comm single (--comm): the job has %d processes (%s); use --comm=auto, mpi or nccl", env->world,
            kiln_launcher_name(env->launcher));
    if (*out == KILN_COMM_NCCL && !device_is_gpu)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "comm nccl (--comm): NCCL moves GPU memory and this run is on the CPU; use --comm=mpi "
            "(under mpirun) or --device=cuda");
    if (*out == KILN_COMM_NCCL && !kiln_comm_nccl_available())
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "comm nccl (--comm): this kiln was built without NCCL (transports: %s); rebuild with "
            "CUDA and NCCL, or use --comm=mpi",
            kiln_comm_compiled());
    if (*out == KILN_COMM_MPI && !kiln_comm_mpi_available())
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "comm mpi (--comm): this kiln was built without MPI (transports: %s); install "
                           "libopenmpi-dev (scripts/install-deps.sh) and rebuild",
                           kiln_comm_compiled());
    if (*out == KILN_COMM_MPI && env->world > 1 && !under_mpirun)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "comm mpi (--comm): MPI ranks must be started by mpirun, and this job came from %s; "
            "start it with mpirun -np %d, or `kiln launch --mode=mpirun`",
            kiln_launcher_name(env->launcher), env->world);
    return 0;
}

int kiln_comm_open_world(const struct kiln_dist_env *env, const struct kiln_comm_open_opts *o,
                         struct kiln_comm **out, struct kiln_error *err) {
    struct kiln_comm *c = kiln_xcalloc(1, sizeof(*c));
    c->kind = o->kind;
    c->rank = env->rank;
    c->size = env->world;
    c->be = o->be;
    int rc;
    if (o->kind == KILN_COMM_MPI)
        rc = kiln_comm_mpi_open(c, env, o, err);
    else if (o->kind == KILN_COMM_NCCL)
        rc = kiln_comm_nccl_open(c, env, o, err);
    else
        rc = kiln_comm_single_open(c, err);
    if (rc) {
        free(c);
        return rc;
    }
    flight_attach(c, "world");
    c->owner = pthread_self();
    if (o->kind == KILN_COMM_NCCL && c->size > 1) {
        // who every rank is, so that one on this machine that dies is noticed (peers.h; the MPI transport
        // records them with MPI's own call as it opens): one all-gather, the same on every rank
        struct kiln_peer me, *all = kiln_xmalloc((size_t)c->size * sizeof(*all));
        kiln_peer_self(&me);
        kiln_comm_all_gather_host(c, &me, all, sizeof(me));
        kiln_peers_set(c->rank, c->size, all);
        free(all);
    }
    *out = c;
    return 0;
}

static int split_named(struct kiln_comm *c, int color, int key, unsigned flags, const char *name,
                       struct kiln_comm **out, struct kiln_error *err) {
    KILN_ASSERT(color >= 0);
    struct kiln_comm *d = kiln_xcalloc(1, sizeof(*d));
    *d = *c;
    d->wait_s = 0;
    d->seq = 0;
    d->flight = NULL;
    // the split is itself an operation of c: it is recorded, so that a rank that never joins it shows
    uint64_t token = kiln_flight_issue(c->id, ++c->seq, KILN_FLIGHT_OP_SPLIT, KILN_U8, 0);
    int rc = c->impl->split(c->state, color, key, flags, &d->state, &d->rank, &d->size, err);
    kiln_flight_done(token);
    if (rc) {
        free(d);
        return rc;
    }
    flight_attach(d, name);
    d->owner = pthread_self();
    *out = d;
    return 0;
}

int kiln_comm_split_flags(struct kiln_comm *c, int color, int key, unsigned flags, struct kiln_comm **out,
                          struct kiln_error *err) {
    char name[48];
    snprintf(name, sizeof(name), "split-of-%d-color-%d", c->id, color);
    return split_named(c, color, key, flags, name, out, err);
}

int kiln_comm_split(struct kiln_comm *c, int color, int key, struct kiln_comm **out, struct kiln_error *err) {
    return kiln_comm_split_flags(c, color, key, 0, out, err);
}

void *kiln_comm_window_alloc(struct kiln_comm *c, size_t bytes) {
    return c->impl->window_alloc ? c->impl->window_alloc(c->state, bytes) : NULL;
}

void kiln_comm_window_free(struct kiln_comm *c, void *p) {
    if (p) {
        KILN_ASSERT(c->impl->window_free);
        c->impl->window_free(c->state, p);
    }
}

int kiln_comm_dup(struct kiln_comm *c, struct kiln_comm **out, struct kiln_error *err) {
    char name[48];
    snprintf(name, sizeof(name), "dup-of-%d", c->id);
    return split_named(c, 0, c->rank, 0, name, out, err);
}

void kiln_comm_close(struct kiln_comm *c) {
    if (!c)
        return;
    flight_detach(c);
    c->impl->close(c->state);
    free(c);
}

struct kiln_comm_work *kiln_comm_submit(struct kiln_comm *c, const struct kiln_coll *coll,
                                        void *after_event) {
    KILN_ASSERT(coll->op >= 0 && coll->op < KILN_COLL_N);
    if (!pthread_equal(c->owner, pthread_self())) {
        fprintf(stderr,
                "kiln: internal error: communicator %d (%s) used from a thread other than the one "
                "that opened it\n",
                c->id, kiln_coll_name(coll->op));
        abort();
    }
    c->seq++;
    uint64_t token = kiln_flight_issue(c->id, c->seq, coll->op, coll->dtype,
                                       (uint64_t)coll->count * kiln_dtype_bytes(coll->dtype));
    struct kiln_comm_work *w = c->impl->submit(c->state, coll, after_event);
    if (w)
        flight_push(c, w, token);
    else
        kiln_flight_done(token);
    return w;
}

void kiln_comm_wait(struct kiln_comm *c, struct kiln_comm_work *w) {
    if (!w)
        return;
    flight_waiting(c, w);
    double t0 = kiln_now_s();
    c->impl->wait(c->state, w);
    c->wait_s += kiln_now_s() - t0;
    flight_complete(c, w);
}

// On NCCL the operation may still be running when this returns (the compute stream waits, not the host): the
// recorder then counts it complete when it was handed to the stream. A hang there stops the step instead,
// at the host's next synchronization, which the watchdog sees as a step without progress.
void kiln_comm_wait_stream(struct kiln_comm *c, struct kiln_comm_work *w) {
    if (!w)
        return;
    flight_waiting(c, w);
    double t0 = kiln_now_s();
    c->impl->wait_stream(c->state, w);
    c->wait_s += kiln_now_s() - t0;
    flight_complete(c, w);
}

void kiln_comm_abort_job(int code) {
    fflush(stdout);
    fflush(stderr);
    if (kiln_comm_mpi_available())
        kiln_comm_mpi_abort(code);
    exit(code);
}

void kiln_comm_abort_all(int code) {
    // no waiting for the lock: the hang may be a thread that holds it
    int locked = 0;
    for (int i = 0; i < 100 && !locked; i++)
        if (!(locked = (pthread_mutex_trylock(&open_mu) == 0)))
            usleep(10000);
    for (int i = 0; locked && i < n_open; i++)
        if (open_list[i]->impl->abort)
            open_list[i]->impl->abort(open_list[i]->state);
    fflush(stdout);
    fflush(stderr);
    if (kiln_comm_mpi_available())
        kiln_comm_mpi_abort(code);
    _exit(code); // not exit(): its handlers could wait for the very threads that hang
}

// ---- host conveniences ----

static void run_host(struct kiln_comm *c, struct kiln_coll *k) {
    k->device = 0;
    kiln_comm_wait(c, kiln_comm_submit(c, k, NULL));
}

void kiln_comm_all_reduce_host(struct kiln_comm *c, void *buf, size_t count, enum kiln_dtype dt,
                               enum kiln_red red) {
    struct kiln_coll k = {
        .op = KILN_COLL_ALL_REDUCE, .send = buf, .recv = buf, .count = count, .dtype = dt, .red = red};
    run_host(c, &k);
}

void kiln_comm_broadcast_host(struct kiln_comm *c, void *buf, size_t bytes, int root) {
    struct kiln_coll k = {
        .op = KILN_COLL_BROADCAST, .send = buf, .recv = buf, .count = bytes, .dtype = KILN_U8, .root = root};
    run_host(c, &k);
}

void kiln_comm_all_gather_host(struct kiln_comm *c, const void *send, void *recv, size_t bytes) {
    // every rank's `bytes` bytes, in rank order: an all-gather over slices of bytes * size
    struct kiln_coll k = {.op = KILN_COLL_ALL_GATHER,
                          .send = send,
                          .recv = recv,
                          .count = bytes * (size_t)c->size,
                          .dtype = KILN_U8};
    run_host(c, &k);
}

void kiln_comm_barrier(struct kiln_comm *c) {
    struct kiln_coll k = {.op = KILN_COLL_BARRIER};
    run_host(c, &k);
}
