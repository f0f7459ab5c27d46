// The flight recorder. See flight.h.
#include "parallel/comm/flight.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/comm.h"
#include "util/progress.h"

// A slot holds the record of generation gen (the ring index + 1); 0 while it is being written.
struct slot {
    _Atomic uint64_t gen;
    uint64_t seq, bytes;
    int64_t step;
    int comm, op, dtype, layer;
    double t_issue;
    _Atomic double t_done;
    _Atomic double t_wait;
};

static struct slot ring[KILN_FLIGHT_SLOTS];
static _Atomic uint64_t ring_head; // records issued so far
static _Atomic int64_t cur_step;
static _Atomic int cur_layer = -1;
static _Atomic double last_progress;

#define MAX_COMMS 64
static pthread_mutex_t comms_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char name[48];
    int rank, size;
} comms[MAX_COMMS];
static int n_comms;

uint64_t kiln_flight_issue(int comm, uint64_t seq, int op, int dtype, uint64_t bytes) {
    uint64_t idx = atomic_fetch_add_explicit(&ring_head, 1, memory_order_relaxed);
    struct slot *s = &ring[idx % KILN_FLIGHT_SLOTS];
    atomic_store_explicit(&s->gen, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); // readers see gen 0 before any field changes
    double now = kiln_now_s();
    s->seq = seq;
    s->bytes = bytes;
    s->step = atomic_load_explicit(&cur_step, memory_order_relaxed);
    s->comm = comm;
    s->op = op;
    s->dtype = dtype;
    s->layer = atomic_load_explicit(&cur_layer, memory_order_relaxed);
    s->t_issue = now;
    atomic_store_explicit(&s->t_done, 0.0, memory_order_relaxed);
    atomic_store_explicit(&s->t_wait, 0.0, memory_order_relaxed);
    atomic_store_explicit(&s->gen, idx + 1, memory_order_release);
    atomic_store_explicit(&last_progress, now, memory_order_relaxed);
    return idx + 1;
}

void kiln_flight_done(uint64_t token) {
    if (!token)
        return;
    struct slot *s = &ring[(token - 1) % KILN_FLIGHT_SLOTS];
    double now = kiln_now_s();
    if (atomic_load_explicit(&s->gen, memory_order_acquire) == token)
        atomic_store_explicit(&s->t_done, now, memory_order_relaxed);
    atomic_store_explicit(&last_progress, now, memory_order_relaxed);
}

void kiln_flight_waiting(uint64_t token) {
    if (!token)
        return;
    struct slot *s = &ring[(token - 1) % KILN_FLIGHT_SLOTS];
    if (atomic_load_explicit(&s->gen, memory_order_acquire) == token)
        atomic_store_explicit(&s->t_wait, kiln_now_s(), memory_order_relaxed);
}

void kiln_flight_set_step(int64_t step) {
    atomic_store_explicit(&cur_step, step, memory_order_relaxed);
    atomic_store_explicit(&last_progress, kiln_now_s(), memory_order_relaxed);
}

void kiln_flight_set_layer(int layer) {
    atomic_store_explicit(&cur_layer, layer, memory_order_relaxed);
}

int64_t kiln_flight_step(void) {
    return atomic_load_explicit(&cur_step, memory_order_relaxed);
}

int kiln_flight_layer(void) {
    return atomic_load_explicit(&cur_layer, memory_order_relaxed);
}

double kiln_flight_last_progress(void) {
    return atomic_load_explicit(&last_progress, memory_order_relaxed);
}

int kiln_flight_comm_register(const char *name, int rank, int size) {
    pthread_mutex_lock(&comms_mu);
    int id = n_comms++;
    if (id < MAX_COMMS) {
        snprintf(comms[id].name, sizeof(comms[id].name), "%s", name);
        comms[id].rank = rank;
        comms[id].size = size;
    }
    pthread_mutex_unlock(&comms_mu);
    return id;
}

void kiln_flight_reset(void) {
    memset(ring, 0, sizeof(ring));
    atomic_store(&ring_head, 0);
    atomic_store(&cur_step, 0);
    atomic_store(&cur_layer, -1);
    atomic_store(&last_progress, 0.0);
    pthread_mutex_lock(&comms_mu);
    n_comms = 0;
    pthread_mutex_unlock(&comms_mu);
}

// ---- reading ----

// A consistent copy of slot i, or 0 when it is empty or was being rewritten.
static int read_slot(size_t i, struct kiln_flight_rec *r) {
    struct slot *s = &ring[i];
    uint64_t g = atomic_load_explicit(&s->gen, memory_order_acquire);
    if (!g)
        return 0;
    *r = (struct kiln_flight_rec){.seq = s->seq,
                                  .comm = s->comm,
                                  .op = s->op,
                                  .dtype = s->dtype,
                                  .bytes = s->bytes,
                                  .step = s->step,
                                  .layer = s->layer,
                                  .t_issue = s->t_issue,
                                  .t_done = atomic_load_explicit(&s->t_done, memory_order_relaxed),
                                  .t_wait = atomic_load_explicit(&s->t_wait, memory_order_relaxed)};
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&s->gen, memory_order_relaxed) == g;
}

int kiln_flight_snapshot(struct kiln_flight_rec *out, int cap) {
    uint64_t head = atomic_load_explicit(&ring_head, memory_order_acquire);
    uint64_t first = head > KILN_FLIGHT_SLOTS ? head - KILN_FLIGHT_SLOTS : 0;
    int n = 0;
    for (uint64_t idx = first; idx < head && n < cap; idx++) {
        struct kiln_flight_rec r;
        if (read_slot(idx % KILN_FLIGHT_SLOTS, &r))
            out[n++] = r;
    }
    return n;
}

int kiln_flight_oldest_pending(struct kiln_flight_rec *rec) {
    // ring order is issue order: the first pending one is the oldest
    uint64_t head = atomic_load_explicit(&ring_head, memory_order_acquire);
    uint64_t first = head > KILN_FLIGHT_SLOTS ? head - KILN_FLIGHT_SLOTS : 0;
    for (uint64_t idx = first; idx < head; idx++)
        if (read_slot(idx % KILN_FLIGHT_SLOTS, rec) && rec->t_done == 0)
            return 1;
    return 0;
}

void kiln_flight_write_records(FILE *f, double now) {
    fprintf(f, "[comms]\n");
    pthread_mutex_lock(&comms_mu);
    for (int i = 0; i < n_comms && i < MAX_COMMS; i++)
        fprintf(f, "%d %s %d %d\n", i, comms[i].name, comms[i].rank, comms[i].size);
    pthread_mutex_unlock(&comms_mu);
    fprintf(f, "[records]\n# seq comm op dtype bytes step layer issued_ago_s done_ago_s waited_ago_s\n");
    struct kiln_flight_rec *recs = malloc(KILN_FLIGHT_SLOTS * sizeof(*recs));
    int n = recs ? kiln_flight_snapshot(recs, KILN_FLIGHT_SLOTS) : 0;
    for (int i = 0; i < n; i++) {
        const struct kiln_flight_rec *r = &recs[i];
        char done[32] = "-", waited[32] = "-";
        if (r->t_done > 0)
            snprintf(done, sizeof(done), "%.3f", now - r->t_done);
        if (r->t_wait > 0)
            snprintf(waited, sizeof(waited), "%.3f", now - r->t_wait);
        fprintf(f, "%llu %d %s %s %llu %lld %d %.3f %s %s\n", (unsigned long long)r->seq, r->comm,
                kiln_flight_op_name(r->op), kiln_dtype_name((enum kiln_dtype)r->dtype),
                (unsigned long long)r->bytes, (long long)r->step, r->layer, now - r->t_issue, done, waited);
    }
    free(recs);
}

// ---- parsing the dumps back ----

const char *kiln_flight_op_name(int op) {
    return op == KILN_FLIGHT_OP_SPLIT ? "split" : kiln_coll_name((enum kiln_coll_op)op);
}

int kiln_flight_op_from_name(const char *s) {
    if (!strcmp(s, "split"))
        return KILN_FLIGHT_OP_SPLIT;
    for (int i = 0; i < KILN_COLL_N; i++)
        if (!strcmp(s, kiln_coll_name((enum kiln_coll_op)i)))
            return i;
    return -1;
}

int kiln_flight_dtype_from_name(const char *s) {
    for (int i = KILN_F32; i <= KILN_F64; i++)
        if (!strcmp(s, kiln_dtype_name((enum kiln_dtype)i)))
            return i;
    return -1;
}

static void header_field(struct kiln_hang_dump *d, const char *k, const char *v) {
    if (!strcmp(k, "rank"))
        d->rank = atoi(v);
    else if (!strcmp(k, "world"))
        d->world = atoi(v);
    else if (!strcmp(k, "pid"))
        d->pid = atoi(v);
    else if (!strcmp(k, "host"))
        snprintf(d->host, sizeof(d->host), "%s", v);
    else if (!strcmp(k, "job"))
        snprintf(d->job, sizeof(d->job), "%s", v);
    else if (!strcmp(k, "reason"))
        snprintf(d->reason, sizeof(d->reason), "%s", v);
    else if (!strcmp(k, "trigger"))
        snprintf(d->trigger, sizeof(d->trigger), "%s", v);
    else if (!strcmp(k, "stack_top"))
        snprintf(d->stack_top, sizeof(d->stack_top), "%s", v);
    else if (!strcmp(k, "step"))
        d->step = strtoll(v, NULL, 10);
    else if (!strcmp(k, "layer"))
        d->layer = atoi(v);
    else if (!strcmp(k, "hang_timeout_s"))
        d->hang_timeout_s = strtod(v, NULL);
    else if (!strcmp(k, "mono_now"))
        d->mono_now = strtod(v, NULL);
    else if (!strcmp(k, "stopped_s"))
        d->stopped_s = strtod(v, NULL);
    else if (!strcmp(k, "stopped_ended_ago_s"))
        d->stopped_ended_ago_s = strtod(v, NULL);
}

static int parse_record(struct kiln_hang_dump *d, const char *line) {
    char op[32], dt[16], done[32], waited[32] = "-";
    unsigned long long seq, bytes;
    long long step;
    int comm, layer;
    double issued;
    // waited_ago_s, the last field, is absent from the dumps of earlier versions
    int got = sscanf(line, "%llu %d %31s %15s %llu %lld %d %lf %31s %31s", &seq, &comm, op, dt, &bytes, &step,
                     &layer, &issued, done, waited);
    if (got != 9 && got != 10)
        return -1;
    int o = kiln_flight_op_from_name(op), t = kiln_flight_dtype_from_name(dt);
    if (o < 0 || t < 0)
        return -1;
    struct kiln_flight_rec *r = &d->recs[d->n_recs++];
    *r = (struct kiln_flight_rec){.seq = seq,
                                  .comm = comm,
                                  .op = o,
                                  .dtype = t,
                                  .bytes = bytes,
                                  .step = step,
                                  .layer = layer,
                                  .t_issue = d->mono_now - issued,
                                  .t_done = strcmp(done, "-") ? d->mono_now - strtod(done, NULL) : 0,
                                  .t_wait = strcmp(waited, "-") ? d->mono_now - strtod(waited, NULL) : 0};
    return 0;
}

int kiln_hang_dump_read(const char *path, struct kiln_hang_dump *d, struct kiln_error *err) {
    memset(d, 0, sizeof(*d));
    d->layer = -1;
    snprintf(d->path, sizeof(d->path), "%s", path);
    FILE *f = fopen(path, "r");
    if (!f)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot read %s: %s", path, strerror(errno));
    char line[4096];
    int lineno = 0, rc = 0, cap = 0, ended = 0;
    enum { HEADER, COMMS, RECORDS, OTHER } sec = HEADER;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        line[strcspn(line, "\n")] = 0;
        if (lineno == 1) {
            if (strcmp(line, "kiln-hang-dump 1")) {
                rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                                 "%s:1 is not a kiln hang dump (it starts with '%.40s'); kiln's watchdog "
                                 "writes RUN/hang/rank-N.txt",
                                 path, line);
                break;
            }
            continue;
        }
        if (line[0] == '[') {
            sec = !strcmp(line, "[comms]") ? COMMS : !strcmp(line, "[records]") ? RECORDS : OTHER;
            if (!strcmp(line, "[end]"))
                ended = 1;
            continue;
        }
        if (sec == HEADER) {
            char *eq = strchr(line, '=');
            if (eq) {
                *eq = 0;
                header_field(d, line, eq + 1);
            }
        } else if (sec == COMMS) {
            int id;
            char name[48];
            if (sscanf(line, "%d %47s", &id, name) == 2 && id >= 0 && id < 16) {
                snprintf(d->comm_names[id], sizeof(d->comm_names[id]), "%s", name);
                if (id + 1 > d->n_comms)
                    d->n_comms = id + 1;
            }
        } else if (sec == RECORDS && line[0] && line[0] != '#') {
            if (d->n_recs == cap) {
                cap = cap ? 2 * cap : 256;
                d->recs = kiln_xrealloc(d->recs, (size_t)cap * sizeof(*d->recs));
            }
            if (parse_record(d, line)) {
                rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                                 "%s:%d: bad record '%.60s': expected seq comm op dtype bytes step layer "
                                 "issued_ago_s done_ago_s",
                                 path, lineno, line);
                break;
            }
        }
    }
    fclose(f);
    if (!rc && lineno == 0)
        rc = kiln_errorf(err, KILN_ERR_RUNTIME, "%s is empty: the dump was never written", path);
    else if (!rc && !ended)
        rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                         "%s:%d: the dump is cut short (no [end] line): the process died while writing it",
                         path, lineno);
    if (rc)
        kiln_hang_dump_free(d);
    return rc;
}

void kiln_hang_dump_free(struct kiln_hang_dump *d) {
    free(d->recs);
    d->recs = NULL;
    d->n_recs = 0;
}

// ---- diagnosis ----

// The record of collective #seq on comm in d, or NULL when d's ring no longer (or never) held it.
static const struct kiln_flight_rec *find_rec(const struct kiln_hang_dump *d, int comm, uint64_t seq) {
    for (int i = d->n_recs - 1; i >= 0; i--)
        if (d->recs[i].comm == comm && d->recs[i].seq == seq)
            return &d->recs[i];
    return NULL;
}

static uint64_t max_seq(const struct kiln_hang_dump *d, int comm) {
    uint64_t m = 0;
    for (int i = 0; i < d->n_recs; i++)
        if (d->recs[i].comm == comm && d->recs[i].seq > m)
            m = d->recs[i].seq;
    return m;
}

static const struct kiln_flight_rec *oldest_pending(const struct kiln_hang_dump *d) {
    const struct kiln_flight_rec *p = NULL;
    for (int i = 0; i < d->n_recs; i++)
        if (d->recs[i].t_done == 0 && (!p || d->recs[i].t_issue < p->t_issue))
            p = &d->recs[i];
    return p;
}

static void describe_rec(char *out, size_t cap, const struct kiln_flight_rec *r) {
    if (r->bytes)
        snprintf(out, cap, "%s, %llu bytes %s, step %lld, layer %d", kiln_flight_op_name(r->op),
                 (unsigned long long)r->bytes, kiln_dtype_name((enum kiln_dtype)r->dtype), (long long)r->step,
                 r->layer);
    else
        snprintf(out, cap, "%s, step %lld, layer %d", kiln_flight_op_name(r->op), (long long)r->step,
                 r->layer);
}

static const char *comm_name(const struct kiln_hang_dump *d, int n, int comm) {
    for (int i = 0; i < n; i++)
        if (comm >= 0 && comm < d[i].n_comms && d[i].comm_names[comm][0])
            return d[i].comm_names[comm];
    return "?";
}

// "0, 2" into out
static void rank_list(char *out, size_t cap, const struct kiln_hang_dump *d, const int *pick, int n) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < n && len + 16 < cap; i++)
        if (pick[i])
            len += (size_t)snprintf(out + len, cap - len, "%s%d", len ? ", " : "", d[i].rank);
}

// The oldest unfinished operation that the host had begun to wait for, or NULL.
static const struct kiln_flight_rec *oldest_waited(const struct kiln_hang_dump *d) {
    const struct kiln_flight_rec *p = NULL;
    for (int i = 0; i < d->n_recs; i++)
        if (d->recs[i].t_done == 0 && d->recs[i].t_wait > 0 && (!p || d->recs[i].t_issue < p->t_issue))
            p = &d->recs[i];
    return p;
}

// Where a rank that never entered a collective was: its step and layer, what it waited in, its stack. An
// operation issued and left running (ZeRO's gathers of the updated weights, waited for by the next forward)
// is named as such: the rank is not blocked in it.
static void where_rank(FILE *out, const struct kiln_hang_dump *d) {
    const struct kiln_flight_rec *w = oldest_waited(d), *p = oldest_pending(d);
    fprintf(out, "  rank %d (pid %d on %s): step %lld, layer %d, ", d->rank, d->pid, d->host,
            (long long)d->step, d->layer);
    char what[200];
    if (w) {
        describe_rec(what, sizeof(what), w);
        fprintf(out, "waiting in collective #%llu on communicator %d (%s), ", (unsigned long long)w->seq,
                w->comm, what);
    } else if (p) {
        describe_rec(what, sizeof(what), p);
        fprintf(out, "outside any collective (collective #%llu on communicator %d, %s, issued and not yet waited "
                "for), ", (unsigned long long)p->seq, p->comm, what);
    } else {
        fprintf(out, "outside any collective, ");
    }
    fprintf(out, "stack: %s\n", d->stack_top[0] ? d->stack_top : "?");
}

// stopped: the ranks that did not run ("1, 2"; "" for none), is_stopped by dump. suspects: those, or else the
// ranks without a dump, and why: what they are, for the ranks held up by them.
static int diagnose_comm(const struct kiln_hang_dump *d, int n, int comm, const char *stopped,
                         const int *is_stopped, const char *suspects, const char *why, FILE *out) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < n; i++) {
        uint64_t m = max_seq(&d[i], comm);
        lo = m < lo ? m : lo;
        hi = m > hi ? m : hi;
    }
    char ranks[512], lag[512], what[200];
    int *pick = calloc((size_t)n, sizeof(int));
    KILN_ASSERT(pick);
    if (lo == hi) {
        // every rank issued the same collectives: a pending one that none completed is a transport fault
        int pending = 0;
        const struct kiln_flight_rec *r = NULL;
        for (int i = 0; i < n; i++) {
            const struct kiln_flight_rec *x = find_rec(&d[i], comm, hi);
            if (x && x->t_done == 0) {
                pick[i] = 1;
                pending++;
                r = x;
            }
        }
        if (pending == n && r && (stopped[0] || n < d[0].world)) {
            // some rank did not run, or wrote no dump: the others waited in this collective for it
            describe_rec(what, sizeof(what), r);
            for (int i = 0; i < n; i++) // (the one that did not run was not waiting)
                pick[i] &= !is_stopped[i];
            rank_list(ranks, sizeof(ranks), d, pick, n);
            fprintf(
                out,
                "rank%s %s waited in collective #%llu on communicator %d (%s: %s) and none completed it: ",
                strchr(ranks, ',') ? "s" : "", ranks, (unsigned long long)hi, comm, comm_name(d, n, comm),
                what);
            if (stopped[0])
                fprintf(out, "rank%s %s, which did not run (above), could not take part in it\n",
                        strchr(stopped, ',') ? "s" : "", stopped);
            else {
                char missing[256] = "";
                size_t len = 0;
                for (int rk = 0, j = 0; rk < d[0].world && len + 16 < sizeof(missing); rk++) {
                    while (j < n && d[j].rank < rk)
                        j++;
                    if (j >= n || d[j].rank != rk)
                        len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%d", len ? ", " : "",
                                                rk);
                }
                fprintf(
                    out,
                    "rank%s %s, which wrote no dump (stopped, frozen or killed before it could: a running "
                    "rank dumps within a poll of another's watchdog firing), held it up\n",
                    strchr(missing, ',') ? "s" : "", missing);
            }
        } else if (pending == n && r) {
            describe_rec(what, sizeof(what), r);
            fprintf(out,
                    "every rank entered collective #%llu on communicator %d (%s: %s) and none completed it: "
                    "not a rank that went elsewhere; check the mismatches below, the network or the NCCL "
                    "transport (NCCL_DEBUG=INFO)\n",
                    (unsigned long long)hi, comm, comm_name(d, n, comm), what);
            for (int i = 0; i < n; i++)
                where_rank(out, &d[i]);
        }
        free(pick);
        return pending == n && r ? 1 : 0;
    }
    uint64_t k = lo + 1;
    for (int i = 0; i < n; i++)
        pick[i] = max_seq(&d[i], comm) == lo;
    // With a rank that did not run, a running rank behind here that waits in a collective elsewhere was held
    // up by it (a collective completes on some ranks before others): listed apart, not blamed.
    int *blocked = calloc((size_t)n, sizeof(int));
    KILN_ASSERT(blocked);
    int n_blocked = 0, n_lag = 0;
    for (int i = 0; i < n; i++) {
        blocked[i] = suspects[0] && pick[i] && !is_stopped[i] && oldest_pending(&d[i]);
        n_blocked += blocked[i];
        pick[i] &= !blocked[i];
        n_lag += pick[i];
    }
    rank_list(lag, sizeof(lag), d, pick, n);
    if (!n_lag) // the ones it waited for, then, are those that did not run
        snprintf(lag, sizeof(lag), "%s", suspects);
    int several = strchr(lag, ',') != NULL;
    if (n_lag) {
        fprintf(out, "rank%s %s never entered collective #%llu on communicator %d (%s):\n",
                several ? "s" : "", lag, (unsigned long long)k, comm, comm_name(d, n, comm));
        for (int i = 0; i < n; i++)
            if (pick[i])
                where_rank(out, &d[i]);
    }
    if (n_blocked) {
        char held[256];
        rank_list(held, sizeof(held), d, blocked, n);
        fprintf(
            out,
            "rank%s %s did not enter collective #%llu on communicator %d (%s) either, held up in another by "
            "rank%s %s, %s:\n",
            strchr(held, ',') ? "s" : "", held, (unsigned long long)k, comm, comm_name(d, n, comm),
            strchr(suspects, ',') ? "s" : "", suspects, why);
        for (int i = 0; i < n; i++)
            if (blocked[i])
                where_rank(out, &d[i]);
    }
    free(blocked);
    const struct kiln_flight_rec *r = NULL;
    double waited = 0;
    for (int i = 0; i < n; i++) {
        const struct kiln_flight_rec *x = max_seq(&d[i], comm) >= k ? find_rec(&d[i], comm, k) : NULL;
        pick[i] = x != NULL && max_seq(&d[i], comm) >= k;
        if (x) {
            r = x;
            double w = (x->t_done > 0 ? x->t_done : d[i].mono_now) - x->t_issue;
            waited = w > waited ? w : waited;
        }
    }
    rank_list(ranks, sizeof(ranks), d, pick, n);
    if (r) {
        describe_rec(what, sizeof(what), r);
        fprintf(out, "rank%s %s %s waiting for rank%s %s in collective #%llu (%s), for up to %.1f s\n",
                strchr(ranks, ',') ? "s" : "", ranks, strchr(ranks, ',') ? "were" : "was", several ? "s" : "",
                lag, (unsigned long long)k, what, waited);
    }
    free(pick);
    return 1;
}

static int is_p2p(int op) {
    return op == KILN_COLL_SEND || op == KILN_COLL_RECV || op == KILN_COLL_SEND_RECV;
}

// Collectives of the same number on the same communicator that differ (op or bytes) across ranks: one line
// each, the ranks grouped by what they issued; at most `max` printed.
static int find_mismatches(const struct kiln_hang_dump *d, int n, FILE *out, int max) {
    int found = 0;
    struct {
        int comm;
        uint64_t seq;
    } seen[8];
    for (int a = 0; a < n && found < max; a++)
        for (int i = 0; i < d[a].n_recs && found < max; i++) {
            const struct kiln_flight_rec *x = &d[a].recs[i];
            int differs = 0, dup = 0;
            for (int j = 0; j < found; j++)
                dup |= seen[j].comm == x->comm && seen[j].seq == x->seq;
            for (int b = 0; b < n && !dup && !is_p2p(x->op); b++) {
                const struct kiln_flight_rec *y = find_rec(&d[b], x->comm, x->seq);
                differs |= y && !is_p2p(y->op) && (y->op != x->op || y->bytes != x->bytes);
            }
            if (!differs)
                continue;
            seen[found].comm = x->comm;
            seen[found].seq = x->seq;
            found++;
            fprintf(out, "mismatch: collective #%llu on communicator %d (%s) differs across ranks:",
                    (unsigned long long)x->seq, x->comm, comm_name(d, n, x->comm));
            // one group per distinct (op, bytes), in rank order of first appearance
            int *done = calloc((size_t)n, sizeof(int));
            KILN_ASSERT(done);
            for (int b = 0; b < n; b++) {
                const struct kiln_flight_rec *y = find_rec(&d[b], x->comm, x->seq);
                if (done[b] || !y)
                    continue;
                char what[200], ranks[256];
                describe_rec(what, sizeof(what), y);
                size_t len = 0;
                for (int c = b; c < n; c++) {
                    const struct kiln_flight_rec *z = find_rec(&d[c], x->comm, x->seq);
                    if (!done[c] && z && z->op == y->op && z->bytes == y->bytes && len + 16 < sizeof(ranks)) {
                        done[c] = 1;
                        len += (size_t)snprintf(ranks + len, sizeof(ranks) - len, "%s%d", len ? ", " : "",
                                                d[c].rank);
                    }
                }
                fprintf(out, "%s %s on rank%s %s", b ? ";" : "", what, strchr(ranks, ',') ? "s" : "", ranks);
            }
            free(done);
            fprintf(out, ". The ranks issued different collectives at the same point: the usual cause of a "
                         "silent NCCL hang\n");
        }
    return found;
}

// Whether d's rank did not run (stopped, frozen) while the others gave up on it: its dump says so (written
// once woken, trigger "stopped"), or it records a stop longer than half the timeout that ended just before
// the dump.
static int was_stopped(const struct kiln_hang_dump *d) {
    return !strcmp(d->trigger, "stopped") || (d->stopped_s > 0 && d->stopped_s >= d->hang_timeout_s / 2 &&
                                              d->stopped_ended_ago_s <= d->hang_timeout_s + 1);
}

// d as it stood when its rank stopped: what it issued after it was woken left out, and what completed after
// then still pending. (Its ring may have lost older records to the new ones: those are gone either way.)
static void rewind_stopped(struct kiln_hang_dump *d) {
    double woken = d->mono_now - d->stopped_ended_ago_s, stopped = woken - d->stopped_s;
    int k = 0;
    for (int i = 0; i < d->n_recs; i++) {
        struct kiln_flight_rec r = d->recs[i];
        if (r.t_issue >= stopped)
            continue;
        if (r.t_done >= stopped)
            r.t_done = 0;
        d->recs[k++] = r;
    }
    d->n_recs = k;
}

int kiln_hang_diagnose(const struct kiln_hang_dump *dumps, int n, FILE *out) {
    int findings = 0, n_comm = 0;
    // a rank that did not run explains the hang before any collective does: named first, and read as it
    // stood when it stopped (the others had given up on it by the time it was woken and dumped)
    struct kiln_hang_dump *d = kiln_xcalloc(n > 0 ? (size_t)n : 1, sizeof(*d));
    char stopped[256] = "";
    size_t slen = 0;
    int *is_stopped = kiln_xcalloc(n > 0 ? (size_t)n : 1, sizeof(int));
    for (int i = 0; i < n; i++) {
        d[i] = dumps[i];
        if (!was_stopped(&dumps[i]))
            continue;
        is_stopped[i] = 1;
        d[i].recs = kiln_xmalloc((size_t)(dumps[i].n_recs ? dumps[i].n_recs : 1) * sizeof(*d[i].recs));
        memcpy(d[i].recs, dumps[i].recs, (size_t)dumps[i].n_recs * sizeof(*d[i].recs));
        rewind_stopped(&d[i]);
        if (slen + 16 < sizeof(stopped))
            slen +=
                (size_t)snprintf(stopped + slen, sizeof(stopped) - slen, "%s%d", slen ? ", " : "", d[i].rank);
        fprintf(out,
                "rank %d did not run for %.1f s (stopped by SIGSTOP, a frozen VM or the cgroup freezer, or "
                "swapping) while the others waited for it: it held up the job. Its dump was written once it "
                "was woken; what it did after that is left out:\n",
                d[i].rank, d[i].stopped_s);
        const struct kiln_flight_rec *p = oldest_pending(&d[i]);
        fprintf(out, "  rank %d (pid %d on %s): ", d[i].rank, d[i].pid, d[i].host);
        if (p) {
            char what[200];
            describe_rec(what, sizeof(what), p);
            fprintf(out, "stopped in collective #%llu on communicator %d (%s)\n", (unsigned long long)p->seq,
                    p->comm, what);
        } else {
            fprintf(out, "stopped outside any collective\n");
        }
        findings++;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d[i].n_recs; j++)
            if (d[i].recs[j].comm + 1 > n_comm)
                n_comm = d[i].recs[j].comm + 1;
    // without a rank that did not run, the ranks without a dump are the suspects (d is in rank order)
    char missing[256] = "";
    size_t mlen = 0;
    for (int rk = 0, j = 0; n > 0 && rk < d[0].world && mlen + 16 < sizeof(missing); rk++) {
        while (j < n && d[j].rank < rk)
            j++;
        if (j >= n || d[j].rank != rk)
            mlen += (size_t)snprintf(missing + mlen, sizeof(missing) - mlen, "%s%d", mlen ? ", " : "", rk);
    }
    const char *suspects = stopped[0] ? stopped : missing;
    const char *why = stopped[0] ? "which did not run (above)"
                                 : "which wrote no dump (stopped, frozen or killed before it could)";
    for (int c = 0; c < n_comm; c++)
        findings += diagnose_comm(d, n, c, stopped, is_stopped, suspects, why, out);
    int mm = find_mismatches(d, n, out, 3);
    if (!mm)
        fprintf(out, "no mismatched collectives: the ranks agree on every collective they all recorded\n");
    if (!findings && !mm) {
        fprintf(out, "no rank is behind the others in any collective and none is stuck in one:\n");
        for (int i = 0; i < n; i++)
            where_rank(out, &d[i]);
    }
    for (int i = 0; i < n; i++)
        if (d[i].recs != dumps[i].recs)
            free(d[i].recs);
    free(d);
    free(is_stopped);
    return findings + mm;
}
