// The flight recorder's ring (newest KILN_FLIGHT_SLOTS kept, in order; completions; step and layer stamps),
// the dump written by the watchdog read back field for field, broken dumps refused with the file named, and
// kiln doctor's diagnosis of made-up dumps: a rank behind the others, and a size mismatch.
#include "test_util.h"

#include <pthread.h>

#include "parallel/comm/comm.h"
#include "parallel/comm/flight.h"
#include "parallel/comm/watchdog.h"
#include "io/fsutil.h"
#include "util/progress.h"

static void test_the_ring_keeps_the_newest_records_in_order(void **state) {
    (void)state;
    kiln_flight_reset();
    uint64_t s = test_seed();
    int extra = 1 + (int)(test_rand_u64(&s) % 500), total = KILN_FLIGHT_SLOTS + extra;
    uint64_t first_token = 0, last_token = 0;
    for (int i = 1; i <= total; i++) {
        kiln_flight_set_step(i / 10);
        uint64_t t = kiln_flight_issue(i % 3, (uint64_t)i, KILN_COLL_ALL_REDUCE, KILN_F32, 4u * (uint64_t)i);
        if (i == 1)
            first_token = t;
        if (i % 2 == 0)
            kiln_flight_done(t);
        last_token = t;
    }
    kiln_flight_done(first_token); // overwritten long ago: must not touch the slot's new record
    static struct kiln_flight_rec r[KILN_FLIGHT_SLOTS];
    int n = kiln_flight_snapshot(r, KILN_FLIGHT_SLOTS);
    assert_int_equal(n, KILN_FLIGHT_SLOTS);
    for (int i = 0; i < n; i++) {
        uint64_t seq = (uint64_t)(extra + 1 + i);
        assert_int_equal(r[i].seq, seq);
        assert_int_equal(r[i].comm, (int)(seq % 3));
        assert_int_equal(r[i].bytes, 4 * seq);
        assert_int_equal(r[i].step, (int64_t)seq / 10);
        assert_int_equal(r[i].t_done > 0, seq % 2 == 0);
    }
    struct kiln_flight_rec p;
    assert_true(kiln_flight_oldest_pending(&p));
    assert_int_equal(p.seq, (uint64_t)(extra + 1) | 1u); // the oldest odd sequence number still held
    (void)last_token;
}

static void test_a_pending_record_carries_step_and_layer_until_done(void **state) {
    (void)state;
    kiln_flight_reset();
    struct kiln_flight_rec p;
    assert_false(kiln_flight_oldest_pending(&p));
    kiln_flight_set_step(12);
    kiln_flight_set_layer(5);
    double before = kiln_now_s();
    uint64_t t = kiln_flight_issue(1, 9, KILN_COLL_REDUCE_SCATTER, KILN_BF16, 1000);
    assert_true(kiln_flight_oldest_pending(&p));
    assert_int_equal(p.step, 12);
    assert_int_equal(p.layer, 5);
    assert_int_equal(p.op, KILN_COLL_REDUCE_SCATTER);
    assert_true(p.t_issue >= before && kiln_flight_last_progress() >= p.t_issue);
    kiln_flight_done(t);
    assert_false(kiln_flight_oldest_pending(&p));
    kiln_flight_set_layer(-1);
}

static void test_a_dump_reads_back_field_for_field(void **state) {
    (void)state;
    kiln_flight_reset();
    char dir[] = "/tmp/kiln_flight_XXXXXX";
    assert_non_null(mkdtemp(dir));
    int world_id = kiln_flight_comm_register("world", 2, 4),
        dup_id = kiln_flight_comm_register("dup-of-0", 2, 4);
    assert_int_equal(world_id, 0);
    assert_int_equal(dup_id, 1);
    kiln_flight_set_step(3);
    kiln_flight_set_layer(7);
    kiln_flight_done(kiln_flight_issue(0, 1, KILN_COLL_BROADCAST, KILN_U8, 17));
    kiln_flight_waiting(kiln_flight_issue(1, 1, KILN_COLL_ALL_GATHER, KILN_F64, 800)); // pending, waited for
    kiln_flight_done(kiln_flight_issue(0, 2, KILN_FLIGHT_OP_SPLIT, KILN_U8, 0));
    kiln_log_remember("step 3/10 | loss 1.0");
    struct kiln_watchdog_opts o = {.dir = dir, .rank = 2, .world = 4, .timeout_s = 9, .job = 0xabcdef};
    struct kiln_error err = {0};
    assert_int_equal(kiln_watchdog_start(&o, &err), 0);
    char path[128];
    snprintf(path, sizeof(path), "%s/sub/rank-2.txt", dir); // the directory is made when needed
    assert_int_equal(kiln_watchdog_write_dump(path, "self", "a reason with spaces", &err), 0);
    kiln_watchdog_stop();
    struct kiln_hang_dump d;
    assert_int_equal(kiln_hang_dump_read(path, &d, &err), 0);
    assert_int_equal(d.rank, 2);
    assert_int_equal(d.world, 4);
    assert_int_equal(d.pid, getpid());
    assert_string_equal(d.job, "0000000000abcdef");
    assert_string_equal(d.reason, "a reason with spaces");
    assert_string_equal(d.trigger, "self");
    assert_int_equal(d.step, 3);
    assert_int_equal(d.layer, 7);
    assert_true(d.hang_timeout_s == 9);
    assert_int_equal(d.n_comms, 2);
    assert_string_equal(d.comm_names[1], "dup-of-0");
    static struct kiln_flight_rec mine[KILN_FLIGHT_SLOTS];
    int n = kiln_flight_snapshot(mine, KILN_FLIGHT_SLOTS);
    assert_int_equal(d.n_recs, n);
    assert_int_equal(n, 3);
    for (int i = 0; i < n; i++) {
        assert_int_equal(d.recs[i].seq, mine[i].seq);
        assert_int_equal(d.recs[i].comm, mine[i].comm);
        assert_int_equal(d.recs[i].op, mine[i].op);
        assert_int_equal(d.recs[i].dtype, mine[i].dtype);
        assert_int_equal(d.recs[i].bytes, mine[i].bytes);
        assert_int_equal(d.recs[i].step, mine[i].step);
        assert_int_equal(d.recs[i].layer, mine[i].layer);
        assert_true(fabs(d.recs[i].t_issue - mine[i].t_issue) < 2e-3);
        assert_int_equal(d.recs[i].t_done > 0, mine[i].t_done > 0);
        assert_int_equal(d.recs[i].t_wait > 0, mine[i].t_wait > 0);
    }
    assert_true(d.recs[1].t_wait > 0 && d.recs[0].t_wait == 0);
    kiln_hang_dump_free(&d);
    // the log lines are in the dump
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(kiln_read_file(path, &text, &len, &err), 0);
    assert_non_null(strstr(text, "  step 3/10 | loss 1.0\n"));
    assert_non_null(strstr(text, "[stacks]\nthread "));
    // a dump cut short (at a line's end: a torn line may read as a bad record) is refused, naming the file
    size_t cut = len / 2;
    while (cut > 0 && text[cut - 1] != '\n')
        cut--;
    FILE *f = fopen(path, "w");
    fwrite(text, 1, cut, f);
    fclose(f);
    free(text);
    assert_int_not_equal(kiln_hang_dump_read(path, &d, &err), 0);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "cut short"));
    f = fopen(path, "w");
    fputs("hello\n", f);
    fclose(f);
    assert_int_not_equal(kiln_hang_dump_read(path, &d, &err), 0);
    assert_non_null(strstr(err.msg, "not a kiln hang dump"));
    unlink(path);
    snprintf(path, sizeof(path), "%s/sub", dir);
    rmdir(path);
    rmdir(dir);
    kiln_flight_set_layer(-1);
}

// ---- diagnosis of made-up dumps ----

static void add(struct kiln_hang_dump *d, uint64_t seq, int op, uint64_t bytes, int done) {
    d->recs = realloc(d->recs, (size_t)(d->n_recs + 1) * sizeof(*d->recs));
    d->recs[d->n_recs++] = (struct kiln_flight_rec){.seq = seq,
                                                    .comm = 0,
                                                    .op = op,
                                                    .dtype = KILN_F32,
                                                    .bytes = bytes,
                                                    .step = 4,
                                                    .layer = 2,
                                                    .t_issue = 90 + (double)seq,
                                                    .t_done = done ? 95 + (double)seq : 0};
}

static char *diagnose(struct kiln_hang_dump *d, int n, int *findings) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    *findings = kiln_hang_diagnose(d, n, f);
    fclose(f);
    return text;
}

static void make_ranks(struct kiln_hang_dump *d, int n) {
    memset(d, 0, (size_t)n * sizeof(*d));
    for (int r = 0; r < n; r++) {
        d[r].rank = r;
        d[r].world = n;
        d[r].mono_now = 200;
        d[r].step = 4;
        snprintf(d[r].stack_top, sizeof(d[r].stack_top), "kiln_fn_of_rank_%d", r);
        snprintf(d[r].comm_names[0], sizeof(d[r].comm_names[0]), "world");
        d[r].n_comms = 1;
    }
}

static void test_doctor_names_the_rank_that_never_entered_the_collective(void **state) {
    (void)state;
    struct kiln_hang_dump d[4];
    make_ranks(d, 4);
    uint64_t s = test_seed();
    int stalled = (int)(test_rand_u64(&s) % 4);
    for (int r = 0; r < 4; r++) {
        for (uint64_t q = 1; q <= 5; q++)
            add(&d[r], q, KILN_COLL_ALL_REDUCE, 64, 1);
        if (r != stalled)
            add(&d[r], 6, KILN_COLL_ALL_REDUCE, 64, 0);
    }
    int findings;
    char *text = diagnose(d, 4, &findings);
    char want[128];
    snprintf(want, sizeof(want), "rank %d never entered collective #6 on communicator 0 (world)", stalled);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof(want), "stack: kiln_fn_of_rank_%d", stalled);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "were waiting for rank"));
    assert_non_null(strstr(text, "no mismatched collectives"));
    char waiting[128] = "ranks ";
    for (int r = 0, first = 1; r < 4; r++) // the waiting ranks are listed, and only they
        if (r != stalled) {
            snprintf(waiting + strlen(waiting), sizeof(waiting) - strlen(waiting), "%s%d", first ? "" : ", ",
                     r);
            first = 0;
        }
    snprintf(waiting + strlen(waiting), sizeof(waiting) - strlen(waiting),
             " were waiting for rank %d in collective #6 (all_reduce, 64 bytes f32, step 4, layer 2)",
             stalled);
    assert_non_null(strstr(text, waiting));
    assert_int_equal(findings, 1);
    free(text);
    for (int r = 0; r < 4; r++)
        kiln_hang_dump_free(&d[r]);
}

// The rank that never entered is "waiting in" an earlier operation only where its host had begun to wait for
// it; one issued and left running (ZeRO-1's gather of the new weights, waited for by the next forward) is said
// to be so, the rank outside any collective.
static void test_doctor_tells_waiting_from_left_running(void **state) {
    (void)state;
    for (int waited = 0; waited < 2; waited++) {
        struct kiln_hang_dump d[3];
        make_ranks(d, 3);
        for (int r = 0; r < 3; r++) {
            for (uint64_t q = 1; q <= 4; q++)
                add(&d[r], q, KILN_COLL_REDUCE_SCATTER, 64, 1);
            add(&d[r], 5, KILN_COLL_ALL_GATHER, 64, r != 1); // rank 1's gather is still unfinished
            if (r != 1)
                add(&d[r], 6, KILN_COLL_REDUCE_SCATTER, 64, 0);
        }
        if (waited)
            d[1].recs[4].t_wait = 96 + 5;
        int findings;
        char *text = diagnose(d, 3, &findings);
        assert_non_null(strstr(text, "rank 1 never entered collective #6 on communicator 0 (world)"));
        assert_non_null(strstr(text, waited ? "rank 1 (pid 0 on ): step 4, layer 0, waiting in collective #5 on "
                                              "communicator 0 (all_gather, 64 bytes f32, step 4, layer 2), stack"
                                            : "rank 1 (pid 0 on ): step 4, layer 0, outside any collective "
                                              "(collective #5 on communicator 0, all_gather, 64 bytes f32, step 4, "
                                              "layer 2, issued and not yet waited for), stack"));
        free(text);
        for (int r = 0; r < 3; r++)
            kiln_hang_dump_free(&d[r]);
    }
}

static void test_doctor_flags_a_collective_of_another_size(void **state) {
    (void)state;
    struct kiln_hang_dump d[3];
    make_ranks(d, 3);
    for (int r = 0; r < 3; r++) {
        add(&d[r], 1, KILN_COLL_BROADCAST, 8, 1);
        add(&d[r], 2, KILN_COLL_ALL_REDUCE, r == 2 ? 128 : 64, 0);
    }
    int findings;
    char *text = diagnose(d, 3, &findings);
    assert_non_null(strstr(text, "mismatch: collective #2 on communicator 0 (world) differs across ranks"));
    assert_non_null(strstr(text, "64 bytes f32, step 4, layer 2 on ranks 0, 1"));
    assert_non_null(strstr(text, "128 bytes f32, step 4, layer 2 on rank 2"));
    assert_null(strstr(text, "never entered"));
    assert_non_null(strstr(text, "every rank entered collective #2"));
    assert_int_equal(findings, 2);
    free(text);
    for (int r = 0; r < 3; r++)
        kiln_hang_dump_free(&d[r]);
}

// A rank stopped (SIGSTOP, a frozen VM) in collective #6 while the others waited: rank 0 saw #6 complete (a
// collective may complete on some ranks first) and waits in #7, rank 2 still waits in #6. The stopped rank
// dumps once woken, after it ran on: #6 done, #7 and #8 issued. Doctor names it, reads its dump as it stood
// when it stopped, and blames neither rank 0 (ahead) nor rank 2 (held up by it).
static void test_doctor_names_a_stopped_rank_from_its_late_dump(void **state) {
    (void)state;
    struct kiln_hang_dump d[3];
    make_ranks(d, 3);
    for (int r = 0; r < 3; r++)
        for (uint64_t q = 1; q <= 5; q++)
            add(&d[r], q, KILN_COLL_ALL_REDUCE, 64, 1);
    add(&d[0], 6, KILN_COLL_ALL_REDUCE, 64, 1);
    add(&d[0], 7, KILN_COLL_ALL_REDUCE, 64, 0);
    add(&d[2], 6, KILN_COLL_ALL_REDUCE, 64, 0);
    // rank 1: stopped from 150 to 199 (its dump at 200), in #6; after waking it ran on
    snprintf(d[1].trigger, sizeof(d[1].trigger), "stopped");
    d[1].stopped_s = 49;
    d[1].stopped_ended_ago_s = 1;
    add(&d[1], 6, KILN_COLL_ALL_REDUCE, 64, 0);
    d[1].recs[d[1].n_recs - 1].t_done = 199.2;
    for (uint64_t q = 7; q <= 8; q++) {
        add(&d[1], q, KILN_COLL_ALL_REDUCE, 64, 1);
        d[1].recs[d[1].n_recs - 1].t_issue = 199.3 + (double)q / 100;
        d[1].recs[d[1].n_recs - 1].t_done = 199.4 + (double)q / 100;
    }
    int findings;
    char *text = diagnose(d, 3, &findings);
    assert_non_null(strstr(text, "rank 1 did not run for 49.0 s"));
    assert_non_null(strstr(text, "rank 1 (pid 0 on ): stopped in collective #6 on communicator 0"));
    assert_non_null(strstr(text, "rank 1 never entered collective #7 on communicator 0 (world)"));
    assert_non_null(strstr(text, "rank 2 did not enter collective #7 on communicator 0 (world) either"));
    assert_non_null(strstr(text, "rank 0 was waiting for rank 1 in collective #7"));
    assert_null(strstr(text, "ranks 1, 2 never entered"));
    assert_null(strstr(text, "never entered collective #9"));
    free(text);
    for (int r = 0; r < 3; r++)
        kiln_hang_dump_free(&d[r]);
}

// A rank that wrote no dump (killed while stopped) where every other rank waits in one collective: named as
// the one that held it up, not "every rank entered it".
static void test_doctor_names_a_rank_without_a_dump(void **state) {
    (void)state;
    struct kiln_hang_dump d[3];
    make_ranks(d, 3);
    for (int r = 0; r < 3; r++)
        d[r].world = 3;
    for (int r = 0; r < 2; r++) { // ranks 1 and 2 dumped (d[0], d[1]); rank 0 did not
        d[r].rank = r + 1;
        for (uint64_t q = 1; q <= 5; q++)
            add(&d[r], q, KILN_COLL_ALL_REDUCE, 64, q < 5);
    }
    int findings;
    char *text = diagnose(d, 2, &findings);
    assert_non_null(strstr(text, "ranks 1, 2 waited in collective #5"));
    assert_non_null(strstr(text, "rank 0, which wrote no dump"));
    assert_null(strstr(text, "every rank entered"));
    free(text);
    for (int r = 0; r < 3; r++)
        kiln_hang_dump_free(&d[r]);
}

// The same without the stopped rank's dump (killed while stopped): rank 1 saw #5 complete and waits in #6,
// rank 2 still waits in #5. Rank 0, without a dump, is the one they waited for; rank 2 is not blamed.
static void test_doctor_blames_the_rank_without_a_dump_not_one_it_held_up(void **state) {
    (void)state;
    struct kiln_hang_dump d[2];
    make_ranks(d, 2);
    for (int r = 0; r < 2; r++) {
        d[r].rank = r + 1;
        d[r].world = 3;
        for (uint64_t q = 1; q <= 4; q++)
            add(&d[r], q, KILN_COLL_ALL_REDUCE, 64, 1);
    }
    add(&d[0], 5, KILN_COLL_ALL_REDUCE, 64, 1);
    add(&d[0], 6, KILN_COLL_ALL_REDUCE, 64, 0);
    add(&d[1], 5, KILN_COLL_ALL_REDUCE, 64, 0);
    int findings;
    char *text = diagnose(d, 2, &findings);
    assert_non_null(strstr(text,
                           "rank 2 did not enter collective #6 on communicator 0 (world) either, held up "
                           "in another by rank 0, which wrote no dump"));
    assert_non_null(strstr(text, "rank 1 was waiting for rank 0 in collective #6"));
    assert_null(strstr(text, "rank 2 never entered"));
    free(text);
    for (int r = 0; r < 2; r++)
        kiln_hang_dump_free(&d[r]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_ring_keeps_the_newest_records_in_order),
        cmocka_unit_test(test_a_pending_record_carries_step_and_layer_until_done),
        cmocka_unit_test(test_a_dump_reads_back_field_for_field),
        cmocka_unit_test(test_doctor_names_the_rank_that_never_entered_the_collective),
        cmocka_unit_test(test_doctor_tells_waiting_from_left_running),
        cmocka_unit_test(test_doctor_flags_a_collective_of_another_size),
        cmocka_unit_test(test_doctor_names_a_stopped_rank_from_its_late_dump),
        cmocka_unit_test(test_doctor_names_a_rank_without_a_dump),
        cmocka_unit_test(test_doctor_blames_the_rank_without_a_dump_not_one_it_held_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
