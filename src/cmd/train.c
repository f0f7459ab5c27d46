// kiln train: parse options, train, report. SIGTERM, SIGINT and SIGUSR1 (Slurm's pre-emption warning) finish
// the current step, save a checkpoint and exit with KILN_EXIT_STOPPED (75). A SIGINT after any of them, or a
// SIGTERM a second or more after it, exits at once (128 + the signal): a rank stuck in a hang never reaches
// the end of its step, and `timeout -k`, Slurm and a dying kiln launch follow their first signal with
// another. SIGUSR2 dumps the flight recorder and every thread's stack (RUN/hang/rank-N-usr2.txt) and goes on.
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/watchdog.h"
#include "run/trainer.h"
#include "util/progress.h"

static volatile sig_atomic_t n_stop_signals = 0;
static double first_stop_s; // when the first stop signal came (kiln_now_s: clock_gettime, async-signal-safe)

// A second SIGINT exits at once; so does a SIGTERM a second or more after the first stop signal. One
// within the second is the same request twice (Slurm signals every process of a step, and kiln launch
// forwards its own copy), and the checkpoint goes on.
static void on_stop_signal(int sig) {
    if (n_stop_signals && (sig == SIGINT || (sig == SIGTERM && kiln_now_s() - first_stop_s >= 1.0))) {
        static const char int_msg[] = "\nkiln: second SIGINT: exiting now, without a checkpoint\n";
        static const char term_msg[] = "\nkiln: second SIGTERM: exiting now, without a checkpoint\n";
        ssize_t w =
            sig == SIGINT ? write(2, int_msg, sizeof(int_msg) - 1) : write(2, term_msg, sizeof(term_msg) - 1);
        (void)w;
        _exit(128 + sig);
    }
    if (!n_stop_signals++)
        first_stop_s = kiln_now_s();
    kiln_watchdog_poke(); // (mpirun's SIGTERM after a rank died: the watchdog names it)
    if (!kiln_train_request_stop(sig)) {
        // still starting: no step to finish, and a read may block for good (a FIFO, a hung mount) where
        // nothing would ever look at the request; nothing was trained since the newest checkpoint
        static const char tail[] =
            " before the first step: exiting now; nothing was trained since the newest "
            "checkpoint, and the same command continues (exit 75)\n";
        const char *name = sig == SIGTERM  ? "\nkiln: SIGTERM"
                           : sig == SIGINT ? "\nkiln: SIGINT"
                                           : "\nkiln: SIGUSR1";
        ssize_t w = write(2, name, strlen(name)); // (strlen is async-signal-safe since POSIX.1-2016)
        w = write(2, tail, sizeof(tail) - 1);
        (void)w;
        _exit(KILN_EXIT_STOPPED);
    }
}

static void on_dump_signal(int sig) {
    (void)sig;
    kiln_watchdog_request_dump();
}

static void install_stop_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_dump_signal;
    sigaction(SIGUSR2, &sa, NULL);
}

static const char *signal_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

int cmd_train(int argc, char **argv, const struct kiln_knobs *knobs) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            char *h[] = {"train"};
            return cmd_help(1, h, knobs);
        }
    struct kiln_config cfg;
    struct kiln_error err = {0};
    if (kiln_config_parse(&cfg, argc, argv, &err))
        return kiln_error_print(&err);
    install_stop_handlers();
    struct kiln_train_result res;
    if (kiln_train(&cfg, knobs, &res, &err)) {
        if (res.world <= 1)
            return kiln_error_print(&err);
        // every rank's errors reach stderr, prefixed with its rank; then the whole job ends, so that no other
        // rank waits forever in a collective this one will never join
        if (!res.quiet_error)
            fprintf(stderr, "[rank %d] error: %s\n", res.rank, err.msg);
        if (res.abort_job)
            kiln_comm_abort_job(err.code);
        kiln_train_end_job();
        return err.code;
    }
    if (res.world > 1 && res.rank != 0)
        return res.stop_signal ? KILN_EXIT_STOPPED : 0; // rank 0 reports for the job
    if (res.stop_signal) {
        fprintf(stderr, "kiln: stopped by %s after step %d", signal_name(res.stop_signal), res.steps);
        if (cfg.out[0])
            fprintf(stderr, "; checkpoint saved in %s/ckpt: the same command resumes", cfg.out);
        fprintf(stderr, " (exit %d)\n", KILN_EXIT_STOPPED);
        return KILN_EXIT_STOPPED;
    }
    if (!cfg.quiet) {
        fprintf(stderr, "kiln: done: %d steps, train loss %.4f", res.steps, res.final_loss);
        if (!isnan(res.final_val_loss))
            fprintf(stderr, ", val loss %.4f", res.final_val_loss);
        fprintf(stderr, ", %.0f tok/s", res.tokens_per_s);
        if (res.skipped_steps)
            fprintf(stderr, ", %d steps skipped", res.skipped_steps);
        if (res.checkpoints)
            fprintf(stderr, ", %d checkpoints (longest stall %.1f ms)", res.checkpoints,
                    res.max_ckpt_stall_ms);
        fprintf(stderr, "%s%s\n", cfg.out[0] ? ", run in " : "", cfg.out);
    }
    return 0;
}
