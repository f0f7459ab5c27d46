// The NCCL transport: device memory, one GPU per rank. Operations run on a comm stream of the rank's GPU,
// ordered after the compute stream by events, so that a gradient bucket's all-reduce overlaps the rest of the
// backward; waiting on the compute stream (kiln_comm_wait_stream) costs the host nothing.
//
// NCCL's reduce-scatter and all-gather take equal slices: where kiln_comm_slice's slices differ in length (a
// count that the world does not divide), they run as one NCCL group of per-slice reduces or broadcasts.
// Host operands (control values) are staged through a small device buffer.
//
// This file is part of the CUDA module (core/cuda_module.h): comm.h's kiln_comm_nccl_open
// (comm_nccl_load.c) reaches kiln_comm_nccl_open_gpu through the module's table, so that NCCL is loaded only
// by a run that uses it.
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <string.h>

extern "C" {
#include "core/cuda_module.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/env.h"
#include "parallel/comm/rendezvous.h"
}

#define NCCL_CHECK(call)                                                                                     \
    do {                                                                                                     \
        ncclResult_t r_ = (call);                                                                            \
        if (r_ != ncclSuccess) {                                                                             \
            fprintf(stderr, "kiln: NCCL error at %s:%d: %s (%s); NCCL_DEBUG=INFO says more\n", __FILE__,     \
                    __LINE__, ncclGetErrorString(r_), #call);                                                \
            kiln_comm_abort_job(1);                                                                          \
        }                                                                                                    \
    } while (0)

#define CUDA_OK(call)                                                                                        \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "kiln: CUDA error at %s:%d: %s (%s)\n", __FILE__, __LINE__,                      \
                    cudaGetErrorString(e_), #call);                                                          \
            kiln_comm_abort_job(1);                                                                          \
        }                                                                                                    \
    } while (0)

struct kiln_comm_work {
    cudaEvent_t done; // recorded on the comm stream after the operation
    // KILN_TRACE_COMM: timed events around the operation on the comm stream (begin, end)
    cudaEvent_t t0, t1;
    enum kiln_coll_op op;
    size_t bytes;
};

// ---- KILN_TRACE_COMM=FILE: a CUDA-event trace of how much communication the compute stream waits for --------
// Each device operation gets timed events on the comm stream around it; where the compute stream waits for it
// (kiln_comm_wait_stream), timed events on the compute stream just before and after the wait measure how long
// the compute stream stood still (the exposed part). At the end one CSV line per operation goes to FILE, in
// ms since the first event: op, bytes, comm begin, comm end, and the compute stream's wait (begin, end), or
// empty where the host waited instead. With several ranks each writes FILE.rankN. bench/overlap.py sums it
// up.
struct trace_rec {
    enum kiln_coll_op op;
    size_t bytes;
    cudaEvent_t t0, t1, w0, w1; // w0/w1 NULL: no stream wait
};
// One trace a process: the world communicator's open turns it on (FILE is kiln_comm_open_opts.trace_path,
// from the knob), and every communicator records into it.
static struct {
    char *path;
    int on;
    struct trace_rec *r;
    size_t n, cap;
    pthread_mutex_t mu;
    int rank, world; // the world communicator's: with several ranks each writes FILE.rankN
} trace = {NULL, 0, NULL, 0, 0, PTHREAD_MUTEX_INITIALIZER, 0, 1};

static int trace_on(void) {
    return trace.on;
}

static cudaEvent_t timed_event(cudaStream_t st) {
    cudaEvent_t e;
    CUDA_OK(cudaEventCreate(&e));
    CUDA_OK(cudaEventRecord(e, st));
    return e;
}

static void trace_add(const struct kiln_comm_work *w, cudaEvent_t w0, cudaEvent_t w1) {
    pthread_mutex_lock(&trace.mu);
    if (trace.n == trace.cap) {
        trace.cap = trace.cap ? 2 * trace.cap : 1024;
        trace.r = (struct trace_rec *)kiln_xrealloc(trace.r, trace.cap * sizeof(*trace.r));
    }
    trace.r[trace.n++] = (struct trace_rec){w->op, w->bytes, w->t0, w->t1, w0, w1};
    pthread_mutex_unlock(&trace.mu);
}

static void trace_write(void) {
    if (!trace.n)
        return;
    CUDA_OK(cudaDeviceSynchronize());
    char path[4096];
    if (trace.world > 1)
        snprintf(path, sizeof(path), "%s.rank%d", trace.path, trace.rank);
    else
        snprintf(path, sizeof(path), "%s", trace.path);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kiln: cannot write the comm trace %s\n", path);
        return;
    }
    fprintf(f, "op,bytes,comm_begin_ms,comm_end_ms,wait_begin_ms,wait_end_ms\n");
    cudaEvent_t base = trace.r[0].t0;
    for (size_t i = 0; i < trace.n; i++) {
        struct trace_rec *r = &trace.r[i];
        float a, b, c = 0, d = 0;
        CUDA_OK(cudaEventElapsedTime(&a, base, r->t0));
        CUDA_OK(cudaEventElapsedTime(&b, base, r->t1));
        if (r->w0) {
            CUDA_OK(cudaEventElapsedTime(&c, base, r->w0));
            CUDA_OK(cudaEventElapsedTime(&d, base, r->w1));
            fprintf(f, "%s,%zu,%.4f,%.4f,%.4f,%.4f\n", kiln_coll_name(r->op), r->bytes, a, b, c, d);
        } else {
            fprintf(f, "%s,%zu,%.4f,%.4f,,\n", kiln_coll_name(r->op), r->bytes, a, b);
        }
    }
    fclose(f);
    trace.n = 0;
}

struct nccl_state {
    ncclComm_t comm;
    int rank, size, device;
    int stream_high;      // the comm stream at the device's greatest priority (state_new)
    cudaStream_t stream;  // the comm stream
    cudaStream_t compute; // the backend's compute stream
    struct kiln_backend *be;
    cudaEvent_t issued; // the compute stream's end, when the caller gave no event
    void *dev_stage;    // host operands pass through here
    size_t dev_stage_bytes;
    // the symmetric windows registered with comm (nccl_window_alloc): their memory and handles
    int nwin;
    void *win_mem[4];
    ncclWindow_t win[4];
};

static ncclDataType_t nccl_type(enum kiln_dtype dt) {
    switch (dt) {
    case KILN_F32:
        return ncclFloat32;
    case KILN_BF16:
        return ncclBfloat16;
    case KILN_I32:
        return ncclInt32;
    case KILN_U8:
        return ncclUint8;
    case KILN_F64:
        return ncclFloat64;
    }
    return ncclFloat32;
}

static ncclRedOp_t nccl_op(enum kiln_red r) {
    return r == KILN_RED_MAX ? ncclMax : r == KILN_RED_MIN ? ncclMin : ncclSum;
}

// The operation on device pointers, enqueued on the comm stream.
static void run_device(struct nccl_state *s, const struct kiln_coll *k, const void *send, void *recv) {
    ncclDataType_t t = nccl_type(k->dtype);
    size_t es = kiln_dtype_bytes(k->dtype), lo, hi;
    kiln_comm_slice(k->count, s->size, s->rank, &lo, &hi);
    int even = k->count % (size_t)s->size == 0;
    switch (k->op) {
    case KILN_COLL_ALL_REDUCE:
        NCCL_CHECK(ncclAllReduce(send, recv, k->count, t, nccl_op(k->red), s->comm, s->stream));
        break;
    case KILN_COLL_REDUCE_SCATTER:
        if (even) {
            NCCL_CHECK(ncclReduceScatter(send, recv, hi - lo, t, nccl_op(k->red), s->comm, s->stream));
            break;
        }
        NCCL_CHECK(ncclGroupStart());
        for (int r = 0; r < s->size; r++) {
            size_t rl, rh;
            kiln_comm_slice(k->count, s->size, r, &rl, &rh);
            NCCL_CHECK(ncclReduce((const char *)send + rl * es, r == s->rank ? recv : NULL, rh - rl, t,
                                  nccl_op(k->red), r, s->comm, s->stream));
        }
        NCCL_CHECK(ncclGroupEnd());
        break;
    case KILN_COLL_ALL_GATHER:
        if (even) {
            NCCL_CHECK(ncclAllGather(send, recv, hi - lo, t, s->comm, s->stream));
            break;
        }
        NCCL_CHECK(ncclGroupStart());
        for (int r = 0; r < s->size; r++) {
            size_t rl, rh;
            kiln_comm_slice(k->count, s->size, r, &rl, &rh);
            NCCL_CHECK(ncclBroadcast(r == s->rank ? send : NULL, (char *)recv + rl * es, rh - rl, t, r,
                                     s->comm, s->stream));
        }
        NCCL_CHECK(ncclGroupEnd());
        break;
    case KILN_COLL_ALL_TO_ALL:
        NCCL_CHECK(ncclGroupStart());
        for (int r = 0; r < s->size; r++) {
            NCCL_CHECK(
                ncclSend((const char *)send + (size_t)r * k->count * es, k->count, t, r, s->comm, s->stream));
            NCCL_CHECK(
                ncclRecv((char *)recv + (size_t)r * k->count * es, k->count, t, r, s->comm, s->stream));
        }
        NCCL_CHECK(ncclGroupEnd());
        break;
    case KILN_COLL_BROADCAST:
        NCCL_CHECK(ncclBroadcast(send, recv, k->count, t, k->root, s->comm, s->stream));
        break;
    case KILN_COLL_SEND:
        NCCL_CHECK(ncclSend(send, k->count, t, k->peer, s->comm, s->stream));
        break;
    case KILN_COLL_RECV:
        NCCL_CHECK(ncclRecv(recv, k->count, t, k->peer, s->comm, s->stream));
        break;
    case KILN_COLL_SEND_RECV: // one group: neither waits for the other
        NCCL_CHECK(ncclGroupStart());
        NCCL_CHECK(ncclSend(send, k->count, t, k->peer, s->comm, s->stream));
        NCCL_CHECK(ncclRecv(recv, k->count, t, k->src, s->comm, s->stream));
        NCCL_CHECK(ncclGroupEnd());
        break;
    case KILN_COLL_BARRIER: {
        // an all-reduce of one word: every rank must have issued it before any completes
        void *w = s->dev_stage;
        NCCL_CHECK(ncclAllReduce(w, w, 1, ncclInt32, ncclSum, s->comm, s->stream));
        break;
    }
    case KILN_COLL_N:
        break;
    }
}

static void *dev_stage(struct nccl_state *s, size_t bytes) {
    if (s->dev_stage_bytes < bytes) {
        CUDA_OK(cudaStreamSynchronize(s->stream));
        CUDA_OK(cudaFree(s->dev_stage));
        CUDA_OK(cudaMalloc(&s->dev_stage, bytes));
        s->dev_stage_bytes = bytes;
    }
    return s->dev_stage;
}

static struct kiln_comm_work *nccl_submit(void *impl, const struct kiln_coll *k, void *after_event) {
    struct nccl_state *s = (struct nccl_state *)impl;
    CUDA_OK(cudaSetDevice(s->device));
    if (!k->device) {
        // host operands: through the device, synchronously (control values: a few bytes)
        size_t es = kiln_dtype_bytes(k->dtype), lo, hi;
        kiln_comm_slice(k->count, s->size, s->rank, &lo, &hi);
        size_t n = k->op == KILN_COLL_ALL_TO_ALL ? k->count * (size_t)s->size : k->count;
        char *d = (char *)dev_stage(s, 2 * n * es + 16);
        char *dsend = d, *drecv = d + n * es;
        size_t s_at = k->op == KILN_COLL_ALL_GATHER ? lo : 0,
               s_n = k->op == KILN_COLL_ALL_GATHER ? hi - lo : n;
        if (k->send && k->op != KILN_COLL_RECV && k->op != KILN_COLL_BARRIER)
            CUDA_OK(cudaMemcpyAsync(dsend + s_at * es, k->send, s_n * es, cudaMemcpyHostToDevice, s->stream));
        run_device(s, k, dsend + s_at * es, drecv);
        size_t r_n = k->op == KILN_COLL_REDUCE_SCATTER ? hi - lo : n;
        if (k->recv && k->op != KILN_COLL_SEND && k->op != KILN_COLL_BARRIER)
            CUDA_OK(cudaMemcpyAsync(k->recv, drecv, r_n * es, cudaMemcpyDeviceToHost, s->stream));
        CUDA_OK(cudaStreamSynchronize(s->stream));
        return NULL;
    }
    cudaEvent_t after = (cudaEvent_t)after_event;
    if (!after) {
        after = s->issued;
        CUDA_OK(cudaEventRecord(after, s->compute));
    }
    CUDA_OK(cudaStreamWaitEvent(s->stream, after, 0));
    struct kiln_comm_work *w = (struct kiln_comm_work *)kiln_xcalloc(1, sizeof(*w));
    if (trace_on()) {
        w->op = k->op;
        w->bytes = k->count * kiln_dtype_bytes(k->dtype);
        w->t0 = timed_event(s->stream);
    }
    run_device(s, k, k->send, k->recv);
    if (trace_on())
        w->t1 = timed_event(s->stream);
    CUDA_OK(cudaEventCreateWithFlags(&w->done, cudaEventDisableTiming));
    CUDA_OK(cudaEventRecord(w->done, s->stream));
    return w;
}

static void nccl_wait(void *impl, struct kiln_comm_work *w) {
    (void)impl;
    if (w->t0)
        trace_add(w, NULL, NULL);
    CUDA_OK(cudaEventSynchronize(w->done));
    CUDA_OK(cudaEventDestroy(w->done));
    free(w);
}

static void nccl_wait_stream(void *impl, struct kiln_comm_work *w) {
    struct nccl_state *s = (struct nccl_state *)impl;
    cudaEvent_t w0 = w->t0 ? timed_event(s->compute) : NULL;
    CUDA_OK(cudaStreamWaitEvent(s->compute, w->done, 0));
    if (w->t0)
        trace_add(w, w0, timed_event(s->compute));
    CUDA_OK(cudaEventDestroy(w->done)); // destroying a recorded event is safe: the wait holds what it needs
    free(w);
}

// stream_high (KILN_NCCL_STREAM_PRIORITY=high, the open's nccl_stream_high; a split inherits its parent's):
// the comm stream at the device's greatest priority, so that NCCL's kernels take SMs as soon as any free up
// rather than after the compute's queued blocks (the compute stream, like every stream by default, has the
// least); 0: the default priority.
static struct nccl_state *state_new(ncclComm_t comm, const struct nccl_state *like, struct kiln_backend *be,
                                    int device, int stream_high) {
    struct nccl_state *s = (struct nccl_state *)kiln_xcalloc(1, sizeof(*s));
    s->comm = comm;
    NCCL_CHECK(ncclCommUserRank(comm, &s->rank));
    NCCL_CHECK(ncclCommCount(comm, &s->size));
    s->device = like ? like->device : device;
    s->stream_high = like ? like->stream_high : stream_high;
    s->be = be;
    s->compute = (cudaStream_t)be->ops->native_stream(be->ctx);
    if (s->stream_high) {
        int least, greatest;
        CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        CUDA_OK(cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, greatest));
    } else {
        CUDA_OK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    }
    CUDA_OK(cudaEventCreateWithFlags(&s->issued, cudaEventDisableTiming));
    dev_stage(s, 4096);
    CUDA_OK(cudaMemset(s->dev_stage, 0, 4096));
    return s;
}

static int nccl_split(void *impl, int color, int key, unsigned flags, void **out, int *rank, int *size,
                      struct kiln_error *err) {
    (void)err;
    struct nccl_state *s = (struct nccl_state *)impl;
    ncclComm_t comm;
    // no config: the parent's (KILN_NCCL_CTA_POLICY, KILN_NCCL_MAX_CTAS); copy engine: the zero-CTA policy
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    NCCL_CHECK(
        ncclCommSplit(s->comm, color, key, &comm, (flags & KILN_COMM_SPLIT_COPY_ENGINE) ? &cfg : NULL));
    struct nccl_state *d = state_new(comm, s, s->be, s->device, s->stream_high);
    *rank = d->rank;
    *size = d->size;
    *out = d;
    return 0;
}

// A symmetric window (NCCL 2.27+): memory from NCCL's allocator (CUDA's virtual memory management, which
// registration needs), registered with every rank of the communicator. A rank that cannot allocate ends
// the job (the others are already inside the collective registration).
static void *nccl_window_alloc(void *impl, size_t bytes) {
    struct nccl_state *s = (struct nccl_state *)impl;
    if (s->nwin == (int)(sizeof(s->win) / sizeof(s->win[0])))
        return NULL;
    CUDA_OK(cudaSetDevice(s->device));
    void *p = NULL;
    NCCL_CHECK(ncclMemAlloc(&p, bytes));
    NCCL_CHECK(ncclCommWindowRegister(s->comm, p, bytes, &s->win[s->nwin], NCCL_WIN_COLL_SYMMETRIC));
    s->win_mem[s->nwin++] = p;
    return p;
}

static void nccl_window_free(void *impl, void *p) {
    struct nccl_state *s = (struct nccl_state *)impl;
    CUDA_OK(cudaSetDevice(s->device));
    CUDA_OK(cudaStreamSynchronize(s->stream));
    for (int i = 0; i < s->nwin; i++) {
        if (s->win_mem[i] != p)
            continue;
        NCCL_CHECK(ncclCommWindowDeregister(s->comm, s->win[i]));
        NCCL_CHECK(ncclMemFree(p));
        s->nwin--;
        s->win_mem[i] = s->win_mem[s->nwin];
        s->win[i] = s->win[s->nwin];
        return;
    }
    KILN_ASSERT(!"nccl_window_free: not a window of this communicator");
}

static void nccl_close(void *impl) {
    struct nccl_state *s = (struct nccl_state *)impl;
    cudaSetDevice(s->device);
    cudaStreamSynchronize(s->stream);
    if (trace_on())
        trace_write();
    while (s->nwin > 0) // (windows the owner left: freed before the communicator goes)
        nccl_window_free(s, s->win_mem[s->nwin - 1]);
    ncclCommDestroy(s->comm);
    cudaEventDestroy(s->issued);
    cudaStreamDestroy(s->stream);
    cudaFree(s->dev_stage);
    free(s);
}

// The watchdog's way out of a hang: every NCCL call or kernel waiting on this communicator returns, so that
// the process can exit. Nothing else is freed: the process ends right after.
static void nccl_abort(void *impl) {
    struct nccl_state *s = (struct nccl_state *)impl;
    ncclCommAbort(s->comm);
}

static const struct kiln_comm_impl nccl_impl = {
    "nccl",     nccl_submit, nccl_wait,         nccl_wait_stream, nccl_split,
    nccl_close, nccl_abort,  nccl_window_alloc, nccl_window_free,
};

extern "C" int kiln_comm_nccl_open_gpu(struct kiln_comm *c, const struct kiln_dist_env *env,
                                       const struct kiln_comm_open_opts *o, struct kiln_error *err) {
    if (!c->be || !c->be->device_memory || !c->be->ops->native_stream)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "comm nccl (--comm): NCCL needs the cuda backend; use --device=cuda, or --comm=mpi");
    // o->nccl_cta_policy (KILN_NCCL_CTA_POLICY=efficiency|zero): NCCL 2.27+'s CTA policy, which trades
    // collective speed for SMs left to the overlapped compute (issue 17's weak-scaling loss is the compute
    // slowed beside the reduction); o->nccl_max_ctas (KILN_NCCL_MAX_CTAS=N) caps the CTAs. 0: NCCL's
    // defaults. Split communicators inherit it. (run/knobs.c validated both.)
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    if (o->nccl_cta_policy == KILN_NCCL_CTA_EFFICIENCY)
        cfg.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
    else if (o->nccl_cta_policy == KILN_NCCL_CTA_ZERO)
        cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    KILN_ASSERT(o->nccl_max_ctas >= 0 && o->nccl_max_ctas <= 64);
    if (o->nccl_max_ctas > 0)
        cfg.maxCTAs = o->nccl_max_ctas;
    int device = 0;
    CUDA_OK(cudaGetDevice(&device));
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (env->rank == 0)
        NCCL_CHECK(ncclGetUniqueId(&id));
    int rc = kiln_rdzv_share(env, &id, sizeof(id), o->timeout_s, err);
    if (rc)
        return rc;
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRankConfig(&comm, env->world, id, env->rank, &cfg);
    if (r != ncclSuccess)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "NCCL (ncclCommInitRankConfig, rank %d of %d, GPU %d): %s; NCCL_DEBUG=INFO says more", env->rank,
            env->world, device, ncclGetErrorString(r));
    c->impl = &nccl_impl;
    c->state = state_new(comm, NULL, c->be, device, o->nccl_stream_high);
    if (o->trace_path && *o->trace_path && !trace.on) {
        trace.path = kiln_xstrdup(o->trace_path);
        trace.on = 1;
    }
    trace.rank = env->rank, trace.world = env->world;
    return 0;
}
