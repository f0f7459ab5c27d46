// The hang watchdog: a thread per rank that watches the flight recorder (parallel/comm/flight.h). When a collective
// has been pending, or the process has made no progress at all (no step begun, no collective issued or
// completed), for longer than the timeout, it writes DIR/rank-N.txt (the recorder, every thread's stack,
// the last log lines), tells the other ranks through DIR/fired-JOB (each then dumps too, at once), waits a
// little for their dumps, and ends the job (kiln_comm_abort_all): a hang becomes a report and a non-zero
// exit, which kiln launch or Slurm can restart.
//
// There is one watchdog per process (signal handlers need a fixed place to find it).
#ifndef KILN_COMM_WATCHDOG_H
#define KILN_COMM_WATCHDOG_H

#include <stdint.h>

#include "util/error.h"

// The exit status of a job the watchdog ended (EX_SOFTWARE): a failure, so launchers restart it.
#define KILN_EXIT_HANG 70
// The exit status of a job the watchdog ended because a rank on its machine died (parallel/comm/peers.h):
// a failure too.
#define KILN_EXIT_PEER_GONE 1

struct kiln_watchdog_opts {
    const char *dir; // where rank-N.txt goes: RUN/hang, or ./kiln-hang without a run directory
    int rank, world;
    double timeout_s; // no progress for this long is a hang; 0: never (SIGUSR2 dumps still work)
    uint64_t job;     // the same on every rank (rank 0's, broadcast): tells this job's dumps from older ones
};

int kiln_watchdog_start(const struct kiln_watchdog_opts *o, struct kiln_error *err);
void kiln_watchdog_stop(void); // NULL-safe: nothing when it was not started
// Asks the watchdog for a dump (DIR/rank-N-usr2.txt) without stopping anything. Async-signal-safe: the
// SIGUSR2 handler of cmd/train.c calls it.
void kiln_watchdog_request_dump(void);
// Asks the watchdog to look at once (a dead peer: parallel/comm/peers.h). Async-signal-safe: a launcher
// that reaped a dead rank sends the others SIGTERM, and then SIGKILL soon after; the stop handler of
// cmd/train.c calls it so that the line naming the dead rank comes out first.
void kiln_watchdog_poke(void);

// Writes a dump to path now (tmp + rename). trigger: "self", "peer", "stopped" (this rank did not run for
// longer than the timeout, and the others gave up on it meanwhile) or "usr2".
int kiln_watchdog_write_dump(const char *path, const char *trigger, const char *reason,
                             struct kiln_error *err);

#endif
