// The comm layer's operations under mpirun (ctest runs this at 2, 3 and 4 ranks; label mpi): every collective
// on host memory against values each rank can compute alone, with counts the ranks do not divide, in place
// and not, asynchronous operations awaited out of order, a duplicate communicator interleaved with its
// parent, and sub-groups from kiln_comm_split. Prints "N passed, N failed" on rank 0; the exit status is the
// failures'.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "parallel/comm/comm.h"
#include "parallel/comm/env.h"

static int passed, failed, rank;

static void check(int ok, const char *what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "[rank %d] FAIL: %s\n", rank, what);
    }
}

// element i of rank r's send buffer
static float val(int r, size_t i) {
    return (float)(r + 1) * 0.5f + (float)(i % 97);
}

static void test_reductions(struct kiln_comm *c, size_t n) {
    int W = c->size;
    float *x = kiln_xmalloc(n * sizeof(float)), *y = kiln_xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = val(c->rank, i);
    // all-reduce, out of place, then in place
    struct kiln_coll k = {.op = KILN_COLL_ALL_REDUCE, .send = x, .recv = y, .count = n, .dtype = KILN_F32};
    kiln_comm_wait(c, kiln_comm_submit(c, &k, NULL));
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < W; r++)
            want += val(r, i);
        ok &= fabsf(y[i] - want) <= 1e-5f * fabsf(want);
    }
    check(ok, "all_reduce out of place");
    k.recv = x;
    kiln_comm_wait(c, kiln_comm_submit(c, &k, NULL));
    check(memcmp(x, y, n * sizeof(float)) == 0, "all_reduce in place equals out of place, bit for bit");
    // reduce-scatter in place onto this rank's slice: the same sums as the all-reduce's
    for (size_t i = 0; i < n; i++)
        x[i] = val(c->rank, i);
    size_t lo, hi;
    kiln_comm_slice(n, W, c->rank, &lo, &hi);
    struct kiln_coll rs = {
        .op = KILN_COLL_REDUCE_SCATTER, .send = x, .recv = x + lo, .count = n, .dtype = KILN_F32};
    kiln_comm_wait(c, kiln_comm_submit(c, &rs, NULL));
    check(memcmp(x + lo, y + lo, (hi - lo) * sizeof(float)) == 0,
          "reduce_scatter gives the all_reduce's slice");
    // all-gather in place around the slice: the whole all-reduce result again
    struct kiln_coll ag = {
        .op = KILN_COLL_ALL_GATHER, .send = x + lo, .recv = x, .count = n, .dtype = KILN_F32};
    kiln_comm_wait(c, kiln_comm_submit(c, &ag, NULL));
    check(memcmp(x, y, n * sizeof(float)) == 0, "all_gather of the slices rebuilds the all_reduce");
    free(x);
    free(y);
}

static void test_others(struct kiln_comm *c) {
    int W = c->size, r = c->rank;
    // max and min over f64 and i32
    double d = r + 0.25;
    kiln_comm_all_reduce_host(c, &d, 1, KILN_F64, KILN_RED_MAX);
    check(d == W - 1 + 0.25, "f64 max");
    int32_t m = 10 - r;
    kiln_comm_all_reduce_host(c, &m, 1, KILN_I32, KILN_RED_MIN);
    check(m == 10 - (W - 1), "i32 min");
    // broadcast from the last rank
    char msg[32];
    snprintf(msg, sizeof(msg), "from rank %d", r);
    kiln_comm_broadcast_host(c, msg, sizeof(msg), W - 1);
    char want[32];
    snprintf(want, sizeof(want), "from rank %d", W - 1);
    check(!strcmp(msg, want), "broadcast from the last rank");
    // all-to-all: block j of rank r's send is r*100+j; recv block j is rank j's block r
    int32_t *s = kiln_xmalloc((size_t)W * 2 * sizeof(int32_t)),
            *t = kiln_xmalloc((size_t)W * 2 * sizeof(int32_t));
    for (int j = 0; j < W; j++)
        s[2 * j] = s[2 * j + 1] = r * 100 + j;
    struct kiln_coll a2a = {.op = KILN_COLL_ALL_TO_ALL, .send = s, .recv = t, .count = 2, .dtype = KILN_I32};
    kiln_comm_wait(c, kiln_comm_submit(c, &a2a, NULL));
    int ok = 1;
    for (int j = 0; j < W; j++)
        ok &= t[2 * j] == j * 100 + r && t[2 * j + 1] == j * 100 + r;
    check(ok, "all_to_all");
    free(s);
    free(t);
    // a ring of send/recv: even ranks send first, odd ranks receive first (no cycle of waits)
    int32_t out = r * 7, in = -1;
    int next = (r + 1) % W, prev = (r + W - 1) % W;
    struct kiln_coll snd = {.op = KILN_COLL_SEND, .send = &out, .count = 1, .dtype = KILN_I32, .peer = next};
    struct kiln_coll rcv = {.op = KILN_COLL_RECV, .recv = &in, .count = 1, .dtype = KILN_I32, .peer = prev};
    if (W > 1) {
        struct kiln_comm_work *w1 = kiln_comm_submit(c, r % 2 ? &rcv : &snd, NULL);
        kiln_comm_wait(c, w1);
        struct kiln_comm_work *w2 = kiln_comm_submit(c, r % 2 ? &snd : &rcv, NULL);
        kiln_comm_wait(c, w2);
        check(in == prev * 7, "send/recv around a ring");
    }
    // send_recv: every rank sends and receives at once around the ring, with messages far past MPI's eager
    // limit, as ring attention does (separate sends and receives in that order would wait in a cycle)
    {
        size_t n = 1 << 20;
        float *so = kiln_xmalloc(n * sizeof(float)), *ri = kiln_xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            so[i] = (float)(r * 1000003 + i % 9973);
        struct kiln_coll sr = {.op = KILN_COLL_SEND_RECV, .send = so, .recv = ri, .count = n,
                               .dtype = KILN_F32, .peer = next, .src = prev};
        kiln_comm_wait(c, kiln_comm_submit(c, &sr, NULL));
        int same = 1;
        for (size_t i = 0; i < n; i++)
            same &= ri[i] == (float)(prev * 1000003 + i % 9973);
        check(same, "send_recv around a ring (4 MiB each)");
        free(so);
        free(ri);
    }
    kiln_comm_barrier(c);
    // three operations in flight, awaited in reverse order
    float a[3] = {1, 2, 3};
    struct kiln_comm_work *w[3];
    for (int i = 0; i < 3; i++) {
        struct kiln_coll k = {
            .op = KILN_COLL_ALL_REDUCE, .send = &a[i], .recv = &a[i], .count = 1, .dtype = KILN_F32};
        w[i] = kiln_comm_submit(c, &k, NULL);
    }
    for (int i = 2; i >= 0; i--)
        kiln_comm_wait(c, w[i]);
    check(a[0] == W && a[1] == 2 * W && a[2] == 3 * W, "asynchronous operations awaited out of order");
}

int main(void) {
    struct kiln_dist_env env;
    struct kiln_error err = {0};
    if (kiln_dist_env_read(&env, NULL, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    rank = env.rank;
    struct kiln_comm *c, *dup, *sub;
    struct kiln_comm_open_opts o = {.kind = KILN_COMM_MPI, .timeout_s = 30};
    if (kiln_comm_open_world(&env, &o, &c, &err) || kiln_comm_dup(c, &dup, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    check(c->rank == env.rank && c->size == env.world, "the world communicator's rank and size");
    size_t counts[] = {1, 7, 1000, 65537};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
        test_reductions(c, counts[i]);
    test_others(c);
    // the duplicate: its own queue, interleaved with the parent's operations
    double x = 1, y = 2;
    struct kiln_coll kx = {.op = KILN_COLL_ALL_REDUCE, .send = &x, .recv = &x, .count = 1, .dtype = KILN_F64};
    struct kiln_coll ky = {.op = KILN_COLL_ALL_REDUCE, .send = &y, .recv = &y, .count = 1, .dtype = KILN_F64};
    struct kiln_comm_work *wx = kiln_comm_submit(dup, &kx, NULL), *wy = kiln_comm_submit(c, &ky, NULL);
    kiln_comm_wait(c, wy);
    kiln_comm_wait(dup, wx);
    check(x == env.world && y == 2.0 * env.world, "a duplicate communicator beside its parent");
    // sub-groups: even and odd ranks, ordered by descending world rank
    if (kiln_comm_split(c, env.rank % 2, -env.rank, &sub, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    int group = (env.world + 1 - env.rank % 2) / 2; // ranks with this parity
    check(sub->size == group, "sub-group size");
    int above = 0; // ranks of the same parity above this one come first
    for (int q = env.rank + 2; q < env.world; q += 2)
        above++;
    check(sub->rank == above, "sub-group rank ordered by key");
    double s = env.rank;
    kiln_comm_all_reduce_host(sub, &s, 1, KILN_F64, KILN_RED_SUM);
    double want = 0;
    for (int q = env.rank % 2; q < env.world; q += 2)
        want += q;
    check(s == want, "all_reduce within a sub-group");
    test_reductions(sub, 1001);
    // a split that asks for the copy engines (NCCL's zero-CTA policy) is an ordinary group here, and MPI has
    // no symmetric windows: the caller allocates as usual
    struct kiln_comm *ce = NULL;
    if (kiln_comm_split_flags(c, 0, env.rank, KILN_COMM_SPLIT_COPY_ENGINE, &ce, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    check(ce->size == env.world && ce->rank == env.rank, "a copy-engine split of every rank");
    test_reductions(ce, 77);
    check(kiln_comm_window_alloc(ce, 4096) == NULL, "no symmetric window over MPI");
    kiln_comm_window_free(ce, NULL);
    kiln_comm_close(ce);
    int32_t f = failed;
    kiln_comm_all_reduce_host(c, &f, 1, KILN_I32, KILN_RED_SUM);
    if (env.rank == 0)
        printf("%d passed, %d failed\n", passed, f);
    kiln_comm_close(sub);
    kiln_comm_close(dup);
    kiln_comm_close(c);
    return f ? 1 : 0;
}
