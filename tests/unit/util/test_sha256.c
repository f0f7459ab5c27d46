// SHA-256 against the FIPS 180-4 example vectors, against sha256sum, and SHA-NI against the portable path.
#include "test_util.h"

#include "util/error.h"
#include "util/sha256.h"

static void hash_hex(const void *data, size_t n, int shani, char hex[65]) {
    struct kiln_sha256 s;
    kiln_sha256_init(&s);
    s.use_shani = shani && s.use_shani;
    kiln_sha256_update(&s, data, n);
    uint8_t d[32];
    kiln_sha256_final(&s, d);
    kiln_sha256_hex(d, hex);
}

static void test_sha256_matches_fips_vectors_on_every_path(void **state) {
    (void)state;
    static const struct {
        const char *msg;
        const char *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmno"
         "pqrs"
         "tnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    for (int shani = 0; shani < 2; shani++) {
        for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
            char hex[65];
            hash_hex(v[i].msg, strlen(v[i].msg), shani, hex);
            assert_string_equal(hex, v[i].hex);
        }
        // one million 'a', fed in uneven pieces
        char *a = malloc(1000000);
        memset(a, 'a', 1000000);
        struct kiln_sha256 s;
        kiln_sha256_init(&s);
        s.use_shani = shani && s.use_shani;
        size_t off = 0, step = 1;
        while (off < 1000000) {
            size_t n = step < 1000000 - off ? step : 1000000 - off;
            kiln_sha256_update(&s, a + off, n);
            off += n;
            step = step * 3 + 1;
        }
        uint8_t d[32];
        char hex[65];
        kiln_sha256_final(&s, d);
        kiln_sha256_hex(d, hex);
        assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
        free(a);
    }
}

static void test_sha256_streaming_and_both_paths_agree_on_random_input(void **state) {
    (void)state;
    uint64_t rng = test_seed() ^ 0x5a256;
    enum { MAX = 4096 };
    uint8_t *buf = malloc(MAX);
    for (int trial = 0; trial < 300; trial++) {
        size_t n = trial < 200 ? (size_t)trial : test_rand_u64(&rng) % MAX; // every length around the padding
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)test_rand_u64(&rng);
        char one[65], generic[65], pieces[65];
        hash_hex(buf, n, 1, one);
        hash_hex(buf, n, 0, generic);
        assert_string_equal(one, generic);
        struct kiln_sha256 s;
        kiln_sha256_init(&s);
        size_t off = 0;
        while (off < n) {
            size_t k = test_rand_u64(&rng) % 150;
            if (k > n - off)
                k = n - off;
            kiln_sha256_update(&s, buf + off, k);
            off += k;
        }
        uint8_t d[32];
        kiln_sha256_final(&s, d);
        kiln_sha256_hex(d, pieces);
        assert_string_equal(pieces, one);
    }
    free(buf);
}

static void test_sha256_file_matches_sha256sum(void **state) {
    (void)state;
    uint64_t rng = test_seed() ^ 0xf11e;
    char dir[256], path[512], cmd[700];
    test_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/random.bin", dir);
    size_t n = (1u << 20) + test_rand_u64(&rng) % (3u << 20); // 1..4 MiB, not a multiple of the chunk
    uint8_t *buf = malloc(n);
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(test_rand_u64(&rng) >> 32);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);

    char ours[65], theirs[65] = {0};
    struct kiln_error err = {0};
    assert_int_equal(kiln_sha256_file(path, ours, &err), 0);
    snprintf(cmd, sizeof(cmd), "sha256sum '%s'", path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_int_equal(fscanf(p, "%64s", theirs), 1);
    assert_int_equal(pclose(p), 0);
    assert_string_equal(ours, theirs);

    char mem[65];
    hash_hex(buf, n, 1, mem);
    assert_string_equal(mem, theirs);
    free(buf);

    snprintf(path, sizeof(path), "%s/missing.bin", dir);
    assert_int_not_equal(kiln_sha256_file(path, ours, &err), 0);
    assert_non_null(strstr(err.msg, path));
    test_rmrf(dir);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// 64 MiB + 13 bytes of a fixed pattern (byte i is the top byte of i * 2654435761 mod 2^32) against its digest
// as sha256sum (coreutils) and Python's hashlib computed it, on both paths, in one update and in odd-sized
// pieces (1, 4, 13, 40, ... up to 797161 bytes, then again from 1) that start at every offset within a block.
// Checkpoints hash GB-sized files, so the throughput of each path is printed too (not a criterion).
static void test_sha256_large_buffer_matches_sha256sum_in_one_or_many_updates(void **state) {
    (void)state;
    const char *want = "c7433a50890f8264c1288bfc4fcdf7773862a016f08118ea4d06f3c1c7fad094";
    size_t n = (64u << 20) + 13;
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(((uint32_t)i * 2654435761u) >> 24);
    for (int shani = 0; shani < 2; shani++) {
        char hex[65];
        double t0 = now_s();
        hash_hex(buf, n, shani, hex);
        double dt = now_s() - t0;
        assert_string_equal(hex, want);
        fprintf(stderr, "[sha256] %s: %.0f MB/s%s\n", shani ? "sha-ni" : "portable", (double)n / dt / 1e6,
                shani && !kiln_sha256_have_shani() ? " (no SHA-NI on this CPU: portable)" : "");

        struct kiln_sha256 s;
        kiln_sha256_init(&s);
        s.use_shani = shani && s.use_shani;
        size_t off = 0, step = 1;
        while (off < n) {
            size_t k = step < n - off ? step : n - off;
            kiln_sha256_update(&s, buf + off, k);
            off += k;
            step = step > (512u << 10) ? 1 : step * 3 + 1;
        }
        uint8_t d[32];
        kiln_sha256_final(&s, d);
        kiln_sha256_hex(d, hex);
        assert_string_equal(hex, want);
    }
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_matches_fips_vectors_on_every_path),
        cmocka_unit_test(test_sha256_streaming_and_both_paths_agree_on_random_input),
        cmocka_unit_test(test_sha256_file_matches_sha256sum),
        cmocka_unit_test(test_sha256_large_buffer_matches_sha256sum_in_one_or_many_updates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
