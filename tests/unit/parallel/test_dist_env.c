// Reading the launcher's environment: mpirun, torchrun-style and Slurm variables, their precedence, Slurm's
// node lists and tasks-per-node counts, and one usage error naming the variable for each bad environment.
#include "test_util.h"

#include "parallel/comm/env.h"

// Reads env (a NULL-terminated "NAME=value" list) and asserts that it succeeds.
static struct kiln_dist_env read_ok(const char *const *env) {
    struct kiln_dist_env e;
    struct kiln_error err = {0};
    memset(&e, 0x55, sizeof(e));
    int rc = kiln_dist_env_read(&e, env, &err);
    if (rc)
        fail_msg("kiln_dist_env_read failed: %s", err.msg);
    return e;
}

// Reads env, asserts a usage error whose one-line message contains every one of the needles (a
// NULL-terminated list), and that *out was left alone.
static void read_fails_with(const char *const *env, const char *const *needles) {
    struct kiln_dist_env e;
    memset(&e, 0x55, sizeof(e));
    struct kiln_dist_env before = e;
    struct kiln_error err = {0};
    assert_int_equal(kiln_dist_env_read(&e, env, &err), KILN_ERR_USAGE);
    assert_int_equal(err.code, KILN_ERR_USAGE);
    assert_null(strchr(err.msg, '\n'));
    assert_non_null(strstr(err.msg, "(environment)"));
    for (; *needles; needles++)
        if (!strstr(err.msg, *needles))
            fail_msg("the message should name \"%s\": %s", *needles, err.msg);
    assert_memory_equal(&e, &before, sizeof(e));
}
#define read_fails(env, ...) read_fails_with((env), (const char *const[]){__VA_ARGS__, NULL})

static void assert_env(const struct kiln_dist_env *e, enum kiln_launcher l, int rank, int world,
                       int local_rank, int local_world, const char *addr, int port) {
    assert_int_equal(e->launcher, l);
    assert_int_equal(e->rank, rank);
    assert_int_equal(e->world, world);
    assert_int_equal(e->local_rank, local_rank);
    assert_int_equal(e->local_world, local_world);
    assert_string_equal(e->master_addr, addr);
    assert_int_equal(e->master_port, port);
}

// ---- each launcher ------------------------------------------------------------------------------

static void test_no_launcher_is_one_process(void **state) {
    (void)state;
    const char *empty[] = {NULL};
    struct kiln_dist_env e = read_ok(empty);
    assert_env(&e, KILN_LAUNCHER_NONE, 0, 1, 0, 1, "", 0);
    char buf[128];
    kiln_dist_env_describe(&e, buf, sizeof(buf));
    assert_string_equal(buf, "rank 0 of 1 (local 0 of 1, none)");

    const char *unrelated[] = {"PATH=/usr/bin", "HOME=/root", "RANKING=3", "XRANK=1", "WORLD_SIZES=2", NULL};
    e = read_ok(unrelated);
    assert_env(&e, KILN_LAUNCHER_NONE, 0, 1, 0, 1, "", 0);

    // set to the empty string counts as unset
    const char *cleared[] = {"RANK=", "WORLD_SIZE=", "OMPI_COMM_WORLD_RANK=", NULL};
    e = read_ok(cleared);
    assert_env(&e, KILN_LAUNCHER_NONE, 0, 1, 0, 1, "", 0);
}

static void test_launcher_names(void **state) {
    (void)state;
    assert_string_equal(kiln_launcher_name(KILN_LAUNCHER_NONE), "none");
    assert_string_equal(kiln_launcher_name(KILN_LAUNCHER_MPIRUN), "mpirun");
    assert_string_equal(kiln_launcher_name(KILN_LAUNCHER_TORCHRUN), "torchrun");
    assert_string_equal(kiln_launcher_name(KILN_LAUNCHER_SLURM), "slurm");
}

static void test_mpirun_gives_rank_world_and_local_values(void **state) {
    (void)state;
    const char *env[] = {"OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=8", "OMPI_COMM_WORLD_LOCAL_RANK=1",
                         "OMPI_COMM_WORLD_LOCAL_SIZE=4", NULL};
    struct kiln_dist_env e = read_ok(env);
    assert_env(&e, KILN_LAUNCHER_MPIRUN, 5, 8, 1, 4, "", 0);
    char buf[128];
    kiln_dist_env_describe(&e, buf, sizeof(buf));
    assert_string_equal(buf, "rank 5 of 8 (local 1 of 4, mpirun)");

    // without the local pair: one node
    const char *flat[] = {"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3", NULL};
    e = read_ok(flat);
    assert_env(&e, KILN_LAUNCHER_MPIRUN, 2, 3, 2, 3, "", 0);

    // a MASTER_ADDR given by hand comes along (a store-based rendezvous may use it)
    const char *with_master[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "MASTER_ADDR=node1",
                                 "MASTER_PORT=1234", NULL};
    e = read_ok(with_master);
    assert_env(&e, KILN_LAUNCHER_MPIRUN, 0, 2, 0, 2, "node1", 1234);
}

static void test_torchrun_style_reads_all_six_variables(void **state) {
    (void)state;
    const char *env[] = {"RANK=1",
                         "WORLD_SIZE=4",
                         "LOCAL_RANK=1",
                         "LOCAL_WORLD_SIZE=2",
                         "MASTER_ADDR=10.0.0.1",
                         "MASTER_PORT=29500",
                         NULL};
    struct kiln_dist_env e = read_ok(env);
    assert_env(&e, KILN_LAUNCHER_TORCHRUN, 1, 4, 1, 2, "10.0.0.1", 29500);
    char buf[128];
    kiln_dist_env_describe(&e, buf, sizeof(buf));
    assert_string_equal(buf, "rank 1 of 4 (local 1 of 2, torchrun, master 10.0.0.1:29500)");

    // a small buffer truncates, terminated
    char small[12];
    memset(small, 'x', sizeof(small));
    kiln_dist_env_describe(&e, small, sizeof(small));
    assert_string_equal(small, "rank 1 of 4");

    // IPv6 masters are bracketed
    const char *v6[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=fe80::1", "MASTER_PORT=29500", NULL};
    e = read_ok(v6);
    kiln_dist_env_describe(&e, buf, sizeof(buf));
    assert_string_equal(buf, "rank 0 of 2 (local 0 of 2, torchrun, master [fe80::1]:29500)");
}

static void test_torchrun_without_local_values_is_one_node(void **state) {
    (void)state;
    const char *env[] = {"RANK=3", "WORLD_SIZE=4", "MASTER_ADDR=host-a", "MASTER_PORT=29500", NULL};
    struct kiln_dist_env e = read_ok(env);
    assert_env(&e, KILN_LAUNCHER_TORCHRUN, 3, 4, 3, 4, "host-a", 29500);

    // one process needs no master
    const char *one[] = {"RANK=0", "WORLD_SIZE=1", NULL};
    e = read_ok(one);
    assert_env(&e, KILN_LAUNCHER_TORCHRUN, 0, 1, 0, 1, "", 0);

    // numbers may carry blanks around them
    const char *blanks[] = {"RANK= 1", "WORLD_SIZE=2 ", "MASTER_ADDR=h", "MASTER_PORT=+80", NULL};
    e = read_ok(blanks);
    assert_env(&e, KILN_LAUNCHER_TORCHRUN, 1, 2, 1, 2, "h", 80);
}

static void test_slurm_srun_task(void **state) {
    (void)state;
    const char *env[] = {"SLURM_JOB_ID=123456",
                         "SLURM_STEP_ID=0",
                         "SLURM_PROCID=5",
                         "SLURM_NTASKS=7",
                         "SLURM_LOCALID=1",
                         "SLURM_NODEID=2",
                         "SLURM_TASKS_PER_NODE=2(x3),1",
                         "SLURM_JOB_NODELIST=gpu[01-04,07],cpu3",
                         NULL};
    struct kiln_dist_env e = read_ok(env);
    assert_env(&e, KILN_LAUNCHER_SLURM, 5, 7, 1, 2, "gpu01", 20000 + 123456 % 20000);
    char buf[128];
    kiln_dist_env_describe(&e, buf, sizeof(buf));
    assert_string_equal(buf, "rank 5 of 7 (local 1 of 2, slurm, master gpu01:23456)");

    // the last node holds one task
    const char *last[] = {"SLURM_JOB_ID=7",
                          "SLURM_STEP_ID=0",
                          "SLURM_PROCID=6",
                          "SLURM_NTASKS=7",
                          "SLURM_LOCALID=0",
                          "SLURM_NODEID=3",
                          "SLURM_TASKS_PER_NODE=2(x3),1",
                          "SLURM_NODELIST=n7",
                          NULL};
    e = read_ok(last);
    assert_env(&e, KILN_LAUNCHER_SLURM, 6, 7, 0, 1, "n7", 20007);

    // without SLURM_NODEID, the node follows from the rank (srun's default block distribution)
    const char *block[] = {"SLURM_JOB_ID=40000",
                           "SLURM_STEP_ID=1",
                           "SLURM_PROCID=4",
                           "SLURM_NTASKS=5",
                           "SLURM_LOCALID=0",
                           "SLURM_TASKS_PER_NODE=3,1(x2)",
                           "SLURM_JOB_NODELIST=a1,a2,a3",
                           NULL};
    e = read_ok(block);
    assert_env(&e, KILN_LAUNCHER_SLURM, 4, 5, 0, 1, "a1", 20000);

    // SLURM_NTASKS_PER_NODE (--ntasks-per-node), a plain count; the step's variables over the job's
    const char *per_node[] = {"SLURM_JOB_ID=1",
                              "SLURM_STEPID=0",
                              "SLURM_PROCID=3",
                              "SLURM_NTASKS=16",
                              "SLURM_STEP_NUM_TASKS=8",
                              "SLURM_LOCALID=3",
                              "SLURM_NTASKS_PER_NODE=4",
                              "SLURM_TASKS_PER_NODE=8(x2)",
                              "SLURM_JOB_NODELIST=big[1-4]",
                              "SLURM_STEP_NODELIST=big[3-4]",
                              NULL};
    e = read_ok(per_node);
    assert_env(&e, KILN_LAUNCHER_SLURM, 3, 8, 3, 4, "big3", 20001);

    // one node without any tasks-per-node variable: all tasks are local
    const char *one_node[] = {"SLURM_JOB_ID=1",  "SLURM_STEP_ID=0", "SLURM_PROCID=1",      "SLURM_NTASKS=2",
                              "SLURM_LOCALID=1", "SLURM_NNODES=1",  "SLURM_NODELIST=solo", NULL};
    e = read_ok(one_node);
    assert_env(&e, KILN_LAUNCHER_SLURM, 1, 2, 1, 2, "solo", 20001);
}

static void test_slurm_master_comes_from_master_addr_and_port_when_set(void **state) {
    (void)state;
    const char *env[] = {"SLURM_JOB_ID=99",
                         "SLURM_STEP_ID=0",
                         "SLURM_PROCID=0",
                         "SLURM_NTASKS=2",
                         "SLURM_LOCALID=0",
                         "SLURM_TASKS_PER_NODE=1(x2)",
                         "SLURM_NODEID=0",
                         "SLURM_JOB_NODELIST=gpu[1-2]",
                         "MASTER_ADDR=10.1.2.3",
                         "MASTER_PORT=31000",
                         NULL};
    struct kiln_dist_env e = read_ok(env);
    assert_env(&e, KILN_LAUNCHER_SLURM, 0, 2, 0, 1, "10.1.2.3", 31000);

    // only the address: the port still comes from the job id
    const char *addr_only[] = {"SLURM_JOB_ID=20005", "SLURM_STEP_ID=0", "SLURM_PROCID=1",
                               "SLURM_NTASKS=2",     "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=1(x2)",
                               "SLURM_NODEID=1",     "MASTER_ADDR=m0",  NULL};
    e = read_ok(addr_only);
    assert_env(&e, KILN_LAUNCHER_SLURM, 1, 2, 0, 1, "m0", 20005);
}

static void test_slurm_node_lists_give_their_first_host(void **state) {
    (void)state;
    static const struct {
        const char *list, *first;
    } cases[] = {
        {"gpu[01-04,07],cpu3", "gpu01"},
        {"node7", "node7"},
        {"node7,node8", "node7"},
        {"a[3,5],b", "a3"},
        {"x-[010-012]", "x-010"},
        {"rack[1-2]-n[05-06]", "rack1-n05"},
        {"gpu[7]", "gpu7"},
        {"10.0.0.5", "10.0.0.5"},
        {"dgx-a100-[002-004]-ib", "dgx-a100-002-ib"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char list[128];
        snprintf(list, sizeof(list), "SLURM_JOB_NODELIST=%s", cases[i].list);
        const char *env[] = {"SLURM_JOB_ID=1",
                             "SLURM_STEP_ID=0",
                             "SLURM_PROCID=0",
                             "SLURM_NTASKS=2",
                             "SLURM_LOCALID=0",
                             "SLURM_TASKS_PER_NODE=1(x2)",
                             list,
                             NULL};
        struct kiln_dist_env e = read_ok(env);
        assert_string_equal(e.master_addr, cases[i].first);
    }
    static const char *bad[] = {"gpu[01-04", "gpu[]",  "gpu[a-b]",   "gpu]1",
                                "[",         ",node1", "gpu[1-2]x[", "a b"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char list[128];
        snprintf(list, sizeof(list), "SLURM_JOB_NODELIST=%s", bad[i]);
        const char *env[] = {"SLURM_JOB_ID=1",
                             "SLURM_STEP_ID=0",
                             "SLURM_PROCID=0",
                             "SLURM_NTASKS=2",
                             "SLURM_LOCALID=0",
                             "SLURM_TASKS_PER_NODE=1(x2)",
                             list,
                             NULL};
        read_fails(env, "SLURM_JOB_NODELIST", bad[i], "host list");
    }
}

static void test_slurm_tasks_per_node_lists(void **state) {
    (void)state;
    // (list, node, expected count); node -1: derived from rank 0
    static const struct {
        const char *list;
        int node, tasks;
    } cases[] = {
        {"4", 0, 4},     {"2(x3),1", 0, 2},    {"2(x3),1", 2, 2},   {"2(x3),1", 3, 1},   {"1,2,3", 1, 2},
        {"1,2,3", 2, 3}, {"8(x1000)", 999, 8}, {"3,5(x2),7", 3, 7}, {"3,5(x2),7", 2, 5},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char list[128], node[64];
        snprintf(list, sizeof(list), "SLURM_TASKS_PER_NODE=%s", cases[i].list);
        snprintf(node, sizeof(node), "SLURM_NODEID=%d", cases[i].node);
        const char *env[] = {"SLURM_JOB_ID=1",
                             "SLURM_STEP_ID=0",
                             "SLURM_PROCID=0",
                             "SLURM_NTASKS=9000",
                             "SLURM_LOCALID=0",
                             "SLURM_NODELIST=n1",
                             list,
                             node,
                             NULL};
        struct kiln_dist_env e = read_ok(env);
        assert_int_equal(e.local_world, cases[i].tasks);
    }
    static const char *bad[] = {"2(x3", "abc", "0", "2(3)", "2(x0)", "2,", "-1", "2(x3)1", "2 ,1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char list[128];
        snprintf(list, sizeof(list), "SLURM_TASKS_PER_NODE=%s", bad[i]);
        const char *env[] = {"SLURM_JOB_ID=1",
                             "SLURM_STEP_ID=0",
                             "SLURM_PROCID=0",
                             "SLURM_NTASKS=2",
                             "SLURM_LOCALID=0",
                             "SLURM_NODELIST=n1",
                             list,
                             NULL};
        read_fails(env, "SLURM_TASKS_PER_NODE", "tasks-per-node");
    }
    // a node past the list's end
    const char *past[] = {"SLURM_JOB_ID=1", "SLURM_STEP_ID=0",   "SLURM_PROCID=0",
                          "SLURM_NTASKS=2", "SLURM_LOCALID=0",   "SLURM_TASKS_PER_NODE=1(x2)",
                          "SLURM_NODEID=2", "SLURM_NODELIST=n1", NULL};
    read_fails(past, "SLURM_TASKS_PER_NODE", "SLURM_NODEID=2");
    // a rank past the list's tasks (no SLURM_NODEID)
    const char *beyond[] = {"SLURM_JOB_ID=1",    "SLURM_STEP_ID=0",
                            "SLURM_PROCID=4",    "SLURM_NTASKS=8",
                            "SLURM_LOCALID=0",   "SLURM_TASKS_PER_NODE=2(x2)",
                            "SLURM_NODELIST=n1", NULL};
    read_fails(beyond, "SLURM_TASKS_PER_NODE", "SLURM_PROCID=4");
}

static void test_an_sbatch_shell_without_a_step_is_one_process(void **state) {
    (void)state;
    // the batch script's own shell has SLURM_PROCID=0 too, but no SLURM_STEP_ID: it is not an srun task
    const char *env[] = {"SLURM_JOB_ID=200505",   "SLURM_PROCID=0",
                         "SLURM_LOCALID=0",       "SLURM_NTASKS=4",
                         "SLURM_NODEID=0",        "SLURM_TASKS_PER_NODE=1(x4)",
                         "SLURM_NODELIST=g[1-4]", NULL};
    struct kiln_dist_env e = read_ok(env);
    assert_env(&e, KILN_LAUNCHER_NONE, 0, 1, 0, 1, "", 0);
}

static void test_precedence_mpirun_then_torchrun_then_slurm(void **state) {
    (void)state;
    const char *all[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "RANK=3",
                         "WORLD_SIZE=4",           "MASTER_ADDR=m",          "MASTER_PORT=5",
                         "SLURM_STEP_ID=0",        "SLURM_PROCID=5",         "SLURM_NTASKS=6",
                         "SLURM_LOCALID=0",        "SLURM_JOB_ID=1",         NULL};
    struct kiln_dist_env e = read_ok(all);
    assert_int_equal(e.launcher, KILN_LAUNCHER_MPIRUN);
    assert_int_equal(e.rank, 1);
    assert_int_equal(e.world, 2);

    struct kiln_dist_env t = read_ok(all + 2);
    assert_env(&t, KILN_LAUNCHER_TORCHRUN, 3, 4, 3, 4, "m", 5);

    // mpirun's values win even where the lower launchers' would be invalid
    const char *mpi_over_bad[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1", "RANK=9",
                                  "WORLD_SIZE=2", NULL};
    e = read_ok(mpi_over_bad);
    assert_env(&e, KILN_LAUNCHER_MPIRUN, 0, 1, 0, 1, "", 0);
}

static void test_null_envp_reads_the_process_environment(void **state) {
    (void)state;
    if (getenv("OMPI_COMM_WORLD_RANK") || getenv("OMPI_COMM_WORLD_SIZE"))
        skip(); // under mpirun the process's own variables win
    static const char *names[] = {"RANK",        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR", "MASTER_PORT"};
    char *saved[6];
    for (int i = 0; i < 6; i++) {
        const char *v = getenv(names[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(names[i]);
    }
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "3", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29511", 1);
    struct kiln_dist_env e;
    struct kiln_error err = {0};
    int rc = kiln_dist_env_read(&e, NULL, &err);
    for (int i = 0; i < 6; i++) {
        if (saved[i])
            setenv(names[i], saved[i], 1);
        else
            unsetenv(names[i]);
        free(saved[i]);
    }
    assert_int_equal(rc, 0);
    assert_env(&e, KILN_LAUNCHER_TORCHRUN, 2, 3, 2, 3, "127.0.0.1", 29511);
}

// ---- bad environments ---------------------------------------------------------------------------

#define MASTER "MASTER_ADDR=h", "MASTER_PORT=29500"

static void test_rank_not_below_world_size(void **state) {
    (void)state;
    const char *env[] = {"RANK=4", "WORLD_SIZE=4", MASTER, NULL};
    read_fails(env, "RANK=4", "WORLD_SIZE=4");
    const char *local[] = {"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", MASTER, NULL};
    read_fails(local, "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2");
    const char *local_big[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4", MASTER, NULL};
    read_fails(local_big, "LOCAL_WORLD_SIZE=4", "WORLD_SIZE=2");
    const char *mpi[] = {"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2", NULL};
    read_fails(mpi, "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2");
    const char *mpi_local[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2",
                               "OMPI_COMM_WORLD_LOCAL_RANK=3", "OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL};
    read_fails(mpi_local, "OMPI_COMM_WORLD_LOCAL_RANK=3");
    const char *slurm[] = {"SLURM_JOB_ID=1",         "SLURM_STEP_ID=0",  "SLURM_PROCID=8",
                           "SLURM_NTASKS=8",         "SLURM_LOCALID=0",  "SLURM_NODEID=0",
                           "SLURM_TASKS_PER_NODE=8", "SLURM_NODELIST=n", NULL};
    read_fails(slurm, "SLURM_PROCID=8", "SLURM_NTASKS=8");
    const char *slurm_local[] = {"SLURM_JOB_ID=1",
                                 "SLURM_STEP_ID=0",
                                 "SLURM_PROCID=1",
                                 "SLURM_NTASKS=4",
                                 "SLURM_LOCALID=2",
                                 "SLURM_NODEID=0",
                                 "SLURM_TASKS_PER_NODE=2(x2)",
                                 "SLURM_NODELIST=n",
                                 NULL};
    read_fails(slurm_local, "SLURM_LOCALID=2", "SLURM_TASKS_PER_NODE=2");
}

static void test_world_size_below_one(void **state) {
    (void)state;
    const char *env[] = {"RANK=0", "WORLD_SIZE=0", MASTER, NULL};
    read_fails(env, "WORLD_SIZE=0");
    const char *lw[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=0", MASTER, NULL};
    read_fails(lw, "LOCAL_WORLD_SIZE=0");
}

static void test_missing_master_addr_or_port(void **state) {
    (void)state;
    const char *no_addr[] = {"RANK=0", "WORLD_SIZE=4", "MASTER_PORT=29500", NULL};
    read_fails(
        no_addr,
        "MASTER_ADDR is not set (environment): torchrun-style launches with WORLD_SIZE=4 need MASTER_ADDR "
        "and MASTER_PORT, the address of rank 0's TCP store; ");
    const char *no_port[] = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", NULL};
    read_fails(no_port, "MASTER_PORT is not set (environment)", "WORLD_SIZE=2");
    const char *neither[] = {"RANK=1", "WORLD_SIZE=2", NULL};
    read_fails(neither, "MASTER_ADDR is not set");
    // Slurm without a node list or job id, and no MASTER_* to stand in
    const char *no_list[] = {"SLURM_JOB_ID=1",
                             "SLURM_STEP_ID=0",
                             "SLURM_PROCID=0",
                             "SLURM_NTASKS=2",
                             "SLURM_LOCALID=0",
                             "SLURM_TASKS_PER_NODE=2",
                             NULL};
    read_fails(no_list, "SLURM_JOB_NODELIST", "MASTER_ADDR");
    const char *no_job[] = {"SLURM_STEP_ID=0",
                            "SLURM_PROCID=0",
                            "SLURM_NTASKS=2",
                            "SLURM_LOCALID=0",
                            "SLURM_TASKS_PER_NODE=2",
                            "SLURM_NODELIST=n",
                            NULL};
    read_fails(no_job, "SLURM_JOB_ID", "MASTER_PORT");
    // a long address
    char long_addr[400] = "MASTER_ADDR=";
    memset(long_addr + strlen(long_addr), 'a', 300);
    long_addr[312] = '\0';
    const char *too_long[] = {"RANK=0", "WORLD_SIZE=2", long_addr, "MASTER_PORT=1", NULL};
    read_fails(too_long, "MASTER_ADDR");
    const char *blank[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=a b", "MASTER_PORT=1", NULL};
    read_fails(blank, "MASTER_ADDR");
}

static void test_numbers_that_are_not_numbers(void **state) {
    (void)state;
    static const char *bad[] = {"abc", "1x", "0x10", "1.5", " ", "--1", "1 2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char v[64];
        snprintf(v, sizeof(v), "RANK=%s", bad[i]);
        const char *env[] = {v, "WORLD_SIZE=4", MASTER, NULL};
        read_fails(env, "RANK", "not a whole number");
        snprintf(v, sizeof(v), "SLURM_NTASKS=%s", bad[i]);
        const char *slurm[] = {"SLURM_STEP_ID=0", "SLURM_PROCID=0", v, "SLURM_LOCALID=0", NULL};
        read_fails(slurm, "SLURM_NTASKS");
    }
    const char *neg[] = {"RANK=-1", "WORLD_SIZE=4", MASTER, NULL};
    read_fails(neg, "RANK=-1", "negative");
    const char *neg_local[] = {"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=-2", "LOCAL_WORLD_SIZE=2", MASTER, NULL};
    read_fails(neg_local, "LOCAL_RANK=-2", "negative");
    const char *huge[] = {"RANK=0", "WORLD_SIZE=99999999999999999999", MASTER, NULL};
    read_fails(huge, "WORLD_SIZE=99999999999999999999", "too large");
    const char *mpi[] = {"OMPI_COMM_WORLD_RANK=zero", "OMPI_COMM_WORLD_SIZE=2", NULL};
    read_fails(mpi, "OMPI_COMM_WORLD_RANK");
    const char *job[] = {"SLURM_JOB_ID=12a", "SLURM_STEP_ID=0",        "SLURM_PROCID=0",   "SLURM_NTASKS=2",
                         "SLURM_LOCALID=0",  "SLURM_TASKS_PER_NODE=2", "SLURM_NODELIST=n", NULL};
    read_fails(job, "SLURM_JOB_ID");
    // even for one process, a bad value is an error, not ignored
    const char *one[] = {"MASTER_PORT=x", NULL};
    read_fails(one, "MASTER_PORT");
}

static void test_master_port_out_of_range(void **state) {
    (void)state;
    static const char *bad[] = {"0", "65536", "70000", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char v[64];
        snprintf(v, sizeof(v), "MASTER_PORT=%s", bad[i]);
        const char *env[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", v, NULL};
        read_fails(env, "MASTER_PORT", bad[i]);
    }
    const char *range[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=65536", NULL};
    read_fails(range, "MASTER_PORT=65536", "1..65535");
    const char *port[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=65535", NULL};
    struct kiln_dist_env e = read_ok(port);
    assert_int_equal(e.master_port, 65535);
    const char *slurm[] = {"SLURM_JOB_ID=1", "SLURM_STEP_ID=0",        "SLURM_PROCID=0",
                           "SLURM_NTASKS=2", "SLURM_LOCALID=0",        "SLURM_NODELIST=n",
                           "MASTER_PORT=0",  "SLURM_TASKS_PER_NODE=2", NULL};
    read_fails(slurm, "MASTER_PORT=0");
}

static void test_inconsistent_mixes(void **state) {
    (void)state;
    const char *rank_only[] = {"RANK=1", MASTER, NULL};
    read_fails(rank_only, "RANK is set without WORLD_SIZE");
    const char *world_only[] = {"WORLD_SIZE=2", MASTER, NULL};
    read_fails(world_only, "WORLD_SIZE is set without RANK");
    const char *local_only[] = {"LOCAL_RANK=0", NULL};
    read_fails(local_only, "LOCAL_RANK is set without RANK and WORLD_SIZE");
    const char *local_world_only[] = {"LOCAL_WORLD_SIZE=2", NULL};
    read_fails(local_world_only, "LOCAL_WORLD_SIZE");
    const char *lrank_no_lworld[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", MASTER, NULL};
    read_fails(lrank_no_lworld, "LOCAL_RANK=0 is set without LOCAL_WORLD_SIZE");
    const char *lworld_no_lrank[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", MASTER, NULL};
    read_fails(lworld_no_lrank, "LOCAL_WORLD_SIZE=2 is set without LOCAL_RANK");
    const char *mpi_rank_only[] = {"OMPI_COMM_WORLD_RANK=0", NULL};
    read_fails(mpi_rank_only, "OMPI_COMM_WORLD_RANK is set without OMPI_COMM_WORLD_SIZE");
    const char *mpi_local_half[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2",
                                    "OMPI_COMM_WORLD_LOCAL_RANK=0", NULL};
    read_fails(mpi_local_half, "OMPI_COMM_WORLD_LOCAL_RANK is set without OMPI_COMM_WORLD_LOCAL_SIZE");
    const char *slurm_no_ntasks[] = {"SLURM_STEP_ID=0", "SLURM_PROCID=1", "SLURM_LOCALID=0", NULL};
    read_fails(slurm_no_ntasks, "SLURM_PROCID=1 is set without SLURM_NTASKS");
    const char *slurm_no_localid[] = {"SLURM_STEP_ID=0", "SLURM_PROCID=1", "SLURM_NTASKS=2", NULL};
    read_fails(slurm_no_localid, "SLURM_PROCID=1 is set without SLURM_LOCALID");
    const char *slurm_nodes[] = {
        "SLURM_JOB_ID=1",  "SLURM_STEP_ID=0", "SLURM_PROCID=0",        "SLURM_NTASKS=4",
        "SLURM_LOCALID=0", "SLURM_NNODES=2",  "SLURM_NODELIST=n[1-2]", NULL};
    read_fails(slurm_nodes, "SLURM_TASKS_PER_NODE is not set", "SLURM_NNODES=2");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_launcher_is_one_process),
        cmocka_unit_test(test_launcher_names),
        cmocka_unit_test(test_mpirun_gives_rank_world_and_local_values),
        cmocka_unit_test(test_torchrun_style_reads_all_six_variables),
        cmocka_unit_test(test_torchrun_without_local_values_is_one_node),
        cmocka_unit_test(test_slurm_srun_task),
        cmocka_unit_test(test_slurm_master_comes_from_master_addr_and_port_when_set),
        cmocka_unit_test(test_slurm_node_lists_give_their_first_host),
        cmocka_unit_test(test_slurm_tasks_per_node_lists),
        cmocka_unit_test(test_an_sbatch_shell_without_a_step_is_one_process),
        cmocka_unit_test(test_precedence_mpirun_then_torchrun_then_slurm),
        cmocka_unit_test(test_null_envp_reads_the_process_environment),
        cmocka_unit_test(test_rank_not_below_world_size),
        cmocka_unit_test(test_world_size_below_one),
        cmocka_unit_test(test_missing_master_addr_or_port),
        cmocka_unit_test(test_numbers_that_are_not_numbers),
        cmocka_unit_test(test_master_port_out_of_range),
        cmocka_unit_test(test_inconsistent_mixes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
