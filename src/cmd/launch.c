// kiln launch: runs kiln train, one process or a group of local ranks, and restarts it from the newest
// complete checkpoint after a crash.
//
//   kiln launch [--nproc-per-node=N] [--nnodes=M --node-rank=I] [--mode=auto|env|mpirun] [--master-addr=ADDR]
//               [--master-port=P] [--rdzv-timeout=S] [--grace=S] [--max-restarts=N] [--backoff=S]
//               [--backoff-max=S] -- TRAIN-OPTIONS...
//
// With --nproc-per-node=1 (the default) the child is /proc/self/exe train TRAIN-OPTIONS (restarts add
// --resume=auto). With N > 1 the ranks start one of two ways (--mode; auto = mpirun where the train options'
// --device resolves to the CPU, whose ranks talk through MPI, else env):
//   env     launch forks the N ranks itself, each with torchrun's variables: RANK=i, WORLD_SIZE=N,
//           LOCAL_RANK=i, LOCAL_WORLD_SIZE=N, MASTER_ADDR and MASTER_PORT (rank 0 serves the TCP store for
//           NCCL's id there; the port, unless given, is a free one, found afresh for each start by binding
//           port 0 on the address). The ranks write to launch's stdout and stderr, each line of kiln train
//           prefixed with "[rank i] " when WORLD_SIZE > 1.
//   mpirun  launch's one child is mpirun -np N [--oversubscribe] [--allow-run-as-root] --bind-to none
//           KILN train TRAIN-OPTIONS (--oversubscribe when N exceeds the online CPUs, --allow-run-as-root
//           for root), and mpirun brings every rank down when one dies.
// The children share one process group of their own, so that a terminal's Ctrl-C reaches them once, through
// launch, and get SIGTERM if launch dies. SIGTERM, SIGINT and SIGUSR1 are forwarded to every child: the ranks
// save a checkpoint and exit 75, and launch exits 75 too. A SIGINT after the first signal, or a SIGTERM a
// second or more after it, SIGKILLs the group (ranks stuck in a hang never end their step). When every child
// exits 0, launch exits 0. A child that exits with another status or dies by a signal has crashed; in env
// mode launch then sends SIGTERM to the other ranks, SIGKILL to the whole process group after --grace seconds
// (default 10), reaps every rank and kills whatever the ranks left behind in the group, so that no process
// outlives the group. A usage error (2) is not retried; after any other crash launch waits backoff * 2^(k-1)
// seconds (at most backoff-max) and restarts the whole group, up to max-restarts times, and appends one line
// per restart to RUN/restarts.jsonl, naming in env mode the rank that failed first. When it gives up it exits
// with that child's status (128 + signal for a signal).
//
// Several nodes (--nnodes=M > 1, --node-rank=I, the same --master-addr and --master-port on every node): the
// launchers meet first. Node 0's launcher serves a TCP store (parallel/comm/store.h) at --master-port on every
// interface; each launcher registers there with the address it reaches node 0 from, and all wait until every
// node has (--rdzv-timeout, default 300 s; a node missing then is named, with its ranks, on every node that
// did come). Each start of the group then runs on all nodes together, its keys tagged by the start's number:
//   env     node 0 finds a free port for the ranks' own store (rank 0, on node 0, serves it) and publishes
//           it; every node forks its N ranks with RANK = I*N + i, WORLD_SIZE = M*N, LOCAL_RANK = i,
//           LOCAL_WORLD_SIZE = N, MASTER_ADDR = --master-addr and that port.
//   mpirun  node 0 runs mpirun -np M*N --host ADDR0:N,ADDR1:N,... with OpenMPI's rsh agent (normally ssh)
//           set to `kiln launch --relay=...`: for each other node mpirun would ssh to, the relay puts the
//           daemon's command (orted ...) into the store, the launcher of that node runs it as its one child
//           (/bin/sh -c, as ssh would), and the relay exits with its status. MPI stays the transport; kiln
//           only carries one command line per node.
// A node whose ranks fail reports it in the store; the other launchers poll it every 100 ms and stop their
// ranks as if one of their own had failed (a lost store, node 0's launcher dead, counts as a failure too).
// When a start ends, the launchers meet once more and read the outcome together, so that every node
// restarts, stops (75) or gives up alike; only node 0 writes RUN/restarts.jsonl.
//
// Testing hooks (environment): KILN_LAUNCH_EXE=PROGRAM runs PROGRAM instead of kiln (/proc/self/exe) as each
// rank, with the same argv (kiln train TRAIN-OPTIONS...), so that a test can run a small script as the ranks;
// KILN_LAUNCH_MPIRUN=PATH replaces the mpirun found on PATH.
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "cmd/cmd.h"
#include "parallel/comm/store.h"
#include "io/checkpoint.h"
#include "run/options.h"
#include "run/trainer.h"
#include "util/progress.h"

#define LAUNCH_MAX_NPROC 1024
#define LAUNCH_MAX_NODES 4096
#define LAUNCH_DEFAULT_PORT 29500 // the launchers' store across nodes, torchrun's default
#define LAUNCH_POLL_S 0.1         // how often a launcher looks for another node's failure

// The running children (0 once one has exited), for on_signal to forward to.
static volatile sig_atomic_t child_pids[LAUNCH_MAX_NPROC];
static volatile sig_atomic_t n_children = 0;
static volatile sig_atomic_t got_signal = 0;
static volatile sig_atomic_t n_signals = 0;
static volatile sig_atomic_t children_pgid = 0; // the children's process group (0: none running)

static double first_signal_s; // when the first came (kiln_now_s: clock_gettime, async-signal-safe)

// The first signal is forwarded, and the ranks checkpoint and exit 75. A SIGINT after it, or a SIGTERM a
// second or more after it, ends the group at once (SIGKILL), as a second Ctrl-C does: the ranks may be stuck
// where no step ends. A SIGTERM within the second is the first again (Slurm signals every process of a
// step): the ranks have it already.
static void on_signal(int sig) {
    double now = kiln_now_s();
    if (n_signals && (sig == SIGINT || sig == SIGTERM)) {
        if (sig == SIGTERM && now - first_signal_s < 1.0)
            return;
        if (children_pgid > 0)
            kill(-(pid_t)children_pgid, SIGKILL);
        for (int i = 0; i < n_children; i++) // one that has left the group
            if (child_pids[i] > 0)
                kill((pid_t)child_pids[i], SIGKILL);
        got_signal = sig;
        return;
    }
    if (!n_signals++)
        first_signal_s = now;
    got_signal = sig;
    for (int i = 0; i < n_children; i++)
        if (child_pids[i] > 0)
            kill((pid_t)child_pids[i], sig);
}

enum launch_mode {
    MODE_AUTO,   // as asked: resolved to one of the others before the first start
    MODE_SINGLE, // one kiln train, no rank variables (--nproc-per-node=1 under auto)
    MODE_ENV,    // launch forks the ranks with torchrun's variables
    MODE_MPIRUN, // launch runs mpirun, which starts the ranks
};

struct launch_opts {
    int max_restarts;
    double backoff_s, backoff_max_s;
    int nproc;             // ranks on this node
    int nnodes, node_rank; // several nodes: this one's index
    double rdzv_timeout_s; // several nodes: how long the launchers wait for each other
    enum launch_mode mode;
    const char *master_addr; // env mode: MASTER_ADDR; several nodes: node 0's launcher store
    int master_port; // env mode: MASTER_PORT, 0 = a free one for each start; several nodes: the store's
    double grace_s;  // env mode: SIGTERM to SIGKILL when the group is stopped
};

// launch's own options, for telling one given without its value from an unknown one
static const char *const LAUNCH_FLAGS[] = {"max-restarts", "backoff",   "backoff-max", "nproc-per-node",
                                           "master-port",  "grace",     "master-addr", "mode",
                                           "nnodes",       "node-rank", "rdzv-timeout"};

// A launch option with a bad value, in train's style:
// "error: bad value 'V' for NAME (kiln launch --NAME): EXPECTED; see kiln launch --help"
static int bad_value(const char *arg, const char *expected) {
    const char *eq = strchr(arg, '=');
    int n = eq ? (int)(eq - arg) : (int)strlen(arg);
    struct kiln_error e;
    kiln_errorf(&e, KILN_ERR_USAGE, "bad value '%s' for %.*s (kiln launch %.*s): %s; see kiln launch --help",
                eq ? eq + 1 : "", n - 2, arg + 2, n, arg, expected);
    return kiln_error_print(&e);
}

// An argument before -- that is none of launch's options, in train's style: an unknown option, one of
// launch's without its value, or a word that is no option at all (most often train options without --)
static int unknown_arg(const char *arg) {
    struct kiln_error e;
    if (strncmp(arg, "--", 2)) {
        kiln_errorf(&e, KILN_ERR_USAGE,
                    "unexpected argument '%s' (kiln launch): train options go after --; write kiln launch "
                    "[OPTIONS] -- TRAIN-OPTIONS",
                    arg);
        return kiln_error_print(&e);
    }
    const char *name = arg + 2;
    int n = (int)strcspn(name, "=");
    for (size_t i = 0; i < sizeof(LAUNCH_FLAGS) / sizeof(LAUNCH_FLAGS[0]); i++)
        if (!name[n] && !strcmp(name, LAUNCH_FLAGS[i])) {
            kiln_errorf(
                &e, KILN_ERR_USAGE,
                "option --%s needs a value (kiln launch --%s): write --%s=VALUE; see kiln launch --help",
                name, name, name);
            return kiln_error_print(&e);
        }
    kiln_errorf(
        &e, KILN_ERR_USAGE,
        "unknown option '%.*s' (kiln launch --%.*s): train options go after --; see kiln launch --help", n,
        name, n, name);
    return kiln_error_print(&e);
}

// 1: arg is not --flag=..., 0: *out = its value, -1: a bad value
static int parse_number(const char *arg, const char *flag, double lo, double hi, double *out) {
    size_t n = strlen(flag);
    if (strncmp(arg, flag, n) || arg[n] != '=')
        return 1;
    char *end;
    double v = strtod(arg + n + 1, &end);
    if (end == arg + n + 1 || *end || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

// 1: arg is not --flag=..., 0: *out = its value
static int parse_string(const char *arg, const char *flag, const char **out) {
    size_t n = strlen(flag);
    if (strncmp(arg, flag, n) || arg[n] != '=')
        return 1;
    *out = arg + n + 1;
    return 0;
}

static void print_help(void) {
    printf(
        "kiln launch [--nproc-per-node=N] [--nnodes=M --node-rank=I] [--mode=auto|env|mpirun]\n"
        "            [--master-addr=ADDR] [--master-port=P] [--rdzv-timeout=S] [--grace=S] "
        "[--max-restarts=N]\n"
        "            [--backoff=S] [--backoff-max=S] -- TRAIN-OPTIONS...\n\n"
        "Runs kiln train TRAIN-OPTIONS (which must include --out=RUN), as one process or as N local ranks, "
        "and\n"
        "restarts it from the newest complete checkpoint when it crashes. Each restart is logged in\n"
        "RUN/restarts.jsonl.\n"
        "  --nproc-per-node=N  ranks on this node (default 1: one plain kiln train)\n"
        "  --mode=M            how the ranks start: env (launch forks them with RANK, WORLD_SIZE, "
        "LOCAL_RANK,\n"
        "                      LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), mpirun (mpirun -np N starts "
        "them),\n"
        "                      or auto (default: mpirun when --device resolves to the CPU, else env)\n"
        "  --nnodes=M          nodes in the job (default 1); run kiln launch on each, with the same options\n"
        "  --node-rank=I       this node's index, 0..M-1 (node 0 is at --master-addr)\n"
        "  --master-addr=ADDR  where rank 0 serves the rendezvous store (default 127.0.0.1); with --nnodes,\n"
        "                      node 0's address, which every node must reach\n"
        "  --master-port=P     its port (default: a free one, found for each start); with --nnodes, the\n"
        "                      launchers' store on node 0 (default 29500)\n"
        "  --rdzv-timeout=S    with --nnodes, how long the launchers wait for each other (default 300)\n"
        "  --grace=S           seconds between SIGTERM and SIGKILL when a failed rank brings the others "
        "down\n"
        "                      (default 10)\n"
        "  --max-restarts=N    restarts before giving up (default 3)\n"
        "  --backoff=S         seconds before the first restart, doubling each time (default 5)\n"
        "  --backoff-max=S     longest wait between restarts (default 300)\n"
        "When one rank fails, launch stops the others and restarts the whole group. SIGTERM, SIGINT and "
        "SIGUSR1\n"
        "are forwarded to every rank: kiln train checkpoints and exits 75, and so does launch.\n");
}

// the newest checkpoint's step (not verified: for the log only), or 0
static long long newest_step(const char *run) {
    char **paths = NULL;
    int64_t *steps = NULL;
    struct kiln_error err;
    int n = kiln_ckpt_list(run, &paths, &steps, &err);
    long long s = n > 0 ? (long long)steps[0] : 0;
    for (int i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
    free(steps);
    return s;
}

// One crash of the group, as restarts.jsonl records it.
struct crash {
    int rank;   // the rank that failed first (env mode), -1 where launch has one child
    int status; // its wait status
    double uptime_s;
};

static void log_restart(const char *run, int restart, const struct crash *c, long long step, double wait_s) {
    char path[1200], when[64];
    snprintf(path, sizeof(path), "%s/restarts.jsonl", run);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "kiln launch: warning: cannot append to %s: %s; the restart goes on, unlogged\n",
                path, strerror(errno));
        return;
    }
    fprintf(f, "{\"time\":\"%s\",\"unix_time\":%lld,\"restart\":%d,", when, (long long)now, restart);
    if (c->rank >= 0)
        fprintf(f, "\"rank\":%d,", c->rank);
    if (WIFSIGNALED(c->status))
        fprintf(f, "\"signal\":%d,\"signal_name\":\"SIG%s\",", WTERMSIG(c->status),
                sigabbrev_np(WTERMSIG(c->status)));
    else
        fprintf(f, "\"exit_status\":%d,", WEXITSTATUS(c->status));
    fprintf(f, "\"uptime_s\":%.3f,\"resume_step\":%lld,\"backoff_s\":%.3f}\n", c->uptime_s, step, wait_s);
    fclose(f);
}

// A free TCP port on addr: bound as port 0, read back, closed. Another process may take it before rank 0
// binds it, as with torchrun's; the window is short.
static int find_free_port(const char *addr, int *port, char *why, size_t cap) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(addr, "0", &hints, &res);
    if (rc) {
        snprintf(why, cap, "%s", gai_strerror(rc));
        return -1;
    }
    int found = -1;
    for (struct addrinfo *ai = res; ai && found; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        if (fd >= 0 && !bind(fd, ai->ai_addr, ai->ai_addrlen) &&
            !getsockname(fd, (struct sockaddr *)&ss, &len)) {
            *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
            found = 0;
        } else {
            snprintf(why, cap, "%s", strerror(errno));
        }
        if (fd >= 0)
            close(fd);
    }
    freeaddrinfo(res);
    return found;
}

// mpirun: KILN_LAUNCH_MPIRUN, else the first executable mpirun on PATH. 0, or -1 with why filled.
static int find_mpirun(char *path, size_t cap, char *why, size_t why_cap) {
    const char *o = getenv("KILN_LAUNCH_MPIRUN");
    if (o && *o) {
        snprintf(path, cap, "%s", o);
        if (access(path, X_OK)) {
            snprintf(why, why_cap, "KILN_LAUNCH_MPIRUN=%s: %s", o, strerror(errno));
            return -1;
        }
        return 0;
    }
    const char *p = getenv("PATH");
    for (p = p ? p : "/usr/local/bin:/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(path, cap, "%.*s/mpirun", (int)(n ? n : 1), n ? p : ".");
        if (!access(path, X_OK))
            return 0;
        p += n + (p[n] == ':');
    }
    snprintf(why, why_cap, "no mpirun on PATH");
    return -1;
}

// ---- one start of the group ---------------------------------------------------------------------

struct start {
    const char *prog; // what each child runs
    char **argv;      // its argv
    int nchild;       // children launch forks: the ranks in env mode, else 1
    int rank_env;     // 1: set RANK, WORLD_SIZE, ... for each child (env mode)
    int first_rank;   // env mode: the global rank of child 0 (node rank * nproc)
    int world;        // env mode: ranks on all nodes
    const char *master_addr;
    int master_port;
    double grace_s;
    int stop_ok; // several nodes: exit 75 is a stop even without a signal here (the ranks agreed on it)
    // several nodes: polled every LAUNCH_POLL_S while the children run; nonzero = another node failed (or
    // node 0's store is gone), 2 = this node's mpirun waits for a daemon that is gone: the children are
    // stopped as if one of them had failed
    int (*watch)(void *ctx);
    void *watch_ctx;
};

// Forks one child into process group pgid (0: a new one, led by the child) and runs prog. Signals are blocked
// by the caller, so that one arriving now is forwarded once child_pids holds the child.
static pid_t spawn(const char *prog, char **argv, pid_t pgid, const sigset_t *old_mask) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, pgid);                 // terminal signals reach the children once, via launch
        prctl(PR_SET_PDEATHSIG, SIGTERM); // and they checkpoint and stop if launch dies
        if (getppid() != parent)          // launch died before prctl
            _exit(128 + SIGTERM);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGUSR1, SIG_DFL);
        sigprocmask(SIG_SETMASK, old_mask, NULL);
        execv(prog, argv);
        struct kiln_error e;
        kiln_errorf(&e, KILN_ERR_RUNTIME,
                    "cannot run %s (kiln launch): %s; check that it exists and is executable", prog,
                    strerror(errno));
        kiln_error_print(&e);
        _exit(127);
    }
    if (pid > 0)
        setpgid(pid, pgid ? pgid : pid); // in the parent too, so the group exists before the next fork
    return pid;
}

static void set_rank_env(const struct start *s, int local) {
    char v[32];
    snprintf(v, sizeof(v), "%d", s->first_rank + local);
    setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%d", local);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof(v), "%d", s->world);
    setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof(v), "%d", s->nchild);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", s->master_addr, 1);
    snprintf(v, sizeof(v), "%d", s->master_port);
    setenv("MASTER_PORT", v, 1);
}

// Whether pid has exited, without reaping it (a zombie keeps its pid, and rank 0's keeps the process group's
// id ours until the end); *status gets its wait status.
static int has_exited(pid_t pid, int *status) {
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0) {
        if (errno == EINTR)
            return 0;
        *status = 127 << 8; // not our child any more: cannot happen, but must not loop forever
        return 1;
    }
    if (si.si_pid == 0)
        return 0;
    if (si.si_code == CLD_EXITED)
        *status = (si.si_status & 0xff) << 8;
    else
        *status = (si.si_status & 0x7f) | (si.si_code == CLD_DUMPED ? 0x80 : 0);
    return 1;
}

static void describe_status(int status, char *buf, size_t cap) {
    if (WIFSIGNALED(status))
        snprintf(buf, cap, "was killed by signal %d (SIG%s)", WTERMSIG(status),
                 sigabbrev_np(WTERMSIG(status)));
    else
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
}

static void kill_live(const pid_t *pids, const int *done, int n, int sig) {
    for (int i = 0; i < n; i++)
        if (!done[i])
            kill(pids[i], sig);
}

// Starts the children, waits for all of them, and reaps them. Returns 0 with c->rank = -1 and c->status the
// group's status (0, or a stop's 75) when no child failed, 1 with *c filled when one did (the first one;
// c->rank = -2 when s->watch said another node failed first), or -1 when a fork failed (after stopping what
// had started).
static int run_group(const struct start *s, struct crash *c) {
    pid_t *pids = calloc((size_t)s->nchild, sizeof(pid_t));
    int *done = calloc((size_t)s->nchild, sizeof(int)), *status = calloc((size_t)s->nchild, sizeof(int));
    if (!pids || !done || !status) {
        free(pids), free(done), free(status);
        struct kiln_error e;
        kiln_errorf(&e, KILN_ERR_RUNTIME,
                    "out of memory (kiln launch): bookkeeping for %d ranks; use fewer ranks", s->nchild);
        kiln_error_print(&e);
        return -1;
    }
    sigset_t stop_sigs, old_mask;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGTERM);
    sigaddset(&stop_sigs, SIGINT);
    sigaddset(&stop_sigs, SIGUSR1);

    double t0 = kiln_now_s();
    pid_t pgid = 0;
    int live = 0, failed = -1, rc = 0;
    for (int r = 0; r < s->nchild; r++) {
        if (s->rank_env)
            set_rank_env(s, r);
        sigprocmask(SIG_BLOCK, &stop_sigs, &old_mask);
        pids[r] = spawn(s->prog, s->argv, pgid, &old_mask);
        if (pids[r] > 0) {
            child_pids[r] = pids[r];
            n_children = r + 1;
            live++;
        }
        sigprocmask(SIG_SETMASK, &old_mask, NULL); // a signal that came meanwhile is forwarded now
        if (pids[r] < 0) {
            struct kiln_error e;
            kiln_errorf(&e, KILN_ERR_RUNTIME,
                        "cannot fork rank %d (kiln launch): %s; check the process limit (ulimit -u)",
                        s->first_rank + r, strerror(errno));
            kiln_error_print(&e);
            for (int k = r; k < s->nchild; k++)
                done[k] = 1;
            kill_live(pids, done, r, SIGKILL);
            rc = -1;
            break;
        }
        if (!pgid)
            children_pgid = pgid = pids[0];
    }

    // Poll every few ms: a rank is looked at without being reaped (has_exited), and the first to fail brings
    // the others down: SIGTERM now, SIGKILL to the process group after the grace period.
    double kill_at = -1, next_watch = kiln_now_s() + LAUNCH_POLL_S;
    int killed = 0;
    while (live > 0) {
        if (s->watch && failed < 0 && rc == 0 && kiln_now_s() >= next_watch) {
            next_watch = kiln_now_s() + LAUNCH_POLL_S;
            int why = s->watch(s->watch_ctx);
            if (why) {
                failed = s->nchild;           // not one of ours
                c->rank = why == 2 ? -1 : -2; // 2: this node's mpirun is stuck, a failure here
                c->status = KILN_ERR_RUNTIME << 8;
                c->uptime_s = kiln_now_s() - t0;
                fprintf(
                    stderr,
                    "kiln launch: %s; stopping this node's %d rank%s (SIGTERM, then SIGKILL after %g s)\n",
                    why == 2 ? "mpirun is stuck" : "another node failed", live, live == 1 ? "" : "s",
                    s->grace_s);
                kill_live(pids, done, s->nchild, SIGTERM);
                kill_at = kiln_now_s() + s->grace_s;
            }
        }
        for (int r = 0; r < s->nchild; r++) {
            if (done[r] || !has_exited(pids[r], &status[r]))
                continue;
            done[r] = 1;
            child_pids[r] = 0;
            live--;
            int st = status[r];
            int stopped = WIFEXITED(st) && WEXITSTATUS(st) == KILN_EXIT_STOPPED && (got_signal || s->stop_ok);
            if (st == 0 || stopped || failed >= 0 || rc < 0)
                continue;
            failed = r;
            c->rank = s->rank_env ? s->first_rank + r : -1;
            c->status = st;
            c->uptime_s = kiln_now_s() - t0;
            if (live > 0) {
                char how[96];
                describe_status(st, how, sizeof(how));
                fprintf(stderr,
                        "kiln launch: rank %d %s; stopping the other %d rank%s (SIGTERM, then SIGKILL after "
                        "%g s)\n",
                        s->first_rank + r, how, live, live == 1 ? "" : "s", s->grace_s);

                kill_live(pids, done, s->nchild, SIGTERM);
                kill_at = kiln_now_s() + s->grace_s;
            }
        }
        if (live > 0 && kill_at >= 0 && !killed && kiln_now_s() >= kill_at) {
            fprintf(stderr, "kiln launch: %d rank%s still running %g s after SIGTERM: SIGKILL\n", live,
                    live == 1 ? "" : "s", s->grace_s);
            kill(-pgid, SIGKILL);
            kill_live(pids, done, s->nchild, SIGKILL); // one that has left the group
            killed = 1;
        }
        if (live > 0) {
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    n_children = 0;
    children_pgid = 0;
    // What the children started and left behind dies with them: the group's id is still ours, since its
    // leader (the first child) is not reaped yet.
    if (pgid > 0)
        kill(-pgid, SIGKILL);
    for (int r = 0; r < s->nchild; r++)
        if (pids[r] > 0)
            while (waitpid(pids[r], NULL, 0) < 0 && errno == EINTR) {
            }

    if (rc == 0 && failed >= 0) {
        rc = 1;
    } else if (rc == 0) {
        c->rank = -1;
        c->status = 0;
        for (int r = 0; r < s->nchild; r++)
            if (status[r])
                c->status = status[r]; // a stop: 75
        c->uptime_s = kiln_now_s() - t0;
    }
    free(pids), free(done), free(status);
    return rc;
}

static int exit_code_of(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// ---- several nodes: the launchers meet at node 0's store ----------------------------------------

struct nodes {
    struct kiln_store *store;
    int nnodes, node_rank, nproc;
    double timeout_s;
    const char *master_addr;
    int master_port;
    char (*addr)[NI_MAXHOST]; // each node's address, as the others reach it (mpirun's --host)
    int gen;                  // the current start of the group: its keys carry it
    int mpirun_daemons;       // node 0 under mpirun: the other nodes run daemons its mpirun started
    double grace_s;
    double daemon_gone_at; // when node 0 first saw a daemon's exit while mpirun ran (-1: not yet)
    int lost;              // the store failed once: node 0's launcher is gone, every later call fails
    struct kiln_error err; // the store's error when lost
};

// "ranks 2-3" (or "rank 2") of node `node`
static void node_ranks(const struct nodes *n, int node, char *buf, size_t cap) {
    int a = node * n->nproc, b = a + n->nproc - 1;
    if (a == b)
        snprintf(buf, cap, "rank %d", a);
    else
        snprintf(buf, cap, "ranks %d-%d", a, b);
}

static void nodes_where(const struct nodes *n, char *buf, size_t cap) {
    snprintf(buf, cap, "kiln launch --nnodes=%d --node-rank=%d, store at %s:%d", n->nnodes, n->node_rank,
             n->master_addr, n->master_port);
}

// kiln_store_add on the nodes' store: 0, or -1 once it is lost
static int nodes_add(struct nodes *n, const char *key, int64_t delta, int64_t *out) {
    if (n->lost || kiln_store_add(n->store, key, delta, out, &n->err)) {
        n->lost = 1;
        return -1;
    }
    return 0;
}

// The store is gone: the error every node but 0 gives.
static int nodes_lost_error(const struct nodes *n, struct kiln_error *err) {
    char where[400];
    nodes_where(n, where, sizeof(where));
    return kiln_errorf(err, KILN_ERR_RUNTIME,
                       "node 0's launcher is gone (%s): %s; see node 0's log, then start every node again",
                       where, n->err.msg);
}

// Node 0 gives up: it leaves its message for the others (who poll kiln/launch/abort while they wait), gives
// them a moment to read it, and stops the store.
static void nodes_abort(struct nodes *n, const struct kiln_error *why) {
    if (!n->store)
        return;
    if (n->node_rank == 0 && !n->lost) {
        struct kiln_error e;
        if (!kiln_store_set(n->store, "kiln/launch/abort", why->msg, strlen(why->msg), &e)) {
            struct timespec ts = {0, (long)(3 * LAUNCH_POLL_S * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
    kiln_store_close_now(n->store);
    n->store = NULL;
}

// Whether node 0 left an abort message (copied into err): 1, else 0.
static int nodes_aborted(struct nodes *n, struct kiln_error *err) {
    char msg[sizeof(err->msg)];
    size_t len = 0;
    int found = 0;
    if (n->lost ||
        kiln_store_try_get(n->store, "kiln/launch/abort", msg, sizeof(msg) - 1, &len, 0, &found, &n->err)) {
        n->lost = 1;
        return 0;
    }
    if (!found)
        return 0;
    msg[len] = 0;
    kiln_errorf(err, KILN_ERR_RUNTIME, "%s", msg);
    return 1;
}

// Every node's launcher registers its address and waits for all the others, at most --rdzv-timeout. 0, or
// an error naming the nodes (and their ranks) that did not come.
static int nodes_join(struct nodes *n, struct kiln_error *err) {
    char where[400], key[64], missing[512] = "", ranks[64];
    nodes_where(n, where, sizeof(where));
    struct kiln_error e;
    double t0 = kiln_now_s();
    if (kiln_store_open(&n->store, n->master_addr, n->master_port, n->node_rank == 0, n->nnodes, n->timeout_s,
                        &e)) {
        n->store = NULL;
        if (n->node_rank == 0) {
            *err = e;
            return e.code;
        }
        node_ranks(n, 0, ranks, sizeof(ranks));
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "node 0 (%s) never arrived (%s): %s; start kiln launch --node-rank=0 on %s, or raise "
            "--rdzv-timeout",
            ranks, where, e.msg, n->master_addr);
    }
    char me[NI_MAXHOST];
    if (n->node_rank == 0)
        snprintf(me, sizeof(me), "%s", n->master_addr);
    else if (kiln_store_local_addr(n->store, me, sizeof(me)))
        snprintf(me, sizeof(me), "%s", "?");
    snprintf(key, sizeof(key), "kiln/launch/addr/%d", n->node_rank);
    int64_t joined = 0;
    if (kiln_store_set(n->store, key, me, strlen(me), &n->err)) {
        n->lost = 1;
        return nodes_lost_error(n, err);
    }
    snprintf(key, sizeof(key), "kiln/launch/joined/%d", n->node_rank);
    if (nodes_add(n, key, 1, NULL) || nodes_add(n, "kiln/launch/joined", 1, &joined))
        return nodes_lost_error(n, err);

    double deadline = t0 + n->timeout_s;
    while (joined < n->nnodes) {
        if (n->node_rank > 0 && nodes_aborted(n, err))
            return err->code;
        if (n->lost || nodes_add(n, "kiln/launch/joined", 0, &joined))
            return nodes_lost_error(n, err);
        if (joined >= n->nnodes)
            break;
        if (got_signal)
            return kiln_errorf(
                err, KILN_EXIT_STOPPED,
                "stopped while waiting for the other nodes (%s): signal %d; nothing was started", where,
                (int)got_signal);
        if (kiln_now_s() >= deadline) {
            int n_missing = 0, first = -1, last = -1;
            for (int j = 0; j < n->nnodes; j++) {
                int64_t v = 1;
                snprintf(key, sizeof(key), "kiln/launch/joined/%d", j);
                if (nodes_add(n, key, 0, &v))
                    return nodes_lost_error(n, err);
                if (v)
                    continue;
                if (n_missing++ < 8) {
                    node_ranks(n, j, ranks, sizeof(ranks));
                    size_t len = strlen(missing);
                    snprintf(missing + len, sizeof(missing) - len, "%s%d (%s)", len ? ", " : "", j, ranks);
                }
                if (first < 0)
                    first = j;
                last = j;
            }
            char hint[64];
            snprintf(hint, sizeof(hint), first == last ? "%d" : "%d..%d", first, last);
            return kiln_errorf(
                err, KILN_ERR_RUNTIME,
                "node%s %s%s never arrived (%s): %lld of %d nodes joined in %.0f s; start kiln "
                "launch --node-rank=%s with the same --nnodes, --master-addr and --master-port, "
                "or raise --rdzv-timeout",
                n_missing == 1 ? "" : "s", missing, n_missing > 8 ? ", ..." : "", where, (long long)joined,
                n->nnodes, kiln_now_s() - t0, hint);
        }
        struct timespec ts = {0, (long)(LAUNCH_POLL_S * 1e9)};
        nanosleep(&ts, NULL);
    }
    for (int j = 0; j < n->nnodes; j++) {
        size_t len = 0;
        snprintf(key, sizeof(key), "kiln/launch/addr/%d", j);
        if (kiln_store_get(n->store, key, n->addr[j], NI_MAXHOST - 1, &len, n->timeout_s, &n->err)) {
            n->lost = 1;
            return nodes_lost_error(n, err);
        }
        n->addr[j][len] = 0;
    }
    // no launcher may leave (and node 0 take the store down) before every one has read the addresses
    if (kiln_store_barrier(n->store, "kiln/launch/addresses", n->timeout_s, &n->err)) {
        n->lost = 1;
        return nodes_lost_error(n, err);
    }
    return 0;
}

// run_group's watch: whether another node reported a failure of this start (or the store is gone)
// Node 0 under mpirun: whether a daemon that its mpirun started on another node has ended while mpirun still
// runs, for longer than mpirun needs to notice (the grace period plus 10 s). A daemon that exits without
// calling back would otherwise leave mpirun waiting for it forever (OpenMPI sets no deadline on daemons that
// were launched), and every node with it. Says which node on stderr when it gives up; 1 then, else 0.
static int nodes_daemon_gone(struct nodes *n) {
    char key[64], buf[32];
    for (int j = 1; j < n->nnodes; j++) {
        size_t len = 0;
        int found = 0;
        snprintf(key, sizeof(key), "kiln/launch/%d/exit/%d", n->gen, j);
        if (n->lost || kiln_store_try_get(n->store, key, buf, sizeof(buf) - 1, &len, 0, &found, &n->err)) {
            n->lost = 1;
            return 1;
        }
        if (!found)
            continue;
        if (n->daemon_gone_at < 0)
            n->daemon_gone_at = kiln_now_s();
        if (kiln_now_s() - n->daemon_gone_at < n->grace_s + 10)
            return 0;
        buf[len] = 0;
        char ranks[64];
        node_ranks(n, j, ranks, sizeof(ranks));
        fprintf(stderr,
                "kiln launch: the MPI daemon on node %d (%s) ended (status %s) %.0f s ago and mpirun still "
                "waits for it: stopping mpirun\n",
                j, ranks, buf, kiln_now_s() - n->daemon_gone_at);
        return 1;
    }
    return 0;
}

static int nodes_watch(void *ctx) {
    struct nodes *n = ctx;
    char key[64];
    int64_t failed = 0;
    snprintf(key, sizeof(key), "kiln/launch/%d/failed", n->gen);
    if (nodes_add(n, key, 0, &failed) || failed > 0)
        return 1;
    if (n->mpirun_daemons && nodes_daemon_gone(n))
        return n->lost ? 1 : 2;
    return 0;
}

// Waits for this start's key (node 0 sets it), watching for a failure meanwhile. 0 with the value in buf
// (NUL-terminated), 1 when another node failed first, or -1 with err filled.
static int nodes_wait_key(struct nodes *n, const char *key, char *buf, size_t cap, struct kiln_error *err) {
    char where[400];
    nodes_where(n, where, sizeof(where));
    for (double deadline = kiln_now_s() + n->timeout_s;;) {
        size_t len = 0;
        int found = 0;
        if (n->lost ||
            kiln_store_try_get(n->store, key, buf, cap - 1, &len, LAUNCH_POLL_S, &found, &n->err)) {
            n->lost = 1;
            nodes_lost_error(n, err);
            return -1;
        }
        if (found) {
            buf[len] = 0;
            return 0;
        }
        if (nodes_watch(n))
            return n->lost ? (nodes_lost_error(n, err), -1) : 1;
        if (kiln_now_s() >= deadline) {
            kiln_errorf(err, KILN_ERR_RUNTIME,
                        "node 0 did not start the group (%s): '%s' not set in %.0f s; see node 0's log, or "
                        "raise --rdzv-timeout",
                        where, key, n->timeout_s);
            return -1;
        }
    }
}

// This start has ended here, as *c says (g: run_group's result). Reports a local failure or stop, meets the
// other launchers, and reads the outcome of the whole job into *c, so that every node decides alike. Returns
// 1 when some node failed, 0 when none did (c->status 0, or a stop's 75), -1 with err filled when the store
// is lost or the others do not come.
static int nodes_end(struct nodes *n, int g, struct crash *c, double grace_s, struct kiln_error *err) {
    char key[64], why[128];
    int64_t v = 0;
    if (g == 1 && c->rank != -2) {
        snprintf(key, sizeof(key), "kiln/launch/%d/failed", n->gen);
        if (nodes_add(n, key, 1, &v) == 0 && v == 1) {
            snprintf(key, sizeof(key), "kiln/launch/%d/why", n->gen);
            snprintf(why, sizeof(why), "%d %d %d %.3f", c->status, c->rank, n->node_rank, c->uptime_s);
            if (kiln_store_set(n->store, key, why, strlen(why), &n->err))
                n->lost = 1;
        }
    } else if (g == 0 && c->status) {
        snprintf(key, sizeof(key), "kiln/launch/%d/stopped", n->gen);
        nodes_add(n, key, 1, NULL);
    }
    if (n->lost || kiln_store_barrier(n->store, "kiln/launch/end", n->timeout_s + grace_s, &n->err)) {
        n->lost = 1;
        return nodes_lost_error(n, err), -1;
    }
    snprintf(key, sizeof(key), "kiln/launch/%d/failed", n->gen);
    if (nodes_add(n, key, 0, &v))
        return nodes_lost_error(n, err), -1;
    if (v > 0) {
        size_t len = 0;
        int status = 0, rank = -1, node = -1;
        double uptime_s = 0;
        snprintf(key, sizeof(key), "kiln/launch/%d/why", n->gen);
        if (kiln_store_get(n->store, key, why, sizeof(why) - 1, &len, n->timeout_s, &n->err)) {
            n->lost = 1;
            return nodes_lost_error(n, err), -1;
        }
        why[len] = 0;
        if (sscanf(why, "%d %d %d %lf", &status, &rank, &node, &uptime_s) == 4) {
            c->status = status;
            c->rank = rank;
            c->uptime_s = uptime_s;
        }

        return 1;
    }
    snprintf(key, sizeof(key), "kiln/launch/%d/stopped", n->gen);
    if (nodes_add(n, key, 0, &v))
        return nodes_lost_error(n, err), -1;
    c->rank = -1;
    c->status = v > 0 ? KILN_EXIT_STOPPED << 8 : 0;
    return 0;
}

// kiln launch --relay=GEN,NNODES,PORT,TIMEOUT,ADDR HOST COMMAND...: OpenMPI's rsh agent (in place of ssh)
// for node 0's mpirun. It hands COMMAND (the remote daemon's, words quoted for a shell, as ssh would pass
// them) through the store to the launcher of the node registered as HOST, which runs it, and exits with its
// exit status once that launcher reports it.
static int launch_relay(int argc, char **argv) {
    int gen, nnodes, port, at = 0;
    double timeout_s;
    struct kiln_error e;
    if (argc < 3 || sscanf(argv[0], "--relay=%d,%d,%d,%lf,%n", &gen, &nnodes, &port, &timeout_s, &at) != 4 ||
        !at || nnodes < 2) {
        kiln_errorf(
            &e, KILN_ERR_USAGE,
            "%s (kiln launch --relay): not the call of mpirun's rsh agent; kiln launch --nnodes passes "
            "it to mpirun, it is not for use by hand",
            argv[0]);
        return kiln_error_print(&e);
    }
    const char *addr = argv[0] + at, *host = argv[1];
    struct kiln_store *st;
    if (kiln_store_open(&st, addr, port, 0, nnodes, timeout_s, &e))
        return kiln_error_print(&e);
    char key[64], buf[NI_MAXHOST];
    int node = -1;
    for (int j = 1; j < nnodes && node < 0; j++) {
        size_t len = 0;
        int found = 0;
        snprintf(key, sizeof(key), "kiln/launch/addr/%d", j);
        if (kiln_store_try_get(st, key, buf, sizeof(buf) - 1, &len, 0, &found, &e)) {
            kiln_store_close(st);
            return kiln_error_print(&e);
        }
        buf[len] = 0;
        if (found && !strcmp(buf, host))
            node = j;
    }
    if (node < 0) {
        kiln_store_close(st);
        kiln_errorf(
            &e, KILN_ERR_RUNTIME,
            "host %s (kiln launch --relay, mpirun's rsh agent): no node registered with that address; "
            "mpirun's --host names each node by the address its launcher registered",
            host);
        return kiln_error_print(&e);
    }
    size_t cap = 1;
    for (int a = 2; a < argc; a++)
        cap += strlen(argv[a]) + 1;
    char *cmd = calloc(cap, 1);
    for (int a = 2; a < argc; a++) {
        strcat(cmd, argv[a]);
        if (a + 1 < argc)
            strcat(cmd, " ");
    }
    int rc = 0;
    snprintf(key, sizeof(key), "kiln/launch/%d/cmd/%d", gen, node);
    if (kiln_store_set(st, key, cmd, strlen(cmd), &e)) {
        rc = kiln_error_print(&e);
    } else { // the daemon lives as long as the job: wait for its end without a deadline
        snprintf(key, sizeof(key), "kiln/launch/%d/exit/%d", gen, node);
        for (;;) {
            size_t len = 0;
            int found = 0;
            if (kiln_store_try_get(st, key, buf, sizeof(buf) - 1, &len, 1.0, &found, &e)) {
                rc = 255; // node 0's launcher is gone, and mpirun with it
                break;
            }
            if (found) {
                buf[len] = 0;
                int status = atoi(buf);
                rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                break;
            }
        }
    }
    free(cmd);
    kiln_store_close(st);
    return rc;
}

// ---- the command ----------------------------------------------------------------------------------

static int parse_opts(int argc, char **argv, struct launch_opts *o, int *consumed) {
    int i = 0;
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        double v;
        int r;
        const char *s;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help();
            *consumed = -1;
            return 0;
        }
        if ((r = parse_number(argv[i], "--max-restarts", 0, 1e6, &v)) <= 0) {
            if (r < 0 || v != (int)v)
                return bad_value(argv[i], "expected a whole number 0..1e6");
            o->max_restarts = (int)v;
        } else if ((r = parse_number(argv[i], "--backoff", 0, 86400, &v)) <= 0) {
            if (r < 0)
                return bad_value(argv[i], "expected seconds 0..86400");
            o->backoff_s = v;
        } else if ((r = parse_number(argv[i], "--backoff-max", 0, 86400, &v)) <= 0) {
            if (r < 0)
                return bad_value(argv[i], "expected seconds 0..86400");
            o->backoff_max_s = v;
        } else if ((r = parse_number(argv[i], "--nproc-per-node", 1, LAUNCH_MAX_NPROC, &v)) <= 0) {
            if (r < 0 || v != (int)v)
                return bad_value(argv[i], "expected a whole number 1..1024");
            o->nproc = (int)v;
        } else if ((r = parse_number(argv[i], "--master-port", 1, 65535, &v)) <= 0) {
            if (r < 0 || v != (int)v)
                return bad_value(argv[i], "expected a port 1..65535");
            o->master_port = (int)v;
        } else if ((r = parse_number(argv[i], "--grace", 0, 86400, &v)) <= 0) {
            if (r < 0)
                return bad_value(argv[i], "expected seconds 0..86400");
            o->grace_s = v;
        } else if (!parse_string(argv[i], "--master-addr", &s)) {
            if (!*s || strlen(s) > 255)
                return bad_value(argv[i], "expected a host name or IP address");
            o->master_addr = s;
        } else if (!parse_string(argv[i], "--mode", &s)) {
            if (!strcmp(s, "auto"))
                o->mode = MODE_AUTO;
            else if (!strcmp(s, "env"))
                o->mode = MODE_ENV;
            else if (!strcmp(s, "mpirun"))
                o->mode = MODE_MPIRUN;
            else
                return bad_value(argv[i], "expected auto, env or mpirun");
        } else if ((r = parse_number(argv[i], "--nnodes", 1, LAUNCH_MAX_NODES, &v)) <= 0) {
            if (r < 0 || v != (int)v)
                return bad_value(argv[i], "expected a whole number 1..4096");
            o->nnodes = (int)v;
        } else if ((r = parse_number(argv[i], "--node-rank", 0, LAUNCH_MAX_NODES - 1, &v)) <= 0) {
            if (r < 0 || v != (int)v)
                return bad_value(argv[i], "expected a whole number 0..4095");
            o->node_rank = (int)v;
        } else if ((r = parse_number(argv[i], "--rdzv-timeout", 0.1, 86400, &v)) <= 0) {
            if (r < 0)
                return bad_value(argv[i], "expected seconds 0.1..86400");
            o->rdzv_timeout_s = v;
        } else {
            return unknown_arg(argv[i]);
        }
    }
    if (i == argc) {
        struct kiln_error e;
        kiln_errorf(&e, KILN_ERR_USAGE,
                    "no train options (kiln launch): missing -- before them; write kiln launch [OPTIONS] -- "
                    "TRAIN-OPTIONS");
        return kiln_error_print(&e);
    }
    if (o->node_rank >= o->nnodes) {
        char arg[64];
        snprintf(arg, sizeof(arg), "--node-rank=%d", o->node_rank);
        return bad_value(arg, o->nnodes == 1 ? "--node-rank needs --nnodes=M with M > 1"
                                             : "not below --nnodes; nodes count from 0");
    }
    *consumed = i + 1;
    return 0;
}

int cmd_launch(int argc, char **argv, const struct kiln_knobs *knobs) {
    (void)knobs; // the supervisor passes its environment, knobs and all, to the kiln train it starts
    if (argc > 0 && !strncmp(argv[0], "--relay=", 8))
        return launch_relay(argc, argv);
    struct launch_opts o = {.max_restarts = 3,
                            .backoff_s = 5,
                            .backoff_max_s = 300,
                            .nproc = 1,
                            .nnodes = 1,
                            .rdzv_timeout_s = 300,
                            .mode = MODE_AUTO,
                            .master_addr = "127.0.0.1",
                            .grace_s = 10};
    int used = 0, urc = parse_opts(argc, argv, &o, &used);
    if (urc || used < 0)
        return urc;
    int targc = argc - used;
    char **targv = argv + used;
    if (targc > 0 && !strcmp(targv[0], "train"))
        targc--, targv++;
    // the train options are checked here, so that a typo fails once instead of max-restarts times
    struct kiln_config cfg;
    struct kiln_error err = {0};
    if (kiln_config_parse(&cfg, targc, targv, &err))
        return kiln_error_print(&err);
    if (!cfg.out[0]) {
        kiln_errorf(&err, KILN_ERR_USAGE,
                    "no --out=RUN (kiln launch's train options): the run directory holds the checkpoints it "
                    "restarts from; add --out=RUN after --");
        return kiln_error_print(&err);
    }
    int multi = o.nnodes > 1;
    if (multi && !o.master_port)
        o.master_port = LAUNCH_DEFAULT_PORT;

    const char *mode_flag = o.mode == MODE_AUTO  ? "--mode=auto"
                            : o.mode == MODE_ENV ? "--mode=env"
                                                 : "--mode=mpirun";
    if (o.mode == MODE_AUTO)
        o.mode = o.nproc == 1 && !multi                            ? MODE_SINGLE
                 : strcmp(kiln_backend_resolve(cfg.device), "cpu") ? MODE_ENV
                                                                   : MODE_MPIRUN;
    // mpirun's ranks cannot use /proc/self/exe (it would be mpirun's), nor can its rsh agent
    char exe[PATH_MAX], self[PATH_MAX], mpirun[PATH_MAX], why[PATH_MAX + 64];
    ssize_t n_self = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n_self <= 0) {
        kiln_errorf(&err, KILN_ERR_RUNTIME, "cannot read /proc/self/exe (kiln launch): %s; mount /proc",
                    strerror(errno));
        return kiln_error_print(&err);
    }
    self[n_self] = 0;
    const char *hook = getenv("KILN_LAUNCH_EXE");
    if (hook && *hook) {
        if (access(hook, X_OK)) {
            kiln_errorf(&err, KILN_ERR_USAGE,
                        "cannot run KILN_LAUNCH_EXE=%s (kiln launch): %s; unset it to run kiln", hook,
                        strerror(errno));
            return kiln_error_print(&err);
        }
        snprintf(exe, sizeof(exe), "%s", hook);
    } else if (o.mode == MODE_MPIRUN) {
        snprintf(exe, sizeof(exe), "%s", self);
    } else {
        snprintf(exe, sizeof(exe), "/proc/self/exe");
    }
    // only node 0 runs mpirun: the other nodes run what its rsh agent relays
    if (o.mode == MODE_MPIRUN && o.node_rank == 0 && find_mpirun(mpirun, sizeof(mpirun), why, sizeof(why))) {
        kiln_errorf(&err, KILN_ERR_USAGE,
                    "mpirun not found (kiln launch %s%s): %s; install openmpi-bin, or use --mode=env",
                    mode_flag, !strcmp(mode_flag, "--mode=auto") ? ", CPU ranks start through MPI" : "", why);
        return kiln_error_print(&err);
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    struct nodes nodes = {.nnodes = o.nnodes,
                          .node_rank = o.node_rank,
                          .nproc = o.nproc,
                          .timeout_s = o.rdzv_timeout_s,
                          .master_addr = o.master_addr,
                          .master_port = o.master_port};
    if (multi) {
        nodes.addr = calloc((size_t)o.nnodes, sizeof(*nodes.addr));
        if (!nodes.addr) {
            kiln_errorf(&err, KILN_ERR_RUNTIME,
                        "out of memory (kiln launch --nnodes=%d): the nodes' addresses; "
                        "use fewer nodes",
                        o.nnodes);
            return kiln_error_print(&err);
        }
        if (nodes_join(&nodes, &err)) {
            nodes_abort(&nodes, &err);
            free(nodes.addr);
            return kiln_error_print(&err);
        }
        for (int i = 0; o.mode == MODE_MPIRUN && i < o.nnodes; i++)
            for (int j = 0; j < i; j++)
                if (!strcmp(nodes.addr[i], nodes.addr[j])) {
                    kiln_errorf(
                        &err, KILN_ERR_USAGE,
                        "nodes %d and %d are both at %s (kiln launch --mode=mpirun --nnodes=%d): mpirun "
                        "starts one daemon per address; run each node's launcher on its own host, or "
                        "use --mode=env",
                        j, i, nodes.addr[i], o.nnodes);
                    kiln_store_close_now(nodes.store);
                    free(nodes.addr);
                    return kiln_error_print(&err);
                }
        fprintf(stderr, "kiln launch: node %d of %d: all %d nodes joined at %s:%d\n", o.node_rank, o.nnodes,
                o.nnodes, o.master_addr, o.master_port);
    }

    // argv: [mpirun -np W [--host H0:N,H1:N,... --mca plm_rsh_agent AGENT --mca plm_rsh_no_tree_spawn 1
    //        --mca orte_leave_session_attached 1]
    //        [--oversubscribe] [--allow-run-as-root] --bind-to none] EXE train OPTIONS... [--resume=auto]
    //        NULL
    // or, on a node other than 0 under mpirun: /bin/sh -c DAEMON-COMMAND NULL
    char **cargv = calloc((size_t)targc + 32, sizeof(char *));
    size_t hosts_cap = (size_t)o.nnodes * (NI_MAXHOST + 16) + 1;
    char *hosts = calloc(hosts_cap, 1), *relayed = calloc(KILN_STORE_MAX_VALUE + 1, 1);
    char np[16], agent[PATH_MAX + 400], key[64], port_s[16];
    if (!cargv || !hosts || !relayed) {
        free(cargv), free(hosts), free(relayed), free(nodes.addr);
        kiln_store_close_now(nodes.store);
        kiln_errorf(&err, KILN_ERR_RUNTIME,
                    "out of memory (kiln launch): the ranks' command line; free some memory");
        return kiln_error_print(&err);
    }
    snprintf(np, sizeof(np), "%d", o.nproc * o.nnodes);
    for (int i = 0; multi && i < o.nnodes; i++) {
        size_t len = strlen(hosts);
        snprintf(hosts + len, hosts_cap - len, "%s%s:%d", i ? "," : "", nodes.addr[i], o.nproc);
    }

    int rc = 0;
    char who[64];
    for (int restart = 0;; restart++) {
        nodes.gen = restart;
        nodes.mpirun_daemons = o.mode == MODE_MPIRUN && o.node_rank == 0;
        nodes.grace_s = o.grace_s;
        nodes.daemon_gone_at = -1;
        struct start st = {.nchild = o.mode == MODE_ENV ? o.nproc : 1,
                           .rank_env = o.mode == MODE_ENV,
                           .first_rank = o.node_rank * o.nproc,
                           .world = o.nnodes * o.nproc,
                           .master_addr = o.master_addr,
                           .master_port = multi ? 0 : o.master_port,
                           .grace_s = o.grace_s,
                           .stop_ok = multi,
                           .watch = multi ? nodes_watch : NULL,
                           .watch_ctx = &nodes};
        int k = 0, w = 0;
        if (o.mode == MODE_MPIRUN && o.node_rank > 0) { // the daemon node 0's mpirun starts here
            snprintf(key, sizeof(key), "kiln/launch/%d/cmd/%d", restart, o.node_rank);
            w = nodes_wait_key(&nodes, key, relayed, KILN_STORE_MAX_VALUE + 1, &err);
            cargv[k++] = "/bin/sh";
            cargv[k++] = "-c";
            cargv[k++] = relayed;
            st.prog = "/bin/sh";
        } else {
            if (o.mode == MODE_MPIRUN) {
                cargv[k++] = "mpirun";
                cargv[k++] = "-np";
                cargv[k++] = np;
                if (multi) {
                    snprintf(agent, sizeof(agent), "%s launch --relay=%d,%d,%d,%g,%s", self, restart,
                             o.nnodes, o.master_port, o.rdzv_timeout_s, o.master_addr);
                    cargv[k++] = "--host";
                    cargv[k++] = hosts;
                    cargv[k++] = "--mca";
                    cargv[k++] = "plm_rsh_agent";
                    cargv[k++] = agent;
                    cargv[k++] = "--mca"; // node 0 starts every daemon itself: each goes through its relay
                    cargv[k++] = "plm_rsh_no_tree_spawn";
                    cargv[k++] = "1";
                    // and the daemon stays the relayed command's child instead of daemonizing (which
                    // OpenMPI does without tree spawn): the launcher on its node then sees it end, and
                    // ending the command's process group cannot kill a daemon that is still starting
                    cargv[k++] = "--mca";
                    cargv[k++] = "orte_leave_session_attached";
                    cargv[k++] = "1";
                }
                if (o.nproc > sysconf(_SC_NPROCESSORS_ONLN))
                    cargv[k++] = "--oversubscribe";
                if (geteuid() == 0)
                    cargv[k++] = "--allow-run-as-root";
                cargv[k++] = "--bind-to";
                cargv[k++] = "none";
                cargv[k++] = exe;
                st.prog = mpirun;
            } else {
                cargv[k++] = "kiln";
                st.prog = exe;
            }
            cargv[k++] = "train";
            for (int a = 0; a < targc; a++)
                cargv[k++] = targv[a];
            if (restart > 0)
                cargv[k++] = "--resume=auto"; // a restart continues, whatever the first start asked for
        }
        cargv[k] = NULL;
        st.argv = cargv;

        // the ranks' store (env mode): a free port, found afresh for each start (by node 0 for all nodes)
        if (st.rank_env && !st.master_port && o.node_rank == 0 &&
            find_free_port(o.master_addr, &st.master_port, why, sizeof(why))) {
            kiln_errorf(
                &err, KILN_ERR_USAGE,
                "cannot find a free port on %s (kiln launch --master-addr): %s; pass a local address%s",
                o.master_addr, why, multi ? "" : ", or --master-port=P");
            if (multi)
                nodes_abort(&nodes, &err);
            rc = kiln_error_print(&err);
            break;
        }
        if (st.rank_env && multi) {
            snprintf(key, sizeof(key), "kiln/launch/%d/port", restart);
            if (o.node_rank == 0) {
                snprintf(port_s, sizeof(port_s), "%d", st.master_port);
                if (kiln_store_set(nodes.store, key, port_s, strlen(port_s), &nodes.err))
                    w = -1, nodes.lost = 1, nodes_lost_error(&nodes, &err);
            } else if (!(w = nodes_wait_key(&nodes, key, port_s, sizeof(port_s), &err))) {
                st.master_port = atoi(port_s);
            }
        }
        if (w < 0) { // the store is gone, or node 0 did not start this group
            rc = kiln_error_print(&err);
            break;
        }

        struct crash c = {.rank = -1};
        int g = w > 0 ? (c.rank = -2, c.status = KILN_ERR_RUNTIME << 8, 1) : run_group(&st, &c);
        if (g < 0) {
            rc = KILN_ERR_RUNTIME;
            if (!multi)
                break;
            g = 1, c.rank = -1, c.status = KILN_ERR_RUNTIME << 8; // the others must hear of it
        }
        if (multi && o.mode == MODE_MPIRUN && o.node_rank > 0 && w == 0) { // the relay's answer to mpirun
            char status_s[16];
            snprintf(key, sizeof(key), "kiln/launch/%d/exit/%d", restart, o.node_rank);
            snprintf(status_s, sizeof(status_s), "%d", g == 1 && c.rank == -2 ? 0 : c.status);
            if (kiln_store_set(nodes.store, key, status_s, strlen(status_s), &nodes.err))
                nodes.lost = 1;
        }
        if (multi && (g = nodes_end(&nodes, g, &c, o.grace_s, &err)) < 0) {
            rc = kiln_error_print(&err);
            break;
        }
        rc = exit_code_of(c.status);
        if (g == 0 || got_signal)
            break;
        if (c.rank >= 0)
            snprintf(who, sizeof(who), "rank %d of %d", c.rank, o.nproc * o.nnodes);
        else
            snprintf(who, sizeof(who), "%s", o.mode == MODE_MPIRUN ? "mpirun" : "kiln train");
        if (WIFEXITED(c.status) && rc == KILN_ERR_USAGE) {
            fprintf(stderr, "kiln launch: %s failed with a usage error (exit 2): not restarting\n", who);
            break;
        }
        char how[96];
        describe_status(c.status, how, sizeof(how));
        if (restart >= o.max_restarts) { // (launch's exit status is the child's)
            struct kiln_error e;
            kiln_errorf(&e, KILN_ERR_RUNTIME,
                        "%s %s (kiln launch): giving up after %d restart%s (--max-restarts=%d); %s", who, how,
                        restart, restart == 1 ? "" : "s", o.max_restarts,
                        restart ? "see the restarts in RUN/restarts.jsonl"
                                : "raise --max-restarts to restart it");
            kiln_error_print(&e);
            break;
        }
        double wait_s = o.backoff_s;
        for (int j = 0; j < restart && wait_s < o.backoff_max_s; j++)
            wait_s *= 2;
        if (wait_s > o.backoff_max_s)
            wait_s = o.backoff_max_s;
        long long step = newest_step(cfg.out);
        fprintf(stderr, "kiln launch: %s %s after %.1f s; restart %d/%d in %.1f s from step %lld\n", who, how,
                c.uptime_s, restart + 1, o.max_restarts, wait_s, step);
        if (o.node_rank == 0) // one line per restart of the job, not per node
            log_restart(cfg.out, restart + 1, &c, step, wait_s);
        for (double until = kiln_now_s() + wait_s; !got_signal && kiln_now_s() < until;) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (got_signal) {
            rc = KILN_EXIT_STOPPED;
            break;
        }
    }
    kiln_store_close(nodes.store);
    free(cargv), free(hosts), free(relayed), free(nodes.addr);
    return rc;
}
