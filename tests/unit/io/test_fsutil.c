// File-system helpers: mkdir -p, atomic replacement, whole-file reads, recursive removal.
#include "test_util.h"

#include "io/fsutil.h"

#include <dirent.h>
#include <sys/stat.h>

// Number of entries in dir other than . and ..; names containing "tmp" are counted in *tmp_like.
static int count_entries(const char *dir, int *tmp_like) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    *tmp_like = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        n++;
        if (strstr(de->d_name, "tmp"))
            (*tmp_like)++;
    }
    closedir(d);
    return n;
}

static void test_mkdir_p_creates_parents_and_accepts_existing(void **state) {
    (void)state;
    char dir[256], p[512];
    struct kiln_error err = {0};
    test_tmpdir(dir, sizeof(dir));
    snprintf(p, sizeof(p), "%s/a/b//c/d/", dir);
    assert_int_equal(kiln_mkdir_p(p, &err), 0);
    assert_true(kiln_is_dir(p));
    assert_int_equal(kiln_mkdir_p(p, &err), 0); // again: fine

    // a regular file in the way
    snprintf(p, sizeof(p), "%s/a/file", dir);
    FILE *f = fopen(p, "w");
    fclose(f);
    snprintf(p, sizeof(p), "%s/a/file/sub", dir);
    assert_int_not_equal(kiln_mkdir_p(p, &err), 0);
    assert_non_null(strstr(err.msg, "a/file"));
    snprintf(p, sizeof(p), "%s/a/file", dir);
    assert_int_not_equal(kiln_mkdir_p(p, &err), 0);
    assert_non_null(strstr(err.msg, p));
    test_rmrf(dir);
}

static void test_atomic_write_round_trips_and_replaces_without_leftovers(void **state) {
    (void)state;
    uint64_t rng = test_seed() ^ 0xa70;
    char dir[256], p[512];
    struct kiln_error err = {0};
    test_tmpdir(dir, sizeof(dir));
    snprintf(p, sizeof(p), "%s/data.bin", dir);
    for (int round = 0; round < 5; round++) {
        size_t n = round == 0 ? 0 : test_rand_u64(&rng) % 200000;
        char *buf = malloc(n + 1);
        for (size_t i = 0; i < n; i++)
            buf[i] = (char)test_rand_u64(&rng);
        assert_int_equal(kiln_write_file_atomic(p, buf, n, &err), 0);
        char *back;
        size_t m;
        assert_int_equal(kiln_read_file(p, &back, &m, &err), 0);
        assert_int_equal(m, n);
        assert_memory_equal(back, buf, n);
        assert_int_equal(back[m], '\0');
        free(back);
        free(buf);
        int tmp_like;
        assert_int_equal(count_entries(dir, &tmp_like), 1);
        assert_int_equal(tmp_like, 0);
    }
    test_rmrf(dir);
}

static void test_afile_hashes_what_it_writes_and_abort_keeps_the_old_file(void **state) {
    (void)state;
    uint64_t rng = test_seed() ^ 0xaf11e;
    char dir[256], p[512];
    struct kiln_error err = {0};
    test_tmpdir(dir, sizeof(dir));
    snprintf(p, sizeof(p), "%s/x", dir);
    assert_int_equal(kiln_write_file_atomic(p, "old", 3, &err), 0);

    size_t n = 1000 + test_rand_u64(&rng) % 100000;
    char *buf = malloc(n);
    for (size_t i = 0; i < n; i++)
        buf[i] = (char)test_rand_u64(&rng);
    struct kiln_afile f;
    assert_int_equal(kiln_afile_open(&f, p, &err), 0);
    assert_int_equal(kiln_afile_write(&f, buf, n / 3, &err), 0);
    assert_int_equal(kiln_afile_write(&f, buf + n / 3, n - n / 3, &err), 0);
    kiln_afile_abort(&f); // never committed: the old content stays, the temp file goes
    char *back;
    size_t m;
    assert_int_equal(kiln_read_file(p, &back, &m, &err), 0);
    assert_int_equal(m, 3);
    assert_memory_equal(back, "old", 3);
    free(back);
    int tmp_like;
    assert_int_equal(count_entries(dir, &tmp_like), 1);

    char hex[65], want[65];
    uint8_t d[32];
    assert_int_equal(kiln_afile_open(&f, p, &err), 0);
    assert_int_equal(kiln_afile_write(&f, buf, n, &err), 0);
    assert_int_equal(kiln_afile_commit(&f, hex, &err), 0);
    kiln_afile_abort(&f); // after commit: a no-op
    kiln_sha256(buf, n, d);
    kiln_sha256_hex(d, want);
    assert_string_equal(hex, want);
    assert_int_equal(kiln_sha256_file(p, want, &err), 0);
    assert_string_equal(hex, want);
    assert_int_equal(count_entries(dir, &tmp_like), 1);
    free(buf);

    // a target in a missing directory fails at open, naming the path
    snprintf(p, sizeof(p), "%s/nope/x", dir);
    assert_int_not_equal(kiln_write_file_atomic(p, "a", 1, &err), 0);
    assert_non_null(strstr(err.msg, p));
    test_rmrf(dir);
}

static void test_read_file_reports_missing_and_directories(void **state) {
    (void)state;
    char dir[256], p[512];
    struct kiln_error err = {0};
    test_tmpdir(dir, sizeof(dir));
    char *data;
    size_t n;
    snprintf(p, sizeof(p), "%s/missing", dir);
    assert_int_not_equal(kiln_read_file(p, &data, &n, &err), 0);
    assert_null(data);
    assert_non_null(strstr(err.msg, p));
    assert_int_not_equal(kiln_read_file(dir, &data, &n, &err), 0);
    assert_non_null(strstr(err.msg, "not a regular file"));
    test_rmrf(dir);
}

static void test_remove_tree_removes_nested_dirs_but_not_symlink_targets(void **state) {
    (void)state;
    char dir[256], outside[256], p[600], q[600];
    struct kiln_error err = {0};
    test_tmpdir(dir, sizeof(dir));
    test_tmpdir(outside, sizeof(outside));
    snprintf(p, sizeof(p), "%s/keep.txt", outside);
    assert_int_equal(kiln_write_file_atomic(p, "keep", 4, &err), 0);
    snprintf(p, sizeof(p), "%s/t/a/b/c", dir);
    assert_int_equal(kiln_mkdir_p(p, &err), 0);
    for (int i = 0; i < 10; i++) {
        snprintf(q, sizeof(q), "%s/t/a/f%d", dir, i);
        assert_int_equal(kiln_write_file_atomic(q, "x", 1, &err), 0);
    }
    snprintf(q, sizeof(q), "%s/t/a/b/link", dir);
    assert_int_equal(symlink(outside, q), 0);
    snprintf(p, sizeof(p), "%s/t", dir);
    assert_int_equal(kiln_remove_tree(p, &err), 0);
    struct stat st;
    assert_int_not_equal(lstat(p, &st), 0);
    snprintf(p, sizeof(p), "%s/keep.txt", outside);
    assert_int_equal(stat(p, &st), 0);
    snprintf(p, sizeof(p), "%s/t", dir);
    assert_int_equal(kiln_remove_tree(p, &err), 0); // missing: fine
    test_rmrf(dir);
    test_rmrf(outside);
}

static void test_path_join_refuses_to_truncate(void **state) {
    (void)state;
    char out[16];
    struct kiln_error err = {0};
    assert_int_equal(kiln_path_join(out, sizeof(out), "abc", "def", &err), 0);
    assert_string_equal(out, "abc/def");
    assert_int_equal(kiln_path_join(out, sizeof(out), "abcdefgh", "ijklmnop", &err), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "path too long"));
    assert_true(kiln_nonce() != kiln_nonce());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mkdir_p_creates_parents_and_accepts_existing),
        cmocka_unit_test(test_atomic_write_round_trips_and_replaces_without_leftovers),
        cmocka_unit_test(test_afile_hashes_what_it_writes_and_abort_keeps_the_old_file),
        cmocka_unit_test(test_read_file_reports_missing_and_directories),
        cmocka_unit_test(test_remove_tree_removes_nested_dirs_but_not_symlink_targets),
        cmocka_unit_test(test_path_join_refuses_to_truncate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
