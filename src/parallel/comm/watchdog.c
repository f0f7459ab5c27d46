// The hang watchdog. See watchdog.h.
#include "parallel/comm/watchdog.h"

#include <dirent.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "parallel/comm/comm.h"
#include "parallel/comm/flight.h"
#include "parallel/comm/peers.h"
#include "io/fsutil.h"
#include "util/progress.h"

#define MAX_FRAMES 48
#define MAX_THREADS 256

static struct {
    int running;
    char dir[1024];
    int rank, world;
    double timeout_s;
    uint64_t job;
    pthread_t thread;
    sem_t wake;
    atomic_int stop, usr2;
    // A process stopped by SIGSTOP, a frozen VM, the cgroup freezer or a swap storm runs no thread at all,
    // while the monotonic clock goes on: the watchdog sees it as a poll that came far later than asked. The
    // longest such gap (seconds the process did not run) and when it ended (monotonic), for the dumps and
    // for telling a rank that was stopped from one that hung.
    double last_poll, stopped_s, stopped_end;
} wd;

// ---- other threads' stacks: each is asked, by a signal, to take its own backtrace ----

static int stack_signal(void) {
    return SIGRTMIN + 7;
}

static atomic_long want_tid;
static atomic_int got_done;
static void *got_frames[MAX_FRAMES];
static int got_n;

static void on_stack_signal(int sig, siginfo_t *si, void *uc);

static void install_once(void) {
    void *warm[4];
    backtrace(warm, 4); // loads the unwinder now: the first call allocates, which a signal handler must not
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_stack_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(stack_signal(), &sa, NULL);
}

static void on_stack_signal(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)si;
    (void)uc;
    int saved = errno;
    if (syscall(SYS_gettid) == atomic_load(&want_tid)) {
        got_n = backtrace(got_frames, MAX_FRAMES);
        atomic_store(&got_done, 1);
    }
    errno = saved;
}

// Once per process, before any thread is asked for its stack (the signal's default action ends the process).
static void install_stack_handler(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install_once);
}

struct thread_stack {
    long tid;
    char name[32];
    void *frames[MAX_FRAMES];
    int n; // -1: it did not answer
};

static void thread_name(long tid, char *out, size_t cap) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%ld/comm", tid);
    FILE *f = fopen(path, "r");
    out[0] = 0;
    if (f) {
        if (fgets(out, (int)cap, f))
            out[strcspn(out, "\n")] = 0;
        fclose(f);
    }
    for (char *p = out; *p; p++)
        if (*p == ' ')
            *p = '_';
}

// Every thread of this process but the caller: its stack, asked for with the stack signal.
static int collect_stacks(struct thread_stack *out, int cap) {
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    long self = syscall(SYS_gettid);
    pid_t pid = getpid();
    double deadline = kiln_now_s() + 2;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        long tid = strtol(e->d_name, NULL, 10);
        if (tid <= 0 || tid == self)
            continue;
        struct thread_stack *t = &out[n++];
        t->tid = tid;
        thread_name(tid, t->name, sizeof(t->name));
        t->n = -1;
        if (kiln_now_s() > deadline)
            continue; // threads that never answered used up the time: the rest are listed without stacks
        atomic_store(&got_done, 0);
        atomic_store(&want_tid, tid);
        if (syscall(SYS_tgkill, pid, tid, stack_signal()) != 0)
            continue;
        // a thread that blocks the signal never answers
        for (int i = 0; i < 200 && !atomic_load(&got_done); i++)
            usleep(1000);
        if (atomic_load(&got_done)) {
            t->n = got_n;
            memcpy(t->frames, got_frames, (size_t)got_n * sizeof(void *));
        }
    }
    atomic_store(&want_tid, 0);
    closedir(d);
    return n;
}

// "./kiln(kiln_comm_wait+0x3f) [0x55d...]" -> "kiln_comm_wait"; 0 when the frame has no name
static int frame_function(const char *sym, char *out, size_t cap) {
    const char *open = strchr(sym, '('), *end = open ? strpbrk(open, "+)") : NULL;
    if (!open || !end || end == open + 1)
        return 0;
    snprintf(out, cap, "%.*s", (int)(end - open - 1), open + 1);
    return 1;
}

// The main thread's first kiln function, and the innermost named frame below it (frames 0 and 1 are the
// signal handler and the kernel's return trampoline).
static void stack_top(char **syms, int n, char *out, size_t cap) {
    char kiln[128] = "", inner[128] = "", fn[128];
    for (int i = 2; i < n; i++) {
        if (!frame_function(syms[i], fn, sizeof(fn)))
            continue;
        if (!inner[0])
            snprintf(inner, sizeof(inner), "%s", fn);
        if (!strncmp(fn, "kiln_", 5)) {
            snprintf(kiln, sizeof(kiln), "%s", fn);
            break;
        }
    }
    if (kiln[0] && strcmp(kiln, inner))
        snprintf(out, cap, "%s (in %s)", kiln, inner);
    else
        snprintf(out, cap, "%s", kiln[0] ? kiln : inner[0] ? inner : "?");
}

// ---- the dump ----

int kiln_watchdog_write_dump(const char *path, const char *trigger, const char *reason,
                             struct kiln_error *err) {
    // the directory is made only now: a run that never hangs leaves none behind (./kiln-hang without --out)
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        int rc = kiln_mkdir_p(dir, err);
        if (rc)
            return rc;
    }
    static struct thread_stack stacks[MAX_THREADS]; // only the watchdog thread dumps
    install_stack_handler();
    int n_threads = collect_stacks(stacks, MAX_THREADS);
    char **syms[MAX_THREADS] = {0};
    char top[256] = "?";
    for (int i = 0; i < n_threads; i++) {
        if (stacks[i].n > 0)
            syms[i] = backtrace_symbols(stacks[i].frames, stacks[i].n);
        if (stacks[i].tid == getpid() && syms[i])
            stack_top(syms[i], stacks[i].n, top, sizeof(top));
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write %s: %s", path, strerror(errno));
    char host[128] = "?";
    gethostname(host, sizeof(host) - 1);
    double now = kiln_now_s();
    fprintf(f, "kiln-hang-dump 1\n");
    fprintf(f, "rank=%d\nworld=%d\nhost=%s\npid=%d\njob=%016llx\ntrigger=%s\nreason=%s\n", wd.rank, wd.world,
            host, (int)getpid(), (unsigned long long)wd.job, trigger, reason);
    fprintf(f, "step=%lld\nlayer=%d\nstack_top=%s\nhang_timeout_s=%g\nmono_now=%.6f\ntime_unix=%lld\n",
            (long long)kiln_flight_step(), kiln_flight_layer(), top, wd.timeout_s, now,
            (long long)time(NULL));
    fprintf(f, "last_progress_ago_s=%.3f\n", now - kiln_flight_last_progress());
    // (kiln doctor leaves out what a stopped rank did after it was woken: the others had given up by then)
    fprintf(f, "stopped_s=%.3f\nstopped_ended_ago_s=%.3f\n", wd.stopped_s,
            wd.stopped_s > 0 ? now - wd.stopped_end : 0.0);
    kiln_flight_write_records(f, now);
    fprintf(f, "[stacks]\n");
    for (int i = 0; i < n_threads; i++) {
        fprintf(f, "thread %ld %s%s\n", stacks[i].tid, stacks[i].name,
                stacks[i].tid == getpid() ? " (main)" : "");
        if (stacks[i].n < 0)
            fprintf(f, "  (no answer: the thread blocks the stack signal, or time ran out)\n");
        for (int j = 2; syms[i] && j < stacks[i].n; j++) // 0 and 1: the handler and the trampoline
            fprintf(f, "  %s\n", syms[i][j]);
        free(syms[i]);
    }
    fprintf(f, "thread %ld kiln-watchdog (this dump)\n", (long)syscall(SYS_gettid));
    fprintf(f, "[log]\n");
    kiln_log_write_recent(f);
    fprintf(f, "[end]\n");
    fclose(f);
    int rc = kiln_write_file_atomic(path, buf, len, err);
    free(buf);
    return rc;
}

// ---- the thread ----

// How many ranks' dumps of this job are missing (the peers' watchdogs have not answered yet); their ranks
// listed in missing ("0, 2").
static int missing_dumps(char *missing, size_t cap) {
    char job[40];
    int n = 0;
    size_t len = 0;
    missing[0] = 0;
    snprintf(job, sizeof(job), "job=%016llx", (unsigned long long)wd.job);
    for (int r = 0; r < wd.world; r++) {
        char path[1100], line[256];
        snprintf(path, sizeof(path), "%s/rank-%d.txt", wd.dir, r);
        FILE *f = fopen(path, "r");
        int found = 0;
        for (int i = 0; f && i < 8 && !found && fgets(line, sizeof(line), f); i++)
            found = !strncmp(line, job, strlen(job));
        if (f)
            fclose(f);
        if (!found && n++ < 16 && len + 16 < cap)
            len += (size_t)snprintf(missing + len, cap - len, "%s%d", len ? ", " : "", r);
    }
    return n;
}

static void fired_path(char *out, size_t cap) {
    snprintf(out, cap, "%s/fired-%016llx", wd.dir, (unsigned long long)wd.job);
}

// Dumps, tells the others, gives them a moment to dump, and ends the job. Never returns.
static void fire(const char *trigger, const char *reason) {
    char path[1100], fired[1100];
    snprintf(path, sizeof(path), "%s/rank-%d.txt", wd.dir, wd.rank);
    fired_path(fired, sizeof(fired));
    struct kiln_error err = {0};
    int rc = kiln_watchdog_write_dump(path, trigger, reason, &err);
    if (!strcmp(trigger, "self") && wd.world > 1) {
        FILE *f = fopen(fired, "wx");
        if (f) {
            fprintf(f, "rank %d: %s\n", wd.rank, reason);
            fclose(f);
        }
    }
    fprintf(stderr,
            "kiln: [rank %d] hang: %s; %s%s; ending the job (exit %d); `kiln doctor` on the run names "
            "the rank that stalled\n",
            wd.rank, reason, rc ? "could not write the dump: " : "flight recorder and stacks in ",
            rc ? err.msg : path, KILN_EXIT_HANG);
    // the peers dump when they see the fired file (within a poll): wait for them, a few seconds at most
    double wait_s = wd.timeout_s < 10 ? (wd.timeout_s > 2 ? wd.timeout_s : 2) : 10,
           until = kiln_now_s() + wait_s;
    char missing[200] = "";
    int n_missing = 0;
    while (wd.world > 1 && (n_missing = missing_dumps(missing, sizeof(missing))) && kiln_now_s() < until)
        usleep(50000);
    // a rank that runs dumps within a poll of the fired file: one that did not is stopped, frozen or dead,
    // which is what the others were waiting for (its own dump, if it ever comes, is written once woken)
    if (n_missing && strcmp(trigger, "stopped"))
        fprintf(stderr,
                "kiln: [rank %d] hang: rank%s %s wrote no dump within %.0f s of the watchdog firing: stopped "
                "(SIGSTOP, a frozen VM or the cgroup freezer), swapping, or dead, and so the likely cause\n",
                wd.rank, n_missing > 1 ? "s" : "", missing, wait_s);
    kiln_comm_abort_all(KILN_EXIT_HANG);
}

// Why this rank hangs, or 0.
static int hang_reason(double now, char *out, size_t cap) {
    struct kiln_flight_rec r;
    if (kiln_flight_oldest_pending(&r) && now - r.t_issue > wd.timeout_s) {
        snprintf(
            out, cap,
            "collective #%llu on communicator %d (%s, %llu bytes, step %lld, layer %d) has waited %.1f s "
            "(--hang-timeout=%g)",
            (unsigned long long)r.seq, r.comm, kiln_flight_op_name(r.op), (unsigned long long)r.bytes,
            (long long)r.step, r.layer, now - r.t_issue, wd.timeout_s);
        return 1;
    }
    double idle = now - kiln_flight_last_progress();
    if (idle > wd.timeout_s) {
        snprintf(out, cap,
                 "no progress for %.1f s at step %lld, layer %d, outside any collective (--hang-timeout=%g)",
                 idle, (long long)kiln_flight_step(), kiln_flight_layer(), wd.timeout_s);
        return 1;
    }
    char fired[1100];
    fired_path(fired, sizeof(fired));
    FILE *f = wd.world > 1 ? fopen(fired, "r") : NULL;
    if (f) {
        char line[400] = "";
        if (!fgets(line, sizeof(line), f))
            line[0] = 0;
        fclose(f);
        line[strcspn(line, "\n")] = 0;
        snprintf(out, cap, "another rank's watchdog fired (%s)", line);
        return 2;
    }
    return 0;
}

static void *watchdog_main(void *arg) {
    (void)arg;
    // poll often enough to answer a peer's fired file quickly, and a timeout of seconds (tests) on time
    double poll_s = wd.timeout_s > 0 && wd.timeout_s < 2 ? wd.timeout_s / 4 : 0.25;
    while (!atomic_load(&wd.stop)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(poll_s * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        while (sem_timedwait(&wd.wake, &ts) != 0 && errno == EINTR)
            ;
        if (atomic_load(&wd.stop))
            break;
        // a poll far later than asked: this process did not run meanwhile (stopped or frozen)
        double woke = kiln_now_s(), late = woke - wd.last_poll - poll_s;
        int just_woken = wd.timeout_s > 0 && late > (wd.timeout_s / 2 > 1 ? wd.timeout_s / 2 : 1);
        if (just_woken) {
            wd.stopped_s = late;
            wd.stopped_end = woke;
        }
        if (atomic_exchange(&wd.usr2, 0)) {
            usleep(20000); // the SIGUSR2 handler that woke us returns first: it is not part of the stack
            char path[1100];
            snprintf(path, sizeof(path), "%s/rank-%d-usr2.txt", wd.dir, wd.rank);
            struct kiln_error err = {0};
            if (kiln_watchdog_write_dump(path, "usr2", "requested by SIGUSR2", &err))
                fprintf(stderr, "kiln: [rank %d] SIGUSR2: %s\n", wd.rank, err.msg);
            else
                fprintf(stderr, "kiln: [rank %d] SIGUSR2: flight recorder and stacks in %s\n", wd.rank, path);
        }
        char gone[400];
        if (kiln_peers_check(gone, sizeof(gone)) == 1) {
            // (a rank that dies leaves the others blocked in a collective with it; its launcher ends them)
            fprintf(stderr, "kiln: [rank %d] during step %lld, %s; ending the job (exit %d)\n", wd.rank,
                    (long long)kiln_flight_step(), gone, KILN_EXIT_PEER_GONE);
            kiln_comm_abort_all(KILN_EXIT_PEER_GONE);
        }
        char reason[512];
        int why = wd.timeout_s > 0 ? hang_reason(kiln_now_s(), reason, sizeof(reason)) : 0;
        if (why && just_woken) { // not a hang of this rank's: the others waited for it while it was stopped
            snprintf(
                reason, sizeof(reason),
                "this rank did not run for %.1f s, until it was woken just now (stopped by SIGSTOP, a "
                "frozen VM or the cgroup freezer, or swapping), longer than --hang-timeout=%g: the other "
                "ranks waited for it",
                wd.stopped_s, wd.timeout_s);
            fire("stopped", reason);
        }
        if (why)
            fire(why == 1 ? "self" : "peer", reason);
        wd.last_poll = kiln_now_s();
    }
    return NULL;
}

int kiln_watchdog_start(const struct kiln_watchdog_opts *o, struct kiln_error *err) {
    KILN_ASSERT(!wd.running);
    (void)err;
    snprintf(wd.dir, sizeof(wd.dir), "%s", o->dir);
    wd.rank = o->rank;
    wd.world = o->world;
    wd.timeout_s = o->timeout_s;
    wd.job = o->job;
    atomic_store(&wd.stop, 0);
    atomic_store(&wd.usr2, 0);
    wd.last_poll = kiln_now_s();
    wd.stopped_s = 0;
    install_stack_handler();
    sem_init(&wd.wake, 0, 0);
    // progress counts from now: the setup before (rendezvous, resume) has timeouts of its own
    kiln_flight_set_step(kiln_flight_step());
    if (pthread_create(&wd.thread, NULL, watchdog_main, NULL) != 0) {
        sem_destroy(&wd.wake);
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot start the hang watchdog thread: %s",
                           strerror(errno));
    }
    pthread_setname_np(wd.thread, "kiln-watchdog");
    wd.running = 1;
    return 0;
}

void kiln_watchdog_stop(void) {
    kiln_peers_clear(); // the job is ending: ranks leave at their own pace from here
    if (!wd.running)
        return;
    atomic_store(&wd.stop, 1);
    sem_post(&wd.wake);
    pthread_join(wd.thread, NULL);
    sem_destroy(&wd.wake);
    wd.running = 0;
}

void kiln_watchdog_poke(void) {
    if (wd.running)
        sem_post(&wd.wake);
}

void kiln_watchdog_request_dump(void) {
    if (!wd.running)
        return;
    atomic_store(&wd.usr2, 1);
    sem_post(&wd.wake);
}
