// The flight recorder: every collective this process issues, in a fixed ring of the newest
// KILN_FLIGHT_SLOTS, with the trainer's step and layer at the time, when it was issued and when the host saw
// it complete. kiln_comm_submit/wait/wait_stream (comm.c) fill it; the watchdog (parallel/comm/watchdog.h) reads it
// to find a hang and writes it into RUN/hang/rank-N.txt; `kiln doctor` reads those files back.
//
// Writers never lock: a slot is claimed with one atomic add and published with a generation number, so that
// a reader copying a slot that is being overwritten sees the generation change and skips it.
//
// rank-N.txt (docs/operations.md), a header of key=value lines, then sections:
//   kiln-hang-dump 1
//   key=value ...                       (rank, world, host, pid, job, step, layer, reason, stack_top, ...)
//   [comms]   id name rank size         one line per communicator
//   [records] seq comm op dtype bytes step layer issued_ago_s done_ago_s   (oldest first; done "-" = pending)
//   [stacks]  "thread TID NAME" then one line per frame, indented
//   [log]     the last lines kiln printed
//   [end]
#ifndef KILN_COMM_FLIGHT_H
#define KILN_COMM_FLIGHT_H

#include <stdint.h>
#include <stdio.h>

#include "util/error.h"

#define KILN_FLIGHT_SLOTS 1024
#define KILN_FLIGHT_OP_SPLIT 100 // kiln_comm_split/dup: collective over the parent too ("split")

// One recorded collective (a copy; the ring itself is private to flight.c).
struct kiln_flight_rec {
    uint64_t seq;   // 1-based, per communicator: the n-th operation issued on it
    int comm;       // the communicator's id (kiln_flight_comm_register), the same on every rank
    int op;         // enum kiln_coll_op, or KILN_FLIGHT_OP_SPLIT
    int dtype;      // enum kiln_dtype
    uint64_t bytes; // count * dtype size, as the caller passed it (the same on every rank for collectives)
    int64_t step;   // the trainer's step (1-based) when issued; 0 before the first
    int layer;      // the model layer whose hook issued it; -1 outside the layers
    double t_issue; // monotonic seconds (kiln_now_s)
    double t_done;  // 0 while pending
    double t_wait;  // when the host began to wait for it (kiln_comm_wait); 0: not waited for (yet)
};

// ---- recording (hot path: no locks, no allocation) ----
// Claims a slot for a collective and returns its token (for kiln_flight_done).
uint64_t kiln_flight_issue(int comm, uint64_t seq, int op, int dtype, uint64_t bytes);
// The host saw the operation of token complete (a no-op when its slot was reused since).
void kiln_flight_done(uint64_t token);
// The host began to wait for the operation of token (one issued and left running is not waited for until then).
void kiln_flight_waiting(uint64_t token);
void kiln_flight_set_step(int64_t step); // the trainer, at the start of each step (1-based)
void kiln_flight_set_layer(int layer);   // the model hooks (parallel/dp.c); -1 outside the layers
int64_t kiln_flight_step(void);
int kiln_flight_layer(void);
// Monotonic time of the last step change, issue or completion: the watchdog's measure of progress.
double kiln_flight_last_progress(void);

// ---- communicators: ids are given in creation order, so they agree across ranks ----
int kiln_flight_comm_register(const char *name, int rank, int size); // returns the new id

// ---- reading ----
// Copies the ring's records, oldest first, into out (cap >= KILN_FLIGHT_SLOTS for all); returns how many.
int kiln_flight_snapshot(struct kiln_flight_rec *out, int cap);
// The oldest issued-and-pending record: 1 with *rec filled, or 0 when nothing is pending.
int kiln_flight_oldest_pending(struct kiln_flight_rec *rec);
// Writes the [comms] and [records] sections (times as ages against now).
void kiln_flight_write_records(FILE *f, double now);
// Forgets everything (tests).
void kiln_flight_reset(void);

// ---- the dump files, parsed back (kiln doctor, tests) ----
struct kiln_hang_dump {
    char path[1024];
    int rank, world, pid;
    char host[128], job[32], reason[512], trigger[16], stack_top[256];
    int64_t step;
    int layer;
    double hang_timeout_s, mono_now;
    double stopped_s, stopped_ended_ago_s; // the longest time this rank did not run (stopped, frozen), and
                                           // how long before the dump that ended (0 0: never)
    struct kiln_flight_rec *recs; // oldest first
    int n_recs;
    char comm_names[16][48]; // by id (the first 16)
    int n_comms;
};
// Reads a rank-N.txt. A file that is not a dump, or is cut short, is an error naming the file and line.
int kiln_hang_dump_read(const char *path, struct kiln_hang_dump *d, struct kiln_error *err);
void kiln_hang_dump_free(struct kiln_hang_dump *d);
// kiln doctor's diagnosis of one job's dumps (one per rank, any order), in a few lines on out:
//   - a rank that did not run (stopped or frozen) while the others waited for it: named first, and its dump,
//     written once it was woken, read as it stood when it stopped (what it did after is left out);
//   - ranks without a dump, when those that dumped all wait in one collective: the likely cause;
//   - per communicator, the lowest collective #k that some ranks issued and others did not: the ranks that
//     never entered it (their step, layer, pending collective, stack top) and the ranks waiting in it;
//   - collectives of the same number on the same communicator that differ in op or bytes across ranks
//     ("mismatch"; send/recv pairs excepted), the usual cause of a silent NCCL hang.
// Returns how many findings it printed (stalled groups and mismatches).
int kiln_hang_diagnose(const struct kiln_hang_dump *d, int n, FILE *out);
// "all_reduce" -> KILN_COLL_ALL_REDUCE, -1 if unknown; dtype names likewise (kiln_dtype_name's).
const char *kiln_flight_op_name(int op); // kiln_coll_name's, and "split"
int kiln_flight_op_from_name(const char *s);
int kiln_flight_dtype_from_name(const char *s);

#endif
