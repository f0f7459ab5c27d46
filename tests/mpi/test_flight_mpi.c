// The flight recorder under mpirun (ctest runs this at 2, 3 and 4 ranks; label mpi): communicator ids and
// sequence numbers agree across ranks, an operation is pending until the host waits for it (and a wait
// completes the older ones too), and every rank's dump reads back into a diagnosis of no hang and no
// mismatch. Prints "N passed, N failed" on rank 0; the exit status is the failures'.
//
// `test_flight_mpi --mismatch DIR` is the fault for tests/cli/test_hang_mpi.sh: after one good all-reduce,
// rank 1 issues a barrier where the others issue an all-reduce. MPI matches the two never, so every rank
// waits; the watchdog (2 s) dumps into DIR and ends the job with exit 70, and `kiln doctor DIR` must name the
// mismatch.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm/comm.h"
#include "parallel/comm/env.h"
#include "parallel/comm/flight.h"
#include "parallel/comm/watchdog.h"

static int passed, failed, rank;

static void check(int ok, const char *what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "[rank %d] FAIL: %s\n", rank, what);
    }
}

static int mismatch(struct kiln_comm *c, const char *dir) {
    struct kiln_error err = {0};
    struct kiln_watchdog_opts o = {.dir = dir, .rank = c->rank, .world = c->size, .timeout_s = 2, .job = 42};
    if (kiln_watchdog_start(&o, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    float x[4] = {1, 2, 3, 4};
    kiln_comm_all_reduce_host(c, x, 4, KILN_F32, KILN_RED_SUM);
    if (c->rank == 1)
        kiln_comm_barrier(c); // the others all-reduce: a mismatch, which MPI never matches up
    else
        kiln_comm_all_reduce_host(c, x, 4, KILN_F32, KILN_RED_SUM);
    fprintf(stderr, "[rank %d] the mismatched collective completed: the watchdog had nothing to catch\n",
            c->rank);
    return 3;
}

// The records of comm id `comm` in this process's recorder, oldest first.
static int records_of(int comm, struct kiln_flight_rec *out, int cap) {
    static struct kiln_flight_rec all[KILN_FLIGHT_SLOTS];
    int n = kiln_flight_snapshot(all, KILN_FLIGHT_SLOTS), k = 0;
    for (int i = 0; i < n && k < cap; i++)
        if (all[i].comm == comm)
            out[k++] = all[i];
    return k;
}

int main(int argc, char **argv) {
    struct kiln_dist_env env;
    struct kiln_error err = {0};
    if (kiln_dist_env_read(&env, NULL, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    rank = env.rank;
    struct kiln_comm *c, *dup, *sub;
    struct kiln_comm_open_opts o = {.kind = KILN_COMM_MPI, .timeout_s = 30};
    if (kiln_comm_open_world(&env, &o, &c, &err) || kiln_comm_dup(c, &dup, &err) ||
        kiln_comm_split(c, env.rank % 2, env.rank, &sub, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    if (argc == 3 && !strcmp(argv[1], "--mismatch"))
        return mismatch(c, argv[2]);

    // ids: creation order, the same on every rank
    check(c->id < dup->id && dup->id < sub->id, "communicator ids follow creation order");
    int ids[3] = {c->id, dup->id, sub->id}, *all_ids = calloc((size_t)env.world * 3, sizeof(int));
    kiln_comm_all_gather_host(c, ids, all_ids, sizeof(ids));
    int same = 1;
    for (int r = 0; r < env.world; r++)
        same &= !memcmp(&all_ids[3 * r], ids, sizeof(ids));
    check(same, "every rank gives its communicators the same ids");
    free(all_ids);

    // operations on the world and its duplicate, interleaved; one pending until waited
    kiln_flight_set_step(7);
    kiln_flight_set_layer(3);
    double x[5] = {1, 2, 3, 4, 5}, y = 1;
    struct kiln_coll kx = {.op = KILN_COLL_ALL_REDUCE, .send = x, .recv = x, .count = 5, .dtype = KILN_F64};
    struct kiln_coll ky = {.op = KILN_COLL_ALL_REDUCE, .send = &y, .recv = &y, .count = 1, .dtype = KILN_F64};
    struct kiln_comm_work *w1 = kiln_comm_submit(c, &kx, NULL), *w2 = kiln_comm_submit(c, &kx, NULL);
    kiln_comm_wait(dup, kiln_comm_submit(dup, &ky, NULL));
    struct kiln_flight_rec p;
    check(kiln_flight_oldest_pending(&p) && p.comm == c->id && p.seq == c->seq - 1 && p.bytes == 40 &&
              p.step == 7 && p.layer == 3,
          "an operation is pending, with its step, layer and bytes, until the host waits");
    kiln_comm_wait(c, w2); // completes w1 too: one communicator's operations complete in order
    check(!kiln_flight_oldest_pending(&p), "a wait completes the older operations of its communicator");
    kiln_comm_wait(c, w1); // (already complete)
    kiln_flight_set_layer(-1);

    // sequence numbers: 1, 2, ... on each communicator, and the same operations on every rank
    struct kiln_flight_rec recs[64];
    int n = records_of(c->id, recs, 64), contiguous = n > 0;
    for (int i = 0; i < n; i++)
        contiguous &= recs[i].seq == (uint64_t)i + 1 && recs[i].t_done > 0;
    check(contiguous && recs[n - 1].seq == c->seq, "the world's records are #1..#seq, all complete");
    uint64_t mine[3] = {c->seq, dup->seq, (uint64_t)n},
             *theirs = calloc((size_t)env.world * 3, sizeof(uint64_t));
    kiln_comm_all_gather_host(c, mine, theirs, sizeof(mine));
    same = 1;
    for (int r = 0; r < env.world; r++)
        same &= !memcmp(&theirs[3 * r], mine, sizeof(mine));
    check(same, "every rank issued the same number of operations on each communicator");
    free(theirs);

    // every rank's dump reads back, and the doctor finds nothing wrong
    char dir[64] = "/tmp/kiln_flight_mpi_XXXXXX";
    if (env.rank == 0 && !mkdtemp(dir))
        dir[0] = 0;
    kiln_comm_broadcast_host(c, dir, sizeof(dir), 0);
    struct kiln_watchdog_opts wo = {
        .dir = dir, .rank = env.rank, .world = env.world, .timeout_s = 0, .job = 7};
    check(dir[0] && !kiln_watchdog_start(&wo, &err), "the watchdog starts (timeout 0: dumps only)");
    char path[128];
    snprintf(path, sizeof(path), "%s/rank-%d.txt", dir, env.rank);
    check(!kiln_watchdog_write_dump(path, "usr2", "test", &err), "a dump is written");
    kiln_watchdog_stop();
    kiln_comm_barrier(c);
    if (env.rank == 0) {
        struct kiln_hang_dump *d = calloc((size_t)env.world, sizeof(*d));
        int ok = 1;
        for (int r = 0; r < env.world; r++) {
            snprintf(path, sizeof(path), "%s/rank-%d.txt", dir, r);
            ok &= !kiln_hang_dump_read(path, &d[r], &err) && d[r].rank == r && d[r].world == env.world &&
                  !strcmp(d[r].job, "0000000000000007");
        }
        check(ok, "every rank's dump reads back with its rank, world and job");
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        int findings = ok ? kiln_hang_diagnose(d, env.world, f) : -1;
        fclose(f);
        check(findings == 0 && strstr(text, "no mismatched collectives") && !strstr(text, "never entered"),
              "a job that does not hang: no stalled rank and no mismatch");
        if (findings)
            fprintf(stderr, "%s", text);
        free(text);
        for (int r = 0; r < env.world; r++) {
            kiln_hang_dump_free(&d[r]);
            snprintf(path, sizeof(path), "%s/rank-%d.txt", dir, r);
            unlink(path);
        }
        free(d);
        rmdir(dir);
    }
    int32_t fl = failed;
    kiln_comm_all_reduce_host(c, &fl, 1, KILN_I32, KILN_RED_SUM);
    if (env.rank == 0)
        printf("%d passed, %d failed\n", passed, fl);
    kiln_comm_close(sub);
    kiln_comm_close(dup);
    kiln_comm_close(c);
    return fl ? 1 : 0;
}
