// Noticing a rank that died. Under a bare mpirun a rank killed by a signal (SIGKILL from the OOM killer or
// an operator, a crash) ends with no line of kiln's: mpirun reaps it, reports it in its own words and kills
// the others, and the survivors, blocked in a collective with it, never learn why. But a survivor on the
// same machine can see that the peer's process is gone: every rank records who it is (its pid, the start
// time that tells its pid from a reused one, and the boot and pid namespace in which pids are comparable)
// when the world communicator opens, and the hang watchdog's thread looks at its same-machine peers on
// each poll. The lowest living rank on that machine reports the first one gone, in one line naming the
// rank, its pid and host, and the signal or exit status when the process is still a zombie (its parent has
// not reaped it yet: /proc then shows its status); otherwise only the parent (mpirun, or srun) knows it,
// and the line says so. Ranks on other machines cannot see the process: they learn of it from the
// transport or the launcher.
#ifndef KILN_COMM_PEERS_H
#define KILN_COMM_PEERS_H

#include <stddef.h>
#include <stdint.h>

// One process of the job, as every rank sees it.
struct kiln_peer {
    int32_t pid;
    uint64_t start_ticks; // /proc/PID/stat's starttime: a pid reused by another process has another
    char machine[64];     // boot id and pid namespace: pids are comparable where these are equal
    char host[64];        // for the message
};

// This process's record.
void kiln_peer_self(struct kiln_peer *me);

// Every rank's record (world of them, indexed by rank), from the world communicator's open; this process is
// rank. Later calls (communicators split from the world) change nothing.
void kiln_peers_set(int rank, int world, const struct kiln_peer *all);

// Forget the peers: the job is ending, and ranks leave at their own pace. NULL-safe, idempotent.
void kiln_peers_clear(void);

// A same-machine peer whose process is gone (or a zombie), reported once: returns 1 and writes what
// happened to out ("rank 1 (pid 123 on HOST) was killed by signal 9 (SIGKILL)", or "... died: its process
// is gone; ..." where the status is its parent's alone) when this rank is the one to say so (the lowest
// living rank on the machine), 2 when another living rank will, 0 when every peer it can see lives.
int kiln_peers_check(char *out, size_t cap);

#endif
