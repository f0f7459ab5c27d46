// The transport-independent half of comm.h: choosing and opening a transport, dispatch, and the host
// conveniences for control values.
#include "dist/comm.h"

#include <string.h>

#include "dist/env.h"
#include "util/progress.h"

const char *kiln_coll_name(enum kiln_coll_op op) {
    static const char *const names[KILN_COLL_N] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                                                   "broadcast",  "send",           "recv",       "barrier"};
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
        rc = kiln_comm_mpi_open(c, env, err);
    else if (o->kind == KILN_COMM_NCCL)
        rc = kiln_comm_nccl_open(c, env, o->timeout_s, err);
    else
        rc = kiln_comm_single_open(c, err);
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int kiln_comm_split(struct kiln_comm *c, int color, int key, struct kiln_comm **out, struct kiln_error *err) {
    KILN_ASSERT(color >= 0);
    struct kiln_comm *d = kiln_xcalloc(1, sizeof(*d));
    *d = *c;
    d->wait_s = 0;
    d->seq = 0;
    int rc = c->impl->split(c->state, color, key, &d->state, &d->rank, &d->size, err);
    if (rc) {
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

int kiln_comm_dup(struct kiln_comm *c, struct kiln_comm **out, struct kiln_error *err) {
    return kiln_comm_split(c, 0, c->rank, out, err);
}

void kiln_comm_close(struct kiln_comm *c) {
    if (!c)
        return;
    c->impl->close(c->state);
    free(c);
}

struct kiln_comm_work *kiln_comm_submit(struct kiln_comm *c, const struct kiln_coll *coll,
                                        void *after_event) {
    KILN_ASSERT(coll->op >= 0 && coll->op < KILN_COLL_N);
    c->seq++;
    return c->impl->submit(c->state, coll, after_event);
}

void kiln_comm_wait(struct kiln_comm *c, struct kiln_comm_work *w) {
    if (!w)
        return;
    double t0 = kiln_now_s();
    c->impl->wait(c->state, w);
    c->wait_s += kiln_now_s() - t0;
}

void kiln_comm_wait_stream(struct kiln_comm *c, struct kiln_comm_work *w) {
    if (!w)
        return;
    double t0 = kiln_now_s();
    c->impl->wait_stream(c->state, w);
    c->wait_s += kiln_now_s() - t0;
}

void kiln_comm_abort_job(int code) {
    fflush(stdout);
    fflush(stderr);
    if (kiln_comm_mpi_available())
        kiln_comm_mpi_abort(code);
    exit(code);
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
