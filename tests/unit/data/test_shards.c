// Token shards: both llm.c layouts written and read back, .npy arrays, and every corruption named.
#include "test_util.h"

#include "data/shards.h"
#include "io/fsutil.h"
#include "util/sha256.h"
#include "util/error.h"

static void put_i32(unsigned char *p, int32_t v) {
    memcpy(p, &v, 4);
}

static void test_shards_roundtrip_both_layouts(void **state) {
    uint64_t s = test_seed();
    char dir[256], path[300];
    test_tmpdir(dir, sizeof(dir));
    for (int layout = 0; layout < 2; layout++) {
        int elem = layout ? 4 : 2, vocab = layout ? 128256 : 50257;
        assert_int_equal(kiln_shard_elem_bytes(vocab), elem);
        size_t n = test_rand_u64(&s) % 5000;
        int32_t *tok = malloc(sizeof(int32_t) * (n + 1));
        for (size_t i = 0; i < n; i++)
            tok[i] = (int32_t)(test_rand_u64(&s) % (uint64_t)vocab);
        snprintf(path, sizeof(path), "%s/s%d.bin", dir, layout);
        struct kiln_error err = {0};
        char sha[65];
        assert_int_equal(kiln_shard_write(path, tok, n, elem, sha, &err), 0);
        // the raw bytes are llm.c's layout
        char *raw;
        size_t rn;
        assert_int_equal(kiln_read_file(path, &raw, &rn, &err), 0);
        assert_int_equal(rn, 1024 + n * (size_t)elem);
        int32_t h[256];
        memcpy(h, raw, sizeof(h));
        assert_int_equal(h[0], layout ? 20240801 : 20240520);
        assert_int_equal(h[1], layout ? 7 : 1);
        assert_int_equal(h[2], (int32_t)n);
        for (int i = 3; i < 256; i++)
            assert_int_equal(h[i], 0);
        char sha2[65];
        assert_int_equal(kiln_sha256_file(path, sha2, &err), 0);
        assert_string_equal(sha, sha2);
        free(raw);
        struct kiln_token_file f;
        assert_int_equal(kiln_token_file_open(&f, path, vocab, &err), 0);
        assert_int_equal(f.elem_bytes, elem);
        assert_int_equal(f.n_tokens, n);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(kiln_token_at(&f, i), (uint32_t)tok[i]);
        kiln_token_file_close(&f);
        free(tok);
    }
    test_rmrf(dir);
}

static void test_shards_write_rejects_ids_that_do_not_fit(void **state) {
    char dir[256], path[300];
    test_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/x.bin", dir);
    int32_t tok[] = {1, 2, 70000};
    struct kiln_error err = {0};
    assert_int_equal(kiln_shard_write(path, tok, 3, 2, NULL, &err), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "token id 70000 does not fit a uint16 shard"));
    assert_non_null(strstr(err.msg, "token offset 2"));
    assert_false(kiln_is_dir(path));
    assert_int_not_equal(access(path, F_OK), 0); // no file under the final name
    test_rmrf(dir);
}

// Writes a uint16 shard of n tokens (all 7) and returns its bytes for corruption.
static void write_raw(const char *path, const unsigned char *data, size_t n) {
    struct kiln_error err;
    assert_int_equal(kiln_write_file_atomic(path, data, n, &err), 0);
}

static void test_shards_corruption_gives_the_right_error(void **state) {
    uint64_t s = test_seed() ^ 77;
    char dir[256], path[300];
    test_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/train_000001.bin", dir);
    size_t n = 100 + test_rand_u64(&s) % 1000;
    size_t bytes = 1024 + 2 * n;
    unsigned char *b = calloc(1, bytes + 16);
    put_i32(b, 20240520);
    put_i32(b + 4, 1);
    put_i32(b + 8, (int32_t)n);
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)(test_rand_u64(&s) % 50257);
        memcpy(b + 1024 + 2 * i, &v, 2);
    }
    struct kiln_token_file f;
    struct kiln_error err = {0};
    char want[600];

    write_raw(path, b, bytes);
    assert_int_equal(kiln_token_file_open(&f, path, 50257, &err), 0);
    kiln_token_file_close(&f);

    write_raw(path, b, bytes - 2 * (1 + test_rand_u64(&s) % n)); // truncated
    assert_int_equal(kiln_token_file_open(&f, path, 50257, &err), KILN_ERR_RUNTIME);
    snprintf(want, sizeof(want), "shard size disagrees with its header (%s): the header says %zu tokens",
             path, n);
    assert_non_null(strstr(err.msg, want));

    write_raw(path, b, 500); // shorter than a header
    assert_int_equal(kiln_token_file_open(&f, path, 50257, &err), KILN_ERR_RUNTIME);
    snprintf(want, sizeof(want), "token shard too small (%s)", path);
    assert_non_null(strstr(err.msg, want));

    put_i32(b, 12345); // wrong magic
    write_raw(path, b, bytes);
    assert_int_equal(kiln_token_file_open(&f, path, 50257, &err), KILN_ERR_RUNTIME);
    snprintf(want, sizeof(want), "bad shard magic 12345 (%s)", path);
    assert_non_null(strstr(err.msg, want));

    put_i32(b, 20240520); // wrong version
    put_i32(b + 4, 7);
    write_raw(path, b, bytes);
    assert_int_equal(kiln_token_file_open(&f, path, 50257, &err), KILN_ERR_RUNTIME);
    snprintf(want, sizeof(want), "unsupported shard version 7 (%s): magic 20240520 needs version 1", path);
    assert_non_null(strstr(err.msg, want));

    put_i32(b + 4, 1); // a token from a bigger vocabulary at a random offset
    size_t off = test_rand_u64(&s) % n;
    uint16_t big = 50300;
    memcpy(b + 1024 + 2 * off, &big, 2);
    write_raw(path, b, bytes);
    assert_int_equal(kiln_token_file_open(&f, path, 50257, &err), KILN_ERR_RUNTIME);
    snprintf(want, sizeof(want),
             "token id 50300 >= vocab size 50257 (shard %s, token offset %zu): the shard was "
             "made with a different tokenizer; re-run kiln tokenize",
             path, off);
    assert_string_equal(err.msg, want);
    assert_int_equal(kiln_token_file_open(&f, path, 0, &err), 0); // unchecked without a vocab size
    kiln_token_file_close(&f);
    free(b);
    test_rmrf(dir);
}

static void write_npy(const char *path, const char *descr, const char *shape, const void *data, size_t nbytes,
                      size_t drop) {
    char h[128];
    int hl = snprintf(h, sizeof(h), "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    int total = 10 + hl + 1;
    int pad = (64 - total % 64) % 64;
    size_t len = (size_t)total + (size_t)pad;
    unsigned char *b = malloc(len + nbytes);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)((len - 10) & 0xff);
    b[9] = (unsigned char)((len - 10) >> 8);
    memcpy(b + 10, h, (size_t)hl);
    memset(b + 10 + hl, ' ', (size_t)pad);
    b[len - 1] = '\n';
    memcpy(b + len, data, nbytes);
    write_raw(path, b, len + nbytes - drop);
    free(b);
}

static void test_shards_read_npy_arrays(void **state) {
    uint64_t s = test_seed() ^ 99;
    char dir[256], path[300], shape[64];
    test_tmpdir(dir, sizeof(dir));
    size_t n = 1 + test_rand_u64(&s) % 3000;
    uint16_t *a16 = malloc(2 * n);
    uint32_t *a32 = malloc(4 * n);
    for (size_t i = 0; i < n; i++) {
        a16[i] = (uint16_t)(test_rand_u64(&s) % 50257);
        a32[i] = (uint32_t)(test_rand_u64(&s) % 100000);
    }
    snprintf(shape, sizeof(shape), "(%zu,)", n);
    struct kiln_token_file f;
    struct kiln_error err = {0};
    snprintf(path, sizeof(path), "%s/a.npy", dir);
    write_npy(path, "<u2", shape, a16, 2 * n, 0);
    assert_int_equal(kiln_token_file_open(&f, path, 50257, &err), 0);
    assert_int_equal(f.n_tokens, n);
    assert_int_equal(f.elem_bytes, 2);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(kiln_token_at(&f, i), a16[i]);
    kiln_token_file_close(&f);
    write_npy(path, "<u4", shape, a32, 4 * n, 0);
    assert_int_equal(kiln_token_file_open(&f, path, 100000, &err), 0);
    assert_int_equal(f.elem_bytes, 4);
    assert_int_equal(kiln_token_at(&f, n - 1), a32[n - 1]);
    kiln_token_file_close(&f);
    write_npy(path, "<u4", shape, a32, 4 * n, 4); // truncated
    assert_int_equal(kiln_token_file_open(&f, path, 100000, &err), KILN_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "token file size disagrees with its header"));
    write_npy(path, "<f4", shape, a32, 4 * n, 0);
    assert_int_equal(kiln_token_file_open(&f, path, 100000, &err), KILN_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "unsupported .npy dtype"));
    write_npy(path, "<u2", "(2, 3)", a16, 12, 0);
    assert_int_equal(kiln_token_file_open(&f, path, 0, &err), KILN_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "must be 1-D"));
    // a raw np.memmap array (no header): uint16 for a GPT-2-sized vocabulary
    write_raw(path, (const unsigned char *)a16, 2 * n);
    assert_int_equal(kiln_token_file_open(&f, path, 50257, &err), 0);
    assert_int_equal(f.n_tokens, n);
    assert_int_equal(kiln_token_at(&f, 0), a16[0]);
    kiln_token_file_close(&f);
    free(a16);
    free(a32);
    test_rmrf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shards_roundtrip_both_layouts),
        cmocka_unit_test(test_shards_write_rejects_ids_that_do_not_fit),
        cmocka_unit_test(test_shards_corruption_gives_the_right_error),
        cmocka_unit_test(test_shards_read_npy_arrays),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
