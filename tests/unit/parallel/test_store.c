// The TCP rendezvous store on 127.0.0.1: ranks as threads (and a server in a fork()ed process that gets
// SIGKILLed) set, get, add and meet at barriers; every failure (no server, wrong port, port in use, a dead
// server, a key never set, a rank missing from a barrier, garbage on the wire) is an error within its
// timeout, never a hang.
#include "test_util.h"

#include "parallel/comm/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#define LOOPBACK "127.0.0.1"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

// A port nothing listens on right now (the kernel's pick for port 0, released again).
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t n = sizeof(a);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    close(fd);
    return ntohs(a.sin_port);
}

#define assert_msg_has(err, needle)                                                                          \
    do {                                                                                                     \
        if (!strstr((err).msg, (needle)))                                                                    \
            fail_msg("the message should contain \"%s\": %s", (needle), (err).msg);                          \
        assert_null(strchr((err).msg, '\n'));                                                                \
    } while (0)

static struct kiln_store *open_server(int world, double timeout_s) {
    struct kiln_store *s = NULL;
    struct kiln_error err = {0};
    if (kiln_store_open(&s, LOOPBACK, 0, 1, world, timeout_s, &err))
        fail_msg("opening the server failed: %s", err.msg);
    assert_true(kiln_store_port(s) > 0);
    return s;
}

// ---- ranks as threads ---------------------------------------------------------------------------

// One rank of a test job. Threads cannot use cmocka's asserts: they record the first failure in msg.
struct rank {
    int rank, world, port;
    struct kiln_store *s; // rank 0's is opened (as the server) by the main thread
    unsigned char *big;   // (KILN_STORE_MAX_VALUE) rank 1 sets it, the others read it back
    int failed;
    char msg[1100];
    pthread_t thread;
};

#define RANK_CHECK(r, cond, ...)                                                                             \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            (r)->failed = 1;                                                                                 \
            snprintf((r)->msg, sizeof((r)->msg), __VA_ARGS__);                                               \
            goto out;                                                                                        \
        }                                                                                                    \
    } while (0)

static void *rank_main(void *arg) {
    struct rank *r = arg;
    struct kiln_error err = {0};
    char key[64], val[64], got[64];
    size_t n;
    if (!r->s)
        RANK_CHECK(r, kiln_store_open(&r->s, LOOPBACK, r->port, 0, r->world, 3.0, &err) == 0,
                   "rank %d open: %s", r->rank, err.msg);

    // everyone sets a key, meets the others, and reads everyone's
    snprintf(key, sizeof(key), "rank/%d", r->rank);
    snprintf(val, sizeof(val), "value of rank %d", r->rank);
    RANK_CHECK(r, kiln_store_set(r->s, key, val, strlen(val) + 1, &err) == 0, "rank %d set: %s", r->rank,
               err.msg);
    if (r->rank == 1)
        RANK_CHECK(r, kiln_store_set(r->s, "big", r->big, KILN_STORE_MAX_VALUE, &err) == 0, "set big: %s",
                   err.msg);
    RANK_CHECK(r, kiln_store_barrier(r->s, "after-set", 3.0, &err) == 0, "rank %d barrier: %s", r->rank,
               err.msg);
    for (int j = 0; j < r->world; j++) {
        snprintf(key, sizeof(key), "rank/%d", j);
        snprintf(val, sizeof(val), "value of rank %d", j);
        RANK_CHECK(r, kiln_store_get(r->s, key, got, sizeof(got), &n, 0, &err) == 0, "rank %d get %s: %s",
                   r->rank, key, err.msg);
        RANK_CHECK(r, n == strlen(val) + 1 && !strcmp(got, val), "rank %d read '%s' for %s", r->rank, got,
                   key);
    }
    unsigned char *big = malloc(KILN_STORE_MAX_VALUE);
    int ok = kiln_store_get(r->s, "big", big, KILN_STORE_MAX_VALUE, &n, 1.0, &err) == 0;
    int same = ok && n == KILN_STORE_MAX_VALUE && !memcmp(big, r->big, n);
    free(big);
    RANK_CHECK(r, ok, "rank %d get big: %s", r->rank, err.msg);
    RANK_CHECK(r, same, "rank %d: the 1 MiB value came back different", r->rank);

    // a counter, and the same barrier name used twice
    int64_t sum;
    RANK_CHECK(r, kiln_store_add(r->s, "counter", r->rank + 1, &sum, &err) == 0, "rank %d add: %s", r->rank,
               err.msg);
    RANK_CHECK(r, kiln_store_barrier(r->s, "again", 3.0, &err) == 0, "rank %d barrier: %s", r->rank, err.msg);
    RANK_CHECK(r, kiln_store_add(r->s, "counter", 0, &sum, &err) == 0, "rank %d add: %s", r->rank, err.msg);
    RANK_CHECK(r, sum == (int64_t)r->world * (r->world + 1) / 2, "rank %d: counter %lld", r->rank,
               (long long)sum);
    RANK_CHECK(r, kiln_store_barrier(r->s, "again", 3.0, &err) == 0, "rank %d barrier: %s", r->rank, err.msg);
out:
    if (r->rank != 0) { // rank 0's store (the server) is closed by the main thread
        kiln_store_close(r->s);
        r->s = NULL;
    }
    return NULL;
}

static void test_four_ranks_set_get_add_and_meet_at_barriers(void **state) {
    (void)state;
    uint64_t rng = test_seed() ^ 0x570e;
    enum { WORLD = 4 };
    unsigned char *big = malloc(KILN_STORE_MAX_VALUE);
    for (size_t i = 0; i < KILN_STORE_MAX_VALUE; i++)
        big[i] = (unsigned char)test_rand_u64(&rng);
    struct rank ranks[WORLD];
    memset(ranks, 0, sizeof(ranks));
    ranks[0].s = open_server(WORLD, 3.0);
    for (int r = 0; r < WORLD; r++) {
        ranks[r].rank = r;
        ranks[r].world = WORLD;
        ranks[r].port = kiln_store_port(ranks[0].s);
        ranks[r].big = big;
    }
    for (int r = 1; r < WORLD; r++)
        assert_int_equal(pthread_create(&ranks[r].thread, NULL, rank_main, &ranks[r]), 0);
    rank_main(&ranks[0]);
    for (int r = 1; r < WORLD; r++)
        pthread_join(ranks[r].thread, NULL);
    double t0 = now_s();
    kiln_store_close(ranks[0].s); // every rank came and went: no waiting
    assert_true(now_s() - t0 < 1.0);
    for (int r = 0; r < WORLD; r++)
        if (ranks[r].failed)
            fail_msg("%s", ranks[r].msg);
    free(big);
}

// The same job with ranks as processes: one server process, three client processes, one fork each.
static void test_four_processes_meet_through_one_server(void **state) {
    (void)state;
    enum { WORLD = 4 };
    // the clients are forked first (before the server's thread exists), and wait for it to come up
    int port = free_port();
    pid_t pids[WORLD];
    for (int r = 1; r < WORLD; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) {
            struct kiln_store *c;
            struct kiln_error err = {0};
            char key[32], got[32];
            size_t n;
            int rc = kiln_store_open(&c, LOOPBACK, port, 0, WORLD, 3.0, &err);
            snprintf(key, sizeof(key), "pid/%d", r);
            rc = rc ? rc : kiln_store_set(c, key, &r, sizeof(r), &err);
            rc = rc ? rc : kiln_store_barrier(c, "up", 3.0, &err);
            rc = rc ? rc : kiln_store_get(c, "from-0", got, sizeof(got), &n, 3.0, &err);
            rc = rc ? rc : (n == 6 && !memcmp(got, "hello", 6) ? 0 : 1);
            if (rc)
                fprintf(stderr, "rank %d: %s\n", r, err.msg);
            kiln_store_close(c);
            _exit(rc ? 1 : 0);
        }
    }
    struct kiln_store *s;
    struct kiln_error err = {0};
    if (kiln_store_open(&s, LOOPBACK, port, 1, WORLD, 3.0, &err))
        fail_msg("server: %s", err.msg);
    assert_int_equal(kiln_store_barrier(s, "up", 3.0, &err), 0);
    for (int r = 1; r < WORLD; r++) {
        char key[32];
        int v = -1;
        size_t n;
        snprintf(key, sizeof(key), "pid/%d", r);
        assert_int_equal(kiln_store_get(s, key, &v, sizeof(v), &n, 0, &err), 0);
        assert_int_equal(n, sizeof(v));
        assert_int_equal(v, r);
    }
    assert_int_equal(kiln_store_set(s, "from-0", "hello", 6, &err), 0);
    kiln_store_close(s); // waits for the three to read it and leave
    for (int r = 1; r < WORLD; r++) {
        int status;
        assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
}

struct later_get {
    int port;
    double elapsed;
    int rc;
    char got[32];
    size_t n;
    struct kiln_error err;
};

static void *later_get_main(void *arg) {
    struct later_get *g = arg;
    struct kiln_store *c;
    g->rc = kiln_store_open(&c, LOOPBACK, g->port, 0, 2, 3.0, &g->err);
    if (g->rc)
        return NULL;
    double t0 = now_s();
    g->rc = kiln_store_get(c, "late", g->got, sizeof(g->got), &g->n, 3.0, &g->err);
    g->elapsed = now_s() - t0;
    kiln_store_close(c);
    return NULL;
}

static void test_get_waits_for_a_later_set(void **state) {
    (void)state;
    struct kiln_store *s = open_server(2, 3.0);
    struct later_get g = {.port = kiln_store_port(s)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, later_get_main, &g), 0);
    sleep_s(0.3);
    struct kiln_error err = {0};
    assert_int_equal(kiln_store_set(s, "late", "finally", 8, &err), 0);
    pthread_join(t, NULL);
    if (g.rc)
        fail_msg("get: %s", g.err.msg);
    assert_int_equal(g.n, 8);
    assert_string_equal(g.got, "finally");
    assert_true(g.elapsed >= 0.15);
    assert_true(g.elapsed < 2.0);
    kiln_store_close(s);
}

static void test_get_of_a_key_never_set_times_out_naming_the_key(void **state) {
    (void)state;
    struct kiln_store *s = open_server(1, 2.0);
    struct kiln_error err = {0};
    char buf[8];
    size_t n;
    double t0 = now_s();
    assert_int_equal(kiln_store_get(s, "never/set", buf, sizeof(buf), &n, 0.4, &err), KILN_ERR_RUNTIME);
    double dt = now_s() - t0;
    assert_true(dt >= 0.35 && dt < 1.5);
    assert_msg_has(err, "'never/set'");
    assert_msg_has(err, "not set after waiting 0.");
    // timeout 0 only looks
    t0 = now_s();
    assert_int_equal(kiln_store_get(s, "never/set", buf, sizeof(buf), &n, 0, &err), KILN_ERR_RUNTIME);
    assert_true(now_s() - t0 < 0.5);
    // the connection is still good
    assert_int_equal(kiln_store_set(s, "k", "v", 1, &err), 0);
    assert_int_equal(kiln_store_get(s, "k", buf, sizeof(buf), &n, 0, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(buf[0], 'v');
    kiln_store_close(s);
}

struct barrier_rank {
    struct kiln_store *s;
    int port, rc;
    struct kiln_error err;
    double elapsed;
};

static void *barrier_main(void *arg) {
    struct barrier_rank *b = arg;
    if (!b->s && (b->rc = kiln_store_open(&b->s, LOOPBACK, b->port, 0, 3, 2.0, &b->err)))
        return NULL;
    double t0 = now_s();
    b->rc = kiln_store_barrier(b->s, "all-three", 0.5, &b->err);
    b->elapsed = now_s() - t0;
    return NULL;
}

static void test_a_barrier_short_of_ranks_says_how_many_arrived(void **state) {
    (void)state;
    // world 3, but only two ranks come
    struct barrier_rank b[2] = {{.s = open_server(3, 1.0)}, {0}};
    b[1].port = kiln_store_port(b[0].s);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, barrier_main, &b[1]), 0);
    barrier_main(&b[0]);
    pthread_join(t, NULL);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(b[i].rc, KILN_ERR_RUNTIME);
        assert_msg_has(b[i].err, "'all-three'");
        assert_msg_has(b[i].err, "2 of 3 ranks arrived");
        assert_true(b[i].elapsed >= 0.4 && b[i].elapsed < 2.0);
    }
    kiln_store_close(b[1].s);
    double t0 = now_s();
    kiln_store_close(b[0].s); // the third rank never connected: close waits its timeout (1 s), no longer
    double dt = now_s() - t0;
    assert_true(dt >= 0.9 && dt < 2.5);
}

static void test_a_client_without_a_server_fails_within_its_timeout(void **state) {
    (void)state;
    int port = free_port();
    struct kiln_store *c = (struct kiln_store *)1;
    struct kiln_error err = {0};
    double t0 = now_s();
    assert_int_equal(kiln_store_open(&c, LOOPBACK, port, 0, 2, 0.5, &err), KILN_ERR_RUNTIME);
    double dt = now_s() - t0;
    assert_null(c);
    assert_true(dt >= 0.45 && dt < 1.5);
    char where[64];
    snprintf(where, sizeof(where), "(127.0.0.1:%d)", port);
    assert_msg_has(err, where);
    assert_msg_has(err, "no connection after 0.");
    assert_msg_has(err, " s (last error: Connection refused)");
    assert_msg_has(err, "is rank 0 running? check MASTER_ADDR/MASTER_PORT");
}

struct late_client {
    int port, rc;
    struct kiln_error err;
    char got[16];
};

static void *late_client_main(void *arg) {
    struct late_client *l = arg;
    struct kiln_store *c;
    size_t n;
    if ((l->rc = kiln_store_open(&c, LOOPBACK, l->port, 0, 2, 3.0, &l->err)))
        return NULL;
    l->rc = kiln_store_get(c, "hi", l->got, sizeof(l->got), &n, 3.0, &l->err);
    kiln_store_close(c);
    return NULL;
}

static void test_a_client_waits_for_a_server_that_starts_later(void **state) {
    (void)state;
    struct late_client l = {.port = free_port()};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, late_client_main, &l), 0);
    sleep_s(0.3);
    struct kiln_store *s;
    struct kiln_error err = {0};
    if (kiln_store_open(&s, LOOPBACK, l.port, 1, 2, 3.0, &err))
        fail_msg("server: %s", err.msg);
    assert_int_equal(kiln_store_set(s, "hi", "there", 6, &err), 0);
    pthread_join(t, NULL);
    if (l.rc)
        fail_msg("client: %s", l.err.msg);
    assert_string_equal(l.got, "there");
    kiln_store_close(s);
}

static void test_a_wrong_port_fails_naming_the_port(void **state) {
    (void)state;
    struct kiln_store *s = open_server(1, 1.0);
    int wrong = free_port();
    assert_int_not_equal(wrong, kiln_store_port(s));
    struct kiln_store *c;
    struct kiln_error err = {0};
    double t0 = now_s();
    assert_int_equal(kiln_store_open(&c, LOOPBACK, wrong, 0, 2, 0.5, &err), KILN_ERR_RUNTIME);
    assert_true(now_s() - t0 < 1.5);
    char port[32];
    snprintf(port, sizeof(port), ":%d)", wrong);
    assert_msg_has(err, port);
    assert_msg_has(err, "MASTER_PORT");
    kiln_store_close(s);
}

static void test_a_port_in_use_is_a_usage_error(void **state) {
    (void)state;
    struct kiln_store *s = open_server(1, 1.0);
    int port = kiln_store_port(s);
    struct kiln_store *again;
    struct kiln_error err = {0};
    assert_int_equal(kiln_store_open(&again, LOOPBACK, port, 1, 1, 1.0, &err), KILN_ERR_USAGE);
    char where[64];
    snprintf(where, sizeof(where), "127.0.0.1:%d", port);
    assert_msg_has(err, where);
    assert_msg_has(err, "already in use");
    assert_msg_has(err, "MASTER_PORT");
    kiln_store_close(s);
}

struct killer {
    pid_t pid;
    double delay_s;
};

static void *killer_main(void *arg) {
    struct killer *k = arg;
    sleep_s(k->delay_s);
    kill(k->pid, SIGKILL);
    return NULL;
}

static void test_a_killed_server_fails_a_waiting_get(void **state) {
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { // rank 0: serves, tells the port, then waits to be killed
        close(fds[0]);
        struct kiln_store *s;
        struct kiln_error err = {0};
        int port = -1;
        if (kiln_store_open(&s, LOOPBACK, 0, 1, 2, 30.0, &err) == 0)
            port = kiln_store_port(s);
        if (write(fds[1], &port, sizeof(port)) != sizeof(port))
            _exit(1);
        for (;;)
            pause();
    }
    close(fds[1]);
    int port = -1;
    assert_int_equal(read(fds[0], &port, sizeof(port)), sizeof(port));
    close(fds[0]);
    assert_true(port > 0);
    struct kiln_store *c;
    struct kiln_error err = {0};
    if (kiln_store_open(&c, LOOPBACK, port, 0, 2, 3.0, &err))
        fail_msg("open: %s", err.msg);
    assert_int_equal(kiln_store_set(c, "before", "x", 1, &err), 0);

    struct killer k = {pid, 0.3};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, killer_main, &k), 0);
    char buf[8];
    size_t n;
    double t0 = now_s();
    assert_int_equal(kiln_store_get(c, "never", buf, sizeof(buf), &n, 3.0, &err), KILN_ERR_RUNTIME);
    double dt = now_s() - t0;
    pthread_join(t, NULL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    assert_true(dt >= 0.2 && dt < 2.0); // failed when the server died, well before the get's 3 s
    assert_msg_has(err, "'never'");
    char where[64];
    snprintf(where, sizeof(where), "127.0.0.1:%d", port);
    assert_msg_has(err, where);
    assert_msg_has(err, "rank 0 exited or crashed");
    // later calls fail at once
    t0 = now_s();
    assert_int_equal(kiln_store_set(c, "after", "y", 1, &err), KILN_ERR_RUNTIME);
    assert_true(now_s() - t0 < 0.5);
    assert_msg_has(err, "lost earlier");
    kiln_store_close(c);
}

// ---- limits and garbage -------------------------------------------------------------------------

static void test_keys_and_values_past_the_limits_are_refused(void **state) {
    (void)state;
    struct kiln_store *s = open_server(1, 2.0);
    struct kiln_error err = {0};
    char key[300];
    memset(key, 'k', sizeof(key));
    key[KILN_STORE_MAX_KEY] = '\0';
    assert_int_equal(kiln_store_set(s, key, "v", 1, &err), 0); // 255 bytes: fine
    key[KILN_STORE_MAX_KEY] = 'k';
    key[KILN_STORE_MAX_KEY + 1] = '\0';
    assert_int_equal(kiln_store_set(s, key, "v", 1, &err), KILN_ERR_USAGE);
    assert_msg_has(err, "256 bytes");
    assert_int_equal(kiln_store_set(s, "", "v", 1, &err), KILN_ERR_USAGE);
    unsigned char *big = calloc(1, KILN_STORE_MAX_VALUE + 1);
    assert_int_equal(kiln_store_set(s, "big", big, KILN_STORE_MAX_VALUE + 1, &err), KILN_ERR_USAGE);
    assert_msg_has(err, "'big'");
    assert_int_equal(kiln_store_set(s, "big", big, KILN_STORE_MAX_VALUE, &err), 0);
    assert_int_equal(kiln_store_set(s, "empty", NULL, 0, &err), 0);
    size_t n = 99;
    char small[16];
    assert_int_equal(kiln_store_get(s, "empty", small, sizeof(small), &n, 0, &err), 0);
    assert_int_equal(n, 0);
    // a value larger than the caller's buffer: an error naming the key, and the connection stays good
    assert_int_equal(kiln_store_get(s, "big", small, sizeof(small), &n, 0, &err), KILN_ERR_RUNTIME);
    assert_msg_has(err, "'big'");
    assert_int_equal(kiln_store_get(s, "big", big, KILN_STORE_MAX_VALUE, &n, 0, &err), 0);
    assert_int_equal(n, KILN_STORE_MAX_VALUE);
    // a counter on a key that holds something else
    assert_int_equal(kiln_store_add(s, "empty", 1, NULL, &err), KILN_ERR_RUNTIME);
    assert_msg_has(err, "not a counter");
    int64_t v;
    assert_int_equal(kiln_store_add(s, "c", -5, &v, &err), 0);
    assert_int_equal(v, -5);
    assert_int_equal(kiln_store_barrier(s, "", 1.0, &err), KILN_ERR_USAGE);
    free(big);
    kiln_store_close(s);
}

static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

// Reads until the server hangs up (at most 2 s): the bytes read, or -1 if it never hung up.
static long read_until_hangup(int fd, unsigned char *buf, size_t cap) {
    size_t got = 0;
    double deadline = now_s() + 2.0;
    while (now_s() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        unsigned char scratch[256];
        ssize_t k = recv(fd, got < cap ? buf + got : scratch, got < cap ? cap - got : sizeof(scratch), 0);
        if (k <= 0)
            return (long)got;
        if (got < cap)
            got += (size_t)k;
    }
    return -1;
}

static void test_garbage_on_the_wire_is_refused_and_the_server_carries_on(void **state) {
    (void)state;
    struct kiln_store *s = open_server(1, 2.0);
    int port = kiln_store_port(s);
    unsigned char reply[64];

    // not the protocol at all: hung up without a word
    int fd = raw_connect(port);
    const char *http = "GET / HTTP/1.0\r\n\r\n";
    assert_int_equal(send(fd, http, strlen(http), MSG_NOSIGNAL), (ssize_t)strlen(http));
    assert_int_equal(read_until_hangup(fd, reply, sizeof(reply)), 0);
    close(fd);

    // the magic, then lengths far past the limits: an error reply, then hung up
    unsigned char h[16] = {'K', 'S', 'R', 'Q', 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    fd = raw_connect(port);
    assert_int_equal(send(fd, h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    long n = read_until_hangup(fd, reply, sizeof(reply) - 1);
    close(fd);
    assert_true(n > 12);
    assert_memory_equal(reply, "KSRP", 4);
    reply[n] = '\0';
    assert_non_null(strstr((char *)reply + 12, "too large"));

    // a request before the hello; an unknown op
    unsigned char set[16] = {'K', 'S', 'R', 'Q', 2, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1};
    fd = raw_connect(port);
    assert_int_equal(send(fd, set, sizeof(set), MSG_NOSIGNAL), (ssize_t)sizeof(set));
    assert_true(read_until_hangup(fd, reply, sizeof(reply)) > 12);
    close(fd);
    unsigned char odd[16] = {'K', 'S', 'R', 'Q', 99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    fd = raw_connect(port);
    assert_int_equal(send(fd, odd, sizeof(odd), MSG_NOSIGNAL), (ssize_t)sizeof(odd));
    assert_true(read_until_hangup(fd, reply, sizeof(reply)) > 12);
    close(fd);

    // half a header, then gone; and random bytes
    uint64_t rng = test_seed() ^ 0x9a4b;
    fd = raw_connect(port);
    assert_int_equal(send(fd, h, 7, MSG_NOSIGNAL), 7);
    close(fd);
    for (int round = 0; round < 20; round++) {
        unsigned char junk[64];
        for (size_t i = 0; i < sizeof(junk); i++)
            junk[i] = (unsigned char)test_rand_u64(&rng);
        if (round % 2)
            memcpy(junk, "KSRQ", 4);
        fd = raw_connect(port);
        send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
        close(fd);
    }

    // the server still answers its ranks
    struct kiln_error err = {0};
    char buf[8];
    size_t got;
    assert_int_equal(kiln_store_set(s, "still", "ok", 3, &err), 0);
    assert_int_equal(kiln_store_get(s, "still", buf, sizeof(buf), &got, 0, &err), 0);
    assert_string_equal(buf, "ok");
    kiln_store_close(s);
}

// A listener that answers whatever it is sent with an HTTP error, as another service on MASTER_PORT would.
struct impostor {
    int fd;
};

static void *impostor_main(void *arg) {
    struct impostor *im = arg;
    int c = accept(im->fd, NULL, NULL);
    if (c >= 0) {
        const char *no = "HTTP/1.1 400 Bad Request\r\n\r\n";
        send(c, no, strlen(no), MSG_NOSIGNAL);
        sleep_s(0.2);
        close(c);
    }
    return NULL;
}

static void test_another_service_on_the_port_is_named_as_such(void **state) {
    (void)state;
    struct impostor im = {socket(AF_INET, SOCK_STREAM, 0)};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(im.fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(im.fd, 4), 0);
    socklen_t alen = sizeof(a);
    getsockname(im.fd, (struct sockaddr *)&a, &alen);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, impostor_main, &im), 0);
    struct kiln_store *c;
    struct kiln_error err = {0};
    double t0 = now_s();
    assert_int_equal(kiln_store_open(&c, LOOPBACK, ntohs(a.sin_port), 0, 2, 1.0, &err), KILN_ERR_RUNTIME);
    assert_true(now_s() - t0 < 2.0);
    assert_msg_has(err, "another service");
    pthread_join(t, NULL);
    close(im.fd);
}

static void test_ranks_of_another_world_size_are_turned_away(void **state) {
    (void)state;
    struct kiln_store *s = open_server(2, 0.3); // the close waits 0.3 s for the rank that never joined
    struct kiln_store *c;
    struct kiln_error err = {0};
    assert_int_not_equal(kiln_store_open(&c, LOOPBACK, kiln_store_port(s), 0, 3, 1.0, &err), 0);
    assert_msg_has(err, "world of 2");
    assert_msg_has(err, "this rank's is 3");
    kiln_store_close(s);
}

struct leaver {
    int port, rc;
    struct kiln_error err;
};

static void *leaver_main(void *arg) {
    struct leaver *l = arg;
    struct kiln_store *c;
    if ((l->rc = kiln_store_open(&c, LOOPBACK, l->port, 0, 2, 2.0, &l->err)))
        return NULL;
    sleep_s(0.4);
    kiln_store_close(c);
    return NULL;
}

static void test_the_server_closes_once_every_rank_has_left(void **state) {
    (void)state;
    struct kiln_store *s = open_server(2, 3.0);
    struct leaver l = {.port = kiln_store_port(s)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, leaver_main, &l), 0);
    double t0 = now_s();
    kiln_store_close(s); // waits for the other rank to come and go (~0.4 s), not the 3 s timeout
    double dt = now_s() - t0;
    pthread_join(t, NULL);
    if (l.rc)
        fail_msg("client: %s", l.err.msg);
    assert_true(dt >= 0.3 && dt < 2.0);
    kiln_store_close(NULL);
}

// kiln launch polls keys that may never be set (another node's failure): not being set is no error there.
static void test_try_get_reports_an_unset_key_without_an_error(void **state) {
    (void)state;
    struct kiln_store *s = open_server(1, 3.0);
    struct kiln_error err = {0};
    char buf[16];
    size_t n = 99;
    int found = -1;
    double t0 = now_s();
    assert_int_equal(kiln_store_try_get(s, "never", buf, sizeof(buf), &n, 0.2, &found, &err), 0);
    assert_int_equal(found, 0);
    assert_int_equal(n, 0);
    assert_true(now_s() - t0 >= 0.15);
    assert_int_equal(kiln_store_set(s, "k", "abc", 3, &err), 0);
    assert_int_equal(kiln_store_try_get(s, "k", buf, sizeof(buf), &n, 0, &found, &err), 0);
    assert_int_equal(found, 1);
    assert_int_equal(n, 3);
    assert_memory_equal(buf, "abc", 3);
    char addr[64];
    assert_int_equal(kiln_store_local_addr(s, addr, sizeof(addr)), 0); // rank 0 reaches itself over loopback
    assert_string_equal(addr, LOOPBACK);
    kiln_store_close(s);
}

// kiln_store_close_now does not wait for ranks that never came; a client then finds the store gone.
static void test_close_now_stops_the_server_at_once(void **state) {
    (void)state;
    struct kiln_store *s = open_server(3, 5.0);
    int port = kiln_store_port(s);
    struct kiln_store *c = NULL;
    struct kiln_error err = {0};
    if (kiln_store_open(&c, LOOPBACK, port, 0, 3, 2.0, &err))
        fail_msg("client: %s", err.msg);
    double t0 = now_s();
    kiln_store_close_now(s); // the third rank never came: kiln_store_close would wait 5 s for it
    assert_true(now_s() - t0 < 1.0);
    int64_t v;
    assert_int_not_equal(kiln_store_add(c, "x", 1, &v, &err), 0);
    assert_msg_has(err, "TCP store at 127.0.0.1");
    assert_int_equal(kiln_store_local_addr(c, (char[64]){0}, 64), -1);
    kiln_store_close(c);
    kiln_store_close_now(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_try_get_reports_an_unset_key_without_an_error),
        cmocka_unit_test(test_close_now_stops_the_server_at_once),

        cmocka_unit_test(test_four_ranks_set_get_add_and_meet_at_barriers),
        cmocka_unit_test(test_four_processes_meet_through_one_server),
        cmocka_unit_test(test_get_waits_for_a_later_set),
        cmocka_unit_test(test_get_of_a_key_never_set_times_out_naming_the_key),
        cmocka_unit_test(test_a_barrier_short_of_ranks_says_how_many_arrived),
        cmocka_unit_test(test_a_client_without_a_server_fails_within_its_timeout),
        cmocka_unit_test(test_a_client_waits_for_a_server_that_starts_later),
        cmocka_unit_test(test_a_wrong_port_fails_naming_the_port),
        cmocka_unit_test(test_a_port_in_use_is_a_usage_error),
        cmocka_unit_test(test_a_killed_server_fails_a_waiting_get),
        cmocka_unit_test(test_keys_and_values_past_the_limits_are_refused),
        cmocka_unit_test(test_garbage_on_the_wire_is_refused_and_the_server_carries_on),
        cmocka_unit_test(test_another_service_on_the_port_is_named_as_such),
        cmocka_unit_test(test_ranks_of_another_world_size_are_turned_away),
        cmocka_unit_test(test_the_server_closes_once_every_rank_has_left),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
