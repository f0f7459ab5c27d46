// kiln launch: runs kiln train, one process or a group of local ranks, and restarts it from the newest
// complete checkpoint after a crash.
//
//   kiln launch [--nproc-per-node=N] [--mode=auto|env|mpirun] [--master-addr=ADDR] [--master-port=P]
//               [--grace=S] [--max-restarts=N] [--backoff=S] [--backoff-max=S] -- TRAIN-OPTIONS...
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
// save a checkpoint and exit 75, and launch exits 75 too. When every child exits 0, launch exits 0. A child
// that exits with another status or dies by a signal has crashed; in env mode launch then sends SIGTERM to
// the other ranks, SIGKILL to the whole process group after --grace seconds (default 10), reaps every rank
// and kills whatever the ranks left behind in the group, so that no process outlives the group. A usage error
// (2) is not retried; after any other crash launch waits backoff * 2^(k-1) seconds (at most backoff-max) and
// restarts the whole group, up to max-restarts times, and appends one line per restart to RUN/restarts.jsonl,
// naming in env mode the rank that failed first. When it gives up it exits with that child's status (128 +
// signal for a signal).
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

#include "backend/backend.h"
#include "cmd/cmd.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "train/trainer.h"
#include "util/progress.h"

#define LAUNCH_MAX_NPROC 1024

// The running children (0 once one has exited), for on_signal to forward to.
static volatile sig_atomic_t child_pids[LAUNCH_MAX_NPROC];
static volatile sig_atomic_t n_children = 0;
static volatile sig_atomic_t got_signal = 0;

static void on_signal(int sig) {
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
    int nproc; // ranks on this node
    enum launch_mode mode;
    const char *master_addr; // env mode: MASTER_ADDR
    int master_port;         // env mode: MASTER_PORT, 0 = a free one for each start
    double grace_s;          // env mode: SIGTERM to SIGKILL when the group is stopped
};

static int usage_error(const char *msg, const char *arg) {
    fprintf(stderr,
            "error: %s '%s' (kiln launch): usage: kiln launch [--nproc-per-node=N] [--mode=auto|env|mpirun] "
            "[--master-addr=ADDR] [--master-port=P] [--grace=S] [--max-restarts=N] [--backoff=S] "
            "[--backoff-max=S] -- TRAIN-OPTIONS...\n",
            msg, arg);
    return KILN_ERR_USAGE;
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
        "kiln launch [--nproc-per-node=N] [--mode=auto|env|mpirun] [--master-addr=ADDR] [--master-port=P]\n"
        "            [--grace=S] [--max-restarts=N] [--backoff=S] [--backoff-max=S] -- TRAIN-OPTIONS...\n\n"
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
        "  --master-addr=ADDR  where rank 0 serves the rendezvous store (default 127.0.0.1)\n"
        "  --master-port=P     its port (default: a free one, found for each start)\n"
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
        fprintf(stderr, "kiln launch: cannot append to %s: %s\n", path, strerror(errno));
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
    const char *master_addr;
    int master_port;
    double grace_s;
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
        fprintf(stderr, "error: cannot run %s (kiln launch): %s\n", prog, strerror(errno));
        _exit(127);
    }
    if (pid > 0)
        setpgid(pid, pgid ? pgid : pid); // in the parent too, so the group exists before the next fork
    return pid;
}

static void set_rank_env(const struct start *s, int rank) {
    char v[32];
    snprintf(v, sizeof(v), "%d", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof(v), "%d", s->nchild);
    setenv("WORLD_SIZE", v, 1);
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
// group's status (0, or a stop's 75) when no child failed, 1 with *c filled when one did (the first one), or
// -1 when a fork failed (after stopping what had started).
static int run_group(const struct start *s, struct crash *c) {
    pid_t *pids = calloc((size_t)s->nchild, sizeof(pid_t));
    int *done = calloc((size_t)s->nchild, sizeof(int)), *status = calloc((size_t)s->nchild, sizeof(int));
    if (!pids || !done || !status) {
        free(pids), free(done), free(status);
        fprintf(stderr, "error: out of memory (kiln launch)\n");
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
            fprintf(stderr, "error: cannot fork rank %d (kiln launch): %s\n", r, strerror(errno));
            for (int k = r; k < s->nchild; k++)
                done[k] = 1;
            kill_live(pids, done, r, SIGKILL);
            rc = -1;
            break;
        }
        if (!pgid)
            pgid = pids[0];
    }

    // Poll every few ms: a rank is looked at without being reaped (has_exited), and the first to fail brings
    // the others down: SIGTERM now, SIGKILL to the process group after the grace period.
    double kill_at = -1;
    int killed = 0;
    while (live > 0) {
        for (int r = 0; r < s->nchild; r++) {
            if (done[r] || !has_exited(pids[r], &status[r]))
                continue;
            done[r] = 1;
            child_pids[r] = 0;
            live--;
            int st = status[r];
            int stopped = WIFEXITED(st) && WEXITSTATUS(st) == KILN_EXIT_STOPPED && got_signal;
            if (st == 0 || stopped || failed >= 0 || rc < 0)
                continue;
            failed = r;
            c->rank = s->rank_env ? r : -1;
            c->status = st;
            c->uptime_s = kiln_now_s() - t0;
            if (live > 0) {
                char how[96];
                describe_status(st, how, sizeof(how));
                fprintf(stderr,
                        "kiln launch: rank %d %s; stopping the other %d rank%s (SIGTERM, then SIGKILL after "
                        "%g s)\n",
                        r, how, live, live == 1 ? "" : "s", s->grace_s);
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
                return usage_error("bad value: expected a whole number 0..1e6", argv[i]);
            o->max_restarts = (int)v;
        } else if ((r = parse_number(argv[i], "--backoff", 0, 86400, &v)) <= 0) {
            if (r < 0)
                return usage_error("bad value: expected seconds 0..86400", argv[i]);
            o->backoff_s = v;
        } else if ((r = parse_number(argv[i], "--backoff-max", 0, 86400, &v)) <= 0) {
            if (r < 0)
                return usage_error("bad value: expected seconds 0..86400", argv[i]);
            o->backoff_max_s = v;
        } else if ((r = parse_number(argv[i], "--nproc-per-node", 1, LAUNCH_MAX_NPROC, &v)) <= 0) {
            if (r < 0 || v != (int)v)
                return usage_error("bad value: expected a whole number 1..1024", argv[i]);
            o->nproc = (int)v;
        } else if ((r = parse_number(argv[i], "--master-port", 1, 65535, &v)) <= 0) {
            if (r < 0 || v != (int)v)
                return usage_error("bad value: expected a port 1..65535", argv[i]);
            o->master_port = (int)v;
        } else if ((r = parse_number(argv[i], "--grace", 0, 86400, &v)) <= 0) {
            if (r < 0)
                return usage_error("bad value: expected seconds 0..86400", argv[i]);
            o->grace_s = v;
        } else if (!parse_string(argv[i], "--master-addr", &s)) {
            if (!*s || strlen(s) > 255)
                return usage_error("bad value: expected a host name or IP address", argv[i]);
            o->master_addr = s;
        } else if (!parse_string(argv[i], "--mode", &s)) {
            if (!strcmp(s, "auto"))
                o->mode = MODE_AUTO;
            else if (!strcmp(s, "env"))
                o->mode = MODE_ENV;
            else if (!strcmp(s, "mpirun"))
                o->mode = MODE_MPIRUN;
            else
                return usage_error("bad value: expected auto, env or mpirun", argv[i]);
        } else {
            return usage_error("unknown option (train options go after --)", argv[i]);
        }
    }
    if (i == argc)
        return usage_error("missing -- before the train options", i ? argv[i - 1] : "");
    *consumed = i + 1;
    return 0;
}

int cmd_launch(int argc, char **argv) {
    struct launch_opts o = {.max_restarts = 3,
                            .backoff_s = 5,
                            .backoff_max_s = 300,
                            .nproc = 1,
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
        fprintf(stderr,
                "error: kiln launch needs --out=RUN among the train options: the run directory holds the "
                "checkpoints it restarts from\n");
        return KILN_ERR_USAGE;
    }

    const char *mode_flag = o.mode == MODE_AUTO  ? "--mode=auto"
                            : o.mode == MODE_ENV ? "--mode=env"
                                                 : "--mode=mpirun";
    if (o.mode == MODE_AUTO)
        o.mode = o.nproc == 1                                      ? MODE_SINGLE
                 : strcmp(kiln_backend_resolve(cfg.device), "cpu") ? MODE_ENV
                                                                   : MODE_MPIRUN;
    char exe[PATH_MAX], mpirun[PATH_MAX], why[PATH_MAX + 64];
    const char *hook = getenv("KILN_LAUNCH_EXE");
    if (hook && *hook) {
        if (access(hook, X_OK)) {
            fprintf(stderr, "error: cannot run KILN_LAUNCH_EXE=%s (kiln launch): %s; unset it to run kiln\n",
                    hook, strerror(errno));
            return KILN_ERR_USAGE;
        }
        snprintf(exe, sizeof(exe), "%s", hook);
    } else if (o.mode == MODE_MPIRUN) { // mpirun's ranks cannot use /proc/self/exe: it would be mpirun's
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n <= 0) {
            fprintf(stderr, "error: cannot read /proc/self/exe (kiln launch): %s\n", strerror(errno));
            return KILN_ERR_RUNTIME;
        }
        exe[n] = 0;
    } else {
        snprintf(exe, sizeof(exe), "/proc/self/exe");
    }
    if (o.mode == MODE_MPIRUN && find_mpirun(mpirun, sizeof(mpirun), why, sizeof(why))) {
        fprintf(stderr,
                "error: mpirun not found (kiln launch %s%s): %s; install openmpi-bin, or use --mode=env\n",
                mode_flag, !strcmp(mode_flag, "--mode=auto") ? ", CPU ranks start through MPI" : "", why);
        return KILN_ERR_USAGE;
    }

    // argv: [mpirun -np N [--oversubscribe] [--allow-run-as-root] --bind-to none] EXE train OPTIONS...
    //       [--resume=auto] NULL
    char **cargv = calloc((size_t)targc + 16, sizeof(char *));
    if (!cargv)
        return KILN_ERR_RUNTIME;
    int k = 0;
    char np[16];
    snprintf(np, sizeof(np), "%d", o.nproc);
    if (o.mode == MODE_MPIRUN) {
        cargv[k++] = "mpirun";
        cargv[k++] = "-np";
        cargv[k++] = np;
        if (o.nproc > sysconf(_SC_NPROCESSORS_ONLN))
            cargv[k++] = "--oversubscribe";
        if (geteuid() == 0)
            cargv[k++] = "--allow-run-as-root";
        cargv[k++] = "--bind-to";
        cargv[k++] = "none";
        cargv[k++] = exe;
    } else {
        cargv[k++] = "kiln";
    }
    cargv[k++] = "train";
    for (int a = 0; a < targc; a++)
        cargv[k++] = targv[a];
    int resume_slot = k;

    struct start st = {.prog = o.mode == MODE_MPIRUN ? mpirun : exe,
                       .argv = cargv,
                       .nchild = o.mode == MODE_ENV ? o.nproc : 1,
                       .rank_env = o.mode == MODE_ENV,
                       .master_addr = o.master_addr,
                       .grace_s = o.grace_s};
    char who[64];
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    int rc = 0;
    for (int restart = 0;; restart++) {
        if (restart > 0)
            cargv[resume_slot] = "--resume=auto"; // a restart continues, whatever the first start asked for
        st.master_port = o.master_port;
        if (st.rank_env && !st.master_port &&
            find_free_port(o.master_addr, &st.master_port, why, sizeof(why))) {
            fprintf(
                stderr,
                "error: cannot find a free port on %s (kiln launch --master-addr): %s; pass a local address, "
                "or --master-port=P\n",
                o.master_addr, why);
            rc = KILN_ERR_USAGE;
            break;
        }
        struct crash c = {.rank = -1};
        int g = run_group(&st, &c);
        if (g < 0) {
            rc = KILN_ERR_RUNTIME;
            break;
        }
        rc = exit_code_of(c.status);
        if (g == 0 || got_signal)
            break;
        if (c.rank >= 0)
            snprintf(who, sizeof(who), "rank %d of %d", c.rank, o.nproc);
        else
            snprintf(who, sizeof(who), "%s", o.mode == MODE_MPIRUN ? "mpirun" : "kiln train");
        if (WIFEXITED(c.status) && rc == KILN_ERR_USAGE) {
            fprintf(stderr, "kiln launch: %s failed with a usage error (exit 2): not restarting\n", who);
            break;
        }
        char how[96];
        describe_status(c.status, how, sizeof(how));
        if (restart >= o.max_restarts) {
            fprintf(stderr, "kiln launch: %s %s; giving up after %d restart%s (--max-restarts=%d)\n", who,
                    how, restart, restart == 1 ? "" : "s", o.max_restarts);
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
    free(cargv);
    return rc;
}
