// kiln launch: supervises kiln train, restarting it from the newest complete checkpoint after a crash.
//
//   kiln launch [--max-restarts=N] [--backoff=S] [--backoff-max=S] -- TRAIN-OPTIONS...
//
// The child is /proc/self/exe train TRAIN-OPTIONS (restarts add --resume=auto), in its own process group so
// that a terminal's Ctrl-C reaches it once, through launch. SIGTERM, SIGINT and SIGUSR1 are forwarded; the
// child saves a checkpoint and exits 75, and launch exits 75 too. A child that exits 0 ends launch with 0;
// a usage error (2) is not retried; any other exit status or death by a signal is a crash: launch waits
// backoff * 2^(k-1) seconds (at most backoff-max) and restarts it, up to max-restarts times, and appends one
// line per restart to RUN/restarts.jsonl. When it gives up it exits with the child's last status (128 +
// signal for a signal).
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "train/trainer.h"
#include "util/progress.h"

static volatile sig_atomic_t child_pid = 0;
static volatile sig_atomic_t got_signal = 0;

static void on_signal(int sig) {
    got_signal = sig;
    if (child_pid > 0)
        kill((pid_t)child_pid, sig);
}

struct launch_opts {
    int max_restarts;
    double backoff_s, backoff_max_s;
};

static int usage_error(const char *msg, const char *arg) {
    fprintf(stderr,
            "error: %s '%s' (kiln launch): usage: kiln launch [--max-restarts=N] [--backoff=S] "
            "[--backoff-max=S] -- TRAIN-OPTIONS...\n",
            msg, arg);
    return KILN_ERR_USAGE;
}

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

static void print_help(void) {
    printf("kiln launch [--max-restarts=N] [--backoff=S] [--backoff-max=S] -- TRAIN-OPTIONS...\n\n"
           "Runs kiln train TRAIN-OPTIONS (which must include --out=RUN) and restarts it from the newest "
           "complete\n"
           "checkpoint when it crashes. Each restart is logged in RUN/restarts.jsonl.\n"
           "  --max-restarts=N  restarts before giving up (default 3)\n"
           "  --backoff=S       seconds before the first restart, doubling each time (default 5)\n"
           "  --backoff-max=S   longest wait between restarts (default 300)\n"
           "SIGTERM, SIGINT and SIGUSR1 are forwarded: kiln train checkpoints and exits 75, and so does "
           "launch.\n");
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

static void log_restart(const char *run, int restart, int status, double uptime_s, long long step,
                        double wait_s) {
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
    if (WIFSIGNALED(status))
        fprintf(f, "\"signal\":%d,\"signal_name\":\"SIG%s\",", WTERMSIG(status),
                sigabbrev_np(WTERMSIG(status)));
    else
        fprintf(f, "\"exit_status\":%d,", WEXITSTATUS(status));
    fprintf(f, "\"uptime_s\":%.3f,\"resume_step\":%lld,\"backoff_s\":%.3f}\n", uptime_s, step, wait_s);
    fclose(f);
}

static pid_t spawn(char **argv) {
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);                    // terminal signals reach the child once, via launch
        prctl(PR_SET_PDEATHSIG, SIGTERM); // and it checkpoints and stops if launch dies
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGUSR1, SIG_DFL);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "error: cannot run /proc/self/exe (kiln launch): %s\n", strerror(errno));
        _exit(127);
    }
    return pid;
}

static int exit_code_of(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int cmd_launch(int argc, char **argv) {
    struct launch_opts o = {.max_restarts = 3, .backoff_s = 5, .backoff_max_s = 300};
    int i = 0;
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        double v;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help();
            return 0;
        }
        if ((r = parse_number(argv[i], "--max-restarts", 0, 1e6, &v)) <= 0) {
            if (r < 0 || v != (int)v)
                return usage_error("bad value: expected a whole number 0..1e6", argv[i]);
            o.max_restarts = (int)v;
        } else if ((r = parse_number(argv[i], "--backoff", 0, 86400, &v)) <= 0) {
            if (r < 0)
                return usage_error("bad value: expected seconds 0..86400", argv[i]);
            o.backoff_s = v;
        } else if ((r = parse_number(argv[i], "--backoff-max", 0, 86400, &v)) <= 0) {
            if (r < 0)
                return usage_error("bad value: expected seconds 0..86400", argv[i]);
            o.backoff_max_s = v;
        } else {
            return usage_error("unknown option (train options go after --)", argv[i]);
        }
    }
    if (i == argc)
        return usage_error("missing -- before the train options", i ? argv[i - 1] : "");
    int targc = argc - i - 1;
    char **targv = argv + i + 1;
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

    // child argv: kiln train OPTIONS... [--resume=auto] NULL
    char **cargv = calloc((size_t)targc + 4, sizeof(char *));
    if (!cargv)
        return KILN_ERR_RUNTIME;
    cargv[0] = "kiln";
    cargv[1] = "train";
    for (int k = 0; k < targc; k++)
        cargv[2 + k] = targv[k];
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
            cargv[2 + targc] = "--resume=auto"; // a restart continues, whatever the first start asked for
        double t0 = kiln_now_s();
        pid_t pid = spawn(cargv);
        if (pid < 0) {
            fprintf(stderr, "error: cannot fork (kiln launch): %s\n", strerror(errno));
            rc = KILN_ERR_RUNTIME;
            break;
        }
        child_pid = pid;
        if (got_signal) // arrived between fork and child_pid being set
            kill(pid, got_signal);
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        child_pid = 0;
        double uptime = kiln_now_s() - t0;
        rc = exit_code_of(status);
        if (rc == 0 || got_signal)
            break;
        if (WIFEXITED(status) && rc == KILN_ERR_USAGE) {
            fprintf(stderr, "kiln launch: kiln train failed with a usage error (exit 2): not restarting\n");
            break;
        }
        char how[96];
        if (WIFSIGNALED(status))
            snprintf(how, sizeof(how), "was killed by signal %d (SIG%s)", WTERMSIG(status),
                     sigabbrev_np(WTERMSIG(status)));
        else
            snprintf(how, sizeof(how), "exited with status %d", rc);
        if (restart >= o.max_restarts) {
            fprintf(stderr, "kiln launch: kiln train %s; giving up after %d restart%s (--max-restarts=%d)\n",
                    how, restart, restart == 1 ? "" : "s", o.max_restarts);
            break;
        }
        double wait_s = o.backoff_s;
        for (int k = 0; k < restart && wait_s < o.backoff_max_s; k++)
            wait_s *= 2;
        if (wait_s > o.backoff_max_s)
            wait_s = o.backoff_max_s;
        long long step = newest_step(cfg.out);
        fprintf(stderr, "kiln launch: kiln train %s after %.1f s; restart %d/%d in %.1f s from step %lld\n",
                how, uptime, restart + 1, o.max_restarts, wait_s, step);
        log_restart(cfg.out, restart + 1, status, uptime, step, wait_s);
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
