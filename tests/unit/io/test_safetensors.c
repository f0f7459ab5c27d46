// safetensors: round trips of every dtype and shape, and every malformed file rejected with a message that
// names the file and the problem.
#include "test_util.h"

#include "io/fsutil.h"
#include "io/safetensors.h"
#include "core/ops.h"

#include <cjson/cJSON.h>
#include <sys/stat.h>

// io/ keeps its own dtype enum (it may not include model/); the shared values must agree.
_Static_assert((int)KILN_ST_F32 == (int)KILN_F32, "F32 value differs from ops.h");
_Static_assert((int)KILN_ST_BF16 == (int)KILN_BF16, "BF16 value differs from ops.h");
_Static_assert((int)KILN_ST_I32 == (int)KILN_I32, "I32 value differs from ops.h");

static char tmp_dir[256];

static int setup(void **state) {
    (void)state;
    test_tmpdir(tmp_dir, sizeof(tmp_dir));
    return 0;
}
static int teardown(void **state) {
    (void)state;
    test_rmrf(tmp_dir);
    return 0;
}

static void test_dtype_names_and_sizes(void **state) {
    (void)state;
    static const char *names[] = {"F32", "BF16", "I32", "F16", "I64"};
    static const size_t sizes[] = {4, 2, 4, 2, 8};
    for (int i = 0; i < KILN_ST_NDTYPES; i++) {
        assert_string_equal(kiln_st_dtype_name(i), names[i]);
        assert_int_equal(kiln_st_dtype_parse(names[i]), i);
        assert_int_equal(kiln_st_dtype_bytes(i), sizes[i]);
    }
    assert_null(kiln_st_dtype_name(KILN_ST_NDTYPES));
    assert_int_equal(kiln_st_dtype_parse("f32"), -1);
    assert_int_equal(kiln_st_dtype_bytes(-1), 0);
}

static void test_round_trip_every_dtype_and_shape(void **state) {
    (void)state;
    uint64_t rng = test_seed() ^ 0x57;
    char path[512];
    snprintf(path, sizeof(path), "%s/rt.safetensors", tmp_dir);
    for (int round = 0; round < 20; round++) {
        int n = round == 0 ? 0 : 1 + (int)(test_rand_u64(&rng) % 12);
        struct kiln_st_tensor t[12];
        char names[12][64];
        void *bufs[12] = {0};
        size_t total = 0;
        for (int i = 0; i < n; i++) {
            // names with JSON escapes and UTF-8 in them, as well as HF-style dotted names
            static const char *styles[] = {"transformer.h.%d.attn.c_attn.weight", "q\"uote\\%d", "tab\t%d\n",
                                           "\xc3\xa4\xc3\xb6%d"};
            snprintf(names[i], sizeof(names[i]), styles[test_rand_u64(&rng) % 4], i);
            t[i].name = names[i];
            t[i].dtype = (int)(test_rand_u64(&rng) % KILN_ST_NDTYPES);
            int kind = (int)(test_rand_u64(&rng) % 4);
            t[i].ndim = kind == 0 ? 0 : 1 + (int)(test_rand_u64(&rng) % 4); // 0-d scalars included
            for (int d = 0; d < t[i].ndim; d++)
                t[i].shape[d] = 1 + (int64_t)(test_rand_u64(&rng) % 7);
            if (kind == 1) // an empty tensor
                t[i].shape[test_rand_u64(&rng) % (uint64_t)t[i].ndim] = 0;
            size_t nb = kiln_st_tensor_bytes(&t[i]);
            bufs[i] = malloc(nb + 1);
            for (size_t b = 0; b < nb; b++)
                ((uint8_t *)bufs[i])[b] = (uint8_t)test_rand_u64(&rng);
            t[i].data = nb ? bufs[i] : NULL;
            total += nb;
        }
        const char *meta[] = {"format", "pt", "kiln \"version\"", "1\\0", NULL};
        struct kiln_error err = {0};
        assert_int_equal(kiln_safetensors_write(path, t, n, round % 2 ? meta : NULL, &err), 0);

        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        struct kiln_safetensors *f;
        if (kiln_safetensors_open(&f, path, &err))
            fail_msg("%s", err.msg);
        assert_int_equal(kiln_safetensors_count(f), n);
        for (int i = 0; i < n; i++) {
            const struct kiln_st_tensor *r = kiln_safetensors_at(f, i);
            assert_string_equal(r->name, t[i].name);
            assert_int_equal(r->dtype, t[i].dtype);
            assert_int_equal(r->ndim, t[i].ndim);
            for (int d = 0; d < t[i].ndim; d++)
                assert_int_equal(r->shape[d], t[i].shape[d]);
            size_t nb = kiln_st_tensor_bytes(r);
            assert_int_equal(nb, kiln_st_tensor_bytes(&t[i]));
            if (nb)
                assert_memory_equal(r->data, t[i].data, nb);
            assert_ptr_equal(kiln_safetensors_find(f, t[i].name), r);
        }
        assert_null(kiln_safetensors_at(f, n));
        assert_null(kiln_safetensors_find(f, "no.such.tensor"));
        if (round % 2) {
            assert_int_equal(kiln_safetensors_meta_count(f), 2);
            assert_string_equal(kiln_safetensors_meta(f, "format"), "pt");
            assert_string_equal(kiln_safetensors_meta(f, "kiln \"version\""), "1\\0");
        } else {
            assert_int_equal(kiln_safetensors_meta_count(f), 0);
        }
        assert_null(kiln_safetensors_meta(f, "absent"));
        kiln_safetensors_close(f);

        // the layout, read independently: u64 N, N a multiple of 8, JSON offsets in the given order
        char *raw;
        size_t rawn;
        assert_int_equal(kiln_read_file(path, &raw, &rawn, &err), 0);
        uint64_t hlen = 0;
        for (int b = 0; b < 8; b++)
            hlen |= (uint64_t)(uint8_t)raw[b] << (8 * b);
        assert_int_equal(hlen % 8, 0);
        assert_int_equal(rawn, 8 + hlen + total);
        assert_int_equal((size_t)st.st_size, rawn);
        cJSON *h = cJSON_ParseWithLength(raw + 8, hlen);
        assert_non_null(h);
        double off = 0;
        for (int i = 0; i < n; i++) {
            cJSON *e = cJSON_GetObjectItemCaseSensitive(h, t[i].name);
            assert_non_null(e);
            cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
            assert_true(cJSON_GetArrayItem(o, 0)->valuedouble == off);
            off += (double)kiln_st_tensor_bytes(&t[i]);
            assert_true(cJSON_GetArrayItem(o, 1)->valuedouble == off);
        }
        cJSON_Delete(h);
        free(raw);
        for (int i = 0; i < n; i++)
            free(bufs[i]);
    }
}

static void test_fp32_tensors_are_aligned_in_the_mapping(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/al.safetensors", tmp_dir);
    float a[3] = {1, 2, 3}, b[5] = {4, 5, 6, 7, 8};
    struct kiln_st_tensor t[2] = {{"a", KILN_ST_F32, 1, {3}, a}, {"bb", KILN_ST_F32, 1, {5}, b}};
    struct kiln_error err;
    assert_int_equal(kiln_safetensors_write(path, t, 2, NULL, &err), 0);
    struct kiln_safetensors *f;
    assert_int_equal(kiln_safetensors_open(&f, path, &err), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal((uintptr_t)kiln_safetensors_at(f, i)->data % 4, 0);
    assert_true(((const float *)kiln_safetensors_find(f, "bb")->data)[4] == 8.0f);
    kiln_safetensors_close(f);
}

static void test_write_rejects_bad_tensors_and_leaves_no_file(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/bad_write.safetensors", tmp_dir);
    float x[4] = {0};
    struct {
        struct kiln_st_tensor t[2];
        const char *want;
    } cases[] = {
        {{{"a", KILN_ST_F32, 1, {4}, x}, {"a", KILN_ST_F32, 1, {1}, x}}, "duplicate tensor name \"a\""},
        {{{"a", KILN_ST_F32, 1, {4}, x}, {"__metadata__", KILN_ST_F32, 1, {1}, x}}, "reserved name"},
        {{{"a", KILN_ST_F32, 1, {4}, x}, {"", KILN_ST_F32, 1, {1}, x}}, "reserved name"},
        {{{"a", 17, 1, {4}, x}, {"b", KILN_ST_F32, 1, {1}, x}}, "unknown dtype 17"},
        {{{"a", KILN_ST_F32, 1, {-4}, x}, {"b", KILN_ST_F32, 1, {1}, x}}, "negative dim -4"},
        {{{"a", KILN_ST_F32, 9, {4}, x}, {"b", KILN_ST_F32, 1, {1}, x}}, "ndim 9"},
        {{{"a", KILN_ST_F32, 1, {4}, NULL}, {"b", KILN_ST_F32, 1, {1}, x}}, "has no data"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct kiln_error err = {0};
        assert_int_equal(kiln_safetensors_write(path, cases[c].t, 2, NULL, &err), KILN_ERR_USAGE);
        if (!strstr(err.msg, cases[c].want) || !strstr(err.msg, path))
            fail_msg("case %zu: got \"%s\", want \"%s\"", c, err.msg, cases[c].want);
        struct stat st;
        assert_int_not_equal(stat(path, &st), 0);
    }
    struct kiln_st_tensor ok = {"a", KILN_ST_F32, 1, {4}, x};
    const char *meta[] = {"key_without_value", NULL};
    struct kiln_error err = {0};
    assert_int_not_equal(kiln_safetensors_write(path, &ok, 1, meta, &err), 0);
    assert_non_null(strstr(err.msg, "key_without_value"));
}

// Writes 8-byte length (hlen_override if >= 0, else the real one), header text, data_bytes bytes.
static void write_raw(const char *path, const char *header, int64_t hlen_override, size_t data_bytes) {
    size_t hl = strlen(header);
    uint64_t n = hlen_override >= 0 ? (uint64_t)hlen_override : hl;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 8; i++)
        fputc((int)((n >> (8 * i)) & 255), f);
    fwrite(header, 1, hl, f);
    for (size_t i = 0; i < data_bytes; i++)
        fputc((int)(i * 7), f);
    fclose(f);
}

static void expect_open_error(const char *path, const char *want) {
    struct kiln_safetensors *f = (struct kiln_safetensors *)1;
    struct kiln_error err = {0};
    int rc = kiln_safetensors_open(&f, path, &err);
    if (rc == 0)
        fail_msg("opening %s succeeded, wanted an error with \"%s\"", path, want);
    assert_null(f);
    if (!strstr(err.msg, want) || !strstr(err.msg, path))
        fail_msg("got \"%s\", wanted \"%s\" and the path", err.msg, want);
    assert_null(strchr(err.msg, '\n'));
}

static void test_open_rejects_every_malformed_header(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/bad.safetensors", tmp_dir);

    // shorter than 8 bytes
    FILE *f = fopen(path, "wb");
    fwrite("\x10\0\0", 1, 3, f);
    fclose(f);
    expect_open_error(path, "shorter than the 8-byte header length");

    struct {
        const char *header;
        int64_t hlen;
        size_t data;
        const char *want;
    } cases[] = {
        {"{}", 4096, 0, "header length 4096 runs past the end"},
        {"{\"a\": {\"dtype\": \"F32\"", -1, 0, "not valid JSON"},
        {"{} trailing", -1, 0, "not valid JSON"},
        {"[1, 2]", -1, 0, "not a JSON object"},
        {"\"str\"", -1, 0, "not a JSON object"},
        {"{\"a\": 3}", -1, 0, "entry \"a\" is not an object"},
        {"{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4, "no \"dtype\""},
        {"{\"a\": {\"dtype\": \"Q4\", \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4,
         "unknown dtype \"Q4\""},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", -1, 4, "no \"shape\" list"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", -1, 4,
         "non-negative integers"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", -1, 4,
         "non-negative integers"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [\"1\"], \"data_offsets\": [0, 4]}}", -1, 4,
         "non-negative integers"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", -1, 4,
         "9 dims"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", -1, 4, "data_offsets"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", -1, 4, "data_offsets"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", -1, 4, "data_offsets"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", -1, 8, "need 8 bytes"},
        {"{\"a\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}}", -1, 24,
         "need 12 bytes"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", -1, 8,
         "exceed the 8 data bytes"},
        // an offset past 2^53 is past the data (issue 18: it read as "0 <= begin <= end")
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 1152921504606846976]}}", -1, 4,
         "[0, 1152921504606846976] that exceed the 4 data bytes"},
        // a shape whose byte count overflows (it read as "need -1 bytes")
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}", -1,
         4, "shape [4294967296, 4294967296] whose size overflows"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
         " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
         -1, 12, "(overlap)"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
         " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
         -1, 12, "(gap)"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", -1, 8, "(gap)"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
         " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
         -1, 8, "duplicate tensor name \"a\""},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 12, "trailing bytes"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}}", -1, 3,
         "exceed the 3 data bytes"},
        {"{\"__metadata__\": {\"k\": 1}}", -1, 0, "metadata \"k\" is not a string"},
        {"{\"__metadata__\": [], \"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}}", -1,
         4, "\"__metadata__\" is not an object"},
        {"{\"__metadata__\": {}, \"__metadata__\": {}}", -1, 0, "duplicate \"__metadata__\""},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        write_raw(path, cases[c].header, cases[c].hlen, cases[c].data);
        expect_open_error(path, cases[c].want);
    }

    // an embedded NUL would hide the rest of the header from a C-string parser
    f = fopen(path, "wb");
    const char hdr[] = "{}\0{\"x\":1}";
    uint8_t len8[8] = {sizeof(hdr) - 1};
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, sizeof(hdr) - 1, f);
    fclose(f);
    expect_open_error(path, "NUL byte");

    // a missing file
    snprintf(path, sizeof(path), "%s/missing.safetensors", tmp_dir);
    expect_open_error(path, "No such file");
}

static void test_open_accepts_valid_handwritten_files(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/hand.safetensors", tmp_dir);
    // out of order offsets, an empty tensor at the end, whitespace: all legal
    write_raw(path,
              "{ \"b\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [4, 12]},\n"
              "  \"a\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [0, 4]},"
              "  \"e\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [12, 12]} }   ",
              -1, 12);
    struct kiln_safetensors *f;
    struct kiln_error err;
    if (kiln_safetensors_open(&f, path, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(kiln_safetensors_count(f), 3);
    assert_string_equal(kiln_safetensors_at(f, 0)->name, "b");
    assert_int_equal(kiln_safetensors_find(f, "a")->dtype, KILN_ST_F16);
    assert_int_equal(kiln_safetensors_find(f, "b")->dtype, KILN_ST_I64);
    assert_int_equal(kiln_st_tensor_numel(kiln_safetensors_find(f, "e")), 0);
    const uint8_t *b = kiln_safetensors_find(f, "b")->data;
    assert_int_equal(b[0], (4 * 7) & 255); // write_raw's data byte i is i*7
    assert_string_equal(kiln_safetensors_path(f), path);
    kiln_safetensors_close(f);
    kiln_safetensors_close(NULL);
}

// Every truncation of a valid file fails cleanly (naming the file); random header damage never crashes.
static void test_truncated_and_damaged_files_never_open_wrongly(void **state) {
    (void)state;
    uint64_t rng = test_seed() ^ 0x7ab;
    char path[512], cut[600];
    snprintf(path, sizeof(path), "%s/full.safetensors", tmp_dir);
    snprintf(cut, sizeof(cut), "%s/cut.safetensors", tmp_dir);
    float a[40];
    test_fill_normal(a, 40, 1.0f, &rng);
    struct kiln_st_tensor t[3] = {
        {"w", KILN_ST_F32, 2, {4, 5}, a}, {"b", KILN_ST_F32, 1, {20}, a + 20}, {"s", KILN_ST_F32, 0, {0}, a}};
    struct kiln_error err;
    assert_int_equal(kiln_safetensors_write(path, t, 3, NULL, &err), 0);
    char *raw;
    size_t n;
    assert_int_equal(kiln_read_file(path, &raw, &n, &err), 0);
    for (size_t len = 0; len < n; len++) {
        FILE *f = fopen(cut, "wb");
        fwrite(raw, 1, len, f);
        fclose(f);
        struct kiln_safetensors *st;
        if (kiln_safetensors_open(&st, cut, &err) == 0)
            fail_msg("a file truncated to %zu of %zu bytes opened", len, n);
        assert_non_null(strstr(err.msg, cut));
    }
    uint64_t hlen = (uint8_t)raw[0] | ((uint64_t)(uint8_t)raw[1] << 8);
    for (int trial = 0; trial < 500; trial++) {
        char *dmg = malloc(n);
        memcpy(dmg, raw, n);
        size_t at = 8 + test_rand_u64(&rng) % hlen;
        dmg[at] = (char)test_rand_u64(&rng);
        FILE *f = fopen(cut, "wb");
        fwrite(dmg, 1, n, f);
        fclose(f);
        struct kiln_safetensors *st;
        if (kiln_safetensors_open(&st, cut, &err) == 0) {
            // whatever still parses must still describe a consistent file
            size_t sum = 0;
            for (int i = 0; i < kiln_safetensors_count(st); i++)
                sum += kiln_st_tensor_bytes(kiln_safetensors_at(st, i));
            assert_int_equal(sum, n - 8 - hlen);
            kiln_safetensors_close(st);
        } else {
            assert_non_null(strstr(err.msg, cut));
        }
        free(dmg);
    }
    free(raw);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_names_and_sizes),
        cmocka_unit_test(test_round_trip_every_dtype_and_shape),
        cmocka_unit_test(test_fp32_tensors_are_aligned_in_the_mapping),
        cmocka_unit_test(test_write_rejects_bad_tensors_and_leaves_no_file),
        cmocka_unit_test(test_open_rejects_every_malformed_header),
        cmocka_unit_test(test_open_accepts_valid_handwritten_files),
        cmocka_unit_test(test_truncated_and_damaged_files_never_open_wrongly),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
