// The loader: windows, epochs, rank partition, exact resume, prefetch transparency, and open-time checks.
// Shards hold token i = its global index (uint32 layout, no vocab check), so a window is identified by its
// first input token, and inputs/targets can be checked against the data exactly.
#include "test_util.h"

#include "data/loader.h"
#include "data/shards.h"
#include "util/error.h"

struct fixture {
    char dir[256], pattern[320];
    int n_shards;
    uint64_t sizes[8], first[8]; // tokens per shard, global index of each shard's first token
    uint64_t W;                  // expected windows
    int T;
};

// Writes 1..8 shards of random sizes (some too short for a window), token = global index.
static void make_shards(struct fixture *fx, int T, uint64_t *s) {
    test_tmpdir(fx->dir, sizeof(fx->dir));
    snprintf(fx->pattern, sizeof(fx->pattern), "%s/train_*.bin", fx->dir);
    fx->n_shards = 1 + (int)(test_rand_u64(s) % 8);
    fx->T = T;
    fx->W = 0;
    uint64_t g = 0;
    for (int i = 0; i < fx->n_shards; i++) {
        uint64_t n =
            (i % 3 == 2) ? test_rand_u64(s) % (uint64_t)(T + 1) : (uint64_t)T + 1 + test_rand_u64(s) % 400;
        int32_t *tok = malloc(sizeof(int32_t) * (n + 1));
        for (uint64_t k = 0; k < n; k++)
            tok[k] = (int32_t)(g + k);
        char path[400];
        snprintf(path, sizeof(path), "%s/train_%06d.bin", fx->dir, i);
        struct kiln_error err;
        assert_int_equal(kiln_shard_write(path, tok, (size_t)n, 4, NULL, &err), 0);
        free(tok);
        fx->sizes[i] = n;
        fx->first[i] = g;
        fx->W += n > (uint64_t)T ? (n - 1) / (uint64_t)T : 0;
        g += n;
    }
    if (fx->W == 0) { // make sure there is at least one window
        fx->n_shards = 0;
        test_rmrf(fx->dir);
        make_shards(fx, T, s);
    }
}

static struct kiln_loader *open_loader(const struct fixture *fx, int B, int rank, int world, int shuffle,
                                       int prefetch, uint64_t seed) {
    struct kiln_loader_opts o = {.B = B,
                                 .T = fx->T,
                                 .seed = seed,
                                 .rank = rank,
                                 .world = world,
                                 .shuffle = shuffle,
                                 .prefetch = prefetch,
                                 .vocab_size = 0};
    struct kiln_loader *l;
    struct kiln_error err = {0};
    if (kiln_loader_open_files(&l, fx->pattern, &o, &err))
        fail_msg("open: %s", err.msg);
    return l;
}

// Window id = index among all windows in order (shard order, then offset), from its first token.
static uint64_t window_id(const struct fixture *fx, int32_t first_token) {
    uint64_t w = 0;
    for (int i = 0; i < fx->n_shards; i++) {
        uint64_t nw = fx->sizes[i] > (uint64_t)fx->T ? (fx->sizes[i] - 1) / (uint64_t)fx->T : 0;
        if ((uint64_t)first_token >= fx->first[i] && (uint64_t)first_token < fx->first[i] + fx->sizes[i]) {
            uint64_t off = (uint64_t)first_token - fx->first[i];
            assert_int_equal(off % (uint64_t)fx->T, 0); // windows start at multiples of T
            assert_true(off / (uint64_t)fx->T < nw);
            return w + off / (uint64_t)fx->T;
        }
        w += nw;
    }
    fail_msg("token %d is in no shard", first_token);
    return 0;
}

// Checks a batch is made of whole windows (targets = inputs shifted by one, inside one shard); returns ids.
static void batch_windows(const struct fixture *fx, const int32_t *in, const int32_t *tgt, int B,
                          uint64_t *ids) {
    for (int b = 0; b < B; b++) {
        const int32_t *x = in + (size_t)b * fx->T, *y = tgt + (size_t)b * fx->T;
        for (int t = 0; t < fx->T; t++) {
            assert_int_equal(x[t], x[0] + t);
            assert_int_equal(y[t], x[t] + 1);
        }
        ids[b] = window_id(fx, x[0]);
    }
}

static void test_loader_covers_every_window_once_per_epoch_across_ranks(void **state) {
    uint64_t s = test_seed();
    int worlds[] = {1, 2, 3, 8};
    for (int wi = 0; wi < 4; wi++) {
        struct fixture fx;
        make_shards(&fx, 1 + (int)(test_rand_u64(&s) % 16), &s);
        int world = worlds[wi];
        uint64_t seed = test_rand_u64(&s);
        int *count = calloc(2 * fx.W, sizeof(int)); // epochs 0 and 1
        int32_t *in = malloc(sizeof(int32_t) * (size_t)fx.T), *tgt = malloc(sizeof(int32_t) * (size_t)fx.T);
        for (int r = 0; r < world; r++) {
            struct kiln_loader *l = open_loader(&fx, 1, r, world, 1, r % 2, seed);
            assert_int_equal(kiln_loader_num_windows(l), fx.W);
            // rank r takes global stream elements r, r+world, ...: those below 2W are epochs 0 and 1
            for (uint64_t g = (uint64_t)r; g < 2 * fx.W; g += (uint64_t)world) {
                struct kiln_loader_state st;
                kiln_loader_get_state(l, &st);
                assert_int_equal(kiln_loader_next(l, in, tgt), 0);
                uint64_t id;
                batch_windows(&fx, in, tgt, 1, &id);
                assert_int_equal(id, kiln_loader_stream_window(l, g));
                count[(g / fx.W) * fx.W + id]++;
            }
            kiln_loader_close(l);
        }
        for (uint64_t i = 0; i < 2 * fx.W; i++)
            if (count[i] != 1)
                fail_msg("world %d: window %llu of epoch %llu seen %d times", world,
                         (unsigned long long)(i % fx.W), (unsigned long long)(i / fx.W), count[i]);
        free(count);
        free(in);
        free(tgt);
        test_rmrf(fx.dir);
    }
}

static void test_loader_batches_are_consecutive_windows_of_the_rank_stream(void **state) {
    uint64_t s = test_seed() ^ 5;
    struct fixture fx;
    make_shards(&fx, 8, &s);
    int B = 1 + (int)(test_rand_u64(&s) % 5), world = 3, rank = 1;
    struct kiln_loader *l = open_loader(&fx, B, rank, world, 1, 1, 42);
    size_t bt = (size_t)B * 8;
    int32_t *in = malloc(sizeof(int32_t) * bt), *tgt = malloc(sizeof(int32_t) * bt);
    uint64_t ids[8];
    for (uint64_t k = 0; k < 3 * fx.W / (uint64_t)B + 2; k++) { // crosses epoch boundaries
        kiln_loader_next(l, in, tgt);
        batch_windows(&fx, in, tgt, B, ids);
        for (int b = 0; b < B; b++)
            assert_int_equal(ids[b],
                             kiln_loader_stream_window(l, (uint64_t)rank + (k * (uint64_t)B + (uint64_t)b) *
                                                                               (uint64_t)world));
    }
    kiln_loader_close(l);
    free(in);
    free(tgt);
    test_rmrf(fx.dir);
}

static void test_loader_shuffle_is_a_seeded_permutation_per_epoch(void **state) {
    uint64_t s = test_seed() ^ 9;
    struct fixture fx = {0};
    do {
        if (fx.n_shards)
            test_rmrf(fx.dir);
        make_shards(&fx, 2, &s);
    } while (fx.W < 50);
    struct kiln_loader *a = open_loader(&fx, 1, 0, 1, 1, 0, 7), *b = open_loader(&fx, 1, 0, 1, 1, 0, 8);
    struct kiln_loader *plain = open_loader(&fx, 1, 0, 1, 0, 0, 7);
    int moved = 0, differs_epoch = 0, differs_seed = 0;
    for (uint64_t i = 0; i < fx.W; i++) {
        assert_int_equal(kiln_loader_stream_window(plain, i), i); // identity without shuffle
        assert_int_equal(kiln_loader_stream_window(plain, fx.W + i), i);
        moved += kiln_loader_stream_window(a, i) != i;
        differs_epoch += kiln_loader_stream_window(a, i) != kiln_loader_stream_window(a, fx.W + i);
        differs_seed += kiln_loader_stream_window(a, i) != kiln_loader_stream_window(b, i);
    }
    // a fixed point count near W would mean no shuffle; for a random permutation it is about 1
    assert_true(moved > (int)fx.W / 2);
    assert_true(differs_epoch > (int)fx.W / 2);
    assert_true(differs_seed > (int)fx.W / 2);
    kiln_loader_close(a);
    kiln_loader_close(b);
    kiln_loader_close(plain);
    test_rmrf(fx.dir);
}

// Takes n batches, appending their inputs to out (out advances).
static void take(struct kiln_loader *l, int n, size_t bt, int32_t **out) {
    int32_t *tgt = malloc(sizeof(int32_t) * bt);
    for (int i = 0; i < n; i++) {
        kiln_loader_next(l, *out, tgt);
        *out += bt;
    }
    free(tgt);
}

static void test_loader_resume_equals_an_uninterrupted_pass(void **state) {
    uint64_t s = test_seed() ^ 11;
    struct fixture fx;
    make_shards(&fx, 4, &s);
    int B = 1 + (int)(test_rand_u64(&s) % 4), n1 = 1 + (int)(test_rand_u64(&s) % 40), n2 = 30;
    size_t bt = (size_t)B * 4;
    for (int world = 1; world <= 2; world++) {
        for (int r = 0; r < world; r++) {
            int32_t *full = malloc(sizeof(int32_t) * bt * (size_t)(n1 + n2)), *p = full;
            struct kiln_loader *l = open_loader(&fx, B, r, world, 1, 1, 3);
            take(l, n1 + n2, bt, &p);
            kiln_loader_close(l);

            int32_t *part = malloc(sizeof(int32_t) * bt * (size_t)(n1 + n2));
            p = part;
            l = open_loader(&fx, B, r, world, 1, 0, 3);
            take(l, n1, bt, &p);
            struct kiln_loader_state st;
            kiln_loader_get_state(l, &st);
            kiln_loader_close(l);
            assert_int_equal(st.epoch * fx.W + st.position, (uint64_t)n1 * (uint64_t)B * (uint64_t)world);
            l = open_loader(&fx, B, r, world, 1, 1, 3); // fresh process, prefetch on this time
            struct kiln_error err;
            assert_int_equal(kiln_loader_set_state(l, &st, &err), 0);
            take(l, n2, bt, &p);
            assert_memory_equal(part, full, sizeof(int32_t) * bt * (size_t)(n1 + n2));
            // reset returns to the start
            kiln_loader_reset(l);
            p = part;
            take(l, 1, bt, &p);
            assert_memory_equal(part, full, sizeof(int32_t) * bt);
            kiln_loader_close(l);
            free(full);
            free(part);
        }
    }
    test_rmrf(fx.dir);
}

static void test_loader_resume_on_another_world_size_continues_the_stream(void **state) {
    uint64_t s = test_seed() ^ 13;
    struct fixture fx;
    make_shards(&fx, 3, &s);
    // 2 ranks take 5 batches of B=2; then 3 ranks resume: rank r's k-th window is stream element P + r + 3k
    struct kiln_loader *l = open_loader(&fx, 2, 0, 2, 1, 0, 5);
    int32_t in[6], tgt[6];
    for (int i = 0; i < 5; i++)
        kiln_loader_next(l, in, tgt);
    struct kiln_loader_state st;
    kiln_loader_get_state(l, &st);
    kiln_loader_close(l);
    uint64_t P = st.epoch * fx.W + st.position;
    assert_int_equal(P, 20);
    for (int r = 0; r < 3; r++) {
        l = open_loader(&fx, 1, r, 3, 1, 0, 5);
        struct kiln_error err;
        assert_int_equal(kiln_loader_set_state(l, &st, &err), 0);
        for (uint64_t k = 0; k < 4; k++) {
            kiln_loader_next(l, in, tgt);
            uint64_t id;
            batch_windows(&fx, in, tgt, 1, &id);
            assert_int_equal(id, kiln_loader_stream_window(l, P + (uint64_t)r + 3 * k));
        }
        kiln_loader_close(l);
    }
    test_rmrf(fx.dir);
}

static void test_loader_prefetch_does_not_change_results(void **state) {
    uint64_t s = test_seed() ^ 17;
    struct fixture fx;
    make_shards(&fx, 5, &s);
    size_t bt = 3 * 5;
    int n = 50;
    int32_t *a = malloc(sizeof(int32_t) * bt * (size_t)n * 2),
            *b = malloc(sizeof(int32_t) * bt * (size_t)n * 2);
    int32_t *pa = a, *pb = b;
    struct kiln_loader *la = open_loader(&fx, 3, 1, 2, 1, 0, 9), *lb = open_loader(&fx, 3, 1, 2, 1, 1, 9);
    take(la, n, bt, &pa);
    take(lb, n, bt, &pb);
    struct kiln_loader_state st = {.epoch = 1, .position = fx.W / 2};
    struct kiln_error err;
    assert_int_equal(kiln_loader_set_state(la, &st, &err), 0);
    assert_int_equal(kiln_loader_set_state(lb, &st, &err), 0);
    take(la, n, bt, &pa);
    take(lb, n, bt, &pb);
    assert_memory_equal(a, b, sizeof(int32_t) * bt * (size_t)n * 2);
    kiln_loader_close(la);
    kiln_loader_close(lb);
    free(a);
    free(b);
    test_rmrf(fx.dir);
}

static void test_loader_open_errors_name_the_problem(void **state) {
    char dir[256], path[300], pat[300];
    test_tmpdir(dir, sizeof(dir));
    struct kiln_loader *l;
    struct kiln_error err = {0};
    struct kiln_loader_opts o = {.B = 2, .T = 8, .rank = 0, .world = 1, .shuffle = 1, .vocab_size = 50257};
    snprintf(pat, sizeof(pat), "%s/*.bin", dir);
    assert_int_equal(kiln_loader_open_files(&l, pat, &o, &err), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "no data files match"));

    int32_t tok[100];
    for (int i = 0; i < 100; i++)
        tok[i] = i;
    tok[57] = 50300;
    snprintf(path, sizeof(path), "%s/train_000001.bin", dir);
    assert_int_equal(kiln_shard_write(path, tok, 100, 2, NULL, &err), 0);
    char want[600];
    snprintf(want, sizeof(want),
             "token id 50300 >= vocab size 50257 (shard %s, token offset 57): the shard was "
             "made with a different tokenizer; re-run kiln tokenize",
             path);
    assert_int_equal(kiln_loader_open_files(&l, pat, &o, &err), KILN_ERR_RUNTIME);
    assert_string_equal(err.msg, want);
    assert_int_equal(kiln_loader_open_memory(&l, tok, 100, &o, &err), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "token offset 57"));

    tok[57] = 57;
    o.T = 100; // 100 tokens hold no window of 101
    assert_int_equal(kiln_shard_write(path, tok, 100, 2, NULL, &err), 0);
    assert_int_equal(kiln_loader_open_files(&l, pat, &o, &err), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "no training windows"));
    o.T = 99; // exactly one
    assert_int_equal(kiln_loader_open_files(&l, pat, &o, &err), 0);
    assert_int_equal(kiln_loader_num_windows(l), 1);
    assert_int_equal(kiln_loader_num_tokens(l), 100);
    struct kiln_loader_state st = {.epoch = 0, .position = 1};
    assert_int_equal(kiln_loader_set_state(l, &st, &err), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "bad loader state"));
    kiln_loader_close(l);

    o.rank = 2;
    o.world = 2;
    assert_int_equal(kiln_loader_open_memory(&l, tok, 100, &o, &err), KILN_ERR_USAGE);
    assert_string_equal(err.msg, "bad loader rank (rank 2 of world 2): need 0 <= rank < world");
    test_rmrf(dir);
}

static void test_loader_reads_memory_and_npy_sources(void **state) {
    uint64_t s = test_seed() ^ 23;
    size_t n = 200 + test_rand_u64(&s) % 500;
    int32_t *tok = malloc(sizeof(int32_t) * n);
    for (size_t i = 0; i < n; i++)
        tok[i] = (int32_t)(test_rand_u64(&s) % 1000);
    struct kiln_loader_opts o = {.B = 2, .T = 16, .rank = 0, .world = 1, .shuffle = 0, .vocab_size = 1000};
    struct kiln_loader *l;
    struct kiln_error err;
    assert_int_equal(kiln_loader_open_memory(&l, tok, n, &o, &err), 0);
    assert_int_equal(kiln_loader_num_windows(l), (n - 1) / 16);
    int32_t in[32], tgt[32];
    kiln_loader_next(l, in, tgt); // sequential: windows 0 and 1
    assert_memory_equal(in, tok, sizeof(int32_t) * 32);
    assert_memory_equal(tgt, tok + 1, sizeof(int32_t) * 16);
    assert_memory_equal(tgt + 16, tok + 17, sizeof(int32_t) * 16);
    kiln_loader_close(l);
    // the same tokens as a .npy
    char dir[256], path[300];
    test_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/part-0.npy", dir);
    uint16_t *u = malloc(2 * n);
    for (size_t i = 0; i < n; i++)
        u[i] = (uint16_t)tok[i];
    FILE *f = fopen(path, "wb");
    char h[128];
    int hl = snprintf(h, sizeof(h), "{'descr': '<u2', 'fortran_order': False, 'shape': (%zu,), }", n);
    int len = 10 + hl + 1, pad = (64 - len % 64) % 64;
    unsigned short hlen = (unsigned short)(hl + 1 + pad);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fwrite(&hlen, 2, 1, f);
    fwrite(h, 1, (size_t)hl, f);
    for (int i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
    fwrite(u, 2, n, f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/*.npy", dir);
    assert_int_equal(kiln_loader_open_files(&l, path, &o, &err), 0);
    int32_t in2[32], tgt2[32];
    kiln_loader_next(l, in2, tgt2);
    assert_memory_equal(in2, tok, sizeof(int32_t) * 32);
    kiln_loader_close(l);
    free(u);
    free(tok);
    test_rmrf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loader_covers_every_window_once_per_epoch_across_ranks),
        cmocka_unit_test(test_loader_batches_are_consecutive_windows_of_the_rank_stream),
        cmocka_unit_test(test_loader_shuffle_is_a_seeded_permutation_per_epoch),
        cmocka_unit_test(test_loader_resume_equals_an_uninterrupted_pass),
        cmocka_unit_test(test_loader_resume_on_another_world_size_continues_the_stream),
        cmocka_unit_test(test_loader_prefetch_does_not_change_results),
        cmocka_unit_test(test_loader_open_errors_name_the_problem),
        cmocka_unit_test(test_loader_reads_memory_and_npy_sources),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
